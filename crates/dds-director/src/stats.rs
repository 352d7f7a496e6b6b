//! Counters of a running director.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::buffer::Budget;

dds_server::counters! {
    /// Counters of a running director.
    pub(crate) struct Stats => pub struct DirectorStats {
        /// Connections accepted.
        accepted,
        /// Of which split (matched the signature).
        split,
        /// Of which spliced through.
        spliced,
        /// Connections closed because of malformed input or a protocol error.
        malformed,
        /// Connections reset (by either side) or closed because the host was unreachable.
        aborted,
        /// Client messages processed.
        messages,
        /// Requests served on the DPU.
        offloaded,
        /// Requests forwarded to the host.
        forwarded,
        /// Requests the predicate offloaded that went to the host because no context or
        /// buffer was free (or the read was too large for a buffer).
        fallback,
        /// Requests the offload function mapped to a file the application has not exposed:
        /// served by the host.
        unexposed,
        /// Invalidations queued for the cache writer.
        invalidations,
        /// Bytes received from clients.
        client_bytes_in,
        /// Bytes sent to clients.
        client_bytes_out,
        /// Bytes sent to the host.
        host_bytes_out,
        /// Bytes received from the host.
        host_bytes_in,
        /// Bytes of data read by offloaded reads.
        offload_bytes,
        /// Connections refused or closed because the memory budget could not hold their
        /// buffers.
        out_of_memory,
        /// Times the service side woke a sleeping director thread (completions it waited for,
        /// or applied invalidations): about one per message of offloaded reads, not one per read.
        lane_wakeups,
        /// Sends to clients and hosts handed to the kernel through the ring (one per socket
        /// and round; 0 with the director on epoll).
        ring_sends,
        /// The system calls that handed them over (one per round that sent anything):
        /// `ring_sends / ring_send_calls` connections answered per call.
        ring_send_calls,
    }
    extra {
            /// Bytes of connection buffers in use (`DirectorConfig::memory_bytes` at most).
            memory_bytes: u64,
            /// Most bytes of connection buffers in use at once.
            memory_peak_bytes: u64,
    }
}

pub(crate) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    pub(crate) fn snapshot_with(&self, budget: &Budget) -> DirectorStats {
        DirectorStats {
            memory_bytes: budget.used() as u64,
            memory_peak_bytes: budget.peak() as u64,
            ..self.snapshot()
        }
    }
}
