//! The site end to end: built by the one command's library, served on 127.0.0.1, read by
//! headless Chromium. Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use gpumem_site::browser::Chrome;
use gpumem_site::{build, build_book, copy_dir, serve, Paths};
use gpumem_widgets::format::gib;
use serde_json::json;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Build the site once for all tests, into its own directory.
fn site() -> &'static Paths {
    static SITE: OnceLock<Paths> = OnceLock::new();
    SITE.get_or_init(|| {
        let root = root();
        let dest = root.join("target/test-site");
        let p = Paths::new(root, Some(dest));
        build(&p).unwrap_or_else(|e| panic!("site build failed: {e}"));
        p
    })
}

/// Serve the site on a free port; returns the base URL.
fn served() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = site().dest.clone();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            serve::serve_dir(listener, dir, Arc::new(AtomicU64::new(1)), false)
        });
        url
    })
}

/// A chapter's address: its name ("zero"), or a path with its query ("zero.html?zero-stage=3").
fn page_url(page: &str) -> String {
    if page.contains('.') {
        format!("{}/{page}", served())
    } else {
        format!("{}/{page}.html", served())
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The allocator widget's numbers for the first chapter's scenario, as the engine computes
/// them for the widgets (the caching allocator not replayed).
fn budget_estimate() -> gpumem::Estimate {
    gpumem::knobs::scenario([
        ("model", "llama3.1-8b"),
        ("batch", "1"),
        ("seq", "2k"),
        ("precision", "bf16"),
        ("allocator", "none"),
    ])
    .and_then(|s| gpumem::estimate(&s))
    .unwrap()
}

#[test]
fn pages_carry_the_numbers_before_any_script_runs() {
    let html = read(&site().dest.join("budget.html"));
    // Without scripts the page says its widgets are as built and their controls inert.
    assert!(html.contains(r#"<noscript><p class="gm-nojs">JavaScript is off"#));
    // …and only where there are widgets: a page without any hides that note, by CSS alone
    // (checked in Chromium with scripts off: hidden on index and references, shown here).
    let index = read(&site().dest.join("index.html"));
    assert!(index.contains("main:not(:has(.gm)) .gm-nojs { display: none; }"));
    assert!(!index.contains(r#"class="gm "#) && html.contains(r#"class="gm "#));
    // An exercise names the model its answer is for: ZeRO's page sets 7B parameters, no preset.
    let zero = read(&site().dest.join("zero.html"));
    assert!(zero.contains(r#"gm-sub">7B · b=1 · s=2K · with dp=8, zero-stage=2"#));
    let e = budget_estimate();
    assert!(html.contains(r#"data-widget="allocator""#));
    assert!(html.contains(&gib(e.device_bytes as f64)), "total");
    assert!(
        html.contains(&gib(e.components["activations"] as f64)),
        "activations"
    );
    assert!(html.contains(&gib(e.components["logits"] as f64)), "logits");
    // The headroom as the bar states it: capacity and total in the same rounding.
    let (cap, total) = (e.capacity_bytes as f64, e.device_bytes as f64);
    let sum = gpumem_widgets::format::Sum::of(total.max(cap));
    let gap = sum.show(sum.units(cap) - sum.units(total));
    assert!(html.contains(&format!("{gap} headroom")), "{gap}");
    // KaTeX typeset at build time, styled from the site itself.
    assert!(html.contains(r#"class="katex""#));
    assert!(html.contains(r#"href="katex/katex.min.css""#));
    assert!(site()
        .dest
        .join("katex/fonts/KaTeX_Main-Regular.woff2")
        .is_file());
    // One bundle for every widget.
    assert!(site().dest.join("gpumem/gpumem_widgets_bg.wasm").is_file());
    assert!(
        !site().dest.join("theme").exists(),
        "templates are not published"
    );
}

#[test]
fn nothing_in_the_site_points_at_another_host() {
    let mut stack = vec![site().dest.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or("");
            if !["html", "css", "js"].contains(&ext) {
                continue;
            }
            let text = read(&p);
            // Links out (to the papers cited) are fine; loading anything from elsewhere is not.
            for tag in text.split("<link").skip(1) {
                let tag = &tag[..tag.find('>').unwrap_or(tag.len())];
                assert!(
                    !tag.contains("href=\"http"),
                    "{}: loads from another host (<link{tag}>)",
                    p.display()
                );
            }
            for needle in [
                "src=\"http",
                "url(http",
                "url(\"http",
                "url('http",
                "@import \"http",
            ] {
                assert!(
                    !text.contains(needle),
                    "{}: refers to another host ({needle})",
                    p.display()
                );
            }
        }
    }
}

/// Every "Cite this section" names a page the site has and an anchor on it (the opening
/// page's pointed at README.html, which mdBook publishes as index.html), and the opening
/// page is not cited as a chapter of the book it opens.
#[test]
fn every_citation_points_at_a_page_and_section_the_site_has() {
    let dest = &site().dest;
    let mut cited = 0;
    for e in std::fs::read_dir(dest).unwrap().flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("html") || p.ends_with("print.html") {
            continue;
        }
        let text = read(&p);
        for tag in text
            .split("<details class=\"gm-cite\" data-href=\"")
            .skip(1)
        {
            let href = &tag[..tag.find('"').unwrap()];
            let (page, id) = href.split_once('#').expect("a section anchor");
            let target = read(&dest.join(page));
            assert!(
                target.contains(&format!("id=\"{id}\"")),
                "{}: cites {href}, which has no such section",
                p.display()
            );
            cited += 1;
        }
        assert!(
            !text.contains("In <cite>Where GPU memory goes</cite>, Where GPU memory goes"),
            "{}",
            p.display()
        );
    }
    assert!(cited > 40, "{cited} citations");
    let index = read(&dest.join("index.html"));
    assert!(
        index.contains("data-href=\"index.html#"),
        "the opening page cites itself"
    );
}

#[test]
fn a_bad_directive_fails_the_build_with_file_and_line_and_keeps_the_old_site() {
    let tmp = std::env::temp_dir().join(format!("gpumem-badbook-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("book")).unwrap();
    std::fs::copy(root().join("book.toml"), tmp.join("book.toml")).unwrap();
    std::fs::create_dir_all(tmp.join("book/theme")).unwrap();
    std::fs::copy(
        root().join("book/theme/head.hbs"),
        tmp.join("book/theme/head.hbs"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.join("widgets")).unwrap();
    std::fs::copy(
        root().join("widgets/gpumem.css"),
        tmp.join("widgets/gpumem.css"),
    )
    .unwrap();
    std::fs::write(
        tmp.join("book/SUMMARY.md"),
        "# Summary\n\n- [Bad](bad.md)\n",
    )
    .unwrap();
    std::fs::write(
        tmp.join("book/bad.md"),
        "# Bad\n\n{{#gpumem allocator batch=0}}\n\n{{#gpumem alocator}}\n",
    )
    .unwrap();
    // The previous good site.
    let dest = tmp.join("site");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("index.html"), "previous").unwrap();
    let p = Paths {
        root: tmp.clone(),
        target: site().target.clone(),
        dest: dest.clone(),
    };
    let err = build_book(&p).unwrap_err().to_string();
    assert!(err.contains("book/bad.md:3: batch:"), "{err}");
    assert!(
        err.contains("book/bad.md:5: unknown widget 'alocator'"),
        "{err}"
    );
    assert_eq!(read(&dest.join("index.html")), "previous");
    let leftovers: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        leftovers
            .iter()
            .all(|n| !n.to_string_lossy().contains("staging")),
        "no half-written site left: {leftovers:?}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn a_build_cleans_what_killed_builds_left_behind() {
    let tmp = std::env::temp_dir().join(format!("gpumem-stale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(tmp.join("book/theme")).unwrap();
    std::fs::copy(root().join("book.toml"), tmp.join("book.toml")).unwrap();
    std::fs::copy(
        root().join("book/theme/head.hbs"),
        tmp.join("book/theme/head.hbs"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.join("widgets")).unwrap();
    std::fs::copy(
        root().join("widgets/gpumem.css"),
        tmp.join("widgets/gpumem.css"),
    )
    .unwrap();
    std::fs::write(
        tmp.join("book/SUMMARY.md"),
        "# Summary\n\n- [One](one.md)\n",
    )
    .unwrap();
    std::fs::write(tmp.join("book/one.md"), "# One\n\nText.\n").unwrap();
    let dest = tmp.join("site");
    // What builds killed mid-way leave (no process has an id this large), and what a build
    // still running in another process has (this process's parent: alive).
    let parent_pid = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or(1);
    for stale in [
        "site.staging-999999999",
        "site.old-999999998",
        &format!("site.staging-{parent_pid}"),
    ] {
        std::fs::create_dir_all(tmp.join(stale).join("gpumem")).unwrap();
        std::fs::write(tmp.join(stale).join("index.html"), "half").unwrap();
    }
    std::fs::create_dir_all(tmp.join("site.notes")).unwrap();
    let p = Paths {
        root: tmp.clone(),
        target: site().target.clone(),
        dest: dest.clone(),
    };
    build_book(&p).unwrap_or_else(|e| panic!("{e}"));
    let mut left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "book",
            "book.toml",
            "site",
            "site.notes",
            &format!("site.staging-{parent_pid}"),
            "widgets"
        ],
        "the killed builds' directories are gone, a live build's and others are kept"
    );
    assert!(read(&dest.join("one.html")).contains("Text."));
    // Killed between moving the old site away and the new one in: the old site comes back
    // before the next build, which keeps it if it fails.
    std::fs::rename(&dest, tmp.join("site.old-999999997")).unwrap();
    std::fs::write(
        tmp.join("book/one.md"),
        "# One\n\n{{#gpumem allocator batch=0}}\n",
    )
    .unwrap();
    assert!(build_book(&p).is_err());
    assert!(read(&dest.join("one.html")).contains("Text."));
    assert!(!tmp.join("site.old-999999997").exists());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Wait until the allocator runs in the browser (rendered live and listening).
fn wait_live(c: &Chrome) {
    c.wait_for(
        "return document.querySelector('[data-widget=allocator][data-live]') !== null",
        Duration::from_secs(20),
    )
    .unwrap();
}

const LEGEND: &str = r#"return [...document.querySelectorAll('[data-widget=allocator] .gm-legend li')].map(li => li.dataset.bucket + '=' + li.querySelector('.gm-num').textContent).join(' ');"#;
const VERDICT: &str =
    r#"return document.querySelector('[data-widget=allocator] [data-value=verdict]').textContent;"#;

#[test]
fn in_the_browser_the_widget_goes_live_and_follows_its_controls() {
    let url = format!("{}/budget.html", served());
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&url).unwrap();
    wait_live(&c);
    let e = budget_estimate();
    let before = c.eval(LEGEND, json!([])).unwrap();
    assert!(
        before.as_str().unwrap().contains(&format!(
            "activations={}",
            gib(e.components["activations"] as f64)
        )),
        "{before}"
    );
    let verdict = c.eval(VERDICT, json!([])).unwrap();
    assert!(verdict.as_str().unwrap().contains("headroom"), "{verdict}");

    // The batch slider, by keyboard: 1 → 8, one whole number per key (the track is a log
    // scale; the keys reach every number on it).
    let slider = c.find("[data-widget=allocator] input[id$=-batch]").unwrap();
    c.send_keys(&slider, &"\u{E014}".repeat(7)).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=allocator] input[id$=-batch]').getAttribute('aria-valuenow') === '8'",
        Duration::from_secs(5),
    )
    .unwrap();
    let b8 = gpumem::knobs::scenario([
        ("model", "llama3.1-8b"),
        ("batch", "8"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ])
    .and_then(|s| gpumem::estimate(&s))
    .unwrap();
    let after = c.eval(LEGEND, json!([])).unwrap();
    assert_ne!(before, after);
    assert!(
        after.as_str().unwrap().contains(&format!(
            "activations={}",
            gib(b8.components["activations"] as f64)
        )),
        "{after}"
    );
    let verdict = c.eval(VERDICT, json!([])).unwrap();
    assert!(
        verdict.as_str().unwrap().contains("exceeds H100-80GB by"),
        "{verdict}"
    );
    let summary = c.eval("return document.querySelector('[data-widget=allocator] [aria-live=polite]').textContent", json!([])).unwrap();
    assert!(
        summary.as_str().unwrap().contains("batch 8"),
        "the live region tells: {summary}"
    );

    // Precision pills: a radiogroup driven by arrows.
    let checked = c
        .find("[data-widget=allocator] [role=radio][aria-checked=true]")
        .unwrap();
    c.send_keys(&checked, "\u{E014}").unwrap();
    c.wait_for("var el = document.activeElement; return el && el.getAttribute('role') === 'radio' && el.getAttribute('aria-checked') === 'true' && el.textContent === 'Mixed BF16'", Duration::from_secs(5))
        .unwrap();
    // The arrow stayed in the radiogroup: mdBook did not turn the page.
    let here = c.eval("return location.pathname", json!([])).unwrap();
    assert!(here.as_str().unwrap().ends_with("/budget.html"), "{here}");
    let sub = c
        .eval(
            "return document.querySelector('[data-widget=allocator] .gm-sub').textContent",
            json!([]),
        )
        .unwrap();
    assert!(sub.as_str().unwrap().ends_with("Mixed BF16"), "{sub}");

    // No request left 127.0.0.1, and the console is clean.
    let urls = c
        .eval(
            "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]",
            json!([]),
        )
        .unwrap();
    for u in urls.as_array().unwrap() {
        assert!(u.as_str().unwrap().starts_with(served()), "request to {u}");
    }
    assert!(urls.to_string().contains("gpumem_widgets_bg.wasm"));
    let console = c.console().unwrap();
    let bad: Vec<_> = console
        .iter()
        .filter(|m| m["level"] == "SEVERE" || m["level"] == "WARNING")
        .collect();
    assert!(bad.is_empty(), "console: {bad:?}");

    // Every theme: the widget takes the theme's colours. Screenshots go to target/screenshots.
    let shots = root().join("target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let mut backgrounds = Vec::new();
    for theme in ["light", "rust", "coal", "navy", "ayu"] {
        c.eval(
            "localStorage.setItem('mdbook-theme', arguments[0]); return true",
            json!([theme]),
        )
        .unwrap();
        c.goto(&url).unwrap();
        wait_live(&c);
        let colours = c.eval("var s = getComputedStyle(document.querySelector('[data-widget=allocator]')); return [s.backgroundColor, s.color, getComputedStyle(document.body).color]", json!([])).unwrap();
        assert_eq!(
            colours[1], colours[2],
            "{theme}: the widget's text is the theme's"
        );
        backgrounds.push(colours[0].clone());
        std::fs::write(
            shots.join(format!("budget-{theme}.png")),
            c.screenshot().unwrap(),
        )
        .unwrap();
    }
    backgrounds.dedup();
    assert!(
        backgrounds.len() >= 4,
        "themes change the widget: {backgrounds:?}"
    );
}

#[test]
fn outside_scripts_drive_the_page_and_hostile_knobs_are_refused_under_any_base_path() {
    // Serve the site one level down, as a static host under a base path would. (A copy: the
    // server follows no link out of the directory it serves.)
    let parent = std::env::temp_dir().join(format!("gpumem-base-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir_all(parent.join("docs")).unwrap();
    copy_dir(&site().dest, &parent.join("docs/gpumem")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let dir = parent.clone();
    std::thread::spawn(move || serve::serve_dir(listener, dir, Arc::new(AtomicU64::new(1)), false));

    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{base}/docs/gpumem/budget.html")).unwrap();
    wait_live(&c);
    // Changes are announced; a reader's script can set knobs.
    c.eval("window.seen = []; document.addEventListener('gpumem:change', e => window.seen.push(e.detail)); \
            document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 4, seq: '4k'}})); return true", json!([]))
        .unwrap();
    c.wait_for("return document.querySelector('[data-widget=allocator] .gm-sub').textContent.includes('b=4 · s=4K')", Duration::from_secs(5))
        .unwrap();
    let seen = c.eval("return window.seen", json!([])).unwrap();
    assert_eq!(seen[0]["batch"], "4", "{seen}");
    // Markup or nonsense is data: refused, nothing injected, the page's knobs kept.
    c.eval("document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {model: '<img src=x onerror=\"window.pwned=1\">'}})); \
            document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: -3}})); \
            document.dispatchEvent(new CustomEvent('gpumem:set', {detail: 'batch=9'})); return true", json!([]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let state = c.eval("return [document.querySelector('[data-widget=allocator] .gm-sub').textContent, window.pwned === undefined, document.querySelectorAll('img[src=x]').length]", json!([])).unwrap();
    assert!(state[0].as_str().unwrap().contains("b=4 · s=4K"), "{state}");
    assert_eq!(state[1], true);
    assert_eq!(state[2], 0);
    let warnings: Vec<String> = c
        .console()
        .unwrap()
        .iter()
        .map(|m| m["message"].to_string())
        .collect();
    assert_eq!(
        warnings
            .iter()
            .filter(|m| m.contains("gpumem:set refused"))
            .count(),
        3,
        "{warnings:?}"
    );
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_huge_gpumem_set_is_refused_at_once_and_the_page_still_responds() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html", served())).unwrap();
    wait_live(&c);
    // 20,000 keys (all but one unknown): refused on the count, before any is applied. Timing
    // is for the notes (it froze the page 13 s before); here it must simply come back.
    let took = c
        .eval(
            "var d = {batch: 3}; for (var i = 0; i < 20000; i++) d['k' + i] = i; \
             var t = performance.now(); \
             document.dispatchEvent(new CustomEvent('gpumem:set', {detail: d})); \
             return performance.now() - t",
            json!([]),
        )
        .unwrap();
    eprintln!("gpumem:set with 20,001 keys handled in {took} ms");
    // Unknown keys are refused before any engine work, the knobs named.
    c.eval(
        "document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 3, bogus: 1}})); return true",
        json!([]),
    )
    .unwrap();
    let warnings: Vec<String> = c
        .console()
        .unwrap()
        .iter()
        .map(|m| m["message"].to_string())
        .filter(|m| m.contains("gpumem:set refused"))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("20001 keys; a gpumem:set carries at most 256"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("'bogus' is not a knob"),
        "{warnings:?}"
    );
    // Nothing applied, and the page answers the next set.
    let sub = "return document.querySelector('[data-widget=allocator] .gm-sub').textContent";
    assert!(c
        .eval(sub, json!([]))
        .unwrap()
        .as_str()
        .unwrap()
        .contains("b=1 · s=2K"));
    c.eval(
        "document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 6}})); return true",
        json!([]),
    )
    .unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=allocator] .gm-sub').textContent.includes('b=6 · s=2K')",
        Duration::from_secs(10),
    )
    .unwrap();
}

#[test]
fn an_over_long_link_is_refused_with_a_notice() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    let long = "x".repeat(9000);
    c.goto(&format!("{}/budget.html?batch=2&note={long}", served()))
        .unwrap();
    wait_live(&c);
    let got = c
        .eval(
            "return [(document.querySelector('.gm-notice[role=alert]') || {}).textContent, \
             document.querySelector('[data-widget=allocator] .gm-sub').textContent]",
            json!([]),
        )
        .unwrap();
    let notice = got[0].as_str().unwrap_or("");
    assert!(
        notice.contains("not applied") && notice.contains("longer than 8 KiB"),
        "{got}"
    );
    assert!(
        got[1].as_str().unwrap().contains("b=1 · s=2K"),
        "the page's own state: {got}"
    );
}

/// The engine's figure for the budget page's scenario with some knobs changed, as the widgets
/// show it (the caching allocator not replayed).
fn budget_with(changes: &[(&str, &str)]) -> gpumem::Estimate {
    let mut k = vec![
        ("model", "llama3.1-8b"),
        ("batch", "1"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ];
    for (key, v) in changes {
        k.retain(|(a, _)| a != key);
        k.push((key, v));
    }
    widget_estimate(gpumem::knobs::scenario(k).unwrap())
}

/// The estimate a widget shows for a scenario: the caching allocator is not replayed in the
/// browser (nor, for the widgets, when the book is built).
fn widget_estimate(mut s: gpumem::Scenario) -> gpumem::Estimate {
    s.allocator.replay = false;
    gpumem::estimate(&s).unwrap()
}

#[test]
fn widgets_share_one_state_that_the_url_carries() {
    let page = format!("{}/budget.html", served());
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    // A permalink: its knobs override the page's.
    c.goto(&format!(
        "{page}?batch=4&seq=4k#why-the-peak-is-not-the-sum"
    ))
    .unwrap();
    wait_live(&c);
    c.wait_for(
        "return document.querySelectorAll('.gm[data-live], .gm-value[data-live]').length >= 9",
        Duration::from_secs(20),
    )
    .unwrap();
    let e4 = budget_with(&[("batch", "4"), ("seq", "4k")]);
    let sub = c
        .eval(
            "return document.querySelector('[data-widget=allocator] .gm-sub').textContent",
            json!([]),
        )
        .unwrap();
    assert!(sub.as_str().unwrap().contains("b=4 · s=4K"), "{sub}");
    c.wait_for(
        &format!(
            "return document.querySelector('[data-widget=value][data-quantity=activations]').textContent === '{}'",
            gib(e4.components["activations"] as f64)
        ),
        Duration::from_secs(5),
    )
    .unwrap();

    // One slider moves every widget on the page, and the URL follows.
    let slider = c.find("[data-widget=allocator] input[id$=-batch]").unwrap();
    c.send_keys(&slider, "\u{E014}").unwrap();
    let e5 = budget_with(&[("batch", "5"), ("seq", "4k")]);
    c.wait_for(
        &format!(
            "return document.querySelector('[data-widget=value][data-quantity=activations]').textContent === '{}'",
            gib(e5.components["activations"] as f64)
        ),
        Duration::from_secs(5),
    )
    .unwrap();
    // Every widget follows (those off screen once the slider rests).
    c.wait_for(
        &format!(
            "return document.querySelector('[data-widget=timeline] [data-value=peak]').textContent.includes('Peak {}') \
             && document.querySelector('[data-widget=breakdown] .gm-sub').textContent.includes('b=5')",
            gib(e5.peak_bytes as f64)
        ),
        Duration::from_secs(5),
    )
    .unwrap();
    wait_url(&c, "location.search.includes('batch=5')");
    let state = c
        .eval(
            "return [location.search, location.hash, \
             document.querySelector('[data-widget=timeline] [data-value=peak]').textContent, \
             document.querySelector('[data-widget=breakdown] .gm-sub').textContent, \
             document.querySelector('[data-widget=formula] [data-value=substitution]').textContent]",
            json!([]),
        )
        .unwrap();
    assert!(state[0].as_str().unwrap().contains("batch=5"), "{state}");
    assert_eq!(
        state[1], "#why-the-peak-is-not-the-sum",
        "the anchor is kept"
    );
    assert!(
        state[2]
            .as_str()
            .unwrap()
            .contains(&format!("Peak {}", gib(e5.peak_bytes as f64))),
        "{state}"
    );
    assert!(state[3].as_str().unwrap().contains("b=5"), "{state}");
    // A reload keeps the state.
    let href = c.eval("return location.href", json!([])).unwrap();
    c.goto(href.as_str().unwrap()).unwrap();
    wait_live(&c);
    c.wait_for(
        &format!(
            "return document.querySelector('[data-widget=value][data-quantity=activations]').textContent === '{}'",
            gib(e5.components["activations"] as f64)
        ),
        Duration::from_secs(5),
    )
    .unwrap();

    // The accessibility tree, as the browser computes it.
    for (css, role) in [
        ("[data-widget=breakdown] svg.gm-chart", "image"),
        ("[data-widget=timeline]", "figure"),
        ("[data-widget=sweep] .gm-tools", "toolbar"),
        ("[data-widget=allocator] input[id$=-seq]", "slider"),
        ("[data-widget=allocator] [role=radio]", "radio"),
        ("[data-widget=sweep] .gm-tools button", "button"),
    ] {
        let el = c.find(css).unwrap();
        let (got, label) = c.accessibility(&el).unwrap();
        assert!(
            got == role || (role == "image" && got == "img"),
            "{css}: role {got}, want {role}"
        );
        assert!(!label.trim().is_empty(), "{css} has no accessible name");
    }
    // A page has several toolbars: each is named after its chart.
    let (_, tools) = c
        .accessibility(&c.find("[data-widget=sweep] .gm-tools").unwrap())
        .unwrap();
    let title = c
        .eval(
            "return document.querySelector('[data-widget=sweep] .gm-title').textContent",
            json!([]),
        )
        .unwrap();
    assert!(
        tools.starts_with("Share and export:") && tools.contains(title.as_str().unwrap()),
        "{tools}"
    );
    let (_, chart_label) = c
        .accessibility(&c.find("[data-widget=breakdown] svg.gm-chart").unwrap())
        .unwrap();
    assert!(
        chart_label.contains("Per-GPU memory at the peak"),
        "{chart_label}"
    );

    // Export: the chart as an SVG file that stands alone: an opaque background, a title, the
    // chart with its computed styles (the capacity line's dashes), the legend, the scenario.
    c.eval(
        "window.saved = null; HTMLAnchorElement.prototype.click = function () { window.saved = this.href; }; return true",
        json!([]),
    )
    .unwrap();
    let button = c
        .find("[data-widget=breakdown] .gm-tools button:nth-of-type(2)")
        .unwrap();
    c.click(&button).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=breakdown] .gm-status').textContent.startsWith('Saved')",
        Duration::from_secs(5),
    )
    .unwrap();
    let file = c
        .eval(
            "return decodeURIComponent(window.saved.split(',').slice(1).join(','))",
            json!([]),
        )
        .unwrap();
    let file = file.as_str().unwrap();
    assert!(
        file.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{file}"
    );
    assert!(
        file.contains("<rect width=\"100%\" height=\"100%\" fill=\"rgb("),
        "opaque: {file}"
    );
    assert!(file.contains("Per-GPU memory at the peak"), "the title");
    assert!(
        file.contains("stroke-dasharray=\"7px, 4px\"")
            || file.contains("stroke-dasharray=\"7, 4\""),
        "dashes kept: {file}"
    );
    assert!(
        file.contains("model=llama3.1-8b · batch=5 · seq=4k"),
        "the scenario: {file}"
    );
    assert!(file.contains("Activations "), "the legend: {file}");

    // A hostile permalink: refused with a visible notice, the page's own state kept, nothing
    // injected.
    c.goto(&format!(
        "{page}?model=%3Cimg%20src%3Dx%20onerror%3D%22window.pwned%3D1%22%3E&batch=2"
    ))
    .unwrap();
    wait_live(&c);
    let got = c
        .eval(
            "return [document.querySelector('.gm-notice[role=alert]')?.textContent, \
             document.querySelector('[data-widget=allocator] .gm-sub').textContent, \
             window.pwned === undefined, document.querySelectorAll('img[src=x]').length]",
            json!([]),
        )
        .unwrap();
    assert!(
        got[0].as_str().unwrap_or("").contains("not applied"),
        "{got}"
    );
    assert!(got[1].as_str().unwrap().contains("b=1 · s=2K"), "{got}");
    assert_eq!(got[2], true);
    assert_eq!(got[3], 0);
}

#[test]
fn zero_keys_presets_stages_and_log_steps() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/zero.html", served())).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=zero][data-live]') !== null",
        Duration::from_secs(20),
    )
    .unwrap();
    let sub = "return document.querySelector('[data-widget=zero] .gm-sub').textContent";
    assert_eq!(
        c.eval(sub, json!([])).unwrap(),
        "7B parameters · 8 GPUs · no ZeRO"
    );
    let slider = c.find("[data-widget=zero] input[id$=-params]").unwrap();
    // Z cycles the stage; the per-GPU bar and its chips appear.
    c.send_keys(&slider, "z").unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=zero] .gm-sub').textContent.endsWith('ZeRO-1')",
        Duration::from_secs(5),
    )
    .unwrap();
    let chips = c
        .eval(
            "return [...document.querySelectorAll('[data-widget=zero] .gm-chip')].map(e => e.textContent).join('|')",
            json!([]),
        )
        .unwrap();
    assert!(
        chips
            .as_str()
            .unwrap()
            .contains("Master weights / 8 (sharded)"),
        "{chips}"
    );
    // A number key jumps to a preset: 4 → 70B.
    c.send_keys(&slider, "4").unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=zero] .gm-sub').textContent.startsWith('70B parameters')",
        Duration::from_secs(5),
    )
    .unwrap();
    // Right arrow: one log step up.
    c.send_keys(&slider, "\u{E014}").unwrap();
    c.wait_for(
        "return !document.querySelector('[data-widget=zero] .gm-sub').textContent.startsWith('70B')",
        Duration::from_secs(5),
    )
    .unwrap();
    let now = c.eval(sub, json!([])).unwrap();
    let billions: f64 = now
        .as_str()
        .unwrap()
        .split('B')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        billions > 70.0 && billions < 100.0,
        "one log step up from 70B: {now}"
    );
    // The URL carries the state (once the knobs rest).
    wait_url(&c, "location.search.includes('zero-stage=1')");
    assert_no_console_errors(&c);
}

/// Wait until the page's URL meets `cond` (a JS expression): it is written once the knobs rest.
fn wait_url(c: &Chrome, cond: &str) {
    c.wait_for(&format!("return {cond}"), Duration::from_secs(5))
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {}",
                c.eval("return location.search", json!([])).unwrap()
            )
        });
}

fn wait_widget(c: &Chrome, widget: &str) {
    c.wait_for(
        &format!("return document.querySelector('[data-widget={widget}][data-live]') !== null"),
        Duration::from_secs(20),
    )
    .unwrap();
}

#[test]
fn the_5d_panel_takes_a_pasted_config_refuses_a_hostile_one_and_applies_a_planned_layout() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/parallelism.html", served())).unwrap();
    wait_widget(&c, "parallelism");
    // Expressions, so that waits can build on them.
    let sub_x = "document.querySelector('[data-widget=parallelism] .gm-sub').textContent";
    let alert_x = "(document.querySelector('[data-widget=parallelism] .gm-error[role=alert]') || {textContent: ''}).textContent";
    let sub = &format!("return {sub_x}");
    let alert = &format!("return {alert_x}");
    assert!(c
        .eval(sub, json!([]))
        .unwrap()
        .as_str()
        .unwrap()
        .starts_with("llama3.1-70b · 64 GPUs"));
    // The planner's table as rendered live: a header row of eight columns over rows of eight
    // cells (a header written as one raw string lost its row and cells to the HTML parser,
    // which reads such a string outside any table).
    let table = c
        .eval(
            "const t = document.querySelector('[data-widget=parallelism] table.gm-plan'); \
             return [t.querySelectorAll('thead > tr > th[scope=col]').length, \
                     [...t.tBodies[0].rows].map(r => r.cells.length), \
                     t.tHead.rows[0].cells[1].textContent, t.caption.textContent]",
            json!([]),
        )
        .unwrap();
    assert_eq!(table[0], 8, "{table}");
    let rows = table[1].as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|n| n == 8), "{table}");
    assert_eq!(table[2], "dp×tp×pp×cp×ep", "{table}");
    assert!(
        table[3]
            .as_str()
            .unwrap()
            .contains("The fastest (up to 5) are listed"),
        "{table}"
    );
    let box_ = c.find("[data-widget=parallelism] textarea").unwrap();

    // Hostile: markup in a value. Refused with the engine's reason, shown as text; nothing runs.
    c.send_keys(
        &box_,
        r#"{"model_type": "<img src=x onerror=window.pwned=1>", "hidden_size": 64}"#,
    )
    .unwrap();
    c.wait_for(
        &format!("return {alert_x}.length > 0"),
        Duration::from_secs(5),
    )
    .unwrap();
    let msg = c.eval(alert, json!([])).unwrap();
    assert!(
        msg.as_str().unwrap().contains("config.json.model_type"),
        "{msg}"
    );
    let injected = c
        .eval("return [window.pwned === undefined, document.querySelectorAll('[data-widget=parallelism] img').length]", json!([]))
        .unwrap();
    assert_eq!(injected, json!([true, 0]));
    assert!(
        c.eval(sub, json!([]))
            .unwrap()
            .as_str()
            .unwrap()
            .starts_with("llama3.1-70b"),
        "state kept"
    );

    // Malformed JSON: the line and column.
    c.clear(&box_).unwrap();
    c.send_keys(&box_, "{\"hidden_size\": 4096,").unwrap();
    c.wait_for(
        &format!("return {alert_x}.includes('config.json:1:')"),
        Duration::from_secs(5),
    )
    .unwrap();

    // A real config.json (Mistral 7B, with keys the engine does not need): applied.
    c.clear(&box_).unwrap();
    c.send_keys(
        &box_,
        r#"{"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "sliding_window": 4096, "rope_theta": 10000.0}"#,
    )
    .unwrap();
    c.wait_for(
        &format!("return {sub_x}.startsWith('custom (config.json)')"),
        Duration::from_secs(5),
    )
    .unwrap();
    wait_url(&c, "location.search.includes('arch=')");
    let fields = c
        .eval("return [document.querySelector('[data-widget=parallelism] input[id$=-layers]').value, location.search.includes('arch=')]", json!([]))
        .unwrap();
    assert_eq!(fields, json!(["32", true]));
    let note = c
        .eval(
            "return document.querySelector('[data-widget=parallelism] [role=status]').textContent",
            json!([]),
        )
        .unwrap();
    assert!(
        note.as_str().unwrap().contains("7.24B parameters"),
        "{note}"
    );
    // A mixture of experts brings two more fields; the paste box keeps its text and the focus.
    c.clear(&box_).unwrap();
    c.send_keys(
        &box_,
        r#"{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}"#,
    )
    .unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=parallelism] input[id$=-experts]') !== null",
        Duration::from_secs(5),
    )
    .unwrap();
    let kept = c
        .eval(
            "var t = document.querySelector('[data-widget=parallelism] textarea'); \
             return [document.activeElement === t, t.value.includes('num_local_experts')]",
            json!([]),
        )
        .unwrap();
    assert_eq!(
        kept,
        json!([true, true]),
        "the paste box after a successful paste"
    );

    // Beyond the paste cap (64 KiB): refused unread, the limit named, the model kept.
    c.eval(
        "var t = document.querySelector('[data-widget=parallelism] textarea'); \
         t.value = '{\"hidden_size\": 4096, \"pad\": \"' + 'x'.repeat(70000) + '\"}'; \
         t.dispatchEvent(new Event('input', {bubbles: true})); return true",
        json!([]),
    )
    .unwrap();
    c.wait_for(
        &format!("return {alert_x}.includes('longer than 64 KiB')"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(c
        .eval(sub, json!([]))
        .unwrap()
        .as_str()
        .unwrap()
        .starts_with("custom (config.json)"));

    // A change moves the panel at once; the planner (some 1,600 layouts) follows once the
    // knobs rest, its table marked busy until then.
    let plan_x = "document.querySelector('[data-widget=parallelism] table.gm-plan')";
    c.wait_for(
        &format!("return !{plan_x}.hasAttribute('aria-busy')"),
        Duration::from_secs(5),
    )
    .unwrap();
    let caption = |c: &Chrome| c.eval(&format!("return {plan_x}.caption.textContent"), json!([]));
    let before = caption(&c).unwrap();
    // Read as the panel is redrawn (a `MutationObserver`: before the knobs can rest).
    let at_once = c
        .eval_async(
            &format!(
                "const done = arguments[arguments.length - 1]; \
                 const w = document.querySelector('[data-widget=parallelism]'); \
                 new MutationObserver((_, o) => {{ if ({sub_x}.includes('b=2')) {{ o.disconnect(); \
                   done([true, {plan_x}.getAttribute('aria-busy'), {plan_x}.caption.textContent]); }} }}) \
                   .observe(w, {{subtree: true, childList: true, characterData: true}}); \
                 const b = w.querySelector('input[id$=-batch]'); \
                 b.value = '2'; b.dispatchEvent(new Event('change', {{bubbles: true}}));"
            ),
            json!([]),
        )
        .unwrap();
    assert_eq!(at_once, json!([true, "true", before]), "{at_once}");
    c.wait_for(
        &format!("return !{plan_x}.hasAttribute('aria-busy')"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_ne!(
        caption(&c).unwrap(),
        before,
        "the plan of the new micro-batch"
    );

    // The planner's first layout, applied: the panel shows it and marks its row.
    let use1 = c
        .find("[data-widget=parallelism] button[aria-label='Use layout 1']")
        .unwrap();
    c.click(&use1).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=parallelism] tr.gm-current') !== null",
        Duration::from_secs(5),
    )
    .unwrap();
    // Its button tells a screen reader it is the one shown, and no other button does.
    let pressed = c
        .eval(
            "return [...document.querySelectorAll('[data-widget=parallelism] button[aria-pressed=true]')].map(b => b.closest('tr').classList.contains('gm-current'))",
            json!([]),
        )
        .unwrap();
    assert_eq!(
        pressed,
        json!([true]),
        "one pressed button, in the row shown"
    );
    assert_no_console_errors(&c);
}

#[test]
fn the_precision_recipes_and_parts_drive_the_page() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/precision.html", served())).unwrap();
    wait_widget(&c, "precision");
    let sub_x = "document.querySelector('[data-widget=precision] .gm-sub').textContent";
    let weights = "return document.querySelector('.gm-value[data-quantity=weights]').textContent";
    // A part's row as it reads (its menu's value and its bytes per value), then `tail`.
    let row_js = |part: &str, tail: &str| {
        format!(
            "var r = document.querySelector('[data-widget=precision] tr[data-part={part}]'); \
             return (r.querySelector('select').value + ' ' + r.querySelectorAll('td')[1].textContent){tail}"
        )
    };
    let before = c.eval(weights, json!([])).unwrap();
    // QLoRA: NF4 base weights; the prose's live value follows.
    let q = c
        .find("[data-widget=precision] button[role=radio]:nth-child(7)")
        .unwrap();
    c.click(&q).unwrap();
    c.wait_for(
        &format!("return {sub_x}.includes('QLoRA NF4')"),
        Duration::from_secs(5),
    )
    .unwrap();
    // The frozen base is stored in NF4 (its compute in the recipe's bf16).
    assert_eq!(
        c.eval(&row_js("weights", ""), json!([])).unwrap(),
        "nf4 0.516 B"
    );
    // The inline value follows the recipe (at once on screen; off screen once the knobs rest).
    c.wait_for(
        &format!(
            "{} !== {}",
            weights,
            serde_json::to_string(&before).unwrap()
        ),
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| panic!("the inline value follows the recipe: {e}"));
    // 8-bit Adam: the optimizer's states in int8, a byte a value (not the recipe's fp32).
    c.click(
        &c.find("[data-widget=precision] button[role=radio]:nth-child(6)")
            .unwrap(),
    )
    .unwrap();
    c.wait_for(
        &format!("return {sub_x}.includes('8-bit Adam')"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(
        c.eval(&row_js("optimizer", ""), json!([])).unwrap(),
        "int8 1 B"
    );
    // One part changed by its select: no recipe matches any more.
    c.click(
        &c.find("[data-widget=precision] button[role=radio]:nth-child(4)")
            .unwrap(),
    )
    .unwrap();
    c.eval(
        "var s = document.querySelector('[data-widget=precision] select[id$=-grads]'); s.value = 'fp32'; s.dispatchEvent(new Event('change', {bubbles: true})); return true",
        json!([]),
    )
    .unwrap();
    c.wait_for(
        &format!("return {sub_x}.includes('custom')"),
        Duration::from_secs(5),
    )
    .unwrap();
    wait_url(
        &c,
        "decodeURIComponent(location.search).includes('grads=fp32')",
    );
    // A recipe then sets that part's menu too, though the reader has used it (a used menu
    // no longer follows its options' `selected` attribute).
    c.click(
        &c.find("[data-widget=precision] button[role=radio]:nth-child(3)")
            .unwrap(),
    )
    .unwrap();
    c.wait_for(&row_js("grads", " === 'bf16 2 B'"), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the gradients' menu follows the BF16 recipe: {e}"));
    // The radiogroup's accessible names, as Chromium computes them.
    let (role, _) = c
        .accessibility(&c.find("[data-widget=precision] [role=radiogroup]").unwrap())
        .unwrap();
    assert_eq!(role, "radiogroup");
    let (role, name) = c
        .accessibility(
            &c.find("[data-widget=precision] select[id$=-weights]")
                .unwrap(),
        )
        .unwrap();
    assert_eq!((role.as_str(), name.as_str()), ("combobox", "Weights"));
}

/// No error in the browser console since the last look.
fn assert_no_console_errors(c: &Chrome) {
    let console = c.console().unwrap();
    assert!(
        console.iter().all(|m| m["level"] != "SEVERE"),
        "console: {console:?}"
    );
}

/// Every widget host on the page runs (each widget marks its root `data-live`).
fn wait_all_live(c: &Chrome) {
    c.wait_for(
        "return document.querySelectorAll('[data-gpumem]').length > 0 && \
         [...document.querySelectorAll('[data-gpumem]')].every(h => h.querySelector('[data-live]') || h.matches('[data-live]'))",
        Duration::from_secs(30),
    )
    .unwrap();
}

/// The page's widget texts as the server sent them (parsed, never run) and as they are now
/// (whitespace left out: mdBook lays the sent HTML out over lines, the live render does not).
const TEXTS_SENT_AND_NOW: &str = r#"
const done = arguments[arguments.length - 1];
const texts = doc => [...doc.querySelectorAll('[data-gpumem] [data-widget=value], [data-gpumem] .gm-sub, [data-gpumem] [data-value]')]
  .map(e => e.textContent.replace(/\s+/g, ''));
fetch(location.href).then(r => r.text()).then(t => {
  const sent = new DOMParser().parseFromString(t, 'text/html');
  const ids = [...document.querySelectorAll('[data-gpumem] [id]')].map(e => e.id);
  const dup = ids.filter((id, i) => ids.indexOf(id) !== i);
  done([texts(sent), texts(document), dup]);
});
"#;

#[test]
fn print_html_keeps_every_chapters_own_state() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    // mdBook's print page asks the browser to print once loaded; headless, that is a no-op.
    c.goto(&format!("{}/print.html", served())).unwrap();
    wait_all_live(&c);
    std::thread::sleep(Duration::from_millis(300));
    let got = c.eval_async(TEXTS_SENT_AND_NOW, json!([])).unwrap();
    let (sent, now) = (got[0].as_array().unwrap(), got[1].as_array().unwrap());
    assert!(sent.len() > 40, "{sent:?}");
    let changed: Vec<String> = sent
        .iter()
        .zip(now)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("{a} → {b}"))
        .collect();
    assert!(
        changed.is_empty() && sent.len() == now.len(),
        "going live changed {} of {} texts: {changed:?}",
        changed.len(),
        sent.len()
    );
    assert_eq!(got[2], json!([]), "element ids repeat across chapters");
    assert_no_console_errors(&c);
}

#[test]
fn the_5d_panel_takes_multi_digit_numbers() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/parallelism.html", served())).unwrap();
    wait_widget(&c, "parallelism");
    let sub = "document.querySelector('[data-widget=parallelism] .gm-sub').textContent";
    let dp = c.find("[data-widget=parallelism] input[id$=-dp]").unwrap();
    c.click(&dp).unwrap();
    // Select what is there and type over it, as a reader does; then Enter.
    c.send_keys(&dp, "\u{E009}a\u{E000}16\u{E007}").unwrap();
    c.wait_for(
        &format!("return {sub}.includes(' 512 GPUs')"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| {
        let now = c.eval(&format!("return [{sub}, document.querySelector('[data-widget=parallelism] input[id$=-dp]').value, document.activeElement.id]"), json!([])).unwrap();
        panic!("{e}: {now}")
    });
    wait_url(&c, "location.search.includes('dp=16')");
    let state = c
        .eval(
            "var i = document.querySelector('[data-widget=parallelism] input[id$=-dp]'); \
             return [i.value, document.activeElement === i, location.search]",
            json!([]),
        )
        .unwrap();
    assert_eq!(state[0], "16", "{state}");
    assert_eq!(state[1], true, "the field keeps the focus: {state}");
    assert!(state[2].as_str().unwrap().contains("dp=16"), "{state}");
    // Blur applies too: tp 8 → 4, typed and left with Tab.
    let tp = c.find("[data-widget=parallelism] input[id$=-tp]").unwrap();
    c.click(&tp).unwrap();
    c.send_keys(&tp, "\u{E009}a\u{E000}4\u{E004}").unwrap();
    c.wait_for(
        &format!("return {sub}.includes(' 256 GPUs')"),
        Duration::from_secs(10),
    )
    .unwrap();
    // What the engine refuses is said, and the field goes back to the value in use: a
    // negative count, a fraction, an empty field; a model field the same way.
    let err = "document.querySelector('[data-widget=parallelism] .gm-error')";
    for (field, typed, says) in [
        ("dp", "-2", "dp: '-2' is negative: give a whole number"),
        ("dp", "1.5", "dp: '1.5' is not a whole number"),
        ("tp", "\u{E003}", "tp: a whole number is needed"),
        (
            "layers",
            "-2",
            "num_hidden_layers: must be a positive integer, got -2",
        ),
    ] {
        let input = c
            .find(&format!("[data-widget=parallelism] input[id$=-{field}]"))
            .unwrap();
        let before = c
            .eval(
                &format!("return document.querySelector('[data-widget=parallelism] input[id$=-{field}]').value"),
                json!([]),
            )
            .unwrap();
        c.click(&input).unwrap();
        c.send_keys(&input, &format!("\u{E009}a\u{E000}{typed}\u{E004}"))
            .unwrap();
        c.wait_for(
            &format!("var e = {err}; return e !== null && e.textContent.includes({says:?})"),
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| {
            let now = c
                .eval(
                    &format!("var e = {err}; return e && e.textContent"),
                    json!([]),
                )
                .unwrap();
            panic!("{field}={typed:?}: {e}: {now}")
        });
        let after = c
            .eval(
                &format!("return document.querySelector('[data-widget=parallelism] input[id$=-{field}]').value"),
                json!([]),
            )
            .unwrap();
        assert_eq!(after, before, "{field}={typed:?} left in the field");
        // The reason describes the field it is about.
        let described = c
            .eval(
                &format!("var i = document.querySelector('[data-widget=parallelism] input[id$=-{field}]'); \
                          var d = i.getAttribute('aria-describedby'); \
                          return d !== null && document.getElementById(d) === {err}"),
                json!([]),
            )
            .unwrap();
        assert_eq!(
            described, true,
            "{field}={typed:?}: not described by the reason"
        );
        assert!(c
            .eval(&format!("return {sub}"), json!([]))
            .unwrap()
            .as_str()
            .unwrap()
            .contains(" 256 GPUs"));
        // The value in use typed again (no change event: it is what the field shows) is
        // applied, and the reason goes.
        let again = before.as_str().unwrap();
        c.send_keys(&input, &format!("\u{E009}a\u{E000}{again}\u{E007}"))
            .unwrap();
        c.wait_for(&format!("return {err} === null"), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{field}: the reason stays after {again}: {e}"));
        let described = c
            .eval(
                &format!("return document.querySelector('[data-widget=parallelism] input[id$=-{field}]').hasAttribute('aria-describedby')"),
                json!([]),
            )
            .unwrap();
        assert_eq!(
            described, false,
            "{field}: still described by a reason gone"
        );
    }
    assert_no_console_errors(&c);
}

#[test]
fn arrow_keys_on_widget_controls_do_not_turn_the_page() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    for (page, css) in [
        ("zero", "[data-widget=zero] .gm-tools button"),
        ("zero", "[data-widget=zero] .gm-presets button"),
        ("parallelism", "[data-widget=parallelism] .gm-plan button"),
        ("budget", "[data-widget=sweep] .gm-tools button"),
        ("budget", ".gm-cite summary"),
    ] {
        c.goto(&format!("{}/{page}.html", served())).unwrap();
        wait_all_live(&c);
        let el = c.find(css).unwrap();
        for key in ["\u{E014}", "\u{E012}"] {
            c.send_keys(&el, key).unwrap();
            std::thread::sleep(Duration::from_millis(400));
            let here = c.eval("return location.pathname", json!([])).unwrap();
            assert!(
                here.as_str().unwrap().ends_with(&format!("/{page}.html")),
                "an arrow on {css} turned the page to {here}"
            );
        }
    }
}

/// Contrast of every visible text in the widgets and the cite boxes against what is behind
/// it (WCAG: 4.5:1, large text 3:1), and of every chart slice and swatch against the
/// widget's background (3:1), computed from the browser's computed styles.
const CONTRAST: &str = r#"
const parse = c => {
  const m = /rgba?\(([^)]+)\)/.exec(c || '');
  if (!m) return null;
  const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
};
const over = (f, b) => [0, 1, 2].map(i => f[i] * f[3] + b[i] * (1 - f[3])).concat([1]);
const lum = c => {
  const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
};
const ratio = (a, b) => { const x = lum(a), y = lum(b); return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05); };
const background = el => {
  const chain = [];
  for (let e = el; e; e = e.parentElement) chain.push(e);
  let bg = [255, 255, 255, 1];
  for (const e of chain.reverse()) {
    const c = parse(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) bg = over(c, bg);
  }
  return bg;
};
const opacity = el => { let o = 1; for (let e = el; e; e = e.parentElement) o *= Number(getComputedStyle(e).opacity); return o; };
const visible = el => el.getClientRects().length > 0 && !el.closest('.gm-sr, title, option, .katex-mathml')
  && getComputedStyle(el).visibility !== 'hidden';
const bad = [];
// Widgets, cite boxes, notices, the prose's tables and links, and code comments (mdBook's
// own link colours and ayu's comments were below 4.5:1 on the dark themes and rust).
for (const el of document.querySelectorAll('.gm *, .gm-cite *, .gm-notice, main table th, main table td, main p a, main li a, main pre .hljs-comment')) {
  const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  if (!own || !visible(el)) continue;
  const s = getComputedStyle(el);
  const svg = el instanceof SVGElement;
  let fg = parse(svg ? s.fill : s.color);
  if (!fg) continue;
  fg = [fg[0], fg[1], fg[2], fg[3] * opacity(el)];
  const bg = background(el);
  const m = svg ? el.getScreenCTM() : null;
  const size = parseFloat(s.fontSize) * (m ? Math.hypot(m.a, m.b) : 1);
  const large = size >= 24 || (size >= 18.66 && Number(s.fontWeight) >= 700);
  const r = ratio(over(fg, bg), bg);
  if (r < (large ? 3 : 4.5) - 0.01) bad.push(`text ${r.toFixed(2)}:1 "${el.textContent.trim().slice(0, 40)}" (${el.className.baseVal ?? el.className})`);
}
// A text box's placeholder (the browser's own grey is too faint on the dark themes).
for (const el of document.querySelectorAll('.gm textarea[placeholder]')) {
  if (!visible(el)) continue;
  const fg = parse(getComputedStyle(el, '::placeholder').color), bg = background(el);
  const r = ratio(over(fg, bg), bg);
  if (r < 4.49) bad.push(`placeholder ${r.toFixed(2)}:1 (${el.id})`);
}
for (const el of document.querySelectorAll('.gm [class*="gm-f-"], .gm .gm-swatch, .gm .gm-seg')) {
  if (!visible(el)) continue;
  const r0 = el.getBoundingClientRect();
  if (r0.width < 1 || r0.height < 1) continue;
  const s = getComputedStyle(el);
  const c = parse(el instanceof SVGElement ? s.fill : s.backgroundColor);
  if (!c) continue;
  const bg = background(el.closest('.gm'));
  const r = ratio(over([c[0], c[1], c[2], c[3] * opacity(el)], bg), bg);
  if (r < 2.99) bad.push(`slice ${r.toFixed(2)}:1 ${el.getAttribute('class')}`);
}
return [...new Set(bad)];
"#;

#[test]
fn every_widget_text_and_slice_reads_in_all_five_themes() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    for theme in ["light", "rust", "coal", "navy", "ayu"] {
        c.goto(&format!("{}/index.html", served())).unwrap();
        c.eval(
            "localStorage.setItem('mdbook-theme', arguments[0]); return true",
            json!([theme]),
        )
        .unwrap();
        for page in [
            "budget",
            "precision",
            "activations",
            "logits",
            "peak",
            "zero",
            // The second bar and its title, which the GPUs' lines pass.
            "zero.html?zero-stage=3",
            "parallelism",
            "inference",
            "what-now",
            "validation",
        ] {
            c.goto(&page_url(page)).unwrap();
            if page != "validation" {
                wait_all_live(&c);
            }
            let html = c
                .eval("return document.documentElement.className", json!([]))
                .unwrap();
            assert!(html.as_str().unwrap().contains(theme), "{theme}: {html}");
            let bad = c.eval(CONTRAST, json!([])).unwrap();
            for b in bad.as_array().unwrap() {
                failures.push(format!("{theme} {page}: {}", b.as_str().unwrap()));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} contrast failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// What sticks out of the page sideways (outside a box that scrolls or clips on its own),
/// chart text smaller than 11 px, and formula numbers that overlap their formula.
const LAYOUT: &str = r#"
const W = document.documentElement.clientWidth;
const bad = [];
const main = document.querySelector('main');
for (const el of main.querySelectorAll('*')) {
  const r = el.getBoundingClientRect();
  if (r.width === 0 || r.height === 0 || (r.right <= W + 1 && r.left >= -1)) continue;
  let contained = false;
  for (let p = el.parentElement; p && p !== main; p = p.parentElement) {
    if (getComputedStyle(p).overflowX !== 'visible') {
      const pr = p.getBoundingClientRect();
      contained = pr.right <= W + 1 && pr.left >= -1;
      break;
    }
  }
  if (!contained) bad.push(`sticks out to ${Math.round(r.right)} px: <${el.tagName.toLowerCase()} class="${el.getAttribute('class') || ''}">`);
}
for (const box of [document.documentElement, document.querySelector('#mdbook-content')]) {
  if (box && box.scrollWidth > box.clientWidth + 1) bad.push(`${box.id || box.tagName} scrolls sideways (${box.scrollWidth} > ${box.clientWidth})`);
}
// A display formula fits its column (on a phone it breaks, its number after it): one that
// scrolls hides its end and its number.
for (const k of document.querySelectorAll('.katex-display')) {
  if (k.scrollWidth > k.clientWidth + 1) bad.push(`formula scrolls (${k.scrollWidth} > ${k.clientWidth}): ${k.querySelector('annotation')?.textContent.slice(0, 40)}`);
}
// Every control a finger can hit: 24 × 24 px at least (WCAG 2.5.8).
for (const el of document.querySelectorAll('.gm button, .gm input, .gm select, .gm summary')) {
  if (!el.getClientRects().length) continue;
  const r = el.getBoundingClientRect();
  if (r.width < 24 || r.height < 24) bad.push(`control ${Math.round(r.width)} × ${Math.round(r.height)} px: <${el.tagName.toLowerCase()} class="${el.getAttribute('class') || ''}">`);
}
for (const t of document.querySelectorAll('svg.gm-chart text')) {
  if (!t.getClientRects().length) continue;
  const m = t.getScreenCTM();
  const px = parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
  if (px < 10.9) bad.push(`chart text ${px.toFixed(1)} px: "${t.textContent.slice(0, 30)}"`);
  // Inside its chart: a label below the SVG runs under the toolbar.
  const sr = t.ownerSVGElement.getBoundingClientRect(), tr = t.getBoundingClientRect();
  if (tr.bottom > sr.bottom + 1 || tr.top < sr.top - 1)
    bad.push(`chart text outside its chart: "${t.textContent.slice(0, 30)}"`);
}
// No marker line runs through a chart's label: a halo hides a line along the letters, not
// between them. (Vertical lines: capacities, "stops fitting", the peak op's outline.)
for (const svg of document.querySelectorAll('svg.gm-chart')) {
  const vlines = [];
  // Marker lines as drawn, a piece per unit of their length (a path may skip over a label).
  for (const ln of svg.querySelectorAll('.gm-capline, .gm-overline')) {
    const r = ln.getBoundingClientRect(), m = ln.getScreenCTM();
    if (!(r.width < 1 && r.height > 0) || !m) continue;
    for (let l = 0, len = ln.getTotalLength(); l + 1 <= len; l += 1) {
      const a = ln.getPointAtLength(l).matrixTransform(m), b = ln.getPointAtLength(l + 1).matrixTransform(m);
      if (Math.abs(b.y - a.y) < 2) vlines.push([a.x, Math.min(a.y, b.y), Math.max(a.y, b.y)]);
    }
  }
  for (const pk of svg.querySelectorAll('.gm-peak-op')) {
    const r = pk.getBoundingClientRect();
    vlines.push([r.left, r.top, r.bottom], [r.right, r.top, r.bottom]);
  }
  for (const t of svg.querySelectorAll('text.gm-caplabel, text.gm-overlabel, text.gm-peaklabel, text.gm-ann-main')) {
    const r = t.getBoundingClientRect();
    if (!r.width) continue;
    for (const [x, y0, y1] of vlines)
      if (x > r.left + 1 && x < r.right - 1 && y1 > r.top + 3 && y0 < r.bottom - 3)
        bad.push(`a line crosses the label "${t.textContent.slice(0, 30)}"`);
  }
}
// The ledger's and the precision table's columns all in view (the planner's table may scroll).
for (const box of document.querySelectorAll('.gm-ledger .gm-scroll, .gm-precision .gm-scroll')) {
  if (box.scrollWidth > box.clientWidth + 1)
    bad.push(`${box.parentElement.dataset.widget} table wider than its box (${box.scrollWidth} > ${box.clientWidth})`);
}
for (const tag of document.querySelectorAll('.katex-display .tag')) {
  const tr = tag.getBoundingClientRect();
  for (const b of tag.closest('.katex-html').querySelectorAll(':scope > .base')) {
    const br = b.getBoundingClientRect();
    if (br.right > tr.left + 1 && br.left < tr.right - 1 && br.bottom > tr.top && br.top < tr.bottom)
      bad.push(`formula number ${tag.textContent} overlaps its formula`);
  }
}
return [...new Set(bad)].slice(0, 12);
"#;

#[test]
fn phones_never_scroll_sideways_and_charts_stay_legible() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    for (width, mobile) in [(1400, false), (390, true)] {
        c.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .unwrap();
        for page in [
            "index",
            "budget",
            "precision",
            "optimizer",
            "activations",
            "logits",
            "peak",
            "zero",
            // The second bar and its title, which the GPUs' lines pass.
            "zero.html?zero-stage=3",
            "parallelism",
            "finetuning",
            "inference",
            "what-now",
            "validation",
            "references",
        ] {
            c.goto(&page_url(page)).unwrap();
            if !["index", "validation", "references"].contains(&page) {
                wait_all_live(&c);
            }
            std::thread::sleep(Duration::from_millis(200));
            let bad = c.eval(LAYOUT, json!([])).unwrap();
            for b in bad.as_array().unwrap() {
                failures.push(format!("{width} px {page}: {}", b.as_str().unwrap()));
            }
        }
    }
    // Without JavaScript the charts are the ones drawn when the book was built, 640 px
    // wide: on a phone each scrolls inside its figure at that width, its labels legible
    // (they were scaled to half their size), the page still not sideways.
    c.cdp(
        "Emulation.setScriptExecutionDisabled",
        json!({"value": true}),
    )
    .unwrap();
    for page in ["budget", "peak", "zero", "parallelism", "validation"] {
        c.goto(&page_url(page)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let nojs = c
            .eval("return !!document.querySelector('.gm-nojs') && getComputedStyle(document.querySelector('.gm-nojs')).display !== 'none';", json!([]))
            .unwrap();
        if nojs != json!(true) {
            failures.push(format!("390 px {page} without JavaScript: no notice shown"));
        }
        let bad = c.eval(LAYOUT, json!([])).unwrap();
        for b in bad.as_array().unwrap() {
            failures.push(format!(
                "390 px {page} without JavaScript: {}",
                b.as_str().unwrap()
            ));
        }
    }
    c.cdp(
        "Emulation.setScriptExecutionDisabled",
        json!({"value": false}),
    )
    .unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn cite_this_gives_an_absolute_address_a_version_and_an_access_date() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html?batch=2", served()))
        .unwrap();
    c.wait_for(
        "return document.querySelector('.gm-cite p').textContent.includes('http')",
        Duration::from_secs(10),
    )
    .unwrap();
    let got = c
        .eval(
            "var d = new Date(), p = n => String(n).padStart(2, '0'); \
             return [document.querySelector('.gm-cite p').textContent, \
                     document.querySelector('.gm-cite code').textContent, \
                     d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate())]",
            json!([]),
        )
        .unwrap();
    let (plain, bib, today) = (
        got[0].as_str().unwrap(),
        got[1].as_str().unwrap(),
        got[2].as_str().unwrap(),
    );
    let url = format!("{}/budget.html#model-states", served());
    assert!(plain.contains(&url), "{plain}");
    assert!(plain.contains(&format!("accessed {today}")), "{plain}");
    assert!(plain.contains("Version "), "{plain}");
    assert!(bib.contains(&format!("url = {{{url}}}")), "{bib}");
    assert!(bib.contains(&format!("urldate = {{{today}}}")), "{bib}");
    assert!(bib.contains("author = {{"), "an organisation: {bib}");
}

#[test]
fn the_site_works_under_a_strict_content_security_policy() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/index.html", served())).unwrap();
    c.eval(
        "localStorage.setItem('mdbook-theme', 'coal'); return true",
        json!([]),
    )
    .unwrap();
    for page in ["budget", "parallelism", "print", "references"] {
        c.goto(&format!("{}/{page}.html", served())).unwrap();
        let csp = c
            .eval_async(
                "const done = arguments[arguments.length - 1]; \
                 fetch(location.href).then(r => done(r.headers.get('content-security-policy')))",
                json!([]),
            )
            .unwrap();
        assert!(
            csp.as_str()
                .unwrap_or("")
                .contains("script-src 'self' 'wasm-unsafe-eval'"),
            "{page}: served with {csp}"
        );
        if page != "references" {
            wait_all_live(&c);
        }
        // mdBook's own scripts ran: the theme from localStorage, the sidebar, the navigation.
        let state = c
            .eval(
                "return [document.documentElement.className, document.querySelectorAll('#mdbook-sidebar a').length]",
                json!([]),
            )
            .unwrap();
        let class = state[0].as_str().unwrap();
        assert!(
            class.contains("coal") && class.contains("js"),
            "{page}: {state}"
        );
        assert!(
            state[1].as_u64().unwrap() > 10,
            "{page}: the sidebar: {state}"
        );
        let refused: Vec<_> = c
            .console()
            .unwrap()
            .into_iter()
            .filter(|m| m["message"].to_string().contains("Content Security Policy"))
            .collect();
        assert!(refused.is_empty(), "{page}: {refused:?}");
    }
}

#[test]
fn copy_link_says_what_happened_and_shows_the_link_when_it_could_not_copy() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/peak.html?batch=3", served())).unwrap();
    wait_widget(&c, "timeline");
    // The clipboard refuses (as a browser may, without permission).
    c.eval(
        "Object.defineProperty(navigator, 'clipboard', {value: {writeText: () => Promise.reject(new Error('denied'))}}); return true",
        json!([]),
    )
    .unwrap();
    c.click(&c.find("[data-widget=timeline] .gm-tools button").unwrap())
        .unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=timeline] .gm-status').textContent.includes('Not copied')",
        Duration::from_secs(5),
    )
    .unwrap();
    let got = c
        .eval(
            "return [document.querySelector('[data-widget=timeline] .gm-status').textContent, \
             document.querySelector('[data-widget=timeline] .gm-status input').value, location.href]",
            json!([]),
        )
        .unwrap();
    assert!(!got[0].as_str().unwrap().contains("Link copied"), "{got}");
    // The page's address, at the widget's section (peak.md's "## The step's timeline").
    let page = got[2].as_str().unwrap();
    let at = format!("{}#timeline", &page[..page.find('#').unwrap_or(page.len())]);
    assert_eq!(got[1], at.as_str(), "the link is shown to copy by hand");
    assert!(got[1].as_str().unwrap().contains("batch=3"), "{got}");
    // When the clipboard takes it, it says so.
    c.eval(
        "Object.defineProperty(navigator, 'clipboard', {value: {writeText: t => { window.copied = t; return Promise.resolve(); }}}); return true",
        json!([]),
    )
    .unwrap_or_default();
    c.goto(&format!("{}/peak.html?batch=3", served())).unwrap();
    wait_widget(&c, "timeline");
    c.eval(
        "Object.defineProperty(navigator, 'clipboard', {value: {writeText: t => { window.copied = t; return Promise.resolve(); }}}); return true",
        json!([]),
    )
    .unwrap();
    c.click(&c.find("[data-widget=timeline] .gm-tools button").unwrap())
        .unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=timeline] .gm-status').textContent.startsWith('Link copied') && window.copied === location.href.split('#')[0] + '#timeline'",
        Duration::from_secs(5),
    )
    .unwrap();
    // A link copied at once after a change carries the change (the URL is written for it,
    // before the knobs rest).
    c.eval(
        "window.copied = ''; \
         document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 6}})); \
         document.querySelector('[data-widget=timeline] .gm-tools button').click(); return true",
        json!([]),
    )
    .unwrap();
    c.wait_for(
        "return window.copied.includes('batch=6')",
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            c.eval("return window.copied", json!([])).unwrap()
        )
    });
}

