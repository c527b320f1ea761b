//! The quantities prose can cite (`{{#gpumem value activations}}`) and the formulas that
//! produce them, each substituted with the current scenario's numbers.

use gpumem::num::{fixed, short};
use gpumem::scenario::{Finetune, Mode, Model};
use gpumem::{Estimate, Scenario};

use crate::format::{gib, params};

/// A quantity of an estimate, in its unit (bytes, or a count for parameters).
pub fn value(e: &Estimate, q: &str) -> Option<f64> {
    let c = |k: &str| e.components.get(k).copied().unwrap_or(0) as f64;
    Some(match q {
        "peak" => e.peak_bytes as f64,
        "weights" => e.weights_bytes as f64,
        "master_weights" => e.master_weights_bytes as f64,
        "gradients" => e.gradients_bytes as f64,
        "optimizer_states" => e.optimizer_states_bytes as f64,
        "activations" => c("activations"),
        "logits" => c("logits"),
        "temporaries" => c("temporaries") + c("weight_copies"),
        "kv_cache" => e.kv_cache_bytes as f64,
        "model_states" => e.model_states_bytes as f64,
        "params" => e.params as f64,
        "trainable_params" => e.trainable_params as f64,
        "headroom" => e.headroom_bytes as f64,
        "capacity" => e.capacity_bytes as f64,
        "device" => e.device_bytes as f64,
        "cuda_context" => e.cuda_context_bytes as f64,
        "reserve" => e.allocator_reserve_bytes as f64,
        _ => return None,
    })
}

/// A quantity as prose shows it. `format`: gib (default), gb, bytes, percent (of the
/// device's capacity), count, phase (the moment the peak is reached, in words).
pub fn show(e: &Estimate, q: &str, format: &str) -> String {
    if format == "phase" {
        return e.peak_phase.clone();
    }
    let Some(v) = value(e, q) else {
        return "?".into();
    };
    let counted = matches!(q, "params" | "trainable_params");
    match format {
        "bytes" => format!("{} B", fixed(v, 0)),
        "gb" => format!("{} GB", fixed(v / 1e9, 1)),
        "percent" => format!("{} %", fixed(100.0 * v / e.capacity_bytes.max(1) as f64, 0)),
        "count" => fixed(v, 0),
        _ if counted => params(v as u64),
        _ => gib(v),
    }
}

/// Quantities with a closed-form formula (the others come out of the op-by-op replay).
pub const FORMULAS: &[&str] = &[
    "weights",
    "master_weights",
    "gradients",
    "optimizer_states",
    "model_states",
    "kv_cache",
    "peak",
    "device",
    "headroom",
    "params",
];

/// The formula of a quantity, in TeX.
pub fn tex(q: &str) -> Option<&'static str> {
    Some(match q {
        "weights" => r"W = \frac{\Psi \cdot b_w}{N_w}",
        "master_weights" => r"M = \frac{\Psi \cdot b_m}{N_{os}}",
        "gradients" => r"G = \frac{\Psi_{\text{trainable}} \cdot b_g}{N_g}",
        "optimizer_states" => r"O = \frac{\Psi_{\text{trainable}} \cdot k_{\text{opt}}}{N_{os}}",
        "model_states" => r"W + M + G + O",
        "kv_cache" => r"KV = L \cdot b \cdot (s + n - 1) \cdot 2\, n_{kv} d_h \cdot b_{kv}",
        "peak" => r"\text{peak} = \sum_{c\,\in\,\text{alive at the peak}} \text{bytes}_c",
        "device" => r"\text{device} = \text{peak} + \text{reserve} + \text{CUDA context}",
        "headroom" => r"\text{headroom} = \text{capacity} - \text{device}",
        "params" => {
            r"\Psi = V h\,(1 + [\text{untied}]) + L \cdot \Psi_{\text{layer}} + \Psi_{\text{norm}}"
        }
        _ => return None,
    })
}

