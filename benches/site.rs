//! Site budgets, measured: the wasm bundle's size, the rebuild after one markdown edit, and
//! slider input → updated DOM in headless Chromium. `cargo bench --bench site`.
//!
//! Budgets: wasm ≤ 320 KB gzipped; rebuild ≤ 5 s; slider input → DOM within one frame.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use gpumem_site::browser::Chrome;
use gpumem_site::{build, build_book, serve, Paths};
use serde_json::json;

/// Slider timing, in the page: with the widget `view` in the middle of the window, set the
/// batch slider of `widget`, dispatch `input` as the browser does, and stop the clock when the
/// DOM of `watched` (a widget on the same page; or the element `inside` it that the selector
/// names) has changed (a MutationObserver fires), and again
/// when the page has been laid out (what is left for the frame is painting). `wait` ms between
/// inputs (0: the next frame); a widget off screen is brought up to date once the knobs rest.
const SLIDER_SCRIPT: &str = r#"
const done = arguments[arguments.length - 1];
const [n, widget, input, watched, view, wait, inside] = arguments;
const fig = document.querySelector(`[data-widget=${widget}]`);
const watch = document.querySelector(`[data-widget=${watched}] ${inside}`.trim());
const slider = fig.querySelector(input);
document.querySelector(`[data-widget=${view}]`).scrollIntoView({ block: 'center' });
const times = [];
let i = 0;
// A batch slider on a log track (its aria-valuemax is the batch, its max the last
// position): the position that gives batch b.
const lo = Number(slider.getAttribute('aria-valuemin')), hi = Number(slider.getAttribute('aria-valuemax'));
const logTrack = slider.type === 'range' && hi !== Number(slider.max);
const at = b => logTrack
  ? String(Math.round(Math.log2(b / lo) / Math.log2(hi / lo) * Number(slider.max)))
  : String(b);
