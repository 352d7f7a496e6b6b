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
//! - The replay appends durable records to their pages' record chains (the log's records in
//!   memory, per page) and applies them to the pages in the buffer pool; a page not in the
//!   pool is materialized in the background (its newest image read, its chain applied). The
//!   pages it changed are written back as new images, to one of the page's four slots
//!   (`history`), without waiting (the DPU's cache-on-write learns them).
//! - GetPage@LSN answers the page as of any LSN from the retention horizon up: the newest image
//!   at or below it plus the chain's records after it.
//! - Checkpoints (`history`) flush the page file, move the horizon and the log's tail in its
//!   header, and so free log space in the background.
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
use dds_storage::fileio::{DdsIo, FileIo, IoDone, SyncIo};
use dds_storage::inflight::InFlightReads;
use dds_storage::{Storage, StoreFile};

use crate::page;
use crate::proto::{self, status, Malformed, MSG_HEADER, RESP_HEADER};
use crate::wal::Wal;
use reads::Plan;

mod dpu;
mod history;
mod log;
mod pool;
mod reads;
mod replay;

pub use history::Retention;

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
    /// How much history GetPage@LSN reaches back (the retention horizon).
    pub retention: Retention,
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
            retention: Retention::Time(Duration::from_secs(10)),
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
    /// GetPage requests answered below the newest version of their page.
    pub historical: u64,
    /// GetPage requests answered `BELOW_HORIZON`.
    pub below_horizon: u64,
    /// Images written for checkpoints (versions at the horizon).
    pub checkpoint_images: u64,
    /// Checkpoints whose header is durable.
    pub checkpoints: u64,
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
const TAG_IMAGE_WRITE: u64 = 5;
const TAG_HEADER_WRITE: u64 = 6;
const TAG_HEADER_FLUSH: u64 = 7;
/// A cache record about a slot (completion not waited for).
const TAG_DPU: u64 = 8;

fn tag(kind: u64, object: u64) -> u64 {
    debug_assert!(object < 1 << TAG_KIND);
    kind << TAG_KIND | object
}

struct Frame {
    page: u64,
    data: Box<[u8]>,
    /// Changed since its last write-back was issued.
    dirty: bool,
    /// A write-back is in flight (to `slot`): the frame stays in the pool until it completes.
    writing: bool,
    slot: u8,
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
        /// Log offset just past the record.
        end: u64,
    },
    /// Every LSN up to this one is applied once the queue reaches it.
    Applied(u64),
}

/// A retained log record of a page (its chain, `docs/pageserver-protocol.md` §5.2).
struct Rec {
    lsn: u64,
    offset: u16,
    data: Box<[u8]>,
}

/// A retained record in log order: what moving the log's tail past it needs.
#[derive(Clone, Copy)]
struct LogRec {
    lsn: u64,
    page: u64,
    /// Log offset just past it.
    end: u64,
}

/// Image slots per page.
const SLOTS: usize = page::SLOTS;
/// The read of every slot of a page (its images not known yet).
const ALL: u8 = SLOTS as u8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SlotState {
    Empty,
    Image,
    /// A write is in flight: the slot's content is undefined until it completes.
    Writing,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    lsn: u64,
    /// The page-file flush that makes the image durable (durable once it completed).
    flush: u64,
    /// Reads in flight.
    reads: u16,
    /// The end of the image's LSN range in its DPU cache entry (`offload::OPEN` while no
    /// later record is known).
    next: u64,
    /// The image's next-record stamp (0: none).
    stamp: u64,
}

const EMPTY_SLOT: Slot = Slot {
    state: SlotState::Empty,
    lsn: 0,
    flush: 0,
    reads: 0,
    next: 0,
    stamp: 0,
};

/// A page's images and record chain.
struct PageMeta {
    /// The slots were read (or written).
    known: bool,
    slots: [Slot; SLOTS],
    chain: VecDeque<Rec>,
    /// Waits for (or has) a materialization read.
    materialize: bool,
    /// A checkpoint's image of it is being made.
    imaging: bool,
    /// The LSN of the last record dropped from the chain (images below it are not used).
    floor: u64,
    /// The LSN of its last record taken into the log.
    logged: u64,
    /// Its DPU cache entries were dropped in this life (before its slots were known).
    forgotten: bool,
}

