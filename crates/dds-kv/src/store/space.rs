//! The log's space: allocation at the tail, pages started and evicted, compaction of the
//! oldest page, and the log's storage I/O (`docs/kv-service.md` §1, §3).
//!
//! Every write, flush and compaction read goes through the store's [`FileIo`] (the host
//! library's asynchronous API on DDS files) and completes on a later turn of the server's
//! loop ([`Store::poll_io`]):
//!
//! - page writes are issued when pages become read-only (FASTER's flush on the read-only
//!   shift), so that a page has completed its write by the time it leaves memory; the data
//!   is taken when a write is issued. Writes in flight never share a device block.
//! - a commit (fold-over: the whole log becomes read-only) waits for the writes below its
//!   target, flushes the log, then writes the checkpoint and flushes it. One commit is in
//!   flight; what is asked meanwhile goes into the next one (group commit).
//! - compaction's page is read ahead when the tail comes within a few pages of needing it.
//!
//! A command waits inside the loop only when the device is behind the log's appends: a page
//! must leave memory before its write completed, or compaction needs its page before the
//! read completed (`StoreStats::storage_waits`).

use std::time::Duration;

use super::*;

/// Log writes in flight at most.
pub(super) const WRITES_MAX: usize = 64;
/// Pages ahead of need that compaction's page read is issued.
const COMPACT_AHEAD: u64 = 4;
/// Device block: writes in flight never share one.
const BLOCK: u64 = 4096;
/// How long a wait for storage sleeps between polls.
const WAIT_STEP: Duration = Duration::from_micros(20);

/// The files of the store's [`FileIo`].
const LOG: usize = 0;
const CKPT: usize = 1;

/// Tags of the store's operations: the kind in the top bits (kind 0 is the server's reads
/// ahead, which the store hands back), the object below.
const TAG_SHIFT: u32 = 60;
const TAG_LOG_WRITE: u64 = 1;
const TAG_LOG_FLUSH: u64 = 2;
const TAG_CKPT_WRITE: u64 = 3;
const TAG_CKPT_FLUSH: u64 = 4;
const TAG_COMPACT_READ: u64 = 5;

fn tag(kind: u64, object: u64) -> u64 {
    debug_assert!(object < 1 << TAG_SHIFT);
    kind << TAG_SHIFT | object
}

/// Where the commit in flight is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Idle,
    /// Waiting for the log writes below the target to complete.
    Writing,
    /// The log's flush is in flight.
    LogFlush,
    /// The log is durable: the checkpoint's write is to be issued.
    LogDone,
    /// The checkpoint's write is in flight.
    CkptWrite,
    /// The checkpoint is written: its flush is to be issued.
    CkptWritten,
    /// The checkpoint's flush is in flight.
    CkptFlush,
}

/// The commit in flight, and what is asked of the next one.
#[derive(Default)]
pub(crate) struct Commit {
    phase: Phase,
    /// The log address the commit makes durable.
    target: u64,
    /// The checkpoint being written.
    ckpt: Option<crate::checkpoint::Pending>,
    /// Durability asked up to here (a commit follows while it is above `durable_end`).
    want: u64,
    /// A checkpoint must move recovery's start before a page slot is overwritten.
    ckpt_wanted: bool,
}

/// Compaction's page read ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompactRead {
    None,
    /// The read of this page is in flight.
    InFlight(u64),
    /// The buffer holds this page (bytes read).
    Ready(u64, usize),
    /// The read of this page failed.
    Failed(u64),
}

impl CompactRead {
    pub(crate) fn in_flight(&self) -> bool {
        matches!(self, CompactRead::InFlight(_))
    }
}

impl Store {
    /// Room for `len` bytes at the tail, starting a page (and compacting) if needed.
    pub(super) fn allocate(&mut self, len: u64) -> StoreResult<u64> {
        assert!(len <= self.ps, "record larger than a page");
        let mut rounds = 0u64;
        while self.tail + len > self.tail_page_end {
            let next = self.tail_page_end / self.ps;
            if (next + 2) * self.ps > self.begin + self.cap {
                // Keep one free page slot beyond the next page: compact the oldest page.
                // Its live records go to the tail page or the next one, never to the page
                // that reuses its slot, so they are written (and synced, before the
                // checkpoint that drops the old page) ahead of the overwrite.
                rounds += 1;
                if rounds > self.cap / self.ps {
                    return Err(StoreError::LogFull);
                }
                self.compact_one()?;
                continue;
            }
            self.start_page(next)?;
        }
        let a = self.tail;
        self.tail += len;
        Ok(a)
    }

