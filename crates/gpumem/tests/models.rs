//! Every published config.json in tests/data/models/configs, parsed by the engine, against
//! what transformers 5.17 builds from it (tests/data/models/models.jsonl, made by
//! tools/models/generate.py): parameters and KV-cache bytes must be exact.

use gpumem::hf::{parse_hf_config, to_hf_config};
use serde_json::Value;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn records() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("tests/data/models/models.jsonl"))
        .expect("tests/data/models/models.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect()
}

fn config(r: &Value) -> Value {
    let path = r["config_file"].as_str().expect("config_file");
    let text = std::fs::read_to_string(root().join(path)).expect("config file");
    serde_json::from_str(&text).expect("config JSON")
}

#[test]
fn parameters_and_kv_cache_are_exact_for_every_published_config() {
    let recs = records();
    assert!(recs.len() >= 31, "{} records", recs.len());
    let mut failures = Vec::new();
    for r in &recs {
        let name = r["name"].as_str().unwrap();
        let a = match parse_hf_config(&config(r), "config") {
            Ok(a) => a,
            Err(e) => {
                failures.push(format!("{name}: refused: {e}"));
                continue;
            }
        };
        // A multimodal config as AutoModelForCausalLM builds it: Gemma 3's wrapper whole (its
        // vision tower counted apart from the decoder), Llama 4's text model alone.
        let p = a.params();
        let whole = r["built_as"] == "gemma3";
        assert_eq!(
            whole,
            p.vision > 0,
            "{name}: a vision tower only for Gemma 3's wrapper"
        );
        let want = match r["text_only"]["params"].as_u64() {
            Some(text) if !whole => text,
            _ => r["params"].as_u64().unwrap(),
        };
        let got = p.total + p.vision;
        if got != want {
            failures.push(format!(
                "{name}: params {got} != {want} ({:+})",
                got as i128 - want as i128
            ));
        }
        for n in ["4096", "32768"] {
            let want = r["kv_bytes"][n].as_f64().unwrap();
            let got = a.kv_cache_bytes(1.0, n.parse().unwrap(), 2.0);
            if got != want {
                failures.push(format!("{name}: KV after {n} tokens {got} != {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// What a page's `arch` knob carries reads back as the same architecture.
#[test]
fn every_published_config_round_trips_through_the_arch_knob() {
    for r in records() {
        let name = r["name"].as_str().unwrap();
        let c = config(&r);
        let a = parse_hf_config(&c, "config").unwrap_or_else(|e| panic!("{name}: {e}"));
        let keys = to_hf_config(&a);
        let back = parse_hf_config(&Value::Object(keys.clone()), "k")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, a, "{name}");
        for k in keys.keys() {
            assert!(gpumem::hf::HF_KEYS.contains(&k.as_str()), "{name}: {k}");
        }
        let knob = gpumem::knobs::arch_from_config_json(&c.to_string())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(knob.len() <= gpumem::knobs::MAX_VALUE_LEN, "{name}: {knob}");
        let s = gpumem::knobs::scenario([("arch", knob.as_str())])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        match s.model {
            gpumem::scenario::Model::Arch { arch, .. } => assert_eq!(arch, a, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Inference loads a quantized checkpoint as stored: gpt-oss's MXFP4 experts (the published
/// safetensors of gpt-oss-20b total 13.76 GB, of gpt-oss-120b 65.3 GB), DeepSeek-V3's fp8
/// linears with fp32 block scales. Training and A100 inference (no fp8) use 16-bit weights.
#[test]
fn quantized_checkpoints_weigh_what_they_store() {
    let inference = |model: &str, gpu: &str| {
        let s = gpumem::Scenario::from_value(&serde_json::json!({
            "model": model, "mode": "inference", "seq": 1024, "gpu": gpu}))
        .unwrap();
        gpumem::estimate(&s).unwrap().weights_bytes as f64
    };
    let w20 = inference("gpt-oss-20b", "H100-80GB");
    assert!((w20 - 13_761_264_768.0).abs() < 1.0, "{w20}");
    let w120 = inference("gpt-oss-120b", "H100-80GB");
    assert!((65.2e9..65.3e9).contains(&w120), "{w120}");
    let ds = inference("deepseek-v3", "H100-80GB");
    assert!((672e9..690e9).contains(&ds), "{ds}");
    // fp8 needs compute capability 8.9: an A100 gets bf16.
    let ds_a100 = inference("deepseek-v3", "A100-80GB");
    assert_eq!(ds_a100, 671_026_404_352.0 * 2.0);
}

/// A config whose heads do not divide the tensor-parallel size is refused with the nearest
/// sizes that do.
#[test]
fn tp_refusals_offer_the_nearest_sizes_that_divide_the_heads() {
    let refuse = |model: &str, tp: u64| {
        gpumem::Scenario::from_value(&serde_json::json!({
            "model": model, "parallel": {"tp": tp, "dp": 1}}))
        .unwrap_err()
        .to_string()
    };
    let e = refuse("phi-4", 4);
    assert!(
        e.contains("key/value heads (10)") && e.contains("tp=2 and tp=5"),
        "{e}"
    );
    let e = refuse("falcon-7b", 2);
    assert!(e.contains("only tp=1"), "{e}");
    let e = refuse("qwen3-next-80b-a3b", 4);
    assert!(e.contains("(2)") && e.contains("tp=2"), "{e}");
}

/// The oracle's cut configs (tests/data/oracle/families, transformers' defaults among them:
/// OLMoE, Arcee, Hunyuan …) read back through the `arch` knob as the same architecture, as
/// the published ones do.
#[test]
fn every_oracle_config_round_trips_through_the_arch_knob() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/oracle/families");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let name = p.display().to_string();
        let text = std::fs::read_to_string(&p).unwrap();
        let c: Value = serde_json::from_str(&text).unwrap();
        let a = parse_hf_config(&c, "config").unwrap_or_else(|e| panic!("{name}: {e}"));
        let back = parse_hf_config(&Value::Object(to_hf_config(&a)), "k")
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(back, a, "{name}");
        let knob =
            gpumem::knobs::arch_from_config_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let s = gpumem::knobs::scenario([("arch", knob.as_str())])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        match s.model {
            gpumem::scenario::Model::Arch { arch, .. } => assert_eq!(arch, a, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        n += 1;
    }
    assert!(n >= 40, "{n} configs");
}

/// Layer lists and patterns that read as numbers ("1", "10", "0111") travel through the
/// `arch` knob as what they are: a 2-layer Llama 4 with NoPE every other layer, a SmolLM3
/// with NoPE first, a Qwen MoE with one dense layer, a Llama 4 with one MoE layer (the
/// knob had read them back as numbers and refused them).
#[test]
fn single_indices_and_digit_patterns_survive_the_arch_knob() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/oracle/families");
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };
    let mut cases = Vec::new();
    let mut c = read("smollm3-3b-L4.json");
    c["no_rope_layers"] = serde_json::json!([0, 1, 1, 1]);
    cases.push(c);
    let mut c = read("qwen1.5-moe-a2.7b-L2.json");
    c["mlp_only_layers"] = serde_json::json!([1]);
    cases.push(c);
    let mut c = read("llama4-scout-text-L2.json");
    c["moe_layers"] = serde_json::json!([1]);
    cases.push(c);
    cases.push(read("llama4-scout-text-L2.json"));
    for c in cases {
        let a = parse_hf_config(&c, "config").unwrap();
        let knob = gpumem::knobs::arch_from_config_json(&c.to_string()).unwrap();
        let s = gpumem::knobs::scenario([("arch", knob.as_str())]).unwrap();
        match s.model {
            gpumem::scenario::Model::Arch { arch, .. } => assert_eq!(arch, a, "{knob}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Qwen3.5 and 3.6 are published as their multimodal wrapper (`qwen3_5`, `qwen3_5_moe`: a
/// `text_config` and a `vision_config`), from which AutoModelForCausalLM builds the text
/// model alone (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM; transformers 5.17): the wrapper
/// reads as its `text_config`. The MoE model has experts in every layer and refuses none.
#[test]
fn qwen35_wrappers_read_as_their_text_model() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/oracle/families");
    for (file, wrapper) in [
        ("qwen3.5-defaults-L4.json", "qwen3_5"),
        ("qwen3.5-moe-defaults-L2.json", "qwen3_5_moe"),
    ] {
        let text: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let whole = serde_json::json!({
            "model_type": wrapper, "text_config": text, "tie_word_embeddings": false,
            "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 2048},
        });
        let a = parse_hf_config(&text, "config").unwrap();
        assert_eq!(parse_hf_config(&whole, "config").unwrap(), a, "{wrapper}");
        assert!(a.linear.is_some() && a.attn_gate);
        assert_eq!(a.moe.is_some(), wrapper == "qwen3_5_moe");
        let e = parse_hf_config(&serde_json::json!({"model_type": wrapper}), "config").unwrap_err();
        assert_eq!(e.field, "config.text_config", "{e}");
    }
    let dir = dir.join("qwen3.5-moe-defaults-L2.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(dir).unwrap()).unwrap();
    c["num_experts"] = 0.into();
    let e = parse_hf_config(&c, "config").unwrap_err();
    assert_eq!(e.field, "config.num_experts", "{e}");
}
