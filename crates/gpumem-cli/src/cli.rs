//! The command line, as clap reads it, and the JSON object its flags describe.
//!
//! Flags do not interpret a scenario: each one sets a field of the JSON scenario (or plan
//! request) that `gpumem::Scenario::from_value` / `gpumem::plan::Request::from_value` read, so
//! that the engine's errors name the field. What the CLI checks itself is what JSON cannot
//! carry: a number beyond 2^64 − 1, and `on`/`off` switches.

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value};

/// Predicts the per-GPU memory of LLM training and inference: the peak that
/// `torch.cuda.max_memory_allocated` would report, why it is that high, and whether it fits.
#[derive(Debug, Parser)]
#[command(
    name = "gpumem",
    version,
    propagate_version = true,
    subcommand_required = true,
    arg_required_else_help = true,
    after_help = "Exit codes: 0 ok, 2 bad input (a usage error, an unreadable file, or a \
                  scenario the engine refuses; the message names the flag, file or field), \
                  1 if the output cannot be written."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Predict one run's per-GPU peak memory, with its phase and breakdown
    #[command(
        long_about = "Predict one run's per-GPU peak memory, the phase of the step where it \
                      happens, what it is made of, and whether it fits on the GPU.\n\n\
                      The run is described by --scenario FILE (the JSON format of \
                      tests/data/calibration-scenarios.jsonl), by flags, or both: flags \
                      override the file's fields. A model is required: --model, --hf-config \
                      or a scenario file that names one.",
        after_help = "Example: gpumem estimate --model llama3.2-1b --batch 4 --seq 2048 --precision bf16"
    )]
    Estimate(EstimateArgs),
    /// Try every layout over the GPU counts given; list those that fit, ranked
    #[command(
        long_about = "Try every layout of a training run over the GPU counts given — dp × tp × \
                      pp × cp × ep, ZeRO stage / FSDP strategy, 1F1B or interleaved pipeline, \
                      micro-batch size, recomputation, offload — keep those the engine says \
                      fit, and rank them by estimated step time, then memory headroom.\n\n\
                      Every estimate flag may be given; each goes into the plan request as it \
                      would into a scenario, and the planner either takes it as a constraint \
                      or refuses it, naming the field.",
        after_help = "Example: gpumem plan --model llama3.1-70b --seq 8192 --precision mixed-bf16 \
                      --global-batch 128 --gpus 8..128:8 --no-offload"
    )]
    Plan(PlanArgs),
    /// List the built-in models (presets)
    Presets(PresetsArgs),
    /// Print a shell completion script
    #[command(
        long_about = "Print a completion script for SHELL on standard output.\n\n\
                      bash: gpumem completions bash > ~/.local/share/bash-completion/completions/gpumem\n\
                      zsh:  gpumem completions zsh > \"${fpath[1]}/_gpumem\"\n\
                      fish: gpumem completions fish > ~/.config/fish/completions/gpumem.fish"
    )]
    Completions {
        /// The shell to complete for
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub scenario: ScenarioFlags,
    /// Print one JSON object (every figure) instead of the table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub scenario: ScenarioFlags,
    #[command(flatten)]
    pub plan: PlanFlags,
    /// Print one JSON object (every figure, and each layout's scenario) instead of the table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PresetsArgs {
    /// Print a JSON array (name, aliases, family, counts, source) instead of the table
    #[arg(long)]
    pub json: bool,
}

/// The scenario: which model, how it runs, on what. Each flag sets one field of the JSON
/// scenario; unset fields take the engine's defaults (given in each flag's help).
#[derive(Debug, Default, Args)]
pub struct ScenarioFlags {
    /// A scenario file (JSON object); flags override its fields
    ///
    /// The format of tests/data/calibration-scenarios.jsonl's "scenario" objects, and of the
    /// scenarios `gpumem plan --json` emits. At most 4 MiB, a regular file; a UTF-8 byte-order
    /// mark is allowed.
    #[arg(long, value_name = "FILE", help_heading = "Model", value_parser = path)]
    pub scenario: Option<String>,