/// A chart saved as SVG carries the note its figure gives under it ("▲ beyond the chart: up
/// to …"): the file is read away from the page, and without it the areas cut at the top
/// would say nothing of how high they go.
#[test]
fn a_saved_chart_carries_its_note() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/activations.html", served())).unwrap();
    wait_widget(&c, "sweep");
    let got = c
        .eval(
            "window.saved = []; HTMLAnchorElement.prototype.click = function () { window.saved.push(this.href); }; \
             const f = document.querySelector('[data-widget=sweep]'); \
             [...f.querySelectorAll('.gm-tools button')].find(b => b.textContent === 'Save SVG').click(); \
             const note = f.querySelector('svg.gm-chart + .gm-note'); \
             return [note ? note.textContent : '', decodeURIComponent((window.saved[0] || ',').split(',').slice(1).join(','))];",
            json!([]),
        )
        .unwrap();
    let (note, file) = (got[0].as_str().unwrap(), got[1].as_str().unwrap());
    assert!(note.contains("GiB") && note.contains("× the GPU"), "{note}");
    // As text in the file, escaped as the rest.
    let shown = note
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(
        file.starts_with("<svg") && file.contains(&format!(">{shown}</text>")),
        "{file}"
    );
}

/// The sweep's axis, which is not a knob, comes back from a copied link: the toggle writes
/// it into the URL (`scale=log`) beside the knobs, and a page opened at that URL starts on it;
/// a value other than `log` or `linear` is ignored.
#[test]
fn a_copied_link_brings_the_sweeps_axis_back() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html?batch=2", served()))
        .unwrap();
    wait_widget(&c, "sweep");
    let pressed = "return document.querySelector('[data-widget=sweep] [role=radio][aria-checked=true]').textContent";
    assert_eq!(c.eval(pressed, json!([])).unwrap(), "linear");
    c.click(
        &c.find("[data-widget=sweep] [role=radio][data-i='1']")
            .unwrap(),
    )
    .unwrap();
    wait_url(&c, "location.search.includes('scale=log')");
    assert!(c
        .eval("return location.search", json!([]))
        .unwrap()
        .as_str()
        .unwrap()
        .contains("batch=2"));
    // A knob changed afterwards keeps the axis in the URL.
    c.eval(
        "document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 3}})); return true",
        json!([]),
    )
    .unwrap();
    wait_url(
        &c,
        "location.search.includes('batch=3') && location.search.includes('scale=log')",
    );
    let link = c.eval("return location.href", json!([])).unwrap();
    c.goto(link.as_str().unwrap()).unwrap();
    wait_widget(&c, "sweep");
    c.wait_for(
        &format!("{pressed} === 'log (doublings)'"),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|e| panic!("{e}: {}", c.eval(pressed, json!([])).unwrap()));
    // Back to linear, and a link with a hostile value: the page's own axis.
    c.click(
        &c.find("[data-widget=sweep] [role=radio][data-i='0']")
            .unwrap(),
    )
    .unwrap();
    wait_url(&c, "location.search.includes('scale=linear')");
    c.goto(&format!(
        "{}/budget.html?scale=%3Cimg%20src=x%20onerror=alert(1)%3E",
        served()
    ))
    .unwrap();
    wait_widget(&c, "sweep");
    assert_eq!(c.eval(pressed, json!([])).unwrap(), "linear");
    assert_no_console_errors(&c);
}

