//! Memory through one step, op by op: allocated memory after every allocation and free the
//! engine replays, stacked by part, with the capacity and the peak named; below it the ops
//! around the peak one by one. Every column and every op can be focused (arrow keys move
//! along) or hovered, and names its op and tensor.

use gpumem::timeline::{OpPoint, OpTimeline};
use gpumem::Estimate;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use std::fmt::Write;

use crate::chart::{
    el, fit, n, refused, settings, text_width, tick_label, ticks, use_toolbar, use_width,
};
use crate::format::{delta, escape_attr as esc, gib, tokens};
use crate::parts::{self, PARTS};
use crate::{Init, Knobs};

const H: f64 = 236.0;
const TOP: f64 = 22.0;
const BOTTOM: f64 = 196.0;
const DH: f64 = 170.0;
const DTOP: f64 = 12.0;
const DBOTTOM: f64 = 150.0;
/// Width of one column of the whole step, in px.
const COLUMN: f64 = 6.0;
/// Ops shown around the peak: before it, and after it.
const BEFORE: usize = 27;
const AFTER: usize = 12;

/// What the caption says of the model states: what is resident through the step, and where
/// the gradients are at the peak (the same bookkeeping as every chart).
pub fn states_note(e: &Estimate) -> String {
    let peak = format!("Peak {} during {}.", gib(e.peak_bytes as f64), e.peak_phase);
    if e.trainable_params == 0 {
        return format!(
            "{peak} The weights take {}; the KV cache reaches {}.",
            gib(e.weights_bytes as f64),
            gib(e.kv_cache_bytes as f64)
        );
    }
    let resident = (e.weights_bytes + e.master_weights_bytes + e.optimizer_states_bytes) as f64;
    let g_peak = e.components.get("gradients").copied().unwrap_or(0);
    let grads = if e.gradients_bytes == 0 {
        String::new()
    } else if g_peak == 0 {
        format!(
            "; the gradients ({}) are not allocated yet at the peak",
            gib(e.gradients_bytes as f64)
        )
    } else if g_peak >= e.gradients_bytes {
        format!(
            "; the gradients ({}) are all alive at the peak",
            gib(e.gradients_bytes as f64)
        )
    } else {
        format!(
            "; of the gradients ({}), {} are alive at the peak",
            gib(e.gradients_bytes as f64),
            gib(g_peak as f64)
        )
    };
    let names = if e.master_weights_bytes > 0 {
        "the weights, master weights and optimizer states"
    } else {
        "the weights and optimizer states"
    };
    format!(
        "{peak} Through the step {names} stay resident, {}{grads}.",
        gib(resident)
    )
}

/// Where a point is, in words: "backward: layer 30", "forward: layers 2–9" for a
/// summarised run (lowest first, though the backward meets them from the top).
fn place(p: &OpPoint) -> String {
    let at = p.at;
    let w = at.words_of(p.of);
    if p.span > 1 && at.phase.numbered() && at.index > 0 && at.micro_batch == 0 {
        let (a, n) = (u64::from(at.layer(p.of)), p.span - 1);
        let (lo, hi) = if at.backward() && p.of > 0 {
            (a.saturating_sub(n), a)
        } else {
            (a, a + n)
        };
        let w = w.trim_end_matches(|c: char| c.is_ascii_digit());
        format!("{}{lo}–{hi}", w.replacen(" layer", " layers", 1))
    } else if p.span > 1 {
        format!("{w} (and the next {}, alike)", p.span - 1)
    } else {
        w
    }
}

/// A point named as its title says it: where, the op, the tensor, its dtype, the change and
/// what is allocated then.
pub fn label(p: &OpPoint) -> String {
    let mut s = place(p);
    if p.span > 1 {
        s.push_str(" · highest point");
    }
    if !p.at.what.is_empty() {
        s.push_str(" · ");
        s.push_str(p.at.what);
    }
    let tensor = match (p.tensor, p.role) {
        ("", "") => String::new(),
        ("", r) => r.to_string(),
        (t, "") => t.to_string(),
        // A gradient is named after the tensor it is for (what `t` made), the same at both
        // ends: made as the gradient of one op's input, freed as that of its maker's output.
        (t, r) if r.starts_with("grad of") => format!("grad of {t}"),
        (t, r) if t == p.at.what => format!("output, {r}"),
        (t, r) => format!("{t}: {r}"),
    };
    if !tensor.is_empty() {
        s.push_str(" · ");
        s.push_str(&tensor);
    }
    if let Some(d) = p.dtype {
        s.push_str(" · ");
        s.push_str(d.name());
    }
    if p.bytes != 0.0 {
        s.push_str(" · ");
        s.push_str(&delta(p.bytes));
    }
    s.push_str(&format!(" → {} allocated", gib(p.total())));
    s
}

