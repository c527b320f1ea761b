//! The engine's memory bookkeeping: bytes by category, and stretches of a step summarised as
//! segments that compose.
//!
//! A training step is a sequence of stretches (the embedding's forward, each decoder layer's
//! forward, the loss, each layer's backward, the framework's collectives between them, the
//! optimizer step). Each stretch changes memory by some `delta` and, on the way, rises at
//! most `peak` above where it started. Two stretches in a row compose exactly
//! ([`Seg::then`]), and `n` identical stretches (identical decoder layers) compose in closed
//! form ([`Seg::repeat`]): that is what keeps a 126-layer model as cheap to estimate as a
//! one-layer one. [`crate::tape`] produces the segments of a stretch from its ops.

/// What a byte of memory is, for the breakdown at the peak and the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cat {
    /// Parameters as the model holds them (shards, under FSDP/ZeRO-3).
    Weights = 0,
    /// A separate full-precision copy the optimizer updates.
    Master = 1,
    Optimizer = 2,
    /// Parameter gradients.
    Gradients = 3,
    /// Tensors saved for backward, and forward intermediates.
    Activations = 4,
    /// Logits and the loss's fp32 buffers.
    Logits = 5,
    /// Low-precision copies of weights (autocast's cache, dequantised bases).
    WeightCopies = 6,
    /// Parameters gathered whole for compute (FSDP all-gather outputs, ZeRO-3).
    Gathered = 7,
    /// Communication buffers: gradient buckets, reduce-scatter inputs, pipeline sends and
    /// receives, ring-attention blocks, expert all-to-all buffers.
    Comm = 8,
    /// The KV cache (inference).
    KvCache = 9,
    /// Gradients of activations and other short-lived buffers.
    Temporaries = 10,
    /// cuBLAS's workspaces (`crate::gpu::cublas_workspaces`), kept from each thread's first
    /// matmul on.
    Workspaces = 11,
}

pub const NCAT: usize = 12;

impl Cat {
    pub const ALL: [Cat; NCAT] = [
        Cat::Weights,
        Cat::Master,
        Cat::Optimizer,
        Cat::Gradients,
        Cat::Activations,
        Cat::Logits,
        Cat::WeightCopies,
        Cat::Gathered,
        Cat::Comm,
        Cat::KvCache,
        Cat::Temporaries,
        Cat::Workspaces,
    ];

    /// The component's name in an estimate (`Estimate::components`).
    pub fn key(self) -> &'static str {
        match self {
            Cat::Weights => "weights",
            Cat::Master => "master_weights",
            Cat::Optimizer => "optimizer_states",
            Cat::Gradients => "gradients",
            Cat::Activations => "activations",
            Cat::Logits => "logits",
            Cat::WeightCopies => "weight_copies",
            Cat::Gathered => "gathered_params",
            Cat::Comm => "comm_buffers",
            Cat::KvCache => "kv_cache",
            Cat::Temporaries => "temporaries",
            Cat::Workspaces => "cublas_workspaces",
        }
    }
}

/// Bytes by category.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bytes(pub [f64; NCAT]);

impl Bytes {
    pub fn of(cat: Cat, b: f64) -> Bytes {
        let mut x = Bytes::default();
        x.0[cat as usize] = b;
        x
    }
    /// The categories summed in order: what `self.0.iter().sum()` gives (a sum starts from
    /// −0.0, which adding the first term leaves as that term), written out so that it is no
    /// loop (it is taken at every step of every replay and composition).
    pub fn total(&self) -> f64 {
        let b = &self.0;
        b[0] + b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] + b[8] + b[9] + b[10] + b[11]
    }
    pub fn get(&self, cat: Cat) -> f64 {
        self.0[cat as usize]
    }
    pub fn add(&mut self, cat: Cat, b: f64) {
        self.0[cat as usize] += b;
    }
    pub fn plus(mut self, o: Bytes) -> Bytes {
        for i in 0..NCAT {
            self.0[i] += o.0[i];
        }
        self
    }
    pub fn minus(mut self, o: Bytes) -> Bytes {
        for i in 0..NCAT {
            self.0[i] -= o.0[i];
        }
        self
    }
    pub fn scale(mut self, k: f64) -> Bytes {
        for v in self.0.iter_mut() {
            *v *= k;
        }
        self
    }
}

/// Where in the step a point lies: the stretch, which repetition of it, and the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Where {
    pub phase: Phase,
    /// 1-based index of the repetition (decoder layer, micro-batch) the point is in; 0 when
    /// the stretch is not repeated.
    pub index: u32,
    /// The micro-batch (1-based; 0 when there is one) and how many there are.
    pub micro_batch: u32,
    pub micro_batches: u32,
    /// What was running: an op's name or a framework event.
    pub what: &'static str,
}

