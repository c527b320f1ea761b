//! The caching allocator replay (`gpumem::alloc`) against what the H100 measured:
//! `torch.cuda.max_memory_reserved()` and the device's use (`mem_get_info`) of every
//! completed training run in tests/data, with no constant fitted to them.

use gpumem::{estimate, Scenario};
use serde_json::Value;

fn root() -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/").to_string()
}

fn lines(file: &str) -> Vec<Value> {
    std::fs::read_to_string(root() + file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every run, in measure.py's order: (name, scenario, what the H100 measured).
fn runs() -> Vec<(String, Scenario, Value)> {
    let cases = lines("calibration-scenarios.jsonl");
    let measured: Vec<Value> = lines("h100-calibration.jsonl")
        .into_iter()
        .filter(|v| v["kind"] != "env")
        .collect();
    assert_eq!(cases.len(), measured.len());
    cases
        .iter()
        .zip(measured)
        .map(|(c, m)| {
            (
                c["name"].as_str().unwrap().to_string(),
                Scenario::from_value(&c["scenario"]).unwrap(),
                m,
            )
        })
        .collect()
}

fn median_and_worst(mut errs: Vec<f64>) -> (f64, f64) {
    errs.iter_mut().for_each(|e| *e = e.abs());
    errs.sort_by(f64::total_cmp);
    let n = errs.len();
    let median = if n % 2 == 1 {
        errs[n / 2]
    } else {
        (errs[n / 2 - 1] + errs[n / 2]) / 2.0
    };
    (median, errs[n - 1])
}

/// The goals: median |error| 1 %, every run 4 %.
const MEDIAN_GOAL: f64 = 0.01;
const WORST_GOAL: f64 = 0.04;

/// Each run's error replayed alone (a fresh process, as `estimate` replays it) and in
/// measure.py's order (every run through one allocator, the cache emptied between runs,
/// cuBLAS's workspaces taken in the first and kept): `(name, alone, in order)`.
///
/// The measurements are of the process in order, so that is what the goals hold to: the
/// segments the first run leaves around its workspaces (GPT-2's freed tied head, 148 MiB,
/// holds both) shape every later run. A run's own replay may miss where its measured figure
/// owes to them: llama3.2-1b under autocast, batch 2 × 2048, reserves one 2 GiB fp32 loss
/// buffer more in measure.py's process than alone (PyTorch's own events for it, from
/// tools/alloc/trace.py, replayed through the same rules: −5.95 % alone, −0.01 % in order;
/// the engine's: −5.96 % and −0.01 %). Such a run must then meet the goal in order.
fn errors(
    measured: impl Fn(&Value) -> Option<u64>,
    predicted: impl Fn(&gpumem::Estimate) -> u64,
    in_order: impl Fn(&gpumem::alloc::stream::Outcome, &gpumem::Estimate) -> u64,
) -> Vec<(String, f64, f64)> {
    let runs = runs();
    let scenarios: Vec<Scenario> = runs.iter().map(|r| r.1.clone()).collect();
    let process = gpumem::alloc::stream::replay_process(&scenarios);
    let mut out = Vec::new();
    for ((name, s, m), p) in runs.iter().zip(&process) {
        let Some(want) = measured(m) else {
            continue;
        };
        let e = estimate(s).unwrap();
        assert!(e.reserved_replayed, "{name}");
        let a = predicted(&e) as f64 / want as f64 - 1.0;
        let t = in_order(p.as_ref().unwrap(), &e) as f64 / want as f64 - 1.0;
        out.push((name.clone(), a, t));
    }
    out
}

/// The goals over `errs`: in measure.py's order, median and every run; alone, the median,
/// and every run but one whose miss the process explains (it meets the goal in order).
fn check_goals(what: &str, errs: &[(String, f64, f64)]) {
    let mut table = String::new();
    for (name, a, t) in errs {
        table += &format!(
            "{name:55} alone {:+6.2} %   in order {:+6.2} %\n",
            a * 100.0,
            t * 100.0
        );
    }
    let (am, aw) = median_and_worst(errs.iter().map(|e| e.1).collect());
    let (tm, tw) = median_and_worst(errs.iter().map(|e| e.2).collect());
    eprintln!(
        "{what}\n{table}each run alone: median {:.2} %, worst {:.2} %; the process in order: median {:.2} %, worst {:.2} %",
        am * 100.0,
        aw * 100.0,
        tm * 100.0,
        tw * 100.0
    );
    assert!(
        tm <= MEDIAN_GOAL && tw <= WORST_GOAL,
        "{what}: in order\n{table}"
    );
    assert!(am <= MEDIAN_GOAL, "{what}: alone\n{table}");
    let missed: Vec<&String> = errs
        .iter()
        .filter(|e| e.1.abs() > WORST_GOAL)
        .map(|e| &e.0)
        .collect();
    eprintln!(
        "{what}: alone above the {} % goal: {missed:?}",
        WORST_GOAL * 100.0
    );
    assert!(missed.len() <= 1, "{what}: {missed:?}");
}

#[test]
fn reserved_peaks_of_the_h100_runs() {
    // The run that did not fit runs out of memory in the replay too.
    let runs = runs();
    let scenarios: Vec<Scenario> = runs.iter().map(|r| r.1.clone()).collect();
    let process = gpumem::alloc::stream::replay_process(&scenarios);
    for ((name, s, m), p) in runs.iter().zip(&process) {
        if m["kind"] == "train" && m["peak_reserved"].as_u64().is_none() {
            assert_eq!(m["oom"], true, "{name}");
            assert!(p.unwrap().oom.is_some(), "{name}: the replay fits");
            assert!(!estimate(s).unwrap().fits, "{name}");
        }
    }
    let errs = errors(
        |m| m["peak_reserved"].as_u64().filter(|_| m["kind"] == "train"),
        |e| {
            assert!(e.peak_reserved_bytes >= e.peak_bytes);
            e.peak_reserved_bytes
        },
        |o, _| o.stats.peak_reserved,
    );
    // Generation runs measured no reserved memory.
    assert_eq!(errs.len(), 30);
    check_goals("reserved peak", &errs);
}

/// nvidia-smi: the reserved memory and the CUDA context against `mem_get_info`'s used bytes
/// at the end of each run (what measure.py recorded as `device_used_now`).
#[test]
fn device_use_of_the_h100_runs() {
    for (name, s, _) in runs() {
        let e = estimate(&s).unwrap();
        assert_eq!(
            e.device_bytes,
            e.peak_bytes + e.allocator_reserve_bytes + e.cuda_context_bytes + e.managed_bytes,
            "{name}"
        );
    }
    let errs = errors(
        |m| m["device_used_now"].as_u64(),
        |e| e.device_bytes,
        |o, e| o.stats.reserved.max(e.peak_bytes) + e.cuda_context_bytes + e.managed_bytes,
    );
    check_goals("nvidia-smi", &errs);
}

/// An op's workspace is not allocated and freed block by block in the estimate (its effect
/// on the cache is nil when a cached block holds it): the same run replayed event by event
/// gives the same figures.
#[test]
fn eliding_workspaces_changes_nothing() {
    for (name, s, m) in runs().into_iter().step_by(5) {
        if m["oom"] == true {
            continue;
        }
        let e = estimate(&s).unwrap();
        let (o, text) = gpumem::alloc::stream::events(&s).unwrap();
        assert!(text.len() > 1000, "{name}");
        assert_eq!(
            o.stats.peak_reserved.max(e.peak_bytes),
            e.peak_reserved_bytes,
            "{name}"
        );
        assert_eq!(o.stats.segments, e.segments, "{name}");
    }
}

/// `expandable_segments:True`: one segment per pool, grown by pages, never less than the
/// tensors need; `"none"` turns the replay off.
#[test]
fn allocator_settings() {
    let base =
        serde_json::json!({"model": "llama3.2-1b", "batch": 2, "seq": 2048, "precision": "bf16"});
    let with = |a: Value| {
        let mut v = base.clone();
        v["allocator"] = a;
        estimate(&Scenario::from_value(&v).unwrap()).unwrap()
    };
    let d = with("default".into());
    let x = with("expandable".into());
    let n = with("none".into());
    let m = with(serde_json::json!({"max_split_size_mb": 256}));
    assert_eq!(
        (d.allocator.as_str(), x.allocator.as_str()),
        ("default", "expandable")
    );
    assert!(x.segments <= 2, "{}", x.segments);
    assert!(x.peak_reserved_bytes >= x.peak_bytes);
    assert!(x.peak_reserved_bytes < d.peak_reserved_bytes);
    assert!(d.segments > 10);
    assert!(!n.reserved_replayed && n.peak_reserved_bytes == n.peak_bytes);
    assert_eq!(n.device_bytes, n.peak_bytes + n.cuda_context_bytes);
    assert!(m.reserved_replayed && m.allocator.contains("max_split_size_mb 256"));
    // cuBLAS's two workspaces (the forward's thread, autograd's) are in the cache.
    assert_eq!(d.cublas_workspace_bytes, 2 * 32 * 1024 * 1024);
    for bad in [
        serde_json::json!("fast"),
        serde_json::json!({"max_split_size_mb": 10}),
        serde_json::json!({"expandable_segments": "yes"}),
        serde_json::json!(3),
    ] {
        let mut v = base.clone();
        v["allocator"] = bad.clone();
        let e = Scenario::from_value(&v).unwrap_err();
        assert!(e.field.starts_with("allocator"), "{bad}: {e}");
    }
}

/// bitsandbytes' paged 8-bit AdamW keeps the uint8 states of tensors of 100,000 elements
/// and more in CUDA managed memory: outside the allocated peak and the reserved memory, in
/// nvidia-smi's figure. The non-paged one keeps them in PyTorch's allocator.
#[test]
fn paged_optimizer_states_live_outside_the_allocator() {
    let run = |opt: &str| {
        let v = serde_json::json!({"model": "llama3.2-1b", "batch": 1, "seq": 2048, "precision": "bf16", "optimizer": opt});
        estimate(&Scenario::from_value(&v).unwrap()).unwrap()
    };
    let (plain, paged) = (run("adamw-8bit"), run("paged-adamw-8bit"));
    assert_eq!(plain.managed_bytes, 0);
    assert!(paged.managed_bytes > 0);
    // The paged states leave the peak and the optimizer's bytes, and only those.
    assert_eq!(
        plain.optimizer_states_bytes,
        paged.optimizer_states_bytes + paged.managed_bytes
    );
    assert_eq!(plain.peak_bytes, paged.peak_bytes + paged.managed_bytes);
    assert!(paged.peak_reserved_bytes < plain.peak_reserved_bytes);
    assert_eq!(
        paged.device_bytes,
        paged.peak_reserved_bytes + paged.cuda_context_bytes + paged.managed_bytes
    );
    assert!(paged.notes.iter().any(|n| n.contains("managed memory")));
    // Refused where the engine does not place them (sharded PyTorch-native layouts).
    let v = serde_json::json!({"model": "llama3.2-1b", "optimizer": "paged-adamw-8bit", "parallel": {"dp": 8, "zero": 3}});
    assert_eq!(Scenario::from_value(&v).unwrap_err().field, "optimizer");
}

/// Why the replay plays every layer: the cache does not settle into a per-layer steady
/// state. Qwen3 0.6B cut to 4 and 6 layers and replayed, extrapolated layer by layer to its
/// 28, misses the reserved peak of the 28 layers replayed by 10 to 30 % (segments taken at
/// layers 10 and 20 that no short run shows, free blocks carved smaller layer after
/// layer), while the allocated peak extrapolates exactly. Replaying "one layer of each
/// kind" and repeating its growth would be such an extrapolation.
#[test]
fn the_cache_has_no_steady_state_layer_by_layer() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/models/configs/qwen3-0.6b.json"
    );
    let config: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(config["num_hidden_layers"], 28);
    for (batch, recompute) in [(1, "none"), (1, "full"), (4, "none"), (4, "full")] {
        let at = |layers: u64| {
            let mut c = config.clone();
            c["num_hidden_layers"] = layers.into();
            let s = Scenario::from_value(&serde_json::json!({
                "model": {"hf_config": c}, "batch": batch, "seq": 1024,
                "precision": "bf16", "recompute": recompute,
            }))
            .unwrap();
            let e = estimate(&s).unwrap();
            assert!(e.reserved_replayed);
            (e.peak_reserved_bytes as f64, e.peak_bytes as f64)
        };
        let (r4, a4) = at(4);
        let (r6, a6) = at(6);
        let (r28, a28) = at(28);
        let a = a4 + (a6 - a4) / 2.0 * 24.0;
        assert!((a - a28).abs() < 1.0, "allocated: {a} vs {a28}");
        let r = r4 + (r6 - r4) / 2.0 * 24.0;
        let miss = (r - r28).abs() / r28;
        assert!(
            miss > 0.05,
            "b={batch} {recompute}: reserved extrapolated within {:.2} %",
            miss * 100.0
        );
    }
}

