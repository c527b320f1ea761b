//! Data-parallel sharding and layouts: published reference figures and invariants.

mod common;
use gpumem::{estimate, Scenario};
use proptest::prelude::*;
use serde_json::{json, Value};

fn est(v: Value) -> gpumem::Estimate {
    estimate(&Scenario::from_value(&v).unwrap_or_else(|e| panic!("{v}: {e}"))).unwrap()
}

/// DeepSpeed's `estimate_zero2_model_states_mem_needs` and
/// `estimate_zero3_model_states_mem_needs` (deepspeed/runtime/zero/stage_1_and_2.py and
/// stage3.py), GPU side, for one node of 8 GPUs:
///   ZeRO-2: 4Ψ + 16Ψ/N; with optimizer offload 2Ψ. The estimator keeps every 16-bit
///   gradient (2Ψ) where stage 2 keeps its partition's (2Ψ/N; stage_1_and_2.py frees the
///   others as their buckets are reduced): 2Ψ + 18Ψ/N, the ZeRO paper's 2Ψ + 14Ψ/N with
///   DeepSpeed's fp32 gradient partition. ZeRO-1 is the estimator's 4Ψ + 16Ψ/N.
///   ZeRO-3: 4·L + 18Ψ/N; optimizer offload 4·L + 2Ψ/N; parameter offload too 4·L,
/// where L is the largest layer's parameter count (Llama: the embedding). Host side
/// (zero_init, per node): 16Ψ and 18Ψ, before DeepSpeed's 1.5× buffer factor.
#[test]
fn deepspeed_estimator_formulas() {
    for (model, psi, largest) in [
        ("llama3.1-8b", 8_030_261_248f64, 128_256f64 * 4096.0),
        ("llama2-7b", 6_738_415_616f64, 32_000f64 * 4096.0),
        ("qwen2.5-14b", 0.0, 152_064f64 * 5120.0),
    ] {
        let base = |zero: u64, offload: &str| {
            json!({"model": model, "precision": "mixed-bf16", "optimizer": "adam", "batch": 1, "seq": 512,
                   "parallel": {"dp": 8, "zero": zero, "framework": "deepspeed", "offload": offload}})
        };
        let e = est(base(2, "none"));
        let psi = if psi == 0.0 { e.params as f64 } else { psi };
        assert_eq!(e.params as f64, psi, "{model}");
        let n = 8.0;
        let check = |got: u64, want: f64, what: &str| {
            assert!(
                (got as f64 - want).abs() <= 8.0,
                "{model} {what}: {got} vs {want}"
            );
        };
        check(e.model_states_bytes, 2.0 * psi + 18.0 * psi / n, "zero2");
        check(
            est(base(1, "none")).model_states_bytes,
            4.0 * psi + 16.0 * psi / n,
            "zero1",
        );
        check(
            est(base(2, "optimizer")).model_states_bytes,
            2.0 * psi,
            "zero2 offload",
        );
        check(
            est(base(3, "none")).model_states_bytes,
            4.0 * largest + 18.0 * psi / n,
            "zero3",
        );
        let off = est(base(3, "optimizer"));
        check(
            off.model_states_bytes,
            4.0 * largest + 2.0 * psi / n,
            "zero3 offload optimizer",
        );
        check(
            off.host_bytes * 8,
            16.0 * psi,
            "zero3 offload optimizer, host per node",
        );
        let all = est(base(3, "optimizer+params"));
        check(
            all.model_states_bytes,
            4.0 * largest,
            "zero3 offload params",
        );
        check(
            all.host_bytes * 8,
            18.0 * psi,
            "zero3 offload params, host per node",
        );
    }
}

#[test]
fn fsdp_buffers_and_gradient_accumulation_show_in_the_peak() {
    let s = |par: Value| json!({"model": "llama3.2-1b", "precision": "bf16", "batch": 1, "seq": 1024, "parallel": par});
    let single = est(s(json!({})));
    let ddp = est(s(json!({"dp": 8})));
    // DDP's gradient buckets are a second copy of the gradients.
    assert!(ddp.components["comm_buffers"].abs_diff(single.gradients_bytes) < 16);
    let full = est(s(json!({"dp": 8, "fsdp": "full_shard"})));
    let grad_op = est(s(json!({"dp": 8, "fsdp": "shard_grad_op"})));
    assert!(
        full.peak_bytes < grad_op.peak_bytes,
        "SHARD_GRAD_OP keeps parameters gathered"
    );
    assert!(full.components["gathered_params"] > 0);
    let hybrid = est(s(
        json!({"dp": 64, "fsdp": "hybrid_shard", "shard_group": 8}),
    ));
    assert_eq!(
        hybrid.weights_bytes, full.weights_bytes,
        "hybrid shards within groups of 8"
    );
    let accum = est(s(json!({"grad_accum": 4})));
    assert!(
        accum.peak_bytes > single.peak_bytes,
        "accumulated gradients stay resident"
    );
    assert!(
        accum.peak_phase.starts_with("micro-batch 2 of 4"),
        "{}",
        accum.peak_phase
    );
}

