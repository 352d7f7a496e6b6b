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
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::plot::panels::{self as plot, Chart, Series};
use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use dds_apps::client::{self, ClientConfig, ClientReport};
use dds_apps::echo::{self, EchoConfig};
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::cpu::self_cpu_seconds;
use dds_proto::units::parse_size;

mod echo_bench;
mod figures;
mod procs;

pub use echo_bench::run_echo;
use figures::*;
use procs::*;
pub use procs::{offload_dpu_args, NotAvailable};

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
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick with
    /// --quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
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
    /// Where the JSON and the plot go (default bench/results, or bench/results/quick with
    /// --quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Message sizes (default 64,1K,16K; quick 64,4K).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Seconds per point (default 3; quick 1).
    #[arg(long)]
    pub seconds: Option<f64>,
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
    let (h0, d0) = (
        server.cpu_seconds(),
        dpu.map(Proc::cpu_seconds).unwrap_or(0.0),
    );
    let c0 = self_cpu_seconds();
    let rep: ClientReport = client::run(&cfg)?;
    let client_cpu = self_cpu_seconds() - c0;
    let (h1, d1) = (
        server.cpu_seconds(),
        dpu.map(Proc::cpu_seconds).unwrap_or(0.0),
    );
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
        let (mut server, ready) =
            spawn_ready("pagestore server", &mut cmd, Duration::from_secs(120))?;
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
        let _ = server.stop(STOP_GRACE);
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
    let out = crate::results_dir(a.out.as_deref(), a.quick);
    std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
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
    crate::files::format_device(
        &std::env::current_exe().context("locate the dds binary")?,
        &device,
        device_size,
    )?;
    let socket = work.join("dpu.sock");
    let dpu_cpu = a
        .dpu_cpus
        .clone()
        .unwrap_or_else(|| (plan.ncpu - 1).to_string());
    let base_args = dpu_args(&device, &socket, &a.dma_cost);
    let where_b = ["--socket".to_string(), socket.display().to_string()];
    let (mut dpu, _) = start_dpu(&base_args, &socket, Some(&dpu_cpu))?;
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
    let _ = dpu.stop(STOP_GRACE);
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
                let (mut dpu, stats) = start_dpu(&args, &socket, Some(&dpu_cpu))?;
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
                let _ = dpu.stop(STOP_GRACE);
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
    let (ratios, targets) = offload_ratios(&points);
    let max_cores = plan.ncpu.min(2) as u64;
    let out = crate::results_dir(a.out.as_deref(), a.quick);
    let plots = draw_remote(&out, &points, max_cores, a.quick)?;
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
            "offload_over_baseline_peak": ratios[0],
            "offload_dpu_cpu_over_baseline_host_cpu": ratios[1],
            "offload_p50_over_baseline_p50": ratios[2],
            "targets": targets,
        },
        // Requests the traffic director served on the DPU (`offloaded`) or sent to the host
        // (`forwarded`; `fallback` = reads forwarded because the DPU's file port was full),
        // over all points of the mode, warm-up included.
        "director": director_stats,
        "plots": plots,
        "points": points,
        "elapsed_s": started.elapsed().as_secs_f64(),
    });
    let path = out.join("remote.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    print_summary(&report);
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// DDS offload (mode c) against the baseline (mode a), reads: peak throughput, CPU per read
/// (the DPU's against the host's) and p50 at the load where the baseline peaks; with their
/// targets.
fn offload_ratios(points: &[Value]) -> ([f64; 3], Vec<crate::report::Target>) {
    use crate::report::{ratio, Target};
    let reads = |mode: &'static str| {
        points
            .iter()
            .filter(move |p| p["mode"] == mode && p["op"] == "read")
    };
    let peak = |mode: &'static str| {
        reads(mode).max_by(|x, y| f(x, "throughput").total_cmp(&f(y, "throughput")))
    };
    let (Some(a), Some(c)) = (peak("a"), peak("c")) else {
        return ([0.0; 3], Vec::new());
    };
    let same_load = |p: &&Value| {
        ["connections", "outstanding", "host_cores", "batch"]
            .iter()
            .all(|k| p[*k] == a[*k])
    };
    let c_at_a = reads("c").find(same_load);
    let r = [
        ratio(f(c, "throughput"), f(a, "throughput")),
        ratio(f(c, "dpu_cpu_us_per_op"), f(a, "host_cpu_us_per_op")),
        c_at_a.map_or(0.0, |c| ratio(f(c, "p50_us"), f(a, "p50_us"))),
    ];
    let targets = vec![
        Target::at_least("DDS offload / baseline peak reads/s", r[0], 1.5),
        Target::at_most(
            "DDS offload DPU CPU per read / baseline host CPU per read",
            r[1],
            1.2,
        ),
        Target::at_most(
            "DDS offload p50 / baseline p50 at the baseline's peak load",
            r[2],
            0.5,
        ),
    ];
    (r, targets)
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
