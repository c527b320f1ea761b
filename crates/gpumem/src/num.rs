//! Decimal text to and from `f64`, small enough for the widgets' wasm.
//!
//! `str::parse::<f64>` and `format!("{x:.2}")` are exact, but each drags a large algorithm and
//! its tables into every binary (about a tenth of the widgets' gzipped wasm together). The
//! numbers gpumem reads and prints are short decimals, so two small routines do: [`fixed`]
//! gives the same text as `format!("{x:.N}")` (tested against it), and [`parse_f64`] reads
//! what `str::parse` reads, exactly for every input of up to 15 significant digits and
//! 22 decimal places either way, and to within an ulp or two beyond that.

/// 10^0 ..= 10^22: every one exact in an `f64`.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// A decimal number as `str::parse::<f64>` reads it (`12`, `-0.5`, `.5`, `5.`, `1e-4`, `+2E3`);
/// `None` for anything else, `inf` and `NaN` included.
pub fn parse_f64(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = 0;
    let neg = match b.first() {
        Some(b'-') => {
            i = 1;
            true
        }
        Some(b'+') => {
            i = 1;
            false
        }
        _ => false,
    };
    // Up to 19 significant digits in `mant`; later ones only move the decimal exponent.
    let (mut mant, mut exp, mut digits, mut seen) = (0u64, 0i64, 0u32, false);
    let mut push = |d: u8, fraction: bool, mant: &mut u64, exp: &mut i64| {
        if *mant == 0 && d == 0 {
            if fraction {
                *exp -= 1;
            }
            return;
        }
        if digits < 19 {
            *mant = *mant * 10 + u64::from(d);
            digits += 1;
            if fraction {
                *exp -= 1;
            }
        } else if !fraction {
            *exp += 1;
        }
    };
    while i < b.len() && b[i].is_ascii_digit() {
        push(b[i] - b'0', false, &mut mant, &mut exp);
        seen = true;
        i += 1;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            push(b[i] - b'0', true, &mut mant, &mut exp);
            seen = true;
            i += 1;
        }
    }
    if !seen {
        return None;
    }
    if i < b.len() && (b[i] | 0x20) == b'e' {
        i += 1;
        let eneg = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let start = i;
        let mut e = 0i64;
        while i < b.len() && b[i].is_ascii_digit() {
            e = (e * 10 + i64::from(b[i] - b'0')).min(100_000);
            i += 1;
        }
        if i == start {
            return None;
        }
        exp += if eneg { -e } else { e };
    }
    if i != b.len() {
        return None;
    }
    let m = mant as f64;
    let x = if mant == 0 {
        0.0
    } else if mant < (1 << 53) && exp.unsigned_abs() < POW10.len() as u64 {
        // Both operands exact, so one correctly rounded operation: the exact answer.
        if exp >= 0 {
            m * POW10[exp as usize]
        } else {
            m / POW10[(-exp) as usize]
        }
    } else {
        scale(m, exp)
    };
    Some(if neg { -x } else { x })
}

/// m·10^exp for exponents outside the exact range: in steps of 10^22, so nothing overflows
/// or underflows early.
fn scale(mut m: f64, mut exp: i64) -> f64 {
    while exp > 22 && m.is_finite() {
        m *= 1e22;
        exp -= 22;
    }
    while exp < -22 && m != 0.0 {
        m /= 1e22;
        exp += 22;
    }
    if !m.is_finite() || m == 0.0 {
        return m;
    }
    if exp >= 0 {
        m * POW10[exp as usize]
    } else {
        m / POW10[(-exp) as usize]
    }
}

/// `x` with `decimals` places, the text `format!("{x:.decimals$}")` gives: the exact binary
/// value rounded half to even, `-` kept on negative values that round to zero.
pub fn fixed(x: f64, decimals: usize) -> String {
    let mut out = String::new();
    if x.is_nan() {
        out.push_str("NaN");
        return out;
    }
    if x.is_sign_negative() {
        out.push('-');
    }
    let a = x.abs();
    if a.is_infinite() {
        out.push_str("inf");
        return out;
    }
    let decimals = decimals.min(19);
    let digits = match scaled(a, decimals as u32) {
        Some(n) => n.to_string(),
        // Beyond 2^128 / 10^decimals: no rounding to do at this size, print the integer
        // part digit by digit (exact: a is an integer), then the zeros.
        None => {
            let mut d = big_integer_digits(a);
            d.extend(std::iter::repeat_n('0', decimals));
            d
        }
    };
    // digits = round(a · 10^decimals); put the point back.
    if decimals == 0 {
        out.push_str(&digits);
    } else if digits.len() > decimals {
        let (int, frac) = digits.split_at(digits.len() - decimals);
        out.push_str(int);
        out.push('.');
        out.push_str(frac);
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', decimals - digits.len()));
        out.push_str(&digits);
    }
    out
}

/// A whole number with thousands separators: 8030261248 → "8,030,261,248".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in words with a binary prefix: 3.5e21 → "2.96 ZiB", 1536 → "1.50 KiB".
pub fn bytes_words(b: f64) -> String {
    const UNITS: [&str; 9] = [
        "bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB",
    ];
    let mut x = b;
    let mut i = 0;
    while x.abs() >= 1024.0 && i + 1 < UNITS.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{} bytes", fixed(x, 0))
    } else {
        format!("{} {}", fixed(x, 2), UNITS[i])
    }
}

