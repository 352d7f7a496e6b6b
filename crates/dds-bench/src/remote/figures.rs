//! The remote-storage benchmark's figures (Figs. 13, 14, 20).

use super::*;

pub(super) fn series(
    points: &[Value],
    mode: &str,
    op: &str,
    cores: Option<u64>,
    x: &str,
    y: &str,
) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p["mode"] == mode && p["op"] == op)
        .filter(|p| cores.is_none_or(|c| p["host_cores"] == c))
        .map(|p| (f(p, x), f(p, y)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

pub(super) const MODES: [(&str, &str); 3] = [
    ("a", "TCP + OS files"),
    ("b", "TCP + DDS files"),
    ("c", "DDS offload"),
];

/// Figs. 13, 14 and 20 (the last when both offload modes ran), for [`Report::write`].
pub(super) fn remote_figures(points: &[Value], max_cores: u64, quick: bool) -> Vec<Figure> {
    let note = format!(
        "emulated DPU (separate `dds dpu` process){}",
        if quick { ", quick run" } else { "" }
    );
    let kiops = |v: Vec<(f64, f64)>| -> Vec<(f64, f64)> {
        v.into_iter().map(|(x, y)| (x / 1e3, y)).collect()
    };
    let mut charts13 = Vec::new();
    for op in ["read", "write"] {
        let s: Vec<Series> = MODES
            .iter()
            .map(|(m, label)| Series {
                name: label.to_string(),
                points: kiops(series(
                    points,
                    m,
                    op,
                    Some(max_cores),
                    "throughput",
                    "host_cores_used",
                )),
                secondary: false,
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        if !s.is_empty() {
            charts13.push(Chart {
                title: format!("Fig. 13 ({op}s): host CPU vs throughput"),
                note: note.clone(),
                x_label: "throughput (K IOPS)".into(),
                y_label: "host server CPU (cores)".into(),
                series: s,
            });
        }
    }
    // Peak read throughput vs host cores the server may use (taskset, within the host side's).
    let mut by_cores = Vec::new();
    for (m, label) in MODES {
        let mut pts = Vec::new();
        for c in 1..=max_cores {
            let best = points
                .iter()
                .filter(|p| p["mode"] == m && p["op"] == "read" && p["host_cores"] == c)
                .map(|p| f(p, "throughput"))
                .fold(0.0f64, f64::max);
            if best > 0.0 {
                pts.push((c as f64, best / 1e3));
            }
        }
        if !pts.is_empty() {
            by_cores.push(Series {
                name: label.into(),
                points: pts,
                secondary: false,
            });
        }
    }
    charts13.push(Chart {
        title: "Fig. 13: peak read throughput vs host cores (taskset)".into(),
        note: note.clone(),
        x_label: "host cores available to the server".into(),
        y_label: "throughput (K IOPS)".into(),
        series: by_cores,
    });
    let mut figures = vec![Figure {
        file: "remote-fig13.png".into(),
        charts: charts13,
    }];

    let mut charts14 = Vec::new();
    for op in ["read", "write"] {
        let mut s = Vec::new();
        for (m, label) in MODES {
            let p50 = kiops(series(
                points,
                m,
                op,
                Some(max_cores),
                "throughput",
                "p50_us",
            ));
            let p99 = kiops(series(
                points,
                m,
                op,
                Some(max_cores),
                "throughput",
                "p99_us",
            ));
            if !p50.is_empty() {
                s.push(Series {
                    name: format!("{label} p50"),
                    points: p50,
                    secondary: false,
                });
                s.push(Series {
                    name: format!("{label} p99"),
                    points: p99,
                    secondary: true,
                });
            }
        }
        if !s.is_empty() {
            charts14.push(Chart {
                title: format!("Fig. 14 ({op}s): latency vs throughput"),
                note: note.clone(),
                x_label: "throughput (K IOPS)".into(),
                y_label: "latency (µs)".into(),
                series: s,
            });
        }
    }
    figures.push(Figure {
        file: "remote-fig14.png".into(),
        charts: charts14,
    });

    // Fig. 20: the offload engine with and without zero copy (reads, latency vs throughput).
    let mut s20 = Vec::new();
    for (m, label) in [("c", "zero copy"), ("c-copy", "copy")] {
        let p50 = kiops(series(
            points,
            m,
            "read",
            Some(max_cores),
            "throughput",
            "p50_us",
        ));
        let p99 = kiops(series(
            points,
            m,
            "read",
            Some(max_cores),
            "throughput",
            "p99_us",
        ));
        if !p50.is_empty() {
            s20.push(Series {
                name: format!("{label} p50"),
                points: p50,
                secondary: false,
            });
            s20.push(Series {
                name: format!("{label} p99"),
                points: p99,
                secondary: true,
            });
        }
    }
    if s20.len() == 4 {
        figures.push(Figure {
            file: "remote-fig20.png".into(),
            charts: vec![Chart {
                title: "Fig. 20: DDS offload, zero copy vs copy (reads)".into(),
                note: note.clone(),
                x_label: "throughput (K IOPS)".into(),
                y_label: "latency (µs)".into(),
                series: s20,
            }],
        });
    }
    // `--topology netns`: each mode's reads through the namespaces beside the same mode on
    // loopback.
    if points.iter().any(|p| p["mode"] == "netns-c") {
        let mut s = Vec::new();
        for (m, label) in MODES {
            for (mode, how) in [
                (m.to_string(), "loopback"),
                (format!("netns-{m}"), "namespaces"),
            ] {
                let pts = series(points, &mode, "read", None, "outstanding", "throughput");
                if !pts.is_empty() {
                    s.push(Series {
                        name: format!("{label}, {how}"),
                        points: pts.into_iter().map(|(x, y)| (x, y / 1e3)).collect(),
                        secondary: how == "namespaces",
                    });
                }
            }
        }
        figures.push(Figure {
            file: "remote-netns.png".into(),
            charts: vec![Chart {
                title: "Reads through the DPU in the wire (clients address the host) vs loopback"
                    .into(),
                note: note.clone(),
                x_label: "outstanding messages per connection".into(),
                y_label: "throughput (K IOPS)".into(),
                series: s,
            }],
        });
    }
    figures
}
