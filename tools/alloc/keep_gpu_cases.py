"""Keep what tools/alloc/gpu_cases.py measured as test data.

    python3 tools/alloc/keep_gpu_cases.py DIR [DIR ...]

(a later DIR's run of a case replaces an earlier DIR's). DIR holds gpu_cases.py's output (cuda.jsonl and traces/). Appends to
  tests/data/oracle/cuda.jsonl          one line per case that ran: `name`, `alloc_conf`,
                                        `command`, `measured` (bytes; below), `versions`,
                                        `machine`
  tests/data/oracle/cuda-failed.jsonl   one line per case that failed: `name`, `command`, `error`
  tests/data/oracle/cuda-validation.jsonl  the runs as `gpumem::validation` cases (rewritten)
and rewrites tests/data/oracle/cuda-traces.txt.gz with every kept case's allocator trace, in a
compact form: `= NAME [ALLOC_CONF]` starts a case, then one event a line:
  a BYTES STREAM SEG OFFSET
                   an allocation of BYTES (as requested) on STREAM (0: the default stream, then
                   1, 2, ... in order of first use), placed by PyTorch at OFFSET bytes into the
                   SEG-th segment it took (from 0); under expandable segments, `a BYTES STREAM`
  f K              the K-th allocation of the case (from 0) is back in its pool
  s BYTES STREAM ADDRESS
                   PyTorch took a segment (cudaMalloc) of BYTES for STREAM at ADDRESS (what the
                   replay must reproduce, kept to compare)
  m BYTES STREAM   (expandable segments) BYTES of pages mapped for STREAM's segment; `u`: unmapped
  # step N         the oracle's step N starts (peak statistics reset)

`measured`: `peak_step` (`torch.cuda.max_memory_allocated()` over the last step, less the
empty device's), `peaks` (each step's), `peak_reserved` (`torch.cuda.max_memory_reserved()` at
the end: the run's reserved peak, as nothing empties the cache), `segments`
(`segment.all.current`), `alloc_retries`, `tracker_peak_step` (the oracle's own live-tensor
tracker on the same run).
"""
import gzip
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "oracle")


def safe(name):
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def compact(path):
    ids, streams, out, n = {}, {0: 0}, [], 0
    segs = []  # (address, bytes, index in the order taken), sorted by address
    import bisect

    def where(addr):
        i = bisect.bisect_right(segs, (addr, float("inf"))) - 1
        b, size, k = segs[i]
        assert b <= addr < b + size, (path, addr)
        return k, addr - b
    for line in open(path):
        p = line.split()
        if not p:
            continue
        if p[0] == "#":
            out.append(line.rstrip("\n"))
        elif p[0] in ("a", "s"):
            st = streams.setdefault(int(p[3]), len(streams))
            if p[0] == "a":
                ids[p[1]] = n
                n += 1
                if segs:
                    k, off = where(int(p[1]))
                    out.append(f"a {p[2]} {st} {k} {off}")
                else:
                    # expandable segments: no segments taken, pages mapped (`m`)
                    out.append(f"a {p[2]} {st}")
            else:
                bisect.insort(segs, (int(p[1]), int(p[2]), len(segs)))
                out.append(f"s {p[2]} {st} {p[1]}")
        elif p[0] == "f":
            out.append(f"f {ids.pop(p[1])}")
        elif p[0] in ("segment_map", "segment_unmap"):
            st = streams.setdefault(int(p[3]), len(streams))
            out.append(f"{'m' if p[0] == 'segment_map' else 'u'} {p[2]} {st}")
        elif p[0] == "S":
            raise SystemExit(f"{path}: a segment was released mid-run")
        else:
            raise SystemExit(f"{path}: {p[0]} events are not kept")
    return out


def main():
    """Every DIR's runs, a later DIR's run of a case replacing an earlier one's; cases already
    kept are kept as they are."""
    runs, tpath = {}, os.path.join(OUT, "cuda-traces.txt.gz")
    for d in sys.argv[1:]:
        for r in map(json.loads, open(os.path.join(d, "cuda.jsonl"))):
            runs[(r["name"], r.get("alloc_conf", ""))] = (d, r)
    have, traces = set(), []
    if os.path.exists(os.path.join(OUT, "cuda.jsonl")):
        have = {(r["name"], r["alloc_conf"]) for r in map(json.loads, open(os.path.join(OUT, "cuda.jsonl")))}
    if os.path.exists(tpath):
        traces = gzip.open(tpath, "rt").read().splitlines()
    kept, failed = [], []
    for (name, conf), (d, r) in runs.items():
        if (name, conf) in have:
            continue
        if "error" in r:
            failed.append({k: r[k] for k in ("name", "command", "error")})
            continue
        o = r["oracle"]
        st = o["cuda_stats"]
        kept.append({
            "name": name, "alloc_conf": conf, "command": r["command"],
            "measured": {
                "peak_step": o["cuda_peak_step"], "peaks": o["cuda_peaks"],
                "peak_reserved": o["cuda_peak_reserved"],
                "segments": st["segment.all.current"],
                "alloc_retries": st["num_alloc_retries"],
                "tracker_peak_step": o["peak_step"],
            },
            "versions": r["versions"], "machine": r["machine"],
        })
        tag = " [" + conf + "]" if conf else ""
        traces.append(f"= {name}{tag}")
        traces += compact(os.path.join(d, "traces", safe(name + tag) + ".txt"))
    with open(os.path.join(OUT, "cuda.jsonl"), "a") as f:
        for r in kept:
            f.write(json.dumps(r) + "\n")
    if failed:
        with open(os.path.join(OUT, "cuda-failed.jsonl"), "a") as f:
            for r in failed:
                f.write(json.dumps(r) + "\n")
    with gzip.GzipFile(tpath, "wb", mtime=0) as f:
        f.write(("\n".join(traces) + "\n").encode())
    print(f"kept {len(kept)}, failed {len(failed)}")
    write_validation()


# Runs that measured something of the oracle's own, not of the layout: left out of
# cuda-validation.jsonl, with the reason.
ARTIFACTS = {
    r"^llama-2b pp_fsdp .* s1 ": (
        "the oracle's PP set-up (before its fix) kept the full-size LM head weight alive on the "
        "last stage beside FSDP's shards: its loop variable held the model's last parameter "
        "(allocation 88 of the trace, alive from the model's creation to the end)"),
}


def write_validation():
    """cuda-validation.jsonl: each run with the default allocator as a case of
    `gpumem::validation` (the oracle case's `layout` and `scenario`; `expect.peak_step` what
    the GPU measured, which counts cuBLAS's workspaces: `expect.cublas_workspaces`)."""
    oracle = {r["name"]: r for r in map(json.loads, open(os.path.join(OUT, "sharded.jsonl")))}
    with open(os.path.join(OUT, "cuda-validation.jsonl"), "w") as f:
        for r in map(json.loads, open(os.path.join(OUT, "cuda.jsonl"))):
            if r["alloc_conf"] or any(re.search(a, r["name"]) for a in ARTIFACTS):
                continue
            o = oracle[r["name"]]
            expect = {"peak_step": r["measured"]["peak_step"], "params": o["expect"]["params"],
                      "cublas_workspaces": True}
            if "stage" in o["expect"]:
                expect["stage"] = o["expect"]["stage"]
            f.write(json.dumps({"name": r["name"], "layout": o["layout"], "scenario": o["scenario"],
                                "expect": expect, "command": r["command"],
                                "versions": r["versions"], "machine": r["machine"]}) + "\n")


if __name__ == "__main__":
    main()
