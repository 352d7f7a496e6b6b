//! The traffic director (§5): a TCP-splitting proxy on the DPU's public address.
//!
//! Each director thread runs a `mio` event loop with its own listener clone, its own lane of
//! the [`FileReadPort`] and its own buffer pool. An accepted connection whose 5-tuple matches
//! the application signature is *split*: it is paired with a new connection to the host
//! application, every complete client message goes through the offload predicate, host-bound
//! requests are forwarded as one host sub-message, DPU-bound requests become file reads, and
//! the responses of both sides are merged back into request order. Other connections are
//! *spliced*: bytes are relayed both ways without inspection. See `docs/offload.md`.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_cache::CacheReader;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

use crate::api::{
    status, CacheView, FixedList, KeyList, OffloadApp, ReadOp, ReqDesc, ReqList, MAX_HEADER_ROOM,
    REQUEST_HEAD_BYTES,
};
use crate::engine::{CtxState, Pool};
use crate::port::{FileReadPort, LaneHandle};
use crate::signature::{Proto, Signature};

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
const IOV_MAX: usize = 64;

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
            max_pending_requests: 4096,
            max_contexts_per_conn: 64,
            on_thread_start: None,
        }
    }
}

/// Counters of a running director.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

#[derive(Default)]
struct Stats {
    accepted: AtomicU64,
    split: AtomicU64,
    spliced: AtomicU64,
    malformed: AtomicU64,
    aborted: AtomicU64,
    messages: AtomicU64,
    offloaded: AtomicU64,
    forwarded: AtomicU64,
    fallback: AtomicU64,
    invalidations: AtomicU64,
    client_bytes_in: AtomicU64,
    client_bytes_out: AtomicU64,
    host_bytes_out: AtomicU64,
    host_bytes_in: AtomicU64,
    offload_bytes: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Stats {
    fn snapshot(&self) -> DirectorStats {
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
            invalidations: g(&self.invalidations),
            client_bytes_in: g(&self.client_bytes_in),
            client_bytes_out: g(&self.client_bytes_out),
            host_bytes_out: g(&self.host_bytes_out),
            host_bytes_in: g(&self.host_bytes_in),
            offload_bytes: g(&self.offload_bytes),
        }
    }
}

/// The traffic director.
#[derive(Debug)]
pub struct Director;

/// A running director: its address, counters and shutdown.
pub struct DirectorHandle {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for DirectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectorHandle")
            .field("local", &self.local)
            .finish()
    }
}

impl DirectorHandle {
    /// The address the director listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Current counters.
    pub fn stats(&self) -> DirectorStats {
        self.stats.snapshot()
    }

    /// Stops the threads: connections are closed, outstanding reads are awaited (up to 5 s;
    /// buffers of reads still outstanding after that are leaked, never freed under the file
    /// service).
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.wakers {
            let _ = w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for DirectorHandle {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Director {
    /// Starts the director threads. `cache` is a reader of the table whose writer the file
    /// service thread owns; `port` has at least `threads` free lanes.
    pub fn start(
        cfg: DirectorConfig,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        port: Arc<FileReadPort>,
    ) -> io::Result<DirectorHandle> {
        let threads = cfg.threads.max(1);
        if app.header_room() > MAX_HEADER_ROOM {
            return Err(invalid(format!(
                "app header room {} above {MAX_HEADER_ROOM}",
                app.header_room()
            )));
        }
        if cfg.context_ring_len > port.depth() {
            return Err(invalid(format!(
                "context_ring_len {} above the port depth {}",
                cfg.context_ring_len,
                port.depth()
            )));
        }
        let mut lanes = Vec::with_capacity(threads);
        for i in 0..threads {
            let lane = port
                .lane(i)
                .ok_or_else(|| invalid(format!("port lane {i} missing or taken")))?;
            if lane.invalidation_room() < app.max_forward_keys() {
                return Err(invalid(format!(
                    "port invalidation queue ({}) smaller than the app's max_forward_keys ({})",
                    lane.invalidation_room(),
                    app.max_forward_keys()
                )));
            }
            lanes.push(lane);
        }
        let std_listener = std::net::TcpListener::bind(cfg.listen)?;
        std_listener.set_nonblocking(true)?;
        let local = std_listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let mut wakers = Vec::new();
        let mut handles = Vec::new();
        for (i, lane) in lanes.into_iter().enumerate() {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let w2 = waker.clone();
            lane.set_waker(move || {
                let _ = w2.wake();
            });
            let mut listener = TcpListener::from_std(std_listener.try_clone()?);
            poll.registry()
                .register(&mut listener, LISTENER, Interest::READABLE)?;
            let worker = Worker::new(
                &cfg,
                poll,
                listener,
                app.clone(),
                cache.clone(),
                lane,
                stop.clone(),
                stats.clone(),
            );
            wakers.push(waker);
            let hook = cfg.on_thread_start.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("dds-director-{i}"))
                    .spawn(move || {
                        if let Some(h) = hook {
                            h(i);
                        }
                        let r =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()));
                        if r.is_err() {
                            tracing::error!(thread = i, "director thread panicked");
                        }
                    })?,
            );
        }
        tracing::info!(%local, host = %cfg.host, signature = %cfg.signature, threads, app = app.name(), "traffic director started");
        Ok(DirectorHandle {
            local,
            stop,
            wakers,
            threads: handles,
            stats,
        })
    }
}

