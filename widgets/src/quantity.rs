//! The quantities prose can cite (`{{#gpumem value activations}}`) and the formulas that
//! produce them, each substituted with the current scenario's numbers. One notation for the
//! byte sums throughout: `M_x` is the memory of x, `b_x` bytes per value, `Ψ` parameters.

use gpumem::dtype::DType;
use gpumem::num::{fixed, short};
use gpumem::scenario::{Finetune, Mode, Model};
use gpumem::{Estimate, Scenario};

use crate::format::{count, gib, params, Sum};
use crate::parts;

/// A quantity of an estimate, in its unit (bytes, or a count for parameters).
pub fn value(e: &Estimate, q: &str) -> Option<f64> {
    let c = |k: &str| e.components.get(k).copied().unwrap_or(0) as f64;
    Some(match q {
        "peak" => e.peak_bytes as f64,
        "weights" | "quantized_weights" => e.weights_bytes as f64,
        "master_weights" => e.master_weights_bytes as f64,
        "gradients" => e.gradients_bytes as f64,
        "optimizer_states" => e.optimizer_states_bytes as f64,
        "activations" => c("activations"),
        "logits" => c("logits"),
        "temporaries" => c("temporaries"),
        "weight_copies" => c("weight_copies"),
        "kv_cache" => e.kv_cache_bytes as f64,
        "model_states" => e.model_states_bytes as f64,
        "params" => e.params as f64,
        "trainable_params" => e.trainable_params as f64,
        "headroom" => e.headroom_bytes as f64,
        "capacity" => e.capacity_bytes as f64,
        "device" => e.device_bytes as f64,
        "cuda_context" => e.cuda_context_bytes as f64,
        "reserve" => e.allocator_reserve_bytes as f64,
        "reserved" => e.peak_reserved_bytes as f64,
        "reserved_unallocated" => e.reserved_unallocated_bytes as f64,
        "largest_free_block" => e.largest_free_block_bytes as f64,
        "segments" => e.segments as f64,
        "cublas_workspace" => e.cublas_workspace_bytes as f64,
        "nvidia_smi" => e.device_bytes as f64,
        _ => return None,
    })
}

/// A quantity as prose shows it. `format`: gib (default), gb, bytes, percent (of the
/// device's capacity), count (thousands separated), scaled (8.03B), per-param (bytes per
/// parameter of the model), phase (the moment the peak is reached, in words).
pub fn show(e: &Estimate, q: &str, format: &str) -> String {
    if format == "phase" {
        return e.peak_phase.clone();
    }
    let Some(v) = value(e, q) else {
        return "?".into();
    };
    let counted = matches!(q, "params" | "trainable_params");
    if q == "segments" {
        return count(v.max(0.0) as u64);
    }
    match format {
        "bytes" => format!("{} B", count(v.max(0.0) as u64)),
        "gb" => format!("{} GB", fixed(v / 1e9, 1)),
        "percent" => format!("{} %", fixed(100.0 * v / e.capacity_bytes.max(1) as f64, 0)),
        "count" => count(v.max(0.0) as u64),
        "scaled" => params(v.max(0.0) as u64),
        "per-param" => short((v / e.params.max(1) as f64 * 100.0).round() / 100.0),
        _ if counted => params(v as u64),
        // As the verdicts and the formula have it: the capacity less the device total, each
        // as shown.
        _ if q == "headroom" => {
            let (cap, dev) = (e.capacity_bytes as f64, e.device_bytes as f64);
            let sum = Sum::of(cap.max(dev));
            sum.show(sum.units(cap) - sum.units(dev))
        }
        _ => gib(v),
    }
}

