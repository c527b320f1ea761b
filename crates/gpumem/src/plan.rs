//! The planner: every layout of a training run over a number of GPUs, which of them fit,
//! and which is likely fastest.
//!
//! A layout is `dp × tp × pp × cp × ep = N` with a ZeRO stage / FSDP strategy, a pipeline
//! schedule, a micro-batch size (the global batch fixes the micro-batches per step),
//! activation recomputation and offload. Each is checked by the same engine as `estimate`.
//!
//! The cost model is deliberately simple, and the same for every layout:
//! - compute: `6·N_active·T + 6·L·s·d_q·T` FLOPs per step (T tokens; the second term is
//!   causal attention) at half the GPU's dense 16-bit peak, one third more under full
//!   recomputation, times `1 + (p − 1)/(v·m)` for the pipeline bubble;
//! - communication: the bytes each GPU sends per step for every dimension (ring
//!   collectives), over NVLink when the group fits in a node (mesh order tp, cp, ep, dp, pp,
//!   innermost first) and over the network otherwise. Tensor, context, expert and pipeline
//!   traffic is on the critical path; data-parallel traffic hides behind the backward (two
//!   thirds of compute) and only what exceeds it counts; offload moves states over PCIe
//!   (25 GB/s) and runs Adam on the CPU (2·10⁹ parameters/s);
//! - rank: the estimated step time, then the larger memory headroom.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::arch::Architecture;
use crate::error::{Error, Result};
use crate::estimate::estimate;
use crate::gpu::{self, CUDA_CONTEXT_BYTES};
use crate::hf::Obj;
use crate::scenario::{Attention, Framework, Model, Parallel, Recompute, Scenario, Schedule};

/// What to plan.
#[derive(Clone, Debug)]
pub struct Request {
    /// Model, sequence length, precision, optimizer, GPU, framework (its layout is ignored).
    pub scenario: Scenario,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    /// GPU counts to try.
    pub gpus: Vec<u64>,
    pub gpus_per_node: u64,
    /// Layouts to list (best first).
    pub top: usize,
    /// Whether layouts may offload states to CPU memory.
    pub offload: bool,
    /// CPU memory of one node: what the node's GPUs offload must fit in it.
    pub host_bytes_per_node: u64,
    /// The scenario as given, without its layout: each candidate adds its own.
    pub source: Value,
    /// What the request fixes (the estimate flags given to `plan`): every layout tried
    /// honours each of these.
    pub fixed: Fixed,
    /// Evaluate every layout, without skipping those a more frugal one rules out (tests).
    pub exhaustive: bool,
}

/// The keys of a scenario's `parallel` object that make up its layout, which the planner
/// varies unless a request fixes them.
pub const LAYOUT_KEYS: [&str; 12] = [
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero",
    "fsdp",
    "grad_accum",
    "schedule",
    "virtual_stages",
    "offload",
    "shard_group",
];

/// A scenario (JSON) with its layout taken out (the micro-batch, recomputation and
/// [`LAYOUT_KEYS`]): given to [`Request::from_value`], it fixes only what the layout does not
/// decide, and the sweep chooses the rest.
pub fn unfix(scenario: &mut Value) {
    if let Some(o) = scenario.as_object_mut() {
        o.remove("batch");
        o.remove("recompute");
        if let Some(Value::Object(p)) = o.get("parallel") {
            let mut keep = serde_json::Map::new();
            for (k, x) in p {
                if !LAYOUT_KEYS.contains(&k.as_str()) {
                    keep.insert(k.clone(), x.clone());
                }
            }
            o.insert("parallel".into(), Value::Object(keep));
        }
    }
}

/// Layout choices a request fixes instead of leaving them to the sweep.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fixed {
    pub dp: Option<u64>,
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub cp: Option<u64>,
    pub ep: Option<u64>,
    pub zero: Option<u8>,
    /// Sequences per micro-batch (`batch`).
    pub micro_batch: Option<u64>,
    pub grad_accum: Option<u64>,
    pub recompute: Option<Recompute>,
    pub schedule: Option<Schedule>,
    /// (optimizer, parameters) offloaded.
    pub offload: Option<(bool, bool)>,
    pub shard_group: Option<u64>,
}

impl Fixed {
    fn allows(v: Option<u64>, x: u64) -> bool {
        v.is_none_or(|v| v == x)
    }
}

/// The largest micro-batch the planner tries (unless the request fixes a larger one).
pub const MAX_MICRO_BATCH: u64 = 16;
/// The most micro-batches per step a scenario takes (`parallel.grad_accum`).
pub const MAX_GRAD_ACCUM: u64 = crate::scenario::MAX_GPUS;
/// The most tokens per step a request takes (the scenario's own bound).
const MAX_TOKENS: u64 = crate::scenario::MAX_TOKENS;
/// Context parallelism keeps at least this many tokens on each GPU.
pub const MIN_CP_TOKENS: u64 = 1024;
/// A DGX H100 node's 2 TB of system memory.
pub const DEFAULT_HOST_GB: u64 = 2000;
const MFU: f64 = 0.5;
const PCIE_GBPS: f64 = 25.0;
const CPU_ADAM_PARAMS_PER_S: f64 = 2e9;

/// One layout, as `gpumem estimate` takes it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Layout {
    pub gpus: u64,
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub zero: u8,
    pub virtual_stages: u64,
    pub micro_batch: u64,
    pub grad_accum: u64,
    pub recompute: String,
    pub offload: String,
}

/// Bytes one GPU sends per step, by dimension.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Traffic {
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub pp: f64,
    pub dp: f64,
    pub offload: f64,
}

impl Traffic {
    pub fn total(&self) -> f64 {
        self.tp + self.cp + self.ep + self.pp + self.dp + self.offload
    }
}

