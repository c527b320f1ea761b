//! Model-parallel layouts (tensor + sequence, pipeline, context, expert) and the planner:
//! published figures, schedule arithmetic and invariants.

mod common;
use gpumem::plan::{plan, Layout, Request};
use gpumem::{estimate, Estimate, Scenario};
use proptest::prelude::*;
use serde_json::{json, Value};

fn est(v: Value) -> Estimate {
    estimate(&Scenario::from_value(&v).unwrap_or_else(|e| panic!("{v}: {e}"))).unwrap()
}

/// GPT-3 175B as Korthikanti et al. 2022 train it (Table 3): 96 layers, h = 12288, 96 heads,
/// s = 2048, with dropout, LayerNorm and a GeLU MLP (the GPT-2 family).
fn gpt3_175b() -> Value {
    json!({"family": "gpt2", "hidden": 12288, "layers": 96, "heads": 96, "vocab": 51200,
           "n_positions": 2048, "intermediate": 49152})
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want
}

/// Korthikanti et al. 2022, §4.2.3: with 1F1B the first pipeline stage holds p micro-batches
/// of its L/p layers — the activations of L layers of one micro-batch, `34·s·b·h·L/t` with
/// sequence parallelism and selective recomputation; the interleaved schedule multiplies
/// this by `1 + (p − 1)/(p·v)`. The replayed schedule peaks inside the first backward, a
/// little below (within 1 %).
#[test]
fn first_stage_activations_follow_the_paper() {
    let (s, b, h, l, t) = (2048.0, 1.0, 12288.0, 96.0, 8.0);
    let per_layer = 34.0 * s * b * h / t;
    for (p, v) in [(8u64, 1u64), (8, 2), (4, 3), (12, 2)] {
        let mut par =
            json!({"tp": 8, "pp": p, "grad_accum": 2 * p * v, "sp": true, "framework": "megatron"});
        if v > 1 {
            par["schedule"] = json!("interleaved");
            par["virtual_stages"] = json!(v);
        }
        let e = est(
            json!({"model": gpt3_175b(), "precision": "mixed-bf16", "seq": 2048, "batch": 1,
                           "recompute": "selective", "attention": "eager", "parallel": par}),
        );
        let stage0 = &e.stages[0];
        let factor = if v > 1 {
            1.0 + (p as f64 - 1.0) / (p as f64 * v as f64)
        } else {
            1.0
        };
        let want = l * per_layer * factor;
        let got = stage0.components["activations"] as f64;
        assert!(close(got, want, 1e-2), "p={p} v={v}: {got} vs {want}");
        assert_eq!(stage0.micro_batches_in_flight, p as f64 * factor);
        // 1F1B: stage r holds min(p − r, m) micro-batches.
        if v == 1 {
            for (r, st) in e.stages.iter().enumerate() {
                assert_eq!(st.micro_batches_in_flight, (p - r as u64) as f64);
            }
        }
    }
    // Fewer micro-batches than stages: the first stage holds all of them.
    let e = est(
        json!({"model": gpt3_175b(), "precision": "mixed-bf16", "seq": 2048,
                       "recompute": "selective", "attention": "eager",
                       "parallel": {"tp": 8, "pp": 8, "grad_accum": 3, "framework": "megatron"}}),
    );
    assert_eq!(e.stages[0].micro_batches_in_flight, 3.0);
}

/// Without sequence parallelism the layer-norm and dropout tensors stay whole on every
/// tensor-parallel rank: `sbh(10 + 24/t + 5as/(ht))` per layer (Korthikanti et al., eq. 2).
#[test]
fn tensor_parallel_without_sequence_parallelism() {
    let (s, h, a, t) = (2048.0, 12288.0, 96.0, 8.0);
    let e = est(
        json!({"model": gpt3_175b(), "precision": "mixed-bf16", "seq": 2048, "attention": "eager",
                       "parallel": {"tp": 8, "pp": 96, "grad_accum": 1, "sp": false, "framework": "megatron"}}),
    );
    // One layer per stage, one micro-batch in flight on the middle stages.
    let mid = &e.stages[40];
    let want = s * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    // The peak comes inside the layer's backward, which has begun to free them: every
    // byte above the model states there is at least what the forward kept.
    let states: u64 = ["weights", "gradients", "master_weights", "optimizer_states"]
        .iter()
        .map(|k| mid.components[*k])
        .sum();
    let above = (mid.peak_bytes - states) as f64;
    let got = mid.components["activations"] as f64;
    assert!(above >= want && got <= want, "{got} / {above} vs {want}");
}

