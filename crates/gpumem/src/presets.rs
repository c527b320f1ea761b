//! Real models, from their published `config.json` files.

use crate::arch::{Activation, Architecture, AttnType, Dropout, Family, Mla, Moe, Norm, Quant};

/// A named model.
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// Where the configuration comes from.
    pub source: &'static str,
    pub arch: Architecture,
}

/// GPT-2's configuration (OpenAI's release as published on the Hugging Face hub).
pub fn gpt2(hidden: u64, layers: u64, heads: u64) -> Architecture {
    let mut a = Architecture::base(Family::Gpt2, hidden, layers, heads, 4 * hidden);
    a.vocab = 50257;
    a.tied_embeddings = true;
    a.learned_positions = Some(1024);
    a.qkv_bias = true;
    a.o_bias = true;
    a.mlp_bias = true;
    a.activation = Activation::GeluNew;
    a.dropout = Dropout {
        embd: 0.1,
        attn: 0.1,
        resid: 0.1,
    };
    a.norm = Norm::LayerNorm;
    a.gated = false;
    a.rope_dim = 0;
    a
}

/// A Llama-style decoder (Llama; Qwen2 when `qkv_bias`).
#[allow(clippy::too_many_arguments)]
pub fn llama(
    hidden: u64,
    layers: u64,
    heads: u64,
    kv_heads: u64,
    intermediate: u64,
    vocab: u64,
    tied: bool,
    qkv_bias: bool,
) -> Architecture {
    let family = if qkv_bias {
        Family::Qwen2
    } else {
        Family::Llama
    };
    let mut a = Architecture::base(family, hidden, layers, heads, intermediate);
    a.kv_heads = kv_heads;
    a.vocab = vocab;
    a.tied_embeddings = tied;
    a.qkv_bias = qkv_bias;
    a
}

fn mistral_7b() -> Architecture {
    let mut a = llama(4096, 32, 32, 8, 14336, 32000, false, false);
    a.family = Family::Mistral;
    a.sliding_window = Some(4096);
    a.layer_types = vec![AttnType::Sliding];
    a
}

fn mixtral_8x7b() -> Architecture {
    let mut a = llama(4096, 32, 32, 8, 14336, 32000, false, false);
    a.family = Family::Mixtral;
    a.moe = Some(Moe::new(8, 2, 14336));
    a
}

fn deepseek_v3() -> Architecture {
    let mut a = llama(7168, 61, 128, 128, 18432, 129280, false, false);
    a.family = Family::DeepseekV3;
    a.head_dim = 128 + 64;
    a.rope_dim = 64;
    let mut m = Moe::new(256, 8, 2048);
    m.shared_experts = 1;
    m.first_dense_layers = 3;
    m.router_bias = true;
    a.moe = Some(m);
    a.mla = Some(Mla {
        q_lora_rank: Some(1536),
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
    });
    a.quant = Some(Quant::Fp8 { block: 128 });
    a
}

/// Every preset, in display order.
pub fn all() -> Vec<Preset> {
    let mut v = written();
    v.extend(CONFIGS.iter().map(|c| c.preset()));
    v
}

