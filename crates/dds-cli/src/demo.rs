//! `dds demo`: the main job on the embedded defaults. Formats a device file if needed, starts
//! the DPU as a child process, runs random 1 KiB reads and writes through the host library
//! with a progress bar, and prints throughput, latency and CPU per operation of both processes.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use dds_bench::dpu::DpuProcess;
use dds_bench::workload::{self, WorkloadSpec};
use dds_host::Dds;
use indicatif::{ProgressBar, ProgressStyle};

use crate::util::parse_size;
use dds_bench::cpu::{process_cpu_seconds, self_cpu_seconds};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Device file (created and formatted when missing); default device.img in the demo's
    /// directory ($XDG_CACHE_HOME/dds/demo or ~/.cache/dds/demo).
    #[arg(long)]
    device: Option<PathBuf>,
    /// Size of a new device file.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    device_size: u64,
    /// Size of the file the workload reads and writes.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    file_size: u64,
    /// Bytes per read or write.
    #[arg(long, default_value = "1K", value_parser = parse_size)]
    io_size: u64,
    /// Operations in all.
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Fraction of reads.
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Host threads issuing I/O.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Outstanding operations per thread.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Emulated PCIe DMA cost model of the DPU.
    #[arg(long, default_value = "on")]
    dma_cost: String,
    /// Run only the storage-path part (skip the three-way remote comparison).
    #[arg(long)]
    storage_only: bool,
    /// Seconds of load per server configuration in the remote comparison.
    #[arg(long, default_value_t = 3.0)]
    remote_seconds: f64,
}

/// The demo's own directory: `$XDG_CACHE_HOME/dds/demo` (or `~/.cache/dds/demo`), private to
/// the user; device image, DPU log, socket and results stay there between runs.
fn demo_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| {
            // SAFETY: getuid has no preconditions.
            std::env::temp_dir().join(format!("dds-{}", unsafe { libc::getuid() }))
        });
    base.join("dds").join("demo")
}

