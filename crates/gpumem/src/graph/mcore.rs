//! Megatron-LM's GPT model (Megatron-Core), op by op: what its fused kernels and its
//! tensor-parallel layers keep for backward.
//!
//! For GPT-3's shape (learned positions, GELU, dropout, multi-head attention) the tensors
//! kept are exactly those Korthikanti et al. 2022 (§4) count, term by term; the tests check
//! the replay against their closed forms in [`crate::megatron`]. Other shapes follow the
//! same code: grouped-query attention, gated MLPs, rotary embeddings, flash attention.
//!
//! What sets Megatron apart from a Hugging Face model under PyTorch:
//! - Parameters are held in the compute dtype; each weight gradient is accumulated into
//!   Megatron's own buffer (`main_grad`, fp32 unless `--grad-reduce-in-bf16`). The linear
//!   layers' weight-gradient GEMMs write into it directly (gradient-accumulation fusion,
//!   the default), so their backward makes no gradient tensor; the embedding and the norms
//!   make theirs and add them in (the caller replays with [`Grads::IntoBuffer`]).
//! - Column-parallel linears under sequence parallelism save their input as the local slice
//!   of the sequence and all-gather it again in backward; row-parallel linears
//!   reduce-scatter their partial sums (or all-reduce them in place without sequence
//!   parallelism).
//! - The norms, the bias-GELU/SwiGLU and the bias-dropout-add are fused kernels, each
//!   saving one tensor; the loss is the vocabulary-parallel cross-entropy, which keeps its
//!   fp32 softmax and turns it into the gradient in place.
//!
//! [`Grads::IntoBuffer`]: crate::tape::Grads::IntoBuffer

use super::{Builder, Heads};
use crate::arch::{Family, LayerKind, Linear};
use crate::dtype::DType;
use crate::scenario::{Attention, Recompute};
use crate::tape::{Cat, OpSpec, Tid};

/// How a Megatron linear layer is split over the tensor-parallel group.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Par {
    /// Output features split (`ColumnParallelLinear`).
    Col,
    /// Input features split, partial sums reduced (`RowParallelLinear`).
    Row,
    /// Whole on every rank (MLA's down-projections, the router).
    Rep,
}

impl Builder<'_, '_> {
    /// A fused norm over the sequence-parallel rows: saves its input and its fp32
    /// statistics (mean and rstd for LayerNorm, rstd for RMSNorm).
    fn mc_norm(&mut self, x: Tid, width: f64) -> Tid {
        let ctx = self.ctx;
        let rows = ctx.tsp;
        let d = self.d(x);
        let layer_norm = ctx.arch.family == Family::Gpt2;
        let stats = self.op(
            &[x],
            rows * if layer_norm { 2.0 } else { 1.0 },
            DType::F32,
            &[],
        );
        let trainable = ctx.base_trainable();
        let saved: &[Tid] = if trainable || self.tape.requires_grad(x) {
            &[x, stats]
        } else {
            &[]
        };
        self.op_spec(
            OpSpec {
                name: "fused norm",
                inputs: &[x, stats],
                out_bytes: rows * width * d.bytes(),
                saved,
                weights_rg: trainable,
                param_grads: if layer_norm { 2.0 } else { 1.0 } * width * ctx.c.bytes(),
                ..OpSpec::default()
            },
            d,
        )
    }

