//! Metadata operations as a queue the data-path thread advances without waiting.
//!
//! [`FileService::submit_meta`] queues an operation; [`FileService::poll_meta`] advances the
//! queue and reports finished operations. One operation is active at a time, in queue order:
//!
//! 1. *Start*: validated against the current state (as the synchronous calls always did).
//!    A delete, or a shrink, of a file with data operations in flight first *fences* the
//!    file (new reads and writes of it are refused with `Busy`; the DPU holds them back in
//!    its rings instead of submitting them) and waits, without blocking, until they are done.
//! 2. *Commit*: the change is prepared as a [`Job`] (its segments picked, its record encoded)
//!    and handed to the committer: inline, or to the metadata thread, which zeroes new
//!    segments, appends the record, `fdatasync`s, zeroes a cut tail, and posts the result.
//! 3. *Finish*: only when the job's record is durable is the change applied to the in-memory
//!    state, the fence lifted and the operation reported.
//!
//! While a job is with the metadata thread the data path runs on the state before the change.
//! That is safe: a job's segments are still free in that state but no other job can pick them
//! (one job at a time), a fenced file gets no new I/O, and a file being created has no id
//! anyone knows yet.
//!
//! # Extending writes
//!
//! A write that ends past its file's size needs a durable `SET_SIZE` before it is issued, so
//! that an acknowledged write implies its size survives a crash. That size change is an
//! internal operation of the same queue (an *extend*, [`Origin::Extend`]); the write is
//! *parked* in the data path meanwhile (it holds its op slot and bounce buffer, counts as in
//! flight, and is reported by `poll` like any write) and nothing waits on the data-path
//! thread:
//!
//! * If the queue is idle the extend is prepared at submit (so `NoSpace` is the submit's
//!   error) and handed to the committer at once. Otherwise the file's extend is queued at the
//!   back, once per file: later writes of the file join it, and it grows the file to the
//!   largest end among its parked writes as they are when it starts. A write whose end the
//!   extend being committed already reaches waits for that one. So a flood of appends costs
//!   about one commit per commit time, not one per append. Extends of different files
//!   queued one behind the other start together and commit as one `SET_SIZES` record (one
//!   sync for all; [`FileService::extends_start`]), so appends to many files share commits
//!   too.
//! * When the extend's record is durable and applied, the file's parked writes that the new
//!   size covers are issued in submission order, each behind earlier overlapping writes of
//!   the file (parked ones included, so writes still apply in submission order). A flush
//!   waits for parked writes like for any earlier write.
//! * A write parks only for its own file's size: reads and writes of other files, and of the
//!   same file within its durable size that overlap no parked write, go on. A read sees the
//!   durable size: the range an unfinished extending write covers reads as past the end of
//!   file until its size is durable, then as zeros or the new data until the write
//!   completes (as for any unfinished write).
//! * Refusals complete the parked writes through `poll`: if the free segments do not cover
//!   the extend, the writes that fit go ahead and the others report `NoSpace`; after a failed
//!   metadata write or sync they report `Io` (the service takes no more changes).
//! * A delete that reaches the head of the queue while writes of its file are parked (their
//!   extend is queued behind it) refuses them with `UnknownFile`: they come after the delete.
//!   A shrink in that position must drain them, so it fences the file, lets the file's extend
//!   commit first (its writes are then issued and drained like any other I/O) and comes back.
//!   Both were submitted while the other was pending, so either order is one the caller may
//!   see. A delete or shrink queued behind an extend simply waits for it.
//!
//! Parked writes move whenever the queue moves: `poll`, `poll_meta` and the blocking `wait`
//! advance it (`wait` waits for the job in flight when the device has nothing in flight).

use std::collections::VecDeque;

use super::*;
use crate::commit::{Executor, Job, JobResult};
use crate::device::DevIo;
use crate::io::Refusal;
use crate::layout::LOG_HEADER_LEN;
use crate::meta::{OwnedRecord, SizeChange, SET_SIZES_FIXED};

