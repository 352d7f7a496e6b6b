//! The completion backend: one io_uring per loop. The listening socket has one multishot
//! accept; every connection one multishot receive into buffers the loop provides through a
//! buffer ring (a connection owns no receive memory: a buffer is lent to it from the moment
//! bytes arrive until the round has parsed them); a round's replies leave as one send per
//! connection, all handed to the kernel by the system call that also waits for the next
//! events; the service's `wake_fd` has a multishot poll; the wait's timeout is the ring's own
//! (`IORING_ENTER_EXT_ARG`). A round therefore costs one system call however many
//! connections it reads and answers (plus the close of a connection, and the reads that
//! drain a closing connection).

use std::alloc::{self, Layout};
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use io_uring::types::{BufRingEntry, CancelBuilder, Fd, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring, Probe};

use crate::conn::Conn;
use crate::event_loop::{Core, Input};
use crate::{Config, ConnId, Service};

/// What a completion is for (the top four bits of its user data).
const RECV: u64 = 1;
const SEND: u64 = 2;
const ACCEPT: u64 = 3;
const WAKE: u64 = 4;
/// Cancels and closes: their results are not needed.
const OTHER: u64 = 5;
const GEN_MASK: u64 = 0x00ff_ffff;
/// No buffer (the end of a connection's queue of received buffers).
const NONE: u16 = u16::MAX;
/// The buffer group of the receive buffers.
const GROUP: u16 = 0;
/// Submission queue entries at most; a round with more requests submits in several steps.
const SQ_ENTRIES: u32 = 1024;
/// How long a failed accept waits before it is tried again (a full descriptor table).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A request's user data: what it is for (4 bits), which receive of the connection (4 bits:
/// a stopped receive's last completion may come after the next one started), the
/// connection's generation (24 bits) and slot (32 bits).
fn user_data(kind: u64, slot: u32, gen: u32) -> u64 {
    (kind << 60) | ((u64::from(gen) & GEN_MASK) << 32) | u64::from(slot)
}

/// `e` (a multishot receive) ends after `limit` bytes (0: never): the `optlen` field of the
/// submission entry (Linux 6.16; older kernels refuse a receive that sets it).
fn with_total_limit(e: squeue::Entry, limit: u32) -> squeue::Entry {
    // SAFETY: `Entry` is `#[repr(C)]` around the kernel's 64-byte `io_uring_sqe` (the
    // transmutes check the size), in which `optlen` is the `u32` at byte 44.
    let mut raw: [u8; 64] = unsafe { std::mem::transmute::<squeue::Entry, [u8; 64]>(e) };
    raw[44..48].copy_from_slice(&limit.to_ne_bytes());
    unsafe { std::mem::transmute::<[u8; 64], squeue::Entry>(raw) }
}

fn recv_data(id: ConnId, epoch: u8) -> u64 {
    user_data(RECV, id.slot, id.gen) | (u64::from(epoch & 15) << 56)
}

fn same_gen(data: u64) -> impl Fn(u32) -> bool {
    move |gen| u64::from(gen) & GEN_MASK == (data >> 32) & GEN_MASK
}

/// The receive buffers and the ring through which they are lent to the kernel
/// (`IORING_REGISTER_PBUF_RING`). Both are allocated once, page-aligned; the kernel writes
/// into a buffer only while it is in the ring.
pub struct BufRing {
    ring: *mut BufRingEntry,
    ring_layout: Layout,
    mem: *mut u8,
    mem_layout: Layout,
    entries: u16,
    size: usize,
    /// The next tail to publish.
    tail: u16,
}

