//! The sorted-set algebra and picks of Redis 7.0's `t_zset.c`: ZUNION, ZINTER, ZDIFF and
//! their STORE forms, ZINTERCARD (`zunionInterDiffGenericCommand`), and ZRANDMEMBER. The
//! inputs are sorted sets or sets (a set's members score 1); results are computed in memory,
//! from the members' orders (`dds_kv::zindex`) and the sets' element records, then answered
//! in (score, member) order or written as a new sorted set.

use std::collections::HashMap;

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::{decode_score, CollType};
use crate::engine::Engine;
use crate::hashes::random_elements;
use crate::store::{StoreError, StoreResult};
use crate::zsets::{parse_score, reply_score};

/// The operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Op {
    Union,
    Inter,
    Diff,
}

/// How scores of one member in several inputs combine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Aggregate {
    Sum,
    Min,
    Max,
}

impl Aggregate {
    /// Redis's `zunionInterAggregate`: a sum of +inf and -inf is 0.
    fn apply(self, target: &mut f64, v: f64) {
        match self {
            Aggregate::Sum => {
                *target += v;
                if target.is_nan() {
                    *target = 0.0;
                }
            }
            Aggregate::Min => *target = if v < *target { v } else { *target },
            Aggregate::Max => *target = if v > *target { v } else { *target },
        }
    }
}

/// One input: its members with their scores (empty for a missing key) and its weight.
struct Input {
    members: HashMap<Vec<u8>, f64>,
    /// The members in the order a walk of the input meets them.
    order: Vec<Vec<u8>>,
    weight: f64,
}

/// The members and scores of the sorted set or set at `key`; WRONGTYPE for another type.
fn read_input(s: &mut dyn Engine, key: &[u8]) -> StoreResult<Input> {
    let mut input = Input {
        members: HashMap::new(),
        order: Vec::new(),
        weight: 1.0,
    };
    match s.key_type(key)? {
        None => {}
        Some("zset") => {
            let n = s.coll_len(CollType::ZSet, key)? as usize;
            s.zrange(key, 0, n, false, &mut |m, score| {
                input.order.push(m.to_vec());
                input.members.insert(m.to_vec(), score);
            })?;
        }
        Some("set") => {
            s.coll_scan(CollType::Set, key, 0, usize::MAX, &mut |m, _| {
                input.order.push(m.to_vec());
                input.members.insert(m.to_vec(), 1.0);
            })?;
        }
        Some(_) => return Err(StoreError::WrongType),
    }
    Ok(input)
}

/// The parsed arguments of one call.
struct Call {
    inputs: Vec<Input>,
    aggregate: Aggregate,
    with_scores: bool,
    limit: u64,
}

/// Reads the arguments from `numkeys_at` on, as Redis's `zunionInterDiffGenericCommand`:
/// the number of keys, the keys (each read and type-checked in turn), then WEIGHTS and
/// AGGREGATE (not for ZDIFF or ZINTERCARD), WITHSCORES (not for a STORE or ZINTERCARD) and
/// LIMIT (ZINTERCARD). `Ok(Err(text))`: the error reply.
fn parse(
    s: &mut dyn Engine,
    argv: &[&[u8]],
    numkeys_at: usize,
    op: Op,
    store: bool,
    card: bool,
    name: &str,
) -> StoreResult<Result<Call, String>> {
    let Some(n) = int_arg(argv[numkeys_at]) else {
        return Ok(Err("ERR value is not an integer or out of range".into()));
    };
    if n < 1 {
        return Ok(Err(format!(
            "ERR at least 1 input key is needed for '{name}' command"
        )));
    }
    if n as u64 > (argv.len() - numkeys_at - 1) as u64 {
        return Ok(Err("ERR syntax error".into()));
    }
    let n = n as usize;
    let mut inputs = Vec::with_capacity(n);
    for k in &argv[numkeys_at + 1..numkeys_at + 1 + n] {
        inputs.push(read_input(s, k)?);
    }
    let mut call = Call {
        inputs,
        aggregate: Aggregate::Sum,
        with_scores: false,
        limit: 0,
    };
    let mut j = numkeys_at + 1 + n;
    while j < argv.len() {
        let remaining = argv.len() - j;
        let is = |w: &str| argv[j].eq_ignore_ascii_case(w.as_bytes());
        if op != Op::Diff && !card && remaining > n && is("weights") {
            for i in 0..n {
                match parse_score(argv[j + 1 + i]) {
                    Some(w) => call.inputs[i].weight = w,
                    None => return Ok(Err("ERR weight value is not a float".into())),
                }
            }
            j += 1 + n;
        } else if op != Op::Diff && !card && remaining >= 2 && is("aggregate") {
            let a = argv[j + 1];
            call.aggregate = if a.eq_ignore_ascii_case(b"sum") {
                Aggregate::Sum
            } else if a.eq_ignore_ascii_case(b"min") {
                Aggregate::Min
            } else if a.eq_ignore_ascii_case(b"max") {
                Aggregate::Max
            } else {
                return Ok(Err("ERR syntax error".into()));
            };
            j += 2;
        } else if !store && !card && is("withscores") {
            call.with_scores = true;
            j += 1;
        } else if card && remaining >= 2 && is("limit") {
            match int_arg(argv[j + 1]) {
                Some(l) if l >= 0 => call.limit = l as u64,
                _ => return Ok(Err("ERR LIMIT can't be negative".into())),
            }
            j += 2;
        } else {
            return Ok(Err("ERR syntax error".into()));
        }
    }
    Ok(Ok(call))
}

