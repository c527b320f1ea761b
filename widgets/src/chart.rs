//! Pieces the SVG charts share: scales, ticks, the chart's width on the page, labels that
//! fit, and the toolbar every chart carries.

use gpumem::num::fixed;
use yew::prelude::*;

const GIB: f64 = 1073741824.0;

/// The width charts are drawn at when the book is built (and until the browser has laid the
/// page out): a column of the book at its usual width.
pub const DEFAULT_WIDTH: f64 = 640.0;
/// The narrowest and widest a chart is drawn at.
pub const MIN_WIDTH: f64 = 260.0;
pub const MAX_WIDTH: f64 = 900.0;

/// Round GiB ticks from 0 to at least `max_bytes` (about `n` of them), in bytes.
pub fn ticks_n(max_bytes: f64, n: f64) -> Vec<f64> {
    let max = (max_bytes / GIB).max(1e-3);
    let raw = max / n.max(1.0);
    let mag = 10f64.powi(raw.log10().floor() as i32);
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let k = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=k).map(|i| i as f64 * step * GIB).collect()
}

/// Round GiB ticks from 0 to at least `max_bytes` (about five of them), in bytes.
pub fn ticks(max_bytes: f64) -> Vec<f64> {
    ticks_n(max_bytes, 5.0)
}

/// A tick label: "0", "20 GiB", "2.5 GiB".
pub fn tick_label(bytes: f64) -> String {
    let g = bytes / GIB;
    if g == 0.0 {
        "0".into()
    } else if (g - g.round()).abs() < 1e-9 {
        format!("{} GiB", crate::format::signed(g, 0))
    } else {
        format!("{} GiB", crate::format::signed(g, 1))
    }
}

/// Numbers in SVG attributes: two decimals are plenty.
pub fn n(x: f64) -> String {
    fixed(x, 2)
}

/// About how wide a chart label is, in pixels, at the charts' 11 px.
pub fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * 6.3
}

/// `text`, shortened with an ellipsis to fit `px` pixels.
pub fn fit(text: &str, px: f64) -> String {
    let max = (px / 6.3).floor().max(1.0) as usize;
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut t: String = text.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// Horizontal grid lines with their GiB labels, from `left` to `right`; `y` maps bytes.
pub fn grid(ticks: &[f64], left: f64, right: f64, y: impl Fn(f64) -> f64) -> Html {
    ticks
        .iter()
        .map(|&t| {
            html! {
                <g class="gm-tick">
                    <line class="gm-grid" x1={n(left)} x2={n(right)} y1={n(y(t))} y2={n(y(t))} />
                    <text x={n(left - 6.0)} y={n(y(t) + 4.0)} text-anchor="end">{ tick_label(t) }</text>
                </g>
            }
        })
        .collect()
}

/// The width a chart takes on the page, in CSS pixels, so that one unit of its `viewBox` is
/// one pixel and its text is drawn at its size (11 px) on a phone as on a desktop. Built
/// pages carry [`DEFAULT_WIDTH`]; in the browser the chart is measured once it is laid out
/// and again when the window is resized. Attach the returned ref to the `<svg>`.
#[hook]
pub fn use_width() -> (NodeRef, f64) {
    let node = use_node_ref();
    let width = use_state_eq(|| DEFAULT_WIDTH);
    #[cfg(target_arch = "wasm32")]
    {
        use wasm_bindgen::prelude::*;
        use wasm_bindgen::JsCast;
        let (node, width) = (node.clone(), width.clone());
        use_effect_with((), move |_| {
            let measure = move || {
                if let Some(el) = node.cast::<web_sys::Element>() {
                    let w = el.get_bounding_client_rect().width();
                    if w > 0.0 {
                        width.set(w.round().clamp(MIN_WIDTH, MAX_WIDTH));
                    }
                }
            };
            measure();
            let cb = Closure::<dyn Fn()>::new(measure);
            let win = web_sys::window();
            if let Some(w) = &win {
                let _ = w.add_event_listener_with_callback("resize", cb.as_ref().unchecked_ref());
            }
            move || {
                if let Some(w) = win {
                    let _ = w
                        .remove_event_listener_with_callback("resize", cb.as_ref().unchecked_ref());
                }
                drop(cb);
            }
        });
    }
    (node, *width)
}

/// An element whose class is computed, built without the `class={…}` of `html!`: that goes
/// through Yew's `Classes` (an ordered set of names, with its hashing), 3 KB of the gzipped
/// wasm for names that are always known here as one string. `keys` name the attributes, in
/// the order `values` gives them.
pub fn el(
    tag: &'static str,
    keys: &'static [&'static str],
    values: Vec<AttrValue>,
    children: Html,
) -> Html {
    use yew::virtual_dom::{AttributeOrProperty, Attributes, VTag};
    let mut t = VTag::new(tag);
    t.set_attributes(Attributes::Dynamic {
        keys,
        values: values
            .into_iter()
            .map(|v| Some(AttributeOrProperty::Attribute(v)))
            .collect(),
    });
    t.add_child(children);
    t.into()
}

