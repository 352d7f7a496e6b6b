//! `dds bench objects`: replicated object storage as `rados bench` measures it (CODA §VI,
//! Figs. 6–8), over the OSD placements H4, H3+D1, H2+D2, H1+D3 and D4, and side by side with
//! a real Ceph cluster (`--with-ceph`).
//!
//! Each point writes whole objects (`benchmark_data_<n>`) for T seconds from C client threads
//! (one op in flight each), then reads every written object once (seq) and random ones for T
//! seconds (rand), then removes them. Four OSDs run on this machine: placement host (H) is one
//! `dds osd` process (front end and store); placement dpu (D) is a `dds osd` front end under
//! the DPU profile plus a `dds osd-store` host process. All host-side processes share one
//! cgroup CPU budget (`--host-cpu-quota`, on the host cores); all DPU front ends share the DPU
//! core(s) and one DPU budget (`--dpu-cpu-quota`). The CPU time of both sides is sampled every
//! second from /proc. There is no DPU hardware: the DPU is a process with an emulated DMA
//! engine.

pub mod ceph;
pub mod cgroup;
pub mod dmapath;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dds_objstore::ObjectId;
use dds_osd::client::Client;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use self::cgroup::CpuBudget;
use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::kv::taskset;
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, ratio, Report, Table, Target};

