//! The sorted set commands, as Redis 7.0's `t_zset.c` answers them, over the sorted set
//! records of the log and their order in memory (`docs/kv-service.md` §7).

use std::cmp::Ordering;

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::CollType;
use crate::engine::Engine;
use crate::store::StoreResult;
use crate::zindex::order;

/// A score as Redis 7.0's `addReplyDouble` writes it (`%.17g`, `inf` and `-inf`), written
/// into a buffer of its own: no allocation.
pub(crate) struct ScoreText {
    buf: [u8; 48],
    len: usize,
}

impl ScoreText {
    pub(crate) fn new(d: f64) -> ScoreText {
        use std::io::Write;
        let mut t = ScoreText {
            buf: [0; 48],
            len: 0,
        };
        let put = |t: &mut ScoreText, args: std::fmt::Arguments<'_>| {
            let mut w = &mut t.buf[t.len..];
            let room = w.len();
            w.write_fmt(args).expect("a score fits 48 bytes");
            t.len += room - w.len();
        };
        if d.is_infinite() {
            put(
                &mut t,
                format_args!("{}", if d > 0.0 { "inf" } else { "-inf" }),
            );
            return t;
        }
        if d == 0.0 {
            put(
                &mut t,
                format_args!("{}", if d.is_sign_negative() { "-0" } else { "0" }),
            );
            return t;
        }
        // The exponent of the e-style form rounded to 17 significant digits decides, as C's
        // %g: e-style below 1e-4 and from 1e17, else fixed with 17 significant digits; the
        // trailing zeros of the fraction (and a bare point) go.
        put(&mut t, format_args!("{d:.16e}"));
        let e = t.buf[..t.len]
            .iter()
            .position(|&c| c == b'e')
            .expect("e-style");
        let x: i32 = std::str::from_utf8(&t.buf[e + 1..t.len])
            .ok()
            .and_then(|x| x.parse().ok())
            .expect("an exponent");
        if !(-4..17).contains(&x) {
            t.len = e;
            t.trim();
            let sign = if x < 0 { '-' } else { '+' };
            put(&mut t, format_args!("e{sign}{:02}", x.abs()));
        } else {
            t.len = 0;
            put(&mut t, format_args!("{d:.*}", (16 - x) as usize));
            t.trim();
        }
        t
    }

    /// Drops the trailing zeros of a fraction, and its point when nothing is left after it.
    fn trim(&mut self) {
        if !self.buf[..self.len].contains(&b'.') {
            return;
        }
        while self.buf[self.len - 1] == b'0' {
            self.len -= 1;
        }
        if self.buf[self.len - 1] == b'.' {
            self.len -= 1;
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// `score` as a reply: a bulk string in RESP2, a double in RESP3.
pub(crate) fn reply_score(r: &mut Reply<'_>, resp3: bool, score: f64) {
    let t = ScoreText::new(score);
    if resp3 {
        r.out_mut().push(b',');
        r.out_mut().extend_from_slice(t.as_bytes());
        r.out_mut().extend_from_slice(b"\r\n");
    } else {
        r.bulk(t.as_bytes());
    }
}

/// A score argument as Redis's `strtod` reads it (`inf`, `+inf`, `-inf` too); `None` for NaN
/// or not a number.
pub(crate) fn parse_score(a: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(a).ok()?;
    if t.is_empty() || t.starts_with(char::is_whitespace) || t.ends_with(char::is_whitespace) {
        return None;
    }
    let is = |names: &[&str]| names.iter().any(|n| t.eq_ignore_ascii_case(n));
    let v: f64 = if is(&["inf", "+inf", "infinity", "+infinity"]) {
        f64::INFINITY
    } else if is(&["-inf", "-infinity"]) {
        f64::NEG_INFINITY
    } else if t
        .bytes()
        .any(|c| c.is_ascii_alphabetic() && !matches!(c, b'e' | b'E'))
    {
        // Rust would read "NaN" and "infinity" spelled otherwise; strtod's other words are
        // not numbers either.
        return None;
    } else {
        t.parse().ok()?
    };
    (!v.is_nan()).then_some(v)
}

/// A bound of a score range: the value and whether it is excluded (`(1.5`).
#[derive(Clone, Copy)]
struct ScoreBound {
    v: f64,
    open: bool,
}

fn score_bound(a: &[u8]) -> Option<ScoreBound> {
    match a.strip_prefix(b"(") {
        Some(rest) => Some(ScoreBound {
            v: parse_score(rest)?,
            open: true,
        }),
        None => Some(ScoreBound {
            v: parse_score(a)?,
            open: false,
        }),
    }
}

/// A bound of a lex range: `-`, `+`, `[member` or `(member`.
#[derive(Clone, Copy)]
enum LexBound<'a> {
    Min,
    Max,
    Incl(&'a [u8]),
    Excl(&'a [u8]),
}

fn lex_bound(a: &[u8]) -> Option<LexBound<'_>> {
    match a.first()? {
        b'-' if a.len() == 1 => Some(LexBound::Min),
        b'+' if a.len() == 1 => Some(LexBound::Max),
        b'[' => Some(LexBound::Incl(&a[1..])),
        b'(' => Some(LexBound::Excl(&a[1..])),
        _ => None,
    }
}

/// A range of `ZRANGE` and its family, as ranks `[from, to)` of the ascending order.
enum Range<'a> {
    Rank(i64, i64),
    Score(ScoreBound, ScoreBound),
    Lex(LexBound<'a>, LexBound<'a>),
}

/// The ranks `[from, to)` of the members in `range` (bounds in ascending order).
fn ranks(s: &mut dyn Engine, key: &[u8], range: &Range<'_>) -> StoreResult<(usize, usize)> {
    let len = s.coll_len(CollType::ZSet, key)? as i64;
    Ok(match *range {
        Range::Rank(mut a, mut b) => {
            if a < 0 {
                a += len;
            }
            if b < 0 {
                b += len;
            }
            let a = a.max(0);
            if a > b || a >= len {
                (0, 0)
            } else {
                (a as usize, (b.min(len - 1) + 1) as usize)
            }
        }
        Range::Score(min, max) => {
            let from = s.zcount_before(key, &|k| {
                if min.open {
                    k.0 <= min.v
                } else {
                    k.0 < min.v
                }
            })?;
            let to = s.zcount_before(key, &|k| {
                if max.open {
                    k.0 < max.v
                } else {
                    k.0 <= max.v
                }
            })?;
            (from, to.max(from))
        }
        Range::Lex(min, max) => {
            let below = |b: LexBound<'_>, m: &[u8], upper: bool| match b {
                LexBound::Min => false,
                LexBound::Max => true,
                LexBound::Incl(x) => {
                    if upper {
                        m <= x
                    } else {
                        m < x
                    }
                }
                LexBound::Excl(x) => {
                    if upper {
                        m < x
                    } else {
                        m <= x
                    }
                }
            };
            let from = s.zcount_before(key, &|k| below(min, k.1, false))?;
            let to = s.zcount_before(key, &|k| below(max, k.1, true))?;
            (from, to.max(from))
        }
    })
}

