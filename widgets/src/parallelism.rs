//! The 5D panel: a model (a preset, edited fields, or a pasted `config.json`), the training
//! configuration, data × tensor × pipeline × context × expert parallelism with the ZeRO/FSDP
//! strategy, the per-GPU memory of every pipeline stage, and the planner's best layouts for
//! the same GPU count, all recomputed as the inputs change.

use gpumem::num::fixed;
use std::rc::Rc;

use gpumem::arch::{Architecture, Family};
use gpumem::plan::{Candidate, Plan, Request};
use gpumem::scenario::Model;
use gpumem::{gpu, hf, knobs, Estimate, Scenario};
use serde_json::Value;
use web_sys::{HtmlInputElement, HtmlTextAreaElement};
use yew::prelude::*;

use crate::allocator::{legend, precision_label, use_checked_set, use_knobs, use_live_marker};
use crate::chart::{el, grid, n, settings, ticks, use_toolbar, use_width, verdict_p};
use crate::controls::{radio_group, select};
use crate::format::{count, gib, params, tokens, Sum};
use crate::parts::{self, Slice};
use crate::{Init, Knobs};

/// Layouts the planner table lists.
const TOP: usize = 5;

/// An architecture field a reader can edit: (field, label, config.json key by family).
fn hf_key(family: Family, field: &str) -> Option<&'static str> {
    use Family::*;
    Some(match (family, field) {
        (Gpt2, "layers") => "n_layer",
        (Gpt2, "hidden") => "n_embd",
        (Gpt2, "heads") => "n_head",
        (Gpt2, "intermediate") => "n_inner",
        (Gpt2, "kv_heads" | "experts" | "top_k") => return None,
        (_, "layers") => "num_hidden_layers",
        (_, "hidden") => "hidden_size",
        (_, "heads") => "num_attention_heads",
        // MLA expands keys and values per query head; GPT-NeoX has one per head.
        (DeepseekV2 | DeepseekV3 | GptNeox, "kv_heads") => return None,
        (Falcon, "kv_heads") => "num_kv_heads",
        (_, "kv_heads") => "num_key_value_heads",
        (Falcon, "intermediate") => "ffn_hidden_size",
        (Llama4, "intermediate") => "intermediate_size_mlp",
        // Every layer is MoE: no dense MLP to widen.
        (Qwen35Moe, "intermediate") => return None,
        (_, "intermediate") => "intermediate_size",
        (Mixtral | GptOss | Llama4 | MiniMaxM2, "experts") => "num_local_experts",
        (Qwen2Moe | Qwen3Moe | Qwen3Next | Qwen35Moe | Olmoe, "experts") => "num_experts",
        (DeepseekV2 | DeepseekV3 | Glm4Moe, "experts") => "n_routed_experts",
        (_, "experts") => return None,
        (_, "top_k") => "num_experts_per_tok",
        (_, "vocab") => "vocab_size",
        _ => return None,
    })
}

const FIELDS: &[(&str, &str)] = &[
    ("layers", "Layers"),
    ("hidden", "Hidden size"),
    ("heads", "Attention heads"),
    ("kv_heads", "KV heads"),
    ("intermediate", "MLP width"),
    ("vocab", "Vocabulary"),
    ("experts", "Experts"),
    ("top_k", "Experts per token"),
];

fn field_value(a: &Architecture, field: &str) -> u64 {
    match field {
        "layers" => a.layers,
        "hidden" => a.hidden,
        "heads" => a.heads,
        "kv_heads" => a.kv_heads,
        "intermediate" => a.intermediate,
        "vocab" => a.vocab,
        "experts" => a.moe.as_ref().map_or(0, |m| m.experts),
        _ => a.moe.as_ref().map_or(0, |m| m.top_k),
    }
}

/// The knobs with one architecture field changed: the model becomes an `arch` knob.
pub fn with_field(k: &Knobs, a: &Architecture, field: &str, v: Value) -> Knobs {
    let mut cfg = hf::to_hf_config(a);
    if let Some(key) = hf_key(a.family, field) {
        cfg.insert(key.into(), v);
    }
    k.without("model")
        .without("params")
        .with("arch", knobs::to_pairs(&cfg))
}

/// The longest config.json the paste box reads: published configs are a few KB.
pub const MAX_PASTE_BYTES: usize = 64 << 10;

