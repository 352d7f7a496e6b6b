//! `dds bench ring` — Fig. 16 of the paper: host producer threads send 8-byte messages to
//! one DPU consumer through the progress ring, a FaRM-style ring, a lock-based ring and
//! crossbeam's `ArrayQueue` (in process, the reference without DMA).
//!
//! The consumer is a thread of this process that reaches the ring only through the
//! emulated DMA engine (`dds_dma::EmulatedDma`), with the PCIe cost model on or off. Every
//! point runs for a fixed time budget (its message count is calibrated by a short pilot run),
//! and the designs run side by side, trial after trial, so that the ratios compare runs made
//! under the same machine load. The figures are medians over the trials.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use dds_dma::CostModel;
use dds_ring::bench::{run_config, BenchConfig, BenchPoint, Design};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cpu::self_cpu_seconds;
use crate::machine::{cost_model_text, Machine};
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, max_of, median, min_of, ratio, Report, Table, Target};

/// Settings of a ring benchmark run.
#[derive(Clone, Debug, Serialize)]
pub struct RingOptions {
    pub producers: Vec<usize>,
    #[serde(skip)]
    pub designs: Vec<Design>,
    /// Cost-model settings to run (`true` = PCIe cost model on).
    pub cost_model: Vec<bool>,
    pub msg_bytes: usize,
    /// Time budget of one point.
    pub seconds_per_point: f64,
    /// Rounds over all points; figures are medians over them.
    pub trials: usize,
    /// Messages of a pilot run (and the least of a point); at least four ring-fulls are
    /// sent in any case, so that no point fits in the ring and measures only its filling.
    pub min_messages: u64,
    /// Most messages of a point.
    pub max_messages: u64,
    /// Data bytes of each ring.
    pub ring_bytes: u64,
    #[serde(skip)]
    pub quiet: bool,
    pub command: String,
    /// Run every point in its own process (`<exe> bench ring-point`), so that a point whose
    /// producer thread fails is killed and run again instead of ending the run.
    #[serde(skip)]
    pub isolate: Option<PathBuf>,
    /// Attempts per point when isolated.
    pub attempts: usize,
}

impl RingOptions {
    /// The full run: producers 1..64, both cost-model settings, five trials.
    pub fn full() -> RingOptions {
        RingOptions {
            producers: vec![1, 2, 4, 8, 16, 32, 64],
            designs: Design::ALL.to_vec(),
            cost_model: vec![true, false],
            msg_bytes: 8,
            seconds_per_point: 0.3,
            trials: 5,
            min_messages: 20_000,
            max_messages: 40_000_000,
            ring_bytes: 1 << 20,
            quiet: false,
            command: "dds bench ring".into(),
            isolate: None,
            attempts: 3,
        }
    }

    /// A short run for smoke tests (same points, a 256 KiB ring, smaller budget, one trial).
    pub fn quick() -> RingOptions {
        RingOptions {
            seconds_per_point: 0.04,
            trials: 1,
            min_messages: 4_096,
            ring_bytes: 256 << 10,
            command: "dds bench ring --quick".into(),
            ..RingOptions::full()
        }
    }
}

/// The settings of one point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointSpec {
    pub design: String,
    pub producers: usize,
    pub msgs_per_producer: usize,
    pub msg_bytes: usize,
    pub cost_model: bool,
    pub ring_bytes: u64,
}

impl PointSpec {
    fn config(&self) -> Result<BenchConfig> {
        let design: Design = self.design.parse().map_err(|e: String| anyhow!(e))?;
        if self.producers == 0 || self.msgs_per_producer == 0 || self.msg_bytes < 8 {
            bail!("a ring point needs producers, messages and messages of at least 8 bytes");
        }
        let mut cfg = BenchConfig::new(
            design,
            self.producers,
            self.msgs_per_producer,
            self.msg_bytes,
            self.cost_model.then(CostModel::bluefield2),
        );
        cfg.ring_bytes = self.ring_bytes;
        Ok(cfg)
    }
}

