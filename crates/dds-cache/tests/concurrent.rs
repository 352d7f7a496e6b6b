//! One writer, several readers: readers only ever see items the writer wrote for the key they
//! asked for, never an older version after a newer one, and never miss a key that is present
//! throughout (even while cuckoo displacement moves it between buckets).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

use dds_cache::{fmix64, CacheItem, CacheWriter, Config, InsertError};

/// Every field of the item for (`key`, `version`) derives from both, so a torn read (fields
/// of two different items) cannot pass [`check`].
fn item(key: u64, version: u64) -> CacheItem {
    let h = fmix64(key ^ version.rotate_left(29));
    CacheItem {
        key,
        version,
        file_id: h as u32,
        offset: key.wrapping_mul(1 << 20) ^ version,
        size: (h >> 32) as u32,
        tag: fmix64(h),
    }
}

fn check(key: u64, got: &CacheItem) {
    assert_eq!(got.key, key);
    assert_eq!(
        *got,
        item(key, got.version),
        "torn or foreign item for key {key}"
    );
}

const BUCKETS: usize = 256;
/// Keys present from the start to the end; only updated.
const PINNED: u64 = 200;
/// Keys that come and go.
const CHURN: u64 = 900;
const READERS: usize = 3;

fn writer_ops() -> u64 {
    if cfg!(debug_assertions) {
        400_000
    } else {
        4_000_000
    }
}

#[test]
fn readers_see_only_written_items_and_never_miss_present_keys() {
    let mut w = CacheWriter::new(Config::with_buckets(BUCKETS)).unwrap();
    let capacity = w.capacity() as u64;
    // Latest version written per key.
    let mut version = vec![1u64; (PINNED + CHURN) as usize];
    for key in 0..PINNED {
        w.insert(item(key, 1)).unwrap();
    }
    let done = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let barrier = Barrier::new(READERS + 1);

    std::thread::scope(|s| {
        for t in 0..READERS {
            let r = w.reader();
            let (done, lookups, barrier) = (&done, &lookups, &barrier);
            s.spawn(move || {
                let mut last_seen = vec![0u64; (PINNED + CHURN) as usize];
                let mut x = fmix64(t as u64 + 1);
                let mut n = 0u64;
                barrier.wait();
                while !done.load(Ordering::Relaxed) {
                    x = fmix64(x);
                    let key = x % (PINNED + CHURN);
                    match r.get(key) {
                        Some(got) => {
                            check(key, &got);
                            let last = &mut last_seen[key as usize];
                            assert!(got.version >= *last, "key {key} went back in time");
                            *last = got.version;
                        }
                        None => assert!(key >= PINNED, "pinned key {key} missed"),
                    }
                    n += 1;
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }

        barrier.wait();
        let mut rng = 0x1234_5678u64;
        // Versions are one global sequence (like a log sequence number), so every write is
        // newer than anything invalidated or evicted before it.
        let mut seq = 1u64;
        // Keep the table around 92 % full so that inserts displace items.
        let target = (capacity * 92 / 100) as usize;
        for _ in 0..writer_ops() {
            rng = fmix64(rng);
            let choice = rng % 20;
            seq += 1;
            if choice < 8 {
                // Update a pinned key in place.
                let key = (rng >> 8) % PINNED;
                version[key as usize] = seq;
                assert!(w.insert(item(key, seq)).is_ok());
                continue;
            }
            let key = PINNED + (rng >> 8) % CHURN;
            let present = w.get(key).is_some();
            match (present, choice) {
                (false, _) if w.len() < target => match w.insert(item(key, seq)) {
                    Ok(_) => version[key as usize] = seq,
                    Err(InsertError::Full(_)) => {}
                },
                (false, _) => {}
                (true, 8..=14) => {
                    version[key as usize] = seq;
                    assert!(w.insert(item(key, seq)).is_ok());
                }
                (true, 15..=17) => {
                    w.invalidate(key, version[key as usize]);
                }
                (true, _) => {
                    w.remove(key);
                }
            }
        }
        done.store(true, Ordering::Relaxed);
    });

    w.check_invariants();
    let stats = w.stats();
    eprintln!("{stats:?}, {} lookups", lookups.load(Ordering::Relaxed));
    assert!(
        stats.moves > 500,
        "too few displacements to exercise moves: {stats:?}"
    );
    assert!(lookups.load(Ordering::Relaxed) > 10_000);
    let r = w.reader();
    for key in 0..PINNED {
        assert_eq!(r.get(key), Some(item(key, version[key as usize])));
    }
}
