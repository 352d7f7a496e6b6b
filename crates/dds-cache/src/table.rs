//! The shared table, the unique writer and the lock-free readers.

use crate::bucket::{
    first_in_state, is_busy, reader_fence, state, with_state, Bucket, SlotState, BUCKET_BYTES,
    SLOTS, STATE_MASK,
};
use crate::hash::{candidates, first_candidate, second_candidate};
use crate::storage;
use crate::sync::{spin, Arc};
use crate::{
    CacheItem, CacheStats, Config, ConfigError, InsertError, InsertOutcome, InvalidateOutcome,
};

/// State shared by the writer and all readers.
pub(crate) struct Table {
    buckets: Box<[Bucket]>,
    mask: usize,
    seeds: [u64; 2],
    memory_bytes: usize,
}

impl Table {
    #[inline(always)]
    fn candidates(&self, key: u64) -> (usize, usize) {
        candidates(key, self.seeds, self.mask)
    }

    #[inline(always)]
    fn bucket(&self, index: usize) -> &Bucket {
        &self.buckets[index]
    }

    /// The candidate bucket of `key` that is not `current`.
    #[inline]
    fn alternate(&self, key: u64, current: usize) -> usize {
        let (i1, i2) = self.candidates(key);
        debug_assert!(
            current == i1 || current == i2,
            "item outside its candidate buckets"
        );
        if current == i1 {
            i2
        } else {
            i1
        }
    }
}

/// A lock-free read handle. Cheap to clone; any number may exist, on any threads.
#[derive(Clone)]
pub struct CacheReader {
    table: Arc<Table>,
}

impl CacheReader {
    /// The live item for `key`, if any. Never blocks; retries only while the writer is
    /// modifying one of the key's two buckets. The item returned was the table's live item for
    /// `key` at some instant during the call; a key present for the whole call is always found.
    #[inline]
    pub fn get(&self, key: u64) -> Option<CacheItem> {
        let t = &*self.table;
        let i1 = first_candidate(key, t.seeds, t.mask);
        let b1 = t.bucket(i1);
        b1.prefetch(true);
        // Fast path: the key in its first bucket, which holds nearly all keys below ~90 %
        // load (inserts fill the first candidate first).
        let h1 = b1.header_acquire();
        if let Some(slot) = b1.find_live(key, h1) {
            let item = b1.read_item(slot, key);
            reader_fence();
            if !is_busy(h1) && b1.header_relaxed() == h1 {
                return Some(item);
            }
        }
        self.get_slow(key, i1)
    }

    /// Both buckets, retrying until a consistent snapshot.
    #[cold]
    #[inline(never)]
    fn get_slow(&self, key: u64, i1: usize) -> Option<CacheItem> {
        let t = &*self.table;
        let i2 = second_candidate(key, t.seeds, t.mask, i1);
        let (b1, b2) = (t.bucket(i1), t.bucket(i2));
        loop {
            let h1 = b1.header_acquire();
            if !is_busy(h1) {
                if let Some(slot) = b1.find_live(key, h1) {
                    let item = b1.read_item(slot, key);
                    reader_fence();
                    if b1.header_relaxed() == h1 {
                        return Some(item);
                    }
                } else {
                    let h2 = b2.header_acquire();
                    if !is_busy(h2) {
                        let found = b2.find_live(key, h2).map(|slot| b2.read_item(slot, key));
                        reader_fence();
                        if b1.header_relaxed() == h1 && b2.header_relaxed() == h2 {
                            return found;
                        }
                    }
                }
            }
            spin();
        }
    }

    /// Hint that `key` will be looked up soon: starts loading its first candidate bucket
    /// (where nearly all keys live) into the cache. Issuing it a few lookups ahead lets the
    /// memory accesses of a batch overlap.
    #[inline]
    pub fn prefetch(&self, key: u64) {
        let t = &*self.table;
        t.bucket(first_candidate(key, t.seeds, t.mask))
            .prefetch(true);
    }