/// What a page read is for besides its GetPages.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Purpose {
    /// GetPages only.
    Get,
    /// The page's newest version into the pool (materialization).
    Latest,
    /// An image at this LSN for a checkpoint.
    At(u64),
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
    /// The slot read, or `ALL`.
    slot: u8,
    waiters: Vec<Waiter>,
    purpose: Purpose,
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
    /// Bytes of the commit.
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
    /// Bytes of `dpu_drop` and `dpu_close` issued.
    drop_issued: usize,
    close_issued: usize,
}

/// A checkpoint (`docs/pageserver-protocol.md` §5.4): the page file's flush, then the log's
/// next header, then the log's flush.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Checkpoint {
    Idle,
    FlushingPages,
    WritingHeader,
    /// The header is written; its flush waits for a place.
    HeaderWritten,
    FlushingLog,
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
    /// The storage the files are on, open while they are.
    _storage: Box<dyn Storage>,
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
    frames: Vec<Frame>,
    index: HashMap<u64, usize>,
    hand: usize,
    /// Frames whose write-back waits for a place.
    write_queue: VecDeque<usize>,
    /// Frames the replay batch changed (scratch).
    changed: Vec<usize>,
    /// Page write-backs in flight (frames' and checkpoints' images).
    writes: usize,
    /// Frames whose write-back found no free slot: queued again at the next completion.
    stalled: Vec<usize>,
    /// Every page's images and chain.
    meta: Vec<PageMeta>,
    /// Retained records in log order.
    log_order: VecDeque<LogRec>,
    /// Pages waiting for a materialization read.
    materialize_queue: VecDeque<u64>,
    /// Scratch page for checkpoint images.
    scratch: Box<[u8]>,
    /// The retention horizon in force (the durable header's).
    horizon: u64,
    /// Image slots holding an image (of the pages whose slots are known).
    images: u64,
    /// The horizon of the checkpoint in flight (its bases are kept too).
    pending_horizon: u64,
    /// The wanted horizon raised for room in the log (0: none).
    pressure: u64,
    /// An AppendWal found no room in the log: it waits for a checkpoint.
    log_full: bool,
    /// (when, applied LSN) of recent commits, for a horizon in time.
    samples: VecDeque<(Instant, u64)>,
    checkpoint: Checkpoint,
    /// When the last checkpoint began.
    checkpoint_at: Instant,
    /// Records the checkpoint in flight moves the tail past.
    reclaim: usize,
    next_header: crate::wal::Header,
    /// Page-file flushes issued and completed (an image is durable once the flush numbered
    /// in its slot completed).
    flushes_issued: u64,
    flushes_done: u64,
    /// When the stats were last logged.
    stats_at: Instant,
    /// Unparsed input held by all connections.
    input_bytes: usize,
    stats: PageServerStats,
    io: Box<dyn FileIo>,
    /// The page file's DDS id when the DPU serves GetPages from it (its slots' cache entries
    /// are kept, `server/dpu.rs`).
    dpu_file: Option<u32>,
    /// The commit's INVALIDATE keys and CACHE items.
    dpu_drop: Vec<u8>,
    dpu_close: Vec<u8>,
    /// Page reads, each with the buffer it fills (in flight, or waiting for a place).
    slots: InFlightReads<PageRead, Vec<u8>>,
    /// (page, slot or `ALL`) → its read.
    reading: HashMap<(u64, u8), u32>,
    /// Materialization reads not completed.
    replay_reads: usize,
    /// Reads waiting for a place.
    queued: VecDeque<u32>,
    /// Operations that could not be issued: completed as failures on the next turn.
    failed: Vec<IoDone>,
    done: Vec<IoDone>,
    /// Connections whose GetPage batch waits for the log: (connection, LSN, since).
    lsn_waiters: Vec<(ConnId, u64, Instant)>,
    /// Connections whose AppendWal waits for the replay queue to shrink or room in the log.
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

