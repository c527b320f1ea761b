//! The planner's whole sweep, as the parallelism widget runs it live: every layout of a
//! model over every power-of-two GPU count up to 16,384.
use criterion::{criterion_group, criterion_main, Criterion};
use gpumem::plan::{plan, Request};
use serde_json::json;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    g.sample_size(20);
    for (name, req) in [
        (
            "llama3.1-405b seq 8192, 1..16384 GPUs",
            json!({"model": "llama3.1-405b", "precision": "mixed-bf16", "seq": 8192,
                   "global_batch": 2048, "gpus": "1..16384"}),
        ),
        (
            "llama3.1-405b seq 8192, 2048 GPUs",
            json!({"model": "llama3.1-405b", "precision": "mixed-bf16", "seq": 8192,
                   "global_batch": 1024, "gpus": 2048}),
        ),
        (
            "deepseek-v3 seq 4096, 1..16384 GPUs",
            json!({"model": "deepseek-v3", "precision": "mixed-bf16", "seq": 4096,
                   "global_batch": 4096, "gpus": "1..16384"}),
        ),
    ] {
        let r = Request::from_value(&req).unwrap();
        g.bench_function(name, |b| b.iter(|| plan(std::hint::black_box(&r))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
