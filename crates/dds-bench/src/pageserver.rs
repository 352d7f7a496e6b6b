//! `dds bench pageserver`: the page server of §9.1 (Figs. 2 and 21), side by side in one run:
//!
//! - `no-offload`: `dds dpu` + `dds pageserver` on DDS files, clients on the host server;
//! - `offload`: `dds dpu --offload pageserver` with its director in front of the same server,
//!   page versions on storage answered by the DPU.
//!
//! Clients read random pages of the database (GetPage at the newest acknowledged LSN, with the
//! page's exact last-modified LSN as not-modified-since) while a log writer appends page
//! patches at a fixed rate, which the host replays. A read-replica workload then compares, in
//! each mode, readers at the newest LSN with readers lagging it by `--lag-ms` of log (read
//! replicas): their throughput, p99 and the fraction of their reads the DPU served, and the
//! storage the page server uses per retained page version. The buffer pool holds a tenth of the
//! database, so most page reads come from storage. Host CPU per read is the server process's CPU
//! minus what the replay alone costs at that log rate (measured first, with no readers). The DPU
//! is the `dds dpu` process with an emulated DMA engine, on a core of its own.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dds_pageserver::proto::{self, status, Record};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

mod readers;

use readers::{ReadResult, Readers};

use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::device::DeviceReads;
use crate::kv::{spawn_dpu, taskset, wait_port, DEVICE_FILE};
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, ratio, Report, Table, Target};

/// Settings of `dds bench pageserver`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct PageServerBenchArgs {
    /// Short run: a 32 MiB database, two load points of 2 s.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for the DPU's device file.
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Pages of 8 KiB in the database (default 16384 = 128 MiB; quick 4096).
    #[arg(long)]
    pub pages: Option<u64>,
    /// Log records appended per second while pages are read.
    #[arg(long, default_value_t = 2000)]
    pub log_rate: u64,
    /// Client connections, swept (default 1,4,16,64; quick 4,64: the largest matches the device
    /// baseline's 64 reads in flight).
    #[arg(long, value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// GetPages per message.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Threads of the readers (each drives its share of the connections from one event loop).
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Seconds per load point (default 5; quick 2).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Emulated PCIe DMA costs in the DPU (on or off).
    #[arg(long, default_value = "on")]
    pub dma_cost: String,
    /// CPUs of the `dds dpu` process (default: the last CPU).
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// Let the DPU share the host's cores.
    #[arg(long)]
    pub shared_cores: bool,
    /// How far the read-replica workload's lagging readers are behind the newest LSN, in
    /// milliseconds of log.
    #[arg(long, default_value_t = 1000)]
    pub lag_ms: u64,
    /// Client connections of the read-replica workload.
    #[arg(long, default_value_t = 16)]
    pub replica_connections: usize,
}

const PS: usize = 8192;

#[derive(Clone, Debug, Serialize)]
struct Point {
    mode: &'static str,
    connections: usize,
    reads_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Host CPU per read, the replay's share taken out.
    host_cpu_us_per_read: f64,
    /// Host CPU per read including the replay.
    host_cpu_us_per_read_gross: f64,
    dpu_cpu_us_per_read: f64,
    dpu_read_fraction: f64,
    log_records_per_sec: f64,
    retries: u64,
}

/// A point of the read-replica workload.
#[derive(Clone, Debug, Serialize)]
struct ReplicaPoint {
    mode: &'static str,
    /// `latest` (at the newest acknowledged LSN) or `lagging` (`lag_ms` behind it).
    readers: &'static str,
    connections: usize,
    reads_per_sec: f64,
    p99_us: f64,
    dpu_read_fraction: f64,
    retries: u64,
    /// Page versions the server retained after the run, and the bytes they use.
    retained_versions: u64,
    retained_bytes: u64,
}

/// LSNs of each page's last modifications kept for lagging readers.
const HIST: usize = 8;

