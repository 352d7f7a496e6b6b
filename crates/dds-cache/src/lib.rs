//! DDS cache table: the offload engine's map from application keys to file locations
//! (§6.2 of the DDS paper), built for one writer and many lock-free readers.
//!
//! * Bucketized cuckoo hashing: two seeded hash functions, four slots per bucket, a
//!   power-of-two number of 192-byte buckets fixed at construction. Inserts into two full
//!   candidate buckets displace items along the shortest path found by a bounded breadth-first
//!   search; when there is none the insert fails with [`InsertError::Full`] and the table is
//!   unchanged.
//! * Concurrency: a single [`CacheWriter`] (not `Clone`) and any number of [`CacheReader`]s
//!   (`Clone + Send + Sync`). Each bucket has a sequence word (a sequence lock): the writer
//!   makes it odd while modifying the bucket, readers retry when it is odd or changed. Every
//!   field is an atomic, so readers never see a torn item and there is no data race. Items
//!   are copied to their new bucket before being removed from the old one, so a key present
//!   throughout a lookup is always found.
//! * Versions: an insert never replaces a newer version; [`CacheWriter::invalidate`] leaves a
//!   version floor (a tombstone in the slot, or a bucket floor when space is short) so a late
//!   insert of an invalidated version is a no-op.
//! * Memory is allocated once, in [`CacheWriter::new`]; lookups and inserts never allocate.
//!
//! The design, byte layout and protocol are described in `docs/cache-table.md`.
//!
//! ```
//! use dds_cache::{CacheItem, CacheWriter, Config, InsertOutcome};
//!
//! let mut writer = CacheWriter::new(Config::for_items(1000)).unwrap();
//! let reader = writer.reader();
//! let item = CacheItem::new(42, 1, 7, 8192, 1024);
//! assert_eq!(writer.insert(item), Ok(InsertOutcome::Inserted));
//! assert_eq!(reader.get(42), Some(item));
//! writer.invalidate(42, 1);
//! assert_eq!(reader.get(42), None);
//! // A late insert of the invalidated version is a no-op.
//! assert_eq!(writer.insert(item), Ok(InsertOutcome::Stale { min_version: 2 }));
//! ```

#![warn(missing_docs)]

mod bucket;
mod hash;
mod storage;
mod sync;
mod table;

#[cfg(not(loom))]
#[cfg(feature = "bench")]
pub mod bench;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

use serde::{Deserialize, Serialize};

pub use bucket::{BUCKET_BYTES, SLOTS};
pub use hash::fmix64;
pub use table::{CacheReader, CacheWriter};

/// One cached object: where the bytes of `key` (at `version`) live in the file service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CacheItem {
    /// Application key.
    pub key: u64,
    /// Version of the object (for example the log sequence number of the write that stored
    /// it). Larger is newer.
    pub version: u64,
    /// File holding the object.
    pub file_id: u32,
    /// Byte offset of the object in the file.
    pub offset: u64,
    /// Size of the object in bytes.
    pub size: u32,
    /// Free word for the application; stored and returned untouched.
    pub tag: u64,
}

impl CacheItem {
    /// An item with a zero tag.
    pub const fn new(key: u64, version: u64, file_id: u32, offset: u64, size: u32) -> Self {
        CacheItem {
            key,
            version,
            file_id,
            offset,
            size,
            tag: 0,
        }
    }
}

/// What [`CacheWriter::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The key was absent (or only a tombstone) and now holds the item.
    Inserted,
    /// The key held this older (or equal) version, now replaced.
    Replaced(CacheItem),
    /// No-op: the table only accepts versions `>= min_version` for this key (a newer live
    /// item, a tombstone floor, or a bucket floor).
    Stale {
        /// Lowest version an insert of this key is currently accepted with.
        min_version: u64,
    },
    /// ([`CacheWriter::insert_evicting`] only) the table was full: this live item was evicted
    /// to make room, and the new item is inserted.
    Evicted(CacheItem),
}

/// What [`CacheWriter::invalidate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidateOutcome {
    /// The live item (this one) was removed; a tombstone holds the new floor.
    Removed(CacheItem),
    /// The live item is newer than the invalidated version and was kept.
    KeptNewer(CacheItem),
    /// No live item; the floor is held by a (new or existing) tombstone.
    Tombstone,
    /// No live item and no free slot for a tombstone; the floor was folded into the bucket
    /// floor of the key's first candidate bucket.
    BucketFloor,
}

