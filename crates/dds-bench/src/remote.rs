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
//! `dds dpu` runs on a core of its own (`--dpu-cpus`, default the last CPU) and the host side
//! (the servers of every mode and the load client) on the others, in every mode
//! ([`Placement`], recorded as `config.placement`); `--shared-cores` lets them share.
//! The load client runs inside this process. For each mode and load point it records
//! throughput, latency percentiles and the CPU seconds of the server process ("host") and of
//! the `dds dpu` process ("DPU") from /proc/<pid>/stat. There is no DPU hardware: the DPU is the
//! `dds dpu` process with an emulated DMA engine, and every output says so. Both benchmarks
//! return a [`Report`] that `dds bench` prints and writes.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use dds_apps::client::{self, ClientConfig, ClientReport};
use dds_apps::echo::{self, EchoConfig};
use dds_proto::units::parse_size;
use serde::Serialize;
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::cpu::self_cpu_seconds;
use crate::machine::Machine;
use crate::placement::Placement;
use crate::plot::panels::{Chart, Figure, Series};
use crate::report::{fmt_num, Report, Table};

mod echo_bench;
mod figures;
mod netns;
mod procs;

pub use echo_bench::run_echo;
use figures::*;
use procs::*;
pub use procs::{offload_dpu_args, NotAvailable};

const EMULATION_NOTE: &str = "No DPU hardware: the DPU is the `dds dpu` process with an emulated DMA engine (PCIe cost model), on the same machine as the host server and the client";

/// Settings of `dds bench remote`.
#[derive(Args, Debug, Clone, Serialize)]
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
    /// CPUs of the `dds dpu` process (default: the last CPU); the host server and the load
    /// client get the others, in every mode.
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// Let the DPU share the host's cores (the results go beside the dedicated-core run's).
    #[arg(long)]
    pub shared_cores: bool,
    /// `netns`: after the loopback run, the three modes again through client, DPU and host
    /// network namespaces, the clients addressing the host and the DPU steering the server's
    /// flows to its director (`docs/bump-in-the-wire.md`; needs root and nftables).
    #[arg(long, value_enum, default_value = "loopback")]
    pub topology: TopologyArg,
    /// Rounds over all modes and load points: the summary's ratios are the medians of the
    /// rounds' ratios (this machine's figures move by tens of percent between runs); the
    /// tables and plots show the first round.
    #[arg(long, default_value_t = 1)]
    pub trials: usize,
    /// A RAM-backed directory (tmpfs) for one more pass of the modes, reads only, with the OS
    /// files and the DDS device file there, so the disk bounds neither mode
    /// (`offload_over_baseline_peak_memdev`); `none` skips it.
    #[arg(long, default_value = "/dev/shm")]
    pub memdev: String,
}

/// How the clients reach the servers in `dds bench remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyArg {
    /// Every process on the loopback interface; clients of mode (c) connect to the
    /// director's port.
    Loopback,
    /// The loopback run, then the modes through network namespaces with flow rules.
    Netns,
}

/// Settings of `dds bench echo`.
#[derive(Args, Debug, Clone, Serialize)]
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
    /// CPUs of the DPU-side echo (default: the last CPU); the host-side echo and the client
    /// get the others.
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// Let the DPU side share the host's cores (the results go beside the dedicated-core
    /// run's).
    #[arg(long)]
    pub shared_cores: bool,
}

// ---------------------------------------------------------------------------------------------
// The remote-storage benchmark

#[derive(Clone)]
struct Plan {
    /// The namespaces of `--topology netns` (`None`: loopback).
    ns: Option<netns::NsPlan>,
    files: usize,
    file_size: u64,
    io_size: u32,
    batch: usize,
    connections: Vec<usize>,
    outstanding: Vec<usize>,
    seconds: f64,
    threads: usize,
    writes: bool,
    /// CPUs the host side (the servers and the load client) may use: all but the DPU's, or
    /// every CPU with `--shared-cores`.
    host_cpus: Vec<usize>,
}

impl Plan {
    /// Host cores the server is given at most (the core sweep runs 1..=this).
    fn max_cores(&self) -> usize {
        self.host_cpus.len().clamp(1, 2)
    }
}

