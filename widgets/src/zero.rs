//! ZeRO: the model states of training, bytes per parameter, first on one GPU and then
//! sharded over N data-parallel GPUs stage by stage. A log-scale parameter slider, preset
//! chips (number keys), a stage radiogroup (Z cycles it), GPU reference lines, and the
//! formula of every slice with the current numbers.

use gpumem::gpu;
use gpumem::num::fixed;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::{el, fit, n, settings, swatch, use_toolbar, use_width};
use crate::controls::{radio_group, slider};
use crate::format::{gib, params, Sum};
use crate::parts;
use crate::{Init, Knobs};

/// One slice: its label, bytes per parameter, and the first ZeRO stage that shards it.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    pub key: String,
    pub label: String,
    pub bytes_per_param: f64,
    pub shard_from: u8,
}

/// The default table: the engine's model states for a bare parameter count under the page's
/// precision and optimizer, named and coloured as every chart names them (`parts`).
pub fn engine_segments(k: &Knobs, n_params: f64) -> Vec<Segment> {
    let Ok(e) = k
        .without("dp")
        .without("zero-stage")
        .with("params", fixed(n_params, 0))
        .estimate()
    else {
        return Vec::new();
    };
    let per = |b: u64| b as f64 / n_params.max(1.0);
    let seg = |key: &str, b: f64, from: u8| Segment {
        key: key.into(),
        label: parts::find(key).map_or(key, |p| p.label).into(),
        bytes_per_param: b,
        shard_from: from,
    };
    let mut v = vec![seg("weights", per(e.weights_bytes), 3)];
    if e.master_weights_bytes > 0 {
        v.push(seg("master", per(e.master_weights_bytes), 1));
    }
    if e.optimizer_states_bytes > 0 {
        v.push(seg("optimizer", per(e.optimizer_states_bytes), 1));
    }
    v.push(seg("gradients", per(e.gradients_bytes), 2));
    v
}

/// `segments="INT4 weights:0.5:3,FP16 KV cache:1.5:3"`: label, bytes per parameter, stage.
pub fn parse_segments(text: &str) -> Result<Vec<Segment>, String> {
    let mut v = Vec::new();
    for (i, part) in text.split(',').enumerate() {
        let f: Vec<&str> = part.split(':').map(str::trim).collect();
        let [label, b, from] = f.as_slice() else {
            return Err(format!(
                "segment {}: write label:bytes-per-param:zero-stage",
                i + 1
            ));
        };
        let b: f64 = gpumem::num::parse_f64(b)
            .filter(|x: &f64| x.is_finite() && *x >= 0.0 && *x <= 64.0)
            .ok_or(format!(
                "segment {}: bytes per parameter must be 0–64",
                i + 1
            ))?;
        let from: u8 = from
            .parse()
            .ok()
            .filter(|s| (1..=3).contains(s))
            .ok_or(format!("segment {}: the stage must be 1, 2 or 3", i + 1))?;
        if label.is_empty() || label.len() > 40 {
            return Err(format!("segment {}: a label of 1–40 characters", i + 1));
        }
        v.push(Segment {
            key: format!("s{}", i % 8),
            label: label.to_string(),
            bytes_per_param: b,
            shard_from: from,
        });
    }
    Ok(v)
}

const PRESETS: &[(&str, f64)] = &[
    ("GPT-2", 124_439_808.0),
    ("7B", 7e9),
    ("13B", 13e9),
    ("70B", 70e9),
];
const STEPS: i64 = 60;

fn stage_name(s: u8) -> &'static str {
    ["no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3"][s.min(3) as usize]
}

