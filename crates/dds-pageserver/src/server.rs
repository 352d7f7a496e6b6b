//! The page server's host side, a service on the server runtime (`dds-server`,
//! `docs/server-runtime.md`): one event-loop thread owns the log, the buffer pool and the page
//! file. A round reads what the sockets have and runs the complete messages (GetPage batches
//! that can be answered, AppendWal ranges, watermark queries), makes the round's log records
//! durable, and only then sends its replies; on every turn of the loop it replays durable
//! records into pages in LSN order and writes the pages it changed back to the page file
//! (where the DPU's cache-on-write learns them).
//!
//! A GetPage whose page is not in the buffer pool does not wait for storage: its reply's place
//! is reserved, the page's read is issued through [`FileReads`] (the host library's
//! asynchronous API on DDS files), and the connection goes on. When the read completes the
//! page enters the buffer pool and every GetPage waiting for it is answered; replies leave in
//! request order. What must stay ordered does: AppendWal ranges are taken in order and
//! acknowledged after their commit, the replay applies records in LSN order, and a GetPage
//! batch that needs the log applied further holds its connection until the replay gets there
//! (or `lsn_wait` passes). `docs/pageserver-protocol.md` §7.

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
use dds_storage::reads::{DdsReads, FileReads, ReadDone, SyncReads};
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
/// GetPages of one connection waiting for page reads above which its next batch waits.
const WAITING_MAX: u32 = proto::REQUESTS_MAX as u32;
/// Unsent replies above which a connection is not read.
const OUTPUT_PAUSE: usize = 8 << 20;
/// Output buffer a connection keeps once its replies are sent (32 pages of 8 KiB).
const OUTPUT_KEEP: usize = 256 << 10;
/// How long a stop waits for page reads in flight.
const READ_DRAIN: Duration = Duration::from_secs(10);