/// A taskset list of CPUs.
fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The host side's CPUs under `place`: its own, or every CPU when shared.
fn host_cpus(place: &Placement, nproc: usize) -> Vec<usize> {
    place
        .host_cpus
        .clone()
        .unwrap_or_else(|| (0..nproc.max(1)).collect())
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

/// How clients reach a mode's server.
#[derive(Clone, Copy)]
enum Front {
    /// The host server itself, on a port it picks.
    Host,
    /// The traffic director on the DPU, forwarding to the host server (which binds a port of
    /// its own and announces it to the DPU).
    Director { director: SocketAddr },
}

/// Runs one mode: for each host core count, a server pinned to that many of the host side's
/// cores, and the load points (the full read sweep, and the write sweep, at the largest core
/// count; the peak read point at the others).
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
    let max_cores = plan.max_cores();
    let mut core_counts: Vec<usize> = vec![max_cores];
    if max_cores > 1 {
        core_counts.push(1);
    }
    if reads_only_at_max_cores {
        core_counts.truncate(1);
    }
    for &cores in &core_counts {
        let list = cpu_list(&plan.host_cpus[..cores]);
        let listen = match &plan.ns {
            Some(_) => netns::SERVER,
            None => "127.0.0.1:0".parse()?,
        };
        let host_ns = plan.ns.as_ref().map(|n| n.host.as_str());
        let mut cmd = dds_command(
            &server_args(plan, backend, where_, listen),
            Some(&list),
            host_ns,
        )?;
        let (mut server, ready) =
            spawn_ready("pagestore server", &mut cmd, Duration::from_secs(120))?;
        let (mut addr, files) = parse_ready(&ready)?;
        if let Front::Director { director } = front {
            addr = director;
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

/// Runs the remote-storage benchmark; `command` is the command line, for the report.
pub fn run_remote(a: RemoteArgs, command: String) -> Result<Report> {
    let machine = Machine::detect();
    let place = Placement::plan(machine.nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let plan = Plan {
        ns: None,
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
        host_cpus: host_cpus(&place, machine.nproc),
    };
    let work = match &a.work {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("dds-remote-bench-{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let cleanup = a.work.is_none();
    // The load client (this process) runs on the host side's cores.
    let pinned = place.pin_host();
    let trials = a.trials.max(1);
    let result = pinned.and_then(|_pin| {
        (0..trials)
            .map(|t| {
                if trials > 1 {
                    eprintln!("dds bench remote: round {} of {trials}", t + 1);
                }
                run_remote_in(&a, &plan, &place, &work, true)
            })
            .collect::<Result<Vec<RemoteRun>>>()
    });
    let netns_run = match (&result, a.topology) {
        (Ok(_), TopologyArg::Netns) => Some(netns::run(&a, &plan, &place, &work)),
        _ => None,
    };
    let memdev_run = match (&result, a.memdev.as_str()) {
        (Ok(_), dir) if dir != "none" => Some(run_memdev(&a, &plan, &place, Path::new(dir))),
        _ => None,
    };
    if cleanup {
        let _ = std::fs::remove_dir_all(&work);
    }
    let mut rounds = result?;
    let netns_run = netns_run.transpose()?;
    // The first round is the one shown; every round's ratios go into the medians.
    let round_ratios: Vec<[f64; 3]> = rounds.iter().map(|r| offload_ratios(&r.0).0).collect();
    let (points, c_unavailable, director, elapsed) = rounds.remove(0);
    let mut all_points = points.clone();
    for (t, r) in rounds.into_iter().enumerate() {
        for mut p in r.0 {
            p["trial"] = json!(t + 1);
            all_points.push(p);
        }
    }
    let mut summary = remote_summary(&points, c_unavailable, director, elapsed, &round_ratios);
    if let Some(m) = memdev_run.transpose()? {
        memdev_summary(&mut summary, &a.memdev, m, &mut all_points);
    }
    let mut points = points;
    if let Some(n) = netns_run {
        netns_summary(&mut summary, &points, &n);
        points.extend(n.points.iter().cloned());
        all_points.extend(n.points);
    }
    let max_cores = plan.max_cores();
    let config = json!({
        "args": a,
        "placement": place,
        "files": plan.files,
        "file_size": plan.file_size,
        "io_size": plan.io_size,
        "batch": plan.batch,
        "connections": plan.connections,
        "outstanding": plan.outstanding,
        "seconds_per_point": plan.seconds,
        "server_threads": plan.threads,
        "dma_cost": a.dma_cost,
        "host_cores": format!(
            "the host server is pinned (taskset) to 1..={max_cores} of the host side's CPUs {:?}; the load client (this process) runs on the host side's CPUs",
            plan.host_cpus
        ),
        "os_backend": "regular files on the same disk as the DDS device file; io_uring with O_DIRECT (buffered descriptor for unaligned requests)",
        "dds_backend": "DDS files through the host library; file service in `dds dpu` (io_uring O_DIRECT on its device file)",
        "cpu": "host = the pagestore server process, DPU = the dds dpu process, from /proc/<pid>/stat over each load point; client_cores_used = this process (the load client), from getrusage",
        "modes": {
            "a": "host application with kernel TCP and OS files (baseline)",
            "b": "host application with kernel TCP and DDS files",
            "c": "DDS offload: clients connect to the traffic director in `dds dpu` (--offload pagestore --offload-uncached), which serves reads on the DPU and forwards the rest to the mode-b host server",
            "c-copy": "mode c with the offload engine's copy mode (--offload-copy), the Fig. 20 baseline",
        },
    });
    Ok(Report {
        benchmark: "remote".into(),
        command,
        dpu_emulation: format!("{EMULATION_NOTE}. {}", placement_text(&place, "`dds dpu`")),
        machine,
        config,
        tables: vec![remote_table(&summary)],
        panels: remote_figures(&points, max_cores as u64, a.quick),
        summary,
        points: Value::Array(all_points),
        charts: Vec::new(),
    })
}

/// Where the DPU side ran, for the report's DPU line.
fn placement_text(place: &Placement, dpu: &str) -> String {
    match (&place.dpu_cpus, &place.host_cpus) {
        (Some(d), Some(h)) => format!(
            "{dpu} on CPU(s) {d}, the host side on CPU(s) {}",
            cpu_list(h)
        ),
        _ => format!("{dpu} shares every CPU with the host side (--shared-cores)"),
    }
}

/// The points, mode (c)'s summary when it could not run, the traffic director's counters per
/// offload mode, and the run's seconds.
type RemoteRun = (Vec<Value>, Option<Value>, Value, f64);

/// What modes (a) and (b) leave for mode (c): the DPU's command line, the host server's
/// arguments that attach it to that DPU, and the DPU's control socket.
struct DdsSetup {
    dpu_args: Vec<String>,
    where_b: Vec<String>,
    socket: PathBuf,
}

/// Runs modes (a) and (b), named `{prefix}a` and `{prefix}b`, the DPU of (b) in network
/// namespace `dpu_ns` when given: (a) the baseline on OS files on the work directory's disk,
/// (b) DDS files on a device file on the same disk, served by `dds dpu`.
fn run_a_and_b(
    a: &RemoteArgs,
    plan: &Plan,
    place: &Placement,
    work: &Path,
    prefix: &str,
    dpu_ns: Option<&str>,
    points: &mut Vec<Value>,
) -> Result<DdsSetup> {
    let os_dir = work.join("os-files");
    run_mode(
        &format!("{prefix}a"),
        "os",
        &["--dir".into(), os_dir.display().to_string()],
        plan,
        None,
        Front::Host,
        false,
        points,
    )?;
    let device = work.join("dds-device.img");
    let device_size =
        (plan.files as u64 * plan.file_size * 3 / 2 + (64 << 20)).next_multiple_of(1 << 20);
    crate::files::format_device(
        &std::env::current_exe().context("locate the dds binary")?,
        &device,
        device_size,
    )?;
    let socket = work.join("dpu.sock");
    let mut base_args = dpu_args(&device, &socket, &a.dma_cost);
    base_args.extend(place.dpu_args());
    let where_b = vec!["--socket".to_string(), socket.display().to_string()];
    let (mut dpu, _, _) = start_dpu(&base_args, dpu_ns)?;
    let r = run_mode(
        &format!("{prefix}b"),
        "dds",
        &where_b,
        plan,
        Some(&dpu),
        Front::Host,
        false,
        points,
    );
    let _ = dpu.stop(STOP_GRACE);
    r?;
    Ok(DdsSetup {
        dpu_args: base_args,
        where_b,
        socket,
    })
}

/// Modes (a), (b) and (c) on `work`, then mode (c) in copy mode when `copy_mode`.
fn run_remote_in(
    a: &RemoteArgs,
    plan: &Plan,
    place: &Placement,
    work: &Path,
    copy_mode: bool,
) -> Result<RemoteRun> {
    let started = Instant::now();
    eprintln!(
        "dds bench remote: {EMULATION_NOTE}; {}.",
        placement_text(place, "`dds dpu`")
    );
    let mut points = Vec::new();
    let DdsSetup {
        dpu_args: base_args,
        where_b,
        ..
    } = run_a_and_b(a, plan, place, work, "", None, &mut points)?;
    // (c) DDS offload: the DPU's traffic director in front of the host server of mode (b),
    // reads served on the DPU; zero copy, then the copy mode for Fig. 20 (reads only).
    let mut c_unavailable = None;
    let mut director_stats = serde_json::Map::new();
    let copies: &[(&str, bool)] = if copy_mode {
        &[("c", false), ("c-copy", true)]
    } else {
        &[("c", false)]
    };
    for &(mode, copy) in copies {
        let mut args = base_args.clone();
        match offload_dpu_args(&mut args, copy) {
            Ok(()) => {
                let (mut dpu, stats, director) = start_dpu(&args, None)?;
                let director = director.context("dds dpu's ready line names no director")?;
                let r = run_mode(
                    mode,
                    "dds",
                    &where_b,
                    plan,
                    Some(&dpu),
                    Front::Director { director },
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
                c_unavailable =
                    Some(json!({"available": false, "label": "DDS offload", "reason": why}));
                break;
            }
        }
    }
    Ok((
        points,
        c_unavailable,
        Value::Object(director_stats),
        started.elapsed().as_secs_f64(),
    ))
}

/// The pass of the modes with their files on the RAM-backed directory `dir` (reads only, no
/// copy-mode pass): its points, modes named as in the main pass. `Ok(None)` when `dir` is not
/// a directory.
fn run_memdev(
    a: &RemoteArgs,
    plan: &Plan,
    place: &Placement,
    dir: &Path,
) -> Result<Option<Vec<Value>>> {
    if !dir.is_dir() {
        eprintln!(
            "dds bench remote: {} is not a directory: no RAM-backed pass",
            dir.display()
        );
        return Ok(None);
    }
    let work = dir.join(format!("dds-remote-bench-mem-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    eprintln!(
        "dds bench remote: the modes again, reads only, files on {} (RAM-backed)",
        dir.display()
    );
    let reads_only = Plan {
        ns: None,
        connections: plan.connections.clone(),
        outstanding: plan.outstanding.clone(),
        writes: false,
        host_cpus: plan.host_cpus.clone(),
        ..*plan
    };
    let r = place
        .pin_host()
        .and_then(|_pin| run_remote_in(a, &reads_only, place, &work, false));
    let _ = std::fs::remove_dir_all(&work);
    Ok(Some(r?.0))
}

/// The RAM-backed pass in the summary: its modes (`memdev.a`, `memdev.b`, `memdev.c`), the peak
/// reads of modes c and a there (`offload_over_baseline_peak_memdev`, each side's reads/s beside
/// it) and the target; its points join the report's as `mem-a`, `mem-b`, `mem-c`. Without the
/// pass (`None`: no such directory) the target is listed, unmet.
fn memdev_summary(
    summary: &mut Value,
    dir: &str,
    mem: Option<Vec<Value>>,
    all_points: &mut Vec<Value>,
) {
    use crate::report::{ratio, Target};
    let mem = mem.unwrap_or_default();
    let peak = |mode: &str| peak_read(&mem, mode).map(|p| f(p, "throughput"));
    let (a, c) = (peak("a"), peak("c"));
    let r = match (a, c) {
        (Some(a), Some(c)) => ratio(c, a),
        _ => 0.0,
    };
    summary["memdev"] = json!({
        "dir": dir,
        "available": !mem.is_empty(),
        "a": summarize(&mem, "a", "TCP + OS files on a RAM-backed directory"),
        "b": summarize(&mem, "b", "TCP + DDS files on a RAM-backed directory"),
        "c": summarize(&mem, "c", "DDS offload, device file on a RAM-backed directory"),
    });
    summary["offload_over_baseline_peak_memdev"] = json!(r);
    summary["baseline_peak_reads_per_sec_memdev"] = json!(a);
    summary["offload_peak_reads_per_sec_memdev"] = json!(c);
    let mut t = Target::at_least("offload_over_baseline_peak_memdev", r, 1.0);
    t.met &= a.is_some() && c.is_some();
    if let Some(ts) = summary["targets"].as_array_mut() {
        ts.push(serde_json::to_value(t).expect("a target"));
    }
    for mut p in mem {
        let m = format!("mem-{}", p["mode"].as_str().unwrap_or(""));
        p["mode"] = json!(m);
        all_points.push(p);
    }
}

/// The read point of `mode` with the most throughput.
fn peak_read<'a>(points: &'a [Value], mode: &str) -> Option<&'a Value> {
    points
        .iter()
        .filter(|p| p["mode"] == mode && p["op"] == "read")
        .max_by(|x, y| f(x, "throughput").total_cmp(&f(y, "throughput")))
}

/// The summary of a run: each mode's figures (`a`, `b`, `c`, `c_copy`), the offload-vs-baseline
/// ratios and their `targets`, the traffic director's counters (`director`: requests served on
/// the DPU, `offloaded`, or sent to the host, `forwarded`; `fallback` = reads forwarded because
/// the DPU's file port was full; over all points of the mode, warm-up included).
fn remote_summary(
    points: &[Value],
    c_unavailable: Option<Value>,
    director: Value,
    elapsed_s: f64,
    rounds: &[[f64; 3]],
) -> Value {
    let c = c_unavailable.unwrap_or_else(|| summarize(points, "c", "DDS offload"));
    let c_copy = if points.iter().any(|p| p["mode"] == "c-copy") {
        summarize(points, "c-copy", "DDS offload, copy mode")
    } else {
        json!({"available": false, "label": "DDS offload, copy mode"})
    };
    let (mut ratios, mut targets) = offload_ratios(points);
    if rounds.len() > 1 {
        // Medians over the rounds (the first round's points are in `points`).
        // Modes a and c ran (in every round, as in the first): the peak ratio is positive.
        let available = ratios[0] > 0.0;
        for (k, r) in ratios.iter_mut().enumerate() {
            let mut v: Vec<f64> = rounds.iter().map(|x| x[k]).collect();
            v.sort_by(f64::total_cmp);
            *r = v[v.len() / 2];
        }
        targets = ratio_targets(ratios, available);
    }
    let per_round = |k: usize| rounds.iter().map(|r| r[k]).collect::<Vec<f64>>();
    // Each side's own CPU per read at its peak beside the CPU ratio (first round).
    let cpu_us = |mode: &str, key: &str| peak_read(points, mode).map(|p| f(p, key));
    json!({
        "a": summarize(points, "a", "TCP + OS files"),
        "b": summarize(points, "b", "TCP + DDS files"),
        "c": c,
        "c_copy": c_copy,
        "offload_over_baseline_peak": ratios[0],
        "offload_dpu_cpu_over_baseline_host_cpu": ratios[1],
        "offload_dpu_cpu_us_per_read": cpu_us("c", "dpu_cpu_us_per_op"),
        "baseline_host_cpu_us_per_read": cpu_us("a", "host_cpu_us_per_op"),
        "offload_p50_over_baseline_p50": ratios[2],
        "targets": targets,
        "rounds": rounds.len(),
        "offload_over_baseline_peak_rounds": per_round(0),
        "offload_dpu_cpu_over_baseline_host_cpu_rounds": per_round(1),
        "offload_p50_over_baseline_p50_rounds": per_round(2),
        "director": director,
        "elapsed_s": elapsed_s,
    })
}

/// The netns run's figures in the summary: each mode's (`netns.a`, `netns.b`, `netns.c`),
/// `netns_offload_over_direct_peak` (peak reads of mode c through the steered topology against
/// mode c of the same run on loopback, its clients connecting to the director's port),
/// `netns_bypass_flows_seen_by_director`, and their targets.
fn netns_summary(summary: &mut Value, loopback: &[Value], n: &netns::NetnsRun) {
    use crate::report::{ratio, Target};
    let peak = |points: &[Value], mode: &str| {
        points
            .iter()
            .filter(|p| p["mode"] == mode && p["op"] == "read")
            .map(|p| f(p, "throughput"))
            .fold(0.0f64, f64::max)
    };
    let r = ratio(peak(&n.points, "netns-c"), peak(loopback, "c"));
    summary["netns"] = json!({
        "a": summarize(&n.points, "netns-a", "TCP + OS files, through the namespaces"),
        "b": summarize(&n.points, "netns-b", "TCP + DDS files, through the namespaces"),
        "c": summarize(&n.points, "netns-c", "DDS offload, flows steered by the DPU's rules"),
        "director": n.director,
    });
    summary["netns_offload_over_direct_peak"] = json!(r);
    summary["netns_bypass_flows_seen_by_director"] = json!(n.bypass_seen);
    if let Some(t) = summary["targets"].as_array_mut() {
        for target in [
            Target::at_least("netns_offload_over_direct_peak", r, 0.9),
            Target::at_most(
                "netns_bypass_flows_seen_by_director",
                n.bypass_seen as f64,
                0.0,
            ),
        ] {
            t.push(serde_json::to_value(target).expect("a target"));
        }
    }
}

/// DDS offload (mode c) against the baseline (mode a), reads: peak throughput, CPU per read
/// (the DPU's against the host's) and p50 at the load where the baseline peaks; with their
/// targets, named as the summary's keys (0 and unmet when a mode is missing).
fn offload_ratios(points: &[Value]) -> ([f64; 3], Vec<crate::report::Target>) {
    use crate::report::ratio;
    let reads = |mode: &'static str| {
        points
            .iter()
            .filter(move |p| p["mode"] == mode && p["op"] == "read")
    };
    let peak = |mode: &'static str| peak_read(points, mode);
    let r = match (peak("a"), peak("c")) {
        (Some(a), Some(c)) => {
            let same_load = |p: &&Value| {
                ["connections", "outstanding", "host_cores", "batch"]
                    .iter()
                    .all(|k| p[*k] == a[*k])
            };
            let c_at_a = reads("c").find(same_load);
            [
                ratio(f(c, "throughput"), f(a, "throughput")),
                ratio(f(c, "dpu_cpu_us_per_op"), f(a, "host_cpu_us_per_op")),
                c_at_a.map_or(0.0, |c| ratio(f(c, "p50_us"), f(a, "p50_us"))),
            ]
        }
        _ => [0.0; 3],
    };
    let available = peak("a").is_some() && peak("c").is_some();
    (r, ratio_targets(r, available))
}

/// The targets of the three offload ratios (none met when mode a or c is missing).
fn ratio_targets(r: [f64; 3], available: bool) -> Vec<crate::report::Target> {
    use crate::report::Target;
    let mut targets = vec![
        Target::at_least("offload_over_baseline_peak", r[0], 1.5),
        Target::at_most("offload_dpu_cpu_over_baseline_host_cpu", r[1], 0.8),
        Target::at_most("offload_p50_over_baseline_p50", r[2], 0.5),
    ];
    if !available {
        for t in &mut targets {
            t.met = false;
        }
    }
    targets
}

/// The modes at the summary's load point, as printed at the end of a run.
fn remote_table(summary: &Value) -> Table {
    let mut t = Table::new(
        "Remote storage, reads at the highest load of the sweep (most host cores)",
        &[
            "mode",
            "req/s",
            "p50 µs",
            "p99 µs",
            "host µs/op",
            "DPU µs/op",
            "peak req/s",
        ],
    );
    for m in ["a", "b", "c", "c_copy"] {
        let s = &summary[m];
        let label = s["label"].as_str().unwrap_or(m).to_string();
        if s["available"] == true {
            t.row(vec![
                label,
                fmt_num(f(s, "throughput")),
                fmt_num(f(s, "p50_us")),
                fmt_num(f(s, "p99_us")),
                fmt_num(f(s, "host_cpu_us_per_op")),
                fmt_num(f(s, "dpu_cpu_us_per_op")),
                fmt_num(f(s, "peak_read_throughput")),
            ]);
        } else {
            let why = s["reason"].as_str().unwrap_or("not run");
            t.row(vec![format!("{label} (not available: {why})")]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(mode: &str, outstanding: u64, throughput: f64, cpu: f64, p50: f64) -> Value {
        json!({
            "mode": mode, "op": "read", "host_cores": 1, "connections": 2, "batch": 8,
            "outstanding": outstanding, "throughput": throughput, "p50_us": p50, "p99_us": p50 * 2.0,
            "host_cpu_us_per_op": cpu, "dpu_cpu_us_per_op": cpu,
        })
    }

    #[test]
    fn the_summary_carries_the_documented_keys_and_targets() {
        let points = vec![
            point("a", 1, 10_000.0, 4.0, 100.0),
            point("a", 16, 40_000.0, 4.0, 400.0),
            point("c", 1, 20_000.0, 2.0, 50.0),
            point("c", 16, 80_000.0, 2.0, 100.0),
        ];
        let s = remote_summary(&points, None, json!({}), 1.0, &[]);
        let keys = [
            "offload_over_baseline_peak",
            "offload_dpu_cpu_over_baseline_host_cpu",
            "offload_p50_over_baseline_p50",
        ];
        assert_eq!(s[keys[0]], 2.0);
        assert_eq!(s[keys[1]], 0.5);
        assert_eq!(s[keys[2]], 0.25);
        assert_eq!(s["offload_dpu_cpu_us_per_read"], 2.0);
        assert_eq!(s["baseline_host_cpu_us_per_read"], 4.0);
        let targets = s["targets"].as_array().unwrap();
        let names: Vec<&str> = targets
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, keys);
        for t in targets {
            for k in ["name", "goal", "op", "measured", "met"] {
                assert!(!t[k].is_null(), "target lacks {k}: {t}");
            }
            assert_eq!(t["met"], true, "{t}");
            assert_eq!(t["measured"], s[t["name"].as_str().unwrap()]);
        }
        for m in ["a", "c"] {
            assert_eq!(s[m]["available"], true);
        }
        assert_eq!(s["c_copy"]["available"], false);
        // Without mode (c) the targets are still listed, unmet.
        let s = remote_summary(
            &points[..2],
            Some(json!({"available": false, "label": "DDS offload", "reason": "x"})),
            Value::Null,
            1.0,
            &[],
        );
        let targets = s["targets"].as_array().unwrap();
        assert_eq!(targets.len(), 3);
        assert!(targets.iter().all(|t| t["met"] == false));
        assert_eq!(remote_table(&s).rows.len(), 4);
    }

    #[test]
    fn the_ram_backed_pass_gives_its_peak_ratio_target_and_points() {
        let base = vec![
            point("a", 16, 40_000.0, 4.0, 400.0),
            point("c", 16, 80_000.0, 2.0, 100.0),
        ];
        let mut s = remote_summary(&base, None, json!({}), 1.0, &[]);
        let mem = vec![
            point("a", 1, 50_000.0, 4.0, 100.0),
            point("a", 16, 200_000.0, 4.0, 100.0),
            point("c", 16, 150_000.0, 2.0, 100.0),
        ];
        let mut all = base.clone();
        memdev_summary(&mut s, "/dev/shm", Some(mem), &mut all);
        assert_eq!(s["offload_over_baseline_peak_memdev"], 0.75);
        assert_eq!(s["baseline_peak_reads_per_sec_memdev"], 200_000.0);
        assert_eq!(s["offload_peak_reads_per_sec_memdev"], 150_000.0);
        assert_eq!(s["memdev"]["a"]["available"], true);
        let t = s["targets"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(t["name"], "offload_over_baseline_peak_memdev");
        assert_eq!(t["met"], false);
        let modes: Vec<&str> = all.iter().map(|p| p["mode"].as_str().unwrap()).collect();
        assert_eq!(modes, ["a", "c", "mem-a", "mem-a", "mem-c"]);
        // Without the pass the target is listed, unmet.
        let mut s = remote_summary(&base, None, json!({}), 1.0, &[]);
        memdev_summary(&mut s, "/nonexistent", None, &mut Vec::new());
        let t = s["targets"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(t["name"], "offload_over_baseline_peak_memdev");
        assert_eq!(t["met"], false);
        assert_eq!(s["memdev"]["available"], false);
    }

    #[test]
    fn with_several_rounds_the_ratios_and_targets_are_the_rounds_medians() {
        let points = vec![
            point("a", 16, 40_000.0, 4.0, 400.0),
            point("c", 16, 80_000.0, 2.0, 100.0),
        ];
        let rounds = [[1.0, 1.3, 1.0], [1.6, 1.1, 0.4], [1.2, 1.0, 0.45]];
        let s = remote_summary(&points, None, json!({}), 1.0, &rounds);
        assert_eq!(s["offload_over_baseline_peak"], 1.2);
        assert_eq!(s["offload_dpu_cpu_over_baseline_host_cpu"], 1.1);
        assert_eq!(s["offload_p50_over_baseline_p50"], 0.45);
        assert_eq!(s["rounds"], 3);
        assert_eq!(
            s["offload_dpu_cpu_over_baseline_host_cpu_rounds"],
            json!([1.3, 1.1, 1.0])
        );
        let met: Vec<bool> = s["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["met"].as_bool().unwrap())
            .collect();
        assert_eq!(met, [false, false, true]);
    }
}
