//! The asynchronous data path: reads, writes and flushes translated through each file's own
//! segment vector into device operations.
//!
//! Every accepted operation occupies one op slot from submit until `poll` reports it. All
//! memory (slots, queues, bounce buffers, completion array) is allocated at open; submitting
//! and completing an operation allocates nothing (except an `Io` error message, and a
//! segment-vector entry when a write allocates a new segment).
//!
//! * Aligned operations (offset, length and buffer address aligned) go straight between the
//!   device and the caller's buffer (zero copy).
//! * Others use a bounce buffer covering the block-aligned span; writes first read the
//!   partial edge blocks (read-modify-write) unless the block lies entirely past the old end
//!   of file (then it is known to be zero).
//! * A write does not start while an earlier write of the same file whose block span overlaps
//!   is unfinished, so overlapping writes apply in submission order and read-modify-write never
//!   loses an update. A flush starts after every earlier write finished.
//! * Operations spanning segments become one device operation per segment piece and complete
//!   once, after all pieces.
//! * A write past the end of file is *parked* until its file's extend (a `SET_SIZE` in the
//!   metadata queue, `service/metaq.rs`) is durable, then issued as above; a parked write
//!   counts as an earlier unfinished write for overlapping writes and flushes.

use crate::align::{align_down, align_up};
use crate::device::{DevCompletion, DevOp};
use crate::error::FsError;
use crate::layout::Geometry;
use crate::service::{FileService, NO_SLOT};
use crate::types::{FileId, OpenConfig};
use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

mod bounce;

use bounce::BouncePool;

const MAX_SLOTS: u32 = 1 << 16;
const MAX_IO_LIMIT: u32 = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// A write past the end of file, waiting until a size covering it is durable (the
    /// file's extend in the metadata queue, `service/metaq.rs`).
    Parked,
    /// Waiting for earlier conflicting writes.
    Blocked,
    /// Submitting / waiting for device completions.
    Active,
    /// Finished, waiting to be reported by `poll`.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading partial edge blocks of an unaligned write.
    Rmw,
    /// The transfer itself (or the flush).
    Main,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: State,
    kind: Kind,
    phase: Phase,
    user_data: u64,
    file: u32,
    seq: u64,
    /// Requested file offset.
    offset: u64,
    /// Bytes to transfer (reads: clipped at end of file).
    len: u32,
    /// The caller's buffer.
    caller: *mut u8,
    /// Block-aligned file range moved by the main phase (flush: 0..1).
    span_start: u64,
    span_end: u64,
    /// Byte offset of the bounce buffer in the pool, or `usize::MAX` for zero copy.
    bounce_off: usize,
    bounce_units: u32,
    /// Next file offset of the main phase to submit.
    cursor: u64,
    /// Edge blocks (file offsets) to read before an unaligned write.
    edges: [u64; 2],
    n_edges: u8,
    next_edge: u8,
    /// Device operations submitted and not completed.
    outstanding: u32,
    /// First error (positive errno), 0 if none.
    error: i32,
    /// Why a parked write was refused (reported instead of `error`).
    refused: Option<Refusal>,
    /// In the ready queue.
    queued: bool,
    /// Writes: neighbours in the file's list of unfinished writes (`NO_SLOT`: none), and
    /// whether the slot is in that list.
    prev_write: u32,
    next_write: u32,
    linked: bool,
}

impl Slot {
    const EMPTY: Slot = Slot {
        state: State::Free,
        kind: Kind::Read,
        phase: Phase::Main,
        user_data: 0,
        file: u32::MAX,
        seq: 0,
        offset: 0,
        len: 0,
        caller: std::ptr::null_mut(),
        span_start: 0,
        span_end: 0,
        bounce_off: usize::MAX,
        bounce_units: 0,
        cursor: 0,
        edges: [0; 2],
        n_edges: 0,
        next_edge: 0,
        outstanding: 0,
        error: 0,
        refused: None,
        queued: false,
        prev_write: NO_SLOT,
        next_write: NO_SLOT,
        linked: false,
    };

    fn bounced(&self) -> bool {
        self.bounce_off != usize::MAX
    }

    fn phase_submitted(&self) -> bool {
        match self.phase {
            Phase::Rmw => self.next_edge == self.n_edges,
            Phase::Main => self.cursor >= self.span_end,
        }
    }

    fn overlaps(&self, other: &Slot) -> bool {
        self.span_start < other.span_end && other.span_start < self.span_end
    }
}

