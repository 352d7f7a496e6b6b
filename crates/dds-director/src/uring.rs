//! The completion backend of a director thread's split connections (`docs/offload.md` §5,
//! "Split connections on io_uring"): one io_uring per thread. Both sockets of every split
//! connection, the client's and the host's (once connected), have one multishot receive into
//! buffers the thread lends the kernel through a buffer ring (`dds_server::BufRing`); a
//! round's responses leave as one `sendmsg` per connection (header and data gathered from
//! where they are, no copy), its host messages as one per host socket, all handed to the
//! kernel by one `io_uring_enter`; the wait is the ring's own, with its timeout. The
//! listener, the host's connect, spliced connections and the stop waker stay on the thread's
//! `mio` poll, whose epoll descriptor has a multishot poll on the ring, as has the eventfd
//! through which the service side wakes the thread: the thread sleeps in one place.
//!
//! Sends carry `MSG_DONTWAIT`: the kernel runs each inside the `io_uring_enter` that submits
//! it and completes it there (a full socket completes with `EAGAIN` instead of waiting), so
//! the bytes a send names are never touched after the round's submission returns; a send
//! still outstanding then (never seen) is waited for before anything else runs.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use dds_server::BufRing;
use io_uring::types::{Fd, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring, Probe};

use crate::buffer::Buf;
use crate::stats::add;
use crate::worker::IOV_MAX;

/// What a completion is for (the top four bits of its user data).
const RECV: u64 = 1;
const SEND: u64 = 2;
const EPOLL: u64 = 3;
/// Cancels: their results are not needed.
const OTHER: u64 = 4;
const WAKE: u64 = 5;
const GEN_MASK: u64 = 0x00ff_ffff;
/// The buffer group of the receive buffers.
const GROUP: u16 = 0;
/// Received buffers a connection holds before its queue grows (the queue grows only when a
/// client keeps sending while its connection takes no input and the receive's cancel is on
/// its way).
const STASH: usize = 16;

/// A request's user data: what it is for (4 bits), which receive of the slot (4 bits), the
/// connection's generation (24 bits) and its slot (32 bits).
fn user_data(kind: u64, slot: usize, gen: u32, epoch: u8) -> u64 {
    (kind << 60) | (u64::from(epoch & 15) << 56) | ((u64::from(gen) & GEN_MASK) << 32) | slot as u64
}

/// One socket of a split connection: the connection's slot, and whether it is the host's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Leg {
    pub(crate) slot: usize,
    pub(crate) host: bool,
}

impl Leg {
    pub(crate) fn client(slot: usize) -> Leg {
        Leg { slot, host: false }
    }
    pub(crate) fn host(slot: usize) -> Leg {
        Leg { slot, host: true }
    }
    fn index(self) -> usize {
        self.slot * 2 + usize::from(self.host)
    }
    fn of(index: usize) -> Leg {
        Leg {
            slot: index / 2,
            host: index % 2 == 1,
        }
    }
}

/// How a leg's receive ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Open,
    Eof,
    Reset,
}

/// What a round of completions asks of the thread.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    /// Bytes (or the end of the stream) arrived on this leg of a connection.
    Received(Leg),
    /// The leg's send completed with this result (bytes sent, or `-errno`).
    Sent(Leg, i32),
    /// The `mio` poll has events.
    Epoll,
    /// The service side woke the thread (its lane's eventfd).
    Woken,
}

struct Slot {
    fd: RawFd,
    gen: u32,
    epoch: u8,
    open: bool,
    armed: bool,
    rearm: bool,
    end: End,
    /// Received buffers not yet taken into the connection's input, oldest first: buffer,
    /// offset of the first byte not taken, bytes left.
    stash: VecDeque<(u16, u32, u32)>,
    iov: [libc::iovec; IOV_MAX],
    msg: libc::msghdr,
    sending: bool,
}

pub(crate) struct SplitRing {
    // Dropped first: the kernel lets go of the buffers before they are freed.
    ring: IoUring,
    bufs: BufRing,
    slots: Box<[Slot]>,
    rearm: Vec<usize>,
    unsent: usize,
    epoll_fd: RawFd,
    /// The lane's waker: the service side writes it, the ring polls it.
    wake: Arc<OwnedFd>,
    evs: Vec<Ev>,
    cqes: Vec<cqueue::Entry>,
}

