//! The event loop: accepting into the slab, reading and offering input, completions of
//! pending operations, rounds, deadlines and the drain on stop.

use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::conn::{Conn, Out, ReadOutcome, Ticket};
use crate::io::Io;
use crate::{Backend, Config, ConnId, Service, Verdict};

/// What a backend read for a connection.
pub(crate) enum Input<'a> {
    /// Bytes that arrived (in the loop's scratch buffer or a buffer of the backend).
    Data(&'a [u8]),
    /// Nothing more now.
    WouldBlock,
    /// The peer closed or the socket failed.
    Closed,
}
/// How often deadlines are checked when some are set.
const SWEEP: Duration = Duration::from_millis(50);

crate::counters! {
    /// What an event loop did.
    pub struct LoopCounters => pub struct LoopStats {
        /// Connections accepted.
        accepted,
        /// Connections refused (the slab was full).
        rejected,
        /// Connections closed.
        closed,
        /// Connections closed for an incomplete request older than the frame deadline.
        frame_timeouts,
        /// Connections closed for having been idle past the idle limit.
        idle_timeouts,
        /// Connections closed for input over the per-connection limit.
        input_overflows,
        /// Connections closed because the memory budget could not pay for their buffers.
        out_of_memory,
        /// Rounds whose replies the service withheld.
        failed_rounds,
        /// io_uring: multishot requests (a connection's receive, the accept, the poll of the
        /// service's descriptor) that the kernel ended and the loop started again.
        uring_rearms,
        /// io_uring: receives ended because every receive buffer was lent out.
        uring_no_buffers,
        /// io_uring: waits that found completions held back by a full completion queue.
        uring_cq_overflows,
    }
}

/// Completion of pending operations, handed to [`Service::complete`].
pub struct Completions<'a, S> {
    conns: &'a mut [Option<Conn<S>>],
    touched: &'a mut Vec<u32>,
    ready: &'a mut Vec<u32>,
}

impl<S> Completions<'_, S> {
    fn live(&mut self, id: ConnId) -> Option<&mut Conn<S>> {
        self.conns
            .get_mut(id.slot as usize)
            .and_then(Option::as_mut)
            .filter(|c| c.id == id && !c.dead)
    }

    /// The session and the reply sink of a connection, to write a pending request's reply
    /// (it is the connection's oldest unanswered one); `None` when the connection is gone.
    pub fn reply(&mut self, id: ConnId) -> Option<(&mut S, Out<'_>)> {
        let c = self
            .conns
            .get_mut(id.slot as usize)
            .and_then(Option::as_mut)
            .filter(|c| c.id == id && !c.dead)?;
        if !c.touched {
            c.touched = true;
            self.touched.push(id.slot);
        }
        let Conn {
            session,
            out,
            held,
            next_ticket,
            spare,
            ..
        } = c;
        Some((
            session.as_mut().expect("open session"),
            Out {
                out,
                held,
                next_ticket,
                spare,
            },
        ))
    }

    /// The session and the buffer of the reply slot `ticket` reserved with [`Out::defer`]
    /// (or [`Out::defer_written`]: what it holds already leaves first); `None` when the
    /// connection is gone (or the slot was filled). A slot that no earlier reply waits before
    /// (slots filled in request order) is the output itself: its reply is written there,
    /// without a second copy.
    pub fn fill(&mut self, id: ConnId, ticket: Ticket) -> Option<(&mut S, &mut Vec<u8>)> {
        let c = self
            .conns
            .get_mut(id.slot as usize)
            .and_then(Option::as_mut)
            .filter(|c| c.id == id && !c.dead)?;
        if !c.touched {
            c.touched = true;
            self.touched.push(id.slot);
        }
        c.promote();
        if c.held
            .front()
            .is_some_and(|p| p.ticket == ticket.0 && !p.filled)
        {
            let mut p = c.held.pop_front().expect("front");
            c.out.extend_from_slice(&p.bytes);
            p.bytes.clear();
            c.spare.push(p.bytes);
            return Some((c.session.as_mut().expect("open session"), &mut c.out));
        }
        let p = c
            .held
            .iter_mut()
            .find(|p| p.ticket == ticket.0 && !p.filled)?;
        p.filled = true;
        Some((c.session.as_mut().expect("open session"), &mut p.bytes))
    }

    /// The connection's pending request is answered: offer it input again.
    pub fn resume(&mut self, id: ConnId) {
        let slot = id.slot;
        if let Some(c) = self.live(id) {
            c.pending = false;
            self.ready.push(slot);
        }
    }

    /// Whether the client of a connection is gone: its side is closed (a zero-byte peek), or
    /// the connection is. A pending connection is not read, so a service whose requests wait
    /// long (a blocking pop) looks before it acts for a client that may have left.
    pub fn peer_closed(&mut self, id: ConnId) -> bool {
        let Some(c) = self.live(id) else {
            return true;
        };
        if c.eof {
            return true;
        }
        // POLLRDHUP: the peer shut its side down, even with bytes of it not yet read.
        let mut p = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&c.stream),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd for the duration of the call; timeout 0.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Sends the connection's replies, then closes it (after an error of its operation).
    pub fn close(&mut self, id: ConnId) {
        let slot = id.slot;
        if let Some(c) = self.live(id) {
            c.pending = false;
            c.close_after = true;
            if !c.touched {
                c.touched = true;
                self.touched.push(slot);
            }
        }
    }
}

