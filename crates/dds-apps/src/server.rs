//! The pagestore server: the host application of the paper's remote storage benchmark (§8.1).
//!
//! An acceptor thread hands connections round-robin to `threads` worker threads. Each worker
//! runs an edge-triggered epoll loop over its connections and its backend's completion
//! descriptor: it reads and validates whole messages, issues every request to the backend at
//! once (many in flight), and writes the responses back in request order as the head of each
//! connection's queue completes. Requests run concurrently, also within one connection: only
//! their responses are ordered, so a read racing an in-flight write of the same range may see
//! either content (a client wanting read-after-write waits for the write's response).
//!
//! Bounds per connection: at most `conn_max_ops` requests issued and not yet answered, at most
//! `conn_max_bytes` response bytes issued or buffered (one request is always allowed), and an
//! input buffer of one message (≤ 16 MiB) plus 64 KiB. When a bound is reached the worker stops
//! reading that socket, so TCP flow control pushes back on the client while the worker keeps
//! serving its other connections. A malformed message closes only its connection, with the
//! reason logged.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_queue::ArrayQueue;
use dds_host::Status;
use rustix::event::epoll;
use serde::Serialize;

use crate::pagestore::{
    encode_response_header, message_len, request_at, response_bytes, Message, OP_READ, OP_WRITE,
    RESP_HEADER_BYTES,
};
use dds_storage::aio::{
    AlignedBuf, AsyncStorage, BufPool, Completion, FileSet, SubmitError, WorkerIo,
};

mod stream;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Worker threads (each with its own epoll loop and backend queue).
    pub threads: usize,
    /// Response bytes issued or waiting to be sent, per connection.
    pub conn_max_bytes: usize,
    /// Requests issued and not yet answered, per connection.
    pub conn_max_ops: usize,
    /// Open connections at most; more are closed at accept (with a log line).
    pub max_connections: usize,
    /// Bytes all connections' input buffers may hold together (they grow with the bytes that
    /// arrive); a connection that needs more than is left is closed.
    pub input_memory_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:0".parse().expect("address"),
            threads: 1,
            conn_max_bytes: 4 << 20,
            conn_max_ops: 2048,
            max_connections: 1024,
            input_memory_bytes: 256 << 20,
        }
    }
}

/// Counters of a running server.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub closed: AtomicU64,
    pub closed_malformed: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Connections closed because the input memory budget was exhausted.
    pub closed_memory: AtomicU64,
    /// Bytes of input buffers held now (against `ServerConfig::input_memory_bytes`).
    pub input_bytes: AtomicU64,
}

/// A snapshot of [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections: u64,
    pub closed: u64,
    pub closed_malformed: u64,
    pub requests: u64,
    pub errors: u64,
    pub closed_memory: u64,
    pub input_bytes: u64,
}

impl ServerStats {
    /// Takes `n` bytes of input memory within `limit`; false (nothing taken) past it.
    fn take_input(&self, n: usize, limit: usize) -> bool {
        let (n, limit) = (n as u64, limit as u64);
        self.input_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(n).filter(|&x| x <= limit)
            })
            .is_ok()
    }

    fn give_input(&self, n: usize) {
        self.input_bytes.fetch_sub(n as u64, Ordering::AcqRel);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            connections: self.connections.load(Ordering::Relaxed),
            closed: self.closed.load(Ordering::Relaxed),
            closed_malformed: self.closed_malformed.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            closed_memory: self.closed_memory.load(Ordering::Relaxed),
            input_bytes: self.input_bytes.load(Ordering::Relaxed),
        }
    }
}

/// A running server; stopped by [`Server::shutdown`] or on drop.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    storage: Arc<dyn AsyncStorage>,
    stats: Arc<ServerStats>,
}

/// Epoll data of the wake eventfd and of the backend's completion descriptor.
const WAKE: u64 = u64::MAX;
const IO: u64 = u64::MAX - 1;
/// Ops the backend refused for now (Busy) at most before connections stop parsing.
const WAITING_MAX: usize = 512;
/// Input buffer slack beyond one message.
const IN_SLACK: usize = 64 << 10;

