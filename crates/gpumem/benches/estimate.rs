//! One estimate, as a slider move would cause it.
use criterion::{criterion_group, criterion_main, Criterion};
use gpumem::{estimate, Scenario};
use serde_json::json;

fn bench(c: &mut Criterion) {
    for (name, s) in [
        (
            "llama3.1-8b train bf16",
            json!({"model": "llama3.1-8b", "batch": 4, "seq": 4096, "precision": "bf16"}),
        ),
        (
            "llama3.1-405b train full-recompute",
            json!({"model": "llama3.1-405b", "batch": 1, "seq": 8192, "recompute": "full"}),
        ),
        (
            "mixtral-8x7b amp",
            json!({"model": "mixtral-8x7b", "batch": 2, "seq": 4096, "precision": "amp-bf16"}),
        ),
        (
            "llama3.2-1b train bf16, caching allocator replayed",
            json!({"model": "llama3.2-1b", "batch": 4, "seq": 2048, "precision": "bf16"}),
        ),
        (
            "llama3.2-1b train bf16, allocator not replayed",
            json!({"model": "llama3.2-1b", "batch": 4, "seq": 2048, "precision": "bf16", "allocator": "none"}),
        ),
        (
            "llama3.2-1b train bf16, expandable segments with max_split_size_mb 64",
            json!({"model": "llama3.2-1b", "batch": 4, "seq": 2048, "precision": "bf16",
                "allocator": {"expandable_segments": true, "max_split_size_mb": 64}}),
        ),
        (
            "qwen2.5-0.5b train bf16, caching allocator replayed",
            json!({"model": "qwen2.5-0.5b", "batch": 4, "seq": 2048, "precision": "bf16"}),
        ),
        (
            "llama3.1-70b inference",
            json!({"model": "llama3.1-70b", "mode": "inference", "batch": 8, "seq": 8192, "new_tokens": 256}),
        ),
    ] {
        let sc = Scenario::from_value(&s).unwrap();
        c.bench_function(name, |b| {
            b.iter(|| estimate(std::hint::black_box(&sc)).unwrap())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
