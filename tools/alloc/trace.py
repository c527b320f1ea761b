"""Every allocation and free of an H100 calibration run, in order, from the CPU oracle's method.

    python tools/alloc/trace.py --case N [--out FILE]      (N: line of tests/data/calibration-scenarios.jsonl)
    python tools/alloc/trace.py --all --dir DIR

The run is measure.py's (the H100 calibration script in the team's shared measurements): the
model built on the device (`from_config`), the optimizer, the input ids, then three steps of
`model(input_ids=ids, labels=ids)`, `loss.backward()`, `opt.step()`, `zero_grad(set_to_none=True)`,
`del out`; generation runs call `model.generate` once. It runs under `FakeTensorMode` on the CPU
(nothing is computed) while a dispatch mode gives every new storage an id and a weakref
finaliser reports its death, so the output is the sequence of requests PyTorch's caching
allocator would see, with tensor identity:

    a ID BYTES      a storage of BYTES (not rounded) is allocated
    f ID            it is freed
    # TEXT          a marker (phase)

What it cannot see, as the oracle cannot: memory a kernel allocates for itself (cuBLAS
workspaces, the flash-attention backward's accumulators), and CPU autocast's op lists stand in
for CUDA's under amp. It is a development aid for gpumem's allocator model (crates/gpumem/src/
alloc.rs): replaying these traces through the model separates the allocator's rules from the
engine's event stream. The traces are not committed (tens of MB); `--all` writes them.
"""
import argparse
import gc
import json
import os
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CASES = os.path.join(ROOT, "tests", "data", "calibration-scenarios.jsonl")


class Trace(TorchDispatchMode):
    """Ids for new storages of the fake mode's tensors; a line per allocation and free."""

    def __init__(self, fake_mode, out):
        super().__init__()
        self.fake_mode = fake_mode
        self.out = out
        self.ids = WeakIdKeyDictionary()
        self.next = 0
        self.live = 0
        self.peak = 0
        self.verbose = False

    def mark(self, text):
        self.out.append(f"# {text}")

    def peak_reset(self):
        self.peak = self.live

    def _see(self, t, op=""):
        if not isinstance(t, torch._subclasses.FakeTensor) or t.fake_mode is not self.fake_mode:
            return
        st = t.untyped_storage()
        n = st.nbytes()
        if n == 0 or st in self.ids:
            return
        i = self.next
        self.next += 1
        self.out.append(f"a {i} {n}" + (f" {op} {tuple(t.shape)} {str(t.dtype)[6:]}" if self.verbose else ""))
        r = (n + 511) // 512 * 512
        self.live += r
        self.peak = max(self.peak, self.live)
        me = weakref.ref(self)

        def fin(_w, i=i, r=r):
            s = me()
            if s is not None:
                s.out.append(f"f {i}")
                s.live -= r
        self.ids[st] = (i, weakref.ref(st, fin))

    def track(self, obj):
        tree_map_only(torch.Tensor, self._see, obj)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        op = func.__name__ if self.verbose else ""
        tree_map_only(torch.Tensor, lambda t: self._see(t, op), res)
        return res


def patch_fake():
    # As the oracle: transformers treats FakeTensors as tracing and would materialise the
    # causal mask; a real run passes no mask to SDPA.
    import transformers.masking_utils as mu
    mu.is_tracing = lambda *x, **k: False
    mu.find_packed_sequence_indices = lambda *x, **k: None
    F = torch.nn.functional
    sdpa = F.scaled_dot_product_attention

    def cuda_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        # The kernel CUDA's dispatcher picks on an H100: flash for 16-bit inputs (GQA
        # included), memory-efficient for fp32 without GQA, the math path otherwise.
        if attn_mask is None and q.shape[-1] <= 256:
            if q.dtype in (torch.bfloat16, torch.float16):
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            if q.shape[1] == k.shape[1]:
                need = q.requires_grad or k.requires_grad or v.requires_grad
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, None, need, dropout_p, is_causal, scale=scale)[0]
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
    F.scaled_dot_product_attention = cuda_sdpa
    torch._C._nn.scaled_dot_product_attention = cuda_sdpa
    dropout = F.dropout

    def cuda_dropout(x, p=0.5, training=True, inplace=False):
        # CUDA's dropout is one fused kernel that keeps a bool mask (the CPU's keeps a mask
        # of the input's dtype).
        if training and p > 0 and not inplace:
            return torch.ops.aten.native_dropout(x, p, True)[0]
        return dropout(x, p, training, inplace)
    F.dropout = cuda_dropout


