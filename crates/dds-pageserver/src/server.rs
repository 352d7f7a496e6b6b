//! The page server's host side: one event-loop thread owns the log, the buffer pool and the
//! page file. A round reads what the sockets have and runs the complete messages (GetPage
//! batches that can be answered, AppendWal ranges, watermark queries), makes the round's log
//! records durable, and only then sends its replies; between rounds it replays durable
//! records into pages in LSN order and writes the pages it changed back to the page file
//! (where the DPU's cache-on-write learns them).

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_storage::{Storage, StoreFile};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

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
}

const LISTENER: Token = Token(usize::MAX);
/// Records applied per round at most, so GetPages keep moving.
const REPLAY_BATCH: usize = 512;
/// Unapplied records above which AppendWal is not read (back-pressure).
const REPLAY_QUEUE_MAX: usize = 1 << 18;

struct Conn {
    stream: TcpStream,
    input: Vec<u8>,
    out: Vec<u8>,
    out_at: usize,
    /// The head message waits for the log since this instant.
    blocked_since: Option<Instant>,
    dead: bool,
    close_after: bool,
    /// Not read to the end (back-pressure): read again next round.
    more: bool,
}

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

/// The page server.
pub struct PageServer {
    cfg: PageServerConfig,
    listener: TcpListener,
    poll: Poll,
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
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    nconn: usize,
    recache: Vec<(u64, u64, u32, u64)>,
    /// Unparsed input held by all connections.
    input_bytes: usize,
    stats: PageServerStats,
}