// SAFETY: the raw pointers in `Slot` (the iovecs and message header of a send) point into
// memory the owning thread's connections hold, and are used only by that thread between
// the send's submission and its completion; the ring is built before the thread starts and
// moves into it once.
unsafe impl Send for SplitRing {}

fn transient(res: i32) -> bool {
    matches!(
        -res,
        libc::ENOBUFS | libc::ENOMEM | libc::EAGAIN | libc::EINTR | libc::ECANCELED
    )
}

impl SplitRing {
    /// A ring for `max_connections` split connections (two legs each) with `buffers` receive buffers of
    /// `buf_bytes` each, polling `epoll_fd`; or why this kernel cannot have one.
    pub(crate) fn new(
        max_connections: usize,
        buffers: u16,
        buf_bytes: usize,
        epoll_fd: RawFd,
    ) -> io::Result<SplitRing> {
        let release = rustix::system::uname();
        let release = release.release().to_string_lossy();
        let mut parts = release.split(|c: char| !c.is_ascii_digit());
        let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if major < 6 {
            // Multishot receive into a buffer ring came with Linux 6.0.
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("Linux {release}: no multishot receive"),
            ));
        }
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(8192)
            .build(1024)
            .or_else(|_| IoUring::builder().setup_cqsize(8192).build(1024))?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        for (code, name) in [
            (opcode::RecvMulti::CODE, "recv"),
            (opcode::SendMsg::CODE, "sendmsg"),
            (opcode::PollAdd::CODE, "poll"),
            (opcode::AsyncCancel::CODE, "cancel"),
        ] {
            if !probe.is_supported(code) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring has no {name} operation"),
                ));
            }
        }
        let buffers = buffers.clamp(1, 1 << 15).next_power_of_two();
        let buf_bytes = buf_bytes.max(4096);
        let mut bufs = BufRing::new(buffers, buf_bytes)?;
        // SAFETY: `bufs` outlives the registration: `ring` is dropped first (field order).
        unsafe { bufs.register(&ring, GROUP)? };
        for bid in 0..buffers {
            bufs.give(bid);
        }
        bufs.publish();
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let slots = (0..2 * max_connections.max(1))
            .map(|_| Slot {
                fd: -1,
                gen: 0,
                epoch: 0,
                open: false,
                armed: false,
                rearm: false,
                end: End::Open,
                stash: VecDeque::with_capacity(STASH),
                iov: [empty; IOV_MAX],
                // SAFETY: an all-zero `msghdr` is a valid empty header.
                msg: unsafe { std::mem::zeroed() },
                sending: false,
            })
            .collect();
        let mut r = SplitRing {
            ring,
            bufs,
            slots,
            rearm: Vec::with_capacity(2 * max_connections.max(1)),
            unsent: 0,
            epoll_fd,
            wake: Arc::new(rustix::event::eventfd(
                0,
                rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
            )?),
            evs: Vec::with_capacity(8192),
            cqes: Vec::with_capacity(8192),
        };
        r.arm_epoll();
        r.arm_wake();
        Ok(r)
    }

    fn push(&mut self, e: &squeue::Entry) {
        loop {
            // SAFETY: every buffer and descriptor a request names outlives it: receive
            // buffers are the buffer ring's, a send's bytes stay untouched until its
            // completion (`finish_sends`), sockets are closed after their receive's cancel
            // was queued and the kernel holds the file until the cancel ran.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return;
            }
            if let Err(e) = self.ring.submit() {
                tracing::warn!(error = %e, "io_uring submit failed");
            }
        }
    }

    fn arm_epoll(&mut self) {
        let e = opcode::PollAdd::new(Fd(self.epoll_fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(EPOLL, 0, 0, 0));
        self.push(&e);
    }

    fn arm_wake(&mut self) {
        let e = opcode::PollAdd::new(Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(WAKE, 0, 0, 0));
        self.push(&e);
    }

    /// The function that wakes this thread from the service side (an eventfd write, which
    /// the ring's poll of it reports; never read: a poll reports each write).
    pub(crate) fn waker(&self) -> impl Fn() + Send + Sync + 'static {
        let fd = self.wake.clone();
        move || {
            let _ = rustix::io::write(&*fd, &1u64.to_ne_bytes());
        }
    }

    fn arm_recv(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        let fd = s.fd;
        s.epoch = s.epoch.wrapping_add(1) & 15;
        s.armed = true;
        let e = opcode::RecvMulti::new(Fd(fd), GROUP)
            .build()
            .user_data(user_data(RECV, slot, s.gen, s.epoch));
        self.push(&e);
    }

    fn cancel_recv(&mut self, slot: usize) {
        let s = &mut self.slots[slot];
        if std::mem::take(&mut s.armed) {
            let e = opcode::AsyncCancel::new(user_data(RECV, slot, s.gen, s.epoch))
                .build()
                .user_data(user_data(OTHER, slot, s.gen, 0));
            self.push(&e);
        }
    }

    /// A new split connection's leg (the host's once connected): its receive starts.
    pub(crate) fn open(&mut self, leg: Leg, gen: u32, fd: RawFd) {
        let slot = leg.index();
        let s = &mut self.slots[slot];
        debug_assert!(!s.open && s.stash.is_empty() && !s.sending);
        s.fd = fd;
        s.gen = gen;
        s.open = true;
        s.end = End::Open;
        s.rearm = false;
        self.arm_recv(slot);
    }

    /// A connection's leg closes: its receive is cancelled and the buffers it held go back
    /// to the ring.
    pub(crate) fn close(&mut self, leg: Leg) {
        let slot = leg.index();
        if !self.slots[slot].open {
            return;
        }
        self.cancel_recv(slot);
        let s = &mut self.slots[slot];
        debug_assert!(!s.sending, "a connection closed with a send in flight");
        s.open = false;
        while let Some((bid, _, _)) = s.stash.pop_front() {
            self.bufs.give(bid);
        }
    }

    /// Moves received bytes into `cin` as far as it has room; at the end of the received
    /// bytes, the stream's end (`eof`) or reset (`Err`). Ok(true) on progress. A connection
    /// that cannot take everything stops receiving until it has taken what it holds.
    pub(crate) fn take(
        &mut self,
        leg: Leg,
        cin: &mut Buf,
        eof: &mut bool,
        counter: &AtomicU64,
    ) -> Result<bool, ()> {
        if *eof {
            return Ok(false);
        }
        let mut progress = false;
        let tail = cin.tail();
        let mut room = tail.len();
        let mut at = 0;
        let slot = leg.index();
        let s = &mut self.slots[slot];
        while let Some(front) = s.stash.front_mut() {
            if room == 0 {
                break;
            }
            let (bid, off, len) = *front;
            let n = room.min(len as usize);
            let bytes = self.bufs.bytes(bid, off as usize + n);
            // Copy: receive buffer → the connection's input (the buffer goes back to the
            // ring at once; the input is what framing and the planner read in place).
            tail[at..at + n].copy_from_slice(&bytes[off as usize..]);
            at += n;
            room -= n;
            if n == len as usize {
                s.stash.pop_front();
                self.bufs.give(bid);
            } else {
                *front = (bid, off + n as u32, len - n as u32);
            }
        }
        if at > 0 {
            cin.commit(at);
            add(counter, at as u64);
            progress = true;
        }
        if s.stash.is_empty() {
            match s.end {
                End::Eof => {
                    *eof = true;
                    progress = true;
                }
                End::Reset => return Err(()),
                End::Open if !s.armed => self.arm_recv(slot),
                End::Open => {}
            }
        } else if s.armed {
            // Paused: the socket holds the rest until the input has room.
            self.cancel_recv(slot);
        }
        Ok(progress)
    }

    /// Queues the send of `iov` on the leg's socket `fd` (handed to the kernel by
    /// [`SplitRing::finish_sends`]); the bytes stay untouched until then.
    pub(crate) fn queue_send(&mut self, leg: Leg, fd: RawFd, iov: &[IoSlice<'_>]) {
        let slot = leg.index();
        let s = &mut self.slots[slot];
        debug_assert!(!s.sending && iov.len() <= IOV_MAX);
        for (d, v) in s.iov.iter_mut().zip(iov) {
            // `IoSlice` is an `iovec` on Unix; this spells the conversion out.
            *d = libc::iovec {
                iov_base: v.as_ptr().cast_mut().cast(),
                iov_len: v.len(),
            };
        }
        s.msg.msg_iov = s.iov.as_mut_ptr();
        s.msg.msg_iovlen = iov.len() as _;
        s.sending = true;
        let e = opcode::SendMsg::new(Fd(fd), &s.msg)
            .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
            .build()
            .user_data(user_data(SEND, slot, s.gen, 0));
        self.unsent += 1;
        self.push(&e);
    }

    /// The ring's descriptor: readable while completions wait in its queue.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    pub(crate) fn sending(&self) -> bool {
        self.unsent > 0
    }

    /// Hands the round's sends (and any receive started meanwhile) to the kernel in one
    /// system call and collects their completions into [`SplitRing::events`].
    pub(crate) fn finish_sends(&mut self) -> io::Result<()> {
        self.bufs.publish();
        self.evs.clear();
        while self.unsent > 0 {
            let r = if self.ring.completion().is_empty() {
                self.ring.submit_and_wait(1)
            } else {
                self.ring.submit()
            };
            match r {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EBUSY | libc::EINTR | libc::EAGAIN | libc::ENOMEM)
                    ) => {}
                Err(e) => return Err(e),
            }
            self.collect();
        }
        Ok(())
    }

    /// Starts the receives that ended for a passing reason, hands what is queued to the
    /// kernel and waits up to `timeout` for a completion (no system call when there is
    /// nothing to hand over and nothing to wait for); the completions are then in
    /// [`SplitRing::events`].
    pub(crate) fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        for k in 0..self.rearm.len() {
            let slot = self.rearm[k];
            let s = &mut self.slots[slot];
            s.rearm = false;
            if s.open && !s.armed && s.end == End::Open && s.stash.is_empty() {
                self.arm_recv(slot);
            }
        }
        self.rearm.clear();
        self.bufs.publish();
        self.evs.clear();
        let r = if timeout.is_zero() || !self.ring.completion().is_empty() {
            let mut sq = self.ring.submission();
            sq.sync();
            if sq.is_empty() && !sq.taskrun() && !sq.cq_overflow() {
                drop(sq);
                self.collect();
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
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(
                        libc::ETIME
                            | libc::EBUSY
                            | libc::EINTR
                            | libc::EAGAIN
                            | libc::ENOMEM
                            | libc::EBADR
                    )
                ) => {}
            Err(e) => return Err(e),
        }
        self.collect();
        Ok(())
    }

    /// The completions collected by the last [`SplitRing::wait`] or
    /// [`SplitRing::finish_sends`].
    pub(crate) fn events(&self) -> &[Ev] {
        &self.evs
    }

    pub(crate) fn event(&self, k: usize) -> Ev {
        self.evs[k]
    }

    fn collect(&mut self) {
        self.cqes.clear();
        self.cqes.extend(self.ring.completion());
        for k in 0..self.cqes.len() {
            let cqe = self.cqes[k].clone();
            self.handle(&cqe);
        }
    }

    fn handle(&mut self, cqe: &cqueue::Entry) {
        let data = cqe.user_data();
        let res = cqe.result();
        let more = cqueue::more(cqe.flags());
        let slot = (data & 0xffff_ffff) as usize;
        let gen = ((data >> 32) & GEN_MASK) as u32;
        match data >> 60 {
            EPOLL => {
                if !more {
                    self.arm_epoll();
                }
                self.evs.push(Ev::Epoll);
            }
            WAKE => {
                if !more {
                    self.arm_wake();
                }
                self.evs.push(Ev::Woken);
            }
            SEND => {
                self.unsent -= 1;
                if let Some(s) = self.slots.get_mut(slot) {
                    s.sending = false;
                }
                self.evs.push(Ev::Sent(Leg::of(slot), res));
            }
            RECV => {
                let bid = cqueue::buffer_select(cqe.flags());
                let Some(s) = self.slots.get_mut(slot) else {
                    return;
                };
                let live = s.open && u64::from(s.gen) & GEN_MASK == u64::from(gen);
                let current = live && ((data >> 56) & 15) as u8 == s.epoch;
                match bid {
                    Some(bid) if live && res > 0 => {
                        s.stash.push_back((bid, 0, res as u32));
                    }
                    Some(bid) => self.bufs.give(bid),
                    None => {}
                }
                let s = &mut self.slots[slot];
                if current && !more {
                    s.armed = false;
                    if res == 0 {
                        s.end = End::Eof;
                    } else if res < 0 && !transient(res) {
                        s.end = End::Reset;
                    } else if s.stash.is_empty() && !s.rearm {
                        // Ended for a passing reason (no buffer left, a byte limit, a full
                        // completion queue): started again before the next wait.
                        s.rearm = true;
                        self.rearm.push(slot);
                    }
                }
                if live && (res >= 0 || !more) {
                    self.evs.push(Ev::Received(Leg::of(slot)));
                }
            }
            _ => {}
        }
    }
}
