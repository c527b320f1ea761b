//! A training step on one GPU, as a sequence of segments: each stretch of the model replayed
//! op by op on a [`Tape`](crate::tape::Tape) once, the framework's own buffers (all-gathered
//! units, reduce-scatter inputs, gradient buckets) added at the boundaries where they are
//! allocated and freed, identical layers composed in closed form.

use crate::arch::LayerKind;
use crate::dtype::DType;
use crate::graph::{Builder, Ctx};
use crate::mem::{Bytes, Cat, Event, Phase, Seg, Where};
use crate::tape::{self, Grads, Profile};

/// Every allocation and free of one stretch's forward and of its backward (see
/// [`Tape::replay`](crate::tape::Tape::replay)), for the op-level timeline.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trace {
    pub fwd: Vec<Event>,
    pub bwd: Vec<Event>,
}

/// The traces of a GPU's stretches, as [`Stretches`] holds their profiles.
#[derive(Clone, Debug, Default)]
pub(crate) struct Traces {
    pub emb: Trace,
    pub layers: Vec<Trace>,
    pub head: Trace,
    pub loss: Trace,
}

/// The profiles of one GPU's stretches: embedding, each kind of decoder layer, LM head, loss.
pub(crate) struct Stretches {
    pub emb: Profile,
    /// One profile per kind of decoder layer, as [`Architecture::kinds`](crate::arch::Architecture::kinds) orders them.
    pub layers: Vec<Profile>,
    pub kinds: Vec<LayerKind>,
    /// The whole model's layers as runs of one kind ([`Architecture::runs`](crate::arch::Architecture::runs)).
    pub runs: Vec<(usize, u64)>,
    /// Final norm and LM head (logits).
    pub head: Profile,
    /// Upcast, log-softmax and the loss (or a fused linear + cross-entropy's whole op).
    pub loss: Profile,
    /// What the model's forward references from the embedding to its end: the embedding
    /// output (`inputs_embeds`, when the first layer does not save it anyway) and the
    /// model's other locals (the eager attention mask, position embeddings).
    pub embeds_hold: f64,
    /// `embeds_hold` counts the embedding output.
    pub embeds_held: bool,
    /// What the caller keeps of a micro-batch until it drops the model's output
    /// (`out.logits`).
    pub kept: Bytes,
    /// The first layer keeps its input until its backward (otherwise the input is freed
    /// during the layer's forward).
    pub input_kept: bool,
    /// What becomes of the parameter gradients the backwards compute.
    pub grads: Grads,
    /// Every event of each stretch, when asked for ([`Stretches::traced`]).
    pub traces: Option<Box<Traces>>,
    /// Every allocation and free of each stretch, with identities, for the allocator model
    /// (made only when asked for: [`Stretches::scripted`]).
    pub scripts: Option<Scripts>,
}

/// The event scripts of a model's stretches ([`crate::alloc::stream`]).
pub(crate) struct Scripts {
    pub emb: crate::alloc::stream::Script,
    pub layers: Vec<crate::alloc::stream::Script>,
    pub head: crate::alloc::stream::Script,
    /// Absent in inference (the head's stretch ends with the logits).
    pub loss: Option<crate::alloc::stream::Script>,
}

impl tape::Mode {
    fn or_nograd(self, mode: tape::Mode) -> tape::Mode {
        if mode == tape::Mode::NoGrad {
            tape::Mode::NoGrad
        } else {
            self
        }
    }
}

impl Stretches {
    /// Replay each stretch once. `grads` says what becomes of the parameter gradients the
    /// backward computes.
    pub(crate) fn new(ctx: &Ctx<'_>, mode: tape::Mode, grads: Grads) -> Stretches {
        Self::build::<false>(ctx, mode, grads, false)
    }

    /// As [`Stretches::new`], keeping every stretch's events for the op-level timeline.
    pub(crate) fn traced(ctx: &Ctx<'_>, mode: tape::Mode, grads: Grads) -> Stretches {
        Self::build::<false>(ctx, mode, grads, true)
    }

    /// As [`Stretches::new`], keeping each stretch's events as a script for the allocator
    /// model.
    pub(crate) fn scripted(ctx: &Ctx<'_>, mode: tape::Mode, grads: Grads) -> Stretches {
        Self::build::<true>(ctx, mode, grads, false)
    }

    /// Scale the parameter gradients the backwards leave by `f` (ZeRO-2/3: only this
    /// rank's shard accumulates), in the profiles and the traces alike.
    pub(crate) fn scale_grads(&mut self, f: f64) {
        let g = Cat::Gradients as usize;
        for p in [&mut self.emb, &mut self.head, &mut self.loss]
            .into_iter()
            .chain(self.layers.iter_mut())
        {
            p.bwd.delta.0[g] *= f;
            p.bwd.peak.0[g] *= f;
        }
        if let Some(t) = self.traces.as_deref_mut() {
            for tr in [&mut t.emb, &mut t.head, &mut t.loss]
                .into_iter()
                .chain(t.layers.iter_mut())
            {
                for e in tr.bwd.iter_mut().filter(|e| e.cat == Cat::Gradients) {
                    e.bytes *= f;
                }
            }
        }
    }

    /// `trace`: keep the timeline's events. `SCRIPTS` (the allocator model's) is a constant
    /// so that a build that never asks for scripts carries no code for them (the widgets'
    /// wasm makes none); tracing is not, so that the wasm carries one copy of this.
    fn build<const SCRIPTS: bool>(
        ctx: &Ctx<'_>,
        mode: tape::Mode,
        grads: Grads,
        trace: bool,
    ) -> Stretches {
        use crate::alloc::stream::Script;
        let a = ctx.arch;
        let h = a.hidden as f64;
        let traces = std::cell::RefCell::new(Vec::<Trace>::new());
        let scripts = std::cell::RefCell::new(Vec::<Script>::new());
        let run = |b: &Builder<'_, '_>, m: tape::Mode| {
            if !trace && !SCRIPTS {
                return b.tape.replay(m, grads, None);
            }
            let mut ev = Vec::new();
            let p = b.tape.replay(m, grads, Some(&mut ev));
            if SCRIPTS {
                scripts.borrow_mut().push(Script::new(&ev));
            }
            if trace {
                // What the timeline draws: the events that move memory (the allocator
                // model's zero-byte markers left out), split where the backward starts.
                let split = ev
                    .iter()
                    .position(|e| e.at.what == "backward" && e.bytes == 0.0)
                    .unwrap_or(ev.len());
                let mut bwd = ev.split_off(split.min(ev.len()));
                ev.retain(|e| e.bytes != 0.0);
                bwd.retain(|e| e.bytes != 0.0);
                traces.borrow_mut().push(Trace { fwd: ev, bwd });
            }
            p
        };
        // The traces in the order the stretches are replayed: embedding, layers, head, loss.
        let collect = |n_layers: usize| -> Option<Box<Traces>> {
            if !trace {
                return None;
            }
            let mut v = std::mem::take(&mut *traces.borrow_mut()).into_iter();
            let emb = v.next().unwrap_or_default();
            let layers = (0..n_layers)
                .map(|_| v.next().unwrap_or_default())
                .collect();
            Some(Box::new(Traces {
                emb,
                layers,
                head: v.next().unwrap_or_default(),
                loss: v.next().unwrap_or_default(),
            }))
        };
        // The scripts in the order the stretches were replayed: embedding, layers, head and
        // (training) loss.
        let collect_scripts = |with_loss: bool| {
            SCRIPTS.then(|| {
                let mut v = scripts.take();
                let loss = with_loss.then(|| v.pop().expect("loss traced"));
                let head = v.pop().expect("head traced");
                let emb = v.remove(0);
                Scripts {
                    emb,
                    layers: v,
                    head,
                    loss,
                }
            })
        };
        // One builder records every stretch in turn, cleared in between (its vectors are
        // allocated once).
        let mut b = Builder::new(ctx);
        let first = b.embedding();
        let locals = b.locals_hold;
        let first_rg = b.tape.requires_grad(first);
        let emb = run(&b, tape::Mode::Normal.or_nograd(mode));
        let resid = if ctx.autocast { DType::F32 } else { ctx.c };
        let kinds = a.kinds();
        let mut layers: Vec<Profile> = Vec::with_capacity(kinds.len());
        for &kind in &kinds {
            b.clear();
            let x = b.input(
                ctx.tsp * h,
                resid,
                // From the second layer on the hidden state requires grad whenever anything is
                // trained (LoRA adapters upstream); layer 0's frozen-embedding input is the
                // exception.
                first_rg || ctx.train,
            );
            b.decoder_layer(x, kind);
            for i in 0..b.kv.len() {
                let k = b.kv[i];
                b.tape.keep(k);
            }
            layers.push(run(&b, mode));
        }
        b.clear();
        let hb = &mut b;
        let x = hb.input(ctx.tsp * h, resid, ctx.train);
        if !ctx.train {
            // generate(): the last position's logits.
            hb.head(x);
            let head = run(hb, tape::Mode::NoGrad);
            let traces = collect(layers.len());
            let scripts = collect_scripts(false);
            return Stretches {
                grads,
                traces,
                emb,
                layers,
                kinds,
                runs: a.runs(0, a.layers),
                head,
                loss: Profile::default(),
                embeds_hold: locals + ctx.t * h * if ctx.autocast { 4.0 } else { ctx.c.bytes() },
                embeds_held: true,
                kept: Bytes::default(),
                input_kept: false,
                scripts,
            };
        }
        let (logits, logits_dtype) = hb.head_logits(x);
        let logits_rg = hb.tape.requires_grad(logits);
        let logits_bytes = hb.tape.bytes(logits);
        let logits_name = hb.tape.name_of(logits);
        let head = run(hb, tape::Mode::Normal.or_nograd(mode));
        b.clear();
        let lb = &mut b;
        // The loss stretch's input is what the head made: logits, or (fused loss) the
        // final norm's output. Megatron's head always makes logits.
        let cat = match ctx.loss {
            _ if ctx.megatron => Cat::Logits,
            crate::scenario::Loss::Standard => Cat::Logits,
            crate::scenario::Loss::Fused => Cat::Activations,
        };
        let l = lb.input_bytes(logits_bytes, logits_dtype, logits_rg, cat, logits_name);
        let lo = lb.loss(l);
        // The loss itself, which the caller holds with the logits (`out.loss`).
        let loss_out = Bytes::of(lb.tape.cat(lo), lb.tape.bytes(lo));
        let loss = run(lb, tape::Mode::Normal.or_nograd(mode));
        let traces = collect(layers.len());
        let scripts = collect_scripts(true);
        // The layer input is freed during the layer's forward unless a saved tensor (or the
        // checkpoint) keeps it; the model's `inputs_embeds` then holds the first layer's.
        let l0 = &layers[0];
        let input_kept = l0.input_kept;
        let input_freed = !input_kept || a.learned_positions.is_some() || !ctx.train;
        Stretches {
            grads,
            traces,
            emb,
            layers,
            kinds,
            runs: a.runs(0, a.layers),
            head,
            loss,
            input_kept,
            embeds_hold: locals
                + if input_freed {
                    ctx.tsp * h * if ctx.autocast { 4.0 } else { ctx.c.bytes() }
                } else {
                    0.0
                },
            embeds_held: input_freed,
            // Megatron's model returns the loss, not the logits; a Hugging Face model's
            // output holds both (a fused loss never makes the logits whole), and the caller
            // drops them together.
            kept: match ctx.loss {
                _ if ctx.megatron => Bytes::default(),
                crate::scenario::Loss::Standard => {
                    Bytes::of(Cat::Logits, logits_bytes).plus(loss_out)
                }
                crate::scenario::Loss::Fused => loss_out,
            },
            scripts,
        }
    }
}

