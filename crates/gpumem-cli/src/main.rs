//! `gpumem`: will this run fit on my GPU, and why?

use std::process::ExitCode;

use gpumem::{estimate, plan, Estimate, Scenario};
use serde_json::{Map, Value};

const USAGE: &str = "\
gpumem — predicts per-GPU memory of LLM training and inference

USAGE:
  gpumem estimate [--scenario FILE] [--hf-config FILE] [FLAGS] [--json]
  gpumem plan --gpus COUNTS --global-batch N [ESTIMATE FLAGS] [--top N] [--json]
  gpumem presets [--json]
  gpumem help

ESTIMATE FLAGS (override the scenario file's fields):
  --model NAME          a preset (see `gpumem presets`)
  --hf-config FILE      a Hugging Face config.json as the model
  --mode train|inference
  --batch N  --seq N  --new-tokens N
  --precision RECIPE    fp32, bf16, fp16, amp-bf16, amp-fp16, mixed-bf16, fp8
  --optimizer NAME      adamw, adam, sgd, sgd-momentum, adafactor, adamw-8bit
  --recompute none|selective|full
  --attention flash|eager
  --loss standard|fused
  --finetune full|lora|qlora
  --gpu NAME            H100-80GB, H200, B200, A100-80GB, A100-40GB, L4, RTX-4090, …
  --dp N --tp N --pp N --cp N --ep N
                        data, tensor, pipeline, context, expert parallel sizes
  --zero 0-3            ZeRO stage (FSDP: 2 SHARD_GRAD_OP, 3 FULL_SHARD)
  --fsdp STRATEGY       full_shard, shard_grad_op, no_shard, hybrid_shard
  --framework NAME      fsdp (PyTorch/torchtitan), deepspeed, megatron
  --grad-accum N        micro-batches per step (the pipeline's micro-batches)
  --schedule 1f1b|interleaved  --virtual-stages N
  --sp on|off           sequence parallelism with tp (default on)
  --offload none|optimizer|optimizer+params
  --json                one JSON object instead of the table

PLAN FLAGS:
  --gpus COUNTS         2048, 8,16,24, 8..16384 (powers of two), 8..128:8 (steps of 8)
  --global-batch N      sequences per optimizer step (default 1)
  --gpus-per-node N     NVLink domain size (default 8): tp stays inside it
  --top N               layouts to list (default 10)
  --no-offload          only layouts that keep every state on the GPU
  --host-memory-gb N    CPU memory per node for offload (default 2000)

Exit codes: 0 ok, 2 bad input.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    match args.first().map(String::as_str) {
        Some("estimate") => cmd_estimate(&args[1..]),
        Some("plan") => cmd_plan(&args[1..]),
        Some("presets") => Ok(cmd_presets(args[1..].iter().any(|a| a == "--json"))),
        Some("help") | Some("--help") | Some("-h") | None => Ok(USAGE.to_string()),
        Some(other) => Err(format!(
            "unknown command '{}'\n\n{USAGE}",
            other.chars().take(40).collect::<String>()
        )),
    }
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn parse_json(path: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text)
        .map_err(|e| format!("{path}:{}:{}: malformed JSON: {e}", e.line(), e.column()))
}

/// The scenario (or plan request) the flags and files describe, and whether `--json` was
/// given. Errors name the flag or the file the wrong value came from.
struct Input {
    obj: Map<String, Value>,
    json: bool,
    scenario_path: Option<String>,
    config_path: Option<String>,
}

impl Input {
    fn error(&self, e: gpumem::Error) -> String {
        let file = match (&self.config_path, &self.scenario_path) {
            (Some(c), _) if e.field.starts_with("model.hf_config") => Some(c),
            (_, Some(p)) => Some(p),
            _ => None,
        };
        match file {
            Some(f) => format!("{f}: {e}"),
            None => e.to_string(),
        }
    }
}

fn cmd_estimate(args: &[String]) -> Result<String, String> {
    let input = parse_args(args, false)?;
    let scenario =
        Scenario::from_value(&Value::Object(input.obj.clone())).map_err(|e| input.error(e))?;
    let e = estimate(&scenario).map_err(|e| e.to_string())?;
    Ok(if input.json {
        serde_json::to_string_pretty(&e).expect("estimate serialises")
    } else {
        table(&e)
    })
}

fn cmd_plan(args: &[String]) -> Result<String, String> {
    let input = parse_args(args, true)?;
    let req =
        plan::Request::from_value(&Value::Object(input.obj.clone())).map_err(|e| input.error(e))?;
    let p = plan::plan(&req);
    Ok(if input.json {
        serde_json::to_string_pretty(&p).expect("plan serialises")
    } else {
        plan_table(&p)
    })
}

fn parse_args(args: &[String], planning: bool) -> Result<Input, String> {
    let mut json = false;
    let mut obj = Map::new();
    let mut i = 0;
    let mut scenario_path = None;
    let mut config_path: Option<String> = None;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--json" {
            json = true;
            i += 1;
            continue;
        }
        if flag == "--no-offload" && planning {
            obj.insert("offload".into(), Value::Bool(false));
            i += 1;
            continue;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| format!("{flag} needs a value"))?
            .as_str();
        let num = |v: &str| -> Result<Value, String> {
            v.parse::<u64>()
                .map(Value::from)
                .map_err(|_| format!("{flag}: '{v}' is not a positive whole number"))
        };
        match flag {
            "--scenario" => {
                let text = read(value)?;
                match parse_json(value, &text)? {
                    Value::Object(m) => {
                        for (k, v) in m {
                            obj.entry(k).or_insert(v);
                        }
                    }
                    _ => return Err(format!("{value}: a scenario must be a JSON object")),
                }
                scenario_path = Some(value.to_string());
            }
            "--hf-config" => {
                let cfg = parse_json(value, &read(value)?)?;
                obj.insert("model".into(), serde_json::json!({ "hf_config": cfg }));
                config_path = Some(value.to_string());
            }
            "--model" => {
                obj.insert("model".into(), serde_json::json!({ "preset": value }));
            }
            "--mode" | "--precision" | "--optimizer" | "--recompute" | "--attention" | "--loss"
            | "--finetune" | "--gpu" => {
                obj.insert(flag[2..].to_string(), Value::String(value.to_string()));
            }
            "--batch" | "--seq" => {
                obj.insert(flag[2..].to_string(), num(value)?);
            }
            "--new-tokens" => {
                obj.insert("new_tokens".into(), num(value)?);
            }
            "--dp" | "--tp" | "--pp" | "--cp" | "--ep" | "--zero" | "--grad-accum"
            | "--virtual-stages" | "--framework" | "--schedule" | "--offload" | "--fsdp"
            | "--sp" => {
                let key = flag[2..].replace('-', "_");
                let v = match flag {
                    "--framework" | "--schedule" | "--offload" | "--fsdp" => {
                        Value::String(value.to_string())
                    }
                    "--sp" => match value {
                        "true" | "on" => Value::Bool(true),
                        "false" | "off" => Value::Bool(false),
                        _ => return Err(format!("--sp: '{value}' is not on or off")),
                    },
                    _ => num(value)?,
                };
                match obj
                    .entry("parallel")
                    .or_insert_with(|| Value::Object(Map::new()))
                {
                    Value::Object(m) => {
                        m.insert(key, v);
                    }
                    _ => return Err("parallel: must be an object".into()),
                }
            }
            "--global-batch" | "--gpus-per-node" | "--top" | "--host-memory-gb" if planning => {
                obj.insert(flag[2..].replace('-', "_"), num(value)?);
            }
            "--gpus" if planning => {
                obj.insert("gpus".into(), Value::String(value.to_string()));
            }
            other => {
                return Err(format!(
                    "unknown flag '{}' (see `gpumem help`)",
                    other.chars().take(40).collect::<String>()
                ))
            }
        }
        i += 2;
    }
    if !obj.contains_key("model") {
        return Err("no model: give --model NAME, --hf-config FILE or --scenario FILE".into());
    }
    Ok(Input {
        obj,
        json,
        scenario_path,
        config_path,
    })
}

