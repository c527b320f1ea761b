"""Exact parameters and KV-cache bytes of published configs, from transformers itself.

Run by hand (not in CI; needs torch + transformers, see tools/oracle/README.md):

    python tools/models/generate.py [--only NAME ...] [--out tests/data/models/models.jsonl]

For every `tests/data/models/configs/*.json`:
- builds the model on the meta device (`AutoModelForCausalLM.from_config`, bf16) and records
  `sum(p.numel() for p in model.parameters())` (tied weights once), a breakdown by parameter name
  with the layer index replaced by `*`, and the buffers (persistent or not) the same way;
- runs a real prefill of 4,096 and 32,768 tokens (batch 1, bf16, SDPA, `use_cache=True`) under
  FakeTensorMode, so the model's own default cache (`DynamicCache(config=...)` in transformers
  5.17) is built by the model's own forward, and records the bytes of every tensor each cache
  layer holds (keys/values, conv and recurrent states), per layer kind;
- computes the same bytes from the rules written in tests/data/models/README.md (`rule_kv`) and
  refuses to write a record where the two disagree;
- records `quantization_config` and what transformers 5.17 does with it (`quant_note`).

kimi_k2 is not a model type transformers 5.17 knows (the published file points at remote code
`configuration_deepseek.DeepseekV3Config`): it is built as `deepseek_v3`, and the record says so.
"""
import argparse
import contextlib
import glob
import json
import os
import platform
import re
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CFG_DIR = os.path.join(ROOT, "tests", "data", "models", "configs")

# HF repo each config copies (see tests/data/models/SOURCES.md)
HF_REPO = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "qwen3-next-80b-a3b-instruct": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3", "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
    "kimi-k2-instruct": "moonshotai/Kimi-K2-Instruct",
    "llama4-scout-17b-16e": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
    "llama3.1-8b": "meta-llama/Meta-Llama-3.1-8B", "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mistral-7b-v0.1": "mistralai/Mistral-7B-v0.1", "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen1.5-moe-a2.7b": "Qwen/Qwen1.5-MoE-A2.7B",
    "gpt-oss-20b": "openai/gpt-oss-20b", "gpt-oss-120b": "openai/gpt-oss-120b",
    "phi-3.5-mini-instruct": "microsoft/Phi-3.5-mini-instruct", "phi-4": "microsoft/phi-4",
    "gemma-2-9b-it": "google/gemma-2-9b-it", "gemma-3-1b-it": "google/gemma-3-1b-it",
    "gemma-3-12b-it": "google/gemma-3-12b-it", "olmo-2-1124-7b": "allenai/OLMo-2-1124-7B",
    "glm-4.5-air": "zai-org/GLM-4.5-Air", "glm-4.7": "zai-org/GLM-4.7",
    "c4ai-command-r7b-12-2024": "CohereForAI/c4ai-command-r7b-12-2024",
    "c4ai-command-r-v01": "CohereForAI/c4ai-command-r-v01", "falcon-7b": "tiiuae/falcon-7b",
    "pythia-1b": "EleutherAI/pythia-1b", "granite-3.1-8b-instruct": "ibm-granite/granite-3.1-8b-instruct",
    "starcoder2-7b": "bigcode/starcoder2-7b", "smollm3-3b": "HuggingFaceTB/SmolLM3-3B",
}
DROP = ("architectures", "auto_map", "quantization_config")


def load_cfg_dict(path):
    d = json.load(open(path))
    raw_type = d.get("model_type")
    q = d.get("quantization_config")
    d = {k: v for k, v in d.items() if k not in DROP}
    if d.get("model_type") == "kimi_k2":
        d["model_type"] = "deepseek_v3"
    return d, raw_type, q


def make_config(d, attn="sdpa"):
    from transformers import AutoConfig
    cfg = AutoConfig.for_model(**d)
    cfg._attn_implementation = attn
    for sub in ("text_config",):
        if hasattr(cfg, sub) and getattr(cfg, sub) is not None:
            getattr(cfg, sub)._attn_implementation = attn
    return cfg


def pattern(name):
    return re.sub(r"\.(\d+)\.", ".*.", name)


