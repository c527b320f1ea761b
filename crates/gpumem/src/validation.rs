//! Predicted against measured: the calibration runs of `tests/data` (one H100) and the
//! sharded layouts the CPU oracle recorded (`tests/data/oracle`, PyTorch's own per-rank
//! allocations) through the engine. The book's validation chapter is generated from this
//! (never typed by hand), and the same goals are enforced by tests.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::estimate::estimate;
use crate::scenario::Scenario;

/// One measured run and the engine's prediction for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    /// `peak_step` (training) or `peak_generate` (inference; `peak_prefill` for a prompt
    /// alone), in bytes; `None` for a run
    /// that ran out of memory.
    pub measured: Option<f64>,
    pub predicted: f64,
    /// Whether the engine's verdict (fits / does not fit) matches what the GPU did.
    pub verdict_right: bool,
    /// Parameter count and KV-cache size exactly as measured (where measured).
    pub counts_exact: bool,
    /// The layout family (`fsdp`, `tp`, `pp` …) of an oracle case.
    pub layout: Option<String>,
    /// The case measured a rank lighter than the worst one, which the engine reports: the
    /// prediction bounds it from above, and it is left out of the statistics.
    pub bound: bool,
}

impl Row {
    /// predicted / measured − 1.
    pub fn error(&self) -> Option<f64> {
        self.measured.map(|m| self.predicted / m - 1.0)
    }
}

/// Every run, and the summary statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub rows: Vec<Row>,
    /// Median and largest |error| over the runs that completed.
    pub median_abs: f64,
    pub worst_abs: f64,
    pub verdicts_right: usize,
    pub counts_exact: usize,
}

/// A measured byte figure: a finite number above zero and within what the engine reports.
fn measured_bytes(x: &Value, key: &str) -> std::result::Result<Option<f64>, String> {
    match x.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(b) if b.is_finite() && b > 0.0 && b <= crate::estimate::MAX_BYTES => Ok(Some(b)),
            _ => Err(format!(
                "expect.{key} must be a number of bytes above 0 and at most 2^60"
            )),
        },
    }
}

/// The median and the largest |error| of `rows` (those that completed and are not bounds).
pub fn summary<'a>(rows: impl Iterator<Item = &'a Row>) -> (f64, f64) {
    let mut errs: Vec<f64> = rows
        .filter(|r| !r.bound)
        .filter_map(|r| r.error())
        .map(f64::abs)
        .collect();
    errs.sort_by(f64::total_cmp);
    let median = if errs.is_empty() {
        0.0
    } else if errs.len() % 2 == 1 {
        errs[errs.len() / 2]
    } else {
        (errs[errs.len() / 2 - 1] + errs[errs.len() / 2]) / 2.0
    };
    (median, errs.last().copied().unwrap_or(0.0))
}

/// The rank an oracle case measured (`--rank N` in its command; rank 0 otherwise).
fn rank_of(case: &Value) -> u64 {
    let cmd = case["command"].as_str().unwrap_or("");
    let mut words = cmd.split_whitespace();
    while let Some(w) = words.next() {
        if w == "--rank" {
            return words.next().and_then(|r| r.parse().ok()).unwrap_or(0);
        }
    }
    0
}