/// Why a parked write was refused: its completion reports this error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not enough free segments to grow the file (`NoSpace`).
    NoSpace,
    /// The file was deleted before it grew (`UnknownFile`).
    Deleted,
    /// A metadata write or sync failed: the service takes no more changes (`Io`).
    Stopped,
}

/// All data-path state, allocated at open.
pub(crate) struct DataPath {
    pub(crate) max_io: u32,
    slots: Vec<Slot>,
    free: Vec<u32>,
    ready: VecDeque<u32>,
    blocked: Vec<u32>,
    done: VecDeque<u32>,
    comps: Vec<DevCompletion>,
    bounce: BouncePool,
    next_seq: u64,
    /// Write operations not finished (all files).
    active_writes: u32,
    /// Writes parked until their file's size grows (all files).
    parked: u32,
}

impl DataPath {
    pub(crate) fn new(
        cfg: &OpenConfig,
        g: &Geometry,
        queue_depth: usize,
        align: usize,
    ) -> Result<DataPath, FsError> {
        let bad = |m: String| Err(FsError::InvalidConfig(m));
        if cfg.max_inflight == 0 || cfg.max_inflight > MAX_SLOTS {
            return bad(format!(
                "max_inflight {} not in 1..=65536",
                cfg.max_inflight
            ));
        }
        if cfg.max_io_bytes == 0 || cfg.max_io_bytes > MAX_IO_LIMIT {
            return bad(format!(
                "max_io_bytes {} not in 1..=256 MiB",
                cfg.max_io_bytes
            ));
        }
        let bs = g.block_size as usize;
        let unit = bs.max(4096);
        let need = align_up(cfg.max_io_bytes as u64 + 2 * bs as u64, unit as u64) as usize;
        // The pool must hold at least one maximum-size I/O; smaller requests are raised.
        let bounce_bytes = cfg.bounce_bytes.max(need);
        let n = cfg.max_inflight as usize;
        Ok(DataPath {
            max_io: cfg.max_io_bytes,
            slots: vec![Slot::EMPTY; n],
            free: (0..cfg.max_inflight).rev().collect(),
            ready: VecDeque::with_capacity(n),
            blocked: Vec::with_capacity(n),
            done: VecDeque::with_capacity(n),
            comps: vec![DevCompletion::default(); queue_depth.clamp(1, 1024)],
            bounce: BouncePool::new(bounce_bytes, unit, align),
            next_seq: 0,
            active_writes: 0,
            parked: 0,
        })
    }

    /// The bounce slab (base, length), to register with the device.
    pub(crate) fn bounce_memory(&mut self) -> (*mut u8, usize) {
        self.bounce.memory()
    }

    pub(crate) fn max_inflight(&self) -> u32 {
        self.slots.len() as u32
    }

    fn alloc_slot(&mut self) -> Result<usize, FsError> {
        let i = self.free.pop().ok_or(FsError::Busy)? as usize;
        debug_assert_eq!(self.slots[i].state, State::Free);
        Ok(i)
    }

    fn release_slot(&mut self, i: usize) {
        let s = &mut self.slots[i];
        debug_assert!(!s.bounced() && s.outstanding == 0);
        let queued = s.queued;
        *s = Slot::EMPTY;
        // A stale ready-queue entry may remain; keep the flag so it is not queued twice.
        s.queued = queued;
        self.free.push(i as u32);
    }

    fn enqueue(&mut self, i: usize) {
        if !self.slots[i].queued {
            self.slots[i].queued = true;
            debug_assert!(self.ready.len() < self.slots.len());
            self.ready.push_back(i as u32);
        }
    }

    fn free_bounce(&mut self, i: usize) {
        let s = &mut self.slots[i];
        if s.bounced() {
            self.bounce.free(s.bounce_off, s.bounce_units);
            s.bounce_off = usize::MAX;
            s.bounce_units = 0;
        }
    }

    /// True if an earlier unfinished (or parked) write of the same file overlaps slot `i`'s
    /// blocks. Walks only the file's list of unfinished writes (from `first`, in submission
    /// order) up to `i`.
    fn write_conflicts(&self, i: usize, first: u32) -> bool {
        let me = &self.slots[i];
        let mut j = first;
        while j != NO_SLOT && j as usize != i {
            let o = &self.slots[j as usize];
            debug_assert!(o.kind == Kind::Write && o.file == me.file && o.seq < me.seq);
            if matches!(o.state, State::Parked | State::Blocked | State::Active) && o.overlaps(me) {
                return true;
            }
            j = o.next_write;
        }
        false
    }

