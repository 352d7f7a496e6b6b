//! Notification groups: a request ring and a response ring in shared memory, the slots that
//! book-keep outstanding operations, and PollWait.

use std::cell::UnsafeCell;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use dds_proto::control::{GroupInfo, Request};
use dds_proto::record::{self, BufferRef, Op, RequestHeader, RESPONSE_HEADER_BYTES};
use dds_proto::Status;
use dds_ring::{RequestProducer, ResponseConsumer, RingError, POINTER_AREA_BYTES};
use dds_shm::SharedRegion;

use crate::buffer::BufInner;
use crate::conn::Shared;
use crate::error::{DdsError, Result};

/// Most buffers one scatter read may name.
pub const IOV_MAX: usize = 16;

/// One destination buffer of a scatter read.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct IoVec {
    pub ptr: *mut u8,
    pub len: u32,
}

// SAFETY: an IoVec is an address the caller promised to keep valid until completion; it is
// written only by the thread that completes the operation.
unsafe impl Send for IoVec {}
unsafe impl Sync for IoVec {}

/// Settings of one notification group.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// Request ring data bytes (power of two, ≥ 64 KiB). A write must fit in half of it.
    pub request_ring_bytes: usize,
    /// Response ring data bytes (power of two, ≥ 64 KiB). A read must fit in half of it.
    pub response_ring_bytes: usize,
    /// Outstanding operations at most (slots); more get `TooManyOutstanding`.
    pub max_outstanding: u16,
    /// The ring's bound M on bytes in flight (0 = the whole request ring).
    pub max_inflight_bytes: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            request_ring_bytes: 4 << 20,
            response_ring_bytes: 4 << 20,
            max_outstanding: 1024,
            max_inflight_bytes: 0,
        }
    }
}

/// A completed operation, as PollWait returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub file_ctx: u64,
    pub io_ctx: u64,
    pub status: Status,
    /// Bytes read or written.
    pub bytes: u32,
}

impl Completion {
    pub fn result(&self) -> Result<u32> {
        match self.status {
            Status::Ok => Ok(self.bytes),
            s => Err(DdsError::new(s, "operation failed")),
        }
    }
}

/// Completion rendezvous of a blocking call.
pub(crate) struct WaiterInner {
    done: AtomicBool,
    status: AtomicU16,
    bytes: AtomicU32,
    thread: Thread,
}

pub(crate) type Waiter = Arc<WaiterInner>;

impl WaiterInner {
    #[allow(clippy::new_ret_no_self)]
    pub(crate) fn new() -> Waiter {
        Arc::new(WaiterInner {
            done: AtomicBool::new(false),
            status: AtomicU16::new(0),
            bytes: AtomicU32::new(0),
            thread: std::thread::current(),
        })
    }