/// A short decimal as `format!("{x}")` writes it (`2`, `0.5`, `1.125`), for numbers with at
/// most six decimal places; longer fractions are rounded to six.
pub fn short(x: f64) -> String {
    let mut s = fixed(x, 6);
    if s.contains('.') {
        let keep = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(keep);
    }
    s
}

/// round(a · 10^d), half to even, computed exactly: a = m·2^e with m < 2^53 (the digits
/// [`fixed`] prints; `None` beyond 2^128).
pub fn scaled(a: f64, d: u32) -> Option<u128> {
    if a == 0.0 {
        return Some(0);
    }
    let bits = a.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    let (m, e) = if biased == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), biased - 1075)
    };
    let p = 10u128.pow(d);
    let q = u128::from(m).checked_mul(p)?;
    if e >= 0 {
        return q.checked_mul(1u128.checked_shl(e as u32)?);
    }
    let shift = (-e) as u32;
    if shift >= 128 {
        // Below 2^-75 with at most 19 decimals: under half a unit of the last place.
        return Some(0);
    }
    let int = q >> shift;
    let rest = q & ((1u128 << shift) - 1);
    let half = 1u128 << (shift - 1);
    Some(if rest > half || (rest == half && int & 1 == 1) {
        int + 1
    } else {
        int
    })
}

/// The decimal digits of an integer-valued `f64` of any size.
fn big_integer_digits(a: f64) -> String {
    let bits = a.to_bits();
    let e = ((bits >> 52) & 0x7ff) as u32 - 1075;
    let m = (bits & ((1 << 52) - 1)) | (1 << 52);
    // Base 10^9 limbs, little end first: m, then doubled e times.
    // m < 2^53 < 10^18: two limbs.
    let mut limbs: Vec<u64> = vec![m % 1_000_000_000, m / 1_000_000_000];
    for _ in 0..e {
        let mut carry = 0;
        for l in limbs.iter_mut() {
            let v = *l * 2 + carry;
            *l = v % 1_000_000_000;
            carry = v / 1_000_000_000;
        }
        if carry > 0 {
            limbs.push(carry);
        }
    }
    while limbs.len() > 1 && limbs.last() == Some(&0) {
        limbs.pop();
    }
    let mut s = limbs.pop().unwrap_or(0).to_string();
    for l in limbs.iter().rev() {
        let t = l.to_string();
        s.extend(std::iter::repeat_n('0', 9 - t.len()));
        s.push_str(&t);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of doubles: every exponent, awkward mantissas, exact ties.
    fn samples() -> Vec<f64> {
        let mut v = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            0.125,
            0.375,
            1.005,
            2.675,
            0.045,
            9.995,
            99.95,
            999.5,
            1e15,
            1e16,
            1e17 + 1.0,
            1e21,
            1e22,
            1e23,
            1e30,
            1e40,
            1e300,
            5e-324,
            1e-10,
            0.1,
            0.2,
            0.3,
            52.7,
            80.0,
            1073741824.0,
            8_030_261_248.0,
            671_026_419_200.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            0.000_499_999,
            0.0005,
            0.000_499_999_999_999_999_9,
        ];
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = f64::from_bits(s);
            if x.is_finite() {
                v.push(x);
            }
            // Short decimals, the kind the widgets print.
            v.push((s % 10_000_000) as f64 / [1.0, 10.0, 100.0, 1000.0, 8.0][(s % 5) as usize]);
            v.push((s >> 20) as f64 * 0.001);
        }
        v
    }

    #[test]
    fn fixed_is_std_formatting() {
        for x in samples() {
            for d in [0, 1, 2, 3, 6] {
                assert_eq!(fixed(x, d), format!("{x:.d$}"), "{x:e} with {d} places");
            }
        }
        assert_eq!(fixed(f64::NAN, 2), "NaN");
        for x in [
            0.0, -0.0, 2.0, 0.5, 1.125, 0.5625, 80.0, -1.5, 1e21, 123456.75,
        ] {
            assert_eq!(short(x), format!("{x}"));
        }
        assert_eq!(fixed(f64::NEG_INFINITY, 1), "-inf");
    }

    #[test]
    fn parse_reads_what_std_reads() {
        for t in [
            "0",
            "12",
            "-0.5",
            ".5",
            "5.",
            "+2E3",
            "1e-4",
            "0.1",
            "0.3",
            "80",
            "3.7e9",
            "1e22",
            "1e23",
            "123456789012345678901234",
            "0.000000000000000000000000001",
            "1e308",
            "2.2250738585072014e-308",
            "007",
            "1_0",
            "",
            ".",
            "e5",
            "1e",
            "1e+",
            "--1",
            "inf",
            "NaN",
            "1.2.3",
            " 1",
            "0x10",
            "1e400",
            "1e-400",
        ] {
            let ours = parse_f64(t);
            // std also reads the words `inf` and `NaN`; gpumem wants numbers.
            let std = match t {
                "inf" | "NaN" => None,
                _ => t.parse::<f64>().ok(),
            };
            match (ours, std) {
                (Some(a), Some(b)) => {
                    let ulps = (a.to_bits() as i64 - b.to_bits() as i64).abs();
                    assert!(ulps <= 2, "{t}: {a:e} vs {b:e}");
                }
                (a, b) => assert_eq!(a.is_some(), b.is_some(), "{t}: {a:?} vs {b:?}"),
            }
        }
        // Short decimals are exact.
        for x in samples().into_iter().filter(|x| x.abs() < 1e12) {
            let t = format!("{x:.3}");
            assert_eq!(parse_f64(&t), t.parse().ok(), "{t}");
        }
    }
}
