//! The page server's host side, a service on the server runtime (`dds-server`,
//! `docs/server-runtime.md`): one event-loop thread owns the log, the buffer pool and the page
//! file, and never waits for storage. Every storage operation goes through [`FileIo`] (the
//! host library's asynchronous API on DDS files) and completes on a later turn of the loop:
//!
//! - A GetPage whose page is not in the buffer pool reserves its reply's place and issues the
//!   page's read; the connection goes on. When the read completes the page enters the buffer
//!   pool and every GetPage waiting for it is answered; replies leave in request order.
//! - A round's AppendWal records are committed (written, then flushed) after the round, in
//!   one commit with those of the rounds that arrived while the previous commit was in flight
//!   (group commit); their replies wait in reserved places until the commit is durable.
//! - The replay applies durable records in LSN order. A record whose page is not in the pool
//!   stops it while that page (and the pages of the records after it) are read; the pages it
//!   changed are written back without waiting (the DPU's cache-on-write learns them), and a
//!   page leaves the pool only once its last write-back completed.
//! - A full log starts over once the replay caught up and every dirty page is written back
//!   and flushed; AppendWal waits meanwhile.
//!
//! What must stay ordered does: AppendWal ranges are taken in order and acknowledged after
//! their commit, the replay applies records in LSN order, and a GetPage batch that needs the
//! log applied further holds its connection until the replay gets there (or `lsn_wait`
//! passes). `docs/pageserver-protocol.md` §7.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_host::Dds;
use dds_server::{Budget, Completions, Config, ConnId, Out, Service, Ticket, Verdict};
use dds_storage::aio::SubmitError;
use dds_storage::fileio::{DdsIo, FileIo, IoDone, SyncIo};
use dds_storage::{Storage, StoreFile};

use crate::page;
use crate::proto::{self, status, Malformed, MSG_HEADER, RESP_HEADER};
use crate::wal::Wal;

/// Settings of the page server.
#[derive(Clone, Debug)]
pub struct PageServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Page bytes.
    pub page_size: usize,
    /// Pages of the database.
    pub pages: u64,
    /// Pages kept in memory.
    pub buffer_pool: usize,
    /// Log file bytes.
    pub wal_size: u64,
    /// How long a GetPage waits for the log to be applied up to its not-modified-since LSN.
    pub lsn_wait: Duration,
    /// Most connections.
    pub max_connections: usize,
    /// Tell the DPU where pages read for GetPage are (the host library's CACHE records).
    pub offload: bool,
    /// Bytes of unparsed input all connections may hold together; a connection past it is
    /// not read until the others' messages are done.
    pub input_memory: usize,
}

impl Default for PageServerConfig {
    fn default() -> Self {
        PageServerConfig {
            listen: "127.0.0.1:7100".parse().expect("address"),
            page_size: 8192,
            pages: 16384,
            buffer_pool: 1024,
            wal_size: 256 << 20,
            lsn_wait: Duration::from_secs(5),
            max_connections: 1024,
            offload: true,
            input_memory: 256 << 20,
        }
    }
}

/// Counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageServerStats {
    /// GetPage requests answered by the host.
    pub getpages: u64,
    /// Log records applied.
    pub applied: u64,
    /// Pages written back.
    pub page_writes: u64,
    /// Pages read from storage.
    pub page_reads: u64,
    /// GetPage requests answered after an asynchronous page read.
    pub deferred: u64,
}

/// Records applied per turn of the loop at most, so GetPages keep moving.
const REPLAY_BATCH: usize = 512;
/// Unapplied records above which AppendWal waits (back-pressure).
const REPLAY_QUEUE_MAX: usize = 1 << 18;
/// Page reads in flight at most (more wait for a place).
const READS_MAX: usize = 512;
/// Records the replay looks ahead of a record whose page is being read, to read their pages
/// meanwhile.
const REPLAY_LOOKAHEAD: usize = 1024;
/// GetPages of one connection waiting for page reads above which its next batch waits.
const WAITING_MAX: u32 = proto::REQUESTS_MAX as u32;
/// Unsent replies above which a connection is not read.
const OUTPUT_PAUSE: usize = 8 << 20;
/// Output buffer a connection keeps once its replies are sent (32 pages of 8 KiB).
const OUTPUT_KEEP: usize = 256 << 10;
/// How long a stop waits for the storage operations in flight.
const IO_DRAIN: Duration = Duration::from_secs(10);

/// The files of [`FileIo`]: the page file and the log.
const PAGES: usize = 0;
const LOG: usize = 1;

/// A storage operation's tag: its kind in the top bits, its object below.
const TAG_KIND: u32 = 60;
const TAG_READ: u64 = 0;
const TAG_PAGE_WRITE: u64 = 1;
const TAG_LOG_WRITE: u64 = 2;
const TAG_LOG_FLUSH: u64 = 3;
const TAG_PAGES_FLUSH: u64 = 4;

fn tag(kind: u64, object: u64) -> u64 {
    debug_assert!(object < 1 << TAG_KIND);
    kind << TAG_KIND | object
}