    fn complete(&self, status: Status, bytes: u32) {
        self.status.store(status.code(), Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

// Slot states.
const FREE: u8 = 0;
const ISSUED: u8 = 1;
const COMPLETING: u8 = 2;
/// Completed by a thread other than a PollWait caller; waiting in `ready`.
const READY: u8 = 3;

struct SlotData {
    op: Op,
    file_ctx: u64,
    io_ctx: u64,
    iov: [IoVec; IOV_MAX],
    iov_count: usize,
    requested: u32,
    waiter: Option<Waiter>,
    /// A registered READ or WRITE: the buffer, kept registered until the completion.
    buffer: Option<Arc<BufInner>>,
    status: Status,
    bytes: u32,
}

/// Book-keeping of one outstanding operation. `data` is written by the issuing thread while
/// the slot is FREE→ISSUED and by the completing thread after it won the ISSUED→COMPLETING
/// transition; the state's release/acquire orders the two.
struct Slot {
    generation: AtomicU16,
    state: AtomicU8,
    data: UnsafeCell<SlotData>,
}

// SAFETY: see the protocol on `Slot`.
unsafe impl Sync for Slot {}

/// A notification group (cheap to clone; all clones are the same group).
#[derive(Clone)]
pub struct Group {
    inner: Arc<GroupInner>,
}

pub(crate) struct GroupInner {
    shared: Arc<Shared>,
    id: u32,
    producer: RequestProducer,
    consumer: ResponseConsumer,
    eventfd: OwnedFd,
    /// Host → DPU doorbell (eventfd) for a parked DPU.
    doorbell: OwnedFd,
    slots: Box<[Slot]>,
    free: ArrayQueue<u16>,
    ready: ArrayQueue<u16>,
    /// Held by the thread that drives the response ring on behalf of blocking callers.
    driver: Mutex<()>,
    payload_align: u32,
    max_io_bytes: u32,
    response_capacity: u64,
    epoch: Instant,
    last_alive_check_ms: AtomicU64,
    // Last field: the rings point into this mapping.
    _region: SharedRegion,
}

impl Group {
    pub(crate) fn create(shared: &Arc<Shared>, cfg: &GroupConfig) -> Result<Group> {
        let bad = |m: &str| DdsError::new(Status::InvalidArgument, m.to_string());
        for n in [cfg.request_ring_bytes, cfg.response_ring_bytes] {
            if !n.is_power_of_two() || !((64 << 10)..=(1 << 30)).contains(&n) {
                return Err(bad("ring sizes must be powers of two from 64 KiB to 1 GiB"));
            }
        }
        if cfg.max_outstanding == 0 || cfg.max_outstanding == u16::MAX {
            return Err(bad("max_outstanding must be in 1..65535"));
        }
        if cfg.max_inflight_bytes > cfg.request_ring_bytes {
            return Err(bad("max_inflight_bytes exceeds the request ring"));
        }
        let req_offset = 0usize;
        let resp_offset = POINTER_AREA_BYTES + cfg.request_ring_bytes;
        let region_len = resp_offset + POINTER_AREA_BYTES + cfg.response_ring_bytes;
        let region = SharedRegion::create("dds-group", region_len)
            .map_err(|e| DdsError::new(Status::Io, format!("shared memory: {e}")))?;
        let m = if cfg.max_inflight_bytes == 0 {
            cfg.request_ring_bytes
        } else {
            cfg.max_inflight_bytes
        };
        // SAFETY: both rings lie inside `region`, which the group keeps alive.
        let (producer, consumer) = unsafe {
            let base = region.as_ptr();
            (
                RequestProducer::new(
                    base.add(req_offset),
                    cfg.request_ring_bytes as u64,
                    m as u64,
                ),
                ResponseConsumer::new(base.add(resp_offset), cfg.response_ring_bytes as u64),
            )
        };
        producer.init();
        consumer.init();
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| DdsError::new(Status::Io, format!("eventfd: {e}")))?;
        // The DPU's doorbell: written when a request is published while the DPU is parked.
        let doorbell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map_err(|e| DdsError::new(Status::Io, format!("eventfd: {e}")))?;
        let info: GroupInfo = shared.rpc(
            &Request::CreateGroup {
                region_len: region_len as u64,
                req_offset: req_offset as u64,
                req_capacity: cfg.request_ring_bytes as u64,
                resp_offset: resp_offset as u64,
                resp_capacity: cfg.response_ring_bytes as u64,
            },
            &[region.fd(), eventfd.as_fd(), doorbell.as_fd()],
        )?;
        let n = cfg.max_outstanding as usize;
        let free = ArrayQueue::new(n);
        let slots: Box<[Slot]> = (0..n)
            .map(|i| {
                free.push(i as u16).expect("sized to n");
                Slot {
                    generation: AtomicU16::new(0),
                    state: AtomicU8::new(FREE),
                    data: UnsafeCell::new(SlotData {
                        op: Op::Read,
                        file_ctx: 0,
                        io_ctx: 0,
                        iov: [IoVec {
                            ptr: std::ptr::null_mut(),
                            len: 0,
                        }; IOV_MAX],
                        iov_count: 0,
                        requested: 0,
                        waiter: None,
                        buffer: None,
                        status: Status::Ok,
                        bytes: 0,
                    }),
                }
            })
            .collect();
        Ok(Group {
            inner: Arc::new(GroupInner {
                shared: shared.clone(),
                id: info.group,
                producer,
                consumer,
                eventfd,
                doorbell,
                slots,
                free,
                ready: ArrayQueue::new(n),
                driver: Mutex::new(()),
                payload_align: shared.hello.payload_align.max(8),
                max_io_bytes: shared.hello.max_io_bytes,
                response_capacity: cfg.response_ring_bytes as u64,
                epoch: Instant::now(),
                last_alive_check_ms: AtomicU64::new(0),
                _region: region,
            }),
        })
    }

    pub(crate) fn inner(&self) -> &GroupInner {
        &self.inner
    }

    pub(crate) fn same(&self, other: &Group) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The DPU's id of this group.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    /// Operations issued and not yet returned.
    pub fn outstanding(&self) -> usize {
        self.inner.slots.len() - self.inner.free.len()
    }

    /// The descriptor that becomes readable when the DPU delivers completions to this group
    /// while a thread announced that it sleeps ([`Group::prepare_sleep`]): for an event
    /// loop's poller, which then sleeps on sockets and completions together.
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.eventfd.as_fd()
    }

    /// Before an event loop sleeps on [`Group::wake_fd`]: announces the sleeper in the ring's
    /// `Waiters` word and re-checks the ring. False when completions are already waiting: the
    /// announcement is withdrawn at once (do not sleep, and do not call [`Group::end_sleep`]).
    pub fn prepare_sleep(&self) -> bool {
        let empty = self.inner.consumer.announce_sleep();
        if empty && self.inner.ready.is_empty() {
            return true;
        }
        self.inner.consumer.end_sleep();
        false
    }

    /// After a [`Group::prepare_sleep`] that returned true (slept or not): withdraws the
    /// sleeper and clears the descriptor's signal.
    pub fn end_sleep(&self) {
        self.inner.consumer.end_sleep();
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.inner.eventfd, &mut v);
    }

