//! Widget directives in the book's markdown.
//!
//! A directive is `{{#gpumem WIDGET [positional …] [key=value …]}}`, where a value may be
//! double-quoted (`gpu="A100-80GB"`). Directives inside fenced or indented code blocks and
//! inline code are left alone, as is an escaped `\{{#gpumem …}}`. Every directive is checked
//! here: an unknown widget or attribute, or a value the engine refuses, is an error that names
//! `FILE:LINE`.
//!
//! [`preprocess`] turns each directive into its widget's pre-rendered HTML (Yew SSR, the same
//! components the browser renders again, live); [`GpumemPreprocessor`] binds that to mdBook, in-process
//! (the site builder) or as the `mdbook-gpumem` command.

use std::fmt;
use std::ops::Range;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

mod preprocess;
pub mod validation;
use gpumem::knobs::{self, shown};
pub use preprocess::{number_formulas, preprocess, preprocess_at, GpumemPreprocessor};
use serde_json::Value;

/// The widgets a directive can name.
pub const WIDGETS: &[&str] = &[
    "allocator",
    "zero",
    "breakdown",
    "precision",
    "parallelism",
    "timeline",
    "sweep",
    "value",
    "formula",
    "validation",
    "diff",
    "exercise",
    "ledger",
    "remedies",
    "segments",
];

/// Attributes every widget takes: they describe the scenario (and how the widget shares it).
const SHARED_ATTRS: &[&str] = &["scope"];

/// Attributes particular to one widget.
fn widget_attrs(widget: &str) -> &'static [&'static str] {
    match widget {
        "allocator" => &[
            "show-breakdown",
            "model-min",
            "model-max",
            "batch-min",
            "batch-max",
            "seq-min",
            "seq-max",
        ],
        "zero" => &["gpus", "references", "segments"],
        "sweep" => &["axis", "from", "to", "scale", "levers"],
        "breakdown" => &["levers"],
        "value" => &["format"],
        "validation" => &["data"],
        "diff" => &["with"],
        "exercise" => &["ask", "with", "format", "tolerance", "question", "solution"],
        "ledger" => &["of"],
        _ => &[],
    }
}

/// How many positional arguments a widget takes (e.g. `value activations`).
fn positional_count(widget: &str) -> usize {
    match widget {
        "value" | "formula" => 1,
        _ => 0,
    }
}

/// A quantity an inline `value` (or a `formula`) can show.
pub const QUANTITIES: &[&str] = &[
    "peak",
    "weights",
    "quantized_weights",
    "master_weights",
    "gradients",
    "optimizer_states",
    "activations",
    "logits",
    "temporaries",
    "weight_copies",
    "kv_cache",
    "model_states",
    "params",
    "trainable_params",
    "headroom",
    "capacity",
    "device",
    "cuda_context",
    "reserve",
    "reserved",
    "reserved_unallocated",
    "largest_free_block",
    "segments",
    "cublas_workspace",
    "nvidia_smi",
];

/// Quantities of the caching allocator's replay. The widgets' wasm does not carry the
/// replay, so a `value` of one of these is computed when the book is built, for the page's
/// scenario, and stays as drawn.
pub const REPLAYED: &[&str] = &[
    "reserve",
    "reserved",
    "reserved_unallocated",
    "largest_free_block",
    "segments",
    "cublas_workspace",
    "nvidia_smi",
];

/// One directive found in a chapter.
#[derive(Clone, Debug, PartialEq)]
pub struct Directive {
    pub widget: String,
    pub positional: Vec<String>,
    /// Attributes in the order written.
    pub attrs: Vec<(String, String)>,
    /// 1-based line of the directive's start.
    pub line: usize,
    /// Byte range of the whole directive in the chapter's source.
    pub span: Range<usize>,
    /// The scenario the attributes describe (engine-validated), as the engine's JSON.
    pub scenario: Value,
}

/// What is wrong, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectiveError {
    pub line: usize,
    pub message: String,
}

impl DirectiveError {
    /// `FILE:LINE: message`.
    pub fn at(&self, file: &str) -> String {
        format!("{file}:{}: {}", self.line, self.message)
    }
}

impl fmt::Display for DirectiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

const OPEN: &str = "{{#gpumem";

/// Byte ranges of code (blocks and inline) in `src`, where directives are not expanded.
fn code_ranges(src: &str) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut block_start = None;
    for (ev, r) in Parser::new_ext(src, Options::all()).into_offset_iter() {
        match ev {
            Event::Start(Tag::CodeBlock(_)) => block_start = Some(r.start),
            Event::End(TagEnd::CodeBlock) => {
                ranges.push(block_start.take().unwrap_or(r.start)..r.end);
            }
            Event::Code(_) => ranges.push(r),
            _ => {}
        }
    }
    ranges
}

