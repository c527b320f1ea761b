//! Predicted against measured: the calibration runs of `tests/data` through the engine. The
//! book's validation chapter is generated from this (never typed by hand), and the same
//! goals are enforced by the CLI's fidelity test.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::estimate::estimate;
use crate::scenario::Scenario;

/// One measured run and the engine's prediction for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub name: String,
    /// `peak_step` (training) or `peak_generate` (inference), in bytes; `None` for a run
    /// that ran out of memory.
    pub measured: Option<f64>,
    pub predicted: f64,
    /// Whether the engine's verdict (fits / does not fit) matches what the GPU did.
    pub verdict_right: bool,
    /// Parameter count and KV-cache size exactly as measured (where measured).
    pub counts_exact: bool,
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

/// Run every line of a `calibration-scenarios.jsonl` (`{"name", "scenario", "expect"}`).
/// Errors name the line: the error's `field` is the line number.
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
        let peak_generate = measured_bytes(x, "peak_generate").map_err(at)?;
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
        rows.push(Row {
            name,
            measured,
            predicted: e.peak_bytes as f64,
            verdict_right: e.fits != oom,
            counts_exact,
        });
    }
    if rows.is_empty() {
        return Err(Error::new("1", "no runs"));
    }
    let mut errs: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.error())
        .map(f64::abs)
        .collect();
    errs.sort_by(f64::total_cmp);
    let median_abs = if errs.is_empty() {
        0.0
    } else if errs.len() % 2 == 1 {
        errs[errs.len() / 2]
    } else {
        (errs[errs.len() / 2 - 1] + errs[errs.len() / 2]) / 2.0
    };
    Ok(Report {
        median_abs,
        worst_abs: errs.last().copied().unwrap_or(0.0),
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
