//! The OSD's client and peer ports as services of the server runtime (`dds-server`,
//! `docs/server-runtime.md`): the event loop of a port parses frames where they arrived,
//! answers bad frames at once, and hands every request to a worker of the port with its reply's
//! place reserved (`Out::defer`), so that many requests of one connection are in flight while
//! their replies leave in request order. A request goes to the worker of its PG (requests of one
//! PG run in arrival order); the object store and the replication calls block only workers.
//! Workers report to the loop through a list and an eventfd (the loop's wake-up source).
//!
//! The loop allocates nothing per request once warm: request payloads are copied into buffers
//! that come back with their replies and are reused, and reply slots are filled in request
//! order (an answer that came early waits with its connection), so replies are written
//! straight into the output.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use dds_server::{Completions, ConnId, Out, Service, Ticket, Verdict};

use crate::map::PgId;
use crate::server::Inner;
use crate::wire::{op, Header, OpError, Status, FLAG_REPLY, HEADER_LEN};

/// Which port a service serves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Port {
    Client,
    Peer,
}

/// Requests in flight per connection; a connection with more is not read until half of them
/// are answered.
const CONN_IN_FLIGHT: u32 = 256;
/// Requests in flight per port (the workers' queues hold this many).
const PORT_IN_FLIGHT: usize = 4096;
/// Request buffers kept for reuse (of each class), the capacity of a small one, and the
/// largest one kept.
const SPARE_BUFS: usize = 256;
const SMALL_BUF: usize = 4096;
const SPARE_BUF_BYTES: usize = 1 << 20;

/// A request handed to a worker.
struct Job {
    conn: ConnId,
    ticket: Ticket,
    h: Header,
    payload: Vec<u8>,
}

/// A request a worker answered.
struct Done {
    conn: ConnId,
    ticket: Ticket,
    h: Header,
    status: Status,
    reply: Vec<u8>,
    /// The request's payload buffer, for reuse.
    payload: Vec<u8>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Answered requests waiting for the loop, and the eventfd that wakes it.
struct Finished {
    list: Mutex<Vec<Done>>,
    fd: OwnedFd,
}

impl Finished {
    fn push(&self, d: Done) {
        locked(&self.list).push(d);
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
}

/// Per-connection state.
pub(crate) struct Session {
    in_flight: u32,
    /// Not read until requests in flight are answered (its bound or the port's).
    stalled: bool,
    /// The reply slot to fill next (slots are filled in request order, so that each reply is
    /// written straight into the output).
    next: u32,
    /// Answered requests waiting for an earlier one of the connection.
    parked: Vec<Done>,
}

impl Default for Session {
    fn default() -> Self {
        Session {
            in_flight: 0,
            stalled: false,
            next: 1,
            parked: Vec::new(),
        }
    }
}

/// One port of the OSD.
pub(crate) struct PortService {
    port: Port,
    inner: Arc<Inner>,
    jobs: Vec<SyncSender<Job>>,
    finished: Arc<Finished>,
    /// The list taken from `finished` (swapped, so neither grows again once warm).
    taken: Vec<Done>,
    /// Request buffers for reuse: small ones ([`SMALL_BUF`]) and larger ones.
    spare_small: Vec<Vec<u8>>,
    spare_large: Vec<Vec<u8>>,
    in_flight: usize,
    /// Payload bytes in flight (bounded by the OSD's frame memory).
    bytes: u64,
    stalled: Vec<ConnId>,
    still_stalled: Vec<ConnId>,
}

/// The workers of a port: they end when the port's service is dropped.
pub(crate) struct Workers(Vec<JoinHandle<()>>);

impl Workers {
    pub fn join(self) {
        for t in self.0 {
            let _ = t.join();
        }
    }
}

impl PortService {
    /// The service of `port` and its `workers` threads.
    pub fn new(
        port: Port,
        inner: Arc<Inner>,
        workers: usize,
    ) -> std::io::Result<(PortService, Workers)> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let finished = Arc::new(Finished {
            list: Mutex::new(Vec::with_capacity(PORT_IN_FLIGHT)),
            fd,
        });
        let workers = workers.max(1);
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for i in 0..workers {
            let (tx, rx) = sync_channel(PORT_IN_FLIGHT);
            let (inner, finished) = (inner.clone(), finished.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("osd{}-{}{i}", inner.cfg.id, &port.name()[..1]))
                    .spawn(move || work(port, &inner, rx, &finished))?,
            );
            jobs.push(tx);
        }
        Ok((
            PortService {
                port,
                inner,
                jobs,
                finished,
                taken: Vec::with_capacity(PORT_IN_FLIGHT),
                spare_small: Vec::with_capacity(SPARE_BUFS),
                spare_large: Vec::with_capacity(SPARE_BUFS),
                in_flight: 0,
                bytes: 0,
                stalled: Vec::with_capacity(1024),
                still_stalled: Vec::with_capacity(1024),
            },
            Workers(threads),
        ))
    }

