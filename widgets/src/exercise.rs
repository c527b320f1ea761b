//! An exercise checked by the engine: a question on the page's scenario (with the changes its
//! `with` option makes), a field for the reader's answer, the engine's verdict within a stated
//! tolerance, and a worked solution with the reader's numbers that unfolds on request (a
//! `<details>`: readable without any script). The answer follows the page's state.
//!
//! Options: `ask` (a quantity of `value`, or `max-seq`, `saving`, `logits-fp32`), `with`,
//! `format=per-param`, `tolerance` (percent, default 2), `question`, `solution` (quantities
//! whose formulas, with their numbers, make the worked solution).

use web_sys::HtmlInputElement;
use yew::prelude::*;

use crate::allocator::{use_knobs, use_live_marker};
use crate::chart::el;
use crate::format::{count, gib, tokens};
use crate::{quantity, Init, Knobs};

/// What an answer is counted in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    Gib,
    Tokens,
    PerParam,
}

impl Unit {
    /// What an answer is counted in: "GiB", "tokens", "bytes per parameter".
    fn name(self) -> &'static str {
        match self {
            Unit::Gib => "GiB",
            Unit::Tokens => "tokens",
            Unit::PerParam => "bytes per parameter",
        }
    }

    /// A value as the answer line shows it.
    fn show(self, v: f64) -> String {
        match self {
            Unit::Gib => gib(v * GIB),
            Unit::Tokens => format!("{} tokens", count(v.max(0.0) as u64)),
            Unit::PerParam => format!("{} bytes per parameter", gpumem::num::fixed(v, 2)),
        }
    }
}

const GIB: f64 = 1073741824.0;

/// The engine's answer to an exercise for some knobs, in its unit, with the worked solution.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub value: f64,
    pub unit: Unit,
    pub steps: Vec<String>,
}

/// The engine's answer to `ask` for the page's knobs `k` with `with` applied.
pub fn answer(
    k: &Knobs,
    ask: &str,
    with: &str,
    format: &str,
    solution: &str,
) -> Result<Answer, String> {
    let kk = k.with_changes(with)?;
    let e = kk.estimate().map_err(|e| e.to_string())?;
    let s = kk.scenario().map_err(|e| e.to_string())?;
    let mut steps = Vec::new();
    let (value, unit) = match ask {
        "max-seq" => {
            let fits = |v: u64| crate::sweep::column_of(&kk, "seq", v).map(|c| c.2);
            if fits(1) != Some(true) {
                return Err("not even one token fits on this GPU".into());
            }
            let mut lo = 1u64;
            let mut hi = 2u64;
            while fits(hi) == Some(true) {
                lo = hi;
                hi = hi.saturating_mul(2);
                if hi > 1 << 22 {
                    return Err("it fits beyond four million tokens".into());
                }
            }
            let over = crate::sweep::column_of(&kk, "seq", hi).ok_or("the engine refused")?;
            let first = crate::sweep::first_over(&kk, "seq", lo, over);
            let last = first.0 - 1;
            let at = |v: u64| kk.with("seq", v.to_string()).estimate().ok();
            if let (Some(a), Some(b)) = (at(last), at(first.0)) {
                let cap = a.capacity_bytes as f64;
                steps.push(format!(
                    "At s = {}: the step {}: it fits.",
                    count(last),
                    crate::sweep::needs(a.device_bytes as f64, cap, &a.gpu)
                ));
                steps.push(format!(
                    "At s = {}: it {}, {} over: it does not.",
                    count(first.0),
                    crate::sweep::needs(b.device_bytes as f64, cap, &b.gpu),
                    crate::format::delta(b.device_bytes as f64 - cap)
                ));
            }
            (last as f64, Unit::Tokens)
        }
        "saving" => {
            let base = k.estimate().map_err(|e| e.to_string())?;
            let (a, b) = (base.peak_bytes as f64, e.peak_bytes as f64);
            steps.push(format!("M_peak as the page has it = {}", gib(a)));
            steps.push(format!(
                "M_peak with {} = {}",
                with.replace(' ', ", "),
                gib(b)
            ));
            // The difference of the two figures shown, as the remedies give it (431.1 −
            // 234.7 = 196.4, where the bytes' difference rounds to 196.3).
            let sum = crate::format::Sum::of(a);
            let d = sum.units(a) - sum.units(b);
            steps.push(format!(
                "saving = {} − {} = {}",
                sum.gib(a),
                sum.gib(b),
                sum.show(d)
            ));
            (sum.value(d), Unit::Gib)
        }
        "logits-fp32" => {
            let rows = gpumem::ledger::loss(&s).map_err(|e| e.to_string())?;
            let r = rows
                .iter()
                .find(|r| {
                    !r.backward
                        && r.dtype == Some(gpumem::dtype::DType::F32)
                        && r.shape.0 == "b·s·V"
                })
                .ok_or("this loss makes no fp32 copy of the logits")?;
            steps.push(format!(
                "M = {} × 4 B = {} × 4 B = {}",
                r.shape.0.replace('·', " × "),
                r.shape.1,
                gib(r.bytes)
            ));
            (r.bytes / GIB, Unit::Gib)
        }
        q => {
            let v = quantity::value(&e, q).ok_or_else(|| format!("no quantity '{q}'"))?;
            let wanted = if solution.is_empty() { q } else { solution };
            for x in wanted.split(',').map(str::trim).filter(|x| !x.is_empty()) {
                steps.push(quantity::substitute(&s, &e, x).unwrap_or_else(|| {
                    format!(
                        "M_{x} = {} (the engine's replay)",
                        quantity::show(&e, x, "gib")
                    )
                }));
            }
            if format == "per-param" {
                let p = e.params.max(1) as f64;
                steps.push(format!(
                    "per parameter: {} / {} parameters = {} B",
                    gib(v),
                    count(e.params),
                    gpumem::num::fixed(v / p, 2)
                ));
                (v / p, Unit::PerParam)
            } else {
                (v / GIB, Unit::Gib)
            }
        }
    };
    Ok(Answer { value, unit, steps })
}

