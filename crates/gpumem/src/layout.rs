//! Per-GPU memory when the model itself is split: tensor (+ sequence), pipeline, context and
//! expert parallelism, on top of data-parallel sharding.
//!
//! Layers are counted the way Megatron-LM (and torchtitan, which follows it) lays them out,
//! with the per-layer accounting of [`crate::megatron`]. The single-GPU and data-parallel
//! path (`estimate.rs`) replays a Hugging Face step op by op instead; this one is analytic,
//! because no single-GPU measurement can check a layout that needs many.
//!
//! The mesh is `dp × tp × pp × cp × ep` GPUs. The `ep` ranks of an expert group hold the
//! same dense layers, so dense states are replicated over `dp·cp·ep` ranks and routed experts
//! over `dp·cp`; ZeRO/FSDP shards each over its own replicas.

use serde::Serialize;

use crate::arch::Architecture;
use crate::estimate::{DpStates, Geo, ModelStates};
use crate::megatron::{self, Shape, Split};
use crate::scenario::{Attention, Framework, Loss, Parallel, Recompute, Scenario, Schedule};

/// One pipeline stage as one of its GPUs sees it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StageEstimate {
    pub stage: u64,
    /// Decoder layers on this stage (all its model chunks).
    pub layers: u64,
    /// Micro-batches whose activations this stage holds at its peak (interleaved schedules
    /// hold fractions: chunks ÷ virtual stages).
    pub micro_batches_in_flight: f64,
    pub peak_bytes: u64,
    pub components: crate::map::Components,
}

/// Bytes on one GPU of one stage at its peak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct StageBytes {
    pub weights: f64,
    pub master: f64,
    pub optim: f64,
    pub grads: f64,
    pub gathered: f64,
    pub activations: f64,
    pub logits: f64,
    pub temporaries: f64,
    pub host: f64,
    pub layers: u64,
    pub in_flight: f64,
    pub last: bool,
}

impl StageBytes {
    pub fn total(&self) -> f64 {
        self.weights
            + self.master
            + self.optim
            + self.grads
            + self.gathered
            + self.activations
            + self.logits
            + self.temporaries
    }

    pub fn model_states(&self) -> f64 {
        self.weights + self.master + self.optim + self.grads
    }

    /// Components at this stage's peak, before they become integers.
    pub fn parts(&self) -> Vec<(&'static str, f64)> {
        [
            ("weights", self.weights),
            ("master_weights", self.master),
            ("optimizer_states", self.optim),
            ("gradients", self.grads),
            ("weight_copies", self.gathered),
            ("activations", self.activations),
            ("logits", self.logits),
            ("temporaries", self.temporaries),
        ]
        .into_iter()
        .filter(|(k, v)| *v > 0.0 || *k == "activations")
        .collect()
    }
}

/// The vocabulary as the embedding stores it: Megatron pads it to a multiple of 128·tp; other
/// engines only to a multiple of tp (an even split).
pub fn padded_vocab(vocab: u64, tp: u64, framework: Framework) -> u64 {
    let unit = if framework == Framework::Megatron {
        128 * tp
    } else {
        tp
    };
    vocab.div_ceil(unit) * unit
}

/// Parameters on one GPU, per part of the model; they depend only on `tp` and `ep`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GpuParams {
    /// A dense layer; a MoE layer without its routed experts; the routed experts of a MoE
    /// layer; the embedding (+ positions); the output layer and final norm.
    dense: f64,
    moe: f64,
    experts: f64,
    embed: f64,
    head: f64,
    /// The padded vocabulary.
    pub vocab: f64,
}