struct Frame {
    page: u64,
    data: Box<[u8]>,
    dirty: bool,
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
    /// The page was written back while the read was in flight: read it again.
    stale: bool,
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
    /// Records of this round, replayed once the round's commit made them durable.
    round_records: Vec<Replay>,
    frames: Vec<Frame>,
    index: HashMap<u64, usize>,
    hand: usize,
    recache: Vec<(u64, u64, u32, u64)>,
    /// Unparsed input held by all connections.
    input_bytes: usize,
    stats: PageServerStats,
    reads: Box<dyn FileReads>,
    slots: Vec<PageRead>,
    free_slots: Vec<u32>,
    /// Page → its read.
    reading: HashMap<u64, u32>,
    /// Reads in flight.
    issued: usize,
    /// Reads waiting for a place.
    queued: VecDeque<u32>,
    /// Reads that could not be issued: completed as failures on the next turn.
    failed: Vec<ReadDone>,
    done: Vec<ReadDone>,
    /// Connections whose GetPage batch waits for the log: (connection, LSN, since).
    lsn_waiters: Vec<(ConnId, u64, Instant)>,
    /// Connections whose AppendWal waits for the replay queue to shrink.
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
                Waiter {
                    conn: id,
                    ticket,
                    req_id: g.req_id,
                    lsn: g.lsn,
                },
            );
        }
        true
    }

    /// Adds a GetPage to its page's read, issuing the read if there is none.
    fn want(&mut self, page: u64, w: Waiter) {
        if let Some(&slot) = self.reading.get(&page) {
            self.slots[slot as usize].waiters.push(w);
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
                    stale: false,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let r = &mut self.slots[slot as usize];
        r.page = page;
        r.issued = false;
        r.stale = false;
        r.waiters.push(w);
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
        let tag = u64::from(slot) + 1;
        // SAFETY: the buffer belongs to the read's slot; it is neither moved (a boxed slice),
        // touched nor freed until the read's completion is polled (`finish_read`; `shutdown`
        // waits for the reads in flight).
        let issued = unsafe { self.reads.submit(off, r.buf.as_mut_ptr(), ps as u32, tag) };
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

    /// Issues waiting reads while there is room.
    fn pump(&mut self) {
        while self.issued < READS_MAX {
            let Some(slot) = self.queued.pop_front() else {
                return;
            };
            if !self.issue(slot) {
                return;
            }
        }
    }

    /// A page read completed: the page enters the buffer pool (unless the replay brought it
    /// in meanwhile) and every GetPage waiting for it is answered.
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
        let id = r.page;
        let in_pool = self.index.get(&id).copied();
        if in_pool.is_none() && r.stale && res.is_some() {
            // Written back while the read was in flight: it may hold either version, or
            // parts of both.
            r.stale = false;
            if self.issued < READS_MAX && self.queued.is_empty() {
                self.issue(slot);
            } else {
                self.queued.push_back(slot);
            }
            return;
        }
        let frame = match (in_pool, res) {
            (Some(f), _) => Ok(f),
            (None, None) => {
                tracing::error!(page = id, "page read failed");
                Err(status::IO_ERROR)
            }
            (None, Some(n)) => self.install(slot, n as usize).map_err(|e| {
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
            match frame {
                Ok(f) => answer(buf, &self.frames[f].data, w.req_id, w.lsn),
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

    /// Puts the page read into `slot` (`n` bytes) into a frame of the buffer pool.
    fn install(&mut self, slot: u32, n: usize) -> Result<usize> {
        let r = &mut self.slots[slot as usize];
        let id = r.page;
        let n = n.min(r.buf.len());
        r.buf[n..].fill(0);
        let Some(lsn) = page::from_storage(&mut r.buf, id) else {
            bail!("page {id} is damaged on storage (checksum)");
        };
        let f = self.victim()?;
        std::mem::swap(&mut self.frames[f].data, &mut self.slots[slot as usize].buf);
        let fr = &mut self.frames[f];
        fr.page = id;
        fr.dirty = false;
        fr.used = true;
        self.index.insert(id, f);
        self.stats.page_reads += 1;
        if self.cfg.offload && lsn > 0 {
            // The read dropped the page from the DPU's cache; it is unchanged on storage.
            let ps = self.cfg.page_size;
            self.recache.push((id, id * ps as u64, ps as u32, lsn));
        }
        Ok(f)
    }

    /// Queues an AppendWal range; the reply goes out after the round's commit. False: the
    /// message is malformed (the connection closes).
    fn append(&mut self, msg: &[u8], out: &mut Vec<u8>) -> bool {
        let reply = |s: &mut Self, out: &mut Vec<u8>, st: u16| {
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
            true
        };
        let Ok(a) = proto::append(msg) else {
            return false;
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
                return false;
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
        if !self.wal.has_room(bytes) {
            if let Err(e) = self.restart_log() {
                tracing::error!(error = %format!("{e:#}"), "starting the log over failed");
                return reply(self, out, status::IO_ERROR);
            }
            if !self.wal.has_room(bytes) {
                return reply(self, out, status::BAD_REQUEST);
            }
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
        reply(self, out, status::OK)
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

    /// Applies everything queued, writes every dirty page back, and starts the log over.
    fn restart_log(&mut self) -> Result<()> {
        self.wal.commit()?;
        self.replay.extend(self.round_records.drain(..));
        while !self.replay.is_empty() {
            self.replay_some()?;
        }
        self.write_back_all()?;
        self.wal.restart()
    }

    /// The frame holding page `id` for the replay (read from storage on a miss; such a read
    /// tells the DPU nothing: invalidate-on-read drops the page there).
    fn page_frame(&mut self, id: u64) -> Result<usize> {
        if let Some(&f) = self.index.get(&id) {
            self.frames[f].used = true;
            return Ok(f);
        }
        let f = self.victim()?;
        let ps = self.cfg.page_size;
        let fr = &mut self.frames[f];
        let n = self.pages_file.read_at(id * ps as u64, &mut fr.data)?;
        fr.data[n..].fill(0);
        if page::from_storage(&mut fr.data, id).is_none() {
            bail!("page {id} is damaged on storage (checksum)");
        }
        fr.page = id;
        fr.dirty = false;
        fr.used = true;
        self.index.insert(id, f);
        self.stats.page_reads += 1;
        Ok(f)
    }

    /// A free frame (CLOCK), writing a dirty victim back.
    fn victim(&mut self) -> Result<usize> {
        let n = self.frames.len();
        for _ in 0..2 * n + 1 {
            let f = self.hand;
            self.hand = (self.hand + 1) % n;
            let fr = &mut self.frames[f];
            if fr.page == u64::MAX {
                return Ok(f);
            }
            if fr.used {
                fr.used = false;
                continue;
            }
            if fr.dirty {
                self.write_back(f)?;
            }
            let old = self.frames[f].page;
            self.index.remove(&old);
            self.frames[f].page = u64::MAX;
            return Ok(f);
        }
        unreachable!("CLOCK finds a victim in two sweeps")
    }

    fn write_back(&mut self, f: usize) -> Result<()> {
        let ps = self.cfg.page_size as u64;
        let fr = &mut self.frames[f];
        self.pages_file.write_at(fr.page * ps, &fr.data)?;
        fr.dirty = false;
        self.stats.page_writes += 1;
        // A read of the page in flight may see the old version, the new one or parts of both.
        if let Some(&slot) = self.reading.get(&fr.page) {
            let r = &mut self.slots[slot as usize];
            if r.issued {
                r.stale = true;
            }
        }
        Ok(())
    }

    fn write_back_all(&mut self) -> Result<()> {
        for f in 0..self.frames.len() {
            if self.frames[f].dirty {
                self.write_back(f)?;
            }
        }
        self.pages_file.sync()
    }

    /// Applies up to a batch of durable records, then writes the pages they changed back.
    fn replay_some(&mut self) -> Result<()> {
        let mut changed: Vec<usize> = Vec::new();
        for _ in 0..REPLAY_BATCH {
            let Some(r) = self.replay.pop_front() else {
                break;
            };
            match r {
                Replay::Applied(lsn) => self.applied = self.applied.max(lsn),
                Replay::Record {
                    lsn,
                    page: id,
                    offset,
                    data,
                } => {
                    let f = self.page_frame(id)?;
                    let fr = &mut self.frames[f];
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
        for f in changed {
            if self.frames[f].dirty {
                self.write_back(f)?;
            }
        }
        Ok(())
    }

    /// Waits (bounded) for the reads in flight, whose buffers the storage library still
    /// writes into.
    fn drain_reads(&mut self) {
        let until = Instant::now() + READ_DRAIN;
        while self.issued > 0 && Instant::now() < until {
            let mut list = std::mem::take(&mut self.done);
            list.append(&mut self.failed);
            self.reads.poll(&mut list);
            for &(tag, _) in &list {
                if let Some(r) = self.slots.get_mut((tag - 1) as usize) {
                    if r.issued {
                        r.issued = false;
                        self.issued -= 1;
                    }
                }
            }
            list.clear();
            self.done = list;
            if self.issued > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.issued > 0 {
            tracing::error!(
                reads = self.issued,
                "page reads still in flight at the stop: their buffers are left to them"
            );
            std::mem::forget(std::mem::take(&mut self.slots));
        }
    }
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
                    if !self.append(msg, out) {
                        tracing::warn!(conn = id.slot, "malformed log records: closing");
                        at = input.len();
                        break Verdict::Close;
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
        self.reads.poll(&mut list);
        for &(tag, res) in &list {
            let slot = u32::try_from(tag.wrapping_sub(1)).unwrap_or(u32::MAX);
            self.finish_read(slot, res, done);
        }
        list.clear();
        self.done = list;
        self.pump();
        if self.fatal.is_none() {
            if let Err(e) = self.replay_some() {
                tracing::error!(error = %format!("{e:#}"), "replay failed: stopping");
                self.fatal = Some(e);
                self.halt.store(true, Ordering::Relaxed);
            }
        }
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
        // The round's log records become durable before any reply goes out.
        let ok = match self.wal.commit() {
            Ok(()) => {
                self.replay.extend(self.round_records.drain(..));
                true
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "log write failed: the round's replies are withheld");
                false
            }
        };
        if !self.recache.is_empty() {
            if let Err(e) = self.storage.cache(self.pages_file.as_ref(), &self.recache) {
                tracing::warn!(error = %format!("{e:#}"), "telling the DPU about pages failed");
            }
            self.recache.clear();
        }
        ok
    }

    fn closed(&mut self, _id: ConnId, s: PageSession) {
        self.input_bytes -= s.held;
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.reads.wake_fd()
    }

    fn prepare_sleep(&mut self) -> bool {
        let busy = (!self.replay.is_empty() && self.fatal.is_none())
            || !self.failed.is_empty()
            || (!self.budget_waiters.is_empty() && self.input_bytes < self.cfg.input_memory);
        if busy {
            return false;
        }
        // False: completions wait; the loop does not sleep (and calls no end_sleep).
        self.reads.prepare_sleep()
    }

    fn end_sleep(&mut self) {
        self.reads.end_sleep();
    }

    fn in_flight(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    fn shutdown(&mut self) {
        self.drain_reads();
        self.finished = self.write_back_all();
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
        let reads: Box<dyn FileReads> = match (dds, pages_file.dds_id()) {
            (Some(dds), Some(file)) => {
                let r = DdsReads::new(dds, file);
                if r.max_read() >= ps {
                    Box::new(r)
                } else {
                    Box::new(SyncReads::new(storage.open("pages")?))
                }
            }
            _ => Box::new(SyncReads::new(storage.open("pages")?)),
        };
        let frames = (0..cfg.buffer_pool)
            .map(|_| Frame {
                page: u64::MAX,
                data: vec![0u8; ps].into_boxed_slice(),
                dirty: false,
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
            frames,
            index: HashMap::with_capacity(cfg.buffer_pool * 2),
            hand: 0,
            recache: Vec::new(),
            input_bytes: 0,
            stats: PageServerStats::default(),
            reads,
            slots: Vec::new(),
            free_slots: Vec::new(),
            reading: HashMap::with_capacity(READS_MAX * 2),
            issued: 0,
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
