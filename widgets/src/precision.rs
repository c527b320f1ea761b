//! Precision: the dtype each part of the training state is kept in, one control per part,
//! and the recipes people use (fp32, AMP, pure bf16, mixed bf16, fp8, 8-bit Adam, QLoRA).
//! The bar below is the engine's peak for the same page state.

use gpumem::dtype::DType;
use gpumem::num::fixed;
use gpumem::precision::Precision;
use gpumem::scenario::{Finetune, Mode};
use gpumem::{Estimate, Scenario};
use web_sys::HtmlSelectElement;
use yew::prelude::*;

use crate::allocator::{bar, legend, use_checked_set, use_knobs, use_live_marker};
use crate::chart::verdict_p;
use crate::controls::radio_group;
use crate::format::{gib, Sum};
use crate::parts;
use crate::{Init, Knobs};

/// The recipe buttons: (value, label, what it sets).
pub const RECIPES: &[(&str, &str)] = &[
    ("fp32", "FP32"),
    ("amp-bf16", "AMP BF16"),
    ("bf16", "BF16"),
    ("mixed-bf16", "Mixed BF16"),
    ("fp8", "FP8"),
    ("adam-8bit", "8-bit Adam"),
    ("qlora", "QLoRA NF4"),
];

/// The page's knobs with a recipe applied. A recipe sets the dtypes and, for the last two,
/// the optimizer or the fine-tuning method; choosing a plain recipe undoes those.
pub fn apply_recipe(k: &Knobs, r: &str) -> Knobs {
    let plain = k.without("finetune");
    let plain = if plain.get("optimizer") == Some("adamw-8bit") {
        plain.without("optimizer")
    } else {
        plain
    };
    match r {
        "adam-8bit" => plain
            .with("precision", "mixed-bf16")
            .with("optimizer", "adamw-8bit"),
        "qlora" => plain.with("precision", "bf16").with("finetune", "qlora"),
        _ => plain.with("precision", r),
    }
}

/// Which recipe button the page's state matches, if any.
pub fn current_recipe(s: &Scenario, k: &Knobs) -> String {
    if matches!(&s.finetune, Finetune::Lora(l) if l.quantized) {
        return "qlora".into();
    }
    if s.optimizer.eight_bit() && k.get("precision") == Some("mixed-bf16") {
        return "adam-8bit".into();
    }
    let p = k.get_or_default("precision");
    if RECIPES.iter().any(|(r, _)| *r == p) && !s.optimizer.eight_bit() {
        p.into()
    } else {
        String::new()
    }
}

/// One row of the table: the part, the dtypes it may take, and the one it has.
struct Part {
    key: &'static str,
    label: &'static str,
    choices: &'static [&'static str],
    dtype: Option<DType>,
}

fn parts(p: &Precision) -> [Part; 6] {
    const FLOATS: &[&str] = &["fp32", "bf16", "fp16"];
    [
        Part {
            key: "weights",
            label: "Weights",
            choices: &["fp32", "bf16", "fp16", "fp8", "int8", "int4", "nf4"],
            dtype: Some(p.weights),
        },
        Part {
            key: "master",
            label: "Master weights",
            choices: &["none", "fp32", "bf16"],
            dtype: p.master,
        },
        Part {
            key: "grads",
            label: "Gradients",
            choices: FLOATS,
            dtype: Some(p.grads),
        },
        Part {
            key: "optimizer",
            label: "Optimizer states",
            choices: FLOATS,
            dtype: Some(p.optimizer),
        },
        Part {
            key: "activations",
            label: "Activations",
            choices: &["fp32", "bf16", "fp16", "fp8"],
            dtype: Some(p.activations),
        },
        Part {
            key: "reduce",
            label: "Gradient reduction",
            choices: FLOATS,
            dtype: Some(p.reduce),
        },
    ]
}

/// The `precision` knob for `p` with one part changed: a recipe's name when the result is
/// exactly a recipe, else every part spelled out.
pub fn precision_knob(p: &Precision, part: &str, dtype: &str) -> String {
    let mut q = p.clone();
    let d = DType::parse(dtype);
    match (part, d) {
        ("weights", Some(d)) => q.weights = d,
        ("master", d) => q.master = d,
        ("grads", Some(d)) => q.grads = d,
        ("optimizer", Some(d)) => q.optimizer = d,
        ("activations", Some(d)) => q.activations = d,
        ("reduce", Some(d)) => q.reduce = d,
        _ => {}
    }
    for name in gpumem::precision::RECIPES {
        if let Some(mut r) = Precision::recipe(name) {
            r.name = q.name.clone();
            if r == q {
                return name.to_string();
            }
        }
    }
    let master = q.master.map(DType::name).unwrap_or("none");
    format!(
        "weights={},master={master},grads={},optimizer={},activations={},reduce={}",
        q.weights, q.grads, q.optimizer, q.activations, q.reduce
    )
}

/// What a part costs on this GPU, from the estimate.
fn part_bytes(key: &str, s: &Scenario, e: &Estimate) -> String {
    let c = |k: &str| e.components.get(k).copied().unwrap_or(0) as f64;
    match key {
        "weights" => gib(e.weights_bytes as f64),
        "master" => gib(e.master_weights_bytes as f64),
        "grads" => gib(e.gradients_bytes as f64),
        "optimizer" => gib(e.optimizer_states_bytes as f64),
        "activations" => gib(c("activations")),
        // Not a resident buffer: the size of what each step reduces.
        _ if s.mode == Mode::Train => format!(
            "{} reduced per step",
            gib(e.trainable_params as f64 * s.precision.reduce.bytes())
        ),
        _ => "—".into(),
    }
}