impl Default for Where {
    fn default() -> Self {
        Where {
            phase: Phase::Start,
            index: 0,
            micro_batch: 0,
            micro_batches: 0,
            what: "",
        }
    }
}

/// The stretches of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Start,
    FwdEmbedding,
    FwdLayer,
    FwdMoeLayer,
    FwdHead,
    BwdHead,
    BwdLayer,
    BwdMoeLayer,
    BwdEmbedding,
    OptimizerStep,
    PrefillEmbedding,
    Prefill,
    PrefillMoe,
    PrefillHead,
    Decode,
}

impl Phase {
    /// Whether the phase names a repeated stretch (a decoder layer), numbered.
    pub fn numbered(self) -> bool {
        matches!(
            self,
            Phase::FwdLayer
                | Phase::FwdMoeLayer
                | Phase::BwdLayer
                | Phase::BwdMoeLayer
                | Phase::Prefill
                | Phase::PrefillMoe
        )
    }

    pub fn words(self) -> &'static str {
        match self {
            Phase::Start => "start of step",
            Phase::FwdEmbedding => "forward: embedding",
            Phase::FwdLayer => "forward: layer",
            Phase::FwdMoeLayer => "forward: MoE layer",
            Phase::FwdHead => "forward: logits and loss",
            Phase::BwdHead => "backward: logits and loss",
            Phase::BwdLayer => "backward: layer",
            Phase::BwdMoeLayer => "backward: MoE layer",
            Phase::BwdEmbedding => "backward: embedding",
            Phase::OptimizerStep => "optimizer step",
            Phase::PrefillEmbedding => "prefill: embedding",
            Phase::Prefill => "prefill: layer",
            Phase::PrefillMoe => "prefill: MoE layer",
            Phase::PrefillHead => "prefill: last-token logits",
            Phase::Decode => "decode: last token",
        }
    }
}

/// A stretch summarised: where memory ends relative to its start, and its highest point
/// (the breakdown there, relative to the start, and where it was).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Seg {
    pub delta: Bytes,
    /// The highest point, relative to the start. Its total is at least 0 (the start itself)
    /// and at least `delta`'s (the end).
    pub peak: Bytes,
    pub at: Where,
}

impl Seg {
    /// A stretch that allocates `b` bytes of `cat` and keeps them.
    pub fn alloc(cat: Cat, b: f64, at: Where) -> Seg {
        let d = Bytes::of(cat, b);
        Seg {
            delta: d,
            peak: if b > 0.0 { d } else { Bytes::default() },
            at,
        }
    }

    /// A stretch that frees `b` bytes of `cat`.
    pub fn free(cat: Cat, b: f64, at: Where) -> Seg {
        Seg::alloc(cat, -b, at)
    }

    /// A buffer that exists only for the moment (allocated, then freed).
    pub fn transient(cat: Cat, b: f64, at: Where) -> Seg {
        Seg {
            delta: Bytes::default(),
            peak: Bytes::of(cat, b.max(0.0)),
            at,
        }
    }

    /// This stretch, then `b`.
    pub fn then(mut self, b: Seg) -> Seg {
        self.push(&b);
        self
    }

    /// `b` appended to this stretch, in place.
    pub fn push(&mut self, b: &Seg) {
        self.push_at(b, b.at);
    }

    /// `b` appended to this stretch, its highest point labelled `at` rather than `b.at`.
    pub fn push_at(&mut self, b: &Seg, at: Where) {
        if self.delta.total() + b.peak.total() > self.peak.total() {
            self.peak = self.delta.plus(b.peak);
            self.at = at;
        }
        for i in 0..NCAT {
            self.delta.0[i] += b.delta.0[i];
        }
    }

    /// `n` of this stretch in a row (identical layers): the highest point is in the last
    /// one when each leaves memory higher, else in the first. `at.index` says which.
    pub fn repeat(self, n: u64) -> Seg {
        if n == 0 {
            return Seg::default();
        }
        let worst = if self.delta.total() > 0.0 { n - 1 } else { 0 };
        let mut at = self.at;
        at.index = (worst + 1) as u32;
        Seg {
            delta: self.delta.scale(n as f64),
            peak: self.delta.scale(worst as f64).plus(self.peak),
            at,
        }
    }

    /// The same stretch, labelled as `phase` (repetition index and micro-batch kept).
    pub fn in_phase(mut self, phase: Phase) -> Seg {
        self.at.phase = phase;
        self
    }

    pub fn in_micro_batch(mut self, mb: u32) -> Seg {
        self.at.micro_batch = mb;
        self
    }
}

impl Where {
    /// The decoder layer the point is in, counted in the forward's order from 1 (0: none),
    /// in a step over `of` decoder layers. The backward meets them from the top (its
    /// `index` 1 is the last layer); `of` 0 (not known: a chunk of an interleaved pipeline
    /// stage) leaves it counted from the top.
    pub fn layer(&self, of: u32) -> u32 {
        if self.backward() && of >= self.index {
            of + 1 - self.index
        } else {
            self.index
        }
    }