    /// A Megatron linear layer over `x`. Column-parallel: `x` is the sequence-parallel
    /// slice (or the whole sequence), the output this rank's features of the whole
    /// sequence. Row-parallel: the output is reduced back to the sequence-parallel rows.
    fn mc_linear(&mut self, x: Tid, lin: Linear, name: &'static str, par: Par) -> Tid {
        let ctx = self.ctx;
        let (t, c, tp) = (ctx.t, ctx.c, ctx.tp);
        let trainable = ctx.base_trainable();
        let saved: &[Tid] = if trainable { &[x] } else { &[] };
        // Without gradient-accumulation fusion the weight gradient is a tensor of its own.
        let param_grads = if ctx.fused_wgrad {
            0.0
        } else {
            let local = if par == Par::Rep { 1.0 } else { tp };
            (lin.params() as f64 / local).ceil() * ctx.g.bytes()
        };
        match par {
            Par::Col | Par::Rep => {
                let out = if par == Par::Col {
                    (lin.out as f64 / tp).ceil()
                } else {
                    lin.out as f64
                };
                // Sequence parallelism: the input is gathered for the GEMM and gathered
                // again for the weight gradient; the input's whole gradient is computed and
                // reduce-scattered.
                let whole = if ctx.sp {
                    t * lin.inp as f64 * c.bytes()
                } else {
                    0.0
                };
                self.op_spec(
                    OpSpec {
                        name,
                        inputs: &[x],
                        out_bytes: t * out * c.bytes(),
                        saved,
                        weights_rg: trainable,
                        param_grads,
                        fwd_temp: whole,
                        bwd_temp: 2.0 * whole,
                        ..OpSpec::default()
                    },
                    c,
                )
            }
            Par::Row => {
                let partial = self.op_spec(
                    OpSpec {
                        name,
                        inputs: &[x],
                        out_bytes: t * lin.out as f64 * c.bytes(),
                        saved,
                        weights_rg: trainable,
                        param_grads,
                        ..OpSpec::default()
                    },
                    c,
                );
                if ctx.sp {
                    self.op_spec(
                        OpSpec {
                            name: "sequence-parallel reduce-scatter",
                            inputs: &[partial],
                            out_bytes: ctx.tsp * lin.out as f64 * c.bytes(),
                            ..OpSpec::default()
                        },
                        c,
                    )
                } else {
                    // All-reduced in place.
                    partial
                }
            }
        }
    }

    /// Megatron's fused bias-dropout-add: `residual + dropout(x)` over the
    /// sequence-parallel rows.
    fn mc_dropout_add(&mut self, residual: Tid, x: Tid, p: f64) -> Tid {
        let ctx = self.ctx;
        let e = ctx.tsp * ctx.arch.hidden as f64;
        let y = self.dropout(x, e, p);
        self.add(residual, y, e)
    }

    /// The attention core over this rank's heads: flash attention (TE's fused kernel), or
    /// Megatron's unfused core (QKᵀ, fused scale-mask-softmax, dropout, attention over V);
    /// under selective recomputation the core keeps only its inputs.
    fn mc_core(&mut self, q: Tid, k: Tid, v: Tid, shape: Heads) -> Tid {
        let ctx = self.ctx;
        let Heads {
            heads,
            kv_heads,
            dq,
            dv,
        } = shape;
        let (t, b, s, c) = (ctx.t, ctx.batch, ctx.seq, ctx.c);
        let (hq, hk) = (heads as f64, kv_heads as f64);
        let out_elems = t * hq * dv as f64;
        let scores = b * hq * s * s;
        let p_drop = ctx.arch.dropout.attn;
        if ctx.attention == Attention::Sdpa {
            let lse = b * hq * s * 4.0;
            let mut fwd_temp = lse;
            let mut bwd_temp = t * hq * dq as f64 * 4.0 + lse;
            if ctx.cp > 1.0 {
                // Ring attention with point-to-point K/V exchange (TE): the block in use and
                // the one arriving; the output and the softmax statistics accumulated in
                // fp32. Backward passes K/V around again with their fp32 gradients.
                let kv = t * (hk * dq as f64 + hk * dv as f64) * c.bytes();
                fwd_temp += 2.0 * kv + out_elems * 4.0;
                bwd_temp += 2.0 * kv + 4.0 * kv;
            }
            let o = self.op_spec(
                OpSpec {
                    name: "flash attention",
                    inputs: &[q, k, v],
                    out_bytes: out_elems * c.bytes(),
                    saved: &[q, k, v],
                    fwd_temp,
                    bwd_temp,
                    ..OpSpec::default()
                },
                c,
            );
            self.tape.save_self(o);
            // The per-row log-sum-exp, kept in fp32.
            let l = self.op(&[o], b * hq * s, DType::F32, &[]);
            self.tape.save_self(l);
            return o;
        }
        // Megatron's local core attention expands grouped K/V heads to every query head.
        let (kr, vr) = if heads != kv_heads {
            (
                self.op(&[k], t * hq * dq as f64, c, &[]),
                self.op(&[v], t * hq * dv as f64, c, &[]),
            )
        } else {
            (k, v)
        };
        if ctx.recompute == Recompute::Selective {
            // The core is checkpointed: its inputs are kept, everything between is
            // recomputed in backward (scores, probabilities, dropout, and their grads).
            let inner = scores * (c.bytes() + c.bytes() + if p_drop > 0.0 { 3.0 } else { 0.0 });
            let o = self.op_spec(
                OpSpec {
                    name: "attention core (recomputed)",
                    inputs: &[q, kr, vr],
                    out_bytes: out_elems * c.bytes(),
                    saved: &[q, kr, vr],
                    fwd_temp: inner,
                    bwd_temp: inner + 2.0 * scores * c.bytes(),
                    ..OpSpec::default()
                },
                c,
            );
            return self.op(&[o], out_elems, c, &[]);
        }
        let sc = self.op(&[q, kr], scores, c, &[q, kr]);
        let p = self.softmax(sc, scores, c);
        let pd = self.dropout(p, scores, p_drop);
        let o = self.op(&[pd, vr], out_elems, c, &[pd, vr]);
        // [b, heads, s, d] → [s, b, heads·d]: a contiguous copy.
        self.op(&[o], out_elems, c, &[])
    }

