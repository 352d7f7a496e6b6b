//! Throughput benchmark of the cache table against `DashMap` and `RwLock<HashMap>`.
//! The `dds bench cache-table` command runs it and plots the points.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::hint::black_box;
use std::sync::{Barrier, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::{fmix64, CacheItem, CacheWriter, Config, InsertOutcome};

/// Table implementation measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TableKind {
    /// This crate's cuckoo table (one writer, lock-free readers).
    Cuckoo,
    /// `dashmap::DashMap` (sharded reader-writer locks).
    DashMap,
    /// `std::sync::RwLock<std::collections::HashMap>`.
    RwLockHashMap,
}

impl TableKind {
    /// All kinds, in plotting order.
    pub const ALL: [TableKind; 3] = [
        TableKind::Cuckoo,
        TableKind::DashMap,
        TableKind::RwLockHashMap,
    ];

    /// Short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Cuckoo => "cuckoo",
            TableKind::DashMap => "dashmap",
            TableKind::RwLockHashMap => "rwlock-hashmap",
        }
    }
}

/// One measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchPoint {
    /// Table measured.
    pub kind: TableKind,
    /// Items inserted.
    pub items: usize,
    /// Reader threads.
    pub readers: usize,
    /// Lookups done by each reader.
    pub lookups_per_reader: usize,
    /// Insert rate of one writer filling an empty (pre-sized) table with `items` items.
    pub inserts_per_sec: f64,
    /// Aggregate lookup rate of the readers (uniformly random keys, all present), one
    /// lookup call per key.
    pub lookups_per_sec: f64,
    /// Cuckoo table only: the same lookups through [`crate::CacheReader::get_many`] in
    /// batches of [`BATCH`] keys, whose memory accesses overlap. The baselines have no
    /// batched lookup.
    pub batched_lookups_per_sec: Option<f64>,
    /// Memory of the table: exact for the cuckoo table, estimated from capacity for the
    /// baselines (one hash-table bucket of `(key, item)` plus one control byte per bucket).
    pub memory_bytes: usize,
}

/// Key of the `i`-th item (an odd-multiplier bijection, so keys are distinct and spread).
#[inline(always)]
pub fn key_of(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The item stored for the `i`-th key. Fields derive from the key so lookups can be checked.
#[inline(always)]
pub fn item_of(i: u64) -> CacheItem {
    let key = key_of(i);
    CacheItem {
        key,
        version: 1,
        file_id: (i % 1021) as u32,
        offset: i * 4096,
        size: 4096,
        tag: !key,
    }
}

/// `u64` hasher used by the baselines (the same finalizer the cuckoo table uses), so the
/// comparison measures the tables, not SipHash.
#[derive(Clone, Copy, Debug, Default)]
pub struct FmixBuildHasher;

/// Hasher of [`FmixBuildHasher`].
#[derive(Clone, Copy, Debug, Default)]
pub struct FmixHasher(u64);

impl BuildHasher for FmixBuildHasher {
    type Hasher = FmixHasher;
    fn build_hasher(&self) -> FmixHasher {
        FmixHasher(0)
    }
}

impl Hasher for FmixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = fmix64(self.0 ^ u64::from(b));
        }
    }
    #[inline(always)]
    fn write_u64(&mut self, x: u64) {
        self.0 = fmix64(self.0 ^ x);
    }
    #[inline(always)]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Small, fast generator for the lookup keys (xorshift64*).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(fmix64(seed) | 1)
    }
    /// Uniform in `0..n`.
    #[inline(always)]
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((u128::from(r) * u128::from(n)) >> 64) as u64
    }
}

/// Estimated heap bytes of a hashbrown table with `capacity` for `entry`-byte entries.
fn hashbrown_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        capacity * 8 / 7
    }
    .next_power_of_two();
    buckets * (entry + 1) + 16
}