    /// PollWait: returns one completion of this group. `timeout` zero is the non-blocking
    /// mode; otherwise the caller sleeps (no CPU) until the DPU signals or the timeout passes.
    /// Fails with `DpuDead` once the DPU is gone and every pending operation was returned.
    pub fn poll_wait(&self, timeout: Duration) -> Result<Option<Completion>> {
        self.inner.poll_wait(timeout)
    }

    pub(crate) fn fail_pending(&self, status: Status) {
        self.inner.fail_pending(status)
    }
}

impl GroupInner {
    fn check_issue(&self) -> Result<()> {
        if self.shared.is_dead() {
            self.fail_pending(Status::DpuDead);
            return Err(DdsError::dead("DPU is gone"));
        }
        Ok(())
    }

    /// Takes a free slot and fills it; the slot is ISSUED on return.
    fn take_slot(&self, fill: impl FnOnce(&mut SlotData)) -> Result<(u16, u32)> {
        let idx = self.free.pop().ok_or_else(|| {
            DdsError::new(
                Status::TooManyOutstanding,
                format!("all {} slots of the group are in use", self.slots.len()),
            )
        })?;
        let slot = &self.slots[idx as usize];
        assert_eq!(slot.state.load(Ordering::Acquire), FREE, "free slot in use");
        // SAFETY: the slot is FREE and we own it (popped from `free`).
        let d = unsafe { &mut *slot.data.get() };
        fill(d);
        let generation = slot.generation.load(Ordering::Relaxed);
        slot.state.store(ISSUED, Ordering::Release);
        Ok((idx, ((generation as u32) << 16) | idx as u32))
    }

