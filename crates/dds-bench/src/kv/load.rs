//! A YCSB-style closed-loop load generator speaking RESP: each connection is a thread that
//! keeps `depth` commands in flight, draws keys from a uniform or a zipfian distribution
//! (YCSB's generator, ranks scattered over the key space), and checks every GET's value.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
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

/// Reads one reply; returns (is error, bulk payload if any).
pub(crate) fn read_reply(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    at: &mut usize,
) -> Result<(bool, Vec<u8>)> {
    loop {
        if let Some(n) = dds_resp::frame_reply(&buf[*at..], 1 << 16, 64 << 20)
            .map_err(|e| anyhow::anyhow!("bad reply: {e}"))?
        {
            let r = &buf[*at..*at + n];
            let out = match r[0] {
                b'-' => (true, Vec::new()),
                b'$' => {
                    let nl = r.iter().position(|&b| b == b'\n').expect("framed");
                    if r[1] == b'-' {
                        (false, Vec::new())
                    } else {
                        (false, r[nl + 1..r.len() - 2].to_vec())
                    }
                }
                _ => (false, Vec::new()),
            };
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

/// Runs one load point over several endpoints: each connection thread holds a socket to
/// every endpoint, and `route(key, connection)` picks the endpoint of each command (a
/// cluster's shard, a front end); a batch of `depth` commands is sent to all endpoints before
/// any reply is read.
pub fn run_routed(
    spec: &LoadSpec,
    endpoints: &[SocketAddr],
    route: &(dyn Fn(&[u8; 8], usize) -> usize + Sync),
) -> Result<LoadResult> {
    let zipf = match spec.dist {
        Dist::Zipf(t) => Some(Zipf::new(spec.keys, t)),
        Dist::Uniform => None,
    };
    let n = endpoints.len();
    let deadline = Instant::now() + Duration::from_secs_f64(spec.seconds);
    let t0 = Instant::now();
    let results: Vec<Result<(LoadResult, Histogram<u64>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..spec.connections)
            .map(|c| {
                let zipf = zipf.as_ref();
                sc.spawn(move || -> Result<(LoadResult, Histogram<u64>)> {
                    let mut socks = endpoints
                        .iter()
                        .map(|a| {
                            let s = TcpStream::connect(a).context("connect")?;
                            s.set_nodelay(true)?;
                            Ok((s, Vec::new(), 0usize))
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let mut rng = SmallRng::seed_from_u64(spec.seed ^ (c as u64 * 7919));
                    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                    let mut r = LoadResult::default();
                    let mut outs: Vec<Vec<u8>> = vec![Vec::new(); n];
                    let mut sent: Vec<Vec<(u64, bool)>> = vec![Vec::with_capacity(spec.depth); n];
                    while Instant::now() < deadline {
                        for e in 0..n {
                            outs[e].clear();
                            sent[e].clear();
                        }
                        for _ in 0..spec.depth {
                            let k = match zipf {
                                Some(z) => scatter(z.sample(&mut rng), spec.keys),
                                None => rng.gen_range(0..spec.keys),
                            };
                            let kb = key(k);
                            let e = route(&kb, c);
                            let get = rng.gen::<f64>() < spec.read_fraction;
                            if get {
                                push_cmd(&mut outs[e], &[b"GET", &kb]);
                            } else {
                                push_cmd(&mut outs[e], &[b"SET", &kb, &value(k)]);
                            }
                            sent[e].push((k, get));
                        }
                        let t = Instant::now();
                        for (e, out) in outs.iter().enumerate() {
                            if !out.is_empty() {
                                socks[e].0.write_all(out)?;
                            }
                        }
                        for (e, (s, buf, at)) in socks.iter_mut().enumerate() {
                            for &(k, get) in &sent[e] {
                                let (err, v) = read_reply(s, buf, at)?;
                                r.ops += 1;
                                if err {
                                    r.errors += 1;
                                } else if get {
                                    r.gets += 1;
                                    if v != value(k) {
                                        r.wrong_values += 1;
                                    }
                                } else {
                                    r.sets += 1;
                                }
                            }
                        }
                        let us = t.elapsed().as_micros().max(1) as u64;
                        h.record_n(us, spec.depth as u64).ok();
                    }
                    Ok((r, h))
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

#[cfg(test)]
mod tests {
    use super::*;

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
