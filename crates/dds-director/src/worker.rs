//! A director thread: its event loop, accepting, closing, splicing and socket I/O.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_cache::CacheReader;
use dds_offload_api::{KeyMap, OffloadApp, ERROR_REPLY_MAX};
use dds_offload_engine::{CtxState, ExposedFiles, LaneHandle, Planner, Pool};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::buffer::{Budget, Buf, OutOfMemory};
use crate::config::{DirectorConfig, HostApp};
use crate::conn::{Close, Conn, Entry};
use crate::merge::retire;
use crate::signature::{Proto, Signature};
use crate::stats::{add, Stats};
use crate::uring::{Ev, Leg, SplitRing};

pub(crate) const LISTENER: Token = Token(usize::MAX - 1);
pub(crate) const WAKER: Token = Token(usize::MAX - 2);
pub(crate) const IOV_MAX: usize = 64;
pub(crate) const EVENTS: usize = 1024;

pub(crate) struct Worker {
    pub(crate) poll: Poll,
    pub(crate) listener: TcpListener,
    pub(crate) app: Arc<dyn OffloadApp>,
    pub(crate) cache: CacheReader,
    pub(crate) exposed: Arc<ExposedFiles>,
    pub(crate) lane: LaneHandle,
    pub(crate) pool: Pool,
    pub(crate) conns: Vec<Option<Box<Conn>>>,
    pub(crate) free_slots: Vec<usize>,
    pub(crate) gens: Vec<u32>,
    pub(crate) dirty: Vec<usize>,
    pub(crate) retry: Vec<usize>,
    /// Connections whose next response waits for the cache writer.
    pub(crate) gated: Vec<usize>,
    pub(crate) planner: Planner,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) host_app: Arc<HostApp>,
    pub(crate) signature: Signature,
    pub(crate) copy_mode: bool,
    pub(crate) conn_buf: usize,
    pub(crate) budget: Arc<Budget>,
    pub(crate) max_pending: usize,
    pub(crate) max_ctx_per_conn: usize,
    pub(crate) pend_cap: usize,
    pub(crate) max_msg: usize,
    pub(crate) max_resp: usize,
    pub(crate) max_req: usize,
    /// The io_uring of the split connections' sockets (`None`: on the `mio` poll too).
    pub(crate) uring: Option<SplitRing>,
    /// Response bytes of the completed reads one round merges (`DirectorConfig::round_bytes`).
    pub(crate) round_bytes: u64,
}

pub(crate) fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