/// The knobs for a pasted `config.json`, or the engine's reason to refuse it.
pub fn with_config(k: &Knobs, text: &str) -> Result<Knobs, String> {
    if text.len() > MAX_PASTE_BYTES {
        return Err(format!(
            "config.json: longer than {} KiB, the limit for a pasted config",
            MAX_PASTE_BYTES >> 10
        ));
    }
    let arch = knobs::arch_from_config_json(text).map_err(|e| e.to_string())?;
    let n = k.without("model").without("params").with("arch", arch);
    n.scenario().map_err(|e| e.to_string())?;
    Ok(n)
}

/// The planner's request for the page's scenario on the same number of GPUs and the same
/// global batch, every layout open to it (the page's is where it starts, not a constraint).
pub fn request(k: &Knobs, s: &Scenario) -> Option<Request> {
    let p = &s.parallel;
    let gpus = p.dp * p.tp * p.pp * p.cp * p.ep;
    let mut v = knobs::scenario_value(k.0.iter().map(|(a, b)| (a.as_str(), b.as_str()))).ok()?;
    gpumem::plan::unfix(&mut v);
    let o = v.as_object_mut()?;
    o.insert("gpus".into(), gpus.into());
    o.insert(
        "global_batch".into(),
        (p.dp * s.batch * p.grad_accum.max(1)).into(),
    );
    o.insert("top".into(), (TOP as u64).into());
    Request::from_value(&v).ok()
}

/// The knobs that put a planned layout on the page.
pub fn with_layout(k: &Knobs, c: &Candidate) -> Knobs {
    let l = &c.layout;
    let mut n = k.clone();
    for (key, v) in [
        ("dp", l.dp),
        ("tp", l.tp),
        ("pp", l.pp),
        ("cp", l.cp),
        ("ep", l.ep),
        ("zero-stage", l.zero as u64),
        ("batch", l.micro_batch),
        ("grad-accum", l.grad_accum),
        ("virtual-stages", l.virtual_stages),
    ] {
        n = n.with(key, v.to_string());
    }
    n.with("recompute", l.recompute.clone())
        .with("offload", l.offload.clone())
}

/// Seconds, readably.
fn secs(x: f64) -> String {
    if x >= 10.0 {
        format!("{} s", fixed(x, 0))
    } else if x >= 1.0 {
        format!("{} s", fixed(x, 1))
    } else {
        format!("{} ms", fixed(x * 1000.0, 0))
    }
}

/// A labelled whole-number input, applied when the reader commits the number (Enter,
/// leaving the field, the spinner's arrows), not on every key: "16" is typed as 1 then 6, and
/// 1 is a layout of its own.
///
/// What the reader typed goes to the engine as it is: what it refuses ("-2", "1.5", nothing)
/// is said, and the field goes back to the value in use.
fn num(id: String, label: &'static str, value: u64, on_change: Callback<String>) -> Html {
    let onchange = Callback::from(move |e: Event| {
        let el: HtmlInputElement = e.target_unchecked_into();
        on_change.emit(el.value().trim().to_string());
    });
    html! {
        <div class="gm-control gm-num-input">
            <label for={id.clone()}>{ label }</label>
            <input type="number" id={id} min="1" step="1" inputmode="numeric"
                value={value.to_string()} {onchange} />
        </div>
    }
}

const H: f64 = 260.0;
const TOP_Y: f64 = 14.0;
const BOTTOM: f64 = 220.0;
const LEFT: f64 = 64.0;