/// Megatron-LM's model states (its documentation of the distributed optimizer): 18 bytes
/// per parameter under bf16 mixed precision — 2 for the bf16 weight, 4 for the fp32
/// gradient buffer, 4 for the fp32 master copy and 8 for Adam's moments — and 6 + 12/d
/// with the distributed optimizer over d ranks; 16 and 4 + 12/d with the gradient buffer
/// in bf16.
#[test]
fn megatron_model_states() {
    let states = |dp: u64, zero: u64, bf16_grads: bool| {
        let e = est(
            json!({"model": "llama3.1-8b", "precision": "mixed-bf16", "seq": 1024,
            "parallel": {"dp": dp, "zero": zero, "framework": "megatron",
                         "grad_reduce_in_bf16": bf16_grads}}),
        );
        (e.model_states_bytes as f64, e.params as f64)
    };
    let (b, n) = states(1, 0, false);
    assert!(close(b, 18.0 * n, 1e-12), "{b} vs {}", 18.0 * n);
    let (b, n) = states(8, 1, false);
    assert!(close(b, (6.0 + 12.0 / 8.0) * n, 1e-12));
    let (b, n) = states(1, 0, true);
    assert!(close(b, 16.0 * n, 1e-12));
    let (b, n) = states(8, 1, true);
    assert!(close(b, (4.0 + 12.0 / 8.0) * n, 1e-12));
}

/// Summed over every rank of a tensor × pipeline (× expert) group, the weights are the
/// model's parameters: each split once, norms (and the router) once per tensor rank.
#[test]
fn weights_summed_over_ranks_are_the_model() {
    // Llama 3.1 8B: vocab 128,256 splits evenly over 8; nothing is replicated but norms.
    let e = est(
        json!({"model": "llama3.1-8b", "precision": "bf16", "seq": 1024,
                       "parallel": {"tp": 4, "pp": 4, "grad_accum": 4}}),
    );
    let summed: u64 = e
        .stages
        .iter()
        .map(|s| s.components["weights"])
        .sum::<u64>()
        * 4;
    let params = e.params as f64 * 2.0;
    let norms = (32.0 * 2.0 * 4096.0 + 4096.0) * 2.0 * 3.0; // replicated on 3 more ranks
    assert!(
        close(summed as f64, params + norms, 1e-6),
        "{summed} vs {params}"
    );
    // Mixtral 8x7B over ep = 8: each GPU keeps one expert per layer.
    let dense = est(
        json!({"model": "mixtral-8x7b", "precision": "bf16", "seq": 1024,
                           "parallel": {"ep": 1, "pp": 2, "grad_accum": 2}}),
    );
    let ep = est(
        json!({"model": "mixtral-8x7b", "precision": "bf16", "seq": 1024,
                        "parallel": {"ep": 8, "pp": 2, "grad_accum": 2}}),
    );
    let one_expert = 14336.0 * 4096.0 * 3.0 * 16.0 * 2.0; // per stage of 16 layers, bf16
    let drop = dense.stages[0].components["weights"] - ep.stages[0].components["weights"];
    assert!(close(drop as f64, 7.0 * one_expert, 1e-9), "{drop}");
}

/// The logits live on the last stage, the embedding on the first; the worst stage is the
/// one reported.
#[test]
fn stages_place_embedding_and_logits() {
    let e = est(
        json!({"model": "llama3.1-8b", "precision": "mixed-bf16", "seq": 4096,
                       "parallel": {"tp": 2, "pp": 4, "grad_accum": 8}}),
    );
    assert_eq!(e.stages.len(), 4);
    for st in &e.stages[..3] {
        assert!(!st.components.contains_key("logits"));
    }
    let last = &e.stages[3];
    assert!(last.components["logits"] > 0);
    // Vocab-parallel: 16-bit logits + fp32 softmax of s × V/t per micro-batch, and more.
    assert!(last.components["logits"] as f64 >= 4096.0 * 128256.0 / 2.0 * 6.0);
    assert!(e.stages[0].components["weights"] > e.stages[1].components["weights"]);
    let worst = e.stages.iter().map(|s| s.peak_bytes).max().unwrap();
    assert_eq!(e.peak_bytes, worst);
    // Context parallelism halves a GPU's sequence: activations shrink.
    let cp = est(
        json!({"model": "llama3.1-8b", "precision": "mixed-bf16", "seq": 4096,
                        "parallel": {"tp": 2, "pp": 4, "cp": 2, "grad_accum": 8}}),
    );
    assert!(cp.stages[0].components["activations"] < e.stages[0].components["activations"]);
    assert!(cp.stages[0].peak_bytes < e.stages[0].peak_bytes);
}