    /// The worker of the request's PG (requests without one: by request id).
    fn worker_of(&self, h: &Header, p: &[u8]) -> usize {
        let pg = match (self.port, h.op) {
            (
                Port::Client,
                op::WRITE_FULL | op::WRITE | op::REMOVE | op::SETXATTR | op::OMAP_SET | op::OMAP_RM,
            ) => self.pg_of_oid(p.get(16..)),
            (Port::Client, op::LIST)
            | (Port::Peer, op::REPL_TX | op::PG_PUSH | op::PG_LOG_QUERY | op::PG_LIST) => pg_at(p),
            (Port::Client, op::PING | op::GET_MAP | op::STATUS) | (Port::Peer, op::PING) => None,
            _ => self.pg_of_oid(Some(p)),
        };
        let key = pg.map_or(h.req_id, |pg| {
            pg.pool.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(pg.pg)
        });
        (key % self.jobs.len() as u64) as usize
    }

    /// The PG of the oid at the start of `p` (pool u64 ‖ name bytes).
    fn pg_of_oid(&self, p: Option<&[u8]>) -> Option<PgId> {
        let p = p?;
        let pool = u64::from_le_bytes(p.get(0..8)?.try_into().ok()?);
        let len = u32::from_le_bytes(p.get(8..12)?.try_into().ok()?) as usize;
        let name = p.get(12..12usize.checked_add(len)?)?;
        self.inner.view().map.pg_of(pool, name)
    }

    /// A buffer for a payload of `len` bytes, reused when one fits.
    fn take_buf(&mut self, len: usize) -> Vec<u8> {
        let reused = if len <= SMALL_BUF {
            self.spare_small.pop()
        } else {
            self.spare_large.pop().filter(|b| b.capacity() >= len)
        };
        let mut b =
            reused.unwrap_or_else(|| Vec::with_capacity(len.next_power_of_two().max(SMALL_BUF)));
        b.clear();
        b
    }

    /// Keeps `b` for reuse (unless there are enough, or it is large).
    fn give_buf(&mut self, b: Vec<u8>) {
        let class = if b.capacity() <= SMALL_BUF {
            &mut self.spare_small
        } else {
            &mut self.spare_large
        };
        if class.len() < SPARE_BUFS && b.capacity() <= SPARE_BUF_BYTES {
            class.push(b);
        }
    }

    fn max_payload(&self) -> u32 {
        self.inner.cfg.max_payload
    }
}

/// The PG at the start of `p` (pool u64 ‖ pg u32).
fn pg_at(p: &[u8]) -> Option<PgId> {
    Some(PgId {
        pool: u64::from_le_bytes(p.get(0..8)?.try_into().ok()?),
        pg: u32::from_le_bytes(p.get(8..12)?.try_into().ok()?),
    })
}

impl Port {
    pub fn name(self) -> &'static str {
        match self {
            Port::Client => "client",
            Port::Peer => "peer",
        }
    }
}

/// Appends the reply to `req` to `out`.
fn put_reply(out: &mut Vec<u8>, req: &Header, status: Status, payload: &[u8], epoch: u32) {
    let h = Header {
        op: req.op,
        flags: FLAG_REPLY,
        status: status as u16,
        epoch,
        req_id: req.req_id,
        len: payload.len() as u32,
    };
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
}

fn work(port: Port, inner: &Inner, rx: Receiver<Job>, finished: &Finished) {
    while let Ok(job) = rx.recv() {
        let r = catch_unwind(AssertUnwindSafe(|| match port {
            Port::Client => inner.client_op(&job.h, &job.payload),
            Port::Peer => inner.peer_op(&job.h, &job.payload),
        }))
        .unwrap_or_else(|_| Err(OpError::new(Status::Io, "internal error")));
        let (status, reply) = match r {
            Ok(out) => (Status::Ok, out),
            Err(e) => (e.status, e.text.into_bytes()),
        };
        finished.push(Done {
            conn: job.conn,
            ticket: job.ticket,
            h: job.h,
            status,
            reply,
            payload: job.payload,
        });
    }
}

impl Service for PortService {
    type Session = Session;

    fn open(&mut self, _id: ConnId) -> Session {
        Session::default()
    }

