//! dds-offload-engine: the DPU side of the offload API (VLDB'24 §6.2), without sockets and
//! without the file service.
//!
//! * [`Planner`]: the decision for one client message (offload predicate, offload function,
//!   keys to invalidate), a pure step.
//! * [`Pool`]: pre-allocated read buffers with header room in front (Fig. 12) and the
//!   contexts of outstanding offloaded reads.
//! * [`FileReadPort`]: bounded queues between the director threads and the thread that owns
//!   the file service, which it reaches through the [`ReadTarget`] trait.
//! * [`ExposedFiles`]: the files the application exposed; nothing else is read on the DPU.
//! * [`CacheMaintainer`]: the cache table's single writer, running the app's cache-on-write
//!   and invalidate-on-read hooks.
//!
//! The traffic director (`dds-director`) drives these per connection; the DPU daemon
//! (`dds-dpu`) wires them to its service thread. See `docs/offload.md`.

#![warn(missing_docs)]

pub mod exposed;
pub mod maintain;
pub mod plan;
pub mod pool;
pub mod port;
pub mod records;

pub use exposed::ExposedFiles;
pub use maintain::{CacheMaintainer, MaintainerStats};
pub use plan::{PlanSummary, Planned, Planner, Sources};
pub use pool::{Ctx, CtxState, Pool};
pub use port::{
    Busy, FileReadPort, LaneHandle, PortConfig, PortRead, PortResult, PortService, ReadTarget,
    Refused,
};
