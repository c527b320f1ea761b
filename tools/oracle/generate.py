"""Peak memory of `model.generate` (greedy) on the CPU oracle, as measure.py's generation runs.

    python tools/oracle/generate.py --hf-config CFG --batch B --prompt P --new-tokens N [--attn sdpa]
    python tools/oracle/generate.py --measure-model llama3.2-1b --batch 8 --prompt 2048 --new-tokens 16
    python tools/oracle/generate.py ... --trace-moe     # also: every allocation inside the MoE blocks

The run is measure.py's `infer_run`: bf16 weights built with `from_config`, `model.eval()`,
`torch.no_grad()`, `model.generate(input_ids, attention_mask=ones, max_new_tokens=N,
min_new_tokens=N, do_sample=False, return_dict_in_generate=True, pad_token_id=0)`; peak measured
from after the model is built (weights and input ids live) to the end of generate. Everything
runs under FakeTensorMode on CPU with tracker.py's live-storage tracker (512-byte rounding, as
CUDA's caching allocator). Prints one JSON object: peak_generate, kv_cache_bytes (keys and
values of the returned cache, as measure.py sums them; plus every state the cache holds), the
phase of the peak and the live tensors there grouped by the op that made them.

--trace-moe wraps every module whose class name ends in "SparseMoeBlock"/"MoE"/"Moe"/"MLP" with
an experts submodule, and records each allocation made inside it during the first forward
(the prefill): op, shape, dtype, bytes, and when it was freed (op count), so the transient of
the MoE block at prefill can be read off exactly.
"""
import argparse
import contextlib
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tracker import LiveTracker  # noqa: E402

# measure.py's arch() (shared/measurements/measure.py), for the generation runs it measured
MEASURE = {
    "llama3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                        tie_word_embeddings=True, max_position_embeddings=131072),
    "llama3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                        num_attention_heads=24, num_key_value_heads=8, vocab_size=128256,
                        tie_word_embeddings=True, max_position_embeddings=131072),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, max_position_embeddings=32768),
    "llama2-7b-8layers": dict(model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=8,
                              num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                              tie_word_embeddings=False, max_position_embeddings=4096),
    "mixtral-8x-small": dict(model_type="mixtral", hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
                             num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                             num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=8192),
}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--hf-config", default="")
    p.add_argument("--measure-model", default="")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--trace-moe", action="store_true")
    p.add_argument("--peak-tensors", action="store_true",
                   help="also list the storages alive at the peak: bytes, count, creating op, shape")
    p.add_argument("--prefill-only", action="store_true",
                   help="one forward with use_cache=True, logits_to_keep=1 (generate's prefill) instead of "
                        "model.generate: generate() itself branches on data (.item() on the attention mask, "
                        "stopping criteria), which FakeTensorMode cannot run")
    p.add_argument("--out", default="")
    return p.parse_args()


def config(a):
    from transformers import AutoConfig
    if a.measure_model:
        d = dict(MEASURE[a.measure_model])
    else:
        d = json.load(open(a.hf_config))
    d = {k: v for k, v in d.items() if k not in ("architectures", "auto_map", "quantization_config")}
    if d.get("model_type") == "kimi_k2":
        d["model_type"] = "deepseek_v3"
    cfg = AutoConfig.for_model(**d)
    cfg._attn_implementation = a.attn
    return cfg, d


class MoeTrace:
    """Allocations made inside MoE blocks (first call of each block only)."""

    def __init__(self, tracker):
        self.tr = tracker
        self.depth = 0
        self.seen = set()
        self.events = []
        self.block = None

    def hook(self, model):
        for name, m in model.named_modules():
            cn = type(m).__name__
            if hasattr(m, "experts") and (cn.endswith("SparseMoeBlock") or cn.endswith("MoE")
                                          or cn.endswith("Moe") or cn.endswith("MLP") or cn.endswith("MoeBlock")):
                m.register_forward_pre_hook(lambda mod, inp, n=name: self.enter(n))
                m.register_forward_hook(lambda mod, inp, out, n=name: self.leave(n))

    def enter(self, n):
        if n in self.seen or self.block is not None:
            return
        self.peak_block = self.tr.cur
        self.block = n
        self.start_cur = self.tr.cur
        self.start_op = self.tr.n_ops
        self.peak_in = self.tr.cur
        self.tr.keep_shapes = True

    def leave(self, n):
        if self.block != n:
            return
        self.seen.add(n)
        live = {}
        for st, ent in list(self.tr.info.items()):
            live[id(ent)] = ent
        self.events.append({"block": n, "cur_before": self.start_cur, "cur_after": self.tr.cur,
                            "ops": self.tr.n_ops - self.start_op, "start_op": self.start_op})
        self.tr.keep_shapes = False
        self.block = None


