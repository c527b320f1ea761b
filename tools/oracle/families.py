"""Training peaks per model family on the CPU oracle (tools/oracle/oracle.py, unchanged).

Run by hand:  python tools/oracle/families.py [--only NAME ...] [--list]

Each case is a *small but realistically shaped* config: the published config of a released
model (tests/data/models/configs/; for OLMo 3, Seed-OSS, GLM-4, ERNIE 4.5, MiniMax-M2, EXAONE
4, Hunyuan, Arcee, OLMoE, Qwen3.5 and Ministral 3, none stored here, transformers' default configs) with fewer layers — every other width, head count, vocab,
expert count, top-k and feature kept — and the layer pattern cut so that every kind of layer
the family has is present (sliding and full, linear-attention and full, dense-first and MoE,
RoPE and NoPE). The small configs are written to tests/data/oracle/families/<case>.json and run
with

    oracle.py --device cpu --fake --layout single --hf-config CFG --batch 1 --seq S --precision bf16

(3 steps, AdamW fused, figures of the last step). Results: tests/data/oracle/families.jsonl
(scenario format of tests/data/calibration-scenarios.jsonl) and families-detail.jsonl (peak op,
labels at the peak, per-layer forward deltas). Llama 4's wrapper is given its text config
(`llama4_text`: AutoModelForCausalLM builds Llama4ForCausalLM from either), and `kimi_k2` as
`deepseek_v3`. Gemma 3's is run both ways: its text config, and the wrapper whole, which
AutoModelForCausalLM builds as Gemma3ForConditionalGeneration, vision tower included (oracle.py
finds its decoder's layers in `model.language_model` and turns off its `text_config.use_cache`).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CFG = os.path.join(ROOT, "tests", "data", "models", "configs")
OUT = os.path.join(ROOT, "tests", "data", "oracle")
SMALL = os.path.join(OUT, "families")
PY = sys.executable
GPU = {"capacity_bytes": 85017493504}
DROP = ("architectures", "auto_map", "quantization_config", "_name_or_path", "torch_dtype",
        "transformers_version", "unsloth_fixed", "model_max_length", "cache_implementation")


def base(name):
    d = json.load(open(os.path.join(CFG, name + ".json")))
    return {k: v for k, v in d.items() if k not in DROP}


def cut(d, n, layer_types=None, **kw):
    d = dict(d)
    d["num_hidden_layers"] = n
    if layer_types is not None:
        d["layer_types"] = layer_types
    elif "layer_types" in d:
        d["layer_types"] = d["layer_types"][:n]
    d.update(kw)
    return d


def small_configs():
    c = {}
    c["llama3.1-8b-L4"] = ("llama3.1-8b", cut(base("llama3.1-8b"), 4))
    c["mistral-7b-v0.1-L4"] = ("mistral-7b-v0.1", cut(base("mistral-7b-v0.1"), 4))
    c["qwen2.5-7b-L4"] = ("qwen2.5-7b-instruct", cut(base("qwen2.5-7b-instruct"), 4))
    c["qwen3-8b-L4"] = ("qwen3-8b", cut(base("qwen3-8b"), 4))
    c["qwen3-30b-a3b-L2"] = ("qwen3-30b-a3b", cut(base("qwen3-30b-a3b"), 2))
    # 3 gated-delta-net layers + 1 gated full-attention layer, 512 experts top-10 + shared expert
    c["qwen3-next-80b-a3b-L4"] = ("qwen3-next-80b-a3b-instruct", cut(base("qwen3-next-80b-a3b-instruct"), 4))
    c["qwen1.5-moe-a2.7b-L2"] = ("qwen1.5-moe-a2.7b", cut(base("qwen1.5-moe-a2.7b"), 2))
    c["mixtral-8x7b-L2"] = ("mixtral-8x7b", cut(base("mixtral-8x7b"), 2))
    # gemma2: alternating sliding/full (layer 0 sliding), softcapping, sandwich norms
    c["gemma-2-9b-L4"] = ("gemma-2-9b-it", cut(base("gemma-2-9b-it"), 4))
    # gemma3: 5 sliding + 1 full (the published 5:1 pattern), QK-norm, sandwich norms
    g3 = base("gemma-3-1b-it")
    g3.pop("sliding_window_pattern", None)
    c["gemma-3-1b-L6"] = ("gemma-3-1b-it", cut(g3, 6, ["sliding_attention"] * 5 + ["full_attention"]))
    g12 = dict(base("gemma-3-12b-it")["text_config"])
    g12.pop("sliding_window_pattern", None)
    c["gemma-3-12b-text-L6"] = ("gemma-3-12b-it", cut(g12, 6, ["sliding_attention"] * 5 + ["full_attention"]))
    # The published wrapper whole (AutoModelForCausalLM builds Gemma3ForConditionalGeneration:
    # the SigLIP tower of vision_config, 27 layers, and the projector), its decoder cut as above
    wrap = base("gemma-3-12b-it")
    wrap["text_config"] = c["gemma-3-12b-text-L6"][1]
    c["gemma-3-12b-wrapper-L6"] = ("gemma-3-12b-it", wrap)
    # llama4 Scout text: layer 0 chunked attention with RoPE + QK-norm, layer 1 NoPE full attention
    l4 = dict(base("llama4-scout-17b-16e")["text_config"])
    c["llama4-scout-text-L2"] = ("llama4-scout-17b-16e", cut(l4, 2, None, no_rope_layer_interval=2))
    c["phi-4-L4"] = ("phi-4", cut(base("phi-4"), 4))
    c["phi-3.5-mini-L4"] = ("phi-3.5-mini-instruct", cut(base("phi-3.5-mini-instruct"), 4))
    c["olmo-2-7b-L4"] = ("olmo-2-1124-7b", cut(base("olmo-2-1124-7b"), 4))
    # GLM-4.5-Air: 1 dense layer then 1 MoE layer (128 experts top-8 + 1 shared), partial RoPE
    c["glm-4.5-air-L2"] = ("glm-4.5-air", cut(base("glm-4.5-air"), 2, num_nextn_predict_layers=0))
    # gpt-oss: sliding (128) + full, attention sinks, biased experts with clamped SwiGLU
    c["gpt-oss-20b-L2"] = ("gpt-oss-20b", cut(base("gpt-oss-20b"), 2))
    # DeepSeek-V2-Lite: MLA without q_lora, 1 dense + 1 MoE (64 experts top-6, 2 shared)
    c["deepseek-v2-lite-L2"] = ("deepseek-v2-lite", cut(base("deepseek-v2-lite"), 2))
    # DeepSeek-V3 widths (MLA with q_lora, sigmoid router with bias buffer, group-limited top-k):
    # one dense + one MoE layer; 256 x 7168 x 2048 x 3 experts (11.3 B per MoE layer) would not fit
    # 80 GB with AdamW, so 32 experts in 8 groups (top-4 groups, top-8 experts) -- a deviation.
    v3 = base("deepseek-v3")
    c["deepseek-v3-L2-e32"] = ("deepseek-v3", cut(v3, 2, None, n_routed_experts=32, num_nextn_predict_layers=0))
    c["smollm3-3b-L4"] = ("smollm3-3b", cut(base("smollm3-3b"), 4))
    c["granite-3.1-8b-L4"] = ("granite-3.1-8b-instruct", cut(base("granite-3.1-8b-instruct"), 4))
    c["falcon-7b-L4"] = ("falcon-7b", cut(base("falcon-7b"), 4))
    c["pythia-1b-L4"] = ("pythia-1b", cut(base("pythia-1b"), 4))
    c["starcoder2-7b-L4"] = ("starcoder2-7b", cut(base("starcoder2-7b"), 4))
    c["command-r-v01-L2"] = ("c4ai-command-r-v01", cut(base("c4ai-command-r-v01"), 2))
    # cohere2: 3 sliding (RoPE) + 1 full (NoPE), parallel attention + MLP block
    cr7 = base("c4ai-command-r7b-12-2024")
    c["command-r7b-L4"] = ("c4ai-command-r7b-12-2024", cut(cr7, 4))
    # Variants that keep the CPU oracle on the kernels a GPU runs (see NOT_GPU below): no
    # dropout (CPU SDPA has no fused dropout and falls back to the math path), equal q/k and v
    # head dims for MLA (CPU flash needs them equal; CUDA's memory-efficient kernel does not).
    c["granite-3.1-8b-L4-nodrop"] = ("granite-3.1-8b-instruct", cut(base("granite-3.1-8b-instruct"), 4, attention_dropout=0.0))
    c["starcoder2-7b-L4-nodrop"] = ("starcoder2-7b", cut(base("starcoder2-7b"), 4, attention_dropout=0.0,
                                                        residual_dropout=0.0, embedding_dropout=0.0))
    c["deepseek-v2-lite-L2-v192"] = ("deepseek-v2-lite", cut(base("deepseek-v2-lite"), 2, v_head_dim=192))
    c["deepseek-v3-L2-e32-v192"] = ("deepseek-v3", cut(v3, 2, None, n_routed_experts=32, num_nextn_predict_layers=0,
                                                        first_k_dense_replace=1, v_head_dim=192))
    # Falcon's tied embedding puts the peak of short sequences at the (fake-tensor-only)
    # out-of-place gradient sum, and its math-path attention the peak of long ones at the softmax
    # backward (CUDA's temporary, not the CPU's): untied, at 512 tokens, neither is the peak.
    c["falcon-7b-L4-untied"] = ("falcon-7b", cut(base("falcon-7b"), 4, tie_word_embeddings=False))
    # OLMo 3: no published config.json is stored here; transformers' own Olmo3Config defaults
    # (a 7B-like shape: 4096 wide, 32 heads, MHA; a 4096-token window on three layers of four)
    # cut to 4 layers: three sliding, one full.
    c["olmo3-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Olmo3Config", cut(olmo3_defaults(), 4))
    # Seed-OSS: the same, from SeedOssConfig's defaults (80 query heads
    # of 128 over a 4096-wide stream, 8 KV heads, biased q/k/v, dropout 0.1 on the attention
    # and both residual branches), and without dropout (CPU SDPA runs dropout on its math path).
    so = defaults("SeedOssConfig", ("attention_out_bias", "residual_dropout", "mlp_bias", "head_dim"))
    c["seed-oss-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "SeedOssConfig", cut(so, 4))
    c["seed-oss-defaults-L4-nodrop"] = (TRANSFORMERS_DEFAULTS + "SeedOssConfig",
                                        cut(so, 4, attention_dropout=0.0, residual_dropout=0.0))
    # GLM-4 (dense, 0414): Glm4Config's defaults (32 heads of 128, 2 KV
    # heads, biased q/k/v, RoPE on half of each head's interleaved pairs, sandwich norms).
    c["glm4-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Glm4Config",
                             cut(defaults("Glm4Config", ("head_dim", "partial_rotary_factor")), 4))
    # ERNIE 4.5 (dense): Ernie4_5Config's defaults (16 heads of 128 over
    # a 1024-wide stream, 2 KV heads, tied embeddings, fp32 RoPE on interleaved pairs).
    c["ernie4.5-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Ernie4_5Config",
                                 cut(defaults("Ernie4_5Config", ("head_dim", "use_bias")), 4))
    # MiniMax-M2: MiniMaxM2Config's defaults (3072 wide, 48 heads of 128, 8 KV heads,
    # full-width QK-norm, a sigmoid router with a correction bias over experts of 1536) cut to
    # 2 layers, with 32 of its 256 experts (256 would put 14 B parameters in two layers) -- a
    # deviation, as for DeepSeek-V3; and with RoPE on half of each head.
    mm = defaults("MiniMaxM2Config", ("head_dim", "num_local_experts", "num_experts_per_tok"))
    c["minimax-m2-defaults-L2-e32"] = (TRANSFORMERS_DEFAULTS + "MiniMaxM2Config", cut(mm, 2, None, num_local_experts=32))
    c["minimax-m2-defaults-L2-e32-rope-half"] = (
        TRANSFORMERS_DEFAULTS + "MiniMaxM2Config",
        cut(mm, 2, None, num_local_experts=32,
            rope_parameters=dict(mm["rope_parameters"], partial_rotary_factor=0.5)))
    # EXAONE 4: Exaone4Config's defaults (4096 wide, 32 heads, post-norms, per-head QK-norm;
    # three sliding layers with RoPE, then a full one without).
    c["exaone4-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Exaone4Config",
                                cut(defaults("Exaone4Config", ("sliding_window_pattern",)), 4))
    # Hunyuan (dense): HunYuanDenseV1Config's defaults (4096 wide, 32 heads; per-head QK-norm
    # after RoPE), with 8 KV heads so that attention is grouped, and a head_dim of 128, which
    # its attention needs given (the defaults leave it unset).
    c["hunyuan-dense-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "HunYuanDenseV1Config",
                                      cut(defaults("HunYuanDenseV1Config"), 4, num_key_value_heads=8, head_dim=128))
    # Arcee: ArceeConfig's defaults ("AFM-4.5B-Base style", its docstring says: 2560 wide, 32 heads of 80, a
    # non-gated relu2 MLP of 18432), cut to 4 layers.
    c["arcee-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "ArceeConfig",
                              cut(defaults("ArceeConfig", ("head_dim", "mlp_bias")), 4))
    # OLMoE: OlmoeConfig's defaults (2048 wide, 16 heads, 64 experts of 2048, top-8, a
    # full-width QK-norm), cut to 2 layers.
    c["olmoe-defaults-L2"] = (TRANSFORMERS_DEFAULTS + "OlmoeConfig",
                              cut(defaults("OlmoeConfig", ("num_experts", "num_experts_per_tok",
                                                           "norm_topk_prob", "clip_qkv")), 2))
    # Qwen3.5 / 3.6 (dense, `qwen3_5_text`; the published checkpoints are the `qwen3_5` wrapper,
    # whose text model AutoModelForCausalLM builds alone): Qwen3_5TextConfig's defaults (its
    # docstring's "Qwen3.5-9B style": 4096 wide, 16 heads of 256 with 4 KV heads, DeltaNet of
    # 16 key and 32 value heads of 128) with the published models' RoPE (interleaved mRoPE on a
    # quarter of each head, theta 1e7), cut to 4 layers: three linear-attention, one full.
    q35 = defaults("Qwen3_5TextConfig", LINEAR_KEYS + ("head_dim",))
    q35["rope_parameters"] = QWEN35_ROPE
    c["qwen3.5-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Qwen3_5TextConfig", cut(q35, 4))
    # Qwen3.5 MoE (`qwen3_5_moe_text`): Qwen3_5MoeTextConfig's defaults ("Qwen3.5-35B-A3B
    # style": 2048 wide, 256 experts of 512, top-8, a gated shared expert of 512), cut to 2
    # layers: one linear-attention, one full.
    q35m = defaults("Qwen3_5MoeTextConfig", LINEAR_KEYS + ("head_dim", "num_experts", "num_experts_per_tok",
                                                          "moe_intermediate_size",
                                                          "shared_expert_intermediate_size"))
    q35m["rope_parameters"] = QWEN35_ROPE
    c["qwen3.5-moe-defaults-L2"] = (TRANSFORMERS_DEFAULTS + "Qwen3_5MoeTextConfig",
                                    cut(q35m, 2, ["linear_attention", "full_attention"]))
    # Ministral 3 (`ministral3`): Ministral3Config's defaults (4096 wide, 32 heads of 128, 8 KV
    # heads, YaRN RoPE with Llama 4's position scaling of the queries), cut to 4 layers.
    c["ministral3-defaults-L4"] = (TRANSFORMERS_DEFAULTS + "Ministral3Config",
                                   cut(defaults("Ministral3Config", ("head_dim",)), 4))
    return c


LINEAR_KEYS = ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
               "linear_num_key_heads", "linear_num_value_heads")
# Qwen3.5's published `rope_parameters` (Qwen/Qwen3.5-27B and -35B-A3B's config.json).
QWEN35_ROPE = {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}


# A case whose config is transformers' defaults for the class named after this prefix.
TRANSFORMERS_DEFAULTS = "transformers:"


def defaults(cls, extra=()):
    """transformers' default config of class `cls`: the keys that shape a decoder."""
    import transformers
    d = getattr(transformers, cls)().to_dict()
    keep = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "attention_bias", "attention_dropout", "sliding_window", "layer_types",
            "tie_word_embeddings", "pad_token_id", "eos_token_id", "rope_parameters") + tuple(extra)
    return {k: d[k] for k in keep if k in d}