impl Stretches {
    /// Which of this GPU's stretches, forward or backward.
    fn src(&self, which: Which, fwd: bool) -> Src {
        Src {
            which,
            fwd,
            grads: self.grads,
        }
    }

    /// The phases a layer of kind `i` runs in: (forward, backward).
    fn phases(&self, i: usize) -> (Phase, Phase) {
        if self.kinds[i].moe {
            (Phase::FwdMoeLayer, Phase::BwdMoeLayer)
        } else {
            (Phase::FwdLayer, Phase::BwdLayer)
        }
    }

    /// What autocast's weight cache holds after the forward of `part`'s layers.
    fn cached(&self, part: &Part) -> Bytes {
        part.runs.iter().fold(Bytes::default(), |acc, &(i, n)| {
            acc.plus(self.layers[i].fwd_cached.scale(n as f64))
        })
    }
}

fn at(phase: Phase) -> Where {
    Where {
        phase,
        ..Where::default()
    }
}

/// What the framework's own steps are called on the timeline.
const HOLD: &str = "model keeps inputs_embeds";
const DROP: &str = "model drops inputs_embeds";
const UNCACHE: &str = "autocast clears its weight cache";
const DROP_OUTPUT: &str = "caller drops the previous logits";
const OPTIMIZER: &str = "optimizer.step()";
const LOSS_GRAD: &str = "autograd seeds the loss's gradient";

/// A step composed so far, and the points of its coarse timeline.
pub(crate) struct Program {
    pub seg: Seg,
    /// (phase, bytes above the step's start) at the stretch boundaries worth showing.
    pub points: Vec<(&'static str, Bytes)>,
    /// The step as it was composed, for the op-level timeline (when asked for).
    pub rec: Option<Vec<Node>>,
}

/// Which stretch a recorded segment replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    Emb,
    /// A decoder layer of kind `i` (an index into [`Stretches::kinds`]).
    Layer(usize),
    Head,
    Loss,
}

/// A stretch's forward or backward, as replayed with gradients `grads`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Src {
    pub which: Which,
    pub fwd: bool,
    pub grads: Grads,
}

/// How the repetitions of a recorded group are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    /// Micro-batches `from`, `from + 1`, … of `of`.
    MicroBatches { from: u32, of: u32 },
    /// Decoder layers `from`, `from + 1`, … (their stretches say which).
    Layers { from: u32 },
}

/// One piece of a recorded step.
#[derive(Clone, Debug)]
pub(crate) enum Node {
    /// A framework's allocation, free or transient buffer.
    Frame(Seg),
    /// A stretch replayed op by op (`one`, labelled with its phase), `n` times in a row
    /// (identical decoder layers); its first is layer `index` (0: not a decoder layer).
    Stretch {
        src: Src,
        one: Seg,
        n: u64,
        index: u32,
    },
    /// What `body` composes to (`one`), `n` times in a row.
    Group {
        n: u64,
        one: Seg,
        count: Count,
        body: Vec<Node>,
    },
}

impl Program {
    fn new() -> Self {
        let mut p = Program {
            seg: Seg::default(),
            points: Vec::new(),
            rec: None,
        };
        p.point("start of step");
        p
    }

    /// A program that records what it composes.
    fn recording(record: bool) -> Self {
        let mut p = Program::new();
        if record {
            p.rec = Some(Vec::new());
        }
        p
    }

    /// An empty program for a fragment, recording when this one does.
    fn fragment(&self) -> Program {
        Program {
            seg: Seg::default(),
            points: Vec::new(),
            rec: self.rec.as_ref().map(|_| Vec::new()),
        }
    }

    fn then(&mut self, s: Seg) {
        self.seg.push(&s);
        if let Some(r) = self.rec.as_mut() {
            r.push(Node::Frame(s));
        }
    }

    /// A stretch that is not a decoder layer.
    fn stretch(&mut self, src: Src, s: Seg) {
        self.seg.push(&s);
        if let Some(r) = self.rec.as_mut() {
            r.push(Node::Stretch {
                src,
                one: s,
                n: 1,
                index: 0,
            });
        }
    }

    /// `n` identical decoder layers in `phase`, the first of them layer `from` (1-based).
    fn layers(&mut self, src: Src, one: Seg, n: u64, phase: Phase, from: u64) {
        let s = shifted(one.repeat(n).in_phase(phase), from.saturating_sub(1));
        self.seg.push(&s);
        if let Some(r) = self.rec.as_mut() {
            r.push(Node::Stretch {
                src,
                one: one.in_phase(phase),
                n,
                index: from as u32,
            });
        }
    }

    /// What fragment `f` composed, `n` times in a row, pushed as `seg` (the caller's
    /// labelling of `f.seg` repeated).
    fn group(&mut self, f: Program, n: u64, count: Count, seg: Seg) {
        self.seg.push(&seg);
        if let (Some(r), Some(body)) = (self.rec.as_mut(), f.rec) {
            r.push(Node::Group {
                n,
                one: f.seg,
                count,
                body,
            });
        }
    }

    fn point(&mut self, name: &'static str) {
        self.points.push((name, self.seg.delta));
    }
}

/// Which part of the model a GPU runs: all of it, or one pipeline stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    /// Holds the embedding (the first stage).
    pub first: bool,
    /// Holds the final norm, the LM head and the loss (the last stage).
    pub last: bool,
    /// Its decoder layers in order, as runs of one kind: (index into
    /// [`Architecture::kinds`](crate::arch::Architecture::kinds), how many).
    pub runs: Vec<(usize, u64)>,
    /// The model keeps the embedding's output referenced through the forward
    /// (`inputs_embeds` in a Hugging Face model's forward; a pipeline stage does not).
    pub hold_embeds: bool,
}

