//! The communication engine (`docs/dpu-kv.md` §3): accepts clients, parses RESP, turns data
//! commands into compact KV requests for the processing engine, and builds the replies, in
//! each client's request order. The same code runs on DPU cores (requests go to host workers
//! over KV queue pairs, or to a DPU-resident store) and on host cores (requests go to the
//! store in-process).
//!
//! Each front-end thread is an event loop of the server runtime (`dds_server::Server`,
//! `docs/server-runtime.md`), which owns the sockets, buffers and limits; the front end is its
//! service. A data command forwarded over the KV queue pairs is a pending operation: its reply's
//! place is reserved in the connection's output and the connection goes on (many commands of
//! one client in flight, replies in request order); the place is filled when the queue pair's
//! response arrives.
//!
//! Here: the front end's configuration, counters and state, and the KV queue pairs it drives.
//! `connections` holds the service (sessions, parsing, completions, the loop's cadence) and
//! the `SO_REUSEPORT` listener, `commands` the dispatch and the commands answered here, and
//! `requests` the data commands' KV requests and the delivery of their responses.

mod commands;
mod connections;
mod requests;

use crate::cluster::ClusterMap;
use crate::queue::{DpuQueue, Geometry};
use crate::store::SharedStore;
use anyhow::{Context, Result};
pub use connections::reuseport_listener;
use dds_dma::{DmaCompletion, DmaEngine, EmulatedDma, RegionExport};
use dds_resp::{Argv, Limits};
use dds_server::{Budget, Config, ConnId, LoopCounters};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest key (a KV request record's key length is one byte).
pub const MAX_KEY: usize = 255;

/// Longest value INCR writes (`-9223372036854775808`).
const INT_TEXT_MAX: usize = 20;

/// Counters of one endpoint (every front-end thread of it adds to them).
#[derive(Default, Debug)]
pub struct FrontStats {
    /// Commands run.
    pub commands: AtomicU64,
    /// KV requests made (a multi-key command makes one per key).
    pub kv_requests: AtomicU64,
    /// RESP bytes of the data commands and their replies (what forwarding the client's bytes
    /// over PCIe would move, without TCP/IP headers).
    pub raw_bytes: AtomicU64,
    /// Bytes the DMA engines moved.
    pub dma_bytes: AtomicU64,
    /// DMA operations.
    pub dma_ops: AtomicU64,
    /// Request batches sent.
    pub batches: AtomicU64,
    /// Response reads that found nothing new.
    pub empty_polls: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Clients connected now.
    pub clients: AtomicU64,
    /// The event loops of the endpoint (their connections refused for a full slab count as
    /// received in `INFO`).
    loops: Mutex<Vec<Arc<LoopCounters>>>,
}

impl FrontStats {
    /// Connections received: accepted, and refused because a loop was full.
    fn received(&self) -> u64 {
        let refused: u64 = self
            .loops
            .lock()
            .map(|l| l.iter().map(|c| c.rejected.load(Ordering::Relaxed)).sum())
            .unwrap_or(0);
        self.connections.load(Ordering::Relaxed) + refused
    }
}

/// Where a front end's KV requests go.
pub enum Backend {
    /// The store in this process.
    Local(SharedStore),
    /// Host workers over KV queue pairs.
    Queues(Box<Queues>),
}

/// A front end's queue pairs to the host workers, and its DMA engine.
pub struct Queues {
    engine: EmulatedDma,
    queues: Vec<DpuQueue<Waiter>>,
    partitions: usize,
    /// Running mean of the response bytes of a GET, in sixteenths of a byte (the prediction a
    /// response read uses, rounded to the nearest byte).
    get_mean16: u32,
    max_value: usize,
    completions: Vec<DmaCompletion>,
    last_stats: (u64, u64),
}

impl Queues {
    /// Communication core `c`'s queue pairs in the region `fd` (mapped through a DMA engine
    /// of its own); requests of partition `p` go to worker `p % workers`.
    pub fn new(
        fd: OwnedFd,
        g: &Geometry,
        c: u32,
        partitions: usize,
        cost: Option<dds_dma::CostModel>,
    ) -> Result<Queues> {
        let mut engine = EmulatedDma::new(4 * g.slots as usize * g.workers as usize + 16, cost);
        let region = engine
            .register_region(RegionExport::memfd(fd, g.region_len() as u64))
            .context("map the queue region")?
            .id;
        Ok(Queues {
            engine,
            queues: (0..g.workers)
                .map(|w| DpuQueue::new(region, g, c, w))
                .collect(),
            partitions: partitions.max(1),
            get_mean16: 10 * 16,
            max_value: g.max_value as usize,
            completions: vec![DmaCompletion::default(); 256],
            last_stats: (0, 0),
        })
    }

    fn busy(&self) -> bool {
        self.queues
            .iter()
            .any(|q| q.outstanding() > 0 || q.building_count() > 0)
    }

    /// Batches sent and not answered, and requests waiting to be sent.
    fn in_flight(&self) -> usize {
        self.queues
            .iter()
            .map(|q| q.outstanding() + usize::from(q.building_count()))
            .sum()
    }
}

/// Where one KV response goes: the reply slot reserved for its command, and for a command of
/// several keys the state that gathers their responses.
#[derive(Clone, Copy, Debug)]
pub struct Waiter {
    conn: ConnId,
    ticket: u32,
    kind: Kind,
    resp3: bool,
    /// Index of the gathering state in `FrontState::waits`, or [`SINGLE`].
    wait: u32,
    sub: u32,
}

/// A [`Waiter`] of a one-key command, rendered straight from its response.
const SINGLE: u32 = u32::MAX;

/// Settings of a front end.
#[derive(Clone)]
pub struct FrontConfig {
    /// The slot map (and this endpoint's place in it).
    pub cluster: Arc<ClusterMap>,
    /// Most connected clients (per thread).
    pub max_clients: usize,
    /// Most unparsed input of one connection.
    pub query_buffer_limit: usize,
    /// Most replies a connection may have pending before it is not read.
    pub max_pending: usize,
    /// Largest value (SET).
    pub max_value: usize,
    /// Memory of every connection buffer of the endpoint's front-end threads together.
    pub budget: Arc<Budget>,
}

/// Connection-buffer memory of an endpoint's front ends (`FrontConfig::budget`).
pub const MEMORY_BUDGET: usize = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Get,
    Set,
    Del,
    Exists,
    Incr,
    MGet,
    MSet,
}