/// `a / b`, NaN (null in the JSON) when either figure is missing or `b` is 0.
fn rel(a: f64, b: f64) -> f64 {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// A table cell: `-` for a missing figure.
fn cell(x: f64) -> String {
    if x.is_finite() {
        fmt_num(x)
    } else {
        "-".into()
    }
}

fn parse_size(s: &str) -> Result<u64, String> {
    dds_proto::units::parse_size(s)
}

/// Settings of `dds bench objects`.
#[derive(Args, Debug, Clone, Serialize)]
pub struct ObjectsArgs {
    /// Short run (sizes 64K and 4M, 4 and 16 clients, replication 3, H4, H2+D2 and D4).
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and the plots go (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seconds of the write phase and of the random-read phase (default 3).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Object sizes of the size sweep (default 64K,256K,1M,4M; quick 64K,4M).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Client counts (ops in flight); the size sweep runs at the largest, the client sweep
    /// at the largest size (default 1,4,16; quick 4,16).
    #[arg(long, value_delimiter = ',')]
    pub clients: Vec<usize>,
    /// Pool sizes (default 1,3; quick 3).
    #[arg(long, value_delimiter = ',')]
    pub replication: Vec<u32>,
    /// Placements of the four OSDs: H4, H3+D1, H2+D2, H1+D3, D4 (default all; quick H4,
    /// H2+D2, D4).
    #[arg(long, value_delimiter = ',')]
    pub placements: Vec<String>,
    /// Also write this size once per listed placement, replication 3, largest client count
    /// (default 8M on H4 and D4 in a full run; 0 for none).
    #[arg(long, value_parser = parse_size)]
    pub extra_size: Option<u64>,
    /// Skip the Flow-Adapt comparison (D4 with --batching off --chunking off, 64 KiB).
    #[arg(long)]
    pub no_flow_adapt: bool,
    /// Host CPU budget in cores: one cgroup quota over all host-side processes (the
    /// placement-host OSDs and every `dds osd-store`).
    #[arg(long, default_value_t = 1.0)]
    pub host_cpu_quota: f64,
    /// DPU CPU budget in cores: one cgroup quota over all DPU front ends together.
    #[arg(long, default_value_t = 1.0)]
    pub dpu_cpu_quota: f64,
    /// CPUs of the DPU processes (default: the last CPU); host processes and the load
    /// generator get the others.
    #[arg(long)]
    pub dpu_cpus: Option<String>,
    /// No CPU placement: every process shares every CPU.
    #[arg(long)]
    pub shared_cores: bool,
    /// Emulated PCIe DMA costs in the DPU front ends (on or off).
    #[arg(long, default_value = "on")]
    pub dma_cost: String,
    /// PGs per pool.
    #[arg(long, default_value_t = 32)]
    pub pg_num: u32,
    /// Device size of each OSD (default 3G; quick 2G); a point stops writing at 40% of it.
    #[arg(long, value_parser = parse_size)]
    pub device_size: Option<u64>,
    /// Directory of the device files (default: a temporary directory under target/).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run the same workload against a real Ceph cluster (mon + as many BlueStore OSDs on
    /// files, same replication and host CPU budget) with `rados bench`. Needs the packages
    /// ceph-mon, ceph-osd and ceph-common; the benchmark installs nothing.
    #[arg(long)]
    pub with_ceph: bool,
    /// First port of the Ceph monitor.
    #[arg(long, default_value_t = 6789)]
    pub ceph_port: u16,
}

const ALL_PLACEMENTS: [&str; 5] = ["H4", "H3+D1", "H2+D2", "H1+D3", "D4"];
const OSDS: usize = 4;

/// How a point of the run is defined.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub seconds: f64,
    pub sizes: Vec<u64>,
    pub clients: Vec<usize>,
    pub replication: Vec<u32>,
    pub placements: Vec<String>,
    pub extra: Option<(u64, Vec<String>)>,
    pub flow_adapt: bool,
    pub device_size: u64,
}

/// Per-OSD placements of a placement name (`H4`, `H2+D2`, `D4`, ...).
pub fn osd_placements(name: &str) -> Result<Vec<bool>> {
    let (mut h, mut d) = (0usize, 0usize);
    for part in name.split('+') {
        let part = part.trim();
        let (kind, n) = part.split_at(part.len().min(1));
        let n: usize = n
            .parse()
            .with_context(|| format!("placement {name:?}: expected like H4, H2+D2, D4"))?;
        match kind {
            "H" | "h" => h += n,
            "D" | "d" => d += n,
            _ => bail!("placement {name:?}: parts start with H or D"),
        }
    }
    if h + d != OSDS {
        bail!(
            "placement {name:?} names {} OSDs, the benchmark runs {OSDS}",
            h + d
        );
    }
    // true = placement dpu; the D OSDs are the last ones.
    Ok((0..OSDS).map(|i| i >= h).collect())
}

fn plan(a: &ObjectsArgs) -> Result<Plan> {
    let q = a.quick;
    let sizes = if a.sizes.is_empty() {
        if q {
            vec![64 << 10, 4 << 20]
        } else {
            vec![64 << 10, 256 << 10, 1 << 20, 4 << 20]
        }
    } else {
        a.sizes.clone()
    };
    if sizes.iter().any(|&s| s == 0 || s > 32 << 20) {
        bail!("--sizes must be within 1 byte .. 32 MiB");
    }
    let clients = if a.clients.is_empty() {
        if q {
            vec![4, 16]
        } else {
            vec![1, 4, 16]
        }
    } else {
        a.clients.clone()
    };
    if clients.iter().any(|&c| c == 0 || c > 256) {
        bail!("--clients must be within 1..256");
    }
    let replication = if a.replication.is_empty() {
        if q {
            vec![3]
        } else {
            vec![1, 3]
        }
    } else {
        a.replication.clone()
    };
    if replication.iter().any(|&r| r == 0 || r as usize > OSDS) {
        bail!("--replication must be within 1..{OSDS}");
    }
    let placements: Vec<String> = if a.placements.is_empty() {
        if q {
            vec!["H4".into(), "H2+D2".into(), "D4".into()]
        } else {
            ALL_PLACEMENTS.iter().map(|s| s.to_string()).collect()
        }
    } else {
        a.placements.clone()
    };
    for p in &placements {
        osd_placements(p)?;
    }
    let seconds = a.seconds.unwrap_or(3.0);
    if !(seconds > 0.0 && seconds <= 3600.0) {
        bail!("--seconds must be within (0, 3600]");
    }
    let extra_size = a.extra_size.unwrap_or(if q { 0 } else { 8 << 20 });
    if extra_size > 32 << 20 {
        bail!("--extra-size must be at most 32 MiB");
    }
    let extra = (extra_size > 0).then(|| {
        let on: Vec<String> = placements
            .iter()
            .filter(|p| *p == "H4" || *p == "D4")
            .cloned()
            .collect();
        (extra_size, on)
    });
    let device_size = a.device_size.unwrap_or(if q { 2 << 30 } else { 3 << 30 });
    if device_size < 64 << 20 {
        bail!("--device-size must be at least 64M");
    }
    if !(a.host_cpu_quota > 0.0 && a.dpu_cpu_quota > 0.0) {
        bail!("CPU quotas must be positive");
    }
    Ok(Plan {
        seconds,
        sizes,
        clients,
        replication,
        placements,
        extra,
        flow_adapt: !a.no_flow_adapt,
        device_size,
    })
}

/// The processes of one cluster of four OSDs.
struct Cluster {
    name: String,
    /// The map, device files and logs; removed with the cluster.
    dir: PathBuf,
    host: Vec<ChildGuard>,
    dpu: Vec<ChildGuard>,
    _host_budget: CpuBudget,
    _dpu_budget: CpuBudget,
    host_budget_info: Value,
    dpu_budget_info: Value,
    client: Client,
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn wait_listen(addr: SocketAddr, child: &mut ChildGuard, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited ({st}) before listening");
        }
        if Instant::now() > deadline {
            bail!("{what} does not listen on {addr}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn wait_socket(p: &Path, child: &mut ChildGuard, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited ({st}) before serving");
        }
        if Instant::now() > deadline {
            bail!("{what} did not create {}", p.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Starts a `dds osd-store` on a fresh device file, in `budget` and on `host_cpus`, and waits
/// for its socket.
fn spawn_store(
    exe: &Path,
    host_cpus: Option<&[usize]>,
    dev: &Path,
    sock: &Path,
    device_size: u64,
    log: std::fs::File,
    budget: &CpuBudget,
) -> Result<ChildGuard> {
    let _ = std::fs::remove_file(sock);
    let child = taskset(exe, host_cpus)
        .arg("osd-store")
        .arg("--device")
        .arg(dev)
        .arg("--socket")
        .arg(sock)
        .args(["--format", "--force", "--size", &device_size.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start dds osd-store")?;
    let mut g = ChildGuard::new(child, "dds osd-store");
    budget
        .add(g.pid())
        .context("move dds osd-store into the host budget")?;
    wait_socket(sock, &mut g, "dds osd-store")?;
    Ok(g)
}

struct StartOpts<'a> {
    exe: &'a Path,
    dir: &'a Path,
    place: &'a Placement,
    host_quota: f64,
    dpu_quota: f64,
    dma_cost: &'a str,
    flow_adapt: bool,
    pg_num: u32,
    device_size: u64,
    replication: &'a [u32],
}

fn start_cluster(name: &str, o: &StartOpts) -> Result<Cluster> {
    let dpus = osd_placements(name)?;
    let me = std::process::id();
    let tag = name.replace('+', "-");
    let host_budget =
        CpuBudget::create(&format!("dds-bench-objects-{me}-{tag}-host"), o.host_quota);
    let dpu_budget = CpuBudget::create(&format!("dds-bench-objects-{me}-{tag}-dpu"), o.dpu_quota);
    let dir = o.dir.join(&tag);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut text = String::from("epoch = 1\n");
    let mut addrs = Vec::new();
    for (id, d) in dpus.iter().enumerate() {
        let a: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let p: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        text += &format!(
            "[[osd]]\nid = {id}\naddr = \"{a}\"\npeer_addr = \"{p}\"\nweight = 1.0\nplacement = \"{}\"\n",
            if *d { "dpu" } else { "host" }
        );
        addrs.push(a);
    }
    for &r in o.replication {
        text += &format!(
            "[[pool]]\nid = {r}\nname = \"p{r}\"\npg_num = {}\nsize = {r}\n",
            o.pg_num
        );
    }
    let map = dir.join("cluster.toml");
    std::fs::write(&map, text)?;
    let host_cpus = o.place.host_cpus.as_deref();
    let size = o.device_size.to_string();
    let (mut host, mut dpu) = (Vec::new(), Vec::new());
    for (id, &d) in dpus.iter().enumerate() {
        let dev = dir.join(format!("osd{id}.img"));
        let log = |what: &str| std::fs::File::create(dir.join(format!("osd{id}.{what}.log")));
        if d {
            let sock = dir.join(format!("osd{id}.store.sock"));
            host.push(spawn_store(
                o.exe,
                host_cpus,
                &dev,
                &sock,
                o.device_size,
                log("store")?,
                &host_budget,
            )?);
            let mut cmd = Command::new(o.exe);
            cmd.args(["osd", "--id", &id.to_string(), "--map"])
                .arg(&map)
                .args(["--placement", "dpu", "--proxy-socket"])
                .arg(&sock)
                .args(["--dma-cost", o.dma_cost, "--frame-memory", "512M"]);
            cmd.args(o.place.dpu_args());
            if !o.flow_adapt {
                cmd.args(["--batching", "off", "--chunking", "off"]);
            }
            let child = cmd
                .stdout(Stdio::null())
                .stderr(log("front")?)
                .spawn()
                .context("start dds osd --placement dpu")?;
            let mut g = ChildGuard::new(child, "dds osd (dpu)");
            dpu_budget
                .add(g.pid())
                .context("move dds osd into the DPU budget")?;
            wait_listen(addrs[id], &mut g, "dds osd --placement dpu")?;
            dpu.push(g);
        } else {
            let child = taskset(o.exe, host_cpus)
                .args(["osd", "--id", &id.to_string(), "--map"])
                .arg(&map)
                .args(["--placement", "host", "--device"])
                .arg(&dev)
                .args([
                    "--format",
                    "--force",
                    "--size",
                    &size,
                    "--frame-memory",
                    "512M",
                ])
                .stdout(Stdio::null())
                .stderr(log("osd")?)
                .spawn()
                .context("start dds osd")?;
            let mut g = ChildGuard::new(child, "dds osd (host)");
            host_budget
                .add(g.pid())
                .context("move dds osd into the host budget")?;
            wait_listen(addrs[id], &mut g, "dds osd")?;
            host.push(g);
        }
    }
    let client = Client::connect_map(&map).map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    // Every pool takes a write before the clock starts (PGs peered).
    for &r in o.replication {
        client
            .write_full(&ObjectId::new(u64::from(r), b"warm".to_vec()), b"warm")
            .map_err(|e| anyhow::anyhow!("{name}: pool p{r} takes no write: {e}"))?;
    }
    Ok(Cluster {
        name: name.into(),
        dir,
        host,
        dpu,
        host_budget_info: json!(host_budget),
        dpu_budget_info: json!(dpu_budget),
        _host_budget: host_budget,
        _dpu_budget: dpu_budget,
        client,
    })
}

impl Cluster {
    fn cpu(&self) -> (f64, f64) {
        let sum = |v: &[ChildGuard]| {
            v.iter()
                .map(|g| process_cpu_seconds(g.pid()).unwrap_or(0.0))
                .sum()
        };
        (sum(&self.host), sum(&self.dpu))
    }

    fn stop(mut self) {
        for g in self.dpu.iter_mut().chain(self.host.iter_mut()) {
            let _ = g.stop(Duration::from_secs(5));
        }
        // The devices are preallocated: a sweep over placements must not keep them all.
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove: {e}");
        }
    }
}

/// What one phase measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub ops_per_s: f64,
    pub lat_avg_ms: f64,
    pub lat_p50_ms: f64,
    pub lat_p99_ms: f64,
    pub lat_max_ms: f64,
    /// Host-side CPU time / wall time (cores).
    pub host_cores: f64,
    pub dpu_cores: f64,
    /// CPU milliseconds per MB moved by the clients.
    pub host_cpu_ms_per_mb: f64,
    pub dpu_cpu_ms_per_mb: f64,
    /// Every second: (seconds since the phase began, host cores, DPU cores).
    pub samples: Vec<(f64, f64, f64)>,
    /// Writes stopped at the device budget before the time was up.
    pub capped: bool,
}

/// One measured point: a placement, pool size, object size and client count.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: String,
    pub placement: String,
    pub replication: u32,
    pub object_size: u64,
    pub clients: usize,
    /// Flow-Adapt (batching and chunking) of the DPU front ends.
    pub flow_adapt: bool,
    pub write: Phase,
    pub seq: Phase,
    pub rand: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Seq,
    Rand,
}

fn obj(pool: u64, n: u64) -> ObjectId {
    ObjectId::new(pool, format!("benchmark_data_{n}").into_bytes())
}

/// Runs one phase; returns it and (for writes) how many objects exist.
#[allow(clippy::too_many_arguments)]
fn phase(
    c: &Cluster,
    pool: u64,
    size: u64,
    clients: usize,
    kind: Kind,
    seconds: f64,
    objects: u64,
    cap: u64,
) -> Result<(Phase, u64)> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let capped = AtomicBool::new(false);
    let (h0, d0) = c.cpu();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..clients)
            .map(|t| {
                let (next, done, stop, capped) = (&next, &done, &stop, &capped);
                sc.spawn(move || -> Result<(u64, Histogram<u64>)> {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
                    let mut rng = SmallRng::seed_from_u64(t as u64 * 7919 + 11);
                    let mut buf = vec![0u8; size as usize];
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = (i as u8).wrapping_mul(31).wrapping_add(t as u8);
                    }
                    let mut ops = 0;
                    loop {
                        if stop.load(Ordering::Relaxed)
                            || crate::interrupt::requested()
                            || (kind != Kind::Seq && Instant::now() >= deadline)
                        {
                            break;
                        }
                        let n = match kind {
                            Kind::Write | Kind::Seq => next.fetch_add(1, Ordering::Relaxed),
                            Kind::Rand => rng.gen_range(0..objects.max(1)),
                        };
                        let limit = if kind == Kind::Write { cap } else { objects };
                        if n >= limit {
                            if kind == Kind::Write {
                                capped.store(true, Ordering::Relaxed);
                            }
                            break;
                        }
                        let at = Instant::now();
                        if kind == Kind::Write {
                            let k = buf.len().min(8);
                            buf[..k].copy_from_slice(&n.to_le_bytes()[..k]);
                            c.client
                                .write_full(&obj(pool, n), &buf)
                                .map_err(|e| anyhow::anyhow!("write benchmark_data_{n}: {e}"))?;
                        } else {
                            let got = c
                                .client
                                .read_full(&obj(pool, n))
                                .map_err(|e| anyhow::anyhow!("read benchmark_data_{n}: {e}"))?;
                            let k = got.len().min(8);
                            if got.len() as u64 != size || got[..k] != n.to_le_bytes()[..k] {
                                bail!("benchmark_data_{n} read back wrong ({} bytes)", got.len());
                            }
                        }
                        h.record((at.elapsed().as_micros() as u64).max(1)).ok();
                        ops += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((ops, h))
                })
            })
            .collect();
        // CPU samples every second while the clients run.
        let (mut last_t, mut last) = (t0, (h0, d0));
        while !hs.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            if last_t.elapsed() >= Duration::from_secs(1) {
                let now = c.cpu();
                let dt = last_t.elapsed().as_secs_f64();
                samples.push((
                    t0.elapsed().as_secs_f64(),
                    (now.0 - last.0) / dt,
                    (now.1 - last.1) / dt,
                ));
                last_t = Instant::now();
                last = now;
            }
            if kind == Kind::Seq
                && Instant::now() >= deadline + Duration::from_secs_f64(seconds * 3.0)
            {
                // A seq phase reads every object once, but not forever.
                stop.store(true, Ordering::Relaxed);
            }
        }
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    crate::interrupt::check()?;
    let secs = t0.elapsed().as_secs_f64();
    let (h1, d1) = c.cpu();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut ops = 0;
    let mut first_err = None;
    for r in results {
        match r {
            Ok((o, h)) => {
                ops += o;
                hist.add(&h)?;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let written = if kind == Kind::Write {
        // Every name below `min(next, cap)` was written unless a client failed.
        next.load(Ordering::Relaxed).min(cap)
    } else {
        objects
    };
    if let Some(e) = first_err {
        return Err(e.context(format!(
            "{}: {size}-byte objects, {clients} clients",
            c.name
        )));
    }
    let bytes = ops * size;
    let mb = bytes as f64 / 1e6;
    let p = Phase {
        ops,
        bytes,
        seconds: secs,
        mb_per_s: mb / secs,
        ops_per_s: ops as f64 / secs,
        lat_avg_ms: hist.mean() / 1e3,
        lat_p50_ms: hist.value_at_quantile(0.5) as f64 / 1e3,
        lat_p99_ms: hist.value_at_quantile(0.99) as f64 / 1e3,
        lat_max_ms: hist.max() as f64 / 1e3,
        host_cores: (h1 - h0) / secs,
        dpu_cores: (d1 - d0) / secs,
        host_cpu_ms_per_mb: ratio((h1 - h0) * 1e3, mb),
        dpu_cpu_ms_per_mb: ratio((d1 - d0) * 1e3, mb),
        samples,
        capped: capped.load(Ordering::Relaxed),
    };
    Ok((p, written))
}

/// Removes `benchmark_data_0..n` with `clients` threads.
fn cleanup(c: &Cluster, pool: u64, n: u64, clients: usize) -> Result<()> {
    let next = AtomicU64::new(0);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..clients.max(4))
            .map(|_| {
                sc.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        c.client
                            .remove(&obj(pool, i))
                            .map_err(|e| anyhow::anyhow!("remove benchmark_data_{i}: {e}"))?;
                    }
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
        })
    })
}