    /// Returns a slot whose request never reached the ring.
    fn untake_slot(&self, idx: u16) {
        let slot = &self.slots[idx as usize];
        let was = slot.state.swap(FREE, Ordering::AcqRel);
        assert_eq!(was, ISSUED);
        // SAFETY: the request was not published, so no one else can touch the slot.
        unsafe {
            (*slot.data.get()).waiter = None;
            (*slot.data.get()).buffer = None;
        }
        self.free.push(idx).expect("free queue sized to slots");
    }

    fn push(&self, op: Op, idx: u16, header: &RequestHeader, data: &[&[u8]]) -> Result<()> {
        let tail = record::encode_request_tail(header);
        let align = if op == Op::Write && header.buffer.is_none() {
            self.payload_align
        } else {
            8
        };
        match self.producer.try_push(op.code(), &tail, data, align) {
            Ok(_) => {
                if self.producer.consumer_sleeping() {
                    // The DPU is parked: wake it. EAGAIN means the doorbell is rung already.
                    let _ = rustix::io::write(&self.doorbell, &1u64.to_ne_bytes());
                }
                Ok(())
            }
            Err(e) => {
                self.untake_slot(idx);
                Err(match e {
                    RingError::Retry => DdsError::new(
                        Status::RingFull,
                        "request ring full: poll completions and retry",
                    ),
                    RingError::TooLarge => {
                        DdsError::new(Status::TooLarge, "request larger than the request ring")
                    }
                })
            }
        }
    }

    /// # Safety
    /// The buffers stay valid until the completion is returned.
    pub(crate) unsafe fn issue_read(
        &self,
        file: u32,
        offset: u64,
        bufs: &[IoVec],
        file_ctx: u64,
        io_ctx: u64,
        waiter: Option<Waiter>,
    ) -> Result<()> {
        self.check_issue()?;
        if bufs.is_empty() || bufs.len() > IOV_MAX {
            return Err(DdsError::new(
                Status::InvalidArgument,
                format!("a read takes 1..={IOV_MAX} buffers"),
            ));
        }
        let total: u64 = bufs.iter().map(|b| b.len as u64).sum();
        if total > self.max_io_bytes as u64 {
            return Err(DdsError::new(
                Status::TooLarge,
                format!("read of {total} bytes exceeds {} bytes", self.max_io_bytes),
            ));
        }
        if !dds_ring::fits(
            self.response_capacity,
            RESPONSE_HEADER_BYTES as u32,
            total as u32,
            self.payload_align,
        ) {
            return Err(DdsError::new(
                Status::TooLarge,
                format!("read of {total} bytes does not fit the group's response ring"),
            ));
        }
        let (idx, request_id) = self.take_slot(|d| {
            d.op = Op::Read;
            d.file_ctx = file_ctx;
            d.io_ctx = io_ctx;
            d.iov[..bufs.len()].copy_from_slice(bufs);
            d.iov_count = bufs.len();
            d.requested = total as u32;
            d.waiter = waiter;
        })?;
        let h = RequestHeader {
            op: Op::Read,
            request_id,
            file_id: file,
            offset,
            bytes: total as u32,
            buffer: None,
        };
        self.push(Op::Read, idx, &h, &[])
    }

    pub(crate) fn issue_write(
        &self,
        file: u32,
        offset: u64,
        bufs: &[&[u8]],
        file_ctx: u64,
        io_ctx: u64,
        waiter: Option<Waiter>,
    ) -> Result<()> {
        self.issue_data(Op::Write, file, offset, bufs, file_ctx, io_ctx, waiter)
    }