def patch_autocast():
    """CUDA autocast's fp32 list for the ops these models use (CPU autocast keeps them in
    bf16): under autocast their floating inputs are cast to fp32 first."""
    F = torch.nn.functional

    def fp32(f):
        def g(*args, **kwargs):
            if torch.is_autocast_enabled("cpu"):
                up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() \
                    and t.dtype != torch.float32 else t
                args = tuple(up(x) for x in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
                with torch.autocast("cpu", enabled=False):
                    return f(*args, **kwargs)
            return f(*args, **kwargs)
        return g
    for mod, names in ((F, ("layer_norm", "softmax", "log_softmax")),
                       (torch, ("pow", "rsqrt", "exp", "softmax", "log_softmax", "layer_norm")),
                       (torch.Tensor, ("pow", "rsqrt", "exp", "softmax", "log_softmax"))):
        for n in names:
            setattr(mod, n, fp32(getattr(mod, n)))


def config(case):
    from transformers import AutoConfig
    d = dict(case["scenario"]["model"]["hf_config"])
    d.pop("architectures", None)
    return AutoConfig.for_model(**d)


def run(case, steps=3, verbose=False):
    sc = case["scenario"]
    name = case["name"]
    train = sc.get("mode", "train") == "train"
    prec = sc.get("precision", "bf16")
    attn = "eager" if sc.get("attention") == "eager" else "sdpa"
    cfg = config(case)
    cfg._attn_implementation = attn
    b, s = sc["batch"], sc["seq"]
    out = []
    fake = FakeTensorMode()
    patch_fake()
    tr = Trace(fake, out)
    tr.verbose = verbose
    from transformers import AutoModelForCausalLM
    dev = torch.device("cpu")
    peaks = []
    if prec.startswith("amp"):
        patch_autocast()
    with fake, tr:
        tr.mark("load")
        pdtype = torch.bfloat16 if (prec == "bf16" or not train) else torch.float32
        with dev:
            model = AutoModelForCausalLM.from_config(cfg, dtype=pdtype, attn_implementation=attn)
        if train:
            model.train()
            if sc.get("recompute") == "full":
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
            if sc.get("optimizer", "adamw").startswith("sgd"):
                opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
            else:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
            amp = prec.startswith("amp")
            tr.mark("ids")
            ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
            for step in range(steps):
                tr.peak_reset()
                tr.mark(f"step {step} forward")
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    o = model(input_ids=ids, labels=ids)
                tr.mark(f"step {step} backward")
                o.loss.backward()
                tr.mark(f"step {step} optimizer")
                opt.step()
                tr.mark(f"step {step} zero_grad")
                opt.zero_grad(set_to_none=True)
                del o
                gc.collect()
                peaks.append(tr.peak)
            tr.mark("end")
        else:
            model.eval()
            tr.mark("ids")
            ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)
            mask = torch.ones_like(ids)
            tr.peak_reset()
            tr.mark("generate")
            with torch.no_grad():
                g = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=sc["new_tokens"],
                                   min_new_tokens=sc["new_tokens"], do_sample=False,
                                   return_dict_in_generate=True, pad_token_id=0)
            peaks.append(tr.peak)
            del g
            gc.collect()
            tr.mark("end")
    return name, out, peaks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--case", type=int, default=-1)
    p.add_argument("--all", action="store_true")
    p.add_argument("--dir", default="target/alloc-traces")
    p.add_argument("--out", default="")
    p.add_argument("--verbose", action="store_true", help="op, shape and dtype after each allocation")
    a = p.parse_args()
    cases = [json.loads(l) for l in open(CASES)]
    todo = range(len(cases)) if a.all else [a.case]
    os.makedirs(a.dir, exist_ok=True)
    for i in todo:
        c = cases[i]
        if c["expect"].get("oom"):
            continue
        name, out, peaks = run(c, verbose=a.verbose)
        path = a.out or os.path.join(a.dir, f"{i:02d}.trace")
        with open(path, "w") as f:
            f.write(f"# case {i} {name}\n")
            f.write(f"# peaks {' '.join(map(str, peaks))}\n")
            f.write("\n".join(out) + "\n")
        print(i, name, "events", len(out), "peaks", peaks, flush=True)


if __name__ == "__main__":
    main()