    /// A preset model (see `gpumem presets`), e.g. llama3.1-8b
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Model",
        conflicts_with = "hf_config"
    )]
    pub model: Option<String>,

    /// A Hugging Face config.json as the model
    ///
    /// Its architecture keys are read (hidden_size, num_hidden_layers, …); other keys are
    /// ignored. At most 4 MiB, a regular file; a UTF-8 byte-order mark is allowed.
    #[arg(long, value_name = "FILE", help_heading = "Model", value_parser = path)]
    pub hf_config: Option<String>,

    /// train or inference [default: train]
    ///
    /// inference: a forward over the prompt (--seq) and --new-tokens decoding steps, with the
    /// KV cache.
    #[arg(long, value_name = "MODE", help_heading = "Run")]
    pub mode: Option<String>,

    /// Sequences per micro-batch [default: 1]
    #[arg(long, value_name = "N", help_heading = "Run", value_parser = sequences, allow_negative_numbers = true)]
    pub batch: Option<u64>,

    /// Tokens per sequence (the prompt, in inference) [default: 2048]
    #[arg(long, value_name = "N", help_heading = "Run", value_parser = tokens, allow_negative_numbers = true)]
    pub seq: Option<u64>,

    /// Tokens generated after the prompt (inference) [default: 1]
    #[arg(long, value_name = "N", help_heading = "Run", value_parser = tokens, allow_negative_numbers = true)]
    pub new_tokens: Option<u64>,

    /// fp32, bf16, fp16, amp-bf16, amp-fp16, mixed-bf16 or fp8 [default: bf16]
    ///
    /// bf16/fp16: everything in that dtype; amp-*: fp32 states with autocast activations;
    /// mixed-bf16: bf16 weights and grads, fp32 master weights and optimizer states
    /// (Megatron/DeepSpeed); fp8: as mixed-bf16 with fp8 weight copies (Transformer Engine).
    #[arg(long, value_name = "RECIPE", help_heading = "Run")]
    pub precision: Option<String>,

    /// adamw, adam, sgd, sgd-momentum, adafactor, adamw-8bit or paged-adamw-8bit [default: adam]
    #[arg(long, value_name = "NAME", help_heading = "Run")]
    pub optimizer: Option<String>,

    /// Activation recomputation: none, selective or full [default: none]
    #[arg(long, value_name = "WHAT", help_heading = "Run")]
    pub recompute: Option<String>,

    /// flash (SDPA) or eager [default: flash]
    #[arg(long, value_name = "KERNEL", help_heading = "Run")]
    pub attention: Option<String>,

    /// standard (the fp32 logits' log-softmax) or fused (chunked) [default: standard]
    #[arg(long, value_name = "LOSS", help_heading = "Run")]
    pub loss: Option<String>,

    /// full, lora or qlora (rank 16 on q_proj and v_proj) [default: full]
    #[arg(long, value_name = "HOW", help_heading = "Run")]
    pub finetune: Option<String>,

    /// The GPU: H100-80GB, H200, B200, A100-80GB, A100-40GB, L4, RTX-4090, … [default: H100-80GB]
    #[arg(long, value_name = "NAME", help_heading = "Run")]
    pub gpu: Option<String>,

    /// PyTorch's caching allocator: default, expandable or none [default: default]
    ///
    /// The run is replayed through the allocator's rules for the reserved and nvidia-smi
    /// figures. expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; none: no replay
    /// (reserved = allocated). A scenario file may also give {"max_split_size_mb": N}.
    #[arg(long, value_name = "MODE", help_heading = "Run")]
    pub allocator: Option<String>,

    /// Data-parallel size [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = gpus, allow_negative_numbers = true)]
    pub dp: Option<u64>,

    /// Tensor-parallel size [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = gpus, allow_negative_numbers = true)]
    pub tp: Option<u64>,

    /// Pipeline-parallel size (stages) [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = gpus, allow_negative_numbers = true)]
    pub pp: Option<u64>,

    /// Context-parallel size (ring attention) [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = gpus, allow_negative_numbers = true)]
    pub cp: Option<u64>,

    /// Expert-parallel size (MoE) [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = gpus, allow_negative_numbers = true)]
    pub ep: Option<u64>,

    /// ZeRO stage 0-3: 1 shards optimizer states, 2 also gradients, 3 also weights [default: 0]
    ///
    /// Under FSDP, 2 is SHARD_GRAD_OP and 3 FULL_SHARD.
    #[arg(long, value_name = "STAGE", help_heading = "Parallelism", value_parser = zero_stage, allow_negative_numbers = true)]
    pub zero: Option<u64>,

    /// FSDP sharding: full_shard, shard_grad_op, no_shard or hybrid_shard (sets the ZeRO stage)
    #[arg(long, value_name = "STRATEGY", help_heading = "Parallelism")]
    pub fsdp: Option<String>,

    /// fsdp (PyTorch/torchtitan), deepspeed or megatron [default: fsdp]
    #[arg(long, value_name = "NAME", help_heading = "Parallelism")]
    pub framework: Option<String>,

    /// Micro-batches per optimizer step (the pipeline's micro-batches) [default: 1]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = micro_batches, allow_negative_numbers = true)]
    pub grad_accum: Option<u64>,

    /// Pipeline schedule: 1f1b, interleaved or gpipe [default: 1f1b]
    #[arg(long, value_name = "NAME", help_heading = "Parallelism")]
    pub schedule: Option<String>,

    /// Model chunks per stage with --schedule interleaved [default: 2]
    #[arg(long, value_name = "N", help_heading = "Parallelism", value_parser = chunks, allow_negative_numbers = true)]
    pub virtual_stages: Option<u64>,

    /// Sequence parallelism with tensor parallelism: on or off [default: on]
    #[arg(long, value_name = "on|off", help_heading = "Parallelism", value_parser = on_off)]
    pub sp: Option<bool>,

    /// Loss parallelism with tensor parallelism (torchtitan's loss_parallel): on or off
    ///
    /// on: the cross-entropy runs on the vocabulary-sharded logits, each rank keeping its
    /// shard; off: the logits are gathered whole first. Needs --tp above 1.
    #[arg(long, value_name = "on|off", help_heading = "Parallelism", value_parser = on_off)]
    pub loss_parallel: Option<bool>,

    /// Expert parallelism's token dispatch: titan (all-to-all) or hf [default: titan]
    ///
    /// titan: each rank routes its own tokens and exchanges the routed rows with the ranks
    /// holding their experts (torchtitan). hf: transformers' expert-parallel plan, every rank
    /// routing every token.
    #[arg(long, value_name = "HOW", help_heading = "Parallelism")]
    pub ep_impl: Option<String>,

    /// Context parallelism's load balancing (head and tail chunks per rank): on or off
    /// [default: on]
    #[arg(long, value_name = "on|off", help_heading = "Parallelism", value_parser = on_off)]
    pub cp_load_balance: Option<bool>,

    /// Megatron-LM: keep and reduce the gradient buffer in bf16 (--grad-reduce-in-bf16)
    ///
    /// Megatron accumulates gradients in an fp32 buffer by default (4 bytes per parameter);
    /// this halves it. Needs --framework megatron.
    #[arg(long, help_heading = "Parallelism")]
    pub grad_reduce_in_bf16: bool,

    /// FSDP units: layers (each decoder layer, and the root) or titan (torchtitan's)
    ///
    /// titan: the embedding, each decoder layer, the final norm with lm_head, and the root,
    /// as torchtitan wraps a model.
    #[arg(long, value_name = "HOW", help_heading = "Parallelism")]
    pub wrap: Option<String>,

    /// Kept in CPU memory: none, optimizer or optimizer+params (needs ZeRO-3) [default: none]
    #[arg(long, value_name = "WHAT", help_heading = "Parallelism")]
    pub offload: Option<String>,
}