/// A long fast drag leaves the URL at the slider's last value. The URL is written once the
/// knobs rest, not on every change: Chromium ignores `history.replaceState` past 200 calls
/// in 10 s ("Throttling navigation"), which left the URL at the drag's 200th value.
#[test]
fn a_long_fast_drag_leaves_the_url_at_its_last_value() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html", served())).unwrap();
    wait_widget(&c, "allocator");
    // 250 frames, the slider moved on each, as a reader's drag does; then one last value.
    let got = c
        .eval_async(
            "const done = arguments[0]; \
             const i = document.querySelector('[data-widget=allocator] input[id$=-batch]'); \
             let calls = 0; const rs = History.prototype.replaceState; \
             History.prototype.replaceState = function (...a) { calls++; return rs.apply(this, a); }; \
             let n = 0; \
             const step = () => { \
               i.value = n < 250 ? String(20 + 10 * (n % 3)) : '60'; \
               i.dispatchEvent(new Event('input', {bubbles: true})); \
               if (n++ < 250) requestAnimationFrame(step); else done(calls); \
             }; \
             requestAnimationFrame(step);",
            json!([]),
        )
        .unwrap();
    assert!(
        got.as_u64().unwrap() < 10,
        "the URL is not rewritten on every change: {got} writes"
    );
    c.wait_for(
        "const i = document.querySelector('[data-widget=allocator] input[id$=-batch]'); \
         return i.getAttribute('aria-valuenow') !== '1' \
           && new URLSearchParams(location.search).get('batch') === i.getAttribute('aria-valuenow')",
        Duration::from_secs(5),
    )
    .unwrap_or_else(|e| {
        let now = c
            .eval(
                "return [location.search, document.querySelector('[data-widget=allocator] input[id$=-batch]').getAttribute('aria-valuenow')]",
                json!([]),
            )
            .unwrap();
        panic!("{e}: {now}")
    });
    let console = c.console().unwrap();
    assert!(
        !console
            .iter()
            .any(|m| m["message"].to_string().contains("Throttling navigation")),
        "{console:?}"
    );
}