/// Fill a table of `kind` with `items` items from one writer thread, then run `readers`
/// threads doing `lookups_per_reader` lookups of uniformly random present keys each.
///
/// Panics if `items` or `readers` is zero, or if a lookup misses or returns a wrong item.
pub fn run(kind: TableKind, items: usize, readers: usize, lookups_per_reader: usize) -> BenchPoint {
    assert!(
        items > 0 && readers > 0,
        "items and readers must be positive"
    );
    let m = match kind {
        TableKind::Cuckoo => run_cuckoo(items, readers, lookups_per_reader),
        TableKind::DashMap => run_dashmap(items, readers, lookups_per_reader),
        TableKind::RwLockHashMap => run_rwlock(items, readers, lookups_per_reader),
    };
    let rate = |t: Duration| (readers * lookups_per_reader) as f64 / t.as_secs_f64();
    BenchPoint {
        kind,
        items,
        readers,
        lookups_per_reader,
        inserts_per_sec: items as f64 / m.insert_time.as_secs_f64(),
        lookups_per_sec: rate(m.lookup_time),
        batched_lookups_per_sec: m.batched_lookup_time.map(rate),
        memory_bytes: m.memory_bytes,
    }
}

/// Keys per [`crate::CacheReader::get_many`] call in the batched measurement.
pub const BATCH: usize = 16;

/// Raw measurements of one table.
struct Measured {
    insert_time: Duration,
    lookup_time: Duration,
    batched_lookup_time: Option<Duration>,
    memory_bytes: usize,
}

/// Check the offset returned for key index `i` and fold it into `sum` (which stays zero while
/// every item is the right one).
#[inline(always)]
fn account(i: u64, found: Option<u64>, sum: &mut u64, missed: &mut usize) {
    match found {
        Some(offset) => *sum = sum.wrapping_add(offset ^ (i * 4096)),
        None => *missed += 1,
    }
}

/// Run `readers` threads, each calling `body(rng, lookups)` once, and return the wall time
/// from their common start to the last one's end. `body` returns the number of misses and
/// the folded check sum, both zero when every lookup found the right item.
fn lookups<F>(readers: usize, lookups: usize, body: F) -> Duration
where
    F: Fn(&mut Rng, usize) -> (usize, u64) + Sync,
{
    let barrier = Barrier::new(readers + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|t| {
                let (body, barrier) = (&body, &barrier);
                s.spawn(move || {
                    let mut rng = Rng::new(0x5eed + t as u64);
                    barrier.wait();
                    // Each reader takes its own start: the spawning thread may be descheduled
                    // past the readers' whole run on a busy machine.
                    let start = Instant::now();
                    let (missed, sum) = body(&mut rng, lookups);
                    let end = Instant::now();
                    assert_eq!(missed, 0, "lookups of present keys missed");
                    assert_eq!(black_box(sum), 0, "lookups returned wrong items");
                    (start, end)
                })
            })
            .collect();
        barrier.wait();
        let spans: Vec<(Instant, Instant)> = handles
            .into_iter()
            .map(|h| h.join().expect("reader panicked"))
            .collect();
        let start = spans
            .iter()
            .map(|s| s.0)
            .min()
            .expect("at least one reader");
        let end = spans
            .iter()
            .map(|s| s.1)
            .max()
            .expect("at least one reader");
        end.duration_since(start)
    })
}

/// One call of `get` (returning the item's offset) per lookup.
fn single_lookups<G>(items: usize, readers: usize, n: usize, get: G) -> Duration
where
    G: Fn(u64) -> Option<u64> + Sync,
{
    lookups(readers, n, |rng, n| {
        let (mut sum, mut missed) = (0u64, 0usize);
        for _ in 0..n {
            let i = rng.below(items as u64);
            account(i, get(key_of(i)), &mut sum, &mut missed);
        }
        (missed, sum)
    })
}