/// Why an insert failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InsertError {
    /// No free slot within `max_path` moves; the item was not inserted and the table is
    /// unchanged.
    #[error("cache table full: no cuckoo path for key {:#x}", .0.key)]
    Full(CacheItem),
}

/// Invalid table configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The bucket count must be a power of two, at least 2.
    #[error("bucket count {0} is not a power of two >= 2")]
    Buckets(usize),
    /// The bucket array would not fit in the address space.
    #[error("bucket count {0} is too large")]
    TooLarge(usize),
    /// `max_path` must be at most [`Config::MAX_PATH_LIMIT`].
    #[error("max_path {0} exceeds {limit}", limit = Config::MAX_PATH_LIMIT)]
    MaxPath(usize),
    /// The two hash seeds must differ.
    #[error("the two hash seeds are equal")]
    Seeds,
}

/// Table geometry and hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// Number of buckets: a power of two, at least 2. Capacity is `4 * buckets` slots.
    pub buckets: usize,
    /// Seeds of the two hash functions (must differ).
    pub seeds: [u64; 2],
    /// Longest cuckoo path (number of items moved) an insert may use.
    pub max_path: usize,
}

impl Config {
    /// Default longest cuckoo path.
    pub const DEFAULT_MAX_PATH: usize = 5;
    /// Upper bound of `max_path` (the search queue grows as `4^max_path`).
    pub const MAX_PATH_LIMIT: usize = 8;
    /// Default hash seeds.
    pub const DEFAULT_SEEDS: [u64; 2] = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];
    /// Highest load `for_items` plans for.
    pub const TARGET_LOAD: f64 = 0.9;

    /// A table of exactly `buckets` buckets with default seeds and path bound.
    pub const fn with_buckets(buckets: usize) -> Self {
        Config {
            buckets,
            seeds: Self::DEFAULT_SEEDS,
            max_path: Self::DEFAULT_MAX_PATH,
        }
    }

    /// The smallest table that holds `items` items at a load of at most
    /// [`Config::TARGET_LOAD`].
    pub fn for_items(items: usize) -> Self {
        let slots = (items as f64 / Self::TARGET_LOAD).ceil() as usize;
        // An impossible size saturates and is refused by `CacheWriter::new` (`TooLarge`).
        let buckets = slots
            .div_ceil(SLOTS)
            .checked_next_power_of_two()
            .unwrap_or(usize::MAX);
        let buckets = buckets.max(2);
        Self::with_buckets(buckets)
    }

    /// Same configuration with other hash seeds.
    pub const fn seeds(self, seeds: [u64; 2]) -> Self {
        Config { seeds, ..self }
    }

    /// Same configuration with another path bound.
    pub const fn max_path(self, max_path: usize) -> Self {
        Config { max_path, ..self }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bytes = self.buckets.checked_mul(BUCKET_BYTES);
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(ConfigError::TooLarge(self.buckets));
        }
        if self.buckets < 2 || !self.buckets.is_power_of_two() {
            return Err(ConfigError::Buckets(self.buckets));
        }
        if self.max_path > Self::MAX_PATH_LIMIT {
            return Err(ConfigError::MaxPath(self.max_path));
        }
        if self.seeds[0] == self.seeds[1] {
            return Err(ConfigError::Seeds);
        }
        Ok(())
    }
}

/// Counters kept by the writer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Live items now.
    pub live: usize,
    /// Tombstones now.
    pub tombstones: usize,
    /// Items inserted for an absent key (or over a tombstone).
    pub inserts: u64,
    /// Live items replaced by a newer or equal version.
    pub updates: u64,
    /// Inserts that were no-ops because of a newer version or a floor.
    pub stale: u64,
    /// Live items removed by `remove`.
    pub removes: u64,
    /// Calls of `invalidate`.
    pub invalidations: u64,
    /// Items moved to their alternate bucket by cuckoo displacement.
    pub moves: u64,
    /// Inserts that found no cuckoo path.
    pub full: u64,
    /// Tombstones whose slot was taken by an insert.
    pub tombstones_reclaimed: u64,
    /// Times a bucket floor was raised.
    pub floor_raises: u64,
    /// Live items evicted by `insert_evicting`.
    pub evictions: u64,
}