impl Part {
    pub(crate) fn whole(st: &Stretches) -> Part {
        Part {
            first: true,
            last: true,
            runs: st.runs.clone(),
            hold_embeds: true,
        }
    }

    /// How many decoder layers it holds.
    pub(crate) fn layers(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// How many layers of kind `i` it holds.
    pub(crate) fn count(&self, i: usize) -> u64 {
        self.runs.iter().filter(|r| r.0 == i).map(|r| r.1).sum()
    }
}

/// One micro-batch's forward over `part`.
fn forward(st: &Stretches, part: &Part, p: &mut Program, points: bool) {
    let hold = if part.first && part.hold_embeds {
        st.embeds_hold
    } else {
        0.0
    };
    if part.first {
        p.stretch(
            st.src(Which::Emb, true),
            st.emb.fwd.in_phase(Phase::FwdEmbedding),
        );
        p.then(Seg::alloc(
            Cat::Activations,
            hold,
            w(Phase::FwdEmbedding, HOLD),
        ));
    }
    let mut from = 1;
    for &(i, n) in &part.runs {
        let src = st.src(Which::Layer(i), true);
        p.layers(src, st.layers[i].fwd, n, st.phases(i).0, from);
        from += n;
    }
    if points {
        p.point("forward: after the layers");
    }
    if part.last {
        p.stretch(
            st.src(Which::Head, true),
            st.head.fwd.in_phase(Phase::FwdHead),
        );
        p.stretch(
            st.src(Which::Loss, true),
            st.loss.fwd.in_phase(Phase::FwdHead),
        );
    }
    // Leaving the forward: inputs_embeds dropped; autocast's cache cleared.
    p.then(Seg::free(Cat::Activations, hold, w(Phase::FwdHead, DROP)));
    let cached = st.cached(part);
    p.then(Seg {
        delta: Bytes::default().minus(cached),
        peak: Bytes::default(),
        at: w(Phase::FwdHead, UNCACHE),
    });
    if points {
        p.point("after forward");
    }
}

/// One micro-batch's backward over `part`: loss and head, the layers top-down, the embedding.
fn backward(st: &Stretches, part: &Part, p: &mut Program) {
    if part.last {
        // The backward starts from the loss's gradient, which autograd makes (ones like the
        // loss) and the loss's backward frees.
        p.then(Seg::alloc(
            Cat::Temporaries,
            st.loss.out_bytes,
            w(Phase::BwdHead, LOSS_GRAD),
        ));
        p.stretch(
            st.src(Which::Loss, false),
            st.loss.bwd.in_phase(Phase::BwdHead),
        );
        p.stretch(
            st.src(Which::Head, false),
            st.head.bwd.in_phase(Phase::BwdHead),
        );
    }
    // Layers counted from the top, as the backward meets them.
    let mut from = 1;
    for &(i, n) in part.runs.iter().rev() {
        let src = st.src(Which::Layer(i), false);
        p.layers(src, st.layers[i].bwd, n, st.phases(i).1, from);
        from += n;
    }
    if part.first {
        p.stretch(
            st.src(Which::Emb, false),
            st.emb.bwd.in_phase(Phase::BwdEmbedding),
        );
    }
}

/// One micro-batch's forward and backward on a GPU that holds the whole model (a single
/// GPU, or a DDP replica).
fn micro_batch(st: &Stretches, p: &mut Program, points: bool) {
    let part = Part::whole(st);
    forward(st, &part, p, points);
    backward(st, &part, p);
}

/// The segment of a program fragment built by `f`.
fn seg_of(f: impl FnOnce(&mut Program)) -> Seg {
    let mut q = Program {
        seg: Seg::default(),
        points: Vec::new(),
        rec: None,
    };
    f(&mut q);
    q.seg
}

/// How micro-batches are ordered on a pipeline stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PipeSchedule {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward after a warm-up (`Schedule1F1B`).
    OneFOneB,
}

/// What a pipeline stage adds around a chunk's backward: the gradient of the chunk's
/// output arrives in a receive buffer that is kept (counted by the caller), not in a tensor
/// the backward frees, so what the replay frees is given back; the gradient of the chunk's
/// input is sent upstream and stays alive until the next backward's send; the chunk's
/// output (the logits on the last stage: `kept`) is dropped once its backward has run.
fn around_backward(b: Seg, part: &Part, kept: Bytes, io: f64, after_first: bool) -> Seg {
    let dropped = if part.last {
        kept
    } else {
        Bytes::of(Cat::Activations, io)
    };
    // (The buffer itself is counted by the caller; the replay frees the output's gradient
    // as a temporary.)
    let recv = if part.last {
        Bytes::default()
    } else {
        Bytes::of(Cat::Temporaries, io)
    };
    let sent = if part.first {
        Bytes::default()
    } else {
        Bytes::of(Cat::Temporaries, io)
    };
    let moved = |d: Bytes| Seg {
        delta: d,
        peak: Bytes::default(),
        at: b.at,
    };
    let gone = if after_first {
        sent.plus(dropped)
    } else {
        dropped
    };
    moved(recv)
        .then(b)
        .then(moved(Bytes::default().minus(gone)))
}

/// torch.distributed.pipelining runs a chunk on its receive buffer (kept by the stage,
/// counted by the caller): what the replay frees of the chunk's input — during the first
/// layer's forward (`now` for a forward segment) or its backward — is given back.
fn input_back(s: Seg, part: &Part, io: f64, now: bool) -> Seg {
    if part.first || !now {
        s
    } else {
        let at = s.at;
        s.then(Seg::alloc(Cat::Activations, io, at))
    }
}

/// One model chunk of a pipeline stage, its forward and backward as segments: `b_new` the
/// first backward (which makes the chunk's gradients), `b_acc` the later ones.
#[derive(Clone, Copy)]
pub(crate) struct Chunk {
    f: Seg,
    b_new: Seg,
    b_acc: Seg,
}

impl Chunk {
    /// The chunk `part` of a stage; `io` is the bytes of the tensor it receives and sends.
    /// `megatron`: Megatron-LM's schedules instead of torch.distributed.pipelining's.
    pub(crate) fn new(
        first: &Stretches,
        later: &Stretches,
        part: &Part,
        io: f64,
        megatron: bool,
    ) -> Chunk {
        let mut f = seg_of(|q| forward(first, part, q, false));
        if megatron {
            let at = f.at;
            // Megatron receives each micro-batch's input into a fresh tensor (which the
            // first layer keeps for its backward), and frees the output's data once it
            // is sent (`deallocate_output_tensor`: only its autograd node stays).
            if !part.first {
                f = Seg::alloc(Cat::Activations, io, at).then(f);
            }
            if !part.last {
                f = f.then(Seg::free(Cat::Activations, io, at));
            }
            // The gradient of the output arrives in a fresh tensor the backward frees (as
            // the grad of its output, a temporary); the input's gradient is freed once sent.
            let around = |b: Seg| {
                let recv = if part.last { 0.0 } else { io };
                let sent = if part.first { 0.0 } else { io };
                let at = b.at;
                Seg::alloc(Cat::Temporaries, recv, at)
                    .then(b)
                    .then(Seg::free(Cat::Temporaries, sent, at))
            };
            return Chunk {
                f,
                b_new: around(seg_of(|q| backward(first, part, q))),
                b_acc: around(seg_of(|q| backward(later, part, q))),
            };
        }
        f = input_back(f, part, io, !first.input_kept);
        let around = |b: Seg, after_first: bool| {
            around_backward(
                input_back(b, part, io, first.input_kept),
                part,
                first.kept,
                io,
                after_first,
            )
        };
        Chunk {
            f,
            b_new: around(seg_of(|q| backward(first, part, q)), false),
            b_acc: around(seg_of(|q| backward(later, part, q)), true),
        }
    }
}

fn in_micro_batch(mut s: Seg, i: u64, m: u64) -> Seg {
    s.at.micro_batch = i as u32;
    s.at.micro_batches = m as u32;
    s
}

