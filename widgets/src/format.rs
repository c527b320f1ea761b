//! How numbers read in the widgets and the prose: sizes in GiB, counts with thousands
//! separators or scaled, sums whose displayed parts add up to their displayed total, and a
//! typographic minus sign.

use gpumem::num::fixed;

const GIB: f64 = 1073741824.0;

/// The minus sign (U+2212), not a hyphen.
pub const MINUS: char = '−';

/// Decimals a size in GiB shows with: one from 1 GiB up, two below, four below a hundredth
/// (a few MiB never read "0.00 GiB"; what rounds to nothing even so, two).
fn decimals(bytes: f64) -> usize {
    let g = (bytes / GIB).abs();
    if g >= 1.0 {
        1
    } else if !(5e-5..0.01).contains(&g) {
        2
    } else {
        4
    }
}

/// `fixed`, with a typographic minus, never a negative zero ("−0.0"), and thousands
/// separators ("17,441.0").
pub fn signed(x: f64, decimals: usize) -> String {
    let s = fixed(x, decimals);
    let (minus, rest) = match s.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => (false, rest),
        Some(rest) => (true, rest),
        None => (false, s.as_str()),
    };
    let whole = rest.find('.').unwrap_or(rest.len());
    let mut out = String::new();
    if minus {
        out.push(MINUS);
    }
    for (i, c) in rest.char_indices() {
        if i > 0 && i < whole && (whole - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes as GiB: one decimal, two below 1 GiB, four below 0.01 GiB ("52.7 GiB", "0.50 GiB",
/// "0.0018 GiB"); none for nothing ("0 GiB").
pub fn gib(bytes: f64) -> String {
    if bytes == 0.0 {
        return "0 GiB".into();
    }
    format!("{} GiB", signed(bytes / GIB, decimals(bytes)))
}

/// A change in size with its sign: "+56.0 MiB", "−1.95 GiB" (MiB below 1 GiB).
pub fn delta(bytes: f64) -> String {
    let plus = if bytes > 0.0 { "+" } else { "" };
    if bytes.abs() < GIB {
        format!("{plus}{} MiB", signed(bytes / 1048576.0, 1))
    } else {
        format!("{plus}{} GiB", signed(bytes / GIB, 2))
    }
}

/// Sizes that are shown as a sum. Every figure reads as it rounds on its own, as it reads
/// anywhere else on the page; a sum shows its parts at the total's precision, or one or two
/// decimals more where that is what it takes for them to add up to the total shown, and
/// where none does, says the total is approximate ("≈": three equal parts of 1.04 GiB
/// never add up to 3.12 at one decimal or two).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sum {
    decimals: usize,
    /// The parts shown do not add up to the total shown.
    approx: bool,
}

impl Sum {
    /// The rounding for a sum whose total is `total` bytes (the precision [`gib`] shows it at).
    pub fn of(total: f64) -> Sum {
        Sum {
            decimals: decimals(total),
            approx: false,
        }
    }

    /// The rounding for `parts` shown adding up to `total` (see [`Sum`]).
    pub fn for_parts(parts: &[f64], total: f64) -> Sum {
        let d = decimals(total);
        (d..=d + 2)
            .map(|decimals| Sum {
                decimals,
                approx: false,
            })
            .find(|s| parts.iter().map(|&b| s.units(b)).sum::<i64>() == s.units(total))
            .unwrap_or(Sum {
                decimals: d,
                approx: true,
            })
    }

    /// The rounding for a figure `each` that a reader multiplies by `n`: as many decimals
    /// (up to two more than its own) as make the product of the figure shown round to the
    /// total shown (0.77 GiB × 32 = 24.6, not the 24.5 shown; 0.766 × 32 = 24.5).
    pub fn times(each: f64, n: f64) -> Sum {
        let all = Sum::of(each * n);
        let d = decimals(each);
        (d..=d + 2)
            .map(|decimals| Sum {
                decimals,
                approx: false,
            })
            .find(|s| {
                let shown = s.units(each) as f64 / 10f64.powi(s.decimals as i32) * GIB;
                all.units(shown * n) == all.units(each * n)
            })
            .unwrap_or(Sum {
                decimals: d,
                approx: true,
            })
    }

    /// What joins the parts to the total: "=", or "≈" where they do not add up as shown.
    pub fn eq(&self) -> &'static str {
        if self.approx {
            "≈"
        } else {
            "="
        }
    }

    /// Bytes in the sum's units (tenths or hundredths of a GiB), rounded as [`gib`] rounds
    /// (half to even: 7.25 GiB reads 7.2 in both, not 7.3 in a legend and 7.2 in the prose).
    pub fn units(&self, bytes: f64) -> i64 {
        let u = gpumem::num::scaled((bytes / GIB).abs(), self.decimals as u32)
            .map_or(i64::MAX, |u| u.min(i64::MAX as u128) as i64);
        if bytes < 0.0 {
            -u
        } else {
            u
        }
    }

    /// Units in GiB.
    pub fn value(&self, units: i64) -> f64 {
        units as f64 / 10f64.powi(self.decimals as i32)
    }

    /// Units as text: "12.3 GiB".
    pub fn show(&self, units: i64) -> String {
        format!("{} GiB", signed(self.value(units), self.decimals))
    }

    /// `bytes` as text at this sum's precision.
    pub fn gib(&self, bytes: f64) -> String {
        self.show(self.units(bytes))
    }

    /// The parts as text at this sum's precision, each rounded on its own.
    pub fn texts(&self, parts: &[f64]) -> Vec<String> {
        parts.iter().map(|&b| self.gib(b)).collect()
    }
}

/// A token count: 2048 → "2K", 1536 → "1.5K", 131072 → "128K", 3701 → "3,701".
pub fn tokens(n: u64) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}K", n / 1024)
    } else if n >= 1024 && n.is_multiple_of(512) {
        format!("{}K", fixed(n as f64 / 1024.0, 1))
    } else {
        count(n)
    }
}

