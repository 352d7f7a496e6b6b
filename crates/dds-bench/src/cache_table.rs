//! `dds bench cache-table` — the offload engine's cache table (§6.2): one writer fills the
//! table, then 1..N reader threads look up uniformly random present keys. The cuckoo table
//! runs side by side with `DashMap` and `RwLock<HashMap>` (same hash function), trial after
//! trial, so the ratios compare runs made under the same machine load.

use std::collections::BTreeMap;

use dds_cache::bench::{run as run_point, BenchPoint, TableKind};
use serde::Serialize;
use serde_json::json;

use crate::machine::Machine;
use crate::plot::{LineChart, Series};
use crate::report::{fmt_num, max_of, median, min_of, ratio, Report, Table, Target};

/// Settings of a cache-table benchmark run.
#[derive(Clone, Debug, Serialize)]
pub struct CacheOptions {
    /// Item counts.
    pub items: Vec<usize>,
    /// Reader thread counts.
    pub readers: Vec<usize>,
    pub lookups_per_reader: usize,
    pub trials: usize,
    #[serde(skip)]
    pub kinds: Vec<TableKind>,
    #[serde(skip)]
    pub quiet: bool,
    pub command: String,
}

/// Reader counts 1, 2, 4, ... up to twice the CPUs (at least 4).
pub fn default_readers() -> Vec<usize> {
    let n = std::thread::available_parallelism().map_or(1, usize::from);
    let top = (2 * n).max(4);
    let mut v = vec![1];
    while v.last().copied().unwrap_or(1) * 2 <= top {
        v.push(v.last().copied().unwrap_or(1) * 2);
    }
    v
}

impl CacheOptions {
    /// 1 Mi and 16 Mi items.
    pub fn full() -> CacheOptions {
        CacheOptions {
            items: vec![1 << 20, 1 << 24],
            readers: default_readers(),
            lookups_per_reader: 3_000_000,
            trials: 3,
            kinds: TableKind::ALL.to_vec(),
            quiet: false,
            command: "dds bench cache-table".into(),
        }
    }

    /// 1 Mi items only, fewer lookups, one trial.
    pub fn quick() -> CacheOptions {
        CacheOptions {
            items: vec![1 << 20],
            lookups_per_reader: 1_000_000,
            trials: 1,
            command: "dds bench cache-table --quick".into(),
            ..CacheOptions::full()
        }
    }
}

/// One measured point with the CPU it cost.
#[derive(Clone, Debug, Serialize)]
pub struct CachePoint {
    pub trial: usize,
    #[serde(flatten)]
    pub point: BenchPoint,
    /// CPU time per lookup: readers never block (no writer runs during the lookups), so each
    /// running reader keeps one CPU busy: `min(readers, CPUs) / lookups per second`.
    pub cpu_ns_per_lookup: f64,
}

