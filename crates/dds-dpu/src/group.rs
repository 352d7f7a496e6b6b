//! One notification group on the DPU: mirrors of the host's two rings, the in-order list of
//! outstanding requests, and zero-copy execution with TailA/TailB/TailC (§4.3, Fig. 10).
//!
//! Positions are running byte counts of the rings (as in `docs/ring-format.md`):
//! - request ring: `released` ≤ `dispatched` ≤ `fetched` (Head ≤ … ≤ Tail of the host ring);
//! - response ring: TailC (`resp.delivered()`) ≤ TailB (`tail_b`) ≤ TailA (`resp.allocated()`).
//!
//! A request's record stays in the request mirror until its response is buffered (TailB
//! passed it): write data is handed to the device in place, so Head is advanced only then.
//!
//! DMA is asynchronous: the group posts its operations into the service's engine, stamped with
//! their user data (the group's slot, what the operation is for, and for registered I/O the
//! request), and the service hands each completion back to [`GroupState::on_dma`]. Nothing
//! waits for a DMA: a ring step whose operations are in flight is simply not posted again, and
//! the group's buffers are freed only once it has no operation in flight
//! ([`GroupState::quiescent`]).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};

use dds_dma::{has_room, DmaEngine, DmaError, DmaOp, LocalBuf, Region, RegionId};
use dds_fs::{FileId, FileService, FsError};
use dds_offload_engine::CacheMaintainer;
use dds_proto::record::{
    self, Op, RecordError, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use dds_proto::Status;
use dds_ring::{RequestConsumer, ResponseProducer, RingFault};

use crate::ExecMode;

/// What a DMA operation of a group is for (bits 28..32 of its user data).
const TAG_FETCH: u64 = 1;
const TAG_RELEASE: u64 = 2;
const TAG_SLEEPING: u64 = 3;
const TAG_REFRESH: u64 = 4;
const TAG_DELIVER: u64 = 5;
/// A registered-buffer transfer; the low 28 bits hold the request's sequence number.
const TAG_REGISTERED: u64 = 6;
const SEQ_BITS: u32 = 28;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// Outstanding requests per group at most, so that 28 bits of sequence number identify one.
pub(crate) const MAX_PENDING: usize = 1 << (SEQ_BITS - 1);

/// User data of a group's DMA operation: `user_base` (the group's slot in bits 32..), `tag`,
/// and the low bits of `seq`.
fn dma_user(user_base: u64, tag: u64, seq: u64) -> u64 {
    user_base | (tag << SEQ_BITS) | (seq & SEQ_MASK)
}

/// One outstanding request, in request order.
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    /// Request-ring position just past the record.
    req_end: u64,
    /// Response-ring position of the response header.
    resp_at: u64,
    /// Response-ring position just past the response record.
    resp_end: u64,
    /// Bytes of the read slot (0 for writes and flushes).
    read_len: u32,
    done: bool,
    /// For cache-on-write at completion: a WRITE's file, offset, data position in the request
    /// mirror, length and cache version.
    write: Option<WriteInfo>,
    /// A `REGISTERED` READ or WRITE: its buffer and its place in the staging area.
    reg: Option<RegIo>,
    /// Staging-area position just past this request's staging space (or the allocation
    /// position at its dispatch, without any).
    stage_end: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct WriteInfo {
    file_id: u32,
    offset: u64,
    /// Position of the data in the request mirror, or in the staging area (`staged`).
    data_pos: u64,
    staged: bool,
    len: u32,
    version: u64,
}

/// The registered-buffer side of a `REGISTERED` request.
#[derive(Clone, Copy, Debug)]
struct RegIo {
    read: bool,
    region: RegionId,
    buf_offset: u64,
    /// Staging-area position of the data.
    stage_pos: u64,
    /// A write's file range (submitted once its data is fetched from the buffer).
    file_id: u32,
    file_offset: u64,
    /// Bytes to move by DMA: a write's length; a read's bytes read, once known.
    bytes: u32,
}

/// One application buffer registered by a host connection (`register_buffer`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RegBuf {
    pub region: RegionId,
    pub len: u64,
}

/// The buffers a host connection registered, by id.
#[derive(Debug, Default)]
pub(crate) struct ConnBuffers {
    pub map: HashMap<u32, RegBuf>,
    pub bytes: u64,
}

/// DPU-side staging of registered I/O: a byte ring the file service reads into and writes
/// from, allocated in request order and freed as responses are buffered.
struct Staging {
    buf: LocalBuf,
    cap: u64,
    alloc: u64,
    free: u64,
}

