//! The store against a hash-map model, on small pages so that eviction, compaction and the
//! wrap of the circular log file happen within a few hundred operations.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use dds_storage::OsStorage;

pub(super) fn small(durability: Durability) -> StoreConfig {
    StoreConfig {
        page_size: 64 << 10,
        memory: 3 * (64 << 10),
        log_size: 8 * (64 << 10),
        max_key: 64,
        max_value: 4096,
        durability,
        offload: false,
    }
}

pub(super) fn open(dir: &std::path::Path, cfg: StoreConfig) -> Store {
    Store::open(Box::new(OsStorage::new(dir).unwrap()), cfg).unwrap()
}

fn get(s: &mut Store, k: &[u8]) -> Option<Vec<u8>> {
    s.get_with(k, |v| v.map(<[u8]>::to_vec)).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Set(u8, usize, u8),
    Del(u8),
    Incr(u8, i64),
    Append(u8, usize),
    Commit,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..40, 0usize..3000, any::<u8>()).prop_map(|(k, n, b)| Op::Set(k, n, b)),
        2 => (0u8..40).prop_map(Op::Del),
        2 => (40u8..44, -5i64..5).prop_map(|(k, by)| Op::Incr(k, by)),
        1 => (0u8..40, 0usize..200).prop_map(|(k, n)| Op::Append(k, n)),
        1 => Just(Op::Commit),
        1 => Just(Op::Reopen),
    ]
}

fn key(k: u8) -> Vec<u8> {
    format!("key:{k}").into_bytes()
}

fn check_all(s: &mut Store, model: &HashMap<Vec<u8>, Vec<u8>>) {
    for k in 0..44u8 {
        assert_eq!(get(s, &key(k)), model.get(&key(k)).cloned(), "key {k}");
    }
    assert_eq!(s.len(), model.len() as u64);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn store_matches_a_model_through_eviction_compaction_and_restarts(
        ops in proptest::collection::vec(op(), 1..600)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), small(Durability::Fsync));
        let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        for o in ops {
            match o {
                Op::Set(k, n, b) => {
                    let v = vec![b; n];
                    s.set(&key(k), &v, SetCond::Always, Expiry::None, None).unwrap();
                    model.insert(key(k), v);
                }
                Op::Del(k) => {
                    let had = s.del(&key(k)).unwrap();
                    prop_assert_eq!(had, model.remove(&key(k)).is_some());
                }
                Op::Incr(k, by) => {
                    let cur: i64 = model
                        .get(&key(k))
                        .map(|v| std::str::from_utf8(v).unwrap().parse().unwrap())
                        .unwrap_or(0);
                    prop_assert_eq!(s.incr_by(&key(k), by).unwrap(), cur + by);
                    model.insert(key(k), (cur + by).to_string().into_bytes());
                }
                Op::Append(k, n) => {
                    let e = model.entry(key(k)).or_default();
                    if e.len() + n <= 4096 {
                        e.extend(std::iter::repeat_n(b'a', n));
                        prop_assert_eq!(s.append_value(&key(k), &vec![b'a'; n]).unwrap(), e.len());
                    }
                }
                Op::Commit => s.commit().unwrap(),
                Op::Reopen => {
                    // A crash right after a commit: nothing acknowledged is lost.
                    s.commit().unwrap();
                    drop(s);
                    s = open(dir.path(), small(Durability::Fsync));
                }
            }
        }
        check_all(&mut s, &model);
        s.commit().unwrap();
        drop(s);
        let mut s = open(dir.path(), small(Durability::Fsync));
        check_all(&mut s, &model);
    }
}

#[test]
fn the_log_wraps_many_times_and_keeps_every_live_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    // 8 keys written once (compaction must move them around the log), and 64 live keys of
    // ~640 B rewritten 40 times: ~1.6 MiB through a 512 KiB log.
    for k in 0..8u32 {
        s.set(
            format!("static{k}").as_bytes(),
            &[k as u8; 3000],
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
    }
    for round in 0..40u32 {
        for k in 0..64u32 {
            let v = format!("{round}:{k}:").repeat(100);
            s.set(
                format!("k{k}").as_bytes(),
                v.as_bytes(),
                SetCond::Always,
                Expiry::None,
                None,
            )
            .unwrap();
        }
        // A fold-over: every later update appends a new record.
        s.commit().unwrap();
    }
    assert!(s.stats().compactions > 10, "{:?}", s.stats());
    assert!(s.stats().compaction_moves >= 8, "{:?}", s.stats());
    assert!(
        s.addresses()[4] > 2 * s.config().log_size,
        "the log wrapped"
    );
    s.close().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    assert_eq!(s.len(), 72);
    for k in 0..8u32 {
        assert_eq!(
            get(&mut s, format!("static{k}").as_bytes()),
            Some(vec![k as u8; 3000])
        );
    }
    for k in 0..64u32 {
        let v = format!("39:{k}:").repeat(100);
        assert_eq!(
            get(&mut s, format!("k{k}").as_bytes()),
            Some(v.into_bytes())
        );
    }
}

