//! The scenario: what is run, on what, how. Parsed from JSON with errors naming the field.

use serde_json::Value;

use crate::arch::Architecture;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gpu::{self, Gpu};
use crate::hf::{self, kind, truncate, Obj};
use crate::precision::{Optimizer, Precision};
use crate::presets;

#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Model {
    /// A full architecture: everything is modelled.
    Arch { name: String, arch: Architecture },
    /// Only a parameter count: model states only (no activations, no logits).
    Params(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Train,
    Inference,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recompute {
    None,
    /// Megatron's selective recomputation: the attention core (scores, softmax, dropout) is
    /// recomputed; with fused (flash) attention there is nothing more to drop.
    Selective,
    /// Every decoder layer checkpointed (Hugging Face `gradient_checkpointing_enable`).
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// `attn_implementation="sdpa"`: PyTorch picks flash, memory-efficient or math kernels.
    Sdpa,
    /// `attn_implementation="eager"`: attention probabilities materialised and saved.
    Eager,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Hugging Face `ForCausalLMLoss`: logits upcast to fp32, then cross-entropy.
    Standard,
    /// A fused/chunked linear + cross-entropy (Liger-style): logits never materialised whole.
    Fused,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Finetune {
    Full,
    Lora(Lora),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Lora {
    pub rank: u64,
    /// Module names adapted (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
    pub targets: Vec<String>,
    /// QLoRA: base weights in 4-bit NF4.
    pub quantized: bool,
}

/// Which training engine shards the data-parallel states, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// PyTorch: DDP (`zero` 0) or FSDP/FSDP2 (`zero` 2 = SHARD_GRAD_OP, 3 = FULL_SHARD).
    Fsdp,
    /// DeepSpeed ZeRO stages 0–3 (its own buffers, and the optimizer's partitions of the
    /// parameters and their gradients).
    DeepSpeed,
    /// Megatron-LM: gradients live in one contiguous buffer the reduction works on in place;
    /// `zero` 1 is its distributed optimizer, 2–3 Megatron-FSDP.
    Megatron,
}

/// How FSDP2 wraps the model into units (each unit is gathered and reduced as one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrap {
    /// Each decoder layer, and a root holding the embedding, the final norm and the LM head.
    Layers,
    /// torchtitan's `apply_fsdp`: the embedding, each decoder layer, [final norm, LM head]
    /// (never resharded after forward), and a root holding nothing.
    Titan,
}

/// How expert parallelism moves tokens to the experts (framework `fsdp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpImpl {
    /// torchtitan's: each rank routes its own tokens, sends each (token, expert) row to the
    /// rank holding the expert (all-to-all), and combines the results back.
    Titan,
    /// transformers' expert-parallel plan: every rank routes all tokens; a rank's grouped
    /// GEMMs skip the rows of experts it does not hold, the outputs are all-reduced.
    Hf,
}

/// How micro-batches flow through pipeline stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// One forward, one backward (PipeDream-Flush / Megatron's default).
    OneFOneB,
    /// All forwards, then all backwards (`ScheduleGPipe`).
    GPipe,
    /// Megatron's interleaved schedule with this many model chunks per stage.
    Interleaved(u64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parallel {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// ZeRO stage: 1 shards optimizer states (and master weights), 2 also gradients, 3 also
    /// the weights.
    pub zero: u8,
    pub framework: Framework,
    /// FSDP HYBRID_SHARD / ZeRO++ hpZ: states are sharded within groups of this many
    /// data-parallel ranks and replicated across groups (default: all of dp).
    pub shard_group: u64,
    /// Sequence parallelism with tensor parallelism (Megatron `--sequence-parallel`).
    pub sp: bool,
    /// Optimizer states (and master weights) kept in CPU memory (ZeRO-Offload, FSDP offload).
    pub offload_optimizer: bool,
    /// Parameters kept in CPU memory between uses (ZeRO-3 offload_param, FSDP CPU offload).
    pub offload_params: bool,
    /// Micro-batches per optimizer step (gradient accumulation; the pipeline's micro-batches).
    pub grad_accum: u64,
    pub schedule: Schedule,
    /// MoE: tokens each expert accepts, relative to an even share.
    pub capacity_factor: f64,
    /// FSDP2's units.
    pub wrap: Wrap,
    /// Tensor parallelism keeps the logits sharded over the vocabulary and computes the loss
    /// there (`loss_parallel()`); otherwise they are all-gathered on every rank.
    pub loss_parallel: bool,
    /// Megatron-LM: the gradient buffer (`main_grad`) and its reduction in bf16
    /// (`--grad-reduce-in-bf16`) instead of fp32.
    pub grad_reduce_in_bf16: bool,
    /// Expert parallelism's token dispatch.
    pub ep_impl: EpImpl,
    /// Context parallelism balances the causal work by giving each rank a head and a tail
    /// chunk of the sequence (torch's default); ranks that merge partial outputs keep one
    /// more copy of the attention output per layer.
    pub cp_load_balance: bool,
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel {
            dp: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            zero: 0,
            framework: Framework::Fsdp,
            shard_group: 1,
            sp: true,
            offload_optimizer: false,
            offload_params: false,
            grad_accum: 1,
            schedule: Schedule::OneFOneB,
            capacity_factor: 1.0,
            wrap: Wrap::Layers,
            loss_parallel: true,
            grad_reduce_in_bf16: false,
            ep_impl: EpImpl::Titan,
            cp_load_balance: true,
        }
    }
}

impl Parallel {
    pub fn gpus(&self) -> u64 {
        self.dp * self.tp * self.pp * self.cp * self.ep
    }

    /// Ranks a sharded state is divided over.
    pub fn shard_ranks(&self) -> u64 {
        self.shard_group.clamp(1, self.dp)
    }