    /// Self-attention (norm included) over the layer input `x`; returns the output
    /// projection's result on the sequence-parallel rows.
    fn mc_attention(&mut self, x: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let (t, c, tp) = (ctx.t, ctx.c, ctx.tp);
        let h = a.hidden as f64;
        let y = self.mc_norm(x, h);
        let local = |n: u64| (n as f64 / tp).ceil();
        let lin = a.attention_linears();
        let (q, k, v, shape) = if let Some(m) = &a.mla {
            // Multi-latent attention: the down-projections whole on every rank, the
            // up-projections column-parallel.
            let yf = if ctx.sp {
                self.op(&[y], t * h, c, &[])
            } else {
                y
            };
            let mut i = 0;
            let q = if let Some(r) = m.q_lora_rank {
                let qa = self.mc_linear(yf, lin[0].1, "linear_q_down_proj", Par::Rep);
                let qn = self.mc_norm_rows(qa, r as f64, t);
                i = 2;
                self.mc_linear(qn, lin[1].1, "linear_q_up_proj", Par::Col)
            } else {
                i += 1;
                self.mc_linear(yf, lin[0].1, "linear_q_proj", Par::Col)
            };
            let kva = self.mc_linear(yf, lin[i].1, "linear_kv_down_proj", Par::Rep);
            let kvn = self.mc_norm_rows(kva, m.kv_lora_rank as f64, t);
            let kvb = self.mc_linear(kvn, lin[i + 1].1, "linear_kv_up_proj", Par::Col);
            let heads = local(a.heads);
            let dq = m.qk_nope_head_dim + m.qk_rope_head_dim;
            // Rotary parts applied, full keys and queries assembled (new tensors).
            let q = self.op(&[q], t * heads * dq as f64, c, &[]);
            let k = self.op(&[kvb, kva], t * heads * dq as f64, c, &[]);
            let v = self.op(&[kvb], t * heads * m.v_head_dim as f64, c, &[]);
            let shape = Heads {
                heads: heads as u64,
                kv_heads: heads as u64,
                dq,
                dv: m.v_head_dim,
            };
            (q, k, v, shape)
        } else {
            let (qd, kd) = (a.q_dim(), a.kv_dim());
            let fused = Linear::new(a.hidden, qd + 2 * kd, a.qkv_bias);
            let qkv = self.mc_linear(y, fused, "linear_qkv", Par::Col);
            let (ql, kl) = (t * local(qd) * c.bytes(), t * local(kd) * c.bytes());
            let parts = self.tape.split(qkv, &[ql, kl, kl]);
            for &p in &parts {
                self.reg(p, c);
            }
            let (mut q, mut k, v) = (parts[0], parts[1], parts[2]);
            if a.learned_positions.is_none() {
                // Fused rotary embedding: new query and key tensors, nothing saved.
                q = self.op(&[q], t * local(qd), c, &[]);
                k = self.op(&[k], t * local(kd), c, &[]);
            }
            let shape = Heads {
                heads: local(a.heads) as u64,
                kv_heads: local(a.kv_heads) as u64,
                dq: a.head_dim,
                dv: a.head_dim,
            };
            (q, k, v, shape)
        };
        let core = self.mc_core(q, k, v, shape);
        let o = lin[lin.len() - 1].1;
        self.mc_linear(core, o, "linear_proj", Par::Row)
    }

