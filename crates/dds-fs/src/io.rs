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
//!   metadata queue, `service/extend.rs`) is durable, then issued as above; a parked write
//!   counts as an earlier unfinished write for overlapping writes and flushes
//!   (`io/parked.rs`).
//!
//! Here: the data path's methods (submit, poll, wait, and the engine that moves op slots
//! through their phases). The slots and queues themselves are `io/slots.rs`.

use crate::align::{align_down, align_up};
use crate::device::{DevCompletion, DevOp};
use crate::error::FsError;
use crate::service::{FileService, NO_SLOT};
use crate::types::FileId;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};

mod bounce;
mod parked;
mod slots;

pub(crate) use slots::{DataPath, Refusal};
use slots::{Kind, Phase, Slot, State};

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
    /// descriptor) or there is no metadata thread. Never reads `wake`. `also`, when given, ends
    /// the wait as `wake` does (the descriptor of another event source the caller drives).
    pub fn wait_for(
        &mut self,
        wake: BorrowedFd<'_>,
        also: Option<BorrowedFd<'_>>,
        timeout: Duration,
    ) -> Result<(), FsError> {
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
        // On the stack: the service thread waits here once per wake-up.
        let mut fds = [
            PollFd::new(&wake, PollFlags::IN),
            PollFd::new(also.as_ref().unwrap_or(&wake), PollFlags::IN),
            PollFd::new(dev.as_ref().unwrap_or(&wake), PollFlags::IN),
        ];
        let n = match (also.is_some(), dev.is_some()) {
            (_, true) => 3,
            (true, false) => 2,
            (false, false) => 1,
        };
        let timeout = Timespec::try_from(timeout).expect("a representable timeout");
        match rustix::event::poll(&mut fds[..n], Some(&timeout)) {
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
