//! `dds bench kv`: the key-value service of §9.2 (Fig. 22), side by side in one run:
//!
//! - `no-offload`: `dds dpu` (no offload engine) + `dds kv` on DDS files, clients on the host;
//! - `offload`: `dds dpu --offload redis` with its traffic director in front of `dds kv`: GETs
//!   of records on storage are answered by the DPU;
//! - `redis`: `redis-server` holding everything in memory (its CPU is host CPU);
//! - `inmemory`: `dds kv` with a memory budget larger than the data (redis-benchmark -P 16).
//!
//! YCSB-style workloads (8-byte keys and values, uniform reads, zipf 0.99 reads, a 50/50
//! read-update mix) from a closed-loop load generator in this process, plus `redis-benchmark
//! GET` runs for the comparison with Redis. The memory budget of `dds kv` is 10% of the data, so
//! most records live on storage. The DPU runs on a core of its own in every mode; the host
//! side (servers, load generator, redis-benchmark) on the others. There is no DPU hardware:
//! the DPU is the `dds dpu` process with an emulated DMA engine.

mod colls;
pub mod load;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::device::DeviceReads;
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, ratio, Report, Table, Target};
use load::{Dist, LoadSpec};

/// Settings of `dds bench kv`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct KvArgs {
    /// Short run (about two minutes): fewer keys, points and seconds.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory for the DPU's device file (default: the system's temporary dir).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Records of the YCSB data set (default 1M; quick 100K).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Seconds per load point (default 5; quick 2).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Client connections, swept (default 1,4,16,64; quick 4,64: the largest matches the device
    /// baseline's 64 reads in flight).
    #[arg(long, value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// Commands in flight per connection.
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Threads of the load generator (each drives its share of the connections from one event
    /// loop).
    #[arg(long, default_value_t = 1)]
    pub load_threads: usize,
    /// redis-benchmark requests per run (default 200K; quick 50K).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Emulated PCIe DMA costs in the DPU (on or off).
    #[arg(long, default_value = "on")]
    pub dma_cost: String,
    /// CPUs of the `dds dpu` process (default: the last CPU).
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// Let the DPU share the host's cores.
    #[arg(long)]
    pub shared_cores: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
enum Mode {
    NoOffload,
    Offload,
    Redis,
    Inmemory,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::NoOffload => "no-offload",
            Mode::Offload => "offload",
            Mode::Redis => "redis",
            Mode::Inmemory => "inmemory",
        }
    }
}

struct Plan {
    keys: u64,
    rb_keys: u64,
    seconds: f64,
    connections: Vec<usize>,
    depth: usize,
    requests: u64,
    page: u64,
    memory: u64,
    log_size: u64,
    device: &'static str,
}

/// Bytes a record of an 8-byte key and value takes in the log (header 32).
const RECORD: u64 = 48;
/// ... and of a redis-benchmark key (`key:` + 12 digits) with an 8-byte value.
const RB_RECORD: u64 = 56;

fn plan(a: &KvArgs) -> Plan {
    let keys = a.keys.unwrap_or(if a.quick { 100_000 } else { 1_000_000 });
    let rb_keys = keys / 2;
    let data = keys * RECORD + rb_keys * RB_RECORD;
    let page: u64 = if data < (64 << 20) {
        64 << 10
    } else {
        256 << 10
    };
    // 10% of the data in memory (at least 3 pages).
    let memory = (data / 10).next_multiple_of(page).max(3 * page);
    let log_size = (data * 4).next_multiple_of(page).max(16 << 20);
    Plan {
        keys,
        rb_keys,
        seconds: a.seconds.unwrap_or(if a.quick { 2.0 } else { 5.0 }),
        connections: if a.connections.is_empty() {
            if a.quick {
                vec![4, 64]
            } else {
                vec![1, 4, 16, 64]
            }
        } else {
            a.connections.clone()
        },
        depth: a.depth.max(1),
        requests: a.requests.unwrap_or(if a.quick { 50_000 } else { 200_000 }),
        page,
        memory,
        log_size,
        device: if log_size > (200 << 20) { "2G" } else { "512M" },
    }
}

