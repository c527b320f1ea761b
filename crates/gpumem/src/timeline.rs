//! The op-level timeline: allocated memory after every allocation and free of a step, by
//! category, as the engine replays it.
//!
//! [`estimate`](crate::estimate()) composes a step from stretches (each replayed op by op once)
//! and closes runs of identical layers and micro-batches in closed form; [`op_timeline`]
//! records that same composition and unrolls it: every event of the stretches that matter,
//! each summarised repetition as its highest point. The first and the last of every run are
//! unrolled op by op, and the highest point of a run of identical repetitions is always in
//! one of them (each repetition is the previous one shifted by what it leaves), so the
//! timeline's highest point is the estimate's peak, in the same stretch.

use crate::dtype::DType;
use crate::error::Result;
use crate::mem::{Bytes, Cat, Event, Phase, Seg, Where};
use crate::scenario::Scenario;
use crate::step::{Count, Node, Src, Stretches, Trace, Which};

/// One point of the timeline: where memory stands right after one event (or at the top of a
/// transient buffer, or at the highest moment of summarised repetitions).
#[derive(Clone, Debug, PartialEq)]
pub struct OpPoint {
    /// Allocated bytes by category, what stays resident through the step included.
    pub live: Bytes,
    /// The stretch, decoder layer and micro-batch, and the op running (`at.what`).
    pub at: Where,
    /// What the tensor is to autograd ("saved for backward", "grad of input", "workspace");
    /// empty for a framework's own buffers.
    pub role: &'static str,
    /// The op that made the tensor, when the event is one tensor.
    pub tensor: &'static str,
    pub dtype: Option<DType>,
    /// The event's bytes: positive allocated, negative freed (for a summarised point, what
    /// its repetitions leave behind altogether).
    pub bytes: f64,
    pub cat: Cat,
    /// 0: one event. k ≥ 1: the highest point of k identical repetitions in a row (decoder
    /// layers, micro-batches), the first of them `at.index` (or `at.micro_batch`).
    pub span: u64,
    /// The step's decoder layers, by which its backward names each layer in the forward's
    /// order ([`Where::words_of`]; 0 before the timeline is made).
    pub of: u32,
}

impl OpPoint {
    /// The total, as the estimate counts it: a category the replay leaves a few bytes below
    /// where it started counts as empty.
    pub fn total(&self) -> f64 {
        self.live.0.iter().map(|b| b.max(0.0)).sum()
    }
}

/// A step, op by op.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTimeline {
    pub points: Vec<OpPoint>,
    /// The highest point (the first, when several are as high: within half a byte, what
    /// summing the events one by one may differ from the estimate's composition; a later
    /// micro-batch that leaves a few bytes more is higher).
    pub peak: usize,
    /// What stays allocated through the step (the model states the step does not free).
    pub resident: Bytes,
}

/// Repetitions between the first and the last of a run are drawn as at most this many
/// points (each the highest moment of a stretch of them).
const SUMMARY_POINTS: u64 = 24;

/// The step of `s`, op by op. Refused (with the field named) where [`estimate`] has no
/// step to replay: a bare parameter count, or pipeline stages (each its own program).
///
/// [`estimate`]: crate::estimate()
pub fn op_timeline(s: &Scenario) -> Result<OpTimeline> {
    let r = crate::estimate::recorded(s)?;
    let mut u = Unroll {
        first: &r.first,
        later: r.later.as_ref(),
        level: r.resident,
        points: Vec::new(),
    };
    u.point(r.resident, Where::default(), "", Cat::Weights, 0.0, 0);
    u.nodes(&r.nodes, Label::default());
    for (b, at) in &r.tail {
        let d = b.minus(u.level).total();
        u.point(*b, *at, "", Cat::KvCache, d, 0);
        u.level = *b;
    }
    // The step holds the whole model: its backward names layers by their forward order.
    if let crate::scenario::Model::Arch { arch, .. } = &s.model {
        let of = u32::try_from(arch.layers).unwrap_or(0);
        u.points.iter_mut().for_each(|p| p.of = of);
    }
    let max = u.points.iter().map(OpPoint::total).fold(0.0, f64::max);
    let peak = u
        .points
        .iter()
        .position(|p| p.total() >= max - 0.5)
        .unwrap_or(0);
    Ok(OpTimeline {
        points: u.points,
        peak,
        resident: r.resident,
    })
}