struct Frame {
    page: u64,
    data: Box<[u8]>,
    /// Changed since its last write-back was issued.
    dirty: bool,
    /// A write-back is in flight: the frame stays in the pool until it completes.
    writing: bool,
    /// Waits in the write queue.
    queued: bool,
    used: bool,
}

enum Replay {
    Record {
        lsn: u64,
        page: u64,
        offset: u16,
        data: Vec<u8>,
    },
    /// Every LSN up to this one is applied once the queue reaches it.
    Applied(u64),
}

/// A GetPage waiting for its page's read.
#[derive(Clone, Copy)]
struct Waiter {
    conn: ConnId,
    ticket: Ticket,
    req_id: u64,
    /// The request LSN (read point).
    lsn: u64,
}

/// A page read: issued, or waiting for a place among the reads in flight.
struct PageRead {
    page: u64,
    buf: Box<[u8]>,
    waiters: Vec<Waiter>,
    /// In flight (its completion is still to come).
    issued: bool,
    /// Issued for the replay (no GetPage asked for it yet).
    for_replay: bool,
}

/// An AppendWal acknowledged once its commit is durable.
#[derive(Clone, Copy)]
struct Ack {
    conn: ConnId,
    ticket: Ticket,
    /// The log's last LSN when it was taken (the reply's LSN).
    lsn: u64,
}

/// The log commit in flight: the log's pending bytes written in chunks, then a flush.
#[derive(Default)]
struct Commit {
    /// A commit is in flight.
    active: bool,
    /// Log offset and bytes of the commit (a copy of the log's committing bytes' range).
    off: u64,
    len: usize,
    /// Bytes issued so far.
    issued: usize,
    /// Writes issued and not completed.
    writes: u32,
    /// The flush is issued.
    flushing: bool,
    /// The AppendWal replies and records this commit makes durable.
    acks: Vec<Ack>,
    records: Vec<Replay>,
}

/// Starting the log over when it is full: the replay catches up, every dirty page is
/// written back and flushed, then the log's header moves its start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Restart {
    Idle,
    /// Waiting for the commit, the replay and the write-backs.
    Draining,
    /// The page file's flush is in flight.
    Flushing,
}

/// A connection's state.
pub struct PageSession {
    /// The head GetPage batch waits for the log since this instant.
    blocked_since: Option<Instant>,
    /// Unparsed input counted in the input budget.
    held: usize,
    /// GetPages waiting for page reads.
    waiting: u32,
    /// Pending until its GetPages waiting for page reads are answered.
    read_blocked: bool,
}

/// The page server's protocol and engine, served by a [`dds_server::Server`].
pub struct PageService {
    cfg: PageServerConfig,
    storage: Box<dyn Storage>,
    pages_file: Box<dyn StoreFile>,
    wal: Wal,
    /// End of the log ranges accepted (the next AppendWal's start), 0 before the first.
    log_end: u64,
    applied: u64,
    replay: VecDeque<Replay>,
    /// Records of the rounds since the last commit began, replayed once a commit made them
    /// durable, and their replies.
    round_records: Vec<Replay>,
    round_acks: Vec<Ack>,
    commit: Commit,
    restart: Restart,
    frames: Vec<Frame>,
    index: HashMap<u64, usize>,
    hand: usize,
    /// Frames whose write-back waits for a place.
    write_queue: VecDeque<usize>,
    /// Frames the replay batch changed (scratch).
    changed: Vec<usize>,
    /// Page write-backs in flight.
    writes: usize,
    recache: Vec<(u64, u64, u32, u64)>,
    /// Unparsed input held by all connections.
    input_bytes: usize,
    stats: PageServerStats,
    io: Box<dyn FileIo>,
    slots: Vec<PageRead>,
    free_slots: Vec<u32>,
    /// Page → its read.
    reading: HashMap<u64, u32>,
    /// Reads in flight.
    issued: usize,
    /// Reads issued for the replay and not completed.
    replay_reads: usize,
    /// The replay waits for a page read (or a free frame): it goes on at a completion.
    replay_blocked: bool,
    /// Reads waiting for a place.
    queued: VecDeque<u32>,
    /// Operations that could not be issued: completed as failures on the next turn.
    failed: Vec<IoDone>,
    done: Vec<IoDone>,
    /// Connections whose GetPage batch waits for the log: (connection, LSN, since).
    lsn_waiters: Vec<(ConnId, u64, Instant)>,
    /// Connections whose AppendWal waits for the replay queue to shrink or the log to start
    /// over.
    replay_waiters: Vec<ConnId>,
    /// Connections with unparsed input that wait for the input budget.
    budget_waiters: Vec<ConnId>,
    /// Set when the replay failed: the loop stops.
    halt: Arc<AtomicBool>,
    fatal: Option<anyhow::Error>,
    finished: Result<()>,
}

/// Writes a response header into `out[at..]`.
fn header(out: &mut Vec<u8>, st: u16, req_id: u64, lsn: u64) {
    let at = out.len();
    out.resize(at + RESP_HEADER, 0);
    proto::response_header(
        &mut out[at..],
        RESP_HEADER as u32,
        st,
        proto::KIND_GETPAGE,
        req_id,
        lsn,
    );
}