/// The result of `op` over the inputs: members and scores, in (score, member) order; with
/// `card`, only as many as ZINTERCARD counts (up to its limit).
fn compute(mut call: Call, op: Op, card: bool) -> Vec<(Vec<u8>, f64)> {
    let mut out: Vec<(Vec<u8>, f64)> = Vec::new();
    if op != Op::Diff {
        // Smallest first, as Redis (its sums add in that order).
        call.inputs.sort_by_key(|i| i.members.len());
    }
    let agg = call.aggregate;
    let score0 = |w: f64, v: f64| {
        let s = w * v;
        if s.is_nan() {
            0.0
        } else {
            s
        }
    };
    match op {
        Op::Inter => {
            let (first, rest) = call.inputs.split_first().expect("at least one input");
            for m in &first.order {
                let mut score = score0(first.weight, first.members[m]);
                let mut all = true;
                for other in rest {
                    match other.members.get(m) {
                        Some(&v) => agg.apply(&mut score, v * other.weight),
                        None => {
                            all = false;
                            break;
                        }
                    }
                }
                if all {
                    out.push((m.clone(), score));
                    if card && call.limit != 0 && out.len() as u64 >= call.limit {
                        break;
                    }
                }
            }
        }
        Op::Union => {
            let mut acc: HashMap<&[u8], f64> = HashMap::new();
            let mut order: Vec<&[u8]> = Vec::new();
            for input in &call.inputs {
                for m in &input.order {
                    let score = score0(input.weight, input.members[m]);
                    match acc.get_mut(&m[..]) {
                        Some(t) => agg.apply(t, score),
                        None => {
                            acc.insert(m, score);
                            order.push(m);
                        }
                    }
                }
            }
            out.extend(order.into_iter().map(|m| (m.to_vec(), acc[m])));
        }
        Op::Diff => {
            let (first, rest) = call.inputs.split_first().expect("at least one input");
            for m in &first.order {
                if !rest.iter().any(|o| o.members.contains_key(m)) {
                    out.push((m.clone(), first.members[m]));
                }
            }
        }
    }
    out.sort_by(|a, b| crate::zindex::order((a.1, &a.0), (b.1, &b.0)));
    out
}