def olmo3_defaults():
    return defaults("Olmo3Config")


# Cases whose CPU-oracle peak is not what a GPU does, and why (kept out of the engine's bounds).
NOT_GPU = {
    "granite-3.1-8b-L4 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "attention_dropout 0.1: CPU SDPA has no fused dropout, takes the math path and keeps probabilities and masks",
    "starcoder2-7b-L4 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "attention/residual/embedding dropout 0.1: CPU SDPA takes the math path (dropout)",
    "deepseek-v2-lite-L2 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "MLA q/k head dim 192 != v head dim 128: CPU SDPA takes the math path (CUDA: memory-efficient kernel)",
    "deepseek-v2-lite-L2 bf16-adamw b=1 s=2048 ck=1 sdpa train":
        "MLA q/k head dim 192 != v head dim 128: CPU SDPA takes the math path (CUDA: memory-efficient kernel)",
    "deepseek-v3-L2-e32 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "MLA q/k head dim 192 != v head dim 128: CPU SDPA takes the math path; first_k_dense_replace 3 > 2 layers makes both layers dense",
    "seed-oss-defaults-L4 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "attention_dropout 0.1: CPU SDPA has no fused dropout, takes the math path and keeps probabilities and masks",
    "falcon-7b-L4 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "peak at the math path's softmax backward: CUDA's kernel forms grad*output as a temporary the size of the scores, the CPU kernel does not",
    "command-r-v01-L2 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "peak at the tied embedding's gradient sum: under FakeTensorMode autograd adds the two gradients out of place (no in-place accumulation into tensor subclasses); on a device it is in place",
    "command-r7b-L4 bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "peak at the tied embedding's gradient sum, added out of place under FakeTensorMode only",
    "falcon-7b-L4-untied bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "peak at the math path's softmax backward: CUDA's kernel forms grad*output as a temporary the size of the scores, the CPU kernel does not",
    "falcon-7b-L4 bf16-adamw b=1 s=512 ck=0 sdpa train":
        "peak at the tied embedding's gradient sum, added out of place under FakeTensorMode only",
    "starcoder2-7b-L4-nodrop bf16-adamw b=1 s=2048 ck=0 sdpa train":
        "peak at the tied embedding's gradient sum, added out of place under FakeTensorMode only",
}