/// How far off an answer may be: `tolerance` percent of it, and never less than half the
/// last digit the answer is shown with.
pub fn accepted(a: &Answer, tolerance: f64) -> f64 {
    let floor = match a.unit {
        Unit::Gib if a.value.abs() < 1.0 => 0.005,
        Unit::Gib => 0.05,
        Unit::Tokens => 0.5,
        Unit::PerParam => 0.005,
    };
    (a.value.abs() * tolerance / 100.0).max(floor)
}

/// The reader's answer as a number: thousands separators, spaces and a unit after it are
/// allowed ("12.3 GiB", "8,191", "4k" for tokens; GB and MB are read as decimal units and
/// converted). `None` when it is not a number.
pub fn read(text: &str, unit: Unit) -> Option<f64> {
    // A comma groups thousands ("8,191"): a decimal comma ("59,8") is not read as 598.
    let mut group = None::<u8>;
    for &c in text.as_bytes() {
        match group {
            _ if c == b',' => {
                if group.is_some_and(|n| n != 3) {
                    return None;
                }
                group = Some(0);
            }
            Some(3) if c.is_ascii_digit() => return None,
            Some(n) if c.is_ascii_digit() => group = Some(n + 1),
            Some(3) | None => group = None,
            Some(_) => return None,
        }
    }
    if group.is_some_and(|n| n != 3) {
        return None;
    }
    let t: String = text
        .chars()
        .filter(|c| *c != ',' && !c.is_whitespace())
        .collect();
    let t = t.replace('−', "-");
    let lower = t.to_ascii_lowercase();
    let num = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == '/');
    if num.is_empty() || num.len() > 40 {
        return None;
    }
    let x = gpumem::num::parse_f64(num)?;
    let mult = match (unit, &lower[num.len()..]) {
        (Unit::Tokens, "k") => 1024.0,
        (Unit::Tokens, "m") => 1048576.0,
        // Decimal units, as nvidia-smi and spec sheets count: 64.2 GB is 59.8 GiB.
        (Unit::Gib, "gb") => 1e9 / GIB,
        (Unit::Gib, "mb") => 1e6 / GIB,
        (Unit::Gib, "mib") => 1.0 / 1024.0,
        _ => 1.0,
    };
    (x.is_finite()).then_some(x * mult)
}

/// The verdict on `guess` for answer `a`.
pub fn verdict(a: &Answer, guess: f64, tolerance: f64) -> (bool, String) {
    let tol = accepted(a, tolerance);
    let within = format!("accepted within ±{} %", gpumem::num::short(tolerance));
    if (guess - a.value).abs() <= tol {
        (
            true,
            format!(
                "✓ Right: the engine gives {} ({within}).",
                a.unit.show(a.value)
            ),
        )
    } else {
        let off = if a.value != 0.0 {
            let rel = ((guess - a.value) / a.value * 100.0).abs();
            format!(
                "{} % {}",
                // A guess off by orders of magnitude (1e308) is not "inf %".
                if rel < 1000.0 {
                    gpumem::num::fixed(rel, 0)
                } else {
                    "more than 1,000".to_string()
                },
                if guess > a.value {
                    "too high"
                } else {
                    "too low"
                }
            )
        } else {
            "off".to_string()
        };
        (
            false,
            format!(
                "✗ Not quite: that is {off} ({within}). Try again, or open the worked solution."
            ),
        )
    }
}

