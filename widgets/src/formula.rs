//! `{{#gpumem formula QUANTITY}}`: below the typeset formula (KaTeX, at build time), the same
//! formula with the page's current numbers, ending in the engine's figure.

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::quantity;
use crate::Init;

/// A substitution with its `M_name` symbols as M with a subscript, as the formula writes them.
fn symbols(text: &str) -> Html {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("M_") {
        let name_len = rest[i + 2..]
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len() - i - 2);
        if name_len == 0 {
            out.push(html! { { rest[..i + 2].to_string() } });
            rest = &rest[i + 2..];
            continue;
        }
        out.push(html! { { rest[..i].to_string() } });
        let name = rest[i + 2..i + 2 + name_len].to_string();
        out.push(html! { <><var>{ "M" }</var><sub>{ name }</sub></> });
        rest = &rest[i + 2 + name_len..];
    }
    out.push(html! { { rest.to_string() } });
    out.into_iter().collect()
}

/// The formula widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_formula(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let q = init.option("quantity").unwrap_or("peak");
    let text = match k.scenario().and_then(|s| k.estimate().map(|e| (s, e))) {
        Ok((s, e)) => match quantity::substitute(&s, &e, q) {
            Some(t) => t,
            None => format!(
                "= {} (this scenario is outside the closed form; the figure is the engine's)",
                quantity::show(&e, q, "gib")
            ),
        },
        Err(e) => format!("Cannot estimate: {e}"),
    };
    html! {
        <div class="gm gm-formula" data-widget="formula" ref={root} role="group"
            aria-label={format!("{} with the current numbers", q.replace('_', " "))}>
            <p class="gm-subst" data-value="substitution" aria-live="polite">{ symbols(&text) }</p>
        </div>
    }
}