/// The Ultra-Scale Playbook (Tazi et al., Hugging Face 2025), "Memory usage in
/// Transformers": model states per parameter are 16 bytes in mixed precision (2 weights,
/// 2 gradients, 4 fp32 master, 8 Adam) and 20 with fp32 gradient accumulation on top —
/// its table lists 1B: 16 / 20 GB, 7B: 112 / 140 GB, 70B: 1120 / 1400 GB,
/// 405B: 6480 / 8100 GB. DeepSpeed keeps both 16-bit and fp32 gradients.
#[test]
fn ultrascale_playbook_model_states() {
    for (b, bf16, fp32acc) in [
        (1u64, 16e9, 20e9),
        (7, 112e9, 140e9),
        (70, 1120e9, 1400e9),
        (405, 6480e9, 8100e9),
    ] {
        let s = |fw: &str| {
            json!({"model": {"params": b * 1_000_000_000}, "precision": "mixed-bf16", "optimizer": "adam",
                   "parallel": {"framework": fw}})
        };
        assert_eq!(est(s("fsdp")).model_states_bytes as f64, bf16, "{b}B");
        assert_eq!(
            est(s("deepspeed")).model_states_bytes as f64,
            fp32acc,
            "{b}B"
        );
    }
}

/// The planner's sweep and the estimate agree, and it answers the README's questions.
#[test]
fn planner_finds_layouts_that_estimate_confirms() {
    let req = Request::from_value(&json!({
        "model": "llama3.1-70b", "precision": "mixed-bf16", "seq": 8192,
        "global_batch": 128, "gpus": "8..64:8", "offload": false, "top": 5
    }))
    .unwrap();
    let p = plan(&req);
    assert!(p.fitting > 0 && p.considered > p.fitting);
    let fewest = p.fewest_gpus.expect("70B fits on 64 H100s");
    assert!(
        fewest > 8,
        "70B at 8k needs more than one node's memory: {fewest}"
    );
    for c in &p.best {
        let e = est(c.scenario.clone());
        assert!(e.fits);
        assert_eq!(e.device_bytes, c.device_bytes);
        assert_eq!(
            c.layout.gpus,
            c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp * c.layout.ep
        );
        assert_eq!(c.layout.offload, "none");
    }
    for w in p.best.windows(2) {
        assert!(w[0].step_seconds <= w[1].step_seconds);
    }
    // The count before the fewest has nothing that fits.
    let below = p.counts.iter().find(|c| c.gpus == fewest - 8);
    assert!(below.is_none_or(|c| c.best.is_none()));
}

/// Each listed layout's scenario, estimated, gives the plan's figures: it keeps the request's
/// other parallel settings (loss_parallel, cp_load_balance, wrap, grad_reduce_in_bf16), its
/// schedule (GPipe too) and HYBRID_SHARD's group. A schedule the sweep does not try by itself
/// (GPipe, 3 chunks per stage) is planned, not answered with no layouts.
#[test]
fn planned_scenarios_estimate_to_the_plans_figures() {
    for extra in [
        json!({"loss_parallel": false}),
        json!({"cp_load_balance": false}),
        json!({"zero": 3, "wrap": "titan"}),
        json!({"framework": "megatron", "grad_reduce_in_bf16": true}),
        json!({"schedule": "gpipe"}),
        json!({"schedule": "interleaved", "virtual_stages": 3}),
        json!({"fsdp": "hybrid_shard"}),
    ] {
        let req = Request::from_value(&json!({
            "model": "qwen3-30b-a3b", "seq": 4096, "global_batch": 32, "gpus": [16, 32],
            "top": 4, "parallel": extra
        }))
        .unwrap();
        let p = plan(&req);
        assert!(!p.best.is_empty(), "{extra}: no layout");
        for c in &p.best {
            let e = est(c.scenario.clone());
            assert_eq!(
                (e.peak_bytes, e.device_bytes),
                (c.peak_bytes, c.device_bytes),
                "{extra}: {}",
                c.scenario
            );
        }
        if extra.get("fsdp").is_some() {
            assert!(p.best.iter().all(|c| c.layout.dp % 8 == 0), "{extra}");
        }
    }
}

