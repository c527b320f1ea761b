//! Architectures from Hugging Face `config.json` objects, and from explicit fields.
//!
//! Unknown keys are ignored (configs carry many that do not affect memory); a missing required
//! key, or a value of the wrong type or range, is an error naming the key.

use crate::num::short;
use serde_json::{Map, Value};

use crate::arch::{
    Activation, Architecture, AttnType, Block, Dropout, Family, LinearAttn, Mla, Moe, Norm, QkNorm,
    Quant,
};
use crate::error::{Error, Result};

/// Reads typed keys from a JSON object, naming `at.key` in errors.
pub(crate) struct Obj<'a> {
    pub map: &'a Map<String, Value>,
    pub at: String,
}

impl<'a> Obj<'a> {
    pub fn new(v: &'a Value, at: &str) -> Result<Self> {
        match v {
            Value::Object(map) => Ok(Obj {
                map,
                at: at.to_string(),
            }),
            other => Err(Error::new(
                at,
                format!("must be a JSON object, got {}", kind(other)),
            )),
        }
    }

    pub fn path(&self, key: &str) -> String {
        if self.at.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.at)
        }
    }

    /// Refuse a key that is not one of `known` (a misspelt `dpp` would otherwise be ignored
    /// and the estimate made without it), naming it and what is read here.
    pub fn only(&self, known: &[&str]) -> Result<()> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(Error::new(
                self.path(&crate::knobs::shown(k)),
                format!("unknown key (known here: {})", known.join(", ")),
            )),
        }
    }

    /// The value of `key`, treating JSON `null` as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => to_u64(v)
                .map(Some)
                .ok_or_else(|| Error::new(self.path(key), must_be_count(v))),
        }
    }

    pub fn u64_req(&self, key: &str) -> Result<u64> {
        self.u64_opt(key)?
            .ok_or_else(|| Error::new(self.path(key), "is required but missing"))
    }

    /// A whole number in `lo..=hi`, checked as it is read so that the error names the key
    /// the file contains.
    pub fn bounded_opt(&self, key: &str, lo: u64, hi: u64) -> Result<Option<u64>> {
        match self.u64_opt(key)? {
            Some(v) if v < lo => Err(Error::new(
                self.path(key),
                format!("must be at least {lo}, got {v}"),
            )),
            Some(v) if v > hi => Err(Error::new(
                self.path(key),
                format!("{v} is larger than the limit {hi}"),
            )),
            v => Ok(v),
        }
    }

    pub fn bounded_req(&self, key: &str, lo: u64, hi: u64) -> Result<u64> {
        self.bounded_opt(key, lo, hi)?
            .ok_or_else(|| Error::new(self.path(key), "is required but missing"))
    }

    /// A width (hidden size, heads, a rank): 1 to [`MAX_DIM`].
    pub fn dim_req(&self, key: &str) -> Result<u64> {
        self.bounded_req(key, 1, MAX_DIM)
    }

    pub fn dim_opt(&self, key: &str) -> Result<Option<u64>> {
        self.bounded_opt(key, 1, MAX_DIM)
    }

    /// A probability in [0, 1) (dropout).
    pub fn prob_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.f64_opt(key)? {
            Some(p) if !(0.0..1.0).contains(&p) => Err(Error::new(
                self.path(key),
                format!("dropout {} must be in [0, 1)", short(p)),
            )),
            p => Ok(p),
        }
    }

    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(Error::new(
                    self.path(key),
                    format!("must be a number, got {}", kind(v)),
                )),
            },
        }
    }

    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Error::new(
                self.path(key),
                format!("must be true or false, got {}", kind(v)),
            )),
        }
    }

    pub fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(Error::new(
                self.path(key),
                format!("must be a string, got {}", kind(v)),
            )),
        }
    }
}

/// The largest width accepted (hidden size, heads, head_dim, ranks): beyond it a config is a
/// typo, not a model. Products of widths stay far inside `u64`.
pub(crate) const MAX_DIM: u64 = 1 << 24;
/// The largest MLP width (intermediate sizes).
pub(crate) const MAX_FFN: u64 = 1 << 28;
pub(crate) const MAX_LAYERS: u64 = 10_000;
pub(crate) const MAX_VOCAB: u64 = 1 << 24;
pub(crate) const MAX_EXPERTS: u64 = 1 << 16;
pub(crate) const MAX_POSITIONS: u64 = 1 << 27;

/// A short description of a JSON value's type (never the value itself: it may be hostile).
pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn must_be_count(v: &Value) -> String {
    match v.as_f64() {
        Some(x) if x.is_nan() => "must be a positive integer, got NaN".into(),
        Some(x) if x < 0.0 => format!("must be a positive integer, got {}", short(x)),
        // A fraction too small for six decimals is not "got 0"; 1e308 is not written out.
        Some(x) if x.fract() != 0.0 && x.abs() < 1e-6 => "must be a whole number".into(),
        Some(x) if x.fract() != 0.0 => format!("must be a whole number, got {}", short(x)),
        Some(x) if x >= 1e15 => "is too large".into(),
        Some(x) => format!("{} is too large", short(x)),
        None => format!("must be a positive integer, got {}", kind(v)),
    }
}

/// A non-negative integer, also when written as a float with no fraction (1e9).
pub(crate) fn to_u64(v: &Value) -> Option<u64> {
    if let Some(u) = v.as_u64() {
        return Some(u);
    }
    let x = v.as_f64()?;
    if x.is_finite() && x >= 0.0 && x.fract() == 0.0 && x < 1.8e19 {
        Some(x as u64)
    } else {
        None
    }
}

/// Every `config.json` key [`parse_hf_config`] reads: a pasted config is parsed whole and
/// carried by the keys [`to_hf_config`] writes, all of them listed here.
pub const HF_KEYS: &[&str] = &[
    "model_type",
    "activation_function",
    "attn_pdrop",
    "embd_pdrop",
    "n_embd",
    "n_head",
    "n_inner",
    "n_layer",
    "n_positions",
    "resid_pdrop",
    "attention_bias",
    "attention_out_bias",
    "attention_dropout",
    "head_dim",
    "hidden_act",
    "hidden_activation",
    "hidden_size",
    "intermediate_size",
    "mlp_bias",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "tie_word_embeddings",
    "vocab_size",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "kv_lora_rank",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "text_config",
    "vision_config",
    // A wrapper's vision tower in the `arch` knob's flat form.
    "vision_config.hidden_size",
    "vision_config.intermediate_size",
    "vision_config.num_hidden_layers",
    "vision_config.num_channels",
    "vision_config.patch_size",
    "vision_config.image_size",
    "vision_config.vision_use_head",
    "qkv_bias",
    "num_channels",
    "patch_size",
    "image_size",
    "vision_use_head",
    "use_bias",
    "bias",
    "shared_expert_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
    "moe_layers",
    "interleave_moe_layer_step",
    "intermediate_size_mlp",
    "layer_types",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "full_attention_interval",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "use_qk_norm",
    "partial_rotary_factor",
    "rope_parameters",
    "rotary_pct",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "residual_dropout",
    "embedding_dropout",
    "hidden_dropout",
    "multi_query",
    "new_decoder_architecture",
    "num_kv_heads",
    "parallel_attn",
    "num_ln_in_parallel_attn",
    "alibi",
    "ffn_hidden_size",
    "activation",
    "use_parallel_residual",
    "quantization_config",
    "quant_method",
    "quant_block_size",
];

/// The model types [`parse_hf_config`] accepts, as its errors list them.
pub fn supported_types() -> String {
    let mut v: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
    v.extend(["gemma3", "llama4", "kimi_k2"]);
    v.join(", ")
}

/// The family of a `model_type` (multimodal wrappers excepted).
fn family_of(model_type: &str) -> Option<Family> {
    if model_type == "kimi_k2" {
        // Kimi K2 ships DeepSeek-V3's remote code (`configuration_deepseek.DeepseekV3Config`).
        return Some(Family::DeepseekV3);
    }
    Family::ALL.into_iter().find(|f| f.name() == model_type)
}

