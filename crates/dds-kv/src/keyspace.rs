//! Keyspace commands on named keys, as Redis 7.0's `db.c` answers them: TYPE, TOUCH, RENAME,
//! RENAMENX and COPY (one database: `COPY .. DB 0` only).

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::engine::Engine;
use crate::store::{unsigned_decimal, Expiry, SetCond, StoreResult};

/// `TYPE key`: `string`, a collection's type (`hash`, `set`, ...) or `none`.
pub(crate) fn type_of(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.simple(s.key_type(key)?.unwrap_or("none"));
    Ok(())
}

/// What a RENAME or COPY moves: a string's value, or a collection (copied element by
/// element), with the key's expiry.
enum Source {
    Value(Vec<u8>),
    Collection,
}

/// The source of a RENAME or COPY and its expiry, `None` when `key` is missing.
fn source(s: &mut dyn Engine, key: &[u8]) -> StoreResult<Option<(Source, Expiry)>> {
    let Some(ty) = s.key_type(key)? else {
        return Ok(None);
    };
    if ty != "string" {
        let exp = s.expiry(key)?.unwrap_or(0);
        return Ok(Some((Source::Collection, expiry_of(exp))));
    }
    Ok(take_copy(s, key)?.map(|(v, e)| (Source::Value(v), e)))
}

fn expiry_of(exp: u64) -> Expiry {
    if exp == 0 {
        Expiry::None
    } else {
        Expiry::At(exp)
    }
}

/// Writes `src` (read by [`source`]) at `dst` when `cond` allows: whether it was written.
fn write_copy(
    s: &mut dyn Engine,
    from: &[u8],
    dst: &[u8],
    src: &Source,
    expiry: Expiry,
    cond: SetCond,
) -> StoreResult<bool> {
    match src {
        Source::Value(v) => s.set(dst, v, cond, expiry, None),
        Source::Collection => {
            if cond == SetCond::IfMissing && s.exists(dst)? {
                return Ok(false);
            }
            s.del(dst)?;
            let exp = match expiry {
                Expiry::At(t) => t,
                _ => 0,
            };
            s.coll_copy(from, dst, exp)
        }
    }
}

/// `TOUCH key [key ...]`: how many exist (there is no access time to update).
pub(crate) fn touch(s: &mut dyn Engine, r: &mut Reply<'_>, keys: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for k in keys {
        n += i64::from(s.exists(k)?);
    }
    r.int(n);
    Ok(())
}

/// The value and expiry of `key` (a copy: the command writes another key with them).
fn take_copy(s: &mut dyn Engine, key: &[u8]) -> StoreResult<Option<(Vec<u8>, Expiry)>> {
    let Some(exp) = s.expiry(key)? else {
        return Ok(None);
    };
    let mut value = Vec::new();
    s.get_with(key, &mut |v| value = v.unwrap_or_default().to_vec())?;
    Ok(Some((value, expiry_of(exp))))
}

/// `RENAME key newkey` and `RENAMENX key newkey`: the value moves with its expiry.
pub(crate) fn rename(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    nx: bool,
) -> StoreResult<()> {
    let (src, dst) = (argv[1], argv[2]);
    let Some((value, expiry)) = source(s, src)? else {
        r.error("ERR no such key");
        return Ok(());
    };
    if src == dst {
        if nx {
            r.int(0);
        } else {
            r.ok();
        }
        return Ok(());
    }
    let cond = if nx {
        SetCond::IfMissing
    } else {
        SetCond::Always
    };
    if !write_copy(s, src, dst, &value, expiry, cond)? {
        r.int(0);
        return Ok(());
    }
    s.del(src)?;
    if nx {
        r.int(1);
    } else {
        r.ok();
    }
    Ok(())
}

/// `COPY source destination [DB 0] [REPLACE]`: 1 when copied (with its expiry).
pub(crate) fn copy(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut replace = false;
    let mut j = 3;
    while j < argv.len() {
        match crate::commands::option(argv[j], &["replace", "db"]) {
            "replace" => replace = true,
            "db" if j + 1 < argv.len() => {
                match int_arg(argv[j + 1]) {
                    None => {
                        r.error("ERR value is not an integer or out of range");
                        return Ok(());
                    }
                    Some(0) => {}
                    Some(_) => {
                        r.error("ERR DB index is out of range");
                        return Ok(());
                    }
                }
                j += 1;
            }
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
        j += 1;
    }
    let (src, dst) = (argv[1], argv[2]);
    if src == dst {
        r.error("ERR source and destination objects are the same");
        return Ok(());
    }
    let Some((value, expiry)) = source(s, src)? else {
        r.int(0);
        return Ok(());
    };
    let cond = if replace {
        SetCond::Always
    } else {
        SetCond::IfMissing
    };
    let copied = write_copy(s, src, dst, &value, expiry, cond)?;
    r.int(i64::from(copied));
    Ok(())
}

/// SCAN's arguments: the cursor, COUNT (default 10), MATCH and TYPE.
pub(crate) struct ScanArgs<'a> {
    pub cursor: u64,
    pub count: usize,
    pub pattern: Option<&'a [u8]>,
    pub type_name: Option<&'a [u8]>,
}