/// A metadata operation for [`FileService::submit_meta`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaOp {
    /// Create a named directory.
    CreateDir { path: String },
    /// Remove an empty named directory.
    RemoveDir { path: String },
    /// Create an empty file.
    CreateFile { path: String },
    /// Delete a file by id (after its in-flight I/O completed).
    DeleteFile { id: FileId },
    /// Delete a file by path.
    DeletePath { path: String },
    /// Rename / move a file.
    Rename { from: String, to: String },
    /// Set a file's size.
    Resize { id: FileId, size: u64 },
}

/// What a finished [`MetaOp`] produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaDone {
    /// The change is durable and visible.
    Done,
    /// The file was created with this id (durable and visible).
    Created(FileId),
}

/// Who waits for an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A caller of `submit_meta`, with its user data.
    User(u64),
    /// A synchronous call of this service (`create_file`, ...).
    Blocking,
    /// The writes of file slot `.0` parked until its size grows (their completions report
    /// the result).
    Extend(u32),
}

/// A queued operation.
#[derive(Debug)]
enum Item {
    Op(Origin, MetaOp),
    /// Grow file slot `.0` to cover its parked writes (to `FileIo::want` as it is when the
    /// extend starts: writes parked meanwhile are covered too).
    Extend(u32),
}

/// A committed change waiting for its job's result.
#[derive(Debug)]
pub(crate) struct Pending {
    origin: Origin,
    rec: OwnedRecord,
    /// The job zeroes a cut tail: clear `TAIL_DIRTY` once applied.
    tail: bool,
    /// The file fenced for this change.
    fence: Option<u32>,
    outcome: MetaDone,
    /// Further files whose extends this change commits too (a `SET_SIZES` group commit; the
    /// origin is the first file's extend).
    also: Vec<u32>,
}

#[derive(Debug)]
enum Active {
    /// Waiting for file `slot`'s data operations (the file is fenced).
    Draining {
        origin: Origin,
        op: MetaOp,
        slot: u32,
    },
    /// The job is with the metadata thread.
    Committing(Pending),
}

impl Active {
    fn is_extend(&self) -> bool {
        matches!(self, Active::Committing(p) if matches!(p.origin, Origin::Extend(_)))
    }
}

/// The operation queue (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct MetaQueue {
    queue: VecDeque<Item>,
    active: Option<Active>,
    done: VecDeque<(Origin, Result<MetaDone, FsError>)>,
    /// `Item::Extend` entries in `queue` (at most one per file).
    extends: usize,
    /// The file fenced for the shrink at the head of the queue while that file's extend,
    /// moved ahead of it, commits.
    prefenced: Option<u32>,
}

/// How an operation starts.
enum Start {
    /// Finished without a change (or refused).
    Now(Result<MetaDone, FsError>),
    /// Wait for the file's data operations first.
    Drain(u32),
    /// Commit this job.
    Commit(Pending, Job),
}

impl FileService {
    /// Queues a metadata operation; its result is reported by [`poll_meta`](Self::poll_meta)
    /// with `user_data`, once durable. Operations run one at a time in submission order;
    /// neither this call nor `poll_meta` waits for a metadata write or sync when the metadata
    /// thread runs ([`start_meta_thread`](Self::start_meta_thread)).
    pub fn submit_meta(&mut self, op: MetaOp, user_data: u64) {
        self.mq
            .queue
            .push_back(Item::Op(Origin::User(user_data), op));
        self.meta_advance(false);
    }

    /// Advances queued metadata operations and reports each finished one to
    /// `f(user_data, result)`, in submission order. Never blocks. Returns the number reported.
    pub fn poll_meta(&mut self, mut f: impl FnMut(u64, Result<MetaDone, FsError>)) -> usize {
        self.meta_advance(false);
        let mut n = 0;
        let mut k = 0;
        while k < self.mq.done.len() {
            if let Origin::User(ud) = self.mq.done[k].0 {
                let (_, r) = self.mq.done.remove(k).expect("in range");
                f(ud, r);
                n += 1;
            } else {
                k += 1;
            }
        }
        n
    }

    /// Metadata operations submitted and not yet reported by `poll_meta`.
    /// (The size changes of extending writes are not counted: their writes are, in
    /// [`inflight`](Self::inflight).)
    pub fn meta_pending(&self) -> usize {
        let active = self.mq.active.as_ref().is_some_and(|a| !a.is_extend());
        self.mq.queue.len() - self.mq.extends + usize::from(active) + self.mq.done.len()
    }

