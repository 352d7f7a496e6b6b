//! `dds bench files` — Fig. 17 of the paper: host-issued random reads and writes of 1 to
//! 64 KiB through the DDS library against the emulated DPU (`dds dpu`, a separate process
//! reaching host memory only through the emulated DMA engine) in zero-copy mode and in copy
//! mode, and the host doing the same I/O itself with io_uring + O_DIRECT on a regular file of
//! the same size on the same disk.
//!
//! Both files are written fully once before any measurement, so no run measures allocation.
//! The modes run side by side for each I/O size, trial after trial; figures are medians.
//! Host CPU is this process's CPU time (getrusage) per operation, DPU CPU the `dds dpu`
//! process's (from /proc/<pid>/stat); of that, the part its service thread spent executing the
//! emulated DMA engine's copies (`DmaCounters::execute_ns` from the DPU's stats, before and
//! after the run) is reported beside it, not subtracted from it.
//!
//! Here: the options, the runs and the measurements; the summary of the trials (medians,
//! ratios, the report's tables and figures) is `files/summary.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use dds_host::Dds;
use serde::Serialize;
use serde_json::json;

use crate::cpu::{process_cpu_seconds, process_status_bytes, self_cpu_seconds};
use crate::dpu::DpuProcess;
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, max_of, median, min_of, ratio, Report, Table, Target};
use crate::workload::{self, WorkloadResult, WorkloadSpec};

mod summary;

use summary::summarize;

/// Who executes the I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FilesMode {
    /// The DDS library against `dds dpu --mode zero-copy`.
    ZeroCopy,
    /// As `ZeroCopy`, with every read and write on a registered host buffer: no copy by the
    /// library on either side.
    Registered,
    /// The DDS library against `dds dpu --mode copy`.
    Copy,
    /// The host itself: io_uring + O_DIRECT on a regular file.
    IoUring,
}

impl FilesMode {
    pub const ALL: [FilesMode; 4] = [
        FilesMode::ZeroCopy,
        FilesMode::Registered,
        FilesMode::Copy,
        FilesMode::IoUring,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FilesMode::ZeroCopy => "zero_copy",
            FilesMode::Registered => "registered",
            FilesMode::Copy => "copy",
            FilesMode::IoUring => "io_uring",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            FilesMode::ZeroCopy => "DDS zero-copy",
            FilesMode::Registered => "DDS zero-copy, registered buffers",
            FilesMode::Copy => "DDS copy",
            FilesMode::IoUring => "host io_uring",
        }
    }

    fn dpu_mode(self) -> Option<&'static str> {
        match self {
            FilesMode::ZeroCopy | FilesMode::Registered => Some("zero-copy"),
            FilesMode::Copy => Some("copy"),
            FilesMode::IoUring => None,
        }
    }
}

impl std::str::FromStr for FilesMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        FilesMode::ALL
            .into_iter()
            .find(|m| m.name() == s.replace('-', "_"))
            .ok_or_else(|| format!("unknown mode {s:?} (zero-copy, registered, copy, io-uring)"))
    }
}

/// Settings of a files benchmark run.
#[derive(Clone, Debug, Serialize)]
pub struct FilesOptions {
    /// The `dds` binary (started as `dds format` and `dds dpu`).
    pub exe: PathBuf,
    /// Directory of the device file and the io_uring file.
    pub dir: PathBuf,
    /// I/O sizes, bytes.
    pub sizes: Vec<u32>,
    pub modes: Vec<FilesMode>,
    /// Bytes of the file the workload reads and writes (and of the io_uring file).
    pub file_bytes: u64,
    pub threads: usize,
    /// Outstanding operations per thread.
    pub depth: usize,
    /// Fraction of reads.
    pub read_ratio: f64,
    /// Time budget of one run (its operation count is calibrated by a pilot run).
    pub seconds_per_run: f64,
    pub pilot_ops: u64,
    pub max_ops: u64,
    pub trials: usize,
    /// PCIe cost model of the emulated DMA engine.
    pub dma_cost: bool,
    /// Keep the device and io_uring files afterwards.
    pub keep_files: bool,
    /// CPUs of the DPU process (a `dds dpu --cpus` list); default the last CPU. The host
    /// side (workload threads, the io_uring baseline) runs on the other CPUs in every mode.
    pub dpu_cpus: Option<String>,
    /// No CPU placement: host side and DPU share every CPU (reported as such).
    pub shared_cores: bool,
    /// Seconds the idle DPU (four connected host groups) is measured for.
    pub idle_seconds: f64,
    #[serde(skip)]
    pub quiet: bool,
    pub command: String,
}