fn point(
    c: &Cluster,
    p: &Plan,
    repl: u32,
    size: u64,
    clients: usize,
    flow_adapt: bool,
) -> Result<Point> {
    let pool = u64::from(repl);
    // Stop writing at 40% of the devices (each object lands on `repl` of the four).
    let cap = ((p.device_size as f64 * 0.4 * OSDS as f64) / (size as f64 * f64::from(repl)))
        .max(1.0) as u64;
    let (w, n) = phase(c, pool, size, clients, Kind::Write, p.seconds, 0, cap)?;
    let (s, _) = phase(c, pool, size, clients, Kind::Seq, p.seconds, n, 0)?;
    let (r, _) = phase(c, pool, size, clients, Kind::Rand, p.seconds, n, 0)?;
    cleanup(c, pool, n, clients)?;
    let pt = Point {
        system: "dds".into(),
        placement: c.name.clone(),
        replication: repl,
        object_size: size,
        clients,
        flow_adapt,
        write: w,
        seq: s,
        rand: r,
    };
    eprintln!(
        "  {:<6} r{} {:>5} c{:<3}{} write {:>7.1} MB/s {:>7.2} ms host {:.2} cores ({:>5.2} ms/MB) dpu {:.2} | seq {:>7.1} MB/s | rand {:>7.1} MB/s",
        pt.placement,
        repl,
        size_label(size),
        clients,
        if flow_adapt { "" } else { " (Flow-Adapt off)" },
        pt.write.mb_per_s,
        pt.write.lat_avg_ms,
        pt.write.host_cores,
        pt.write.host_cpu_ms_per_mb,
        pt.write.dpu_cores,
        pt.seq.mb_per_s,
        pt.rand.mb_per_s
    );
    Ok(pt)
}

