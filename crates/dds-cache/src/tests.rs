//! Unit tests of the writer's operations (single-threaded).

use crate::*;

fn item(key: u64, version: u64) -> CacheItem {
    CacheItem {
        key,
        version,
        file_id: (key as u32) ^ 0x5a5a,
        offset: key.wrapping_mul(4096).wrapping_add(version),
        size: 512u32.wrapping_add(version as u32),
        tag: key ^ version.rotate_left(32),
    }
}

fn table(buckets: usize) -> (CacheWriter, CacheReader) {
    let w = CacheWriter::new(Config::with_buckets(buckets)).unwrap();
    let r = w.reader();
    (w, r)
}

/// Distinct keys whose two candidate buckets are exactly `pair` (in either order).
fn keys_in_pair(w: &CacheWriter, pair: (usize, usize), n: usize) -> Vec<u64> {
    (0u64..)
        .filter(|&k| {
            let (a, b) = w.candidate_buckets(k);
            (a, b) == pair || (b, a) == pair
        })
        .take(n)
        .collect()
}

#[test]
fn reader_is_clone_send_sync_and_writer_is_send() {
    fn assert_reader<T: Clone + Send + Sync + 'static>() {}
    fn assert_writer<T: Send + 'static>() {}
    assert_reader::<CacheReader>();
    assert_writer::<CacheWriter>();
}

#[test]
fn insert_then_get() {
    let (mut w, r) = table(16);
    assert_eq!(r.get(1), None);
    assert_eq!(w.insert(item(1, 5)), Ok(InsertOutcome::Inserted));
    assert_eq!(r.get(1), Some(item(1, 5)));
    assert_eq!(w.get(1), Some(item(1, 5)));
    assert!(r.contains(1));
    assert!(!r.contains(2));
    assert_eq!(w.len(), 1);
    assert!(!w.is_empty());
    w.check_invariants();
}

#[test]
fn zero_and_max_keys_are_ordinary_keys() {
    let (mut w, r) = table(4);
    // Empty slots hold key 0 in their (ignored) key word: a lookup of key 0 must not see them.
    assert_eq!(r.get(0), None);
    w.insert(item(0, 1)).unwrap();
    w.insert(item(u64::MAX, 1)).unwrap();
    assert_eq!(r.get(0), Some(item(0, 1)));
    assert_eq!(r.get(u64::MAX), Some(item(u64::MAX, 1)));
    assert_eq!(w.remove(0), Some(item(0, 1)));
    assert_eq!(r.get(0), None);
}

#[test]
fn newer_or_equal_version_replaces_older_is_stale() {
    let (mut w, r) = table(16);
    w.insert(item(7, 10)).unwrap();
    assert_eq!(
        w.insert(item(7, 9)),
        Ok(InsertOutcome::Stale { min_version: 10 })
    );
    assert_eq!(r.get(7), Some(item(7, 10)));
    let mut same = item(7, 10);
    same.offset = 123;
    assert_eq!(w.insert(same), Ok(InsertOutcome::Replaced(item(7, 10))));
    assert_eq!(r.get(7), Some(same));
    assert_eq!(w.insert(item(7, 11)), Ok(InsertOutcome::Replaced(same)));
    assert_eq!(r.get(7), Some(item(7, 11)));
    assert_eq!(w.len(), 1);
    let s = w.stats();
    assert_eq!((s.inserts, s.updates, s.stale), (1, 2, 1));
}

