//! The hash commands, as Redis 7.0's `t_hash.c` answers them, over the hash records of the
//! log (`docs/kv-service.md` §7): one element record per field.

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::CollType;
use crate::engine::Engine;
use crate::float::LongDouble;
use crate::keyspace::{passes, scan_args, scan_reply};
use crate::store::{unsigned_decimal, StoreError, StoreResult};

const HASH: CollType = CollType::Hash;

/// The most elements a command with repeats (`HRANDFIELD key -n`, `SRANDMEMBER key -n`)
/// answers: a larger count is refused rather than tie up the server.
pub(crate) const MAX_RANDOM_REPLY: u64 = 1 << 20;

/// The most bytes such a reply may take: draws of large values stop there, and the command
/// answers [`TOO_LARGE`] instead (the buffer grows no further).
pub(crate) const MAX_RANDOM_REPLY_BYTES: usize = 64 << 20;

/// The error of a reply over [`MAX_RANDOM_REPLY_BYTES`].
pub(crate) const TOO_LARGE: &str =
    "ERR reply too large (limit 67108864 bytes): ask for fewer elements";

/// `HSET key field value [field value ...]` (the number of new fields) and `HMSET` (OK).
pub(crate) fn hset(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    name: &str,
) -> StoreResult<()> {
    if argv.len() % 2 == 1 {
        r.error(&format!(
            "ERR wrong number of arguments for '{name}' command"
        ));
        return Ok(());
    }
    // A key of another type fails on the first field, before anything is written.
    let mut created = 0;
    for p in argv[2..].chunks(2) {
        created += i64::from(s.element_put(HASH, argv[1], p[0], p[1])?);
    }
    if name == "hmset" {
        r.ok();
    } else {
        r.int(created);
    }
    Ok(())
}

/// `HSETNX key field value`.
pub(crate) fn hsetnx(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    if s.element_exists(HASH, argv[1], argv[2])? {
        r.int(0);
    } else {
        s.element_put(HASH, argv[1], argv[2], argv[3])?;
        r.int(1);
    }
    Ok(())
}

/// `HGET key field`.
pub(crate) fn hget(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    s.element_get_with(HASH, argv[1], argv[2], &mut |v| match v {
        Some(v) => r.bulk(v),
        None => r.null(),
    })
}

/// `HMGET key field [field ...]`: a value or null per field.
pub(crate) fn hmget(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    // The type first: a wrong type is an error, not an array.
    s.coll_len(HASH, argv[1])?;
    r.array(argv.len() - 2);
    for f in &argv[2..] {
        s.element_get_with(HASH, argv[1], f, &mut |v| match v {
            Some(v) => r.bulk(v),
            None => r.null(),
        })?;
    }
    Ok(())
}

/// `DDS.HMGETPART key field [field ...]`: the host part of an HMGET the DPU split
/// (`docs/kv-service.md` §4.1): a reply per field and no array header; a key that is no
/// longer a hash answers nulls (the parts read on the DPU saw a hash).
pub(crate) fn hmget_part(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let hash = match s.coll_len(HASH, argv[1]) {
        Ok(_) => true,
        Err(StoreError::WrongType) => false,
        Err(e) => return Err(e),
    };
    for f in &argv[2..] {
        if !hash {
            r.null();
            continue;
        }
        s.element_get_with(HASH, argv[1], f, &mut |v| match v {
            Some(v) => r.bulk(v),
            None => r.null(),
        })?;
    }
    Ok(())
}

/// `HDEL key field [field ...]`: the fields removed.
pub(crate) fn hdel(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for f in &argv[2..] {
        n += i64::from(s.element_del(HASH, argv[1], f)?);
    }
    r.int(n);
    Ok(())
}

/// `HLEN key`.
pub(crate) fn hlen(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.int(s.coll_len(HASH, key)? as i64);
    Ok(())
}

/// `HEXISTS key field`.
pub(crate) fn hexists(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    r.int(i64::from(s.element_exists(HASH, argv[1], argv[2])?));
    Ok(())
}

/// `HSTRLEN key field`: the value's length, 0 when missing.
pub(crate) fn hstrlen(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    s.element_get_with(HASH, argv[1], argv[2], &mut |v| {
        n = v.map_or(0, <[u8]>::len);
    })?;
    r.int(n as i64);
    Ok(())
}

/// What `HGETALL`, `HKEYS` and `HVALS` list.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parts {
    Both,
    Fields,
    Values,
}