impl Server {
    pub fn start(config: ServerConfig, storage: Arc<dyn AsyncStorage>) -> Result<Server> {
        let threads = config.threads.max(1);
        let listener = TcpListener::bind(config.listen)
            .with_context(|| format!("listen {}", config.listen))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(ServerStats::default());
        let files = Arc::new(FileSet::new(storage.file_ids(), storage.file_size()));
        let mut handles = Vec::new();
        let mut inboxes = Vec::new();
        for i in 0..threads {
            let io = storage.worker(i)?;
            let inbox = Arc::new(Inbox {
                queue: ArrayQueue::new(1024),
                wake: rustix::event::eventfd(
                    0,
                    rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
                )?,
            });
            let mut w = Worker::new(
                i,
                io,
                inbox.clone(),
                files.clone(),
                config.clone(),
                stats.clone(),
                stop.clone(),
            )?;
            inboxes.push(inbox);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("pagestore-{i}"))
                    .spawn(move || w.run())?,
            );
        }
        let stop2 = stop.clone();
        let stats2 = stats.clone();
        handles.push(
            std::thread::Builder::new()
                .name("pagestore-accept".into())
                .spawn(move || {
                    accept_loop(listener, inboxes, &stop2, &stats2, config.max_connections)
                })?,
        );
        Ok(Server {
            addr,
            stop,
            threads: handles,
            storage,
            stats,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn storage(&self) -> &Arc<dyn AsyncStorage> {
        &self.storage
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Stops accepting, waits for in-flight I/O, and stops the workers.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        self.storage.shutdown();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

struct Inbox {
    queue: ArrayQueue<(TcpStream, SocketAddr)>,
    wake: OwnedFd,
}

fn accept_loop(
    listener: TcpListener,
    inboxes: Vec<Arc<Inbox>>,
    stop: &AtomicBool,
    stats: &ServerStats,
    max_connections: usize,
) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut next = 0usize;
    let timeout = Timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    while !stop.load(Ordering::Acquire) {
        let mut fds = [PollFd::new(&listener, PollFlags::IN)];
        if poll(&mut fds, Some(&timeout)).unwrap_or(0) == 0 {
            continue;
        }
        loop {
            match listener.accept() {
                Ok((s, peer)) => {
                    let open = stats.connections.load(Ordering::Relaxed)
                        - stats.closed.load(Ordering::Relaxed);
                    stats.connections.fetch_add(1, Ordering::Relaxed);
                    if open >= max_connections as u64 {
                        tracing::warn!(%peer, open, "too many connections: connection refused");
                        stats.closed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let inbox = &inboxes[next % inboxes.len()];
                    next = next.wrapping_add(1);
                    if inbox.queue.push((s, peer)).is_err() {
                        tracing::warn!(%peer, "worker inbox full: connection refused");
                        stats.closed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let _ = rustix::io::write(&inbox.wake, &1u64.to_ne_bytes());
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // E.g. EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
    }
}

/// One request being served.
struct Op {
    /// Index of the owning connection; `None` once the connection closed.
    conn: Option<usize>,
    op: u8,
    req_id: u64,
    file: u32,
    offset: u64,
    /// Bytes requested (read) or carried (write).
    len: u32,
    buf: Option<AlignedBuf>,
    done: bool,
    status: u16,
    bytes: u32,
}

impl Op {
    fn reserve(&self) -> usize {
        if self.op == OP_READ {
            response_bytes(self.len)
        } else {
            RESP_HEADER_BYTES
        }
    }
}

/// Where the worker is inside the current message.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    len: usize,
    at: usize,
    left: usize,
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    inbuf: Vec<u8>,
    in_start: usize,
    in_end: usize,
    out: Vec<u8>,
    out_sent: usize,
    pending: VecDeque<usize>,
    /// Response bytes reserved by `pending`.
    pending_bytes: usize,
    cur: Option<Cursor>,
    readable: bool,
    writable: bool,
    eof: bool,
    dirty: bool,
}

impl Conn {
    fn unsent(&self) -> usize {
        self.out.len() - self.out_sent
    }
}

enum Close {
    /// Orderly end of the stream, or a socket error.
    Normal(String),
    /// The client broke the protocol.
    Malformed(String),
}

struct Worker {
    index: usize,
    epoll: OwnedFd,
    inbox: Arc<Inbox>,
    io: Box<dyn WorkerIo>,
    conns: Vec<Option<Conn>>,
    free_conns: Vec<usize>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<usize>,
    waiting: VecDeque<usize>,
    /// Connections that stopped parsing because `waiting` was full.
    stalled: Vec<usize>,
    dirty: Vec<usize>,
    completions: Vec<Completion>,
    pool: BufPool,
    files: Arc<FileSet>,
    cfg: ServerConfig,
    stats: Arc<ServerStats>,
    stop: Arc<AtomicBool>,
}

impl Worker {
    fn new(
        index: usize,
        io: Box<dyn WorkerIo>,
        inbox: Arc<Inbox>,
        files: Arc<FileSet>,
        cfg: ServerConfig,
        stats: Arc<ServerStats>,
        stop: Arc<AtomicBool>,
    ) -> Result<Worker> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &ep,
            &inbox.wake,
            epoll::EventData::new_u64(WAKE),
            epoll::EventFlags::IN,
        )?;
        epoll::add(
            &ep,
            io.event_fd(),
            epoll::EventData::new_u64(IO),
            epoll::EventFlags::IN,
        )?;
        Ok(Worker {
            index,
            epoll: ep,
            inbox,
            io,
            conns: Vec::new(),
            free_conns: Vec::new(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            waiting: VecDeque::new(),
            stalled: Vec::new(),
            dirty: Vec::new(),
            completions: Vec::new(),
            pool: BufPool::new(256),
            files,
            cfg,
            stats,
            stop,
        })
    }

    fn run(&mut self) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        while !self.stop.load(Ordering::Acquire) {
            let busy = !self.waiting.is_empty() || !self.dirty.is_empty();
            let timeout = rustix::event::Timespec {
                tv_sec: 0,
                tv_nsec: if busy { 200_000 } else { 100_000_000 },
            };
            events.clear();
            match epoll::wait(
                &self.epoll,
                rustix::buffer::spare_capacity(&mut events),
                Some(&timeout),
            ) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    tracing::error!(error = %e, worker = self.index, "epoll_wait failed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let mut accept = false;
            let mut completions = false;
            for ev in &events {
                let data = ev.data.u64();
                let flags = ev.flags;
                match data {
                    WAKE => accept = true,
                    IO => completions = true,
                    idx => {
                        if let Some(Some(c)) = self.conns.get_mut(idx as usize) {
                            use epoll::EventFlags as F;
                            if flags.intersects(F::IN | F::HUP | F::RDHUP | F::ERR) {
                                c.readable = true;
                            }
                            if flags.intersects(F::OUT | F::HUP | F::ERR) {
                                c.writable = true;
                            }
                            mark_dirty(&mut self.dirty, c, idx as usize);
                        }
                    }
                }
            }
            if completions {
                self.reap();
            }
            self.retry_waiting();
            if self.waiting.len() < WAITING_MAX {
                for ci in std::mem::take(&mut self.stalled) {
                    if let Some(Some(c)) = self.conns.get_mut(ci) {
                        mark_dirty(&mut self.dirty, c, ci);
                    }
                }
            }
            let dirty = std::mem::take(&mut self.dirty);
            for &ci in &dirty {
                if let Some(Some(c)) = self.conns.get_mut(ci) {
                    c.dirty = false;
                    self.progress(ci);
                }
            }
            let mut recycled = dirty;
            recycled.clear();
            if self.dirty.is_empty() {
                self.dirty = recycled;
            }
            self.io.commit();
            if accept {
                self.accept();
            }
        }
        self.drain_on_stop();
    }

    /// At shutdown: waits (bounded) for in-flight I/O, whose buffers the backend still uses.
    fn drain_on_stop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for ci in 0..self.conns.len() {
            if self.conns[ci].is_some() {
                self.close(ci, Close::Normal("server stopping".into()));
            }
        }
        self.waiting.clear();
        while self.io.inflight() > 0 && Instant::now() < deadline {
            self.io.commit();
            self.reap();
            std::thread::sleep(Duration::from_millis(1));
        }
        if self.io.inflight() > 0 {
            // Keep the buffers alive rather than free memory the device may still write.
            tracing::error!(
                inflight = self.io.inflight(),
                "I/O still in flight at shutdown; leaking its buffers"
            );
            for op in self.ops.drain(..).flatten() {
                if let Some(b) = op.buf {
                    std::mem::forget(b);
                }
            }
        }
    }

    fn accept(&mut self) {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.inbox.wake, &mut v);
        while let Some((stream, peer)) = self.inbox.queue.pop() {
            if let Err(e) = stream.set_nonblocking(true) {
                tracing::warn!(%peer, error = %e, "cannot make the socket non-blocking");
                continue;
            }
            let _ = stream.set_nodelay(true);
            if !self.stats.take_input(IN_SLACK, self.cfg.input_memory_bytes) {
                tracing::warn!(%peer, "input memory budget exhausted: closing new connection");
                self.stats.closed_memory.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let ci = match self.free_conns.pop() {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            use epoll::EventFlags as F;
            if let Err(e) = epoll::add(
                &self.epoll,
                &stream,
                epoll::EventData::new_u64(ci as u64),
                F::IN | F::OUT | F::RDHUP | F::ET,
            ) {
                tracing::warn!(%peer, error = %e, "epoll_ctl add failed");
                self.free_conns.push(ci);
                self.stats.give_input(IN_SLACK);
                continue;
            }
            tracing::debug!(%peer, worker = self.index, "connection accepted");
            let mut c = Conn {
                stream,
                peer,
                inbuf: vec![0u8; IN_SLACK],
                in_start: 0,
                in_end: 0,
                out: Vec::with_capacity(64 << 10),
                out_sent: 0,
                pending: VecDeque::new(),
                pending_bytes: 0,
                cur: None,
                readable: true,
                writable: true,
                eof: false,
                dirty: false,
            };
            mark_dirty(&mut self.dirty, &mut c, ci);
            self.conns[ci] = Some(c);
        }
    }

    fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.completions);
        self.io.reap(&mut done);
        for c in done.drain(..) {
            self.complete(c.token as usize, c.status, c.bytes);
        }
        self.completions = done;
    }

    fn complete(&mut self, oi: usize, status: u16, bytes: u32) {
        let Some(Some(op)) = self.ops.get_mut(oi) else {
            tracing::error!(token = oi, "completion for an unknown operation");
            return;
        };
        op.done = true;
        op.status = status;
        op.bytes = bytes.min(op.len);
        match op.conn {
            Some(ci) => {
                if let Some(Some(c)) = self.conns.get_mut(ci) {
                    mark_dirty(&mut self.dirty, c, ci);
                }
            }
            None => self.free_op(oi),
        }
    }

    fn free_op(&mut self, oi: usize) {
        if let Some(op) = self.ops.get_mut(oi).and_then(Option::take) {
            if let Some(b) = op.buf {
                self.pool.put(b);
            }
            self.free_ops.push(oi);
        }
    }

    fn retry_waiting(&mut self) {
        while let Some(&oi) = self.waiting.front() {
            let Some(Some(op)) = self.ops.get(oi) else {
                self.waiting.pop_front();
                continue;
            };
            if op.conn.is_none() {
                self.waiting.pop_front();
                self.free_op(oi);
                continue;
            }
            match self.submit(oi) {
                Err(SubmitError::Busy) => return,
                _ => {
                    self.waiting.pop_front();
                }
            }
        }
    }

    /// Hands an op to the backend; completes it at once on a failure.
    fn submit(&mut self, oi: usize) -> Result<(), SubmitError> {
        let Some(Some(op)) = self.ops.get_mut(oi) else {
            return Ok(());
        };
        let Some(buf) = op.buf.as_mut() else {
            return Ok(());
        };
        let ptr = buf.as_mut_ptr();
        let (write, len) = (op.op == OP_WRITE, op.len);
        let (file, offset) = (op.file, op.offset);
        // SAFETY: the buffer is owned by the op, which is freed only after its completion
        // (or, at shutdown, leaked while I/O is still in flight).
        let r = unsafe { self.io.submit(write, file, offset, ptr, len, oi as u64) };
        match r {
            Err(SubmitError::Failed(status)) => {
                self.complete(oi, status, 0);
                Ok(())
            }
            other => other,
        }
    }

    fn progress(&mut self, ci: usize) {
        loop {
            let mut moved = self.drain_done(ci);
            match self.write_out(ci) {
                Ok(m) => moved |= m,
                Err(why) => return self.close(ci, why),
            }
            match self.issue(ci) {
                Ok(m) => moved |= m,
                Err(why) => return self.close(ci, why),
            }
            match self.read_in(ci) {
                Ok(m) => moved |= m,
                Err(why) => return self.close(ci, why),
            }
            if !moved {
                break;
            }
        }
        let Some(Some(c)) = self.conns.get(ci) else {
            return;
        };
        if c.eof && c.pending.is_empty() && c.unsent() == 0 {
            let left = c.in_end - c.in_start;
            if left == 0 {
                self.close(ci, Close::Normal("end of stream".into()));
            } else if c.cur.is_none() {
                let why = format!("stream ended inside a message ({left} bytes buffered)");
                self.close(ci, Close::Malformed(why));
            }
        }
    }

    fn close(&mut self, ci: usize, why: Close) {
        let Some(c) = self.conns.get_mut(ci).and_then(Option::take) else {
            return;
        };
        let _ = epoll::delete(&self.epoll, c.stream.as_fd());
        self.stats.give_input(c.inbuf.len());
        match &why {
            Close::Normal(r) => tracing::debug!(peer = %c.peer, reason = %r, "connection closed"),
            Close::Malformed(r) => {
                self.stats.closed_malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %c.peer, reason = %r, "closing connection: protocol violation");
            }
        }
        self.stats.closed.fetch_add(1, Ordering::Relaxed);
        for oi in c.pending {
            let Some(Some(op)) = self.ops.get_mut(oi) else {
                continue;
            };
            op.conn = None;
            // Done ops (and ops not yet handed to the backend) can go now; in-flight ones are
            // freed by their completion, waiting ones by `retry_waiting`.
            if op.done {
                self.free_op(oi);
            }
        }
        self.free_conns.push(ci);
    }
}

fn mark_dirty(dirty: &mut Vec<usize>, c: &mut Conn, ci: usize) {
    if !c.dirty {
        c.dirty = true;
        dirty.push(ci);
    }
}