fn plan_table(p: &plan::Plan) -> String {
    let mut s = format!(
        "{} on {}, seq {}, global batch {} sequences: {} layouts considered, {} fit\n",
        p.model, p.gpu, p.seq, p.global_batch, p.considered, p.fitting
    );
    match p.fewest_gpus {
        Some(n) => s.push_str(&format!("fewest GPUs with a layout that fits: {n}\n")),
        None => s.push_str("no GPU count tried has a layout that fits\n"),
    }
    if p.counts.len() > 1 {
        s.push_str("\nbest layout per GPU count\n");
        s.push_str(&format!(
            "{:>7}  {:>8}  {:>7}  best\n",
            "GPUs", "layouts", "fit"
        ));
        for c in &p.counts {
            s.push_str(&format!(
                "{:>7}  {:>8}  {:>7}  {}\n",
                c.gpus,
                c.considered,
                c.fitting,
                c.best.as_ref().map_or("—".into(), layout_words)
            ));
        }
    }
    if !p.best.is_empty() {
        s.push_str(&format!(
            "\n{:>3}  {:>6} {:>4} {:>3} {:>3} {:>3} {:>3}  {:>4}  {:>5}  {:>3}  {:<9} {:<8} {:>10} {:>10} {:>7} {:>9} {:>9}\n",
            "#", "GPUs", "dp", "tp", "pp", "cp", "ep", "zero", "mbs×m", "v", "recompute", "offload",
            "peak", "headroom", "bubble", "comm/GPU", "step (s)"
        ));
        for (i, c) in p.best.iter().enumerate() {
            let l = &c.layout;
            s.push_str(&format!(
                "{:>3}  {:>6} {:>4} {:>3} {:>3} {:>3} {:>3}  {:>4}  {:>5}  {:>3}  {:<9} {:<8} {:>10} {:>10} {:>6.1}% {:>6.1} GB {:>9.2}\n",
                i + 1,
                l.gpus,
                l.dp,
                l.tp,
                l.pp,
                l.cp,
                l.ep,
                l.zero,
                format!("{}×{}", l.micro_batch, l.grad_accum),
                l.virtual_stages,
                l.recompute,
                l.offload,
                gib(c.device_bytes as f64),
                gib(c.headroom_bytes as f64),
                c.bubble * 100.0,
                c.traffic_bytes.total() / 1e9,
                c.step_seconds
            ));
        }
    }
    s.push_str(&format!("\ncost model: {}", p.cost_model));
    s
}