    /// Whether anything beyond data parallelism splits the model.
    pub fn model_parallel(&self) -> bool {
        self.tp > 1 || self.pp > 1 || self.cp > 1 || self.ep > 1
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub model: Model,
    pub mode: Mode,
    pub batch: u64,
    pub seq: u64,
    pub new_tokens: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub recompute: Recompute,
    pub attention: Attention,
    pub loss: Loss,
    pub finetune: Finetune,
    pub parallel: Parallel,
    pub gpu_name: String,
    pub capacity_bytes: u64,
    /// PyTorch's CUDA caching allocator settings (`PYTORCH_CUDA_ALLOC_CONF`).
    pub allocator: Allocator,
}

/// `PYTORCH_CUDA_ALLOC_CONF` as the allocator model reads it ([`crate::alloc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocator {
    /// `expandable_segments:True`.
    pub expandable: bool,
    /// `max_split_size_mb` (none: unlimited, the default).
    pub max_split_mb: Option<u64>,
    /// Replay the run through the allocator (`"none"` turns it off: the reserved figures
    /// are then the allocated peak, as a quick bound a sweep can afford).
    pub replay: bool,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator {
            expandable: false,
            max_split_mb: None,
            replay: true,
        }
    }
}

impl Allocator {
    /// The setting's name: "default", "expandable" (with `max_split_size_mb` when set) or
    /// "none".
    pub fn name(&self) -> String {
        if !self.replay {
            return "none".into();
        }
        let base = if self.expandable {
            "expandable"
        } else {
            "default"
        };
        match self.max_split_mb {
            Some(m) => format!("{base}, max_split_size_mb {m}"),
            None => base.to_string(),
        }
    }
}

/// What DeepSpeed is modelled for (a scenario asking it for more is refused with this).
pub(crate) const DEEPSPEED_LAYOUTS: &str = "DeepSpeed is modelled for ZeRO data parallelism (stages 0-3, offload); tensor, pipeline, context and expert parallelism are modelled for \"fsdp\" (PyTorch: DTensor, torch.distributed.pipelining, context_parallel) and \"megatron\"";

const ALLOCATOR_VALUES: &str = "must be 'default', 'expandable', 'none' or {\"expandable_segments\": true|false, \"max_split_size_mb\": N}";

/// The largest `max_split_size_mb` accepted (1 TiB): above any device.
const MAX_SPLIT_MB: u64 = 1 << 20;

/// `"allocator"`: `"default"`, `"expandable"`, or an object with `expandable_segments`
/// (bool) and `max_split_size_mb` (a count of MiB, above 20 as PyTorch requires).
fn parse_allocator(v: &Value) -> Result<Allocator> {
    match v {
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "default" | "native" => Ok(Allocator::default()),
            "expandable" | "expandable_segments" | "expandable_segments:true" => Ok(Allocator {
                expandable: true,
                ..Allocator::default()
            }),
            "none" | "off" => Ok(Allocator {
                replay: false,
                ..Allocator::default()
            }),
            _ => Err(Error::new("allocator", ALLOCATOR_VALUES)),
        },
        // (Only a hand-written scenario gives an object: the knobs write a name. Left out of
        // the wasm.)
        Value::Object(_) if cfg!(not(target_arch = "wasm32")) => {
            let o = Obj::new(v, "allocator")?;
            o.only(&["expandable_segments", "max_split_size_mb"])?;
            let expandable = match o.get("expandable_segments") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(Error::new(
                        "allocator.expandable_segments",
                        "must be true or false",
                    ))
                }
            };
            let max_split_mb = o.u64_opt("max_split_size_mb")?;
            if let Some(m) = max_split_mb {
                // PyTorch refuses sizes up to kLargeBuffer (20 MiB).
                if m <= 20 || m > MAX_SPLIT_MB {
                    return Err(Error::new(
                        "allocator.max_split_size_mb",
                        format!("must be above 20 and at most {MAX_SPLIT_MB}, got {m}"),
                    ));
                }
            }
            Ok(Allocator {
                expandable,
                max_split_mb,
                replay: true,
            })
        }
        _ => Err(Error::new("allocator", ALLOCATOR_VALUES)),
    }
}

const MAX_BATCH: u64 = 1 << 24;
const MAX_SEQ: u64 = 1 << 27;
pub(crate) const MAX_TOKENS: u64 = 1 << 40;
pub(crate) const MAX_GPUS: u64 = 1 << 20;

pub const LORA_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "c_attn",
    "c_proj",
    "c_fc",
];