def breakdown(model):
    params, bufs = {}, {}
    for n, p in model.named_parameters():  # remove_duplicate=True: a tied weight once
        k = pattern(n)
        params[k] = params.get(k, 0) + p.numel()
    persistent = set()
    for mn, m in model.named_modules():
        for bn in m._buffers:
            if bn not in m._non_persistent_buffers_set:
                persistent.add(f"{mn}.{bn}" if mn else bn)
    for n, b in model.named_buffers():
        k = pattern(n)
        e = bufs.setdefault(k, {"numel": 0, "dtype": str(b.dtype).replace("torch.", ""),
                                "persistent": n in persistent, "count": 0})
        e["numel"] += b.numel()
        e["count"] += 1
    summary = {"embedding": 0, "lm_head": 0, "final_norm": 0, "layers": 0, "other": 0}
    for k, v in params.items():
        if "layers.*." in k or ".h.*." in k:
            summary["layers"] += v
        elif "embed" in k or "wte" in k or "word_embeddings" in k:
            summary["embedding"] += v
        elif k.startswith("lm_head") or "output" == k.split(".")[0]:
            summary["lm_head"] += v
        elif "norm" in k or "ln_f" in k:
            summary["final_norm"] += v
        else:
            summary["other"] += v
    return params, bufs, summary


def cache_tensors(layer):
    """Every tensor a cache layer holds, by attribute (lists flattened)."""
    out = {}
    for a, v in vars(layer).items():
        if a.startswith("_"):
            continue  # _sliding_window_tensor: a CPU scalar, bookkeeping
        if isinstance(v, torch.Tensor):
            out[a] = v
        elif isinstance(v, (list, tuple, dict)):
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for i, t in items:
                if isinstance(t, torch.Tensor):
                    out[f"{a}[{i}]"] = t
    return out


@contextlib.contextmanager
def max_of_positions(seq):
    """LongRoPE (phi3) picks its factors with `torch.max(position_ids) + 1 > original_max`: a
    data-dependent branch FakeTensorMode cannot take. For a prefill from position 0 the max is
    seq - 1: answer that (as a real scalar) and leave every other torch.max alone."""
    orig = torch.max

    def patched(*a, **k):
        t = a[0] if a else None
        if (len(a) == 1 and not k and isinstance(t, torch._subclasses.FakeTensor)
                and t.dtype == torch.long and t.dim() == 2 and t.shape[-1] == seq):
            return seq - 1
        return orig(*a, **k)
    torch.max = patched
    try:
        yield
    finally:
        torch.max = orig


def prefill_cache(model, cfg, seq, fake_mode):
    with fake_mode, max_of_positions(seq):
        ids = torch.zeros((1, seq), dtype=torch.long)
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    layers = []
    for i, layer in enumerate(cache.layers):
        ts = cache_tensors(layer)
        layers.append({
            "cls": type(layer).__name__,
            "window": getattr(layer, "sliding_window", None),
            "tensors": {a: [list(t.shape), str(t.dtype).replace("torch.", ""), t.numel() * t.element_size()]
                        for a, t in ts.items()},
            "bytes": sum(t.numel() * t.element_size() for t in ts.values()),
        })
    del out, cache
    return layers


def kind_of(layer):
    c = layer["cls"]
    if c == "DynamicLayer":
        return "full"
    if c == "DynamicSlidingWindowLayer":
        return "sliding"
    if c.startswith("LinearAttention"):
        return "linear_attention_state"
    return c