/// One column per pipeline stage (one column without a pipeline), against the capacity.
fn stage_chart(e: &Estimate, w: f64) -> Html {
    #[allow(non_snake_case)]
    let W = w;
    let columns: Vec<(String, Vec<Slice>, f64)> = if e.stages.is_empty() {
        vec![(
            "every GPU".into(),
            parts::of_estimate(e),
            e.device_bytes as f64,
        )]
    } else {
        e.stages
            .iter()
            .map(|st| {
                let overhead = e.cuda_context_bytes as f64;
                let b = parts::slices(&st.components, overhead);
                let total = b.iter().map(|x| x.bytes).sum();
                (format!("stage {}", st.stage), b, total)
            })
            .collect()
    };
    let cap = e.capacity_bytes as f64;
    let max = columns.iter().map(|c| c.2).fold(cap, f64::max);
    let t = ticks(max);
    let top = *t.last().unwrap_or(&max);
    let y = |b: f64| BOTTOM - (BOTTOM - TOP_Y) * b / top.max(1.0);
    let slot = (W - LEFT - 10.0) / columns.len() as f64;
    let bw = (slot * 0.7).min(70.0);
    let label_every = (columns.len() as f64 / 12.0).ceil().max(1.0) as usize;
    let cols: Html = columns
        .iter()
        .enumerate()
        .map(|(i, (name, b, total))| {
            let x = LEFT + slot * i as f64 + (slot - bw) / 2.0;
            let mut acc = 0.0;
            let rects: Html = b
                .iter()
                .filter(|b| b.bytes > 0.0)
                .map(|b| {
                    let (y0, y1) = (y(acc), y(acc + b.bytes));
                    acc += b.bytes;
                    el(
                        "rect",
                        &["class", "x", "y", "width", "height"],
                        vec![
                            format!("gm-f-{}", b.key()).into(),
                            n(x).into(),
                            n(y1).into(),
                            n(bw).into(),
                            n((y0 - y1).max(0.0)).into(),
                        ],
                        html! { <title>{ format!("{name}: {} {}", b.label(), gib(b.bytes)) }</title> },
                    )
                })
                .collect();
            let over = *total > cap;
            el(
                "g",
                &["class", "data-stage"],
                vec![
                    (if over { "gm-stage gm-over" } else { "gm-stage" }).into(),
                    i.to_string().into(),
                ],
                html! { <>
                    { rects }
                    if i % label_every == 0 {
                        <text class="gm-axis-label" x={n(x + bw / 2.0)} y={n(BOTTOM + 14.0)} text-anchor="middle">
                            { if columns.len() == 1 { name.clone() } else { i.to_string() } }
                        </text>
                    }
                    if over {
                        <text class="gm-over-mark" x={n(x + bw / 2.0)} y={n(y(*total) - 4.0)} text-anchor="middle">{ "✗" }</text>
                    }
                </> },
            )
        })
        .collect();
    html! {
        <>
            { grid(&t, LEFT, W - 10.0, y) }
            { cols }
            <line class="gm-capline" x1={n(LEFT)} x2={n(W - 10.0)} y1={n(y(cap))} y2={n(y(cap))} />
            <text class="gm-caplabel gm-halo" x={n(W - 12.0)} y={n(y(cap) - 5.0)} text-anchor="end">{ format!("{} {}", e.gpu, gib(cap)) }</text>
            if columns.len() > 1 {
                <text class="gm-axis-label" x={n(LEFT + (W - LEFT) / 2.0)} y={n(H - 8.0)} text-anchor="middle">{ "pipeline stage" }</text>
            }
        </>
    }
}

/// The planner table's column headings, as markup (the last, "Apply", for screen readers only).
const HEADS: [&str; 8] = [
    "#",
    "dp×tp×pp×cp×ep",
    "Sharding",
    "Micro-batch × steps",
    "Also",
    "Per GPU",
    "Step (est.)",
    "<span class=\"gm-sr\">Apply</span>",
];

/// A cell of the planner's table holding `text`, of class `class` unless that is empty.
fn td(class: &'static str, text: String) -> Html {
    let text = Html::from(text);
    if class.is_empty() {
        el("td", &[], Vec::new(), text)
    } else {
        el("td", &["class"], vec![class.into()], text)
    }
}

