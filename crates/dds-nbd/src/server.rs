//! The NBD server, a service on the server runtime (`dds-server`, `docs/server-runtime.md`):
//! one event-loop thread serves every connection of every export, and never waits for
//! storage. Each export is one file of a [`FileIo`] set (DDS files through the host library's
//! asynchronous API, or regular files done when issued).
//!
//! A request that needs storage takes a *place* (its state and, for a READ, the buffer the
//! reads fill), reserves its reply's slot in the connection's output (`Out::defer`) and
//! issues its storage operations (a request larger than the library's largest I/O is split);
//! the connection goes on with its next requests. When the place's last operation completes
//! (and, for FUA, the flush issued after it), the reply fills the slot; replies leave in
//! request order. Places are kept and reused: in steady state a request allocates nothing.
//!
//! A WRITE's payload is handed to the storage library straight from the connection's input
//! (the library copies it into its request ring), so a WRITE that finds the library's ring
//! full keeps its bytes in the input and holds its connection (`Verdict::Pending`) until
//! operations complete. Reads, WRITE_ZEROES and flushes that find it full wait in a queue.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_host::Dds;
use dds_server::{Budget, Completions, Config, ConnId, Out, Service, Ticket, Verdict};
use dds_storage::aio::SubmitError;
use dds_storage::fileio::{DdsIo, FileIo, IoDone, SyncIo};
use dds_storage::{Storage, StoreFile};

use crate::proto::{self, Request};

/// Places (requests with storage operations) in the server at most.
const PLACES_MAX: usize = 1024;
/// Requests of one connection in flight at most.
const CONN_REQUESTS_MAX: u32 = 512;
/// Bytes of READ buffers in flight at most.
const READ_BYTES_MAX: usize = 256 << 20;
/// A place's read buffer larger than this is freed when its request is done.
const BUF_KEEP: usize = 1 << 20;
/// An incomplete request or option older than this closes its connection.
const FRAME_DEADLINE: Duration = Duration::from_secs(60);
/// How long a stop waits for the storage operations in flight.
const IO_DRAIN: Duration = Duration::from_secs(10);

/// An export as configured: a file of the storage named after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSpec {
    /// The export's name (and its file's).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Writes are refused.
    pub read_only: bool,
}

impl ExportSpec {
    /// Parses `NAME=SIZE[,ro]` (`SIZE` with the suffixes K, M, G, T).
    pub fn parse(s: &str, parse_size: impl Fn(&str) -> Result<u64, String>) -> Result<ExportSpec> {
        let Some((name, rest)) = s.split_once('=') else {
            bail!("`{s}`: an export is NAME=SIZE[,ro]");
        };
        let (size, read_only) = match rest.split_once(',') {
            Some((size, "ro")) => (size, true),
            Some((_, other)) => bail!("`{s}`: unknown export option `{other}` (only `ro`)"),
            None => (rest, false),
        };
        if name.is_empty() || name.len() > 256 || name.contains(['\0', ',', '/']) {
            bail!("`{s}`: an export name is 1 to 256 bytes without NUL, `,` or `/`");
        }
        let size = parse_size(size).map_err(|e| anyhow::anyhow!("`{s}`: {e}"))?;
        if size == 0 || size % 512 != 0 {
            bail!("`{s}`: the size must be a positive multiple of 512");
        }
        Ok(ExportSpec {
            name: name.to_string(),
            size,
            read_only,
        })
    }
}

/// Settings of the server.
#[derive(Clone, Debug)]
pub struct NbdConfig {
    /// Address to listen on (port 0: the kernel chooses).
    pub listen: SocketAddr,
    /// The exports; the first is the default export (the empty name).
    pub exports: Vec<ExportSpec>,
    /// Most connections.
    pub max_connections: usize,
}

