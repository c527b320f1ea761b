//! Gemma 3's multimodal wrapper: AutoModelForCausalLM builds it whole
//! (Gemma3ForConditionalGeneration), and its SigLIP vision tower sits in memory beside the
//! decoder though text batches never run it.

use gpumem::{estimate, Scenario};
use serde_json::{json, Value};

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The published gemma-3-12b-it wrapper with its decoder cut to 6 layers (the oracle's case,
/// written by tools/oracle/families.py), and its decoder alone.
fn configs() -> (Value, Value) {
    let path = root().join("tests/data/oracle/families/gemma-3-12b-wrapper-L6.json");
    let wrapper: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let text = wrapper["text_config"].clone();
    (wrapper, text)
}

fn run(config: &Value, extra: Value) -> gpumem::Estimate {
    let mut v =
        json!({"model": {"hf_config": config}, "batch": 1, "seq": 1024, "precision": "bf16"});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    estimate(&Scenario::from_value(&v).unwrap()).unwrap()
}

/// Parameter counts of `AutoModelForCausalLM.from_config` on the meta device (transformers
/// 5.17.0, torch 2.11.0): the 12B wrapper's tower is 421,290,864 parameters (12,187,325,040
/// in all, tests/data/models/models.jsonl); without a `vision_config` Gemma3Config takes
/// SiglipVisionConfig's defaults, whose pooling head (`vision_use_head` unset) adds to the
/// tower: 95,834,112 with this decoder's width.
#[test]
fn the_tower_is_counted_as_transformers_builds_it() {
    let (wrapper, text) = configs();
    let p = gpumem::hf::parse_hf_config(&wrapper, "c").unwrap().params();
    assert_eq!((p.total, p.vision), (2_351_776_512, 421_290_864));
    assert_eq!(
        gpumem::hf::parse_hf_config(&text, "c")
            .unwrap()
            .params()
            .vision,
        0
    );
    let mut bare = wrapper.clone();
    bare.as_object_mut().unwrap().remove("vision_config");
    let p = gpumem::hf::parse_hf_config(&bare, "c").unwrap().params();
    assert_eq!(p.total + p.vision, 2_447_610_624);
    assert_eq!(p.vision, 95_834_112);
}

/// On one GPU the tower is weights (the model's dtype; fp32 where mixed precision keeps fp32
/// parameters) and its int64 position ids; no gradients, no optimizer states. Elsewhere it is
/// not placed, and the estimate says so.
#[test]
fn the_tower_is_resident_weights_on_one_gpu() {
    let (wrapper, text) = configs();
    let tower = 421_290_864.0;
    let ids = 4096.0 * 8.0;
    for (precision, bytes) in [("bf16", 2.0), ("fp32", 4.0), ("mixed-bf16", 4.0)] {
        for mode in ["train", "inference"] {
            let extra = json!({"precision": precision, "mode": mode});
            let (w, t) = (run(&wrapper, extra.clone()), run(&text, extra));
            // Inference under mixed precision loads 16-bit weights.
            let b = if mode == "inference" && precision == "mixed-bf16" {
                2.0
            } else {
                bytes
            };
            let what = format!("{precision} {mode}");
            assert_eq!(
                w.weights_bytes as f64 - t.weights_bytes as f64,
                tower * b + ids,
                "{what}"
            );
            assert_eq!(w.params, t.params + 421_290_864, "{what}");
            assert_eq!(w.trainable_params, t.trainable_params, "{what}");
            assert_eq!(w.gradients_bytes, t.gradients_bytes, "{what}");
            assert_eq!(w.optimizer_states_bytes, t.optimizer_states_bytes, "{what}");
            assert_eq!(w.master_weights_bytes, t.master_weights_bytes, "{what}");
            assert!(
                w.notes
                    .iter()
                    .any(|n| n.contains("loaded with the decoder")),
                "{what}"
            );
        }
    }
    // The caching allocator's replay holds the tower too.
    let (w, t) = (run(&wrapper, json!({})), run(&text, json!({})));
    assert!(w.reserved_replayed && t.reserved_replayed);
    assert!(w.peak_reserved_bytes >= t.peak_reserved_bytes + 842_581_728);
    // Not placed under DDP or pipeline parallelism: the decoder's figures, said.
    for layout in [json!({"dp": 2}), json!({"dp": 2, "pp": 2, "zero": 3})] {
        let par = json!({ "parallel": layout });
        let (w, t) = (run(&wrapper, par.clone()), run(&text, par));
        assert_eq!(w.peak_bytes, t.peak_bytes, "{layout}");
        assert!(
            w.notes.iter().any(|n| n.contains("not counted")),
            "{layout}"
        );
        assert!(!t.notes.iter().any(|n| n.contains("vision")));
    }
}

/// Under FSDP2 over data-parallel ranks the tower is in no layer's unit, so in the root's
/// group: each rank keeps its shard (padded as FSDP2 pads dim 0), and the root's all-gather
/// holds the whole tower from the forward's start to the end of the backward, so at the
/// peak, which is in the backward. The CPU oracle measured (1 + 1/N) × the tower's bytes
/// against the decoder alone (`gemma3-wrap fsdp` and `hsdp` in
/// tests/data/oracle/sharded.jsonl, within 0.07 % of the estimate); here the same on the
/// estimate's own terms.
#[test]
fn under_fsdp2_the_root_holds_the_tower_gathered() {
    let (wrapper, text) = configs();
    let tower = 421_290_864.0;
    let ids = 4096.0 * 8.0;
    // (shard ranks, dp, tp, wrap, zero): tensor parallelism leaves the tower whole, in the
    // root's group of the data-parallel mesh.
    for (n, dp, tp, wrap, zero) in [
        (4, 4, 1, "layers", 3),
        (8, 8, 1, "titan", 2),
        (4, 16, 1, "layers", 3),
        (4, 4, 2, "layers", 3),
    ] {
        for (precision, shard_b, gather_b) in [("bf16", 2.0, 2.0), ("mixed-bf16", 4.0, 2.0)] {
            let extra = json!({
                "precision": precision, "seq": 2048,
                "parallel": {"dp": dp, "tp": tp, "zero": zero, "wrap": wrap, "shard_group": n},
            });
            let (w, t) = (run(&wrapper, extra.clone()), run(&text, extra));
            let what = format!("{precision} dp {dp} tp {tp} shard {n} {wrap} zero {zero}");
            let master = precision != "bf16";
            let (ws, ts) = if master {
                (w.master_weights_bytes, t.master_weights_bytes)
            } else {
                (w.weights_bytes - ids as u64, t.weights_bytes)
            };
            // The shard: every tensor's dim 0 padded to a multiple of the ranks (the tower's
            // are multiples of 4 and 8 here).
            assert_eq!((ws - ts) as f64, tower / n as f64 * shard_b, "{what}");
            if master {
                assert_eq!(w.weights_bytes - t.weights_bytes, ids as u64, "{what}");
            }
            let extra_peak = w.peak_bytes as f64 - t.peak_bytes as f64;
            let want = tower / n as f64 * shard_b + ids + tower * gather_b;
            assert!(
                (extra_peak - want).abs() < 1.0,
                "{what}: {extra_peak} vs {want}"
            );
            assert_eq!(w.gradients_bytes, t.gradients_bytes, "{what}");
            assert_eq!(w.optimizer_states_bytes, t.optimizer_states_bytes, "{what}");
            assert!(
                w.notes
                    .iter()
                    .any(|x| x.contains("loaded with the decoder")),
                "{what}: {:?}",
                w.notes
            );
        }
    }
}

/// A page's `arch` knob carries the tower (`vision_config.KEY` pairs) and reads it back; a
/// malformed `vision_config`, pasted or in a knob, is refused naming the field.
#[test]
fn the_knob_carries_the_tower_and_errors_name_its_fields() {
    let (wrapper, _) = configs();
    let knob = gpumem::knobs::arch_from_config_json(&wrapper.to_string()).unwrap();
    assert!(knob.contains("vision_config.hidden_size=1152"), "{knob}");
    let s = gpumem::knobs::scenario([("arch", knob.as_str())]).unwrap();
    let want = gpumem::hf::parse_hf_config(&wrapper, "c").unwrap();
    match s.model {
        gpumem::scenario::Model::Arch { arch, .. } => assert_eq!(arch, want),
        other => panic!("{other:?}"),
    }
    let refuse = |k: &str, v: Value| {
        let mut c = wrapper.clone();
        if k.is_empty() {
            c["vision_config"] = v;
        } else {
            c["vision_config"][k] = v;
        }
        gpumem::hf::parse_hf_config(&c, "config").unwrap_err().field
    };
    assert_eq!(refuse("", json!("siglip")), "config.vision_config");
    assert_eq!(
        refuse("patch_size", json!(0)),
        "config.vision_config.patch_size"
    );
    assert_eq!(
        refuse("image_size", json!([896, 896])),
        "config.vision_config.image_size"
    );
    assert_eq!(
        refuse("num_hidden_layers", json!(1e12)),
        "config.vision_config.num_hidden_layers"
    );
    let bad = knob.replace("vision_config.patch_size=14", "vision_config.patch_size=0");
    let e = gpumem::knobs::scenario([("arch", bad.as_str())]).unwrap_err();
    assert!(e.field.ends_with("vision_config.patch_size"), "{e}");
}

/// Tensor parallelism without FSDP (one replica): DTensor's plan covers the decoder alone,
/// so every rank holds the whole tower, as one GPU does (the CPU oracle's `gemma3-wrap tp`,
/// within 0.04 %); so does each replica of data-parallel inference.
#[test]
fn tensor_parallel_ranks_hold_the_tower_whole() {
    let (wrapper, text) = configs();
    for tp in [2, 4] {
        let extra = json!({"seq": 2048, "parallel": {"tp": tp, "loss_parallel": true}});
        let (w, t) = (run(&wrapper, extra.clone()), run(&text, extra));
        let tower = 421_290_864 * 2 + 4096 * 8;
        assert_eq!(w.weights_bytes - t.weights_bytes, tower, "tp {tp}");
        assert_eq!(w.peak_bytes - t.peak_bytes, tower, "tp {tp}");
        assert_eq!(w.gradients_bytes, t.gradients_bytes, "tp {tp}");
        assert!(w
            .notes
            .iter()
            .any(|n| n.contains("loaded with the decoder")));
    }
    // Inference over data-parallel ranks: each rank a whole replica, the tower in it.
    let extra = json!({"mode": "inference", "parallel": {"dp": 4}});
    let (w, t) = (run(&wrapper, extra.clone()), run(&text, extra));
    assert_eq!(w.peak_bytes - t.peak_bytes, 421_290_864 * 2 + 4096 * 8);
    assert!(w
        .notes
        .iter()
        .any(|n| n.contains("loaded with the decoder")));
}
