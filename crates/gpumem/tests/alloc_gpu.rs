//! The allocator's rules (`gpumem::alloc::Allocator`) against PyTorch's own caching allocator
//! on an H100, on runs it was not written from: the oracle's sharded layouts (FSDP2, DDP,
//! HSDP, tensor and sequence parallelism, FSDP × TP) and single-GPU references, run on the GPU
//! by `tools/alloc/gpu_cases.py` with the allocator's own trace recorded
//! (`torch.cuda.memory._record_memory_history`). Each trace's requests and frees, stream by
//! stream, are replayed through the rules; the segments the replay takes must be PyTorch's,
//! and its reserved memory what `torch.cuda.max_memory_reserved()` read. Nothing here is
//! fitted: the rules are the ones the single-GPU replay uses.

use gpumem::alloc::{Allocator, Config, Stats};
use serde_json::Value;
use std::io::Read;

fn data(file: &str) -> String {
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/oracle/").to_string() + file
}

/// Each case's measured figures, by the name the trace carries.
fn measured() -> Vec<(String, Value)> {
    std::fs::read_to_string(data("cuda.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let conf = v["alloc_conf"].as_str().unwrap();
            let tag = if conf.is_empty() {
                String::new()
            } else {
                format!(" [{conf}]")
            };
            (format!("{}{tag}", v["name"].as_str().unwrap()), v)
        })
        .collect()
}

/// Where a block lies: (segment, in the order taken; offset in it).
type Place = (u64, u64);

/// One case's trace, replayed: the allocators of its streams, and per step the allocated
/// peak (over every stream, as `max_memory_allocated` counts) and the segments PyTorch took.
struct Replay {
    /// Segments laid out at the addresses `cudaMalloc` gave PyTorch (else one after another,
    /// as the engine lays them).
    real: bool,
    streams: Vec<Allocator>,
    /// Handle of each allocation (stream, id) by its index in the trace.
    handles: Vec<(usize, u32)>,
    allocated_peak: Vec<u64>,
    /// Segments PyTorch took (`s` lines): (bytes, stream).
    segments: Vec<(u64, usize)>,
    /// Under expandable segments, the bytes of pages PyTorch mapped.
    mapped: u64,
    /// The replay's segments in the order taken: (stream, address).
    mine: Vec<(usize, u64)>,
    /// Allocations placed where PyTorch placed them (same segment, same offset), and the
    /// first one placed elsewhere: (its index, PyTorch's place, the replay's).
    same_place: u64,
    first_moved: Option<(usize, Place, Place)>,
}

impl Replay {
    fn new(cfg: Config, real: bool) -> Self {
        Replay {
            real,
            streams: vec![Allocator::new(cfg)],
            handles: Vec::new(),
            allocated_peak: vec![0],
            segments: Vec::new(),
            mapped: 0,
            mine: Vec::new(),
            same_place: 0,
            first_moved: None,
        }
    }

    /// Where the replay put allocation `id` of `st`: (segment in the order taken, offset).
    fn place(&mut self, st: usize, id: u32, new_segment: bool) -> Place {
        let addr = self.streams[st].address(id);
        if new_segment {
            self.mine.push((st, addr));
        }
        let (k, base) = self
            .mine
            .iter()
            .enumerate()
            .filter(|(_, &(s, b))| s == st && b <= addr)
            .max_by_key(|(_, &(_, b))| b)
            .map(|(k, &(_, b))| (k as u64, b))
            .unwrap();
        (k, addr - base)
    }

    fn total(&self) -> Stats {
        let mut t = Stats::default();
        for a in &self.streams {
            let s = a.stats();
            t.reserved += s.reserved;
            t.allocated += s.allocated;
            t.segments += s.segments;
            t.retries += s.retries;
        }
        t
    }

    fn stream(&mut self, cfg: Config, st: usize) -> &mut Allocator {
        while self.streams.len() <= st {
            self.streams.push(Allocator::new(cfg));
        }
        &mut self.streams[st]
    }

    fn line(&mut self, cfg: Config, l: &str) {
        let mut p = l.split(' ');
        let (k, x, y) = (p.next().unwrap(), p.next(), p.next());
        let num = |s: Option<&str>| s.unwrap().parse::<u64>().unwrap();
        match k {
            "a" => {
                let st = num(y) as usize;
                self.stream(cfg, st);
                let before = self.streams[st].stats().segments;
                let id = self.streams[st].malloc(num(x)).expect("no OOM on the H100");
                if !cfg.expandable {
                    let new = self.streams[st].stats().segments > before;
                    let theirs = (num(p.next()), num(p.next()));
                    let ours = self.place(st, id, new);
                    if ours == theirs {
                        self.same_place += 1;
                    } else if self.first_moved.is_none() {
                        self.first_moved = Some((self.handles.len(), theirs, ours));
                    }
                }
                self.handles.push((st, id));
                let now = self.total().allocated;
                let last = self.allocated_peak.last_mut().unwrap();
                *last = (*last).max(now);
            }
            "f" => {
                let (st, id) = self.handles[num(x) as usize];
                self.streams[st].free(id);
            }
            "s" => {
                let st = num(y) as usize;
                self.segments.push((num(x), st));
                if self.real {
                    let at = num(p.next());
                    self.stream(cfg, st).next_segment_at(at);
                }
            }
            "#" => self.allocated_peak.push(self.total().allocated),
            "m" => self.mapped += num(x),
            "u" => self.mapped -= num(x),
            _ => panic!("unknown trace line {l}"),
        }
    }
}

