//! Decoder-only transformer architectures and their exact parameter counts.
//!
//! The counts follow the Hugging Face `transformers` modules parameter for parameter, so that
//! they equal PyTorch's `sum(p.numel() for p in model.parameters())` (tied weights once).

use crate::error::{Error, Result};

/// Which implementation a model follows (its `model_type`): decides biases, norms, the MLP and
/// the op sequence whose saved tensors the engine replays. Features that several families
/// share (QK-norm, sandwich norms, parallel blocks, sliding windows …) are fields of
/// [`Architecture`]; what only one family does is decided by its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// GPT-2: learned positions, LayerNorm, fused qkv `Conv1D`, GELU (tanh) MLP, dropout.
    Gpt2,
    /// Llama: RMSNorm, RoPE, separate q/k/v, SwiGLU.
    Llama,
    /// Mistral: the Llama layer (no biases) with a sliding window.
    Mistral,
    /// Qwen2: the Llama layer with q/k/v biases.
    Qwen2,
    /// Qwen2-MoE (Qwen1.5-MoE): routed experts plus a gated shared expert.
    Qwen2Moe,
    /// Qwen3: per-head QK-norm.
    Qwen3,
    /// Qwen3-MoE.
    Qwen3Moe,
    /// Qwen3-Next: gated DeltaNet (linear attention) layers, gated full attention.
    Qwen3Next,
    /// Qwen3.5 / 3.6 (`qwen3_5_text`, dense): Qwen3-Next's layers, the DeltaNet's input
    /// projections separate (`in_proj_qkv`, `_z`, `_b`, `_a`), a dense MLP in every layer.
    Qwen35,
    /// Qwen3.5 / 3.6 MoE (`qwen3_5_moe_text`): Qwen3.5's layers with Qwen3-Next's routed and
    /// gated shared experts in every layer.
    Qwen35Moe,
    /// Mixtral: the Llama attention with a top-k routed mixture of SwiGLU experts.
    Mixtral,
    /// Ministral 3 (`ministral3`): Mistral's layer with its queries scaled by position after
    /// RoPE (Llama 4's attention temperature, `llama_4_scaling_beta`).
    Ministral3,
    /// DeepSeek-V2: multi-head latent attention, shared + routed experts.
    DeepseekV2,
    /// DeepSeek-V3 (and Kimi K2): MLA, sigmoid router with a correction bias, dense first layers.
    DeepseekV3,
    /// Gemma 2: sandwich norms, (1 + w) RMSNorm, scaled embeddings, softcapping.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with per-head QK-norm and a 5:1 sliding/full pattern.
    Gemma3,
    /// Llama 4 (text): chunked attention, NoPE layers, experts run densely with `bmm`.
    Llama4,
    /// Phi-3 / Phi-4: fused qkv and gate/up projections.
    Phi3,
    /// OLMo 2: full-width QK-norm, norms after attention and MLP.
    Olmo2,
    /// OLMo 3: OLMo 2's layer with sliding-window attention on three layers of four.
    Olmo3,
    /// GLM-4.5 / 4.6 / 4.7 (`glm4_moe`): partial RoPE, dense first layers, shared expert.
    Glm4Moe,
    /// GLM-4 (`glm4`, the dense 0414 models): sandwich norms, fused gate/up, partial RoPE on
    /// interleaved pairs.
    Glm4,
    /// gpt-oss: attention sinks, biased experts with a clamped SwiGLU, sliding/full layers.
    GptOss,
    /// SmolLM3: the Llama layer with NoPE every few layers.
    SmolLm3,
    /// Granite: the Llama layer with embedding, residual and logit multipliers.
    Granite,
    /// Falcon: fused query_key_value, parallel attention and MLP, biased LayerNorm.
    Falcon,
    /// GPT-NeoX (Pythia): parallel residual, biased LayerNorm, non-gated GELU MLP.
    GptNeox,
    /// StarCoder2: biased LayerNorm and linears, non-gated MLP, sliding window.
    Starcoder2,
    /// Cohere (Command R): one LayerNorm feeding attention and MLP in parallel.
    Cohere,
    /// Cohere2 (Command R7B): Cohere with sliding layers and NoPE full layers.
    Cohere2,
    /// Seed-OSS: the Llama layer with biased q/k/v, and dropout on the attention and both
    /// residual branches by default.
    SeedOss,
    /// ERNIE 4.5 (dense): the Llama layer with RoPE in fp32 on interleaved pairs, and one
    /// `use_bias` for every linear.
    Ernie45,
    /// MiniMax-M2: full-width QK-norm, every layer a mixture of experts with a sigmoid router
    /// and a correction bias.
    MiniMaxM2,
    /// EXAONE 4: norms after attention and MLP, per-head QK-norm, sliding layers with RoPE
    /// and full ones without.
    Exaone4,
    /// Hunyuan (dense): the Llama layer with per-head QK-norm after RoPE.
    HunyuanDense,
    /// Arcee (AFM): the Llama attention with a non-gated `relu2` MLP.
    Arcee,
    /// OLMoE: Llama's pre-norm layer with OLMo 2's full-width QK-norm and a softmax-routed
    /// MoE in every layer (experts `intermediate_size` wide, no shared expert).
    Olmoe,
}

