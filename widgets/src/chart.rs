//! Pieces the SVG charts share: scales, ticks, and the toolbar every chart carries.

use gpumem::num::fixed;
use yew::prelude::*;

const GIB: f64 = 1073741824.0;

/// Round GiB ticks from 0 to at least `max_bytes` (about five of them), in bytes.
pub fn ticks(max_bytes: f64) -> Vec<f64> {
    let max = (max_bytes / GIB).max(1e-3);
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step * GIB).collect()
}

/// A tick label: "0", "20 GiB", "2.5 GiB".
pub fn tick_label(bytes: f64) -> String {
    let g = bytes / GIB;
    if g == 0.0 {
        "0".into()
    } else if (g - g.round()).abs() < 1e-9 {
        format!("{} GiB", fixed(g, 0))
    } else {
        format!("{} GiB", fixed(g, 1))
    }
}

/// Numbers in SVG attributes: two decimals are plenty.
pub fn n(x: f64) -> String {
    fixed(x, 2)
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

/// A widget whose scenario the engine refuses: the figure with the engine's message.
pub fn refused(widget: &'static str, root: NodeRef, err: impl std::fmt::Display) -> Html {
    html! {
        <figure class={classes!("gm", format!("gm-{widget}"))} data-widget={widget} ref={root}>
            <p class="gm-error" role="alert">{ format!("Cannot estimate: {err}") }</p>
        </figure>
    }
}

#[derive(Properties, PartialEq)]
pub struct ToolbarProps {
    /// The widget's uid: the file names of exports derive from it.
    pub name: AttrValue,
}

/// Copy a permalink to this view; save the chart as SVG or PNG. Hidden until the widget is
/// live (the buttons need the script).
#[component]
pub fn Toolbar(p: &ToolbarProps) -> Html {
    let status = use_state(String::new);
    let act = |what: &'static str| {
        let status = status.clone();
        let name = p.name.to_string();
        Callback::from(move |e: MouseEvent| {
            let msg = crate::export::run(what, &e, &name);
            status.set(msg);
        })
    };
    html! {
        <div class="gm-tools" role="toolbar" aria-label="Share and export">
            <button type="button" onclick={act("link")}>{ "Copy link" }</button>
            <button type="button" onclick={act("svg")}>{ "Save SVG" }</button>
            <button type="button" onclick={act("png")}>{ "Save PNG" }</button>
            <span class="gm-status" role="status">{ (*status).clone() }</span>
        </div>
    }
}
