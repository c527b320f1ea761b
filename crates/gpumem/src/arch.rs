//! Decoder-only transformer architectures and their exact parameter counts.
//!
//! The counts follow the Hugging Face `transformers` modules parameter for parameter, so that
//! they equal PyTorch's `sum(p.numel() for p in model.parameters())` (tied weights once).

use crate::error::{Error, Result};

/// Which implementation a model follows: decides biases, norms, the MLP and the op sequence
/// whose saved tensors the engine replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// GPT-2: learned positions, LayerNorm, fused qkv `Conv1D`, GELU (tanh) MLP, dropout.
    Gpt2,
    /// Llama, Mistral, Qwen2 (q/k/v bias): RMSNorm, RoPE, separate q/k/v, SwiGLU.
    Llama,
    /// Mixtral: the Llama attention with a top-k routed mixture of SwiGLU experts.
    Mixtral,
    /// DeepSeek-V3: multi-head latent attention, shared + routed experts, dense first layers.
    DeepseekV3,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
            Family::Mixtral => "mixtral",
            Family::DeepseekV3 => "deepseek_v3",
        }
    }
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
}

/// What sets a decoder layer's ops apart from another's. Layers of one kind replay
/// identically, so the engine replays each kind once and composes runs of them in the
/// model's order ([`Architecture::runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct LayerKind {
    /// The MLP is a mixture of experts (otherwise dense, of width `intermediate`).
    pub moe: bool,
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
    /// Leading layers that keep a dense MLP of width `Architecture::intermediate`.
    pub first_dense_layers: u64,
    /// A per-expert bias used only for routing (DeepSeek-V3's `e_score_correction_bias`): an
    /// fp32 buffer, not a parameter.
    pub router_bias: bool,
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
    pub total: u64,
}

use crate::hf::{MAX_DIM, MAX_EXPERTS, MAX_FFN, MAX_LAYERS, MAX_VOCAB};

/// Largest model accepted: beyond this a scenario is a typo, not a model.
const MAX_PARAMS: u64 = 100_000_000_000_000; // 10^14