impl Family {
    /// The `model_type` a config.json of this family carries.
    pub fn name(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Qwen3Next => "qwen3_next",
            Family::Qwen35 => "qwen3_5_text",
            Family::Qwen35Moe => "qwen3_5_moe_text",
            Family::Mixtral => "mixtral",
            Family::Ministral3 => "ministral3",
            Family::DeepseekV2 => "deepseek_v2",
            Family::DeepseekV3 => "deepseek_v3",
            Family::Gemma2 => "gemma2",
            Family::Gemma3 => "gemma3_text",
            Family::Llama4 => "llama4_text",
            Family::Phi3 => "phi3",
            Family::Olmo2 => "olmo2",
            Family::Olmo3 => "olmo3",
            Family::Glm4Moe => "glm4_moe",
            Family::Glm4 => "glm4",
            Family::GptOss => "gpt_oss",
            Family::SmolLm3 => "smollm3",
            Family::Granite => "granite",
            Family::Falcon => "falcon",
            Family::GptNeox => "gpt_neox",
            Family::Starcoder2 => "starcoder2",
            Family::Cohere => "cohere",
            Family::Cohere2 => "cohere2",
            Family::SeedOss => "seed_oss",
            Family::Ernie45 => "ernie4_5",
            Family::MiniMaxM2 => "minimax_m2",
            Family::Exaone4 => "exaone4",
            Family::HunyuanDense => "hunyuan_v1_dense",
            Family::Arcee => "arcee",
            Family::Olmoe => "olmoe",
        }
    }

    /// Qwen3.5's gated DeltaNet: queries, keys and values, the output gate `z` and the
    /// gates `b` and `a` each from a projection of its own (Qwen3-Next's from two, reordered).
    pub fn split_in_proj(self) -> bool {
        matches!(self, Family::Qwen35 | Family::Qwen35Moe)
    }

    /// Every family, in the order `model_type` errors list them.
    pub const ALL: [Family; 37] = [
        Family::Gpt2,
        Family::Llama,
        Family::Mistral,
        Family::Ministral3,
        Family::Mixtral,
        Family::Qwen2,
        Family::Qwen2Moe,
        Family::Qwen3,
        Family::Qwen3Moe,
        Family::Qwen3Next,
        Family::Qwen35,
        Family::Qwen35Moe,
        Family::Gemma2,
        Family::Gemma3,
        Family::Llama4,
        Family::Phi3,
        Family::Olmo2,
        Family::Olmo3,
        Family::Olmoe,
        Family::Glm4Moe,
        Family::Glm4,
        Family::GptOss,
        Family::DeepseekV2,
        Family::DeepseekV3,
        Family::SmolLm3,
        Family::Granite,
        Family::Falcon,
        Family::GptNeox,
        Family::Starcoder2,
        Family::Cohere,
        Family::Cohere2,
        Family::SeedOss,
        Family::Ernie45,
        Family::MiniMaxM2,
        Family::Exaone4,
        Family::HunyuanDense,
        Family::Arcee,
    ];
}

/// MLP activation, as the implementation computes it (this decides what autograd saves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `F.silu` (saves its input).
    Silu,
    /// GPT-2's `gelu_new`: the tanh formula written out in Python ops, each saving tensors.
    GeluNew,
    /// `F.gelu` (exact or tanh approximation; one fused op saving its input).
    Gelu,
    /// `relu2`: `relu` (saving its output), then `square` (saving its input, the same
    /// tensor).
    Relu2,
}

/// How a norm computes (its parameters, and what it saves for backward).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    /// Llama's RMSNorm: fp32 statistics, cast back, then `weight * x`.
    Rms,
    /// Gemma's (and Qwen3-Next's) RMSNorm: `x * rsqrt(…) * (1 + weight)` in fp32, then cast.
    RmsOffset,
    /// OLMo 2's RMSNorm: `(weight * x_fp32).to(dtype)`.
    RmsWeightFirst,
    /// `nn.LayerNorm` with weight and bias.
    LayerNorm,
    /// Cohere's LayerNorm: mean-centred, in fp32, weight only.
    CohereLayerNorm,
}

/// Normalisation of queries and keys before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// One norm of `head_dim` applied to every head (Qwen3, Gemma 3, GLM-4.5+, Qwen3-Next).
    Head,
    /// The same, applied after RoPE (Hunyuan).
    HeadAfterRope,
    /// One norm over all heads' width (OLMo 2: `q_dim` and `kv_dim` weights).
    Full,
    /// Llama 4: a weightless L2 norm per head, on RoPE layers only.
    L2,
    /// Cohere's `use_qk_norm`: a LayerNorm with a weight per head and dimension.
    CohereHead,
}

/// Where a decoder layer's norms sit and how its two halves combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// `x + attn(norm(x))`, then `x + mlp(norm(x))`.
    Pre,
    /// Gemma: a norm before and after each half (four per layer).
    Sandwich,
    /// OLMo 2: `x + norm(attn(x))`, `x + norm(mlp(x))`.
    Post,
    /// Cohere, Falcon-7B: `x + attn(norm(x)) + mlp(norm(x))`, one norm.
    Parallel,
    /// GPT-NeoX, Falcon's new decoder: `x + attn(norm1(x)) + mlp(norm2(x))`.
    ParallelTwoNorms,
}

/// What a decoder layer's token mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AttnType {
    /// Causal attention over every earlier token.
    #[default]
    Full,
    /// Causal attention over the last `sliding_window` tokens.
    Sliding,
    /// Attention within chunks of `attention_chunk_size` tokens (Llama 4).
    Chunked,
    /// A linear-attention (gated DeltaNet) layer with a fixed-size state (Qwen3-Next).
    Linear,
}

impl AttnType {
    /// The one-letter code of a layer pattern (`layer_types` as a knob carries it).
    pub fn code(self) -> char {
        match self {
            AttnType::Full => 'f',
            AttnType::Sliding => 's',
            AttnType::Chunked => 'c',
            AttnType::Linear => 'l',
        }
    }

