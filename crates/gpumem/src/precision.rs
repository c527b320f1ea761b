//! Which dtype each component of training state is kept in.

use serde_json::Value;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::hf::{kind, truncate, Obj};

/// Per-component dtypes.
#[derive(Clone, Debug, PartialEq)]
pub struct Precision {
    /// The recipe's name, or "custom".
    pub name: String,
    /// The model's parameters as the forward uses them.
    pub weights: DType,
    /// A separate full-precision copy the optimizer updates (mixed precision), if any.
    pub master: Option<DType>,
    pub grads: DType,
    /// Optimizer state (Adam's moments, momentum). 8-bit optimizers override this.
    pub optimizer: DType,
    /// Activations: the compute dtype. `fp8` means linear layers keep their inputs in fp8
    /// (Transformer Engine) and everything else in bf16.
    pub activations: DType,
    /// Dtype gradients are reduced in across data-parallel ranks.
    pub reduce: DType,
}

/// The recipes `precision` names:
/// - `fp32`: everything in fp32;
/// - `bf16`: pure bf16, weights, grads, optimizer states and activations (in PyTorch the
///   states follow the parameter dtype); `fp16`: pure fp16;
/// - `amp-bf16` (`amp`), `amp-fp16`: fp32 parameters, grads and states, bf16 or fp16
///   activations through torch.autocast;
/// - `mixed-bf16` (`mixed`): bf16 weights and grads, fp32 master weights and optimizer
///   states (Megatron, DeepSpeed);
/// - `fp8`: as mixed-bf16, with fp8 weight copies and fp8 saved linear inputs (Transformer
///   Engine).
pub const RECIPES: [&str; 7] = [
    "fp32",
    "bf16",
    "fp16",
    "amp-bf16",
    "amp-fp16",
    "mixed-bf16",
    "fp8",
];

impl Precision {
    pub fn recipe(name: &str) -> Option<Precision> {
        use DType::*;
        let p = |w, m, g, o, a, r| Precision {
            name: name.to_string(),
            weights: w,
            master: m,
            grads: g,
            optimizer: o,
            activations: a,
            reduce: r,
        };
        Some(match name {
            "fp32" => p(F32, None, F32, F32, F32, F32),
            "bf16" => p(Bf16, None, Bf16, Bf16, Bf16, Bf16),
            "fp16" => p(F16, None, F16, F16, F16, F16),
            "amp-bf16" | "amp" => p(F32, None, F32, F32, Bf16, F32),
            "amp-fp16" => p(F32, None, F32, F32, F16, F32),
            "mixed-bf16" | "mixed" => p(Bf16, Some(F32), Bf16, F32, Bf16, Bf16),
            "fp8" => p(Bf16, Some(F32), Bf16, F32, F8, Bf16),
            _ => return None,
        })
    }

    /// The dtype matrix multiplications and elementwise ops run in.
    pub fn compute(&self) -> DType {
        match self.activations {
            DType::F8 => DType::Bf16,
            d => d,
        }
    }

    /// torch.autocast: fp32 parameters, lower-precision compute.
    pub fn autocast(&self) -> bool {
        self.weights == DType::F32 && self.compute() != DType::F32
    }

    /// Parse `precision`: a recipe name, or an object of per-component dtypes (missing
    /// components follow `weights`, or the recipe named by `recipe`).
    pub fn parse(v: &Value, at: &str) -> Result<Precision> {
        match v {
            Value::String(s) => Precision::recipe(&s.to_ascii_lowercase()).ok_or_else(|| {
                Error::new(
                    at,
                    format!(
                        "unknown precision recipe '{}' (one of: {})",
                        truncate(s, 40),
                        RECIPES.join(", ")
                    ),
                )
            }),
            Value::Object(_) => {
                let o = Obj::new(v, at)?;
                let dt = |k: &str| -> Result<Option<DType>> {
                    match o.str_opt(k)? {
                        None => Ok(None),
                        Some(s) => DType::parse(s).map(Some).ok_or_else(|| {
                            Error::new(
                                o.path(k),
                                format!(
                                    "unknown dtype '{}' (fp32, bf16, fp16, fp8, int8, int4, nf4)",
                                    truncate(s, 20)
                                ),
                            )
                        }),
                    }
                };
                let mut p = match o.str_opt("recipe")? {
                    Some(r) => Precision::parse(&Value::String(r.into()), &o.path("recipe"))?,
                    None => {
                        let w = dt("weights")?.unwrap_or(DType::Bf16);
                        let f = if w.is_float_compute() { w } else { DType::Bf16 };
                        Precision {
                            name: String::new(),
                            weights: w,
                            master: None,
                            grads: f,
                            optimizer: f,
                            activations: f,
                            reduce: f,
                        }
                    }
                };
                p.name = "custom".into();
                if let Some(d) = dt("weights")? {
                    p.weights = d;
                }
                if let Some(d) = dt("master")? {
                    p.master = Some(d);
                }
                if o.get("master").is_none() && o.map.contains_key("master") {
                    p.master = None;
                }
                if let Some(d) = dt("grads")? {
                    p.grads = d;
                }
                if let Some(d) = dt("optimizer")? {
                    p.optimizer = d;
                }
                if let Some(d) = dt("activations")? {
                    p.activations = d;
                }
                if let Some(d) = dt("reduce")? {
                    p.reduce = d;
                }
                for (k, d) in [
                    ("master", p.master.unwrap_or(DType::F32)),
                    ("grads", p.grads),
                    ("optimizer", p.optimizer),
                    ("reduce", p.reduce),
                ] {
                    if !d.is_float_compute() {
                        let hint = if k == "optimizer" {
                            " (8-bit optimizers: optimizer \"adamw-8bit\")"
                        } else {
                            ""
                        };
                        return Err(Error::new(
                            o.path(k),
                            format!("{d} cannot hold {k}: use fp32, bf16 or fp16{hint}"),
                        ));
                    }
                }
                if !(p.activations.is_float_compute() || p.activations == DType::F8) {
                    return Err(Error::new(
                        o.path("activations"),
                        format!(
                            "activations cannot be {}: use fp32, bf16, fp16 or fp8",
                            p.activations
                        ),
                    ));
                }
                Ok(p)
            }
            other => Err(Error::new(
                at,
                format!(
                    "must be a recipe name or an object of dtypes, got {}",
                    kind(other)
                ),
            )),
        }
    }
}