/// Buffers of the copy mode: device I/O goes through them, with a copy on each side.
struct CopyBuffers {
    /// Write data is copied here (same offsets as the request ring) before submission.
    write_stage: LocalBuf,
    /// Read data lands here (same offsets as the response ring), then is copied to the slot.
    read_stage: LocalBuf,
}

pub(crate) struct GroupState {
    pub id: u32,
    pub conn: u64,
    pub region: RegionId,
    eventfd: OwnedFd,
    /// The host's doorbell: readable when it published a request while we were parked.
    pub doorbell: OwnedFd,
    req: RequestConsumer,
    resp: ResponseProducer,
    req_capacity: u64,
    resp_capacity: u64,
    dispatched: u64,
    tail_b: u64,
    /// Fixed-capacity FIFO of outstanding requests, indexed by sequence number.
    pending: Box<[Pending]>,
    pending_head: u64,
    pending_tail: u64,
    /// Requests submitted to the file service and not completed.
    io_outstanding: usize,
    payload_align: u32,
    max_io_bytes: u32,
    copy: Option<CopyBuffers>,
    /// Staging of registered I/O; allocated once the connection registers a buffer.
    staging: Option<Staging>,
    /// Registered-buffer transfers to post (request sequence numbers; a write's fetch or a
    /// read's delivery), at most one per outstanding request.
    reg_queue: VecDeque<u64>,
    /// Registered writes whose data is fetched, waiting for room in the file service.
    reg_ready: VecDeque<u64>,
    /// Registered-buffer transfers posted and not completed.
    reg_inflight: usize,
    /// Registered writes not yet handed to the file service (queued, fetching or ready): each
    /// will need a file-service slot.
    reg_writes_unsubmitted: usize,
    /// No new requests are taken (deleted group or disconnected host).
    pub closing: bool,
    /// The ring framing was corrupt: the group is stopped.
    pub broken: bool,
    /// Bases of the `io_memory` ranges registered with the device.
    pub registered: Vec<*mut u8>,
    pub memory_bytes: u64,
    /// Counters for `dds stats`.
    pub counters: GroupCounters,
}

/// Counters of a group (`dds stats`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GroupCounters {
    pub requests: u64,
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// What `dispatch` stopped on.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// All fetched records are dispatched.
    Drained,
    /// Backpressure: response ring full, pending list full, file service busy, or a flush
    /// waiting for earlier I/O.
    Blocked,
}

pub(crate) struct GroupParams {
    pub id: u32,
    pub conn: u64,
    pub region: Region,
    pub eventfd: OwnedFd,
    pub doorbell: OwnedFd,
    pub req_offset: u64,
    pub req_capacity: u64,
    pub resp_offset: u64,
    pub resp_capacity: u64,
    pub max_pending: usize,
    pub payload_align: u32,
    pub max_io_bytes: u32,
    pub mode: ExecMode,
}

/// Bytes of DPU memory a group with these ring sizes needs.
pub(crate) fn group_memory(req_capacity: u64, resp_capacity: u64, mode: ExecMode) -> u64 {
    let mirrors = req_capacity + resp_capacity;
    match mode {
        ExecMode::ZeroCopy => mirrors,
        ExecMode::Copy => 2 * mirrors,
    }
}

impl GroupState {
    /// A group over the rings of a registered region. Errors: `Layout` when a ring does not
    /// fit the region.
    pub fn new(p: GroupParams) -> Result<GroupState, RingFault> {
        assert!((1..=MAX_PENDING).contains(&p.max_pending));
        let req = RequestConsumer::new(p.region, p.req_offset, p.req_capacity)?;
        let resp = ResponseProducer::new(p.region, p.resp_offset, p.resp_capacity)?;
        let copy = match p.mode {
            ExecMode::ZeroCopy => None,
            ExecMode::Copy => Some(CopyBuffers {
                write_stage: LocalBuf::new(p.req_capacity as usize, 4096),
                read_stage: LocalBuf::new(p.resp_capacity as usize, 4096),
            }),
        };
        Ok(GroupState {
            id: p.id,
            conn: p.conn,
            region: p.region.id,
            eventfd: p.eventfd,
            doorbell: p.doorbell,
            req,
            resp,
            req_capacity: p.req_capacity,
            resp_capacity: p.resp_capacity,
            dispatched: 0,
            tail_b: 0,
            pending: vec![Pending::default(); p.max_pending].into_boxed_slice(),
            pending_head: 0,
            pending_tail: 0,
            io_outstanding: 0,
            payload_align: p.payload_align,
            max_io_bytes: p.max_io_bytes,
            copy,
            staging: None,
            reg_queue: VecDeque::with_capacity(p.max_pending),
            reg_ready: VecDeque::with_capacity(p.max_pending),
            reg_inflight: 0,
            reg_writes_unsubmitted: 0,
            closing: false,
            broken: false,
            registered: Vec::new(),
            memory_bytes: group_memory(p.req_capacity, p.resp_capacity, p.mode),
            counters: GroupCounters::default(),
        })
    }