/// A pipeline stage's step with one chunk: `m` micro-batches under `schedule`, the stage
/// being `from_last` stages before the last (`k = min(from_last + 1, m)` micro-batches in
/// flight under 1F1B), composed in closed form.
pub(crate) fn pipeline_stage(
    c: &Chunk,
    schedule: PipeSchedule,
    from_last: u64,
    m: u64,
    opt_temp: f64,
) -> Program {
    let mut p = Program::new();
    let k = match schedule {
        PipeSchedule::GPipe => m,
        PipeSchedule::OneFOneB => (from_last + 1).min(m),
    };
    // Warm-up: k forwards.
    let mut warm = c.f.repeat(k);
    warm.at.micro_batch = warm.at.index;
    warm.at.micro_batches = m as u32;
    warm.at.index = c.f.at.index;
    p.then(warm);
    p.point("forward: micro-batches in flight");
    // The first backward makes the gradients; every later one adds into them.
    p.then(in_micro_batch(c.b_new, 1, m));
    if m > k {
        // Steady state: one forward, one backward (memory returns to where it was).
        let pair = in_micro_batch(c.f, k + 1, m).then(in_micro_batch(c.b_acc, 2, m));
        p.then(pair.repeat(m - k));
    }
    if k > 1 {
        let mut cool = c.b_acc.repeat(k - 1);
        cool.at.micro_batch = (m - k + 1 + cool.at.index as u64) as u32;
        cool.at.micro_batches = m as u32;
        cool.at.index = c.b_acc.at.index;
        p.then(cool);
    }
    p.point("after backward");
    p.then(Seg::transient(
        Cat::Temporaries,
        opt_temp,
        at(Phase::OptimizerStep),
    ));
    p
}

/// One op of a pipeline rank: the forward or the backward of local chunk `c` for the
/// next micro-batch of that chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PipeOp {
    F(usize),
    B(usize),
}

/// The ops rank `r` of `pp` runs for `m` micro-batches over `v` local chunks, in the order
/// torch.distributed.pipelining runs them: `ScheduleGPipe`, `Schedule1F1B`, or (v > 1)
/// `ScheduleInterleaved1F1B` (`_get_warmup_ops` and `_get_1f1b_rank_ops`: warm-up forwards
/// through the chunks a round of micro-batches at a time, then one forward and one
/// backward, then the remaining backwards; local chunk j is virtual stage j·pp + r).
///
/// In closed form, of a size that does not grow with `m`: of the `n = m·v` forwards and
/// `n` backwards, `warm` forwards, then `n − warm` pairs of one forward and one backward,
/// then the remaining `warm` backwards; the t-th forward is on chunk ⌊t / round⌋ mod v, the
/// t-th backward on that chunk counted from the last.
pub(crate) struct PipeOps {
    n: u64,
    warm: u64,
    round: u64,
    v: u64,
    /// The steady phase's period, in ops (a round of micro-batches through every chunk).
    pub period: usize,
}

impl PipeOps {
    pub(crate) fn new(schedule: PipeSchedule, pp: u64, r: u64, m: u64, v: u64) -> PipeOps {
        if v == 1 {
            // k warm-up forwards, then the first backward, one forward and one backward at
            // a time, and the remaining backwards: k − 1 forwards before the pairs.
            let k = match schedule {
                PipeSchedule::GPipe => m,
                PipeSchedule::OneFOneB => (pp - r).min(m),
            };
            return PipeOps {
                n: m,
                warm: k.saturating_sub(1),
                round: m.max(1),
                v,
                period: 2,
            };
        }
        let rounds = (m / pp).max(1);
        let round = (m / rounds).max(1);
        PipeOps {
            n: m * v,
            warm: ((v - 1) * round + 2 * (pp - 1 - r)).min(m * v),
            round,
            v,
            period: (2 * round * v) as usize,
        }
    }

    /// How many ops the rank runs.
    pub(crate) fn len(&self) -> usize {
        (2 * self.n) as usize
    }

    /// The ops before the first backward (as many backwards end the step).
    pub(crate) fn first_b(&self) -> usize {
        (self.warm + u64::from(self.warm < self.n)) as usize
    }

    fn chunk(&self, t: u64) -> usize {
        (t / self.round % self.v) as usize
    }

    pub(crate) fn get(&self, i: usize) -> PipeOp {
        #[cfg(test)]
        tests::LOOKED.with(|n| n.set(n.get() + 1));
        let (i, w, n) = (i as u64, self.warm, self.n);
        let b = |t| PipeOp::B(self.v as usize - 1 - self.chunk(t));
        if i < w {
            PipeOp::F(self.chunk(i))
        } else if i >= 2 * n - w {
            b(i - n)
        } else if (i - w) % 2 == 0 {
            PipeOp::F(self.chunk(w + (i - w) / 2))
        } else {
            b((i - w) / 2)
        }
    }

    /// How many of the first `i` ops are `op`.
    pub(crate) fn count(&self, op: PipeOp, i: usize) -> u64 {
        let (i, w, n, p) = (i as u64, self.warm, self.n, self.round);
        // The forwards (backwards) among them, and the chunk counted as they count it.
        let (t, c) = match op {
            PipeOp::F(c) => (i.min(w) + i.saturating_sub(w).div_ceil(2).min(n - w), c),
            PipeOp::B(c) => (
                (i.saturating_sub(w) / 2).min(n - w) + i.saturating_sub(2 * n - w),
                self.v as usize - 1 - c,
            ),
        };
        let cycle = p * self.v;
        t / cycle * p + (t % cycle).saturating_sub(c as u64 * p).min(p)
    }

    /// How many times ops `i .. i + unit` come in a row from `i`, up to op `limit`: compared
    /// op by op only where the pattern may change (a new phase, or a chunk's round over).
    pub(crate) fn run(&self, i: usize, unit: usize, limit: usize) -> usize {
        let (w, n, p) = (self.warm, self.n, self.round);
        let next = |t: u64| (t / p + 1) * p;
        let mut x = i + unit;
        while x < limit && self.get(x) == self.get(x - unit) {
            // Where the stretch of op x − unit ends (one op repeated, or one pair).
            let y = (x - unit) as u64;
            let end = if y < w {
                next(y).min(w)
            } else if y < 2 * n - w {
                let t = (y - w) / 2;
                w + 2 * next(t).min(next(w + t) - w).min(n - w)
            } else {
                n + next(y - n).min(n)
            } as usize;
            x = if end > x { end.min(limit) } else { x + 1 };
        }
        (x - i) / unit
    }
}

/// A chunk under FSDP2 in a pipeline: its units over the stretches replayed with new and
/// with accumulated gradients.
pub(crate) struct FsdpChunk<'a> {
    pub new: FsdpPart<'a>,
    pub acc: FsdpPart<'a>,
    pub io: f64,
}

