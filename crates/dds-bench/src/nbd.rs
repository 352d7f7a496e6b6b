//! `dds bench nbd`: block storage over NBD, fio's `nbd` engine against, in one run:
//!
//! - `dds-nbd`: `dds dpu` (no offload engine) + `dds nbd` exporting a DDS file;
//! - `dds-nbd-offload`: `dds dpu --offload nbd` + `dds nbd`, fio connecting to the DPU's
//!   traffic director, which serves READs on the DPU (`docs/nbd.md` §6);
//! - `nbdkit`: `nbdkit file` serving a plain file (`cache=none`) on the same disk;
//! - `qemu-nbd`: `qemu-nbd` serving the same kind of file (`--cache=none --aio=io_uring`).
//!
//! 4 KiB random reads and a 70/30 random read/write mix at queue depths 1, 16 and 64 (quick:
//! 16 and 64): IOPS, read p50/p99 latency, and CPU seconds per I/O of each server's processes,
//! host and DPU apart. The DPU runs on a core of its own; the servers and fio on the others.
//! There is no DPU hardware: the DPU is the `dds dpu` process with an emulated DMA engine.
//! The offload targets compare the offload row at depth 16 with the others.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::kv::{free_port, listening_on, spawn_dpu, taskset, wait_port};
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, ratio, Report, Table, Target};

/// Settings of `dds bench nbd`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct NbdBenchArgs {
    /// Short run: depths 16 and 64, 2 s per point, a 256 MiB export.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Scratch directory of the device and the plain files (one disk for every server).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Seconds per point (default 5; quick 2).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Queue depths, swept (default 1,16,64; quick 16,64).
    #[arg(long, value_delimiter = ',')]
    pub depths: Vec<usize>,
    /// Export size in MiB (default 1024; quick 256).
    #[arg(long)]
    pub size_mib: Option<u64>,
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

const SERVERS: [&str; 4] = ["dds-nbd", "dds-nbd-offload", "nbdkit", "qemu-nbd"];
const WORKLOADS: [(&str, &str); 2] = [("randread", "randread"), ("randrw70", "randrw")];

/// A server under test: its processes (host, and the DPU for `dds-nbd`) and its URI.
struct Side {
    host: ChildGuard,
    dpu: Option<ChildGuard>,
    uri: String,
}

fn start(
    name: &str,
    dir: &Path,
    size_mib: u64,
    a: &NbdBenchArgs,
    place: &Placement,
) -> Result<Side> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let host_cpus = place.host_cpus.as_deref();
    let file = dir.join("plain.img");
    let offload = name == "dds-nbd-offload";
    if !name.starts_with("dds-nbd") {
        let f = std::fs::File::create(&file)?;
        f.set_len(size_mib << 20)?;
    }
    let port = free_port()?;
    let (host, dpu, uri) = match name {
        "dds-nbd" | "dds-nbd-offload" => {
            let device = format!("{}M", size_mib + 256);
            let extra: Vec<String> = if offload {
                ["--offload", "nbd", "--director-listen", "127.0.0.1:0"]
                    .map(String::from)
                    .to_vec()
            } else {
                Vec::new()
            };
            let (dpu, socket, director) =
                spawn_dpu(&exe, dir, &device, &a.dma_cost, &extra, place)?;
            let child = taskset(&exe, host_cpus)
                .args(["nbd", "--listen", "127.0.0.1:0", "--socket"])
                .arg(&socket)
                .args(["--export", &format!("disk={size_mib}M")])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("start dds nbd")?;
            let mut host = ChildGuard::new(child, "dds nbd");
            let addr = listening_on(&host.ready_line(Duration::from_secs(30))?)?;
            // With offload, clients connect to the director (`dds nbd` announced itself to it).
            let addr = match director {
                Some(d) if offload => d,
                _ if offload => bail!("dds dpu --offload nbd reported no director"),
                _ => addr,
            };
            (host, Some(dpu), format!("nbd://{addr}/disk"))
        }
        "nbdkit" => {
            let child = taskset(Path::new("nbdkit"), host_cpus)
                .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string(), "file"])
                .arg(&file)
                .arg("cache=none")
                .stdout(Stdio::null())
                .spawn()
                .context("start nbdkit (package nbdkit)")?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            wait_port(addr)?;
            (
                ChildGuard::new(child, "nbdkit"),
                None,
                format!("nbd://{addr}/"),
            )
        }
        _ => {
            let child = taskset(Path::new("qemu-nbd"), host_cpus)
                .args([
                    "-b",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-f",
                    "raw",
                    "-t",
                ])
                .args(["--cache=none", "--aio=io_uring"])
                .arg(&file)
                .stdout(Stdio::null())
                // It complains about the readiness probe's connection.
                .stderr(Stdio::null())
                .spawn()
                .context("start qemu-nbd (package qemu-utils)")?;
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            wait_port(addr)?;
            (
                ChildGuard::new(child, "qemu-nbd"),
                None,
                format!("nbd://{addr}/"),
            )
        }
    };
    Ok(Side { host, dpu, uri })
}