/// The exercise widget, as a hook of the one widget component ([`crate::Widget`]).
#[hook]
pub fn use_exercise(init: &Init) -> Html {
    let (k, _) = use_knobs(init, false);
    let root = use_live_marker();
    let input = use_node_ref();
    // The reader's last check, and the knobs it was made for (a change of the page's state
    // makes it stale).
    // (Right answers are the verdicts that begin with ✓.)
    let result = use_state(|| None::<(Knobs, String)>);
    let opt = |key: &str| init.option(key).unwrap_or("").to_string();
    let (ask, with, format, solution) = (opt("ask"), opt("with"), opt("format"), opt("solution"));
    let tolerance = init
        .option("tolerance")
        .and_then(|t| gpumem::knobs::number("tolerance", t.trim_end_matches('%')).ok())
        .unwrap_or(2.0);
    let a = answer(&k, &ask, &with, &format, &solution);
    let unit = a.as_ref().map(|a| a.unit).unwrap_or(Unit::Gib);
    let on_check = {
        let (input, result, k, a) = (input.clone(), result.clone(), k.clone(), a.clone());
        Callback::from(move |e: SubmitEvent| {
            e.prevent_default();
            let Some(el) = input.cast::<HtmlInputElement>() else {
                return;
            };
            let msg = match (&a, read(&el.value(), unit)) {
                (Err(err), _) => format!("The engine cannot answer this here: {err}"),
                (_, None) => format!("Type a number (in {}).", unit.name()),
                (Ok(a), Some(g)) => verdict(a, g, tolerance).1,
            };
            result.set(Some((k.clone(), msg)));
        })
    };
    let shown = result
        .as_ref()
        .filter(|(kk, _)| *kk == k)
        .map(|(_, m)| (m.starts_with('✓'), m.clone()));
    // A page that sets a parameter count (ZeRO's) has no model to name: the count is it.
    let model = match k.get("params") {
        Some(_) => crate::format::params(k.count("params", 0)),
        None => k.model_name().into(),
    };
    let sub = format!(
        "{model} · b={} · s={}{}",
        k.count("batch", 1),
        tokens(k.count("seq", 2048)),
        if with.is_empty() {
            String::new()
        } else {
            format!(" · with {}", with.replace(' ', ", "))
        }
    );
    let field = init.id("answer");
    html! {
        <figure class="gm gm-exercise" data-widget="exercise" data-ask={ask.clone()} ref={root} aria-labelledby={init.id("q")}>
            <figcaption class="gm-head">
                <span class="gm-title">{ "Exercise" }</span>
                <span class="gm-sub">{ sub }</span>
            </figcaption>
            <p class="gm-question" id={init.id("q")}>{ opt("question") }</p>
            <form class="gm-ex-form" onsubmit={on_check}>
                <label for={field.clone()}>{ format!("Your answer ({})", unit.name()) }</label>
                <input id={field} ref={input} type="text" inputmode="decimal" autocomplete="off" spellcheck="false" />
                <button type="submit">{ "Check" }</button>
            </form>
            { el(
                "p",
                &["class", "role", "aria-live", "data-value"],
                vec![
                    match &shown {
                        None => "gm-ex-result",
                        Some((true, _)) => "gm-ex-result gm-ok",
                        Some(_) => "gm-ex-result gm-over",
                    }
                    .into(),
                    "status".into(),
                    "polite".into(),
                    "verdict".into(),
                ],
                html! { { shown.map(|(_, m)| m).unwrap_or_default() } },
            ) }
            <details class="gm-solution">
                <summary>{ "Worked solution, with this page's numbers" }</summary>
                { match &a {
                    Ok(a) => html! {
                        <>
                            <ol class="gm-formula-lines">
                                { for a.steps.iter().map(|s| html! { <li>{ s.clone() }</li> }) }
                            </ol>
                            <p data-value="answer">{ format!("Answer: {}.", a.unit.show(a.value)) }</p>
                        </>
                    },
                    Err(e) => html! { <p class="gm-error">{ format!("The engine cannot answer this here: {e}") }</p> },
                } }
            </details>
        </figure>
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
    fn answers_follow_the_knobs_and_are_checked_within_the_tolerance() {
        let page = k(&[("model", "llama3.1-8b"), ("batch", "1"), ("seq", "2k")]);
        let a = answer(&page, "optimizer_states", "dp=8 zero-stage=2", "", "").unwrap();
        let e = page
            .with("dp", "8")
            .with("zero-stage", "2")
            .estimate()
            .unwrap();
        assert!((a.value * GIB - e.optimizer_states_bytes as f64).abs() < 1.0);
        assert!(a.steps[0].contains("/ 8"), "{:?}", a.steps);
        assert!(verdict(&a, a.value * 1.01, 2.0).0);
        assert!(!verdict(&a, a.value * 1.1, 2.0).0);
        assert!(verdict(&a, a.value * 1.1, 2.0).1.contains("10 % too high"));
        let far = verdict(&a, 1e308, 2.0).1;
        assert!(far.contains("more than 1,000 % too high"), "{far}");
        assert!(verdict(&a, -1e308, 2.0)
            .1
            .contains("more than 1,000 % too low"));
        // Another model, another answer.
        let b = answer(
            &page.with("model", "llama3.2-1b"),
            "optimizer_states",
            "dp=8 zero-stage=2",
            "",
            "",
        )
        .unwrap();
        assert!(b.value < a.value * 0.5);
        // The longest sequence that fits, to the token.
        let m = answer(&page, "max-seq", "", "", "").unwrap();
        let last = m.value as u64;
        assert!(page.with("seq", last.to_string()).estimate().unwrap().fits);
        assert!(
            !page
                .with("seq", (last + 1).to_string())
                .estimate()
                .unwrap()
                .fits
        );
        assert_eq!(m.steps.len(), 2);
        // Bytes per parameter and a saving.
        let p = answer(
            &page,
            "model_states",
            "precision=mixed-bf16",
            "per-param",
            "",
        )
        .unwrap();
        assert!((p.value - 16.0).abs() < 0.01, "{}", p.value);
        let s = answer(&page, "saving", "recompute=full", "", "").unwrap();
        assert!(s.value > 0.0);
        // The saving is the difference of the two figures its solution shows, as the
        // remedies give it (Gemma 3 1B, b=8, s=8K: 431.1 − 234.7 = 196.4, where the bytes'
        // difference rounds to 196.3).
        let gemma = k(&[("model", "gemma-3-1b"), ("batch", "8"), ("seq", "8k")]);
        let s = answer(&gemma, "saving", "recompute=full", "", "").unwrap();
        let last = s.steps.last().unwrap();
        let shown: Vec<f64> = last
            .split(" GiB")
            .filter_map(|t| t.rsplit(' ').next()?.replace(',', "").parse().ok())
            .collect();
        assert_eq!(shown.len(), 3, "{last}");
        assert!((shown[0] - shown[1] - shown[2]).abs() < 1e-9, "{last}");
        assert!((s.value - shown[2]).abs() < 1e-9, "{last}: {}", s.value);
        let f = answer(&page, "logits-fp32", "", "", "").unwrap();
        assert!((f.value * GIB - 2048.0 * 128256.0 * 4.0).abs() < 1.0);
        assert!(answer(&page, "no-such", "", "", "").is_err());
        assert!(answer(&page, "peak", "colour=red", "", "").is_err());
    }

    #[test]
    fn the_readers_answer_is_read_as_a_number_or_refused() {
        assert_eq!(read(" 12.3 GiB", Unit::Gib), Some(12.3));
        assert_eq!(read("8,191", Unit::Tokens), Some(8191.0));
        assert_eq!(read("1,048,576", Unit::Tokens), Some(1048576.0));
        // A size as the widgets print it, thousands grouped.
        assert_eq!(read("17,441.0 GiB", Unit::Gib), Some(17441.0));
        for comma in ["59,8", "59,80", "1,0245", "12,"] {
            assert_eq!(read(comma, Unit::Gib), None, "{comma}");
        }
        assert_eq!(read("8k", Unit::Tokens), Some(8192.0));
        assert_eq!(read("−1.5", Unit::Gib), Some(-1.5));
        // GB and MB are decimal: a reader's 64.2 GB is 59.79 GiB.
        let gb = read("64.2 GB", Unit::Gib).unwrap();
        assert!((gb - 64.2e9 / GIB).abs() < 1e-12, "{gb}");
        assert_eq!(read("512 MiB", Unit::Gib), Some(0.5));
        assert_eq!(read("59.8 gib", Unit::Gib), Some(59.8));
        for bad in ["", "GiB", "twelve", "1e400", "<script>", &"9".repeat(100)] {
            assert_eq!(read(bad, Unit::Gib), None, "{bad}");
        }
    }
}
