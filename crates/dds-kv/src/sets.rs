//! The set commands, as Redis 7.0's `t_set.c` answers them, over the set records of the log
//! (`docs/kv-service.md` §7): one element record (with an empty value) per member.

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::CollType;
use crate::engine::Engine;
use crate::hashes::{random_count, random_one, MAX_RANDOM_REPLY_BYTES, TOO_LARGE};
use crate::store::StoreResult;

const SET: CollType = CollType::Set;

/// `SADD key member [member ...]`: the members added.
pub(crate) fn sadd(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for m in &argv[2..] {
        n += i64::from(s.element_put(SET, argv[1], m, b"")?);
    }
    r.int(n);
    Ok(())
}

/// `SREM key member [member ...]`: the members removed.
pub(crate) fn srem(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for m in &argv[2..] {
        n += i64::from(s.element_del(SET, argv[1], m)?);
    }
    r.int(n);
    Ok(())
}

/// `SISMEMBER key member`.
pub(crate) fn sismember(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    r.int(i64::from(s.element_exists(SET, argv[1], argv[2])?));
    Ok(())
}

/// `SMISMEMBER key member [member ...]`: 1 or 0 per member.
pub(crate) fn smismember(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    s.coll_len(SET, argv[1])?;
    r.array(argv.len() - 2);
    for m in &argv[2..] {
        r.int(i64::from(s.element_exists(SET, argv[1], m)?));
    }
    Ok(())
}

/// `SCARD key`.
pub(crate) fn scard(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.int(s.coll_len(SET, key)? as i64);
    Ok(())
}

/// Every member of the set at `key` (none for a missing key; WRONGTYPE for another type).
fn members(s: &mut dyn Engine, key: &[u8]) -> StoreResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    s.coll_scan(SET, key, 0, usize::MAX, &mut |m, _| out.push(m.to_vec()))?;
    Ok(out)
}

/// `members` as a set reply.
fn reply_set(r: &mut Reply<'_>, members: &[Vec<u8>]) {
    r.set(members.len());
    for m in members {
        r.bulk(m);
    }
}

/// `SMEMBERS key`.
pub(crate) fn smembers(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    key: &[u8],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    body.clear();
    let mut n = 0;
    s.coll_scan(SET, key, 0, usize::MAX, &mut |m, _| {
        Reply::new(body).bulk(m);
        n += 1;
    })?;
    r.set(n);
    r.out_mut().extend_from_slice(body);
    Ok(())
}

/// The set operation of `SINTER`, `SUNION` and `SDIFF` (and their STORE forms).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Inter,
    Union,
    Diff,
}

