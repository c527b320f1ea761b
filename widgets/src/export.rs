//! The toolbar's actions: a permalink to the page's current state, and the chart as a file.
//! Natively (the book build) there is nothing to do.

#[cfg(not(target_arch = "wasm32"))]
pub fn run(_what: &str, _e: &yew::MouseEvent, _name: &str) -> String {
    String::new()
}

#[cfg(target_arch = "wasm32")]
pub fn run(what: &str, e: &yew::MouseEvent, name: &str) -> String {
    use wasm_bindgen::JsCast;
    let Some(figure) = e
        .target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .and_then(|el| el.closest("figure").ok().flatten())
    else {
        return String::new();
    };
    match what {
        "link" => copy_link(),
        _ => match figure.query_selector("svg.gm-chart").ok().flatten() {
            Some(svg) => match save(&svg, what, name) {
                Ok(()) => format!("Saved {name}.{what}"),
                Err(_) => "Could not save the chart".into(),
            },
            None => "This widget has no chart to save".into(),
        },
    }
}

/// The page's URL, which carries the page's knobs (see `store::url`), to the clipboard.
#[cfg(target_arch = "wasm32")]
fn copy_link() -> String {
    let Some(w) = web_sys::window() else {
        return String::new();
    };
    let href = w.location().href().unwrap_or_default();
    let clip = w.navigator().clipboard();
    let _ = clip.write_text(&href);
    format!("Link copied: {href}")
}

/// Serialise the chart with its computed colours inlined (the theme's CSS variables do not
/// travel with the file); PNG goes through an image and a canvas at twice the size.
#[cfg(target_arch = "wasm32")]
fn save(svg: &web_sys::Element, what: &str, name: &str) -> Result<(), wasm_bindgen::JsValue> {
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::JsCast;
    let w = web_sys::window().ok_or(JsValue::NULL)?;
    let doc = w.document().ok_or(JsValue::NULL)?;
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
        if let Some(style) = w.get_computed_style(&a)? {
            for prop in ["fill", "stroke", "font-family", "font-size", "opacity"] {
                let v = style.get_property_value(prop)?;
                if !v.is_empty() {
                    b.set_attribute(prop, &v)?;
                }
            }
        }
    }
    clone.set_attribute("xmlns", "http://www.w3.org/2000/svg")?;
    let text = web_sys::XmlSerializer::new()?.serialize_to_string(&clone)?;
    let url = format!(
        "data:image/svg+xml;charset=utf-8,{}",
        String::from(js_sys::encode_uri_component(&text))
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
    let rect = svg.get_bounding_client_rect();
    let (width, height) = (rect.width().max(1.0) * 2.0, rect.height().max(1.0) * 2.0);
    let img = web_sys::HtmlImageElement::new()?;
    let canvas = doc
        .create_element("canvas")?
        .dyn_into::<web_sys::HtmlCanvasElement>()?;
    canvas.set_width(width as u32);
    canvas.set_height(height as u32);
    let img2 = img.clone();
    let name = name.to_string();
    let onload = Closure::once(move || {
        let Ok(Some(ctx)) = canvas.get_context("2d") else {
            return;
        };
        let Ok(ctx) = ctx.dyn_into::<web_sys::CanvasRenderingContext2d>() else {
            return;
        };
        let _ =
            ctx.draw_image_with_html_image_element_and_dw_and_dh(&img2, 0.0, 0.0, width, height);
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
