//! The data path's state, allocated at open: one op slot per operation in flight (what it
//! moves, where, its phase and progress), the free, ready, blocked and done queues, the bounce
//! buffers and the completion array.

use std::collections::VecDeque;

use super::bounce::BouncePool;
use crate::align::align_up;
use crate::device::DevCompletion;
use crate::error::FsError;
use crate::layout::Geometry;
use crate::service::NO_SLOT;
use crate::types::OpenConfig;

pub(super) const MAX_SLOTS: u32 = 1 << 16;
pub(super) const MAX_IO_LIMIT: u32 = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Free,
    /// A write past the end of file, waiting until a size covering it is durable (the
    /// file's extend in the metadata queue, `service/extend.rs`).
    Parked,
    /// Waiting for earlier conflicting writes.
    Blocked,
    /// Submitting / waiting for device completions.
    Active,
    /// Finished, waiting to be reported by `poll`.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Read,
    Write,
    Flush,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Reading partial edge blocks of an unaligned write.
    Rmw,
    /// The transfer itself (or the flush).
    Main,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) state: State,
    pub(super) kind: Kind,
    pub(super) phase: Phase,
    pub(super) user_data: u64,
    pub(super) file: u32,
    pub(super) seq: u64,
    /// Requested file offset.
    pub(super) offset: u64,
    /// Bytes to transfer (reads: clipped at end of file).
    pub(super) len: u32,
    /// The caller's buffer.
    pub(super) caller: *mut u8,
    /// Block-aligned file range moved by the main phase (flush: 0..1).
    pub(super) span_start: u64,
    pub(super) span_end: u64,
    /// Byte offset of the bounce buffer in the pool, or `usize::MAX` for zero copy.
    pub(super) bounce_off: usize,
    pub(super) bounce_units: u32,
    /// Next file offset of the main phase to submit.
    pub(super) cursor: u64,
    /// Edge blocks (file offsets) to read before an unaligned write.
    pub(super) edges: [u64; 2],
    pub(super) n_edges: u8,
    pub(super) next_edge: u8,
    /// Device operations submitted and not completed.
    pub(super) outstanding: u32,
    /// First error (positive errno), 0 if none.
    pub(super) error: i32,
    /// Why a parked write was refused (reported instead of `error`).
    pub(super) refused: Option<Refusal>,
    /// In the ready queue.
    pub(super) queued: bool,
    /// Writes: neighbours in the file's list of unfinished writes (`NO_SLOT`: none), and
    /// whether the slot is in that list.
    pub(super) prev_write: u32,
    pub(super) next_write: u32,
    pub(super) linked: bool,
}

impl Slot {
    pub(super) const EMPTY: Slot = Slot {
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

    pub(super) fn bounced(&self) -> bool {
        self.bounce_off != usize::MAX
    }

    pub(super) fn phase_submitted(&self) -> bool {
        match self.phase {
            Phase::Rmw => self.next_edge == self.n_edges,
            Phase::Main => self.cursor >= self.span_end,
        }
    }

    pub(super) fn overlaps(&self, other: &Slot) -> bool {
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
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    pub(super) ready: VecDeque<u32>,
    pub(super) blocked: Vec<u32>,
    pub(super) done: VecDeque<u32>,
    pub(super) comps: Vec<DevCompletion>,
    pub(super) bounce: BouncePool,
    pub(super) next_seq: u64,
    /// Write operations not finished (all files).
    pub(super) active_writes: u32,
    /// Writes parked until their file's size grows (all files).
    pub(super) parked: u32,
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

    pub(super) fn alloc_slot(&mut self) -> Result<usize, FsError> {
        let i = self.free.pop().ok_or(FsError::Busy)? as usize;
        debug_assert_eq!(self.slots[i].state, State::Free);
        Ok(i)
    }

    pub(super) fn release_slot(&mut self, i: usize) {
        let s = &mut self.slots[i];
        debug_assert!(!s.bounced() && s.outstanding == 0);
        let queued = s.queued;
        *s = Slot::EMPTY;
        // A stale ready-queue entry may remain; keep the flag so it is not queued twice.
        s.queued = queued;
        self.free.push(i as u32);
    }

    pub(super) fn enqueue(&mut self, i: usize) {
        if !self.slots[i].queued {
            self.slots[i].queued = true;
            debug_assert!(self.ready.len() < self.slots.len());
            self.ready.push_back(i as u32);
        }
    }

    pub(super) fn free_bounce(&mut self, i: usize) {
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
    pub(super) fn write_conflicts(&self, i: usize, first: u32) -> bool {
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
    pub(super) fn flush_conflicts(&self, i: usize) -> bool {
        let me = &self.slots[i];
        self.active_writes > 0
            && self.slots.iter().any(|o| {
                o.kind == Kind::Write
                    && matches!(o.state, State::Parked | State::Blocked | State::Active)
                    && o.seq < me.seq
            })
    }
}