/// A free port, for `redis-server` only: it cannot bind port 0 and say which port it got (our
/// own daemons bind port 0 and print their address on their ready line).
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(crate) fn taskset(exe: &Path, cpus: Option<&[usize]>) -> Command {
    match cpus {
        Some(list) => {
            let mut c = Command::new("taskset");
            let l: Vec<String> = list.iter().map(usize::to_string).collect();
            c.arg("-c").arg(l.join(",")).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// One server side: the processes of a mode, and where clients connect.
struct Side {
    dpu: Option<ChildGuard>,
    server: ChildGuard,
    socket: Option<PathBuf>,
    addr: SocketAddr,
    /// Holds the DPU's device file ([`DEVICE_FILE`]).
    dir: tempfile::TempDir,
}

/// The device file [`spawn_dpu`] formats in its directory.
pub(crate) const DEVICE_FILE: &str = "dev.img";

/// The device reads of a GET of a record on storage: `dds kv` (and the DPU's offload app)
/// read the whole 4 KiB block a small record starts in.
const KV_IO_BYTES: u32 = 4096;

/// `redis-server` on a free loopback port (no persistence, `dir` as its directory), on
/// `cpus`, once it accepts connections.
pub(crate) fn start_redis(cpus: Option<&[usize]>, dir: &Path) -> Result<(ChildGuard, SocketAddr)> {
    let port = free_port()?;
    let child = taskset(Path::new("redis-server"), cpus)
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .context("start redis-server (package redis-server)")?;
    let server = ChildGuard::new(child, "redis-server");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    wait_port(addr)?;
    Ok((server, addr))
}

pub(crate) fn wait_port(addr: SocketAddr) -> Result<()> {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("nothing listens on {addr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Formats a device in `dir` and starts `dds dpu` on it (pinned as `place` says, with
/// `extra` arguments); returns it once it is ready, with its socket and the address its
/// traffic director got (with `--director-listen`).
pub(crate) fn spawn_dpu(
    exe: &Path,
    dir: &Path,
    device_size: &str,
    dma_cost: &str,
    extra: &[String],
    place: &Placement,
) -> Result<(ChildGuard, PathBuf, Option<SocketAddr>)> {
    let device = dir.join(DEVICE_FILE);
    let st = Command::new(exe)
        .args(["format", "--size", device_size, "--device"])
        .arg(&device)
        .stdout(Stdio::null())
        .status()?;
    if !st.success() {
        bail!("dds format failed");
    }
    let socket = dir.join("dpu.sock");
    let mut dargs: Vec<String> = vec![
        "dpu".into(),
        "--json".into(),
        "--device".into(),
        device.display().to_string(),
        "--socket".into(),
        socket.display().to_string(),
        "--dma-cost".into(),
        dma_cost.into(),
    ];
    dargs.extend(place.dpu_args());
    dargs.extend(extra.iter().cloned());
    let log = std::fs::File::create(dir.join("dpu.log"))?;
    let child = Command::new(exe)
        .args(&dargs)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("start dds dpu")?;
    let mut dpu = ChildGuard::new(child, "dds dpu");
    let line = dpu
        .ready_line(Duration::from_secs(20))
        .with_context(|| format!("see {}", dir.join("dpu.log").display()))?;
    let ready: serde_json::Value =
        serde_json::from_str(&line).with_context(|| format!("dds dpu's ready line {line:?}"))?;
    let director = ready["director"].as_str().map(str::parse).transpose()?;
    Ok((dpu, socket, director))
}

/// The address on a host server's ready line (`... listening on ADDR ...`).
pub(crate) fn listening_on(line: &str) -> Result<SocketAddr> {
    line.split("listening on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("no address on the ready line {line:?}"))
}

fn start_side(mode: Mode, a: &KvArgs, p: &Plan, place: &Placement) -> Result<Side> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let dir = match &a.work {
        Some(w) => tempfile::tempdir_in(w)?,
        None => tempfile::tempdir()?,
    };
    let host = place.host_cpus.as_deref();
    if mode == Mode::Redis {
        let (server, addr) = start_redis(host, dir.path())?;
        return Ok(Side {
            dpu: None,
            server,
            socket: None,
            addr,
            dir,
        });
    }
    // Room for every key's record and the large hash's fields, twice over.
    let mut extra: Vec<String> = vec![
        "--cache-items".into(),
        (2 * (2 * p.keys + p.rb_keys)).to_string(),
    ];
    if mode == Mode::Offload {
        // The director binds a port of its own; `dds kv` tells it where it listens.
        extra.extend([
            "--offload".into(),
            "redis".into(),
            "--director-listen".into(),
            "127.0.0.1:0".into(),
        ]);
    }
    let (dpu, socket, director) =
        spawn_dpu(&exe, dir.path(), p.device, &a.dma_cost, &extra, place)?;
    let memory = if mode == Mode::Inmemory {
        (p.log_size / 2).max(4 * p.memory)
    } else {
        p.memory
    };
    let mut child = taskset(&exe, host)
        .args(["kv", "--listen", "127.0.0.1:0"])
        .arg("--socket")
        .arg(&socket)
        .args(["--memory", &memory.to_string()])
        .args(["--page-size", &p.page.to_string()])
        .args(["--log-size", &p.log_size.to_string()])
        .args(["--durability", "periodic"])
        .stdout(Stdio::piped())
        .spawn()
        .context("start dds kv")?;
    let out = child.stdout.take().context("stdout")?;
    let server = ChildGuard::new(child, "dds kv");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.contains("ready") {
        bail!("dds kv did not start: {line}");
    }
    let host_addr = listening_on(&line)?;
    let addr = match director {
        Some(d) if mode == Mode::Offload => d,
        _ => host_addr,
    };
    wait_port(addr)?;
    Ok(Side {
        dpu: Some(dpu),
        server,
        socket: Some(socket),
        addr,
        dir,
    })
}

/// GETs the DPU answered so far (0 without a director).
fn dpu_gets(socket: Option<&Path>) -> u64 {
    let Some(s) = socket else {
        return 0;
    };
    let Ok(dds) = dds_host::Dds::connect(s) else {
        return 0;
    };
    let Ok(st) = dds.stats() else {
        return 0;
    };
    st.offload
        .as_ref()
        .and_then(|o| o["directors"].as_array().cloned())
        .map(|d| d.iter().filter_map(|x| x["offloaded"].as_u64()).sum())
        .unwrap_or(0)
}

#[derive(Clone, Debug, Serialize)]
struct Point {
    mode: &'static str,
    workload: &'static str,
    connections: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    host_cpu_us_per_op: f64,
    dpu_cpu_us_per_op: f64,
    /// GETs answered by the DPU, over all GETs.
    dpu_get_fraction: f64,
    wrong_values: u64,
    errors: u64,
}

struct Snap {
    host: f64,
    dpu: f64,
    dpu_gets: u64,
}

fn snap(side: &Side) -> Snap {
    Snap {
        host: process_cpu_seconds(side.server.pid()).unwrap_or(0.0),
        dpu: side
            .dpu
            .as_ref()
            .map(|d| process_cpu_seconds(d.pid()).unwrap_or(0.0))
            .unwrap_or(0.0),
        dpu_gets: dpu_gets(side.socket.as_deref()),
    }
}

const WORKLOADS: [(&str, Dist, f64); 3] = [
    ("uniform-read", Dist::Uniform, 1.0),
    ("zipf-read", Dist::Zipf(0.99), 1.0),
    ("uniform-50/50", Dist::Uniform, 0.5),
];

/// A redis-benchmark GET run: requests per second and the server's CPU µs per request.
#[derive(Clone, Debug, Serialize)]
struct RbPoint {
    mode: &'static str,
    pipeline: usize,
    clients: usize,
    requests_per_sec: f64,
    host_cpu_us_per_op: f64,
    dpu_cpu_us_per_op: f64,
    dpu_get_fraction: f64,
}

fn redis_benchmark(side: &Side, mode: Mode, p: &Plan, pipeline: usize) -> Result<RbPoint> {
    let pl = pipeline.to_string();
    let r = measure_redis_benchmark(
        side,
        &[
            "-t",
            "get",
            "-c",
            "50",
            "-P",
            &pl,
            "-r",
            &p.rb_keys.to_string(),
        ],
        p.requests,
        |l| l.starts_with("\"GET\""),
    )?;
    Ok(RbPoint {
        mode: mode.name(),
        pipeline,
        clients: 50,
        requests_per_sec: r.requests_per_sec,
        host_cpu_us_per_op: r.host_cpu_us_per_op,
        dpu_cpu_us_per_op: r.dpu_cpu_us_per_op,
        dpu_get_fraction: r.dpu_fraction,
    })
}

/// What one redis-benchmark run measured: its requests per second (from its CSV output), and
/// the server's and the DPU's CPU per request and the DPU's share of the requests (from the
/// processes and the DPU's counters around the run).
struct RbMeasure {
    requests_per_sec: f64,
    host_cpu_us_per_op: f64,
    dpu_cpu_us_per_op: f64,
    dpu_fraction: f64,
}

/// Runs redis-benchmark against `side` with `args` and `-n requests --csv`; `is_line`
/// finds the test's line of the CSV output.
fn measure_redis_benchmark(
    side: &Side,
    args: &[&str],
    requests: u64,
    is_line: impl Fn(&str) -> bool,
) -> Result<RbMeasure> {
    let before = snap(side);
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &side.addr.port().to_string()])
        .args(["-n", &requests.to_string(), "--csv"])
        .args(args)
        .output()
        .context("run redis-benchmark (package redis-tools)")?;
    let after = snap(side);
    let text = String::from_utf8_lossy(&out.stdout);
    let rps: f64 = text
        .lines()
        .find(|l| is_line(l))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .with_context(|| format!("redis-benchmark {args:?} output: {text}"))?;
    let n = requests as f64;
    Ok(RbMeasure {
        requests_per_sec: rps,
        host_cpu_us_per_op: (after.host - before.host) * 1e6 / n,
        dpu_cpu_us_per_op: (after.dpu - before.dpu) * 1e6 / n,
        dpu_fraction: (after.dpu_gets - before.dpu_gets) as f64 / n,
    })
}

/// SETs `key:%012d` (redis-benchmark's key names) for 0..n with 8-byte values.
fn load_rb_keys(addr: SocketAddr, n: u64) -> Result<()> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    let mut i = 0;
    let mut sink = vec![0u8; 1 << 16];
    while i < n {
        let end = (i + 1000).min(n);
        let mut out = Vec::new();
        for k in i..end {
            let key = format!("key:{k:012}");
            out.extend_from_slice(
                format!(
                    "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n$8\r\nxxxxxxxx\r\n",
                    key.len()
                )
                .as_bytes(),
            );
        }
        s.write_all(&out)?;
        let want = (end - i) as usize * 5;
        let mut got = 0;
        while got < want {
            let m = s.read(&mut sink)?;
            if m == 0 {
                bail!("server closed the connection while loading");
            }
            if sink[..m].contains(&b'-') {
                bail!(
                    "SET failed while loading: {}",
                    String::from_utf8_lossy(&sink[..m])
                );
            }
            got += m;
        }
        i = end;
    }
    Ok(())
}

/// Runs the benchmark.
pub fn run_kv(a: KvArgs, command: String) -> Result<Report> {
    let p = plan(&a);
    let machine = Machine::detect();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let place = Placement::plan(nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let _pin = place.pin_host()?;
    let mut points: Vec<Point> = Vec::new();
    let mut rb: Vec<RbPoint> = Vec::new();
    let mut coll: Vec<colls::CollPoint> = Vec::new();
    let mut hset = None;
    let mut hget: Vec<colls::HgetPoint> = Vec::new();
    let mut device = None;
    for mode in [Mode::NoOffload, Mode::Offload, Mode::Redis, Mode::Inmemory] {
        eprintln!("dds bench kv: {} ...", mode.name());
        let mut side = start_side(mode, &a, &p, &place)?;
        if mode != Mode::Inmemory {
            let bar = crate::progress::bar(p.keys, false);
            bar.set_message(format!("{}: loading", mode.name()));
            load::load_keys(side.addr, p.keys, 4, &|n| bar.set_position(n))?;
            bar.finish_and_clear();
        }
        load_rb_keys(side.addr, p.rb_keys)?;
        // The periodic commit writes the memory-resident tail; the DPU caches what is written.
        std::thread::sleep(Duration::from_millis(1600));
        if mode != Mode::Inmemory {
            for (wname, dist, rf) in WORKLOADS {
                for &c in &p.connections {
                    let before = snap(&side);
                    let r = load::run(&LoadSpec {
                        addr: side.addr,
                        keys: p.keys,
                        dist,
                        read_fraction: rf,
                        connections: c,
                        depth: p.depth,
                        seconds: p.seconds,
                        seed: 7,
                        threads: a.load_threads,
                    })?;
                    let after = snap(&side);
                    let ops = r.ops.max(1) as f64;
                    let pt = Point {
                        mode: mode.name(),
                        workload: wname,
                        connections: c,
                        ops_per_sec: r.ops_per_sec,
                        p50_us: r.p50_us,
                        p99_us: r.p99_us,
                        host_cpu_us_per_op: (after.host - before.host) * 1e6 / ops,
                        dpu_cpu_us_per_op: (after.dpu - before.dpu) * 1e6 / ops,
                        dpu_get_fraction: (after.dpu_gets - before.dpu_gets) as f64
                            / r.gets.max(1) as f64,
                        wrong_values: r.wrong_values,
                        errors: r.errors,
                    };
                    eprintln!(
                        "  {:<14} {:>3} conns: {:>9.0} ops/s  p99 {:>7.0} µs  host {:>6.2} µs/op  dpu {:>6.2} µs/op  DPU GETs {:.2}",
                        wname, c, pt.ops_per_sec, pt.p99_us, pt.host_cpu_us_per_op,
                        pt.dpu_cpu_us_per_op, pt.dpu_get_fraction
                    );
                    if r.wrong_values > 0 || r.errors > 0 {
                        bail!(
                            "{}: {} wrong values and {} errors in {wname}",
                            mode.name(),
                            r.wrong_values,
                            r.errors
                        );
                    }
                    points.push(pt);
                }
            }
        }
        match mode {
            Mode::Offload | Mode::Redis => rb.push(redis_benchmark(&side, mode, &p, 1)?),
            _ => {}
        }
        if matches!(mode, Mode::Redis | Mode::Inmemory) {
            rb.push(redis_benchmark(&side, mode, &p, 16)?);
        }
        // Every side: the in-memory one gives the target's "in-memory working set" figure,
        // the others show what reads of elements on storage cost.
        coll.extend(colls::run(&side, mode, &p)?);
        if matches!(mode, Mode::NoOffload | Mode::Offload) {
            // A hash of as many fields as there are keys, 10 times the memory: HGETs of
            // random fields read storage (on the DPU when it serves them).
            colls::build_hash(side.addr, p.keys)?;
            std::thread::sleep(Duration::from_millis(1600));
            hget.push(colls::hgets(&side, mode, &p, p.keys)?);
        }
        if mode == Mode::NoOffload {
            hset = Some(colls::hset_log_bytes(side.addr, p.keys)?);
        }
        let _ = side.server.stop(Duration::from_secs(10));
        if let Some(mut d) = side.dpu.take() {
            let _ = d.stop(Duration::from_secs(5));
        }
        if mode == Mode::NoOffload {
            // The device file the service just ran on, alone (the DPU has stopped).
            let dev = side.dir.path().join(DEVICE_FILE);
            device = crate::device::measure_or_warn(&dev, KV_IO_BYTES, p.seconds);
        }
    }
    Ok(report(
        &a,
        &p,
        command,
        machine,
        &place,
        points,
        rb,
        device.as_ref(),
        Collections {
            points: coll,
            hset,
            hget,
        },
    ))
}

/// What the collection workloads measured.
struct Collections {
    points: Vec<colls::CollPoint>,
    hset: Option<colls::HsetBytes>,
    hget: Vec<colls::HgetPoint>,
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &KvArgs,
    p: &Plan,
    command: String,
    machine: Machine,
    place: &Placement,
    points: Vec<Point>,
    rb: Vec<RbPoint>,
    device: Option<&DeviceReads>,
    coll: Collections,
) -> Report {
    let cmax = *p.connections.iter().max().expect("connections");
    let at = |mode: &str, w: &str| {
        points
            .iter()
            .find(|x| x.mode == mode && x.workload == w && x.connections == cmax)
    };
    let rbat = |mode: &str, pl: usize| rb.iter().find(|x| x.mode == mode && x.pipeline == pl);
    let (off, no) = (
        at("offload", "uniform-read"),
        at("no-offload", "uniform-read"),
    );
    let host_ratio = match (off, no) {
        (Some(o), Some(n)) => ratio(o.host_cpu_us_per_op, n.host_cpu_us_per_op),
        _ => f64::NAN,
    };
    let tput_ratio = match (off, no) {
        (Some(o), Some(n)) => ratio(o.ops_per_sec, n.ops_per_sec),
        _ => f64::NAN,
    };
    let (rbo, rbr) = (rbat("offload", 1), rbat("redis", 1));
    let get_ratio = match (rbo, rbr) {
        (Some(o), Some(r)) => ratio(o.requests_per_sec, r.requests_per_sec),
        _ => f64::NAN,
    };
    let cpu_ratio = match (rbo, rbr) {
        (Some(o), Some(r)) => ratio(o.host_cpu_us_per_op, r.host_cpu_us_per_op),
        _ => f64::NAN,
    };
    // The DPU's CPU per offloaded GET (records on storage) against redis-server's host CPU
    // per GET (from memory), both under redis-benchmark without pipelining.
    let dpu_cpu_ratio = match (rbo, rbr) {
        (Some(o), Some(r)) => ratio(o.dpu_cpu_us_per_op, r.host_cpu_us_per_op),
        _ => f64::NAN,
    };
    let inmem = match (rbat("inmemory", 16), rbat("redis", 16)) {
        (Some(o), Some(r)) => ratio(o.requests_per_sec, r.requests_per_sec),
        _ => f64::NAN,
    };
    // Every mode's GETs/s as a fraction of the device's own random-read IOPS: uniform GETs at
    // the largest connection count; `inmemory` has only its redis-benchmark run (-P 16).
    let mut throughput: Vec<(&str, Option<f64>)> = [Mode::NoOffload, Mode::Offload, Mode::Redis]
        .iter()
        .map(|m| {
            (
                m.name(),
                at(m.name(), "uniform-read").map(|x| x.ops_per_sec),
            )
        })
        .collect();
    throughput.push((
        Mode::Inmemory.name(),
        rbat("inmemory", 16).map(|x| x.requests_per_sec),
    ));
    let fractions = crate::device::fractions(device, &throughput, "get_over_device_read_iops");
    let mut targets = vec![
        Target::at_most("offload_host_cpu_per_get_over_no_offload", host_ratio, 0.02),
        Target::at_least("offload_over_no_offload_throughput", tput_ratio, 1.0),
        Target::at_least("get_over_redis_server", get_ratio, 0.5),
        Target::at_most("host_cpu_per_get_over_redis_server", cpu_ratio, 0.1),
        Target::at_least("inmemory_get_over_redis_server", inmem, 1.0),
        Target::at_least("no_offload_get_over_device_read_iops", fractions[0].1, 0.5),
        Target::at_most(
            "offload_dpu_cpu_per_get_over_redis_server_host_cpu",
            dpu_cpu_ratio,
            1.0,
        ),
        Target::at_least("offload_get_over_device_read_iops", fractions[1].1, 0.7),
    ];
    // Each served collection test: dds kv (both sides) over redis-server.
    let rps_of = |mode: &str, test: &str| {
        coll.points
            .iter()
            .find(|x| x.mode == mode && x.test == test)
            .map(|x| x.requests_per_sec)
    };
    let mut coll_ratios = serde_json::Map::new();
    // The target's figure: the lowest test on the side whose memory holds the working set.
    let mut served_min = f64::INFINITY;
    for test in colls::SERVED {
        for mode in ["no-offload", "offload", "inmemory"] {
            let r = match (rps_of(mode, test), rps_of("redis", test)) {
                (Some(d), Some(r)) => ratio(d, r),
                _ => f64::NAN,
            };
            if mode == "inmemory" {
                served_min = served_min.min(r);
            }
            coll_ratios.insert(format!("{test}_{mode}_over_redis"), json!(r));
        }
    }
    if coll.points.is_empty() {
        served_min = f64::NAN;
    }
    let hset_ratio = coll.hset.as_ref().map_or(f64::NAN, |h| h.ratio);
    let hget_of = |mode: &str| coll.hget.iter().find(|x| x.mode == mode);
    let hget_ratio = match (hget_of("offload"), hget_of("no-offload")) {
        (Some(o), Some(n)) => ratio(o.host_cpu_us_per_op, n.host_cpu_us_per_op),
        _ => f64::NAN,
    };
    targets.extend([
        // The lowest of the ten tests, dds kv with its working set in memory.
        Target::at_least("collections_over_redis", served_min, 0.5),
        Target::at_most("hset_log_bytes_over_element", hset_ratio, 2.0),
        Target::at_most("offload_hget_host_cpu_over_no_offload", hget_ratio, 0.05),
    ]);
    let mut summary = json!({
        "offload_host_cpu_per_get_over_no_offload": host_ratio,
        "offload_over_no_offload_throughput": tput_ratio,
        "get_over_redis_server": get_ratio,
        "host_cpu_per_get_over_redis_server": cpu_ratio,
        "inmemory_get_over_redis_server": inmem,
        "offload_dpu_get_fraction": off.map(|o| o.dpu_get_fraction),
        "offload_dpu_cpu_us_per_get": off.map(|o| o.dpu_cpu_us_per_op),
        "offload_dpu_cpu_per_get_over_redis_server_host_cpu": dpu_cpu_ratio,
        "redis_benchmark_offload_dpu_cpu_us_per_get": rbo.map(|o| o.dpu_cpu_us_per_op),
        "redis_server_host_cpu_us_per_get": rbr.map(|r| r.host_cpu_us_per_op),
        "device_read_iops": device.map(|d| d.iops),
        "device_read_io_bytes": device.map(|d| d.io_bytes),
        "device_read_queue_depth": device.map(|d| d.threads * d.depth),
        "device_read_data_bytes": device.map(|d| d.data_bytes),
        "collections_over_redis": served_min,
        "collections_tests": colls::SERVED,
        "collection_ratios": coll_ratios,
        "hset_log_bytes_over_element": hset_ratio,
        "hset_log_bytes": coll.hset,
        "offload_hget_host_cpu_over_no_offload": hget_ratio,
        "hget_big_hash": coll.hget,
        "targets": targets,
    });
    for (k, r) in &fractions {
        summary[k.as_str()] = json!(r);
    }
    let mut t = Table::new(
        format!(
            "YCSB workloads at {cmax} connections (8-byte keys and values, {} records, \
             memory 10% of the data)",
            p.keys
        ),
        &[
            "mode",
            "workload",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "host µs/op",
            "DPU µs/op",
            "DPU GETs",
        ],
    );
    for x in points.iter().filter(|x| x.connections == cmax) {
        t.row(vec![
            x.mode.into(),
            x.workload.into(),
            fmt_num(x.ops_per_sec),
            fmt_num(x.p50_us),
            fmt_num(x.p99_us),
            fmt_num(x.host_cpu_us_per_op),
            fmt_num(x.dpu_cpu_us_per_op),
            format!("{:.0}%", 100.0 * x.dpu_get_fraction),
        ]);
    }
    let mut t2 = Table::new(
        "redis-benchmark GET, 50 clients",
        &[
            "mode",
            "pipeline",
            "requests/s",
            "host µs/op",
            "DPU µs/op",
            "DPU GETs",
        ],
    );
    for x in &rb {
        t2.row(vec![
            x.mode.into(),
            x.pipeline.to_string(),
            fmt_num(x.requests_per_sec),
            fmt_num(x.host_cpu_us_per_op),
            fmt_num(x.dpu_cpu_us_per_op),
            format!("{:.0}%", 100.0 * x.dpu_get_fraction),
        ]);
    }
    let mut t4 = Table::new(
        "redis-benchmark collection tests, 50 clients",
        &["mode", "test", "requests/s", "host µs/op", "DPU µs/op"],
    );
    for x in &coll.points {
        t4.row(vec![
            x.mode.into(),
            x.test.into(),
            fmt_num(x.requests_per_sec),
            fmt_num(x.host_cpu_us_per_op),
            fmt_num(x.dpu_cpu_us_per_op),
        ]);
    }
    let mut t5 = Table::new(
        format!(
            "redis-benchmark HGET of random fields of a {}-field hash (about {} MiB of records; \
             the server's memory {} MiB), 50 clients",
            p.keys,
            (p.keys * 80) >> 20,
            p.memory >> 20
        ),
        &["mode", "requests/s", "host µs/op", "DPU µs/op", "DPU HGETs"],
    );
    for x in &coll.hget {
        t5.row(vec![
            x.mode.into(),
            fmt_num(x.requests_per_sec),
            fmt_num(x.host_cpu_us_per_op),
            fmt_num(x.dpu_cpu_us_per_op),
            format!("{:.0}%", 100.0 * x.dpu_fraction),
        ]);
    }
    let t3 = crate::device::fraction_table(
        device,
        &throughput,
        &format!("GETs/s: uniform at {cmax} connections, inmemory redis-benchmark -P 16"),
    );
    let note = format!(
        "{} CPUs; DPU emulated: the dds dpu process on its own core",
        machine.nproc
    );
    let series = |f: &dyn Fn(&Point) -> f64, w: &str| -> Vec<Series> {
        ["no-offload", "offload", "redis"]
            .iter()
            .map(|m| Series {
                name: (*m).into(),
                points: points
                    .iter()
                    .filter(|x| x.mode == *m && x.workload == w)
                    .map(|x| (x.connections as f64, f(x)))
                    .collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let chart = |file: &str, title: &str, y: &str, f: &dyn Fn(&Point) -> f64, w: &str| {
        let s = series(f, w);
        LineChart {
            file: file.into(),
            title: title.into(),
            note: note.clone(),
            x_label: "client connections".into(),
            y_label: y.into(),
            log_y: crate::plot::spans_decades(s.iter().flat_map(|s| s.points.iter().map(|p| p.1))),
            series: s,
        }
    };
    let charts = vec![
        chart(
            "kv_throughput.png",
            "GETs over a data set 90% on storage (uniform)",
            "ops/s",
            &|x| x.ops_per_sec,
            "uniform-read",
        ),
        chart(
            "kv_host_cpu.png",
            "Host CPU per GET (uniform)",
            "host CPU µs per op",
            &|x| x.host_cpu_us_per_op,
            "uniform-read",
        ),
        chart(
            "kv_p99.png",
            "p99 latency (uniform)",
            "p99 µs",
            &|x| x.p99_us,
            "uniform-read",
        ),
        chart(
            "kv_throughput_zipf.png",
            "GETs, zipf 0.99",
            "ops/s",
            &|x| x.ops_per_sec,
            "zipf-read",
        ),
    ];
    Report {
        benchmark: "kv".into(),
        command,
        dpu_emulation: format!(
            "emulated: `dds dpu` runs as a separate process on its own core and reaches host \
             memory only through the emulated DMA engine; DMA cost model {}; redis-server {}",
            cost_model_text(a.dma_cost != "off"),
            "runs on the host cores"
        ),
        machine,
        config: json!({"args": a, "placement": place, "keys": p.keys, "redis_benchmark_keys": p.rb_keys,
            "memory_bytes": p.memory, "page_bytes": p.page, "log_bytes": p.log_size}),
        summary,
        points: Value::Array(
            points
                .iter()
                .map(|x| json!(x))
                .chain(rb.iter().map(|x| json!(x)))
                .chain(coll.points.iter().map(|x| json!(x)))
                .chain(coll.hget.iter().map(|x| json!(x)))
                .collect(),
        ),
        tables: vec![t, t2, t3, t4, t5],
        charts,
        panels: Vec::new(),
    }
}