# ---- the rules, written independently of the cache classes -------------------------------
def rule_kv(cfg, seq, dtype_bytes=2):
    """Bytes of the default cache after a prefill of `seq` tokens, batch 1, from the config alone:
    the rules of tests/data/models/README.md. Returns (total, per-layer list)."""
    t = cfg.get_text_config(decoder=True)
    mt = t.model_type
    L = t.num_hidden_layers
    types = getattr(t, "layer_types", None)
    if types is None:
        if getattr(t, "sliding_window", None) is not None:
            types = ["sliding_attention"] * L
        elif getattr(t, "attention_chunk_size", None) is not None:
            types = ["chunked_attention"] * L
        else:
            types = ["full_attention"] * L
    per = []
    for i, ty in enumerate(types):
        if ty == "linear_attention":  # qwen3_next gated delta net
            kd, vd = t.linear_key_head_dim, t.linear_value_head_dim
            nk, nv = t.linear_num_key_heads, t.linear_num_value_heads
            conv_dim = 2 * nk * kd + nv * vd
            conv = conv_dim * t.linear_conv_kernel_dim * dtype_bytes
            # torch_chunk_gated_delta_rule computes in float32 and returns the final state in
            # float32: the recurrent state is cached as fp32 whatever the model dtype
            rec = nv * kd * vd * 4
            per.append(conv + rec)
            continue
        if ty == "full_attention":
            n = seq
        elif ty in ("sliding_attention",):
            n = min(seq, t.sliding_window - 1) if seq >= t.sliding_window else seq
        elif ty == "chunked_attention":
            w = t.attention_chunk_size
            n = min(seq, w - 1) if seq >= w else seq
        else:
            raise ValueError(ty)
        if mt in ("deepseek_v3", "deepseek_v2", "kimi_k2"):
            per.append(n * (t.kv_lora_rank + t.qk_rope_head_dim) * dtype_bytes)  # MLA latent
            continue
        hd = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
        if mt == "falcon":
            # new_decoder_architecture: num_kv_heads; multi_query: 1 KV head; else all heads
            kvh = t.num_kv_heads if t.new_decoder_architecture else (1 if t.multi_query else t.num_attention_heads)
        elif mt == "gpt_neox":
            kvh = t.num_attention_heads
        else:
            kvh = getattr(t, "num_key_value_heads", None) or t.num_attention_heads
        per.append(2 * n * kvh * hd * dtype_bytes)
    return sum(per), per


QUANT_NOTE = {
    "mxfp4": (
        "transformers 5.17 quantizers/quantizer_mxfp4.py (Mxfp4HfQuantizer): with a GPU of compute capability "
        ">= 7.5 and the `kernels` package (triton_kernels) the experts stay MXFP4: integrations/mxfp4.py "
        "Mxfp4GptOssExperts holds gate_up_proj_blocks uint8 (E, 2I, H/32, 16) + gate_up_proj_scales uint8 "
        "(E, 2I, H/32) and down_proj_blocks uint8 (E, H, I/32, 16) + down_proj_scales uint8 (E, H, I/32): "
        "4.25 bits = 0.53125 bytes per expert weight (32 4-bit values + one 8-bit scale per block); the "
        "expert biases stay bf16; modules_to_not_convert (self_attn, mlp.router, embed_tokens, lm_head) and "
        "the norms/sinks stay bf16. Without the kernels (or on CPU / older GPU) the quantizer dequantizes "
        "to bf16 on load (`dequantize=True`): 2 bytes per parameter everywhere."),
    "fp8": (
        "transformers 5.17 quantizers/quantizer_finegrained_fp8.py (FineGrainedFP8HfQuantizer, "
        "weight_block_size [128,128]): every nn.Linear not in modules_to_not_convert (by default lm_head "
        "is kept) becomes integrations/finegrained_fp8.py FP8Linear: weight float8_e4m3fn (1 byte per "
        "parameter) + weight_scale_inv float32 of shape (ceil(out/128), ceil(in/128)); MoE experts "
        "likewise become FP8 3-D weights with per-block fp32 scales. Embedding, norms, the router gate "
        "and the e_score_correction_bias buffer stay in the model dtype (bf16 / fp32). Needs a GPU of "
        "compute capability >= 8.9 to stay fp8; otherwise it dequantizes to bf16 on load."),
}


