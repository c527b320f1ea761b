//! The allocations and frees of a whole run, in order and with identities, built from the
//! engine's stretches, and replayed through [`Allocator`].
//!
//! Each stretch (the embedding, each kind of decoder layer, the LM head, the loss) is
//! replayed once on its [`Tape`](crate::tape::Tape) with a trace; [`Script`] keeps its events
//! with the identity of what they allocate or free, local to the stretch. A run then plays
//! the scripts as measure.py's process ran (tests/data/README.md): the model built on the
//! device parameter by parameter, the input ids, and training steps of forward, backward,
//! `optimizer.step()`, `zero_grad(set_to_none=True)` and `del out`, the first step making the
//! optimizer's states. Each layer's instance links to its neighbours: its input is the
//! previous stretch's output, the gradient it receives is the one the next stretch's
//! backward made for its input.

use super::{Allocator, Config, Oom, Stats};
use crate::mem::{Event, Local};

/// What an event of a script does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Alloc,
    Free,
    /// A free at the end of the forward of what the model's code held ("held input").
    Held,
    /// A free at the end of the embedding's forward of what a local of the model's forward
    /// holds to its end ("model local": the eager attention mask).
    Local,
    /// A workspace: allocated and freed while one op runs.
    Temp,
    /// Parameter gradients left in `.grad` (freed by `zero_grad`); `id` is the op.
    ParamGrad,
    /// A tied weight's earlier `.grad` (the LM head's), freed when the embedding's gradient
    /// is summed with it into a new one.
    FreeTied,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ev {
    pub bytes: u64,
    /// Index into the stretch's table of live handles (storages, then gradient buffers).
    pub id: u32,
    pub kind: Kind,
}

const NIL: u32 = u32::MAX;

/// One stretch's events, forward then backward, with what links it to its neighbours.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Script {
    pub ev: Vec<Ev>,
    /// Index of the first backward event (`ev.len()` when there is no backward).
    pub bwd: usize,
    /// Size of the table of handles an instance needs.
    pub n: u32,
    /// The stretch's input (the previous stretch's output).
    pub input: Option<u32>,
    pub output: u32,
    pub out_bytes: u64,
    /// The output's gradient, which the backward starts from.
    pub grad_out: Option<u32>,
    /// The gradient the backward leaves for the input (the previous stretch's `grad_out`).
    pub grad_in: Option<u32>,
    /// Autocast's weight copies that only its cache holds at the end of the forward.
    pub cached: Vec<u32>,
    /// Tensors the caller keeps (`out.logits`, the KV cache).
    pub kept: Vec<u32>,
    /// The forward's first matmul: the first event that allocates the output of a named
    /// module (a linear layer); the backward's: its first allocation.
    pub first_matmul: Option<usize>,
    pub first_bwd_alloc: Option<usize>,
}