impl PageServer {
    /// Opens the files in `storage` (recovering the log into the pages) and binds.
    pub fn open(cfg: PageServerConfig, storage: Box<dyn Storage>) -> Result<PageServer> {
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
        let mut listener =
            TcpListener::bind(cfg.listen).with_context(|| format!("listen on {}", cfg.listen))?;
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let frames = (0..cfg.buffer_pool)
            .map(|_| Frame {
                page: u64::MAX,
                data: vec![0u8; ps].into_boxed_slice(),
                dirty: false,
                used: false,
            })
            .collect();
        Ok(PageServer {
            listener,
            poll,
            storage,
            pages_file,
            wal,
            log_end: if last > 0 { last + 1 } else { 0 },
            applied: last,
            replay: VecDeque::new(),
            round_records: Vec::new(),
            frames,
            index: HashMap::new(),
            hand: 0,
            conns: Vec::new(),
            free: Vec::new(),
            nconn: 0,
            recache: Vec::new(),
            input_bytes: 0,
            stats: PageServerStats::default(),
            cfg,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// The last applied LSN (recovered, at start).
    pub fn applied_lsn(&self) -> u64 {
        self.applied
    }

    /// Serves until `stop` is set, then writes every dirty page back.
    pub fn run(mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; 64 << 10];
        let mut touched: Vec<usize> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let busy = !self.replay.is_empty();
            let timeout = if busy {
                Duration::ZERO
            } else {
                Duration::from_millis(20)
            };
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("poll");
            }
            for ev in events.iter() {
                if ev.token() == LISTENER {
                    self.accept();
                    continue;
                }
                let i = ev.token().0;
                self.read_conn(i, &mut scratch);
                touched.push(i);
            }
            // Connections that stopped reading for back-pressure read again.
            for i in 0..self.conns.len() {
                if self.conns[i].as_ref().is_some_and(|c| c.more && !c.dead) {
                    self.read_conn(i, &mut scratch);
                    touched.push(i);
                }
            }
            // Every connection with input or a blocked message gets a turn (a blocked one may
            // have been unblocked by the replay, or timed out).
            for i in 0..self.conns.len() {
                if self.conns[i]
                    .as_ref()
                    .is_some_and(|c| !c.input.is_empty() && !c.dead)
                {
                    self.process(i);
                    touched.push(i);
                }
            }
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
                let items = std::mem::take(&mut self.recache);
                if let Err(e) = self.storage.cache(self.pages_file.as_ref(), &items) {
                    tracing::warn!(error = %format!("{e:#}"), "telling the DPU about pages failed");
                }
            }
            touched.sort_unstable();
            touched.dedup();
            for &i in &touched {
                if !ok {
                    if let Some(c) = self.conns[i].as_mut() {
                        c.dead = true;
                    }
                }
                self.flush_out(i);
            }
            touched.clear();
            if let Err(e) = self.replay_some() {
                tracing::error!(error = %format!("{e:#}"), "replay failed");
                return Err(e);
            }
        }
        self.write_back_all()
    }

    fn accept(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            if self.nconn >= self.cfg.max_connections {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if self
                .poll
                .registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                self.free.push(i);
                continue;
            }
            self.conns[i] = Some(Conn {
                stream,
                input: Vec::new(),
                out: Vec::new(),
                out_at: 0,
                blocked_since: None,
                dead: false,
                close_after: false,
                more: false,
            });
            self.nconn += 1;
        }
    }

    fn read_conn(&mut self, i: usize, scratch: &mut [u8]) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        // Back-pressure: a connection with a whole message unparsed or 8 MiB of unsent
        // replies waits, and so does one with input while all connections together hold the
        // input budget (buffers grow only with bytes that arrived).
        let limit = proto::MSG_MAX + MSG_HEADER;
        c.more = false;
        loop {
            if c.dead {
                return;
            }
            if c.input.len() >= limit
                || c.out.len() - c.out_at > (8 << 20)
                || (!c.input.is_empty() && self.input_bytes >= self.cfg.input_memory)
            {
                c.more = true;
                return;
            }
            match c.stream.read(scratch) {
                Ok(0) => {
                    c.dead = true;
                    return;
                }
                Ok(n) => {
                    c.input.extend_from_slice(&scratch[..n]);
                    self.input_bytes += n;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    c.dead = true;
                    return;
                }
            }
        }
    }

    /// Runs the connection's complete messages, in order, until one must wait.
    fn process(&mut self, i: usize) {
        loop {
            let Some(c) = self.conns[i].as_mut() else {
                return;
            };
            if c.close_after || c.dead {
                return;
            }
            let n = match proto::message_len(&c.input) {
                Ok(Some(n)) => n,
                Ok(None) => return,
                Err(Malformed(why)) => {
                    tracing::warn!(conn = i, why, "malformed message: closing");
                    c.close_after = true;
                    self.input_bytes -= c.input.len();
                    c.input = Vec::new();
                    return;
                }
            };
            if c.input.len() < n {
                return;
            }
            let msg: Vec<u8> = c.input[..n].to_vec();
            let kind = proto::u16_at(&msg, 6);
            let done = match kind {
                proto::KIND_GETPAGE => self.getpages(i, &msg),
                proto::KIND_APPEND => {
                    if self.replay.len() + self.round_records.len() > REPLAY_QUEUE_MAX {
                        false
                    } else {
                        self.append(i, &msg)
                    }
                }
                _ => {
                    let req_id = proto::u64_at(&msg, MSG_HEADER);
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
                    self.conns[i]
                        .as_mut()
                        .expect("live")
                        .out
                        .extend_from_slice(&h);
                    true
                }
            };
            let c = self.conns[i].as_mut().expect("live");
            if !done {
                return;
            }
            c.input.drain(..n);
            self.input_bytes -= n;
            c.blocked_since = None;
        }
    }

    /// Answers a GetPage batch, or returns false when it must wait for the replay.
    fn getpages(&mut self, i: usize, msg: &[u8]) -> bool {
        let count = proto::u16_at(msg, 4) as usize;
        let need = (0..count)
            .map(|k| proto::getpage(msg, k))
            .filter(|g| g.page < self.cfg.pages && g.nms <= g.lsn)
            .map(|g| g.nms)
            .max()
            .unwrap_or(0);
        let timed_out = if need > self.applied {
            let c = self.conns[i].as_mut().expect("live");
            let since = *c.blocked_since.get_or_insert_with(Instant::now);
            if since.elapsed() < self.cfg.lsn_wait {
                return false;
            }
            true
        } else {
            false
        };
        let ps = self.cfg.page_size;
        let mut out = std::mem::take(&mut self.conns[i].as_mut().expect("live").out);
        for k in 0..count {
            let g = proto::getpage(msg, k);
            let at = out.len();
            out.resize(at + RESP_HEADER, 0);
            let mut st = status::OK;
            let mut lsn = 0;
            if g.page >= self.cfg.pages {
                st = status::UNKNOWN_PAGE;
            } else if g.nms > g.lsn {
                st = status::BAD_REQUEST;
            } else if timed_out && g.nms > self.applied {
                st = status::LSN_TIMEOUT;
            } else {
                match self.page_frame(g.page, false) {
                    Err(e) => {
                        tracing::error!(page = g.page, error = %format!("{e:#}"), "page read failed");
                        st = status::IO_ERROR;
                    }
                    Ok(f) => {
                        let data = &self.frames[f].data;
                        lsn = page::lsn(data);
                        if lsn > g.lsn {
                            st = status::OLD_VERSION;
                        } else {
                            out.extend_from_slice(data);
                        }
                    }
                }
            }
            let len = (out.len() - at) as u32;
            proto::response_header(&mut out[at..], len, st, proto::KIND_GETPAGE, g.req_id, lsn);
            self.stats.getpages += 1;
            debug_assert!(st != status::OK || len as usize == RESP_HEADER + ps);
        }
        self.conns[i].as_mut().expect("live").out = out;
        true
    }

    /// Queues an AppendWal range; the reply goes out after the round's commit.
    fn append(&mut self, i: usize, msg: &[u8]) -> bool {
        let reply = |s: &mut Self, st: u16| {
            let mut h = [0u8; RESP_HEADER];
            proto::response_header(
                &mut h,
                RESP_HEADER as u32,
                st,
                proto::KIND_APPEND,
                0,
                s.wal.last_lsn(),
            );
            s.conns[i].as_mut().expect("live").out.extend_from_slice(&h);
            true
        };
        let a = match proto::append(msg) {
            Ok(a) => a,
            Err(_) => {
                self.conns[i].as_mut().expect("live").close_after = true;
                return true;
            }
        };
        if a.end <= a.start || a.start == 0 {
            return reply(self, status::BAD_REQUEST);
        }
        if self.log_end != 0 && a.start < self.log_end {
            return reply(self, status::DUPLICATE);
        }
        if self.log_end != 0 && a.start > self.log_end {
            return reply(self, status::OUT_OF_ORDER);
        }
        // Validate every record before any is taken.
        let ps = self.cfg.page_size;
        let mut prev = a.start - 1;
        let mut bytes = 0usize;
        for r in proto::records(a.records, a.count) {
            let Ok(r) = r else {
                self.conns[i].as_mut().expect("live").close_after = true;
                return true;
            };
            if r.lsn <= prev
                || r.lsn >= a.end
                || r.page >= self.cfg.pages
                || r.offset as usize + r.data.len() > ps - page::HEADER
            {
                return reply(self, status::BAD_REQUEST);
            }
            prev = r.lsn;
            bytes += r.wire_len() + 8;
        }
        if !self.wal.has_room(bytes) {
            if let Err(e) = self.restart_log() {
                tracing::error!(error = %format!("{e:#}"), "starting the log over failed");
                return reply(self, status::IO_ERROR);
            }
            if !self.wal.has_room(bytes) {
                return reply(self, status::BAD_REQUEST);
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
        reply(self, status::OK)
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

    /// The frame holding page `id` (read from storage on a miss). `for_replay` reads tell the
    /// DPU nothing (invalidate-on-read drops the page there); other reads re-cache it.
    fn page_frame(&mut self, id: u64, for_replay: bool) -> Result<usize> {
        if let Some(&f) = self.index.get(&id) {
            self.frames[f].used = true;
            return Ok(f);
        }
        let f = self.victim()?;
        let ps = self.cfg.page_size;
        let fr = &mut self.frames[f];
        let n = self.pages_file.read_at(id * ps as u64, &mut fr.data)?;
        fr.data[n..].fill(0);
        let Some(lsn) = page::from_storage(&mut fr.data, id) else {
            bail!("page {id} is damaged on storage (checksum)");
        };
        fr.page = id;
        fr.dirty = false;
        fr.used = true;
        self.index.insert(id, f);
        self.stats.page_reads += 1;
        if !for_replay && self.cfg.offload && lsn > 0 {
            // The read dropped the page from the DPU's cache; it is unchanged on storage.
            self.recache.push((id, id * ps as u64, ps as u32, lsn));
        }
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
                    let f = self.page_frame(id, true)?;
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

    fn flush_out(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        while !c.dead && c.out_at < c.out.len() {
            match c.stream.write(&c.out[c.out_at..]) {
                Ok(0) => c.dead = true,
                Ok(n) => c.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => c.dead = true,
            }
        }
        if c.out_at == c.out.len() {
            c.out.clear();
            c.out_at = 0;
        }
        if c.dead || (c.close_after && c.out.is_empty()) {
            let mut c = self.conns[i].take().expect("live");
            self.input_bytes -= c.input.len();
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(i);
            self.nconn -= 1;
        }
    }

    /// Counters.
    pub fn stats(&self) -> PageServerStats {
        self.stats
    }
}
