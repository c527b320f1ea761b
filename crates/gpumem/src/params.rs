//! The model's parameter tensors with their shapes, as transformers creates them, and what
//! one GPU holds of each once tensor, expert and data parallelism have split them.
//!
//! Shapes matter beyond their element counts: FSDP2 shards every parameter along its first
//! dimension and pads that dimension to a multiple of the shard group (eight stacked experts
//! over 64 ranks leave each rank a whole expert), and tensor parallelism splits some
//! tensors along their rows and others along their columns.

use crate::arch::{Architecture, AttnType, Block, Family, LayerKind, Norm, QkNorm, Vision};

/// How tensor parallelism divides a tensor (torchtitan's plan on the Hugging Face modules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Along the first dimension: column-parallel weights (q/k/v, gate/up, the LM head), the
    /// vocabulary of the embedding, column-parallel biases.
    Dim0,
    /// Along the second: row-parallel weights (o_proj, down_proj).
    Dim1,
    /// Replicated: norms, row-parallel biases, routers.
    Whole,
}

/// One parameter tensor: `dim0 × rest` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PTensor {
    pub dim0: u64,
    /// The product of the other dimensions (1 for a vector).
    pub rest: u64,
    pub tp: Split,
    /// A routed experts' stacked weight (`[experts, …]`): expert parallelism divides dim 0.
    pub expert: bool,
}

impl PTensor {
    fn new(dim0: u64, rest: u64, tp: Split) -> Self {
        PTensor {
            dim0,
            rest,
            tp,
            expert: false,
        }
    }

    pub fn numel(&self) -> u64 {
        self.dim0 * self.rest
    }

    /// What one rank of a `tp`-way tensor-parallel, `ep`-way expert-parallel group holds.
    /// Splits round up (an uneven split leaves the first ranks the larger share).
    pub fn local(&self, tp: u64, ep: u64) -> PTensor {
        let mut t = *self;
        if t.expert {
            t.dim0 = t.dim0.div_ceil(ep);
            // Experts under tensor parallelism split their intermediate size (dim 1).
            t.rest = t.rest.div_ceil(tp);
            return t;
        }
        match t.tp {
            Split::Dim0 => t.dim0 = t.dim0.div_ceil(tp),
            Split::Dim1 => t.rest = t.rest.div_ceil(tp),
            Split::Whole => {}
        }
        t
    }

    /// The ranks FSDP shards this tensor over, of `n` data-parallel ranks and `ep`
    /// expert-parallel ones (see [`shard_numel`]).
    pub fn shard_ranks(&self, n: u64, ep: u64) -> u64 {
        if self.expert {
            n
        } else {
            n * ep
        }
    }

    /// Elements of one rank's FSDP2 shard over `n` ranks: dim 0 padded to a multiple of `n`.
    pub fn shard(&self, n: u64) -> u64 {
        self.dim0.div_ceil(n) * self.rest
    }
}

