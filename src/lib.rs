//! The site builder: the widgets to wasm, their bindings, KaTeX's assets and the book, into
//! one static site; and a server that rebuilds it on change. All automation is Rust here.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub mod browser;
pub mod katex;
pub mod serve;
pub mod wasm;

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The cargo that runs us (so nested builds use the same toolchain).
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Where things are.
#[derive(Clone, Debug)]
pub struct Paths {
    /// The repository root (book.toml, Cargo.toml).
    pub root: PathBuf,
    /// Cargo's target directory.
    pub target: PathBuf,
    /// Where the site goes.
    pub dest: PathBuf,
}

impl Paths {
    pub fn new(root: PathBuf, dest: Option<PathBuf>) -> Paths {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .map(|t| if t.is_relative() { root.join(t) } else { t })
            .unwrap_or_else(|| root.join("target"));
        let dest = dest.unwrap_or_else(|| target.join("site"));
        Paths { root, target, dest }
    }

    /// The bindings and wasm, ready to copy into a site.
    fn bundle(&self) -> PathBuf {
        self.target.join("gpumem-bundle")
    }
}

/// What a build did, and how long each part took.
#[derive(Debug, Default)]
pub struct Report {
    pub wasm: Duration,
    pub book: Duration,
    pub wasm_bytes: u64,
    pub wasm_gzip_bytes: u64,
}

/// Build the widgets' wasm bundle and fetch KaTeX's assets (cached; slow the first time).
pub fn build_assets(p: &Paths) -> Result<Duration> {
    let t = Instant::now();
    wasm::ensure_target(&p.root)?;
    let module = wasm::build(&p.root, &p.target)?;
    let tmp = p.bundle().with_extension("tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    wasm::bindgen(&module, &tmp)?;
    std::fs::copy(p.root.join("widgets/loader.js"), tmp.join("gpumem.js"))
        .map_err(|e| format!("widgets/loader.js: {e}"))?;
    // Only the site builder ships this: it hides the note that plain mdBook builds carry
    // (book/theme/index.hbs), since here the widgets' assets and KaTeX's are in the site.
    std::fs::write(
        tmp.join("site.css"),
        "/* Written by the site builder: the widgets' and KaTeX's assets are here. */\n.gm-assets-note { display: none; }\n",
    )?;
    let _ = std::fs::remove_dir_all(p.bundle());
    std::fs::rename(&tmp, p.bundle())?;
    katex::assets(&p.target)?;
    Ok(t.elapsed())
}

/// Build the book into a staging directory and swap it in: the previous site stays whole
/// until the new one is complete, and a failed build leaves no half-written site.
pub fn build_book(p: &Paths) -> Result<Duration> {
    let t = Instant::now();
    clean_stale(&p.dest);
    let staging = sibling(&p.dest, "staging", std::process::id());
    let _ = std::fs::remove_dir_all(&staging);
    let result = (|| -> Result<()> {
        let mut book =
            mdbook_driver::MDBook::load(&p.root).map_err(|e| format!("book.toml: {e:#}"))?;
        book.config.build.build_dir = staging.clone();
        book.with_preprocessor(mdbook_katex::preprocess::KatexProcessor);
        book.with_preprocessor(mdbook_gpumem::GpumemPreprocessor);
        book.build().map_err(|e| format!("{e:#}"))?;
        // mdBook copies every non-markdown file of book/, the theme's templates included.
        let _ = std::fs::remove_dir_all(staging.join("theme"));
        copy_dir(&p.bundle(), &staging.join("gpumem"))
            .map_err(|e| format!("the wasm bundle ({}): {e}", p.bundle().display()))?;
        copy_dir(
            &p.target.join(format!("katex-{}", katex::VERSION)),
            &staging.join("katex"),
        )
        .map_err(|e| format!("KaTeX's assets: {e}"))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let old = sibling(&p.dest, "old", std::process::id());
    if p.dest.exists() {
        std::fs::rename(&p.dest, &old)?;
    }
    std::fs::rename(&staging, &p.dest)?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(t.elapsed())
}

/// `target/site.staging-PID`, `target/site.old-PID`: a build's scratch next to the site.
fn sibling(dest: &Path, kind: &str, pid: u32) -> PathBuf {
    dest.with_extension(format!("{kind}-{pid}"))
}

/// Remove what builds that were killed left next to `dest` (their staging and old sites),
/// leaving alone those of builds still running. If a build was killed between moving the old
/// site away and moving the new one in, the old site is put back first.
pub fn clean_stale(dest: &Path) {
    let (Some(parent), Some(_)) = (dest.parent(), dest.file_name()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = |kind: &str| {
        dest.with_extension(format!("{kind}-"))
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
    };
    let kinds = [("staging", prefix("staging")), ("old", prefix("old"))];
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        for (kind, pre) in &kinds {
            let Some(pid) = pre
                .as_deref()
                .and_then(|pre| name.strip_prefix(pre))
                .and_then(|rest| rest.parse::<u32>().ok())
            else {
                continue;
            };
            if pid == std::process::id() || alive(pid) {
                continue;
            }
            let path = e.path();
            if *kind == "old" && !dest.exists() && std::fs::rename(&path, dest).is_ok() {
                continue;
            }
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Whether a process runs with this id (Linux's /proc; elsewhere every other build is taken
/// as gone).
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Everything: assets, then the book.
pub fn build(p: &Paths) -> Result<Report> {
    let wasm = build_assets(p)?;
    let book = build_book(p)?;
    let wasm_file = p.dest.join("gpumem/gpumem_widgets_bg.wasm");
    let bytes = std::fs::read(&wasm_file)?;
    Ok(Report {
        wasm,
        book,
        wasm_bytes: bytes.len() as u64,
        wasm_gzip_bytes: gzip_len(&bytes),
    })
}

/// Size after `gzip -9`, as a static host would serve it.
pub fn gzip_len(bytes: &[u8]) -> u64 {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let _ = e.write_all(bytes);
    e.finish().map(|v| v.len() as u64).unwrap_or(0)
}

/// Copy a directory tree (files and directories; links are copied as what they point at).
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), dest)?;
        }
    }
    Ok(())
}