/// A layout that fits, with its memory and its cost.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Candidate {
    pub layout: Layout,
    /// Predicted allocator peak, and the nvidia-smi total (reserve and context included).
    pub peak_bytes: u64,
    pub device_bytes: u64,
    pub headroom_bytes: i64,
    /// Idle fraction of the pipeline: (p − 1)/(v·m).
    pub bubble: f64,
    pub traffic_bytes: Traffic,
    pub compute_seconds: f64,
    pub exposed_comm_seconds: f64,
    pub step_seconds: f64,
    /// The scenario to pass to `gpumem estimate` for the full breakdown.
    pub scenario: Value,
}

/// The best layouts for one GPU count.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Count {
    pub gpus: u64,
    pub considered: u64,
    pub fitting: u64,
    pub best: Option<Candidate>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Plan {
    pub model: String,
    pub gpu: String,
    pub seq: u64,
    pub global_batch: u64,
    pub considered: u64,
    pub fitting: u64,
    /// The smallest GPU count tried that has a layout that fits.
    pub fewest_gpus: Option<u64>,
    pub counts: Vec<Count>,
    /// The best layouts over all counts tried, fastest first.
    pub best: Vec<Candidate>,
    /// Why the engine refused a layout considered, when it did (the first such reason, as
    /// `field: message`): the layouts it refuses are not counted as fitting. (Not in the
    /// wasm: the widgets do not show it.)
    #[cfg(not(target_arch = "wasm32"))]
    pub refused: Option<String>,
    pub cost_model: String,
}

const COST_MODEL: &str = "step time = compute at 50% of the GPU's dense 16-bit peak (×4/3 under full recomputation) × (1 + pipeline bubble) + tensor/context/expert/pipeline traffic + data-parallel traffic beyond what the backward hides + offload over PCIe; ties go to the larger headroom";

impl Request {
    /// A JSON request: a scenario plus `global_batch`, `gpus` (a count, a list, or
    /// `{"min", "max"}` for the powers of two between, with an optional `"step"`),
    /// `gpus_per_node` and `top`.
    ///
    /// The layout fields of the scenario (`batch`, `recompute`, and `parallel`'s dp, tp, pp,
    /// cp, ep, zero/fsdp, grad_accum, schedule, virtual_stages, offload, shard_group) are
    /// constraints: every layout the planner tries keeps each one given. `offload: false`
    /// (the CLI's `--no-offload`) is the same as `parallel.offload: "none"`.
    pub fn from_value(v: &Value) -> Result<Request> {
        let o = Obj::new(v, "").map_err(|_| Error::new("plan", "must be a JSON object"))?;
        let mut scenario = v.as_object().cloned().unwrap_or_default();
        for k in [
            "global_batch",
            "gpus",
            "gpus_per_node",
            "top",
            "offload",
            "host_memory_gb",
        ] {
            scenario.remove(k);
        }
        // Before the scenario's own checks, which would judge it as inference.
        if scenario.get("mode").and_then(Value::as_str) == Some("inference") {
            return Err(Error::new("mode", "the planner plans training runs"));
        }
        if scenario.contains_key("new_tokens") {
            return Err(Error::new(
                "new_tokens",
                "the planner plans training runs, which generate no tokens",
            ));
        }
        // The whole scenario as given, checked by the engine (so a constraint no layout could
        // meet, such as tp 3 for 32 heads, is named here).
        let given = Scenario::from_value(&Value::Object(scenario.clone()))?;
        let mut fixed = Fixed {
            micro_batch: o.get("batch").map(|_| given.batch),
            recompute: o.get("recompute").map(|_| given.recompute),
            ..Fixed::default()
        };
        if let Some(p) = o.get("parallel") {
            let po = Obj::new(p, "parallel")?;
            let gp = &given.parallel;
            let has = |k: &str| po.get(k).is_some();
            // (In the browser the scenario's parser has refused it already.)
            #[cfg(not(target_arch = "wasm32"))]
            if has("gpus") {
                return Err(Error::new(
                    "parallel.gpus",
                    "give the GPU counts to plan for as `gpus` (--gpus), not inside parallel",
                ));
            }
            fixed.dp = has("dp").then_some(gp.dp);
            fixed.tp = has("tp").then_some(gp.tp);
            fixed.pp = has("pp").then_some(gp.pp);
            fixed.cp = has("cp").then_some(gp.cp);
            fixed.ep = has("ep").then_some(gp.ep);
            fixed.zero = (has("zero") || has("fsdp")).then_some(gp.zero);
            fixed.grad_accum = has("grad_accum").then_some(gp.grad_accum);
            fixed.schedule = (has("schedule") || has("virtual_stages")).then_some(gp.schedule);
            fixed.offload = has("offload").then_some((gp.offload_optimizer, gp.offload_params));
            // HYBRID_SHARD's group: as given, else (dp not given either) the engine's 8. (A
            // command line's request: the 5D panel's fixes no layout, `unfix`.)
            let hybrid = cfg!(not(target_arch = "wasm32"))
                && po
                    .str_opt("fsdp")?
                    .is_some_and(|f| f.eq_ignore_ascii_case("hybrid_shard"));
            fixed.shard_group = if has("shard_group") || (hybrid && has("dp")) {
                Some(gp.shard_group)
            } else {
                hybrid.then_some(8)
            };
        }
        let mut source = Value::Object(scenario);
        unfix(&mut source);
        let scenario = Scenario::from_value(&source)?;
        if !matches!(scenario.model, Model::Arch { .. }) {
            return Err(Error::new(
                "model",
                "the planner needs an architecture, not only a parameter count",
            ));
        }
        let global_batch = o.u64_opt("global_batch")?.unwrap_or(1);
        if global_batch == 0 || global_batch > 1 << 24 {
            return Err(Error::new(
                "global_batch",
                format!("must be between 1 and 2^24, got {global_batch}"),
            ));
        }
        if global_batch * scenario.seq > MAX_TOKENS {
            return Err(Error::new(
                "global_batch",
                format!(
                    "global_batch × seq = {} tokens per step is beyond the supported 2^40",
                    global_batch * scenario.seq
                ),
            ));
        }
        if let Some(b) = fixed.micro_batch {
            if !global_batch.is_multiple_of(b) {
                return Err(Error::new(
                    "batch",
                    format!("the micro-batch ({b}) must divide global_batch ({global_batch})"),
                ));
            }
        }
        // `offload`, `gpus_per_node` and `host_memory_gb` come from a command line or a
        // hand-written request: the browser's planner never sets them (its requests are the
        // page's knobs with `gpus`, `global_batch` and `top`), so they are read natively only.
        #[cfg(not(target_arch = "wasm32"))]
        if let Some(off) = o.get("offload") {
            match off {
                Value::Bool(true) => {}
                Value::Bool(false) => match fixed.offload {
                    Some((false, false)) | None => fixed.offload = Some((false, false)),
                    Some(_) => {
                        return Err(Error::new(
                            "offload",
                            "no offload (--no-offload) contradicts parallel.offload",
                        ))
                    }
                },
                _ => return Err(Error::new("offload", "must be true or false")),
            }
        }
        #[cfg(not(target_arch = "wasm32"))]
        let gpus_per_node = o.u64_opt("gpus_per_node")?.unwrap_or(8);
        #[cfg(target_arch = "wasm32")]
        let gpus_per_node = 8;
        if gpus_per_node == 0 || gpus_per_node > 1024 {
            return Err(Error::new(
                "gpus_per_node",
                format!("must be between 1 and 1024, got {gpus_per_node}"),
            ));
        }
        let gpus = parse_gpus(o.get("gpus"))?;
        let top = o.bounded_opt("top", 1, 1000)?.unwrap_or(10) as usize;
        let offload = fixed.offload != Some((false, false));
        #[cfg(not(target_arch = "wasm32"))]
        let host_gb = o.u64_opt("host_memory_gb")?.unwrap_or(DEFAULT_HOST_GB);
        #[cfg(target_arch = "wasm32")]
        let host_gb = DEFAULT_HOST_GB;
        #[cfg(not(target_arch = "wasm32"))]
        if host_gb > 1 << 30 {
            return Err(Error::new(
                "host_memory_gb",
                format!("{host_gb} GB is beyond the supported 2^30"),
            ));
        }
        Ok(Request {
            scenario,
            global_batch,
            gpus,
            gpus_per_node,
            top,
            offload,
            host_bytes_per_node: host_gb * 1_000_000_000,
            source,
            fixed,
            exhaustive: false,
        })
    }
}

