//! Screenshots of every chapter, as a reader sees them: `cargo run --release --example shots
//! -- [--widths 1400,390] [--themes light,coal] [--pages budget,zero]` after
//! `cargo run --release -- build`. Pages go to
//! target/shots/WIDTH-THEME-PAGE-N.png, in pieces; pages
//! that scroll sideways are named on stderr.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use gpumem_site::browser::Chrome;
use gpumem_site::serve;
use serde_json::json;

const PAGES: &[&str] = &[
    "index",
    "budget",
    "precision",
    "optimizer",
    "activations",
    "logits",
    "peak",
    "zero",
    "parallelism",
    "finetuning",
    "inference",
    "what-now",
    "validation",
    "references",
];

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut widths = vec![1400u32, 390];
    let mut themes = vec!["light".to_string(), "coal".to_string()];
    let mut pages: Vec<String> = PAGES.iter().map(|p| p.to_string()).collect();
    let mut site = root.join("target/site");
    let mut out = root.join("target/shots");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        let list = || v.split(',').map(str::to_string).collect::<Vec<_>>();
        match a.as_str() {
            "--widths" => widths = list().iter().map(|w| w.parse().unwrap()).collect(),
            "--themes" => themes = list(),
            "--pages" => pages = list(),
            "--site" => site = PathBuf::from(&v),
            "--out" => out = PathBuf::from(&v),
            _ => panic!("unknown argument {a}"),
        }
    }
    std::fs::create_dir_all(&out).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        serve::serve_dir(listener, site, Arc::new(AtomicU64::new(1)), false)
    });
    let c = Chrome::start().unwrap();
    for w in &widths {
        c.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": w, "height": 900, "deviceScaleFactor": 1, "mobile": *w < 600}),
        )
        .unwrap();
        for theme in &themes {
            c.goto(&format!("{base}/index.html")).unwrap();
            c.eval(
                "localStorage.setItem('mdbook-theme', arguments[0]); return true",
                json!([theme]),
            )
            .unwrap();
            for page in &pages {
                c.goto(&format!("{base}/{page}.html")).unwrap();
                let _ = c.wait_for(
                    "return document.querySelectorAll('[data-gpumem]').length === document.querySelectorAll('[data-gpumem] > [data-live], [data-gpumem] [data-live]').length",
                    Duration::from_secs(20),
                );
                std::thread::sleep(Duration::from_millis(400));
                let wide = c
                    .eval(
                        "return [document.documentElement.scrollWidth, innerWidth, document.documentElement.scrollHeight]",
                        json!([]),
                    )
                    .unwrap();
                if wide[0].as_f64() > wide[1].as_f64() {
                    eprintln!("{w} {theme} {page}: scrolls sideways ({wide})");
                }
                // In pieces of a screen and a half, each readable on its own.
                let h = wide[2].as_f64().unwrap_or(900.0);
                let chunk: f64 = if *w < 600 { 1200.0 } else { 1100.0 };
                let mut y = 0.0;
                let mut i = 1;
                while y < h {
                    let png = c
                        .screenshot_clip(0.0, y, *w as f64, chunk.min(h - y))
                        .unwrap();
                    let f = out.join(format!("{w}-{theme}-{page}-{i}.png"));
                    std::fs::write(&f, png).unwrap();
                    y += chunk;
                    i += 1;
                }
                eprintln!("{w} {theme} {page}: {i} pieces", i = i - 1);
            }
        }
    }
}