#[test]
fn planner_requests_name_their_errors() {
    let bad = |v: Value, want: &str| {
        let e = Request::from_value(&v).unwrap_err().to_string();
        assert!(e.contains(want), "{v}: {e}");
    };
    bad(json!({"model": "llama3.1-8b"}), "gpus");
    bad(json!({"model": "llama3.1-8b", "gpus": "16..8"}), "empty");
    bad(json!({"model": "llama3.1-8b", "gpus": [8, 0]}), "gpus[1]");
    bad(
        json!({"model": {"params": 1000}, "gpus": 8}),
        "architecture",
    );
    bad(
        json!({"model": "llama3.1-8b", "gpus": 8, "global_batch": 0}),
        "global_batch",
    );
    bad(
        json!({"model": "llama3.1-8b", "gpus": "1..1000000:1"}),
        "4,096",
    );
    // Inference is named as what the planner does not plan, before the scenario is judged
    // as one (GPT-2's 1,024 positions would have been the complaint).
    bad(
        json!({"model": "gpt2", "seq": 1024, "mode": "inference", "gpus": 8}),
        "mode: the planner plans training runs",
    );
    bad(
        json!({"model": "gpt2", "mode": "training", "gpus": 8}),
        "mode",
    );
}

proptest! {
    #![proptest_config(common::cases(64))]

    /// Splitting the model over more tensor, pipeline or expert ranks never raises a GPU's
    /// model states; the worst stage is the reported one.
    #[test]
    fn model_parallel_sharding_never_grows_states(
        model in prop::sample::select(vec!["llama3.2-1b", "llama3.1-8b", "mixtral-8x7b"]),
        tp_log in 0u32..3, pp_log in 0u32..3, zero in 0u64..4, fw in prop::sample::select(vec!["fsdp", "megatron"]),
    ) {
        let (tp, pp) = (1u64 << tp_log, 1u64 << pp_log);
        let moe = model == "mixtral-8x7b";
        let s = |tp: u64, pp: u64, ep: u64| json!({"model": model, "precision": "mixed-bf16", "seq": 1024,
            "parallel": {"dp": 2, "tp": tp, "pp": pp, "ep": ep, "zero": zero, "grad_accum": 8, "framework": fw}});
        let e = est(s(tp, pp, 1));
        let wider_tp = est(s(tp * 2, pp, 1));
        prop_assert!(wider_tp.model_states_bytes <= e.model_states_bytes);
        let deeper = est(s(tp, pp * 2, 1));
        prop_assert!(deeper.model_states_bytes <= e.model_states_bytes);
        if moe {
            let ep = est(s(tp, pp, 2));
            prop_assert!(ep.model_states_bytes <= e.model_states_bytes);
        }
        prop_assert!(e.stages.iter().all(|st| st.peak_bytes <= e.peak_bytes));
    }
}

/// The planner's shortcut (the first, second and last pipeline stages) finds the stage
/// that evaluating every stage finds.
#[test]
fn the_worst_stage_is_among_the_first_second_and_last() {
    for model in ["llama3.2-1b", "qwen2.5-0.5b", "llama3.1-8b"] {
        for (pp, m, sched) in [
            (2, 4, "1f1b"),
            (4, 8, "1f1b"),
            (4, 4, "gpipe"),
            (8, 8, "1f1b"),
            (4, 8, "interleaved"),
        ] {
            for zero in [0, 3] {
                let e = est(json!({"model": model, "precision": "bf16", "seq": 2048,
                    "parallel": {"dp": if zero > 0 { 2 } else { 1 }, "pp": pp, "zero": zero,
                                 "grad_accum": m, "schedule": sched}}));
                let all = e.stages.iter().map(|s| s.peak_bytes).max().unwrap();
                let some = [0, 1, pp - 1]
                    .iter()
                    .map(|&r| e.stages[r as usize].peak_bytes)
                    .max()
                    .unwrap();
                assert_eq!(all, some, "{model} pp {pp} m {m} {sched} zero {zero}");
            }
        }
    }
}