/// `ZUNION`/`ZINTER`/`ZDIFF numkeys key ... [WEIGHTS ...] [AGGREGATE ...] [WITHSCORES]`,
/// their STORE forms (`destination numkeys key ...`) and `ZINTERCARD numkeys key ...
/// [LIMIT limit]`.
pub(crate) fn zsetop(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    op: Op,
    store: bool,
    card: bool,
    resp3: bool,
) -> StoreResult<()> {
    let name = String::from_utf8_lossy(argv[0]).to_ascii_lowercase();
    let call = match parse(s, argv, if store { 2 } else { 1 }, op, store, card, &name)? {
        Ok(c) => c,
        Err(e) => {
            r.error(&e);
            return Ok(());
        }
    };
    let with_scores = call.with_scores;
    let result = compute(call, op, card);
    if card {
        r.int(result.len() as i64);
    } else if store {
        store_zset(s, argv[1], &result)?;
        r.int(result.len() as i64);
    } else {
        r.array(if with_scores && !resp3 {
            2 * result.len()
        } else {
            result.len()
        });
        for (m, score) in &result {
            if with_scores && resp3 {
                r.array(2);
            }
            r.bulk(m);
            if with_scores {
                reply_score(r, resp3, *score);
            }
        }
    }
    Ok(())
}

/// Replaces `key` with a sorted set of `members` (deleted when there are none).
pub(crate) fn store_zset(
    s: &mut dyn Engine,
    key: &[u8],
    members: &[(Vec<u8>, f64)],
) -> StoreResult<()> {
    s.del(key)?;
    for (m, score) in members {
        s.zadd(key, m, *score)?;
    }
    Ok(())
}

/// `ZRANDMEMBER key [count [WITHSCORES]]`, as Redis's `zrandmemberCommand` reads it.
pub(crate) fn zrandmember(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    resp3: bool,
    body: &mut Vec<u8>,
) -> StoreResult<()> {
    random_elements(s, r, argv, CollType::ZSet, resp3, body, &|b, v| {
        reply_score(b, resp3, decode_score(v).unwrap_or(0.0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(pairs: &[(&str, f64)], weight: f64) -> Input {
        Input {
            members: pairs
                .iter()
                .map(|(m, s)| (m.as_bytes().to_vec(), *s))
                .collect(),
            order: pairs.iter().map(|(m, _)| m.as_bytes().to_vec()).collect(),
            weight,
        }
    }

    fn call(inputs: Vec<Input>, aggregate: Aggregate) -> Call {
        Call {
            inputs,
            aggregate,
            with_scores: true,
            limit: 0,
        }
    }

    fn names(r: &[(Vec<u8>, f64)]) -> Vec<(String, f64)> {
        r.iter()
            .map(|(m, s)| (String::from_utf8(m.clone()).unwrap(), *s))
            .collect()
    }

    #[test]
    fn union_inter_and_diff_follow_redis() {
        let a = || input(&[("a", 1.0), ("b", 2.0), ("c", 3.0)], 1.0);
        let b = || input(&[("b", 1.0), ("c", f64::INFINITY), ("d", 4.0)], 2.0);
        let u = compute(call(vec![a(), b()], Aggregate::Sum), Op::Union, false);
        assert_eq!(
            names(&u),
            [
                ("a".into(), 1.0),
                ("b".into(), 4.0),
                ("d".into(), 8.0),
                ("c".into(), f64::INFINITY)
            ]
        );
        let i = compute(call(vec![a(), b()], Aggregate::Max), Op::Inter, false);
        assert_eq!(names(&i), [("b".into(), 2.0), ("c".into(), f64::INFINITY)]);
        let d = compute(call(vec![a(), b()], Aggregate::Sum), Op::Diff, false);
        assert_eq!(names(&d), [("a".into(), 1.0)]);
        // +inf and -inf sum to 0, as Redis.
        let p = || input(&[("x", f64::INFINITY)], 1.0);
        let n = || input(&[("x", f64::NEG_INFINITY)], 1.0);
        let z = compute(call(vec![p(), n()], Aggregate::Sum), Op::Union, false);
        assert_eq!(names(&z), [("x".into(), 0.0)]);
        // A weight of 0 on an infinite score is 0, not NaN.
        let w = compute(
            call(vec![input(&[("y", f64::INFINITY)], 0.0)], Aggregate::Sum),
            Op::Union,
            false,
        );
        assert_eq!(names(&w), [("y".into(), 0.0)]);
        // ZINTERCARD's limit.
        let mut c = call(vec![a(), a()], Aggregate::Sum);
        c.limit = 2;
        assert_eq!(compute(c, Op::Inter, true).len(), 2);
    }
}
