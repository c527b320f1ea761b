//! ZeRO: the model states of training, bytes per parameter, first on one GPU and then
//! sharded over N data-parallel GPUs stage by stage. A log-scale parameter slider, preset
//! chips (number keys), a stage radiogroup (Z cycles it), GPU reference lines, and the
//! formula of every slice with the current numbers.

use gpumem::gpu;
use gpumem::num::fixed;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::{n, Toolbar};
use crate::controls::{RadioGroup, Slider};
use crate::format::{gib, params};
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
/// precision and optimizer (Adam's state split into its two moments).
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
    let seg = |key: &str, label: &str, b: f64, from: u8| Segment {
        key: key.into(),
        label: label.into(),
        bytes_per_param: b,
        shard_from: from,
    };
    let mut v = vec![seg("weights", "Weights", per(e.weights_bytes), 3)];
    if e.master_weights_bytes > 0 {
        v.push(seg("master", "Master", per(e.master_weights_bytes), 1));
    }
    let opt = per(e.optimizer_states_bytes);
    if k.get("optimizer").is_none_or(|o| o.starts_with("adam")) && opt > 0.0 {
        v.push(seg("momentum", "Momentum", opt / 2.0, 1));
        v.push(seg("variance", "Variance", opt / 2.0, 1));
    } else if opt > 0.0 {
        v.push(seg("optimizer", "Optimizer", opt, 1));
    }
    v.push(seg("gradients", "Gradients", per(e.gradients_bytes), 2));
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
    ["None", "Stage 1", "Stage 2", "Stage 3"][s.min(3) as usize]
}

