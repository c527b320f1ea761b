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
    let p = |name, aliases, source, arch| Preset {
        name,
        aliases,
        source,
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

/// Find a preset by name or alias (case-insensitive).
pub fn find(name: &str) -> Option<Preset> {
    let n = name.to_ascii_lowercase();
    all()
        .into_iter()
        .find(|p| p.name == n || p.aliases.contains(&n.as_str()))
}
