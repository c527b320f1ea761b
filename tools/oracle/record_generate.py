"""Runs generate.py over the families' cut configs and records each run in
tests/data/oracle/generate.jsonl (the ground truth of `generation_ends_holding_what_the_oracle_holds`).

    python tools/oracle/record_generate.py            # every case below not yet recorded
    python tools/oracle/record_generate.py --dry-run  # print the records instead

Two shapes per family: a 2,048-token prompt for one sequence with two new tokens (the
prefill's peak, the cache as it ends), and 16 sequences of 64 tokens with 24 new ones (a
batch whose cache, states and decode steps weigh more against the weights). SDPA unless the
family's code path is eager (gpt-oss), plus eager runs of a few families and batch-2 runs.

Left out, with why: DeepSeek's configs whose value head dim (128) differs from its query/key
head dim (192): the CPU's SDPA takes its math path for them, where CUDA runs the
memory-efficient kernel (their `-v192` cuts are recorded instead).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = "tests/data/oracle/families"
OUT = "tests/data/oracle/generate.jsonl"
SKIP = {"deepseek-v2-lite-L2", "deepseek-v3-L2-e32"}
EAGER_ONLY = {"gpt-oss-20b-L2"}


def cases():
    names = sorted(f[:-5] for f in os.listdir(os.path.join(ROOT, FAMILIES)) if f.endswith(".json"))
    for n in names:
        if n in SKIP:
            continue
        attn = "eager" if n in EAGER_ONLY else "sdpa"
        path = f"{FAMILIES}/{n}.json"
        yield n, path, attn, 1, 2048, 2
        yield n, path, attn, 16, 64, 24
    for n in ["llama3.1-8b-L4", "qwen3-8b-L4", "gemma-2-9b-L4", "gemma-3-1b-L6", "phi-4-L4"]:
        yield n, f"{FAMILIES}/{n}.json", "eager", 1, 2048, 2
    yield "llama3.1-8b-L4", f"{FAMILIES}/llama3.1-8b-L4.json", "eager", 2, 2048, 2
    yield "gemma-3-1b-L6", f"{FAMILIES}/gemma-3-1b-L6.json", "eager", 2, 2048, 2
    yield "gemma-3-1b-L6", f"{FAMILIES}/gemma-3-1b-L6.json", "sdpa", 2, 2048, 2
    # OLMo 3 and EXAONE 4 beyond their window (the sliding layers' mask; OLMo's second rotary
    # pair).
    yield "olmo3-defaults-L4", f"{FAMILIES}/olmo3-defaults-L4.json", "sdpa", 1, 8192, 2
    yield "exaone4-defaults-L4", f"{FAMILIES}/exaone4-defaults-L4.json", "sdpa", 1, 8192, 2
    # Qwen3-Next with as many key heads as value heads, and narrower values.
    yield "qwen3-next-L4-v16", "tests/data/oracle/generate/qwen3-next-L4-v16.json", "sdpa", 1, 4096, 2


def name_of(n, attn, b, p, new):
    return f"{n} bf16 b={b} prompt={p} generate new_tokens={new} {attn}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    out = os.path.join(ROOT, OUT)
    have = set()
    if os.path.exists(out):
        have = {json.loads(l)["name"] for l in open(out) if l.strip()}
    for n, path, attn, b, p, new in cases():
        name = name_of(n, attn, b, p, new)
        if name in have:
            continue
        cmd = ["python", "tools/oracle/generate.py", "--hf-config", path, "--batch", str(b),
               "--prompt", str(p), "--new-tokens", str(new), "--attn", attn]
        r = subprocess.run([sys.executable] + cmd[1:], cwd=ROOT, capture_output=True, text=True)
        if r.returncode:
            print(f"{name}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
            continue
        o = json.loads(r.stdout.strip().splitlines()[-1])
        cfg = json.load(open(os.path.join(ROOT, path)))
        rec = {
            "name": name,
            "scenario": {
                "model": {"hf_config": cfg}, "batch": b, "seq": p, "mode": "inference",
                "new_tokens": new, "precision": "bf16",
                "attention": "flash" if attn == "sdpa" else "eager",
                "gpu": {"capacity_bytes": 85017493504},
                "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0},
            },
            "expect": {
                "peak_generate": o["peak_generate"],
                "mem_end": o["mem_end"],
                "mem_after_model": o["mem_after_model"],
                # Every tensor the returned cache holds (keys and values, and the
                # linear-attention layers' convolution and recurrent states).
                "kv_cache_bytes": o["cache_state_bytes"],
                "params": o["params"],
            },
            "peak_where": o["peak_where"],
            "command": " ".join(cmd),
            "versions": {"torch": o["torch"], "transformers": o["transformers"]},
            "machine": o["machine"],
            "note": "the families' cut config; greedy generate() whole under FakeTensorMode, no pad or EOS "
                    "token; mem_end: the returned output (the cache and the token ids) with the weights",
        }
        line = json.dumps(rec)
        if a.dry_run:
            print(line)
        else:
            with open(out, "a") as f:
                f.write(line + "\n")
            print(f"{name}: peak {o['peak_generate']}", file=sys.stderr)


if __name__ == "__main__":
    main()