pub(crate) fn set_linger_zero(s: &TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO));
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: &DirectorConfig,
        poll: Poll,
        listener: TcpListener,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        exposed: Arc<ExposedFiles>,
        lane: LaneHandle,
        stop: Arc<AtomicBool>,
        stats: Arc<Stats>,
        budget: Arc<Budget>,
        uring: Option<SplitRing>,
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
            planner: Planner::new(app.as_ref()),
            max_msg: app.max_message_len(),
            max_resp: app.max_response_len(),
            max_req,
            app,
            cache,
            exposed,
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
            host_app: cfg.host.clone(),
            signature: cfg.signature,
            copy_mode: cfg.copy_mode,
            conn_buf: cfg.conn_buffer_bytes.max(4096),
            budget,
            max_pending: cfg.max_pending_requests.max(max_req),
            max_ctx_per_conn: cfg.max_contexts_per_conn.max(1),
            pend_cap: app_forward_keys.max(64),
            uring,
            round_bytes: cfg.round_bytes.max(1) as u64,
        }
    }

    pub(crate) fn run(mut self) {
        let mut events = Events::with_capacity(EVENTS);
        let mut last_applied = 0u64;
        while !self.stop.load(Ordering::Acquire) {
            let retrying = self.begin_round(&mut last_applied);
            self.drive_dirty();
            // The round's reads were queued: one wake-up of the service thread for them all.
            self.lane.wake_service();
            match self.flush_sends(&mut events) {
                // The connections that sent go on.
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "director io_uring submit failed");
                    break;
                }
            }
            let timeout = self.wait_timeout(retrying, last_applied);
            if let Err(e) = self.wait(&mut events, timeout) {
                tracing::error!(error = %e, "director poll failed");
                break;
            }
            self.lane.end_sleep();
            self.take_events(&mut events);
        }
        self.shutdown();
    }

    /// Sends the round's responses, if it made any, in one system call for all its
    /// connections, and takes in what completed; whether there was anything to send.
    pub(crate) fn flush_sends(&mut self, events: &mut Events) -> io::Result<bool> {
        let Some(u) = self.uring.as_mut().filter(|u| u.sending()) else {
            return Ok(false);
        };
        add(&self.stats.ring_send_calls, 1);
        u.finish_sends()?;
        self.ring_events(events);
        Ok(true)
    }

    /// Waits up to `timeout` for socket events (the ring's completions, or `epoll`'s
    /// readiness without a ring); an interrupted wait is not an error.
    pub(crate) fn wait(&mut self, events: &mut Events, timeout: Duration) -> io::Result<()> {
        let r = match self.uring.as_mut() {
            Some(u) => u.wait(timeout),
            None => self.poll.poll(events, Some(timeout)),
        };
        match r {
            Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
            _ => Ok(()),
        }
    }

    /// Takes in the events of the last [`Worker::wait`]; whether there were any.
    pub(crate) fn take_events(&mut self, events: &mut Events) -> bool {
        let any = match self.uring.as_ref() {
            Some(u) => !u.events().is_empty(),
            None => !events.is_empty(),
        };
        if self.uring.is_some() {
            self.ring_events(events);
        } else {
            self.poll_events(events);
        }
        any
    }

    /// The start of a round: completed reads, applied invalidations, connections to retry.
    /// Returns whether connections were retried.
    pub(crate) fn begin_round(&mut self, last_applied: &mut u64) -> bool {
        self.reap_completions();
        let applied = self.lane.invalidations_applied();
        if applied != *last_applied {
            *last_applied = applied;
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
        retrying
    }

    /// How long the thread may wait for events: not at all with connections to drive, 1 ms
    /// while retrying, otherwise until the lane has the completions the connections need.
    fn wait_timeout(&mut self, retrying: bool, last_applied: u64) -> Duration {
        if !self.dirty.is_empty() || self.lane.completions_waiting() {
            Duration::ZERO
        } else if retrying || !self.retry.is_empty() {
            Duration::from_millis(1)
        } else {
            let need = self.completions_needed();
            if !self.lane.prepare_sleep_until(need)
                || self.lane.invalidations_applied() != last_applied
            {
                Duration::ZERO
            } else {
                Duration::from_millis(100)
            }
        }
    }

    /// Readiness events of the `mio` poll.
    pub(crate) fn poll_events(&mut self, events: &Events) {
        for ev in events.iter() {
            match ev.token() {
                LISTENER => self.accept(),
                WAKER => add(&self.stats.lane_wakeups, 1),
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

    /// Completions of the ring: received bytes, finished sends, and the `mio` poll's
    /// events when its descriptor became readable.
    pub(crate) fn ring_events(&mut self, events: &mut Events) {
        let n = self.uring.as_ref().map_or(0, |u| u.events().len());
        let mut epoll = false;
        for k in 0..n {
            match self.uring.as_ref().expect("ring").event(k) {
                Ev::Received(leg) => self.mark(leg.slot),
                Ev::Sent(leg, res) => self.sent(leg, res),
                Ev::Epoll => epoll = true,
                Ev::Woken => add(&self.stats.lane_wakeups, 1),
            }
        }
        while epoll {
            if let Err(e) = self.poll.poll(events, Some(Duration::ZERO)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!(error = %e, "director poll failed");
                }
                return;
            }
            self.poll_events(events);
            epoll = events.iter().count() == EVENTS;
        }
    }

    /// A send of the ring completed: what was sent is retired (responses leave the queue,
    /// a host message leaves `hout`).
    fn sent(&mut self, leg: Leg, res: i32) {
        let slot = leg.slot;
        let Some(c) = self.conns[slot].as_mut() else {
            return;
        };
        if leg.host {
            c.host_sending = false;
        } else {
            c.sending = false;
        }
        match res {
            0.. => {
                let w = res as usize;
                if leg.host {
                    c.hout.consume(w);
                    if let Some(h) = c.hold.as_mut() {
                        *h -= w;
                    }
                    add(&self.stats.host_bytes_out, w as u64);
                } else {
                    add(&self.stats.client_bytes_out, w as u64);
                    retire(self.app.as_ref(), &mut self.pool, c, w);
                }
                self.mark(slot);
            }
            _ if -res == libc::EAGAIN && leg.host => c.h_writable = false,
            _ if -res == libc::EAGAIN => c.c_writable = false,
            _ if -res == libc::EINTR => self.mark(slot),
            _ if leg.host => self.close(slot, Close::Abort("host connection reset")),
            _ => self.close(slot, Close::Abort("client connection reset")),
        }
    }

    /// Closes every connection (at a stop).
    pub(crate) fn close_all(&mut self) {
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i, Close::Done);
            }
        }
    }

    /// Leaks the buffer pool: reads still outstanding write into it.
    pub(crate) fn leak_pool(&mut self) {
        let pool = std::mem::replace(&mut self.pool, Pool::new(0, 0, 0, 64));
        pool.leak();
    }

    pub(crate) fn shutdown(mut self) {
        self.close_all();
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
            self.leak_pool();
        }
    }

    /// How many offloaded reads must complete before any connection can send more: for each
    /// connection, the reads still in flight in its oldest unanswered message (its responses
    /// go out in order and a client waits for the whole message); the smallest of these, or 1
    /// when no connection waits on a read. Sleeping until then wakes the thread once per
    /// message instead of once per read.
    pub(crate) fn completions_needed(&mut self) -> usize {
        let mut need = usize::MAX;
        let pool = &self.pool;
        for c in self.conns.iter_mut().flatten() {
            if c.dpu_inflight == 0 {
                continue;
            }
            while c.msg_ends.front().is_some_and(|&e| e < c.popped) {
                c.msg_ends.pop_front();
            }
            let Some(&end) = c.msg_ends.front() else {
                continue;
            };
            let n = c
                .order
                .iter()
                .take((end - c.popped) as usize + 1)
                .filter(|e| {
                    matches!(e, Entry::Dpu { ctx }
                        if pool.ctxs[*ctx as usize].state == CtxState::InFlight)
                })
                .count();
            if n > 0 {
                need = need.min(n);
            }
        }
        if need == usize::MAX {
            1
        } else {
            need
        }
    }

    pub(crate) fn mark(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].as_mut() {
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(slot);
            }
        }
    }

    pub(crate) fn accept(&mut self) {
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
            let Some(host_addr) = self.host_app.get() else {
                tracing::warn!(%peer, "no host application has announced itself yet: closing new connection");
                add(&self.stats.aborted, 1);
                self.free_slots.push(slot);
                continue;
            };
            let local = client.local_addr().unwrap_or(host_addr);
            let split = self.signature.matches(peer, local, Proto::Tcp);
            let n = self.conn_buf;
            let b = &self.budget;
            let bufs = (|| {
                Ok::<_, OutOfMemory>((
                    Buf::new(n, b)?,
                    Buf::new(if split { n } else { 0 }, b)?,
                    Buf::new(n, b)?,
                    Buf::new(if split && self.copy_mode { n } else { 0 }, b)?,
                ))
            })();
            let Ok((cin, hout, hin, cout)) = bufs else {
                tracing::warn!(%peer, "director memory budget exhausted: closing new connection");
                add(&self.stats.out_of_memory, 1);
                self.free_slots.push(slot);
                continue;
            };
            let mut host = match TcpStream::connect(host_addr) {
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
            // With the ring, a split connection's bytes arrive through it; the poll tells only
            // when a full socket takes bytes again (and when the host's connect completed).
            let interest = if split && self.uring.is_some() {
                Interest::WRITABLE
            } else {
                both
            };
            let reg = self.poll.registry();
            if reg
                .register(&mut client, Token(slot * 2), interest)
                .is_err()
                || reg
                    .register(&mut host, Token(slot * 2 + 1), interest)
                    .is_err()
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
                cin,
                hout,
                hin,
                cout,
                // One more than the pending requests: room for a refusal's error entry.
                order: VecDeque::with_capacity(if split { self.max_pending + 1 } else { 0 }),
                popped: 0,
                msg_ends: VecDeque::with_capacity(if split { self.max_pending } else { 0 }),
                host_pending: 0,
                head_sent: 0,
                inval_seq: 0,
                host_issued: 0,
                host_retired: 0,
                pend_keys: Vec::with_capacity(if split { self.pend_cap } else { 0 }),
                pend_ord: Vec::with_capacity(if split { self.pend_cap } else { 0 }),
                pend_head: 0,
                pend_set: KeyMap::with_capacity(if split { self.pend_cap } else { 1 }),
                dpu_inflight: 0,
                hold: None,
                dpu_ctxs: 0,
                client_eof: false,
                host_eof: false,
                host_wr_shut: false,
                dirty: false,
                sending: false,
                host_sending: false,
                retry: false,
                gated: false,
                refused: None,
                err: [0; ERROR_REPLY_MAX],
                err_len: 0,
                err_sent: false,
                discarded: 0,
                session: if split { self.app.session() } else { None },
                relayed: 0,
            }));
            if split {
                if let Some(u) = self.uring.as_mut() {
                    let c = self.conns[slot].as_ref().expect("just placed");
                    u.open(Leg::client(slot), c.gen, c.client.as_raw_fd());
                }
            }
            tracing::debug!(%peer, split, "connection accepted");
            self.mark(slot);
        }
    }

    pub(crate) fn drive_dirty(&mut self) {
        let mut i = 0;
        // New dirty marks during the pass are appended and handled in the same pass.
        while i < self.dirty.len() {
            let slot = self.dirty[i];
            i += 1;
            match self.conns[slot].as_mut() {
                // Driven again once its send completed.
                Some(c) if c.sending || c.host_sending => continue,
                Some(c) => c.dirty = false,
                None => continue,
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

    pub(crate) fn close(&mut self, slot: usize, how: Close) {
        let Some(mut c) = self.conns[slot].take() else {
            return;
        };
        match how {
            Close::Done => tracing::debug!(peer = %c.peer, "connection closed"),
            Close::Malformed(reason) => {
                add(&self.stats.malformed, 1);
                tracing::warn!(peer = %c.peer, reason, "closing connection: malformed input");
            }
            Close::OutOfMemory => {
                add(&self.stats.out_of_memory, 1);
                tracing::warn!(peer = %c.peer, "closing connection: director memory budget exhausted");
                set_linger_zero(&c.client);
                set_linger_zero(&c.host);
            }
            Close::Abort(reason) => {
                add(&self.stats.aborted, 1);
                tracing::info!(peer = %c.peer, reason, "connection aborted");
                set_linger_zero(&c.client);
                set_linger_zero(&c.host);
            }
        }
        if c.split {
            if let Some(u) = self.uring.as_mut() {
                u.close(Leg::client(slot));
                u.close(Leg::host(slot));
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

    /// Takes a split connection's bytes from the client into `cin` or from the host into
    /// `hin` (from the ring, or read from the socket); Ok(true) on progress.
    pub(crate) fn read_leg(&mut self, leg: Leg) -> Result<bool, Close> {
        let c = self.conns[leg.slot].as_mut().expect("live");
        let (s, buf, readable, eof, counter) = if leg.host {
            (
                &mut c.host,
                &mut c.hin,
                &mut c.h_readable,
                &mut c.host_eof,
                &self.stats.host_bytes_in,
            )
        } else {
            (
                &mut c.client,
                &mut c.cin,
                &mut c.c_readable,
                &mut c.client_eof,
                &self.stats.client_bytes_in,
            )
        };
        match self.uring.as_mut() {
            Some(u) => u
                .take(leg, buf, eof, counter)
                .map_err(|()| Close::Abort("connection reset")),
            None => Self::read_into(s, buf, readable, eof, counter),
        }
    }

    /// Sends `hout` to the host, up to `allowed` bytes (through the ring, retired when the
    /// send completed, or written to the socket); Ok(true) on progress.
    pub(crate) fn write_host(&mut self, slot: usize, allowed: usize) -> Result<bool, Close> {
        let c = self.conns[slot].as_mut().expect("live");
        if let Some(u) = self.uring.as_mut() {
            let n = c.hout.len().min(allowed);
            if c.host_sending || !c.h_writable || n == 0 {
                return Ok(false);
            }
            // Handed to the kernel with the round's other sends (`Worker::sent`).
            u.queue_send(
                Leg::host(slot),
                c.host.as_raw_fd(),
                &[IoSlice::new(&c.hout.data()[..n])],
            );
            add(&self.stats.ring_sends, 1);
            c.host_sending = true;
            return Ok(true);
        }
        let queued = c.hout.len();
        let p = Self::write_from(
            &mut c.host,
            &mut c.hout,
            allowed,
            &mut c.h_writable,
            &self.stats.host_bytes_out,
        )?;
        if let Some(h) = c.hold.as_mut() {
            *h -= queued - c.hout.len();
        }
        Ok(p)
    }

    /// Reads from `s` into `buf`; Ok(true) on progress.
    pub(crate) fn read_into(
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

    pub(crate) fn write_from(
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

    pub(crate) fn check_host_connected(c: &mut Conn) -> Result<(), Close> {
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

    pub(crate) fn drive_splice(&mut self, slot: usize) -> Result<(), Close> {
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
}
