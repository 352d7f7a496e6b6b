//! `dds bench dpu-kv`: DPU-KV's six placements side by side in one run (the DPU-KV paper's
//! Figs. of throughput, latency and host cores), with `redis-server` on the same load.
//!
//! Every DPU-side design gets the same DPU profile: the `dds dpukv dpu` process pinned to the
//! DPU's cores (default the last CPU) with the emulated PCIe cost model on; host processes and
//! the load generator run on the other cores. YCSB A (50/50), B (95/5) and C (100/0) on 8-byte
//! keys and values, uniform and zipf 0.99, from pipelined connections; latency is measured per
//! request from send to reply (replies come in request order, as an echoed timestamp would).
//! There is no DPU hardware: the DPU is a process with an emulated DMA engine.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use dds_dpukv::cluster::{key_slot, SLOTS};

use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::kv::load::{key, push_cmd, read_reply, run_routed, value, Dist, LoadSpec};
use crate::kv::{start_redis, taskset};
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, ratio, Report, Table, Target};

/// Settings of `dds bench dpu-kv`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct DpuKvArgs {
    /// Short run: fewer keys, points and seconds.
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keys (default 1M; quick 100K).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Seconds per load point (default 4; quick 1.5).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Client connections of the throughput-latency sweep (default 1,4,16; quick 1,8).
    #[arg(long, value_delimiter = ',')]
    pub connections: Vec<usize>,
    /// Commands in flight per connection at the saturating points.
    #[arg(long, default_value_t = 16)]
    pub depth: usize,
    /// Threads of the load generator (each drives its share of the connections from one event
    /// loop).
    #[arg(long, default_value_t = 1)]
    pub load_threads: usize,
    /// DPU communication cores to scale over (each ≤ the DPU's CPUs; default 1,2,4 capped).
    #[arg(long, value_delimiter = ',')]
    pub comm_cores: Vec<u32>,
    /// Emulated PCIe DMA costs in the DPU (on or off).
    #[arg(long, default_value = "on")]
    pub dma_cost: String,
    /// CPUs of the DPU process (default: the last CPU).
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// CPU quota of the DPU process in cores (the same for every DPU-side design).
    #[arg(long)]
    pub dpu_cpu_quota: Option<f64>,
    /// Let the DPU share the host's cores.
    #[arg(long)]
    pub shared_cores: bool,
    /// Only these designs (default all: redis, cpu-only, dpu-only, lat, sav, dual, shrd); a
    /// target whose designs did not run is reported as not measured.
    #[arg(long, value_delimiter = ',')]
    pub designs: Vec<String>,
}

const DESIGNS: [&str; 7] = [
    "redis", "cpu-only", "dpu-only", "lat", "sav", "dual", "shrd",
];

struct Plan {
    keys: u64,
    seconds: f64,
    connections: Vec<usize>,
    depth: usize,
    load_threads: usize,
    comm: Vec<u32>,
}

fn plan(a: &DpuKvArgs, dpu_cores: usize) -> Plan {
    let mut comm: Vec<u32> = if a.comm_cores.is_empty() {
        vec![1, 2, 4]
    } else {
        a.comm_cores.clone()
    };
    comm.retain(|&c| c >= 1 && c as usize <= dpu_cores.max(1));
    if comm.is_empty() {
        comm.push(1);
    }
    Plan {
        keys: a.keys.unwrap_or(if a.quick { 100_000 } else { 1_000_000 }),
        seconds: a.seconds.unwrap_or(if a.quick { 1.5 } else { 4.0 }),
        connections: if a.connections.is_empty() {
            if a.quick {
                vec![1, 8]
            } else {
                vec![1, 4, 16]
            }
        } else {
            a.connections.clone()
        },
        depth: a.depth.max(1),
        load_threads: a.load_threads.max(1),
        comm,
    }
}