    /// True when `poll_meta` has something to do now: a result to report, an operation to
    /// start, a drained file, or a finished job. A caller that parks checks this after
    /// arming its wake-up (the metadata thread calls the waker after posting a result).
    pub fn meta_ready(&mut self) -> bool {
        if !self.mq.done.is_empty() {
            return true;
        }
        match &self.mq.active {
            None => !self.mq.queue.is_empty(),
            Some(Active::Draining { slot, .. }) => self.files_io[*slot as usize].inflight == 0,
            Some(Active::Committing(_)) => match &mut self.exec {
                Executor::Thread(t) => t.ready(),
                Executor::Inline(_) | Executor::Moved => true,
            },
        }
    }

    /// True if `id` names a file that a pending delete or shrink fenced: reads and writes of
    /// it are refused (`Busy`) until the change is done. A caller holds them back instead.
    pub fn is_fenced(&self, id: FileId) -> bool {
        self.file_slot(id)
            .is_ok_and(|s| self.files_io[s as usize].fenced)
    }

    /// Whether commits run on the metadata thread (which calls its waker after each).
    pub(crate) fn has_meta_thread(&self) -> bool {
        matches!(self.exec, Executor::Thread(_))
    }

    /// Moves metadata commits to their own thread ("dds-meta") with its own handle on the
    /// device, so that no metadata write or `fdatasync` runs on the caller's thread any more.
    /// `waker` is called each time a commit finished (to wake a parked data-path thread).
    /// Fails (and commits stay inline) if the device offers no second handle.
    pub fn start_meta_thread(&mut self, waker: impl Fn() + Send + 'static) -> Result<(), FsError> {
        if self.has_meta_thread() {
            return Ok(());
        }
        // Nothing is in flight: inline jobs complete within the call that starts them.
        let io = match self.dev.meta_io() {
            None => {
                return Err(FsError::InvalidConfig(
                    "the device offers no handle for a metadata thread".into(),
                ))
            }
            Some(Err(e)) => return Err(FsError::io("metadata handle on the device", e)),
            Some(Ok(io)) => io,
        };
        let c = match std::mem::replace(&mut self.exec, Executor::Moved) {
            Executor::Inline(c) => c,
            other => {
                self.exec = other;
                return Ok(());
            }
        };
        match crate::commit::MetaThread::start(c, io, Box::new(waker)) {
            Ok(t) => {
                self.exec = Executor::Thread(t);
                Ok(())
            }
            Err((c, e)) => {
                self.exec = Executor::Inline(c);
                Err(FsError::io("start the metadata thread", e))
            }
        }
    }

    /// Runs `op` to completion (the synchronous metadata calls), advancing any queued
    /// operations before it.
    pub(crate) fn meta_blocking(&mut self, op: MetaOp) -> Result<MetaDone, FsError> {
        self.mq.queue.push_back(Item::Op(Origin::Blocking, op));
        loop {
            self.meta_advance(true);
            if let Some(k) = self
                .mq
                .done
                .iter()
                .position(|(o, _)| *o == Origin::Blocking)
            {
                return self.mq.done.remove(k).expect("in range").1;
            }
        }
    }

    /// Advances the queue as far as it goes; with `block`, waits for drains and jobs until the
    /// queue is empty.
    fn meta_advance(&mut self, block: bool) {
        loop {
            match self.mq.active.take() {
                None => match self.mq.queue.pop_front() {
                    None => return,
                    Some(Item::Extend(slot)) => {
                        self.mq.extends -= 1;
                        self.files_io[slot as usize].extend_queued = false;
                        self.extends_start(slot);
                    }
                    Some(Item::Op(origin, op)) => self.op_start(origin, op),
                },
                Some(Active::Draining { origin, op, slot }) => {
                    if self.files_io[slot as usize].inflight == 0 {
                        // Drained: start again (still fenced: nothing new was submitted).
                        self.files_io[slot as usize].fenced = false;
                        self.meta_start(origin, op);
                    } else if block {
                        self.mq.active = Some(Active::Draining { origin, op, slot });
                        if let Err(e) = self.progress(true) {
                            self.mq.active = None;
                            self.files_io[slot as usize].fenced = false;
                            self.mq.done.push_back((origin, Err(e)));
                        }
                    } else {
                        self.mq.active = Some(Active::Draining { origin, op, slot });
                        return;
                    }
                }
                Some(Active::Committing(p)) => match self.job_result(block) {
                    Some(r) => self.meta_finish_queued(p, r),
                    None => {
                        self.mq.active = Some(Active::Committing(p));
                        return;
                    }
                },
            }
        }
    }