/// Optimizers and what state they keep per parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    Sgd,
    SgdMomentum,
    /// Adam / AdamW (`fused=True`: no per-step temporaries).
    Adam,
    /// torch.optim.Adafactor: factored second moment (row + column vectors), no first moment.
    Adafactor,
    /// bitsandbytes 8-bit AdamW: blockwise-quantised moments (1 byte each + an fp32 absmax
    /// per 256 values) for tensors of at least 4096 elements; fp32 moments below that.
    Adam8bit,
    /// bitsandbytes `PagedAdamW8bit`: the same states, but those of tensors of at least
    /// 100,000 elements live in CUDA managed memory (`Optimizer8bit.get_state_buffer`:
    /// `F.get_paged`, which `cudaMallocManaged`s), outside PyTorch's allocator: neither
    /// `max_memory_allocated` nor `memory_reserved` counts them; nvidia-smi does while they
    /// are resident.
    PagedAdam8bit,
}

impl Optimizer {
    pub const NAMES: &'static [&'static str] = &[
        "adamw",
        "adam",
        "sgd",
        "sgd-momentum",
        "adafactor",
        "adamw-8bit",
        "paged-adamw-8bit",
    ];

    pub fn parse(s: &str) -> Option<Optimizer> {
        Some(match s.to_ascii_lowercase().as_str() {
            "adamw" | "adam" => Optimizer::Adam,
            "sgd" => Optimizer::Sgd,
            "sgd-momentum" | "momentum" => Optimizer::SgdMomentum,
            "adafactor" => Optimizer::Adafactor,
            "adamw-8bit" | "adam-8bit" | "adamw8bit" | "8bit-adam" => Optimizer::Adam8bit,
            "paged-adamw-8bit" | "paged-adamw8bit" | "paged_adamw_8bit" => Optimizer::PagedAdam8bit,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adamw",
            Optimizer::Adafactor => "adafactor",
            Optimizer::Adam8bit => "adamw-8bit",
            Optimizer::PagedAdam8bit => "paged-adamw-8bit",
        }
    }

    /// Whether the states are 8-bit (bitsandbytes), paged or not.
    pub fn eight_bit(self) -> bool {
        matches!(self, Optimizer::Adam8bit | Optimizer::PagedAdam8bit)
    }

    /// Bytes of state one parameter tensor of `rows × cols` has in CUDA managed memory,
    /// outside PyTorch's allocator: a paged optimizer's two uint8 states of a tensor of at
    /// least 100,000 elements.
    pub fn managed_bytes(self, rows: u64, cols: u64) -> f64 {
        let n = rows * cols;
        if self == Optimizer::PagedAdam8bit && n >= 100_000 {
            2.0 * n as f64
        } else {
            0.0
        }
    }

    /// Bytes of state PyTorch's allocator holds for one parameter tensor of `rows × cols`
    /// (cols = 1 for vectors), with full-size states in `state` dtype.
    pub fn state_bytes(self, rows: u64, cols: u64, state: DType) -> f64 {
        let n = (rows * cols) as f64;
        match self {
            Optimizer::Sgd => 0.0,
            Optimizer::SgdMomentum => n * state.bytes(),
            Optimizer::Adam => 2.0 * n * state.bytes(),
            Optimizer::Adafactor => {
                if cols > 1 {
                    (rows + cols) as f64 * state.bytes()
                } else {
                    n * state.bytes()
                }
            }
            Optimizer::Adam8bit | Optimizer::PagedAdam8bit => {
                let all = if rows * cols >= 4096 {
                    2.0 * (n + (n / 256.0).ceil() * 4.0)
                } else {
                    2.0 * n * 4.0
                };
                all - self.managed_bytes(rows, cols)
            }
        }
    }
}