/// The presets written here as architectures (not parsed from config keys), in display order.
fn written() -> Vec<Preset> {
    let p = |name, aliases, src, arch| Preset {
        name,
        aliases,
        source: source(src),
        arch,
    };
    let qwen_small = |name, h, l, a, kv, i, tied| {
        p(
            name,
            &[][..],
            "Qwen/Qwen2.5 config.json",
            llama(
                h,
                l,
                a,
                kv,
                i,
                if tied { 151936 } else { 152064 },
                tied,
                true,
            ),
        )
    };
    let qwen = vec![
        qwen_small("qwen2.5-0.5b", 896, 24, 14, 2, 4864, true),
        qwen_small("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, true),
        qwen_small("qwen2.5-3b", 2048, 36, 16, 2, 11008, true),
        qwen_small("qwen2.5-7b", 3584, 28, 28, 4, 18944, false),
        qwen_small("qwen2.5-14b", 5120, 48, 40, 8, 13824, false),
        qwen_small("qwen2.5-32b", 5120, 64, 40, 8, 27648, false),
        qwen_small("qwen2.5-72b", 8192, 80, 64, 8, 29568, false),
    ];
    let mut v = vec![
        p(
            "gpt2",
            &["gpt2-124m", "gpt2-small"][..],
            "openai-community/gpt2 config.json",
            gpt2(768, 12, 12),
        ),
        p(
            "gpt2-medium",
            &["gpt2-355m"][..],
            "openai-community/gpt2-medium config.json",
            gpt2(1024, 24, 16),
        ),
        p(
            "gpt2-large",
            &["gpt2-774m"][..],
            "openai-community/gpt2-large config.json",
            gpt2(1280, 36, 20),
        ),
        p(
            "gpt2-xl",
            &["gpt2-1.5b"][..],
            "openai-community/gpt2-xl config.json",
            gpt2(1600, 48, 25),
        ),
        p(
            "llama2-7b",
            &[][..],
            "meta-llama/Llama-2-7b-hf config.json",
            llama(4096, 32, 32, 32, 11008, 32000, false, false),
        ),
        p(
            "llama2-13b",
            &[][..],
            "meta-llama/Llama-2-13b-hf config.json",
            llama(5120, 40, 40, 40, 13824, 32000, false, false),
        ),
        p(
            "llama2-70b",
            &[][..],
            "meta-llama/Llama-2-70b-hf config.json",
            llama(8192, 80, 64, 8, 28672, 32000, false, false),
        ),
        p(
            "llama3.2-1b",
            &["llama3-1b"][..],
            "meta-llama/Llama-3.2-1B config.json",
            llama(2048, 16, 32, 8, 8192, 128256, true, false),
        ),
        p(
            "llama3.2-3b",
            &["llama3-3b"][..],
            "meta-llama/Llama-3.2-3B config.json",
            llama(3072, 28, 24, 8, 8192, 128256, true, false),
        ),
        p(
            "llama3.1-8b",
            &["llama3-8b", "llama3.3-8b"][..],
            "meta-llama/Llama-3.1-8B config.json",
            llama(4096, 32, 32, 8, 14336, 128256, false, false),
        ),
        p(
            "llama3.1-70b",
            &["llama3-70b", "llama3.3-70b"][..],
            "meta-llama/Llama-3.1-70B config.json",
            llama(8192, 80, 64, 8, 28672, 128256, false, false),
        ),
        p(
            "llama3.1-405b",
            &["llama3-405b"][..],
            "meta-llama/Llama-3.1-405B config.json",
            llama(16384, 126, 128, 8, 53248, 128256, false, false),
        ),
        p(
            "mistral-7b",
            &["mistral-7b-v0.1"][..],
            "mistralai/Mistral-7B-v0.1 config.json",
            mistral_7b(),
        ),
        p(
            "mixtral-8x7b",
            &[][..],
            "mistralai/Mixtral-8x7B-v0.1 config.json",
            mixtral_8x7b(),
        ),
        p(
            "deepseek-v3",
            &[][..],
            "deepseek-ai/DeepSeek-V3 config.json (MTP layer not counted, as transformers loads it)",
            deepseek_v3(),
        ),
    ];
    v.extend(qwen);
    v
}

/// Where a preset comes from, which only the native tools show (`gpumem presets`, the
/// book's tables): the widgets' wasm leaves the texts out.
const fn source(s: &'static str) -> &'static str {
    if cfg!(target_arch = "wasm32") {
        ""
    } else {
        s
    }
}

/// A preset given as the `config.json` keys that describe it (what [`crate::hf::to_hf_config`]
/// writes), parsed by the engine like any pasted config.
struct Config {
    name: &'static str,
    aliases: &'static [&'static str],
    source: &'static str,
    json: &'static str,
}

impl Config {
    fn preset(&self) -> Preset {
        // Errors by their Display: `expect` would carry the error types' Debug (and std's
        // string escaping with its Unicode tables) into the widgets' wasm.
        let v: serde_json::Value = serde_json::from_str(self.json).unwrap_or_else(|e| {
            let why = crate::error::json_fault(&e);
            panic!("{}: a preset's JSON: {why}", self.name)
        });
        Preset {
            name: self.name,
            aliases: self.aliases,
            source: self.source,
            arch: crate::hf::parse_hf_config(&v, self.name)
                .unwrap_or_else(|e| panic!("a preset's config: {e}")),
        }
    }
}

/// Models of 2024–2026 from their published config.json files (the keys that decide the
/// architecture; transformers 5.17's defaults for the rest). Each is checked against the
/// copy in tests/data/models/configs (parameters and KV cache exact against transformers).
const CONFIGS: &[Config] = &[
    Config {
        name: "qwen3-0.6b",
        aliases: &[],
        source: source("Qwen/Qwen3-0.6B config.json"),
        json: r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true}"#,
    },
    Config {
        name: "qwen3-8b",
        aliases: &[],
        source: source("Qwen/Qwen3-8B config.json"),
        json: r#"{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":false}"#,
    },
    Config {
        name: "qwen3-30b-a3b",
        aliases: &[],
        source: source("Qwen/Qwen3-30B-A3B config.json"),
        json: r#"{"model_type":"qwen3_moe","hidden_size":2048,"intermediate_size":6144,"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":768}"#,
    },
    Config {
        name: "qwen3-235b-a22b",
        aliases: &[],
        source: source("Qwen/Qwen3-235B-A22B config.json"),
        json: r#"{"model_type":"qwen3_moe","hidden_size":4096,"intermediate_size":12288,"num_hidden_layers":94,"num_attention_heads":64,"num_key_value_heads":4,"head_dim":128,"vocab_size":151936,"num_experts":128,"num_experts_per_tok":8,"moe_intermediate_size":1536}"#,
    },
    Config {
        name: "qwen3-next-80b-a3b",
        aliases: &[],
        source: source("Qwen/Qwen3-Next-80B-A3B-Instruct config.json"),
        json: r#"{"model_type":"qwen3_next","hidden_size":2048,"intermediate_size":5120,"num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"vocab_size":151936,"full_attention_interval":4,"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,"num_experts":512,"num_experts_per_tok":10,"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"partial_rotary_factor":0.25}"#,
    },
    Config {
        name: "qwen1.5-moe-a2.7b",
        aliases: &[],
        source: source("Qwen/Qwen1.5-MoE-A2.7B config.json"),
        json: r#"{"model_type":"qwen2_moe","hidden_size":2048,"intermediate_size":5632,"num_hidden_layers":24,"num_attention_heads":16,"num_key_value_heads":16,"vocab_size":151936,"num_experts":60,"num_experts_per_tok":4,"moe_intermediate_size":1408,"shared_expert_intermediate_size":5632}"#,
    },
    Config {
        name: "gemma-2-9b",
        aliases: &["gemma-2-9b-it"],
        source: source("google/gemma-2-9b config.json"),
        json: r#"{"model_type":"gemma2","hidden_size":3584,"intermediate_size":14336,"num_hidden_layers":42,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,"vocab_size":256000,"sliding_window":4096,"final_logit_softcapping":30.0,"attn_logit_softcapping":50.0}"#,
    },
    Config {
        name: "gemma-3-1b",
        aliases: &["gemma-3-1b-it"],
        source: source("google/gemma-3-1b-it config.json"),
        json: r#"{"model_type":"gemma3_text","hidden_size":1152,"intermediate_size":6912,"num_hidden_layers":26,"num_attention_heads":4,"num_key_value_heads":1,"head_dim":256,"vocab_size":262144,"sliding_window":512,"sliding_window_pattern":6}"#,
    },
    Config {
        name: "gemma-3-12b",
        aliases: &["gemma-3-12b-it"],
        source: source("google/gemma-3-12b-it config.json (its text_config, and the SigLIP vision tower of its vision_config)"),
        json: r#"{"model_type":"gemma3","text_config":{"hidden_size":3840,"intermediate_size":15360,"num_hidden_layers":48,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":256,"vocab_size":262208,"sliding_window":1024,"sliding_window_pattern":6},"vision_config":{"hidden_size":1152,"intermediate_size":4304,"num_hidden_layers":27,"patch_size":14,"image_size":896,"vision_use_head":false}}"#,
    },
    Config {
        name: "gpt-oss-20b",
        aliases: &[],
        source: source("openai/gpt-oss-20b config.json (MXFP4 experts)"),
        json: r#"{"model_type":"gpt_oss","hidden_size":2880,"intermediate_size":2880,"num_hidden_layers":24,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"vocab_size":201088,"num_local_experts":32,"num_experts_per_tok":4,"sliding_window":128,"quant_method":"mxfp4"}"#,
    },
    Config {
        name: "gpt-oss-120b",
        aliases: &[],
        source: source("openai/gpt-oss-120b config.json (MXFP4 experts)"),
        json: r#"{"model_type":"gpt_oss","hidden_size":2880,"intermediate_size":2880,"num_hidden_layers":36,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"vocab_size":201088,"num_local_experts":128,"num_experts_per_tok":4,"sliding_window":128,"quant_method":"mxfp4"}"#,
    },
    Config {
        name: "llama4-scout",
        aliases: &["llama4-scout-17b-16e", "llama-4-scout"],
        source: source("meta-llama/Llama-4-Scout-17B-16E-Instruct config.json (text_config; the vision tower is not modelled)"),
        json: r#"{"model_type":"llama4_text","hidden_size":5120,"intermediate_size":8192,"intermediate_size_mlp":16384,"num_hidden_layers":48,"num_attention_heads":40,"num_key_value_heads":8,"head_dim":128,"vocab_size":202048,"num_local_experts":16,"num_experts_per_tok":1,"interleave_moe_layer_step":1,"attention_chunk_size":8192,"use_qk_norm":true}"#,
    },
    Config {
        name: "phi-3.5-mini",
        aliases: &["phi-3.5-mini-instruct"],
        source: source("microsoft/Phi-3.5-mini-instruct config.json"),
        json: r#"{"model_type":"phi3","hidden_size":3072,"intermediate_size":8192,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32064,"sliding_window":262144}"#,
    },
    Config {
        name: "phi-4",
        aliases: &[],
        source: source("microsoft/phi-4 config.json"),
        json: r#"{"model_type":"phi3","hidden_size":5120,"intermediate_size":17920,"num_hidden_layers":40,"num_attention_heads":40,"num_key_value_heads":10,"vocab_size":100352}"#,
    },
    Config {
        name: "olmo-2-7b",
        aliases: &["olmo-2-1124-7b"],
        source: source("allenai/OLMo-2-1124-7B config.json"),
        json: r#"{"model_type":"olmo2","hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":100352}"#,
    },
    Config {
        name: "glm-4.5-air",
        aliases: &[],
        source: source("zai-org/GLM-4.5-Air config.json (the MTP layer is not built by transformers)"),
        json: r#"{"model_type":"glm4_moe","hidden_size":4096,"intermediate_size":10944,"num_hidden_layers":46,"num_attention_heads":96,"num_key_value_heads":8,"head_dim":128,"vocab_size":151552,"attention_bias":true,"partial_rotary_factor":0.5,"n_routed_experts":128,"n_shared_experts":1,"num_experts_per_tok":8,"moe_intermediate_size":1408,"first_k_dense_replace":1,"use_qk_norm":false}"#,
    },
    Config {
        name: "glm-4.7",
        aliases: &[],
        source: source("zai-org/GLM-4.7 config.json (the MTP layer is not built by transformers)"),
        json: r#"{"model_type":"glm4_moe","hidden_size":5120,"intermediate_size":12288,"num_hidden_layers":92,"num_attention_heads":96,"num_key_value_heads":8,"head_dim":128,"vocab_size":151552,"attention_bias":true,"partial_rotary_factor":0.5,"n_routed_experts":160,"n_shared_experts":1,"num_experts_per_tok":8,"moe_intermediate_size":1536,"first_k_dense_replace":3,"use_qk_norm":true}"#,
    },
    Config {
        name: "kimi-k2",
        aliases: &["kimi-k2-instruct"],
        source: source("moonshotai/Kimi-K2-Instruct config.json (DeepSeek-V3's architecture; fp8 weights)"),
        json: r#"{"model_type":"kimi_k2","hidden_size":7168,"intermediate_size":18432,"num_hidden_layers":61,"num_attention_heads":64,"vocab_size":163840,"q_lora_rank":1536,"kv_lora_rank":512,"qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128,"n_routed_experts":384,"n_shared_experts":1,"num_experts_per_tok":8,"moe_intermediate_size":2048,"first_k_dense_replace":1,"quant_method":"fp8","quant_block_size":128}"#,
    },
    Config {
        name: "deepseek-v2-lite",
        aliases: &[],
        source: source("deepseek-ai/DeepSeek-V2-Lite config.json (queries not compressed: q_lora_rank null)"),
        json: r#"{"model_type":"deepseek_v2","hidden_size":2048,"intermediate_size":10944,"num_hidden_layers":27,"num_attention_heads":16,"vocab_size":102400,"q_lora_rank":null,"kv_lora_rank":512,"qk_nope_head_dim":128,"qk_rope_head_dim":64,"v_head_dim":128,"n_routed_experts":64,"n_shared_experts":2,"num_experts_per_tok":6,"moe_intermediate_size":1408,"first_k_dense_replace":1}"#,
    },
    Config {
        name: "smollm3-3b",
        aliases: &[],
        source: source("HuggingFaceTB/SmolLM3-3B config.json"),
        json: r#"{"model_type":"smollm3","hidden_size":2048,"intermediate_size":11008,"num_hidden_layers":36,"num_attention_heads":16,"num_key_value_heads":4,"vocab_size":128256,"no_rope_layer_interval":4,"tie_word_embeddings":true}"#,
    },
    Config {
        name: "granite-3.1-8b",
        aliases: &["granite-3.1-8b-instruct"],
        source: source("ibm-granite/granite-3.1-8b-instruct config.json"),
        json: r#"{"model_type":"granite","hidden_size":4096,"intermediate_size":12800,"num_hidden_layers":40,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":49155,"tie_word_embeddings":true,"attention_dropout":0.1}"#,
    },
    Config {
        name: "falcon-7b",
        aliases: &[],
        source: source("tiiuae/falcon-7b config.json"),
        json: r#"{"model_type":"falcon","hidden_size":4544,"num_hidden_layers":32,"num_attention_heads":71,"vocab_size":65024,"multi_query":true,"parallel_attn":true,"new_decoder_architecture":false,"bias":false}"#,
    },
    Config {
        name: "pythia-1b",
        aliases: &[],
        source: source("EleutherAI/pythia-1b config.json"),
        json: r#"{"model_type":"gpt_neox","hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,"num_attention_heads":8,"vocab_size":50304,"rotary_pct":0.25,"use_parallel_residual":true,"tie_word_embeddings":false}"#,
    },
    Config {
        name: "starcoder2-7b",
        aliases: &[],
        source: source("bigcode/starcoder2-7b config.json"),
        json: r#"{"model_type":"starcoder2","hidden_size":4608,"intermediate_size":18432,"num_hidden_layers":32,"num_attention_heads":36,"num_key_value_heads":4,"vocab_size":49152,"sliding_window":4096,"use_bias":true,"attention_dropout":0.1,"residual_dropout":0.1,"embedding_dropout":0.1}"#,
    },
    Config {
        name: "command-r",
        aliases: &["c4ai-command-r-v01"],
        source: source("CohereForAI/c4ai-command-r-v01 config.json"),
        json: r#"{"model_type":"cohere","hidden_size":8192,"intermediate_size":22528,"num_hidden_layers":40,"num_attention_heads":64,"num_key_value_heads":64,"vocab_size":256000,"use_qk_norm":false}"#,
    },
    Config {
        name: "command-r7b",
        aliases: &["c4ai-command-r7b-12-2024"],
        source: source("CohereForAI/c4ai-command-r7b-12-2024 config.json"),
        json: r#"{"model_type":"cohere2","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":256000,"sliding_window":4096,"sliding_window_pattern":4}"#,
    },
];

