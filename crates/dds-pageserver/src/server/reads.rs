//! Image reads: a GetPage, a materialization or a checkpoint wants an image of a page that is
//! not in the buffer pool; one read per (page, slot), shared by everything waiting for it,
//! issued while there is room. When it completes, each waiting GetPage is answered with the
//! image rolled forward to its LSN, a read of the page's newest image brings the page into
//! the pool, and a checkpoint's image is written.

use dds_server::Completions;
use dds_storage::aio::SubmitError;

use super::history::{reply_version, roll_forward};
use super::{
    answer, header, tag, PageRead, PageService, PageSession, Purpose, Waiter, ALL, PAGES,
    READS_MAX, SLOTS, TAG_READ,
};
use crate::page;
use crate::proto::status;

/// How a GetPage at a read point is answered.
pub(super) enum Plan {
    /// From the buffer pool's frame.
    Frame(usize),
    /// From the empty image and the chain.
    Empty,
    /// From an image read (a slot, or `ALL` while the page's slots are not known).
    Read(u8),
    /// No image the chain completes: storage lost one (answered `IO_ERROR`).
    Lost,
}

impl PageService {
    /// How a GetPage of `page` at `r` is answered.
    pub(super) fn plan(&self, page: u64, r: u64) -> Plan {
        if let Some(&f) = self.index.get(&page) {
            if page::lsn(&self.frames[f].data) <= r {
                return Plan::Frame(f);
            }
        }
        let m = &self.meta[page as usize];
        if !m.known {
            return Plan::Read(ALL);
        }
        match m.pick(r) {
            Some(s) => Plan::Read(s),
            None if m.floor == 0 => Plan::Empty,
            None => {
                tracing::error!(
                    page,
                    lsn = r,
                    "no image of the page holds its dropped records"
                );
                Plan::Lost
            }
        }
    }

    /// Adds a GetPage (or, without a waiter, a materialization or checkpoint) to the read of
    /// `slot` of `page`, issuing the read if there is none.
    pub(super) fn want(&mut self, page: u64, slot: u8, w: Option<Waiter>, purpose: Purpose) {
        if let Some(&p) = self.reading.get(&(page, slot)) {
            let r = self.slots.state_mut(p);
            r.waiters.extend(w);
            if r.purpose == Purpose::Get && purpose != Purpose::Get {
                r.purpose = purpose;
                self.replay_reads += 1;
            } else {
                // The read serves another purpose: the next checkpoint (or record) asks again.
                match purpose {
                    Purpose::At(_) => self.meta[page as usize].imaging = false,
                    Purpose::Latest => self.meta[page as usize].materialize = false,
                    Purpose::Get => {}
                }
            }
            return;
        }
        let ps = self.cfg.page_size;
        let p = self.slots.take_place(|| {
            let r = PageRead {
                page,
                slot,
                waiters: Vec::new(),
                purpose,
            };
            (r, Vec::with_capacity(SLOTS * ps))
        });
        let r = self.slots.state_mut(p);
        r.page = page;
        r.slot = slot;
        r.purpose = purpose;
        r.waiters.extend(w);
        if purpose != Purpose::Get {
            self.replay_reads += 1;
        }
        // Within the buffer's capacity: no allocation.
        let len = if slot == ALL { SLOTS * ps } else { ps };
        self.slots.buf_mut(p).resize(len, 0);
        if slot != ALL {
            self.meta[page as usize].slots[slot as usize].reads += 1;
        }
        self.reading.insert((page, slot), p);
        if self.slots.issued() < READS_MAX && self.queued.is_empty() {
            self.issue(p);
        } else {
            self.queued.push_back(p);
        }
    }

    /// Issues a read; false when the storage library has no place for it now (it then waits
    /// at the head of the queue).
    pub(super) fn issue(&mut self, p: u32) -> bool {
        let r = self.slots.state(p);
        let slot = if r.slot == ALL { 0 } else { r.slot as usize };
        let off = page::slot_offset(r.page, slot, self.cfg.page_size);
        let tag = tag(TAG_READ, u64::from(p));
        match self.slots.issue(self.io.as_mut(), PAGES, p, off, tag) {
            Ok(()) => {}
            Err(SubmitError::Busy) => {
                self.queued.push_front(p);
                return false;
            }
            Err(SubmitError::Failed(_)) => {
                self.slots.mark_issued(p);
                self.failed.push((tag, None));
            }
        }
        true
    }