    /// True if an earlier write (any file) is unfinished (parked ones included).
    fn flush_conflicts(&self, i: usize) -> bool {
        let me = &self.slots[i];
        self.active_writes > 0
            && self.slots.iter().any(|o| {
                o.kind == Kind::Write
                    && matches!(o.state, State::Parked | State::Blocked | State::Active)
                    && o.seq < me.seq
            })
    }
}

/// O_DIRECT rules hold for `op`.
fn op_aligned(op: &DevOp, bs: u64, align: usize) -> bool {
    match *op {
        DevOp::Read { offset, buf, len } => {
            offset % bs == 0 && u64::from(len) % bs == 0 && (buf as usize).is_multiple_of(align)
        }
        DevOp::Write { offset, buf, len } => {
            offset % bs == 0 && u64::from(len) % bs == 0 && (buf as usize).is_multiple_of(align)
        }
        DevOp::Flush => true,
    }
}

/// Device user_data: slot (24 bits) | phase (8 bits) | expected length (32 bits).
fn tag(slot: usize, phase: Phase, len: u32) -> u64 {
    (slot as u64) | ((phase as u64) << 24) | (u64::from(len) << 32)
}

impl FileService {
    /// Submits a read of `len` bytes at file `offset` into `dst`. The completion (via
    /// [`poll`](Self::poll)) carries the bytes read: short if the read crosses the end of file,
    /// 0 if `offset` equals the size. `offset` beyond the size is `OutOfRange`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes and not be accessed until the completion
    /// for `user_data` has been reported by `poll` (or the service is closed).
    pub unsafe fn submit_read(
        &mut self,
        file: FileId,
        offset: u64,
        dst: *mut u8,
        len: u32,
        user_data: u64,
    ) -> Result<(), FsError> {
        if len > self.dp.max_io {
            return Err(FsError::TooLarge);
        }
        let fslot = self.file_slot(file)?;
        if self.files_io[fslot as usize].fenced {
            return Err(FsError::Busy);
        }
        let size = self.meta.files[fslot as usize].as_ref().expect("live").size;
        if offset > size {
            return Err(FsError::OutOfRange);
        }
        if dst.is_null() && len > 0 {
            return Err(FsError::InvalidArgument("null read buffer"));
        }
        let bs = self.bs;
        let clipped = u64::from(len).min(size - offset);
        let direct = offset.is_multiple_of(bs)
            && u64::from(len) % bs == 0
            && (dst as usize).is_multiple_of(self.align);
        let (span_start, span_end) = if direct {
            (offset, offset + align_up(clipped, bs))
        } else {
            (align_down(offset, bs), align_up(offset + clipped, bs))
        };
        let i = self.dp.alloc_slot()?;
        let mut bounce = (usize::MAX, 0);
        if !direct && clipped > 0 {
            match self.dp.bounce.alloc((span_end - span_start) as usize) {
                Some(b) => bounce = b,
                None => {
                    self.dp.release_slot(i);
                    return Err(FsError::Busy);
                }
            }
        }
        let seq = self.dp.next_seq;
        self.dp.next_seq += 1;
        self.dp.slots[i] = Slot {
            state: State::Active,
            kind: Kind::Read,
            phase: Phase::Main,
            user_data,
            file: fslot,
            seq,
            offset,
            len: clipped as u32,
            caller: dst,
            span_start,
            span_end,
            bounce_off: bounce.0,
            bounce_units: bounce.1,
            cursor: span_start,
            queued: self.dp.slots[i].queued,
            ..Slot::EMPTY
        };
        self.files_io[fslot as usize].inflight += 1;
        if clipped == 0 {
            self.finish(i);
        } else {
            self.dp.enqueue(i);
            self.pump();
        }
        Ok(())
    }