impl Scenario {
    /// Parse a scenario from JSON text.
    pub fn from_json_str(text: &str) -> Result<Scenario> {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            Error::new(
                "",
                format!(
                    "malformed JSON at line {} column {}: {}",
                    e.line(),
                    e.column(),
                    crate::error::json_fault(&e)
                ),
            )
        })?;
        Scenario::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<Scenario> {
        let o = Obj::new(v, "").map_err(|_| Error::new("scenario", "must be a JSON object"))?;
        o.only(&[
            "model",
            "mode",
            "batch",
            "seq",
            "new_tokens",
            "precision",
            "optimizer",
            "recompute",
            "attention",
            "loss",
            "finetune",
            "parallel",
            "gpu",
            "allocator",
        ])?;
        let model = match o.get("model") {
            None => return Err(Error::new("model", "is required but missing")),
            Some(m) => parse_model(m)?,
        };
        let mode = match o.str_opt("mode")?.map(|s| s.to_ascii_lowercase()) {
            None => Mode::Train,
            Some(s) if s == "train" || s == "training" => Mode::Train,
            Some(s) if s == "inference" || s == "generate" => Mode::Inference,
            Some(s) => {
                return Err(Error::new(
                    "mode",
                    format!("must be 'train' or 'inference', got '{}'", truncate(&s, 20)),
                ))
            }
        };
        let count = |k: &str, default: u64, min: u64, max: u64| -> Result<u64> {
            let v = o.u64_opt(k)?.unwrap_or(default);
            if v < min {
                Err(Error::new(k, format!("must be at least {min}, got {v}")))
            } else if v > max {
                Err(Error::new(k, format!("{v} is beyond the supported {max}")))
            } else {
                Ok(v)
            }
        };
        let batch = count("batch", 1, 1, MAX_BATCH)?;
        let seq = count("seq", 2048, 1, MAX_SEQ)?;
        let new_tokens = count("new_tokens", 1, 0, MAX_SEQ)?;
        // Training generates nothing: its tokens are batch × seq.
        let generated = if mode == Mode::Inference {
            new_tokens
        } else {
            0
        };
        if batch * (seq + generated) > MAX_TOKENS {
            return Err(Error::new(
                "batch",
                format!(
                    "batch × (seq + new_tokens when generating) = {} tokens is beyond the supported 2^40",
                    batch * (seq + generated)
                ),
            ));
        }
        let precision = match o.get("precision") {
            None => Precision::recipe("bf16").expect("bf16 recipe"),
            Some(p) => Precision::parse(p, "precision")?,
        };
        let optimizer = match o.str_opt("optimizer")? {
            None => Optimizer::Adam,
            Some(s) => Optimizer::parse(s).ok_or_else(|| {
                Error::new(
                    "optimizer",
                    format!(
                        "unknown optimizer '{}' (one of: {})",
                        truncate(s, 30),
                        Optimizer::NAMES.join(", ")
                    ),
                )
            })?,
        };
        let recompute = match o.get("recompute") {
            None => Recompute::None,
            Some(Value::Bool(true)) => Recompute::Full,
            Some(Value::Bool(false)) => Recompute::None,
            Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
                "none" | "off" => Recompute::None,
                "selective" => Recompute::Selective,
                "full" | "on" => Recompute::Full,
                other => {
                    return Err(Error::new(
                        "recompute",
                        format!(
                            "must be none, selective or full, got '{}'",
                            truncate(other, 20)
                        ),
                    ))
                }
            },
            Some(other) => {
                return Err(Error::new(
                    "recompute",
                    format!("must be none, selective or full, got {}", kind(other)),
                ))
            }
        };
        let attention = match o.str_opt("attention")?.map(|s| s.to_ascii_lowercase()) {
            None => Attention::Sdpa,
            Some(s) if ["flash", "sdpa", "fused", "flash_attention_2"].contains(&s.as_str()) => {
                Attention::Sdpa
            }
            Some(s) if s == "eager" => Attention::Eager,
            Some(s) => {
                return Err(Error::new(
                    "attention",
                    format!(
                        "must be 'flash' (sdpa) or 'eager', got '{}'",
                        truncate(&s, 20)
                    ),
                ))
            }
        };
        let loss = match o.str_opt("loss")?.map(|s| s.to_ascii_lowercase()) {
            None => Loss::Standard,
            Some(s) if s == "standard" || s == "hf" => Loss::Standard,
            Some(s) if s == "fused" || s == "chunked" => Loss::Fused,
            Some(s) => {
                return Err(Error::new(
                    "loss",
                    format!("must be 'standard' or 'fused', got '{}'", truncate(&s, 20)),
                ))
            }
        };
        let finetune = match o.get("finetune") {
            None => Finetune::Full,
            Some(f) => parse_finetune(f)?,
        };
        let parallel = match o.get("parallel") {
            None => Parallel::default(),
            Some(p) => parse_parallel(p)?,
        };
        let allocator = match o.get("allocator") {
            None => Allocator::default(),
            Some(a) => parse_allocator(a)?,
        };
        let (gpu_name, capacity_bytes) = match o.get("gpu") {
            None => {
                let g = gpu::find("H100-80GB").expect("H100 in catalogue");
                (g.name.to_string(), g.capacity_bytes)
            }
            Some(g) => parse_gpu(g)?,
        };
        let s = Scenario {
            model,
            mode,
            batch,
            seq,
            new_tokens,
            precision,
            optimizer,
            recompute,
            attention,
            loss,
            finetune,
            parallel,
            gpu_name,
            capacity_bytes,
            allocator,
        };
        s.check()?;
        Ok(s)
    }

    /// Cross-field checks.
    pub(crate) fn check(&self) -> Result<()> {
        if let Model::Arch { arch, .. } = &self.model {
            if let Some(n) = arch.learned_positions {
                // Generation feeds back every new token but the last (sampled from the final
                // logits, never run through the model).
                let need = self.seq
                    + if self.mode == Mode::Inference {
                        self.new_tokens.saturating_sub(1)
                    } else {
                        0
                    };
                if need > n {
                    return Err(Error::new(
                        "seq",
                        format!(
                            "{need} positions exceed the model's {n} learned position embeddings"
                        ),
                    ));
                }
            }
        }
        // peft refuses targets that name no module of the model (GPT-2's c_attn, a fused
        // qkv_proj): no adapter, nothing trained.
        if let (Model::Arch { arch, .. }, Finetune::Lora(l)) = (&self.model, &self.finetune) {
            if cfg!(not(target_arch = "wasm32"))
                && crate::estimate::lora_params(arch, &l.targets, l.rank).is_empty()
            {
                return Err(Error::new(
                    "finetune",
                    format!(
                        "no LoRA target ({}) is a linear layer of this model",
                        l.targets.join(", ")
                    ),
                ));
            }
        }
        let w = self.precision.weights;
        let quantized_ok =
            matches!(self.finetune, Finetune::Lora(_)) || self.mode == Mode::Inference;
        if !w.is_float_compute() && !quantized_ok {
            return Err(Error::new(
                "precision.weights",
                format!("{w} weights cannot be trained directly: use LoRA/QLoRA (finetune) or inference"),
            ));
        }
        let p = &self.parallel;
        let sharded_native = p.framework == Framework::Megatron
            || (p.framework == Framework::Fsdp && (p.dp > 1 || p.model_parallel()));
        if self.optimizer == Optimizer::PagedAdam8bit && sharded_native {
            return Err(Error::new(
                "optimizer",
                "paged-adamw-8bit (states in CUDA managed memory) is modelled on one GPU and under DeepSpeed; for this layout use adamw-8bit",
            ));
        }
        self.check_layout()
    }

    /// The constraints a layout must meet, each named when it fails.
    fn check_layout(&self) -> Result<()> {
        let p = self.parallel;
        let err = |k: &str, m: String| Err(Error::new(format!("parallel.{k}"), m));
        if self.mode == Mode::Inference {
            // The first of them set (a scenario of `pp` 2 was refused as `tp`).
            let set = [("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)]
                .into_iter()
                .find(|x| x.1 > 1);
            if let Some((k, _)) = set {
                return err(
                    k,
                    "tensor, pipeline, context and expert parallelism are modelled for training only"
                        .into(),
                );
            }
            // Sharded weights would be gathered layer by layer, which inference does not
            // model: it counted a ZeRO-3 rank's shard alone.
            if p.zero > 0 {
                return err(
                    "zero",
                    "ZeRO and FSDP shard training's states; inference is modelled with each GPU holding the whole model (data-parallel replicas: zero 0)".into(),
                );
            }
        }
        let Model::Arch { arch: a, .. } = &self.model else {
            if p.model_parallel() {
                return err(
                    "tp",
                    "tp, pp, cp and ep need an architecture, not only a parameter count".into(),
                );
            }
            // Adapters go on named modules: without them the run would be full fine-tuning.
            if !matches!(self.finetune, Finetune::Full) {
                return Err(Error::new(
                    "finetune",
                    "LoRA and QLoRA need an architecture, not only a parameter count",
                ));
            }
            return Ok(());
        };
        // Tensor parallelism splits every kind of head: query, key/value (not MLA's, which
        // are expanded per query head), and a linear-attention layer's key and value heads.
        let mut heads = vec![("attention heads", a.heads)];
        if a.mla.is_none() {
            heads.push(("key/value heads", a.kv_heads));
        }
        if let Some(x) = &a.linear {
            heads.push(("linear-attention key heads", x.key_heads));
            heads.push(("linear-attention value heads", x.value_heads));
        }
        if let Some((what, n)) = heads.iter().find(|(_, n)| n % p.tp != 0) {
            let g = heads.iter().fold(0, |g, (_, n)| gcd(g, *n));
            return err(
                "tp",
                format!(
                    "{what} ({n}) must be divisible by tp ({}); {}",
                    p.tp,
                    nearest_tp(g, p.tp)
                ),
            );
        }
        if p.pp > a.layers {
            return err(
                "pp",
                format!("pp ({}) exceeds the model's {} layers", p.pp, a.layers),
            );
        }
        if let Schedule::Interleaved(v) = p.schedule {
            if a.layers % (p.pp * v) != 0 {
                return err(
                    "virtual_stages",
                    format!(
                        "the interleaved schedule needs layers ({}) divisible by pp × virtual_stages ({})",
                        a.layers,
                        p.pp * v
                    ),
                );
            }
        }
        let chunks = if p.cp_load_balance { 2 * p.cp } else { p.cp };
        if p.cp > 1 && !self.seq.is_multiple_of(chunks) {
            return err(
                "cp",
                format!(
                    "seq ({}) must be divisible by {} ({}cp) for ring attention",
                    self.seq,
                    chunks,
                    if p.cp_load_balance { "2 × " } else { "" }
                ),
            );
        }
        match &a.moe {
            None if p.ep > 1 => {
                return err(
                    "ep",
                    format!("ep ({}) needs a mixture-of-experts model", p.ep),
                )
            }
            Some(m) if m.experts % p.ep != 0 => {
                return err(
                    "ep",
                    format!("experts ({}) must be divisible by ep ({})", m.experts, p.ep),
                )
            }
            _ => {}
        }
        if p.model_parallel() && !matches!(self.finetune, Finetune::Full) {
            return err("tp", "LoRA with tp, pp, cp or ep is not modelled".into());
        }
        if self.mode == Mode::Train
            && p.framework == Framework::Megatron
            && !matches!(self.finetune, Finetune::Full)
        {
            return err(
                "framework",
                "LoRA and QLoRA are modelled under PyTorch (peft), not Megatron-LM: use framework \"fsdp\" or \"deepspeed\"".into(),
            );
        }
        if self.mode == Mode::Train
            && p.framework == Framework::Megatron
            && self.loss == Loss::Fused
        {
            return Err(Error::new(
                "loss",
                "\"fused\" is Liger's kernel for Hugging Face models; Megatron-LM computes its own vocabulary-parallel cross-entropy (use \"standard\")",
            ));
        }
        if p.model_parallel() && p.framework == Framework::DeepSpeed {
            return err("framework", DEEPSPEED_LAYOUTS.into());
        }
        // DeepSpeed keeps 16-bit training's master weights in the parameters' dtype only
        // through ZeRO's `bf16_master_weights_and_grads` (with `bf16_optimizer_states`, on
        // the GPU); an fp16 master needs the CPU optimizer (deepspeed/runtime/base_optimizer.py,
        // `_configure_master_weights`). (Without ZeRO its FP16_Optimizer keeps fp32 masters,
        // which `DpStates` counts.)
        let w = self.precision.weights;
        if self.mode == Mode::Train
            && p.framework == Framework::DeepSpeed
            && p.zero > 0
            && self.precision.master.is_none()
            && matches!(w, DType::Bf16 | DType::F16)
        {
            if w == DType::F16 {
                return Err(Error::new(
                    "precision",
                    "DeepSpeed keeps fp16 master weights under ZeRO only with its CPU optimizer (fp16_master_weights_and_grads): give the precision an fp32 master",
                ));
            }
            let float_states =
                !matches!(self.optimizer, Optimizer::Sgd) && !self.optimizer.eight_bit();
            if self.precision.optimizer == DType::F32 && float_states && !p.offload_optimizer {
                return Err(Error::new(
                    "precision",
                    "DeepSpeed keeps fp32 optimizer states beside a bf16 master only on the CPU: offload the optimizer, or keep the states in bf16",
                ));
            }
        }
        if p.cp > 1 && self.attention == Attention::Eager {
            return err(
                "cp",
                "context parallelism (ring attention) runs on fused attention kernels: use attention \"flash\"".into(),
            );
        }
        if let Schedule::Interleaved(_) = p.schedule {
            if p.pp > 1 && !p.grad_accum.is_multiple_of(p.pp) {
                return err(
                    "grad_accum",
                    format!(
                        "the interleaved schedule needs the micro-batches per step ({}) to be a multiple of pp ({})",
                        p.grad_accum, p.pp
                    ),
                );
            }
        }
        Ok(())
    }

    /// Tokens in one micro-batch.
    pub fn tokens(&self) -> u64 {
        self.batch * self.seq
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The tensor-parallel sizes nearest to `tp` (below and above) that divide `g`, the heads'
/// greatest common divisor, in words.
fn nearest_tp(g: u64, tp: u64) -> String {
    let divides = |d: &u64| g.is_multiple_of(*d);
    let below = (1..tp).rev().find(divides);
    let above = (tp + 1..=g).find(divides);
    match (below, above) {
        (Some(b), Some(u)) => format!("the nearest that divide them are tp={b} and tp={u}"),
        (Some(b), None) if b > 1 => format!("the largest that divides them is tp={b}"),
        (None, Some(u)) => format!("the nearest that divides them is tp={u}"),
        _ => "only tp=1 divides them".to_string(),
    }
}

/// A check of a field that only a hand-written scenario (the command line's) can get wrong:
/// the browser's scenarios are written from knobs, which never write the field that way, and
/// its wasm leaves the check out for its size.
fn cli_only(check: impl FnOnce() -> Result<()>) -> Result<()> {
    if cfg!(target_arch = "wasm32") {
        Ok(())
    } else {
        check()
    }
}

fn parse_model(v: &Value) -> Result<Model> {
    match v {
        Value::String(s) => preset_model(s, "model"),
        Value::Object(_) => {
            let o = Obj::new(v, "model")?;
            // A way to name the model given as null is not another way left out (the
            // knobs never write one so).
            for (k, what) in [
                ("preset", "a preset name"),
                ("hf_config", "a config.json object"),
                ("params", "a parameter count"),
            ] {
                if cfg!(not(target_arch = "wasm32")) && o.map.get(k).is_some_and(Value::is_null) {
                    return Err(Error::new(
                        format!("model.{k}"),
                        format!("must be {what}, got null"),
                    ));
                }
            }
            if let Some(p) = o.str_opt("preset")? {
                cli_only(|| o.only(&["preset", "name"]))?;
                // A name for a preset: the command line's (the knobs name none).
                let name = if cfg!(target_arch = "wasm32") {
                    None
                } else {
                    o.str_opt("name")?
                };
                return match (preset_model(p, "model.preset")?, name) {
                    (Model::Arch { arch, .. }, Some(n)) => Ok(Model::Arch {
                        name: truncate(n, 60),
                        arch,
                    }),
                    (m, _) => Ok(m),
                };
            }
            if let Some(c) = o.get("hf_config") {
                cli_only(|| o.only(&["hf_config", "name"]))?;
                let arch = hf::parse_hf_config(c, "model.hf_config")?;
                let name = o
                    .str_opt("name")?
                    .map(|s| truncate(s, 60))
                    .unwrap_or_else(|| format!("{} (config.json)", arch.family.name()));
                return Ok(Model::Arch { name, arch });
            }
            if o.get("params").is_some()
                && o.get("hidden").is_none()
                && o.get("hidden_size").is_none()
            {
                cli_only(|| o.only(&["params"]))?;
                let n = o.u64_req("params")?;
                if n == 0 {
                    return Err(Error::new("model.params", "must be at least 1"));
                }
                if n > 100_000_000_000_000 {
                    return Err(Error::new(
                        "model.params",
                        format!("{n} is beyond the supported 10^14"),
                    ));
                }
                return Ok(Model::Params(n));
            }
            // Explicit fields: the browser's knobs never write a model this way (a preset,
            // `arch`'s config.json keys or `params`), so the widgets leave their parser out.
            if cfg!(target_arch = "wasm32") {
                return Err(Error::new("model", "give a preset, hf_config or params"));
            }
            let arch = hf::parse_explicit(v, "model")?;
            Ok(Model::Arch {
                name: o
                    .str_opt("name")?
                    .map(|s| truncate(s, 60))
                    .unwrap_or_else(|| format!("custom {}", arch.family.name())),
                arch,
            })
        }
        other => Err(Error::new(
            "model",
            format!("must be a preset name or an object, got {}", kind(other)),
        )),
    }
}

fn preset_model(name: &str, at: &str) -> Result<Model> {
    match presets::find(name) {
        Some(p) => Ok(Model::Arch {
            name: p.name.to_string(),
            arch: p.arch,
        }),
        None => Err(Error::new(
            at,
            format!(
                "unknown preset '{}' ({})",
                truncate(name, 40),
                // Where the reader is: the page's model menus, or the command line.
                if cfg!(target_arch = "wasm32") {
                    "the model menus list the presets"
                } else {
                    "`gpumem presets` lists them"
                }
            ),
        )),
    }
}

fn parse_finetune(v: &Value) -> Result<Finetune> {
    match v {
        Value::String(s) if s.eq_ignore_ascii_case("full") => Ok(Finetune::Full),
        Value::String(s) if s.eq_ignore_ascii_case("lora") || s.eq_ignore_ascii_case("qlora") => {
            Ok(Finetune::Lora(Lora {
                rank: 16,
                targets: vec!["q_proj".into(), "v_proj".into()],
                quantized: s.eq_ignore_ascii_case("qlora"),
            }))
        }
        Value::Object(m) if m.len() == 1 && (m.contains_key("lora") || m.contains_key("qlora")) => {
            let quantized = m.contains_key("qlora");
            let key = if quantized {
                "finetune.qlora"
            } else {
                "finetune.lora"
            };
            let inner = m.values().next().expect("one entry");
            let o = Obj::new(inner, key)?;
            o.only(&["rank", "targets"])?;
            let rank = o.u64_opt("rank")?.unwrap_or(16);
            if rank == 0 || rank > 65536 {
                return Err(Error::new(
                    o.path("rank"),
                    format!("must be between 1 and 65536, got {rank}"),
                ));
            }
            let targets = match o.get("targets") {
                None => vec!["q_proj".to_string(), "v_proj".to_string()],
                Some(Value::String(s)) if s == "all-linear" => {
                    LORA_TARGETS.iter().map(|s| s.to_string()).collect()
                }
                Some(Value::Array(a)) => {
                    let mut t = Vec::new();
                    for (i, x) in a.iter().enumerate() {
                        match x.as_str() {
                            Some(s) if LORA_TARGETS.contains(&s) => t.push(s.to_string()),
                            _ => {
                                return Err(Error::new(
                                    format!("{}[{i}]", o.path("targets")),
                                    format!("unknown module (one of: {})", LORA_TARGETS.join(", ")),
                                ))
                            }
                        }
                    }
                    t
                }
                Some(other) => {
                    return Err(Error::new(
                        o.path("targets"),
                        format!(
                            "must be a list of module names or \"all-linear\", got {}",
                            kind(other)
                        ),
                    ))
                }
            };
            Ok(Finetune::Lora(Lora {
                rank,
                targets,
                quantized,
            }))
        }
        _ => Err(Error::new(
            "finetune",
            "must be \"full\", \"lora\", \"qlora\", {\"lora\": {...}} or {\"qlora\": {...}}",
        )),
    }
}

fn parse_parallel(v: &Value) -> Result<Parallel> {
    let o = Obj::new(v, "parallel")?;
    o.only(&[
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "grad_accum",
        // A check of the count a hand-written scenario states (the knobs never write it).
        #[cfg(not(target_arch = "wasm32"))]
        "gpus",
        "framework",
        "zero",
        // PyTorch FSDP's strategy names, which the browser's knobs never write (they
        // give `zero`): read natively only, to keep the wasm small.
        #[cfg(not(target_arch = "wasm32"))]
        "fsdp",
        "shard_group",
        "sp",
        "offload",
        "schedule",
        "virtual_stages",
        "capacity_factor",
        "wrap",
        "loss_parallel",
        "grad_reduce_in_bf16",
        "cp_load_balance",
        "cp_rotate",
        "ep_impl",
    ])?;
    let mut p = Parallel::default();
    for (k, slot) in [
        ("dp", &mut p.dp),
        ("tp", &mut p.tp),
        ("pp", &mut p.pp),
        ("cp", &mut p.cp),
        ("ep", &mut p.ep),
        ("grad_accum", &mut p.grad_accum),
    ] {
        let v = o.u64_opt(k)?.unwrap_or(1);
        if v == 0 || v > MAX_GPUS {
            return Err(Error::new(
                o.path(k),
                format!("must be between 1 and {MAX_GPUS}, got {v}"),
            ));
        }
        *slot = v;
    }
    let total = [p.tp, p.pp, p.cp, p.ep]
        .iter()
        .fold(p.dp, |acc, &x| acc.saturating_mul(x));
    if total > MAX_GPUS {
        return Err(Error::new(
            "parallel",
            format!("dp × tp × pp × cp × ep = {total} GPUs is beyond the supported {MAX_GPUS}"),
        ));
    }
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(n) = o.u64_opt("gpus")? {
        if n != total {
            return Err(Error::new(
                o.path("gpus"),
                format!(
                    "{n} GPUs is not dp × tp × pp × cp × ep = {} × {} × {} × {} × {} = {total}",
                    p.dp, p.tp, p.pp, p.cp, p.ep
                ),
            ));
        }
    }
    p.framework = match o.str_opt("framework")? {
        None | Some("fsdp") | Some("pytorch") | Some("torch") | Some("torchtitan") => {
            Framework::Fsdp
        }
        Some("deepspeed") => Framework::DeepSpeed,
        Some("megatron") | Some("megatron-lm") => Framework::Megatron,
        Some(other) => {
            return Err(Error::new(
                o.path("framework"),
                format!(
                    "must be \"fsdp\", \"deepspeed\" or \"megatron\", got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    };
    let z = o.u64_opt("zero")?.unwrap_or(0);
    if z > 3 {
        return Err(Error::new(
            o.path("zero"),
            format!("must be 0, 1, 2 or 3, got {z}"),
        ));
    }
    p.zero = z as u8;
    p.shard_group = p.dp;
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(strategy) = o.str_opt("fsdp")? {
        if p.framework != Framework::Fsdp {
            return Err(Error::new(
                o.path("fsdp"),
                "is PyTorch FSDP's sharding; it contradicts the framework given",
            ));
        }
        p.zero = match strategy.to_ascii_lowercase().as_str() {
            "full_shard" => 3,
            "shard_grad_op" => 2,
            "no_shard" => 0,
            "hybrid_shard" => 3,
            other => {
                return Err(Error::new(
                    o.path("fsdp"),
                    format!(
                        "must be full_shard, shard_grad_op, no_shard or hybrid_shard, got '{}'",
                        truncate(other, 20)
                    ),
                ))
            }
        };
        if o.get("zero").is_some() && z != u64::from(p.zero) {
            return Err(Error::new(
                o.path("fsdp"),
                format!("sets ZeRO stage {}; it contradicts zero {z}", p.zero),
            ));
        }
        if strategy.eq_ignore_ascii_case("hybrid_shard") {
            p.shard_group = match o.u64_opt("shard_group")? {
                Some(g) => g.min(p.dp),
                // Sharded within a node (8 GPUs), which must divide the data-parallel ranks
                // (the knobs never write hybrid_shard).
                None if p.dp > 8 && p.dp % 8 != 0 => {
                    return Err(Error::new(
                        o.path("fsdp"),
                        format!(
                            "hybrid_shard shards within a node of 8 GPUs, which does not divide dp ({}): give shard_group",
                            p.dp
                        ),
                    ))
                }
                None => 8.min(p.dp),
            };
        }
    }
    if let Some(g) = o.u64_opt("shard_group")? {
        if g == 0 || p.dp % g != 0 {
            return Err(Error::new(
                o.path("shard_group"),
                format!("must divide dp ({}), got {g}", p.dp),
            ));
        }
        p.shard_group = g;
    }
    p.sp = o.bool_opt("sp")?.unwrap_or(true);
    match o.str_opt("offload")? {
        None | Some("none") => {}
        Some("optimizer") => p.offload_optimizer = true,
        Some("optimizer+params") | Some("all") => {
            p.offload_optimizer = true;
            p.offload_params = true;
        }
        Some(other) => {
            return Err(Error::new(
                o.path("offload"),
                format!(
                    "must be \"none\", \"optimizer\" or \"optimizer+params\", got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    }
    if p.offload_params && p.zero < 3 {
        return Err(Error::new(
            o.path("offload"),
            "offloading parameters needs ZeRO-3 / FULL_SHARD (zero: 3)",
        ));
    }
    // Model chunks per stage are the interleaved schedule's (1 is every other's).
    if cfg!(not(target_arch = "wasm32"))
        && o.str_opt("schedule")? != Some("interleaved")
        && o.u64_opt("virtual_stages")?.is_some_and(|v| v != 1)
    {
        return Err(Error::new(
            o.path("virtual_stages"),
            "needs schedule \"interleaved\"",
        ));
    }
    p.schedule = match o.str_opt("schedule")? {
        None | Some("1f1b") => Schedule::OneFOneB,
        Some("gpipe") => Schedule::GPipe,
        Some("interleaved") => {
            let v = o.u64_opt("virtual_stages")?.unwrap_or(2);
            if !(1..=1024).contains(&v) {
                return Err(Error::new(
                    o.path("virtual_stages"),
                    format!("must be between 1 and 1024, got {v}"),
                ));
            }
            Schedule::Interleaved(v)
        }
        Some(other) => {
            return Err(Error::new(
                o.path("schedule"),
                format!(
                    "must be \"1f1b\", \"gpipe\" or \"interleaved\", got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    };
    let cf = o.f64_opt("capacity_factor")?.unwrap_or(1.0);
    if !(cf.is_finite() && (0.1..=64.0).contains(&cf)) {
        return Err(Error::new(
            o.path("capacity_factor"),
            format!("must be between 0.1 and 64, got {}", crate::num::short(cf)),
        ));
    }
    p.capacity_factor = cf;
    p.wrap = match o.str_opt("wrap")? {
        None | Some("layers") => Wrap::Layers,
        Some("titan") => Wrap::Titan,
        Some(other) => {
            return Err(Error::new(
                o.path("wrap"),
                format!(
                    "must be \"layers\" (each decoder layer + a root) or \"titan\" (torchtitan's units), got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    };
    p.loss_parallel = o.bool_opt("loss_parallel")?.unwrap_or(true);
    p.grad_reduce_in_bf16 = o.bool_opt("grad_reduce_in_bf16")?.unwrap_or(false);
    p.cp_load_balance = o.bool_opt("cp_load_balance")?.unwrap_or(true);
    // How context parallelism passes K/V around the ring (`set_rotate_method`). Both keep the
    // same tensors alive on a rank: the oracle measured the same per-rank peak for each
    // (tests/data/oracle/sharded.jsonl, `llama-2b cp cp4` and `cp4 a2a`), so it is checked and
    // needs no other accounting.
    match o.str_opt("cp_rotate")? {
        None | Some("allgather") | Some("alltoall") => {}
        Some(other) => {
            return Err(Error::new(
                o.path("cp_rotate"),
                format!(
                    "must be allgather or alltoall, got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    }
    p.ep_impl = match o.str_opt("ep_impl")? {
        None | Some("titan") => EpImpl::Titan,
        Some("hf") | Some("transformers") => EpImpl::Hf,
        Some(other) => {
            return Err(Error::new(
                o.path("ep_impl"),
                format!(
                    "must be \"titan\" (all-to-all token dispatch) or \"hf\" (transformers' expert-parallel plan), got '{}'",
                    truncate(other, 20)
                ),
            ))
        }
    };
    if p.grad_reduce_in_bf16 && p.framework != Framework::Megatron {
        return Err(Error::new(
            o.path("grad_reduce_in_bf16"),
            "is a Megatron-LM option (framework \"megatron\")",
        ));
    }
    Ok(p)
}

fn parse_gpu(v: &Value) -> Result<(String, u64)> {
    match v {
        Value::String(s) => gpu::find(s)
            .map(|g: Gpu| (g.name.to_string(), g.capacity_bytes))
            .ok_or_else(|| {
                Error::new(
                    "gpu",
                    format!(
                        "unknown GPU '{}' (one of: {}; or {{\"capacity_bytes\": N}})",
                        truncate(s, 30),
                        gpu::GPUS
                            .iter()
                            .map(|g| g.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            }),
        Value::Object(_) => {
            let o = Obj::new(v, "gpu")?;
            o.only(&["name", "capacity_bytes"])?;
            // (A name comes only in a hand-written scenario, the knobs give a capacity alone:
            // left out of the wasm.)
            let named = if cfg!(not(target_arch = "wasm32")) {
                o.str_opt("name")?
            } else {
                None
            };
            if let Some(n) = named {
                if o.get("capacity_bytes").is_none() {
                    return parse_gpu(&Value::String(n.to_string()));
                }
            }
            let c = o.u64_req("capacity_bytes")?;
            if !(1 << 20..=1 << 50).contains(&c) {
                return Err(Error::new(
                    "gpu.capacity_bytes",
                    format!("{c} is not a plausible device size"),
                ));
            }
            let name = named
                .map(|s| truncate(s, 30))
                .unwrap_or_else(|| "custom GPU".into());
            Ok((name, c))
        }
        other => Err(Error::new(
            "gpu",
            format!(
                "must be a GPU name or {{\"capacity_bytes\": N}}, got {}",
                kind(other)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_keys_are_refused_by_name() {
        for (v, field) in [
            (json!({"model": "gpt2", "batchsize": 4}), "batchsize"),
            (
                json!({"model": "gpt2", "parallel": {"dpp": 2}}),
                "parallel.dpp",
            ),
            (
                json!({"model": "gpt2", "gpu": {"capacity": 1}}),
                "gpu.capacity",
            ),
            (
                json!({"model": "gpt2", "finetune": {"lora": {"rnak": 8}}}),
                "finetune.lora.rnak",
            ),
        ] {
            let e = Scenario::from_value(&v).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.starts_with("unknown key"), "{e}");
        }
    }

    /// The model object's keys are checked like the scenario's: a misspelt explicit key
    /// (`kv_head`) took its default, a second way to name the model was ignored.
    #[test]
    fn the_model_objects_unknown_or_extra_keys_are_refused() {
        let explicit = json!({"hidden": 512, "layers": 2, "heads": 8, "vocab": 1000,
            "intermediate": 1024, "kv_head": 2});
        let gpt2 = json!({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
            "vocab_size": 100});
        for (m, field) in [
            (explicit, "model.kv_head"),
            (
                json!({"preset": "gpt2", "hf_config": gpt2}),
                "model.hf_config",
            ),
            (json!({"hf_config": gpt2, "layers": 99}), "model.layers"),
            (
                json!({"params": 7_000_000_000u64, "bogus": 1}),
                "model.bogus",
            ),
        ] {
            let e = Scenario::from_value(&json!({"model": m.clone(), "seq": 512})).unwrap_err();
            assert_eq!(e.field, field, "{m}: {e}");
        }
        let named = json!({"model": {"name": "mine", "hidden": 512, "layers": 2, "heads": 8,
            "vocab": 1000, "intermediate": 1024, "kv_heads": 2, "num_experts_per_tok": null}});
        let s = Scenario::from_value(&named).unwrap();
        assert!(matches!(&s.model, Model::Arch { name, .. } if name == "mine"));
        let s =
            Scenario::from_value(&json!({"model": {"preset": "gpt2", "name": "mine"}, "seq": 512}))
                .unwrap();
        assert!(matches!(&s.model, Model::Arch { name, .. } if name == "mine"));
    }

    /// LoRA targets that name no layer of the model would train nothing (peft refuses them).
    #[test]
    fn lora_targets_that_name_no_layer_are_refused() {
        for m in [
            "gpt2",
            "pythia-1b",
            "falcon-7b",
            "phi-3.5-mini",
            "deepseek-v3",
        ] {
            let e = Scenario::from_value(&json!({"model": m, "finetune": "qlora", "seq": 512}))
                .unwrap_err();
            assert_eq!(e.field, "finetune", "{m}: {e}");
        }
        let ok =
            json!({"model": "gpt2", "seq": 512, "finetune": {"lora": {"targets": ["c_attn"]}}});
        Scenario::from_value(&ok).unwrap();
        Scenario::from_value(&json!({"model": "llama3.1-8b", "finetune": "lora"})).unwrap();
    }

    /// A setting that another one would silently override, or that the schedule given does
    /// not use, is refused by name.
    #[test]
    fn contradicting_or_unused_parallel_settings_are_refused() {
        let par = |p: Value| json!({"model": "llama3.1-8b", "parallel": p});
        for (p, field) in [
            (
                json!({"pp": 2, "virtual_stages": 4}),
                "parallel.virtual_stages",
            ),
            (
                json!({"pp": 2, "schedule": "1f1b", "virtual_stages": 2}),
                "parallel.virtual_stages",
            ),
            (
                json!({"dp": 4, "fsdp": "full_shard", "zero": 1}),
                "parallel.fsdp",
            ),
            (
                json!({"dp": 4, "fsdp": "full_shard", "framework": "megatron"}),
                "parallel.fsdp",
            ),
        ] {
            let e = Scenario::from_value(&par(p.clone())).unwrap_err();
            assert_eq!(e.field, field, "{p}: {e}");
        }
        for p in [
            json!({"pp": 2, "virtual_stages": 1}),
            json!({"pp": 2, "grad_accum": 4, "schedule": "interleaved", "virtual_stages": 4}),
            json!({"dp": 4, "fsdp": "full_shard", "zero": 3, "framework": "fsdp"}),
            json!({"dp": 4, "fsdp": "no_shard", "zero": 0}),
        ] {
            Scenario::from_value(&par(p.clone())).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
    }
}
