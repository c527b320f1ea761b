//! Knobs: the flat `key=value` vocabulary of a scenario, shared by the book's directives, the
//! widgets' page state and permalinks. Each knob maps onto a field of the JSON scenario, and
//! the engine's error (which names the JSON field) is reported under the knob's name.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::scenario::Scenario;

/// Every knob, in the order a permalink writes them.
pub const KNOBS: &[&str] = &[
    "model",
    "arch",
    "params",
    "mode",
    "batch",
    "seq",
    "new-tokens",
    "precision",
    "optimizer",
    "recompute",
    "attention",
    "loss",
    "finetune",
    "gpu",
    "capacity",
    "allocator",
    "dp",
    "tp",
    "pp",
    "virtual-stages",
    "cp",
    "ep",
    "zero-stage",
    "framework",
    "offload",
    "grad-accum",
];

/// The components of a precision that a `precision=RECIPE,component=dtype,…` knob can set.
pub const PRECISION_PARTS: &[&str] = &[
    "weights",
    "master",
    "grads",
    "optimizer",
    "activations",
    "reduce",
];

/// The longest value a knob may have (an `arch` knob carries a whole architecture).
pub const MAX_VALUE_LEN: usize = 1000;

/// The model a scenario uses when no knob names one.
pub const DEFAULT_MODEL: &str = "llama3.1-8b";

/// What a knob left unset means, where that is one value whatever the other knobs say (the
/// widgets show it, and the waterfall names it in "recompute none → full"); `None` for the
/// knobs that have no such value (`arch`, `params`, `capacity`: the GPU's). Tested: setting
/// each to this value changes no scenario.
pub fn default_value(knob: &str) -> Option<&'static str> {
    Some(match knob {
        "model" => DEFAULT_MODEL,
        "mode" => "train",
        "batch" | "new-tokens" | "dp" | "tp" | "pp" | "virtual-stages" | "cp" | "ep"
        | "grad-accum" => "1",
        "seq" => "2048",
        "precision" => "bf16",
        "optimizer" => "adamw",
        "recompute" => "none",
        "attention" => "flash",
        "loss" => "standard",
        "finetune" => "full",
        "gpu" => "H100-80GB",
        "allocator" => "default",
        "zero-stage" => "0",
        "framework" => "fsdp",
        "offload" => "none",
        _ => return None,
    })
}

/// A non-negative finite number (`capacity=80`, in GiB).
pub fn number(key: &str, v: &str) -> Result<f64> {
    match crate::num::parse_f64(v) {
        Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(Error::new(
            key,
            format!("'{}' is not a non-negative number", shown(v)),
        )),
    }
}

/// A whole number, with `k`/`K` (×1024) and `M` (×1024²) accepted for readability: `seq=8k`.
pub fn count(key: &str, v: &str) -> Result<u64> {
    let (digits, mult) = match v.chars().last() {
        Some('k') | Some('K') => (&v[..v.len() - 1], 1024u64),
        Some('M') => (&v[..v.len() - 1], 1024 * 1024),
        _ => (v, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| Error::new(key, not_whole(v)))
}

/// Why `v` is not a whole number, quoting it: "'-3' is negative: give a whole number",
/// "'1.5' is not a whole number"; nothing (a number field holds nothing for "abc" too): "a
/// whole number is needed".
pub fn not_whole(v: &str) -> String {
    let why = match v.strip_prefix('-') {
        Some(d) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
            "is negative: give a whole number"
        }
        _ if v.is_empty() => return "a whole number is needed".into(),
        _ => "is not a whole number",
    };
    format!("'{}' {why}", shown(v))
}

/// Shorten what a user wrote before quoting it back in a message.
pub fn shown(s: &str) -> String {
    crate::hf::truncate(s, 40)
}

/// The JSON scenario that knobs describe, validated by the engine. Unknown keys are an error.
pub fn scenario_value<'a>(knobs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Value> {
    let v = build(knobs)?;
    parse(&v)?;
    Ok(v)
}

/// The scenario that knobs describe (parsed once: this runs on every slider step).
pub fn scenario<'a>(knobs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Scenario> {
    parse(&build(knobs)?)
}

/// The engine's parse, its errors reported under the knob's name.
fn parse(v: &Value) -> Result<Scenario> {
    Scenario::from_value(v).map_err(|e| Error::new(knob_of(&e.field), e.message))
}

