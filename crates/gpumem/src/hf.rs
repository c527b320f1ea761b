//! Architectures from Hugging Face `config.json` objects, and from explicit fields.
//!
//! Unknown keys are ignored (configs carry many that do not affect memory); a missing required
//! key, or a value of the wrong type or range, is an error naming the key.

use crate::num::short;
use serde_json::{Map, Value};

use crate::arch::{Activation, Architecture, Dropout, Family, Mla, Moe};
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
        Some(x) if x.fract() != 0.0 => format!("must be a whole number, got {}", short(x)),
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

/// Every `config.json` key [`parse_hf_config`] reads: a pasted config keeps these and drops
/// the rest (tokeniser ids, rope scaling, …), which is what lets a page carry it in its URL.
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
    "attention_dropout",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "mlp_bias",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "tie_word_embeddings",
    "vocab_size",
    "num_local_experts",
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
];

/// Parse a Hugging Face `config.json` object. `at` is the field path used in errors.
pub fn parse_hf_config(v: &Value, at: &str) -> Result<Architecture> {
    let o = Obj::new(v, at)?;
    let model_type = match o.str_opt("model_type")? {
        Some(t) => t.to_ascii_lowercase(),
        None => return Err(Error::new(
            o.path("model_type"),
            "is required but missing (one of: gpt2, llama, mistral, qwen2, mixtral, deepseek_v3)",
        )),
    };
    let arch = match model_type.as_str() {
        "gpt2" => parse_gpt2(&o)?,
        "llama" | "mistral" | "qwen2" | "mixtral" | "deepseek_v3" => {
            parse_llama_like(&o, &model_type)?
        }
        other => {
            return Err(Error::new(
                o.path("model_type"),
                format!(
                    "unsupported model type '{}' (supported: gpt2, llama, mistral, qwen2, mixtral, deepseek_v3)",
                    truncate(other, 40)
                ),
            ))
        }
    };
    arch.validate(&format!("{}.", o.at))?;
    Ok(arch)
}

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
            other => {
                return Err(Error::new(
                    o.path(key),
                    format!(
                        "unsupported activation '{}' (silu, gelu, gelu_new, gelu_pytorch_tanh)",
                        truncate(other, 40)
                    ),
                ))
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
    Ok(Architecture {
        family: Family::Gpt2,
        hidden,
        layers: o.bounded_req("n_layer", 1, MAX_LAYERS)?,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate: o.bounded_opt("n_inner", 1, MAX_FFN)?.unwrap_or(hidden * 4),
        vocab: o.bounded_req("vocab_size", 1, MAX_VOCAB)?,
        tied_embeddings: o.bool_opt("tie_word_embeddings")?.unwrap_or(true),
        learned_positions: Some(
            o.bounded_opt("n_positions", 1, MAX_POSITIONS)?
                .unwrap_or(1024),
        ),
        qkv_bias: true,
        o_bias: true,
        mlp_bias: true,
        activation: activation(o, "activation_function", Activation::GeluNew)?,
        dropout: Dropout {
            embd: p("embd_pdrop")?,
            attn: p("attn_pdrop")?,
            resid: p("resid_pdrop")?,
        },
        moe: None,
        mla: None,
    })
}

fn parse_llama_like(o: &Obj<'_>, model_type: &str) -> Result<Architecture> {
    let hidden = o.dim_req("hidden_size")?;
    let heads = o.dim_req("num_attention_heads")?;
    let kv_heads = o.dim_opt("num_key_value_heads")?.unwrap_or(heads);
    let head_dim = match o.dim_opt("head_dim")? {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(Error::new(
                o.path("head_dim"),
                format!("is required when hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})"),
            ))
        }
    };
    let attention_bias = o.bool_opt("attention_bias")?.unwrap_or(false);
    let (family, qkv_bias, o_bias) = match model_type {
        // Qwen2 always has q/k/v biases and no output bias.
        "qwen2" => (Family::Llama, true, false),
        "mixtral" => (Family::Mixtral, false, false),
        "deepseek_v3" => (Family::DeepseekV3, attention_bias, false),
        _ => (Family::Llama, attention_bias, attention_bias),
    };
    let attn_drop = o.prob_opt("attention_dropout")?.unwrap_or(0.0);
    let mut arch = Architecture {
        family,
        hidden,
        layers: o.bounded_req("num_hidden_layers", 1, MAX_LAYERS)?,
        heads,
        kv_heads,
        head_dim,
        intermediate: o.bounded_req("intermediate_size", 1, MAX_FFN)?,
        vocab: o.bounded_req("vocab_size", 1, MAX_VOCAB)?,
        tied_embeddings: o.bool_opt("tie_word_embeddings")?.unwrap_or(false),
        learned_positions: None,
        qkv_bias,
        o_bias,
        mlp_bias: o.bool_opt("mlp_bias")?.unwrap_or(false),
        activation: activation(o, "hidden_act", Activation::Silu)?,
        dropout: Dropout {
            embd: 0.0,
            attn: attn_drop,
            resid: 0.0,
        },
        moe: None,
        mla: None,
    };
    match model_type {
        "mixtral" => {
            let experts = o.bounded_req("num_local_experts", 1, MAX_EXPERTS)?;
            arch.moe = Some(Moe {
                experts,
                top_k: o.bounded_req("num_experts_per_tok", 1, experts)?,
                expert_intermediate: arch.intermediate,
                shared_experts: 0,
                first_dense_layers: 0,
                router_bias: false,
            });
        }
        "deepseek_v3" => {
            let nope = o.bounded_req("qk_nope_head_dim", 0, MAX_DIM)?;
            let rope = o.dim_req("qk_rope_head_dim")?;
            arch.head_dim = nope + rope;
            arch.kv_heads = heads;
            arch.mla = Some(Mla {
                q_lora_rank: o.dim_opt("q_lora_rank")?,
                kv_lora_rank: o.dim_req("kv_lora_rank")?,
                qk_nope_head_dim: nope,
                qk_rope_head_dim: rope,
                v_head_dim: o.dim_req("v_head_dim")?,
            });
            if let Some(experts) = o.bounded_opt("n_routed_experts", 1, MAX_EXPERTS)? {
                arch.moe = Some(Moe {
                    experts,
                    top_k: o.bounded_req("num_experts_per_tok", 1, experts)?,
                    expert_intermediate: o.bounded_req("moe_intermediate_size", 1, MAX_FFN)?,
                    shared_experts: o
                        .bounded_opt("n_shared_experts", 0, MAX_EXPERTS)?
                        .unwrap_or(0),
                    first_dense_layers: o
                        .bounded_opt("first_k_dense_replace", 0, arch.layers)?
                        .unwrap_or(0),
                    router_bias: true,
                });
            }
        }
        _ => {}
    }
    Ok(arch)
}