    /// Issues a record that carries data: WRITE, CACHE or INVALIDATE.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn issue_data(
        &self,
        op: Op,
        file: u32,
        offset: u64,
        bufs: &[&[u8]],
        file_ctx: u64,
        io_ctx: u64,
        waiter: Option<Waiter>,
    ) -> Result<()> {
        debug_assert!(op.carries_data());
        self.check_issue()?;
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if total > self.max_io_bytes as u64 {
            return Err(DdsError::new(
                Status::TooLarge,
                format!("write of {total} bytes exceeds {} bytes", self.max_io_bytes),
            ));
        }
        let (idx, request_id) = self.take_slot(|d| {
            d.op = op;
            d.file_ctx = file_ctx;
            d.io_ctx = io_ctx;
            d.iov_count = 0;
            d.requested = total as u32;
            d.waiter = waiter;
        })?;
        let h = RequestHeader {
            op,
            request_id,
            file_id: file,
            offset,
            bytes: total as u32,
            buffer: None,
        };
        self.push(op, idx, &h, bufs)
    }

    /// Issues a READ or WRITE whose data moves by DMA straight between the DPU and `buf`
    /// (`offset .. offset + len` of it, checked by the caller).
    ///
    /// # Safety
    /// For a READ, the range is not accessed until the completion is returned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn issue_registered(
        &self,
        op: Op,
        file: u32,
        offset: u64,
        buf: &Arc<BufInner>,
        buf_offset: u64,
        len: u32,
        file_ctx: u64,
        io_ctx: u64,
        waiter: Option<Waiter>,
    ) -> Result<()> {
        debug_assert!(matches!(op, Op::Read | Op::Write));
        self.check_issue()?;
        if len > self.max_io_bytes {
            return Err(DdsError::new(
                Status::TooLarge,
                format!("I/O of {len} bytes exceeds {} bytes", self.max_io_bytes),
            ));
        }
        let (idx, request_id) = self.take_slot(|d| {
            d.op = op;
            d.file_ctx = file_ctx;
            d.io_ctx = io_ctx;
            d.iov_count = 0;
            d.requested = len;
            d.waiter = waiter;
            d.buffer = Some(buf.clone());
        })?;
        let buffer = BufferRef {
            id: buf.id,
            offset: buf_offset,
        };
        let h = RequestHeader {
            op,
            request_id,
            file_id: file,
            offset,
            bytes: len,
            buffer: Some(buffer),
        };
        self.push(op, idx, &h, &[&buffer.encode()])
    }

    pub(crate) fn issue_flush(
        &self,
        file_ctx: u64,
        io_ctx: u64,
        waiter: Option<Waiter>,
    ) -> Result<()> {
        self.check_issue()?;
        let (idx, request_id) = self.take_slot(|d| {
            d.op = Op::Flush;
            d.file_ctx = file_ctx;
            d.io_ctx = io_ctx;
            d.iov_count = 0;
            d.requested = 0;
            d.waiter = waiter;
        })?;
        let h = RequestHeader {
            op: Op::Flush,
            request_id,
            file_id: 0,
            offset: 0,
            bytes: 0,
            buffer: None,
        };
        self.push(Op::Flush, idx, &h, &[])
    }

    /// Completes the slot named by a response record. Returns the slot index when the
    /// completion is for a PollWait caller, `None` when it went to a blocking waiter or the
    /// record was not for a live slot.
    fn complete_record(&self, rec: &[u8]) -> Option<u16> {
        let Some(h) = record::decode_response(rec) else {
            tracing::error!(group = self.id, "malformed response record skipped");
            return None;
        };
        let idx = (h.request_id & 0xFFFF) as usize;
        let generation = (h.request_id >> 16) as u16;
        let Some(slot) = self.slots.get(idx) else {
            tracing::error!(group = self.id, h.request_id, "response for unknown slot");
            return None;
        };
        if slot.generation.load(Ordering::Relaxed) != generation
            || slot
                .state
                .compare_exchange(ISSUED, COMPLETING, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            tracing::error!(
                group = self.id,
                h.request_id,
                "response for a slot not in flight"
            );
            return None;
        }
        // SAFETY: we won ISSUED→COMPLETING, so we own the slot's data.
        let d = unsafe { &mut *slot.data.get() };
        let mut status = Status::from_code(h.status);
        let mut bytes = h.bytes;
        if status == Status::Ok && d.buffer.is_some() {
            // Registered: the data is in the buffer already, the response carries none.
            if bytes > d.requested {
                status = Status::Protocol;
                bytes = 0;
            }
        } else if status == Status::Ok && d.op == Op::Read {
            let avail = rec.len().saturating_sub(RESPONSE_HEADER_BYTES);
            if bytes > d.requested || bytes as usize > avail {
                status = Status::Protocol;
                bytes = 0;
            } else {
                // The one host-side copy of a read: response ring → caller's buffers.
                let mut src = &rec[RESPONSE_HEADER_BYTES..RESPONSE_HEADER_BYTES + bytes as usize];
                for v in &d.iov[..d.iov_count] {
                    if src.is_empty() {
                        break;
                    }
                    let n = src.len().min(v.len as usize);
                    // SAFETY: the caller guaranteed the buffer until completion.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), v.ptr, n) };
                    src = &src[n..];
                }
            }
        }
        self.finish(idx as u16, status, bytes)
    }

    /// Records the result of a COMPLETING slot and hands it to its consumer.
    fn finish(&self, idx: u16, status: Status, bytes: u32) -> Option<u16> {
        let slot = &self.slots[idx as usize];
        // SAFETY: the caller owns the slot (state COMPLETING).
        let d = unsafe { &mut *slot.data.get() };
        d.status = status;
        d.bytes = bytes;
        // The registration may end once nothing is in flight on it (dropped after the slot
        // is handed on, as the last reference unregisters it over the control socket).
        let _buffer = d.buffer.take();
        if let Some(w) = d.waiter.take() {
            self.release(idx);
            w.complete(status, bytes);
            None
        } else {
            Some(idx)
        }
    }

    fn release(&self, idx: u16) {
        let slot = &self.slots[idx as usize];
        slot.generation.fetch_add(1, Ordering::Relaxed);
        slot.state.store(FREE, Ordering::Release);
        self.free.push(idx).expect("free queue sized to slots");
    }

    /// Turns a completed slot into the completion returned to a PollWait caller.
    fn take_completion(&self, idx: u16) -> Completion {
        let slot = &self.slots[idx as usize];
        // SAFETY: the slot is COMPLETING or READY and owned by this thread.
        let d = unsafe { &*slot.data.get() };
        let c = Completion {
            file_ctx: d.file_ctx,
            io_ctx: d.io_ctx,
            status: d.status,
            bytes: d.bytes,
        };
        self.release(idx);
        c
    }

    /// Pops response records until one is for a PollWait caller or the ring is empty.
    fn drive_one(&self) -> Option<u16> {
        loop {
            match self.consumer.try_pop(|rec| self.complete_record(rec)) {
                None => return None,
                Some(Some(idx)) => return Some(idx),
                Some(None) => continue,
            }
        }
    }

    fn poll_wait(&self, timeout: Duration) -> Result<Option<Completion>> {
        // A completion at hand needs no clock.
        if let Some(idx) = self.ready.pop().or_else(|| self.drive_one()) {
            return Ok(Some(self.take_completion(idx)));
        }
        // A timeout too long to represent waits "forever" (a century).
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        loop {
            if let Some(idx) = self.ready.pop() {
                return Ok(Some(self.take_completion(idx)));
            }
            if let Some(idx) = self.drive_one() {
                return Ok(Some(self.take_completion(idx)));
            }
            if !self.alive_rate_limited() {
                self.fail_pending(Status::DpuDead);
                if !self.ready.is_empty() {
                    continue;
                }
                return Err(DdsError::dead("DPU is gone"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            self.sleep(deadline - now);
        }
    }

    /// Checks the lifeline at most every few milliseconds (a `poll` syscall).
    fn alive_rate_limited(&self) -> bool {
        if self.shared.is_dead() {
            return false;
        }
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        let last = self.last_alive_check_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < 5 {
            return true;
        }
        self.last_alive_check_ms.store(now_ms, Ordering::Relaxed);
        self.shared.check_alive()
    }

    /// Sleeps until the DPU's interrupt, the DPU's death, or `max` passes. Announces itself
    /// in the ring's `Waiters` word first, then re-checks the ring, so a delivery between the
    /// check and the sleep is never missed (the DPU reads `Waiters` after writing `Tail`).
    fn sleep(&self, max: Duration) {
        let waiters = self.consumer.waiters();
        waiters.fetch_add(1, Ordering::SeqCst);
        if self.consumer.is_empty() && self.ready.is_empty() {
            use rustix::event::{poll, PollFd, PollFlags, Timespec};
            let max = max.min(Duration::from_millis(500));
            let timeout = Timespec {
                tv_sec: max.as_secs() as i64,
                tv_nsec: max.subsec_nanos() as i64,
            };
            let lifeline = self.shared.lifeline_fd();
            let mut fds = [
                PollFd::new(&self.eventfd, PollFlags::IN),
                PollFd::new(&lifeline, PollFlags::empty()),
            ];
            if poll(&mut fds, Some(&timeout)).is_ok() {
                if fds[0].revents().contains(PollFlags::IN) {
                    let mut v = [0u8; 8];
                    let _ = rustix::io::read(&self.eventfd, &mut v);
                }
                if fds[1].revents().intersects(PollFlags::HUP | PollFlags::ERR) {
                    self.shared.mark_dead();
                }
            }
        }
        waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes PollWait sleepers of this group (after a blocking caller parked a completion
    /// for them in `ready`).
    fn wake_sleepers(&self) {
        let _ = rustix::io::write(&self.eventfd, &1u64.to_ne_bytes());
    }

    /// Waits for a blocking call's completion, driving the response ring meanwhile.
    pub(crate) fn wait(&self, w: &Waiter) -> Result<u32> {
        loop {
            if w.done.load(Ordering::Acquire) {
                let status = Status::from_code(w.status.load(Ordering::Relaxed));
                return match status {
                    Status::Ok => Ok(w.bytes.load(Ordering::Relaxed)),
                    s => Err(DdsError::new(s, "operation failed")),
                };
            }
            match self.driver.try_lock() {
                Ok(_guard) => {
                    let mut parked = false;
                    while let Some(idx) = self.drive_one() {
                        // A completion for a PollWait caller: park it in `ready`.
                        self.slots[idx as usize]
                            .state
                            .store(READY, Ordering::Release);
                        self.ready.push(idx).expect("ready queue sized to slots");
                        parked = true;
                    }
                    if parked {
                        self.wake_sleepers();
                    }
                    if w.done.load(Ordering::Acquire) {
                        continue;
                    }
                    if !self.alive_rate_limited() {
                        self.fail_pending(Status::DpuDead);
                        continue;
                    }
                    self.sleep(Duration::from_millis(10));
                }
                Err(_) => std::thread::park_timeout(Duration::from_millis(1)),
            }
        }
    }

    /// Completes every in-flight operation with `status` (the DPU is gone).
    pub(crate) fn fail_pending(&self, status: Status) {
        let mut parked = false;
        for (i, slot) in self.slots.iter().enumerate() {
            if slot
                .state
                .compare_exchange(ISSUED, COMPLETING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                if let Some(idx) = self.finish(i as u16, status, 0) {
                    slot.state.store(READY, Ordering::Release);
                    self.ready.push(idx).expect("ready queue sized to slots");
                    parked = true;
                }
            }
        }
        if parked {
            self.wake_sleepers();
        }
    }
}
