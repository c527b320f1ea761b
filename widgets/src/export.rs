//! The toolbar's actions: a permalink to the page's current state, and the chart as a file
//! that stands alone (a title, the legend, the scenario and the theme's colours in it).
//! Natively (the book build) there is nothing to do.

use yew::Callback;

use crate::chart::Status;

#[cfg(not(target_arch = "wasm32"))]
pub fn run(_what: &str, _e: &yew::MouseEvent, _name: &str, _settings: &str, _s: Callback<Status>) {}

#[cfg(target_arch = "wasm32")]
pub fn run(what: &str, e: &yew::MouseEvent, name: &str, settings: &str, status: Callback<Status>) {
    use wasm_bindgen::JsCast;
    let say = |m: &str| Status {
        message: m.to_string(),
        link: None,
    };
    let Some(figure) = e
        .target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .and_then(|el| el.closest("figure").ok().flatten())
    else {
        return;
    };
    match what {
        "link" => copy_link(&figure, status),
        _ => status.emit(match figure.query_selector("svg.gm-chart").ok().flatten() {
            Some(svg) => match save(&figure, &svg, what, name, settings) {
                Ok(()) => say(&format!("Saved {name}.{what}")),
                Err(_) => say("Could not save the chart"),
            },
            None => say("This widget has no chart to save"),
        }),
    }
}

/// The page's URL, which carries the page's knobs (see `store::url`), to the clipboard. The
/// clipboard answers later; until it does the toolbar says so, and if it refuses, the link
/// is shown to copy by hand.
#[cfg(target_arch = "wasm32")]
fn copy_link(figure: &web_sys::Element, status: Callback<Status>) {
    use wasm_bindgen::prelude::*;
    let Some(w) = web_sys::window() else {
        return;
    };
    crate::store::url::flush();
    let mut href = w.location().href().unwrap_or_default();
    // To the widget's section: the last heading with an id before the widget's block.
    let mut block = figure.clone();
    while let Some(p) = block.parent_element() {
        if p.tag_name() == "MAIN" {
            break;
        }
        block = p;
    }
    let mut at = block.previous_element_sibling();
    while let Some(el) = at {
        if matches!(el.tag_name().as_str(), "H1" | "H2" | "H3") && !el.id().is_empty() {
            href.truncate(href.find('#').unwrap_or(href.len()));
            href.push('#');
            href.push_str(&el.id());
            break;
        }
        at = el.previous_element_sibling();
    }
    let refused = {
        let (status, href) = (status.clone(), href.clone());
        move |why: &str| {
            status.emit(Status {
                message: format!("Not copied ({why}). The link:"),
                link: Some(href.clone()),
            })
        }
    };
    // `navigator.clipboard` is absent outside secure contexts.
    let nav = w.navigator();
    let has = js_sys::Reflect::get(&nav, &JsValue::from_str("clipboard"))
        .map(|c| !c.is_undefined() && !c.is_null())
        .unwrap_or(false);
    if !has {
        refused("this page may not use the clipboard");
        return;
    }
    status.emit(Status {
        message: "Copying the link…".into(),
        link: None,
    });
    let ok = {
        let (status, href) = (status.clone(), href.clone());
        Closure::once(move |_: JsValue| {
            status.emit(Status {
                message: format!("Link copied: {href}"),
                link: None,
            })
        })
    };
    let err = Closure::once(move |_: JsValue| refused("the browser refused the clipboard"));
    let _ = nav.clipboard().write_text(&href).then2(&ok, &err);
    ok.forget();
    err.forget();
}

/// Properties copied from the computed style onto each exported element: the theme's CSS
/// variables do not travel with the file.
#[cfg(target_arch = "wasm32")]
const STYLE: &[&str] = &[
    "fill",
    "fill-opacity",
    "stroke",
    "stroke-width",
    "stroke-dasharray",
    "stroke-linejoin",
    "stroke-opacity",
    "paint-order",
    "font-family",
    "font-size",
    "font-weight",
    "opacity",
];