/// Parse a Hugging Face `config.json` object. `at` is the field path used in errors.
pub fn parse_hf_config(v: &Value, at: &str) -> Result<Architecture> {
    let o = Obj::new(v, at)?;
    let model_type = match o.str_opt("model_type")? {
        Some(t) => t.to_ascii_lowercase(),
        None => {
            return Err(Error::new(
                o.path("model_type"),
                format!("is required but missing (one of: {})", supported_types()),
            ))
        }
    };
    // Multimodal wrappers: the decoder is their `text_config` (the vision tower is not
    // modelled).
    let wrapped = match model_type.as_str() {
        "gemma3" => Some(Family::Gemma3),
        "llama4" => Some(Family::Llama4),
        "qwen3_5" => Some(Family::Qwen35),
        "qwen3_5_moe" => Some(Family::Qwen35Moe),
        _ => None,
    };
    if let Some(family) = wrapped {
        let tc = o.get("text_config").ok_or_else(|| {
            Error::new(
                o.path("text_config"),
                format!("is required for model type '{model_type}' (its decoder's config)"),
            )
        })?;
        let inner = Obj::new(tc, &o.path("text_config"))?;
        let mut a = parse_decoder(&inner, family)?;
        // AutoModelForCausalLM builds Gemma 3's wrapper whole, its vision tower with it
        // (`vision_config`, or SigLIP's defaults); Llama 4's, as its text model alone.
        if family == Family::Gemma3 {
            let keys = SIGLIP.map(|k| k.0);
            a.vision = Some(match o.get("vision_config") {
                Some(v) => siglip(&Obj::new(v, &o.path("vision_config"))?, &keys),
                // None of the flat form's keys is in a config: SigLIP's defaults.
                None => siglip(&o, &FLAT),
            }?);
        }
        if a.quant.is_none() {
            a.quant = quantization(&o)?;
        }
        a.validate(&format!("{}.", inner.at))?;
        return Ok(a);
    }
    let arch = match model_type.as_str() {
        "gpt2" => parse_gpt2(&o)?,
        t => match family_of(t) {
            Some(f) => parse_decoder(&o, f)?,
            None => {
                return Err(Error::new(
                    o.path("model_type"),
                    format!(
                        "unsupported model type '{}' (supported: {}); the decoder's type is \
                         `model_type` in config.json",
                        truncate(t, 40),
                        supported_types()
                    ),
                ))
            }
        },
    };
    arch.validate(&format!("{}.", o.at))?;
    Ok(arch)
}

/// At most `n` characters of an input, to quote it. Control and bidirectional-override
/// characters (a terminal's escapes, line breaks) are shown as U+FFFD: the text is data.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn truncate(s: &str, n: usize) -> String {
    let t = s
        .chars()
        .take(n)
        .map(|c| match c {
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => '\u{fffd}',
            c if c.is_control() => '\u{fffd}',
            c => c,
        })
        .collect::<String>();
    if s.chars().nth(n).is_none() {
        t
    } else {
        t + "…"
    }
}

/// At most `n` characters of an input, to quote it. A page shows a message as text, whatever
/// it holds (a terminal does not: the native version replaces control characters).
#[cfg(target_arch = "wasm32")]
pub(crate) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n).collect::<String>() + "…"
    }
}

fn activation(o: &Obj<'_>, key: &str, default: Activation) -> Result<Activation> {
    Ok(match o.str_opt(key)? {
        None => default,
        Some(s) => match s {
            "silu" | "swish" => Activation::Silu,
            "gelu_new" => Activation::GeluNew,
            "gelu" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_python" => Activation::Gelu,
            "relu2" => Activation::Relu2,
            other => {
                let known = "silu, gelu, gelu_new, gelu_pytorch_tanh, relu2";
                return Err(Error::new(
                    o.path(key),
                    format!("unsupported activation '{}' ({known})", truncate(other, 40)),
                ));
            }
        },
    })
}

fn parse_gpt2(o: &Obj<'_>) -> Result<Architecture> {
    let hidden = o.dim_req("n_embd")?;
    let heads = o.dim_req("n_head")?;
    if hidden % heads != 0 {
        return Err(Error::new(
            o.path("n_head"),
            format!("n_embd ({hidden}) must be a multiple of n_head ({heads})"),
        ));
    }
    let p = |k: &str| -> Result<f64> { Ok(o.prob_opt(k)?.unwrap_or(0.1)) };
    let layers = o.bounded_req("n_layer", 1, MAX_LAYERS)?;
    let mut a = Architecture::base(Family::Gpt2, hidden, layers, heads, 0);
    a.intermediate = o.bounded_opt("n_inner", 1, MAX_FFN)?.unwrap_or(hidden * 4);
    a.vocab = o.bounded_req("vocab_size", 1, MAX_VOCAB)?;
    a.tied_embeddings = o.bool_opt("tie_word_embeddings")?.unwrap_or(true);
    a.learned_positions = Some(
        o.bounded_opt("n_positions", 1, MAX_POSITIONS)?
            .unwrap_or(1024),
    );
    a.qkv_bias = true;
    a.o_bias = true;
    a.mlp_bias = true;
    a.activation = activation(o, "activation_function", Activation::GeluNew)?;
    a.dropout = Dropout {
        embd: p("embd_pdrop")?,
        attn: p("attn_pdrop")?,
        resid: p("resid_pdrop")?,
    };
    a.norm = Norm::LayerNorm;
    a.gated = false;
    a.rope_dim = 0;
    Ok(a)
}

/// A key whose absence means a default but whose JSON `null` means "none" (transformers keeps
/// an explicit `null`): `Ok(None)` for null, the default when absent.
fn nullable<T>(
    o: &Obj<'_>,
    key: &str,
    default: Option<T>,
    read: impl FnOnce() -> Result<Option<T>>,
) -> Result<Option<T>> {
    match o.map.get(key) {
        None => Ok(default),
        Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "null" => Ok(None),
        Some(_) => read(),
    }
}

