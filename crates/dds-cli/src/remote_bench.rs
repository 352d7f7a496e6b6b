//! `dds bench remote` and `dds bench echo`: the remote-storage evaluation (§8, Figs. 13, 14,
//! 18, 20) with every party a separate process on this machine.
//!
//! `remote` runs, side by side in one run and on the same disk:
//! - (a) baseline: `dds app pagestore --backend os` (kernel TCP + OS files, io_uring O_DIRECT);
//! - (b) `dds dpu` + `dds app pagestore --backend dds` (kernel TCP + DDS files);
//! - (c) DDS offload: `dds dpu --offload pagestore` with its traffic director in front of the
//!   host server of (b), reads served on the DPU, the rest forwarded to the host; the flags come
//!   from [`offload_dpu_args`], and the mode is reported as not available when `dds dpu` lacks
//!   them. It runs once more with the offload engine's copy mode for Fig. 20.
//!
//! The load client runs inside this process. For each mode and load point it records
//! throughput, latency percentiles and the CPU seconds of the server process ("host") and of
//! the `dds dpu` process ("DPU") from /proc/<pid>/stat. There is no DPU hardware: the DPU is the
//! `dds dpu` process with an emulated DMA engine, and every output says so.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use dds_apps::client::{self, ClientConfig, ClientReport};
use dds_apps::echo::{self, EchoConfig};
use dds_apps::plot::{self, Chart, Series};
use serde_json::{json, Value};

use crate::util::{parse_size, process_cpu_seconds};

/// The remote-storage benchmarks (flattened into `dds bench`).
#[derive(Subcommand, Debug)]
pub enum RemoteBench {
    /// Figs. 13/14 (and 20 with the offload engine): the pagestore server on OS files vs DDS
    /// files (vs DDS offload), throughput, latency and host/DPU CPU per operation.
    Remote(RemoteArgs),
    /// Fig. 18: TCP echo served by a host process vs by a separate "DPU" process.
    Echo(EchoBenchArgs),
}

pub fn run(b: RemoteBench) -> Result<()> {
    match b {
        RemoteBench::Remote(a) => run_remote(a),
        RemoteBench::Echo(a) => run_echo(a),
    }
}

const EMULATION_NOTE: &str = "No DPU hardware: the DPU is the `dds dpu` process with an emulated DMA engine (PCIe cost model), on the same machine as the host server and the client";