    /// The result of the job with the metadata thread: `None` if not finished and `block` is
    /// false.
    fn job_result(&mut self, block: bool) -> Option<JobResult> {
        match &mut self.exec {
            Executor::Thread(t) => t.result(block),
            Executor::Inline(_) | Executor::Moved => {
                unreachable!("inline jobs finish when submitted")
            }
        }
    }

    /// Starts a queued operation (no operation is active). A delete or shrink of a file with
    /// parked writes (their extend is queued behind it) first settles them: a delete refuses
    /// them (they come after it, so they find no file); a shrink, which must drain them,
    /// fences the file and lets their extend commit first, then comes back.
    fn op_start(&mut self, origin: Origin, op: MetaOp) {
        if let Some(s) = self.mq.prefenced.take() {
            // The shrink is back: it fences its file again as it starts (or not at all).
            self.files_io[s as usize].fenced = false;
        }
        match self.parked_behind(&op) {
            Some((slot, true)) => {
                self.refuse_parked(slot, 0, Refusal::Deleted);
                self.dequeue_extend(slot);
            }
            Some((slot, false)) => {
                if self.dequeue_extend(slot) {
                    self.files_io[slot as usize].fenced = true;
                    self.mq.prefenced = Some(slot);
                    self.mq.queue.push_front(Item::Op(origin, op));
                    self.extend_start(slot);
                    return;
                }
                debug_assert!(false, "parked writes without a queued extend");
            }
            None => {}
        }
        self.meta_start(origin, op);
    }

    /// `(file slot, is a delete)` when `op` deletes or shrinks a file that has parked writes.
    fn parked_behind(&self, op: &MetaOp) -> Option<(u32, bool)> {
        let (slot, delete) = match op {
            MetaOp::DeleteFile { id } => (self.file_slot(*id).ok()?, true),
            MetaOp::DeletePath { path } => (self.file_by_path(path).ok()?, true),
            MetaOp::Resize { id, size } => {
                let slot = self.file_slot(*id).ok()?;
                if *size >= self.meta.files[slot as usize].as_ref()?.size {
                    return None;
                }
                (slot, false)
            }
            _ => return None,
        };
        let parked = self.files_io[slot as usize].parked > 0;
        (parked && self.check_writable().is_ok()).then_some((slot, delete))
    }

    /// Takes file `slot`'s extend out of the queue; false if none was queued.
    fn dequeue_extend(&mut self, slot: u32) -> bool {
        let at = self
            .mq
            .queue
            .iter()
            .position(|it| matches!(it, Item::Extend(s) if *s == slot));
        let Some(k) = at else {
            return false;
        };
        self.mq.queue.remove(k);
        self.mq.extends -= 1;
        self.files_io[slot as usize].extend_queued = false;
        true
    }

    /// True when no metadata operation is active or queued.
    fn meta_idle(&self) -> bool {
        self.mq.active.is_none() && self.mq.queue.is_empty()
    }

    /// The job that grows file `slot` to `end` for a write submitted while the queue is idle
    /// (`None`: the queue is busy, the write waits for a queued extend). Prepared at submit,
    /// so that a refusal (`NoSpace`) is the submit's error; nothing changes until it starts.
    pub(crate) fn extend_now(
        &mut self,
        slot: u32,
        end: u64,
    ) -> Result<Option<(Pending, Job)>, FsError> {
        if !self.meta_idle() {
            return Ok(None);
        }
        self.size_job(Origin::Extend(slot), slot, end)
    }

