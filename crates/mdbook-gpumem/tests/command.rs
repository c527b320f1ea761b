//! `mdbook-gpumem` as mdBook runs a command preprocessor: `supports RENDERER`, then the
//! `[context, book]` JSON on stdin and the processed book on stdout.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use mdbook_preprocessor::book::{Book, BookItem, Chapter};
use mdbook_preprocessor::config::Config;
use mdbook_preprocessor::PreprocessorContext;

const BIN: &str = env!("CARGO_BIN_EXE_mdbook-gpumem");

fn run(content: &str) -> (bool, String, String) {
    let mut config = Config::default();
    config.book.src = PathBuf::from("book");
    let ctx = PreprocessorContext::new(PathBuf::from("."), config, "html".into());
    let mut book = Book::new();
    book.push_item(Chapter::new(
        "Budget",
        content.to_string(),
        "budget.md",
        vec![],
    ));
    let input = serde_json::to_string(&(ctx, book)).unwrap();
    let mut child = Command::new(BIN)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn answers_supports_for_html_only() {
    assert!(Command::new(BIN)
        .args(["supports", "html"])
        .status()
        .unwrap()
        .success());
    assert!(!Command::new(BIN)
        .args(["supports", "latex"])
        .status()
        .unwrap()
        .success());
}

#[test]
fn expands_directives_in_the_book_it_is_given() {
    let (ok, stdout, stderr) = run("# Budget\n\n{{#gpumem allocator preset=llama3.2-1b}}\n");
    assert!(ok, "{stderr}");
    let book: Book = serde_json::from_str(&stdout).unwrap();
    let BookItem::Chapter(ch) = &book.items[0] else {
        panic!("not a chapter")
    };
    assert!(
        ch.content.contains("data-widget=\"allocator\""),
        "{}",
        ch.content
    );
    assert!(ch.content.contains("llama3.2-1b"));
}

#[test]
fn a_bad_directive_fails_with_file_and_line() {
    let (ok, stdout, stderr) = run("# Budget\n\n{{#gpumem allocator batch=zero}}\n");
    assert!(!ok);
    assert!(stdout.is_empty(), "no book is written on failure");
    assert!(stderr.contains("book/budget.md:3: batch:"), "{stderr}");
}
