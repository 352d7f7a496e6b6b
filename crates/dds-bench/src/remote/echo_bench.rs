//! The echo benchmark (Fig. 18): the same TCP echo on a host core and on the DPU's core.

use super::*;

/// Runs the echo benchmark; `command` is the command line, for the report.
pub fn run_echo(a: EchoBenchArgs, command: String) -> Result<Report> {
    let machine = Machine::detect();
    let place = Placement::plan(machine.nproc, a.dpu_cpus.as_deref(), a.shared_cores)?;
    let sizes: Vec<u64> = if !a.sizes.is_empty() {
        a.sizes.clone()
    } else if a.quick {
        vec![64, 4096]
    } else {
        vec![64, 1024, 16384]
    };
    let seconds = a.seconds.unwrap_or(if a.quick { 1.0 } else { 3.0 });
    let where_ = placement_text(&place, "the DPU-side echo");
    eprintln!("dds bench echo: no DPU hardware; the DPU-side echo is the same code in a separate process; {where_}.");
    // The host-side echo and the client (this process) on the host side's CPUs, the DPU-side
    // echo on the DPU's; unpinned when shared.
    let host_list = place.host_cpus.as_deref().map(cpu_list);
    let sides = [("host", host_list), ("dpu", place.dpu_cpus.clone())];
    let _pin = place.pin_host()?;
    let mut points = Vec::new();
    for (role, cpus) in &sides {
        let args: Vec<String> = vec![
            "app".into(),
            "echo".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--role".into(),
            role.to_string(),
        ];
        let mut cmd = dds_command(&args, cpus.as_deref(), None)?;
        let (mut server, ready) = spawn_ready("echo server", &mut cmd, Duration::from_secs(30))?;
        let addr: SocketAddr = ready["listen"]
            .as_str()
            .ok_or_else(|| anyhow!("echo ready line without listen"))?
            .parse()?;
        for &size in &sizes {
            for outstanding in [1usize, 8] {
                let c0 = server.cpu_seconds();
                let rep = echo::run_client(&EchoConfig {
                    connect: addr,
                    message_size: size as usize,
                    outstanding,
                    connections: 1,
                    duration: Duration::from_secs_f64(seconds),
                })?;
                let cpu = server.cpu_seconds() - c0;
                let per = cpu / rep.messages.max(1) as f64 * 1e6;
                eprintln!(
                    "  {role:<4} {size:>6} B outstanding {outstanding}: {:>9.0} msg/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {per:>6.2} µs CPU/msg",
                    rep.messages_per_sec, rep.p50_us, rep.p99_us
                );
                if rep.corrupt > 0 {
                    bail!("echo returned different bytes ({} messages)", rep.corrupt);
                }
                points.push(json!({
                    "side": role,
                    "cpus": cpus.as_deref().unwrap_or("shared"),
                    "message_size": size,
                    "outstanding": outstanding,
                    "messages": rep.messages,
                    "seconds": rep.seconds,
                    "throughput": rep.messages_per_sec,
                    "mb_per_sec": rep.mb_per_sec,
                    "p50_us": rep.p50_us,
                    "p99_us": rep.p99_us,
                    "cpu_s": cpu,
                    "cpu_us_per_op": per,
                }));
            }
        }
        let _ = server.stop(STOP_GRACE);
    }
    let summary_of = |side: &str| {
        // Latency at one message in flight (smallest size); throughput at 8 in flight.
        let lat = points
            .iter()
            .find(|p| p["side"] == side && p["outstanding"] == 1)
            .cloned()
            .unwrap_or(Value::Null);
        let thr = points
            .iter()
            .filter(|p| p["side"] == side && p["outstanding"] == 8)
            .find(|p| p["message_size"] == sizes[0])
            .cloned()
            .unwrap_or(Value::Null);
        json!({
            "throughput": thr["throughput"],
            "p50_us": lat["p50_us"],
            "p99_us": lat["p99_us"],
            "cpu_us_per_op": thr["cpu_us_per_op"],
            "message_size": sizes[0],
        })
    };
    let mut charts = Vec::new();
    for (title, y, out) in [
        ("Fig. 18: echo latency (1 in flight)", "p50_us", 1usize),
        ("echo throughput (8 in flight)", "throughput", 8),
    ] {
        let s = sides
            .iter()
            .map(|(role, _)| Series {
                name: if *role == "host" {
                    "echo on host (kernel TCP)".into()
                } else {
                    "echo in the DPU process (kernel TCP)".into()
                },
                points: points
                    .iter()
                    .filter(|p| p["side"] == *role && p["outstanding"] == out)
                    .map(|p| (f(p, "message_size") / 1024.0, f(p, y)))
                    .collect(),
                secondary: false,
            })
            .collect();
        charts.push(Chart {
            title: title.into(),
            note: if place.dpu_cpus.is_some() {
                "emulated DPU: a separate process on a core of its own".into()
            } else {
                "emulated DPU: a separate process sharing the host's cores".into()
            },
            x_label: "message size (KiB)".into(),
            y_label: if y == "p50_us" {
                "p50 latency (µs)".into()
            } else {
                "messages/s".into()
            },
            series: s,
        });
    }
    let summary = json!({
        "host": summary_of("host"),
        "dpu": summary_of("dpu"),
        // No goal is set for the echo comparison (Fig. 18 measures placement only).
        "targets": Vec::<crate::report::Target>::new(),
    });
    let mut t = Table::new(
        format!(
            "TCP echo, {} B messages (latency at 1 in flight, throughput and CPU at 8)",
            sizes[0]
        ),
        &["side", "msg/s", "p50 µs", "p99 µs", "CPU µs/msg"],
    );
    for side in ["host", "dpu"] {
        let s = &summary[side];
        t.row(vec![
            side.into(),
            fmt_num(f(s, "throughput")),
            fmt_num(f(s, "p50_us")),
            fmt_num(f(s, "p99_us")),
            fmt_num(f(s, "cpu_us_per_op")),
        ]);
    }
    Ok(Report {
        benchmark: "echo".into(),
        command,
        dpu_emulation: format!(
            "No DPU hardware: the DPU-side echo is the same kernel-TCP echo code as the host's, run as a separate process; {where_}. No userspace TCP stack (TLDK) is involved."
        ),
        machine,
        config: json!({
            "args": a,
            "placement": place,
            "sizes": sizes,
            "seconds_per_point": seconds,
            "outstanding": [1, 8],
        }),
        summary,
        points: Value::Array(points),
        tables: vec![t],
        charts: Vec::new(),
        panels: vec![Figure {
            file: "echo-fig18.png".into(),
            charts,
        }],
    })
}