const MAX_PLAN_GPUS: u64 = 1 << 20;

/// `"A..B"` (powers of two from A), `"A..B:S"` (steps of S), `"A,B,C"` or a number.
pub fn parse_gpu_counts(text: &str) -> std::result::Result<Vec<u64>, String> {
    let num = |s: &str| -> std::result::Result<u64, String> {
        match s.trim().parse::<u64>() {
            Ok(n) if (1..=MAX_PLAN_GPUS).contains(&n) => Ok(n),
            _ => Err(format!(
                "'{}' is not a GPU count between 1 and {MAX_PLAN_GPUS}",
                s.trim().chars().take(20).collect::<String>()
            )),
        }
    };
    if let Some((a, rest)) = text.split_once("..") {
        let (b, step) = match rest.split_once(':') {
            // The step is a count of GPUs too, named as the step (the browser's planner
            // writes no step).
            Some((b, s)) if cfg!(not(target_arch = "wasm32")) => (
                b,
                Some(num(s).map_err(|_| {
                    format!(
                        "the step '{}' is not a whole number between 1 and {MAX_PLAN_GPUS}",
                        s.trim().chars().take(20).collect::<String>()
                    )
                })?),
            ),
            Some((b, s)) => (b, Some(num(s)?)),
            None => (rest, None),
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("the range {a}..{b} is empty"));
        }
        let mut v = Vec::new();
        let mut n = a;
        while n <= b {
            v.push(n);
            n = match step {
                Some(s) => n + s,
                None => n * 2,
            };
        }
        if v.len() > 4096 {
            return Err(format!("{} GPU counts is more than 4,096", v.len()));
        }
        return Ok(v);
    }
    text.split(',').map(num).collect()
}

fn parse_gpus(v: Option<&Value>) -> Result<Vec<u64>> {
    let bad = |m: String| Error::new("gpus", m);
    let mut counts = match v {
        None => {
            return Err(bad(
                "is required: a count, a list, or {\"min\", \"max\"}".into()
            ))
        }
        Some(Value::String(s)) => parse_gpu_counts(s).map_err(bad)?,
        // The number's own Display (the same text): a `Value`'s would bring serde_json's writer.
        Some(Value::Number(n)) => parse_gpu_counts(&n.to_string()).map_err(bad)?,
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for (i, x) in a.iter().enumerate() {
                match x.as_u64() {
                    Some(n) if (1..=MAX_PLAN_GPUS).contains(&n) => out.push(n),
                    _ => {
                        return Err(Error::new(
                            format!("gpus[{i}]"),
                            format!("must be a GPU count between 1 and {MAX_PLAN_GPUS}"),
                        ))
                    }
                }
            }
            out
        }
        Some(r @ Value::Object(_)) => {
            let o = Obj::new(r, "gpus")?;
            let min = o.u64_opt("min")?.unwrap_or(1);
            let max = o.u64_req("max")?;
            let text = match o.u64_opt("step")? {
                Some(s) => format!("{min}..{max}:{s}"),
                None => format!("{min}..{max}"),
            };
            parse_gpu_counts(&text).map_err(bad)?
        }
        Some(_) => return Err(bad("must be a count, a list, or {\"min\", \"max\"}".into())),
    };
    if counts.is_empty() || counts.len() > 4096 {
        return Err(bad("must name between 1 and 4,096 GPU counts".into()));
    }
    crate::order::sort(&mut counts);
    counts.dedup();
    Ok(counts)
}

fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut i = 1;
    while i * i <= n {
        if n.is_multiple_of(i) {
            small.push(i);
            if i * i != n {
                large.push(n / i);
            }
        }
        i += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Plan: every layout for every count, ranked.
pub fn plan(req: &Request) -> Plan {
    let s = &req.scenario;
    let Model::Arch { name, arch: a } = &s.model else {
        // Checked by Request::from_value.
        unreachable!()
    };
    let spec = gpu::find(&s.gpu_name).unwrap_or_else(|| gpu::find("H100-80GB").expect("H100"));
    let base = unvaried(s);
    let prepared = match PREPARED.take() {
        Some((k, v)) if k == base => v,
        _ => Vec::new(),
    };
    let mut sweep = Sweep {
        s,
        a,
        req,
        spec,
        scratch: s.clone(),
        prepared,
        found: Vec::new(),
        pc: a.params(),
        #[cfg(not(target_arch = "wasm32"))]
        refused: None,
    };
    let mut counts = Vec::new();
    let (mut considered, mut fitting) = (0, 0);
    for &g in &req.gpus {
        let before = sweep.found.len();
        let c = sweep.count(g);
        // On one GPU the full estimate replays the caching allocator, which can run out of
        // memory (fragmentation) where the sweep's allocated peak fits: what it refuses is
        // not counted as fitting, so that the counts, the fewest GPUs and the list agree.
        // (The browser's estimate does not replay.)
        if g == 1 && cfg!(not(target_arch = "wasm32")) {
            let fit: Vec<bool> = sweep.found[before..]
                .iter()
                .map(|f| sweep.candidate(f).is_some())
                .collect();
            let mut i = 0;
            sweep.found.retain(|_| {
                i += 1;
                i <= before || fit[i - 1 - before]
            });
        }
        considered += c;
        let fit = (sweep.found.len() - before) as u64;
        fitting += fit;
        counts.push((g, c, fit, before));
    }
    // Rank everything; confirm the listed ones with the full estimate.
    let order = crate::order::sorted_indices(sweep.found.len(), &|i, j| {
        rank(&sweep.found[i], &sweep.found[j])
    });
    let best_of = |from: usize, to: usize| -> Option<usize> {
        (from..to).min_by(|&i, &j| rank(&sweep.found[i], &sweep.found[j]))
    };
    let confirm = |f: &Found| -> Option<Candidate> { sweep.candidate(f) };
    let mut best = Vec::new();
    for &i in &order {
        if best.len() >= req.top {
            break;
        }
        if let Some(c) = confirm(&sweep.found[i]) {
            best.push(c);
        }
    }
    let counts: Vec<Count> = counts
        .into_iter()
        .map(|(g, c, fit, before)| Count {
            gpus: g,
            considered: c,
            fitting: fit,
            best: best_of(before, before + fit as usize).and_then(|i| confirm(&sweep.found[i])),
        })
        .collect();
    let mut prepared = std::mem::take(&mut sweep.prepared);
    if prepared.len() > MAX_PREPARED {
        prepared.clear();
    }
    PREPARED.set(Some((base, prepared)));
    Plan {
        model: name.clone(),
        gpu: s.gpu_name.clone(),
        seq: s.seq,
        global_batch: req.global_batch,
        considered,
        fitting,
        fewest_gpus: counts.iter().find(|c| c.best.is_some()).map(|c| c.gpus),
        counts,
        best,
        #[cfg(not(target_arch = "wasm32"))]
        refused: sweep.refused.map(|e| format!("{}: {}", e.field, e.message)),
        cost_model: COST_MODEL.into(),
    }
}

fn rank(x: &Found, y: &Found) -> std::cmp::Ordering {
    x.step
        .total_cmp(&y.step)
        .then(y.headroom.cmp(&x.headroom))
        .then(x.par.gpus().cmp(&y.par.gpus()))
}

/// What [`Sweep::evaluate`] found of a layout: it fits (and is kept), it needs more than
/// the GPU's memory, or something else rules it out (the host's memory, a refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fit {
    Yes,
    Device,
    Other,
}

/// A fitting layout found by the sweep (small, no allocation).
#[derive(Clone, Copy, Debug)]
struct Found {
    par: Parallel,
    batch: u64,
    recompute: Recompute,
    headroom: i64,
    step: f64,
}

struct Sweep<'a> {
    s: &'a Scenario,
    a: &'a Architecture,
    req: &'a Request,
    spec: gpu::Gpu,
    scratch: Scenario,
    /// The one engine's replayed stretches, per (tp, cp, ep, micro-batch, recomputation,
    /// whether a tied embedding is held as two parameters, whether later micro-batches
    /// accumulate, whether Megatron's weight gradients are fused).
    prepared: Vec<(PrepKey, crate::estimate::Prepared)>,
    found: Vec<Found>,
    /// The model's parameter counts, for the cost model (counted once).
    pc: crate::arch::ParamCounts,
    /// The first reason the scenario check refused a layout for.
    #[cfg(not(target_arch = "wasm32"))]
    refused: Option<crate::error::Error>,
}

type PrepKey = (u64, u64, u64, u64, Recompute, bool, bool, bool);

/// The most stretches kept after a plan (beyond, none are).
const MAX_PREPARED: usize = 4096;

/// Stretches replayed by a plan, with the scenario they were replayed for.
type Kept = Option<(Scenario, Vec<(PrepKey, crate::estimate::Prepared)>)>;

