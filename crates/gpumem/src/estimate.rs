//! Scenario → per-GPU peak: model states, then the step replayed stretch by stretch.

use serde::Serialize;

use crate::arch::{Architecture, AttnType};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gpu::CUDA_CONTEXT_BYTES;
use crate::graph::Ctx;
use crate::mem::{Phase, Seg};
use crate::precision::Optimizer;
use crate::scenario::{Finetune, Framework, Mode, Model, Parallel, Recompute, Scenario};
use crate::step::{self, Stretches};
use crate::tape::{self, Bytes, Cat};

/// A point of the step's memory timeline.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Point {
    pub phase: String,
    pub bytes: u64,
}

/// What the engine predicts for one GPU.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Estimate {
    pub model: String,
    /// The model's parameters, as transformers counts them (a Gemma 3 wrapper's vision tower
    /// included; a LoRA run's adapters not).
    pub params: u64,
    /// What the optimizer updates: every parameter of the decoder, or a LoRA run's adapters
    /// (then in addition to `params`, and not always fewer).
    pub trainable_params: u64,
    /// Parameters used per token (MoE: routed experts count top-k of all).
    pub active_params: u64,
    /// Predicted `torch.cuda.max_memory_allocated()` for one step.
    pub peak_bytes: u64,
    pub peak_phase: String,
    /// Bytes by component at the peak (they add up to `peak_bytes`).
    pub components: crate::map::Components,
    /// Weights + master weights + gradients + optimizer states on this GPU, and under
    /// DeepSpeed ZeRO-3 its persistent buffers for gathered parameters (in no other figure).
    pub model_states_bytes: u64,
    pub weights_bytes: u64,
    pub master_weights_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_states_bytes: u64,
    /// Inference: the KV cache at the end of generation.
    pub kv_cache_bytes: u64,
    /// CPU memory this GPU's process needs for what is offloaded to it.
    pub host_bytes: u64,
    /// What PyTorch's caching allocator holds beyond the allocated peak at its reserved high:
    /// `peak_reserved_bytes − peak_bytes`.
    pub allocator_reserve_bytes: u64,
    /// The caching allocator's settings the reserved figures are for: "default" or
    /// "expandable" (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`).
    pub allocator: String,
    /// Predicted `torch.cuda.max_memory_reserved()`: the run replayed through the caching
    /// allocator's rules ([`crate::alloc`]). Where the replay does not cover the layout
    /// (`reserved_replayed` false), the allocated peak.
    pub peak_reserved_bytes: u64,
    pub reserved_replayed: bool,
    /// At the allocated peak of the measured step: reserved but not allocated (the cache's
    /// fragmentation), the largest cached free block (a larger request then needs a new
    /// segment from CUDA however much is cached), and the segments held.
    pub reserved_unallocated_bytes: u64,
    pub largest_free_block_bytes: u64,
    pub segments: u64,
    /// The run fails with "CUDA out of memory … reserved but unallocated": the replayed
    /// allocator runs out of device although the allocated peak and the CUDA context fit.
    pub fragmentation_oom: bool,
    /// cuBLAS's workspaces, which PyTorch allocates through its caching allocator inside the
    /// first matmul of each thread that runs one (the forward's and, training, autograd's)
    /// and keeps: a component of the peak (`cublas_workspaces`) and of every timeline point.
    pub cublas_workspace_bytes: u64,
    /// The CUDA context (outside PyTorch's allocator; nvidia-smi counts it).
    pub cuda_context_bytes: u64,
    /// Device memory outside PyTorch's allocator besides the context: bitsandbytes' paged
    /// optimizer states (CUDA managed memory), while they are resident.
    pub managed_bytes: u64,
    /// Expected nvidia-smi reading: reserved + CUDA context + managed memory.
    pub device_bytes: u64,
    pub gpu: String,
    pub capacity_bytes: u64,
    /// Whether the device can give what the step needs (context and reserve included).
    pub fits: bool,
    /// capacity − device_bytes (negative: over by that much).
    pub headroom_bytes: i64,
    pub timeline: Vec<Point>,
    /// Model-parallel layouts: every pipeline stage (the figures above are the worst one's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageEstimate>,
    /// What is approximated or not modelled for this scenario.
    pub notes: Vec<String>,
}

/// The largest byte figure the engine reports: 2^60 bytes (1 EiB), about fourteen million
/// H100s. Figures are computed in `f64` (which cannot wrap) and checked against this bound
/// before they become integers, so sums of components cannot overflow a `u64` and the
/// headroom always fits an `i64`. A step beyond it is refused with its size in words.
pub const MAX_BYTES: f64 = 1_152_921_504_606_846_976.0;

/// Components at the peak as integers, or an error that says how large the step is when it
/// is beyond [`MAX_BYTES`] (or a figure is not a number: an internal fault, reported).
pub(crate) fn bounded_components(
    s: &Scenario,
    parts: &[(&str, f64)],
) -> Result<crate::map::Components> {
    let total: f64 = parts.iter().map(|p| p.1).sum();
    if let Some((n, _)) = parts.iter().find(|p| !p.1.is_finite() || p.1 < 0.0) {
        return Err(Error::new(
            "",
            format!(
                "internal error: the {n} figure is not a finite size; please report this scenario"
            ),
        ));
    }
    if total > MAX_BYTES {
        let (big, b) = parts
            .iter()
            .fold(("", 0.0), |m, p| if p.1 > m.1 { (p.0, p.1) } else { m });
        // The field to lower: the tokens' (models stop at 10^14 parameters, whose states
        // stay far below the bound), the batch unless it is already one sequence. (The
        // widgets show the message, which names both: left out of the wasm.)
        let field = if cfg!(target_arch = "wasm32") {
            ""
        } else if s.batch > 1 {
            "batch"
        } else {
            "seq"
        };
        return Err(Error::new(
            field,
            format!(
                "this step needs about {} on each GPU ({} of it {}), far beyond any GPU; gpumem computes figures up to {} (2^60 bytes): lower batch, seq or the model's size",
                crate::num::bytes_words(total),
                crate::num::bytes_words(b),
                big.replace('_', " "),
                crate::num::bytes_words(MAX_BYTES)
            ),
        ));
    }
    let mut c = crate::map::Components::new();
    for (n, v) in parts {
        c.insert(n.to_string(), v.round() as u64);
    }
    Ok(c)
}

/// Timeline points come from the same `f64` figures as the peak; rounded one by one they can
/// pass the integer peak by a few bytes (and above 2^53 by the spacing of doubles): cap them
/// at it. Debug builds check that rounding is all it is.
fn cap_timeline(tl: &mut [Point], peak: u64) {
    for p in tl {
        debug_assert!(
            p.bytes as f64 <= peak as f64 * (1.0 + 1e-12) + 64.0,
            "timeline point {} ({}) above the peak {peak}",
            p.phase,
            p.bytes
        );
        p.bytes = p.bytes.min(peak);
    }
}

