//! The communication engine (`docs/dpu-kv.md` §3): accepts clients, parses RESP, turns data
//! commands into compact KV requests for the processing engine, and builds the replies, in
//! each client's request order. The same code runs on DPU cores (requests go to host workers
//! over KV queue pairs, or to a DPU-resident store) and on host cores (requests go to the
//! store in-process).
//!
//! Here: the front end's configuration, counters and state, its event loop ([`Frontend::run`])
//! and the KV queue pairs it drives. `connections` holds the client side (accept, parse,
//! replies in order, output), `commands` the dispatch and the commands answered here, and
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
use dds_resp::session::Session;
use dds_resp::{Argv, Limits};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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
    value_mean: f64,
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
            value_mean: 8.0,
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
}

/// Where one KV response goes.
#[derive(Clone, Copy, Debug)]
pub struct Waiter {
    conn: u32,
    gen: u32,
    no: u64,
    sub: u32,
}

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
}

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

struct Wait {
    kind: Kind,
    left: u32,
    sum: i64,
    items: Vec<Option<Vec<u8>>>,
    err: Option<String>,
}

enum Entry {
    Ready(Vec<u8>),
    Wait(Wait),
}

struct Conn {
    stream: TcpStream,
    gen: u32,
    input: Vec<u8>,
    out: Vec<u8>,
    out_at: usize,
    pending: VecDeque<Entry>,
    /// Request number of `pending[0]`.
    head: u64,
    session: Session,
    close_after: bool,
    dead: bool,
    paused: bool,
    /// `input` holds commands not run yet because `max_pending` replies were pending: run
    /// them before reading again (their bytes already left the socket).
    backlog: bool,
}

const LISTENER: Token = Token(usize::MAX);
const SCRATCH: usize = 64 << 10;

/// One front-end thread.
pub struct Frontend {
    cfg: FrontConfig,
    listener: TcpListener,
    poll: Poll,
    backend: Backend,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    next_gen: u32,
    limits: Limits,
    stats: Arc<FrontStats>,
    touched: Vec<usize>,
    record: Vec<u8>,
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
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Frontend {
            limits: Limits {
                max_bulk: cfg.max_value.max(MAX_KEY) + 1024,
                ..Limits::default()
            },
            cfg,
            listener,
            poll,
            backend,
            conns: Vec::new(),
            free: Vec::new(),
            next_gen: 1,
            stats,
            touched: Vec::new(),
            record: Vec::with_capacity(1024),
        })
    }

    /// Serves until `stop` is set or the backend fails (the host is gone, or broke the
    /// queue protocol); closes every client connection on the way out.
    pub fn run(mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; SCRATCH];
        let mut argv = Argv::new();
        let mut idle_since = Instant::now();
        let result = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(());
            }
            let busy = matches!(&self.backend, Backend::Queues(q) if q.busy());
            // Spin while work is in flight or arrived lately; park in epoll after 200 µs idle.
            let timeout = if busy || idle_since.elapsed() < Duration::from_micros(200) {
                Some(Duration::ZERO)
            } else {
                Some(Duration::from_millis(50))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                break Err(e).context("poll");
            }
            let mut work = busy;
            for ev in events.iter() {
                work = true;
                if ev.token() == LISTENER {
                    self.accept();
                    continue;
                }
                self.serve(ev.token().0, &mut scratch, &mut argv);
            }
            for i in 0..self.conns.len() {
                let resume = self.conns[i]
                    .as_ref()
                    .is_some_and(|c| c.paused && c.pending.len() < self.cfg.max_pending / 2);
                if resume {
                    self.serve(i, &mut scratch, &mut argv);
                }
            }
            if let Err(e) = self.pump() {
                break Err(e);
            }
            let mut touched = std::mem::take(&mut self.touched);
            touched.sort_unstable();
            touched.dedup();
            for &i in &touched {
                self.flush_out(i);
            }
            touched.clear();
            self.touched = touched;
            if work {
                idle_since = Instant::now();
            }
        };
        for i in 0..self.conns.len() {
            if let Some(mut c) = self.conns[i].take() {
                let _ = self.poll.registry().deregister(&mut c.stream);
            }
        }
        if let Backend::Queues(q) = &mut self.backend {
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
        result
    }
}
