//! The pagestore load client (§8.1): random reads and writes of `io_size` bytes at offsets
//! aligned to the I/O size, `batch` requests per message, `outstanding` messages in flight on
//! each of `connections` connections. A request's `req_id` is its send time (monotonic ns,
//! strictly increasing per connection), so a response's latency is `now - req_id`.
//!
//! Each connection runs on its own thread with a non-blocking socket and `poll(2)`, writing and
//! reading at the same time (never blocking on a write while responses wait). Responses must
//! arrive in request order with the request's op; a violation stops that connection and is
//! reported. With `verify`, the client first writes the [`dds_storage::pattern`] over every file;
//! then each connection reads and writes only its own slots (slot index modulo the connection
//! count), every write carries the pattern with its first 8 bytes replaced by a stamp naming
//! the write ([`stamped`]), and every read must return exactly what the last write the
//! connection issued before it left there ([`read_is_current`]): a server (or a DPU) that lets
//! a read overtake an earlier write of the connection is caught.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::pagestore::{
    parse_response_header, response_len, MessageBuilder, IO_BYTES_MAX, OP_READ, OP_WRITE,
    REQUESTS_PER_MSG_MAX, RESP_HEADER_BYTES,
};
use dds_storage::pattern;

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub connect: SocketAddr,
    pub files: Vec<u32>,
    pub file_size: u64,
    pub io_size: u32,
    /// Fraction of reads (1.0 = all reads).
    pub read_ratio: f64,
    /// Requests per message.
    pub batch: usize,
    /// Messages in flight per connection.
    pub outstanding: usize,
    pub connections: usize,
    /// Run for this long (after which in-flight requests drain) ...
    pub duration: Option<Duration>,
    /// ... or until this many requests (all connections together) completed.
    pub requests: Option<u64>,
    pub verify: bool,
    pub seed: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect: "127.0.0.1:7000".parse().expect("address"),
            files: vec![0],
            file_size: 64 << 20,
            io_size: 1024,
            read_ratio: 1.0,
            batch: 8,
            outstanding: 4,
            connections: 1,
            duration: Some(Duration::from_secs(5)),
            requests: None,
            verify: false,
            seed: 1,
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClientReport {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    /// Responses with a non-zero status.
    pub errors: u64,
    /// Responses out of request order, or not matching the request.
    pub order_violations: u64,
    /// Reads whose data differed from the pattern (`verify` only).
    pub verify_failures: u64,
    /// Connections that ended early (closed by the server or a protocol violation).
    pub failed_connections: u64,
    pub seconds: f64,
    pub requests_per_sec: f64,
    pub mb_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    pub io_size: u32,
    pub batch: usize,
    pub outstanding: usize,
    pub connections: usize,
    pub read_ratio: f64,
}

/// Monotonic clock in nanoseconds.
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn check(cfg: &ClientConfig) -> Result<()> {
    if cfg.files.is_empty() {
        bail!("no files given");
    }
    if cfg.io_size == 0 || cfg.io_size > IO_BYTES_MAX {
        bail!("I/O size must be 1..={IO_BYTES_MAX}");
    }
    if cfg.file_size < cfg.io_size as u64 {
        bail!("file size below the I/O size");
    }
    if cfg.batch == 0 || cfg.batch > REQUESTS_PER_MSG_MAX {
        bail!("batch must be 1..={REQUESTS_PER_MSG_MAX}");
    }
    if cfg.outstanding == 0 || cfg.connections == 0 {
        bail!("outstanding and connections must be at least 1");
    }
    if cfg.duration.is_none() && cfg.requests.is_none() {
        bail!("give a duration or a request count");
    }
    if cfg.verify && !cfg.io_size.is_multiple_of(8) {
        bail!("--verify needs an I/O size that is a multiple of 8");
    }
    Ok(())
}