impl Architecture {
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
            if m.first_dense_layers > self.layers {
                return Err(Error::new(
                    f("first_k_dense_replace"),
                    "is larger than the number of layers",
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

    /// Linear layers of one decoder layer's attention, in execution order.
    pub fn attention_linears(&self) -> Vec<(&'static str, Linear)> {
        let h = self.hidden;
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
        match self.family {
            Family::Gpt2 => vec![
                ("c_attn", Linear::new(h, 3 * h, true)),
                ("c_proj", Linear::new(h, h, true)),
            ],
            _ => vec![
                ("q_proj", Linear::new(h, self.q_dim(), self.qkv_bias)),
                ("k_proj", Linear::new(h, self.kv_dim(), self.qkv_bias)),
                ("v_proj", Linear::new(h, self.kv_dim(), self.qkv_bias)),
                ("o_proj", Linear::new(self.q_dim(), h, self.o_bias)),
            ],
        }
    }

    /// Parameters of the attention's norms inside the attention (MLA's latent norms).
    fn attention_norm_params(&self) -> u64 {
        match &self.mla {
            Some(m) => m.q_lora_rank.unwrap_or(0) + m.kv_lora_rank,
            None => 0,
        }
    }

    /// Parameters of one norm of width `w`.
    fn norm_params(&self, w: u64) -> u64 {
        match self.family {
            Family::Gpt2 => 2 * w, // LayerNorm: weight + bias
            _ => w,                // RMSNorm: weight
        }
    }

    /// Linear layers of a dense MLP of width `i`.
    pub fn mlp_linears(&self, i: u64) -> Vec<(&'static str, Linear)> {
        let h = self.hidden;
        match self.family {
            Family::Gpt2 => vec![
                ("c_fc", Linear::new(h, i, true)),
                ("c_proj", Linear::new(i, h, true)),
            ],
            _ => vec![
                ("gate_proj", Linear::new(h, i, self.mlp_bias)),
                ("up_proj", Linear::new(h, i, self.mlp_bias)),
                ("down_proj", Linear::new(i, h, self.mlp_bias)),
            ],
        }
    }

    /// Whether the MLP is gated (SwiGLU: gate, up and down projections).
    pub fn gated_mlp(&self) -> bool {
        self.family != Family::Gpt2
    }

    /// Whether decoder layer `l` (0-based) has a mixture of experts.
    pub fn is_moe_layer(&self, l: u64) -> bool {
        self.moe.as_ref().is_some_and(|m| l >= m.first_dense_layers)
    }

    /// The kind of decoder layer `l` (0-based): the one place that says how layers differ.
    pub fn layer_kind(&self, l: u64) -> LayerKind {
        LayerKind {
            moe: self.is_moe_layer(l),
        }
    }

    /// The distinct kinds of decoder layer, in the order they first appear.
    pub fn kinds(&self) -> Vec<LayerKind> {
        let mut v: Vec<LayerKind> = Vec::new();
        for l in 0..self.layers {
            let k = self.layer_kind(l);
            if !v.contains(&k) {
                v.push(k);
            }
        }
        v
    }

    /// Runs of consecutive layers of one kind over layers `lo..hi`, in order: (index into
    /// [`kinds`](Self::kinds), how many).
    pub fn runs(&self, lo: u64, hi: u64) -> Vec<(usize, u64)> {
        let kinds = self.kinds();
        let mut v: Vec<(usize, u64)> = Vec::new();
        for l in lo..hi.min(self.layers) {
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

    /// Parameters of one decoder layer: (total, routed experts, active per token).
    pub(crate) fn layer_params(&self, kind: LayerKind) -> Option<(u64, u64, u64)> {
        let moe_layer = kind.moe;
        let mut total = 0u64;
        for (_, l) in self.attention_linears() {
            total = total.checked_add(l.params())?;
        }
        total = total.checked_add(self.attention_norm_params())?;
        total = total.checked_add(2 * self.norm_params(self.hidden))?;
        let mut routed = 0u64;
        let mut active = total;
        match (&self.moe, moe_layer) {
            (Some(m), true) => {
                let one: u64 = self
                    .mlp_linears(m.expert_intermediate)
                    .iter()
                    .map(|(_, l)| l.params())
                    .sum();
                routed = one.checked_mul(m.experts)?;
                let shared = one.checked_mul(m.shared_experts)?;
                // The router's weight. DeepSeek-V3's routing bias (`e_score_correction_bias`)
                // is a buffer in transformers, not a parameter.
                let router = self.hidden.checked_mul(m.experts)?;
                total = total
                    .checked_add(routed)?
                    .checked_add(shared)?
                    .checked_add(router)?;
                active = active
                    .checked_add(one.checked_mul(m.top_k)?)?
                    .checked_add(shared)?
                    .checked_add(router)?;
            }
            _ => {
                let mlp: u64 = self
                    .mlp_linears(self.intermediate)
                    .iter()
                    .map(|(_, l)| l.params())
                    .sum();
                total = total.checked_add(mlp)?;
                active = active.checked_add(mlp)?;
            }
        }
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
        // Each kind of layer and how many there are, in one pass.
        let mut kinds: Vec<(LayerKind, u64)> = Vec::new();
        for l in 0..self.layers {
            let k = self.layer_kind(l);
            match kinds.iter_mut().find(|x| x.0 == k) {
                Some(x) => x.1 += 1,
                None => kinds.push((k, 1)),
            }
        }
        for (kind, n) in kinds {
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
        })
    }

    pub fn params(&self) -> ParamCounts {
        self.checked_params()
            .expect("validated architectures do not overflow")
    }

    /// Bytes of KV cache per token per layer per element size, as Hugging Face's `DynamicCache`
    /// stores it: keys and values of every key/value head. For MLA, transformers stores the
    /// decompressed per-head keys (nope + rope) and values.
    pub fn kv_elems_per_token_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => {
                self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) + self.heads * m.v_head_dim
            }
            None => 2 * self.kv_dim(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::presets;

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
