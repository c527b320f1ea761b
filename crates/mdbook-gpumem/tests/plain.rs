//! The book under the conventions: built as plain `mdbook build` does, with `mdbook-gpumem`
//! run as a command (and `mdbook-katex` absent, which book.toml marks optional). The pages
//! carry the pre-rendered widgets, say where their live versions come from, and load no
//! inline script.

use std::path::PathBuf;

use mdbook_driver::config::Config;
use mdbook_driver::MDBook;

const BIN: &str = env!("CARGO_BIN_EXE_mdbook-gpumem");

#[test]
fn plain_mdbook_builds_the_book_with_the_command() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::env::temp_dir().join(format!("gpumem-plain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut config = Config::from_disk(root.join("book.toml")).unwrap();
    config.set("preprocessor.gpumem.command", BIN).unwrap();
    config
        .set("preprocessor.katex.command", "mdbook-katex-not-installed")
        .unwrap();
    config.build.build_dir = out.clone();
    let book = MDBook::load_with_config(&root, config).unwrap();
    book.build().unwrap_or_else(|e| panic!("{e:#}"));
    let page = std::fs::read_to_string(out.join("budget.html")).unwrap();
    assert!(page.contains(r#"data-widget="allocator""#), "pre-rendered");
    assert!(page.contains("class=\"gm-assets-note\""), "the note");
    assert!(page.contains("Cite this section"));
    for script in page.split("<script").skip(1) {
        let tag = &script[..script.find('>').unwrap()];
        assert!(
            tag.contains("src=") || tag.contains("application/json"),
            "an inline script: <script{tag}>"
        );
    }
    for f in [
        "scripts/mdbook-theme.js",
        "scripts/gpumem-page.js",
        "widgets",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    // print.html: every chapter's widgets, each chapter's ids its own.
    let print = std::fs::read_to_string(out.join("print.html")).unwrap();
    assert!(print.contains("id=\"budget-1-batch\"") && print.contains("id=\"zero-1-params\""));
    let _ = std::fs::remove_dir_all(&out);
}
