//! `{{#gpumem validation}}`: the table, the scatter plot and the statistics of predicted
//! against measured peaks, computed at build time from the calibration data (never typed).

use std::fmt::Write;
use std::path::Path;

use gpumem::validation::{validate, Report};

/// Where the data is, relative to the book's root, unless the directive says `data=`.
pub const DEFAULT_DATA: &str = "tests/data/calibration-scenarios.jsonl";

const GIB: f64 = 1073741824.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The largest data file the chapter reads (the calibration data is about 60 KB).
pub const MAX_DATA_BYTES: u64 = 16 << 20;

/// The chapter's HTML for the data at `root/data`, or what is wrong with it (`FILE:LINE:`).
pub fn render(root: &Path, data: &str) -> Result<String, String> {
    let text = read_data(&root.join(data)).map_err(|e| format!("{data}: {e}"))?;
    let r = validate(&text).map_err(|e| format!("{data}:{}: {}", e.field, e.message))?;
    if r.rows.iter().any(|x| x.layout.is_some()) {
        return Ok(format!(
            "<div class=\"gm-validation\">{}{}{}<details class=\"gm-details\"><summary>Every case ({})</summary>{}</details></div>",
            oracle_stats(&r),
            layouts(&r),
            scatter(&r, ORACLE_CAPTION),
            r.rows.len(),
            table(&r)
        ));
    }
    // Runs on the CPU oracle rather than a GPU: said so, and their many cases folded.
    let oracle = text.lines().filter(|l| !l.trim().is_empty()).all(|l| {
        serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
            v["machine"]
                .as_str()
                .is_some_and(|m| m.contains("FakeTensorMode"))
        })
    });
    if oracle {
        return Ok(format!(
            "<div class=\"gm-validation\">{}{}<details class=\"gm-details\"><summary>Every case ({})</summary>{}</details></div>",
            stats(&r),
            scatter(&r, CPU_ORACLE_CAPTION),
            r.rows.len(),
            table(&r)
        ));
    }
    Ok(format!(
        "<div class=\"gm-validation\">{}{}{}</div>",
        stats(&r),
        scatter(&r, H100_CAPTION),
        table(&r)
    ))
}

const CPU_ORACLE_CAPTION: &str = "Each dot is one run on the CPU oracle (FakeTensorMode, every tensor PyTorch allocates tracked): the peak measured (across) against the one predicted (up). The solid line is a perfect prediction, the dashed lines ±5 %.";

const H100_CAPTION: &str = "Each dot is one run on the H100: the peak <code>torch.cuda.max_memory_allocated()</code> measured (across) against the one predicted (up). The solid line is a perfect prediction, the dashed lines ±5 %.";

const ORACLE_CAPTION: &str = "Each dot is one rank of one layout: the peak PyTorch allocated on it (across) against the one predicted (up). The solid line is a perfect prediction, the dashed lines ±5 %.";

/// The oracle cases' statistics: how many, and how close.
fn oracle_stats(r: &Report) -> String {
    let bounds = r.rows.iter().filter(|x| x.bound).count();
    let errors: Vec<f64> = r
        .rows
        .iter()
        .filter(|x| !x.bound)
        .filter_map(|x| x.error())
        .collect();
    let low = errors.iter().filter(|e| **e <= -0.0005).count();
    let high = errors.iter().filter(|e| **e >= 0.0005).count();
    // A lighter rank is bounded when the prediction is at or above it (to the table's
    // precision).
    let held = r
        .rows
        .iter()
        .filter(|x| x.bound && x.error().is_some_and(|e| e > -0.0005))
        .count();
    let lighter = match bounds {
        0 => String::new(),
        _ => format!(
            "<li>{bounds} case{} measured a lighter rank than the worst, which the engine reports: \
             there the prediction must be at or above the measurement ({}), and the statistics leave {} out</li>",
            if bounds == 1 { "" } else { "s" },
            if held == bounds {
                if bounds == 1 { "it is".to_string() } else { "it is in all".to_string() }
            } else {
                format!("it is in {held} of them")
            },
            if bounds == 1 { "it" } else { "them" },
        ),
    };
    format!(
        "<ul class=\"gm-stats\"><li><strong>{}</strong> cases in <strong>{}</strong> layout families</li>\
         <li>median |error| <strong>{:.2} %</strong>, largest <strong>{:.2} %</strong> (goals: 1 % and 5 %)</li>\
         <li>predicted below PyTorch's peak by 0.05 % or more in <strong>{low}</strong> cases, above it in <strong>{high}</strong>, \
         within 0.05 % (an error of 0.0 % in the table) in the other {}</li>{lighter}\
         <li>parameter counts exact: <strong>{} of {}</strong></li></ul>",
        r.rows.len(),
        families(r).len(),
        r.median_abs * 100.0,
        r.worst_abs * 100.0,
        errors.len() - low - high,
        r.counts_exact,
        r.rows.len()
    )
}

