//! Memory against sequence length, batch or GPU count, part by part, with the capacity line
//! and the first value that no longer fits, found exactly (between samples, by bisection).
//! A linear axis by default, its height zoomed to about 1.5× the GPU's capacity (what goes
//! beyond is marked at the edge), or to the step's own height where it stays under a
//! quarter of the GPU (the capacity then named above the chart); a log axis on request.

use yew::prelude::*;

use crate::allocator::{key_legend, use_checked_set, use_knobs, use_live_marker};
use crate::chart::{
    el, fit, n, settings, text_width, tick_label, ticks_n, use_toolbar, use_width, verdict_p,
};
use crate::controls::radio_group;
use crate::format::{count, gib, tokens};
use crate::levers::levers;
use crate::parts;
use crate::{Init, Knobs};

const H: f64 = 270.0;
const TOP: f64 = 18.0;
const BOTTOM: f64 = 226.0;

/// The axis: its knob, its default range, and whether it reads best on a log scale.
fn axis(name: &str) -> (&'static str, u64, u64, bool) {
    match name {
        "batch" => ("batch", 1, 64, false),
        "gpus" => ("dp", 1, 1024, true),
        _ => ("seq", 512, 131072, false),
    }
}

/// One column of the sweep: the axis value, each part's bytes, whether it fits, the device
/// total.
pub type Column = (u64, Vec<(&'static str, f64)>, bool, f64);

/// One value of the axis, estimated.
pub fn column_of(k: &Knobs, knob: &str, v: u64) -> Option<Column> {
    column(k, knob, v)
}

fn column(k: &Knobs, knob: &str, v: u64) -> Option<Column> {
    let e = k.with(knob, v.to_string()).estimate().ok()?;
    let b = parts::of_estimate(&e)
        .into_iter()
        .map(|s| (s.key(), s.bytes))
        .collect();
    Some((v, b, e.fits, e.device_bytes as f64))
}

/// The values a sweep samples: powers of two on a log axis; on a linear one, every whole
/// number when there are few, else 13 evenly spaced values (rounded to 64 on long ranges).
pub fn samples(from: u64, to: u64, log: bool) -> Vec<u64> {
    let (from, to) = (from.max(1), to.max(from.max(1)));
    if log {
        let mut v = Vec::new();
        let mut x = from;
        while x <= to && v.len() < 24 {
            v.push(x);
            x = x.saturating_mul(2);
        }
        return v;
    }
    if to - from <= 40 {
        return (from..=to).collect();
    }
    let steps = 12u64;
    let mut v: Vec<u64> = (0..=steps)
        .map(|i| {
            let x = from as f64 + (to - from) as f64 * i as f64 / steps as f64;
            let x = if to - from > 4096 {
                (x / 64.0).round() * 64.0
            } else {
                x.round()
            };
            (x as u64).clamp(from, to)
        })
        .collect();
    v.dedup();
    v
}

/// Every sample, estimated.
pub fn columns(k: &Knobs, knob: &str, values: &[u64]) -> Vec<Column> {
    values.iter().filter_map(|&v| column(k, knob, v)).collect()
}

/// The first value that does not fit between a value that fits and one that does not (the
/// estimate grows with each axis), and its estimate. False position (the estimate is nearly
/// straight between samples), halving the bracket when a side does not move: exact, in a few
/// estimates.
pub fn first_over(k: &Knobs, knob: &str, fits: u64, over: Column) -> Column {
    let Some(low) = column(k, knob, fits) else {
        return over;
    };
    let cap = k.estimate().map(|e| e.capacity_bytes as f64).unwrap_or(0.0);
    let (mut lo, mut hi) = (low, over);
    // Updates of the same side in a row: after two, the next guess halves the bracket.
    let (mut same, mut last) = (0, false);
    while hi.0 > lo.0 + 1 {
        let guess = if same < 2 && hi.3 > lo.3 {
            let t = ((cap - lo.3) / (hi.3 - lo.3)).clamp(0.0, 1.0);
            (lo.0 as f64 + (hi.0 - lo.0) as f64 * t).ceil() as u64
        } else {
            lo.0 + (hi.0 - lo.0) / 2
        };
        let Some(c) = column(k, knob, guess.clamp(lo.0 + 1, hi.0 - 1)) else {
            break;
        };
        same = if c.2 == last { same + 1 } else { 0 };
        last = c.2;
        if c.2 {
            lo = c;
        } else {
            hi = c;
        }
    }
    hi
}

/// "needs 79.21 GiB of 79.18 GiB on H100-80GB": as many decimals as it takes to tell the two
/// apart (up to three).
pub fn needs(total: f64, cap: f64, gpu: &str) -> String {
    let g = 1073741824.0;
    let d = (1..=3)
        .find(|&d| gpumem::num::fixed(total / g, d) != gpumem::num::fixed(cap / g, d))
        .unwrap_or(3);
    format!(
        "needs {} GiB of {} GiB on {gpu}",
        gpumem::num::fixed(total / g, d),
        gpumem::num::fixed(cap / g, d)
    )
}

/// The end of a range from `from`: `to`, or the last value before it that the model takes
/// (gpt2 has learned positions for 1,024 tokens and no more), found by bisection.
pub fn last_taken(k: &Knobs, knob: &str, from: u64, to: u64) -> u64 {
    let takes = |v: u64| column(k, knob, v).is_some();
    if to <= from || takes(to) || !takes(from) {
        return to;
    }
    let (mut lo, mut hi) = (from, to);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if takes(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Where a linear sweep from `from` ends: `to`, or a round value about a tenth past the first
/// that needs more than `limit` bytes (found to a hundredth of the range), if that comes
/// earlier.
pub fn linear_end(k: &Knobs, knob: &str, from: u64, to: u64, limit: f64) -> u64 {
    let total = |v: u64| column(k, knob, v).map(|c| c.3);
    match (total(from), total(to)) {
        (Some(a), Some(b)) if a <= limit && b > limit => {}
        _ => return to,
    }
    let (mut lo, mut hi) = (from, to);
    let tolerance = ((to - from) / 100).max(1);
    while hi - lo > tolerance {
        let mid = lo + (hi - lo) / 2;
        match total(mid) {
            Some(b) if b <= limit => lo = mid,
            Some(_) => hi = mid,
            None => break,
        }
    }
    // Round in the axis' own units: thousands of tokens (1K = 1024) for sequences.
    let unit = if knob == "seq" && hi >= 1024 {
        1024.0
    } else {
        1.0
    };
    let end = hi as f64 * 1.1 / unit;
    let mag = 10f64.powi(end.log10().floor() as i32);
    let round = [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|v| *v >= end - 1e-9)
        .unwrap_or(10.0 * mag);
    ((round.ceil() * unit) as u64).clamp(from.saturating_add(1), to)
}

/// Round values along a linear axis: steps of a power of two times 1K for tokens, of 1, 2, 5
/// × 10^k otherwise, at most `max` of them.
fn lin_ticks(lo: u64, hi: u64, max: usize, tokens: bool) -> Vec<u64> {
    let span = (hi - lo).max(1) as f64 / max.max(1) as f64;
    let step = if tokens {
        let mut s = 256u64;
        while (s as f64) < span {
            s *= 2;
        }
        s
    } else {
        let mag = 10f64.powi(span.log10().floor() as i32);
        [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|s| *s >= span)
            .unwrap_or(10.0 * mag)
            .max(1.0) as u64
    };
    let first = lo.div_ceil(step) * step;
    (0..)
        .map(|i| first + i * step)
        .take_while(|&v| v <= hi)
        .collect()
}

/// The sweep widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_sweep(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    let (try_set, refused_msg) = use_checked_set(set);
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let toolbar = use_toolbar(init, settings(&k));
    let axis_name = init.option("axis").unwrap_or("seq");
    let (knob, lo, hi, log_default) = axis(axis_name);
    // The page's choice, or the reader's that the URL carries (`loader.js` puts it in).
    let scale = use_state(|| match init.option("scale") {
        Some(s) => s == "log",
        None => log_default,
    });
    let log = *scale;
    let count_opt = |key: &str, d: u64| {
        init.option(key)
            .and_then(|v| gpumem::knobs::count(key, v).ok())
            .unwrap_or(d)
    };
    let from = count_opt("from", lo);
    let to = last_taken(&k, knob, from, count_opt("to", hi));
    // The page's own scenario refused: the engine's reason, as every widget gives it (the
    // points it could draw would stand against no GPU).
    let here = match k.estimate() {
        Ok(e) => e,
        Err(e) => return crate::chart::refused("sweep", root, e),
    };
    let cap_now = here.capacity_bytes as f64;
    // On a linear axis the range ends a little past where the step needs 1.5× the GPU (found
    // on the doublings, then exactly): beyond, everything is off the chart anyway, and the
    // log axis shows the whole range.
    let lin_to = if log || to.saturating_sub(from) <= 40 {
        to
    } else {
        linear_end(&k, knob, from, to, 1.5 * cap_now)
    };
    let cols = columns(&k, knob, &samples(from, lin_to, log));
    let cap = cap_now;
    let gpu = here.gpu;
    if cols.is_empty() {
        return html! {
            <figure class="gm gm-sweep" data-widget="sweep" ref={root}>
                <p class="gm-error" role="alert">{ "Cannot estimate any point of this sweep." }</p>
            </figure>
        };
    }
    let label = |v: u64| match knob {
        "seq" => tokens(v),
        "dp" => format!("{v} GPUs"),
        _ => v.to_string(),
    };
    let exact = |v: u64| match knob {
        "seq" => format!("{} tokens", count(v)),
        "dp" => format!("{v} GPUs"),
        _ => v.to_string(),
    };
    // The first value that does not fit: between the last sample that fits and the next.
    let over_at = cols.iter().position(|c| !c.2);
    let first = match over_at {
        Some(i) if i > 0 => Some(first_over(&k, knob, cols[i - 1].0, cols[i].clone())),
        Some(_) => Some(cols[0].clone()),
        None => None,
    };
    // Axes: the value axis up to about 1.5× the capacity; beyond it, marks at the edge.
    // A step that stays under a quarter of the GPU is drawn to its own height, the
    // capacity named above the chart (at the GPU's scale it would be a hairline).
    let narrow = w < 480.0;
    let (l, r) = if narrow { (56.0, 12.0) } else { (70.0, 20.0) };
    let top_data = cols.iter().map(|c| c.3).fold(0.0, f64::max);
    let zoom = top_data < cap / 4.0;
    let shown_max = if zoom {
        top_data
    } else {
        top_data.min(1.5 * cap).max(cap)
    };
    let tk = ticks_n(shown_max, if narrow { 4.0 } else { 5.0 });
    let ymax = *tk.last().unwrap_or(&shown_max);
    let (vmin, vmax) = (cols[0].0 as f64, cols[cols.len() - 1].0 as f64);
    let pos = |v: f64| -> f64 {
        let f = if vmax <= vmin {
            0.0
        } else if log {
            (v.ln() - vmin.ln()) / (vmax.ln() - vmin.ln())
        } else {
            (v - vmin) / (vmax - vmin)
        };
        l + (w - l - r) * f
    };
    let x = |i: usize| pos(cols[i].0 as f64);
    let y = |b: f64| BOTTOM - (BOTTOM - TOP) * b.min(ymax) / ymax.max(1.0);
    // Stacked areas, bottom-up, in the table's order. The legend names those at least half
    // a pixel thick somewhere: a thinner one is stacked but cannot be seen.
    let thick = |key: &str, at_least: f64| {
        cols.iter()
            .any(|c| c.1.iter().any(|b| b.0 == key && b.1 > at_least))
    };
    let keys: Vec<&'static str> = parts::PARTS
        .iter()
        .map(|p| p.key)
        .filter(|key| thick(key, 0.0))
        .collect();
    let seen: Vec<&'static str> = keys
        .iter()
        .copied()
        .filter(|key| thick(key, ymax.max(1.0) * 0.5 / (BOTTOM - TOP)))
        .collect();
    let mut below = vec![0.0; cols.len()];
    let mut layers = Vec::new();
    for key in &keys {
        let upper: Vec<f64> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| below[i] + c.1.iter().find(|b| b.0 == *key).map_or(0.0, |b| b.1))
            .collect();
        let mut pts: Vec<String> = (0..cols.len())
            .map(|i| format!("{},{}", n(x(i)), n(y(upper[i]))))
            .collect();
        pts.extend(
            (0..cols.len())
                .rev()
                .map(|i| format!("{},{}", n(x(i)), n(y(below[i])))),
        );
        let name = parts::find(key).map_or("", |p| p.label);
        layers.push(el(
            "polygon",
            &["class", "points"],
            vec![format!("gm-f-{key}").into(), pts.join(" ").into()],
            html! { <title>{ name }</title> },
        ));
        below = upper;
    }
    // What goes beyond the top: a mark at the edge over each such sample.
    let beyond: Html = cols
        .iter()
        .enumerate()
        .filter(|(_, c)| c.3 > ymax)
        .map(|(i, c)| {
            let cx = x(i);
            html! {
                <polygon class="gm-beyond" points={format!("{},{} {},{} {},{}", n(cx - 4.0), n(TOP + 2.0), n(cx + 4.0), n(TOP + 2.0), n(cx), n(TOP - 5.0))}>
                    <title>{ format!("{}: {} (beyond the chart)", label(c.0), gib(c.3)) }</title>
                </polygon>
            }
        })
        .collect();
    let beyond_note = match (top_data > ymax, lin_to < to) {
        (true, _) => Some(format!(
            "▲ beyond the chart: up to {}, {}× the GPU, at {}{}",
            gib(top_data),
            gpumem::num::fixed(top_data / cap.max(1.0), 1),
            label(cols[cols.len() - 1].0),
            if lin_to < to {
                format!("; the log axis shows the whole range, to {}", label(to))
            } else {
                String::new()
            }
        )),
        (false, true) => Some(format!(
            "The chart stops at {}, where the step needs {}, {}× the GPU; the log axis shows the whole range, to {}.",
            label(lin_to),
            gib(top_data),
            gpumem::num::fixed(top_data / cap.max(1.0), 1),
            label(to)
        )),
        _ => None,
    };
    // The value axis' labels: round values, as many as fit.
    let room = ((w - l - r) / 56.0).floor().max(2.0) as usize;
    let marks: Vec<(f64, String)> = if log {
        let every = cols.len().div_ceil(room).max(1);
        cols.iter()
            .enumerate()
            .filter(|(i, _)| i % every == 0 || *i == cols.len() - 1)
            .map(|(i, c)| (x(i), label(c.0)))
            .collect()
    } else {
        lin_ticks(cols[0].0, cols[cols.len() - 1].0, room, knob == "seq")
            .into_iter()
            .map(|v| (pos(v as f64), label(v)))
            .collect()
    };
    let verdict = match &first {
        None => format!(
            "Fits across the whole range, up to {}.",
            exact(cols[cols.len() - 1].0)
        ),
        Some(c) if c.0 == cols[0].0 => format!(
            "Does not fit anywhere in this range (from {}, {}).",
            exact(cols[0].0),
            needs(c.3, cap, &gpu)
        ),
        Some(c) => format!(
            "Stops fitting at {axis_name} {}: from there the step needs more than the {} of the {gpu}.",
            exact(c.0),
            gib(cap)
        ),
    };
    let summary = format!(
        "Per-GPU memory against {axis_name}, from {} ({}) to {} ({}), capacity {} on {gpu}. {verdict}",
        label(cols[0].0),
        gib(cols[0].3),
        label(cols[cols.len() - 1].0),
        gib(cols[cols.len() - 1].3),
        gib(cap)
    );
    let cap_label = format!("{gpu} {}{}", gib(cap), if zoom { " ▲" } else { "" });
    let on_scale = {
        let scale = scale.clone();
        Callback::from(move |v: String| {
            #[cfg(target_arch = "wasm32")]
            crate::store::url::set_scale(v == "log");
            scale.set(v == "log")
        })
    };
    let over_x = first.as_ref().map(|c| pos(c.0 as f64));
    // The capacity's name at the left, or at the right where the "stops fitting" line would
    // run through it (a halo does not hide a line between letters).
    let cap_label = fit(&cap_label, w - l - r - 10.0);
    let (cap_x, cap_anchor) = match over_x {
        Some(ox) if ox < l + 10.0 + text_width(&cap_label) => (w - r - 4.0, "end"),
        _ => (l + 4.0, "start"),
    };
    html! {
        <figure class="gm gm-sweep" data-widget="sweep" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ format!("Memory against {}", if knob == "dp" { "GPU count" } else { axis_name }) }</span>
                <span class="gm-sub">{ format!("{} · {}", k.model_name(), gpu) }</span>
            </figcaption>
            { levers(init, &k, &try_set) }
            { refused_msg }
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(H))} role="img" aria-labelledby={summary_id.clone()}>
                { for tk.iter().map(|&t| html! {
                    <g class="gm-tick">
                        <line class="gm-grid" x1={n(l)} x2={n(w - r)} y1={n(y(t))} y2={n(y(t))} />
                        <text x={n(l - 6.0)} y={n(y(t) + 4.0)} text-anchor="end">{ tick_label(t) }</text>
                    </g>
                }) }
                { for layers }
                { beyond }
                // Zoomed, the capacity is above the chart: no line.
                <line class="gm-capline" x1={n(l)} x2={n(if zoom { l } else { w - r })} y1={n(y(cap))} y2={n(y(cap))} />
                if let (Some(ox), Some(c)) = (over_x, &first) {
                    <line class="gm-overline" x1={n(ox)} x2={n(ox)} y1={n(TOP)} y2={n(BOTTOM)} />
                    <text class="gm-overlabel gm-halo" x={n(if ox > w - r - 90.0 { ox - 4.0 } else { ox + 4.0 })} y={n(TOP + 24.0)}
                        text-anchor={if ox > w - r - 90.0 { "end" } else { "start" }}>{ format!("✗ from {}", label(c.0)) }</text>
                }
                <text class="gm-caplabel gm-halo" x={n(cap_x)} y={n(y(cap) - 5.0)} text-anchor={cap_anchor}>{ cap_label }</text>
                { for marks.iter().map(|(mx, t)| html! {
                    <text class="gm-phase" x={n(*mx)} y={n(BOTTOM + 15.0)}
                        text-anchor={if *mx - text_width(t) / 2.0 < l - 20.0 { "start" } else if *mx + text_width(t) / 2.0 > w { "end" } else { "middle" }}>{ t.clone() }</text>
                }) }
                <text class="gm-axis-label" x={n(l + (w - l - r) / 2.0)} y={n(H - 12.0)} text-anchor="middle">
                    { match knob { "seq" => "sequence length (tokens)", "dp" => "data-parallel GPUs", _ => "batch (sequences)" } }
                </text>
            </svg>
            if let Some(note) = beyond_note {
                <p class="gm-note">{ note }</p>
            }
            { key_legend(&seen) }
            { verdict_p(first.is_none(), verdict, true) }
            <div class="gm-controls gm-controls-inline">
                { radio_group(init.id("scale"), "Axis",
                    vec![("linear".to_string(), "linear".to_string()), ("log".to_string(), "log (doublings)".to_string())],
                    if log { "log" } else { "linear" }.to_string(), on_scale) }
            </div>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            { toolbar }
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_ticks() {
        assert_eq!(samples(1, 16, false), (1..=16).collect::<Vec<_>>());
        assert_eq!(samples(1, 16, true), [1, 2, 4, 8, 16]);
        let s = samples(512, 131072, false);
        assert_eq!((s[0], s[s.len() - 1], s.len()), (512, 131072, 13));
        assert!(s.iter().all(|v| v % 64 == 0));
        assert_eq!(
            lin_ticks(512, 131072, 5, true),
            [32768, 65536, 98304, 131072]
        );
        assert_eq!(lin_ticks(1, 16, 8, false), [2, 4, 6, 8, 10, 12, 14, 16]);
    }

    /// A part too thin to see (cuBLAS's workspaces against a 70B model's states) is stacked
    /// but not named in the legend.
    #[test]
    fn the_legend_names_what_can_be_seen() {
        let i = Init {
            widget: "sweep".into(),
            uid: "t".into(),
            page: "t".into(),
            knobs: Knobs(
                [("model", "llama3.1-70b"), ("seq", "4k")]
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            options: Default::default(),
            local: true,
        };
        let html = crate::render(&i).unwrap();
        assert!(html.contains("gm-f-workspaces"), "{html}");
        assert!(!html.contains(r#"data-bucket="workspaces""#), "{html}");
        assert!(html.contains(r#"data-bucket="weights""#), "{html}");
    }

    #[test]
    fn the_threshold_is_the_first_value_that_does_not_fit() {
        let k = Knobs::default()
            .with("model", "llama3.2-1b")
            .with("seq", "4k")
            .with("precision", "bf16");
        let cols = columns(&k, "batch", &samples(1, 16, true));
        let i = cols.iter().position(|c| !c.2).unwrap();
        let first = first_over(&k, "batch", cols[i - 1].0, cols[i].clone());
        assert!(!first.2);
        assert!(column(&k, "batch", first.0 - 1).unwrap().2, "one less fits");
        assert!(first.0 < cols[i].0, "between the samples: {}", first.0);
    }
}