/// A pipeline rank's step op by op: plain chunks (`chunks`) or, under FSDP2, `fsdp` chunks
/// whose units are gathered, kept and reduced as torch's schedules ask FSDP to (gradients
/// reduce-scattered and units resharded after backward only on each chunk's last
/// micro-batch).
///
/// The steady phase repeats itself: once a period of ops (`ops.period` ops, a round of
/// micro-batches through every chunk) composes to the same segment as the one before and
/// leaves the same unit states, the periods up to the last one are that segment repeated,
/// in closed form. An op's micro-batch is counted from its place in the ops, so that what
/// is skipped costs nothing, however many micro-batches.
pub(crate) fn pipeline_loop(
    chunks: &[Chunk],
    fsdp: &[FsdpChunk<'_>],
    ops: &PipeOps,
    m: u64,
    opt_temp: f64,
) -> Program {
    let period = ops.period;
    let n = chunks.len().max(fsdp.len());
    let mut p = Program::new();
    let mut started = vec![false; n];
    let mut state = vec![FsdpState::SHARDED; n];
    // FSDP segments depend only on the chunk, the op and the states: made once each.
    type Key = (usize, bool, FsdpState, bool, bool);
    let mut memo: Vec<(Key, Seg, FsdpState)> = Vec::new();
    // Appends the segment of op `j` (in its micro-batch) to `x`.
    let mut seg_for = |j: usize, x: &mut Seg, started: &mut [bool], state: &mut [FsdpState]| {
        let op = ops.get(j);
        let mb = ops.count(op, j + 1);
        let push = |x: &mut Seg, s: &Seg| {
            let at = Where {
                micro_batch: mb as u32,
                micro_batches: m as u32,
                ..s.at
            };
            x.push_at(s, at)
        };
        match op {
            PipeOp::F(c) => {
                let s = if let Some(fc) = fsdp.get(c) {
                    let key = (c, true, state[c], false, false);
                    let i = match memo.iter().position(|x| x.0 == key) {
                        Some(i) => i,
                        None => {
                            let mut out = state[c];
                            let seg = seg_of(|q| out = fc.new.forward(state[c], q, false));
                            let seg = input_back(seg, &fc.new.part, fc.io, !fc.new.st.input_kept);
                            memo.push((key, seg, out));
                            memo.len() - 1
                        }
                    };
                    state[c] = memo[i].2;
                    &memo[i].1
                } else {
                    &chunks[c].f
                };
                push(x, s);
            }
            PipeOp::B(c) => {
                let after_first = started[c];
                started[c] = true;
                let s = if let Some(fc) = fsdp.get(c) {
                    let sync = mb == m;
                    let key = (c, false, state[c], sync, after_first);
                    let i = match memo.iter().position(|x| x.0 == key) {
                        Some(i) => i,
                        None => {
                            let st = if after_first { &fc.acc } else { &fc.new };
                            let mut out = state[c];
                            let b = seg_of(|q| {
                                out = st.backward(state[c], sync, false, after_first, q)
                            });
                            let b = input_back(b, &fc.new.part, fc.io, fc.new.st.input_kept);
                            let seg = around_backward(
                                b,
                                &fc.new.part,
                                fc.new.st.kept,
                                fc.io,
                                after_first,
                            );
                            memo.push((key, seg, out));
                            memo.len() - 1
                        }
                    };
                    state[c] = memo[i].2;
                    &memo[i].1
                } else if after_first {
                    &chunks[c].b_acc
                } else {
                    &chunks[c].b_new
                };
                push(x, s);
            }
        }
    };
    // Runs of the same op (warm-up forwards of one chunk) or the same pair (one forward, one
    // backward) compose as their second element repeated once the states it leaves stop
    // changing: only the first, the second and the last of a run are composed op by op.
    let (mut snap_state, mut snap_started) = (state.clone(), started.clone());
    let mut compose = |i: usize,
                       limit: usize,
                       acc: &mut Seg,
                       started: &mut [bool],
                       state: &mut [FsdpState]|
     -> usize {
        let op = |j| ops.get(j);
        let unit = if i + 3 < limit
            && op(i + 1) != op(i)
            && op(i + 2) == op(i)
            && op(i + 3) == op(i + 1)
        {
            2
        } else {
            1
        };
        let n = ops.run(i, unit, limit);
        let mut one = |k: usize, started: &mut [bool], state: &mut [FsdpState]| -> Seg {
            let mut x = Seg::default();
            for j in i + k * unit..i + (k + 1) * unit {
                seg_for(j, &mut x, started, state);
            }
            x
        };
        acc.push(&one(0, started, state));
        if n == 1 {
            return i + unit;
        }
        snap_state.copy_from_slice(state);
        snap_started.copy_from_slice(started);
        let second = one(1, started, state);
        acc.push(&second);
        // Units 3 … n−1 repeat the second when it changed no state and no backward among them
        // is a chunk's last (which reduce-scatters under FSDP).
        let stable = snap_state[..] == state[..] && snap_started[..] == started[..];
        let mut middle = n.saturating_sub(3) as u64;
        if !fsdp.is_empty() {
            // (The ops of a unit are different ops.)
            for j in i..i + unit {
                if let PipeOp::B(_) = op(j) {
                    // Its backwards so far + the units repeated must stay below m.
                    let done = ops.count(op(j), i + 2 * unit);
                    middle = middle.min(m.saturating_sub(1).saturating_sub(done));
                }
            }
        }
        if stable && middle > 0 {
            let mut r = second.repeat(middle);
            r.at = second.at;
            acc.push(&r);
        } else {
            middle = 0;
        }
        for k in (2 + middle as usize)..n {
            acc.push(&one(k, started, state));
        }
        i + n * unit
    };
    let first_b = ops.first_b();
    // The steady phase: alternating forwards and backwards, up to the cool-down (as many
    // backwards as there are forwards before the first backward).
    let steady_end = ops.len() - first_b;
    let mut i = 0;
    // The last period composed, and the states it left.
    let mut previous: Option<Seg> = None;
    let mut previous_state = state.clone();
    while i < ops.len() {
        if i == first_b {
            p.point("forward: micro-batches in flight");
        }
        let in_steady = i >= first_b && i + period <= steady_end && period > 0;
        if in_steady && (i - first_b).is_multiple_of(period) {
            let mut seg = Seg::default();
            let end = i + period;
            while i < end {
                i = compose(i, end, &mut seg, &mut started, &mut state);
            }
            // Skip whole periods that would compose the same, keeping the last one.
            if let Some(prev) = &previous {
                let same =
                    prev.peak == seg.peak && prev.delta == seg.delta && previous_state == state;
                let left = (steady_end - i) / period;
                if same && left > 1 {
                    let skip = left - 1;
                    p.then(seg);
                    let mut r = seg.repeat(skip as u64);
                    r.at = seg.at;
                    p.then(r);
                    i += skip * period;
                    previous = None;
                    continue;
                }
            }
            p.then(seg);
            previous = Some(seg);
            previous_state.copy_from_slice(&state);
            continue;
        }
        // Up to the next period boundary (or the end).
        let limit = if i < first_b {
            first_b
        } else if i < steady_end && period > 0 {
            (first_b + ((i - first_b) / period + 1) * period)
                .min(steady_end)
                .max(i + 1)
        } else {
            ops.len()
        };
        let mut seg = Seg::default();
        i = compose(i, limit, &mut seg, &mut started, &mut state);
        p.then(seg);
    }
    p.point("after backward");
    p.then(Seg::transient(
        Cat::Temporaries,
        opt_temp,
        at(Phase::OptimizerStep),
    ));
    p
}

/// Later micro-batches (2 to `micro_batches`) after the first, each composed the same way:
/// its forward (`fwd`), then the previous micro-batch's output (`kept`) dropped, then its
/// backward (`bwd`, from the forward's result). The caller's loop `out = model(...)` replaces
/// `out` only when the forward returns, so the previous logits live through the forward.
fn later_micro_batches<S>(
    p: &mut Program,
    kept: Bytes,
    micro_batches: u64,
    fwd: impl FnOnce(&mut Program) -> S,
    bwd: impl FnOnce(S, &mut Program),
) {
    if micro_batches > 1 {
        let mut q = p.fragment();
        let s = fwd(&mut q);
        q.then(Seg {
            delta: Bytes::default().minus(kept),
            peak: Bytes::default(),
            at: w(Phase::FwdHead, DROP_OUTPUT),
        });
        bwd(s, &mut q);
        let at = q.seg.at;
        let mut s = q.seg.repeat(micro_batches - 1);
        s.at.micro_batch = s.at.index + 1;
        s.at.micro_batches = micro_batches as u32;
        s.at.index = at.index;
        p.group(
            q,
            micro_batches - 1,
            Count::MicroBatches {
                from: 2,
                of: micro_batches as u32,
            },
            s,
        );
    }
}

/// A training step on a GPU that holds the whole model: `micro_batches` forward and
/// backward passes (`later`: the stretches as replayed once the gradients exist, which are
/// then added into), then the optimizer step, which allocates `opt_temp` for itself; its
/// stretches recorded for the op-level timeline when `record`.
pub(crate) fn replicated_rec(
    first: &Stretches,
    later: Option<&Stretches>,
    micro_batches: u64,
    opt_temp: f64,
    record: bool,
) -> Program {
    let mut p = Program::recording(record);
    micro_batch(first, &mut p, true);
    if let Some(l) = later {
        let part = Part::whole(l);
        later_micro_batches(
            &mut p,
            first.kept,
            micro_batches,
            |q| forward(l, &part, q, false),
            |(), q| backward(l, &part, q),
        );
    }
    p.point("after backward");
    // Optimizer step: the grads and `out.logits` are still alive.
    p.then(Seg::transient(
        Cat::Temporaries,
        opt_temp,
        w(Phase::OptimizerStep, OPTIMIZER),
    ));
    p
}

/// Bytes of one FSDP2 unit on this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Unit {
    /// The unit's parameters gathered whole, in the compute dtype (`param_dtype`).
    pub gathered: f64,
    /// The reduce-scatter input: every gradient of the unit, padded, in `reduce_dtype`.
    pub rs_in: f64,
    /// This rank's reduce-scatter output (its shard of the gradients, `reduce_dtype`).
    pub rs_out: f64,
    /// The sharded gradient it becomes (`.grad` of the sharded parameter, parameter dtype):
    /// the same buffer as `rs_out` when the dtypes agree.
    pub grad: f64,
    /// A copy of gradients made before the reduce-scatter: DTensor redistributes a gradient
    /// whose placement is not the parameter's (the tensor-parallel embedding's whole-table
    /// gradient, cut to this rank's rows).
    pub redistribute: f64,
    /// Bytes per byte of unsharded gradient that FSDP2 accumulates in when it does not
    /// reduce after a backward: `reduce_dtype` over `param_dtype` (2 under bf16/fp32 mixed
    /// precision, 1 otherwise).
    pub acc_ratio: f64,
}

