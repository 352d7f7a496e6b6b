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
//! Here: the queue and its operations, and how a job's result is applied. How each operation
//! is validated and prepared is in `prepare.rs`; the size changes of extending writes, which
//! run through the same queue, in `extend.rs`.

use std::collections::VecDeque;

use super::FileService;
use crate::commit::{Executor, Job, JobResult};
use crate::device::DevIo;
use crate::error::FsError;
use crate::io::Refusal;
use crate::meta::OwnedRecord;
use crate::types::FileId;

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
pub(super) enum Item {
    Op(Origin, MetaOp),
    /// Grow file slot `.0` to cover its parked writes (to `FileIo::want` as it is when the
    /// extend starts: writes parked meanwhile are covered too).
    Extend(u32),
}

/// A committed change waiting for its job's result.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(super) origin: Origin,
    pub(super) rec: OwnedRecord,
    /// The job zeroes a cut tail: clear `TAIL_DIRTY` once applied.
    pub(super) tail: bool,
    /// The file fenced for this change.
    pub(super) fence: Option<u32>,
    pub(super) outcome: MetaDone,
    /// Further files whose extends this change commits too (a `SET_SIZES` group commit; the
    /// origin is the first file's extend).
    pub(super) also: Vec<u32>,
}

#[derive(Debug)]
pub(super) enum Active {
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
    pub(super) queue: VecDeque<Item>,
    pub(super) active: Option<Active>,
    pub(super) done: VecDeque<(Origin, Result<MetaDone, FsError>)>,
    /// `Item::Extend` entries in `queue` (at most one per file).
    pub(super) extends: usize,
    /// The file fenced for the shrink at the head of the queue while that file's extend,
    /// moved ahead of it, commits.
    pub(super) prefenced: Option<u32>,
}

/// How an operation starts.
pub(super) enum Start {
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
    pub(super) fn meta_advance(&mut self, block: bool) {
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
    pub(super) fn job_result(&mut self, block: bool) -> Option<JobResult> {
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
    pub(super) fn op_start(&mut self, origin: Origin, op: MetaOp) {
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

    /// True when no metadata operation is active or queued.
    pub(super) fn meta_idle(&self) -> bool {
        self.mq.active.is_none() && self.mq.queue.is_empty()
    }

    /// Starts `op` (no operation is active).
    pub(super) fn meta_start(&mut self, origin: Origin, op: MetaOp) {
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
    pub(super) fn commit_start(&mut self, p: Pending, job: Job) {
        debug_assert!(self.mq.active.is_none());
        if let Some(s) = p.fence {
            self.files_io[s as usize].fenced = true;
        }
        match self.exec_submit(job) {
            Some(r) => self.meta_finish_queued(p, r),
            None => self.mq.active = Some(Active::Committing(p)),
        }
    }

    pub(super) fn meta_finish_queued(&mut self, mut p: Pending, r: JobResult) {
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
    pub(super) fn exec_submit(&mut self, job: Job) -> Option<JobResult> {
        match &mut self.exec {
            Executor::Inline(c) => Some(c.run(&mut DevIo(&mut *self.dev), &job)),
            Executor::Thread(t) => {
                t.submit(job);
                None
            }
            Executor::Moved => unreachable!("the committer is always put back"),
        }
    }

    pub(crate) fn check_writable(&self) -> Result<(), FsError> {
        match &self.failed {
            Some(e) => Err(FsError::Io(format!(
                "file service stopped after a metadata I/O error ({e}); reopen the device"
            ))),
            None => Ok(()),
        }
    }

    pub(super) fn fail(&mut self, e: FsError) -> FsError {
        tracing::error!(error = %e, "metadata I/O failed; refusing further changes");
        self.failed = Some(e.to_string());
        e
    }
}
