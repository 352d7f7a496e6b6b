//! The pagestore server: the host application of the paper's remote storage benchmark (§8.1),
//! a service on the server runtime (`dds-server`, `docs/server-runtime.md`).
//!
//! `threads` event loops (one thread each) share one listening socket, whichever loop is free
//! accepting the next connection, and one memory budget. Each loop owns its backend's I/O
//! interface, whose completion descriptor is the loop's wake-up source. A loop reads and
//! validates whole messages and issues every request to the backend at once (many in flight):
//! each request reserves its response's place in the connection's output (`Out::defer`) and
//! becomes a pending operation; completions fill the places in request order (an op that
//! finished early keeps its buffer until the ones before it are answered), so each response is
//! written straight into the output, and the runtime sends them in request order. Requests run concurrently, also within one connection: only
//! their responses are ordered, so a read racing an in-flight write of the same range may see
//! either content (a client wanting read-after-write waits for the write's response), except
//! that a request overlapping an unfinished write of its own connection (or a write
//! overlapping an unfinished request) waits for it.
//!
//! Bounds per connection: at most `conn_max_ops` requests issued and not yet answered in
//! order, at most `conn_max_bytes` response bytes reserved by them (one request is always
//! allowed) and at most `conn_max_bytes` response bytes waiting for the client, and input of
//! one message (≤ 16 MiB) plus 64 KiB. When a bound is reached the loop stops reading that
//! socket, so TCP flow control pushes back on the client while the loop keeps serving its
//! other connections. Connections' buffers are charged to `input_memory_bytes`; a connection
//! the budget cannot pay for is closed. A malformed message closes only its connection (after
//! the responses to the requests before it), with the reason logged; so does a connection that
//! closes inside a message.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dds_server::{Budget, Completions, Config, ConnId, LoopCounters, Out, Service, Ticket};
use serde::Serialize;

use crate::pagestore::{encode_response_header, response_bytes, OP_READ, RESP_HEADER_BYTES};
use dds_storage::aio::{
    AlignedBuf, AsyncStorage, BufPool, Completion, FileSet, SubmitError, WorkerIo,
};

mod stream;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Worker threads (each with its own event loop and backend queue).
    pub threads: usize,
    /// Response bytes issued and not yet answered in order, per connection; and response
    /// bytes waiting for the client above which the connection is not read.
    pub conn_max_bytes: usize,
    /// Requests issued and not yet answered, per connection.
    pub conn_max_ops: usize,
    /// Open connections at most (all threads); more are closed at accept (with a log line).
    pub max_connections: usize,
    /// Bytes all connections' buffers may hold together (they grow with the bytes that
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

dds_server::counters! {
    /// What the pagestore service did, all threads together.
    pub struct ServiceCounters => pub struct ServiceStats {
        /// Connections closed for breaking the protocol (or closing inside a message).
        closed_malformed,
        /// Requests answered.
        requests,
        /// Requests answered with an error status.
        errors,
    }
}

/// A snapshot of a running server's counters.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Connections accepted (refused ones included).
    pub connections: u64,
    /// Connections closed (refused ones included).
    pub closed: u64,
    pub closed_malformed: u64,
    pub requests: u64,
    pub errors: u64,
    /// Connections closed because the memory budget was exhausted.
    pub closed_memory: u64,
    /// Bytes of connection buffers held now (against `ServerConfig::input_memory_bytes`).
    pub input_bytes: u64,
}

/// A running server; stopped by [`Server::shutdown`] or on drop.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    storage: Arc<dyn AsyncStorage>,
    counters: Arc<ServiceCounters>,
    loops: Vec<Arc<LoopCounters>>,
    budget: Arc<Budget>,
}

/// Ops the backend refused for now (Busy) at most before connections stop parsing.
const WAITING_MAX: usize = 512;
/// Input beyond one message.
const IN_SLACK: usize = 64 << 10;
/// Completions one reap can return at most (the DDS group's slots; an io_uring's completion
/// queue is smaller).
const REAP_MAX: usize = dds_storage::aio::DDS_GROUP_SLOTS as usize;
/// Longest wait for I/O still in flight when a loop stops.
const IO_DRAIN: Duration = Duration::from_secs(10);