/// The zero widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_zero(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    let toolbar = use_toolbar(init, settings(&k));
    let (lo, hi) = (1e8f64, 1e12f64);
    let preset_params = k
        .scenario()
        .ok()
        .map(|s| match &s.model {
            gpumem::scenario::Model::Params(p) => *p as f64,
            gpumem::scenario::Model::Arch { arch, .. } => arch.params().total as f64,
        })
        .unwrap_or(3.7e9);
    let np = preset_params.clamp(1.0, 1e14);
    let gpus = k
        .count(
            "dp",
            init.option("gpus")
                .and_then(|g| g.parse().ok())
                .unwrap_or(8),
        )
        .max(1);
    let stage = k.count("zero-stage", 0).min(3) as u8;
    let segments = match init.option("segments") {
        Some(t) => parse_segments(t).unwrap_or_default(),
        None => engine_segments(&k, np),
    };
    let refs: Vec<gpu::Gpu> = init
        .option("references")
        .unwrap_or("A100-80GB,H100-80GB,RTX-4090")
        .split(',')
        .filter_map(|g| gpu::find(g.trim()))
        .collect();
    let full: Vec<f64> = segments.iter().map(|s| s.bytes_per_param * np).collect();
    let per_gpu: Vec<f64> = segments
        .iter()
        .zip(&full)
        .map(|(s, b)| {
            if stage >= s.shard_from {
                b / gpus as f64
            } else {
                *b
            }
        })
        .collect();
    let total: f64 = full.iter().sum();
    let total_gpu: f64 = per_gpu.iter().sum();
    let largest = refs
        .iter()
        .max_by_key(|g| g.capacity_bytes)
        .map(|g| (g.name, g.capacity_bytes as f64));
    let max_ref = largest.map_or(0.0, |l| l.1);
    let scale = total.max(max_ref) * 1.15;
    let fits = |b: f64| b <= max_ref;
    let bar_w = w - 8.0;

    // Controls and keys.
    let set_params = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |p: f64| set.emit(k.without("model").with("params", fixed(p, 0))))
    };
    let pos = ((np.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10()) * STEPS as f64)
        .round() as i64;
    let on_slider = {
        let set_params = set_params.clone();
        Callback::from(move |i: i64| {
            let f = i.clamp(0, STEPS) as f64 / STEPS as f64;
            // 10^x as 2^(x·log2 10): no general power function in the wasm.
            let p =
                ((lo.log10() + f * (hi.log10() - lo.log10())) * std::f64::consts::LOG2_10).exp2();
            // Round to two significant figures: sliders read as sizes, not noise.
            let mag = 10f64.powi(p.log10().floor() as i32 - 1);
            set_params.emit((p / mag).round() * mag);
        })
    };
    let set_stage = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |s: u8| {
            let mut n = k.with("zero-stage", s.to_string());
            if n.get("dp").is_none() {
                n = n.with("dp", gpus.to_string());
            }
            set.emit(n)
        })
    };
    let onkeydown = {
        let (set_params, set_stage) = (set_params.clone(), set_stage.clone());
        Callback::from(move |e: KeyboardEvent| {
            let key = e.key();
            if let Some(d) = key
                .parse::<usize>()
                .ok()
                .filter(|d| (1..=PRESETS.len()).contains(d))
            {
                set_params.emit(PRESETS[d - 1].1);
                e.prevent_default();
                e.stop_propagation();
            } else if key == "z" || key == "Z" {
                set_stage.emit((stage + 1) % 4);
                e.prevent_default();
                e.stop_propagation();
            }
        })
    };
    let on_gpus = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |i: i64| set.emit(k.with("dp", (1u64 << i.clamp(0, 12)).to_string())))
    };
    let on_radio = {
        let set_stage = set_stage.clone();
        Callback::from(move |v: String| set_stage.emit(v.parse().unwrap_or(0)))
    };

    // A bar's segments (its title is drawn after the GPUs' lines, over them).
    let bar = |bytes: &[f64], y: f64| -> Html {
        let mut x = 4.0;
        let over = bytes.iter().sum::<f64>();
        html! {
            <g>
                { for segments.iter().zip(bytes).map(|(s, b)| {
                    let sw = bar_w * b / scale;
                    let r = el(
                        "rect",
                        &["class", "x", "y", "width", "height"],
                        vec![format!("gm-f-{}", s.key).into(), n(x).into(), n(y).into(), n(sw).into(), "30".into()],
                        html! { <title>{ format!("{}: {}", s.label, gib(*b)) }</title> },
                    );
                    x += sw;
                    r
                }) }
                if over > max_ref {
                    <rect class="gm-hatch" x={n(4.0 + bar_w * max_ref / scale)} y={n(y)} width={n(bar_w * (over - max_ref) / scale)} height="30" />
                }
            </g>
        }
    };
    // The reference GPUs: a dashed line each from the top bar down, their names below the
    // lines, one per row, each at its line unless that would run off the chart (a line that
    // ran on to its own row crossed the names above it).
    let lines_end = if stage > 0 { 130.0 } else { 66.0 };
    // The lines first, then the names, over them (the second bar's title too).
    let (mut ref_lines, mut ref_names) = (Vec::new(), Vec::new());
    for (i, g) in refs.iter().enumerate() {
        let x = 4.0 + bar_w * g.capacity_bytes as f64 / scale;
        let text = format!("{} {}", g.name, gib(g.capacity_bytes as f64));
        let tw = crate::chart::text_width(&text);
        let (tx, anchor) = if x + tw / 2.0 > w - 2.0 {
            (x, "end")
        } else if x - tw / 2.0 < 2.0 {
            (x, "start")
        } else {
            (x, "middle")
        };
        // Broken where the second bar's title stands, not drawn through it.
        let gap = if stage > 0 { "V58m0 28" } else { "" };
        ref_lines.push(html! {
            <path class="gm-capline" d={format!("M{} 24{gap}V{}", n(x), n(lines_end + 2.0))} />
        });
        ref_names.push(html! {
            <text class="gm-caplabel gm-halo" x={n(tx)} y={n(lines_end + 13.0 + 13.0 * i as f64)} text-anchor={anchor}>{ text }</text>
        });
    }
    let height = lines_end + 13.0 * refs.len() as f64 + 8.0;
    let summary = format!(
        "Model states for {} parameters: {} on one GPU{}{}.",
        params(np as u64),
        gib(total),
        if stage > 0 {
            format!(
                ", {} per GPU with {} over {gpus} GPUs",
                gib(total_gpu),
                stage_name(stage)
            )
        } else {
            String::new()
        },
        if fits(if stage > 0 { total_gpu } else { total }) {
            String::new()
        } else {
            format!(
                ": does not fit on {}",
                largest.map_or("any reference GPU", |l| l.0)
            )
        }
    );
    // The lines add up as shown: the whole to the total, the per-GPU figures to theirs (to
    // two more decimals than the total's where needed; "≈" where even those do not).
    let (sum, sum_gpu) = (
        Sum::for_parts(&full, total),
        Sum::for_parts(&per_gpu, total_gpu),
    );
    let full_t = sum.texts(&full);
    let gpu_t = sum_gpu.texts(&per_gpu);
    let formula: Html = segments
        .iter()
        .zip(&full_t)
        .zip(&gpu_t)
        .map(|((s, f), g)| {
            html! {
                <li>{ format!("{} = {} × {} B = {f}{}", s.label, params(np as u64), trim(s.bytes_per_param),
                    if stage > 0 { if stage >= s.shard_from && gpus > 1 { format!(" → / {gpus} = {g} per GPU") } else { format!(" → {g} per GPU, not sharded") } } else { String::new() }) }</li>
            }
        })
        .collect();
    let bpp: f64 = segments.iter().map(|s| s.bytes_per_param).sum();
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    html! {
        <figure class="gm gm-zero" data-widget="zero" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()} {onkeydown}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "GPU memory math: model states under ZeRO" }</span>
                <span class="gm-sub">{ format!("{} parameters · {} GPUs · {}", params(np as u64), gpus, stage_name(stage)) }</span>
            </figcaption>
            <p class="gm-total">
                <span class="gm-label">{ "Total" }</span>
                <strong class="gm-big" data-value="total">{ sum.gib(total) }</strong>
                if stage > 0 {
                    <span class="gm-of" data-value="per-gpu">{ format!("{} per GPU", sum_gpu.gib(total_gpu)) }</span>
                }
                if !fits(if stage > 0 { total_gpu } else { total }) {
                    <span class="gm-badge" data-value="badge">{ format!("DOESN'T FIT on {}", largest.map_or("any reference GPU", |l| l.0)) }</span>
                }
            </p>
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(height))} role="img" aria-labelledby={summary_id.clone()}>
                { bar(&full, 24.0) }
                if stage > 0 {
                    { bar(&per_gpu, 88.0) }
                }
                { for ref_lines }
                <text x="4" y="18" class="gm-ann-main gm-halo">{ fit("One GPU (no sharding)", bar_w) }</text>
                if stage > 0 {
                    <text x="4" y="82" class="gm-ann-main gm-halo">{ fit(&format!("Per GPU, {} over {gpus}", stage_name(stage)), bar_w) }</text>
                }
                { for ref_names }
            </svg>
            { crate::allocator::key_legend(&segments.iter().filter_map(|s| parts::find(&s.key).map(|p| p.key)).collect::<Vec<_>>()) }
            if stage > 0 {
                <ul class="gm-chips">
                    { for segments.iter().map(|s| html! {
                        <li class="gm-chip">
                            { swatch(&s.key) }
                            { if stage >= s.shard_from && gpus > 1 { format!("{} / {gpus} (sharded)", s.label) } else { format!("{} (full)", s.label) } }
                        </li>
                    }) }
                </ul>
            }
            <ul class="gm-formula-lines" data-value="formula">
                { formula }
                <li><strong>{ format!("Total = {} × {} B {} {}{}", params(np as u64), trim(bpp), sum.eq(), sum.gib(total),
                    if stage > 0 { format!(" → {}{} per GPU", if sum_gpu.eq() == "=" { "" } else { "≈ " }, sum_gpu.gib(total_gpu)) } else { String::new() }) }</strong></li>
            </ul>
            <div class="gm-controls">
                { slider(init.id("params"), "Parameters", (0, STEPS), pos.clamp(0, STEPS),
                    format!("{} parameters", params(np as u64)), on_slider) }
                { slider(init.id("gpus"), "GPUs", (0, 12), (gpus as f64).log2().round() as i64,
                    format!("{gpus} GPUs"), on_gpus) }
                { radio_group(init.id("stage"), "ZeRO stage",
                    ["none", "stage 1", "stage 2", "stage 3"].iter().enumerate().map(|(s, l)| (s.to_string(), l.to_string())).collect(),
                    stage.to_string(), on_radio) }
                <div class="gm-presets" role="group" aria-label="Presets">
                    { for PRESETS.iter().enumerate().map(|(i, (label, p))| {
                        let sp = set_params.clone();
                        let p = *p;
                        html! { <button type="button" onclick={Callback::from(move |_| sp.emit(p))}
                            aria-keyshortcuts={(i + 1).to_string()}>{ format!("{label} ({})", i + 1) }</button> }
                    }) }
                </div>
            </div>
            <p class="gm-note">{ "Keys, with the focus on any control of this widget (Tab to it or click it): ← and → move the focused slider · 1–4 choose a preset · Z cycles the ZeRO stage." }</p>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            { toolbar }
        </figure>
    }
}

fn trim(x: f64) -> String {
    fixed(x, if (x - x.round()).abs() < 1e-9 { 0 } else { 2 })
}
