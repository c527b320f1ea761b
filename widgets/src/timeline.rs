//! Memory through one step: forward (activations pile up), backward (they are freed as
//! gradients appear), optimizer step — and the peak, which is not the sum of the parts.

use gpumem::Estimate;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::{grid, n, refused, settings, text_width, ticks, use_width, Toolbar};
use crate::format::{gib, tokens};
use crate::Init;

const H: f64 = 240.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 200.0;

/// The step's points, with the peak placed in the stretch it occurs in.
pub fn points(e: &Estimate) -> Vec<(String, f64, bool)> {
    let mut v: Vec<(String, f64, bool)> = e
        .timeline
        .iter()
        .map(|p| (p.phase.clone(), p.bytes as f64, false))
        .collect();
    let ph = e.peak_phase.as_str();
    let before = |name: &str| v.iter().position(|p| p.0.starts_with(name));
    let at = if ph.contains("optimizer") {
        before("end of step")
    } else if ph.contains("backward") {
        before("after backward").or_else(|| before("end of step"))
    } else if ph.starts_with("decode") {
        before("end of generation").map(|i| i + 1)
    } else if ph.starts_with("prefill") {
        before("after prefill")
    } else {
        before("forward: after the layers")
            .or_else(|| before("after forward"))
            .or_else(|| before("peak"))
    };
    let i = at.unwrap_or(v.len()).min(v.len());
    // Model-parallel estimates already list their peak.
    if let Some(p) = v.iter_mut().find(|p| p.0 == "peak") {
        p.0 = e.peak_phase.clone();
        p.2 = true;
    } else {
        v.insert(i, (e.peak_phase.clone(), e.peak_bytes as f64, true));
    }
    v
}

/// What the caption says of the model states: what is resident through the step, and where
/// the gradients are at the peak (the same bookkeeping as every chart).
pub fn states_note(e: &Estimate) -> String {
    let peak = format!("Peak {} during {}.", gib(e.peak_bytes as f64), e.peak_phase);
    if e.trainable_params == 0 {
        return format!(
            "{peak} The weights take {}; the KV cache reaches {}.",
            gib(e.weights_bytes as f64),
            gib(e.kv_cache_bytes as f64)
        );
    }
    let resident = (e.weights_bytes + e.master_weights_bytes + e.optimizer_states_bytes) as f64;
    let g_peak = e.components.get("gradients").copied().unwrap_or(0);
    let grads = if e.gradients_bytes == 0 {
        String::new()
    } else if g_peak == 0 {
        format!(
            "; the gradients ({}) are not allocated yet at the peak",
            gib(e.gradients_bytes as f64)
        )
    } else if g_peak >= e.gradients_bytes {
        format!(
            "; the gradients ({}) are all alive at the peak",
            gib(e.gradients_bytes as f64)
        )
    } else {
        format!(
            "; of the gradients ({}), {} are alive at the peak",
            gib(e.gradients_bytes as f64),
            gib(g_peak as f64)
        )
    };
    let names = if e.master_weights_bytes > 0 {
        "the weights, master weights and optimizer states"
    } else {
        "the weights and optimizer states"
    };
    format!(
        "{peak} Through the step {names} stay resident, {}{grads}.",
        gib(resident)
    )
}