#[component]
pub fn Zero(init: &Init) -> Html {
    let (k, set) = use_knobs(init);
    let root = use_live_marker();
    let uid = init.uid.clone();
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
    let max_ref = refs
        .iter()
        .map(|g| g.capacity_bytes as f64)
        .fold(0.0, f64::max);
    let scale = total.max(max_ref) * 1.15;
    let fits = |b: f64| b <= max_ref;

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
            let p = 10f64.powf(lo.log10() + f * (hi.log10() - lo.log10()));
            // Round to two significant figures: sliders read as sizes, not noise.
            let mag = 10f64.powf(p.log10().floor() - 1.0);
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

    let bar = |bytes: &[f64], y: f64, label: String| -> Html {
        let mut x = 0.0;
        let over = bytes.iter().sum::<f64>();
        html! {
            <g>
                <text x="0" y={n(y - 6.0)} class="gm-ann-main">{ label }</text>
                { for segments.iter().zip(bytes).map(|(s, b)| {
                    let w = 600.0 * b / scale;
                    let r = html! { <rect class={format!("gm-f-{}", s.key)} x={n(x)} y={n(y)} width={n(w)} height="30"><title>{ format!("{}: {}", s.label, gib(*b)) }</title></rect> };
                    x += w;
                    r
                }) }
                if over > max_ref {
                    <rect class="gm-hatch" x={n(600.0 * max_ref / scale)} y={n(y)} width={n(600.0 * (over - max_ref) / scale)} height="30" />
                }
            </g>
        }
    };
    let ref_lines: Html = refs
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let x = 600.0 * g.capacity_bytes as f64 / scale;
            html! {
                <g class="gm-ref">
                    <line class="gm-capline" x1={n(x)} x2={n(x)} y1="14" y2={if stage > 0 { "130" } else { "66" }} />
                    <text class="gm-caplabel" x={n(x)} y={n(if stage > 0 { 142.0 } else { 78.0 } + 11.0 * i as f64)} text-anchor="middle">{ format!("{} {}", g.name, gib(g.capacity_bytes as f64)) }</text>
                </g>
            }
        })
        .collect();
    let height = if stage > 0 { 140.0 } else { 76.0 } + 11.0 * refs.len() as f64 + 6.0;
    let summary = format!(
        "Model states for {} parameters: {} on one GPU{}{}.",
        params(np as u64),
        gib(total),
        if stage > 0 {
            format!(
                ", {} per GPU with ZeRO {} over {gpus} GPUs",
                gib(total_gpu),
                stage_name(stage)
            )
        } else {
            String::new()
        },
        if fits(if stage > 0 { total_gpu } else { total }) {
            ""
        } else {
            " — does not fit on any reference GPU"
        }
    );
    let formula: Html = segments
        .iter()
        .zip(&full)
        .zip(&per_gpu)
        .map(|((s, f), g)| {
            html! {
                <li>{ format!("{} = {} × {} B = {}{}", s.label, params(np as u64), trim(s.bytes_per_param), gib(*f),
                    if stage >= s.shard_from && gpus > 1 { format!(" → / {gpus} = {} per GPU", gib(*g)) } else { String::new() }) }</li>
            }
        })
        .collect();
    let bpp: f64 = segments.iter().map(|s| s.bytes_per_param).sum();
    let (title_id, summary_id) = (format!("{uid}-title"), format!("{uid}-summary"));
    html! {
        <figure class="gm gm-zero" data-widget="zero" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()} {onkeydown}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "GPU memory math: model states under ZeRO" }</span>
                <span class="gm-sub">{ format!("{} parameters · {} GPUs · ZeRO {}", params(np as u64), gpus, stage_name(stage)) }</span>
            </figcaption>
            <p class="gm-total">
                <span class="gm-label">{ "Total" }</span>
                <strong class="gm-big" data-value="total">{ gib(total) }</strong>
                if stage > 0 {
                    <span class="gm-of" data-value="per-gpu">{ format!("{} per GPU", gib(total_gpu)) }</span>
                }
                if !fits(if stage > 0 { total_gpu } else { total }) {
                    <span class="gm-badge" data-value="badge">{ "DOESN'T FIT" }</span>
                }
            </p>
            <svg class="gm-chart" viewBox={format!("0 0 600 {}", n(height))} role="img" aria-labelledby={summary_id.clone()}>
                { bar(&full, 24.0, "One GPU (no sharding)".into()) }
                if stage > 0 {
                    { bar(&per_gpu, 88.0, format!("Per GPU, ZeRO {} over {gpus}", stage_name(stage))) }
                }
                { ref_lines }
            </svg>
            if stage > 0 {
                <ul class="gm-chips">
                    { for segments.iter().map(|s| html! {
                        <li class="gm-chip">{ if stage >= s.shard_from && gpus > 1 { format!("{} / {gpus} (sharded)", s.label) } else { format!("{} (full)", s.label) } }</li>
                    }) }
                </ul>
            }
            <ul class="gm-formula-lines" data-value="formula">
                { formula }
                <li><strong>{ format!("Total = {} × {} B = {}", params(np as u64), trim(bpp), gib(total)) }</strong></li>
            </ul>
            <div class="gm-controls">
                <Slider id={format!("{uid}-params")} label="Parameters" min={0} max={STEPS} value={pos.clamp(0, STEPS)}
                    valuetext={format!("{} parameters", params(np as u64))} on_change={on_slider} />
                <Slider id={format!("{uid}-gpus")} label="GPUs" min={0} max={12} value={(gpus as f64).log2().round() as i64}
                    valuetext={format!("{gpus} GPUs")} on_change={on_gpus} />
                <RadioGroup id={format!("{uid}-stage")} label="ZeRO stage"
                    options={(0..4u8).map(|s| (s.to_string(), stage_name(s).to_string())).collect::<Vec<_>>()}
                    selected={stage.to_string()} on_change={on_radio} />
                <div class="gm-presets" role="group" aria-label="Presets">
                    { for PRESETS.iter().enumerate().map(|(i, (label, p))| {
                        let sp = set_params.clone();
                        let p = *p;
                        html! { <button type="button" onclick={Callback::from(move |_| sp.emit(p))}
                            aria-keyshortcuts={(i + 1).to_string()}>{ format!("{label} ({})", i + 1) }</button> }
                    }) }
                </div>
            </div>
            <p class="gm-note">{ "Keys: Left/Right adjust the slider · 1–4 presets · Z cycles the ZeRO stage." }</p>
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            <Toolbar name={format!("gpumem-zero-{uid}")} />
        </figure>
    }
}

fn trim(x: f64) -> String {
    fixed(x, if (x - x.round()).abs() < 1e-9 { 0 } else { 2 })
}