/// What the planner searches over and how many layouts it lists.
#[derive(Debug, Default, Args)]
pub struct PlanFlags {
    /// GPU counts to try: 2048; 8,16,24; 8..16384 (powers of two); 8..128:8 (steps of 8)
    #[arg(long, value_name = "COUNTS", help_heading = "Plan")]
    pub gpus: Option<String>,

    /// Sequences per optimizer step [default: 1]
    #[arg(long, value_name = "N", help_heading = "Plan", value_parser = sequences, allow_negative_numbers = true)]
    pub global_batch: Option<u64>,

    /// GPUs per node, the NVLink domain: tensor parallelism stays inside it [default: 8]
    #[arg(long, value_name = "N", help_heading = "Plan", value_parser = node_gpus, allow_negative_numbers = true)]
    pub gpus_per_node: Option<u64>,

    /// Layouts to list [default: 10]
    #[arg(long, value_name = "N", help_heading = "Plan", value_parser = layouts, allow_negative_numbers = true)]
    pub top: Option<u64>,

    /// Only layouts that keep every state on the GPU (no CPU offload)
    #[arg(long, help_heading = "Plan")]
    pub no_offload: bool,

    /// CPU memory per node available to offload, in GB [default: 2000]
    #[arg(long, value_name = "GB", help_heading = "Plan", value_parser = host_gb, allow_negative_numbers = true)]
    pub host_memory_gb: Option<u64>,
}

