//! The list commands, as Redis 7.0's `t_list.c` answers them, over the list records of the
//! log (`docs/kv-service.md` §7): one element record per element under its position. The
//! blocking pops (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP, and the sorted sets' BZPOPMIN,
//! BZPOPMAX, BZMPOP) answer at once when a key has elements; otherwise they ask the server to
//! park the connection ([`Block`]) until a write gives one of their keys elements or their
//! timeout passes, and run again then.

use std::time::{Duration, Instant};

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::CollType;
use crate::engine::Engine;
use crate::store::StoreResult;
use crate::zsets;

const LIST: CollType = CollType::List;

/// A blocking command's wait, handed from the command to the server.
#[derive(Debug, Default)]
pub struct Block {
    /// In: the command is run again after it waited; the deadline it had (`None`: none).
    pub resumed: Option<Option<Instant>>,
    /// Out: the command found no elements and waits, for these keys of this type.
    pub wait: Option<Wait>,
    /// In: the command may not wait (it runs inside EXEC): it answers as if its timeout had
    /// passed, as Redis does.
    pub deny: bool,
}

/// What a parked connection waits for.
#[derive(Debug)]
pub struct Wait {
    /// When it gives up (`None`: timeout 0, forever).
    pub deadline: Option<Instant>,
    /// The type of the keys (list or sorted set).
    pub ty: CollType,
    /// The keys, any of which having elements wakes it.
    pub keys: Vec<Vec<u8>>,
}

impl Block {
    /// The command finds nothing to pop: true when its timeout has passed (it answers the
    /// timeout's reply); otherwise the wait is recorded for the server and the command
    /// answers nothing.
    fn wait_or_time_out(&mut self, ty: CollType, keys: &[&[u8]], timeout: Duration) -> bool {
        if self.deny {
            return true;
        }
        let deadline = match self.resumed {
            Some(d) => d,
            None => (!timeout.is_zero()).then(|| Instant::now() + timeout),
        };
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return true;
        }
        self.wait = Some(Wait {
            deadline,
            ty,
            keys: keys.iter().map(|k| k.to_vec()).collect(),
        });
        false
    }
}

const NOT_INTEGER: &str = "ERR value is not an integer or out of range";

/// `LEFT` or `RIGHT` (Redis's `getListPositionFromObjectOrReply`): true for LEFT.
fn side(arg: &[u8]) -> Option<bool> {
    if arg.eq_ignore_ascii_case(b"left") {
        Some(true)
    } else if arg.eq_ignore_ascii_case(b"right") {
        Some(false)
    } else {
        None
    }
}

/// A blocking command's timeout in seconds (Redis's `getTimeoutFromObjectOrReply`): the
/// error text when it is not a number, negative or too large.
pub(crate) fn timeout_arg(arg: &[u8]) -> Result<Duration, &'static str> {
    let s = std::str::from_utf8(arg).map_err(|_| "ERR timeout is not a float or out of range")?;
    // strtold's forms: decimal, exponent, and hexadecimal integers.
    let secs = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v as f64),
        None if s.contains(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E') => None,
        None => s.parse::<f64>().ok(),
    }
    .filter(|v| v.is_finite())
    .ok_or("ERR timeout is not a float or out of range")?;
    let ms = (secs * 1000.0).trunc();
    // Past i64, C's conversion to `long long` gives LLONG_MIN on the machines Redis runs
    // on: Redis then says "negative".
    if ms < 0.0 || ms >= i64::MAX as f64 {
        return Err("ERR timeout is negative");
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_millis() as f64);
    if ms > i64::MAX as f64 - now_ms {
        return Err("ERR timeout is out of range");
    }
    Ok(Duration::from_millis(ms as u64))
}

/// The value of a parse, or `None` after its error text went out as the reply.
fn or_reply<T>(r: &mut Reply<'_>, parsed: Result<T, &str>) -> Option<T> {
    parsed.map_err(|e| r.error(e)).ok()
}

/// A non-negative count (Redis's `getPositiveLongFromObjectOrReply` with its message, which
/// a non-number gets too).
fn positive(arg: &[u8], msg: &str) -> Result<i64, String> {
    match int_arg(arg) {
        None => Err(format!("ERR {msg}")),
        Some(n) if n < 0 => Err(format!("ERR {msg}")),
        Some(n) => Ok(n),
    }
}

