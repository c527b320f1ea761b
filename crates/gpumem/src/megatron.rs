//! What a Megatron-LM transformer layer keeps for backward, per micro-batch, on one GPU of a
//! tensor-parallel group: the accounting of Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models", §4), written tensor by tensor so that it
//! extends beyond GPT-3's shape — grouped-query attention, gated MLPs, models without
//! dropout, flash attention, MoE layers.
//!
//! Tensor parallelism (t) splits every tensor inside the attention heads and the MLP's
//! intermediate dimension. What stays `s·b·h`-shaped (layer-norm inputs, the inputs of the
//! first linear of each block, the dropout masks after each block) is replicated across the
//! group, unless sequence parallelism splits it along the sequence.

use crate::arch::Architecture;
use crate::scenario::Recompute;

/// The shape one GPU sees.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Sequence length on this GPU (the full sequence ÷ context parallelism).
    pub s: f64,
    /// Micro-batch size.
    pub b: f64,
    pub h: f64,
    /// Query heads × head dim (q/k), and value heads × value dim, per token.
    pub q: f64,
    pub k: f64,
    pub v: f64,
    /// Attention output width fed to the output projection.
    pub o: f64,
    pub heads: f64,
    /// MLP intermediate size.
    pub f: f64,
    pub gated: bool,
    pub dropout: bool,
}

impl Shape {
    pub fn of(a: &Architecture, s: f64, b: f64) -> Shape {
        let (q, k, v) = match &a.mla {
            Some(m) => {
                let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64 * a.heads as f64;
                (qk, qk, (m.v_head_dim * a.heads) as f64)
            }
            None => (
                (a.heads * a.head_dim) as f64,
                (a.kv_heads * a.head_dim) as f64,
                (a.kv_heads * a.head_dim) as f64,
            ),
        };
        // Attention's output has one value vector per query head.
        let o = match &a.mla {
            Some(_) => v,
            None => q,
        };
        Shape {
            s,
            b,
            h: a.hidden as f64,
            q,
            k,
            v,
            o,
            heads: a.heads as f64,
            f: a.intermediate as f64,
            gated: a.gated_mlp(),
            dropout: a.dropout.attn > 0.0 || a.dropout.resid > 0.0,
        }
    }
}

/// How the layer is split and run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Split {
    pub t: f64,
    pub sp: bool,
    pub recompute: Recompute,
    /// A fused attention kernel (flash): no `s × s` tensor is kept.
    pub flash: bool,
}

/// Bytes kept for backward by one transformer layer (16-bit activations, 1-byte dropout
/// masks), per micro-batch, on one GPU. Under full recomputation only the layer's input is
/// kept; [`recompute_transient`] is what the recomputation briefly needs.
pub fn layer_bytes(x: &Shape, sp: &Split) -> f64 {
    if sp.recompute == Recompute::Full {
        return replicated(2.0 * x.s * x.b * x.h, sp);
    }
    attention_bytes(x, sp) + mlp_bytes(x.f, x, sp)
}

/// An `s·b·h` tensor: replicated across the TP group unless sequence parallelism splits it.
fn replicated(bytes: f64, sp: &Split) -> f64 {
    if sp.sp {
        bytes / sp.t
    } else {
        bytes
    }
}

/// The attention block and its layer norm.
pub fn attention_bytes(x: &Shape, sp: &Split) -> f64 {
    let sb = x.s * x.b;
    let t = sp.t;
    // Layer-norm input, QKV-projection input; the dropout mask after the output projection.
    let mut rep = 2.0 * sb * x.h + 2.0 * sb * x.h;
    if x.dropout {
        rep += sb * x.h;
    }
    // Q and K (for QKᵀ), V (for attention over values), the output projection's input.
    let mut split = 2.0 * sb * (x.q + x.k + x.v + x.o);
    let core = x.heads * x.s * x.s * x.b;
    if sp.flash {
        // Flash attention keeps its output (counted as the projection's input) and the fp32
        // log-sum-exp per query and head.
        split += 4.0 * sb * x.heads;
    } else if sp.recompute != Recompute::Selective {
        // Softmax output (2 bytes); with dropout, its mask (1 byte) and output (2 bytes).
        split += 2.0 * core;
        if x.dropout {
            split += 3.0 * core;
        }
    }
    replicated(rep, sp) + split / t
}

/// An MLP block (dense, shared expert, or one routed expert's tokens) and its layer norm.
pub fn mlp_bytes(f: f64, x: &Shape, sp: &Split) -> f64 {
    let sb = x.s * x.b;
    let mut rep = 2.0 * sb * x.h + 2.0 * sb * x.h;
    if x.dropout {
        rep += sb * x.h;
    }
    // Gated: the fused SwiGLU keeps the first linear's output (gate and up, 2f) and the
    // second linear's input (f). Plain: the activation's input and output.
    let split = if x.gated {
        2.0 * sb * 3.0 * f
    } else {
        2.0 * sb * 2.0 * f
    };
    replicated(rep, sp) + split / sp.t
}

