//! The forward passes of the modelled implementations, op by op, recorded on a [`Tape`].
//!
//! Each builder follows the Hugging Face `transformers` module it names, with PyTorch's rules
//! for what autograd saves: a matmul saves its input when its weight needs a grad and its
//! weight when its input does; `silu`/`pow` save their input; `softmax`/`tanh`/`rsqrt` their
//! output; `mul` saves each operand for the other's grad; adds, casts and views save nothing.
//! Under `torch.autocast`, every linear casts its input to the compute dtype itself (a fresh
//! copy per linear) and uses a cached low-precision copy of its weight, which it saves.

use crate::arch::{
    Activation, Architecture, AttnType, Block, Family, LayerKind, Linear, Norm, QkNorm,
};
use crate::dtype::DType;
use crate::scenario::{Attention, Finetune, Loss, Recompute, Scenario};
use crate::tape::{Cat, OpExtra, OpSpec, Tape, Tid};

/// The LM head's weight, tied to the embedding: its gradient waits for the embedding's.
const TIED_HEAD: OpExtra = OpExtra {
    tied_head: true,
    ..OpExtra::NONE
};

mod ep;
mod mcore;

/// Which kernel PyTorch's `scaled_dot_product_attention` dispatches to (torch ≥ 2.5, Hopper):
/// flash for fp16/bf16 with head_dim ≤ 256 (GQA included); memory-efficient for other dtypes
/// when key/value heads equal query heads; the unfused math path otherwise (fp32 with GQA:
/// `enable_gqa` is not supported by the memory-efficient kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaKernel {
    Flash,
    MemEfficient,
    Math,
}

/// Head counts and head dimensions of an attention core.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: u64,
    pub kv_heads: u64,
    /// Query/key head dimension.
    pub dq: u64,
    /// Value head dimension.
    pub dv: u64,
}

/// Everything the builders need to know about the run.
#[derive(Clone, Debug)]
pub struct Ctx<'a> {
    pub arch: &'a Architecture,
    pub batch: f64,
    pub seq: f64,
    /// Tokens in the micro-batch (batch × seq).
    pub t: f64,
    /// Compute dtype (activations).
    pub c: DType,
    /// Parameters' dtype.
    pub w: DType,
    /// Gradient dtype.
    pub g: DType,
    pub autocast: bool,
    /// Linear layers save their inputs in fp8 (Transformer Engine).
    pub fp8: bool,
    pub train: bool,
    pub attention: Attention,
    pub recompute: Recompute,
    pub loss: Loss,
    pub finetune: &'a Finetune,
    /// Tensor parallelism (DTensor, torchtitan's plan): the group's size, whether the
    /// norms and residuals work on a slice of the sequence (sequence parallelism), and
    /// whether the loss runs on vocabulary-sharded logits (`loss_parallel`).
    pub tp: f64,
    pub sp: bool,
    pub lp: bool,
    /// Tokens in the sequence-parallel regions (norms, residual stream): `t / tp` under
    /// sequence parallelism, else `t`.
    pub tsp: f64,
    /// Context parallelism: the ranks a sequence is split over (`seq` and `t` are this
    /// rank's slice).
    pub cp: f64,
    /// The model runs as Megatron-LM's GPT model ([`mcore`]), not as transformers writes it.
    pub megatron: bool,
    /// Megatron's weight-gradient GEMMs write into its gradient buffer (gradient-
    /// accumulation fusion): a linear's backward makes no gradient tensor. Off under
    /// Megatron-FSDP, whose units reduce-scatter unsharded gradients.
    pub fused_wgrad: bool,
    /// Expert parallelism: the ranks the routed experts are spread over.
    pub ep: f64,
    /// MoE: tokens each expert takes, relative to an even share.
    pub capacity_factor: f64,
    /// Expert parallelism dispatches tokens by all-to-all (torchtitan's), not transformers'
    /// plan (every rank routes every token).
    pub ep_titan: bool,
    /// Context parallelism with load balancing (see `Parallel::cp_load_balance`).
    pub cp_lb: bool,
}

/// How tensor parallelism splits a linear layer (torchtitan's Llama plan on the Hugging
/// Face module names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TpRole {
    /// Output features split: q/k/v, gate/up, the LM head.
    Col,
    /// Input features split, output partial sums: o_proj, down_proj.
    Row,
    /// Whole on every rank: routers, MLA's down-projections.
    Rep,
}

fn tp_role(module: &str) -> TpRole {
    match module {
        "o_proj" | "down_proj" | "c_proj" => TpRole::Row,
        "gate" | "q_a_proj" | "kv_a_proj_with_mqa" => TpRole::Rep,
        _ => TpRole::Col,
    }
}

impl<'a> Ctx<'a> {
    pub fn new(s: &'a Scenario, arch: &'a Architecture, train: bool) -> Self {
        let p = &s.precision;
        let (batch, seq) = (s.batch as f64, s.seq as f64);
        let par = &s.parallel;
        let tp = if train { par.tp.max(1) } else { 1 };
        let sp = tp > 1 && par.sp;
        let cp = if train { par.cp.max(1) } else { 1 } as f64;
        let seq = seq / cp;
        let t = batch * seq;
        Ctx {
            cp,
            megatron: train && par.framework == crate::scenario::Framework::Megatron,
            fused_wgrad: train
                && par.framework == crate::scenario::Framework::Megatron
                && par.zero < 2,
            ep: if train { par.ep.max(1) } else { 1 } as f64,
            capacity_factor: par.capacity_factor,
            cp_lb: par.cp_load_balance,
            ep_titan: train
                && par.ep > 1
                && par.framework == crate::scenario::Framework::Fsdp
                && par.ep_impl == crate::scenario::EpImpl::Titan,
            arch,
            batch,
            seq,
            t,
            tp: tp as f64,
            sp,
            lp: tp > 1 && par.loss_parallel,
            tsp: if sp { t / tp as f64 } else { t },
            c: p.compute(),
            w: p.weights,
            g: p.grads,
            autocast: p.autocast(),
            fp8: p.activations == DType::F8,
            train,
            attention: s.attention,
            recompute: s.recompute,
            loss: s.loss,
            finetune: &s.finetune,
        }
    }

    /// Whether the base weight of a module is trained.
    fn base_trainable(&self) -> bool {
        self.train && matches!(self.finetune, Finetune::Full)
    }

    fn lora_rank(&self, module: &str) -> Option<f64> {
        match self.finetune {
            Finetune::Lora(l) if self.train && l.targets.iter().any(|t| t == module) => {
                Some(l.rank as f64)
            }
            _ => None,
        }
    }

    fn quantized_base(&self) -> bool {
        matches!(self.finetune, Finetune::Lora(l) if l.quantized) || !self.w.is_float_compute()
    }

    pub fn sdpa_kernel(&self, q_heads: u64, kv_heads: u64, head_dim: u64) -> SdpaKernel {
        if matches!(self.c, DType::Bf16 | DType::F16) && head_dim <= 256 {
            SdpaKernel::Flash
        } else if q_heads == kv_heads {
            SdpaKernel::MemEfficient
        } else {
            SdpaKernel::Math
        }
    }
}

/// A few tensor ids, kept inline (an op's inputs or saved tensors, gathered one by one).
#[derive(Default)]
struct Ids {
    n: usize,
    v: [Tid; 4],
}

impl Ids {
    fn push(&mut self, t: Tid) {
        self.v[self.n] = t;
        self.n += 1;
    }
    #[inline(always)]
    fn all(&self) -> &[Tid] {
        &self.v[..self.n]
    }
}

/// A tape plus the dtype of each tensor on it.
pub struct Builder<'c, 'a> {
    pub tape: Tape,
    dt: Vec<DType>,
    pub ctx: &'c Ctx<'a>,
    /// Tensors the KV cache keeps (inference).
    pub kv: Vec<Tid>,
    /// Ops run outside autocast (in the parameters' dtype).
    native: bool,
    /// Bytes the model's forward holds in locals from the embedding to its end (the eager
    /// attention mask, GPT-2's position embeddings).
    pub locals_hold: f64,
}

impl<'c, 'a> Builder<'c, 'a> {
    pub fn new(ctx: &'c Ctx<'a>) -> Self {
        Builder {
            tape: Tape::new(),
            dt: Vec::with_capacity(64),
            ctx,
            kv: Vec::new(),
            native: false,
            locals_hold: 0.0,
        }
    }

    /// Empty again, as [`Builder::new`] makes one, keeping what it allocated (the next
    /// stretch is recorded on the same vectors).
    pub fn clear(&mut self) {
        self.tape.clear();
        self.dt.clear();
        self.kv.clear();
        self.native = false;
        self.locals_hold = 0.0;
    }

    /// `t` is what the KV cache keeps of this layer (inference).
    fn cache_kv(&mut self, t: Tid) {
        self.tape.set_cat(t, Cat::KvCache);
        self.kv.push(t);
    }

    fn reg(&mut self, t: Tid, d: DType) -> Tid {
        if self.dt.len() <= t {
            self.dt.resize(t + 1, DType::F32);
        }
        self.dt[t] = d;
        self.tape.set_dtype(t, d);
        t
    }

    fn d(&self, t: Tid) -> DType {
        self.dt[t]
    }

    /// Run `f` with the ops it records that name nothing named `name` (the module, as
    /// transformers calls it: the timeline's and the ledgers' labels).
    fn named<T>(&mut self, name: &'static str, f: impl FnOnce(&mut Self) -> T) -> T {
        let prev = self.tape.scope(name);
        let r = f(self);
        self.tape.scope(prev);
        r
    }

    pub fn input(&mut self, elems: f64, d: DType, rg: bool) -> Tid {
        let t = self.tape.input(elems * d.bytes(), rg);
        self.reg(t, d)
    }

    /// A new tensor of `elems` elements of dtype `d` computed from `inputs`.
    fn op(&mut self, inputs: &[Tid], elems: f64, d: DType, saved: &[Tid]) -> Tid {
        let t = self.tape.op(OpSpec {
            inputs,
            out_bytes: elems * d.bytes(),
            saved,
            ..OpSpec::default()
        });
        self.reg(t, d)
    }

    /// A new tensor of `elems` elements of `d` computed from `x` alone, which it does not
    /// save.
    #[inline(never)]
    fn op1(&mut self, x: Tid, elems: f64, d: DType) -> Tid {
        self.op(&[x], elems, d, &[])
    }

    /// An op over `inputs` that saves `saved`, making `bytes` of `d`, with the rarer parts
    /// of its spec in `extra`.
    #[inline(never)]
    fn op_extra(
        &mut self,
        inputs: &[Tid],
        saved: &[Tid],
        bytes: f64,
        d: DType,
        extra: &OpExtra,
    ) -> Tid {
        self.op_spec(
            OpSpec {
                inputs,
                saved,
                out_bytes: bytes,
                extra,
                ..OpSpec::default()
            },
            d,
        )
    }

    /// An op named `name` over `inputs` that saves `saved`, making `bytes` of `d` with
    /// `tmp` bytes of scratch during its forward.
    #[inline(never)]
    fn op_tmp(
        &mut self,
        name: &'static str,
        inputs: &[Tid],
        saved: &[Tid],
        bytes: f64,
        tmp: f64,
        d: DType,
    ) -> Tid {
        self.op_spec(
            OpSpec {
                name,
                inputs,
                saved,
                out_bytes: bytes,
                fwd_temp: tmp,
                ..OpSpec::default()
            },
            d,
        )
    }

    /// An op of a weight with `grads` bytes of gradient (trained unless the base model is
    /// frozen) over `x`, which it saves, making `bytes` of `d` with `tmp` bytes of scratch
    /// during its forward.
    #[inline(never)]
    fn weighted(
        &mut self,
        name: &'static str,
        x: Tid,
        bytes: f64,
        grads: f64,
        tmp: f64,
        d: DType,
    ) -> Tid {
        self.op_spec(
            OpSpec {
                name,
                inputs: &[x],
                out_bytes: bytes,
                saved: &[x],
                weights_rg: self.ctx.base_trainable(),
                param_grads: grads,
                fwd_temp: tmp,
                ..OpSpec::default()
            },
            d,
        )
    }

    fn op_spec(&mut self, spec: OpSpec<'_>, d: DType) -> Tid {
        let t = self.tape.op(spec);
        self.reg(t, d)
    }

    /// An op that saves its own output (tanh, rsqrt, log_softmax).
    fn op_saving_output(&mut self, inputs: &[Tid], elems: f64, d: DType, cat: Cat) -> Tid {
        self.op_saving_output_tmp(inputs, elems, d, cat, 0.0)
    }

    fn op_saving_output_tmp(
        &mut self,
        inputs: &[Tid],
        elems: f64,
        d: DType,
        cat: Cat,
        bwd_temp: f64,
    ) -> Tid {
        let t = self.op_spec(
            OpSpec {
                inputs,
                out_bytes: elems * d.bytes(),
                cat,
                bwd_temp,
                ..OpSpec::default()
            },
            d,
        );
        self.tape.save_self(t);
        t
    }