impl FilesOptions {
    pub fn full(exe: PathBuf, dir: PathBuf) -> FilesOptions {
        FilesOptions {
            exe,
            dir,
            sizes: vec![1 << 10, 4 << 10, 16 << 10, 64 << 10],
            modes: FilesMode::ALL.to_vec(),
            file_bytes: 1 << 30,
            threads: crate::device::THREADS,
            depth: crate::device::DEPTH,
            read_ratio: 0.5,
            seconds_per_run: 2.0,
            pilot_ops: 4_000,
            max_ops: 5_000_000,
            trials: 5,
            dma_cost: true,
            keep_files: false,
            dpu_cpus: None,
            shared_cores: false,
            idle_seconds: 10.0,
            quiet: false,
            command: "dds bench files".into(),
        }
    }

    pub fn quick(exe: PathBuf, dir: PathBuf) -> FilesOptions {
        FilesOptions {
            file_bytes: 128 << 20,
            seconds_per_run: 0.6,
            pilot_ops: 1_000,
            trials: 1,
            idle_seconds: 2.0,
            command: "dds bench files --quick".into(),
            ..FilesOptions::full(exe, dir)
        }
    }
}

/// One measured run.
#[derive(Clone, Debug, Serialize)]
pub struct FilesPoint {
    pub trial: usize,
    pub mode: FilesMode,
    pub io_bytes: u32,
    #[serde(flatten)]
    pub result: WorkloadResult,
    /// This process's CPU time per operation, µs.
    pub host_cpu_us_per_op: f64,
    /// The `dds dpu` process's CPU time per operation, µs (library modes).
    pub dpu_cpu_us_per_op: Option<f64>,
    /// Of that, the time its service thread spent executing DMA operations per operation, µs:
    /// the emulated engine's copies, which a hardware engine does without the DPU's cores
    /// (`DmaCounters::execute_ns`; library modes).
    pub dpu_dma_execute_us_per_op: Option<f64>,
}

const FILE_PATH: &str = "/bench/files.dat";

/// `64 KiB` for tables and target names.
fn size_text(b: u32) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

/// `64k` for summary keys.
fn size_label(b: u32) -> String {
    if b >= 1024 && b.is_multiple_of(1024) {
        format!("{}k", b / 1024)
    } else {
        format!("{b}b")
    }
}