impl GpuParams {
    pub(crate) fn new(a: &Architecture, par: &Parallel) -> GpuParams {
        let t = par.tp as f64;
        let ep = par.ep as f64;
        let (mut attn, mut attn_full) = (0.0, 0.0);
        for (n, l) in a.attention_linears() {
            // MLA's down-projections are small and replicated; everything else splits.
            let k = if n.ends_with("_a_proj") || n == "kv_a_proj_with_mqa" {
                1.0
            } else {
                t
            };
            attn += l.params() as f64 / k;
            attn_full += l.params() as f64;
        }
        let mlp = |i: u64| -> f64 {
            a.mlp_linears(i)
                .iter()
                .map(|(_, l)| l.params() as f64)
                .sum()
        };
        let (dense_total, _, _) = a
            .layer_params(crate::arch::LayerKind::default())
            .unwrap_or_default();
        let norms = dense_total as f64 - attn_full - mlp(a.intermediate);
        let dense = attn + mlp(a.intermediate) / t + norms;
        let (moe, experts) = match &a.moe {
            Some(m) => {
                let (total, routed, _) = a
                    .layer_params(crate::arch::LayerKind {
                        moe: true,
                        ..Default::default()
                    })
                    .unwrap_or_default();
                let shared = mlp(m.expert_intermediate) * m.shared_experts as f64;
                let router = (total - routed) as f64 - attn_full - shared - norms;
                (attn + shared / t + router + norms, routed as f64 / ep / t)
            }
            None => (0.0, 0.0),
        };
        let vocab = padded_vocab(a.vocab, par.tp, par.framework) as f64;
        let h = a.hidden as f64;
        let pc = a.params();
        // With tied embeddings and a pipeline, the last stage keeps its own copy of the
        // embedding as the output layer (Megatron's `share_embeddings_and_output_weights`).
        let head = if a.tied_embeddings && par.pp == 1 {
            0.0
        } else {
            vocab * h / t
        };
        GpuParams {
            dense,
            moe,
            experts,
            embed: vocab * h / t + pc.positions as f64,
            head: head + pc.final_norm as f64,
            vocab,
        }
    }
}

/// Activations of one layer per micro-batch on one GPU, and what its backward adds; they
/// depend on `tp`, `cp`, sequence parallelism, the micro-batch and recomputation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerActs {
    dense: f64,
    moe: f64,
    dense_tr: f64,
    moe_tr: f64,
    /// Pipeline send/receive buffers and ring-attention blocks, alive through backward.
    comm_tr: f64,
    head: f64,
    head_tr: f64,
}

impl LayerActs {
    pub(crate) fn new(
        s: &Scenario,
        a: &Architecture,
        par: &Parallel,
        vocab: f64,
        batch: u64,
        recompute: Recompute,
    ) -> LayerActs {
        let t = par.tp as f64;
        let h = a.hidden as f64;
        // Korthikanti et al. count 16-bit tensors.
        let x = Shape::of(a, s.seq as f64 / par.cp as f64, batch as f64);
        let split = Split {
            t,
            sp: par.sp && par.tp > 1,
            recompute,
            flash: s.attention == Attention::Sdpa,
        };
        let none = Split {
            recompute: Recompute::None,
            ..split
        };
        let scale = s.precision.compute().bytes() / 2.0;
        let sb = x.s * x.b;
        let full = recompute == Recompute::Full;
        let moe_layer = |sp: &Split| -> f64 {
            let m = a.moe.as_ref().expect("a MoE model");
            megatron::attention_bytes(&x, sp)
                + megatron::moe_bytes(
                    &x,
                    sp,
                    m.experts as f64,
                    sb * m.top_k as f64 * par.capacity_factor,
                    m.expert_intermediate as f64,
                    (m.expert_intermediate * m.shared_experts) as f64,
                )
        };
        let kept_input = 2.0 * sb * h / if split.sp { t } else { 1.0 };
        let dense = megatron::layer_bytes(&x, &split) * scale;
        let moe = match (&a.moe, full) {
            (None, _) => 0.0,
            (Some(_), true) => kept_input * scale,
            (Some(_), false) => moe_layer(&split) * scale,
        };
        // Backward of a layer: the gradients of its widest intermediate and of its input
        // (the sequence-parallel all-gather materialises the whole sequence's input), plus,
        // under full recomputation, the layer's activations rebuilt.
        let wide = if x.gated { 2.0 * x.f } else { x.f };
        let dense_tr = (2.0 * sb * wide / t + 2.0 * sb * h) * scale
            + if full {
                megatron::layer_bytes(&x, &none) * scale
            } else {
                0.0
            };
        let moe_tr = match &a.moe {
            Some(m) => {
                let tokens = sb * m.top_k as f64 * par.capacity_factor;
                let wide = if x.gated { 2.0 } else { 1.0 } * m.expert_intermediate as f64;
                // All-to-all send and receive buffers of the routed tokens, the widest expert
                // intermediate's gradient, the input's gradient.
                (2.0 * 2.0 * tokens * h + 2.0 * tokens * wide / t + 2.0 * sb * h) * scale
                    + if full { moe_layer(&none) * scale } else { 0.0 }
            }
            None => 0.0,
        };
        let mut comm_tr = 0.0;
        if par.pp > 1 {
            // One activation received and one gradient sent.
            comm_tr += 2.0 * kept_input * scale;
        }
        if par.cp > 1 {
            // Ring attention: the K/V block in use and the next one arriving, and on the
            // way back their gradients, accumulated in fp32.
            let kv = 2.0 * sb * (x.k + x.v) / t;
            comm_tr += kv * scale * 2.0 + kv * 2.0 * 2.0;
        }
        let logits = 2.0 * sb * vocab / t;
        let (head, head_tr) = match s.loss {
            // Vocabulary-parallel cross-entropy: the 16-bit logits and the fp32 softmax are
            // kept; in backward the softmax becomes the gradient in place, cast to 16 bits.
            Loss::Standard => (megatron::head_bytes(&x, vocab, &split) * scale, logits),
            // Fused/chunked: the logits never exist whole.
            Loss::Fused => (
                megatron::head_bytes(&x, 0.0, &split) * scale,
                logits * 8192f64.min(vocab) / vocab,
            ),
        };
        LayerActs {
            dense,
            moe,
            dense_tr,
            moe_tr,
            comm_tr,
            head,
            head_tr,
        }
    }
}