/// Run every line of a `calibration-scenarios.jsonl` or an oracle `sharded.jsonl`
/// (`{"name", "scenario", "expect"}`, with `layout`, `command` and `expect.stage` for
/// oracle cases: a pipeline case measured one stage, compared with that stage's peak).
/// Errors name the line: the error's `field` is the line number.
///
/// The measured figures leave cuBLAS's workspaces out unless a case's
/// `expect.cublas_workspaces` is `true`: the CPU oracle cannot see them (cuBLAS allocates
/// them inside a matmul), and measure.py's figures start from a baseline that already holds
/// them, taken by its process's first run (a file's first case without a `command`, which
/// counts them). Such a case is compared with the peak less the workspaces
/// (`Estimate::cublas_workspace_bytes`).
pub fn validate(jsonl: &str) -> Result<Report> {
    let mut rows = Vec::new();
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |m: String| Error::new((i + 1).to_string(), m);
        let case: Value = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let name = case["name"].as_str().unwrap_or("unnamed").to_string();
        let s = Scenario::from_value(&case["scenario"])
            .map_err(|e| at(format!("scenario: {}: {}", e.field, e.message)))?;
        let e = estimate(&s).map_err(|e| at(format!("{}: {}", e.field, e.message)))?;
        let x = &case["expect"];
        let oom = x["oom"].as_bool().unwrap_or(false);
        let peak_step = measured_bytes(x, "peak_step").map_err(at)?;
        let peak_generate = measured_bytes(x, "peak_generate")
            .and_then(|g| Ok(g.or(measured_bytes(x, "peak_prefill")?)))
            .map_err(at)?;
        let measured = if oom {
            None
        } else {
            Some(
                peak_step
                    .or(peak_generate)
                    .ok_or_else(|| at("expect has no peak_step or peak_generate".into()))?,
            )
        };
        let counts_exact = x["params"].as_u64().is_none_or(|p| p == e.params)
            && x["kv_cache_bytes"]
                .as_u64()
                .is_none_or(|k| k == e.kv_cache_bytes);
        // measure.py's runs (no `command`) are in the order its one process ran them: the
        // first took the workspaces, so it counts them.
        let counted = x["cublas_workspaces"]
            .as_bool()
            .unwrap_or(rows.is_empty() && case.get("command").is_none());
        let ws = if counted { 0 } else { e.cublas_workspace_bytes };
        let predicted = match x.get("stage") {
            None | Some(Value::Null) => e.peak_bytes,
            Some(v) => {
                let st = v
                    .as_u64()
                    .and_then(|st| e.stages.get(st as usize))
                    .ok_or_else(|| {
                        at(format!(
                            "expect.stage must be a pipeline stage of the layout (0 to {})",
                            e.stages.len().saturating_sub(1)
                        ))
                    })?;
                st.peak_bytes
            }
        }
        .saturating_sub(ws) as f64;
        rows.push(Row {
            name,
            measured,
            predicted,
            verdict_right: e.fits != oom,
            counts_exact,
            layout: case["layout"].as_str().map(|l| crate::hf::truncate(l, 40)),
            bound: rank_of(&case) != 0,
        });
    }
    if rows.is_empty() {
        return Err(Error::new("1", "no runs"));
    }
    let (median_abs, worst_abs) = summary(rows.iter());
    Ok(Report {
        median_abs,
        worst_abs,
        verdicts_right: rows.iter().filter(|r| r.verdict_right).count(),
        counts_exact: rows.iter().filter(|r| r.counts_exact).count(),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibration_runs_meet_the_goals() {
        let r = validate(include_str!(
            "../../../tests/data/calibration-scenarios.jsonl"
        ))
        .unwrap();
        assert!(r.rows.len() >= 30);
        assert!(r.median_abs <= 0.05 && r.worst_abs <= 0.15, "{r:?}");
        assert_eq!(r.verdicts_right, r.rows.len());
        assert_eq!(r.counts_exact, r.rows.len());
    }

    /// The sharded layouts against PyTorch's own per-rank peaks (the CPU oracle): median
    /// |error| ≤ 1 %, every case ≤ 5 %, and a lighter rank never above the prediction.
    #[test]
    fn the_oracle_cases_meet_the_goals() {
        let r = validate(include_str!("../../../tests/data/oracle/sharded.jsonl")).unwrap();
        assert!(r.rows.len() >= 150);
        assert!(r.median_abs <= 0.01 && r.worst_abs <= 0.05, "{r:?}");
        assert_eq!(r.counts_exact, r.rows.len());
        for row in r.rows.iter().filter(|x| x.bound) {
            let e = row.error().unwrap();
            assert!((-0.001..=0.05).contains(&e), "{}: {e}", row.name);
        }
        let layouts: std::collections::BTreeSet<_> =
            r.rows.iter().filter_map(|x| x.layout.clone()).collect();
        assert!(layouts.len() >= 10, "{layouts:?}");
    }

    /// The same layouts run on an H100 (`tests/data/oracle/cuda-validation.jsonl`): PyTorch's own
    /// `max_memory_allocated` per rank, cuBLAS's workspaces and kernels' own buffers
    /// included, against the estimate's peak.
    #[test]
    fn the_layouts_run_on_a_gpu_meet_the_goals() {
        let r = validate(include_str!(
            "../../../tests/data/oracle/cuda-validation.jsonl"
        ))
        .unwrap();
        assert!(r.rows.len() >= 100);
        assert!(r.median_abs <= 0.01 && r.worst_abs <= 0.05, "{r:?}");
        assert_eq!(r.counts_exact, r.rows.len());
        let layouts: std::collections::BTreeSet<_> =
            r.rows.iter().filter_map(|x| x.layout.clone()).collect();
        assert!(layouts.len() >= 9, "{layouts:?}");
    }

    /// transformers' `generate()` on the CPU oracle, family by family
    /// (`tests/data/oracle/generate.jsonl`): the peak less cuBLAS's workspaces within 1 %
    /// for every case, the cache's bytes and the parameters exact.
    #[test]
    fn the_generation_cases_meet_the_goals() {
        let r = validate(include_str!("../../../tests/data/oracle/generate.jsonl")).unwrap();
        assert!(r.rows.len() >= 60);
        assert!(r.median_abs <= 0.01 && r.worst_abs <= 0.01, "{r:?}");
        assert_eq!(r.counts_exact, r.rows.len());
        assert_eq!(r.verdicts_right, r.rows.len());
    }

    #[test]
    fn bad_lines_are_named() {
        let e = validate("\n{\"name\": 1,").unwrap_err();
        assert_eq!(e.field, "2");
        let e =
            validate(r#"{"name": "x", "scenario": {"model": "gpt2", "batch": 0}, "expect": {}}"#)
                .unwrap_err();
        assert_eq!(e.field, "1");
        assert!(e.message.contains("batch"), "{e}");
    }

    /// Measured figures that would break the statistics or the log-scale plot are refused
    /// (a zero once hung the book build in the plot's tick loop).
    #[test]
    fn measured_figures_must_be_positive_sizes() {
        for bad in ["0", "-5", "1e300", "\"12\"", "null"] {
            let line = format!(
                r#"{{"name": "x", "scenario": {{"model": "gpt2", "batch": 1, "seq": 8}}, "expect": {{"peak_step": {bad}}}}}"#
            );
            let e = validate(&format!("\n{line}")).unwrap_err();
            assert_eq!(e.field, "2", "{bad}: {e}");
        }
    }
}