    /// The name `config.json`'s `layer_types` uses.
    pub fn hf_name(self) -> &'static str {
        match self {
            AttnType::Full => "full_attention",
            AttnType::Sliding => "sliding_attention",
            AttnType::Chunked => "chunked_attention",
            AttnType::Linear => "linear_attention",
        }
    }
}

/// What sets a decoder layer's ops apart from another's. Layers of one kind replay
/// identically, so the engine replays each kind once and composes runs of them in the
/// model's order ([`Architecture::runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct LayerKind {
    /// The MLP is a mixture of experts (otherwise dense, of width `intermediate`).
    pub moe: bool,
    /// The token mixer.
    pub attn: AttnType,
    /// No rotary embedding in this layer (NoPE).
    pub nope: bool,
}

/// Mixture-of-experts feed-forward.
#[derive(Clone, Debug, PartialEq)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    /// Width of each routed expert's MLP.
    pub expert_intermediate: u64,
    /// Always-active shared experts (DeepSeek), each of width `expert_intermediate`.
    pub shared_experts: u64,
    /// Width of the shared expert MLP when it is not `shared_experts × expert_intermediate`
    /// (Qwen2-MoE, Qwen3-Next, Llama 4); 0 otherwise.
    pub shared_intermediate: u64,
    /// The shared expert's output is scaled by `sigmoid(shared_expert_gate(x))` (Qwen).
    pub shared_gate: bool,
    /// Leading layers that keep a dense MLP of width `Architecture::intermediate`.
    pub first_dense_layers: u64,
    /// After them, which layers are MoE: cyclic over the layer index (empty: all).
    pub pattern: Vec<bool>,
    /// Layers that stay dense whatever the pattern says (Qwen's `mlp_only_layers`), sorted.
    pub dense_layers: Vec<u64>,
    /// A per-expert bias used only for routing (DeepSeek-V3's `e_score_correction_bias`): a
    /// buffer, not a parameter.
    pub router_bias: bool,
    /// The router is a linear layer with a bias parameter (gpt-oss).
    pub router_linear_bias: bool,
    /// The experts' projections have biases (gpt-oss).
    pub expert_bias: bool,
}

impl Moe {
    /// A mixture of `experts` experts of width `i`, `top_k` per token, in every layer.
    pub fn new(experts: u64, top_k: u64, i: u64) -> Moe {
        Moe {
            experts,
            top_k,
            expert_intermediate: i,
            shared_experts: 0,
            shared_intermediate: 0,
            shared_gate: false,
            first_dense_layers: 0,
            pattern: Vec::new(),
            dense_layers: Vec::new(),
            router_bias: false,
            router_linear_bias: false,
            expert_bias: false,
        }
    }

    /// The width of the shared expert MLP (0: none).
    pub fn shared_width(&self) -> u64 {
        if self.shared_intermediate > 0 {
            self.shared_intermediate
        } else {
            self.shared_experts * self.expert_intermediate
        }
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3).
#[derive(Clone, Debug, PartialEq)]
pub struct Mla {
    pub q_lora_rank: Option<u64>,
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
}

/// Qwen3-Next's gated DeltaNet (the linear-attention layers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinearAttn {
    pub key_heads: u64,
    pub value_heads: u64,
    pub key_dim: u64,
    pub value_dim: u64,
    pub conv_kernel: u64,
}

impl LinearAttn {
    /// Channels of the short convolution (queries, keys and values).
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }
}

/// How a published checkpoint stores its weights (`quantization_config`), which decides the
/// weights' bytes when it is loaded for inference on a GPU that runs the format natively.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// MXFP4 experts (gpt-oss): 4-bit values with one 8-bit scale per 32, i.e. 4.25 bits per
    /// expert weight; everything else in bf16.
    Mxfp4,
    /// Fine-grained fp8 (DeepSeek-V3, Kimi K2): every linear weight (experts included) as
    /// float8 with one fp32 scale per `block × block` tile; embeddings, norms, router and LM
    /// head in bf16.
    Fp8 { block: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    pub embd: f64,
    pub attn: f64,
    pub resid: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    pub family: Family,
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub intermediate: u64,
    pub vocab: u64,
    pub tied_embeddings: bool,
    /// Learned absolute position embeddings of this many positions (GPT-2).
    pub learned_positions: Option<u64>,
    pub qkv_bias: bool,
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub activation: Activation,
    pub dropout: Dropout,
    pub moe: Option<Moe>,
    pub mla: Option<Mla>,
    pub norm: Norm,
    pub qk_norm: QkNorm,
    pub block: Block,
    /// q, k and v come from one projection (`qkv_proj`, `query_key_value`).
    pub fused_qkv: bool,
    /// The MLP is gated (SwiGLU / GeGLU: gate, up and down projections).
    pub gated: bool,
    /// Gate and up come from one projection (`gate_up_proj`).
    pub fused_gate_up: bool,
    /// Dimensions of each head that RoPE rotates (0: no rotary embedding).
    pub rope_dim: u64,
    /// Tokens a sliding layer attends to (`sliding_window`).
    pub sliding_window: Option<u64>,
    /// Tokens per chunk of a chunked layer (`attention_chunk_size`).
    pub chunk: Option<u64>,
    /// Each layer's token mixer, cyclic over the layer index (empty: all full attention).
    pub layer_types: Vec<AttnType>,
    /// Layers without RoPE, cyclic over the layer index (empty: RoPE everywhere).
    pub nope: Vec<bool>,
    /// The attention output is gated by a sigmoid of a second half of `q_proj` (Qwen3-Next).
    pub attn_gate: bool,
    /// Learned attention sinks, one per head (gpt-oss).
    pub sinks: bool,
    /// Attention scores are softcapped with tanh (Gemma 2; eager attention only).
    pub attn_softcap: bool,
    /// Logits are softcapped with tanh (Gemma 2).
    pub final_softcap: bool,
    pub linear: Option<LinearAttn>,
    pub quant: Option<Quant>,
    /// Keys and values are broadcast to every query head before the cache and attention
    /// (Falcon's new decoder architecture).
    pub kv_expanded: bool,
    /// A multimodal wrapper's vision tower, loaded with the decoder (Gemma 3's SigLIP).
    pub vision: Option<Vision>,
}