/// FSDP2 (`fully_shard`) as torchtitan applies it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fsdp2 {
    /// torchtitan's wrapping: the embedding, each layer, [final norm, LM head], and a root
    /// holding nothing; otherwise each layer and a root holding the embedding and head.
    pub titan: bool,
    /// Parameters of the root's group that no backward reaches (a multimodal wrapper's
    /// vision tower under text-only training): gathered bytes. The root's all-gather
    /// unshards them with the rest of its group at the forward's start, and they stay so
    /// to its post-backward (FSDP2 never reshards the root after forward); they make no
    /// gradient to reduce.
    pub frozen: f64,
    /// `reshard_after_forward` of the layer (and embedding) units.
    pub reshard: bool,
    /// The loss is computed outside the model's forward (context parallelism: on the local
    /// shard of the labels), so the root's pre-backward runs after the loss's backward.
    pub loss_outside: bool,
    pub emb: Unit,
    pub head: Unit,
    /// One unit per kind of decoder layer, as [`Architecture::kinds`](crate::arch::Architecture::kinds) orders them.
    pub layers: Vec<Unit>,
}

fn w(phase: Phase, what: &'static str) -> Where {
    Where {
        phase,
        what,
        ..Where::default()
    }
}

/// Gather a unit now: the all-gather output, copied out into the unsharded parameters,
/// then freed.
fn gather_now(g: f64, phase: Phase) -> Seg {
    // As one segment: both buffers at once at the top, the unsharded parameters after.
    let mut peak = Bytes::of(Cat::Comm, g);
    peak.add(Cat::Gathered, g);
    Seg {
        delta: Bytes::of(Cat::Gathered, g),
        peak: if g > 0.0 { peak } else { Bytes::default() },
        at: w(phase, "FSDP all-gather"),
    }
}

/// A prefetched all-gather's output copied out into the unsharded parameters.
fn copy_out(g: f64, phase: Phase) -> Seg {
    let mut delta = Bytes::of(Cat::Gathered, g);
    delta.add(Cat::Comm, -g);
    Seg {
        delta,
        peak: if g > 0.0 {
            Bytes::of(Cat::Gathered, g)
        } else {
            Bytes::default()
        },
        at: w(phase, "FSDP copy-out"),
    }
}

fn reshard(g: f64, phase: Phase) -> Seg {
    Seg::free(Cat::Gathered, g, w(phase, "FSDP reshard"))
}

/// A unit's post-backward: reshard, free the previous reduce-scatter input, reduce-scatter
/// this unit's gradients (`ug`: their unsharded bytes, freed once copied in). With
/// `accumulate`, the sharded gradient exists already and the new shard is added into it.
fn reduce_scatter(u: &Unit, prev_rs: f64, ug: f64, accumulate: bool, phase: Phase) -> Seg {
    let at = w(phase, "FSDP reduce-scatter");
    // A DTensor gradient redistributed to the parameter's placement (a copy made by the
    // backward itself, before FSDP's post-backward reshards the unit).
    let mut s = Seg::alloc(
        Cat::Temporaries,
        u.redistribute,
        w(phase, "DTensor redistribute"),
    );
    s.push(&reshard(u.gathered, phase));
    if prev_rs > 0.0 {
        s.push(&Seg::free(Cat::Comm, prev_rs, at));
    }
    s.push(&Seg::alloc(Cat::Comm, u.rs_in, at));
    s.push(&Seg::free(Cat::Gradients, ug, at));
    if u.redistribute > 0.0 {
        s.push(&Seg::free(Cat::Temporaries, u.redistribute, at));
    }
    if accumulate {
        s = s.then(Seg::transient(Cat::Temporaries, u.rs_out, at));
    } else if u.rs_out == u.grad {
        s = s.then(Seg::alloc(Cat::Gradients, u.grad, at));
    } else {
        s = s
            .then(Seg::alloc(Cat::Temporaries, u.rs_out, at))
            .then(Seg::alloc(Cat::Gradients, u.grad, at))
            .then(Seg::free(Cat::Temporaries, u.rs_out, at));
    }
    s
}

/// Decoder layers of one kind in a row, for the FSDP2 composition.
struct LayerRun<'a> {
    /// The layers' kind (an index into [`Stretches::kinds`]).
    kind: usize,
    n: u64,
    p: &'a Profile,
    unit: Unit,
    /// Unsharded gradient bytes one layer's backward makes.
    ug: f64,
    fwd: Phase,
    bwd: Phase,
}

/// The same segment with its repetition index moved by `k` (layers after the first).
fn shifted(mut s: Seg, k: u64) -> Seg {
    s.at.index += k as u32;
    s
}

/// Where FSDP2's units stand between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FsdpState {
    /// The layer units (and torchtitan's embedding unit) are gathered.
    pub units: bool,
    /// The root (or torchtitan's [norm, LM head] unit) is gathered.
    pub root: bool,
}

impl FsdpState {
    pub(crate) const SHARDED: FsdpState = FsdpState {
        units: false,
        root: false,
    };
}

/// FSDP2 over one GPU's part of the model: the units and the stretches they wrap.
pub(crate) struct FsdpPart<'a> {
    st: &'a Stretches,
    f: &'a Fsdp2,
    part: Part,
    runs: Vec<LayerRun<'a>>,
    /// The root unit of the layers wrap: the embedding (first stage) and the head (last).
    root: Unit,
    /// Unsharded gradient bytes of the embedding and of the head and loss stretches.
    ug_emb: f64,
    ug_head: f64,
}

impl<'a> FsdpPart<'a> {
    /// `grads`: the stretches as replayed with new gradients (whose unsharded gradient
    /// bytes the reduce-scatters free).
    pub(crate) fn new(st: &'a Stretches, grads: &Stretches, f: &'a Fsdp2, part: Part) -> Self {
        let ug = |pr: &Profile| pr.bwd.delta.get(Cat::Gradients).max(0.0);
        let runs = part
            .runs
            .iter()
            .map(|&(i, n)| {
                let (fwd, bwd) = st.phases(i);
                LayerRun {
                    kind: i,
                    n,
                    p: &st.layers[i],
                    unit: f.layers[i],
                    ug: ug(&grads.layers[i]),
                    fwd,
                    bwd,
                }
            })
            .collect();
        let pick = |on: bool, u: Unit| if on { u } else { Unit::default() };
        let (e, h) = (pick(part.first, f.emb), pick(part.last, f.head));
        let (first, last) = (part.first, part.last);
        FsdpPart {
            st,
            f,
            part,
            runs,
            root: Unit {
                // Under torchtitan's wrapping the root holds only the frozen parameters
                // (gathered apart, before the embedding's unit).
                gathered: e.gathered + h.gathered + if f.titan { 0.0 } else { f.frozen },
                rs_in: e.rs_in + h.rs_in,
                rs_out: e.rs_out + h.rs_out,
                grad: e.grad + h.grad,
                redistribute: e.redistribute + h.redistribute,
                acc_ratio: e.acc_ratio.max(h.acc_ratio),
            },
            ug_emb: if first { ug(&grads.emb) } else { 0.0 },
            ug_head: if last {
                ug(&grads.head) + ug(&grads.loss)
            } else {
                0.0
            },
        }
    }

    /// One micro-batch's forward from state `s`; returns the state after it.
    pub(crate) fn forward(&self, s: FsdpState, p: &mut Program, points: bool) -> FsdpState {
        let (st, f, part) = (self.st, self.f, &self.part);
        // The root's group (torchtitan's holds only frozen parameters, if any).
        let root = if f.titan {
            f.frozen
        } else {
            self.root.gathered
        };
        if !s.root && (root > 0.0 || !f.titan) {
            p.then(gather_now(root, Phase::FwdEmbedding));
        }
        let hold = if part.first && part.hold_embeds {
            st.embeds_hold
        } else {
            0.0
        };
        if part.first {
            if f.titan && !s.units {
                p.then(gather_now(f.emb.gathered, Phase::FwdEmbedding));
            }
            p.stretch(
                st.src(Which::Emb, true),
                st.emb.fwd.in_phase(Phase::FwdEmbedding),
            );
            if f.titan && f.reshard {
                p.then(reshard(f.emb.gathered, Phase::FwdEmbedding));
            }
            p.then(Seg::alloc(
                Cat::Activations,
                hold,
                w(Phase::FwdEmbedding, HOLD),
            ));
        }
        let mut from = 1;
        for r in &self.runs {
            let mut q = p.fragment();
            if !s.units {
                q.then(gather_now(r.unit.gathered, r.fwd));
            }
            q.stretch(st.src(Which::Layer(r.kind), true), r.p.fwd.in_phase(r.fwd));
            if f.reshard {
                q.then(reshard(r.unit.gathered, r.fwd));
            }
            let one = shifted(q.seg.repeat(r.n).in_phase(r.fwd), from - 1);
            p.group(q, r.n, Count::Layers { from: from as u32 }, one);
            from += r.n;
        }
        if points {
            p.point("forward: after the layers");
        }
        if part.last {
            if f.titan && !s.root {
                p.then(gather_now(f.head.gathered, Phase::FwdHead));
            }
            p.stretch(
                st.src(Which::Head, true),
                st.head.fwd.in_phase(Phase::FwdHead),
            );
            p.stretch(
                st.src(Which::Loss, true),
                st.loss.fwd.in_phase(Phase::FwdHead),
            );
        }
        p.then(Seg::free(Cat::Activations, hold, w(Phase::FwdHead, DROP)));
        let cached = st.cached(part);
        p.then(Seg {
            delta: Bytes::default().minus(cached),
            peak: Bytes::default(),
            at: w(Phase::FwdHead, UNCACHE),
        });
        if points {
            p.point("after forward");
        }
        FsdpState {
            units: !f.reshard,
            root: true,
        }
    }

