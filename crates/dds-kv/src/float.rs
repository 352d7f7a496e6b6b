//! INCRBYFLOAT's numbers as Redis computes them: C `long double`s, which on x86-64 (where
//! Redis is built) are the x87 80-bit extended format (64-bit significand). Reading is
//! Redis's `string2ld` (`strtold`, the whole string, no leading space, no NaN, no overflow
//! or underflow to zero); the sum rounds to nearest-even in that format (`rustc_apfloat`'s
//! `X87DoubleExtended`); writing is `ld2string`'s human mode: `printf("%.17Lf")`, exact and
//! rounded to nearest-even, with trailing zeros (and the point) dropped and `-0` written `0`.

use num_bigint::BigUint;
use rustc_apfloat::ieee::X87DoubleExtended as Ld;
use rustc_apfloat::{Float, Round, Status};

/// A number read as Redis reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LongDouble(Ld);

/// Redis's `MAX_LONG_DOUBLE_CHARS`: longer inputs are refused, longer outputs written empty.
const MAX_CHARS: usize = 5 * 1024;

/// Whether `s` is all of a number `strtold` reads (after an optional sign): a decimal with
/// digits and an optional point and exponent, or a hexadecimal `0x` one with an optional `p`
/// exponent. Returns whether it is hexadecimal and whether it has its exponent.
fn number_syntax(s: &[u8]) -> Option<(bool, bool)> {
    let hex = s.len() > 2 && s[0] == b'0' && (s[1] | 0x20) == b'x';
    let body = if hex { &s[2..] } else { s };
    let is_digit = |b: u8| {
        if hex {
            b.is_ascii_hexdigit()
        } else {
            b.is_ascii_digit()
        }
    };
    let mut i = 0;
    let mut digits = 0;
    while i < body.len() && is_digit(body[i]) {
        i += 1;
        digits += 1;
    }
    if body.get(i) == Some(&b'.') {
        i += 1;
        while i < body.len() && is_digit(body[i]) {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    let mark = if hex { b'p' } else { b'e' };
    let has_exp = body.get(i).is_some_and(|&b| (b | 0x20) == mark);
    if has_exp {
        i += 1;
        if matches!(body.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let start = i;
        while i < body.len() && body[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    (i == body.len()).then_some((hex, has_exp))
}

impl LongDouble {
    /// Zero (a missing key).
    pub(crate) fn zero() -> Self {
        LongDouble(Ld::ZERO)
    }

    /// Reads `s` as Redis's `string2ld`; `None`: "value is not a valid float".
    pub(crate) fn parse(s: &[u8]) -> Option<Self> {
        if s.is_empty() || s.len() >= MAX_CHARS {
            return None;
        }
        let (neg, body) = match s[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        if body.eq_ignore_ascii_case(b"inf") || body.eq_ignore_ascii_case(b"infinity") {
            let inf = Ld::INFINITY;
            return Some(LongDouble(if neg { -inf } else { inf }));
        }
        let (hex, has_exp) = number_syntax(body)?;
        let text = std::str::from_utf8(body).ok()?;
        let parsed = if hex && !has_exp {
            Ld::from_str_r(&format!("{text}p0"), Round::NearestTiesToEven)
        } else {
            Ld::from_str_r(text, Round::NearestTiesToEven)
        }
        .ok()?;
        let v = parsed.value;
        // strtold's ERANGE with an infinite or zero result: refused.
        if (v.is_infinite() && parsed.status.contains(Status::OVERFLOW))
            || (v.is_zero() && parsed.status.contains(Status::UNDERFLOW))
            || v.is_nan()
        {
            return None;
        }
        Some(LongDouble(if neg { -v } else { v }))
    }

    /// Whether it is infinite (parsing refuses NaN).
    pub(crate) fn is_infinite(self) -> bool {
        self.0.is_infinite()
    }

    /// The sum, rounded to the format; `None` when it is NaN or infinite.
    pub(crate) fn add(self, other: LongDouble) -> Option<LongDouble> {
        let sum = self.0.add_r(other.0, Round::NearestTiesToEven).value;
        (!sum.is_nan() && !sum.is_infinite()).then_some(LongDouble(sum))
    }

    /// Written as Redis's `ld2string(.., LD_STR_HUMAN)`.
    pub(crate) fn human(self) -> String {
        let bits = self.0.to_bits();
        let neg = bits >> 79 & 1 == 1;
        let sig = bits as u64;
        let field = (bits >> 64) as i64 & 0x7fff;
        // value = sig × 2^exp (a zero exponent field: denormal, the exponent of the smallest
        // normal).
        let exp = field.max(1) - 16383 - 63;
        // round(value × 10^17), to nearest-even on the exact value (glibc's printf).
        let m = BigUint::from(sig) * BigUint::from(10u64.pow(17));
        let scaled = if exp >= 0 {
            m << exp as u64
        } else {
            let sh = exp.unsigned_abs();
            let q = &m >> sh;
            let rest = &m - (&q << sh);
            let half = BigUint::from(1u8) << (sh - 1);
            if rest > half || (rest == half && q.bit(0)) {
                q + 1u8
            } else {
                q
            }
        };
        let digits = format!("{scaled:0>18}");
        let (int, frac) = digits.split_at(digits.len() - 17);
        let mut s = format!("{}{int}.{frac}", if neg { "-" } else { "" });
        if s.len() + 1 > MAX_CHARS {
            // No room in Redis's buffer: it writes nothing.
            return String::new();
        }
        let keep = s.trim_end_matches('0').trim_end_matches('.').len();
        s.truncate(keep);
        if s == "-0" {
            s = "0".into();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(a: &str, b: &str) -> Option<String> {
        let a = LongDouble::parse(a.as_bytes())?;
        let b = LongDouble::parse(b.as_bytes())?;
        Some(a.add(b)?.human())
    }

    #[test]
    fn sums_print_as_redis_prints_them() {
        // Redis's INCRBYFLOAT documentation and test suite.
        assert_eq!(incr("10.50", "0.1").as_deref(), Some("10.6"));
        assert_eq!(incr("5.0e3", "2.0e2").as_deref(), Some("5200"));
        assert_eq!(incr("10", "-1.1").as_deref(), Some("8.9"));
        assert_eq!(incr("0", "1.5").as_deref(), Some("1.5"));
        assert_eq!(incr("1", "-1").as_deref(), Some("0"));
        assert_eq!(incr("-0.00000000000000000001", "0").as_deref(), Some("0"));
        assert_eq!(incr("0", "0.1").as_deref(), Some("0.1"));
        assert_eq!(incr("0x10", "1").as_deref(), Some("17"));
        assert_eq!(incr("17179869184", "1.5").as_deref(), Some("17179869185.5"));
    }

    #[test]
    fn only_what_strtold_reads_whole_is_a_float() {
        for bad in [
            "", " 1", "1 ", "abc", "1e", "1e+", ".", "-", "nan", "NaN", "1..2", "0x", "1e99999",
            "1e-99999", "1,5",
        ] {
            assert!(LongDouble::parse(bad.as_bytes()).is_none(), "{bad:?}");
        }
        for good in [
            "1",
            "+1",
            "-1.",
            ".5",
            "1e5",
            "1E-5",
            "0x1p3",
            "0X1.8",
            "inf",
            "-Infinity",
            "0e-99999",
        ] {
            assert!(LongDouble::parse(good.as_bytes()).is_some(), "{good:?}");
        }
        assert!(incr("inf", "1").is_none());
        assert!(incr("1e4932", "1e4932").is_none());
    }
}