    /// In a layer's backward (met from the top).
    pub fn backward(&self) -> bool {
        matches!(self.phase, Phase::BwdLayer | Phase::BwdMoeLayer)
    }

    /// The point in words, counted from the top in a layer's backward: "backward: layer
    /// (from the top) 3", "optimizer step".
    pub fn words(&self) -> String {
        self.words_of(0)
    }

    /// The point in words in a step over `of` decoder layers ([`Where::layer`]): "backward:
    /// layer 30".
    pub fn words_of(&self, of: u32) -> String {
        let mut s = String::new();
        if self.micro_batch > 0 {
            s.push_str(&format!(
                "micro-batch {} of {}, ",
                self.micro_batch, self.micro_batches
            ));
        }
        s.push_str(self.phase.words());
        if self.backward() && of == 0 {
            s.push_str(" (from the top)");
        }
        if self.phase.numbered() && self.index > 0 {
            s.push_str(&format!(" {}", self.layer(of)));
        }
        s
    }
}

/// An allocation or a free, for the op-level timeline and the allocator model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Event {
    /// Positive: allocated; negative: freed; zero: a marker (see [`Local`]).
    pub bytes: f64,
    pub cat: Cat,
    pub at: Where,
    /// What the tensor is ("saved for backward", "output", "grad of input", "workspace").
    pub role: &'static str,
    /// The op that made the tensor ("" for a workspace or a framework buffer).
    pub tensor: &'static str,
    /// The tensor's dtype, when the tape knows it.
    pub dtype: Option<crate::dtype::DType>,
    /// Which tensor, within the stretch replayed.
    pub id: Local,
    /// The op running named itself (a module: a linear layer), rather than taking the name
    /// of the module it runs in (`at.what` then names that): the allocator model finds the
    /// forward's first matmul by it.
    pub named: bool,
}

/// Which tensor an [`Event`] allocates or frees, within the stretch a tape replays: the
/// allocator model ([`crate::alloc`]) follows identities, since which block is freed decides
/// what merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Local {
    /// Storage `i` of the tape (its external inputs and its output included).
    Storage(u32),
    /// Gradient buffer `i` of the backward (0: the output's, when it requires grad).
    Grad(u32),
    /// The parameter gradients op `i`'s backward leaves in `.grad`.
    ParamGrad(u32),
    /// A workspace alive while one op runs.
    Temp,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(what: &'static str) -> Where {
        Where {
            what,
            ..Where::default()
        }
    }

    #[test]
    fn segments_compose_like_the_events_they_stand_for() {
        // +10, transient 5, −4: peak 15 at the transient, end 6.
        let s = Seg::alloc(Cat::Activations, 10.0, w("a"))
            .then(Seg::transient(Cat::Temporaries, 5.0, w("t")))
            .then(Seg::free(Cat::Activations, 4.0, w("f")));
        assert_eq!(s.delta.total(), 6.0);
        assert_eq!(s.peak.total(), 15.0);
        assert_eq!(s.at.what, "t");
        assert_eq!(s.peak.get(Cat::Temporaries), 5.0);
    }

    /// The written-out total is the iterator's sum, bit for bit (signed zeros included).
    #[test]
    fn total_is_the_sum_in_order() {
        let vals = [
            0.0,
            -0.0,
            1.5,
            -1.5,
            1e300,
            -1e300,
            3.0e-310,
            7.25,
            f64::MAX,
            0.1,
            2.0,
        ];
        for k in 0..vals.len() * 7 {
            let mut b = Bytes::default();
            for i in 0..NCAT {
                b.0[i] = vals[(i * 5 + k * (i + 3)) % vals.len()];
            }
            let want: f64 = b.0.iter().sum();
            assert_eq!(b.total().to_bits(), want.to_bits(), "{:?}", b.0);
        }
        let z = Bytes([-0.0; NCAT]);
        assert_eq!(z.total().to_bits(), z.0.iter().sum::<f64>().to_bits());
    }

    #[test]
    fn repeat_equals_composing_one_by_one() {
        for (d, p) in [(3.0, 5.0), (-3.0, 2.0), (0.0, 4.0)] {
            let one = Seg {
                delta: Bytes::of(Cat::Activations, d),
                peak: Bytes::of(Cat::Activations, p),
                at: w("x"),
            };
            let mut by_hand = Seg::default();
            for _ in 0..7 {
                by_hand = by_hand.then(one);
            }
            let closed = one.repeat(7);
            assert_eq!(closed.delta, by_hand.delta);
            assert_eq!(closed.peak.total(), by_hand.peak.total().max(0.0));
        }
    }
}