/// `HGETALL key` (a map), `HKEYS key` and `HVALS key` (arrays): the whole hash, read while
/// the command runs.
pub(crate) fn hgetall(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    key: &[u8],
    parts: Parts,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    body.clear();
    let mut n = 0;
    s.coll_scan(HASH, key, 0, usize::MAX, &mut |f, v| {
        let mut b = Reply::new(body);
        if parts != Parts::Values {
            b.bulk(f);
        }
        if parts != Parts::Fields {
            b.bulk(v);
        }
        n += 1;
    })?;
    if parts == Parts::Both {
        r.map(n);
    } else {
        r.array(n);
    }
    r.out_mut().extend_from_slice(body);
    Ok(())
}

/// `HSCAN key cursor [MATCH pattern] [COUNT count]`, `SSCAN` and `ZSCAN` (`ty`): one step
/// of the walk over the elements in hash order; a hash's fields come with their values, a
/// sorted set's members with their scores.
pub(crate) fn coll_scan(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    ty: CollType,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    // As Redis's `hscanCommand`: the cursor, then the key (a missing one is an empty scan,
    // whatever the options), then the options.
    if let Err(e) = scan_args(&argv[1..3]) {
        r.error(e);
        return Ok(());
    }
    if s.coll_len(ty, argv[1])? == 0 {
        r.array(2);
        r.bulk(b"0");
        r.array(0);
        return Ok(());
    }
    let a = match scan_args(&argv[1..]) {
        Ok(a) if a.type_name.is_none() => a,
        Ok(_) => {
            r.error("ERR syntax error");
            return Ok(());
        }
        Err(e) => {
            r.error(e);
            return Ok(());
        }
    };
    body.clear();
    let mut n = 0;
    let next = s.coll_scan(ty, argv[1], a.cursor, a.count, &mut |f, v| {
        if passes(a.pattern, f) {
            let mut b = Reply::new(body);
            b.bulk(f);
            n += 1;
            if ty == CollType::Hash {
                b.bulk(v);
                n += 1;
            } else if ty == CollType::ZSet {
                b.bulk(crate::zsets::scan_score(v).as_bytes());
                n += 1;
            }
        }
    })?;
    scan_reply(r, next, n, body);
    Ok(())
}

/// `HINCRBY key field increment`.
pub(crate) fn hincrby(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let Some(by) = int_arg(argv[3]) else {
        r.error("ERR value is not an integer or out of range");
        return Ok(());
    };
    let mut cur: Result<i64, &str> = Ok(0);
    s.element_get_with(HASH, argv[1], argv[2], &mut |v| {
        if let Some(v) = v {
            cur = int_arg(v).ok_or("ERR hash value is not an integer");
        }
    })?;
    let next = match cur.map(|c| c.checked_add(by)) {
        Err(e) => {
            r.error(e);
            return Ok(());
        }
        Ok(None) => {
            r.error("ERR increment or decrement would overflow");
            return Ok(());
        }
        Ok(Some(n)) => n,
    };
    let mut digits = [0u8; 20];
    let text = signed_decimal(next, &mut digits);
    s.element_put(HASH, argv[1], argv[2], text)?;
    r.int(next);
    Ok(())
}

/// `n` in decimal in `buf`.
fn signed_decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut digits = [0u8; 20];
    let d = unsigned_decimal(n.unsigned_abs(), &mut digits);
    let len = d.len() + usize::from(n < 0);
    if n < 0 {
        buf[0] = b'-';
    }
    buf[len - d.len()..len].copy_from_slice(d);
    &buf[..len]
}

/// `HINCRBYFLOAT key field increment`: the new value as INCRBYFLOAT writes it.
pub(crate) fn hincrbyfloat(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
) -> StoreResult<()> {
    let Some(by) = LongDouble::parse(argv[3]) else {
        r.error("ERR value is not a valid float");
        return Ok(());
    };
    if by.is_infinite() {
        r.error("ERR value is NaN or Infinity");
        return Ok(());
    }
    let mut cur: Result<LongDouble, &str> = Ok(LongDouble::zero());
    s.element_get_with(HASH, argv[1], argv[2], &mut |v| {
        if let Some(v) = v {
            cur = LongDouble::parse(v).ok_or("ERR hash value is not a float");
        }
    })?;
    let next = match cur.map(|c| c.add(by)) {
        Err(e) => {
            r.error(e);
            return Ok(());
        }
        Ok(None) => {
            r.error("ERR increment would produce NaN or Infinity");
            return Ok(());
        }
        Ok(Some(n)) => n.human(),
    };
    s.element_put(HASH, argv[1], argv[2], next.as_bytes())?;
    r.bulk(next.as_bytes());
    Ok(())
}

