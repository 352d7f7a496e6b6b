//! The log: AppendWal ranges taken in order, group commits (writes, then a flush) whose
//! replies wait in reserved places; a full log waits for a checkpoint to move its tail.

use dds_server::{Completions, ConnId, Out};
use dds_storage::aio::SubmitError;

use super::{tag, Ack, PageService, PageSession, Replay, LOG, TAG_LOG_FLUSH, TAG_LOG_WRITE};
use crate::page;
use crate::proto::{self, status, RESP_HEADER};

impl PageService {
    /// Queues an AppendWal range; its reply goes out once the commit holding it is durable.
    /// `None`: the log has no room until a checkpoint moves its tail (the message waits). `Some(false)`:
    /// the message is malformed (the connection closes).
    pub(super) fn append(&mut self, id: ConnId, msg: &[u8], out: &mut Out<'_>) -> Option<bool> {
        let reply = |s: &mut Self, out: &mut Out<'_>, st: u16| {
            let mut h = [0u8; RESP_HEADER];
            proto::response_header(
                &mut h,
                RESP_HEADER as u32,
                st,
                proto::KIND_APPEND,
                0,
                s.wal.last_lsn(),
            );
            out.extend_from_slice(&h);
            Some(true)
        };
        let Ok(a) = proto::append(msg) else {
            return Some(false);
        };
        if a.end <= a.start || a.start == 0 {
            return reply(self, out, status::BAD_REQUEST);
        }
        if self.log_end != 0 && a.start < self.log_end {
            return reply(self, out, status::DUPLICATE);
        }
        if self.log_end != 0 && a.start > self.log_end {
            return reply(self, out, status::OUT_OF_ORDER);
        }
        // Validate every record before any is taken.
        let ps = self.cfg.page_size;
        let mut prev = a.start - 1;
        let mut bytes = 0usize;
        for r in proto::records(a.records, a.count) {
            let Ok(r) = r else {
                return Some(false);
            };
            if r.lsn <= prev
                || r.lsn >= a.end
                || r.page >= self.cfg.pages
                || r.offset as usize + r.data.len() > ps - page::HEADER
            {
                return reply(self, out, status::BAD_REQUEST);
            }
            prev = r.lsn;
            bytes += r.wire_len() + 8;
        }
        if !self.wal.fits_at_all(bytes) {
            return reply(self, out, status::BAD_REQUEST);
        }
        let sizes = proto::records(a.records, a.count)
            .flatten()
            .map(|r| r.wire_len());
        if self.log_full || !self.wal.has_room(sizes) {
            self.log_full = true;
            self.log_full();
            return None;
        }
        for r in proto::records(a.records, a.count).flatten() {
            let end = self.wal.add(&r);
            self.meta[r.page as usize].logged = r.lsn;
            self.round_records.push(Replay::Record {
                lsn: r.lsn,
                page: r.page,
                offset: r.offset,
                data: r.data.to_vec(),
                end,
            });
        }
        self.round_records.push(Replay::Applied(a.end - 1));
        self.log_end = a.end;
        let ticket = out.defer();
        self.round_acks.push(Ack {
            conn: id,
            ticket,
            lsn: self.wal.last_lsn(),
        });
        Some(true)
    }

    /// Begins committing what the log holds, unless a commit is in flight (the next one
    /// then takes everything added meanwhile: group commit).
    pub(super) fn start_commit(&mut self) {
        if self.commit.active || (!self.wal.has_pending() && self.round_records.is_empty()) {
            return;
        }
        let len = self.wal.begin_commit();
        let c = &mut self.commit;
        c.active = true;
        c.len = len;
        c.issued = 0;
        c.writes = 0;
        c.flushing = false;
        c.drop_issued = 0;
        c.close_issued = 0;
        std::mem::swap(&mut c.acks, &mut self.round_acks);
        std::mem::swap(&mut c.records, &mut self.round_records);
        // The DPU's entries of the images these records supersede are closed before the
        // AppendWals are acknowledged.
        self.dpu_drop.clear();
        self.dpu_close.clear();
        let records = std::mem::take(&mut self.commit.records);
        let mut acked = 0;
        for r in &records {
            match *r {
                Replay::Record { lsn, page, .. } => self.dpu_changed(page, lsn),
                Replay::Applied(lsn) => acked = lsn,
            }
        }
        if acked > 0 {
            self.dpu_acked(acked);
        }
        self.commit.records = records;
        self.pump_commit();
    }

    /// Issues the commit's writes (in chunks that end on multiples of the largest I/O, so no
    /// two share a block) and, once they completed, its flush.
    pub(super) fn pump_commit(&mut self) {
        let c = &mut self.commit;
        if !c.active || c.flushing || c.len == 0 {
            // A commit of ranges without records has nothing to write: it completes on the
            // loop's next turn (`complete`), in order after the commits before it.
            return;
        }
        if !self.pump_dpu_records() {
            return;
        }
        let c = &mut self.commit;
        let max = self.io.max_io() as u64;
        while c.issued < c.len {
            let (at, piece) = self.wal.segment(c.issued);
            let n = ((at / max + 1) * max - at).min(piece.len() as u64) as usize;
            match self.io.write(LOG, at, &piece[..n], tag(TAG_LOG_WRITE, 0)) {
                Ok(()) => {
                    c.issued += n;
                    c.writes += 1;
                }
                Err(SubmitError::Busy) => return,
                Err(SubmitError::Failed(_)) => {
                    self.failed.push((tag(TAG_LOG_WRITE, 0), None));
                    c.issued += n;
                    c.writes += 1;
                }
            }
        }
        if c.writes == 0 {
            match self.io.flush(LOG, tag(TAG_LOG_FLUSH, 0)) {
                Ok(()) => c.flushing = true,
                Err(SubmitError::Busy) => {}
                Err(SubmitError::Failed(_)) => {
                    self.failed.push((tag(TAG_LOG_FLUSH, 0), None));
                    c.flushing = true;
                }
            }
        }
    }

    /// A write or the flush of the commit completed.
    pub(super) fn commit_done(
        &mut self,
        kind: u64,
        ok: bool,
        done: &mut Completions<'_, PageSession>,
    ) {
        if !self.commit.active {
            tracing::error!(kind, "a log completion with no commit in flight");
            return;
        }
        if !ok {
            // The records may or may not be on storage: nothing after them can be taken.
            // Their writers hear of it; the server stops (recovery replays what is there).
            for a in self.commit.acks.drain(..) {
                if let Some((_, buf)) = done.fill(a.conn, a.ticket) {
                    append_reply(buf, status::IO_ERROR, a.lsn);
                }
            }
            self.fail(anyhow::anyhow!("writing the log failed"));
            return;
        }
        if kind == TAG_LOG_WRITE {
            self.commit.writes -= 1;
            self.pump_commit();
            return;
        }
        self.finish_commit(done);
    }

    /// The commit in flight is durable: its records go to the replay, their writers get their
    /// replies, and the next commit begins.
    pub(super) fn finish_commit(&mut self, done: &mut Completions<'_, PageSession>) {
        self.wal.end_commit();
        let c = &mut self.commit;
        c.active = false;
        self.replay.extend(c.records.drain(..));
        let last = self.wal.last_lsn();
        self.sample(last);
        let c = &mut self.commit;
        for a in c.acks.drain(..) {
            if let Some((_, buf)) = done.fill(a.conn, a.ticket) {
                append_reply(buf, status::OK, a.lsn);
            }
        }
        self.start_commit();
    }
}

/// An AppendWal reply.
pub(super) fn append_reply(out: &mut Vec<u8>, st: u16, lsn: u64) {
    let mut h = [0u8; RESP_HEADER];
    proto::response_header(&mut h, RESP_HEADER as u32, st, proto::KIND_APPEND, 0, lsn);
    out.extend_from_slice(&h);
}