/// Find a preset by name or alias (case-insensitive). A preset given as config keys is
/// parsed only when it is the one asked for.
pub fn find(name: &str) -> Option<Preset> {
    let n = name.to_ascii_lowercase();
    if let Some(c) = CONFIGS
        .iter()
        .find(|c| c.name == n || c.aliases.contains(&n.as_str()))
    {
        return Some(c.preset());
    }
    // The written ones only: parsing every config preset to find another would make each
    // scenario's parse (every slider step of every widget) a millisecond slower.
    written()
        .into_iter()
        .find(|p| p.name == n || p.aliases.contains(&n.as_str()))
}

/// Which published config in tests/data/models/configs each config preset copies.
#[cfg(test)]
pub(crate) const PRESET_FILES: &[(&str, &str)] = &[
    ("qwen3-0.6b", "qwen3-0.6b"),
    ("qwen3-8b", "qwen3-8b"),
    ("qwen3-30b-a3b", "qwen3-30b-a3b"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b"),
    ("qwen3-next-80b-a3b", "qwen3-next-80b-a3b-instruct"),
    ("qwen1.5-moe-a2.7b", "qwen1.5-moe-a2.7b"),
    ("gemma-2-9b", "gemma-2-9b-it"),
    ("gemma-3-1b", "gemma-3-1b-it"),
    ("gemma-3-12b", "gemma-3-12b-it"),
    ("gpt-oss-20b", "gpt-oss-20b"),
    ("gpt-oss-120b", "gpt-oss-120b"),
    ("llama4-scout", "llama4-scout-17b-16e"),
    ("phi-3.5-mini", "phi-3.5-mini-instruct"),
    ("phi-4", "phi-4"),
    ("olmo-2-7b", "olmo-2-1124-7b"),
    ("glm-4.5-air", "glm-4.5-air"),
    ("glm-4.7", "glm-4.7"),
    ("kimi-k2", "kimi-k2-instruct"),
    ("deepseek-v2-lite", "deepseek-v2-lite"),
    ("deepseek-v3", "deepseek-v3"),
    ("smollm3-3b", "smollm3-3b"),
    ("granite-3.1-8b", "granite-3.1-8b-instruct"),
    ("falcon-7b", "falcon-7b"),
    ("pythia-1b", "pythia-1b"),
    ("starcoder2-7b", "starcoder2-7b"),
    ("command-r", "c4ai-command-r-v01"),
    ("command-r7b", "c4ai-command-r7b-12-2024"),
    ("mistral-7b", "mistral-7b-v0.1"),
    ("mixtral-8x7b", "mixtral-8x7b"),
    ("llama3.1-8b", "llama3.1-8b"),
    ("qwen2.5-7b", "qwen2.5-7b-instruct"),
];

#[cfg(test)]
mod tests {
    /// Every preset that copies a published config is that config, as the engine reads it.
    #[test]
    fn config_presets_are_their_published_configs() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/models/configs"
        );
        for (name, file) in super::PRESET_FILES {
            let text = std::fs::read_to_string(format!("{dir}/{file}.json")).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let want = crate::hf::parse_hf_config(&v, file).unwrap();
            let got = super::find(name).unwrap_or_else(|| panic!("{name}")).arch;
            assert_eq!(got, want, "{name}");
        }
        // Every config preset is listed, and names are unique.
        let all = super::all();
        for c in super::CONFIGS {
            assert!(
                super::PRESET_FILES.iter().any(|(n, _)| *n == c.name),
                "{}",
                c.name
            );
        }
        for (i, p) in all.iter().enumerate() {
            assert!(all[..i].iter().all(|q| q.name != p.name), "{}", p.name);
        }
    }
}