thread_local! {
    /// The stretches the last plan replayed, with its scenario less what the planner varies
    /// ([`unvaried`]): a widget re-plans each time the reader moves a knob, and the plans of
    /// one model, sequence and precision replay the same stretches. Each is a pure function
    /// of that scenario and its key, so a kept one is what a new replay would give.
    static PREPARED: std::cell::Cell<Kept> = const { std::cell::Cell::new(None) };
}

/// Drop the stretches the last plan kept, so that the next plan replays every one (a
/// benchmark of a fresh plan).
pub fn forget() {
    PREPARED.set(None);
}

/// `s` with what the sweep sets on each layout (the mesh, the ZeRO stage, offload, the
/// micro-batch, its number, the schedule and recomputation) reset: the stretches of two
/// plans with the same such scenario are the same for the same key.
fn unvaried(s: &Scenario) -> Scenario {
    let d = Parallel::default();
    Scenario {
        batch: 1,
        recompute: Recompute::None,
        parallel: Parallel {
            dp: d.dp,
            tp: d.tp,
            pp: d.pp,
            cp: d.cp,
            ep: d.ep,
            zero: d.zero,
            shard_group: d.shard_group,
            offload_optimizer: d.offload_optimizer,
            offload_params: d.offload_params,
            grad_accum: d.grad_accum,
            schedule: d.schedule,
            ..s.parallel
        },
        ..s.clone()
    }
}