    /// Parks write slot `i` of file `slot`, which ends at `end` past the file's size, until a
    /// size of at least `end` is durable: the extend committing now if it reaches `end`, else
    /// the file's queued extend (queued now if there is none), or `job` from
    /// [`extend_now`](Self::extend_now), which starts at once.
    pub(crate) fn park_write(
        &mut self,
        i: usize,
        slot: u32,
        end: u64,
        job: Option<(Pending, Job)>,
    ) {
        self.park(i);
        let fio = &mut self.files_io[slot as usize];
        fio.parked += 1;
        fio.want = fio.want.max(end);
        if let Some((p, job)) = job {
            fio.committing = end;
            self.commit_start(p, job);
        } else if fio.committing < end && !fio.extend_queued {
            fio.extend_queued = true;
            self.mq.extends += 1;
            self.mq.queue.push_back(Item::Extend(slot));
            self.meta_advance(false);
        }
    }

    /// Starts the extend of file `slot` (no operation is active): commits the size its parked
    /// writes need, or releases or refuses them when no commit is needed or possible.
    fn extend_start(&mut self, slot: u32) {
        if let Some((p, job)) = self.extend_prepare(slot) {
            let fio = &mut self.files_io[slot as usize];
            fio.committing = fio.want;
            self.commit_start(p, job);
        }
    }

    /// Starts the extend of file `slot` (no operation is active) together with the extends
    /// queued right behind it, each of another file: one `SET_SIZES` record, so one commit and
    /// one sync for all of them (a group commit), as long as the record stays within the
    /// log's largest record. The segments each picks are reserved while the next ones pick.
    fn extends_start(&mut self, first: u32) {
        let Some((p, job)) = self.extend_prepare(first) else {
            return;
        };
        let max = self.geom.max_record_len() as usize;
        let mut len = LOG_HEADER_LEN + SET_SIZES_FIXED + entry_len(&p.rec);
        self.meta.segmap.reserve(&job.zero_segs);
        let mut batch = vec![(first, p, job)];
        while let Some(&Item::Extend(s)) = self.mq.queue.front() {
            self.mq.queue.pop_front();
            self.mq.extends -= 1;
            self.files_io[s as usize].extend_queued = false;
            let Some((p, job)) = self.extend_prepare(s) else {
                continue;
            };
            if len + entry_len(&p.rec) > max {
                // Too large for one record: it starts the next commit.
                self.files_io[s as usize].extend_queued = true;
                self.mq.extends += 1;
                self.mq.queue.push_front(Item::Extend(s));
                break;
            }
            len += entry_len(&p.rec);
            self.meta.segmap.reserve(&job.zero_segs);
            batch.push((s, p, job));
        }
        for (_, _, job) in &batch {
            self.meta.segmap.unreserve(&job.zero_segs);
        }
        for (slot, _, _) in &batch {
            let fio = &mut self.files_io[*slot as usize];
            fio.committing = fio.want;
        }
        if batch.len() == 1 {
            let (_, p, job) = batch.pop().expect("one");
            self.commit_start(p, job);
            return;
        }
        let mut changes = Vec::with_capacity(batch.len());
        let mut zero_segs = Vec::new();
        let mut also = Vec::with_capacity(batch.len() - 1);
        for (slot, p, job) in batch {
            let OwnedRecord::SetSize {
                slot: s,
                gen,
                size,
                tail_dirty: false,
                keep,
                append,
            } = p.rec
            else {
                unreachable!("an extend is a SetSize without TAIL_DIRTY");
            };
            debug_assert!(job.tail.is_none() && p.fence.is_none());
            changes.push(SizeChange {
                slot: s,
                gen,
                size,
                keep,
                append,
            });
            zero_segs.extend(job.zero_segs);
            if slot != first {
                also.push(slot);
            }
        }
        let rec = OwnedRecord::SetSizes(changes);
        self.commit_start(
            Pending {
                origin: Origin::Extend(first),
                rec: rec.clone(),
                tail: false,
                fence: None,
                outcome: MetaDone::Done,
                also,
            },
            Job {
                zero_segs,
                rec,
                tail: None,
            },
        );
    }