    /// A fused norm over `rows` rows that are not sequence-parallel (MLA's latents).
    fn mc_norm_rows(&mut self, x: Tid, width: f64, rows: f64) -> Tid {
        let ctx = self.ctx;
        let d = self.d(x);
        let stats = self.op(&[x], rows, DType::F32, &[]);
        let trainable = ctx.base_trainable();
        self.op_spec(
            OpSpec {
                name: "fused norm",
                inputs: &[x, stats],
                out_bytes: rows * width * d.bytes(),
                saved: &[x, stats],
                weights_rg: trainable,
                param_grads: width * ctx.c.bytes(),
                ..OpSpec::default()
            },
            d,
        )
    }

    /// A dense MLP of width `i` over the normed input `y` (fused bias-GELU, or SwiGLU over
    /// the fused gate and up projection).
    fn mc_mlp(&mut self, y: Tid, i: u64) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let (t, c) = (ctx.t, ctx.c);
        let gated = a.gated_mlp();
        let il = (i as f64 / ctx.tp).ceil();
        let fc1 = Linear::new(a.hidden, if gated { 2 * i } else { i }, a.mlp_bias);
        let up = self.mc_linear(y, fc1, "linear_fc1", Par::Col);
        let act = self.op(&[up], t * il, c, &[up]);
        self.mc_linear(
            act,
            Linear::new(i, a.hidden, a.mlp_bias),
            "linear_fc2",
            Par::Row,
        )
    }

    /// A mixture-of-experts MLP over the normed input `y`: the router (fp32 scores), the
    /// routed tokens permuted and dispatched to their experts, the grouped experts, each
    /// output weighted by its probability and combined back; shared experts beside.
    fn mc_moe(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("a MoE layer");
        let (c, h) = (ctx.c, a.hidden as f64);
        let rows = ctx.tsp;
        let e = m.experts as f64;
        let trainable = ctx.base_trainable();
        let saved: &[Tid] = if trainable { &[y] } else { &[] };
        // The router's logits in fp32, their softmax kept (for the top-k and the
        // load-balancing loss).
        let logits = self.op_spec(
            OpSpec {
                name: "router",
                inputs: &[y],
                out_bytes: rows * e * 4.0,
                saved,
                weights_rg: trainable,
                param_grads: e * h * ctx.c.bytes(),
                ..OpSpec::default()
            },
            DType::F32,
        );
        let scores = self.op_saving_output(&[logits], rows * e, DType::F32, Cat::Activations);
        let probs = self.op(&[scores], rows * m.top_k as f64, DType::F32, &[]);
        // Every (token, expert) pair of the tensor-parallel group reaches each rank of it.
        let tokens = ctx.t * m.top_k as f64 * ctx.capacity_factor;
        let permuted = self.op(&[y], tokens * h, c, &[]);
        let gated = a.gated_mlp();
        let i = m.expert_intermediate;
        let il = (i as f64 / ctx.tp).ceil();
        let sv: &[Tid] = if trainable { &[permuted] } else { &[] };
        let up = self.op_spec(
            OpSpec {
                name: "experts linear_fc1",
                inputs: &[permuted],
                out_bytes: tokens * il * if gated { 2.0 } else { 1.0 } * c.bytes(),
                saved: sv,
                weights_rg: trainable,
                ..OpSpec::default()
            },
            c,
        );
        let act = self.op(&[up], tokens * il, c, &[up]);
        let sv: &[Tid] = if trainable { &[act] } else { &[] };
        let down = self.op_spec(
            OpSpec {
                name: "experts linear_fc2",
                inputs: &[act],
                out_bytes: tokens * h * c.bytes(),
                saved: sv,
                weights_rg: trainable,
                ..OpSpec::default()
            },
            c,
        );
        // Weighted by the routing probabilities (each operand saved for the other).
        let weighted = self.mul(down, probs, tokens * h);
        let mut out = self.op(&[weighted], rows * h, c, &[]);
        if m.shared_experts > 0 {
            let s = self.mc_mlp(y, m.shared_experts * i);
            out = self.add(out, s, rows * h);
        }
        out
    }

    /// One Megatron transformer layer over `x` (the sequence-parallel rows of the residual
    /// stream, in the compute dtype).
    pub(super) fn mc_layer(&mut self, x: Tid, kind: LayerKind) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let attn = self.mc_attention(x);
        let r1 = self.mc_dropout_add(x, attn, a.dropout.resid);
        let y2 = self.mc_norm(r1, h);
        let mlp = if kind.moe {
            self.mc_moe(y2)
        } else {
            self.mc_mlp(y2, a.intermediate)
        };
        let out = self.mc_dropout_add(r1, mlp, a.dropout.resid);
        self.tape.set_output(out);
        out
    }

    /// The vocabulary-parallel word embedding (and learned positions): each rank looks up
    /// its rows and the partial sums are reduced to the sequence-parallel rows. The lookup's
    /// backward makes a dense gradient of the local table, added into the buffer.
    pub(super) fn mc_embedding(&mut self) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        // The embedding returns its weight's dtype (autocast leaves it alone), and its
        // gradient is the weight's gradient dtype.
        let (t, c, h) = (ctx.t, ctx.w, a.hidden as f64);
        let ids = self.input(t, DType::F32, false);
        // The token ids belong to the batch, which the caller holds through the step.
        self.tape.keep(ids);
        let trainable = ctx.base_trainable();
        let rows = (a.vocab as f64 / ctx.tp).ceil();
        let mut e = self.op_spec(
            OpSpec {
                name: "word embeddings",
                inputs: &[ids],
                out_bytes: t * h * c.bytes(),
                weights_rg: trainable,
                param_grads: rows * h * ctx.g.bytes(),
                ..OpSpec::default()
            },
            c,
        );
        if let Some(n) = a.learned_positions {
            let pos = self.op_spec(
                OpSpec {
                    name: "position embeddings",
                    inputs: &[ids],
                    out_bytes: ctx.seq * h * c.bytes(),
                    weights_rg: trainable,
                    param_grads: n as f64 * h * ctx.g.bytes(),
                    ..OpSpec::default()
                },
                c,
            );
            e = self.add(e, pos, t * h);
        }
        if ctx.tp > 1.0 && ctx.sp {
            e = self.op(&[e], ctx.tsp * h, c, &[]);
        }
        let out = self.dropout(e, ctx.tsp * h, a.dropout.embd);
        self.tape.set_output(out);
        out
    }

    /// The final norm and the column-parallel output layer: this rank's slice of the
    /// vocabulary, over the whole sequence.
    pub(super) fn mc_head(&mut self, x: Tid) -> (Tid, DType) {
        let ctx = self.ctx;
        let a = ctx.arch;
        let (t, c) = (ctx.t, ctx.c);
        let h = a.hidden as f64;
        let y = self.mc_norm(x, h);
        let vl = (a.vocab as f64 / ctx.tp).ceil();
        let trainable = ctx.base_trainable();
        let whole = if ctx.sp { t * h * c.bytes() } else { 0.0 };
        let saved: &[Tid] = if trainable { &[y] } else { &[] };
        let logits = self.op_spec(
            OpSpec {
                name: "output_layer",
                inputs: &[y],
                out_bytes: t * vl * c.bytes(),
                saved,
                cat: Cat::Logits,
                weights_rg: trainable,
                fwd_temp: whole,
                bwd_temp: 2.0 * whole,
                ..OpSpec::default()
            },
            c,
        );
        self.tape.set_output(logits);
        (logits, c)
    }

    /// The vocabulary-parallel cross-entropy over this rank's logits: an fp32 copy, turned
    /// into the softmax in place and kept; its backward makes the gradient in that same
    /// storage. The 16-bit logits stay referenced until the model's forward returns.
    pub(super) fn mc_loss(&mut self, x: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let vl = (a.vocab as f64 / ctx.tp).ceil();
        self.tape.hold(x);
        let l32 = self.op_spec(
            OpSpec {
                name: "logits.float()",
                inputs: &[x],
                out_bytes: t * vl * 4.0,
                cat: Cat::Logits,
                ..OpSpec::default()
            },
            DType::F32,
        );
        let per_token = self.op_spec(
            OpSpec {
                name: "vocab-parallel cross-entropy",
                inputs: &[l32],
                out_bytes: t * 4.0,
                saved: &[l32],
                grad_in_saved: true,
                fwd_temp: 3.0 * t * 4.0,
                ..OpSpec::default()
            },
            DType::F32,
        );
        let loss = self.op(&[per_token], 1.0, DType::F32, &[]);
        self.tape.set_output(loss);
        loss
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Builder, Ctx};
    use crate::arch::LayerKind;
    use crate::megatron::{self, Shape, Split};
    use crate::scenario::{Model, Recompute, Scenario};
    use crate::tape::{Grads, Mode};
    use serde_json::json;

    /// GPT-3 shapes of Korthikanti et al. 2022, Table 3: (heads, hidden).
    const GPT3: &[(u64, u64)] = &[(96, 12288), (128, 20480), (160, 25600)];

    /// What one Megatron layer keeps from its forward to its backward (the replay's net
    /// change over the forward: its input is kept, its output is the next layer's input).
    fn kept(a: u64, h: u64, t: u64, sp: bool, recompute: &str, attention: &str) -> (f64, f64) {
        let v = json!({
            "model": {"family": "gpt2", "hidden": h, "layers": 2, "heads": a, "vocab": 51200,
                      "n_positions": 2048, "intermediate": 4 * h},
            "precision": "mixed-bf16", "seq": 2048, "batch": 1, "recompute": recompute,
            "attention": attention,
            "parallel": {"tp": t, "sp": sp, "framework": "megatron"}
        });
        let s = Scenario::from_value(&v).unwrap();
        let Model::Arch { arch, .. } = &s.model else {
            unreachable!()
        };
        let ctx = Ctx::new(&s, arch, true);
        let mut b = Builder::new(&ctx);
        let x = b.input(ctx.tsp * h as f64, ctx.c, true);
        b.mc_layer(x, LayerKind::default());
        let mode = if s.recompute == Recompute::Full {
            Mode::Checkpointed
        } else {
            Mode::Normal
        };
        let p = b.tape.replay(mode, Grads::IntoBuffer, None);
        let shape = Shape::of(arch, 2048.0, 1.0);
        let split = Split {
            t: t as f64,
            sp,
            recompute: s.recompute,
            flash: attention == "sdpa",
        };
        (p.fwd.delta.total(), megatron::layer_bytes(&shape, &split))
    }

    /// The replayed layer keeps what Korthikanti et al. count (§4): sbh(34 + 5as/h) alone,
    /// sbh(10 + 24/t + 5as/(ht)) under tensor parallelism, sbh/t·(34 + 5as/h) with sequence
    /// parallelism, 34·sbh/t with selective recomputation, 2sbh/t with full recomputation —
    /// up to the norms' fp32 statistics (4 bytes per row and statistic).
    #[test]
    fn a_megatron_layer_keeps_what_korthikanti_count() {
        for &(a, h) in GPT3 {
            for (t, sp) in [(1, false), (2, false), (8, false), (2, true), (8, true)] {
                for rc in ["none", "selective", "full"] {
                    let (got, want) = kept(a, h, t, sp, rc, "eager");
                    let rows = 2048.0 / if sp { t as f64 } else { 1.0 };
                    let stats = if rc == "full" {
                        0.0
                    } else {
                        2.0 * 2.0 * 4.0 * rows
                    };
                    assert!(
                        (got - want - stats).abs() <= 1e-9 * want,
                        "a={a} h={h} t={t} sp={sp} {rc}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Flash attention keeps q, k, v, its output and the fp32 log-sum-exp per row and head,
    /// instead of the s × s scores.
    #[test]
    fn flash_attention_keeps_no_scores() {
        let (a, h) = GPT3[0];
        let (got, want) = kept(a, h, 8, true, "none", "sdpa");
        let stats = 2.0 * 2.0 * 4.0 * 2048.0 / 8.0;
        assert!((got - want - stats).abs() <= 1e-9 * want, "{got} vs {want}");
    }
}