def run_one(name, path, seqs, fake_mode):
    from transformers import AutoModelForCausalLM
    d, raw_type, q = load_cfg_dict(path)
    cfg = make_config(d)
    try:  # SDPA where the class supports it (what from_pretrained picks), else eager (gpt_oss)
        with torch.device("meta"):
            AutoModelForCausalLM.from_config(make_config(d, "sdpa"), dtype=torch.bfloat16)
    except ValueError:
        cfg = make_config(d, "eager")
    t0 = time.time()
    variants = []
    with fake_mode:
        with torch.device("cpu"):
            pass
    # the model under FakeTensorMode (parameters fake, so a prefill can run); params are counted
    # on a meta copy as well (same numbers, checked)
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    params_meta = sum(p.numel() for p in meta_model.parameters())
    pb, bufs, summary = breakdown(meta_model)
    cls = type(meta_model).__name__
    rec = {"name": name, "hf_repo": HF_REPO.get(name), "model_type": raw_type,
           "built_as": cfg.model_type, "attn_implementation": cfg._attn_implementation, "config_file": os.path.relpath(path, ROOT), "class": cls,
           "params": params_meta, "params_summary": summary, "params_breakdown": pb, "buffers": bufs}
    if cls.endswith("ForConditionalGeneration"):
        # a text-only fine-tune / inference loads the decoder alone: record it too
        tcfg = cfg.get_text_config(decoder=True)
        with torch.device("meta"):
            tm = AutoModelForCausalLM.from_config(tcfg, dtype=torch.bfloat16)
        rec["text_only"] = {"class": type(tm).__name__, "params": sum(p.numel() for p in tm.parameters()),
                            "params_summary": breakdown(tm)[2]}
        del tm
    del meta_model
    with fake_mode:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    assert sum(p.numel() for p in model.parameters()) == params_meta
    kv, detail, rules = {}, {}, {}
    for s in seqs:
        layers = prefill_cache(model, cfg, s, fake_mode)
        total = sum(l["bytes"] for l in layers)
        rtotal, rper = rule_kv(cfg, s)
        if rtotal != total or [l["bytes"] for l in layers] != rper:
            raise AssertionError(f"{name} seq {s}: cache {total} != rule {rtotal}\n"
                                 f"{[l['bytes'] for l in layers][:8]} vs {rper[:8]}")
        kinds = {}
        for l in layers:
            k = kind_of(l)
            e = kinds.setdefault(k, {"layers": 0, "bytes": 0, "bytes_per_layer": l["bytes"],
                                     "cache_class": l["cls"], "tensors": l["tensors"]})
            if l["window"] is not None:
                e["window"] = int(l["window"])
            e["layers"] += 1
            e["bytes"] += l["bytes"]
        kv[str(s)] = total
        detail[str(s)] = kinds
    rec["kv_bytes"] = kv
    rec["kv_detail"] = detail
    rec["kv_rule_agrees"] = True
    if q is not None:
        rec["quantization_config"] = q
        rec["quant_note"] = QUANT_NOTE.get(q.get("quant_method"), "")
    rec["wall_s"] = round(time.time() - t0, 1)
    del model
    return rec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "models", "models.jsonl"))
    ap.add_argument("--seqs", default="4096,32768")
    a = ap.parse_args()
    import transformers
    from torch._subclasses.fake_tensor import FakeTensorMode
    import transformers.masking_utils as _mu
    # transformers treats FakeTensors as "tracing" and would materialise the causal mask; a
    # real run (no padding, SDPA) passes no mask: keep that behaviour under fake tensors.
    _mu.is_tracing = lambda *x, **k: False
    _mu.find_packed_sequence_indices = lambda *x, **k: None
    seqs = [int(x) for x in a.seqs.split(",")]
    files = sorted(glob.glob(os.path.join(CFG_DIR, "*.json")))
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()}
    machine = f"{platform.machine()} {platform.system()} CPU, FakeTensorMode/meta (no GPU)"
    recs = []
    for f in files:
        name = os.path.basename(f)[:-5]
        if a.only and name not in a.only:
            continue
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            rec = run_one(name, f, seqs, fake_mode)
        except Exception as e:  # keep going; the failure is printed
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:600]}", file=sys.stderr, flush=True)
            continue
        rec["versions"] = versions
        rec["machine"] = machine
        rec["command"] = "python tools/models/generate.py" + (f" --only {name}" if a.only else "")
        print(f"{name}: {rec['class']} params {rec['params']:,} kv {rec['kv_bytes']} ({rec['wall_s']} s)",
              flush=True)
        recs.append(rec)
    if a.only and os.path.exists(a.out):
        keep = [json.loads(l) for l in open(a.out) if l.strip()]
        done = {r["name"] for r in recs}
        recs = [r for r in keep if r["name"] not in done] + recs
        recs.sort(key=lambda r: r["name"])
    with open(a.out, "w") as fo:
        for r in recs:
            fo.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