    fn extend_prepare(&mut self, slot: u32) -> Option<(Pending, Job)> {
        let mut refused = false;
        loop {
            let fio = self.files_io[slot as usize];
            if fio.parked == 0 {
                return None;
            }
            let Some(f) = self.meta.files[slot as usize].as_ref() else {
                self.refuse_parked(slot, 0, Refusal::Deleted);
                return None;
            };
            if fio.want <= f.size {
                // Grown meanwhile (a resize).
                self.release_parked(slot);
                return None;
            }
            let free = u64::from(self.meta.segmap.free_count());
            let fit = (f.segs.len() as u64 + free) * self.geom.segment_size;
            match self.size_job(Origin::Extend(slot), slot, fio.want) {
                Ok(Some(pj)) => return Some(pj),
                Ok(None) => {
                    debug_assert!(false, "an extend to the current size");
                    self.release_parked(slot);
                    return None;
                }
                Err(FsError::NoSpace) if !refused => {
                    // The writes that fit in the free segments go ahead, the others fail.
                    refused = true;
                    self.refuse_parked(slot, fit, Refusal::NoSpace);
                }
                Err(FsError::NoSpace) => {
                    self.refuse_parked(slot, 0, Refusal::NoSpace);
                    return None;
                }
                Err(_) => {
                    self.refuse_parked(slot, 0, Refusal::Stopped);
                    return None;
                }
            }
        }
    }

    /// The extend of file `slot` finished: the parked writes its size covers go to the
    /// device; if it failed (the service stopped taking changes) they are refused.
    fn extend_done(&mut self, slot: u32, r: Result<MetaDone, FsError>) {
        self.files_io[slot as usize].committing = 0;
        match r {
            Ok(_) => self.release_parked(slot),
            Err(_) => self.refuse_parked(slot, 0, Refusal::Stopped),
        }
        let fio = &self.files_io[slot as usize];
        debug_assert!(
            fio.parked == 0 || fio.extend_queued,
            "parked writes without an extend"
        );
    }

    /// Moves the metadata queue on for parked writes; with `block`, also waits for the job
    /// with the metadata thread if there is one (then returns true).
    pub(crate) fn advance_for_parked(&mut self, block: bool) -> bool {
        self.meta_advance(false);
        if !block {
            return false;
        }
        match self.mq.active.take() {
            Some(Active::Committing(p)) => {
                let r = self.job_result(true).expect("a blocking result");
                self.meta_finish_queued(p, r);
                self.meta_advance(false);
                true
            }
            other => {
                self.mq.active = other;
                false
            }
        }
    }

    /// Starts `op` (no operation is active).
    fn meta_start(&mut self, origin: Origin, op: MetaOp) {
        debug_assert!(self.mq.active.is_none());
        match self.meta_prepare(origin, &op) {
            Err(e) => self.mq.done.push_back((origin, Err(e))),
            Ok(Start::Now(r)) => self.mq.done.push_back((origin, r)),
            Ok(Start::Drain(slot)) => {
                self.files_io[slot as usize].fenced = true;
                self.mq.active = Some(Active::Draining { origin, op, slot });
            }
            Ok(Start::Commit(p, job)) => self.commit_start(p, job),
        }
    }

    /// Fences what `p` fences and hands `job` to the committer (no operation is active).
    fn commit_start(&mut self, p: Pending, job: Job) {
        debug_assert!(self.mq.active.is_none());
        if let Some(s) = p.fence {
            self.files_io[s as usize].fenced = true;
        }
        match self.exec_submit(job) {
            Some(r) => self.meta_finish_queued(p, r),
            None => self.mq.active = Some(Active::Committing(p)),
        }
    }

    fn meta_finish_queued(&mut self, mut p: Pending, r: JobResult) {
        let origin = p.origin;
        let also = std::mem::take(&mut p.also);
        let r = self.meta_finish(p, r);
        match origin {
            Origin::Extend(slot) => {
                for s in also {
                    self.extend_done(s, r.clone());
                }
                self.extend_done(slot, r);
            }
            _ => self.mq.done.push_back((origin, r)),
        }
    }

