//! How numbers read in the widgets and the prose.

use gpumem::num::fixed;

const GIB: f64 = 1073741824.0;

/// Bytes as GiB: one decimal, two below 1 GiB ("52.7 GiB", "0.50 GiB").
pub fn gib(bytes: f64) -> String {
    let g = bytes / GIB;
    if g.abs() < 1.0 {
        format!("{} GiB", fixed(g, 2))
    } else {
        format!("{} GiB", fixed(g, 1))
    }
}

/// A token count: 2048 → "2K", 1536 → "1.5K", 131072 → "128K", 1000 → "1000".
pub fn tokens(n: u64) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}K", n / 1024)
    } else if n >= 1024 && n.is_multiple_of(512) {
        format!("{}K", fixed(n as f64 / 1024.0, 1))
    } else {
        n.to_string()
    }
}

/// A parameter count: 8,030,261,248 → "8.0B", 124,439,808 → "124M", 671B → "671B".
pub fn params(n: u64) -> String {
    let x = n as f64;
    if x >= 99.95e9 {
        format!("{}B", fixed(x / 1e9, 0))
    } else if x >= 1e9 {
        format!("{}B", fixed(x / 1e9, 1))
    } else {
        format!("{}M", fixed(x / 1e6, 0))
    }
}

/// A percentage of a whole, for CSS widths: three decimals, never negative.
pub fn pct(part: f64, whole: f64) -> String {
    let p = if whole > 0.0 {
        (part / whole * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    format!("{}%", fixed(p, 3))
}

/// Escape text for a double-quoted HTML attribute.
pub fn escape_attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_numbers() {
        assert_eq!(gib(52.7 * GIB), "52.7 GiB");
        assert_eq!(gib(0.5 * GIB), "0.50 GiB");
        assert_eq!(tokens(2048), "2K");
        assert_eq!(tokens(1536), "1.5K");
        assert_eq!(tokens(131072), "128K");
        assert_eq!(tokens(1000), "1000");
        assert_eq!(params(8_030_261_248), "8.0B");
        assert_eq!(params(124_439_808), "124M");
        assert_eq!(params(671_026_419_200), "671B");
        assert_eq!(pct(1.0, 4.0), "25.000%");
        assert_eq!(pct(5.0, 4.0), "100.000%");
        assert_eq!(
            escape_attr(r#"{"a":"<b>&'"}"#),
            "{&quot;a&quot;:&quot;&lt;b&gt;&amp;&#39;&quot;}"
        );
    }
}
