//! The memory budget allocator: what one GPU holds at the step's peak, as a stacked bar
//! against the device's capacity, with sliders for the model, the batch and the sequence,
//! precision pills and the GPU. Every figure is the engine's.

use std::rc::Rc;

use gpumem::{gpu, presets};
use yew::prelude::*;

use crate::chart::{el, swatch, verdict_p};
use crate::controls::{count_slider, radio_group, select, slider};
use crate::format::{gib, params, pct, tokens, Sum};
use crate::parts::{self, Slice};
use crate::{store, Init, Knobs};

/// The stacked bar of `slices` against the capacity tick, the overflow hatched; with
/// `by_slice` false, one segment for the total.
pub fn bar(slices: &[Slice], by_slice: bool, total: f64, cap: f64) -> Html {
    let scale = total.max(cap);
    let sum = Sum::of(total);
    let segs: Html = if by_slice {
        slices
            .iter()
            .filter(|b| b.bytes > 0.0)
            .map(|b| {
                el(
                    "div",
                    &["class", "style", "title"],
                    vec![
                        format!("gm-seg gm-c-{}", b.key()).into(),
                        format!("width:{}", pct(b.bytes, scale)).into(),
                        format!("{}: {}", b.label(), sum.gib(b.bytes)).into(),
                    ],
                    Html::default(),
                )
            })
            .collect()
    } else {
        html! { <div class="gm-seg gm-c-weights" style={format!("width:{}", pct(total, scale))}></div> }
    };
    let overflow = (total > cap).then(|| {
        html! {
            <div class="gm-overflow" style={format!("left:{};width:{}", pct(cap, scale), pct(total - cap, scale))}></div>
        }
    });
    html! {
        <div class="gm-bar" aria-hidden="true">
            { segs }
            { overflow }
            <div class="gm-cap" style={format!("left:{}", pct(cap, scale))}></div>
        </div>
    }
}

/// The legend: a swatch, a name and a size per slice, at `sum`'s rounding (the total's
/// shown with it: [`sum_of`]); empty slices only when in `always`.
pub fn legend(slices: &[Slice], always: &[&str], sum: Sum) -> Html {
    let shown: Vec<(&Slice, String)> = slices
        .iter()
        .zip(sum.texts(&slices.iter().map(|s| s.bytes).collect::<Vec<_>>()))
        .filter(|(b, _)| b.bytes > 0.0 || always.contains(&b.key()))
        .collect();
    html! {
        <ul class="gm-legend">
            { for shown.into_iter().map(|(b, text)| html! {
                <li data-bucket={b.key()}>
                    { swatch(b.key()) }
                    <span class="gm-name">{ b.label() }</span>
                    <span class="gm-num">{ text }</span>
                </li>
            }) }
        </ul>
    }
}

/// The rounding at which `slices` add up to `total` as shown ([`Sum::for_parts`]): a
/// legend's and its total's (15.0 + 29.9 + … had read 77.1 against a total of 77.2).
pub fn sum_of(slices: &[Slice], total: f64) -> Sum {
    Sum::for_parts(&slices.iter().map(|s| s.bytes).collect::<Vec<_>>(), total)
}

