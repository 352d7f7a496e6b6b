//! The communication engine (`docs/dpu-kv.md` §3): accepts clients, parses RESP, turns data
//! commands into compact KV requests for the processing engine, and builds the replies, in
//! each client's request order. The same code runs on DPU cores (requests go to host workers
//! over KV queue pairs, or to a DPU-resident store) and on host cores (requests go to the
//! store in-process).

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dds_dma::{DmaCompletion, DmaEngine, EmulatedDma, RegionExport};
use dds_kvmem::qp::{self, request_len, Op, Request, Response, Status, BATCH_HEADER};
use dds_kvmem::{key_hash, partition_of};
use dds_resp::session::{client, hello, int_arg, lower, Session};
use dds_resp::{parse_command, reuse, Argv, Limits, Reply};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::cluster::{ClusterMap, Route};
use crate::queue::{queue_of, DpuQueue, Geometry, QueueFault};
use crate::store::SharedStore;

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

    fn accept(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let live = self.conns.len() - self.free.len();
            if live >= self.cfg.max_clients {
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if self
                .poll
                .registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                self.free.push(i);
                continue;
            }
            let gen = self.next_gen;
            self.next_gen = self.next_gen.wrapping_add(1);
            self.conns[i] = Some(Conn {
                stream,
                gen,
                input: Vec::new(),
                out: Vec::new(),
                out_at: 0,
                pending: VecDeque::new(),
                head: 0,
                session: Session {
                    id: u64::from(gen),
                    authed: true,
                    name: None,
                    resp3: false,
                },
                close_after: false,
                dead: false,
                paused: false,
                backlog: false,
            });
            self.stats.clients.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads what connection `i` has and runs its complete commands.
    fn serve(&mut self, i: usize, scratch: &mut [u8], argv: &mut Argv) {
        self.touched.push(i);
        loop {
            let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
                return;
            };
            c.paused = false;
            if c.dead || c.close_after {
                return;
            }
            if c.pending.len() >= self.cfg.max_pending {
                c.paused = true;
                return;
            }
            let n = if std::mem::take(&mut c.backlog) {
                0
            } else {
                match c.stream.read(scratch) {
                    Ok(0) => {
                        c.dead = true;
                        return;
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        c.dead = true;
                        return;
                    }
                }
            };
            let mut input = std::mem::take(&mut c.input);
            let from_input = !input.is_empty();
            if from_input {
                input.extend_from_slice(&scratch[..n]);
            }
            let buf: &[u8] = if from_input { &input } else { &scratch[..n] };
            let mut at = 0;
            let mut spare: Vec<&[u8]> = Vec::new();
            let mut full = false;
            loop {
                let c = self.conns[i].as_mut().expect("live");
                if c.close_after {
                    break;
                }
                if c.pending.len() >= self.cfg.max_pending {
                    full = true;
                    break;
                }
                match parse_command(&buf[at..], &self.limits, argv) {
                    Ok(Some(used)) => {
                        let mut args = reuse(std::mem::take(&mut spare));
                        args.extend(argv.iter(&buf[at..]));
                        at += used;
                        if !args.is_empty() {
                            self.command(i, &args, used);
                        }
                        spare = reuse(args);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let c = self.conns[i].as_mut().expect("live");
                        self.stats.commands.fetch_add(1, Ordering::Relaxed);
                        let mut out = Vec::new();
                        Reply::new(&mut out).error(&e.reply_text());
                        ready(c, out);
                        c.close_after = true;
                        break;
                    }
                }
            }
            let c = self.conns[i].as_mut().expect("live");
            if from_input {
                input.drain(..at);
            } else if at < n {
                input.extend_from_slice(&scratch[at..n]);
            }
            c.backlog = full && !input.is_empty();
            if input.len() > self.cfg.query_buffer_limit {
                let mut out = Vec::new();
                Reply::new(&mut out).error("ERR Protocol error: query buffer limit exceeded");
                ready(c, out);
                input = Vec::new();
                c.close_after = true;
            }
            c.input = if input.is_empty() { Vec::new() } else { input };
        }
    }

    /// Runs one command of connection `i`.
    fn command(&mut self, i: usize, argv: &[&[u8]], used: usize) {
        self.stats.commands.fetch_add(1, Ordering::Relaxed);
        let name = lower(argv[0]);
        let arity: i32 = match name.as_str() {
            "get" | "incr" | "decr" => 2,
            "set" | "incrby" | "decrby" => 3,
            "del" | "unlink" | "exists" | "mget" => -2,
            "mset" => -3,
            "ping" | "hello" | "command" | "info" | "quit" => -1,
            "dbsize" => 1,
            "echo" | "select" => 2,
            "client" | "cluster" | "config" => -2,
            _ => {
                let c = self.conns[i].as_mut().expect("live");
                let mut out = Vec::new();
                Reply::new(&mut out).error(&unknown_command(argv));
                ready(c, out);
                return;
            }
        };
        let n = argv.len() as i32;
        if (arity > 0 && n != arity) || (arity < 0 && n < -arity) || (name == "mset" && n % 2 == 0)
        {
            let c = self.conns[i].as_mut().expect("live");
            let mut out = Vec::new();
            Reply::new(&mut out).error(&format!(
                "ERR wrong number of arguments for '{name}' command"
            ));
            ready(c, out);
            return;
        }
        let c = self.conns[i].as_mut().expect("live");
        let resp3 = c.session.resp3;
        let mut out = Vec::new();
        let mut r = Reply::with_protocol(&mut out, resp3);
        match name.as_str() {
            "ping" if argv.len() == 1 => r.simple("PONG"),
            "ping" if argv.len() == 2 => r.bulk(argv[1]),
            "ping" => r.error("ERR wrong number of arguments for 'ping' command"),
            "echo" => r.bulk(argv[1]),
            "quit" => {
                r.ok();
                c.close_after = true;
            }
            "hello" => hello(&mut c.session, None, &mut r, argv),
            "client" => client(&mut c.session, &mut r, argv),
            "select" => match int_arg(argv[1]) {
                Some(0) => r.ok(),
                Some(_) => r.error("ERR DB index is out of range"),
                None => r.error("ERR value is not an integer or out of range"),
            },
            "config" if lower(argv[1]) == "get" => r.array(0),
            "config" => r.error("ERR CONFIG is not supported by dds dpukv"),
            "command" => command(&mut r, argv),
            "cluster" => self.cfg.cluster.command(&mut r, argv),
            "info" => {
                let s = &self.stats;
                let me = &self.cfg.cluster.endpoints[self.cfg.cluster.me];
                let text = format!(
                    "# Server\r\nredis_version:7.0.0\r\ndds_dpukv:1\r\nredis_mode:cluster\r\n\
                     role:{role}\r\ntcp_port:{port}\r\n\r\n# Clients\r\nconnected_clients:{cl}\r\n\r\n\
                     # Stats\r\ntotal_connections_received:{conns}\r\ntotal_commands_processed:{cmds}\r\n\
                     kvqp_requests:{req}\r\nraw_bytes:{raw}\r\ndma_bytes:{db}\r\ndma_ops:{dops}\r\n\
                     kvqp_batches:{bat}\r\nkvqp_empty_polls:{ep}\r\n\r\n# Cluster\r\ncluster_enabled:1\r\n",
                    role = me.role,
                    port = me.addr.port(),
                    cl = s.clients.load(Ordering::Relaxed),
                    conns = s.connections.load(Ordering::Relaxed),
                    cmds = s.commands.load(Ordering::Relaxed),
                    req = s.kv_requests.load(Ordering::Relaxed),
                    raw = s.raw_bytes.load(Ordering::Relaxed),
                    db = s.dma_bytes.load(Ordering::Relaxed),
                    dops = s.dma_ops.load(Ordering::Relaxed),
                    bat = s.batches.load(Ordering::Relaxed),
                    ep = s.empty_polls.load(Ordering::Relaxed),
                );
                r.bulk(text.as_bytes());
            }
            "dbsize" => match &self.backend {
                Backend::Local(store) => r.int(store.len() as i64),
                Backend::Queues(_) => {
                    r.error("ERR DBSIZE is answered by the host's endpoints in this design")
                }
            },
            _ => {
                self.data(i, &name, argv, used);
                return;
            }
        }
        ready(c, out);
    }

    /// A data command: checks, routes, and makes its KV requests.
    fn data(&mut self, i: usize, name: &str, argv: &[&[u8]], used: usize) {
        let (kind, keys_step) = match name {
            "get" => (Kind::Get, 1),
            "set" => (Kind::Set, 2),
            "del" | "unlink" => (Kind::Del, 1),
            "exists" => (Kind::Exists, 1),
            "incr" | "decr" | "incrby" | "decrby" => (Kind::Incr, 1),
            "mget" => (Kind::MGet, 1),
            "mset" => (Kind::MSet, 2),
            _ => unreachable!("data commands only"),
        };
        let keys: Vec<&[u8]> = match kind {
            Kind::Get | Kind::Set | Kind::Incr => vec![argv[1]],
            _ => argv[1..].iter().step_by(keys_step).copied().collect(),
        };
        let err = |this: &mut Self, text: &str| {
            let c = this.conns[i].as_mut().expect("live");
            let mut out = Vec::new();
            Reply::new(&mut out).error(text);
            ready(c, out);
        };
        match self.cfg.cluster.route(keys.iter().copied()) {
            Route::Here => {}
            Route::Moved(slot, addr) => return err(self, &format!("MOVED {slot} {addr}")),
            Route::CrossSlot => {
                return err(
                    self,
                    "CROSSSLOT Keys in request don't hash to the same slot",
                )
            }
        }
        if keys.iter().any(|k| k.is_empty() || k.len() > MAX_KEY) {
            return err(
                self,
                &format!("ERR keys of 1 to {MAX_KEY} bytes only in the in-memory store"),
            );
        }
        let incr = match name {
            "incr" => Some(1),
            "decr" => Some(-1),
            "incrby" | "decrby" => match int_arg(argv[2]) {
                None => return err(self, "ERR value is not an integer or out of range"),
                Some(v) if name == "decrby" => match v.checked_neg() {
                    Some(v) => Some(v),
                    None => return err(self, "ERR decrement would overflow"),
                },
                Some(v) => Some(v),
            },
            _ => None,
        };
        if matches!(kind, Kind::Set | Kind::MSet)
            && argv[2..]
                .iter()
                .step_by(2)
                .any(|v| v.len() > self.cfg.max_value)
        {
            return err(
                self,
                &format!(
                    "ERR value too large (limit {} bytes, --max-value)",
                    self.cfg.max_value
                ),
            );
        }
        let op_of = |sub: usize| match kind {
            Kind::Get | Kind::MGet => Op::Get,
            Kind::Set => Op::Set(argv[2]),
            Kind::MSet => Op::Set(argv[2 + 2 * sub]),
            Kind::Del => Op::Del,
            Kind::Exists => Op::Exists,
            Kind::Incr => Op::Incr(incr.expect("increment")),
        };
        if let Backend::Queues(q) = &self.backend {
            // A request travels in one batch: one that no slot can carry is refused here
            // (it would otherwise wait for room that never comes).
            let batch_max = q.queues.first().map_or(0, DpuQueue::batch_max);
            let too_big = keys.iter().enumerate().any(|(sub, key)| {
                BATCH_HEADER
                    + request_len(&Request {
                        key,
                        op: op_of(sub),
                    })
                    > batch_max
            });
            if too_big {
                return err(
                    self,
                    &format!(
                        "ERR key and value too large for a KV queue slot ({batch_max} bytes, --slot-bytes)"
                    ),
                );
            }
        }
        let c = self.conns[i].as_mut().expect("live");
        let no = c.head + c.pending.len() as u64;
        c.pending.push_back(Entry::Wait(Wait {
            kind,
            left: keys.len() as u32,
            sum: 0,
            items: if kind == Kind::MGet {
                vec![None; keys.len()]
            } else {
                Vec::new()
            },
            err: None,
        }));
        let gen = c.gen;
        self.stats
            .kv_requests
            .fetch_add(keys.len() as u64, Ordering::Relaxed);
        self.stats
            .raw_bytes
            .fetch_add(used as u64, Ordering::Relaxed);
        for (sub, key) in keys.iter().enumerate() {
            let req = Request {
                key,
                op: op_of(sub),
            };
            let w = Waiter {
                conn: i as u32,
                gen,
                no,
                sub: sub as u32,
            };
            self.request(&req, w);
        }
    }

    /// Hands one KV request to the backend.
    fn request(&mut self, req: &Request<'_>, w: Waiter) {
        match &mut self.backend {
            Backend::Local(store) => {
                let store = store.clone();
                let mut p = store.lock(req.key);
                qp::execute(&mut p, req, |resp| {
                    deliver(&mut self.conns, &self.stats, &mut self.touched, w, resp)
                });
            }
            Backend::Queues(q) => {
                let worker = partition_of(key_hash(req.key), q.partitions) % q.queues.len();
                let worst = match req.op {
                    // INCR stores its result as text: values up to 20 bytes whatever the
                    // largest SET.
                    Op::Get => qp::max_value_response(q.max_value.max(INT_TEXT_MAX)),
                    Op::Incr(_) => 9,
                    _ => 1,
                };
                let expect = match req.op {
                    Op::Get => 2 + q.value_mean as usize,
                    _ => worst,
                };
                self.record.clear();
                encode_request(&mut self.record, req);
                let queue = &mut q.queues[worker];
                if !queue.fits(self.record.len(), worst) {
                    if let Err(e) = send_batches(q, &self.stats) {
                        tracing::error!(error = %e, "sending a KV batch failed");
                    }
                }
                let queue = &mut q.queues[worker];
                if !queue.fits(self.record.len(), worst) {
                    // Every slot is in flight: wait for a response (bounded by the host).
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while !q.queues[worker].fits(self.record.len(), worst)
                        && Instant::now() < deadline
                    {
                        if pump_queues(q, &mut self.conns, &self.stats, &mut self.touched).is_err()
                        {
                            break;
                        }
                        let _ = send_batches(q, &self.stats);
                    }
                }
                let queue = &mut q.queues[worker];
                if queue.fits(self.record.len(), worst) {
                    queue.push(&self.record, expect, worst, w);
                } else {
                    let text = "ERR the host's KV workers do not answer".to_string();
                    fail(&mut self.conns, &mut self.touched, w, text);
                }
            }
        }
    }

    /// Sends what is batched and takes the responses that arrived.
    fn pump(&mut self) -> Result<()> {
        let Backend::Queues(q) = &mut self.backend else {
            return Ok(());
        };
        send_batches(q, &self.stats)?;
        pump_queues(q, &mut self.conns, &self.stats, &mut self.touched)?;
        Ok(())
    }

    /// Sends pending replies; closes connections that are done.
    fn flush_out(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        while !c.dead && c.out_at < c.out.len() {
            match c.stream.write(&c.out[c.out_at..]) {
                Ok(0) => c.dead = true,
                Ok(n) => c.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => c.dead = true,
            }
        }
        if c.out_at == c.out.len() {
            c.out.clear();
            c.out_at = 0;
            if c.out.capacity() > 1 << 20 {
                c.out = Vec::new();
            }
        }
        let done = c.dead || (c.close_after && c.out.is_empty() && c.pending.is_empty());
        if done {
            let mut c = self.conns[i].take().expect("live");
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(i);
            self.stats.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// (name, arity, first key, last key, step) of the commands a front end serves, as Redis's
/// `COMMAND` lists them (cluster clients route by these key positions).
const COMMANDS: &[(&str, i64, i64, i64, i64)] = &[
    ("get", 2, 1, 1, 1),
    ("set", 3, 1, 1, 1),
    ("del", -2, 1, -1, 1),
    ("unlink", -2, 1, -1, 1),
    ("exists", -2, 1, -1, 1),
    ("mget", -2, 1, -1, 1),
    ("mset", -3, 1, -1, 2),
    ("incr", 2, 1, 1, 1),
    ("decr", 2, 1, 1, 1),
    ("incrby", 3, 1, 1, 1),
    ("decrby", 3, 1, 1, 1),
    ("ping", -1, 0, 0, 0),
    ("echo", 2, 0, 0, 0),
    ("quit", -1, 0, 0, 0),
    ("hello", -1, 0, 0, 0),
    ("client", -2, 0, 0, 0),
    ("select", 2, 0, 0, 0),
    ("config", -2, 0, 0, 0),
    ("command", -1, 0, 0, 0),
    ("cluster", -2, 0, 0, 0),
    ("info", -1, 0, 0, 0),
    ("dbsize", 1, 0, 0, 0),
];

fn command(r: &mut Reply<'_>, argv: &[&[u8]]) {
    match argv.get(1).map(|a| lower(a)).as_deref() {
        None => {
            r.array(COMMANDS.len());
            for &(name, arity, first, last, step) in COMMANDS {
                r.array(6);
                r.bulk(name.as_bytes());
                r.int(arity);
                r.array(0);
                r.int(first);
                r.int(last);
                r.int(step);
            }
        }
        Some("count") => r.int(COMMANDS.len() as i64),
        Some("docs") | Some("info") => r.array(0),
        Some(_) => r.error(&format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

/// Redis's reply to an unknown command: its name and the start of its arguments (128 bytes
/// of each at most, until the list holds 128 bytes).
fn unknown_command(argv: &[&[u8]]) -> String {
    let text = |a: &[u8], n: usize| String::from_utf8_lossy(&a[..a.len().min(n)]).into_owned();
    let mut args = String::new();
    for a in &argv[1..] {
        if args.len() >= 128 {
            break;
        }
        args += &format!("'{}' ", text(a, 128 - args.len()));
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {args}",
        text(argv[0], 128)
    )
}

fn encode_request(out: &mut Vec<u8>, r: &Request<'_>) {
    debug_assert!(out.is_empty());
    // The codec's own writer, on a scratch batch: the record is what follows the header.
    let mut w = qp::BatchWriter::new(out, 0, qp::BATCH_MAX);
    let ok = w.request(r);
    debug_assert!(ok);
    w.finish();
    out.drain(..BATCH_HEADER);
    debug_assert_eq!(out.len(), request_len(r));
}

/// Posts the batches that are ready and the response reads that are due, in one doorbell.
fn send_batches(q: &mut Queues, stats: &FrontStats) -> std::result::Result<(), QueueFault> {
    let mut posted = 0;
    for (i, queue) in q.queues.iter_mut().enumerate() {
        // SAFETY: the engine completes every operation before the queues are dropped
        // (`Frontend::run` drains it on the way out).
        unsafe {
            if queue
                .post_batch(&mut q.engine, i as u32)
                .map_err(QueueFault::Dma)?
            {
                posted += 1;
                stats.batches.fetch_add(1, Ordering::Relaxed);
            }
            if queue
                .post_poll(&mut q.engine, i as u32)
                .map_err(QueueFault::Dma)?
            {
                posted += 1;
            }
        }
    }
    if posted > 0 {
        q.engine.submit();
    }
    Ok(())
}

/// Takes DMA completions; delivers the responses of complete batches.
fn pump_queues(
    q: &mut Queues,
    conns: &mut [Option<Conn>],
    stats: &FrontStats,
    touched: &mut Vec<usize>,
) -> std::result::Result<(), QueueFault> {
    let n = q.engine.poll(&mut q.completions);
    let mut more = false;
    for k in 0..n {
        let done = q.completions[k].clone();
        done.result.map_err(QueueFault::Dma)?;
        let idx = queue_of(done.user_data) as usize;
        let queue = q
            .queues
            .get_mut(idx)
            .ok_or(QueueFault::Protocol("completion of an unknown queue"))?;
        // SAFETY: as in `send_batches`.
        let got = unsafe { queue.complete(&mut q.engine, idx as u32, done.user_data)? };
        let Some((batch, o)) = got else {
            more = true;
            continue;
        };
        let mut values = 0usize;
        let mut gets = 0usize;
        for (resp, w) in qp::responses(batch).zip(o.waiters) {
            let resp = resp.map_err(QueueFault::Malformed)?;
            if let Response::Value(v) = resp {
                values += v.len();
                gets += 1;
            }
            deliver(conns, stats, touched, w, resp);
        }
        if let Some(mean) = values.checked_div(gets) {
            q.value_mean = 0.9 * q.value_mean + 0.1 * mean as f64;
        }
        more = true;
    }
    if n > 0 {
        // Second reads of long batches were posted while completing: start them.
        q.engine.submit();
    }
    if more {
        // Reads that found nothing are re-posted by the next `send_batches`.
        let s = q.engine.stats();
        let bytes = s.bytes_read + s.bytes_written;
        let ops = s.reads + s.writes;
        stats
            .dma_bytes
            .fetch_add(bytes - q.last_stats.0, Ordering::Relaxed);
        stats
            .dma_ops
            .fetch_add(ops - q.last_stats.1, Ordering::Relaxed);
        q.last_stats = (bytes, ops);
        let empty: u64 = q
            .queues
            .iter_mut()
            .map(|x| std::mem::take(&mut x.empty_polls))
            .sum();
        stats.empty_polls.fetch_add(empty, Ordering::Relaxed);
    }
    Ok(())
}

/// Appends a finished reply to a connection, in its order.
fn ready(c: &mut Conn, bytes: Vec<u8>) {
    if c.pending.is_empty() {
        c.out.extend_from_slice(&bytes);
        c.head += 1;
    } else {
        c.pending.push_back(Entry::Ready(bytes));
    }
}

fn fail(conns: &mut [Option<Conn>], touched: &mut Vec<usize>, w: Waiter, text: String) {
    let Some(c) = conns.get_mut(w.conn as usize).and_then(Option::as_mut) else {
        return;
    };
    if c.gen != w.gen || w.no < c.head {
        return;
    }
    if let Some(Entry::Wait(wait)) = c.pending.get_mut((w.no - c.head) as usize) {
        wait.err.get_or_insert(text);
        wait.left = wait.left.saturating_sub(1);
    }
    touched.push(w.conn as usize);
    drain(c);
}

fn error_text(st: Status) -> &'static str {
    match st {
        Status::NotInteger => "ERR value is not an integer or out of range",
        Status::Overflow => "ERR increment or decrement would overflow",
        Status::OutOfMemory => "ERR out of memory: the store's memory budget is full",
        Status::Ok | Status::NotFound => "ERR internal: not an error",
    }
}

/// Renders the reply of a single-key command straight from its response.
fn render_single(kind: Kind, resp: &Response<'_>, r: &mut Reply<'_>) {
    match (kind, resp) {
        (
            _,
            Response::Status(st @ (Status::NotInteger | Status::Overflow | Status::OutOfMemory)),
        ) => r.error(error_text(*st)),
        (Kind::Get, Response::Value(v)) => r.bulk(v),
        (Kind::Get, _) => r.null(),
        (Kind::Set, _) => r.ok(),
        (Kind::Del | Kind::Exists, Response::Status(Status::Ok)) => r.int(1),
        (Kind::Del | Kind::Exists, _) => r.int(0),
        (Kind::Incr, Response::Int(n)) => r.int(*n),
        _ => r.error("ERR internal: unexpected response"),
    }
}

/// Gives one KV response to its command.
fn deliver(
    conns: &mut [Option<Conn>],
    stats: &FrontStats,
    touched: &mut Vec<usize>,
    w: Waiter,
    resp: Response<'_>,
) {
    let Some(c) = conns.get_mut(w.conn as usize).and_then(Option::as_mut) else {
        return;
    };
    if c.gen != w.gen || w.no < c.head {
        return;
    }
    touched.push(w.conn as usize);
    let idx = (w.no - c.head) as usize;
    let Some(Entry::Wait(wait)) = c.pending.get_mut(idx) else {
        return;
    };
    let resp3 = c.session.resp3;
    if idx == 0
        && wait.left == 1
        && wait.err.is_none()
        && !matches!(
            wait.kind,
            Kind::MGet | Kind::MSet | Kind::Del | Kind::Exists
        )
    {
        // The common case: the oldest command, answered by one response.
        let before = c.out.len();
        render_single(
            wait.kind,
            &resp,
            &mut Reply::with_protocol(&mut c.out, resp3),
        );
        stats
            .raw_bytes
            .fetch_add((c.out.len() - before) as u64, Ordering::Relaxed);
        c.pending.pop_front();
        c.head += 1;
        drain(c);
        return;
    }
    match resp {
        Response::Status(st @ (Status::NotInteger | Status::Overflow | Status::OutOfMemory)) => {
            wait.err.get_or_insert_with(|| error_text(st).to_string());
        }
        Response::Status(Status::Ok) if matches!(wait.kind, Kind::Del | Kind::Exists) => {
            wait.sum += 1
        }
        Response::Value(v) => {
            if wait.kind == Kind::MGet {
                if let Some(slot) = wait.items.get_mut(w.sub as usize) {
                    *slot = Some(v.to_vec());
                }
            } else {
                wait.items = vec![Some(v.to_vec())];
            }
        }
        Response::Int(n) => wait.sum = n,
        Response::Status(_) => {}
    }
    wait.left = wait.left.saturating_sub(1);
    if wait.left == 0 {
        let mut out = Vec::new();
        let mut r = Reply::with_protocol(&mut out, resp3);
        match &wait.err {
            Some(e) => r.error(e),
            None => match wait.kind {
                Kind::Get => match wait.items.first() {
                    Some(Some(v)) => r.bulk(v),
                    _ => r.null(),
                },
                Kind::Set | Kind::MSet => r.ok(),
                Kind::Del | Kind::Exists => r.int(wait.sum),
                Kind::Incr => r.int(wait.sum),
                Kind::MGet => {
                    r.array(wait.items.len());
                    for it in &wait.items {
                        match it {
                            Some(v) => r.bulk(v),
                            None => r.null(),
                        }
                    }
                }
            },
        }
        stats
            .raw_bytes
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        c.pending[idx] = Entry::Ready(out);
    }
    drain(c);
}

/// Moves finished replies at the head of the connection's queue to its output.
fn drain(c: &mut Conn) {
    while let Some(Entry::Ready(_)) = c.pending.front() {
        if let Some(Entry::Ready(b)) = c.pending.pop_front() {
            c.out.extend_from_slice(&b);
        }
        c.head += 1;
    }
    if let Some(Entry::Wait(w)) = c.pending.front() {
        if w.left > 0 {
            return;
        }
        // An error collected with nothing left to wait for.
        let Some(Entry::Wait(w)) = c.pending.pop_front() else {
            unreachable!()
        };
        let mut r = Reply::with_protocol(&mut c.out, c.session.resp3);
        r.error(w.err.as_deref().unwrap_or("ERR internal: no reply"));
        c.head += 1;
        drain(c);
    }
}

/// A `SO_REUSEPORT` listener: every front-end thread of an endpoint binds one and the kernel
/// spreads connections over them.
pub fn reuseport_listener(addr: SocketAddr) -> Result<std::net::TcpListener> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket(family, SocketType::STREAM, None).context("socket")?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &addr).with_context(|| format!("bind {addr}"))?;
    rustix::net::listen(&fd, 1024).context("listen")?;
    Ok(std::net::TcpListener::from(fd))
}