/// A GetPage's reply from the page in memory: the page, or `OLD_VERSION` when it changed
/// after the read point.
fn answer(out: &mut Vec<u8>, data: &[u8], req_id: u64, read_point: u64) {
    let lsn = page::lsn(data);
    if lsn > read_point {
        return header(out, status::OLD_VERSION, req_id, lsn);
    }
    let at = out.len();
    out.resize(at + RESP_HEADER, 0);
    out.extend_from_slice(data);
    proto::response_header(
        &mut out[at..],
        (RESP_HEADER + data.len()) as u32,
        status::OK,
        proto::KIND_GETPAGE,
        req_id,
        lsn,
    );
}

impl PageService {
    /// Answers a GetPage batch (pages in memory at once, the others when their reads
    /// complete), or returns false when it must wait for the replay.
    fn getpages(&mut self, id: ConnId, s: &mut PageSession, msg: &[u8], out: &mut Out<'_>) -> bool {
        let count = proto::u16_at(msg, 4) as usize;
        let need = (0..count)
            .map(|k| proto::getpage(msg, k))
            .filter(|g| g.page < self.cfg.pages && g.nms <= g.lsn)
            .map(|g| g.nms)
            .max()
            .unwrap_or(0);
        let timed_out = if need > self.applied {
            let since = *s.blocked_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.cfg.lsn_wait {
                self.lsn_waiters.push((id, need, since));
                return false;
            }
            true
        } else {
            false
        };
        s.blocked_since = None;
        for k in 0..count {
            let g = proto::getpage(msg, k);
            self.stats.getpages += 1;
            let st = if g.page >= self.cfg.pages {
                status::UNKNOWN_PAGE
            } else if g.nms > g.lsn {
                status::BAD_REQUEST
            } else if timed_out && g.nms > self.applied {
                status::LSN_TIMEOUT
            } else {
                status::OK
            };
            if st != status::OK {
                header(out, st, g.req_id, 0);
                continue;
            }
            if let Some(&f) = self.index.get(&g.page) {
                self.frames[f].used = true;
                answer(out, &self.frames[f].data, g.req_id, g.lsn);
                continue;
            }
            let ticket = out.defer();
            s.waiting += 1;
            self.want(
                g.page,
                Some(Waiter {
                    conn: id,
                    ticket,
                    req_id: g.req_id,
                    lsn: g.lsn,
                }),
            );
        }
        true
    }