/// A GetPage's reply from the page in memory (its version at or below the read point).
fn answer(out: &mut Vec<u8>, data: &[u8], req_id: u64) {
    let lsn = page::lsn(data);
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
    /// Answers a GetPage batch (from the pool or the empty image at once, the others when
    /// their image reads complete), or returns false when it must wait for the replay.
    fn getpages(&mut self, id: ConnId, s: &mut PageSession, msg: &[u8], out: &mut Out<'_>) -> bool {
        let count = proto::u16_at(msg, 4) as usize;
        let need = (0..count)
            .map(|k| proto::getpage(msg, k))
            .filter(|g| g.page < self.cfg.pages && g.nms <= g.lsn && g.lsn >= self.horizon)
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
        let ps = self.cfg.page_size;
        for k in 0..count {
            let g = proto::getpage(msg, k);
            self.stats.getpages += 1;
            let st = if g.page >= self.cfg.pages {
                status::UNKNOWN_PAGE
            } else if g.nms > g.lsn {
                status::BAD_REQUEST
            } else if g.lsn < self.horizon {
                self.stats.below_horizon += 1;
                status::BELOW_HORIZON
            } else if timed_out && g.nms > self.applied {
                status::LSN_TIMEOUT
            } else {
                status::OK
            };
            if st != status::OK {
                let lsn = if st == status::BELOW_HORIZON {
                    self.horizon
                } else {
                    0
                };
                header(out, st, g.req_id, lsn);
                continue;
            }
            match self.plan(g.page, g.lsn) {
                Plan::Frame(f) => {
                    self.frames[f].used = true;
                    answer(out, &self.frames[f].data, g.req_id);
                }
                Plan::Empty => {
                    let chain = &self.meta[g.page as usize].chain;
                    history::reply_version(out, None, ps, g.page, chain, g.lsn, g.req_id);
                }
                Plan::Lost => header(out, status::IO_ERROR, g.req_id, 0),
                Plan::Read(slot) => {
                    let ticket = out.defer();
                    s.waiting += 1;
                    let w = Waiter {
                        conn: id,
                        ticket,
                        req_id: g.req_id,
                        lsn: g.lsn,
                    };
                    self.want(g.page, slot, Some(w), Purpose::Get);
                }
            }
        }
        true
    }

    fn watermark(&self, msg: &[u8], out: &mut Vec<u8>) {
        let req_id = proto::u64_at(msg, MSG_HEADER);
        let mut h = [0u8; RESP_HEADER + 32];
        proto::response_header(
            &mut h,
            (RESP_HEADER + 32) as u32,
            status::OK,
            proto::KIND_WATERMARK,
            req_id,
            self.applied,
        );
        h[RESP_HEADER..RESP_HEADER + 8].copy_from_slice(&self.wal.last_lsn().to_le_bytes());
        h[RESP_HEADER + 8..RESP_HEADER + 16].copy_from_slice(&self.horizon.to_le_bytes());
        let (versions, bytes) = self.versions();
        h[RESP_HEADER + 16..RESP_HEADER + 24].copy_from_slice(&versions.to_le_bytes());
        h[RESP_HEADER + 24..].copy_from_slice(&bytes.to_le_bytes());
        out.extend_from_slice(&h);
    }

    /// Stops the server after a storage failure the page server cannot go on from.
    fn fail(&mut self, e: anyhow::Error) {
        if self.fatal.is_none() {
            tracing::error!(error = %format!("{e:#}"), "stopping");
            self.fatal = Some(e);
            self.halt.store(true, Ordering::Relaxed);
        }
    }

    /// Storage operations whose completions will wake the loop.
    fn io_in_flight(&self) -> bool {
        self.slots.issued() > 0
            || self.writes > 0
            || self.commit.active
            || self.checkpoint != Checkpoint::Idle
    }

    /// Waits (bounded) for the storage operations in flight, whose buffers the storage
    /// library may still write into, then syncs the page file (the log holds every record
    /// no durable image holds).
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
                        self.slots.finish(object as u32);
                    }
                    TAG_PAGE_WRITE => self.write_done(object as usize, res.is_some()),
                    TAG_IMAGE_WRITE => self.image_written(object, res.is_some()),
                    TAG_LOG_WRITE => self.commit.writes = self.commit.writes.saturating_sub(1),
                    TAG_DPU => {}
                    TAG_LOG_FLUSH => {
                        if res.is_some() {
                            self.wal.end_commit();
                        }
                        self.commit.active = false;
                    }
                    _ => self.checkpoint = Checkpoint::Idle,
                }
            }
            list.clear();
            if self.commit.active && self.commit.len == 0 {
                self.wal.end_commit();
                self.commit.active = false;
            }
            let busy = self.slots.issued() > 0
                || self.writes > 0
                || self.commit.active
                || self.checkpoint != Checkpoint::Idle;
            if !busy || Instant::now() >= until {
                break;
            }
            if self.commit.active && self.commit.writes == 0 && !self.commit.flushing {
                self.pump_commit();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.done = list;
        if self.slots.issued() > 0 || self.writes > 0 || self.commit.active {
            tracing::error!(
                reads = self.slots.issued(),
                writes = self.writes,
                "storage operations still in flight at the stop: their buffers are left to them"
            );
            // The reads' buffers are the table's: it leaves them to the reads when dropped.
            bail!("storage operations did not complete within {IO_DRAIN:?}");
        }
        if self.fatal.is_some() {
            // What is in memory may not follow what is durable: recovery reads the log.
            return Ok(());
        }
        self.pages_file.sync()
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
            // A completion may have freed a slot for a stalled write-back.
            self.unstall();
        }
        for &(t, res) in &list {
            let object = t & ((1 << TAG_KIND) - 1);
            match t >> TAG_KIND {
                TAG_READ => self.finish_read(object as u32, res, done),
                TAG_PAGE_WRITE => self.write_done(object as usize, res.is_some()),
                TAG_IMAGE_WRITE => self.image_written(object, res.is_some()),
                TAG_LOG_WRITE => self.commit_done(TAG_LOG_WRITE, res.is_some(), done),
                TAG_LOG_FLUSH => self.commit_done(TAG_LOG_FLUSH, res.is_some(), done),
                TAG_PAGES_FLUSH => self.pages_flushed(object, res.is_some()),
                TAG_HEADER_WRITE => self.header_written(res.is_some()),
                TAG_HEADER_FLUSH => self.header_flushed(res.is_some(), done),
                TAG_DPU if res.is_none() => {
                    self.fail(anyhow::anyhow!("a cache record of the page file failed"))
                }
                TAG_DPU => {}
                _ => tracing::error!(tag = t, "a completion for no operation of ours"),
            }
        }
        list.clear();
        self.done = list;
        if self.commit.active && self.commit.len == 0 {
            self.finish_commit(done);
        }
        self.pump_reads();
        self.pump_writes();
        self.pump_commit();
        self.replay_some();
        self.pump_materialize();
        if self.checkpoint == Checkpoint::HeaderWritten {
            self.flush_header();
        }
        self.maybe_checkpoint();
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
            && !self.log_full
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
        true
    }

    fn closed(&mut self, _id: ConnId, s: PageSession) {
        self.input_bytes -= s.held;
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.io.wake_fd()
    }

    fn prepare_sleep(&mut self) -> bool {
        let replay_can_move = !self.replay.is_empty();
        // Work that no completion will wake the loop for.
        let idle_io = !self.io_in_flight();
        let busy = (replay_can_move && self.fatal.is_none())
            || !self.failed.is_empty()
            || (self.commit.active && self.commit.len == 0)
            || self.checkpoint == Checkpoint::HeaderWritten
            || (idle_io
                && (!self.write_queue.is_empty()
                    || !self.stalled.is_empty()
                    || !self.materialize_queue.is_empty()))
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
        self.slots.in_use() + self.writes + self.commit.acks.len() + self.round_acks.len()
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
        let want = cfg.pages * (page::SLOTS * cfg.page_size) as u64;
        if pages_file.size()? < want {
            pages_file
                .set_size(want)
                .with_context(|| format!("size the page file to {want} bytes"))?;
        }
        let ps = cfg.page_size;
        let n = cfg.pages;
        let count = usize::try_from(n).context("--pages")?;
        // Recovery: every retained record goes to its page's chain; pages are read when first
        // needed (`docs/pageserver-protocol.md` §5.5).
        let mut meta: Vec<PageMeta> = (0..count).map(|_| PageMeta::new()).collect();
        let mut log_order = VecDeque::new();
        let wal_file = storage.open("wal")?;
        let wal_id = wal_file.dds_id();
        let wal = Wal::open(wal_file, cfg.wal_size, |r, end| {
            if r.page >= n || r.offset as usize + r.data.len() > ps - page::HEADER {
                bail!("log record {} is outside the database", r.lsn);
            }
            meta[r.page as usize].chain.push_back(Rec {
                lsn: r.lsn,
                offset: r.offset,
                data: r.data.into(),
            });
            log_order.push_back(LogRec {
                lsn: r.lsn,
                page: r.page,
                end,
            });
            Ok(())
        })?;
        let last = wal.last_lsn();
        // A page whose records left the log has a base image at or below the horizon, and
        // GetPages below it are refused: the newest image at or below a read point is one the
        // chain completes, so no floor is needed after a restart.
        let hd = wal.header();
        if last > 0 {
            tracing::info!(
                records = log_order.len(),
                lsn = last,
                horizon = hd.horizon,
                "recovered the log"
            );
        }
        let mut cfg = cfg;
        if cfg.offload {
            // Without an offload engine on the DPU there is nothing to tell it.
            cfg.offload = storage.expose(pages_file.as_ref())?;
        }
        // Page reads and write-backs and log commits go through the host library's
        // asynchronous API on DDS files; through second handles, done when issued, otherwise.
        let dpu_file = pages_file.dds_id().filter(|_| cfg.offload);
        if dpu_file.is_some() {
            // Entries of a previous life may call images open whose pages have records in
            // the log now (durable, not acknowledged): they leave the table before anything
            // is answered.
            let mut keys = Vec::new();
            for (p, m) in meta.iter_mut().enumerate() {
                if !m.chain.is_empty() {
                    m.forgotten = true;
                    keys.extend((0..page::SLOTS as u64).map(|s| p as u64 * page::SLOTS as u64 + s));
                }
            }
            storage
                .invalidate(&keys)
                .context("drop the DPU's entries of the pages in the log")?;
        }
        let io: Box<dyn FileIo> = match (dds, pages_file.dds_id(), wal_id) {
            (Some(dds), Some(pages), Some(log))
                if dds.hello().max_io_bytes as usize >= page::SLOTS * ps =>
            {
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
                slot: 0,
                queued: false,
                used: false,
            })
            .collect();
        let halt = Arc::new(AtomicBool::new(false));
        let service = PageService {
            _storage: storage,
            pages_file,
            wal,
            log_end: if last > 0 { last + 1 } else { 0 },
            applied: last,
            replay: VecDeque::new(),
            round_records: Vec::new(),
            round_acks: Vec::new(),
            commit: Commit::default(),
            frames,
            index: HashMap::with_capacity(cfg.buffer_pool * 2),
            hand: 0,
            write_queue: VecDeque::with_capacity(cfg.buffer_pool),
            writes: 0,
            changed: Vec::with_capacity(REPLAY_BATCH),
            stalled: Vec::new(),
            meta,
            log_order,
            materialize_queue: VecDeque::new(),
            scratch: vec![0u8; ps].into_boxed_slice(),
            horizon: hd.horizon,
            pending_horizon: hd.horizon,
            images: 0,
            pressure: 0,
            log_full: false,
            samples: VecDeque::from([(Instant::now(), last)]),
            checkpoint: Checkpoint::Idle,
            checkpoint_at: Instant::now(),
            reclaim: 0,
            next_header: hd,
            flushes_issued: 0,
            flushes_done: 0,
            stats_at: Instant::now(),
            input_bytes: 0,
            stats: PageServerStats::default(),
            io,
            dpu_file,
            dpu_drop: Vec::new(),
            dpu_close: Vec::new(),
            slots: InFlightReads::new(),
            reading: HashMap::with_capacity(READS_MAX * 2),
            replay_reads: 0,
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
