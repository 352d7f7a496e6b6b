//! `SORT` and `SORT_RO`, as Redis 7.0's `sort.c` answers them: the elements of a list, set or
//! sorted set, ordered by their own value or by keys a pattern names (`BY weight_*`,
//! `BY hash_*->field`), numerically or by bytes (ALPHA), cut by LIMIT, each replaced by the
//! values GET patterns name (`#`: the element), answered or stored as a list (STORE).

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::CollType;
use crate::engine::Engine;
use crate::store::{StoreError, StoreResult};

/// A number as SORT reads a weight with C's `strtod` (Redis's `sortCommandGeneric`): the
/// value is a C string (it ends at its first NUL); the empty string is 0; otherwise leading
/// spaces are skipped and the rest must be one number (`inf` and hexadecimal too). No
/// number at all (only spaces), trailing bytes, NaN, and a result out of range (an overflow
/// to infinity, an underflow to zero or a subnormal: `ERANGE`) are errors.
fn sort_score(b: &[u8]) -> Option<f64> {
    let b = &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())];
    if b.is_empty() {
        return Some(0.0);
    }
    let t = std::str::from_utf8(b).ok()?.trim_start();
    let (neg, body) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    let v = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()? as f64
    } else if ["inf", "infinity"]
        .iter()
        .any(|n| body.eq_ignore_ascii_case(n))
    {
        f64::INFINITY
    } else if body
        .bytes()
        .any(|c| c.is_ascii_alphabetic() && !matches!(c, b'e' | b'E'))
    {
        return None;
    } else {
        let v = body.parse::<f64>().ok()?;
        let nonzero_digit = body
            .split(['e', 'E'])
            .next()
            .is_some_and(|m| m.bytes().any(|c| matches!(c, b'1'..=b'9')));
        if v.is_infinite() || (v.abs() < f64::MIN_POSITIVE && nonzero_digit) {
            // ERANGE: overflow, or underflow to zero or a subnormal.
            return None;
        }
        v
    };
    let v = if neg { -v } else { v };
    (!v.is_nan()).then_some(v)
}