/// Writes the pattern over every file (`chunk`-byte writes, one connection).
pub fn prefill(cfg: &ClientConfig, chunk: u32) -> Result<()> {
    let chunk = chunk.clamp(8, IO_BYTES_MAX) & !7;
    let mut s =
        TcpStream::connect(cfg.connect).with_context(|| format!("connect {}", cfg.connect))?;
    s.set_nodelay(true)?;
    let mut b = MessageBuilder::new();
    let mut data = vec![0u8; chunk as usize];
    let mut resp = vec![0u8; RESP_HEADER_BYTES];
    for &f in &cfg.files {
        let mut off = 0u64;
        while off < cfg.file_size {
            let n = ((cfg.file_size - off) as usize).min(chunk as usize);
            pattern::fill(f, off, &mut data[..n]);
            b.clear();
            b.write(f, off, &data[..n], off);
            s.write_all(b.finish())?;
            s.read_exact(&mut resp)?;
            let h = parse_response_header(&resp).context("prefill response")?;
            if h.status != 0 || h.req_id != off || h.len as usize != n {
                bail!(
                    "prefill write of file {f} at {off} failed: status {} ({} bytes)",
                    h.status,
                    h.len
                );
            }
            off += n as u64;
        }
    }
    Ok(())
}

/// Runs the workload and returns the merged report.
pub fn run(cfg: &ClientConfig) -> Result<ClientReport> {
    check(cfg)?;
    if cfg.verify {
        prefill(cfg, 256 << 10)?;
    }
    let start = Instant::now();
    let per_conn = cfg
        .requests
        .map(|r| r.div_ceil(cfg.connections as u64).max(1));
    let results: Vec<Result<ConnResult>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..cfg.connections)
            .map(|i| {
                scope.spawn(move || {
                    let deadline = cfg.duration.map(|d| start + d);
                    run_connection(cfg, i, deadline, per_conn)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut rep = ClientReport {
        io_size: cfg.io_size,
        batch: cfg.batch,
        outstanding: cfg.outstanding,
        connections: cfg.connections,
        read_ratio: cfg.read_ratio,
        seconds,
        ..ClientReport::default()
    };
    let mut first_err = None;
    for r in results {
        match r {
            Ok(c) => {
                rep.requests += c.requests;
                rep.reads += c.reads;
                rep.writes += c.writes;
                rep.errors += c.errors;
                rep.order_violations += c.order_violations;
                rep.verify_failures += c.verify_failures;
                rep.failed_connections += c.failed as u64;
                let _ = hist.add(&c.hist);
            }
            Err(e) => {
                rep.failed_connections += 1;
                first_err.get_or_insert(e);
            }
        }
    }
    if rep.requests == 0 {
        if let Some(e) = first_err {
            return Err(e);
        }
    } else if let Some(e) = first_err {
        tracing::warn!(error = %e, "a connection failed");
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    rep.requests_per_sec = rep.requests as f64 / seconds.max(1e-9);
    rep.mb_per_sec = rep.requests_per_sec * cfg.io_size as f64 / 1e6;
    if !hist.is_empty() {
        rep.p50_us = us(hist.value_at_quantile(0.50));
        rep.p99_us = us(hist.value_at_quantile(0.99));
        rep.p999_us = us(hist.value_at_quantile(0.999));
        rep.max_us = us(hist.max());
        rep.mean_us = hist.mean() / 1000.0;
    }
    Ok(rep)
}

struct ConnResult {
    requests: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    order_violations: u64,
    verify_failures: u64,
    failed: bool,
    hist: Histogram<u64>,
}

struct Expect {
    req_id: u64,
    op: u8,
    file: u32,
    offset: u64,
    /// With `verify`, for a read: the stamp of the last write this connection issued to the
    /// slot before the read (0: none, the file's base pattern).
    stamp: u64,
}

/// With `verify`, a write's bytes identify it: the file's pattern with the first 8 bytes
/// replaced by a stamp (connection index and the connection's write count, never 0).
pub fn stamped(file: u32, offset: u64, stamp: u64, out: &mut [u8]) {
    pattern::fill(file, offset, out);
    if stamp != 0 && out.len() >= 8 {
        out[..8].copy_from_slice(&stamp.to_le_bytes());
    }
}

/// Whether a read of `file` at `offset` returned what the last write before it (stamp, or 0
/// for none) left there. A read that missed that write (an older stamp, or the base pattern)
/// fails.
pub fn read_is_current(file: u32, offset: u64, stamp: u64, got: &[u8]) -> bool {
    if got.len() < 8 {
        return pattern::check(file, offset, got).is_none();
    }
    let head_ok = if stamp == 0 {
        pattern::check(file, offset, &got[..8]).is_none()
    } else {
        got[..8] == stamp.to_le_bytes()
    };
    head_ok && pattern::check(file, offset + 8, &got[8..]).is_none()
}

fn run_connection(
    cfg: &ClientConfig,
    index: usize,
    deadline: Option<Instant>,
    quota: Option<u64>,
) -> Result<ConnResult> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut s =
        TcpStream::connect(cfg.connect).with_context(|| format!("connect {}", cfg.connect))?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    let mut rng = SmallRng::seed_from_u64(
        cfg.seed
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(index as u64),
    );
    let slots = cfg.file_size / cfg.io_size as u64;
    let mut r = ConnResult {
        requests: 0,
        reads: 0,
        writes: 0,
        errors: 0,
        order_violations: 0,
        verify_failures: 0,
        failed: false,
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram"),
    };
    let mut builder = MessageBuilder::new();
    let mut data = vec![0u8; cfg.io_size as usize];
    let mut out: Vec<u8> = Vec::new();
    let mut out_sent = 0usize;
    let mut inbuf = vec![0u8; 256 << 10];
    let mut in_len = 0usize;
    let mut expect: VecDeque<Expect> = VecDeque::new();
    // Responses still due per message in flight.
    let mut msgs: VecDeque<usize> = VecDeque::new();
    let mut issued = 0u64;
    let mut last_id = 0u64;
    let mut stopped = false;
    // With `verify`, this connection reads and writes only its own slots (slot % connections
    // == index), so the last write it issued to a slot is what a later read must return.
    let mut last_stamp: std::collections::HashMap<(u32, u64), u64> = Default::default();
    let mut writes_issued = 0u64;
    let (part, parts) = (index as u64, cfg.connections.max(1) as u64);
    let drain_limit = Duration::from_secs(30);
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if !stopped {
            let time_up = deadline.is_some_and(|d| Instant::now() >= d);
            let quota_done = quota.is_some_and(|q| issued >= q);
            if time_up || quota_done {
                stopped = true;
                drain_deadline = Some(Instant::now() + drain_limit);
            }
        }
        // Keep `outstanding` messages in flight.
        while !stopped && msgs.len() < cfg.outstanding && out.len() - out_sent < (1 << 20) {
            builder.clear();
            let n = match quota {
                Some(q) => (q - issued).min(cfg.batch as u64) as usize,
                None => cfg.batch,
            };
            if n == 0 {
                break;
            }
            let now = now_ns().max(last_id + 1);
            for k in 0..n {
                let id = now + k as u64;
                let file = cfg.files[rng.gen_range(0..cfg.files.len())];
                let mut slot = rng.gen_range(0..slots);
                if cfg.verify && slots >= parts {
                    slot = slot - slot % parts + part;
                    if slot >= slots {
                        slot -= parts;
                    }
                }
                let offset = slot * cfg.io_size as u64;
                let read = cfg.read_ratio >= 1.0 || rng.gen_bool(cfg.read_ratio.clamp(0.0, 1.0));
                let mut stamp = 0;
                if read {
                    builder.read(file, offset, cfg.io_size, id);
                    if cfg.verify {
                        stamp = last_stamp.get(&(file, offset)).copied().unwrap_or(0);
                    }
                } else {
                    if cfg.verify {
                        writes_issued += 1;
                        let st = (part << 48) | writes_issued;
                        stamped(file, offset, st, &mut data);
                        last_stamp.insert((file, offset), st);
                    }
                    builder.write(file, offset, &data, id);
                }
                expect.push_back(Expect {
                    req_id: id,
                    op: if read { OP_READ } else { OP_WRITE },
                    file,
                    offset,
                    stamp,
                });
                last_id = id;
            }
            if out_sent == out.len() {
                out.clear();
                out_sent = 0;
            }
            out.extend_from_slice(builder.finish());
            msgs.push_back(n);
            issued += n as u64;
        }
        if stopped && msgs.is_empty() {
            break;
        }
        if drain_deadline.is_some_and(|d| Instant::now() >= d) {
            tracing::warn!(
                conn = index,
                left = expect.len(),
                "responses did not arrive in time"
            );
            r.failed = true;
            break;
        }
        let want_out = out_sent < out.len();
        let mut fds = [PollFd::new(
            &s,
            if want_out {
                PollFlags::IN | PollFlags::OUT
            } else {
                PollFlags::IN
            },
        )];
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        let _ = poll(&mut fds, Some(&timeout));
        let rev = fds[0].revents();
        if want_out && rev.intersects(PollFlags::OUT | PollFlags::ERR | PollFlags::HUP) {
            match s.write(&out[out_sent..]) {
                Ok(n) => out_sent += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => {
                    tracing::warn!(conn = index, error = %e, "send failed");
                    r.failed = true;
                    break;
                }
            }
        }
        if rev.intersects(PollFlags::IN | PollFlags::ERR | PollFlags::HUP) {
            if in_len == inbuf.len() {
                inbuf.resize(inbuf.len() * 2, 0);
            }
            match s.read(&mut inbuf[in_len..]) {
                Ok(0) => {
                    tracing::warn!(
                        conn = index,
                        left = expect.len(),
                        "server closed the connection"
                    );
                    r.failed = true;
                    break;
                }
                Ok(n) => in_len += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
                Err(e) => {
                    tracing::warn!(conn = index, error = %e, "receive failed");
                    r.failed = true;
                    break;
                }
            }
            // Parse complete responses.
            let mut at = 0usize;
            let now = now_ns();
            let mut broken = false;
            while let Ok(Some(len)) = response_len(&inbuf[at..in_len]) {
                if in_len - at < len {
                    if len > inbuf.len() {
                        inbuf.resize(len.next_power_of_two(), 0);
                    }
                    break;
                }
                let resp = &inbuf[at..at + len];
                let h = match parse_response_header(resp) {
                    Ok(h) => h,
                    Err(e) => {
                        tracing::warn!(conn = index, error = %e, "malformed response");
                        broken = true;
                        break;
                    }
                };
                let Some(e) = expect.pop_front() else {
                    r.order_violations += 1;
                    broken = true;
                    break;
                };
                if h.req_id != e.req_id || h.op != e.op {
                    tracing::warn!(
                        conn = index,
                        got = h.req_id,
                        want = e.req_id,
                        "response out of order"
                    );
                    r.order_violations += 1;
                    broken = true;
                    break;
                }
                r.requests += 1;
                if e.op == OP_READ {
                    r.reads += 1;
                } else {
                    r.writes += 1;
                }
                if h.status != 0 {
                    r.errors += 1;
                } else if cfg.verify && e.op == OP_READ {
                    let got = &resp[RESP_HEADER_BYTES..RESP_HEADER_BYTES + h.len as usize];
                    if h.len != cfg.io_size || !read_is_current(e.file, e.offset, e.stamp, got) {
                        if r.verify_failures < 5 {
                            tracing::warn!(
                                conn = index,
                                file = e.file,
                                offset = e.offset,
                                "read returned data that differs from what was written"
                            );
                        }
                        r.verify_failures += 1;
                    }
                }
                let _ = r.hist.record(now.saturating_sub(h.req_id).max(1));
                if let Some(m) = msgs.front_mut() {
                    *m -= 1;
                    if *m == 0 {
                        msgs.pop_front();
                    }
                }
                at += len;
            }
            if !broken && response_len(&inbuf[at..in_len]).is_err() {
                tracing::warn!(conn = index, "malformed response length");
                broken = true;
            }
            if broken {
                r.failed = true;
                break;
            }
            inbuf.copy_within(at..in_len, 0);
            in_len -= at;
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_missed_the_last_write_fails_verification() {
        let (file, offset) = (7, 8192);
        let mut base = vec![0u8; 512];
        pattern::fill(file, offset, &mut base);
        let (mut first, mut second) = (vec![0u8; 512], vec![0u8; 512]);
        stamped(file, offset, 1, &mut first);
        stamped(file, offset, 2, &mut second);
        // Never written: the base pattern is current.
        assert!(read_is_current(file, offset, 0, &base));
        assert!(!read_is_current(file, offset, 0, &first));
        // After write 2: only its bytes are current, not the older write or the base.
        assert!(read_is_current(file, offset, 2, &second));
        assert!(
            !read_is_current(file, offset, 2, &first),
            "stale read passed"
        );
        assert!(
            !read_is_current(file, offset, 2, &base),
            "stale read passed"
        );
        // Damage past the stamp is caught too.
        let mut torn = second.clone();
        torn[300] ^= 1;
        assert!(!read_is_current(file, offset, 2, &torn));
    }
}