    /// Issues waiting reads while there is room.
    pub(super) fn pump_reads(&mut self) {
        while self.slots.issued() < READS_MAX {
            let Some(p) = self.queued.pop_front() else {
                break;
            };
            if !self.issue(p) {
                break;
            }
        }
    }

    /// A read completed: the images it brought serve what waited for it.
    pub(super) fn finish_read(
        &mut self,
        p: u32,
        res: Option<u32>,
        done: &mut Completions<'_, PageSession>,
    ) {
        if !self.slots.finish(p) {
            tracing::error!(place = p, "a completion for a read not in flight");
            return;
        }
        let ps = self.cfg.page_size;
        let (id, slot, purpose) = {
            let r = self.slots.state(p);
            (r.page, r.slot, r.purpose)
        };
        if purpose != Purpose::Get {
            self.replay_reads -= 1;
        }
        if slot != ALL {
            self.meta[id as usize].slots[slot as usize].reads -= 1;
        }
        self.reading.remove(&(id, slot));
        let ok = match res {
            None => {
                tracing::error!(page = id, "page read failed");
                false
            }
            Some(n) => {
                let buf = self.slots.buf_mut(p);
                let n = (n as usize).min(buf.len());
                buf[n..].fill(0);
                self.stats.page_reads += 1;
                if slot == ALL {
                    let buf = std::mem::take(self.slots.buf_mut(p));
                    self.learn_slots(id, &buf);
                    *self.slots.buf_mut(p) = buf;
                    true
                } else {
                    let want = self.meta[id as usize].slots[slot as usize].lsn;
                    let got = page::check(&self.slots.buf(p)[..ps]);
                    if got != Some((id, want)) {
                        tracing::error!(
                            page = id,
                            slot,
                            "an image read back is not the one written"
                        );
                    }
                    got == Some((id, want))
                }
            }
        };
        // The image of the read at or below `r` (in the read's buffer), if any.
        let image_for = |s: &Self, r: u64| -> Option<Option<usize>> {
            let m = &s.meta[id as usize];
            if slot == ALL {
                return match m.pick(r) {
                    Some(k) => Some(Some(k as usize * ps)),
                    None => (m.floor == 0).then_some(None),
                };
            }
            let l = m.slots[slot as usize].lsn;
            (l <= r && l >= m.floor).then_some(Some(0))
        };
        if ok {
            self.install(p, purpose, &image_for);
        } else if purpose == Purpose::Latest {
            self.meta[id as usize].materialize = false;
        }
        if let Purpose::At(_) = purpose {
            self.meta[id as usize].imaging = false;
        }
        let mut waiters = std::mem::take(&mut self.slots.state_mut(p).waiters);
        let mut replan = 0usize;
        let latest = self.meta[id as usize].latest();
        for k in 0..waiters.len() {
            let w = &waiters[k].clone();
            if ok && w.lsn >= self.horizon {
                if let Some(&f) = self.index.get(&id) {
                    if page::lsn(&self.frames[f].data) > w.lsn {
                        // Answered from the read below.
                    } else {
                        self.fill(done, w, |buf, s| {
                            answer(buf, &s.frames[f].data, w.req_id);
                        });
                        continue;
                    }
                }
                match image_for(self, w.lsn) {
                    Some(img) => {
                        let buf = self.slots.buf(p);
                        let chain = &self.meta[id as usize].chain;
                        let image = img.map(|at| &buf[at..at + ps]);
                        if let Some((s, out)) = done.fill(w.conn, w.ticket) {
                            reply_version(out, image, ps, id, chain, w.lsn, w.req_id);
                            self.stats.deferred += 1;
                            if w.lsn < latest {
                                self.stats.historical += 1;
                            }
                            let resume = waited(s);
                            if resume {
                                done.resume(w.conn);
                            }
                        }
                    }
                    None => {
                        // The image read is no longer one the chain completes (a
                        // checkpoint moved on meanwhile): read the one that is.
                        waiters.swap(replan, k);
                        replan += 1;
                    }
                }
                continue;
            }
            let st = if ok {
                self.stats.below_horizon += 1;
                status::BELOW_HORIZON
            } else {
                status::IO_ERROR
            };
            let h = self.horizon;
            self.fill(done, w, |buf, _| header(buf, st, w.req_id, h));
        }
        for &w in &waiters[..replan] {
            match self.plan(id, w.lsn) {
                Plan::Read(s) => self.want(id, s, Some(w), Purpose::Get),
                plan => {
                    let (ps, h) = (self.cfg.page_size, self.horizon);
                    let st = if w.lsn < h {
                        status::BELOW_HORIZON
                    } else if matches!(plan, Plan::Lost) {
                        status::IO_ERROR
                    } else {
                        status::OK
                    };
                    if let Some((s, out)) = done.fill(w.conn, w.ticket) {
                        if st == status::OK {
                            match self.index.get(&id) {
                                Some(&f) if page::lsn(&self.frames[f].data) <= w.lsn => {
                                    answer(out, &self.frames[f].data, w.req_id)
                                }
                                _ => reply_version(
                                    out,
                                    None,
                                    ps,
                                    id,
                                    &self.meta[id as usize].chain,
                                    w.lsn,
                                    w.req_id,
                                ),
                            }
                        } else {
                            header(out, st, w.req_id, h);
                        }
                        if waited(s) {
                            done.resume(w.conn);
                        }
                    }
                }
            }
        }
        waiters.clear();
        self.slots.state_mut(p).waiters = waiters;
        self.slots.release(p);
    }

