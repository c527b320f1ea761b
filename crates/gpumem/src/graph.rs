//! The forward passes of the modelled implementations, op by op, recorded on a [`Tape`].
//!
//! Each builder follows the Hugging Face `transformers` module it names, with PyTorch's rules
//! for what autograd saves: a matmul saves its input when its weight needs a grad and its
//! weight when its input does; `silu`/`pow` save their input; `softmax`/`tanh`/`rsqrt` their
//! output; `mul` saves each operand for the other's grad; adds, casts and views save nothing.
//! Under `torch.autocast`, every linear casts its input to the compute dtype itself (a fresh
//! copy per linear) and uses a cached low-precision copy of its weight, which it saves.

use crate::arch::{Activation, Architecture, Family, Linear};
use crate::dtype::DType;
use crate::scenario::{Attention, Finetune, Loss, Recompute, Scenario};
use crate::tape::{Cat, OpSpec, Tape, Tid};

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

/// A tape plus the dtype of each tensor on it.
pub struct Builder<'c, 'a> {
    pub tape: Tape,
    dt: Vec<DType>,
    pub ctx: &'c Ctx<'a>,
    /// Tensors the KV cache keeps (inference).
    pub kv: Vec<Tid>,
    /// Ops run outside autocast (in the parameters' dtype).
    native: bool,
}