    /// Submits a write of `len` bytes from `src` at file `offset`. A write past the end of file
    /// extends it: it waits (parked, not blocking the caller) until segments are allocated and
    /// a size covering it is durable, and only then is issued, so its completion implies the
    /// new size is durable. Its size change is queued with the metadata operations; one
    /// commit covers every write of the file waiting for it. When no metadata operation is
    /// active or queued the growth is validated here (`NoSpace` if the device is full);
    /// otherwise a refusal is the write's completion (`NoSpace`, `UnknownFile` if the file is
    /// deleted first). An end beyond the maximum file size is `OutOfRange`. Data is durable
    /// after the completion and a subsequent flush.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes and not be modified until the completion
    /// for `user_data` has been reported by `poll` (or the service is closed).
    pub unsafe fn submit_write(
        &mut self,
        file: FileId,
        offset: u64,
        src: *const u8,
        len: u32,
        user_data: u64,
    ) -> Result<(), FsError> {
        self.check_writable()?;
        if len > self.dp.max_io {
            return Err(FsError::TooLarge);
        }
        let fslot = self.file_slot(file)?;
        let end = match offset.checked_add(u64::from(len)) {
            Some(e) if e <= self.geom.max_file_size() => e,
            _ => return Err(FsError::OutOfRange),
        };
        if src.is_null() && len > 0 {
            return Err(FsError::InvalidArgument("null write buffer"));
        }
        if self.files_io[fslot as usize].fenced {
            return Err(FsError::Busy);
        }
        let size = self.meta.files[fslot as usize].as_ref().expect("live").size;
        let extend = len > 0 && end > size;
        let job = if extend {
            self.extend_now(fslot, end)?
        } else {
            None
        };
        // The size once the writes parked before this one are in: no earlier write touches
        // a block at or past it, and the device holds zeros there (zero-past-size invariant).
        let old_size = size.max(self.files_io[fslot as usize].want);
        let bs = self.bs;
        let direct = offset.is_multiple_of(bs)
            && u64::from(len) % bs == 0
            && (src as usize).is_multiple_of(self.align);
        let span_start = align_down(offset, bs);
        let span_end = align_up(end, bs);
        let i = self.dp.alloc_slot()?;
        let seq = self.dp.next_seq;
        self.dp.next_seq += 1;
        self.dp.slots[i] = Slot {
            state: State::Active,
            kind: Kind::Write,
            phase: Phase::Main,
            user_data,
            file: fslot,
            seq,
            offset,
            len,
            caller: src as *mut u8,
            span_start,
            span_end,
            cursor: span_start,
            queued: self.dp.slots[i].queued,
            ..Slot::EMPTY
        };
        if len == 0 {
            self.files_io[fslot as usize].inflight += 1;
            self.files_io[fslot as usize].writes += 1;
            self.dp.active_writes += 1;
            self.dp.slots[i].span_end = span_start; // touches no block
            self.finish(i);
            return Ok(());
        }
        if !direct {
            match self.dp.bounce.alloc((span_end - span_start) as usize) {
                Some((off, units)) => {
                    self.dp.slots[i].bounce_off = off;
                    self.dp.slots[i].bounce_units = units;
                }
                None => {
                    self.dp.release_slot(i);
                    return Err(FsError::Busy);
                }
            }
            // Partial edge blocks: read them back unless they lie wholly past the old end of
            // file, where the device holds zeros (zero-past-size invariant).
            let mut edges = [0u64; 2];
            let mut n = 0;
            let head_partial = !offset.is_multiple_of(bs);
            let tail_partial = end % bs != 0;
            let tail = span_end - bs;
            let mut consider = |blk: u64, dp: &mut DataPath| {
                if blk < old_size {
                    edges[n] = blk;
                    n += 1;
                } else {
                    let s = &dp.slots[i];
                    let at = s.bounce_off + (blk - s.span_start) as usize;
                    // SAFETY: the block lies inside this slot's bounce run.
                    unsafe { std::ptr::write_bytes(dp.bounce.ptr(at), 0, bs as usize) };
                }
            };
            if head_partial {
                consider(span_start, &mut self.dp);
            }
            if tail_partial && !(head_partial && tail == span_start) {
                consider(tail, &mut self.dp);
            }
            let s = &mut self.dp.slots[i];
            s.edges = edges;
            s.n_edges = n as u8;
        }
        self.files_io[fslot as usize].inflight += 1;
        self.files_io[fslot as usize].writes += 1;
        self.dp.active_writes += 1;
        self.link_write(i, fslot);
        if extend {
            self.park_write(i, fslot, end, job);
        } else {
            self.start_or_block(i, fslot);
            self.pump();
        }
        Ok(())
    }

    /// Starts write slot `i` of file `fslot`, or blocks it behind an earlier overlapping one.
    fn start_or_block(&mut self, i: usize, fslot: u32) {
        let first = self.files_io[fslot as usize].first_write;
        if self.files_io[fslot as usize].writes > 1 && self.dp.write_conflicts(i, first) {
            self.dp.slots[i].state = State::Blocked;
            self.dp.blocked.push(i as u32);
        } else {
            self.start_write(i);
        }
    }

