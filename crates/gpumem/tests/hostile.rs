//! Pasted config.json files are data: every published config in tests/data/models/configs with
//! random keys set to random values (huge, negative, fractional, of the wrong type, lists,
//! patterns) is either refused with an error naming a field, or accepted and estimated
//! (training and inference) without a panic and with finite figures.

mod common;
use proptest::prelude::*;
use serde_json::{json, Value};

fn configs() -> Vec<Value> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/models/configs");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v.iter()
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(2),
            json!(3),
            json!(7),
            json!(64),
            json!(4096),
            json!(1u64 << 24),
            json!(1u64 << 40),
            json!(u64::MAX),
            json!(-1),
            json!(0.5),
            json!(1.5),
            json!(1e300),
            json!(null),
            json!("null"),
            json!(true),
            json!(false),
            json!("x"),
            json!("sf"),
            json!("lllf"),
            json!("10"),
            json!("0 1 2"),
            json!("fp8"),
            json!([]),
            json!([1, 2]),
            json!(["full_attention"]),
            json!({}),
            json!({"quant_method": "fp8", "weight_block_size": [0, 0]}),
        ]),
        (0u64..100).prop_map(|n| json!(n)),
    ]
}

fn key() -> impl Strategy<Value = &'static str> {
    prop::sample::select(gpumem::hf::HF_KEYS.to_vec())
}

proptest! {
    #![proptest_config(common::cases(256))]

    #[test]
    fn mutated_configs_are_refused_or_estimated(
        i in 0usize..64,
        edits in prop::collection::vec((key(), value()), 1..4),
        train in any::<bool>(),
    ) {
        let all = configs();
        let mut c = all[i % all.len()].clone();
        for (k, v) in edits {
            c[k] = v;
        }
        match gpumem::hf::parse_hf_config(&c, "config") {
            Err(e) => prop_assert!(e.field.starts_with("config") && !e.message.is_empty()),
            Ok(a) => {
                let cfg = Value::Object(gpumem::hf::to_hf_config(&a));
                let s = json!({"model": {"hf_config": cfg}, "mode": if train {"train"} else {"inference"},
                    "batch": 1, "seq": 256, "new_tokens": 4});
                match gpumem::Scenario::from_value(&s) {
                    Err(e) => prop_assert!(!e.message.is_empty()),
                    Ok(s) => {
                        if let Ok(e) = gpumem::estimate(&s) {
                            prop_assert!(e.peak_bytes > 0);
                            prop_assert!((e.peak_bytes as f64) <= gpumem::estimate::MAX_BYTES);
                        }
                    }
                }
            }
        }
    }
}