#[test]
fn a_full_log_refuses_writes_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    let v = vec![7u8; 4000];
    let mut stored = 0u32;
    let err = loop {
        match s.set(
            format!("k{stored}").as_bytes(),
            &v,
            SetCond::Always,
            Expiry::None,
            None,
        ) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 1000, "the log never filled");
    };
    assert!(matches!(err, StoreError::LogFull), "{err}");
    for k in 0..stored {
        assert_eq!(
            get(&mut s, format!("k{k}").as_bytes()),
            Some(v.clone()),
            "k{k}"
        );
    }
    // Deleting frees room again.
    for k in 0..stored / 2 {
        assert!(s.del(format!("k{k}").as_bytes()).unwrap());
    }
    s.set(b"after", &v, SetCond::Always, Expiry::None, None)
        .unwrap();
    assert_eq!(get(&mut s, b"after"), Some(v));
}

#[test]
fn set_conditions_expiry_and_integers_follow_redis() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::None));
    assert!(s
        .set(b"a", b"1", SetCond::IfExists, Expiry::None, None)
        .is_ok_and(|x| !x));
    assert!(s
        .set(b"a", b"1", SetCond::IfMissing, Expiry::None, None)
        .unwrap());
    assert!(!s
        .set(b"a", b"2", SetCond::IfMissing, Expiry::None, None)
        .unwrap());
    assert_eq!(get(&mut s, b"a"), Some(b"1".to_vec()));
    s.set(b"t", b"x", SetCond::Always, Expiry::At(now_ms() - 1), None)
        .unwrap();
    assert_eq!(get(&mut s, b"t"), None);
    s.set(b"n", b"abc", SetCond::Always, Expiry::None, None)
        .unwrap();
    assert!(matches!(s.incr_by(b"n", 1), Err(StoreError::NotInteger)));
    s.set(b"n", b"007", SetCond::Always, Expiry::None, None)
        .unwrap();
    assert!(matches!(s.incr_by(b"n", 1), Err(StoreError::NotInteger)));
    s.set(
        b"n",
        &i64::MAX.to_string().into_bytes(),
        SetCond::Always,
        Expiry::None,
        None,
    )
    .unwrap();
    assert!(matches!(s.incr_by(b"n", 1), Err(StoreError::Overflow)));
    assert_eq!(s.incr_by(b"m", -3).unwrap(), -3);
    assert!(matches!(
        s.set(&[b'k'; 65], b"v", SetCond::Always, Expiry::None, None),
        Err(StoreError::KeyTooLarge(64))
    ));
    assert!(matches!(
        s.set(b"k", &[0; 4097], SetCond::Always, Expiry::None, None),
        Err(StoreError::ValueTooLarge(4096))
    ));
    s.flush_all().unwrap();
    assert_eq!(s.len(), 0);
    assert_eq!(get(&mut s, b"a"), None);
}

#[test]
fn expired_records_are_garbage_for_compaction_and_stay_gone_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    // 40 keys of 3000 B that expire soon, 8 that never do; nobody reads the expiring ones.
    let soon = now_ms() + 200;
    for k in 0..40u32 {
        s.set(
            format!("e{k}").as_bytes(),
            &[1; 3000],
            SetCond::Always,
            Expiry::At(soon),
            None,
        )
        .unwrap();
    }
    for k in 0..8u32 {
        s.set(
            format!("p{k}").as_bytes(),
            &[2; 3000],
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
    }
    s.commit().unwrap();
    assert_eq!(s.len(), 48, "expired keys count until they are found");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Enough writes to compact every page the expiring records were on.
    let moves_before = s.stats().compaction_moves;
    for round in 0..30u32 {
        for k in 0..16u32 {
            s.set(
                format!("w{k}").as_bytes(),
                &[round as u8; 2000],
                SetCond::Always,
                Expiry::None,
                None,
            )
            .unwrap();
        }
        s.commit().unwrap();
    }
    assert!(s.stats().compactions > 8, "{:?}", s.stats());
    // Compaction moved the 8 persistent keys (and rewritten ones), never the 40 expired.
    let moved = s.stats().compaction_moves - moves_before;
    assert!(
        moved < 40 * 2,
        "expired records were carried along: {moved} moves"
    );
    assert_eq!(
        s.len(),
        8 + 16,
        "the expired keys left the index when compacted"
    );
    for k in 0..40u32 {
        assert_eq!(get(&mut s, format!("e{k}").as_bytes()), None);
    }
    s.close().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    assert_eq!(s.len(), 24);
    for k in 0..8u32 {
        assert_eq!(get(&mut s, format!("p{k}").as_bytes()), Some(vec![2; 3000]));
    }
    assert_eq!(get(&mut s, b"e0"), None);
}

#[test]
fn the_empty_key_is_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    s.set(b"", b"empty", SetCond::Always, Expiry::None, None)
        .unwrap();
    assert_eq!(get(&mut s, b""), Some(b"empty".to_vec()));
    s.close().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    assert_eq!(get(&mut s, b""), Some(b"empty".to_vec()));
    assert!(s.del(b"").unwrap());
    assert_eq!(get(&mut s, b""), None);
}