/// `64K`, `4M`, `1536K`.
pub fn size_label(s: u64) -> String {
    if s >= 1 << 20 && s.is_multiple_of(1 << 20) {
        format!("{}M", s >> 20)
    } else if s >= 1 << 10 && s.is_multiple_of(1 << 10) {
        format!("{}K", s >> 10)
    } else {
        s.to_string()
    }
}

/// Runs the benchmark.
pub fn run(a: ObjectsArgs, command: String) -> Result<Report> {
    let p = plan(&a)?;
    crate::interrupt::install()?;
    if a.dma_cost != "on" && a.dma_cost != "off" {
        bail!("--dma-cost takes on or off, not {:?}", a.dma_cost);
    }
    // Ceph first: a missing package fails the run before anything starts.
    if a.with_ceph {
        ceph::check_installed()?;
    }
    let machine = Machine::detect();
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let place = Placement::plan(nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let base = match &a.dir {
        Some(d) => d.clone(),
        None => PathBuf::from("target"),
    };
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix("bench-objects-")
        .tempdir_in(&base)
        .with_context(|| format!("temporary directory under {}", base.display()))?;
    let _pin = place.pin_host()?;
    let cmax = *p.clients.iter().max().context("clients")?;
    let smax = *p.sizes.iter().max().context("sizes")?;
    let mut points = Vec::new();
    let mut budgets = serde_json::Map::new();
    let run_cluster = |name: &str,
                       flow_adapt: bool,
                       pts: &mut Vec<Point>,
                       budgets: &mut serde_json::Map<String, Value>,
                       work: &dyn Fn(&Cluster, &mut Vec<Point>) -> Result<()>|
     -> Result<()> {
        eprintln!(
            "dds bench objects: {name}{} ...",
            if flow_adapt { "" } else { " (Flow-Adapt off)" }
        );
        let c = start_cluster(
            name,
            &StartOpts {
                exe: &exe,
                dir: tmp.path(),
                place: &place,
                host_quota: a.host_cpu_quota,
                dpu_quota: a.dpu_cpu_quota,
                dma_cost: &a.dma_cost,
                flow_adapt,
                pg_num: a.pg_num,
                device_size: p.device_size,
                replication: &p.replication,
            },
        )?;
        // A fresh cluster's first writes are slow (PGs peer on first use, fresh device
        // space): a discarded warm-up touches every PG of every pool first.
        for &r in &p.replication {
            let pool = u64::from(r);
            let n = u64::from(a.pg_num) * 8;
            phase(&c, pool, 64 << 10, cmax, Kind::Write, 60.0, 0, n)?;
            cleanup(&c, pool, n, cmax)?;
        }
        budgets.insert(
            name.to_string(),
            json!({"host": c.host_budget_info, "dpu": c.dpu_budget_info}),
        );
        let r = work(&c, pts);
        c.stop();
        r
    };
    for name in &p.placements {
        run_cluster(name, true, &mut points, &mut budgets, &|c, pts| {
            for &repl in &p.replication {
                for &size in &p.sizes {
                    pts.push(point(c, &p, repl, size, cmax, true)?);
                }
            }
            let repl = *p.replication.iter().max().expect("replication");
            for &cl in p.clients.iter().filter(|&&x| x != cmax) {
                pts.push(point(c, &p, repl, smax, cl, true)?);
            }
            if let Some((xs, on)) = &p.extra {
                if on.contains(&c.name) && !p.sizes.contains(xs) {
                    pts.push(point(c, &p, repl, *xs, cmax, true)?);
                }
            }
            Ok(())
        })?;
    }
    // Flow-Adapt off: the most-DPU placement, 64 KiB writes.
    let dmost = p
        .placements
        .iter()
        .filter(|n| osd_placements(n).is_ok_and(|v| v.iter().any(|&d| d)))
        .max_by_key(|n| osd_placements(n).map_or(0, |v| v.iter().filter(|&&d| d).count()))
        .cloned();
    if p.flow_adapt {
        if let Some(name) = &dmost {
            let repl = *p.replication.iter().max().expect("replication");
            let need_on = !points.iter().any(|x| {
                x.placement == *name
                    && x.object_size == 64 << 10
                    && x.clients == cmax
                    && x.replication == repl
            });
            run_cluster(name, false, &mut points, &mut budgets, &|c, pts| {
                pts.push(point(c, &p, repl, 64 << 10, cmax, false)?);
                Ok(())
            })?;
            if need_on {
                run_cluster(name, true, &mut points, &mut budgets, &|c, pts| {
                    pts.push(point(c, &p, repl, 64 << 10, cmax, true)?);
                    Ok(())
                })?;
            }
        }
    }
    // Flow-Adapt on the DMA path alone: one store, no OSD around it.
    let mut dma = Vec::new();
    if p.flow_adapt {
        for fa in [true, false] {
            eprintln!(
                "dds bench objects: DMA path, Flow-Adapt {} ...",
                if fa { "on" } else { "off" }
            );
            dma.push(
                dmapath::measure(&dmapath::DmaPathOpts {
                    exe: &exe,
                    dir: tmp.path(),
                    place: &place,
                    host_quota: a.host_cpu_quota,
                    dma_cost: a.dma_cost == "on",
                    flow_adapt: fa,
                    size: 64 << 10,
                    threads: cmax,
                    seconds: p.seconds,
                })
                .context("DMA path")?,
            );
        }
    }
    let ceph_points = if a.with_ceph {
        ceph::run(&ceph::CephOpts {
            dir: tmp.path(),
            port: a.ceph_port,
            osds: OSDS,
            plan: &p,
            host_quota: a.host_cpu_quota,
            host_cpus: place.host_cpus.as_deref(),
            pg_num: a.pg_num,
        })
        .context("Ceph side")?
    } else {
        Vec::new()
    };
    points.extend(ceph_points);
    Ok(report(
        &a, &p, command, machine, &place, points, budgets, dmost, dma,
    ))
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &ObjectsArgs,
    p: &Plan,
    command: String,
    machine: Machine,
    place: &Placement,
    points: Vec<Point>,
    budgets: serde_json::Map<String, Value>,
    dmost: Option<String>,
    dma: Vec<dmapath::DmaPathPoint>,
) -> Report {
    let cmax = *p.clients.iter().max().unwrap_or(&1);
    let rmax = *p.replication.iter().max().unwrap_or(&1);
    let find = |sys: &str, pl: &str, r: u32, s: u64, c: usize, fa: bool| {
        points.iter().find(|x| {
            x.system == sys
                && (sys != "dds" || x.placement == pl)
                && x.replication == r
                && x.object_size == s
                && x.clients == c
                && x.flow_adapt == fa
        })
    };
    let w = |x: Option<&Point>, f: &dyn Fn(&Phase) -> f64| x.map_or(f64::NAN, |x| f(&x.write));
    let big = if p.sizes.contains(&(4 << 20)) {
        4 << 20
    } else {
        *p.sizes.iter().max().unwrap_or(&(4 << 20))
    };
    let h4_big = find("dds", "H4", rmax, big, cmax, true);
    let d4_big = find("dds", "D4", rmax, big, cmax, true);
    let cpu_mb = rel(
        w(d4_big, &|x| x.host_cpu_ms_per_mb),
        w(h4_big, &|x| x.host_cpu_ms_per_mb),
    );
    // The best D placement vs H4 at the sizes where H4 is CPU-bound (64 KiB .. 1 MiB).
    let mut best = (f64::NAN, String::new(), 0u64, false);
    let small: Vec<u64> = p
        .sizes
        .iter()
        .copied()
        .filter(|&s| (64 << 10..=1 << 20).contains(&s))
        .collect();
    let bound = |s: u64| {
        w(find("dds", "H4", rmax, s, cmax, true), &|x| x.host_cores) >= 0.85 * a.host_cpu_quota
    };
    let any_bound = small.iter().any(|&s| bound(s));
    for &s in &small {
        if any_bound && !bound(s) {
            continue;
        }
        let h = w(find("dds", "H4", rmax, s, cmax, true), &|x| x.mb_per_s);
        for pl in p.placements.iter().filter(|n| *n != "H4") {
            let r = rel(w(find("dds", pl, rmax, s, cmax, true), &|x| x.mb_per_s), h);
            if best.0.is_nan() || r > best.0 {
                best = (r, pl.clone(), s, bound(s));
            }
        }
    }
    let (bo, bu) = match &dmost {
        Some(n) => (
            w(find("dds", n, rmax, 64 << 10, cmax, true), &|x| x.ops_per_s),
            w(find("dds", n, rmax, 64 << 10, cmax, false), &|x| {
                x.ops_per_s
            }),
        ),
        None => (f64::NAN, f64::NAN),
    };
    let batching_osd = rel(bo, bu);
    let dma_rate = |fa: bool| {
        dma.iter()
            .find(|d| d.flow_adapt == fa)
            .map_or(f64::NAN, |d| d.txs_per_s)
    };
    let batching = rel(dma_rate(true), dma_rate(false));
    let mut targets = vec![
        Target::at_most("d4_host_cpu_per_mb_over_h4", cpu_mb, 0.2),
        Target::at_least("best_d_over_h4_write_repl3", best.0, 1.5),
        Target::at_least("batching_over_unbatched_64k", batching, 2.0),
    ];
    let mut summary = json!({
        "d4_host_cpu_per_mb_over_h4": cpu_mb,
        "d4_host_cpu_per_mb_over_h4_at": {"object_size": big, "replication": rmax, "clients": cmax},
        "best_d_over_h4_write_repl3": best.0,
        "best_d_over_h4_write_repl3_at": {"placement": best.1, "object_size": best.2,
            "h4_cpu_bound": best.3, "host_cpu_budget_cores": a.host_cpu_quota,
            "replication": rmax, "clients": cmax},
        "batching_over_unbatched_64k": batching,
        "batching_over_unbatched_64k_at": {"path": "one dds osd-store, DPU-side threads on the DPU CPU, one channel",
            "object_size": 64 << 10, "threads": cmax,
            "on_txs_per_s": dma_rate(true), "off_txs_per_s": dma_rate(false)},
        "batching_over_unbatched_64k_osd": batching_osd,
        "batching_over_unbatched_64k_osd_at": {"placement": dmost, "on_writes_per_s": bo,
            "off_writes_per_s": bu, "replication": rmax, "clients": cmax,
            "note": "every client write is one transaction through the DMA path of each D replica"},
    });
    if a.with_ceph {
        let ceph_big = find("ceph", "", rmax, big, cmax, true);
        let wr = rel(w(h4_big, &|x| x.mb_per_s), w(ceph_big, &|x| x.mb_per_s));
        let cpu = rel(
            w(h4_big, &|x| x.host_cpu_ms_per_mb),
            w(ceph_big, &|x| x.host_cpu_ms_per_mb),
        );
        summary["h4_over_ceph_write"] = json!(wr);
        summary["h4_host_cpu_per_mb_over_ceph"] = json!(cpu);
        summary["ceph_at"] = json!({"object_size": big, "replication": rmax, "clients": cmax});
        targets.push(Target::at_least("h4_over_ceph_write", wr, 1.0));
        targets.push(Target::at_most("h4_host_cpu_per_mb_over_ceph", cpu, 0.5));
    }
    summary["targets"] = json!(targets);

    let mut t = Table::new(
        format!(
            "Objects: write {} s, then seq and rand read; host CPU budget {} cores, DPU {} cores",
            p.seconds, a.host_cpu_quota, a.dpu_cpu_quota
        ),
        &[
            "system",
            "repl",
            "size",
            "clients",
            "write MB/s",
            "write ms",
            "p99 ms",
            "seq MB/s",
            "rand MB/s",
            "host cores",
            "host ms/MB",
            "DPU cores",
            "DPU ms/MB",
        ],
    );
    for x in &points {
        let sys = if x.system == "ceph" {
            "Ceph".to_string()
        } else if x.flow_adapt {
            x.placement.clone()
        } else {
            format!("{} (Flow-Adapt off)", x.placement)
        };
        t.row(vec![
            sys,
            x.replication.to_string(),
            size_label(x.object_size),
            x.clients.to_string(),
            cell(x.write.mb_per_s),
            cell(x.write.lat_avg_ms),
            cell(x.write.lat_p99_ms),
            cell(x.seq.mb_per_s),
            cell(x.rand.mb_per_s),
            format!("{:.2}", x.write.host_cores),
            cell(x.write.host_cpu_ms_per_mb),
            format!("{:.2}", x.write.dpu_cores),
            cell(x.write.dpu_cpu_ms_per_mb),
        ]);
    }
    let mut tables = vec![t];
    if !dma.is_empty() {
        let mut d = Table::new(
            format!(
                "Flow-Adapt on the DMA path alone: 64 KiB WriteFull transactions from {cmax} DPU-side threads into one dds osd-store, one channel"
            ),
            &[
                "Flow-Adapt",
                "tx/s",
                "host µs/tx",
                "DMA ops/tx",
                "batches",
                "chunks",
            ],
        );
        for x in &dma {
            d.row(vec![
                if x.flow_adapt { "on" } else { "off" }.into(),
                cell(x.txs_per_s),
                cell(x.host_cpu_us_per_tx),
                cell(x.dma_ops_per_tx),
                x.batches.to_string(),
                x.chunks.to_string(),
            ]);
        }
        tables.push(d);
    }
    let note = format!(
        "{} CPUs; host budget {} cores; DPU emulated (processes on CPU {}, budget {} cores, PCIe cost model {})",
        machine.nproc,
        a.host_cpu_quota,
        place.dpu_cpus.as_deref().unwrap_or("shared"),
        a.dpu_cpu_quota,
        a.dma_cost
    );
    let systems: Vec<(String, String)> = p
        .placements
        .iter()
        .map(|n| ("dds".to_string(), n.clone()))
        .chain(
            a.with_ceph
                .then(|| ("ceph".to_string(), "Ceph".to_string())),
        )
        .collect();
    let series = |r: u32, f: &dyn Fn(&Point) -> Option<(f64, f64)>| -> Vec<Series> {
        systems
            .iter()
            .map(|(sys, n)| Series {
                name: n.clone(),
                points: points
                    .iter()
                    .filter(|x| {
                        x.system == *sys
                            && (sys != "dds" || x.placement == *n)
                            && x.replication == r
                            && x.flow_adapt
                    })
                    .filter_map(f)
                    .collect(),
                spread: Vec::new(),
            })
            .collect()
    };
    let by_size =
        |x: &Point, y: f64| (x.clients == cmax).then_some((x.object_size as f64 / 1024.0, y));
    let mut charts = Vec::new();
    for &r in &p.replication {
        charts.push(LineChart {
            file: format!("objects_write_mbs_repl{r}.png"),
            title: format!("Write MB/s vs object size, replication {r}, {cmax} clients (Fig. 6)"),
            note: note.clone(),
            x_label: "object size (KiB)".into(),
            y_label: "write MB/s".into(),
            log_y: false,
            series: series(r, &|x| by_size(x, x.write.mb_per_s)),
        });
    }
    charts.push(LineChart {
        file: "objects_host_cpu_per_mb.png".into(),
        title: format!("Host CPU per MB written, replication {rmax}, {cmax} clients (Fig. 7)"),
        note: note.clone(),
        x_label: "object size (KiB)".into(),
        y_label: "host CPU ms per MB".into(),
        log_y: crate::plot::spans_decades(points.iter().map(|x| x.write.host_cpu_ms_per_mb)),
        series: series(rmax, &|x| by_size(x, x.write.host_cpu_ms_per_mb)),
    });
    let smax = *p.sizes.iter().max().unwrap_or(&(4 << 20));
    charts.push(LineChart {
        file: "objects_clients.png".into(),
        title: format!(
            "Write MB/s vs clients, {} objects, replication {rmax} (Fig. 8)",
            size_label(smax)
        ),
        note: note.clone(),
        x_label: "clients (ops in flight)".into(),
        y_label: "write MB/s".into(),
        log_y: false,
        series: series(rmax, &|x| {
            (x.object_size == smax).then_some((x.clients as f64, x.write.mb_per_s))
        }),
    });
    charts.push(LineChart {
        file: "objects_read_mbs.png".into(),
        title: format!("Seq read MB/s vs object size, replication {rmax}, {cmax} clients"),
        note,
        x_label: "object size (KiB)".into(),
        y_label: "seq read MB/s".into(),
        log_y: false,
        series: series(rmax, &|x| by_size(x, x.seq.mb_per_s)),
    });
    Report {
        benchmark: "objects".into(),
        command,
        dpu_emulation: format!(
            "emulated: each placement-dpu OSD's front end (`dds osd --placement dpu`) is a \
             separate process on the DPU core(s), all of them under one DPU CPU budget, reaching \
             its object store (`dds osd-store`, a host process) only through the emulated DMA \
             engine; DMA cost model {}",
            cost_model_text(a.dma_cost != "off")
        ),
        machine,
        config: json!({
            "args": a,
            "plan": p,
            "placement": place,
            "osds": OSDS,
            "host_cpu_budget_cores": a.host_cpu_quota,
            "dpu_cpu_budget_cores": a.dpu_cpu_quota,
            "budgets": budgets,
            "mb": "10^6 bytes",
            "load_generator": "threads of the benchmark process on the host CPUs, outside the host budget; one op in flight per thread",
            "dma_path": dma,
            "note": "host budget: one cgroup CPU quota over every host-side process (placement-host \
                     OSDs and dds osd-store processes) pinned to the host CPUs; DPU budget: one \
                     cgroup quota over all DPU front ends together, pinned to the DPU CPU(s), so \
                     D4 packs four OSDs' front ends into what one DPU core gives"
        }),
        summary,
        points: Value::Array(points.iter().map(|x| json!(x)).collect()),
        tables,
        charts,
        panels: Vec::new(),
    }
}
