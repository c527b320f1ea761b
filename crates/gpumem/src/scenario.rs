//! The scenario: what is run, on what, how. Parsed from JSON with errors naming the field.

use serde_json::Value;

use crate::arch::Architecture;
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parallel {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub zero: u8,
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
        }
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
}

const MAX_BATCH: u64 = 1 << 24;
const MAX_SEQ: u64 = 1 << 27;
const MAX_TOKENS: u64 = 1 << 40;
const MAX_GPUS: u64 = 1 << 20;

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
                    e
                ),
            )
        })?;
        Scenario::from_value(&v)
    }

    pub fn from_value(v: &Value) -> Result<Scenario> {
        let o = Obj::new(v, "").map_err(|_| Error::new("scenario", "must be a JSON object"))?;
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
        if batch * (seq + new_tokens) > MAX_TOKENS {
            return Err(Error::new(
                "batch",
                format!(
                    "batch × (seq + new_tokens) = {} tokens is beyond the supported 2^40",
                    batch * (seq + new_tokens)
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
        };
        s.check()?;
        Ok(s)
    }

    /// Cross-field checks.
    fn check(&self) -> Result<()> {
        if let Model::Arch { arch, .. } = &self.model {
            if let Some(n) = arch.learned_positions {
                let need = self.seq
                    + if self.mode == Mode::Inference {
                        self.new_tokens
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
        let w = self.precision.weights;
        let quantized_ok =
            matches!(self.finetune, Finetune::Lora(_)) || self.mode == Mode::Inference;
        if !w.is_float_compute() && !quantized_ok {
            return Err(Error::new(
                "precision.weights",
                format!("{w} weights cannot be trained directly: use LoRA/QLoRA (finetune) or inference"),
            ));
        }
        let p = self.parallel;
        if p.tp > 1 || p.pp > 1 || p.cp > 1 || p.ep > 1 {
            return Err(Error::new(
                "parallel",
                "tensor, pipeline, context and expert parallelism are not modelled yet (only dp with zero 0-3)",
            ));
        }
        Ok(())
    }

    /// Tokens in one micro-batch.
    pub fn tokens(&self) -> u64 {
        self.batch * self.seq
    }
}

fn parse_model(v: &Value) -> Result<Model> {
    match v {
        Value::String(s) => preset_model(s, "model"),
        Value::Object(_) => {
            let o = Obj::new(v, "model")?;
            if let Some(p) = o.str_opt("preset")? {
                return preset_model(p, "model.preset");
            }
            if let Some(c) = o.get("hf_config") {
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
            let arch = hf::parse_explicit(v, "model")?;
            Ok(Model::Arch {
                name: format!("custom {}", arch.family.name()),
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
                "unknown preset '{}' (see `gpumem presets`)",
                truncate(name, 40)
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
    let mut p = Parallel::default();
    for (k, slot) in [
        ("dp", &mut p.dp),
        ("tp", &mut p.tp),
        ("pp", &mut p.pp),
        ("cp", &mut p.cp),
        ("ep", &mut p.ep),
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
            format!("{total} GPUs is beyond the supported {MAX_GPUS}"),
        ));
    }
    let z = o.u64_opt("zero")?.unwrap_or(0);
    if z > 3 {
        return Err(Error::new(
            o.path("zero"),
            format!("must be 0, 1, 2 or 3, got {z}"),
        ));
    }
    p.zero = z as u8;
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
            if let Some(n) = o.str_opt("name")? {
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
            let name = o
                .str_opt("name")?
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
