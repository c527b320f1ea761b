//! Errors that name what is wrong and where.

use std::fmt;

/// An input the engine cannot accept. `field` is a path into the scenario
/// (`model.hf_config.num_attention_heads`, `batch`), so the message can point at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub field: String,
    pub message: String,
}

impl Error {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// What is wrong with malformed JSON: serde_json's words (with where, "at line 2 column
/// 9"); in the browser, a few of ours, without where (callers name the line and column):
/// serde_json's `Display` links std's texts for I/O errors into the wasm, which never reads
/// a file.
pub fn json_fault(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    if cfg!(not(target_arch = "wasm32")) {
        return e.to_string();
    }
    match e.classify() {
        Category::Eof => "it ends too soon",
        _ => "an unexpected character or number",
    }
    .into()
}