/// A whole number for a field the engine bounds by `max`; beyond 2^64 − 1 (which JSON cannot
/// carry to the engine) the message gives the bound in words. In range, the engine judges.
fn whole(v: &str, bound: impl FnOnce() -> String) -> Result<u64, String> {
    let digits = v.strip_prefix('+').unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(gpumem::knobs::not_whole(v));
    }
    digits.parse::<u64>().map_err(|_| {
        format!(
            "{} is too large ({})",
            gpumem::knobs::shown(digits),
            bound()
        )
    })
}

// The engine's bounds (crates/gpumem/src/scenario.rs, plan.rs), for the overflow messages;
// `tests/cli.rs` checks that they agree with what the engine accepts.
pub const MAX_GPUS: u64 = 1 << 20;
pub const MAX_SEQUENCES: u64 = 1 << 24;
pub const MAX_TOKENS_PER_SEQ: u64 = 1 << 27;
pub const MAX_VIRTUAL_STAGES: u64 = 1024;
pub const MAX_GPUS_PER_NODE: u64 = 1024;
pub const MAX_LAYOUTS: u64 = 1000;
pub const MAX_HOST_GB: u64 = 1 << 30;

fn gpus(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_GPUS} GPUs"))
}
fn micro_batches(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_GPUS} micro-batches"))
}
fn sequences(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_SEQUENCES} sequences"))
}
fn tokens(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_TOKENS_PER_SEQ} tokens"))
}
fn zero_stage(v: &str) -> Result<u64, String> {
    whole(v, || "ZeRO stages are 0 to 3".into())
}
fn chunks(v: &str) -> Result<u64, String> {
    whole(v, || {
        format!("at most {MAX_VIRTUAL_STAGES} chunks per stage")
    })
}
fn node_gpus(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_GPUS_PER_NODE} GPUs per node"))
}
fn layouts(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_LAYOUTS} layouts"))
}
fn host_gb(v: &str) -> Result<u64, String> {
    whole(v, || format!("at most {MAX_HOST_GB} GB"))
}

fn path(v: &str) -> Result<String, String> {
    match v {
        "" => Err("the file name is empty".into()),
        _ => Ok(v.to_string()),
    }
}

fn on_off(v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err("must be on or off".into()),
    }
}