/// Gemma 3's vision tower (transformers' `SiglipVisionModel`, from `vision_config`) and its
/// projector into the decoder's width. Text batches never run it: it is resident weights,
/// with no gradients and so no optimizer states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vision {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub channels: u64,
    pub patch: u64,
    pub image: u64,
    /// The attention-pooling head (`vision_use_head`, true unless the config says false).
    pub head: bool,
}

impl Vision {
    /// Position embeddings: one per patch of the image.
    pub fn patches(&self) -> u64 {
        (self.image / self.patch).pow(2)
    }
}

/// A weight matrix of a linear layer: `inp` × `out` (+ `out` bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    pub inp: u64,
    pub out: u64,
    pub bias: bool,
}

impl Linear {
    pub fn new(inp: u64, out: u64, bias: bool) -> Self {
        Linear { inp, out, bias }
    }
    pub fn params(&self) -> u64 {
        self.inp * self.out + if self.bias { self.out } else { 0 }
    }
}

/// Parameter counts by part of the model.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ParamCounts {
    pub embedding: u64,
    pub positions: u64,
    pub lm_head: u64,
    pub final_norm: u64,
    /// Sum over all decoder layers.
    pub layers: u64,
    /// Parameters in routed experts (all layers), included in `layers`.
    pub routed_experts: u64,
    /// Parameters touched per token (routed experts count `top_k` of `experts`).
    pub active: u64,
    /// The decoder's parameters: all of the above.
    pub total: u64,
    /// A multimodal wrapper's vision tower and projector, outside `total`.
    pub vision: u64,
}

use crate::hf::{MAX_DIM, MAX_EXPERTS, MAX_FFN, MAX_LAYERS, MAX_VOCAB};

/// Largest model accepted: beyond this a scenario is a typo, not a model.
const MAX_PARAMS: u64 = 100_000_000_000_000; // 10^14

/// The element of a cyclic pattern at `l` (`default` when the pattern is empty).
fn cyclic<T: Copy>(p: &[T], l: u64, default: T) -> T {
    if p.is_empty() {
        default
    } else {
        p[(l % p.len() as u64) as usize]
    }
}

impl Architecture {
    /// A Llama-like decoder of the given widths; every newer feature off.
    pub fn base(family: Family, hidden: u64, layers: u64, heads: u64, intermediate: u64) -> Self {
        Architecture {
            family,
            hidden,
            layers,
            heads,
            kv_heads: heads,
            head_dim: hidden.checked_div(heads).unwrap_or(0),
            intermediate,
            vocab: 0,
            tied_embeddings: false,
            learned_positions: None,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            activation: Activation::Silu,
            dropout: Dropout {
                embd: 0.0,
                attn: 0.0,
                resid: 0.0,
            },
            moe: None,
            mla: None,
            norm: Norm::Rms,
            qk_norm: QkNorm::None,
            block: Block::Pre,
            fused_qkv: false,
            gated: true,
            fused_gate_up: false,
            rope_dim: hidden.checked_div(heads).unwrap_or(0),
            sliding_window: None,
            chunk: None,
            layer_types: Vec::new(),
            nope: Vec::new(),
            attn_gate: false,
            sinks: false,
            attn_softcap: false,
            final_softcap: false,
            linear: None,
            quant: None,
            kv_expanded: false,
            vision: None,
        }
    }

