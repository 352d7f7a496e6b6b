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
//!
//! Here: the group's state, its set-up, the ring steps (fetch, release, sleeping flag,
//! delivery) and DMA completions. Requests through the file service (dispatch, submission,
//! completion) are `group/dispatch.rs`; registered-buffer I/O and its staging ring are
//! `group/registered.rs`.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};

use dds_dma::{DmaEngine, DmaError, LocalBuf, Region, RegionId};
use dds_fs::FileService;
use dds_ring::{RequestConsumer, ResponseProducer, RingFault};

use crate::ExecMode;

mod dispatch;
mod registered;

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
    /// The last dispatch stopped on what only a file-service completion ends
    /// ([`Dispatch::WaitingForDevice`]).
    waits_for_device: bool,
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
    /// Backpressure: response ring full, pending list full, staging space or a fenced file.
    Blocked,
    /// Backpressure that only a file-service completion ends: the file service's queue is
    /// full, or a flush waits for earlier writes. Not progress: the service thread waits for
    /// the device instead of polling the rings round after round.
    WaitingForDevice,
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
            waits_for_device: false,
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
    /// pointer read, or records not dispatched yet that do not wait for the file service).
    pub fn has_fetched_work(&self) -> bool {
        self.req.fetching() || (self.dispatched < self.req.fetched() && !self.waits_for_device)
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