/// The value a pattern names for element `e` (Redis's `lookupKeyByPattern`): `#` is the
/// element; otherwise the first `*` is replaced by it, and a `->field` after it reads that
/// field of a hash, else the key's string value. `None`: no `*`, a missing key or field, or
/// a key of another type.
fn by_pattern(s: &mut dyn Engine, pattern: &[u8], e: &[u8]) -> StoreResult<Option<Vec<u8>>> {
    if pattern == b"#" {
        return Ok(Some(e.to_vec()));
    }
    let Some(star) = pattern.iter().position(|&b| b == b'*') else {
        return Ok(None);
    };
    let arrow = pattern[star + 1..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|i| star + 1 + i)
        .filter(|&i| i + 2 < pattern.len());
    let key_end = arrow.unwrap_or(pattern.len());
    let mut key = Vec::with_capacity(key_end + e.len());
    key.extend_from_slice(&pattern[..star]);
    key.extend_from_slice(e);
    key.extend_from_slice(&pattern[star + 1..key_end]);
    let mut out = None;
    let r = match arrow {
        Some(a) => s.element_get_with(CollType::Hash, &key, &pattern[a + 2..], &mut |v| {
            out = v.map(<[u8]>::to_vec)
        }),
        None => s.get_with(&key, &mut |v| out = v.map(<[u8]>::to_vec)),
    };
    match r {
        Ok(()) => Ok(out),
        // A key of another type names nothing, as in Redis.
        Err(StoreError::WrongType) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The elements of the list, set or sorted set at `key` in its own order (none for a
/// missing key); WRONGTYPE for a string.
fn elements(s: &mut dyn Engine, key: &[u8]) -> StoreResult<(Option<CollType>, Vec<Vec<u8>>)> {
    let mut out = Vec::new();
    let ty = match s.key_type(key)? {
        None => None,
        Some("list") => {
            let n = s.coll_len(CollType::List, key)?;
            s.list_visit(key, 0, n, false, &mut |_, v| {
                out.push(v.to_vec());
                true
            })?;
            Some(CollType::List)
        }
        Some("set") => {
            s.coll_scan(CollType::Set, key, 0, usize::MAX, &mut |m, _| {
                out.push(m.to_vec())
            })?;
            Some(CollType::Set)
        }
        Some("zset") => {
            let n = s.coll_len(CollType::ZSet, key)? as usize;
            s.zrange(key, 0, n, false, &mut |m, _| out.push(m.to_vec()))?;
            Some(CollType::ZSet)
        }
        Some(_) => return Err(StoreError::WrongType),
    };
    Ok((ty, out))
}

/// `SORT key [BY pattern] [LIMIT offset count] [GET pattern ...] [ASC|DESC] [ALPHA]
/// [STORE destination]`, and `SORT_RO` (no STORE).
pub(crate) fn sort(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    read_only: bool,
) -> StoreResult<()> {
    let (mut desc, mut alpha, mut limit) = (false, false, None);
    let mut by: Option<&[u8]> = None;
    let mut store: Option<&[u8]> = None;
    let mut gets: Vec<&[u8]> = Vec::new();
    let mut dontsort = false;
    let mut j = 2;
    while j < argv.len() {
        let left = argv.len() - j - 1;
        let is = |w: &str| argv[j].eq_ignore_ascii_case(w.as_bytes());
        if is("asc") {
            desc = false;
        } else if is("desc") {
            desc = true;
        } else if is("alpha") {
            alpha = true;
        } else if is("limit") && left >= 2 {
            let (Some(a), Some(b)) = (int_arg(argv[j + 1]), int_arg(argv[j + 2])) else {
                r.error("ERR value is not an integer or out of range");
                return Ok(());
            };
            limit = Some((a, b));
            j += 2;
        } else if is("store") && left >= 1 && !read_only {
            store = Some(argv[j + 1]);
            j += 1;
        } else if is("by") && left >= 1 {
            by = Some(argv[j + 1]);
            // A pattern without `*` (BY nosort): no sort at all.
            dontsort = !argv[j + 1].contains(&b'*');
            j += 1;
        } else if is("get") && left >= 1 {
            gets.push(argv[j + 1]);
            j += 1;
        } else {
            r.error("ERR syntax error");
            return Ok(());
        }
        j += 1;
    }
    let (ty, mut elems) = elements(s, argv[1])?;
    if dontsort && ty == Some(CollType::Set) && store.is_some() {
        // A set's order is its hash order: stored results are sorted so they are repeatable.
        (dontsort, alpha, by) = (false, true, None);
    }
    let len = elems.len() as i64;
    let (start, count) = limit.unwrap_or((0, -1));
    let mut start = start.max(0);
    let mut end = if count < 0 {
        len - 1
    } else {
        start.saturating_add(count) - 1
    };
    if start >= len {
        start = len - 1;
        end = len - 2;
    }
    end = end.min(len - 1);
    if dontsort {
        if ty == Some(CollType::ZSet) && desc {
            elems.reverse();
        }
    } else {
        // Each element with its weight: a number, or with ALPHA its bytes (or nothing).
        let mut keyed: Vec<(Vec<u8>, f64, Option<Vec<u8>>)> = Vec::with_capacity(elems.len());
        for e in elems {
            let w = match by {
                Some(p) => by_pattern(s, p, &e)?,
                None => Some(e.clone()),
            };
            let (score, bytes) = if alpha {
                (0.0, w)
            } else {
                match w {
                    None => (0.0, None),
                    Some(v) => match sort_score(&v) {
                        Some(x) => (x, None),
                        None => {
                            r.error("ERR One or more scores can't be converted into double");
                            return Ok(());
                        }
                    },
                }
            };
            keyed.push((e, score, bytes));
        }
        keyed.sort_by(|a, b| {
            let c = if alpha {
                // By bytes; a missing weight first.
                a.2.cmp(&b.2)
            } else {
                // By number, equal numbers by the elements' bytes (a stable order).
                a.1.partial_cmp(&b.1)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.0.cmp(&b.0))
            };
            if desc {
                c.reverse()
            } else {
                c
            }
        });
        elems = keyed.into_iter().map(|k| k.0).collect();
    }
    let picked: &[Vec<u8>] = if start <= end && end >= 0 {
        &elems[start as usize..=end as usize]
    } else {
        &[]
    };
    // What each picked element becomes: itself, or the values of the GET patterns.
    let mut out: Vec<Option<Vec<u8>>> = Vec::with_capacity(picked.len() * gets.len().max(1));
    for e in picked {
        if gets.is_empty() {
            out.push(Some(e.clone()));
        }
        for g in &gets {
            out.push(by_pattern(s, g, e)?);
        }
    }
    match store {
        Some(dst) => {
            s.del(dst)?;
            let values: Vec<&[u8]> = out.iter().map(|v| v.as_deref().unwrap_or(b"")).collect();
            if !values.is_empty() {
                s.list_push(dst, &values, false, true)?;
            }
            r.int(values.len() as i64);
        }
        None => {
            r.array(out.len());
            for v in &out {
                match v {
                    Some(v) => r.bulk(v),
                    None => r.null(),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_read_as_strtod_reads_them() {
        assert_eq!(sort_score(b"3"), Some(3.0));
        assert_eq!(sort_score(b"  -2.5"), Some(-2.5));
        assert_eq!(sort_score(b""), Some(0.0));
        assert_eq!(sort_score(b"0x10"), Some(16.0));
        assert_eq!(sort_score(b"-inf"), Some(f64::NEG_INFINITY));
        assert_eq!(sort_score(b"1e3"), Some(1000.0));
        assert_eq!(sort_score(b"3 "), None);
        assert_eq!(sort_score(b"nan"), None);
        assert_eq!(sort_score(b"abc"), None);
        // Only spaces: no number (strtod converts nothing); a NUL ends the string.
        assert_eq!(sort_score(b"  "), None);
        assert_eq!(sort_score(b"5\0junk"), Some(5.0));
        assert_eq!(sort_score(b"\0junk"), Some(0.0));
        // Out of range.
        assert_eq!(sort_score(b"1e400"), None);
        assert_eq!(sort_score(b"1e-400"), None);
        assert_eq!(sort_score(b"0e5"), Some(0.0));
    }
}
