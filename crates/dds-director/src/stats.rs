//! Counters of a running director.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::Budget;

/// Counters of a running director.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DirectorStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Of which split (matched the signature).
    pub split: u64,
    /// Of which spliced through.
    pub spliced: u64,
    /// Connections closed because of malformed input or a protocol error.
    pub malformed: u64,
    /// Connections reset (by either side) or closed because the host was unreachable.
    pub aborted: u64,
    /// Client messages processed.
    pub messages: u64,
    /// Requests served on the DPU.
    pub offloaded: u64,
    /// Requests forwarded to the host.
    pub forwarded: u64,
    /// Requests the predicate offloaded that went to the host because no context or
    /// buffer was free (or the read was too large for a buffer).
    pub fallback: u64,
    /// Requests the offload function mapped to a file the application has not exposed:
    /// served by the host.
    pub unexposed: u64,
    /// Invalidations queued for the cache writer.
    pub invalidations: u64,
    /// Bytes received from clients.
    pub client_bytes_in: u64,
    /// Bytes sent to clients.
    pub client_bytes_out: u64,
    /// Bytes sent to the host.
    pub host_bytes_out: u64,
    /// Bytes received from the host.
    pub host_bytes_in: u64,
    /// Bytes of data read by offloaded reads.
    pub offload_bytes: u64,
    /// Connections refused or closed because the memory budget could not hold their
    /// buffers.
    pub out_of_memory: u64,
    /// Bytes of connection buffers in use (`DirectorConfig::memory_bytes` at most).
    pub memory_bytes: u64,
    /// Most bytes of connection buffers in use at once.
    pub memory_peak_bytes: u64,
    /// Times the service side woke a sleeping director thread (completions it waited for,
    /// or applied invalidations): about one per message of offloaded reads, not one per read.
    pub lane_wakeups: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) accepted: AtomicU64,
    pub(crate) split: AtomicU64,
    pub(crate) spliced: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) offloaded: AtomicU64,
    pub(crate) forwarded: AtomicU64,
    pub(crate) fallback: AtomicU64,
    pub(crate) unexposed: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) client_bytes_in: AtomicU64,
    pub(crate) client_bytes_out: AtomicU64,
    pub(crate) host_bytes_out: AtomicU64,
    pub(crate) host_bytes_in: AtomicU64,
    pub(crate) offload_bytes: AtomicU64,
    pub(crate) out_of_memory: AtomicU64,
    pub(crate) lane_wakeups: AtomicU64,
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    pub(crate) fn snapshot(&self, budget: &Budget) -> DirectorStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DirectorStats {
            accepted: g(&self.accepted),
            split: g(&self.split),
            spliced: g(&self.spliced),
            malformed: g(&self.malformed),
            aborted: g(&self.aborted),
            messages: g(&self.messages),
            offloaded: g(&self.offloaded),
            forwarded: g(&self.forwarded),
            fallback: g(&self.fallback),
            unexposed: g(&self.unexposed),
            invalidations: g(&self.invalidations),
            client_bytes_in: g(&self.client_bytes_in),
            client_bytes_out: g(&self.client_bytes_out),
            host_bytes_out: g(&self.host_bytes_out),
            host_bytes_in: g(&self.host_bytes_in),
            offload_bytes: g(&self.offload_bytes),
            out_of_memory: g(&self.out_of_memory),
            memory_bytes: budget.used() as u64,
            memory_peak_bytes: budget.peak() as u64,
            lane_wakeups: g(&self.lane_wakeups),
        }
    }
}
