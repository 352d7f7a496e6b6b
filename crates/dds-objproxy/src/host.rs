//! The host half (CODA's Proxy Interface): owns the shared region of each DPU session, polls
//! its channels with atomics while transfers arrive and parks on each channel's doorbell when
//! they stop, applies transactions through the store with asynchronous commit callbacks,
//! writes ACKs and read data into its own memory, and serves the control RPCs.
//!
//! Here: the options, counters and the [`HostProxy`] entry point with its handle.
//! [`session`] accepts DPU sessions, [`rpc`] serves the control RPCs, [`shm`] is the host's
//! access to the shared region, [`worker`] polls one channel, [`transactions`] serves its write
//! lane and [`reads`] its read lane.

mod reads;
mod rpc;
mod session;
mod shm;
mod transactions;
mod worker;

use dds_objstore::ObjStore;
use session::accept_loop;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Settings of the host side.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Most DPU sessions served at once (more are refused).
    pub max_sessions: usize,
    /// How long a channel worker polls without finding a transfer before it parks on its
    /// doorbell (zero: park at once).
    pub spin: Duration,
    /// Longest park: a worker also wakes this often without a doorbell.
    pub park_timeout: Duration,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            max_sessions: 16,
            spin: Duration::from_micros(10),
            park_timeout: Duration::from_millis(100),
        }
    }
}

dds_server::counters! {
    /// Counters of the host side.
    struct Counters => pub struct HostStats {
        /// DPU sessions attached so far.
        sessions,
        /// Write-lane transfers taken (batches and chunks).
        transfers,
        /// Batches of small transactions taken.
        batches,
        /// Chunks of large transactions taken.
        chunks,
        /// Transactions handed to the store.
        txs_applied,
        /// Transactions received again and not applied again.
        txs_duplicate,
        /// Reads served.
        reads,
        /// Metadata requests served over the RPC socket.
        rpcs,
        /// Channels closed for bad input.
        channel_errors,
        /// Chunked transactions dropped incomplete (their DPU went away).
        partial_dropped,
        /// Times a channel worker parked on its doorbell.
        parks,
        /// Parks ended by the doorbell (the others by the timeout or by work found on the last
        /// look before blocking).
        rung,
        /// Sessions attached now.
        live_sessions,
    }
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The host side's entry point.
pub struct HostProxy;

/// A running host proxy; [`stop`](Self::stop) (or drop) ends it.
pub struct HostProxyHandle {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    accept: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl HostProxy {
    /// Listens on `socket` (replacing a stale socket file, mode 0600) and serves DPU sessions
    /// on `store` until stopped.
    pub fn serve(
        store: Arc<ObjStore>,
        socket: &Path,
        opts: HostOptions,
    ) -> io::Result<HostProxyHandle> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (s2, c2) = (stop.clone(), counters.clone());
        let accept = std::thread::Builder::new()
            .name("objproxy-accept".into())
            .spawn(move || accept_loop(listener, store, opts, s2, c2))?;
        Ok(HostProxyHandle {
            stop,
            counters,
            accept: Some(accept),
            path: socket.to_path_buf(),
        })
    }
}

impl HostProxyHandle {
    /// Counters so far.
    pub fn stats(&self) -> HostStats {
        self.counters.snapshot()
    }

    /// Sessions currently attached.
    pub fn live_sessions(&self) -> u64 {
        self.counters.live_sessions.load(Ordering::Relaxed)
    }

    /// Stops accepting, ends every session (their workers drop partial chunked transactions)
    /// and returns once all threads are gone.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for HostProxyHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