    /// Look up a batch: `out[i] = self.get(keys[i])` for every `i`. While one key is read
    /// the buckets of the next [`CacheReader::BATCH_AHEAD`] keys are prefetched, so the
    /// memory accesses of the batch overlap (the offload engine looks up all requests of a
    /// message together). Panics if the slices differ in length.
    #[inline]
    pub fn get_many(&self, keys: &[u64], out: &mut [Option<CacheItem>]) {
        assert_eq!(keys.len(), out.len(), "one output per key");
        for &key in keys.iter().take(Self::BATCH_AHEAD) {
            self.prefetch(key);
        }
        for (i, (&key, slot)) in keys.iter().zip(out.iter_mut()).enumerate() {
            if let Some(&next) = keys.get(i + Self::BATCH_AHEAD) {
                self.prefetch(next);
            }
            *slot = self.get(key);
        }
    }

    /// How many keys ahead [`CacheReader::get_many`] prefetches.
    pub const BATCH_AHEAD: usize = 8;

    /// Whether `key` has a live item.
    #[inline]
    pub fn contains(&self, key: u64) -> bool {
        self.get(key).is_some()
    }

    /// Number of slots (four per bucket).
    pub fn capacity(&self) -> usize {
        self.table.buckets.len() * SLOTS
    }

    /// Bytes allocated for the table (bucket array and the writer's search queue).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes
    }
}

impl std::fmt::Debug for CacheReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheReader")
            .field("buckets", &self.table.buckets.len())
            .finish()
    }
}

/// Marks a search-queue node that is one of the two candidate buckets of the new key.
const ROOT: u32 = u32::MAX;

/// A node of the breadth-first search for a cuckoo path.
#[derive(Clone, Copy, Debug)]
struct Node {
    /// Bucket this node stands for.
    bucket: usize,
    /// Index in the queue of the node whose item moves into this bucket, or [`ROOT`].
    parent: u32,
    /// Slot (in the parent's bucket) of the item that moves into this bucket.
    slot: u8,
    /// Number of moves needed to free a slot of this bucket.
    depth: u8,
}

/// The unique write handle. Not `Clone`: the table has exactly one writer, and every
/// mutation takes `&mut self`.
pub struct CacheWriter {
    table: Arc<Table>,
    /// Search queue, allocated once with its final capacity.
    queue: Vec<Node>,
    max_path: usize,
    live: usize,
    tombstones: usize,
    evict_cursor: usize,
    stats: CacheStats,
}

impl std::fmt::Debug for CacheWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheWriter")
            .field("buckets", &self.table.buckets.len())
            .field("live", &self.live)
            .field("tombstones", &self.tombstones)
            .finish()
    }
}

/// Capacity of the search queue for paths of at most `max_path` moves: both candidate buckets
/// and every bucket reachable from them in at most `max_path` moves.
fn queue_capacity(max_path: usize) -> usize {
    2 * (0..=max_path).map(|d| SLOTS.pow(d as u32)).sum::<usize>()
}

impl CacheWriter {
    /// Allocate a table as described by `config` (all memory is allocated and initialized
    /// here) and return its writer. Readers come from [`CacheWriter::reader`].
    pub fn new(config: Config) -> Result<CacheWriter, ConfigError> {
        config.validate()?;
        let buckets = storage::allocate(config.buckets);
        let queue_cap = queue_capacity(config.max_path);
        let memory_bytes = config.buckets * BUCKET_BYTES
            + queue_cap * std::mem::size_of::<Node>()
            + std::mem::size_of::<Table>();
        let table = Table {
            buckets,
            mask: config.buckets - 1,
            seeds: config.seeds,
            memory_bytes,
        };
        Ok(CacheWriter {
            table: Arc::new(table),
            queue: Vec::with_capacity(queue_cap),
            max_path: config.max_path,
            live: 0,
            tombstones: 0,
            evict_cursor: 0,
            stats: CacheStats::default(),
        })
    }