/// `LPUSH`, `RPUSH`, `LPUSHX`, `RPUSHX key element [element ...]`: the length after.
pub(crate) fn push(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    left: bool,
    create: bool,
) -> StoreResult<()> {
    let n = s.list_push(argv[1], &argv[2..], left, create)?;
    r.int(n as i64);
    Ok(())
}

/// `LLEN key`.
pub(crate) fn llen(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.int(s.coll_len(LIST, key)? as i64);
    Ok(())
}

/// `LPOP`, `RPOP key [count]`.
pub(crate) fn pop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    left: bool,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    if argv.len() > 3 {
        let name = if left { "lpop" } else { "rpop" };
        r.error(&format!(
            "ERR wrong number of arguments for '{name}' command"
        ));
        return Ok(());
    }
    let count = match argv.get(2) {
        None => None,
        Some(a) => match positive(a, "value is out of range, must be positive") {
            Ok(n) => Some(n as u64),
            Err(e) => {
                r.error(&e);
                return Ok(());
            }
        },
    };
    let key = argv[1];
    let len = s.coll_len(LIST, key)?;
    match count {
        None => {
            if !s.list_pop_with(key, left, &mut |v| r.bulk(v))? {
                r.null();
            }
        }
        Some(_) if len == 0 => r.null_array(),
        Some(0) => r.array(0),
        Some(n) => {
            let n = n.min(len);
            let (from, to) = if left { (0, n) } else { (len - n, len) };
            let n = range_reply(s, r, key, from, to, !left, body)?;
            s.list_replace_end(key, left, n, &[])?;
        }
    }
    Ok(())
}

/// Writes the elements at indexes `from..to` as an array (reversed with `rev`): the number
/// of elements written. The elements go to `body` first, so that the array's length is the
/// number found.
fn range_reply(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    key: &[u8],
    from: u64,
    to: u64,
    rev: bool,
    body: &mut Vec<u8>,
) -> StoreResult<u64> {
    body.clear();
    let mut n = 0;
    s.list_visit(key, from, to, rev, &mut |_, v| {
        Reply::new(body).bulk(v);
        n += 1;
        true
    })?;
    r.array(n as usize);
    r.out_mut().extend_from_slice(body);
    Ok(n)
}

/// Redis's range of `start..=stop` (negative from the end) over `len` elements: `from..to`,
/// empty when nothing is in range.
fn range(start: i64, stop: i64, len: u64) -> (u64, u64) {
    let len = len as i64;
    let start = if start < 0 {
        (len + start).max(0)
    } else {
        start
    };
    let stop = if stop < 0 { len + stop } else { stop };
    if start > stop || start >= len {
        return (0, 0);
    }
    (start as u64, (stop.min(len - 1) + 1) as u64)
}

/// `LRANGE key start stop`.
pub(crate) fn lrange(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    let (Some(start), Some(stop)) = (int_arg(argv[2]), int_arg(argv[3])) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    let len = s.coll_len(LIST, argv[1])?;
    let (from, to) = range(start, stop, len);
    range_reply(s, r, argv[1], from, to, false, body)?;
    Ok(())
}

/// The index `i` (negative from the end) of a list of `len` elements, if in range.
fn index(i: i64, len: u64) -> Option<u64> {
    let i = if i < 0 { len as i64 + i } else { i };
    (i >= 0 && (i as u64) < len).then_some(i as u64)
}

/// `LINDEX key index`.
pub(crate) fn lindex(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    // The key first, then the index (as Redis: a missing key is a null whatever the index).
    let len = s.coll_len(LIST, argv[1])?;
    if len == 0 {
        r.null();
        return Ok(());
    }
    let Some(i) = int_arg(argv[2]) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    let mut found = false;
    if let Some(i) = index(i, len) {
        s.list_visit(argv[1], i, i + 1, false, &mut |_, v| {
            r.bulk(v);
            found = true;
            false
        })?;
    }
    if !found {
        r.null();
    }
    Ok(())
}

/// `LSET key index element`.
pub(crate) fn lset(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let len = s.coll_len(LIST, argv[1])?;
    if len == 0 {
        r.error("ERR no such key");
        return Ok(());
    }
    let Some(i) = int_arg(argv[2]) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    match index(i, len) {
        Some(i) if s.list_set(argv[1], i, argv[3])? => r.ok(),
        _ => r.error("ERR index out of range"),
    }
    Ok(())
}