impl Sweep<'_> {
    /// Every layout on `g` GPUs; returns how many were considered.
    fn count(&mut self, g: u64) -> u64 {
        let (s, a, req) = (self.s, self.a, self.req);
        let base = s.parallel;
        let experts = a.moe.as_ref().map_or(1, |m| m.experts);
        let fx = req.fixed;
        // Selective recomputation saves nothing under SDPA's kernels (they keep no score
        // matrix), so it is tried only with eager attention, or when the request asks for it.
        let given;
        let recomputes: &[Recompute] = if let Some(r) = fx.recompute {
            given = [r];
            &given
        } else if s.attention == Attention::Eager {
            &[Recompute::None, Recompute::Selective, Recompute::Full]
        } else {
            &[Recompute::None, Recompute::Full]
        };
        let mut considered = 0;
        // DeepSpeed and LoRA fine-tuning are modelled for data parallelism only.
        let dp_only = base.framework == Framework::DeepSpeed
            || !matches!(s.finetune, crate::scenario::Finetune::Full);
        let one = |x: u64| !dp_only || x == 1;
        for tp in divisors(g) {
            if !one(tp)
                || !Fixed::allows(fx.tp, tp)
                // A tensor-parallel group stays inside a node: the GPUs of a node in use
                // are a whole number of groups.
                || !g.min(req.gpus_per_node).is_multiple_of(tp)
                || !a.heads.is_multiple_of(tp)
                || (a.mla.is_none() && !a.kv_heads.is_multiple_of(tp))
            {
                continue;
            }
            for cp in divisors(g / tp) {
                if !one(cp) || !Fixed::allows(fx.cp, cp) {
                    continue;
                }
                if cp > 1
                    && (s.attention == Attention::Eager
                        || !s.seq.is_multiple_of(2 * cp)
                        || s.seq / cp < MIN_CP_TOKENS)
                {
                    continue;
                }
                for ep in divisors(g / tp / cp) {
                    if !one(ep) || !Fixed::allows(fx.ep, ep) {
                        continue;
                    }
                    if ep > 1 && (a.moe.is_none() || !experts.is_multiple_of(ep)) {
                        continue;
                    }
                    for pp in divisors(g / tp / cp / ep) {
                        let dp = g / tp / cp / ep / pp;
                        if !one(pp)
                            || !Fixed::allows(fx.pp, pp)
                            || !Fixed::allows(fx.dp, dp)
                            || fx.shard_group.is_some_and(|k| !dp.is_multiple_of(k))
                            || pp > a.layers
                            || !req.global_batch.is_multiple_of(dp)
                        {
                            continue;
                        }
                        let per_replica = req.global_batch / dp;
                        // Without a pipeline a larger micro-batch needs more memory: once none
                        // fits, the larger ones are counted only.
                        let mut b_fits = [true; 3];
                        let mut b = 1;
                        while b <= MAX_MICRO_BATCH.max(fx.micro_batch.unwrap_or(0))
                            && b <= per_replica
                        {
                            let m = per_replica / b;
                            if per_replica.is_multiple_of(b)
                                && Fixed::allows(fx.micro_batch, b)
                                && Fixed::allows(fx.grad_accum, m)
                                && m <= MAX_GRAD_ACCUM
                            {
                                for (vi, v) in [1, 2, 4].into_iter().enumerate() {
                                    // A schedule given is the one tried (GPipe, any chunks).
                                    // (A schedule is a pipeline's: none without one.)
                                    let sched = match fx.schedule {
                                        Some(_) if pp == 1 => continue,
                                        Some(f) if vi == 0 => f,
                                        Some(_) => continue,
                                        None if v > 1 => Schedule::Interleaved(v),
                                        None => Schedule::OneFOneB,
                                    };
                                    let v = match sched {
                                        Schedule::Interleaved(v) => v,
                                        _ => 1,
                                    };
                                    if v > 1
                                        && (pp == 1
                                            || !a.layers.is_multiple_of(pp * v)
                                            || !m.is_multiple_of(pp))
                                    {
                                        continue;
                                    }
                                    let par = Parallel {
                                        dp,
                                        tp,
                                        pp,
                                        cp,
                                        ep,
                                        shard_group: fx.shard_group.unwrap_or(dp),
                                        grad_accum: m,
                                        schedule: sched,
                                        ..base
                                    };
                                    let (n, fit) = self.options(par, b, recomputes, b_fits[vi]);
                                    considered += n;
                                    // Under a pipeline the micro-batches per step fall as
                                    // the micro-batch grows, which can lower the peak.
                                    if !fit && !self.req.exhaustive && pp == 1 {
                                        b_fits[vi] = false;
                                    }
                                }
                            }
                            // Powers of two, and the fixed micro-batch when it is not one.
                            b = match fx.micro_batch {
                                Some(f) if f > b && f < b * 2 => f,
                                _ => b * 2,
                            };
                        }
                    }
                }
            }
        }
        considered
    }

    /// ZeRO stages, recomputation and offload for one mesh and micro-batch.
    /// ZeRO stages, recomputation and offload for one mesh and micro-batch: how many layouts
    /// that is, and whether any fits. For each stage, memory only falls with more offload
    /// and full recomputation, so that one is tried first: when it does not fit, none of the
    /// stage's does (not so across stages: under a pipeline, FSDP keeps the unsharded
    /// gradients in fp32, which ZeRO-1 does not). `eval: false` counts only.
    /// `Request::exhaustive` evaluates all (the tests compare).
    fn options(
        &mut self,
        par: Parallel,
        b: u64,
        recomputes: &[Recompute],
        eval: bool,
    ) -> (u64, bool) {
        let mut list: Vec<(u8, u8, Recompute)> = Vec::new();
        let pipeline_limits = par.pp > 1 && par.framework != Framework::Fsdp;
        let fx = self.req.fixed;
        // ZeRO shards over dp × cp. With one rank there a stage that shards nothing repeats
        // another's layout, figures and all: FSDP's stages 1–3 are stage 0, Megatron's
        // distributed optimizer (1) is plain DDP (0) and its two Megatron-FSDP stages (2, 3)
        // are one (DeepSpeed's stages still differ: their flat buffers).
        let repeats = |zero: u8| {
            par.dp * par.cp == 1
                && fx.zero.is_none()
                && match par.framework {
                    Framework::Fsdp => zero > 0,
                    Framework::Megatron => zero == 1 || zero == 3,
                    Framework::DeepSpeed => false,
                }
        };
        for zero in 0..=3u8 {
            // DeepSpeed's and Megatron's pipelines take ZeRO-1 at most.
            if (pipeline_limits && zero > 1) || fx.zero.is_some_and(|z| z != zero) {
                continue;
            }
            for offload in 0..3 {
                if (offload == 0 && repeats(zero))
                    || (offload >= 1 && (zero == 0 || par.pp > 1 || !self.req.offload))
                    || (offload == 2 && zero < 3)
                    || fx
                        .offload
                        .is_some_and(|(o, p)| (o, p) != (offload >= 1, offload == 2))
                {
                    continue;
                }
                for &r in recomputes {
                    if fx.recompute.is_some_and(|f| f != r) {
                        continue;
                    }
                    list.push((zero, offload, r));
                }
            }
        }
        let n = list.len() as u64;
        if !eval || list.is_empty() {
            return (n, false);
        }
        let with = |&(zero, offload, _): &(u8, u8, Recompute)| Parallel {
            zero,
            offload_optimizer: offload >= 1,
            offload_params: offload == 2,
            ..par
        };
        let mut any = false;
        for zero in 0..=3u8 {
            let mut of: Vec<(u8, u8, Recompute)> =
                list.iter().copied().filter(|o| o.0 == zero).collect();
            if of.is_empty() {
                continue;
            }
            if !self.req.exhaustive {
                // For one stage, more offload and full recomputation need no more memory.
                let i = (0..of.len())
                    .max_by_key(|&i| (of[i].1, of[i].2 == Recompute::Full))
                    .expect("not empty");
                // (Not so for the host's memory, which offload fills, nor for a layout the
                // engine refuses: only a frugal one out of the GPU's memory rules out the
                // stage.)
                let frugal = of.remove(i);
                match self.evaluate(with(&frugal), b, frugal.2) {
                    Fit::Yes => any = true,
                    Fit::Device => continue,
                    Fit::Other => {}
                }
            }
            for o in &of {
                any |= self.evaluate(with(o), b, o.2) == Fit::Yes;
            }
        }
        (n, any)
    }

    /// Whether the layout fits; those that do are kept.
    fn evaluate(&mut self, par: Parallel, b: u64, r: Recompute) -> Fit {
        let native = matches!(par.framework, Framework::Fsdp | Framework::Megatron)
            && matches!(self.s.finetune, crate::scenario::Finetune::Full);
        self.scratch.parallel = par;
        self.scratch.batch = b;
        self.scratch.recompute = r;
        // What a scenario of this layout would be refused for (an optimizer the layout
        // cannot hold, …) rules it out, as it does its listing.
        if let Err(_e) = self.scratch.check() {
            #[cfg(not(target_arch = "wasm32"))]
            self.refused.get_or_insert(_e);
            return Fit::Other;
        }
        let (peak, host) = if native {
            // The one engine: stretches replayed once per key, composed per layout.
            let untie = crate::estimate::unties(&self.scratch, self.a);
            let key = (
                par.tp,
                par.cp,
                par.ep,
                b,
                r,
                untie,
                par.grad_accum > 1 || par.pp > 1,
                // Megatron replays its layers with fused weight gradients unless sharded
                // by Megatron-FSDP.
                par.framework == Framework::Megatron && par.zero >= 2,
            );
            let i = match self.prepared.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let pr = crate::estimate::prepare(&self.scratch, self.a);
                    self.prepared.push((key, pr));
                    self.prepared.len() - 1
                }
            };
            let (total, host) = crate::estimate::worst_stage(&self.scratch, &self.prepared[i].1);
            if total.is_nan() {
                return Fit::Other;
            }
            if total > self.s.capacity_bytes as f64 {
                return Fit::Device;
            }
            (total.round() as u64, host)
        } else {
            match estimate(&self.scratch) {
                Ok(e) => (e.peak_bytes, e.host_bytes as f64),
                Err(_) => return Fit::Other,
            }
        };
        let per_node = par.gpus().min(self.req.gpus_per_node) as f64;
        if host * per_node > self.req.host_bytes_per_node as f64 {
            return Fit::Other;
        }
        // Screening: the allocated peak and the CUDA context (the caching allocator is
        // replayed by the full estimate of each layout listed, `candidate`).
        let device = peak + CUDA_CONTEXT_BYTES;
        let headroom = self.s.capacity_bytes as i64 - device as i64;
        if headroom < 0 {
            return Fit::Device;
        }
        let (_, _, step, _) = cost(self.s, self.a, &self.pc, &self.spec, self.req, &par, b, r);
        self.found.push(Found {
            par,
            batch: b,
            recompute: r,
            headroom,
            step,
        });
        Fit::Yes
    }

    /// The full estimate of a found layout, through the scenario parser (so every
    /// constraint is checked again) — or nothing if it no longer fits.
    fn candidate(&self, f: &Found) -> Option<Candidate> {
        let par = &f.par;
        let mut v = self.req.source.clone();
        let offload = match (par.offload_optimizer, par.offload_params) {
            (_, true) => "optimizer+params",
            (true, false) => "optimizer",
            _ => "none",
        };
        let recompute = match f.recompute {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        };
        // Built by hand rather than with `json!` and `value["key"] = …`: their hidden
        // `unwrap`s and panics would carry serde_json's error texts and std's string
        // escaping into the widgets' wasm.
        let mut p = Map::new();
        let mut put = |k: &str, x: Value| {
            p.insert(k.into(), x);
        };
        for (k, x) in [
            ("dp", par.dp),
            ("tp", par.tp),
            ("pp", par.pp),
            ("cp", par.cp),
            ("ep", par.ep),
            ("zero", u64::from(par.zero)),
            ("grad_accum", par.grad_accum),
        ] {
            put(k, x.into());
        }
        put("offload", offload.into());
        put(
            "framework",
            match par.framework {
                Framework::Fsdp => "fsdp",
                Framework::DeepSpeed => "deepspeed",
                Framework::Megatron => "megatron",
            }
            .into(),
        );
        put("sp", par.sp.into());
        put("capacity_factor", par.capacity_factor.into());
        let v_stages = match par.schedule {
            Schedule::Interleaved(v) => v,
            Schedule::OneFOneB | Schedule::GPipe => 1,
        };
        match par.schedule {
            Schedule::Interleaved(v) => {
                put("schedule", "interleaved".into());
                put("virtual_stages", v.into());
            }
            Schedule::GPipe => put("schedule", "gpipe".into()),
            Schedule::OneFOneB => {}
        }
        if par.shard_group != par.dp {
            put("shard_group", par.shard_group.into());
        }
        // The request's other parallel settings (wrap, loss_parallel, cp_load_balance, …):
        // without them the scenario would not give these figures.
        if let Some(Value::Object(given)) = v.get("parallel") {
            for (k, x) in given {
                if !p.contains_key(k) {
                    p.insert(k.clone(), x.clone());
                }
            }
        }
        if let Value::Object(m) = &mut v {
            m.insert("parallel".into(), Value::Object(p));
            m.insert("batch".into(), f.batch.into());
            m.insert("recompute".into(), recompute.into());
        }
        let mut sc = self.s.clone();
        sc.parallel = *par;
        sc.batch = f.batch;
        sc.recompute = f.recompute;
        sc.check().ok()?;
        let e = estimate(&sc).ok()?;
        if !e.fits {
            return None;
        }
        let (bubble, traffic, step, exposed) = cost(
            self.s,
            self.a,
            &self.pc,
            &self.spec,
            self.req,
            par,
            f.batch,
            f.recompute,
        );
        Some(Candidate {
            layout: Layout {
                gpus: par.gpus(),
                dp: par.dp,
                tp: par.tp,
                pp: par.pp,
                cp: par.cp,
                ep: par.ep,
                zero: par.zero,
                virtual_stages: v_stages,
                micro_batch: f.batch,
                grad_accum: par.grad_accum,
                recompute: recompute.into(),
                offload: offload.into(),
            },
            peak_bytes: e.peak_bytes,
            device_bytes: e.device_bytes,
            headroom_bytes: e.headroom_bytes,
            bubble,
            traffic_bytes: traffic,
            compute_seconds: step - exposed,
            exposed_comm_seconds: exposed,
            step_seconds: step,
            scenario: v,
        })
    }
}

