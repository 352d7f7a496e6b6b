//! The host object store of a DDS object storage daemon (the BlueStore role in CODA §III/§V):
//! objects named by (pool, name) with data, xattrs and a small key-value map (omap), changed
//! only by atomic, durable [`Transaction`]s.
//!
//! Data lives in 4 KiB blocks of a fixed-size device file accessed through io_uring with
//! O_DIRECT, each block covered by a crc32c verified on every read. Metadata (objects, block
//! maps, xattrs, omap) and the allocation bitmap live in a redb database next to the device
//! (`<device>.meta`). Writes are copy-on-write: new data goes to newly allocated blocks, the
//! device is synced, then one redb commit switches the block maps and frees the old blocks, so
//! a crash leaves either the old or the new state. Concurrent submitters are group-committed
//! by one committer thread. `docs/objstore.md` describes the formats and limits.

mod alloc;
mod device;
mod error;
mod meta;
mod pool;
mod store;
mod tx;

pub use error::{DecodeError, StoreError};
pub use store::{FsckReport, ObjStore, OnCommit, StoreOptions};
pub use tx::{ObjRef, ObjectId, Transaction, TxOp, TxOpRef, MAX_NAME_LEN, TX_MAGIC, TX_VERSION};

/// Key-value pairs (xattrs, omap entries) in key order.
pub type KvPairs = Vec<(Vec<u8>, Vec<u8>)>;

/// Size of a data block and of the unit of checksums and allocation.
pub const BLOCK_SIZE: usize = 4096;

/// An object's size and last modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjStat {
    pub size: u64,
    /// Nanoseconds since the Unix epoch, set by the committing transaction.
    pub mtime_ns: u64,
}

/// Space and object counts of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Size of the device file.
    pub device_bytes: u64,
    /// [`BLOCK_SIZE`].
    pub block_size: u64,
    /// Bytes of the data area (the device less its superblock).
    pub data_bytes: u64,
    /// Bytes of the data area allocated to objects.
    pub allocated_bytes: u64,
    /// Objects in all pools.
    pub objects: u64,
}

/// The object store interface used by an OSD (locally, or remotely through a proxy).
pub trait ObjectStore: Send + Sync {
    /// Applies a transaction atomically; returns once it is durable. Concurrent callers are
    /// group-committed. A failing transaction applies nothing.
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError>;
    /// Reads up to `len` bytes at `offset` (short at the end of the object); checksum-verified.
    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError>;
    /// Size and mtime.
    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError>;
    /// One xattr.
    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError>;
    /// All xattrs, in name order.
    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError>;
    /// The omap values of `keys` (`None` for missing keys).
    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
    /// Up to `max` omap entries after `start_after`, in key order.
    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError>;
    /// Up to `max` object names of `pool` after `start_after`, in byte order.
    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Device size, allocated space and object count.
    fn statfs(&self) -> Result<StoreStats, StoreError>;
}