/// The JSON object flags describe, laid over `base` (a scenario file's object): each flag
/// replaces one field, inside `parallel` too. Returns the fields flags set (`parallel.tp`),
/// so that an error about one is not blamed on the file.
pub fn apply(
    s: &ScenarioFlags,
    plan: Option<&PlanFlags>,
    obj: &mut Map<String, Value>,
) -> Result<Vec<String>, String> {
    let mut set = Vec::new();
    let mut top = |key: &str, v: Value| {
        obj.insert(key.to_string(), v);
        set.push(key.to_string());
    };
    let text = |v: &Option<String>| v.as_ref().map(|s| Value::String(s.clone()));
    if let Some(m) = &s.model {
        top("model", serde_json::json!({ "preset": m }));
    }
    for (key, v) in [
        ("mode", text(&s.mode)),
        ("batch", s.batch.map(Value::from)),
        ("seq", s.seq.map(Value::from)),
        ("new_tokens", s.new_tokens.map(Value::from)),
        ("precision", text(&s.precision)),
        ("optimizer", text(&s.optimizer)),
        ("recompute", text(&s.recompute)),
        ("attention", text(&s.attention)),
        ("loss", text(&s.loss)),
        ("finetune", text(&s.finetune)),
        ("gpu", text(&s.gpu)),
        ("allocator", text(&s.allocator)),
    ] {
        if let Some(v) = v {
            top(key, v);
        }
    }
    if let Some(p) = plan {
        for (key, v) in [
            ("gpus", text(&p.gpus)),
            ("global_batch", p.global_batch.map(Value::from)),
            ("gpus_per_node", p.gpus_per_node.map(Value::from)),
            ("top", p.top.map(Value::from)),
            ("host_memory_gb", p.host_memory_gb.map(Value::from)),
            ("offload", p.no_offload.then_some(Value::Bool(false))),
        ] {
            if let Some(v) = v {
                top(key, v);
            }
        }
    }
    let parallel: Vec<(&str, Value)> = [
        ("dp", s.dp.map(Value::from)),
        ("tp", s.tp.map(Value::from)),
        ("pp", s.pp.map(Value::from)),
        ("cp", s.cp.map(Value::from)),
        ("ep", s.ep.map(Value::from)),
        ("zero", s.zero.map(Value::from)),
        ("fsdp", text(&s.fsdp)),
        ("framework", text(&s.framework)),
        ("grad_accum", s.grad_accum.map(Value::from)),
        ("schedule", text(&s.schedule)),
        ("virtual_stages", s.virtual_stages.map(Value::from)),
        ("sp", s.sp.map(Value::Bool)),
        ("loss_parallel", s.loss_parallel.map(Value::Bool)),
        (
            "grad_reduce_in_bf16",
            s.grad_reduce_in_bf16.then_some(Value::Bool(true)),
        ),
        ("wrap", text(&s.wrap)),
        ("ep_impl", text(&s.ep_impl)),
        ("cp_load_balance", s.cp_load_balance.map(Value::Bool)),
        ("offload", text(&s.offload)),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    if !parallel.is_empty() {
        let Value::Object(m) = obj
            .entry("parallel")
            .or_insert_with(|| Value::Object(Map::new()))
        else {
            return Err("parallel: must be a JSON object".into());
        };
        for (k, v) in parallel {
            m.insert(k.to_string(), v);
            set.push(format!("parallel.{k}"));
        }
    }
    Ok(set)
}

/// Flags this run would not use, each refused by name rather than silently ignored: what
/// only training uses under `--mode inference`, `--new-tokens` in training, and a setting of a
/// parallelism (tensor, context, expert, pipeline, FSDP sharding) the run does not have.
pub fn unused(f: &ScenarioFlags, s: &gpumem::Scenario) -> Result<(), String> {
    use gpumem::scenario::{Framework, Mode};
    let p = &s.parallel;
    let train = s.mode == Mode::Train;
    let training = "a training setting, unused with --mode inference";
    let rules = [
        (
            f.new_tokens.is_some() && train,
            "--new-tokens",
            "counts in --mode inference only; a training step generates no tokens",
        ),
        (f.optimizer.is_some() && !train, "--optimizer", training),
        (f.recompute.is_some() && !train, "--recompute", training),
        (f.loss.is_some() && !train, "--loss", training),
        (f.grad_accum.is_some() && !train, "--grad-accum", training),
        (f.offload.is_some() && !train, "--offload", training),
        (f.wrap.is_some() && !train, "--wrap", training),
        (f.framework.is_some() && !train, "--framework", training),
        (
            f.grad_reduce_in_bf16 && !train,
            "--grad-reduce-in-bf16",
            training,
        ),
        (f.sp.is_some() && p.tp == 1, "--sp", "needs --tp above 1"),
        (
            f.loss_parallel.is_some() && (p.tp == 1 || p.framework != Framework::Fsdp),
            "--loss-parallel",
            "needs --tp above 1 under fsdp (Megatron's loss is always vocabulary-parallel)",
        ),
        (
            f.cp_load_balance.is_some() && p.cp == 1,
            "--cp-load-balance",
            "needs --cp above 1",
        ),
        (
            f.ep_impl.is_some() && (p.ep == 1 || p.framework != Framework::Fsdp),
            "--ep-impl",
            "needs --ep above 1 under fsdp",
        ),
        (
            f.schedule.is_some() && p.pp == 1,
            "--schedule",
            "needs --pp above 1",
        ),
        (
            f.virtual_stages.is_some() && p.pp == 1,
            "--virtual-stages",
            "needs --pp above 1",
        ),
        (
            f.wrap.is_some() && (p.zero < 2 || p.framework == Framework::DeepSpeed),
            "--wrap",
            "sets FSDP's units: needs --zero 2 or 3 (or --fsdp) under fsdp or megatron",
        ),
    ];
    match rules.iter().find(|r| r.0) {
        Some((_, flag, why)) => Err(format!("{flag}: {why}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    fn object(args: &[&str]) -> Map<String, Value> {
        let cli = Cli::try_parse_from(args).unwrap();
        let mut obj = Map::new();
        match cli.command {
            Command::Estimate(a) => apply(&a.scenario, None, &mut obj),
            Command::Plan(a) => apply(&a.scenario, Some(&a.plan), &mut obj),
            _ => unreachable!(),
        }
        .unwrap();
        obj
    }

    #[test]
    fn every_flag_sets_its_field() {
        let o = object(&[
            "gpumem",
            "estimate",
            "--model",
            "llama3.1-8b",
            "--mode",
            "train",
            "--batch",
            "4",
            "--seq",
            "8192",
            "--new-tokens",
            "3",
            "--precision",
            "mixed-bf16",
            "--optimizer",
            "adamw",
            "--recompute",
            "full",
            "--attention",
            "eager",
            "--loss",
            "fused",
            "--finetune",
            "lora",
            "--gpu",
            "H200",
            "--allocator",
            "expandable",
            "--dp",
            "2",
            "--tp",
            "4",
            "--pp",
            "8",
            "--cp",
            "2",
            "--ep",
            "1",
            "--zero",
            "3",
            "--fsdp",
            "hybrid_shard",
            "--framework",
            "fsdp",
            "--grad-accum",
            "16",
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--sp",
            "off",
            "--loss-parallel",
            "on",
            "--wrap",
            "titan",
            "--offload",
            "optimizer",
        ]);
        assert_eq!(
            Value::Object(o),
            serde_json::json!({
                "model": {"preset": "llama3.1-8b"}, "mode": "train", "batch": 4, "seq": 8192,
                "new_tokens": 3, "precision": "mixed-bf16", "optimizer": "adamw",
                "recompute": "full", "attention": "eager", "loss": "fused", "finetune": "lora",
                "gpu": "H200", "allocator": "expandable",
                "parallel": {
                    "dp": 2, "tp": 4, "pp": 8, "cp": 2, "ep": 1, "zero": 3,
                    "fsdp": "hybrid_shard", "framework": "fsdp", "grad_accum": 16,
                    "schedule": "interleaved", "virtual_stages": 2, "sp": false,
                    "loss_parallel": true, "wrap": "titan", "offload": "optimizer"
                }
            })
        );
    }

    #[test]
    fn plan_passes_every_flag_on() {
        let o = object(&[
            "gpumem",
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "2",
            "--tp",
            "2",
            "--offload",
            "none",
            "--gpus",
            "8..64",
            "--global-batch",
            "64",
            "--gpus-per-node",
            "4",
            "--top",
            "3",
            "--host-memory-gb",
            "100",
            "--no-offload",
        ]);
        assert_eq!(
            Value::Object(o),
            serde_json::json!({
                "model": {"preset": "gpt2"}, "batch": 2, "gpus": "8..64", "global_batch": 64,
                "gpus_per_node": 4, "top": 3, "host_memory_gb": 100, "offload": false,
                "parallel": {"tp": 2, "offload": "none"}
            })
        );
    }

    #[test]
    fn flags_override_a_scenario_field_by_field() {
        let cli = Cli::try_parse_from(["gpumem", "estimate", "--tp", "2", "--batch", "8"]).unwrap();
        let Command::Estimate(a) = cli.command else {
            unreachable!()
        };
        let mut obj = serde_json::json!({"batch": 1, "seq": 4096, "parallel": {"tp": 8, "pp": 2}})
            .as_object()
            .cloned()
            .unwrap();
        let set = apply(&a.scenario, None, &mut obj).unwrap();
        assert_eq!(
            Value::Object(obj),
            serde_json::json!({"batch": 8, "seq": 4096, "parallel": {"tp": 2, "pp": 2}})
        );
        assert_eq!(set, ["batch", "parallel.tp"]);
    }

    #[test]
    fn numbers_beyond_u64_say_the_bound_in_words() {
        assert_eq!(
            gpus("18446744073709551616").unwrap_err(),
            "18446744073709551616 is too large (at most 1048576 GPUs)"
        );
        assert_eq!(
            gpus("-3").unwrap_err(),
            "'-3' is negative: give a whole number"
        );
        assert_eq!(gpus("4k").unwrap_err(), "'4k' is not a whole number");
        assert_eq!(gpus("+4"), Ok(4));
        // In range of u64 but beyond the engine's bound: the engine says so, naming the field.
        assert_eq!(gpus("2000000"), Ok(2_000_000));
    }
}
