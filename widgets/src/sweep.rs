//! Memory against sequence length, batch or GPU count, component by component, with the
//! capacity line and the first point that no longer fits.

use yew::prelude::*;

use crate::allocator::{buckets, use_knobs, use_live_marker};
use crate::chart::{grid, n, ticks, Toolbar};
use crate::format::{gib, tokens};
use crate::{Init, Knobs};

const W: f64 = 640.0;
const H: f64 = 260.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 215.0;

/// The axis: its knob, its default range, and how its values read.
fn axis(name: &str) -> (&'static str, u64, u64) {
    match name {
        "batch" => ("batch", 1, 64),
        "gpus" => ("dp", 1, 1024),
        _ => ("seq", 512, 131072),
    }
}

/// One column of the sweep: the axis value, each bucket's bytes, and whether it fits.
pub type Column = (u64, Vec<(&'static str, &'static str, f64)>, bool, f64);

/// Powers of two from `from` to `to` (at most 20), each estimated.
pub fn columns(k: &Knobs, knob: &str, from: u64, to: u64) -> Vec<Column> {
    let mut out = Vec::new();
    let mut v = from.max(1);
    while v <= to && out.len() < 20 {
        if let Ok(e) = k.with(knob, v.to_string()).estimate() {
            let b = buckets(&e)
                .into_iter()
                .map(|b| (b.key, b.label, b.bytes))
                .collect();
            out.push((v, b, e.fits, e.device_bytes as f64));
        }
        v *= 2;
    }
    out
}

#[component]
pub fn Sweep(init: &Init) -> Html {
    let (k, _) = use_knobs(init);
    let root = use_live_marker();
    let uid = &init.uid;
    let (title_id, summary_id) = (format!("{uid}-title"), format!("{uid}-summary"));
    let axis_name = init.option("axis").unwrap_or("seq");
    let (knob, lo, hi) = axis(axis_name);
    let count = |key: &str, d: u64| {
        init.option(key)
            .and_then(|v| gpumem::knobs::count(key, v).ok())
            .unwrap_or(d)
    };
    let (from, to) = (count("from", lo), count("to", hi));
    let cols = columns(&k, knob, from, to);
    let cap = k.estimate().map(|e| e.capacity_bytes as f64).unwrap_or(0.0);
    if cols.is_empty() {
        return html! {
            <figure class="gm gm-sweep" data-widget="sweep" ref={root}>
                <p class="gm-error" role="alert">{ "Cannot estimate any point of this sweep." }</p>
            </figure>
        };
    }
    let top = cols.iter().map(|c| c.3).fold(cap, f64::max);
    let tk = ticks(top);
    let ymax = *tk.last().unwrap_or(&top);
    let x = |i: usize| L + (W - L - R) * i as f64 / (cols.len().max(2) - 1) as f64;
    let y = |b: f64| BOTTOM - (BOTTOM - TOP) * b / ymax.max(1.0);
    let keys: Vec<(&str, &str)> = cols[0].1.iter().map(|b| (b.0, b.1)).collect();
    // Stacked areas, bottom-up.
    let mut below = vec![0.0; cols.len()];
    let mut layers = Vec::new();
    for (ki, (key, label)) in keys.iter().enumerate() {
        let upper: Vec<f64> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| below[i] + c.1.get(ki).map_or(0.0, |b| b.2))
            .collect();
        if upper.iter().zip(&below).all(|(u, b)| u - b <= 0.0) {
            continue;
        }
        let mut pts: Vec<String> = (0..cols.len())
            .map(|i| format!("{},{}", n(x(i)), n(y(upper[i]))))
            .collect();
        pts.extend(
            (0..cols.len())
                .rev()
                .map(|i| format!("{},{}", n(x(i)), n(y(below[i])))),
        );
        layers.push(html! {
            <polygon class={format!("gm-f-{key}")} points={pts.join(" ")}><title>{ *label }</title></polygon>
        });
        below = upper;
    }
    let label = |v: u64| match knob {
        "seq" => tokens(v),
        "dp" => format!("{v} GPUs"),
        _ => v.to_string(),
    };
    let first_over = cols.iter().position(|c| !c.2);
    let verdict = match first_over {
        None => format!(
            "Fits across the whole range, up to {}.",
            label(cols[cols.len() - 1].0)
        ),
        Some(0) => format!(
            "Does not fit anywhere in this range (from {}).",
            label(cols[0].0)
        ),
        Some(i) => format!(
            "Stops fitting at {} {} ({} > {}).",
            axis_name,
            label(cols[i].0),
            gib(cols[i].3),
            gib(cap)
        ),
    };
    let summary = format!(
        "Per-GPU memory against {axis_name}, from {} ({}) to {} ({}), capacity {}. {verdict}",
        label(cols[0].0),
        gib(cols[0].3),
        label(cols[cols.len() - 1].0),
        gib(cols[cols.len() - 1].3),
        gib(cap)
    );
    html! {
        <figure class="gm gm-sweep" data-widget="sweep" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ format!("Memory against {}", if knob == "dp" { "GPU count" } else { axis_name }) }</span>
                <span class="gm-sub">{ k.get("model").unwrap_or(gpumem::knobs::DEFAULT_MODEL).to_string() }</span>
            </figcaption>
            <svg class="gm-chart" viewBox={format!("0 0 {} {}", W as u32, H as u32)} role="img" aria-labelledby={summary_id.clone()}>
                { grid(&tk, L, W - R, y) }
                { for layers }
                <line class="gm-capline" x1={n(L)} x2={n(W - R)} y1={n(y(cap))} y2={n(y(cap))} />
                <text class="gm-caplabel" x={n(W - R)} y={n(y(cap) - 4.0)} text-anchor="end">{ format!("capacity {}", gib(cap)) }</text>
                if let Some(i) = first_over {
                    <line class="gm-overline" x1={n(x(i))} x2={n(x(i))} y1={n(TOP)} y2={n(BOTTOM)} />
                    <text class="gm-overlabel" x={n(x(i) + 4.0)} y={n(TOP + 12.0)}>{ format!("✗ from {}", label(cols[i].0)) }</text>
                }
                { for cols.iter().enumerate().map(|(i, c)| html! {
                    <text class="gm-phase" x={n(x(i))} y={n(BOTTOM + 14.0)} text-anchor="middle">{ label(c.0) }</text>
                }) }
            </svg>
            <ul class="gm-legend">
                { for keys.iter().filter(|(key, _)| cols.iter().any(|c| c.1.iter().any(|b| b.0 == *key && b.2 > 0.0))).map(|(key, label)| html! {
                    <li><span class={classes!("gm-swatch", format!("gm-c-{key}"))} aria-hidden="true"></span><span class="gm-name">{ *label }</span></li>
                }) }
            </ul>
            <p class={classes!("gm-verdict", if first_over.is_some() { "gm-over" } else { "gm-ok" })} data-value="verdict">{ verdict }</p>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            <Toolbar name={format!("gpumem-sweep-{uid}")} />
        </figure>
    }
}
