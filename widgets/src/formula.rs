//! `{{#gpumem formula QUANTITY}}`: below the typeset formula (KaTeX, at build time), the same
//! formula with the page's current numbers, ending in the engine's figure.

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::quantity;
use crate::Init;

#[component]
pub fn Formula(init: &Init) -> Html {
    let (k, _) = use_knobs(init);
    let root = use_live_marker();
    let q = init.option("quantity").unwrap_or("peak");
    let text = match k
        .scenario()
        .and_then(|s| gpumem::estimate(&s).map(|e| (s, e)))
    {
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
            <p class="gm-subst" data-value="substitution" aria-live="polite">{ text }</p>
        </div>
    }
}
