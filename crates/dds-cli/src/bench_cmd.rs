//! `dds bench ring|files|cache-table|kv|pageserver|dpu-kv|remote|echo`: runs a benchmark of `dds-bench`, prints its tables and
//! writes `<out>/<name>.json` and the plots.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use dds_bench::cache_table::{self, CacheOptions};
use dds_bench::files::{self, FilesMode, FilesOptions};
use dds_bench::report::Report;
use dds_bench::ring::{self, RingOptions};

use crate::util::parse_size;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(Subcommand, Debug)]
enum Which {
    /// Fig. 16: 8-byte messages from 1..64 host producers through the progress ring, a
    /// FaRM-style ring, a lock-based ring and crossbeam's ArrayQueue.
    Ring(RingArgs),
    /// Fig. 17: random file I/O through the library against `dds dpu` (zero-copy and copy
    /// modes) and the host's own io_uring + O_DIRECT.
    Files(FilesArgs),
    /// The cache table: one writer's inserts/s, 1..N readers' lookups/s, against DashMap and
    /// RwLock<HashMap>.
    CacheTable(CacheArgs),
    /// One point of the ring benchmark, run in its own process (used by `dds bench ring`);
    /// prints the point's figures as JSON.
    #[command(hide = true)]
    RingPoint(RingPointArgs),
    /// §9.2 / Fig. 22: `dds kv` without and with DPU offload, against redis-server, on
    /// YCSB-style workloads and redis-benchmark GET.
    Kv(dds_bench::kv::KvArgs),
    /// §9.1 / Figs. 2 and 21: GetPage@LSN from `dds pageserver` without and with DPU offload
    /// while the log is replayed.
    Pageserver(dds_bench::pageserver::PageServerBenchArgs),
    /// Block storage: fio's nbd engine (4 KiB random reads and a 70/30 mix at depths 1, 16,
    /// 64) against `dds nbd` on the DPU, `nbdkit file` and `qemu-nbd` on the same disk.
    Nbd(dds_bench::nbd::NbdBenchArgs),
    /// DPU-KV: the six placements of the communication and processing engines, against
    /// redis-server, on YCSB A/B/C (throughput, latency, host cores, bytes over PCIe).
    #[command(name = "dpu-kv")]
    DpuKv(dds_bench::dpukv::DpuKvArgs),
    /// CODA Figs. 6–8: `rados bench`-style object writes and reads on four OSDs in the
    /// placements H4 .. D4 (replication 1 and 3) under a host CPU budget, optionally side by
    /// side with a real Ceph cluster (`--with-ceph`).
    Objects(dds_bench::objects::ObjectsArgs),
    /// An object cluster that survives its nodes: clients writing and reading while a
    /// primary gets kill -9 (write gap), it comes back (recovery) and an OSD joins
    /// (rebalancing); every acknowledged object checked on every replica.
    Cluster(dds_bench::cluster::ClusterArgs),
    /// Figs. 13/14 (and 20 with the offload engine): the pagestore server on OS files vs DDS
    /// files (vs DDS offload), throughput, latency and host/DPU CPU per operation.
    Remote(dds_bench::remote::RemoteArgs),
    /// Fig. 18: TCP echo served by a host process vs by a separate "DPU" process.
    Echo(dds_bench::remote::EchoBenchArgs),
}

#[derive(Args, Debug)]
struct RingPointArgs {
    /// The point's settings (JSON).
    #[arg(long)]
    spec: String,
}

