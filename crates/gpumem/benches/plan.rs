//! The planner's whole sweep, as the parallelism widget runs it live: every layout of a
//! model over every power-of-two GPU count up to 16,384. Each plan is made afresh (what the
//! last plan kept is forgotten first); the 5D panel's re-plan, after a plan of the same model,
//! is timed as the widget makes it.
use criterion::{criterion_group, criterion_main, Criterion};
use gpumem::plan::{forget, plan, Request};
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
        g.bench_function(name, |b| {
            b.iter(|| {
                forget();
                plan(std::hint::black_box(&r))
            })
        });
    }
    // The 5D panel (book/parallelism.md): Llama 3.1 70B, 8k, on 64 GPUs under Megatron-LM with
    // ZeRO-1; the reader's micro-batch changes the global batch, and each change re-plans.
    let panel = |gb: u64| {
        Request::from_value(&json!({"model": "llama3.1-70b", "precision": "mixed-bf16",
            "seq": 8192, "global_batch": gb, "gpus": 64,
            "parallel": {"framework": "megatron", "zero": 1}}))
        .unwrap()
    };
    let (a, b2) = (panel(16), panel(32));
    g.bench_function("5D panel: llama3.1-70b 8k, 64 GPUs, afresh", |b| {
        b.iter(|| {
            forget();
            plan(std::hint::black_box(&a))
        })
    });
    g.bench_function("5D panel: llama3.1-70b 8k, 64 GPUs, re-planned", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            plan(std::hint::black_box(if i.is_multiple_of(2) {
                &a
            } else {
                &b2
            }))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
