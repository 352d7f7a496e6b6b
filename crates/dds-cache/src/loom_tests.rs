//! Model checking of the per-bucket sequence lock with loom (run by `loom.sh`): a writer
//! thread updates, moves and removes items while a reader thread looks them up. Every item
//! a reader returns must be one the writer wrote, whole; keys present throughout must be
//! found.

use loom::thread;

use crate::{CacheItem, CacheWriter, Config, InsertOutcome};

/// Every field derives from (key, version), so a torn read is detected.
fn item(key: u64, version: u64) -> CacheItem {
    CacheItem {
        key,
        version,
        file_id: (key as u32) ^ ((version as u32) << 8),
        offset: key * 1000 + version,
        size: version as u32 * 7 + 1,
        tag: key ^ (version << 32),
    }
}

fn assert_whole(key: u64, got: CacheItem) {
    assert_eq!(got, item(key, got.version), "torn item");
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

fn small_table() -> CacheWriter {
    CacheWriter::new(Config::with_buckets(4).max_path(1)).unwrap()
}

#[test]
fn loom_update_in_place_is_never_torn() {
    model(|| {
        let mut w = small_table();
        w.insert(item(1, 1)).unwrap();
        let r = w.reader();
        let reader = thread::spawn(move || {
            let a = r.get(1).expect("present key missed");
            assert_whole(1, a);
        });
        assert_eq!(
            w.insert(item(1, 2)),
            Ok(InsertOutcome::Replaced(item(1, 1)))
        );
        reader.join().unwrap();
    });
}

#[test]
fn loom_remove_and_reinsert() {
    model(|| {
        let mut w = small_table();
        w.insert(item(1, 1)).unwrap();
        let r = w.reader();
        let reader = thread::spawn(move || {
            let a = r.get(1);
            if let Some(a) = a {
                assert_whole(1, a);
            }
            let b = r.get(1);
            if let (Some(a), Some(b)) = (a, b) {
                assert_whole(1, b);
                assert!(b.version >= a.version, "version went back");
            }
        });
        assert_eq!(w.remove(1), Some(item(1, 1)));
        w.insert(item(1, 2)).unwrap();
        reader.join().unwrap();
    });
}

/// Keys for the displacement scenario in a 4-bucket table: `moved` sits in bucket `p` and has
/// a free alternate bucket; seven fillers have both candidates in {p, q}; `new_key` has
/// candidates {p, q} too, so inserting it must move `moved` out of `p`.
fn displacement_keys(w: &CacheWriter) -> (u64, Vec<u64>, u64) {
    let new_key = 0u64;
    let (p, q) = w.candidate_buckets(new_key);
    let in_pair = |k: u64| {
        let (a, b) = w.candidate_buckets(k);
        (a == p && b == q) || (a == q && b == p)
    };
    let moved = (1u64..).find(|&k| w.candidate_buckets(k).0 == p && w.candidate_buckets(k).1 != q);
    let fillers: Vec<u64> = (1u64..).filter(|&k| in_pair(k)).take(7).collect();
    (moved.unwrap(), fillers, new_key)
}

#[test]
fn loom_displacement_keeps_moved_key_visible() {
    model(|| {
        let mut w = small_table();
        let (moved, fillers, new_key) = displacement_keys(&w);
        w.insert(item(moved, 1)).unwrap();
        for &k in &fillers {
            w.insert(item(k, 1)).unwrap();
        }
        let r = w.reader();
        let reader = thread::spawn(move || {
            let got = r.get(moved).expect("key missed while being displaced");
            assert_whole(moved, got);
            if let Some(n) = r.get(new_key) {
                assert_whole(new_key, n);
            }
        });
        assert_eq!(w.insert(item(new_key, 1)), Ok(InsertOutcome::Inserted));
        assert_eq!(
            w.stats().moves,
            1,
            "scenario must displace exactly one item"
        );
        reader.join().unwrap();
        w.check_invariants();
    });
}

/// The moved key sits in its *second* candidate bucket and moves into its first: a reader can
/// find its first bucket without the key (before the copy) and its second without it (after
/// the overwrite), and must notice the change of the first bucket and retry.
#[test]
fn loom_move_into_first_candidate_is_never_missed() {
    model(|| {
        let mut w = small_table();
        let new_key = 0u64;
        let (p, q) = w.candidate_buckets(new_key);
        let cands = |k: u64| w.candidate_buckets(k);
        let moved = (1u64..)
            .find(|&k| cands(k).1 == p && cands(k).0 != q)
            .unwrap();
        let x = cands(moved).0;
        let x_fillers: Vec<u64> = (1u64..)
            .filter(|&k| k != moved && cands(k).0 == x)
            .take(4)
            .collect();
        let pq_fillers: Vec<u64> = (1u64..)
            .filter(|&k| {
                let (a, b) = cands(k);
                (a, b) == (p, q) || (a, b) == (q, p)
            })
            .take(7)
            .collect();
        for &k in &x_fillers {
            w.insert(item(k, 1)).unwrap();
        }
        // Bucket x is full, so the key lands in its second candidate, p.
        w.insert(item(moved, 1)).unwrap();
        w.remove(x_fillers[0]);
        for &k in &pq_fillers {
            w.insert(item(k, 1)).unwrap();
        }
        let r = w.reader();
        let reader = thread::spawn(move || {
            let got = r.get(moved).expect("key missed while being displaced");
            assert_whole(moved, got);
        });
        assert_eq!(w.insert(item(new_key, 1)), Ok(InsertOutcome::Inserted));
        assert_eq!(
            w.stats().moves,
            1,
            "scenario must displace exactly one item"
        );
        reader.join().unwrap();
        w.check_invariants();
    });
}