    /// The group's memory that device reads and writes target: the two ring mirrors, the
    /// copy mode's stages and the staging area of registered I/O, as (base, length). The file
    /// service registers it with the device (`FileService::register_memory`).
    pub fn io_memory(&self) -> Vec<(*mut u8, usize)> {
        let mut m = vec![
            (self.req.mirror_ptr(), self.req_capacity as usize),
            (self.resp.mirror_ptr(), self.resp_capacity as usize),
        ];
        if let Some(c) = &self.copy {
            m.push((c.write_stage.as_mut_ptr(), c.write_stage.len()));
            m.push((c.read_stage.as_mut_ptr(), c.read_stage.len()));
        }
        if let Some(st) = &self.staging {
            m.push((st.buf.as_mut_ptr(), st.buf.len()));
        }
        m
    }

    /// Bytes of the staging area of registered I/O (the larger ring's capacity).
    pub fn staging_bytes(&self) -> u64 {
        self.req_capacity.max(self.resp_capacity)
    }

    pub fn has_staging(&self) -> bool {
        self.staging.is_some()
    }

    /// Allocates the staging area of registered I/O (once), adding it to `memory_bytes`.
    pub fn add_staging(&mut self) {
        if self.staging.is_none() {
            let cap = self.staging_bytes();
            self.staging = Some(Staging {
                buf: LocalBuf::new(cap as usize, 4096),
                cap,
                alloc: 0,
                free: 0,
            });
            self.memory_bytes += cap;
        }
    }

    /// Where `n` bytes of staging would go (not yet allocated): `Err(true)` when they can
    /// never fit, `Err(false)` when the area is full now.
    fn stage_place(&self, n: u64) -> Result<u64, bool> {
        let Some(st) = &self.staging else {
            return Err(true);
        };
        if n > st.cap {
            return Err(true);
        }
        let mut at = st.alloc.next_multiple_of(u64::from(self.payload_align));
        if at % st.cap + n > st.cap {
            at = at.next_multiple_of(st.cap);
        }
        if at + n - st.free > st.cap {
            return Err(false);
        }
        Ok(at)
    }

    fn stage_ptr(&self, pos: u64) -> *mut u8 {
        let st = self.staging.as_ref().expect("registered I/O has staging");
        // SAFETY: the offset is reduced modulo the buffer's capacity.
        unsafe { st.buf.as_ptr().cast_mut().add((pos % st.cap) as usize) }
    }

    /// True when no I/O of this group is in the file service and no DMA operation of it is
    /// queued or in flight (its buffers may be freed).
    pub fn quiescent(&self) -> bool {
        self.io_outstanding == 0 && self.dma_inflight() == 0 && self.reg_queue.is_empty()
    }

    /// DMA operations of this group posted and not completed.
    pub fn dma_inflight(&self) -> usize {
        self.req.dma_inflight() + self.resp.dma_inflight() + self.reg_inflight
    }

    /// Registered writes that will need a file-service slot (their data is being fetched).
    pub fn reg_writes_unsubmitted(&self) -> usize {
        self.reg_writes_unsubmitted
    }

    /// Whether fetched request bytes wait for the next steps (new bytes found by the last
    /// pointer read, or records not dispatched yet).
    pub fn has_fetched_work(&self) -> bool {
        self.req.fetching() || self.dispatched < self.req.fetched()
    }

    fn pending_full(&self) -> bool {
        (self.pending_tail - self.pending_head) as usize == self.pending.len()
    }

    fn pending_at(&mut self, seq: u64) -> &mut Pending {
        let n = self.pending.len() as u64;
        &mut self.pending[(seq % n) as usize]
    }