    /// Adds a GetPage (or, without a waiter, the replay) to its page's read, issuing the read
    /// if there is none.
    fn want(&mut self, page: u64, w: Option<Waiter>) {
        if let Some(&slot) = self.reading.get(&page) {
            if let Some(w) = w {
                self.slots[slot as usize].waiters.push(w);
            }
            return;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(PageRead {
                    page,
                    buf: vec![0u8; self.cfg.page_size].into_boxed_slice(),
                    waiters: Vec::new(),
                    issued: false,
                    for_replay: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let r = &mut self.slots[slot as usize];
        r.page = page;
        r.issued = false;
        r.for_replay = w.is_none();
        if r.for_replay {
            self.replay_reads += 1;
        }
        r.waiters.extend(w);
        self.reading.insert(page, slot);
        if self.issued < READS_MAX && self.queued.is_empty() {
            self.issue(slot);
        } else {
            self.queued.push_back(slot);
        }
    }

    /// Issues a page read; false when the storage library has no place for it now (it then
    /// waits at the head of the queue).
    fn issue(&mut self, slot: u32) -> bool {
        let ps = self.cfg.page_size;
        let r = &mut self.slots[slot as usize];
        let off = r.page * ps as u64;
        let tag = tag(TAG_READ, u64::from(slot));
        // SAFETY: the buffer belongs to the read's slot; it is neither moved (a boxed slice),
        // touched nor freed until the read's completion is polled (`finish_read`; `shutdown`
        // waits for the reads in flight).
        let issued = unsafe { self.io.read(PAGES, off, r.buf.as_mut_ptr(), ps as u32, tag) };
        match issued {
            Ok(()) => {}
            Err(SubmitError::Busy) => {
                self.queued.push_front(slot);
                return false;
            }
            Err(SubmitError::Failed(_)) => self.failed.push((tag, None)),
        }
        r.issued = true;
        self.issued += 1;
        true
    }

    /// Issues waiting reads and write-backs while there is room.
    fn pump(&mut self) {
        while self.issued < READS_MAX {
            let Some(slot) = self.queued.pop_front() else {
                break;
            };
            if !self.issue(slot) {
                break;
            }
        }
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
    fn writes_max(&self) -> usize {
        (self.frames.len() / 4).clamp(1, READS_MAX)
    }

    /// A page read completed: the page enters the buffer pool and every GetPage waiting for it
    /// is answered.
    fn finish_read(
        &mut self,
        slot: u32,
        res: Option<u32>,
        done: &mut Completions<'_, PageSession>,
    ) {
        let Some(r) = self.slots.get_mut(slot as usize).filter(|r| r.issued) else {
            tracing::error!(slot, "a completion for a read not in flight");
            return;
        };
        r.issued = false;
        self.issued -= 1;
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
        let mut waiters = std::mem::take(&mut self.slots[slot as usize].waiters);
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
                Ok(None) => answer(buf, &self.slots[slot as usize].buf, w.req_id, w.lsn),
                Err(st) => header(buf, st, w.req_id, 0),
            }
            self.stats.deferred += 1;
            if resume {
                done.resume(w.conn);
            }
        }
        waiters.clear();
        self.slots[slot as usize].waiters = waiters;
        self.reading.remove(&id);
        self.free_slots.push(slot);
    }

    /// Puts the page read into `slot` (`n` bytes) into a frame of the buffer pool, and, with
    /// `recache`, tells the DPU where it is again (a page read for the replay is about to
    /// change: its write-back tells the DPU). `None`: every frame is busy (written back); the
    /// page is answered from the read's buffer and read again when needed.
    fn install(&mut self, slot: u32, n: usize, recache: bool) -> Result<Option<usize>> {
        let r = &mut self.slots[slot as usize];
        let id = r.page;
        let n = n.min(r.buf.len());
        r.buf[n..].fill(0);
        let Some(lsn) = page::from_storage(&mut r.buf, id) else {
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
        std::mem::swap(&mut self.frames[f].data, &mut self.slots[slot as usize].buf);
        let fr = &mut self.frames[f];
        fr.page = id;
        fr.dirty = false;
        fr.used = true;
        self.index.insert(id, f);
        Ok(Some(f))
    }

    /// Queues an AppendWal range; its reply goes out once the commit holding it is durable.
    /// `None`: the log is full and must start over first (the message waits). `Some(false)`:
    /// the message is malformed (the connection closes).
    fn append(&mut self, id: ConnId, msg: &[u8], out: &mut Out<'_>) -> Option<bool> {
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
        if self.restart != Restart::Idle || !self.wal.has_room(bytes) {
            if self.restart == Restart::Idle {
                tracing::info!(
                    lsn = self.wal.last_lsn(),
                    "the log is full: starting it over"
                );
                self.restart = Restart::Draining;
            }
            return None;
        }
        for r in proto::records(a.records, a.count).flatten() {
            self.wal.add(&r);
            self.round_records.push(Replay::Record {
                lsn: r.lsn,
                page: r.page,
                offset: r.offset,
                data: r.data.to_vec(),
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

    fn watermark(&self, msg: &[u8], out: &mut Vec<u8>) {
        let req_id = proto::u64_at(msg, MSG_HEADER);
        let mut h = [0u8; RESP_HEADER + 8];
        proto::response_header(
            &mut h,
            (RESP_HEADER + 8) as u32,
            status::OK,
            proto::KIND_WATERMARK,
            req_id,
            self.applied,
        );
        h[RESP_HEADER..].copy_from_slice(&self.wal.last_lsn().to_le_bytes());
        out.extend_from_slice(&h);
    }

    /// Begins committing what the log holds, unless a commit is in flight (the next one
    /// then takes everything added meanwhile: group commit).
    fn start_commit(&mut self) {
        if self.commit.active || (!self.wal.has_pending() && self.round_records.is_empty()) {
            return;
        }
        let c = &mut self.commit;
        let (off, bytes) = self.wal.begin_commit();
        c.active = true;
        c.off = off;
        c.len = bytes.len();
        c.issued = 0;
        c.writes = 0;
        c.flushing = false;
        std::mem::swap(&mut c.acks, &mut self.round_acks);
        std::mem::swap(&mut c.records, &mut self.round_records);
        self.pump_commit();
    }

    /// Issues the commit's writes (in chunks that end on multiples of the largest I/O, so no
    /// two share a block) and, once they completed, its flush.
    fn pump_commit(&mut self) {
        let c = &mut self.commit;
        if !c.active || c.flushing || c.len == 0 {
            // A commit of ranges without records has nothing to write: it completes on the
            // loop's next turn (`complete`), in order after the commits before it.
            return;
        }
        let max = self.io.max_io() as u64;
        while c.issued < c.len {
            let at = c.off + c.issued as u64;
            let n = ((at / max + 1) * max - at).min((c.len - c.issued) as u64) as usize;
            let data = &self.wal.committing()[c.issued..c.issued + n];
            match self.io.write(LOG, at, data, tag(TAG_LOG_WRITE, 0)) {
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
    fn commit_done(&mut self, kind: u64, ok: bool, done: &mut Completions<'_, PageSession>) {
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
    fn finish_commit(&mut self, done: &mut Completions<'_, PageSession>) {
        self.wal.end_commit();
        let c = &mut self.commit;
        c.active = false;
        self.replay.extend(c.records.drain(..));
        for a in c.acks.drain(..) {
            if let Some((_, buf)) = done.fill(a.conn, a.ticket) {
                append_reply(buf, status::OK, a.lsn);
            }
        }
        self.start_commit();
    }

    /// Stops the server after a storage failure the page server cannot go on from.
    fn fail(&mut self, e: anyhow::Error) {
        if self.fatal.is_none() {
            tracing::error!(error = %format!("{e:#}"), "stopping");
            self.fatal = Some(e);
            self.halt.store(true, Ordering::Relaxed);
        }
    }

    /// Issues the write-back of frame `f` (the page's bytes are taken at once). False when
    /// there is no place for it now (it waits in the write queue). A frame with a write in
    /// flight stays dirty and is written again when that write completes.
    fn write_back(&mut self, f: usize) -> bool {
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
    fn write_done(&mut self, f: usize, ok: bool) {
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
    fn victim(&mut self) -> Option<usize> {
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

    /// Applies up to a batch of durable records in LSN order, then writes the pages they
    /// changed back. A record whose page is not in the pool stops the batch: its page is read
    /// (with the pages of the records after it, read ahead), and the replay goes on when a
    /// read completes.
    fn replay_some(&mut self) {
        if self.replay_blocked || self.fatal.is_some() {
            return;
        }
        let mut changed = std::mem::take(&mut self.changed);
        for _ in 0..REPLAY_BATCH {
            match self.replay.front() {
                None => break,
                Some(&Replay::Applied(lsn)) => {
                    self.applied = self.applied.max(lsn);
                    self.replay.pop_front();
                }
                Some(&Replay::Record { page: id, .. }) => {
                    let Some(&f) = self.index.get(&id) else {
                        self.read_ahead();
                        break;
                    };
                    let Some(Replay::Record {
                        lsn, offset, data, ..
                    }) = self.replay.pop_front()
                    else {
                        unreachable!("the front is a record");
                    };
                    let fr = &mut self.frames[f];
                    fr.used = true;
                    if lsn > page::lsn(&fr.data) {
                        page::patch(&mut fr.data, offset as usize, &data);
                        page::seal(&mut fr.data, id, lsn);
                        if !fr.dirty {
                            fr.dirty = true;
                            changed.push(f);
                        }
                    }
                    self.stats.applied += 1;
                }
            }
        }
        for &f in &changed {
            self.write_back(f);
        }
        changed.clear();
        self.changed = changed;
    }

    /// The replay's next record needs a page that is not in the pool: read it, and the pages
    /// of the records after it (up to an eighth of the pool, so that pages read ahead are not
    /// evicted before the replay gets to them), so that many reads are in flight.
    fn read_ahead(&mut self) {
        self.replay_blocked = true;
        let room = (self.frames.len() / 8).clamp(1, READS_MAX / 2);
        let mut k = 0;
        while k < REPLAY_LOOKAHEAD.min(self.replay.len()) && self.replay_reads < room {
            if let Replay::Record { page, .. } = self.replay[k] {
                if !self.index.contains_key(&page) && !self.reading.contains_key(&page) {
                    self.want(page, None);
                }
            }
            k += 1;
        }
        // Any completion may free a frame or bring a page in; with none to come, try again on
        // the next turn.
        self.replay_blocked = self.io_in_flight();
    }

    /// Storage operations whose completions will wake the loop.
    fn io_in_flight(&self) -> bool {
        self.issued > 0
            || self.writes > 0
            || self.commit.active
            || self.restart == Restart::Flushing
    }

    /// Drives the log's restart: once the commit, the replay and every write-back are done,
    /// flush the page file, then move the log's start.
    fn advance_restart(&mut self) {
        if self.restart != Restart::Draining
            || self.commit.active
            || self.wal.has_pending()
            || !self.replay.is_empty()
            || self.fatal.is_some()
        {
            return;
        }
        for f in 0..self.frames.len() {
            if self.frames[f].dirty {
                self.write_back(f);
            }
        }
        if self.writes > 0 || !self.write_queue.is_empty() {
            return;
        }
        match self.io.flush(PAGES, tag(TAG_PAGES_FLUSH, 0)) {
            Ok(()) => self.restart = Restart::Flushing,
            Err(SubmitError::Busy) => {}
            Err(SubmitError::Failed(_)) => {
                self.failed.push((tag(TAG_PAGES_FLUSH, 0), None));
                self.restart = Restart::Flushing;
            }
        }
    }

    /// The page file's flush of a restart completed.
    fn restart_done(&mut self, ok: bool, done: &mut Completions<'_, PageSession>) {
        if self.restart != Restart::Flushing {
            tracing::error!("a page-file flush with no restart in flight");
            return;
        }
        let r = if ok {
            self.wal.restart()
        } else {
            Err(anyhow::anyhow!("flushing the page file failed"))
        };
        if let Err(e) = r {
            self.fail(e.context("starting the log over"));
            return;
        }
        self.restart = Restart::Idle;
        for id in self.replay_waiters.drain(..) {
            done.resume(id);
        }
    }

    /// Waits (bounded) for the storage operations in flight, whose buffers the storage
    /// library may still write into, then writes every dirty page back.
    fn drain_io(&mut self) -> Result<()> {
        let until = Instant::now() + IO_DRAIN;
        let mut list = std::mem::take(&mut self.done);
        loop {
            list.append(&mut self.failed);
            self.io.poll(&mut list);
            for &(t, res) in &list {
                let object = t & ((1 << TAG_KIND) - 1);
                match t >> TAG_KIND {
                    TAG_READ => {
                        if let Some(r) = self.slots.get_mut(object as usize) {
                            if r.issued {
                                r.issued = false;
                                self.issued -= 1;
                            }
                        }
                    }
                    TAG_PAGE_WRITE => self.write_done(object as usize, res.is_some()),
                    TAG_LOG_WRITE => self.commit.writes = self.commit.writes.saturating_sub(1),
                    TAG_LOG_FLUSH => {
                        if res.is_some() {
                            self.wal.end_commit();
                        }
                        self.commit.active = false;
                    }
                    _ => self.restart = Restart::Idle,
                }
            }
            list.clear();
            if self.commit.active && self.commit.len == 0 {
                self.wal.end_commit();
                self.commit.active = false;
            }
            let busy = self.issued > 0 || self.writes > 0 || self.commit.active;
            if !busy || Instant::now() >= until {
                break;
            }
            if self.commit.active && self.commit.writes == 0 && !self.commit.flushing {
                self.pump_commit();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.done = list;
        if self.issued > 0 || self.writes > 0 || self.commit.active {
            tracing::error!(
                reads = self.issued,
                writes = self.writes,
                "storage operations still in flight at the stop: their buffers are left to them"
            );
            std::mem::forget(std::mem::take(&mut self.slots));
            bail!("storage operations did not complete within {IO_DRAIN:?}");
        }
        if self.fatal.is_some() {
            // What is in memory may not follow what is durable: recovery redoes the log.
            return Ok(());
        }
        for fr in &mut self.frames {
            if fr.dirty && fr.page != u64::MAX {
                let ps = self.cfg.page_size as u64;
                self.pages_file.write_at(fr.page * ps, &fr.data)?;
                fr.dirty = false;
            }
        }
        self.pages_file.sync()
    }
}

/// An AppendWal reply.
fn append_reply(out: &mut Vec<u8>, st: u16, lsn: u64) {
    let mut h = [0u8; RESP_HEADER];
    proto::response_header(&mut h, RESP_HEADER as u32, st, proto::KIND_APPEND, 0, lsn);
    out.extend_from_slice(&h);
}

impl Service for PageService {
    type Session = PageSession;

    fn open(&mut self, _id: ConnId) -> PageSession {
        PageSession {
            blocked_since: None,
            held: 0,
            waiting: 0,
            read_blocked: false,
        }
    }

    fn on_input(
        &mut self,
        id: ConnId,
        s: &mut PageSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        let mut verdict = loop {
            let rest = &input[at..];
            let n = match proto::message_len(rest) {
                Ok(Some(n)) if rest.len() >= n => n,
                Ok(_) => break Verdict::Continue,
                Err(Malformed(why)) => {
                    tracing::warn!(conn = id.slot, why, "malformed message: closing");
                    at = input.len();
                    break Verdict::Close;
                }
            };
            let msg = &rest[..n];
            match proto::u16_at(msg, 6) {
                proto::KIND_GETPAGE => {
                    let count = u32::from(proto::u16_at(msg, 4));
                    if s.waiting > 0 && s.waiting + count > WAITING_MAX {
                        // Pipelined past a batch: the next waits for the pages being read.
                        s.read_blocked = true;
                        break Verdict::Pending;
                    }
                    if !self.getpages(id, s, msg, out) {
                        break Verdict::Pending;
                    }
                }
                proto::KIND_APPEND => {
                    if self.replay.len() + self.round_records.len() > REPLAY_QUEUE_MAX {
                        self.replay_waiters.push(id);
                        break Verdict::Pending;
                    }
                    match self.append(id, msg, out) {
                        Some(true) => {}
                        Some(false) => {
                            tracing::warn!(conn = id.slot, "malformed log records: closing");
                            at = input.len();
                            break Verdict::Close;
                        }
                        None => {
                            // The log starts over first.
                            self.replay_waiters.push(id);
                            break Verdict::Pending;
                        }
                    }
                }
                _ => self.watermark(msg, out),
            }
            at += n;
        };
        // The input budget: a connection that holds unparsed input while every connection
        // together holds the budget is not read until there is room again.
        let left = input.len() - at;
        self.input_bytes = self.input_bytes - s.held + left;
        s.held = left;
        if verdict == Verdict::Continue && left > 0 && self.input_bytes >= self.cfg.input_memory {
            self.budget_waiters.push(id);
            verdict = Verdict::Pending;
        }
        (at, verdict)
    }

    fn input_overflow(&mut self, _out: &mut Out<'_>) {
        // Unreachable in practice: the unparsed input is at most one incomplete message,
        // whose length is checked against the largest one. A malformed message gets no reply.
    }

    fn rejected(&self) -> &'static [u8] {
        b""
    }

    fn complete(&mut self, done: &mut Completions<'_, PageSession>) {
        let mut list = std::mem::take(&mut self.done);
        list.append(&mut self.failed);
        self.io.poll(&mut list);
        if !list.is_empty() {
            // A completion may have brought the replay's page in or freed a frame for it.
            self.replay_blocked = false;
        }
        for &(t, res) in &list {
            let object = t & ((1 << TAG_KIND) - 1);
            match t >> TAG_KIND {
                TAG_READ => self.finish_read(object as u32, res, done),
                TAG_PAGE_WRITE => self.write_done(object as usize, res.is_some()),
                TAG_LOG_WRITE => self.commit_done(TAG_LOG_WRITE, res.is_some(), done),
                TAG_LOG_FLUSH => self.commit_done(TAG_LOG_FLUSH, res.is_some(), done),
                TAG_PAGES_FLUSH => self.restart_done(res.is_some(), done),
                _ => tracing::error!(tag = t, "a completion for no operation of ours"),
            }
        }
        list.clear();
        self.done = list;
        if self.commit.active && self.commit.len == 0 {
            self.finish_commit(done);
        }
        self.pump();
        self.pump_commit();
        self.replay_some();
        self.advance_restart();
        if !self.lsn_waiters.is_empty() {
            let (applied, wait) = (self.applied, self.cfg.lsn_wait);
            self.lsn_waiters.retain(|&(id, need, since)| {
                if need <= applied || since.elapsed() >= wait {
                    done.resume(id);
                    false
                } else {
                    true
                }
            });
        }
        if !self.replay_waiters.is_empty()
            && self.restart == Restart::Idle
            && self.replay.len() + self.round_records.len() <= REPLAY_QUEUE_MAX
        {
            for id in self.replay_waiters.drain(..) {
                done.resume(id);
            }
        }
        if !self.budget_waiters.is_empty() && self.input_bytes < self.cfg.input_memory {
            for id in self.budget_waiters.drain(..) {
                done.resume(id);
            }
        }
    }

    fn end_round(&mut self) -> bool {
        // The round's log records are committed (after the commit in flight, if any); their
        // replies wait in reserved places until it is durable.
        self.start_commit();
        if !self.recache.is_empty() {
            if let Err(e) = self.storage.cache(self.pages_file.as_ref(), &self.recache) {
                tracing::warn!(error = %format!("{e:#}"), "telling the DPU about pages failed");
            }
            self.recache.clear();
        }
        true
    }

    fn closed(&mut self, _id: ConnId, s: PageSession) {
        self.input_bytes -= s.held;
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.io.wake_fd()
    }

    fn prepare_sleep(&mut self) -> bool {
        let replay_can_move = !self.replay.is_empty() && !self.replay_blocked;
        // Work that no completion will wake the loop for.
        let idle_io = !self.io_in_flight();
        let busy = (replay_can_move && self.fatal.is_none())
            || !self.failed.is_empty()
            || (self.commit.active && self.commit.len == 0)
            || (idle_io && (self.restart == Restart::Draining || !self.write_queue.is_empty()))
            || (!self.budget_waiters.is_empty() && self.input_bytes < self.cfg.input_memory);
        if busy {
            return false;
        }
        // False: completions wait; the loop does not sleep (and calls no end_sleep).
        self.io.prepare_sleep()
    }

    fn end_sleep(&mut self) {
        self.io.end_sleep();
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
            + self.writes
            + self.commit.acks.len()
            + self.round_acks.len()
    }

    fn shutdown(&mut self) {
        self.finished = self.drain_io();
    }
}

/// The page server: the service on an event loop.
pub struct PageServer {
    inner: dds_server::Server<PageService>,
    halt: Arc<AtomicBool>,
}

impl PageServer {
    /// Opens the files in `storage` (recovering the log into the pages) and binds. Page reads
    /// go through a second handle of the page file, done when issued.
    pub fn open(cfg: PageServerConfig, storage: Box<dyn Storage>) -> Result<PageServer> {
        PageServer::open_with_dds(cfg, storage, None)
    }

    /// [`PageServer::open`], with page reads issued through the host library's asynchronous
    /// API when `dds` is the connection of a DDS `storage`.
    pub fn open_with_dds(
        cfg: PageServerConfig,
        storage: Box<dyn Storage>,
        dds: Option<Arc<Dds>>,
    ) -> Result<PageServer> {
        if !cfg.page_size.is_power_of_two() || !(4096..=65536).contains(&cfg.page_size) {
            bail!("page size must be a power of two from 4096 to 65536");
        }
        if cfg.buffer_pool < 4 {
            bail!("the buffer pool needs at least 4 pages");
        }
        let pages_file = storage.open("pages")?;
        let want = cfg.pages * cfg.page_size as u64;
        if pages_file.size()? < want {
            pages_file
                .set_size(want)
                .with_context(|| format!("size the page file to {want} bytes"))?;
        }
        let ps = cfg.page_size;
        let n = cfg.pages;
        // Recovery: redo every logged record the stored page does not hold yet.
        let mut redo: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut last = 0u64;
        let wal_file = storage.open("wal")?;
        let wal_id = wal_file.dds_id();
        let wal = Wal::open(wal_file, cfg.wal_size, |r| {
            if r.page >= n || r.offset as usize + r.data.len() > ps - page::HEADER {
                bail!("log record {} is outside the database", r.lsn);
            }
            let p = match redo.entry(r.page) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let mut b = vec![0u8; ps];
                    pages_file.read_at(r.page * ps as u64, &mut b)?;
                    if page::from_storage(&mut b, r.page).is_none() {
                        bail!("page {} is damaged on storage", r.page);
                    }
                    v.insert(b)
                }
            };
            if r.lsn > page::lsn(p) {
                page::patch(p, r.offset as usize, r.data);
                page::seal(p, r.page, r.lsn);
            }
            last = r.lsn;
            Ok(())
        })?;
        let mut redone = 0;
        for (id, p) in &redo {
            pages_file.write_at(id * ps as u64, p)?;
            redone += 1;
        }
        pages_file.sync()?;
        let last = last.max(wal.last_lsn());
        if redone > 0 || last > 0 {
            tracing::info!(
                pages = redone,
                lsn = last,
                "recovered the log into the pages"
            );
        }
        let mut cfg = cfg;
        if cfg.offload {
            // Without an offload engine on the DPU there is nothing to tell it.
            cfg.offload = storage.expose(pages_file.as_ref())?;
        }
        // Page reads and write-backs and log commits go through the host library's
        // asynchronous API on DDS files; through second handles, done when issued, otherwise.
        let io: Box<dyn FileIo> = match (dds, pages_file.dds_id(), wal_id) {
            (Some(dds), Some(pages), Some(log)) if dds.hello().max_io_bytes as usize >= ps => {
                Box::new(DdsIo::new(dds, &[pages, log]))
            }
            _ => Box::new(SyncIo::new(vec![
                storage.open("pages")?,
                storage.open("wal")?,
            ])),
        };
        let frames = (0..cfg.buffer_pool)
            .map(|_| Frame {
                page: u64::MAX,
                data: vec![0u8; ps].into_boxed_slice(),
                dirty: false,
                writing: false,
                queued: false,
                used: false,
            })
            .collect();
        let halt = Arc::new(AtomicBool::new(false));
        let service = PageService {
            storage,
            pages_file,
            wal,
            log_end: if last > 0 { last + 1 } else { 0 },
            applied: last,
            replay: VecDeque::new(),
            round_records: Vec::new(),
            round_acks: Vec::new(),
            commit: Commit::default(),
            restart: Restart::Idle,
            frames,
            index: HashMap::with_capacity(cfg.buffer_pool * 2),
            hand: 0,
            write_queue: VecDeque::with_capacity(cfg.buffer_pool),
            writes: 0,
            changed: Vec::with_capacity(REPLAY_BATCH),
            recache: Vec::new(),
            input_bytes: 0,
            stats: PageServerStats::default(),
            io,
            slots: Vec::new(),
            free_slots: Vec::new(),
            reading: HashMap::with_capacity(READS_MAX * 2),
            issued: 0,
            replay_reads: 0,
            replay_blocked: false,
            queued: VecDeque::new(),
            failed: Vec::new(),
            done: Vec::with_capacity(READS_MAX),
            lsn_waiters: Vec::new(),
            replay_waiters: Vec::new(),
            budget_waiters: Vec::new(),
            halt: halt.clone(),
            fatal: None,
            finished: Ok(()),
            cfg,
        };
        let rt = Config {
            max_connections: service.cfg.max_connections,
            // At most one incomplete message is ever held (its length is checked first).
            input_limit: proto::MSG_MAX + MSG_HEADER,
            output_pause: OUTPUT_PAUSE,
            output_keep: OUTPUT_KEEP,
            // The lsn-wait deadlines are checked at least this often.
            tick: Duration::from_millis(20),
            ..Config::default()
        };
        // Input is bounded by the service's own budget (`input_memory`: a connection past it
        // waits, it is not closed); output by `output_pause` per connection, as before.
        let budget = Budget::new(usize::MAX / 2);
        let listen = service.cfg.listen;
        let inner = dds_server::Server::bind(listen, rt, budget, service)
            .with_context(|| format!("listen on {listen}"))?;
        Ok(PageServer { inner, halt })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.inner.local_addr())
    }

    /// The last applied LSN (recovered, at start).
    pub fn applied_lsn(&self) -> u64 {
        self.inner.service().applied
    }

    /// Counters.
    pub fn stats(&self) -> PageServerStats {
        self.inner.service().stats
    }

    /// Serves until `stop` is set (or the replay fails), drains, then writes every dirty page
    /// back.
    pub fn run(self, stop: &AtomicBool) -> Result<()> {
        let PageServer { inner, halt } = self;
        let over = AtomicBool::new(false);
        let mut service = std::thread::scope(|sc| {
            sc.spawn(|| {
                while !over.load(Ordering::Relaxed) {
                    if stop.load(Ordering::Relaxed) {
                        halt.store(true, Ordering::Relaxed);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            let service = inner.run(&halt);
            over.store(true, Ordering::Relaxed);
            service
        });
        if let Some(e) = service.fatal.take() {
            return Err(e);
        }
        std::mem::replace(&mut service.finished, Ok(()))
    }
}