/// A whole number with thousands separators: 8030261248 → "8,030,261,248".
pub fn count(n: u64) -> String {
    gpumem::num::thousands(n)
}

/// A count scaled to three significant figures: 8,030,261,248 → "8.03B", 124,439,808 →
/// "124M", 6,815,744 → "6.82M", 7,000,000,000 → "7B", 671B → "671B".
pub fn params(n: u64) -> String {
    let x = n as f64;
    let (v, unit) = if x >= 999.5e9 {
        (x / 1e12, "T")
    } else if x >= 999.5e6 {
        (x / 1e9, "B")
    } else if x >= 999.5e3 {
        (x / 1e6, "M")
    } else if x >= 1e3 {
        (x / 1e3, "K")
    } else {
        return n.to_string();
    };
    let d = if v >= 99.95 {
        0
    } else if v >= 9.995 {
        1
    } else {
        2
    };
    let mut s = fixed(v, d);
    if s.contains('.') {
        let keep = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(keep);
    }
    format!("{s}{unit}")
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

/// Lines of at most about `width` characters, broken between words (a word longer than the
/// width stands on a line of its own).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for w in text.split(' ').filter(|w| !w.is_empty()) {
        if !cur.is_empty() && cur.chars().count() + 1 + w.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_read_as_rounded_on_their_own() {
        let g = 1073741824.0;
        // 1.0 + 1.0 would not make the 2.1 the total rounds to: two decimals, each part
        // as it rounds on its own.
        let (parts, total) = ([1.04 * g, 1.04 * g], 2.08 * g);
        let s = Sum::for_parts(&parts, total);
        assert_eq!(s.texts(&parts), ["1.04 GiB", "1.04 GiB"]);
        assert_eq!(s.gib(total), "2.08 GiB");
        // Where they add up at the total's precision, that one.
        let (parts, total) = ([14.96 * g, 0.73 * g], 15.69 * g);
        let s = Sum::for_parts(&parts, total);
        assert_eq!(s.texts(&parts), ["15.0 GiB", "0.7 GiB"]);
        assert_eq!(s.gib(total), "15.7 GiB");
    }

    #[test]
    fn readable_numbers() {
        assert_eq!(gib(52.7 * GIB), "52.7 GiB");
        assert_eq!(gib(0.5 * GIB), "0.50 GiB");
        assert_eq!(gib(-3.25 * GIB), "−3.2 GiB");
        assert_eq!(gib(-0.001), "0.00 GiB");
        // A few MiB (a ZeRO-3 shard over 1,024 GPUs) are not "0.00 GiB".
        assert_eq!(gib(1.9 * 1048576.0), "0.0019 GiB");
        assert_eq!(Sum::of(1.9 * 1048576.0).gib(1.9 * 1048576.0), "0.0019 GiB");
        assert_eq!(signed(-0.04, 1), "0.0");
        assert_eq!(signed(-2.2, 1), "−2.2");
        assert_eq!(gib(17441.04 * GIB), "17,441.0 GiB");
        assert_eq!(gib(-1234.56 * GIB), "−1,234.6 GiB");
        assert_eq!(gib(999.96 * GIB), "1,000.0 GiB");
        assert_eq!(Sum::of(2e13).show(1234567), "123,456.7 GiB");
        // Axis ticks and the ledger's sizes group their digits the same way.
        assert_eq!(crate::chart::tick_label(20000.0 * GIB), "20,000 GiB");
        assert_eq!(crate::chart::tick_label(2500.5 * GIB), "2,500.5 GiB");
        assert_eq!(tokens(2048), "2K");
        assert_eq!(tokens(1536), "1.5K");
        assert_eq!(tokens(131072), "128K");
        assert_eq!(tokens(1000), "1,000");
        assert_eq!(tokens(768), "768");
        assert_eq!(count(8_030_261_248), "8,030,261,248");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(params(8_030_261_248), "8.03B");
        assert_eq!(params(124_439_808), "124M");
        assert_eq!(params(6_815_744), "6.82M");
        assert_eq!(params(7_000_000_000), "7B");
        assert_eq!(params(70_553_706_496), "70.6B");
        assert_eq!(params(671_026_419_200), "671B");
        assert_eq!(params(999_999_999), "1B");
        assert_eq!(params(512), "512");
        assert_eq!(pct(1.0, 4.0), "25.000%");
        assert_eq!(pct(5.0, 4.0), "100.000%");
        assert_eq!(
            escape_attr(r#"{"a":"<b>&'"}"#),
            "{&quot;a&quot;:&quot;&lt;b&gt;&amp;&#39;&quot;}"
        );
        assert_eq!(
            wrap("saved for backward: batch 1 × sequence 2K", 20),
            ["saved for backward:", "batch 1 × sequence", "2K"]
        );
    }

    #[test]
    fn a_sum_that_cannot_add_up_says_so() {
        // 3 × 1.04 = 3.12: 1.0 + 1.0 + 1.0 ≠ 3.1, 1.04 × 3 = 3.12 at two decimals.
        let parts = [1.04 * GIB, 1.04 * GIB, 1.04 * GIB];
        let s = Sum::for_parts(&parts, 3.12 * GIB);
        assert_eq!(s.texts(&parts), ["1.04 GiB", "1.04 GiB", "1.04 GiB"]);
        assert_eq!((s.eq(), s.gib(3.12 * GIB).as_str()), ("=", "3.12 GiB"));
        // 14.9575 × 2 + 29.9151 = 59.8301: no precision up to three decimals adds up, each
        // part still reads as it rounds, the total approximate.
        let w = 8_030_261_248.0 * 2.0;
        let parts = [w, 0.0, w, 2.0 * w];
        let s = Sum::for_parts(&parts, 4.0 * w);
        assert_eq!(s.texts(&parts)[0], "15.0 GiB");
        assert_eq!(s.eq(), "≈");
        assert_eq!(s.gib(4.0 * w), "59.8 GiB");
    }

    #[test]
    fn a_sums_parts_round_as_a_single_figure_does() {
        // Ties go to even in both (7.25 read 7.3 in a legend, 7.2 in the prose beside it).
        for g in [7.25, 7.35, 0.125, 2.5, 12.75, 0.045] {
            let b = g * GIB;
            assert_eq!(Sum::of(b).gib(b), gib(b), "{g}");
        }
        assert_eq!(gib(7.25 * GIB), "7.2 GiB");
    }
}
