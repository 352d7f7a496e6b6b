//! The string family beyond GET and SET, as Redis 7.0's `t_string.c` and `bitops.c` answer:
//! GETRANGE (SUBSTR), SETRANGE, GETEX, GETBIT, SETBIT, BITCOUNT, BITPOS, BITOP and LCS. The
//! order of checks (which error wins, what a missing key answers before its arguments are
//! looked at) follows Redis's code, which the differential test holds them to.

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::engine::Engine;
use crate::float::LongDouble;
use crate::store::{Expiry, Modify, SetCond, StoreResult};

const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";
const BIT_OFFSET: &str = "ERR bit offset is not an integer or out of range";

/// The value a range refers to, as Redis converts `start` and `end` (negative from the end,
/// clamped): `None` for an empty range.
fn clamp_range(start: i64, end: i64, len: i64) -> Option<(usize, usize)> {
    if start < 0 && end < 0 && start > end {
        return None;
    }
    let mut start = if start < 0 {
        len.saturating_add(start)
    } else {
        start
    };
    let mut end = if end < 0 {
        len.saturating_add(end)
    } else {
        end
    };
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    (start <= end && len > 0).then_some((start as usize, end as usize))
}

/// `GETRANGE key start end` (and `SUBSTR`).
pub(crate) fn getrange(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let (Some(start), Some(end)) = (int_arg(argv[2]), int_arg(argv[3])) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    s.get_with(argv[1], &mut |v| {
        let v = v.unwrap_or_default();
        match clamp_range(start, end, v.len() as i64) {
            Some((a, b)) => r.bulk(&v[a..=b]),
            None => r.bulk(b""),
        }
    })
}

/// `SETRANGE key offset value`: the new length; the value grows with zeros up to `offset`.
pub(crate) fn setrange(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max_value: usize,
) -> StoreResult<()> {
    let Some(offset) = int_arg(argv[2]) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    if offset < 0 {
        r.error("ERR offset is out of range");
        return Ok(());
    }
    let value = argv[3];
    let too_long = (offset as u64).saturating_add(value.len() as u64) > max_value as u64;
    let mut answer: Result<usize, &str> = Ok(0);
    s.modify(argv[1], &mut |cur, out| {
        if value.is_empty() {
            answer = Ok(cur.map_or(0, <[u8]>::len));
            return Modify::Keep;
        }
        if too_long {
            answer = Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)");
            return Modify::Keep;
        }
        let (at, end) = (offset as usize, offset as usize + value.len());
        // Copy: the new value is built whole (the record is rewritten, or updated in place).
        out.extend_from_slice(cur.unwrap_or_default());
        if out.len() < end {
            out.resize(end, 0);
        }
        out[at..end].copy_from_slice(value);
        answer = Ok(out.len());
        Modify::Write
    })?;
    match answer {
        Ok(n) => r.int(n as i64),
        Err(e) => r.error(e),
    }
    Ok(())
}