    /// Pointer into the response mirror at ring position `pos`.
    fn resp_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: the offset is reduced modulo the mirror's capacity.
        unsafe {
            self.resp
                .mirror_ptr()
                .add((pos % self.resp_capacity) as usize)
        }
    }

    fn req_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: as above, for the request mirror.
        unsafe {
            self.req
                .mirror_ptr()
                .add((pos % self.req_capacity) as usize)
        }
    }

    /// Sets or clears the request ring's `Sleeping` word (parking, `crate::bell`): posts its
    /// write (or leaves it for a later [`advance`](Self::advance) if the engine is full).
    pub fn set_sleeping(
        &mut self,
        on: bool,
        dma: &mut dyn DmaEngine,
        user_base: u64,
    ) -> Result<(), RingFault> {
        self.req.want_sleeping(on);
        self.req
            .post_sleeping(dma, dma_user(user_base, TAG_SLEEPING, 0))?;
        Ok(())
    }

    /// Posts the next step of fetching new request records from the host ring (a DMA read of
    /// Progress+Tail, or of the new bytes it announced). Returns the operations posted.
    pub fn post_fetch(
        &mut self,
        dma: &mut dyn DmaEngine,
        user_base: u64,
    ) -> Result<usize, RingFault> {
        if self.closing || self.broken {
            return Ok(0);
        }
        self.req.post_fetch(dma, dma_user(user_base, TAG_FETCH, 0))
    }

    /// The completion of one of this group's DMA operations (`user_data` as posted). Returns
    /// true when it moved anything (new request bytes, a delivery, a registered transfer).
    /// `Err` is a ring fault: the caller stops the group.
    pub fn on_dma(
        &mut self,
        user_data: u64,
        result: Result<(), DmaError>,
        fs: &mut FileService,
    ) -> Result<bool, RingFault> {
        match (user_data >> SEQ_BITS) & 0xF {
            TAG_FETCH => self.req.complete_fetch(result),
            TAG_RELEASE => self.req.complete_release(result).map(|()| false),
            TAG_SLEEPING => self.req.complete_sleeping(result).map(|()| false),
            TAG_REFRESH => self.resp.complete_refresh(result).map(|_| false),
            TAG_DELIVER => match self.resp.complete_deliver(result)? {
                Some(sleepers) => {
                    if sleepers {
                        // The "interrupt": wake host threads sleeping in PollWait. Never
                        // blocks: a host's eventfd whose counter it filled up is skipped
                        // (`bell::notify`).
                        crate::bell::notify(self.eventfd.as_fd());
                    }
                    Ok(true)
                }
                None => Ok(false),
            },
            TAG_REGISTERED => self.on_registered_dma(user_data, result, fs),
            _ => Err(RingFault::Corrupt("DMA completion of an unknown kind")),
        }
    }

    /// The completion of a registered-buffer transfer: a write's data is fetched (hand the
    /// write to the file service), or a read's data is in the buffer (answer).
    fn on_registered_dma(
        &mut self,
        user_data: u64,
        result: Result<(), DmaError>,
        fs: &mut FileService,
    ) -> Result<bool, RingFault> {
        self.reg_inflight = self.reg_inflight.checked_sub(1).ok_or(RingFault::Corrupt(
            "registered DMA completion without a transfer",
        ))?;
        let low = user_data & SEQ_MASK;
        // The full sequence number lies within `pending.len()` (< 2^27) of the head.
        let seq = self.pending_head + (low.wrapping_sub(self.pending_head) & SEQ_MASK);
        let p = match (seq < self.pending_tail).then(|| *self.pending_at(seq)) {
            Some(p) if !p.done => p,
            _ => {
                return Err(RingFault::Corrupt(
                    "registered DMA completion for no request",
                ))
            }
        };
        let Some(r) = p.reg else {
            return Err(RingFault::Corrupt(
                "registered DMA completion for no request",
            ));
        };
        if let Err(e) = result {
            // The buffer was unregistered (or its connection closed) meanwhile.
            tracing::debug!(group = self.id, read = r.read, "registered transfer: {e}");
            if !r.read {
                self.reg_writes_unsubmitted -= 1;
                self.io_outstanding -= 1;
            }
            self.complete_seq(seq, Status::UnknownBuffer, 0);
            return Ok(true);
        }
        if r.read {
            self.complete_seq(seq, Status::Ok, r.bytes);
        } else {
            self.reg_ready.push_back(seq);
            self.submit_ready_writes(fs, user_data & !0xFFFF_FFFF);
        }
        Ok(true)
    }

    /// Hands registered writes whose data is fetched to the file service, in order, while it
    /// has room.
    fn submit_ready_writes(&mut self, fs: &mut FileService, user_base: u64) {
        while let Some(&seq) = self.reg_ready.front() {
            let r = self.pending_at(seq).reg.expect("a registered write");
            let stage = self.stage_ptr(r.stage_pos);
            let user = user_base | (seq & 0xFFFF_FFFF);
            // SAFETY: the staging space stays allocated until the response is buffered.
            let res =
                unsafe { fs.submit_write(FileId(r.file_id), r.file_offset, stage, r.bytes, user) };
            match res {
                Err(FsError::Busy) => break,
                Ok(()) => {}
                Err(e) => {
                    self.io_outstanding -= 1;
                    self.complete_seq(seq, Status::from(&e), 0);
                }
            }
            self.reg_ready.pop_front();
            self.reg_writes_unsubmitted -= 1;
        }
    }

    /// Posts the queued registered-buffer transfers the engine has room for.
    fn post_registered(&mut self, dma: &mut dyn DmaEngine, user_base: u64) {
        while let Some(&seq) = self.reg_queue.front() {
            if !has_room(dma, 1) {
                break;
            }
            let r = self.pending_at(seq).reg.expect("a registered request");
            let stage = self.stage_ptr(r.stage_pos);
            let user = dma_user(user_base, TAG_REGISTERED, seq);
            let op = match r.read {
                // The device read into staging: put it into the buffer.
                true => DmaOp::write(r.region, r.buf_offset, stage, r.bytes, user),
                // Fetch the write's data from the buffer into staging.
                false => DmaOp::read(r.region, r.buf_offset, stage, r.bytes, user),
            };
            self.reg_queue.pop_front();
            // SAFETY: the staging space is this request's until its response is buffered,
            // which waits for the transfer's completion; nothing else touches it meanwhile.
            match unsafe { dma.post(op) } {
                Ok(()) => self.reg_inflight += 1,
                Err(e) => {
                    // For example the buffer's region is gone: the request fails, the group
                    // carries on.
                    tracing::debug!(group = self.id, "registered transfer: {e}");
                    if !r.read {
                        self.reg_writes_unsubmitted -= 1;
                        self.io_outstanding -= 1;
                    }
                    self.complete_seq(seq, Status::UnknownBuffer, 0);
                }
            }
        }
    }

    /// Parses fetched records and starts their execution, in order, until blocked.
    /// `user_base` is or-ed into the file service's user data (the group's index).
    pub fn dispatch(
        &mut self,
        fs: &mut FileService,
        dma: &mut dyn DmaEngine,
        user_base: u64,
        fs_inflight_max: usize,
        buffers: Option<&ConnBuffers>,
        mut hooks: Option<&mut CacheMaintainer>,
    ) -> Result<Dispatch, RingFault> {
        // Registered writes fetched earlier go first: they hold their place in the file
        // service's queue (`fs_inflight_max` accounts for them).
        self.submit_ready_writes(fs, user_base);
        while self.dispatched < self.req.fetched() && !self.broken {
            let pos = self.dispatched;
            let in_ring = (pos % self.req_capacity) as usize;
            let avail = (self.req.fetched() - pos).min(self.req_capacity - in_ring as u64) as usize;
            // SAFETY: [pos, fetched) was DMA-read into the mirror and is not released; the
            // record never crosses the end of the ring (ring framing).
            let rec = unsafe { std::slice::from_raw_parts(self.req_ptr(pos), avail) };
            if avail < 8 {
                self.break_group("record header beyond fetched bytes");
                break;
            }
            let len = u32::from_le_bytes(rec[0..4].try_into().expect("4 bytes")) as u64;
            let kind = u16::from_le_bytes([rec[4], rec[5]]);
            if len < 8 || !len.is_multiple_of(8) || len > avail as u64 {
                self.break_group("record length out of bounds");
                break;
            }
            if kind == 0 {
                // PAD: nothing to execute; it is released with the next record.
                self.dispatched += len;
                if self.pending_head == self.pending_tail {
                    // Nothing outstanding before it: release right away.
                    self.req.release_to(pos + len);
                }
                continue;
            }
            if self.pending_full() {
                return Ok(Dispatch::Blocked);
            }
            let header = match record::decode_request(&rec[..len as usize]) {
                Ok(h) => Ok(h),
                Err(RecordError::Framing) => {
                    self.break_group("request record framing");
                    break;
                }
                Err(RecordError::Malformed { request_id }) => Err(request_id),
            };
            // Response slot size: reads get the requested size, everything else a header.
            let (op_code, request_id, read_len, early) = match header {
                Err(request_id) => (kind, request_id, 0, Some(Status::BadRequest)),
                Ok(h) if h.op == Op::Read && h.bytes > self.max_io_bytes => {
                    (kind, h.request_id, 0, Some(Status::TooLarge))
                }
                Ok(h) if h.op == Op::Write && h.bytes > self.max_io_bytes => {
                    (kind, h.request_id, 0, Some(Status::TooLarge))
                }
                // Cache-table records are applied here, by the cache's single writer.
                Ok(h) if matches!(h.op, Op::Cache | Op::Invalidate) => {
                    let status = match hooks.as_deref_mut() {
                        None => Status::InvalidArgument,
                        Some(m) => {
                            let data =
                                &rec[REQUEST_HEADER_BYTES..REQUEST_HEADER_BYTES + h.bytes as usize];
                            match m.apply_record(h.op.code(), data) {
                                Ok(_) => Status::Ok,
                                Err(_) => Status::BadRequest,
                            }
                        }
                    };
                    (kind, h.request_id, 0, Some(status))
                }
                Ok(h) => (
                    h.op.code(),
                    h.request_id,
                    if h.op == Op::Read && h.buffer.is_none() {
                        h.bytes
                    } else {
                        0
                    },
                    None,
                ),
            };
            if early.is_none() {
                if let Ok(h) = header {
                    if h.op == Op::Flush && self.io_outstanding > 0 {
                        // A flush covers every earlier write: wait for them to complete.
                        return Ok(Dispatch::Blocked);
                    }
                    if matches!(h.op, Op::Read | Op::Write) && fs.is_fenced(FileId(h.file_id)) {
                        // A delete or shrink of this file waits for its I/O: hold this request
                        // (and the ring behind it) until that change is done.
                        return Ok(Dispatch::Blocked);
                    }
                }
                if fs.inflight() >= fs_inflight_max {
                    return Ok(Dispatch::Blocked);
                }
            }
            // A registered READ or WRITE: its buffer, range and staging space.
            let mut reg = None;
            let early = match (early, header) {
                (None, Ok(h)) => match h.buffer {
                    None => None,
                    Some(b) => match buffers.and_then(|m| m.map.get(&b.id)) {
                        None => Some(Status::UnknownBuffer),
                        Some(rb)
                            if b.offset
                                .checked_add(u64::from(h.bytes))
                                .is_none_or(|end| end > rb.len) =>
                        {
                            Some(Status::BufferRange)
                        }
                        Some(rb) => match self.stage_place(u64::from(h.bytes)) {
                            Err(true) => Some(Status::TooLarge),
                            Err(false) => return Ok(Dispatch::Blocked),
                            Ok(at) => {
                                reg = Some(RegIo {
                                    read: h.op == Op::Read,
                                    region: rb.region,
                                    buf_offset: b.offset,
                                    stage_pos: at,
                                    file_id: h.file_id,
                                    file_offset: h.offset,
                                    bytes: h.bytes,
                                });
                                None
                            }
                        },
                    },
                },
                (e, _) => e,
            };
            let align = if read_len > 0 { self.payload_align } else { 8 };
            // A read slot that can never fit the response ring gets TooLarge, not a slot.
            let (read_len, early) = if early.is_none()
                && !dds_ring::fits(
                    self.resp_capacity,
                    RESPONSE_HEADER_BYTES as u32,
                    read_len,
                    align,
                ) {
                (0, Some(Status::TooLarge))
            } else {
                (read_len, early)
            };
            let Some(place) =
                self.resp
                    .try_alloc(op_code, RESPONSE_HEADER_BYTES as u32, read_len, align)?
            else {
                // Response ring full as far as we know: learn how far the host consumed (the
                // read completes in a later round) and wait.
                self.resp
                    .post_refresh(dma, dma_user(user_base, TAG_REFRESH, 0))?;
                return Ok(Dispatch::Blocked);
            };
            let resp_at = place.header_at;
            let resp_end = place.end;
            let resp_len = (resp_end - resp_at) as u32;
            debug_assert_eq!(resp_len, record::response_len(read_len));
            // SAFETY: the slot [resp_at, resp_end) was just allocated in the mirror.
            let slot = unsafe {
                std::slice::from_raw_parts_mut(self.resp_ptr(resp_at), resp_len as usize)
            };
            record::encode_response(
                resp_len,
                &ResponseHeader {
                    kind: op_code,
                    status: Status::PENDING,
                    request_id,
                    bytes: 0,
                },
                slot,
            );
            if let (Some(r), Ok(h), Some(st)) = (reg, header, self.staging.as_mut()) {
                st.alloc = r.stage_pos + u64::from(h.bytes);
            }
            let stage_end = self.staging.as_ref().map_or(0, |st| st.alloc);
            let seq = self.pending_tail;
            self.pending_tail += 1;
            *self.pending_at(seq) = Pending {
                req_end: pos + len,
                resp_at,
                resp_end,
                read_len,
                done: false,
                write: None,
                reg,
                stage_end,
            };
            self.dispatched = pos + len;
            if let (None, Ok(h), Some(m)) = (early, header, hooks.as_deref_mut()) {
                match h.op {
                    // Invalidate-on-read: the host is reading these objects.
                    Op::Read => m.host_read(h.file_id, h.offset, h.bytes),
                    // The write's cache version is taken at submission (docs/consistency.md).
                    Op::Write => {
                        self.pending_at(seq).write = Some(WriteInfo {
                            file_id: h.file_id,
                            offset: h.offset,
                            data_pos: match reg {
                                Some(r) => r.stage_pos,
                                None => pos + REQUEST_HEADER_BYTES as u64,
                            },
                            staged: reg.is_some(),
                            len: h.bytes,
                            version: m.next_version(),
                        })
                    }
                    _ => {}
                }
            }
            let user = user_base | (seq & 0xFFFF_FFFF);
            let submitted = match (early, header) {
                (Some(status), _) => Err(status),
                (None, Ok(h)) => self.submit(fs, &h, reg, seq, pos, resp_at, user),
                (None, Err(_)) => unreachable!("malformed requests have an early status"),
            };
            match submitted {
                Ok(()) => self.io_outstanding += 1,
                Err(status) => self.complete_seq(seq, status, 0),
            }
        }
        Ok(Dispatch::Drained)
    }

    /// Submits one request's I/O to the file service.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &mut self,
        fs: &mut FileService,
        h: &record::RequestHeader,
        reg: Option<RegIo>,
        seq: u64,
        req_pos: u64,
        resp_at: u64,
        user: u64,
    ) -> Result<(), Status> {
        if let Some(r) = reg {
            let stage = self.stage_ptr(r.stage_pos);
            let res = if r.read {
                // The device reads into staging; `on_complete` DMAs it into the buffer.
                // SAFETY: the staging space stays allocated until the response is buffered.
                unsafe { fs.submit_read(FileId(h.file_id), h.offset, stage, h.bytes, user) }
            } else if h.bytes > 0 {
                // Fetch the data from the registered buffer by DMA (posted with the group's
                // next operations); the write goes to the file service when it completes.
                self.reg_queue.push_back(seq);
                self.reg_writes_unsubmitted += 1;
                Ok(())
            } else {
                // SAFETY: as above (nothing to read).
                unsafe { fs.submit_write(FileId(h.file_id), h.offset, stage, h.bytes, user) }
            };
            return res.map_err(|e| Status::from(&e));
        }
        let r = match h.op {
            Op::Read => {
                let slot_data = resp_at + RESPONSE_HEADER_BYTES as u64;
                let dst = match &self.copy {
                    // Zero copy: the device writes straight into the response slot.
                    None => self.resp_ptr(slot_data),
                    // Copy mode: into the staging buffer; copied to the slot on completion.
                    Some(c) => unsafe {
                        c.read_stage
                            .as_ptr()
                            .cast_mut()
                            .add((slot_data % self.resp_capacity) as usize)
                    },
                };
                // SAFETY: the slot stays allocated (undelivered) until this request completes.
                unsafe { fs.submit_read(FileId(h.file_id), h.offset, dst, h.bytes, user) }
            }
            Op::Write => {
                let data_pos = req_pos + REQUEST_HEADER_BYTES as u64;
                let src = self.req_ptr(data_pos);
                let src = match &mut self.copy {
                    // Zero copy: the device reads the data in place in the request mirror.
                    None => src as *const u8,
                    // Copy mode: the extra request copy of the baseline design.
                    Some(c) => unsafe {
                        let dst = c
                            .write_stage
                            .as_mut_ptr()
                            .add((data_pos % self.req_capacity) as usize);
                        std::ptr::copy_nonoverlapping(src, dst, h.bytes as usize);
                        dst as *const u8
                    },
                };
                // SAFETY: the record is not released until this request completes.
                unsafe { fs.submit_write(FileId(h.file_id), h.offset, src, h.bytes, user) }
            }
            Op::Flush => fs.submit_flush(user),
            Op::Cache | Op::Invalidate => unreachable!("answered at dispatch"),
        };
        r.map_err(|e| Status::from(&e))
    }

    /// A file-service completion for this group.
    pub fn on_complete(
        &mut self,
        user: u64,
        result: Result<u32, FsError>,
        hooks: Option<&mut CacheMaintainer>,
    ) {
        assert!(
            self.io_outstanding > 0,
            "completion without outstanding I/O"
        );
        self.io_outstanding -= 1;
        let low = user & 0xFFFF_FFFF;
        // Recover the full sequence number: it lies within `pending.len()` of the head.
        let seq =
            self.pending_head + (low.wrapping_sub(self.pending_head & 0xFFFF_FFFF) & 0xFFFF_FFFF);
        assert!(seq < self.pending_tail, "completion for an unknown request");
        if let (Some(w), Some(m)) = (self.pending_at(seq).write, hooks) {
            let at = match w.staged {
                true => self.stage_ptr(w.data_pos),
                false => self.req_ptr(w.data_pos),
            };
            // SAFETY: the write's record (or staging space) is not released before its
            // response is buffered.
            let data = unsafe { std::slice::from_raw_parts(at, w.len as usize) };
            // Cache-on-write runs before the response can be delivered (advance runs later).
            match result {
                Ok(_) => m.write_completed(w.file_id, w.offset, data, w.version),
                Err(_) => m.write_failed(w.file_id, w.offset, data, w.version),
            }
        }
        match (result, self.pending_at(seq).reg) {
            (Ok(bytes), Some(r)) if r.read && bytes > 0 => {
                // Put the data read into the registered buffer (posted with the group's next
                // operations), then answer when that completes (`on_dma`).
                let bytes = bytes.min(r.bytes);
                self.pending_at(seq).reg = Some(RegIo { bytes, ..r });
                self.reg_queue.push_back(seq);
            }
            (Ok(bytes), _) => self.complete_seq(seq, Status::Ok, bytes),
            (Err(e), _) => self.complete_seq(seq, Status::from(&e), 0),
        }
    }

    fn complete_seq(&mut self, seq: u64, status: Status, bytes: u32) {
        let p = *self.pending_at(seq);
        assert!(!p.done, "request completed twice");
        let bytes = if status == Status::Ok { bytes } else { 0 };
        if let (Some(c), true) = (&self.copy, p.read_len > 0 && bytes > 0) {
            // Copy mode: the extra response copy of the baseline design.
            let data = p.resp_at + RESPONSE_HEADER_BYTES as u64;
            let off = (data % self.resp_capacity) as usize;
            // SAFETY: both ranges are inside their buffers (the slot never wraps).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    c.read_stage.as_ptr().add(off),
                    self.resp_ptr(data),
                    bytes as usize,
                )
            };
        }
        let len = (p.resp_end - p.resp_at) as usize;
        // SAFETY: the slot is allocated and not yet delivered.
        let slot = unsafe { std::slice::from_raw_parts_mut(self.resp_ptr(p.resp_at), len) };
        record::complete_response(slot, status, bytes);
        self.pending_at(seq).done = true;
        let c = &mut self.counters;
        c.requests += 1;
        if status != Status::Ok {
            c.errors += 1;
        } else if p.read_len > 0 || p.reg.is_some_and(|r| r.read) {
            c.bytes_read += u64::from(bytes);
        } else {
            c.bytes_written += u64::from(bytes);
        }
    }

    /// Advances TailB over completed responses, posts the delivery of buffered responses to
    /// the host (DMA writes of the data and of Tail, then a read of Waiters; its completion
    /// signals sleepers, `on_dma`) when a batch is full or `flush`, posts the release of
    /// request-ring space, pending registered-buffer transfers and the `Sleeping` word.
    /// Returns true when it moved anything.
    pub fn advance(
        &mut self,
        dma: &mut dyn DmaEngine,
        user_base: u64,
        batch_bytes: u64,
        flush: bool,
    ) -> Result<bool, RingFault> {
        let mut release = None;
        while self.pending_head < self.pending_tail {
            let p = *self.pending_at(self.pending_head);
            if !p.done {
                break;
            }
            self.tail_b = p.resp_end;
            release = Some(p.req_end);
            if let Some(st) = self.staging.as_mut() {
                st.free = st.free.max(p.stage_end);
            }
            self.pending_head += 1;
        }
        let mut moved = release.is_some();
        let buffered = self.tail_b - self.resp.delivering();
        if buffered > 0 && (flush || buffered >= batch_bytes) {
            // Nothing is posted while a delivery is in flight: these go with the next one.
            moved |=
                self.resp
                    .post_deliver(self.tail_b, dma, dma_user(user_base, TAG_DELIVER, 0))?
                    > 0;
        }
        if let Some(upto) = release {
            // Only records whose responses are buffered are released; with nothing pending,
            // trailing PAD records go too.
            let upto = if self.pending_head == self.pending_tail {
                self.dispatched.max(upto)
            } else {
                upto
            };
            self.req.release_to(upto);
        }
        self.req
            .post_release(dma, dma_user(user_base, TAG_RELEASE, 0))?;
        self.req
            .post_sleeping(dma, dma_user(user_base, TAG_SLEEPING, 0))?;
        self.post_registered(dma, user_base);
        Ok(moved)
    }

    /// Requests dispatched and not yet completed.
    pub fn outstanding(&self) -> u64 {
        self.pending_tail - self.pending_head
    }

    /// A ring fault (corrupt host pointers, vanished region): stop serving this group; the
    /// DPU and every other group carry on.
    pub fn fail(&mut self, e: &RingFault) {
        self.break_group(&e.to_string());
    }

    fn break_group(&mut self, why: &str) {
        if self.broken {
            return;
        }
        tracing::error!(
            group = self.id,
            conn = self.conn,
            "request ring corrupt ({why}); group stopped"
        );
        self.broken = true;
    }
}