function step() {
  if (i === n) { done(times); return; }
  const v = at(1 + (i % 2 === 0 ? 7 : 0) + (i % 3));
  if (slider.value === v) { i++; step(); return; }
  const obs = new MutationObserver(() => {
    const dom = performance.now() - t0;
    void document.body.offsetHeight;
    times.push([dom, performance.now() - t0]);
    obs.disconnect();
    i++;
    requestAnimationFrame(() => setTimeout(step, wait));
  });
  obs.observe(watch, { subtree: true, childList: true, characterData: true, attributes: true });
  const t0 = performance.now();
  slider.value = v;
  // Sliders apply on input; the 5D panel's number fields on change (Enter, leaving the field).
  slider.dispatchEvent(new Event('input', { bubbles: true }));
  slider.dispatchEvent(new Event('change', { bubbles: true }));
}
step();
"#;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let d = to.join(e.file_name());
        if e.path().is_dir() {
            copy(&e.path(), &d);
        } else {
            std::fs::copy(e.path(), d).unwrap();
        }
    }
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let p = Paths::new(root.clone(), Some(root.join("target/bench-site")));
    let r = build(&p).expect("site build");
    println!(
        "wasm bundle: {} bytes, {} bytes gzipped (budget 320 KB gzipped)",
        r.wasm_bytes, r.wasm_gzip_bytes
    );

    // Rebuild after one markdown edit, on a copy of the book.
    let tmp = std::env::temp_dir().join(format!("gpumem-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    copy(&root.join("book"), &tmp.join("book"));
    // The validation chapter reads the measurements at build time.
    copy(&root.join("tests/data"), &tmp.join("tests/data"));
    std::fs::create_dir_all(tmp.join("widgets")).unwrap();
    std::fs::copy(
        root.join("widgets/gpumem.css"),
        tmp.join("widgets/gpumem.css"),
    )
    .unwrap();
    std::fs::copy(root.join("book.toml"), tmp.join("book.toml")).unwrap();
    let tp = Paths {
        root: tmp.clone(),
        target: p.target.clone(),
        dest: tmp.join("site"),
    };
    build_book(&tp).expect("book build");
    let mut rebuilds = Vec::new();
    for i in 0..5 {
        let ch = tmp.join("book/budget.md");
        let mut text = std::fs::read_to_string(&ch).unwrap();
        text.push_str(&format!("\nEdit {i}.\n"));
        std::fs::write(&ch, text).unwrap();
        rebuilds.push(build_book(&tp).expect("rebuild").as_secs_f64());
    }
    println!(
        "rebuild after one markdown edit: median {:.3} s over 5 (budget 5 s)",
        median(&mut rebuilds)
    );
    let _ = std::fs::remove_dir_all(&tmp);

    // Slider → DOM in headless Chromium.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let dir = p.dest.clone();
    std::thread::spawn(move || serve::serve_dir(listener, dir, Arc::new(AtomicU64::new(1)), false));
    let c = Chrome::start().expect("chromium");
    c.goto(&format!("{base}/budget.html")).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=allocator][data-live]') !== null",
        Duration::from_secs(20),
    )
    .unwrap();
    let time = |what: &str,
                (widget, input): (&str, &str),
                (watched, view): (&str, &str),
                wait: u64,
                n: u64,
                inside: &str| {
        // Let the page settle where it is scrolled to (the widgets near the screen known).
        std::thread::sleep(Duration::from_millis(500));
        let v = c
            .eval_async(
                SLIDER_SCRIPT,
                json!([n, widget, input, watched, view, wait, inside]),
            )
            .unwrap();
        // (DOM updated, and laid out) for each input.
        let pick = |i: usize| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .filter_map(|x| x[i].as_f64())
                .collect()
        };
        let (mut dom, mut laid) = (pick(0), pick(1));
        let n = laid.len();
        let (dom_med, med) = (median(&mut dom), median(&mut laid));
        let p95 = laid[(n * 95 / 100).min(n - 1)];
        println!("{what}: median {med:.2} ms, p95 {p95:.2} ms over {n} inputs (the DOM updated: median {dom_med:.2} ms; one frame: 16.7 ms)");
    };
    let batch = ("allocator", "input[id$=-batch]");
    time(
        "budget page, batch slider → its widget (on screen) updated and laid out",
        batch,
        ("allocator", "allocator"),
        0,
        200,
        "",
    );
    // The op-level timeline on the same page, in view: the clock stopped when it has been
    // redrawn (its step replayed with every event, unrolled and drawn) and laid out.
    time(
        "budget page, batch slider → op-level timeline (on screen) redrawn and laid out",
        batch,
        ("timeline", "timeline"),
        0,
        200,
        "",
    );
    // A widget off screen: brought up to date, with the others off screen, once the slider
    // rests (120 ms; the clock includes the rest).
    time(
        "budget page, batch slider → the sweep (off screen) after the rest",
        batch,
        ("sweep", "allocator"),
        300,
        30,
        "",
    );
    // The 5D panel: every micro-batch change re-estimates all stages and re-plans the layouts
    // of 64 GPUs (70B, 8k tokens).
    c.goto(&format!("{base}/parallelism.html")).unwrap();
    c.wait_for(
        "return document.querySelector('[data-widget=parallelism][data-live]') !== null",
        Duration::from_secs(20),
    )
    .unwrap();
    time(
        "5D panel with the live planner, micro-batch input → panel updated and laid out",
        ("parallelism", "input[id$=-batch]"),
        ("parallelism", "parallelism"),
        0,
        60,
        "",
    );
    // Its planner follows once the knobs rest (120 ms; the clock includes the rest): the
    // clock stops when the plan's caption has changed.
    time(
        "5D panel, micro-batch input → the planner's table after the rest",
        ("parallelism", "input[id$=-batch]"),
        ("parallelism", "parallelism"),
        300,
        30,
        "table.gm-plan caption",
    );
}