/// The parts a column stacks: every one of [`PARTS`].
const NPARTS: usize = PARTS.len();

/// Where each of the engine's categories stacks: its part's place in [`PARTS`].
fn part_index() -> [usize; gpumem::mem::NCAT] {
    gpumem::mem::Cat::ALL.map(|c| {
        let part = parts::of_component(c.key());
        PARTS
            .iter()
            .position(|x| x.key == part.key)
            .unwrap_or(0)
            .min(NPARTS - 1)
    })
}

/// Each part's bytes in a point, in stacking order (negative leftovers count as empty).
fn stack(p: &OpPoint, idx: &[usize; gpumem::mem::NCAT]) -> [f64; NPARTS] {
    let mut v = [0.0; NPARTS];
    for (c, &i) in idx.iter().enumerate() {
        v[i] += p.live.0[c].max(0.0);
    }
    v
}

/// Columns of the whole step: the points cut into `cols` runs, each shown by its highest
/// point (the peak's column by the peak).
fn columns(t: &OpTimeline, cols: usize) -> Vec<usize> {
    let n = t.points.len();
    let cols = cols.clamp(1, n.max(1));
    (0..cols)
        .map(|c| {
            let (a, b) = bin(c, cols, n);
            if (a..b).contains(&t.peak) {
                return t.peak;
            }
            (a..b.min(n))
                .max_by(|&i, &j| {
                    t.points[i]
                        .total()
                        .total_cmp(&t.points[j].total())
                        .then(j.cmp(&i))
                })
                .unwrap_or(a)
        })
        .collect()
}

/// The points column `c` of `cols` stands for, of `n`: `a..b` (at least one).
fn bin(c: usize, cols: usize, n: usize) -> (usize, usize) {
    (c * n / cols, ((c + 1) * n / cols).max(c * n / cols + 1))
}

