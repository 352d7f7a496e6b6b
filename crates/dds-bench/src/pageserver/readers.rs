//! The page readers of `dds bench pageserver`: closed-loop connections, each with one message
//! of `batch` GetPages in flight, driven as non-blocking sockets from the event loops of a few
//! threads (one by default), as the key-value benchmark's load generator does, so that the
//! client does not crowd out a server it shares cores with (a thread per connection costs a
//! wake-up and a context switch per read on the host's cores, and serializes a burst of
//! responses behind the scheduler).

use std::io::{ErrorKind, Read};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_pageserver::proto::{self, status, GetPage};
use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Log, PS};
use crate::kv::load::write_some;

/// How long a reader thread waits for any response before it gives up on the server.
const STALL: Duration = Duration::from_secs(60);

/// One load point of readers.
pub(super) struct Readers<'a> {
    pub addr: SocketAddr,
    pub log: &'a Log,
    pub pages: u64,
    pub conns: usize,
    /// GetPages per message.
    pub batch: usize,
    pub secs: f64,
    /// Read `lag` behind the newest acknowledged LSN (read replicas) instead of at it.
    pub lagging: bool,
    pub threads: usize,
}

/// What a load point measured: reads answered, RETRY answers, latency per read.
pub(super) struct ReadResult {
    pub reads: u64,
    pub retries: u64,
    pub hist: Histogram<u64>,
}

impl ReadResult {
    fn new() -> Result<ReadResult> {
        Ok(ReadResult {
            reads: 0,
            retries: 0,
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
        })
    }
}

impl Readers<'_> {
    /// Runs the load point: `threads` threads share the connections (connection `c` on thread
    /// `c % threads`), each message's latency recorded once per GetPage in it.
    pub fn run(&self) -> Result<ReadResult> {
        let threads = self.threads.clamp(1, self.conns.max(1));
        let deadline = Instant::now() + Duration::from_secs_f64(self.secs);
        let results: Vec<Result<ReadResult>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let ids: Vec<usize> = (t..self.conns).step_by(threads).collect();
                    sc.spawn(move || self.thread(&ids, deadline))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("reader thread"))
                .collect()
        });
        let mut total = ReadResult::new()?;
        for r in results {
            let r = r?;
            total.reads += r.reads;
            total.retries += r.retries;
            total.hist.add(&r.hist)?;
        }
        Ok(total)
    }

    /// One thread's event loop over connections `ids`, until the deadline (each connection
    /// finishing the message it has in flight).
    fn thread(&self, ids: &[usize], deadline: Instant) -> Result<ReadResult> {
        let mut poll = Poll::new().context("create a poller")?;
        let mut conns = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            let s = std::net::TcpStream::connect(self.addr).context("connect")?;
            s.set_nodelay(true)?;
            s.set_nonblocking(true)?;
            let mut s = mio::net::TcpStream::from_std(s);
            poll.registry()
                .register(&mut s, Token(i), Interest::READABLE | Interest::WRITABLE)?;
            conns.push(Conn {
                s,
                rng: SmallRng::seed_from_u64(id as u64 + 17),
                next_id: 0,
                out: Vec::with_capacity(proto::MSG_HEADER + self.batch * proto::GETPAGE_BYTES),
                written: 0,
                inbuf: vec![0; self.batch * (proto::RESP_HEADER + PS) + 4096],
                have: 0,
                pending: 0,
                started: Instant::now(),
            });
        }
        let mut out = ReadResult::new()?;
        let mut reqs = Vec::with_capacity(self.batch);
        // Connections with nothing in flight: the read point is not known yet.
        let mut waiting: Vec<usize> = (0..conns.len()).collect();
        let mut active = conns.len();
        let mut events = Events::with_capacity(1024);
        let mut last = Instant::now();
        while active > 0 {
            let mut k = 0;
            while k < waiting.len() {
                let i = waiting[k];
                if Instant::now() >= deadline {
                    active -= 1;
                } else if !self.start(&mut conns[i], &mut reqs)? {
                    k += 1;
                    continue;
                }
                waiting.swap_remove(k);
            }
            if active == 0 {
                break;
            }
            let timeout = if waiting.is_empty() {
                Duration::from_millis(500)
            } else {
                Duration::from_millis(1)
            };
            match poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("poll"),
            }
            if events.is_empty() {
                if waiting.is_empty() && last.elapsed() > STALL {
                    bail!("no response from the page server for {} s", STALL.as_secs());
                }
                continue;
            }
            last = Instant::now();
            for ev in events.iter() {
                let i = ev.token().0;
                let c = &mut conns[i];
                // Nothing in flight: waiting for a read point, or done.
                if c.pending == 0 {
                    continue;
                }
                if ev.is_writable() {
                    c.flush()?;
                }
                if !ev.is_readable() || !c.receive(&mut out)? {
                    continue;
                }
                // This message is answered: the next one, or done.
                if Instant::now() >= deadline {
                    active -= 1;
                } else if !self.start(c, &mut reqs)? {
                    waiting.push(i);
                }
            }
        }
        Ok(out)
    }

    /// Draws the next message's pages and starts sending it; false when no LSN is
    /// acknowledged yet (nothing can be read).
    fn start(&self, c: &mut Conn, reqs: &mut Vec<GetPage>) -> Result<bool> {
        let r = if self.lagging {
            self.log.lagging.load(Ordering::Acquire)
        } else {
            self.log.acked.load(Ordering::Acquire)
        };
        if r == 0 {
            return Ok(false);
        }
        reqs.clear();
        while reqs.len() < self.batch {
            let page = c.rng.gen_range(0..self.pages);
            let n = if self.lagging {
                // Its last record at or below the read point.
                let Some(n) = self.log.last_mod_at(page, r) else {
                    continue;
                };
                n
            } else {
                self.log.page_lsn[page as usize].load(Ordering::Acquire)
            };
            if n > r {
                continue; // its newest record is not acknowledged yet
            }
            c.next_id += 1;
            reqs.push(GetPage {
                req_id: c.next_id,
                lsn: r,
                nms: n,
                page,
            });
        }
        c.out.clear();
        proto::encode_getpages(&mut c.out, reqs);
        c.written = 0;
        c.pending = reqs.len();
        c.started = Instant::now();
        c.flush()?;
        Ok(true)
    }
}