/// Per-parameter bytes of the unsharded states: weights, master, gradients, optimizer.
pub(crate) fn state_bytes(s: &Scenario, a: &Architecture) -> [f64; 4] {
    let p = &s.precision;
    let states = ModelStates::new(s, Some(a));
    [
        p.weights.bytes(),
        p.master.map_or(0.0, |d| d.bytes()),
        p.grads.bytes(),
        states.optimizer / a.params().total.max(1) as f64,
    ]
}

/// One layout, ready to be evaluated stage by stage.
pub(crate) struct Prep<'a> {
    s: &'a Scenario,
    a: &'a Architecture,
    par: Parallel,
    v: u64,
    w: GpuParams,
    x: LayerActs,
    bytes: [f64; 4],
}

impl<'a> Prep<'a> {
    /// The scenario's own layout, micro-batch and recomputation.
    pub(crate) fn new(s: &'a Scenario, a: &'a Architecture) -> Prep<'a> {
        let par = s.parallel;
        let w = GpuParams::new(a, &par);
        let x = LayerActs::new(s, a, &par, w.vocab, s.batch, s.recompute);
        Prep::from_parts(s, a, par, w, x, state_bytes(s, a))
    }

    /// A layout assembled from parts computed (and cached) elsewhere: `par` overrides the
    /// scenario's layout, `x` was computed for the micro-batch and recomputation wanted.
    pub(crate) fn from_parts(
        s: &'a Scenario,
        a: &'a Architecture,
        par: Parallel,
        w: GpuParams,
        x: LayerActs,
        bytes: [f64; 4],
    ) -> Prep<'a> {
        let v = match par.schedule {
            Schedule::Interleaved(v) if par.pp > 1 => v,
            _ => 1,
        };
        Prep {
            s,
            a,
            par,
            v,
            w,
            x,
            bytes,
        }
    }

    /// (dense layers, MoE layers, total) on stage `r`.
    fn composition(&self, r: u64) -> (u64, u64, u64) {
        let (l, p) = (self.a.layers, self.par.pp);
        let first_moe = self.a.moe.as_ref().map_or(l, |m| m.first_dense_layers);
        let dense_in = |from: u64, n: u64| first_moe.clamp(from, from + n) - from;
        if self.v > 1 {
            // Model chunk j of stage r is virtual stage j·p + r.
            let per = l / (p * self.v);
            let mut d = 0;
            for j in 0..self.v {
                d += dense_in((j * p + r) * per, per);
            }
            let n = per * self.v;
            return (d, n - d, n);
        }
        let (base, rem) = (l / p, l % p);
        let n = base + u64::from(r < rem);
        let from = r * base + r.min(rem);
        let d = dense_in(from, n);
        (d, n - d, n)
    }

    /// Micro-batches' worth of this stage's activations alive at its busiest moment.
    fn in_flight(&self, r: u64) -> f64 {
        let (p, m, v) = (self.par.pp, self.par.grad_accum, self.v);
        if p == 1 {
            return 1.0;
        }
        if v == 1 {
            // 1F1B: stage r runs p − r − 1 warm-up forwards, then one more before its first
            // backward.
            return (p - r).min(m) as f64;
        }
        // Megatron's interleaved schedule: 2(p − r − 1) + (v − 1)·p warm-up chunk forwards,
        // then one more; each chunk is 1/v of the stage. Stage 0 holds p(1 + (p−1)/(pv)).
        let chunks = (2 * (p - r - 1) + (v - 1) * p + 1).min(m * v);
        chunks as f64 / v as f64
    }

    fn geo(&self, ranks: f64, replicas: u64, unit: f64) -> Geo {
        Geo {
            ranks,
            replicas,
            largest: unit,
            unit,
        }
    }

    /// Stage `r` on one of its GPUs.
    pub(crate) fn stage(&self, r: u64) -> StageBytes {
        let par = &self.par;
        let w = &self.w;
        let (d, m, n) = self.composition(r);
        let (first, last) = (r == 0, r + 1 == par.pp);
        let dense = d as f64 * w.dense
            + m as f64 * w.moe
            + if first { w.embed } else { 0.0 }
            + if last { w.head } else { 0.0 };
        let experts = m as f64 * w.experts;
        let [wb, mb, gb, ob] = self.bytes;
        let states = |p: f64| ModelStates {
            weights: p * wb,
            master: p * mb,
            grads: p * gb,
            optimizer: p * ob,
            trainable_params: p as u64,
        };
        let shard = par.shard_ranks();
        let unit_d = w
            .dense
            .max(w.moe)
            .max(if first { w.embed } else { 0.0 })
            .max(if last { w.head } else { 0.0 });
        let dd = DpStates::new(
            self.s,
            par,
            &states(dense),
            self.geo(
                (shard * par.cp * par.ep) as f64,
                par.dp * par.cp * par.ep,
                unit_d,
            ),
        );
        let mut b = StageBytes {
            weights: dd.weights + dd.fixed,
            master: dd.master,
            optim: dd.optim,
            // Counted as resident here (the analytic path's accounting).
            grads: dd.grads + dd.grad_acc,
            gathered: dd.gathered,
            temporaries: dd.buckets,
            host: dd.host,
            layers: n,
            last,
            ..StageBytes::default()
        };
        if experts > 0.0 {
            let de = DpStates::new(
                self.s,
                par,
                &states(experts),
                self.geo((shard * par.cp) as f64, par.dp * par.cp, w.experts),
            );
            b.weights += de.weights + de.fixed;
            b.master += de.master;
            b.optim += de.optim;
            b.grads += de.grads + de.grad_acc;
            b.gathered += de.gathered;
            b.temporaries = b.temporaries.max(de.buckets);
            b.host += de.host;
        }
        let k = self.in_flight(r);
        b.in_flight = k;
        let x = &self.x;
        b.activations = k * (d as f64 * x.dense + m as f64 * x.moe);
        let layer_tr = if m > 0 { x.moe_tr } else { 0.0 }.max(if d > 0 { x.dense_tr } else { 0.0 });
        let (logits, tr) = if last && x.head + x.head_tr > layer_tr {
            (x.head, x.head_tr)
        } else {
            (0.0, layer_tr)
        };
        b.logits = logits;
        b.temporaries += tr + x.comm_tr;
        b
    }

    /// Every stage, and the index of the one with the highest peak.
    pub(crate) fn stages(&self) -> (Vec<StageBytes>, usize) {
        let v: Vec<StageBytes> = (0..self.par.pp).map(|r| self.stage(r)).collect();
        let worst = worst_of(&v);
        (v, worst)
    }

    /// The worst stage only, skipping middle stages that an earlier stage of the same
    /// composition dominates (fewer micro-batches in flight, same states).
    pub(crate) fn worst(&self) -> StageBytes {
        let mut best = self.stage(0);
        let mut prev = self.composition(0);
        for r in 1..self.par.pp {
            let c = self.composition(r);
            if c != prev || r + 1 == self.par.pp {
                let b = self.stage(r);
                if b.total() > best.total() {
                    best = b;
                }
            }
            prev = c;
        }
        best
    }
}