/// Formats a fresh device file with `dds format`.
pub fn format_device(exe: &Path, device: &Path, bytes: u64) -> Result<()> {
    let _ = std::fs::remove_file(device);
    let out = Command::new(exe)
        .arg("format")
        .arg("--device")
        .arg(device)
        .arg("--size")
        .arg(bytes.to_string())
        .output()
        .with_context(|| format!("run {} format", exe.display()))?;
    if !out.status.success() {
        bail!(
            "`dds format --device {}` failed ({}): {}",
            device.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

struct Bench<'a> {
    opts: &'a FilesOptions,
    placement: Placement,
    device: PathBuf,
    socket: PathBuf,
    uring_file: PathBuf,
    /// Peak RSS (VmHWM) of each DPU mode, bytes.
    peak_rss: BTreeMap<FilesMode, u64>,
}

impl Bench<'_> {
    fn start_dpu(&self, mode: FilesMode) -> Result<DpuProcess> {
        let dpu_mode = mode.dpu_mode().expect("library mode");
        let log = self.opts.dir.join(format!("dpu-{}.log", mode.name()));
        let mut args = vec![
            "--mode".to_string(),
            dpu_mode.into(),
            "--dma-cost".into(),
            if self.opts.dma_cost { "on" } else { "off" }.into(),
        ];
        args.extend(self.placement.dpu_args());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        DpuProcess::start(&self.opts.exe, &self.device, &self.socket, &args, &log)
    }

    fn spec(&self, file: u32, io_bytes: u32, ops: u64, seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            file,
            file_bytes: self.opts.file_bytes,
            io_bytes,
            read_ratio: self.opts.read_ratio,
            threads: self.opts.threads,
            depth: self.opts.depth,
            ops,
            seed,
            registered: false,
        }
    }

    fn ops_for(&self, pilot: &WorkloadResult) -> u64 {
        ((pilot.ops_per_sec * self.opts.seconds_per_run) as u64)
            .clamp(self.opts.pilot_ops, self.opts.max_ops)
    }

    /// Read p99 (µs) of 4 KiB reads without and with a flood of metadata operations (create,
    /// resize, appends, delete from another connection) running at the same time.
    fn metadata_flood_p99(&self) -> Result<(f64, f64)> {
        let dpu = self.start_dpu(FilesMode::ZeroCopy)?;
        let dds = Dds::connect(dpu.socket()).context("connect to the DPU")?;
        let file = dds.lookup(FILE_PATH)?;
        let spec = WorkloadSpec {
            read_ratio: 1.0,
            ..self.spec(file.id, 4096, self.opts.pilot_ops * 4, 0xf100d)
        };
        let quiet = workload::run(&dds, &spec, &|_| {})?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        let socket = dpu.socket().to_path_buf();
        let flooded = std::thread::scope(|s| -> Result<WorkloadResult> {
            let flood = s.spawn(|| -> Result<u64> {
                let meta = Dds::connect(&socket)?;
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let f = meta.create_file(&format!("/bench/flood-{}", n % 8))?;
                    meta.set_file_size(f.id, 1 << 20)?;
                    // Appends: each commits the file's new size on the metadata thread.
                    for k in 0..4u64 {
                        meta.write_sync(f.id, (1 << 20) + k * 4096, &[k as u8; 4096])?;
                    }
                    meta.delete_file(f.id)?;
                    n += 7;
                }
                Ok(n)
            });
            let r = workload::run(&dds, &spec, &|_| {});
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let ops = flood
                .join()
                .map_err(|_| anyhow::anyhow!("flood thread panicked"))??;
            if ops == 0 {
                bail!("the metadata flood issued no operation");
            }
            r
        })?;
        drop(dds);
        dpu.stop()?;
        Ok((quiet.p99_us, flooded.p99_us))
    }

    /// CPU of an idle DPU process (cores) with four connected, idle host groups.
    fn idle_dpu_cores(&self) -> Result<f64> {
        let dpu = self.start_dpu(FilesMode::ZeroCopy)?;
        let dds = Dds::connect(dpu.socket()).context("connect to the DPU")?;
        let groups = (0..3)
            .map(|_| dds.create_group(&dds_host::GroupConfig::default()))
            .collect::<Result<Vec<_>, _>>()?;
        std::thread::sleep(std::time::Duration::from_millis(500));
        let c0 = process_cpu_seconds(dpu.pid())?;
        let t0 = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_secs_f64(self.opts.idle_seconds));
        let cores = (process_cpu_seconds(dpu.pid())? - c0) / t0.elapsed().as_secs_f64();
        drop(groups);
        drop(dds);
        dpu.stop()?;
        Ok(cores)
    }

    /// Creates the file on the device and writes all of it once.
    fn prepare_device(&self) -> Result<()> {
        let dpu = self.start_dpu(FilesMode::ZeroCopy)?;
        let dds = Dds::connect(dpu.socket()).context("connect to the DPU")?;
        let _ = dds.create_dir("/bench");
        let info = dds.open_or_create(FILE_PATH)?;
        if info.size < self.opts.file_bytes {
            dds.set_file_size(info.id, self.opts.file_bytes)?;
        }
        let chunk_len = (dds.hello().max_io_bytes as u64).clamp(4096, 512 << 10) as usize;
        let chunk = vec![0xa5u8; chunk_len];
        let mut off = 0u64;
        while off < self.opts.file_bytes {
            let n = (self.opts.file_bytes - off).min(chunk_len as u64) as usize;
            let w = dds.write_sync(info.id, off, &chunk[..n])?;
            if w != n {
                bail!("short write while filling the file ({w} of {n} bytes)");
            }
            off += n as u64;
        }
        dds.flush_sync(info.id)?;
        drop(dds);
        dpu.stop()
    }

    fn run_library(
        &mut self,
        mode: FilesMode,
        io_bytes: u32,
        trial: usize,
        pilot_ops: &mut BTreeMap<(FilesMode, u32), u64>,
    ) -> Result<FilesPoint> {
        let mut dpu = self.start_dpu(mode)?;
        let dds = Dds::connect(dpu.socket()).context("connect to the DPU")?;
        let file = dds.lookup(FILE_PATH)?;
        if file.size < self.opts.file_bytes {
            bail!("{FILE_PATH} on the device is smaller than the workload's file");
        }
        let seed = 0xdd5 + trial as u64;
        let ops = match pilot_ops.get(&(mode, io_bytes)) {
            Some(&n) => n,
            None => {
                let pilot = workload::run(
                    &dds,
                    &WorkloadSpec {
                        registered: mode == FilesMode::Registered,
                        ..self.spec(file.id, io_bytes, self.opts.pilot_ops, seed ^ 1)
                    },
                    &|_| {},
                )?;
                let n = self.ops_for(&pilot);
                pilot_ops.insert((mode, io_bytes), n);
                n
            }
        };
        let spec = WorkloadSpec {
            registered: mode == FilesMode::Registered,
            ..self.spec(file.id, io_bytes, ops, seed)
        };
        let engine_ns = |dds: &Dds| dds.stats().ok().map(|s| s.dma.execute_ns);
        let engine0 = engine_ns(&dds);
        let host0 = self_cpu_seconds();
        let dpu0 = process_cpu_seconds(dpu.pid())?;
        let result = workload::run(&dds, &spec, &|_| {});
        let host = self_cpu_seconds() - host0;
        let dpu_cpu = process_cpu_seconds(dpu.pid())? - dpu0;
        let engine = engine0
            .zip(engine_ns(&dds))
            .map(|(a, b)| b.saturating_sub(a) as f64 / 1e9);
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                dpu.check()?;
                return Err(e);
            }
        };
        if let Ok(hwm) = process_status_bytes(dpu.pid(), "VmHWM") {
            let e = self.peak_rss.entry(mode).or_insert(0);
            *e = (*e).max(hwm);
        }
        drop(dds);
        dpu.stop()?;
        if result.errors > 0 {
            bail!(
                "{} of {} operations failed ({} mode, {io_bytes} B)",
                result.errors,
                result.ops,
                mode.name()
            );
        }
        let n = result.ops.max(1) as f64;
        Ok(FilesPoint {
            trial,
            mode,
            io_bytes,
            host_cpu_us_per_op: host * 1e6 / n,
            dpu_cpu_us_per_op: Some(dpu_cpu * 1e6 / n),
            dpu_dma_execute_us_per_op: engine.map(|s| s * 1e6 / n),
            result,
        })
    }

    fn run_uring(
        &self,
        io_bytes: u32,
        trial: usize,
        pilot_ops: &mut BTreeMap<(FilesMode, u32), u64>,
    ) -> Result<FilesPoint> {
        let seed = 0xdd5 + trial as u64;
        let ops = match pilot_ops.get(&(FilesMode::IoUring, io_bytes)) {
            Some(&n) => n,
            None => {
                let pilot = crate::uring::run(
                    &self.uring_file,
                    &self.spec(0, io_bytes, self.opts.pilot_ops, seed ^ 1),
                    &|_| {},
                )?;
                let n = self.ops_for(&pilot);
                pilot_ops.insert((FilesMode::IoUring, io_bytes), n);
                n
            }
        };
        let host0 = self_cpu_seconds();
        let result = crate::uring::run(
            &self.uring_file,
            &self.spec(0, io_bytes, ops, seed),
            &|_| {},
        )?;
        let host = self_cpu_seconds() - host0;
        if result.errors > 0 {
            bail!(
                "{} of {} io_uring operations failed ({io_bytes} B)",
                result.errors,
                result.ops
            );
        }
        Ok(FilesPoint {
            trial,
            mode: FilesMode::IoUring,
            io_bytes,
            host_cpu_us_per_op: host * 1e6 / result.ops.max(1) as f64,
            dpu_cpu_us_per_op: None,
            dpu_dma_execute_us_per_op: None,
            result,
        })
    }
}

