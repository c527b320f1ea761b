//! A miniature of PyTorch's autograd memory behaviour.
//!
//! A [`Tape`] records one stretch of a model's forward pass (one decoder layer, the embedding, or
//! the head and loss) as ops over tensors. Each op states what PyTorch's autograd keeps alive
//! for its backward ("saved tensors"), which depends on which inputs require grad. [`Tape::run`]
//! then replays the forward and the backward with the lifetimes PyTorch gives those tensors and
//! reports where memory stands and how high it went, relative to the start.
//!
//! Memory is tracked per *storage*: views (split, chunk, transpose) share their base's storage,
//! and a storage is alive while any view of it is still to be used, is saved, or is held.

/// Index of a tensor on a tape.
pub type Tid = usize;

use crate::dtype::DType;
pub use crate::mem::{Bytes, Cat, Event, Local, Seg, Where, NCAT};

/// Running memory with its high-water mark (the breakdown there, and the op running), and
/// optionally every allocation and free.
struct Meter<'e> {
    live: Bytes,
    peak: Bytes,
    /// `peak.total()`, kept as it is set (each candidate is compared with it).
    top: f64,
    at: &'static str,
    trace: Option<&'e mut Vec<Event>>,
}

impl<'e> Meter<'e> {
    fn new(trace: Option<&'e mut Vec<Event>>) -> Self {
        Meter {
            live: Bytes::default(),
            peak: Bytes::default(),
            top: Bytes::default().total(),
            at: "",
            trace,
        }
    }
    fn record(&mut self, cat: Cat, b: f64, tag: Tag) {
        if let Some(t) = self.trace.as_deref_mut() {
            if b != 0.0 {
                t.push(Event {
                    bytes: b,
                    cat,
                    at: Where {
                        what: tag.what,
                        ..Where::default()
                    },
                    role: tag.role,
                    tensor: tag.tensor,
                    dtype: tag.dtype,
                    id: tag.id,
                    named: tag.named,
                });
            }
        }
    }
    /// A zero-byte event that says what `id` is for the allocator model (the stretch's
    /// input, its output, a tensor the caller frees).
    fn marker(&mut self, id: Local, role: &'static str) {
        if cfg!(target_arch = "wasm32") {
            return;
        }
        if let Some(t) = self.trace.as_deref_mut() {
            t.push(Event {
                bytes: 0.0,
                cat: Cat::Temporaries,
                at: Where::default(),
                role,
                tensor: "",
                dtype: None,
                id,
                named: false,
            });
        }
    }
    fn add(&mut self, cat: Cat, b: f64, tag: Tag) {
        self.live.add(cat, b);
        self.record(cat, b, tag);
    }
    /// `b` bytes already counted as `from` count as `to` from now on (a gradient in flight
    /// that becomes `.grad`): no allocation.
    fn recat(&mut self, from: Cat, to: Cat, b: f64) {
        self.live.add(from, -b);
        self.live.add(to, b);
    }
    fn sub(&mut self, cat: Cat, b: f64, tag: Tag) {
        self.live.add(cat, -b);
        self.record(cat, -b, tag);
    }
    /// Record the current point as a candidate peak.
    fn mark_now(&mut self, what: &'static str) {
        let now = self.live.total();
        if now > self.top {
            self.peak = self.live;
            self.top = now;
            self.at = what;
        }
    }
    /// Set the high-water mark.
    fn set_peak(&mut self, peak: Bytes) {
        self.peak = peak;
        self.top = peak.total();
    }
    /// Record the current point (plus a transient) as a candidate peak.
    fn mark(&mut self, transient: Bytes, what: &'static str) {
        let now = self.live.plus(transient);
        let total = now.total();
        if total > self.top {
            self.peak = now;
            self.top = total;
            self.at = what;
        }
        if transient.total() > 0.0 {
            for c in Cat::ALL {
                let b = transient.get(c);
                if b > 0.0 {
                    let tag = Tag::new(what, "workspace");
                    self.record(c, b, tag);
                    self.record(c, -b, tag);
                }
            }
        }
    }
    fn seg(&self, start: Bytes) -> Seg {
        Seg {
            delta: self.live.minus(start),
            peak: self.peak.minus(start),
            at: Where {
                what: self.at,
                ..Where::default()
            },
        }
    }
}

/// What an allocation or a free is, for a trace: the op running, the tensor's role, and
/// the tensor itself (the op that made it, its dtype, its identity for the allocator model)
/// when it is one.
#[derive(Clone, Copy)]
struct Tag {
    what: &'static str,
    role: &'static str,
    tensor: &'static str,
    dtype: Option<DType>,
    id: Local,
    /// The op running named itself (a module: a linear layer), not only its scope.
    named: bool,
}

impl Tag {
    fn new(what: &'static str, role: &'static str) -> Tag {
        Tag {
            what,
            role,
            tensor: "",
            dtype: None,
            id: Local::Temp,
            named: false,
        }
    }

    /// The same, for allocator identity `id`.
    fn id(self, id: Local) -> Tag {
        Tag { id, ..self }
    }
}

#[derive(Clone, Debug)]
struct Tensor {
    storage: usize,
    bytes: f64,
    rg: bool,
}

#[derive(Clone, Debug)]
struct Storage {
    bytes: f64,
    cat: Cat,
    dtype: DType,
    /// The op that made it.
    name: &'static str,
    /// Alive from the start (the input of the stretch); not allocated by the tape.
    external: bool,
    /// Kept alive until the end of the stretch's forward even when no op uses it any more
    /// (a caller's reference, e.g. the decoder layer's input held by the model's loop).
    held: bool,
    /// Never released by the stretch (the user keeps a reference: `out.logits`).
    kept: bool,
    /// Kept by PyTorch's autocast weight cache until autocast exits (end of the forward).
    cached: bool,
    /// Held by a local of the model's forward (the eager attention mask, GPT-2's position
    /// embeddings): gone when the model's forward returns, which the caller accounts for.
    local: bool,
    /// The last op that takes a view of it as an input (kept as ops are recorded).
    last_use: Option<u32>,
    /// The first op that saves a view of it for its backward: it is released after that
    /// op's backward. `None`: no op saves it.
    first_saver: Option<u32>,
}

