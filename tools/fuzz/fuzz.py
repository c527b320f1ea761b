#!/usr/bin/env python3
"""Hostile-input fuzzing of the `gpumem` CLI (standard library only).

Mutates the published configs (tests/data/models/configs), the calibration scenarios
(tests/data/calibration-scenarios.jsonl) and the command-line flags of `gpumem estimate` and
`gpumem plan`, runs each case with a timeout and flags what breaks the product's standard:
every wrong input gets a clear error (exit 2) naming the field, flag or FILE[:LINE], never a
panic, a signal, a hang, a non-finite, negative or absurd size, or raw input markup in output.

Run (from the repository root, after `cargo build --release -p gpumem-cli`):

    python3 tools/fuzz/fuzz.py --seed 1 --minutes 10          # or --cases 2000
    python3 tools/fuzz/fuzz.py --seed 7 --cases 500 --jobs 2 --out /tmp/gpumem-fuzz

Kinds: signal, panic, timeout, exit (an exit code other than 0 and 2), nofield (an error
that names no field, flag or file), null/nonfinite/negative/absurd (a figure in --json),
invariant (figures that do not add up), table, markup (input markup in the output),
roundtrip (a plan's listed scenario, estimated, gives other figures, or is refused) and
noeffect (a flag with a non-default value accepted yet changing nothing: for review, since
some rightly change nothing, e.g. --zero 2 on one GPU).

Findings go to OUT/findings.jsonl (one JSON object per flagged case: the kind, the command,
the input file kept beside it, exit code, output) and a summary by kind to stdout; distinct
error messages (numbers blanked) go to OUT/messages.txt for review. Exit status 1 if any case
was flagged.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CONFIGS = os.path.join(ROOT, "tests/data/models/configs")
SCENARIOS = os.path.join(ROOT, "tests/data/calibration-scenarios.jsonl")
MARK = "<img src=x onerror=alert(1)>"
ESC = "\u001b[2J\r\nverdict fits\u0007"  # a terminal's escapes

HUGE = [2**24, 2**31, 2**32, 2**40, 2**53, 2**63, 2**64 - 1, 2**64, 10**30]
NUMS = [0, 1, 2, 3, 5, 7, 8, 13, 64, 100, 4096, 65536, 1000000, -1, -2**63]


def hf_keys():
    """Every key the engine reads from a config.json (HF_KEYS in crates/gpumem/src/hf.rs)."""
    src = open(os.path.join(ROOT, "crates/gpumem/src/hf.rs"), encoding="utf-8").read()
    body = src[src.index("pub const HF_KEYS"):]
    body = body[: body.index("];")]
    return re.findall(r'"([a-z_0-9]+)"', body)


def hostile_value(r, key=None):
    c = r.random()
    if c < 0.25:
        return r.choice(NUMS + HUGE)
    if c < 0.35:
        return r.choice([0.5, 1.5, -0.5, 1e300, -1e300, 1e-300, 2.0, 1e6, 1e19, 4096.0])
    if c < 0.45:
        return r.choice([None, True, False, "", "x", "null", "NaN", "Infinity", "-1", "4096",
                         " 12", "1e3", MARK, "é" * 50, "\u202e", "a" * 5000, ESC])
    if c < 0.55:
        return r.choice([[], [1], [0, 0], [1, 2, 3], [None], ["full_attention"], [[1]], {},
                         {"a": 1}, [MARK], list(range(100))])
    if c < 0.7:
        return r.randint(0, 200)
    if c < 0.8:
        return r.choice([2**k for k in range(0, 45)])
    if c < 0.9:
        return r.randint(-5, 5)
    return r.choice(NUMS) * r.choice([1, 3, 7, 1000])


def layer_types_value(r, layers):
    names = ["full_attention", "sliding_attention", "chunked_attention", "linear_attention",
             "attention", "linear", "bogus", None, 3]
    n = layers if isinstance(layers, int) and 0 <= layers <= 5000 else 8
    n = max(0, n + r.choice([0, 0, 0, -1, 1, n, -n]))
    if r.random() < 0.2:
        return "".join(r.choice("fsclx") for _ in range(r.randint(0, 12)))
    if r.random() < 0.7:
        pat = [r.choice(names[:4]) for _ in range(r.randint(1, 4))]
        return [pat[i % len(pat)] for i in range(n)]
    return [r.choice(names) for _ in range(n)]


def structural(r, c):
    """A targeted hostile edit of a config: extreme sizes, inconsistent heads, MoE, windows."""
    tgt = c.get("text_config") if isinstance(c.get("text_config"), dict) else c
    choice = r.randrange(16)
    if choice == 0:
        tgt["num_hidden_layers"] = r.choice([10**6, 0, 10000, 10001, 1e6, 2**40])
    elif choice == 1:
        tgt["hidden_size"] = r.choice([2**40, 2**24, 2**24 + 1, 3, 1, 0, 2**20])
    elif choice == 2:
        tgt["vocab_size"] = r.choice([0, 1, 2**24, 2**24 + 1, 2**40])
    elif choice == 3:
        h = tgt.get("num_attention_heads", 32)
        tgt["num_attention_heads"] = r.choice([7, 13, 1000, 2**24, (h if isinstance(h, int) else 32) + 1])
    elif choice == 4:
        h = tgt.get("num_attention_heads", 32)
        h = h if isinstance(h, int) else 32
        tgt["num_key_value_heads"] = r.choice([h + 1, h * 2, 3, 0, 2**24])
    elif choice == 5:
        for k in ["num_local_experts", "num_experts", "n_routed_experts"]:
            if k in tgt or r.random() < 0.3:
                tgt[k] = r.choice([0, 1, 2, 3, 2**16, 2**16 + 1])
        tgt["num_experts_per_tok"] = r.choice([0, 1, 2, 9, 300, 2**16 + 1])
    elif choice == 6:
        tgt["sliding_window"] = r.choice([0, 1, None, 2**27, 2**40, -1, 4096, 0.5])
        if r.random() < 0.5:
            tgt["use_sliding_window"] = r.choice([True, False, "yes"])
        if r.random() < 0.5:
            tgt["max_window_layers"] = r.choice([0, 1, 10**6, -1])
        if r.random() < 0.5:
            tgt["sliding_window_pattern"] = r.choice([0, 1, 2, 6, 10**6])
    elif choice == 7:
        tgt["layer_types"] = layer_types_value(r, tgt.get("num_hidden_layers"))
    elif choice == 8:
        tgt["head_dim"] = r.choice([0, 1, 3, 2**24, 2**25, 7])
    elif choice == 9:
        tgt["intermediate_size"] = r.choice([0, 1, 2**28, 2**28 + 1, 2**40])
        tgt["moe_intermediate_size"] = r.choice([0, 1, 2**28, 2**40])
    elif choice == 10:
        for k in ["kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]:
            if r.random() < 0.5:
                tgt[k] = r.choice([0, 1, None, 2**24, 2**25, 7])
    elif choice == 11:
        for k in ["first_k_dense_replace", "decoder_sparse_step", "interleave_moe_layer_step",
                  "full_attention_interval", "no_rope_layer_interval", "n_shared_experts"]:
            if r.random() < 0.4:
                tgt[k] = r.choice([0, 1, 2, 10**6, -1, None])
        for k in ["mlp_only_layers", "moe_layers"]:
            if r.random() < 0.3:
                tgt[k] = r.choice([[0], [10**6], [-1], list(range(200)), "0 1", "x", []])
    elif choice == 12:
        tgt["quantization_config"] = r.choice([
            {"quant_method": "fp8", "weight_block_size": [0, 0]},
            {"quant_method": "fp8", "weight_block_size": [128, 64]},
            {"quant_method": "fp8", "weight_block_size": [2**40, 2**40]},
            {"quant_method": "mxfp4"}, {"quant_method": 3}, {"quant_method": "bitsandbytes"},
            {}, [], "fp8", None])
    elif choice == 13:
        for k in ["partial_rotary_factor", "rotary_pct", "final_logit_softcapping",
                  "attn_logit_softcapping", "attention_dropout", "hidden_dropout"]:
            if r.random() < 0.4:
                tgt[k] = r.choice([0.0, 1.0, 2.0, -1.0, 1e308, 0.999999, 1e-300, "0.5"])
    elif choice == 14:
        for k in ["linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim"]:
            if r.random() < 0.5:
                tgt[k] = r.choice([0, 1, 3, 2**24, 2**25, 7])
    else:
        tgt["no_rope_layers"] = r.choice([[], [0], [1, 0] * 4, "01", "2", [2] * 4,
                                          [1] * (tgt.get("num_hidden_layers") or 1)
                                          if isinstance(tgt.get("num_hidden_layers"), int)
                                          and 0 < tgt.get("num_hidden_layers") < 5000 else [1]])


def mutate_config(r, c, keys):
    for _ in range(r.choice([1, 1, 1, 2, 3, 4])):
        k = r.random()
        tgt = c
        if isinstance(c.get("text_config"), dict) and r.random() < 0.7:
            tgt = c["text_config"]
        if k < 0.45:
            tgt[r.choice(keys)] = hostile_value(r)
        elif k < 0.55:
            ks = list(tgt.keys())
            if ks:
                del tgt[r.choice(ks)]
        elif k < 0.62:
            key = r.choice(list(tgt.keys()) or ["x"])
            tgt[key] = hostile_value(r)
        elif k < 0.66:
            c["model_type"] = r.choice(["LLAMA", "llama ", MARK, "", "gpt3", "gemma3", "llama4",
                                        "kimi_k2", "gpt2", "qwen3_next", "t5", 5, None])
        elif k < 0.69:
            c["text_config"] = r.choice([{}, c.copy(), [], "x", None, {"text_config": {}}])
        else:
            structural(r, c)
    return c


def deep(n, open_, close):
    return open_ * n + close * n


def dup_key(text, r):
    """Insert a duplicate of a key the object already has, with another value, at the start."""
    m = re.findall(r'"([a-z_]+)"\s*:', text)
    if not m:
        return text
    k = r.choice(m)
    v = json.dumps(hostile_value(r))
    i = text.index("{") + 1
    return text[:i] + f'"{k}": {v}, ' + text[i:]


def byte_mutation(r, data):
    """Bytes that are not (all) well-formed JSON text."""
    c = r.randrange(14)
    if c == 0:
        return b"\xef\xbb\xbf" + data
    if c == 1:
        i = r.randrange(len(data) + 1)
        return data[:i] + r.choice([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\xfe\xff"]) + data[i:]
    if c == 2:
        return data[: r.randrange(len(data) + 1)]
    if c == 3:
        return dup_key(data.decode("utf-8", "replace"), r).encode()
    if c == 4:
        n = r.choice([100, 127, 128, 129, 1000, 100000])
        return deep(n, b'{"a":', b"}") if r.random() < 0.5 else deep(n, b"[", b"]")
    if c == 5:
        pad = b" " * (4 * 1024 * 1024 - len(data) + r.choice([-1, 0, 1, 10]))
        return data + pad
    if c == 6:
        return data.replace(b": ", b": NaN, \"x\": ", 1) if r.random() < 0.5 else b'{"a": Infinity}'
    if c == 7:
        return b""
    if c == 8:
        return r.choice([b"null", b"[]", b"0", b'"x"', b"true", b"{}", b"[{}]", b"1e999"])
    if c == 9:
        return b"\xff\xfe" + data.decode("utf-8", "replace").encode("utf-16-le")
    if c == 10:
        return data + b"\n{}" if r.random() < 0.5 else data + b" garbage"
    if c == 11:
        b = bytearray(data)
        for _ in range(r.randint(1, 5)):
            if b:
                b[r.randrange(len(b))] = r.randrange(256)
        return bytes(b)
    if c == 12:
        return data.replace(b"\n", b"\r\n")
    return b"\xef\xbb\xbf\xef\xbb\xbf" + data


# Command-line flags: (flag, hostile values). Each case uses a few of them.
def num_values(r):
    return r.choice(["0", "1", "2", "3", "4", "7", "8", "16", "64", "1000", "65536", str(2**20),
                     str(2**20 + 1), str(2**24), str(2**27), str(2**40), str(2**63), str(2**64 - 1),
                     str(2**64), "-1", "1.5", "1e3", "abc", "", " 4", "0x10", "+3", "٣"])


CHOICES = {
    "--mode": ["train", "inference", "Inference", "generate", "eval", ""],
    "--precision": ["fp32", "bf16", "fp16", "amp-bf16", "amp-fp16", "mixed-bf16", "fp8", "int4",
                    "nf4", "int8", "fp64", "BF16", "", "bf16,weights=int4", MARK],
    "--optimizer": ["adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adamw-8bit",
                    "paged-adamw-8bit", "lion", "", MARK],
    "--recompute": ["none", "selective", "full", "on", "off", "partial"],
    "--attention": ["flash", "eager", "sdpa", "xformers"],
    "--loss": ["standard", "fused", "chunked", "x"],
    "--finetune": ["full", "lora", "qlora", "dora"],
    "--gpu": ["H100-80GB", "H200", "B200", "A100-80GB", "A100-40GB", "L4", "RTX-4090", "h100",
              "TPU", "", MARK],
    "--allocator": ["default", "expandable", "none", "x"],
    "--fsdp": ["full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "x"],
    "--framework": ["fsdp", "deepspeed", "megatron", "jax", ""],
    "--schedule": ["1f1b", "interleaved", "gpipe", "zb"],
    "--sp": ["on", "off", "yes", "1"],
    "--loss-parallel": ["on", "off", "maybe"],
    "--ep-impl": ["titan", "hf", "x"],
    "--cp-load-balance": ["on", "off", "x"],
    "--wrap": ["layers", "titan", "x"],
    "--offload": ["none", "optimizer", "optimizer+params", "all", "params"],
}
NUM_FLAGS = ["--batch", "--seq", "--new-tokens", "--dp", "--tp", "--pp", "--cp", "--ep",
             "--zero", "--grad-accum", "--virtual-stages"]
PLAN_NUM = ["--global-batch", "--gpus-per-node", "--top", "--host-memory-gb"]
GPUS = ["1", "8", "0", "1..16384", "8..16384", "8..128:8", "8..128:0", "128..8", "1..1",
        "8,16,24", "8,,16", ",", "", "1..1048577", "1..18446744073709551615",
        "18446744073709551615", "8..4096:1", "1..4096:1", "1..4097:1", "-8", "8..", "..8",
        "a", "8..16:3", "1.5", "2048", "1048576", "1048577", "1..1048576:1", "3..5"]


def random_flags(r, plan):
    out = []
    n = r.choice([0, 1, 2, 3, 4, 6, 10])
    for _ in range(n):
        c = r.random()
        if c < 0.45:
            f = r.choice(NUM_FLAGS)
            v = num_values(r) if r.random() < 0.6 else str(r.choice([1, 2, 3, 4, 8, 16, 32, 64]))
            out += [f, v]
        elif c < 0.85:
            f = r.choice(list(CHOICES))
            out += [f, r.choice(CHOICES[f])]
        elif c < 0.9:
            out.append("--grad-reduce-in-bf16")
        elif plan:
            f = r.choice(PLAN_NUM + ["--gpus", "--no-offload"])
            if f == "--no-offload":
                out.append(f)
            elif f == "--gpus":
                out += [f, r.choice(GPUS)]
            else:
                out += [f, num_values(r)]
    return out


def mutate_scenario(r, s, keys):
    for _ in range(r.randint(1, 4)):
        c = r.random()
        par = s.setdefault("parallel", {}) if isinstance(s.get("parallel"), dict) else {}
        if c < 0.3:
            k = r.choice(["batch", "seq", "new_tokens", "mode", "precision", "optimizer",
                          "recompute", "attention", "loss", "finetune", "gpu", "allocator",
                          "parallel", "model", "bogus"])
            s[k] = hostile_value(r)
        elif c < 0.55:
            k = r.choice(["dp", "tp", "pp", "cp", "ep", "zero", "grad_accum", "gpus", "framework",
                          "fsdp", "shard_group", "sp", "offload", "schedule", "virtual_stages",
                          "capacity_factor", "wrap", "loss_parallel", "grad_reduce_in_bf16",
                          "cp_load_balance", "cp_rotate", "ep_impl", "dpp"])
            par[k] = hostile_value(r) if r.random() < 0.5 else r.choice(
                [1, 2, 3, 4, 8, 16, 0, True, False, "interleaved", "hybrid_shard", "megatron",
                 "deepspeed", "optimizer+params", "titan", 0.05, 64.0, 65.0])
        elif c < 0.65:
            s["precision"] = r.choice([
                {"weights": "int4"}, {"weights": "fp8", "grads": "fp8"}, {"recipe": "bf16"},
                {"weights": "bf16", "master": "fp32", "optimizer": "fp32", "activations": "x"},
                {}, [], "bf16,weights=int4", "mixed-bf16", "qlora", {"bogus": 1}])
        elif c < 0.72:
            s["finetune"] = r.choice([
                {"lora": {"rank": 0}}, {"lora": {"rank": 65537}}, {"qlora": {"rank": 8}},
                {"lora": {"targets": "all-linear"}}, {"lora": {"targets": ["x"]}},
                {"lora": {}, "qlora": {}}, {"lora": None}, {"lora": {"rank": 2**40}}])
        elif c < 0.78:
            s["gpu"] = r.choice([{"capacity_bytes": 0}, {"capacity_bytes": 2**20},
                                 {"capacity_bytes": 2**50}, {"capacity_bytes": 2**50 + 1},
                                 {"name": MARK, "capacity_bytes": 2**34}, {"name": "H200"},
                                 {"name": ESC, "capacity_bytes": 2**34},
                                 {"name": "x"}, {}, "H100-80GB"])
        elif c < 0.83:
            s["allocator"] = r.choice([{"max_split_size_mb": 20}, {"max_split_size_mb": 21},
                                       {"max_split_size_mb": 2**20 + 1},
                                       {"expandable_segments": True, "max_split_size_mb": 64},
                                       {"expandable_segments": "yes"}, "expandable", {}])
        elif c < 0.9:
            s["model"] = r.choice([
                "gpt2", "llama3.1-8b", MARK, {"preset": "qwen3-8b"}, {"params": 0},
                {"params": 10**14 + 1}, {"params": 7 * 10**9}, {"params": -1},
                {"hidden": 4096, "layers": 32, "heads": 32, "vocab": 32000, "intermediate": 11008},
                {"family": "gpt2", "hidden": 768, "layers": 12, "heads": 12, "vocab": 50257},
                {"family": MARK}, {"hidden": 2**24, "layers": 10000, "heads": 1, "vocab": 2**24,
                                   "intermediate": 2**28},
                {"family": "mixtral", "hidden": 4096, "layers": 32, "heads": 32, "vocab": 32000,
                 "intermediate": 14336, "experts": r.choice([0, 1, 8]),
                 "top_k": r.choice([0, 2, 9])},
                {"name": MARK, "preset": "gpt2"}, {"name": ESC, "preset": "gpt2"},
                {"preset": "gpt2", "hf_config": {}}, {"params": 7 * 10**9, "kv_head": 8},
                {"hidden": 4096, "layers": 32, "heads": 32, "vocab": 32000,
                 "intermediate": 11008, "kv_head": 8},
                {"name": MARK, "hf_config": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12,
                                             "n_head": 12, "vocab_size": 50257}}])
        else:
            m = s.get("model")
            if isinstance(m, dict) and isinstance(m.get("hf_config"), dict):
                mutate_config(r, m["hf_config"], keys)
    return s


class Runner:
    def __init__(self, binary, out, timeout):
        self.binary = binary
        self.out = out
        self.timeout = timeout
        self.tmp = tempfile.mkdtemp(prefix="gpumem-fuzz-")
        self.fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(self.fifo)
        os.symlink("/dev/zero", os.path.join(self.tmp, "zero-link"))

    def run(self, args, files):
        """Run the binary; `files` maps a placeholder in args to bytes to write first."""
        paths = {}
        for ph, data in files.items():
            fd, p = tempfile.mkstemp(dir=self.tmp, suffix=".json")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            paths[ph] = p
        argv = [self.binary] + [paths.get(a, a) for a in args]
        t0 = time.time()
        try:
            p = subprocess.run(argv, capture_output=True, timeout=self.timeout)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, so, se = "timeout", e.stdout or b"", e.stderr or b""
        dt = time.time() - t0
        return argv, paths, rc, so, se, dt


FIELD = re.compile(r"^(--[a-z-]+|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+|\[\d+\])*)$")


def invariants(d):
    """Identities every estimate meets (they hold on every calibration scenario)."""
    bad = []
    try:
        if sum(d["components"].values()) != d["peak_bytes"]:
            bad.append("components do not add up to peak_bytes")
        # DeepSpeed ZeRO-3's persistent gather buffers count in the model states only.
        zero3 = any(n.startswith("DeepSpeed ZeRO-3") for n in d["notes"])
        if d["weights_bytes"] + d["master_weights_bytes"] + d["gradients_bytes"] + \
                d["optimizer_states_bytes"] != d["model_states_bytes"] and not zero3:
            bad.append("model states do not add up")
        if not d["device_bytes"] >= d["peak_reserved_bytes"] >= d["peak_bytes"] > 0:
            bad.append("not device >= reserved >= peak > 0")
        if d["headroom_bytes"] != d["capacity_bytes"] - d["device_bytes"]:
            bad.append("headroom != capacity - device")
        if d["fits"] and d["headroom_bytes"] < 0:
            bad.append("fits with a negative headroom")
        if not d["fits"] and d["headroom_bytes"] >= 0 and not d["fragmentation_oom"]:
            bad.append("does not fit with headroom and no fragmentation")
        if any(t["bytes"] > d["peak_bytes"] or t["bytes"] < 0 for t in d["timeline"]):
            bad.append("a timeline point above the peak")
        if not d["params"] >= max(d["trainable_params"], d["active_params"]):
            bad.append("trainable or active params above params")
    except (KeyError, TypeError) as e:
        bad.append("missing field %s" % e)
    return bad


def check(case, argv, paths, rc, so, se):
    """The kinds of defect this case shows, each with a detail."""
    found = []
    err = se.decode("utf-8", "replace")
    out = so.decode("utf-8", "replace")
    if rc == "timeout":
        return [("timeout", "")]
    if rc < 0:
        found.append(("signal", str(-rc)))
    elif rc not in (0, 2):
        found.append(("exit", str(rc)))
    for t in ["panicked", "RUST_BACKTRACE", "attempt to", "stack overflow", "memory allocation"]:
        if t in err or t in out:
            found.append(("panic", t))
            break
    if rc == 2:
        first = err.splitlines()[0] if err.strip() else ""
        if not first.startswith("error:"):
            found.append(("nofield", first[:200]))
        else:
            body = first[len("error: "):]
            ok = False
            if body.startswith("this step needs about") and "lower batch, seq" in body:
                ok = True  # beyond 2^60 bytes: names what to lower
            elif body.startswith(("invalid value", "unexpected argument", "the argument",
                                "unrecognized", "a value is required", "no model:",
                                "unexpected value", "equal sign is needed")):
                ok = "--" in body or "'" in body or "no model" in body
            else:
                head = body.split(": ", 1)[0]
                rest = body.split(": ", 1)[1] if ": " in body else ""
                if head in paths.values() or head.startswith("/") or head == "-":
                    # FILE: field: message, FILE:LINE:COL: message, or FILE: a sentence.
                    h2 = rest.split(": ", 1)[0]
                    ok = bool(re.match(r"^:\d+:\d+", body[len(head):])) or bool(FIELD.match(h2)) \
                        or rest.startswith(("is ", "larger than", "not UTF-8", "No such", "a scenario",
                                            "Permission", "Is a directory"))
                    if re.match(r"^[^:]+:\d+:\d+: ", body):
                        ok = True
                else:
                    ok = bool(FIELD.match(head)) and rest != ""
            if not ok:
                found.append(("nofield", first[:300]))
    if rc == 0 and "--json" in argv:
        try:
            v = json.loads(out, parse_constant=lambda c: float("nan"))
        except ValueError as e:
            found.append(("badjson", str(e)[:100]))
            v = None
        bad = []

        def walk(x, path):
            if isinstance(x, dict):
                for k, y in x.items():
                    walk(y, path + "." + k)
            elif isinstance(x, list):
                for i, y in enumerate(x):
                    walk(y, path + "[%d]" % i)
            elif ".scenario." in path:
                pass  # the layout's scenario echoes the input (its config's nulls included)
            elif x is None:
                if not path.endswith("fewest_gpus") and not path.endswith(".best"):
                    bad.append(("null", path))
            elif isinstance(x, bool):
                pass
            elif isinstance(x, (int, float)):
                if isinstance(x, float) and not math.isfinite(x):
                    bad.append(("nonfinite", path))
                elif x < 0 and not path.endswith("headroom_bytes"):
                    bad.append(("negative", path))
                elif abs(x) > 1e30:
                    bad.append(("absurd", path))
                elif isinstance(x, int) and x > 2**60 and "bytes" in path:
                    bad.append(("absurd", path))  # a memory size beyond the engine's bound
        walk(v, "")
        for kind, path in bad[:3]:
            found.append((kind, re.sub(r"\[\d+\]", "[]", path)))
        if isinstance(v, dict) and argv[1] == "estimate" and not bad:
            for what in invariants(v):
                found.append(("invariant", what))
    if rc == 0 and "--json" not in argv:
        for t in [r"\bNaN\b", r"\binf\b", r"-\d+(\.\d+)? GiB", r"\de\+\d"]:
            if re.search(t, out):
                found.append(("table", t))
    # A name the scenario gives (model.name, gpu.name) is a label, echoed as data.
    named = re.sub(r'"(model|gpu)": "[^"]*"|^(model|GPU) .*$', "", out, flags=re.M)
    if argv[1] == "plan" and "--json" in argv:
        named = ""  # each layout's scenario carries the config as given, as JSON data
    if MARK in named:
        found.append(("markup", "input markup in the output"))
    if "\x1b" in out or "\x1b" in err or "\x07" in out or "\x07" in err:
        found.append(("markup", "a terminal escape in the output"))
    elif MARK in err and not re.search(r"'" + re.escape(MARK[:20]), err):
        found.append(("markup", "input markup in an error, unquoted"))
    return found


# A flag with a value other than its default, for the no-effect check.
NONDEFAULT = [("--new-tokens", "64"), ("--optimizer", "sgd"), ("--recompute", "full"),
              ("--loss", "fused"), ("--grad-accum", "4"), ("--schedule", "interleaved"),
              ("--schedule", "gpipe"), ("--virtual-stages", "4"), ("--sp", "off"),
              ("--loss-parallel", "off"), ("--ep-impl", "hf"), ("--cp-load-balance", "off"),
              ("--wrap", "titan"), ("--offload", "optimizer"), ("--zero", "2"),
              ("--fsdp", "hybrid_shard"), ("--framework", "deepspeed"),
              ("--framework", "megatron"), ("--allocator", "expandable"),
              ("--attention", "eager"), ("--precision", "fp32")]


def followups(runner, r, args, files, out):
    """Second runs that check a success: a plan's listed scenario, estimated, gives the plan's
    figures; a flag with a non-default value either changes the figures or is refused."""
    found = []
    try:
        d = json.loads(out)
    except ValueError:
        return found
    if args[0] == "plan":
        for c in (d.get("best") or [])[:2]:
            sc = json.dumps(c["scenario"]).encode()
            _, _, rc, so, se, _ = runner.run(["estimate", "--json", "--scenario", "@S"], {"@S": sc})
            if rc != 0:
                found.append(("roundtrip", "a listed scenario is refused: " +
                              se.decode("utf-8", "replace")[:100]))
                continue
            e = json.loads(so)
            for k in ["peak_bytes", "device_bytes"]:
                if e[k] != c[k]:
                    found.append(("roundtrip", "%s: plan %d, estimate of its scenario %d; %s" % (
                        k, c[k], e[k], json.dumps(c["scenario"].get("parallel"), sort_keys=True))))
                    break
        return found
    # A scenario file may already hold the value; and some flags rightly change nothing
    # (ZeRO over one rank is no sharding): these findings are for review.
    if r.random() < 0.5 and "--scenario" not in args:
        flag, val = r.choice(NONDEFAULT)
        if flag in args:
            return found
        base = [x for x in args]
        _, _, rc, so, se, _ = runner.run(base + [flag, val], dict(files))
        if rc == 0 and so == out:
            found.append(("noeffect", "%s %s" % (flag, val)))
    return found


def make_case(r, runner, configs, scenarios, keys, i):
    kind = r.random()
    plan = r.random() < 0.3
    args = ["plan" if plan else "estimate"]
    files = {}
    if kind < 0.45:
        name, c = r.choice(configs)
        c = json.loads(json.dumps(c))
        mutate_config(r, c, keys)
        data = json.dumps(c, indent=r.choice([None, 2])).encode()
        if r.random() < 0.25:
            data = byte_mutation(r, data)
        files["@CFG"] = data
        args += ["--hf-config", "@CFG"]
        what = "config:" + name
    elif kind < 0.75:
        name, s = r.choice(scenarios)
        s = json.loads(json.dumps(s))
        mutate_scenario(r, s, keys)
        data = json.dumps(s).encode()
        if r.random() < 0.15:
            data = byte_mutation(r, data)
        files["@SCN"] = data
        args += ["--scenario", "@SCN"]
        if r.random() < 0.2:
            name2, c = r.choice(configs)
            files["@CFG"] = json.dumps(c).encode()
            args += ["--hf-config", "@CFG"]
        what = "scenario:" + name
    elif kind < 0.93:
        if r.random() < 0.5:
            args += ["--model", r.choice(["gpt2", "llama3.1-8b", "llama3.1-70b", "qwen3-30b-a3b",
                                          "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b",
                                          "qwen3-next-80b-a3b", "gemma-3-12b", "x", MARK, ""])]
        else:
            name, c = r.choice(configs)
            files["@CFG"] = json.dumps(c).encode()
            args += ["--hf-config", "@CFG"]
        what = "flags"
    else:
        special = r.choice([runner.tmp, "/dev/zero", "/dev/null", runner.fifo,
                            os.path.join(runner.tmp, "zero-link"), "/nonexistent/x.json", "",
                            "/proc/self/status", "/etc/shadow", "-"])
        args += [r.choice(["--hf-config", "--scenario"]), special]
        if "--scenario" not in args:
            args += ["--model", "gpt2"] if r.random() < 0.3 else []
        what = "special"
    args += random_flags(r, plan)
    if plan and "--gpus" not in args and r.random() < 0.9:
        args += ["--gpus", r.choice(GPUS) if r.random() < 0.5 else r.choice(["8", "8..64", "1..16"])]
    if r.random() < 0.75:
        args.append("--json")
    return what, args, files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/gpumem"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=0, help="stop after N cases (0: by time)")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="/tmp/gpumem-fuzz")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    keys = hf_keys()
    configs = []
    for f in sorted(os.listdir(CONFIGS)):
        configs.append((f, json.load(open(os.path.join(CONFIGS, f), encoding="utf-8"))))
    scenarios = [(json.loads(l)["name"], json.loads(l)["scenario"])
                 for l in open(SCENARIOS, encoding="utf-8") if l.strip()]
    runner = Runner(a.bin, a.out, a.timeout)
    r = random.Random(a.seed)
    findings = open(os.path.join(a.out, "findings.jsonl"), "a")
    messages = {}
    counts = {}
    rcs = {}
    t_end = time.time() + a.minutes * 60
    done = 0

    def one(job):
        i, what, args, files = job
        argv, paths, rc, so, se, dt = runner.run(args, files)
        extra = []
        if rc == 0 and "--json" in args:
            extra = followups(runner, random.Random(a.seed * 1000003 + i), args, files, so)
        return i, what, args, files, argv, paths, rc, so, se, dt, extra

    t0 = time.time()
    with ThreadPoolExecutor(a.jobs) as ex:
        while (a.cases and done < a.cases) or (not a.cases and time.time() < t_end):
            batch = []
            for _ in range(a.jobs * 8):
                what, args, files = make_case(r, runner, configs, scenarios, keys, done + len(batch))
                batch.append((done + len(batch), what, args, files))
            for i, what, args, files, argv, paths, rc, so, se, dt, extra in ex.map(one, batch):
                rcs[rc] = rcs.get(rc, 0) + 1
                for kind, detail in check(what, argv, paths, rc, so, se) + extra:
                    key = (kind, detail if kind != "nofield" else re.sub(r"\d+", "N", detail)[:120])
                    counts[key] = counts.get(key, 0) + 1
                    keep = os.path.join(a.out, "case-%d-%d" % (a.seed, i))
                    saved = {}
                    for ph, p in paths.items():
                        shutil.copy(p, keep + ph.replace("@", "-") + ".json")
                        saved[ph] = keep + ph.replace("@", "-") + ".json"
                    findings.write(json.dumps({
                        "seed": a.seed, "case": i, "kind": kind, "detail": detail, "what": what,
                        "args": args, "files": saved, "rc": str(rc), "seconds": round(dt, 2),
                        "stdout": so.decode("utf-8", "replace")[-2000:],
                        "stderr": se.decode("utf-8", "replace")[-2000:]}) + "\n")
                    findings.flush()
                if rc == 2:
                    line = se.decode("utf-8", "replace").splitlines()[0] if se else ""
                    for p in paths.values():
                        line = line.replace(p, "FILE")
                    line = re.sub(r"\d+", "N", line)[:240]
                    messages[line] = messages.get(line, 0) + 1
                for p in paths.values():
                    os.unlink(p)
            done += len(batch)
    with open(os.path.join(a.out, "messages-%d.txt" % a.seed), "w") as f:
        for m, n in sorted(messages.items(), key=lambda x: -x[1]):
            f.write("%6d  %s\n" % (n, m))
    print("seed %d: %d cases in %.0f s; exit codes %s" % (a.seed, done, time.time() - t0,
          dict(sorted(((str(k), v) for k, v in rcs.items())))))
    for (kind, detail), n in sorted(counts.items(), key=lambda x: -x[1]):
        print("  %-10s %5d  %s" % (kind, n, detail[:160]))
    shutil.rmtree(runner.tmp, ignore_errors=True)
    return 1 if counts else 0


if __name__ == "__main__":
    sys.exit(main())