/// The chart as a standalone SVG (or a PNG of it, through an image and a canvas at twice the
/// size): the figure's title, the chart with its computed styles inlined (dashes included),
/// the legend, the scenario, on an opaque background in the theme's colours.
#[cfg(target_arch = "wasm32")]
fn save(
    figure: &web_sys::Element,
    svg: &web_sys::Element,
    what: &str,
    name: &str,
    settings: &str,
) -> Result<(), wasm_bindgen::JsValue> {
    use gpumem::num::fixed;
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
    let w = web_sys::window().ok_or(JsValue::NULL)?;
    let doc = w.document().ok_or(JsValue::NULL)?;
    let style = |el: &web_sys::Element, prop: &str| -> String {
        w.get_computed_style(el)
            .ok()
            .flatten()
            .and_then(|s| s.get_property_value(prop).ok())
            .unwrap_or_default()
    };
    let clone = svg
        .clone_node_with_deep(true)?
        .dyn_into::<web_sys::Element>()?;
    let src = svg.query_selector_all("*")?;
    let dst = clone.query_selector_all("*")?;
    for i in 0..src.length() {
        let (Some(a), Some(b)) = (src.item(i), dst.item(i)) else {
            continue;
        };
        let (Ok(a), Ok(b)) = (
            a.dyn_into::<web_sys::Element>(),
            b.dyn_into::<web_sys::Element>(),
        ) else {
            continue;
        };
        for prop in STYLE {
            let v = style(&a, prop);
            if !v.is_empty() && v != "none" || *prop == "fill" || *prop == "stroke" {
                b.set_attribute(prop, &v)?;
            }
        }
    }
    // Opaque: the figure's background, or the page's where the figure has none.
    let mut bg = style(figure, "background-color");
    if bg.is_empty() || bg.contains("rgba(0, 0, 0, 0)") || bg == "transparent" {
        bg = doc
            .body()
            .map(|b| style(&b, "background-color"))
            .unwrap_or_else(|| "#ffffff".into());
    }
    let fg = style(figure, "color");
    let text = |sel: &str| -> String {
        figure
            .query_selector(sel)
            .ok()
            .flatten()
            .and_then(|e| e.text_content())
            .unwrap_or_default()
    };
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let view = svg.get_attribute("viewBox").unwrap_or_default();
    let dims: Vec<f64> = view
        .split_whitespace()
        .filter_map(gpumem::num::parse_f64)
        .collect();
    let (cw, ch) = (
        dims.get(2).copied().unwrap_or(640.0),
        dims.get(3).copied().unwrap_or(300.0),
    );
    let pad = 16.0;
    let width = cw + 2.0 * pad;
    // The legend: a swatch in the slice's colour, the name and the figure.
    let mut legend = String::new();
    let items = figure.query_selector_all(".gm-legend li")?;
    let cols = ((width - 2.0 * pad) / 210.0).floor().max(1.0) as u32;
    let top = pad + 40.0 + ch + 10.0;
    for i in 0..items.length() {
        let Some(li) = items
            .item(i)
            .and_then(|n| n.dyn_into::<web_sys::Element>().ok())
        else {
            continue;
        };
        let swatch = li
            .query_selector(".gm-swatch")
            .ok()
            .flatten()
            .map(|s| style(&s, "background-color"))
            .unwrap_or_default();
        let label = [".gm-name", ".gm-num"]
            .iter()
            .filter_map(|s| li.query_selector(s).ok().flatten())
            .filter_map(|e| e.text_content())
            .collect::<Vec<_>>()
            .join(" ");
        let (x, y) = (
            pad + (i % cols) as f64 * 210.0,
            top + (i / cols) as f64 * 18.0,
        );
        legend.push_str(&format!(
            "<rect x=\"{}\" y=\"{}\" width=\"11\" height=\"11\" fill=\"{swatch}\"/>\
             <text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"{fg}\">{}</text>",
            fixed(x, 1),
            fixed(y, 1),
            fixed(x + 16.0, 1),
            fixed(y + 10.0, 1),
            esc(&label)
        ));
    }
    let rows = items.length().div_ceil(cols) as f64;
    // The chart's own note, when it has one ("▲ beyond the chart: …"): the file is not
    // read beside the page.
    let note = text("svg.gm-chart + .gm-note");
    let foot = top + rows * 18.0 + if note.is_empty() { 12.0 } else { 28.0 };
    let height = foot + 18.0 + pad;
    let href = w.location().href().unwrap_or_default();
    let chart = web_sys::XmlSerializer::new()?.serialize_to_string(&clone)?;
    // The chart nested at its own size: its viewBox maps to as many pixels.
    let chart = chart.replacen(
        "<svg",
        &format!(
            "<svg x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"",
            fixed(pad, 1),
            fixed(pad + 40.0, 1),
            fixed(cw, 1),
            fixed(ch, 1)
        ),
        1,
    );
    let file = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w_}\" height=\"{h_}\" viewBox=\"0 0 {w_} {h_}\" \
         font-family=\"{font}\">\
         <rect width=\"100%\" height=\"100%\" fill=\"{bg}\"/>\
         <text x=\"{px}\" y=\"{t1}\" font-size=\"15\" font-weight=\"600\" fill=\"{fg}\">{title}</text>\
         <text x=\"{px}\" y=\"{t2}\" font-size=\"12\" fill=\"{fg}\">{sub}</text>\
         {chart}{legend}\
         <text x=\"{px}\" y=\"{f0}\" font-size=\"11\" fill=\"{fg}\">{note}</text>\
         <text x=\"{px}\" y=\"{f1}\" font-size=\"11\" fill=\"{fg}\">{settings}</text>\
         <text x=\"{px}\" y=\"{f2}\" font-size=\"11\" fill=\"{fg}\">{source}</text></svg>",
        px = fixed(pad, 1),
        w_ = fixed(width, 0),
        h_ = fixed(height, 0),
        font = esc(&style(figure, "font-family")).replace('"', "'"),
        t1 = fixed(pad + 14.0, 1),
        t2 = fixed(pad + 32.0, 1),
        title = esc(&text(".gm-title")),
        sub = esc(&text(".gm-sub")),
        f0 = fixed(foot - 16.0, 1),
        note = esc(&note),
        f1 = fixed(foot, 1),
        f2 = fixed(foot + 16.0, 1),
        settings = esc(settings),
        source = esc(&format!("gpumem · {href}")),
    );
    let url = format!(
        "data:image/svg+xml;charset=utf-8,{}",
        String::from(js_sys::encode_uri_component(&file))
    );
    let download = move |href: &str, ext: &str| -> Result<(), JsValue> {
        let doc = web_sys::window()
            .and_then(|w| w.document())
            .ok_or(JsValue::NULL)?;
        let a = doc
            .create_element("a")?
            .dyn_into::<web_sys::HtmlAnchorElement>()?;
        a.set_href(href);
        a.set_download(&format!("{name}.{ext}"));
        a.click();
        Ok(())
    };
    if what == "svg" {
        return download(&url, "svg");
    }
    let (pw, ph) = (width * 2.0, height * 2.0);
    let img = web_sys::HtmlImageElement::new()?;
    let canvas = doc
        .create_element("canvas")?
        .dyn_into::<web_sys::HtmlCanvasElement>()?;
    canvas.set_width(pw as u32);
    canvas.set_height(ph as u32);
    let img2 = img.clone();
    let name = name.to_string();
    let onload = Closure::once(move || {
        let Ok(Some(ctx)) = canvas.get_context("2d") else {
            return;
        };
        let Ok(ctx) = ctx.dyn_into::<web_sys::CanvasRenderingContext2d>() else {
            return;
        };
        let _ = ctx.draw_image_with_html_image_element_and_dw_and_dh(&img2, 0.0, 0.0, pw, ph);
        if let Ok(png) = canvas.to_data_url_with_type("image/png") {
            if let Some(doc) = web_sys::window().and_then(|w| w.document()) {
                if let Ok(a) = doc.create_element("a").and_then(|a| {
                    a.dyn_into::<web_sys::HtmlAnchorElement>()
                        .map_err(Into::into)
                }) {
                    a.set_href(&png);
                    a.set_download(&format!("{name}.png"));
                    a.click();
                }
            }
        }
    });
    img.set_onload(Some(onload.as_ref().unchecked_ref()));
    onload.forget();
    img.set_src(&url);
    Ok(())
}
