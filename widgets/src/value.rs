//! `{{#gpumem value QUANTITY}}`: one live number inside a sentence.

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::quantity;
use crate::Init;

/// The value widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_value(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let q = init.option("quantity").unwrap_or("peak");
    let format = init.option("format").unwrap_or("gib");
    let text = match k.estimate() {
        Ok(e) => quantity::show(&e, q, format),
        Err(_) => "—".into(),
    };
    html! {
        <span class="gm-value" data-widget="value" data-quantity={q.to_string()} ref={root}>{ text }</span>
    }
}
