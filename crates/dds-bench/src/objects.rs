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
//!
//! Here: the options, the plan of a run and the run itself. `cluster` starts and stops the
//! OSDs of a placement, `workload` measures one point, `render` writes the report;
//! [`ceph`] runs the same points on a Ceph cluster, [`dmapath`] measures the DMA path alone and
//! [`cgroup`] holds the CPU budgets.

pub mod ceph;
pub mod cgroup;
mod cluster;
pub(crate) use cluster::spawn_store;
pub mod dmapath;
mod render;
mod workload;

use crate::machine::Machine;
use crate::placement::Placement;
use crate::report::{fmt_num, Report};
use anyhow::{bail, Context, Result};
use clap::Args;
use cluster::{start_cluster, Cluster, StartOpts};
use render::report;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::PathBuf;
use workload::{cleanup, phase, point, Kind};
pub use workload::{Phase, Point};

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
        ceph::check_installed("--with-ceph", false)?;
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