impl Server {
    pub fn start(config: ServerConfig, storage: Arc<dyn AsyncStorage>) -> Result<Server> {
        let threads = config.threads.max(1);
        let listener = dds_server::bind_listener(config.listen)
            .with_context(|| format!("listen {}", config.listen))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(ServiceCounters::default());
        let budget = Budget::new(config.input_memory_bytes);
        let open = Arc::new(AtomicUsize::new(0));
        let files = Arc::new(FileSet::new(storage.file_ids(), storage.file_size()));
        let rt = Config {
            // Each loop may hold every connection; the limit holds across loops (`open`).
            max_connections: config.max_connections.max(1) + 16,
            input_limit: crate::pagestore::MSG_BYTES_MAX + IN_SLACK,
            output_pause: config.conn_max_bytes.max(1),
            drain: Duration::from_secs(2),
            ..Config::default()
        };
        let mut loops = Vec::new();
        let mut servers = Vec::new();
        for i in 0..threads {
            let service = PagestoreService {
                io: storage.worker(i)?,
                ops: Vec::new(),
                free_ops: Vec::new(),
                waiting: VecDeque::new(),
                stalled: Vec::new(),
                // As many as the backend can complete at once: reaping never grows it.
                completions: Vec::with_capacity(REAP_MAX),
                pool: BufPool::new(256),
                files: files.clone(),
                cfg: config.clone(),
                counters: counters.clone(),
                open: open.clone(),
                refuse: Vec::new(),
            };
            let server = dds_server::Server::from_listener(
                listener.try_clone()?,
                rt.clone(),
                budget.clone(),
                service,
            )
            .context("event loop")?;
            loops.push(server.counters());
            servers.push(server);
        }
        drop(listener);
        let mut handles = Vec::new();
        for (i, server) in servers.into_iter().enumerate() {
            let stop = stop.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("pagestore-{i}"))
                    .spawn(move || {
                        server.run(&stop);
                    })?,
            );
        }
        Ok(Server {
            addr,
            stop,
            threads: handles,
            storage,
            counters,
            loops,
            budget,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn storage(&self) -> &Arc<dyn AsyncStorage> {
        &self.storage
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = self.counters.snapshot();
        let mut snap = StatsSnapshot {
            closed_malformed: s.closed_malformed,
            requests: s.requests,
            errors: s.errors,
            input_bytes: self.budget.used() as u64,
            ..StatsSnapshot::default()
        };
        for l in &self.loops {
            let l = l.snapshot();
            snap.connections += l.accepted + l.rejected;
            snap.closed += l.closed + l.rejected;
            snap.closed_memory += l.out_of_memory;
        }
        snap
    }

    /// Stops accepting, answers what is in flight (briefly), and stops the workers.
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

/// One request in flight (or waiting for the backend).
struct Op {
    /// The owning connection; `None` once it closed.
    conn: Option<ConnId>,
    /// Where its response goes.
    ticket: Ticket,
    op: u8,
    req_id: u64,
    file: u32,
    offset: u64,
    /// Bytes requested (read) or carried (write).
    len: u32,
    buf: Option<AlignedBuf>,
    /// Completed (its response waits for the ones before it, or is written).
    done: bool,
    status: u16,
    /// Bytes read or written.
    bytes: u32,
}

impl Op {
    fn reserve(&self) -> usize {
        reserve(self.op, self.len)
    }
}

/// Response bytes a request reserves.
fn reserve(op: u8, len: u32) -> usize {
    if op == OP_READ {
        response_bytes(len)
    } else {
        RESP_HEADER_BYTES
    }
}

/// Where a connection is inside the message at the start of its input.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    len: usize,
    at: usize,
    left: usize,
}

/// A connection of the pagestore service.
pub struct PagestoreSession {
    /// Deferred requests not yet answered in order (ops, oldest first).
    queue: VecDeque<u32>,
    /// Response bytes reserved by `queue`.
    reserved: usize,
    /// Writes in `queue` not finished (a read can conflict only with one of them).
    writes: u32,
    /// The message being issued (at the start of the input).
    cur: Option<Cursor>,
    /// Stopped at a per-connection bound or a conflict: resumed by its next completion.
    stalled: bool,
    /// Stopped because too many ops wait for the backend: in the service's `stalled` list.
    backend_stall: bool,
    /// Bytes of an incomplete message left in the input.
    partial: usize,
    /// Over the connection limit: closed at once.
    refused: bool,
}

/// The pagestore protocol over one backend I/O interface: the service of one event loop.
pub struct PagestoreService {
    io: Box<dyn WorkerIo>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<u32>,
    /// Ops the backend refused for now, in order.
    waiting: VecDeque<u32>,
    /// Connections that stopped parsing because `waiting` was full.
    stalled: Vec<ConnId>,
    completions: Vec<Completion>,
    pool: BufPool,
    files: Arc<FileSet>,
    cfg: ServerConfig,
    counters: Arc<ServiceCounters>,
    /// Connections open on every loop.
    open: Arc<AtomicUsize>,
    /// New connections over the limit, closed at the next completion pass.
    refuse: Vec<ConnId>,
}

/// Appends a response to `out`: the header, then a read's data padded to 8 bytes.
fn write_response(out: &mut Vec<u8>, status: u16, op: u8, req_id: u64, bytes: u32, data: &[u8]) {
    let ok = status == 0;
    let len = if ok { bytes } else { 0 };
    let mut h = [0u8; RESP_HEADER_BYTES];
    encode_response_header(&mut h, status, op, req_id, len);
    out.extend_from_slice(&h);
    if ok && op == OP_READ && bytes > 0 {
        let n = (bytes as usize).min(data.len());
        out.extend_from_slice(&data[..n]);
        let padded = response_bytes(bytes) - RESP_HEADER_BYTES;
        out.resize(out.len() + padded - n, 0);
    }
}

impl PagestoreService {
    fn count_response(&self, status: u16) {
        self.counters.add(&self.counters.requests, 1);
        if status != 0 {
            self.counters.add(&self.counters.errors, 1);
        }
    }

    fn new_op(&mut self, op: Op) -> u32 {
        match self.free_ops.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        }
    }

    fn free_op(&mut self, oi: u32) {
        if let Some(op) = self.ops.get_mut(oi as usize).and_then(Option::take) {
            if let Some(b) = op.buf {
                self.pool.put(b);
            }
            self.free_ops.push(oi);
        }
    }

    /// Hands an op to the backend.
    fn submit(&mut self, oi: u32) -> Result<(), SubmitError> {
        let Some(op) = self.ops.get_mut(oi as usize).and_then(Option::as_mut) else {
            return Ok(());
        };
        let Some(buf) = op.buf.as_mut() else {
            return Ok(());
        };
        let ptr = buf.as_mut_ptr();
        // SAFETY: the buffer is owned by the op, which is freed only after its completion
        // (or, at shutdown, leaked while I/O is still in flight).
        unsafe {
            self.io.submit(
                op.op == crate::pagestore::OP_WRITE,
                op.file,
                op.offset,
                ptr,
                op.len,
                u64::from(oi),
            )
        }
    }

    /// An op finished. Responses fill their slots in request order (each straight into the
    /// connection's output): the finished ops at the head of the connection's queue are
    /// answered, and a later one waits, holding its buffer, for the ones before it.
    fn finish(
        &mut self,
        done: &mut Completions<'_, PagestoreSession>,
        oi: u32,
        status: u16,
        bytes: u32,
    ) {
        let Some(op) = self.ops.get_mut(oi as usize).and_then(Option::as_mut) else {
            tracing::error!(token = oi, "completion for an unknown operation");
            return;
        };
        let Some(id) = op.conn else {
            self.free_op(oi);
            return;
        };
        op.done = true;
        op.status = status;
        op.bytes = bytes.min(op.len);
        if op.op == crate::pagestore::OP_WRITE {
            if let Some((s, _)) = done.reply(id) {
                s.writes = s.writes.saturating_sub(1);
            }
        }
        loop {
            let Some((s, _)) = done.reply(id) else {
                return;
            };
            let Some(&front) = s.queue.front() else {
                break;
            };
            let Some(o) = self.ops.get_mut(front as usize).and_then(Option::as_mut) else {
                s.queue.pop_front();
                continue;
            };
            if !o.done {
                break;
            }
            let buf = o.buf.take();
            let (kind, req_id, ticket, status, bytes) =
                (o.op, o.req_id, o.ticket, o.status, o.bytes);
            let reserved = o.reserve();
            let s = match done.fill(id, ticket) {
                Some((s, out)) => {
                    let data = buf.as_ref().map_or(&[][..], |b| b.as_slice());
                    write_response(out, status, kind, req_id, bytes, data);
                    Some(s)
                }
                None => done.reply(id).map(|(s, _)| s),
            };
            if let Some(s) = s {
                s.queue.pop_front();
                s.reserved = s.reserved.saturating_sub(reserved);
            }
            if let Some(b) = buf {
                self.pool.put(b);
            }
            self.count_response(status);
            self.free_op(front);
        }
        if let Some((s, _)) = done.reply(id) {
            if std::mem::take(&mut s.stalled) {
                done.resume(id);
            }
        }
    }

    fn retry_waiting(&mut self, done: &mut Completions<'_, PagestoreSession>) {
        while let Some(&oi) = self.waiting.front() {
            let Some(op) = self.ops.get(oi as usize).and_then(Option::as_ref) else {
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
                Err(SubmitError::Failed(status)) => {
                    self.waiting.pop_front();
                    self.finish(done, oi, status, 0);
                }
                Ok(()) => {
                    self.waiting.pop_front();
                }
            }
        }
    }
}