/// capacity − device, both bounded well inside `i64`.
fn headroom(capacity: u64, device: u64) -> i64 {
    (capacity as i128 - device as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Estimate a scenario.
pub fn estimate(s: &Scenario) -> Result<Estimate> {
    let mut notes = Vec::new();
    let (name, arch) = match &s.model {
        Model::Arch { name, arch } => (name.clone(), Some(arch)),
        Model::Params(n) => (format!("{n} parameters"), None),
    };
    if let Some(a) = arch {
        let par = &s.parallel;
        if let Some(e) = estimate_pytorch_dp(s, &name, a) {
            return e;
        }
        if s.mode == Mode::Train && (par.model_parallel() || par.framework == Framework::Megatron) {
            return Err(unsupported_layout(s));
        }
    }
    let states = ModelStates::new(s, arch);
    let train = s.mode == Mode::Train;
    let par = s.parallel;
    let dp = &DpStates::new(s, &s.parallel, &states, Geo::data_parallel(s, arch));
    let (weights, master, optim, grads, grads_full) =
        (dp.weights, dp.master, dp.optim, dp.grads, states.grads);
    let grad_acc = if train { dp.grad_acc } else { 0.0 };
    notes.extend(DpStates::describe(
        s,
        s.parallel.dp,
        s.parallel.shard_ranks(),
    ));
    let base = weights + master + optim + dp.fixed + grad_acc;

    let mut timeline = Vec::new();
    let mut kv_cache_bytes = 0u64;
    let mut replayed = None;
    let (peak, mut phase, at_peak) = match arch {
        None => {
            notes.push("only a parameter count was given: activations, logits and the KV cache are not modelled".into());
            let total = if train { base + grads } else { weights };
            timeline.push(Point {
                phase: "model states".into(),
                bytes: total as u64,
            });
            (
                total,
                "model states".to_string(),
                Bytes::of(Cat::Gradients, if train { grads } else { 0.0 }),
            )
        }
        Some(a) => {
            if a.mla.is_some() && !train {
                notes.push("MLA: the KV cache holds the compressed latent and the RoPE key per token and layer, as transformers 5 caches it".into());
            }
            if checkpoint_format(s, a) {
                notes.push(match a.quant {
                    Some(crate::arch::Quant::Mxfp4) => "weights as the checkpoint stores them: MXFP4 experts (4.25 bits per weight; transformers needs the `kernels` package and compute capability ≥ 7.5, else it dequantizes to bf16)".into(),
                    _ => "weights as the checkpoint stores them: fp8 linears with fp32 block scales (compute capability ≥ 8.9)".into(),
                });
            }
            if a.moe.is_some() {
                notes.push("MoE: tokens are assumed evenly routed; experts run as transformers 5's grouped_mm (all routed rows gathered at once)".into());
            }
            vision_note(s, a, &mut notes);
            if train {
                let r = train_step(s, a, base, grads, grads_full, &mut timeline);
                replayed = r.3;
                (r.0, r.1, r.2)
            } else {
                let (p, ph, kv, at) = inference(s, a, weights, &mut timeline);
                kv_cache_bytes = kv as u64;
                (p, ph, at)
            }
        }
    };

    // Data-parallel buffers live through the step's busiest moment.
    let mut at_peak = at_peak;
    at_peak.add(Cat::Gradients, grad_acc);
    let mut peak = peak;
    if train {
        at_peak.add(Cat::WeightCopies, dp.gathered);
        at_peak.add(Cat::Temporaries, dp.buckets);
        peak += dp.gathered + dp.buckets;
        // A bare parameter count has no step to replay: under gradient accumulation the
        // gradients are resident through the later micro-batches.
        if par.grad_accum > 1 && arch.is_none() {
            phase = format!("micro-batch 2 of {}, {phase}", par.grad_accum);
        }
    }
    let mut parts: Vec<(&str, f64)> = vec![("weights", weights + dp.fixed)];
    if train {
        parts.push(("master_weights", master));
        parts.push(("optimizer_states", optim));
    }
    for c in [
        Cat::Activations,
        Cat::Logits,
        Cat::WeightCopies,
        Cat::Gradients,
        Cat::Temporaries,
    ] {
        let v = at_peak.get(c).max(0.0);
        if v > 0.0 || c == Cat::Activations {
            parts.push((c.key(), v));
        }
    }
    if !train {
        // The cache at the peak: what the layers so far keep (prefill), or all of it at a
        // decode step (the rest of the peak).
        let kv = at_peak.get(Cat::KvCache) + (peak - weights - at_peak.total()).max(0.0);
        parts.push(("kv_cache", kv));
    }
    let ws = crate::gpu::cublas_workspaces(s);
    parts.push((Cat::Workspaces.key(), ws as f64));
    let components = bounded_components(s, &parts)?;
    let peak_bytes: u64 = components.values().sum();
    timeline.iter_mut().for_each(|p| p.bytes += ws);
    // A paged optimizer's managed states, sharded as its other states are.
    let managed = if states.optimizer > 0.0 {
        states.managed * dp.optim / states.optimizer
    } else {
        states.managed
    };
    let r = Reserved::new(s, peak_bytes, replayed, managed, &mut notes);
    let headroom = headroom(s.capacity_bytes, r.device);
    cap_timeline(&mut timeline, peak_bytes);
    let p = &states.params;
    let params = match &s.model {
        Model::Params(n) => *n,
        _ => p.total + p.vision,
    };
    Ok(Estimate {
        model: name,
        params,
        trainable_params: states.trainable_params,
        active_params: if arch.is_some() { p.active } else { params },
        peak_bytes,
        peak_phase: phase,
        components,
        // The parts as rounded, and ZeRO-3's buffers: the figure is their sum to the byte.
        model_states_bytes: weights.round() as u64
            + master.round() as u64
            + optim.round() as u64
            + if train {
                (grads + grad_acc).round() as u64
            } else {
                0
            }
            + (dp.fixed + if train { 0.0 } else { grad_acc }).round() as u64,
        weights_bytes: weights.round() as u64,
        master_weights_bytes: master.round() as u64,
        gradients_bytes: if train {
            (grads + grad_acc).round() as u64
        } else {
            0
        },
        optimizer_states_bytes: optim.round() as u64,
        kv_cache_bytes,
        host_bytes: dp.host.round() as u64,
        allocator_reserve_bytes: r.peak.saturating_sub(peak_bytes),
        allocator: s.allocator.name(),
        peak_reserved_bytes: r.peak,
        reserved_replayed: r.replayed,
        reserved_unallocated_bytes: r.unallocated,
        largest_free_block_bytes: r.largest,
        segments: r.segments,
        fragmentation_oom: r.fragmentation_oom,
        cublas_workspace_bytes: ws,
        cuda_context_bytes: CUDA_CONTEXT_BYTES,
        managed_bytes: r.managed,
        device_bytes: r.device,
        gpu: s.gpu_name.clone(),
        capacity_bytes: s.capacity_bytes,
        fits: headroom >= 0 && !r.oom,
        headroom_bytes: headroom,
        timeline,
        stages: Vec::new(),
        notes,
    })
}

/// The reserved figures of an estimate: from the allocator replay where it covers the
/// scenario, else the allocated peak (with a note saying so).
struct Reserved {
    peak: u64,
    replayed: bool,
    unallocated: u64,
    largest: u64,
    segments: u64,
    oom: bool,
    fragmentation_oom: bool,
    managed: u64,
    device: u64,
}

impl Reserved {
    fn new(
        s: &Scenario,
        peak_bytes: u64,
        o: Option<crate::alloc::stream::Outcome>,
        managed: f64,
        notes: &mut Vec<String>,
    ) -> Reserved {
        let managed = managed.round() as u64;
        if managed > 0 {
            notes.push(format!(
                "paged 8-bit optimizer: {} of its states in CUDA managed memory, outside PyTorch's allocator (not in the peak or the reserved memory; nvidia-smi counts them while they are resident, and the driver pages them to the host when the device runs short)",
                crate::num::bytes_words(managed as f64)
            ));
        }
        match o {
            Some(o) if cfg!(not(target_arch = "wasm32")) => {
                // The replay's reserved high, never below what the tensors need; when the
                // device runs out, what it held and the segment it could not get.
                let held = match o.oom {
                    Some(e) => o.stats.reserved.saturating_add(e.alloc_size),
                    None => o.stats.peak_reserved,
                };
                let peak = held.max(peak_bytes);
                let oom = o.oom.is_some();
                let fragmentation_oom =
                    oom && peak_bytes.saturating_add(CUDA_CONTEXT_BYTES) <= s.capacity_bytes;
                if let Some(e) = o.oom {
                    notes.push(format!(
                        "the caching allocator runs out of device memory: a request of {} finds no cached block and CUDA cannot give {} more with {} reserved{}",
                        crate::num::bytes_words(e.size as f64),
                        crate::num::bytes_words(e.alloc_size as f64),
                        crate::num::bytes_words(e.reserved as f64),
                        if fragmentation_oom {
                            " (\"reserved but unallocated\": fragmentation, not the tensors, fills the device)"
                        } else {
                            ""
                        }
                    ));
                }
                if o.extrapolated > 0 {
                    notes.push(format!(
                        "reserved memory: the allocator was replayed over the first {} layers; the other {} are counted as the last ones reserved",
                        o.layers, o.extrapolated
                    ));
                }
                let (at_reserved, at_allocated, largest) = o.at_peak;
                Reserved {
                    peak,
                    replayed: true,
                    unallocated: at_reserved.saturating_sub(at_allocated),
                    largest,
                    segments: o.stats.segments,
                    oom,
                    fragmentation_oom,
                    managed,
                    device: peak + CUDA_CONTEXT_BYTES + managed,
                }
            }
            _ => {
                // The browser's engine never replays the allocator.
                notes.push(if s.allocator.replay && cfg!(not(target_arch = "wasm32")) {
                    "reserved memory: PyTorch's caching allocator is replayed for full training on one GPU; for this scenario the reserved and nvidia-smi figures count the allocated peak, without the allocator's fragmentation".into()
                } else {
                    "reserved memory: the caching allocator is not replayed here; the reserved and nvidia-smi figures count the allocated peak".into()
                });
                Reserved {
                    peak: peak_bytes,
                    replayed: false,
                    unallocated: 0,
                    largest: 0,
                    segments: 0,
                    oom: false,
                    fragmentation_oom: false,
                    managed,
                    device: peak_bytes + CUDA_CONTEXT_BYTES + managed,
                }
            }
        }
    }
}

/// One pipeline stage as one of its GPUs sees it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct StageEstimate {
    pub stage: u64,
    /// Decoder layers on this stage (all its model chunks).
    pub layers: u64,
    /// Micro-batches whose activations this stage holds when its first backward starts
    /// (interleaved schedules hold fractions: chunks ÷ virtual stages).
    pub micro_batches_in_flight: f64,
    pub peak_bytes: u64,
    pub components: crate::map::Components,
}

/// The vocabulary as Megatron-LM's embedding stores it: padded to a multiple of 128 × tp.
pub fn megatron_vocab(vocab: u64, tp: u64) -> u64 {
    vocab.div_ceil(128 * tp) * 128 * tp
}

/// Why a training layout is not estimated: what is modelled for which framework.
fn unsupported_layout(s: &Scenario) -> Error {
    let par = &s.parallel;
    let (field, what) = if !matches!(s.finetune, Finetune::Full) {
        (
            "finetune",
            "LoRA and QLoRA fine-tuning are modelled on one GPU and data-parallel layouts (DDP, FSDP, ZeRO); with tensor, pipeline, context or expert parallelism, or under Megatron-LM, use full fine-tuning",
        )
    } else if par.framework == Framework::DeepSpeed {
        ("parallel.framework", crate::scenario::DEEPSPEED_LAYOUTS)
    } else {
        ("parallel", "this layout is not modelled")
    };
    Error::new(field, what)
}

/// Data parallelism as PyTorch runs it, replayed with its buffers: FSDP2 (`fully_shard`,
/// FULL_SHARD or SHARD_GRAD_OP-like, HSDP) and DDP. `None` when the scenario is not such a
/// run (or uses what this path does not model yet: LoRA, offload, ZeRO-1).
fn estimate_pytorch_dp(s: &Scenario, name: &str, a: &Architecture) -> Option<Result<Estimate>> {
    let par = &s.parallel;
    if s.mode != Mode::Train || !matches!(s.finetune, Finetune::Full) {
        return None;
    }
    let on = match par.framework {
        Framework::Fsdp => par.dp > 1 || par.tp > 1 || par.pp > 1 || par.cp > 1 || par.ep > 1,
        Framework::Megatron => true,
        Framework::DeepSpeed => false,
    };
    if !on {
        return None;
    }
    Some(pytorch_dp(s, name, a))
}

/// One GPU's step (the worst stage's, under pipeline parallelism): what stays through the
/// step, and the step composed above it.
struct RankStep {
    base: Bytes,
    prog: step::Program,
    /// Gradients held after the backward (this rank's share).
    grads: f64,
    /// What is kept in CPU memory (offload).
    host: f64,
    layers: u64,
    in_flight: f64,
}

/// Decoder layers of each pipeline stage: an even split, the remainder on the last stage
/// (as the Hugging Face and torch.distributed.pipelining examples split a model).
pub(crate) fn stage_layers(layers: u64, stages: u64, r: u64) -> (u64, u64) {
    let per = layers / stages;
    let from = r * per;
    let to = if r + 1 == stages { layers } else { from + per };
    (from, to)
}

/// What the PyTorch-native path computes once per model and per (tp, cp, micro-batch,
/// recomputation): the architecture as the layout holds it, and each stretch replayed. The
/// planner keeps these and only composes them per layout.
pub(crate) struct Prepared {
    pub a: Architecture,
    pub first: Stretches,
    pub later: Option<Stretches>,
    pub untied_note: Option<&'static str>,
    pub tensors: Tensors,
    /// Each decoder layer's kind, as an index into [`Architecture::kinds`].
    pub kind_of: Vec<usize>,
    /// What a rank holds of each group of tensors, per (tp, ep, shard ranks, FSDP): made once.
    shards: std::cell::RefCell<Vec<(ShardKey, std::rc::Rc<Shards>)>>,
}

type ShardKey = (u64, u64, u64, bool);

/// One rank's share of each group of parameter tensors (the embedding, the head, one layer
/// of each kind, in that order): its FSDP unit, its persistent elements, its optimizer
/// state bytes.
struct Shards {
    units: Vec<step::Unit>,
    held: Vec<f64>,
    optim: Vec<f64>,
    /// `held` and `optim` as a distributed optimizer (ZeRO-1) divides them: each tensor over
    /// the ranks that hold a replica of it (an expert's over the data-parallel ranks, a dense
    /// tensor's over those times the expert-parallel ones).
    dist: Vec<(f64, f64)>,
}

impl Prepared {
    /// Runs of layers of one kind over layers `lo..hi` (as [`Architecture::runs`]).
    fn runs(&self, lo: u64, hi: u64) -> Vec<(usize, u64)> {
        if self.first.kinds.len() == 1 {
            return if hi > lo {
                vec![(0, hi - lo)]
            } else {
                Vec::new()
            };
        }
        let mut v: Vec<(usize, u64)> = Vec::new();
        for &i in &self.kind_of[lo as usize..hi as usize] {
            match v.last_mut() {
                Some((j, n)) if *j == i => *n += 1,
                _ => v.push((i, 1)),
            }
        }
        v
    }
}

/// The parameter tensors of the embedding, the head and one layer of each kind.
pub(crate) struct Tensors {
    pub emb: Vec<crate::params::PTensor>,
    pub head: Vec<crate::params::PTensor>,
    pub layers: Vec<Vec<crate::params::PTensor>>,
}

/// Whether a layout holds a tied embedding and LM head as two parameters: torchtitan's
/// wrapping shards them as separate units, and a pipeline's last stage holds the head apart
/// from the first stage's embedding.
pub(crate) fn unties(s: &Scenario, model: &Architecture) -> bool {
    let par = &s.parallel;
    let titan_split = par.zero >= 2 && par.wrap == crate::scenario::Wrap::Titan;
    (titan_split || par.pp > 1) && model.tied_embeddings
}

pub(crate) fn prepare(s: &Scenario, model: &Architecture) -> Prepared {
    prepare_with(s, model, false)
}

/// [`prepare`], keeping every stretch's events when `trace` (the op-level timeline).
pub(crate) fn prepare_with(s: &Scenario, model: &Architecture, trace: bool) -> Prepared {
    let par = &s.parallel;
    let untie = unties(s, model);
    let megatron = par.framework == Framework::Megatron;
    let a = Architecture {
        tied_embeddings: model.tied_embeddings && !untie,
        // Megatron pads the vocabulary to a multiple of 128 × tp.
        vocab: if megatron {
            megatron_vocab(model.vocab, par.tp)
        } else {
            model.vocab
        },
        ..model.clone()
    };
    let untied_note = untie.then_some(if par.pp > 1 {
        "the first stage holds the embedding and the last stage the LM head: their tied weight is a copy on each"
    } else {
        "torchtitan's wrapping shards the embedding and the LM head separately: their tied weight becomes two parameters"
    });
    let ctx = Ctx::new(s, &a, true);
    let mode = if s.recompute == Recompute::Full {
        tape::Mode::Checkpointed
    } else {
        tape::Mode::Normal
    };
    // Megatron adds every gradient into its own buffer; PyTorch makes `.grad` on the first
    // micro-batch and adds into it on the later ones.
    let (g_first, g_later) = if megatron && par.zero < 2 {
        (tape::Grads::IntoBuffer, tape::Grads::IntoBuffer)
    } else {
        (tape::Grads::New, tape::Grads::Accumulate)
    };
    let build = if trace {
        Stretches::traced
    } else {
        Stretches::new
    };
    let first = build(&ctx, mode, g_first);
    let later = (par.grad_accum > 1 || par.pp > 1).then(|| build(&ctx, mode, g_later));
    let tensors = Tensors {
        emb: crate::params::embedding(&a),
        head: crate::params::head(&a),
        layers: a
            .kinds()
            .into_iter()
            .map(|k| crate::params::layer(&a, k))
            .collect(),
    };
    let kinds = a.kinds();
    let kind_of = (0..a.layers)
        .map(|l| {
            let k = a.layer_kind(l);
            kinds.iter().position(|&x| x == k).unwrap_or(0)
        })
        .collect();
    Prepared {
        shards: Default::default(),
        kind_of,
        a,
        first,
        later,
        untied_note,
        tensors,
    }
}

/// The largest peak (bytes, with what the GPU keeps in CPU memory) over a layout's pipeline
/// stages: the first, the second and the last are enough (middle stages hold the same
/// layers with fewer micro-batches in flight than the second; tested against all).
pub(crate) fn worst_stage(s: &Scenario, pr: &Prepared) -> (f64, f64) {
    let pp = s.parallel.pp;
    let mut worst = (0.0f64, 0.0f64);
    // The first stage (most micro-batches in flight), the last (the head and the loss),
    // then the second.
    let mut stages = [0, pp.saturating_sub(1), 1];
    if pp == 2 {
        stages[2] = 0;
    }
    // Above the capacity less the CUDA context, a layout cannot fit: the first stage found
    // above it decides (the planner only asks whether it fits).
    let ws = crate::gpu::cublas_workspaces(s) as f64;
    let cap = s.capacity_bytes.saturating_sub(CUDA_CONTEXT_BYTES) as f64;
    let mut chunks = Vec::new();
    for (i, &r) in stages.iter().enumerate() {
        if r >= pp || stages[..i].contains(&r) {
            continue;
        }
        // The step's own bytes may take what the workspaces leave.
        let st = rank_step(s, pr, r, None, cap - ws, false, &mut chunks);
        let peak = st.base.plus(st.prog.seg.peak).total() + ws;
        if peak > worst.0 {
            worst = (peak, st.host);
        }
        if peak > cap {
            break;
        }
    }
    worst
}

fn pytorch_dp(s: &Scenario, name: &str, model: &Architecture) -> Result<Estimate> {
    let par = &s.parallel;
    let mut notes = Vec::new();
    let pr = prepare(s, model);
    if let Some(n) = pr.untied_note {
        notes.push(n.to_string());
    }
    let mut stages = Vec::new();
    let mut chunks = Vec::new();
    for r in 0..par.pp {
        stages.push(rank_step(
            s,
            &pr,
            r,
            Some(&mut notes),
            f64::INFINITY,
            false,
            &mut chunks,
        ));
    }
    let worst = (0..stages.len())
        .max_by(|&i, &j| {
            let (x, y) = (&stages[i], &stages[j]);
            x.base
                .plus(x.prog.seg.peak)
                .total()
                .total_cmp(&y.base.plus(y.prog.seg.peak).total())
                .then(j.cmp(&i))
        })
        .unwrap_or(0);
    let ws = crate::gpu::cublas_workspaces(s);
    let parts_of = |st: &RankStep| -> Vec<(&'static str, f64)> {
        let peak = st.base.plus(st.prog.seg.peak);
        Cat::ALL
            .iter()
            .filter(|c| peak.get(**c) > 0.0 || **c == Cat::Activations)
            .map(|c| (c.key(), peak.get(*c).max(0.0)))
            .chain([(Cat::Workspaces.key(), ws as f64)])
            .collect()
    };
    let mut stage_list = Vec::new();
    if par.pp > 1 {
        for (r, st) in stages.iter().enumerate() {
            let c = bounded_components(s, &parts_of(st))?;
            stage_list.push(StageEstimate {
                stage: r as u64,
                layers: st.layers,
                micro_batches_in_flight: st.in_flight,
                peak_bytes: c.values().sum(),
                components: c,
            });
        }
    }
    let st = &stages[worst];
    let base = st.base;
    let prog = &st.prog;
    let components = bounded_components(s, &parts_of(st))?;
    let peak_bytes: u64 = components.values().sum();
    let r = Reserved::new(s, peak_bytes, None, 0.0, &mut notes);
    let mut timeline: Vec<Point> = prog
        .points
        .iter()
        .map(|(ph, b)| Point {
            phase: (*ph).into(),
            bytes: (base.total() + b.total()).round() as u64 + ws,
        })
        .collect();
    timeline.push(Point {
        phase: "end of step".into(),
        bytes: base.total().round() as u64 + ws,
    });
    cap_timeline(&mut timeline, peak_bytes);
    let pc = model.params();
    vision_note(s, model, &mut notes);
    // A stage's backward names its layers by their order in the stage (not a chunk's of an
    // interleaved stage: those are named from the top).
    let of = match par.schedule {
        crate::scenario::Schedule::Interleaved(_) => 0,
        _ => u32::try_from(st.layers).unwrap_or(0),
    };
    let mut phase = prog.seg.at.words_of(of);
    if par.pp > 1 {
        phase = format!("stage {} of {}: {phase}", worst + 1, par.pp);
    }
    Ok(Estimate {
        model: name.to_string(),
        params: pc.total + pc.vision,
        trainable_params: pc.total,
        active_params: pc.active,
        peak_bytes,
        peak_phase: phase,
        components,
        // The parts as rounded: the figure is their sum to the byte.
        model_states_bytes: base.get(Cat::Weights).round() as u64
            + base.get(Cat::Master).round() as u64
            + base.get(Cat::Optimizer).round() as u64
            + st.grads.round() as u64,
        weights_bytes: base.get(Cat::Weights).round() as u64,
        master_weights_bytes: base.get(Cat::Master).round() as u64,
        gradients_bytes: st.grads.round() as u64,
        optimizer_states_bytes: base.get(Cat::Optimizer).round() as u64,
        kv_cache_bytes: 0,
        host_bytes: st.host.round() as u64,
        allocator_reserve_bytes: 0,
        allocator: s.allocator.name(),
        peak_reserved_bytes: r.peak,
        reserved_replayed: false,
        reserved_unallocated_bytes: 0,
        largest_free_block_bytes: 0,
        segments: 0,
        fragmentation_oom: false,
        cublas_workspace_bytes: ws,
        cuda_context_bytes: CUDA_CONTEXT_BYTES,
        managed_bytes: r.managed,
        device_bytes: r.device,
        gpu: s.gpu_name.clone(),
        capacity_bytes: s.capacity_bytes,
        fits: r.device <= s.capacity_bytes,
        headroom_bytes: headroom(s.capacity_bytes, r.device),
        timeline,
        stages: stage_list,
        notes,
    })
}

/// One rank's share of every group of tensors for `key` = (tp, ep, FSDP shard ranks, FSDP).
fn shards(s: &Scenario, pr: &Prepared, key: ShardKey) -> Shards {
    use crate::params;
    let (tp, ep, n, fsdp) = key;
    let p = &s.precision;
    let (cdt, pdt, rdt) = dtypes(s);
    let groups: Vec<&[params::PTensor]> = [&pr.tensors.emb[..], &pr.tensors.head[..]]
        .into_iter()
        .chain(pr.tensors.layers.iter().map(|v| &v[..]))
        .collect();
    let mut sh = Shards {
        units: Vec::with_capacity(groups.len()),
        held: Vec::with_capacity(groups.len()),
        optim: Vec::with_capacity(groups.len()),
        dist: Vec::with_capacity(groups.len()),
    };
    for ts in groups {
        let unit = || -> step::Unit {
            let local = params::local_numel(ts, tp, ep) as f64;
            let shard = params::shard_numel(ts, tp, ep, n) as f64;
            // The reduce-scatter's input: each tensor's shard times the ranks it is split over.
            let rs: u64 = ts
                .iter()
                .map(|t| {
                    let k = t.shard_ranks(n, ep);
                    t.local(tp, ep).shard(k) * k
                })
                .sum();
            step::Unit {
                gathered: local * cdt.bytes(),
                rs_in: rs as f64 * rdt.bytes(),
                rs_out: shard * rdt.bytes(),
                grad: shard * pdt.bytes(),
                redistribute: 0.0,
                acc_ratio: rdt.bytes() / cdt.bytes(),
            }
        };
        sh.units.push(unit());
        let (mut held, mut optim, mut dist) = (0.0, 0.0, (0.0, 0.0));
        for t in ts {
            let over = t.shard_ranks(n, ep);
            let t = t.local(tp, ep);
            let (rows, cols) = if fsdp {
                (t.dim0.div_ceil(over), t.rest)
            } else {
                (t.dim0, t.rest)
            };
            let (h, o) = (
                (rows * cols) as f64,
                s.optimizer.state_bytes(rows, cols, p.optimizer),
            );
            held += h;
            optim += o;
            dist.0 += h / over as f64;
            dist.1 += o / over as f64;
        }
        sh.held.push(held);
        sh.optim.push(optim);
        sh.dist.push(dist);
    }
    sh
}

/// (compute dtype of the parameters — FSDP2's `param_dtype` —, their storage dtype — the
/// sharded parameter, the master copy under mixed precision —, the gradient reduction's
/// dtype).
fn dtypes(s: &Scenario) -> (DType, DType, DType) {
    let p = &s.precision;
    let cdt = p.weights;
    let pdt = p.master.unwrap_or(p.weights);
    // torchtitan's mixed precision reduces in fp32.
    let rdt = if p.master.is_some() && p.name == "mixed-bf16" {
        DType::F32
    } else {
        p.reduce
    };
    (cdt, pdt, rdt)
}

/// The step of one GPU of pipeline stage `r` (the whole model without pipelining).
/// `cap`: when what the stage surely holds (its states and the activations of the
/// micro-batches in flight) is already above this, the step is not composed (the planner
/// asks only whether a layout fits); its peak is then that lower bound. `chunks`: the
/// pipeline chunks composed so far for this scenario and `pr` (a chunk is the same segments
/// on every stage that holds the same part of the model), reused and added to.
fn rank_step(
    s: &Scenario,
    pr: &Prepared,
    r: u64,
    mut notes: Option<&mut Vec<String>>,
    cap: f64,
    record: bool,
    chunks: &mut Vec<(step::Part, step::Chunk)>,
) -> RankStep {
    let a = &pr.a;
    let ctx = &Ctx::new(s, a, true);
    let (first, later) = (&pr.first, pr.later.as_ref());
    let par = &s.parallel;
    let p = &s.precision;
    // FSDP shards over the data-parallel and the context-parallel ranks together
    // (torchtitan's dp_shard × cp mesh).
    let n = par.shard_ranks() * par.cp;
    let fsdp = fsdp_ranks(par).is_some();
    let tp = par.tp;
    let pp = par.pp;
    let megatron = par.framework == Framework::Megatron;
    // Megatron's gradient buffer: bytes per parameter.
    let main_grad = if par.grad_reduce_in_bf16 || p.compute() == DType::F16 {
        2.0
    } else {
        4.0
    };
    let say = r == 0 && notes.is_some();
    let mut note = |n: String| {
        if let Some(v) = notes.as_deref_mut() {
            v.push(n);
        }
    };
    let (cdt, pdt, rdt) = dtypes(s);
    // This stage's part of the model: one chunk, or `v` under the interleaved schedule
    // (local chunk j is virtual stage j·pp + r).
    let v = match par.schedule {
        crate::scenario::Schedule::Interleaved(v) if pp > 1 => v,
        _ => 1,
    };
    let chunk_parts: Vec<step::Part> = (0..v)
        .map(|j| {
            let vs = j * pp + r;
            let (from, to) = stage_layers(a.layers, pp * v, vs);
            step::Part {
                first: vs == 0,
                last: vs + 1 == pp * v,
                runs: pr.runs(from, to),
                hold_embeds: pp == 1,
            }
        })
        .collect();
    // All of this rank's chunks together (for what is counted, not ordered).
    let part = step::Part {
        first: chunk_parts.iter().any(|c| c.first),
        last: chunk_parts.iter().any(|c| c.last),
        runs: chunk_parts
            .iter()
            .flat_map(|c| c.runs.iter().copied())
            .collect(),
        hold_embeds: pp == 1,
    };
    let ep = par.ep;
    let key: ShardKey = (tp, ep, n, fsdp);
    let found = pr
        .shards
        .borrow()
        .iter()
        .find(|x| x.0 == key)
        .map(|x| x.1.clone());
    let sh = match found {
        Some(sh) => sh,
        None => {
            let sh = std::rc::Rc::new(shards(s, pr, key));
            pr.shards.borrow_mut().push((key, sh.clone()));
            sh
        }
    };
    // Tensor parallelism: the embedding's gradient is made whole and cut to this rank's
    // rows (a copy) before it is reduced or stepped.
    let emb_rows = if tp > 1 && part.first && !megatron {
        (a.vocab as f64 / tp as f64).ceil() * a.hidden as f64 * cdt.bytes()
    } else {
        0.0
    };
    // Persistent states of this rank: each group of tensors (the embedding, the head, each
    // kind of layer) as many times as it holds it.
    let count = |g: usize| match g {
        0 => u64::from(part.first),
        1 => u64::from(part.last),
        _ => part.count(g - 2),
    };
    let held: f64 = sh
        .held
        .iter()
        .enumerate()
        .map(|(g, x)| count(g) as f64 * x)
        .sum();
    let mut optim: f64 = sh
        .optim
        .iter()
        .enumerate()
        .map(|(g, x)| count(g) as f64 * x)
        .sum();
    // (master, optimizer states) under a distributed optimizer (ZeRO-1).
    let dist = || {
        let (h, o) = sh.dist.iter().enumerate().fold((0.0, 0.0), |a, (g, x)| {
            let c = count(g) as f64;
            (a.0 + c * x.0, a.1 + c * x.1)
        });
        (p.master.map_or(0.0, |m| h * m.bytes()), o)
    };
    let mut base = Bytes::default();
    let mut host = 0.0;
    // FSDP2's CPUOffloadPolicy keeps the sharded parameters, their gradients and the
    // optimizer on the CPU: the GPU gathers each unit from there and sends its reduced
    // gradients back.
    let cpu = fsdp && (par.offload_optimizer || par.offload_params);
    // A multimodal wrapper's vision tower, in the root's group.
    let tower = vision_sharded(s, a);
    if let Some((shard, _, ids)) = tower {
        let cat = if p.master.is_some() {
            Cat::Master
        } else {
            Cat::Weights
        };
        base.add(cat, shard as f64 * pdt.bytes());
        base.add(Cat::Weights, ids as f64);
    }
    let f = step::Fsdp2 {
        titan: par.wrap == crate::scenario::Wrap::Titan,
        frozen: tower.map_or(0.0, |t| t.1 as f64 * cdt.bytes()),
        reshard: par.zero >= 3,
        // Context parallelism and pipeline schedules compute the loss outside the model.
        loss_outside: par.cp > 1 || par.pp > 1,
        emb: step::Unit {
            redistribute: emb_rows,
            ..sh.units[0]
        },
        head: sh.units[1],
        // Only FSDP gathers and reduces the layers' units.
        layers: if fsdp {
            sh.units[2..].to_vec()
        } else {
            Vec::new()
        },
    };
    let f = if cpu {
        let off = |u: step::Unit| step::Unit { grad: 0.0, ..u };
        step::Fsdp2 {
            emb: off(f.emb),
            head: off(f.head),
            layers: f.layers.iter().map(|&u| off(u)).collect(),
            ..f
        }
    } else {
        f
    };
    if cpu {
        host += held * pdt.bytes() * 2.0 + optim;
        optim = 0.0;
        if say {
            note(
                "FSDP2 CPU offload: sharded parameters, gradients and optimizer states in CPU memory"
                    .into(),
            );
        }
    } else if fsdp {
        // Under FSDP2 the sharded parameter is the only persistent copy: the master copy
        // when the compute dtype is lower.
        if p.master.is_some() {
            base.add(Cat::Master, held * pdt.bytes());
        } else {
            base.add(Cat::Weights, held * pdt.bytes());
        }
    }
    if fsdp {
        if say {
            note(format!(
                "{} over {n} ranks, {} wrapping, {}{}",
                if megatron {
                    "Megatron-FSDP"
                } else {
                    "FSDP2 (fully_shard)"
                },
                if f.titan {
                    "torchtitan's"
                } else {
                    "per-layer + root"
                },
                if f.reshard {
                    "resharded after forward"
                } else {
                    "kept unsharded from forward to backward"
                },
                if n < par.dp {
                    format!(", replicated over {} groups (HSDP)", par.dp / n)
                } else {
                    String::new()
                }
            ));
        }
    } else if megatron {
        // Megatron-LM: the parameters in their training dtype, every gradient added into
        // one persistent buffer (fp32 unless --grad-reduce-in-bf16), the fp32 master copy
        // and the optimizer's states — sharded over the data-parallel (× context-parallel)
        // ranks by the distributed optimizer.
        base.add(Cat::Weights, held * p.weights.bytes());
        base.add(Cat::Gradients, held * main_grad);
        let mut master = p.master.map_or(0.0, |m| held * m.bytes());
        if par.zero == 1 {
            (master, optim) = dist();
        }
        if par.offload_optimizer {
            host += master + optim;
            master = 0.0;
            optim = 0.0;
        }
        base.add(Cat::Master, master);
        if say {
            note(format!(
                "Megatron-LM: {} parameters, a {} gradient buffer (main_grad), {}{}",
                p.weights.name(),
                if main_grad == 4.0 { "fp32" } else { "16-bit" },
                if par.zero == 1 {
                    format!("the distributed optimizer over {n} ranks")
                } else {
                    "the optimizer on every data-parallel rank".to_string()
                },
                if par.offload_optimizer {
                    ", optimizer in CPU memory"
                } else {
                    ""
                }
            ));
        }
    } else {
        base.add(Cat::Weights, held * p.weights.bytes() + vision_bytes(s, a));
        let mut master = p.master.map_or(0.0, |m| held * m.bytes());
        if par.zero == 1 {
            // ZeroRedundancyOptimizer: the optimizer (and the master copy) sharded over the
            // data-parallel ranks.
            (master, optim) = dist();
            if say {
                note(format!(
                    "DDP with the optimizer sharded over {n} ranks (ZeroRedundancyOptimizer)"
                ));
            }
        }
        if par.offload_optimizer {
            host += master + optim;
            master = 0.0;
            optim = 0.0;
        }
        base.add(Cat::Master, master);
        if par.dp > 1 {
            // DDP's gradient buckets: a persistent copy of every gradient
            // (`gradient_as_bucket_view=False`).
            base.add(Cat::Comm, held * p.grads.bytes());
            if say {
                note(format!("DDP over {} ranks", par.dp));
            }
        }
    }
    if tp > 1 && say {
        note(format!(
            "tensor parallel over {tp} ranks{}{}{}",
            if megatron {
                ""
            } else {
                " (DTensor, torchtitan's plan)"
            },
            if par.sp { ", sequence parallel" } else { "" },
            if par.loss_parallel {
                ", loss on vocabulary-sharded logits"
            } else {
                ", logits all-gathered whole"
            }
        ));
    }
    base.add(Cat::Optimizer, optim);
    let m = par.grad_accum;
    let h = a.hidden as f64;
    // Pipeline stages: the tensor a chunk receives and sends, the residual stream (fp32
    // under autocast: the parameters, so the embedding's output, are fp32).
    let act = ctx.tsp * h * if ctx.autocast { 4.0 } else { ctx.c.bytes() };
    if pp > 1 && !megatron {
        // torch.distributed.pipelining: one receive buffer per micro-batch for each chunk's
        // input (not the first virtual stage) and one for its output's gradient (not the
        // last), allocated once and kept.
        let bufs: u64 = chunk_parts
            .iter()
            .map(|c| (u64::from(!c.first) + u64::from(!c.last)) * m)
            .sum();
        base.add(Cat::Comm, bufs as f64 * act);
    }
    // What this stage surely holds: its states and the activations of the micro-batches in
    // flight when its first backward starts (and, under a pipeline with FSDP, right after
    // it: the unsharded gradients kept for the later micro-batches).
    if cap.is_finite() {
        let fwd = |st: &Stretches, c: &step::Part| {
            let pick = |on: bool, x: f64| if on { x } else { 0.0 };
            let layers = c
                .runs
                .iter()
                .map(|&(i, n)| st.layers[i].fwd.delta.total() * n as f64)
                .sum::<f64>()
                + pick(c.first, st.emb.fwd.delta.total())
                + pick(
                    c.last,
                    st.head.fwd.delta.total() + st.loss.fwd.delta.total(),
                );
            layers.max(0.0)
        };
        let in_flight: f64 = if pp > 1 {
            let v = chunk_parts.len() as u64;
            let k = if v > 1 {
                let per_round = (par.grad_accum / (par.grad_accum / pp).max(1)).max(1);
                (((v - 1) * per_round + 2 * (pp - 1 - r)).min(par.grad_accum * v) + 1) as f64
                    / v as f64
            } else {
                match par.schedule {
                    crate::scenario::Schedule::GPipe => par.grad_accum,
                    _ => (pp - r).min(par.grad_accum),
                }
                .max(1) as f64
            };
            let held = if fsdp && m > 1 {
                let ug = |p: &tape::Profile| p.bwd.delta.get(Cat::Gradients).max(0.0);
                let pick = |on: bool, x: f64| if on { x } else { 0.0 };
                let grads = part
                    .runs
                    .iter()
                    .map(|&(i, n)| ug(&first.layers[i]) * n as f64)
                    .sum::<f64>()
                    + pick(part.first, ug(&first.emb))
                    + pick(part.last, ug(&first.head) + ug(&first.loss));
                grads * rdt.bytes() / cdt.bytes()
            } else {
                0.0
            };
            let f = fwd(first, &part);
            // After the first backward a steady-state forward (when there is one) brings the
            // micro-batches in flight back to k, beside the kept gradients.
            let steady = v == 1
                && par.grad_accum > k as u64
                && par.schedule != crate::scenario::Schedule::GPipe;
            // The first backward starts with k micro-batches in flight: its first stretch (the
            // loss on the last stage, the top layer elsewhere) rises above that.
            let top = if part.last {
                first.loss.bwd.peak.total()
            } else {
                // The top layer of the stage's last chunk.
                chunk_parts
                    .last()
                    .and_then(|c| c.runs.last())
                    .map_or(0.0, |&(i, _)| first.layers[i].bwd.peak.total())
            };
            let at_first_backward = k * f + top.max(0.0);
            if steady {
                (k * f + held).max(at_first_backward)
            } else {
                at_first_backward.max((k - 1.0).max(0.0) * f + held)
            }
        } else {
            fwd(first, &part)
        };
        let bound = base.total() + in_flight;
        if bound > cap {
            return RankStep {
                base,
                prog: step::Program {
                    seg: Seg {
                        peak: Bytes::of(Cat::Activations, in_flight),
                        ..Seg::default()
                    },
                    points: Vec::new(),
                    rec: None,
                },
                grads: 0.0,
                host,
                layers: part.layers(),
                in_flight: 0.0,
            };
        }
    }
    let opt_temp = match s.optimizer {
        Optimizer::Adafactor => largest_param(a) as f64 * p.optimizer.bytes() * 2.0,
        Optimizer::Adam8bit | Optimizer::PagedAdam8bit => largest_param(a) as f64 * 4.0 * 2.0,
        _ => 0.0,
    } + if fsdp { 0.0 } else { emb_rows };
    if pp > 1 {
        let later = later.unwrap_or(first);
        let schedule = match par.schedule {
            crate::scenario::Schedule::GPipe => step::PipeSchedule::GPipe,
            _ => step::PipeSchedule::OneFOneB,
        };
        if say {
            note(format!(
                "pipeline of {pp} stages ({}{}), {m} micro-batches",
                if megatron {
                    ""
                } else {
                    "torch.distributed.pipelining, "
                },
                match par.schedule {
                    crate::scenario::Schedule::GPipe => "GPipe".to_string(),
                    crate::scenario::Schedule::Interleaved(v) =>
                        format!("interleaved 1F1B, {v} chunks per stage"),
                    _ => "1F1B".to_string(),
                }
            ));
        }
        let v = chunk_parts.len() as u64;
        let chunks: Vec<step::Chunk> = if fsdp {
            Vec::new()
        } else {
            chunk_parts
                .iter()
                .map(|c| match chunks.iter().find(|x| x.0 == *c) {
                    Some(x) => x.1,
                    None => {
                        let ch = step::Chunk::new(first, later, c, act, megatron);
                        chunks.push((c.clone(), ch));
                        ch
                    }
                })
                .collect()
        };
        let fsdp_chunks: Vec<step::FsdpChunk<'_>> = if fsdp {
            chunk_parts
                .iter()
                .map(|c| step::FsdpChunk {
                    new: step::FsdpPart::new(first, first, &f, c.clone()),
                    acc: step::FsdpPart::new(later, first, &f, c.clone()),
                    io: act,
                })
                .collect()
        } else {
            Vec::new()
        };
        let (prog, k) = if fsdp || v > 1 {
            let ops = step::PipeOps::new(schedule, pp, r, m, v);
            // Micro-batches of activations in flight at the first backward.
            let k = (ops.first_b() as f64 / v as f64).max(1.0);
            let prog = step::pipeline_loop(&chunks, &fsdp_chunks, &ops, m, opt_temp);
            (prog, k)
        } else {
            let k = match schedule {
                step::PipeSchedule::GPipe => m,
                step::PipeSchedule::OneFOneB => (pp - r).min(m),
            };
            let prog = step::pipeline_stage(&chunks[0], schedule, pp - 1 - r, m, opt_temp);
            (prog, k.max(1) as f64)
        };
        let grads = if fsdp {
            let u = |x: &step::Unit, n: u64| x.grad * n as f64;
            u(&f.emb, u64::from(part.first))
                + u(&f.head, u64::from(part.last))
                + f.layers
                    .iter()
                    .enumerate()
                    .map(|(i, x)| u(x, part.count(i)))
                    .sum::<f64>()
        } else if megatron {
            held * main_grad
        } else {
            held * p.grads.bytes()
        };
        return RankStep {
            base,
            prog,
            grads,
            host,
            layers: part.layers(),
            in_flight: k,
        };
    }
    let (prog, grads) = if fsdp {
        let grads = f.emb.grad
            + f.head.grad
            + f.layers
                .iter()
                .enumerate()
                .map(|(i, x)| part.count(i) as f64 * x.grad)
                .sum::<f64>();
        (step::fsdp2(first, &f, m, opt_temp, record), grads)
    } else {
        // Later micro-batches add into the gradients in place.
        let prog = step::replicated_rec(first, later, m, opt_temp, record);
        let g = if megatron { main_grad } else { p.grads.bytes() };
        (prog, held * g)
    };
    RankStep {
        base,
        prog,
        grads,
        host,
        layers: part.layers(),
        in_flight: 1.0,
    }
}