/// The result of `op` over the sets at `keys`, stopping at `limit` members (SINTERCARD).
/// Every key is type-checked first, as Redis does; a missing key is an empty set.
fn combine(s: &mut dyn Engine, op: Op, keys: &[&[u8]], limit: usize) -> StoreResult<Vec<Vec<u8>>> {
    let mut lens = Vec::with_capacity(keys.len());
    for k in keys {
        lens.push(s.coll_len(SET, k)?);
    }
    let mut out: Vec<Vec<u8>> = Vec::new();
    match op {
        Op::Inter => {
            if lens.contains(&0) {
                return Ok(out);
            }
            // The smallest set's members, checked against every other set.
            let smallest = (0..keys.len()).min_by_key(|&i| lens[i]).unwrap_or(0);
            for m in members(s, keys[smallest])? {
                let mut all = true;
                for (i, k) in keys.iter().enumerate() {
                    if i != smallest && !s.element_exists(SET, k, &m)? {
                        all = false;
                        break;
                    }
                }
                if all {
                    out.push(m);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        }
        Op::Union => {
            let mut seen = std::collections::HashSet::new();
            for k in keys {
                for m in members(s, k)? {
                    if seen.insert(m.clone()) {
                        out.push(m);
                    }
                }
            }
        }
        Op::Diff => {
            for m in members(s, keys[0])? {
                let mut keep = true;
                for k in &keys[1..] {
                    if s.element_exists(SET, k, &m)? {
                        keep = false;
                        break;
                    }
                }
                if keep {
                    out.push(m);
                }
            }
        }
    }
    Ok(out)
}

/// `SINTER`, `SUNION`, `SDIFF key [key ...]`: the members.
pub(crate) fn set_op(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    keys: &[&[u8]],
    op: Op,
) -> StoreResult<()> {
    let m = combine(s, op, keys, usize::MAX)?;
    reply_set(r, &m);
    Ok(())
}

/// `SINTERSTORE`, `SUNIONSTORE`, `SDIFFSTORE destination key [key ...]`: the result replaces
/// `destination` (an empty one deletes it); the reply is its size.
pub(crate) fn set_op_store(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    op: Op,
) -> StoreResult<()> {
    let m = combine(s, op, &argv[2..], usize::MAX)?;
    store_members(s, argv[1], &m)?;
    r.int(m.len() as i64);
    Ok(())
}

/// Replaces `key` with a set of `members` (deleted when there are none).
fn store_members(s: &mut dyn Engine, key: &[u8], members: &[Vec<u8>]) -> StoreResult<()> {
    s.del(key)?;
    for m in members {
        s.element_put(SET, key, m, b"")?;
    }
    Ok(())
}

/// `SINTERCARD numkeys key [key ...] [LIMIT limit]`: the intersection's size, counted up to
/// `limit` (0: no limit).
pub(crate) fn sintercard(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    // A non-number gets the range's message too, as Redis's `getRangeLongFromObjectOrReply`.
    let numkeys = match int_arg(argv[1]) {
        Some(n) if n >= 1 => n as u64,
        _ => {
            r.error("ERR numkeys should be greater than 0");
            return Ok(());
        }
    };
    if numkeys > (argv.len() - 2) as u64 {
        r.error("ERR Number of keys can't be greater than number of args");
        return Ok(());
    }
    let keys_end = 2 + numkeys as usize;
    let mut limit = 0u64;
    let mut j = keys_end;
    while j < argv.len() {
        if argv[j].eq_ignore_ascii_case(b"limit") && j + 1 < argv.len() {
            match int_arg(argv[j + 1]) {
                Some(l) if l >= 0 => limit = l as u64,
                _ => {
                    r.error("ERR LIMIT can't be negative");
                    return Ok(());
                }
            }
            j += 2;
        } else {
            r.error("ERR syntax error");
            return Ok(());
        }
    }
    let limit = if limit == 0 {
        usize::MAX
    } else {
        limit as usize
    };
    let m = combine(s, Op::Inter, &argv[2..keys_end], limit)?;
    r.int(m.len() as i64);
    Ok(())
}

/// `SMOVE source destination member`.
pub(crate) fn smove(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let (src, dst, m) = (argv[1], argv[2], argv[3]);
    if s.coll_len(SET, src)? == 0 {
        r.int(0);
        return Ok(());
    }
    s.coll_len(SET, dst)?;
    if src == dst {
        r.int(i64::from(s.element_exists(SET, src, m)?));
        return Ok(());
    }
    if !s.element_del(SET, src, m)? {
        r.int(0);
        return Ok(());
    }
    s.element_put(SET, dst, m, b"")?;
    r.int(1);
    Ok(())
}

/// `SPOP key [count]`: removes and answers random members.
pub(crate) fn spop(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    if argv.len() > 3 {
        r.error("ERR syntax error");
        return Ok(());
    }
    // Not a number or negative: one message, as Redis's `getPositiveLongFromObjectOrReply`.
    let count = match argv.get(2).map(|a| int_arg(a)) {
        None => None,
        Some(Some(n)) if n >= 0 => Some(n as usize),
        Some(_) => {
            r.error("ERR value is out of range, must be positive");
            return Ok(());
        }
    };
    let mut picked = Vec::new();
    s.coll_random(SET, argv[1], count.unwrap_or(1), false, &mut |m, _| {
        picked.push(m.to_vec())
    })?;
    for m in &picked {
        s.element_del(SET, argv[1], m)?;
    }
    match count {
        None => match picked.first() {
            Some(m) => r.bulk(m),
            None => r.null(),
        },
        Some(_) => reply_set(r, &picked),
    }
    Ok(())
}

/// `SRANDMEMBER key [count]`: random members, with repeats for a negative count.
pub(crate) fn srandmember(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    if argv.len() > 3 {
        r.error("ERR syntax error");
        return Ok(());
    }
    if argv.len() == 2 {
        return random_one(s, r, SET, argv[1]);
    }
    let (count, repeat) = match random_count(argv[2]) {
        Ok(c) => c,
        Err(e) => {
            r.error(e);
            return Ok(());
        }
    };
    body.clear();
    let mut n = 0;
    s.coll_random(SET, argv[1], count as usize, repeat, &mut |m, _| {
        if body.len() <= MAX_RANDOM_REPLY_BYTES {
            Reply::new(body).bulk(m);
            n += 1;
        }
    })?;
    if body.len() > MAX_RANDOM_REPLY_BYTES {
        r.error(TOO_LARGE);
        return Ok(());
    }
    r.array(n);
    r.out_mut().extend_from_slice(body);
    Ok(())
}