    /// Check sizes and relations; `at` prefixes the field names in errors.
    pub fn validate(&self, at: &str) -> Result<()> {
        let f = |k: &str| format!("{at}{k}");
        let positive = |k: &str, v: u64, max: u64| -> Result<()> {
            if v == 0 {
                Err(Error::new(f(k), "must be at least 1"))
            } else if v > max {
                Err(Error::new(
                    f(k),
                    format!("{v} is larger than the limit {max}"),
                ))
            } else {
                Ok(())
            }
        };
        positive("hidden_size", self.hidden, MAX_DIM)?;
        positive("num_hidden_layers", self.layers, MAX_LAYERS)?;
        positive("num_attention_heads", self.heads, MAX_DIM)?;
        positive("num_key_value_heads", self.kv_heads, MAX_DIM)?;
        positive("head_dim", self.head_dim, MAX_DIM)?;
        positive("intermediate_size", self.intermediate, MAX_FFN)?;
        positive("vocab_size", self.vocab, MAX_VOCAB)?;
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(Error::new(
                f("num_key_value_heads"),
                format!(
                    "{} attention heads cannot be grouped over {} key/value heads (must divide)",
                    self.heads, self.kv_heads
                ),
            ));
        }
        if self.rope_dim > self.head_dim {
            return Err(Error::new(
                f("partial_rotary_factor"),
                "rotates more dimensions than a head has",
            ));
        }
        for (k, p) in [
            ("attn_pdrop", self.dropout.attn),
            ("resid_pdrop", self.dropout.resid),
            ("embd_pdrop", self.dropout.embd),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::new(
                    f(k),
                    format!("dropout {} must be in [0, 1)", crate::num::short(p)),
                ));
            }
        }
        for (k, w) in [
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.chunk),
        ] {
            if let Some(w) = w {
                positive(k, w, crate::hf::MAX_POSITIONS)?;
            }
        }
        let uses = |t: AttnType| (0..self.layers).any(|l| self.attn_type(l) == t);
        if uses(AttnType::Sliding) && self.sliding_window.is_none() {
            return Err(Error::new(
                f("sliding_window"),
                "is required by sliding_attention layers",
            ));
        }
        if uses(AttnType::Chunked) && self.chunk.is_none() {
            return Err(Error::new(
                f("attention_chunk_size"),
                "is required by chunked_attention layers",
            ));
        }
        if uses(AttnType::Linear) && self.linear.is_none() {
            return Err(Error::new(
                f("layer_types"),
                "linear_attention layers need a model type that has them (qwen3_next, qwen3_5_text, qwen3_5_moe_text)",
            ));
        }
        if let Some(m) = &self.moe {
            positive("num_local_experts", m.experts, MAX_EXPERTS)?;
            positive("num_experts_per_tok", m.top_k, m.experts)?;
            positive("moe_intermediate_size", m.expert_intermediate, MAX_FFN)?;
            if m.shared_experts > MAX_EXPERTS {
                return Err(Error::new(
                    f("n_shared_experts"),
                    "is larger than the limit",
                ));
            }
            if m.shared_intermediate > MAX_FFN {
                return Err(Error::new(
                    f("shared_expert_intermediate_size"),
                    "is larger than the limit",
                ));
            }
            if m.first_dense_layers > MAX_LAYERS {
                return Err(Error::new(
                    f("first_k_dense_replace"),
                    "is larger than the limit",
                ));
            }
        }
        if let Some(m) = &self.mla {
            positive("kv_lora_rank", m.kv_lora_rank, MAX_DIM)?;
            positive("qk_rope_head_dim", m.qk_rope_head_dim, MAX_DIM)?;
            positive("v_head_dim", m.v_head_dim, MAX_DIM)?;
            if let Some(q) = m.q_lora_rank {
                positive("q_lora_rank", q, MAX_DIM)?;
            }
            if m.qk_nope_head_dim > MAX_DIM {
                return Err(Error::new(
                    f("qk_nope_head_dim"),
                    "is larger than the limit",
                ));
            }
        }
        if let Some(x) = &self.linear {
            positive("linear_num_key_heads", x.key_heads, MAX_DIM)?;
            positive("linear_num_value_heads", x.value_heads, MAX_DIM)?;
            positive("linear_key_head_dim", x.key_dim, MAX_DIM)?;
            positive("linear_value_head_dim", x.value_dim, MAX_DIM)?;
            positive("linear_conv_kernel_dim", x.conv_kernel, MAX_DIM)?;
            if !x.value_heads.is_multiple_of(x.key_heads) {
                return Err(Error::new(
                    f("linear_num_value_heads"),
                    format!(
                        "{} value heads cannot be grouped over {} key heads (must divide)",
                        x.value_heads, x.key_heads
                    ),
                ));
            }
        }
        let total = self.checked_params().map(|c| c.total);
        match total {
            Some(t) if t <= MAX_PARAMS => Ok(()),
            Some(t) => Err(Error::new(
                at.trim_end_matches('.'),
                format!("{t} parameters is beyond the supported 10^14"),
            )),
            None => Err(Error::new(
                at.trim_end_matches('.'),
                "the parameter count overflows",
            )),
        }
    }

    /// Width of the attention's query/output projection (heads × head_dim).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// Width of each of the key and value projections.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Linear layers of an ordinary (full-attention) layer's attention, in execution order.
    pub fn attention_linears(&self) -> Vec<(&'static str, Linear)> {
        self.attention_linears_of(AttnType::Full)
    }

    /// Linear layers of the token mixer `t`, in execution order.
    pub fn attention_linears_of(&self, t: AttnType) -> Vec<(&'static str, Linear)> {
        let h = self.hidden;
        if let (AttnType::Linear, Some(x)) = (t, &self.linear) {
            let k = x.key_heads * x.key_dim;
            let v = x.value_heads * x.value_dim;
            let nv = x.value_heads;
            let out = ("out_proj", Linear::new(v, h, false));
            if self.family.split_in_proj() {
                return vec![
                    ("in_proj_qkv", Linear::new(h, 2 * k + v, false)),
                    ("in_proj_z", Linear::new(h, v, false)),
                    ("in_proj_b", Linear::new(h, nv, false)),
                    ("in_proj_a", Linear::new(h, nv, false)),
                    out,
                ];
            }
            return vec![
                ("in_proj_qkvz", Linear::new(h, 2 * k + 2 * v, false)),
                ("in_proj_ba", Linear::new(h, 2 * nv, false)),
                out,
            ];
        }
        if let Some(m) = &self.mla {
            let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
            let mut v = Vec::new();
            match m.q_lora_rank {
                Some(r) => {
                    v.push(("q_a_proj", Linear::new(h, r, self.qkv_bias)));
                    v.push(("q_b_proj", Linear::new(r, self.heads * qk, false)));
                }
                None => v.push(("q_proj", Linear::new(h, self.heads * qk, false))),
            }
            v.push((
                "kv_a_proj_with_mqa",
                Linear::new(h, m.kv_lora_rank + m.qk_rope_head_dim, self.qkv_bias),
            ));
            v.push((
                "kv_b_proj",
                Linear::new(
                    m.kv_lora_rank,
                    self.heads * (m.qk_nope_head_dim + m.v_head_dim),
                    false,
                ),
            ));
            v.push((
                "o_proj",
                Linear::new(self.heads * m.v_head_dim, h, self.o_bias),
            ));
            return v;
        }
        let q = if self.attn_gate {
            2 * self.q_dim()
        } else {
            self.q_dim()
        };
        match self.family {
            Family::Gpt2 => vec![
                ("c_attn", Linear::new(h, 3 * h, true)),
                ("c_proj", Linear::new(h, h, true)),
            ],
            Family::Falcon | Family::GptNeox => vec![
                (
                    "query_key_value",
                    Linear::new(h, q + 2 * self.kv_dim(), self.qkv_bias),
                ),
                ("dense", Linear::new(self.q_dim(), h, self.o_bias)),
            ],
            _ if self.fused_qkv => vec![
                (
                    "qkv_proj",
                    Linear::new(h, q + 2 * self.kv_dim(), self.qkv_bias),
                ),
                ("o_proj", Linear::new(self.q_dim(), h, self.o_bias)),
            ],
            _ => vec![
                ("q_proj", Linear::new(h, q, self.qkv_bias)),
                ("k_proj", Linear::new(h, self.kv_dim(), self.qkv_bias)),
                ("v_proj", Linear::new(h, self.kv_dim(), self.qkv_bias)),
                ("o_proj", Linear::new(self.q_dim(), h, self.o_bias)),
            ],
        }
    }

    /// Parameters of one norm of width `w`.
    pub(crate) fn norm_params(&self, w: u64) -> u64 {
        match self.norm {
            Norm::LayerNorm => 2 * w,
            _ => w,
        }
    }

    /// Linear layers of a dense MLP of width `i`.
    pub fn mlp_linears(&self, i: u64) -> Vec<(&'static str, Linear)> {
        let h = self.hidden;
        let b = self.mlp_bias;
        match self.family {
            Family::Gpt2 => vec![
                ("c_fc", Linear::new(h, i, true)),
                ("c_proj", Linear::new(i, h, true)),
            ],
            Family::Falcon | Family::GptNeox => vec![
                ("dense_h_to_4h", Linear::new(h, i, b)),
                ("dense_4h_to_h", Linear::new(i, h, b)),
            ],
            _ if !self.gated => vec![
                ("c_fc", Linear::new(h, i, b)),
                ("c_proj", Linear::new(i, h, b)),
            ],
            _ if self.fused_gate_up => vec![
                ("gate_up_proj", Linear::new(h, 2 * i, b)),
                ("down_proj", Linear::new(i, h, b)),
            ],
            _ => vec![
                ("gate_proj", Linear::new(h, i, b)),
                ("up_proj", Linear::new(h, i, b)),
                ("down_proj", Linear::new(i, h, b)),
            ],
        }
    }

    /// Width of a dense (non-MoE) layer's MLP.
    pub fn dense_intermediate(&self) -> u64 {
        self.intermediate
    }

    /// Whether the MLP is gated (SwiGLU: gate, up and down projections).
    pub fn gated_mlp(&self) -> bool {
        self.gated
    }

    /// Whether decoder layer `l` (0-based) has a mixture of experts.
    pub fn is_moe_layer(&self, l: u64) -> bool {
        self.moe.as_ref().is_some_and(|m| {
            l >= m.first_dense_layers && cyclic(&m.pattern, l, true) && !m.dense_layers.contains(&l)
        })
    }

    /// The token mixer of layer `l`.
    pub fn attn_type(&self, l: u64) -> AttnType {
        cyclic(&self.layer_types, l, AttnType::Full)
    }

    /// Whether layer `l` has no rotary embedding.
    pub fn is_nope(&self, l: u64) -> bool {
        self.rope_dim == 0 || cyclic(&self.nope, l, false)
    }

    /// The kind of decoder layer `l` (0-based): the one place that says how layers differ.
    pub fn layer_kind(&self, l: u64) -> LayerKind {
        let attn = self.attn_type(l);
        LayerKind {
            moe: self.is_moe_layer(l),
            attn,
            // A linear-attention layer has no RoPE to drop.
            nope: attn != AttnType::Linear && self.is_nope(l),
        }
    }

    /// Every layer is of one kind (no pattern tells layers apart): the common case, answered
    /// without walking the layers (the planner asks for the runs of every stage of every
    /// layout).
    fn uniform(&self) -> bool {
        self.layer_types.len() <= 1
            && self.nope.len() <= 1
            && self.moe.as_ref().is_none_or(|m| {
                m.first_dense_layers == 0 && m.pattern.len() <= 1 && m.dense_layers.is_empty()
            })
    }

    /// The distinct kinds of decoder layer, in the order they first appear.
    pub fn kinds(&self) -> Vec<LayerKind> {
        self.census().into_iter().map(|x| x.0).collect()
    }

    /// Each kind of decoder layer with how many layers are of it, in the order the kinds
    /// first appear (one pass over the layers; none when they are all of one kind).
    pub(crate) fn census(&self) -> Vec<(LayerKind, u64)> {
        if self.uniform() {
            return (0..self.layers.min(1))
                .map(|l| (self.layer_kind(l), self.layers))
                .collect();
        }
        let mut kinds: Vec<(LayerKind, u64)> = Vec::new();
        for l in 0..self.layers {
            let k = self.layer_kind(l);
            match kinds.iter_mut().find(|x| x.0 == k) {
                Some(x) => x.1 += 1,
                None => kinds.push((k, 1)),
            }
        }
        kinds
    }

    /// How many decoder layers are of a kind `f` accepts.
    pub(crate) fn layers_where(&self, f: fn(LayerKind) -> bool) -> u64 {
        self.census()
            .into_iter()
            .filter(|x| f(x.0))
            .map(|x| x.1)
            .sum()
    }

    /// Runs of consecutive layers of one kind over layers `lo..hi`, in order: (index into
    /// [`kinds`](Self::kinds), how many).
    pub fn runs(&self, lo: u64, hi: u64) -> Vec<(usize, u64)> {
        let hi = hi.min(self.layers);
        if self.uniform() {
            return if lo < hi { vec![(0, hi - lo)] } else { vec![] };
        }
        let kinds = self.kinds();
        let mut v: Vec<(usize, u64)> = Vec::new();
        for l in lo..hi {
            let k = self.layer_kind(l);
            let i = kinds.iter().position(|&x| x == k).unwrap_or(0);
            match v.last_mut() {
                Some((j, n)) if *j == i => *n += 1,
                _ => v.push((i, 1)),
            }
        }
        v
    }

    /// How many layers of each kind (indexed as [`kinds`](Self::kinds)) lie in `lo..hi`.
    pub fn kind_counts(&self, lo: u64, hi: u64) -> Vec<u64> {
        let mut c = vec![0; self.kinds().len()];
        for (i, n) in self.runs(lo, hi) {
            c[i] += n;
        }
        c
    }

    /// Parameters of one decoder layer: (total, routed experts, active per token), from its
    /// tensors ([`crate::params::layer`]); `None` on overflow.
    pub(crate) fn layer_params(&self, kind: LayerKind) -> Option<(u64, u64, u64)> {
        let (mut total, mut routed) = (0u64, 0u64);
        for t in crate::params::layer(self, kind) {
            let n = t.dim0.checked_mul(t.rest)?;
            total = total.checked_add(n)?;
            if t.expert {
                routed = routed.checked_add(n)?;
            }
        }
        let active = match &self.moe {
            Some(m) if routed > 0 => total - routed + routed / m.experts * m.top_k,
            _ => total,
        };
        Some((total, routed, active))
    }

    /// Exact parameter counts, or `None` on overflow.
    pub fn checked_params(&self) -> Option<ParamCounts> {
        let h = self.hidden;
        let embedding = self.vocab.checked_mul(h)?;
        let positions = self.learned_positions.unwrap_or(0).checked_mul(h)?;
        let lm_head = if self.tied_embeddings { 0 } else { embedding };
        let final_norm = self.norm_params(h);
        let (mut layers, mut routed_experts, mut active) = (0u64, 0u64, 0u64);
        for (kind, n) in self.census() {
            let (t, r, a) = self.layer_params(kind)?;
            layers = layers.checked_add(t.checked_mul(n)?)?;
            routed_experts = routed_experts.checked_add(r.checked_mul(n)?)?;
            active = active.checked_add(a.checked_mul(n)?)?;
        }
        let outside = embedding
            .checked_add(positions)?
            .checked_add(lm_head)?
            .checked_add(final_norm)?;
        let active = active.checked_add(outside)?;
        Some(ParamCounts {
            embedding,
            positions,
            lm_head,
            final_norm,
            layers,
            routed_experts,
            active,
            total: layers.checked_add(outside)?,
            vision: match &self.vision {
                Some(v) => crate::params::vision_params(v, h),
                None => 0,
            },
        })
    }

    pub fn params(&self) -> ParamCounts {
        self.checked_params()
            .expect("validated architectures do not overflow")
    }

    /// Elements of the keys and values one attention layer computes per token (what ring
    /// attention exchanges): every key/value head's keys and values; for MLA, the
    /// decompressed per-head keys (nope + rope) and values.
    pub fn kv_elems_per_token_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => {
                self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) + self.heads * m.v_head_dim
            }
            None => 2 * self.kv_dim(),
        }
    }

    /// Elements per token that transformers' default cache keeps for one attention layer:
    /// keys and values of every key/value head, or MLA's compressed latent and its RoPE key
    /// (`kv_lora_rank + qk_rope_head_dim`, viewed as one head).
    pub fn cache_elems_per_token_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => m.kv_lora_rank + m.qk_rope_head_dim,
            None if self.kv_expanded => 2 * self.q_dim(),
            None => 2 * self.kv_dim(),
        }
    }

    /// Tokens a layer of type `t` keeps in transformers' `DynamicCache` once `n` tokens have
    /// gone through it: all of them, or for sliding and chunked layers `window − 1` once `n`
    /// reaches the window (`DynamicSlidingWindowLayer.update` keeps
    /// `full_key_states[:, :, -window + 1:]`). Linear layers keep a fixed state (0 tokens).
    pub fn cached_tokens(&self, t: AttnType, n: f64) -> f64 {
        let window = match t {
            AttnType::Full => None,
            AttnType::Sliding => self.sliding_window,
            AttnType::Chunked => self.chunk,
            AttnType::Linear => return 0.0,
        };
        match window {
            Some(w) if n >= w as f64 => (w - 1) as f64,
            _ => n,
        }
    }

    /// Bytes of one linear-attention layer's fixed state for a batch of `batch` sequences:
    /// the convolution's last `conv_kernel` inputs in the compute dtype (`elem` bytes) and the
    /// recurrent state in fp32 (`torch_chunk_gated_delta_rule` computes in float32 and the
    /// cache keeps its final state).
    pub fn linear_state_bytes(&self, batch: f64, elem: f64) -> f64 {
        match &self.linear {
            Some(x) => {
                batch * x.conv_dim() as f64 * x.conv_kernel as f64 * elem
                    + batch * (x.value_heads * x.key_dim * x.value_dim) as f64 * 4.0
            }
            None => 0.0,
        }
    }

    /// Bytes of the weights as the published checkpoint stores them (`quantization_config`),
    /// the rest in a dtype of `elem` bytes; `None` when the checkpoint is not quantized.
    /// MXFP4: each routed expert's weight row as 4-bit values (16 bytes per 32) and one
    /// 8-bit scale per 32; fp8: every linear weight (experts included, LM head excluded) as
    /// one byte per value and an fp32 scale per `block × block` tile.
    pub fn checkpoint_weight_bytes(&self, elem: f64) -> Option<f64> {
        let q = self.quant?;
        let total = self.checked_params()?.total as f64;
        // (rows, inputs, copies) of every quantized matrix of a layer of kind `k`.
        let matrices = |k: LayerKind| -> Vec<(u64, u64, u64)> {
            let mut v = Vec::new();
            let experts = match (&self.moe, k.moe) {
                (Some(m), true) => {
                    let i = m.expert_intermediate;
                    let rows = if self.gated { 2 * i } else { i };
                    vec![(rows, self.hidden, m.experts), (self.hidden, i, m.experts)]
                }
                _ => Vec::new(),
            };
            match q {
                Quant::Mxfp4 => v.extend(experts),
                Quant::Fp8 { .. } => {
                    v.extend(experts);
                    for (_, l) in self.attention_linears_of(k.attn) {
                        v.push((l.out, l.inp, 1));
                    }
                    let mlp = match (&self.moe, k.moe) {
                        (Some(m), true) => m.shared_width(),
                        _ => self.dense_intermediate(),
                    };
                    if mlp > 0 {
                        for (_, l) in self.mlp_linears(mlp) {
                            v.push((l.out, l.inp, 1));
                        }
                    }
                }
            }
            v
        };
        let (mut elems, mut bytes) = (0.0, 0.0);
        for (k, n) in self
            .kinds()
            .into_iter()
            .zip(self.kind_counts(0, self.layers))
        {
            for (rows, inp, copies) in matrices(k) {
                let (r, i, c, n) = (rows as f64, inp as f64, copies as f64, n as f64);
                elems += n * c * r * i;
                bytes += n
                    * c
                    * match q {
                        Quant::Mxfp4 => r * (i / 32.0).ceil() * (16.0 + 1.0),
                        Quant::Fp8 { block } => {
                            let b = block as f64;
                            r * i + (r / b).ceil() * (i / b).ceil() * 4.0
                        }
                    };
            }
        }
        Some((total - elems) * elem + bytes)
    }

    /// Bytes of everything transformers' default cache holds after `n` tokens of a batch of
    /// `batch` sequences, the cached tensors in a dtype of `elem` bytes (tensor shapes, as
    /// the cache's layers report them).
    pub fn kv_cache_bytes(&self, batch: f64, n: f64, elem: f64) -> f64 {
        let per_token = self.cache_elems_per_token_layer() as f64 * elem * batch;
        (0..self.layers)
            .map(|l| match self.attn_type(l) {
                AttnType::Linear => self.linear_state_bytes(batch, elem),
                t => self.cached_tokens(t, n) * per_token,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use crate::presets;

    /// The shortcut for models whose layers are all of one kind gives what walking the
    /// layers gives, for every preset (uniform and patterned alike) and every range.
    #[test]
    fn kinds_and_runs_match_the_walk_over_the_layers() {
        use super::LayerKind;
        for p in presets::all() {
            let a = &p.arch;
            let mut kinds: Vec<LayerKind> = Vec::new();
            for l in 0..a.layers {
                let k = a.layer_kind(l);
                if !kinds.contains(&k) {
                    kinds.push(k);
                }
            }
            assert_eq!(a.kinds(), kinds, "{}", p.name);
            let n = a.layers;
            for (lo, hi) in [(0, n), (1, n), (0, n / 2), (n / 3, n + 5), (n, n), (3, 2)] {
                let mut runs: Vec<(usize, u64)> = Vec::new();
                for l in lo..hi.min(n) {
                    let i = kinds.iter().position(|&k| k == a.layer_kind(l)).unwrap();
                    match runs.last_mut() {
                        Some((j, c)) if *j == i => *c += 1,
                        _ => runs.push((i, 1)),
                    }
                }
                assert_eq!(a.runs(lo, hi), runs, "{} {lo}..{hi}", p.name);
            }
        }
    }

    /// Published and measured parameter counts (`sum(p.numel())` on the Hugging Face models).
    #[test]
    fn preset_parameter_counts() {
        let cases: &[(&str, u64)] = &[
            ("gpt2", 124_439_808),              // measured (tests/data)
            ("gpt2-medium", 354_823_168),       // HF model card / numel
            ("gpt2-large", 774_030_080),        // numel
            ("gpt2-xl", 1_557_611_200),         // numel
            ("llama3.2-1b", 1_235_814_400),     // measured (tests/data)
            ("llama3.2-3b", 3_212_749_824),     // measured (tests/data)
            ("llama2-7b", 6_738_415_616),       // Meta: 6.74B
            ("llama2-13b", 13_015_864_320),     // numel
            ("llama2-70b", 68_976_648_192),     // numel
            ("llama3.1-8b", 8_030_261_248),     // numel
            ("llama3.1-70b", 70_553_706_496),   // numel
            ("llama3.1-405b", 405_853_388_800), // numel
            ("mistral-7b", 7_241_732_096),      // numel
            ("mixtral-8x7b", 46_702_792_704),   // numel
            ("qwen2.5-0.5b", 494_032_768),      // measured (tests/data)
            ("qwen2.5-7b", 7_615_616_512),      // Qwen model card: 7.61B
            ("qwen2.5-72b", 72_706_203_648),    // Qwen model card: 72.7B
            ("deepseek-v3", 671_026_404_352),   // transformers 5.17 numel (tests/data/models)
        ];
        for (name, want) in cases {
            let a = presets::find(name).unwrap().arch;
            assert_eq!(a.params().total, *want, "{name}");
        }
    }
}