fn worst_of(v: &[StageBytes]) -> usize {
    let mut w = 0;
    for (i, b) in v.iter().enumerate() {
        if b.total() > v[w].total() {
            w = i;
        }
    }
    w
}

/// Notes on what this path assumes.
pub(crate) fn notes(s: &Scenario, a: &Architecture) -> Vec<String> {
    let par = &s.parallel;
    let mut n = vec![format!(
        "model-parallel layout dp {} × tp {} × pp {} × cp {} × ep {}: Megatron-style layers (Korthikanti et al. 2022){}",
        par.dp,
        par.tp,
        par.pp,
        par.cp,
        par.ep,
        if par.sp && par.tp > 1 { " with sequence parallelism" } else { "" }
    )];
    if par.pp > 1 {
        n.push(match par.schedule {
            Schedule::Interleaved(v) => format!(
                "interleaved pipeline, {v} chunks per stage, {} micro-batches per step: stage 0 holds p·(1 + (p−1)/(p·v)) micro-batches' activations",
                par.grad_accum
            ),
            Schedule::OneFOneB | Schedule::GPipe => format!(
                "1F1B pipeline, {} micro-batches per step: stage r holds min(p − r, m) micro-batches' activations",
                par.grad_accum
            ),
        });
    }
    let vp = padded_vocab(a.vocab, par.tp, par.framework);
    if vp != a.vocab {
        n.push(format!(
            "vocabulary padded from {} to {vp} for the tensor-parallel split",
            a.vocab
        ));
    }
    if par.ep > 1 || a.moe.is_some() {
        n.push(format!(
            "experts: tokens evenly routed, capacity factor {}",
            crate::num::short(par.capacity_factor)
        ));
    }
    if s.precision.activations == crate::dtype::DType::F8 {
        n.push("fp8 activations are counted as 16-bit tensors".into());
    }
    n.extend(DpStates::describe(
        s,
        par.dp * par.cp * par.ep,
        par.shard_ranks() * par.cp * par.ep,
    ));
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The planner's shortcut (skipping dominated middle stages) finds the same worst stage
    /// as evaluating every stage.
    #[test]
    fn worst_skips_only_dominated_stages() {
        for (model, pp, v, m) in [
            ("llama3.1-405b", 7, 1, 3),
            ("llama3.1-405b", 16, 1, 64),
            ("llama3.1-70b", 4, 5, 8),
            ("deepseek-v3", 5, 1, 20),
            ("deepseek-v3", 8, 1, 2),
            ("mixtral-8x7b", 4, 2, 8),
        ] {
            let mut par = json!({"tp": 4, "pp": pp, "grad_accum": m});
            if v > 1 {
                par["schedule"] = json!("interleaved");
                par["virtual_stages"] = json!(v);
            }
            let s = Scenario::from_value(&json!({"model": model, "seq": 4096, "parallel": par}))
                .unwrap();
            let crate::scenario::Model::Arch { arch, .. } = &s.model else {
                unreachable!()
            };
            let prep = Prep::new(&s, arch);
            let (all, w) = prep.stages();
            assert_eq!(prep.worst().total(), all[w].total(), "{model} pp={pp}");
        }
    }
}
