"""Pipeline parallelism for the oracle: a Hugging Face causal LM split into stages and run with
torch.distributed.pipelining (PipelineStage + Schedule1F1B / ScheduleGPipe /
ScheduleInterleaved1F1B), one process being the rank that runs the chosen stage(s).

The split follows torchtitan / HF's own `apply_pipeline_parallelism`: the decoder layers are cut
into `num_stages` contiguous groups (even split; the last stage takes any remainder, as HF does);
the embedding lives on the first stage, the final norm and lm_head on the last. The HF loss
(`ForCausalLMLoss`: fp32 upcast + cross-entropy) is the schedule's `loss_fn`.

Every PipelineStage is given explicit `input_args`/`output_args` (meta tensors), so no shape
inference needs a real peer; the fake process group makes every send/recv a no-op, but the
stage allocates its receive buffers (one per micro-batch, kept across steps) as a real rank does.
"""
import torch
from torch import nn


class HFStage(nn.Module):
    """One pipeline stage of an HF *ForCausalLM (llama / qwen2 / mistral / mixtral layout):
    [embed_tokens] -> layers[a:b] -> [norm -> lm_head]. It re-creates what the HF base model's
    forward does around the layers (position ids, causal mask (None for sdpa without padding),
    rotary embeddings) so the decoder layers run exactly the HF code."""

    def __init__(self, lm, layer_ids, first, last):
        super().__init__()
        base = lm.model
        self.config = lm.config
        self.is_first, self.is_last = first, last
        self.layer_ids = list(layer_ids)
        self.embed_tokens = base.embed_tokens if first else None
        self.layers = nn.ModuleDict({str(i): base.layers[i] for i in layer_ids})
        self.norm = base.norm if last else None
        self.lm_head = lm.lm_head if last else None
        self.rotary_emb = base.rotary_emb

    def forward(self, x):
        from transformers.masking_utils import (create_causal_mask,
                                                create_sliding_window_causal_mask)
        h = self.embed_tokens(x) if self.is_first else x
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        mk = dict(config=self.config, inputs_embeds=h, attention_mask=None,
                  past_key_values=None, position_ids=pos)
        types = getattr(self.config, "layer_types", None)
        masks = {"full_attention": create_causal_mask(**mk)}
        if types and "sliding_attention" in types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**mk)
        pe = self.rotary_emb(h, pos)
        for i, layer in self.layers.items():
            kind = types[int(i)] if types else "full_attention"
            h = layer(h, attention_mask=masks[kind], position_embeddings=pe, position_ids=pos,
                      past_key_values=None, use_cache=False)
        if self.is_last:
            h = self.lm_head(self.norm(h))
        return h


def layer_split(n_layers, n_stages):
    """[start, end) of each stage: even split, remainder on the last stage (HF's rule)."""
    per = n_layers // n_stages
    if per == 0:
        raise SystemExit(f"pp: {n_layers} layers cannot fill {n_stages} stages")
    out = []
    for s in range(n_stages):
        a = s * per
        b = n_layers if s == n_stages - 1 else a + per
        out.append((a, b))
    return out


def stage_ids_of_rank(rank, pp, virtual, schedule):
    """Stage indices a pp rank runs: one (1f1b/gpipe) or `virtual` in loop order (interleaved:
    rank r holds r, r+pp, r+2pp, ... as torch's ScheduleInterleaved1F1B expects)."""
    if schedule == "interleaved":
        return [rank + k * pp for k in range(virtual)]
    return [rank]


def build_stages(lm, pp_rank, pp, virtual, schedule, pp_group, device, mb, seq, act_dtype,
                 logits_dtype):
    from torch.distributed.pipelining import PipelineStage
    n_stages = pp * (virtual if schedule == "interleaved" else 1)
    split = layer_split(lm.config.num_hidden_layers, n_stages)
    H, V = lm.config.hidden_size, lm.config.vocab_size
    stages, mods = [], []
    for sidx in stage_ids_of_rank(pp_rank, pp, virtual, schedule):
        first, last = sidx == 0, sidx == n_stages - 1
        mod = HFStage(lm, range(*split[sidx]), first, last)
        inp = (torch.empty(mb, seq, dtype=torch.long, device="meta") if first else
               torch.empty(mb, seq, H, dtype=act_dtype, device="meta"))
        out = (torch.empty(mb, seq, V, dtype=logits_dtype, device="meta") if last else
               torch.empty(mb, seq, H, dtype=act_dtype, device="meta"))
        mods.append(mod)
        stages.append((sidx, mod, inp, out))
    return n_stages, split, stages


def make_schedule(name, stages, n_micro, loss_fn):
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)
    if name == "1f1b":
        return Schedule1F1B(stages[0], n_micro, loss_fn=loss_fn)
    if name == "gpipe":
        return ScheduleGPipe(stages[0], n_micro, loss_fn=loss_fn)
    if name == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_micro, loss_fn=loss_fn)
    raise SystemExit(f"unknown schedule {name}")


def hf_loss_fn(vocab_size):
    """The schedule's loss_fn: the HF causal-LM loss on one micro-batch (logits, labels)."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    def loss_fn(logits, labels):
        return ForCausalLMLoss(logits, labels, vocab_size=vocab_size)
    return loss_fn