/// Runs the benchmark.
pub fn run(opts: &FilesOptions) -> Result<Report> {
    if opts.sizes.is_empty() || opts.modes.is_empty() {
        bail!("the files benchmark needs at least one size and one mode");
    }
    if opts.sizes.iter().any(|&s| s == 0 || !s.is_multiple_of(512)) {
        bail!("I/O sizes must be positive multiples of 512 bytes (O_DIRECT)");
    }
    std::fs::create_dir_all(&opts.dir).with_context(|| format!("create {}", opts.dir.display()))?;
    let machine = Machine::detect();
    let placement = Placement::plan(machine.nproc, opts.dpu_cpus.as_deref(), opts.shared_cores)?;
    // Every mode's host side (workload threads, io_uring baseline) on the host CPUs.
    let _pinned = placement.pin_host()?;
    let mut bench = Bench {
        opts,
        placement: placement.clone(),
        device: opts.dir.join("files-device.img"),
        socket: std::env::temp_dir().join(format!("dds-bench-files-{}.sock", std::process::id())),
        uring_file: opts.dir.join("files-io_uring.dat"),
        peak_rss: BTreeMap::new(),
    };
    let library = opts.modes.iter().any(|m| m.dpu_mode().is_some());
    let steps = (opts.trials.max(1) * opts.sizes.len() * opts.modes.len()) as u64;
    let bar = crate::progress::bar(steps + 1, opts.quiet);
    bar.set_message("preparing the device file and the io_uring file");
    if library {
        // A device with room for the file plus metadata segments.
        let device_bytes = opts.file_bytes + (256 << 20);
        format_device(&opts.exe, &bench.device, device_bytes)?;
        bench.prepare_device()?;
    }
    if opts.modes.contains(&FilesMode::IoUring) {
        crate::uring::prepare_file(&bench.uring_file, opts.file_bytes)?;
    }
    bar.inc(1);
    let mut pilot_ops = BTreeMap::new();
    let mut points = Vec::new();
    let outcome = (|| -> Result<()> {
        for trial in 0..opts.trials.max(1) {
            for &size in &opts.sizes {
                for &mode in &opts.modes {
                    bar.set_message(format!(
                        "trial {} · {} · {} I/O",
                        trial + 1,
                        mode.label(),
                        size_text(size)
                    ));
                    let p = if mode == FilesMode::IoUring {
                        bench.run_uring(size, trial, &mut pilot_ops)?
                    } else {
                        bench.run_library(mode, size, trial, &mut pilot_ops)?
                    };
                    points.push(p);
                    bar.inc(1);
                }
            }
        }
        Ok(())
    })();
    bar.finish_and_clear();
    if !opts.keep_files {
        let _ = std::fs::remove_file(&bench.uring_file);
    }
    outcome?;
    let idle = if library {
        bar.set_message("idle DPU");
        Some(bench.idle_dpu_cores()?)
    } else {
        None
    };
    let flood = if library {
        bar.set_message("reads under a metadata flood");
        Some(bench.metadata_flood_p99()?)
    } else {
        None
    };
    if !opts.keep_files {
        let _ = std::fs::remove_file(&bench.device);
    }
    let mut report = summarize(opts, machine, points, &bench.peak_rss, idle);
    if let (Some((quiet, flooded)), Some(s)) = (flood, report.summary.as_object_mut()) {
        let r = ratio(flooded, quiet);
        s.insert("metadata_flood_read_p99_us".into(), json!(flooded));
        s.insert("quiet_read_p99_us".into(), json!(quiet));
        s.insert("metadata_flood_read_p99_ratio".into(), json!(r));
        let t = Target::at_most("read p99 under a metadata flood / without", r, 1.5);
        if let Some(list) = s.get_mut("targets").and_then(|t| t.as_array_mut()) {
            list.push(json!(t));
        }
    }
    report.config["placement"] = json!(placement);
    if let Some(s) = report.summary.as_object_mut() {
        s.insert("placement".into(), json!(placement));
    }
    Ok(report)
}