/// The cursor as Redis's `parseScanCursorOrReply` reads it (`strtoul`, base 10): an optional
/// sign (a negative one wraps), no leading space, nothing after the digits, no overflow; an
/// empty argument is 0.
fn parse_cursor(arg: &[u8]) -> Option<u64> {
    if arg.is_empty() {
        return Some(0);
    }
    let (neg, digits) = match arg[0] {
        b'-' => (true, &arg[1..]),
        b'+' => (false, &arg[1..]),
        _ => (false, arg),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// Parses `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]` as Redis 7.0 does (the
/// cursor first, then the options in order, the last of a repeated one counting); the
/// error is the reply's text.
pub(crate) fn scan_args<'a>(argv: &[&'a [u8]]) -> Result<ScanArgs<'a>, &'static str> {
    let cursor = parse_cursor(argv[1]).ok_or("ERR invalid cursor")?;
    let mut a = ScanArgs {
        cursor,
        count: 10,
        pattern: None,
        type_name: None,
    };
    let mut i = 2;
    while i < argv.len() {
        let Some(&value) = argv.get(i + 1) else {
            return Err("ERR syntax error");
        };
        match crate::commands::option(argv[i], &["count", "match", "type"]) {
            "count" => match int_arg(value) {
                None => return Err("ERR value is not an integer or out of range"),
                Some(n) if n < 1 => return Err("ERR syntax error"),
                Some(n) => a.count = usize::try_from(n).unwrap_or(usize::MAX),
            },
            "match" => a.pattern = Some(value),
            "type" => a.type_name = Some(value),
            _ => return Err("ERR syntax error"),
        }
        i += 2;
    }
    Ok(a)
}

/// Whether `key` passes a MATCH pattern (`*` alone passes every key, the empty one too).
pub(crate) fn passes(pattern: Option<&[u8]>, key: &[u8]) -> bool {
    match pattern {
        None | Some(b"*") => true,
        Some(p) => crate::glob::matches(p, key, false),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]`: one step of the walk over the
/// keys in hash order (`docs/kv-service.md` §5); the reply is the next cursor and the keys.
pub(crate) fn scan(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    let a = match scan_args(argv) {
        Ok(a) => a,
        Err(e) => {
            r.error(e);
            return Ok(());
        }
    };
    body.clear();
    let mut n = 0;
    let next = match a.type_name {
        None => s.scan(a.cursor, a.count, true, &mut |k| {
            if passes(a.pattern, k) {
                Reply::new(body).bulk(k);
                n += 1;
            }
        })?,
        Some(t) => {
            // The step's keys first, then their types (from memory: no record is read).
            // An unknown type name filters every key out, as in Redis 7.0.
            let mut step: Vec<Vec<u8>> = Vec::new();
            let next = s.scan(a.cursor, a.count, true, &mut |k| {
                if passes(a.pattern, k) {
                    step.push(k.to_vec());
                }
            })?;
            for k in step {
                if t.eq_ignore_ascii_case(s.live_key_type(&k).as_bytes()) {
                    Reply::new(body).bulk(&k);
                    n += 1;
                }
            }
            next
        }
    };
    scan_reply(r, next, n, body);
    Ok(())
}

/// A SCAN-family reply: the next cursor, then the `n` replies encoded in `body`.
pub(crate) fn scan_reply(r: &mut Reply<'_>, next: u64, n: usize, body: &[u8]) {
    r.array(2);
    let mut digits = [0u8; 20];
    r.bulk(unsigned_decimal(next, &mut digits));
    r.array(n);
    r.out_mut().extend_from_slice(body);
}

/// `KEYS pattern`: every live key that matches, by a whole walk of SCAN's steps (a key on
/// storage is read while the command runs, as Redis's KEYS blocks its server). Expired keys
/// are left for the expiry cycle, as Redis 7.0's KEYS leaves them.
pub(crate) fn keys(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    pattern: &[u8],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    body.clear();
    let mut n = 0;
    let mut cursor = 0;
    loop {
        cursor = s.scan(cursor, 1024, false, &mut |k| {
            if passes(Some(pattern), k) {
                Reply::new(body).bulk(k);
                n += 1;
            }
        })?;
        if cursor == 0 {
            break;
        }
    }
    r.array(n);
    r.out_mut().extend_from_slice(body);
    Ok(())
}

/// `RANDOMKEY`: a live key, or null.
pub(crate) fn random_key(s: &mut dyn Engine, r: &mut Reply<'_>) -> StoreResult<()> {
    let mut found = false;
    s.random_key(&mut |k| {
        r.bulk(k);
        found = true;
    })?;
    if !found {
        r.null();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_cursor;
    use crate::store::unsigned_decimal;

    #[test]
    fn cursors_print_in_decimal() {
        let mut b = [0u8; 20];
        assert_eq!(unsigned_decimal(0, &mut b), b"0");
        assert_eq!(unsigned_decimal(u64::MAX, &mut b), b"18446744073709551615");
    }

    #[test]
    fn cursors_read_as_strtoul() {
        assert_eq!(parse_cursor(b""), Some(0));
        assert_eq!(parse_cursor(b"+0"), Some(0));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551616"), None);
        assert_eq!(parse_cursor(b" 1"), None);
        assert_eq!(parse_cursor(b"1 "), None);
        assert_eq!(parse_cursor(b"-"), None);
        assert_eq!(parse_cursor(b"x"), None);
    }
}