    /// Applies a finished job's record (when durable), lifts its fence, returns its result.
    pub(crate) fn meta_finish(&mut self, p: Pending, r: JobResult) -> Result<MetaDone, FsError> {
        if let Some(s) = p.fence {
            self.files_io[s as usize].fenced = false;
        }
        let (applied, err) = match r {
            Ok(()) => (true, None),
            Err(e) => (e.applied, Some(e.err)),
        };
        if applied {
            let rec = p.rec.as_record();
            if let Err(e) = self.meta.apply(&rec) {
                debug_assert!(false, "durable record failed to apply: {e}");
                return Err(self.fail(FsError::Corrupt(e)));
            }
            if let OwnedRecord::CreateFile { slot, .. } = p.rec {
                self.next_file_slot = (slot + 1) % self.geom.max_files;
            }
            if p.tail && err.is_none() {
                if let OwnedRecord::SetSize { slot, .. } = p.rec {
                    if let Some(f) = self.meta.files[slot as usize].as_mut() {
                        f.tail_dirty = false;
                    }
                }
            }
        }
        match err {
            Some(e) => Err(self.fail(e)),
            None => Ok(p.outcome),
        }
    }

    /// Hands `job` to the committer: its result now if inline, `None` if it went to the
    /// metadata thread.
    fn exec_submit(&mut self, job: Job) -> Option<JobResult> {
        match &mut self.exec {
            Executor::Inline(c) => Some(c.run(&mut DevIo(&mut *self.dev), &job)),
            Executor::Thread(t) => {
                t.submit(job);
                None
            }
            Executor::Moved => unreachable!("the committer is always put back"),
        }
    }

    /// Validates `op` against the current state and says how it starts.
    fn meta_prepare(&mut self, origin: Origin, op: &MetaOp) -> Result<Start, FsError> {
        self.check_writable()?;
        let commit = |rec: OwnedRecord, outcome: MetaDone| {
            Start::Commit(
                Pending {
                    origin,
                    rec: rec.clone(),
                    tail: false,
                    fence: None,
                    outcome,
                    also: Vec::new(),
                },
                Job {
                    zero_segs: Vec::new(),
                    rec,
                    tail: None,
                },
            )
        };
        match op {
            MetaOp::CreateDir { path } => {
                let name = self.parse_dir_path(path)?.ok_or(FsError::Exists)?;
                if self.meta.name_taken(0, name) {
                    return Err(FsError::Exists);
                }
                let slot = (1..=self.geom.max_dirs)
                    .find(|&s| self.meta.dirs[s as usize].is_none())
                    .ok_or(FsError::TooManyDirs)?;
                let rec = OwnedRecord::CreateDir {
                    slot,
                    name: name.to_string(),
                };
                Ok(commit(rec, MetaDone::Done))
            }
            MetaOp::RemoveDir { path } => {
                let name = self.parse_dir_path(path)?.ok_or(FsError::InvalidPath)?;
                let slot = self.dir_slot(Some(name))?;
                if !self.meta.dirs[slot as usize]
                    .as_ref()
                    .expect("live")
                    .files
                    .is_empty()
                {
                    return Err(FsError::NotEmpty);
                }
                Ok(commit(OwnedRecord::RemoveDir { slot }, MetaDone::Done))
            }
            MetaOp::CreateFile { path } => {
                let (dir, name) = self.parse_file_path(path)?;
                if self.meta.name_taken(dir, name) {
                    return Err(FsError::Exists);
                }
                let max = self.geom.max_files;
                if self.meta.nfiles >= max {
                    return Err(FsError::TooManyFiles);
                }
                let start = self.next_file_slot % max;
                let slot = (0..max)
                    .map(|i| (start + i) % max)
                    .find(|&s| self.meta.files[s as usize].is_none())
                    .ok_or(FsError::TooManyFiles)?;
                let gen = self.meta.next_gen;
                let rec = OwnedRecord::CreateFile {
                    slot,
                    gen,
                    dir,
                    name: name.to_string(),
                };
                Ok(commit(
                    rec,
                    MetaDone::Created(FileId(make_file_id(slot, gen))),
                ))
            }
            MetaOp::DeleteFile { id } => {
                let slot = self.file_slot(*id)?;
                Ok(self.delete_start(origin, slot))
            }
            MetaOp::DeletePath { path } => {
                let slot = self.file_by_path(path)?;
                Ok(self.delete_start(origin, slot))
            }
            MetaOp::Rename { from, to } => {
                let slot = self.file_by_path(from)?;
                let (dir, name) = self.parse_file_path(to)?;
                let f = self.meta.files[slot as usize].as_ref().expect("live");
                if f.dir == dir && f.name == name {
                    return Ok(Start::Now(Ok(MetaDone::Done)));
                }
                if self.meta.name_taken(dir, name) {
                    return Err(FsError::Exists);
                }
                let rec = OwnedRecord::RenameFile {
                    slot,
                    gen: f.gen,
                    dir,
                    name: name.to_string(),
                };
                Ok(commit(rec, MetaDone::Done))
            }
            MetaOp::Resize { id, size } => {
                let slot = self.file_slot(*id)?;
                if *size > self.geom.max_file_size() {
                    return Err(FsError::OutOfRange);
                }
                let cur = self.meta.files[slot as usize].as_ref().expect("live").size;
                if *size < cur && self.files_io[slot as usize].inflight > 0 {
                    return Ok(Start::Drain(slot));
                }
                Ok(match self.size_job(origin, slot, *size)? {
                    None => Start::Now(Ok(MetaDone::Done)),
                    Some((p, job)) => Start::Commit(p, job),
                })
            }
        }
    }