/// The parallelism widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_parallelism(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    // The planner weighs every layout (1,644 at the chapter's): it follows the knobs once
    // they rest, so that a change moves the rest of the panel within the frame.
    let (kp, _) = use_knobs(init, !init.local);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    // What became of the last paste, as the page says it ("Applied: …" or "Not applied: …").
    let paste = use_state(|| None::<String>);
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let (try_set, refused) = use_checked_set(set.clone());
    let toolbar = use_toolbar(init, settings(&k));
    let got = k.scenario().and_then(|s| k.estimate().map(|e| (s, e)));
    let (s, e) = match got {
        Ok(x) => x,
        Err(err) => return crate::chart::refused("parallelism", root, err),
    };
    let kp = if init.local { k.clone() } else { kp };
    // Until then the table is the last plan's.
    let stale = (kp != k).then_some("true");
    let plan: Rc<Option<Plan>> = use_memo(kp, |k| {
        k.scenario()
            .ok()
            .and_then(|s| request(k, &s))
            .map(|r| gpumem::plan::plan(&r))
    });
    let p = &s.parallel;
    let gpus = p.dp * p.tp * p.pp * p.cp * p.ep;
    let gpus_t = format!("{} GPU{}", count(gpus), if gpus == 1 { "" } else { "s" });
    // A knob set to what a control holds: a menu's choice, or a number field's text as typed.
    let choice = |key: &'static str| {
        let (k, try_set) = (k.clone(), try_set.clone());
        Callback::from(move |v: String| try_set.emit(k.with(key, v)))
    };
    let opts = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };

    // The model: a preset, or the architecture the page carries.
    let arch = match &s.model {
        Model::Arch { arch, .. } => Some(arch.clone()),
        _ => None,
    };
    // Every preset, smallest first (their sizes worked out once for the page, not on every
    // change: most presets are config.json texts to parse).
    let mut models: Vec<(String, String)> = crate::allocator::ladder(0.0, f64::MAX, "")
        .into_iter()
        .map(|r| {
            (
                r.name.to_string(),
                format!("{} ({})", r.name, params(r.params)),
            )
        })
        .collect();
    let model_sel = if k.get("arch").is_some() {
        models.insert(0, ("custom".into(), "Custom architecture".into()));
        "custom".to_string()
    } else {
        k.get("model").unwrap_or(knobs::DEFAULT_MODEL).to_string()
    };
    let on_model = {
        let (k, try_set) = (k.clone(), try_set.clone());
        Callback::from(move |m: String| {
            if m != "custom" {
                try_set.emit(k.without("arch").without("params").with("model", m));
            }
        })
    };
    let fields: Html = arch
        .as_ref()
        .map(|a| {
            FIELDS
                .iter()
                .filter(|(f, _)| hf_key(a.family, f).is_some())
                .filter(|(f, _)| a.moe.is_some() || !matches!(*f, "experts" | "top_k"))
                .map(|(f, label)| {
                    let on_change = {
                        let (k, try_set, a) = (k.clone(), try_set.clone(), a.clone());
                        let f = *f;
                        Callback::from(move |v: String| {
                            let v = serde_json::from_str(&v).unwrap_or(Value::String(v));
                            try_set.emit(with_field(&k, &a, f, v))
                        })
                    };
                    let mut field = num(init.id(f), label, field_value(a, f), on_change);
                    // Keyed: a field that comes or goes (a mixture of experts' two) leaves
                    // the others, their text and focus, alone.
                    if let Html::VTag(t) = &mut field {
                        Rc::make_mut(t).key = Some((*f).into());
                    }
                    field
                })
                .collect()
        })
        .unwrap_or_default();
    let on_paste = {
        let (k, set, paste) = (k.clone(), set.clone(), paste.clone());
        Callback::from(move |ev: InputEvent| {
            let el: HtmlTextAreaElement = ev.target_unchecked_into();
            let text = el.value();
            if text.trim().is_empty() {
                paste.set(None);
                return;
            }
            match with_config(&k, &text) {
                Ok(n) => {
                    let name = n
                        .estimate()
                        .map(|e| format!("{} parameters", params(e.params)))
                        .unwrap_or_default();
                    paste.set(Some(format!("Applied: a custom architecture, {name}.")));
                    set.emit(n);
                }
                Err(msg) => paste.set(Some(format!("Not applied: {msg}"))),
            }
        })
    };

    // Training.
    let seqs: Vec<(String, String)> = (9..=17)
        .map(|i| 1u64 << i)
        .chain((!(s.seq.is_power_of_two() && (512..=131072).contains(&s.seq))).then_some(s.seq))
        .map(|x| (x.to_string(), format!("{} tokens", tokens(x))))
        .collect();
    let mut precisions = opts(&[
        ("fp32", "FP32"),
        ("amp-bf16", "AMP BF16"),
        ("bf16", "BF16"),
        ("mixed-bf16", "Mixed BF16"),
        ("fp8", "FP8"),
    ]);
    let precision = k.get_or_default("precision").to_string();
    if !precisions.iter().any(|(v, _)| *v == precision) {
        precisions.push((precision.clone(), precision_label(&precision)));
    }
    let gpu_opts: Vec<(String, String)> = gpu::GPUS
        .iter()
        .map(|g| (g.name.to_string(), g.name.to_string()))
        .chain(
            k.get("capacity")
                .map(|c| ("custom".into(), format!("Custom ({c} GiB)"))),
        )
        .collect();
    let gpu_sel = if k.get("capacity").is_some() {
        "custom".to_string()
    } else {
        k.get_or_default("gpu").to_string()
    };
    let on_gpu = {
        let (k, try_set) = (k.clone(), try_set.clone());
        Callback::from(move |g: String| {
            if g != "custom" {
                try_set.emit(k.without("capacity").with("gpu", g));
            }
        })
    };
    let framework = k.get_or_default("framework").to_string();
    let zero_labels: &[(&str, &str)] = if framework == "fsdp" {
        &[
            ("0", "DDP"),
            ("1", "Sharded optimizer"),
            ("2", "SHARD_GRAD_OP"),
            ("3", "FULL_SHARD"),
        ]
    } else {
        &[
            ("0", "ZeRO-0"),
            ("1", "ZeRO-1"),
            ("2", "ZeRO-2"),
            ("3", "ZeRO-3"),
        ]
    };

    // The planner's table.
    let plan_rows: Html = match &*plan {
        None => html! { <tr><td colspan="8">{ "The planner needs an architecture and a training run." }</td></tr> },
        Some(pl) if pl.best.is_empty() => html! {
            <tr><td colspan="8">{ format!("No layout of {gpus_t} fits ({} considered).", count(pl.considered)) }</td></tr>
        },
        Some(pl) => pl
            .best
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let l = &c.layout;
                let onclick = {
                    let (k, try_set, c) = (k.clone(), try_set.clone(), c.clone());
                    Callback::from(move |_: MouseEvent| try_set.emit(with_layout(&k, &c)))
                };
                let current = with_layout(&k, c).scenario().ok().as_ref() == Some(&s);
                let zero = if framework == "fsdp" {
                    zero_labels[l.zero as usize].1.to_string()
                } else {
                    format!("ZeRO-{}", l.zero)
                };
                let extra = [
                    (l.virtual_stages > 1).then(|| format!("interleaved ×{}", l.virtual_stages)),
                    (l.recompute != "none").then(|| format!("{} recompute", l.recompute)),
                    (l.offload != "none").then(|| format!("offload {}", l.offload)),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ");
                let cells = html! {
                    <>
                        { td("", (i + 1).to_string()) }
                        { td("", format!("{}×{}×{}×{}×{}", l.dp, l.tp, l.pp, l.cp, l.ep)) }
                        { td("", zero) }
                        { td("", format!("{} × {}", l.micro_batch, l.grad_accum)) }
                        { td("", extra) }
                        { td("gm-num", gib(c.device_bytes as f64)) }
                        { td("gm-num", secs(c.step_seconds)) }
                        <td><button type="button" class="gm-pill" {onclick}
                            aria-label={format!("Use layout {}", i + 1)} aria-pressed={if current { "true" } else { "false" }}>{ if current { "shown" } else { "use" } }</button></td>
                    </>
                };
                if current {
                    el("tr", &["class"], vec!["gm-current".into()], cells)
                } else {
                    el("tr", &[], Vec::new(), cells)
                }
            })
            .collect(),
    };
    let plan_caption = match &*plan {
        Some(pl) => format!(
            "Layouts of {gpus_t} for a global batch of {} sequences: {} of {} fit. The fastest (up to {TOP}) are listed, by the planner's cost model.",
            count(pl.global_batch), count(pl.fitting), count(pl.considered)
        ),
        None => String::new(),
    };

    let over = !e.fits;
    let worst = e
        .stages
        .iter()
        .max_by_key(|st| st.peak_bytes)
        .map(|st| format!(" (stage {}, the fullest)", st.stage))
        .unwrap_or_default();
    let summary = format!(
        "{} on {gpus_t} (data {} × tensor {} × pipeline {} × context {} × expert {}), micro-batch {} × sequence {}: {} per GPU{worst} of {} — {}.",
        e.model,
        p.dp,
        p.tp,
        p.pp,
        p.cp,
        p.ep,
        s.batch,
        tokens(s.seq),
        gib(e.device_bytes as f64),
        gib(e.capacity_bytes as f64),
        if over { "does not fit" } else { "fits" }
    );
    let (dev, cap) = (e.device_bytes as f64, e.capacity_bytes as f64);
    let dev_parts = parts::of_estimate(&e);
    let dev_sum = crate::allocator::sum_of(&dev_parts, dev);
    let gap = Sum::of(dev.max(cap));
    let gap = gap.show((gap.units(cap) - gap.units(dev)).abs());
    let paste_note = match &*paste {
        None => html! {},
        Some(m) if m.starts_with("Applied") => {
            html! { <p class="gm-note" role="status">{ m.clone() }</p> }
        }
        Some(m) => html! { <p class="gm-error" role="alert">{ m.clone() }</p> },
    };
    html! {
        <figure class="gm gm-parallelism" data-widget="parallelism" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "5D parallelism: memory per GPU" }</span>
                <span class="gm-sub">{ format!("{} · {gpus_t} · {} · b={} · s={}", e.model, e.gpu, s.batch, tokens(s.seq)) }</span>
            </figcaption>
            <div class="gm-panels">
                <fieldset class="gm-panel">
                    <legend>{ "Model" }</legend>
                    { select(init.id("model"), "Preset", models, model_sel, on_model) }
                    // In a box of their own: fields that come and go (a mixture of experts'
                    // have two more) leave the paste box below, its text and focus, alone.
                    <div class="gm-fields">{ fields }</div>
                    <div class="gm-control gm-paste">
                        <label for={init.id("config")}>{ "…or paste a config.json" }</label>
                        <textarea id={init.id("config")} rows="3" spellcheck="false"
                            placeholder="{\"model_type\": \"llama\", \"hidden_size\": 4096, …}" oninput={on_paste} />
                    </div>
                    { paste_note }
                </fieldset>
                <fieldset class="gm-panel">
                    <legend>{ "Training" }</legend>
                    { num(init.id("batch"), "Micro-batch", s.batch, choice("batch")) }
                    { select(init.id("seq"), "Sequence", seqs, s.seq.to_string(), choice("seq")) }
                    { num(init.id("accum"), "Gradient accumulation", p.grad_accum.max(1), choice("grad-accum")) }
                    { select(init.id("precision"), "Precision", precisions, precision, choice("precision")) }
                    { select(init.id("recompute"), "Recomputation", opts(&[("none", "none"), ("selective", "selective"), ("full", "full")]), k.get_or_default("recompute").to_string(), choice("recompute")) }
                    { select(init.id("gpu"), "GPU", gpu_opts, gpu_sel, on_gpu) }
                </fieldset>
                <fieldset class="gm-panel">
                    <legend>{ format!("Parallelism: {gpus_t}") }</legend>
                    { num(init.id("dp"), "Data (dp)", p.dp, choice("dp")) }
                    { num(init.id("tp"), "Tensor + sequence (tp)", p.tp, choice("tp")) }
                    { num(init.id("pp"), "Pipeline (pp)", p.pp, choice("pp")) }
                    { num(init.id("cp"), "Context (cp)", p.cp, choice("cp")) }
                    { num(init.id("ep"), "Expert (ep)", p.ep, choice("ep")) }
                    { select(init.id("framework"), "Framework", opts(&[("fsdp", "PyTorch FSDP"), ("deepspeed", "DeepSpeed"), ("megatron", "Megatron-LM")]), framework.clone(), choice("framework")) }
                    { radio_group(init.id("zero"), "Sharding", opts(zero_labels), p.zero.to_string(), choice("zero-stage")) }
                    { select(init.id("offload"), "Offload to CPU", opts(&[("none", "none"), ("optimizer", "optimizer states"), ("optimizer+params", "optimizer + parameters")]), k.get_or_default("offload").to_string(), choice("offload")) }
                </fieldset>
            </div>
            { refused }
            { verdict_p(!over, if over { format!("✗ {} per GPU{worst}: exceeds {} on {} by {gap}", dev_sum.gib(dev), gib(cap), e.gpu) }
                  else { format!("✓ {} per GPU{worst}, {gap} headroom", dev_sum.gib(dev)) }, false) }
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(H))} role="img" aria-labelledby={summary_id.clone()}>
                { stage_chart(&e, w) }
            </svg>
            { legend(&dev_parts, &[], dev_sum) }
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
            // In a box of their own: a note more or less must not make the controls above new
            // elements (Yew matches unkeyed children from the end), which would take the focus
            // and the paste box's text.
            <div class="gm-notes">{ for e.notes.iter().map(|m| html! { <p class="gm-note">{ m.clone() }</p> }) }</div>
            <div class="gm-scroll"><table class="gm-table gm-plan" aria-busy={stale}>
                <caption>{ plan_caption }</caption>
                // A header that never changes, as one string.
                // (Elements, not a raw string: a raw `<tr>` is parsed outside any table, and
                // the browser drops the row's tags.)
                <thead><tr>{ for HEADS.iter().map(|h| el("th", &["scope"], vec!["col".into()], Html::from_html_unchecked((*h).into()))) }</tr></thead>
                <tbody>{ plan_rows }</tbody>
            </table></div>
            { toolbar }
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(pairs: &[(&str, &str)]) -> Knobs {
        Knobs(
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    }

    #[test]
    fn an_edited_field_changes_only_that_field() {
        let base = k(&[("model", "llama3.1-8b")]);
        let s = base.scenario().unwrap();
        let Model::Arch { arch, .. } = &s.model else {
            panic!()
        };
        let n = with_field(&base, arch, "layers", 16.into());
        let Model::Arch { arch: b, .. } = n.scenario().unwrap().model else {
            panic!()
        };
        assert_eq!(b.layers, 16);
        assert_eq!(
            (b.hidden, b.kv_heads, b.vocab),
            (arch.hidden, arch.kv_heads, arch.vocab)
        );
        assert!(n.get("model").is_none() && n.get("arch").is_some());
    }

    #[test]
    fn a_planned_layout_reproduces_its_estimate() {
        let base = k(&[
            ("model", "llama3.1-70b"),
            ("seq", "8k"),
            ("dp", "4"),
            ("tp", "8"),
            ("zero-stage", "1"),
            ("precision", "mixed-bf16"),
        ]);
        let s = base.scenario().unwrap();
        let pl = gpumem::plan::plan(&request(&base, &s).unwrap());
        assert!(!pl.best.is_empty());
        for c in &pl.best {
            let n = with_layout(&base, c);
            let e = n.estimate().unwrap();
            assert_eq!(e.device_bytes, c.device_bytes, "{:?}", c.layout);
        }
    }

    /// The panel's planner searches layouts for the page's model, GPU count and global
    /// batch: the page's own mesh, ZeRO stage, micro-batch and recomputation are where it
    /// starts, not constraints (the book's panel, Llama 3.1 70B on 64 GPUs).
    #[test]
    fn the_planner_searches_beyond_the_page_layout() {
        let base = k(&[
            ("model", "llama3.1-70b"),
            ("seq", "8k"),
            ("batch", "1"),
            ("grad-accum", "8"),
            ("dp", "2"),
            ("tp", "8"),
            ("pp", "4"),
            ("precision", "mixed-bf16"),
            ("framework", "megatron"),
            ("zero-stage", "1"),
        ]);
        let s = base.scenario().unwrap();
        let r = request(&base, &s).unwrap();
        assert_eq!((r.gpus.as_slice(), r.global_batch), (&[64u64][..], 16));
        let pl = gpumem::plan::plan(&r);
        assert!(pl.considered > 100, "{} considered", pl.considered);
        let meshes: std::collections::BTreeSet<_> = pl
            .best
            .iter()
            .map(|c| (c.layout.dp, c.layout.tp, c.layout.pp, c.layout.micro_batch))
            .collect();
        assert!(meshes.len() > 1, "{meshes:?}");
        // Megatron-LM, the page's framework, stays.
        let fw = |c: &Candidate| with_layout(&base, c).scenario().unwrap().parallel.framework;
        assert!(pl.best.iter().all(|c| fw(c) == s.parallel.framework));
    }

    #[test]
    fn a_pasted_config_is_data() {
        let base = k(&[("model", "llama3.1-8b")]);
        let e =
            with_config(&base, r#"{"model_type": "<img src=x onerror=alert(1)>"}"#).unwrap_err();
        assert!(e.starts_with("config.json.model_type"), "{e}");
        let e = with_config(&base, "{\"hidden_size\": 4096,").unwrap_err();
        assert!(e.starts_with("config.json:1:"), "{e}");
        let ok = with_config(
            &base,
            r#"{"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "vocab_size": 32000, "sliding_window": 4096}"#,
        )
        .unwrap();
        let e = ok.estimate().unwrap();
        assert_eq!(e.params, 7_241_732_096, "Mistral 7B's published count");
        // Beyond the paste cap: refused before it is parsed, the limit named.
        let huge = format!(
            "{{\"hidden_size\": 4096, \"pad\": \"{}\"}}",
            "x".repeat(MAX_PASTE_BYTES)
        );
        let e = with_config(&base, &huge).unwrap_err();
        assert!(e.contains("64 KiB"), "{e}");
    }
}
