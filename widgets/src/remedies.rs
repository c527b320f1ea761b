//! "It does not fit — what now?": the usual remedies, each estimated on the page's scenario,
//! ordered by what they save there, each with its cost in words and a button that applies it
//! to the page. The planner's fewest GPUs is asked for on request (it tries many layouts).

use std::fmt::Write;

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::format::{escape_attr as esc, gib, tokens, Sum};
use crate::{Init, Knobs};

/// A remedy: its name, what it costs, and the knob changes it makes to a scenario (`None`,
/// with the reason, where it does not apply).
pub struct Remedy {
    pub key: &'static str,
    pub title: String,
    pub cost: &'static str,
    pub with: Result<String, &'static str>,
}

/// Each remedy: its key, name, cost, and why it may not apply.
const REMEDIES: [(&str, &str, &str, &str); 10] = [
    (
        "micro-batch",
        "Halve the micro-batch, accumulate twice as many",
        "The same sequences per optimizer step, in twice as many smaller passes: a little slower, the same training.",
        "the micro-batch is one sequence already",
    ),
    (
        "recompute-selective",
        "Recompute the attention core (selective recomputation)",
        "Attention's forward runs again in the backward: a few per cent more compute. With flash attention there is little left to save.",
        "recomputation is on already",
    ),
    (
        "recompute-full",
        "Recompute every layer (full activation checkpointing)",
        "Each layer's forward runs twice: about a third more compute per step.",
        "every layer is recomputed already",
    ),
    (
        "loss",
        "A fused, chunked cross-entropy (Liger Kernel)",
        "A kernel dependency, about the same speed: the logits are never whole in memory.",
        "the loss is fused already",
    ),
    (
        "adam8bit",
        "8-bit Adam (bitsandbytes)",
        "Moments quantised to 8 bits: usually the same loss curve; one more dependency.",
        "the optimizer is not AdamW, or only adapters train",
    ),
    (
        "adafactor",
        "Adafactor",
        "A factored second moment and no first: far less state, a different convergence; the learning rate needs retuning.",
        "Adafactor is on already, or only adapters train",
    ),
    (
        "lora",
        "LoRA adapters instead of full fine-tuning",
        "Only small adapters train: a fine-tuning method, not pre-training; close to full fine-tuning on many tasks.",
        "adapters train already",
    ),
    (
        "qlora",
        "QLoRA: LoRA over a 4-bit base",
        "The frozen base in NF4, dequantised for each matmul: slower steps and a small quality cost.",
        "QLoRA is on already",
    ),
    (
        "zero",
        "Shard every state over 8 GPUs (ZeRO-3, FSDP FULL_SHARD)",
        "Each layer's weights gathered before its forward and its backward, its gradients reduce-scattered after: more communication, 8 GPUs.",
        "the states are fully sharded already",
    ),
    (
        "offload",
        "Offload the optimizer to CPU memory (ZeRO-Offload)",
        "Optimizer states and master weights in host memory, the update on the CPU: much slower steps.",
        "the optimizer is offloaded already",
    ),
];

/// The remedies for the page's knobs `k`.
pub fn remedies(k: &Knobs) -> Vec<Remedy> {
    let s = k.scenario().ok();
    let batch = s.as_ref().map_or(1, |s| s.batch);
    let accum = s.as_ref().map_or(1, |s| s.parallel.grad_accum);
    let dp = s.as_ref().map_or(1, |s| s.parallel.dp);
    let zero = s.as_ref().map_or(0, |s| s.parallel.zero);
    let is = |key: &str, v: &str| k.get_or_default(key) == v;
    let method = k
        .get_or_default("finetune")
        .split(',')
        .next()
        .unwrap_or("full");
    let full = method == "full";
    REMEDIES
        .iter()
        .map(|&(key, title, cost, why)| {
            let (ok, with) = match key {
                "micro-batch" => (
                    batch >= 2,
                    format!("batch={} grad-accum={}", batch / 2, accum * 2),
                ),
                "recompute-selective" => (
                    is("recompute", "none"),
                    "recompute=selective".into(),
                ),
                "recompute-full" => (!is("recompute", "full"), "recompute=full".into()),
                "loss" => (is("loss", "standard"), "loss=fused".into()),
                "adam8bit" => (
                    full && matches!(k.get_or_default("optimizer"), "adamw" | "adam"),
                    "optimizer=adamw-8bit".into(),
                ),
                "adafactor" => (
                    full && !is("optimizer", "adafactor"),
                    "optimizer=adafactor".into(),
                ),
                "lora" => (full, "finetune=lora".into()),
                "qlora" => (method != "qlora", "finetune=qlora".into()),
                "zero" if dp > 1 => (zero < 3, "zero-stage=3".into()),
                "zero" => (zero < 3, "dp=8 zero-stage=3".into()),
                _ => (is("offload", "none"), "offload=optimizer".into()),
            };
            Remedy {
                key,
                title: if key == "zero" && dp > 1 {
                    format!("Shard every state over the {dp} data-parallel GPUs (ZeRO-3, FSDP FULL_SHARD)")
                } else {
                    title.to_string()
                },
                cost,
                with: if ok { Ok(with) } else { Err(why) },
            }
        })
        .collect()
}