/// Every key of the whole SCAN walk, with `between` run after each step.
fn walk(s: &mut Store, count: usize, mut between: impl FnMut(&mut Store)) -> Vec<Vec<u8>> {
    let mut seen = Vec::new();
    let mut cursor = 0;
    loop {
        cursor = s
            .scan(cursor, count, true, &mut |k| seen.push(k.to_vec()))
            .unwrap();
        if cursor == 0 {
            return seen;
        }
        between(s);
    }
}

#[test]
fn a_scan_returns_every_key_present_for_the_whole_walk_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        log_size: 32 * (64 << 10),
        ..small(Durability::Periodic)
    };
    let mut s = open(dir.path(), cfg);
    // 300 keys of 1 KiB: most records leave memory (3 pages of 64 KiB).
    for k in 0..300u32 {
        s.set(
            format!("stay{k}").as_bytes(),
            &[7; 1000],
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
    }
    s.set(b"gone", b"x", SetCond::Always, Expiry::None, None)
        .unwrap();
    assert!(s.addresses()[1] > 0, "records are on storage");
    // Between steps: keys come and go (the index grows past its capacity), one is deleted.
    let mut n = 0u32;
    let seen = walk(&mut s, 7, |s| {
        for _ in 0..40 {
            s.set(
                format!("new{n}").as_bytes(),
                b"v",
                SetCond::Always,
                Expiry::None,
                None,
            )
            .unwrap();
            if n.is_multiple_of(3) {
                s.del(format!("new{}", n / 2).as_bytes()).unwrap();
            }
            n += 1;
        }
        s.del(b"gone").unwrap();
    });
    assert!(n > 1000, "the walk took {n} steps' worth of changes");
    for k in 0..300u32 {
        let key = format!("stay{k}").into_bytes();
        let times = seen.iter().filter(|s| **s == key).count();
        assert_eq!(times, 1, "stay{k} returned {times} times");
    }
    assert!(s.stats().storage_reads > 0, "keys were read from storage");
    // Nothing twice, and a walk with no changes returns every key, exactly.
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), seen.len(), "a key returned twice");
    let all = walk(&mut s, 1000, |_| {});
    assert_eq!(all.len() as u64, s.len());
}

#[test]
fn the_active_expiry_cycle_removes_expired_keys_without_reads_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    let soon = now_ms() + 100;
    for k in 0..500u32 {
        s.set(
            format!("e{k}").as_bytes(),
            b"v",
            SetCond::Always,
            Expiry::At(soon),
            None,
        )
        .unwrap();
    }
    for k in 0..50u32 {
        s.set(
            format!("p{k}").as_bytes(),
            b"v",
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
    }
    s.commit().unwrap();
    assert_eq!(
        s.active_expire(Duration::from_secs(1)),
        0,
        "nothing expired yet"
    );
    std::thread::sleep(Duration::from_millis(150));
    let reads = s.stats().memory_reads + s.stats().storage_reads;
    let mut removed = 0;
    for _ in 0..100 {
        removed += s.active_expire(Duration::from_millis(25));
    }
    assert_eq!(removed, 500);
    assert_eq!(s.len(), 50);
    assert_eq!(s.expiring(), 0);
    assert_eq!(s.stats().expired_keys, 500);
    assert_eq!(s.stats().memory_reads + s.stats().storage_reads, reads);
    assert_eq!(s.avg_ttl(), 0);
    s.set(
        b"long",
        b"v",
        SetCond::Always,
        Expiry::At(now_ms() + 60_000),
        None,
    )
    .unwrap();
    s.set(
        b"longer",
        b"v",
        SetCond::Always,
        Expiry::At(now_ms() + 80_000),
        None,
    )
    .unwrap();
    assert!((69_000..=70_000).contains(&s.avg_ttl()), "{}", s.avg_ttl());
    s.del(b"longer").unwrap();
    assert!((59_000..=60_000).contains(&s.avg_ttl()), "{}", s.avg_ttl());
    s.del(b"long").unwrap();
    // A restart finds the expired records again; the cycle removes them again.
    s.close().unwrap();
    let mut s = open(dir.path(), small(Durability::Periodic));
    assert_eq!(s.expiring(), 500);
    while s.active_expire(Duration::from_millis(25)) > 0 {}
    assert_eq!(s.len(), 50);
    assert_eq!(get(&mut s, b"e1"), None);
    assert_eq!(get(&mut s, b"p1"), Some(b"v".to_vec()));
}

#[test]
fn randomkey_finds_the_live_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), small(Durability::None));
    assert!(!s.random_key(&mut |_| {}).unwrap());
    for k in 0..20u32 {
        s.set(
            format!("k{k}").as_bytes(),
            b"v",
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
        s.del(format!("k{k}").as_bytes()).unwrap();
    }
    s.set(b"only", b"v", SetCond::Always, Expiry::None, None)
        .unwrap();
    for _ in 0..20 {
        let mut got = Vec::new();
        assert!(s.random_key(&mut |k| got = k.to_vec()).unwrap());
        assert_eq!(got, b"only");
    }
}