/// A short list of tensor ids kept inline (ops have at most a handful of each), as `u32`s:
/// an op is copied as its tape grows.
#[derive(Clone, Copy, Debug, Default)]
struct Ids {
    n: u8,
    v: [u32; 6],
}

impl Ids {
    fn from(ts: &[Tid]) -> Ids {
        assert!(ts.len() <= 6, "an op lists at most 6 tensors");
        let mut x = Ids::default();
        for &t in ts {
            x.push(t);
        }
        x
    }
    fn push(&mut self, t: Tid) {
        self.v[self.n as usize] = t as u32;
        self.n += 1;
    }
    fn iter(&self) -> impl Iterator<Item = Tid> + '_ {
        self.v[..self.n as usize].iter().map(|&t| t as Tid)
    }
}

#[derive(Clone, Debug, Default)]
struct Op {
    name: &'static str,
    /// The spec named the op itself (else it takes the module it runs in: [`Tape::scope`]).
    named: bool,
    inputs: Ids,
    outputs: Ids,
    saved: Ids,
    fwd_temp: f64,
    bwd_temp: f64,
    param_grads: f64,
    passthrough: bool,
    grad_in_saved: bool,
    grad_view: bool,
    grad_views: bool,
    tied_grad: f64,
    tied_in_place: bool,
    tied_head: bool,
    bwd_pre: [f64; 2],
    bwd_stack: [f64; 4],
    param_last: f64,
}

/// Where memory stood and peaked while replaying a stretch, relative to its start.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Profile {
    /// Forward: net change from start to end (saved tensors + output − freed input) and the
    /// highest point.
    pub fwd: Seg,
    /// Autocast-cached weight copies alive at the end of the forward that no op saved; they
    /// leave when the whole forward leaves autocast. Included in `fwd.delta`.
    pub fwd_cached: Bytes,
    /// Bytes of the stretch's output tensor (included in `fwd.delta`).
    pub out_bytes: f64,
    /// The stretch's input is still alive at the end of its forward (some op saved it).
    pub input_kept: bool,
    /// Backward: the highest point above the backward's start, which holds the saved tensors
    /// and the grad of the output, not the output itself; net change (param grads + input
    /// grad − saved − output grad).
    pub bwd: Seg,
}

/// How a stretch is replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ordinary autograd: saved tensors live until their backward.
    Normal,
    /// Activation checkpointing (non-reentrant, whole stretch): the forward saves nothing but
    /// keeps its input; the backward first recomputes the forward (saving), then runs backward.
    Checkpointed,
    /// No autograd at all (inference under `torch.no_grad()`): nothing is saved.
    NoGrad,
}

/// What happens to the parameter gradients a backward computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grads {
    /// They become the parameters' `.grad` (none existed: `zero_grad(set_to_none=True)`).
    New,
    /// `.grad` already exists (a later micro-batch of gradient accumulation): each is added
    /// into it in place and the freshly computed one is freed.
    Accumulate,
    /// The framework reduces them into a buffer of its own (Megatron's `main_grad`): each
    /// lives only while it is added in.
    IntoBuffer,
}

/// Arguments of [`Tape::op`].
#[derive(Clone, Copy, Debug)]
pub struct OpSpec<'a> {
    /// What the op is, for the timeline (`"mlp.up_proj"`, `"softmax"`).
    pub name: &'static str,
    pub inputs: &'a [Tid],
    pub out_bytes: f64,
    pub saved: &'a [Tid],
    pub cat: Cat,
    pub weights_rg: bool,
    /// Bytes of parameter gradients the op's backward leaves in `.grad`.
    pub param_grads: f64,
    /// Temporaries alive only while the op runs forward.
    pub fwd_temp: f64,
    /// Temporaries alive only while the op runs backward (workspace, dequantised weights, a
    /// low-precision weight grad before its cast).
    pub bwd_temp: f64,
    /// The op's input grads are its output grad itself (add): no allocation.
    pub passthrough: bool,
    /// The backward writes its input's gradient into the storage it saved (Megatron's
    /// vocabulary-parallel cross-entropy turns the saved softmax into the gradient in
    /// place): no allocation, the saved storage lives on as the gradient.
    pub grad_in_saved: bool,
    /// The gradient the backward makes for its input is a view whose base stays alive (a
    /// linear layer's: `mm`'s output reshaped to the input's shape): autograd cannot sum a
    /// later gradient of that input into it in place (`InputBuffer::accumulate` in
    /// torch/csrc/autograd/input_buffer.cpp wants the only reference to a dense tensor and
    /// its storage), so it adds the two into a new tensor.
    pub grad_view: bool,
    /// What few ops need (temporaries of their backward, tied weights' gradients, a second
    /// output): behind a reference, so that the many ops that need none stay small.
    pub extra: &'a OpExtra,
}

impl Default for OpSpec<'_> {
    fn default() -> Self {
        OpSpec {
            name: "",
            inputs: &[],
            out_bytes: 0.0,
            saved: &[],
            cat: Cat::Activations,
            weights_rg: false,
            param_grads: 0.0,
            fwd_temp: 0.0,
            bwd_temp: 0.0,
            passthrough: false,
            grad_in_saved: false,
            grad_view: false,
            extra: &OpExtra::NONE,
        }
    }
}

