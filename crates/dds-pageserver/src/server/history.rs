//! Page versions (`docs/pageserver-protocol.md` §5.2–§5.4): each page's image slots and
//! record chain, the versions they answer, where a new image goes, and the checkpoints that
//! move the retention horizon and the log's tail.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use dds_server::Completions;
use dds_storage::aio::SubmitError;

use super::{
    tag, Checkpoint, PageMeta, PageService, PageSession, Purpose, Rec, SlotState, ALL, LOG, PAGES,
    SLOTS, TAG_HEADER_FLUSH, TAG_HEADER_WRITE, TAG_IMAGE_WRITE, TAG_PAGES_FLUSH,
};
use crate::page;
use crate::proto::{self, status, RESP_HEADER};

/// How far back GetPage@LSN reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// LSNs behind the last applied one.
    Lsns(u64),
    /// The applied LSN of this long ago.
    Time(Duration),
}

impl std::str::FromStr for Retention {
    type Err = String;

    /// `100000` (LSNs), `10s`, `500ms`, `2m`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("retention {s:?}: an LSN count, or a time such as 10s, 500ms, 2m");
        let num = |t: &str| t.parse::<u64>().map_err(|_| bad());
        if let Some(ms) = s.strip_suffix("ms") {
            return Ok(Retention::Time(Duration::from_millis(num(ms)?)));
        }
        if let Some(sec) = s.strip_suffix('s') {
            return Ok(Retention::Time(Duration::from_secs(num(sec)?)));
        }
        if let Some(min) = s.strip_suffix('m') {
            return Ok(Retention::Time(Duration::from_secs(60 * num(min)?)));
        }
        Ok(Retention::Lsns(num(s)?))
    }
}

/// Checkpoints begin at most this often (unless the log needs room).
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
/// Retained records a checkpoint looks at, at most.
const CHECKPOINT_SCAN: usize = 1 << 16;
/// Images a checkpoint asks for, at most.
const CHECKPOINT_IMAGES: usize = 64;
/// How often the retained versions are logged.
const STATS_EVERY: Duration = Duration::from_secs(10);

impl PageMeta {
    pub(super) fn new() -> PageMeta {
        PageMeta {
            known: false,
            slots: [super::EMPTY_SLOT; SLOTS],
            chain: VecDeque::new(),
            materialize: false,
            imaging: false,
            floor: 0,
            logged: 0,
            forgotten: false,
        }
    }

    /// The newest image at or below `r` that the chain completes (not older than the records
    /// dropped from it).
    pub(super) fn pick(&self, r: u64) -> Option<u8> {
        let mut best: Option<u8> = None;
        for (s, sl) in self.slots.iter().enumerate() {
            if sl.state == SlotState::Image
                && sl.lsn <= r
                && sl.lsn >= self.floor
                && best.is_none_or(|b| self.slots[b as usize].lsn < sl.lsn)
            {
                best = Some(s as u8);
            }
        }
        best
    }

    /// The base under horizon `h`: the newest durable image at or below it.
    pub(super) fn base(&self, h: u64, flushes_done: u64) -> Option<u8> {
        let mut best: Option<u8> = None;
        for (s, sl) in self.slots.iter().enumerate() {
            if sl.state == SlotState::Image
                && sl.lsn <= h
                && sl.flush <= flushes_done
                && best.is_none_or(|b| self.slots[b as usize].lsn < sl.lsn)
            {
                best = Some(s as u8);
            }
        }
        best
    }

    /// The LSN of the page's newest version (its last record, or its newest image).
    pub(super) fn latest(&self) -> u64 {
        let img = self
            .slots
            .iter()
            .filter(|s| s.state != SlotState::Empty)
            .map(|s| s.lsn)
            .max()
            .unwrap_or(0);
        self.chain.back().map_or(img, |r| r.lsn.max(img))
    }
}

/// Applies the records of `chain` in `(lsn of page, r]` to `page` and seals it; returns its
/// LSN.
pub(super) fn roll_forward(page: &mut [u8], id: u64, chain: &VecDeque<Rec>, r: u64) -> u64 {
    let from = page::lsn(page);
    let start = chain.partition_point(|x| x.lsn <= from);
    let mut last = from;
    for rec in chain.range(start..) {
        if rec.lsn > r {
            break;
        }
        page::patch(page, rec.offset as usize, &rec.data);
        last = rec.lsn;
    }
    if last != from {
        page::seal(page, id, last);
    }
    last
}