#[derive(Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Short run (about a minute): fewer load points, shorter points, smaller files.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Scratch directory for the OS files and the DDS device file (one disk for both).
    #[arg(long)]
    pub work: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    pub files: usize,
    /// Size of each file (default 64M, 16M with --quick).
    #[arg(long, value_parser = parse_size)]
    pub file_size: Option<u64>,
    #[arg(long, default_value = "1K", value_parser = parse_size)]
    pub io_size: u64,
    /// Requests per message.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Connections, swept with --outstanding (default 1,2,4; quick 2).
    #[arg(long, value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// Outstanding messages per connection, swept (default 1,2,4,8,16,32; quick 1,4,16).
    #[arg(long, value_delimiter = ',')]
    pub outstanding: Vec<usize>,
    /// Seconds per load point (default 4; quick 1.5).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Server worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Emulated PCIe DMA costs in the DPU (on or off).
    #[arg(long, default_value = "on")]
    pub dma_cost: String,
    /// Skip the write curves.
    #[arg(long)]
    pub no_writes: bool,
    /// CPUs of the `dds dpu` process (a taskset list; default: the last CPU).
    #[arg(long)]
    pub dpu_cpus: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct EchoBenchArgs {
    #[arg(long)]
    pub quick: bool,
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Message sizes (default 64,1K,16K; quick 64,4K).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Seconds per point (default 3; quick 1).
    #[arg(long)]
    pub seconds: Option<f64>,
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process (the server, the DPU, an echo server); killed when dropped.
struct Proc {
    child: Child,
    name: &'static str,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn cpu(&self) -> f64 {
        process_cpu_seconds(self.pid()).unwrap_or(0.0)
    }

    fn stop(mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..500 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(name = self.name, "did not stop on SIGTERM; killing");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn have_taskset() -> bool {
    Command::new("taskset")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `dds <args>`, pinned to `cpus` (a taskset list) when given. taskset execs the command, so
/// the child's pid is the dds process's.
fn dds_command(args: &[String], cpus: Option<&str>) -> Result<Command> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    Ok(match cpus {
        Some(list) if have_taskset() => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(list).arg(exe).args(args);
            c
        }
        Some(list) => bail!("taskset is not installed; cannot pin to CPUs {list}"),
        None => {
            let mut c = Command::new(exe);
            c.args(args);
            c
        }
    })
}

/// Spawns a process that prints one JSON ready line on stdout; returns it with the line.
fn spawn_ready(name: &'static str, cmd: &mut Command, timeout: Duration) -> Result<(Proc, Value)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {name}"))?;
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next();
        let _ = tx.send(first);
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let proc = Proc { child, name };
    let line = match rx.recv_timeout(timeout) {
        Ok(Some(Ok(l))) => l,
        Ok(_) => bail!("{name} exited before it was ready"),
        Err(_) => bail!("{name} was not ready within {timeout:?}"),
    };
    let v: Value =
        serde_json::from_str(&line).with_context(|| format!("{name} ready line: {line}"))?;
    Ok((proc, v))
}

fn dpu_args(device: &Path, socket: &Path, dma_cost: &str) -> Vec<String> {
    vec![
        "dpu".into(),
        "--device".into(),
        device.display().to_string(),
        "--socket".into(),
        socket.display().to_string(),
        "--dma-cost".into(),
        dma_cost.into(),
    ]
}

/// The DPU's stderr is passed through; its last traffic-director statistics line (printed at
/// exit) is what the join handle returns.
type DirectorStatsLine = std::thread::JoinHandle<Option<String>>;

fn start_dpu(
    args: &[String],
    socket: &Path,
    cpus: Option<&str>,
) -> Result<(Proc, DirectorStatsLine)> {
    let mut cmd = dds_command(args, cpus)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("start dds dpu")?;
    let stderr = child.stderr.take().context("stderr")?;
    let stats = std::thread::spawn(move || {
        let mut last = None;
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            eprintln!("{line}");
            if line.contains("director DirectorStats") {
                last = Some(line);
            }
        }
        last
    });
    let mut p = Proc {
        child,
        name: "dds dpu",
    };
    for _ in 0..1000 {
        if let Some(st) = p.child.try_wait()? {
            bail!("dds dpu exited at start ({st})");
        }
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok((p, stats));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("dds dpu did not open {} in time", socket.display())
}

/// The counters of a `DirectorStats { name: n, ... }` line.
fn parse_director_stats(line: Option<&str>) -> Value {
    let Some(line) = line else {
        return Value::Null;
    };
    let mut m = serde_json::Map::new();
    if let Some(body) = line.split_once('{').and_then(|(_, b)| b.rsplit_once('}')) {
        for kv in body.0.split(',') {
            if let Some((k, v)) = kv.split_once(':') {
                if let Ok(n) = v.trim().parse::<u64>() {
                    m.insert(k.trim().to_string(), json!(n));
                }
            }
        }
    }
    Value::Object(m)
}

/// Why mode (c) could not run.
#[derive(Debug)]
pub struct NotAvailable(pub String);

/// EXTENSION POINT for mode (c), DDS offload: given the `dds dpu` command line, adds the
/// traffic-director and offload-engine flags so the DPU serves the pagestore's clients itself
/// (reads offloaded to the DPU's file service, the rest forwarded to the host server at
/// `host_server`), and returns the address clients must connect to. `copy` selects the offload
/// engine's copy mode (the Fig. 20 baseline). Reports [`NotAvailable`] when `dds dpu` lacks the
/// flags.
pub fn offload_dpu_args(
    dpu_args: &mut Vec<String>,
    host_server: SocketAddr,
    copy: bool,
) -> Result<SocketAddr, NotAvailable> {
    let help = std::env::current_exe()
        .ok()
        .and_then(|exe| Command::new(exe).args(["dpu", "--help"]).output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for flag in [
        "--offload ",
        "--director-listen",
        "--host-app",
        "--offload-uncached",
    ] {
        if !help.contains(flag) {
            return Err(NotAvailable(format!(
                "`dds dpu` has no {} flag: the traffic director and offload engine are not available",
                flag.trim()
            )));
        }
    }
    if copy && !help.contains("--offload-copy") {
        return Err(NotAvailable("`dds dpu` has no --offload-copy flag".into()));
    }
    let director = free_port().map_err(|e| NotAvailable(format!("no free port: {e}")))?;
    dpu_args.extend([
        "--offload".to_string(),
        "pagestore".to_string(),
        "--director-listen".to_string(),
        director.to_string(),
        "--host-app".to_string(),
        host_server.to_string(),
        // The files were written by the host server, not through this DPU: serve every read.
        "--offload-uncached".to_string(),
    ]);
    if copy {
        dpu_args.push("--offload-copy".into());
    }
    Ok(director)
}

/// A loopback address with a port nothing listens on right now.
fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

// ---------------------------------------------------------------------------------------------
// The remote-storage benchmark

struct Plan {
    files: usize,
    file_size: u64,
    io_size: u32,
    batch: usize,
    connections: Vec<usize>,
    outstanding: Vec<usize>,
    seconds: f64,
    threads: usize,
    writes: bool,
    ncpu: usize,
}

fn cpu_list(n: usize) -> String {
    if n <= 1 {
        "0".into()
    } else {
        format!("0-{}", n - 1)
    }
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu_model": model,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        // Load averages (1, 5, 15 min) when the report was written: other work on the machine.
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// The server under load at one point.
struct Target<'a> {
    mode: &'a str,
    host_cores: usize,
    server: &'a Proc,
    dpu: Option<&'a Proc>,
    addr: SocketAddr,
    files: &'a [u32],
}

/// One measured load point.
fn measure(
    t: &Target<'_>,
    write: bool,
    (connections, outstanding): (usize, usize),
    plan: &Plan,
) -> Result<Value> {
    let Target {
        mode,
        host_cores,
        server,
        dpu,
        addr,
        files,
    } = *t;
    let cfg = ClientConfig {
        connect: addr,
        files: files.to_vec(),
        file_size: plan.file_size,
        io_size: plan.io_size,
        read_ratio: if write { 0.0 } else { 1.0 },
        batch: plan.batch,
        outstanding,
        connections,
        duration: Some(Duration::from_secs_f64(plan.seconds)),
        requests: None,
        verify: false,
        seed: outstanding as u64,
    };
    let (h0, d0) = (server.cpu(), dpu.map(Proc::cpu).unwrap_or(0.0));
    let c0 = crate::util::self_cpu_seconds();
    let rep: ClientReport = client::run(&cfg)?;
    let client_cpu = crate::util::self_cpu_seconds() - c0;
    let (h1, d1) = (server.cpu(), dpu.map(Proc::cpu).unwrap_or(0.0));
    let ops = rep.requests.max(1) as f64;
    let (host_cpu, dpu_cpu) = (h1 - h0, d1 - d0);
    let p = json!({
        "mode": mode,
        "op": if write { "write" } else { "read" },
        "host_cores": host_cores,
        "outstanding": outstanding,
        "connections": connections,
        "batch": plan.batch,
        "io_size": plan.io_size,
        "requests": rep.requests,
        "errors": rep.errors,
        "order_violations": rep.order_violations,
        "seconds": rep.seconds,
        "throughput": rep.requests_per_sec,
        "mb_per_sec": rep.mb_per_sec,
        "p50_us": rep.p50_us,
        "p99_us": rep.p99_us,
        "p999_us": rep.p999_us,
        "host_cpu_s": host_cpu,
        "dpu_cpu_s": dpu_cpu,
        "host_cores_used": host_cpu / rep.seconds.max(1e-9),
        "dpu_cores_used": dpu_cpu / rep.seconds.max(1e-9),
        "client_cores_used": client_cpu / rep.seconds.max(1e-9),
        "host_cpu_us_per_op": host_cpu / ops * 1e6,
        "dpu_cpu_us_per_op": dpu_cpu / ops * 1e6,
    });
    eprintln!(
        "  {mode} {:>5} cores={host_cores} conns={connections} outstanding={outstanding:>3}: {:>9.0} req/s  p50 {:>8.1} µs  p99 {:>8.1} µs  host {:>6.2} µs/op  DPU {:>6.2} µs/op  errors {}",
        if write { "write" } else { "read" },
        rep.requests_per_sec,
        rep.p50_us,
        rep.p99_us,
        host_cpu / ops * 1e6,
        dpu_cpu / ops * 1e6,
        rep.errors
    );
    if rep.order_violations > 0 || rep.failed_connections > 0 {
        bail!(
            "{mode}: {} responses out of order, {} connections failed",
            rep.order_violations,
            rep.failed_connections
        );
    }
    Ok(p)
}

fn server_args(plan: &Plan, backend: &str, where_: &[String], listen: SocketAddr) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "app".into(),
        "pagestore".into(),
        "--listen".into(),
        listen.to_string(),
        "--backend".into(),
        backend.into(),
        "--files".into(),
        plan.files.to_string(),
        "--file-size".into(),
        plan.file_size.to_string(),
        "--threads".into(),
        plan.threads.to_string(),
    ];
    a.extend_from_slice(where_);
    a
}

