//! The event loop: accepting into the slab, reading and offering input, completions of
//! pending operations, rounds, deadlines and the drain on stop.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::budget::Budget;
use crate::conn::{Conn, Out, ReadOutcome, Ticket};
use crate::{Config, ConnId, Service, Verdict};

const LISTENER: Token = Token(usize::MAX);
const WAKE: Token = Token(usize::MAX - 1);
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

    /// The session and the buffer of the reply slot `ticket` reserved with [`Out::defer`];
    /// `None` when the connection is gone (or the slot was filled). A slot that no earlier
    /// reply waits before (slots filled in request order) is the output itself: its reply is
    /// written there, without a second copy.
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
            let p = c.held.pop_front().expect("front");
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
    cfg: Config,
    poll: Poll,
    listener: Option<TcpListener>,
    local: SocketAddr,
    service: S,
    conns: Vec<Option<Conn<S::Session>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    live: usize,
    budget: Arc<Budget>,
    scratch: Vec<u8>,
    touched: Vec<u32>,
    ready: Vec<u32>,
    counters: Arc<LoopCounters>,
    draining: bool,
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
        Self::serve_on(TcpListener::bind(addr)?, cfg, budget, service)
    }

    /// Serves a socket already bound and listening (made non-blocking here): for options
    /// [`Server::bind`] does not set, e.g. `SO_REUSEPORT`, with which each loop thread of an
    /// endpoint has a socket of its own on one port and the kernel spreads connections over
    /// them; or one socket shared by the loops of several threads (a `try_clone` each),
    /// whichever loop is free accepting the next connection.
    pub fn from_listener(
        listener: std::net::TcpListener,
        cfg: Config,
        budget: Arc<Budget>,
        service: S,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        Self::serve_on(TcpListener::from_std(listener), cfg, budget, service)
    }

    fn serve_on(
        mut listener: TcpListener,
        cfg: Config,
        budget: Arc<Budget>,
        service: S,
    ) -> io::Result<Self> {
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        if let Some(fd) = service.wake_fd() {
            poll.registry()
                .register(&mut SourceFd(&fd), WAKE, Interest::READABLE)?;
        }
        let local = listener.local_addr()?;
        let n = cfg.max_connections.max(1);
        Ok(Server {
            scratch: vec![0u8; cfg.read_bytes.max(4096)],
            conns: (0..n).map(|_| None).collect(),
            gens: vec![0; n],
            free: (0..n as u32).rev().collect(),
            touched: Vec::with_capacity(n),
            ready: Vec::with_capacity(n),
            live: 0,
            cfg,
            poll,
            listener: Some(listener),
            local,
            service,
            budget,
            counters: Arc::new(LoopCounters::default()),
            draining: false,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The loop's counters (shared: readable while it runs).
    pub fn counters(&self) -> Arc<LoopCounters> {
        self.counters.clone()
    }

    /// The service.
    pub fn service(&self) -> &S {
        &self.service
    }

    /// The service, mutably (before [`Server::run`]).
    pub fn service_mut(&mut self) -> &mut S {
        &mut self.service
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.live
    }

    /// Serves until `stop` is set, drains, calls [`Service::shutdown`] and returns the
    /// service.
    pub fn run(mut self, stop: &AtomicBool) -> S {
        let mut events = Events::with_capacity(1024);
        let mut next_tick = Instant::now() + self.cfg.tick;
        let mut next_sweep = Instant::now() + SWEEP;
        let mut drain_until = None;
        loop {
            let now = Instant::now();
            if stop.load(Ordering::Relaxed) && !self.draining {
                self.begin_drain();
                drain_until = Some(now + self.cfg.drain);
            }
            if let Some(until) = drain_until {
                if self.drained() || now >= until {
                    break;
                }
            }
            let mut timeout = next_tick.saturating_duration_since(now);
            if self.cfg.frame_deadline.is_some() || self.cfg.idle_limit.is_some() || self.draining {
                timeout = timeout.min(next_sweep.saturating_duration_since(now));
            }
            if !self.ready.is_empty() {
                timeout = Duration::ZERO;
            }
            let sleep = !timeout.is_zero() && self.service.prepare_sleep();
            let r = self.poll.poll(
                &mut events,
                Some(if sleep { timeout } else { Duration::ZERO }),
            );
            if sleep {
                self.service.end_sleep();
            }
            if let Err(e) = r {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "poll failed: stopping");
                    break;
                }
            }
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept(),
                    WAKE => {}
                    Token(t) => {
                        let Some(c) = self.conns.get_mut(t).and_then(Option::as_mut) else {
                            continue;
                        };
                        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                            c.readable = true;
                            self.ready.push(t as u32);
                        }
                        if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                            c.writable = true;
                            if c.unsent() > 0 && !c.touched {
                                c.touched = true;
                                self.touched.push(t as u32);
                            }
                        }
                    }
                }
            }
            let mut done = Completions {
                conns: &mut self.conns,
                touched: &mut self.touched,
                ready: &mut self.ready,
            };
            self.service.complete(&mut done);
            let ready = std::mem::take(&mut self.ready);
            for &slot in &ready {
                self.serve(slot);
            }
            self.ready = ready;
            self.ready.clear();
            self.end_round();
            let now = Instant::now();
            if now >= next_sweep {
                self.sweep(now);
                next_sweep = now + SWEEP;
            }
            if now >= next_tick {
                self.service.tick();
                next_tick = now + self.cfg.tick;
            }
        }
        for slot in 0..self.conns.len() {
            if self.conns[slot].is_some() {
                self.close(slot as u32);
            }
        }
        self.service.shutdown();
        self.service
    }

    fn begin_drain(&mut self) {
        self.draining = true;
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
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

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let (mut stream, peer) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            let Some(slot) = self.free.pop() else {
                self.counters.add(&self.counters.rejected, 1);
                let _ = stream.write(self.service.rejected());
                continue;
            };
            let _ = stream.set_nodelay(true);
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(slot as usize),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, %peer, "cannot register a connection");
                self.free.push(slot);
                continue;
            }
            let gen = self.gens[slot as usize].wrapping_add(1);
            self.gens[slot as usize] = gen;
            let id = ConnId { slot, gen };
            let session = self.service.open(id);
            self.conns[slot as usize] = Some(Conn::new(id, stream, session, Instant::now()));
            self.live += 1;
            self.counters.add(&self.counters.accepted, 1);
            self.ready.push(slot);
        }
    }

    /// Offers `c`'s held input (or `bytes` of the scratch buffer) to the service; keeps what
    /// it did not take.
    fn offer(service: &mut S, c: &mut Conn<S::Session>, from_scratch: Option<&[u8]>) {
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
                c.input = Vec::new();
            }
        } else if !c.pending && c.partial_since.is_none() {
            c.partial_since = Some(Instant::now());
        }
    }

    /// Reads the connection's input and runs its complete requests.
    fn serve(&mut self, slot: u32) {
        let Server {
            service,
            conns,
            scratch,
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
        if c.unoffered && !c.pending && !c.dead {
            Self::offer(service, c, None);
        }
        loop {
            if c.pending || c.close_after || c.dead || *draining {
                break;
            }
            if c.unsent() >= cfg.output_pause || !c.readable {
                break;
            }
            let n = match c.read(scratch) {
                ReadOutcome::Data(n) => n,
                ReadOutcome::WouldBlock => break,
                ReadOutcome::Closed => {
                    // Replies to what came before still go out.
                    c.close_after = true;
                    break;
                }
            };
            c.last_active = Instant::now();
            if c.input.is_empty() {
                Self::offer(service, c, Some(&scratch[..n]));
            } else {
                c.input.extend_from_slice(&scratch[..n]);
                Self::offer(service, c, None);
            }
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
        if ((c.out.len(), c.held.len(), c.close_after) != before || c.dead) && !c.touched {
            c.touched = true;
            touched.push(slot);
        }
    }

    /// Ends the round: the service's round work, then the replies go out.
    fn end_round(&mut self) {
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
            c.flush(self.cfg.output_keep);
            if c.unsent() > 0 {
                c.last_active = Instant::now();
            }
            let done = c.dead || (c.close_after && !c.pending && !c.waiting() && c.unsent() == 0);
            if done {
                self.close(slot);
                continue;
            }
            if !c.charge(&self.budget) {
                self.counters.add(&self.counters.out_of_memory, 1);
                self.close(slot);
                continue;
            }
            // Paused for output, or left input unread: go on now that replies went out.
            if c.readable && !c.pending && c.unsent() < self.cfg.output_pause {
                self.ready.push(slot);
            }
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// Closes connections past their deadlines.
    fn sweep(&mut self, now: Instant) {
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
                self.close(slot as u32);
            } else if idle {
                self.counters.add(&self.counters.idle_timeouts, 1);
                self.close(slot as u32);
            } else if drain_done {
                self.close(slot as u32);
            }
        }
    }

    fn close(&mut self, slot: u32) {
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
        let _ = self.poll.registry().deregister(&mut c.stream);
        c.uncharge(&self.budget);
        if let Some(s) = c.session.take() {
            self.service.closed(c.id, s);
        }
        self.free.push(slot);
        self.live -= 1;
        self.counters.add(&self.counters.closed, 1);
    }
}