/// Shared state of the log writer and the readers.
struct Log {
    /// Newest acknowledged LSN.
    acked: AtomicU64,
    /// Per page, the LSN of its last record sent (set before the record is appended).
    page_lsn: Vec<AtomicU64>,
    /// Per page, the LSNs of its last `HIST` records sent (record `k` in `k % HIST`), and how
    /// many it had.
    page_hist: Vec<[AtomicU64; HIST]>,
    page_count: Vec<AtomicU64>,
    next_lsn: AtomicU64,
    /// The acknowledged LSN of `lag` ago (the lagging readers' read point), kept by the writer.
    lagging: AtomicU64,
}

impl Log {
    fn new(pages: u64) -> Log {
        Log {
            acked: AtomicU64::new(0),
            page_lsn: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            page_hist: (0..pages)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            page_count: (0..pages).map(|_| AtomicU64::new(0)).collect(),
            next_lsn: AtomicU64::new(1),
            lagging: AtomicU64::new(0),
        }
    }

    /// A record of `page` at `lsn` is about to be sent (one writer at a time).
    fn modified(&self, page: u64, lsn: u64) {
        let p = page as usize;
        let k = self.page_count[p].fetch_add(1, Ordering::AcqRel) as usize;
        self.page_hist[p][k % HIST].store(lsn, Ordering::Release);
        self.page_lsn[p].store(lsn, Ordering::Release);
    }

    /// The LSN of `page`'s last record at or below `r` (its not-modified-since LSN as of `r`),
    /// if it is among the last `HIST`.
    fn last_mod_at(&self, page: u64, r: u64) -> Option<u64> {
        let p = page as usize;
        let hist = &self.page_hist[p];
        let lsns = hist.iter().map(|a| a.load(Ordering::Acquire));
        let n = self.page_count[p].load(Ordering::Acquire);
        let best = lsns.filter(|&l| l <= r && l > 0).max();
        // Fewer than HIST records: none older is missing.
        best.or((n < HIST as u64).then_some(0))
    }
}

fn call(s: &mut TcpStream, msg: &[u8], n: usize, buf: &mut Vec<u8>) -> Result<Vec<(u16, u64)>> {
    s.write_all(msg)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut h = [0u8; 4];
        s.read_exact(&mut h)?;
        let len = u32::from_le_bytes(h) as usize;
        if len < proto::RESP_HEADER {
            bail!("bad response length {len}");
        }
        buf.resize(len, 0);
        buf[..4].copy_from_slice(&h);
        s.read_exact(&mut buf[4..])?;
        let st = u16::from_le_bytes([buf[4], buf[5]]);
        let lsn = u64::from_le_bytes(buf[16..24].try_into().expect("8"));
        out.push((st, lsn));
    }
    Ok(out)
}

/// Appends one range of `n` records (random pages, 64-byte patches); returns when acked.
fn append_range(
    s: &mut TcpStream,
    log: &Log,
    pages: u64,
    n: usize,
    rng: &mut SmallRng,
) -> Result<()> {
    let start = log.next_lsn.load(Ordering::Relaxed);
    let data = [7u8; 64];
    let mut recs = Vec::with_capacity(n);
    let mut lsn = start;
    for _ in 0..n {
        let page = rng.gen_range(0..pages);
        log.modified(page, lsn);
        recs.push(Record {
            lsn,
            page,
            offset: rng.gen_range(0..1024),
            data: &data,
        });
        lsn += 1;
    }
    let mut m = Vec::new();
    proto::encode_append(&mut m, start, lsn, &recs);
    let r = call(s, &m, 1, &mut Vec::new())?;
    if r[0].0 != status::OK {
        bail!("AppendWal [{start}, {lsn}) answered status {}", r[0].0);
    }
    log.next_lsn.store(lsn, Ordering::Relaxed);
    log.acked.store(lsn - 1, Ordering::Release);
    Ok(())
}