/// The figures of one point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointFigures {
    pub design: String,
    pub producers: usize,
    pub msgs_per_producer: usize,
    pub msg_bytes: usize,
    pub cost_model: bool,
    pub ring_bytes: u64,
    pub messages: u64,
    pub elapsed_ns: u64,
    pub msgs_per_sec: f64,
    /// Time from a producer's first attempt to send a message to its consumption.
    pub median_latency_ns: u64,
    pub p99_latency_ns: u64,
    pub latency_samples: u64,
    pub mean_batch: f64,
    pub dma_ops_per_msg: f64,
    pub producer_retries: u64,
    /// CPU time of the process running the point (producers and the DPU consumer thread) per
    /// message.
    pub cpu_ns_per_msg: f64,
}

impl PointFigures {
    fn new(p: &BenchPoint, cpu_seconds: f64) -> PointFigures {
        PointFigures {
            design: p.design.name().into(),
            producers: p.producers,
            msgs_per_producer: p.msgs_per_producer,
            msg_bytes: p.msg_bytes,
            cost_model: p.cost_model,
            ring_bytes: p.ring_bytes,
            messages: p.messages,
            elapsed_ns: p.elapsed_ns,
            msgs_per_sec: p.msgs_per_sec,
            median_latency_ns: p.median_latency_ns,
            p99_latency_ns: p.p99_latency_ns,
            latency_samples: p.latency_samples,
            mean_batch: p.mean_batch,
            dma_ops_per_msg: p.dma_ops_per_msg,
            producer_retries: p.producer_retries,
            cpu_ns_per_msg: cpu_seconds * 1e9 / p.messages.max(1) as f64,
        }
    }
}

/// Runs one point in this process and returns its figures (what `dds bench ring-point`
/// prints).
pub fn run_point(spec: &PointSpec) -> Result<PointFigures> {
    let cfg = spec.config()?;
    let cpu0 = self_cpu_seconds();
    let p = run_config(&cfg);
    Ok(PointFigures::new(&p, self_cpu_seconds() - cpu0))
}

/// One measured point of a trial.
#[derive(Clone, Debug, Serialize)]
pub struct RingPoint {
    pub trial: usize,
    #[serde(flatten)]
    pub figures: PointFigures,
}

fn key(cost: bool) -> &'static str {
    if cost {
        "cost_model_on"
    } else {
        "cost_model_off"
    }
}

fn label(d: Design) -> &'static str {
    match d {
        Design::Progress => "progress ring",
        Design::FarmStyle => "FaRM-style",
        Design::LockBased => "lock-based",
        Design::CrossbeamArrayQueue => "ArrayQueue",
    }
}

fn describe(spec: &PointSpec) -> String {
    format!(
        "ring benchmark: {} with {} producers (DMA cost model {})",
        spec.design,
        spec.producers,
        if spec.cost_model { "on" } else { "off" }
    )
}

/// Runs one point on its own thread and waits at most `limit` for it: a producer thread that
/// fails leaves the consumer waiting for messages that never come, which must end the run
/// with an error rather than hang it.
fn run_in_process(spec: &PointSpec, limit: Duration) -> Result<PointFigures> {
    let (tx, rx) = std::sync::mpsc::channel();
    let s = spec.clone();
    std::thread::Builder::new()
        .name("ring-bench".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(|| run_point(&s));
            let _ = tx.send(r);
        })?;
    match rx.recv_timeout(limit) {
        Ok(Ok(p)) => p,
        Ok(Err(_)) => bail!("{} failed (see the panic message above)", describe(spec)),
        Err(_) => bail!(
            "{} did not finish within {} s: a producer thread failed or the consumer stopped \
             receiving (see any panic message above)",
            describe(spec),
            limit.as_secs()
        ),
    }
}

