//! Extending writes: the size changes of writes that end past their file's size, as internal
//! operations of the metadata queue (`metaq.rs`). The data-path side (parking a write,
//! releasing or refusing parked writes) is in `io/parked.rs`.
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

use super::metaq::{Active, Item, MetaDone, MetaOp, Origin, Pending};
use super::FileService;
use crate::commit::Job;
use crate::error::FsError;
use crate::io::Refusal;
use crate::layout::LOG_HEADER_LEN;
use crate::meta::{OwnedRecord, SizeChange, SET_SIZES_FIXED};

impl FileService {
    /// `(file slot, is a delete)` when `op` deletes or shrinks a file that has parked writes.
    pub(super) fn parked_behind(&self, op: &MetaOp) -> Option<(u32, bool)> {
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
    pub(super) fn dequeue_extend(&mut self, slot: u32) -> bool {
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
    pub(super) fn extend_start(&mut self, slot: u32) {
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
    pub(super) fn extends_start(&mut self, first: u32) {
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

    pub(super) fn extend_prepare(&mut self, slot: u32) -> Option<(Pending, Job)> {
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
    pub(super) fn extend_done(&mut self, slot: u32, r: Result<MetaDone, FsError>) {
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
}

/// Bytes of `rec`'s entry in a `SET_SIZES` record (`rec` is an extend's `SetSize`).
fn entry_len(rec: &OwnedRecord) -> usize {
    match rec {
        OwnedRecord::SetSize { append, .. } => SizeChange::entry_len(append.len()),
        _ => unreachable!("an extend is a SetSize"),
    }
}