    /// Starts page `next` at the tail: makes room in memory (evicting the oldest page once
    /// its write completed) and moves the read-only boundary, issuing the writes of the pages
    /// that became read-only. Its file slot must be free.
    fn start_page(&mut self, next: u64) -> StoreResult<()> {
        assert_eq!(next * self.ps, self.tail_page_end, "pages start in order");
        assert!(
            (next + 1) * self.ps <= self.begin + self.cap,
            "page slot still holds live data"
        );
        let frames = self.frames.len() as u64;
        while next + 1 > self.page_of(self.head) + frames {
            let evict_end = (self.page_of(self.head) + 1) * self.ps;
            if self.read_only < evict_end {
                self.read_only = evict_end;
            }
            self.flush_to(evict_end);
            self.wait_written(evict_end)?;
            self.head = evict_end;
        }
        let fr = self.frame(next);
        self.frames[fr].fill(0);
        self.tail = next * self.ps;
        self.tail_page_end = (next + 1) * self.ps;
        // The mutable region: the newest `mutable_pages` pages.
        let ro = (next + 1).saturating_sub(self.mutable_pages) * self.ps;
        if ro > self.read_only {
            self.read_only = ro.min(self.tail);
        }
        // Read-only pages go to storage now, to be written when they leave memory.
        self.flush_to(self.read_only);
        self.prefetch_compaction();
        Ok(())
    }

    /// Issues the read of the page compaction takes next, when the tail comes within
    /// `COMPACT_AHEAD` pages of needing it and the page is on storage only.
    fn prefetch_compaction(&mut self) {
        let bp = self.page_of(self.begin);
        let next = self.tail_page_end / self.ps;
        if self.compact_read != CompactRead::None
            || self.compact_buf.len() as u64 != self.ps
            || self.begin >= self.head
            || self.begin >= self.tail
            || (next + 2 + COMPACT_AHEAD) * self.ps <= self.begin + self.cap
            || self.ps as usize > self.io.max_io()
        {
            return;
        }
        let off = (bp * self.ps) % self.cap;
        let buf = self.compact_buf.as_mut_ptr();
        // SAFETY: the buffer is the store's own, stays where it is (a boxed slice), is not
        // used while the read is in flight (`compact_read`), and is leaked if the store is
        // dropped before the read completes.
        let r = unsafe {
            self.io
                .read(LOG, off, buf, self.ps as u32, tag(TAG_COMPACT_READ, bp))
        };
        if r.is_ok() {
            self.compact_read = CompactRead::InFlight(bp);
        }
    }

    /// Moves the live records of the oldest page to the tail and frees the page.
    fn compact_one(&mut self) -> StoreResult<()> {
        let bp = self.page_of(self.begin);
        let start = self.begin;
        let end = (bp + 1) * self.ps;
        assert!(end <= self.tail, "compacting the tail page");
        let o = (start % self.ps) as usize;
        if self.compact_read.in_flight() {
            // The device is behind: the read of the page is not done yet.
            self.stats.storage_waits += 1;
            while self.compact_read.in_flight() {
                self.poll_own();
                if self.compact_read.in_flight() {
                    std::thread::sleep(WAIT_STEP);
                }
            }
        }
        if start < self.head {
            match self.compact_read {
                CompactRead::Ready(p, n) if p == bp => {
                    self.compact_buf[n..].fill(0);
                }
                _ => {
                    // Not read ahead (or the read failed): read it now.
                    self.stats.storage_waits += 1;
                    let n = self
                        .file
                        .read_at((bp * self.ps) % self.cap, &mut self.compact_buf)?;
                    self.compact_buf[n..].fill(0);
                }
            }
        } else {
            let (f, _) = self.in_frame(start);
            let ps = self.ps as usize;
            self.compact_buf[o..ps].copy_from_slice(&self.frames[f][o..ps]);
        }
        self.compact_read = CompactRead::None;
        // The page is taken out while its records move (the move may start pages, which must
        // not issue a read into it).
        let page = std::mem::take(&mut self.compact_buf);
        let r = self.compact_page(&page[o..], start, end);
        self.compact_buf = page;
        self.prefetch_compaction();
        r
    }