/// Quantities with a closed-form formula (the others come out of the op-by-op replay).
pub const FORMULAS: &[&str] = &[
    "weights",
    "quantized_weights",
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
        "weights" => r"M_\text{weights} = \frac{\Psi \, b_w}{N_w}",
        "quantized_weights" => {
            r"\begin{gathered} M_\text{weights} = \Psi_\text{lin} \, b_\text{nf4} + (\Psi - \Psi_\text{lin}) \, b_c + 4 \, \Psi_\text{LoRA}, \\ b_\text{nf4} = \tfrac{1}{2} + \tfrac{1}{64} + \tfrac{4}{64 \cdot 256} \end{gathered}"
        }
        "master_weights" => r"M_\text{master} = \frac{\Psi \, b_m}{N_\text{os}}",
        "gradients" => r"M_\text{grads} = \frac{\Psi_\text{trainable} \, b_g}{N_g}",
        "optimizer_states" => {
            r"M_\text{opt} = \frac{\Psi_\text{trainable} \, k_\text{opt}}{N_\text{os}}"
        }
        "model_states" => {
            r"M_\text{states} = M_\text{weights} + M_\text{master} + M_\text{grads} + M_\text{opt}"
        }
        "kv_cache" => {
            r"M_\text{KV} = L \cdot b \, (s + n - 1) \cdot 2 \, n_{kv} \, d_h \cdot b_{kv}"
        }
        "peak" => r"M_\text{peak} = \sum_{c \,\in\, \text{alive at the peak}} M_c",
        "device" => r"M_\text{device} = M_\text{peak} + M_\text{CUDA}",
        "headroom" => r"\text{headroom} = \text{capacity} - M_\text{device}",
        "params" => {
            r"\Psi = V h\,(1 + [\text{untied}]) + L \cdot \Psi_{\text{layer}} + \Psi_{\text{norm}}"
        }
        _ => return None,
    })
}

/// How a model's weights split when its linear layers are quantised (QLoRA's NF4, or int8,
/// int4 weights): the quantised linear layers, the rest kept in the compute dtype
/// (embeddings, output layer, norms) and the fp32 adapters, in parameters. Derived from the
/// engine's figure, which it reproduces exactly.
pub struct Quantized {
    pub dtype: DType,
    pub compute: DType,
    pub linear: f64,
    pub rest: f64,
    pub adapters: f64,
}

pub fn quantized(s: &Scenario, e: &Estimate) -> Option<Quantized> {
    let (dtype, adapters) = match &s.finetune {
        Finetune::Lora(l) if l.quantized => (DType::Nf4, e.trainable_params as f64),
        Finetune::Lora(_) if !s.precision.weights.is_float_compute() => {
            (s.precision.weights, e.trainable_params as f64)
        }
        Finetune::Full if !s.precision.weights.is_float_compute() => (s.precision.weights, 0.0),
        _ => return None,
    };
    if s.parallel.model_parallel() || s.parallel.zero >= 3 {
        return None;
    }
    let compute = s.precision.compute();
    let (q, c) = (dtype.bytes(), compute.bytes());
    let total = e.params as f64;
    // weights = linear·q + (total − linear)·c + adapters·4
    let linear = ((e.weights_bytes as f64 - total * c - adapters * 4.0) / (q - c)).round();
    (linear > 0.0 && linear <= total).then_some(Quantized {
        dtype,
        compute,
        linear,
        rest: total - linear,
        adapters,
    })
}

fn quantized_text(e: &Estimate, z: &Quantized) -> String {
    let mut terms = vec![
        (
            format!(
                "{} × {} B ({}, linear layers)",
                params(z.linear as u64),
                fixed(z.dtype.bytes(), 4),
                z.dtype
            ),
            z.linear * z.dtype.bytes(),
        ),
        (
            format!(
                "{} × {} B ({}: embeddings, output layer, norms)",
                params(z.rest as u64),
                short(z.compute.bytes()),
                z.compute
            ),
            z.rest * z.compute.bytes(),
        ),
    ];
    if z.adapters > 0.0 {
        terms.push((
            format!("{} × 4 B (fp32 adapters)", params(z.adapters as u64)),
            z.adapters * 4.0,
        ));
    }
    let total = e.weights_bytes as f64;
    let bytes: Vec<f64> = terms.iter().map(|t| t.1).collect();
    let sum = Sum::for_parts(&bytes, total);
    format!(
        "M_weights = {} = {} {} {}",
        terms
            .iter()
            .map(|t| t.0.as_str())
            .collect::<Vec<_>>()
            .join(" + "),
        sum.texts(&bytes).join(" + "),
        sum.eq(),
        sum.gib(total)
    )
}