/// A legend of names only (a sweep's), for the parts in `keys`.
pub fn key_legend(keys: &[&'static str]) -> Html {
    html! {
        <ul class="gm-legend">
            { for keys.iter().filter_map(|k| parts::find(k)).map(|p| html! {
                <li data-bucket={p.key}>
                    { swatch(p.key) }
                    <span class="gm-name">{ p.label }</span>
                </li>
            }) }
        </ul>
    }
}

/// The page's knobs through the engine first: a change it refuses is not applied, and the
/// returned paragraph (`role=alert`, empty while nothing is refused) says why; the page keeps
/// its state.
#[hook]
pub fn use_checked_set(set: Callback<Knobs>) -> (Callback<Knobs>, Html) {
    let refused = use_state(|| None::<String>);
    let try_set = {
        let refused = refused.clone();
        Callback::from(move |n: Knobs| match n.scenario() {
            Ok(_) => {
                refused.set(None);
                set.emit(n)
            }
            Err(e) => refused.set(Some(e.to_string())),
        })
    };
    let note = match &*refused {
        Some(msg) => {
            html! { <p class="gm-error" role="alert">{ format!("Not applied: {msg}") }</p> }
        }
        None => html! {},
    };
    (try_set, note)
}

/// A model on the size slider.
#[derive(Clone, Debug, PartialEq)]
pub struct Rung {
    pub name: &'static str,
    pub params: u64,
}

thread_local! {
    /// Every preset, smallest first.
    static LADDER: Rc<Vec<Rung>> = {
        let mut v: Vec<Rung> = presets::all()
            .into_iter()
            // As transformers counts the model it builds (a wrapper's vision tower too).
            .map(|p| {
                let c = p.arch.params();
                Rung { name: p.name, params: c.total + c.vision }
            })
            .collect();
        gpumem::order::sort_by(&mut v, |a, b| (a.params, a.name).cmp(&(b.params, b.name)));
        Rc::new(v)
    };
}

/// The models the size slider steps through: presets between `min` and `max` billion
/// parameters (nominal sizes: a 0.49B model counts as 0.5B), plus the current one.
pub fn ladder(min_b: f64, max_b: f64, current: &str) -> Vec<Rung> {
    LADDER.with(|all| {
        all.iter()
            .filter(|r| {
                let b = r.params as f64 / 1e9;
                (b >= min_b * 0.95 && b <= max_b * 1.05) || r.name == current
            })
            .cloned()
            .collect()
    })
}

/// Powers of two and the steps halfway between them (512, 768, 1K, 1.5K, 2K, 3K, …)
/// between `min` and `max`, plus the current value.
pub fn seq_steps(min: u64, max: u64, current: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..40)
        .flat_map(|i| [1u64 << i, (3u64 << i) / 2])
        .filter(|&x| x >= min && x <= max)
        .collect();
    v.push(current);
    gpumem::order::sort(&mut v);
    v.dedup();
    v
}

/// The training recipes a precision control offers.
pub const PRECISIONS: &[(&str, &str)] = &[
    ("fp32", "FP32"),
    ("amp-bf16", "AMP BF16"),
    ("bf16", "BF16"),
    ("mixed-bf16", "Mixed BF16"),
    ("fp8", "FP8"),
];

/// What inference runs in: the weights' format (the activations and the KV cache in the
/// compute dtype). Training recipes (master weights, optimizer states) mean nothing here.
pub const INFERENCE_PRECISIONS: &[(&str, &str)] = &[
    ("fp32", "FP32"),
    ("bf16", "BF16"),
    ("fp16", "FP16"),
    ("bf16,weights=fp8", "FP8 weights"),
    ("bf16,weights=int8", "INT8 weights"),
    ("bf16,weights=int4", "INT4 weights"),
];

pub fn precision_label(p: &str) -> String {
    if let Some((_, l)) = PRECISIONS
        .iter()
        .chain(INFERENCE_PRECISIONS)
        .find(|(v, _)| *v == p)
    {
        return l.to_string();
    }
    if p.contains('=') {
        return "Custom".into();
    }
    p.to_ascii_uppercase()
}

fn opt_f64(init: &Init, k: &str, default: f64) -> f64 {
    init.option(k)
        .and_then(|v| gpumem::knobs::number(k, v).ok())
        .unwrap_or(default)
}

fn opt_count(init: &Init, k: &str, default: u64) -> u64 {
    init.option(k)
        .and_then(|v| gpumem::knobs::count(k, v).ok())
        .unwrap_or(default)
}

/// The page's knobs (or the widget's own, with `scope=local`), and how to change them; with
/// `at_rest`, told of a change only once the knobs rest (see [`store::join`]).
#[hook]
pub fn use_knobs(init: &Init, at_rest: bool) -> (Knobs, Callback<Knobs>) {
    let knobs = use_state(|| init.knobs.clone());
    {
        let setter = knobs.setter();
        let local = init.local;
        let initial = init.knobs.clone();
        let (page, uid) = (init.page.clone(), init.uid.clone());
        use_effect_with((), move |_| {
            let sub = (!local).then(|| {
                let s2 = setter.clone();
                let (current, sub) = store::join(
                    &page,
                    if at_rest { "" } else { &uid },
                    &initial,
                    Callback::from(move |k| s2.set(k)),
                );
                if current != initial {
                    setter.set(current);
                }
                sub
            });
            move || drop(sub)
        });
    }
    let set = {
        let setter = knobs.setter();
        let local = init.local;
        let page = init.page.clone();
        Callback::from(move |k: Knobs| {
            if local {
                setter.set(k)
            } else {
                store::publish(&page, k)
            }
        })
    };
    ((*knobs).clone(), set)
}