/// The responses of a command of several keys, gathered until the last one is in.
#[derive(Default)]
struct Wait {
    left: u32,
    sum: i64,
    items: Vec<Option<Vec<u8>>>,
    err: Option<&'static str>,
}

/// A reply finished while its connection could not be reached (a request waited for room
/// in a queue pair): filled in at the next completion pass.
struct Staged {
    conn: ConnId,
    ticket: u32,
    bytes: Vec<u8>,
}

/// A connection's state.
pub struct FrontSession {
    session: dds_resp::session::Session,
    /// Reply slots reserved and not filled yet.
    waiting: u32,
    /// Replies written behind them.
    behind: u32,
    /// Offered no input (at the pending limit) until the replies drain to half of it.
    paused: bool,
}

/// Spin (poll without sleeping) this long after the last work: the next request of a client
/// that just got its reply is usually on its way.
const SPIN: Duration = Duration::from_micros(200);

/// A front end's service state (everything but the loop's stop flags).
pub(crate) struct FrontState {
    cfg: FrontConfig,
    backend: Backend,
    limits: Limits,
    stats: Arc<FrontStats>,
    record: Vec<u8>,
    argv: Argv,
    spare: Vec<&'static [u8]>,
    waits: Vec<Wait>,
    free_waits: Vec<u32>,
    staged: Vec<Staged>,
    bufs: Vec<Vec<u8>>,
    next_id: u64,
    last_work: Instant,
    fault: Option<anyhow::Error>,
}

/// One front-end thread.
pub struct Frontend {
    listener: std::net::TcpListener,
    state: FrontState,
}

impl Frontend {
    /// A front end on `listener` (a `SO_REUSEPORT` socket each thread of the endpoint has).
    pub fn new(
        listener: std::net::TcpListener,
        backend: Backend,
        cfg: FrontConfig,
        stats: Arc<FrontStats>,
    ) -> Result<Frontend> {
        listener.set_nonblocking(true)?;
        Ok(Frontend {
            listener,
            state: FrontState {
                limits: Limits {
                    max_bulk: cfg.max_value.max(MAX_KEY) + 1024,
                    ..Limits::default()
                },
                cfg,
                backend,
                stats,
                record: Vec::with_capacity(1024),
                argv: Argv::new(),
                spare: Vec::new(),
                waits: Vec::new(),
                free_waits: Vec::new(),
                staged: Vec::new(),
                bufs: Vec::new(),
                next_id: 1,
                last_work: Instant::now(),
                fault: None,
            },
        })
    }

    /// Serves until `stop` is set or the backend fails (the host is gone, or broke the
    /// queue protocol); the replies of the requests in flight go out if they come within a
    /// second, then every client connection is closed.
    pub fn run(self, stop: &AtomicBool) -> Result<()> {
        let halt = AtomicBool::new(false);
        let rt = Config {
            max_connections: self.state.cfg.max_clients,
            input_limit: self.state.cfg.query_buffer_limit,
            tick: Duration::from_millis(50),
            drain: Duration::from_secs(1),
            ..Config::default()
        };
        let budget = self.state.cfg.budget.clone();
        let stats = self.state.stats.clone();
        let service = connections::FrontService {
            st: self.state,
            stop,
            halt: &halt,
        };
        let server = dds_server::Server::from_listener(self.listener, rt, budget, service)
            .context("front-end event loop")?;
        if let Ok(mut l) = stats.loops.lock() {
            l.push(server.counters());
        }
        let mut st = server.run(&halt).st;
        if let Backend::Queues(q) = &mut st.backend {
            // Outstanding DMA targets local buffers of the queues: let it finish first.
            let deadline = Instant::now() + Duration::from_secs(1);
            while q.engine.outstanding() > 0 && Instant::now() < deadline {
                let n = q.engine.poll(&mut q.completions);
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
            for queue in &mut q.queues {
                queue.abandon();
            }
        }
        match st.fault.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