/// The elements at indexes `from..to`, owned (for a rewrite).
fn elements(s: &mut dyn Engine, key: &[u8], from: u64, to: u64) -> StoreResult<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity((to - from.min(to)) as usize);
    s.list_visit(key, from, to, false, &mut |_, v| {
        out.push(v.to_vec());
        true
    })?;
    Ok(out)
}

/// Rewrites the list of `len` elements so that the elements at `lo..hi` become `new`,
/// through the nearer end: the elements between the change and that end are written again.
fn splice(
    s: &mut dyn Engine,
    key: &[u8],
    len: u64,
    (lo, hi): (u64, u64),
    new: &[&[u8]],
) -> StoreResult<()> {
    if hi <= len - lo {
        // Through the head: indexes 0..hi are replaced.
        let before = elements(s, key, 0, lo)?;
        let mut seg: Vec<&[u8]> = before.iter().map(|v| &v[..]).collect();
        seg.extend_from_slice(new);
        s.list_replace_end(key, true, hi, &seg)
    } else {
        // Through the end: indexes lo..len are replaced.
        let after = elements(s, key, hi, len)?;
        let mut seg: Vec<&[u8]> = new.to_vec();
        seg.extend(after.iter().map(|v| &v[..]));
        s.list_replace_end(key, false, len - lo, &seg)
    }
}

/// `LINSERT key BEFORE|AFTER pivot element`: the length after, -1 when the pivot is not
/// found, 0 for a missing key.
pub(crate) fn linsert(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let after = if argv[2].eq_ignore_ascii_case(b"after") {
        true
    } else if argv[2].eq_ignore_ascii_case(b"before") {
        false
    } else {
        r.error("ERR syntax error");
        return Ok(());
    };
    let len = s.coll_len(LIST, argv[1])?;
    if len == 0 {
        r.int(0);
        return Ok(());
    }
    let mut at = None;
    s.list_visit(argv[1], 0, len, false, &mut |i, v| {
        if v == argv[3] {
            at = Some(i);
            return false;
        }
        true
    })?;
    let Some(i) = at else {
        r.int(-1);
        return Ok(());
    };
    let i = i + u64::from(after);
    splice(s, argv[1], len, (i, i), &[argv[4]])?;
    r.int(len as i64 + 1);
    Ok(())
}

/// `LREM key count element`: the elements removed (count > 0: the first `count` from the
/// head; < 0: from the end; 0: all).
pub(crate) fn lrem(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let Some(count) = int_arg(argv[2]) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    let key = argv[1];
    let len = s.coll_len(LIST, key)?;
    let limit = if count == 0 {
        u64::MAX
    } else {
        count.unsigned_abs()
    };
    let mut hits: Vec<u64> = Vec::new();
    s.list_visit(key, 0, len, count < 0, &mut |i, v| {
        if v == argv[3] {
            hits.push(i);
        }
        (hits.len() as u64) < limit
    })?;
    if hits.is_empty() {
        r.int(0);
        return Ok(());
    }
    hits.sort_unstable();
    let (lo, hi) = (hits[0], hits[hits.len() - 1] + 1);
    let removed = hits.len() as u64;
    if removed == len {
        s.list_replace_end(key, true, len, &[])?;
    } else {
        let kept = elements(s, key, lo, hi)?;
        let kept: Vec<&[u8]> = kept
            .iter()
            .enumerate()
            .filter(|(j, _)| hits.binary_search(&(lo + *j as u64)).is_err())
            .map(|(_, v)| &v[..])
            .collect();
        splice(s, key, len, (lo, hi), &kept)?;
    }
    r.int(removed as i64);
    Ok(())
}

/// `LTRIM key start stop`.
pub(crate) fn ltrim(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let (Some(start), Some(stop)) = (int_arg(argv[2]), int_arg(argv[3])) else {
        r.error(NOT_INTEGER);
        return Ok(());
    };
    let len = s.coll_len(LIST, argv[1])?;
    let (from, to) = range(start, stop, len);
    if from >= to {
        s.list_replace_end(argv[1], true, len, &[])?;
    } else {
        s.list_replace_end(argv[1], true, from, &[])?;
        s.list_replace_end(argv[1], false, len - to, &[])?;
    }
    r.ok();
    Ok(())
}