impl Script {
    /// From a tape's trace ([`Tape::replay`](crate::tape::Tape::replay)).
    pub(crate) fn new(trace: &[Event]) -> Script {
        let mut nstor = 0u32;
        let mut ngrad = 0u32;
        for e in trace {
            match e.id {
                Local::Storage(s) => nstor = nstor.max(s + 1),
                Local::Grad(g) => ngrad = ngrad.max(g + 1),
                _ => {}
            }
        }
        let idx = |l: Local| -> u32 {
            match l {
                Local::Storage(s) => s,
                Local::Grad(g) => nstor + g,
                Local::ParamGrad(i) => i,
                Local::Temp => 0,
            }
        };
        let mut sc = Script {
            n: nstor + ngrad,
            output: NIL,
            ..Script::default()
        };
        let mut bwd = None;
        let mut skip_free_temp = false;
        for e in trace {
            let id = idx(e.id);
            if e.bytes == 0.0 {
                match e.role {
                    "input" if sc.input.is_none() => sc.input = Some(id),
                    "output" => sc.output = id,
                    "autocast cache" => sc.cached.push(id),
                    "kept" => sc.kept.push(id),
                    "grad of output" => sc.grad_out = Some(id),
                    "grad of input" if sc.grad_in.is_none() => sc.grad_in = Some(id),
                    "" if e.at.what == "backward" => bwd = Some(sc.ev.len()),
                    _ => {}
                }
                continue;
            }
            let bytes = e.bytes.abs().round() as u64;
            let kind = match (e.id, e.bytes > 0.0) {
                (Local::Temp, true) => {
                    skip_free_temp = true;
                    Kind::Temp
                }
                (Local::Temp, false) if skip_free_temp => {
                    skip_free_temp = false;
                    continue;
                }
                (Local::ParamGrad(_), false) => Kind::FreeTied,
                (Local::ParamGrad(_), true) => Kind::ParamGrad,
                (_, true) => Kind::Alloc,
                (_, false) if e.role == "held input" => Kind::Held,
                (_, false) if e.role == "model local" => Kind::Local,
                (_, false) => Kind::Free,
            };
            if kind == Kind::Alloc && id == sc.output && bwd.is_none() && sc.out_bytes == 0 {
                sc.out_bytes = bytes;
            }
            if kind == Kind::Alloc && bwd.is_none() && sc.first_matmul.is_none() && e.named {
                sc.first_matmul = Some(sc.ev.len());
            }
            if matches!(kind, Kind::Alloc | Kind::ParamGrad)
                && bwd.is_some()
                && sc.first_bwd_alloc.is_none()
            {
                sc.first_bwd_alloc = Some(sc.ev.len());
            }
            sc.ev.push(Ev { bytes, id, kind });
        }
        sc.bwd = bwd.unwrap_or(sc.ev.len());
        // A tensor freed by the very next event is a workspace: allocating and freeing it
        // changes nothing but the peak (`Allocator::transient`).
        let n = sc.ev.len();
        let mut pair = vec![false; n];
        let mut j = 0;
        while j + 1 < n {
            let (e, f) = (sc.ev[j], sc.ev[j + 1]);
            if e.kind == Kind::Alloc
                && j + 1 != sc.bwd
                && matches!(f.kind, Kind::Free | Kind::Held)
                && f.id == e.id
                && Some(j) != sc.first_matmul
                && Some(j) != sc.first_bwd_alloc
            {
                pair[j] = true;
                j += 2;
            } else {
                j += 1;
            }
        }
        // Where each old event lands.
        let mut to = vec![0usize; n + 1];
        let mut out: Vec<Ev> = Vec::with_capacity(n);
        let mut j = 0;
        while j < n {
            to[j] = out.len();
            if pair[j] {
                out.push(Ev {
                    kind: Kind::Temp,
                    ..sc.ev[j]
                });
                to[j + 1] = out.len();
                j += 2;
            } else {
                out.push(sc.ev[j]);
                j += 1;
            }
        }
        to[n] = out.len();
        sc.first_matmul = sc.first_matmul.map(|x| to[x]);
        sc.first_bwd_alloc = sc.first_bwd_alloc.map(|x| to[x]);
        sc.bwd = to[sc.bwd];
        sc.ev = out;
        sc
    }

    fn fwd(&self) -> &[Ev] {
        &self.ev[..self.bwd]
    }

    fn bwd(&self) -> &[Ev] {
        &self.ev[self.bwd..]
    }
}

/// What a run allocates besides its stretches.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Each parameter's bytes, in the order the model creates them.
    pub params: Vec<u64>,
    /// A tied LM head: transformers creates the head's weight, then ties it to the
    /// embedding, which frees it (bytes; 0 when untied).
    pub tied_head: u64,
    /// The input ids (`int64`).
    pub ids: u64,
    /// What the first `optimizer.step()` allocates, in order (its states), each with the
    /// stretch whose parameters it belongs to (its index in the run's sequence).
    pub states: Vec<(u64, usize)>,
    /// The stretch each parameter belongs to.
    pub owners: Vec<usize>,
    /// A workspace each `optimizer.step()` allocates and frees.
    pub opt_temp: u64,
    /// cuBLAS's workspace, allocated through the caching allocator at the first matmul of
    /// each thread that runs one: the forward's and autograd's backward thread.
    pub workspace: u64,
    /// Training steps (the last one is measured).
    pub steps: u32,
    /// Micro-batches per step (gradient accumulation).
    pub micro_batches: u64,
    /// The model keeps the embedding's output referenced to the end of its forward.
    pub embeds_hold: bool,
}

/// What the replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Layers replayed (the model's, or fewer: see [`replay_train`]).
    pub layers: u64,
    /// Bytes the last replayed period of layers made the allocator reserve, per layer, and
    /// the layers the run's figures were extrapolated by (0: none).
    pub per_layer: u64,
    pub extrapolated: u64,
    /// cuBLAS workspaces taken (bytes).
    pub workspaces: u64,
    /// At the end of the run; peaks over the last step.
    pub stats: Stats,
    /// At the last step's allocated peak: (reserved, allocated, largest free block).
    pub at_peak: (u64, u64, u64),
    /// The allocation the device could not hold, if any.
    pub oom: Option<Oom>,
}

/// One stretch of the model as a run plays it.
struct Inst<'s> {
    sc: &'s Script,
    base: usize,
}

/// The stretches a run plays, in model order (embedding, layers, head, loss): the first
/// micro-batch's, and under gradient accumulation the later ones', whose backwards add
/// into the gradients the first made (each computed one freed once added).
struct Seq<'s> {
    first: Vec<&'s Script>,
    later: Option<Vec<&'s Script>>,
}

/// A training run (single GPU).
fn run_one(r: &mut Runner, seq: &Seq<'_>, plan: &Plan) -> Outcome {
    match r.train(seq, plan) {
        Ok(()) => r.outcome(None),
        Err(e) => {
            // Out of memory: what the cache held when the request failed.
            let s = r.a.stats();
            r.at_peak = (s.reserved, s.allocated, r.a.largest_free());
            if r.snap_at.is_some() {
                r.snapshot = r.a.segments();
            }
            r.outcome(Some(e))
        }
    }
}