#[derive(Args, Debug)]
struct Common {
    /// Short run (well under a minute) for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Directory of the JSON results and the plots (default bench/results, or
    /// bench/results/quick with --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Rounds over all points (figures are medians); default 5 for ring and files, 3 for
    /// cache-table, 1 with --quick.
    #[arg(long)]
    trials: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct RingArgs {
    #[command(flatten)]
    common: Common,
    /// Producer counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    producers: Vec<usize>,
    /// DMA cost model settings to run: on, off or both.
    #[arg(long, default_value = "both")]
    dma_cost: String,
    /// Time budget of one point, seconds (default 0.3, 0.04 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// Run the points in this process instead of one process per point (a point whose
    /// producer thread fails then ends the run instead of being run again).
    #[arg(long)]
    in_process: bool,
}

#[derive(Args, Debug)]
struct FilesArgs {
    #[command(flatten)]
    common: Common,
    /// Directory of the device file and the io_uring file (same disk as the repository by
    /// default).
    #[arg(long, default_value = "target/bench-devices")]
    dir: PathBuf,
    /// I/O sizes.
    #[arg(long, value_delimiter = ',', default_value = "1K,4K,16K,64K", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Modes: zero-copy, registered (zero-copy DPU, I/O on registered host buffers), copy,
    /// io-uring.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "zero-copy,registered,copy,io-uring"
    )]
    modes: Vec<FilesMode>,
    /// Size of the file the workload touches (default 1G, 128M with --quick).
    #[arg(long, value_parser = parse_size)]
    file_size: Option<u64>,
    /// Host threads issuing I/O.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Outstanding operations per thread.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Fraction of reads.
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Time budget of one run, seconds (default 2, 0.6 with --quick).
    #[arg(long)]
    seconds: Option<f64>,
    /// PCIe DMA cost model of the DPU: on or off.
    #[arg(long, default_value = "on")]
    dma_cost: String,
    /// Keep the device file and the io_uring file.
    #[arg(long)]
    keep_files: bool,
    /// CPUs of the DPU process (default: the last CPU); the host side gets the others.
    #[arg(long)]
    dpu_cpus: Option<String>,
    /// No CPU placement: the DPU and the host side share every CPU.
    #[arg(long)]
    shared_cores: bool,
}

#[derive(Args, Debug)]
struct CacheArgs {
    #[command(flatten)]
    common: Common,
    /// Item counts (default 1M,16M; 1M with --quick).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    items: Option<Vec<u64>>,
    /// Reader thread counts (default 1,2,4,... up to twice the CPUs, at least 4).
    #[arg(long, value_delimiter = ',')]
    readers: Option<Vec<usize>>,
    /// Lookups per reader (default 3M, 1M with --quick).
    #[arg(long, value_parser = parse_size)]
    lookups: Option<u64>,
}

impl Common {
    fn dir(&self) -> PathBuf {
        dds_bench::results_dir(self.out.as_deref(), self.quick)
    }
}

