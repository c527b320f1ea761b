"""The oracle's sharded cases on a real GPU: PyTorch's own allocated and reserved peaks per rank,
and the caching allocator's own trace of each run.

    python3 tools/alloc/gpu_cases.py --only REGEX [--only REGEX ...] --out DIR [--jobs N]
    python3 tools/alloc/gpu_cases.py --pick tools/alloc/gpu_cases.txt --out DIR

Each case of tests/data/oracle/sharded.jsonl whose name matches is run with its recorded
command, `--device cpu --fake` replaced by `--device cuda` (real tensors on the GPU, PyTorch's
fake process group as before: collectives do nothing, every buffer is allocated), and
`--alloc-trace` (tools/oracle/oracle.py): the record gets `cuda_peak_step`
(`max_memory_allocated` over the last step, from an empty device), `cuda_peak_reserved`
(`max_memory_reserved`) and `cuda_stats`, and DIR/traces/NAME.txt the allocator's trace.
Cases of the 8B model run one at a time after the others (they need the GPU's memory);
the others run N at a time (default 4; each process has its own allocator).

Output: DIR/cuda.jsonl, one line per case: `name`, `command`, `oracle` (the oracle's JSON
record, or `error` with the last lines of stderr), `versions`, `machine`.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CASES = os.path.join(ROOT, "tests", "data", "oracle", "sharded.jsonl")


def safe(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def command(rec, trace):
    c = rec["command"].replace("--device cpu --fake", "--device cuda")
    assert "--fake" not in c and "--device cuda" in c, c
    c = c.replace("python tools/oracle/oracle.py", f"{sys.executable} tools/oracle/oracle.py")
    return c + f" --alloc-trace {trace}"


def run(rec, out_dir, conf):
    tag = " [" + conf + "]" if conf else ""
    trace = os.path.join(out_dir, "traces", safe(rec["name"] + tag) + ".txt")
    cmd = command(rec, trace)
    t0 = time.time()
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
    p = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, env=env)
    row = {"name": rec["name"], "alloc_conf": conf, "command": cmd.replace(sys.executable, "python3")
           .replace(out_dir, "OUT"), "wall_s": round(time.time() - t0, 1)}
    line = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode == 0 and line:
        row["oracle"] = json.loads(line[-1])
    else:
        row["error"] = (p.stderr or p.stdout)[-3000:]
    print(rec["name"], row.get("wall_s"), "ok" if "oracle" in row else "FAILED", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--pick", help="a file of --only regexes, one a line")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--alloc-conf", default="",
                    help="PYTORCH_CUDA_ALLOC_CONF for the runs (recorded as `alloc_conf`)")
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "traces"), exist_ok=True)
    if a.pick:
        a.only += [x.strip() for x in open(a.pick) if x.strip()]
    recs = [json.loads(x) for x in open(CASES)]
    pick = [r for r in recs if any(re.search(o, r["name"]) for o in a.only)]
    big = [r for r in pick if r["name"].startswith("llama3.1-8b")]
    small = [r for r in pick if r not in big]
    import torch
    import transformers
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "cuda": torch.version.cuda}
    machine = f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores, Linux {platform.release()}"
    out = open(os.path.join(a.out, "cuda.jsonl"), "a")

    def keep(row):
        row["versions"] = versions
        row["machine"] = machine
        out.write(json.dumps(row) + "\n")
        out.flush()

    with ThreadPoolExecutor(a.jobs) as ex:
        for f in as_completed([ex.submit(run, r, a.out, a.alloc_conf) for r in small]):
            keep(f.result())
    for r in big:
        keep(run(r, a.out, a.alloc_conf))


if __name__ == "__main__":
    main()