/// A byte buffer with a consumed prefix.
struct Buf {
    v: Vec<u8>,
    s: usize,
    e: usize,
}

impl Buf {
    fn new(n: usize) -> Buf {
        Buf {
            v: vec![0; n],
            s: 0,
            e: 0,
        }
    }
    fn len(&self) -> usize {
        self.e - self.s
    }
    fn is_empty(&self) -> bool {
        self.s == self.e
    }
    fn data(&self) -> &[u8] {
        &self.v[self.s..self.e]
    }
    fn consume(&mut self, n: usize) {
        self.s += n;
        if self.s == self.e {
            self.s = 0;
            self.e = 0;
        }
    }
    fn compact(&mut self) {
        if self.s > 0 {
            self.v.copy_within(self.s..self.e, 0);
            self.e -= self.s;
            self.s = 0;
        }
    }
    /// Free bytes at the tail, compacting first if there are none.
    fn tail(&mut self) -> &mut [u8] {
        if self.e == self.v.len() {
            self.compact();
        }
        &mut self.v[self.e..]
    }
    /// Makes `n` contiguous free bytes at the tail. The buffer grows only when it is empty
    /// (so it holds at most one item larger than its initial size); otherwise false.
    fn room(&mut self, n: usize) -> bool {
        if self.v.len() - self.e >= n {
            return true;
        }
        self.compact();
        if self.v.len() - self.e >= n {
            return true;
        }
        if self.is_empty() {
            self.v.resize(n, 0);
            return true;
        }
        false
    }
    /// Grows so that a whole item of `n` bytes fits (from the start of the data).
    fn fit(&mut self, n: usize) {
        if self.v.len() - self.s < n {
            self.compact();
            if self.v.len() < n {
                self.v.resize(n, 0);
            }
        }
    }
    fn commit(&mut self, n: usize) {
        self.e += n;
    }
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    /// The next host response answers it; it may be sent once the lane's invalidations up to
    /// `gate` are applied.
    Host { gate: u64 },
    /// An offloaded read in context `ctx`.
    Dpu { ctx: u32 },
    /// A DPU response already copied into `cout` (copy mode), `len` bytes.
    Copied { len: u32 },
}

struct Conn {
    gen: u32,
    split: bool,
    client: TcpStream,
    host: TcpStream,
    peer: SocketAddr,
    host_connected: bool,
    c_readable: bool,
    c_writable: bool,
    h_readable: bool,
    h_writable: bool,
    cin: Buf,
    hout: Buf,
    hin: Buf,
    cout: Buf,
    order: VecDeque<Entry>,
    host_pending: usize,
    head_sent: usize,
    inval_seq: u64,
    /// Host requests forwarded / answered (retired) on this connection.
    host_issued: u64,
    host_retired: u64,
    /// Keys that forwarded host requests may modify, masked for this connection's lookups
    /// until the request with ordinal `pend_ord[i]` is answered (FIFO from `pend_head`).
    pend_keys: Vec<u64>,
    pend_ord: Vec<u64>,
    pend_head: usize,
    dpu_ctxs: usize,
    /// Offloaded reads of this connection in the file service.
    dpu_inflight: usize,
    /// Write-after-read barrier: only this many bytes of `hout` may go to the host until
    /// `dpu_inflight` is 0 (a host request that modifies keys must not overtake earlier
    /// offloaded reads of the connection).
    hold: Option<usize>,
    client_eof: bool,
    host_eof: bool,
    host_wr_shut: bool,
    dirty: bool,
    retry: bool,
    gated: bool,
}