/// The command line as typed, for the results.
pub(crate) fn command_line() -> String {
    let mut args = std::env::args();
    args.next();
    std::iter::once("dds".to_string())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Prints the report's tables and targets and writes its JSON and plots under `out`.
pub(crate) fn finish(report: &Report, out: &Path) -> Result<()> {
    print!("{}", report.render());
    write_files(report, out)
}

/// Writes the report's JSON and plots under `out` and says where.
pub(crate) fn write_files(report: &Report, out: &Path) -> Result<()> {
    let written = report.write(out)?;
    for p in written {
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// Runs a benchmark that takes the command line and returns its report, then [`finish`]es it
/// under `out`.
fn run_to(out: &Path, name: &str, run: impl FnOnce(String) -> Result<Report>) -> Result<()> {
    let report = run(command_line()).with_context(|| format!("{name} benchmark"))?;
    finish(&report, out)
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.which {
        Which::Ring(r) => {
            let mut o = if r.common.quick {
                RingOptions::quick()
            } else {
                RingOptions::full()
            };
            if r.producers.is_empty() || r.producers.contains(&0) {
                bail!("--producers needs positive counts");
            }
            o.producers = r.producers;
            o.cost_model = match r.dma_cost.as_str() {
                "both" => vec![true, false],
                "on" => vec![true],
                "off" => vec![false],
                other => bail!("--dma-cost takes on, off or both, not {other:?}"),
            };
            if let Some(s) = r.seconds {
                o.seconds_per_point = s;
            }
            if let Some(t) = r.common.trials {
                o.trials = t.max(1);
            }
            o.quiet = r.common.quiet;
            o.command = command_line();
            if !r.in_process {
                o.isolate = Some(std::env::current_exe().context("locate the dds binary")?);
            }
            finish(&ring::run(&o)?, &r.common.dir())
        }
        Which::RingPoint(p) => {
            let spec: ring::PointSpec =
                serde_json::from_str(&p.spec).context("--spec is not a ring point")?;
            println!("{}", serde_json::to_string(&ring::run_point(&spec)?)?);
            Ok(())
        }
        Which::Remote(r) => {
            let out = dds_bench::results_dir(r.out.as_deref(), r.quick);
            run_to(&out, "remote", |command| {
                dds_bench::remote::run_remote(r, command)
            })
        }
        Which::Echo(e) => {
            let out = dds_bench::results_dir(e.out.as_deref(), e.quick);
            run_to(&out, "echo", |command| {
                dds_bench::remote::run_echo(e, command)
            })
        }
        Which::Files(f) => {
            let exe = std::env::current_exe().context("locate the dds binary")?;
            let dir = std::path::absolute(&f.dir)
                .with_context(|| format!("resolve {}", f.dir.display()))?;
            let mut o = if f.common.quick {
                FilesOptions::quick(exe, dir)
            } else {
                FilesOptions::full(exe, dir)
            };
            o.sizes = f
                .sizes
                .iter()
                .map(|&s| u32::try_from(s).context("I/O size must be below 4 GiB"))
                .collect::<Result<_>>()?;
            if f.modes.is_empty() {
                bail!("--modes needs at least one mode");
            }
            o.modes = f.modes;
            if let Some(s) = f.file_size {
                o.file_bytes = s;
            }
            o.threads = f.threads;
            o.depth = f.depth;
            if !(0.0..=1.0).contains(&f.read_ratio) {
                bail!("--read-ratio must be within 0..1");
            }
            o.read_ratio = f.read_ratio;
            if let Some(s) = f.seconds {
                o.seconds_per_run = s;
            }
            o.dma_cost = match f.dma_cost.as_str() {
                "on" => true,
                "off" => false,
                other => bail!("--dma-cost takes on or off, not {other:?}"),
            };
            o.keep_files = f.keep_files;
            o.dpu_cpus = f.dpu_cpus;
            o.shared_cores = f.shared_cores;
            if let Some(t) = f.common.trials {
                o.trials = t.max(1);
            }
            o.quiet = f.common.quiet;
            o.command = command_line();
            let report = files::run(&o).context("files benchmark")?;
            finish(&report, &f.common.dir())
        }
        Which::Kv(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "kv", |command| dds_bench::kv::run_kv(k, command))
        }
        Which::DpuKv(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "dpu-kv", |command| dds_bench::dpukv::run(k, command))
        }
        Which::Objects(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "objects", |command| {
                dds_bench::objects::run(k, command)
            })
        }
        Which::Nbd(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "nbd", |command| dds_bench::nbd::run(k, command))
        }
        Which::Cluster(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "cluster", |command| {
                dds_bench::cluster::run(k, command)
            })
        }
        Which::Pageserver(k) => {
            let out = dds_bench::results_dir(k.out.as_deref(), k.quick);
            run_to(&out, "pageserver", |command| {
                dds_bench::pageserver::run(k, command)
            })
        }
        Which::CacheTable(c) => {
            let mut o = if c.common.quick {
                CacheOptions::quick()
            } else {
                CacheOptions::full()
            };
            if let Some(items) = c.items {
                o.items = items.into_iter().map(|n| n as usize).collect();
            }
            if let Some(r) = c.readers {
                o.readers = r;
            }
            if let Some(n) = c.lookups {
                o.lookups_per_reader = n as usize;
            }
            if o.items.contains(&0) || o.readers.is_empty() || o.readers.contains(&0) {
                bail!("--items and --readers need positive counts");
            }
            if let Some(t) = c.common.trials {
                o.trials = t.max(1);
            }
            o.quiet = c.common.quiet;
            o.command = command_line();
            finish(&cache_table::run(&o), &c.common.dir())
        }
    }
}
