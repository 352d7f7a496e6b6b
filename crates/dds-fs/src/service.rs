//! The DPU file service: its state, and where each of its methods lives.
//!
//! [`FileService`] is one struct; its methods are grouped by concern, one `impl` per file:
//!
//! - `service/lifecycle.rs`: [`format`], open (recovery, tail re-zeroing), memory
//!   registration, close ([`FileService::into_device`], drop);
//! - `service/recovery.rs`: reading the superblock, checkpoint and log (open and [`check`]);
//! - `service/info.rs`: the formatted limits and usage the service reports;
//! - `service/namespace.rs`: paths and names, and the metadata operations by path or id
//!   (create, delete, rename, resize, stat, list);
//! - `service/metaq.rs`: the metadata queue that runs those operations without blocking the
//!   data path ([`FileService::submit_meta`], [`FileService::poll_meta`], the metadata
//!   thread); `service/prepare.rs`: how each operation is validated and prepared as a job;
//!   `service/extend.rs`: the size changes of writes past the end of file;
//! - `io.rs`: the data path (reads, writes, flushes, `poll`, `wait`); `io/parked.rs`: writes
//!   parked until their file's size grows; `io/slots.rs`: the data path's op slots and
//!   queues.

use crate::commit::Executor;
use crate::device::Device;
use crate::io::DataPath;
use crate::layout::Geometry;
use crate::meta::MetaState;

mod extend;
mod info;
mod lifecycle;
mod metaq;
mod namespace;
mod prepare;
mod recovery;

pub use lifecycle::format;
use metaq::MetaQueue;
pub use metaq::{MetaDone, MetaOp};
pub use recovery::{check, CheckReport};

/// Per-file data-path bookkeeping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileIo {
    /// Data operations of this file that have not completed.
    pub inflight: u32,
    /// Write operations of this file that have not completed.
    pub writes: u32,
    /// The file's unfinished writes as a list through their slots, in submission order:
    /// first and last slot (`NO_SLOT` when empty). A new write checks only these for
    /// conflicts.
    pub first_write: u32,
    pub last_write: u32,
    /// A pending delete or shrink of this file: new reads and writes are refused (`Busy`).
    pub fenced: bool,
    /// Writes of this file waiting for its size to grow (parked in the data path, counted
    /// in `inflight` and `writes`; `io/parked.rs`, `service/extend.rs`).
    pub parked: u32,
    /// The largest end among those writes: the size the file's next extend commits (0 when
    /// none waits).
    pub want: u64,
    /// The size the extend of this file with the committer grows it to (0: none is).
    pub committing: u64,
    /// An extend of this file waits in the metadata queue.
    pub extend_queued: bool,
}

/// No slot (end of a list).
pub(crate) const NO_SLOT: u32 = u32::MAX;

impl Default for FileIo {
    fn default() -> Self {
        FileIo {
            inflight: 0,
            writes: 0,
            first_write: NO_SLOT,
            last_write: NO_SLOT,
            fenced: false,
            parked: 0,
            want: 0,
            committing: 0,
            extend_queued: false,
        }
    }
}

/// The DPU file service. Single-threaded: owned and driven by the DPU service thread.
pub struct FileService {
    pub(crate) dev: Box<dyn Device>,
    pub(crate) geom: Geometry,
    /// The metadata as of the last change made durable and applied.
    pub(crate) meta: MetaState,
    /// Makes metadata changes durable: inline or on the metadata thread (`commit.rs`).
    exec: Executor,
    /// Metadata operations queued, active and finished (`service/metaq.rs`).
    mq: MetaQueue,
    /// Set after a metadata write/sync failure: no further changes until reopened.
    failed: Option<String>,
    pub(crate) bs: u64,
    pub(crate) align: usize,
    /// Next file slot to try (round robin, so slots and ids are not reused quickly).
    next_file_slot: u32,
    pub(crate) files_io: Vec<FileIo>,
    pub(crate) dp: DataPath,
}

// SAFETY: raw pointers held by the data path refer to caller buffers whose validity the
// submit contract guarantees; nothing is tied to the creating thread. Not Sync.
unsafe impl Send for FileService {}
