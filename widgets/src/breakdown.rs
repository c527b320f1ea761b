//! The annotated per-GPU breakdown: one stacked column of what is alive at the step's peak,
//! each slice labelled with its size and where it comes from, against the GPU's capacity.
//! Optional levers (`levers=finetune,rank,targets`) put the chapter's choice on the widget.

use gpumem::num::{fixed, short};
use gpumem::scenario::{Finetune, Mode, Model, Recompute};
use gpumem::{Estimate, Scenario};
use yew::prelude::*;

use crate::allocator::{use_checked_set, use_knobs, use_live_marker};
use crate::chart::{el, fit, n, refused, settings, tick_label, ticks, use_toolbar, use_width};
use crate::format::{params, tokens, wrap, Sum};
use crate::levers::levers;
use crate::parts;
use crate::quantity::quantized;
use crate::Init;

/// Why a part is as large as it is, in a few words, from the scenario itself.
pub fn why(key: &str, s: &Scenario, e: &Estimate) -> String {
    let p = &s.precision;
    let lora = matches!(s.finetune, Finetune::Lora(_));
    match key {
        "weights" => match quantized(s, e) {
            Some(z) => format!(
                "{} in {} ({} B each) + {} in {} (embeddings, output layer, norms){}",
                params(z.linear as u64),
                z.dtype,
                fixed(z.dtype.bytes(), 3),
                params(z.rest as u64),
                z.compute,
                if z.adapters > 0.0 {
                    format!(" + {} fp32 adapters", params(z.adapters as u64))
                } else {
                    String::new()
                }
            ),
            None if lora => format!(
                "{} frozen × {} B ({}) + {} fp32 adapters",
                params(e.params),
                short(p.weights.bytes()),
                p.weights,
                params(e.trainable_params)
            ),
            None => format!(
                "{} parameters × {} B ({})",
                params(e.params),
                short(p.weights.bytes()),
                p.weights
            ),
        },
        "master" => format!(
            "the {} copy the optimizer updates",
            p.master.map(|m| m.name()).unwrap_or("full-precision")
        ),
        "gradients" if e.components.get("gradients").copied().unwrap_or(0) == 0 => {
            "not allocated yet at the peak".into()
        }
        "gradients" if s.parallel.grad_accum > 1 => format!(
            "one per trainable parameter, {}, accumulated over {} micro-batches",
            if lora {
                gpumem::dtype::DType::F32
            } else {
                p.grads
            },
            s.parallel.grad_accum
        ),
        "gradients" => format!(
            "one per trainable parameter, {}",
            if lora {
                gpumem::dtype::DType::F32
            } else {
                p.grads
            }
        ),
        "optimizer" => format!(
            "{}: {} B per trainable parameter",
            s.optimizer.name(),
            short(
                (e.optimizer_states_bytes as f64
                    * if s.parallel.zero >= 1 {
                        s.parallel.shard_ranks() as f64
                    } else {
                        1.0
                    }
                    / e.trainable_params.max(1) as f64
                    * 100.0)
                    .round()
                    / 100.0
            )
        ),
        "copies" => {
            if matches!(&s.finetune, Finetune::Lora(l) if l.quantized) {
                "a weight dequantised to bf16 for its matmul".into()
            } else if p.autocast() {
                "autocast's bf16 copies of the fp32 weights".into()
            } else {
                "low-precision copies of the weights for the matmuls".into()
            }
        }
        "gathered" => "parameters all-gathered whole for compute".into(),
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
        "logits" if s.mode == Mode::Inference => "the last position's scores".into(),
        "logits" => match &s.model {
            Model::Arch { arch, .. } => format!(
                "batch × sequence × vocabulary ({}), the loss's fp32 copies",
                crate::format::count(arch.vocab)
            ),
            _ => "the output layer's scores".into(),
        },
        "comm" => "gradient buckets, collective and pipeline buffers".into(),
        "temporaries" => "short-lived buffers alive at that moment".into(),
        "workspaces" => "one per thread that multiplies matrices, kept from its first matmul".into(),
        "other" => "components this chart does not name".into(),
        // The widgets do not replay the caching allocator: its cache is not in these figures.
        _ if e.managed_bytes > 0 => {
            "the CUDA context and paged optimizer states, outside PyTorch's allocator; its cache comes on top (chapter 6)".into()
        }
        _ => "outside PyTorch's allocator; its cache comes on top (chapter 6)".into(),
    }
}