#[test]
fn invalid_layouts_say_which_constraint_failed() {
    let bad = |par: Value, want: &str| {
        let v = json!({"model": "llama3.1-8b", "seq": 4096, "parallel": par});
        let e = Scenario::from_value(&v).unwrap_err().to_string();
        assert!(e.contains(want), "{par}: {e}");
    };
    bad(
        json!({"tp": 3}),
        "attention heads (32) must be divisible by tp (3)",
    );
    bad(
        json!({"tp": 16}),
        "key/value heads (8) must be divisible by tp (16)",
    );
    bad(json!({"pp": 64}), "pp (64) exceeds the model's 32 layers");
    bad(json!({"ep": 2}), "ep (2) needs a mixture-of-experts model");
    bad(
        json!({"cp": 3}),
        "seq (4096) must be divisible by 6 (2 × cp) for ring attention",
    );
    bad(
        json!({"tp": 2, "framework": "deepspeed"}),
        "DeepSpeed is modelled for ZeRO data parallelism",
    );
    bad(
        json!({"dp": 2, "tp": 2, "gpus": 8}),
        "8 GPUs is not dp × tp × pp × cp × ep",
    );
    bad(
        json!({"zero": 2, "offload": "optimizer+params"}),
        "offloading parameters needs ZeRO-3",
    );
    bad(
        json!({"pp": 4, "schedule": "interleaved", "virtual_stages": 3}),
        "layers (32) divisible by pp × virtual_stages (12)",
    );
    bad(json!({"dp": 8, "shard_group": 3}), "must divide dp (8)");
    bad(
        json!({"pp": 4, "schedule": "interleaved", "virtual_stages": 2, "grad_accum": 6}),
        "micro-batches per step (6) to be a multiple of pp (4)",
    );
    let v =
        json!({"model": "llama3.1-8b", "seq": 4096, "attention": "eager", "parallel": {"cp": 2}});
    let e = Scenario::from_value(&v).unwrap_err().to_string();
    assert!(
        e.contains("parallel.cp") && e.contains("fused attention"),
        "{e}"
    );
    let v = json!({"model": "mixtral-8x7b", "parallel": {"ep": 3}});
    let e = Scenario::from_value(&v).unwrap_err().to_string();
    assert!(e.contains("experts (8) must be divisible by ep (3)"), "{e}");
    // Inference: the setting named is the one given (pp 2 was refused as tp), and sharded
    // weights, which generation would gather layer by layer, are refused (a ZeRO-3 rank
    // counted its shard alone).
    for (par, field) in [
        (json!({"pp": 2}), "parallel.pp"),
        (json!({"cp": 2}), "parallel.cp"),
        (json!({"dp": 8, "zero": 3}), "parallel.zero"),
        (json!({"dp": 8, "fsdp": "full_shard"}), "parallel.zero"),
    ] {
        let v = json!({"model": "llama3.1-8b", "mode": "inference", "parallel": par});
        assert_eq!(Scenario::from_value(&v).unwrap_err().field, field, "{par}");
    }
    let replicas = json!({"model": "llama3.1-8b", "mode": "inference", "parallel": {"dp": 8}});
    let one = json!({"model": "llama3.1-8b", "mode": "inference"});
    assert_eq!(est(replicas).peak_bytes, est(one).peak_bytes);
}

