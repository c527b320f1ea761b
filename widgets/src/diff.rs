//! Two scenarios as a waterfall from one peak to the other: each knob that differs applied in
//! turn, each step one part of memory that moves, so that the steps add up exactly to the
//! difference of the two peaks (the engine's components are whole bytes that add up to its
//! peak).
//!
//! With `with="recompute=full"` the widget compares the page's scenario with the page's with
//! those changes; without it, the chapter's own scenario with the reader's.

use std::fmt::Write;

use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::settings;
use crate::format::{escape_attr as esc, pct, Sum};
use crate::parts::{self, PARTS};
use crate::{Init, Knobs};

/// One step of a waterfall: what changed, the part that moved, by how many bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub cause: String,
    pub part: &'static str,
    pub bytes: i64,
}

/// A waterfall from `a`'s peak to `b`'s.
#[derive(Clone, Debug, PartialEq)]
pub struct Waterfall {
    pub from: u64,
    pub to: u64,
    pub steps: Vec<Step>,
}

/// The knob changes that take `a` to `b`, in the knobs' order: (knob, before, after).
fn changes(a: &Knobs, b: &Knobs) -> Vec<(&'static str, String, String)> {
    gpumem::knobs::KNOBS
        .iter()
        .filter(|k| a.get(k) != b.get(k))
        .map(|k| {
            // An unset knob by what it means ("recompute none → full").
            let v = |x: &Knobs| match x.get_or_default(k) {
                "" if *k == "capacity" => "the GPU's".to_string(),
                "" => "unset".to_string(),
                v => v.to_string(),
            };
            (*k, v(a), v(b))
        })
        .collect()
}

/// Bytes by part at an estimate's peak.
fn by_part(e: &gpumem::Estimate) -> Vec<i64> {
    let mut v = vec![0i64; PARTS.len()];
    for (k, b) in e.components.iter() {
        let p = parts::of_component(k);
        if let Some(i) = PARTS.iter().position(|x| x.key == p.key) {
            v[i] += *b as i64;
        }
    }
    v
}

/// The waterfall from `a` to `b`: each change applied in turn (a change the engine refuses on
/// its own is applied together with the next), each step a part that moves.
pub fn waterfall(a: &Knobs, b: &Knobs) -> Result<Waterfall, String> {
    let ea = a.estimate().map_err(|e| e.to_string())?;
    let eb = b.estimate().map_err(|e| e.to_string())?;
    let mut steps = Vec::new();
    let (mut cur, mut parts_now) = (a.clone(), by_part(&ea));
    let mut pending: Vec<String> = Vec::new();
    let all = changes(a, b);
    for (i, (k, before, after)) in all.iter().enumerate() {
        cur = match b.get(k) {
            Some(v) => cur.with(k, v),
            None => cur.without(k),
        };
        pending.push(format!("{k} {before} → {after}"));
        let e = if i + 1 == all.len() {
            eb.clone()
        } else {
            match cur.estimate() {
                Ok(e) => e,
                Err(_) => continue,
            }
        };
        let next = by_part(&e);
        let cause = pending.join(", ");
        pending.clear();
        for (j, part) in PARTS.iter().enumerate() {
            let d = next[j] - parts_now[j];
            if d != 0 {
                steps.push(Step {
                    cause: cause.clone(),
                    part: part.key,
                    bytes: d,
                });
            }
        }
        parts_now = next;
    }
    Ok(Waterfall {
        from: ea.peak_bytes,
        to: eb.peak_bytes,
        steps,
    })
}