    /// A new read handle on this table.
    pub fn reader(&self) -> CacheReader {
        CacheReader {
            table: Arc::clone(&self.table),
        }
    }

    /// Number of live items.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the table holds no live item.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Number of tombstones (slots holding a key's version floor).
    pub fn tombstones(&self) -> usize {
        self.tombstones
    }

    /// Number of slots (four per bucket).
    pub fn capacity(&self) -> usize {
        self.table.buckets.len() * SLOTS
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.table.buckets.len()
    }

    /// Bytes allocated for the table (bucket array and the writer's search queue).
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes
    }

    /// The two candidate buckets of `key` (diagnostics and tests).
    pub fn candidate_buckets(&self, key: u64) -> (usize, usize) {
        self.table.candidates(key)
    }

    /// Counters of the writer's operations.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            live: self.live,
            tombstones: self.tombstones,
            ..self.stats
        }
    }

    /// The live item for `key` (writer-side read, no retry needed).
    pub fn get(&self, key: u64) -> Option<CacheItem> {
        match self.locate(key) {
            Some((b, s, SlotState::Live)) => Some(self.table.bucket(b).read_item(s, key)),
            _ => None,
        }
    }

    /// The lowest version an insert of `key` would currently be accepted with (0 when any).
    pub fn min_version(&self, key: u64) -> u64 {
        match self.locate(key) {
            Some((b, s, _)) => self.table.bucket(b).version(s),
            None => self.bucket_floor(key),
        }
    }

    /// Insert `item`, unless the table knows a strictly newer version of its key.
    ///
    /// * live item with version `<= item.version`: replaced in place (`Replaced(old)`);
    /// * tombstone with floor `<= item.version`: replaced (`Inserted`);
    /// * absent key: inserted (`Inserted`) unless a bucket floor of its candidates is above
    ///   `item.version`; a cuckoo path of at most `max_path` moves is used when both candidate
    ///   buckets are full;
    /// * otherwise a no-op (`Stale`).
    ///
    /// `Err(Full(item))` when no path exists; the table is then unchanged.
    pub fn insert(&mut self, item: CacheItem) -> Result<InsertOutcome, InsertError> {
        let (i1, i2) = self.table.candidates(item.key);
        // Both candidates are read below and the item usually goes into the first one: start
        // all the loads at once.
        self.table.bucket(i1).prefetch(true);
        self.table.bucket(i2).prefetch(false);
        if let Some(outcome) = self.update_existing(&item) {
            return Ok(outcome);
        }
        let floor = self
            .table
            .bucket(i1)
            .floor()
            .max(self.table.bucket(i2).floor());
        if item.version < floor {
            self.stats.stale += 1;
            return Ok(InsertOutcome::Stale { min_version: floor });
        }
        match self.find_path(i1, i2) {
            Some((node, slot)) => {
                self.execute_path(node, slot, &item);
                self.live += 1;
                self.stats.inserts += 1;
                Ok(InsertOutcome::Inserted)
            }
            None => {
                self.stats.full += 1;
                Err(InsertError::Full(item))
            }
        }
    }

    /// Like [`CacheWriter::insert`], but when the table is full a live item of the key's first
    /// candidate bucket is evicted (round robin over its slots) and returned as
    /// `Evicted(old)`. The bucket floor is raised to the evicted version, so a late insert of
    /// an older version of the evicted key cannot come back.
    pub fn insert_evicting(&mut self, item: CacheItem) -> InsertOutcome {
        let item = match self.insert(item) {
            Ok(outcome) => return outcome,
            Err(InsertError::Full(item)) => item,
        };
        let (i1, _) = self.table.candidates(item.key);
        let b = self.table.bucket(i1);
        let slot = self.evict_cursor % SLOTS;
        self.evict_cursor = self.evict_cursor.wrapping_add(1);
        let states = b.states();
        // The search found no empty or tombstone slot, so every slot here is live.
        assert_eq!(
            state(states, slot),
            SlotState::Live,
            "full bucket with a free slot"
        );
        let victim = b.read_item(slot, b.key(slot));
        let before = b.begin_write();
        b.store_item(slot, &item);
        b.end_write(before, states);
        if b.raise_floor(victim.version) {
            self.stats.floor_raises += 1;
        }
        self.stats.evictions += 1;
        self.stats.inserts += 1;
        InsertOutcome::Evicted(victim)
    }

    /// Invalidate every version `<= version` of `key`: a live item with such a version becomes
    /// a tombstone (`Removed(old)`), and later inserts of `key` with a version `<= version` are
    /// no-ops. A live item newer than `version` is kept (`KeptNewer`). With no live item the
    /// floor is recorded in a tombstone (`Tombstone`) or, when both candidate buckets are full,
    /// in the first candidate's bucket floor (`BucketFloor`).
    pub fn invalidate(&mut self, key: u64, version: u64) -> InvalidateOutcome {
        let floor = version.saturating_add(1);
        self.stats.invalidations += 1;
        match self.locate(key) {
            Some((bi, slot, SlotState::Live)) => {
                let b = self.table.bucket(bi);
                let cur = b.read_item(slot, key);
                if cur.version > version {
                    return InvalidateOutcome::KeptNewer(cur);
                }
                let before = b.begin_write();
                b.store_tomb(slot, key, floor);
                b.end_write(
                    before,
                    with_state(before & STATE_MASK, slot, SlotState::Tomb),
                );
                self.live -= 1;
                self.tombstones += 1;
                InvalidateOutcome::Removed(cur)
            }
            Some((bi, slot, _)) => {
                let b = self.table.bucket(bi);
                if floor > b.version(slot) {
                    let before = b.begin_write();
                    b.store_tomb(slot, key, floor);
                    b.end_write(before, before & STATE_MASK);
                }
                InvalidateOutcome::Tombstone
            }
            None => {
                // The key may have lost a record into a bucket floor before: a new tombstone
                // must not accept less than that.
                let floor = floor.max(self.bucket_floor(key));
                let (i1, i2) = self.table.candidates(key);
                for bi in [i1, i2] {
                    let b = self.table.bucket(bi);
                    let states = b.states();
                    if let Some(slot) = first_in_state(states, SlotState::Empty) {
                        let before = b.begin_write();
                        b.store_tomb(slot, key, floor);
                        b.end_write(before, with_state(states, slot, SlotState::Tomb));
                        self.tombstones += 1;
                        return InvalidateOutcome::Tombstone;
                    }
                }
                if self.table.bucket(i1).raise_floor(floor) {
                    self.stats.floor_raises += 1;
                }
                InvalidateOutcome::BucketFloor
            }
        }
    }

    /// Remove the live item of `key`, without recording any floor (a tombstone of `key` is
    /// left as it is). Use [`CacheWriter::invalidate`] when late inserts must not resurrect it.
    pub fn remove(&mut self, key: u64) -> Option<CacheItem> {
        let (bi, slot, st) = self.locate(key)?;
        if st != SlotState::Live {
            return None;
        }
        let b = self.table.bucket(bi);
        let item = b.read_item(slot, key);
        let before = b.begin_write();
        b.end_write(
            before,
            with_state(before & STATE_MASK, slot, SlotState::Empty),
        );
        self.live -= 1;
        self.stats.removes += 1;
        Some(item)
    }

    /// Drop every tombstone whose floor is `<= watermark`, for a caller that knows no insert
    /// with a version below `watermark` can arrive any more. Scans the whole table; returns the
    /// number of tombstones dropped.
    pub fn reclaim_tombstones(&mut self, watermark: u64) -> usize {
        let mut dropped = 0;
        for b in self.table.buckets.iter() {
            let states = b.states();
            let mut next = states;
            for slot in 0..SLOTS {
                if state(states, slot) == SlotState::Tomb && b.version(slot) <= watermark {
                    next = with_state(next, slot, SlotState::Empty);
                    dropped += 1;
                }
            }
            if next != states {
                let before = b.begin_write();
                b.end_write(before, next);
            }
        }
        self.tombstones -= dropped;
        dropped
    }

    // ----- internals ---------------------------------------------------------------------

    /// Bucket, slot and state of the (live or tombstone) slot holding `key`, if any.
    fn locate(&self, key: u64) -> Option<(usize, usize, SlotState)> {
        let (i1, i2) = self.table.candidates(key);
        let mut found = None;
        for bi in [i1, i2] {
            let b = self.table.bucket(bi);
            let states = b.states();
            for slot in 0..SLOTS {
                let st = state(states, slot);
                if st != SlotState::Empty && b.key(slot) == key {
                    debug_assert!(found.is_none(), "key {key:#x} held by two slots");
                    found = Some((bi, slot, st));
                    if !cfg!(debug_assertions) {
                        return found;
                    }
                }
            }
        }
        found
    }

    /// The larger bucket floor of `key`'s two candidate buckets.
    fn bucket_floor(&self, key: u64) -> u64 {
        let (i1, i2) = self.table.candidates(key);
        self.table
            .bucket(i1)
            .floor()
            .max(self.table.bucket(i2).floor())
    }

    /// Apply `item` to the slot already holding its key, if there is one.
    fn update_existing(&mut self, item: &CacheItem) -> Option<InsertOutcome> {
        let (bi, slot, st) = self.locate(item.key)?;
        let b = self.table.bucket(bi);
        let current = b.version(slot);
        if item.version < current {
            self.stats.stale += 1;
            return Some(InsertOutcome::Stale {
                min_version: current,
            });
        }
        let old = b.read_item(slot, item.key);
        let before = b.begin_write();
        b.store_item(slot, item);
        b.end_write(
            before,
            with_state(before & STATE_MASK, slot, SlotState::Live),
        );
        Some(match st {
            SlotState::Live => {
                self.stats.updates += 1;
                InsertOutcome::Replaced(old)
            }
            _ => {
                self.tombstones -= 1;
                self.live += 1;
                self.stats.inserts += 1;
                InsertOutcome::Inserted
            }
        })
    }

    /// Breadth-first search from buckets `i1` and `i2` for the shallowest bucket with a free
    /// slot, reached by moving each item on the path to its alternate bucket. Empty slots are
    /// preferred to tombstones at equal depth. Returns the queue index of the final node and the
    /// free slot in its bucket. Only reads the table.
    fn find_path(&mut self, i1: usize, i2: usize) -> Option<(usize, usize)> {
        self.queue.clear();
        self.queue.push(Node {
            bucket: i1,
            parent: ROOT,
            slot: 0,
            depth: 0,
        });
        self.queue.push(Node {
            bucket: i2,
            parent: ROOT,
            slot: 0,
            depth: 0,
        });
        let mut fallback: Option<(usize, usize, u8)> = None;
        let mut head = 0;
        while head < self.queue.len() {
            let node = self.queue[head];
            if let Some((fi, fs, fd)) = fallback {
                if fd < node.depth {
                    return Some((fi, fs));
                }
            }
            let b = self.table.bucket(node.bucket);
            let states = b.states();
            if let Some(slot) = first_in_state(states, SlotState::Empty) {
                return Some((head, slot));
            }
            if fallback.is_none() {
                if let Some(slot) = first_in_state(states, SlotState::Tomb) {
                    fallback = Some((head, slot, node.depth));
                }
            }
            if usize::from(node.depth) < self.max_path {
                for slot in 0..SLOTS {
                    if state(states, slot) != SlotState::Live {
                        continue;
                    }
                    if self.queue.len() == self.queue.capacity() {
                        break;
                    }
                    let alt = self.table.alternate(b.key(slot), node.bucket);
                    self.queue.push(Node {
                        bucket: alt,
                        parent: head as u32,
                        slot: slot as u8,
                        depth: node.depth + 1,
                    });
                }
            }
            head += 1;
        }
        fallback.map(|(fi, fs, _)| (fi, fs))
    }

    /// Execute the cuckoo path ending at queue node `end`, free slot `slot`, and store `item`
    /// at its start. Each item is copied into its new bucket before its old slot is overwritten
    /// by the next one, so no key is ever absent from both of its buckets.
    fn execute_path(&mut self, end: usize, slot: usize, item: &CacheItem) {
        let mut node = self.queue[end];
        let mut slot = slot;
        // The free slot at the end may hold a tombstone: fold its floor into the bucket floor.
        let b_end = self.table.bucket(node.bucket);
        let end_states = b_end.states();
        if state(end_states, slot) == SlotState::Tomb {
            if b_end.raise_floor(b_end.version(slot)) {
                self.stats.floor_raises += 1;
            }
            self.tombstones -= 1;
            self.stats.tombstones_reclaimed += 1;
        } else {
            assert_eq!(
                state(end_states, slot),
                SlotState::Empty,
                "path ends at a live slot"
            );
        }
        // Key whose old copy the current slot holds (`None` at the free end of the path).
        let mut moved_from_here: Option<u64> = None;
        loop {
            let b = self.table.bucket(node.bucket);
            let states = b.states();
            match moved_from_here {
                None => assert_ne!(state(states, slot), SlotState::Live),
                Some(key) => {
                    assert_eq!(state(states, slot), SlotState::Live);
                    assert_eq!(b.key(slot), key, "cuckoo path visits a slot twice");
                }
            }
            let incoming = if node.parent == ROOT {
                *item
            } else {
                let parent = self.queue[node.parent as usize];
                let src = self.table.bucket(parent.bucket);
                let from = usize::from(node.slot);
                assert_eq!(state(src.states(), from), SlotState::Live);
                let key = src.key(from);
                assert_eq!(self.table.alternate(key, parent.bucket), node.bucket);
                src.read_item(from, key)
            };
            let before = b.begin_write();
            b.store_item(slot, &incoming);
            b.end_write(before, with_state(states, slot, SlotState::Live));
            if node.parent == ROOT {
                return;
            }
            self.stats.moves += 1;
            moved_from_here = Some(incoming.key);
            slot = usize::from(node.slot);
            node = self.queue[node.parent as usize];
        }
    }

    /// Check the table's structural invariants (tests and debugging; scans the whole table):
    /// every non-empty slot sits in one of its key's candidate buckets, no key occupies two
    /// slots, no write section is open, and the live and tombstone counts are exact.
    pub fn check_invariants(&self) {
        let mut live = 0;
        let mut tombs = 0;
        for (bi, b) in self.table.buckets.iter().enumerate() {
            assert!(!is_busy(b.header_acquire()));
            let states = b.states();
            for slot in 0..SLOTS {
                let st = state(states, slot);
                if st == SlotState::Empty {
                    continue;
                }
                let key = b.key(slot);
                let (i1, i2) = self.table.candidates(key);
                assert!(
                    bi == i1 || bi == i2,
                    "key {key:#x} in bucket {bi}, not {i1}/{i2}"
                );
                assert_eq!(self.locate(key), Some((bi, slot, st)));
                match st {
                    SlotState::Live => live += 1,
                    _ => tombs += 1,
                }
            }
        }
        assert_eq!(live, self.live);
        assert_eq!(tombs, self.tombstones);
    }

    /// Test hook: bucket and state of the slot holding `key`.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn slot_of(&self, key: u64) -> Option<(usize, usize, bool)> {
        self.locate(key)
            .map(|(b, s, st)| (b, s, st == SlotState::Live))
    }

    /// Test hook: the bucket floor of `bucket`.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn floor_of(&self, bucket: usize) -> u64 {
        self.table.bucket(bucket).floor()
    }
}