/// The tensors of one decoder layer of kind `kind`.
pub fn layer(a: &Architecture, kind: LayerKind) -> Vec<PTensor> {
    let mut v = Vec::with_capacity(16);
    let h = a.hidden;
    let norm = |v: &mut Vec<PTensor>, w: u64| {
        v.push(PTensor::new(w, 1, Split::Whole));
        if a.norm == Norm::LayerNorm {
            v.push(PTensor::new(w, 1, Split::Whole));
        }
    };
    // Linear layers: nn.Linear's weight is [out, in]; GPT-2's Conv1D is [in, out].
    let linear = |v: &mut Vec<PTensor>, name: &str, l: crate::arch::Linear, colwise: bool| {
        let (split, bias_split) = if colwise {
            (Split::Dim0, Split::Dim0)
        } else {
            (Split::Dim1, Split::Whole)
        };
        if a.family == Family::Gpt2 {
            let split = match split {
                Split::Dim0 => Split::Dim1,
                _ => Split::Dim0,
            };
            v.push(PTensor::new(l.inp, l.out, split));
        } else if name.ends_with("_a_proj") || name == "kv_a_proj_with_mqa" {
            // MLA's down-projections stay whole on every tensor-parallel rank.
            v.push(PTensor::new(l.out, l.inp, Split::Whole));
        } else {
            v.push(PTensor::new(l.out, l.inp, split));
        }
        if l.bias {
            v.push(PTensor::new(l.out, 1, bias_split));
        }
    };
    let rowwise = |name: &str| {
        matches!(
            name,
            "o_proj" | "c_proj" | "dense" | "down_proj" | "dense_4h_to_h" | "out_proj"
        )
    };
    // The norms in front of the token mixer.
    match a.block {
        Block::Pre | Block::Sandwich | Block::Parallel => norm(&mut v, h),
        Block::ParallelTwoNorms => {
            norm(&mut v, h);
            norm(&mut v, h);
        }
        Block::Post => {}
    }
    for (name, l) in a.attention_linears_of(kind.attn) {
        linear(&mut v, name, l, !rowwise(name));
        if name == "q_a_proj" {
            norm(&mut v, l.out);
        }
        if name == "kv_a_proj_with_mqa" {
            if let Some(m) = &a.mla {
                norm(&mut v, m.kv_lora_rank);
            }
        }
    }
    match (kind.attn, &a.linear) {
        (AttnType::Linear, Some(x)) => {
            // Depthwise conv1d [conv_dim, 1, kernel], dt_bias and A_log per value head, the
            // gated RMSNorm over a value head.
            v.push(PTensor::new(x.conv_dim(), x.conv_kernel, Split::Whole));
            v.push(PTensor::new(x.value_heads, 1, Split::Whole));
            v.push(PTensor::new(x.value_heads, 1, Split::Whole));
            v.push(PTensor::new(x.value_dim, 1, Split::Whole));
        }
        _ => {
            match a.qk_norm {
                QkNorm::Head | QkNorm::HeadAfterRope => {
                    norm(&mut v, a.head_dim);
                    norm(&mut v, a.head_dim);
                }
                QkNorm::Full => {
                    norm(&mut v, a.q_dim());
                    norm(&mut v, a.kv_dim());
                }
                QkNorm::CohereHead => {
                    v.push(PTensor::new(a.heads, a.head_dim, Split::Dim0));
                    v.push(PTensor::new(a.kv_heads, a.head_dim, Split::Dim0));
                }
                QkNorm::None | QkNorm::L2 => {}
            }
            if a.sinks {
                v.push(PTensor::new(a.heads, 1, Split::Dim0));
            }
        }
    }
    // The norms between the token mixer and the MLP, and after the MLP.
    match a.block {
        Block::Pre => norm(&mut v, h),
        Block::Sandwich => {
            norm(&mut v, h);
            norm(&mut v, h);
            norm(&mut v, h);
        }
        Block::Post => {
            norm(&mut v, h);
            norm(&mut v, h);
        }
        Block::Parallel | Block::ParallelTwoNorms => {}
    }
    match (&a.moe, kind.moe) {
        (Some(m), true) => {
            let i = m.expert_intermediate;
            // transformers 5 stacks the routed experts: gate_up_proj [E, 2I, H] and
            // down_proj [E, H, I] (gpt-oss and Llama 4 store them transposed).
            let per = if a.gated_mlp() { 2 * i } else { i };
            let expert = |dim0: u64, rest: u64| PTensor {
                expert: true,
                ..PTensor::new(dim0, rest, Split::Whole)
            };
            v.push(expert(m.experts, per * h));
            if m.expert_bias {
                v.push(expert(m.experts, per));
            }
            v.push(expert(m.experts, h * i));
            if m.expert_bias {
                v.push(expert(m.experts, h));
            }
            // The router's weight (and bias). DeepSeek-V3's routing bias
            // (`e_score_correction_bias`) is a buffer, not a parameter: no gradient, no
            // optimizer state.
            v.push(PTensor::new(m.experts, h, Split::Whole));
            if m.router_linear_bias {
                v.push(PTensor::new(m.experts, 1, Split::Whole));
            }
            let s = m.shared_width();
            if s > 0 {
                for (name, l) in a.mlp_linears(s) {
                    linear(&mut v, name, l, !rowwise(name));
                }
            }
            if m.shared_gate {
                v.push(PTensor::new(1, h, Split::Whole));
            }
        }
        _ => {
            for (name, l) in a.mlp_linears(a.dense_intermediate()) {
                linear(&mut v, name, l, !rowwise(name));
            }
        }
    }
    v
}