/// What the groups around a node say of where it is.
#[derive(Clone, Copy, Debug, Default)]
struct Label {
    micro_batch: u32,
    micro_batches: u32,
    /// The decoder layer a group repetition stands for (0: none).
    index: u32,
}

impl Label {
    fn place(&self, mut at: Where) -> Where {
        if self.micro_batch > 0 {
            at.micro_batch = self.micro_batch;
            at.micro_batches = self.micro_batches;
        }
        if self.index > 0 && at.phase.numbered() {
            at.index = self.index;
        }
        at
    }
}

struct Unroll<'a> {
    first: &'a Stretches,
    later: Option<&'a Stretches>,
    /// Allocated bytes now, by category (absolute).
    level: Bytes,
    points: Vec<OpPoint>,
}

impl<'a> Unroll<'a> {
    fn point(
        &mut self,
        live: Bytes,
        at: Where,
        role: &'static str,
        cat: Cat,
        bytes: f64,
        span: u64,
    ) {
        self.points.push(OpPoint {
            of: 0,
            live,
            at,
            role,
            tensor: "",
            dtype: None,
            bytes,
            cat,
            span,
        });
    }

    /// The events of a stretch, from the stretches replayed with its gradients.
    fn events(&self, src: Src) -> Option<&'a [Event]> {
        let st = match self.later {
            Some(l) if l.grads == src.grads && self.first.grads != src.grads => l,
            _ => self.first,
        };
        let t = st.traces.as_deref()?;
        let tr: &Trace = match src.which {
            Which::Emb => &t.emb,
            Which::Layer(i) => t.layers.get(i)?,
            Which::Head => &t.head,
            Which::Loss => &t.loss,
        };
        Some(if src.fwd { &tr.fwd } else { &tr.bwd })
    }

    fn nodes(&mut self, nodes: &[Node], lab: Label) {
        let mut i = 0;
        while i < nodes.len() {
            // Layers of different kinds that alternate (sliding and full attention, dense and
            // MoE) repeat as a pattern: its repetitions are summarised as a run's are.
            if let Some((p, r)) = pattern(&nodes[i..]) {
                let one = nodes[i..i + p]
                    .iter()
                    .fold(Seg::default(), |acc, n| acc.then(seg_of(n)));
                let first = |k: u64| {
                    let mut l = lab;
                    if let Some(x) = first_index(&nodes[i + (k as usize - 1) * p..]) {
                        l.index = x;
                    }
                    l
                };
                self.run(
                    r as u64,
                    &one,
                    p as u64,
                    &mut |u, k| {
                        let at = i + (k as usize - 1) * p;
                        u.nodes(&nodes[at..at + p], lab)
                    },
                    &first,
                );
                i += p * r;
                continue;
            }
            self.node(&nodes[i], lab);
            i += 1;
        }
    }

    fn node(&mut self, n: &Node, lab: Label) {
        match n {
            Node::Frame(seg) => self.frame(seg, lab),
            Node::Stretch { src, one, n, index } => {
                let events = self.events(*src);
                let at = |k: u64| {
                    let mut l = lab;
                    if *index > 0 {
                        l.index = index + k as u32 - 1;
                    }
                    l
                };
                self.run(
                    *n,
                    one,
                    1,
                    &mut |u, k| match events {
                        Some(ev) => u.stretch(ev, one, at(k)),
                        None => u.frame(one, at(k)),
                    },
                    &at,
                );
            }
            Node::Group {
                n,
                one,
                count,
                body,
            } => {
                let at = |k: u64| {
                    let mut l = lab;
                    match *count {
                        Count::MicroBatches { from, of } => {
                            l.micro_batch = from + k as u32 - 1;
                            l.micro_batches = of;
                        }
                        Count::Layers { from } => l.index = from + k as u32 - 1,
                    }
                    l
                };
                self.run(*n, one, 1, &mut |u, k| u.nodes(body, at(k)), &at);
            }
        }
    }

    /// `n` repetitions of `one` (each `per` decoder layers or micro-batches): the first and
    /// the last unrolled by `each`, those between summarised (at most [`SUMMARY_POINTS`]
    /// points, each the highest moment of the repetitions it stands for).
    fn run(
        &mut self,
        n: u64,
        one: &Seg,
        per: u64,
        each: &mut dyn FnMut(&mut Self, u64),
        label: &dyn Fn(u64) -> Label,
    ) {
        if n == 0 {
            return;
        }
        each(self, 1);
        let middle = n.saturating_sub(2);
        if middle > 0 {
            let each_point = middle.div_ceil(SUMMARY_POINTS);
            let mut k = 2;
            while k < n {
                let m = each_point.min(n - k);
                // Each repetition leaves `one.delta`: the highest of the m is the last one's
                // when they pile up, else the first's.
                let before = self.level;
                let top_k = if one.delta.total() > 0.0 { m - 1 } else { 0 };
                let top = before.plus(one.delta.scale(top_k as f64)).plus(one.peak);
                let at = label(k).place(Where { what: "", ..one.at });
                self.level = before.plus(one.delta.scale(m as f64));
                let cat = main_cat(&one.delta, &one.peak);
                self.point(top, at, "", cat, one.delta.total() * m as f64, m * per);
                k += m;
            }
        }
        if n > 1 {
            each(self, n);
        }
    }

    /// A framework's buffer: its top (a transient) and where it leaves memory.
    fn frame(&mut self, seg: &Seg, lab: Label) {
        let at = lab.place(seg.at);
        let (top, end) = (self.level.plus(seg.peak), self.level.plus(seg.delta));
        if seg.peak.total() > seg.delta.total() && seg.peak.total() > 0.0 {
            self.point(
                top,
                at,
                "",
                main_cat(&seg.peak, &seg.peak),
                seg.peak.total(),
                0,
            );
        }
        self.level = end;
        if seg.delta.0.iter().any(|&b| b != 0.0) {
            let cat = main_cat(&seg.delta, &seg.delta);
            self.point(end, at, "", cat, seg.delta.total(), 0);
        }
    }

    /// One stretch's events: a point after each, a workspace as its top only.
    fn stretch(&mut self, events: &[Event], one: &Seg, lab: Label) {
        let base = Where {
            phase: one.at.phase,
            ..Where::default()
        };
        let mut i = 0;
        while i < events.len() {
            let e = &events[i];
            let at = lab.place(Where {
                what: e.at.what,
                index: one.at.index,
                ..base
            });
            self.level.add(e.cat, e.bytes);
            self.points.push(OpPoint {
                of: 0,
                live: self.level,
                at,
                role: e.role,
                tensor: e.tensor,
                dtype: e.dtype,
                bytes: e.bytes,
                cat: e.cat,
                span: 0,
            });
            // A workspace is freed as soon as the op is done: its top is the point.
            if e.role == "workspace" && e.bytes > 0.0 {
                if let Some(f) = events.get(i + 1) {
                    if f.role == "workspace" && f.cat == e.cat && f.bytes == -e.bytes {
                        self.level.add(f.cat, f.bytes);
                        i += 1;
                    }
                }
            }
            i += 1;
        }
    }
}