/// One fio run; returns its job's JSON.
fn fio(uri: &str, dir: &Path, args: &[String], cpus: Option<&[usize]>) -> Result<Value> {
    let out = dir.join("fio.json");
    let st = taskset(Path::new("fio"), cpus)
        .args(["--name=nbd", "--ioengine=nbd", &format!("--uri={uri}")])
        .args([
            "--output-format=json",
            &format!("--output={}", out.display()),
        ])
        .args(args)
        .stdout(Stdio::null())
        .status()
        .context("run fio (package fio)")?;
    if !st.success() {
        bail!("fio {args:?} on {uri} failed");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let job = v["jobs"][0].clone();
    if job["error"] != 0 {
        bail!("fio {args:?} on {uri}: error {}", job["error"]);
    }
    Ok(job)
}

#[derive(Clone, Debug, Serialize)]
struct Point {
    server: &'static str,
    workload: &'static str,
    depth: usize,
    iops: f64,
    read_p50_us: f64,
    read_p99_us: f64,
    /// CPU seconds per I/O of the server's host process.
    host_cpu_per_io: f64,
    /// ... and of the DPU process (dds-nbd only).
    dpu_cpu_per_io: f64,
}

fn percentile_us(job: &Value, p: &str) -> f64 {
    job["read"]["clat_ns"]["percentile"][p]
        .as_f64()
        .unwrap_or(f64::NAN)
        / 1000.0
}

/// Runs the benchmark.
pub fn run(a: NbdBenchArgs, command: String) -> Result<Report> {
    let secs = a.seconds.unwrap_or(if a.quick { 2.0 } else { 5.0 });
    let size_mib = a.size_mib.unwrap_or(if a.quick { 256 } else { 1024 });
    let depths = if a.depths.is_empty() {
        if a.quick {
            vec![16, 64]
        } else {
            vec![1, 16, 64]
        }
    } else {
        a.depths.clone()
    };
    let machine = Machine::detect();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let place = Placement::plan(nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let mut points: Vec<Point> = Vec::new();
    for &server in &SERVERS {
        eprintln!("dds bench nbd: {server} ...");
        let dir = match &a.work {
            Some(w) => tempfile::tempdir_in(w)?,
            None => tempfile::tempdir()?,
        };
        let mut side = start(server, dir.path(), size_mib, &a, &place)?;
        let host_cpus = place.host_cpus.as_deref();
        // Every block written once, so reads read data.
        fio(
            &side.uri,
            dir.path(),
            &[
                "--rw=write".into(),
                "--bs=1m".into(),
                "--iodepth=4".into(),
                format!("--size={size_mib}M"),
            ],
            host_cpus,
        )?;
        for (workload, rw) in WORKLOADS {
            for &depth in &depths {
                let c0 = side.host.cpu_seconds();
                let d0 = side.dpu.as_ref().map_or(0.0, ChildGuard::cpu_seconds);
                let job = fio(
                    &side.uri,
                    dir.path(),
                    &[
                        format!("--rw={rw}"),
                        "--rwmixread=70".into(),
                        "--bs=4k".into(),
                        format!("--iodepth={depth}"),
                        format!("--size={size_mib}M"),
                        "--time_based".into(),
                        format!("--runtime={secs}"),
                        "--ramp_time=1".into(),
                        "--norandommap".into(),
                        "--randrepeat=0".into(),
                    ],
                    host_cpus,
                )?;
                let host_cpu = side.host.cpu_seconds() - c0;
                let dpu_cpu = side.dpu.as_ref().map_or(0.0, ChildGuard::cpu_seconds) - d0;
                let ios = job["read"]["total_ios"].as_f64().unwrap_or(0.0)
                    + job["write"]["total_ios"].as_f64().unwrap_or(0.0);
                let iops = job["read"]["iops"].as_f64().unwrap_or(0.0)
                    + job["write"]["iops"].as_f64().unwrap_or(0.0);
                // CPU counted over the ramp too: the I/Os of the ramp are estimated from the
                // rate.
                let ios_all = ios + iops;
                let p = Point {
                    server,
                    workload,
                    depth,
                    iops,
                    read_p50_us: percentile_us(&job, "50.000000"),
                    read_p99_us: percentile_us(&job, "99.000000"),
                    host_cpu_per_io: ratio(host_cpu, ios_all),
                    dpu_cpu_per_io: ratio(dpu_cpu, ios_all),
                };
                eprintln!(
                    "  {workload} depth {depth}: {} IOPS, p99 {} µs",
                    fmt_num(p.iops),
                    fmt_num(p.read_p99_us)
                );
                points.push(p);
            }
        }
        side.host.stop(Duration::from_secs(10))?;
        if let Some(mut d) = side.dpu.take() {
            d.stop(Duration::from_secs(10))?;
        }
    }
    Ok(report(a, command, machine, place, points, &depths))
}

fn report(
    a: NbdBenchArgs,
    command: String,
    machine: Machine,
    place: Placement,
    points: Vec<Point>,
    depths: &[usize],
) -> Report {
    let at = |server: &str, workload: &str, depth: usize| {
        points
            .iter()
            .find(|p| p.server == server && p.workload == workload && p.depth == depth)
    };
    let d16 = if depths.contains(&16) {
        16
    } else {
        depths[depths.len() / 2]
    };
    let get = |server: &str, f: fn(&Point) -> f64| at(server, "randread", d16).map_or(f64::NAN, f);
    let dds_iops = get("dds-nbd", |p| p.iops);
    let no_offload_over_nbdkit = ratio(dds_iops, get("nbdkit", |p| p.iops));
    let no_offload_over_qemu = ratio(dds_iops, get("qemu-nbd", |p| p.iops));
    let no_offload_p99_over_nbdkit = ratio(
        get("dds-nbd", |p| p.read_p99_us),
        get("nbdkit", |p| p.read_p99_us),
    );
    let off = "dds-nbd-offload";
    let offload_host_cpu = ratio(
        get(off, |p| p.host_cpu_per_io),
        get("dds-nbd", |p| p.host_cpu_per_io),
    );
    let offload_over_nbdkit = ratio(get(off, |p| p.iops), get("nbdkit", |p| p.iops));
    let offload_over_qemu = ratio(get(off, |p| p.iops), get("qemu-nbd", |p| p.iops));
    let offload_p99 = ratio(
        get(off, |p| p.read_p99_us),
        get("nbdkit", |p| p.read_p99_us),
    );
    let offload_dpu_cpu = ratio(
        get(off, |p| p.dpu_cpu_per_io),
        get("nbdkit", |p| p.host_cpu_per_io),
    );
    let targets = vec![
        Target::at_most(
            "offload_host_cpu_per_read_over_no_offload",
            offload_host_cpu,
            0.02,
        ),
        Target::at_least("offload_over_nbdkit_iops", offload_over_nbdkit, 1.0),
        Target::at_least("offload_over_qemu_nbd_iops", offload_over_qemu, 1.0),
        Target::at_most("offload_p99_over_nbdkit_p99", offload_p99, 1.0),
        Target::at_most(
            "offload_dpu_cpu_per_read_over_nbdkit_cpu_per_read",
            offload_dpu_cpu,
            1.0,
        ),
    ];
    let summary = json!({
        "depth": d16,
        "no_offload_randread_iops": dds_iops,
        "nbdkit_randread_iops": get("nbdkit", |p| p.iops),
        "qemu_nbd_randread_iops": get("qemu-nbd", |p| p.iops),
        "no_offload_over_nbdkit_iops": no_offload_over_nbdkit,
        "no_offload_over_qemu_nbd_iops": no_offload_over_qemu,
        "no_offload_p99_over_nbdkit_p99": no_offload_p99_over_nbdkit,
        "no_offload_host_cpu_per_read": get("dds-nbd", |p| p.host_cpu_per_io),
        "no_offload_dpu_cpu_per_read": get("dds-nbd", |p| p.dpu_cpu_per_io),
        "nbdkit_cpu_per_read": get("nbdkit", |p| p.host_cpu_per_io),
        "qemu_nbd_cpu_per_read": get("qemu-nbd", |p| p.host_cpu_per_io),
        "offload_randread_iops": get(off, |p| p.iops),
        "offload_randread_p99_us": get(off, |p| p.read_p99_us),
        "nbdkit_randread_p99_us": get("nbdkit", |p| p.read_p99_us),
        "offload_host_cpu_per_read": get(off, |p| p.host_cpu_per_io),
        "offload_dpu_cpu_per_read": get(off, |p| p.dpu_cpu_per_io),
        "offload_host_cpu_per_read_over_no_offload": offload_host_cpu,
        "offload_over_nbdkit_iops": offload_over_nbdkit,
        "offload_over_qemu_nbd_iops": offload_over_qemu,
        "offload_p99_over_nbdkit_p99": offload_p99,
        "offload_dpu_cpu_per_read_over_nbdkit_cpu_per_read": offload_dpu_cpu,
        "targets": targets,
    });
    let mut t = Table::new(
        "NBD: fio 4 KiB random I/O (randrw70: 70% reads)",
        &[
            "server",
            "workload",
            "depth",
            "IOPS",
            "read p50 µs",
            "read p99 µs",
            "host CPU µs/IO",
            "DPU CPU µs/IO",
        ],
    );
    for p in &points {
        t.row(vec![
            p.server.into(),
            p.workload.into(),
            p.depth.to_string(),
            fmt_num(p.iops),
            fmt_num(p.read_p50_us),
            fmt_num(p.read_p99_us),
            fmt_num(p.host_cpu_per_io * 1e6),
            fmt_num(p.dpu_cpu_per_io * 1e6),
        ]);
    }
    let note = format!(
        "{}; DPU emulated, DMA cost model {}",
        machine.line(),
        cost_model_text(a.dma_cost != "off")
    );
    let series = |workload: &str, f: fn(&Point) -> f64| -> Vec<Series> {
        SERVERS
            .iter()
            .map(|&s| Series {
                name: s.into(),
                points: points
                    .iter()
                    .filter(|p| p.server == s && p.workload == workload)
                    .map(|p| (p.depth as f64, f(p)))
                    .collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let chart = |file: &str, title: &str, y: &str, workload: &str, f: fn(&Point) -> f64| {
        let s = series(workload, f);
        LineChart {
            file: file.into(),
            title: title.into(),
            note: note.clone(),
            x_label: "queue depth".into(),
            y_label: y.into(),
            log_y: crate::plot::spans_decades(s.iter().flat_map(|s| s.points.iter().map(|p| p.1))),
            series: s,
        }
    };
    let charts = vec![
        chart(
            "nbd_randread_iops.png",
            "NBD 4 KiB random reads",
            "IOPS",
            "randread",
            |p| p.iops,
        ),
        chart(
            "nbd_randread_p99.png",
            "NBD 4 KiB random reads: p99",
            "p99 µs",
            "randread",
            |p| p.read_p99_us,
        ),
        chart(
            "nbd_randrw_iops.png",
            "NBD 4 KiB random 70/30 read/write",
            "IOPS",
            "randrw70",
            |p| p.iops,
        ),
        chart(
            "nbd_cpu_per_io.png",
            "NBD random reads: server host CPU per I/O",
            "host CPU s/IO",
            "randread",
            |p| p.host_cpu_per_io,
        ),
    ];
    Report {
        benchmark: "nbd".into(),
        command,
        dpu_emulation: format!(
            "emulated: `dds dpu` runs as a separate process on its own core and reaches host \
             memory only through the emulated DMA engine; DMA cost model {}",
            cost_model_text(a.dma_cost != "off")
        ),
        machine,
        config: json!({"args": a, "placement": place, "depths": depths}),
        summary,
        points: Value::Array(points.iter().map(|p| json!(p)).collect()),
        tables: vec![t],
        charts,
        panels: Vec::new(),
    }
}