/// The embedding (and GPT-2's learned positions).
pub fn embedding(a: &Architecture) -> Vec<PTensor> {
    let mut v = vec![PTensor::new(a.vocab, a.hidden, Split::Dim0)];
    if let Some(n) = a.learned_positions {
        v.push(PTensor::new(n, a.hidden, Split::Whole));
    }
    v
}

/// The final norm and the LM head (none when tied to the embedding).
pub fn head(a: &Architecture) -> Vec<PTensor> {
    let mut v = vec![PTensor::new(a.hidden, 1, Split::Whole)];
    if a.norm == Norm::LayerNorm {
        v.push(PTensor::new(a.hidden, 1, Split::Whole));
    }
    if !a.tied_embeddings {
        v.push(PTensor::new(a.vocab, a.hidden, Split::Dim0));
    }
    v
}

/// A vision tower's parameters in the order transformers creates them (`SiglipVisionModel`,
/// then Gemma 3's projector into the decoder's width `text`): those before its layers, one
/// layer's, and those after. The position ids, an int64 buffer of [`Vision::patches`]
/// elements, are created after the position embedding (the third tensor).
pub fn vision_parts(v: &Vision, text: u64) -> [Vec<PTensor>; 3] {
    let (h, i) = (v.hidden, v.intermediate);
    let w = |d0: u64, r: u64| PTensor::new(d0, r, Split::Whole);
    let vec = |n: u64| w(n, 1);
    let mlp = [w(i, h), vec(i), w(h, i), vec(h)];
    let before = vec![
        w(h, v.channels * v.patch * v.patch),
        vec(h),
        w(v.patches(), h),
    ];
    // layer_norm1, the k/v/q/out projections with biases, layer_norm2, the MLP.
    let mut layer = vec![vec(h), vec(h)];
    for _ in 0..4 {
        layer.extend([w(h, h), vec(h)]);
    }
    layer.extend([vec(h), vec(h)]);
    layer.extend(mlp);
    let mut after = vec![vec(h), vec(h)];
    if v.head {
        // The probe, the attention's in/out projections, its layer norm and MLP.
        after.extend([
            vec(h),
            w(3 * h, h),
            vec(3 * h),
            w(h, h),
            vec(h),
            vec(h),
            vec(h),
        ]);
        after.extend(mlp);
    }
    after.extend([w(h, text), vec(h)]);
    [before, layer, after]
}

/// The vision tower's parameters ([`vision_parts`] added up). The parser's bounds (hidden
/// ≤ 2^16, intermediate ≤ 2^20, layers ≤ 1,024, channels ≤ 64, patch ≤ 1,024, image ≤ 2^16
/// pixels, the decoder's width ≤ 2^24) keep every term below 2^50.
pub fn vision_params(v: &Vision, text: u64) -> u64 {
    vision_shard(v, text, 1)
}

/// Elements of one rank's FSDP2 shard of the vision tower over `n` ranks ([`vision_parts`],
/// each tensor's dim 0 padded to a multiple of `n`); the whole tower for `n` = 1.
pub fn vision_shard(v: &Vision, text: u64, n: u64) -> u64 {
    let c = |d: u64| d.div_ceil(n.max(1));
    let (h, i) = (v.hidden, v.intermediate);
    let ch = c(h);
    let mlp = c(i) * h + c(i) + ch * i + ch;
    // Two layer norms and four projections with biases, the MLP.
    let layer = 4 * ch * h + 8 * ch + mlp;
    // The probe, the attention's in/out projections, its layer norm and MLP.
    let head = if v.head {
        ch + c(3 * h) * h + c(3 * h) + ch * h + 3 * ch + mlp
    } else {
        0
    };
    ch * v.channels * v.patch * v.patch
        + ch
        + c(v.patches()) * h
        + v.layers * layer
        + 2 * ch
        + head
        + ch * text
        + ch
}

