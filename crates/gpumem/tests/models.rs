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
        // A multimodal config's decoder alone (the vision tower is not modelled).
        let want = r["text_only"]["params"]
            .as_u64()
            .or(r["params"].as_u64())
            .unwrap();
        let got = a.params().total;
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
