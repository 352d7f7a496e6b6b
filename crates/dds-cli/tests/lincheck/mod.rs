//! A linearizability checker for histories of Redis string commands (SET, GET, INCRBY, DEL)
//! on single keys: the history is split by key (each command touches one key, so the whole
//! history is linearizable iff every key's is), and each key's is searched with the
//! Wing–Gong–Lowe algorithm (as in Knossos and Porcupine): linearize a pending call whose
//! result the model accepts, backtrack at the first return that cannot be reached, and
//! memoize (linearized set, model state) to cut repeated work. A call whose reply never came
//! may take effect at any point after it was sent, or never.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};

/// A command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Set(Vec<u8>),
    Get,
    Incr(i64),
    Del,
}

/// What the server replied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Ok,
    Value(Option<Vec<u8>>),
    Int(i64),
    /// An error reply (INCR of a non-integer).
    Err,
}

/// One command of one client: sent at `call`, answered at `ret_at` (nanoseconds from a
/// common origin) with `ret`, or never answered (`None`).
#[derive(Clone, Debug)]
pub struct Event {
    pub client: usize,
    pub key: Vec<u8>,
    pub op: Op,
    pub call: u64,
    pub ret: Option<(u64, Ret)>,
}

type State = Option<Vec<u8>>;

/// Applies `op` to `s`; `Some(next)` when `ret` (if known) is what the model answers.
fn step(s: &State, op: &Op, ret: Option<&Ret>) -> Option<State> {
    match op {
        Op::Set(v) => matches!(ret, None | Some(Ret::Ok)).then(|| Some(v.clone())),
        Op::Get => match ret {
            None => Some(s.clone()),
            Some(Ret::Value(v)) if v == s => Some(s.clone()),
            _ => None,
        },
        Op::Del => {
            let n = i64::from(s.is_some());
            match ret {
                None => Some(None),
                Some(Ret::Int(m)) if *m == n => Some(None),
                _ => None,
            }
        }
        Op::Incr(by) => {
            let cur = match s {
                None => Some(0i64),
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok().filter(|n| n.to_string() == t)),
            };
            match cur.and_then(|c| c.checked_add(*by)) {
                None => matches!(ret, None | Some(Ret::Err)).then(|| s.clone()),
                Some(n) => match ret {
                    None => Some(Some(n.to_string().into_bytes())),
                    Some(Ret::Int(m)) if *m == n => Some(Some(n.to_string().into_bytes())),
                    _ => None,
                },
            }
        }
    }
}

/// Why a history is not linearizable.
#[derive(Debug)]
pub struct Violation {
    pub key: Vec<u8>,
    pub ops: usize,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "key {:?} ({} operations): {}",
            String::from_utf8_lossy(&self.key),
            self.ops,
            self.detail
        )
    }
}

/// Checks a whole history.
pub fn check(history: &[Event]) -> Result<(), Violation> {
    let mut by_key: HashMap<&[u8], Vec<&Event>> = HashMap::new();
    for e in history {
        by_key.entry(&e.key).or_default().push(e);
    }
    for (key, evs) in by_key {
        check_key(&evs).map_err(|detail| Violation {
            key: key.to_vec(),
            ops: evs.len(),
            detail,
        })?;
    }
    Ok(())
}