/// Moves one element from `src`'s side `from_left` to `dst`'s side `to_left`: the element,
/// `None` when `src` is empty. `dst` is type-checked before anything moves.
fn move_one(
    s: &mut dyn Engine,
    src: &[u8],
    dst: &[u8],
    from_left: bool,
    to_left: bool,
) -> StoreResult<Option<Vec<u8>>> {
    if s.coll_len(LIST, src)? == 0 {
        return Ok(None);
    }
    s.coll_len(LIST, dst)?;
    let mut v = Vec::new();
    s.list_pop_with(src, from_left, &mut |e| v.extend_from_slice(e))?;
    s.list_push(dst, &[&v], to_left, true)?;
    Ok(Some(v))
}

/// `LMOVE source destination LEFT|RIGHT LEFT|RIGHT`, `RPOPLPUSH source destination`.
pub(crate) fn lmove(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let (from, to) = if argv.len() == 3 {
        (false, true)
    } else {
        match (side(argv[3]), side(argv[4])) {
            (Some(f), Some(t)) => (f, t),
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
    };
    match move_one(s, argv[1], argv[2], from, to)? {
        Some(v) => r.bulk(&v),
        None => r.null(),
    }
    Ok(())
}

/// `BLMOVE source destination LEFT|RIGHT LEFT|RIGHT timeout`, `BRPOPLPUSH source destination
/// timeout`.
pub(crate) fn blmove(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    block: &mut Block,
) -> StoreResult<()> {
    let (from, to) = if argv.len() == 4 {
        (false, true)
    } else {
        match (side(argv[3]), side(argv[4])) {
            (Some(f), Some(t)) => (f, t),
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
    };
    let Some(timeout) = or_reply(r, timeout_arg(argv[argv.len() - 1])) else {
        return Ok(());
    };
    match move_one(s, argv[1], argv[2], from, to)? {
        Some(v) => r.bulk(&v),
        // Inside EXEC, Redis answers an empty source with a null (`$-1`).
        None if block.deny => r.null(),
        None => {
            // A timed-out wait answers a null array, as every blocking pop's does in Redis.
            if block.wait_or_time_out(LIST, &argv[1..2], timeout) {
                r.null_array();
            }
        }
    }
    Ok(())
}

/// `LPOS key element [RANK rank] [COUNT num-matches] [MAXLEN len]`.
pub(crate) fn lpos(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0u64);
    let mut j = 3;
    while j < argv.len() {
        let more = j + 1 < argv.len();
        let opt = argv[j];
        if opt.eq_ignore_ascii_case(b"rank") && more {
            j += 1;
            match int_arg(argv[j]) {
                None => {
                    r.error(NOT_INTEGER);
                    return Ok(());
                }
                Some(0) => {
                    r.error(
                        "ERR RANK can't be zero: use 1 to start from the first match, 2 from the \
                         second ... or use negative to start from the end of the list",
                    );
                    return Ok(());
                }
                Some(i64::MIN) => {
                    r.error("ERR value is out of range");
                    return Ok(());
                }
                Some(n) => rank = n,
            }
        } else if opt.eq_ignore_ascii_case(b"count") && more {
            j += 1;
            match positive(argv[j], "COUNT can't be negative") {
                Ok(n) => count = Some(n as u64),
                Err(e) => {
                    r.error(&e);
                    return Ok(());
                }
            }
        } else if opt.eq_ignore_ascii_case(b"maxlen") && more {
            j += 1;
            match positive(argv[j], "MAXLEN can't be negative") {
                Ok(n) => maxlen = n as u64,
                Err(e) => {
                    r.error(&e);
                    return Ok(());
                }
            }
        } else {
            r.error("ERR syntax error");
            return Ok(());
        }
        j += 1;
    }
    let rev = rank < 0;
    let skip = rank.unsigned_abs() - 1;
    let len = s.coll_len(LIST, argv[1])?;
    // The matches' indexes go to `body` as the reply's integers.
    body.clear();
    let (mut matches, mut found, mut seen) = (0u64, 0u64, 0u64);
    s.list_visit(argv[1], 0, len, rev, &mut |i, v| {
        if maxlen != 0 && seen >= maxlen {
            return false;
        }
        seen += 1;
        if v == argv[2] {
            matches += 1;
            if matches > skip {
                Reply::new(body).int(i as i64);
                found += 1;
                return match count {
                    None => false,
                    Some(0) => true,
                    Some(c) => found < c,
                };
            }
        }
        true
    })?;
    match count {
        None if found == 0 => r.null(),
        None => {}
        Some(_) => r.array(found as usize),
    }
    r.out_mut().extend_from_slice(body);
    Ok(())
}

/// The arguments of `LMPOP`/`ZMPOP` and their blocking forms after the timeout: the keys,
/// the side (LEFT or MIN: true) and the count; the error text otherwise.
fn mpop_args<'a>(
    argv: &[&'a [u8]],
    numkeys_at: usize,
    sides: (&[u8], &[u8]),
) -> Result<(Vec<&'a [u8]>, bool, u64), &'static str> {
    let numkeys = match int_arg(argv[numkeys_at]) {
        Some(n) if n >= 1 => n as u64,
        Some(_) => return Err("ERR numkeys should be greater than 0"),
        None => return Err("ERR numkeys should be greater than 0"),
    };
    let side_at = (numkeys_at as u64)
        .saturating_add(numkeys)
        .saturating_add(1);
    if side_at >= argv.len() as u64 {
        return Err("ERR syntax error");
    }
    let side_at = side_at as usize;
    let first = if argv[side_at].eq_ignore_ascii_case(sides.0) {
        true
    } else if argv[side_at].eq_ignore_ascii_case(sides.1) {
        false
    } else {
        return Err("ERR syntax error");
    };
    let mut count = None;
    let mut j = side_at + 1;
    while j < argv.len() {
        if count.is_none() && argv[j].eq_ignore_ascii_case(b"count") && j + 1 < argv.len() {
            j += 1;
            match int_arg(argv[j]) {
                Some(n) if n >= 1 => count = Some(n as u64),
                Some(_) => return Err("ERR count should be greater than 0"),
                None => return Err("ERR count should be greater than 0"),
            }
        } else {
            return Err("ERR syntax error");
        }
        j += 1;
    }
    Ok((
        argv[numkeys_at + 1..side_at].to_vec(),
        first,
        count.unwrap_or(1),
    ))
}

/// Pops up to `count` elements of the first non-empty list of `keys` as `[key, [elements]]`:
/// false when every list is empty (WRONGTYPE for a key of another type, as Redis checks each
/// key in turn).
fn mpop_lists(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    keys: &[&[u8]],
    left: bool,
    count: u64,
    body: &mut Vec<u8>,
) -> StoreResult<bool> {
    for k in keys {
        let len = s.coll_len(LIST, k)?;
        if len == 0 {
            continue;
        }
        let n = count.min(len);
        r.array(2);
        r.bulk(k);
        let (from, to) = if left { (0, n) } else { (len - n, len) };
        let n = range_reply(s, r, k, from, to, !left, body)?;
        s.list_replace_end(k, left, n, &[])?;
        return Ok(true);
    }
    Ok(false)
}

/// What an MPOP pops: list elements, or sorted-set members (with their scores' protocol).
#[derive(Clone, Copy)]
pub(crate) enum PopKind {
    List,
    ZSet { resp3: bool },
}

/// `LMPOP numkeys key [key ...] LEFT|RIGHT [COUNT count]`, `ZMPOP ... MIN|MAX ...`, and with
/// `block` their blocking forms `BLMPOP`/`BZMPOP timeout numkeys ...` (the timeout is read
/// after the rest, as Redis reads it).
pub(crate) fn mpop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    kind: PopKind,
    block: Option<&mut Block>,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    let (ty, sides): (CollType, (&[u8], &[u8])) = match kind {
        PopKind::List => (LIST, (b"left", b"right")),
        PopKind::ZSet { .. } => (CollType::ZSet, (b"min", b"max")),
    };
    let numkeys_at = if block.is_some() { 2 } else { 1 };
    let Some((keys, first, count)) = or_reply(r, mpop_args(argv, numkeys_at, sides)) else {
        return Ok(());
    };
    let mut timeout = Duration::ZERO;
    if block.is_some() {
        let Some(t) = or_reply(r, timeout_arg(argv[1])) else {
            return Ok(());
        };
        timeout = t;
    }
    let popped = match kind {
        PopKind::List => mpop_lists(s, r, &keys, first, count, body)?,
        PopKind::ZSet { resp3 } => mpop_zsets(s, r, &keys, first, count, resp3)?,
    };
    if !popped && block.is_none_or(|b| b.wait_or_time_out(ty, &keys, timeout)) {
        r.null_array();
    }
    Ok(())
}

/// `BLPOP`, `BRPOP key [key ...] timeout`: `[key, element]` of the first non-empty list.
pub(crate) fn bpop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    left: bool,
    block: &mut Block,
) -> StoreResult<()> {
    let Some(timeout) = or_reply(r, timeout_arg(argv[argv.len() - 1])) else {
        return Ok(());
    };
    let keys = &argv[1..argv.len() - 1];
    for k in keys {
        if s.coll_len(LIST, k)? > 0 {
            r.array(2);
            r.bulk(k);
            s.list_pop_with(k, left, &mut |v| r.bulk(v))?;
            return Ok(());
        }
    }
    if block.wait_or_time_out(LIST, keys, timeout) {
        r.null_array();
    }
    Ok(())
}