/// One closed-loop connection and the message it has in flight.
struct Conn {
    s: mio::net::TcpStream,
    rng: SmallRng,
    next_id: u64,
    /// The message in flight, and how much of it is written.
    out: Vec<u8>,
    written: usize,
    /// Response bytes read and not yet consumed (`have` of them), room for a whole batch.
    inbuf: Vec<u8>,
    have: usize,
    /// Responses of the message still to come.
    pending: usize,
    started: Instant,
}

impl Conn {
    /// Writes what the socket takes of the message.
    fn flush(&mut self) -> Result<()> {
        write_some(&mut self.s, &self.out, &mut self.written)
    }

    /// Reads what arrived and consumes whole responses; true once the message is answered.
    fn receive(&mut self, out: &mut ReadResult) -> Result<bool> {
        loop {
            if self.have == self.inbuf.len() {
                bail!("a response larger than {} bytes", self.inbuf.len());
            }
            match self.s.read(&mut self.inbuf[self.have..]) {
                Ok(0) => bail!("the page server closed the connection"),
                Ok(n) => self.have += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("receive"),
            }
        }
        let mut at = 0;
        while self.pending > 0 {
            let buf = &self.inbuf[at..self.have];
            let len = match proto::response_len(buf, self.inbuf.len()) {
                Ok(Some(len)) if len <= buf.len() => len,
                Ok(_) => break,
                Err(e) => bail!("malformed response: {}", e.0),
            };
            match u16::from_le_bytes([buf[4], buf[5]]) {
                status::OK | status::OLD_VERSION => out.reads += 1,
                status::RETRY => out.retries += 1,
                other => bail!("GetPage answered status {other}"),
            }
            at += len;
            self.pending -= 1;
        }
        if at > 0 {
            self.inbuf.copy_within(at..self.have, 0);
            self.have -= at;
        }
        if self.pending > 0 {
            return Ok(false);
        }
        if self.have > 0 {
            bail!("{} bytes beyond the responses asked for", self.have);
        }
        let us = self.started.elapsed().as_micros().max(1) as u64;
        let n = (self.out.len() - proto::MSG_HEADER) / proto::GETPAGE_BYTES;
        out.hist.record_n(us, n as u64).ok();
        Ok(true)
    }
}