fn line_of(src: &str, pos: usize) -> usize {
    src[..pos].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Find and validate every directive of a chapter. All errors are reported, not only the
/// first, so an author fixes a chapter in one pass.
pub fn parse_chapter(src: &str) -> Result<Vec<Directive>, Vec<DirectiveError>> {
    let code = code_ranges(src);
    let in_code = |p: usize| code.iter().any(|r| r.contains(&p));
    let mut found = Vec::new();
    let mut errors = Vec::new();
    let mut from = 0;
    while let Some(off) = src[from..].find(OPEN) {
        let start = from + off;
        from = start + OPEN.len();
        if in_code(start) || (start > 0 && src.as_bytes()[start - 1] == b'\\') {
            continue;
        }
        let line = line_of(src, start);
        let Some(close) = src[from..].find("}}") else {
            errors.push(DirectiveError {
                line,
                message: "directive is not closed with }}".into(),
            });
            break;
        };
        let body = &src[from..from + close];
        let end = from + close + 2;
        from = end;
        match parse_body(body, line, start..end) {
            Ok(d) => found.push(d),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(found)
    } else {
        Err(errors)
    }
}

/// Split a directive body into words, honouring double quotes (`\"` and `\\` escape).
fn tokens(body: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    let mut any = false;
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                any = true;
            }
            '\\' if in_quotes => match chars.next() {
                Some(n) => cur.push(n),
                None => return Err("a backslash ends the directive".into()),
            },
            c if c.is_whitespace() && !in_quotes => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => cur.push(c),
        }
    }
    if in_quotes {
        return Err("a quoted value is not closed".into());
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

fn parse_body(body: &str, line: usize, span: Range<usize>) -> Result<Directive, DirectiveError> {
    let err = |message: String| DirectiveError { line, message };
    let words = tokens(body).map_err(err)?;
    let Some((widget, rest)) = words.split_first() else {
        return Err(err(format!(
            "no widget named (one of: {})",
            WIDGETS.join(", ")
        )));
    };
    if !WIDGETS.contains(&widget.as_str()) {
        return Err(err(format!(
            "unknown widget '{}' (one of: {})",
            shown(widget),
            WIDGETS.join(", ")
        )));
    }
    let mut positional = Vec::new();
    let mut attrs: Vec<(String, String)> = Vec::new();
    for w in rest {
        match w.split_once('=') {
            Some((k, v)) => {
                // `preset=` reads better in prose; it is the `model` knob.
                let k = if k == "preset" { "model" } else { k };
                let allowed = knobs::KNOBS.contains(&k)
                    || SHARED_ATTRS.contains(&k)
                    || widget_attrs(widget).contains(&k);
                if !allowed {
                    let mut all: Vec<&str> = knobs::KNOBS.to_vec();
                    all.extend(SHARED_ATTRS);
                    all.extend(widget_attrs(widget));
                    return Err(err(format!(
                        "{widget}: unknown attribute '{}' (one of: {})",
                        shown(k),
                        all.join(", ")
                    )));
                }
                if attrs.iter().any(|(a, _)| a == k) {
                    return Err(err(format!("{widget}: attribute '{k}' given twice")));
                }
                attrs.push((k.to_string(), v.to_string()));
            }
            None => positional.push(w.clone()),
        }
    }
    let want = positional_count(widget);
    if positional.len() != want {
        return Err(err(match want {
            0 => format!(
                "{widget}: unexpected word '{}' (attributes are key=value)",
                shown(&positional[0])
            ),
            _ => format!(
                "{widget}: needs {want} quantity name (one of: {})",
                QUANTITIES.join(", ")
            ),
        }));
    }
    if widget == "formula" && !gpumem_widgets::quantity::FORMULAS.contains(&positional[0].as_str())
    {
        return Err(err(format!(
            "formula: '{}' has no closed form (the engine replays the step op by op); formulas: {} — use `value` for the others",
            shown(&positional[0]),
            gpumem_widgets::quantity::FORMULAS.join(", ")
        )));
    }
    if want == 1 && !QUANTITIES.contains(&positional[0].as_str()) {
        return Err(err(format!(
            "{widget}: unknown quantity '{}' (one of: {})",
            shown(&positional[0]),
            QUANTITIES.join(", ")
        )));
    }
    check_widget_attrs(widget, &attrs).map_err(err)?;
    check_exercise(widget, &attrs).map_err(err)?;
    let scenario = scenario_of(&attrs).map_err(err)?;
    Ok(Directive {
        widget: widget.clone(),
        positional,
        attrs,
        line,
        span,
        scenario,
    })
}

fn count(key: &str, v: &str) -> Result<u64, String> {
    knobs::count(key, v).map_err(|e| e.to_string())
}

/// The values an enumerated attribute accepts.
fn allowed_values(key: &str) -> Option<&'static [&'static str]> {
    Some(match key {
        "show-breakdown" => &["true", "false"],
        "scope" => &["page", "local"],
        "axis" => &["seq", "batch", "gpus"],
        "scale" => &["linear", "log"],
        "of" => &["layer", "loss"],
        "format" => &[
            "gib",
            "gb",
            "bytes",
            "percent",
            "count",
            "scaled",
            "per-param",
            "phase",
        ],
        _ => return None,
    })
}