/// Every traced case: (name, replay, measured).
fn replays(real: bool) -> Vec<(String, Replay, Value)> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(data("cuda-traces.txt.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let m = measured();
    let mut out: Vec<(String, Replay, Value)> = Vec::new();
    let mut cfg = Config::default();
    for l in text.lines() {
        if let Some(name) = l.strip_prefix("= ") {
            let v = m
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{name}: not in cuda.jsonl"))
                .1
                .clone();
            cfg = Config {
                expandable: v["alloc_conf"]
                    .as_str()
                    .unwrap()
                    .contains("expandable_segments:True"),
                ..Config::default()
            };
            out.push((name.to_string(), Replay::new(cfg, real), v));
        } else {
            out.last_mut().unwrap().1.line(cfg, l);
        }
    }
    assert_eq!(out.len(), m.len(), "a trace for every measured case");
    out
}

#[test]
fn the_rules_take_pytorchs_segments_and_reserve_what_it_reserved() {
    let mut errs = Vec::new();
    for (name, r, v) in replays(true) {
        let me = &v["measured"];
        let t = r.total();
        let reserved = me["peak_reserved"].as_u64().unwrap();
        let err = (t.reserved as f64 - reserved as f64) / reserved as f64;
        println!(
            "{name}: reserved {:.1} MiB replayed vs {:.1} measured ({:+.3} %), segments {} vs {}; {} placed as PyTorch placed them, first elsewhere {:?}",
            t.reserved as f64 / 1048576.0,
            reserved as f64 / 1048576.0,
            err * 100.0,
            t.segments,
            me["segments"],
            r.same_place,
            r.first_moved
        );
        errs.push(err.abs());
        if v["alloc_conf"].as_str().unwrap().contains("expandable") {
            // Pages mapped, as PyTorch mapped them (it counts no `cudaMalloc` segments).
            assert_eq!(t.reserved, r.mapped, "{name}: the pages PyTorch mapped");
        } else {
            // Segments: as many as PyTorch holds at the end, and those it took, in bytes.
            assert_eq!(
                Some(t.segments),
                me["segments"].as_u64(),
                "{name}: segments"
            );
            let taken: u64 = r.segments.iter().map(|s| s.0).sum();
            assert_eq!(t.reserved, taken, "{name}: the segments PyTorch took");
            assert!(
                r.first_moved.is_none(),
                "{name}: every block where PyTorch put it"
            );
        }
        assert_eq!(t.reserved, reserved, "{name}: reserved");
        assert_eq!(t.retries, 0, "{name}");
        // The allocated peak of the last step (blocks as the allocator hands them out).
        let peak = *r.allocated_peak.last().unwrap();
        assert_eq!(
            Some(peak),
            me["peak_step"].as_u64(),
            "{name}: max_memory_allocated over the last step"
        );
    }
    errs.sort_by(f64::total_cmp);
    println!(
        "{} cases: reserved |error| median {:.4} %, worst {:.4} %",
        errs.len(),
        errs[errs.len() / 2] * 100.0,
        errs[errs.len() - 1] * 100.0
    );
}

/// The same traces with segments laid out one after another, as the engine lays them. The
/// engine cannot know the addresses `cudaMalloc` returns, and best fit breaks ties between
/// equal free blocks by address, so here a tie can go to another block than on the GPU.
/// Measured: 75 of the 78 runs within 0.6 %, the median exact; three (HSDP w16/shard 4, FSDP
/// w2, CP 4 with recompute) at 5.6–7.0 %, each replayed exactly above with the real
/// addresses. The median meets the goal (1 %); the worst is held to what was measured.
#[test]
fn without_cudas_addresses_the_reserved_memory_stays_close() {
    let mut errs = Vec::new();
    for (name, r, v) in replays(false) {
        let reserved = v["measured"]["peak_reserved"].as_u64().unwrap() as f64;
        let err = (r.total().reserved as f64 - reserved) / reserved;
        println!("{name}: {:+.3} %", err * 100.0);
        errs.push(err.abs());
    }
    errs.sort_by(f64::total_cmp);
    let (median, worst) = (errs[errs.len() / 2], errs[errs.len() - 1]);
    println!(
        "median {:.3} %, worst {:.3} %",
        median * 100.0,
        worst * 100.0
    );
    assert!(median <= 0.01 && worst <= 0.075, "{median} {worst}");
}