    /// Marks write slot `i` parked (its bookkeeping as an unfinished write is done).
    pub(crate) fn park(&mut self, i: usize) {
        debug_assert_eq!(self.dp.slots[i].kind, Kind::Write);
        self.dp.slots[i].state = State::Parked;
        self.dp.parked += 1;
    }

    /// Issues the parked writes of file `fslot` that its durable size now covers, in
    /// submission order (each after earlier overlapping writes, as at submit).
    pub(crate) fn release_parked(&mut self, fslot: u32) {
        let Some(size) = self.meta.files[fslot as usize].as_ref().map(|f| f.size) else {
            self.refuse_parked(fslot, 0, Refusal::Deleted);
            return;
        };
        let mut j = self.files_io[fslot as usize].first_write;
        while j != NO_SLOT {
            let s = self.dp.slots[j as usize];
            if s.state == State::Parked && s.offset + u64::from(s.len) <= size {
                self.unpark(j as usize, fslot);
                self.start_or_block(j as usize, fslot);
            }
            j = s.next_write;
        }
        self.update_want(fslot);
        self.pump();
    }

    /// Completes the parked writes of file `fslot` that end past `keep` with `why`.
    pub(crate) fn refuse_parked(&mut self, fslot: u32, keep: u64, why: Refusal) {
        let mut j = self.files_io[fslot as usize].first_write;
        while j != NO_SLOT {
            let s = self.dp.slots[j as usize];
            if s.state == State::Parked && s.offset + u64::from(s.len) > keep {
                self.unpark(j as usize, fslot);
                self.dp.slots[j as usize].refused = Some(why);
                self.finish(j as usize);
            }
            j = s.next_write;
        }
        self.update_want(fslot);
        self.pump();
    }

    fn unpark(&mut self, i: usize, fslot: u32) {
        let fio = &mut self.files_io[fslot as usize];
        assert!(fio.parked > 0 && self.dp.parked > 0, "parked count");
        fio.parked -= 1;
        self.dp.parked -= 1;
        // Leaves `Parked`: `start_or_block` or `finish` sets the next state.
        self.dp.slots[i].state = State::Active;
    }

    /// Recomputes file `fslot`'s wanted size: the largest end of its parked writes.
    fn update_want(&mut self, fslot: u32) {
        let mut want = 0;
        let mut j = self.files_io[fslot as usize].first_write;
        if self.files_io[fslot as usize].parked > 0 {
            while j != NO_SLOT {
                let s = &self.dp.slots[j as usize];
                if s.state == State::Parked {
                    want = want.max(s.offset + u64::from(s.len));
                }
                j = s.next_write;
            }
        }
        self.files_io[fslot as usize].want = want;
    }

    /// Submits a flush: completes after every write submitted before it has completed and the
    /// device has made completed writes durable (fdatasync through io_uring).
    pub fn submit_flush(&mut self, user_data: u64) -> Result<(), FsError> {
        let i = self.dp.alloc_slot()?;
        let seq = self.dp.next_seq;
        self.dp.next_seq += 1;
        self.dp.slots[i] = Slot {
            state: State::Active,
            kind: Kind::Flush,
            phase: Phase::Main,
            user_data,
            seq,
            span_start: 0,
            span_end: 1,
            cursor: 0,
            queued: self.dp.slots[i].queued,
            ..Slot::EMPTY
        };
        if self.dp.flush_conflicts(i) {
            self.dp.slots[i].state = State::Blocked;
            self.dp.blocked.push(i as u32);
        } else {
            self.dp.enqueue(i);
            self.pump();
        }
        Ok(())
    }

    /// Reaps device completions, advances operations, and reports every finished operation
    /// to `f(user_data, result)` (result: bytes transferred, or the error). Completions come
    /// in any order. Returns the number reported. Never blocks.
    pub fn poll(&mut self, mut f: impl FnMut(u64, Result<u32, FsError>)) -> usize {
        self.reap();
        if self.dp.parked > 0 {
            // Parked writes go on with their file's extend.
            self.advance_for_parked(false);
        }
        let mut n = 0;
        while let Some(i) = self.dp.done.pop_front() {
            let i = i as usize;
            let s = self.dp.slots[i];
            debug_assert_eq!(s.state, State::Done);
            let ud = s.user_data;
            let res = if let Some(why) = s.refused {
                Err(self.refusal_error(why))
            } else if s.error != 0 {
                let what = match s.kind {
                    Kind::Read => "read",
                    Kind::Write => "write",
                    Kind::Flush => "flush",
                };
                Err(FsError::errno(what, s.error))
            } else {
                Ok(s.len)
            };
            self.dp.release_slot(i);
            n += 1;
            f(ud, res);
        }
        n
    }