/// The processes of one design and its client endpoints.
struct Side {
    design: &'static str,
    dpu: Option<ChildGuard>,
    host: ChildGuard,
    endpoints: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

/// The stores' index: 24 bytes per key (MICA sizes the index to the keys and the log to the
/// memory), so that neither redis-server's table, sized by its keys, nor ours is handicapped
/// by its size. The log keeps the 1 GiB that every write of a run appends to.
fn store_index(keys: u64) -> String {
    (keys * 24).max(64 << 10).to_string()
}

fn start(
    design: &'static str,
    a: &DpuKvArgs,
    place: &Placement,
    comm: u32,
    keys: u64,
) -> Result<Side> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let dir = tempfile::tempdir()?;
    let host_cpus = place.host_cpus.as_deref();
    let host_n = host_cpus.map_or(1, |h| h.len()).max(1) as u32;
    if design == "redis" {
        let (host, addr) = start_redis(host_cpus, dir.path())?;
        return Ok(Side {
            design,
            dpu: None,
            host,
            endpoints: vec![addr],
            _dir: dir,
        });
    }
    let control = dir.path().join("dpukv.sock");
    let dpu = if design == "cpu-only" {
        None
    } else {
        let mut args: Vec<String> = vec![
            "dpukv".into(),
            "dpu".into(),
            "--control".into(),
            control.display().to_string(),
            "--cores".into(),
            comm.to_string(),
            "--dma-cost".into(),
            a.dma_cost.clone(),
            "--store-memory".into(),
            "1G".into(),
            "--store-index".into(),
            store_index(keys),
            "--partitions".into(),
            comm.to_string(),
            "--max-value".into(),
            "64".into(),
        ];
        args.extend(place.dpu_args());
        if let Some(q) = a.dpu_cpu_quota {
            args.extend(["--cpu-quota".into(), q.to_string()]);
        }
        let log = std::fs::File::create(dir.path().join("dpu.log"))?;
        let child = Command::new(&exe)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("start dds dpukv dpu")?;
        let g = ChildGuard::new(child, "dds dpukv dpu");
        let t0 = Instant::now();
        while !control.exists() {
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("dds dpukv dpu did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(g)
    };
    // Host cores per design (the paper's table): lat one worker per host core, sav and dual
    // one worker (dual adds front ends on the spare cores), cpu-only and shrd front ends on
    // every host core.
    let (workers, partitions, frontends) = match design {
        "lat" => (host_n, host_n, 1),
        "sav" => (1, host_n, 1),
        "dual" => (1, host_n, host_n.saturating_sub(1).max(1)),
        _ => (1, host_n, host_n),
    };
    let mut args: Vec<String> = vec![
        "dpukv".into(),
        "host".into(),
        "--design".into(),
        design.into(),
        "--workers".into(),
        workers.to_string(),
        "--partitions".into(),
        partitions.to_string(),
        "--frontends".into(),
        frontends.to_string(),
        "--comm-cores".into(),
        comm.to_string(),
        "--store-memory".into(),
        "1G".into(),
        "--store-index".into(),
        store_index(keys),
        "--max-value".into(),
        "64".into(),
    ];
    if dpu.is_some() {
        args.extend(["--dpu".into(), control.display().to_string()]);
    }
    let mut child = taskset(&exe, host_cpus)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("host.log"))?)
        .spawn()
        .context("start dds dpukv host")?;
    let out = child.stdout.take().expect("piped");
    let host = ChildGuard::new(child, "dds dpukv host");
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line)
        .with_context(|| format!("dds dpukv host said {line:?} (see its log)"))?;
    let endpoints = v["endpoints"]
        .as_array()
        .context("endpoints")?
        .iter()
        .filter_map(|e| e["addr"].as_str()?.parse().ok())
        .collect::<Vec<SocketAddr>>();
    if endpoints.is_empty() {
        bail!("{design}: no endpoints");
    }
    Ok(Side {
        design,
        dpu,
        host,
        endpoints,
        _dir: dir,
    })
}

/// Which endpoint a key goes to on connection `c`: `shrd` by its Redis Cluster slot (the DPU
/// shard owns the lower half, as `dds dpukv` assigns them), `dual` by connection (clients
/// spread over the DPU's and the host's endpoints), the others the first endpoint.
fn route(design: &str, k: &[u8], c: usize, n: usize) -> usize {
    match design {
        "shrd" if n > 1 => usize::from(key_slot(k) >= SLOTS / 2),
        "dual" => c % n,
        _ => 0,
    }
}