/// A JSON object of `pairs`. By hand rather than with `json!`, whose hidden `unwrap`s would
/// carry serde_json's error texts and std's string escaping into the widgets' wasm.
fn object<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}

/// The JSON scenario, before the engine has looked at it.
fn build<'a>(knobs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Value> {
    let mut m = Map::new();
    let mut parallel = Map::new();
    for (k, v) in knobs {
        match k {
            "model" => {
                m.entry("model")
                    .or_insert_with(|| object([("preset", v.into())]));
            }
            // An architecture (config.json keys) wins over a preset.
            "arch" => {
                m.insert(
                    "model".into(),
                    object([
                        ("hf_config", pairs(k, v)?),
                        ("name", "custom (config.json)".into()),
                    ]),
                );
            }
            "precision" if v.contains('=') => {
                m.insert(k.into(), precision_object(v)?);
            }
            "finetune" if v.contains(',') => {
                m.insert(k.into(), finetune_object(v)?);
            }
            // A bare parameter count (model states only) wins over a preset.
            "params" => {
                let n = number(k, v)?;
                if !(1.0..=1e14).contains(&n) {
                    return Err(Error::new(
                        k,
                        format!("'{}' is not between 1 and 10^14", shown(v)),
                    ));
                }
                let arch_given = m.get("model").is_some_and(|x| x.get("hf_config").is_some());
                if !arch_given {
                    m.insert(
                        "model".into(),
                        object([("params", (n.round() as u64).into())]),
                    );
                }
            }
            "mode" | "precision" | "optimizer" | "recompute" | "attention" | "loss"
            | "finetune" | "gpu" | "allocator" => {
                m.insert(k.into(), Value::String(v.into()));
            }
            "batch" | "seq" => {
                m.insert(k.into(), count(k, v)?.into());
            }
            "new-tokens" => {
                m.insert("new_tokens".into(), count(k, v)?.into());
            }
            "capacity" => {
                let gib = number(k, v)?;
                m.insert(
                    "gpu".into(),
                    // Capped where it would leave f64's range (JSON has no infinity): the
                    // engine then says it is too large, not that it is missing.
                    object([(
                        "capacity_bytes",
                        (gib * 1073741824.0).round().min(1e300).into(),
                    )]),
                );
            }
            "dp" | "tp" | "pp" | "cp" | "ep" => {
                parallel.insert(k.into(), count(k, v)?.into());
            }
            // Model chunks per pipeline stage: more than one is Megatron's interleaved schedule.
            "virtual-stages" => {
                let v = count(k, v)?;
                if v > 1 {
                    parallel.insert("schedule".into(), "interleaved".into());
                    parallel.insert("virtual_stages".into(), v.into());
                }
            }
            "grad-accum" => {
                parallel.insert("grad_accum".into(), count(k, v)?.into());
            }
            "framework" | "offload" => {
                parallel.insert(k.into(), Value::String(v.into()));
            }
            "zero-stage" => {
                parallel.insert("zero".into(), count(k, v)?.into());
            }
            other => {
                return Err(Error::new(
                    shown(other),
                    format!("unknown knob (one of: {})", KNOBS.join(", ")),
                ))
            }
        }
    }
    if !parallel.is_empty() {
        m.insert("parallel".into(), Value::Object(parallel));
    }
    m.entry("model")
        .or_insert_with(|| object([("preset", DEFAULT_MODEL.into())]));
    Ok(Value::Object(m))
}

/// `key=value,key=value` as a JSON object: numbers and `true`/`false` as such, the rest as
/// strings. What the keys mean is for the engine to judge.
pub fn pairs(knob: &str, v: &str) -> Result<Value> {
    if v.len() > MAX_VALUE_LEN {
        return Err(Error::new(
            knob,
            format!("longer than {MAX_VALUE_LEN} characters"),
        ));
    }
    let mut o = Map::new();
    for part in v.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((key, val)) = part.split_once('=') else {
            return Err(Error::new(
                knob,
                format!("'{}' is not key=value", shown(part)),
            ));
        };
        let (key, val) = (key.trim(), val.trim());
        // A NoPE pattern and a list of layer indices stay strings, even when they read as a
        // number.
        let json = if crate::hf::TEXT_KEYS.contains(&key) {
            Value::String(val.to_string())
        } else if let Ok(n) = val.parse::<u64>() {
            n.into()
        } else if let Some(x) = crate::num::parse_f64(val).filter(|x| x.is_finite()) {
            x.into()
        } else if val == "true" || val == "false" {
            Value::Bool(val == "true")
        } else if val == "null" {
            Value::Null
        } else {
            Value::String(val.to_string())
        };
        o.insert(key.to_string(), json);
    }
    Ok(Value::Object(o))
}

