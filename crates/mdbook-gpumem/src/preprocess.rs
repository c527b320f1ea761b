//! Directives → pre-rendered widgets, and the mdBook binding.

use std::collections::BTreeMap;
use std::path::Path;

use gpumem_widgets::{Init, Knobs};
use mdbook_preprocessor::book::{Book, BookItem};
use mdbook_preprocessor::errors::{Error, Result};
use mdbook_preprocessor::{Preprocessor, PreprocessorContext};

use crate::{parse_chapter, Directive};

use gpumem_widgets::INLINE;

/// Expand every directive of one chapter into its widget's HTML. `file` names the chapter in
/// errors (`book/intro.md`); every problem is reported, each as `FILE:LINE: what is wrong`.
pub fn preprocess(file: &str, src: &str) -> std::result::Result<String, Vec<String>> {
    preprocess_at(Path::new("."), file, src)
}

/// [`preprocess`] for a book whose root (where `tests/data` is) is `root`.
pub fn preprocess_at(
    root: &Path,
    file: &str,
    src: &str,
) -> std::result::Result<String, Vec<String>> {
    let directives =
        parse_chapter(src).map_err(|errs| errs.iter().map(|e| e.at(file)).collect::<Vec<_>>())?;
    let mut errors = Vec::new();
    // The chapter's name for its widgets' state and element ids: unique across the book, so
    // that print.html (every chapter on one page) keeps each chapter's own.
    let chapter = page_id(file);

    // The page's knobs: every page-scoped widget's, which must agree.
    let mut page = Knobs::default();
    let mut set_at: BTreeMap<String, usize> = BTreeMap::new();
    for d in directives.iter().filter(|d| !is_local(d)) {
        for (k, v) in knobs_of(d).0 {
            match page.0.get(&k) {
                Some(prev) if *prev != v => errors.push(format!(
                    "{file}:{}: {k}={v} contradicts {k}={prev} on line {} (widgets on a page share \
                     one scenario; give this one scope=local to stand alone)",
                    d.line, set_at[&k]
                )),
                Some(_) => {}
                None => {
                    set_at.insert(k.clone(), d.line);
                    page.0.insert(k, v);
                }
            }
        }
    }

    let mut out = src.to_string();
    for (n, d) in directives.iter().enumerate().rev() {
        let inline = INLINE.contains(&d.widget.as_str());
        if !inline && !alone_on_line(src, d) {
            errors.push(format!(
                "{file}:{}: the {} widget is a block: put its directive on a line of its own",
                d.line, d.widget
            ));
            continue;
        }
        if d.widget == "validation" {
            let data = d
                .attrs
                .iter()
                .find(|(k, _)| k == "data")
                .map_or(crate::validation::DEFAULT_DATA, |(_, v)| v.as_str());
            match crate::validation::render(root, data) {
                Ok(html) => out.replace_range(d.span.clone(), &format!("\n\n{html}\n\n")),
                Err(e) => errors.push(format!("{file}:{}: {e}", d.line)),
            }
            continue;
        }
        let init = Init {
            widget: d.widget.clone(),
            uid: format!("{chapter}-{}", n + 1),
            page: chapter.clone(),
            knobs: if is_local(d) {
                knobs_of(d)
            } else {
                page.clone()
            },
            options: d
                .attrs
                .iter()
                .filter(|(k, _)| !gpumem::knobs::KNOBS.contains(&k.as_str()) && k != "scope")
                .cloned()
                .chain(
                    d.positional
                        .first()
                        .map(|q| ("quantity".to_string(), q.clone())),
                )
                .collect(),
            local: is_local(d),
        };
        let replayed = d.widget == "value"
            && d.positional
                .first()
                .is_some_and(|q| crate::REPLAYED.contains(&q.as_str()));
        if replayed {
            // Computed here, with the caching allocator replayed, and kept as drawn.
            let k = if is_local(d) {
                knobs_of(d)
            } else {
                page.clone()
            };
            let q = d.positional[0].as_str();
            let format = d
                .attrs
                .iter()
                .find(|(k, _)| k == "format")
                .map_or("gib", |(_, v)| v.as_str());
            match gpumem::knobs::scenario(k.0.iter().map(|(a, b)| (a.as_str(), b.as_str())))
                .and_then(|s| gpumem::estimate(&s))
            {
                Ok(e) => out.replace_range(
                    d.span.clone(),
                    &format!(
                        "<span class=\"gm-value gm-built\" data-quantity=\"{q}\">{}</span>",
                        gpumem_widgets::quantity::show(&e, q, format)
                    ),
                ),
                Err(e) => errors.push(format!("{file}:{}: {e}", d.line)),
            }
            continue;
        }
        if d.widget == "segments" {
            // A figure drawn for the page's scenario as the book is built (no host: the
            // browser does not redraw it).
            match gpumem_widgets::render(&init) {
                Ok(html) => out.replace_range(d.span.clone(), &format!("\n\n{html}\n\n")),
                Err(e) => errors.push(format!("{file}:{}: {e}", d.line)),
            }
            continue;
        }
        match gpumem_widgets::host_html(&init) {
            Ok(html) if inline => out.replace_range(d.span.clone(), &html),
            // The formula goes to KaTeX (which runs after this preprocessor; `number_formulas`
            // tags it); the widget below it substitutes the current numbers.
            Ok(html) if d.widget == "formula" => {
                let q = d.positional.first().map(String::as_str).unwrap_or("");
                let tex = gpumem_widgets::quantity::tex(q).unwrap_or("");
                out.replace_range(d.span.clone(), &format!("\n\n$$\n{tex}\n$$\n\n{html}\n\n"))
            }
            // Blank lines around it: markdown keeps the widget as one raw HTML block.
            Ok(html) => out.replace_range(d.span.clone(), &format!("\n\n{html}\n\n")),
            Err(e) => errors.push(format!("{file}:{}: {e}", d.line)),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        errors.sort_by_key(|e| line_number(e));
        Err(errors)
    }
}

/// Number every display formula of a chapter (`$$` on a line of its own, to the next such
/// line, outside code fences) in order: `\tag{3.1}`, `\tag{3.2}`, … in chapter 3, `\tag{1}`, …
/// in an unnumbered one. A formula that already carries a `\tag` keeps it and takes no number.
pub fn number_formulas(src: &str, chapter: Option<&str>) -> String {
    let mut out = String::with_capacity(src.len() + 64);
    let (mut fence, mut in_math, mut tagged, mut n) = (None::<String>, false, false, 0);
    for line in src.split_inclusive('\n') {
        let t = line.trim();
        if !in_math {
            if let Some(f) = &fence {
                if t.starts_with(f.as_str()) {
                    fence = None;
                }
            } else if t.starts_with("```") || t.starts_with("~~~") {
                fence = Some(t[..3].to_string());
            } else if t == "$$" {
                in_math = true;
                tagged = false;
            }
            out.push_str(line);
            continue;
        }
        if t == "$$" {
            in_math = false;
            if !tagged {
                n += 1;
                let tag = match chapter {
                    Some(c) => format!("{c}.{n}"),
                    None => n.to_string(),
                };
                out.push_str(&format!("\\tag{{{tag}}}\n"));
            }
        } else if t.contains("\\tag{") {
            tagged = true;
        }
        out.push_str(line);
    }
    out
}

/// How a section is cited: the book's title and authors (an organisation), the year, the
/// version and build date, and the address the site is published at (empty: addresses
/// relative to the site, which the page fills in with its own address once it is open).
#[derive(Clone, Debug, Default)]
pub struct Citation {
    pub book: String,
    pub authors: String,
    pub year: String,
    pub url: String,
    /// The book's version (`cite-version`, or the preprocessor's).
    pub version: String,
    /// The day the book was built (YYYY-MM-DD): the version's date, and the access date
    /// until the page says the day it is read.
    pub built: String,
}

/// A day as YYYY-MM-DD, from seconds since 1970 (UTC; Howard Hinnant's civil-from-days).
pub fn date(unix_seconds: u64) -> String {
    let z = (unix_seconds / 86400) as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Today (or `SOURCE_DATE_EPOCH`'s day, for reproducible builds).
pub fn build_date() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        });
    date(secs)
}