#[test]
fn invalidate_leaves_a_floor() {
    let (mut w, r) = table(16);
    w.insert(item(3, 4)).unwrap();
    assert_eq!(w.invalidate(3, 4), InvalidateOutcome::Removed(item(3, 4)));
    assert_eq!(r.get(3), None);
    assert_eq!((w.len(), w.tombstones()), (0, 1));
    assert_eq!(w.min_version(3), 5);
    // The invalidated version and older ones cannot come back...
    assert_eq!(
        w.insert(item(3, 4)),
        Ok(InsertOutcome::Stale { min_version: 5 })
    );
    assert_eq!(
        w.insert(item(3, 1)),
        Ok(InsertOutcome::Stale { min_version: 5 })
    );
    assert_eq!(r.get(3), None);
    // ...a newer one can, and takes the tombstone's slot.
    assert_eq!(w.insert(item(3, 5)), Ok(InsertOutcome::Inserted));
    assert_eq!(r.get(3), Some(item(3, 5)));
    assert_eq!((w.len(), w.tombstones()), (1, 0));
    w.check_invariants();
}

#[test]
fn invalidate_keeps_a_newer_item() {
    let (mut w, r) = table(16);
    w.insert(item(3, 9)).unwrap();
    assert_eq!(w.invalidate(3, 8), InvalidateOutcome::KeptNewer(item(3, 9)));
    assert_eq!(r.get(3), Some(item(3, 9)));
    assert_eq!(w.tombstones(), 0);
}

#[test]
fn invalidate_of_absent_key_and_floor_only_rises() {
    let (mut w, _r) = table(16);
    assert_eq!(w.invalidate(8, 20), InvalidateOutcome::Tombstone);
    assert_eq!(w.invalidate(8, 10), InvalidateOutcome::Tombstone);
    assert_eq!(w.min_version(8), 21);
    assert_eq!(w.invalidate(8, 30), InvalidateOutcome::Tombstone);
    assert_eq!(w.min_version(8), 31);
    assert_eq!(w.tombstones(), 1);
    assert_eq!(
        w.insert(item(8, 30)),
        Ok(InsertOutcome::Stale { min_version: 31 })
    );
    w.check_invariants();
}

#[test]
fn invalidate_at_max_version_saturates() {
    let (mut w, _r) = table(4);
    w.invalidate(1, u64::MAX);
    assert_eq!(w.min_version(1), u64::MAX);
    assert_eq!(
        w.insert(item(1, u64::MAX - 1)),
        Ok(InsertOutcome::Stale {
            min_version: u64::MAX
        })
    );
    assert_eq!(w.insert(item(1, u64::MAX)), Ok(InsertOutcome::Inserted));
}

#[test]
fn remove_forgets_without_floor_and_keeps_tombstones() {
    let (mut w, r) = table(16);
    w.insert(item(5, 7)).unwrap();
    assert_eq!(w.remove(5), Some(item(5, 7)));
    assert_eq!(w.remove(5), None);
    assert_eq!(r.get(5), None);
    // No floor: an older version is accepted again.
    assert_eq!(w.insert(item(5, 1)), Ok(InsertOutcome::Inserted));
    w.invalidate(5, 3);
    assert_eq!(w.remove(5), None);
    assert_eq!(w.tombstones(), 1);
    assert_eq!(w.min_version(5), 4);
    w.check_invariants();
}

#[test]
fn full_table_reports_full_and_stays_unchanged() {
    let (mut w, r) = table(2);
    let keys: Vec<u64> = (0..9).collect();
    for &k in &keys[..8] {
        assert_eq!(w.insert(item(k, 1)), Ok(InsertOutcome::Inserted));
    }
    assert_eq!(
        w.insert(item(keys[8], 1)),
        Err(InsertError::Full(item(keys[8], 1)))
    );
    assert_eq!(w.len(), 8);
    for &k in &keys[..8] {
        assert_eq!(r.get(k), Some(item(k, 1)));
    }
    assert_eq!(r.get(keys[8]), None);
    assert_eq!(w.stats().full, 1);
    // Updates of present keys never need space.
    assert_eq!(
        w.insert(item(keys[0], 2)),
        Ok(InsertOutcome::Replaced(item(keys[0], 1)))
    );
    w.check_invariants();
}