/// Skipping the layouts a more frugal one rules out changes nothing: the same layouts fit,
/// and the same are listed.
#[test]
fn pruning_the_sweep_loses_no_layout() {
    for v in [
        json!({"model": "llama3.1-70b", "precision": "mixed-bf16", "seq": 8192, "global_batch": 64, "gpus": "8..64", "top": 20}),
        json!({"model": "llama3.1-8b", "precision": "bf16", "seq": 4096, "global_batch": 32, "gpus": "1..16", "top": 20}),
        json!({"model": "mixtral-8x7b", "precision": "mixed-bf16", "seq": 4096, "global_batch": 64, "gpus": "8..32", "top": 20}),
        // Little host memory: offload's most frugal layout of a stage is refused for it, while
        // the stage's layouts without offload fit (the fastest of them was lost).
        json!({"model": "llama3.1-70b", "gpus": 8, "host_memory_gb": 100, "top": 20}),
        json!({"model": "llama3.1-8b", "gpus": "1..8", "host_memory_gb": 0, "top": 20}),
    ] {
        let fast = Request::from_value(&v).unwrap();
        let mut all = fast.clone();
        all.exhaustive = true;
        let (p, q) = (plan(&fast), plan(&all));
        assert_eq!(p.considered, q.considered, "{v}");
        assert_eq!(p.fitting, q.fitting, "{v}");
        assert_eq!(p.best, q.best, "{v}");
    }
}

/// ZeRO shards over dp × cp: where that group is one rank, FSDP's stages are all stage 0's
/// layout, listed once (it was listed four times, the same figures on each row), and
/// Megatron's come in two (DDP and Megatron-FSDP). DeepSpeed's stages still differ on one
/// rank (its flat buffers), and a stage the request names is kept.
#[test]
fn a_layout_is_listed_once() {
    for v in [
        json!({"model": "llama3.2-1b", "gpus": 1, "top": 50}),
        json!({"model": "llama3.1-8b", "gpus": 8, "top": 100}),
        json!({"model": "qwen3-30b-a3b", "seq": 4096, "global_batch": 8, "gpus": [8, 16], "top": 200, "parallel": {"framework": "megatron"}}),
    ] {
        let p = plan(&Request::from_value(&v).unwrap());
        assert!(p.best.len() > 4, "{v}");
        for (i, a) in p.best.iter().enumerate() {
            let l = &a.layout;
            if l.dp * l.cp == 1 && l.offload == "none" {
                let megatron = a.scenario["parallel"]["framework"] == "megatron";
                let stages: &[u8] = if megatron { &[0, 2] } else { &[0] };
                assert!(stages.contains(&l.zero), "{v}: {}", a.scenario);
            }
            for b in &p.best[i + 1..] {
                let same = l.offload == "none"
                    && Layout {
                        zero: l.zero,
                        ..b.layout.clone()
                    } == *l;
                assert!(
                    !(same && a.peak_bytes == b.peak_bytes && a.step_seconds == b.step_seconds),
                    "{v}: {} and {} are the same run",
                    a.scenario,
                    b.scenario
                );
            }
        }
    }
    let one = |framework: &str, zero: Option<u8>| {
        let mut v = json!({"model": "llama3.2-1b", "gpus": 1, "top": 50, "offload": false, "parallel": {"framework": framework}});
        if let Some(z) = zero {
            v["parallel"]["zero"] = z.into();
        }
        plan(&Request::from_value(&v).unwrap()).best
    };
    let stages = |c: &[gpumem::plan::Candidate]| {
        let mut z: Vec<u8> = c.iter().map(|c| c.layout.zero).collect();
        z.dedup();
        z
    };
    assert_eq!(stages(&one("fsdp", None)), [0]);
    let mut m = stages(&one("megatron", None));
    m.sort_unstable();
    m.dedup();
    assert_eq!(m, [0, 2]);
    assert_eq!(stages(&one("fsdp", Some(3))), [3]);
    assert!(stages(&one("deepspeed", None)).len() > 1);
}