fn check_widget_attrs(widget: &str, attrs: &[(String, String)]) -> Result<(), String> {
    for (k, v) in attrs {
        if let Some(vals) = allowed_values(k) {
            if !vals.contains(&v.as_str()) {
                return Err(format!(
                    "{widget}: {k} must be one of {}, got '{}'",
                    vals.join(", "),
                    shown(v)
                ));
            }
        }
        match k.as_str() {
            "gpus" | "from" | "to" | "batch-min" | "batch-max" | "seq-min" | "seq-max" => {
                count(k, v)?;
            }
            "model-min" | "model-max" => {
                knobs::number(k, v).map_err(|e| e.to_string())?;
            }
            "segments" => {
                gpumem_widgets::zero::parse_segments(v)
                    .map_err(|e| format!("{widget}: segments: {e}"))?;
            }
            "levers" => {
                if let Some(bad) = v
                    .split(',')
                    .find(|l| !gpumem_widgets::levers::LEVERS.contains(&l.trim()))
                {
                    return Err(format!(
                        "{widget}: unknown lever '{}' (levers: {})",
                        shown(bad),
                        gpumem_widgets::levers::LEVERS.join(", ")
                    ));
                }
            }
            "references" => {
                if let Some(bad) = v.split(',').find(|n| gpumem::gpu::find(n.trim()).is_none()) {
                    return Err(format!("{widget}: unknown reference GPU '{}'", shown(bad)));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// What an exercise or a diff needs: a question and something to ask, changes that name
/// knobs the engine accepts, a tolerance that is a number, solution steps that are quantities.
fn check_exercise(widget: &str, attrs: &[(String, String)]) -> Result<(), String> {
    let get = |k: &str| attrs.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
    if let Some(with) = get("with") {
        let own = gpumem_widgets::Knobs(
            attrs
                .iter()
                .filter(|(k, _)| knobs::KNOBS.contains(&k.as_str()))
                .cloned()
                .collect(),
        );
        let changed = own
            .with_changes(with)
            .map_err(|e| format!("{widget}: with: {e}"))?;
        changed
            .scenario()
            .map_err(|e| format!("{widget}: with: {e}"))?;
    }
    if widget != "exercise" {
        return Ok(());
    }
    const SPECIAL: &[&str] = &["max-seq", "saving", "logits-fp32"];
    let ask = get("ask").ok_or("exercise: needs ask= (what the engine computes)")?;
    if !QUANTITIES.contains(&ask) && !SPECIAL.contains(&ask) {
        return Err(format!(
            "exercise: ask must be one of {}, {}; got '{}'",
            QUANTITIES.join(", "),
            SPECIAL.join(", "),
            shown(ask)
        ));
    }
    if ask == "saving" && get("with").is_none() {
        return Err("exercise: ask=saving needs with= (the change whose saving is asked)".into());
    }
    if get("question").is_none_or(|q| q.trim().is_empty()) {
        return Err("exercise: needs question=\"…\"".into());
    }
    if let Some(t) = get("tolerance") {
        let x = knobs::number("tolerance", t.trim_end_matches('%')).map_err(|e| e.to_string())?;
        if !(0.0..=50.0).contains(&x) {
            return Err(format!(
                "exercise: tolerance must be 0 to 50 %, got {}",
                shown(t)
            ));
        }
    }
    if let Some(f) = get("format") {
        if f != "per-param" {
            return Err(format!(
                "exercise: format may only be per-param, got '{}'",
                shown(f)
            ));
        }
    }
    if let Some(sol) = get("solution") {
        if let Some(bad) = sol
            .split(',')
            .map(str::trim)
            .find(|q| !QUANTITIES.contains(q))
        {
            return Err(format!("exercise: unknown solution step '{}'", shown(bad)));
        }
    }
    Ok(())
}

/// The engine scenario the attributes describe (widget-only attributes and `scope` aside);
/// the engine validates it and its message names the attribute.
fn scenario_of(attrs: &[(String, String)]) -> Result<Value, String> {
    let knobs = attrs
        .iter()
        .filter(|(k, _)| knobs::KNOBS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()));
    knobs::scenario_value(knobs).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_directives_with_lines_and_attributes() {
        let src = "# Title\n\nText {{#gpumem value activations preset=llama3.2-1b batch=4}} more.\n\n{{#gpumem allocator preset=llama3.1-8b batch=1 seq=2k precision=bf16 gpu=\"A100-80GB\"}}\n";
        let d = parse_chapter(src).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].widget, "value");
        assert_eq!(d[0].positional, vec!["activations"]);
        assert_eq!(d[0].line, 3);
        assert_eq!(d[1].line, 5);
        assert_eq!(d[1].scenario["seq"], 2048);
        assert_eq!(d[1].scenario["gpu"], "A100-80GB");
        assert_eq!(&src[d[1].span.clone()][..9], "{{#gpumem");
    }

    #[test]
    fn code_and_escapes_are_left_alone() {
        let src = "```md\n{{#gpumem allocator nonsense=1}}\n```\n\n    {{#gpumem bogus}}\n\nInline `{{#gpumem bogus}}` and \\{{#gpumem bogus}} stay.\n";
        assert_eq!(parse_chapter(src).unwrap(), vec![]);
    }

    #[test]
    fn errors_name_the_line_and_what_is_wrong() {
        let src = "a\n{{#gpumem alocator}}\nb\n{{#gpumem allocator batch=0}}\n{{#gpumem allocator colour=red}}\n{{#gpumem zero preset=no-such}}\n{{#gpumem value}}\n{{#gpumem allocator seq=\"4096}}\n";
        let errs = parse_chapter(src).unwrap_err();
        let msgs: Vec<String> = errs.iter().map(|e| e.at("book/x.md")).collect();
        assert!(
            msgs[0].starts_with("book/x.md:2: unknown widget 'alocator'"),
            "{msgs:?}"
        );
        assert!(msgs[1].starts_with("book/x.md:4: batch:"), "{msgs:?}");
        assert!(
            msgs[2].contains("book/x.md:5: allocator: unknown attribute 'colour'"),
            "{msgs:?}"
        );
        assert!(
            msgs[3].contains("book/x.md:6: model: unknown preset"),
            "{msgs:?}"
        );
        assert!(
            msgs[4].contains("book/x.md:7: value: needs 1 quantity"),
            "{msgs:?}"
        );
        assert!(msgs[5].contains("book/x.md:8:"), "{msgs:?}");
        assert_eq!(msgs.len(), 6);
    }

    #[test]
    fn unclosed_directive_is_an_error() {
        let e = parse_chapter("x\n\n{{#gpumem allocator batch=1\n").unwrap_err();
        assert_eq!(e[0].line, 3);
        assert!(e[0].message.contains("not closed"));
    }

    #[test]
    fn hostile_values_are_refused_and_long_ones_shortened() {
        // Markup in a value is just an unknown name: the directive is refused.
        let src = "{{#gpumem allocator gpu=\"<script>alert(1)</script>\"}}";
        let e = parse_chapter(src).unwrap_err();
        assert!(e[0].message.starts_with("gpu: unknown GPU"), "{e:?}");
        // A long value is not echoed whole into the build log.
        let long = format!("{{{{#gpumem allocator colour{}=1}}}}", "x".repeat(5000));
        let e = parse_chapter(&long).unwrap_err();
        assert!(e[0].message.len() < 400);
    }

    #[test]
    fn capacity_and_parallel_attributes_map_onto_the_scenario() {
        let d = parse_chapter("{{#gpumem zero preset=llama3.1-70b dp=64 zero-stage=3 capacity=80 references=H100-80GB,A100-40GB}}").unwrap();
        assert_eq!(d[0].scenario["parallel"]["dp"], 64);
        assert_eq!(d[0].scenario["parallel"]["zero"], 3);
        assert_eq!(d[0].scenario["gpu"]["capacity_bytes"], 85899345920.0);
        let e = parse_chapter("{{#gpumem zero zero-stage=5}}").unwrap_err();
        assert!(e[0].message.starts_with("zero-stage:"), "{:?}", e);
    }
}