/// Appends a GetPage's `OK` reply: `image` (or the empty image) with the chain's records up
/// to `r` applied, in the reply buffer itself.
pub(super) fn reply_version(
    out: &mut Vec<u8>,
    image: Option<&[u8]>,
    ps: usize,
    id: u64,
    chain: &VecDeque<Rec>,
    r: u64,
    req_id: u64,
) {
    let at = out.len();
    out.resize(at + RESP_HEADER, 0);
    match image {
        // Copy: the image into the reply, where the chain's records are applied to it.
        Some(img) => out.extend_from_slice(img),
        None => {
            out.resize(at + RESP_HEADER + ps, 0);
            page::seal(&mut out[at + RESP_HEADER..], id, 0);
        }
    }
    let lsn = roll_forward(&mut out[at + RESP_HEADER..], id, chain, r);
    proto::response_header(
        &mut out[at..],
        (RESP_HEADER + ps) as u32,
        status::OK,
        proto::KIND_GETPAGE,
        req_id,
        lsn,
    );
}

impl PageService {
    /// The slot a new image of `page` at `lsn` goes to: `Some(None)` when an image at that LSN
    /// is there (or being written) already, `None` when no slot is free now. Never a base (of
    /// the horizon in force or of the checkpoint in flight), nor a slot being read or written.
    pub(super) fn choose_slot(&self, page: u64, lsn: u64) -> Option<Option<u8>> {
        let m = &self.meta[page as usize];
        debug_assert!(
            m.known,
            "a page's slots are known before an image is written"
        );
        if m.slots
            .iter()
            .any(|s| s.state != SlotState::Empty && s.lsn == lsn)
        {
            return Some(None);
        }
        // The bases, and the newest images at or below the horizons whether durable or not
        // (the bases once a flush makes them durable).
        let keep = [
            m.base(self.horizon, self.flushes_done),
            m.base(self.pending_horizon, self.flushes_done),
            m.base(self.horizon, u64::MAX),
            m.base(self.pending_horizon, u64::MAX),
        ];
        let base_lsn = keep[0].map_or(0, |b| m.slots[b as usize].lsn);
        let images = || {
            m.slots
                .iter()
                .enumerate()
                .filter(|(s, sl)| sl.state == SlotState::Image && !keep.contains(&Some(*s as u8)))
        };
        // The newest image (the version before the one written now, for readers that lag)
        // and the oldest image above the base (to age into the next base) are kept too.
        let newest = images().max_by_key(|(_, sl)| sl.lsn).map(|(s, _)| s as u8);
        let aging = images()
            .filter(|(_, sl)| sl.lsn >= base_lsn)
            .min_by_key(|(_, sl)| sl.lsn)
            .map(|(s, _)| s as u8);
        let mut best: Option<(u8, u8, u64)> = None; // (slot, preference, lsn)
        for (s, sl) in m.slots.iter().enumerate() {
            let s = s as u8;
            if keep.contains(&Some(s)) || sl.state == SlotState::Writing || sl.reads > 0 {
                continue;
            }
            // Empty or damaged first, then older than the base, then an image between the
            // aging one and the newest, then (no other) the newest image.
            let pref = match sl.state {
                SlotState::Empty => 0,
                _ if sl.lsn < base_lsn || sl.lsn < m.floor => 1,
                _ if Some(s) != newest && Some(s) != aging => 2,
                _ if Some(s) == newest && Some(s) != aging => 3,
                _ => continue,
            };
            let better = match best {
                None => true,
                Some((_, bp, bl)) => pref < bp || (pref == bp && sl.lsn > bl),
            };
            if better {
                best = Some((s, pref, sl.lsn));
            }
        }
        best.map(|(s, _, _)| Some(s))
    }

    /// Marks slot `s` of `page` as being written with the image at `lsn`.
    pub(super) fn slot_writing(&mut self, page: u64, s: u8, lsn: u64, stamp: u64) {
        let sl = &mut self.meta[page as usize].slots[s as usize];
        if sl.state == SlotState::Image {
            self.images -= 1;
        }
        sl.state = SlotState::Writing;
        sl.lsn = lsn;
        sl.stamp = stamp;
    }

    /// The write of slot `s` of `page` completed: an image, durable after the next flush.
    pub(super) fn slot_written(&mut self, page: u64, s: u8, ok: bool) {
        let next_flush = self.flushes_issued + 1;
        let sl = &mut self.meta[page as usize].slots[s as usize];
        if ok {
            sl.state = SlotState::Image;
            sl.flush = next_flush;
            self.images += 1;
            self.dpu_cache(page, s);
        } else {
            sl.state = SlotState::Empty;
        }
    }

