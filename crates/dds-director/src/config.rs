//! Director options.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use crate::signature::Signature;

/// Director options.
#[derive(Clone)]
pub struct DirectorConfig {
    /// Public address the director listens on.
    pub listen: SocketAddr,
    /// Address of the host application: fixed, or announced by it (`HostApp`).
    pub host: Arc<HostApp>,
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
    /// Listen transparently (`IP_TRANSPARENT`): the director accepts the connections that
    /// flow rules divert to it with TPROXY, each keeping the address its client connected
    /// to (`docs/bump-in-the-wire.md`). Needs `CAP_NET_ADMIN`.
    pub transparent: bool,
    /// Response bytes of completed reads a round merges and sends before the director looks
    /// at its sockets again (at least one read a round). Sending is the costly part of a round
    /// (a loopback or kernel TCP send of a page costs microseconds); a bound lets the requests
    /// that arrive meanwhile reach the device sooner, instead of after every completion the
    /// device returned at once.
    pub round_bytes: usize,
}

impl std::fmt::Debug for DirectorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectorConfig")
            .field("listen", &self.listen)
            .field("host", &self.host.get())
            .field("signature", &self.signature.to_string())
            .field("threads", &self.threads)
            .field("copy_mode", &self.copy_mode)
            .field("context_ring_len", &self.context_ring_len)
            .field("buffer_bytes", &self.buffer_bytes)
            .finish_non_exhaustive()
    }
}

/// Where the director connects a client's host leg: the host application's address, fixed
/// when the director starts, or announced by the host application itself over the DPU's
/// control socket once it listens (`set_host_app`, `docs/control-protocol.md`), so that it
/// can bind port 0 and no one picks a port for it. Read once per accepted connection.
#[derive(Debug)]
pub struct HostApp {
    addr: Mutex<Option<SocketAddr>>,
    fixed: bool,
}

impl HostApp {
    /// An address given at start; announcements do not change it.
    pub fn fixed(addr: SocketAddr) -> HostApp {
        HostApp {
            addr: Mutex::new(Some(addr)),
            fixed: true,
        }
    }

    /// No address until the host application announces one.
    pub fn announced() -> HostApp {
        HostApp {
            addr: Mutex::new(None),
            fixed: false,
        }
    }

    /// The address new connections go to, if known.
    pub fn get(&self) -> Option<SocketAddr> {
        *self.addr.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host application announces where it listens; false when the address is fixed
    /// (the announcement is ignored). Connections split before keep their host leg.
    pub fn announce(&self, addr: SocketAddr) -> bool {
        if self.fixed {
            return false;
        }
        *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
        true
    }
}

impl DirectorConfig {
    /// Defaults for the given addresses, matching every TCP connection.
    pub fn new(listen: SocketAddr, host: SocketAddr) -> Self {
        DirectorConfig::with_host(listen, Arc::new(HostApp::fixed(host)))
    }

    /// Defaults for a director whose host application announces its address.
    pub fn announced(listen: SocketAddr) -> Self {
        DirectorConfig::with_host(listen, Arc::new(HostApp::announced()))
    }

    fn with_host(listen: SocketAddr, host: Arc<HostApp>) -> Self {
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
            transparent: false,
            round_bytes: 128 << 10,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announced_host_app_takes_the_latest_address_and_a_fixed_one_none() {
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let announced = HostApp::announced();
        assert_eq!(announced.get(), None);
        assert!(announced.announce(a));
        assert!(announced.announce(b));
        assert_eq!(announced.get(), Some(b));
        let fixed = HostApp::fixed(a);
        assert!(!fixed.announce(b));
        assert_eq!(fixed.get(), Some(a));
    }
}
