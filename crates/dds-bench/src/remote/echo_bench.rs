//! The echo benchmark (Fig. 18): the same TCP echo on a host core and on the DPU's core.

use super::*;

pub fn run_echo(a: EchoBenchArgs) -> Result<()> {
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let sizes: Vec<u64> = if !a.sizes.is_empty() {
        a.sizes.clone()
    } else if a.quick {
        vec![64, 4096]
    } else {
        vec![64, 1024, 16384]
    };
    let seconds = a.seconds.unwrap_or(if a.quick { 1.0 } else { 3.0 });
    let out = crate::results_dir(a.out.as_deref(), a.quick);
    std::fs::create_dir_all(&out)?;
    eprintln!("dds bench echo: {EMULATION_NOTE}; the DPU-side echo is the same code in a separate process pinned to CPU {}.", ncpu - 1);
    let sides = [("host", "0".to_string()), ("dpu", (ncpu - 1).to_string())];
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
        let mut cmd = dds_command(&args, Some(cpus))?;
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
                    "cpus": cpus,
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
            note: "emulated DPU: a separate process pinned to another core".into(),
            x_label: "message size (KiB)".into(),
            y_label: if y == "p50_us" {
                "p50 latency (µs)".into()
            } else {
                "messages/s".into()
            },
            series: s,
        });
    }
    let png = out.join("echo-fig18.png");
    plot::draw(&png, &charts)?;
    let report = json!({
        "benchmark": "echo",
        "note": format!("{EMULATION_NOTE}. The DPU-side echo is the same kernel-TCP echo code run as a separate process pinned to CPU {}; the host echo is pinned to CPU 0. No userspace TCP stack (TLDK) is involved.", ncpu - 1),
        "quick": a.quick,
        "machine": machine(),
        "summary": {"host": summary_of("host"), "dpu": summary_of("dpu")},
        "plots": [png.display().to_string()],
        "points": points,
    });
    let path = out.join("echo.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!(
        "echo benchmark (no DPU hardware: the DPU-side echo is the same kernel-TCP echo in a separate process pinned to CPU {})",
        ncpu - 1
    );
    for side in ["host", "dpu"] {
        let s = &report["summary"][side];
        println!(
            "{side:<5} {:>10.0} msg/s  p50 {:>7.1} µs  p99 {:>7.1} µs  {:>6.2} µs CPU/msg",
            f(s, "throughput"),
            f(s, "p50_us"),
            f(s, "p99_us"),
            f(s, "cpu_us_per_op")
        );
    }
    eprintln!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn director_stats_line_is_parsed() {
        let v = parse_director_stats(Some(
            "dds dpu: director DirectorStats { accepted: 8, split: 8, offloaded: 80938, forwarded: 59254, fallback: 59254 }",
        ));
        assert_eq!(v["offloaded"], 80938);
        assert_eq!(v["fallback"], 59254);
        assert_eq!(parse_director_stats(None), Value::Null);
    }
}