/// The layout families, in order of first appearance.
fn families(r: &Report) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in r.rows.iter().filter_map(|x| x.layout.clone()) {
        if !v.contains(&l) {
            v.push(l);
        }
    }
    v
}

/// One row per layout family: its cases and how close they are.
fn layouts(r: &Report) -> String {
    let mut s = String::from(
        "<div class=\"gm-scroll\"><table class=\"gm-table gm-layouts\"><thead><tr><th scope=\"col\">Layout</th>\
         <th scope=\"col\">Cases</th><th scope=\"col\">Median |error|</th><th scope=\"col\">Largest |error|</th></tr></thead><tbody>",
    );
    for f in families(r) {
        let rows = || r.rows.iter().filter(|x| x.layout.as_deref() == Some(&f));
        let (median, worst) = gpumem::validation::summary(rows());
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"gm-num\" data-label=\"cases\">{}</td><td class=\"gm-num\" data-label=\"median\">{:.2} %</td><td class=\"gm-num\" data-label=\"largest\">{:.2} %</td></tr>",
            esc(&f),
            rows().count(),
            median * 100.0,
            worst * 100.0
        );
    }
    s.push_str("</tbody></table></div>");
    s
}

/// A small regular file's text (never a device, a FIFO or a directory: reading those could
/// block or grow without end).
fn read_data(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    if meta.len() > MAX_DATA_BYTES {
        return Err(format!(
            "is {} bytes, more than the {MAX_DATA_BYTES} a data file may have",
            meta.len()
        ));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_DATA_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_DATA_BYTES {
        return Err(format!(
            "has more than the {MAX_DATA_BYTES} bytes a data file may have"
        ));
    }
    Ok(text)
}

/// A signed percentage with a typographic minus, and no "−0.0": "+0.4 %", "−2.2 %", "0.0 %".
pub fn signed_pct(x: f64) -> String {
    let s = format!("{:+.1}", x * 100.0);
    let digits = &s[1..];
    if digits.bytes().all(|b| b == b'0' || b == b'.') {
        format!("{digits} %")
    } else if let Some(rest) = s.strip_prefix('-') {
        format!("\u{2212}{rest} %")
    } else {
        format!("{s} %")
    }
}

fn stats(r: &Report) -> String {
    let done = r.rows.iter().filter(|x| x.measured.is_some()).count();
    // Which way the errors lean: runs predicted below what was measured (at the 0.1 % the
    // table shows), and above.
    let errors: Vec<f64> = r.rows.iter().filter_map(|x| x.error()).collect();
    let low = errors.iter().filter(|e| **e <= -0.0005).count();
    let high = errors.iter().filter(|e| **e >= 0.0005).count();
    format!(
        "<ul class=\"gm-stats\"><li><strong>{}</strong> runs, {done} completed and {} out of memory</li>\
         <li>median |error| <strong>{:.1} %</strong>, largest <strong>{:.1} %</strong> (goals: 1 % and 5 %)</li>\
         <li>predicted below the measurement by 0.05 % or more in <strong>{low}</strong> runs, above it in <strong>{high}</strong>, \
         within 0.05 % (an error of 0.0 % in the table) in the other {}</li>\
         <li>fits / out-of-memory verdicts right: <strong>{} of {}</strong></li>\
         <li>parameter counts and KV-cache sizes exact: <strong>{} of {}</strong></li></ul>",
        r.rows.len(),
        r.rows.len() - done,
        r.median_abs * 100.0,
        r.worst_abs * 100.0,
        errors.len() - low - high,
        r.verdicts_right,
        r.rows.len(),
        r.counts_exact,
        r.rows.len()
    )
}

/// Measured (x) against predicted (y), both on log axes, with the diagonal and ±5 % lines.
fn scatter(r: &Report, caption: &str) -> String {
    let pts: Vec<(f64, f64, &str)> = r
        .rows
        .iter()
        .filter_map(|x| {
            x.measured
                .map(|m| (m / GIB, x.predicted / GIB, x.name.as_str()))
        })
        .collect();
    let lo = pts
        .iter()
        .map(|p| p.0.min(p.1))
        .fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.0.max(p.1)).fold(0.0, f64::max);
    // Decades that hold every point (the data is checked: sizes above zero, at most 2^60).
    let (lo, hi) = if pts.is_empty() {
        (0.0, 1.0)
    } else {
        (lo.log10().floor(), hi.log10().ceil())
    };
    let hi = if hi > lo { hi } else { lo + 1.0 };
    // Drawn at about the size it is shown at (24em wide at most, the column on a phone), so
    // that its text reads at 11 px or more.
    let (w, h, pad) = (300.0, 300.0, 44.0);
    let sx = |v: f64| pad + (v.log10() - lo) / (hi - lo) * (w - pad - 12.0);
    // The top keeps room for the vertical axis' name, written across above it.
    let top = 24.0;
    let sy = |v: f64| h - pad - (v.log10() - lo) / (hi - lo) * (h - pad - top);
    let mut s = format!(
        "<figure class=\"gm gm-scatter\" role=\"figure\" aria-label=\"Predicted against measured peak, {} runs\">\
         <svg class=\"gm-chart\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"Scatter plot: every point lies on the diagonal within {:.1} %\">",
        pts.len(),
        r.worst_abs * 100.0
    );
    let mut d = 10f64.powf(lo);
    while d <= 10f64.powf(hi) * 1.0001 {
        let _ = write!(
            s,
            "<g class=\"gm-tick\"><line class=\"gm-grid\" x1=\"{pad}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\"/>\
             <line class=\"gm-grid\" x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{top}\" y2=\"{:.1}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{d} GiB</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{d}</text></g>",
            w - 12.0,
            sy(d),
            sy(d),
            sx(d),
            sx(d),
            h - pad,
            pad - 4.0,
            sy(d) + 4.0,
            sx(d),
            h - pad + 14.0
        );
        d *= 10.0;
    }
    let (a, b) = (10f64.powf(lo), 10f64.powf(hi));
    for (k, class) in [(1.0, "gm-diag"), (1.05, "gm-band"), (0.95, "gm-band")] {
        let _ = write!(
            s,
            "<line class=\"{class}\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
            sx(a),
            sy(a * k),
            sx(b / k.max(1.0)),
            sy(b / k.max(1.0) * k)
        );
    }
    for (m, p, name) in &pts {
        let _ = write!(
            s,
            "<circle class=\"gm-dot\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\"><title>{}: measured {m:.3} GiB, predicted {p:.3} GiB</title></circle>",
            sx(*m),
            sy(*p),
            esc(name)
        );
    }
    let _ = write!(
        s,
        "<text class=\"gm-axis-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">measured peak, GiB →</text>\
         <text class=\"gm-axis-label\" x=\"{:.1}\" y=\"12\" text-anchor=\"start\">predicted peak ↑</text></svg>\
         <figcaption>{caption}</figcaption></figure>",
        (w + pad) / 2.0,
        h - 8.0,
        pad - 36.0
    );
    s
}