# (case, seq, ckpt, attn)
EAGER_ONLY = {"gpt-oss-20b-L2"}  # GptOss has no SDPA path in transformers 5.17
RUNS = [(n, 2048, 0, "eager" if n in EAGER_ONLY else "sdpa") for n in small_configs()] + [
    ("qwen3-8b-L4", 4096, 0, "sdpa"),
    ("qwen3-8b-L4", 2048, 1, "sdpa"),
    ("qwen3-30b-a3b-L2", 2048, 1, "sdpa"),
    ("olmoe-defaults-L2", 2048, 1, "sdpa"),
    ("qwen3.5-defaults-L4", 2048, 1, "sdpa"),
    ("qwen3.5-moe-defaults-L2", 2048, 1, "sdpa"),
    ("ministral3-defaults-L4", 2048, 1, "sdpa"),
    ("qwen3-30b-a3b-L2", 4096, 0, "sdpa"),
    ("gemma-2-9b-L4", 2048, 0, "eager"),
    ("gemma-2-9b-L4", 4096, 0, "sdpa"),
    ("gemma-3-1b-L6", 2048, 1, "sdpa"),
    ("gemma-3-12b-wrapper-L6", 2048, 1, "sdpa"),
    ("gemma-3-1b-L6", 2048, 0, "eager"),
    ("deepseek-v2-lite-L2", 2048, 1, "sdpa"),
    ("mistral-7b-v0.1-L4", 4096, 0, "sdpa"),
    ("gpt-oss-20b-L2", 4096, 0, "eager"),
    ("command-r7b-L4", 4096, 0, "sdpa"),
    ("command-r-v01-L2", 4096, 0, "sdpa"),
    ("starcoder2-7b-L4-nodrop", 4096, 0, "sdpa"),
    ("falcon-7b-L4", 512, 0, "sdpa"),
    ("falcon-7b-L4-untied", 512, 0, "sdpa"),
    # Beyond the window: the sliding layers' mask is made.
    ("olmo3-defaults-L4", 8192, 0, "sdpa"),
    ("exaone4-defaults-L4", 8192, 0, "sdpa"),
]