/// What one data-parallel rank keeps: the persistent states after ZeRO/FSDP sharding and
/// offload, and the buffers the engine adds while it gathers and reduces.
pub(crate) struct DpStates {
    pub weights: f64,
    pub master: f64,
    pub optim: f64,
    pub grads: f64,
    /// Working memory the engine counts with the model states (DeepSpeed ZeRO-3: the
    /// largest layer's 16-bit parameters and gradients, `4 × largest_layer_params`).
    pub fixed: f64,
    /// Parameters gathered (unsharded) during forward and backward.
    pub gathered: f64,
    /// Gradient communication buffers.
    pub buckets: f64,
    /// Offloaded bytes held in CPU memory.
    pub host: f64,
    /// Gradient buffers resident through the whole step, besides the autograd gradients
    /// (DeepSpeed's gradient partition: fp32 under mixed precision).
    pub grad_acc: f64,
}

/// DeepSpeed's default `reduce_bucket_size` (elements).
const DEEPSPEED_REDUCE_BUCKET: f64 = 5e8;

/// How one part of the model's states is spread over data-parallel ranks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geo<'a> {
    /// Ranks a sharded state is divided over.
    pub ranks: f64,
    /// Ranks holding a replica of these states (gradients are reduced across them).
    pub replicas: u64,
    /// The model, for its largest parameter tensor (DeepSpeed ZeRO-3's working buffer) and
    /// its largest wrapped unit (FSDP gathers one at a time), counted only where needed.
    pub arch: Option<&'a Architecture>,
}