/// A whole number read from a JSON number, or from a knob's string form.
fn index_list(o: &Obj<'_>, key: &str, layers: u64) -> Result<Option<Vec<u64>>> {
    let bad = |m: &str| Error::new(o.path(key), m.to_string());
    let items: Vec<Value> = match o.get(key) {
        None => return Ok(None),
        Some(Value::Array(v)) => {
            if v.len() as u64 > MAX_LAYERS {
                return Err(bad("has more entries than the layer limit"));
            }
            v.clone()
        }
        Some(Value::String(s)) => {
            if s.len() as u64 > 8 * MAX_LAYERS {
                return Err(bad("is too long"));
            }
            let mut v = Vec::new();
            for part in s.split_whitespace() {
                match part.parse::<u64>() {
                    Ok(n) => v.push(Value::from(n)),
                    Err(_) => return Err(bad("must list layer indices (whole numbers)")),
                }
            }
            v
        }
        Some(other) => {
            return Err(bad(&format!(
                "must be a list of layer indices, got {}",
                kind(other)
            )))
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for x in &items {
        match to_u64(x) {
            Some(n) if n < layers => out.push(n),
            Some(n) => {
                return Err(bad(&format!(
                    "layer {n} does not exist (the model has {layers} layers)"
                )))
            }
            None => return Err(bad("must list layer indices (whole numbers)")),
        }
    }
    crate::order::sort(&mut out);
    out.dedup();
    Ok(Some(out))
}

/// The shortest prefix of `v` that repeats to make all of it (its smallest period: the length
/// less the longest proper prefix that is also a suffix, by the prefix function, in linear
/// time whatever a pasted config holds).
fn period<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    if v.is_empty() {
        return Vec::new();
    }
    let mut border = vec![0usize; v.len()];
    for i in 1..v.len() {
        let mut k = border[i - 1];
        while k > 0 && v[i] != v[k] {
            k = border[k - 1];
        }
        if v[i] == v[k] {
            k += 1;
        }
        border[i] = k;
    }
    v[..v.len() - border[v.len() - 1]].to_vec()
}

/// `layer_types`: a list of `full_attention` / `sliding_attention` / `chunked_attention` /
/// `linear_attention`, one per layer, or (as the `arch` knob carries it) a string of their
/// codes `f`, `s`, `c`, `l` repeated over the layers.
fn layer_types(o: &Obj<'_>, layers: u64) -> Result<Option<Vec<AttnType>>> {
    let key = "layer_types";
    let bad = |m: String| Error::new(o.path(key), m);
    let all = [
        AttnType::Full,
        AttnType::Sliding,
        AttnType::Chunked,
        AttnType::Linear,
    ];
    let v: Vec<AttnType> = match o.get(key) {
        None => return Ok(None),
        Some(Value::Array(items)) => {
            if items.len() as u64 != layers {
                return Err(bad(format!(
                    "has {} entries for {layers} layers",
                    items.len().min(MAX_LAYERS as usize + 1)
                )));
            }
            let mut v = Vec::with_capacity(items.len());
            for x in items {
                let name = x.as_str().unwrap_or("");
                // Qwen3-Next's older names.
                let name = match name {
                    "attention" => "full_attention",
                    "linear" => "linear_attention",
                    n => n,
                };
                match all.iter().find(|t| t.hf_name() == name) {
                    Some(&t) => v.push(t),
                    None => {
                        return Err(bad(format!(
                            "has '{}' (full_attention, sliding_attention, chunked_attention, linear_attention)",
                            truncate(name, 30)
                        )))
                    }
                }
            }
            v
        }
        Some(Value::String(s)) => {
            if s.is_empty() || s.chars().count() as u64 > layers {
                return Err(bad(format!(
                    "as a pattern must have 1 to {layers} letters (f, s, c, l)"
                )));
            }
            let mut v = Vec::new();
            for ch in s.chars() {
                match all.iter().find(|t| t.code() == ch) {
                    Some(&t) => v.push(t),
                    None => {
                        return Err(bad(
                            "as a pattern takes the letters f (full), s (sliding), c (chunked), l (linear)"
                                .into(),
                        ))
                    }
                }
            }
            (0..layers as usize).map(|i| v[i % v.len()]).collect()
        }
        Some(other) => {
            return Err(bad(format!(
                "must be a list of layer types, got {}",
                kind(other)
            )))
        }
    };
    Ok(Some(period(&v)))
}

/// Llama 4 / SmolLM3 `no_rope_layers`: one 0 (no RoPE) or 1 (RoPE) per layer, or a string of
/// those digits repeated over the layers. Returns the NoPE pattern.
fn no_rope_layers(o: &Obj<'_>, layers: u64) -> Result<Option<Vec<bool>>> {
    let key = "no_rope_layers";
    let bad = |m: String| Error::new(o.path(key), m);
    let v: Vec<bool> = match o.get(key) {
        None => return Ok(None),
        Some(Value::Array(items)) if items.is_empty() => return Ok(None),
        Some(Value::Array(items)) => {
            if items.len() as u64 != layers {
                return Err(bad(format!(
                    "has {} entries for {layers} layers",
                    items.len().min(MAX_LAYERS as usize + 1)
                )));
            }
            let mut v = Vec::with_capacity(items.len());
            for x in items {
                match to_u64(x) {
                    Some(0) => v.push(true),
                    Some(1) => v.push(false),
                    _ => return Err(bad("takes 0 (no RoPE) or 1 (RoPE) per layer".into())),
                }
            }
            v
        }
        Some(Value::String(s)) => {
            if s.is_empty() || s.len() as u64 > layers || !s.bytes().all(|b| b == b'0' || b == b'1')
            {
                return Err(bad(format!(
                    "as a pattern must have 1 to {layers} digits 0 (no RoPE) or 1 (RoPE)"
                )));
            }
            let p: Vec<bool> = s.bytes().map(|b| b == b'0').collect();
            (0..layers as usize).map(|i| p[i % p.len()]).collect()
        }
        Some(other) => {
            return Err(bad(format!(
                "must be a list of 0 and 1, got {}",
                kind(other)
            )))
        }
    };
    Ok(Some(period(&v)))
}

/// `quantization_config` (or the knob's flat `quant_method` / `quant_block_size`).
fn quantization(o: &Obj<'_>) -> Result<Option<Quant>> {
    let (q, method) = match o.get("quantization_config") {
        Some(c) => {
            let q = Obj::new(c, &o.path("quantization_config"))?;
            let m = q.str_opt("quant_method")?.map(str::to_string);
            (Some(q), m)
        }
        None => (None, o.str_opt("quant_method")?.map(str::to_string)),
    };
    let Some(method) = method else {
        return Ok(None);
    };
    Ok(match method.as_str() {
        "mxfp4" => Some(Quant::Mxfp4),
        "fp8" => {
            let block = match &q {
                Some(q) => match q.get("weight_block_size") {
                    Some(Value::Array(v)) if !v.is_empty() => {
                        let dims: Vec<Option<u64>> = v.iter().map(to_u64).collect();
                        match dims.as_slice() {
                            [Some(a), Some(b)] if a == b && *a >= 1 && *a <= MAX_DIM => *a,
                            _ => {
                                return Err(Error::new(
                                    q.path("weight_block_size"),
                                    "must be two equal block sides, e.g. [128, 128]",
                                ))
                            }
                        }
                    }
                    None => 128,
                    Some(_) => {
                        return Err(Error::new(
                            q.path("weight_block_size"),
                            "must be two equal block sides, e.g. [128, 128]",
                        ))
                    }
                },
                None => o
                    .bounded_opt("quant_block_size", 1, MAX_DIM)?
                    .unwrap_or(128),
            };
            Some(Quant::Fp8 { block })
        }
        // Other formats (bitsandbytes, GPTQ, AWQ, …) are chosen by the scenario's precision.
        _ => None,
    })
}

/// Any decoder but GPT-2, with its family's defaults for the keys its config.json omits
/// (transformers 5.17's config classes).
fn parse_decoder(o: &Obj<'_>, family: Family) -> Result<Architecture> {
    use Family::*;
    let hidden = o.dim_req("hidden_size")?;
    let heads = o.dim_req("num_attention_heads")?;
    let layers = o.bounded_req("num_hidden_layers", 1, MAX_LAYERS)?;
    let vocab = o.bounded_req("vocab_size", 1, MAX_VOCAB)?;
    let mut a = Architecture::base(family, hidden, layers, heads, 0);
    a.vocab = vocab;
    a.intermediate = match family {
        Falcon => o
            .bounded_opt("ffn_hidden_size", 1, MAX_FFN)?
            .unwrap_or(4 * hidden),
        Llama4 => o
            .bounded_opt("intermediate_size_mlp", 1, MAX_FFN)?
            .unwrap_or(16384),
        // Every layer is MoE: no dense width (transformers' config has none).
        Qwen35Moe => o
            .bounded_opt("intermediate_size", 1, MAX_FFN)?
            .unwrap_or(512),
        _ => o.bounded_req("intermediate_size", 1, MAX_FFN)?,
    };
    let kv_default = match family {
        Mistral | Ministral3 | Mixtral | Llama4 | GptOss | Glm4Moe | SeedOss | MiniMaxM2 => 8,
        Qwen2 | Qwen3 => 32,
        Qwen2Moe => 16,
        Qwen3Moe | Gemma2 | Gemma3 | SmolLm3 | Qwen35 => 4,
        Qwen3Next | Qwen35Moe | Starcoder2 | Glm4 | Ernie45 => 2,
        _ => heads,
    };
    a.kv_heads = o.dim_opt("num_key_value_heads")?.unwrap_or(kv_default);
    let derived = |a: &Architecture| -> Result<u64> {
        if hidden.is_multiple_of(heads) {
            Ok(hidden / heads)
        } else {
            Err(Error::new(
                o.path("head_dim"),
                format!(
                    "is required when hidden_size ({hidden}) is not a multiple of num_attention_heads ({})",
                    a.heads
                ),
            ))
        }
    };
    a.head_dim = match family {
        // These derive it whatever the file says.
        Falcon | GptNeox | Cohere2 => derived(&a)?,
        // Hunyuan's attention reads it and has no default.
        HunyuanDense => o.dim_req("head_dim")?,
        _ => match o.dim_opt("head_dim")? {
            Some(d) => d,
            None => match family {
                Qwen3 | Llama4 | SeedOss | Glm4 | Ernie45 | MiniMaxM2 | Ministral3 => 128,
                Gemma2 | Gemma3 | Qwen3Next | Qwen35 | Qwen35Moe => 256,
                GptOss => 64,
                _ => derived(&a)?,
            },
        },
    };
    a.rope_dim = a.head_dim;
    let (act_key, act_default) = match family {
        Gemma2 | Gemma3 => ("hidden_activation", Activation::Gelu),
        Falcon => ("activation", Activation::Gelu),
        GptNeox => ("hidden_act", Activation::Gelu),
        Starcoder2 => ("hidden_act", Activation::Gelu),
        Arcee => ("hidden_act", Activation::Relu2),
        _ => ("hidden_act", Activation::Silu),
    };
    a.activation = activation(o, act_key, act_default)?;
    a.tied_embeddings = o.bool_opt("tie_word_embeddings")?.unwrap_or(matches!(
        family,
        Gemma2 | Gemma3 | SmolLm3 | Falcon | Starcoder2 | Cohere | Cohere2 | Ernie45
    ));
    let attention_bias = o.bool_opt("attention_bias")?;
    let bias = attention_bias.unwrap_or(matches!(family, GptOss | GptNeox));
    (a.qkv_bias, a.o_bias) = match family {
        Mistral | Ministral3 | Mixtral | Phi3 => (false, false),
        Qwen2 => (true, false),
        SeedOss => (
            attention_bias.unwrap_or(true),
            o.bool_opt("attention_out_bias")?.unwrap_or(false),
        ),
        Qwen2Moe => (o.bool_opt("qkv_bias")?.unwrap_or(true), false),
        Glm4Moe => (bias, false),
        Glm4 => (attention_bias.unwrap_or(true), false),
        DeepseekV2 | DeepseekV3 => (bias, false),
        Starcoder2 | Ernie45 => {
            let b = o.bool_opt("use_bias")?.unwrap_or(family == Starcoder2);
            a.mlp_bias = b;
            (b, b)
        }
        Falcon => {
            let b = o.bool_opt("bias")?.unwrap_or(false);
            a.mlp_bias = b;
            (b, b)
        }
        GptNeox => {
            // The MLP's linears always have biases.
            a.mlp_bias = true;
            (bias, bias)
        }
        _ => (bias, bias),
    };
    if matches!(family, Llama | Granite | SmolLm3 | DeepseekV2 | SeedOss) {
        a.mlp_bias = o.bool_opt("mlp_bias")?.unwrap_or(false);
    }
    // Dropout: attention probabilities, and the residual branches / embeddings where the
    // family has them.
    let p_default = if family == SeedOss { 0.1 } else { 0.0 };
    a.dropout.attn = o.prob_opt("attention_dropout")?.unwrap_or(p_default);
    match family {
        Phi3 => {
            a.dropout.resid = o.prob_opt("resid_pdrop")?.unwrap_or(0.0);
            a.dropout.embd = o.prob_opt("embd_pdrop")?.unwrap_or(0.0);
        }
        Starcoder2 => {
            a.dropout.resid = o.prob_opt("residual_dropout")?.unwrap_or(0.0);
            a.dropout.embd = o.prob_opt("embedding_dropout")?.unwrap_or(0.0);
        }
        Falcon | GptNeox => {
            a.dropout.resid = o.prob_opt("hidden_dropout")?.unwrap_or(0.0);
        }
        SeedOss => {
            a.dropout.resid = o.prob_opt("residual_dropout")?.unwrap_or(p_default);
        }
        _ => {}
    }
    // Norms and the block's layout.
    a.norm = match family {
        Gemma2 | Gemma3 | Qwen3Next | Qwen35 | Qwen35Moe => Norm::RmsOffset,
        Olmo2 | Olmo3 | GptOss => Norm::RmsWeightFirst,
        Falcon | GptNeox | Starcoder2 => Norm::LayerNorm,
        Cohere | Cohere2 => Norm::CohereLayerNorm,
        _ => Norm::Rms,
    };
    a.block = match family {
        Gemma2 | Gemma3 | Glm4 => Block::Sandwich,
        Olmo2 | Olmo3 | Exaone4 => Block::Post,
        Cohere | Cohere2 => Block::Parallel,
        GptNeox if o.bool_opt("use_parallel_residual")?.unwrap_or(true) => Block::ParallelTwoNorms,
        _ => Block::Pre,
    };
    a.qk_norm = match family {
        Qwen3 | Qwen3Moe | Qwen3Next | Qwen35 | Qwen35Moe | Gemma3 | Exaone4 => QkNorm::Head,
        Olmo2 | Olmo3 | MiniMaxM2 | Olmoe => QkNorm::Full,
        Glm4Moe if o.bool_opt("use_qk_norm")?.unwrap_or(false) => QkNorm::Head,
        Llama4 if o.bool_opt("use_qk_norm")?.unwrap_or(true) => QkNorm::L2,
        Cohere if o.bool_opt("use_qk_norm")?.unwrap_or(false) => QkNorm::CohereHead,
        HunyuanDense => QkNorm::HeadAfterRope,
        _ => QkNorm::None,
    };
    a.gated = !matches!(family, Falcon | GptNeox | Starcoder2 | Arcee);
    a.fused_qkv = matches!(family, Phi3 | Falcon | GptNeox);
    a.fused_gate_up = matches!(family, Phi3 | Glm4);
    let next = matches!(family, Qwen3Next | Qwen35 | Qwen35Moe);
    a.attn_gate = next;
    a.sinks = family == GptOss;
    // Partial rotary embeddings: at the top level, or in `rope_parameters` where
    // transformers 5 writes it.
    let nested = match o.get("rope_parameters") {
        Some(v @ Value::Object(_)) => {
            Obj::new(v, &o.path("rope_parameters"))?.f64_opt("partial_rotary_factor")?
        }
        _ => None,
    };
    let given = o.f64_opt("partial_rotary_factor")?.or(nested);
    let factor = match family {
        GptNeox => o.f64_opt("rotary_pct")?.or(Some(0.25)),
        Glm4Moe | Glm4 => given.or(Some(0.5)),
        Qwen3Next | Qwen35 | Qwen35Moe => given.or(Some(0.25)),
        _ => given,
    };
    if let Some(f) = factor {
        if !(0.0..=1.0).contains(&f) {
            let key = if family == GptNeox {
                "rotary_pct"
            } else {
                "partial_rotary_factor"
            };
            return Err(Error::new(o.path(key), "must be between 0 and 1"));
        }
        a.rope_dim = (a.head_dim as f64 * f + 1e-9).floor() as u64;
    }
    // Which layers slide, chunk or attend linearly; which have no RoPE.
    let window = |default: Option<u64>| -> Result<Option<u64>> {
        nullable(o, "sliding_window", default, || {
            o.bounded_opt("sliding_window", 1, MAX_POSITIONS)
        })
    };
    let explicit = layer_types(o, layers)?;
    let every = |n: u64, at: AttnType, other: AttnType| -> Vec<AttnType> {
        // `at` on every n-th layer ((i + 1) % n == 0), `other` elsewhere.
        let mut v = vec![other; n.max(1) as usize];
        if let Some(last) = v.last_mut() {
            *last = at;
        }
        v
    };
    let pattern_key = |key: &str, default: u64| -> Result<u64> {
        Ok(o.bounded_opt(key, 1, MAX_LAYERS)?.unwrap_or(default))
    };
    let (sw, types) = match family {
        Mistral => {
            let w = window(Some(4096))?;
            (w, w.map(|_| vec![AttnType::Sliding]))
        }
        Mixtral | Phi3 | Starcoder2 | Ministral3 => {
            let w = window(None)?;
            (w, w.map(|_| vec![AttnType::Sliding]))
        }
        Qwen2 | Qwen3 | Qwen2Moe | Qwen3Moe => {
            let on = o.bool_opt("use_sliding_window")?.unwrap_or(false);
            let w = if on { window(Some(4096))? } else { None };
            let first = o
                .bounded_opt("max_window_layers", 0, MAX_LAYERS)?
                .unwrap_or(28);
            let types = w.map(|_| match family {
                Qwen2Moe => (0..layers)
                    .map(|i| {
                        if (i + 1) % 2 == 1 && i < first {
                            AttnType::Sliding
                        } else {
                            AttnType::Full
                        }
                    })
                    .collect(),
                Qwen3Moe => vec![AttnType::Sliding],
                _ => (0..layers)
                    .map(|i| {
                        if i >= first {
                            AttnType::Sliding
                        } else {
                            AttnType::Full
                        }
                    })
                    .collect(),
            });
            (w, types)
        }
        Gemma2 | GptOss => {
            let w = window(Some(if family == GptOss { 128 } else { 4096 }))?;
            (w, Some(every(2, AttnType::Full, AttnType::Sliding)))
        }
        Gemma3 => (
            window(Some(4096))?,
            Some(every(
                pattern_key("sliding_window_pattern", 6)?,
                AttnType::Full,
                AttnType::Sliding,
            )),
        ),
        // OLMo 3's window applies to the sliding layers only when it is set (null: all full).
        Olmo3 => {
            let w = window(Some(4096))?;
            (w, w.map(|_| every(4, AttnType::Full, AttnType::Sliding)))
        }
        Exaone4 => {
            let w = window(Some(4096))?;
            let n = pattern_key("sliding_window_pattern", 4)?;
            (w, w.map(|_| every(n, AttnType::Full, AttnType::Sliding)))
        }
        Cohere2 => (
            window(Some(4096))?,
            Some(every(
                pattern_key("sliding_window_pattern", 4)?,
                AttnType::Full,
                AttnType::Sliding,
            )),
        ),
        Qwen3Next | Qwen35 | Qwen35Moe => (
            None,
            Some(every(
                pattern_key("full_attention_interval", 4)?,
                AttnType::Full,
                AttnType::Linear,
            )),
        ),
        SmolLm3 => {
            let on = o.bool_opt("use_sliding_window")?.unwrap_or(false);
            (if on { window(None)? } else { None }, None)
        }
        _ => (None, None),
    };
    a.sliding_window = sw;
    let types = explicit.or(types).map(|v| period(&v)).unwrap_or_default();
    // NoPE layers.
    let nope = match family {
        Llama4 | SmolLm3 => match no_rope_layers(o, layers)? {
            Some(p) => p,
            None => {
                let n = pattern_key("no_rope_layer_interval", 4)?;
                every(n, AttnType::Full, AttnType::Sliding)
                    .into_iter()
                    .map(|t| t == AttnType::Full)
                    .collect()
            }
        },
        // Command R7B's full-attention layers have no RoPE.
        Cohere2 => types.iter().map(|&t| t == AttnType::Full).collect(),
        // EXAONE 4's full layers have none while the model has a window.
        Exaone4 if a.sliding_window.is_some() => {
            types.iter().map(|&t| t == AttnType::Full).collect()
        }
        _ => Vec::new(),
    };
    a.nope = if nope.iter().any(|&n| n) {
        period(&nope)
    } else {
        Vec::new()
    };
    a.layer_types = match family {
        // Chunked attention on the RoPE layers, full on the NoPE ones (unless listed).
        Llama4 => match o.get("layer_types") {
            Some(_) => types,
            None => {
                let n = a.nope.len().max(1);
                (0..n)
                    .map(|i| {
                        if a.nope.get(i).copied().unwrap_or(false) {
                            AttnType::Full
                        } else {
                            AttnType::Chunked
                        }
                    })
                    .collect()
            }
        },
        SmolLm3 if a.sliding_window.is_some() && o.get("layer_types").is_none() => {
            // Sliding on the NoPE layers only.
            let n = a.nope.len().max(1);
            (0..n)
                .map(|i| {
                    if a.nope.get(i).copied().unwrap_or(false) {
                        AttnType::Sliding
                    } else {
                        AttnType::Full
                    }
                })
                .collect()
        }
        _ => types,
    };
    if a.layer_types.iter().all(|&t| t == AttnType::Full) {
        a.layer_types.clear();
    } else {
        a.layer_types = period(&a.layer_types);
    }
    if family == Llama4 {
        a.chunk = Some(
            o.bounded_opt("attention_chunk_size", 1, MAX_POSITIONS)?
                .unwrap_or(8192),
        );
    }
    if matches!(family, Gemma2) {
        let cap = |key: &str, d: f64| -> Result<bool> {
            Ok(nullable(o, key, Some(d), || o.f64_opt(key))?.is_some())
        };
        a.final_softcap = cap("final_logit_softcapping", 30.0)?;
        a.attn_softcap = cap("attn_logit_softcapping", 50.0)?;
    }
    if matches!(family, Gemma3) {
        a.final_softcap = o.f64_opt("final_logit_softcapping")?.is_some();
        a.attn_softcap = o.f64_opt("attn_logit_softcapping")?.is_some();
    }
    // Falcon's attention and block variants.
    if family == Falcon {
        if o.bool_opt("alibi")?.unwrap_or(false) {
            return Err(Error::new(
                o.path("alibi"),
                "ALiBi Falcon models are not modelled (only the rotary ones)",
            ));
        }
        let new_arch = o.bool_opt("new_decoder_architecture")?.unwrap_or(false);
        let kv = o.dim_opt("num_kv_heads")?.unwrap_or(heads);
        a.kv_heads = if new_arch || !o.bool_opt("multi_query")?.unwrap_or(true) {
            kv
        } else {
            1
        };
        let parallel = o.bool_opt("parallel_attn")?.unwrap_or(true);
        let lns = o.bounded_opt("num_ln_in_parallel_attn", 1, 2)?;
        a.block = if !parallel {
            Block::Pre
        } else if new_arch && lns.unwrap_or(2) == 2 {
            Block::ParallelTwoNorms
        } else {
            Block::Parallel
        };
        // The new decoder broadcasts each key/value head to its query heads before the
        // cache and attention: keys and values are as wide as the queries.
        a.kv_expanded = new_arch;
    }
    if family == GptNeox {
        a.kv_heads = heads;
    }
    // Linear attention (Qwen3-Next's and Qwen3.5's gated DeltaNet).
    if next {
        let d = |k: &str, v: u64| -> Result<u64> { Ok(o.dim_opt(k)?.unwrap_or(v)) };
        a.linear = Some(LinearAttn {
            key_heads: d("linear_num_key_heads", 16)?,
            value_heads: d("linear_num_value_heads", 32)?,
            key_dim: d("linear_key_head_dim", 128)?,
            value_dim: d("linear_value_head_dim", 128)?,
            conv_kernel: d("linear_conv_kernel_dim", 4)?,
        });
    }
    // Multi-head latent attention.
    if matches!(family, DeepseekV2 | DeepseekV3) {
        let d = |k: &str, v: u64| -> Result<u64> { Ok(o.dim_opt(k)?.unwrap_or(v)) };
        let nope = o
            .bounded_opt("qk_nope_head_dim", 0, MAX_DIM)?
            .unwrap_or(128);
        let rope = d("qk_rope_head_dim", 64)?;
        a.head_dim = nope + rope;
        a.rope_dim = rope;
        a.kv_heads = heads;
        a.mla = Some(Mla {
            q_lora_rank: nullable(o, "q_lora_rank", Some(1536), || o.dim_opt("q_lora_rank"))?,
            kv_lora_rank: d("kv_lora_rank", 512)?,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: d("v_head_dim", 128)?,
        });
    }
    a.moe = parse_moe(o, family, &a)?;
    a.quant = quantization(o)?;
    // The `arch` knob carries a wrapper's vision tower as `vision_config.KEY` beside its
    // decoder's keys.
    if family == Gemma3 && o.map.contains_key(FLAT[0]) {
        a.vision = Some(siglip(o, &FLAT)?);
    }
    Ok(a)
}

/// Gemma 3's vision tower's sizes, with their bounds (which keep its parameter count in
/// `u64`: [`crate::params::vision_params`]) and defaults (transformers'
/// `SiglipVisionConfig`); then whether it has its pooling head.
const SIGLIP: [(&str, u64, u64); 7] = [
    ("hidden_size", 1 << 16, 768),
    ("intermediate_size", 1 << 20, 3072),
    ("num_hidden_layers", 1024, 12),
    ("num_channels", 64, 3),
    ("patch_size", 1024, 16),
    ("image_size", 1 << 16, 224),
    ("vision_use_head", 0, 0),
];

/// The same keys in the `arch` knob's flat form.
const FLAT: [&str; 7] = [
    "vision_config.hidden_size",
    "vision_config.intermediate_size",
    "vision_config.num_hidden_layers",
    "vision_config.num_channels",
    "vision_config.patch_size",
    "vision_config.image_size",
    "vision_config.vision_use_head",
];

/// Gemma 3's `vision_config`: its keys in `o` named as `keys` names them ([`SIGLIP`]'s, or
/// [`FLAT`]), SigLIP's defaults where a key is absent. Only the sizes that make parameters
/// are read.
fn siglip(o: &Obj, keys: &[&str; 7]) -> Result<crate::arch::Vision> {
    let mut d = [0; 6];
    for ((x, k), (_, hi, default)) in d.iter_mut().zip(keys).zip(SIGLIP) {
        *x = o.bounded_opt(k, 1, hi)?.unwrap_or(default);
    }
    let [hidden, intermediate, layers, channels, patch, image] = d;
    Ok(crate::arch::Vision {
        hidden,
        intermediate,
        layers,
        channels,
        patch,
        image,
        head: o.bool_opt(keys[6])?.unwrap_or(true),
    })
}

/// The mixture of experts, with its family's defaults and layer placement.
fn parse_moe(o: &Obj<'_>, family: Family, a: &Architecture) -> Result<Option<Moe>> {
    use Family::*;
    let layers = a.layers;
    let (experts_key, experts_default, top_default, inter_default) = match family {
        Mixtral => ("num_local_experts", 8, 2, None),
        Qwen2Moe => ("num_experts", 60, 4, Some(1408)),
        Qwen3Moe => ("num_experts", 128, 8, Some(768)),
        Qwen3Next => ("num_experts", 512, 10, Some(512)),
        Qwen35Moe => ("num_experts", 256, 8, Some(512)),
        DeepseekV2 => ("n_routed_experts", 64, 0, Some(1407)),
        DeepseekV3 => ("n_routed_experts", 256, 8, Some(2048)),
        Glm4Moe => ("n_routed_experts", 128, 8, Some(1408)),
        GptOss => ("num_local_experts", 128, 4, None),
        MiniMaxM2 => ("num_local_experts", 256, 8, None),
        Olmoe => ("num_experts", 64, 8, None),
        Llama4 => ("num_local_experts", 16, 1, None),
        _ => return Ok(None),
    };
    // Some configs name the expert count by another key (an attribute alias in transformers).
    let alias = match experts_key {
        "num_local_experts" => "num_experts",
        "num_experts" => "num_local_experts",
        _ => "num_local_experts",
    };
    // Qwen's `num_experts: 0` is a dense model; the other families' MoE blocks need experts.
    let least = u64::from(!matches!(family, Qwen2Moe | Qwen3Moe | Qwen3Next));
    let experts = match o.bounded_opt(experts_key, least, MAX_EXPERTS)? {
        Some(e) => e,
        None => o
            .bounded_opt(alias, least, MAX_EXPERTS)?
            .unwrap_or(experts_default),
    };
    if experts == 0 {
        return Ok(None);
    }
    // Each token is routed to at most every expert.
    let routed = || -> Result<u64> {
        let k = o.bounded_req("num_experts_per_tok", 1, u64::MAX)?;
        if k > experts {
            return Err(Error::new(
                o.path("num_experts_per_tok"),
                format!("{k} is more than the model's {experts} experts"),
            ));
        }
        Ok(k)
    };
    let top_k = match (o.get("num_experts_per_tok"), top_default) {
        (None, 0) => routed()?,
        (None, d) => d.min(experts),
        (Some(_), _) => routed()?,
    };
    let inter = match (family, inter_default) {
        (Mixtral, _) => a.intermediate,
        (GptOss | MiniMaxM2, _) => a.intermediate,
        (Llama4, _) => o
            .bounded_opt("intermediate_size", 1, MAX_FFN)?
            .unwrap_or(8192),
        (_, Some(d)) => o
            .bounded_opt("moe_intermediate_size", 1, MAX_FFN)?
            .unwrap_or(d),
        (_, None) => a.intermediate,
    };
    let mut m = Moe::new(experts, top_k, inter);
    match family {
        Qwen2Moe | Qwen3Next | Qwen35Moe => {
            let d = if family == Qwen2Moe { 5632 } else { 512 };
            m.shared_intermediate = o
                .bounded_opt("shared_expert_intermediate_size", 1, MAX_FFN)?
                .unwrap_or(d);
            m.shared_gate = true;
        }
        DeepseekV2 | DeepseekV3 | Glm4Moe => {
            let d = match family {
                DeepseekV2 => 2,
                _ => 1,
            };
            m.shared_experts = o
                .bounded_opt("n_shared_experts", 0, MAX_EXPERTS)?
                .unwrap_or(d);
            let fd = match family {
                DeepseekV2 => 0,
                DeepseekV3 => 3,
                _ => 1,
            };
            m.first_dense_layers = o
                .bounded_opt("first_k_dense_replace", 0, MAX_LAYERS)?
                .unwrap_or(fd);
            m.router_bias = family != DeepseekV2;
        }
        GptOss => {
            m.expert_bias = true;
            m.router_linear_bias = true;
        }
        MiniMaxM2 => m.router_bias = true,
        Llama4 => {
            m.shared_intermediate = inter;
        }
        _ => {}
    }
    // Which layers are MoE.
    match family {
        Qwen2Moe | Qwen3Moe | Qwen3Next => {
            let step = o
                .bounded_opt("decoder_sparse_step", 1, MAX_LAYERS)?
                .unwrap_or(1);
            m.pattern = step_pattern(step);
            m.dense_layers = index_list(o, "mlp_only_layers", layers)?.unwrap_or_default();
        }
        Llama4 => match index_list(o, "moe_layers", layers)? {
            Some(list) => {
                let v: Vec<bool> = (0..layers).map(|l| list.contains(&l)).collect();
                m.pattern = period(&v);
            }
            None => {
                let step = o
                    .bounded_opt("interleave_moe_layer_step", 1, MAX_LAYERS)?
                    .unwrap_or(1);
                m.pattern = step_pattern(step);
            }
        },
        _ => {}
    }
    if m.pattern.iter().all(|&b| b) {
        m.pattern.clear();
    }
    Ok(Some(m))
}

/// MoE on every `step`-th layer (`(i + 1) % step == 0`).
fn step_pattern(step: u64) -> Vec<bool> {
    let mut v = vec![false; step as usize];
    if let Some(l) = v.last_mut() {
        *l = true;
    }
    v
}

/// The keys [`to_hf_config`] writes as text that can read as a number: a NoPE pattern
/// ("10") and lists of layer indices ("3", "1 5").
pub const TEXT_KEYS: [&str; 3] = ["no_rope_layers", "mlp_only_layers", "moe_layers"];

/// The `config.json` keys that describe `a` (the inverse of [`parse_hf_config`]): what a
/// page writes into its `arch` knob when a reader edits one field of a model or pastes a
/// config. Lists (layer patterns, layer indices) are written as strings so that the knob's
/// `key=value` pairs can carry them.
pub fn to_hf_config(a: &Architecture) -> Map<String, Value> {
    let full = all_keys(a);
    // Drop every key the family's defaults already give (a shorter knob, a shorter link).
    let mut m = full.clone();
    for k in full.keys() {
        if k == "model_type" {
            continue;
        }
        let mut fewer = m.clone();
        fewer.remove(k);
        if parse_hf_config(&Value::Object(fewer.clone()), "").as_ref() == Ok(a) {
            m = fewer;
        }
    }
    m
}

/// Every key [`to_hf_config`] could write for `a`.
fn all_keys(a: &Architecture) -> Map<String, Value> {
    use Family::*;
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    let act = match a.activation {
        Activation::Silu => "silu",
        Activation::GeluNew => "gelu_new",
        Activation::Relu2 => "relu2",
        Activation::Gelu => match a.family {
            Gemma2 | Gemma3 | Starcoder2 => "gelu_pytorch_tanh",
            _ => "gelu",
        },
    };
    if a.family == Gpt2 {
        put("model_type", "gpt2".into());
        put("n_embd", a.hidden.into());
        put("n_head", a.heads.into());
        put("n_layer", a.layers.into());
        put("n_inner", a.intermediate.into());
        put("vocab_size", a.vocab.into());
        put("tie_word_embeddings", a.tied_embeddings.into());
        put("n_positions", a.learned_positions.unwrap_or(1024).into());
        put("activation_function", act.into());
        put("embd_pdrop", a.dropout.embd.into());
        put("attn_pdrop", a.dropout.attn.into());
        put("resid_pdrop", a.dropout.resid.into());
        return m;
    }
    let f = a.family;
    put("model_type", f.name().into());
    put("hidden_size", a.hidden.into());
    put("num_hidden_layers", a.layers.into());
    put("num_attention_heads", a.heads.into());
    match f {
        Falcon => {
            let new = a.kv_expanded;
            put("new_decoder_architecture", new.into());
            put("multi_query", (a.kv_heads == 1 && !new).into());
            put("num_kv_heads", a.kv_heads.into());
            put("parallel_attn", (a.block != Block::Pre).into());
            if new {
                let lns: u64 = if a.block == Block::ParallelTwoNorms {
                    2
                } else {
                    1
                };
                put("num_ln_in_parallel_attn", lns.into());
            }
            put("ffn_hidden_size", a.intermediate.into());
            put("bias", a.qkv_bias.into());
        }
        GptNeox => {
            put("use_parallel_residual", (a.block != Block::Pre).into());
            put("attention_bias", a.qkv_bias.into());
        }
        DeepseekV2 | DeepseekV3 => {}
        _ => {
            put("num_key_value_heads", a.kv_heads.into());
            put("head_dim", a.head_dim.into());
        }
    }
    if f == Llama4 {
        put("intermediate_size_mlp", a.intermediate.into());
    } else if f != Falcon {
        put("intermediate_size", a.intermediate.into());
    }
    put("vocab_size", a.vocab.into());
    put("tie_word_embeddings", a.tied_embeddings.into());
    let act_key = match f {
        Gemma2 | Gemma3 => "hidden_activation",
        Falcon => "activation",
        _ => "hidden_act",
    };
    put(act_key, act.into());
    match f {
        Mistral | Ministral3 | Mixtral | Phi3 | Qwen2 | Falcon | GptNeox => {}
        Qwen2Moe => put("qkv_bias", a.qkv_bias.into()),
        Starcoder2 | Ernie45 => put("use_bias", a.qkv_bias.into()),
        SeedOss => {
            put("attention_bias", a.qkv_bias.into());
            put("attention_out_bias", a.o_bias.into());
        }
        _ => put("attention_bias", a.qkv_bias.into()),
    }
    if matches!(f, Llama | Granite | SmolLm3 | DeepseekV2 | SeedOss) {
        put("mlp_bias", a.mlp_bias.into());
    }
    put("attention_dropout", a.dropout.attn.into());
    match f {
        Phi3 => {
            put("resid_pdrop", a.dropout.resid.into());
            put("embd_pdrop", a.dropout.embd.into());
        }
        Starcoder2 => {
            put("residual_dropout", a.dropout.resid.into());
            put("embedding_dropout", a.dropout.embd.into());
        }
        SeedOss => put("residual_dropout", a.dropout.resid.into()),
        Falcon | GptNeox => put("hidden_dropout", a.dropout.resid.into()),
        _ => {}
    }
    match f {
        Glm4Moe | Cohere | Llama4 => put("use_qk_norm", (a.qk_norm != QkNorm::None).into()),
        _ => {}
    }
    if a.rope_dim != a.head_dim
        || matches!(f, GptNeox | Glm4Moe | Glm4 | Qwen3Next | Qwen35 | Qwen35Moe)
    {
        let key = if f == GptNeox {
            "rotary_pct"
        } else {
            "partial_rotary_factor"
        };
        let mla_rope = a.mla.is_some();
        if !mla_rope {
            put(key, (a.rope_dim as f64 / a.head_dim as f64).into());
        }
    }
    // Windows and layer patterns.
    match f {
        Qwen2 | Qwen3 | Qwen2Moe | Qwen3Moe | SmolLm3 => {
            put("use_sliding_window", a.sliding_window.is_some().into());
        }
        _ => {}
    }
    match a.sliding_window {
        Some(w) => put("sliding_window", w.into()),
        // An explicit null where the family's default is a window.
        None if matches!(
            f,
            Mistral | Gemma2 | Gemma3 | Cohere2 | GptOss | Olmo3 | Exaone4
        ) =>
        {
            put("sliding_window", Value::Null)
        }
        None => {}
    }
    if !a.layer_types.is_empty()
        || matches!(
            f,
            Gemma2
                | Gemma3
                | Cohere2
                | GptOss
                | Qwen3Next
                | Qwen35
                | Qwen35Moe
                | Llama4
                | Olmo3
                | Exaone4
        )
    {
        let p: String = if a.layer_types.is_empty() {
            "f".into()
        } else {
            a.layer_types.iter().map(|t| t.code()).collect()
        };
        put("layer_types", p.into());
    }
    if matches!(f, Llama4 | SmolLm3) {
        let p: String = if a.nope.is_empty() {
            "1".into()
        } else {
            a.nope.iter().map(|&n| if n { '0' } else { '1' }).collect()
        };
        put("no_rope_layers", p.into());
    }
    if let Some(c) = a.chunk {
        put("attention_chunk_size", c.into());
    }
    if matches!(f, Gemma2 | Gemma3) {
        let cap = |on: bool, v: f64| if on { Value::from(v) } else { Value::Null };
        put("final_logit_softcapping", cap(a.final_softcap, 30.0));
        put("attn_logit_softcapping", cap(a.attn_softcap, 50.0));
    }
    if let Some(x) = &a.linear {
        put("linear_num_key_heads", x.key_heads.into());
        put("linear_num_value_heads", x.value_heads.into());
        put("linear_key_head_dim", x.key_dim.into());
        put("linear_value_head_dim", x.value_dim.into());
        put("linear_conv_kernel_dim", x.conv_kernel.into());
    }
    if let Some(x) = &a.mla {
        put(
            "q_lora_rank",
            x.q_lora_rank.map_or(Value::Null, Value::from),
        );
        put("kv_lora_rank", x.kv_lora_rank.into());
        put("qk_nope_head_dim", x.qk_nope_head_dim.into());
        put("qk_rope_head_dim", x.qk_rope_head_dim.into());
        put("v_head_dim", x.v_head_dim.into());
    }
    match (&a.moe, f) {
        (Some(moe), _) => {
            put("num_experts_per_tok", moe.top_k.into());
            let key = match f {
                Mixtral | GptOss | Llama4 | MiniMaxM2 => "num_local_experts",
                Qwen2Moe | Qwen3Moe | Qwen3Next | Qwen35Moe | Olmoe => "num_experts",
                _ => "n_routed_experts",
            };
            put(key, moe.experts.into());
            if !matches!(f, Mixtral | GptOss | Llama4 | MiniMaxM2 | Olmoe) {
                put("moe_intermediate_size", moe.expert_intermediate.into());
            }
            if matches!(f, GptOss | Llama4) {
                put("intermediate_size", moe.expert_intermediate.into());
            }
            if matches!(f, Qwen2Moe | Qwen3Next | Qwen35Moe) {
                put(
                    "shared_expert_intermediate_size",
                    moe.shared_intermediate.into(),
                );
            }
            if matches!(f, DeepseekV2 | DeepseekV3 | Glm4Moe) {
                put("n_shared_experts", moe.shared_experts.into());
                put("first_k_dense_replace", moe.first_dense_layers.into());
            }
            if matches!(f, Qwen2Moe | Qwen3Moe | Qwen3Next) {
                let step = moe.pattern.len().max(1);
                put("decoder_sparse_step", (step as u64).into());
                let list: Vec<String> = moe.dense_layers.iter().map(|l| l.to_string()).collect();
                put("mlp_only_layers", list.join(" ").into());
            }
            if f == Llama4 {
                let step = moe.pattern.len().max(1);
                if moe.pattern.is_empty() || moe.pattern == step_pattern(step as u64) {
                    put("interleave_moe_layer_step", (step as u64).into());
                } else {
                    let list: Vec<String> = (0..a.layers)
                        .filter(|&l| a.is_moe_layer(l))
                        .map(|l| l.to_string())
                        .collect();
                    put("moe_layers", list.join(" ").into());
                }
            }
        }
        (None, Qwen2Moe | Qwen3Moe | Qwen3Next) => put("num_experts", 0.into()),
        _ => {}
    }
    match a.quant {
        Some(Quant::Mxfp4) => put("quant_method", "mxfp4".into()),
        Some(Quant::Fp8 { block }) => {
            put("quant_method", "fp8".into());
            put("quant_block_size", block.into());
        }
        None => {}
    }
    if let Some(v) = &a.vision {
        let d = [
            v.hidden,
            v.intermediate,
            v.layers,
            v.channels,
            v.patch,
            v.image,
        ];
        for (k, x) in FLAT.iter().zip(d) {
            put(k, x.into());
        }
        put(FLAT[6], v.head.into());
    }
    m
}

/// Explicit architecture fields, short names (`hidden`, `layers`, …) or the Hugging Face
/// names. `family` picks the implementation (default `llama`).
pub fn parse_explicit(v: &Value, at: &str) -> Result<Architecture> {
    let o = Obj::new(v, at)?;
    let family = o.str_opt("family")?.unwrap_or("llama").to_ascii_lowercase();
    // Translate short names into a config.json object and parse that.
    let renames: &[(&str, &str, &str)] = &[
        // short, llama-style key, gpt2 key
        ("hidden", "hidden_size", "n_embd"),
        ("layers", "num_hidden_layers", "n_layer"),
        ("heads", "num_attention_heads", "n_head"),
        ("kv_heads", "num_key_value_heads", "num_key_value_heads"),
        ("intermediate", "intermediate_size", "n_inner"),
        ("vocab", "vocab_size", "vocab_size"),
        ("tied", "tie_word_embeddings", "tie_word_embeddings"),
        ("experts", "num_local_experts", "num_local_experts"),
        ("top_k", "num_experts_per_tok", "num_experts_per_tok"),
    ];
    let mut m = Map::new();
    let model_type = match family_of(&family) {
        Some(_) => family.clone(),
        None => {
            return Err(Error::new(
                o.path("family"),
                format!(
                    "unknown family '{}' ({})",
                    truncate(&family, 40),
                    supported_types()
                ),
            ))
        }
    };
    m.insert("model_type".into(), Value::String(model_type.clone()));
    for (k, val) in o.map.iter() {
        // A misspelt key (`kv_head`) would otherwise be ignored and its default taken. Not in
        // the browser, whose knobs never write a model this way (and HF_KEYS weighs 1 KB).
        if cfg!(not(target_arch = "wasm32"))
            && !renames.iter().any(|r| r.0 == k)
            && !HF_KEYS.contains(&k.as_str())
        {
            if k == "family" || k == "name" {
                continue;
            }
            return Err(Error::new(
                o.path(&crate::knobs::shown(k)),
                "unknown key (known: family, name, hidden, layers, heads, kv_heads, intermediate, vocab, tied, experts, top_k, or a config.json key)",
            ));
        }
        let key = renames
            .iter()
            .find(|(short, _, _)| short == k)
            .map(|(_, l, g)| if model_type == "gpt2" { *g } else { *l })
            .unwrap_or(k.as_str());
        if key != "family" && key != "model_type" {
            m.insert(key.to_string(), val.clone());
        }
    }
    // Name errors after the fields the user wrote.
    let arch = parse_hf_config(&Value::Object(m), at).map_err(|e| {
        let mut e = e;
        for (short, l, g) in renames {
            for long in [l, g] {
                let p = format!("{at}.{long}");
                if e.field == p && o.map.contains_key(*short) {
                    e.field = format!("{at}.{short}");
                }
            }
        }
        if e.field.ends_with(".model_type") {
            e.field = format!("{at}.family");
        }
        e
    })?;
    // Experts asked of a dense family would be dropped without a word (its config.json has
    // no such key). Not in the browser, whose knobs never write a model this way.
    if cfg!(not(target_arch = "wasm32")) && arch.moe.is_none() {
        for k in ["experts", "top_k"] {
            if o.map
                .get(k)
                .is_some_and(|v| !v.is_null() && v.as_u64() != Some(0))
            {
                return Err(Error::new(
                    o.path(k),
                    format!(
                        "the {} family has no experts: name a mixture-of-experts family (mixtral, qwen2_moe, deepseek_v3, …)",
                        truncate(&family, 40)
                    ),
                ));
            }
        }
    }
    Ok(arch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_preset_round_trips_through_its_config() {
        for p in crate::presets::all() {
            let c = Value::Object(to_hf_config(&p.arch));
            let back = parse_hf_config(&c, "c").unwrap_or_else(|e| panic!("{}: {e}", p.name));
            assert_eq!(back, p.arch, "{}", p.name);
            assert!(c
                .as_object()
                .unwrap()
                .keys()
                .all(|k| HF_KEYS.contains(&k.as_str())));
        }
    }

    #[test]
    fn hf_keys_are_all_the_parser_reads() {
        // Each source literal the parser passes to a getter must be listed.
        let src = include_str!("hf.rs");
        let body = &src[..src.find("#[cfg(test)]").unwrap()];
        for getter in ["_opt(\"", "_req(\"", "p(\"", "activation(o, \""] {
            for (i, _) in body.match_indices(getter) {
                let rest = &body[i + getter.len()..];
                let key = &rest[..rest.find('"').unwrap()];
                if key != "family" && key != "recipe" {
                    assert!(HF_KEYS.contains(&key), "{key} is read but not in HF_KEYS");
                }
            }
        }
        for ((k, ..), flat) in SIGLIP.iter().zip(FLAT) {
            assert_eq!(flat, format!("vision_config.{k}"));
            for key in [*k, flat] {
                assert!(HF_KEYS.contains(&key), "{key} is read but not in HF_KEYS");
            }
        }
    }

    /// Every number a config holds is bounded as it is read, and the error names the key the
    /// file contains (not an internal name).
    #[test]
    fn out_of_range_keys_are_named_as_the_file_names_them() {
        let ds = |k: &str, v: Value| {
            let mut c = json!({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
                "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                "v_head_dim": 8});
            c[k] = v;
            parse_hf_config(&c, "c")
        };
        assert!(ds("v_head_dim", json!(8)).is_ok());
        for k in [
            "v_head_dim",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
        ] {
            let e = ds(k, json!(4611686018427387904u64)).unwrap_err();
            assert_eq!(e.field, format!("c.{k}"), "{e}");
        }
        let e = ds("kv_lora_rank", json!(0)).unwrap_err();
        assert_eq!(e.field, "c.kv_lora_rank");
        let e = ds("attention_dropout", json!(1.5)).unwrap_err();
        assert_eq!(e.field, "c.attention_dropout", "{e}");
        let mut moe = json!({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "kv_lora_rank": 16,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 2,
            "num_experts_per_tok": 3, "moe_intermediate_size": 32});
        let e = parse_hf_config(&moe, "c").unwrap_err();
        assert_eq!(
            e.field, "c.num_experts_per_tok",
            "more than the experts: {e}"
        );
        moe["num_experts_per_tok"] = json!(2);
        // More dense layers than layers: all dense, as transformers builds it.
        moe["first_k_dense_replace"] = json!(3);
        let a = parse_hf_config(&moe, "c").unwrap();
        assert!(a.kinds().iter().all(|k| !k.moe));
        moe["first_k_dense_replace"] = json!(1u64 << 40);
        let e = parse_hf_config(&moe, "c").unwrap_err();
        assert_eq!(e.field, "c.first_k_dense_replace", "{e}");
        let gpt2 = |k: &str, v: Value| {
            let mut c = json!({"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100});
            c[k] = v;
            parse_hf_config(&c, "c")
        };
        for (k, v) in [
            ("attn_pdrop", json!(-0.1)),
            ("n_inner", json!(1u64 << 40)),
            ("n_positions", json!(0)),
            ("n_layer", json!(100000)),
        ] {
            assert_eq!(gpt2(k, v).unwrap_err().field, format!("c.{k}"));
        }
    }

    /// `num_experts: 0` is Qwen's way to write a dense model; a Mixtral, DeepSeek, GLM,
    /// gpt-oss or Llama 4 MoE block with no experts is no model (it was read as a dense one).
    #[test]
    fn zero_experts_are_dense_only_where_transformers_builds_dense() {
        let c = |t: &str, k: &str| {
            json!({"model_type": t, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128,
                "vocab_size": 100, k: 0})
        };
        for (t, k) in [
            ("mixtral", "num_local_experts"),
            ("gpt_oss", "num_local_experts"),
            ("deepseek_v3", "n_routed_experts"),
            ("glm4_moe", "n_routed_experts"),
            ("mixtral", "num_experts"),
        ] {
            let e = parse_hf_config(&c(t, k), "c").unwrap_err();
            assert_eq!(e.field, format!("c.{k}"), "{t}: {e}");
        }
        for t in ["qwen2_moe", "qwen3_moe"] {
            let a = parse_hf_config(&c(t, "num_experts"), "c").unwrap();
            assert!(a.moe.is_none(), "{t}");
        }
    }

    #[test]
    fn periods_are_the_shortest_repeating_prefix() {
        assert_eq!(period(&[1, 1, 1, 2, 1, 1, 1, 2]), vec![1, 1, 1, 2]);
        assert_eq!(period(&[1, 2, 1]), vec![1, 2]);
        assert_eq!(period(&[1, 1, 2]), vec![1, 1, 2]);
        assert_eq!(period(&[3]), vec![3]);
        assert!(period::<u8>(&[]).is_empty());
        // A prefix that repeats covers every layer: v[i] == p[i % p.len()].
        let v = [0, 1, 0, 0, 1, 0, 0, 1];
        let p = period(&v);
        assert!((0..v.len()).all(|i| v[i] == p[i % p.len()]));
    }

    #[test]
    fn missing_key_is_named() {
        let e = parse_hf_config(
            &json!({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}),
            "model.hf_config",
        )
        .unwrap_err();
        assert_eq!(e.field, "model.hf_config.num_hidden_layers");
    }

    #[test]
    fn unknown_type_is_rejected_without_echoing_much() {
        let long = "x".repeat(500);
        let e = parse_hf_config(&json!({ "model_type": long }), "c").unwrap_err();
        assert!(!e.message.contains(&"x".repeat(41)), "{e}");
        // It names the supported types and the key to read.
        for t in [
            "llama",
            "qwen3_moe",
            "gemma3",
            "gpt_oss",
            "kimi_k2",
            "model_type",
        ] {
            assert!(e.message.contains(t), "{e}");
        }
    }

    /// Quoted input is data: a terminal's escapes, line breaks and bidirectional overrides in
    /// a model type, a key, a model's or a GPU's name never reach the output as such.
    #[test]
    fn quoted_input_carries_no_control_characters() {
        let hostile = "a\u{1b}[2J\r\nb\u{7}\u{202e}c";
        let e = parse_hf_config(&json!({ "model_type": hostile }), "c").unwrap_err();
        assert!(
            e.message
                .contains("a\u{fffd}[2j\u{fffd}\u{fffd}b\u{fffd}\u{fffd}c"),
            "{e}"
        );
        let e = crate::Scenario::from_value(&json!({"model": "gpt2", hostile: 1})).unwrap_err();
        assert!(!e.field.chars().any(char::is_control), "{e}");
        let s = crate::Scenario::from_value(&json!({"seq": 512,
            "model": {"name": hostile, "hf_config": {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 100}},
            "gpu": {"name": hostile, "capacity_bytes": 1u64 << 34}}))
        .unwrap();
        let e = crate::estimate(&s).unwrap();
        for t in [&e.model, &e.gpu] {
            assert!(
                !t.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{t:?}"
            );
        }
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("abc", 3), "abc");
    }

    #[test]
    fn qwen2_has_qkv_bias() {
        let a = parse_hf_config(
            &json!({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
                    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                    "vocab_size": 151936, "tie_word_embeddings": true, "some_unknown_key": [1,2]}),
            "c",
        )
        .unwrap();
        assert_eq!(a.params().total, 494_032_768);
    }

    #[test]
    fn explicit_fields_use_short_names_in_errors() {
        let e = parse_explicit(
            &json!({"hidden": 64, "layers": 2, "heads": 3, "intermediate": 128, "vocab": 100}),
            "model",
        )
        .unwrap_err();
        assert_eq!(e.field, "model.head_dim");
        let e = parse_explicit(
            &json!({"hidden": 64, "layers": -2, "heads": 4, "intermediate": 128, "vocab": 100}),
            "model",
        )
        .unwrap_err();
        assert_eq!(e.field, "model.layers");
    }
}