/// An event loop serving one listening socket with a [`Service`].
pub struct Server<S: Service> {
    io: Io,
    core: Core<S>,
}

/// The state every backend shares: the slab, the service, the round's lists, the budget.
pub(crate) struct Core<S: Service> {
    pub(crate) cfg: Config,
    local: SocketAddr,
    service: S,
    pub(crate) conns: Vec<Option<Conn<S::Session>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    live: usize,
    budget: Arc<Budget>,
    scratch: Vec<u8>,
    /// Input buffers given back by connections whose incomplete request completed, lent
    /// again at the next split request (bounded: [`POOLED_INPUTS`] of at most
    /// `read_bytes` each), so that a request split across reads costs no allocation.
    inputs: Vec<Vec<u8>>,
    touched: Vec<u32>,
    ready: Vec<u32>,
    pub(crate) counters: Arc<LoopCounters>,
    pub(crate) draining: bool,
}

/// Most input buffers a loop keeps for connections' incomplete requests.
const POOLED_INPUTS: usize = 16;

/// Gives a connection's emptied input buffer back to the loop's pool (or to the allocator
/// when the pool is full or the buffer grew past `max`).
fn give_input(pool: &mut Vec<Vec<u8>>, mut b: Vec<u8>, max: usize) {
    if b.capacity() > 0 && b.capacity() <= max && pool.len() < POOLED_INPUTS {
        b.clear();
        pool.push(b);
    }
}

/// How long [`bind_listener`] retries an address in use.
const REBIND_FOR: Duration = Duration::from_secs(5);