const TOP: f64 = 16.0;

/// The breakdown widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_breakdown(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    let (try_set, refused_msg) = use_checked_set(set);
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let toolbar = use_toolbar(init, settings(&k));
    let got = k.scenario().and_then(|s| k.estimate().map(|e| (s, e)));
    let (s, e) = match got {
        Ok(x) => x,
        Err(err) => return refused("breakdown", root, err),
    };
    let total = e.device_bytes as f64;
    let cap = e.capacity_bytes as f64;
    let sum = Sum::of(total);
    let narrow = w < 480.0;
    let (bar_x, bar_w, gap_x) = if narrow {
        (52.0, 44.0, 24.0)
    } else {
        (70.0, 110.0, 34.0)
    };
    let label_x = bar_x + bar_w + gap_x;
    let text_w = (w - label_x - 6.0).max(80.0);
    let chars = (text_w / 6.3).floor().max(10.0) as usize;
    let all = parts::of_estimate(&e);
    let texts = sum.texts(&all.iter().map(|x| x.bytes).collect::<Vec<_>>());
    let slices: Vec<(parts::Slice, String)> = all
        .into_iter()
        .zip(texts)
        .filter(|(x, _)| x.bytes > 0.0)
        .collect();
    // The labels: each slice's, and the capacity's, as blocks of lines spread so that none
    // overlap; the chart is as tall as they need.
    // Each label: its name and size (bold), then why, both wrapped to the room there is.
    struct Block {
        key: &'static str,
        main: Vec<String>,
        lines: Vec<String>,
        anchor: f64,
        y: f64,
    }
    let wrapped = |text: &str, max: usize| {
        let mut lines: Vec<String> = wrap(text, chars)
            .into_iter()
            .map(|l| fit(&l, text_w))
            .collect();
        if lines.len() > max {
            lines.truncate(max);
            lines[max - 1] = fit(&format!("{} …", lines[max - 1]), text_w);
        }
        lines
    };
    let mut blocks: Vec<Block> = slices
        .iter()
        .map(|(x, t)| Block {
            key: x.key(),
            main: wrapped(&format!("{} — {t}", x.label()), 2),
            lines: wrapped(&why(x.key(), &s, &e), if narrow { 4 } else { 3 }),
            anchor: 0.0,
            y: 0.0,
        })
        .collect();
    blocks.push(Block {
        key: "capacity",
        main: wrapped(&format!("{} capacity — {}", e.gpu, sum.gib(cap)), 2),
        lines: Vec::new(),
        anchor: 0.0,
        y: 0.0,
    });
    let height_of = |b: &Block| 13.0 * (b.main.len() + b.lines.len()) as f64 + 6.0;
    let needed: f64 = blocks.iter().map(height_of).sum();
    let bottom = TOP + needed.max(254.0);
    let h = bottom + 30.0;
    let scale_max = *ticks(total.max(cap)).last().unwrap_or(&total);
    let y = |b: f64| bottom - (bottom - TOP) * b / scale_max.max(1.0);
    // Slices bottom-up.
    let mut acc = 0.0;
    let mut rects = Vec::new();
    for (i, (x, t)) in slices.iter().enumerate() {
        let (y0, y1) = (y(acc), y(acc + x.bytes));
        acc += x.bytes;
        blocks[i].anchor = (y0 + y1) / 2.0;
        rects.push(el(
            "rect",
            &["class", "x", "y", "width", "height"],
            vec![
                format!("gm-f-{}", x.key()).into(),
                n(bar_x).into(),
                n(y1).into(),
                n(bar_w).into(),
                n((y0 - y1).max(0.0)).into(),
            ],
            html! { <title>{ format!("{}: {t}", x.label()) }</title> },
        ));
    }
    let last = blocks.len() - 1;
    blocks[last].anchor = y(cap);
    // Spread: bottom-most first, each block above the one below it.
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    gpumem::order::sort_by(&mut order, |&a, &b| {
        blocks[b].anchor.total_cmp(&blocks[a].anchor)
    });
    let mut floor = bottom + 10.0;
    for &i in &order {
        let extra = height_of(&blocks[i]) - 13.0;
        let yv = blocks[i].anchor.min(floor - extra);
        blocks[i].y = yv;
        floor = yv - 13.0;
    }
    // Then top-down: none above the chart's top, each below the one above it. The chart is
    // as tall as the labels need, so packed from the top they still end above its bottom
    // (shifting them all down instead ran the lowest past it, under the toolbar).
    let mut ceiling = TOP + 10.0;
    for &i in order.iter().rev() {
        blocks[i].y = blocks[i].y.max(ceiling);
        ceiling = blocks[i].y + height_of(&blocks[i]);
    }
    let labels: Html = blocks
        .iter()
        .map(|b| {
            let ly = b.y;
            let cap = b.key == "capacity";
            let (class, main_class) = if cap {
                ("gm-ann gm-ann-cap".to_string(), "gm-caplabel")
            } else {
                (format!("gm-ann gm-s-{}", b.key), "gm-ann-main")
            };
            let leader_x = if b.key == "capacity" { bar_x + bar_w + 8.0 } else { bar_x + bar_w };
            let points = format!("{},{} {},{} {},{}", n(leader_x), n(b.anchor), n(label_x - 10.0), n(ly - 4.0), n(label_x - 4.0), n(ly - 4.0));
            el(
                "g",
                &["class"],
                vec![class.into()],
                html! {
                    <>
                        if cap {
                            <polyline class="gm-leader gm-capleader" fill="none" {points} />
                        } else {
                            <polyline class="gm-leader" fill="none" {points} />
                        }
                        { for b.main.iter().enumerate().map(|(j, l)| el(
                            "text",
                            &["x", "y", "class"],
                            vec![n(label_x).into(), n(ly + 13.0 * j as f64).into(), main_class.into()],
                            html! { { l.clone() } },
                        )) }
                        { for b.lines.iter().enumerate().map(|(j, l)| html! {
                            <text x={n(label_x)} y={n(ly + 13.0 * (b.main.len() + j) as f64)} class="gm-ann-why">{ l.clone() }</text>
                        }) }
                    </>
                },
            )
        })
        .collect();
    let axis: Html = ticks(total.max(cap))
        .into_iter()
        .map(|t| {
            html! {
                <g class="gm-tick">
                    <line x1={n(bar_x - 6.0)} x2={n(bar_x)} y1={n(y(t))} y2={n(y(t))} />
                    <text x={n(bar_x - 9.0)} y={n(y(t) + 4.0)} text-anchor="end">{ tick_label(t) }</text>
                </g>
            }
        })
        .collect();
    let over = !e.fits;
    let gap = Sum::of(total.max(cap));
    let gap = gap.show((gap.units(cap) - gap.units(total)).abs());
    let summary = format!(
        "Per-GPU memory at the peak ({}): {} of {} on {}{}. {}.",
        e.peak_phase,
        sum.gib(total),
        sum.gib(cap),
        e.gpu,
        if over { ", does not fit" } else { ", fits" },
        slices
            .iter()
            .map(|(x, t)| format!("{} {t}", x.label()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    html! {
        <figure class="gm gm-breakdown" data-widget="breakdown" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "Per-GPU memory at the peak" }</span>
                <span class="gm-sub">{ format!("{} · b={} · s={} · {}{}", e.model, s.batch, tokens(s.seq), s.precision.name,
                    match &s.finetune { Finetune::Lora(l) => format!(" · {} rank {}", if l.quantized { "QLoRA" } else { "LoRA" }, l.rank), Finetune::Full => String::new() }) }</span>
            </figcaption>
            { levers(init, &k, &try_set) }
            { refused_msg }
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(h))} role="img" aria-labelledby={summary_id.clone()}>
                { axis }
                { for rects }
                <line class="gm-capline" x1={n(bar_x - 6.0)} x2={n(bar_x + bar_w + 8.0)} y1={n(y(cap))} y2={n(y(cap))} />
                { labels }
                { el(
                    "text",
                    &["class", "x", "y", "text-anchor"],
                    vec![
                        (if over { "gm-verdict-svg gm-over" } else { "gm-verdict-svg gm-ok" }).into(),
                        n(bar_x + bar_w / 2.0).into(),
                        n(h - 8.0).into(),
                        "middle".into(),
                    ],
                    html! { { if over { format!("✗ {gap} over") } else { format!("✓ {gap} free") } } },
                ) }
            </svg>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            { toolbar }
        </figure>
    }
}