#[derive(Clone, Debug, Default, Serialize)]
struct LoadOut {
    ops: u64,
    errors: u64,
    wrong: u64,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A closed-loop load: `conns` connections, `depth` commands in flight each, every command
/// sent to the endpoint its design routes it to.
fn load(
    side: &Side,
    p: &Plan,
    dist: Dist,
    read_fraction: f64,
    conns: usize,
    depth: usize,
) -> Result<LoadOut> {
    let n = side.endpoints.len();
    let design = side.design;
    let spec = LoadSpec {
        addr: side.endpoints[0],
        keys: p.keys,
        dist,
        read_fraction,
        connections: conns,
        depth,
        seconds: p.seconds,
        seed: 3,
        threads: p.load_threads,
    };
    let r = run_routed(&spec, &side.endpoints, &|k, c| route(design, k, c, n))?;
    Ok(LoadOut {
        ops: r.ops,
        errors: r.errors,
        wrong: r.wrong_values,
        ops_per_sec: r.ops_per_sec,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
    })
}

/// SETs every key, pipelined, routed as the load routes them.
fn preload(side: &Side, keys: u64) -> Result<()> {
    let n = side.endpoints.len();
    let mut socks = side
        .endpoints
        .iter()
        .map(|a| Ok((TcpStream::connect(a)?, Vec::new(), 0usize)))
        .collect::<Result<Vec<_>>>()?;
    let bar = crate::progress::bar(keys, false);
    bar.set_message(format!("{}: loading", side.design));
    let mut i = 0;
    while i < keys {
        let end = (i + 1000).min(keys);
        let mut outs: Vec<Vec<u8>> = vec![Vec::new(); n];
        let mut count = vec![0usize; n];
        for k in i..end {
            let e = route(side.design, &key(k), 0, n);
            push_cmd(&mut outs[e], &[b"SET", &key(k), &value(k)]);
            count[e] += 1;
        }
        for e in 0..n {
            socks[e].0.write_all(&outs[e])?;
        }
        for e in 0..n {
            let (s, buf, at) = &mut socks[e];
            for _ in 0..count[e] {
                if read_reply(s, buf, at)?.0 {
                    bail!("{}: SET failed while loading", side.design);
                }
            }
        }
        i = end;
        bar.set_position(i);
    }
    bar.finish_and_clear();
    Ok(())
}

/// CPU seconds and the DPU's KV queue pair counters.
#[derive(Clone, Copy, Default)]
struct Snap {
    host: f64,
    dpu: f64,
    dma_bytes: u64,
    dma_ops: u64,
    raw_bytes: u64,
    requests: u64,
    batches: u64,
    empty_polls: u64,
}

fn info_field(addr: SocketAddr, names: &[&str]) -> Vec<u64> {
    let mut out = vec![0; names.len()];
    let Ok(mut s) = TcpStream::connect(addr) else {
        return out;
    };
    let mut buf = Vec::new();
    let mut at = 0;
    if s.write_all(b"*1\r\n$4\r\nINFO\r\n").is_err() {
        return out;
    }
    let Ok((_, text)) = read_reply(&mut s, &mut buf, &mut at) else {
        return out;
    };
    let text = String::from_utf8_lossy(&text);
    for (i, n) in names.iter().enumerate() {
        out[i] = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{n}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
    }
    out
}

fn snap(side: &Side) -> Snap {
    let f = if side.dpu.is_some() && side.design != "dpu-only" {
        info_field(
            side.endpoints[0],
            &[
                "dma_bytes",
                "dma_ops",
                "raw_bytes",
                "kvqp_requests",
                "kvqp_batches",
                "kvqp_empty_polls",
            ],
        )
    } else {
        vec![0; 6]
    };
    Snap {
        host: process_cpu_seconds(side.host.pid()).unwrap_or(0.0),
        dpu: side
            .dpu
            .as_ref()
            .map(|d| process_cpu_seconds(d.pid()).unwrap_or(0.0))
            .unwrap_or(0.0),
        dma_bytes: f[0],
        dma_ops: f[1],
        raw_bytes: f[2],
        requests: f[3],
        batches: f[4],
        empty_polls: f[5],
    }
}

/// One measured point.
#[derive(Clone, Debug, Serialize)]
struct Point {
    design: &'static str,
    workload: &'static str,
    comm_cores: u32,
    connections: usize,
    depth: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// Host CPU time / wall time.
    host_cores: f64,
    dpu_cores: f64,
    host_cpu_us_per_op: f64,
    dpu_cpu_us_per_op: f64,
    /// Bytes that crossed the emulated PCIe per request (queue pair designs).
    dma_bytes_per_op: f64,
    dma_ops_per_op: f64,
    /// RESP bytes of the same requests and replies.
    raw_bytes_per_op: f64,
    /// Requests per request batch (queue pair designs).
    requests_per_batch: f64,
    /// Response reads that found no new batch, per batch.
    empty_polls_per_batch: f64,
    errors: u64,
}

const WORKLOADS: [(&str, Dist, f64); 4] = [
    ("ycsb-c-uniform", Dist::Uniform, 1.0),
    ("ycsb-b-uniform", Dist::Uniform, 0.95),
    ("ycsb-a-uniform", Dist::Uniform, 0.5),
    ("ycsb-c-zipf", Dist::Zipf(0.99), 1.0),
];

#[allow(clippy::too_many_arguments)]
fn measure(
    side: &Side,
    p: &Plan,
    workload: &'static str,
    dist: Dist,
    rf: f64,
    conns: usize,
    depth: usize,
    comm: u32,
) -> Result<Point> {
    let b = snap(side);
    let t = Instant::now();
    let r = load(side, p, dist, rf, conns, depth)?;
    let wall = t.elapsed().as_secs_f64();
    let a = snap(side);
    if r.wrong > 0 {
        bail!("{}: {} GETs returned a wrong value", side.design, r.wrong);
    }
    let ops = r.ops.max(1) as f64;
    let req = (a.requests - b.requests).max(1) as f64;
    let batches = (a.batches - b.batches).max(1) as f64;
    let pt = Point {
        design: side.design,
        workload,
        comm_cores: comm,
        connections: conns,
        depth,
        ops_per_sec: r.ops_per_sec,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        host_cores: (a.host - b.host) / wall,
        dpu_cores: (a.dpu - b.dpu) / wall,
        host_cpu_us_per_op: (a.host - b.host) * 1e6 / ops,
        dpu_cpu_us_per_op: (a.dpu - b.dpu) * 1e6 / ops,
        dma_bytes_per_op: (a.dma_bytes - b.dma_bytes) as f64 / req,
        dma_ops_per_op: (a.dma_ops - b.dma_ops) as f64 / req,
        raw_bytes_per_op: (a.raw_bytes - b.raw_bytes) as f64 / req,
        requests_per_batch: req / batches,
        empty_polls_per_batch: (a.empty_polls - b.empty_polls) as f64 / batches,
        errors: r.errors,
    };
    eprintln!(
        "  {:<9} {:<15} c{} {:>3}x{:<3} {:>10.0} ops/s p50 {:>6.0} µs p99 {:>6.0} µs host {:>4.2} cores ({:>6.2} µs/op) dpu {:>4.2} cores  PCIe {:>5.1} B/op {:>5.3} DMA/op (RESP {:>5.1} B/op) {:>5.1} req/batch {:>5.2} empty reads/batch",
        pt.design, workload, comm, conns, depth, pt.ops_per_sec, pt.p50_us, pt.p99_us,
        pt.host_cores, pt.host_cpu_us_per_op, pt.dpu_cores, pt.dma_bytes_per_op,
        pt.dma_ops_per_op, pt.raw_bytes_per_op, pt.requests_per_batch, pt.empty_polls_per_batch
    );
    Ok(pt)
}

/// Runs the benchmark.
pub fn run(a: DpuKvArgs, command: String) -> Result<Report> {
    let machine = Machine::detect();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let place = Placement::plan(nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let dpu_cores = place
        .dpu_cpus
        .as_deref()
        .map_or(nproc, |l| l.split(',').count());
    let p = plan(&a, dpu_cores);
    let _pin = place.pin_host()?;
    let cmax = *p.connections.iter().max().expect("connections");
    if let Some(d) = a.designs.iter().find(|d| !DESIGNS.contains(&d.as_str())) {
        bail!("unknown design {d:?} (one of {})", DESIGNS.join(", "));
    }
    let mut points = Vec::new();
    for design in DESIGNS {
        if !a.designs.is_empty() && !a.designs.iter().any(|d| d == design) {
            continue;
        }
        let comms: Vec<u32> = if design == "redis" || design == "cpu-only" {
            vec![1]
        } else {
            p.comm.clone()
        };
        for &comm in &comms {
            eprintln!("dds bench dpu-kv: {design} ({comm} communication cores) ...");
            let side = start(design, &a, &place, comm, p.keys)?;
            preload(&side, p.keys)?;
            // The throughput-latency sweep (YCSB C, uniform) and the other workloads at the
            // largest connection count, pipelined.
            for &c in &p.connections {
                points.push(measure(
                    &side,
                    &p,
                    "ycsb-c-uniform",
                    Dist::Uniform,
                    1.0,
                    c,
                    p.depth,
                    comm,
                )?);
            }
            if comm == p.comm[0] {
                for (w, dist, rf) in &WORKLOADS[1..] {
                    points.push(measure(&side, &p, w, *dist, *rf, cmax, p.depth, comm)?);
                }
                // Below saturation: one connection, one request in flight.
                points.push(measure(
                    &side,
                    &p,
                    "ycsb-c-light",
                    Dist::Uniform,
                    1.0,
                    1,
                    1,
                    comm,
                )?);
                points.push(measure(
                    &side,
                    &p,
                    "set-only",
                    Dist::Uniform,
                    0.0,
                    cmax,
                    p.depth,
                    comm,
                )?);
            }
            let mut side = side;
            let _ = side.host.stop(Duration::from_secs(5));
            if let Some(mut d) = side.dpu.take() {
                let _ = d.stop(Duration::from_secs(5));
            }
        }
    }
    Ok(report(&a, &p, command, machine, &place, points))
}

fn report(
    a: &DpuKvArgs,
    p: &Plan,
    command: String,
    machine: Machine,
    place: &Placement,
    points: Vec<Point>,
) -> Report {
    let cmax = *p.connections.iter().max().expect("connections");
    let c0 = p.comm[0];
    let at = |d: &str, w: &str, conns: usize| {
        points.iter().find(|x| {
            x.design == d && x.workload == w && x.connections == conns && x.comm_cores == c0
        })
    };
    let get = |d: &str, w: &str, conns: usize, f: &dyn Fn(&Point) -> f64| {
        at(d, w, conns).map_or(f64::NAN, f)
    };
    let bytes_get = ratio(
        get("lat", "ycsb-c-uniform", cmax, &|x| x.dma_bytes_per_op),
        get("lat", "ycsb-c-uniform", cmax, &|x| x.raw_bytes_per_op),
    );
    let bytes_set = ratio(
        get("lat", "set-only", cmax, &|x| x.dma_bytes_per_op),
        get("lat", "set-only", cmax, &|x| x.raw_bytes_per_op),
    );
    let sav_cpu = ratio(
        get("sav", "ycsb-c-uniform", cmax, &|x| x.host_cpu_us_per_op),
        get("cpu-only", "ycsb-c-uniform", cmax, &|x| {
            x.host_cpu_us_per_op
        }),
    );
    let lat_p50 = ratio(
        get("lat", "ycsb-c-light", 1, &|x| x.p50_us),
        get("cpu-only", "ycsb-c-light", 1, &|x| x.p50_us),
    );
    let cpu_redis = ratio(
        get("cpu-only", "ycsb-a-uniform", cmax, &|x| x.ops_per_sec),
        get("redis", "ycsb-a-uniform", cmax, &|x| x.ops_per_sec),
    );
    let targets = vec![
        Target::at_most("kvqp_bytes_over_raw_get", bytes_get, 0.55),
        Target::at_most("kvqp_bytes_over_raw_set", bytes_set, 0.55),
        Target::at_most("sav_host_cpu_over_cpu_only", sav_cpu, 0.3),
        Target::at_most("lat_p50_over_cpu_only_p50", lat_p50, 1.0),
        Target::at_least("cpu_only_over_redis_server", cpu_redis, 1.5),
    ];
    let summary = json!({
        "kvqp_bytes_over_raw_get": bytes_get,
        "kvqp_bytes_over_raw_set": bytes_set,
        "sav_host_cpu_over_cpu_only": sav_cpu,
        "lat_p50_over_cpu_only_p50": lat_p50,
        "cpu_only_over_redis_server": cpu_redis,
        "targets": targets,
    });
    let mut t = Table::new(
        format!(
            "YCSB at {cmax} connections × {} in flight (8-byte keys and values, {} keys), \
             {c0} DPU communication core(s)",
            p.depth, p.keys
        ),
        &[
            "design",
            "workload",
            "ops/s",
            "p50 µs",
            "p99 µs",
            "host cores",
            "host µs/op",
            "DPU cores",
            "PCIe B/op",
            "DMA ops/op",
            "RESP B/op",
            "req/batch",
            "empty reads/batch",
        ],
    );
    for x in points
        .iter()
        .filter(|x| x.comm_cores == c0 && (x.connections == cmax || x.workload == "ycsb-c-light"))
    {
        t.row(vec![
            x.design.into(),
            x.workload.into(),
            fmt_num(x.ops_per_sec),
            fmt_num(x.p50_us),
            fmt_num(x.p99_us),
            format!("{:.2}", x.host_cores),
            fmt_num(x.host_cpu_us_per_op),
            format!("{:.2}", x.dpu_cores),
            fmt_num(x.dma_bytes_per_op),
            format!("{:.3}", x.dma_ops_per_op),
            fmt_num(x.raw_bytes_per_op),
            fmt_num(x.requests_per_batch),
            format!("{:.2}", x.empty_polls_per_batch),
        ]);
    }
    let note = format!(
        "{} CPUs; DPU emulated: the dds dpukv dpu process on its own core, PCIe cost model {}",
        machine.nproc,
        if a.dma_cost == "off" { "off" } else { "on" }
    );
    let sweep = |f: &dyn Fn(&Point) -> (f64, f64)| -> Vec<Series> {
        DESIGNS
            .iter()
            .map(|d| Series {
                name: (*d).into(),
                points: points
                    .iter()
                    .filter(|x| {
                        x.design == *d && x.workload == "ycsb-c-uniform" && x.comm_cores == c0
                    })
                    .map(f)
                    .collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let s1 = sweep(&|x| (x.ops_per_sec, x.p50_us));
    let s2 = sweep(&|x| (x.connections as f64, x.host_cores));
    let s3: Vec<Series> = ["dpu-only", "lat", "sav", "dual", "shrd"]
        .iter()
        .map(|d| Series {
            name: (*d).into(),
            points: points
                .iter()
                .filter(|x| {
                    x.design == *d && x.workload == "ycsb-c-uniform" && x.connections == cmax
                })
                .map(|x| (f64::from(x.comm_cores), x.ops_per_sec))
                .collect(),
            spread: Vec::new(),
        })
        .collect();
    let charts = vec![
        LineChart {
            file: "dpukv_throughput_latency.png".into(),
            title: "Throughput vs p50 latency (YCSB C, uniform)".into(),
            note: note.clone(),
            x_label: "ops/s".into(),
            y_label: "p50 µs".into(),
            log_y: crate::plot::spans_decades(s1.iter().flat_map(|s| s.points.iter().map(|p| p.1))),
            series: s1,
        },
        LineChart {
            file: "dpukv_host_cores.png".into(),
            title: "Host cores used (YCSB C, uniform)".into(),
            note: note.clone(),
            x_label: "client connections".into(),
            y_label: "host CPU time / wall time".into(),
            log_y: false,
            series: s2,
        },
        LineChart {
            file: "dpukv_scaling.png".into(),
            title: "Scaling with DPU communication cores".into(),
            note,
            x_label: "DPU communication cores".into(),
            y_label: "ops/s".into(),
            log_y: false,
            series: s3,
        },
    ];
    Report {
        benchmark: "dpu-kv".into(),
        command,
        dpu_emulation: format!(
            "emulated: `dds dpukv dpu` runs as a separate process on its own core (the same \
             profile for every DPU-side design) and reaches host memory only through the \
             emulated DMA engine; DMA cost model {}; redis-server and the host processes run on \
             the host cores",
            cost_model_text(a.dma_cost != "off")
        ),
        machine,
        config: json!({"args": a, "placement": place, "keys": p.keys, "depth": p.depth,
            "comm_cores": p.comm, "connections": p.connections,
            "note": "on a 2-core machine the DPU has one core: the communication-core scaling \
                     has one point, and every host-side design shares the other core with the \
                     load generator"}),
        summary,
        points: Value::Array(points.iter().map(|x| json!(x)).collect()),
        tables: vec![t],
        charts,
        panels: Vec::new(),
    }
}