    /// `softmax` over attention scores. Its CUDA backward first forms `grad * output`, a
    /// temporary the size of the scores (ATen `softmax_backward_cuda_out`).
    ///
    /// Into fp32 from a 16-bit `x`, the kernel reads an fp32 copy of `x`, made first and
    /// freed once the output is written: ATen's `softmax(x, dim, dtype)` fuses the upcast
    /// for fp16 on CUDA only (`half_to_float`), and bf16 takes `x.toType(dtype)`; under
    /// autocast, whose fp32 policy lists softmax, either half is cast before the call.
    fn softmax(&mut self, x: Tid, elems: f64, d: DType) -> Tid {
        let copy = d == DType::F32
            && match self.d(x) {
                DType::Bf16 => true,
                DType::F16 => self.ctx.autocast,
                _ => false,
            };
        let x = if copy { self.op1(x, elems, d) } else { x };
        self.op_saving_output_tmp(&[x], elems, d, Cat::Activations, elems * d.bytes())
    }

    fn cast(&mut self, x: Tid, elems: f64, d: DType) -> Tid {
        if self.d(x) == d {
            return x;
        }
        self.op1(x, elems, d)
    }

    fn add(&mut self, a: Tid, b: Tid, elems: f64) -> Tid {
        let d = promote(self.d(a), self.d(b));
        let t = self.tape.op(OpSpec {
            inputs: &[a, b],
            out_bytes: elems * d.bytes(),
            passthrough: true,
            ..OpSpec::default()
        });
        self.reg(t, d)
    }

    /// `a * b` with both requiring grad potentially: each saves the other. Its backward
    /// (`MulBackward0`) makes `b`'s gradient before `a`'s.
    fn mul(&mut self, a: Tid, b: Tid, elems: f64) -> Tid {
        self.mul_spec(a, b, elems, &OpExtra::NONE)
    }

    /// `a * b` whose backward first makes the temporaries of `extra.bwd_pre` (the product
    /// that a broadcast operand's gradient is summed from).
    fn mul_spec(&mut self, a: Tid, b: Tid, elems: f64, extra: &OpExtra) -> Tid {
        let d = promote(self.d(a), self.d(b));
        let mut saved = Ids::default();
        if self.tape.requires_grad(a) {
            saved.push(b);
        }
        if self.tape.requires_grad(b) {
            saved.push(a);
        }
        // With a broadcast `b` (its gradient a sum of the product in `pre`): that product,
        // then `a`'s gradient, then `b`'s sum.
        let inputs = if extra.bwd_pre[0] > 0.0 {
            [a, b]
        } else {
            [b, a]
        };
        self.op_spec(
            OpSpec {
                inputs: &inputs,
                out_bytes: elems * d.bytes(),
                saved: saved.all(),
                extra,
                ..OpSpec::default()
            },
            d,
        )
    }

    /// Dropout with probability `p` (training): saves a bool mask.
    fn dropout(&mut self, x: Tid, elems: f64, p: f64) -> Tid {
        if p <= 0.0 || !self.ctx.train {
            return x;
        }
        let d = self.d(x);
        let mask = self.op1(x, elems, DType::I8);
        self.op(&[x, mask], elems, d, &[mask])
    }

    /// A linear layer `module` over `x` (`tokens` rows).
    pub fn linear(&mut self, x: Tid, lin: Linear, module: &'static str, tokens: f64) -> Tid {
        self.linear_n(x, lin, module, tokens, 1.0)
    }