/// (bubble, traffic, step seconds, exposed communication seconds) of a layout.
#[allow(clippy::too_many_arguments)]
fn cost(
    s: &Scenario,
    a: &Architecture,
    pc: &crate::arch::ParamCounts,
    spec: &gpu::Gpu,
    req: &Request,
    par: &Parallel,
    b: u64,
    r: Recompute,
) -> (f64, Traffic, f64, f64) {
    let g = par.gpus() as f64;
    let tokens = (req.global_batch * s.seq) as f64;
    let l = a.layers as f64;
    let flops =
        6.0 * pc.active as f64 * tokens + 6.0 * l * s.seq as f64 * a.q_dim() as f64 * tokens;
    let recompute = if r == Recompute::Full { 4.0 / 3.0 } else { 1.0 };
    let compute = flops / g / (spec.tflops * 1e12 * MFU) * recompute;
    let v = match par.schedule {
        Schedule::Interleaved(v) => v as f64,
        Schedule::OneFOneB | Schedule::GPipe => 1.0,
    };
    let m = par.grad_accum as f64;
    let (t, p, c, ep, dp) = (
        par.tp as f64,
        par.pp as f64,
        par.cp as f64,
        par.ep as f64,
        par.dp as f64,
    );
    let bubble = (p - 1.0) / (v * m);
    let act = s.precision.compute().bytes();
    let h = a.hidden as f64;
    let sb = s.seq as f64 / c * b as f64;
    let ls = l / p;
    let ring = |n: f64| if n > 1.0 { (n - 1.0) / n } else { 0.0 };
    let mut tr = Traffic::default();
    let passes = if r == Recompute::Full { 6.0 } else { 4.0 };
    tr.tp = ls * m * passes * 2.0 * ring(t) * sb * h * act;
    let kv = sb * (a.kv_elems_per_token_layer() as f64) / t * act;
    tr.cp = ls * m * 3.0 * (c - 1.0) * kv;
    if let Some(moe) = &a.moe {
        let moe_layers = (a.layers - moe.first_dense_layers) as f64 / p;
        tr.ep = moe_layers
            * m
            * 4.0
            * (sb * moe.top_k as f64 * par.capacity_factor * h * act / t)
            * ring(ep);
    }
    if par.pp > 1 {
        let sp = if par.sp && par.tp > 1 { t } else { 1.0 };
        tr.pp = m * v * 2.0 * sb * h * act / sp;
    }
    // Data parallel: dense states over dp·cp·ep replicas, experts over dp·cp.
    let routed = pc.routed_experts as f64;
    let dense_gpu = (pc.total as f64 - routed) / (t * p);
    let expert_gpu = routed / (ep * t * p);
    let (wb, gb) = (s.precision.weights.bytes(), s.precision.reduce.bytes());
    let dp_bytes = |psi: f64, n: f64| -> f64 {
        let k = ring(n);
        match par.zero {
            0 => 2.0 * k * psi * gb,
            1 | 2 => k * psi * (gb + wb),
            _ => k * psi * (gb + 2.0 * wb) * m,
        }
    };
    tr.dp = dp_bytes(dense_gpu, dp * c * ep) + dp_bytes(expert_gpu, dp * c);
    let mut offload_s = 0.0;
    if par.offload_optimizer {
        let shard = (dense_gpu + expert_gpu) / (dp * c).max(1.0);
        tr.offload = shard * (gb + wb);
        if par.offload_params {
            tr.offload += shard * wb * 2.0 * m;
        }
        offload_s = tr.offload / (PCIE_GBPS * 1e9) + shard / CPU_ADAM_PARAMS_PER_S;
    }
    // Which link each group uses (mesh order tp, cp, ep, dp, pp, innermost first).
    let node = req.gpus_per_node as f64;
    let bw = |span: f64| {
        1e9 * if span <= node {
            spec.intra_gbps
        } else {
            spec.inter_gbps
        }
    };
    let exposed = tr.tp / bw(t)
        + tr.cp / bw(t * c)
        + tr.ep / bw(t * c * ep)
        + tr.pp / bw(t * c * ep * dp * p)
        + (tr.dp / bw(t * c * ep * dp) - compute * 2.0 / 3.0).max(0.0)
        + offload_s;
    let step = compute * (1.0 + bubble) + exposed;
    (bubble, tr, step, exposed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout the sweep keeps was screened with the stretches of its own mesh: the
    /// headroom it was kept with is the one a fresh replay for that layout alone gives. The
    /// stretches are shared across layouts by key, so the key must hold everything of a
    /// layout they depend on (the expert-parallel degree among them: it sets how many
    /// tokens each rank's experts see).
    #[test]
    fn layouts_are_screened_with_their_own_stretches() {
        let mut req = Request::from_value(&serde_json::json!({
            "model": "qwen1.5-moe-a2.7b", "seq": 2048, "global_batch": 32, "gpus": 8,
            "parallel": {"framework": "fsdp"},
        }))
        .unwrap();
        req.exhaustive = true;
        let s = &req.scenario;
        let Model::Arch { arch: a, .. } = &s.model else {
            unreachable!()
        };
        let mut sweep = Sweep {
            s,
            a,
            req: &req,
            spec: gpu::find(&s.gpu_name).unwrap(),
            scratch: s.clone(),
            prepared: Vec::new(),
            found: Vec::new(),
            pc: a.params(),
            #[cfg(not(target_arch = "wasm32"))]
            refused: None,
        };
        sweep.count(8);
        let eps: Vec<u64> = sweep.found.iter().map(|f| f.par.ep).collect();
        assert!(eps.contains(&1) && eps.iter().any(|&e| e > 1), "{eps:?}");
        for f in &sweep.found {
            let mut one = s.clone();
            one.parallel = f.par;
            one.batch = f.batch;
            one.recompute = f.recompute;
            let (peak, _) = crate::estimate::worst_stage(&one, &crate::estimate::prepare(&one, a));
            let fresh = s.capacity_bytes as i64 - (peak.round() as u64 + CUDA_CONTEXT_BYTES) as i64;
            assert_eq!(
                f.headroom, fresh,
                "{:?} b={} {:?}",
                f.par, f.batch, f.recompute
            );
        }
    }

    /// The counts, the fewest GPUs and the list agree where the full estimate (which on one
    /// GPU replays the caching allocator) refuses what the sweep's allocated peak fits: Qwen3
    /// 0.6B at 32K tokens fits on one H100 by its allocated peak, but runs out of memory by
    /// fragmentation without offload (a fuzzing run: "4 fit", then "no GPU count fits").
    #[test]
    fn what_the_full_estimate_refuses_is_not_counted_as_fitting() {
        for (offload, fit) in [(false, false), (true, true)] {
            let mut v = serde_json::json!({"model": "qwen3-0.6b", "seq": 32768, "gpus": 1});
            if !offload {
                v["parallel"] = serde_json::json!({"offload": "none"});
            }
            let p = plan(&Request::from_value(&v).unwrap());
            let listed = p.best.len() as u64;
            assert_eq!(p.fitting > 0, fit, "offload {offload}");
            assert_eq!(p.fewest_gpus.is_some(), fit, "offload {offload}");
            assert_eq!(p.counts[0].fitting, p.fitting);
            assert_eq!(listed, p.fitting.min(10), "offload {offload}");
        }
    }
}
