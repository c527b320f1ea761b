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

#[derive(Properties, PartialEq)]
pub struct CountSliderProps {
    pub id: AttrValue,
    pub label: AttrValue,
    pub min: u64,
    pub max: u64,
    pub value: u64,
    /// The value in words, for the visible readout and `aria-valuetext`.
    pub valuetext: AttrValue,
    pub on_change: Callback<u64>,
}

/// Positions per doubling on a [`CountSlider`]'s track.
const PER_OCTAVE: f64 = 16.0;

/// A whole number on a log scale: dragging moves through 1, 2, 4, … evenly, while the arrow
/// keys step by one, so every number in the range can be reached (Page Up/Down double and
/// halve, Home/End jump to the ends).
#[component]
pub fn CountSlider(p: &CountSliderProps) -> Html {
    let (min, max) = (p.min.max(1), p.max.max(p.min.max(1)));
    let span = (max as f64 / min as f64).log2();
    let positions = (span * PER_OCTAVE).ceil().max(1.0) as i64;
    let at = |v: u64| -> i64 {
        ((v.clamp(min, max) as f64 / min as f64).log2() / span.max(1e-9) * positions as f64).round()
            as i64
    };
    let oninput = {
        let cb = p.on_change.clone();
        Callback::from(move |e: InputEvent| {
            let el: HtmlInputElement = e.target_unchecked_into();
            if let Ok(i) = el.value().parse::<i64>() {
                let f = i.clamp(0, positions) as f64 / positions as f64;
                let v = (min as f64 * (span * f).exp2()).round() as u64;
                cb.emit(v.clamp(min, max));
            }
        })
    };
    // The value the keys step from: the last one sent, so that keys pressed faster than the
    // page redraws each count.
    let sent = use_mut_ref(|| p.value);
    *sent.borrow_mut() = p.value;
    let onkeydown = {
        let (cb, sent) = (p.on_change.clone(), sent.clone());
        Callback::from(move |e: KeyboardEvent| {
            let value = *sent.borrow();
            let to = match e.key().as_str() {
                "ArrowRight" | "ArrowUp" => value.saturating_add(1),
                "ArrowLeft" | "ArrowDown" => value.saturating_sub(1),
                "PageUp" => value.saturating_mul(2),
                "PageDown" => value / 2,
                "Home" => min,
                "End" => max,
                _ => return,
            };
            e.prevent_default();
            e.stop_propagation();
            let to = to.clamp(min, max);
            *sent.borrow_mut() = to;
            cb.emit(to);
        })
    };
    html! {
        <div class="gm-control">
            <label for={p.id.clone()}>{ p.label.clone() }</label>
            <input type="range" id={p.id.clone()} min="0" max={positions.to_string()}
                step="1" value={at(p.value).to_string()}
                aria-valuemin={min.to_string()} aria-valuemax={max.to_string()}
                aria-valuenow={p.value.to_string()} aria-valuetext={p.valuetext.clone()}
                {oninput} {onkeydown} />
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
