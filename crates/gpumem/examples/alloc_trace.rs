//! Replays allocation traces of the H100 calibration runs through `gpumem::alloc`, to tell
//! the allocator's rules apart from the engine's events: PyTorch's own events
//! (`tools/alloc/trace.py --all --dir DIR`) or the engine's (`--example alloc_events -- DIR`),
//! one file per run, `NN.trace`. Prints each run's reserved peak beside the H100's.
//!
//! cargo run --release -p gpumem --example alloc_trace -- DIR [OPTIONS]
//!
//! - `two`: cuBLAS's second workspace (autograd's thread) at the first step's backward; the
//!   first is taken at the first step's forward (PyTorch's traces do not show either). In a
//!   trace with op names (`trace.py --verbose`) each is taken where cuBLAS takes it, after
//!   the output of the thread's first matmul (the forward's: the rotary embedding's `bmm` or
//!   the first projection; the backward's: the LM head's).
//! - `fresh`: each run in a new process (by default the runs follow each other as
//!   measure.py ran them, the cache emptied between runs, the workspaces kept).
//! - `case=N`: one run; `phases`: the reserved and allocated bytes at each phase; `dump`:
//!   the segments of 100 MiB and more at each phase; `show=N`: those of run N only, the
//!   runs before it replayed as the process ran them; `ws=BYTES`: the workspace's size
//!   (`ws=0` for the engine's events, which take their workspaces themselves, marked
//!   `workspace`, and keep them from run to run); `grew`: each
//!   allocation that made the cache take memory from CUDA, with its phase; `left`: the
//!   segments a run leaves to the next (the workspaces' and what shares theirs).
use gpumem::alloc::{Allocator, Config};
use std::collections::HashMap;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).cloned().unwrap_or("target/alloc-traces".into());
    let expandable = args.iter().any(|a| a == "expandable");
    let ws: u64 = args
        .iter()
        .find_map(|a| a.strip_prefix("ws=").map(|v| v.parse().unwrap()))
        .unwrap_or(32 << 20);
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/");
    let measured: Vec<serde_json::Value> =
        std::fs::read_to_string(format!("{root}h100-calibration.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .filter(|v: &serde_json::Value| v["kind"] != "env")
            .collect();
    let mut a = Allocator::new(Config {
        expandable,
        device: 85_017_493_504 - 787_283_968,
        ..Config::default()
    });
    let mut workspace = None;
    let mut workspace2 = None;
    let two = args.iter().any(|a| a == "two");
    let grew = args.iter().any(|a| a == "grew");
    let mut phase = String::new();
    let mut errs = Vec::new();
    let mut kept: Vec<u32> = Vec::new();
    for (i, m) in measured.iter().enumerate() {
        if let Some(only) = args.iter().find_map(|a| a.strip_prefix("case=")) {
            if only.parse::<usize>().unwrap() != i {
                continue;
            }
        }
        let path = format!("{dir}/{i:02}.trace");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if args.iter().any(|a| a == "fresh") {
            a = Allocator::new(a.config());
            workspace = None;
            workspace2 = None;
        }
        let mut live: HashMap<u64, u32> = HashMap::new();
        if args.iter().any(|a| a == "fresh") {
            kept.clear();
        }
        // Op names after the sizes: the workspaces go where cuBLAS takes them.
        let named = text
            .lines()
            .any(|l| l.starts_with("a ") && l.contains(".default"));
        // `show=N`: phases, growth and segments of run N only, the others replayed quietly.
        let quiet = args
            .iter()
            .find_map(|a| a.strip_prefix("show="))
            .is_some_and(|n| n.parse::<usize>().unwrap() != i);
        let mut backward = false;
        for line in text.lines() {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("#") => {
                    let rest: Vec<&str> = f.collect();
                    phase = rest.join(" ");
                    if rest.len() >= 3 && rest[0] == "step" {
                        backward = rest[2] == "backward";
                    }
                    if !quiet && args.iter().any(|a| a == "phases") {
                        let st = a.stats();
                        println!(
                            "   {:24} reserved {:>8.1} MiB allocated {:>8.1} MiB segs {} free {:?}",
                            rest.join(" "),
                            st.reserved as f64 / 1048576.0,
                            st.allocated as f64 / 1048576.0,
                            st.segments,
                            a.free_blocks()
                        );
                        if args.iter().any(|a| a == "dump") {
                            for sg in a.segments() {
                                if sg.bytes() >= 100 << 20 {
                                    let bl: Vec<String> = sg
                                        .blocks
                                        .iter()
                                        .map(|b| {
                                            format!(
                                                "{}{:.1}",
                                                if b.1 { "A" } else { "." },
                                                b.0 as f64 / 1048576.0
                                            )
                                        })
                                        .collect();
                                    println!(
                                        "      seg {:.1} MiB: {}",
                                        sg.bytes() as f64 / 1048576.0,
                                        bl.join(" ")
                                    );
                                }
                            }
                        }
                    }
                    if rest.len() >= 3 && rest[0] == "step" && rest[2] == "forward" {
                        if rest[1] == "2" {
                            a.reset_peaks();
                        }
                        if workspace.is_none() && ws > 0 && !named {
                            workspace = Some(a.malloc(ws).unwrap());
                        }
                    }
                    if two
                        && rest.len() >= 3
                        && rest[0] == "step"
                        && rest[2] == "backward"
                        && workspace2.is_none()
                        && !named
                    {
                        workspace2 = Some(a.malloc(ws).unwrap());
                    }
                }
                Some("a") => {
                    let id: u64 = f.next().unwrap().parse().unwrap();
                    let b: u64 = f.next().unwrap().parse().unwrap();
                    let op = f.next().unwrap_or("");
                    if op == "workspace" {
                        // The engine's events: a cuBLAS workspace, kept across runs (each
                        // run's events take their two; the process takes them once).
                        if kept.len() < 2 {
                            if let Ok(h) = a.malloc(b) {
                                kept.push(h);
                            }
                        }
                        continue;
                    }
                    let matmul = [
                        "mm.default",
                        "bmm.default",
                        "addmm.default",
                        "baddbmm.default",
                    ]
                    .contains(&op);
                    let before = a.reserved();
                    match a.malloc(b) {
                        Ok(h) => {
                            live.insert(id, h);
                            if named && matmul && ws > 0 {
                                if workspace.is_none() {
                                    workspace = Some(a.malloc(ws).unwrap());
                                } else if two && backward && workspace2.is_none() {
                                    workspace2 = Some(a.malloc(ws).unwrap());
                                }
                            }
                            if grew && !quiet && a.reserved() > before {
                                println!(
                                    "   {phase:18} a {id} {b}: reserved +{:.1} MiB to {:.1} MiB (allocated {:.1} MiB)",
                                    (a.reserved() - before) as f64 / 1048576.0,
                                    a.reserved() as f64 / 1048576.0,
                                    a.stats().allocated as f64 / 1048576.0
                                );
                            }
                        }
                        Err(e) => {
                            println!("{i} OOM {e:?}");
                            break;
                        }
                    }
                }
                Some("f") => {
                    let id: u64 = f.next().unwrap().parse().unwrap();
                    if let Some(h) = live.remove(&id) {
                        a.free(h);
                    }
                }
                _ => {}
            }
        }
        let st = a.stats();
        let want = m["peak_reserved"].as_u64().unwrap_or(0);
        let segs = a.segments();
        let large = segs.iter().filter(|s| !s.small).count();
        let e = st.peak_reserved as f64 / want as f64 - 1.0;
        errs.push(e.abs());
        println!(
            "{i:2} {:60} reserved {:>12} measured {:>12} err {:+.2}% alloc-peak {:>12} (measured {:>12}) segs {} large {} retries {}",
            format!("{} {} b{} s{} ck{} {}", m["model"], m["regime"], m["batch"], m["seq"], m["checkpointing"], m["attn"]),
            st.peak_reserved,
            want,
            e * 100.0,
            st.peak_allocated,
            m["peak_step"].as_u64().unwrap_or(0),
            segs.len(),
            large,
            st.retries
        );
        for (_, h) in live.drain() {
            a.free(h);
        }
        a.release_cached();
        if args.iter().any(|a| a == "left") {
            let segs: Vec<String> = a
                .segments()
                .iter()
                .map(|sg| {
                    let bl: Vec<String> = sg
                        .blocks
                        .iter()
                        .map(|b| {
                            format!(
                                "{}{:.1}",
                                if b.1 { "A" } else { "." },
                                b.0 as f64 / 1048576.0
                            )
                        })
                        .collect();
                    bl.join(" ")
                })
                .collect();
            println!("   left after the run: {segs:?}");
        }
    }
    errs.sort_by(|x, y| x.partial_cmp(y).unwrap());
    if !errs.is_empty() {
        println!(
            "n {} median |err| {:.2}% worst {:.2}%",
            errs.len(),
            errs[errs.len() / 2] * 100.0,
            errs.last().unwrap() * 100.0
        );
    }
}