/// A constraint the request gives is met by every layout listed, each of which the engine
/// accepts as a scenario; what it refuses is not counted as fitting, and the plan says why.
/// (A fixed schedule was tried without a pipeline, whose scenario `estimate` refuses; a
/// paged 8-bit optimizer counted 48 sharded layouts as fitting that no count then listed;
/// selective recomputation under SDPA considered nothing.)
#[test]
fn constraints_are_met_and_refusals_not_counted() {
    let run = |v: Value| plan(&Request::from_value(&v).unwrap());
    let listed_are_scenarios = |p: &gpumem::plan::Plan| {
        for c in &p.best {
            let s = Scenario::from_value(&c.scenario);
            assert!(s.is_ok(), "{}: {:?}", c.scenario, s.err());
        }
    };
    let p = run(
        json!({"model": "qwen3-0.6b", "gpus": [1, 4], "parallel": {"schedule": "gpipe"}, "top": 50}),
    );
    assert!(!p.best.is_empty());
    assert!(p.best.iter().all(|c| c.layout.pp > 1));
    assert_eq!(p.counts[0].considered, 0);
    listed_are_scenarios(&p);
    let p = run(json!({"model": "qwen3-0.6b", "gpus": 1, "recompute": "selective", "top": 50}));
    assert!(!p.best.is_empty());
    assert!(p.best.iter().all(|c| c.layout.recompute == "selective"));
    listed_are_scenarios(&p);
    let p = run(json!({"model": "qwen3-30b-a3b", "gpus": [2, 4], "optimizer": "paged-adamw-8bit"}));
    assert!(p.considered > 0);
    assert_eq!((p.fitting, p.fewest_gpus, p.best.len()), (0, None, 0));
    assert!(
        p.refused
            .as_deref()
            .is_some_and(|r| r.starts_with("optimizer: ")),
        "{:?}",
        p.refused
    );
    // Under DeepSpeed the paged states are modelled on any count.
    let p = run(
        json!({"model": "qwen3-0.6b", "gpus": [1, 2], "optimizer": "paged-adamw-8bit", "parallel": {"framework": "deepspeed"}}),
    );
    assert!(p.fitting > 0 && !p.best.is_empty());
    assert_eq!(p.counts.iter().map(|c| c.fitting).sum::<u64>(), p.fitting);
    listed_are_scenarios(&p);
    // A tensor-parallel group stays inside a node (of 3 GPUs: tp 2 would straddle two).
    let tps = |per_node: u64| {
        let p = run(
            json!({"model": "gpt2", "seq": 1024, "gpus": [6, 12], "gpus_per_node": per_node, "top": 1000}),
        );
        let mut t: Vec<u64> = p.best.iter().map(|c| c.layout.tp).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    assert_eq!(tps(3), [1, 3]);
    assert_eq!(tps(6), [1, 2, 3, 6]);
}

/// Every model type the oracle has cut configs of runs under FSDP2 too
/// (tests/data/oracle/sharded.jsonl, tools/oracle/run_cases.py): each type's FSDP2 cases
/// within 2 % of PyTorch's own per-rank peak (Falcon at 1.7 % and gpt-oss at 1.1 % keep
/// CUDA's softmax backward temporary, which the CPU's kernel does not make).
#[test]
fn every_oracle_family_trains_under_fsdp2_within_two_percent() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/oracle/sharded.jsonl"
    );
    let mut seen = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        let c: Value = serde_json::from_str(line).unwrap();
        if c["layout"] != "fsdp" {
            continue;
        }
        let cfg = &c["scenario"]["model"]["hf_config"];
        let Some(kind) = cfg["model_type"].as_str() else {
            continue;
        };
        let s = Scenario::from_value(&c["scenario"]).unwrap();
        let e = estimate(&s).unwrap();
        let want = c["expect"]["peak_step"].as_f64().unwrap();
        let ws = e.cublas_workspace_bytes as f64;
        let err = (e.peak_bytes as f64 - ws) / want - 1.0;
        assert!(err.abs() <= 0.02, "{}: {:+.2} %", c["name"], err * 100.0);
        *seen.entry(kind.to_string()).or_insert(0) += 1;
    }
    for kind in [
        "llama",
        "qwen2",
        "mixtral",
        "qwen3",
        "qwen3_moe",
        "qwen3_next",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "gpt_oss",
        "deepseek_v2",
        "deepseek_v3",
        "glm4_moe",
        "phi3",
        "olmo2",
        "cohere2",
        "llama4_text",
        "minimax_m2",
        "starcoder2",
        "smollm3",
        "falcon",
        "gpt_neox",
        "olmoe",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "ministral3",
    ] {
        assert!(seen.contains_key(kind), "no FSDP2 case of {kind}: {seen:?}");
    }
}
