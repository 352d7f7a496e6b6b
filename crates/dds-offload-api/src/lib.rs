//! dds-offload-api: what an application supplies to the DDS offload engine (VLDB'24 §6.1).
//!
//! * [`OffloadApp`]: the user functions of Table 1 (framing, offload predicate, offload
//!   function, response builder, host-message builder, cache-on-write, invalidate-on-read) as
//!   a Rust trait, with the bounded lists ([`FixedList`]) they fill and the [`CacheView`] they
//!   read.
//! * [`plugin`]: the same API as a C ABI (`include/dds_offload.h`) and a loader turning a
//!   shared library into an `Arc<dyn OffloadApp>`.
//! * [`Registry`]: offload apps by name, so the DPU daemon names no application itself.
//!
//! The engine that runs these functions is `dds-offload-engine`; the traffic director that
//! calls them per message is `dds-director`. See `docs/offload.md`.

#![warn(missing_docs)]

pub mod api;
mod keys;
pub mod plugin;
mod registry;

pub use api::request_prefix;
pub use api::{
    CacheView, FixedList, Full, ItemList, KeyList, Malformed, Offload, OffloadApp, Phase, ReadOp,
    ReadResult, ReqDesc, ReqList, ResponseLayout, Session, ERROR_REPLY_MAX, HOST_MESSAGE_SLACK,
    MAX_HEADER_ROOM, REQUEST_HEAD_BYTES, TOO_BIG,
};
pub use keys::{KeyMap, MapFull};
pub use registry::{AppOptions, Registry, RegistryError};
