//! TCP echo (the network-path comparison of the paper's Fig. 18): a server that sends every
//! byte back on the same connection, and a client that measures messages per second and
//! round-trip latency. The client stamps each message's first 8 bytes with its send time.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_server::{Budget, Completions, Config, ConnId, Out, Service, Verdict};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::client::now_ns;

/// Open echo connections at most.
pub const MAX_CONNECTIONS: usize = 256;
/// Echoed bytes waiting for a client above which its connection is not read.
const OUTPUT_PAUSE: usize = 1 << 20;
/// Bytes all echo connections' buffers may hold together.
const MEMORY_BUDGET: usize = 512 << 20;

/// The echo protocol: every byte that arrives is a complete request, and its reply.
pub struct EchoService {
    connections: Arc<AtomicU64>,
}

impl Service for EchoService {
    type Session = ();

    fn open(&mut self, _id: ConnId) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    fn on_input(
        &mut self,
        _id: ConnId,
        _session: &mut (),
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        out.extend_from_slice(input);
        (input.len(), Verdict::Continue)
    }

    fn input_overflow(&mut self, _out: &mut Out<'_>) {}

    fn rejected(&self) -> &'static [u8] {
        b""
    }

    fn complete(&mut self, _done: &mut Completions<'_, ()>) {}
}

/// A running echo server: one event loop on the server runtime (`dds-server`).
pub struct EchoServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Connections accepted.
    pub connections: Arc<AtomicU64>,
}

impl EchoServer {
    pub fn start(listen: SocketAddr) -> Result<EchoServer> {
        let connections = Arc::new(AtomicU64::new(0));
        let service = EchoService {
            connections: connections.clone(),
        };
        let cfg = Config {
            max_connections: MAX_CONNECTIONS,
            output_pause: OUTPUT_PAUSE,
            drain: Duration::from_millis(500),
            ..Config::default()
        };
        let server = dds_server::Server::bind(listen, cfg, Budget::new(MEMORY_BUDGET), service)
            .with_context(|| format!("listen {listen}"))?;
        let addr = server.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("echo".into())
            .spawn(move || {
                server.run(&s2);
            })?;
        Ok(EchoServer {
            addr,
            stop,
            thread: Some(thread),
            connections,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// Echo client settings.
#[derive(Clone, Debug)]
pub struct EchoConfig {
    pub connect: SocketAddr,
    /// Bytes per message (at least 8).
    pub message_size: usize,
    /// Messages in flight per connection.
    pub outstanding: usize,
    pub connections: usize,
    pub duration: Duration,
}

/// What an echo run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EchoReport {
    pub messages: u64,
    pub seconds: f64,
    pub messages_per_sec: f64,
    pub mb_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub message_size: usize,
    pub outstanding: usize,
    pub connections: usize,
    /// Echoed bytes that differed from what was sent.
    pub corrupt: u64,
}

/// Runs the echo client.
pub fn run_client(cfg: &EchoConfig) -> Result<EchoReport> {
    if cfg.message_size < 8 || cfg.outstanding == 0 || cfg.connections == 0 {
        bail!("message size ≥ 8, outstanding ≥ 1 and connections ≥ 1");
    }
    let start = Instant::now();
    let deadline = start + cfg.duration;
    let results: Vec<Result<(u64, u64, Histogram<u64>)>> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..cfg.connections)
            .map(|_| scope.spawn(move || echo_connection_client(cfg, deadline)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("echo client panicked")))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let mut rep = EchoReport {
        seconds,
        message_size: cfg.message_size,
        outstanding: cfg.outstanding,
        connections: cfg.connections,
        ..EchoReport::default()
    };
    for r in results {
        let (n, corrupt, h) = r?;
        rep.messages += n;
        rep.corrupt += corrupt;
        let _ = hist.add(&h);
    }
    rep.messages_per_sec = rep.messages as f64 / seconds.max(1e-9);
    rep.mb_per_sec = rep.messages_per_sec * cfg.message_size as f64 / 1e6;
    if !hist.is_empty() {
        rep.p50_us = hist.value_at_quantile(0.5) as f64 / 1000.0;
        rep.p99_us = hist.value_at_quantile(0.99) as f64 / 1000.0;
        rep.mean_us = hist.mean() / 1000.0;
    }
    Ok(rep)
}

fn echo_connection_client(
    cfg: &EchoConfig,
    deadline: Instant,
) -> Result<(u64, u64, Histogram<u64>)> {
    let mut s =
        TcpStream::connect(cfg.connect).with_context(|| format!("connect {}", cfg.connect))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram");
    let size = cfg.message_size;
    let mut msg = vec![0u8; size];
    for (i, b) in msg.iter_mut().enumerate().skip(8) {
        *b = i as u8;
    }
    let mut back = vec![0u8; size];
    let (mut done, mut corrupt) = (0u64, 0u64);
    let mut inflight = 0usize;
    // The socket buffers hold `outstanding` messages, so writing them all before reading
    // cannot deadlock for the sizes used here.
    loop {
        let go = Instant::now() < deadline;
        while go && inflight < cfg.outstanding {
            msg[..8].copy_from_slice(&now_ns().to_le_bytes());
            s.write_all(&msg)?;
            inflight += 1;
        }
        if inflight == 0 {
            break;
        }
        s.read_exact(&mut back)?;
        inflight -= 1;
        let sent = u64::from_le_bytes(back[..8].try_into().expect("8 bytes"));
        let _ = hist.record(now_ns().saturating_sub(sent).max(1));
        if back[8..] != msg[8..] {
            corrupt += 1;
        }
        done += 1;
    }
    Ok((done, corrupt, hist))
}
