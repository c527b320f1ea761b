//! Scenario and config.json files, read with a bound: a regular file of at most
//! [`MAX_FILE_BYTES`], UTF-8, an optional byte-order mark. Never an unbounded read, and never
//! a device, a FIFO (whose open would wait for a writer) or a directory.

use std::io::Read;

use serde_json::Value;

/// Far above any real scenario or config.json (the largest published configs are a few KB).
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// What a path is, in words, when it is not a regular file.
fn kind(ft: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

fn too_large(path: &str) -> String {
    format!(
        "{path}: larger than {} MiB, the limit for a scenario or config.json file",
        MAX_FILE_BYTES >> 20
    )
}

/// The text of a small regular file.
pub fn read(path: &str) -> Result<String, String> {
    let refuse = |ft: std::fs::FileType| {
        format!(
            "{path}: is {}; a scenario or config.json must be a regular file",
            kind(ft)
        )
    };
    // Look before opening: opening a FIFO blocks until something writes to it.
    let meta = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?;
    if !meta.is_file() {
        return Err(refuse(meta.file_type()));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_large(path));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    // What was opened may not be what was looked at.
    let meta = file.metadata().map_err(|e| format!("{path}: {e}"))?;
    if !meta.is_file() {
        return Err(refuse(meta.file_type()));
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew (or a size the kernel does not report,
    // as in /proc) from one that fits.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{path}: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(path));
    }
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    String::from_utf8(bytes.to_vec()).map_err(|e| {
        format!(
            "{path}: not UTF-8 text (byte {} is not valid UTF-8)",
            e.utf8_error().valid_up_to()
        )
    })
}

/// A file's JSON; errors name the file, line and column. A key twice in one object is an
/// error (serde_json would keep the last silently, and the other value is lost).
pub fn read_json(path: &str) -> Result<Value, String> {
    let text = read(path)?;
    serde_json::from_str::<Unique>(&text)
        .map(|u| u.0)
        .map_err(|e| format!("{path}:{}:{}: malformed JSON: {e}", e.line(), e.column()))
}

/// A JSON value whose objects name each key once.
struct Unique(Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueVisitor).map(Unique)
    }
}

struct UniqueVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
        Ok(x.into())
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(s.into())
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(s.into())
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Unique(x)) = a.next_element()? {
            v.push(x);
        }
        Ok(Value::Array(v))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let Unique(x) = a.next_value()?;
            if m.contains_key(&k) {
                return Err(serde::de::Error::custom(format!(
                    "the key '{}' is given twice",
                    gpumem::knobs::shown(&k)
                )));
            }
            m.insert(k, x);
        }
        Ok(Value::Object(m))
    }
}
