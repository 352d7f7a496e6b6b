//! dds-fs: the DPU file service of DDS (VLDB'24, §4.3).
//!
//! The service owns a storage device, divides it into fixed-length segments aligned to the
//! block size, groups files in flat directories and keeps every file's own segment vector in
//! reserved metadata segments (see `docs/on-disk-format.md`). Metadata changes are durable
//! (checksummed log + checkpoints, fdatasync) before they are reported: the synchronous calls
//! return then, and [`FileService::submit_meta`] / [`FileService::poll_meta`] queue them and
//! report them later, their writes and syncs running on a metadata thread
//! ([`FileService::start_meta_thread`]) while the caller keeps driving the data path.
//! Reads, writes and flushes are asynchronous: [`FileService::submit_read`],
//! [`FileService::submit_write`], [`FileService::submit_flush`], then
//! [`FileService::poll`].
//!
//! The service is driven by one thread (the DPU service thread): it is `Send` but not `Sync`
//! and takes no locks; the metadata thread, if started, shares nothing with it but two
//! channels (jobs in, results out) and owns its own device handle.
//!
//! ```no_run
//! use dds_fs::{format, FileService, FormatConfig, OpenConfig, UringDevice};
//! UringDevice::create_file("/tmp/dds.dev", 1 << 30).unwrap();
//! let mut dev = UringDevice::open("/tmp/dds.dev", 128).unwrap();
//! format(&mut dev, FormatConfig::default()).unwrap();
//! let mut fs = FileService::open(Box::new(dev), OpenConfig::default()).unwrap();
//! let id = fs.create_file("/data/log").unwrap_or_else(|_| {
//!     fs.create_dir("/data").unwrap();
//!     fs.create_file("/data/log").unwrap()
//! });
//! let buf = vec![7u8; 1000];
//! // SAFETY: `buf` outlives the operation (we wait for its completion below).
//! unsafe { fs.submit_write(id, 0, buf.as_ptr(), 1000, 1).unwrap() };
//! let mut done = false;
//! while !done {
//!     fs.wait().unwrap();
//!     fs.poll(|ud, res| { assert_eq!((ud, res), (1, Ok(1000))); done = true; });
//! }
//! ```

pub mod align;
mod codec;
mod commit;
pub mod device;
mod error;
mod io;
mod journal;
mod layout;
mod meta;
mod service;
mod types;

pub use device::{
    DevCompletion, DevOp, Device, DeviceBusy, DeviceLock, FaultInjector, MemDevice, MetaIo,
    SyncGate, UringDevice, DEFAULT_QUEUE_DEPTH,
};
pub use error::FsError;
pub use layout::{
    FormatConfig, DEFAULT_LOG_BYTES, DEFAULT_MAX_DIRS, DEFAULT_MAX_FILES, DEFAULT_MAX_NAME_LEN,
    DEFAULT_SEGMENT_SIZE, MAX_DIRS_LIMIT, MAX_FILES_LIMIT, MAX_NAME_LEN_LIMIT, SUPERBLOCK_MAGIC,
};
pub use service::{check, format, CheckReport, FileService, MetaDone, MetaOp};
pub use types::{DirEntry, EntryKind, FileId, FileInfo, OpenConfig, SpaceInfo};