/// The flags of ZADD.
#[derive(Default)]
struct ZaddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member [score member ...]`, and `ZINCRBY key
/// increment member` (`incrby`).
/// ZADD's options, which come before its score-member pairs.
const ZADD_OPTIONS: &[&str] = &["nx", "xx", "gt", "lt", "ch", "incr"];

/// How many of ZADD's arguments after the key (`args`) are options, as ZADD reads them:
/// its members are every second argument after them.
pub(crate) fn zadd_options<'a>(args: impl Iterator<Item = &'a [u8]>) -> usize {
    args.take_while(|w| !crate::commands::option(w, ZADD_OPTIONS).is_empty())
        .count()
}

pub(crate) fn zadd(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    resp3: bool,
    incrby: bool,
) -> StoreResult<()> {
    let mut f = ZaddFlags::default();
    let mut j = 2;
    if incrby {
        f.incr = true;
    } else {
        while j < argv.len() {
            match crate::commands::option(argv[j], ZADD_OPTIONS) {
                "nx" => f.nx = true,
                "xx" => f.xx = true,
                "gt" => f.gt = true,
                "lt" => f.lt = true,
                "ch" => f.ch = true,
                "incr" => f.incr = true,
                _ => break,
            }
            j += 1;
        }
    }
    let pairs = &argv[j..];
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        r.error("ERR syntax error");
        return Ok(());
    }
    if f.nx && f.xx {
        r.error("ERR XX and NX options at the same time are not compatible");
        return Ok(());
    }
    if (f.nx && (f.gt || f.lt)) || (f.gt && f.lt) {
        r.error("ERR GT, LT, and/or NX options at the same time are not compatible");
        return Ok(());
    }
    if f.incr && pairs.len() > 2 {
        r.error("ERR INCR option supports a single increment-element pair");
        return Ok(());
    }
    // Every score is checked before anything is written (and read again below: no list).
    if pairs.chunks(2).any(|p| parse_score(p[0]).is_none()) {
        r.error("ERR value is not a valid float");
        return Ok(());
    }
    let exists = s.coll_len(CollType::ZSet, argv[1])? > 0;
    if !exists && f.xx {
        if f.incr {
            r.null();
        } else {
            r.int(0);
        }
        return Ok(());
    }
    let (mut added, mut updated) = (0, 0);
    let mut result = None;
    for p in pairs.chunks(2) {
        let (score, member) = (parse_score(p[0]).expect("checked above"), p[1]);
        match s.zscore(argv[1], member)? {
            Some(cur) => {
                if f.nx {
                    continue;
                }
                let new = if f.incr { cur + score } else { score };
                if new.is_nan() {
                    r.error("ERR resulting score is not a number (NaN)");
                    return Ok(());
                }
                if (f.gt && new <= cur) || (f.lt && new >= cur) {
                    continue;
                }
                result = Some(new);
                if new != cur {
                    s.zadd(argv[1], member, new)?;
                    updated += 1;
                }
            }
            None => {
                if f.xx {
                    continue;
                }
                s.zadd(argv[1], member, score)?;
                added += 1;
                result = Some(score);
            }
        }
    }
    if f.incr {
        match result {
            Some(v) => reply_score(r, resp3, v),
            None => r.null(),
        }
    } else {
        r.int(if f.ch { added + updated } else { added });
    }
    Ok(())
}