/// The rarer parts of an [`OpSpec`].
#[derive(Clone, Copy, Debug)]
pub struct OpExtra {
    /// The gradients of the op's inputs are views of its output's gradient (`cat`'s
    /// backward): nothing is allocated, and each keeps the output's gradient alive.
    pub grad_views: bool,
    /// Bytes of a tied parameter's gradient that the backward's weight gradient is summed
    /// into out of place: the tied head's `.grad` is a view (`mm`'s output transposed), so
    /// autograd makes the sum (the parameter's new `.grad`) and frees both addends. Zero when
    /// the sum happens in place (`tied_in_place`).
    pub tied_grad: f64,
    /// The tied weight's gradient is summed into the other use's in place (that one is a
    /// tensor of its own: under autocast, the fp32 copy of the head's bf16 gradient).
    pub tied_in_place: bool,
    /// The op's parameter gradient is also a tied weight's (the LM head's, tied to the
    /// embedding): autograd holds it until the embedding's gradient is summed in, also
    /// when `.grad` already exists (gradient accumulation).
    pub tied_head: bool,
    /// Temporaries the backward makes before the op's gradients and frees after them, in
    /// reverse order (`pow`'s backward: `x.pow(1)` and its product with the exponent).
    pub bwd_pre: [f64; 2],
    /// Temporaries the backward makes one after the other after the op's gradients and
    /// frees in reverse order (flash attention's `softmax_d`, fp32 `dq` accumulator, and
    /// the per-query-head `dk` and `dv` of grouped-query attention).
    pub bwd_stack: [f64; 4],
    /// The parameter gradient is the reduction of a product of this many bytes made after
    /// the input's gradient (an elementwise weight: `(grad * x).sum(...)`): the product, then
    /// the parameter gradient, then the product freed. Zero: the parameter gradient comes
    /// first (a linear layer's `mm`).
    pub param_last: f64,
    /// A second output of this many bytes the op keeps for its own backward (flash
    /// attention's logsumexp).
    pub aux_out: f64,
}

impl OpExtra {
    /// None of them.
    pub const NONE: OpExtra = OpExtra {
        grad_views: false,
        tied_grad: 0.0,
        tied_in_place: false,
        tied_head: false,
        bwd_pre: [0.0; 2],
        bwd_stack: [0.0; 4],
        param_last: 0.0,
        aux_out: 0.0,
    };
}

/// A tensor autograd keeps for a stretch's backward ([`Tape::saved`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SavedTensor {
    /// The op that made it ("input" for the stretch's input).
    pub made_by: &'static str,
    /// The ops that save it.
    pub saved_by: Vec<&'static str>,
    pub bytes: f64,
    pub dtype: DType,
    pub cat: Cat,
    /// It is the stretch's input (made before the stretch).
    pub input: bool,
    order: usize,
}

#[derive(Default, Debug, Clone)]
pub struct Tape {
    tensors: Vec<Tensor>,
    storages: Vec<Storage>,
    ops: Vec<Op>,
    output: Option<Tid>,
    /// The name ops take when their spec gives none: the module being recorded
    /// (`"input_layernorm"`, `"mlp.act_fn"`), for the timeline's labels.
    scope: &'static str,
}

impl Tape {
    /// An empty tape, sized for a decoder layer's ops (a few dozen) so that recording one
    /// rarely grows it.
    pub fn new() -> Self {
        Tape {
            tensors: Vec::with_capacity(64),
            storages: Vec::with_capacity(64),
            ops: Vec::with_capacity(64),
            ..Self::default()
        }
    }

    fn new_storage(
        &mut self,
        bytes: f64,
        rg: bool,
        external: bool,
        cat: Cat,
        name: &'static str,
    ) -> Tid {
        self.storages.push(Storage {
            bytes,
            cat,
            dtype: DType::F32,
            name,
            external,
            held: false,
            kept: false,
            cached: false,
            local: false,
            last_use: None,
            first_saver: None,
        });
        self.tensors.push(Tensor {
            storage: self.storages.len() - 1,
            bytes,
            rg,
        });
        self.tensors.len() - 1
    }

    /// Op `i` takes `ts` as inputs.
    fn used(&mut self, ts: Ids, i: usize) {
        for t in ts.iter() {
            let s = self.tensors[t].storage;
            self.storages[s].last_use = Some(i as u32);
        }
    }

    /// Op `i` saves `t` for its backward.
    fn saved_by(&mut self, t: Tid, i: usize) {
        let s = self.tensors[t].storage;
        let st = &mut self.storages[s];
        if st.first_saver.is_none() {
            st.first_saver = Some(i as u32);
        }
    }

    /// Empty again, as [`Tape::new`] makes one, keeping what it allocated.
    pub fn clear(&mut self) {
        self.tensors.clear();
        self.storages.clear();
        self.ops.clear();
        self.output = None;
        self.scope = "";
    }

    /// The stretch's input: already in memory when the stretch starts.
    pub fn input(&mut self, bytes: f64, rg: bool) -> Tid {
        self.input_cat(bytes, rg, Cat::Activations, "input")
    }

    /// An input counted as `cat` and named as the stretch that made it names it (the
    /// logits a loss stretch takes: `lm_head`).
    pub fn input_cat(&mut self, bytes: f64, rg: bool, cat: Cat, name: &'static str) -> Tid {
        self.new_storage(bytes, rg, true, cat, name)
    }

