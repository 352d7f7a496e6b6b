//! A YCSB-style closed-loop load generator speaking RESP: each connection keeps a batch of
//! `depth` commands in flight, draws keys from a uniform or a zipfian distribution (YCSB's
//! generator, ranks scattered over the key space), and checks every GET's value. A few threads
//! (one by default) drive all the connections as non-blocking sockets, each from one event
//! loop, so that the client does not crowd out a server it shares cores with.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use mio::{Events, Interest, Poll, Token};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Key popularity.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub enum Dist {
    Uniform,
    /// Zipfian with this skew (YCSB's 0.99).
    Zipf(f64),
}

/// One load point.
#[derive(Clone, Debug, Serialize)]
pub struct LoadSpec {
    #[serde(skip)]
    pub addr: SocketAddr,
    pub keys: u64,
    pub dist: Dist,
    /// Fraction of GETs (the rest are SETs of the same value).
    pub read_fraction: f64,
    pub connections: usize,
    pub depth: usize,
    pub seconds: f64,
    pub seed: u64,
    /// Load generator threads; each drives its share of the connections from one event loop.
    pub threads: usize,
}

/// What a load point measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadResult {
    pub ops: u64,
    pub gets: u64,
    pub sets: u64,
    /// GETs whose value was not the key's.
    pub wrong_values: u64,
    /// Error replies.
    pub errors: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// The key of index `i`: 8 bytes, as in the DDS evaluation (§9.2).
pub fn key(i: u64) -> [u8; 8] {
    let mut k = [b'0'; 8];
    let mut x = i;
    for b in k.iter_mut().rev() {
        *b = b'0' + (x % 10) as u8;
        x /= 10;
    }
    k
}