/// Counters of the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NbdStats {
    /// READ requests answered with data.
    pub reads: u64,
    /// WRITE requests done.
    pub writes: u64,
    /// FLUSH requests done (and FUA flushes).
    pub flushes: u64,
    /// TRIM requests answered.
    pub trims: u64,
    /// WRITE_ZEROES requests done.
    pub zeroes: u64,
    /// Requests refused before storage (an NBD error).
    pub refused: u64,
    /// Requests whose storage operation failed (`NBD_EIO`).
    pub failed: u64,
}

struct Export {
    name: String,
    size: u64,
    read_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client's flags.
    Flags,
    /// Option haggling.
    Options,
    /// Requests on export `k`.
    Transmission(usize),
}

/// A connection's state.
pub struct NbdSession {
    phase: Phase,
    no_zeroes: bool,
    structured: bool,
    /// Input bytes to drop as they arrive (an option or a WRITE payload refused unread).
    skip: u64,
    /// A WRITE whose payload is partly handed to storage: its place (the rest is issued when
    /// the connection is offered its input again).
    write_place: Option<u32>,
    /// Requests with a place.
    in_flight: u32,
}

impl NbdSession {
    /// Drops the bytes to skip from `input[*at..]`; true while more are to come.
    fn skipping(&mut self, input: &[u8], at: &mut usize) -> bool {
        if self.skip == 0 {
            return false;
        }
        let n = (input.len() - *at).min(usize::try_from(self.skip).unwrap_or(usize::MAX));
        *at += n;
        self.skip -= n as u64;
        self.skip > 0
    }
}

/// A request with storage operations.
struct Place {
    conn: ConnId,
    ticket: Ticket,
    handle: u64,
    file: usize,
    command: u16,
    structured: bool,
    /// A flush follows the data (FUA).
    fua: bool,
    offset: u64,
    len: u32,
    /// Bytes whose operations are issued.
    issued: u32,
    /// Bytes the completed operations moved.
    moved: u32,
    /// Operations in flight.
    ops: u32,
    /// A flush is to be issued (FLUSH, or FUA after the data).
    flush: bool,
    failed: bool,
    /// Waits in the issue queue.
    queued: bool,
    /// What the reads fill (READ).
    buf: Vec<u8>,
}

impl Place {
    fn empty() -> Place {
        Place {
            conn: ConnId { slot: 0, gen: 0 },
            ticket: Ticket::from_u32(0),
            handle: 0,
            file: 0,
            command: 0,
            structured: false,
            fua: false,
            offset: 0,
            len: 0,
            issued: 0,
            moved: 0,
            ops: 0,
            flush: false,
            failed: false,
            queued: false,
            buf: Vec::new(),
        }
    }

    /// Every operation issued and completed.
    fn settled(&self) -> bool {
        self.ops == 0 && self.issued == self.len && !self.flush
    }
}

/// The NBD protocol and its engine, served by a [`dds_server::Server`].
pub struct NbdService {
    exports: Vec<Export>,
    io: Box<dyn FileIo>,
    /// Operations at most this long.
    max_io: u32,
    /// The data of WRITE_ZEROES (`max_io` zero bytes).
    zeroes: Vec<u8>,
    places: Vec<Place>,
    free: Vec<u32>,
    /// Places whose next operation found the library's ring full.
    queue: VecDeque<u32>,
    /// Bytes of READ buffers in flight.
    read_bytes: usize,
    /// Storage operations in flight (all places).
    ops: usize,
    /// Connections waiting for a place, a read budget or the library's ring.
    waiters: Vec<ConnId>,
    /// Operations that failed when issued: completed on the next turn.
    failed: Vec<IoDone>,
    done: Vec<IoDone>,
    stats: NbdStats,
}

fn tag(place: u32) -> u64 {
    u64::from(place)
}

impl NbdService {
    fn find(&self, name: &[u8]) -> Option<usize> {
        if name.is_empty() {
            return Some(0);
        }
        self.exports.iter().position(|e| e.name.as_bytes() == name)
    }