fn table(r: &Report) -> String {
    let mut s = String::from(
        "<div class=\"gm-scroll\"><table class=\"gm-table gm-runs\"><thead><tr><th scope=\"col\">Run</th><th scope=\"col\">Measured</th>\
         <th scope=\"col\">Predicted</th><th scope=\"col\">Error</th></tr></thead><tbody>",
    );
    for x in &r.rows {
        let (m, err) = match (x.measured, x.error()) {
            (Some(m), Some(e)) => (format!("{:.2} GiB", m / GIB), signed_pct(e)),
            _ => (
                "out of memory".to_string(),
                if x.verdict_right {
                    "predicted: does not fit".to_string()
                } else {
                    "predicted: fits ✗".to_string()
                },
            ),
        };
        let _ = write!(
            s,
            "<tr><td>{}{}</td><td class=\"gm-num\" data-label=\"measured\">{m}</td><td class=\"gm-num\" data-label=\"predicted\">{:.2} GiB</td><td class=\"gm-num\" data-label=\"error\">{err}</td></tr>",
            esc(&x.name),
            if x.bound {
                " <small>(a lighter rank: the prediction is the worst rank's)</small>"
            } else {
                ""
            },
            x.predicted / GIB
        );
    }
    s.push_str("</tbody></table></div>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chapter_comes_from_the_data() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let html = render(&root, DEFAULT_DATA).unwrap();
        let r = validate(&std::fs::read_to_string(root.join(DEFAULT_DATA)).unwrap()).unwrap();
        assert_eq!(
            html.matches("<circle").count(),
            r.rows.iter().filter(|x| x.measured.is_some()).count()
        );
        assert_eq!(html.matches("<tr><td>").count(), r.rows.len());
        assert!(html.contains(&format!("{:.1} %</strong>, largest", r.median_abs * 100.0)));
        assert!(
            !html.contains("-0.0") && !html.contains(">-"),
            "typographic minus signs"
        );
        assert_eq!(signed_pct(-0.0004), "0.0 %");
        assert_eq!(signed_pct(-0.022), "\u{2212}2.2 %");
        assert_eq!(signed_pct(0.004), "+0.4 %");
        let e = render(&root, "no/such.jsonl").unwrap_err();
        assert!(e.starts_with("no/such.jsonl:"), "{e}");
    }

    /// The lighter ranks are spoken of only where there are some, and what is said of them is
    /// what the data shows.
    #[test]
    fn the_lighter_ranks_are_counted_not_asserted() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cpu = render(&root, "tests/data/oracle/sharded.jsonl").unwrap();
        assert!(cpu.contains("1 case measured a lighter rank") && cpu.contains("(it is)"));
        let gpu = render(&root, "tests/data/oracle/cuda-validation.jsonl").unwrap();
        assert!(
            !gpu.contains("lighter rank"),
            "no case of the GPU data is one"
        );
        assert!(gpu.contains("<td>pp_fsdp</td>"));
    }

    /// Runs on the CPU oracle are not said to be the H100's, and their many cases fold.
    #[test]
    fn each_plot_says_where_its_runs_ran() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let cpu = render(&root, "tests/data/oracle/generate.jsonl").unwrap();
        assert!(cpu.contains("on the CPU oracle") && !cpu.contains("on the H100"));
        assert!(cpu.contains("<summary>Every case ("));
        let gpu = render(&root, DEFAULT_DATA).unwrap();
        assert!(gpu.contains("one run on the H100") && !gpu.contains("CPU oracle"));
    }

    #[test]
    fn bad_data_fails_with_file_and_line() {
        let dir = std::env::temp_dir().join(format!("gm-val-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = r#"{"name": "a", "scenario": {"model": "gpt2", "batch": 1, "seq": 8}, "expect": {"peak_step": 1000000000}}"#;
        for bad in ["0", "-5"] {
            let bad_line = good.replace("1000000000", bad);
            std::fs::write(dir.join("d.jsonl"), format!("{good}\n{bad_line}\n")).unwrap();
            let e = render(&dir, "d.jsonl").unwrap_err();
            assert!(e.starts_with("d.jsonl:2: expect.peak_step"), "{e}");
        }
        assert!(render(&dir, ".")
            .unwrap_err()
            .contains("not a regular file"));
        #[cfg(unix)]
        assert!(render(Path::new("/"), "dev/zero")
            .unwrap_err()
            .contains("not a regular file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