/// The formula with this scenario's numbers, ending in the engine's value. `None` when the
/// scenario is outside what the closed form covers (the caller then shows the value alone).
/// Where terms are summed, they are shown rounded so that they add up to the total shown.
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
        "weights" | "quantized_weights" if quantized(s, e).is_some() => {
            quantized_text(e, &quantized(s, e)?)
        }
        "weights" | "quantized_weights"
            if matches!(s.finetune, Finetune::Lora(_))
                && p.weights.is_float_compute()
                && !s.parallel.model_parallel()
                && n_w == 1 =>
        {
            let frozen = psi * p.weights.bytes();
            let adapters = e.trainable_params as f64 * 4.0;
            let total = e.weights_bytes as f64;
            let sum = Sum::for_parts(&[frozen, adapters], total);
            let t = sum.texts(&[frozen, adapters]);
            format!(
                "M_weights = {} × {} B ({}, frozen) + {} × 4 B (fp32 adapters) = {} + {} {} {}",
                params(e.params),
                short(p.weights.bytes()),
                p.weights,
                params(e.trainable_params),
                t[0],
                t[1],
                sum.eq(),
                sum.gib(total)
            )
        }
        "weights" | "quantized_weights" if simple && !(deepspeed && n_w > 1) => format!(
            "M_weights = {} × {} B ({}){} = {}",
            params(e.params),
            short(p.weights.bytes()),
            p.weights,
            over(n_w),
            gib(e.weights_bytes as f64)
        ),
        "master_weights" if simple && train => match p.master {
            None => "M_master = 0 (no separate master copy in this recipe)".to_string(),
            Some(m) => format!(
                "M_master = {} × {} B ({m}){} = {}",
                params(e.params),
                short(m.bytes()),
                over(n_os),
                gib(e.master_weights_bytes as f64)
            ),
        },
        "gradients" if simple && train && !deepspeed => format!(
            "M_grads = {} × {} B ({}){} = {}",
            params(e.trainable_params),
            short(p.grads.bytes()),
            p.grads,
            over(n_g),
            gib(e.gradients_bytes as f64)
        ),
        "optimizer_states" if simple && train => {
            let k = e.optimizer_states_bytes as f64 * n_os as f64 / psi.max(1.0);
            format!(
                "M_opt = {} × {} B ({}){} = {}",
                params(e.trainable_params),
                short((k * 100.0).round() / 100.0),
                s.optimizer.name(),
                over(n_os),
                gib(e.optimizer_states_bytes as f64)
            )
        }
        "model_states" => {
            let total = e.model_states_bytes as f64;
            let states = [
                e.weights_bytes as f64,
                e.master_weights_bytes as f64,
                e.gradients_bytes as f64,
                e.optimizer_states_bytes as f64,
            ];
            let sum = Sum::for_parts(&states, total);
            let t = sum.texts(&states);
            format!(
                "M_states = {} + {} + {} + {} {} {}",
                t[0],
                t[1],
                t[2],
                t[3],
                sum.eq(),
                sum.gib(total)
            )
        }
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
                    _ => count(a.cached_tokens(t, n) as u64),
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
                        count(a.cache_elems_per_token_layer()),
                        short(p.compute().bytes())
                    ),
                })
                .collect();
            format!(
                "M_KV = {} = {}",
                parts.join(" + "),
                gib(e.kv_cache_bytes as f64)
            )
        }
        "peak" => {
            let total = e.peak_bytes as f64;
            let slices: Vec<_> = parts::slices(&e.components, 0.0)
                .into_iter()
                .filter(|x| x.bytes > 0.0)
                .collect();
            let bytes: Vec<f64> = slices.iter().map(|x| x.bytes).collect();
            let sum = Sum::for_parts(&bytes, total);
            let t = sum.texts(&bytes);
            let terms: Vec<String> = slices
                .iter()
                .zip(t)
                .map(|(x, t)| format!("{t} ({})", x.label()))
                .collect();
            format!(
                "M_peak = {} {} {}",
                terms.join(" + "),
                sum.eq(),
                sum.gib(total)
            )
        }
        "device" => {
            let total = e.device_bytes as f64;
            // The widgets do not replay the caching allocator: no cache term (chapter 6).
            let parts = [
                e.peak_bytes as f64,
                e.cuda_context_bytes as f64,
                e.managed_bytes as f64,
            ];
            let sum = Sum::for_parts(&parts, total);
            let t = sum.texts(&parts);
            let paged = if e.managed_bytes > 0 {
                format!(" + {} (paged optimizer states)", t[2])
            } else {
                String::new()
            };
            format!(
                "M_device = {} + {}{paged} {} {}",
                t[0],
                t[1],
                sum.eq(),
                sum.gib(total)
            )
        }
        "headroom" => {
            let (cap, dev) = (e.capacity_bytes as f64, e.device_bytes as f64);
            let sum = Sum::of(cap.max(dev));
            format!(
                "headroom = {} − {} = {}",
                sum.gib(cap),
                sum.gib(dev),
                sum.show(sum.units(cap) - sum.units(dev))
            )
        }
        "params" => {
            let Model::Arch { arch: a, .. } = &s.model else {
                return None;
            };
            let pc = a.params();
            format!(
                "Ψ = {} (embedding) + {} (output layer) + {} ({} layers) + {} (norms, positions) = {} = {}",
                count(pc.embedding),
                count(pc.lm_head),
                count(pc.layers),
                a.layers,
                count(pc.final_norm + pc.positions),
                count(pc.total),
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

    /// A formula line's last terms, its total and whether they are joined by "=" (not "≈").
    fn ends(line: &str) -> (&str, &str, bool) {
        match (line.rsplit_once(" = "), line.rsplit_once(" ≈ ")) {
            (_, Some((l, t))) => (l.rsplit(" = ").next().unwrap(), t, false),
            (Some((l, t)), None) => (l.rsplit(" = ").next().unwrap(), t, true),
            (None, None) => panic!("no total: {line}"),
        }
    }

    /// `text` ("14.96 GiB") is `bytes` correctly rounded at the decimals it shows.
    fn rounds_to(text: &str, bytes: f64) -> bool {
        let t = text.trim_end_matches(" GiB").replace(',', "");
        let d = t.split_once('.').map_or(0, |(_, f)| f.len());
        let x: f64 = t.replace(crate::format::MINUS, "-").parse().unwrap();
        (x - bytes / 1073741824.0).abs() <= 0.5 * 10f64.powi(-(d as i32)) + 1e-9
    }

    /// Every figure is its quantity correctly rounded at the decimals it shows (M_peak as a
    /// term of M_device as on its own line: a line whose parts, rounded at the total's
    /// precision, would not add up shows a decimal or two more, never a part nudged), the
    /// headroom in prose as in the formula (and the verdicts); and the terms of M_device as
    /// shown add up to it as shown. Over a grid where rounding the parts and the totals
    /// apart disagrees somewhere.
    #[test]
    fn a_quantity_reads_the_same_in_every_line() {
        let num = |t: &str| -> f64 {
            t.trim_end_matches(" GiB")
                .replace(',', "")
                .replace(crate::format::MINUS, "-")
                .parse()
                .unwrap()
        };
        for model in ["deepseek-v3", "qwen2.5-72b", "llama3.1-70b", "llama3.1-8b"] {
            for gpu in ["A100-40GB", "H100-80GB"] {
                for (dp, tp, pp) in [("1", "1", "1"), ("16", "1", "1"), ("32", "4", "2")] {
                    for seq in ["2k", "4k"] {
                        let (mut s, _) = est(&[
                            ("model", model),
                            ("gpu", gpu),
                            ("dp", dp),
                            ("tp", tp),
                            ("pp", pp),
                            ("seq", seq),
                        ]);
                        // As the widgets estimate: the caching allocator not replayed.
                        s.allocator.replay = false;
                        let e = gpumem::estimate(&s).unwrap();
                        let peak = substitute(&s, &e, "peak").unwrap();
                        let (_, total, _) = ends(&peak);
                        let device = substitute(&s, &e, "device").unwrap();
                        let (terms, shown, exact) = ends(&device["M_device = ".len()..]);
                        let t: Vec<&str> = terms.split(" + ").collect();
                        assert!(rounds_to(total, e.peak_bytes as f64), "{peak}");
                        assert!(rounds_to(t[0], e.peak_bytes as f64), "{device}");
                        assert!(rounds_to(t[1], e.cuda_context_bytes as f64), "{device}");
                        assert!(rounds_to(shown, e.device_bytes as f64), "{device}");
                        // "=" where the terms add up as shown, "≈" where they cannot.
                        let sum: f64 = t.iter().map(|x| num(x)).sum();
                        assert_eq!((sum - num(shown)).abs() < 1e-6, exact, "{device}");
                        let formula = substitute(&s, &e, "headroom").unwrap();
                        let prose = show(&e, "headroom", "");
                        assert!(
                            formula.ends_with(&format!(" = {prose}")),
                            "{formula} vs {prose}"
                        );
                    }
                }
            }
        }
    }

    /// Each substitution's terms multiply out to the engine's figure.
    #[test]
    fn substitutions_end_in_the_engine_value() {
        let (s, e) = est(&[("model", "llama3.1-8b"), ("precision", "mixed-bf16")]);
        let w = substitute(&s, &e, "weights").unwrap();
        assert!(w.starts_with("M_weights = 8.03B × 2 B (bf16) = "), "{w}");
        assert!(w.ends_with(&gib(e.weights_bytes as f64)));
        assert!((e.params as f64 * 2.0 - e.weights_bytes as f64).abs() < 1.0);
        let o = substitute(&s, &e, "optimizer_states").unwrap();
        assert!(o.contains("× 8 B (adamw)"), "{o}");
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
        assert!(
            kv.starts_with("M_KV = 32 × 1 × 1,024 × 2,048 × 2 B"),
            "{kv}"
        );
        for q in FORMULAS {
            assert!(tex(q).is_some(), "{q}");
        }
    }

    /// The device total as the widgets have it (no allocator replay): the allocated peak
    /// and the CUDA context, and a paged optimizer's states where they are resident.
    #[test]
    fn the_device_total_is_the_peak_and_what_lies_outside_the_allocator() {
        for (opt, paged) in [("adamw", false), ("paged-adamw-8bit", true)] {
            let k = Knobs(
                [("model", "llama3.2-1b"), ("optimizer", opt)]
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            );
            let (s, e) = (k.scenario().unwrap(), k.estimate().unwrap());
            assert!(!e.reserved_replayed);
            assert_eq!(e.managed_bytes > 0, paged, "{opt}");
            assert_eq!(
                e.device_bytes,
                e.peak_bytes + e.cuda_context_bytes + e.managed_bytes
            );
            let d = substitute(&s, &e, "device").unwrap();
            assert_eq!(d.contains("(paged optimizer states)"), paged, "{d}");
            assert!(
                rounds_to(d.rsplit(" = ").next().unwrap(), e.device_bytes as f64),
                "{d}"
            );
        }
        assert_eq!(gib(0.0), "0 GiB");
    }

    /// QLoRA's weights: NF4 linear layers, bf16 embeddings and norms, fp32 adapters, adding
    /// up to the engine's figure.
    #[test]
    fn qlora_weights_split_into_nf4_bf16_and_adapters() {
        let (s, e) = est(&[
            ("model", "llama3.1-8b"),
            ("precision", "bf16"),
            ("finetune", "qlora"),
        ]);
        let z = quantized(&s, &e).unwrap();
        let back = z.linear * DType::Nf4.bytes() + z.rest * 2.0 + z.adapters * 4.0;
        assert!((back - e.weights_bytes as f64).abs() < 2.0);
        // Llama 3.1 8B: everything but the two 128256 × 4096 matrices and the norms.
        assert_eq!(z.rest as u64, 2 * 128_256 * 4096 + 32 * 2 * 4096 + 4096);
        let t = substitute(&s, &e, "quantized_weights").unwrap();
        assert!(t.contains("B (nf4, linear layers)"), "{t}");
        assert!(t.contains("(fp32 adapters)"), "{t}");
        assert!(
            rounds_to(t.rsplit(" = ").next().unwrap(), e.weights_bytes as f64),
            "{t}"
        );
    }

    #[test]
    fn sums_add_up_as_displayed() {
        for p in ["mixed-bf16", "bf16", "fp8", "amp-bf16", "fp32"] {
            let (s, e) = est(&[("model", "llama3.1-8b"), ("precision", p)]);
            for q in ["model_states", "peak", "device"] {
                let t = substitute(&s, &e, q).unwrap();
                let (lhs, total, exact) = ends(&t);
                // In the units of the total's last decimal.
                let units = |x: &str| -> i64 {
                    let g = x.split(" GiB").next().unwrap().replace([',', '.'], "");
                    g.parse::<i64>().unwrap()
                };
                let sum: i64 = lhs.split(" + ").map(units).sum();
                assert_eq!(sum == units(total), exact, "{p} {q}: {t}");
            }
        }
        let (_, e) = est(&[("model", "llama3.1-8b"), ("precision", "mixed-bf16")]);
        assert_eq!(show(&e, "params", "count"), count(e.params));
        assert_eq!(show(&e, "model_states", "per-param"), "16");
    }
}