/// Pops up to `count` members of the first non-empty sorted set of `keys` as
/// `[key, [[member, score], ...]]`: false when every one is empty.
fn mpop_zsets(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    keys: &[&[u8]],
    min: bool,
    count: u64,
    resp3: bool,
) -> StoreResult<bool> {
    for k in keys {
        if s.coll_len(CollType::ZSet, k)? == 0 {
            continue;
        }
        let popped = zsets::pop_members(s, k, !min, count as usize)?;
        r.array(2);
        r.bulk(k);
        r.array(popped.len());
        for (m, score) in &popped {
            r.array(2);
            r.bulk(m);
            zsets::reply_score(r, resp3, *score);
        }
        return Ok(true);
    }
    Ok(false)
}

/// `BZPOPMIN`, `BZPOPMAX key [key ...] timeout`: `[key, member, score]`.
pub(crate) fn bzpop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max: bool,
    resp3: bool,
    block: &mut Block,
) -> StoreResult<()> {
    let Some(timeout) = or_reply(r, timeout_arg(argv[argv.len() - 1])) else {
        return Ok(());
    };
    let keys = &argv[1..argv.len() - 1];
    for k in keys {
        if s.coll_len(CollType::ZSet, k)? > 0 {
            let popped = zsets::pop_members(s, k, max, 1)?;
            if let Some((m, score)) = popped.first() {
                r.array(3);
                r.bulk(k);
                r.bulk(m);
                zsets::reply_score(r, resp3, *score);
                return Ok(());
            }
        }
    }
    if block.wait_or_time_out(CollType::ZSet, keys, timeout) {
        r.null_array();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_indexes_follow_redis() {
        assert_eq!(range(0, -1, 5), (0, 5));
        assert_eq!(range(-100, 100, 5), (0, 5));
        assert_eq!(range(3, 1, 5), (0, 0));
        assert_eq!(range(5, 10, 5), (0, 0));
        assert_eq!(range(-2, -1, 5), (3, 5));
        assert_eq!(range(0, 0, 0), (0, 0));
        assert_eq!(index(-1, 3), Some(2));
        assert_eq!(index(3, 3), None);
        assert_eq!(index(-4, 3), None);
    }

    #[test]
    fn timeouts_parse_as_redis_parses_them() {
        assert_eq!(timeout_arg(b"0"), Ok(Duration::ZERO));
        assert_eq!(timeout_arg(b"0.1"), Ok(Duration::from_millis(100)));
        assert_eq!(timeout_arg(b"1e1"), Ok(Duration::from_secs(10)));
        assert_eq!(timeout_arg(b"-1"), Err("ERR timeout is negative"));
        assert_eq!(
            timeout_arg(b"0x7FFFFFFFFFFFFF"),
            Err("ERR timeout is negative")
        );
        assert_eq!(
            timeout_arg(b"9223371000000000"),
            Err("ERR timeout is out of range")
        );
        assert_eq!(
            timeout_arg(b"abc"),
            Err("ERR timeout is not a float or out of range")
        );
        assert_eq!(
            timeout_arg(b"inf"),
            Err("ERR timeout is not a float or out of range")
        );
    }
}
