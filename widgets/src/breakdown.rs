//! The annotated per-GPU breakdown: one stacked column of what is alive at the step's peak,
//! each slice labelled with its size and where it comes from, against the GPU's capacity.

use gpumem::num::{fixed, short};
use gpumem::scenario::{Mode, Model, Recompute};
use gpumem::{Estimate, Scenario};
use yew::prelude::*;

use crate::allocator::{buckets, use_knobs, use_live_marker};
use crate::chart::{n, refused, tick_label, ticks, Toolbar};
use crate::format::{gib, params, tokens};
use crate::Init;

/// Why a slice is as large as it is, in a few words, from the scenario itself.
pub fn why(key: &str, s: &Scenario, e: &Estimate) -> String {
    let p = &s.precision;
    match key {
        "weights" => match p.master {
            Some(m) if s.mode == Mode::Train => format!(
                "{} parameters × {} B ({}) + {} master copy",
                params(e.params),
                short(p.weights.bytes()),
                p.weights,
                m
            ),
            _ => format!(
                "{} parameters × {} B ({})",
                params(e.params),
                short(p.weights.bytes()),
                p.weights
            ),
        },
        "gradients" if e.components.get("gradients").copied().unwrap_or(0) == 0 => {
            "not allocated yet at the peak".into()
        }
        "gradients" => format!("one per trainable parameter, {}", p.grads),
        "optimizer" => format!(
            "{}: {} B per trainable parameter",
            s.optimizer.name(),
            fixed(
                e.optimizer_states_bytes as f64
                    * if s.parallel.zero >= 1 {
                        s.parallel.shard_ranks() as f64
                    } else {
                        1.0
                    }
                    / e.trainable_params.max(1) as f64,
                0
            )
        ),
        "kv" => "keys and values of every layer and token".into(),
        "activations" => format!(
            "saved for backward: batch {} × sequence {}{}",
            s.batch,
            tokens(s.seq),
            match s.recompute {
                Recompute::Full => ", layers recomputed",
                Recompute::Selective => ", attention recomputed",
                Recompute::None => "",
            }
        ),
        "logits" => match &s.model {
            Model::Arch { arch, .. } => format!(
                "batch × sequence × vocabulary ({}), in the loss's fp32",
                arch.vocab
            ),
            _ => "the output layer's scores".into(),
        },
        "temporaries" => "buffers alive at that moment".into(),
        _ => "CUDA context + caching allocator reserve".into(),
    }
}

const W: f64 = 640.0;
const H: f64 = 300.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 270.0;
const BAR_X: f64 = 70.0;
const BAR_W: f64 = 110.0;

#[component]
pub fn Breakdown(init: &Init) -> Html {
    let (k, _) = use_knobs(init);
    let root = use_live_marker();
    let uid = &init.uid;
    let (title_id, summary_id) = (format!("{uid}-title"), format!("{uid}-summary"));
    let got = k
        .scenario()
        .and_then(|s| gpumem::estimate(&s).map(|e| (s, e)));
    let (s, e) = match got {
        Ok(x) => x,
        Err(err) => return refused("breakdown", root, err),
    };
    let total = e.device_bytes as f64;
    let cap = e.capacity_bytes as f64;
    let scale_max = *ticks(total.max(cap)).last().unwrap_or(&total);
    let y = |b: f64| BOTTOM - (BOTTOM - TOP) * b / scale_max.max(1.0);
    let slices: Vec<_> = buckets(&e).into_iter().filter(|b| b.bytes > 0.0).collect();
    // Slices bottom-up, and their labels spread so that none overlap.
    let mut acc = 0.0;
    let mut mids = Vec::new();
    let rects: Html = slices
        .iter()
        .map(|b| {
            let (y0, y1) = (y(acc), y(acc + b.bytes));
            acc += b.bytes;
            mids.push((y0 + y1) / 2.0);
            html! {
                <rect class={format!("gm-f-{}", b.key)} x={n(BAR_X)} y={n(y1)} width={n(BAR_W)}
                    height={n((y0 - y1).max(0.0))}><title>{ format!("{}: {}", b.label, gib(b.bytes)) }</title></rect>
            }
        })
        .collect();
    let mut label_y = mids.clone();
    for i in 1..label_y.len() {
        if label_y[i] > label_y[i - 1] - 28.0 {
            label_y[i] = label_y[i - 1] - 28.0;
        }
    }
    let shift = (TOP + 10.0 - label_y.last().copied().unwrap_or(TOP + 10.0)).max(0.0);
    let labels: Html = slices
        .iter()
        .zip(mids.iter().zip(label_y.iter()))
        .map(|(b, (&m, &ly))| {
            let ly = ly + shift;
            html! {
                <g class={format!("gm-ann gm-s-{}", b.key)}>
                    <polyline class="gm-leader" fill="none"
                        points={format!("{},{} {},{} {},{}", n(BAR_X + BAR_W), n(m), n(BAR_X + BAR_W + 24.0), n(ly), n(BAR_X + BAR_W + 34.0), n(ly))} />
                    <text x={n(BAR_X + BAR_W + 40.0)} y={n(ly)} class="gm-ann-main">{ format!("{} — {}", b.label, gib(b.bytes)) }</text>
                    <text x={n(BAR_X + BAR_W + 40.0)} y={n(ly + 13.0)} class="gm-ann-why">{ why(b.key, &s, &e) }</text>
                </g>
            }
        })
        .collect();
    let axis: Html = ticks(total.max(cap))
        .into_iter()
        .map(|t| {
            html! {
                <g class="gm-tick">
                    <line x1={n(BAR_X - 6.0)} x2={n(BAR_X)} y1={n(y(t))} y2={n(y(t))} />
                    <text x={n(BAR_X - 9.0)} y={n(y(t) + 4.0)} text-anchor="end">{ tick_label(t) }</text>
                </g>
            }
        })
        .collect();
    let over = !e.fits;
    let summary = format!(
        "Per-GPU memory at the peak ({}): {} of {} on {}{}. {}.",
        e.peak_phase,
        gib(total),
        gib(cap),
        e.gpu,
        if over { ", does not fit" } else { ", fits" },
        slices
            .iter()
            .map(|b| format!("{} {}", b.label, gib(b.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        <figure class="gm gm-breakdown" data-widget="breakdown" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "Per-GPU memory at the peak" }</span>
                <span class="gm-sub">{ format!("{} · b={} · s={} · {}", e.model, s.batch, tokens(s.seq), s.precision.name) }</span>
            </figcaption>
            <svg class="gm-chart" viewBox={format!("0 0 {} {}", W as u32, H as u32)} role="img" aria-labelledby={summary_id.clone()}>
                { axis }
                { rects }
                <line class="gm-capline" x1={n(BAR_X - 10.0)} x2={n(BAR_X + BAR_W + 10.0)} y1={n(y(cap))} y2={n(y(cap))} />
                <text class="gm-caplabel" x={n(BAR_X + BAR_W / 2.0)} y={n(y(cap) - 5.0)} text-anchor="middle">{ format!("{} {}", e.gpu, gib(cap)) }</text>
                { labels }
                <text class={classes!("gm-verdict-svg", if over { "gm-over" } else { "gm-ok" })} x={n(BAR_X + BAR_W / 2.0)} y={n(H - 8.0)} text-anchor="middle">
                    { if over { format!("✗ {} over", gib(total - cap)) } else { format!("✓ {} free", gib(cap - total)) } }
                </text>
            </svg>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            <Toolbar name={format!("gpumem-breakdown-{uid}")} />
        </figure>
    }
}
