"""Run the oracle over a matrix of sharded layouts and write gpumem test data.

  python tools/oracle/run_cases.py                       # every case missing from the output
  python tools/oracle/run_cases.py --only 'pp .* s0'     # cases whose name matches a regex
  python tools/oracle/run_cases.py --list                # print the case names and commands
  python tools/oracle/run_cases.py --calibration         # single-GPU runs vs the H100 data
  python tools/oracle/run_cases.py --accum               # single-GPU gradient accumulation

Run from the repository root with the oracle's venv (ORACLE_VENV, default
~/.cache/gpumem-oracle). One oracle process at a time (each uses FakeTensorMode: nothing is
computed). Output (appended; a case already in the output is skipped unless --redo):
  tests/data/oracle/sharded.jsonl         name, scenario (gpumem's JSON), expect, command,
                                          versions, machine, notes
  tests/data/oracle/sharded-detail.jsonl  name, where the peak is and what is alive there
  tests/data/oracle/sharded-failed.jsonl  name, command, the error's last lines
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ORACLE = "tools/oracle/oracle.py"
CONFIGS = "tools/oracle/configs"
OUT_DIR = "tests/data/oracle"
H100_BYTES = 85017493504

MODELS = {
    "llama-2b": "llama-2b.json",          # dense Llama-style: h2048, 8 layers, 16 heads / 4 kv
    "llama3.1-8b": "llama3.1-8b.json",    # the real Llama-3.1-8B config
    "qwen2.5-0.5b": "qwen2.5-0.5b.json",  # the real Qwen2.5-0.5B config (q/k/v bias, tied)
    "qwen2-1b": "qwen2-style-1b.json",    # Qwen2-style (bias, tied) with 16 heads / 8 kv: tp 8
    "mixtral-small": "mixtral-small.json",  # Mixtral-style MoE: h1024, 8 experts, top-2, 4 layers
    # Gemma 3 12B's multimodal wrapper (SigLIP tower + projector) with its decoder cut to 6
    # layers: the config tools/oracle/families.py wrote
    "gemma3-wrap": "../../../tests/data/oracle/families/gemma-3-12b-wrapper-L6.json",
}
# The families' cut configs (tools/oracle/families.py), each model type under FSDP2 too
# (MLA's variants with v_head_dim 192 keep CPU SDPA off its math path, as families.py's do.)
FAMILIES = ["qwen3-8b-L4", "qwen3-30b-a3b-L2", "qwen3-next-80b-a3b-L4", "gemma-2-9b-L4",
            "gemma-3-1b-L6", "gpt-oss-20b-L2", "deepseek-v2-lite-L2-v192",
            "deepseek-v3-L2-e32-v192", "glm-4.5-air-L2", "phi-4-L4", "olmo-2-7b-L4",
            "command-r7b-L4", "llama4-scout-text-L2", "minimax-m2-defaults-L2-e32",
            "starcoder2-7b-L4-nodrop", "smollm3-3b-L4", "falcon-7b-L4", "pythia-1b-L4",
            "olmoe-defaults-L2", "qwen3.5-defaults-L4", "qwen3.5-moe-defaults-L2",
            "ministral3-defaults-L4"]
for _f in ("qwen2.5-7b-L4", "mistral-7b-v0.1-L4"):
    MODELS[_f] = f"../../../tests/data/oracle/families/{_f}.json"
# softcapped or sink attention: transformers runs it eager
EAGER = {"gemma-2-9b-L4", "gpt-oss-20b-L2"}
# gpt-oss at 1,024 tokens: at 2,048 an FSDP rank's peak falls in the eager softmax's backward,
# where CUDA's kernel makes a grad x output temporary of the scores' size that the CPU's does
# not (the engine, which follows CUDA, read 3.8 % above the CPU's peak)
SEQ = {"gpt-oss-20b-L2": "1x1024", "falcon-7b-L4": "1x512"}
for _f in FAMILIES:
    MODELS[_f] = f"../../../tests/data/oracle/families/{_f}.json"

FSDP_LAYOUTS = ("fsdp", "fsdp_tp", "hsdp", "pp_fsdp", "fsdp_cp")

# cases expected to fail, with the reason (written beside the error in sharded-failed.jsonl)
KNOWN_FAILURES = {
    r"^mixtral-small .* mixed ": (
        "torch._grouped_mm's meta kernel (what FakeTensorMode runs) accepts only bf16 inputs; under "
        "autocast over fp32 parameters transformers' grouped_mm experts pass fp32. The single layout "
        "fails the same way (the H100 ran that Mixtral amp case), so this is a meta-kernel limit, "
        "not an EP one."),
}


# ---------------------------------------------------------------------------------------------
# the case matrix
# ---------------------------------------------------------------------------------------------
def case(model, layout, bs="1x4096", prec="bf16", ck=0, **kw):
    b, s = (int(x) for x in bs.split("x"))
    c = {"model": model, "layout": layout, "batch": b, "seq": s, "precision": prec, "ckpt": ck}
    c.update(kw)
    return c


def matrix():
    C = []
    L2, L8, Q05, QT, MX = "llama-2b", "llama3.1-8b", "qwen2.5-0.5b", "qwen2-1b", "mixtral-small"
    # single-GPU references (the same models and sizes, world 1)
    for m, bs, ck in [(L2, "1x4096", 0), (L2, "1x4096", 1), (L2, "2x2048", 0), (L2, "1x8192", 0),
                      (Q05, "2x2048", 0), (QT, "1x4096", 0), (MX, "2x2048", 0), (L8, "1x4096", 1)]:
        C.append(case(m, "single", bs, ck=ck))
    C.append(case(L2, "single", prec="mixed"))
    # --- FSDP2 -----------------------------------------------------------------------------
    for w in (2, 4, 8, 16, 64):
        C.append(case(L2, "fsdp", world=w, reshard=1, wrap="layers"))
    for rs in (1, 0):
        for wrap in ("layers", "titan"):
            for prec in ("bf16", "mixed"):
                for ck in (0, 1):
                    C.append(case(L2, "fsdp", prec=prec, ck=ck, world=8, reshard=rs, wrap=wrap))
    for w in (4, 64):
        for rs, wrap in ((0, "layers"), (1, "titan"), (0, "titan")):
            C.append(case(L2, "fsdp", world=w, reshard=rs, wrap=wrap))
    for bs in ("2x2048", "1x8192"):
        for ck in (0, 1):
            C.append(case(L2, "fsdp", bs, ck=ck, world=8, reshard=1, wrap="layers"))
    for w in (8, 16, 64):
        C.append(case(L8, "fsdp", ck=1, world=w, reshard=1, wrap="layers"))
    C.append(case(L8, "fsdp", ck=0, world=8, reshard=1, wrap="layers"))
    C.append(case(L8, "fsdp", prec="mixed", ck=1, world=8, reshard=1, wrap="titan"))
    C.append(case(L8, "fsdp", ck=1, world=8, reshard=0, wrap="titan"))
    for w in (2, 8, 64):
        C.append(case(Q05, "fsdp", "2x2048", world=w, reshard=1, wrap="layers"))
    C.append(case(Q05, "fsdp", "2x2048", world=8, reshard=1, wrap="titan"))
    C.append(case(Q05, "fsdp", "2x2048", world=8, reshard=0, wrap="layers"))
    C.append(case(Q05, "fsdp", "2x2048", prec="mixed", world=8, reshard=1, wrap="layers"))
    C.append(case(Q05, "fsdp", "2x2048", ck=1, world=8, reshard=1, wrap="layers"))
    for w in (4, 8):
        C.append(case(MX, "fsdp", "2x2048", world=w, reshard=1, wrap="layers"))
    C.append(case(MX, "fsdp", "2x2048", prec="mixed", world=8, reshard=1, wrap="titan"))
    # A multimodal wrapper: the vision tower sits in the root's group, never run by text
    GW = "gemma3-wrap"
    C.append(case(GW, "fsdp", "1x1024", world=4, reshard=1, wrap="layers"))
    C.append(case(GW, "fsdp", "1x2048", ck=1, world=8, reshard=1, wrap="layers"))
    C.append(case(GW, "fsdp", "1x2048", prec="mixed", world=8, reshard=1, wrap="layers"))
    C.append(case(GW, "fsdp", "1x2048", world=4, reshard=0, wrap="layers"))
    C.append(case(GW, "fsdp", "1x2048", world=8, reshard=1, wrap="titan"))
    C.append(case(GW, "fsdp", "1x2048", prec="mixed", ck=1, world=8, reshard=0, wrap="titan"))
    C.append(case(GW, "hsdp", "1x2048", world=16, shard=4, reshard=1, wrap="layers"))
    C.append(case(GW, "tp", "1x2048", world=2, tp=2, sp=0, loss_parallel=1))
    C.append(case(GW, "fsdp_tp", "1x2048", world=8, tp=2, sp=0, loss_parallel=1, reshard=1,
                  wrap="layers"))
    # Every family's layers under FSDP2 (one rank of 8), and a few under torchtitan's wrap
    # with fp32 parameters
    for f in FAMILIES:
        kw = {"attn": "eager"} if f in EAGER else {}
        C.append(case(f, "fsdp", SEQ.get(f, "1x2048"), world=8, reshard=1, wrap="layers", **kw))
    for f in ("qwen3-30b-a3b-L2", "gemma-3-1b-L6", "deepseek-v2-lite-L2-v192"):
        C.append(case(f, "fsdp", "1x2048", prec="mixed", ck=1, world=8, reshard=1, wrap="titan"))
    # Dense families under DTensor's tensor parallelism (the Llama plan's module names)
    for f, sp in (("qwen3-8b-L4", 1), ("smollm3-3b-L4", 1),
                  ("qwen2.5-7b-L4", 1), ("mistral-7b-v0.1-L4", 1)):
        C.append(case(f, "tp", "1x2048", world=2, tp=2, sp=sp, loss_parallel=1))
    # --- DDP ---------------------------------------------------------------------------------
    for w in (2, 8):
        C.append(case(L2, "ddp", world=w))
    C.append(case(L2, "ddp", ck=1, world=8))
    C.append(case(L2, "ddp", prec="mixed", world=8))
    C.append(case(Q05, "ddp", "2x2048", world=4))
    C.append(case(MX, "ddp", "2x2048", world=4))
    # --- HSDP --------------------------------------------------------------------------------
    for w, sh in ((16, 4), (16, 8), (64, 8)):
        C.append(case(L2, "hsdp", world=w, shard=sh, reshard=1, wrap="layers"))
    C.append(case(L2, "hsdp", world=16, shard=8, reshard=0, wrap="layers"))
    C.append(case(L2, "hsdp", prec="mixed", world=16, shard=8, reshard=1, wrap="titan"))
    C.append(case(L2, "hsdp", ck=1, world=32, shard=4, reshard=1, wrap="layers"))
    C.append(case(L8, "hsdp", ck=1, world=16, shard=8, reshard=1, wrap="layers"))
    # --- TP (torchtitan's Llama plan) --------------------------------------------------------
    for tp in (2, 4):
        for sp in (1, 0):
            for lp in (1, 0):
                C.append(case(L2, "tp", world=tp, tp=tp, sp=sp, loss_parallel=lp))
    C.append(case(L2, "tp", ck=1, world=4, tp=4, sp=1, loss_parallel=1))
    C.append(case(L2, "tp", "2x2048", world=4, tp=4, sp=1, loss_parallel=1))
    C.append(case(L2, "tp", prec="mixed", world=2, tp=2, sp=1, loss_parallel=1))
    for tp in (2, 4, 8):
        C.append(case(L8, "tp", ck=1, world=tp, tp=tp, sp=1, loss_parallel=1))
    C.append(case(L8, "tp", ck=1, world=8, tp=8, sp=0, loss_parallel=0))
    for tp in (2, 4, 8):
        for sp in (1, 0):
            C.append(case(QT, "tp", world=tp, tp=tp, sp=sp, loss_parallel=1))
    C.append(case(QT, "tp", world=8, tp=8, sp=1, loss_parallel=0))
    # --- FSDP × TP ---------------------------------------------------------------------------
    C.append(case(L2, "fsdp_tp", world=8, tp=2, sp=1, loss_parallel=1, reshard=1, wrap="layers"))
    C.append(case(L2, "fsdp_tp", world=8, tp=2, sp=0, loss_parallel=0, reshard=1, wrap="layers"))
    C.append(case(L2, "fsdp_tp", world=16, tp=4, sp=1, loss_parallel=1, reshard=1, wrap="layers"))
    C.append(case(L2, "fsdp_tp", world=16, tp=4, sp=1, loss_parallel=1, reshard=0, wrap="titan"))
    C.append(case(L2, "fsdp_tp", prec="mixed", ck=1, world=16, tp=4, sp=1, loss_parallel=1,
                  reshard=1, wrap="layers"))
    C.append(case(L2, "fsdp_tp", world=64, tp=4, sp=1, loss_parallel=1, reshard=1, wrap="layers"))
    C.append(case(L8, "fsdp_tp", ck=1, world=16, tp=8, sp=1, loss_parallel=1, reshard=1,
                  wrap="layers"))
    C.append(case(L8, "fsdp_tp", ck=1, world=64, tp=8, sp=1, loss_parallel=1, reshard=1,
                  wrap="titan"))
    C.append(case(QT, "fsdp_tp", world=8, tp=4, sp=1, loss_parallel=1, reshard=1, wrap="layers"))
    # --- PP (torch.distributed.pipelining) ---------------------------------------------------
    for st in (0, 1, 3):
        C.append(case(L2, "pp", pp=4, microbatches=4, stage=st, schedule="1f1b"))
    for st in (0, 3):
        C.append(case(L2, "pp", pp=4, microbatches=8, stage=st, schedule="1f1b"))
    for st in (0, 1):
        for m in (2, 4):
            C.append(case(L2, "pp", pp=2, microbatches=m, stage=st, schedule="1f1b"))
    for st in (0, 1, 3):
        C.append(case(L2, "pp", pp=4, microbatches=4, stage=st, schedule="gpipe"))
    for st in (0, 1, 3):
        C.append(case(L2, "pp", pp=4, microbatches=4, stage=st, schedule="interleaved",
                      virtual_stages=2))
    for st in (0, 3):
        C.append(case(L2, "pp", pp=4, microbatches=8, stage=st, schedule="interleaved",
                      virtual_stages=2))
    for st in (0, 3):
        C.append(case(L2, "pp", ck=1, pp=4, microbatches=4, stage=st, schedule="1f1b"))
        C.append(case(L2, "pp", prec="mixed", pp=4, microbatches=4, stage=st, schedule="1f1b"))
        C.append(case(L2, "pp", "2x2048", pp=4, microbatches=4, stage=st, schedule="1f1b"))
    for st in (0, 1, 3):
        C.append(case(L8, "pp", ck=1, pp=4, microbatches=8, stage=st, schedule="1f1b"))
    for st in (0, 7):
        C.append(case(L8, "pp", ck=1, pp=8, microbatches=8, stage=st, schedule="interleaved",
                      virtual_stages=2))
    for st in (0, 3):
        C.append(case(Q05, "pp", "2x2048", pp=4, microbatches=4, stage=st, schedule="1f1b"))
    for st in (0, 1):
        C.append(case(MX, "pp", "2x2048", pp=2, microbatches=2, stage=st, schedule="1f1b"))
    # --- PP × FSDP ---------------------------------------------------------------------------
    for st in (0, 1):
        for rs in (0, 1):
            C.append(case(L2, "pp_fsdp", world=8, pp=2, microbatches=4, stage=st,
                          schedule="1f1b", reshard=rs, wrap="layers"))
        C.append(case(L2, "pp_fsdp", prec="mixed", world=8, pp=2, microbatches=4, stage=st,
                      schedule="1f1b", reshard=0, wrap="titan"))
        C.append(case(L2, "pp_fsdp", world=8, pp=2, microbatches=4, stage=st,
                      schedule="interleaved", virtual_stages=2, reshard=0, wrap="layers"))
    for st in (0, 3):
        C.append(case(L8, "pp_fsdp", ck=1, world=32, pp=4, microbatches=8, stage=st,
                      schedule="1f1b", reshard=0, wrap="layers"))
    # --- CP (ring attention) -----------------------------------------------------------------
    for cp in (2, 4, 8):
        C.append(case(L2, "cp", "1x8192", cp=cp))
    C.append(case(L2, "cp", "1x8192", cp=4, cp_rotate="alltoall"))
    C.append(case(L2, "cp", "1x8192", ck=1, cp=4))
    C.append(case(L2, "cp", "1x8192", cp=4, rank=3))
    C.append(case(L2, "cp", "1x8192", cp=4, cp_load_balance=0))
    C.append(case(L2, "cp", "1x4096", cp=2))
    C.append(case(Q05, "cp", "1x8192", cp=2))
    for w, cp in ((8, 2), (8, 4), (16, 8)):
        C.append(case(L2, "fsdp_cp", "1x8192", world=w, cp=cp, reshard=1, wrap="layers"))
    C.append(case(L2, "fsdp_cp", "1x8192", prec="mixed", world=8, cp=4, reshard=1, wrap="titan"))
    C.append(case(L8, "fsdp_cp", "1x8192", ck=1, world=8, cp=4, reshard=1, wrap="layers"))
    # --- EP ----------------------------------------------------------------------------------
    for ep in (2, 4, 8):
        C.append(case(MX, "ep", "2x2048", ep=ep, ep_impl="hf"))
    C.append(case(MX, "ep", "2x2048", ck=1, ep=4, ep_impl="hf"))
    C.append(case(MX, "ep", "2x2048", prec="mixed", ep=4, ep_impl="hf"))
    C.append(case(MX, "ep", "1x4096", ep=8, ep_impl="hf"))
    for ep in (2, 4, 8):
        C.append(case(MX, "ep", "2x2048", ep=ep, ep_impl="titan"))
    C.append(case(MX, "ep", "2x2048", ck=1, ep=4, ep_impl="titan"))
    # Dense families' cut configs under ring attention (mask-free causal SDPA only)
    for f in ("qwen3-8b-L4", "smollm3-3b-L4", "phi-4-L4"):
        C.append(case(f, "cp", "1x8192", cp=4))
    C.append(case("qwen3-8b-L4", "fsdp_cp", "1x8192", world=8, cp=2, reshard=1, wrap="layers"))
    # A Qwen3 cut config through a 1F1B pipeline (both stages)
    for st in (0, 1):
        C.append(case("qwen3-8b-L4", "pp", "1x2048", pp=2, microbatches=4, stage=st,
                      schedule="1f1b"))
    # Other MoE families' cut configs under transformers' own EP plan (ep_titan.py reads
    # Mixtral's block attributes)
    for f in ("qwen3-30b-a3b-L2", "glm-4.5-air-L2"):
        C.append(case(f, "ep", "1x2048", ep=4, ep_impl="hf"))
    return C


def case_name(c):
    p = [c["model"], c["layout"]]
    L = c["layout"]
    if "world" in c and L not in ("tp",):
        p.append(f"w{c['world']}")
    if L == "hsdp":
        p.append(f"shard{c['shard']}")
    if c.get("tp", 1) > 1:
        p.append(f"tp{c['tp']} sp{c['sp']} lp{c['loss_parallel']}")
    if L in ("pp", "pp_fsdp"):
        v = f"v{c['virtual_stages']}" if c["schedule"] == "interleaved" else ""
        p.append(f"pp{c['pp']} {c['schedule']}{v} m{c['microbatches']} s{c['stage']}")
    if c.get("cp", 1) > 1:
        p.append(f"cp{c['cp']}" + ("" if c.get("cp_rotate", "allgather") == "allgather" else " a2a")
                 + ("" if c.get("cp_load_balance", 1) else " nolb")
                 + (f" r{c['rank']}" if "rank" in c else ""))
    if L == "ep":
        p.append(f"ep{c['ep']} {c['ep_impl']}")
    if L in FSDP_LAYOUTS:
        p.append(f"rs{c['reshard']} {c['wrap']}")
    p.append(c["precision"])
    if c.get("attn") == "eager":
        p.append("eager")
    p.append(f"ck{c['ckpt']}")
    p.append(f"b{c['batch']}s{c['seq']}")
    return " ".join(p)


FLAGS = ["layout", "world", "rank", "tp", "shard", "pp", "microbatches", "stage", "schedule",
         "virtual_stages", "cp", "cp_rotate", "cp_load_balance", "ep", "ep_impl", "reshard",
         "wrap", "sp", "loss_parallel", "precision", "ckpt", "batch", "seq", "grad_accum",
         "accum_drop_output", "attn"]


def command(c):
    args = ["python", ORACLE, "--device", "cpu", "--fake", "--shapes", "1"]
    for k in FLAGS:
        if k in c:
            args += ["--" + k.replace("_", "-"), str(c[k])]
    args += ["--hf-config", f"{CONFIGS}/{MODELS[c['model']]}"]
    return args


# ---------------------------------------------------------------------------------------------
# gpumem scenario
# ---------------------------------------------------------------------------------------------
def scenario(c, cfg, rec):
    L = c["layout"]
    fsdp = L in FSDP_LAYOUTS
    prec = {"bf16": "bf16", "fp32": "fp32"}.get(c["precision"])
    if c["precision"] == "mixed":
        prec = "mixed-bf16" if fsdp else "amp-bf16"
    dims = rec.get("dims") or {"dp": rec.get("dp", 1), "tp": c.get("tp", 1)}
    par = {"framework": "fsdp", "dp": dims.get("dp", 1), "tp": dims.get("tp", 1),
           "pp": dims.get("pp", 1), "cp": dims.get("cp", 1), "ep": dims.get("ep", 1),
           "zero": (3 if c["reshard"] else 2) if fsdp else 0}
    if fsdp:
        par["wrap"] = c["wrap"]
    if par["tp"] > 1:
        par["sp"] = bool(c["sp"])
        par["loss_parallel"] = bool(c["loss_parallel"])
    if L == "hsdp":
        par["shard_group"] = c["shard"]
    if par["pp"] > 1:
        par["grad_accum"] = c["microbatches"]
        par["schedule"] = c["schedule"]
        if c["schedule"] == "interleaved":
            par["virtual_stages"] = c["virtual_stages"]
    if L == "ep":
        par["ep_impl"] = c["ep_impl"]
    if L in ("cp", "fsdp_cp"):
        par["cp_rotate"] = c.get("cp_rotate", "allgather")
        par["cp_load_balance"] = bool(c.get("cp_load_balance", 1))
    return {"model": {"hf_config": cfg}, "batch": c["batch"], "seq": c["seq"], "mode": "train",
            "precision": prec, "optimizer": "adamw",
            "recompute": "full" if c["ckpt"] else "none",
            "attention": "eager" if c.get("attn") == "eager" else "flash",
            "finetune": "full", "gpu": {"capacity_bytes": H100_BYTES}, "parallel": par}


def notes(c, rec):
    L = c["layout"]
    n = []
    if c["precision"] == "mixed" and L not in FSDP_LAYOUTS:
        n.append("autocast over fp32 parameters: CPU autocast casts a different op list than "
                 "CUDA autocast (shared/oracle README); treat the activation terms with care")
    if L == "ddp":
        n.append("DDP's all-reduce is an in-place no-op comm hook (the fake process group's "
                 "future carries no tensor) and the bucket rebuild after the first iteration "
                 "is skipped (it reads back a broadcast index tensor): one bucket per dtype "
                 "holding every gradient, the same bytes as the rebuilt 25 MiB buckets up to "
                 "512 B per bucket")
    if L in ("cp", "fsdp_cp"):
        n.append("CP's handlers exist only for the CUDA SDPA ops; inside the CP region SDPA is "
                 "aten._scaled_dot_product_flash_attention (the op an H100 runs for bf16 causal "
                 "attention) on CPU fake tensors (its meta kernel): the ring-attention code is "
                 "PyTorch's; flash's in-kernel workspaces are not visible")
    if L == "ep" and c["ep_impl"] == "hf":
        n.append("transformers 5.17's own EP plan (base_model_ep_plan): experts sharded E/ep "
                 "per rank, router replicated, tokens of non-local experts masked to a "
                 "sentinel, expert output all-reduced; every EP rank sees the same batch "
                 "(no all-to-all)")
    if L == "ep" and c["ep_impl"] == "titan":
        n.append("torchtitan's EP scheme re-implemented in tools/oracle/ep_titan.py (not an "
                 "upstream API): all-to-all token dispatch/combine, E/ep experts per rank, "
                 "each EP rank its own micro-batch, routing assumed perfectly balanced (R = "
                 "T*top_k rows received), dense weights replicated and their gradient "
                 "reduction (FSDP/DDP) not applied")
    if L in ("pp", "pp_fsdp"):
        n.append("stage split: even layer split (remainder on the last stage), embedding on "
                 "the first, norm + lm_head + HF ForCausalLMLoss on the last; "
                 "schedule.step(return_outputs=False) as torchtitan; expect.stage is the pp "
                 "rank measured (interleaved: it holds stages r, r+pp, ...); batch is the "
                 "micro-batch size, grad_accum the micro-batches per step")
    if c["model"] in ("qwen2.5-0.5b", "qwen2-1b") and L in ("pp", "pp_fsdp"):
        n.append("tied embeddings: the first stage holds embed_tokens, the last lm_head (the "
                 "same tensor on one GPU, a separate copy per stage under PP)")
    if c["model"] == "mixtral-small":
        n.append("MoE experts run transformers' default grouped_mm implementation (as the H100 "
                 "calibration runs did); the token count per expert does not change any buffer "
                 "size in that path")
    return n


# ---------------------------------------------------------------------------------------------
def machine():
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    osname = platform.system() + " " + platform.release()
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname += ", " + line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {osname}"


def done_names(path):
    out = set()
    if os.path.exists(path):
        for line in open(path):
            if line.strip():
                out.add(json.loads(line)["name"])
    return out


def run_one(py, c, timeout):
    cmd = command(c)
    t = time.time()
    p = subprocess.run([py] + cmd[1:], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    dt = time.time() - t
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        err = [x for x in (p.stderr or "").splitlines() if x.strip()][-12:]
        return None, cmd, err, dt
    return json.loads(lines[-1]), cmd, None, dt


def shorten_detail(rec):
    keep = ["peak_step", "peak_first_step", "peaks", "peak_op", "peak_where", "peak_breakdown",
            "peak_labels", "layer_fwd_deltas", "per_layer_saved", "mem_after_model",
            "mem_start_of_step", "mem_after_forward", "peak_forward", "mem_after_backward",
            "mem_end_of_step", "params", "stage_params", "stage_ids", "stage_layers", "n_stages",
            "microbatches", "pp_timeline", "world", "rank", "dims", "step_s", "wall_s"]
    d = {k: rec[k] for k in keep if k in rec}
    if "peak_tensors" in rec:
        d["peak_tensors"] = rec["peak_tensors"][:50]
    return d


# ---------------------------------------------------------------------------------------------
# gradient accumulation on one GPU (--accum -> accum.jsonl)
# ---------------------------------------------------------------------------------------------
def accum_matrix():
    """Single layout with --grad-accum: a plain loop of N micro-batches (forward, loss / N,
    backward) then AdamW(fused).step() and zero_grad(set_to_none=True)."""
    C = []
    L2, Q05 = "llama-2b", "qwen2.5-0.5b"
    for prec in ("bf16", "mixed"):
        for ck in (0, 1):
            for ga in (2, 4):
                C.append(case(L2, "single", "1x4096", prec=prec, ck=ck, grad_accum=ga))
    for prec, ck in (("bf16", 0), ("bf16", 1), ("mixed", 0)):
        C.append(case(L2, "single", "2x2048", prec=prec, ck=ck, grad_accum=2))
    for ck in (0, 1):
        for ga in (2, 4):
            C.append(case(Q05, "single", "2x2048", ck=ck, grad_accum=ga))
    C.append(case(Q05, "single", "2x2048", prec="mixed", grad_accum=2))
    C.append(case(Q05, "single", "2x2048", prec="mixed", ck=1, grad_accum=2))
    C.append(case(Q05, "single", "1x4096", grad_accum=2))
    # the other loop: `del out` after each micro-batch's backward
    C.append(case(L2, "single", "1x4096", grad_accum=2, accum_drop_output=1))
    C.append(case(Q05, "single", "2x2048", grad_accum=2, accum_drop_output=1))
    C.append(case(L2, "single", "1x4096", prec="mixed", ck=1, grad_accum=2, accum_drop_output=1))
    C.append(case(Q05, "single", "2x2048", prec="mixed", ck=1, grad_accum=2,
                  accum_drop_output=1))
    return C


def accum_name(c):
    return (case_name(c) + f" ga{c['grad_accum']}"
            + (" drop-output" if c.get("accum_drop_output") else ""))


def accum_scenario(c, cfg):
    prec = {"bf16": "bf16", "mixed": "amp-bf16"}[c["precision"]]
    return {"model": {"hf_config": cfg}, "batch": c["batch"], "seq": c["seq"], "mode": "train",
            "precision": prec, "optimizer": "adamw",
            "recompute": "full" if c["ckpt"] else "none", "attention": "flash",
            "finetune": "full", "gpu": {"capacity_bytes": H100_BYTES},
            "parallel": {"grad_accum": c["grad_accum"]}}


def accum_notes(c, rec):
    n = ["gradient accumulation as a plain loop: for each micro-batch out = model(ids, "
         "labels=ids); (out.loss / N).backward() (gradients added into .grad in place); then "
         "opt.step(); opt.zero_grad(set_to_none=True); del out; every micro-batch the same ids"]
    if c.get("accum_drop_output"):
        n.append("`del out` after each micro-batch's backward (the plain loop keeps the "
                 "previous micro-batch's output until the next forward returns)")
    else:
        n.append("the previous micro-batch's output (logits, loss) lives until the next "
                 "forward returns and `out` is replaced")
    if c["precision"] == "mixed":
        n.append("autocast over fp32 parameters: CPU autocast casts a different op list than "
                 "CUDA autocast (shared/oracle README); treat the activation terms with care")
    return n


def accum(py, a):
    od = os.path.join(ROOT, a.out_dir)
    os.makedirs(od, exist_ok=True)
    path = os.path.join(od, "accum.jsonl")
    sel = [(accum_name(c), c) for c in accum_matrix()]
    sel = [(n, c) for n, c in sel if re.search(a.only, n)]
    if a.list:
        for n, c in sel:
            print(f"{n}\n    {' '.join(command(c))}")
        print(f"{len(sel)} cases")
        return
    done = set() if a.redo else done_names(path)
    mach = machine()
    vers = None
    for i, (n, c) in enumerate(sel):
        if n in done:
            continue
        rec, cmd, err, dt = run_one(py, c, a.timeout)
        if rec is None:
            print(f"[{i + 1}/{len(sel)}] {n}: FAILED ({dt:.0f} s): {err}", flush=True)
            continue
        print(f"[{i + 1}/{len(sel)}] {n}: {rec['peak_step']} at {rec['peak_where']} "
              f"({dt:.0f} s)", flush=True)
        if vers is None:
            vers = {"torch": rec["torch"], "transformers": rec["transformers"],
                    "python": subprocess.run(
                        [py, "-c", "import platform;print(platform.python_version())"],
                        capture_output=True, text=True).stdout.strip()}
        cfg = json.load(open(os.path.join(ROOT, CONFIGS, MODELS[c["model"]])))
        expect = {"peak_step": rec["peak_step"], "peak_first_step": rec["peak_first_step"],
                  "mem_after_forward": rec["mem_after_forward"],
                  "mem_after_micro_batches": rec["mem_after_micro_batches"],
                  "mem_end_of_step": rec["mem_end_of_step"],
                  "mem_after_model": rec["mem_after_model"], "params": rec["params"]}
        out = {"name": n, "layout": "single", "scenario": accum_scenario(c, cfg),
               "expect": expect, "peak_where": rec["peak_where"],
               "peak_breakdown": rec["peak_breakdown"], "command": " ".join(cmd),
               "versions": vers, "machine": mach, "notes": accum_notes(c, rec)}
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--redo", action="store_true")
    ap.add_argument("--calibration", action="store_true")
    ap.add_argument("--traces", action="store_true",
                    help="one case per family with --trace-layer -> traces.jsonl")
    ap.add_argument("--accum", action="store_true",
                    help="single-GPU gradient accumulation cases -> accum.jsonl")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out-dir", default=OUT_DIR)
    a = ap.parse_args()
    venv = os.environ.get("ORACLE_VENV", os.path.expanduser("~/.cache/gpumem-oracle"))
    py = os.path.join(venv, "bin", "python")
    if a.calibration:
        return calibration(py, a)
    if a.traces:
        return traces(py, a)
    if a.accum:
        return accum(py, a)
    cases, names = [], []
    for c in matrix():  # the loops overlap in a few places: keep the first of each name
        n = case_name(c)
        if n not in names:
            cases.append(c)
            names.append(n)
    sel = [(n, c) for n, c in zip(names, cases) if re.search(a.only, n)]
    if a.list:
        for n, c in sel:
            print(f"{n}\n    {' '.join(command(c))}")
        print(f"{len(sel)} cases")
        return
    od = os.path.join(ROOT, a.out_dir)
    os.makedirs(od, exist_ok=True)
    main_p, det_p, fail_p = (os.path.join(od, f) for f in (
        "sharded.jsonl", "sharded-detail.jsonl", "sharded-failed.jsonl"))
    done = set() if a.redo else done_names(main_p)
    vers = None
    mach = machine()
    for i, (n, c) in enumerate(sel):
        if n in done:
            continue
        rec, cmd, err, dt = run_one(py, c, a.timeout)
        print(f"[{i + 1}/{len(sel)}] {n}: " + (f"{rec['peak_step']} ({dt:.0f} s)" if rec else
                                                f"FAILED ({dt:.0f} s): {err[-1] if err else ''}"),
              flush=True)
        if rec is None:
            out = {"name": n, "command": " ".join(cmd), "error": err}
            for pat, why in KNOWN_FAILURES.items():
                if re.search(pat, n):
                    out["reason"] = why
            with open(fail_p, "a") as f:
                f.write(json.dumps(out) + "\n")
            continue
        if vers is None:
            vers = {"torch": rec["torch"], "transformers": rec["transformers"],
                    "python": platform.python_version()}
            vers["python"] = subprocess.run([py, "-c", "import platform;print(platform.python_version())"],
                                            capture_output=True, text=True).stdout.strip()
        cfg = json.load(open(os.path.join(ROOT, CONFIGS, MODELS[c["model"]])))
        expect = {"peak_step": rec["peak_step"], "peak_first_step": rec["peak_first_step"],
                  "mem_after_forward": rec["mem_after_forward"],
                  "mem_end_of_step": rec["mem_end_of_step"],
                  "mem_after_model": rec["mem_after_model"], "params": rec["params"]}
        if c["layout"] in ("pp", "pp_fsdp"):
            expect["stage"] = c["stage"]
            expect["stage_params"] = rec["stage_params"]
        out = {"name": n, "layout": c["layout"], "scenario": scenario(c, cfg, rec),
               "expect": expect, "command": " ".join(cmd), "versions": vers, "machine": mach}
        nt = notes(c, rec)
        if nt:
            out["notes"] = nt
        with open(main_p, "a") as f:
            f.write(json.dumps(out) + "\n")
        with open(det_p, "a") as f:
            f.write(json.dumps({"name": n, **shorten_detail(rec)}) + "\n")


# one case per layout family, with --trace-layer: what one decoder layer allocates op by op
TRACES = [
    (case("llama-2b", "fsdp", ck=1, world=8, reshard=1, wrap="layers"), 7),
    (case("llama-2b", "fsdp", ck=0, world=8, reshard=1, wrap="layers"), 7),
    (case("llama-2b", "ddp", world=8), 7),
    (case("llama-2b", "tp", world=4, tp=4, sp=1, loss_parallel=1), 1),
    (case("llama-2b", "tp", world=4, tp=4, sp=0, loss_parallel=0), 1),
    (case("llama-2b", "pp", pp=4, microbatches=4, stage=1, schedule="1f1b"), 2),
    (case("llama-2b", "cp", "1x8192", cp=4), 1),
    (case("llama-2b", "cp", "1x8192", cp=4, cp_rotate="alltoall"), 1),
    (case("mixtral-small", "ep", "2x2048", ep=4, ep_impl="hf"), 1),
    (case("mixtral-small", "ep", "2x2048", ep=4, ep_impl="titan"), 1),
]


def traces(py, a):
    od = os.path.join(ROOT, a.out_dir)
    path = os.path.join(od, "traces.jsonl")
    done = done_names(path)
    for c, layer in TRACES:
        n = case_name(c) + f" trace-layer {layer}"
        if n in done or not re.search(a.only, n):
            continue
        cmd = command(c) + ["--trace-layer", str(layer)]
        k = cmd.index("--shapes")
        cmd = cmd[:k] + cmd[k + 2:]
        p = subprocess.run([py] + cmd[1:], cwd=ROOT, capture_output=True, text=True)
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        if p.returncode or not lines:
            print("FAILED", n, p.stderr[-2000:])
            continue
        rec = json.loads(lines[-1])
        out = {"name": n, "command": " ".join(cmd), "peak_step": rec["peak_step"],
               "peak_where": rec["peak_where"], "layer_trace": rec.get("layer_trace")}
        print(n, rec["peak_step"], flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")


CALIB = [  # (tests/data/calibration-scenarios.jsonl name, config, batch, seq, ckpt)
    ("qwen2.5-0.5b bf16-adamw b=4 s=2048 ck=0 sdpa train", "calib-qwen2.5-0.5b.json", 4, 2048, 0),
    ("llama3.2-1b bf16-adamw b=1 s=2048 ck=0 sdpa train", "calib-llama3.2-1b.json", 1, 2048, 0),
    ("llama2-7b-8layers bf16-adamw b=2 s=2048 ck=1 sdpa train", "calib-llama2-7b-8layers.json", 2,
     2048, 1),
    ("mixtral-8x-small bf16-adamw b=2 s=2048 ck=0 sdpa train", "calib-mixtral-8x-small.json", 2,
     2048, 0),
]


def calibration(py, a):
    """The single layout against the H100 runs: peak_step of the same cases."""
    h100 = {}
    for line in open(os.path.join(ROOT, "tests/data/calibration-scenarios.jsonl")):
        d = json.loads(line)
        h100[d["name"]] = d["expect"]
    od = os.path.join(ROOT, a.out_dir)
    os.makedirs(od, exist_ok=True)
    path = os.path.join(od, "calibration-check.jsonl")
    mach = machine()
    for name, cfgf, b, s, ck in CALIB:
        cmd = ["python", ORACLE, "--device", "cpu", "--fake", "--layout", "single", "--precision",
               "bf16", "--ckpt", str(ck), "--batch", str(b), "--seq", str(s), "--hf-config",
               f"{CONFIGS}/{cfgf}"]
        p = subprocess.run([py] + cmd[1:], cwd=ROOT, capture_output=True, text=True)
        rec = json.loads([x for x in p.stdout.splitlines() if x.startswith("{")][-1])
        e = h100[name]
        out = {"name": name, "command": " ".join(cmd),
               "h100_peak_step": e["peak_step"], "oracle_peak_step": rec["peak_step"],
               "error": round(rec["peak_step"] / e["peak_step"] - 1, 5),
               "h100_mem_end_of_step": e["mem_end_of_step"],
               "oracle_mem_end_of_step": rec["mem_end_of_step"],
               "versions": {"torch": rec["torch"], "transformers": rec["transformers"]},
               "machine": mach}
        print(json.dumps(out), flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    sys.exit(main())