    /// The name of what made `t` (its op, or `input`).
    pub fn name_of(&self, t: Tid) -> &'static str {
        self.storages[self.tensors[t].storage].name
    }

    fn storage_mut(&mut self, t: Tid) -> &mut Storage {
        let s = self.tensors[t].storage;
        &mut self.storages[s]
    }

    /// Record the dtype of `t`'s storage (for the timeline's labels).
    pub fn set_dtype(&mut self, t: Tid, d: DType) {
        self.storage_mut(t).dtype = d;
    }

    /// Count `t`'s storage as `cat` (the KV cache a layer fills).
    pub fn set_cat(&mut self, t: Tid, cat: Cat) {
        self.storage_mut(t).cat = cat;
    }

    /// Keep `t` alive until the end of this stretch's forward.
    pub fn hold(&mut self, t: Tid) {
        self.storage_mut(t).held = true;
    }

    /// `t` is referenced by a local of the model's forward, which outlives this stretch: it
    /// leaves the stretch as a held tensor does, marked for the caller (`"model local"`).
    pub fn hold_local(&mut self, t: Tid) {
        let st = self.storage_mut(t);
        st.held = true;
        st.local = true;
    }

    /// `t` is never released by this stretch (the caller keeps it).
    pub fn keep(&mut self, t: Tid) {
        self.storage_mut(t).kept = true;
    }

    /// `t` is held by the autocast weight cache until the forward ends.
    pub fn cache(&mut self, t: Tid) {
        self.storage_mut(t).cached = true;
    }

    pub fn set_output(&mut self, t: Tid) {
        self.output = Some(t);
    }

    pub fn requires_grad(&self, t: Tid) -> bool {
        self.tensors[t].rg
    }

    pub fn bytes(&self, t: Tid) -> f64 {
        self.tensors[t].bytes
    }

    /// The category tensor `t`'s storage counts in.
    pub fn cat(&self, t: Tid) -> Cat {
        self.storages[self.tensors[t].storage].cat
    }

    /// Name the ops recorded from now on that name themselves nothing (the module they are
    /// part of); returns the previous scope.
    pub fn scope(&mut self, name: &'static str) -> &'static str {
        std::mem::replace(&mut self.scope, name)
    }

    /// Record an op producing one new tensor.
    pub fn op(&mut self, spec: OpSpec<'_>) -> Tid {
        let rg = spec.weights_rg || spec.inputs.iter().any(|&t| self.tensors[t].rg);
        let name = if spec.name.is_empty() {
            self.scope
        } else {
            spec.name
        };
        let out = self.new_storage(spec.out_bytes, rg, false, spec.cat, name);
        // An op saves only what some grad needs: nothing when nothing requires grad.
        let mut saved = if rg {
            Ids::from(spec.saved)
        } else {
            Ids::default()
        };
        let mut outputs = Ids::from(&[out]);
        if spec.extra.aux_out > 0.0 {
            let aux = self.new_storage(spec.extra.aux_out, false, false, spec.cat, name);
            outputs.push(aux);
            if rg {
                saved.push(aux);
            }
        }
        let i = self.ops.len();
        let inputs = Ids::from(spec.inputs);
        self.used(inputs, i);
        for t in saved.iter() {
            self.saved_by(t, i);
        }
        self.ops.push(Op {
            name,
            named: !spec.name.is_empty(),
            inputs,
            outputs,
            saved,
            fwd_temp: spec.fwd_temp,
            bwd_temp: spec.bwd_temp,
            param_grads: if spec.weights_rg {
                spec.param_grads
            } else {
                0.0
            },
            passthrough: spec.passthrough,
            grad_in_saved: spec.grad_in_saved,
            grad_view: spec.grad_view,
            grad_views: spec.extra.grad_views,
            tied_grad: if spec.weights_rg {
                spec.extra.tied_grad
            } else {
                0.0
            },
            tied_in_place: spec.extra.tied_in_place,
            tied_head: spec.extra.tied_head,
            bwd_pre: spec.extra.bwd_pre,
            bwd_stack: spec.extra.bwd_stack,
            param_last: spec.extra.param_last,
        });
        out
    }

    /// A Python reference to `ts` ends here (a local going out of scope): they stay alive up
    /// to this point of the forward.
    pub fn touch(&mut self, ts: &[Tid]) {
        for chunk in ts.chunks(6) {
            let inputs = Ids::from(chunk);
            self.used(inputs, self.ops.len());
            self.ops.push(Op {
                inputs,
                ..Op::default()
            });
        }
    }

    /// The op that just produced `t` also saves `t` itself (softmax, tanh, log_softmax).
    pub fn save_self(&mut self, t: Tid) {
        if self.tensors[t].rg {
            if let Some(op) = self.ops.last_mut() {
                op.saved.push(t);
                self.saved_by(t, self.ops.len() - 1);
            }
        }
    }

    /// Split `x` into views of the given byte sizes (same storage).
    pub fn split(&mut self, x: Tid, parts: &[f64]) -> Vec<Tid> {
        let storage = self.tensors[x].storage;
        let rg = self.tensors[x].rg;
        let views: Vec<Tid> = parts
            .iter()
            .map(|&bytes| {
                self.tensors.push(Tensor { storage, bytes, rg });
                self.tensors.len() - 1
            })
            .collect();
        let inputs = Ids::from(&[x]);
        self.used(inputs, self.ops.len());
        self.ops.push(Op {
            name: "split",
            inputs,
            outputs: Ids::from(&views),
            ..Op::default()
        });
        views
    }

    /// Temporaries the last op's backward allocates for itself.
    pub fn set_bwd_temp_last(&mut self, b: f64) {
        if let Some(op) = self.ops.last_mut() {
            op.bwd_temp = b;
        }
    }

    /// A trace tag for storage `s` (its maker and dtype) while `what` runs.
    fn tag(&self, s: usize, what: &'static str, role: &'static str) -> Tag {
        let st = &self.storages[s];
        Tag {
            what,
            role,
            tensor: st.name,
            dtype: Some(st.dtype),
            id: Local::Storage(s as u32),
            named: false,
        }
    }

    /// A trace tag for tensor `t`'s storage.
    fn tag_of(&self, t: Tid, what: &'static str, role: &'static str) -> Tag {
        self.tag(self.tensors[t].storage, what, role)
    }

    /// Every storage some op saves for its backward, in the order they are made: what the
    /// stretch keeps for autograd (views of one storage counted once).
    pub fn saved(&self) -> Vec<SavedTensor> {
        let mut v: Vec<SavedTensor> = Vec::new();
        let mut at: Vec<Option<usize>> = vec![None; self.storages.len()];
        for o in &self.ops {
            for t in o.saved.iter() {
                let s = self.tensors[t].storage;
                let st = &self.storages[s];
                match at[s] {
                    Some(i) => {
                        if !v[i].saved_by.contains(&o.name) {
                            v[i].saved_by.push(o.name);
                        }
                    }
                    None => {
                        at[s] = Some(v.len());
                        v.push(SavedTensor {
                            made_by: st.name,
                            saved_by: vec![o.name],
                            bytes: st.bytes,
                            dtype: st.dtype,
                            cat: st.cat,
                            input: st.external,
                            order: s,
                        });
                    }
                }
            }
        }
        crate::order::sort_by(&mut v, |a, b| a.order.cmp(&b.order));
        v
    }

    /// Replay forward then backward.
    pub fn run(&self, mode: Mode) -> Profile {
        self.replay(mode, Grads::New, None)
    }

    /// Replay forward then backward, with what becomes of the parameter gradients, and
    /// optionally every allocation and free in order (forward's, then backward's; the
    /// backward's events follow one `Where::what == "backward"` marker with zero bytes).
    pub fn replay(&self, mode: Mode, grads: Grads, mut trace: Option<&mut Vec<Event>>) -> Profile {
        let out = self.output.expect("a tape has an output");
        let out_storage = self.tensors[out].storage;
        let mut prof = Profile {
            out_bytes: self.tensors[out].bytes,
            ..Profile::default()
        };
        let saving = mode == Mode::Normal;
        let (fm_seg, alive_fwd) = {
            let mut fm = Meter::new(trace.as_deref_mut());
            for (s, st) in self.storages.iter().enumerate() {
                if st.external {
                    fm.marker(Local::Storage(s as u32), "input");
                }
            }
            let alive = self.forward(&mut fm, saving, mode == Mode::Checkpointed);
            fm.marker(Local::Storage(out_storage as u32), "output");
            for (s, st) in self.storages.iter().enumerate() {
                if alive[s] && st.cached && !(saving && st.first_saver.is_some()) {
                    fm.marker(Local::Storage(s as u32), "autocast cache");
                }
                if alive[s] && st.kept {
                    fm.marker(Local::Storage(s as u32), "kept");
                }
            }
            (fm.seg(Bytes::default()), alive)
        };
        prof.fwd = fm_seg;
        prof.input_kept = self
            .storages
            .iter()
            .enumerate()
            .any(|(s, st)| st.external && alive_fwd[s]);
        prof.fwd_cached = self.cached_unsaved(&alive_fwd, saving);
        if mode == Mode::NoGrad {
            return prof;
        }
        if let Some(t) = trace.as_deref_mut() {
            t.push(Event {
                bytes: 0.0,
                cat: Cat::Temporaries,
                at: Where {
                    what: "backward",
                    ..Where::default()
                },
                role: "",
                tensor: "",
                dtype: None,
                id: Local::Temp,
                named: false,
            });
        }
        let grad_out = if self.tensors[out].rg {
            self.tensors[out].bytes
        } else {
            0.0
        };
        let out_cat = self.storages[out_storage].cat;
        let out_name = self.storages[out_storage].name;
        // The backward's start: what the forward left, less the output (owned by the next
        // stretch) and the autocast cache (gone when autocast exits), plus the output's grad.
        // Events before the start are not recorded: the caller accounts for them.
        let mut m = Meter::new(None);
        let mut alive;
        let start: Bytes;
        match mode {
            Mode::Normal => {
                alive = alive_fwd;
                m.live = prof.fwd.delta.minus(prof.fwd_cached);
                for (s, st) in self.storages.iter().enumerate() {
                    if alive[s] && st.cached && st.first_saver.is_none() {
                        alive[s] = false;
                    }
                }
                if alive[out_storage] && !self.storages[out_storage].kept {
                    m.sub(
                        out_cat,
                        self.storages[out_storage].bytes,
                        self.tag(out_storage, out_name, "output"),
                    );
                    alive[out_storage] = false;
                }
                m.add(
                    Cat::Temporaries,
                    grad_out,
                    self.tag(out_storage, out_name, "grad of output")
                        .id(Local::Grad(0)),
                );
                start = m.live;
                m.trace = trace;
                if grad_out > 0.0 {
                    m.marker(Local::Grad(0), "grad of output");
                }
            }
            _ => {
                // Checkpointed: the held input and the output's grad; recompute with saving.
                m.add(
                    Cat::Temporaries,
                    grad_out,
                    self.tag(out_storage, out_name, "grad of output")
                        .id(Local::Grad(0)),
                );
                start = m.live;
                m.trace = trace;
                if grad_out > 0.0 {
                    m.marker(Local::Grad(0), "grad of output");
                }
                let base = m.live;
                m.live = Bytes::default();
                m.set_peak(Bytes::default());
                let a = self.forward(&mut m, true, true);
                m.set_peak(base.plus(m.peak));
                m.live = base.plus(m.live);
                alive = a;
                if alive[out_storage] && !self.storages[out_storage].kept {
                    m.sub(
                        out_cat,
                        self.storages[out_storage].bytes,
                        self.tag(out_storage, out_name, "output"),
                    );
                    alive[out_storage] = false;
                }
            }
        }
        m.mark(Bytes::default(), out_name);
        let grad_of = self.backward(&mut alive, &mut m, out, grads);
        for (t, g) in grad_of.iter().enumerate() {
            if let Some(g) = g {
                if self.storages[self.tensors[t].storage].external {
                    m.marker(Local::Grad(*g as u32), "grad of input");
                }
            }
        }
        if mode == Mode::Checkpointed {
            // The checkpoint releases its held input after the stretch's backward.
            for (s, st) in self.storages.iter().enumerate() {
                if st.external && alive[s] {
                    m.sub(
                        st.cat,
                        st.bytes,
                        self.tag(s, "checkpoint", "input held by the checkpoint"),
                    );
                }
            }
        }
        prof.bwd = m.seg(start);
        prof
    }

    fn cached_unsaved(&self, alive: &[bool], saving: bool) -> Bytes {
        let mut b = Bytes::default();
        for (s, st) in self.storages.iter().enumerate() {
            if alive[s] && st.cached && !(saving && st.first_saver.is_some()) {
                b.add(st.cat, st.bytes);
            }
        }
        b
    }

    /// Forward replay from the meter's current point (the external input counts as already
    /// there). Returns which storages are alive at the end.
    fn forward(&self, m: &mut Meter<'_>, saving: bool, hold_inputs: bool) -> Vec<bool> {
        let n = self.storages.len();
        let out_storage = self.output.map(|t| self.tensors[t].storage);
        let is_saved = |s: usize| self.storages[s].first_saver.is_some();
        let keep = |s: usize| -> bool {
            let st = &self.storages[s];
            (saving && is_saved(s))
                || Some(s) == out_storage
                || st.cached
                || st.kept
                || (hold_inputs && st.external)
        };
        let role = |s: usize| {
            if saving && is_saved(s) {
                "saved for backward"
            } else if Some(s) == out_storage {
                "output"
            } else {
                "intermediate"
            }
        };
        let mut alive: Vec<bool> = self.storages.iter().map(|s| s.external).collect();
        let mut created = vec![false; n];
        for (i, op) in self.ops.iter().enumerate() {
            for t in op.outputs.iter() {
                let s = self.tensors[t].storage;
                if !alive[s] && !created[s] {
                    alive[s] = true;
                    created[s] = true;
                    m.add(
                        self.storages[s].cat,
                        self.storages[s].bytes,
                        Tag {
                            named: op.named,
                            ..self.tag(s, op.name, role(s))
                        },
                    );
                }
            }
            if op.fwd_temp > 0.0 {
                m.mark(Bytes::of(Cat::Temporaries, op.fwd_temp), op.name);
            } else {
                m.mark_now(op.name);
            }
            for t in op.inputs.iter().chain(op.outputs.iter()) {
                let s = self.tensors[t].storage;
                let used_later = self.storages[s].last_use.is_some_and(|u| u as usize > i);
                if alive[s] && !used_later && !keep(s) && !self.storages[s].held {
                    alive[s] = false;
                    m.sub(
                        self.storages[s].cat,
                        self.storages[s].bytes,
                        self.tag(s, op.name, role(s)),
                    );
                }
            }
        }
        for (s, st) in self.storages.iter().enumerate() {
            if alive[s] && st.held && !keep(s) {
                alive[s] = false;
                m.sub(
                    st.cat,
                    st.bytes,
                    self.tag(
                        s,
                        "end of forward",
                        if st.local {
                            "model local"
                        } else {
                            "held input"
                        },
                    ),
                );
            }
        }
        alive
    }

    /// Backward replay (saved tensors alive as in `alive`, the grad of `out` present).
    /// Gradient buffers are refcounted: an add hands the same buffer to both its inputs, as
    /// autograd does.
    ///
    /// Each op's backward runs as autograd's engine runs a node: the op's gradients are made
    /// (parameter gradients, then one per input), its workspace comes and goes, the gradient
    /// it received and the tensors it was the last to need are released, and then each new
    /// gradient of an input that already had one is summed into it (`InputBuffer::add`): in
    /// place when the earlier gradient is the only reference to a dense tensor of its own,
    /// else into a new tensor, the two addends freed.
    /// Returns the gradient buffer each tensor is left with (its inputs' gradients).
    fn backward(
        &self,
        alive: &mut [bool],
        m: &mut Meter<'_>,
        out: Tid,
        grads: Grads,
    ) -> Vec<Option<usize>> {
        /// A gradient buffer: the grad of a logits tensor counts as logits; `view`: a view
        /// of a larger tensor, never summed into in place.
        struct GBuf {
            bytes: f64,
            refs: u32,
            cat: Cat,
            view: bool,
        }
        /// A new buffer, allocated now.
        #[allow(clippy::too_many_arguments)]
        fn buf(
            gbuf: &mut Vec<GBuf>,
            m: &mut Meter<'_>,
            bytes: f64,
            cat: Cat,
            view: bool,
            tag: Tag,
        ) -> usize {
            gbuf.push(GBuf {
                bytes,
                refs: 1,
                cat,
                view,
            });
            let g = gbuf.len() - 1;
            m.add(cat, bytes, tag.id(Local::Grad(g as u32)));
            g
        }
        let nt = self.tensors.len();
        // Gradient buffers: up to about one and a half per tensor.
        let mut gbuf: Vec<GBuf> = Vec::with_capacity(2 * self.tensors.len());
        let grad_cat = |t: Tid| match self.storages[self.tensors[t].storage].cat {
            Cat::Logits => Cat::Logits,
            _ => Cat::Temporaries,
        };
        let mut grad_of: Vec<Option<usize>> = vec![None; nt];
        // Storages released after each op's backward: those it is the earliest saver of.
        let first_saver = |s: usize| self.storages[s].first_saver.map(|i| i as usize);
        if self.tensors[out].rg {
            gbuf.push(GBuf {
                bytes: self.tensors[out].bytes,
                refs: 1,
                cat: grad_cat(out),
                view: false,
            });
            grad_of[out] = Some(0);
        }
        for (i, op) in self.ops.iter().enumerate().rev() {
            let incoming = op.outputs.iter().find_map(|t| grad_of[t]);
            // New gradients of inputs that already have one: (input, new buffer).
            let mut pending: [(Tid, usize); 6] = [(0, 0); 6];
            let mut npending = 0;
            // A tied weight's gradient summed into the other use's.
            let mut tied = None;
            if let Some(first_in) = incoming {
                let mut temp = op.bwd_temp;
                // A buffer of the backward's own (a temporary, a tied weight's gradient).
                let own = |gbuf: &mut Vec<GBuf>, m: &mut Meter<'_>, b: f64, role| {
                    buf(gbuf, m, b, Cat::Temporaries, false, Tag::new(op.name, role))
                };
                let mut pre = [usize::MAX; 2];
                for (k, &b) in op.bwd_pre.iter().enumerate() {
                    if b > 0.0 {
                        pre[k] = own(&mut gbuf, m, b, "temporary");
                    }
                }
                let params_now = op.param_last <= 0.0;
                let param_tag = Tag {
                    tensor: op.name,
                    ..Tag::new(op.name, "parameter gradient")
                }
                .id(Local::ParamGrad(i as u32));
                // A tied head's gradient waits in autograd's buffer for the embedding's (not
                // yet `.grad`: counted as a temporary).
                match grads {
                    _ if op.tied_head && params_now => {
                        m.add(Cat::Temporaries, op.param_grads, param_tag)
                    }
                    Grads::New if params_now => m.add(Cat::Gradients, op.param_grads, param_tag),
                    Grads::New => {}
                    Grads::Accumulate | Grads::IntoBuffer => {
                        if params_now {
                            temp += op.param_grads;
                        }
                    }
                }
                if op.tied_grad > 0.0 {
                    tied = Some(own(&mut gbuf, m, op.tied_grad, "tied weight's gradient"));
                }
                for t in op.inputs.iter() {
                    if !self.tensors[t].rg {
                        continue;
                    }
                    let b = self.tensors[t].bytes;
                    match (grad_of[t], op.passthrough) {
                        (Some(_), true) => {}
                        (Some(_), false) => {
                            let g = buf(
                                &mut gbuf,
                                m,
                                b,
                                grad_cat(t),
                                op.grad_view,
                                self.tag_of(t, op.name, "grad of input"),
                            );
                            pending[npending] = (t, g);
                            npending += 1;
                        }
                        (None, _) if op.grad_views => {
                            let g = first_in;
                            gbuf[g].refs += 1;
                            grad_of[t] = Some(g);
                        }
                        (None, true) if b == gbuf[first_in].bytes => {
                            let g = first_in;
                            gbuf[g].refs += 1;
                            grad_of[t] = Some(g);
                        }
                        (None, true) => {
                            // An input of another dtype or a broadcast one: autograd casts
                            // or sums the gradient to its shape, a new tensor
                            // (`validate_outputs`).
                            let g = buf(
                                &mut gbuf,
                                m,
                                b,
                                grad_cat(t),
                                false,
                                self.tag_of(t, op.name, "grad of input"),
                            );
                            grad_of[t] = Some(g);
                        }
                        (None, false) => {
                            let reuse = op.saved.iter().next().map(|x| self.tensors[x].storage);
                            match reuse {
                                Some(s)
                                    if op.grad_in_saved
                                        && alive[s]
                                        && first_saver(s) == Some(i) =>
                                {
                                    // The saved storage becomes the gradient.
                                    alive[s] = false;
                                    m.sub(
                                        self.storages[s].cat,
                                        self.storages[s].bytes,
                                        self.tag(s, op.name, "saved for backward"),
                                    );
                                    buf(
                                        &mut gbuf,
                                        m,
                                        self.storages[s].bytes,
                                        grad_cat(t),
                                        false,
                                        self.tag_of(t, op.name, "grad of input"),
                                    );
                                }
                                _ => {
                                    buf(
                                        &mut gbuf,
                                        m,
                                        b,
                                        grad_cat(t),
                                        op.grad_view,
                                        self.tag_of(t, op.name, "grad of input"),
                                    );
                                }
                            }
                            grad_of[t] = Some(gbuf.len() - 1);
                        }
                    }
                }
                if !params_now {
                    // The product, reduced to the parameter's gradient.
                    let p = own(&mut gbuf, m, op.param_last, "temporary");
                    match grads {
                        Grads::New => m.add(Cat::Gradients, op.param_grads, param_tag),
                        _ => temp += op.param_grads,
                    }
                    m.mark_now(op.name);
                    m.sub(
                        Cat::Temporaries,
                        op.param_last,
                        Tag::new(op.name, "temporary").id(Local::Grad(p as u32)),
                    );
                }
                if temp > 0.0 {
                    m.mark(Bytes::of(Cat::Temporaries, temp), op.name);
                } else {
                    m.mark_now(op.name);
                }
                let mut stack = [usize::MAX; 4];
                for (k, &b) in op.bwd_stack.iter().enumerate() {
                    if b > 0.0 {
                        stack[k] = own(&mut gbuf, m, b, "temporary");
                    }
                }
                if stack.iter().any(|&g| g != usize::MAX) {
                    m.mark_now(op.name);
                }
                for &g in stack.iter().rev().chain(pre.iter().rev()) {
                    if g != usize::MAX {
                        m.sub(
                            Cat::Temporaries,
                            gbuf[g].bytes,
                            Tag::new(op.name, "temporary").id(Local::Grad(g as u32)),
                        );
                    }
                }
                for t in op.outputs.iter() {
                    if let Some(g) = grad_of[t].take() {
                        gbuf[g].refs -= 1;
                        if gbuf[g].refs == 0 {
                            m.sub(
                                gbuf[g].cat,
                                gbuf[g].bytes,
                                self.tag_of(t, op.name, "grad of output")
                                    .id(Local::Grad(g as u32)),
                            );
                        }
                    }
                }
            }
            // What this op was the last to need goes, in the order the op saved it (autograd
            // releases a node's saved tensors last argument first: `mm`'s weight before its
            // input, `mul`'s other operand before self, which the ops list first).
            for t in op.saved.iter() {
                let s = self.tensors[t].storage;
                if first_saver(s) == Some(i) && alive[s] && !self.storages[s].kept {
                    alive[s] = false;
                    m.sub(
                        self.storages[s].cat,
                        self.storages[s].bytes,
                        self.tag(s, op.name, "saved for backward"),
                    );
                }
            }
            if let Some(g) = tied {
                // The tied weight's gradient so far (the head's, waiting in autograd's
                // buffer) and this one: summed in place when the head's is a tensor of its
                // own, else into a new tensor and both addends go. The result becomes
                // `.grad`, or (gradient accumulation) is added into it in place and freed.
                let new_grad = grads == Grads::New;
                let tg = op.tied_grad;
                let tmp = Cat::Temporaries;
                let earlier = |m: &mut Meter<'_>| {
                    let id = Local::ParamGrad(i as u32);
                    m.sub(
                        tmp,
                        tg,
                        Tag::new(op.name, "tied weight's earlier gradient").id(id),
                    )
                };
                let new = |m: &mut Meter<'_>| {
                    let id = Local::Grad(g as u32);
                    m.sub(tmp, tg, Tag::new(op.name, "tied weight's gradient").id(id))
                };
                if op.tied_in_place {
                    m.mark_now(op.name);
                    new(m);
                    if new_grad {
                        m.recat(tmp, Cat::Gradients, tg);
                    } else {
                        earlier(m);
                    }
                } else {
                    let sum = if new_grad {
                        let id = Local::ParamGrad(i as u32);
                        let tag = Tag {
                            tensor: op.name,
                            ..Tag::new(op.name, "parameter gradient")
                        };
                        m.add(tmp, tg, tag.id(id));
                        None
                    } else {
                        Some(buf(
                            &mut gbuf,
                            m,
                            tg,
                            tmp,
                            false,
                            Tag::new(op.name, "temporary"),
                        ))
                    };
                    m.mark_now(op.name);
                    earlier(m);
                    new(m);
                    match sum {
                        None => m.recat(tmp, Cat::Gradients, tg),
                        Some(s) => m.sub(
                            tmp,
                            tg,
                            Tag::new(op.name, "temporary").id(Local::Grad(s as u32)),
                        ),
                    }
                }
            }
            for &(t, n) in &pending[..npending] {
                let Some(g) = grad_of[t] else { continue };
                if gbuf[g].view || gbuf[g].refs > 1 {
                    let (b, c) = (gbuf[g].bytes, gbuf[g].cat);
                    let sum = buf(
                        &mut gbuf,
                        m,
                        b,
                        c,
                        false,
                        self.tag_of(t, op.name, "grad of input"),
                    );
                    m.mark_now(op.name);
                    grad_of[t] = Some(sum);
                    gbuf[g].refs -= 1;
                    if gbuf[g].refs == 0 {
                        let tag = self.tag_of(t, op.name, "summed gradient");
                        m.sub(c, b, tag.id(Local::Grad(g as u32)));
                    }
                }
                let (b, c) = (gbuf[n].bytes, gbuf[n].cat);
                let tag = self.tag_of(t, op.name, "summed gradient");
                m.sub(c, b, tag.id(Local::Grad(n as u32)));
            }
        }
        grad_of
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unary(t: &mut Tape, x: Tid, out: f64, save_input: bool) -> Tid {
        let one = [x];
        t.op(OpSpec {
            inputs: &one,
            out_bytes: out,
            saved: if save_input { &one[..] } else { &[][..] },
            ..OpSpec::default()
        })
    }

    /// y = silu(x), x saved: forward keeps x and y; backward frees x and makes grad x.
    #[test]
    fn unary_op_saves_its_input() {
        let mut t = Tape::new();
        let x = t.input(100.0, true);
        let y = unary(&mut t, x, 100.0, true);
        t.set_output(y);
        let p = t.run(Mode::Normal);
        assert_eq!(p.fwd.delta.total(), 100.0);
        assert_eq!(p.fwd.peak.total(), 100.0);
        // Backward start: x (saved) + grad y. Then grad x (+100), free grad y and x.
        assert_eq!(p.bwd.peak.total(), 100.0);
        assert_eq!(p.bwd.delta.total(), -100.0);
    }

    /// Nothing requires grad: nothing is saved, the input is freed.
    #[test]
    fn no_grad_saves_nothing() {
        let mut t = Tape::new();
        let x = t.input(100.0, false);
        let y = unary(&mut t, x, 50.0, true);
        t.set_output(y);
        let p = t.run(Mode::Normal);
        assert_eq!(p.fwd.delta.total(), -50.0);
        assert_eq!(p.fwd.peak.total(), 50.0);
    }

    /// A checkpointed stretch keeps only its input and output in forward.
    #[test]
    fn checkpoint_keeps_only_input() {
        let mut t = Tape::new();
        let x = t.input(10.0, true);
        let h = unary(&mut t, x, 40.0, true);
        let y = unary(&mut t, h, 10.0, true);
        t.set_output(y);
        let normal = t.run(Mode::Normal);
        assert_eq!(normal.fwd.delta.total(), 50.0);
        let ck = t.run(Mode::Checkpointed);
        assert_eq!(ck.fwd.delta.total(), 10.0);
        assert_eq!(ck.fwd.peak.total(), 50.0);
        // Recompute (h, y) then backward: h + grad y + grad h at most.
        assert!(ck.bwd.peak.total() >= 50.0);
        // Ends with grad x, having released x, h, grad y.
        assert_eq!(ck.bwd.delta.total(), 10.0 - 10.0 - 10.0);
    }

    /// An add passes its grad through to both inputs without allocating.
    #[test]
    fn add_shares_the_gradient() {
        let mut t = Tape::new();
        let x = t.input(10.0, true);
        let h = unary(&mut t, x, 10.0, true);
        let y = t.op(OpSpec {
            inputs: &[x, h],
            out_bytes: 10.0,
            passthrough: true,
            ..OpSpec::default()
        });
        t.set_output(y);
        let p = t.run(Mode::Normal);
        // grad y is handed to x and h; h's backward makes a fresh grad for x (transient 10).
        assert_eq!(p.bwd.peak.total(), 10.0);
    }
}
