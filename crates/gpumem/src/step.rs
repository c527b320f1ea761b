//! A training step on one GPU, as a sequence of segments: each stretch of the model replayed
//! op by op on a [`Tape`](crate::tape::Tape) once, the framework's own buffers (all-gathered
//! units, reduce-scatter inputs, gradient buckets) added at the boundaries where they are
//! allocated and freed, identical layers composed in closed form.

use crate::arch::Architecture;
use crate::dtype::DType;
use crate::graph::{Builder, Ctx};
use crate::mem::{Bytes, Cat, Phase, Seg, Where};
use crate::tape::{self, Grads, Profile};

/// The profiles of one GPU's stretches: embedding, each kind of decoder layer, LM head, loss.
pub(crate) struct Stretches {
    pub emb: Profile,
    pub dense: Profile,
    pub moe: Option<Profile>,
    /// Final norm and LM head (logits).
    pub head: Profile,
    /// Upcast, log-softmax and the loss (or a fused linear + cross-entropy's whole op).
    pub loss: Profile,
    /// The embedding output referenced by the model (`inputs_embeds`) through the forward,
    /// when the first layer does not save it anyway.
    pub embeds_hold: f64,
}

impl tape::Mode {
    fn or_nograd(self, mode: tape::Mode) -> tape::Mode {
        if mode == tape::Mode::NoGrad {
            tape::Mode::NoGrad
        } else {
            self
        }
    }
}

impl Stretches {
    /// Replay each stretch once. `grads` says what becomes of the parameter gradients the
    /// backward computes.
    pub(crate) fn new(ctx: &Ctx<'_>, mode: tape::Mode, grads: Grads) -> Stretches {
        let a = ctx.arch;
        let h = a.hidden as f64;
        let run = |b: &Builder<'_, '_>, m: tape::Mode| b.tape.replay(m, grads, None);
        let mut pre = Builder::new(ctx);
        let first = pre.embedding();
        let first_rg = pre.tape.requires_grad(first);
        let emb = run(&pre, tape::Mode::Normal.or_nograd(mode));
        let resid = if ctx.autocast { DType::F32 } else { ctx.c };
        let layer = |moe: bool| -> Profile {
            let mut b = Builder::new(ctx);
            let x = b.input(
                ctx.t * h,
                resid,
                // From the second layer on the hidden state requires grad whenever anything is
                // trained (LoRA adapters upstream); layer 0's frozen-embedding input is the
                // exception.
                first_rg || ctx.train,
            );
            b.decoder_layer(x, moe);
            for k in b.kv.clone() {
                b.tape.keep(k);
            }
            run(&b, mode)
        };
        let dense_n = a.moe.as_ref().map_or(a.layers, |m| m.first_dense_layers);
        let dense = if dense_n > 0 {
            layer(false)
        } else {
            Profile::default()
        };
        let moe = a.moe.as_ref().map(|_| layer(true));
        let mut hb = Builder::new(ctx);
        let x = hb.input(ctx.t * h, resid, ctx.train);
        if !ctx.train {
            // generate(): the last position's logits.
            hb.head(x);
            let head = run(&hb, tape::Mode::NoGrad);
            return Stretches {
                emb,
                dense,
                moe,
                head,
                loss: Profile::default(),
                embeds_hold: ctx.t * h * if ctx.autocast { 4.0 } else { ctx.c.bytes() },
            };
        }
        let (logits, logits_dtype) = hb.head_logits(x);
        let logits_rg = hb.tape.requires_grad(logits);
        let logits_bytes = hb.tape.bytes(logits);
        let head = run(&hb, tape::Mode::Normal.or_nograd(mode));
        let mut lb = Builder::new(ctx);
        let cat = match ctx.loss {
            crate::scenario::Loss::Standard => Cat::Logits,
            crate::scenario::Loss::Fused => Cat::Activations,
        };
        let l = lb.input_bytes(logits_bytes, logits_dtype, logits_rg, cat);
        lb.loss(l);
        let loss = run(&lb, tape::Mode::Normal.or_nograd(mode));
        // The layer input is freed during the layer's forward unless a saved tensor is it.
        let input_freed = dense.fwd.delta.total() < dense.out_bytes - 1.0
            || a.learned_positions.is_some()
            || !ctx.train;
        Stretches {
            emb,
            dense,
            moe,
            head,
            loss,
            embeds_hold: if input_freed {
                ctx.t * h * if ctx.autocast { 4.0 } else { ctx.c.bytes() }
            } else {
                0.0
            },
        }
    }

