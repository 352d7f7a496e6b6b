//! The metadata committer: makes metadata changes durable (docs/on-disk-format.md §5).
//!
//! A [`Job`] is one prepared change: segments to zero before it, its log record, and a tail
//! to zero after it (a shrink). The [`Committer`] owns the log position, the checkpoint
//! slots and a *mirror* of the metadata state: the state as of the last durable record, which
//! it needs to write a checkpoint when the log is full and to find the segments of a tail it
//! zeroes. It applies every record it made durable to the mirror; the file service applies
//! the same records, in the same order, to its own state once each job has completed, so both
//! are equal whenever no job is in flight.
//!
//! The committer runs either inline on the caller's thread ([`Executor::Inline`]) or on its
//! own metadata thread ([`MetaThread`]) with its own handle on the device
//! ([`Device::meta_io`](crate::device::Device::meta_io)): then the thread driving the data
//! path hands it a job and goes on polling; the job's `pwrite` and `fdatasync` block only the
//! metadata thread.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::align::{align_down, align_up, AlignedBuf};
use crate::device::MetaIo;
use crate::error::FsError;
use crate::journal::Journal;
use crate::layout::Geometry;
use crate::meta::{FileRec, MetaState, OwnedRecord};

/// One metadata change to make durable.
#[derive(Debug)]
pub(crate) struct Job {
    /// Fresh segments to zero (and sync) before the record attaches them.
    pub zero_segs: Vec<u32>,
    pub rec: OwnedRecord,
    /// After the record: zero bytes `[from, to)` of file `slot` (a shrink's cut tail), then
    /// sync.
    pub tail: Option<(u32, u64, u64)>,
}

/// A job that failed. `applied`: its record is durable (and in the mirror) although a later
/// step failed; the file service then applies it too before refusing further changes.
#[derive(Debug)]
pub(crate) struct JobError {
    pub applied: bool,
    pub err: FsError,
}

pub(crate) type JobResult = Result<(), JobError>;

/// Owner of the metadata log and checkpoints.
pub(crate) struct Committer {
    geom: Geometry,
    journal: Journal,
    mirror: MetaState,
    /// One block for the read-modify-write of a partial tail block.
    block_scratch: AlignedBuf,
}

impl Committer {
    pub(crate) fn new(geom: Geometry, journal: Journal, mirror: MetaState, align: usize) -> Self {
        let block_scratch = AlignedBuf::new(geom.block_size as usize, align);
        Committer {
            geom,
            journal,
            mirror,
            block_scratch,
        }
    }

    /// Runs `job`: zero its new segments and sync, append its record (checkpointing first if
    /// the log is full) and sync, apply it to the mirror, zero its tail and sync.
    pub(crate) fn run(&mut self, io: &mut dyn MetaIo, job: &Job) -> JobResult {
        let before = |err| JobError {
            applied: false,
            err,
        };
        if !job.zero_segs.is_empty() {
            self.zero_segments(io, &job.zero_segs).map_err(before)?;
        }
        let rec = job.rec.as_record();
        self.journal
            .append(io, &self.geom, &self.mirror, &rec)
            .map_err(before)?;
        if let Err(e) = self.mirror.apply(&rec) {
            // Validated before logging; reaching this is a bug. Stop changing anything.
            debug_assert!(false, "durable record failed to apply: {e}");
            return Err(before(FsError::Corrupt(e)));
        }
        if let Some((slot, from, to)) = job.tail {
            let r = self.zero_file_range(io, slot, from, to).and_then(|()| {
                io.sync()
                    .map_err(|e| FsError::io("sync after tail zeroing", e))
            });
            if let Err(err) = r {
                return Err(JobError { applied: true, err });
            }
        }
        if let OwnedRecord::SetSize {
            slot,
            tail_dirty: true,
            ..
        } = job.rec
        {
            // The tail is zero (or there was none to zero): the flag reaches disk cleared
            // with the next checkpoint.
            if let Some(f) = self.mirror.files[slot as usize].as_mut() {
                f.tail_dirty = false;
            }
        }
        Ok(())
    }

    /// Zeroes freshly picked segments and makes that durable (before they are attached).
    fn zero_segments(&mut self, io: &mut dyn MetaIo, segs: &[u32]) -> Result<(), FsError> {
        let seg = self.geom.segment_size;
        let mut i = 0;
        while i < segs.len() {
            // Merge runs of consecutive segments into one zeroing call.
            let mut j = i + 1;
            while j < segs.len() && segs[j] == segs[j - 1] + 1 {
                j += 1;
            }
            io.zero_sync(u64::from(segs[i]) * seg, (j - i) as u64 * seg)
                .map_err(|e| FsError::io("zero new segments", e))?;
            i = j;
        }
        io.sync()
            .map_err(|e| FsError::io("sync zeroed segments", e))
    }