/// `ZSCORE key member`, `ZMSCORE key member [member ...]`.
pub(crate) fn zscore(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    resp3: bool,
    many: bool,
) -> StoreResult<()> {
    if many {
        s.coll_len(CollType::ZSet, argv[1])?;
        r.array(argv.len() - 2);
    }
    for m in &argv[2..] {
        match s.zscore(argv[1], m)? {
            Some(v) => reply_score(r, resp3, v),
            None => r.null(),
        }
    }
    Ok(())
}

/// `ZREM key member [member ...]`.
pub(crate) fn zrem(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for m in &argv[2..] {
        n += i64::from(s.zrem(argv[1], m)?);
    }
    r.int(n);
    Ok(())
}

/// `ZCARD key`.
pub(crate) fn zcard(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.int(s.coll_len(CollType::ZSet, key)? as i64);
    Ok(())
}

/// `ZRANK key member`, `ZREVRANK key member`.
pub(crate) fn zrank(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    rev: bool,
) -> StoreResult<()> {
    let Some(score) = s.zscore(argv[1], argv[2])? else {
        r.null();
        return Ok(());
    };
    let m = argv[2];
    let rank = s.zcount_before(argv[1], &|k| order(k, (score, m)) == Ordering::Less)?;
    let len = s.coll_len(CollType::ZSet, argv[1])? as usize;
    r.int(if rev {
        len.saturating_sub(rank + 1)
    } else {
        rank
    } as i64);
    Ok(())
}

/// `ZCOUNT key min max`, `ZLEXCOUNT key min max`.
pub(crate) fn zcount(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    lex: bool,
) -> StoreResult<()> {
    let range = match parse_range(argv[2], argv[3], lex, false) {
        Ok(range) => range,
        Err(e) => {
            r.error(e);
            return Ok(());
        }
    };
    s.coll_len(CollType::ZSet, argv[1])?;
    let (from, to) = ranks(s, argv[1], &range)?;
    r.int((to - from) as i64);
    Ok(())
}

/// The range of `min` and `max` (`rev`: given as max then min) by score or by lex.
fn parse_range<'a>(
    a: &'a [u8],
    b: &'a [u8],
    lex: bool,
    rev: bool,
) -> Result<Range<'a>, &'static str> {
    let (min, max) = if rev { (b, a) } else { (a, b) };
    if lex {
        match (lex_bound(min), lex_bound(max)) {
            (Some(x), Some(y)) => Ok(Range::Lex(x, y)),
            _ => Err("ERR min or max not valid string range item"),
        }
    } else {
        match (score_bound(min), score_bound(max)) {
            (Some(x), Some(y)) => Ok(Range::Score(x, y)),
            _ => Err("ERR min or max is not a float"),
        }
    }
}