/// The value of key `i`: 8 bytes, so every GET can be checked.
pub fn value(i: u64) -> [u8; 8] {
    let mut v = key(i);
    v.reverse();
    v
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases"), over ranks 0..n.
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    pub fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |n: u64| (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2);
        Zipf {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    pub fn sample(&self, rng: &mut SmallRng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        ((self.n as f64) * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64 % self.n
    }
}

/// Scatters a rank over the key space (hot keys are not neighbours), as YCSB's scrambled
/// zipfian does.
pub(crate) fn scatter(rank: u64, n: u64) -> u64 {
    let mut h = rank ^ 0x9e37_79b9_7f4a_7c15;
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (h ^ (h >> 31)) % n
}

pub(crate) fn push_cmd(out: &mut Vec<u8>, words: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
    for w in words {
        out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        out.extend_from_slice(w);
        out.extend_from_slice(b"\r\n");
    }
}

/// Frames one reply at the start of `buf`: its length, whether it is an error, and where its
/// bulk payload is (empty if none, or a null bulk). `None`: more bytes are needed.
pub(crate) fn parse_reply(buf: &[u8]) -> Result<Option<(usize, bool, Range<usize>)>> {
    let Some(n) = dds_resp::frame_reply(buf, 1 << 16, 64 << 20)
        .map_err(|e| anyhow::anyhow!("bad reply: {e}"))?
    else {
        return Ok(None);
    };
    let r = &buf[..n];
    Ok(Some(match r[0] {
        b'-' => (n, true, 0..0),
        b'$' if r[1] != b'-' => {
            let nl = r.iter().position(|&b| b == b'\n').expect("framed");
            (n, false, nl + 1..n - 2)
        }
        _ => (n, false, 0..0),
    }))
}

/// Reads one reply; returns (is error, bulk payload if any).
pub(crate) fn read_reply(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    at: &mut usize,
) -> Result<(bool, Vec<u8>)> {
    loop {
        if let Some((n, err, payload)) = parse_reply(&buf[*at..])? {
            let out = (err, buf[*at..][payload].to_vec());
            *at += n;
            if *at == buf.len() {
                buf.clear();
                *at = 0;
            }
            return Ok(out);
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// SETs every key (pipelined, several connections); returns keys per second.
pub fn load_keys(
    addr: SocketAddr,
    keys: u64,
    connections: usize,
    progress: &dyn Fn(u64),
) -> Result<f64> {
    let t0 = Instant::now();
    let per = keys.div_ceil(connections as u64);
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| -> Result<()> {
        let mut hs = Vec::new();
        for c in 0..connections as u64 {
            let done = &done;
            hs.push(sc.spawn(move || -> Result<()> {
                let mut s = TcpStream::connect(addr).context("connect")?;
                s.set_nodelay(true)?;
                let (lo, hi) = (c * per, ((c + 1) * per).min(keys));
                let mut buf = Vec::new();
                let mut at = 0;
                let mut i = lo;
                while i < hi {
                    let end = (i + 512).min(hi);
                    let mut out = Vec::new();
                    for k in i..end {
                        push_cmd(&mut out, &[b"SET", &key(k), &value(k)]);
                    }
                    s.write_all(&out)?;
                    for _ in i..end {
                        let (err, _) = read_reply(&mut s, &mut buf, &mut at)?;
                        if err {
                            bail!("SET failed while loading");
                        }
                    }
                    done.fetch_add(end - i, std::sync::atomic::Ordering::Relaxed);
                    i = end;
                }
                Ok(())
            }));
        }
        loop {
            progress(done.load(std::sync::atomic::Ordering::Relaxed));
            if hs.iter().all(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for h in hs {
            h.join().expect("loader thread")?;
        }
        Ok(())
    })?;
    Ok(keys as f64 / t0.elapsed().as_secs_f64())
}

/// Runs one load point against `spec.addr`.
pub fn run(spec: &LoadSpec) -> Result<LoadResult> {
    run_routed(spec, &[spec.addr], &|_, _| 0)
}

/// How long a load thread waits for any reply before it gives up on the server.
const STALL: Duration = Duration::from_secs(60);

/// Runs one load point over several endpoints: each connection holds a socket to every
/// endpoint, and `route(key, connection)` picks the endpoint of each command (a cluster's
/// shard, a front end); a batch of `depth` commands is sent to all endpoints before any reply
/// is read, and the next batch goes out once every reply of this one is in.
///
/// `spec.threads` threads share the connections (connection `c` on thread `c % threads`);
/// each drives its connections as non-blocking sockets from one event loop.
pub fn run_routed(
    spec: &LoadSpec,
    endpoints: &[SocketAddr],
    route: &(dyn Fn(&[u8; 8], usize) -> usize + Sync),
) -> Result<LoadResult> {
    if endpoints.is_empty() || spec.keys == 0 {
        bail!("a load needs an endpoint and a key");
    }
    let zipf = match spec.dist {
        Dist::Zipf(t) => Some(Zipf::new(spec.keys, t)),
        Dist::Uniform => None,
    };
    let threads = spec.threads.clamp(1, spec.connections.max(1));
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(spec.seconds);
    let results: Vec<Result<(LoadResult, Histogram<u64>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let conns: Vec<usize> = (t..spec.connections).step_by(threads).collect();
                let zipf = zipf.as_ref();
                sc.spawn(move || {
                    EventLoop::new(spec, endpoints, route, zipf, deadline)?.run(&conns)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("load thread"))
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let mut total = LoadResult::default();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for r in results {
        let (r, h) = r?;
        total.ops += r.ops;
        total.gets += r.gets;
        total.sets += r.sets;
        total.wrong_values += r.wrong_values;
        total.errors += r.errors;
        hist.add(&h)?;
    }
    total.seconds = secs;
    total.ops_per_sec = total.ops as f64 / secs;
    total.p50_us = hist.value_at_quantile(0.5) as f64;
    total.p99_us = hist.value_at_quantile(0.99) as f64;
    Ok(total)
}

/// Writes what the non-blocking socket `s` takes of `out` from `written` on (advanced).
pub(crate) fn write_some(s: &mut impl Write, out: &[u8], written: &mut usize) -> Result<()> {
    while *written < out.len() {
        match s.write(&out[*written..]) {
            Ok(0) => bail!("the server closed the connection"),
            Ok(n) => *written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("send"),
        }
    }
    Ok(())
}

/// One connection's socket to one endpoint.
struct Sock {
    s: mio::net::TcpStream,
    /// This batch's commands for the endpoint, and how much of them is written.
    out: Vec<u8>,
    written: usize,
    /// Bytes read and not yet consumed, from `at`.
    inbuf: Vec<u8>,
    at: usize,
    /// This batch's commands for the endpoint, in order: (key index, is a GET).
    sent: Vec<(u64, bool)>,
    /// Replies of `sent` in so far.
    got: usize,
}

impl Sock {
    /// Writes what the socket takes of `out`.
    fn flush(&mut self) -> Result<()> {
        write_some(&mut self.s, &self.out, &mut self.written)
    }
}

/// One closed-loop connection: a socket per endpoint and the batch in flight.
struct Conn {
    id: usize,
    socks: Vec<Sock>,
    rng: SmallRng,
    /// Replies of this batch still to come.
    pending: usize,
    started: Instant,
    done: bool,
}

/// One load thread: its connections, polled together.
struct EventLoop<'a> {
    spec: &'a LoadSpec,
    endpoints: &'a [SocketAddr],
    route: &'a (dyn Fn(&[u8; 8], usize) -> usize + Sync),
    zipf: Option<&'a Zipf>,
    deadline: Instant,
    poll: Poll,
    result: LoadResult,
    hist: Histogram<u64>,
    chunk: Vec<u8>,
}

impl<'a> EventLoop<'a> {
    fn new(
        spec: &'a LoadSpec,
        endpoints: &'a [SocketAddr],
        route: &'a (dyn Fn(&[u8; 8], usize) -> usize + Sync),
        zipf: Option<&'a Zipf>,
        deadline: Instant,
    ) -> Result<Self> {
        Ok(EventLoop {
            spec,
            endpoints,
            route,
            zipf,
            deadline,
            poll: Poll::new().context("create a poller")?,
            result: LoadResult::default(),
            hist: Histogram::new_with_bounds(1, 60_000_000, 3)?,
            chunk: vec![0; 1 << 16],
        })
    }

    /// Drives connections `ids` until the deadline, each finishing the batch it has in flight.
    fn run(mut self, ids: &[usize]) -> Result<(LoadResult, Histogram<u64>)> {
        let n = self.endpoints.len();
        let mut conns = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            let mut socks = Vec::with_capacity(n);
            for (e, a) in self.endpoints.iter().enumerate() {
                let s = std::net::TcpStream::connect(a).context("connect")?;
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                let mut s = mio::net::TcpStream::from_std(s);
                self.poll.registry().register(
                    &mut s,
                    Token(i * n + e),
                    Interest::READABLE | Interest::WRITABLE,
                )?;
                socks.push(Sock {
                    s,
                    out: Vec::new(),
                    written: 0,
                    inbuf: Vec::new(),
                    at: 0,
                    sent: Vec::with_capacity(self.spec.depth),
                    got: 0,
                });
            }
            conns.push(Conn {
                id,
                socks,
                rng: SmallRng::seed_from_u64(self.spec.seed ^ (id as u64 * 7919)),
                pending: 0,
                started: Instant::now(),
                done: false,
            });
        }
        let mut active = conns.len();
        for c in &mut conns {
            if Instant::now() < self.deadline {
                self.send_batch(c)?;
            } else {
                c.done = true;
                active -= 1;
            }
        }
        let mut events = Events::with_capacity(1024);
        let mut last = Instant::now();
        while active > 0 {
            match self
                .poll
                .poll(&mut events, Some(Duration::from_millis(500)))
            {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).context("poll"),
            }
            if events.is_empty() {
                if last.elapsed() > STALL {
                    bail!("no reply from the server for {} s", STALL.as_secs());
                }
                continue;
            }
            last = Instant::now();
            for ev in events.iter() {
                let (i, e) = (ev.token().0 / n, ev.token().0 % n);
                let c = &mut conns[i];
                if c.done {
                    continue;
                }
                if ev.is_writable() {
                    c.socks[e].flush()?;
                }
                if ev.is_readable() && self.receive(c, e)? {
                    active -= 1;
                }
            }
        }
        Ok((self.result, self.hist))
    }

    /// Draws `depth` commands, routes them and starts sending them.
    fn send_batch(&mut self, c: &mut Conn) -> Result<()> {
        for s in &mut c.socks {
            s.out.clear();
            s.written = 0;
            s.sent.clear();
            s.got = 0;
        }
        for _ in 0..self.spec.depth {
            let k = match self.zipf {
                Some(z) => scatter(z.sample(&mut c.rng), self.spec.keys),
                None => c.rng.gen_range(0..self.spec.keys),
            };
            let kb = key(k);
            let e = (self.route)(&kb, c.id);
            let get = c.rng.gen::<f64>() < self.spec.read_fraction;
            let s = &mut c.socks[e];
            if get {
                push_cmd(&mut s.out, &[b"GET", &kb]);
            } else {
                push_cmd(&mut s.out, &[b"SET", &kb, &value(k)]);
            }
            s.sent.push((k, get));
        }
        c.pending = self.spec.depth;
        c.started = Instant::now();
        for s in &mut c.socks {
            s.flush()?;
        }
        Ok(())
    }

    /// Reads what socket `e` of `c` has, checks the replies, and sends the next batch once
    /// this one is answered. Returns whether the connection is done.
    fn receive(&mut self, c: &mut Conn, e: usize) -> Result<bool> {
        loop {
            let got = match c.socks[e].s.read(&mut self.chunk) {
                Ok(0) => bail!("the server closed the connection"),
                Ok(m) => m,
                Err(err) if err.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(err) => return Err(err).context("receive"),
            };
            let s = &mut c.socks[e];
            s.inbuf.extend_from_slice(&self.chunk[..got]);
            while let Some((len, err, payload)) = parse_reply(&s.inbuf[s.at..])? {
                let Some(&(k, get)) = s.sent.get(s.got) else {
                    bail!("a reply to no command");
                };
                let r = &mut self.result;
                r.ops += 1;
                if err {
                    r.errors += 1;
                } else if get {
                    r.gets += 1;
                    if s.inbuf[s.at..][payload] != value(k) {
                        r.wrong_values += 1;
                    }
                } else {
                    r.sets += 1;
                }
                s.at += len;
                s.got += 1;
                c.pending -= 1;
            }
            if s.at == s.inbuf.len() {
                s.inbuf.clear();
                s.at = 0;
            }
            if c.pending == 0 {
                let us = c.started.elapsed().as_micros().max(1) as u64;
                self.hist.record_n(us, self.spec.depth as u64).ok();
                if Instant::now() >= self.deadline {
                    c.done = true;
                    return Ok(true);
                }
                self.send_batch(c)?;
            }
            // A short read emptied the socket; its next bytes raise a new event.
            if got < self.chunk.len() {
                return Ok(false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;

    /// What a test server saw.
    #[derive(Default)]
    struct Seen {
        connections: AtomicU64,
        commands: AtomicU64,
        /// SETs whose value was not the key's.
        bad_sets: AtomicU64,
        /// Keys this server does not own.
        misrouted: AtomicU64,
        /// Commands that arrived before the replies to the previous `hold` were sent.
        over_depth: AtomicU64,
        /// GETs answered with a wrong value, and with an error.
        corrupted: AtomicU64,
        failed: AtomicU64,
    }

    /// How a test server answers.
    #[derive(Clone, Copy)]
    struct Behaviour {
        /// Replies go out once this many commands are unanswered.
        hold: usize,
        /// Owns the keys `k` with `k % owners == owner`.
        owner: u64,
        owners: u64,
        /// GETs of keys divisible by these get a wrong value, and an error (0: never).
        corrupt_every: u64,
        fail_every: u64,
    }

    const PLAIN: Behaviour = Behaviour {
        hold: 1,
        owner: 0,
        owners: 1,
        corrupt_every: 0,
        fail_every: 0,
    };

    fn index(k: &[u8]) -> u64 {
        std::str::from_utf8(k).unwrap().parse().unwrap()
    }

    /// A RESP server whose every key `k` holds `value(k)`: a thread per connection.
    fn server(b: Behaviour) -> (SocketAddr, Arc<Seen>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let s2 = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let c = c.unwrap();
                let seen = s2.clone();
                seen.connections.fetch_add(1, Relaxed);
                std::thread::spawn(move || serve(c, b, &seen));
            }
        });
        (addr, seen)
    }

    fn serve(mut c: TcpStream, b: Behaviour, seen: &Seen) {
        let lim = dds_resp::Limits::default();
        let mut argv = dds_resp::Argv::new();
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        let mut unanswered = 0;
        let mut chunk = [0u8; 4096];
        loop {
            let n = match c.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            let mut at = 0;
            while let Some(len) = dds_resp::parse_command(&buf[at..], &lim, &mut argv).unwrap() {
                let words: Vec<&[u8]> = argv.iter(&buf[at..]).collect();
                seen.commands.fetch_add(1, Relaxed);
                let k = index(words[1]);
                if k % b.owners != b.owner {
                    seen.misrouted.fetch_add(1, Relaxed);
                }
                let mut r = dds_resp::Reply::new(&mut out);
                match words[0] {
                    b"GET" if b.fail_every > 0 && k.is_multiple_of(b.fail_every) => {
                        seen.failed.fetch_add(1, Relaxed);
                        r.error("ERR injected");
                    }
                    b"GET" if b.corrupt_every > 0 && k.is_multiple_of(b.corrupt_every) => {
                        seen.corrupted.fetch_add(1, Relaxed);
                        r.bulk(&value(k + 1));
                    }
                    b"GET" => r.bulk(&value(k)),
                    b"SET" => {
                        if words[2] != value(k) {
                            seen.bad_sets.fetch_add(1, Relaxed);
                        }
                        r.ok();
                    }
                    w => panic!("unexpected command {:?}", String::from_utf8_lossy(w)),
                }
                at += len;
                unanswered += 1;
                if unanswered == b.hold {
                    if at < buf.len() {
                        seen.over_depth.fetch_add(1, Relaxed);
                    }
                    if c.write_all(&out).is_err() {
                        return;
                    }
                    out.clear();
                    unanswered = 0;
                }
            }
            buf.drain(..at);
        }
    }

    fn spec(addr: SocketAddr, connections: usize, depth: usize, threads: usize) -> LoadSpec {
        LoadSpec {
            addr,
            keys: 1000,
            dist: Dist::Zipf(0.99),
            read_fraction: 0.7,
            connections,
            depth,
            seconds: 0.3,
            seed: 1,
            threads,
        }
    }

    #[test]
    fn counts_every_command_and_checks_values() {
        let (addr, seen) = server(PLAIN);
        let r = run(&spec(addr, 12, 1, 2)).unwrap();
        assert!(r.ops > 100, "{r:?}");
        assert_eq!(r.ops, seen.commands.load(Relaxed));
        assert_eq!(r.ops, r.gets + r.sets);
        assert!(r.gets > r.sets && r.sets > 0, "{r:?}");
        assert_eq!((r.wrong_values, r.errors), (0, 0));
        assert_eq!(seen.bad_sets.load(Relaxed), 0);
        assert_eq!(seen.connections.load(Relaxed), 12);
        assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us);
    }

    #[test]
    fn keeps_depth_commands_in_flight() {
        // The server answers only once `depth` commands are in: fewer in flight would stall,
        // more would arrive ahead of the replies.
        for (depth, threads) in [(4, 1), (7, 3)] {
            let (addr, seen) = server(Behaviour {
                hold: depth,
                ..PLAIN
            });
            let mut s = spec(addr, 5, depth, threads);
            s.dist = Dist::Uniform;
            let r = run(&s).unwrap();
            assert!(r.ops > 0);
            assert_eq!(r.ops, seen.commands.load(Relaxed));
            assert_eq!(r.ops % depth as u64, 0, "{r:?}");
            assert_eq!(seen.over_depth.load(Relaxed), 0);
            assert_eq!((r.wrong_values, r.errors), (0, 0));
        }
    }

    #[test]
    fn counts_wrong_values_and_errors() {
        let (addr, seen) = server(Behaviour {
            corrupt_every: 7,
            fail_every: 11,
            ..PLAIN
        });
        let mut s = spec(addr, 3, 5, 1);
        s.dist = Dist::Uniform;
        let r = run(&s).unwrap();
        assert!(r.wrong_values > 0 && r.errors > 0, "{r:?}");
        assert_eq!(r.wrong_values, seen.corrupted.load(Relaxed));
        assert_eq!(r.errors, seen.failed.load(Relaxed));
        assert_eq!(r.ops, r.gets + r.sets + r.errors);
    }

    #[test]
    fn routes_each_key_to_its_endpoint() {
        let owned = |owner| Behaviour {
            owner,
            owners: 2,
            ..PLAIN
        };
        let (a0, s0) = server(owned(0));
        let (a1, s1) = server(owned(1));
        let s = spec(a0, 4, 6, 2);
        let r = run_routed(&s, &[a0, a1], &|k, _| (index(k) % 2) as usize).unwrap();
        let (c0, c1) = (s0.commands.load(Relaxed), s1.commands.load(Relaxed));
        assert!(c0 > 0 && c1 > 0);
        assert_eq!(r.ops, c0 + c1);
        assert_eq!(r.ops % 6, 0);
        assert_eq!(s0.misrouted.load(Relaxed) + s1.misrouted.load(Relaxed), 0);
        assert_eq!(
            (s0.connections.load(Relaxed), s1.connections.load(Relaxed)),
            (4, 4)
        );
        assert_eq!((r.wrong_values, r.errors), (0, 0));
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(10_000, 0.99);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut top = 0;
        for _ in 0..100_000 {
            let r = z.sample(&mut rng);
            assert!(r < 10_000);
            if r < 100 {
                top += 1;
            }
        }
        // The top 1% of ranks take a large share of the draws (about half at 0.99).
        assert!(top > 30_000, "{top}");
        assert_eq!(key(42), *b"00000042");
        assert_eq!(value(42), *b"24000000");
    }
}