/// The budget the brief sets for the widgets' one bundle: 320 KB gzipped (as a static host
/// serves it, `gzip -9`).
#[test]
fn the_wasm_bundle_stays_within_its_budget() {
    let bytes = std::fs::read(site().dest.join("gpumem/gpumem_widgets_bg.wasm")).unwrap();
    let gz = gpumem_site::gzip_len(&bytes);
    assert!(gz <= 320_000, "wasm is {gz} bytes gzipped, over 320 KB");
}

/// The engine's estimate for knobs, as the widgets show it.
fn estimate_of(knobs: &[(&str, &str)]) -> gpumem::Estimate {
    widget_estimate(gpumem::knobs::scenario(knobs.iter().copied()).unwrap())
}

/// The text of the first element `css` matches.
fn text_of(c: &Chrome, css: &str) -> String {
    c.eval(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''",
        json!([css]),
    )
    .unwrap()
    .as_str()
    .unwrap_or("")
    .to_string()
}

#[test]
fn the_timeline_names_the_peak_the_cli_reports_and_its_ops_take_the_keys() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/peak.html", served())).unwrap();
    wait_widget(&c, "timeline");
    // The peak chapter's scenario.
    let knobs = [
        ("model", "llama3.1-8b"),
        ("batch", "1"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ];
    let e = estimate_of(&knobs);
    // The peak's segment (the op in the tab order) and the whole step's column at the peak
    // name the moment the CLI reports as peak_phase, and their size.
    let peak_op = text_of(&c, "[data-widget=timeline] .gm-peak-op title");
    assert!(
        peak_op.starts_with(&e.peak_phase),
        "{peak_op} / {}",
        e.peak_phase
    );
    assert!(
        peak_op.ends_with(&format!("→ {} allocated", gib(e.peak_bytes as f64))),
        "{peak_op}"
    );
    // The column names the peak, then the stretch of the step it stands for.
    let column = text_of(&c, "[data-widget=timeline] .gm-hits [tabindex='0'] title");
    assert!(column.starts_with(&peak_op), "{column} / {peak_op}");
    assert!(text_of(&c, "[data-widget=timeline] [data-value=op]").starts_with(&e.peak_phase));
    // Arrow keys move along the ops; the readout follows the focus.
    c.eval(
        "const op = document.querySelector('[data-widget=timeline] .gm-peak-op'); op.focus(); \
         op.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowLeft', bubbles: true})); return true",
        json!([]),
    )
    .unwrap();
    let moved = c
        .eval(
            "const a = document.activeElement; return [a.getAttribute('data-i'), a.querySelector('title').textContent, \
             document.querySelector('[data-widget=timeline] .gm-peak-op').getAttribute('data-i'), \
             document.querySelector('[data-widget=timeline] [data-value=op]').textContent, location.hash]",
            json!([]),
        )
        .unwrap();
    let (now, before) = (
        moved[0].as_str().unwrap().parse::<i64>().unwrap(),
        moved[2].as_str().unwrap().parse::<i64>().unwrap(),
    );
    assert_eq!(now, before - 1, "{moved}");
    assert_eq!(moved[1], moved[3], "the readout names the focused op");
    assert_eq!(moved[4], "", "the arrow key did not turn the page");
    // The page's state moves the peak.
    c.eval(
        "document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {batch: 1, seq: '8k'}})); return true",
        json!([]),
    )
    .unwrap();
    let e2 = estimate_of(&[
        ("model", "llama3.1-8b"),
        ("batch", "1"),
        ("seq", "8k"),
        ("precision", "bf16"),
    ]);
    c.wait_for(
        &format!(
            "const t = document.querySelector('[data-widget=timeline] .gm-peak-op title'); return t && t.textContent.endsWith('→ {} allocated')",
            gib(e2.peak_bytes as f64)
        ),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(text_of(&c, "[data-widget=timeline] .gm-peak-op title").starts_with(&e2.peak_phase));
    assert_no_console_errors(&c);
}

#[test]
fn an_exercise_marks_right_and_wrong_and_its_answer_follows_the_model() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html", served())).unwrap();
    wait_live(&c);
    wait_widget(&c, "exercise");
    let ex = "[data-widget=exercise][data-ask=device]";
    let check = |answer: &str| -> String {
        let field = c.find(&format!("{ex} input")).unwrap();
        c.clear(&field).unwrap();
        c.send_keys(&field, answer).unwrap();
        c.click(&c.find(&format!("{ex} button")).unwrap()).unwrap();
        c.wait_for(
            &format!(
                "return document.querySelector('{ex} [data-value=verdict]').textContent.length > 0"
            ),
            Duration::from_secs(5),
        )
        .unwrap();
        text_of(&c, &format!("{ex} [data-value=verdict]"))
    };
    let g = |b: u64| b as f64 / 1073741824.0;
    let e = budget_estimate();
    let right = gpumem::num::fixed(g(e.device_bytes), 2);
    let v = check(&right);
    assert!(v.starts_with("✓ Right"), "{right}: {v}");
    let wrong = gpumem::num::fixed(g(e.device_bytes) * 1.25, 2);
    let v = check(&wrong);
    assert!(
        v.starts_with("✗ Not quite") && v.contains("too high"),
        "{wrong}: {v}"
    );
    assert!(check("twelve").starts_with("Type a number"));
    // Another model: the old answer is now wrong, the engine's new one right.
    c.eval(
        "document.dispatchEvent(new CustomEvent('gpumem:set', {detail: {model: 'llama3.2-1b'}})); return true",
        json!([]),
    )
    .unwrap();
    c.wait_for(
        &format!(
            "return document.querySelector('{ex} .gm-sub').textContent.startsWith('llama3.2-1b')"
        ),
        Duration::from_secs(10),
    )
    .unwrap();
    let e1 = budget_with(&[("model", "llama3.2-1b")]);
    assert!(check(&right).starts_with("✗"), "the old answer");
    let v = check(&gpumem::num::fixed(g(e1.device_bytes), 2));
    assert!(v.starts_with("✓ Right"), "{v}");
    // The worked solution carries the same answer, with the page's numbers.
    let solution = text_of(&c, &format!("{ex} [data-value=answer]"));
    assert_eq!(
        solution,
        format!("Answer: {}.", gib(e1.device_bytes as f64))
    );
    assert_no_console_errors(&c);
}