#[test]
fn displacement_reaches_high_load_and_keeps_every_item() {
    let (mut w, r) = table(256);
    let mut n = 0u64;
    while w.insert(item(n, n)).is_ok() {
        n += 1;
    }
    let load = n as f64 / w.capacity() as f64;
    assert!(load > 0.9, "first failure at load {load}");
    assert!(w.stats().moves > 0);
    assert_eq!(w.len() as u64, n);
    for k in 0..n {
        assert_eq!(r.get(k), Some(item(k, k)), "key {k}");
    }
    w.check_invariants();
}

#[test]
fn short_path_bound_fails_earlier() {
    let mut w = CacheWriter::new(Config::with_buckets(256).max_path(0)).unwrap();
    let mut n = 0u64;
    while w.insert(item(n, 1)).is_ok() {
        n += 1;
    }
    assert_eq!(w.stats().moves, 0);
    assert!((n as f64) < 0.9 * w.capacity() as f64);
}

#[test]
fn insert_evicting_evicts_and_raises_the_floor() {
    let (mut w, r) = table(2);
    for k in 0..8 {
        w.insert(item(k, 10 + k)).unwrap();
    }
    let outcome = w.insert_evicting(item(100, 1));
    let InsertOutcome::Evicted(victim) = outcome else {
        panic!("expected eviction, got {outcome:?}")
    };
    assert_eq!(victim, item(victim.key, 10 + victim.key));
    assert_eq!(r.get(victim.key), None);
    assert_eq!(r.get(100), Some(item(100, 1)));
    assert_eq!(w.len(), 8);
    // The evicted version and older ones are below the floor now.
    assert!(w.min_version(victim.key) >= victim.version);
    w.remove(100);
    assert_eq!(
        w.insert(item(victim.key, victim.version - 1)),
        Ok(InsertOutcome::Stale {
            min_version: w.min_version(victim.key)
        })
    );
    assert_eq!(w.stats().evictions, 1);
    w.check_invariants();
}

#[test]
fn tombstones_are_reclaimed_under_pressure_into_bucket_floors() {
    let (mut w, r) = table(2);
    // Eight tombstones fill both buckets.
    for k in 0..8 {
        assert_eq!(w.invalidate(k, 50 + k), InvalidateOutcome::Tombstone);
    }
    assert_eq!(w.tombstones(), 8);
    // New keys take tombstone slots; their floors move to the bucket floors.
    for k in 100..108 {
        assert_eq!(w.insert(item(k, 1000)), Ok(InsertOutcome::Inserted));
    }
    assert_eq!((w.len(), w.tombstones()), (8, 0));
    assert_eq!(w.stats().tombstones_reclaimed, 8);
    // Every reclaimed key keeps (at least) its floor through the bucket floors.
    for k in 0..8 {
        assert!(w.min_version(k) > 50 + k);
        assert!(matches!(
            w.insert(item(k, 50 + k)),
            Ok(InsertOutcome::Stale { .. })
        ));
        assert_eq!(r.get(k), None);
    }
    // Live keys are exact and unaffected by bucket floors.
    assert_eq!(
        w.insert(item(100, 1000)),
        Ok(InsertOutcome::Replaced(item(100, 1000)))
    );
    w.check_invariants();
}

#[test]
fn invalidate_with_no_free_slot_uses_the_bucket_floor() {
    let (mut w, _r) = table(2);
    for k in 0..8 {
        w.insert(item(k, 1)).unwrap();
    }
    assert_eq!(w.invalidate(77, 40), InvalidateOutcome::BucketFloor);
    assert_eq!(w.min_version(77), 41);
    let (b1, _) = w.candidate_buckets(77);
    assert_eq!(w.floor_of(b1), 41);
    w.remove(0);
    assert_eq!(
        w.insert(item(77, 40)),
        Ok(InsertOutcome::Stale { min_version: 41 })
    );
    assert_eq!(w.insert(item(77, 41)), Ok(InsertOutcome::Inserted));
}

