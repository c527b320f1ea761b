"""One decoder layer's allocations, op by op, on the CPU oracle (FakeTensorMode, 512-B rounding).

    python tools/oracle/trace_layer.py --hf-config CFG.json [--layer 1] [--seq 2048] [--batch 1]
        [--attn sdpa] [--ckpt 0] [--precision bf16] [--backward 1]

Forward of layer N: every storage an op creates, its shape and dtype, and whether it is still
alive when the layer returns (= kept for backward, or the layer's output). Backward of layer N
(from the gradient reaching its output to the gradient of its input): each op's new storages and
the live bytes above the window's start, with the window's peak. Used to model what each
family's layer saves (crates/gpumem/src/graph.rs); run by hand, nothing in the build needs it.
"""
import argparse
import contextlib
import json
import math
import os
import sys
import types
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

HERE = os.path.dirname(os.path.abspath(__file__))


def rnd(n):
    return 0 if n <= 0 else math.ceil(n / 512) * 512


class Trace(TorchDispatchMode):
    def __init__(self, fake_mode):
        super().__init__()
        self.fake_mode = fake_mode
        self.live = {}  # id(storage) -> (bytes, op index)
        self.refs = {}
        self.cur = 0
        self.n = 0
        self.on = False
        self.log = []  # (op index, name, [(bytes, shape, dtype, sid)])
        self.deaths = {}  # sid -> op index at death

    def _counts(self, t):
        return isinstance(t, torch._subclasses.FakeTensor) and t.fake_mode is self.fake_mode

    def add(self, st, label):
        sid = id(st)
        if sid in self.live:
            return None
        b = rnd(st.nbytes())
        self.live[sid] = b
        self.cur += b

        def fin(_w, sid=sid, b=b, me=weakref.ref(self)):
            s = me()
            if s is not None and sid in s.live:
                s.cur -= b
                del s.live[sid]
                s.deaths[sid] = s.n
        self.refs[sid] = weakref.ref(st, fin)
        return sid, b

    def track(self, obj):
        def f(t):
            if self._counts(t):
                self.add(t.untyped_storage(), "pre")
        tree_map_only(torch.Tensor, f, obj)

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        self.n += 1
        name = func._schema.name.split("::")[-1] if hasattr(func, "_schema") else str(func)
        new = []

        def f(t):
            if not self._counts(t):
                return
            r = self.add(t.untyped_storage(), name)
            if r is not None:
                new.append((r[1], tuple(t.shape), str(t.dtype).replace("torch.", ""), r[0]))
        tree_map_only(torch.Tensor, f, res)
        if self.on:
            self.log.append((self.n, name, new, self.cur))
        return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hf-config", required=True)
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--attn", default="sdpa")
    p.add_argument("--ckpt", type=int, default=0)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--backward", type=int, default=1)
    p.add_argument("--min-bytes", type=int, default=1 << 20, help="hide allocations smaller than this")
    a = p.parse_args()

    from torch._subclasses.fake_tensor import FakeTensorMode
    # LongRoPE (Phi-3.5) branches on torch.max(position_ids): answer it for positions
    # 0..seq-1 as families.py does.
    orig_max = torch.max

    def patched_max(*x, **k):
        t = x[0] if x else None
        if (len(x) == 1 and not k and isinstance(t, torch._subclasses.FakeTensor)
                and t.dtype == torch.long and t.dim() == 2 and t.shape[-1] == a.seq):
            return a.seq - 1
        return orig_max(*x, **k)
    torch.max = patched_max
    import transformers.masking_utils as _mu
    _mu.is_tracing = lambda *x, **k: False
    _mu.find_packed_sequence_indices = lambda *x, **k: None
    from transformers import AutoConfig, AutoModelForCausalLM, FalconForCausalLM, GPTNeoXForCausalLM
    FalconForCausalLM.model = property(lambda self: types.SimpleNamespace(layers=self.transformer.h))
    GPTNeoXForCausalLM.model = property(lambda self: types.SimpleNamespace(layers=self.gpt_neox.layers))
    d = json.load(open(a.hf_config))
    d = {k: v for k, v in d.items() if k not in ("architectures",)}
    cfg = AutoConfig.for_model(**d)
    cfg._attn_implementation = a.attn
    fake = FakeTensorMode()
    tr = Trace(fake)
    dt = torch.bfloat16 if a.precision == "bf16" else torch.float32
    with fake:
        model = AutoModelForCausalLM.from_config(cfg, dtype=dt, attn_implementation=a.attn)
        model.train()
        if a.ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        blk = model.model.layers[a.layer]
        marks = {}

        def pre(m, args, kwargs):
            tr.on = True
            marks["fwd0"] = (tr.n, tr.cur)
            x = args[0] if args else kwargs.get("hidden_states")
            if x is not None and x.requires_grad:
                x.register_hook(lambda g: marks.__setitem__("bwd1", (tr.n, tr.cur)))

        def post(m, args, kwargs, out):
            marks["fwd1"] = (tr.n, tr.cur)
            marks["live_at_end"] = set(tr.live)
            tr.on = False
            o = out[0] if isinstance(out, tuple) else out
            if o.requires_grad:
                def h(g):
                    marks["bwd0"] = (tr.n, tr.cur)
                    tr.on = True
                o.register_hook(h)
        blk.register_forward_pre_hook(pre, with_kwargs=True)
        blk.register_forward_hook(post, with_kwargs=True)
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))
        with tr:
            tr.track(list(model.parameters()) + list(model.buffers()) + [ids])
            out = model(input_ids=ids, labels=ids)
            fwd_log = [e for e in tr.log if marks["fwd0"][0] < e[0] <= marks["fwd1"][0]]
            tr.log = []
            print(f"== layer {a.layer} forward ({type(blk).__name__}): start live {marks['fwd0'][1]:,}")
            kept, small = 0, 0
            at_end = marks["live_at_end"]
            for (i, name, new, cur) in fwd_log:
                for (b, shape, dtype, sid) in new:
                    alive = sid in tr.live  # still alive when the model's forward returns
                    kept += b if alive else 0
                    if b < a.min_bytes:
                        small += b if alive else 0
                        continue
                    if alive:
                        state = "KEPT"
                    elif sid in at_end:
                        state = f"to layer end, freed@{tr.deaths.get(sid, 0) - marks['fwd0'][0]}"
                    else:
                        state = f"freed@{tr.deaths.get(sid, 0) - marks['fwd0'][0]}"
                    print(f"  {i - marks['fwd0'][0]:4d} {name:34s} {b:>14,} {str(shape):28s} {dtype:9s} {state}")
            print(f"  kept (alive when the forward returns): {kept:,} (small ones {small:,}); "
                  f"layer delta {marks['fwd1'][1] - marks['fwd0'][1]:,}")
            if a.backward:
                out.loss.backward()
                if "bwd0" in marks:
                    s0, c0 = marks["bwd0"]
                    s1 = marks.get("bwd1", (tr.n, tr.cur))[0]
                    log = [e for e in tr.log if s0 < e[0] <= s1]
                    pk = max([c for *_, c in log] + [c0])
                    print(f"== layer {a.layer} backward: start live {c0:,}; peak above start {pk - c0:,}")
                    for (i, name, new, cur) in log:
                        nb = sum(b for b, *_ in new)
                        if nb >= a.min_bytes or cur == pk:
                            sh = ", ".join(f"{s}{'' if d == 'bfloat16' else ' ' + d}" for _, s, d, _ in new)
                            print(f"  {i - s0:4d} {name:34s} +{nb:>13,} live {cur - c0:>+15,} {sh}"
                                  f"{'  <- PEAK' if cur == pk else ''}")


if __name__ == "__main__":
    main()