/// The formula with this scenario's numbers, ending in the engine's value. `None` when the
/// scenario is outside what the closed form covers (the caller then shows the value alone).
pub fn substitute(s: &Scenario, e: &Estimate, q: &str) -> Option<String> {
    let simple = matches!(s.finetune, Finetune::Full)
        && !s.parallel.model_parallel()
        && s.precision.weights.is_float_compute();
    let train = s.mode == Mode::Train;
    let psi = e.params as f64;
    let n_os = if s.parallel.zero >= 1 {
        s.parallel.shard_ranks()
    } else {
        1
    };
    let n_g = if s.parallel.zero >= 2 {
        s.parallel.shard_ranks()
    } else {
        1
    };
    let n_w = if s.parallel.zero >= 3 {
        s.parallel.shard_ranks()
    } else {
        1
    };
    let over = |n: u64| {
        if n > 1 {
            format!(" / {n}")
        } else {
            String::new()
        }
    };
    let deepspeed = s.parallel.framework == gpumem::scenario::Framework::DeepSpeed;
    let p = &s.precision;
    let text = match q {
        "weights" if simple && !(deepspeed && n_w > 1) => format!(
            "W = {} × {} B ({}){} = {}",
            params(e.params),
            short(p.weights.bytes()),
            p.weights,
            over(n_w),
            gib(e.weights_bytes as f64)
        ),
        "master_weights" if simple && train => match p.master {
            None => "M = 0 (no separate master copy in this recipe)".to_string(),
            Some(m) => format!(
                "M = {} × {} B ({m}){} = {}",
                params(e.params),
                short(m.bytes()),
                over(n_os),
                gib(e.master_weights_bytes as f64)
            ),
        },
        "gradients" if simple && train && !deepspeed => format!(
            "G = {} × {} B ({}){} = {}",
            params(e.trainable_params),
            short(p.grads.bytes()),
            p.grads,
            over(n_g),
            gib(e.gradients_bytes as f64)
        ),
        "optimizer_states" if simple && train => {
            let k = e.optimizer_states_bytes as f64 * n_os as f64 / psi.max(1.0);
            format!(
                "O = {} × {} B ({}){} = {}",
                params(e.trainable_params),
                fixed(k, 2),
                s.optimizer.name(),
                over(n_os),
                gib(e.optimizer_states_bytes as f64)
            )
        }
        "model_states" => format!(
            "{} + {} + {} + {} = {}",
            gib(e.weights_bytes as f64),
            gib(e.master_weights_bytes as f64),
            gib(e.gradients_bytes as f64),
            gib(e.optimizer_states_bytes as f64),
            gib(e.model_states_bytes as f64)
        ),
        "kv_cache" if !train => {
            let Model::Arch { arch: a, .. } = &s.model else {
                return None;
            };
            let n = (s.seq + s.new_tokens.max(1) - 1) as f64;
            // Layers by how many tokens they keep: every one, a window − 1, or a fixed state.
            let mut terms: Vec<(u64, String)> = Vec::new();
            for l in 0..a.layers {
                let t = a.attn_type(l);
                let what = match t {
                    gpumem::arch::AttnType::Linear => "state".to_string(),
                    _ => format!("{}", a.cached_tokens(t, n)),
                };
                match terms.iter_mut().find(|(_, w)| *w == what) {
                    Some((c, _)) => *c += 1,
                    None => terms.push((1, what)),
                }
            }
            let parts: Vec<String> = terms
                .iter()
                .map(|(c, what)| match what.as_str() {
                    "state" => format!("{c} × state"),
                    tok => format!(
                        "{c} × {} × {tok} × {} × {} B",
                        s.batch,
                        a.cache_elems_per_token_layer(),
                        short(p.compute().bytes())
                    ),
                })
                .collect();
            format!(
                "KV = {} = {}",
                parts.join(" + "),
                gib(e.kv_cache_bytes as f64)
            )
        }
        "peak" => {
            let parts: Vec<String> = e
                .components
                .iter()
                .filter(|(_, v)| **v > 0)
                .map(|(k, v)| format!("{} ({})", gib(*v as f64), k.replace('_', " ")))
                .collect();
            format!("{} = {}", parts.join(" + "), gib(e.peak_bytes as f64))
        }
        "device" => format!(
            "{} + {} + {} = {}",
            gib(e.peak_bytes as f64),
            gib(e.allocator_reserve_bytes as f64),
            gib(e.cuda_context_bytes as f64),
            gib(e.device_bytes as f64)
        ),
        "headroom" => format!(
            "{} − {} = {}",
            gib(e.capacity_bytes as f64),
            gib(e.device_bytes as f64),
            gib(e.headroom_bytes as f64)
        ),
        "params" => {
            let Model::Arch { arch: a, .. } = &s.model else {
                return None;
            };
            let pc = a.params();
            format!(
                "{} (embedding) + {} (output layer) + {} ({} layers) + {} (norms, positions) = {} = {}",
                pc.embedding,
                pc.lm_head,
                pc.layers,
                a.layers,
                pc.final_norm + pc.positions,
                pc.total,
                params(pc.total)
            )
        }
        _ => return None,
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Knobs;

    fn est(k: &[(&str, &str)]) -> (Scenario, Estimate) {
        let k = Knobs(
            k.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        );
        let s = k.scenario().unwrap();
        let e = gpumem::estimate(&s).unwrap();
        (s, e)
    }

    /// Each substitution's terms multiply out to the engine's figure.
    #[test]
    fn substitutions_end_in_the_engine_value() {
        let (s, e) = est(&[("model", "llama3.1-8b"), ("precision", "mixed-bf16")]);
        let w = substitute(&s, &e, "weights").unwrap();
        assert!(w.starts_with("W = 8.0B × 2 B (bf16) = "), "{w}");
        assert!(w.ends_with(&gib(e.weights_bytes as f64)));
        assert!((e.params as f64 * 2.0 - e.weights_bytes as f64).abs() < 1.0);
        let o = substitute(&s, &e, "optimizer_states").unwrap();
        assert!(
            o.contains("× 8.00 B (adamw)") || o.contains("× 8.00 B (adam)"),
            "{o}"
        );
        let (s, e) = est(&[("model", "llama3.1-8b"), ("dp", "8"), ("zero-stage", "3")]);
        let w = substitute(&s, &e, "weights").unwrap();
        assert!(w.contains("/ 8 = "), "{w}");
        let (s, e) = est(&[
            ("model", "llama3.1-8b"),
            ("mode", "inference"),
            ("seq", "1024"),
        ]);
        let kv = substitute(&s, &e, "kv_cache").unwrap();
        // 32 layers × 1 × 1024 positions × 2·8·128 × 2 B = 128 MiB.
        assert_eq!(e.kv_cache_bytes, 32 * 1024 * 2048 * 2);
        assert!(kv.starts_with("KV = 32 × 1 × 1024 × 2048 × 2 B"), "{kv}");
        for q in FORMULAS {
            assert!(tex(q).is_some(), "{q}");
        }
    }
}