/// (the first peak, the last, the sum of the steps) of the page's waterfall `css`.
const WATERFALL: &str = "const t = document.querySelector(arguments[0] + ' table'); \
    return [Number(t.dataset.from), Number(t.dataset.to), \
    [...t.querySelectorAll('tr[data-bytes]')].reduce((s, r) => s + Number(r.dataset.bytes), 0)]";

#[test]
fn the_diffs_steps_add_up_to_the_difference_of_the_two_peaks() {
    let c = Chrome::start().unwrap_or_else(|e| panic!("{e}"));
    c.goto(&format!("{}/budget.html", served())).unwrap();
    wait_live(&c);
    wait_widget(&c, "diff");
    let w = c.eval(WATERFALL, json!(["[data-widget=diff]"])).unwrap();
    let (a, b) = (
        budget_estimate(),
        budget_with(&[("precision", "mixed-bf16")]),
    );
    assert_eq!(w[0].as_u64(), Some(a.peak_bytes), "{w}");
    assert_eq!(w[1].as_u64(), Some(b.peak_bytes), "{w}");
    assert_eq!(
        w[2].as_i64(),
        Some(b.peak_bytes as i64 - a.peak_bytes as i64),
        "{w}"
    );
    // On the "what now" chapter: a remedy used moves the page, and the waterfall goes from
    // the chapter's step to it, step by step.
    c.goto(&format!("{}/what-now.html", served())).unwrap();
    wait_all_live(&c);
    c.click(&c.find("[data-remedy=recompute-full] button").unwrap())
        .unwrap();
    c.wait_for(
        "return document.querySelectorAll('[data-widget=diff] tr[data-bytes]').length > 0",
        Duration::from_secs(10),
    )
    .unwrap();
    // The list is made anew, the pressed button with it: the focus is on the list, not
    // back at the page's start (a keyboard reader's review).
    c.wait_for(
        "return document.activeElement.classList.contains('gm-remedy-list')",
        Duration::from_secs(5),
    )
    .unwrap();
    let base = [
        ("model", "llama3.1-8b"),
        ("batch", "4"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ];
    let mut used = base.to_vec();
    used.push(("recompute", "full"));
    let (a, b) = (estimate_of(&base), estimate_of(&used));
    let w = c.eval(WATERFALL, json!(["[data-widget=diff]"])).unwrap();
    assert_eq!(
        (w[0].as_u64(), w[1].as_u64(), w[2].as_i64()),
        (
            Some(a.peak_bytes),
            Some(b.peak_bytes),
            Some(b.peak_bytes as i64 - a.peak_bytes as i64)
        ),
        "{w}"
    );
    wait_url(&c, "location.search.includes('recompute=full')");
    assert_no_console_errors(&c);
}

/// The peak chapter's section on reserved memory: the caching allocator replayed when the
/// book is built (the wasm does not carry the replay), its figures and the segments drawn
/// for the page's scenario, with no host element (the browser keeps them as drawn).
#[test]
fn the_allocator_section_carries_the_replayed_figures() {
    let html = read(&site().dest.join("peak.html"));
    let e = gpumem::knobs::scenario([
        ("model", "llama3.1-8b"),
        ("batch", "1"),
        ("seq", "2k"),
        ("precision", "bf16"),
    ])
    .and_then(|s| gpumem::estimate(&s))
    .unwrap();
    assert!(e.reserved_replayed && e.fits);
    for (q, b) in [
        ("reserved", e.peak_reserved_bytes),
        ("nvidia_smi", e.device_bytes),
        ("largest_free_block", e.largest_free_block_bytes),
    ] {
        let shown = format!(r#"data-quantity="{q}">{}<"#, gib(b as f64));
        assert!(html.contains(&shown), "{shown}");
    }
    assert!(html.contains(r#"data-widget="segments""#));
    assert!(html.contains("gm-blk-a"));
    assert!(!html.contains(r#"&quot;widget&quot;:&quot;segments&quot;"#));
}
