//! Knobs: the flat `key=value` vocabulary of a scenario, shared by the book's directives, the
//! widgets' page state and permalinks. Each knob maps onto a field of the JSON scenario, and
//! the engine's error (which names the JSON field) is reported under the knob's name.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};
use crate::scenario::Scenario;

/// Every knob, in the order a permalink writes them.
pub const KNOBS: &[&str] = &[
    "model",
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
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero-stage",
    "framework",
    "offload",
    "grad-accum",
];

/// The model a scenario uses when no knob names one.
pub const DEFAULT_MODEL: &str = "llama3.1-8b";

/// A non-negative finite number (`capacity=80`, in GiB).
pub fn number(key: &str, v: &str) -> Result<f64> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
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
        .ok_or_else(|| Error::new(key, format!("'{}' is not a whole number", shown(v))))
}

/// Shorten what a user wrote before quoting it back in a message.
pub fn shown(s: &str) -> String {
    let t: String = s.chars().take(40).collect();
    if t.len() < s.len() {
        format!("{t}…")
    } else {
        t
    }
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

/// The JSON scenario, before the engine has looked at it.
fn build<'a>(knobs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Value> {
    let mut m = Map::new();
    let mut parallel = Map::new();
    for (k, v) in knobs {
        match k {
            "model" => {
                m.entry("model").or_insert_with(|| json!({ "preset": v }));
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
                m.insert("model".into(), json!({ "params": n.round() as u64 }));
            }
            "mode" | "precision" | "optimizer" | "recompute" | "attention" | "loss"
            | "finetune" | "gpu" => {
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
                    json!({ "capacity_bytes": (gib * 1073741824.0).round() }),
                );
            }
            "dp" | "tp" | "pp" | "cp" | "ep" => {
                parallel.insert(k.into(), count(k, v)?.into());
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
        .or_insert_with(|| json!({ "preset": DEFAULT_MODEL }));
    Ok(Value::Object(m))
}

/// The knob a JSON scenario field comes from.
fn knob_of(field: &str) -> String {
    let head = field.split('.').next().unwrap_or("");
    match head {
        "new_tokens" => "new-tokens".into(),
        "model" if field.contains("params") => "params".into(),
        "parallel" => match field.rsplit('.').next().unwrap_or("") {
            "zero" => "zero-stage".into(),
            "grad_accum" => "grad-accum".into(),
            k @ ("tp" | "pp" | "cp" | "ep" | "framework" | "offload") => k.into(),
            "virtual_stages" => "pp".into(),
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
        assert_eq!(v["parallel"]["zero"], 3);
        let s = scenario([("batch", "2")]).unwrap();
        assert_eq!(s.batch, 2);
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
        let s = scenario([("tp", "8"), ("pp", "4"), ("grad-accum", "8")]).unwrap();
        assert_eq!(
            (s.parallel.tp, s.parallel.pp, s.parallel.grad_accum),
            (8, 4, 8)
        );
    }
}