    fn flags(&self, export: usize, structured: bool) -> u16 {
        proto::transmission_flags(self.exports[export].read_only, structured)
    }

    /// Answers an option (the complete option `data`); returns the connection's verdict.
    fn option(
        &mut self,
        s: &mut NbdSession,
        option: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Verdict {
        match option {
            proto::OPT_EXPORT_NAME => {
                let Some(e) = self.find(data) else {
                    // This option cannot be answered with an error.
                    return Verdict::Close;
                };
                let flags = self.flags(e, s.structured);
                proto::export_name_reply(out, self.exports[e].size, flags, s.no_zeroes);
                s.phase = Phase::Transmission(e);
            }
            proto::OPT_ABORT => {
                proto::opt_reply(out, option, proto::REP_ACK, &[]);
                return Verdict::Close;
            }
            proto::OPT_LIST if !data.is_empty() => {
                proto::opt_reply(out, option, proto::REP_ERR_INVALID, &[]);
            }
            proto::OPT_LIST => {
                for e in &self.exports {
                    proto::list_entry(out, e.name.as_bytes());
                }
                proto::opt_reply(out, option, proto::REP_ACK, &[]);
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let Some(req) = proto::info_request(data) else {
                    proto::opt_reply(out, option, proto::REP_ERR_INVALID, &[]);
                    return Verdict::Continue;
                };
                let Some(e) = self.find(req.name) else {
                    proto::opt_reply(out, option, proto::REP_ERR_UNKNOWN, &[]);
                    return Verdict::Continue;
                };
                let flags = self.flags(e, s.structured);
                proto::info_export(out, option, self.exports[e].size, flags);
                proto::info_block_size(out, option);
                if req.asks(proto::INFO_NAME) {
                    proto::info_name(out, option, self.exports[e].name.as_bytes());
                }
                proto::opt_reply(out, option, proto::REP_ACK, &[]);
                if option == proto::OPT_GO {
                    s.phase = Phase::Transmission(e);
                }
            }
            proto::OPT_STRUCTURED_REPLY if !data.is_empty() => {
                proto::opt_reply(out, option, proto::REP_ERR_INVALID, &[]);
            }
            proto::OPT_STRUCTURED_REPLY => {
                s.structured = true;
                proto::opt_reply(out, option, proto::REP_ACK, &[]);
            }
            _ => proto::opt_reply(out, option, proto::REP_ERR_UNSUP, &[]),
        }
        Verdict::Continue
    }

    /// A reply written at once (an error found before storage, a TRIM).
    fn reply_now(&mut self, r: &Request, structured: bool, error: u32, out: &mut Vec<u8>) {
        if error != 0 {
            self.stats.refused += 1;
        }
        if r.command == proto::CMD_READ {
            proto::read_error(out, structured, r.handle, error);
        } else {
            proto::simple_reply(out, error, r.handle);
        }
    }

    /// Takes a place for a request, or `None` when the limits say wait.
    fn take(&mut self, s: &NbdSession, r: &Request) -> Option<u32> {
        let reading = if r.command == proto::CMD_READ {
            r.len as usize
        } else {
            0
        };
        if s.in_flight >= CONN_REQUESTS_MAX
            || (self.free.is_empty() && self.places.len() >= PLACES_MAX)
            || (reading > 0 && self.read_bytes > 0 && self.read_bytes + reading > READ_BYTES_MAX)
        {
            return None;
        }
        self.read_bytes += reading;
        Some(match self.free.pop() {
            Some(p) => p,
            None => {
                self.places.push(Place::empty());
                (self.places.len() - 1) as u32
            }
        })
    }

    /// Sets place `p` up for request `r` of connection `id` (its reply slot reserved).
    fn start(
        &mut self,
        p: u32,
        id: ConnId,
        file: usize,
        s: &mut NbdSession,
        r: &Request,
        out: &mut Out<'_>,
    ) {
        s.in_flight += 1;
        let ticket = out.defer();
        let pl = &mut self.places[p as usize];
        pl.conn = id;
        pl.ticket = ticket;
        pl.handle = r.handle;
        pl.file = file;
        pl.command = r.command;
        pl.structured = s.structured;
        pl.fua = r.flags & proto::CMD_FLAG_FUA != 0;
        pl.offset = r.offset;
        pl.issued = 0;
        pl.moved = 0;
        pl.ops = 0;
        pl.failed = false;
        pl.queued = false;
        if r.command == proto::CMD_FLUSH {
            pl.len = 0;
            pl.flush = true;
        } else {
            pl.len = r.len;
            pl.flush = false;
        }
        if r.command == proto::CMD_READ {
            pl.buf.clear();
            pl.buf.resize(r.len as usize, 0);
        }
    }

    /// The outcome of issuing one operation of place `p`: false when the ring is full.
    fn issued(&mut self, p: u32, r: Result<(), SubmitError>, bytes: u32) -> bool {
        let pl = &mut self.places[p as usize];
        match r {
            Ok(()) => {
                pl.ops += 1;
                pl.issued += bytes;
                self.ops += 1;
                true
            }
            Err(SubmitError::Busy) => false,
            Err(SubmitError::Failed(_)) => {
                // Nothing more is issued; the failure completes on the next turn.
                pl.failed = true;
                pl.issued = pl.len;
                pl.flush = false;
                pl.fua = false;
                pl.ops += 1;
                self.ops += 1;
                self.failed.push((tag(p), None));
                true
            }
        }
    }

    /// Issues what place `p` still has to issue, except a WRITE's payload (READ chunks,
    /// WRITE_ZEROES chunks, the flush); false when the library's ring is full.
    fn issue_more(&mut self, p: u32) -> bool {
        loop {
            let pl = &mut self.places[p as usize];
            let tag = tag(p);
            if pl.issued < pl.len {
                let n = (pl.len - pl.issued).min(self.max_io);
                let at = pl.issued as usize;
                let off = pl.offset + u64::from(pl.issued);
                let r = match pl.command {
                    proto::CMD_READ => {
                        // SAFETY: the place's buffer has `len` bytes; it is neither resized
                        // nor freed while the place has operations in flight (a place is
                        // given back only when settled, and `Drop` leaks the places then).
                        unsafe {
                            self.io
                                .read(pl.file, off, pl.buf.as_mut_ptr().add(at), n, tag)
                        }
                    }
                    proto::CMD_WRITE_ZEROES => {
                        self.io.write(pl.file, off, &self.zeroes[..n as usize], tag)
                    }
                    _ => unreachable!("a WRITE's payload is issued from the input"),
                };
                if !self.issued(p, r, n) {
                    return false;
                }
            } else if pl.flush && pl.ops == 0 {
                let r = self.io.flush(pl.file, tag);
                if r == Err(SubmitError::Busy) {
                    return false;
                }
                self.places[p as usize].flush = false;
                self.issued(p, r, 0);
            } else {
                return true;
            }
        }
    }

    /// Issues place `p`'s operations; it waits in the queue when the ring is full.
    fn pump_one(&mut self, p: u32) {
        if !self.queue.is_empty() || !self.issue_more(p) {
            self.places[p as usize].queued = true;
            self.queue.push_back(p);
        }
    }

    /// Issues the WRITE payload `data` of place `p` from where it stopped; false when the
    /// ring is full (the rest waits in the input).
    fn issue_write(&mut self, p: u32, data: &[u8]) -> bool {
        loop {
            let pl = &self.places[p as usize];
            if pl.issued >= pl.len {
                return true;
            }
            let at = pl.issued as usize;
            let n = (pl.len - pl.issued).min(self.max_io);
            let off = pl.offset + u64::from(pl.issued);
            let r = self
                .io
                .write(pl.file, off, &data[at..at + n as usize], tag(p));
            if !self.issued(p, r, n) {
                return false;
            }
        }
    }

    /// Runs the complete requests at the start of `input`.
    fn transmission(
        &mut self,
        id: ConnId,
        s: &mut NbdSession,
        export: usize,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        loop {
            if s.skipping(input, &mut at) {
                return (at, Verdict::Continue);
            }
            let rest = &input[at..];
            if rest.len() < proto::REQUEST {
                return (at, Verdict::Continue);
            }
            let r = proto::request(rest);
            if r.magic != proto::REQUEST_MAGIC {
                tracing::info!(
                    conn = id.slot,
                    magic = r.magic,
                    "bad request magic: closing"
                );
                return (input.len(), Verdict::Close);
            }
            let e = &self.exports[export];
            if let Some(err) = proto::check(&r, e.size, e.read_only, s.structured) {
                if r.command == proto::CMD_WRITE {
                    // The payload is dropped as it arrives, never buffered.
                    s.skip = u64::from(r.len);
                }
                self.reply_now(&r, s.structured, err, out);
                at += proto::REQUEST;
                continue;
            }
            match r.command {
                proto::CMD_DISC => return (input.len(), Verdict::Close),
                proto::CMD_TRIM => {
                    // Trimmed data is left as it was (docs/nbd.md §3).
                    self.stats.trims += 1;
                    self.reply_now(&r, s.structured, 0, out);
                    at += proto::REQUEST;
                }
                proto::CMD_WRITE => {
                    let need = proto::REQUEST + r.len as usize;
                    if rest.len() < need {
                        return (at, Verdict::Continue);
                    }
                    let p = match s.write_place {
                        Some(p) => p,
                        None => {
                            let Some(p) = self.take(s, &r) else {
                                self.waiters.push(id);
                                return (at, Verdict::Pending);
                            };
                            self.start(p, id, export, s, &r, out);
                            p
                        }
                    };
                    if !self.issue_write(p, &rest[proto::REQUEST..need]) {
                        s.write_place = Some(p);
                        self.waiters.push(id);
                        return (at, Verdict::Pending);
                    }
                    s.write_place = None;
                    at += need;
                }
                _ => {
                    // READ, WRITE_ZEROES, FLUSH.
                    let Some(p) = self.take(s, &r) else {
                        self.waiters.push(id);
                        return (at, Verdict::Pending);
                    };
                    self.start(p, id, export, s, &r, out);
                    self.pump_one(p);
                    at += proto::REQUEST;
                }
            }
        }
    }

    /// A place's operations all completed: a FUA flush follows, or the reply is written and
    /// the place given back.
    fn settle(&mut self, p: u32, done: &mut Completions<'_, NbdSession>) {
        let pl = &mut self.places[p as usize];
        if pl.fua && !pl.failed {
            pl.fua = false;
            pl.flush = true;
            self.pump_one(p);
            return;
        }
        let moved_all = pl.command == proto::CMD_FLUSH || pl.moved == pl.len;
        let ok = !pl.failed && moved_all;
        let st = &mut self.stats;
        match (ok, pl.command) {
            (false, _) => st.failed += 1,
            (true, proto::CMD_READ) => st.reads += 1,
            (true, proto::CMD_WRITE) => st.writes += 1,
            (true, proto::CMD_WRITE_ZEROES) => st.zeroes += 1,
            (true, _) => st.flushes += 1,
        }
        if let Some((s, out)) = done.fill(pl.conn, pl.ticket) {
            s.in_flight -= 1;
            match (ok, pl.command) {
                (true, proto::CMD_READ) => {
                    proto::read_reply_header(out, pl.structured, pl.handle, pl.offset, pl.len);
                    // Copy: the data, from the place's buffer into the reply (the reply slot
                    // is reachable only now, once the reads completed).
                    out.extend_from_slice(&pl.buf[..pl.len as usize]);
                }
                (false, proto::CMD_READ) => {
                    proto::read_error(out, pl.structured, pl.handle, proto::EIO)
                }
                (true, _) => proto::simple_reply(out, 0, pl.handle),
                (false, _) => proto::simple_reply(out, proto::EIO, pl.handle),
            }
        }
        self.release(p);
    }

    fn release(&mut self, p: u32) {
        let pl = &mut self.places[p as usize];
        debug_assert!(pl.ops == 0, "a place given back with operations in flight");
        if pl.command == proto::CMD_READ {
            self.read_bytes -= pl.len as usize;
        }
        if pl.buf.capacity() > BUF_KEEP {
            pl.buf = Vec::new();
        }
        pl.len = 0;
        pl.issued = 0;
        self.free.push(p);
    }

    /// Operations in flight (their buffers may still be written by the storage library).
    fn ops_in_flight(&self) -> bool {
        self.ops > 0
    }
}

impl Service for NbdService {
    type Session = NbdSession;