pub fn run(a: DemoArgs) -> Result<()> {
    let dir = demo_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("create {}", dir.display()))?;
    let device = a.device.clone().unwrap_or_else(|| dir.join("device.img"));
    let exe = std::env::current_exe().context("locate the dds binary")?;
    if !device.exists() {
        eprintln!(
            "formatting {} ({} MiB)",
            device.display(),
            a.device_size >> 20
        );
        dds_bench::files::format_device(&exe, &device, a.device_size)?;
    }
    let socket = dir.join(format!("dpu-{}.sock", std::process::id()));
    let dpu = DpuProcess::start(
        &exe,
        &device,
        &socket,
        &["--dma-cost", &a.dma_cost],
        &dir.join("dpu.log"),
    )?;
    let dds = Dds::connect(dpu.socket()).context("connect to the DPU")?;
    let file = dds.open_or_create("/demo.dat")?;
    if file.size < a.file_size {
        dds.set_file_size(file.id, a.file_size)?;
    }
    let io_bytes = u32::try_from(a.io_size).context("--io-size")?;
    // A correctness check before the timed run: a write is read back.
    let pattern: Vec<u8> = (0..io_bytes).map(|i| (i * 7 + 3) as u8).collect();
    dds.write_sync(file.id, 0, &pattern)?;
    let mut back = vec![0u8; io_bytes as usize];
    dds.read_sync(file.id, 0, &mut back)?;
    if back != pattern {
        bail!("read-back check failed: the DPU returned different bytes");
    }

    let spec = WorkloadSpec {
        file: file.id,
        file_bytes: a.file_size,
        io_bytes,
        read_ratio: a.read_ratio,
        threads: a.threads,
        depth: a.depth,
        ops: a.ops,
        seed: 42,
        registered: false,
    };
    let bar = ProgressBar::new(a.ops);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} ops ({per_sec})",
        )
        .expect("valid template"),
    );
    let host_cpu0 = self_cpu_seconds();
    let dpu_cpu0 = process_cpu_seconds(dpu.pid())?;
    let result = workload::run(&dds, &spec, &|done| bar.set_position(done))?;
    let host_cpu = self_cpu_seconds() - host_cpu0;
    let dpu_cpu = process_cpu_seconds(dpu.pid())? - dpu_cpu0;
    bar.finish_and_clear();
    drop(dds);
    dpu.stop()?;

    let per_op_us = |cpu: f64| cpu / result.ops.max(1) as f64 * 1e6;
    println!("DDS demo: random {}-byte I/O, {:.0}% reads, {} host threads × {} outstanding, DPU emulated as a separate process (DMA cost model {})",
        io_bytes, a.read_ratio * 100.0, a.threads, a.depth, a.dma_cost);
    print!(
        "{}",
        boxed(&[
            ("operations", format!("{}", result.ops)),
            (
                "  reads / writes",
                format!("{} / {}", result.reads, result.writes),
            ),
            ("  errors", format!("{}", result.errors)),
            ("throughput (ops/s)", format!("{:.0}", result.ops_per_sec)),
            ("latency p50 (µs)", format!("{:.1}", result.p50_us)),
            ("latency p99 (µs)", format!("{:.1}", result.p99_us)),
            (
                "host CPU per op (µs)",
                format!("{:.2}", per_op_us(host_cpu)),
            ),
            ("DPU CPU per op (µs)", format!("{:.2}", per_op_us(dpu_cpu))),
        ])
    );
    if result.errors > 0 {
        bail!("{} operations failed", result.errors);
    }
    if a.storage_only {
        left_behind(&dir, &device, a.device.is_some());
        return Ok(());
    }
    println!();
    println!(
        "Remote storage: clients send batches of random {io_bytes}-byte reads over TCP to (a) a host server on OS files, (b) a host server on DDS files, (c) DDS offload (the DPU's traffic director serves reads itself, the host sees only writes and misses)"
    );
    println!(
        "The offload row is the point: the DPU serves the reads itself, so the host spends almost no CPU per read (host µs/op) while clients see the same or better throughput."
    );
    let out = dir.join("results");
    let args = dds_bench::remote::RemoteArgs {
        quick: true,
        work: None,
        files: 2,
        file_size: Some(16 << 20),
        io_size: a.io_size,
        batch: 8,
        connections: vec![2],
        outstanding: vec![16],
        seconds: Some(a.remote_seconds),
        threads: 2,
        dma_cost: a.dma_cost.clone(),
        no_writes: true,
        dpu_cpus: None,
        shared_cores: false,
        topology: dds_bench::remote::TopologyArg::Loopback,
        trials: 1,
        memdev: "none".into(),
        out: Some(out.clone()),
    };
    let report = dds_bench::remote::run_remote(args, crate::bench_cmd::command_line())?;
    // The paper's targets need the full benchmark on a quiet machine; a quick demo run says
    // nothing about them.
    print!("{}", report.render_results());
    crate::bench_cmd::write_files(&report, &out)?;
    println!("Targets (host CPU saved, DPU throughput): `dds bench remote` measures them.");
    left_behind(&dir, &device, a.device.is_some());
    Ok(())
}

/// A table of `(name, value)` rows in a box whose columns fit the widest cell.
fn boxed(rows: &[(&str, String)]) -> String {
    let w0 = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let w1 = rows
        .iter()
        .map(|(_, v)| v.chars().count())
        .max()
        .unwrap_or(0);
    let rule = |l: &str, m: &str, r: &str| {
        format!("{l}{}{m}{}{r}\n", "─".repeat(w0 + 2), "─".repeat(w1 + 2))
    };
    let mut out = rule("┌", "┬", "┐");
    for (k, v) in rows {
        out.push_str(&format!("│ {k:<w0$} │ {v:>w1$} │\n"));
    }
    out.push_str(&rule("└", "┴", "┘"));
    out
}

/// Says what the demo keeps between runs, and how to remove it.
fn left_behind(dir: &std::path::Path, device: &std::path::Path, own_device: bool) {
    let size = std::fs::metadata(device).map_or(0, |m| m.len());
    println!();
    if own_device {
        println!(
            "The DPU log and results are in {}; your device {} was left as it is.",
            dir.display(),
            device.display()
        );
    } else {
        println!(
            "The demo keeps its device ({}, {}), DPU log and results in {} for the next run; \
             `rm -r {}` removes them.",
            device.display(),
            dds_proto::units::fmt_bytes(size),
            dir.display(),
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_row_of_the_box_is_as_wide() {
        let t = super::boxed(&[
            ("operations", "100000".into()),
            ("  reads / writes", "50123 / 49877".into()),
            ("latency p50 (µs)", "1.5".into()),
        ]);
        let widths: Vec<usize> = t.lines().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "{t}");
    }
}