/// What a recorded node composes to.
fn seg_of(n: &Node) -> Seg {
    match n {
        Node::Frame(s) => *s,
        Node::Stretch { one, n, .. } | Node::Group { one, n, .. } => one.repeat(*n),
    }
}

/// Whether two recorded nodes are the same piece of a step (another decoder layer alike).
fn alike(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (Node::Frame(x), Node::Frame(y)) => x.delta == y.delta && x.peak == y.peak,
        (
            Node::Stretch { src, one, n, .. },
            Node::Stretch {
                src: s2,
                one: o2,
                n: n2,
                ..
            },
        ) => src == s2 && n == n2 && one.delta == o2.delta && one.peak == o2.peak,
        (
            Node::Group { n, one, body, .. },
            Node::Group {
                n: n2,
                one: o2,
                body: b2,
                ..
            },
        ) => n == n2 && body.len() == b2.len() && one.delta == o2.delta && one.peak == o2.peak,
        _ => false,
    }
}

/// A pattern at the start of `nodes` that repeats: (its length, 2 to 4 nodes with a decoder
/// layer among them; how many times in a row, at least 3).
fn pattern(nodes: &[Node]) -> Option<(usize, usize)> {
    (2..=4).find_map(|p| {
        if nodes.len() < 3 * p || first_index(&nodes[..p]).is_none() {
            return None;
        }
        let mut r = 1;
        while (r + 1) * p <= nodes.len() && (0..p).all(|j| alike(&nodes[j], &nodes[r * p + j])) {
            r += 1;
        }
        (r >= 3).then_some((p, r))
    })
}

