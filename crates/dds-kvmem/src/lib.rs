//! DPU-KV's processing engine (`docs/dpu-kv.md` §1): a MICA-style in-memory key-value store.
//!
//! * **Partitions.** Keys are spread over partitions by the top bits of their 64-bit XXH3
//!   hash; a partition is owned by one worker (exclusive read and write, as MICA's EREW mode),
//!   so it needs no locks: [`Partition`] is `Send`, not shared.
//! * **Circular log.** A partition's items live in a circular log of `memory / partitions`
//!   bytes, appended at the tail; an update that fits the item's slot is done in place.
//! * **Bucketized index.** Buckets of seven 8-byte slots `(tag:16 | log offset:48)` in one
//!   64-byte line, plus an overflow link to spare buckets.
//! * **Lossless store mode.** MICA's cache mode evicts the log's head; here the head is
//!   compacted instead (live items move to the tail), and when the live data does not fit, the
//!   write fails with [`KvError::Full`]: nothing is ever evicted silently.

#![warn(missing_docs)]

mod partition;
pub mod qp;

pub use partition::{KvError, Partition, PartitionStats, MAX_KEY};

use xxhash_rust::xxh3::xxh3_64;

/// The 64-bit hash every placement decision is made from.
#[inline]
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// The partition of a key among `n`.
#[inline]
pub fn partition_of(hash: u64, n: usize) -> usize {
    ((hash >> 40) % n as u64) as usize
}

/// A whole store: `n` partitions (for one thread; workers each own a [`Partition`]).
pub struct Store {
    parts: Vec<Partition>,
}

impl Store {
    /// `partitions` partitions sharing `memory` bytes.
    pub fn new(partitions: usize, memory: usize) -> Result<Store, KvError> {
        Store::with_index(partitions, memory, Partition::default_index(memory))
    }

    /// `partitions` partitions sharing `memory` bytes, `index` of them for the indexes
    /// ([`Partition::with_index`]).
    pub fn with_index(partitions: usize, memory: usize, index: usize) -> Result<Store, KvError> {
        assert!(partitions > 0, "at least one partition");
        let per = memory / partitions;
        Ok(Store {
            parts: (0..partitions)
                .map(|_| Partition::with_index(per, index / partitions))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The partition holding `key`.
    pub fn part(&mut self, key: &[u8]) -> (&mut Partition, u64) {
        let h = key_hash(key);
        let n = self.parts.len();
        (&mut self.parts[partition_of(h, n)], h)
    }

    /// The partitions, to hand out to workers.
    pub fn into_partitions(self) -> Vec<Partition> {
        self.parts
    }

    /// Items in all partitions.
    pub fn len(&self) -> u64 {
        self.parts.iter().map(|p| p.len()).sum()
    }

    /// No items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