/// A mixture-of-experts block (Megatron-Core's token dispatcher, experts split by the same
/// `t` as the rest of the layer): the norm and router inputs, the fp32 router scores, each
/// routed token's copy as the first expert linear's input, the experts' intermediate
/// tensors, their outputs kept for the probability-weighted combine, and any shared experts.
/// `tokens` is how many (token, expert) pairs this GPU's experts take: `s·b·top_k` times the
/// capacity factor, all tokens of the TP group being routed to every TP rank.
pub fn moe_bytes(x: &Shape, sp: &Split, experts: f64, tokens: f64, f: f64, shared_f: f64) -> f64 {
    let sb = x.s * x.b;
    let rep = 2.0 * sb * x.h + 2.0 * sb * x.h + 2.0 * 4.0 * sb * experts;
    let per_token = if x.gated { 3.0 * f } else { 2.0 * f };
    let routed = tokens * (2.0 * x.h + 2.0 * x.h) + tokens * 2.0 * per_token / sp.t;
    let shared = if x.gated {
        2.0 * sb * 3.0 * shared_f
    } else {
        2.0 * sb * 2.0 * shared_f
    };
    replicated(rep, sp) + routed + shared / sp.t
}

/// What full recomputation materialises again for the layer being back-propagated.
pub fn recompute_transient(x: &Shape, sp: &Split) -> f64 {
    match sp.recompute {
        Recompute::Full => layer_bytes(
            x,
            &Split {
                recompute: Recompute::None,
                ..*sp
            },
        ),
        _ => 0.0,
    }
}

/// The output layer and loss with a vocabulary-parallel cross-entropy: the final norm's and
/// the output layer's inputs, the 16-bit logits, and the fp32 softmax the loss keeps.
pub fn head_bytes(x: &Shape, vocab: f64, sp: &Split) -> f64 {
    let sb = x.s * x.b;
    replicated(4.0 * sb * x.h, sp) + (2.0 + 4.0) * sb * vocab / sp.t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-3-shaped layers as in Korthikanti et al. 2022, Table 3: (heads, hidden, layers).
    const MODELS: &[(&str, f64, f64)] = &[
        ("GPT-3 175B", 96.0, 12288.0),
        ("530B", 128.0, 20480.0),
        ("1T", 160.0, 25600.0),
    ];

    fn gpt3(a: f64, h: f64) -> Shape {
        Shape {
            s: 2048.0,
            b: 1.0,
            h,
            q: h,
            k: h,
            v: h,
            o: h,
            heads: a,
            f: 4.0 * h,
            gated: false,
            dropout: true,
        }
    }

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= 1e-9 * want
    }

    /// Korthikanti et al. 2022, §4.1–4.2, per-layer activation memory:
    /// no parallelism sbh(34 + 5as/h); tensor parallel sbh(10 + 24/t + 5as/(ht));
    /// tensor + sequence parallel sbh/t·(34 + 5as/h); selective recomputation with both
    /// 34·sbh/t; full recomputation 2sbh/t (the layer input, sequence-parallel).
    #[test]
    fn korthikanti_per_layer_activations() {
        for &(name, a, h) in MODELS {
            let x = gpt3(a, h);
            let (s, b) = (x.s, x.b);
            let sbh = s * b * h;
            let split = |t: f64, sp: bool, recompute: Recompute| Split {
                t,
                sp,
                recompute,
                flash: false,
            };
            let none = layer_bytes(&x, &split(1.0, false, Recompute::None));
            assert!(close(none, sbh * (34.0 + 5.0 * a * s / h)), "{name}");
            for t in [2.0, 4.0, 8.0] {
                let tp = layer_bytes(&x, &split(t, false, Recompute::None));
                assert!(
                    close(tp, sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))),
                    "{name} t={t}"
                );
                let tp_sp = layer_bytes(&x, &split(t, true, Recompute::None));
                assert!(close(tp_sp, sbh / t * (34.0 + 5.0 * a * s / h)), "{name}");
                let sel = layer_bytes(&x, &split(t, true, Recompute::Selective));
                assert!(close(sel, sbh / t * 34.0), "{name}");
                let full = layer_bytes(&x, &split(t, true, Recompute::Full));
                assert!(close(full, 2.0 * sbh / t), "{name}");
            }
        }
    }

    /// The paper's headline: for GPT-3 175B at t = 8, sequence parallelism with selective
    /// recomputation keeps about 5× less than tensor parallelism alone (§5, Figure 7: the
    /// 5as/h term is 5·96·2048/12288 = 80 of 80 + 34 per sbh/t).
    #[test]
    fn selective_recomputation_saves_what_the_paper_says() {
        let x = gpt3(96.0, 12288.0);
        let tp = layer_bytes(
            &x,
            &Split {
                t: 8.0,
                sp: false,
                recompute: Recompute::None,
                flash: false,
            },
        );
        let both = layer_bytes(
            &x,
            &Split {
                t: 8.0,
                sp: true,
                recompute: Recompute::Selective,
                flash: false,
            },
        );
        // sbh(10 + 3 + 10) vs sbh·34/8: 23 / 4.25 = 5.4×.
        assert!(close(tp / both, 23.0 / 4.25), "{}", tp / both);
    }
}