    /// Compaction of the page whose bytes from `start` are `page`.
    fn compact_page(&mut self, page: &[u8], start: u64, end: u64) -> StoreResult<()> {
        // Live records of the page: the index points at them.
        let now = super::now_ms();
        let mut moves: Vec<(usize, Header)> = Vec::new();
        for (o, h) in record::scan(page) {
            let a = start + o as u64;
            let key = &page[o + HEADER..o + HEADER + h.klen as usize];
            if h.kind == KIND_ELEMENT || h.kind == KIND_ELEMENT_TOMBSTONE {
                // An element's record: live when its collection's element map points at it.
                let Some(c) = collection::decode_composite(key) else {
                    continue;
                };
                if self.colls.element_is_live(&c, a) {
                    if h.kind == KIND_ELEMENT_TOMBSTONE {
                        self.colls.drop_tombstone(&c, a);
                    } else {
                        moves.push((o, h));
                    }
                }
                continue;
            }
            let kh = record::key_hash(key);
            if self.index.get(&kh).is_some_and(|&e| e & ADDR == a) {
                if h.kind == KIND_TOMBSTONE {
                    // Every older record of the key is below it and gone: forget the key.
                    self.index_remove(kh);
                } else if h.expire_ms != 0 && h.expire_ms < now {
                    // Expired: garbage like a tombstone, and the key is gone.
                    self.expire_key(kh);
                } else {
                    moves.push((o, h));
                }
            }
        }
        // The page is free; its records go to the tail (at most one page of them, and the
        // slot freed here is what the next page needs).
        self.begin = end;
        self.stats.compactions += 1;
        for (o, h) in moves {
            let rec = &page[o..o + h.len()];
            let key = &rec[h.key_range()];
            let kh = record::key_hash(key);
            let len = h.len() as u64;
            if self.tail + len > self.tail_page_end {
                let next = self.tail_page_end / self.ps;
                if (next + 1) * self.ps > self.begin + self.cap {
                    return Err(StoreError::LogFull);
                }
                self.start_page(next)?;
            }
            let a = self.tail;
            self.tail += len;
            self.seq += 1;
            let (f, fo) = self.in_frame(a);
            record::encode(
                &mut self.frames[f][fo..fo + len as usize],
                h.kind,
                key,
                &rec[h.value_range()],
                self.seq,
                h.expire_ms,
            );
            self.stats.compaction_moves += 1;
            self.stats.compaction_moved_bytes += len;
            self.dirty = true;
            if h.kind == KIND_ELEMENT {
                if let Some(c) = collection::decode_composite(key) {
                    self.colls.moved(&c, start + o as u64, a);
                    let ty = self.colls.type_of(record::key_hash(c.key));
                    if self.cfg.offload && ty.is_some_and(|t| t != collection::CollType::List) {
                        // As a string's below: the old copy's space is about to be reused.
                        if let Some(eh) = collection::element_cache_hash(c.key, c.sub) {
                            self.invalidate.push(eh.0);
                        }
                    }
                }
                continue;
            }
            self.index_put(kh, value_entry(a, h.expire_ms), h.expire_ms);
            if self.cfg.offload {
                // The DPU may hold the old copy; the new one is cached once it is written.
                // Until then an update of the key must not leave the old copy cached.
                self.invalidate.push(kh.0);
            }
        }
        // A checkpoint may start recovery at the new `begin` once the moved records, below
        // the tail now, are durable.
        self.compacted.push_back((self.begin, self.tail));
        Ok(())
    }

    /// Asks for `[flushed, to)` to be written to the log file (`to ≤ read_only`); the writes
    /// are issued as they may be ([`Store::pump_writes`]).
    fn flush_to(&mut self, to: u64) {
        assert!(to <= self.read_only, "flush past read-only");
        if to > self.flush_want {
            self.flush_want = to;
        }
        self.pump_writes();
    }

    /// Marks the records of `[from, to)` (one page) that are no longer their key's newest
    /// as superseded.
    fn mark_superseded(&mut self, from: u64, to: u64) {
        let p = self.page_of(from);
        let (f, o) = self.in_frame(from);
        let n = (to - from) as usize;
        let mut at = o;
        while at < o + n {
            let Some(h) = record::decode_header(&self.frames[f][at..]) else {
                break;
            };
            let key = &self.frames[f][at + HEADER..at + HEADER + h.klen as usize];
            let ra = p * self.ps + at as u64;
            let newest = if h.kind == KIND_ELEMENT {
                // An element is the newest when its element map points here; a list's
                // elements are never served on the DPU, so they are all marked.
                collection::decode_composite(key).is_some_and(|c| {
                    self.colls
                        .type_of(record::key_hash(c.key))
                        .is_some_and(|t| t != collection::CollType::List)
                        && self.colls.element_is_live(&c, ra)
                })
            } else {
                let kh = record::key_hash(key);
                self.index.get(&kh).is_some_and(|&e| e & ADDR == ra)
            };
            if !newest {
                self.frames[f][at + 5] |= FLAG_SUPERSEDED;
            }
            at += h.len();
        }
    }