    /// One micro-batch's backward from state `s`. `sync`: it reduce-scatters the gradients
    /// and reshards each unit after its backward (otherwise both wait for a later
    /// micro-batch, as pipelining asks FSDP to); `accumulate`: the sharded gradients exist
    /// already. Returns the state after it.
    /// `held`: earlier backwards left their unsharded gradients accumulated (in
    /// `reduce_dtype`).
    pub(crate) fn backward(
        &self,
        s: FsdpState,
        sync: bool,
        accumulate: bool,
        held: bool,
        p: &mut Program,
    ) -> FsdpState {
        // The unsharded gradients a reduce-scatter frees, and what a backward that does not
        // reduce does with them: the first converts them to `reduce_dtype` and keeps them;
        // later ones add into those (their own are transient).
        let freed = |u: &Unit, ug: f64| if held { ug * u.acc_ratio } else { ug };
        let keep = |u: &Unit, ug: f64, phase| -> Seg {
            if held || u.acc_ratio == 1.0 {
                Seg::default()
            } else {
                let at = w(phase, "FSDP gradient accumulation");
                Seg::alloc(Cat::Gradients, ug * u.acc_ratio, at).then(Seg::free(
                    Cat::Gradients,
                    ug,
                    at,
                ))
            }
        };
        let (st, f, part) = (self.st, self.f, &self.part);
        let sharded = !s.units;
        let prefetch = |g: f64, phase| {
            if sharded {
                Seg::alloc(Cat::Comm, g, w(phase, "FSDP prefetch all-gather"))
            } else {
                Seg::default()
            }
        };
        let top = self.runs.last().map_or(0.0, |r| r.unit.gathered);
        let (loss, head) = (st.src(Which::Loss, false), st.src(Which::Head, false));
        let mut prev_rs = 0.0;
        if part.last {
            if f.titan {
                p.stretch(loss, st.loss.bwd.in_phase(Phase::BwdHead));
                p.then(prefetch(top, Phase::BwdHead));
                p.stretch(head, st.head.bwd.in_phase(Phase::BwdHead));
                if sync {
                    p.then(reduce_scatter(
                        &f.head,
                        0.0,
                        freed(&f.head, self.ug_head),
                        accumulate,
                        Phase::BwdHead,
                    ));
                    prev_rs = f.head.rs_in;
                } else {
                    p.then(keep(&f.head, self.ug_head, Phase::BwdHead));
                }
            } else if f.loss_outside {
                p.stretch(loss, st.loss.bwd.in_phase(Phase::BwdHead));
                p.then(prefetch(top, Phase::BwdHead));
                p.stretch(head, st.head.bwd.in_phase(Phase::BwdHead));
            } else {
                // The root's pre-backward (the loss is computed inside the root's forward).
                p.then(prefetch(top, Phase::BwdHead));
                p.stretch(loss, st.loss.bwd.in_phase(Phase::BwdHead));
                p.stretch(head, st.head.bwd.in_phase(Phase::BwdHead));
            }
        } else {
            // A stage without the head: the root's pre-backward prefetches the top layer.
            p.then(prefetch(top, Phase::BwdLayer));
        }
        let runs = self.runs.len();
        // Layers counted from the top, as the backward meets them.
        let mut from = 1;
        for k in 0..runs {
            // The runs from the top down.
            let r = &self.runs[runs - 1 - k];
            let next_g = match (k + 1 < runs).then(|| &self.runs[runs - 2 - k]) {
                Some(n) => n.unit.gathered,
                // Layer 0 prefetches the embedding's unit (torchtitan's wrapping); under the
                // root wrap the embedding is gathered already.
                None if f.titan && part.first => f.emb.gathered,
                None => 0.0,
            };
            // One layer's backward with its unit's collectives, as a fragment of `p`.
            let recording = p.fragment();
            let layer = |prev: f64, next: f64| -> Program {
                let mut q = recording.fragment();
                if sharded {
                    q.then(copy_out(r.unit.gathered, r.bwd));
                }
                q.then(prefetch(next, r.bwd));
                q.stretch(st.src(Which::Layer(r.kind), false), r.p.bwd.in_phase(r.bwd));
                if sync {
                    q.then(reduce_scatter(
                        &r.unit,
                        prev,
                        freed(&r.unit, r.ug),
                        accumulate,
                        r.bwd,
                    ));
                } else {
                    q.then(keep(&r.unit, r.ug, r.bwd));
                }
                q.seg = q.seg.in_phase(r.bwd);
                q
            };
            let same = r.unit.gathered;
            let rs = if sync { r.unit.rs_in } else { 0.0 };
            // The first and the last layer of the run differ from those between (what they
            // free and prefetch).
            let one = |p: &mut Program, q: Program, index: u64| {
                let mut x = q.seg;
                x.at.index = index as u32;
                p.group(q, 1, Count::Layers { from: index as u32 }, x);
            };
            let first = layer(prev_rs, if r.n == 1 { next_g } else { same });
            one(p, first, from);
            if r.n > 2 {
                let q = layer(rs, same);
                let x = shifted(q.seg.repeat(r.n - 2), from);
                p.group(
                    q,
                    r.n - 2,
                    Count::Layers {
                        from: from as u32 + 1,
                    },
                    x,
                );
            }
            if r.n > 1 {
                let last = layer(rs, next_g);
                one(p, last, from + r.n - 1);
            }
            from += r.n;
            if sync {
                prev_rs = r.unit.rs_in;
            }
        }
        if part.first {
            if f.titan && sharded {
                p.then(copy_out(f.emb.gathered, Phase::BwdEmbedding));
            }
            p.stretch(
                st.src(Which::Emb, false),
                st.emb.bwd.in_phase(Phase::BwdEmbedding),
            );
        }
        if sync {
            let (unit, ug) = if f.titan {
                (
                    if part.first { f.emb } else { Unit::default() },
                    self.ug_emb,
                )
            } else {
                (self.root, self.ug_emb + self.ug_head)
            };
            p.then(reduce_scatter(
                &unit,
                prev_rs,
                freed(&unit, ug),
                accumulate,
                Phase::BwdEmbedding,
            ));
            // The end of backward: the last reduce-scatter's input is released (the one
            // before it was, by that reduce-scatter), and torchtitan's root, holding only
            // frozen parameters, reshards.
            p.then(Seg::free(
                Cat::Comm,
                unit.rs_in,
                w(Phase::BwdEmbedding, "FSDP reduce-scatter"),
            ));
            if f.titan && f.frozen > 0.0 {
                p.then(reshard(f.frozen, Phase::BwdEmbedding));
            }
            FsdpState::SHARDED
        } else {
            let (unit, ug) = if f.titan {
                (
                    if part.first { f.emb } else { Unit::default() },
                    self.ug_emb,
                )
            } else {
                (self.root, self.ug_emb + self.ug_head)
            };
            p.then(keep(&unit, ug, Phase::BwdEmbedding));
            FsdpState {
                units: true,
                root: true,
            }
        }
    }
}

