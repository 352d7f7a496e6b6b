//! The DPU half (CODA's ProxyObjectStore): an [`ObjectStore`](dds_objstore::ObjectStore) whose
//! transactions and reads travel through DMA channels into host memory (named only by region id
//! and offset) and whose metadata calls are RPCs on the control socket. This module does not use
//! `dds-shm` (`crates/dds-cli/tests/architecture.rs` checks it).
//!
//! Here: the options, counters and state shared by the submodules, and the waiting helpers.
//! [`attach`] connects to the host proxy, [`channel`] holds a channel's DMA lanes, [`write`]
//! sends transactions, [`read`] reads data, and [`object_store`] is the `ObjectStore`
//! interface on top of them.

mod attach;
mod channel;
mod object_store;
mod read;
mod write;

use crate::wire::*;
use channel::{BufPool, Channel};
use dds_dma::{CostModel, DmaEngine};
use dds_objstore::StoreError;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Makes the DMA engine of one lane (two per channel).
pub type DmaFactory = Arc<dyn Fn() -> Box<dyn DmaEngine> + Send + Sync>;

/// Settings of the DPU side.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Largest DMA transfer (a multiple of 4096, 64 KiB ..= 16 MiB).
    pub max_dma: usize,
    /// Flow-Adapt batching of small transactions.
    pub batching: bool,
    /// Flow-Adapt pipelining of the chunks of large transactions and reads.
    pub chunking: bool,
    /// Channels (submitting threads are spread over them round robin).
    pub channels: usize,
    /// PCIe cost model of the default (emulated) DMA engines.
    pub cost_model: Option<CostModel>,
    /// DMA engine factory (default: [`EmulatedDma`] with `cost_model`).
    pub dma: Option<DmaFactory>,
    /// A transfer not consumed this long after it was sent is sent again.
    pub retransmit_after: Duration,
    /// Transactions waiting per channel (submitters block beyond it).
    pub max_pending: usize,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            max_dma: 2 << 20,
            batching: true,
            chunking: true,
            channels: 4,
            cost_model: Some(CostModel::bluefield2()),
            dma: None,
            retransmit_after: Duration::from_millis(5),
            max_pending: 256,
        }
    }
}

impl std::fmt::Debug for ProxyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyOptions")
            .field("max_dma", &self.max_dma)
            .field("batching", &self.batching)
            .field("chunking", &self.chunking)
            .field("channels", &self.channels)
            .field("cost_model", &self.cost_model)
            .field("dma", &self.dma.is_some())
            .finish()
    }
}

dds_server::counters! {
    /// Counters of the DPU side.
    struct Counters => pub struct ProxyStats {
        /// DMA writes into host memory.
        dma_writes,
        /// DMA reads of host memory.
        dma_reads,
        /// Bytes moved to the host by DMA.
        bytes_written,
        /// Bytes moved from the host by DMA.
        bytes_read,
        /// Batches of small transactions sent.
        batches,
        /// Chunks of large transactions sent.
        chunks,
        /// Transactions submitted.
        txs,
        /// Reads served.
        reads,
        /// Transfers sent again after their channel was reset.
        retransmits,
        /// Metadata requests sent over the RPC socket.
        rpcs,
        /// Doorbells rung for a parked host worker.
        doorbells,
        /// Read requests posted while another read of their channel was outstanding.
        reads_overlapped,
    }
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Shared {
    layout: Layout,
    opts: ProxyOptions,
    sock: Mutex<UnixStream>,
    watch: UnixStream,
    rpc_id: AtomicU64,
    channels: Vec<Channel>,
    pool: BufPool,
    counters: Counters,
    gone: AtomicBool,
}

/// The DPU-side object store: the OSD front end's `Arc<dyn ObjectStore>` in placement D.
pub struct ProxyObjectStore {
    sh: Arc<Shared>,
}

static THREAD_ORD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static ORD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn thread_ordinal() -> usize {
    ORD.with(|o| {
        if o.get() == usize::MAX {
            o.set(THREAD_ORD.fetch_add(1, Ordering::Relaxed));
        }
        o.get()
    })
}

impl ProxyObjectStore {
    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        self.sh.counters.snapshot()
    }

    /// The options in force.
    pub fn options(&self) -> &ProxyOptions {
        &self.sh.opts
    }

    /// Whether the host proxy is gone (its control connection closed): a store that outlived
    /// this session takes a new one ([`ProxyObjectStore::connect`] again).
    pub fn is_gone(&self) -> bool {
        self.sh.check_gone().is_err()
    }

    fn channel(&self) -> &Channel {
        let n = self.sh.channels.len();
        &self.sh.channels[thread_ordinal() % n]
    }
}

impl Drop for ProxyObjectStore {
    fn drop(&mut self) {
        let _ = self.sh.watch.shutdown(std::net::Shutdown::Both);
    }
}

fn gone_error() -> StoreError {
    proxy_error("host gone: the control connection to the host proxy is closed")
}

impl Shared {
    fn check_gone(&self) -> Result<(), StoreError> {
        if self.gone.load(Ordering::Acquire) {
            return Err(gone_error());
        }
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.watch, PollFlags::RDHUP)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if poll(&mut fds, Some(&zero)).is_ok()
            && fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
        {
            self.gone.store(true, Ordering::Release);
            return Err(gone_error());
        }
        Ok(())
    }

    fn is_small(&self, len: usize) -> bool {
        8 + len as u64 <= self.layout.payload_cap()
    }
}

/// Spins, then yields, then sleeps briefly; checks the host every 20 ms.
struct Waiter {
    n: u32,
    last_check: Instant,
}

impl Waiter {
    fn new() -> Self {
        Waiter {
            n: 0,
            last_check: Instant::now(),
        }
    }

    fn wait(&mut self, sh: &Shared) -> Result<(), StoreError> {
        self.n += 1;
        if self.n < 16 {
            std::hint::spin_loop();
        } else if self.n < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
        if self.last_check.elapsed() > Duration::from_millis(20) {
            self.last_check = Instant::now();
            sh.check_gone()?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.n = 0;
    }
}

fn check_state(state: u64, reason: u64, base: u64, layout: &Layout) -> Result<(), StoreError> {
    if state == 1 {
        let c = base / layout.channel_bytes();
        return Err(proxy_error(format!(
            "object proxy channel {c} closed by the host: {}",
            reason_text(reason)
        )));
    }
    Ok(())
}
