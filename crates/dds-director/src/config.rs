//! Director options.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::signature::Signature;

/// Director options.
#[derive(Clone)]
pub struct DirectorConfig {
    /// Public address the director listens on.
    pub listen: SocketAddr,
    /// Address of the host application.
    pub host: SocketAddr,
    /// Connections matching it are split; others are spliced through.
    pub signature: Signature,
    /// Director threads (each gets a lane of the port: `port.lanes() >= threads`).
    pub threads: usize,
    /// Copy mode: read into the context buffer, then copy header and data into a packet
    /// buffer before sending (the Fig. 20 baseline). Default: zero copy.
    pub copy_mode: bool,
    /// Outstanding offloaded reads per thread (at most the port depth). When all contexts
    /// are taken, requests go to the host.
    pub context_ring_len: usize,
    /// Data bytes of each pre-allocated read buffer: the largest offloaded read.
    pub buffer_bytes: usize,
    /// Alignment of the read buffers' data areas.
    pub buffer_align: usize,
    /// Initial size of each per-connection buffer (they grow to the largest message or
    /// response seen, at most the app's limits).
    pub conn_buffer_bytes: usize,
    /// Connections per thread.
    pub max_connections: usize,
    /// Bytes all connection buffers of all threads may hold together. Buffers grow with the
    /// bytes that arrive; a connection whose buffers the budget cannot hold is closed.
    pub memory_bytes: usize,
    /// Requests awaiting their response per connection (raised to the app's
    /// `max_requests`).
    pub max_pending_requests: usize,
    /// Contexts one connection may hold (so one slow reader cannot take them all).
    pub max_contexts_per_conn: usize,
    /// Called first on each director thread with its index (e.g. to pin it to a core).
    pub on_thread_start: Option<Arc<dyn Fn(usize) + Send + Sync>>,
}

impl std::fmt::Debug for DirectorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectorConfig")
            .field("listen", &self.listen)
            .field("host", &self.host)
            .field("signature", &self.signature.to_string())
            .field("threads", &self.threads)
            .field("copy_mode", &self.copy_mode)
            .field("context_ring_len", &self.context_ring_len)
            .field("buffer_bytes", &self.buffer_bytes)
            .finish_non_exhaustive()
    }
}

impl DirectorConfig {
    /// Defaults for the given addresses, matching every TCP connection.
    pub fn new(listen: SocketAddr, host: SocketAddr) -> Self {
        DirectorConfig {
            listen,
            host,
            signature: Signature::any_tcp(),
            threads: 1,
            copy_mode: false,
            context_ring_len: 128,
            buffer_bytes: 64 << 10,
            buffer_align: 4096,
            conn_buffer_bytes: 64 << 10,
            max_connections: 1024,
            memory_bytes: 256 << 20,
            max_pending_requests: 4096,
            max_contexts_per_conn: 64,
            on_thread_start: None,
        }
    }
}