    /// Answers a GetPage waiting for a read with `reply` (the connection may be gone).
    fn fill(
        &mut self,
        done: &mut Completions<'_, PageSession>,
        w: &Waiter,
        reply: impl FnOnce(&mut Vec<u8>, &Self),
    ) {
        let Some((s, buf)) = done.fill(w.conn, w.ticket) else {
            return;
        };
        reply(buf, self);
        self.stats.deferred += 1;
        if waited(s) {
            done.resume(w.conn);
        }
    }

    /// What a completed read brings: the page's newest version into the pool (when the read
    /// holds its newest image, or it is the empty page), or a checkpoint's image.
    fn install(
        &mut self,
        p: u32,
        purpose: Purpose,
        image_for: &dyn Fn(&Self, u64) -> Option<Option<usize>>,
    ) {
        let ps = self.cfg.page_size;
        let id = self.slots.state(p).page;
        if let Purpose::At(m) = purpose {
            if let Some(img) = image_for(self, m) {
                let buf = self.slots.buf(p);
                // Copy: the image into the scratch page the checkpoint's image is made in.
                match img {
                    Some(at) => self.scratch.copy_from_slice(&buf[at..at + ps]),
                    None => {
                        self.scratch.fill(0);
                        page::seal(&mut self.scratch, id, 0);
                    }
                }
                roll_forward(&mut self.scratch, id, &self.meta[id as usize].chain, m);
                self.write_image(id);
            }
            return;
        }
        if self.index.contains_key(&id) {
            self.meta[id as usize].materialize = false;
            return;
        }
        let Some(img) = image_for(self, u64::MAX) else {
            return;
        };
        // Any image the chain completes gives the newest version.
        let img_lsn = img.map_or(0, |at| page::lsn(&self.slots.buf(p)[at..at + ps]));
        let Some(f) = self.victim() else {
            if purpose == Purpose::Latest {
                // Every frame is busy: materialized later.
                self.materialize_queue.push_back(id);
            }
            return;
        };
        {
            let buf = self.slots.buf(p);
            let data = &mut self.frames[f].data;
            // Copy: the image into the frame, where the chain is applied to it.
            match img {
                Some(at) => data.copy_from_slice(&buf[at..at + ps]),
                None => {
                    data.fill(0);
                    page::seal(data, id, 0);
                }
            }
        }
        let m = &mut self.meta[id as usize];
        m.materialize = false;
        let lsn = roll_forward(&mut self.frames[f].data, id, &m.chain, u64::MAX);
        let fr = &mut self.frames[f];
        fr.page = id;
        fr.dirty = lsn != img_lsn;
        fr.used = true;
        self.index.insert(id, f);
        if self.frames[f].dirty {
            self.write_back(f);
        }
    }
}

/// A GetPage of the connection that waited for a read is answered: true when its next batch
/// may go on.
fn waited(s: &mut PageSession) -> bool {
    s.waiting -= 1;
    let resume = s.read_blocked && s.waiting == 0;
    if resume {
        s.read_blocked = false;
    }
    resume
}