    /// Blocks until at least one operation can be reported by [`poll`](Self::poll) (returns
    /// at once if one is ready or nothing is in flight).
    pub fn wait(&mut self) -> Result<(), FsError> {
        while self.dp.done.is_empty() && self.inflight() > 0 {
            if self.dp.parked > 0 {
                self.pump();
                self.reap();
                // With the device idle only the metadata queue can move: wait for its job.
                let idle = self.dev.inflight() == 0;
                let parked = self.dp.parked;
                let waited = self.advance_for_parked(idle);
                if idle {
                    let moved = waited || self.dp.parked != parked || self.dev.inflight() > 0;
                    if !moved && self.dp.done.is_empty() {
                        debug_assert!(false, "parked writes stalled");
                        return Err(FsError::Io("data path stalled".into()));
                    }
                    continue;
                }
                if !self.dp.done.is_empty() {
                    continue;
                }
            }
            self.progress(true)?;
        }
        Ok(())
    }

    /// The error a refused parked write reports.
    fn refusal_error(&self, why: Refusal) -> FsError {
        match why {
            Refusal::NoSpace => FsError::NoSpace,
            Refusal::Deleted => FsError::UnknownFile,
            Refusal::Stopped => self
                .check_writable()
                .err()
                .unwrap_or_else(|| FsError::Io("metadata commit failed".into())),
        }
    }

