//! A ledger: the tensors behind a figure, one row each, from the engine's replay of the page's
//! scenario. `of=layer` lists what autograd saves in one decoder layer; `of=loss` every
//! tensor the LM head and the loss allocate (the fp32 upcast and its gradients among them).

use std::fmt::Write;

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::format::{count, escape_attr as esc, gib, signed, tokens, Sum};
use crate::Init;

fn mib(b: f64) -> String {
    if b >= 1073741824.0 {
        gib(b)
    } else if b >= 1048576.0 {
        format!("{} MiB", signed(b / 1048576.0, 1))
    } else {
        format!("{} KiB", signed(b / 1024.0, 1))
    }
}

/// The ledger widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_ledger(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let loss = init.option("of") == Some("loss");
    let sub = format!(
        "{} · b={} · s={}",
        k.model_name(),
        k.count("batch", 1),
        tokens(k.count("seq", 2048))
    );
    let rows = k.scenario().map_err(|e| e.to_string()).and_then(|s| {
        if loss {
            gpumem::ledger::loss(&s).map(|r| (r, 0))
        } else {
            gpumem::ledger::layer(&s)
        }
        .map_err(|e| e.to_string())
    });
    let (rows, layers) = match rows {
        Ok(r) => r,
        Err(e) => return crate::chart::refused("ledger", root, e),
    };
    let counted: Vec<f64> = rows
        .iter()
        .filter(|r| !loss || !r.backward)
        .map(|r| r.bytes)
        .collect();
    let total: f64 = counted.iter().sum();
    // The loss's rows (GiB each) add up to the sum under them as shown; a layer's figure,
    // multiplied by its layers, gives theirs as shown.
    let sum = if loss {
        Sum::for_parts(&counted, total)
    } else {
        Sum::times(total, layers as f64)
    };
    let title = if loss {
        "The logits, tensor by tensor"
    } else {
        "What autograd saves in one decoder layer"
    };
    let mut t = String::with_capacity(4096);
    let _ = write!(
        t,
        r#"<table class="gm-table" data-total="{}"><thead><tr>{}<th scope="col">Made by</th><th scope="col">{}</th><th scope="col">Shape</th><th scope="col">dtype</th><th scope="col" class="gm-num">Size</th></tr></thead><tbody>"#,
        gpumem::num::fixed(total, 0),
        if loss {
            r#"<th scope="col">Pass</th>"#
        } else {
            ""
        },
        if loss {
            "What it is"
        } else {
            "Kept for the backward of"
        }
    );
    for r in &rows {
        t.push_str("<tr>");
        if loss {
            let _ = write!(
                t,
                r#"<td data-label="Pass">{}</td>"#,
                if r.backward { "backward" } else { "forward" }
            );
        }
        let shape = if r.shape.0.is_empty() {
            "—".to_string()
        } else {
            format!("{}<br>{}", r.shape.0, r.shape.1)
        };
        let _ = write!(
            t,
            r#"<th scope="row">{}</th><td>{}</td><td data-label="Shape">{shape}</td><td data-label="dtype">{}</td><td class="gm-num" data-label="Size"><span class="gm-swatch gm-c-{}" aria-hidden="true"></span> {}</td></tr>"#,
            esc(r.op),
            esc(&r.role),
            r.dtype.map_or("", |d| d.name()),
            crate::parts::of_component(r.cat.key()).key,
            if loss && r.bytes >= 1073741824.0 {
                sum.gib(r.bytes)
            } else {
                mib(r.bytes)
            }
        );
    }
    t.push_str("</tbody></table>");
    let foot = if loss && rows.is_empty() {
        "This loss keeps no logits: a fused loss computes them a chunk of tokens at a time inside one op.".to_string()
    } else if loss {
        format!(
            "The forward's tensors add up to {}{}; the backward's gradients come while the forward's are still alive, which is why the peak so often falls in the loss's backward.",
            if sum.eq() == "=" { "" } else { "about " },
            sum.gib(total)
        )
    } else {
        format!(
            "One layer keeps {} for its backward; the {} layers of this kind, {}.",
            sum.gib(total),
            count(layers),
            gib(total * layers as f64)
        )
    };
    html! {
        <figure class="gm gm-ledger" data-widget="ledger" ref={root} aria-labelledby={init.id("title")}>
            <figcaption class="gm-head" id={init.id("title")}>
                <span class="gm-title">{ title }</span>
                <span class="gm-sub">{ sub }</span>
            </figcaption>
            <div class="gm-scroll">{ Html::from_html_unchecked(t.into()) }</div>
            <p class="gm-note" aria-live="polite">{ foot }</p>
        </figure>
    }
}
