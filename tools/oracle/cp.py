"""Context parallelism for the oracle: torch.distributed.tensor.experimental.context_parallel
(ring attention over SDPA) around a Hugging Face causal LM, as torchtitan uses it.

What runs is PyTorch's own CP code: `context_parallel(mesh, buffers=[ids, labels, positions])`
shards the buffers in place along the sequence (head/tail load balancing by default), swaps
`torch.nn.functional.scaled_dot_product_attention` for a wrapper that turns q/k/v into DTensors
sharded on the sequence, and DTensor dispatches the SDPA op to CP's ring-attention handlers
(`_templated_ring_attention` / `_templated_ring_attention_backward`: K/V rotation through an
all-gather (default) or all-to-all, fp32 merge of partial outputs and log-sum-exps, fp32 dQ/dK/dV
accumulators, dK/dV rotated back with all-to-all).

One thing must be bent on a CPU: CP only has handlers for the CUDA SDPA ops
(`_scaled_dot_product_flash_attention`, `_efficient_attention`, `_cudnn_attention` and their
backwards). On a CPU, SDPA picks `_scaled_dot_product_flash_attention_for_cpu`, which CP does
not handle (`NotImplementedError: ... has no sharding strategy` / no CP handler), so CP cannot
run on a CPU as is. Under FakeTensorMode nothing is computed and the CUDA flash op's meta kernel
works on CPU fake tensors, so inside the CP region the oracle calls
`aten._scaled_dot_product_flash_attention` directly (what SDPA picks on an H100 for bf16, causal,
no mask, GQA included): the ring then runs CP's own code with the CUDA op's outputs (out, fp32
logsumexp, philox seed/offset), as on a GPU.
"""
import contextlib

import torch
import torch.nn.functional as F


def _sdpa_cuda_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                     scale=None, enable_gqa=False):
    """SDPA as the CUDA dispatcher runs it for bf16/fp16 causal attention without a mask:
    the flash kernel (which takes grouped K/V heads natively)."""
    if attn_mask is not None:
        raise NotImplementedError("cp: only mask-free (causal) attention is supported")
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, dropout_p, is_causal, False, scale=scale)[0]


_sdpa_cuda_flash.__name__ = "scaled_dot_product_attention"


class CPContext:
    def __init__(self, mesh, rotate="allgather", load_balance=True, sdpa="cuda-flash"):
        from torch.distributed.tensor.experimental import _attention as att
        self.mesh = mesh
        self.att = att
        att.set_rotate_method(rotate)
        att._cp_options.enable_load_balance = bool(load_balance)
        self.sdpa = sdpa

    @contextlib.contextmanager
    def region(self, ids):
        """Enter CP for one step: full-sequence ids, labels (shifted before sharding, as
        torchtitan does) and positions are made fresh and handed to context_parallel(), which
        shards them in place; yields (ids, labels, position_ids), each this rank's shard."""
        from torch.distributed.tensor.experimental import context_parallel
        labels = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:].contiguous()
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(
            ids.shape[0], -1).contiguous()
        bufs = [ids.clone(), labels, pos]
        orig = F.scaled_dot_product_attention
        if self.sdpa == "cuda-flash":
            F.scaled_dot_product_attention = _sdpa_cuda_flash
        try:
            with context_parallel(self.mesh, buffers=bufs, buffer_seq_dims=[1, 1, 1],
                                  no_restore_buffers=set(bufs)):
                yield bufs
        finally:
            F.scaled_dot_product_attention = orig

    @staticmethod
    def loss(logits, labels, vocab_size):
        """HF's causal-LM loss on the local sequence shard, labels already shifted."""
        from transformers.loss.loss_utils import ForCausalLMLoss
        return ForCausalLMLoss(logits, None, vocab_size=vocab_size, shift_labels=labels)