fn run_cuckoo(items: usize, readers: usize, lookups_per_reader: usize) -> Measured {
    let mut writer = CacheWriter::new(Config::for_items(items)).expect("valid configuration");
    let start = Instant::now();
    for i in 0..items as u64 {
        let outcome = writer
            .insert(item_of(i))
            .expect("table sized for the items");
        debug_assert_eq!(outcome, InsertOutcome::Inserted);
    }
    let insert_time = start.elapsed();
    assert_eq!(writer.len(), items);
    let reader = writer.reader();
    let lookup_time = single_lookups(items, readers, lookups_per_reader, |k| {
        reader.get(k).map(|it| it.offset)
    });
    let batched = lookups(readers, lookups_per_reader, |rng, n| {
        let (mut sum, mut missed) = (0u64, 0usize);
        let mut idx = [0u64; BATCH];
        let mut keys = [0u64; BATCH];
        let mut out = [None; BATCH];
        let mut done = 0;
        while done < n {
            let len = BATCH.min(n - done);
            for j in 0..len {
                idx[j] = rng.below(items as u64);
                keys[j] = key_of(idx[j]);
            }
            reader.get_many(&keys[..len], &mut out[..len]);
            for j in 0..len {
                account(idx[j], out[j].map(|it| it.offset), &mut sum, &mut missed);
            }
            done += len;
        }
        (missed, sum)
    });
    Measured {
        insert_time,
        lookup_time,
        batched_lookup_time: Some(batched),
        memory_bytes: writer.memory_bytes(),
    }
}

fn run_dashmap(items: usize, readers: usize, lookups_per_reader: usize) -> Measured {
    let map: DashMap<u64, CacheItem, FmixBuildHasher> =
        DashMap::with_capacity_and_hasher(items, FmixBuildHasher);
    let start = Instant::now();
    for i in 0..items as u64 {
        map.insert(key_of(i), item_of(i));
    }
    let insert_time = start.elapsed();
    assert_eq!(map.len(), items);
    let lookup_time = single_lookups(items, readers, lookups_per_reader, |k| {
        map.get(&k).map(|it| it.offset)
    });
    // DashMap's default shard count (it does not expose it without its `raw-api` feature).
    let parallelism = std::thread::available_parallelism().map_or(1, usize::from);
    let shards = (parallelism * 4).next_power_of_two();
    let entry = std::mem::size_of::<(u64, CacheItem)>();
    let memory_bytes = shards * hashbrown_bytes(map.capacity() / shards, entry);
    Measured {
        insert_time,
        lookup_time,
        batched_lookup_time: None,
        memory_bytes,
    }
}

fn run_rwlock(items: usize, readers: usize, lookups_per_reader: usize) -> Measured {
    let map: RwLock<HashMap<u64, CacheItem, FmixBuildHasher>> =
        RwLock::new(HashMap::with_capacity_and_hasher(items, FmixBuildHasher));
    let start = Instant::now();
    for i in 0..items as u64 {
        map.write().expect("lock").insert(key_of(i), item_of(i));
    }
    let insert_time = start.elapsed();
    let lookup_time = single_lookups(items, readers, lookups_per_reader, |k| {
        map.read().expect("lock").get(&k).map(|it| it.offset)
    });
    let map = map.into_inner().expect("lock");
    assert_eq!(map.len(), items);
    let memory_bytes = hashbrown_bytes(map.capacity(), std::mem::size_of::<(u64, CacheItem)>());
    Measured {
        insert_time,
        lookup_time,
        batched_lookup_time: None,
        memory_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_runs_and_serializes() {
        for kind in TableKind::ALL {
            let p = run(kind, 5_000, 2, 5_000);
            assert_eq!(p.kind, kind);
            assert!(p.inserts_per_sec > 0.0 && p.lookups_per_sec > 0.0);
            assert_eq!(
                p.batched_lookups_per_sec.is_some(),
                kind == TableKind::Cuckoo
            );
            assert!(
                p.memory_bytes >= 5_000 * 40,
                "{kind:?}: {} bytes",
                p.memory_bytes
            );
            let json = serde_json::to_string(&p).unwrap();
            assert!(json.contains("lookups_per_sec"));
        }
    }

    #[test]
    fn rng_below_stays_in_range() {
        let mut r = Rng::new(1);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let x = r.below(10) as usize;
            seen[x] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn hashbrown_estimate() {
        assert_eq!(hashbrown_bytes(0, 48), 0);
        assert_eq!(hashbrown_bytes(7 * 1024, 48), 8 * 1024 * 49 + 16);
    }
}
