//! The processing engine as front ends and host workers share it: the partitions of a
//! `dds-kvmem` store, each behind its own lock (uncontended when one thread owns a partition,
//! as in `lat` and `sav`; `dual`'s spare-core front ends reach every partition).

use std::sync::{Arc, Mutex, MutexGuard};

use dds_kvmem::{key_hash, partition_of, KvError, Partition, Store};

/// The partition a [`SharedStore::holder`] holds locked.
pub struct Held<'a> {
    store: &'a SharedStore,
    held: Option<(usize, MutexGuard<'a, Partition>)>,
}

impl Held<'_> {
    /// The partition of a key whose hash is `h`, locked (the one held if it is that one).
    pub fn hashed(&mut self, h: u64) -> &mut Partition {
        let i = partition_of(h, self.store.parts.len());
        if self.held.as_ref().is_none_or(|(j, _)| *j != i) {
            // Released before the next is taken: a holder never holds two partitions.
            self.held = None;
            self.held = Some((i, self.store.lock_part(i)));
        }
        &mut self.held.as_mut().expect("just locked").1
    }
}

/// Partitions shared by the threads of one process.
#[derive(Clone)]
pub struct SharedStore {
    parts: Arc<Vec<Mutex<Partition>>>,
}

impl SharedStore {
    /// `partitions` partitions sharing `memory` bytes, `index` of them for the indexes (default
    /// an eighth of the memory).
    pub fn new(
        partitions: usize,
        memory: usize,
        index: Option<usize>,
    ) -> Result<SharedStore, KvError> {
        let parts = match index {
            Some(index) => Store::with_index(partitions, memory, index),
            None => Store::new(partitions, memory),
        }?
        .into_partitions();
        Ok(SharedStore {
            parts: Arc::new(parts.into_iter().map(Mutex::new).collect()),
        })
    }

    /// Partitions.
    pub fn partitions(&self) -> usize {
        self.parts.len()
    }

    /// The partition of `key`.
    pub fn lock(&self, key: &[u8]) -> MutexGuard<'_, Partition> {
        self.lock_hashed(key_hash(key))
    }

    /// The partition of a key whose hash is `h` ([`key_hash`]), locked.
    pub fn lock_hashed(&self, h: u64) -> MutexGuard<'_, Partition> {
        self.lock_part(partition_of(h, self.parts.len()))
    }

    /// Starts loading what the requests of `hashes` will read, without waiting for it: every
    /// index bucket first, then every item those buckets name (MICA's batch prefetch), so that
    /// a batch waits for memory about once instead of once per request.
    pub fn prefetch(&self, hashes: &[u64]) {
        let mut held = self.holder();
        for &h in hashes {
            held.hashed(h).prefetch_bucket(h);
        }
        for &h in hashes {
            held.hashed(h).prefetch_item(h);
        }
    }

    /// A holder that keeps the last partition it locked until a key of another one comes: a
    /// batch whose keys fall in one partition (every batch of `sav`, whose worker owns every
    /// partition of a single-core host) takes its lock once.
    pub fn holder(&self) -> Held<'_> {
        Held {
            store: self,
            held: None,
        }
    }

    /// Partition `i`.
    pub fn lock_part(&self, i: usize) -> MutexGuard<'_, Partition> {
        // A panic while a partition was locked leaves it as consistent as the panicking
        // operation left it: the partition's own invariants are asserted, not the lock's.
        self.parts[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Items in every partition.
    pub fn len(&self) -> u64 {
        (0..self.parts.len()).map(|i| self.lock_part(i).len()).sum()
    }

    /// No items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