/// A node ref for a widget's root that gets `data-live` once the widget runs in the browser
/// (rendered live and listening); tests and readers' scripts can wait for it.
#[hook]
pub fn use_live_marker() -> NodeRef {
    let root = use_node_ref();
    {
        let root = root.clone();
        use_effect_with((), move |_| {
            if let Some(el) = root.cast::<web_sys::Element>() {
                let _ = el.set_attribute("data-live", "");
            }
        });
    }
    root
}

/// The allocator widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_allocator(init: &Init) -> Html {
    let (k, set) = use_knobs(init, false);
    let root = use_live_marker();
    let model = k.model_name().to_string();
    let batch = k.count("batch", 1);
    let seq = k.count("seq", 2048);
    let precision = k.get_or_default("precision").to_string();
    let inference = k.get("mode") == Some("inference");
    let show_breakdown = init.option("show-breakdown") != Some("false");

    // The model slider.
    let rungs = ladder(
        opt_f64(init, "model-min", 0.5),
        opt_f64(init, "model-max", 175.0),
        &model,
    );
    // A config the page was given is not on the ladder: the slider names it at the start.
    let found = rungs.iter().position(|r| r.name == model);
    let model_at = found.unwrap_or(0);
    let model_text = match found {
        Some(i) => format!("{} ({} parameters)", rungs[i].name, params(rungs[i].params)),
        None => model.clone(),
    };
    let on_model = {
        let (k, set, names) = (
            k.clone(),
            set.clone(),
            rungs.iter().map(|r| r.name).collect::<Vec<_>>(),
        );
        Callback::from(move |i: i64| {
            // A preset replaces a config the page was given.
            if let Some(n) = names.get(i.max(0) as usize) {
                set.emit(k.without("arch").with("model", *n));
            }
        })
    };

    // Batch: a log scale, every whole number reachable by the keys.
    let batch_min = opt_count(init, "batch-min", 1).max(1);
    let batch_max = opt_count(init, "batch-max", 64).max(batch).max(batch_min);
    let on_batch = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |b: u64| set.emit(k.with("batch", b.max(1).to_string())))
    };

    // Sequence: powers of two and the steps between them.
    let steps = seq_steps(
        opt_count(init, "seq-min", 512),
        opt_count(init, "seq-max", 32768),
        seq,
    );
    let seq_at = steps.iter().position(|&s| s == seq).unwrap_or(0);
    let on_seq = {
        let (k, set, steps) = (k.clone(), set.clone(), steps.clone());
        Callback::from(move |i: i64| {
            if let Some(s) = steps.get(i.max(0) as usize) {
                set.emit(k.with("seq", s.to_string()));
            }
        })
    };

    // Precision pills: training recipes, or the formats inference runs in.
    let recipes = if inference {
        INFERENCE_PRECISIONS
    } else {
        PRECISIONS
    };
    let mut pills: Vec<(String, String)> = recipes
        .iter()
        .map(|(v, l)| (v.to_string(), l.to_string()))
        .collect();
    if !pills.iter().any(|(v, _)| *v == precision) {
        pills.push((precision.clone(), precision_label(&precision)));
    }
    let on_precision = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |p: String| set.emit(k.with("precision", p)))
    };

    // The budget: a GPU from the catalogue, or the capacity the page set.
    let mut gpus: Vec<(String, String)> = gpu::GPUS
        .iter()
        .map(|g| {
            (
                g.name.to_string(),
                format!("{} ({})", g.name, gib(g.capacity_bytes as f64)),
            )
        })
        .collect();
    let selected_gpu = match k.get("capacity") {
        Some(c) => {
            gpus.insert(0, ("custom".into(), format!("Custom ({c} GiB)")));
            "custom".to_string()
        }
        None => k.get_or_default("gpu").to_string(),
    };
    let on_gpu = {
        let (k, set) = (k.clone(), set.clone());
        Callback::from(move |g: String| {
            if g != "custom" {
                set.emit(k.without("capacity").with("gpu", g));
            }
        })
    };

    let what = if inference { "Inference" } else { "Training" };
    let sub = format!(
        "{model} · b={batch} · s={} · {}",
        tokens(seq),
        precision_label(&precision)
    );
    let title_id = init.id("title");
    let summary_id = init.id("summary");

    let body = match k.estimate() {
        Err(e) => {
            html! { <p class="gm-error" role="alert">{ format!("Cannot estimate: {e}") }</p> }
        }
        Ok(est) => {
            let total = est.device_bytes as f64;
            let cap = est.capacity_bytes as f64;
            let sum = Sum::of(total.max(cap));
            let slices = parts::of_estimate(&est);
            let parts_sum = sum_of(&slices, total);
            let (total_text, cap_text) = (parts_sum.gib(total), gib(cap));
            let gap = sum.show((sum.units(cap) - sum.units(total)).abs());
            let verdict = if est.fits {
                format!("{gap} headroom")
            } else {
                format!("exceeds {} by {gap}", est.gpu)
            };
            let summary = format!(
                "{what} memory budget. {model}, batch {batch}, sequence {}, {} on {}. Total {total_text} of {cap_text}: {}.",
                tokens(seq),
                precision_label(&precision),
                est.gpu,
                if est.fits {
                    format!("fits, {verdict}")
                } else {
                    format!("does not fit, {verdict}")
                }
            );
            let legend =
                show_breakdown.then(|| legend(&slices, parts::always_listed(&est), parts_sum));
            let grads_later = !inference
                && est.gradients_bytes > 0
                && est.components.get("gradients").copied().unwrap_or(0) == 0;
            let phase_note = format!(
                "Peak during {}{}",
                est.peak_phase,
                if grads_later {
                    ": the gradients do not exist yet at that moment."
                } else {
                    "."
                }
            );
            html! {
                <>
                    <p class="gm-total">
                        <span class="gm-label">{ "Total" }</span>
                        <strong class="gm-big" data-value="total">{ total_text }</strong>
                        <span class="gm-of">{ format!("of {cap_text} on {}", est.gpu) }</span>
                    </p>
                    { bar(&slices, show_breakdown, total, cap) }
                    { verdict_p(est.fits, format!("{}{verdict}", if est.fits { "✓ " } else { "✗ " }), true) }
                    { legend }
                    <p class="gm-note">{ phase_note }</p>
                    // In a box of their own: a note more or less must not make the controls
                    // below new elements (Yew matches unkeyed children from the end).
                    <div class="gm-notes">{ for est.notes.iter().map(|n| html! { <p class="gm-note">{ n.clone() }</p> }) }</div>
                    <p class="gm-sr" id={summary_id.clone()} aria-live="polite">{ summary }</p>
                </>
            }
        }
    };

    html! {
        <figure class="gm gm-allocator" data-widget="allocator" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ format!("{what} memory") }</span>
                <span class="gm-sub">{ sub }</span>
            </figcaption>
            { body }
            <div class="gm-controls">
                { slider(init.id("model"), "Model", (0, rungs.len().saturating_sub(1) as i64),
                    model_at as i64, model_text, on_model) }
                { count_slider(init.id("batch"), "Batch", (batch_min, batch_max),
                    batch, batch.to_string(), on_batch) }
                { slider(init.id("seq"), "Sequence", (0, steps.len().saturating_sub(1) as i64),
                    seq_at as i64, format!("{} tokens", tokens(seq)), on_seq) }
                { radio_group(init.id("precision"), "Precision", pills, precision, on_precision) }
                { select(init.id("gpu"), "GPU", gpus, selected_gpu, on_gpu) }
            </div>
        </figure>
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn init(knobs: &[(&str, &str)], options: &[(&str, &str)]) -> Init {
        Init {
            widget: "allocator".into(),
            uid: "t".into(),
            page: "t".into(),
            knobs: Knobs(
                knobs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            local: false,
        }
    }

    #[test]
    fn buckets_add_up_to_the_device_total() {
        for knobs in [
            vec![("model", "llama3.1-8b"), ("precision", "bf16")],
            vec![
                ("model", "llama3.1-70b"),
                ("mode", "inference"),
                ("seq", "8k"),
            ],
            vec![("model", "mixtral-8x7b"), ("precision", "mixed-bf16")],
        ] {
            let e = Knobs(
                knobs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
            .estimate()
            .unwrap();
            let sum: f64 = parts::of_estimate(&e).iter().map(|b| b.bytes).sum();
            assert!((sum - e.device_bytes as f64).abs() < 8.0, "{knobs:?}");
        }
    }

    #[test]
    fn renders_the_engine_numbers_and_the_accessibility_hooks() {
        let i = init(
            &[
                ("model", "llama3.1-8b"),
                ("batch", "1"),
                ("seq", "2048"),
                ("precision", "bf16"),
            ],
            &[],
        );
        let html = crate::render(&i).unwrap();
        let e = i.knobs.estimate().unwrap();
        assert!(html.contains(r#"data-widget="allocator""#));
        assert!(html.contains(&gib(e.device_bytes as f64)), "{html}");
        // The headroom as the bar states it: capacity and total in the same rounding.
        let (cap, total) = (e.capacity_bytes as f64, e.device_bytes as f64);
        let sum = Sum::of(total.max(cap));
        let gap = sum.show(sum.units(cap) - sum.units(total));
        assert!(html.contains(&format!("{gap} headroom")), "{gap}");
        assert!(html.contains(&gib(e.components["activations"] as f64)));
        assert!(html.contains(&gib(e.components["logits"] as f64)));
        assert!(html.contains(r#"role="radiogroup""#));
        assert!(html.contains(r#"aria-checked="true""#));
        assert!(html.contains(r#"aria-live="polite""#));
        assert!(html.contains(r#"aria-valuetext="2K tokens""#));
        assert!(html.contains("llama3.1-8b · b=1 · s=2K · BF16"));
    }

    #[test]
    fn says_when_it_does_not_fit() {
        let i = init(
            &[("model", "llama3.1-70b"), ("precision", "mixed-bf16")],
            &[],
        );
        let html = crate::render(&i).unwrap();
        assert!(html.contains("exceeds H100-80GB by"), "{html}");
        assert!(html.contains("gm-overflow"));
        assert!(html.contains("does not fit"));
    }

    #[test]
    fn options_shape_the_sliders_and_the_breakdown() {
        let i = init(
            &[("model", "llama3.1-8b"), ("capacity", "80")],
            &[
                ("show-breakdown", "false"),
                ("batch-max", "16"),
                ("seq-max", "8k"),
            ],
        );
        let html = crate::render(&i).unwrap();
        assert!(!html.contains("gm-legend"));
        assert!(html.contains("Custom (80 GiB)"));
        // Sequence: 512, 768, 1K, 1.5K, 2K, 3K, 4K, 6K, 8K → index 0..8.
        assert!(html.contains(r#"id="t-seq" min="0" max="8""#), "{html}");
        assert_eq!(seq_steps(512, 8192, 1000)[..4], [512, 768, 1000, 1024]);
        // Batch: a log track of 16 positions per doubling, the values 1 to 16.
        assert!(html.contains(r#"id="t-batch" min="0" max="64""#), "{html}");
        assert!(
            html.contains(r#"aria-valuemin="1" aria-valuemax="16""#),
            "{html}"
        );
        let rungs = ladder(0.5, 175.0, "gpt2");
        assert!(
            rungs.iter().any(|r| r.name == "gpt2"),
            "the current model is always on the slider"
        );
        assert!(!rungs.iter().any(|r| r.name == "llama3.1-405b"));
    }

    /// A config given as `arch` wins over the preset: the card names it, not the preset
    /// beside it, and so does the model slider until it is moved.
    #[test]
    fn a_config_is_named_as_what_the_card_shows() {
        let i = init(
            &[("model", "llama3.1-8b"), ("arch", "model_type=qwen3,hidden_size=1024,num_hidden_layers=4,num_attention_heads=16,num_key_value_heads=8,head_dim=128,intermediate_size=3072,vocab_size=151936")],
            &[],
        );
        let html = crate::render(&i).unwrap();
        assert!(html.contains("custom (config.json) · b=1"), "{html}");
        assert!(!html.contains("llama3.1-8b · b=1"), "{html}");
    }

    /// The size ladder (and the 5D panel's model menu) counts a model as transformers
    /// builds it, as the estimate does: Gemma 3's wrapper with its vision tower.
    #[test]
    fn the_ladder_counts_what_transformers_builds() {
        let rungs = ladder(0.0, f64::MAX, "");
        let gemma = rungs.iter().find(|r| r.name == "gemma-3-12b").unwrap();
        let s = gpumem::Scenario::from_value(&serde_json::json!({"model": "gemma-3-12b"})).unwrap();
        assert_eq!(gemma.params, gpumem::estimate(&s).unwrap().params);
        assert_eq!(gemma.params, 12_187_325_040);
    }
}
