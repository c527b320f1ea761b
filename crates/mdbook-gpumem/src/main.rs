//! `mdbook-gpumem`: the preprocessor as an mdBook command (`[preprocessor.gpumem]` in
//! book.toml), for those who run `mdbook build` or `mdbook serve` themselves.

use std::io;
use std::process::ExitCode;

use mdbook_gpumem::GpumemPreprocessor;
use mdbook_preprocessor::Preprocessor;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pre = GpumemPreprocessor;
    if args.first().map(String::as_str) == Some("supports") {
        // mdBook asks whether a renderer is supported; the answer is the exit status.
        let renderer = args.get(1).map(String::as_str).unwrap_or("");
        return match pre.supports_renderer(renderer) {
            Ok(true) => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let result = mdbook_preprocessor::parse_input(io::stdin())
        .and_then(|(ctx, book)| pre.run(&ctx, book))
        .and_then(|book| Ok(serde_json::to_writer(io::stdout(), &book)?));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mdbook-gpumem: {e:#}");
            ExitCode::FAILURE
        }
    }
}
