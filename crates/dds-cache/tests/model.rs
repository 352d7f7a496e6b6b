//! Property tests of the writer against a model of the table's semantics.

use std::collections::HashMap;

use dds_cache::{CacheItem, CacheWriter, Config, InsertError, InsertOutcome, InvalidateOutcome};
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert { key: u64, version: u64, seed: u64 },
    InsertEvicting { key: u64, version: u64, seed: u64 },
    Invalidate { key: u64, version: u64 },
    Remove { key: u64 },
    Get { key: u64 },
}

fn item(key: u64, version: u64, seed: u64) -> CacheItem {
    CacheItem {
        key,
        version,
        file_id: seed as u32,
        offset: seed.rotate_left(17) ^ key,
        size: (seed >> 32) as u32,
        tag: seed ^ version,
    }
}

fn op(keys: u64, versions: u64, evicting: bool) -> impl Strategy<Value = Op> {
    let insert = (0..keys, 0..versions, any::<u64>()).prop_map(|(key, version, seed)| Op::Insert {
        key,
        version,
        seed,
    });
    let evict = (0..keys, 0..versions, any::<u64>())
        .prop_map(|(key, version, seed)| Op::InsertEvicting { key, version, seed });
    let invalidate =
        (0..keys, 0..versions).prop_map(|(key, version)| Op::Invalidate { key, version });
    let remove = (0..keys).prop_map(|key| Op::Remove { key });
    let get = (0..keys).prop_map(|key| Op::Get { key });
    prop_oneof![
        4 => insert,
        if evicting { 2 } else { 0 } => evict,
        2 => invalidate,
        1 => remove,
        2 => get,
    ]
}

/// What the table knows about a key in the exact model.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rec {
    Live(CacheItem),
    Floor(u64),
}

const KEYS: u64 = 24;
const MODEL_BUCKETS: usize = 256;