/// Writes every page once (so every page has a version on storage).
fn load(addr: SocketAddr, log: &Log, pages: u64) -> Result<()> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let data = [1u8; 16];
    let mut p = 0;
    while p < pages {
        let start = log.next_lsn.load(Ordering::Relaxed);
        let end_page = (p + 500).min(pages);
        let recs: Vec<Record<'_>> = (p..end_page)
            .map(|pg| {
                let lsn = start + (pg - p);
                log.modified(pg, lsn);
                Record {
                    lsn,
                    page: pg,
                    offset: 0,
                    data: &data,
                }
            })
            .collect();
        let end = start + recs.len() as u64;
        let mut m = Vec::new();
        proto::encode_append(&mut m, start, end, &recs);
        if call(&mut s, &m, 1, &mut Vec::new())?[0].0 != status::OK {
            bail!("loading the pages failed");
        }
        log.next_lsn.store(end, Ordering::Relaxed);
        log.acked.store(end - 1, Ordering::Release);
        p = end_page;
    }
    // Wait until the replay applied it all.
    let mut w = Vec::new();
    proto::encode_watermark(&mut w, 1);
    let t0 = Instant::now();
    loop {
        let r = call(&mut s, &w, 1, &mut Vec::new())?;
        // Applied, and every page's image written (the server materializes the pages the log
        // changed in the background): one image and one log record a page.
        if r[0].1 >= log.acked.load(Ordering::Acquire) && retained(addr)?.0 >= 2 * pages {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(300) {
            bail!("the replay did not catch up with the load");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fields drop in order: the server stops before the DPU it uses.
struct Side {
    server: ChildGuard,
    dpu: ChildGuard,
    socket: PathBuf,
    addr: SocketAddr,
    host: SocketAddr,
    /// Holds the DPU's device file ([`DEVICE_FILE`]).
    dir: tempfile::TempDir,
}

fn start(offload: bool, a: &PageServerBenchArgs, pages: u64, place: &Placement) -> Result<Side> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let dir = match &a.work {
        Some(w) => tempfile::tempdir_in(w)?,
        None => tempfile::tempdir()?,
    };
    // Four image slots a page, each with its cache entry, at a low load of the table.
    let mut extra: Vec<String> = vec!["--cache-items".into(), (16 * pages).to_string()];
    if offload {
        // The director binds a port of its own; `dds pageserver` tells it where it listens.
        extra.extend([
            "--offload".into(),
            "pageserver".into(),
            "--director-listen".into(),
            "127.0.0.1:0".into(),
        ]);
    }
    // The page file holds four image slots a page, next to a log of 256 MiB.
    let size = if pages * 4 * PS as u64 + (256 << 20) > (900 << 20) {
        "2G"
    } else {
        "1G"
    };
    let (dpu, socket, director) = spawn_dpu(&exe, dir.path(), size, &a.dma_cost, &extra, place)?;
    let mut child = taskset(&exe, place.host_cpus.as_deref())
        .args(["pageserver", "--listen", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&socket)
        .args(["--pages", &pages.to_string()])
        .args(["--buffer-pool", &(pages / 10).max(16).to_string()])
        .args(["--wal-size", "256M"])
        .stdout(Stdio::piped())
        .spawn()
        .context("start dds pageserver")?;
    let out = child.stdout.take().context("stdout")?;
    let server = ChildGuard::new(child, "dds pageserver");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.contains("ready") {
        bail!("dds pageserver did not start: {line}");
    }
    let host = crate::kv::listening_on(&line)?;
    let addr = match director {
        Some(d) if offload => d,
        _ => host,
    };
    wait_port(addr)?;
    Ok(Side {
        server,
        dpu,
        socket,
        addr,
        host,
        dir,
    })
}

fn dpu_reads(socket: &std::path::Path) -> u64 {
    let Ok(dds) = dds_host::Dds::connect(socket) else {
        return 0;
    };
    dds.stats()
        .ok()
        .and_then(|st| st.offload)
        .and_then(|o| o["directors"].as_array().cloned())
        .map(|d| d.iter().filter_map(|x| x["offloaded"].as_u64()).sum())
        .unwrap_or(0)
}

/// Runs the log writer at `rate` records/s until `stop`, keeping the acknowledged LSN of
/// `lag` ago in `log.lagging`.
fn log_writer(
    addr: SocketAddr,
    log: &Log,
    pages: u64,
    rate: u64,
    lag: Duration,
    stop: &AtomicBool,
) -> Result<u64> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut rng = SmallRng::seed_from_u64(3);
    let per = 50usize;
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut samples: VecDeque<(Instant, u64)> = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent + per as u64 > due {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        append_range(&mut s, log, pages, per, &mut rng)?;
        sent += per as u64;
        samples.push_back((Instant::now(), log.acked.load(Ordering::Acquire)));
        while samples.len() > 1 && samples[1].0.elapsed() >= lag {
            samples.pop_front();
        }
        if let Some(&(at, lsn)) = samples.front() {
            if at.elapsed() >= lag {
                log.lagging.store(lsn, Ordering::Release);
            }
        }
    }
    Ok(sent)
}

/// Closed-loop readers for `secs`, at the newest acknowledged LSN or (`lagging`) at
/// `log.lagging`; returns (reads, retries, histogram).
/// Runs the benchmark.
pub fn run(a: PageServerBenchArgs, command: String) -> Result<Report> {
    let pages = a.pages.unwrap_or(if a.quick { 4096 } else { 16384 });
    let secs = a.seconds.unwrap_or(if a.quick { 2.0 } else { 5.0 });
    let conns = if a.connections.is_empty() {
        if a.quick {
            vec![4, 64]
        } else {
            vec![1, 4, 16, 64]
        }
    } else {
        a.connections.clone()
    };
    let machine = Machine::detect();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let place = Placement::plan(nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let _pin = place.pin_host()?;
    let mut points = Vec::new();
    let mut replicas = Vec::new();
    let lag = Duration::from_millis(a.lag_ms);
    let mut device = None;
    for (offload, mode) in [(false, "no-offload"), (true, "offload")] {
        eprintln!("dds bench pageserver: {mode} ...");
        let side = start(offload, &a, pages, &place)?;
        let log = Log::new(pages);
        load(side.host, &log, pages)?;
        // One load point of `c` readers (`lagging`: read replicas behind the newest LSN).
        let read = |c: usize, lagging: bool| {
            Readers {
                addr: side.addr,
                log: &log,
                pages,
                conns: c,
                batch: a.batch.max(1),
                secs,
                lagging,
                threads: a.client_threads,
            }
            .run()
        };
        // The replay's own CPU at this log rate, with no readers.
        let stop = AtomicBool::new(false);
        let replay_cpu_per_sec = std::thread::scope(|sc| -> Result<f64> {
            let w = sc.spawn(|| log_writer(side.host, &log, pages, a.log_rate, lag, &stop));
            std::thread::sleep(Duration::from_millis(300));
            let c0 = process_cpu_seconds(side.server.pid())?;
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(secs.min(2.0)));
            let c = process_cpu_seconds(side.server.pid())? - c0;
            let rate = c / t0.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            w.join().expect("log writer")?;
            Ok(rate)
        })?;
        for &c in &conns {
            let stop = AtomicBool::new(false);
            let (r, logged, cpu, dcpu, dreads, t) = std::thread::scope(|sc| -> Result<_> {
                let w = sc.spawn(|| log_writer(side.host, &log, pages, a.log_rate, lag, &stop));
                let (h0, d0, r0) = (
                    process_cpu_seconds(side.server.pid())?,
                    process_cpu_seconds(side.dpu.pid())?,
                    dpu_reads(&side.socket),
                );
                let t0 = Instant::now();
                let r = read(c, false)?;
                let t = t0.elapsed().as_secs_f64();
                let (h1, d1, r1) = (
                    process_cpu_seconds(side.server.pid())?,
                    process_cpu_seconds(side.dpu.pid())?,
                    dpu_reads(&side.socket),
                );
                stop.store(true, Ordering::Relaxed);
                let logged = w.join().expect("log writer")?;
                Ok((r, logged, h1 - h0, d1 - d0, r1 - r0, t))
            })?;
            let ReadResult {
                reads,
                retries,
                hist,
            } = r;
            let n = reads.max(1) as f64;
            let p = Point {
                mode,
                connections: c,
                reads_per_sec: reads as f64 / t,
                p50_us: hist.value_at_quantile(0.5) as f64,
                p99_us: hist.value_at_quantile(0.99) as f64,
                host_cpu_us_per_read: ((cpu - replay_cpu_per_sec * t).max(0.0)) * 1e6 / n,
                host_cpu_us_per_read_gross: cpu * 1e6 / n,
                dpu_cpu_us_per_read: dcpu * 1e6 / n,
                dpu_read_fraction: dreads as f64 / n,
                log_records_per_sec: logged as f64 / t,
                retries,
            };
            eprintln!(
                "  {c:>3} conns: {:>8.0} reads/s  p99 {:>7.0} µs  host {:>6.2} µs/read  dpu {:>6.2} µs/read  on DPU {:.2}",
                p.reads_per_sec, p.p99_us, p.host_cpu_us_per_read, p.dpu_cpu_us_per_read, p.dpu_read_fraction
            );
            points.push(p);
        }
        // The read-replica workload: readers at the newest LSN, then readers lagging it.
        for lagging in [false, true] {
            let stop = AtomicBool::new(false);
            let c = a.replica_connections.max(1);
            let (r, dreads, t) = std::thread::scope(|sc| -> Result<_> {
                let w = sc.spawn(|| log_writer(side.host, &log, pages, a.log_rate, lag, &stop));
                // The lagging read point needs `lag` of log first.
                std::thread::sleep(lag + Duration::from_millis(300));
                let r0 = dpu_reads(&side.socket);
                let t0 = Instant::now();
                let r = read(c, lagging);
                let t = t0.elapsed().as_secs_f64();
                let r1 = dpu_reads(&side.socket);
                stop.store(true, Ordering::Relaxed);
                w.join().expect("log writer")?;
                Ok((r?, r1 - r0, t))
            })?;
            let ReadResult {
                reads,
                retries,
                hist,
            } = r;
            let (versions, bytes) = retained(side.host)?;
            let p = ReplicaPoint {
                mode,
                readers: if lagging { "lagging" } else { "latest" },
                connections: c,
                reads_per_sec: reads as f64 / t,
                p99_us: hist.value_at_quantile(0.99) as f64,
                dpu_read_fraction: dreads as f64 / reads.max(1) as f64,
                retries,
                retained_versions: versions,
                retained_bytes: bytes,
            };
            eprintln!(
                "  replica {:>7} {c:>3} conns: {:>8.0} reads/s  p99 {:>7.0} µs  on DPU {:.2}  {} versions retained, {} bytes each",
                p.readers,
                p.reads_per_sec,
                p.p99_us,
                p.dpu_read_fraction,
                versions,
                bytes / versions.max(1)
            );
            replicas.push(p);
        }
        let mut side = side;
        let _ = side.server.stop(Duration::from_secs(10));
        let _ = side.dpu.stop(Duration::from_secs(5));
        if !offload {
            // The device file the service just ran on, alone (the DPU has stopped).
            let dev = side.dir.path().join(DEVICE_FILE);
            device = crate::device::measure_or_warn(&dev, PS as u32, secs);
        }
    }
    Ok(report(
        &a,
        pages,
        command,
        machine,
        &place,
        (points, replicas),
        device.as_ref(),
    ))
}

/// The page versions the server retains and the bytes they use (its Watermark).
fn retained(addr: SocketAddr) -> Result<(u64, u64)> {
    let w = proto::Watermark::query(addr).context("Watermark")?;
    Ok((w.versions, w.bytes))
}

fn report(
    a: &PageServerBenchArgs,
    pages: u64,
    command: String,
    machine: Machine,
    place: &Placement,
    (points, replicas): (Vec<Point>, Vec<ReplicaPoint>),
    device: Option<&DeviceReads>,
) -> Report {
    let replica = |m: &str, r: &str| replicas.iter().find(|p| p.mode == m && p.readers == r);
    let lag_ratio = |m: &str| match (replica(m, "lagging"), replica(m, "latest")) {
        (Some(l), Some(n)) => ratio(l.reads_per_sec, n.reads_per_sec),
        _ => f64::NAN,
    };
    let lagging_dpu = replica("offload", "lagging").map_or(f64::NAN, |p| p.dpu_read_fraction);
    let lagging_over_latest = lag_ratio("offload");
    let bytes_per_version = replicas.last().map_or(f64::NAN, |p| {
        p.retained_bytes as f64 / p.retained_versions.max(1) as f64
    });
    fn of<'a>(points: &'a [Point], m: &'a str) -> impl Iterator<Item = &'a Point> + 'a {
        points.iter().filter(move |p| p.mode == m)
    }
    let of = |m: &'static str| of(&points, m);
    let peak = |m: &'static str| of(m).map(|p| p.reads_per_sec).fold(0.0, f64::max);
    let no_peak_point = of("no-offload").max_by(|x, y| x.reads_per_sec.total_cmp(&y.reads_per_sec));
    let p99_ratio = no_peak_point
        .and_then(|np| {
            of("offload")
                .find(|p| p.connections == np.connections)
                .map(|o| ratio(o.p99_us, np.p99_us))
        })
        .unwrap_or(f64::NAN);
    let cmax = points.iter().map(|p| p.connections).max().unwrap_or(1);
    let at_max = |m: &'static str| of(m).find(|p| p.connections == cmax);
    let cpu_ratio = match (at_max("offload"), at_max("no-offload")) {
        (Some(o), Some(n)) => ratio(o.host_cpu_us_per_read, n.host_cpu_us_per_read),
        _ => f64::NAN,
    };
    let peak_ratio = ratio(peak("offload"), peak("no-offload"));
    // The DPU's CPU per offloaded read against the host server's per read without offload,
    // at the most connections (each side's µs beside the ratio).
    let (dpu_us, host_us) = (
        at_max("offload").map(|o| o.dpu_cpu_us_per_read),
        at_max("no-offload").map(|n| n.host_cpu_us_per_read),
    );
    let dpu_cpu_ratio = match (dpu_us, host_us) {
        (Some(d), Some(h)) => ratio(d, h),
        _ => f64::NAN,
    };
    // Every mode's peak reads/s as a fraction of the device's own random 8 KiB reads.
    let throughput: Vec<(&str, Option<f64>)> = ["no-offload", "offload"]
        .into_iter()
        .map(|m| (m, of(m).next().map(|_| peak(m))))
        .collect();
    let fractions = crate::device::fractions(device, &throughput, "peak_over_device_read_iops_8k");
    let targets = vec![
        Target::at_most("offload_host_cpu_per_read_over_no_offload", cpu_ratio, 0.02),
        Target::at_most("offload_p99_over_no_offload_p99", p99_ratio, 0.5),
        Target::at_least("offload_peak_over_no_offload_peak", peak_ratio, 1.5),
        Target::at_least(
            "no_offload_peak_over_device_read_iops_8k",
            fractions[0].1,
            0.5,
        ),
        Target::at_least("offload_peak_over_device_read_iops_8k", fractions[1].1, 0.7),
        Target::at_most(
            "offload_dpu_cpu_per_read_over_no_offload_host_cpu",
            dpu_cpu_ratio,
            0.5,
        ),
        Target::at_least("lagging_read_dpu_fraction", lagging_dpu, 0.9),
        Target::at_least(
            "lagging_over_latest_read_throughput",
            lagging_over_latest,
            0.8,
        ),
    ];
    let mut summary = json!({
        "offload_host_cpu_per_read_over_no_offload": cpu_ratio,
        "offload_p99_over_no_offload_p99": p99_ratio,
        "offload_peak_over_no_offload_peak": peak_ratio,
        "no_offload_peak_reads_per_sec": peak("no-offload"),
        "offload_peak_reads_per_sec": peak("offload"),
        "offload_dpu_cpu_per_read_over_no_offload_host_cpu": dpu_cpu_ratio,
        "offload_dpu_cpu_us_per_read": dpu_us,
        "no_offload_host_cpu_us_per_read": host_us,
        "device_read_iops_8k": device.map(|d| d.iops),
        "device_read_queue_depth": device.map(|d| d.threads * d.depth),
        "device_read_data_bytes": device.map(|d| d.data_bytes),
        "lagging_read_dpu_fraction": lagging_dpu,
        "lagging_over_latest_read_throughput": lagging_over_latest,
        "no_offload_lagging_over_latest_read_throughput": lag_ratio("no-offload"),
        "lag_ms": a.lag_ms,
        "bytes_per_retained_version": bytes_per_version,
        "targets": targets,
    });
    for (k, r) in &fractions {
        summary[k.as_str()] = json!(r);
    }
    let t2 = crate::device::fraction_table(device, &throughput, "Peak page reads/s");
    let mut t3 = Table::new(
        format!(
            "Read replicas: readers at the newest LSN and {} ms behind it, log at {} records/s",
            a.lag_ms, a.log_rate
        ),
        &[
            "mode",
            "readers",
            "conns",
            "reads/s",
            "p99 µs",
            "on DPU",
            "versions retained",
            "bytes/version",
        ],
    );
    for p in &replicas {
        t3.row(vec![
            p.mode.into(),
            p.readers.into(),
            p.connections.to_string(),
            fmt_num(p.reads_per_sec),
            fmt_num(p.p99_us),
            format!("{:.0}%", 100.0 * p.dpu_read_fraction),
            p.retained_versions.to_string(),
            fmt_num(p.retained_bytes as f64 / p.retained_versions.max(1) as f64),
        ]);
    }
    let mut t = Table::new(
        format!(
            "GetPage over {pages} pages of 8 KiB (buffer pool 10%), log applied at {} records/s",
            a.log_rate
        ),
        &[
            "mode",
            "conns",
            "reads/s",
            "p50 µs",
            "p99 µs",
            "host µs/read",
            "DPU µs/read",
            "on DPU",
        ],
    );
    for p in &points {
        t.row(vec![
            p.mode.into(),
            p.connections.to_string(),
            fmt_num(p.reads_per_sec),
            fmt_num(p.p50_us),
            fmt_num(p.p99_us),
            fmt_num(p.host_cpu_us_per_read),
            fmt_num(p.dpu_cpu_us_per_read),
            format!("{:.0}%", 100.0 * p.dpu_read_fraction),
        ]);
    }
    let note = format!(
        "{} CPUs; DPU emulated: the dds dpu process on its own core",
        machine.nproc
    );
    let series = |f: &dyn Fn(&Point) -> (f64, f64)| -> Vec<Series> {
        ["no-offload", "offload"]
            .iter()
            .map(|m| Series {
                name: (*m).into(),
                points: of(m).map(f).collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let lat = series(&|p| (p.reads_per_sec, p.p99_us));
    let cpu = series(&|p| (p.connections as f64, p.host_cpu_us_per_read));
    let charts = vec![
        LineChart {
            file: "pageserver_latency.png".into(),
            title: "GetPage: p99 latency vs throughput (Fig. 21)".into(),
            note: note.clone(),
            x_label: "page reads/s".into(),
            y_label: "p99 µs".into(),
            log_y: crate::plot::spans_decades(
                lat.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
            ),
            series: lat,
        },
        LineChart {
            file: "pageserver_host_cpu.png".into(),
            title: "Host CPU per page read (replay excluded)".into(),
            note,
            x_label: "client connections".into(),
            y_label: "host CPU µs per read".into(),
            log_y: false,
            series: cpu,
        },
    ];
    Report {
        benchmark: "pageserver".into(),
        command,
        dpu_emulation: format!(
            "emulated: `dds dpu` runs as a separate process on its own core and reaches host \
             memory only through the emulated DMA engine; DMA cost model {}",
            cost_model_text(a.dma_cost != "off")
        ),
        machine,
        config: json!({"args": a, "placement": place, "pages": pages, "page_size": PS}),
        summary,
        points: Value::Array(
            points
                .iter()
                .map(|p| json!(p))
                .chain(replicas.iter().map(|p| json!(p)))
                .collect(),
        ),
        tables: vec![t, t2, t3],
        charts,
        panels: Vec::new(),
    }
}