    fn open(&mut self, _id: ConnId) -> NbdSession {
        NbdSession {
            phase: Phase::Flags,
            no_zeroes: false,
            structured: false,
            skip: 0,
            write_place: None,
            in_flight: 0,
        }
    }

    fn greet(&mut self, _id: ConnId, _s: &mut NbdSession, out: &mut Out<'_>) {
        proto::greeting(out);
    }

    fn on_input(
        &mut self,
        id: ConnId,
        s: &mut NbdSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        loop {
            if s.phase == Phase::Options && s.skipping(input, &mut at) {
                return (at, Verdict::Continue);
            }
            let rest = &input[at..];
            match s.phase {
                Phase::Flags => {
                    if rest.len() < 4 {
                        return (at, Verdict::Continue);
                    }
                    let flags = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
                    if flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
                        tracing::info!(conn = id.slot, flags, "unknown client flags: closing");
                        return (input.len(), Verdict::Close);
                    }
                    s.no_zeroes = flags & proto::FLAG_C_NO_ZEROES != 0;
                    s.phase = Phase::Options;
                    at += 4;
                }
                Phase::Options => {
                    if rest.len() < proto::OPT_HEADER {
                        return (at, Verdict::Continue);
                    }
                    let h = proto::opt_header(rest);
                    if h.magic != proto::IHAVEOPT {
                        tracing::info!(conn = id.slot, "bad option magic: closing");
                        return (input.len(), Verdict::Close);
                    }
                    let len = h.len as usize;
                    if len > proto::OPTION_MAX {
                        if h.option == proto::OPT_EXPORT_NAME {
                            return (input.len(), Verdict::Close);
                        }
                        proto::opt_reply(out, h.option, proto::REP_ERR_TOO_BIG, &[]);
                        s.skip = u64::from(h.len);
                        at += proto::OPT_HEADER;
                        continue;
                    }
                    if rest.len() < proto::OPT_HEADER + len {
                        return (at, Verdict::Continue);
                    }
                    let data = &rest[proto::OPT_HEADER..proto::OPT_HEADER + len];
                    at += proto::OPT_HEADER + len;
                    if self.option(s, h.option, data, out) == Verdict::Close {
                        return (input.len(), Verdict::Close);
                    }
                }
                Phase::Transmission(export) => {
                    let (n, v) = self.transmission(id, s, export, rest, out);
                    return (at + n, v);
                }
            }
        }
    }