fn parse_ready(v: &Value) -> Result<(SocketAddr, Vec<u32>)> {
    let addr: SocketAddr = v["listen"]
        .as_str()
        .context("ready line without listen")?
        .parse()?;
    let files = v["files"]
        .as_array()
        .context("ready line without files")?
        .iter()
        .map(|f| f.as_u64().map(|x| x as u32).context("file id"))
        .collect::<Result<Vec<_>>>()?;
    Ok((addr, files))
}

/// Runs one mode: for each host core count, a server pinned to that many cores, and the load
/// points (the full read sweep, and the write sweep, at the largest core count; the peak read
/// point at the others).
/// Waits until something accepts connections at `addr`.
fn wait_listening(addr: SocketAddr) -> Result<()> {
    for _ in 0..500 {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("nothing listens on {addr}")
}

/// How clients reach a mode's server.
#[derive(Clone, Copy)]
enum Front {
    /// The host server itself, on a port it picks.
    Host,
    /// The traffic director on the DPU, forwarding to the host server at `host`.
    Director {
        director: SocketAddr,
        host: SocketAddr,
    },
}

#[allow(clippy::too_many_arguments)]
fn run_mode(
    mode: &str,
    backend: &str,
    where_: &[String],
    plan: &Plan,
    dpu: Option<&Proc>,
    front: Front,
    reads_only_at_max_cores: bool,
    points: &mut Vec<Value>,
) -> Result<()> {
    let max_cores = plan.ncpu.min(2);
    let mut core_counts: Vec<usize> = vec![max_cores];
    if max_cores > 1 {
        core_counts.push(1);
    }
    if reads_only_at_max_cores {
        core_counts.truncate(1);
    }
    for &cores in &core_counts {
        let list = cpu_list(cores);
        let listen = match front {
            Front::Host => "127.0.0.1:0".parse()?,
            Front::Director { host, .. } => host,
        };
        let mut cmd = dds_command(&server_args(plan, backend, where_, listen), Some(&list))?;
        let (server, ready) = spawn_ready("pagestore server", &mut cmd, Duration::from_secs(120))?;
        let (mut addr, files) = parse_ready(&ready)?;
        if let Front::Director { director, .. } = front {
            addr = director;
            wait_listening(director)?;
        }
        // Warm-up (connections, page tables, the DPU's first requests).
        let _ = client::run(&ClientConfig {
            connect: addr,
            files: files.clone(),
            file_size: plan.file_size,
            io_size: plan.io_size,
            batch: plan.batch,
            outstanding: 2,
            connections: 1,
            duration: Some(Duration::from_millis(300)),
            ..ClientConfig::default()
        });
        let (c_max, o_min, o_max) = (
            *plan.connections.iter().max().expect("connections"),
            *plan.outstanding.iter().min().expect("load points"),
            *plan.outstanding.iter().max().expect("load points"),
        );
        let sweep: Vec<(usize, usize)> = if cores == max_cores {
            plan.connections
                .iter()
                .flat_map(|&c| plan.outstanding.iter().map(move |&o| (c, o)))
                .collect()
        } else {
            vec![(c_max, o_max)]
        };
        let t = Target {
            mode,
            host_cores: cores,
            server: &server,
            dpu,
            addr,
            files: &files,
        };
        for &load in &sweep {
            points.push(measure(&t, false, load, plan)?);
        }
        if plan.writes && cores == max_cores && !reads_only_at_max_cores {
            let mut ws = vec![(c_max, o_min)];
            if o_max != o_min {
                ws.push((c_max, o_max));
            }
            for &load in &ws {
                points.push(measure(&t, true, load, plan)?);
            }
        }
        server.stop();
    }
    Ok(())
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// The summary of a mode: the read point at the highest load of the sweep at the most host
/// cores (the same load point for every mode), with the peak read throughput of the sweep and
/// the write point at the highest load next to it.
fn summarize(points: &[Value], mode: &str, label: &str) -> Value {
    let of_mode = || points.iter().filter(move |p| p["mode"] == mode);
    let max_cores = of_mode()
        .map(|p| p["host_cores"].as_u64().unwrap_or(0))
        .max()
        .unwrap_or(0);
    let at_load = |op: &str| {
        of_mode()
            .filter(|p| p["op"] == op && p["host_cores"] == max_cores)
            .max_by_key(|p| {
                p["outstanding"].as_u64().unwrap_or(0) * p["connections"].as_u64().unwrap_or(0)
            })
    };
    let peak = of_mode()
        .filter(|p| p["op"] == "read")
        .map(|p| f(p, "throughput"))
        .fold(0.0f64, f64::max);
    match at_load("read") {
        Some(p) => json!({
            "available": true,
            "label": label,
            "at": {"op": "read", "outstanding": p["outstanding"], "connections": p["connections"], "batch": p["batch"], "host_cores": p["host_cores"]},
            "throughput": p["throughput"],
            "p50_us": p["p50_us"],
            "p99_us": p["p99_us"],
            "host_cpu_us_per_op": p["host_cpu_us_per_op"],
            "dpu_cpu_us_per_op": p["dpu_cpu_us_per_op"],
            "peak_read_throughput": peak,
            "write": at_load("write").map(|w| json!({
                "outstanding": w["outstanding"],
                "throughput": w["throughput"],
                "p50_us": w["p50_us"],
                "p99_us": w["p99_us"],
                "host_cpu_us_per_op": w["host_cpu_us_per_op"],
                "dpu_cpu_us_per_op": w["dpu_cpu_us_per_op"],
            })),
        }),
        None => json!({"available": false, "label": label}),
    }
}

fn series(
    points: &[Value],
    mode: &str,
    op: &str,
    cores: Option<u64>,
    x: &str,
    y: &str,
) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p["mode"] == mode && p["op"] == op)
        .filter(|p| cores.is_none_or(|c| p["host_cores"] == c))
        .map(|p| (f(p, x), f(p, y)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

const MODES: [(&str, &str); 3] = [
    ("a", "TCP + OS files"),
    ("b", "TCP + DDS files"),
    ("c", "DDS offload"),
];

fn draw_remote(out: &Path, points: &[Value], max_cores: u64, quick: bool) -> Result<Vec<String>> {
    let note = format!(
        "emulated DPU (separate `dds dpu` process){}",
        if quick { ", quick run" } else { "" }
    );
    let kiops = |v: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        v.into_iter().map(|(x, y)| (x / 1e3, y)).collect()
    };
    let mut charts13 = Vec::new();
    for op in ["read", "write"] {
        let s: Vec<Series> = MODES
            .iter()
            .map(|(m, label)| Series {
                name: label.to_string(),
                points: kiops(series(
                    points,
                    m,
                    op,
                    Some(max_cores),
                    "throughput",
                    "host_cores_used",
                )),
                secondary: false,
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if !s.is_empty() {
            charts13.push(Chart {
                title: format!("Fig. 13 ({op}s): host CPU vs throughput"),
                note: note.clone(),
                x_label: "throughput (K IOPS)".into(),
                y_label: "host server CPU (cores)".into(),
                series: s,
            });
        }
    }
    // Peak read throughput vs host cores the server may use (taskset).
    let mut by_cores = Vec::new();
    for (m, label) in MODES {
        let mut pts = Vec::new();
        for c in 1..=max_cores {
            let best = points
                .iter()
                .filter(|p| p["mode"] == m && p["op"] == "read" && p["host_cores"] == c)
                .map(|p| f(p, "throughput"))
                .fold(0.0f64, f64::max);
            if best > 0.0 {
                pts.push((c as f64, best / 1e3));
            }
        }
        if !pts.is_empty() {
            by_cores.push(Series {
                name: label.into(),
                points: pts,
                secondary: false,
            });
        }
    }
    charts13.push(Chart {
        title: "Fig. 13: peak read throughput vs host cores (taskset)".into(),
        note: note.clone(),
        x_label: "host cores available to the server".into(),
        y_label: "throughput (K IOPS)".into(),
        series: by_cores,
    });
    let mut files = Vec::new();
    let p13 = out.join("remote-fig13.png");
    plot::draw(&p13, &charts13)?;
    files.push(p13.display().to_string());

    let mut charts14 = Vec::new();
    for op in ["read", "write"] {
        let mut s = Vec::new();
        for (m, label) in MODES {
            let p50 = kiops(series(
                points,
                m,
                op,
                Some(max_cores),
                "throughput",
                "p50_us",
            ));
            let p99 = kiops(series(
                points,
                m,
                op,
                Some(max_cores),
                "throughput",
                "p99_us",
            ));
            if !p50.is_empty() {
                s.push(Series {
                    name: format!("{label} p50"),
                    points: p50,
                    secondary: false,
                });
                s.push(Series {
                    name: format!("{label} p99"),
                    points: p99,
                    secondary: true,
                });
            }
        }
        if !s.is_empty() {
            charts14.push(Chart {
                title: format!("Fig. 14 ({op}s): latency vs throughput"),
                note: note.clone(),
                x_label: "throughput (K IOPS)".into(),
                y_label: "latency (µs)".into(),
                series: s,
            });
        }
    }
    let p14 = out.join("remote-fig14.png");
    plot::draw(&p14, &charts14)?;
    files.push(p14.display().to_string());

    // Fig. 20: the offload engine with and without zero copy (reads, latency vs throughput).
    let mut s20 = Vec::new();
    for (m, label) in [("c", "zero copy"), ("c-copy", "copy")] {
        let p50 = kiops(series(
            points,
            m,
            "read",
            Some(max_cores),
            "throughput",
            "p50_us",
        ));
        let p99 = kiops(series(
            points,
            m,
            "read",
            Some(max_cores),
            "throughput",
            "p99_us",
        ));
        if !p50.is_empty() {
            s20.push(Series {
                name: format!("{label} p50"),
                points: p50,
                secondary: false,
            });
            s20.push(Series {
                name: format!("{label} p99"),
                points: p99,
                secondary: true,
            });
        }
    }
    if s20.len() == 4 {
        let p20 = out.join("remote-fig20.png");
        plot::draw(
            &p20,
            &[Chart {
                title: "Fig. 20: DDS offload, zero copy vs copy (reads)".into(),
                note,
                x_label: "throughput (K IOPS)".into(),
                y_label: "latency (µs)".into(),
                series: s20,
            }],
        )?;
        files.push(p20.display().to_string());
    }
    Ok(files)
}

pub fn run_remote(a: RemoteArgs) -> Result<()> {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let plan = Plan {
        files: a.files.max(1),
        file_size: a
            .file_size
            .unwrap_or(if a.quick { 16 << 20 } else { 64 << 20 }),
        io_size: u32::try_from(a.io_size).context("--io-size")?,
        batch: a.batch.max(1),
        connections: if !a.connections.is_empty() {
            a.connections.iter().map(|&c| c.max(1)).collect()
        } else if a.quick {
            vec![2]
        } else {
            vec![1, 2, 4]
        },
        outstanding: if !a.outstanding.is_empty() {
            a.outstanding.clone()
        } else if a.quick {
            vec![1, 4, 16]
        } else {
            vec![1, 2, 4, 8, 16, 32]
        },
        seconds: a.seconds.unwrap_or(if a.quick { 1.5 } else { 4.0 }),
        threads: a.threads.max(1),
        writes: !a.no_writes,
        ncpu,
    };
    let work = match &a.work {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("dds-remote-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("create {}", a.out.display()))?;
    let cleanup = a.work.is_none();
    let result = run_remote_in(&a, &plan, &work);
    if cleanup {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn run_remote_in(a: &RemoteArgs, plan: &Plan, work: &Path) -> Result<()> {
    let started = Instant::now();
    eprintln!("dds bench remote: {EMULATION_NOTE}.");
    let mut points = Vec::new();
    // (a) the baseline: OS files on the work directory's disk.
    let os_dir = work.join("os-files");
    run_mode(
        "a",
        "os",
        &["--dir".into(), os_dir.display().to_string()],
        plan,
        None,
        Front::Host,
        false,
        &mut points,
    )?;
    // (b) DDS files: a device file on the same disk, served by `dds dpu`.
    let device = work.join("dds-device.img");
    let device_size =
        (plan.files as u64 * plan.file_size * 3 / 2 + (64 << 20)).next_multiple_of(1 << 20);
    crate::dpu_cmd::format_device(&crate::dpu_cmd::FormatArgs {
        device: device.clone(),
        size: Some(device_size),
        segment_size: None,
        max_files: None,
        max_dirs: None,
        // The benchmark's own scratch device, rebuilt on every run.
        force: true,
    })?;
    let socket = work.join("dpu.sock");
    let dpu_cpu = a
        .dpu_cpus
        .clone()
        .unwrap_or_else(|| (plan.ncpu - 1).to_string());
    let base_args = dpu_args(&device, &socket, &a.dma_cost);
    let where_b = ["--socket".to_string(), socket.display().to_string()];
    let (dpu, _) = start_dpu(&base_args, &socket, Some(&dpu_cpu))?;
    let r = run_mode(
        "b",
        "dds",
        &where_b,
        plan,
        Some(&dpu),
        Front::Host,
        false,
        &mut points,
    );
    dpu.stop();
    r?;
    // (c) DDS offload: the DPU's traffic director in front of the host server of mode (b),
    // reads served on the DPU; zero copy, then the copy mode for Fig. 20 (reads only).
    let mut c = Value::Null;
    let mut director_stats = serde_json::Map::new();
    for (mode, copy) in [("c", false), ("c-copy", true)] {
        let host: SocketAddr = free_port()?;
        let mut args = base_args.clone();
        match offload_dpu_args(&mut args, host, copy) {
            Ok(director) => {
                let (dpu, stats) = start_dpu(&args, &socket, Some(&dpu_cpu))?;
                let r = run_mode(
                    mode,
                    "dds",
                    &where_b,
                    plan,
                    Some(&dpu),
                    Front::Director { director, host },
                    copy,
                    &mut points,
                );
                dpu.stop();
                let line = stats.join().ok().flatten();
                director_stats.insert(mode.to_string(), parse_director_stats(line.as_deref()));
                r?;
            }
            Err(NotAvailable(why)) => {
                eprintln!("  mode {mode}: not available: {why}");
                c = json!({"available": false, "label": "DDS offload", "reason": why});
                break;
            }
        }
    }
    if c.is_null() {
        c = summarize(&points, "c", "DDS offload");
    }
    let c_copy = if points.iter().any(|p| p["mode"] == "c-copy") {
        summarize(&points, "c-copy", "DDS offload, copy mode")
    } else {
        json!({"available": false, "label": "DDS offload, copy mode"})
    };
    let max_cores = plan.ncpu.min(2) as u64;
    let plots = draw_remote(&a.out, &points, max_cores, a.quick)?;
    let report = json!({
        "benchmark": "remote",
        "note": EMULATION_NOTE,
        "quick": a.quick,
        "machine": machine(),
        "setup": {
            "files": plan.files,
            "file_size": plan.file_size,
            "io_size": plan.io_size,
            "batch": plan.batch,
            "connections": plan.connections,
            "outstanding": plan.outstanding,
            "seconds_per_point": plan.seconds,
            "server_threads": plan.threads,
            "dma_cost": a.dma_cost,
            "pinning": format!("host server: taskset -c 0 (1 core) or 0-{} ({} cores); dds dpu: taskset -c {}; client: this process, unpinned", max_cores - 1, max_cores, a.dpu_cpus.clone().unwrap_or_else(|| (plan.ncpu - 1).to_string())),
            "os_backend": "regular files on the same disk as the DDS device file; io_uring with O_DIRECT (buffered descriptor for unaligned requests)",
            "dds_backend": "DDS files through the host library; file service in `dds dpu` (io_uring O_DIRECT on its device file)",
            "cpu": "host = the pagestore server process, DPU = the dds dpu process, from /proc/<pid>/stat over each load point; client_cores_used = this process (the load client), from getrusage",
        },
        "modes": {
            "a": "host application with kernel TCP and OS files (baseline)",
            "b": "host application with kernel TCP and DDS files",
            "c": "DDS offload: clients connect to the traffic director in `dds dpu` (--offload pagestore --offload-uncached), which serves reads on the DPU and forwards the rest to the mode-b host server",
            "c-copy": "mode c with the offload engine's copy mode (--offload-copy), the Fig. 20 baseline",
        },
        "summary": {
            "a": summarize(&points, "a", "TCP + OS files"),
            "b": summarize(&points, "b", "TCP + DDS files"),
            "c": c,
            "c_copy": c_copy,
        },
        // Requests the traffic director served on the DPU (`offloaded`) or sent to the host
        // (`forwarded`; `fallback` = reads forwarded because the DPU's file port was full),
        // over all points of the mode, warm-up included.
        "director": director_stats,
        "plots": plots,
        "points": points,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    let path = a.out.join("remote.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    print_summary(&report);
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn print_summary(report: &Value) {
    println!("remote storage benchmark ({EMULATION_NOTE})");
    println!(
        "{:<18} {:>12} {:>10} {:>10} {:>14} {:>13}",
        "mode", "req/s", "p50 µs", "p99 µs", "host µs/op", "DPU µs/op"
    );
    for m in ["a", "b", "c"] {
        let s = &report["summary"][m];
        if s["available"] == true {
            println!(
                "{:<18} {:>12.0} {:>10.1} {:>10.1} {:>14.2} {:>13.2}",
                s["label"].as_str().unwrap_or(m),
                f(s, "throughput"),
                f(s, "p50_us"),
                f(s, "p99_us"),
                f(s, "host_cpu_us_per_op"),
                f(s, "dpu_cpu_us_per_op")
            );
        } else {
            println!(
                "{:<18} not available: {}",
                s["label"].as_str().unwrap_or(m),
                s["reason"].as_str().unwrap_or("")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The echo benchmark (Fig. 18)

pub fn run_echo(a: EchoBenchArgs) -> Result<()> {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let sizes: Vec<u64> = if !a.sizes.is_empty() {
        a.sizes.clone()
    } else if a.quick {
        vec![64, 4096]
    } else {
        vec![64, 1024, 16384]
    };
    let seconds = a.seconds.unwrap_or(if a.quick { 1.0 } else { 3.0 });
    std::fs::create_dir_all(&a.out)?;
    eprintln!("dds bench echo: {EMULATION_NOTE}; the DPU-side echo is the same code in a separate process pinned to CPU {}.", ncpu - 1);
    let sides = [("host", "0".to_string()), ("dpu", (ncpu - 1).to_string())];
    let mut points = Vec::new();
    for (role, cpus) in &sides {
        let args: Vec<String> = vec![
            "app".into(),
            "echo".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--role".into(),
            role.to_string(),
        ];
        let mut cmd = dds_command(&args, Some(cpus))?;
        let (server, ready) = spawn_ready("echo server", &mut cmd, Duration::from_secs(30))?;
        let addr: SocketAddr = ready["listen"]
            .as_str()
            .ok_or_else(|| anyhow!("echo ready line without listen"))?
            .parse()?;
        for &size in &sizes {
            for outstanding in [1usize, 8] {
                let c0 = server.cpu();
                let rep = echo::run_client(&EchoConfig {
                    connect: addr,
                    message_size: size as usize,
                    outstanding,
                    connections: 1,
                    duration: Duration::from_secs_f64(seconds),
                })?;
                let cpu = server.cpu() - c0;
                let per = cpu / rep.messages.max(1) as f64 * 1e6;
                eprintln!(
                    "  {role:<4} {size:>6} B outstanding {outstanding}: {:>9.0} msg/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {per:>6.2} µs CPU/msg",
                    rep.messages_per_sec, rep.p50_us, rep.p99_us
                );
                if rep.corrupt > 0 {
                    bail!("echo returned different bytes ({} messages)", rep.corrupt);
                }
                points.push(json!({
                    "side": role,
                    "cpus": cpus,
                    "message_size": size,
                    "outstanding": outstanding,
                    "messages": rep.messages,
                    "seconds": rep.seconds,
                    "throughput": rep.messages_per_sec,
                    "mb_per_sec": rep.mb_per_sec,
                    "p50_us": rep.p50_us,
                    "p99_us": rep.p99_us,
                    "cpu_s": cpu,
                    "cpu_us_per_op": per,
                }));
            }
        }
        server.stop();
    }
    let summary_of = |side: &str| {
        // Latency at one message in flight (smallest size); throughput at 8 in flight.
        let lat = points
            .iter()
            .find(|p| p["side"] == side && p["outstanding"] == 1)
            .cloned()
            .unwrap_or(Value::Null);
        let thr = points
            .iter()
            .filter(|p| p["side"] == side && p["outstanding"] == 8)
            .find(|p| p["message_size"] == sizes[0])
            .cloned()
            .unwrap_or(Value::Null);
        json!({
            "throughput": thr["throughput"],
            "p50_us": lat["p50_us"],
            "p99_us": lat["p99_us"],
            "cpu_us_per_op": thr["cpu_us_per_op"],
            "message_size": sizes[0],
        })
    };
    let mut charts = Vec::new();
    for (title, y, out) in [
        ("Fig. 18: echo latency (1 in flight)", "p50_us", 1usize),
        ("echo throughput (8 in flight)", "throughput", 8),
    ] {
        let s = sides
            .iter()
            .map(|(role, _)| Series {
                name: if *role == "host" {
                    "echo on host (kernel TCP)".into()
                } else {
                    "echo in the DPU process (kernel TCP)".into()
                },
                points: points
                    .iter()
                    .filter(|p| p["side"] == *role && p["outstanding"] == out)
                    .map(|p| (f(p, "message_size") / 1024.0, f(p, y)))
                    .collect(),
                secondary: false,
            })
            .collect();
        charts.push(Chart {
            title: title.into(),
            note: "emulated DPU: a separate process pinned to another core".into(),
            x_label: "message size (KiB)".into(),
            y_label: if y == "p50_us" {
                "p50 latency (µs)".into()
            } else {
                "messages/s".into()
            },
            series: s,
        });
    }
    let png = a.out.join("echo-fig18.png");
    plot::draw(&png, &charts)?;
    let report = json!({
        "benchmark": "echo",
        "note": format!("{EMULATION_NOTE}. The DPU-side echo is the same kernel-TCP echo code run as a separate process pinned to CPU {}; the host echo is pinned to CPU 0. No userspace TCP stack (TLDK) is involved.", ncpu - 1),
        "quick": a.quick,
        "machine": machine(),
        "summary": {"host": summary_of("host"), "dpu": summary_of("dpu")},
        "plots": [png.display().to_string()],
        "points": points,
    });
    let path = a.out.join("echo.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!(
        "echo benchmark (no DPU hardware: the DPU-side echo is the same kernel-TCP echo in a separate process pinned to CPU {})",
        ncpu - 1
    );
    for side in ["host", "dpu"] {
        let s = &report["summary"][side];
        println!(
            "{side:<5} {:>10.0} msg/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {:>6.2} µs CPU/msg",
            f(s, "throughput"),
            f(s, "p50_us"),
            f(s, "p99_us"),
            f(s, "cpu_us_per_op")
        );
    }
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn director_stats_line_is_parsed() {
        let v = parse_director_stats(Some(
            "dds dpu: director DirectorStats { accepted: 8, split: 8, offloaded: 80938, forwarded: 59254, fallback: 59254 }",
        ));
        assert_eq!(v["offloaded"], 80938);
        assert_eq!(v["fallback"], 59254);
        assert_eq!(parse_director_stats(None), Value::Null);
    }
}