/// Binds a listening socket to `addr`. A port given explicitly that is still in use is
/// tried again every 50 ms for up to 5 s: after `kill -9` of a server on io_uring, the kernel
/// releases the dead ring's requests, and with them its listening socket, a moment after the
/// process is gone, so a restart on the same address would otherwise fail.
pub fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let deadline = Instant::now() + REBIND_FOR;
    let mut warned = false;
    loop {
        match TcpListener::bind(addr) {
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && addr.port() != 0
                    && Instant::now() < deadline =>
            {
                if !warned {
                    tracing::warn!(%addr, "address in use; trying again for up to 5 s");
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

impl<S: Service> Server<S> {
    /// Binds `addr` (port 0: any free port; [`Server::local_addr`] tells which). The
    /// service's [`Service::wake_fd`] is registered now.
    pub fn bind(
        addr: SocketAddr,
        cfg: Config,
        budget: Arc<Budget>,
        service: S,
    ) -> io::Result<Self> {
        let listener = bind_listener(addr)?;
        Self::from_listener(listener, cfg, budget, service)
    }

    /// Serves a socket already bound and listening (made non-blocking here): for options
    /// [`Server::bind`] does not set, e.g. `SO_REUSEPORT`, with which each loop thread of an
    /// endpoint has a socket of its own on one port and the kernel spreads connections over
    /// them; or one socket shared by the loops of several threads (a `try_clone` each),
    /// whichever loop is free accepting the next connection.
    pub fn from_listener(
        listener: TcpListener,
        cfg: Config,
        budget: Arc<Budget>,
        service: S,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        let n = cfg.max_connections.max(1);
        let io = Io::new(listener, service.wake_fd(), &cfg)?;
        Ok(Server {
            io,
            core: Core {
                scratch: vec![0u8; cfg.read_bytes.max(4096)],
                inputs: Vec::with_capacity(POOLED_INPUTS),
                conns: (0..n).map(|_| None).collect(),
                gens: vec![0; n],
                free: (0..n as u32).rev().collect(),
                touched: Vec::with_capacity(n),
                ready: Vec::with_capacity(n),
                live: 0,
                cfg,
                local,
                service,
                budget,
                counters: Arc::new(LoopCounters::default()),
                draining: false,
            },
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.core.local
    }

    /// The I/O backend the loop runs on ([`Backend::Epoll`] or [`Backend::Uring`]).
    pub fn backend(&self) -> Backend {
        self.io.backend()
    }

    /// The loop's counters (shared: readable while it runs).
    pub fn counters(&self) -> Arc<LoopCounters> {
        self.core.counters.clone()
    }

    /// The service.
    pub fn service(&self) -> &S {
        &self.core.service
    }

    /// The service, mutably (before [`Server::run`]).
    pub fn service_mut(&mut self) -> &mut S {
        &mut self.core.service
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.core.live
    }

    /// Serves until `stop` is set, drains, calls [`Service::shutdown`] and returns the
    /// service.
    pub fn run(self, stop: &AtomicBool) -> S {
        let Server { mut io, mut core } = self;
        let mut next_tick = Instant::now() + core.cfg.tick;
        let mut next_sweep = Instant::now() + SWEEP;
        let mut drain_until = None;
        loop {
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) && !core.draining {
                core.begin_drain(&mut io);
                drain_until = Some(now + core.cfg.drain);
            }
            if let Some(until) = drain_until {
                if core.drained() || now >= until {
                    break;
                }
            }
            let mut timeout = next_tick.saturating_duration_since(now);
            if core.cfg.frame_deadline.is_some() || core.cfg.idle_limit.is_some() || core.draining {
                timeout = timeout.min(next_sweep.saturating_duration_since(now));
            }
            if let Some(at) = core.service.wake_at() {
                timeout = timeout.min(at.saturating_duration_since(now));
            }
            if !core.ready.is_empty() {
                timeout = Duration::ZERO;
            }
            let sleep = !timeout.is_zero() && core.service.prepare_sleep();
            let r = io.wait(&core, if sleep { timeout } else { Duration::ZERO });
            if sleep {
                core.service.end_sleep();
            }
            if let Err(e) = r {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "waiting for events failed: stopping");
                    break;
                }
            }
            io.dispatch(&mut core);
            let mut done = Completions {
                conns: &mut core.conns,
                touched: &mut core.touched,
                ready: &mut core.ready,
            };
            core.service.complete(&mut done);
            let ready = std::mem::take(&mut core.ready);
            for &slot in &ready {
                core.serve(&mut io, slot);
            }
            core.ready = ready;
            core.ready.clear();
            core.end_round(&mut io);
            let now = Instant::now();
            if now >= next_sweep {
                core.sweep(&mut io, now);
                next_sweep = now + SWEEP;
            }
            if now >= next_tick {
                core.service.tick();
                next_tick = now + core.cfg.tick;
            }
        }
        for slot in 0..core.conns.len() {
            if core.conns[slot].is_some() {
                core.close(&mut io, slot as u32);
            }
        }
        io.finish();
        core.service.shutdown();
        core.service
    }
}

impl<S: Service> Core<S> {
    fn begin_drain(&mut self, io: &mut Io) {
        self.draining = true;
        io.stop_accepting();
        self.service.draining();
        // Connections waiting for nothing are done; the others finish what they started.
        for slot in 0..self.conns.len() {
            if let Some(c) = self.conns[slot].as_mut() {
                c.close_after = true;
                if !c.touched {
                    c.touched = true;
                    self.touched.push(slot as u32);
                }
            }
        }
    }

    fn drained(&self) -> bool {
        self.live == 0 && self.service.in_flight() == 0
    }

    /// The id the next accepted connection gets; `None` when the slab is full.
    pub(crate) fn next_id(&self) -> Option<ConnId> {
        let slot = *self.free.last()?;
        Some(ConnId {
            slot,
            gen: self.gens[slot as usize].wrapping_add(1),
        })
    }

    /// A connection over the slab's bound: told so, then closed.
    pub(crate) fn reject(&mut self, mut stream: TcpStream) {
        self.counters.add(&self.counters.rejected, 1);
        let _ = stream.write(self.service.rejected());
    }

    /// Takes an accepted connection (registered with the backend as `id`, from
    /// [`Core::next_id`]) into the slab.
    pub(crate) fn admit(&mut self, id: ConnId, stream: TcpStream) {
        let slot = self.free.pop().expect("a slot from next_id");
        debug_assert_eq!(slot, id.slot);
        let _ = stream.set_nodelay(true);
        self.gens[slot as usize] = id.gen;
        let session = self.service.open(id);
        let c = self.conns[slot as usize].insert(Conn::new(id, stream, session, Instant::now()));
        let mut out = Out {
            out: &mut c.out,
            held: &mut c.held,
            next_ticket: &mut c.next_ticket,
            spare: &mut c.spare,
        };
        self.service
            .greet(id, c.session.as_mut().expect("open session"), &mut out);
        if !c.out.is_empty() && !c.touched {
            c.touched = true;
            self.touched.push(slot);
        }
        self.live += 1;
        self.counters.add(&self.counters.accepted, 1);
        self.ready.push(slot);
    }

    /// The connection in `slot`, if it is still `gen` (a backend's completion may be older
    /// than the slot's current occupant).
    pub(crate) fn conn(
        &mut self,
        slot: u32,
        gen: impl Fn(u32) -> bool,
    ) -> Option<&mut Conn<S::Session>> {
        self.conns
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
            .filter(|c| gen(c.id.gen))
    }

    /// The backend saw the socket of `slot` readable and/or writable.
    pub(crate) fn ready_io(&mut self, slot: u32, readable: bool, writable: bool) {
        let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if readable {
            c.readable = true;
            self.ready.push(slot);
        }
        if writable {
            c.writable = true;
            if c.unsent() > 0 && !c.touched {
                c.touched = true;
                self.touched.push(slot);
            }
        }
    }

    /// Puts `slot` in the round's list of connections whose output and state are looked at
    /// when the round ends.
    pub(crate) fn touch(&mut self, slot: u32) {
        if let Some(c) = self.conns.get_mut(slot as usize).and_then(Option::as_mut) {
            if !c.touched {
                c.touched = true;
                self.touched.push(slot);
            }
        }
    }
    /// Offers `c`'s held input (or `bytes` of the scratch buffer) to the service; keeps what
    /// it did not take.
    fn offer(
        service: &mut S,
        c: &mut Conn<S::Session>,
        from_scratch: Option<&[u8]>,
        inputs: &mut Vec<Vec<u8>>,
        pool_max: usize,
    ) {
        let session = c.session.as_mut().expect("open session");
        let (used, verdict) = match from_scratch {
            Some(bytes) => {
                let mut out = Out {
                    out: &mut c.out,
                    held: &mut c.held,
                    next_ticket: &mut c.next_ticket,
                    spare: &mut c.spare,
                };
                let (used, v) = service.on_input(c.id, session, bytes, &mut out);
                assert!(
                    used <= bytes.len(),
                    "the service took more bytes than offered"
                );
                if used < bytes.len() && c.input.capacity() == 0 {
                    if let Some(b) = inputs.pop() {
                        c.input = b;
                    }
                }
                c.input.extend_from_slice(&bytes[used..]);
                (used, v)
            }
            None => {
                let mut out = Out {
                    out: &mut c.out,
                    held: &mut c.held,
                    next_ticket: &mut c.next_ticket,
                    spare: &mut c.spare,
                };
                let (used, v) = service.on_input(c.id, session, &c.input, &mut out);
                assert!(
                    used <= c.input.len(),
                    "the service took more bytes than offered"
                );
                c.input.drain(..used);
                (used, v)
            }
        };
        let _ = used;
        match verdict {
            Verdict::Continue => {}
            Verdict::Pending => c.pending = true,
            Verdict::Close => c.close_after = true,
        }
        // Bytes left while pending are offered again on resume; otherwise they are the start
        // of a request that has not fully arrived.
        c.unoffered = c.pending && !c.input.is_empty();
        if c.input.is_empty() {
            c.partial_since = None;
            if c.input.capacity() > 0 {
                give_input(inputs, std::mem::take(&mut c.input), pool_max);
            }
        } else if !c.pending && c.partial_since.is_none() {
            c.partial_since = Some(Instant::now());
        }
    }

    /// Reads the connection's input and runs its complete requests.
    fn serve(&mut self, io: &mut Io, slot: u32) {
        let Core {
            service,
            conns,
            scratch,
            inputs,
            touched,
            budget,
            counters,
            cfg,
            draining,
            ..
        } = self;
        let Some(c) = conns.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let before = (c.out.len(), c.held.len(), c.close_after);
        let pool_max = cfg.read_bytes.max(4096);
        if c.unoffered && !c.pending && !c.dead {
            Self::offer(service, c, None, inputs, pool_max);
        }
        loop {
            if c.pending || c.close_after || c.dead || *draining {
                break;
            }
            if c.unsent() >= cfg.output_pause || !c.readable {
                break;
            }
            // Bytes a completion-based backend received while the connection took no input
            // come first.
            let unread = std::mem::take(&mut c.unread);
            let bytes = if !unread.is_empty() {
                &unread[..]
            } else {
                match io.read(c, scratch) {
                    Input::Data(bytes) => bytes,
                    Input::WouldBlock => break,
                    Input::Closed => {
                        // Replies to what came before still go out.
                        c.close_after = true;
                        break;
                    }
                }
            };
            c.last_active = Instant::now();
            if c.input.is_empty() {
                Self::offer(service, c, Some(bytes), inputs, pool_max);
            } else {
                c.input.extend_from_slice(bytes);
                Self::offer(service, c, None, inputs, pool_max);
            }
            io.consumed();
            if c.input.len() > cfg.input_limit && !c.pending && !c.close_after {
                tracing::warn!(slot, bytes = c.input.len(), "input limit exceeded: closing");
                counters.add(&counters.input_overflows, 1);
                service.input_overflow(&mut c.sink());
                c.input = Vec::new();
                c.partial_since = None;
                c.close_after = true;
            }
            if !c.charge(budget) {
                tracing::warn!(slot, "memory budget exhausted: closing the connection");
                counters.add(&counters.out_of_memory, 1);
                c.dead = true;
            }
        }
        if io.after_serve(c, *draining, cfg.output_pause) && !c.dead && !c.charge(budget) {
            counters.add(&counters.out_of_memory, 1);
            c.dead = true;
        }
        if ((c.out.len(), c.held.len(), c.close_after) != before || c.dead) && !c.touched {
            c.touched = true;
            touched.push(slot);
        }
    }

    /// Ends the round: the service's round work, then the replies go out.
    fn end_round(&mut self, io: &mut Io) {
        if self.touched.is_empty() {
            return;
        }
        let ok = self.service.end_round();
        if !ok {
            self.counters.add(&self.counters.failed_rounds, 1);
        }
        let touched = std::mem::take(&mut self.touched);
        for &slot in &touched {
            let Some(c) = self.conns[slot as usize].as_mut() else {
                continue;
            };
            c.touched = false;
            if !ok {
                // The round's replies are not known to be durable or coherent: withheld, and
                // the client sees its connection drop.
                c.dead = true;
            }
            c.promote();
            io.flush(c, self.cfg.output_keep);
            if c.unsent() > 0 {
                c.last_active = Instant::now();
            }
            let done = c.dead || (c.close_after && !c.pending && !c.waiting() && c.unsent() == 0);
            if done {
                self.close(io, slot);
                continue;
            }
            if !c.charge(&self.budget) {
                self.counters.add(&self.counters.out_of_memory, 1);
                self.close(io, slot);
                continue;
            }
            // Paused for output, or left input unread: go on now that replies went out.
            if (c.readable || io.stopped(c)) && !c.pending && c.unsent() < self.cfg.output_pause {
                self.ready.push(slot);
            }
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Closes connections past their deadlines.
    fn sweep(&mut self, io: &mut Io, now: Instant) {
        for slot in 0..self.conns.len() {
            let Some(c) = self.conns[slot].as_ref() else {
                continue;
            };
            let frame_late = matches!((self.cfg.frame_deadline, c.partial_since),
                (Some(d), Some(t)) if now.duration_since(t) > d);
            let idle = !c.pending
                && !c.waiting()
                && c.unsent() == 0
                && matches!(self.cfg.idle_limit, Some(d) if now.duration_since(c.last_active) > d);
            let drain_done = self.draining && !c.pending && !c.waiting() && c.unsent() == 0;
            if frame_late {
                tracing::info!(slot, "incomplete request past its deadline: closing");
                self.counters.add(&self.counters.frame_timeouts, 1);
                self.close(io, slot as u32);
            } else if idle {
                self.counters.add(&self.counters.idle_timeouts, 1);
                self.close(io, slot as u32);
            } else if drain_done {
                self.close(io, slot as u32);
            }
        }
    }

    fn close(&mut self, io: &mut Io, slot: u32) {
        let Some(mut c) = self.conns[slot as usize].take() else {
            return;
        };
        if c.close_after && !c.dead && !c.eof {
            // Take what the client still sends (bounded), so that closing does not reset
            // the connection before it has read the last reply.
            for _ in 0..16 {
                match c.read(&mut self.scratch) {
                    ReadOutcome::Data(_) => {}
                    _ => break,
                }
            }
        }
        c.uncharge(&self.budget);
        give_input(
            &mut self.inputs,
            std::mem::take(&mut c.input),
            self.cfg.read_bytes.max(4096),
        );
        if let Some(s) = c.session.take() {
            self.service.closed(c.id, s);
        }
        io.close(c.stream, c.id);
        self.free.push(slot);
        self.live -= 1;
        self.counters.add(&self.counters.closed, 1);
    }
}