/// The diff widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_diff(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let (title_id, summary_id) = (init.id("title"), init.id("summary"));
    let with = init.option("with").unwrap_or("");
    let (a, b) = if with.is_empty() {
        (init.knobs.clone(), k.clone())
    } else {
        match k.with_changes(with) {
            Ok(b) => (k.clone(), b),
            Err(e) => return crate::chart::refused("diff", root, e),
        }
    };
    let title = if with.is_empty() {
        "From the chapter's scenario to yours".to_string()
    } else {
        format!("What {} changes", with.replace(' ', ", "))
    };
    let w = match waterfall(&a, &b) {
        Ok(w) => w,
        Err(e) => return crate::chart::refused("diff", root, e),
    };
    let (from, to) = (w.from as f64, w.to as f64);
    let sum = Sum::of(from.max(to));
    // Each step as shown: the difference of the peaks shown around it.
    let shown = signed_texts(&sum, &w.steps, from, to);
    let mut run = from;
    let mut high = from.max(to);
    for s in &w.steps {
        run += s.bytes as f64;
        high = high.max(run);
    }
    let bar = |out: &mut String, lo: f64, hi: f64, class: &str| {
        let _ = write!(
            out,
            r#"<div class="gm-wf-track" aria-hidden="true"><div class="gm-wf-bar {class}" style="margin-left:{};width:{}"></div></div>"#,
            pct(lo, high),
            pct(hi - lo, high)
        );
    };
    let mut t = String::with_capacity(4096);
    let _ = write!(
        t,
        r#"<table class="gm-table gm-waterfall" data-from="{}" data-to="{}"><thead><tr><th scope="col">Step</th><th scope="col" class="gm-num">Change</th><th scope="col" class="gm-num">Peak after</th></tr></thead><tbody><tr class="gm-wf-end"><th scope="row">Allocated peak of {}"#,
        w.from,
        w.to,
        esc(&settings(&a))
    );
    bar(&mut t, 0.0, from, "gm-wf-total");
    let _ = write!(
        t,
        r#"</th><td></td><td class="gm-num">{}</td></tr>"#,
        sum.gib(from)
    );
    let mut at = from;
    for (s, text) in w.steps.iter().zip(&shown) {
        let next = at + s.bytes as f64;
        let (lo, hi) = (at.min(next), at.max(next));
        at = next;
        let label = parts::find(s.part).map_or("Other", |p| p.label);
        let _ = write!(
            t,
            r#"<tr data-bytes="{}"><th scope="row"><span class="gm-wf-cause">{}</span><span class="gm-wf-part"><span class="gm-swatch gm-c-{}" aria-hidden="true"></span>{label}</span>"#,
            s.bytes,
            esc(&s.cause),
            s.part
        );
        bar(&mut t, lo, hi, &format!("gm-c-{}", s.part));
        let _ = write!(
            t,
            r#"</th><td class="gm-num {}">{text}</td><td class="gm-num">{}</td></tr>"#,
            if s.bytes < 0 { "gm-ok" } else { "gm-over" },
            sum.gib(next)
        );
    }
    let diff = sum.show(sum.units(to) - sum.units(from));
    if !w.steps.is_empty() {
        let _ = write!(
            t,
            r#"<tr class="gm-wf-end"><th scope="row">Allocated peak of {}"#,
            esc(&settings(&b))
        );
        bar(&mut t, 0.0, to, "gm-wf-total");
        let _ = write!(
            t,
            r#"</th><td class="gm-num">{diff}</td><td class="gm-num">{}</td></tr>"#,
            sum.gib(to)
        );
    }
    t.push_str("</tbody></table>");
    let summary = if w.steps.is_empty() {
        format!("The two scenarios peak alike, at {}.", sum.gib(from))
    } else {
        format!(
            "From {} to {}: {diff} in {} step{}.",
            sum.gib(from),
            sum.gib(to),
            w.steps.len(),
            if w.steps.len() == 1 { "" } else { "s" }
        )
    };
    html! {
        <figure class="gm gm-diff" data-widget="diff" ref={root} aria-labelledby={title_id.clone()} aria-describedby={summary_id.clone()}>
            <figcaption class="gm-head" id={title_id}>
                <span class="gm-title">{ title }</span>
            </figcaption>
            <div class="gm-scroll">{ Html::from_html_unchecked(t.into()) }</div>
            if w.steps.is_empty() && with.is_empty() {
                <p class="gm-note">{ "Change a setting on this page, or use a remedy, and the steps from this chapter's peak to yours appear here." }</p>
            }
            <p class="gm-sr" id={summary_id} aria-live="polite">{ summary }</p>
        </figure>
    }
}

/// The steps' sizes as text, at `sum`'s precision: each the difference of the peaks shown
/// before and after it, so that every row's arithmetic holds as shown (62.7 + 15.0 = 77.7)
/// and the steps add up to the difference of the ends as shown.
fn signed_texts(sum: &Sum, steps: &[Step], from: f64, _to: f64) -> Vec<String> {
    let mut at = from;
    steps
        .iter()
        .map(|s| {
            let next = at + s.bytes as f64;
            let u = sum.units(next) - sum.units(at);
            at = next;
            signed_units(sum, u)
        })
        .collect()
}

/// Units with an explicit sign: "+1.2 GiB", "−3.4 GiB".
fn signed_units(sum: &Sum, u: i64) -> String {
    let t = sum.show(u);
    if u > 0 {
        format!("+{t}")
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(v: &[(&str, &str)]) -> Knobs {
        Knobs(
            v.iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    }

    #[test]
    fn the_steps_add_up_to_the_difference_of_the_peaks() {
        let a = k(&[("model", "llama3.1-8b"), ("batch", "4"), ("seq", "4k")]);
        for with in [
            "recompute=full",
            "loss=fused batch=2 grad-accum=2",
            "dp=8 zero-stage=3",
            "optimizer=adamw-8bit precision=mixed-bf16",
        ] {
            let b = a.with_changes(with).unwrap();
            let w = waterfall(&a, &b).unwrap();
            let total: i64 = w.steps.iter().map(|s| s.bytes).sum();
            assert_eq!(total, w.to as i64 - w.from as i64, "{with}");
            assert!(!w.steps.is_empty(), "{with}");
            // As shown, too.
            let sum = Sum::of(w.from.max(w.to) as f64);
            let shown = signed_texts(&sum, &w.steps, w.from as f64, w.to as f64);
            let tenths: i64 = shown
                .iter()
                .map(|t| {
                    let t = t.replace('−', "-").replace('+', "");
                    t.trim_end_matches(" GiB")
                        .replace('.', "")
                        .parse::<i64>()
                        .unwrap()
                })
                .sum();
            assert_eq!(
                tenths,
                sum.units(w.to as f64) - sum.units(w.from as f64),
                "{with}: {shown:?}"
            );
        }
        // An unset knob is named by what it means.
        let w = waterfall(&a, &a.with_changes("recompute=full dp=2").unwrap()).unwrap();
        assert!(w.steps.iter().any(|s| s.cause == "recompute none → full"));
        assert!(w.steps.iter().any(|s| s.cause == "dp 1 → 2"));
        let w = waterfall(&a, &a).unwrap();
        assert!(w.steps.is_empty());
        assert!(a.with_changes("nonsense").is_err());
        assert!(a.with_changes("colour=red").is_err());
    }
}