def case_name(n, s, ck, at):
    return f"{n} bf16-adamw b=1 s={s} ck={ck} {at} train"


def run(n, s, ck, at, src):
    cfgp = os.path.join(SMALL, n + ".json")
    rel = os.path.relpath(cfgp, ROOT)
    cmd = [PY, os.path.abspath(__file__), "--oracle", "--device", "cpu", "--fake", "--layout", "single",
           "--hf-config", cfgp, "--batch", "1", "--seq", str(s), "--precision", "bf16", "--attn", at,
           "--ckpt", str(ck)]
    shown = (f"python tools/oracle/families.py --oracle --device cpu --fake --layout single --hf-config {rel} "
             f"--batch 1 --seq {s} --precision bf16 --attn {at} --ckpt {ck}")
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, shown, (p.stderr or p.stdout)[-1500:]
    return json.loads(lines[-1]), shown, None


def oracle_with_longrope_patch(argv):
    """Run oracle.py's main() unchanged, with one patch: LongRoPE (phi3 with rope_scaling
    longrope) chooses its factors by `torch.max(position_ids) + 1 > original_max`, a
    data-dependent branch FakeTensorMode cannot take. For a batch of positions 0..seq-1 the max
    is seq-1; answer that as a Python int and leave every other torch.max alone."""
    sys.argv = [os.path.join(HERE, "oracle.py")] + argv
    seq = int(argv[argv.index("--seq") + 1])
    import torch
    orig = torch.max

    def patched(*a, **k):
        t = a[0] if a else None
        if (len(a) == 1 and not k and isinstance(t, torch._subclasses.FakeTensor)
                and t.dtype == torch.long and t.dim() == 2 and t.shape[-1] == seq):
            return seq - 1
        return orig(*a, **k)
    torch.max = patched
    # oracle.py hooks `model.model.layers`; falcon keeps its blocks in `transformer.h` and
    # gpt_neox in `gpt_neox.layers`: give those classes a read-only `model.layers` alias
    # (used only to register the per-layer forward hooks).
    import types
    from transformers import FalconForCausalLM, GPTNeoXForCausalLM
    FalconForCausalLM.model = property(lambda self: types.SimpleNamespace(layers=self.transformer.h))
    GPTNeoXForCausalLM.model = property(lambda self: types.SimpleNamespace(layers=self.gpt_neox.layers))
    sys.path.insert(0, HERE)
    import oracle
    try:
        oracle.main()
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--oracle":
        return oracle_with_longrope_patch(sys.argv[2:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--mark", action="store_true", help="only (re)write gpu_valid / why_not in families.jsonl")
    a = ap.parse_args()
    import platform
    os.makedirs(SMALL, exist_ok=True)
    cfgs = small_configs()
    for n, (src, d) in cfgs.items():
        with open(os.path.join(SMALL, n + ".json"), "w") as f:
            json.dump(d, f, indent=1)
            f.write("\n")
    if a.list:
        for r in RUNS:
            print(case_name(*r))
        return
    if a.mark:
        p = os.path.join(OUT, "families.jsonl")
        recs = [json.loads(l) for l in open(p)]
        for r in recs:
            r.pop("gpu_valid", None)
            r.pop("why_not", None)
            if r["name"] in NOT_GPU:
                r["gpu_valid"] = False
                r["why_not"] = NOT_GPU[r["name"]]
        with open(p, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        return
    fam_p = os.path.join(OUT, "families.jsonl")
    det_p = os.path.join(OUT, "families-detail.jsonl")
    old = {}
    if os.path.exists(fam_p):
        for l in open(fam_p):
            r = json.loads(l)
            old[r["name"]] = r
    old_d = {}
    if os.path.exists(det_p):
        for l in open(det_p):
            r = json.loads(l)
            old_d[r["name"]] = r
    machine = f"{platform.machine()} CPU x{os.cpu_count()}, FakeTensorMode (no GPU); tracker rounds to 512 B"
    for (n, s, ck, at) in RUNS:
        name = case_name(n, s, ck, at)
        if a.only and n not in a.only and name not in a.only:
            continue
        src, d = cfgs[n]
        rec, shown, err = run(n, s, ck, at, src)
        if rec is None:
            print(f"FAILED {name}: {err}", flush=True)
            continue
        import torch, transformers  # noqa
        versions = {"torch": rec["torch"], "transformers": rec["transformers"]}
        scen = {"model": {"hf_config": d}, "batch": 1, "seq": s, "mode": "train", "precision": "bf16",
                "optimizer": "adamw", "recompute": "full" if ck else "none",
                "attention": "flash" if at == "sdpa" else "eager", "gpu": GPU, "finetune": "full",
                "parallel": {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0}}
        expect = {k: rec[k] for k in ("peak_step", "peak_first_step", "mem_after_forward",
                                      "mem_end_of_step", "params")}
        expect["mem_after_model"] = rec["mem_after_model"]
        expect["oom"] = False
        from_config = (src if src.startswith(TRANSFORMERS_DEFAULTS)
                       else f"tests/data/models/configs/{src}.json")
        old[name] = {"name": name, "family": d.get("model_type"), "from_config": from_config,
                     "scenario": scen, "expect": expect, "command": shown, "versions": versions, "machine": machine}
        if name in NOT_GPU:
            old[name]["gpu_valid"] = False
            old[name]["why_not"] = NOT_GPU[name]
        old_d[name] = {"name": name, "peak_where": rec["peak_where"], "peak_op": rec["peak_op"],
                       "peak_breakdown": rec["peak_breakdown"], "peak_labels": rec["peak_labels"],
                       "layer_fwd_deltas": rec["layer_fwd_deltas"], "per_layer_saved": rec["per_layer_saved"],
                       "peak_forward": rec["peak_forward"], "mem_after_backward": rec["mem_after_backward"],
                       "mem_start_of_step": rec["mem_start_of_step"], "peaks": rec["peaks"],
                       "wall_s": rec["wall_s"]}
        print(f"{name}: peak {rec['peak_step']:,} params {rec['params']:,} ({rec['wall_s']} s) at {rec['peak_where']}",
              flush=True)
        with open(fam_p, "w") as f:
            for k in sorted(old):
                f.write(json.dumps(old[k]) + "\n")
        with open(det_p, "w") as f:
            for k in sorted(old_d):
                f.write(json.dumps(old_d[k]) + "\n")


if __name__ == "__main__":
    main()