    /// Issues the log writes asked for, in address order, while they may go: in chunks that
    /// end on multiples of the largest I/O (within a page), none sharing a device block with
    /// a write in flight, a bounded number in flight, and none over a page slot that the
    /// durable checkpoint still points recovery at (a checkpoint commit goes first).
    fn pump_writes(&mut self) {
        while self.flushed < self.flush_want && !self.broken {
            let a = self.flushed;
            let p = self.page_of(a);
            let page_end = (p + 1) * self.ps;
            if self.ckpt.is_some()
                && page_end > self.durable_begin + self.cap
                && self.durable_begin < self.begin
            {
                // The page's slot is about to be overwritten: the durable checkpoint must not
                // point recovery at what was there.
                self.commit.ckpt_wanted = true;
                self.advance_commit();
                return;
            }
            if !a.is_multiple_of(BLOCK)
                && self
                    .writes
                    .back()
                    .is_some_and(|w| !w.2 && w.1 > a - a % BLOCK)
            {
                return;
            }
            if self.writes.len() >= WRITES_MAX {
                return;
            }
            let to = self.flush_want.min(page_end);
            if self.marked < to {
                // The flags are decided as the records go to storage.
                self.mark_superseded(self.marked.max(a), to);
                self.marked = to;
            }
            let max = self.io.max_io() as u64;
            let end = to.min((a / max + 1) * max);
            let (f, o) = self.in_frame(a);
            let n = (end - a) as usize;
            let t = tag(TAG_LOG_WRITE, a);
            match self
                .io
                .write(LOG, a % self.cap, &self.frames[f][o..o + n], t)
            {
                Ok(()) => {}
                Err(SubmitError::Busy) => return,
                Err(SubmitError::Failed(_)) => {
                    self.fail("a log write could not be issued");
                    return;
                }
            }
            self.writes.push_back((a, end, false));
            self.stats.page_writes += 1;
            self.flushed = end;
        }
    }

    /// A log write completed.
    fn write_done(&mut self, start: u64, ok: bool) {
        let Some(w) = self.writes.iter_mut().find(|w| w.0 == start && !w.2) else {
            tracing::error!(start, "a completion for no log write in flight");
            return;
        };
        w.2 = true;
        if !ok {
            self.fail("a log write failed");
        }
        while self.writes.front().is_some_and(|w| w.2) {
            self.writes.pop_front();
        }
        self.written = self.writes.front().map_or(self.flushed, |w| w.0);
    }

    /// A storage operation failed: the store can no longer say what is durable.
    fn fail(&mut self, what: &str) {
        if !self.broken {
            tracing::error!("{what}: nothing more is acknowledged as durable");
        }
        self.broken = true;
    }