/// `GETEX key [EX s | PX ms | EXAT t | PXAT t | PERSIST]`: the value, then the expiry
/// changed (a past EXAT/PXAT deletes the key).
pub(crate) fn getex(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    now_ms: u64,
) -> StoreResult<()> {
    let mut persist = false;
    let mut exp: Option<(&str, &[u8])> = None;
    let mut i = 2;
    while i < argv.len() {
        let o = crate::commands::option(argv[i], &["persist", "ex", "px", "exat", "pxat"]);
        let next = argv.get(i + 1).copied();
        match (o, next) {
            ("persist", _) if exp.is_none() => persist = true,
            ("ex" | "px" | "exat" | "pxat", Some(t))
                if !persist && exp.is_none_or(|e| e.0 == o) =>
            {
                exp = Some((o, t));
                i += 1;
            }
            _ => {
                r.error(SYNTAX);
                return Ok(());
            }
        }
        i += 1;
    }
    // Checked once the key is found (a missing key answers nil whatever the time).
    let at = exp.map(|(kind, t)| {
        let unit = if kind == "ex" || kind == "exat" {
            1000
        } else {
            1
        };
        crate::commands::set_expire_ms(t, unit, kind == "ex" || kind == "px", "getex")
    });
    let mut found = false;
    s.get_with(argv[1], &mut |v| match (v, &at) {
        (None, _) => r.null(),
        (Some(_), Some(Err(e))) => r.error(e),
        (Some(v), _) => {
            found = true;
            r.bulk(v);
        }
    })?;
    if !found {
        return Ok(());
    }
    match (exp, at) {
        (Some((kind, _)), Some(Ok(t))) => {
            if (kind == "exat" || kind == "pxat") && t <= now_ms {
                s.del(argv[1])?;
            } else {
                s.set_expiry(argv[1], t)?;
            }
        }
        _ if persist => {
            if matches!(s.expiry(argv[1])?, Some(t) if t != 0) {
                s.set_expiry(argv[1], 0)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// `INCRBYFLOAT key increment`: the new value, as Redis computes and writes it
/// ([`LongDouble`]); the key keeps its expiry.
pub(crate) fn incrbyfloat(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
) -> StoreResult<()> {
    let mut answer: Result<String, &str> = Err("");
    s.modify(argv[1], &mut |cur, out| {
        let v = cur.map_or(Some(LongDouble::zero()), LongDouble::parse);
        let (Some(v), Some(by)) = (v, LongDouble::parse(argv[2])) else {
            answer = Err("ERR value is not a valid float");
            return Modify::Keep;
        };
        match v.add(by) {
            None => {
                answer = Err("ERR increment would produce NaN or Infinity");
                Modify::Keep
            }
            Some(n) => {
                let text = n.human();
                out.extend_from_slice(text.as_bytes());
                answer = Ok(text);
                Modify::Write
            }
        }
    })?;
    match answer {
        Ok(t) => r.bulk(t.as_bytes()),
        Err(e) => r.error(e),
    }
    Ok(())
}

/// A bit offset as Redis's `getBitOffsetFromArgument` checks it: not negative, and within
/// the largest value (`proto-max-bulk-len`).
fn bit_offset(arg: &[u8], max_value: usize) -> Option<u64> {
    let n = int_arg(arg)?;
    (n >= 0 && ((n as u64) >> 3) < max_value as u64).then_some(n as u64)
}

/// `GETBIT key offset`.
pub(crate) fn getbit(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max_value: usize,
) -> StoreResult<()> {
    let Some(off) = bit_offset(argv[2], max_value) else {
        r.error(BIT_OFFSET);
        return Ok(());
    };
    let (byte, bit) = ((off >> 3) as usize, 7 - (off & 7));
    s.get_with(argv[1], &mut |v| {
        let set = v
            .and_then(|v| v.get(byte))
            .is_some_and(|b| b & (1 << bit) != 0);
        r.int(i64::from(set));
    })
}

/// `SETBIT key offset 0|1`: the bit's old value; the value grows with zeros to hold it.
pub(crate) fn setbit(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max_value: usize,
) -> StoreResult<()> {
    let Some(off) = bit_offset(argv[2], max_value) else {
        r.error(BIT_OFFSET);
        return Ok(());
    };
    let on = match int_arg(argv[3]) {
        Some(on @ (0 | 1)) => on as u8,
        _ => {
            r.error("ERR bit is not an integer or out of range");
            return Ok(());
        }
    };
    let (byte, bit) = ((off >> 3) as usize, 7 - (off & 7) as u8);
    let mut old = 0u8;
    s.modify(argv[1], &mut |cur, out| {
        let cur = cur.unwrap_or_default();
        let grows = cur.len() <= byte;
        old = cur.get(byte).map_or(0, |b| (b >> bit) & 1);
        if !grows && old == on && !cur.is_empty() {
            return Modify::Keep;
        }
        // Copy: the new value is built whole.
        out.extend_from_slice(cur);
        if grows {
            out.resize(byte + 1, 0);
        }
        out[byte] = (out[byte] & !(1 << bit)) | (on << bit);
        Modify::Write
    })?;
    r.int(i64::from(old));
    Ok(())
}

/// A range of BITCOUNT or BITPOS over `len` bytes: (first byte, last byte, mask of the first
/// byte's bits outside the range, mask of the last byte's), or `None` when empty. In BIT
/// units the range is converted to bytes with edge masks, as Redis does.
fn bit_range(mut start: i64, mut end: i64, len: i64, bits: bool) -> Option<(usize, usize, u8, u8)> {
    let total = if bits { len << 3 } else { len };
    if start < 0 {
        start = total.saturating_add(start);
    }
    if end < 0 {
        end = total.saturating_add(end);
    }
    start = start.max(0);
    end = end.max(0);
    if end >= total {
        end = total - 1;
    }
    let (mut first, mut last) = (0u8, 0u8);
    if bits && start <= end {
        first = !((1u16 << (8 - (start & 7))) - 1) as u8;
        last = ((1u16 << (7 - (end & 7))) - 1) as u8;
        start >>= 3;
        end >>= 3;
    }
    (start <= end).then_some((start as usize, end as usize, first, last))
}

/// BYTE or BIT (the last argument of a range), `None` for anything else.
fn unit_arg(a: &[u8]) -> Option<bool> {
    if a.eq_ignore_ascii_case(b"bit") {
        Some(true)
    } else if a.eq_ignore_ascii_case(b"byte") {
        Some(false)
    } else {
        None
    }
}

/// `BITCOUNT key [start end [BYTE|BIT]]`.
pub(crate) fn bitcount(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    s.get_with(argv[1], &mut |v| {
        // A missing key counts 0 before its arguments are looked at.
        let Some(v) = v else {
            r.int(0);
            return;
        };
        let range = match argv.len() {
            2 => (!v.is_empty()).then(|| (0, v.len() - 1, 0, 0)),
            4 | 5 => {
                let (Some(start), Some(end)) = (int_arg(argv[2]), int_arg(argv[3])) else {
                    r.error(NOT_INTEGER);
                    return;
                };
                // Redis 7.0 answers an empty negative range before it looks at the unit.
                if start < 0 && end < 0 && start > end {
                    r.int(0);
                    return;
                }
                let bits = match argv.get(4).map(|a| unit_arg(a)) {
                    None => false,
                    Some(Some(b)) => b,
                    Some(None) => {
                        r.error(SYNTAX);
                        return;
                    }
                };
                bit_range(start, end, v.len() as i64, bits)
            }
            _ => {
                r.error(SYNTAX);
                return;
            }
        };
        let n = range.map_or(0, |(a, b, first, last)| {
            let mut n: u32 = v[a..=b].iter().map(|x| x.count_ones()).sum();
            n -= (v[a] & first).count_ones();
            n -= (v[b] & last).count_ones();
            n
        });
        r.int(i64::from(n));
    })
}

/// Redis's `redisBitpos`: the first bit equal to `bit` in `s`; not found: -1 for a 1, the bit
/// after the end for a 0.
fn first_bit(s: &[u8], bit: bool) -> i64 {
    for (i, &b) in s.iter().enumerate() {
        let b = if bit { b } else { !b };
        if b != 0 {
            return (i as i64) * 8 + i64::from(b.leading_zeros());
        }
    }
    if bit {
        -1
    } else {
        s.len() as i64 * 8
    }
}

/// `BITPOS key bit [start [end [BYTE|BIT]]]`.
pub(crate) fn bitpos(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let bit = match int_arg(argv[2]) {
        None => {
            r.error(NOT_INTEGER);
            return Ok(());
        }
        Some(b @ (0 | 1)) => b == 1,
        Some(_) => {
            r.error("ERR The bit argument must be 1 or 0.");
            return Ok(());
        }
    };
    s.get_with(argv[1], &mut |v| {
        // A missing key is an endless run of zeros.
        let Some(v) = v else {
            r.int(if bit { -1 } else { 0 });
            return;
        };
        match bitpos_in(v, bit, &argv[3..]) {
            Ok(n) => r.int(n),
            Err(e) => r.error(e),
        }
    })
}

fn bitpos_in(p: &[u8], bit: bool, args: &[&[u8]]) -> Result<i64, &'static str> {
    let len = p.len() as i64;
    let mut end_given = false;
    let range = match args.len() {
        0 => (len > 0).then(|| (0, p.len() - 1, 0, 0)),
        1..=3 => {
            let start = int_arg(args[0]).ok_or(NOT_INTEGER)?;
            let bits = match args.get(2) {
                None => false,
                Some(a) => unit_arg(a).ok_or(SYNTAX)?,
            };
            let end = match args.get(1) {
                Some(a) => {
                    end_given = true;
                    int_arg(a).ok_or(NOT_INTEGER)?
                }
                None if bits => (len << 3) + 7,
                None => len - 1,
            };
            bit_range(start, end, len, bits)
        }
        _ => return Err(SYNTAX),
    };
    // An empty range holds neither a 0 nor a 1.
    let Some((mut start, end, first, last)) = range else {
        return Ok(-1);
    };
    let mut bytes = end - start + 1;
    let pos = 'found: {
        if first != 0 {
            let mut c = if bit {
                p[start] & !first
            } else {
                p[start] | first
            };
            if last != 0 && bytes == 1 {
                c = if bit { c & !last } else { c | last };
            }
            let pos = first_bit(&[c], bit);
            if bytes == 1 || (pos != -1 && pos != 8) {
                break 'found pos;
            }
            start += 1;
            bytes -= 1;
        }
        let whole = bytes - usize::from(last != 0);
        if whole > 0 {
            let pos = first_bit(&p[start..start + whole], bit);
            if bytes == whole || (pos != -1 && pos != (whole as i64) << 3) {
                break 'found pos;
            }
            start += whole;
            bytes -= whole;
        }
        let c = if bit { p[end] & !last } else { p[end] | last };
        first_bit(&[c], bit)
    };
    // Looking for a 0 within an explicit range: past its end is not a 0.
    if end_given && !bit && pos == (bytes as i64) << 3 {
        return Ok(-1);
    }
    Ok(if pos != -1 {
        pos + ((start as i64) << 3)
    } else {
        pos
    })
}

/// `BITOP AND|OR|XOR|NOT destkey key [key ...]`: the result's length; an empty result
/// deletes `destkey`, and the result has no expiry.
pub(crate) fn bitop(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let op = crate::commands::option(argv[1], &["and", "or", "xor", "not"]);
    if op.is_empty() {
        r.error(SYNTAX);
        return Ok(());
    }
    if op == "not" && argv.len() != 4 {
        r.error("ERR BITOP NOT must be called with a single source key.");
        return Ok(());
    }
    // The sources are folded into the result one at a time (a missing byte is 0), so the
    // memory is one value however many sources are named. Copy: the result is built whole.
    let mut res: Vec<u8> = Vec::new();
    for (i, k) in argv[3..].iter().enumerate() {
        s.get_with(k, &mut |v| {
            let v = v.unwrap_or_default();
            if v.len() > res.len() {
                res.resize(v.len(), 0);
            }
            for (j, out) in res.iter_mut().enumerate() {
                let b = v.get(j).copied().unwrap_or(0);
                *out = match (i, op) {
                    (0, "not") => !b,
                    (0, _) => b,
                    (_, "and") => *out & b,
                    (_, "or") => *out | b,
                    _ => *out ^ b,
                };
            }
        })?;
    }
    let max = res.len();
    if max > 0 {
        s.set(argv[2], &res, SetCond::Always, Expiry::None, None)?;
    } else {
        s.del(argv[2])?;
    }
    r.int(max as i64);
    Ok(())
}

/// `LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]`, by Redis's dynamic programme
/// (its table bounded by `proto-max-bulk-len`, as Redis bounds it).
pub(crate) fn lcs(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max_value: usize,
) -> StoreResult<()> {
    // Copies: both values are needed at once.
    let mut a = Vec::new();
    let mut b = Vec::new();
    s.get_with(argv[1], &mut |v| a = v.unwrap_or_default().to_vec())?;
    s.get_with(argv[2], &mut |v| b = v.unwrap_or_default().to_vec())?;
    let (mut idx, mut len, mut withlen, mut minlen) = (false, false, false, 0i64);
    let mut j = 3;
    while j < argv.len() {
        let more = j + 1 < argv.len();
        match crate::commands::option(argv[j], &["idx", "len", "withmatchlen", "minmatchlen"]) {
            "idx" => idx = true,
            "len" => len = true,
            "withmatchlen" => withlen = true,
            "minmatchlen" if more => {
                let Some(n) = int_arg(argv[j + 1]) else {
                    r.error(NOT_INTEGER);
                    return Ok(());
                };
                minlen = n.max(0);
                j += 1;
            }
            _ => {
                r.error(SYNTAX);
                return Ok(());
            }
        }
        j += 1;
    }
    if idx && len {
        r.error("ERR If you want both the length and indexes, please just use IDX.");
        return Ok(());
    }
    let (alen, blen) = (a.len(), b.len());
    let cells = (alen as u64 + 1) * (blen as u64 + 1);
    if cells * 4 > max_value as u64 {
        r.error("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len");
        return Ok(());
    }
    let w = blen + 1;
    let mut t = vec![0u32; cells as usize];
    for i in 1..=alen {
        for j in 1..=blen {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let total = t[alen * w + blen];
    if len {
        r.int(i64::from(total));
        return Ok(());
    }
    // Walk back from the end, as Redis does: the string, and the matching ranges.
    let mut out = vec![0u8; total as usize];
    let mut k = total as usize;
    let mut ranges: Vec<[usize; 4]> = Vec::new();
    let (mut ra_start, mut ra_end, mut rb_start, mut rb_end) = (alen, 0, 0, 0);
    let (mut i, mut j) = (alen, blen);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            out[k - 1] = a[i - 1];
            if ra_start == alen {
                (ra_start, ra_end, rb_start, rb_end) = (i - 1, i - 1, j - 1, j - 1);
            } else if ra_start == i && rb_start == j {
                ra_start -= 1;
                rb_start -= 1;
            } else {
                emit = true;
            }
            if ra_start == 0 || rb_start == 0 {
                emit = true;
            }
            k -= 1;
            i -= 1;
            j -= 1;
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if ra_start != alen {
                emit = true;
            }
        }
        if emit {
            let mlen = ra_end.wrapping_sub(ra_start).wrapping_add(1);
            if minlen == 0 || mlen as i64 >= minlen {
                ranges.push([ra_start, ra_end, rb_start, rb_end]);
            }
            ra_start = alen;
        }
    }
    if !idx {
        r.bulk(&out);
        return Ok(());
    }
    r.map(2);
    r.bulk(b"matches");
    r.array(ranges.len());
    for [a0, a1, b0, b1] in ranges {
        r.array(2 + usize::from(withlen));
        r.array(2);
        r.int(a0 as i64);
        r.int(a1 as i64);
        r.array(2);
        r.int(b0 as i64);
        r.int(b1 as i64);
        if withlen {
            r.int((a1 - a0 + 1) as i64);
        }
    }
    r.bulk(b"len");
    r.int(i64::from(total));
    Ok(())
}

/// How BITFIELD's SET and INCRBY treat a value outside the field's range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

/// One BITFIELD operation: GET (`value` unused), SET or INCRBY.
#[derive(Clone, Copy)]
struct FieldOp {
    op: &'static str,
    signed: bool,
    bits: u32,
    offset: u64,
    value: i64,
    overflow: Overflow,
}

const BITFIELD_TYPE: &str = "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.";

/// A field type (`i1`..`i64`, `u1`..`u63`): (signed, bits).
fn field_type(a: &[u8]) -> Option<(bool, u32)> {
    let signed = match a.first() {
        Some(b'i') => true,
        Some(b'u') => false,
        _ => return None,
    };
    let bits = int_arg(&a[1..])?;
    let max = if signed { 64 } else { 63 };
    (1..=max).contains(&bits).then_some((signed, bits as u32))
}

/// A field offset: bits, or `#n` for `n` times the field's width.
fn field_offset(a: &[u8], bits: u32, max_value: usize) -> Option<u64> {
    let (times, a) = match a.strip_prefix(b"#") {
        Some(rest) => (u64::from(bits), rest),
        None => (1, a),
    };
    let n = int_arg(a)?;
    let n = u64::try_from(n).ok()?.checked_mul(times)?;
    ((n >> 3) < max_value as u64).then_some(n)
}

fn get_field(p: &[u8], mut offset: u64, bits: u32) -> u64 {
    let mut v = 0u64;
    for _ in 0..bits {
        let byte = p.get((offset >> 3) as usize).copied().unwrap_or(0);
        v = (v << 1) | u64::from((byte >> (7 - (offset & 7))) & 1);
        offset += 1;
    }
    v
}

fn get_signed(p: &[u8], offset: u64, bits: u32) -> i64 {
    let mut v = get_field(p, offset, bits);
    if bits < 64 && v & (1 << (bits - 1)) != 0 {
        v |= u64::MAX << bits;
    }
    v as i64
}

fn set_field(p: &mut [u8], mut offset: u64, bits: u32, value: u64) {
    for j in 0..bits {
        let bit = ((value >> (bits - 1 - j)) & 1) as u8;
        let at = (offset >> 3) as usize;
        let shift = 7 - (offset & 7);
        p[at] = (p[at] & !(1 << shift)) | (bit << shift);
        offset += 1;
    }
}

/// Redis's `checkUnsignedBitfieldOverflow`: whether `value + incr` leaves the field, and the
/// value to store instead (wrapped or saturated; none for FAIL).
fn unsigned_overflow(value: u64, incr: i64, bits: u32, ow: Overflow) -> (bool, u64) {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let maxincr = max.wrapping_sub(value) as i64;
    let minincr = value.wrapping_neg() as i64;
    let wrap = || value.wrapping_add(incr as u64) & !(u64::MAX << bits);
    if value > max || (incr > 0 && incr > maxincr) {
        return match ow {
            Overflow::Wrap => (true, wrap()),
            Overflow::Sat => (true, max),
            Overflow::Fail => (true, 0),
        };
    }
    if incr < 0 && incr < minincr {
        return match ow {
            Overflow::Wrap => (true, wrap()),
            Overflow::Sat => (true, 0),
            Overflow::Fail => (true, 0),
        };
    }
    (false, 0)
}

/// Redis's `checkSignedBitfieldOverflow`.
fn signed_overflow(value: i64, incr: i64, bits: u32, ow: Overflow) -> (bool, i64) {
    let max = if bits == 64 {
        i64::MAX
    } else {
        (1i64 << (bits - 1)) - 1
    };
    let min = -max - 1;
    let maxincr = (max as u64).wrapping_sub(value as u64) as i64;
    let minincr = min.wrapping_sub(value);
    let wrap = || {
        let mut c = (value as u64).wrapping_add(incr as u64);
        if bits < 64 {
            let mask = u64::MAX << bits;
            if c & (1 << (bits - 1)) != 0 {
                c |= mask;
            } else {
                c &= !mask;
            }
        }
        c as i64
    };
    if value > max || (bits != 64 && incr > maxincr) || (value >= 0 && incr > 0 && incr > maxincr) {
        return match ow {
            Overflow::Wrap => (true, wrap()),
            Overflow::Sat => (true, max),
            Overflow::Fail => (true, 0),
        };
    }
    if value < min || (bits != 64 && incr < minincr) || (value < 0 && incr < 0 && incr < minincr) {
        return match ow {
            Overflow::Wrap => (true, wrap()),
            Overflow::Sat => (true, min),
            Overflow::Fail => (true, 0),
        };
    }
    (false, 0)
}

/// `BITFIELD key [GET type offset] [SET type offset value] [INCRBY type offset incr]
/// [OVERFLOW WRAP|SAT|FAIL] ...` and `BITFIELD_RO key [GET type offset] ...`, as Redis's
/// `bitfieldGeneric`: every operation parsed first, then run in order on the value (grown
/// with zeros to the furthest field written); a FAIL overflow answers nil and writes nothing.
pub(crate) fn bitfield(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max_value: usize,
    read_only: bool,
) -> StoreResult<()> {
    let mut ops: Vec<FieldOp> = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut highest: Option<u64> = None;
    let mut j = 2;
    while j < argv.len() {
        let left = argv.len() - j - 1;
        let op = crate::commands::option(argv[j], &["get", "set", "incrby", "overflow"]);
        match (op, left) {
            ("get", 2..) | ("set" | "incrby", 3..) => {}
            ("overflow", 1..) => {
                overflow = match crate::commands::option(argv[j + 1], &["wrap", "sat", "fail"]) {
                    "wrap" => Overflow::Wrap,
                    "sat" => Overflow::Sat,
                    "fail" => Overflow::Fail,
                    _ => {
                        r.error("ERR Invalid OVERFLOW type specified");
                        return Ok(());
                    }
                };
                j += 2;
                continue;
            }
            _ => {
                r.error(SYNTAX);
                return Ok(());
            }
        }
        let Some((signed, bits)) = field_type(argv[j + 1]) else {
            r.error(BITFIELD_TYPE);
            return Ok(());
        };
        let Some(offset) = field_offset(argv[j + 2], bits, max_value) else {
            r.error(BIT_OFFSET);
            return Ok(());
        };
        let mut value = 0;
        if op != "get" {
            let end = offset + u64::from(bits) - 1;
            highest = Some(highest.map_or(end, |h| h.max(end)));
            let Some(v) = int_arg(argv[j + 3]) else {
                r.error(NOT_INTEGER);
                return Ok(());
            };
            value = v;
        }
        ops.push(FieldOp {
            op,
            signed,
            bits,
            offset,
            value,
            overflow,
        });
        j += if op == "get" { 3 } else { 4 };
    }
    let mut replies: Vec<Option<i64>> = Vec::with_capacity(ops.len());
    let Some(highest) = highest else {
        s.get_with(argv[1], &mut |v| {
            let v = v.unwrap_or_default();
            for o in &ops {
                replies.push(Some(if o.signed {
                    get_signed(v, o.offset, o.bits)
                } else {
                    get_field(v, o.offset, o.bits) as i64
                }));
            }
        })?;
        return reply_fields(r, &replies);
    };
    if read_only {
        r.error("ERR BITFIELD_RO only supports the GET subcommand");
        return Ok(());
    }
    s.modify(argv[1], &mut |cur, out| {
        let cur = cur.unwrap_or_default();
        let need = (highest >> 3) as usize + 1;
        // Copy: the new value is built whole.
        out.extend_from_slice(cur);
        let mut changed = out.len() < need;
        if changed {
            out.resize(need, 0);
        }
        for o in &ops {
            if o.op == "get" {
                replies.push(Some(if o.signed {
                    get_signed(out, o.offset, o.bits)
                } else {
                    get_field(out, o.offset, o.bits) as i64
                }));
                continue;
            }
            let incr = o.op == "incrby";
            let (fail, old, new, ret) = if o.signed {
                let old = get_signed(out, o.offset, o.bits);
                let (over, limit) = if incr {
                    signed_overflow(old, o.value, o.bits, o.overflow)
                } else {
                    signed_overflow(o.value, 0, o.bits, o.overflow)
                };
                let new = match (over, incr) {
                    (true, _) => limit,
                    (false, true) => old.wrapping_add(o.value),
                    (false, false) => o.value,
                };
                let ret = if incr { new } else { old };
                (
                    over && o.overflow == Overflow::Fail,
                    old as u64,
                    new as u64,
                    ret,
                )
            } else {
                let old = get_field(out, o.offset, o.bits);
                let (over, limit) = if incr {
                    unsigned_overflow(old, o.value, o.bits, o.overflow)
                } else {
                    unsigned_overflow(o.value as u64, 0, o.bits, o.overflow)
                };
                let new = match (over, incr) {
                    (true, _) => limit,
                    (false, true) => old.wrapping_add(o.value as u64),
                    (false, false) => o.value as u64,
                };
                let ret = if incr { new } else { old };
                (over && o.overflow == Overflow::Fail, old, new, ret as i64)
            };
            if fail {
                replies.push(None);
                continue;
            }
            replies.push(Some(ret));
            let mask = if o.bits == 64 {
                u64::MAX
            } else {
                (1u64 << o.bits) - 1
            };
            set_field(out, o.offset, o.bits, new & mask);
            changed |= old & mask != new & mask;
        }
        if changed || cur.is_empty() {
            Modify::Write
        } else {
            Modify::Keep
        }
    })?;
    reply_fields(r, &replies)
}

fn reply_fields(r: &mut Reply<'_>, replies: &[Option<i64>]) -> StoreResult<()> {
    r.array(replies.len());
    for v in replies {
        match v {
            Some(v) => r.int(*v),
            None => r.null(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_clamp_as_redis() {
        assert_eq!(clamp_range(0, -1, 5), Some((0, 4)));
        assert_eq!(clamp_range(-3, -1, 5), Some((2, 4)));
        assert_eq!(clamp_range(-1, -3, 5), None);
        assert_eq!(clamp_range(3, 100, 5), Some((3, 4)));
        assert_eq!(clamp_range(0, 0, 0), None);
        assert_eq!(clamp_range(i64::MIN, i64::MAX, 5), Some((0, 4)));
    }

    #[test]
    fn bit_positions_follow_redis() {
        // Examples of Redis's BITPOS documentation.
        let v = [0xff, 0xf0, 0x00];
        assert_eq!(bitpos_in(&v, false, &[]), Ok(12));
        let v = [0x00, 0xff, 0xf0];
        assert_eq!(bitpos_in(&v, true, &[b"0"]), Ok(8));
        assert_eq!(bitpos_in(&v, true, &[b"2"]), Ok(16));
        assert_eq!(bitpos_in(&v, true, &[b"2", b"-1", b"BYTE"]), Ok(16));
        assert_eq!(bitpos_in(&v, true, &[b"7", b"15", b"BIT"]), Ok(8));
        assert_eq!(bitpos_in(&[0; 3], true, &[]), Ok(-1));
        assert_eq!(bitpos_in(&[0xff; 3], false, &[b"0", b"-1"]), Ok(-1));
        assert_eq!(bitpos_in(&[0xff; 3], false, &[]), Ok(24));
        assert_eq!(first_bit(&[0x10], true), 3);
    }

    #[test]
    fn bitfield_overflows_as_redis() {
        // Redis's BITFIELD documentation: u2 INCRBY 1 from 3, signed wrap and saturation.
        assert_eq!(unsigned_overflow(3, 1, 2, Overflow::Wrap), (true, 0));
        assert_eq!(unsigned_overflow(3, 1, 2, Overflow::Sat), (true, 3));
        assert_eq!(signed_overflow(127, 1, 8, Overflow::Wrap), (true, -128));
        assert_eq!(signed_overflow(-128, -1, 8, Overflow::Sat), (true, -128));
        assert_eq!(signed_overflow(100, 1, 8, Overflow::Fail), (false, 0));
        let mut v = [0u8; 2];
        set_field(&mut v, 4, 8, 0xab);
        assert_eq!(v, [0x0a, 0xb0]);
        assert_eq!(get_field(&v, 4, 8), 0xab);
        assert_eq!(get_signed(&v, 4, 8), 0xab_u8 as i8 as i64);
        assert_eq!(field_type(b"u64"), None);
        assert_eq!(field_type(b"i64"), Some((true, 64)));
        assert_eq!(field_offset(b"#2", 8, 100), Some(16));
    }
}