def main():
    a = parse()
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    import transformers.masking_utils as _mu
    _mu.is_tracing = lambda *x, **k: False
    _mu.find_packed_sequence_indices = lambda *x, **k: None
    # Two checks generate() makes on data, which fake tensors do not hold, answered from what
    # is known: the attention mask is all ones (SDPA then runs causal without a mask, as it
    # would on the device), and with min_new_tokens = max_new_tokens and no EOS the loop stops
    # at prompt + new tokens.
    _mu.fast_all = lambda t: True
    # (Linear-attention layers ask the same of their own mask, and skip it when all ones.)
    _mu.create_recurrent_attention_mask = lambda *x, **k: None
    import transformers.generation.utils as _gu
    stop_at = a.prompt + a.new_tokens
    for cls in [_gu.StopCheck] + [c for c in vars(_gu).values()
                                  if isinstance(c, type) and issubclass(c, _gu.StopCheck)]:
        cls.__call__ = lambda self, unfinished, tokens, length: length >= stop_at
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    cfg, d = config(a)
    tr = LiveTracker(round_to=512, device_type="cpu", fake_mode=fake)
    if a.peak_tensors:
        tr.keep_shapes = tr.snapshot = True
    t0 = time.time()
    rec = {"kind": "generate", "model": a.measure_model or os.path.basename(a.hf_config), "batch": a.batch,
           "seq": a.prompt, "new_tokens": a.new_tokens, "attn": a.attn}
    alloc_log = []
    with fake:
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation=a.attn)
        model.eval()
        # LongRoPE picks its short or long factors from `max(position_ids)`, a value fake
        # tensors do not hold. Either gives an `inv_freq` of the same size, so the choice is
        # skipped: the buffer made at construction (the short factors) stays.
        for m in model.modules():
            if getattr(m, "rope_type", None) == "longrope":
                m.rope_type = "longrope, fixed"
        rec["params"] = sum(p.numel() for p in model.parameters())
        ids = torch.zeros((a.batch, a.prompt), dtype=torch.long)
        mask = torch.ones_like(ids)
        moe = None
        if a.trace_moe:
            moe = MoeTrace(tr)
            moe.hook(model)
            orig_add = tr._add

            import weakref
            freed = {}

            def add(st, label, _orig=orig_add):
                new = tr.info.get(st) is None
                _orig(st, label)
                if new and moe.block is not None:
                    ent = tr.info.get(st)
                    i = len(alloc_log)
                    alloc_log.append({"block": moe.block, "op": label.split(":", 1)[-1], "shape": tr._shape_hint,
                                      "bytes": ent[0], "at_op": tr.n_ops + 1, "cur_after": tr.cur})
                    ent.append(weakref.ref(st, lambda _w, i=i: freed.__setitem__(i, tr.n_ops)))
            tr._add = add
        with tr:
            tr.mark("model")
            tr.track(list(model.parameters()) + list(model.buffers()), "model:params")
            tr.track([ids, mask], "model:input")
            rec["mem_after_model"] = tr.cur
            tr.reset_peak()
            tr.mark("generate")
            with torch.no_grad():
              if a.prefill_only:
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # all-ones mask == no mask
                rec["mode"] = "prefill"
              else:
                # No pad or EOS token (measure.py gave pad 0; a config's defaults may name an
                # EOS, which generate() then takes for padding): with one, generate() looks
                # for right padding in the data, which fake tensors do not hold. Nothing is
                # padded here (every sequence runs to the end). Without an EOS, min_new_tokens
                # adds no logits processor: with one it adds MinNewTokensLengthLogitsProcessor,
                # a copy of each step's fp32 scores (batch × vocab × 4 bytes), which these
                # runs do not have.
                model.generation_config.eos_token_id = None
                model.generation_config.pad_token_id = None
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=a.new_tokens,
                                     min_new_tokens=a.new_tokens, do_sample=False,
                                     return_dict_in_generate=True, pad_token_id=None)
            rec["peak_generate"] = tr.peak
            rec["peak_where"] = tr.peak_where
            rec["peak_labels"] = dict(sorted(((k, v) for k, v in tr.peak_by_label.items() if v),
                                             key=lambda kv: -kv[1])[:25])
            kv = out.past_key_values
            rec["kv_cache_bytes"] = sum(t.numel() * t.element_size() for layer in kv.layers
                                        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                                        if isinstance(t, torch.Tensor))
            allst = 0
            for layer in kv.layers:
                for k, v in vars(layer).items():
                    if k.startswith("_"):
                        continue
                    vs = list(v.values()) if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
                    allst += sum(t.numel() * t.element_size() for t in vs if isinstance(t, torch.Tensor))
            rec["cache_state_bytes"] = allst
            rec["mem_end"] = tr.cur
    if moe is not None:
        # lifetime: a storage is freed when its entry's weakref died; find by the finaliser's state
        blocks = {}
        for i, e in enumerate(alloc_log):
            e["freed_at_op"] = freed.get(i)
            blocks.setdefault(e["block"], []).append(e)
        first = next(iter(blocks)) if blocks else None
        rec["moe_trace_first_block"] = first
        rec["moe_allocs"] = blocks.get(first, [])
        rec["moe_blocks"] = moe.events
    if a.peak_tensors:
        rec["peak_tensors"] = tr.peak_tensors
    rec["torch"] = torch.__version__
    rec["transformers"] = transformers.__version__
    rec["machine"] = f"{platform.machine()} CPU, FakeTensorMode (no GPU); tracker rounds to 512 B"
    rec["wall_s"] = round(time.time() - t0, 1)
    rec["hf_config"] = d
    line = json.dumps(rec)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