    /// Moves the commit along: begins one when durability or a checkpoint is asked, and
    /// issues its next step once the one before completed.
    fn advance_commit(&mut self) {
        if self.broken {
            return;
        }
        loop {
            match self.commit.phase {
                Phase::Idle => {
                    // What is issued is what the commit can cover now; the rest follows. A
                    // checkpoint asked before a page slot is reused covers every write issued
                    // (the records compaction moved off that slot among them).
                    let target = if self.commit.ckpt_wanted {
                        self.flushed
                    } else {
                        self.commit.want.min(self.flushed)
                    };
                    if target <= self.durable_end && !self.commit.ckpt_wanted {
                        return;
                    }
                    self.commit.target = target.max(self.durable_end);
                    self.commit.ckpt_wanted = false;
                    self.commit.phase = Phase::Writing;
                }
                Phase::Writing => {
                    if self.written < self.commit.target {
                        return;
                    }
                    match self.io.flush(LOG, tag(TAG_LOG_FLUSH, 0)) {
                        Ok(()) => self.commit.phase = Phase::LogFlush,
                        Err(SubmitError::Busy) => return,
                        Err(SubmitError::Failed(_)) => return self.fail("a log flush"),
                    }
                }
                Phase::LogDone => {
                    let Some(ck) = self.ckpt.as_ref() else {
                        self.finish_commit();
                        continue;
                    };
                    // Recovery starts past a compacted page only once the records moved off it
                    // are durable (below the target).
                    let target = self.commit.target;
                    let begin = self
                        .compacted
                        .iter()
                        .rev()
                        .find(|c| c.1 <= target)
                        .map_or(self.durable_begin, |c| c.0);
                    let cp = Checkpoint {
                        begin,
                        flushed: self.commit.target,
                        page_size: self.ps,
                        capacity: self.cap,
                        seq: self.seq,
                    };
                    let (at, bytes, pending) = ck.next(&cp);
                    match self.io.write(CKPT, at, &bytes, tag(TAG_CKPT_WRITE, 0)) {
                        Ok(()) => {
                            self.commit.ckpt = Some(pending);
                            self.commit.phase = Phase::CkptWrite;
                        }
                        Err(SubmitError::Busy) => return,
                        Err(SubmitError::Failed(_)) => return self.fail("a checkpoint write"),
                    }
                }
                Phase::CkptWritten => match self.io.flush(CKPT, tag(TAG_CKPT_FLUSH, 0)) {
                    Ok(()) => self.commit.phase = Phase::CkptFlush,
                    Err(SubmitError::Busy) => return,
                    Err(SubmitError::Failed(_)) => return self.fail("a checkpoint flush"),
                },
                Phase::LogFlush | Phase::CkptWrite | Phase::CkptFlush => return,
            }
        }
    }

    /// The commit in flight is durable.
    fn finish_commit(&mut self) {
        self.durable_end = self.durable_end.max(self.commit.target);
        if let (Some(p), Some(ck)) = (self.commit.ckpt.take(), self.ckpt.as_mut()) {
            ck.written(p);
            self.durable_begin = p.checkpoint().begin;
            self.stats.checkpoints += 1;
            while self
                .compacted
                .front()
                .is_some_and(|c| c.0 <= self.durable_begin)
            {
                self.compacted.pop_front();
            }
        }
        self.commit.phase = Phase::Idle;
        self.stats.commits += 1;
        // Writes that waited for the checkpoint go on.
        self.pump_writes();
    }

    /// One of the commit's operations completed.
    fn commit_step(&mut self, kind: u64, ok: bool) {
        let expect = match kind {
            TAG_LOG_FLUSH => Phase::LogFlush,
            TAG_CKPT_WRITE => Phase::CkptWrite,
            _ => Phase::CkptFlush,
        };
        if self.commit.phase != expect {
            tracing::error!(kind, phase = ?self.commit.phase, "a completion for no commit step");
            return;
        }
        if !ok {
            self.commit.phase = Phase::Idle;
            return self.fail("a commit's storage operation failed");
        }
        match kind {
            TAG_LOG_FLUSH => self.commit.phase = Phase::LogDone,
            TAG_CKPT_WRITE => self.commit.phase = Phase::CkptWritten,
            _ => self.finish_commit(),
        }
    }

    /// Takes the completions of the store's own operations and moves their work along;
    /// the others (the server's reads ahead) are kept for [`Store::poll_io`].
    fn poll_own(&mut self) {
        let mut done = std::mem::take(&mut self.polled);
        self.io.poll(&mut done);
        for &(t, res) in &done {
            let ok = res.is_some();
            let object = t & ((1 << TAG_SHIFT) - 1);
            match t >> TAG_SHIFT {
                0 => self.foreign.push((t, res)),
                TAG_LOG_WRITE => self.write_done(object, ok),
                k @ (TAG_LOG_FLUSH | TAG_CKPT_WRITE | TAG_CKPT_FLUSH) => self.commit_step(k, ok),
                TAG_COMPACT_READ => {
                    if self.compact_read == CompactRead::InFlight(object) {
                        self.compact_read = match res {
                            Some(n) => CompactRead::Ready(object, n as usize),
                            None => CompactRead::Failed(object),
                        };
                    } else {
                        tracing::error!(page = object, "a completion for no compaction read");
                    }
                }
                k => tracing::error!(kind = k, "a completion of an unknown kind: ignored"),
            }
        }
        done.clear();
        self.polled = done;
        self.pump_writes();
        self.advance_commit();
    }