/// A remedy estimated: the device total after it, and whether it fits then.
pub struct Ranked {
    pub remedy: Remedy,
    pub after: Result<gpumem::Estimate, String>,
}

/// The remedies that apply, best saving first (the device total, what decides whether a run
/// fits), then those that do not apply or that the engine refuses, with the reason.
pub fn ranked(k: &Knobs) -> Vec<Ranked> {
    let mut v: Vec<Ranked> = remedies(k)
        .into_iter()
        .map(|r| {
            let after = match &r.with {
                Ok(w) => k
                    .with_changes(w)
                    .and_then(|n| n.estimate().map_err(|e| e.message)),
                Err(why) => Err((*why).to_string()),
            };
            Ranked { remedy: r, after }
        })
        .collect();
    let key = |r: &Ranked| match &r.after {
        Ok(e) => e.device_bytes as i128,
        Err(_) => i128::MAX,
    };
    gpumem::order::sort_by(&mut v, |a, b| key(a).cmp(&key(b)));
    v
}

/// The fewest GPUs the planner finds a layout for (2 to 64), as the page's knobs.
pub fn planned(k: &Knobs) -> Result<(u64, Knobs), String> {
    let s = k.scenario().map_err(|e| e.to_string())?;
    let mut v = gpumem::knobs::scenario_value(k.0.iter().map(|(a, b)| (a.as_str(), b.as_str())))
        .map_err(|e| e.to_string())?;
    let o = v.as_object_mut().ok_or("not a scenario")?;
    o.insert("gpus".into(), "2..64".into());
    let p = &s.parallel;
    o.insert(
        "global_batch".into(),
        (p.dp * s.batch * p.grad_accum.max(1)).into(),
    );
    o.insert("top".into(), 1u64.into());
    let req = gpumem::plan::Request::from_value(&v).map_err(|e| e.to_string())?;
    let plan = gpumem::plan::plan(&req);
    let best = plan
        .counts
        .iter()
        .find_map(|c| c.best.as_ref())
        .ok_or("no layout of up to 64 GPUs fits")?;
    Ok((best.layout.gpus, crate::parallelism::with_layout(k, best)))
}