impl<'c, 'a> Builder<'c, 'a> {
    pub fn new(ctx: &'c Ctx<'a>) -> Self {
        Builder {
            tape: Tape::new(),
            dt: Vec::new(),
            ctx,
            kv: Vec::new(),
            native: false,
        }
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
    fn softmax(&mut self, x: Tid, elems: f64, d: DType) -> Tid {
        self.op_saving_output_tmp(&[x], elems, d, Cat::Activations, elems * d.bytes())
    }

    fn cast(&mut self, x: Tid, elems: f64, d: DType) -> Tid {
        if self.d(x) == d {
            return x;
        }
        self.op(&[x], elems, d, &[])
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

    /// `a * b` with both requiring grad potentially: each saves the other.
    fn mul(&mut self, a: Tid, b: Tid, elems: f64) -> Tid {
        let d = promote(self.d(a), self.d(b));
        let mut saved = Vec::new();
        if self.tape.requires_grad(a) {
            saved.push(b);
        }
        if self.tape.requires_grad(b) {
            saved.push(a);
        }
        self.op(&[a, b], elems, d, &saved)
    }

    /// Dropout with probability `p` (training): saves a bool mask.
    fn dropout(&mut self, x: Tid, elems: f64, p: f64) -> Tid {
        if p <= 0.0 || !self.ctx.train {
            return x;
        }
        let d = self.d(x);
        let mask = self.op(&[x], elems, DType::I8, &[]);
        self.op(&[x, mask], elems, d, &[mask])
    }

    /// A linear layer `module` over `x` (`tokens` rows).
    pub fn linear(&mut self, x: Tid, lin: Linear, module: &'static str, tokens: f64) -> Tid {
        self.linear_n(x, lin, module, tokens, 1.0)
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
        // Autocast casts the input for each linear separately.
        let xin = if autocast {
            self.cast(x, tokens * lin.inp as f64, c)
        } else {
            x
        };
        let params = lin.params() as f64 * copies;
        let quant = ctx.quantized_base();
        // The weight as the matmul sees it: an autocast copy (cached for trainable leaves),
        // or a transient dequantised copy for 4/8-bit bases.
        let mut wcopy = None;
        let mut fwd_temp = 0.0;
        let mut bwd_temp = 0.0;
        if autocast {
            let t = self.tape.op(OpSpec {
                out_bytes: params * c.bytes(),
                cat: Cat::WeightCopies,
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
        // fp8: the input is kept in fp8 for the weight grad.
        let saved_in = if ctx.fp8 && trainable {
            self.op(&[xin], tokens * lin.inp as f64, DType::F8, &[])
        } else {
            xin
        };
        let mut saved = Vec::new();
        if trainable {
            saved.push(saved_in);
        }
        if let (Some(w), true) = (wcopy, x_rg) {
            saved.push(w);
        }
        let grad_bytes = params * ctx.g.bytes();
        if autocast && trainable {
            // The bf16 weight grad exists before its cast to the fp32 .grad.
            bwd_temp += params * c.bytes();
        }
        let mut inputs = vec![xin];
        if let Some(w) = wcopy {
            inputs.push(w);
        }
        if saved_in != xin {
            inputs.push(saved_in);
        }
        let y = self.op_spec(
            OpSpec {
                name: module,
                inputs: &inputs,
                out_bytes: tokens * lin.out as f64 * c.bytes(),
                saved: &saved,
                weights_rg: trainable,
                param_grads: grad_bytes,
                fwd_temp,
                bwd_temp,
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
        let scaled = self.op(&[b], tokens * out, f32, &[]);
        let sum = self.add(y, scaled, tokens * out);
        let c = self.d(y);
        self.cast(sum, tokens * out, c)
    }

    /// RMSNorm as Llama writes it: upcast, pow, mean, rsqrt, mul, downcast, weight mul.
    fn rms_norm(&mut self, x: Tid, width: f64, t: f64) -> Tid {
        let input = self.d(x);
        let f32 = DType::F32;
        let x32 = self.cast(x, t * width, f32);
        let sq = self.op(&[x32], t * width, f32, &[x32]);
        let var = self.op(&[sq], t, f32, &[]);
        let r = self.op_saving_output(&[var], t, f32, Cat::Activations);
        let n32 = self.mul(x32, r, t * width);
        let n = self.cast(n32, t * width, input);
        self.weight_mul(n, width, t)
    }

    /// `weight * x` of a norm: saves `x` for the weight's grad.
    fn weight_mul(&mut self, n: Tid, width: f64, t: f64) -> Tid {
        let trainable = self.ctx.base_trainable();
        let d = self.d(n);
        let saved: Vec<Tid> = if trainable { vec![n] } else { vec![] };
        self.op_spec(
            OpSpec {
                inputs: &[n],
                out_bytes: t * width * d.bytes(),
                saved: &saved,
                weights_rg: trainable,
                param_grads: width * self.ctx.g.bytes(),
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
        let stats = self.op(&[x], 2.0 * t, DType::F32, &[]);
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
        match self.ctx.arch.family {
            Family::Gpt2 => self.layer_norm(x, width, t),
            _ => self.rms_norm(x, width, t),
        }
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

    /// Rotary embedding on a projection: `x * cos + rotate_half(x) * sin`. The tables are
    /// fp32 under autocast (built from the fp32 hidden states), so the result promotes.
    fn rope(&mut self, x: Tid, elems: f64) -> Tid {
        let d = if self.ctx.autocast {
            DType::F32
        } else {
            self.d(x)
        };
        let tmp = 2.0 * elems * d.bytes();
        self.op_spec(
            OpSpec {
                inputs: &[x],
                out_bytes: elems * d.bytes(),
                fwd_temp: tmp,
                ..OpSpec::default()
            },
            d,
        )
    }

    /// The attention core over q (heads × dq), k (kv_heads × dq), v (kv_heads × dv); returns
    /// the output as `[tokens, heads × dv]`.
    fn attention_core(&mut self, q: Tid, k: Tid, v: Tid, shape: Heads) -> Tid {
        let Heads {
            heads,
            kv_heads,
            dq,
            dv,
        } = shape;
        let ctx = self.ctx;
        let (t, b, s) = (ctx.t, ctx.batch, ctx.seq);
        let c = ctx.c;
        let (hq, hk) = (heads as f64, kv_heads as f64);
        let out_elems = t * hq * dv as f64;
        let scores = b * hq * s * s;
        let p_drop = if ctx.train {
            ctx.arch.dropout.attn
        } else {
            0.0
        };
        let selective = ctx.recompute == Recompute::Selective && ctx.train;
        // Inputs under autocast are cast to the compute dtype by sdpa/matmul.
        let q = self.cast(q, t * hq * dq as f64, c);
        let k = self.cast(k, t * hk * dq as f64, c);
        let v = self.cast(v, t * hk * dv as f64, c);
        let kernel = if dq != dv && ctx.attention == Attention::Sdpa {
            // Flash needs equal head dims; the memory-efficient kernel does not.
            SdpaKernel::MemEfficient
        } else {
            ctx.sdpa_kernel(heads, kv_heads, dq)
        };
        match (ctx.attention, kernel) {
            (Attention::Sdpa, SdpaKernel::Flash | SdpaKernel::MemEfficient) => {
                // Saves q, k, v, the output and the per-row logsumexp; backward accumulates dq
                // in fp32.
                let lse = b * hq * s * 4.0;
                let mut fwd_temp = lse;
                let mut bwd_temp = t * hq * dq as f64 * 4.0 + lse;
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
                if ctx.cp > 1.0 && ctx.cp_lb {
                    // With load balancing, the ranks that merge partial outputs (the first,
                    // the worst) get the merged output back as (batch, heads, seq, dim): the
                    // model's transpose().contiguous() is a real copy, which the output
                    // projection saves.
                    return self.op(&[o], out_elems, c, &[]);
                }
                o
            }
            (Attention::Sdpa, SdpaKernel::Math) => {
                // ATen's math path: scale q, repeat_interleave k and v to all heads, matmul,
                // in-place mask add, softmax (saved), matmul.
                let qe = t * hq * dq as f64;
                let qs = self.op(&[q], qe, c, &[]);
                let kr = self.op(&[k], qe, c, &[]);
                let ks = self.op(&[kr], qe, c, &[]);
                let qk = [qs, ks];
                let sc = self.op_spec(
                    OpSpec {
                        inputs: &qk,
                        out_bytes: scores * c.bytes(),
                        saved: if selective { &[] } else { &qk },
                        fwd_temp: s * s * (1.0 + c.bytes()),
                        ..OpSpec::default()
                    },
                    c,
                );
                let p = self.softmax(sc, scores, c);
                let vr = self.op(&[v], t * hq * dv as f64, c, &[]);
                let o = self.op(&[p, vr], out_elems, c, &[p, vr]);
                // (b, h, s, d) → (b, s, h·d): a contiguous copy.
                self.op(&[o], out_elems, c, &[])
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
        let (t, b, s, c) = (ctx.t, ctx.batch, ctx.seq, ctx.c);
        let hq = heads as f64;
        let scores = b * hq * s * s;
        let out_elems = t * hq * dv as f64;
        let (kr, vr) = if heads != kv_heads {
            (
                self.op(&[k], t * hq * dq as f64, c, &[]),
                self.op(&[v], t * hq * dv as f64, c, &[]),
            )
        } else {
            (k, v)
        };
        let sc = self.op(&[q, kr], scores, c, &[q, kr]);
        let scaled = self.op(&[sc], scores, c, &[]);
        let masked = self.op(&[scaled], scores, c, &[]);
        let p = match ctx.arch.family {
            // GPT-2: softmax in the compute dtype (fp32 under autocast), then `.type(v.dtype)`.
            Family::Gpt2 => {
                let sd = if ctx.autocast { DType::F32 } else { c };
                let p = self.softmax(masked, scores, sd);
                self.cast(p, scores, c)
            }
            // Llama & co: `softmax(dtype=float32).to(query.dtype)`.
            _ => {
                let p32 = self.softmax(masked, scores, DType::F32);
                self.cast(p32, scores, c)
            }
        };
        let pd = self.dropout(p, scores, p_drop);
        let o = self.op(&[pd, vr], out_elems, c, &[pd, vr]);
        self.op(&[o], out_elems, c, &[])
    }

    /// Self-attention of the layer (norm included); returns the attention output projection.
    fn attention_block(&mut self, x: Tid) -> (Tid, Tid) {
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let h = a.hidden as f64;
        let tp = ctx.tp;
        // Heads on this rank.
        let (heads, kv_heads) = (
            (a.heads as f64 / tp) as u64,
            (a.kv_heads as f64 / tp) as u64,
        );
        let lin = a.attention_linears();
        let y = self.norm(x, h, ctx.tsp);
        let yf = self.enter_tp(y, h);
        if let Some(m) = &a.mla {
            let o = self.mla_attention(yf, &lin, m.clone());
            return (y, self.leave_tp(o, h));
        }
        let o = match a.family {
            Family::Gpt2 => {
                let qkv = self.linear(yf, lin[0].1, lin[0].0, t);
                let e = t * h / tp * ctx.c.bytes();
                let parts = self.tape.split(qkv, &[e, e, e]);
                for &p in &parts {
                    self.reg(p, ctx.c);
                }
                let core = self.attention_core(
                    parts[0],
                    parts[1],
                    parts[2],
                    Heads {
                        heads,
                        kv_heads: heads,
                        dq: a.head_dim,
                        dv: a.head_dim,
                    },
                );
                let proj = self.linear(core, lin[1].1, lin[1].0, t);
                let proj = self.leave_tp(proj, h);
                self.dropout(proj, ctx.tsp * h, a.dropout.resid)
            }
            _ => {
                let q = self.linear(yf, lin[0].1, lin[0].0, t);
                let k = self.linear(yf, lin[1].1, lin[1].0, t);
                let v = self.linear(yf, lin[2].1, lin[2].0, t);
                let q = self.rope(q, t * (heads * a.head_dim) as f64);
                let k = self.rope(k, t * (kv_heads * a.head_dim) as f64);
                if !ctx.train {
                    self.kv.push(k);
                    self.kv.push(v);
                }
                let core = self.attention_core(
                    q,
                    k,
                    v,
                    Heads {
                        heads,
                        kv_heads,
                        dq: a.head_dim,
                        dv: a.head_dim,
                    },
                );
                let o = self.linear(core, lin[3].1, lin[3].0, t);
                self.leave_tp(o, h)
            }
        };
        (y, o)
    }

    /// DeepSeek's multi-head latent attention (transformers `DeepseekV3Attention`).
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
            let qa = self.linear(y, lin[0].1, lin[0].0, t);
            let qn = self.rms_norm(qa, lin[0].1.out as f64, t);
            i = 2;
            self.linear(qn, lin[1].1, lin[1].0, t)
        } else {
            i += 1;
            self.linear(y, lin[0].1, lin[0].0, t)
        };
        let kva = self.linear(y, lin[i].1, lin[i].0, t);
        let kvn = self.rms_norm(kva, m.kv_lora_rank as f64, t);
        let kvb = self.linear(kvn, lin[i + 1].1, lin[i + 1].0, t);
        let dq = m.qk_nope_head_dim + m.qk_rope_head_dim;
        // q_rot/k_rot through RoPE, then cat into full query and key (new tensors).
        let qr = self.rope(q, t * heads * m.qk_rope_head_dim as f64);
        let query = self.op(&[q, qr], t * heads * dq as f64, ctx.c, &[]);
        let kr = self.rope(kva, t * m.qk_rope_head_dim as f64);
        let key = self.op(&[kvb, kr], t * heads * dq as f64, ctx.c, &[]);
        let value = self.op(&[kvb], t * heads * m.v_head_dim as f64, ctx.c, &[]);
        if !ctx.train {
            self.kv.push(key);
            self.kv.push(value);
        }
        let core = self.attention_core(
            query,
            key,
            value,
            Heads {
                heads: a.heads,
                kv_heads: a.heads,
                dq,
                dv: m.v_head_dim,
            },
        );
        self.linear(core, lin[i + 2].1, lin[i + 2].0, t)
    }

    /// A dense MLP of width `i` over `y` (`tokens` rows); under tensor parallelism the
    /// intermediate is this rank's slice and the output a partial sum.
    fn mlp(&mut self, y: Tid, i: u64, tokens: f64) -> Tid {
        let a = self.ctx.arch;
        let lin = a.mlp_linears(i);
        let ie = tokens * (i as f64 / self.ctx.tp).ceil();
        match a.family {
            Family::Gpt2 => {
                let hdn = self.linear(y, lin[0].1, lin[0].0, tokens);
                let act = self.activation(hdn, ie);
                let out = self.linear(act, lin[1].1, lin[1].0, tokens);
                self.dropout(out, tokens * a.hidden as f64, a.dropout.resid)
            }
            _ => {
                let gate = self.linear(y, lin[0].1, lin[0].0, tokens);
                let act = self.activation(gate, ie);
                let up = self.linear(y, lin[1].1, lin[1].0, tokens);
                let m = self.mul(act, up, ie);
                self.linear(m, lin[2].1, lin[2].0, tokens)
            }
        }
    }

    fn activation(&mut self, x: Tid, elems: f64) -> Tid {
        let d = self.d(x);
        match self.ctx.arch.activation {
            Activation::Silu | Activation::Gelu => self.op(&[x], elems, d, &[x]),
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
                let t1 = self.op(&[p3], elems, pd, &[]);
                let t2 = self.add(x, t1, elems);
                let t3 = self.op(&[t2], elems, self.d(t2), &[]);
                let th = self.op_saving_output(&[t3], elems, self.d(t3), Cat::Activations);
                let u = self.op(&[th], elems, self.d(th), &[]);
                let hx = self.op(&[x], elems, d, &[]);
                self.mul(hx, u, elems)
            }
        }
    }

    /// The routed (and shared) experts of a MoE layer over `y`, as transformers' eager
    /// expert loop runs them: each expert gathers its tokens, runs its MLP, scales by the
    /// routing weight, and index-adds into the output. Experts are grouped into at most 8
    /// groups of equal token counts (saved bytes are exact; transients per group).
    fn moe(&mut self, y: Tid) -> Tid {
        if self.ctx.ep_titan {
            return self.moe_titan(y);
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let m = a.moe.as_ref().expect("moe layer");
        let t = ctx.t;
        let h = a.hidden as f64;
        let c = ctx.c;
        let trainable = ctx.base_trainable();
        // Router: linear to expert logits, fp32 softmax (saved), top-k.
        let router = Linear::new(a.hidden, m.experts, false);
        let logits = self.linear(y, router, "gate", t);
        let probs = self.op_saving_output(
            &[logits],
            t * m.experts as f64,
            DType::F32,
            Cat::Activations,
        );
        let weights = self.op(&[probs], t * m.top_k as f64, c, &[]);
        let groups = m.experts.min(8);
        // Under transformers' expert-parallel plan a rank holds `experts / ep` of them.
        let per_group = m.experts as f64 / groups as f64 / ctx.ep;
        let tokens = t * m.top_k as f64 / groups as f64;
        let one_expert: u64 = a
            .mlp_linears(m.expert_intermediate)
            .iter()
            .map(|(_, l)| l.params())
            .sum();
        // transformers 5 runs the experts outside autocast: in the parameters' dtype, with no
        // low-precision weight copies (measured: Mixtral under amp-bf16 keeps fp32 expert
        // activations, tests/data).
        let ec = if ctx.autocast { ctx.w } else { c };
        self.native = ctx.autocast;
        let yd = self.d(y);
        let mut out = self.op(&[y], t * h, yd, &[]);
        // Each expert's select-backward materialises a grad of the whole stacked parameter,
        // accumulated into .grad: a transient after the first.
        let stacked = (one_expert * m.experts) as f64 / ctx.ep * ctx.g.bytes();
        for _ in 0..groups {
            let cur = self.op(&[y], tokens * h, ec, &[]);
            // One group stands for `per_group` experts: their stacked weights.
            let e = self.expert_mlp(cur, m.expert_intermediate, tokens, per_group);
            let scaled = self.mul(e, weights, tokens * h);
            let merged = self.op_spec(
                OpSpec {
                    inputs: &[out, scaled],
                    out_bytes: t * h * yd.bytes(),
                    bwd_temp: if trainable { stacked } else { 0.0 },
                    passthrough: true,
                    ..OpSpec::default()
                },
                yd,
            );
            out = merged;
        }
        self.native = false;
        if m.shared_experts > 0 {
            let s = self.mlp(y, m.shared_experts * m.expert_intermediate, t);
            out = self.add(out, s, t * h);
        }
        out
    }

    /// `experts` experts' SwiGLU MLPs (width `i` each) over `tokens` gathered rows in total,
    /// with their fused gate_up projection: each row passes through one expert.
    fn expert_mlp(&mut self, x: Tid, i: u64, tokens: f64, experts: f64) -> Tid {
        let a = self.ctx.arch;
        let h = a.hidden;
        let ie = tokens * i as f64;
        let n = experts;
        let gu = self.linear_n(x, Linear::new(h, 2 * i, false), "experts", tokens, n);
        let c = self.d(gu);
        let e = ie * c.bytes();
        let parts = self.tape.split(gu, &[e, e]);
        for &p in &parts {
            self.reg(p, c);
        }
        let act = self.op(&[parts[0]], ie, c, &[parts[0]]);
        let m = self.mul(act, parts[1], ie);
        self.linear_n(m, Linear::new(i, h, false), "experts", tokens, n)
    }

    /// One decoder layer over `x`; returns its output.
    pub fn decoder_layer(&mut self, x: Tid, kind: crate::arch::LayerKind) -> Tid {
        if self.ctx.megatron {
            return self.mc_layer(x, kind);
        }
        let moe_layer = kind.moe;
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        // The model's loop keeps the layer's input referenced until the layer returns.
        self.tape.hold(x);
        let (y, attn) = self.attention_block(x);
        self.tape.touch(&[y]);
        let r1 = self.add(x, attn, ctx.tsp * h);
        let y2 = self.norm(r1, h, ctx.tsp);
        let y2f = self.enter_tp(y2, h);
        let mlp = if moe_layer {
            self.moe(y2f)
        } else {
            self.mlp(y2f, a.intermediate, ctx.t)
        };
        let mlp = self.leave_tp(mlp, h);
        self.tape.touch(&[y2]);
        let out = self.add(r1, mlp, ctx.tsp * h);
        self.tape.set_output(out);
        out
    }

    /// Token (and position) embeddings; returns the first layer's input.
    pub fn embedding(&mut self) -> Tid {
        if self.ctx.megatron {
            return self.mc_embedding();
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let t = ctx.t;
        let h = a.hidden as f64;
        let ids = self.input(t, DType::F32, false);
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
        // Tied: the head's grad was created first; the embedding's dense grad is summed
        // into it (a transient). Untied: it becomes the .grad.
        let (pg, bt) = if a.tied_embeddings {
            (0.0, vh)
        } else {
            (vh, 0.0)
        };
        let e = self.op_spec(
            OpSpec {
                inputs: &[ids],
                out_bytes: t * h * ed.bytes(),
                weights_rg: trainable,
                param_grads: pg,
                bwd_temp: bt,
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
            let sum = self.add(e, pos, t * h);
            self.dropout(sum, t * h, a.dropout.embd)
        } else {
            e
        };
        // A vocabulary-parallel embedding's output is a partial sum over the ranks.
        let out = self.leave_tp(out, h);
        self.tape.set_output(out);
        out
    }

    /// Final norm, LM head and the loss (training) or last-token logits (generation).
    pub fn head(&mut self, x: Tid) -> Tid {
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let v = a.vocab as f64;
        let y = self.norm(x, h, ctx.t);
        let head = Linear::new(a.hidden, a.vocab, false);
        if !ctx.train {
            // generate(): logits of the last position only, then an fp32 copy.
            let rows = ctx.batch;
            let last = self.op(&[y], rows * h, self.d(y), &[]);
            let l = self.head_linear(last, head, rows);
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
                let ls = self.op_saving_output(&[l32], t * v, DType::F32, Cat::Logits);
                let loss = self.op(&[ls], 1.0, DType::F32, &[]);
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
        if self.ctx.megatron {
            return self.mc_head(x);
        }
        let ctx = self.ctx;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let y = self.norm(x, h, ctx.tsp);
        let out = match ctx.loss {
            Loss::Standard => {
                let yf = self.enter_tp(y, h);
                // Column-parallel: this rank's slice of the vocabulary.
                let vl = (a.vocab as f64 / ctx.tp).ceil() as u64;
                let local = self.head_linear(yf, Linear::new(a.hidden, vl, false), ctx.t);
                if ctx.tp > 1.0 && !ctx.lp {
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
                }
            }
            Loss::Fused => y,
        };
        self.tape.set_output(out);
        (out, self.d(out))
    }

    /// Training: the loss over the head's output `x` (the logits, which the caller keeps as
    /// `out.logits`; or the normed hidden state a fused loss takes).
    pub fn loss(&mut self, x: Tid) -> Tid {
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
                let loss = self.op(&[ls], 1.0, DType::F32, &[]);
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
                let ls = self.op_saving_output(&[l32], t * v, DType::F32, Cat::Logits);
                let loss = self.op(&[ls], 1.0, DType::F32, &[]);
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
                        name: "fused linear cross-entropy",
                        inputs: &[x],
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

    /// A stretch's input of `bytes` (a tensor the previous stretch made, e.g. the logits).
    pub fn input_bytes(&mut self, bytes: f64, d: DType, rg: bool, cat: Cat) -> Tid {
        let t = self.tape.input_cat(bytes, rg, cat);
        self.reg(t, d)
    }

    fn head_linear(&mut self, x: Tid, lin: Linear, rows: f64) -> Tid {
        // The LM head stays in the compute dtype under QLoRA (bitsandbytes skips it).
        let ctx = self.ctx;
        let trainable = ctx.base_trainable();
        let xin = if ctx.autocast {
            self.cast(x, rows * lin.inp as f64, ctx.c)
        } else {
            x
        };
        let params = lin.params() as f64;
        let mut inputs = vec![xin];
        let mut saved = Vec::new();
        if trainable {
            saved.push(xin);
        }
        let mut bwd_temp = 0.0;
        if ctx.autocast {
            let w = self.tape.op(OpSpec {
                out_bytes: params * ctx.c.bytes(),
                cat: Cat::WeightCopies,
                ..OpSpec::default()
            });
            self.reg(w, ctx.c);
            if trainable {
                self.tape.cache(w);
                bwd_temp = params * ctx.c.bytes();
            }
            if self.tape.requires_grad(x) {
                saved.push(w);
            }
            inputs.push(w);
        }
        self.op_spec(
            OpSpec {
                inputs: &inputs,
                out_bytes: rows * lin.out as f64 * ctx.c.bytes(),
                saved: &saved,
                cat: Cat::Logits,
                weights_rg: trainable,
                param_grads: params * ctx.g.bytes(),
                bwd_temp,
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