/// A part's colour swatch (`gm-swatch gm-c-KEY`), hidden from screen readers.
pub fn swatch(key: &str) -> Html {
    el(
        "span",
        &["class", "aria-hidden"],
        vec![format!("gm-swatch gm-c-{key}").into(), "true".into()],
        Html::default(),
    )
}

/// A verdict line, `gm-ok` when `ok` and `gm-over` otherwise; with `data-value="verdict"`
/// (what tests and readers' scripts read) when `marked`.
pub fn verdict_p(ok: bool, text: String, marked: bool) -> Html {
    let class = AttrValue::Static(if ok {
        "gm-verdict gm-ok"
    } else {
        "gm-verdict gm-over"
    });
    let text = html! { { text } };
    if marked {
        el(
            "p",
            &["class", "data-value"],
            vec![class, "verdict".into()],
            text,
        )
    } else {
        el("p", &["class"], vec![class], text)
    }
}

/// A widget whose scenario the engine refuses: the figure with the engine's message.
pub fn refused(widget: &'static str, root: NodeRef, err: impl std::fmt::Display) -> Html {
    let mut f = el(
        "figure",
        &["class", "data-widget"],
        vec![format!("gm gm-{widget}").into(), widget.into()],
        html! { <p class="gm-error" role="alert">{ format!("Cannot estimate: {err}") }</p> },
    );
    if let Html::VTag(t) = &mut f {
        std::rc::Rc::make_mut(t).node_ref = root;
    }
    f
}

/// The scenario in a line, for exported files: `model=llama3.1-8b · batch=1 · seq=2k`.
pub fn settings(k: &crate::Knobs) -> String {
    gpumem::knobs::KNOBS
        .iter()
        .filter_map(|key| k.get(key).map(|v| format!("{key}={v}")))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// What the toolbar says after an action, and a link to show when it could not be copied.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub message: String,
    pub link: Option<String>,
}

/// Copy a permalink to this view; save the chart as SVG or PNG. Hidden until the widget is
/// live (the buttons need the script). Exported files are named after the widget and its uid
/// (`gpumem-zero-3.svg`); `settings` is the scenario written into them. A hook rather than a component
/// (Yew's code for a component type is not in the wasm for it): call it with the widget's
/// other hooks.
#[hook]
pub fn use_toolbar(init: &crate::Init, settings: String) -> Html {
    let name = format!("gpumem-{}-{}", init.widget, init.uid);
    let status = use_state(Status::default);
    let act = |what: &'static str| {
        let status = status.clone();
        let (name, settings) = (name.clone(), settings.clone());
        Callback::from(move |e: MouseEvent| {
            let s = status.setter();
            let report = Callback::from(move |st: Status| s.set(st));
            crate::export::run(what, &e, &name, &settings, report);
        })
    };
    // Named after the chart it serves (a page has several such toolbars).
    let label_id = init.id("tools");
    let labelled_by = format!("{label_id} {}", init.id("title"));
    html! {
        <div class="gm-tools" role="toolbar" aria-labelledby={labelled_by}>
            <span id={label_id} hidden=true>{ "Share and export:" }</span>
            <button type="button" onclick={act("link")}>{ "Copy link" }</button>
            <button type="button" onclick={act("svg")}>{ "Save SVG" }</button>
            <button type="button" onclick={act("png")}>{ "Save PNG" }</button>
            <span class="gm-status" role="status">
                { status.message.clone() }
                if let Some(link) = &status.link {
                    <input class="gm-link" type="text" readonly=true value={link.clone()}
                        aria-label="The link to this view" />
                }
            </span>
        </div>
    }
}