fn items_label(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// Runs the benchmark.
///
/// # Panics
/// If a lookup misses or returns a wrong item (a bug), or the options are empty.
pub fn run(opts: &CacheOptions) -> Report {
    assert!(!opts.items.is_empty() && !opts.readers.is_empty() && !opts.kinds.is_empty());
    let machine = Machine::detect();
    let trials = opts.trials.max(1);
    let bar = crate::progress::bar(
        (trials * opts.items.len() * opts.readers.len() * opts.kinds.len()) as u64,
        opts.quiet,
    );
    let mut points = Vec::new();
    for trial in 0..trials {
        for &items in &opts.items {
            for &readers in &opts.readers {
                for &kind in &opts.kinds {
                    bar.set_message(format!(
                        "trial {} · {} items · {readers} readers · {}",
                        trial + 1,
                        items_label(items),
                        kind.name()
                    ));
                    let point = run_point(kind, items, readers, opts.lookups_per_reader);
                    let busy = readers.min(machine.nproc) as f64;
                    points.push(CachePoint {
                        trial,
                        cpu_ns_per_lookup: busy * 1e9 / point.lookups_per_sec.max(1.0),
                        point,
                    });
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    summarize(opts, machine, points)
}

#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    inserts_per_sec: f64,
    lookups_per_sec: f64,
    cpu_ns_per_lookup: f64,
    memory_bytes: f64,
}

fn summarize(opts: &CacheOptions, machine: Machine, points: Vec<CachePoint>) -> Report {
    let mut groups: BTreeMap<(usize, usize, &'static str), Vec<&CachePoint>> = BTreeMap::new();
    for p in &points {
        groups
            .entry((p.point.items, p.point.readers, p.point.kind.name()))
            .or_default()
            .push(p);
    }
    let aggregate = |agg: fn(&[f64]) -> f64| -> BTreeMap<_, Cell> {
        groups
            .iter()
            .map(|(&k, v)| {
                let m = |f: &dyn Fn(&CachePoint) -> f64| {
                    agg(&v.iter().map(|p| f(p)).collect::<Vec<_>>())
                };
                (
                    k,
                    Cell {
                        inserts_per_sec: m(&|p| p.point.inserts_per_sec),
                        lookups_per_sec: m(&|p| p.point.lookups_per_sec),
                        cpu_ns_per_lookup: m(&|p| p.cpu_ns_per_lookup),
                        memory_bytes: m(&|p| p.point.memory_bytes as f64),
                    },
                )
            })
            .collect()
    };
    let cells = aggregate(median);
    let (lo, hi) = (aggregate(min_of), aggregate(max_of));
    let get = |items: usize, readers: usize, kind: TableKind| {
        cells
            .get(&(items, readers, kind.name()))
            .copied()
            .unwrap_or_default()
    };
    // Reader count the ratios are taken at: every CPU busy (or the largest below).
    let nproc = machine.nproc;
    let ratio_readers = opts
        .readers
        .iter()
        .copied()
        .filter(|&r| r <= nproc)
        .max()
        .unwrap_or(opts.readers[0]);

    let mut summary = serde_json::Map::new();
    summary.insert("readers_for_ratios".into(), json!(ratio_readers));
    let mut targets = Vec::new();
    let mut by_items = serde_json::Map::new();
    for &items in &opts.items {
        let mut s = serde_json::Map::new();
        s.insert("items".into(), json!(items));
        let mut best = BTreeMap::new();
        for &kind in &opts.kinds {
            let inserts = median(
                &opts
                    .readers
                    .iter()
                    .map(|&r| get(items, r, kind).inserts_per_sec)
                    .collect::<Vec<_>>(),
            );
            let peak = opts
                .readers
                .iter()
                .map(|&r| get(items, r, kind).lookups_per_sec)
                .fold(0.0, f64::max);
            let at = get(items, ratio_readers, kind);
            best.insert(kind.name(), (peak, at.lookups_per_sec));
            let n = kind.name().replace('-', "_");
            s.insert(format!("{n}_inserts_per_sec"), json!(inserts));
            s.insert(format!("{n}_peak_lookups_per_sec"), json!(peak));
            s.insert(
                format!("{n}_lookups_per_sec_at_ratio_readers"),
                json!(at.lookups_per_sec),
            );
            s.insert(
                format!("{n}_cpu_ns_per_lookup"),
                json!(at.cpu_ns_per_lookup),
            );
            s.insert(format!("{n}_memory_bytes"), json!(at.memory_bytes));
        }
        let cuckoo = best.get("cuckoo").copied().unwrap_or_default();
        let dash = best.get("dashmap").copied().unwrap_or_default();
        let rw = best.get("rwlock-hashmap").copied().unwrap_or_default();
        let r_dash = ratio(cuckoo.1, dash.1);
        s.insert("cuckoo_over_dashmap_lookups".into(), json!(r_dash));
        s.insert(
            "cuckoo_over_rwlock_lookups".into(),
            json!(ratio(cuckoo.1, rw.1)),
        );
        let label = items_label(items);
        if opts.kinds.contains(&TableKind::Cuckoo) {
            let ins = s["cuckoo_inserts_per_sec"].as_f64().unwrap_or(0.0);
            targets.push(Target::at_least(
                format!("cuckoo inserts/s, {label} items"),
                ins,
                1.2e6,
            ));
            targets.push(Target::at_least(
                format!("cuckoo aggregate lookups/s (best reader count), {label} items"),
                cuckoo.0,
                15.7e6,
            ));
            if opts.kinds.contains(&TableKind::DashMap) {
                let goal = if items >= 16 << 20 { 1.5 } else { 2.0 };
                targets.push(Target::at_least(
                    format!("cuckoo / dashmap lookups/s, {label} items, {ratio_readers} readers"),
                    r_dash,
                    goal,
                ));
            }
        }
        by_items.insert(label, serde_json::Value::Object(s));
    }
    summary.insert("by_items".into(), serde_json::Value::Object(by_items));
    summary.insert("targets".into(), json!(targets));

    let mut tables = Vec::new();
    let mut charts = Vec::new();
    let note = format!(
        "{} CPUs, {}; table in process (offload engine of the emulated DPU, no DMA); {} lookups per reader; medians of {} trial(s)",
        machine.nproc,
        machine.cpu_model,
        opts.lookups_per_reader,
        opts.trials.max(1)
    );
    for &items in &opts.items {
        let label = items_label(items);
        let mut t = Table::new(
            format!("{label} items ({items}): lookups/s (CPU ns per lookup)"),
            &[
                "readers",
                "cuckoo",
                "dashmap",
                "RwLock<HashMap>",
                "cuckoo / dashmap",
            ],
        );
        for &r in &opts.readers {
            let c = get(items, r, TableKind::Cuckoo);
            let d = get(items, r, TableKind::DashMap);
            let w = get(items, r, TableKind::RwLockHashMap);
            let f = |c: Cell| {
                format!(
                    "{} ({:.0})",
                    fmt_num(c.lookups_per_sec),
                    c.cpu_ns_per_lookup
                )
            };
            t.row(vec![
                r.to_string(),
                f(c),
                f(d),
                f(w),
                format!("{:.2}", ratio(c.lookups_per_sec, d.lookups_per_sec)),
            ]);
        }
        tables.push(t);
        let mut ti = Table::new(
            format!("{label} items: one writer's inserts/s and table memory"),
            &["table", "inserts/s", "memory (MiB)", "bytes per item"],
        );
        for &kind in &opts.kinds {
            let ins = median(
                &opts
                    .readers
                    .iter()
                    .map(|&r| get(items, r, kind).inserts_per_sec)
                    .collect::<Vec<_>>(),
            );
            let mem = get(items, opts.readers[0], kind).memory_bytes;
            ti.row(vec![
                kind.name().into(),
                fmt_num(ins),
                format!("{:.1}", mem / (1u64 << 20) as f64),
                format!("{:.1}", mem / items as f64),
            ]);
        }
        tables.push(ti);
        charts.push(LineChart {
            file: format!("cache-table-lookups-{}.png", label.to_lowercase()),
            title: format!("Cache table lookups, {label} items"),
            note: note.clone(),
            x_label: "reader threads".into(),
            y_label: "lookups / s (aggregate)".into(),
            log_y: false,
            series: opts
                .kinds
                .iter()
                .map(|&k| Series {
                    name: k.name().into(),
                    points: opts
                        .readers
                        .iter()
                        .map(|&r| (r as f64, get(items, r, k).lookups_per_sec))
                        .collect(),
                    spread: opts
                        .readers
                        .iter()
                        .filter_map(|&r| {
                            let key = (items, r, k.name());
                            let (l, h) = (lo.get(&key)?, hi.get(&key)?);
                            Some((r as f64, l.lookups_per_sec, h.lookups_per_sec))
                        })
                        .collect(),
                })
                .collect(),
        });
    }
    Report {
        benchmark: "cache-table".into(),
        command: opts.command.clone(),
        dpu_emulation: "the cache table runs in the benchmark process (the offload engine's \
                        table on an emulated DPU is host code; no DMA involved)"
            .into(),
        machine,
        config: json!(opts),
        summary: serde_json::Value::Object(summary),
        points: json!(points),
        tables,
        charts,
        panels: Vec::new(),
    }
}
