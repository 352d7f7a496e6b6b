//! The summary of `dds bench files`: medians (and spreads) of the trials for each mode and I/O
//! size, the ratios between the modes, the report's tables and figures.

use super::*;

#[derive(Clone, Copy, Debug, Default)]
struct Cell {
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    host_cpu_us: f64,
    dpu_cpu_us: f64,
    dpu_dma_us: f64,
}

pub(super) fn summarize(
    opts: &FilesOptions,
    machine: Machine,
    points: Vec<FilesPoint>,
    peak_rss: &BTreeMap<FilesMode, u64>,
    idle_dpu_cores: Option<f64>,
) -> Report {
    let mut groups: BTreeMap<(FilesMode, u32), Vec<&FilesPoint>> = BTreeMap::new();
    for p in &points {
        groups.entry((p.mode, p.io_bytes)).or_default().push(p);
    }
    let aggregate = |agg: fn(&[f64]) -> f64| -> BTreeMap<(FilesMode, u32), Cell> {
        groups
            .iter()
            .map(|(&k, v)| {
                let m = |f: &dyn Fn(&FilesPoint) -> f64| {
                    agg(&v.iter().map(|p| f(p)).collect::<Vec<_>>())
                };
                (
                    k,
                    Cell {
                        iops: m(&|p| p.result.ops_per_sec),
                        p50_us: m(&|p| p.result.p50_us),
                        p99_us: m(&|p| p.result.p99_us),
                        host_cpu_us: m(&|p| p.host_cpu_us_per_op),
                        dpu_cpu_us: m(&|p| p.dpu_cpu_us_per_op.unwrap_or(0.0)),
                        dpu_dma_us: m(&|p| p.dpu_dma_execute_us_per_op.unwrap_or(0.0)),
                    },
                )
            })
            .collect()
    };
    let cells = aggregate(median);
    let (lo, hi) = (aggregate(min_of), aggregate(max_of));
    let get = |m: FilesMode, s: u32| cells.get(&(m, s)).copied().unwrap_or_default();
    let small = *opts.sizes.iter().min().expect("sizes");
    let large = *opts.sizes.iter().max().expect("sizes");
    let mut summary = serde_json::Map::new();
    summary.insert("read_ratio".into(), json!(opts.read_ratio));
    summary.insert("threads".into(), json!(opts.threads));
    summary.insert("depth_per_thread".into(), json!(opts.depth));
    summary.insert("file_bytes".into(), json!(opts.file_bytes));
    summary.insert("dma_cost_model".into(), json!(opts.dma_cost));
    for &mode in &opts.modes {
        let mut s = serde_json::Map::new();
        for &size in &opts.sizes {
            let c = get(mode, size);
            let l = size_label(size);
            s.insert(format!("iops_{l}"), json!(c.iops));
            s.insert(format!("host_cpu_us_per_op_{l}"), json!(c.host_cpu_us));
            if mode != FilesMode::IoUring {
                s.insert(format!("dpu_cpu_us_per_op_{l}"), json!(c.dpu_cpu_us));
                // Of which the emulated DMA engine's copies (a hardware engine's work).
                s.insert(
                    format!("dpu_dma_execute_us_per_op_{l}"),
                    json!(c.dpu_dma_us),
                );
            }
            s.insert(format!("p50_us_{l}"), json!(c.p50_us));
            s.insert(format!("p99_us_{l}"), json!(c.p99_us));
        }
        summary.insert(mode.name().into(), serde_json::Value::Object(s));
    }
    let mut targets = Vec::new();
    let has = |m: FilesMode| opts.modes.contains(&m);
    let ll = size_label(large);
    if has(FilesMode::ZeroCopy) && has(FilesMode::Copy) {
        let r = ratio(
            get(FilesMode::ZeroCopy, large).iops,
            get(FilesMode::Copy, large).iops,
        );
        summary.insert(format!("zero_copy_over_copy_iops_{ll}"), json!(r));
        targets.push(Target::at_least(
            format!("zero-copy / copy IOPS at {}", size_text(large)),
            r,
            1.5,
        ));
    }
    if has(FilesMode::ZeroCopy) && has(FilesMode::IoUring) {
        // Per size: the library (zero copy) against the host's own io_uring, same host CPUs.
        for &size in &opts.sizes {
            let l = size_label(size);
            let (z, u) = (
                get(FilesMode::ZeroCopy, size),
                get(FilesMode::IoUring, size),
            );
            let r_iops = ratio(z.iops, u.iops);
            let r_cpu = ratio(z.host_cpu_us, u.host_cpu_us);
            let r_dpu = ratio(z.dpu_cpu_us, u.host_cpu_us);
            summary.insert(format!("library_over_io_uring_iops_{l}"), json!(r_iops));
            summary.insert(format!("library_over_io_uring_host_cpu_{l}"), json!(r_cpu));
            summary.insert(format!("dpu_cpu_over_io_uring_host_cpu_{l}"), json!(r_dpu));
            // Beside it, not a target: the same without the emulated engine's copies, the DPU
            // CPU a hardware DMA engine would leave.
            summary.insert(
                format!("dpu_cpu_without_dma_execute_over_io_uring_host_cpu_{l}"),
                json!(ratio(z.dpu_cpu_us - z.dpu_dma_us, u.host_cpu_us)),
            );
            // Each side's own µs per op beside the ratio (a weaker baseline would show).
            summary.insert(
                format!("io_uring_host_cpu_us_per_op_{l}"),
                json!(u.host_cpu_us),
            );
            summary.insert(
                format!("zero_copy_dpu_cpu_us_per_op_{l}"),
                json!(z.dpu_cpu_us),
            );
            let text = size_text(size);
            if size == small && size != 4096 {
                targets.push(Target::at_least(
                    format!("library (zero-copy) / io_uring IOPS at {text}"),
                    r_iops,
                    0.9,
                ));
            }
            if size == 4096 {
                targets.push(Target::at_least(
                    format!("library (zero-copy) / io_uring IOPS at {text}"),
                    r_iops,
                    1.0,
                ));
                targets.push(Target::at_most(
                    format!("library (zero-copy) / io_uring host CPU per op at {text}"),
                    r_cpu,
                    0.25,
                ));
                // The DPU serving an I/O for no more CPU than io_uring on the host spends.
                targets.push(Target::at_most(
                    format!("dpu_cpu_over_io_uring_host_cpu_{l}"),
                    r_dpu,
                    1.0,
                ));
            }
            if size == 64 << 10 {
                targets.push(Target::at_most(
                    format!("library (zero-copy) / io_uring host CPU per op at {text}"),
                    r_cpu,
                    0.3,
                ));
            }
        }
    }
    if has(FilesMode::ZeroCopy) && has(FilesMode::Registered) {
        // Host-side zero copy: the same DPU and workload, buffers registered or not.
        for &size in &opts.sizes {
            let l = size_label(size);
            let (z, r) = (
                get(FilesMode::ZeroCopy, size),
                get(FilesMode::Registered, size),
            );
            summary.insert(
                format!("registered_over_copy_path_host_cpu_{l}"),
                json!(ratio(r.host_cpu_us, z.host_cpu_us)),
            );
            summary.insert(
                format!("registered_over_copy_path_iops_{l}"),
                json!(ratio(r.iops, z.iops)),
            );
        }
    }
    if has(FilesMode::Registered) && has(FilesMode::IoUring) {
        // The library as an application that registers its buffers uses it (host-side zero
        // copy), against the host's own io_uring. The `library_*` keys above are the copy path.
        for &size in &opts.sizes {
            let l = size_label(size);
            let (r, u) = (
                get(FilesMode::Registered, size),
                get(FilesMode::IoUring, size),
            );
            let r_cpu = ratio(r.host_cpu_us, u.host_cpu_us);
            let r_iops = ratio(r.iops, u.iops);
            summary.insert(format!("registered_over_io_uring_iops_{l}"), json!(r_iops));
            summary.insert(
                format!("registered_over_io_uring_host_cpu_{l}"),
                json!(r_cpu),
            );
            summary.insert(
                format!("registered_host_cpu_us_per_op_{l}"),
                json!(r.host_cpu_us),
            );
            if size == 4096 {
                // The application's file I/O through DDS at least as fast as io_uring on the
                // host, for a quarter of its host CPU (the paper's Fig. 17).
                targets.push(Target::at_least(
                    format!("registered_over_io_uring_iops_{l}"),
                    r_iops,
                    1.0,
                ));
                targets.push(Target::at_most(
                    format!("registered_over_io_uring_host_cpu_{l}"),
                    r_cpu,
                    0.25,
                ));
            }
            if size == 64 << 10 {
                targets.push(Target::at_most(
                    format!(
                        "library (registered buffers) / io_uring host CPU per op at {}",
                        size_text(size)
                    ),
                    r_cpu,
                    0.3,
                ));
            }
        }
    }
    if let Some(cores) = idle_dpu_cores {
        summary.insert("idle_dpu_cpu_cores".into(), json!(cores));
        targets.push(Target::at_most(
            "idle DPU CPU (cores), four connected idle host groups",
            cores,
            0.02,
        ));
    }
    if let Some(&rss) = peak_rss.get(&FilesMode::ZeroCopy) {
        summary.insert("dpu_peak_rss_bytes".into(), json!(rss));
        targets.push(Target::at_most(
            "DPU process peak RSS (VmHWM), default settings, MiB",
            rss as f64 / (1u64 << 20) as f64,
            1024.0,
        ));
    }
    if let Some(&rss) = peak_rss.get(&FilesMode::Copy) {
        summary.insert("dpu_peak_rss_bytes_copy_mode".into(), json!(rss));
    }
    summary.insert("targets".into(), json!(targets));

    let mut t = Table::new(
        format!(
            "Random I/O, {:.0}% reads, {} threads × {} outstanding, {} MiB file, medians of {} trial(s)",
            opts.read_ratio * 100.0,
            opts.threads,
            opts.depth,
            opts.file_bytes >> 20,
            opts.trials.max(1)
        ),
        &[
            "size",
            "mode",
            "IOPS",
            "MB/s",
            "p50 µs",
            "p99 µs",
            "host CPU µs/op",
            "DPU CPU µs/op",
        ],
    );
    for &size in &opts.sizes {
        for &mode in &opts.modes {
            let c = get(mode, size);
            t.row(vec![
                size_text(size),
                mode.label().into(),
                fmt_num(c.iops),
                format!("{:.1}", c.iops * size as f64 / 1e6),
                format!("{:.0}", c.p50_us),
                format!("{:.0}", c.p99_us),
                format!("{:.2}", c.host_cpu_us),
                if mode == FilesMode::IoUring {
                    "-".into()
                } else {
                    format!("{:.2}", c.dpu_cpu_us)
                },
            ]);
        }
    }
    let mut tr = Table::new(
        "Ratios",
        &[
            "size",
            "zero-copy / copy IOPS",
            "library / io_uring IOPS",
            "library / io_uring host CPU per op",
        ],
    );
    for &size in &opts.sizes {
        let (z, c, u) = (
            get(FilesMode::ZeroCopy, size),
            get(FilesMode::Copy, size),
            get(FilesMode::IoUring, size),
        );
        tr.row(vec![
            size_text(size),
            format!("{:.2}", ratio(z.iops, c.iops)),
            format!("{:.2}", ratio(z.iops, u.iops)),
            format!("{:.2}", ratio(z.host_cpu_us, u.host_cpu_us)),
        ]);
    }
    let mut treg = Table::new(
        "Host CPU per op: library copy path against registered buffers (same zero-copy DPU)",
        &[
            "size",
            "copy path µs/op",
            "registered µs/op",
            "registered / copy path",
            "copy path IOPS",
            "registered IOPS",
        ],
    );
    if opts.modes.contains(&FilesMode::ZeroCopy) && opts.modes.contains(&FilesMode::Registered) {
        for &size in &opts.sizes {
            let (z, r) = (
                get(FilesMode::ZeroCopy, size),
                get(FilesMode::Registered, size),
            );
            treg.row(vec![
                size_text(size),
                format!("{:.2}", z.host_cpu_us),
                format!("{:.2}", r.host_cpu_us),
                format!("{:.2}", ratio(r.host_cpu_us, z.host_cpu_us)),
                fmt_num(z.iops),
                fmt_num(r.iops),
            ]);
        }
    }
    let note = format!(
        "{} CPUs, {}; DPU emulated (separate process, DMA cost model {}); {} threads x {} outstanding, {:.0}% reads",
        machine.nproc,
        machine.cpu_model,
        if opts.dma_cost { "on" } else { "off" },
        opts.threads,
        opts.depth,
        opts.read_ratio * 100.0
    );
    let series = |f: &dyn Fn(Cell) -> f64| -> Vec<Series> {
        opts.modes
            .iter()
            .map(|&m| Series {
                name: m.label().into(),
                points: opts
                    .sizes
                    .iter()
                    .map(|&s| ((s / 1024) as f64, f(get(m, s))))
                    .collect(),
                spread: opts
                    .sizes
                    .iter()
                    .filter_map(|&s| {
                        let (l, h) = (lo.get(&(m, s))?, hi.get(&(m, s))?);
                        Some(((s / 1024) as f64, f(*l), f(*h)))
                    })
                    .collect(),
            })
            .collect()
    };
    let charts = vec![
        LineChart {
            file: "files-iops.png".into(),
            title: "Random file I/O: IOPS vs I/O size".into(),
            note: note.clone(),
            x_label: "I/O size (KiB)".into(),
            y_label: "IOPS".into(),
            log_y: true,
            series: series(&|c| c.iops),
        },
        LineChart {
            file: "files-host-cpu.png".into(),
            title: "Host CPU per operation vs I/O size".into(),
            note: note.clone(),
            x_label: "I/O size (KiB)".into(),
            y_label: "host CPU per op (µs)".into(),
            log_y: false,
            series: series(&|c| c.host_cpu_us),
        },
        LineChart {
            file: "files-latency.png".into(),
            title: "Median latency vs I/O size".into(),
            note,
            x_label: "I/O size (KiB)".into(),
            y_label: "p50 latency (µs)".into(),
            log_y: true,
            series: series(&|c| c.p50_us),
        },
    ];
    Report {
        benchmark: "files".into(),
        command: opts.command.clone(),
        dpu_emulation: format!(
            "emulated: `dds dpu` runs as a separate process and reaches host memory only through \
             the emulated DMA engine; DMA cost model {}; the host io_uring baseline runs in the \
             benchmark process",
            cost_model_text(opts.dma_cost)
        ),
        machine,
        config: json!(opts),
        summary: serde_json::Value::Object(summary),
        points: json!(points),
        tables: if treg.rows.is_empty() {
            vec![t, tr]
        } else {
            vec![t, tr, treg]
        },
        charts,
        panels: Vec::new(),
    }
}
