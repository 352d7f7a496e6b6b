//! `SORT` and `SORT_RO`, as Redis 7.0's `sort.c` answers them: the elements of a list, set or
//! sorted set, ordered by their own value or by keys a pattern names (`BY weight_*`,
//! `BY hash_*->field`), numerically or by bytes (ALPHA), cut by LIMIT, each replaced by the
//! values GET patterns name (`#`: the element), answered or stored as a list (STORE).

use std::cmp::Ordering;

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

/// A byte string as a C function reads it: up to its first NUL.
fn c_string(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

/// Redis's partial quicksort (`pqsort.c`: Bentley and McIlroy's quicksort, "Engineering a
/// Sort Function", that leaves unsorted the parts outside positions `lo..=hi`). SORT with BY
/// and LIMIT orders with it, so elements whose weights compare equal come out in the order it
/// leaves them; the same steps give the same order.
fn pqsort<T>(v: &mut [T], lo: i64, hi: i64, cmp: &mut impl FnMut(&T, &T) -> Ordering) {
    pq_part(v, 0, v.len(), lo, hi, cmp);
}

/// Whether `v[at..at + n]` holds none of positions `lo..=hi`.
fn outside(at: usize, n: usize, lo: i64, hi: i64) -> bool {
    let (s, e) = (at as i64, (at + n) as i64);
    (lo < s && hi < s) || (lo >= e && hi >= e)
}

/// Of three positions, the one holding the median.
fn med3<T>(
    v: &[T],
    a: usize,
    b: usize,
    c: usize,
    cmp: &mut impl FnMut(&T, &T) -> Ordering,
) -> usize {
    if cmp(&v[a], &v[b]) == Ordering::Less {
        if cmp(&v[b], &v[c]) == Ordering::Less {
            b
        } else if cmp(&v[a], &v[c]) == Ordering::Less {
            c
        } else {
            a
        }
    } else if cmp(&v[b], &v[c]) == Ordering::Greater {
        b
    } else if cmp(&v[a], &v[c]) == Ordering::Less {
        a
    } else {
        c
    }
}

/// Sorts `v[at..at + n]` as far as positions `lo..=hi` need.
fn pq_part<T>(
    v: &mut [T],
    mut at: usize,
    mut n: usize,
    lo: i64,
    hi: i64,
    cmp: &mut impl FnMut(&T, &T) -> Ordering,
) {
    loop {
        if n < 7 {
            // Insertion sort.
            for m in at + 1..at + n {
                let mut l = m;
                while l > at && cmp(&v[l - 1], &v[l]) == Ordering::Greater {
                    v.swap(l, l - 1);
                    l -= 1;
                }
            }
            return;
        }
        // The pivot: the middle, the median of three, or of three medians of three.
        let mut pm = at + n / 2;
        if n > 7 {
            let (mut pl, mut pn) = (at, at + n - 1);
            if n > 40 {
                let d = n / 8;
                pl = med3(v, pl, pl + d, pl + 2 * d, cmp);
                pm = med3(v, pm - d, pm, pm + d, cmp);
                pn = med3(v, pn - 2 * d, pn - d, pn, cmp);
            }
            pm = med3(v, pl, pm, pn, cmp);
        }
        v.swap(at, pm);
        // Split into: equal to the pivot | less | greater | equal, the equal ones gathered
        // at both ends.
        let (mut pa, mut pb) = (at + 1, at + 1);
        let (mut pc, mut pd) = (at + n - 1, at + n - 1);
        loop {
            while pb <= pc {
                let c = cmp(&v[pb], &v[at]);
                if c == Ordering::Greater {
                    break;
                }
                if c == Ordering::Equal {
                    v.swap(pa, pb);
                    pa += 1;
                }
                pb += 1;
            }
            while pb <= pc {
                let c = cmp(&v[pc], &v[at]);
                if c == Ordering::Less {
                    break;
                }
                if c == Ordering::Equal {
                    v.swap(pc, pd);
                    pd -= 1;
                }
                pc -= 1;
            }
            if pb > pc {
                break;
            }
            v.swap(pb, pc);
            pb += 1;
            pc -= 1;
        }
        // The equal ones to the middle.
        let pn = at + n;
        let r = (pa - at).min(pb - pa);
        for k in 0..r {
            v.swap(at + k, pb - r + k);
        }
        let r = (pd - pc).min(pn - pd - 1);
        for k in 0..r {
            v.swap(pb + k, pn - r + k);
        }
        // The less part (recursively), then the greater part (in this loop), each only when
        // it holds a wanted position.
        let r = pb - pa;
        if r > 1 && !outside(at, r, lo, hi) {
            pq_part(v, at, r, lo, hi, cmp);
        }
        let r = pd - pc;
        if r <= 1 {
            return;
        }
        at = pn - r;
        n = r;
        if outside(at, n, lo, hi) {
            return;
        }
    }
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
        let store_cmp = store.is_some();
        let mut cmp = |a: &(Vec<u8>, f64, Option<Vec<u8>>), b: &(Vec<u8>, f64, Option<Vec<u8>>)| {
            let c = if alpha {
                // By bytes, a missing weight first. Without STORE Redis compares the weights
                // with strcoll (C strings: up to a NUL), with STORE as binary strings.
                match (&a.2, &b.2) {
                    (Some(x), Some(y)) if by.is_some() && !store_cmp => {
                        c_string(x).cmp(c_string(y))
                    }
                    (x, y) => x.cmp(y),
                }
            } else {
                // By number, equal numbers by the elements' bytes (a total order).
                a.1.partial_cmp(&b.1)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then_with(|| a.0.cmp(&b.0))
            };
            if desc {
                c.reverse()
            } else {
                c
            }
        };
        if by.is_some() && (start != 0 || end != len - 1) {
            // Only a part is wanted: Redis's partial quicksort, whose order of equal ALPHA
            // weights is its own (not stable), so it is the one to follow.
            pqsort(&mut keyed, start, end, &mut cmp);
        } else {
            // The C library's qsort is a stable merge sort.
            keyed.sort_by(cmp);
        }
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
    #[test]
    fn the_partial_sort_orders_the_wanted_part() {
        // Against a full sort on many inputs and ranges: the wanted positions agree.
        let mut seed = 7u64;
        for n in 0..120usize {
            for _ in 0..8 {
                let v: Vec<u32> = (0..n)
                    .map(|_| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((seed >> 33) % 50) as u32
                    })
                    .collect();
                let mut full = v.clone();
                full.sort();
                let lo = (seed >> 20) as usize % (n + 1);
                let hi = (lo + (seed >> 40) as usize % 5).min(n.saturating_sub(1));
                let mut part = v.clone();
                pqsort(&mut part, lo as i64, hi as i64, &mut |a: &u32, b: &u32| {
                    a.cmp(b)
                });
                if lo <= hi && hi < n {
                    assert_eq!(part[lo..=hi], full[lo..=hi], "n {n} lo {lo} hi {hi}");
                }
                part.sort();
                assert_eq!(part, full, "a permutation");
            }
        }
    }

    #[test]
    fn the_partial_sort_leaves_ties_where_redis_leaves_them() {
        // Elements 0..=11 weighted b a b a c a b a a c b a: what redis-server 7.0 answers to
        // SORT BY ALPHA LIMIT 0 4 (a stable sort would answer 1 3 5 7), and to LIMIT 2 3 DESC.
        let w = b"babacabaacba";
        let v: Vec<(u8, u8)> = (0..12u8).map(|i| (i, w[i as usize])).collect();
        let mut part = v.clone();
        pqsort(&mut part, 0, 3, &mut |a: &(u8, u8), b: &(u8, u8)| {
            a.1.cmp(&b.1)
        });
        assert_eq!(
            part[..4].iter().map(|e| e.0).collect::<Vec<_>>(),
            [1, 7, 8, 3]
        );
        let mut part = v.clone();
        pqsort(&mut part, 2, 4, &mut |a: &(u8, u8), b: &(u8, u8)| {
            b.1.cmp(&a.1)
        });
        assert_eq!(
            part[2..5].iter().map(|e| e.0).collect::<Vec<_>>(),
            [0, 2, 6]
        );
    }
}