#[component]
pub fn Timeline(init: &Init) -> Html {
    let (k, _) = use_knobs(init);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    let uid = &init.uid;
    let (title_id, summary_id) = (format!("{uid}-title"), format!("{uid}-summary"));
    let e = match k.estimate() {
        Ok(e) => e,
        Err(err) => return refused("timeline", root, err),
    };
    let pts = points(&e);
    let cap = e.capacity_bytes as f64;
    let top = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let tk = ticks(top.max(cap * 0.25));
    let ymax = *tk.last().unwrap_or(&top);
    let narrow = w < 480.0;
    let (l, r) = if narrow { (56.0, 16.0) } else { (70.0, 20.0) };
    let x = |i: usize| l + (w - l - r) * i as f64 / (pts.len().max(2) - 1) as f64;
    let y = |b: f64| BOTTOM - (BOTTOM - TOP) * (b / ymax.max(1.0)).min(1.05);
    let line: String = pts
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{},{}", n(x(i)), n(y(p.1))))
        .collect::<Vec<_>>()
        .join(" ");
    let area = format!(
        "{},{} {line} {},{}",
        n(x(0)),
        n(BOTTOM),
        n(x(pts.len() - 1)),
        n(BOTTOM)
    );
    let peak_i = pts.iter().position(|p| p.2).unwrap_or(0);
    // Phase names under their points, on two alternating rows when they fit; numbers (and
    // the names listed under the chart) when they do not.
    let spacing = (w - l - r) / (pts.len().max(2) - 1) as f64;
    let numbered = pts
        .iter()
        .any(|p| text_width(&short(&p.0)) > 2.0 * spacing - 6.0);
    let peak_text = format!("peak {}", gib(e.peak_bytes as f64));
    let peak_x = x(peak_i);
    let (anchor, px) = if peak_x + text_width(&peak_text) > w - r {
        ("end", peak_x - 6.0)
    } else if peak_x - text_width(&peak_text) / 2.0 < l {
        ("start", peak_x + 6.0)
    } else {
        ("middle", peak_x)
    };
    let note = states_note(&e);
    let summary = format!(
        "Memory through one step of {}: it peaks at {} during {}. {}",
        e.model,
        gib(e.peak_bytes as f64),
        e.peak_phase,
        if e.fits {
            "It fits."
        } else {
            "It does not fit."
        }
    );
    html! {
        <figure class="gm gm-timeline" data-widget="timeline" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "Memory through one step" }</span>
                <span class="gm-sub">{ format!("{} · b={} · s={}", e.model, k.count("batch", 1), tokens(k.count("seq", 2048))) }</span>
            </figcaption>
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(H))} role="img" aria-labelledby={summary_id.clone()}>
                { grid(&tk, l, w - r, y) }
                <polygon class="gm-area" points={area} />
                <polyline class="gm-line" fill="none" points={line} />
                if cap <= ymax * 1.05 {
                    <line class="gm-capline" x1={n(l)} x2={n(w - r)} y1={n(y(cap))} y2={n(y(cap))} />
                    <text class="gm-caplabel gm-halo" x={n(w - r)} y={n(y(cap) - 4.0)} text-anchor="end">{ format!("{} {}", e.gpu, gib(cap)) }</text>
                }
                { for pts.iter().enumerate().map(|(i, p)| html! {
                    <g class={classes!("gm-pt", p.2.then_some("gm-peak"))}>
                        <circle cx={n(x(i))} cy={n(y(p.1))} r={if p.2 { "5" } else { "3" }}><title>{ format!("{}: {}", p.0, gib(p.1)) }</title></circle>
                    </g>
                }) }
                <text class="gm-peaklabel gm-halo" x={n(px)} y={n((y(pts[peak_i].1) - 10.0).max(12.0))} text-anchor={anchor}>
                    { peak_text }
                </text>
                { for pts.iter().enumerate().map(|(i, p)| {
                    let t = if numbered { (i + 1).to_string() } else { short(&p.0) };
                    let row = if numbered { 0.0 } else { 11.0 * (i % 2) as f64 };
                    let xi = x(i);
                    let anchor = if i == 0 && !numbered { "start" } else if i + 1 == pts.len() && !numbered { "end" } else { "middle" };
                    html! {
                        <text class="gm-phase" x={n(xi)} y={n(BOTTOM + 14.0 + row)} text-anchor={anchor}>{ t }</text>
                    }
                }) }
            </svg>
            if numbered {
                <ol class="gm-phases">
                    { for pts.iter().map(|p| html! { <li class={classes!(p.2.then_some("gm-peak-phase"))}>{ format!("{} ({})", p.0, gib(p.1)) }</li> }) }
                </ol>
            }
            <p class="gm-note" data-value="peak">{ note }</p>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            <Toolbar name={format!("gpumem-timeline-{uid}")} settings={settings(&k)} />
        </figure>
    }
}

/// Phase names short enough for the axis.
fn short(p: &str) -> String {
    let s = p
        .replace("forward: after the layers", "layers done")
        .replace("after prefill (KV cache filled)", "prefilled")
        .replace("backward: ", "bwd: ")
        .replace("forward: ", "fwd: ");
    let t: String = s.chars().take(22).collect();
    if t.len() < s.len() {
        format!("{t}…")
    } else {
        t
    }
}