/// Runs one point as `<exe> bench ring-point --spec <json>`, killed after `limit`.
fn run_isolated(exe: &std::path::Path, spec: &PointSpec, limit: Duration) -> Result<PointFigures> {
    let err_path =
        std::env::temp_dir().join(format!("dds-bench-ring-{}.stderr", std::process::id()));
    let err = std::fs::File::create(&err_path)
        .with_context(|| format!("create {}", err_path.display()))?;
    let mut child = Command::new(exe)
        .args([
            "bench",
            "ring-point",
            "--spec",
            &serde_json::to_string(spec)?,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .with_context(|| format!("start {} bench ring-point", exe.display()))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    let first_error = stderr
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with("thread ") && !l.starts_with("note:"))
        .unwrap_or("no message")
        .trim()
        .to_string();
    let Some(status) = status else {
        bail!(
            "{} did not finish within {} s ({first_error})",
            describe(spec),
            limit.as_secs()
        );
    };
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().context("child stdout")?, &mut out)?;
    if !status.success() {
        bail!("{} failed ({status}: {first_error})", describe(spec));
    }
    serde_json::from_str(out.trim())
        .with_context(|| format!("{}: bad output {out:?}", describe(spec)))
}

/// Runs one point as the options say; isolated points are tried up to `attempts` times, and
/// the failed attempts are appended to `failures`.
fn run_one(
    opts: &RingOptions,
    spec: &PointSpec,
    limit: Duration,
    failures: &mut Vec<String>,
) -> Result<PointFigures> {
    let Some(exe) = &opts.isolate else {
        return run_in_process(spec, limit);
    };
    let attempts = opts.attempts.max(1);
    for attempt in 1..=attempts {
        match run_isolated(exe, spec, limit) {
            Ok(p) => return Ok(p),
            Err(e) if attempt < attempts => failures.push(format!("{e:#}")),
            Err(e) => {
                failures.push(format!("{e:#}"));
                return Err(e.context(format!("{attempts} attempts failed")));
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// Runs the benchmark. Fails when a point fails (a ring reports corruption, a producer
/// thread panics) or does not finish in time.
///
/// # Panics
/// If the options name no producers, designs or cost-model settings.
pub fn run(opts: &RingOptions) -> Result<Report> {
    assert!(!opts.producers.is_empty() && !opts.designs.is_empty() && !opts.cost_model.is_empty());
    let machine = Machine::detect();
    let per_trial = opts.cost_model.len() * opts.producers.len() * opts.designs.len();
    let bar = crate::progress::bar((per_trial * opts.trials.max(1)) as u64, opts.quiet);
    // Messages of each point, calibrated in the first trial.
    let mut budget: BTreeMap<(bool, usize, usize), u64> = BTreeMap::new();
    let mut points: Vec<RingPoint> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let limit = Duration::from_secs_f64((opts.seconds_per_point * 60.0).max(10.0));
    // Four ring-fulls of 16-byte records (an 8-byte message and its header).
    let min_total = opts.min_messages.max(opts.ring_bytes / 4);
    for trial in 0..opts.trials.max(1) {
        for &cost in &opts.cost_model {
            for &producers in &opts.producers {
                for (di, &design) in opts.designs.iter().enumerate() {
                    bar.set_message(format!(
                        "trial {} · DMA cost model {} · {} · {producers} producers",
                        trial + 1,
                        if cost { "on" } else { "off" },
                        label(design)
                    ));
                    let mut spec = PointSpec {
                        design: design.name().into(),
                        producers,
                        msgs_per_producer: 1,
                        msg_bytes: opts.msg_bytes,
                        cost_model: cost,
                        ring_bytes: opts.ring_bytes,
                    };
                    let every = BenchConfig::new(design, 1, 1, 8, None).sample_every;
                    let per_producer =
                        |total: u64| (total.div_ceil(producers as u64) as usize).max(every);
                    let total = match budget.get(&(cost, producers, di)) {
                        Some(&n) => n,
                        None => {
                            // Pilot run: also warms the design up.
                            spec.msgs_per_producer = per_producer(min_total);
                            let pilot = run_one(opts, &spec, limit, &mut failures)?;
                            let rate = pilot.msgs_per_sec.max(1.0);
                            let n = ((rate * opts.seconds_per_point) as u64)
                                .clamp(min_total, opts.max_messages.max(min_total));
                            budget.insert((cost, producers, di), n);
                            n
                        }
                    };
                    spec.msgs_per_producer = per_producer(total);
                    let figures = run_one(opts, &spec, limit, &mut failures)?;
                    points.push(RingPoint { trial, figures });
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    Ok(summarize(opts, machine, points, failures))
}

/// Median figures of one (cost model, design, producers) cell.
#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    msgs_per_sec: f64,
    median_latency_ns: f64,
    cpu_ns_per_msg: f64,
}

fn cells(points: &[RingPoint], agg: fn(&[f64]) -> f64) -> BTreeMap<(bool, String, usize), Cell> {
    let mut groups: BTreeMap<(bool, String, usize), Vec<&RingPoint>> = BTreeMap::new();
    for p in points {
        groups
            .entry((
                p.figures.cost_model,
                p.figures.design.clone(),
                p.figures.producers,
            ))
            .or_default()
            .push(p);
    }
    groups
        .into_iter()
        .map(|(k, v)| {
            let m =
                |f: &dyn Fn(&RingPoint) -> f64| agg(&v.iter().map(|p| f(p)).collect::<Vec<_>>());
            (
                k,
                Cell {
                    msgs_per_sec: m(&|p| p.figures.msgs_per_sec),
                    median_latency_ns: m(&|p| p.figures.median_latency_ns as f64),
                    cpu_ns_per_msg: m(&|p| p.figures.cpu_ns_per_msg),
                },
            )
        })
        .collect()
}

fn summarize(
    opts: &RingOptions,
    machine: Machine,
    points: Vec<RingPoint>,
    failures: Vec<String>,
) -> Report {
    let (lo, hi) = (cells(&points, min_of), cells(&points, max_of));
    let cells = cells(&points, median);
    let top = *opts.producers.iter().max().expect("producers");
    let get =
        |cost: bool, d: Design, p: usize| cells.get(&(cost, d.name().to_string(), p)).copied();
    let spread = |cost: bool, d: Design, p: usize, f: &dyn Fn(Cell) -> f64| {
        let k = (cost, d.name().to_string(), p);
        Some((p as f64, f(*lo.get(&k)?), f(*hi.get(&k)?)))
    };
    let mut summary = serde_json::Map::new();
    summary.insert("producers".into(), json!(top));
    summary.insert("msg_bytes".into(), json!(opts.msg_bytes));
    summary.insert("trials".into(), json!(opts.trials.max(1)));
    summary.insert("isolated_points".into(), json!(opts.isolate.is_some()));
    summary.insert("failed_attempts".into(), json!(failures.len()));
    summary.insert("failures".into(), json!(failures));
    let mut targets = Vec::new();
    for &cost in &opts.cost_model {
        let mut s = serde_json::Map::new();
        let rate = |d: Design| get(cost, d, top).map_or(0.0, |c| c.msgs_per_sec);
        for &d in &opts.designs {
            if let Some(c) = get(cost, d, top) {
                s.insert(format!("{}_msgs_per_sec", d.name()), json!(c.msgs_per_sec));
                s.insert(
                    format!("{}_median_latency_ns", d.name()),
                    json!(c.median_latency_ns),
                );
                s.insert(
                    format!("{}_cpu_ns_per_msg", d.name()),
                    json!(c.cpu_ns_per_msg),
                );
            }
        }
        let progress = rate(Design::Progress);
        let r_lock = ratio(progress, rate(Design::LockBased));
        let r_farm = ratio(progress, rate(Design::FarmStyle));
        let r_aq = ratio(progress, rate(Design::CrossbeamArrayQueue));
        s.insert("progress_over_lock_based".into(), json!(r_lock));
        s.insert("progress_over_farm_style".into(), json!(r_farm));
        s.insert("progress_over_array_queue".into(), json!(r_aq));
        summary.insert(key(cost).into(), serde_json::Value::Object(s));
        if cost {
            let at = format!("at {top} producers, DMA cost model on");
            targets.push(Target::at_least(
                format!("progress ring msgs/s {at}"),
                progress,
                20e6,
            ));
            targets.push(Target::at_least(
                format!("progress / lock-based {at}"),
                r_lock,
                4.5,
            ));
            targets.push(Target::at_least(
                format!("progress / FaRM-style {at}"),
                r_farm,
                10.0,
            ));
            targets.push(Target::at_least(
                format!("progress / ArrayQueue {at}"),
                r_aq,
                2.0,
            ));
        }
    }
    summary.insert("targets".into(), json!(targets));

    let note = format!(
        "{} CPUs, {}; DPU consumer: emulated (DMA engine with PCIe cost model), {} B messages",
        machine.nproc, machine.cpu_model, opts.msg_bytes
    );
    let mut tables = Vec::new();
    let mut charts = Vec::new();
    for &cost in &opts.cost_model {
        let on = if cost { "on" } else { "off" };
        let mut heads = vec!["producers".to_string()];
        heads.extend(
            opts.designs
                .iter()
                .map(|d| format!("{} msgs/s (CPU ns/msg)", label(*d))),
        );
        let heads_ref: Vec<&str> = heads.iter().map(String::as_str).collect();
        let mut t = Table::new(
            format!("Throughput, DMA cost model {}", cost_model_text(cost)),
            &heads_ref,
        );
        let mut heads_l = vec!["producers".to_string()];
        heads_l.extend(opts.designs.iter().map(|d| format!("{} p50 µs", label(*d))));
        let heads_l: Vec<&str> = heads_l.iter().map(String::as_str).collect();
        let mut tl = Table::new(
            format!("Median message latency, DMA cost model {on}"),
            &heads_l,
        );
        for &p in &opts.producers {
            let mut row = vec![p.to_string()];
            let mut row_l = vec![p.to_string()];
            for &d in &opts.designs {
                let c = get(cost, d, p).unwrap_or_default();
                row.push(format!(
                    "{} ({:.0})",
                    fmt_num(c.msgs_per_sec),
                    c.cpu_ns_per_msg
                ));
                row_l.push(format!("{:.2}", c.median_latency_ns / 1e3));
            }
            t.row(row);
            tl.row(row_l);
        }
        tables.push(t);
        tables.push(tl);
        let series = |f: &dyn Fn(Cell) -> f64| -> Vec<Series> {
            opts.designs
                .iter()
                .map(|&d| Series {
                    name: label(d).into(),
                    points: opts
                        .producers
                        .iter()
                        .filter_map(|&p| get(cost, d, p).map(|c| (p as f64, f(c))))
                        .collect(),
                    spread: opts
                        .producers
                        .iter()
                        .filter_map(|&p| spread(cost, d, p, f))
                        .collect(),
                })
                .collect()
        };
        charts.push(LineChart {
            file: format!("ring-throughput-dma-{on}.png"),
            title: format!(
                "Ring throughput, {} B messages, DMA cost model {on}",
                opts.msg_bytes
            ),
            note: note.clone(),
            x_label: "host producer threads".into(),
            y_label: "messages / s".into(),
            log_y: true,
            series: series(&|c| c.msgs_per_sec),
        });
        charts.push(LineChart {
            file: format!("ring-latency-dma-{on}.png"),
            title: format!("Median message latency, DMA cost model {on}"),
            note: note.clone(),
            x_label: "host producer threads".into(),
            y_label: "median latency (µs)".into(),
            log_y: true,
            series: series(&|c| c.median_latency_ns / 1e3),
        });
    }
    Report {
        benchmark: "ring".into(),
        command: opts.command.clone(),
        dpu_emulation: format!(
            "emulated: the DPU consumer is a thread of the benchmark process that reaches the \
             rings only through the emulated DMA engine; DMA cost model {} (targets), {}",
            cost_model_text(true),
            if opts.cost_model.contains(&false) {
                format!("and {} (reported)", cost_model_text(false))
            } else {
                "only".into()
            }
        ),
        machine,
        config: json!(opts),
        summary: serde_json::Value::Object(summary),
        points: json!(points),
        tables,
        charts,
        panels: Vec::new(),
    }
}