    fn delete_start(&mut self, origin: Origin, slot: u32) -> Start {
        if self.files_io[slot as usize].inflight > 0 {
            return Start::Drain(slot);
        }
        let gen = self.meta.files[slot as usize].as_ref().expect("live").gen;
        let rec = OwnedRecord::DeleteFile { slot, gen };
        Start::Commit(
            Pending {
                origin,
                rec: rec.clone(),
                tail: false,
                fence: Some(slot),
                outcome: MetaDone::Done,
                also: Vec::new(),
            },
            Job {
                zero_segs: Vec::new(),
                rec,
                tail: None,
            },
        )
    }

    /// The job that changes file `slot`'s size to `new_size` (`None`: already that size).
    /// Growth picks free segments (zeroed by the job before they are attached); a shrink
    /// (the file has no I/O in flight) is fenced and zeroes the cut tail after its record.
    pub(crate) fn size_job(
        &mut self,
        origin: Origin,
        slot: u32,
        new_size: u64,
    ) -> Result<Option<(Pending, Job)>, FsError> {
        self.check_writable()?;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let (gen, size, nseg) = (f.gen, f.size, f.segs.len() as u32);
        let hint = f.segs.last().map_or(0, |&s| s + 1);
        debug_assert!(new_size <= self.geom.max_file_size());
        let new_nseg = new_size.div_ceil(seg) as u32;
        if new_size == size {
            return Ok(None);
        }
        let mut zero_segs = Vec::new();
        let mut tail = None;
        let mut fence = None;
        let rec = if new_nseg > nseg {
            if !self
                .meta
                .segmap
                .pick_free(new_nseg - nseg, hint, &mut zero_segs)
            {
                return Err(FsError::NoSpace);
            }
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: zero_segs.clone(),
            }
        } else if new_size < size {
            debug_assert_eq!(self.files_io[slot as usize].inflight, 0);
            fence = Some(slot);
            let end = size.min(u64::from(new_nseg) * seg);
            if new_size < end {
                tail = Some((slot, new_size, end));
            }
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: true,
                keep: new_nseg,
                append: Vec::new(),
            }
        } else {
            OwnedRecord::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: Vec::new(),
            }
        };
        Ok(Some((
            Pending {
                origin,
                rec: rec.clone(),
                tail: true,
                fence,
                outcome: MetaDone::Done,
                also: Vec::new(),
            },
            Job {
                zero_segs,
                rec,
                tail,
            },
        )))
    }
}

/// Bytes of `rec`'s entry in a `SET_SIZES` record (`rec` is an extend's `SetSize`).
fn entry_len(rec: &OwnedRecord) -> usize {
    match rec {
        OwnedRecord::SetSize { append, .. } => SizeChange::entry_len(append.len()),
        _ => unreachable!("an extend is a SetSize"),
    }
}