fn layout_words(c: &plan::Candidate) -> String {
    let l = &c.layout;
    format!(
        "dp {} tp {} pp {} cp {} ep {}, zero {}, micro-batch {}×{}{}, recompute {}, {} ({} per GPU), step ≈ {:.2} s",
        l.dp,
        l.tp,
        l.pp,
        l.cp,
        l.ep,
        l.zero,
        l.micro_batch,
        l.grad_accum,
        if l.virtual_stages > 1 { format!(", interleaved ×{}", l.virtual_stages) } else { String::new() },
        l.recompute,
        if l.offload == "none" { "no offload".to_string() } else { format!("offload {}", l.offload) },
        gib(c.device_bytes as f64),
        c.step_seconds
    )
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

fn table(e: &Estimate) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<26}{v}\n"));
    line(&mut s, "model", e.model.clone());
    line(
        &mut s,
        "parameters",
        format!("{} ({} trainable)", e.params, e.trainable_params),
    );
    line(
        &mut s,
        "peak (allocated)",
        format!("{}  during {}", gib(e.peak_bytes as f64), e.peak_phase),
    );
    s.push_str("breakdown at the peak\n");
    let mut comps: Vec<_> = e.components.iter().filter(|(_, v)| **v > 0).collect();
    comps.sort_by(|a, b| b.1.cmp(a.1));
    for (k, v) in comps {
        let pct = 100.0 * *v as f64 / e.peak_bytes.max(1) as f64;
        line(
            &mut s,
            &format!("  {k}"),
            format!("{:>12}  {pct:5.1} %", gib(*v as f64)),
        );
    }
    if e.host_bytes > 0 {
        line(&mut s, "CPU memory (offload)", gib(e.host_bytes as f64));
    }
    if e.kv_cache_bytes > 0 {
        line(&mut s, "KV cache (final)", gib(e.kv_cache_bytes as f64));
    }
    line(&mut s, "model states", gib(e.model_states_bytes as f64));
    line(
        &mut s,
        "allocator reserve (est.)",
        gib(e.allocator_reserve_bytes as f64),
    );
    line(&mut s, "CUDA context", gib(e.cuda_context_bytes as f64));
    line(
        &mut s,
        "device total (nvidia-smi)",
        gib(e.device_bytes as f64),
    );
    line(
        &mut s,
        "GPU",
        format!("{} ({})", e.gpu, gib(e.capacity_bytes as f64)),
    );
    let verdict = if e.fits {
        format!("fits — {} headroom", gib(e.headroom_bytes as f64))
    } else {
        format!(
            "does NOT fit — exceeds by {}",
            gib(-e.headroom_bytes as f64)
        )
    };
    line(&mut s, "verdict", verdict);
    for n in &e.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    s.trim_end().to_string()
}

fn cmd_presets(json: bool) -> String {
    let presets = gpumem::presets::all();
    if json {
        let v: Vec<Value> = presets
            .iter()
            .map(|p| {
                let c = p.arch.params();
                serde_json::json!({
                    "name": p.name, "aliases": p.aliases, "family": p.arch.family.name(),
                    "params": c.total, "active_params": c.active, "layers": p.arch.layers,
                    "hidden": p.arch.hidden, "vocab": p.arch.vocab, "source": p.source,
                })
            })
            .collect();
        return serde_json::to_string_pretty(&v).expect("serialises");
    }
    let mut s = format!(
        "{:<16}{:<13}{:>18}  {:>7}  {:>7}  source\n",
        "name", "family", "parameters", "layers", "hidden"
    );
    for p in presets {
        s.push_str(&format!(
            "{:<16}{:<13}{:>18}  {:>7}  {:>7}  {}\n",
            p.name,
            p.arch.family.name(),
            p.arch.params().total,
            p.arch.layers,
            p.arch.hidden,
            p.source
        ));
    }
    s.trim_end().to_string()
}