/// The step's phases along the columns: (first column, last column, name).
fn phases(t: &OpTimeline, cols: &[usize]) -> Vec<(usize, usize, &'static str)> {
    use gpumem::mem::Phase as P;
    let name = |p: &OpPoint| match p.at.phase {
        P::Start => "",
        P::OptimizerStep => "optimizer",
        P::Decode => "decode",
        P::PrefillEmbedding | P::Prefill | P::PrefillMoe | P::PrefillHead => "prefill",
        ph if gpumem::timeline::forward_phase(ph) => "forward",
        _ => "backward",
    };
    let mut v: Vec<(usize, usize, &'static str)> = Vec::new();
    for (c, &i) in cols.iter().enumerate() {
        let nm = name(&t.points[i]);
        match v.last_mut() {
            Some(l) if l.2 == nm || nm.is_empty() => l.1 = c,
            _ => v.push((c, c, nm)),
        }
    }
    v
}

/// A step line through `ys` (one value per column `cw` wide from `x0`), as polygon points:
/// a corner only where the value changes.
fn steps(ys: &[f64], x0: f64, cw: f64, out: &mut Vec<(f64, f64)>) {
    for (c, &v) in ys.iter().enumerate() {
        if c == 0 || v != ys[c - 1] {
            let x = x0 + cw * c as f64;
            if c > 0 {
                out.push((x, ys[c - 1]));
            }
            out.push((x, v));
        }
    }
    if let Some(&v) = ys.last() {
        out.push((x0 + cw * ys.len() as f64, v));
    }
}

/// `x` to a tenth of a pixel, written with integer formatting (thousands of coordinates are
/// written on every redraw).
fn coord(out: &mut String, x: f64) {
    let t = (x * 10.0).round() as i64;
    if t < 0 {
        out.push('-');
    }
    let t = t.unsigned_abs();
    let _ = write!(out, "{}", t / 10);
    if !t.is_multiple_of(10) {
        out.push('.');
        out.push((b'0' + (t % 10) as u8) as char);
    }
}

/// The columns to hover or focus, one for each of the points `ps`, from `x0`, `cw` wide,
/// from `y`, `h` high, each titled with its point, the peak's in the tab order (`ops`: the ops
/// around the peak). The columns keep their place from one redraw to the next: a redraw
/// changes their titles, not the elements.
fn columns_to_hover(
    t: &OpTimeline,
    ps: &[usize],
    (x0, cw, y, h): (f64, f64, f64, f64),
    ops: bool,
) -> Html {
    let (wa, ya, ha): (AttrValue, AttrValue, AttrValue) = (n(cw).into(), n(y).into(), n(h).into());
    let mut v = Vec::new();
    let n_pts = t.points.len();
    for (j, &i) in ps.iter().enumerate() {
        let peak = i == t.peak;
        // A column of the whole step stands for a stretch of points ([`columns`]): its title
        // names its highest, then the stretch when it spans more than that one.
        let mut title = label(&t.points[i]);
        if !ops {
            let (a, b) = bin(j, ps.len(), n_pts);
            let (first, last) = (place(&t.points[a]), place(&t.points[b.min(n_pts) - 1]));
            if first != last {
                let _ = write!(title, " · the highest from {first} to {last}");
            }
        }
        let class = match (ops, peak) {
            (false, _) => "gm-hit",
            (true, false) => "gm-hit gm-op",
            (true, true) => "gm-hit gm-op gm-peak-op",
        };
        v.push(el(
            "rect",
            &["class", "x", "y", "width", "height", "tabindex", "data-i"],
            vec![
                class.into(),
                n(x0 + cw * j as f64).into(),
                ya.clone(),
                wa.clone(),
                ha.clone(),
                (if peak { "0" } else { "-1" }).into(),
                j.to_string().into(),
            ],
            el("title", &[], Vec::new(), title.into()),
        ));
    }
    yew::virtual_dom::VList::with_children(v, None).into()
}

/// The stacked areas of `pts` (x from `x0`, `cw` wide each), one polygon per part, as SVG.
fn areas(out: &mut String, stacks: &[[f64; NPARTS]], x0: f64, cw: f64, y: &dyn Fn(f64) -> f64) {
    let mut below = vec![0.0; stacks.len()];
    for (i, part) in PARTS.iter().enumerate() {
        if !stacks.iter().any(|s| s[i] > 0.0) {
            continue;
        }
        let lo: Vec<f64> = below.iter().map(|&b| y(b)).collect();
        for (b, s) in below.iter_mut().zip(stacks) {
            *b += s[i];
        }
        let hi: Vec<f64> = below.iter().map(|&b| y(b)).collect();
        let mut pts = Vec::with_capacity(hi.len());
        steps(&hi, x0, cw, &mut pts);
        let mut back = Vec::with_capacity(lo.len());
        steps(&lo, x0, cw, &mut back);
        pts.extend(back.into_iter().rev());
        let _ = write!(out, r#"<polygon class="gm-f-{}" points=""#, part.key);
        for (x, y) in pts {
            coord(out, x);
            out.push(',');
            coord(out, y);
            out.push(' ');
        }
        let _ = write!(out, r#""><title>{}</title></polygon>"#, part.label);
    }
}

/// Grid lines with their labels, as SVG.
fn grid(out: &mut String, ticks: &[f64], left: f64, right: f64, y: &dyn Fn(f64) -> f64) {
    for &t in ticks {
        let yy = n(y(t));
        let _ = write!(
            out,
            r#"<g class="gm-tick"><line class="gm-grid" x1="{}" x2="{}" y1="{yy}" y2="{yy}"></line><text x="{}" y="{}" text-anchor="end">{}</text></g>"#,
            n(left),
            n(right),
            n(left - 6.0),
            n(y(t) + 4.0),
            tick_label(t)
        );
    }
}

/// An SVG text, its content escaped.
fn text(out: &mut String, class: &str, x: f64, y: f64, anchor: &str, t: &str) {
    let _ = write!(
        out,
        r#"<text class="{class}" x="{}" y="{}" text-anchor="{anchor}">{}</text>"#,
        n(x),
        n(y),
        esc(t)
    );
}

/// Arrow keys, Home and End move the focus along a chart's columns (`[data-i]`, `last` the
/// last's).
fn roving(e: KeyboardEvent, last: usize) {
    let Some(el) = e.target_dyn_into::<web_sys::Element>() else {
        return;
    };
    let Some(i) = el
        .get_attribute("data-i")
        .and_then(|v| v.parse::<usize>().ok())
    else {
        return;
    };
    let to = match e.key().as_str() {
        "ArrowRight" | "ArrowDown" => (i + 1).min(last),
        "ArrowLeft" | "ArrowUp" => i.saturating_sub(1),
        "Home" => 0,
        "End" => last,
        _ => return,
    };
    e.prevent_default();
    e.stop_propagation();
    if let Some(next) = el.parent_element().and_then(|p| {
        p.query_selector(&format!("[data-i=\"{to}\"]"))
            .ok()
            .flatten()
    }) {
        // An SVG element has `focus()` as an HTML element does (`HTMLOrSVGElement`).
        use web_sys::wasm_bindgen::JsCast;
        let _ = next.unchecked_into::<web_sys::HtmlElement>().focus();
    }
}

/// What a hovered or focused column says: its title (a column takes the focus; nothing
/// else in the charts does).
fn title_of(t: Option<web_sys::EventTarget>) -> Option<String> {
    use web_sys::wasm_bindgen::JsCast;
    let el = t?.dyn_into::<web_sys::Element>().ok()?;
    el.get_attribute("tabindex")?;
    // A column's only child is its title.
    el.text_content()
}

/// The timeline widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_timeline(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let (svg_ref, w) = use_width();
    // What the readout says of the point hovered or focused, for the knobs it was drawn for
    // (the peak until then, and again once the page changes).
    let shown = use_state(|| None::<(Knobs, String)>);
    let toolbar = use_toolbar(init, settings(&k));
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let e = match k.estimate() {
        Ok(e) => e,
        Err(err) => return refused("timeline", root, err),
    };
    let tl = k.timeline();
    let head = html! {
        <figcaption class="gm-head" id={title_id.clone()}>
            <span class="gm-title">{ "Memory through one step, op by op" }</span>
            <span class="gm-sub">{ format!("{} · b={} · s={}", e.model, k.count("batch", 1), tokens(k.count("seq", 2048))) }</span>
        </figcaption>
    };
    let note = states_note(&e);
    let t = match tl.as_ref() {
        Ok(t) if !t.points.is_empty() => t,
        Ok(_) | Err(_) => {
            let why = match tl.as_ref() {
                Err(err) => err.message.clone(),
                Ok(_) => String::new(),
            };
            return html! {
                <figure class="gm gm-timeline" data-widget="timeline" ref={root} aria-labelledby={title_id.clone()}>
                    { head }
                    <p class="gm-note" data-value="peak">{ note }</p>
                    <p class="gm-note">{ why }</p>
                </figure>
            };
        }
    };
    let show = {
        let (shown, k) = (shown.clone(), k.clone());
        std::rc::Rc::new(move |target: Option<web_sys::EventTarget>| {
            if let Some(text) = title_of(target) {
                shown.set(Some((k.clone(), text)));
            }
        })
    };
    let on_over = {
        let show = show.clone();
        Callback::from(move |e: MouseEvent| show(e.target()))
    };
    let on_focus = Callback::from(move |e: FocusEvent| show(e.target()));
    let peak = &t.points[t.peak];
    let cap = e.capacity_bytes as f64;
    let top = peak.total();
    let tk = ticks(top.max(cap * 0.25));
    let ymax = *tk.last().unwrap_or(&top);
    let narrow = w < 480.0;
    let (l, r) = if narrow { (52.0, 10.0) } else { (64.0, 14.0) };
    let y = |b: f64| BOTTOM - (BOTTOM - TOP) * (b / ymax.max(1.0)).min(1.05);
    // Columns 6 px wide: each carries its op's name and tensor (its <title>), and a redraw
    // parses them all again (at 3 px the budget page's timeline was 78 KB of markup); the
    // peak's neighbourhood is drawn op by op below.
    let cols = columns(t, ((w - l - r) / COLUMN).floor().max(1.0) as usize);
    let cw = (w - l - r) / cols.len() as f64;
    let peak_col = cols.iter().position(|&i| i == t.peak).unwrap_or(0);
    let px = l + cw * (peak_col as f64 + 0.5);
    let idx = part_index();
    let stacks: Vec<[f64; NPARTS]> = cols.iter().map(|&i| stack(&t.points[i], &idx)).collect();
    let legend: Vec<&'static str> = PARTS
        .iter()
        .enumerate()
        .filter(|(q, _)| stacks.iter().any(|s| s[*q] > 0.0))
        .map(|(_, p)| p.key)
        .collect();
    // The whole step.
    let mut svg = String::with_capacity(32 << 10);
    grid(&mut svg, &tk, l, w - r, &y);
    areas(&mut svg, &stacks, l, cw, &y);
    if cap <= ymax * 1.05 {
        let yc = n(y(cap));
        let _ = write!(
            svg,
            r#"<line class="gm-capline" x1="{}" x2="{}" y1="{yc}" y2="{yc}"></line>"#,
            n(l),
            n(w - r)
        );
        text(
            &mut svg,
            "gm-caplabel gm-halo",
            w - r,
            y(cap) - 4.0,
            "end",
            &format!("{} {}", e.gpu, gib(cap)),
        );
    }
    let _ = write!(
        svg,
        r#"<line class="gm-peakline" x1="{p}" x2="{p}" y1="{}" y2="{}"></line>"#,
        n(y(top)),
        n(BOTTOM),
        p = n(px)
    );
    let peak_text = format!("peak {}", gib(top));
    let anchor = if px + text_width(&peak_text) / 2.0 > w - r {
        "end"
    } else if px - text_width(&peak_text) / 2.0 < l {
        "start"
    } else {
        "middle"
    };
    // Drawn after the columns' focus targets, so that a focused column's outline does not
    // cross it.
    let mut peak_label = String::new();
    text(
        &mut peak_label,
        "gm-peaklabel gm-halo",
        px,
        (y(top) - 6.0).max(10.0),
        anchor,
        &peak_text,
    );
    for (c0, c1, name) in phases(t, &cols) {
        let (xa, xb) = (l + cw * c0 as f64, l + cw * (c1 + 1) as f64);
        let _ = write!(
            svg,
            r#"<line class="gm-tick-sep" x1="{x}" x2="{x}" y1="{}" y2="{}"></line>"#,
            n(BOTTOM),
            n(BOTTOM + 6.0),
            x = n(xa)
        );
        text(
            &mut svg,
            "gm-phase",
            (xa + xb) / 2.0,
            BOTTOM + 16.0,
            "middle",
            &fit(name, xb - xa - 4.0),
        );
    }
    // A column per stretch of ops to hover or focus. The columns keep their place from one
    // redraw to the next: a redraw changes their titles, not the elements.
    let hits = columns_to_hover(t, &cols, (l, cw, TOP, BOTTOM - TOP), false);

    // Around the peak, op by op, on an axis that starts near the lowest of them.
    let (a, b) = (
        t.peak.saturating_sub(BEFORE),
        (t.peak + AFTER + 1).min(t.points.len()),
    );
    let win = &t.points[a..b];
    let lo = win.iter().map(|p| p.total()).fold(f64::INFINITY, f64::min);
    let span = (top - lo).max(top * 0.02).max(1.0);
    let floor = (lo - span * 0.25).max(0.0);
    let st = crate::chart::ticks_n(top - floor, 3.0)
        .get(1)
        .copied()
        .unwrap_or(top)
        .max(1.0);
    let dk: Vec<f64> = (0..8)
        .map(|j| ((floor / st).ceil() + j as f64) * st)
        .take_while(|v| *v <= top + st * 0.999)
        .collect();
    let dmax = dk.last().copied().unwrap_or(top).max(top);
    let dy = |b: f64| {
        DBOTTOM - (DBOTTOM - DTOP) * ((b - floor) / (dmax - floor).max(1.0)).clamp(0.0, 1.05)
    };
    let dw = (w - l - r) / win.len().max(1) as f64;
    let mut detail = String::with_capacity(8 << 10);
    grid(&mut detail, &dk, l, w - r, &dy);
    // Each part one path of the ops' bars (a rectangle an op), under the ops.
    let mut bars = vec![String::new(); PARTS.len()];
    for (j, p) in win.iter().enumerate() {
        let s = stack(p, &idx);
        let x = l + dw * j as f64;
        let mut below = 0.0;
        for (q, d) in bars.iter_mut().enumerate().take(s.len()) {
            let hi = below + s[q];
            if s[q] > 0.0 && hi > floor {
                let (ya, yb) = (dy(hi), dy(below.max(floor)));
                let bw = (dw - 1.0).max(0.5);
                d.push('M');
                coord(d, x + 0.5);
                d.push(' ');
                coord(d, ya);
                d.push('h');
                coord(d, bw);
                d.push('v');
                coord(d, (yb - ya).max(0.0));
                d.push('h');
                coord(d, -bw);
                d.push('Z');
            }
            below = hi;
        }
    }
    for (part, d) in PARTS.iter().zip(bars) {
        if !d.is_empty() {
            let _ = write!(detail, r#"<path class="gm-f-{}" d="{d}"></path>"#, part.key);
        }
    }
    let ops = columns_to_hover(
        t,
        &(a..b).collect::<Vec<usize>>(),
        (l, dw, DTOP, DBOTTOM - DTOP),
        true,
    );
    let dpx = l + dw * ((t.peak - a) as f64 + 0.5);
    let what = if peak.at.what.is_empty() {
        place(peak)
    } else {
        peak.at.what.to_string()
    };
    // Beside the peak's column, clear of its dashed outline.
    let right = dpx > w * 0.6;
    let off = dw / 2.0 + 3.0;
    text(
        &mut detail,
        "gm-peaklabel gm-halo",
        if right { dpx - off } else { dpx + off },
        (dy(top) - 4.0).max(10.0),
        if right { "end" } else { "start" },
        &fit(&format!("peak: {what}"), w * 0.55),
    );
    let half = (w - l - r) / 2.0 - 4.0;
    text(
        &mut detail,
        "gm-phase",
        l,
        DBOTTOM + 14.0,
        "start",
        &fit(&place(&win[0]), half),
    );
    text(
        &mut detail,
        "gm-phase",
        w - r,
        DBOTTOM + 14.0,
        "end",
        &fit(&place(&win[win.len() - 1]), half),
    );

    let readout = match shown.as_ref() {
        Some((kk, text)) if *kk == k => text.clone(),
        _ => label(peak),
    };
    let summary = format!(
        "Memory through one step of {}, op by op: it peaks at {} during {}{}. {}",
        e.model,
        gib(top),
        e.peak_phase,
        if peak.at.what.is_empty() {
            String::new()
        } else {
            format!(", at {}", peak.at.what)
        },
        if e.fits {
            "It fits."
        } else {
            "It does not fit."
        }
    );
    let (last_col, last_op) = (cols.len() - 1, win.len().saturating_sub(1));
    let on_key_overview = Callback::from(move |e: KeyboardEvent| roving(e, last_col));
    let on_key_detail = Callback::from(move |e: KeyboardEvent| roving(e, last_op));
    html! {
        <figure class="gm gm-timeline" data-widget="timeline" ref={root} aria-labelledby={title_id.clone()}
            aria-describedby={summary_id.clone()}>
            { head }
            <svg class="gm-chart" ref={svg_ref} viewBox={format!("0 0 {} {}", n(w), n(H))} role="group"
                aria-label="The whole step, a column for each stretch of ops at its highest point; arrow keys move along"
                onkeydown={on_key_overview} onmouseover={on_over.clone()} onfocusin={on_focus.clone()}>
                { Html::from_html_unchecked(svg.into()) }
                <g class="gm-hits">{ hits }</g>
                { Html::from_html_unchecked(peak_label.into()) }
            </svg>
            { crate::allocator::key_legend(&legend) }
            <p class="gm-note gm-detail-title">{ format!("Around the peak, op by op (the axis starts at {}):", gib(floor)) }</p>
            <svg class="gm-chart gm-detail" viewBox={format!("0 0 {} {}", n(w), n(DH))} role="group"
                aria-label="The ops around the peak, one column each; arrow keys move along"
                onkeydown={on_key_detail} onmouseover={on_over} onfocusin={on_focus}>
                { Html::from_html_unchecked(detail.into()) }
                <g class="gm-ops">{ ops }</g>
            </svg>
            <p class="gm-readout" aria-live="polite" data-value="op">{ readout }</p>
            <p class="gm-note" data-value="peak">{ note }</p>
            <p class="gm-sr" id={summary_id}>{ summary }</p>
            { toolbar }
        </figure>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gradient reads the same where it is made and where it is freed: after the tensor
    /// it is the gradient of (before, "norm: grad of input" named the gradient of norm's
    /// output at one end and "norm: grad of output" at the other).
    #[test]
    fn a_gradient_has_one_name_at_both_ends() {
        let v = serde_json::json!({"model": "llama3.2-1b", "batch": 1, "seq": 512, "precision": "bf16"});
        let s = gpumem::Scenario::from_value(&v).unwrap();
        let t = gpumem::timeline::op_timeline(&s).unwrap();
        let grads: Vec<&OpPoint> = t
            .points
            .iter()
            .filter(|p| p.role.starts_with("grad of") && !p.tensor.is_empty())
            .collect();
        assert!(grads.iter().any(|p| p.bytes > 0.0) && grads.iter().any(|p| p.bytes < 0.0));
        for p in grads {
            let l = label(p);
            assert!(l.contains(&format!(" · grad of {} · ", p.tensor)), "{l}");
            assert!(!l.contains(": grad of"), "{l}");
        }
    }
}