    /// Blocks until an operation can be reported by [`poll`](Self::poll), `wake` is
    /// readable, or `timeout` has passed, whichever comes first. With nothing on the device
    /// but parked writes waiting for the metadata thread (which rings `wake` when a commit
    /// ends), it waits on `wake` alone. Returns at once if an operation is ready, nothing is in
    /// flight, or the device completes operations within `poll` itself (it has no completion
    /// descriptor) or there is no metadata thread. Never reads `wake`.
    pub fn wait_for(&mut self, wake: BorrowedFd<'_>, timeout: Duration) -> Result<(), FsError> {
        if !self.dp.done.is_empty() || self.inflight() == 0 {
            return Ok(());
        }
        self.pump();
        // Reaping also pushes every queued submission to the device.
        if self.reap() > 0 || !self.dp.done.is_empty() {
            return Ok(());
        }
        let dev = if self.dev.inflight() > 0 {
            match self.dev.completion_fd() {
                Some(fd) => Some(fd),
                None => return Ok(()),
            }
        } else if self.has_meta_thread() {
            // Nothing on the device: what is in flight is parked writes waiting for their
            // size commit, whose end the metadata thread announces on `wake`.
            None
        } else {
            return Ok(());
        };
        let mut fds = vec![PollFd::new(&wake, PollFlags::IN)];
        if let Some(dev) = &dev {
            fds.push(PollFd::new(dev, PollFlags::IN));
        }
        let timeout = Timespec::try_from(timeout).expect("a representable timeout");
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(FsError::io("wait for the device", e.into())),
        }
    }

    /// Data operations accepted and not yet reported by `poll`.
    pub fn inflight(&self) -> usize {
        self.dp.slots.len() - self.dp.free.len()
    }

    /// Reaps completions; if `block` and nothing completed, waits for the device once.
    pub(crate) fn progress(&mut self, block: bool) -> Result<(), FsError> {
        self.pump();
        let got = self.reap();
        if got == 0 && block {
            if self.dev.inflight() == 0 {
                // Nothing can complete: a blocked or queued op would never finish.
                debug_assert!(false, "data path stalled");
                return Err(FsError::Io("data path stalled".into()));
            }
            self.dev.wait().map_err(|e| FsError::io("device wait", e))?;
            self.reap();
        }
        Ok(())
    }

    /// Polls the device until it has nothing more; returns completions processed.
    fn reap(&mut self) -> usize {
        let mut total = 0;
        loop {
            let n = self.dev.poll(&mut self.dp.comps);
            if n == 0 {
                break;
            }
            for k in 0..n {
                let c = self.dp.comps[k];
                self.on_completion(c);
            }
            total += n;
            self.pump();
        }
        total
    }

    fn on_completion(&mut self, c: DevCompletion) {
        let i = (c.user_data & 0xff_ffff) as usize;
        let expect = (c.user_data >> 32) as u32;
        let s = &mut self.dp.slots[i];
        assert!(
            s.state == State::Active && s.outstanding > 0,
            "completion for an idle op slot"
        );
        s.outstanding -= 1;
        if c.result < 0 {
            if s.error == 0 {
                s.error = -c.result;
            }
        } else if s.kind != Kind::Flush && c.result as u32 != expect && s.error == 0 {
            s.error = libc::EIO; // short transfer
        }
        self.advance(i);
    }

    /// Moves an op to its next phase or finishes it once the current phase is complete.
    fn advance(&mut self, i: usize) {
        let s = &mut self.dp.slots[i];
        if s.error != 0 {
            // Issue nothing more; wait for what is outstanding.
            s.next_edge = s.n_edges;
            s.cursor = s.span_end;
        }
        if s.outstanding > 0 || !s.phase_submitted() {
            return;
        }
        match s.phase {
            Phase::Rmw => {
                if s.error != 0 {
                    self.finish(i);
                } else {
                    self.fill_write_bounce(i);
                    let s = &mut self.dp.slots[i];
                    s.phase = Phase::Main;
                    s.cursor = s.span_start;
                    self.dp.enqueue(i);
                }
            }
            Phase::Main => {
                if s.kind == Kind::Read && s.bounced() && s.error == 0 {
                    let from = s.bounce_off + (s.offset - s.span_start) as usize;
                    let (dst, len) = (s.caller, s.len as usize);
                    let src = self.dp.bounce.ptr(from);
                    // SAFETY: the bounce run covers [offset, offset+len); the caller's buffer
                    // is valid for len bytes (submit contract).
                    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
                }
                self.finish(i);
            }
        }
    }

    /// Copies the caller's write data into its place in the bounce buffer.
    fn fill_write_bounce(&mut self, i: usize) {
        let s = self.dp.slots[i];
        debug_assert!(s.kind == Kind::Write && s.bounced());
        let at = s.bounce_off + (s.offset - s.span_start) as usize;
        let dst = self.dp.bounce.ptr(at);
        // SAFETY: bounce run covers the span; caller buffer valid for len bytes.
        unsafe { std::ptr::copy_nonoverlapping(s.caller, dst, s.len as usize) };
    }

    /// Starts a write whose conflicts (if any) are gone.
    fn start_write(&mut self, i: usize) {
        let s = &mut self.dp.slots[i];
        s.state = State::Active;
        if s.bounced() {
            if s.n_edges > 0 {
                s.phase = Phase::Rmw;
                s.next_edge = 0;
            } else {
                s.phase = Phase::Main;
                self.fill_write_bounce(i);
            }
        } else {
            s.phase = Phase::Main;
        }
        self.dp.enqueue(i);
    }

    /// Marks an op finished and releases what it held except the slot.
    fn finish(&mut self, i: usize) {
        self.dp.free_bounce(i);
        let s = &mut self.dp.slots[i];
        debug_assert_eq!(s.outstanding, 0);
        s.state = State::Done;
        let (kind, file) = (s.kind, s.file);
        if kind != Kind::Flush {
            let fio = &mut self.files_io[file as usize];
            debug_assert!(fio.inflight > 0);
            fio.inflight -= 1;
        }
        self.dp.done.push_back(i as u32);
        if kind == Kind::Write {
            self.unlink_write(i, file);
            let fio = &mut self.files_io[file as usize];
            fio.writes -= 1;
            self.dp.active_writes -= 1;
            self.unblock();
        }
    }

    /// Appends write slot `i` to file `fslot`'s list of unfinished writes.
    fn link_write(&mut self, i: usize, fslot: u32) {
        let fio = &mut self.files_io[fslot as usize];
        let last = fio.last_write;
        let s = &mut self.dp.slots[i];
        debug_assert!(!s.linked);
        s.prev_write = last;
        s.next_write = NO_SLOT;
        s.linked = true;
        if last == NO_SLOT {
            fio.first_write = i as u32;
        } else {
            self.dp.slots[last as usize].next_write = i as u32;
        }
        fio.last_write = i as u32;
    }

    /// Removes write slot `i` from file `file`'s list (if it is in it).
    fn unlink_write(&mut self, i: usize, file: u32) {
        let s = self.dp.slots[i];
        if !s.linked {
            return;
        }
        let fio = &mut self.files_io[file as usize];
        match s.prev_write {
            NO_SLOT => fio.first_write = s.next_write,
            p => self.dp.slots[p as usize].next_write = s.next_write,
        }
        match s.next_write {
            NO_SLOT => fio.last_write = s.prev_write,
            n => self.dp.slots[n as usize].prev_write = s.prev_write,
        }
        let s = &mut self.dp.slots[i];
        s.linked = false;
        s.prev_write = NO_SLOT;
        s.next_write = NO_SLOT;
    }

    /// Starts blocked operations whose conflicts are gone (in submission order).
    fn unblock(&mut self) {
        let mut k = 0;
        while k < self.dp.blocked.len() {
            let j = self.dp.blocked[k] as usize;
            let ready = match self.dp.slots[j].kind {
                Kind::Write => {
                    let first = self.files_io[self.dp.slots[j].file as usize].first_write;
                    !self.dp.write_conflicts(j, first)
                }
                Kind::Flush => !self.dp.flush_conflicts(j),
                Kind::Read => true,
            };
            if ready {
                self.dp.blocked.remove(k);
                if self.dp.slots[j].kind == Kind::Write {
                    self.start_write(j);
                } else {
                    self.dp.slots[j].state = State::Active;
                    self.dp.enqueue(j);
                }
            } else {
                k += 1;
            }
        }
    }

    /// Submits queued device operations in FIFO order until the device is busy.
    pub(crate) fn pump(&mut self) {
        while let Some(&i) = self.dp.ready.front() {
            let i = i as usize;
            let s = self.dp.slots[i];
            if s.state != State::Active || s.phase_submitted() {
                // Stale entry (the op finished or was fully submitted already).
                self.dp.ready.pop_front();
                self.dp.slots[i].queued = false;
                continue;
            }
            if !self.submit_parts(i) {
                return; // device busy; retry on the next poll
            }
            self.dp.ready.pop_front();
            self.dp.slots[i].queued = false;
            self.advance(i);
        }
    }

    /// Submits the remaining device operations of slot `i`'s current phase. Returns false if
    /// the device became busy before all were submitted.
    fn submit_parts(&mut self, i: usize) -> bool {
        let seg = self.geom.segment_size;
        let bs = self.bs as u32;
        loop {
            let s = self.dp.slots[i];
            let (op, len, phase) = match s.phase {
                Phase::Rmw => {
                    if s.next_edge == s.n_edges {
                        return true;
                    }
                    let blk = s.edges[s.next_edge as usize];
                    let at = s.bounce_off + (blk - s.span_start) as usize;
                    let buf = self.dp.bounce.ptr(at);
                    let f = self.meta.files[s.file as usize].as_ref().expect("live");
                    let dev_off = u64::from(f.segs[(blk / seg) as usize]) * seg + blk % seg;
                    (
                        DevOp::Read {
                            offset: dev_off,
                            buf,
                            len: bs,
                        },
                        bs,
                        Phase::Rmw,
                    )
                }
                Phase::Main => {
                    if s.cursor >= s.span_end {
                        return true;
                    }
                    if s.kind == Kind::Flush {
                        (DevOp::Flush, 0, Phase::Main)
                    } else {
                        let f = self.meta.files[s.file as usize].as_ref().expect("live");
                        let within = s.cursor % seg;
                        let chunk = (s.span_end - s.cursor).min(seg - within);
                        let dev_off = u64::from(f.segs[(s.cursor / seg) as usize]) * seg + within;
                        let base = if s.bounced() {
                            self.dp.bounce.ptr(s.bounce_off)
                        } else {
                            // Direct I/O: the span starts at the requested offset.
                            debug_assert_eq!(s.span_start, s.offset);
                            s.caller
                        };
                        // SAFETY: cursor - span_start < span length, inside the buffer.
                        let buf = unsafe { base.add((s.cursor - s.span_start) as usize) };
                        let len = chunk as u32;
                        let op = match s.kind {
                            Kind::Read => DevOp::Read {
                                offset: dev_off,
                                buf,
                                len,
                            },
                            _ => DevOp::Write {
                                offset: dev_off,
                                buf,
                                len,
                            },
                        };
                        (op, len, Phase::Main)
                    }
                }
            };
            debug_assert!(op_aligned(&op, self.bs, self.align), "unaligned device op");
            // SAFETY: buffers are the caller's (valid until reported, per the submit contract)
            // or our bounce pool (freed only after the op's device operations completed).
            match unsafe { self.dev.submit(op, tag(i, phase, len)) } {
                Ok(()) => {
                    let s = &mut self.dp.slots[i];
                    s.outstanding += 1;
                    match phase {
                        Phase::Rmw => s.next_edge += 1,
                        Phase::Main if s.kind == Kind::Flush => s.cursor = s.span_end,
                        Phase::Main => s.cursor += u64::from(len),
                    }
                }
                Err(_busy) => return false,
            }
        }
    }
}
