//! The buffer pool's frames: asynchronous write-backs (a bounded number in flight, the rest
//! queued) and CLOCK eviction of clean frames with no write in flight.

use dds_storage::aio::SubmitError;

use super::{tag, PageService, PAGES, READS_MAX, TAG_PAGE_WRITE};

impl PageService {
    /// Issues queued write-backs while there is room.
    pub(super) fn pump_writes(&mut self) {
        while self.writes < self.writes_max() {
            let Some(f) = self.write_queue.pop_front() else {
                break;
            };
            self.frames[f].queued = false;
            if !self.write_back(f) {
                break;
            }
        }
    }

    /// Page write-backs in flight at most: a quarter of the buffer pool, so that the replay
    /// and the reads always find frames to use.
    pub(super) fn writes_max(&self) -> usize {
        (self.frames.len() / 4).clamp(1, READS_MAX)
    }

    /// Issues the write-back of frame `f` (the page's bytes are taken at once). False when
    /// there is no place for it now (it waits in the write queue). A frame with a write in
    /// flight stays dirty and is written again when that write completes.
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
        let ps = self.cfg.page_size as u64;
        let t = tag(TAG_PAGE_WRITE, f as u64);
        match self.io.write(PAGES, fr.page * ps, &fr.data, t) {
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
        self.writes += 1;
        self.stats.page_writes += 1;
        if !self.recache.is_empty() {
            // The write tells the DPU the page's new version (cache-on-write): an older one
            // must not follow it.
            let page = self.frames[f].page;
            self.recache.retain(|r| r.0 != page);
        }
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
        self.replay_blocked = false;
        if !ok {
            let page = fr.page;
            self.fail(anyhow::anyhow!("writing page {page} back failed"));
            return;
        }
        if fr.dirty {
            self.write_back(f);
        }
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