/// How the ZRANGE family was called.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeCmd {
    /// `ZRANGE key start stop [BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]`.
    Zrange,
    /// `ZREVRANGE key start stop [WITHSCORES]`.
    ZrevRange,
    /// `ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]`.
    ByScore,
    /// `ZREVRANGEBYSCORE key max min ...`.
    RevByScore,
    /// `ZRANGEBYLEX key min max [LIMIT offset count]`.
    ByLex,
    /// `ZREVRANGEBYLEX key max min ...`.
    RevByLex,
}

/// The ZRANGE family, as Redis's `zrangeGenericCommand` reads and answers it; with `store`,
/// `ZRANGESTORE destination key min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]` (the
/// range is written as a new sorted set, its size answered).
pub(crate) fn zrange(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    cmd: RangeCmd,
    resp3: bool,
    store: bool,
) -> StoreResult<()> {
    // ZRANGESTORE's arguments are ZRANGE's one place further.
    let (dst, argv) = if store {
        (Some(argv[1]), &argv[1..])
    } else {
        (None, argv)
    };
    // As Redis's `zrangeGenericCommand`: REV and BYSCORE/BYLEX only where the command
    // leaves them open, each once; a LIMIT with a count of -1 (its default) is no LIMIT.
    let (mut by_score, mut by_lex, mut rev) = match cmd {
        RangeCmd::Zrange => (false, false, false),
        RangeCmd::ZrevRange => (false, false, true),
        RangeCmd::ByScore => (true, false, false),
        RangeCmd::RevByScore => (true, false, true),
        RangeCmd::ByLex => (false, true, false),
        RangeCmd::RevByLex => (false, true, true),
    };
    let (mut rev_open, mut by_open) = (cmd == RangeCmd::Zrange, cmd == RangeCmd::Zrange);
    let (mut with_scores, mut limit) = (false, None);
    let mut j = 4;
    while j < argv.len() {
        let left = argv.len() - j - 1;
        let o =
            crate::commands::option(argv[j], &["withscores", "limit", "byscore", "bylex", "rev"]);
        match o {
            "withscores" if !store => with_scores = true,
            "limit" if left >= 2 => {
                let (Some(off), Some(cnt)) = (int_arg(argv[j + 1]), int_arg(argv[j + 2])) else {
                    r.error("ERR value is not an integer or out of range");
                    return Ok(());
                };
                limit = Some((off, cnt));
                j += 2;
            }
            "byscore" if by_open => (by_score, by_open) = (true, false),
            "bylex" if by_open => (by_lex, by_open) = (true, false),
            "rev" if rev_open => (rev, rev_open) = (true, false),
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
        j += 1;
    }
    let limit_given = limit.is_some_and(|(_, cnt)| cnt != -1);
    if limit_given && !by_score && !by_lex {
        r.error(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        );
        return Ok(());
    }
    if with_scores && by_lex {
        r.error("ERR syntax error, WITHSCORES not supported in combination with BYLEX");
        return Ok(());
    }
    let range = if by_score || by_lex {
        match parse_range(argv[2], argv[3], by_lex, rev) {
            Ok(x) => x,
            Err(e) => {
                r.error(e);
                return Ok(());
            }
        }
    } else {
        match (int_arg(argv[2]), int_arg(argv[3])) {
            (Some(a), Some(b)) if rev => Range::Rank(-1 - b, -1 - a),
            (Some(a), Some(b)) => Range::Rank(a, b),
            _ => {
                r.error("ERR value is not an integer or out of range");
                return Ok(());
            }
        }
    };
    s.coll_len(CollType::ZSet, argv[1])?;
    let (mut from, mut to) = ranks(s, argv[1], &range)?;
    // A rank range ignores LIMIT (only `LIMIT o -1` gets this far).
    if let Some((off, cnt)) = limit.filter(|_| by_score || by_lex) {
        // The offset and count apply in the reply's direction.
        if off < 0 {
            (from, to) = (0, 0);
        } else {
            let n = to - from;
            let off = (off as u64).min(n as u64) as usize;
            let take = if cnt < 0 {
                n - off
            } else {
                (cnt as u64).min((n - off) as u64) as usize
            };
            if rev {
                to -= off;
                from = to - take;
            } else {
                from += off;
                to = from + take;
            }
        }
    }
    let n = to - from;
    if let Some(dst) = dst {
        let mut members = Vec::with_capacity(n);
        s.zrange(argv[1], from, to, rev, &mut |m, score| {
            members.push((m.to_vec(), score))
        })?;
        crate::zsetops::store_zset(s, dst, &members)?;
        r.int(members.len() as i64);
        return Ok(());
    }
    if with_scores && !resp3 {
        r.array(2 * n);
    } else {
        r.array(n);
    }
    s.zrange(argv[1], from, to, rev, &mut |m, score| {
        if with_scores {
            if resp3 {
                r.array(2);
            }
            r.bulk(m);
            reply_score(r, resp3, score);
        } else {
            r.bulk(m);
        }
    })
}

/// Removes up to `count` members with the lowest scores (the highest with `max`): the
/// members and their scores, in the order popped.
pub(crate) fn pop_members(
    s: &mut dyn Engine,
    key: &[u8],
    max: bool,
    count: usize,
) -> StoreResult<Vec<(Vec<u8>, f64)>> {
    let len = s.coll_len(CollType::ZSet, key)? as usize;
    let take = count.min(len);
    let mut popped: Vec<(Vec<u8>, f64)> = Vec::with_capacity(take);
    let (from, to) = if max { (len - take, len) } else { (0, take) };
    s.zrange(key, from, to, max, &mut |m, score| {
        popped.push((m.to_vec(), score))
    })?;
    // The scores are the order's: no record is read to remove them.
    for (m, score) in &popped {
        s.zrem_scored(key, m, *score)?;
    }
    Ok(popped)
}

/// `ZPOPMIN key [count]`, `ZPOPMAX key [count]`.
pub(crate) fn zpop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    max: bool,
    resp3: bool,
) -> StoreResult<()> {
    if argv.len() > 3 {
        r.error("ERR syntax error");
        return Ok(());
    }
    let count = match argv.get(2).map(|a| int_arg(a)) {
        None => 1,
        Some(Some(n)) if n >= 0 => n as usize,
        Some(_) => {
            r.error("ERR value is out of range, must be positive");
            return Ok(());
        }
    };
    let popped = pop_members(s, argv[1], max, count)?;
    let nested = resp3 && argv.len() == 3;
    r.array(if nested {
        popped.len()
    } else {
        2 * popped.len()
    });
    for (m, score) in &popped {
        if nested {
            r.array(2);
        }
        r.bulk(m);
        reply_score(r, resp3, *score);
    }
    Ok(())
}