impl BufRing {
    /// `entries` (a power of two) buffers of `size` bytes, none lent to a kernel yet.
    pub fn new(entries: u16, size: usize) -> io::Result<BufRing> {
        let oom = || io::Error::new(io::ErrorKind::OutOfMemory, "receive buffers");
        let ring_layout =
            Layout::from_size_align(usize::from(entries) * size_of::<BufRingEntry>(), 4096)
                .map_err(|_| oom())?;
        let mem_layout =
            Layout::from_size_align(usize::from(entries) * size, 4096).map_err(|_| oom())?;
        // SAFETY: both layouts have a non-zero size (entries ≥ 1, size ≥ 4096).
        let ring = unsafe { alloc::alloc_zeroed(ring_layout) }.cast::<BufRingEntry>();
        if ring.is_null() {
            return Err(oom());
        }
        // SAFETY: as above. Zeroed memory is mapped lazily: a page costs memory once bytes
        // were received into it.
        let mem = unsafe { alloc::alloc_zeroed(mem_layout) };
        if mem.is_null() {
            // SAFETY: allocated above with this layout.
            unsafe { alloc::dealloc(ring.cast(), ring_layout) };
            return Err(oom());
        }
        Ok(BufRing {
            ring,
            ring_layout,
            mem,
            mem_layout,
            entries,
            size,
            tail: 0,
        })
    }

