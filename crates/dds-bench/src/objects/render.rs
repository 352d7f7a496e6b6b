//! The report of a run: the tables, the figures (throughput, latency and CPU by placement and
//! object size) and the JSON of every point.

use super::dmapath;
use super::workload::{Phase, Point};
use super::{cell, rel, size_label, ObjectsArgs, Plan, OSDS};
use crate::machine::{cost_model_text, Machine};
use crate::placement::Placement;
use crate::plot::{LineChart, Series};
use crate::report::{Report, Table, Target};
use serde_json::{json, Value};

#[allow(clippy::too_many_arguments)]
pub(super) fn report(
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