struct Runner {
    a: Allocator,
    /// The stretch (index in the sequence) whose events run now, and the reserved bytes
    /// each stretch's events made the allocator take from CUDA (the last entry: the rest).
    owner: usize,
    growth: Vec<u64>,
    last: bool,
    at_peak: (u64, u64, u64),
    best: u64,
    /// cuBLAS workspaces taken so far (they stay for the process's life).
    workspaces: u8,
    /// Allocations counted (workspaces of ops included), the count at the measured step's
    /// allocated peak, and, when asked for, the segments when the count reaches `snap_at`.
    count: u64,
    peak_at: u64,
    snap_at: Option<u64>,
    snapshot: Vec<super::Segment>,
    /// Which handles are allocated, and the workspaces' (kept when a run ends).
    live: Vec<bool>,
    ws_bytes: u64,
    kept_ws: Vec<u32>,
    /// When asked for: every event as text (`a ID BYTES`, `f ID`, `# phase`), with ids
    /// numbered in allocation order.
    log: Option<(Vec<String>, Vec<u32>, u32)>,
}

impl Runner {
    /// Whether events are written as text ([`events`]); never in the browser, where the
    /// text's formatting would only weigh on the wasm.
    #[cfg(not(target_arch = "wasm32"))]
    fn logging(&self) -> bool {
        self.log.is_some()
    }
    #[cfg(target_arch = "wasm32")]
    fn logging(&self) -> bool {
        false
    }

    /// The end of a run in a process that goes on (measure.py's `del model, opt, ids` and
    /// `torch.cuda.empty_cache()`): only the workspaces stay.
    fn end_run(&mut self) {
        for h in 0..self.live.len() as u32 {
            if self.live[h as usize] && !self.kept_ws.contains(&h) {
                self.free(h);
            }
        }
        self.a.release_cached();
        self.last = false;
        self.growth.clear();
    }

    fn new(cfg: Config) -> Self {
        Runner {
            a: Allocator::new(cfg),
            owner: 0,
            growth: Vec::new(),
            workspaces: 0,
            count: 0,
            peak_at: 0,
            snap_at: None,
            snapshot: Vec::new(),
            live: Vec::new(),
            ws_bytes: 0,
            kept_ws: Vec::new(),
            last: false,
            at_peak: (0, 0, 0),
            best: 0,
            log: None,
        }
    }

    fn outcome(&self, oom: Option<Oom>) -> Outcome {
        Outcome {
            layers: 0,
            per_layer: 0,
            extrapolated: 0,
            workspaces: self.kept_ws.len() as u64 * self.ws_bytes,
            stats: self.a.stats(),
            at_peak: self.at_peak,
            oom,
        }
    }

    fn note(&mut self, what: &str) {
        if !self.logging() {
            return;
        }
        if let Some((l, _, _)) = self.log.as_mut() {
            l.push(format!("# {what}"));
        }
    }

    fn grew(&mut self, before: u64) {
        let after = self.a.reserved();
        if after > before {
            if self.growth.len() <= self.owner {
                self.growth.resize(self.owner + 1, 0);
            }
            self.growth[self.owner] += after - before;
        }
    }

    #[inline(always)]
    fn malloc(&mut self, bytes: u64) -> Result<u32, Oom> {
        let before = self.a.reserved();
        let h = self.a.malloc(bytes)?;
        if self.a.reserved() != before {
            self.grew(before);
        }
        if self.live.len() <= h as usize {
            self.live.resize(h as usize + 1, false);
        }
        self.live[h as usize] = true;
        if !self.logging() {
        } else if let Some((l, ids, next)) = self.log.as_mut() {
            if ids.len() <= h as usize {
                ids.resize(h as usize + 1, 0);
            }
            ids[h as usize] = *next;
            l.push(format!("a {next} {bytes}"));
            *next += 1;
        }
        self.track();
        Ok(h)
    }

    /// The allocation just logged is a cuBLAS workspace (`a ID BYTES workspace`), which
    /// stays for the process's life.
    fn mark_workspace(&mut self) {
        if !self.logging() {
        } else if let Some(l) = self.log.as_mut().and_then(|x| x.0.last_mut()) {
            l.push_str(" workspace");
        }
    }

    /// In the measured step, the state at each new high of allocated memory.
    #[inline(always)]
    fn track(&mut self) {
        self.count += 1;
        if self.last && self.a.peak_allocated() > self.best {
            let s = self.a.stats();
            {
                self.best = s.peak_allocated;
                self.peak_at = self.count;
                self.at_peak = (s.reserved, s.peak_allocated, self.a.largest_free());
            }
        }
        if self.snap_at == Some(self.count) {
            self.snapshot = self.a.segments();
        }
    }