    /// The linear layer `lin[i]` (a module's name and shape) over `x`.
    fn proj(&mut self, x: Tid, lin: &[(&'static str, Linear)], i: usize, tokens: f64) -> Tid {
        let (module, l) = lin[i];
        self.linear(x, l, module, tokens)
    }

    /// A linear whose call stands for `copies` weight matrices of shape `lin` (a group of
    /// experts): activations are those of one `lin` over `tokens` rows, weights (copies,
    /// grads, dequantisation) those of all `copies`.
    fn linear_n(
        &mut self,
        x: Tid,
        lin: Linear,
        module: &'static str,
        tokens: f64,
        copies: f64,
    ) -> Tid {
        let ctx = self.ctx;
        // Under tensor parallelism each rank holds a slice of the weight and computes a slice
        // of the output (column-parallel) or a partial sum of all of it (row-parallel).
        let lin = match (ctx.tp > 1.0, tp_role(module)) {
            (false, _) | (_, TpRole::Rep) => lin,
            (true, TpRole::Col) => {
                Linear::new(lin.inp, (lin.out as f64 / ctx.tp).ceil() as u64, lin.bias)
            }
            (true, TpRole::Row) => Linear {
                inp: (lin.inp as f64 / ctx.tp).ceil() as u64,
                ..lin
            },
        };
        let (autocast, c) = if self.native {
            (false, ctx.w)
        } else {
            (ctx.autocast, ctx.c)
        };
        let trainable = ctx.base_trainable();
        let x_rg = self.tape.requires_grad(x);
        let params = lin.params() as f64 * copies;
        let quant = ctx.quantized_base();
        let grad_bytes = params * ctx.g.bytes();
        // The weight as the matmul sees it: an autocast copy (cached for trainable leaves;
        // its backward casts the compute-dtype gradient to the parameter's `.grad`), or a
        // transient dequantised copy for 4/8-bit bases. Autocast casts the weight before
        // the input (ATen evaluates `linear`'s cast arguments right to left), the input for
        // each linear separately.
        let mut wcopy = None;
        let mut fwd_temp = 0.0;
        let mut bwd_temp = 0.0;
        if autocast {
            let t = self.tape.op(OpSpec {
                out_bytes: params * c.bytes(),
                cat: Cat::WeightCopies,
                weights_rg: trainable,
                param_grads: grad_bytes,
                ..OpSpec::default()
            });
            self.reg(t, c);
            if trainable {
                self.tape.cache(t);
            }
            wcopy = Some(t);
        } else if quant {
            fwd_temp = params * c.bytes();
            bwd_temp = params * c.bytes();
        }
        let xin = if autocast {
            self.cast(x, tokens * lin.inp as f64, c)
        } else {
            x
        };
        // fp8: the input is kept in fp8 for the weight grad.
        let saved_in = if ctx.fp8 && trainable {
            self.op1(xin, tokens * lin.inp as f64, DType::F8)
        } else {
            xin
        };
        // Released weight first (the last argument of `mm` first).
        let mut saved = Ids::default();
        if let (Some(w), true) = (wcopy, x_rg) {
            saved.push(w);
        }
        if trainable {
            saved.push(saved_in);
        }
        // The weight's gradient before the input's (`mm` for the weight first).
        let mut inputs = Ids::default();
        if let Some(w) = wcopy {
            inputs.push(w);
        }
        inputs.push(xin);
        if saved_in != xin {
            inputs.push(saved_in);
        }
        let y = self.op_spec(
            OpSpec {
                name: module,
                inputs: inputs.all(),
                out_bytes: tokens * lin.out as f64 * c.bytes(),
                saved: saved.all(),
                weights_rg: trainable && wcopy.is_none(),
                param_grads: grad_bytes,
                fwd_temp,
                bwd_temp,
                grad_view: true,
                ..OpSpec::default()
            },
            c,
        );
        match ctx.lora_rank(module) {
            Some(r) => self.lora(x, y, lin, r, tokens),
            None => y,
        }
    }

    /// peft's LoRA path: `result + lora_B(lora_A(x.to(fp32))) * scaling`, then back to the
    /// result's dtype. Adapters are fp32 (peft's default `autocast_adapter_dtype`).
    fn lora(&mut self, x: Tid, y: Tid, lin: Linear, r: f64, tokens: f64) -> Tid {
        let f32 = DType::F32;
        let (inp, out) = (lin.inp as f64, lin.out as f64);
        let xf = self.cast(x, tokens * inp, f32);
        let a = self.op_spec(
            OpSpec {
                inputs: &[xf],
                out_bytes: tokens * r * 4.0,
                saved: &[xf],
                weights_rg: true,
                param_grads: inp * r * 4.0,
                ..OpSpec::default()
            },
            f32,
        );
        let b = self.op_spec(
            OpSpec {
                inputs: &[a],
                out_bytes: tokens * out * 4.0,
                saved: &[a],
                weights_rg: true,
                param_grads: r * out * 4.0,
                ..OpSpec::default()
            },
            f32,
        );
        let scaled = self.op1(b, tokens * out, f32);
        let sum = self.add(y, scaled, tokens * out);
        let c = self.d(y);
        self.cast(sum, tokens * out, c)
    }

    /// A norm of `width` over `t` rows, computed as `norm` computes it: `stats` per-row
    /// statistics (one per row and head for a per-head norm), a weight of `wparams` elements
    /// (none for Llama 4's L2 norm). Returns the output in the input's dtype.
    fn norm_as(&mut self, x: Tid, width: f64, t: f64, norm: NormOp, wparams: f64) -> Tid {
        let input = self.d(x);
        let f32 = DType::F32;
        let stats = match norm {
            NormOp::Norm(_, groups) | NormOp::L2(groups) => t * groups,
        };
        let e = t * width;
        match norm {
            NormOp::Norm(Norm::LayerNorm, _) => self.layer_norm(x, width, t),
            NormOp::Norm(Norm::CohereLayerNorm, _) => {
                // Mean-centred in fp32: `x - mean` is computed twice (for the variance and
                // for the normalised value), each kept by its consumer.
                let x32 = self.cast(x, e, f32);
                let mean = self.op1(x32, stats, f32);
                let d1 = self.op(&[x32, mean], e, f32, &[]);
                let sq = self.op(&[d1], e, f32, &[d1]);
                let var = self.op1(sq, stats, f32);
                let r = self.op_saving_output(&[var], stats, f32, Cat::Activations);
                let d2 = self.op(&[x32, mean], e, f32, &[]);
                let n32 = self.mul(d2, r, e);
                let w = self.weight_mul_params(n32, e, wparams);
                self.cast(w, e, input)
            }
            NormOp::Norm(Norm::RmsOffset | Norm::RmsWeightFirst, _) => {
                // `(x * rsqrt(mean(x²))) * (1 + w)` (or `w * …`) in fp32, then cast: the fp32
                // normalised value is kept for the weight's grad.
                let x32 = self.cast(x, e, f32);
                let sq = self.op(&[x32], e, f32, &[x32]);
                let var = self.op1(sq, stats, f32);
                let r = self.op_saving_output(&[var], stats, f32, Cat::Activations);
                let n32 = self.mul(x32, r, e);
                let w = self.weight_mul_params(n32, e, wparams);
                self.cast(w, e, input)
            }
            NormOp::Norm(Norm::Rms, _) => {
                // LlamaRMSNorm: `variance = x32.pow(2).mean(-1)` and the fp32 normalised
                // value are locals until it returns; `variance + eps` goes after `rsqrt`.
                // The backward's temporaries: `pow`'s `x.pow(1) * 2`, the product that
                // rsqrt's gradient is summed from, rsqrt's `r³ · −½`.
                let x32 = self.cast(x, e, f32);
                let pow = OpExtra {
                    bwd_pre: [e * 4.0, e * 4.0],
                    ..OpExtra::NONE
                };
                let sq = self.op_extra(&[x32], &[x32], e * 4.0, f32, &pow);
                let var = self.op1(sq, stats, f32);
                let ve = self.op_spec(
                    OpSpec {
                        inputs: &[var],
                        out_bytes: stats * 4.0,
                        passthrough: true,
                        ..OpSpec::default()
                    },
                    f32,
                );
                let rsqrt = OpExtra {
                    bwd_pre: [stats * 4.0, stats * 4.0],
                    ..OpExtra::NONE
                };
                let r = self.op_extra(&[ve], &[], stats * 4.0, f32, &rsqrt);
                self.tape.save_self(r);
                let n32 = self.mul_spec(
                    x32,
                    r,
                    e,
                    &OpExtra {
                        bwd_pre: [e * 4.0, 0.0],
                        ..OpExtra::NONE
                    },
                );
                let n = self.cast(n32, e, input);
                let out = self.weight_mul_params(n, e, wparams);
                self.tape.touch(&[n32, var]);
                out
            }
            NormOp::L2(_) => {
                let x32 = self.cast(x, e, f32);
                let sq = self.op(&[x32], e, f32, &[x32]);
                let var = self.op1(sq, stats, f32);
                let r = self.op_saving_output(&[var], stats, f32, Cat::Activations);
                let n32 = self.mul(x32, r, e);
                self.cast(n32, e, input)
            }
        }
    }

    /// RMSNorm as Llama writes it: upcast, pow, mean, rsqrt, mul, downcast, weight mul.
    fn rms_norm(&mut self, x: Tid, width: f64, t: f64) -> Tid {
        self.norm_as(x, width, t, NormOp::Norm(Norm::Rms, 1.0), width)
    }

    /// `weight * x` over `elems` elements with a weight of `wparams` elements (none: a
    /// weightless norm leaves `x` as it is).
    fn weight_mul_params(&mut self, n: Tid, elems: f64, wparams: f64) -> Tid {
        if wparams <= 0.0 {
            return n;
        }
        let trainable = self.ctx.base_trainable();
        let d = self.d(n);
        let one = [n];
        let saved: &[Tid] = if trainable { &one } else { &[] };
        // The weight's gradient is `(grad * n)` summed over the tokens, made after `n`'s.
        let product = if wparams < elems {
            elems * d.bytes()
        } else {
            0.0
        };
        self.op_spec(
            OpSpec {
                inputs: &[n],
                out_bytes: elems * d.bytes(),
                saved,
                weights_rg: trainable,
                param_grads: wparams * self.ctx.g.bytes(),
                extra: &OpExtra {
                    param_last: product,
                    ..OpExtra::NONE
                },
                ..OpSpec::default()
            },
            d,
        )
    }

    /// `nn.LayerNorm` (one fused op): saves its input and per-row statistics.
    fn layer_norm(&mut self, x: Tid, width: f64, t: f64) -> Tid {
        let trainable = self.ctx.base_trainable();
        let d = self.d(x);
        // Under autocast layer_norm runs (and returns) fp32.
        let out_d = if self.ctx.autocast { DType::F32 } else { d };
        let stats = self.op1(x, 2.0 * t, DType::F32);
        self.op_spec(
            OpSpec {
                inputs: &[x, stats],
                out_bytes: t * width * out_d.bytes(),
                saved: &[x, stats],
                weights_rg: trainable,
                param_grads: 2.0 * width * self.ctx.g.bytes(),
                ..OpSpec::default()
            },
            out_d,
        )
    }

    /// The model's norm over `t` tokens of `width`.
    fn norm(&mut self, x: Tid, width: f64, t: f64) -> Tid {
        self.norm_as(x, width, t, NormOp::Norm(self.ctx.arch.norm, 1.0), width)
    }

    /// Into the tensor-parallel region: a column-parallel linear needs its input whole. Under
    /// sequence parallelism the slices are all-gathered (DTensor lays the gathered chunks
    /// out along the sequence: a second buffer of the whole); its backward reduce-scatters
    /// the gradient (the chunks laid out again, the output, and a copy). Without it the
    /// input is the same tensor, and its backward all-reduces the gradient (out of place).
    fn enter_tp(&mut self, y: Tid, width: f64) -> Tid {
        let ctx = self.ctx;
        if ctx.tp <= 1.0 {
            return y;
        }
        let d = self.d(y);
        let whole = ctx.t * width * d.bytes();
        if ctx.sp {
            let slice = ctx.tsp * width * d.bytes();
            self.op_spec(
                OpSpec {
                    name: "sequence-parallel all-gather",
                    inputs: &[y],
                    out_bytes: whole,
                    cat: Cat::Comm,
                    fwd_temp: whole,
                    bwd_temp: whole + slice,
                    ..OpSpec::default()
                },
                d,
            )
        } else {
            let v = self.tape.split(y, &[whole]);
            self.reg(v[0], d);
            self.tape.set_bwd_temp_last(whole);
            v[0]
        }
    }

    /// Out of the tensor-parallel region: a row-parallel linear's partial sums are
    /// reduce-scattered to the sequence slice (sequence parallelism: the chunks laid out
    /// first, then the output and a copy of it) or all-reduced whole (out of place, with a
    /// copy). The backward of the reduce-scatter all-gathers the gradient; that of the
    /// all-reduce is nothing.
    fn leave_tp(&mut self, o: Tid, width: f64) -> Tid {
        let ctx = self.ctx;
        if ctx.tp <= 1.0 {
            return o;
        }
        let d = self.d(o);
        let whole = ctx.t * width * d.bytes();
        if ctx.sp {
            let slice = ctx.tsp * width * d.bytes();
            self.op_spec(
                OpSpec {
                    name: "sequence-parallel reduce-scatter",
                    inputs: &[o],
                    out_bytes: slice,
                    fwd_temp: whole + slice,
                    bwd_temp: whole,
                    ..OpSpec::default()
                },
                d,
            )
        } else {
            self.op_spec(
                OpSpec {
                    name: "tensor-parallel all-reduce",
                    inputs: &[o],
                    out_bytes: whole,
                    fwd_temp: whole,
                    passthrough: true,
                    ..OpSpec::default()
                },
                d,
            )
        }
    }

    /// Rotary embedding on a projection of `elems` elements, as the family writes it (see
    /// [`RopeStyle`]). The tables are fp32 under autocast, so the result promotes.
    /// `tables`: copies of the rotary tables the call makes, which the products save.
    fn rope(&mut self, x: Tid, elems: f64, style: RopeStyle, tables: &[Tid]) -> Tid {
        let d = if self.ctx.autocast {
            DType::F32
        } else {
            self.d(x)
        };
        if style == RopeStyle::Plain {
            // `(x * cos) + (rotate_half(x) * sin)`, rotate_half being `cat((-x2, x1))` over
            // the halves of the head dim: each a tensor of its own, the products in the
            // tables' dtype (fp32 under autocast).
            let dx = self.d(x);
            // Under autocast the products are fp32: their gradients are made in fp32, then
            // cast to the bf16 input's (`validate_outputs`).
            let products = OpExtra {
                bwd_pre: [if d != dx { elems * d.bytes() } else { 0.0 }, 0.0],
                ..OpExtra::NONE
            };
            let xc = self.op_extra(&[x], &[], elems * d.bytes(), d, &products);
            // rotate_half: the first half a view (its backward `slice_backward`, a tensor of
            // x's size); `-x2`'s backward negates (half the size) and pads (x's size); `cat`'s
            // backward only views its gradient.
            let x1 = self.tape.split(x, &[self.tape.bytes(x) / 2.0])[0];
            self.reg(x1, dx);
            let half = elems / 2.0 * dx.bytes();
            let negated = OpExtra {
                bwd_pre: [half, 0.0],
                ..OpExtra::NONE
            };
            let neg = self.op_extra(&[x], &[], half, dx, &negated);
            let viewed = OpExtra {
                grad_views: true,
                ..OpExtra::NONE
            };
            let rot = self.op_extra(&[neg, x1], &[], elems * dx.bytes(), dx, &viewed);
            let rs = self.op_extra(&[rot], &[], elems * d.bytes(), d, &products);
            return self.add(xc, rs, elems);
        }
        let tmp = match style {
            RopeStyle::Plain => 2.0 * elems * d.bytes(),
            RopeStyle::Cat => 3.0 * elems * d.bytes(),
            // The two fp32 products and their sum are alive together; the result is cast
            // back once the products are freed, beside the sum.
            RopeStyle::Fp32 => elems * (3.0 * 4.0 - d.bytes()),
        };
        self.op_tmp("rotary embedding", &[x], tables, elems * d.bytes(), tmp, d)
    }

    /// How this model applies RoPE.
    /// Cohere's `apply_rotary_pos_emb` without autograd, op by op: q and k upcast to fp32,
    /// each `(x * cos) + (rotate_half(x) * sin)` (rotate_half a `stack` of `-x2` and `x1`,
    /// interleaved), both results cast back only as it returns; the fp32 copies and
    /// results are its locals until then.
    fn cohere_rope_nograd(&mut self, q: Tid, k: Tid, qe: f64, ke: f64) -> (Tid, Tid) {
        let f = DType::F32;
        let (dq, dk) = (self.d(q), self.d(k));
        let q32 = self.op1(q, qe, f);
        let k32 = self.op1(k, ke, f);
        let mut rotated = [0; 2];
        for (j, (x, e)) in [(q32, qe), (k32, ke)].into_iter().enumerate() {
            let xc = self.op1(x, e, f);
            let neg = self.op1(x, e / 2.0, f);
            let st = self.op(&[neg, x], e, f, &[]);
            let xs = self.op1(st, e, f);
            rotated[j] = self.op(&[xc, xs], e, f, &[]);
        }
        let qo = self.op1(rotated[0], qe, dq);
        let ko = self.op1(rotated[1], ke, dk);
        self.tape.touch(&[q, k, q32, k32, rotated[0], rotated[1]]);
        (qo, ko)
    }

    fn rope_style(&self) -> RopeStyle {
        let a = self.ctx.arch;
        match a.family {
            Family::Cohere
            | Family::Cohere2
            | Family::Olmo2
            | Family::Olmo3
            | Family::Llama4
            | Family::Ernie45 => RopeStyle::Fp32,
            // Their rotation ends in `cat((rotated, passed))` even when nothing passes.
            Family::Phi3 | Family::GptNeox | Family::GptOss | Family::Glm4 | Family::MiniMaxM2 => {
                RopeStyle::Cat
            }
            _ if a.rope_dim < a.head_dim => RopeStyle::Cat,
            _ => RopeStyle::Plain,
        }
    }

    /// Whether layers of `kind` attend through an explicit mask under SDPA: a sliding or
    /// chunked layer once the sequence reaches its window (transformers skips the mask, and
    /// lets SDPA run causally, only while every token sees all earlier ones).
    fn masked(&self, kind: LayerKind) -> bool {
        let a = self.ctx.arch;
        let s = self.ctx.seq * self.ctx.cp;
        let reaches = |w: Option<u64>| w.is_some_and(|w| s >= w as f64);
        match kind.attn {
            AttnType::Sliding => reaches(a.sliding_window),
            AttnType::Chunked => reaches(a.chunk),
            AttnType::Full | AttnType::Linear => false,
        }
    }

    /// The attention core over q (heads × dq), k (kv_heads × dq), v (kv_heads × dv); returns
    /// the output as `[tokens, heads × dv]`. `mask`: SDPA is given an explicit mask;
    /// `copy_out`: the query was made contiguous (a `cat` in its RoPE), so SDPA's output is
    /// laid out head-major and the model's `transpose(1, 2).contiguous()` copies it.
    fn attention_core(
        &mut self,
        q: Tid,
        k: Tid,
        v: Tid,
        shape: Heads,
        mask: bool,
        copy_out: bool,
    ) -> Tid {
        let Heads {
            heads,
            kv_heads,
            dq,
            dv,
        } = shape;
        let ctx = self.ctx;
        let a = ctx.arch;
        let (t, b, s) = (ctx.t, ctx.batch, ctx.seq);
        let c = ctx.c;
        let (hq, hk) = (heads as f64, kv_heads as f64);
        let out_elems = t * hq * dv as f64;
        let scores = b * hq * s * s;
        let p_drop = if ctx.train { a.dropout.attn } else { 0.0 };
        let selective = ctx.recompute == Recompute::Selective && ctx.train;
        // Inputs under autocast are cast to the compute dtype by sdpa/matmul (its
        // arguments cast right to left, as ATen's autocast wrapper evaluates them).
        let v = self.cast(v, t * hk * dv as f64, c);
        let k = self.cast(k, t * hk * dq as f64, c);
        let q = self.cast(q, t * hq * dq as f64, c);
        // Falcon's multi-query attention calls SDPA with one key/value head for all query
        // heads and no `enable_gqa`: neither flash nor the memory-efficient kernel takes that.
        let mqa_broadcast = a.family == Family::Falcon && heads != kv_heads;
        let kernel = if mqa_broadcast {
            SdpaKernel::Math
        } else if dq != dv && ctx.attention == Attention::Sdpa {
            // Flash needs equal head dims; the memory-efficient kernel does not.
            SdpaKernel::MemEfficient
        } else if mask && matches!(c, DType::Bf16 | DType::F16) {
            // Flash takes no arbitrary mask.
            SdpaKernel::MemEfficient
        } else {
            ctx.sdpa_kernel(heads, kv_heads, dq)
        };
        // With a mask transformers repeats K/V to every query head itself (a copy, unless a
        // single head broadcasts as a view).
        let repeat = |bld: &mut Self, x: Tid, d: u64| -> Tid {
            if mask && kv_heads > 1 && kv_heads != heads {
                bld.op(&[x], t * hq * d as f64, c, &[])
            } else {
                x
            }
        };
        match (ctx.attention, kernel) {
            (Attention::Sdpa, SdpaKernel::Flash | SdpaKernel::MemEfficient) => {
                let k = repeat(self, k, dq);
                let v = repeat(self, v, dv);
                let mut inputs = Ids {
                    n: 3,
                    v: [q, k, v, 0],
                };
                if mask {
                    // SDPA turns the boolean mask into an additive one in the query's dtype;
                    // the memory-efficient kernel keeps it for backward.
                    let m = self.op(&[], b * s * s, c, &[]);
                    inputs.push(m);
                }
                // Saves q, k, v, the output and the per-row logsumexp; backward accumulates dq
                // in fp32.
                let lse = b * hq * s * 4.0;
                let mut fwd_temp = lse;
                let mut bwd_temp = t * hq * dq as f64 * 4.0 + lse;
                let mut aux_out = 0.0;
                let mut bwd_stack = [0.0; 4];
                if kernel == SdpaKernel::Flash && ctx.cp <= 1.0 {
                    // Flash attention (ATen's `mha_fwd`/`mha_bwd`): the logsumexp is an output
                    // kept for the backward, which makes dq, dk and dv and then, for itself,
                    // `softmax_d` and an fp32 dq accumulator over the sequence rounded up to
                    // 128 (and the head dim to 32 or 64), and under grouped-query attention dk
                    // and dv for every query head, freed in reverse.
                    let round = |x: f64, m: f64| (x / m).ceil() * m;
                    let s_r = round(s, 128.0);
                    let d_r = round(dq as f64, if dq <= 128 { 32.0 } else { 64.0 });
                    fwd_temp = 0.0;
                    bwd_temp = 0.0;
                    aux_out = lse;
                    bwd_stack[0] = b * hq * s_r * 4.0;
                    bwd_stack[1] = b * s_r * hq * d_r * 4.0;
                    if kv_heads != heads && !mask {
                        let expanded = t * hq * dq as f64 * c.bytes();
                        bwd_stack[2] = expanded;
                        bwd_stack[3] = expanded;
                    }
                }
                if ctx.cp > 1.0 {
                    // Ring attention (torch's context_parallel, K/V rotated by all-gather):
                    // this rank's K and V laid out, the whole sequence's K and V gathered (and
                    // copied), the output merged in fp32 step by step. Its backward gathers K
                    // and V again and accumulates dQ, dK and dV in fp32, dK and dV sent back
                    // by an all-to-all.
                    let kv = t * (hk * dq as f64 + hk * dv as f64) * c.bytes();
                    let q32 = t * hq * dq as f64 * 4.0;
                    let whole = ctx.cp * kv;
                    fwd_temp += 2.0 * whole + 2.0 * q32 + 2.0 * kv;
                    bwd_temp += 2.0 * whole + 2.0 * kv + 4.0 * kv;
                }
                let o = self.op_spec(
                    OpSpec {
                        name: "sdpa (flash)",
                        inputs: inputs.all(),
                        out_bytes: out_elems * c.bytes(),
                        saved: inputs.all(),
                        fwd_temp,
                        bwd_temp,
                        extra: &OpExtra {
                            aux_out,
                            bwd_stack,
                            ..OpExtra::NONE
                        },
                        ..OpSpec::default()
                    },
                    c,
                );
                self.tape.save_self(o);
                if (ctx.cp > 1.0 && ctx.cp_lb) || copy_out {
                    // The output comes back as (batch, heads, seq, dim) (under context
                    // parallelism with load balancing, on the ranks that merge partial
                    // outputs: the first, the worst): the model's transpose().contiguous() is
                    // a real copy, which the output projection saves.
                    return self.op1(o, out_elems, c);
                }
                o
            }
            (Attention::Sdpa, SdpaKernel::Math) => {
                // ATen's math path, in fp32 for 16-bit inputs (torch ≥ 2.5 upcasts unless
                // reduced-precision math is allowed): scale q, repeat k and v to all heads
                // (a broadcast single head stays a view), matmul, mask, softmax (saved),
                // matmul, cast back.
                //
                // Falcon passes its boolean mask (always made): SDPA first turns it into an
                // additive one in the query's dtype, and the math path keeps it, the fp32
                // copies of q, k and v and the scaled q, as locals until it returns. Without a mask it makes a
                // causal one, `[s, s]` boolean then in its dtype, for the product.
                let m = if c.bytes() < 4.0 { DType::F32 } else { c };
                let qe = t * hq * dq as f64;
                let hk_rep = if mqa_broadcast { hk } else { hq };
                let explicit =
                    (mask || a.family == Family::Falcon).then(|| self.op(&[], b * s * s, c, &[]));
                let qm = self.cast(q, qe, m);
                let qs = self.op1(qm, qe, m);
                let km = self.cast(k, t * hk * dq as f64, m);
                let kr = if hk_rep != hk {
                    self.op1(km, t * hk_rep * dq as f64, m)
                } else {
                    km
                };
                let qk = [qs, kr];
                let sc = self.op_tmp(
                    "",
                    &qk,
                    if selective { &[] } else { &qk },
                    scores * m.bytes(),
                    if explicit.is_some() {
                        0.0
                    } else {
                        s * s * (1.0 + m.bytes())
                    },
                    m,
                );
                let p = self.softmax(sc, scores, m);
                let vm = self.cast(v, t * hk * dv as f64, m);
                let vr = if hk_rep != hk {
                    self.op1(vm, t * hk_rep * dv as f64, m)
                } else {
                    vm
                };
                // A single broadcast key/value head is expanded to every query head, and
                // `matmul` copies the expansion to batch it: a transient as large as the
                // queries for each product.
                let expanded = if mqa_broadcast && !ctx.train {
                    t * hq * dv as f64 * m.bytes()
                } else {
                    0.0
                };
                let o = self.op_tmp("", &[p, vr], &[p, vr], out_elems * m.bytes(), expanded, m);
                self.tape.touch(&[qm, qs, km, vm]);
                if let Some(x) = explicit {
                    self.tape.touch(&[x]);
                }
                let o = self.cast(o, out_elems, c);
                // (b, h, s, d) → (b, s, h·d): a contiguous copy.
                self.op1(o, out_elems, c)
            }
            (Attention::Eager, _) if selective => {
                // Selective recomputation (Korthikanti et al. 2022, §5): the attention core
                // keeps only q, k, v and its output; backward recomputes scores and
                // probabilities (scores in the compute dtype, fp32 probabilities, their grads).
                let s2 = scores * (2.0 * c.bytes() + 4.0 + 4.0);
                let o = self.op_spec(
                    OpSpec {
                        inputs: &[q, k, v],
                        out_bytes: out_elems * c.bytes(),
                        saved: &[q, k, v],
                        fwd_temp: s2,
                        bwd_temp: s2,
                        ..OpSpec::default()
                    },
                    c,
                );
                self.tape.save_self(o);
                o
            }
            (Attention::Eager, _) => self.eager_attention(q, k, v, shape, p_drop),
        }
    }

    fn eager_attention(&mut self, q: Tid, k: Tid, v: Tid, shape: Heads, p_drop: f64) -> Tid {
        let Heads {
            heads,
            kv_heads,
            dq,
            dv,
        } = shape;
        let ctx = self.ctx;
        let a = ctx.arch;
        let (t, b, s, c) = (ctx.t, ctx.batch, ctx.seq, ctx.c);
        let hq = heads as f64;
        let scores = b * hq * s * s;
        let out_elems = t * hq * dv as f64;
        // repeat_kv: a copy unless one head broadcasts.
        let (kr, vr) = if heads != kv_heads && kv_heads > 1 {
            (
                self.op1(k, t * hq * dq as f64, c),
                self.op1(v, t * hq * dv as f64, c),
            )
        } else {
            (k, v)
        };
        let sc = self.op(&[q, kr], scores, c, &[q, kr]);
        let mut scaled = self.op1(sc, scores, c);
        if a.attn_softcap {
            // Gemma 2: `tanh(scores / cap) * cap`; tanh keeps its output.
            let div = self.op1(scaled, scores, c);
            let th = self.op_saving_output(&[div], scores, c, Cat::Activations);
            scaled = self.op1(th, scores, c);
        }
        let masked = self.op1(scaled, scores, c);
        let mut held = None;
        let p = match a.family {
            // GPT-2: softmax in the compute dtype (fp32 under autocast), then `.type(v.dtype)`.
            Family::Gpt2 => {
                let sd = if ctx.autocast { DType::F32 } else { c };
                let p = self.softmax(masked, scores, sd);
                self.cast(p, scores, c)
            }
            // gpt-oss: the sinks are a last column of the scores; the row max is subtracted
            // and the softmax runs in the scores' dtype (its output, sinks included, is kept).
            // The masked scores stay bound to `attn_weights` until the probabilities are,
            // and the shifted logits to `combined_logits` until the function returns.
            _ if a.sinks => {
                let wide = b * hq * s * (s + 1.0);
                let cat = self.op1(masked, wide, c);
                let max = self.op1(cat, b * hq * s * 2.0, c);
                let sub = self.op(&[cat, max], wide, c, &[]);
                let p = self.softmax(sub, wide, c);
                self.tape.touch(&[masked]);
                held = Some(sub);
                p
            }
            // Llama & co: `attn_weights = softmax(attn_weights, dtype=float32).to(query.dtype)`
            // rebinds the masked scores only once the cast is made.
            _ => {
                let p32 = self.softmax(masked, scores, DType::F32);
                let p = self.cast(p32, scores, c);
                self.tape.touch(&[masked]);
                p
            }
        };
        let pd = self.dropout(p, scores, p_drop);
        let o = self.op(&[pd, vr], out_elems, c, &[pd, vr]);
        let o = self.op1(o, out_elems, c);
        // `repeat_kv`'s copies are locals of the attention function until it returns.
        if kr != k {
            self.tape.touch(&[kr, vr]);
        }
        if let Some(h) = held {
            self.tape.touch(&[h]);
        }
        o
    }

    /// The layer's token mixer over `y` (its normed input, whole under tensor parallelism);
    /// returns the output projection's result (a partial sum under tensor parallelism).
    fn attention(&mut self, y: Tid, kind: LayerKind) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let h = a.hidden as f64;
        let tp = ctx.tp;
        let c = ctx.c;
        if kind.attn == AttnType::Linear {
            return self.linear_attention(y);
        }
        let lin = a.attention_linears_of(kind.attn);
        if let Some(m) = &a.mla {
            return self.mla_attention(y, &lin, m.clone());
        }
        // Heads on this rank.
        let (heads, kv_heads) = (
            (a.heads as f64 / tp) as u64,
            (a.kv_heads as f64 / tp) as u64,
        );
        let hd = a.head_dim;
        if a.family == Family::Gpt2 {
            let qkv = self.proj(y, &lin, 0, t);
            let e = t * h / tp * c.bytes();
            let parts = self.tape.split(qkv, &[e, e, e]);
            for &p in &parts {
                self.reg(p, c);
            }
            // generate(): the cache concatenates each layer's keys and values into tensors
            // of its own (`torch.cat`), which attention then reads; marking the views would
            // keep the whole projection.
            let (k, v) = if ctx.train {
                (parts[1], parts[2])
            } else {
                let k = self.op1(parts[1], t * h / tp, c);
                let v = self.op1(parts[2], t * h / tp, c);
                self.cache_kv(k);
                self.cache_kv(v);
                (k, v)
            };
            let core = self.attention_core(
                parts[0],
                k,
                v,
                Heads {
                    heads,
                    kv_heads: heads,
                    dq: hd,
                    dv: hd,
                },
                false,
                false,
            );
            return self.proj(core, &lin, 1, t);
        }
        let qe = t * (heads * hd) as f64;
        let ke = t * (kv_heads * hd) as f64;
        // q, k and v: one fused projection split into views, or three.
        let mut fused_kv = None;
        let (mut q, mut k, v, gate) = if a.fused_qkv {
            let qkv = self.proj(y, &lin, 0, t);
            let d = self.d(qkv);
            let parts = self
                .tape
                .split(qkv, &[qe * d.bytes(), ke * d.bytes(), ke * d.bytes()]);
            for &p in &parts {
                self.reg(p, d);
            }
            fused_kv = Some((parts[1], parts[2], qkv));
            (parts[0], parts[1], parts[2], None)
        } else {
            // `q_proj(x).view(…).transpose(1, 2)`: once rotated, the gradient comes back
            // transposed and the view's backward copies it (`clone`), each right after its
            // projection.
            let rope = !kind.nope && a.rope_dim > 0 && !a.attn_gate;
            let viewed = |b: &mut Self, x: Tid| -> Tid {
                if !rope {
                    return x;
                }
                let d = b.d(x);
                let v = b.tape.split(x, &[b.tape.bytes(x)])[0];
                b.reg(v, d)
            };
            let q = self.proj(y, &lin, 0, t);
            let q = viewed(self, q);
            let (q, gate) = if a.attn_gate {
                // Qwen3-Next: q_proj gives the query and a gate, interleaved per head; the
                // gate's reshape is a copy.
                let d = self.d(q);
                let parts = self.tape.split(q, &[qe * d.bytes(), qe * d.bytes()]);
                for &p in &parts {
                    self.reg(p, d);
                }
                let g = self.op1(parts[1], qe, d);
                (parts[0], Some(g))
            } else {
                (q, None)
            };
            let k = self.proj(y, &lin, 1, t);
            let k = viewed(self, k);
            let v = self.proj(y, &lin, 2, t);
            (q, k, v, gate)
        };
        let rope = !kind.nope && a.rope_dim > 0;
        let style = self.rope_style();
        let norm = |b: &mut Self, x: Tid, n: f64, e: f64, before_rope: bool| -> Tid {
            match a.qk_norm {
                QkNorm::Head if before_rope => {
                    b.norm_as(x, n * hd as f64, t, NormOp::Norm(a.norm, n), hd as f64)
                }
                QkNorm::Full if before_rope => {
                    b.norm_as(x, e / t, t, NormOp::Norm(a.norm, 1.0), e / t)
                }
                QkNorm::CohereHead if before_rope => b.norm_as(
                    x,
                    n * hd as f64,
                    t,
                    NormOp::Norm(Norm::CohereLayerNorm, n),
                    n * hd as f64,
                ),
                QkNorm::HeadAfterRope if !before_rope => {
                    b.norm_as(x, n * hd as f64, t, NormOp::Norm(a.norm, n), hd as f64)
                }
                // Llama 4 normalises after RoPE, on RoPE layers only.
                QkNorm::L2 if !before_rope && rope => {
                    b.norm_as(x, n * hd as f64, t, NormOp::L2(n), 0.0)
                }
                _ => x,
            }
        };
        let (hq, hk) = (heads as f64, kv_heads as f64);
        q = norm(self, q, hq, qe, true);
        k = norm(self, k, hk, ke, true);
        if rope && !ctx.train && matches!(a.family, Family::Cohere | Family::Cohere2) {
            (q, k) = self.cohere_rope_nograd(q, k, qe, ke);
        } else if rope {
            // `apply_rotary_pos_emb(q, k, …)` holds both until it returns. GLM's and ERNIE's
            // first repeat each of the tables' first halves twice (`repeat_interleave`, to
            // rotate interleaved pairs): two new tensors, which the products save (ERNIE's
            // tables are fp32).
            let tables = if matches!(a.family, Family::Glm4 | Family::Ernie45) {
                let td = if ctx.autocast || a.family == Family::Ernie45 {
                    DType::F32
                } else {
                    self.d(q)
                };
                let e = ctx.t * a.rope_dim as f64;
                vec![self.op(&[], e, td, &[]), self.op(&[], e, td, &[])]
            } else {
                Vec::new()
            };
            let (q0, k0) = (q, k);
            q = self.rope(q, qe, style, &tables);
            k = self.rope(k, ke, style, &tables);
            self.tape.touch(&[q0, k0]);
            self.tape.touch(&tables);
        }
        q = norm(self, q, hq, qe, false);
        k = norm(self, k, hk, ke, false);
        if a.family == Family::Llama4 && kind.nope {
            // Attention temperature tuning on NoPE layers: q times fp32 scales, cast back.
            let q32 = self.op1(q, qe, DType::F32);
            q = self.cast(q32, qe, self.d(q));
        } else if a.family == Family::Ministral3 {
            // Every layer's rotated queries times the scales, cast to their dtype first.
            q = self.op1(q, qe, self.d(q));
        }
        // Falcon's new decoder broadcasts each key/value head to its query heads and
        // flattens them: copies as wide as the queries.
        let (k, v, kv_heads) = if a.kv_expanded && kv_heads != heads {
            (
                self.op1(k, qe, self.d(k)),
                self.op1(v, qe, self.d(v)),
                heads,
            )
        } else {
            (k, v, kv_heads)
        };
        // The cache keeps its own tensors (`torch.cat` onto its empty ones); one of
        // a fused projection's views, if kept, would keep the whole projection.
        let (k, v) = match fused_kv {
            Some((fk, fv, _)) if !ctx.train => {
                let copy = |b: &mut Self, x: Tid, of: Tid, e: f64| {
                    if x == of {
                        b.op(&[x], e, b.d(x), &[])
                    } else {
                        x
                    }
                };
                (copy(self, k, fk, ke), copy(self, v, fv, ke))
            }
            _ => (k, v),
        };
        if !ctx.train {
            self.cache_kv(k);
            self.cache_kv(v);
        }
        let mask = self.masked(kind) && ctx.attention == Attention::Sdpa;
        let copy_out = rope && style == RopeStyle::Cat;
        let mut core = self.attention_core(
            q,
            k,
            v,
            Heads {
                heads,
                kv_heads,
                dq: hd,
                dv: hd,
            },
            mask,
            copy_out,
        );
        if let Some(g) = gate {
            let sg = self.op_saving_output(&[g], qe, self.d(g), Cat::Activations);
            core = self.mul(core, sg, qe);
        }
        let o_proj = lin[lin.len() - 1];
        let out = self.linear(core, o_proj.1, o_proj.0, t);
        // The attention's locals (the rotated q and k, a fused projection's output) go
        // when it returns.
        self.tape.touch(&[q, k]);
        if let Some((_, _, qkv)) = fused_kv {
            self.tape.touch(&[qkv]);
        }
        out
    }

    /// DeepSeek's multi-head latent attention (transformers `DeepseekV3Attention`): the
    /// compressed latent and the shared RoPE key are what the cache keeps; keys and values
    /// are expanded from the latent for the attention (the values a view of `kv_b_proj`'s
    /// output, the keys a new tensor), and the query is a `cat` of its two parts.
    fn mla_attention(
        &mut self,
        y: Tid,
        lin: &[(&'static str, Linear)],
        m: crate::arch::Mla,
    ) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let heads = a.heads as f64 / ctx.tp;
        let mut i = 0;
        let q = if m.q_lora_rank.is_some() {
            let qa = self.proj(y, lin, 0, t);
            let qn = self.rms_norm(qa, lin[0].1.out as f64, t);
            i = 2;
            self.proj(qn, lin, 1, t)
        } else {
            i += 1;
            self.proj(y, lin, 0, t)
        };
        let kva = self.proj(y, lin, i, t);
        let d = self.d(kva);
        let parts = self.tape.split(
            kva,
            &[
                t * m.kv_lora_rank as f64 * d.bytes(),
                t * m.qk_rope_head_dim as f64 * d.bytes(),
            ],
        );
        for &p in &parts {
            self.reg(p, d);
        }
        let kvn = self.rms_norm(parts[0], m.kv_lora_rank as f64, t);
        let dq = m.qk_nope_head_dim + m.qk_rope_head_dim;
        let style = RopeStyle::Plain;
        let qr = self.rope(q, t * heads * m.qk_rope_head_dim as f64, style, &[]);
        let kr = self.rope(parts[1], t * m.qk_rope_head_dim as f64, style, &[]);
        if !ctx.train {
            self.cache_kv(kvn);
            self.cache_kv(kr);
        }
        let query = self.op(&[q, qr], t * heads * dq as f64, ctx.c, &[]);
        let kvb = self.proj(kvn, lin, i + 1, t);
        let kvd = self.d(kvb);
        let nv = (m.qk_nope_head_dim + m.v_head_dim) as f64;
        let kparts = self.tape.split(
            kvb,
            &[
                t * heads * m.qk_nope_head_dim as f64 * kvd.bytes(),
                t * heads * m.v_head_dim as f64 * kvd.bytes(),
            ],
        );
        for &p in &kparts {
            self.reg(p, kvd);
        }
        let _ = nv;
        let key = self.op(&[kparts[0], kr], t * heads * dq as f64, ctx.c, &[]);
        let core = self.attention_core(
            query,
            key,
            kparts[1],
            Heads {
                heads: heads as u64,
                kv_heads: heads as u64,
                dq,
                dv: m.v_head_dim,
            },
            false,
            true,
        );
        self.proj(core, lin, i + 2, t)
    }

    /// Qwen3-Next's gated DeltaNet over `y`, as transformers' torch fallback runs it
    /// (`torch_chunk_gated_delta_rule`, chunks of 64 tokens, fp32 inside): the projections,
    /// the short causal convolution, fp32 queries, keys and values padded to whole chunks, the
    /// per-chunk decay and triangular solves, a state per chunk, and the gated RMSNorm.
    fn linear_attention(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let x = a.linear.as_ref().expect("a linear-attention layer");
        let t = ctx.t;
        let c = ctx.c;
        let f32 = DType::F32;
        let tp = ctx.tp;
        let lin = a.attention_linears_of(AttnType::Linear);
        let nk = (x.key_heads as f64 / tp).max(1.0);
        let nv = (x.value_heads as f64 / tp).max(1.0);
        let (dk, dv) = (x.key_dim as f64, x.value_dim as f64);
        let (kd, vd) = (nk * dk, nv * dv);
        let conv = 2.0 * kd + vd;
        let chunk = 64.0;
        let chunks = (ctx.seq / chunk).ceil() * ctx.batch;
        let tpad = chunks * chunk;
        // What the function references to its end (Qwen3-Next: the fused projection, which
        // stays to the end of the layer's forward; Qwen3.5: the gates' inputs `b` and `a`),
        // and the source of the decay `g`.
        let (mixed, z, held, gsrc) = if a.family.split_in_proj() {
            // Qwen3.5: queries, keys and values come out of their projection ready for the
            // convolution, the output gate and the two gates each out of their own.
            let mixed = self.proj(y, &lin, 0, t);
            let z = self.proj(y, &lin, 1, t);
            let b = self.proj(y, &lin, 2, t);
            let g = self.proj(y, &lin, 3, t);
            (mixed, z, [b, g], g)
        } else {
            let qkvz = self.proj(y, &lin, 0, t);
            self.tape.hold(qkvz);
            let ba = self.proj(y, &lin, 1, t);
            // Reordering into heads copies q, k, v and z.
            let z = self.op1(qkvz, t * vd, c);
            let qc = self.op1(qkvz, t * kd, c);
            let kc = self.op1(qkvz, t * kd, c);
            let vc = self.op1(qkvz, t * vd, c);
            let mixed = self.op(&[qc, kc, vc], t * conv, c, &[]);
            (mixed, z, [qkvz, qkvz], ba)
        };
        if !ctx.train {
            // The cache takes the convolution's last inputs from `mixed_qkv` before the
            // convolution runs (which rebinds it).
            let cst = self.op1(mixed, ctx.batch * conv * x.conv_kernel as f64, c);
            self.cache_kv(cst);
        }
        let cv = self.weighted(
            "conv1d",
            mixed,
            (t + ctx.batch * (x.conv_kernel as f64 - 1.0)) * conv * c.bytes(),
            conv * x.conv_kernel as f64 * ctx.g.bytes(),
            0.0,
            c,
        );
        let act = self.op(&[cv], t * conv, c, &[cv]);
        self.tape.hold(act);
        // fp32 queries and keys repeated to the value heads, values; gates from `ba`.
        let g32 = self.weighted("", gsrc, t * nv * 4.0, 2.0 * nv * ctx.g.bytes(), 0.0, f32);
        // With fewer key heads than value heads, queries and keys are repeated to the value
        // heads (`repeat_interleave`, copies in the model's dtype) and stay the layer's
        // locals until it returns; the kernel's fp32 copies are made from them.
        let (qsrc, ksrc) = if nv > nk {
            let qr = self.op1(act, t * nv * dk, c);
            let kr = self.op1(act, t * nv * dk, c);
            (qr, kr)
        } else {
            (act, act)
        };
        let q32 = self.op1(qsrc, t * nv * dk, f32);
        let k32 = self.op1(ksrc, t * nv * dk, f32);
        let v32 = self.op1(act, t * nv * dv, f32);
        let qn = self.op(&[q32], t * nv * dk, f32, &[q32]);
        let kn = self.op(&[k32], t * nv * dk, f32, &[k32]);
        let qs = self.op(&[qn], t * nv * dk, f32, &[qn]);
        let qp = self.op1(qs, tpad * nv * dk, f32);
        let kp = self.op1(kn, tpad * nv * dk, f32);
        let vp = self.op(&[v32, g32], tpad * nv * dv, f32, &[]);
        // Within-chunk decay and attention (C × C per chunk and head), the triangular solves
        // and their products (value-sized), then one state per chunk and its correction: a
        // chain whose every link is kept for backward.
        let cc = tpad * nv * chunk;
        let o = if ctx.train {
            // Within-chunk decay and attention (C × C per chunk and head), the triangular
            // solves and their products (value-sized), then one state per chunk and its
            // correction: a chain whose every link is kept for backward.
            let mut link = self.op(&[qp, kp, g32], cc, f32, &[qp, kp]);
            for _ in 0..3 {
                link = self.op(&[link], cc, f32, &[link]);
            }
            link = self.op(&[link, vp], cc, f32, &[link, vp]);
            for _ in 0..4 {
                link = self.op(&[link], tpad * nv * dv, f32, &[link]);
            }
            let states = self.op_tmp(
                "gated delta rule (chunks)",
                &[link],
                &[link],
                chunks * nv * (dk * dv + chunk * dv) * 4.0,
                tpad * nv * dv * 4.0,
                f32,
            );
            let o32 = self.op(&[states], t * vd, f32, &[states]);
            self.cast(o32, t * vd, c)
        } else {
            // `torch_chunk_gated_delta_rule` without autograd: its locals live until it
            // returns (the oracle's generate(): the prefill 9.8 % low without them). k_beta,
            // the decayed k_beta and the solved keys; three chunk-square tensors (the pairwise
            // decay, the UT system, the intra-chunk attention); v_beta and the solved values;
            // the zero state and the output buffer; then the queries and keys rebound to
            // their decayed copies (each made while the padded one is still held).
            let (kt, vt) = (tpad * nv * dk, tpad * nv * dv);
            let b = ctx.batch;
            let state = b * nv * dk * dv;
            let ks = self.op(&[kp, g32], 3.0 * kt, f32, &[]);
            let cs = self.op(&[qp, ks], 3.0 * cc, f32, &[]);
            let vs = self.op(&[vp, cs], 2.0 * vt, f32, &[]);
            let zero = self.op1(vs, state, f32);
            let out = self.op1(vs, vt, f32);
            let qd = self.op1(qp, kt, f32);
            let kd = self.op1(kp, kt, f32);
            // The scan over chunks writes into the output buffer; its last state update
            // holds the state before it, its decayed copy and the chunk's outer product
            // beside the new one (`state * exp(g) + k.T @ v_new`), with the chunk's new
            // values and its read of the state.
            let last = self.op_tmp(
                "gated delta rule (chunks)",
                &[out, zero, qd, kd],
                &[],
                state * 4.0,
                (2.0 * state + 2.0 * b * nv * chunk * dv) * 4.0,
                f32,
            );
            // The cache keeps a copy of the fp32 state.
            let rs = self.op1(last, state, f32);
            self.cache_kv(rs);
            // The output back in the inputs' dtype, made while the function's locals are
            // still referenced.
            let o = self.op1(out, t * vd, c);
            self.tape.touch(&[vp, ks, cs, vs, qd, kd, out]);
            o
        };
        // Qwen3NextRMSNormGated: RMSNorm of the output times silu(z), in fp32.
        let n = self.norm_as(o, dv, t * nv, NormOp::Norm(Norm::Rms, 1.0), dv);
        let z32 = self.cast(z, t * vd, f32);
        let sz = self.op(&[z32], t * vd, f32, &[z32]);
        let gated = self.mul(n, sz, t * vd);
        let gated = self.cast(gated, t * vd, c);
        self.tape.touch(&[held[0], held[1], act, qsrc, ksrc]);
        self.proj(gated, &lin, lin.len() - 1, t)
    }

    /// A dense MLP of width `i` over `y` (`tokens` rows); under tensor parallelism the
    /// intermediate is this rank's slice and the output a partial sum.
    fn mlp(&mut self, y: Tid, i: u64, tokens: f64) -> Tid {
        let a = self.ctx.arch;
        let lin = a.mlp_linears(i);
        let ie = tokens * (i as f64 / self.ctx.tp).ceil();
        if !a.gated {
            let hdn = self.proj(y, &lin, 0, tokens);
            let act = self.named("act", |b| b.activation(hdn, ie));
            let out = self.proj(act, &lin, 1, tokens);
            return self.dropout(out, tokens * a.hidden as f64, a.dropout.resid);
        }
        let (gate, up, down) = if a.fused_gate_up {
            let gu = self.proj(y, &lin, 0, tokens);
            let d = self.d(gu);
            let parts = self.tape.split(gu, &[ie * d.bytes(), ie * d.bytes()]);
            for &p in &parts {
                self.reg(p, d);
            }
            (parts[0], parts[1], lin[1])
        } else {
            let gate = self.proj(y, &lin, 0, tokens);
            (gate, usize::MAX, lin[2])
        };
        let act = self.named("act_fn", |b| b.activation(gate, ie));
        let up = if up == usize::MAX {
            self.proj(y, &lin, 1, tokens)
        } else {
            up
        };
        let m = self.named("act_fn(gate) * up", |b| b.mul(act, up, ie));
        let out = self.linear(m, down.1, down.0, tokens);
        self.dropout(out, tokens * a.hidden as f64, a.dropout.resid)
    }

    fn activation(&mut self, x: Tid, elems: f64) -> Tid {
        let d = self.d(x);
        match self.ctx.arch.activation {
            Activation::Silu | Activation::Gelu => self.op(&[x], elems, d, &[x]),
            Activation::Relu2 => {
                // A Python function: its argument is held until it returns.
                let r = self.op_saving_output(&[x], elems, d, Cat::Activations);
                let sq = self.op(&[r], elems, d, &[r]);
                self.tape.touch(&[x]);
                sq
            }
            Activation::GeluNew => {
                // 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))). Under autocast
                // `pow` is an fp32 op: it casts x to fp32 and saves that copy, and
                // everything downstream of it promotes to fp32.
                let xp = if self.ctx.autocast {
                    self.cast(x, elems, DType::F32)
                } else {
                    x
                };
                let pd = self.d(xp);
                let p3 = self.op(&[xp], elems, pd, &[xp]);
                let t1 = self.op1(p3, elems, pd);
                let t2 = self.add(x, t1, elems);
                let t3 = self.op1(t2, elems, self.d(t2));
                let th = self.op_saving_output(&[t3], elems, self.d(t3), Cat::Activations);
                let u = self.op1(th, elems, self.d(th));
                let hx = self.op1(x, elems, d);
                self.mul(hx, u, elems)
            }
        }
    }

    /// The mixture of experts of a MoE layer over `y` (`[tokens, hidden]`).
    fn moe(&mut self, y: Tid) -> Tid {
        if self.ctx.ep_titan {
            return self.moe_titan(y);
        }
        if self.ctx.arch.family == Family::Llama4 {
            return self.moe_dense_bmm(y);
        }
        self.moe_grouped(y)
    }

    /// The router: logits, their probabilities (kept), the top-k routing weights. Returns the
    /// routing weights (`[tokens, top_k]`).
    fn router(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("moe layer");
        let t = ctx.t;
        let e = m.experts as f64;
        let f32 = DType::F32;
        let fp32_router = matches!(
            a.family,
            Family::DeepseekV2 | Family::DeepseekV3 | Family::Glm4Moe
        );
        let probs = if fp32_router {
            // `F.linear(x.float(), weight.float())`: the fp32 copy of the hidden states and
            // of the router's weight are kept; sigmoid (or softmax) scores in fp32.
            let x32 = self.cast(y, t * a.hidden as f64, f32);
            let logits = self.weighted(
                "router (fp32)",
                x32,
                t * e * 4.0,
                e * a.hidden as f64 * ctx.g.bytes(),
                e * a.hidden as f64 * 4.0,
                f32,
            );
            self.op_saving_output(&[logits], t * e, f32, Cat::Activations)
        } else {
            let router = Linear::new(a.hidden, m.experts, m.router_linear_bias);
            let logits = self.linear(y, router, "gate", t);
            self.op_saving_output(&[logits], t * e, f32, Cat::Activations)
        };
        let wd = match a.family {
            Family::Mixtral
            | Family::DeepseekV2
            | Family::DeepseekV3
            | Family::Glm4Moe
            | Family::MiniMaxM2 => f32,
            _ => ctx.c,
        };
        self.op(&[probs], t * m.top_k as f64, wd, &[probs])
    }

    /// transformers 5's default experts (`grouped_mm_experts_forward`): the tokens sorted by
    /// expert and gathered (`S = tokens × top_k` rows), one grouped matmul for gate and up
    /// over the stacked weights, an out-of-place `masked_fill` of its output, the gate, the
    /// down grouped matmul and its `masked_fill`, the routing weights' product (fp32 when
    /// they are), the rows put back in order and summed per token, cast back. Then the shared
    /// expert(s).
    fn moe_grouped(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("moe layer");
        let t = ctx.t;
        let h = a.hidden as f64;
        let c = ctx.c;
        // Qwen runs the shared expert before the routed ones.
        let shared_first = m.shared_gate;
        let shared = |b: &mut Self, y: Tid| -> Option<Tid> {
            let w = m.shared_width();
            if w == 0 {
                return None;
            }
            let s = b.mlp(y, w, t);
            if m.shared_gate {
                // `sigmoid(shared_expert_gate(x)) * shared`: both kept.
                let g = b.linear(y, Linear::new(a.hidden, 1, false), "shared_expert_gate", t);
                let sg = b.op_saving_output(&[g], t, b.d(g), Cat::Activations);
                return Some(b.mul(s, sg, t * h));
            }
            Some(s)
        };
        let first = if shared_first { shared(self, y) } else { None };
        let weights = self.router(y);
        let wd = self.d(weights);
        let tp = ctx.tp;
        let i = (m.expert_intermediate as f64 / tp).ceil();
        let s = t * m.top_k as f64;
        // Under transformers' expert-parallel plan a rank holds `experts / ep` of them (every
        // rank routes all tokens; other ranks' slots are masked and skipped).
        let experts = m.experts as f64 / ctx.ep;
        let per = if a.gated { 2.0 * i } else { i };
        // transformers 5 runs the experts outside autocast: in the parameters' dtype.
        let ec = if ctx.autocast { ctx.w } else { c };
        self.native = ctx.autocast;
        let gathered = self.op1(y, s * h, ec);
        let bias = |on: bool, n: f64| if on { experts * n } else { 0.0 };
        // gpt-oss gathers each row's bias (`selected_biases`), added in place. Without
        // autograd the gathered biases are a local, the up projection's until the down
        // projection's replace them, that one's until the function returns; in training
        // they count as the products' workspace.
        let held_bias = m.expert_bias && !ctx.train;
        // Bytes per column of a bias gathered and added as workspace (training).
        let bias_row = if m.expert_bias && !held_bias {
            s * ec.bytes()
        } else {
            0.0
        };
        let up_bias = held_bias.then(|| self.op(&[], s * per, ec, &[]));
        let gu = self.weighted(
            "experts gate_up (grouped_mm)",
            gathered,
            s * per * ec.bytes(),
            (experts * per * h + bias(m.expert_bias, per)) * ctx.g.bytes(),
            per * bias_row,
            ec,
        );
        let filled = self.op1(gu, s * per, ec);
        let ie = s * i;
        let gated = if !a.gated {
            self.activation(filled, ie)
        } else {
            let parts = self.tape.split(filled, &[ie * ec.bytes(), ie * ec.bytes()]);
            for &p in &parts {
                self.reg(p, ec);
            }
            if a.family == Family::GptOss && !ctx.train {
                // `_apply_gate` as it runs without autograd: both clamps, then the gate's
                // product, then `(up + 1) * glu`; its locals and the caller's `proj_out`
                // (the masked projection) live until it returns.
                let cg = self.op1(parts[0], ie, ec);
                let cu = self.op1(parts[1], ie, ec);
                let ga = self.op1(cg, ie, ec);
                let sg = self.op1(ga, ie, ec);
                let glu = self.op(&[cg, sg], ie, ec, &[]);
                let up1 = self.op1(cu, ie, ec);
                let out = self.op(&[up1, glu], ie, ec, &[]);
                self.tape.touch(&[cg, cu, glu, filled]);
                out
            } else if a.family == Family::GptOss {
                // Clamped SwiGLU: clamp keeps its input; `gate * sigmoid(gate * α)` and
                // `(up + 1) * glu` keep their operands.
                let cg = self.op(&[parts[0]], ie, ec, &[parts[0]]);
                let ga = self.op1(cg, ie, ec);
                let sg = self.op_saving_output(&[ga], ie, ec, Cat::Activations);
                let glu = self.mul(cg, sg, ie);
                let cu = self.op(&[parts[1]], ie, ec, &[parts[1]]);
                let up1 = self.op1(cu, ie, ec);
                self.mul(up1, glu, ie)
            } else {
                let act = self.activation(parts[0], ie);
                self.mul(act, parts[1], ie)
            }
        };
        let down_bias = held_bias.then(|| self.op(&[], s * h, ec, &[]));
        if let Some(b) = up_bias {
            self.tape.touch(&[b]);
        }
        let dn = self.weighted(
            "experts down (grouped_mm)",
            gated,
            s * h * ec.bytes(),
            (experts * i * h + bias(m.expert_bias, h)) * ctx.g.bytes(),
            h * bias_row,
            ec,
        );
        self.native = false;
        let filled2 = self.op1(dn, s * h, ec);
        let wd2 = promote(ec, wd);
        let weighted = self.op_tmp(
            "",
            &[filled2, weights],
            &[filled2, weights],
            s * h * wd2.bytes(),
            0.0,
            wd2,
        );
        let ordered = self.op1(weighted, s * h, wd2);
        let summed = self.op1(ordered, t * h, wd2);
        // Locals of the experts' forward until it returns: the gathered rows and the last
        // `proj_out` (the down projection's, masked).
        self.tape.touch(&[gathered, filled2]);
        if let Some(b) = down_bias {
            self.tape.touch(&[b]);
        }
        let yd = self.d(y);
        let mut out = self.cast(summed, t * h, yd);
        let later = if shared_first { first } else { shared(self, y) };
        if let Some(sh) = later {
            out = self.add(out, sh, t * h);
        }
        out
    }

    /// Llama 4's experts: every token through every expert (`repeat` of the hidden states,
    /// scaled by the routing scores), gate/up and down as batched matmuls over the stacked
    /// weights, then the shared expert with the routed sum added in place.
    fn moe_dense_bmm(&mut self, y: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("moe layer");
        let t = ctx.t;
        let h = a.hidden as f64;
        let c = ctx.c;
        let e = m.experts as f64;
        let router = Linear::new(a.hidden, m.experts, false);
        let logits = self.linear(y, router, "router", t);
        let scores = self.op1(logits, t * e, c);
        let i = (m.expert_intermediate as f64 / ctx.tp).ceil();
        let rin = self.op1(y, e * t * h, c);
        let scaled = self.mul(rin, scores, e * t * h);
        let gu = self.weighted(
            "experts gate_up (bmm)",
            scaled,
            e * t * 2.0 * i * c.bytes(),
            e * 2.0 * i * h * ctx.g.bytes(),
            0.0,
            c,
        );
        let ie = e * t * i;
        let parts = self.tape.split(gu, &[ie * c.bytes(), ie * c.bytes()]);
        for &p in &parts {
            self.reg(p, c);
        }
        let act = self.activation(parts[0], ie);
        let mm = self.mul(parts[1], act, ie);
        let dn = self.weighted(
            "experts down (bmm)",
            mm,
            e * t * h * c.bytes(),
            e * i * h * ctx.g.bytes(),
            0.0,
            c,
        );
        let shared = self.mlp(y, m.shared_width(), t);
        let summed = self.op1(dn, t * h, c);
        // `out.add_(…)`: in place on the shared expert's output. The scaled rows
        // (`routed_in`) are a local until the block returns.
        let out = self.add(shared, summed, t * h);
        self.tape.touch(&[scaled]);
        out
    }

    /// The layer's feed-forward over `y` (whole under tensor parallelism).
    fn ffn(&mut self, y: Tid, kind: LayerKind) -> Tid {
        let a = self.ctx.arch;
        if kind.moe {
            self.moe(y)
        } else {
            self.mlp(y, a.dense_intermediate(), self.ctx.t)
        }
    }

    /// `residual + x` (Granite scales `x` by its residual multiplier first).
    fn residual(&mut self, r: Tid, x: Tid, elems: f64) -> Tid {
        let x = if self.ctx.arch.family == Family::Granite {
            self.op1(x, elems, self.d(x))
        } else {
            x
        };
        self.add(r, x, elems)
    }

    /// One decoder layer of kind `kind` over `x`; returns its output.
    pub fn decoder_layer(&mut self, x: Tid, kind: LayerKind) -> Tid {
        if self.ctx.megatron {
            return self.mc_layer(x, kind);
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let e = ctx.tsp * h;
        let resid = a.dropout.resid;
        // The model's loop keeps the layer's input referenced until the layer returns.
        self.tape.hold(x);
        let out = match a.block {
            Block::Pre => {
                let y = self.named("input_layernorm", |b| b.norm(x, h, ctx.tsp));
                let yf = self.enter_tp(y, h);
                let o = self.named("self_attn", |b| b.attention(yf, kind));
                let o = self.leave_tp(o, h);
                let o = self.dropout(o, e, resid);
                self.tape.touch(&[y]);
                let r1 = self.named("residual", |b| b.residual(x, o, e));
                let y2 = self.named("post_attention_layernorm", |b| b.norm(r1, h, ctx.tsp));
                let y2f = self.enter_tp(y2, h);
                let m = self.named("mlp", |b| b.ffn(y2f, kind));
                let m = self.leave_tp(m, h);
                self.tape.touch(&[y2]);
                if a.family == Family::Llama4 {
                    // Llama 4's layer binds the attention's output to a local of its own
                    // (`attention_states`), referenced until the layer returns.
                    self.tape.touch(&[o]);
                }
                self.named("residual", |b| b.residual(r1, m, e))
            }
            Block::Sandwich => {
                // The same four norms, as Gemma and GLM-4 name them.
                let [n_attn, n_pre, n_mlp] = if a.family == Family::Glm4 {
                    [
                        "post_self_attn_layernorm",
                        "post_attention_layernorm",
                        "post_mlp_layernorm",
                    ]
                } else {
                    [
                        "post_attention_layernorm",
                        "pre_feedforward_layernorm",
                        "post_feedforward_layernorm",
                    ]
                };
                let y = self.named("input_layernorm", |b| b.norm(x, h, ctx.tsp));
                let yf = self.enter_tp(y, h);
                let o = self.named("self_attn", |b| b.attention(yf, kind));
                let o = self.leave_tp(o, h);
                self.tape.touch(&[y]);
                let o2 = self.named(n_attn, |b| b.norm(o, h, ctx.tsp));
                let r1 = self.named("residual", |b| b.add(x, o2, e));
                let y2 = self.named(n_pre, |b| b.norm(r1, h, ctx.tsp));
                let y2f = self.enter_tp(y2, h);
                let m = self.named("mlp", |b| b.ffn(y2f, kind));
                let m = self.leave_tp(m, h);
                self.tape.touch(&[y2]);
                let m2 = self.named(n_mlp, |b| b.norm(m, h, ctx.tsp));
                self.named("residual", |b| b.add(r1, m2, e))
            }
            Block::Post => {
                let xf = self.enter_tp(x, h);
                let o = self.named("self_attn", |b| b.attention(xf, kind));
                let o = self.leave_tp(o, h);
                let o2 = self.named("post_attention_layernorm", |b| b.norm(o, h, ctx.tsp));
                let r1 = self.named("residual", |b| b.add(x, o2, e));
                let rf = self.enter_tp(r1, h);
                let m = self.named("mlp", |b| b.ffn(rf, kind));
                let m = self.leave_tp(m, h);
                let m2 = self.named("post_feedforward_layernorm", |b| b.norm(m, h, ctx.tsp));
                self.named("residual", |b| b.add(r1, m2, e))
            }
            Block::Parallel | Block::ParallelTwoNorms => {
                // Falcon binds both norms to locals before attention; GPT-NeoX passes each
                // as an argument, the second made once attention has returned.
                let late = a.family == Family::GptNeox;
                let two = a.block == Block::ParallelTwoNorms;
                let y1 = self.named("input_layernorm", |b| b.norm(x, h, ctx.tsp));
                let mut y2 = if two && !late {
                    self.named("mlp_layernorm", |b| b.norm(x, h, ctx.tsp))
                } else {
                    y1
                };
                let y1f = self.enter_tp(y1, h);
                let o = self.named("self_attn", |b| b.attention(y1f, kind));
                let o = self.leave_tp(o, h);
                let o = self.dropout(o, e, resid);
                if two && late {
                    self.tape.touch(&[y1]);
                    y2 = self.named("mlp_layernorm", |b| b.norm(x, h, ctx.tsp));
                }
                let y2f = if y2 == y1 { y1f } else { self.enter_tp(y2, h) };
                let m = self.named("mlp", |b| b.ffn(y2f, kind));
                let m = self.leave_tp(m, h);
                if late {
                    self.tape.touch(&[y2]);
                } else {
                    self.tape.touch(&[y1, y2]);
                }
                self.named("residual", |b| {
                    let s = b.add(o, m, e);
                    b.add(s, x, e)
                })
            }
        };
        self.tape.set_output(out);
        out
    }

    /// Token (and position) embeddings; returns the first layer's input.
    pub fn embedding(&mut self) -> Tid {
        self.named("embed_tokens", Self::embedding_ops)
    }

    fn embedding_ops(&mut self) -> Tid {
        if self.ctx.megatron {
            return self.mc_embedding();
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let h = a.hidden as f64;
        let ids = self.input(t, DType::F32, false);
        // The token ids belong to the batch, which the caller holds through the step.
        self.tape.keep(ids);
        let trainable = ctx.base_trainable();
        // Embedding weights keep the parameter dtype (embedding is not an autocast op).
        let ed = if ctx.autocast {
            DType::F32
        } else {
            emb_dtype(ctx)
        };
        // A vocabulary-parallel embedding holds this rank's rows, but DTensor's embedding
        // backward makes the gradient of the whole table (replicated); the rank's rows are
        // cut out of it later (the optimizer step, or FSDP's reduce-scatter).
        let vh = (a.vocab * a.hidden) as f64 * ctx.g.bytes();
        // Tied: the head's grad was created first and the embedding's dense grad is summed
        // into it: in place under autocast (the head's grad is the fresh fp32 copy of its
        // bf16 grad), else into a new tensor (the head's grad is a view of `mm`'s output).
        // Untied: it becomes the .grad.
        let (pg, tg) = if a.tied_embeddings {
            (0.0, vh)
        } else {
            (vh, 0.0)
        };
        // CUDA's `embedding_dense_backward` sums the rows of more than 3072 tokens by
        // sorting them: partial sums of every token's row in the accumulation type, after the
        // gradient (ATen's `embedding_backward_cuda_kernel`).
        let partials = if t > 3072.0 && ctx.train {
            t * h * ed.bytes().max(4.0)
        } else {
            0.0
        };
        let e = self.op_spec(
            OpSpec {
                inputs: &[ids],
                out_bytes: t * h * ed.bytes(),
                weights_rg: trainable,
                param_grads: pg,
                extra: &OpExtra {
                    tied_grad: tg,
                    tied_in_place: ctx.autocast,
                    bwd_stack: [partials, 0.0, 0.0, 0.0],
                    ..OpExtra::NONE
                },
                ..OpSpec::default()
            },
            ed,
        );
        let out = if let Some(n) = a.learned_positions {
            let pos = self.op_spec(
                OpSpec {
                    inputs: &[ids],
                    out_bytes: ctx.seq * h * ed.bytes(),
                    weights_rg: trainable,
                    param_grads: (n * a.hidden) as f64 * ctx.g.bytes(),
                    ..OpSpec::default()
                },
                ed,
            );
            self.tape.hold(e);
            // `position_embeds` is a local of GPT-2's forward.
            self.tape.hold_local(pos);
            self.locals_hold += self.tape.bytes(pos);
            let sum = self.add(e, pos, t * h);
            self.model_locals(ed);
            self.dropout(sum, t * h, a.dropout.embd)
        } else if matches!(a.family, Family::Gemma2 | Family::Gemma3 | Family::Granite) {
            // Gemma scales the embeddings by sqrt(hidden), Granite by its multiplier: a new
            // tensor (Gemma's model keeps `inputs_embeds` referenced through the forward).
            let scaled = self.op1(e, t * h, ed);
            self.model_locals(ed);
            self.dropout(scaled, t * h, a.dropout.embd)
        } else {
            self.model_locals(ed);
            self.dropout(e, t * h, a.dropout.embd)
        };
        // A vocabulary-parallel embedding's output is a partial sum over the ranks.
        let out = self.leave_tp(out, h);
        self.tape.set_output(out);
        out
    }

    /// What the model's forward makes once before its layers and holds in locals until it
    /// returns: the rotary tables and the attention masks.
    ///
    /// - RoPE's `cos` and `sin` (`position_embeddings`), `[b, s, rope_dim]` each in the
    ///   hidden states' dtype: gpt-oss's are half as wide (not concatenated), Llama 4's and
    ///   DeepSeek-V2's one complex64 table `[b, s, rope_dim / 2]`, OLMo's and ERNIE's in
    ///   fp32; Gemma 3
    ///   and OLMo 3 have a second pair for their sliding layers. In training every rotation also saves them, until the first layer's
    ///   backward; they are counted through the forward only (a few MB at most, beside
    ///   the saved activations of every layer).
    /// - One mask per kind of attention layer (`create_causal_mask`, and the sliding-window
    ///   and chunked variants), `[b, 1, s, s]`: eager attention's in the embeddings' dtype
    ///   (`where` over a boolean one), always; SDPA's boolean, only where the window or chunk
    ///   is reached (a causal mask without padding is `is_causal` instead).
    fn model_locals(&mut self, d: DType) {
        let ctx = self.ctx;
        let a = ctx.arch;
        let (b, s) = (ctx.batch, ctx.seq);
        let kinds = a.kinds();
        if a.rope_dim > 0 && kinds.iter().any(|k| !k.nope && k.attn != AttnType::Linear) {
            let r = a.rope_dim as f64;
            let sliding = kinds.iter().any(|k| k.attn == AttnType::Sliding);
            let f32 = DType::F32;
            let (tables, td): (&[f64], DType) = match a.family {
                Family::GptOss => (&[r / 2.0, r / 2.0], d),
                // One complex64 table, `[b, s, rope_dim / 2]`: 8 bytes an entry.
                Family::Llama4 | Family::DeepseekV2 => (&[r], f32),
                Family::Gemma3 if sliding => (&[r, r, r, r], d),
                // OLMo's rotary returns its tables uncast, in fp32; OLMo 3 makes a pair for
                // each kind of layer.
                Family::Olmo3 if sliding => (&[r, r, r, r], f32),
                Family::Olmo2 | Family::Olmo3 | Family::Ernie45 => (&[r, r], f32),
                _ => (&[r, r], d),
            };
            for &w in tables {
                let t = self.op(&[], b * s * w, td, &[]);
                self.tape.hold_local(t);
                self.locals_hold += self.tape.bytes(t);
            }
        }
        let mut made: Vec<AttnType> = Vec::new();
        for k in kinds {
            if k.attn == AttnType::Linear || made.contains(&k.attn) {
                continue;
            }
            made.push(k.attn);
            let mask = match ctx.attention {
                Attention::Eager => {
                    let allowed = self.op(&[], b * s * s, DType::I8, &[]);
                    self.op1(allowed, b * s * s, d)
                }
                // Falcon materialises its causal mask always (`allow_is_causal_skip=False`).
                Attention::Sdpa if self.masked(k) || a.family == Family::Falcon => {
                    self.op(&[], b * s * s, DType::I8, &[])
                }
                Attention::Sdpa => continue,
            };
            self.tape.hold_local(mask);
            self.locals_hold += self.tape.bytes(mask);
        }
    }

    /// Final norm, LM head and the loss (training) or last-token logits (generation).
    pub fn head(&mut self, x: Tid) -> Tid {
        self.named("lm_head", |b| b.head_ops(x))
    }

    fn head_ops(&mut self, x: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let v = a.vocab as f64;
        let y = self.named("norm", |b| b.norm(x, h, ctx.t));
        let head = Linear::new(a.hidden, a.vocab, false);
        if !ctx.train {
            // generate(): logits of the last position only, then an fp32 copy.
            let rows = ctx.batch;
            let last = self.op1(y, rows * h, self.d(y));
            let l = self.head_linear(last, head, rows);
            let l = self.logit_ops(l);
            let l32 = self.cast(l, rows * v, DType::F32);
            self.tape.set_output(l32);
            return l32;
        }
        let t = ctx.t;
        match ctx.loss {
            Loss::Standard => {
                let logits = self.head_linear(y, head, t);
                self.tape.keep(logits);
                let l32 = if self.d(logits) == DType::F32 {
                    logits
                } else {
                    self.op_spec(
                        OpSpec {
                            inputs: &[logits],
                            out_bytes: t * v * 4.0,
                            cat: Cat::Logits,
                            ..OpSpec::default()
                        },
                        DType::F32,
                    )
                };
                let ls = self.named("log_softmax", |b| {
                    b.op_saving_output(&[l32], t * v, DType::F32, Cat::Logits)
                });
                let loss = self.named("nll_loss", |b| b.op(&[ls], 1.0, DType::F32, &[]));
                self.tape.set_output(loss);
                loss
            }
            Loss::Fused => {
                // Liger's fused linear cross-entropy: chunks of tokens; each chunk's logits,
                // their fp32 softmax and grad exist only inside the op; grad_input is
                // computed in the forward and kept.
                let inc = (v / h).ceil().max(1.0);
                let chunk = (t / inc).ceil().max(1.0).log2().ceil().exp2().min(t);
                let trainable = ctx.base_trainable();
                let loss = self.op_spec(
                    OpSpec {
                        inputs: &[y],
                        out_bytes: t * h * ctx.c.bytes(),
                        weights_rg: trainable,
                        param_grads: a.vocab as f64 * h * ctx.g.bytes(),
                        fwd_temp: chunk * v * (ctx.c.bytes() + 8.0)
                            + a.vocab as f64 * h * ctx.g.bytes(),
                        ..OpSpec::default()
                    },
                    ctx.c,
                );
                self.tape.set_output(loss);
                loss
            }
        }
    }

    /// Training: the final norm and the LM head (or, with a fused loss, only the norm: the
    /// fused op does the head's matmul). Returns the output and its dtype.
    pub fn head_logits(&mut self, x: Tid) -> (Tid, DType) {
        self.named("lm_head", |b| b.head_logits_ops(x))
    }

    fn head_logits_ops(&mut self, x: Tid) -> (Tid, DType) {
        if self.ctx.megatron {
            return self.mc_head(x);
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let y = self.named("norm", |b| b.norm(x, h, ctx.tsp));
        let out = match ctx.loss {
            Loss::Standard => {
                let yf = self.enter_tp(y, h);
                // Column-parallel: this rank's slice of the vocabulary.
                let vl = (a.vocab as f64 / ctx.tp).ceil() as u64;
                let local = self.head_linear(yf, Linear::new(a.hidden, vl, false), ctx.t);
                let out = if ctx.tp > 1.0 && !ctx.lp {
                    // Without loss_parallel the logits are all-gathered whole on every rank:
                    // the gathered chunks, their copy, then laid out along the vocabulary;
                    // the backward takes this rank's slice of the gradient (a copy).
                    let d = self.d(local);
                    let whole = ctx.t * a.vocab as f64 * d.bytes();
                    self.op_spec(
                        OpSpec {
                            name: "logits all-gather",
                            inputs: &[local],
                            out_bytes: whole,
                            cat: Cat::Logits,
                            fwd_temp: 2.0 * whole,
                            ..OpSpec::default()
                        },
                        d,
                    )
                } else {
                    local
                };
                self.logit_ops(out)
            }
            Loss::Fused => y,
        };
        self.tape.set_output(out);
        (out, self.d(out))
    }

    /// What a family does to its logits before the loss: Gemma 2's softcapping
    /// (`tanh(logits / cap) * cap`, tanh keeping its output), Cohere's `logit_scale` and
    /// Granite's `/ logits_scaling` (each a new tensor the size of the logits).
    fn logit_ops(&mut self, l: Tid) -> Tid {
        let a = self.ctx.arch;
        let d = self.d(l);
        let n = self.tape.bytes(l) / d.bytes();
        let logits = |b: &mut Self, x: Tid, save_out: bool| -> Tid {
            let y = b.op_spec(
                OpSpec {
                    name: "logits",
                    inputs: &[x],
                    out_bytes: n * d.bytes(),
                    cat: Cat::Logits,
                    ..OpSpec::default()
                },
                d,
            );
            if save_out {
                b.tape.save_self(y);
            }
            y
        };
        let mut l = l;
        if a.final_softcap {
            let div = logits(self, l, false);
            let th = logits(self, div, true);
            l = logits(self, th, false);
        }
        if matches!(a.family, Family::Cohere | Family::Cohere2 | Family::Granite) {
            l = logits(self, l, false);
        }
        l
    }

    /// Training: the loss over the head's output `x` (the logits, which the caller keeps as
    /// `out.logits`; or the normed hidden state a fused loss takes).
    pub fn loss(&mut self, x: Tid) -> Tid {
        self.named("loss", |b| b.loss_ops(x))
    }

    fn loss_ops(&mut self, x: Tid) -> Tid {
        if self.ctx.megatron {
            return self.mc_loss(x);
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let v = a.vocab as f64;
        let t = ctx.t;
        match ctx.loss {
            Loss::Standard if ctx.lp => {
                // `loss_parallel()`: log-softmax over vocabulary-sharded logits. The fp32
                // upcast lives until the model's forward returns; the shifted logits and
                // their exponent exist one at a time beside it; the log-softmax is kept. Its
                // backward makes the gradient of the log-softmax (zeros scattered), its
                // exponent, and the gradient of the logits, all fp32.
                self.tape.keep(x);
                let vl = (v / ctx.tp).ceil();
                let l32 = self.cast(x, t * vl, DType::F32);
                self.tape.hold(l32);
                let local = t * vl * 4.0;
                let ls = self.op_spec(
                    OpSpec {
                        name: "loss-parallel log-softmax",
                        inputs: &[l32],
                        out_bytes: local,
                        cat: Cat::Logits,
                        fwd_temp: local,
                        bwd_temp: local,
                        ..OpSpec::default()
                    },
                    DType::F32,
                );
                self.tape.save_self(ls);
                let loss = self.named("nll_loss", |b| b.op(&[ls], 1.0, DType::F32, &[]));
                self.tape.set_output(loss);
                loss
            }
            Loss::Standard => {
                self.tape.keep(x);
                let l32 = if self.d(x) == DType::F32 {
                    x
                } else {
                    self.op_spec(
                        OpSpec {
                            name: "logits.float()",
                            inputs: &[x],
                            out_bytes: t * v * 4.0,
                            cat: Cat::Logits,
                            ..OpSpec::default()
                        },
                        DType::F32,
                    )
                };
                let ls = self.named("log_softmax", |b| {
                    b.op_saving_output(&[l32], t * v, DType::F32, Cat::Logits)
                });
                let loss = self.named("nll_loss", |b| b.op(&[ls], 1.0, DType::F32, &[]));
                self.tape.set_output(loss);
                loss
            }
            Loss::Fused => {
                // Liger's fused linear cross-entropy: chunks of tokens; each chunk's logits,
                // their fp32 softmax and grad exist only inside the op; grad_input is
                // computed in the forward and kept.
                let inc = (v / h).ceil().max(1.0);
                let chunk = (t / inc).ceil().max(1.0).log2().ceil().exp2().min(t);
                let trainable = ctx.base_trainable();
                // grad_input, made in the forward pass and kept in the autograd context;
                // the backward hands it back as the input's gradient (Liger returns it as is
                // when the loss's gradient is one): no new allocation on the way back.
                let grad_input = self.op_spec(
                    OpSpec {
                        name: "fused linear cross-entropy",
                        inputs: &[x],
                        out_bytes: t * h * ctx.c.bytes(),
                        weights_rg: trainable,
                        param_grads: a.vocab as f64 * h * ctx.g.bytes(),
                        fwd_temp: chunk * v * (ctx.c.bytes() + 8.0)
                            + a.vocab as f64 * h * ctx.g.bytes(),
                        passthrough: true,
                        ..OpSpec::default()
                    },
                    ctx.c,
                );
                let loss = self.op_spec(
                    OpSpec {
                        name: "fused linear cross-entropy (loss)",
                        inputs: &[grad_input],
                        out_bytes: 4.0,
                        saved: &[grad_input],
                        grad_in_saved: true,
                        ..OpSpec::default()
                    },
                    DType::F32,
                );
                self.tape.set_output(loss);
                loss
            }
        }
    }

    /// A stretch's input of `bytes` (a tensor the previous stretch made, e.g. the logits),
    /// named as that stretch names it.
    pub fn input_bytes(
        &mut self,
        bytes: f64,
        d: DType,
        rg: bool,
        cat: Cat,
        name: &'static str,
    ) -> Tid {
        let t = self.tape.input_cat(bytes, rg, cat, name);
        self.reg(t, d)
    }

    fn head_linear(&mut self, x: Tid, lin: Linear, rows: f64) -> Tid {
        // The LM head stays in the compute dtype under QLoRA (bitsandbytes skips it).
        let ctx = self.ctx;
        let trainable = ctx.base_trainable();
        let params = lin.params() as f64;
        // The generation head's weight is tied too, but only training makes gradients.
        let tied = ctx.arch.tied_embeddings && ctx.train;
        let mut inputs = Ids::default();
        let mut saved = Ids::default();
        // Under autocast: the weight's copy (made before the input's), whose backward casts
        // the gradient to the parameter's `.grad`.
        let w = ctx.autocast.then(|| {
            let w = self.tape.op(OpSpec {
                out_bytes: params * ctx.c.bytes(),
                cat: Cat::WeightCopies,
                weights_rg: trainable,
                param_grads: params * ctx.g.bytes(),
                extra: if tied { &TIED_HEAD } else { &OpExtra::NONE },
                ..OpSpec::default()
            });
            self.reg(w, ctx.c);
            if trainable {
                self.tape.cache(w);
            }
            w
        });
        let xin = if ctx.autocast {
            self.cast(x, rows * lin.inp as f64, ctx.c)
        } else {
            x
        };
        if let Some(w) = w {
            if self.tape.requires_grad(x) {
                saved.push(w);
            }
            inputs.push(w);
        }
        inputs.push(xin);
        if trainable {
            saved.push(xin);
        }
        self.op_spec(
            OpSpec {
                inputs: inputs.all(),
                out_bytes: rows * lin.out as f64 * ctx.c.bytes(),
                saved: saved.all(),
                cat: Cat::Logits,
                weights_rg: trainable && w.is_none(),
                param_grads: params * ctx.g.bytes(),
                grad_view: true,
                extra: if tied { &TIED_HEAD } else { &OpExtra::NONE },
                ..OpSpec::default()
            },
            ctx.c,
        )
    }
}

/// Dtype of embeddings/LM head: the compute dtype when the base is quantised.
fn emb_dtype(ctx: &Ctx<'_>) -> DType {
    if ctx.w.is_float_compute() {
        ctx.w
    } else {
        ctx.c
    }
}

/// Type promotion of a binary op.
fn promote(a: DType, b: DType) -> DType {
    if a == DType::F32 || b == DType::F32 {
        DType::F32
    } else {
        a
    }
}

/// Which norm an op computes and over how many groups per row (heads, for a per-head norm).
#[derive(Clone, Copy, Debug)]
enum NormOp {
    Norm(Norm, f64),
    /// A weightless L2 norm (Llama 4's QK-norm).
    L2(f64),
}

/// How a family applies RoPE, which decides its temporaries and whether the rotated query is
/// contiguous head-major (then SDPA's output is too, and the model's transpose copies it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RopeStyle {
    /// `x * cos + rotate_half(x) * sin` on the projection's view.
    Plain,
    /// Rotated part and pass-through concatenated (partial rotary, Phi-3, GPT-NeoX, gpt-oss).
    Cat,
    /// Computed in fp32 and cast back (Cohere, OLMo 2, Llama 4's complex product).
    Fp32,
}
