//! The image slots' entries in the DPU's cache table (`docs/pageserver-protocol.md` §6): an
//! entry names the image in a slot and the LSN range `[image LSN, next record LSN)` of the
//! versions it is, kept by the host through CACHE and INVALIDATE records ordered with its
//! writes: a slot's entry leaves the table before the slot is written, comes back with the new
//! image's range once its write completed, and a commit closes the open ranges of the pages
//! its records change before their AppendWals are acknowledged.

use dds_proto::cache_records::{
    encode_cache_items, encode_invalidate_items, CacheRecordItem, CACHE_ITEM_BYTES,
    INVALIDATE_ITEM_BYTES,
};
use dds_storage::aio::SubmitError;

use super::{tag, PageService, SlotState, SLOTS, TAG_DPU, TAG_LOG_WRITE};
use crate::offload::{OPEN, WATERMARK};

impl PageService {
    /// The range end of `page`'s image at `lsn`: its first record above `lsn`, `lsn + 1` when
    /// a record above it is in the log but not in the chain yet (a range that is too short
    /// only sends readers to the host), or [`OPEN`].
    fn range_end(&self, page: u64, lsn: u64) -> u64 {
        let m = &self.meta[page as usize];
        let i = m.chain.partition_point(|r| r.lsn <= lsn);
        match m.chain.get(i) {
            Some(r) => r.lsn,
            None if m.logged > lsn => lsn + 1,
            None => OPEN,
        }
    }

    /// The next-record stamp of a new image of `page` at `lsn` (0: none known).
    pub(super) fn stamp(&self, page: u64, lsn: u64) -> u64 {
        match self.range_end(page, lsn) {
            OPEN => 0,
            e => e,
        }
    }

    fn item(&self, page: u64, s: u8, lsn: u64, end: u64, file: u32) -> CacheRecordItem {
        CacheRecordItem {
            key: page * SLOTS as u64 + u64::from(s),
            offset: end,
            file_id: file,
            size: self.cfg.page_size as u32,
            tag: lsn,
        }
    }

    /// Before slot `s` of `page` is written: its entry leaves the DPU's cache table (the
    /// record goes before the write). False: it could not be issued now (the write waits).
    pub(super) fn dpu_forget(&mut self, page: u64, s: u8) -> bool {
        if self.dpu_file.is_none() {
            return true;
        }
        let mut b = [0u8; INVALIDATE_ITEM_BYTES];
        encode_invalidate_items(&[page * SLOTS as u64 + u64::from(s)], &mut b).expect("8 bytes");
        match self.io.cache_record(true, &b, tag(TAG_DPU, 0)) {
            Ok(()) => true,
            Err(SubmitError::Busy) => false,
            Err(SubmitError::Failed(_)) => {
                self.dpu_file = None;
                self.dpu_failed();
                false
            }
        }
    }

    /// Slot `s` of `page` holds an image (written, or read from storage): its entry, with
    /// the image's range as known now. Not sent when the ring has no room (the slot then
    /// has no entry and its readers go to the host).
    pub(super) fn dpu_cache(&mut self, page: u64, s: u8) {
        let Some(file) = self.dpu_file else {
            return;
        };
        let sl = self.meta[page as usize].slots[s as usize];
        if sl.state != SlotState::Image || sl.lsn == 0 {
            return;
        }
        // Never past the image's stamp, which the DPU's read checks.
        let end = match sl.stamp {
            0 => self.range_end(page, sl.lsn),
            st => self.range_end(page, sl.lsn).min(st),
        };
        self.meta[page as usize].slots[s as usize].next = end;
        let mut b = [0u8; CACHE_ITEM_BYTES];
        let it = self.item(page, s, sl.lsn, end, file);
        encode_cache_items(&[it], &mut b).expect("32 bytes");
        if let Err(SubmitError::Failed(_)) = self.io.cache_record(false, &b, tag(TAG_DPU, 0)) {
            self.dpu_file = None;
            self.dpu_failed();
        }
    }

    /// Records of the commit being started change `page` at `lsn`: the open ranges of its
    /// images end there (CACHE items into `self.dpu_close`), or, for a page whose slots are
    /// not known in this life, its four entries leave the table (INVALIDATE keys into
    /// `self.dpu_drop`).
    pub(super) fn dpu_changed(&mut self, page: u64, lsn: u64) {
        let Some(file) = self.dpu_file else {
            return;
        };
        let m = &mut self.meta[page as usize];
        if !m.known {
            if !m.forgotten {
                m.forgotten = true;
                for s in 0..SLOTS as u64 {
                    let n = self.dpu_drop.len();
                    self.dpu_drop.resize(n + INVALIDATE_ITEM_BYTES, 0);
                    encode_invalidate_items(&[page * SLOTS as u64 + s], &mut self.dpu_drop[n..])
                        .expect("sized");
                }
            }
            return;
        }
        for s in 0..SLOTS {
            let sl = self.meta[page as usize].slots[s];
            if sl.state == SlotState::Image && sl.next == OPEN && sl.lsn < lsn && sl.lsn > 0 {
                self.meta[page as usize].slots[s].next = lsn;
                let it = self.item(page, s as u8, sl.lsn, lsn, file);
                let n = self.dpu_close.len();
                self.dpu_close.resize(n + CACHE_ITEM_BYTES, 0);
                encode_cache_items(&[it], &mut self.dpu_close[n..]).expect("sized");
            }
        }
    }

    /// The commit being started acknowledges the log up to `lsn`: after its closures, the
    /// watermark entry (`offload::WATERMARK`) says so.
    pub(super) fn dpu_acked(&mut self, lsn: u64) {
        let Some(file) = self.dpu_file else {
            return;
        };
        let it = CacheRecordItem {
            key: WATERMARK,
            offset: 0,
            file_id: file,
            size: 0,
            tag: lsn,
        };
        let n = self.dpu_close.len();
        self.dpu_close.resize(n + CACHE_ITEM_BYTES, 0);
        encode_cache_items(&[it], &mut self.dpu_close[n..]).expect("sized");
    }

    /// Issues the commit's CACHE and INVALIDATE records (counted with its writes, so its
    /// AppendWals are acknowledged only once the DPU applied them). False: the ring is full
    /// (called again).
    pub(super) fn pump_dpu_records(&mut self) -> bool {
        let max = self.io.max_io();
        for invalidate in [true, false] {
            loop {
                let (buf, done, unit) = if invalidate {
                    (
                        &self.dpu_drop,
                        self.commit.drop_issued,
                        INVALIDATE_ITEM_BYTES,
                    )
                } else {
                    (&self.dpu_close, self.commit.close_issued, CACHE_ITEM_BYTES)
                };
                if done >= buf.len() {
                    break;
                }
                let n = (buf.len() - done).min(max / unit * unit);
                let t = tag(TAG_LOG_WRITE, 0);
                match self.io.cache_record(invalidate, &buf[done..done + n], t) {
                    Ok(()) => {}
                    Err(SubmitError::Busy) => return false,
                    Err(SubmitError::Failed(_)) => self.failed.push((t, None)),
                }
                self.commit.writes += 1;
                if invalidate {
                    self.commit.drop_issued += n;
                } else {
                    self.commit.close_issued += n;
                }
            }
        }
        true
    }

    /// The DPU refused a cache record: nothing more is sent, and nothing it holds can be
    /// trusted to stay exact, so the server stops (a restart invalidates what the log
    /// changes).
    fn dpu_failed(&mut self) {
        self.fail(anyhow::anyhow!(
            "the DPU refused a cache record of the page file"
        ));
    }
}
