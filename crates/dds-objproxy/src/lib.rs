//! The object store across the DPU–host boundary (CODA §V, `docs/objproxy.md`).
//!
//! * [`ProxyObjectStore`] (DPU side, module `dpu`) implements `dds_objstore::ObjectStore`:
//!   transactions and reads travel over DMA channels into host shared memory that it reaches
//!   only through a `dds_dma::DmaEngine` (Flow-Direct's data plane), metadata calls are RPCs
//!   over the control socket (the control plane). Small transactions are batched and large
//!   ones cut into pipelined chunks (Flow-Adapt); the submitting threads poll their own
//!   channel and match completions with a CAS-advanced highest completed req_id (Flow-Sync).
//! * [`HostProxy`] (host side, module `host`) owns the shared region of each DPU session,
//!   polls it with atomics and applies transactions through the real `ObjStore`, one ACK per
//!   batch once all of its transactions have committed.
//! * [`FaultyDma`] (DPU side, module `fault`) loses and duplicates DMA operations, for tests.
//! * Module `wire`: the formats both sides share (region layout, transfer headers, frames).
//!
//! The DPU-side modules (`dpu`, `fault`) do not name host shared memory or the host side;
//! `crates/dds-cli/tests/architecture.rs` checks it.

mod dpu;
mod fault;
mod host;
pub mod wire;

pub use dpu::{DmaFactory, ProxyObjectStore, ProxyOptions, ProxyStats};
pub use fault::{Faults, FaultyDma};
pub use host::{HostOptions, HostProxy, HostProxyHandle, HostStats};
