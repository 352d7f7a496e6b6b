//! Page reads: a GetPage (or the replay) wants a page that is not in the buffer pool; one
//! read per page, shared by every GetPage waiting for it, issued while there is room and
//! installed in the pool when it completes.

use anyhow::{bail, Result};
use dds_server::Completions;
use dds_storage::aio::SubmitError;

use super::{
    answer, header, tag, PageRead, PageService, PageSession, Waiter, PAGES, READS_MAX, TAG_READ,
};
use crate::page;
use crate::proto::status;

impl PageService {
    /// Adds a GetPage (or, without a waiter, the replay) to its page's read, issuing the read
    /// if there is none.
    pub(super) fn want(&mut self, page: u64, w: Option<Waiter>) {
        if let Some(&slot) = self.reading.get(&page) {
            if let Some(w) = w {
                self.slots.state_mut(slot).waiters.push(w);
            }
            return;
        }
        let ps = self.cfg.page_size;
        let slot = self.slots.take_place(|| {
            let r = PageRead {
                page,
                waiters: Vec::new(),
                for_replay: false,
            };
            (r, vec![0u8; ps].into_boxed_slice())
        });
        let r = self.slots.state_mut(slot);
        r.page = page;
        r.for_replay = w.is_none();
        if r.for_replay {
            self.replay_reads += 1;
        }
        r.waiters.extend(w);
        self.reading.insert(page, slot);
        if self.slots.issued() < READS_MAX && self.queued.is_empty() {
            self.issue(slot);
        } else {
            self.queued.push_back(slot);
        }
    }

    /// Issues a page read; false when the storage library has no place for it now (it then
    /// waits at the head of the queue).
    pub(super) fn issue(&mut self, slot: u32) -> bool {
        let off = self.slots.state(slot).page * self.cfg.page_size as u64;
        let tag = tag(TAG_READ, u64::from(slot));
        match self.slots.issue(self.io.as_mut(), PAGES, slot, off, tag) {
            Ok(()) => {}
            Err(SubmitError::Busy) => {
                self.queued.push_front(slot);
                return false;
            }
            Err(SubmitError::Failed(_)) => {
                self.slots.mark_issued(slot);
                self.failed.push((tag, None));
            }
        }
        true
    }

    /// Issues waiting reads while there is room.
    pub(super) fn pump_reads(&mut self) {
        while self.slots.issued() < READS_MAX {
            let Some(slot) = self.queued.pop_front() else {
                break;
            };
            if !self.issue(slot) {
                break;
            }
        }
    }

    /// A page read completed: the page enters the buffer pool and every GetPage waiting for it
    /// is answered.
    pub(super) fn finish_read(
        &mut self,
        slot: u32,
        res: Option<u32>,
        done: &mut Completions<'_, PageSession>,
    ) {
        if !self.slots.finish(slot) {
            tracing::error!(slot, "a completion for a read not in flight");
            return;
        }
        let r = self.slots.state_mut(slot);
        let for_replay = std::mem::take(&mut r.for_replay);
        if for_replay {
            self.replay_reads -= 1;
        }
        self.replay_blocked = false;
        let id = r.page;
        // A page is read only while it is not in the pool, and it leaves the pool only once
        // its last write-back completed: a read never overlaps a write of its page.
        debug_assert!(!self.index.contains_key(&id));
        let page = match res {
            None => {
                tracing::error!(page = id, "page read failed");
                Err(status::IO_ERROR)
            }
            Some(n) => self.install(slot, n as usize, !for_replay).map_err(|e| {
                tracing::error!(page = id, error = %format!("{e:#}"), "page read failed");
                status::IO_ERROR
            }),
        };
        let mut waiters = std::mem::take(&mut self.slots.state_mut(slot).waiters);
        for w in &waiters {
            let Some((s, buf)) = done.fill(w.conn, w.ticket) else {
                continue;
            };
            s.waiting -= 1;
            let resume = s.read_blocked && s.waiting == 0;
            if resume {
                s.read_blocked = false;
            }
            match page {
                Ok(Some(f)) => answer(buf, &self.frames[f].data, w.req_id, w.lsn),
                Ok(None) => answer(buf, self.slots.buf(slot), w.req_id, w.lsn),
                Err(st) => header(buf, st, w.req_id, 0),
            }
            self.stats.deferred += 1;
            if resume {
                done.resume(w.conn);
            }
        }
        waiters.clear();
        self.slots.state_mut(slot).waiters = waiters;
        self.reading.remove(&id);
        self.slots.release(slot);
    }

    /// Puts the page read into `slot` (`n` bytes) into a frame of the buffer pool, and, with
    /// `recache`, tells the DPU where it is again (a page read for the replay is about to
    /// change: its write-back tells the DPU). `None`: every frame is busy (written back); the
    /// page is answered from the read's buffer and read again when needed.
    pub(super) fn install(&mut self, slot: u32, n: usize, recache: bool) -> Result<Option<usize>> {
        let id = self.slots.state(slot).page;
        let buf = self.slots.buf_mut(slot);
        let n = n.min(buf.len());
        buf[n..].fill(0);
        let Some(lsn) = page::from_storage(buf, id) else {
            bail!("page {id} is damaged on storage (checksum)");
        };
        self.stats.page_reads += 1;
        if self.cfg.offload && recache && lsn > 0 {
            // The read dropped the page from the DPU's cache; it is unchanged on storage.
            let ps = self.cfg.page_size;
            self.recache.push((id, id * ps as u64, ps as u32, lsn));
        }
        let Some(f) = self.victim() else {
            return Ok(None);
        };
        std::mem::swap(&mut self.frames[f].data, self.slots.buf_mut(slot));
        let fr = &mut self.frames[f];
        fr.page = id;
        fr.dirty = false;
        fr.used = true;
        self.index.insert(id, f);
        Ok(Some(f))
    }
}
