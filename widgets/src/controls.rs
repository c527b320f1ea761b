//! Controls every widget uses: a labelled native range slider, a radiogroup of pills and a
//! select. All keyboard-operable, all announcing their values in words.

use web_sys::{HtmlElement, HtmlInputElement, HtmlSelectElement, KeyboardEvent};
use yew::prelude::*;

#[derive(Properties, PartialEq)]
pub struct SliderProps {
    pub id: AttrValue,
    pub label: AttrValue,
    pub min: i64,
    pub max: i64,
    pub value: i64,
    /// The value in words, for the visible readout and `aria-valuetext`.
    pub valuetext: AttrValue,
    pub on_change: Callback<i64>,
}

/// A native `<input type="range">` with its label and readout.
#[component]
pub fn Slider(p: &SliderProps) -> Html {
    let oninput = {
        let cb = p.on_change.clone();
        Callback::from(move |e: InputEvent| {
            let el: HtmlInputElement = e.target_unchecked_into();
            if let Ok(v) = el.value().parse::<i64>() {
                cb.emit(v);
            }
        })
    };
    html! {
        <div class="gm-control">
            <label for={p.id.clone()}>{ p.label.clone() }</label>
            <input type="range" id={p.id.clone()} min={p.min.to_string()} max={p.max.to_string()}
                step="1" value={p.value.to_string()}
                aria-valuemin={p.min.to_string()} aria-valuemax={p.max.to_string()}
                aria-valuenow={p.value.to_string()} aria-valuetext={p.valuetext.clone()}
                {oninput} />
            <output for={p.id.clone()} aria-hidden="true">{ p.valuetext.clone() }</output>
        </div>
    }
}

/// A choice among named values: the radiogroup's and the select's props.
#[derive(Properties, PartialEq)]
pub struct ChoiceProps {
    pub id: AttrValue,
    pub label: AttrValue,
    /// (value, label) pairs.
    pub options: Vec<(String, String)>,
    pub selected: String,
    pub on_change: Callback<String>,
}

/// Pills as a WAI-ARIA radiogroup: Tab reaches the checked pill, arrows move and select,
/// Home/End jump, Space and Enter select the focused pill.
#[component]
pub fn RadioGroup(p: &ChoiceProps) -> Html {
    let refs = use_memo(p.options.len(), |n| {
        (0..*n).map(|_| NodeRef::default()).collect::<Vec<_>>()
    });
    let n = p.options.len();
    let checked = p.options.iter().position(|(v, _)| *v == p.selected);
    let label_id = format!("{}-label", p.id);
    let pills = p.options.iter().enumerate().map(|(i, (value, text))| {
        let is_checked = Some(i) == checked;
        // Roving tabindex: the checked pill (or the first, when none is) takes Tab.
        let tab = if is_checked || (checked.is_none() && i == 0) {
            "0"
        } else {
            "-1"
        };
        let onclick = {
            let cb = p.on_change.clone();
            let v = value.clone();
            Callback::from(move |_: MouseEvent| cb.emit(v.clone()))
        };
        let onkeydown = {
            let cb = p.on_change.clone();
            let values: Vec<String> = p.options.iter().map(|(v, _)| v.clone()).collect();
            let refs = refs.clone();
            Callback::from(move |e: KeyboardEvent| {
                let to = match e.key().as_str() {
                    "ArrowRight" | "ArrowDown" => (i + 1) % n,
                    "ArrowLeft" | "ArrowUp" => (i + n - 1) % n,
                    "Home" => 0,
                    "End" => n - 1,
                    _ => return,
                };
                // The key is ours: not the browser's, nor the book's (mdBook turns the
                // pages with the arrow keys).
                e.prevent_default();
                e.stop_propagation();
                if let Some(el) = refs[to].cast::<HtmlElement>() {
                    let _ = el.focus();
                }
                cb.emit(values[to].clone());
            })
        };
        html! {
            <button type="button" role="radio" class="gm-pill" ref={refs[i].clone()}
                aria-checked={if is_checked { "true" } else { "false" }} tabindex={tab}
                {onclick} {onkeydown}>{ text.clone() }</button>
        }
    });
    html! {
        <div class="gm-control">
            <span class="gm-label" id={label_id.clone()}>{ p.label.clone() }</span>
            <div class="gm-pills" role="radiogroup" aria-labelledby={label_id}>{ for pills }</div>
        </div>
    }
}

/// A native `<select>` with its label.
#[component]
pub fn Select(p: &ChoiceProps) -> Html {
    let onchange = {
        let cb = p.on_change.clone();
        Callback::from(move |e: Event| {
            let el: HtmlSelectElement = e.target_unchecked_into();
            cb.emit(el.value());
        })
    };
    html! {
        <div class="gm-control">
            <label for={p.id.clone()}>{ p.label.clone() }</label>
            <select id={p.id.clone()} {onchange}>
                { for p.options.iter().map(|(v, t)| html! {
                    <option value={v.clone()} selected={*v == p.selected}>{ t.clone() }</option>
                }) }
            </select>
        </div>
    }
}
