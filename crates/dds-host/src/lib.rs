//! The DDS host file library (§4.2 of the DDS paper).
//!
//! File execution runs in the DPU's file service; this library keeps only what the host
//! needs: a control connection for metadata operations and, per notification group, a request
//! ring and a response ring in shared memory that the DPU reaches by DMA. Reads, writes and
//! flushes are non-blocking and complete through [`Group::poll_wait`], which either returns at
//! once (non-blocking mode) or sleeps until the DPU's "interrupt" (an eventfd write) or a
//! timeout. Many threads may issue and poll concurrently.

mod buffer;
mod conn;
mod error;
mod group;

pub use buffer::RegisteredBuffer;
pub use conn::{Config, Dds};
pub use dds_proto::cache_records::CacheRecordItem;
pub use dds_proto::control::{DirEntry, EntryKind, FileInfo, HelloInfo, SpaceInfo};
pub use dds_proto::Status;
pub use error::{DdsError, Result};
pub use group::{Completion, Group, GroupConfig, IoVec};

/// Default control socket of `dds dpu`: `dpu.sock` in the user's private runtime directory
/// (`$XDG_RUNTIME_DIR/dds`, `/run/dds` for root, otherwise `/tmp/dds-$UID`).
pub use dds_proto::control::default_socket_path;
