//! The buffer pool's frames: asynchronous write-backs (a bounded number in flight, the rest
//! queued) and CLOCK eviction of clean frames with no write in flight.

use dds_storage::aio::SubmitError;

use super::{tag, PageService, PAGES, READS_MAX, TAG_PAGE_WRITE};
use crate::page;

impl PageService {
    /// Issues queued write-backs while there is room.
    pub(super) fn pump_writes(&mut self) {
        while self.writes < self.writes_max() {
            let Some(f) = self.write_queue.pop_front() else {
                break;
            };
            self.frames[f].queued = false;
            let stalled = self.stalled.len();
            if !self.write_back(f) && self.stalled.len() == stalled {
                // No place for it now (it is back in the queue).
                break;
            }
        }
    }

    /// Page write-backs in flight at most: a quarter of the buffer pool, so that the replay
    /// and the reads always find frames to use.
    pub(super) fn writes_max(&self) -> usize {
        (self.frames.len() / 4).clamp(1, READS_MAX)
    }

    /// Issues the write-back of frame `f` as a new image of its page (the page's bytes are
    /// taken at once), to a slot `choose_slot` gives. False when there is no place for it now
    /// (it waits in the write queue, or, with no free slot, until a completion). A frame with
    /// a write in flight stays dirty and is written again when that write completes.
    pub(super) fn write_back(&mut self, f: usize) -> bool {
        let max = self.writes_max();
        let fr = &mut self.frames[f];
        if !fr.dirty || fr.writing || fr.queued {
            return true;
        }
        if self.writes >= max {
            fr.queued = true;
            self.write_queue.push_back(f);
            return false;
        }
        let (id, lsn) = (fr.page, page::lsn(&fr.data));
        let s = match self.choose_slot(id, lsn) {
            Some(Some(s)) => s,
            Some(None) => {
                // That image is on storage (or being written) already.
                self.frames[f].dirty = false;
                return true;
            }
            None => {
                let fr = &mut self.frames[f];
                fr.queued = true;
                self.stalled.push(f);
                return false;
            }
        };
        if !self.dpu_forget(id, s) {
            let fr = &mut self.frames[f];
            fr.queued = true;
            self.write_queue.push_front(f);
            return false;
        }
        let next = self.stamp(id, lsn);
        let fr = &mut self.frames[f];
        page::stamp_next(&mut fr.data, next);
        let off = page::slot_offset(id, s as usize, self.cfg.page_size);
        let t = tag(TAG_PAGE_WRITE, f as u64);
        match self.io.write(PAGES, off, &fr.data, t) {
            Ok(()) => {}
            Err(SubmitError::Busy) => {
                fr.queued = true;
                self.write_queue.push_front(f);
                return false;
            }
            Err(SubmitError::Failed(_)) => self.failed.push((t, None)),
        }
        fr.dirty = false;
        fr.writing = true;
        fr.slot = s;
        self.slot_writing(id, s, lsn, next);
        self.writes += 1;
        self.stats.page_writes += 1;
        true
    }

    /// A write-back of frame `f` completed.
    pub(super) fn write_done(&mut self, f: usize, ok: bool) {
        let Some(fr) = self.frames.get_mut(f).filter(|fr| fr.writing) else {
            tracing::error!(frame = f, "a completion for a write not in flight");
            return;
        };
        fr.writing = false;
        self.writes -= 1;
        let (id, s) = (fr.page, fr.slot);
        self.slot_written(id, s, ok);
        if !ok {
            self.fail(anyhow::anyhow!("writing page {id} back failed"));
            return;
        }
        if self.frames[f].dirty {
            self.write_back(f);
        }
    }

    /// Frames whose write-back found no free slot go back to the write queue (a completion
    /// may have freed one).
    pub(super) fn unstall(&mut self) {
        for f in self.stalled.drain(..) {
            self.write_queue.push_back(f);
        }
    }

    /// Brings a page with no image into the pool (the empty page with its chain applied);
    /// false when every frame is busy.
    pub(super) fn materialize_empty(&mut self, id: u64) -> bool {
        let Some(f) = self.victim() else {
            return false;
        };
        let m = &mut self.meta[id as usize];
        m.materialize = false;
        let fr = &mut self.frames[f];
        fr.data.fill(0);
        page::seal(&mut fr.data, id, 0);
        let lsn = super::history::roll_forward(&mut fr.data, id, &m.chain, u64::MAX);
        fr.page = id;
        fr.used = true;
        fr.dirty = lsn > 0;
        self.index.insert(id, f);
        if self.frames[f].dirty {
            self.write_back(f);
        }
        true
    }

    /// A free frame (CLOCK): an unused clean frame with no write in flight. A dirty one met
    /// on the way is written back (it is free once that completes). `None`: every frame is
    /// busy now.
    pub(super) fn victim(&mut self) -> Option<usize> {
        let n = self.frames.len();
        for _ in 0..2 * n + 1 {
            let f = self.hand;
            self.hand = (self.hand + 1) % n;
            let fr = &mut self.frames[f];
            if fr.page == u64::MAX {
                return Some(f);
            }
            if fr.writing || fr.queued {
                continue;
            }
            if fr.used {
                fr.used = false;
                continue;
            }
            if fr.dirty {
                self.write_back(f);
                continue;
            }
            let old = fr.page;
            fr.page = u64::MAX;
            self.index.remove(&old);
            return Some(f);
        }
        None
    }
}