/// `ZREMRANGEBYRANK key start stop`, `ZREMRANGEBYSCORE key min max`, `ZREMRANGEBYLEX key min
/// max`: the members removed.
pub(crate) fn zremrange(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    by: &str,
) -> StoreResult<()> {
    let range = match by {
        "rank" => match (int_arg(argv[2]), int_arg(argv[3])) {
            (Some(a), Some(b)) => Range::Rank(a, b),
            _ => {
                r.error("ERR value is not an integer or out of range");
                return Ok(());
            }
        },
        _ => match parse_range(argv[2], argv[3], by == "lex", false) {
            Ok(x) => x,
            Err(e) => {
                r.error(e);
                return Ok(());
            }
        },
    };
    s.coll_len(CollType::ZSet, argv[1])?;
    let (from, to) = ranks(s, argv[1], &range)?;
    let mut gone = Vec::with_capacity(to - from);
    s.zrange(argv[1], from, to, false, &mut |m, _| gone.push(m.to_vec()))?;
    for m in &gone {
        s.zrem(argv[1], m)?;
    }
    r.int(gone.len() as i64);
    Ok(())
}

/// A ZSCAN step's score, as its reply writes it.
pub(crate) fn scan_score(v: &[u8]) -> ScoreText {
    ScoreText::new(crate::collection::decode_score(v).unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_print_as_percent_17g() {
        for (d, t) in [
            (1.5, "1.5"),
            (3.0, "3"),
            (-2.0, "-2"),
            (0.1, "0.10000000000000001"),
            (1e17, "1e+17"),
            (1e16, "10000000000000000"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (0.0, "0"),
            (-0.0, "-0"),
            (2.5e-300, "2.5e-300"),
            (1.0 / 3.0, "0.33333333333333331"),
        ] {
            assert_eq!(ScoreText::new(d).as_bytes(), t.as_bytes(), "{d}");
        }
        assert_eq!(parse_score(b"+inf"), Some(f64::INFINITY));
        assert_eq!(parse_score(b"-INF"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_score(b"nan"), None);
        assert_eq!(parse_score(b" 1"), None);
        assert_eq!(parse_score(b"1e3"), Some(1000.0));
        assert_eq!(parse_score(b"x"), None);
    }
}