    /// Learns a page's slots from the read of all of them (`buf`: their images).
    pub(super) fn learn_slots(&mut self, page: u64, buf: &[u8]) {
        let ps = self.cfg.page_size;
        let m = &mut self.meta[page as usize];
        if m.known {
            return;
        }
        for s in 0..SLOTS {
            let img = &buf[s * ps..(s + 1) * ps];
            m.slots[s] = match page::check(img) {
                // An image read from storage is on the device: durable.
                Some((id, lsn)) if id == page => super::Slot {
                    state: SlotState::Image,
                    lsn,
                    flush: 0,
                    reads: 0,
                    next: 0,
                    stamp: page::next_lsn(img),
                },
                _ => {
                    if img.iter().any(|&b| b != 0) {
                        // A torn write of a slot that was not a base: not an image.
                        tracing::debug!(page, slot = s, "an image slot holds no valid image");
                    }
                    super::EMPTY_SLOT
                }
            };
        }
        m.known = true;
        self.images += m
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Image)
            .count() as u64;
        for s in 0..SLOTS as u8 {
            self.dpu_cache(page, s);
        }
    }

    /// Writes the image in `self.scratch` (page `page`) to a free slot, for a checkpoint.
    pub(super) fn write_image(&mut self, page: u64) {
        let lsn = page::lsn(&self.scratch);
        let Some(choice) = self.choose_slot(page, lsn) else {
            // No free slot now: the next checkpoint asks again.
            return;
        };
        let Some(s) = choice else {
            return;
        };
        if !self.dpu_forget(page, s) {
            return;
        }
        let next = self.stamp(page, lsn);
        page::stamp_next(&mut self.scratch, next);
        let off = page::slot_offset(page, s as usize, self.cfg.page_size);
        let t = tag(TAG_IMAGE_WRITE, page * (SLOTS as u64 + 1) + u64::from(s));
        match self.io.write(PAGES, off, &self.scratch, t) {
            Ok(()) => {}
            Err(SubmitError::Busy) => return,
            Err(SubmitError::Failed(_)) => self.failed.push((t, None)),
        }
        self.slot_writing(page, s, lsn, next);
        self.writes += 1;
        self.stats.page_writes += 1;
        self.stats.checkpoint_images += 1;
    }

    /// A checkpoint's image write completed.
    pub(super) fn image_written(&mut self, object: u64, ok: bool) {
        let (page, s) = (
            object / (SLOTS as u64 + 1),
            (object % (SLOTS as u64 + 1)) as u8,
        );
        if page >= self.cfg.pages || s as usize >= SLOTS {
            tracing::error!(object, "a completion for no image write");
            return;
        }
        self.writes -= 1;
        self.slot_written(page, s, ok);
        if !ok {
            self.fail(anyhow::anyhow!("writing an image of page {page} failed"));
        }
    }

    /// Asks for an image of `page` at `m` (its version at the newest of its records ≤ the
    /// new horizon), so that the log's tail can move past its older records.
    fn want_image(&mut self, page: u64, m: u64) {
        let meta = &mut self.meta[page as usize];
        if meta.imaging {
            return;
        }
        if meta.known
            && meta
                .slots
                .iter()
                .any(|s| s.state != SlotState::Empty && s.lsn == m)
        {
            // Written (durable after the next flush) or being written.
            return;
        }
        meta.imaging = true;
        if !meta.known {
            self.want(page, ALL, None, Purpose::At(m));
            return;
        }
        match meta.pick(m) {
            Some(s) => self.want(page, s, None, Purpose::At(m)),
            None => {
                let ps = self.cfg.page_size;
                self.scratch.fill(0);
                page::seal(&mut self.scratch[..ps], page, 0);
                let meta = &self.meta[page as usize];
                roll_forward(&mut self.scratch, page, &meta.chain, m);
                self.meta[page as usize].imaging = false;
                self.write_image(page);
            }
        }
    }

    /// The horizon wanted now (not below the one in force, not above the applied LSN).
    fn wanted_horizon(&mut self) -> u64 {
        let h = match self.cfg.retention {
            Retention::Lsns(d) => self.applied.saturating_sub(d),
            Retention::Time(t) => {
                while self.samples.len() > 1 && self.samples[1].0.elapsed() >= t {
                    self.samples.pop_front();
                }
                match self.samples.front() {
                    Some(&(at, lsn)) if at.elapsed() >= t => lsn,
                    _ => self.horizon,
                }
            }
        };
        h.max(self.pressure).max(self.horizon).min(self.applied)
    }

    /// Records when the log reached `lsn` (for a horizon in time).
    pub(super) fn sample(&mut self, lsn: u64) {
        let now = Instant::now();
        if self
            .samples
            .back()
            .is_none_or(|&(at, _)| now.duration_since(at) >= Duration::from_millis(10))
        {
            self.samples.push_back((now, lsn));
        }
    }

    /// The log has no room: the wanted horizon moves up to a quarter of the retained records
    /// in.
    pub(super) fn log_full(&mut self) {
        let n = self.log_order.len();
        if n == 0 {
            return;
        }
        let lsn = self.log_order[(n / 4).min(n - 1)].lsn;
        if lsn > self.pressure {
            tracing::warn!(
                horizon = lsn,
                "the log is full: the retention horizon moves up to make room"
            );
            self.pressure = lsn;
        }
    }

    /// Begins a checkpoint when one is due: the page file's flush first.
    pub(super) fn maybe_checkpoint(&mut self) {
        if self.stats_at.elapsed() >= STATS_EVERY {
            self.stats_at = Instant::now();
            self.log_versions();
        }
        if self.checkpoint != Checkpoint::Idle || self.fatal.is_some() {
            return;
        }
        let urgent = self.pressure > self.horizon;
        if !urgent && self.checkpoint_at.elapsed() < CHECKPOINT_EVERY {
            return;
        }
        let want = self.wanted_horizon();
        let reclaimable = self.log_order.front().is_some_and(|r| r.lsn <= want);
        if want <= self.horizon && !reclaimable {
            return;
        }
        self.checkpoint_at = Instant::now();
        let seq = self.flushes_issued + 1;
        match self.io.flush(PAGES, tag(TAG_PAGES_FLUSH, seq)) {
            Ok(()) => {}
            Err(SubmitError::Busy) => return,
            Err(SubmitError::Failed(_)) => self.failed.push((tag(TAG_PAGES_FLUSH, seq), None)),
        }
        self.flushes_issued = seq;
        self.checkpoint = Checkpoint::FlushingPages;
    }

    /// The checkpoint's page-file flush completed: pick the horizon and the tail, ask for the
    /// images that hold the next records back, and write the log's next header.
    pub(super) fn pages_flushed(&mut self, seq: u64, ok: bool) {
        if self.checkpoint != Checkpoint::FlushingPages {
            tracing::error!("a page-file flush with no checkpoint in flight");
            return;
        }
        if !ok {
            self.fail(anyhow::anyhow!("flushing the page file failed"));
            self.checkpoint = Checkpoint::Idle;
            return;
        }
        self.flushes_done = self.flushes_done.max(seq);
        let h = self.wanted_horizon();
        self.pending_horizon = h;
        let (mut n, mut asked) = (0usize, 0usize);
        let mut blocked = false;
        let mut tail = None;
        for i in 0..self.log_order.len().min(CHECKPOINT_SCAN) {
            let r = self.log_order[i];
            if r.lsn > h {
                break;
            }
            let m = &self.meta[r.page as usize];
            let covered = m.known
                && m.base(h, self.flushes_done)
                    .is_some_and(|b| m.slots[b as usize].lsn >= r.lsn);
            // The page's version at its newest record at or below the horizon.
            let at = m.chain.partition_point(|x| x.lsn <= h);
            let target = m.chain.get(at.wrapping_sub(1)).map_or(r.lsn, |x| x.lsn);
            let imaging = m.imaging;
            if covered {
                if !blocked {
                    n = i + 1;
                    tail = Some(r);
                }
                continue;
            }
            blocked = true;
            if !imaging {
                self.want_image(r.page, target);
                asked += 1;
                if asked >= CHECKPOINT_IMAGES {
                    break;
                }
            }
        }
        self.reclaim = n;
        let hd = self.wal.header();
        if n == 0 && h <= self.horizon {
            self.checkpoint = Checkpoint::Idle;
            self.pending_horizon = self.horizon;
            return;
        }
        let (tail_off, tail_lsn) = tail.map_or((hd.tail, hd.tail_lsn), |r| (r.end, r.lsn));
        self.next_header = self.wal.next_header(tail_off, tail_lsn, h);
        let block = self.next_header.encode();
        let t = tag(TAG_HEADER_WRITE, 0);
        match self.io.write(LOG, self.next_header.offset(), &block, t) {
            Ok(()) => {}
            Err(SubmitError::Busy) => {
                // Try again at the next checkpoint.
                self.checkpoint = Checkpoint::Idle;
                self.pending_horizon = self.horizon;
                return;
            }
            Err(SubmitError::Failed(_)) => self.failed.push((t, None)),
        }
        self.checkpoint = Checkpoint::WritingHeader;
    }

    /// The header write completed: flush it.
    pub(super) fn header_written(&mut self, ok: bool) {
        if self.checkpoint != Checkpoint::WritingHeader {
            tracing::error!("a header write with no checkpoint in flight");
            return;
        }
        if !ok {
            self.fail(anyhow::anyhow!("writing the log's header failed"));
            self.checkpoint = Checkpoint::Idle;
            return;
        }
        self.checkpoint = Checkpoint::HeaderWritten;
        self.flush_header();
    }

    /// Issues the flush of the header written (again from `complete` while the storage
    /// library has no place for it).
    pub(super) fn flush_header(&mut self) {
        let t = tag(TAG_HEADER_FLUSH, 0);
        match self.io.flush(LOG, t) {
            Ok(()) => {}
            Err(SubmitError::Busy) => return,
            Err(SubmitError::Failed(_)) => self.failed.push((t, None)),
        }
        self.checkpoint = Checkpoint::FlushingLog;
    }

    /// The header is durable: the horizon moves, the records behind the tail leave their
    /// chains and their space is free.
    pub(super) fn header_flushed(&mut self, ok: bool, done: &mut Completions<'_, PageSession>) {
        if self.checkpoint != Checkpoint::FlushingLog {
            tracing::error!("a log flush with no checkpoint in flight");
            return;
        }
        self.checkpoint = Checkpoint::Idle;
        if !ok {
            self.fail(anyhow::anyhow!("flushing the log's header failed"));
            return;
        }
        let hd = self.next_header;
        self.wal.header_durable(hd);
        self.horizon = hd.horizon;
        self.pending_horizon = hd.horizon;
        for _ in 0..self.reclaim {
            let Some(r) = self.log_order.pop_front() else {
                break;
            };
            let m = &mut self.meta[r.page as usize];
            let front = m.chain.pop_front();
            debug_assert_eq!(front.map(|x| x.lsn), Some(r.lsn), "chains follow the log");
            m.floor = r.lsn;
        }
        self.reclaim = 0;
        self.stats.checkpoints += 1;
        if self.pressure <= self.horizon {
            self.pressure = 0;
        }
        self.log_full = false;
        for id in self.replay_waiters.drain(..) {
            done.resume(id);
        }
    }

    /// The retained versions (images known and records in the log) and the bytes they use
    /// (image slots × page size, and the log between its tail and head).
    pub(super) fn versions(&self) -> (u64, u64) {
        let versions = self.images + self.log_order.len() as u64;
        let bytes = self.images * self.cfg.page_size as u64 + self.wal.used_bytes();
        (versions, bytes)
    }

    fn log_versions(&self) {
        let (versions, bytes) = self.versions();
        tracing::info!(
            horizon = self.horizon,
            applied = self.applied,
            versions,
            bytes,
            bytes_per_version = bytes / versions.max(1),
            page_reads = self.stats.page_reads,
            page_writes = self.stats.page_writes,
            checkpoint_images = self.stats.checkpoint_images,
            checkpoints = self.stats.checkpoints,
            applied_records = self.stats.applied,
            "retained page versions"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_lsns_or_a_time_and_nonsense_is_refused() {
        assert_eq!("100000".parse(), Ok(Retention::Lsns(100_000)));
        assert_eq!("10s".parse(), Ok(Retention::Time(Duration::from_secs(10))));
        assert_eq!(
            "500ms".parse(),
            Ok(Retention::Time(Duration::from_millis(500)))
        );
        assert_eq!("2m".parse(), Ok(Retention::Time(Duration::from_secs(120))));
        for bad in ["", "s", "-5", "1h", "ten"] {
            assert!(bad.parse::<Retention>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_version_is_an_image_rolled_forward_through_its_chain() {
        let ps = 4096;
        let mut chain = VecDeque::new();
        for (lsn, b) in [(5u64, 1u8), (9, 2), (12, 3)] {
            chain.push_back(Rec {
                lsn,
                offset: 0,
                data: vec![b; 4].into(),
            });
        }
        let mut img = vec![0u8; ps];
        page::seal(&mut img, 7, 5);
        let mut p = img.clone();
        assert_eq!(roll_forward(&mut p, 7, &chain, 10), 9);
        assert_eq!(&p[page::HEADER..page::HEADER + 4], &[2; 4]);
        assert_eq!(page::check(&p), Some((7, 9)));
        // Nothing after the image up to the read point: the image itself.
        let mut q = img.clone();
        assert_eq!(roll_forward(&mut q, 7, &chain, 8), 5);
        assert_eq!(q, img);
    }
}