impl Service for PagestoreService {
    type Session = PagestoreSession;

    fn open(&mut self, id: ConnId) -> PagestoreSession {
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        let refused = before >= self.cfg.max_connections;
        if refused {
            tracing::warn!(open = before, "too many connections: connection refused");
            self.refuse.push(id);
        }
        PagestoreSession {
            queue: VecDeque::new(),
            reserved: 0,
            writes: 0,
            cur: None,
            stalled: false,
            backend_stall: false,
            partial: 0,
            refused,
        }
    }

    fn on_input(
        &mut self,
        id: ConnId,
        s: &mut PagestoreSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, dds_server::Verdict) {
        self.issue(id, s, input, out)
    }

    fn input_overflow(&mut self, _out: &mut Out<'_>) {
        // Not reached: a message's header bounds it, and input is read only while no
        // message waits. The connection is closed without a response.
        self.counters.add(&self.counters.closed_malformed, 1);
    }

    fn rejected(&self) -> &'static [u8] {
        b""
    }

    fn complete(&mut self, done: &mut Completions<'_, PagestoreSession>) {
        for id in self.refuse.drain(..) {
            done.close(id);
        }
        // Called on every wake-up: the backend is asked only when it has something.
        if self.io.ready() {
            let mut completions = std::mem::take(&mut self.completions);
            self.io.reap(&mut completions);
            for c in completions.drain(..) {
                self.finish(done, c.token as u32, c.status, c.bytes);
            }
            self.completions = completions;
        }
        self.retry_waiting(done);
        if self.waiting.len() < WAITING_MAX && !self.stalled.is_empty() {
            let mut stalled = std::mem::take(&mut self.stalled);
            for id in stalled.drain(..) {
                if let Some((s, _)) = done.reply(id) {
                    s.backend_stall = false;
                    s.stalled = false;
                }
                done.resume(id);
            }
            self.stalled = stalled;
        }
        self.io.commit();
    }

    fn end_round(&mut self) -> bool {
        self.io.commit();
        true
    }

    fn closed(&mut self, _id: ConnId, s: PagestoreSession) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        if s.partial > 0 && !s.refused {
            self.counters.add(&self.counters.closed_malformed, 1);
            tracing::warn!(
                bytes = s.partial,
                "closing connection: protocol violation: stream ended inside a message"
            );
        }
        for oi in s.queue {
            let Some(op) = self.ops.get_mut(oi as usize).and_then(Option::as_mut) else {
                continue;
            };
            op.conn = None;
            // Done ops can go now; in-flight ones are freed by their completion, waiting
            // ones by `retry_waiting`.
            if op.done {
                self.free_op(oi);
            }
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.io.event_fd().as_raw_fd())
    }

    fn prepare_sleep(&mut self) -> bool {
        self.io.commit();
        // Ops refused for now with none of ours in flight: no completion will wake the
        // loop, so it retries without sleeping.
        self.waiting.is_empty() || self.io.inflight() > 0
    }

    fn in_flight(&self) -> usize {
        self.io.inflight()
    }

    fn shutdown(&mut self) {
        // The backend still owns the buffers of I/O in flight: wait (bounded) for it.
        let deadline = Instant::now() + IO_DRAIN;
        self.waiting.clear();
        let mut completions = std::mem::take(&mut self.completions);
        while self.io.inflight() > 0 && Instant::now() < deadline {
            self.io.commit();
            self.io.reap(&mut completions);
            for c in completions.drain(..) {
                self.free_op(c.token as u32);
            }
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
}
