//! dds-offload: the DDS offload engine and traffic director (VLDB'24 §5–§6).
//!
//! * [`OffloadApp`]: the offload API of Table 1 (framing, offload predicate, offload function,
//!   response builder, host-message builder, cache-on-write, invalidate-on-read), with the
//!   built-in [`PagestoreApp`] and the log-structured [`KvApp`].
//! * [`plugin`]: the C ABI (`include/dds_offload.h`) and a loader turning a shared library into
//!   an `Arc<dyn OffloadApp>`.
//! * [`FileReadPort`]: bounded queues between director threads and the DPU service thread that
//!   owns the file service; [`CacheMaintainer`]: the cache writer's hooks on that thread.
//! * [`Director`]: the TCP-splitting traffic director with the offload engine (pre-allocated
//!   read buffers with header room, contexts of outstanding reads, in-order merge, zero-copy or
//!   copy send).
//!
//! See `docs/offload.md` and `docs/consistency.md`.

#![warn(missing_docs)]

pub mod api;
pub mod director;
mod engine;
pub mod kv;
pub mod maintain;
pub mod pagestore;
pub mod plugin;
pub mod port;
pub mod records;
pub mod signature;

pub use api::{
    CacheView, FixedList, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult,
    ReqDesc, ReqList, ResponseLayout,
};
pub use director::{Director, DirectorConfig, DirectorHandle, DirectorStats};
pub use kv::KvApp;
pub use maintain::{CacheMaintainer, MaintainerStats};
pub use pagestore::{PagestoreApp, PagestoreConfig};
pub use port::{Busy, FileReadPort, LaneHandle, PortConfig, PortRead, PortResult, PortService};
pub use signature::{Proto, Signature};