    /// Autocast's cached weight copies of all layers, released when the forward leaves
    /// autocast.
    fn cached(&self, a: &Architecture) -> Bytes {
        let (dense_n, moe_n) = layer_counts(a);
        self.dense.fwd_cached.scale(dense_n as f64).plus(
            self.moe
                .map_or(Bytes::default(), |m| m.fwd_cached.scale(moe_n as f64)),
        )
    }
}

/// (dense layers, MoE layers).
pub(crate) fn layer_counts(a: &Architecture) -> (u64, u64) {
    let dense_n = a.moe.as_ref().map_or(a.layers, |m| m.first_dense_layers);
    (dense_n, a.layers - dense_n)
}

fn at(phase: Phase) -> Where {
    Where {
        phase,
        ..Where::default()
    }
}

/// A step composed so far, and the points of its coarse timeline.
pub(crate) struct Program {
    pub seg: Seg,
    /// (phase, bytes above the step's start) at the stretch boundaries worth showing.
    pub points: Vec<(&'static str, Bytes)>,
}

impl Program {
    fn new() -> Self {
        let mut p = Program {
            seg: Seg::default(),
            points: Vec::new(),
        };
        p.point("start of step");
        p
    }

    fn then(&mut self, s: Seg) {
        self.seg = self.seg.then(s);
    }

    fn point(&mut self, name: &'static str) {
        self.points.push((name, self.seg.delta));
    }
}

/// One micro-batch's forward and backward and the optimizer step, on a single GPU (or one
/// data-parallel replica with the data-parallel buffers added by the caller).
/// `opt_temp` is what the optimizer step allocates for itself.
pub(crate) fn single(a: &Architecture, st: &Stretches, opt_temp: f64) -> Program {
    let (dense_n, moe_n) = layer_counts(a);
    let mut p = Program::new();
    // Forward.
    p.then(st.emb.fwd.in_phase(Phase::FwdEmbedding));
    p.then(Seg::alloc(
        Cat::Activations,
        st.embeds_hold,
        at(Phase::FwdEmbedding),
    ));
    if dense_n > 0 {
        p.then(st.dense.fwd.repeat(dense_n).in_phase(Phase::FwdLayer));
    }
    if let Some(m) = &st.moe {
        p.then(m.fwd.repeat(moe_n).in_phase(Phase::FwdMoeLayer));
    }
    p.point("forward: after the layers");
    p.then(st.head.fwd.in_phase(Phase::FwdHead));
    p.then(st.loss.fwd.in_phase(Phase::FwdHead));
    // Leaving the forward: inputs_embeds dropped; autocast's cache cleared.
    p.then(Seg::free(
        Cat::Activations,
        st.embeds_hold,
        at(Phase::FwdHead),
    ));
    let cached = st.cached(a);
    p.then(Seg {
        delta: Bytes::default().minus(cached),
        peak: Bytes::default(),
        at: at(Phase::FwdHead),
    });
    p.point("after forward");
    // Backward: loss and head, then layers top-down, then the embedding.
    p.then(st.loss.bwd.in_phase(Phase::BwdHead));
    p.then(st.head.bwd.in_phase(Phase::BwdHead));
    if let Some(m) = &st.moe {
        p.then(m.bwd.repeat(moe_n).in_phase(Phase::BwdMoeLayer));
    }
    if dense_n > 0 {
        p.then(st.dense.bwd.repeat(dense_n).in_phase(Phase::BwdLayer));
    }
    p.then(st.emb.bwd.in_phase(Phase::BwdEmbedding));
    p.point("after backward");
    // Optimizer step: the grads and `out.logits` are still alive.
    p.then(Seg::transient(
        Cat::Temporaries,
        opt_temp,
        at(Phase::OptimizerStep),
    ));
    p
}