impl<'a> Geo<'a> {
    fn data_parallel(s: &Scenario, arch: Option<&'a Architecture>) -> Geo<'a> {
        Geo {
            ranks: s.parallel.shard_ranks() as f64,
            replicas: s.parallel.dp,
            arch,
        }
    }

    /// Elements of the largest parameter tensor.
    fn largest(&self) -> f64 {
        self.arch.map_or(0.0, |a| largest_param(a) as f64)
    }

    /// Parameters of the largest wrapped unit.
    fn unit(&self) -> f64 {
        self.arch.map_or(0.0, fsdp_unit_params)
    }
}

impl DpStates {
    /// What shards the states, in words (none for a single plain replica).
    pub(crate) fn describe(s: &Scenario, replicas: u64, ranks: u64) -> Option<String> {
        let par = &s.parallel;
        if s.mode != Mode::Train
            || (par.framework != Framework::DeepSpeed && replicas == 1 && !par.offload_optimizer)
        {
            return None;
        }
        let zero = par.zero;
        let offload = if par.offload_optimizer {
            ", optimizer offloaded to CPU"
        } else {
            ""
        };
        let megatron = par.framework == Framework::Megatron;
        let what = match (par.framework, zero) {
            (Framework::DeepSpeed, _) => {
                let p = &s.precision;
                let bf16 = crate::dtype::DType::Bf16;
                let low = match (p.master, p.weights.bytes() == 2.0, p.optimizer == bf16) {
                    (None, true, _) if zero == 0 => {
                        ", fp32 master weights and states (its FP16_Optimizer)"
                    }
                    (None, true, true) => ", bf16 master weights and states (bf16_master_weights_and_grads, bf16_optimizer_states)",
                    (None, true, false) => ", bf16 master weights (bf16_master_weights_and_grads)",
                    _ => "",
                };
                return Some(format!(
                    "DeepSpeed ZeRO-{zero} over {ranks} ranks{low}{offload}"
                ));
            }
            (_, 3 | 2) if megatron => "Megatron-FSDP",
            (_, 1) if megatron => "Megatron's distributed optimizer",
            _ if megatron => "Megatron DDP",
            (_, 3) if par.shard_group < par.dp => "FSDP HYBRID_SHARD",
            (_, 3) => "FSDP FULL_SHARD",
            (_, 2) => "FSDP SHARD_GRAD_OP",
            (_, 1) => "DDP with a sharded optimizer (ZeRO-1)",
            _ => "DDP",
        };
        Some(format!(
            "{what} over {replicas} ranks (states sharded over {ranks}){offload}"
        ))
    }

