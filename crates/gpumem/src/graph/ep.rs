//! Expert parallelism as torchtitan runs it: each rank routes its own tokens and sends every
//! (token, expert) row to the rank that holds the expert.

use super::Builder;
use crate::dtype::DType;
use crate::tape::{Cat, OpSpec, Tid};

impl Builder<'_, '_> {
    /// A mixture-of-experts block under torchtitan's expert parallelism over the normed input
    /// `y`. The router runs in fp32 (it keeps `x.float()` for its weight's gradient and its
    /// softmax); the routed rows are copied out, exchanged by an all-to-all, permuted into
    /// expert order (kept for the experts' weight gradients) and run through this rank's
    /// experts' grouped GEMMs; the results come back by a second all-to-all and are weighted
    /// by the routing scores in fp32 (the fp32 copy is kept) before being summed into each
    /// token's row. Routing is taken as balanced: a rank's experts receive `T·top_k` rows.
    pub(super) fn moe_titan(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("a MoE layer");
        let (t, c) = (ctx.t, ctx.c);
        let h = a.hidden as f64;
        let (e, k) = (m.experts as f64, m.top_k as f64);
        let i = m.expert_intermediate as f64;
        let rows = t * k * ctx.capacity_factor;
        let local = (e / ctx.ep).ceil();
        let trainable = ctx.base_trainable();
        let g = ctx.g.bytes();
        let f32 = DType::F32;
        let xf = self.cast(y, t * h, f32);
        let sv: &[Tid] = if trainable { &[xf] } else { &[] };
        let logits = self.op_spec(
            OpSpec {
                name: "router",
                inputs: &[xf],
                out_bytes: t * e * 4.0,
                saved: sv,
                weights_rg: trainable,
                param_grads: e * h * g,
                ..OpSpec::default()
            },
            f32,
        );
        let probs = self.op_saving_output(&[logits], t * e, f32, Cat::Activations);
        let scores = self.op(&[probs], t * k, f32, &[]);
        let out_rows = self.op(&[y], rows * h, c, &[]);
        let recv = self.op_spec(
            OpSpec {
                name: "all-to-all dispatch",
                inputs: &[out_rows],
                out_bytes: rows * h * c.bytes(),
                cat: Cat::Comm,
                ..OpSpec::default()
            },
            c,
        );
        let perm = self.op(&[recv], rows * h, c, &[]);
        let expert = |b: &mut Self, x: Tid, out: f64, params: f64, name: &'static str| {
            let sv: &[Tid] = if trainable { &[x] } else { &[] };
            b.op_spec(
                OpSpec {
                    name,
                    inputs: &[x],
                    out_bytes: rows * out * c.bytes(),
                    saved: sv,
                    weights_rg: trainable,
                    param_grads: local * params * g,
                    ..OpSpec::default()
                },
                c,
            )
        };
        let w1 = expert(self, perm, i, i * h, "experts w1");
        let act = self.op(&[w1], rows * i, c, &[w1]);
        let w3 = expert(self, perm, i, i * h, "experts w3");
        let gated = self.mul(act, w3, rows * i);
        let w2 = expert(self, gated, h, h * i, "experts w2");
        let unperm = self.op(&[w2], rows * h, c, &[]);
        let back = self.op_spec(
            OpSpec {
                name: "all-to-all combine",
                inputs: &[unperm],
                out_bytes: rows * h * c.bytes(),
                cat: Cat::Comm,
                ..OpSpec::default()
            },
            c,
        );
        let back32 = self.cast(back, rows * h, f32);
        let weighted = self.mul(back32, scores, rows * h);
        let weighted = self.cast(weighted, rows * h, c);
        let mut out = self.op(&[weighted], t * h, c, &[]);
        if m.shared_experts > 0 {
            let s = self.mlp(y, m.shared_experts * m.expert_intermediate, t);
            out = self.add(out, s, t * h);
        }
        out
    }
}