    /// An op's workspace.
    fn temp(&mut self, bytes: u64) -> Result<(), Oom> {
        // A workspace a cached block holds moves only the peak, unless it makes the measured
        // step's new high (the cache at the peak is then the one that holds it), or the
        // events are written out or a snapshot is due: then it is allocated and freed, as
        // one that needs new memory is.
        let quiet = !self.logging() && self.snap_at.is_none();
        match self.a.held_with(bytes) {
            Some(now) if quiet && !(self.last && now > self.best) => {
                self.a.reach(now);
                self.track();
            }
            _ => {
                let h = self.malloc(bytes)?;
                self.free(h);
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn free(&mut self, h: u32) {
        if h != NIL {
            if !self.logging() {
            } else if let Some((l, ids, _)) = self.log.as_mut() {
                l.push(format!("f {}", ids[h as usize]));
            }
            self.live[h as usize] = false;
            self.a.free(h);
        }
    }

    fn train<'s>(&mut self, run: &Seq<'s>, plan: &Plan) -> Result<(), Oom> {
        self.ws_bytes = plan.workspace;
        self.note("load");
        let other = run.first.len();
        let mut params = Vec::with_capacity(plan.params.len());
        for (i, &b) in plan.params.iter().enumerate() {
            self.owner = plan.owners.get(i).copied().unwrap_or(other);
            params.push(self.malloc(b)?);
        }
        self.owner = other;
        if plan.tied_head > 0 {
            let h = self.malloc(plan.tied_head)?;
            self.free(h);
        }
        self.note("ids");
        let ids = self.malloc(plan.ids)?;
        let place = |seq: &[&'s Script]| -> (Vec<Inst<'s>>, usize) {
            let mut n = 0usize;
            let insts = seq
                .iter()
                .map(|&sc| {
                    let it = Inst { sc, base: n };
                    n += sc.n as usize;
                    it
                })
                .collect();
            (insts, n)
        };
        let (first, n1) = place(&run.first);
        let (later, n2) = run.later.as_deref().map_or((Vec::new(), 0), place);
        let mut tbl = vec![NIL; n1.max(n2)];
        let mut grads: Vec<(usize, u32, u32)> = Vec::new();
        // A later micro-batch's gradient of a tied LM head, until the embedding's backward
        // adds it to its own.
        let mut tied: Vec<u32> = Vec::new();
        let mut leftovers: Vec<u32> = Vec::new();
        let mut deferred: Vec<u32> = Vec::new();
        let mut locals: Vec<u32> = Vec::new();
        let mut states: Vec<u32> = Vec::new();
        let last_inst = first.len().saturating_sub(1);
        for step in 0..plan.steps {
            if step + 1 == plan.steps {
                self.a.reset_peaks();
                self.last = true;
                self.best = 0;
            }
            let mut kept: Vec<u32> = Vec::new();
            // Where each micro-batch starts: once one starts as the one before it did, the
            // rest repeat it exactly, peaks included, and are skipped (gradient
            // accumulation over thousands of micro-batches costs two or three). Not when
            // the events are written out, to compare with PyTorch's traces; a snapshot's
            // second pass skips as its first did, so that the event counts agree.
            let mut start = None;
            for mb in 0..plan.micro_batches.max(1) {
                let insts = if mb > 0 && !later.is_empty() {
                    &later
                } else {
                    &first
                };
                if mb > 0 && !self.logging() {
                    let now = self.a.state(&kept);
                    if start.as_ref() == Some(&now) {
                        break;
                    }
                    start = Some(now);
                }
                // `del out` of the previous micro-batch happens when `out` is reassigned.
                for h in kept.drain(..) {
                    self.free(h);
                }
                tbl.iter_mut().for_each(|x| *x = NIL);
                if self.logging() {
                    self.note(&format!("step {step} forward"));
                }
                // Forward.
                let mut prev = ids;
                for (k, it) in insts.iter().enumerate() {
                    let sc = it.sc;
                    self.owner = k;
                    if k + 2 == insts.len() {
                        // The model's forward returns before its head: what it held goes.
                        for h in std::mem::take(&mut deferred) {
                            self.free(h);
                        }
                        for h in std::mem::take(&mut locals) {
                            self.free(h);
                        }
                    }
                    if let Some(i) = sc.input {
                        tbl[it.base + i as usize] = prev;
                    }
                    for (j, e) in sc.fwd().iter().enumerate() {
                        let slot = it.base + e.id as usize;
                        match e.kind {
                            Kind::Alloc => tbl[slot] = self.malloc(e.bytes)?,
                            Kind::Temp => self.temp(e.bytes)?,
                            Kind::Local => {
                                locals.push(tbl[slot]);
                                tbl[slot] = NIL;
                            }
                            Kind::Free | Kind::Held => {
                                let is_input = sc.input == Some(e.id);
                                if k == 0 && is_input {
                                    // The ids stay (the caller's tensor).
                                    continue;
                                }
                                let hold = plan.embeds_hold
                                    && e.kind == Kind::Held
                                    && ((k == 0) || (k == 1 && is_input && deferred.is_empty()));
                                if hold {
                                    deferred.push(tbl[slot]);
                                } else {
                                    self.free(tbl[slot]);
                                }
                                tbl[slot] = NIL;
                            }
                            Kind::ParamGrad | Kind::FreeTied => {}
                        }
                        // cuBLAS takes its workspace at the first matmul, after the op's
                        // output.
                        if k == 1
                            && self.workspaces == 0
                            && plan.workspace > 0
                            && sc.first_matmul == Some(j)
                        {
                            self.workspaces = 1;
                            self.owner = other;
                            let h = self.malloc(plan.workspace)?;
                            self.kept_ws.push(h);
                            self.mark_workspace();
                            self.owner = k;
                        }
                    }
                    prev = tbl[it.base + sc.output as usize];
                    if k + 1 < insts.len() {
                        // The next stretch owns it now.
                        tbl[it.base + sc.output as usize] = NIL;
                    }
                }
                // The model's forward returns: what it held goes, and autocast's cache.
                for h in deferred.drain(..).chain(locals.drain(..)) {
                    self.free(h);
                }
                for it in insts {
                    for &c in &it.sc.cached {
                        let slot = it.base + c as usize;
                        self.free(tbl[slot]);
                        tbl[slot] = NIL;
                    }
                }
                // `out` keeps the logits and the loss.
                let lt = &insts[last_inst];
                for &c in &lt.sc.kept {
                    kept.push(tbl[lt.base + c as usize]);
                    tbl[lt.base + c as usize] = NIL;
                }
                kept.push(tbl[lt.base + lt.sc.output as usize]);
                tbl[lt.base + lt.sc.output as usize] = NIL;
                if self.logging() {
                    self.note(&format!("step {step} backward"));
                }
                // Backward: `loss.backward()` starts from a gradient of ones.
                let mut incoming = NIL;
                for (k, it) in insts.iter().enumerate().rev() {
                    let sc = it.sc;
                    self.owner = k;
                    if let Some(g) = sc.grad_out {
                        tbl[it.base + g as usize] = if k == last_inst {
                            self.malloc(sc.out_bytes.max(1))?
                        } else {
                            incoming
                        };
                    }
                    for (j, e) in sc.bwd().iter().enumerate() {
                        let slot = it.base + e.id as usize;
                        match e.kind {
                            Kind::Alloc => tbl[slot] = self.malloc(e.bytes)?,
                            Kind::Temp => self.temp(e.bytes)?,
                            Kind::Free | Kind::Held | Kind::Local => {
                                if k == 0 && sc.input == Some(e.id) {
                                    continue;
                                }
                                self.free(tbl[slot]);
                                tbl[slot] = NIL;
                            }
                            Kind::ParamGrad if mb > 0 => {
                                let h = self.malloc(e.bytes)?;
                                tied.push(h);
                            }
                            Kind::ParamGrad => {
                                let h = self.malloc(e.bytes)?;
                                grads.push((k, e.id, h));
                            }
                            Kind::FreeTied if mb > 0 => {
                                if let Some(h) = tied.pop() {
                                    self.free(h);
                                }
                            }
                            Kind::FreeTied => {
                                // The LM head's weight gradient: the first its stretch's
                                // backward made.
                                let head = last_inst.saturating_sub(1);
                                if let Some(p) = grads.iter().position(|g| g.0 == head) {
                                    let (_, _, h) = grads.remove(p);
                                    self.free(h);
                                }
                            }
                        }
                        // Autograd's backward thread has its own cuBLAS handle, and
                        // workspace, from its first matmul (the LM head's).
                        if k + 1 == last_inst
                            && self.workspaces == 1
                            && plan.workspace > 0
                            && sc.first_bwd_alloc == Some(sc.bwd + j)
                        {
                            self.workspaces = 2;
                            self.owner = other;
                            let h = self.malloc(plan.workspace)?;
                            self.kept_ws.push(h);
                            self.mark_workspace();
                            self.owner = k;
                        }
                    }
                    incoming = match sc.grad_in {
                        Some(g) => std::mem::replace(&mut tbl[it.base + g as usize], NIL),
                        None => NIL,
                    };
                    // What the stretch's replay leaves behind (a recomputation's weight
                    // copies) goes with it.
                    let input = sc.input.map(|i| it.base + i as usize);
                    let end = it.base + sc.n as usize;
                    for (j, slot) in tbl.iter_mut().enumerate().take(end).skip(it.base) {
                        if *slot != NIL && Some(j) != input {
                            leftovers.push(std::mem::replace(slot, NIL));
                        }
                    }
                    for h in leftovers.drain(..) {
                        self.free(h);
                    }
                    if k > 0 {
                        if let Some(i) = input {
                            tbl[i] = NIL;
                        }
                    }
                }
                self.free(incoming);
                let _ = mb;
            }
            if self.logging() {
                self.note(&format!("step {step} optimizer"));
            }
            // optimizer.step(): the first makes the states.
            if step == 0 {
                for &(b, o) in &plan.states {
                    self.owner = o;
                    states.push(self.malloc(b)?);
                }
            }
            self.owner = other;
            if plan.opt_temp > 0 {
                self.temp(plan.opt_temp)?;
            }
            if self.logging() {
                self.note(&format!("step {step} zero_grad"));
            }
            // zero_grad(set_to_none=True): parameter order.
            // The backward made them from the last stretch and op down: the reverse order is
            // the parameters'.
            for (_, _, h) in grads.drain(..).rev() {
                self.free(h);
            }
            // del out.
            for h in kept.drain(..) {
                self.free(h);
            }
        }
        let _ = (params, states, ids);
        Ok(())
    }
}

/// cuBLAS's workspace per (handle, stream), which PyTorch allocates through its caching
/// allocator: `CUBLAS_WORKSPACE_CONFIG`'s default, `:4096:8` (32 MiB) on compute capability
/// 9.0 and later, `:4096:2:16:8` (8 MiB + 128 KiB) before (`parseChosenWorkspaceSize` in
/// aten/src/ATen/cuda/CublasHandlePool.cpp). GPUs the catalogue does not know are taken
/// to be recent.
pub fn cublas_workspace(gpu: &str) -> u64 {
    let older = ["A100", "L4", "RTX-3090", "RTX-4090", "V100"];
    if older.iter().any(|g| gpu.starts_with(g)) {
        4096 * 1024 * 2 + 16 * 1024 * 8
    } else {
        4096 * 8 * 1024
    }
}

/// The optimizer's allocations at its first step, per parameter tensor of `n` elements
/// (`rows × cols`), in the order PyTorch makes them.
fn states(s: &crate::Scenario, rows: u64, cols: u64, out: &mut Vec<(u64, usize)>) {
    use crate::precision::Optimizer;
    let mut push = |b: u64| out.push((b, 0));
    let n = rows * cols;
    let st = s.precision.optimizer.bytes();
    match s.optimizer {
        Optimizer::Sgd => {}
        // `momentum_buffer = torch.clone(grad)`.
        Optimizer::SgdMomentum => push((n as f64 * s.precision.grads.bytes()) as u64),
        // Fused AdamW (`_init_group`): `step` (an fp32 scalar on the device), `exp_avg`,
        // `exp_avg_sq`.
        Optimizer::Adam => {
            push(4);
            push((n as f64 * st) as u64);
            push((n as f64 * st) as u64);
        }
        // torch.optim.Adafactor: `step`, then the row and column variances of a matrix or
        // the whole variance of a vector.
        Optimizer::Adafactor => {
            push(4);
            if cols > 1 {
                push((rows as f64 * st) as u64);
                push((cols as f64 * st) as u64);
            } else {
                push((n as f64 * st) as u64);
            }
        }
        // bitsandbytes `Optimizer2State.init_state`: two uint8 states and their fp32
        // absmax per block of 256 from `min_8bit_size` (4096) elements, two fp32 states
        // below it; a paged optimizer's uint8 states of 100,000 elements and more are in
        // CUDA managed memory, not here.
        Optimizer::Adam8bit | Optimizer::PagedAdam8bit => {
            let paged = s.optimizer.managed_bytes(rows, cols) > 0.0;
            if n >= 4096 {
                let absmax = n.div_ceil(256) * 4;
                if !paged {
                    push(n);
                    push(n);
                }
                push(absmax);
                push(absmax);
            } else {
                push(n * 4);
                push(n * 4);
            }
        }
    }
}

/// Whether the replay covers `s`: one GPU running PyTorch (no DeepSpeed, no offload),
/// full fine-tuning of a model whose architecture is known, the allocator not turned off.
pub(crate) fn covers(s: &crate::Scenario) -> bool {
    use crate::scenario::{Finetune, Framework, Mode};
    let par = &s.parallel;
    s.allocator.replay
        && s.mode == Mode::Train
        && par.gpus() == 1
        && par.framework != Framework::DeepSpeed
        && !par.offload_optimizer
        && !par.offload_params
        && matches!(s.finetune, Finetune::Full)
        && s.precision.weights.is_float_compute()
}

/// A training run of `s` (three steps, as measured) replayed through the caching allocator:
/// its stretches as the first micro-batch plays them and, under gradient accumulation, as
/// the later ones do (`later`, [`Grads::Accumulate`](crate::tape::Grads::Accumulate)).
pub(crate) fn replay_train(
    s: &crate::Scenario,
    a: &crate::arch::Architecture,
    st: &crate::step::Stretches,
    later: Option<&crate::step::Stretches>,
    embeds_hold: bool,
) -> Option<Outcome> {
    replay_train_logged(s, a, (st, later), embeds_hold, false).map(|x| x.0)
}

/// The stretches of a run, with their scripts: the first micro-batch's, and the later
/// ones' under gradient accumulation.
type Run = (crate::step::Stretches, Option<crate::step::Stretches>);

/// The architecture of `s` and its stretches replayed with their scripts; `None` where the
/// replay does not cover `s`.
fn scripted(s: &crate::Scenario) -> Option<(&crate::arch::Architecture, Run)> {
    let crate::scenario::Model::Arch { arch, .. } = &s.model else {
        return None;
    };
    if !covers(s) {
        return None;
    }
    let ctx = crate::graph::Ctx::new(s, arch, true);
    let mode = if s.recompute == crate::scenario::Recompute::Full {
        crate::tape::Mode::Checkpointed
    } else {
        crate::tape::Mode::Normal
    };
    let make = |g| crate::step::Stretches::scripted(&ctx, mode, g);
    let later = (s.parallel.grad_accum > 1).then(|| make(crate::tape::Grads::Accumulate));
    Some((arch, (make(crate::tape::Grads::New), later)))
}

/// The events of the training run of `s` that [`crate::estimate`] replays, as text: `a ID
/// BYTES` (allocated), `f ID` (freed), `# PHASE` (load, ids, step N forward …), the format
/// of `tools/alloc/trace.py`'s traces of PyTorch's own runs, to compare the two; and the
/// outcome of replaying them one by one (an op's workspace allocated and freed, not
/// elided).
pub fn events(s: &crate::Scenario) -> Option<(Outcome, Vec<String>)> {
    let (arch, (st, later)) = scripted(s)?;
    replay_train_logged(s, arch, (&st, later.as_ref()), st.embeds_held, true)
}

fn replay_train_logged(
    s: &crate::Scenario,
    a: &crate::arch::Architecture,
    st: (&crate::step::Stretches, Option<&crate::step::Stretches>),
    embeds_hold: bool,
    log: bool,
) -> Option<(Outcome, Vec<String>)> {
    let (seq, plan, keep, total) = prepare(s, a, st, embeds_hold)?;
    let mut r = Runner::new(config(s));
    if log {
        r.log = Some((Vec::new(), Vec::new(), 0));
    }
    let mut out = run_one(&mut r, &seq, &plan);
    let text = r.log.take().map(|l| l.0).unwrap_or_default();
    extrapolate(&mut out, &r.growth, keep, total);
    Some((out, text))
}

/// The allocator's settings for `s`: the default ones, on the scenario's device less what
/// CUDA itself holds.
fn config(s: &crate::Scenario) -> Config {
    Config {
        expandable: s.allocator.expandable,
        max_split: s.allocator.max_split_mb.map_or(u64::MAX, |m| m << 20),
        device: s
            .capacity_bytes
            .saturating_sub(crate::gpu::CUDA_CONTEXT_BYTES),
    }
}

/// The sequence of stretches and the plan of a training run of `s`, the layers replayed
/// and the model's.
fn prepare<'s>(
    s: &crate::Scenario,
    a: &crate::arch::Architecture,
    (st, later): (
        &'s crate::step::Stretches,
        Option<&'s crate::step::Stretches>,
    ),
    embeds_hold: bool,
) -> Option<(Seq<'s>, Plan, usize, usize)> {
    let p = &s.precision;
    let wb = p.weights.bytes();
    let kinds: Vec<Vec<crate::params::PTensor>> = a
        .kinds()
        .into_iter()
        .map(|k| crate::params::layer(a, k))
        .collect();
    // The layers replayed: all of them, or the first `MAX_LAYERS`.
    let order: Vec<usize> = a
        .runs(0, a.layers)
        .into_iter()
        .flat_map(|(i, n)| std::iter::repeat_n(i, n as usize))
        .collect();
    let keep = MAX_LAYERS.min(order.len());
    let seq = |st: &'s crate::step::Stretches| -> Option<Vec<&'s Script>> {
        let sc = st.scripts.as_ref()?;
        let mut seq: Vec<&Script> = vec![&sc.emb];
        seq.extend(order.iter().take(keep).map(|&i| &sc.layers[i]));
        seq.push(&sc.head);
        seq.push(sc.loss.as_ref()?);
        Some(seq)
    };
    let seq = Seq {
        first: seq(st)?,
        later: match later {
            Some(l) => Some(seq(l)?),
            None => None,
        },
    };
    let mut params = Vec::new();
    let mut owners = Vec::new();
    let mut states_v = Vec::new();
    // A multimodal wrapper creates its vision tower first: parameters in the model's dtype
    // (the master's, where that is the parameters'), the position ids after the third.
    let mut vision = 0;
    if let Some(v) = a
        .vision
        .as_ref()
        .filter(|_| crate::estimate::vision_placed(s, a))
    {
        let vb = p.master.unwrap_or(p.weights).bytes();
        let [before, layer, after] = crate::params::vision_parts(v, a.hidden);
        let layers = (0..v.layers).flat_map(|_| layer.iter());
        for (j, t) in before.iter().chain(layers).chain(&after).enumerate() {
            params.push((t.numel() as f64 * vb).round() as u64);
            if j == 2 {
                params.push(v.patches() * 8);
            }
        }
        vision = params.len();
        owners.resize(vision, 0);
    }
    let mut add = |t: &crate::params::PTensor, owner: usize| {
        params.push((t.numel() as f64 * wb).round() as u64);
        owners.push(owner);
        let from = states_v.len();
        states(s, t.dim0, t.rest, &mut states_v);
        states_v[from..].iter_mut().for_each(|x| x.1 = owner);
    };
    crate::params::embedding(a).iter().for_each(|t| add(t, 0));
    for (l, &i) in order.iter().take(keep).enumerate() {
        kinds[i].iter().for_each(|t| add(t, 1 + l));
    }
    crate::params::head(a).iter().for_each(|t| add(t, keep + 1));
    if let Some(m) = p.master {
        // A separate full-precision copy of every parameter, made with the optimizer.
        let n = params.len();
        for i in vision..n {
            params.push((params[i] as f64 / wb * m.bytes()).round() as u64);
            owners.push(owners[i]);
        }
    }
    let plan = Plan {
        params,
        owners,
        tied_head: if a.tied_embeddings {
            (a.vocab as f64 * a.hidden as f64 * wb).round() as u64
        } else {
            0
        },
        ids: s.batch * s.seq * 8,
        states: states_v,
        opt_temp: 0,
        workspace: cublas_workspace(&s.gpu_name),
        steps: 3,
        micro_batches: s.parallel.grad_accum,
        embeds_hold,
    };
    Some((seq, plan, keep, order.len()))
}

/// Layers beyond those replayed, as the last replayed period of them grew the cache.
fn extrapolate(out: &mut Outcome, growth: &[u64], keep: usize, total: usize) {
    out.layers = keep as u64;
    let rest = (total - keep) as u64;
    if rest > 0 && out.oom.is_none() {
        let per = PERIOD.min(keep);
        let g: u64 = (keep + 1 - per..=keep)
            .map(|l| growth.get(l).copied().unwrap_or(0))
            .sum();
        out.per_layer = g / per as u64;
        out.extrapolated = rest;
        let add = g * rest / per as u64;
        out.stats.reserved += add;
        out.stats.peak_reserved += add;
        out.at_peak.0 += add;
    }
}

/// The caching allocator's segments at the allocated peak of the measured step of `s`'s
/// training run (where it runs out of memory, if it does), in address order (the replayed
/// layers' when the model is deeper than [`MAX_LAYERS`]); `None` where the replay does not
/// cover `s`.
pub fn segments_at_peak(s: &crate::Scenario) -> Option<Vec<super::Segment>> {
    let (arch, (st, later)) = scripted(s)?;
    let (seq, plan, _, _) = prepare(s, arch, (&st, later.as_ref()), st.embeds_held)?;
    let mut first = Runner::new(config(s));
    run_one(&mut first, &seq, &plan);
    let mut again = Runner::new(config(s));
    // At the measured step's peak, or where the run fails.
    again.snap_at = Some(if first.last { first.peak_at } else { u64::MAX });
    run_one(&mut again, &seq, &plan);
    Some(again.snapshot)
}

/// measure.py's whole process: the training runs of `runs`, one after the other, each
/// ending with its model, optimizer and inputs freed and the cache emptied
/// (`torch.cuda.empty_cache()`); cuBLAS's workspaces, taken in the first, stay. Each run's
/// outcome (`None` where the replay does not cover the scenario). The reserved peak of a
/// run counts what earlier runs left (`torch.cuda.max_memory_reserved()` does).
pub fn replay_process(runs: &[crate::Scenario]) -> Vec<Option<Outcome>> {
    let mut r: Option<Runner> = None;
    let mut out = Vec::new();
    for s in runs {
        let Some((arch, (st, later))) = scripted(s) else {
            out.push(None);
            continue;
        };
        let Some((seq, plan, keep, total)) =
            prepare(s, arch, (&st, later.as_ref()), st.embeds_held)
        else {
            out.push(None);
            continue;
        };
        let runner = r.get_or_insert_with(|| Runner::new(config(s)));
        let mut o = run_one(runner, &seq, &plan);
        extrapolate(&mut o, &runner.growth, keep, total);
        runner.end_run();
        out.push(Some(o));
    }
    out
}

/// Layers replayed at most: a bound on the replay's work for any architecture a config.json
/// can describe. Models with more (none of the presets trains on one GPU) have the further
/// layers counted as the last [`PERIOD`] replayed ones reserved, a stated approximation: the
/// cache's reuse is not periodic in the layers (see `tests/alloc.rs`).
pub const MAX_LAYERS: usize = 128;

/// Layers whose reserved growth stands for each further one.
const PERIOD: usize = 4;