    pub(crate) fn new(s: &Scenario, par: &Parallel, st: &ModelStates, g: Geo<'_>) -> DpStates {
        let train = s.mode == Mode::Train;
        let n = g.ranks;
        let zero = par.zero;
        let shard = |on: bool, b: f64| if on { b / n } else { b };
        let trainable = st.trainable_params as f64;
        let mut d = DpStates {
            weights: shard(zero >= 3, st.weights),
            master: shard(zero >= 1, st.master),
            optim: shard(zero >= 1, st.optimizer),
            grads: shard(zero >= 2, st.grads),
            fixed: 0.0,
            gathered: 0.0,
            buckets: 0.0,
            host: 0.0,
            grad_acc: 0.0,
        };
        let plain =
            par.framework != Framework::DeepSpeed && g.replicas == 1 && !par.offload_optimizer;
        if !train || plain {
            return d;
        }
        let wb = s.precision.weights.bytes();
        // Gradient buffers are reduced in the reduce dtype (FSDP `reduce_dtype`).
        let gb = s.precision.reduce.bytes();
        match par.framework {
            Framework::DeepSpeed => {
                // DeepSpeed's accounting (stage_1_and_2.py / stage3.py and its
                // estimate_zero{2,3}_model_states_mem_needs): each rank's optimizer partition
                // has an fp32 gradient. The 16-bit gradients stay whole under stage 1; stage
                // 2 keeps only its partition's (`grads_in_partition`): a gradient of another
                // rank's partition is freed once its bucket is reduced (`reduce_ipg_grads`,
                // `clear_grad_attribute`), as the ZeRO paper's 2Ψ + 14Ψ/N has it, where
                // the estimator's 4Ψ + 16Ψ/N keeps them all.
                let p = &s.precision;
                let fp32_grads = match p.master {
                    Some(m) => shard(zero >= 1, trainable * m.bytes()),
                    // Without ZeRO, DeepSpeed trains 16-bit weights through its FP16_Optimizer
                    // (fp16/fused_optimizer.py): fp32 master weights, their fp32 gradients and
                    // fp32 states, whatever the precision asks.
                    None if zero == 0 && p.weights.bytes() == 2.0 => {
                        d.master = trainable * 4.0;
                        if !s.optimizer.eight_bit() {
                            d.optim *= 4.0 / p.optimizer.bytes();
                        }
                        trainable * 4.0
                    }
                    // Without a separate master dtype, ZeRO's partition of the parameters
                    // the optimizer updates is kept in their own dtype (16-bit training:
                    // `bf16_master_weights_and_grads`; `master_weights_and_grads_dtype`):
                    // stages 1 and 2 clone it (`single_partition_of_fp32_groups`), stage 3
                    // uses the parameters' own partition where the dtypes agree
                    // (`fp32_partitioned_groups_flat`), and its gradient is in that dtype
                    // too (stage 3's `grad_partitions_flat_buffer`, in the model's dtype).
                    None if zero >= 1 && p.weights.is_float_compute() => {
                        let part = trainable * p.weights.bytes() / n;
                        if zero <= 2 || par.offload_optimizer {
                            d.master = part;
                        }
                        part
                    }
                    None => 0.0,
                };
                // The fp32 partition is a persistent buffer (DeepSpeed's own estimator
                // counts it with the model states): resident through the whole step.
                d.grads = match zero {
                    3.. => 0.0,
                    2 => st.grads / n,
                    _ => st.grads,
                };
                d.grad_acc = fp32_grads;
                if zero >= 3 {
                    d.fixed = 2.0 * g.largest() * wb;
                }
                if (1..=2).contains(&zero) {
                    d.buckets = DEEPSPEED_REDUCE_BUCKET.min(trainable) * gb;
                }
                if par.offload_optimizer {
                    d.host += d.master + d.optim + fp32_grads;
                    d.master = 0.0;
                    d.optim = 0.0;
                    d.grads = 0.0;
                    d.grad_acc = 0.0;
                    d.buckets = 0.0;
                }
            }
            Framework::Fsdp | Framework::Megatron => {
                let megatron = par.framework == Framework::Megatron;
                match zero {
                    // FULL_SHARD: the current unit and the prefetched next one are gathered;
                    // in backward a unit's full gradients wait for their reduce-scatter.
                    3 => {
                        let unit = g.unit();
                        d.gathered = 2.0 * unit * wb;
                        d.buckets = unit * gb;
                    }
                    // SHARD_GRAD_OP: parameters stay gathered from forward to backward.
                    2 => {
                        d.gathered = st.weights - d.weights;
                        d.buckets = g.unit() * gb;
                    }
                    // DDP: gradient buckets are a second copy of the gradients
                    // (gradient_as_bucket_view=False, the default). Megatron's gradients are
                    // views into the buffer it reduces: no copy.
                    _ if g.replicas > 1 && !megatron => d.buckets = st.grads,
                    _ => {}
                }
                if par.offload_optimizer {
                    d.host += d.master + d.optim;
                    d.master = 0.0;
                    d.optim = 0.0;
                }
            }
        }
        if par.offload_params {
            d.host += d.weights;
            d.weights = 0.0;
            if par.framework == Framework::Fsdp {
                d.host += d.grads;
                d.grads = 0.0;
            }
        }
        d
    }
}

/// Parameters of the largest FSDP unit: a decoder layer, or the root (embedding, final norm,
/// output layer) when that is larger.
fn fsdp_unit_params(a: &Architecture) -> f64 {
    let pc = a.params();
    let layer_max = a
        .kinds()
        .into_iter()
        .map(|k| a.layer_params(k).map_or(0, |l| l.0))
        .max()
        .unwrap_or(0);
    let root = pc.embedding + pc.lm_head + pc.final_norm + pc.positions;
    layer_max.max(root) as f64
}

/// Persistent bytes, unsharded.
pub(crate) struct ModelStates {
    pub weights: f64,
    pub master: f64,
    pub grads: f64,
    /// The optimizer's states in PyTorch's allocator, and those in CUDA managed memory
    /// (a paged 8-bit optimizer's).
    pub optimizer: f64,
    pub managed: f64,
    pub trainable_params: u64,
    /// The model's parameter counts (none for a bare count).
    pub params: crate::arch::ParamCounts,
}

impl ModelStates {
    pub(crate) fn new(s: &Scenario, arch: Option<&Architecture>) -> ModelStates {
        let p = &s.precision;
        let train = s.mode == Mode::Train;
        let opt = s.optimizer;
        let params = match arch {
            Some(a) => a.params(),
            None => Default::default(),
        };
        let vision = arch.map_or(0.0, |a| vision_bytes(s, a));
        let mut st = match (arch, &s.finetune) {
            (None, _) | (Some(_), Finetune::Full) => {
                let (n, tensors) = match arch {
                    Some(a) => (params.total, param_tensors(a, params.total)),
                    // A bare count: one big matrix (optimizer state counted per element).
                    None => {
                        let n = match &s.model {
                            Model::Params(n) => *n,
                            _ => 0,
                        };
                        (n, vec![(1, n, 1)])
                    }
                };
                let nf = n as f64;
                let state_dtype = p.optimizer;
                let optimizer: f64 = tensors
                    .iter()
                    .map(|&(k, r, c)| k as f64 * opt.state_bytes(r, c, state_dtype))
                    .sum();
                let managed: f64 = tensors
                    .iter()
                    .map(|&(k, r, c)| k as f64 * opt.managed_bytes(r, c))
                    .sum();
                let weights = match arch {
                    Some(a) if !p.weights.is_float_compute() => {
                        quantized_weights(a, p.weights, p.compute())
                    }
                    // Inference loads a quantized checkpoint as it is stored (fp8 needs
                    // compute capability 8.9: an A100 gets it dequantized).
                    Some(a) if checkpoint_format(s, a) => a
                        .checkpoint_weight_bytes(p.weights.bytes())
                        .unwrap_or(nf * p.weights.bytes()),
                    _ => nf * p.weights.bytes(),
                };
                ModelStates {
                    weights,
                    master: if train {
                        p.master.map_or(0.0, |m| nf * m.bytes())
                    } else {
                        0.0
                    },
                    grads: if train { nf * p.grads.bytes() } else { 0.0 },
                    optimizer: if train { optimizer } else { 0.0 },
                    managed: if train { managed } else { 0.0 },
                    trainable_params: if train { n } else { 0 },
                    params,
                }
            }
            (Some(a), Finetune::Lora(l)) => {
                let adapters = lora_params(a, &l.targets, l.rank);
                let base = if l.quantized {
                    quantized_weights(a, DType::Nf4, p.compute())
                } else if p.weights.is_float_compute() {
                    params.total as f64 * p.weights.bytes()
                } else {
                    quantized_weights(a, p.weights, p.compute())
                };
                let af = adapters.iter().map(|t| t.0 * t.1 * t.2).sum::<u64>() as f64;
                let optimizer: f64 = adapters
                    .iter()
                    .map(|&(k, r, c)| k as f64 * opt.state_bytes(r, c, DType::F32))
                    .sum();
                let managed: f64 = adapters
                    .iter()
                    .map(|&(k, r, c)| k as f64 * opt.managed_bytes(r, c))
                    .sum();
                ModelStates {
                    weights: base + af * 4.0,
                    master: 0.0,
                    grads: if train { af * 4.0 } else { 0.0 },
                    optimizer: if train { optimizer } else { 0.0 },
                    managed: if train { managed } else { 0.0 },
                    trainable_params: if train { af as u64 } else { 0 },
                    params,
                }
            }
        };
        st.weights += vision;
        st
    }
}

/// Whether the engine places a multimodal wrapper's vision tower: with 16- or 32-bit
/// weights (a quantized tower is not modelled) and nothing offloaded, on one GPU (or each
/// replica of data-parallel inference) running PyTorch's own loop (not DeepSpeed, whose
/// optimizer would keep states for it), or under
/// PyTorch's parallelism without pipeline or expert parallelism: sharded by FSDP2
/// ([`vision_sharded`]), or whole on each of the tensor-parallel ranks of one replica
/// (DTensor's plan covers the decoder alone).
pub(crate) fn vision_placed(s: &Scenario, a: &Architecture) -> bool {
    let par = &s.parallel;
    let pytorch = par.framework == Framework::Fsdp
        && par.pp == 1
        && par.ep == 1
        && (par.zero >= 2 || par.dp * par.cp == 1);
    // Inference runs whole replicas (the scenario's check refuses it model parallelism).
    let whole = par.gpus() == 1 || s.mode == Mode::Inference;
    a.vision.is_some()
        && ((whole && par.framework != Framework::DeepSpeed) || pytorch)
        && !par.offload_optimizer
        && !par.offload_params
        && s.precision.weights.is_float_compute()
        && a.quant.is_none()
        && !matches!(&s.finetune, Finetune::Lora(l) if l.quantized)
}

/// The ranks FSDP2 shards over (torchtitan's dp_shard × cp mesh), where it shards: ZeRO
/// stage 2 or 3 over more than one rank.
fn fsdp_ranks(par: &crate::scenario::Parallel) -> Option<u64> {
    let n = par.shard_ranks() * par.cp;
    (par.zero >= 2 && n > 1).then_some(n)
}

/// Under FSDP2 (`fully_shard` over the data-parallel × context-parallel ranks) a multimodal
/// wrapper's vision tower is in no layer's unit, so in the root's group: each rank keeps
/// its shard, and the root's all-gather unshards it at the start of every forward and keeps
/// it so until the root's post-backward, although text never runs it (measured by the CPU
/// oracle: `gemma3-wrap fsdp`, `hsdp` and `fsdp_tp` in tests/data/oracle/sharded.jsonl;
/// tensor parallelism leaves the tower whole). (Elements of one rank's shard, padding
/// included; of the whole tower; bytes of its position ids, int64, which FSDP2 does not
/// shard.)
pub(crate) fn vision_sharded(s: &Scenario, a: &Architecture) -> Option<(u64, u64, u64)> {
    let n = fsdp_ranks(&s.parallel)?;
    let v = a.vision.as_ref().filter(|_| vision_placed(s, a))?;
    Some((
        crate::params::vision_shard(v, a.hidden, n),
        crate::params::vision_params(v, a.hidden),
        v.patches() * 8,
    ))
}

/// The vision tower's bytes on each GPU where it is [`vision_placed`] whole (one GPU, or
/// tensor parallelism without FSDP): its parameters in the model's dtype (fp32 under mixed
/// precision, whose master weights are the parameters), and its position ids (int64).
pub(crate) fn vision_bytes(s: &Scenario, a: &Architecture) -> f64 {
    match &a.vision {
        Some(v) if vision_placed(s, a) && fsdp_ranks(&s.parallel).is_none() => {
            let p = &s.precision;
            let dt = match (&s.finetune, s.mode) {
                (Finetune::Full, Mode::Train) => p.master.unwrap_or(p.weights),
                _ => p.weights,
            };
            crate::params::vision_params(v, a.hidden) as f64 * dt.bytes() + v.patches() as f64 * 8.0
        }
        _ => 0.0,
    }
}

/// What the estimate says of a vision tower.
fn vision_note(s: &Scenario, a: &Architecture, notes: &mut Vec<String>) {
    let Some(v) = &a.vision else {
        return;
    };
    let n = crate::num::thousands(crate::params::vision_params(v, a.hidden));
    notes.push(if vision_placed(s, a) {
        format!("vision tower: {n} parameters, loaded with the decoder; text batches never run it (no gradients or optimizer states)")
    } else {
        format!("vision tower: {n} parameters, not counted here (DDP, DeepSpeed, pipeline or expert parallel, offload or quantized)")
    });
}

/// Whether inference keeps the weights in the checkpoint's own quantized format (MXFP4 or
/// fp8, `quantization_config`): the precision asks for 16-bit weights and the GPU runs the
/// format (transformers dequantizes fp8 to bf16 below compute capability 8.9, e.g. on A100).
pub(crate) fn checkpoint_format(s: &Scenario, a: &Architecture) -> bool {
    let w = s.precision.weights;
    let on_a100 = s.gpu_name.starts_with("A100");
    s.mode == Mode::Inference
        && matches!(w, DType::Bf16 | DType::F16)
        && match a.quant {
            Some(crate::arch::Quant::Mxfp4) => true,
            Some(crate::arch::Quant::Fp8 { .. }) => !on_a100,
            None => false,
        }
}

/// (count, rows, cols) of every parameter tensor, for optimizers whose state depends on
/// shape (Adafactor, 8-bit Adam).
fn param_tensors(a: &Architecture, total: u64) -> Vec<(u64, u64, u64)> {
    let mut v = Vec::with_capacity(16);
    let mut lin = |k: u64, l: crate::arch::Linear| {
        v.push((k, l.out, l.inp));
        if l.bias {
            v.push((k, l.out, 1));
        }
    };
    let moe_layers = a.layers_where(|k| k.moe);
    let dense = a.layers - moe_layers;
    let attn = a.layers_where(|k| k.attn != crate::arch::AttnType::Linear);
    for (_, l) in a.attention_linears() {
        lin(attn, l);
    }
    for (_, l) in a.mlp_linears(a.intermediate) {
        lin(dense, l);
    }
    if let Some(m) = &a.moe {
        for (_, l) in a.mlp_linears(m.expert_intermediate) {
            lin(moe_layers * (m.experts + m.shared_experts), l);
        }
        lin(
            moe_layers,
            crate::arch::Linear::new(a.hidden, m.experts, false),
        );
    }
    v.push((1, a.vocab, a.hidden));
    if !a.tied_embeddings {
        v.push((1, a.vocab, a.hidden));
    }
    if let Some(n) = a.learned_positions {
        v.push((1, n, a.hidden));
    }
    // Norms and other vectors: whatever is left.
    let counted: u64 = v.iter().map(|t| t.0 * t.1 * t.2).sum();
    if total > counted {
        v.push((1, total - counted, 1));
    }
    v
}

/// (count, rows, cols) of the LoRA adapters (A: r × in, B: out × r) on `targets`.
pub(crate) fn lora_params(a: &Architecture, targets: &[String], r: u64) -> Vec<(u64, u64, u64)> {
    let mut v = Vec::new();
    let dense = a.layers_where(|k| !k.moe);
    // Linear-attention layers (gated DeltaNet) have no q/k/v/o projections for the targets
    // to name: peft puts adapters only on the softmax-attention layers.
    let attn = a.layers_where(|k| k.attn != crate::arch::AttnType::Linear);
    let mut mods = a
        .attention_linears()
        .into_iter()
        .map(|(n, l)| (n, l, attn))
        .collect::<Vec<_>>();
    mods.extend(
        a.mlp_linears(a.intermediate)
            .into_iter()
            .map(|(n, l)| (n, l, dense)),
    );
    for (n, l, k) in mods {
        if targets.iter().any(|t| t == n) {
            v.push((k, r, l.inp));
            v.push((k, l.out, r));
        }
    }
    v
}

/// Weights with linear layers quantised to `q` and the rest (embeddings, head, norms) kept
/// in the compute dtype, as bitsandbytes quantises a model.
fn quantized_weights(a: &Architecture, q: DType, c: DType) -> f64 {
    let pc = a.params();
    let outside = pc.embedding + pc.positions + pc.lm_head + pc.final_norm;
    let linear_params: u64 = param_tensors(a, pc.total)
        .iter()
        .filter(|t| t.2 > 1 && !(t.1 == a.vocab && t.2 == a.hidden))
        .filter(|t| Some(t.1) != a.learned_positions)
        .map(|t| t.0 * t.1 * t.2)
        .sum();
    let rest = pc.total - linear_params - outside;
    linear_params as f64 * q.bytes() + (outside + rest) as f64 * c.bytes()
}

/// A training step on one GPU of the general path (a single GPU, DeepSpeed ZeRO, LoRA):
/// its stretches replayed (with their events when `record`), composed over the
/// micro-batches (the later ones add into the gradients the first made) and the optimizer
/// step.
pub(crate) struct TrainProgram {
    pub prog: step::Program,
    pub first: Stretches,
    pub later: Option<Stretches>,
}

pub(crate) fn train_program(
    s: &Scenario,
    a: &Architecture,
    grads: f64,
    grads_full: f64,
    record: bool,
    scripts: bool,
) -> TrainProgram {
    let ctx = Ctx::new(s, a, true);
    let mode = if s.recompute == Recompute::Full {
        tape::Mode::Checkpointed
    } else {
        tape::Mode::Normal
    };
    // `record`: every stretch's events (the op-level timeline); `scripts`: the first
    // micro-batch's allocation scripts (the caching allocator's replay).
    let build = if record {
        Stretches::traced
    } else {
        Stretches::new
    };
    let mut first = if scripts {
        Stretches::scripted(&ctx, mode, tape::Grads::New)
    } else {
        build(&ctx, mode, tape::Grads::New)
    };
    // ZeRO-2/3 and FSDP reduce-scatter each unit's gradients as its backward ends: only this
    // rank's shard accumulates (the unit's whole gradients are a buffer counted apart).
    if grads < grads_full && grads_full > 0.0 {
        first.scale_grads(grads / grads_full);
    }
    // Gradient accumulation: the later micro-batches add their gradients into those the
    // first made, in place.
    let m = s.parallel.grad_accum;
    let later = (m > 1).then(|| {
        if scripts {
            Stretches::scripted(&ctx, mode, tape::Grads::Accumulate)
        } else {
            build(&ctx, mode, tape::Grads::Accumulate)
        }
    });
    // Optimizer step: non-fused temporaries.
    let opt_temp = match s.optimizer {
        Optimizer::Adafactor => largest_param(a) as f64 * s.precision.optimizer.bytes() * 2.0,
        Optimizer::Adam8bit | Optimizer::PagedAdam8bit => largest_param(a) as f64 * 4.0 * 2.0,
        _ => 0.0,
    };
    let prog = step::replicated_rec(&first, later.as_ref(), m, opt_temp, record);
    TrainProgram { prog, first, later }
}

fn train_step(
    s: &Scenario,
    a: &Architecture,
    base: f64,
    grads: f64,
    grads_full: f64,
    tl: &mut Vec<Point>,
) -> (f64, String, Bytes, Option<crate::alloc::stream::Outcome>) {
    // The widgets' wasm does not carry the replay (its size budget).
    let replay = cfg!(not(target_arch = "wasm32")) && crate::alloc::stream::covers(s);
    let TrainProgram {
        prog: p,
        first,
        later,
    } = train_program(s, a, grads, grads_full, false, replay);
    for (name, b) in &p.points {
        tl.push(Point {
            phase: (*name).into(),
            bytes: (base + b.total()).round() as u64,
        });
    }
    tl.push(Point {
        phase: "end of step".into(),
        bytes: base.round() as u64,
    });
    let outcome = if replay {
        crate::alloc::stream::replay_train(s, a, &first, later.as_ref(), first.embeds_held)
    } else {
        None
    };
    (
        base + p.seg.peak.total(),
        p.seg.at.words_of(u32::try_from(a.layers).unwrap_or(0)),
        p.seg.peak,
        outcome,
    )
}

fn largest_param(a: &Architecture) -> u64 {
    param_tensors(a, a.params().total)
        .iter()
        .map(|t| t.1 * t.2)
        .max()
        .unwrap_or(0)
}

/// generate() as the engine composes it: the prefill's stretches (with their events when
/// `record`), the prefill composed (and recorded), and the KV cache's sizes.
struct Generation {
    st: Stretches,
    prefill: Seg,
    nodes: Vec<step::Node>,
    kv_prefill: f64,
    /// What the cache holds in memory while decoding.
    kv_decode: f64,
    /// What it reports at the end.
    kv_final: f64,
    /// Decode's last token: the whole cache, one layer's keys or values twice for a moment,
    /// one token's activations and fp32 logits.
    decode_extra: f64,
}

fn generation(s: &Scenario, a: &Architecture, record: bool) -> Generation {
    let ctx = Ctx::new(s, a, false);
    let st = if record {
        Stretches::traced(&ctx, tape::Mode::NoGrad, tape::Grads::New)
    } else {
        Stretches::new(&ctx, tape::Mode::NoGrad, tape::Grads::New)
    };
    let w = |phase, what| crate::mem::Where {
        phase,
        what,
        ..Default::default()
    };
    let src = |which| step::Src {
        which,
        fwd: true,
        grads: tape::Grads::New,
    };
    let mut nodes = Vec::new();
    let emb = st.emb.fwd.in_phase(Phase::PrefillEmbedding);
    let hold = Seg::alloc(
        Cat::Activations,
        st.embeds_hold,
        w(Phase::PrefillEmbedding, "model keeps inputs_embeds"),
    );
    let mut seg = emb.then(hold);
    if record {
        nodes.push(step::Node::Stretch {
            src: src(step::Which::Emb),
            one: emb,
            n: 1,
            index: 0,
        });
        nodes.push(step::Node::Frame(hold));
    }
    let mut from = 1u64;
    for (i, n) in a.runs(0, a.layers) {
        let phase = if st.kinds[i].moe {
            Phase::PrefillMoe
        } else {
            Phase::Prefill
        };
        let mut one = st.layers[i].fwd.repeat(n).in_phase(phase);
        one.at.index += (from - 1) as u32;
        seg = seg.then(one);
        if record {
            nodes.push(step::Node::Stretch {
                src: src(step::Which::Layer(i)),
                one: st.layers[i].fwd.in_phase(phase),
                n,
                index: from as u32,
            });
        }
        from += n;
    }
    // The last position's logits: what the head leaves is not carried into decode.
    let head = st.head.fwd.in_phase(Phase::PrefillHead);
    seg = seg.then(Seg {
        delta: Bytes::default(),
        ..head
    });
    if record {
        nodes.push(step::Node::Stretch {
            src: src(step::Which::Head),
            one: head,
            n: 1,
            index: 0,
        });
        nodes.push(step::Node::Frame(Seg {
            delta: Bytes::default().minus(head.delta),
            peak: Bytes::default(),
            at: w(Phase::PrefillHead, "generate() keeps the last token"),
        }));
    }
    let b = s.batch as f64;
    let c = ctx.c.bytes();
    let per_token = a.cache_elems_per_token_layer() as f64 * c * b;
    let kv_len = (s.seq + s.new_tokens.max(1) - 1) as f64;
    // What the cache reports at the end (transformers' tensor shapes: window − 1 tokens per
    // sliding layer, MLA's latent, linear layers' fixed state).
    let kv_final = a.kv_cache_bytes(b, kv_len, c);
    // What it holds in memory: after the prefill every attention layer's storage has all
    // `seq` tokens (a sliding layer keeps a view of the last window − 1 of them); once
    // decoding, a sliding or chunked layer's storage is one window, re-made at each step.
    let state = a.linear_state_bytes(b, c);
    let window = |t: AttnType| match t {
        AttnType::Sliding => a.sliding_window,
        AttnType::Chunked => a.chunk,
        _ => None,
    };
    let (mut kv_prefill, mut kv_decode) = (0.0, 0.0);
    for l in 0..a.layers {
        match a.attn_type(l) {
            AttnType::Linear => {
                kv_prefill += state;
                kv_decode += state;
            }
            t => {
                kv_prefill += ctx.t * per_token / b;
                let n = window(t).map_or(kv_len, |w| kv_len.min(w as f64));
                kv_decode += n * per_token;
            }
        }
    }
    // Decode's last step: the cache grows by concatenation (a layer's keys or values exist
    // twice for a moment) during the forward, and after it come the last position's logits
    // and their fp32 copy (`next_token_logits`); the step before's copy is alive throughout,
    // until the loop reassigns it (the oracle's generate(): tests/data/oracle/generate.jsonl).
    let per_layer = kv_len * per_token / 2.0;
    let scores = b * a.vocab as f64 * 4.0;
    Generation {
        prefill: seg,
        nodes,
        kv_prefill,
        kv_decode,
        kv_final,
        decode_extra: scores + per_layer.max(b * (a.vocab as f64) * c + scores),
        st,
    }
}

/// generate(): prefill under no_grad with the KV cache filling, then decode steps.
fn inference(
    s: &Scenario,
    a: &Architecture,
    weights: f64,
    tl: &mut Vec<Point>,
) -> (f64, String, f64, Bytes) {
    let g = generation(s, a, false);
    tl.push(Point {
        phase: "weights".into(),
        bytes: weights as u64,
    });
    let r_peak = g.prefill.peak;
    let r_phase = g.prefill.at.words();
    let (kv_prefill, kv_decode, kv_final) = (g.kv_prefill, g.kv_decode, g.kv_final);
    tl.push(Point {
        phase: "after prefill (KV cache filled)".into(),
        bytes: (weights + kv_prefill).round() as u64,
    });
    let decode = kv_decode + g.decode_extra;
    let mut at_peak = r_peak;
    let mut phase = r_phase;
    // Prefill's bytes include the cache; report the cache separately.
    let prefill_peak = r_peak.total();
    // The first new token comes from the prefill's logits: a forward of decode runs only
    // from the second on (with one new token, the sliding layers keep the prefill's storage
    // to the end).
    let decodes = s.new_tokens > 1;
    let peak = if decodes && decode > prefill_peak {
        phase = "decode: last token".into();
        at_peak = Bytes::of(Cat::Temporaries, g.decode_extra);
        decode
    } else {
        prefill_peak
    };
    tl.push(Point {
        phase: "end of generation".into(),
        bytes: (weights + if decodes { kv_decode } else { kv_prefill }).round() as u64,
    });
    (weights + peak, phase, kv_final, at_peak)
}

/// generate() recorded: the prefill's nodes, then decode's last token in closed form.
fn inference_recorded(
    s: &Scenario,
    a: &Architecture,
    weights: f64,
) -> (Stretches, Vec<step::Node>, Vec<(Bytes, crate::mem::Where)>) {
    let g = generation(s, a, true);
    let mut tail = Vec::new();
    if s.new_tokens > 1 {
        let mut b = Bytes::of(Cat::Weights, weights);
        b.add(Cat::KvCache, g.kv_decode);
        b.add(Cat::Temporaries, g.decode_extra);
        tail.push((
            b,
            crate::mem::Where {
                phase: Phase::Decode,
                what: "decode: the cache grows by one token",
                ..Default::default()
            },
        ));
    }
    (g.st, g.nodes, tail)
}

/// A step as the engine composed it, recorded for the op-level timeline
/// ([`crate::timeline`]): what stays resident through it, the stretches (with their events)
/// and the composition, and the points the engine computes in closed form after it (an
/// inference's decode).
pub(crate) struct Recorded {
    pub resident: Bytes,
    pub nodes: Vec<step::Node>,
    pub first: Stretches,
    pub later: Option<Stretches>,
    /// Absolute bytes and where, after the recorded step.
    pub tail: Vec<(Bytes, crate::mem::Where)>,
}

/// The step of `s` recorded, as [`estimate`] composes it. Refused where there is no step
/// to replay (a bare parameter count) or where it is not one program (pipeline stages).
pub(crate) fn recorded(s: &Scenario) -> Result<Recorded> {
    let a = match &s.model {
        Model::Arch { arch, .. } => arch,
        Model::Params(_) => {
            return Err(Error::new(
                "model",
                "a bare parameter count has no step to replay: name a model or give its config",
            ))
        }
    };
    let par = &s.parallel;
    let ws = Bytes::of(Cat::Workspaces, crate::gpu::cublas_workspaces(s) as f64);
    if estimate_pytorch_dp(s, "", a).is_some() {
        if par.pp > 1 {
            return Err(Error::new(
                "parallel.pp",
                "the op-level timeline follows one GPU through a step that holds the whole model; a pipeline's stages are shown stage by stage in the 5D panel",
            ));
        }
        let pr = prepare_with(s, a, true);
        let st = rank_step(s, &pr, 0, None, f64::INFINITY, true, &mut Vec::new());
        let Prepared { first, later, .. } = pr;
        return Ok(Recorded {
            resident: st.base.plus(ws),
            nodes: st.prog.rec.unwrap_or_default(),
            first,
            later,
            tail: Vec::new(),
        });
    }
    if s.mode == Mode::Train && (par.model_parallel() || par.framework == Framework::Megatron) {
        return Err(unsupported_layout(s));
    }
    let states = ModelStates::new(s, Some(a));
    let dp = &DpStates::new(s, &s.parallel, &states, Geo::data_parallel(s, Some(a)));
    let mut resident = Bytes::of(Cat::Weights, dp.weights + dp.fixed);
    if s.mode == Mode::Train {
        resident.add(Cat::Master, dp.master);
        resident.add(Cat::Optimizer, dp.optim);
        resident.add(Cat::Gradients, dp.grad_acc);
        resident.add(Cat::WeightCopies, dp.gathered);
        resident.add(Cat::Temporaries, dp.buckets);
        let t = train_program(s, a, dp.grads, states.grads, true, false);
        return Ok(Recorded {
            resident: resident.plus(ws),
            nodes: t.prog.rec.unwrap_or_default(),
            first: t.first,
            later: t.later,
            tail: Vec::new(),
        });
    }
    let (first, nodes, tail) = inference_recorded(s, a, dp.weights);
    Ok(Recorded {
        resident: Bytes::of(Cat::Weights, dp.weights).plus(ws),
        nodes,
        first,
        later: None,
        tail: tail.into_iter().map(|(b, at)| (b.plus(ws), at)).collect(),
    })
}