/// Wing–Gong–Lowe over one key's operations.
fn check_key(evs: &[&Event]) -> Result<(), String> {
    let n = evs.len();
    // Entries: (time, is_return, op); a return sorts after a call at the same time.
    let mut entries: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, e) in evs.iter().enumerate() {
        entries.push((e.call, false, i));
        entries.push((e.ret.as_ref().map_or(u64::MAX, |r| r.0), true, i));
    }
    entries.sort_by_key(|&(t, r, i)| (t, r, i));
    // A doubly linked list over the entries, with a head sentinel at index m.
    let m = entries.len();
    let mut next: Vec<usize> = (1..=m).collect();
    next.push(0);
    // prev[0] is the sentinel m; prev[i] = i - 1 after it.
    let mut prev: Vec<usize> = std::iter::once(m).chain(0..m).collect();
    next[m] = 0;
    let none = m + 1;
    if m == 0 {
        return Ok(());
    }
    next[m - 1] = none;
    let mut ret_of = vec![0usize; n];
    for (idx, &(_, r, i)) in entries.iter().enumerate() {
        if r {
            ret_of[i] = idx;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = q;
        if q != none {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = x;
        if q != none {
            prev[q] = x;
        }
    };
    let words = n.div_ceil(64);
    let mut lin = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state: State = None;
    let mut cur = next[m];
    let mut steps = 0u64;
    while next[m] != none {
        steps += 1;
        if steps > 50_000_000 {
            return Err("search too long (gave up)".into());
        }
        if cur == none {
            // Nothing left to try at this level.
            let Some((c, s)) = stack.pop() else {
                return Err("no linearization".into());
            };
            let i = entries[c].2;
            state = s;
            lin[i / 64] &= !(1 << (i % 64));
            relink(&mut next, &mut prev, ret_of[i]);
            relink(&mut next, &mut prev, c);
            cur = next[c];
            continue;
        }
        let (_, is_ret, i) = entries[cur];
        if !is_ret {
            let e = evs[i];
            if let Some(s2) = step(&state, &e.op, e.ret.as_ref().map(|r| &r.1)) {
                let mut l2 = lin.clone();
                l2[i / 64] |= 1 << (i % 64);
                if seen.insert((l2.clone(), s2.clone())) {
                    stack.push((cur, std::mem::replace(&mut state, s2)));
                    lin = l2;
                    unlink(&mut next, &mut prev, cur);
                    unlink(&mut next, &mut prev, ret_of[i]);
                    cur = next[m];
                    continue;
                }
            }
            cur = next[cur];
        } else {
            // A return whose call is not linearized yet: backtrack.
            let Some((c, s)) = stack.pop() else {
                return Err(format!(
                    "operation {:?} returning {:?} cannot be placed",
                    evs[i].op, evs[i].ret
                ));
            };
            let j = entries[c].2;
            state = s;
            lin[j / 64] &= !(1 << (j % 64));
            relink(&mut next, &mut prev, ret_of[j]);
            relink(&mut next, &mut prev, c);
            cur = next[c];
        }
    }
    Ok(())
}

/// The checker's own cases: it accepts linearizable histories and rejects the others.
pub fn check_the_checker() {
    let ev = |client, op, call, ret: Option<(u64, Ret)>| Event {
        client,
        key: b"k".to_vec(),
        op,
        call,
        ret,
    };
    let v = |s: &str| Some(s.as_bytes().to_vec());
    // Sequential and fine.
    let h = vec![
        ev(0, Op::Set(b"a".to_vec()), 0, Some((1, Ret::Ok))),
        ev(1, Op::Get, 2, Some((3, Ret::Value(v("a"))))),
        ev(0, Op::Incr(1), 4, Some((5, Ret::Err))),
        ev(1, Op::Del, 6, Some((7, Ret::Int(1)))),
        ev(0, Op::Incr(2), 8, Some((9, Ret::Int(2)))),
    ];
    assert!(check(&h).is_ok());
    // A stale read after a completed SET.
    let h = vec![
        ev(0, Op::Set(b"a".to_vec()), 0, Some((1, Ret::Ok))),
        ev(0, Op::Set(b"b".to_vec()), 2, Some((3, Ret::Ok))),
        ev(1, Op::Get, 4, Some((5, Ret::Value(v("a"))))),
    ];
    assert!(check(&h).is_err());
    // Overlapping: the read may see either value.
    for seen in ["a", "b"] {
        let h = vec![
            ev(0, Op::Set(b"a".to_vec()), 0, Some((1, Ret::Ok))),
            ev(0, Op::Set(b"b".to_vec()), 2, Some((6, Ret::Ok))),
            ev(1, Op::Get, 3, Some((5, Ret::Value(v(seen))))),
        ];
        assert!(check(&h).is_ok(), "{seen}");
    }
    // A value never written.
    let h = vec![ev(1, Op::Get, 0, Some((1, Ret::Value(v("z")))))];
    assert!(check(&h).is_err());
    // Two INCRs returning the same number.
    let h = vec![
        ev(0, Op::Incr(1), 0, Some((5, Ret::Int(1)))),
        ev(1, Op::Incr(1), 1, Some((6, Ret::Int(1)))),
    ];
    assert!(check(&h).is_err());
    // A SET whose reply was lost may take effect later, or never.
    let h = vec![
        ev(0, Op::Set(b"a".to_vec()), 0, None),
        ev(1, Op::Get, 5, Some((6, Ret::Value(None)))),
        ev(1, Op::Get, 7, Some((8, Ret::Value(v("a"))))),
    ];
    assert!(check(&h).is_ok());
    let h = vec![
        ev(0, Op::Set(b"a".to_vec()), 0, None),
        ev(1, Op::Get, 5, Some((6, Ret::Value(v("a"))))),
        ev(1, Op::Get, 7, Some((8, Ret::Value(None)))),
    ];
    assert!(check(&h).is_err());
}