/// After every `## Heading {#id}` (outside code fences), a "Cite this" box with the section's
/// reference as plain text and as BibTeX. `page` is the chapter's HTML file, `chapter` its
/// number and title. Every `##` must carry an explicit id: that is what keeps citations
/// stable when a heading's words change. The address and the access date are in spans the
/// page script fills in (`book/scripts/gpumem-page.js`).
pub fn cite_sections(
    src: &str,
    file: &str,
    page: &str,
    chapter: &str,
    c: &Citation,
) -> std::result::Result<String, Vec<String>> {
    let mut out = String::with_capacity(src.len() * 2);
    let mut errors = Vec::new();
    let mut fence = false;
    let year = if c.year.is_empty() {
        c.built.get(..4).unwrap_or("").to_string()
    } else {
        c.year.clone()
    };
    for (i, line) in src.split_inclusive('\n').enumerate() {
        out.push_str(line);
        let t = line.trim_end();
        if t.starts_with("```") || t.starts_with("~~~") {
            fence = !fence;
        }
        if fence || !t.starts_with("## ") {
            continue;
        }
        let Some((title, id)) = t[3..]
            .rsplit_once("{#")
            .and_then(|(title, rest)| Some((title.trim(), rest.strip_suffix('}')?)))
        else {
            errors.push(format!(
                "{file}:{}: give this section a stable id to cite: `{t} {{#some-id}}`",
                i + 1
            ));
            continue;
        };
        let rel = format!("{page}#{id}");
        let href = format!("{}{rel}", c.url);
        let key = format!("gpumem-{}-{id}", page.trim_end_matches(".html"));
        let url = format!("<span class=\"gm-cite-url\">{}</span>", esc(&href));
        let day = format!("<span class=\"gm-cite-date\">{}</span>", esc(&c.built));
        // The book's own opening page (named as the book) is not a chapter of it.
        let (in_chapter, chapter_of) = if chapter == c.book {
            (String::new(), String::new())
        } else {
            (format!(", {}", esc(chapter)), format!("{}, ", esc(chapter)))
        };
        let plain = format!(
            "{}. “{}”. In <cite>{}</cite>{in_chapter}. Version {}, built {}. {url} (accessed {day}).",
            esc(&c.authors),
            esc(title),
            esc(&c.book),
            esc(&c.version),
            esc(&c.built)
        );
        let bib = format!(
            "@misc{{{key},\n  author = {{{{{}}}}},\n  title = {{{{{}}}: {chapter_of}{}}},\n  year = {{{year}}},\n  version = {{{}}},\n  url = {{{url}}},\n  urldate = {{{day}}},\n  note = {{Built {}}}\n}}",
            esc(&c.authors),
            esc(&c.book),
            esc(title),
            esc(&c.version),
            esc(&c.built)
        );
        out.push_str(&format!(
            "\n<details class=\"gm-cite\" data-href=\"{}\"><summary>Cite this section</summary><p>{plain}</p><pre><code class=\"nohighlight\">{bib}</code></pre></details>\n\n",
            esc(&rel).replace('"', "&quot;")
        ));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn line_number(msg: &str) -> usize {
    msg.split(':')
        .nth(1)
        .and_then(|l| l.parse().ok())
        .unwrap_or(0)
}

/// `book/budget.md` → `budget`; `book/a/b.md` → `a-b`: the path below the book's source
/// directory, in letters, digits and dashes.
fn page_id(file: &str) -> String {
    let rel = file.split_once('/').map_or(file, |(_, rest)| rest);
    let rel = rel.strip_suffix(".md").unwrap_or(rel);
    let id: String = rel
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if id.is_empty() {
        "page".into()
    } else {
        id
    }
}

fn is_local(d: &Directive) -> bool {
    d.attrs.iter().any(|(k, v)| k == "scope" && v == "local")
}

fn knobs_of(d: &Directive) -> Knobs {
    Knobs(
        d.attrs
            .iter()
            .filter(|(k, _)| gpumem::knobs::KNOBS.contains(&k.as_str()))
            .cloned()
            .collect(),
    )
}

fn alone_on_line(src: &str, d: &Directive) -> bool {
    let start = src[..d.span.start].rfind('\n').map_or(0, |i| i + 1);
    let end = src[d.span.end..]
        .find('\n')
        .map_or(src.len(), |i| d.span.end + i);
    src[start..d.span.start].trim().is_empty() && src[d.span.end..end].trim().is_empty()
}

/// The mdBook preprocessor: `[preprocessor.gpumem]` in book.toml. Run it before `links` (so
/// that `\{{#gpumem …}}` stays an escape) and before `katex`.
pub struct GpumemPreprocessor;

impl Preprocessor for GpumemPreprocessor {
    fn name(&self) -> &str {
        "gpumem"
    }

    fn run(&self, ctx: &PreprocessorContext, mut book: Book) -> Result<Book> {
        let src_dir = ctx.config.book.src.clone();
        let opt = |k: &str| -> String {
            ctx.config
                .get::<String>(&format!("preprocessor.gpumem.{k}"))
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        let version = opt("cite-version");
        let cite = Citation {
            book: ctx.config.book.title.clone().unwrap_or_default(),
            authors: ctx.config.book.authors.join(" and "),
            year: opt("cite-year"),
            url: opt("cite-url"),
            version: if version.is_empty() {
                env!("CARGO_PKG_VERSION").to_string()
            } else {
                version
            },
            built: build_date(),
        };
        let mut errors = Vec::new();
        book.for_each_mut(|item| {
            let BookItem::Chapter(ch) = item else { return };
            let Some(path) = ch.source_path.as_ref() else {
                return;
            };
            let file = display_path(&src_dir.join(path));
            // "3." for chapter 3: formulas are (3.1), (3.2), …
            let number = ch
                .number
                .as_ref()
                .map(|n| n.to_string().trim_end_matches('.').to_string());
            // mdBook publishes a README.md as its directory's index.html.
            let page = if path
                .file_stem()
                .is_some_and(|f| f.eq_ignore_ascii_case("readme"))
            {
                path.with_file_name("index.html")
            } else {
                path.with_extension("html")
            }
            .to_string_lossy()
            .replace('\\', "/");
            let chapter = match &number {
                Some(n) => format!("chapter {n}, {}", ch.name),
                None => ch.name.clone(),
            };
            let done = preprocess_at(&ctx.root, &file, &ch.content)
                .and_then(|c| cite_sections(&c, &file, &page, &chapter, &cite));
            match done {
                Ok(c) => ch.content = number_formulas(&c, number.as_deref()),
                Err(mut e) => errors.append(&mut e),
            }
        });
        if errors.is_empty() {
            Ok(book)
        } else {
            Err(Error::msg(errors.join("\n")))
        }
    }

    fn supports_renderer(&self, renderer: &str) -> Result<bool> {
        Ok(renderer == "html")
    }
}

fn display_path(p: &Path) -> String {
    p.to_string_lossy().replace('\\', "/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directive_becomes_a_host_with_the_numbers() {
        let src = "# Budget\n\nText.\n\n{{#gpumem allocator preset=llama3.2-1b batch=2 seq=1k}}\n\nMore.\n";
        let out = preprocess("book/x.md", src).unwrap();
        assert!(
            out.contains(
                "<div class=\"gm-host\" data-gpumem=\"{&quot;widget&quot;:&quot;allocator&quot;"
            ),
            "{out}"
        );
        assert!(out.contains("data-widget=\"allocator\""));
        assert!(out.contains("llama3.2-1b · b=2 · s=1K"));
        assert!(out.starts_with("# Budget\n\nText.\n\n"));
        assert!(out.ends_with("\n\nMore.\n"));
        // One line: markdown keeps it as one HTML block.
        let host = out
            .lines()
            .find(|l| l.starts_with("<div class=\"gm-host\""))
            .unwrap();
        assert!(host.ends_with("</div>"));
    }

    #[test]
    fn page_widgets_share_knobs_and_contradictions_are_errors() {
        let src = "{{#gpumem allocator batch=2}}\n\n{{#gpumem allocator seq=4k}}\n";
        let out = preprocess("book/x.md", src).unwrap();
        assert_eq!(
            out.matches("b=2 · s=4K").count(),
            2,
            "both show the page's knobs"
        );
        let src = "{{#gpumem allocator batch=2}}\n\n{{#gpumem allocator batch=4}}\n\n{{#gpumem allocator batch=8 scope=local}}\n";
        let e = preprocess("book/x.md", src).unwrap_err();
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("book/x.md:3: batch=4 contradicts batch=2 on line 1"),
            "{e:?}"
        );
    }

    #[test]
    fn misplaced_unknown_and_unbuilt_widgets_fail_with_file_and_line() {
        let e = preprocess("book/x.md", "Some {{#gpumem allocator}} inline.\n").unwrap_err();
        assert!(
            e[0].starts_with("book/x.md:1: the allocator widget is a block"),
            "{e:?}"
        );
        let e = preprocess("book/x.md", "a\n\n{{#gpumem allocator batch=-1}}\n").unwrap_err();
        assert!(e[0].starts_with("book/x.md:3: batch:"), "{e:?}");
        let e = preprocess("book/x.md", "a\n\n{{#gpumem parallelism tp=3}}\n").unwrap_err();
        assert!(e[0].starts_with("book/x.md:3: tp:"), "{e:?}");
        let e =
            preprocess("book/x.md", "a\n\n{{#gpumem zero segments=\"INT4:x:3\"}}\n").unwrap_err();
        assert!(e[0].contains("segments: segment 1"), "{e:?}");
        let e = preprocess("book/x.md", "a\n\n{{#gpumem formula activations}}\n").unwrap_err();
        assert!(e[0].contains("has no closed form"), "{e:?}");
    }

    #[test]
    fn every_section_can_be_cited_by_its_stable_id() {
        let c = Citation {
            book: "Where GPU memory goes".into(),
            authors: "The gpumem project".into(),
            year: "2026".into(),
            url: String::new(),
            version: "0.1.0".into(),
            built: "2026-11-23".into(),
        };
        let src = "# Activations\n\n## Selective recomputation {#selective-recomputation}\n\ntext\n\n```\n## not a heading\n```\n";
        let out = cite_sections(
            src,
            "book/a.md",
            "activations.html",
            "chapter 4, Activations",
            &c,
        )
        .unwrap();
        assert_eq!(out.matches("<details class=\"gm-cite\"").count(), 1);
        assert!(out.contains("data-href=\"activations.html#selective-recomputation\""));
        assert!(out.contains(
            "<span class=\"gm-cite-url\">activations.html#selective-recomputation</span>"
        ));
        assert!(out.contains("@misc{gpumem-activations-selective-recomputation,"));
        assert!(out.contains("author = {{The gpumem project}}"), "{out}");
        assert!(out.contains(
            "The gpumem project. “Selective recomputation”. In <cite>Where GPU memory goes</cite>, chapter 4, Activations. Version 0.1.0, built 2026-11-23."
        ), "{out}");
        assert!(out.contains("urldate = {<span class=\"gm-cite-date\">2026-11-23</span>}"));
        // The opening page, named as the book, is not cited as a chapter of it.
        let out = cite_sections(src, "book/README.md", "index.html", &c.book, &c).unwrap();
        assert!(
            out.contains("In <cite>Where GPU memory goes</cite>. Version 0.1.0"),
            "{out}"
        );
        assert!(
            out.contains("title = {{Where GPU memory goes}: Selective recomputation}"),
            "{out}"
        );
        assert!(out.contains("@misc{gpumem-index-selective-recomputation,"));
        // Published: the pre-rendered text carries the absolute address.
        let published = Citation {
            url: "https://example.org/gpumem/".into(),
            ..c.clone()
        };
        let out = cite_sections(
            src,
            "book/a.md",
            "activations.html",
            "chapter 4",
            &published,
        )
        .unwrap();
        assert!(out.contains(
            "url = {<span class=\"gm-cite-url\">https://example.org/gpumem/activations.html#selective-recomputation</span>}"
        ), "{out}");
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(1_795_392_000), "2026-11-23");
        let e = cite_sections("## No id\n", "book/a.md", "a.html", "A", &c).unwrap_err();
        assert!(
            e[0].starts_with("book/a.md:1: give this section a stable id"),
            "{e:?}"
        );
    }

    #[test]
    fn formulas_are_numbered_and_go_to_katex_before_their_substitution() {
        let out = preprocess(
            "book/x.md",
            "a\n\n{{#gpumem formula weights}}\n\nb {{#gpumem value peak}} c\n\n{{#gpumem formula device}}\n",
        )
        .unwrap();
        let out = number_formulas(&out, Some("7"));
        let w = out.find("M_\\text{weights} = \\frac").unwrap();
        assert!(out[w..].contains("\\tag{7.1}"));
        assert!(out.contains("\\tag{7.2}"));
        let hand = "$$\na \\tag{x}\n$$\n\n```\n$$\n```\n\n$$\nb\n$$\n";
        let n = number_formulas(hand, None);
        assert_eq!(n.matches("\\tag{").count(), 2, "{n}");
        assert!(n.contains("b\n\\tag{1}\n$$"), "{n}");
        let host = out.find("data-widget=\"formula\"").unwrap();
        assert!(w < host, "the formula comes first");
        assert!(
            out.contains("b <span class=\"gm-host\""),
            "values stay in the sentence"
        );
    }
}