    /// Waits until the log writes below `to` completed (the device is behind the log's
    /// appends).
    fn wait_written(&mut self, to: u64) -> StoreResult<()> {
        if self.written >= to {
            return Ok(());
        }
        self.poll_own();
        if self.written < to {
            self.stats.storage_waits += 1;
        }
        while self.written < to {
            if self.broken {
                return Err(StoreError::Storage(anyhow::anyhow!(
                    "a log write failed: the log cannot go on"
                )));
            }
            std::thread::sleep(WAIT_STEP);
            self.poll_own();
        }
        Ok(())
    }

    /// Waits until no storage operation of the store is in flight.
    pub(super) fn drain_io(&mut self) -> StoreResult<()> {
        loop {
            self.poll_own();
            if self.broken {
                return Err(StoreError::Storage(anyhow::anyhow!(
                    "a storage operation failed"
                )));
            }
            if self.io_in_flight() == 0 {
                return Ok(());
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// The store's storage operations in flight or waiting to be issued (a commit counts
    /// while it is not done).
    pub fn io_in_flight(&self) -> usize {
        self.writes.len()
            + usize::from(self.flushed < self.flush_want)
            + usize::from(self.commit.phase != Phase::Idle)
            + usize::from(self.commit.want.min(self.flushed) > self.durable_end)
            + usize::from(self.compact_read.in_flight())
    }

    /// Takes the completions of the store's operations (moving writes and commits along)
    /// and appends the others (the server's reads ahead, tag kind 0) to `foreign`.
    pub fn poll_io(&mut self, foreign: &mut Vec<IoDone>) {
        self.poll_own();
        foreign.append(&mut self.foreign);
    }

    /// The asynchronous I/O of the log (file 0), for the server's reads ahead: their tags
    /// must leave the top four bits zero.
    pub fn io(&mut self) -> &mut dyn FileIo {
        self.io.as_mut()
    }

    /// The asynchronous I/O of the log, to look at (its wake-up descriptor).
    pub fn io_ref(&self) -> &dyn FileIo {
        self.io.as_ref()
    }

    /// Completions of reads ahead are waiting already (the loop must not sleep).
    pub fn io_ready(&self) -> bool {
        !self.foreign.is_empty()
    }

    /// Begins making every write so far durable (fold-over: the whole log becomes read-only,
    /// its writes are issued), without waiting: [`Store::durable_end`] passes the log's
    /// current tail once the commit completed. Called per event-loop round in `fsync` mode
    /// and periodically in `periodic` mode; does nothing when nothing changed.
    pub fn start_commit(&mut self) -> StoreResult<()> {
        if self.broken {
            return Err(StoreError::Storage(anyhow::anyhow!(
                "a storage operation failed: nothing more is made durable"
            )));
        }
        if !self.dirty {
            return Ok(());
        }
        self.read_only = self.tail;
        self.flush_to(self.tail);
        self.commit.want = self.commit.want.max(self.tail);
        self.dirty = false;
        self.advance_commit();
        Ok(())
    }

    /// Makes every write so far durable and records a checkpoint, waiting for it.
    pub fn commit(&mut self) -> StoreResult<()> {
        self.start_commit()?;
        let want = self.commit.want;
        loop {
            self.poll_own();
            if self.broken {
                return Err(StoreError::Storage(anyhow::anyhow!(
                    "a storage operation failed: the commit is not durable"
                )));
            }
            if self.durable_end >= want && self.commit.phase == Phase::Idle {
                return Ok(());
            }
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// Everything below this log address is durable.
    pub fn durable_end(&self) -> u64 {
        self.durable_end
    }

    /// The log's tail (the address a commit started now would make durable).
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Whether a command since the last call read or wrote a record that is not durable yet
    /// (its reply must wait for the commit that covers the tail, in `fsync` mode).
    pub fn take_undurable(&mut self) -> bool {
        std::mem::take(&mut self.undurable)
    }

    /// Whether a storage operation failed (nothing more is acknowledged as durable).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    pub(super) fn write_checkpoint(&mut self) -> StoreResult<()> {
        let c = Checkpoint {
            begin: self.begin,
            flushed: self.flushed,
            page_size: self.ps,
            capacity: self.cap,
            seq: self.seq,
        };
        if let Some(f) = self.ckpt.as_mut() {
            f.write(&c)?;
            self.durable_begin = self.begin;
            self.stats.checkpoints += 1;
        }
        Ok(())
    }
}