    /// Zeroes bytes `[from, to)` of file `slot` (inside its allocated segments, as the mirror
    /// knows them), without syncing. Nothing reads or writes the file meanwhile.
    pub(crate) fn zero_file_range(
        &mut self,
        io: &mut dyn MetaIo,
        slot: u32,
        from: u64,
        to: u64,
    ) -> Result<(), FsError> {
        let bs = u64::from(self.geom.block_size);
        let seg = self.geom.segment_size;
        let f = self.mirror.files[slot as usize].as_ref().expect("live");
        let alloc_end = f.segs.len() as u64 * seg;
        assert!(
            from <= to && to <= alloc_end,
            "zero range outside the allocation"
        );
        let dev_off =
            |f: &FileRec, off: u64| u64::from(f.segs[(off / seg) as usize]) * seg + off % seg;
        let mut from = from;
        if !from.is_multiple_of(bs) {
            let blk = align_down(from, bs);
            let d = dev_off(f, blk);
            let scratch = self.block_scratch.as_mut_slice();
            io.read_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing read", e))?;
            let stop = to.min(blk + bs);
            scratch[(from - blk) as usize..(stop - blk) as usize].fill(0);
            io.write_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing write", e))?;
            from = blk + bs;
        }
        let to = align_up(to, bs).min(alloc_end);
        while from < to {
            let chunk = (to - from).min(seg - from % seg);
            io.zero_sync(dev_off(f, from), chunk)
                .map_err(|e| FsError::io("tail zeroing", e))?;
            from += chunk;
        }
        Ok(())
    }

    /// Clears every `TAIL_DIRTY` flag of the mirror (after recovery re-zeroed the tails).
    pub(crate) fn clear_tail_flags(&mut self) {
        for f in self.mirror.files.iter_mut().flatten() {
            f.tail_dirty = false;
        }
    }
}

/// Where jobs run.
pub(crate) enum Executor {
    /// On the caller's thread, within the call that submits them.
    Inline(Box<Committer>),
    /// On the metadata thread.
    Thread(MetaThread),
    /// Only while switching from one to the other.
    Moved,
}

/// The committer on its own thread.
pub(crate) struct MetaThread {
    jobs: Option<mpsc::Sender<Job>>,
    results: mpsc::Receiver<JobResult>,
    /// A result received by [`MetaThread::ready`] and not yet taken.
    stash: Option<JobResult>,
    thread: Option<JoinHandle<()>>,
}

impl MetaThread {
    /// Starts the thread. `waker` is called after each result is posted (the owner of the
    /// data path may be parked).
    pub(crate) fn start(
        committer: Box<Committer>,
        mut io: Box<dyn MetaIo>,
        waker: Box<dyn Fn() + Send>,
    ) -> Result<MetaThread, (Box<Committer>, std::io::Error)> {
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let (res_tx, res_rx) = mpsc::channel::<JobResult>();
        // The committer is sent once the thread exists, so a failed spawn hands it back.
        let (c_tx, c_rx) = mpsc::channel::<Box<Committer>>();
        let spawned = std::thread::Builder::new()
            .name("dds-meta".into())
            .spawn(move || {
                let Ok(mut committer) = c_rx.recv() else {
                    return;
                };
                while let Ok(job) = job_rx.recv() {
                    let r = committer.run(&mut *io, &job);
                    if res_tx.send(r).is_err() {
                        break;
                    }
                    waker();
                }
            });
        let thread = match spawned {
            Ok(t) => t,
            Err(e) => return Err((committer, e)),
        };
        // The thread waits for it before anything else, so this send finds its receiver.
        let _ = c_tx.send(committer);
        Ok(MetaThread {
            jobs: Some(job_tx),
            results: res_rx,
            stash: None,
            thread: Some(thread),
        })
    }

    /// Hands `job` to the thread. A thread that is gone reports an I/O error as the result.
    pub(crate) fn submit(&mut self, job: Job) {
        let sent = self.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            self.stash = Some(Err(JobError {
                applied: false,
                err: FsError::Io("the metadata thread is gone".into()),
            }));
        }
    }

    /// True when a result can be taken without blocking.
    pub(crate) fn ready(&mut self) -> bool {
        if self.stash.is_none() {
            match self.results.try_recv() {
                Ok(r) => self.stash = Some(r),
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => {
                    self.stash = Some(Err(JobError {
                        applied: false,
                        err: FsError::Io("the metadata thread is gone".into()),
                    }))
                }
            }
        }
        self.stash.is_some()
    }

    /// The result of the job in flight: `None` if not finished and `block` is false.
    pub(crate) fn result(&mut self, block: bool) -> Option<JobResult> {
        if self.ready() {
            return self.stash.take();
        }
        if !block {
            return None;
        }
        Some(self.results.recv().unwrap_or_else(|_| {
            Err(JobError {
                applied: false,
                err: FsError::Io("the metadata thread is gone".into()),
            })
        }))
    }
}

impl Drop for MetaThread {
    fn drop(&mut self) {
        // Closing the job channel ends the thread after the job it may be running.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
