//! `gpumem`: will this run fit on my GPU, and why? (`gpumem --help`)

use std::process::ExitCode;

use gpumem::{estimate, plan, Estimate, Scenario};
use serde_json::{Map, Value};

mod cli;
mod files;

use clap::{CommandFactory, Parser};

use cli::{Cli, Command, PlanFlags, ScenarioFlags};

fn main() -> ExitCode {
    // Usage errors (an unknown flag, a bad value) exit 2 with clap's message and suggestion;
    // --help and --version exit 0.
    let cli = Cli::parse();
    match run(cli) {
        Ok(out) => {
            use std::io::Write;
            let mut stdout = std::io::stdout().lock();
            match writeln!(stdout, "{out}").and_then(|()| stdout.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                // The reader has gone (`gpumem plan … | head`): nothing left to say.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<String, String> {
    match cli.command {
        Command::Estimate(a) => {
            let input = Input::new(&a.scenario, None)?;
            let scenario = Scenario::from_value(&input.value()).map_err(|e| input.error(e))?;
            cli::unused(&a.scenario, &scenario)?;
            if let Some(e) = unused_in_file(&input.value(), &scenario) {
                return Err(input.error(e));
            }
            let e = estimate(&scenario).map_err(|e| e.to_string())?;
            Ok(if a.json {
                serde_json::to_string_pretty(&e).expect("estimate serialises")
            } else {
                table(&e, &scenario)
            })
        }
        Command::Plan(a) => {
            let input = Input::new(&a.scenario, Some(&a.plan))?;
            let req = plan::Request::from_value(&input.value()).map_err(|e| input.error(e))?;
            if a.plan.host_memory_gb.is_some() && !req.offload {
                return Err(
                    "--host-memory-gb: is for offload, which --no-offload rules out".into(),
                );
            }
            let p = plan::plan(&req);
            Ok(if a.json {
                serde_json::to_string_pretty(&p).expect("plan serialises")
            } else {
                plan_table(&p)
            })
        }
        Command::Presets(a) => Ok(cmd_presets(a.json)),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gpumem", &mut out);
            Ok(String::from_utf8_lossy(&out).trim_end().to_string())
        }
    }
}

/// The scenario (or plan request) the files and flags describe. Errors name the flag, the
/// file or the field the wrong value came from.
struct Input {
    obj: Map<String, Value>,
    /// The fields flags set (`batch`, `parallel.tp`): an error about one is not the file's.
    from_flags: Vec<String>,
    scenario_path: Option<String>,
    config_path: Option<String>,
}

impl Input {
    fn new(flags: &ScenarioFlags, plan: Option<&PlanFlags>) -> Result<Input, String> {
        let mut obj = Map::new();
        if let Some(path) = &flags.scenario {
            match files::read_json(path)? {
                Value::Object(m) => obj = m,
                _ => return Err(format!("{path}: a scenario must be a JSON object")),
            }
        }
        if let Some(path) = &flags.hf_config {
            let cfg = files::read_json(path)?;
            obj.insert("model".into(), serde_json::json!({ "hf_config": cfg }));
        }
        let from_flags = cli::apply(flags, plan, &mut obj).map_err(|e| match &flags.scenario {
            Some(path) => format!("{path}: {e}"),
            None => e,
        })?;
        if !obj.contains_key("model") {
            return Err("no model: give --model NAME, --hf-config FILE or --scenario FILE".into());
        }
        Ok(Input {
            obj,
            from_flags,
            scenario_path: flags.scenario.clone(),
            config_path: flags.hf_config.clone(),
        })
    }

    fn value(&self) -> Value {
        Value::Object(self.obj.clone())
    }

    fn error(&self, e: gpumem::Error) -> String {
        let field = e.field.as_str();
        let within = |f: &str| {
            field == f
                || field
                    .strip_prefix(f)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        };
        let file = match (&self.config_path, &self.scenario_path) {
            (Some(c), _) if within("model.hf_config") => Some(c),
            _ if self.from_flags.iter().any(|f| within(f)) => None,
            (_, Some(p)) => Some(p),
            _ => None,
        };
        match file {
            Some(f) => format!("{f}: {e}"),
            None => e.to_string(),
        }
    }
}

/// What a scenario file sets that its scenario does not use, refused as the flags are
/// ([`cli::unused`]): tokens to generate in training, a pipeline schedule without stages.
/// (Plan requests may give a schedule: the planner sweeps the stages.)
fn unused_in_file(v: &Value, s: &Scenario) -> Option<gpumem::Error> {
    if s.mode == gpumem::scenario::Mode::Train && v.get("new_tokens").is_some() {
        return Some(gpumem::Error::new(
            "new_tokens",
            "counts in mode \"inference\" only; a training step generates no tokens",
        ));
    }
    let p = v.get("parallel");
    let given = |k: &str, plain: Value| p.and_then(|p| p.get(k)).is_some_and(|x| *x != plain);
    if s.parallel.pp == 1 {
        for (k, plain) in [
            ("schedule", Value::from("1f1b")),
            ("virtual_stages", Value::from(1)),
        ] {
            if given(k, plain) {
                return Some(gpumem::Error::new(
                    format!("parallel.{k}"),
                    "needs pp above 1 (a pipeline's schedule)",
                ));
            }
        }
    }
    None
}

fn plan_table(p: &plan::Plan) -> String {
    let mut s = format!(
        "{} on {}, seq {}, global batch {} sequences: {} layouts considered, {} fit\n",
        p.model, p.gpu, p.seq, p.global_batch, p.considered, p.fitting
    );
    match p.fewest_gpus {
        Some(n) => s.push_str(&format!("fewest GPUs with a layout that fits: {n}\n")),
        None if p.considered == 0 => s.push_str(
            "no layout on the GPU counts tried meets the constraints given: relax a layout flag (dp, tp, pp, cp, ep, zero, micro-batches, schedule, recompute) or try other GPU counts\n",
        ),
        None => s.push_str("no GPU count tried has a layout that fits\n"),
    }
    if let (None, Some(why)) = (p.fewest_gpus, &p.refused) {
        s.push_str(&format!("some layouts were refused: {why}\n"));
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
        // The micro-batch column as wide as its widest entry ("1×65536").
        let mbs = |l: &plan::Layout| format!("{}×{}", l.micro_batch, l.grad_accum);
        let w = p
            .best
            .iter()
            .map(|c| mbs(&c.layout).chars().count())
            .max()
            .unwrap_or(0)
            .max(5);
        // And the offload column as its widest ("optimizer+params").
        let o = p
            .best
            .iter()
            .map(|c| c.layout.offload.chars().count())
            .max()
            .unwrap_or(0)
            .max(8);
        s.push_str(&format!(
            "\n{:>3}  {:>6} {:>4} {:>3} {:>3} {:>3} {:>3}  {:>4}  {:>w$}  {:>3}  {:<9} {:<o$} {:>10} {:>10} {:>7} {:>9} {:>9}\n",
            "#", "GPUs", "dp", "tp", "pp", "cp", "ep", "zero", "mbs×m", "v", "recompute", "offload",
            "device", "headroom", "bubble", "comm/GPU", "step (s)"
        ));
        for (i, c) in p.best.iter().enumerate() {
            let l = &c.layout;
            s.push_str(&format!(
                "{:>3}  {:>6} {:>4} {:>3} {:>3} {:>3} {:>3}  {:>4}  {:>w$}  {:>3}  {:<9} {:<o$} {:>10} {:>10} {:>6.1}% {:>6.1} GB {:>9.2}\n",
                i + 1,
                l.gpus,
                l.dp,
                l.tp,
                l.pp,
                l.cp,
                l.ep,
                l.zero,
                mbs(l),
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
    if !p.best.is_empty() {
        s.push_str("\ndevice: each GPU's memory in use as nvidia-smi would show it, CUDA's context and the reserved peak (the caching allocator replayed on one GPU, the allocated peak on more); headroom: the GPU's memory less that\n");
    }
    s.push_str(&format!("\ncost model: {}", p.cost_model));
    s
}

fn layout_words(c: &plan::Candidate) -> String {
    let l = &c.layout;
    format!(
        "dp {} tp {} pp {} cp {} ep {}, zero {}, micro-batch {}×{}{}, recompute {}, {} ({} per GPU in nvidia-smi), step ≈ {:.2} s",
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

fn table(e: &Estimate, sc: &Scenario) -> String {
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<26}{v}\n"));
    line(&mut s, "model", e.model.clone());
    line(
        &mut s,
        "parameters",
        // A LoRA run trains its adapters, which are not among the model's parameters.
        if matches!(sc.finetune, gpumem::scenario::Finetune::Lora(_)) {
            format!(
                "{} (+ {} trainable in LoRA adapters)",
                e.params, e.trainable_params
            )
        } else {
            format!("{} ({} trainable)", e.params, e.trainable_params)
        },
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
    if e.reserved_replayed {
        line(
            &mut s,
            "reserved (peak)",
            format!(
                "{}  {} allocator, {} segments",
                gib(e.peak_reserved_bytes as f64),
                e.allocator,
                e.segments
            ),
        );
        line(
            &mut s,
            "  unallocated at peak",
            format!(
                "{}  (largest free block {}{})",
                gib(e.reserved_unallocated_bytes as f64),
                gib(e.largest_free_block_bytes as f64),
                if e.fragmentation_oom {
                    "; out of memory from fragmentation"
                } else {
                    ""
                }
            ),
        );
        line(
            &mut s,
            "  cuBLAS workspaces",
            format!(
                "{}  (in the peak and in reserved)",
                gib(e.cublas_workspace_bytes as f64)
            ),
        );
    } else {
        line(
            &mut s,
            "reserved (peak)",
            format!(
                "{}  (allocated; not replayed)",
                gib(e.peak_reserved_bytes as f64)
            ),
        );
    }
    line(&mut s, "CUDA context", gib(e.cuda_context_bytes as f64));
    if e.managed_bytes > 0 {
        line(
            &mut s,
            "managed (paged states)",
            gib(e.managed_bytes as f64),
        );
    }
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
                    "params": c.total + c.vision, "active_params": c.active, "layers": p.arch.layers,
                    "hidden": p.arch.hidden, "vocab": p.arch.vocab, "source": p.source,
                })
            })
            .collect();
        return serde_json::to_string_pretty(&v).expect("serialises");
    }
    // Columns as wide as their longest entry, two spaces apart.
    let nw = presets
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0)
        .max(4)
        + 2;
    let fw = presets
        .iter()
        .map(|p| p.arch.family.name().len())
        .max()
        .unwrap_or(0)
        .max(6)
        + 2;
    let mut s = format!(
        "{:<nw$}{:<fw$}{:>15}  {:>7}  {:>7}  source\n",
        "name", "family", "parameters", "layers", "hidden"
    );
    for p in presets {
        let n = p.arch.params();
        s.push_str(&format!(
            "{:<nw$}{:<fw$}{:>15}  {:>7}  {:>7}  {}\n",
            p.name,
            p.arch.family.name(),
            n.total + n.vision,
            p.arch.layers,
            p.arch.hidden,
            p.source
        ));
    }
    s.trim_end().to_string()
}