/// A training step under FSDP2 with `micro_batches` micro-batches (gradient accumulation:
/// each one reduce-scatters; the sharded gradients persist from the first).
pub(crate) fn fsdp2(
    st: &Stretches,
    f: &Fsdp2,
    micro_batches: u64,
    opt_temp: f64,
    record: bool,
) -> Program {
    let fp = FsdpPart::new(st, st, f, Part::whole(st));
    let mut p = Program::recording(record);
    let s = fp.forward(FsdpState::SHARDED, &mut p, true);
    fp.backward(s, true, false, false, &mut p);
    later_micro_batches(
        &mut p,
        st.kept,
        micro_batches,
        |q| fp.forward(FsdpState::SHARDED, q, false),
        |s, q| {
            fp.backward(s, true, true, false, q);
        },
    );
    p.point("after backward");
    p.then(Seg::transient(
        Cat::Temporaries,
        opt_temp,
        w(Phase::OptimizerStep, OPTIMIZER),
    ));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        /// Ops looked at ([`PipeOps::get`]): composed one by one, or compared.
        pub(super) static LOOKED: Cell<u64> = const { Cell::new(0) };
    }

    /// The ops as torch's schedules list them, one by one.
    fn listed(schedule: PipeSchedule, pp: u64, r: u64, m: u64, v: u64) -> Vec<PipeOp> {
        let mut ops = Vec::new();
        if v == 1 {
            let k = match schedule {
                PipeSchedule::GPipe => m,
                PipeSchedule::OneFOneB => (pp - r).min(m),
            };
            ops.extend((0..k).map(|_| PipeOp::F(0)));
            ops.push(PipeOp::B(0));
            for _ in k..m {
                ops.extend([PipeOp::F(0), PipeOp::B(0)]);
            }
            ops.extend((1..k).map(|_| PipeOp::B(0)));
            return ops;
        }
        let rounds = (m / pp).max(1);
        let per_round = (m / rounds).max(1);
        let warmup = ((v - 1) * per_round + 2 * (pp - 1 - r)).min(m * v);
        let fwd = |op: u64| PipeOp::F(((op / per_round) % v) as usize);
        let bwd = |op: u64| PipeOp::B((v - 1 - ((op - warmup) / per_round) % v) as usize);
        ops.extend((0..warmup).map(fwd));
        for op in warmup..m * v {
            ops.extend([fwd(op), bwd(op)]);
        }
        ops.extend((m * v..m * v + warmup).map(bwd));
        ops
    }

    /// The closed form is the list op for op: each op, how many of each came before it, the
    /// first backward, the cool-down, and every run of one op or one pair (as long as
    /// comparing op by op finds it).
    #[test]
    fn pipe_ops_are_the_schedules_list() {
        let schedules = [
            (PipeSchedule::GPipe, 1),
            (PipeSchedule::OneFOneB, 1),
            (PipeSchedule::OneFOneB, 2),
            (PipeSchedule::OneFOneB, 3),
            (PipeSchedule::OneFOneB, 4),
        ];
        for (schedule, v) in schedules {
            for pp in 2..=8 {
                for r in [0, 1, pp / 2, pp - 1] {
                    for m in (1..=2 * pp + 3).chain([3 * pp, 4 * pp + 1]) {
                        let ops = PipeOps::new(schedule, pp, r, m, v);
                        let list = listed(schedule, pp, r, m, v);
                        let case = format!("{schedule:?} pp {pp} r {r} m {m} v {v}");
                        assert_eq!(ops.len(), list.len(), "{case}");
                        let first_b = list.iter().position(|o| matches!(o, PipeOp::B(_)));
                        assert_eq!(Some(ops.first_b()), first_b, "{case}");
                        let cooldown = list
                            .iter()
                            .rev()
                            .take_while(|o| matches!(o, PipeOp::B(_)))
                            .count();
                        assert_eq!(cooldown, ops.first_b(), "{case}");
                        let kinds: Vec<PipeOp> = (0..v as usize)
                            .flat_map(|c| [PipeOp::F(c), PipeOp::B(c)])
                            .collect();
                        for i in 0..=list.len() {
                            for &op in &kinds {
                                let want = list[..i].iter().filter(|o| **o == op).count();
                                assert_eq!(ops.count(op, i), want as u64, "{case} {op:?} {i}");
                            }
                            if i == list.len() {
                                break;
                            }
                            assert_eq!(ops.get(i), list[i], "{case} op {i}");
                            for unit in 1..=2 {
                                for limit in
                                    [i + 1, i + 3, i + ops.period, ops.first_b(), list.len()]
                                {
                                    let limit = limit.min(list.len());
                                    let mut n = 1;
                                    while i + (n + 1) * unit <= limit
                                        && list[i + n * unit..i + (n + 1) * unit]
                                            == list[i..i + unit]
                                    {
                                        n += 1;
                                    }
                                    if limit > i {
                                        assert_eq!(
                                            ops.run(i, unit, limit),
                                            n,
                                            "{case} run from {i}, unit {unit}, to {limit}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A pipeline's step costs the same however many micro-batches: composed for 2^20
    /// micro-batches (the most a scenario takes), it looks at exactly as many ops as for
    /// 2^10, and comes to the closed form's figures (one chunk: [`pipeline_stage`]) or,
    /// interleaved, to the same peak as 2^10 micro-batches.
    #[test]
    fn a_pipelines_cost_does_not_grow_with_its_micro_batches() {
        let chunk = |c: f64| Chunk {
            f: Seg {
                delta: Bytes::of(Cat::Activations, 10.0 * c),
                peak: Bytes::of(Cat::Activations, 10.0 * c + 3.0),
                at: at(Phase::FwdLayer),
            },
            b_new: Seg {
                delta: Bytes::of(Cat::Activations, -10.0 * c).plus(Bytes::of(Cat::Gradients, 7.0)),
                peak: Bytes::of(Cat::Temporaries, 5.0),
                at: at(Phase::BwdLayer),
            },
            b_acc: Seg {
                delta: Bytes::of(Cat::Activations, -10.0 * c),
                peak: Bytes::of(Cat::Temporaries, 5.0),
                at: at(Phase::BwdLayer),
            },
        };
        let chunks: Vec<Chunk> = (1..=4).map(|c| chunk(c as f64)).collect();
        let run = |schedule, pp: u64, r, m, v: u64| {
            LOOKED.with(|n| n.set(0));
            let ops = PipeOps::new(schedule, pp, r, m, v);
            let p = pipeline_loop(&chunks[..v as usize], &[], &ops, m, 0.0);
            (p.seg, LOOKED.with(Cell::get))
        };
        for (schedule, v) in [
            (PipeSchedule::GPipe, 1),
            (PipeSchedule::OneFOneB, 1),
            (PipeSchedule::OneFOneB, 2),
            (PipeSchedule::OneFOneB, 4),
        ] {
            for pp in [2, 4, 8] {
                for r in 0..pp {
                    let (few, looked_few) = run(schedule, pp, r, 1 << 10, v);
                    let (many, looked) = run(schedule, pp, r, 1 << 20, v);
                    let case = format!("{schedule:?} pp {pp} r {r} v {v}");
                    assert_eq!(looked, looked_few, "{case}");
                    assert!(looked < 100 * pp * v, "{case}: {looked} ops looked at");
                    assert_eq!(many.at.micro_batches, 1 << 20, "{case}");
                    if v == 1 {
                        let closed = pipeline_stage(&chunks[0], schedule, pp - 1 - r, 1 << 20, 0.0);
                        assert_eq!(
                            (many.peak, many.delta),
                            (closed.seg.peak, closed.seg.delta),
                            "{case}"
                        );
                    } else {
                        assert_eq!((many.peak, many.delta), (few.peak, few.delta), "{case}");
                    }
                }
            }
        }
    }

    /// Under FSDP2 too (units gathered and resharded as the schedule asks, gradients reduced
    /// on each chunk's last backward), through the estimate: with 2^20 micro-batches the
    /// stages' steps look at as many ops as with 2^10, and each stage's peak grows from 2^10
    /// to 2^20 exactly 1023 times what it grows from 2^10 to 2^11 (the receive buffers
    /// torch's stages make for every micro-batch).
    #[test]
    fn fsdp_pipelines_take_the_most_micro_batches_at_the_same_cost() {
        let interleaved =
            |v: u64| serde_json::json!({"schedule": "interleaved", "virtual_stages": v});
        for schedule in [serde_json::json!({}), interleaved(2), interleaved(4)] {
            let est = |m: u64| {
                let mut par =
                    serde_json::json!({"dp": 2, "pp": 4, "fsdp": "full_shard", "grad_accum": m});
                par.as_object_mut()
                    .unwrap()
                    .extend(schedule.as_object().unwrap().clone());
                let s = crate::Scenario::from_value(&serde_json::json!({
                    "model": "llama3.2-1b", "seq": 256, "parallel": par
                }))
                .unwrap();
                LOOKED.with(|n| n.set(0));
                let e = crate::estimate(&s).unwrap();
                let peaks: Vec<u64> = e.stages.iter().map(|s| s.peak_bytes).collect();
                (peaks, LOOKED.with(Cell::get))
            };
            let ((a, looked_a), (b, _), (c, looked_c)) = (est(1 << 10), est(1 << 11), est(1 << 20));
            assert_eq!(looked_c, looked_a, "{schedule}");
            assert!(looked_c > 0, "{schedule}");
            for i in 0..4 {
                assert_eq!(c[i] - a[i], 1023 * (b[i] - a[i]), "{schedule}: stage {i}");
            }
        }
    }
}