/// The `arch` knob for a pasted `config.json`: the whole config parsed by the engine, then
/// written back as the keys that describe the architecture ([`crate::hf::to_hf_config`]:
/// layer patterns as strings, a multimodal wrapper's decoder only). Errors name the line and
/// column (bad JSON) or the config's key.
pub fn arch_from_config_json(text: &str) -> Result<String> {
    if text.len() > 1 << 20 {
        return Err(Error::new("config.json", "larger than 1 MiB"));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| {
        Error::new(
            format!("config.json:{}:{}", e.line(), e.column()),
            // serde_json's words whole (cut to a length, they ended mid-word).
            format!("not valid JSON ({})", crate::error::json_fault(&e)),
        )
    })?;
    if !v.is_object() {
        return Err(Error::new("config.json", "must be a JSON object"));
    }
    let arch = crate::hf::parse_hf_config(&v, "config.json")?;
    let kept = crate::hf::to_hf_config(&arch);
    let knob = to_pairs(&kept);
    // What the knob carries must read back as the same architecture.
    let back = crate::hf::parse_hf_config(&pairs("arch", &knob)?, "config.json")?;
    if back != arch {
        return Err(Error::new(
            "config.json",
            "this architecture cannot be carried by a link",
        ));
    }
    Ok(knob)
}

