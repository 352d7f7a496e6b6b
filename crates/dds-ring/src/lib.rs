//! DMA-backed lock-free rings between host threads and the DPU (paper §4.1, Fig. 7 and 8).
//!
//! The byte format is specified in `docs/ring-format.md`. Two rings serve a notification group:
//!
//! * the **request ring** (MPSC): host threads insert records with [`RequestProducer`]
//!   (lock-free: a CAS on `Tail` reserves space, a `fetch_add` on `Progress` publishes); the
//!   DPU's [`RequestConsumer`] fetches everything new with one DMA read of `Progress`+`Tail`
//!   and one DMA read of the bytes (two at the wrap) into a local mirror, and writes `Head`
//!   back by DMA when done. Batching is natural: whatever producers inserted meanwhile moves in
//!   one transfer.
//! * the **response ring** (SPMC): the DPU's [`ResponseProducer`] allocates records in a local
//!   mirror with the same [`place`] arithmetic as the host producers, and delivers them with a
//!   DMA write of the bytes followed by one of `Tail`; host threads claim records with
//!   [`ResponseConsumer::try_pop`].
//!
//! The pointer protocols themselves are written against atomics only (module `protocol`) and
//! model checked with `loom` (`crates/dds-ring/loom.sh`).
//!
//! For the paper's Fig. 16 the crate also has two baselines behind the same
//! [`RingProducer`]/[`RingConsumer`] interface, [`FarmProducer`]/[`FarmConsumer`] (one slot
//! and two DMA operations per message) and [`LockedProducer`] (producers serialize on a lock),
//! and a benchmark (`bench::run`, feature `bench`).
//!
//! The DPU halves name host memory only by the [`Region`](dds_dma::Region) their DMA engine
//! returned at registration; only the host halves touch the shared memory
//! (`dds_shm::SharedRegion`). Their DMA is asynchronous: each operation has a `post_*` step
//! that queues DMA operations stamped with the caller's `user_data` and a `complete_*` step fed
//! with their completions, so the DPU's service loop rings one doorbell for the operations of
//! all its rings and never waits for one. Synchronous wrappers (`poll`, `release`, `deliver`,
//! ...) run the same steps to completion, for tests, the ring benchmark and the baselines.

mod format;
mod protocol;
mod sync;

#[cfg(not(loom))]
mod baseline;
#[cfg(not(loom))]
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(not(loom))]
mod mem;
#[cfg(not(loom))]
mod request;
#[cfg(not(loom))]
mod response;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use format::*;

#[cfg(not(loom))]
pub use baseline::{
    FarmConsumer, FarmProducer, LockedProducer, RingConsumer, RingProducer, FARM_SLOT_HEADER,
    MESSAGE_KIND,
};
#[cfg(not(loom))]
pub use request::{Record, Records, RequestConsumer, RequestProducer, Reservation};
#[cfg(not(loom))]
pub use response::{ResponseConsumer, ResponseProducer};

/// Registers a region of this process with `engine`, as the DPU process would register one
/// it received (a second mapping of the same memory). For tests and the ring benchmark.
#[cfg(all(not(loom), any(test, feature = "bench")))]
pub(crate) fn register_local(
    engine: &mut dyn dds_dma::DmaEngine,
    region: &dds_shm::SharedRegion,
) -> Result<dds_dma::Region, dds_dma::DmaError> {
    let fd = region
        .export_fd()
        .map_err(|e| dds_dma::DmaError::Map(e.to_string()))?;
    engine.register_region(dds_dma::RegionExport::memfd(fd, region.len() as u64))
}

/// Why a host producer could not insert a record.
#[derive(thiserror::Error, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// No room now (the ring is full, or the bytes in flight reached the max-progress bound
    /// `M`): poll completions and try again.
    #[error("ring full, retry")]
    Retry,
    /// The record can never fit this ring (its footprint exceeds half the capacity).
    #[error("record too large for the ring")]
    TooLarge,
}

/// Errors of the DPU side of the rings.
#[cfg(not(loom))]
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum RingFault {
    #[error(transparent)]
    Dma(#[from] dds_dma::DmaError),
    /// The host's pointers or records break the ring's invariants.
    #[error("ring corrupt: {0}")]
    Corrupt(&'static str),
    /// The record can never fit this ring.
    #[error("record too large for the ring")]
    TooLarge,
    /// The ring's geometry does not fit its registered region.
    #[error("bad ring layout: {0}")]
    Layout(&'static str),
}