/// Gradient accumulation: the later micro-batches add their gradients into the ones the
/// first made (each freshly computed one freed once added), so the cache does not grow
/// with the micro-batches (it grew by a whole set of gradients per micro-batch, up to a
/// wrong "out of memory from fragmentation" at 64 micro-batches of Qwen3 0.6B). A
/// micro-batch that starts as the one before it did repeats it exactly and is skipped:
/// the figures are those of the run replayed event by event, and 65,536 micro-batches on
/// a device with room for them all are answered at once (the replay used to play each).
#[test]
fn gradient_accumulation_adds_into_the_first_gradients() {
    for model in ["qwen3-0.6b", "gemma-3-1b"] {
        let scenario = |ga: u64, gpu: Value| {
            let v = serde_json::json!({
                "model": model, "batch": 1, "seq": 128, "precision": "bf16",
                "gpu": gpu, "parallel": {"grad_accum": ga},
            });
            Scenario::from_value(&v).unwrap()
        };
        let h100 = Value::from("H100-80GB");
        let at = |ga| estimate(&scenario(ga, h100.clone())).unwrap();
        let (one, two, many) = (at(1), at(2), at(64));
        assert!(one.reserved_replayed && many.reserved_replayed);
        assert!(many.fits && !many.fragmentation_oom, "{model}");
        assert_eq!(many.peak_bytes, two.peak_bytes, "{model}");
        assert_eq!(
            (many.peak_reserved_bytes, many.segments),
            (at(8).peak_reserved_bytes, at(8).segments),
            "{model}"
        );
        // One micro-batch more than one: the accumulation's transients, not a second set
        // of gradients (a bf16 set is over 1 GiB for either model).
        let grads = one.gradients_bytes;
        assert!(
            many.peak_reserved_bytes < one.peak_reserved_bytes + grads,
            "{model}: {} then {}",
            one.peak_reserved_bytes,
            many.peak_reserved_bytes
        );
        for ga in [2, 3, 5] {
            let s = scenario(ga, h100.clone());
            let e = estimate(&s).unwrap();
            let (o, _) = gpumem::alloc::stream::events(&s).unwrap();
            assert_eq!(
                (o.stats.peak_reserved.max(e.peak_bytes), o.stats.segments),
                (e.peak_reserved_bytes, e.segments),
                "{model}, {ga} micro-batches"
            );
        }
        // The segments at the peak are taken where the estimate's figures are.
        let s = scenario(5, h100.clone());
        let e = estimate(&s).unwrap();
        let segs = gpumem::alloc::stream::segments_at_peak(&s).unwrap();
        let (held, used): (u64, u64) = segs
            .iter()
            .fold((0, 0), |(h, u), g| (h + g.bytes(), u + g.allocated()));
        assert_eq!(held - used, e.reserved_unallocated_bytes, "{model}");
        let huge = serde_json::json!({"capacity_bytes": 1u64 << 50});
        let e = estimate(&scenario(65536, huge)).unwrap();
        assert_eq!(e.peak_reserved_bytes, many.peak_reserved_bytes, "{model}");
    }
}