fn bytes_per(d: Option<DType>) -> String {
    match d {
        None => "—".into(),
        Some(d) => {
            let b = d.bytes();
            format!("{} B", fixed(b, if b.fract() == 0.0 { 0 } else { 3 }))
        }
    }
}

/// The precision widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_precision(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let (try_set, refused) = use_checked_set(set.clone());
    let got = k.scenario().and_then(|s| k.estimate().map(|e| (s, e)));
    let (s, e) = match got {
        Ok(x) => x,
        Err(err) => return crate::chart::refused("precision", root, err),
    };
    let recipe = current_recipe(&s, &k);
    let on_recipe = {
        let (k, try_set) = (k.clone(), try_set.clone());
        Callback::from(move |r: String| try_set.emit(apply_recipe(&k, &r)))
    };
    // Stored as, whatever the recipe says: QLoRA keeps the frozen base in NF4 (the recipe's
    // dtype is its compute's), an 8-bit optimizer (bitsandbytes) its states in int8 with an
    // fp32 scale per block.
    let qlora = matches!(&s.finetune, gpumem::scenario::Finetune::Lora(l) if l.quantized);
    let eight_bit = s.optimizer.eight_bit();
    let weights = if qlora {
        DType::Nf4
    } else {
        s.precision.weights
    };
    let optim = if eight_bit {
        DType::I8
    } else {
        s.precision.optimizer
    };
    let rows: Html = parts(&s.precision)
        .into_iter()
        .map(|part| {
            let id = init.id(part.key);
            let (choices, dtype) = if part.key == "optimizer" && eight_bit {
                (&["int8"][..], Some(optim))
            } else if part.key == "weights" && qlora {
                (&["nf4"][..], Some(weights))
            } else {
                (part.choices, part.dtype)
            };
            let selected = dtype.map(DType::name).unwrap_or("none");
            let onchange = {
                let (k, try_set, p) = (k.clone(), try_set.clone(), s.precision.clone());
                let key = part.key;
                Callback::from(move |ev: Event| {
                    let el: HtmlSelectElement = ev.target_unchecked_into();
                    try_set.emit(k.with("precision", precision_knob(&p, key, &el.value())));
                })
            };
            html! {
                <tr data-part={part.key}>
                    <th scope="row"><label for={id.clone()}>{ part.label }</label></th>
                    <td><select {id} {onchange}>
                        { for choices.iter().map(|c| html! {
                            <option value={*c} selected={*c == selected}>{ *c }</option>
                        }) }
                    </select></td>
                    <td class="gm-num">{ bytes_per(dtype) }</td>
                    <td class="gm-num">{ part_bytes(part.key, &s, &e) }</td>
                </tr>
            }
        })
        .collect();
    let slices = parts::of_estimate(&e);
    let (total, cap) = (e.device_bytes as f64, e.capacity_bytes as f64);
    let parts_sum = crate::allocator::sum_of(&slices, total);
    let gap = Sum::of(total.max(cap));
    let gap = gap.show((gap.units(cap) - gap.units(total)).abs());
    let recipe_name = RECIPES
        .iter()
        .find(|(r, _)| *r == recipe)
        .map(|(_, l)| *l)
        .unwrap_or("custom");
    // As the table's rows read.
    let summary = format!(
        "{} with {recipe_name} precision: weights {weights}, master {}, gradients {}, optimizer states {optim} ({}). {} of {} on {}: {}.",
        e.model,
        s.precision.master.map(DType::name).unwrap_or("none"),
        s.precision.grads,
        s.optimizer.name(),
        gib(total),
        gib(cap),
        e.gpu,
        if e.fits { "fits" } else { "does not fit" }
    );
    html! {
        <figure class="gm gm-precision" data-widget="precision" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ "Precision, part by part" }</span>
                <span class="gm-sub">{ format!("{} · {} · {}", e.model, recipe_name, s.optimizer.name()) }</span>
            </figcaption>
            <div class="gm-controls">
                { radio_group(init.id("recipe"), "Recipe",
                    RECIPES.iter().map(|(v, l)| (v.to_string(), l.to_string())).collect(),
                    recipe, on_recipe) }
            </div>
            <div class="gm-scroll"><table class="gm-table">
                <thead><tr><th scope="col">{ "Part" }</th><th scope="col">{ "Stored as" }</th>
                    <th scope="col">{ "Bytes per value" }</th><th scope="col">{ "Size" }</th></tr></thead>
                <tbody>{ rows }</tbody>
            </table></div>
            { refused }
            <p class="gm-total">
                <span class="gm-label">{ "Peak" }</span>
                <strong class="gm-big" data-value="total">{ parts_sum.gib(total) }</strong>
                <span class="gm-of">{ format!("of {} on {}", gib(cap), e.gpu) }</span>
            </p>
            { bar(&slices, true, total, cap) }
            { verdict_p(e.fits, if e.fits { format!("✓ {gap} headroom") }
                  else { format!("✗ exceeds {} by {gap}", e.gpu) }, false) }
            { legend(&slices, parts::always_listed(&e), parts_sum) }
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
        </figure>
    }
}
