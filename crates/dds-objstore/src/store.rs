//! [`ObjStore`]: the store's options, its shared state and its lifetime; the work is in the
//! submodules, one per responsibility: [`open`] (format, open, fsck), [`staging`] (validation
//! and staging in the caller's thread), [`epochs`] (reader epochs that hold freed blocks back),
//! [`reads`] (the [`ObjectStore`](crate::ObjectStore) reads) and [`commit`] (the committer
//! thread, group commit).

mod commit;
mod epochs;
mod open;
mod reads;
mod staging;

use crate::device::Device;
use crate::error::StoreError;
use crate::pool::BufPool;
use crate::tx::{ObjectId, MAX_NAME_LEN};
use crate::BLOCK_SIZE;
use crossbeam_channel::Sender;
use epochs::Epochs;
pub use open::FsckReport;
use redb::Database;
pub use staging::OnCommit;
use staging::Request;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const BS: u64 = BLOCK_SIZE as u64;
/// The smallest device: the superblock and 63 data blocks.
const MIN_DEVICE_BLOCKS: u64 = 64;
/// Largest allowed `max_object_size` (staging buffers are allocated whole).
const MAX_OBJECT_SIZE_CAP: u64 = 1 << 30;

/// Limits and tuning of a store. Every limit is checked before a transaction is queued and
/// fails it with [`StoreError::InvalidArgument`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Largest object size in bytes (writes and truncates beyond it fail).
    pub max_object_size: u64,
    /// Largest encoded transaction ([`Transaction::encoded_len`]).
    pub max_tx_bytes: usize,
    /// Most ops in one transaction.
    pub max_ops: usize,
    /// Longest object name (at most [`MAX_NAME_LEN`]); names may not be empty.
    pub max_name_len: usize,
    /// Longest xattr name (non-empty).
    pub max_xattr_name_len: usize,
    /// Longest xattr value.
    pub max_xattr_value_len: usize,
    /// Longest omap key.
    pub max_omap_key_len: usize,
    /// Longest omap value.
    pub max_omap_value_len: usize,
    /// Transactions that may wait for the committer (submitters block beyond it).
    pub queue_depth: usize,
    /// Bytes of idle staging buffers kept for reuse.
    pub staging_pool_bytes: usize,
    /// Most transactions in one group commit.
    pub max_batch_txs: usize,
    /// A group commit takes no more transactions once it holds this many data bytes.
    pub max_batch_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_object_size: 64 << 20,
            max_tx_bytes: 96 << 20,
            max_ops: 4096,
            max_name_len: MAX_NAME_LEN,
            max_xattr_name_len: 256,
            max_xattr_value_len: 64 << 10,
            max_omap_key_len: 4 << 10,
            max_omap_value_len: 64 << 10,
            queue_depth: 64,
            staging_pool_bytes: 64 << 20,
            max_batch_txs: 64,
            max_batch_bytes: 64 << 20,
        }
    }
}

struct Inner {
    dev: Device,
    db: Database,
    opts: StoreOptions,
    nblocks: u64,
    epochs: Mutex<Epochs>,
    allocated: AtomicU64,
    objects: AtomicU64,
    failed: AtomicBool,
    pool: BufPool,
}

fn not_found(oid: &ObjectId) -> StoreError {
    StoreError::NotFound(format!("object {oid}"))
}

fn bad_meta(oid: &ObjectId) -> StoreError {
    StoreError::Corrupt {
        pool: oid.pool,
        name: String::from_utf8_lossy(&oid.name).into_owned(),
        offset: 0,
        detail: "undecodable metadata".into(),
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The host object store. Dropping it stops the committer after the queued transactions.
pub struct ObjStore {
    inner: Arc<Inner>,
    queue: Option<Sender<Request>>,
    committer: Option<JoinHandle<()>>,
}

impl ObjStore {
    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }
}

impl Drop for ObjStore {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
    }
}

fn failed() -> StoreError {
    StoreError::io(
        "the store failed a metadata commit; reopen it",
        std::io::Error::other("store failed"),
    )
}

fn stopped() -> StoreError {
    StoreError::io(
        "the committer has stopped",
        std::io::Error::other("committer stopped"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::OBJECTS;
    use crate::tx::{Transaction, TxOp};
    use crate::ObjectStore;

    /// Blocks freed while a reader is registered stay unallocated until it is gone, however
    /// many commits come in between.
    #[test]
    fn freed_blocks_wait_for_older_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        ObjStore::format(&path, 2 << 20, false).unwrap(); // 511 data blocks
        let s = ObjStore::open(&path).unwrap();
        let o = ObjectId::new(1, "o");
        let write = |v: u8| {
            s.submit(&Transaction {
                ops: vec![TxOp::WriteFull {
                    oid: o.clone(),
                    data: vec![v; 64 * BLOCK_SIZE],
                }],
            })
        };
        write(0).unwrap();
        let guard = s.inner.reader();
        let old = {
            let r = s.inner.db.begin_read().unwrap();
            s.inner.onode(&r.open_table(OBJECTS).unwrap(), &o).unwrap()
        };
        // Without the quarantine, the 8th write would wrap around onto the old blocks.
        let mut ok = 0;
        for v in 1..=10 {
            match write(v) {
                Ok(()) => ok += 1,
                Err(StoreError::NoSpace { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(ok, 6, "the pinned blocks are not handed out");
        for (&lb, &blk) in &old.blocks {
            s.inner.read_verified(&o, lb, blk).unwrap();
        }
        drop(guard);
        write(99).unwrap();
        assert_eq!(s.read(&o, 0, 1).unwrap(), vec![99]);
    }
}