/// The largest free block at the peak lies in the memory reserved but not allocated then:
/// an op's workspace that makes the step's high is held while the cache is looked at (it
/// was elided, and the block it takes counted as free; a fuzzing run found 1.50 GiB free in
/// 1.02 GiB unallocated).
#[test]
fn the_largest_free_block_at_the_peak_is_unallocated_memory() {
    for v in [
        serde_json::json!({"model": "phi-3.5-mini", "precision": "mixed-bf16", "recompute": "selective", "attention": "eager"}),
        serde_json::json!({"model": "phi-3.5-mini", "batch": 2, "precision": "mixed-bf16", "recompute": "selective", "attention": "eager"}),
        serde_json::json!({"model": "llama3.2-1b", "batch": 4, "seq": 2048}),
        serde_json::json!({"model": "qwen2.5-0.5b", "batch": 8, "seq": 1024, "attention": "eager"}),
        serde_json::json!({"model": "gemma-3-1b", "batch": 2, "seq": 4096, "precision": "amp-bf16"}),
    ] {
        let e = estimate(&Scenario::from_value(&v).unwrap()).unwrap();
        assert!(e.reserved_replayed, "{v}");
        assert!(
            e.largest_free_block_bytes <= e.reserved_unallocated_bytes,
            "{v}: largest free {} in {} unallocated",
            e.largest_free_block_bytes,
            e.reserved_unallocated_bytes
        );
    }
}