/// Elements of a list of tensors as one rank holds them.
pub fn local_numel(ts: &[PTensor], tp: u64, ep: u64) -> u64 {
    ts.iter().map(|t| t.local(tp, ep).numel()).sum()
}

/// Elements of one rank's FSDP2 shard of a list of (locally split) tensors, padding
/// included: routed experts are sharded over the `n` data-parallel ranks holding the same
/// experts, every other tensor over those and the `ep` expert-parallel ranks too (which run
/// different tokens through the same dense weights).
pub fn shard_numel(ts: &[PTensor], tp: u64, ep: u64, n: u64) -> u64 {
    ts.iter()
        .map(|t| t.local(tp, ep).shard(t.shard_ranks(n, ep)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensors add up to the exact parameter count of every preset.
    #[test]
    fn tensors_add_up_to_the_parameter_count() {
        for p in crate::presets::all() {
            let a = &p.arch;
            let layers: u64 = a
                .kinds()
                .into_iter()
                .zip(a.kind_counts(0, a.layers))
                .map(|(k, n)| n * local_numel(&layer(a, k), 1, 1))
                .sum();
            let n = local_numel(&embedding(a), 1, 1) + local_numel(&head(a), 1, 1) + layers;
            assert_eq!(n, a.params().total, "{}", p.name);
        }
    }

    /// The vision tower's count is its tensors added up, with and without the pooling head.
    #[test]
    fn the_vision_count_adds_up_its_tensors() {
        for head in [false, true] {
            let v = Vision {
                hidden: 1152,
                intermediate: 4304,
                layers: 3,
                channels: 3,
                patch: 14,
                image: 896,
                head,
            };
            let [b, l, a] = vision_parts(&v, 3840);
            let sum = |ts: &[PTensor]| ts.iter().map(|t| t.numel()).sum::<u64>();
            let want = sum(&b) + 3 * sum(&l) + sum(&a);
            assert_eq!(vision_params(&v, 3840), want);
            // One rank's FSDP2 shard: dim 0 padded, tensor by tensor.
            for n in [2, 3, 7, 8, 64, 5000] {
                let shard = |ts: &[PTensor]| shard_numel(ts, 1, 1, n);
                let want = shard(&b) + 3 * shard(&l) + shard(&a);
                assert_eq!(vision_shard(&v, 3840, n), want, "{n} ranks");
            }
        }
        // At the parser's bounds, within u64 (debug builds would panic on overflow).
        let most = Vision {
            hidden: 1 << 16,
            intermediate: 1 << 20,
            layers: 1024,
            channels: 64,
            patch: 1024,
            image: 1 << 16,
            head: true,
        };
        assert!(vision_params(&most, 1 << 24) < 1 << 51);
    }

    #[test]
    fn fsdp2_pads_the_first_dimension() {
        let experts = PTensor {
            expert: true,
            ..PTensor::new(8, 100, Split::Whole)
        };
        // Eight experts over 64 ranks: each rank holds one expert's worth.
        assert_eq!(experts.shard(64), 100);
        assert_eq!(experts.shard(8), 100);
        assert_eq!(experts.shard(4), 200);
        assert_eq!(PTensor::new(50257, 768, Split::Dim0).shard(8), 6283 * 768);
    }

    #[test]
    fn tensor_parallel_splits_rows_or_columns() {
        let a = crate::presets::find("llama3.1-8b").unwrap().arch;
        let full = local_numel(&layer(&a, LayerKind::default()), 1, 1);
        let tp8 = local_numel(&layer(&a, LayerKind::default()), 8, 1);
        // Everything but the two norms is split.
        assert_eq!(tp8, (full - 2 * 4096) / 8 + 2 * 4096);
    }
}