/// The model is exact only while no bucket can fill up: check that no bucket is a candidate
/// of more than four of the keys used.
#[test]
fn model_key_set_cannot_fill_a_bucket() {
    let w = CacheWriter::new(Config::with_buckets(MODEL_BUCKETS)).unwrap();
    let mut uses = vec![0; MODEL_BUCKETS];
    for k in 0..KEYS {
        let (a, b) = w.candidate_buckets(k);
        uses[a] += 1;
        uses[b] += 1;
    }
    assert!(uses.iter().all(|&u| u <= 4), "{uses:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// With room to spare the table behaves exactly like the model.
    #[test]
    fn matches_exact_model(ops in prop::collection::vec(op(KEYS, 20, false), 1..200)) {
        let mut w = CacheWriter::new(Config::with_buckets(MODEL_BUCKETS)).unwrap();
        let r = w.reader();
        let mut model: HashMap<u64, Rec> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert { key, version, seed } | Op::InsertEvicting { key, version, seed } => {
                    let it = item(key, version, seed);
                    let expected = match model.get(&key) {
                        Some(Rec::Live(e)) if version >= e.version => InsertOutcome::Replaced(*e),
                        Some(Rec::Live(e)) => InsertOutcome::Stale { min_version: e.version },
                        Some(Rec::Floor(f)) if version < *f => InsertOutcome::Stale { min_version: *f },
                        _ => InsertOutcome::Inserted,
                    };
                    if !matches!(expected, InsertOutcome::Stale { .. }) {
                        model.insert(key, Rec::Live(it));
                    }
                    prop_assert_eq!(w.insert(it), Ok(expected));
                }
                Op::Invalidate { key, version } => {
                    let floor = version.saturating_add(1);
                    let expected = match model.get(&key).copied() {
                        Some(Rec::Live(e)) if e.version > version => InvalidateOutcome::KeptNewer(e),
                        Some(Rec::Live(e)) => {
                            model.insert(key, Rec::Floor(floor));
                            InvalidateOutcome::Removed(e)
                        }
                        Some(Rec::Floor(f)) => {
                            model.insert(key, Rec::Floor(f.max(floor)));
                            InvalidateOutcome::Tombstone
                        }
                        None => {
                            model.insert(key, Rec::Floor(floor));
                            InvalidateOutcome::Tombstone
                        }
                    };
                    prop_assert_eq!(w.invalidate(key, version), expected);
                }
                Op::Remove { key } => {
                    let expected = match model.get(&key).copied() {
                        Some(Rec::Live(e)) => {
                            model.remove(&key);
                            Some(e)
                        }
                        _ => None,
                    };
                    prop_assert_eq!(w.remove(key), expected);
                }
                Op::Get { key } => {
                    let expected = match model.get(&key) {
                        Some(Rec::Live(e)) => Some(*e),
                        _ => None,
                    };
                    prop_assert_eq!(r.get(key), expected);
                    prop_assert_eq!(w.get(key), expected);
                }
            }
        }
        for key in 0..KEYS {
            let (live, min) = match model.get(&key) {
                Some(Rec::Live(e)) => (Some(*e), e.version),
                Some(Rec::Floor(f)) => (None, *f),
                None => (None, 0),
            };
            prop_assert_eq!(r.get(key), live);
            prop_assert_eq!(w.min_version(key), min);
        }
        let live = model.values().filter(|r| matches!(r, Rec::Live(_))).count();
        prop_assert_eq!(w.len(), live);
        prop_assert_eq!(w.tombstones(), model.len() - live);
        let s = w.stats();
        prop_assert_eq!((s.full, s.tombstones_reclaimed, s.floor_raises), (0, 0, 0));
        w.check_invariants();
    }

    /// Under pressure (a tiny table, evictions, tombstone reclamation, bucket floors) the table
    /// may refuse more than the model, but it never serves a version older than one it was
    /// told about, never accepts an invalidated version, and never loses a live item without
    /// reporting it.
    #[test]
    fn safe_under_pressure(
        buckets in prop::sample::select(vec![2usize, 4, 8]),
        ops in prop::collection::vec(op(48, 30, true), 1..300),
    ) {
        let mut w = CacheWriter::new(Config::with_buckets(buckets)).unwrap();
        let r = w.reader();
        // Items the table says it holds.
        let mut held: HashMap<u64, CacheItem> = HashMap::new();
        // Highest invalidated floor per key (since its last plain remove).
        let mut floor: HashMap<u64, u64> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert { key, version, seed } | Op::InsertEvicting { key, version, seed } => {
                    let it = item(key, version, seed);
                    let outcome = match op {
                        Op::Insert { .. } => match w.insert(it) {
                            Ok(o) => o,
                            Err(InsertError::Full(back)) => {
                                prop_assert_eq!(back, it);
                                prop_assert!(!held.contains_key(&key), "update reported full");
                                continue;
                            }
                        },
                        _ => w.insert_evicting(it),
                    };
                    match outcome {
                        InsertOutcome::Stale { min_version } => {
                            prop_assert!(version < min_version);
                            if let Some(h) = held.get(&key) {
                                prop_assert!(h.version > version);
                            }
                        }
                        accepted => {
                            prop_assert!(version >= floor.get(&key).copied().unwrap_or(0),
                                "accepted an invalidated version");
                            prop_assert!(version >= held.get(&key).map_or(0, |h| h.version));
                            match accepted {
                                InsertOutcome::Replaced(old) => prop_assert_eq!(Some(&old), held.get(&key)),
                                InsertOutcome::Evicted(victim) => {
                                    prop_assert_eq!(held.remove(&victim.key), Some(victim));
                                }
                                _ => prop_assert!(!held.contains_key(&key)),
                            }
                            held.insert(key, it);
                        }
                    }
                }
                Op::Invalidate { key, version } => {
                    let f = floor.entry(key).or_insert(0);
                    *f = (*f).max(version.saturating_add(1));
                    match w.invalidate(key, version) {
                        InvalidateOutcome::Removed(old) => {
                            prop_assert_eq!(held.remove(&key), Some(old));
                            prop_assert!(old.version <= version);
                        }
                        InvalidateOutcome::KeptNewer(cur) => {
                            prop_assert_eq!(held.get(&key), Some(&cur));
                            prop_assert!(cur.version > version);
                        }
                        InvalidateOutcome::Tombstone | InvalidateOutcome::BucketFloor => {
                            prop_assert!(!held.contains_key(&key));
                        }
                    }
                }
                Op::Remove { key } => {
                    let removed = w.remove(key);
                    prop_assert_eq!(removed, held.remove(&key));
                    if removed.is_some() {
                        // A plain remove forgets the key, including the floor its live
                        // version implied.
                        floor.remove(&key);
                    }
                }
                Op::Get { key } => {
                    prop_assert_eq!(r.get(key), held.get(&key).copied());
                }
            }
            prop_assert_eq!(w.len(), held.len());
        }
        for key in 0..48 {
            prop_assert_eq!(r.get(key), held.get(&key).copied());
        }
        w.check_invariants();
    }
}