/// The decoder layer the first stretch (or group of layers) in `nodes` starts at.
fn first_index(nodes: &[Node]) -> Option<u32> {
    nodes.iter().find_map(|n| match n {
        Node::Stretch { index, .. } if *index > 0 => Some(*index),
        Node::Group {
            count: Count::Layers { from },
            ..
        } => Some(*from),
        _ => None,
    })
}

/// The category that moves most in `a` (or, when nothing does, in `b`).
fn main_cat(a: &Bytes, b: &Bytes) -> Cat {
    let pick = |x: &Bytes| {
        Cat::ALL
            .iter()
            .copied()
            .filter(|c| x.get(*c) != 0.0)
            .fold(None::<Cat>, |m, c| match m {
                Some(p) if x.get(p).abs() >= x.get(c).abs() => Some(p),
                _ => Some(c),
            })
    };
    pick(a).or_else(|| pick(b)).unwrap_or(Cat::Temporaries)
}

/// Whether a phase is a training step's forward (else its backward, the optimizer step or
/// inference).
pub fn forward_phase(p: Phase) -> bool {
    matches!(
        p,
        Phase::FwdEmbedding | Phase::FwdLayer | Phase::FwdMoeLayer | Phase::FwdHead
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(knobs: &[(&str, &str)]) -> Scenario {
        crate::knobs::scenario(knobs.iter().copied()).unwrap()
    }

    /// The timeline's highest point is the estimate's peak, in the same stretch, for every
    /// path the engine composes a step on.
    #[test]
    fn the_highest_point_is_the_estimates_peak() {
        let cases: &[&[(&str, &str)]] = &[
            &[("model", "llama3.1-8b"), ("batch", "2"), ("seq", "4k")],
            &[("model", "llama3.2-1b"), ("batch", "4"), ("seq", "2k")],
            &[
                ("model", "gpt2"),
                ("seq", "1k"),
                ("precision", "amp-bf16"),
                ("attention", "eager"),
            ],
            &[
                ("model", "llama3.1-8b"),
                ("recompute", "full"),
                ("seq", "8k"),
            ],
            &[("model", "llama3.1-8b"), ("grad-accum", "4")],
            &[("model", "llama3.1-8b"), ("finetune", "qlora")],
            &[("model", "mixtral-8x7b"), ("precision", "mixed-bf16")],
            &[("model", "llama3.1-8b"), ("loss", "fused"), ("batch", "8")],
            &[("model", "llama3.1-8b"), ("dp", "8"), ("zero-stage", "3")],
            &[
                ("model", "llama3.1-8b"),
                ("dp", "8"),
                ("zero-stage", "3"),
                ("grad-accum", "2"),
            ],
            &[("model", "llama3.1-8b"), ("dp", "4")],
            &[
                ("model", "llama3.1-8b"),
                ("dp", "8"),
                ("zero-stage", "2"),
                ("framework", "deepspeed"),
            ],
            &[
                ("model", "llama3.1-70b"),
                ("tp", "8"),
                ("dp", "2"),
                ("zero-stage", "3"),
            ],
            &[
                ("model", "llama3.1-8b"),
                ("framework", "megatron"),
                ("tp", "2"),
            ],
            &[
                ("model", "llama3.1-8b"),
                ("mode", "inference"),
                ("seq", "8k"),
            ],
            &[
                ("model", "llama3.1-8b"),
                ("mode", "inference"),
                ("new-tokens", "4k"),
            ],
            &[("model", "llama3.1-8b"), ("optimizer", "adafactor")],
            // Families whose layers differ (sliding and full attention, linear attention,
            // dense and MoE layers): runs of one kind, numbered through the model.
            &[("model", "gemma-2-9b"), ("seq", "8k")],
            &[("model", "gemma-3-1b"), ("grad-accum", "2")],
            &[
                ("model", "qwen3-next-80b-a3b"),
                ("seq", "1k"),
                ("capacity", "4000"),
            ],
            &[("model", "deepseek-v2-lite"), ("seq", "1k")],
            &[
                ("model", "gpt-oss-20b"),
                ("mode", "inference"),
                ("new-tokens", "1k"),
            ],
            &[
                ("model", "gemma-3-12b"),
                ("mode", "inference"),
                ("seq", "32k"),
            ],
        ];
        for k in cases {
            let s = scenario(k);
            let e = crate::estimate(&s).unwrap();
            let t = op_timeline(&s).unwrap();
            let p = &t.points[t.peak];
            let rel = (p.total() - e.peak_bytes as f64).abs() / e.peak_bytes as f64;
            assert!(
                rel < 1e-9,
                "{k:?}: timeline {} vs estimate {}",
                p.total(),
                e.peak_bytes
            );
            assert_eq!(p.at.words_of(p.of), e.peak_phase, "{k:?}");
            // Unrolled op by op around the peak, and not more than a few thousand points
            // (Gemma 3's runs of five sliding layers and one full, each drawn, make the most:
            // about 5,100 since the backward's temporaries are events of their own).
            assert_eq!(p.span, 0, "{k:?}");
            assert!(t.points.len() < 6000, "{k:?}: {}", t.points.len());
            // Nothing goes below what stays resident (Megatron's replay ends its step a few
            // KiB below where it started).
            for q in &t.points {
                assert!(q.total() >= t.resident.total() - 65536.0, "{k:?}: {q:?}");
            }
        }
    }

    #[test]
    fn labels_name_the_op_the_tensor_and_its_dtype() {
        let s = scenario(&[("model", "llama3.1-8b"), ("precision", "bf16")]);
        let t = op_timeline(&s).unwrap();
        let up = t
            .points
            .iter()
            .find(|p| p.at.what == "up_proj" && p.role == "saved for backward")
            .or_else(|| t.points.iter().find(|p| p.at.what == "up_proj"))
            .unwrap();
        assert_eq!(up.at.phase, Phase::FwdLayer);
        assert_eq!(up.at.index, 1);
        assert!(up.dtype.is_some());
        // Both ends of the run of layers are unrolled, the middle summarised.
        assert!(t.points.iter().any(|p| p.at.index == 32 && p.span == 0));
        assert!(t.points.iter().any(|p| p.span > 0));
        // The backward meets the layers from the top and names each by its forward order:
        // its first is the model's last layer, its last the first.
        let bwd: Vec<&OpPoint> = t.points.iter().filter(|p| p.at.backward()).collect();
        assert_eq!(bwd[0].at.words_of(bwd[0].of), "backward: layer 32");
        let last = bwd[bwd.len() - 1];
        assert_eq!(last.at.words_of(last.of), "backward: layer 1");
        let full = scenario(&[
            ("model", "llama3.1-8b"),
            ("batch", "4"),
            ("seq", "4k"),
            ("recompute", "full"),
            ("loss", "fused"),
        ]);
        let (e, t) = (crate::estimate(&full).unwrap(), op_timeline(&full).unwrap());
        assert_eq!(e.peak_phase, "backward: layer 1");
        let top = &t.points[t.peak];
        assert_eq!(top.at.words_of(top.of), e.peak_phase);
        let bad = crate::knobs::scenario([("params", "7e9")]).unwrap();
        assert!(op_timeline(&bad).is_err());
        let pp = scenario(&[("model", "llama3.1-8b"), ("pp", "2"), ("grad-accum", "2")]);
        assert_eq!(op_timeline(&pp).unwrap_err().field, "parallel.pp");
    }
}