enum Close {
    /// Orderly: both directions done.
    Done,
    /// Malformed input or protocol error: log and close.
    Malformed(&'static str),
    /// A reset or I/O error on one side: reset the other.
    Abort(&'static str),
}

struct Scratch {
    host: ReqList,
    dpu: ReqList,
    keys: KeyList,
    masked: FixedList<(u64, u32)>,
    plan: Vec<(ReqDesc, Option<ReadOp>, u32)>,
    stamp: Vec<u32>,
    stamp_now: u32,
}

struct Worker {
    poll: Poll,
    listener: TcpListener,
    app: Arc<dyn OffloadApp>,
    cache: CacheReader,
    lane: LaneHandle,
    pool: Pool,
    conns: Vec<Option<Box<Conn>>>,
    free_slots: Vec<usize>,
    gens: Vec<u32>,
    dirty: Vec<usize>,
    retry: Vec<usize>,
    /// Connections whose next response waits for the cache writer.
    gated: Vec<usize>,
    scratch: Scratch,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    host_addr: SocketAddr,
    signature: Signature,
    copy_mode: bool,
    conn_buf: usize,
    max_pending: usize,
    max_ctx_per_conn: usize,
    pend_cap: usize,
    max_msg: usize,
    max_resp: usize,
    max_req: usize,
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn set_linger_zero(s: &TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO));
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: &DirectorConfig,
        poll: Poll,
        listener: TcpListener,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        lane: LaneHandle,
        stop: Arc<AtomicBool>,
        stats: Arc<Stats>,
    ) -> Worker {
        let max_req = app.max_requests().max(1);
        let app_forward_keys = app.max_forward_keys();
        let pool = Pool::new(
            cfg.context_ring_len,
            app.header_room(),
            cfg.buffer_bytes,
            cfg.buffer_align,
        );
        let nconn = cfg.max_connections.max(1);
        Worker {
            poll,
            listener,
            scratch: Scratch {
                host: ReqList::with_capacity(max_req),
                dpu: ReqList::with_capacity(max_req),
                keys: KeyList::with_capacity(app.max_forward_keys() + 1),
                masked: FixedList::with_capacity(app.max_forward_keys().max(1)),
                plan: vec![(ReqDesc::default(), None, 0); max_req],
                stamp: vec![0; max_req],
                stamp_now: 0,
            },
            max_msg: app.max_message_len(),
            max_resp: app.max_response_len(),
            max_req,
            app,
            cache,
            lane,
            pool,
            conns: (0..nconn).map(|_| None).collect(),
            free_slots: (0..nconn).rev().collect(),
            gens: vec![0; nconn],
            dirty: Vec::with_capacity(nconn),
            retry: Vec::with_capacity(nconn),
            gated: Vec::with_capacity(nconn),
            stop,
            stats,
            host_addr: cfg.host,
            signature: cfg.signature,
            copy_mode: cfg.copy_mode,
            conn_buf: cfg.conn_buffer_bytes.max(4096),
            max_pending: cfg.max_pending_requests.max(max_req),
            max_ctx_per_conn: cfg.max_contexts_per_conn.max(1),
            pend_cap: app_forward_keys.max(64),
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(1024);
        let mut last_applied = 0u64;
        while !self.stop.load(Ordering::Acquire) {
            self.reap_completions();
            let applied = self.lane.invalidations_applied();
            if applied != last_applied {
                last_applied = applied;
                // Held host responses may now go out.
                for k in 0..self.gated.len() {
                    let slot = self.gated[k];
                    if let Some(c) = self.conns[slot].as_mut() {
                        c.gated = false;
                    }
                    self.mark(slot);
                }
                self.gated.clear();
            }
            for k in 0..self.retry.len() {
                let slot = self.retry[k];
                if let Some(c) = self.conns[slot].as_mut() {
                    c.retry = false;
                }
                self.mark(slot);
            }
            let retrying = !self.retry.is_empty();
            self.retry.clear();
            self.drive_dirty();
            let timeout = if !self.dirty.is_empty() {
                Some(Duration::ZERO)
            } else if retrying || !self.retry.is_empty() {
                Some(Duration::from_millis(1))
            } else if self.lane.prepare_sleep() {
                if self.lane.invalidations_applied() != last_applied {
                    Some(Duration::ZERO)
                } else {
                    Some(Duration::from_millis(100))
                }
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "director poll failed");
                    break;
                }
            }
            self.lane.end_sleep();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(t) => {
                        let slot = t / 2;
                        let Some(c) = self.conns.get_mut(slot).and_then(|c| c.as_mut()) else {
                            continue;
                        };
                        let client_side = t % 2 == 0;
                        let (r, w) = (
                            ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                            ev.is_writable() || ev.is_write_closed() || ev.is_error(),
                        );
                        if client_side {
                            c.c_readable |= r;
                            c.c_writable |= w;
                        } else {
                            c.h_readable |= r;
                            c.h_writable |= w;
                        }
                        self.mark(slot);
                    }
                }
            }
        }
        self.shutdown();
    }

    fn shutdown(mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i, Close::Done);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.lane.inflight() > 0 && Instant::now() < deadline {
            self.reap_completions();
            std::thread::sleep(Duration::from_micros(200));
        }
        if self.lane.inflight() > 0 {
            tracing::error!(
                inflight = self.lane.inflight(),
                "offloaded reads still outstanding at shutdown: leaking their buffers"
            );
            let pool = std::mem::replace(&mut self.pool, Pool::new(0, 0, 0, 64));
            pool.leak();
        }
    }

    fn mark(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].as_mut() {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    fn accept(&mut self) {
        loop {
            let (client, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            add(&self.stats.accepted, 1);
            let Some(slot) = self.free_slots.pop() else {
                tracing::warn!(%peer, "connection limit reached: closing new connection");
                continue;
            };
            let local = client.local_addr().unwrap_or(self.host_addr);
            let split = self.signature.matches(peer, local, Proto::Tcp);
            let mut host = match TcpStream::connect(self.host_addr) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot connect to the host application");
                    add(&self.stats.aborted, 1);
                    self.free_slots.push(slot);
                    continue;
                }
            };
            let mut client = client;
            let _ = client.set_nodelay(true);
            let _ = host.set_nodelay(true);
            let both = Interest::READABLE | Interest::WRITABLE;
            let reg = self.poll.registry();
            if reg.register(&mut client, Token(slot * 2), both).is_err()
                || reg.register(&mut host, Token(slot * 2 + 1), both).is_err()
            {
                tracing::warn!(%peer, "cannot register connection");
                self.free_slots.push(slot);
                continue;
            }
            add(
                if split {
                    &self.stats.split
                } else {
                    &self.stats.spliced
                },
                1,
            );
            self.gens[slot] = self.gens[slot].wrapping_add(1);
            let n = self.conn_buf;
            self.conns[slot] = Some(Box::new(Conn {
                gen: self.gens[slot],
                split,
                client,
                host,
                peer,
                host_connected: false,
                c_readable: true,
                c_writable: true,
                h_readable: false,
                h_writable: false,
                cin: Buf::new(n),
                hout: Buf::new(if split { n } else { 0 }),
                hin: Buf::new(n),
                cout: Buf::new(if split && self.copy_mode { n } else { 0 }),
                order: VecDeque::with_capacity(if split { self.max_pending } else { 0 }),
                host_pending: 0,
                head_sent: 0,
                inval_seq: 0,
                host_issued: 0,
                host_retired: 0,
                pend_keys: Vec::with_capacity(if split { self.pend_cap } else { 0 }),
                pend_ord: Vec::with_capacity(if split { self.pend_cap } else { 0 }),
                pend_head: 0,
                dpu_inflight: 0,
                hold: None,
                dpu_ctxs: 0,
                client_eof: false,
                host_eof: false,
                host_wr_shut: false,
                dirty: false,
                retry: false,
                gated: false,
            }));
            tracing::debug!(%peer, split, "connection accepted");
            self.mark(slot);
        }
    }

    fn reap_completions(&mut self) {
        let Worker {
            lane,
            pool,
            app,
            conns,
            dirty,
            stats,
            ..
        } = self;
        let mut failed: [usize; 16] = [usize::MAX; 16];
        let mut nfailed = 0;
        lane.poll_completions(|token, res| {
            let i = token as u32;
            let Some(ctx) = pool.ctxs.get(i as usize).copied() else {
                tracing::error!(token, "completion for an unknown context");
                return;
            };
            match ctx.state {
                CtxState::Orphan => {
                    pool.ctxs[i as usize].state = CtxState::Ready;
                    pool.release(i);
                    return;
                }
                CtxState::InFlight => {}
                _ => {
                    tracing::error!(token, "completion for a context not in flight");
                    return;
                }
            }
            let res = match res {
                Ok(n) if n <= ctx.op.size => {
                    add(&stats.offload_bytes, u64::from(n));
                    Ok(n)
                }
                Ok(_) => Err(status::IO),
                Err(code) => Err(code),
            };
            pool.ctxs[i as usize].state = CtxState::Ready;
            let (room, data) = pool.room_and_data(i);
            let room_len = room.len();
            let cap = data.len();
            let built =
                app.build_response(&ctx.head[..ctx.head_len as usize], &ctx.op, res, room, data);
            let slot = ctx.conn as usize;
            match built {
                Ok(l)
                    if (l.header_len as usize) <= room_len
                        && l.total_len >= l.header_len
                        && (l.total_len - l.header_len) as usize <= cap =>
                {
                    pool.ctxs[i as usize].layout = l;
                }
                other => {
                    if let Err(e) = other {
                        tracing::warn!(reason = e.0, "response builder failed");
                    } else {
                        tracing::warn!("response builder returned an out-of-range layout");
                    }
                    if nfailed < failed.len() {
                        failed[nfailed] = slot;
                        nfailed += 1;
                    }
                    pool.ctxs[i as usize].layout = Default::default();
                }
            }
            if let Some(c) = conns.get_mut(slot).and_then(|c| c.as_mut()) {
                if c.gen == ctx.gen {
                    c.dpu_inflight -= 1;
                    if c.dpu_inflight == 0 {
                        c.hold = None;
                    }
                    if !c.dirty {
                        c.dirty = true;
                        dirty.push(slot);
                    }
                }
            }
        });
        for &slot in &failed[..nfailed] {
            if self.conns[slot].is_some() {
                self.close(
                    slot,
                    Close::Malformed("offload app built an invalid response"),
                );
            }
        }
    }

    fn drive_dirty(&mut self) {
        let mut i = 0;
        // New dirty marks during the pass are appended and handled in the same pass.
        while i < self.dirty.len() {
            let slot = self.dirty[i];
            i += 1;
            if let Some(c) = self.conns[slot].as_mut() {
                c.dirty = false;
            } else {
                continue;
            }
            let r = if self.conns[slot].as_ref().is_some_and(|c| c.split) {
                self.drive_split(slot)
            } else {
                self.drive_splice(slot)
            };
            if let Err(how) = r {
                self.close(slot, how);
            }
        }
        self.dirty.clear();
    }

    fn close(&mut self, slot: usize, how: Close) {
        let Some(mut c) = self.conns[slot].take() else {
            return;
        };
        match how {
            Close::Done => tracing::debug!(peer = %c.peer, "connection closed"),
            Close::Malformed(reason) => {
                add(&self.stats.malformed, 1);
                tracing::warn!(peer = %c.peer, reason, "closing connection: malformed input");
            }
            Close::Abort(reason) => {
                add(&self.stats.aborted, 1);
                tracing::info!(peer = %c.peer, reason, "connection aborted");
                set_linger_zero(&c.client);
                set_linger_zero(&c.host);
            }
        }
        let reg = self.poll.registry();
        let _ = reg.deregister(&mut c.client);
        let _ = reg.deregister(&mut c.host);
        for e in c.order.drain(..) {
            if let Entry::Dpu { ctx } = e {
                match self.pool.ctxs[ctx as usize].state {
                    CtxState::InFlight => self.pool.ctxs[ctx as usize].state = CtxState::Orphan,
                    _ => self.pool.release(ctx),
                }
            }
        }
        self.free_slots.push(slot);
    }

    /// Reads from `s` into `buf`; Ok(true) on progress.
    fn read_into(
        s: &mut TcpStream,
        buf: &mut Buf,
        readable: &mut bool,
        eof: &mut bool,
        counter: &AtomicU64,
    ) -> Result<bool, Close> {
        if !*readable || *eof {
            return Ok(false);
        }
        let tail = buf.tail();
        if tail.is_empty() {
            return Ok(false);
        }
        match s.read(tail) {
            Ok(0) => {
                *eof = true;
                Ok(true)
            }
            Ok(n) => {
                buf.commit(n);
                add(counter, n as u64);
                Ok(true)
            }
            Err(e) if would_block(&e) => {
                *readable = false;
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(_) => Err(Close::Abort("connection reset")),
        }
    }

    fn write_from(
        s: &mut TcpStream,
        buf: &mut Buf,
        limit: usize,
        writable: &mut bool,
        counter: &AtomicU64,
    ) -> Result<bool, Close> {
        let n = buf.len().min(limit);
        if !*writable || n == 0 {
            return Ok(false);
        }
        match s.write(&buf.data()[..n]) {
            Ok(n) => {
                buf.consume(n);
                add(counter, n as u64);
                Ok(n > 0)
            }
            Err(e) if would_block(&e) => {
                *writable = false;
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(_) => Err(Close::Abort("connection reset")),
        }
    }

    fn check_host_connected(c: &mut Conn) -> Result<(), Close> {
        if c.host_connected || !(c.h_writable || c.h_readable) {
            return Ok(());
        }
        if let Ok(Some(_)) | Err(_) = c.host.take_error() {
            return Err(Close::Abort("host application unreachable"));
        }
        match c.host.peer_addr() {
            Ok(_) => {
                c.host_connected = true;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                c.h_writable = false;
                c.h_readable = false;
                Ok(())
            }
            Err(_) => Err(Close::Abort("host application unreachable")),
        }
    }

    fn drive_splice(&mut self, slot: usize) -> Result<(), Close> {
        let stats = self.stats.clone();
        let c = self.conns[slot].as_mut().expect("live");
        Self::check_host_connected(c)?;
        loop {
            let mut p = Self::read_into(
                &mut c.client,
                &mut c.cin,
                &mut c.c_readable,
                &mut c.client_eof,
                &stats.client_bytes_in,
            )?;
            if c.host_connected {
                p |= Self::write_from(
                    &mut c.host,
                    &mut c.cin,
                    usize::MAX,
                    &mut c.h_writable,
                    &stats.host_bytes_out,
                )?;
                p |= Self::read_into(
                    &mut c.host,
                    &mut c.hin,
                    &mut c.h_readable,
                    &mut c.host_eof,
                    &stats.host_bytes_in,
                )?;
            }
            p |= Self::write_from(
                &mut c.client,
                &mut c.hin,
                usize::MAX,
                &mut c.c_writable,
                &stats.client_bytes_out,
            )?;
            if c.client_eof && c.cin.is_empty() && c.host_connected && !c.host_wr_shut {
                let _ = c.host.shutdown(Shutdown::Write);
                c.host_wr_shut = true;
            }
            if c.host_eof && c.hin.is_empty() {
                let _ = c.client.shutdown(Shutdown::Write);
                if c.client_eof || c.host_wr_shut {
                    return Err(Close::Done);
                }
                if !c.client_eof {
                    // Keep relaying the client's bytes until it closes too.
                }
            }
            if c.host_eof && c.client_eof && c.hin.is_empty() && c.cin.is_empty() {
                return Err(Close::Done);
            }
            if !p {
                return Ok(());
            }
        }
    }

    fn drive_split(&mut self, slot: usize) -> Result<(), Close> {
        {
            let c = self.conns[slot].as_mut().expect("live");
            Self::check_host_connected(c)?;
        }
        loop {
            let stats = self.stats.clone();
            let mut p;
            {
                let c = self.conns[slot].as_mut().expect("live");
                p = Self::read_into(
                    &mut c.client,
                    &mut c.cin,
                    &mut c.c_readable,
                    &mut c.client_eof,
                    &stats.client_bytes_in,
                )?;
            }
            p |= self.process_messages(slot)?;
            let c = self.conns[slot].as_mut().expect("live");
            if c.host_connected {
                let allowed = c.hold.unwrap_or(usize::MAX);
                let queued = c.hout.len();
                p |= Self::write_from(
                    &mut c.host,
                    &mut c.hout,
                    allowed,
                    &mut c.h_writable,
                    &stats.host_bytes_out,
                )?;
                if let Some(h) = c.hold.as_mut() {
                    *h -= queued - c.hout.len();
                }
                let before = c.hin.len();
                p |= Self::read_into(
                    &mut c.host,
                    &mut c.hin,
                    &mut c.h_readable,
                    &mut c.host_eof,
                    &stats.host_bytes_in,
                )?;
                if c.hin.len() > before && c.host_pending == 0 {
                    return Err(Close::Malformed("host sent a response nobody asked for"));
                }
                if !c.hin.is_empty() {
                    match self.app.response_len(c.hin.data()) {
                        Err(m) => {
                            tracing::warn!(reason = m.0, "host response malformed");
                            return Err(Close::Malformed("host sent a malformed response"));
                        }
                        Ok(Some(n)) if n == 0 || n > self.max_resp => {
                            return Err(Close::Malformed("host response length out of range"));
                        }
                        Ok(Some(n)) => c.hin.fit(n),
                        Ok(None) => {}
                    }
                }
            }
            p |= self.flush_client(slot)?;
            let c = self.conns[slot].as_mut().expect("live");
            // Half-close: after the client's last message went out to the host.
            if c.client_eof
                && c.cin.is_empty()
                && c.hout.is_empty()
                && c.host_connected
                && !c.host_wr_shut
            {
                let _ = c.host.shutdown(Shutdown::Write);
                c.host_wr_shut = true;
            }
            if c.client_eof && !c.cin.is_empty() {
                // The stream ended inside a message: nothing more will complete it.
                let complete =
                    matches!(self.app.message_len(c.cin.data()), Ok(Some(n)) if n <= c.cin.len());
                if !complete {
                    // Answer what came before, then close as after a half-close.
                    tracing::warn!(peer = %c.peer, bytes = c.cin.len(), "stream truncated inside a message");
                    add(&self.stats.malformed, 1);
                    let n = c.cin.len();
                    c.cin.consume(n);
                    p = true;
                }
            }
            if c.host_eof {
                let stuck = match c.order.front() {
                    None => true,
                    Some(Entry::Host { .. }) => {
                        !matches!(self.app.response_len(c.hin.data()), Ok(Some(n)) if n <= c.hin.len())
                    }
                    Some(_) => false,
                };
                if stuck && c.cout.is_empty() {
                    if c.order.is_empty() {
                        let _ = c.client.shutdown(Shutdown::Write);
                        return Err(Close::Done);
                    }
                    return Err(Close::Abort("host closed with requests outstanding"));
                }
            }
            if !p {
                return Ok(());
            }
        }
    }

    /// Frames and splits complete client messages.
    fn process_messages(&mut self, slot: usize) -> Result<bool, Close> {
        let mut progress = false;
        loop {
            let Worker {
                app,
                cache,
                lane,
                pool,
                scratch: sc,
                stats,
                conns,
                retry: retry_list,
                ..
            } = self;
            let c = conns[slot].as_mut().expect("live");
            if c.host_eof || c.hold.is_some() {
                return Ok(progress);
            }
            let n = match app.message_len(c.cin.data()) {
                Err(m) => {
                    tracing::warn!(peer = %c.peer, reason = m.0, "malformed message");
                    return Err(Close::Malformed("malformed message framing"));
                }
                Ok(None) => return Ok(progress),
                Ok(Some(n)) if n == 0 || n > self.max_msg => {
                    return Err(Close::Malformed("message length out of range"));
                }
                Ok(Some(n)) => n,
            };
            if c.cin.len() < n {
                c.cin.fit(n);
                return Ok(progress);
            }
            if self.max_pending - c.order.len() < self.max_req {
                return Ok(progress);
            }
            if !c.hout.room(n) {
                return Ok(progress);
            }
            let msg = &c.cin.data()[..n];
            // Release pending keys of answered host requests; make room for this message.
            if c.pend_head > 0 {
                c.pend_keys.drain(..c.pend_head);
                c.pend_ord.drain(..c.pend_head);
                c.pend_head = 0;
            }
            let blind = false;
            sc.host.clear();
            sc.dpu.clear();
            let view = CacheView::restricted(cache, blind, &c.pend_keys, &[], 0);
            if let Err(m) = app.offload_predicate(msg, &view, &mut sc.host, &mut sc.dpu) {
                tracing::warn!(peer = %c.peer, reason = m.0, "offload predicate rejected a message");
                return Err(Close::Malformed(
                    "message rejected by the offload predicate",
                ));
            }
            // Validate the descriptors: inside the message, positions a permutation.
            let total = sc.host.len() + sc.dpu.len();
            if total == 0 || total > self.max_req {
                return Err(Close::Malformed(
                    "offload predicate returned no or too many requests",
                ));
            }
            sc.stamp_now = sc.stamp_now.wrapping_add(1);
            if sc.stamp_now == 0 {
                sc.stamp.fill(0);
                sc.stamp_now = 1;
            }
            for d in sc.host.as_slice().iter().chain(sc.dpu.as_slice()) {
                let end = d.offset as u64 + d.len as u64;
                if end > n as u64
                    || d.pos as usize >= total
                    || sc.stamp[d.pos as usize] == sc.stamp_now
                {
                    return Err(Close::Malformed(
                        "offload predicate returned an invalid descriptor",
                    ));
                }
                sc.stamp[d.pos as usize] = sc.stamp_now;
            }
            // Keys the host-bound requests invalidate, with their positions.
            sc.masked.clear();
            for i in 0..sc.host.len() {
                let d = sc.host.as_slice()[i];
                sc.keys.clear();
                app.invalidate_on_forward(msg, d, &mut sc.keys);
                if sc.keys.len() == sc.keys.capacity() {
                    return Err(Close::Malformed(
                        "too many invalidation keys for one request",
                    ));
                }
                for &k in sc.keys.as_slice() {
                    if sc.masked.push((k, d.pos)).is_err() {
                        return Err(Close::Malformed(
                            "too many invalidation keys in one message",
                        ));
                    }
                }
            }
            for i in 0..sc.host.len() {
                let d = sc.host.as_slice()[i];
                sc.plan[d.pos as usize] = (d, None, 0);
            }
            // Offload function for each DPU request; fall back to the host when out of
            // contexts or the read does not fit a buffer.
            let mut budget = pool
                .free_count()
                .min(self.max_ctx_per_conn.saturating_sub(c.dpu_ctxs));
            let mut fallback = 0u64;
            let mut offloaded = 0usize;
            for i in 0..sc.dpu.len() {
                let d = sc.dpu.as_slice()[i];
                let view =
                    CacheView::restricted(cache, blind, &c.pend_keys, sc.masked.as_slice(), d.pos);
                let decision = match app.offload_function(msg, d, &view) {
                    crate::api::Offload::Read(op)
                        if (op.size as usize) <= pool.capacity() && budget > 0 =>
                    {
                        budget -= 1;
                        offloaded += 1;
                        Some(op)
                    }
                    crate::api::Offload::Read(_) => {
                        fallback += 1;
                        None
                    }
                    crate::api::Offload::Host => None,
                };
                if decision.is_none() {
                    sc.keys.clear();
                    app.invalidate_on_forward(msg, d, &mut sc.keys);
                    if sc.keys.len() == sc.keys.capacity() {
                        return Err(Close::Malformed(
                            "too many invalidation keys for one request",
                        ));
                    }
                    for &k in sc.keys.as_slice() {
                        if sc.masked.push((k, d.pos)).is_err() {
                            return Err(Close::Malformed(
                                "too many invalidation keys in one message",
                            ));
                        }
                    }
                    if sc.host.push(d).is_err() {
                        return Err(Close::Malformed("too many requests"));
                    }
                }
                sc.plan[d.pos as usize] = (d, decision, 0);
            }
            if sc.masked.len() > lane.invalidation_room() {
                // The cache writer is behind: try again shortly.
                if !c.retry {
                    c.retry = true;
                    retry_list.push(slot);
                }
                return Ok(progress);
            }
            if !c.pend_keys.is_empty()
                && c.pend_keys.len() + sc.masked.len() > c.pend_keys.capacity()
            {
                // Too many keys awaiting host answers: continue when the host answers.
                return Ok(progress);
            }
            // Commit: invalidations first, then the host message, then the reads.
            sc.host.as_mut_slice().sort_unstable_by_key(|d| d.pos);
            for &(k, pos) in sc.masked.as_slice() {
                let rank = sc
                    .host
                    .as_slice()
                    .binary_search_by_key(&pos, |d| d.pos)
                    .unwrap_or(0) as u64;
                c.pend_keys.push(k);
                c.pend_ord.push(c.host_issued + rank + 1);
            }
            c.host_issued += sc.host.len() as u64;
            let mut gate = 0;
            if !sc.masked.is_empty() {
                let version = lane.current_version();
                for &(k, _) in sc.masked.as_slice() {
                    match lane.invalidate(k, version) {
                        Ok(seq) => gate = seq,
                        Err(_) => unreachable!("room checked"),
                    }
                }
                c.inval_seq = gate;
                add(&stats.invalidations, sc.masked.len() as u64);
            }
            let nhost = sc.host.len();
            let hout_before = c.hout.len();
            if nhost > 0 {
                let out = c.hout.tail();
                let len = if offloaded == 0 {
                    out[..n].copy_from_slice(msg);
                    n
                } else {
                    match app.build_host_message(msg, sc.host.as_slice(), &mut out[..n]) {
                        Ok(len) if len > 0 && len <= n => len,
                        Ok(_) => {
                            return Err(Close::Malformed(
                                "host-message builder returned a bad length",
                            ))
                        }
                        Err(m) => {
                            tracing::warn!(peer = %c.peer, reason = m.0, "host-message builder failed");
                            return Err(Close::Malformed("host-message builder failed"));
                        }
                    }
                };
                c.hout.commit(len);
            }
            for pos in 0..total {
                let (d, decision, _) = sc.plan[pos];
                match decision {
                    None => {
                        c.order.push_back(Entry::Host { gate });
                        c.host_pending += 1;
                    }
                    Some(op) => {
                        let ctx = pool.alloc().expect("budgeted");
                        let hl = (d.len as usize).min(REQUEST_HEAD_BYTES);
                        let cx = &mut pool.ctxs[ctx as usize];
                        cx.state = CtxState::InFlight;
                        cx.conn = slot as u32;
                        cx.gen = c.gen;
                        cx.op = op;
                        cx.head[..hl]
                            .copy_from_slice(&msg[d.offset as usize..d.offset as usize + hl]);
                        cx.head_len = hl as u8;
                        let dst = pool.data_ptr(ctx);
                        // SAFETY: the buffer holds `capacity() >= op.size` bytes and is not
                        // touched until the completion is polled (or leaked at shutdown).
                        if unsafe { lane.submit(op, dst, u64::from(ctx)) }.is_err() {
                            // Cannot happen (contexts <= port depth); answer Busy.
                            pool.ctxs[ctx as usize].state = CtxState::Ready;
                            let (room, data) = pool.room_and_data(ctx);
                            let l = app
                                .build_response(
                                    &msg[d.offset as usize..d.offset as usize + hl],
                                    &op,
                                    Err(status::BUSY),
                                    room,
                                    data,
                                )
                                .unwrap_or_default();
                            pool.ctxs[ctx as usize].layout = l;
                        } else {
                            c.dpu_inflight += 1;
                        }
                        c.order.push_back(Entry::Dpu { ctx });
                        c.dpu_ctxs += 1;
                    }
                }
            }
            if !sc.masked.is_empty() && nhost > 0 && c.dpu_inflight > 0 {
                // Keep this message's host part until the connection's offloaded reads
                // (earlier ones and this message's) have read the device.
                c.hold = Some(hout_before);
            }
            c.cin.consume(n);
            add(&stats.messages, 1);
            add(&stats.offloaded, offloaded as u64);
            add(&stats.forwarded, nhost as u64);
            add(&stats.fallback, fallback);
            progress = true;
        }
    }

    /// Sends ready responses in request order, straight from where they are (host input
    /// buffer, read buffers, or the copy-mode packet buffer).
    fn flush_client(&mut self, slot: usize) -> Result<bool, Close> {
        let mut progress = false;
        let applied = self.lane.invalidations_applied();
        loop {
            let Worker {
                app,
                pool,
                conns,
                stats,
                copy_mode,
                gated,
                ..
            } = self;
            let c = conns[slot].as_mut().expect("live");
            if *copy_mode {
                // Copy ready DPU responses into the packet buffer (the Fig. 20 baseline).
                for e in c.order.iter_mut() {
                    match *e {
                        Entry::Dpu { ctx } if pool.ctxs[ctx as usize].state == CtxState::Ready => {
                            let resp = pool.response(ctx);
                            if !c.cout.room(resp.len()) {
                                break;
                            }
                            let len = resp.len();
                            c.cout.tail()[..len].copy_from_slice(resp);
                            c.cout.commit(len);
                            pool.release(ctx);
                            c.dpu_ctxs -= 1;
                            *e = Entry::Copied { len: len as u32 };
                        }
                        Entry::Dpu { .. } => break,
                        _ => {}
                    }
                }
            }
            if !c.c_writable || c.order.is_empty() {
                return Ok(progress);
            }
            let empty: &[u8] = &[];
            let mut iov = [IoSlice::new(empty); IOV_MAX];
            let mut niov = 0;
            let mut hoff = 0usize;
            let mut coff = 0usize;
            let hin = c.hin.data();
            let cout = c.cout.data();
            for (k, e) in c.order.iter().enumerate() {
                if niov == IOV_MAX {
                    break;
                }
                let bytes: &[u8] = match *e {
                    Entry::Host { gate } => {
                        if gate > applied {
                            if !c.gated {
                                c.gated = true;
                                gated.push(slot);
                            }
                            break;
                        }
                        match app.response_len(&hin[hoff..]) {
                            Ok(Some(n)) if hin.len() - hoff >= n => {
                                let b = &hin[hoff..hoff + n];
                                hoff += n;
                                b
                            }
                            _ => break,
                        }
                    }
                    Entry::Dpu { ctx } => {
                        if pool.ctxs[ctx as usize].state != CtxState::Ready {
                            break;
                        }
                        pool.response(ctx)
                    }
                    Entry::Copied { len } => {
                        let b = &cout[coff..coff + len as usize];
                        coff += len as usize;
                        b
                    }
                };
                let b = if k == 0 { &bytes[c.head_sent..] } else { bytes };
                iov[niov] = IoSlice::new(b);
                niov += 1;
            }
            if niov == 0 {
                return Ok(progress);
            }
            let mut w = match (&c.client).write_vectored(&iov[..niov]) {
                Ok(w) => w,
                Err(e) if would_block(&e) => {
                    c.c_writable = false;
                    return Ok(progress);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(Close::Abort("client connection reset")),
            };
            add(&stats.client_bytes_out, w as u64);
            progress = true;
            // Retire what was sent.
            while w > 0 {
                let e = *c.order.front().expect("sent bytes belong to entries");
                let full = match e {
                    Entry::Host { .. } => app
                        .response_len(c.hin.data())
                        .ok()
                        .flatten()
                        .expect("framed above"),
                    Entry::Dpu { ctx } => pool.response(ctx).len(),
                    Entry::Copied { len } => len as usize,
                };
                let left = full - c.head_sent;
                if w < left {
                    c.head_sent += w;
                    break;
                }
                w -= left;
                c.head_sent = 0;
                c.order.pop_front();
                match e {
                    Entry::Host { .. } => {
                        c.hin.consume(full);
                        c.host_pending -= 1;
                        c.host_retired += 1;
                        while c.pend_head < c.pend_ord.len()
                            && c.pend_ord[c.pend_head] <= c.host_retired
                        {
                            c.pend_head += 1;
                        }
                    }
                    Entry::Dpu { ctx } => {
                        pool.release(ctx);
                        c.dpu_ctxs -= 1;
                    }
                    Entry::Copied { len } => c.cout.consume(len as usize),
                }
            }
        }
    }
}
