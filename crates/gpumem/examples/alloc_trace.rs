//! Replays allocation traces of the H100 calibration runs through `gpumem::alloc`, to tell
//! the allocator's rules apart from the engine's events: PyTorch's own events
//! (`tools/alloc/trace.py --all --dir DIR`) or the engine's (`--example alloc_events -- DIR`),
//! one file per run, `NN.trace`. Prints each run's reserved peak beside the H100's.
//!
//! cargo run --release -p gpumem --example alloc_trace -- DIR [OPTIONS]
//!
//! - `two`: cuBLAS's second workspace (autograd's thread) at the first step's backward; the
//!   first is taken at the first step's forward (PyTorch's traces do not show either).
//! - `fresh`: each run in a new process (by default the runs follow each other as
//!   measure.py ran them, the cache emptied between runs, the workspaces kept).
//! - `case=N`: one run; `phases`: the reserved and allocated bytes at each phase; `dump`:
//!   the segments of 100 MiB and more at each phase; `ws=BYTES`: the workspace's size
//!   (`ws=0` for the engine's events, which take their workspaces themselves).
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
    let mut errs = Vec::new();
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
        for line in text.lines() {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("#") => {
                    let rest: Vec<&str> = f.collect();
                    if args.iter().any(|a| a == "phases") {
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
                        if workspace.is_none() && ws > 0 {
                            workspace = Some(a.malloc(ws).unwrap());
                        }
                    }
                    if two
                        && rest.len() >= 3
                        && rest[0] == "step"
                        && rest[2] == "backward"
                        && workspace2.is_none()
                    {
                        workspace2 = Some(a.malloc(ws).unwrap());
                    }
                }
                Some("a") => {
                    let id: u64 = f.next().unwrap().parse().unwrap();
                    let b: u64 = f.next().unwrap().parse().unwrap();
                    match a.malloc(b) {
                        Ok(h) => {
                            live.insert(id, h);
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