    /// Lends buffer `bid` to the kernel (visible at the next [`BufRing::publish`]).
    pub fn give(&mut self, bid: u16) {
        debug_assert!(bid < self.entries);
        let at = usize::from(self.tail & (self.entries - 1));
        // SAFETY: `at` < entries; the kernel reads entries only up to the published tail, and
        // this one is past it.
        let e = unsafe { &mut *self.ring.add(at) };
        e.set_addr(self.mem as u64 + u64::from(bid) * self.size as u64);
        e.set_len(self.size as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the buffers given so far visible to the kernel.
    pub fn publish(&self) {
        // SAFETY: the tail field lives in the first entry of the ring, which the kernel reads
        // atomically; it is written only here.
        let tail = unsafe { AtomicU16::from_ptr(BufRingEntry::tail(self.ring).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Registers the ring with `ring` as buffer group `group` (`IORING_REGISTER_PBUF_RING`).
    ///
    /// # Safety
    /// `self` must outlive the registration: drop `ring` (or unregister) before `self`.
    pub unsafe fn register(&self, ring: &IoUring, group: u16) -> io::Result<()> {
        // SAFETY: the entries stay allocated and in place for as long as the caller promised.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(self.ring as u64, self.entries, group, 0)
        }
    }

    /// The buffers' count (a power of two).
    pub fn entries(&self) -> u16 {
        self.entries
    }

    /// The first `len` bytes of buffer `bid`, which the kernel filled and returned.
    pub fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        assert!(bid < self.entries && len <= self.size);
        // SAFETY: in bounds; the kernel does not write a buffer that is not in the ring.
        unsafe { std::slice::from_raw_parts(self.mem.add(usize::from(bid) * self.size), len) }
    }
}

// SAFETY: the ring owns both allocations alone (they are freed once, in `drop`); the loop
// that owns it may move to another thread before it runs.
unsafe impl Send for BufRing {}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with these layouts; the ring that used them is gone.
        unsafe {
            alloc::dealloc(self.ring.cast(), self.ring_layout);
            alloc::dealloc(self.mem, self.mem_layout);
        }
    }
}

/// A connection's replies handed to the kernel: the buffer stays here, untouched, until the
/// send completes (even if the connection closed meanwhile).
#[derive(Default)]
struct Sending {
    buf: Vec<u8>,
    at: usize,
    busy: bool,
    fd: RawFd,
}

pub(crate) struct Uring {
    // Dropped first: the kernel lets go of the buffers before they are freed.
    ring: IoUring,
    bufs: BufRing,
    listener: Option<TcpListener>,
    accept_armed: bool,
    /// A failed accept is retried after a pause (a full descriptor table).
    accept_retry: Option<Instant>,
    wake: Option<RawFd>,
    /// Bytes a connection's receive takes before it ends and is started again (the most a
    /// connection reads ahead of what it can take); 0 when the kernel has no such limit.
    recv_limit: u32,
    /// Per slot: received buffers not offered yet (a queue linked through `next`).
    head: Vec<u16>,
    tail: Vec<u16>,
    /// Per slot: a multishot receive is active (the one numbered `epoch`); the receive
    /// ended (end of stream or an error) after the queued buffers.
    armed: Vec<bool>,
    epoch: Vec<u8>,
    ended: Vec<bool>,
    sends: Vec<Sending>,
    /// Per buffer: the next in its connection's queue, and the bytes it holds.
    next: Vec<u16>,
    len: Vec<u32>,
    /// The buffer of the last read, returned to the kernel once used.
    current: u16,
    /// Completions taken from the queue at once (the completion queue's size).
    cqes: Vec<cqueue::Entry>,
}

/// A receive, send or poll that failed for a passing lack of memory or buffers, or was
/// interrupted: it is started again, the connection is not ended for it.
fn transient(res: i32) -> bool {
    matches!(
        -res,
        libc::ENOBUFS | libc::ENOMEM | libc::EAGAIN | libc::EINTR | libc::ECANCELED
    )
}

impl Uring {
    /// A ring for the listening socket, or why this kernel cannot have one (opcodes
    /// missing, no buffer rings, no multishot receive).
    pub(crate) fn new(
        listener: TcpListener,
        wake: Option<RawFd>,
        cfg: &Config,
    ) -> io::Result<Uring> {
        let cq = cfg.ring_entries.clamp(8, 1 << 16).next_power_of_two();
        let sq = (cq / 8).clamp(1, SQ_ENTRIES);
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq)
            .build(sq)
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(sq))?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::AcceptMulti::CODE, "accept"),
            (opcode::RecvMulti::CODE, "recv"),
            (opcode::Send::CODE, "send"),
            (opcode::PollAdd::CODE, "poll"),
            (opcode::AsyncCancel::CODE, "cancel"),
            (opcode::Close::CODE, "close"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring has no {name} operation"),
                ));
            }
        }
        let entries = cfg.recv_buffers.clamp(1, 1 << 15).next_power_of_two() as u16;
        let bufs = BufRing::new(entries, cfg.read_bytes.max(4096))?;
        // SAFETY: the ring of entries stays allocated (and is not moved) until the io_uring
        // is dropped, which happens first (field order).
        unsafe { bufs.register(&ring, GROUP)? };
        let n = cfg.max_connections.max(1);
        let mut u = Uring {
            ring,
            bufs,
            listener: Some(listener),
            accept_armed: false,
            accept_retry: None,
            wake,
            recv_limit: 0,
            head: vec![NONE; n],
            tail: vec![NONE; n],
            armed: vec![false; n],
            epoch: vec![0; n],
            ended: vec![false; n],
            sends: (0..n).map(|_| Sending::default()).collect(),
            next: vec![NONE; usize::from(entries)],
            len: vec![0; usize::from(entries)],
            current: NONE,
            cqes: Vec::with_capacity(cq as usize),
        };
        for bid in 0..entries {
            u.bufs.give(bid);
        }
        u.bufs.publish();
        let size = cfg.read_bytes.max(4096);
        u.check_multishot_recv(u32::try_from(size * 4).unwrap_or(u32::MAX))?;
        u.arm_accept();
        u.arm_wake();
        Ok(u)
    }

    /// Multishot receive with provided buffers (Linux 6.0) and its byte limit (Linux 6.16)
    /// cannot be probed as opcodes: one byte through a socket pair tells. Without the limit,
    /// what a connection receives beyond what it takes is bounded by its socket's receive
    /// buffer instead.
    fn check_multishot_recv(&mut self, limit: u32) -> io::Result<()> {
        let limited = self.recv_probe(1)?;
        if limited.first() == Some(&(1, false)) {
            self.recv_limit = limit;
            return Ok(());
        }
        tracing::info!(
            completions = ?limited,
            "io_uring: no byte limit for multishot receive (Linux 6.16)"
        );
        self.recv_limit = 0;
        let plain = self.recv_probe(0)?;
        if plain.first() == Some(&(1, true)) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no multishot receive into provided buffers (completions {plain:?})"),
            ))
        }
    }

    /// A multishot receive (limited to `limit` bytes, 0: none) of one byte and the end of
    /// the stream: its completions (result, more to come).
    fn recv_probe(&mut self, limit: u32) -> io::Result<Vec<(i32, bool)>> {
        let (a, b) = UnixStream::pair()?;
        let probe = user_data(OTHER, u32::MAX, limit);
        let e = with_total_limit(
            opcode::RecvMulti::new(Fd(a.as_raw_fd()), GROUP)
                .build()
                .user_data(probe),
            limit,
        );
        self.push(&e);
        io::Write::write_all(&mut &b, b"x")?;
        drop(b);
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.last().is_none_or(|&(_, more)| more) {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "multishot receive: no completion",
                ));
            }
            let ts = Timespec::from(Duration::from_millis(100));
            match self
                .ring
                .submitter()
                .submit_with_args(1, &SubmitArgs::new().timespec(&ts))
            {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
                Err(e) => return Err(e),
            }
            for cqe in self.ring.completion() {
                if cqe.user_data() == probe {
                    if let Some(bid) = cqueue::buffer_select(cqe.flags()) {
                        self.bufs.give(bid);
                    }
                    got.push((cqe.result(), cqueue::more(cqe.flags())));
                }
            }
        }
        self.bufs.publish();
        Ok(got)
    }

    /// Queues a request for the next submission (submitting now if the queue is full).
    fn push(&mut self, e: &squeue::Entry) {
        loop {
            // SAFETY: every buffer and descriptor a request names outlives it: receive
            // buffers are the buffer ring's, a send's buffer stays in `sends` until its
            // completion, descriptors are closed by a request queued after theirs.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                tracing::warn!(error = %e, "io_uring submit failed");
            }
        }
    }

    fn arm_accept(&mut self) {
        let Some(l) = self.listener.as_ref() else {
            return;
        };
        let e = opcode::AcceptMulti::new(Fd(l.as_raw_fd()))
            .flags(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(ACCEPT, 0, 0));
        self.push(&e);
        self.accept_armed = true;
    }

    fn arm_wake(&mut self) {
        if let Some(fd) = self.wake {
            let e = opcode::PollAdd::new(Fd(fd), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(user_data(WAKE, 0, 0));
            self.push(&e);
        }
    }

    fn arm_recv(&mut self, fd: RawFd, id: ConnId) {
        let s = id.slot as usize;
        self.epoch[s] = self.epoch[s].wrapping_add(1) & 15;
        let e = with_total_limit(
            opcode::RecvMulti::new(Fd(fd), GROUP)
                .build()
                .user_data(recv_data(id, self.epoch[s])),
            self.recv_limit,
        );
        self.push(&e);
        self.armed[s] = true;
    }

    fn cancel_recv(&mut self, id: ConnId) {
        let s = id.slot as usize;
        if std::mem::take(&mut self.armed[s]) {
            let e = opcode::AsyncCancel::new(recv_data(id, self.epoch[s]))
                .build()
                .user_data(user_data(OTHER, id.slot, id.gen));
            self.push(&e);
        }
    }

    pub(crate) fn wait<S: Service>(&mut self, core: &Core<S>, timeout: Duration) -> io::Result<()> {
        let mut timeout = timeout;
        if !self.accept_armed {
            let now = Instant::now();
            match self.accept_retry {
                Some(t) if now < t => {
                    // The pause of a failed accept ends the wait: nothing else would wake
                    // a loop without connections to start it again.
                    timeout = timeout.min(t - now);
                }
                _ => {
                    self.accept_retry = None;
                    self.arm_accept();
                }
            }
        }
        self.bufs.publish();
        let overflow = {
            let mut sq = self.ring.submission();
            sq.sync();
            sq.cq_overflow()
        };
        if overflow {
            // Completions wait in the kernel: the enter below (GETEVENTS) moves them into
            // the queue as it empties; the multishot requests that could not post ended.
            core.counters.add(&core.counters.uring_cq_overflows, 1);
        }
        let r = if timeout.is_zero() || !self.ring.completion().is_empty() {
            let mut sq = self.ring.submission();
            sq.sync();
            if sq.is_empty() && !sq.taskrun() && !sq.cq_overflow() {
                // Nothing to hand over and nothing the kernel holds back: no system call.
                return Ok(());
            }
            drop(sq);
            self.ring.submit()
        } else {
            let ts = Timespec::from(timeout);
            self.ring
                .submitter()
                .submit_with_args(1, &SubmitArgs::new().timespec(&ts))
        };
        match r {
            Ok(_) => Ok(()),
            // A timeout, a signal, or a full completion queue or lack of kernel memory (the
            // queued requests are handed over at the next wait).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EBUSY | libc::EINTR | libc::EAGAIN | libc::ENOMEM)
                ) =>
            {
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EBADR) => {
                // The kernel dropped completions it had no memory to keep: the loop goes on
                // (the connections they were for are ended by their deadlines or clients).
                tracing::error!("io_uring dropped completions (no kernel memory)");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn dispatch<S: Service>(&mut self, core: &mut Core<S>) {
        let most = self.cqes.capacity();
        loop {
            self.cqes.clear();
            self.cqes.extend(self.ring.completion().take(most));
            if self.cqes.is_empty() {
                return;
            }
            for i in 0..self.cqes.len() {
                let cqe = self.cqes[i].clone();
                match cqe.user_data() >> 60 {
                    RECV => self.received(core, &cqe),
                    SEND => self.sent(core, &cqe),
                    ACCEPT => self.accepted(core, &cqe),
                    WAKE if !cqueue::more(cqe.flags()) => {
                        // The poll ended (a full completion queue, a lack of memory): the
                        // service is woken by a new one, which also reports a descriptor
                        // that became readable meanwhile.
                        core.counters.add(&core.counters.uring_rearms, 1);
                        self.arm_wake();
                    }
                    _ => {}
                }
            }
        }
    }

    fn accepted<S: Service>(&mut self, core: &mut Core<S>, cqe: &cqueue::Entry) {
        let res = cqe.result();
        if !cqueue::more(cqe.flags()) {
            // Started again at the next wait (after a pause if it failed).
            self.accept_armed = false;
            if self.listener.is_some() {
                core.counters.add(&core.counters.uring_rearms, 1);
            }
        }
        if res < 0 {
            let e = io::Error::from_raw_os_error(-res);
            if !transient(res) {
                tracing::warn!(error = %e, "accept failed");
                self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
            }
            return;
        }
        // SAFETY: the kernel made this descriptor for us; nothing else owns it.
        let stream = unsafe { TcpStream::from_raw_fd(res) };
        if self.listener.is_none() {
            // Accepted while the stop was cancelling the accept.
            return;
        }
        let Some(id) = core.next_id() else {
            core.reject(stream);
            return;
        };
        let slot = id.slot as usize;
        self.head[slot] = NONE;
        self.tail[slot] = NONE;
        self.ended[slot] = false;
        self.arm_recv(stream.as_raw_fd(), id);
        core.admit(id, stream);
    }

    fn received<S: Service>(&mut self, core: &mut Core<S>, cqe: &cqueue::Entry) {
        let data = cqe.user_data();
        let slot = data as u32;
        let bid = cqueue::buffer_select(cqe.flags());
        let res = cqe.result();
        if core.conn(slot, same_gen(data)).is_none() {
            // A completion for a connection that closed.
            if let Some(b) = bid {
                self.bufs.give(b);
            }
            return;
        }
        let s = slot as usize;
        let current = (data >> 56) & 15 == u64::from(self.epoch[s]);
        // The kernel ended the receive the loop runs (not one it stopped): a byte limit, a
        // full completion queue, no buffer, a lack of memory.
        let ended_by_kernel = current && self.armed[s] && !cqueue::more(cqe.flags());
        if !cqueue::more(cqe.flags()) && current {
            self.armed[s] = false;
        }
        match (res, bid) {
            (n, Some(b)) if n > 0 => {
                self.len[usize::from(b)] = n as u32;
                self.next[usize::from(b)] = NONE;
                match self.tail[s] {
                    NONE => self.head[s] = b,
                    t => self.next[usize::from(t)] = b,
                }
                self.tail[s] = b;
            }
            (_, Some(b)) => {
                self.bufs.give(b);
                self.ended[s] = true;
            }
            (r, None) if transient(r) => {
                // Every buffer is lent out (they come back by the end of this round, before
                // the receive is handed over again), or a passing failure; a receive the
                // loop stopped itself (cancelled) stays stopped. Serving the connection
                // starts its receive again if it takes input (`after_serve`).
                if !ended_by_kernel {
                    return;
                }
                if r == -libc::ENOBUFS {
                    core.counters.add(&core.counters.uring_no_buffers, 1);
                }
            }
            // The end of the stream (0) or an error.
            (_, None) => self.ended[s] = true,
        }
        if ended_by_kernel && !self.ended[s] {
            core.counters.add(&core.counters.uring_rearms, 1);
        }
        core.ready_io(slot, true, false);
    }

    fn sent<S: Service>(&mut self, core: &mut Core<S>, cqe: &cqueue::Entry) {
        let data = cqe.user_data();
        let slot = data as u32;
        let keep = core.cfg.output_keep;
        let res = cqe.result();
        let live = core.conn(slot, same_gen(data));
        let s = &mut self.sends[slot as usize];
        if res > 0 {
            s.at += res as usize;
        }
        let Some(c) = live else {
            // The connection closed meanwhile: its buffer is free now, and the slot's next
            // connection may send.
            *s = Sending::default();
            core.touch(slot);
            return;
        };
        if (res <= 0 && !transient(res)) || res == 0 {
            c.dead = true;
        } else if s.at < s.buf.len() && !c.dead {
            // A short send (the kernel retries stream sends itself; this is for the rest), or
            // one that failed for a passing lack of memory: the rest goes again.
            c.sending = s.buf.len() - s.at;
            let e = opcode::Send::new(
                Fd(s.fd),
                s.buf[s.at..].as_ptr(),
                (s.buf.len() - s.at) as u32,
            )
            .flags(libc::MSG_WAITALL | libc::MSG_NOSIGNAL)
            .build()
            .user_data(data);
            self.push(&e);
            return;
        }
        s.busy = false;
        s.at = 0;
        if s.buf.capacity() > keep {
            // A burst is over: its memory goes back.
            s.buf = Vec::new();
        } else {
            s.buf.clear();
        }
        c.sending = 0;
        c.sending_cap = s.buf.capacity();
        c.writable = true;
        if c.unsent() > 0 || c.close_after || c.dead || c.readable || !self.armed[slot as usize] {
            core.touch(slot);
        }
    }

    pub(crate) fn read<T>(&mut self, c: &mut Conn<T>) -> Input<'_> {
        let s = c.id.slot as usize;
        debug_assert_eq!(self.current, NONE);
        match self.head[s] {
            NONE => {
                c.readable = false;
                if self.ended[s] {
                    c.eof = true;
                    Input::Closed
                } else {
                    Input::WouldBlock
                }
            }
            b => {
                self.head[s] = self.next[usize::from(b)];
                if self.head[s] == NONE {
                    self.tail[s] = NONE;
                }
                self.current = b;
                Input::Data(self.bufs.bytes(b, self.len[usize::from(b)] as usize))
            }
        }
    }

    /// `c`'s receive is stopped (for a pause, a pending request or a lack of buffers) and
    /// nothing waits to be read: serving it starts the receive again.
    pub(crate) fn stopped<T>(&self, c: &Conn<T>) -> bool {
        let s = c.id.slot as usize;
        !self.armed[s] && !self.ended[s] && self.head[s] == NONE
    }

    pub(crate) fn consumed(&mut self) {
        let b = std::mem::replace(&mut self.current, NONE);
        if b != NONE {
            self.bufs.give(b);
        }
    }

    /// Bytes that arrived for a connection that takes no input now (a request pending, its
    /// output paused) are kept aside, as unread (the buffers go back to the kernel), and its
    /// receive is stopped: the socket's buffer and TCP hold the rest, as with a readiness
    /// loop that stops reading. For a connection that closes they are dropped. A paused
    /// connection's receive is stopped at once; one that takes input again gets it back.
    /// True when `c`'s buffers grew.
    pub(crate) fn after_serve<T>(&mut self, c: &mut Conn<T>, draining: bool, pause: usize) -> bool {
        let s = c.id.slot as usize;
        let closing = c.close_after || c.dead || draining;
        let paused = c.unsent() >= pause;
        let mut grew = false;
        if closing && !c.unread.is_empty() {
            c.unread = Vec::new();
        }
        if self.head[s] != NONE {
            while self.head[s] != NONE {
                let b = self.head[s];
                self.head[s] = self.next[usize::from(b)];
                if !closing {
                    // Copy: input that arrived while the connection could not take it.
                    c.unread
                        .extend_from_slice(self.bufs.bytes(b, self.len[usize::from(b)] as usize));
                    grew = true;
                }
                self.bufs.give(b);
            }
            self.tail[s] = NONE;
            c.readable = !c.unread.is_empty() || self.ended[s];
            self.cancel_recv(c.id);
        } else if paused {
            self.cancel_recv(c.id);
        } else if !closing && !self.armed[s] && !self.ended[s] && !c.pending && c.unread.is_empty()
        {
            let fd = c.stream.as_raw_fd();
            self.arm_recv(fd, c.id);
        }
        grew
    }

    pub(crate) fn flush<T>(&mut self, c: &mut Conn<T>, keep: usize) {
        let slot = c.id.slot;
        let s = &mut self.sends[slot as usize];
        if c.dead || s.busy || c.out.is_empty() {
            if !s.busy {
                c.settle(keep);
            }
            return;
        }
        // The output becomes the send's buffer; replies go on into the previous one.
        std::mem::swap(&mut c.out, &mut s.buf);
        c.out_at = 0;
        s.at = 0;
        s.busy = true;
        s.fd = c.stream.as_raw_fd();
        c.sending = s.buf.len();
        c.sending_cap = s.buf.capacity();
        let e = opcode::Send::new(Fd(s.fd), s.buf.as_ptr(), s.buf.len() as u32)
            .flags(libc::MSG_WAITALL | libc::MSG_NOSIGNAL)
            .build()
            .user_data(user_data(SEND, slot, c.id.gen));
        self.push(&e);
        c.settle(keep);
    }

    pub(crate) fn close(&mut self, stream: TcpStream, id: ConnId) {
        let s = id.slot as usize;
        // Every request on the socket (a receive, a stopped receive not finished yet, a send
        // of a connection closed for an error) ends before the close.
        self.armed[s] = false;
        let e = opcode::AsyncCancel2::new(CancelBuilder::fd(Fd(stream.as_raw_fd())).all())
            .build()
            .user_data(user_data(OTHER, id.slot, id.gen));
        self.push(&e);
        while self.head[s] != NONE {
            let b = self.head[s];
            self.head[s] = self.next[usize::from(b)];
            self.bufs.give(b);
        }
        self.tail[s] = NONE;
        self.ended[s] = false;
        if !self.sends[s].busy {
            self.sends[s] = Sending::default();
        }
        // Closed by the ring, after the requests queued before (which hold the socket).
        let e = opcode::Close::new(Fd(stream.into_raw_fd()))
            .build()
            .user_data(user_data(OTHER, id.slot, id.gen));
        self.push(&e);
    }

    pub(crate) fn stop_accepting(&mut self) {
        if self.listener.take().is_some() && self.accept_armed {
            let e = opcode::AsyncCancel::new(user_data(ACCEPT, 0, 0))
                .build()
                .user_data(user_data(OTHER, 0, 0));
            self.push(&e);
        }
        self.accept_armed = true;
    }

    pub(crate) fn finish(&mut self) {
        if let Err(e) = self.ring.submit() {
            tracing::warn!(error = %e, "io_uring submit failed");
        }
    }
}