/// The inverse of [`pairs`] for flat JSON objects: scalars only, in the object's order.
pub fn to_pairs(v: &Map<String, Value>) -> String {
    v.iter()
        .filter_map(|(k, x)| {
            let s = match x {
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::String(s) if !s.contains([',', '=']) => s.clone(),
                Value::Null => "null".into(),
                _ => return None,
            };
            (!k.contains([',', '='])).then(|| format!("{k}={s}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `mixed-bf16,grads=fp32,master=none`: a recipe (optional, first) and per-component dtypes.
fn precision_object(v: &str) -> Result<Value> {
    let mut o = Map::new();
    for (i, part) in v.split(',').enumerate() {
        match part.split_once('=') {
            None if i == 0 => {
                o.insert("recipe".into(), Value::String(part.into()));
            }
            Some((c, d)) if PRECISION_PARTS.contains(&c) => {
                let d = if c == "master" && d == "none" {
                    Value::Null
                } else {
                    Value::String(d.into())
                };
                o.insert(c.into(), d);
            }
            _ => {
                return Err(Error::new(
                    "precision",
                    format!(
                        "'{}' is not component=dtype (components: {})",
                        shown(part),
                        PRECISION_PARTS.join(", ")
                    ),
                ))
            }
        }
    }
    Ok(Value::Object(o))
}

/// `lora,rank=64,targets=q_proj+v_proj` (or `targets=all-linear`): LoRA's or QLoRA's rank and
/// target modules as the scenario's `{"lora": {…}}` object, which the engine checks.
fn finetune_object(v: &str) -> Result<Value> {
    let mut parts = v.split(',');
    let method = parts.next().unwrap_or("").trim();
    if method != "lora" && method != "qlora" {
        return Err(Error::new(
            "finetune",
            format!(
                "'{}': a rank and targets go with lora or qlora (lora,rank=64,targets=all-linear)",
                shown(method)
            ),
        ));
    }
    let mut o = Map::new();
    for part in parts {
        match part.split_once('=') {
            Some(("rank", r)) => {
                o.insert("rank".into(), count("finetune", r)?.into());
            }
            Some(("targets", "all-linear")) => {
                o.insert("targets".into(), "all-linear".into());
            }
            Some(("targets", t)) => {
                let list = t.split('+').map(|x| Value::String(x.into())).collect();
                o.insert("targets".into(), Value::Array(list));
            }
            _ => {
                return Err(Error::new(
                    "finetune",
                    format!("'{}' is not rank=N or targets=a+b", shown(part)),
                ))
            }
        }
    }
    Ok(object([(method, Value::Object(o))]))
}

/// The knob a JSON scenario field comes from.
fn knob_of(field: &str) -> String {
    let head = field.split('.').next().unwrap_or("");
    match head {
        "new_tokens" => "new-tokens".into(),
        "model" if field.contains("params") => "params".into(),
        "model" if field.contains("hf_config") => field.replacen("model.hf_config", "arch", 1),
        "parallel" => match field.rsplit('.').next().unwrap_or("") {
            "zero" => "zero-stage".into(),
            "grad_accum" => "grad-accum".into(),
            k @ ("tp" | "pp" | "cp" | "ep" | "framework" | "offload") => k.into(),
            "virtual_stages" | "schedule" => "virtual-stages".into(),
            _ => "dp".into(),
        },
        "gpu" if field.contains("capacity") => "capacity".into(),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knob_set_to_its_default_changes_nothing() {
        let bases: &[&[(&str, &str)]] = &[
            &[],
            &[("model", "llama3.2-1b"), ("dp", "8"), ("zero-stage", "3")],
            &[("mode", "inference"), ("batch", "4")],
            &[
                ("framework", "megatron"),
                ("tp", "2"),
                ("pp", "2"),
                ("gpu", "A100-80GB"),
            ],
        ];
        let mut named = 0;
        for base in bases {
            let plain = scenario(base.iter().copied()).unwrap();
            for &k in KNOBS {
                let Some(v) = default_value(k) else {
                    assert!(["arch", "params", "capacity"].contains(&k), "{k}");
                    continue;
                };
                if base.iter().any(|(b, _)| *b == k) {
                    continue;
                }
                let with = scenario(base.iter().copied().chain([(k, v)])).unwrap();
                assert_eq!(with, plain, "{k}={v} on {base:?}");
                named += 1;
            }
        }
        assert!(named > 60);
    }

    #[test]
    fn lora_rank_and_targets_travel_in_the_finetune_knob() {
        let s = scenario([
            ("model", "llama3.1-8b"),
            ("finetune", "qlora,rank=64,targets=q_proj+k_proj+v_proj"),
        ])
        .unwrap();
        let crate::scenario::Finetune::Lora(l) = &s.finetune else {
            panic!("{:?}", s.finetune)
        };
        assert_eq!((l.rank, l.quantized, l.targets.len()), (64, true, 3));
        let s = scenario([("finetune", "lora,targets=all-linear")]).unwrap();
        let crate::scenario::Finetune::Lora(l) = &s.finetune else {
            panic!()
        };
        assert_eq!(
            (l.rank, l.targets.len()),
            (16, crate::scenario::LORA_TARGETS.len())
        );
        for bad in [
            "full,rank=8",
            "lora,rank=0",
            "lora,targets=nope",
            "lora,alpha=2",
        ] {
            let e = scenario([("finetune", bad)]).unwrap_err();
            assert!(e.field.starts_with("finetune"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn knobs_map_onto_the_scenario() {
        let v = scenario_value([
            ("model", "llama3.2-1b"),
            ("seq", "8k"),
            ("capacity", "80"),
            ("dp", "8"),
            ("zero-stage", "3"),
        ])
        .unwrap();
        assert_eq!(v["seq"], 8192);
        assert_eq!(v["gpu"]["capacity_bytes"], 85899345920.0);
        // A capacity beyond f64's range in bytes is too large, not missing.
        let e = scenario([("capacity", "1e300")]).unwrap_err();
        assert!(
            e.field == "capacity" && e.message.contains("too large"),
            "{e}"
        );
        assert_eq!(v["parallel"]["zero"], 3);
        let s = scenario([("batch", "2")]).unwrap();
        assert_eq!(s.batch, 2);
    }

    #[test]
    fn an_arch_knob_carries_a_config_and_a_precision_knob_its_components() {
        let arch = "model_type=llama,hidden_size=2048,intermediate_size=8192,num_hidden_layers=16,\
                    num_attention_heads=32,num_key_value_heads=8,vocab_size=128256,\
                    tie_word_embeddings=true,head_dim=64";
        let s = scenario([("arch", arch), ("model", "gpt2"), ("params", "7e9")]).unwrap();
        let preset = scenario([("model", "llama3.2-1b")]).unwrap();
        match (&s.model, &preset.model) {
            (
                crate::scenario::Model::Arch { arch: a, .. },
                crate::scenario::Model::Arch { arch: b, .. },
            ) => assert_eq!(a.params(), b.params()),
            other => panic!("{other:?}"),
        }
        let v = pairs("arch", arch).unwrap();
        assert_eq!(pairs("arch", &to_pairs(v.as_object().unwrap())).unwrap(), v);
        let e = scenario_value([("arch", "model_type=llama,hidden_size=64")]).unwrap_err();
        assert_eq!(e.field, "arch.num_attention_heads");
        let e = scenario_value([("arch", "<script>")]).unwrap_err();
        assert_eq!(e.field, "arch");
        assert!(scenario_value([("arch", "a=1,".repeat(400).as_str())]).is_err());

        let cfg = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "tie_word_embeddings": true, "head_dim": 64, "rope_scaling": {"factor": 32.0},
            "bos_token_id": 128000, "torch_dtype": "bfloat16"}"#;
        let knob = arch_from_config_json(cfg).unwrap();
        assert!(!knob.contains("rope") && !knob.contains("bos"), "{knob}");
        // Only what differs from the family's defaults: head_dim is hidden / heads here.
        assert!(!knob.contains("head_dim"), "{knob}");
        let from_cfg = crate::hf::parse_hf_config(&pairs("arch", &knob).unwrap(), "c").unwrap();
        assert_eq!(from_cfg, crate::hf::parse_hf_config(&v, "c").unwrap());
        let e = arch_from_config_json("{\n  \"model_type\": llama}").unwrap_err();
        assert!(e.field.starts_with("config.json:2:"), "{e}");
        // serde_json's words whole, never cut mid-word.
        let e = arch_from_config_json("{\"model_type\": ").unwrap_err();
        assert_eq!(
            e.message,
            "not valid JSON (EOF while parsing a value at line 1 column 15)"
        );
        let e = arch_from_config_json("[1]").unwrap_err();
        assert_eq!(e.field, "config.json");
        let e =
            arch_from_config_json(r#"{"model_type": "<img src=x onerror=alert(1)>"}"#).unwrap_err();
        assert_eq!(e.field, "config.json.model_type");

        let p = scenario([("precision", "mixed-bf16,grads=fp32,master=none")]).unwrap();
        assert_eq!(p.precision.grads, crate::dtype::DType::F32);
        assert_eq!(p.precision.master, None);
        assert_eq!(p.precision.optimizer, crate::dtype::DType::F32);
        let e = scenario_value([("precision", "bf16,colour=red")]).unwrap_err();
        assert_eq!(e.field, "precision");
        let e = scenario_value([("precision", "bf16,grads=int4")]).unwrap_err();
        assert_eq!(e.field, "precision");
    }

    #[test]
    fn errors_name_the_knob() {
        let e = scenario_value([("zero-stage", "5")]).unwrap_err();
        assert_eq!(e.field, "zero-stage");
        let e = scenario_value([("new-tokens", "x")]).unwrap_err();
        assert_eq!(e.field, "new-tokens");
        let e = scenario_value([("model", "no-such")]).unwrap_err();
        assert_eq!(e.field, "model");
        let e = scenario_value([("colour", "red")]).unwrap_err();
        assert_eq!(e.field, "colour");
        let e = scenario_value([("batch", "0")]).unwrap_err();
        assert_eq!(e.field, "batch");
        let e = scenario_value([("tp", "3")]).unwrap_err();
        assert_eq!(e.field, "tp");
        let e = scenario_value([("framework", "jax")]).unwrap_err();
        assert_eq!(e.field, "framework");
        let e = scenario_value([("pp", "4"), ("grad-accum", "8"), ("virtual-stages", "3")])
            .unwrap_err();
        assert_eq!(e.field, "virtual-stages");
        let s = scenario([("pp", "4"), ("grad-accum", "8"), ("virtual-stages", "2")]).unwrap();
        assert_eq!(
            s.parallel.schedule,
            crate::scenario::Schedule::Interleaved(2)
        );
        let s = scenario([("tp", "8"), ("pp", "4"), ("grad-accum", "8")]).unwrap();
        assert_eq!(
            (s.parallel.tp, s.parallel.pp, s.parallel.grad_accum),
            (8, 4, 8)
        );
    }
}