/// The knob changes that put a planned layout on the page, as `with` writes them.
fn layout_changes(k: &Knobs, n: &Knobs) -> String {
    gpumem::knobs::KNOBS
        .iter()
        .filter_map(|key| match (k.get(key), n.get(key)) {
            (a, Some(b)) if a != Some(b) => Some(format!("{key}={b}")),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A "Use" button that applies `with` to the page (the list's click handler reads it).
fn button_use(out: &mut String, with: &str, what: &str) {
    let _ = write!(
        out,
        r#"<button type="button" class="gm-use" data-with="{}" aria-label="Use: {}">Use</button>"#,
        esc(with),
        esc(what)
    );
}

/// The remedies widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_remedies(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    // The planner's answer for the knobs it was asked with, as the list shows it.
    let plan = use_state(|| None::<(Knobs, String)>);
    let e = match k.estimate() {
        Ok(e) => e,
        Err(err) => return crate::chart::refused("remedies", root, err),
    };
    let now = e.device_bytes as f64;
    let cap = e.capacity_bytes as f64;
    let mut best = None;
    let mut list = String::with_capacity(8192);
    for r in ranked(&k) {
        let with = r.remedy.with.as_deref().unwrap_or("");
        let _ = write!(
            list,
            r#"<li class="gm-remedy{}" data-remedy="{}"><p class="gm-remedy-head"><strong>{}</strong>"#,
            if r.after.is_ok() { "" } else { " gm-na" },
            r.remedy.key,
            esc(&r.remedy.title)
        );
        if !with.is_empty() {
            let _ = write!(list, " <code>{}</code>", esc(&with.replace(' ', ", ")));
        }
        list.push_str("</p>");
        match &r.after {
            Ok(a) => {
                let after = a.device_bytes as f64;
                let d = now - after;
                if best.is_none() && d > 0.0 {
                    best = Some((r.remedy.title.clone(), d));
                }
                // The saving as the difference of the two figures shown (108.7 − 71.8 =
                // 36.9), not the difference rounded on its own.
                let sum = Sum::of(now.max(after));
                let du = sum.units(now) - sum.units(after);
                let _ = write!(
                    list,
                    r#"<p class="gm-remedy-saving {}">{}: the GPU needs {} of {} ({})</p>"#,
                    if a.fits { "gm-ok" } else { "gm-over" },
                    if d >= 0.0 {
                        format!("saves {}", sum.show(du))
                    } else {
                        format!("needs {} more", sum.show(-du))
                    },
                    sum.gib(after),
                    gib(cap),
                    if a.fits { "fits" } else { "still over" }
                );
            }
            Err(why) => {
                let _ = write!(
                    list,
                    r#"<p class="gm-remedy-saving">Not here: {}.</p>"#,
                    esc(why)
                );
            }
        }
        let _ = write!(list, r#"<p class="gm-note">{}</p>"#, r.remedy.cost);
        if r.after.is_ok() {
            button_use(&mut list, with, &r.remedy.title);
        }
        list.push_str("</li>");
    }
    list.push_str(r#"<li class="gm-remedy" data-remedy="planner"><p class="gm-remedy-head"><strong>More GPUs, as the planner lays them out</strong></p><p class="gm-note">The planner tries every layout of 2 to 64 GPUs for this step (data, tensor, pipeline and context parallelism, ZeRO stage, micro-batch, recomputation) and gives the fewest GPUs that fit. Costs the GPUs, and their communication.</p><button type="button" class="gm-use" data-plan="">Ask the planner</button>"#);
    if let Some((_, p)) = plan.as_ref().filter(|(kk, _)| *kk == k) {
        list.push_str(p);
    }
    list.push_str("</li>");
    // One handler for every button of the list: "Use" applies its changes, the planner's
    // button runs the planner.
    let onclick = {
        let (k, set, plan) = (k.clone(), set.clone(), plan.clone());
        Callback::from(move |ev: MouseEvent| {
            use web_sys::wasm_bindgen::JsCast;
            let Some(b) = ev
                .target()
                .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
                .and_then(|el| el.closest("button").ok().flatten())
            else {
                return;
            };
            // The list's HTML is made anew, the pressed button with it: the focus goes to
            // the list, which stays, rather than to the page's start.
            if let Some(ol) = b
                .closest("ol")
                .ok()
                .flatten()
                .and_then(|t| t.dyn_into::<web_sys::HtmlElement>().ok())
            {
                let _ = ol.focus();
            }
            if b.has_attribute("data-plan") {
                plan.set(Some((k.clone(), planned_html(&k, cap))));
            } else if let Some(w) = b.get_attribute("data-with") {
                if let Ok(n) = k.with_changes(&w) {
                    set.emit(n);
                }
            }
        })
    };
    let summary = match &best {
        Some((t, d)) => format!("For this step the largest saving is {}: {}.", gib(*d), t),
        None => "None of these remedies lowers this step's memory.".to_string(),
    };
    let over = now - cap;
    html! {
        <figure class="gm gm-remedies" data-widget="remedies" ref={root} aria-labelledby={init.id("title")}>
            <figcaption class="gm-head" id={init.id("title")}>
                <span class="gm-title">{ "What helps most, for this step" }</span>
                <span class="gm-sub">{ format!("{} · b={} · s={}", e.model, k.count("batch", 1), tokens(k.count("seq", 2048))) }</span>
            </figcaption>
            { crate::chart::verdict_p(e.fits, if e.fits {
                    format!("✓ It fits: {} of {} on {}, {} to spare.", gib(now), gib(cap), e.gpu, gib(-over))
                } else {
                    format!("✗ It does not fit: {} of {} on {}, {} over.", gib(now), gib(cap), e.gpu, gib(over))
                }, true) }
            <ol class="gm-remedy-list" tabindex="-1" {onclick}>{ Html::from_html_unchecked(list.into()) }</ol>
            <p class="gm-sr" aria-live="polite">{ summary }</p>
        </figure>
    }
}

/// The planner's answer as the list shows it: the fewest GPUs and their layout with its Use
/// button, or why there is none (`cap`: the GPU's capacity).
fn planned_html(k: &Knobs, cap: f64) -> String {
    let mut out = String::new();
    match planned(k) {
        Ok((gpus, n)) => {
            let with = layout_changes(k, &n);
            let after = n
                .estimate()
                .map(|a| format!(" — {} of {} per GPU", gib(a.device_bytes as f64), gib(cap)))
                .unwrap_or_default();
            let _ = write!(
                out,
                r#"<p class="gm-remedy-saving gm-ok">{gpus} GPUs: {}{after}</p>"#,
                esc(&with.replace(' ', ", "))
            );
            button_use(&mut out, &with, "the planner's layout");
        }
        Err(why) => {
            let _ = write!(
                out,
                r#"<p class="gm-remedy-saving gm-over">{}</p>"#,
                esc(&why)
            );
        }
    }
    out
}