/// The `config.json` keys that describe `a` (the inverse of [`parse_hf_config`]): what a
/// page writes into its `arch` knob when a reader edits one field of a model.
pub fn to_hf_config(a: &Architecture) -> Map<String, Value> {
    let mut m = Map::new();
    let mut put = |k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    let act = match a.activation {
        Activation::Silu => "silu",
        Activation::GeluNew => "gelu_new",
        Activation::Gelu => "gelu",
    };
    if a.family == Family::Gpt2 {
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
    let model_type = match a.family {
        Family::Mixtral => "mixtral",
        Family::DeepseekV3 => "deepseek_v3",
        _ if a.qkv_bias && !a.o_bias => "qwen2",
        _ => "llama",
    };
    put("model_type", model_type.into());
    put("hidden_size", a.hidden.into());
    put("num_hidden_layers", a.layers.into());
    put("num_attention_heads", a.heads.into());
    if a.family != Family::DeepseekV3 {
        put("num_key_value_heads", a.kv_heads.into());
        if a.head_dim * a.heads != a.hidden {
            put("head_dim", a.head_dim.into());
        }
    }
    put("intermediate_size", a.intermediate.into());
    put("vocab_size", a.vocab.into());
    put("tie_word_embeddings", a.tied_embeddings.into());
    if a.qkv_bias && model_type != "qwen2" {
        put("attention_bias", true.into());
    }
    if a.mlp_bias {
        put("mlp_bias", true.into());
    }
    if a.activation != Activation::Silu {
        put("hidden_act", act.into());
    }
    if a.dropout.attn > 0.0 {
        put("attention_dropout", a.dropout.attn.into());
    }
    if let Some(x) = &a.mla {
        if let Some(q) = x.q_lora_rank {
            put("q_lora_rank", q.into());
        }
        put("kv_lora_rank", x.kv_lora_rank.into());
        put("qk_nope_head_dim", x.qk_nope_head_dim.into());
        put("qk_rope_head_dim", x.qk_rope_head_dim.into());
        put("v_head_dim", x.v_head_dim.into());
    }
    if let Some(moe) = &a.moe {
        put("num_experts_per_tok", moe.top_k.into());
        if a.family == Family::Mixtral {
            put("num_local_experts", moe.experts.into());
        } else {
            put("n_routed_experts", moe.experts.into());
            put("moe_intermediate_size", moe.expert_intermediate.into());
            put("n_shared_experts", moe.shared_experts.into());
            put("first_k_dense_replace", moe.first_dense_layers.into());
        }
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
    let model_type = match family.as_str() {
        "llama" | "mistral" | "qwen2" | "mixtral" | "gpt2" | "deepseek_v3" => family.clone(),
        other => {
            return Err(Error::new(
                o.path("family"),
                format!(
                    "unknown family '{}' (gpt2, llama, mistral, qwen2, mixtral, deepseek_v3)",
                    truncate(other, 40)
                ),
            ))
        }
    };
    m.insert("model_type".into(), Value::String(model_type.clone()));
    for (k, val) in o.map.iter() {
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
    parse_hf_config(&Value::Object(m), at).map_err(|e| {
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
    })
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
        moe["first_k_dense_replace"] = json!(3);
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
        assert!(e.message.len() < 200);
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
