//! Controls every widget uses: a labelled native range slider, a radiogroup of pills and a
//! select. All keyboard-operable, all announcing their values in words.
//!
//! Plain functions rather than components: a Yew component type costs its creation, mounting
//! and props code in the wasm, and these keep no state of their own.

use web_sys::{HtmlElement, HtmlInputElement, HtmlSelectElement, KeyboardEvent};
use yew::prelude::*;

/// A native `<input type="range">` with its label and readout; `valuetext` is the value in
/// words, for the visible readout and `aria-valuetext`.
pub fn slider(
    id: String,
    label: &'static str,
    (min, max): (i64, i64),
    value: i64,
    valuetext: String,
    on_change: Callback<i64>,
) -> Html {
    let oninput = Callback::from(move |e: InputEvent| {
        let el: HtmlInputElement = e.target_unchecked_into();
        if let Ok(v) = el.value().parse::<i64>() {
            on_change.emit(v);
        }
    });
    html! {
        <div class="gm-control">
            <label for={id.clone()}>{ label }</label>
            <input type="range" id={id.clone()} min={min.to_string()} max={max.to_string()}
                step="1" value={value.to_string()}
                aria-valuemin={min.to_string()} aria-valuemax={max.to_string()}
                aria-valuenow={value.to_string()} aria-valuetext={valuetext.clone()}
                {oninput} />
            <output for={id} aria-hidden="true">{ valuetext }</output>
        </div>
    }
}

/// Positions per doubling on a [`count_slider`]'s track.
const PER_OCTAVE: f64 = 16.0;

/// A whole number on a log scale: dragging moves through 1, 2, 4, … evenly, while the arrow
/// keys step by one, so every number in the range can be reached (Page Up/Down double and
/// halve, Home/End jump to the ends).
pub fn count_slider(
    id: String,
    label: &'static str,
    (min, max): (u64, u64),
    value: u64,
    valuetext: String,
    on_change: Callback<u64>,
) -> Html {
    let (min, max) = (min.max(1), max.max(min.max(1)));
    let span = (max as f64 / min as f64).log2();
    let positions = (span * PER_OCTAVE).ceil().max(1.0) as i64;
    let at = ((value.clamp(min, max) as f64 / min as f64).log2() / span.max(1e-9)
        * positions as f64)
        .round() as i64;
    let oninput = {
        let cb = on_change.clone();
        Callback::from(move |e: InputEvent| {
            let el: HtmlInputElement = e.target_unchecked_into();
            if let Ok(i) = el.value().parse::<i64>() {
                let f = i.clamp(0, positions) as f64 / positions as f64;
                let v = (min as f64 * (span * f).exp2()).round() as u64;
                cb.emit(v.clamp(min, max));
            }
        })
    };
    // The value the keys step from: the last one sent (kept on the input, `data-sent`), so
    // that keys pressed faster than the page redraws each count.
    let onkeydown = Callback::from(move |e: KeyboardEvent| {
        let el: HtmlInputElement = e.target_unchecked_into();
        let value = el
            .get_attribute("data-sent")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(min);
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
        let _ = el.set_attribute("data-sent", &to.to_string());
        on_change.emit(to);
    });
    html! {
        <div class="gm-control">
            <label for={id.clone()}>{ label }</label>
            <input type="range" id={id.clone()} min="0" max={positions.to_string()}
                step="1" value={at.to_string()}
                aria-valuemin={min.to_string()} aria-valuemax={max.to_string()}
                aria-valuenow={value.to_string()} aria-valuetext={valuetext.clone()}
                data-sent={value.to_string()} {oninput} {onkeydown} />
            <output for={id} aria-hidden="true">{ valuetext }</output>
        </div>
    }
}

/// Pills as a WAI-ARIA radiogroup: Tab reaches the checked pill, arrows move and select,
/// Home/End jump, Space and Enter select the focused pill. `options` are (value, label).
pub fn radio_group(
    id: String,
    label: &'static str,
    options: Vec<(String, String)>,
    selected: String,
    on_change: Callback<String>,
) -> Html {
    let n = options.len();
    let checked = options.iter().position(|(v, _)| *v == selected);
    let label_id = format!("{id}-label");
    let values: std::rc::Rc<[String]> = options.iter().map(|(v, _)| v.clone()).collect();
    // One handler for the group: the pill is the event's target, its place its `data-i`.
    let pick = move |target: Option<web_sys::EventTarget>, key: Option<&str>| -> bool {
        use web_sys::wasm_bindgen::JsCast;
        let Some(el) = target.and_then(|t| t.dyn_into::<web_sys::Element>().ok()) else {
            return false;
        };
        let Some(i) = el
            .get_attribute("data-i")
            .and_then(|v| v.parse::<usize>().ok())
        else {
            return false;
        };
        let to = match key {
            None => i,
            Some("ArrowRight" | "ArrowDown") => (i + 1) % n,
            Some("ArrowLeft" | "ArrowUp") => (i + n - 1) % n,
            Some("Home") => 0,
            Some("End") => n - 1,
            Some(_) => return false,
        };
        if key.is_some() {
            if let Some(b) = el
                .parent_element()
                .and_then(|p| p.children().item(to as u32))
            {
                let _ = b.unchecked_into::<HtmlElement>().focus();
            }
        }
        if let Some(v) = values.get(to) {
            on_change.emit(v.clone());
        }
        true
    };
    let pick = std::rc::Rc::new(pick);
    let onclick = {
        let pick = pick.clone();
        Callback::from(move |e: MouseEvent| {
            pick(e.target(), None);
        })
    };
    let onkeydown = Callback::from(move |e: KeyboardEvent| {
        // The key is ours: not the browser's, nor the book's (mdBook turns the pages with
        // the arrow keys).
        if pick(e.target(), Some(e.key().as_str())) {
            e.prevent_default();
            e.stop_propagation();
        }
    });
    let pills = options.into_iter().enumerate().map(|(i, (_, text))| {
        let is_checked = Some(i) == checked;
        // Roving tabindex: the checked pill (or the first, when none is) takes Tab.
        let tab = if is_checked || (checked.is_none() && i == 0) {
            "0"
        } else {
            "-1"
        };
        html! {
            <button type="button" role="radio" class="gm-pill" data-i={i.to_string()}
                aria-checked={if is_checked { "true" } else { "false" }} tabindex={tab}>{ text }</button>
        }
    });
    html! {
        <div class="gm-control">
            <span class="gm-label" id={label_id.clone()}>{ label }</span>
            <div class="gm-pills" role="radiogroup" aria-labelledby={label_id} {onclick} {onkeydown}>{ for pills }</div>
        </div>
    }
}

/// A native `<select>` with its label. `options` are (value, label).
pub fn select(
    id: String,
    label: &'static str,
    options: Vec<(String, String)>,
    selected: String,
    on_change: Callback<String>,
) -> Html {
    let onchange = Callback::from(move |e: Event| {
        let el: HtmlSelectElement = e.target_unchecked_into();
        on_change.emit(el.value());
    });
    html! {
        <div class="gm-control">
            <label for={id.clone()}>{ label }</label>
            <select id={id} {onchange}>
                { for options.into_iter().map(|(v, t)| {
                    let sel = v == selected;
                    html! { <option value={v} selected={sel}>{ t }</option> }
                }) }
            </select>
        </div>
    }
}