proptest! {
    #![proptest_config(common::cases(48))]

    /// Sharding more never raises what a GPU keeps; a state sharded over n ranks sums back to
    /// the whole; a trivial layout equals the single-GPU estimate.
    #[test]
    fn sharding_invariants(model in prop::sample::select(vec!["gpt2", "llama3.2-1b", "qwen2.5-0.5b", "mixtral-8x7b"]),
                           dp_log in 0u32..8, zero in 0u64..4, deepspeed in any::<bool>()) {
        let dp = 1u64 << dp_log;
        let fw = if deepspeed { "deepspeed" } else { "fsdp" };
        let s = |dp: u64, zero: u64| json!({"model": model, "precision": "mixed-bf16", "batch": 1, "seq": 256,
                                            "parallel": {"dp": dp, "zero": zero, "framework": fw}});
        let e = est(s(dp, zero));
        if zero < 3 {
            let more = est(s(dp, zero + 1));
            prop_assert!(more.model_states_bytes <= e.model_states_bytes);
        }
        let wider = est(s(dp * 2, zero));
        prop_assert!(wider.model_states_bytes <= e.model_states_bytes);
        // Sum over ranks of a sharded state = the unsharded total (optimizer states, ZeRO ≥ 1);
        // FSDP2 pads each tensor's first dimension to a multiple of the ranks, so rank 0's
        // share times the ranks may exceed it, by less than one row per tensor and rank.
        if zero >= 1 {
            let one = est(s(1, 0));
            let summed = e.optimizer_states_bytes as f64 * dp as f64;
            let total = one.optimizer_states_bytes as f64;
            if deepspeed || zero == 1 {
                prop_assert!((summed - total).abs() <= dp as f64);
            } else {
                prop_assert!(summed >= total - dp as f64);
                prop_assert!(summed <= total * 1.01 || dp > 8, "{summed} vs {total}");
            }
        }
        let trivial = est(json!({"model": model, "precision": "mixed-bf16", "batch": 1, "seq": 256,
                                 "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0}}));
        let plain = est(json!({"model": model, "precision": "mixed-bf16", "batch": 1, "seq": 256}));
        prop_assert_eq!(trivial.peak_bytes, plain.peak_bytes);
    }
}

/// The notes name the framework the layout runs under: under Megatron-LM (named by the
/// first note) the tensor and pipeline parallelism are its own, not DTensor's or
/// torch.distributed.pipelining's (a reader's review found the 5D panel describing a
/// Megatron layout with PyTorch's tools).
#[test]
fn the_notes_name_the_layouts_framework() {
    let notes = |framework: &str| {
        let v = serde_json::json!({"model": "llama3.1-70b", "seq": 8192, "batch": 1,
            "precision": "mixed-bf16", "parallel": {"framework": framework, "dp": 2, "tp": 8,
            "pp": 4, "zero": 1, "grad_accum": 8}});
        let e = gpumem::estimate(&gpumem::Scenario::from_value(&v).unwrap()).unwrap();
        e.notes.join("\n")
    };
    let m = notes("megatron");
    assert!(m.starts_with("Megatron-LM: "), "{m}");
    assert!(
        m.contains("tensor parallel over 8 ranks, sequence parallel"),
        "{m}"
    );
    assert!(m.contains("pipeline of 4 stages (1F1B)"), "{m}");
    assert!(
        !m.contains("DTensor") && !m.contains("torch.distributed"),
        "{m}"
    );
    let f = notes("fsdp");
    assert!(f.contains("(DTensor, torchtitan's plan)"), "{f}");
    assert!(f.contains("(torch.distributed.pipelining, 1F1B)"), "{f}");
}

/// DeepSpeed without a separate master dtype (deepspeed/runtime/zero, commit edaa722 of
/// 2026-08-22): ZeRO keeps the optimizer's partition of the parameters, and its gradient, in
/// the parameters' own dtype (`master_weights_and_grads_dtype`: bf16 under
/// `bf16_master_weights_and_grads`, else fp32). Stages 1 and 2 clone the partition
/// (stage_1_and_2.py, `single_partition_of_fp32_groups`); stage 3 uses the parameters' own
/// partition where the dtypes agree (stage3.py, "we don't need another copy of the weights")
/// and keeps every gradient partition in one buffer of the model's dtype
/// (`grad_partitions_flat_buffer`). Per GPU, Ψ parameters over N = 8 ranks, L the largest
/// layer: pure bf16 ZeRO-1 4Ψ + (2 + 2 + 4)Ψ/N, ZeRO-2 2Ψ + (2 + 2 + 2 + 4)Ψ/N (its
/// 16-bit gradients sharded too) and ZeRO-3 4L + (2 + 2 + 4)Ψ/N; fp32 ZeRO-1
/// 8Ψ + (4 + 4 + 8)Ψ/N, ZeRO-2 4Ψ + (4 + 4 + 4 + 8)Ψ/N and ZeRO-3 8L + (4 + 4 + 8)Ψ/N. Without ZeRO, DeepSpeed's
/// FP16_Optimizer keeps fp32 masters, gradients and states (fp16/fused_optimizer.py),
/// counted so; an fp16 master under ZeRO needs the CPU optimizer (base_optimizer.py,
/// `_configure_master_weights`): refused, naming the precision.
#[test]
fn deepspeed_keeps_the_partition_in_the_parameters_dtype() {
    let (psi, largest) = (8_030_261_248f64, 128_256f64 * 4096.0);
    let n = 8.0;
    let s = |precision: &str, zero: u64, offload: &str| {
        json!({"model": "llama3.1-8b", "precision": precision, "optimizer": "adam", "batch": 1, "seq": 512,
               "parallel": {"dp": 8, "zero": zero, "framework": "deepspeed", "offload": offload}})
    };
    let check = |v: Value, want: f64| {
        let e = est(v.clone());
        assert!(
            (e.model_states_bytes as f64 - want).abs() <= 8.0,
            "{v}: {} vs {want}",
            e.model_states_bytes
        );
        e
    };
    check(s("bf16", 1, "none"), 4.0 * psi + 8.0 * psi / n);
    check(s("fp32", 1, "none"), 8.0 * psi + 16.0 * psi / n);
    // Stage 2 keeps its partition's 16-bit gradients only.
    check(s("bf16", 2, "none"), 2.0 * psi + 10.0 * psi / n);
    check(s("fp32", 2, "none"), 4.0 * psi + 20.0 * psi / n);
    let e = check(s("bf16", 3, "none"), 4.0 * largest + 8.0 * psi / n);
    assert!(e.notes.iter().any(
        |t| t.contains("bf16_master_weights_and_grads") && t.contains("bf16_optimizer_states")
    ));
    check(s("fp32", 3, "none"), 8.0 * largest + 16.0 * psi / n);
    // Offloaded: the partition, its gradient and the states in CPU memory.
    let off = est(s("bf16", 3, "optimizer"));
    assert!(
        (off.host_bytes as f64 - 8.0 * psi / n).abs() <= 8.0,
        "{}",
        off.host_bytes
    );
    for (precision, zero) in [("fp16", 1), ("fp16", 2), ("fp16", 3)] {
        let v = s(precision, zero, "none");
        let err = Scenario::from_value(&v).unwrap_err();
        assert_eq!(err.field, "precision", "{v}");
        assert!(err.message.contains("fp32 master"), "{}", err.message);
    }
    // Without ZeRO, its FP16_Optimizer keeps fp32 masters, gradients and states: 16-bit
    // training is mixed precision there (20Ψ, as DeepSpeed's mixed-bf16), and says so.
    for precision in ["bf16", "fp16"] {
        let e = check(s(precision, 0, "none"), 20.0 * psi);
        assert!(
            e.notes.iter().any(|t| t.contains("FP16_Optimizer")),
            "{:?}",
            e.notes
        );
    }
    check(s("mixed-bf16", 0, "none"), 20.0 * psi);
    // fp32 states beside a bf16 master only on the CPU.
    let custom = |offload: &str| {
        json!({"model": "llama3.1-8b", "precision": {"weights": "bf16", "optimizer": "fp32"},
               "parallel": {"dp": 8, "zero": 3, "framework": "deepspeed", "offload": offload}})
    };
    assert_eq!(
        Scenario::from_value(&custom("none")).unwrap_err().field,
        "precision"
    );
    est(custom("optimizer"));
    // The planner plans a pure-bf16 DeepSpeed request over every stage.
    let p = gpumem::plan::plan(
        &gpumem::plan::Request::from_value(
            &json!({"model": "llama3.2-1b", "gpus": 8, "global_batch": 8, "precision": "bf16",
            "parallel": {"framework": "deepspeed"}, "top": 100}),
        )
        .unwrap(),
    );
    let mut stages: Vec<u8> = p.best.iter().map(|c| c.layout.zero).collect();
    stages.sort_unstable();
    stages.dedup();
    assert_eq!(stages, [0, 1, 2, 3]);
}

/// A distributed optimizer (ZeRO-1) under expert parallelism: a dense tensor is replicated
/// on every data-parallel and expert-parallel rank (Megatron-Core's data-parallel group is
/// both), an expert's on the data-parallel ranks of its expert group, so each is sharded
/// over all of them, and every rank's share of the states is the whole over dp × ep. Megatron
/// sharded the dense states over dp alone, where the FSDP path already divided them by
/// dp × ep.
#[test]
fn a_distributed_optimizer_shards_dense_states_over_the_expert_ranks_too() {
    for fw in ["megatron", "fsdp"] {
        let e = |ep: u64| {
            est(
                json!({"model": "qwen3-30b-a3b", "precision": "mixed-bf16", "seq": 2048,
                       "parallel": {"dp": 8, "ep": ep, "zero": 1, "framework": fw}}),
            )
        };
        let one = e(1);
        for ep in [2u64, 8] {
            let got = e(ep);
            for (what, a, b) in [
                (
                    "optimizer",
                    got.optimizer_states_bytes,
                    one.optimizer_states_bytes,
                ),
                ("master", got.master_weights_bytes, one.master_weights_bytes),
            ] {
                let want = b as f64 / ep as f64;
                assert!(
                    (a as f64 - want).abs() / want < 1e-6,
                    "{fw} ep {ep} {what}: {a} vs {want}"
                );
            }
        }
    }
}