    fn input_overflow(&mut self, _out: &mut Out<'_>) {
        // Unreachable in practice: the unparsed input is at most one request with its payload
        // (checked against the largest) or one option (larger ones are skipped).
    }

    fn rejected(&self) -> &'static [u8] {
        b""
    }

    fn complete(&mut self, done: &mut Completions<'_, NbdSession>) {
        let mut list = std::mem::take(&mut self.done);
        list.append(&mut self.failed);
        self.io.poll(&mut list);
        for &(t, res) in &list {
            let p = t as u32;
            let Some(pl) = self.places.get_mut(p as usize).filter(|pl| pl.ops > 0) else {
                tracing::error!(tag = t, "a completion for no operation in flight");
                continue;
            };
            pl.ops -= 1;
            self.ops -= 1;
            match res {
                Some(n) => pl.moved += n,
                None => {
                    pl.failed = true;
                    pl.fua = false;
                    pl.flush = false;
                }
            }
            if pl.settled() && !pl.queued {
                self.settle(p, done);
            }
        }
        let progressed = !list.is_empty();
        list.clear();
        self.done = list;
        // Operations that found the ring full go out now that some completed.
        while let Some(&p) = self.queue.front() {
            if !self.issue_more(p) {
                break;
            }
            self.queue.pop_front();
            self.places[p as usize].queued = false;
            if self.places[p as usize].settled() {
                self.settle(p, done);
            }
        }
        // A connection waits for room that completions make, or, when none is in flight,
        // for the DPU to take what fills the request ring: it tries again.
        if progressed || self.ops == 0 {
            for id in self.waiters.drain(..) {
                done.resume(id);
            }
        }
    }

    fn closed(&mut self, _id: ConnId, s: NbdSession) {
        if let Some(p) = s.write_place {
            // The rest of its payload is gone: nothing more is issued, and its reply goes
            // nowhere.
            let pl = &mut self.places[p as usize];
            pl.issued = pl.len;
            pl.failed = true;
            pl.fua = false;
            if pl.ops == 0 {
                self.release(p);
            }
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.io.wake_fd()
    }

    fn prepare_sleep(&mut self) -> bool {
        // Failures to deliver, or operations that found the request ring full with nothing
        // in flight (no completion will wake the loop: the ring empties as the DPU takes its
        // entries).
        let stuck = self.ops == 0 && !(self.queue.is_empty() && self.waiters.is_empty());
        if !self.failed.is_empty() || stuck {
            return false;
        }
        self.io.prepare_sleep()
    }

    fn end_sleep(&mut self) {
        self.io.end_sleep();
    }

    fn in_flight(&self) -> usize {
        self.places.len() - self.free.len()
    }

    fn shutdown(&mut self) {
        // Operations still in flight (the drain ran out): wait for them, bounded, so that
        // their buffers are not freed under them.
        let until = Instant::now() + IO_DRAIN;
        let mut list = Vec::new();
        while self.ops_in_flight() && Instant::now() < until {
            list.append(&mut self.failed);
            self.io.poll(&mut list);
            for &(t, _) in &list {
                if let Some(pl) = self.places.get_mut(t as usize).filter(|pl| pl.ops > 0) {
                    pl.ops -= 1;
                    self.ops -= 1;
                }
            }
            list.clear();
            std::thread::sleep(Duration::from_millis(1));
        }
        for f in 0..self.exports.len() {
            let _ = self.io.flush(f, u64::MAX);
        }
        let until = Instant::now() + IO_DRAIN;
        let mut flushed = 0;
        while flushed < self.exports.len() && Instant::now() < until {
            self.io.poll(&mut list);
            flushed += list.iter().filter(|d| d.0 == u64::MAX).count();
            list.clear();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for NbdService {
    fn drop(&mut self) {
        if self.ops_in_flight() {
            // The storage library may still write into these buffers.
            std::mem::forget(std::mem::take(&mut self.places));
        }
    }
}

/// The NBD server: the service on an event loop.
pub struct NbdServer {
    inner: dds_server::Server<NbdService>,
}

impl NbdServer {
    /// Opens (creating and sizing) the exports' files in `storage` and binds. With `dds`, the
    /// connection of a DDS `storage`, requests go through the host library's asynchronous API;
    /// otherwise through second handles of the files, done when issued.
    pub fn open(cfg: NbdConfig, storage: &dyn Storage, dds: Option<Arc<Dds>>) -> Result<NbdServer> {
        if cfg.exports.is_empty() {
            bail!("no export: give at least one --export NAME=SIZE");
        }
        for (k, e) in cfg.exports.iter().enumerate() {
            if cfg.exports[..k].iter().any(|o| o.name == e.name) {
                bail!("export `{}` is given twice", e.name);
            }
        }
        let mut files: Vec<Box<dyn StoreFile>> = Vec::with_capacity(cfg.exports.len());
        for e in &cfg.exports {
            let f = storage
                .open(&e.name)
                .with_context(|| format!("open the file of export `{}`", e.name))?;
            let size = f.size()?;
            if size < e.size {
                f.set_size(e.size)
                    .with_context(|| format!("size export `{}` to {} bytes", e.name, e.size))?;
            } else if size > e.size {
                bail!(
                    "export `{}`: its file holds {size} bytes, more than the {} asked (give its \
                     size, or delete the file)",
                    e.name,
                    e.size
                );
            }
            files.push(f);
        }
        // The DPU's offload engine may read the exports' files: each export's file under its
        // name's key (and the default export's under the empty name's), docs/nbd.md §6.
        for (k, (e, f)) in cfg.exports.iter().zip(&files).enumerate() {
            if storage
                .expose(f.as_ref())
                .with_context(|| format!("expose the file of export `{}`", e.name))?
            {
                let mut items = vec![(crate::offload::export_key(e.name.as_bytes()), 0, 0, e.size)];
                if k == 0 {
                    items.push((crate::offload::export_key(b""), 0, 0, e.size));
                }
                storage
                    .cache(f.as_ref(), &items)
                    .with_context(|| format!("publish export `{}` to the DPU", e.name))?;
            }
        }
        let ids: Option<Vec<u32>> = files.iter().map(|f| f.dds_id()).collect();
        let io: Box<dyn FileIo> = match (dds, ids) {
            (Some(dds), Some(ids)) => Box::new(DdsIo::new(dds, &ids)),
            _ => {
                let mut again = Vec::with_capacity(files.len());
                for e in &cfg.exports {
                    again.push(storage.open(&e.name)?);
                }
                Box::new(SyncIo::new(again))
            }
        };
        let max_io = io.max_io().min(proto::PAYLOAD_MAX as usize) as u32;
        let service = NbdService {
            exports: cfg
                .exports
                .iter()
                .map(|e| Export {
                    name: e.name.clone(),
                    size: e.size,
                    read_only: e.read_only,
                })
                .collect(),
            io,
            max_io,
            zeroes: vec![0u8; max_io as usize],
            places: Vec::with_capacity(PLACES_MAX),
            free: Vec::with_capacity(PLACES_MAX),
            queue: VecDeque::with_capacity(PLACES_MAX),
            read_bytes: 0,
            ops: 0,
            waiters: Vec::with_capacity(64),
            failed: Vec::with_capacity(64),
            done: Vec::with_capacity(PLACES_MAX),
            stats: NbdStats::default(),
        };
        let rt = Config {
            max_connections: cfg.max_connections,
            // One request with the largest payload, or one option.
            input_limit: proto::REQUEST + proto::PAYLOAD_MAX as usize,
            frame_deadline: Some(FRAME_DEADLINE),
            ..Config::default()
        };
        let budget = Budget::new(usize::MAX / 2);
        let inner = dds_server::Server::bind(cfg.listen, rt, budget, service)
            .with_context(|| format!("listen on {}", cfg.listen))?;
        Ok(NbdServer { inner })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// Serves until `stop` is set, drains, then flushes every export; returns the counters.
    pub fn run(self, stop: &AtomicBool) -> NbdStats {
        self.inner.run(stop).stats
    }
}