/// The count of `HRANDFIELD` and `SRANDMEMBER` as Redis 7.0 reads it: a number in
/// [-i64::MAX, i64::MAX]; a negative one asks for that many draws with repeats (at most
/// [`MAX_RANDOM_REPLY`] here). The error is the reply's text.
pub(crate) fn random_count(arg: &[u8]) -> Result<(u64, bool), &'static str> {
    match int_arg(arg) {
        None => Err("ERR value is not an integer or out of range"),
        Some(i64::MIN) => Err(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
        ),
        Some(n) if n < 0 && n.unsigned_abs() > MAX_RANDOM_REPLY => Err("ERR value is out of range"),
        Some(n) => Ok((n.unsigned_abs(), n < 0)),
    }
}

/// A random element's sub-key (HRANDFIELD, SRANDMEMBER without a count), or a null.
pub(crate) fn random_one(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    ty: CollType,
    key: &[u8],
) -> StoreResult<()> {
    let mut found = false;
    s.coll_random(ty, key, 1, false, &mut |f, _| {
        r.bulk(f);
        found = true;
    })?;
    if !found {
        r.null();
    }
    Ok(())
}

/// `HRANDFIELD key [count [WITHVALUES]]`.
pub(crate) fn hrandfield(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    resp3: bool,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    random_elements(s, r, argv, HASH, resp3, body, &|b, v| b.bulk(v))
}

/// HRANDFIELD and ZRANDMEMBER (`key [count [WITHVALUES|WITHSCORES]]`), as Redis's
/// `hrandfieldCommand` and `zrandmemberCommand` read them: the count, the option, then its
/// range. `value` writes an element's value (a hash field's, a member's score).
pub(crate) fn random_elements(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    ty: CollType,
    resp3: bool,
    body: &mut Vec<u8>,
    value: &dyn Fn(&mut Reply<'_>, &[u8]),
) -> StoreResult<()> {
    if argv.len() == 2 {
        return random_one(s, r, ty, argv[1]);
    }
    let (count, repeat) = match random_count(argv[2]) {
        Ok(c) => c,
        Err(e) => {
            r.error(e);
            return Ok(());
        }
    };
    let option: &[u8] = if ty == HASH {
        b"withvalues"
    } else {
        b"withscores"
    };
    let with_values = match argv.get(3) {
        None => false,
        Some(a) if argv.len() == 4 && a.eq_ignore_ascii_case(option) => true,
        Some(_) => {
            r.error("ERR syntax error");
            return Ok(());
        }
    };
    if with_values && count > i64::MAX as u64 / 2 {
        r.error("ERR value is out of range");
        return Ok(());
    }
    body.clear();
    let mut n = 0;
    s.coll_random(ty, argv[1], count as usize, repeat, &mut |f, v| {
        if body.len() > MAX_RANDOM_REPLY_BYTES {
            return;
        }
        let mut b = Reply::with_protocol(body, resp3);
        if with_values && resp3 {
            b.array(2);
        }
        b.bulk(f);
        if with_values {
            value(&mut b, v);
        }
        n += 1;
    })?;
    if body.len() > MAX_RANDOM_REPLY_BYTES {
        r.error(TOO_LARGE);
        return Ok(());
    }
    r.array(if with_values && !resp3 { 2 * n } else { n });
    r.out_mut().extend_from_slice(body);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_and_random_counts() {
        let mut b = [0u8; 20];
        assert_eq!(signed_decimal(0, &mut b), b"0");
        assert_eq!(signed_decimal(-17, &mut b), b"-17");
        assert_eq!(signed_decimal(i64::MIN, &mut b), b"-9223372036854775808");
        assert_eq!(signed_decimal(i64::MAX, &mut b), b"9223372036854775807");
        assert_eq!(random_count(b"5"), Ok((5, false)));
        assert_eq!(random_count(b"-5"), Ok((5, true)));
        assert_eq!(random_count(b"0"), Ok((0, false)));
        assert!(random_count(b"x").is_err());
        assert!(random_count(b"-9223372036854775808").is_err());
        assert!(random_count(b"-99999999999").is_err());
        assert_eq!(
            TOO_LARGE,
            format!("ERR reply too large (limit {MAX_RANDOM_REPLY_BYTES} bytes): ask for fewer elements")
        );
    }
}