    fn on_input(
        &mut self,
        id: ConnId,
        session: &mut Session,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        let epoch = self.inner.epoch();
        while let Some(hb) = input.get(at..at + HEADER_LEN) {
            let hb: &[u8; HEADER_LEN] = hb.try_into().expect("header length");
            let h = match Header::decode(hb) {
                Ok(h) => h,
                Err(why) => {
                    tracing::debug!(port = self.port.name(), "closing a connection: {why}");
                    return (at, Verdict::Close);
                }
            };
            if h.len > self.max_payload() {
                let text = format!(
                    "payload of {} bytes above the limit of {}",
                    h.len,
                    self.max_payload()
                );
                put_reply(out, &h, Status::TooLarge, text.as_bytes(), epoch);
                return (at, Verdict::Close);
            }
            let end = at + HEADER_LEN + h.len as usize;
            let Some(payload) = input.get(at + HEADER_LEN..end) else {
                break;
            };
            let len = u64::from(h.len);
            let over_memory = self.bytes + len > self.inner.cfg.frame_memory;
            if over_memory && self.in_flight == 0 {
                put_reply(
                    out,
                    &h,
                    Status::Busy,
                    b"frame memory budget exhausted",
                    epoch,
                );
                return (at, Verdict::Close);
            }
            if over_memory
                || session.in_flight >= CONN_IN_FLIGHT
                || self.in_flight >= PORT_IN_FLIGHT
            {
                session.stalled = true;
                self.stalled.push(id);
                return (at, Verdict::Pending);
            }
            at = end;
            if h.flags & FLAG_REPLY != 0 {
                put_reply(
                    out,
                    &h,
                    Status::BadFrame,
                    b"a reply sent as a request",
                    epoch,
                );
                continue;
            }
            if h.epoch != 0 && h.epoch != epoch {
                let text = format!("map epoch {} differs from the OSD's {epoch}", h.epoch);
                put_reply(out, &h, Status::StaleEpoch, text.as_bytes(), epoch);
                continue;
            }
            let w = self.worker_of(&h, payload);
            let mut buf = self.take_buf(payload.len());
            buf.extend_from_slice(payload);
            let ticket = out.defer();
            let job = Job {
                conn: id,
                ticket,
                h,
                payload: buf,
            };
            if self.jobs[w].try_send(job).is_err() {
                // Only when a worker is gone (a stop): the connection ends.
                return (at, Verdict::Close);
            }
            self.in_flight += 1;
            self.bytes += len;
            session.in_flight += 1;
        }
        (at, Verdict::Continue)
    }

    fn input_overflow(&mut self, _out: &mut Out<'_>) {}

    fn rejected(&self) -> &'static [u8] {
        b""
    }

    fn complete(&mut self, done: &mut Completions<'_, Session>) {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(&self.finished.fd, &mut v);
        std::mem::swap(&mut self.taken, &mut *locked(&self.finished.list));
        if self.taken.is_empty() {
            return;
        }
        let epoch = self.inner.epoch();
        let mut taken = std::mem::take(&mut self.taken);
        for d in taken.drain(..) {
            self.in_flight -= 1;
            self.bytes -= d.payload.len() as u64;
            let conn = d.conn;
            let Some((session, _)) = done.reply(conn) else {
                self.give_buf(d.payload);
                continue;
            };
            session.parked.push(d);
            // Fill the slots that are next in request order.
            while let Some((session, _)) = done.reply(conn) {
                let next = session.next;
                let Some(k) = session
                    .parked
                    .iter()
                    .position(|p| p.ticket.to_u32() == next)
                else {
                    break;
                };
                let p = session.parked.swap_remove(k);
                session.next = next.wrapping_add(1).max(1);
                session.in_flight -= 1;
                if let Some((_, out)) = done.fill(conn, p.ticket) {
                    put_reply(out, &p.h, p.status, &p.reply, epoch);
                }
                self.give_buf(p.payload);
            }
        }
        self.taken = taken;
        if self.stalled.is_empty()
            || self.in_flight >= PORT_IN_FLIGHT / 2
            || self.bytes > self.inner.cfg.frame_memory / 2
        {
            return;
        }
        for id in self.stalled.drain(..) {
            let Some((session, _)) = done.reply(id) else {
                continue;
            };
            if session.in_flight <= CONN_IN_FLIGHT / 2 {
                session.stalled = false;
                done.resume(id);
            } else {
                self.still_stalled.push(id);
            }
        }
        std::mem::swap(&mut self.stalled, &mut self.still_stalled);
    }

    fn closed(&mut self, id: ConnId, session: Session) {
        if session.stalled {
            self.stalled.retain(|&s| s != id);
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.finished.fd.as_fd().as_raw_fd())
    }

    fn prepare_sleep(&mut self) -> bool {
        locked(&self.finished.list).is_empty()
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