#[test]
fn empty_slots_are_preferred_to_tombstones() {
    let (mut w, _r) = table(64);
    let keys = keys_in_pair(&w, w.candidate_buckets(0), 5);
    w.invalidate(keys[0], 9);
    for &k in &keys[1..5] {
        w.insert(item(k, 1)).unwrap();
    }
    // Seven slots of the pair are in use, one is empty: the tombstone survives.
    assert_eq!(w.tombstones(), 1);
    assert_eq!(w.stats().tombstones_reclaimed, 0);
    assert_eq!(w.min_version(keys[0]), 10);
}

#[test]
fn reclaim_tombstones_below_watermark() {
    let (mut w, _r) = table(16);
    for k in 0..10 {
        w.invalidate(k, k);
    }
    assert_eq!(w.tombstones(), 10);
    // Floors are 1..=10; a watermark of 5 drops floors 1..=5.
    assert_eq!(w.reclaim_tombstones(5), 5);
    assert_eq!(w.tombstones(), 5);
    assert_eq!(w.min_version(0), 0);
    assert_eq!(w.min_version(9), 10);
    w.check_invariants();
}

#[test]
fn displaced_items_stay_in_their_candidate_buckets() {
    let (mut w, r) = table(8);
    let mut inserted = Vec::new();
    for k in 0..1000u64 {
        match w.insert(item(k, 1)) {
            Ok(_) => inserted.push(k),
            Err(InsertError::Full(_)) => break,
        }
    }
    for &k in &inserted {
        let (b, _, live) = w.slot_of(k).unwrap();
        let (c1, c2) = w.candidate_buckets(k);
        assert!(live && (b == c1 || b == c2));
        assert!(r.contains(k));
    }
    w.check_invariants();
}

#[test]
fn config_validation() {
    assert_eq!(
        CacheWriter::new(Config::with_buckets(0)).unwrap_err(),
        ConfigError::Buckets(0)
    );
    assert_eq!(
        CacheWriter::new(Config::with_buckets(1)).unwrap_err(),
        ConfigError::Buckets(1)
    );
    assert_eq!(
        CacheWriter::new(Config::with_buckets(6)).unwrap_err(),
        ConfigError::Buckets(6)
    );
    assert_eq!(
        CacheWriter::new(Config::with_buckets(1 << 62)).unwrap_err(),
        ConfigError::TooLarge(1 << 62)
    );
    assert_eq!(
        CacheWriter::new(Config::with_buckets(4).max_path(9)).unwrap_err(),
        ConfigError::MaxPath(9)
    );
    assert_eq!(
        CacheWriter::new(Config::with_buckets(4).seeds([3, 3])).unwrap_err(),
        ConfigError::Seeds
    );
}

#[test]
fn sizing_and_memory_formula() {
    assert_eq!(Config::for_items(0).buckets, 2);
    assert_eq!(Config::for_items(7).buckets, 2);
    assert_eq!(Config::for_items(1 << 20).buckets, 1 << 19);
    assert_eq!(Config::for_items(1 << 24).buckets, 1 << 23);
    assert_eq!(Config::for_items(1_000_000).buckets, 1 << 19);
    assert!(matches!(
        CacheWriter::new(Config::for_items(usize::MAX)).unwrap_err(),
        ConfigError::TooLarge(_)
    ));
    let w = CacheWriter::new(Config::with_buckets(1024)).unwrap();
    assert_eq!(w.capacity(), 4096);
    assert_eq!(w.buckets(), 1024);
    let queue = 2 * (1 + 4 + 16 + 64 + 256 + 1024) * 16;
    assert_eq!(queue, 43_680);
    assert!(w.memory_bytes() >= 1024 * 192 + queue);
    assert!(w.memory_bytes() < 1024 * 192 + queue + 128);
    assert_eq!(w.reader().memory_bytes(), w.memory_bytes());
    assert_eq!(w.reader().capacity(), 4096);
}
