//! Predicted vs PyTorch's own per-rank peaks for sharded layouts (FSDP2, DDP, HSDP, DTensor
//! tensor/sequence parallelism with and without loss_parallel, torch.distributed.pipelining,
//! context parallelism, expert parallelism and their combinations): every case the CPU
//! oracle recorded in tests/data/oracle/sharded.jsonl (command, versions and machine in each
//! record; how they were made in tests/data/oracle/README.md).
//!
//! A case names the rank it measured: rank 0 unless its command says `--rank N`. The
//! estimate is the worst rank's; for another rank it must not be below the measured peak.

use gpumem::{estimate, Scenario};
use serde_json::Value;

fn data(name: &str) -> String {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/oracle/");
    std::fs::read_to_string(format!("{p}{name}")).expect("tests/data/oracle present")
}

/// The rank a case measured (`--rank N` in its command).
fn rank(case: &Value) -> u64 {
    let cmd = case["command"].as_str().unwrap_or("");
    let mut words = cmd.split_whitespace();
    while let Some(w) = words.next() {
        if w == "--rank" {
            return words.next().and_then(|r| r.parse().ok()).unwrap_or(0);
        }
    }
    0
}

#[test]
fn sharded_layouts_meet_the_fidelity_goals() {
    let mut errors = Vec::new();
    let mut report = String::new();
    let mut layouts = std::collections::BTreeMap::<String, usize>::new();
    for line in data("sharded.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
    {
        let case: Value = serde_json::from_str(line).unwrap();
        let name = case["name"].as_str().unwrap();
        let exp = &case["expect"];
        let s = Scenario::from_value(&case["scenario"]).unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = estimate(&s).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(p) = exp["params"].as_u64() {
            assert_eq!(e.params, p, "{name}: parameter count");
        }
        let predicted = match exp["stage"].as_u64() {
            Some(st) => e.stages[st as usize].peak_bytes,
            None => e.peak_bytes,
        } as f64;
        let measured = exp["peak_step"].as_f64().unwrap();
        let err = predicted / measured - 1.0;
        *layouts
            .entry(case["layout"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        report.push_str(&format!("{name:66} {:+6.2} %\n", err * 100.0));
        if rank(&case) != 0 {
            // The worst rank's peak, checked against a lighter one.
            assert!(
                err >= -0.001 && err <= 0.05,
                "{name}: rank {} measured {measured}, predicted {predicted} for the worst rank",
                rank(&case)
            );
            continue;
        }
        errors.push(err.abs());
    }
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let worst = errors[errors.len() - 1];
    eprintln!(
        "{report}{} cases ({layouts:?}): median |error| {:.2} %, worst {:.2} %",
        errors.len(),
        median * 100.0,
        worst * 100.0
    );
    assert!(
        layouts.len() >= 10,
        "every layout family is covered: {layouts:?}"
    );
    assert!(
        median <= 0.01,
        "median |error| {:.2} % > 1 %\n{report}",
        median * 100.0
    );
    assert!(
        worst <= 0.05,
        "worst |error| {:.2} % > 5 %\n{report}",
        worst * 100.0
    );
}
