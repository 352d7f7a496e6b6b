//! `dds app` and `dds bench remote|echo` as separate processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;

use common::{Guard, DDS};

fn ready_line(child: &mut Child) -> Value {
    let out = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("ready line {line:?}: {e}"))
}

#[test]
fn pagestore_and_client_processes_with_verification() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let mut server = Guard(
        Command::new(DDS)
            .args([
                "app",
                "pagestore",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                "os",
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(["--files", "2", "--file-size", "1M", "--threads", "2"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let ready = ready_line(&mut server.0);
    assert_eq!(ready["backend"], "os");
    assert_eq!(ready["files"], serde_json::json!([0, 1]));
    assert_eq!(ready["file_size"], 1 << 20);
    let addr = ready["listen"].as_str().unwrap().to_string();
    let out = Command::new(DDS)
        .args(["app", "client", "--connect", &addr, "--files", "0,1"])
        .args([
            "--file-size",
            "1M",
            "--io-size",
            "1K",
            "--read-ratio",
            "0.5",
        ])
        .args(["--batch", "4", "--outstanding", "2", "--connections", "2"])
        .args(["--requests", "2000", "--verify", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "requests",
        "errors",
        "requests_per_sec",
        "mb_per_sec",
        "p50_us",
        "p99_us",
        "p999_us",
        "order_violations",
        "verify_failures",
    ] {
        assert!(rep.get(k).is_some(), "client JSON lacks {k}: {rep}");
    }
    assert_eq!(rep["requests"], 2000);
    assert_eq!(rep["errors"], 0);
    assert_eq!(rep["verify_failures"], 0);
    // SIGTERM stops the server cleanly.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    let mut ok = false;
    for _ in 0..300 {
        if let Ok(Some(st)) = server.0.try_wait() {
            ok = st.success();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(ok, "server did not exit cleanly on SIGTERM");
}

#[cfg(feature = "bench")]
#[test]
fn bench_remote_quick_reports_modes_a_b_and_c() {
    let out_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = Command::new(DDS)
        .args(["bench", "remote", "--quick"])
        .arg("--out")
        .arg(out_dir.path())
        .arg("--work")
        .arg(work.path())
        .args(["--files", "2", "--file-size", "2M", "--outstanding", "1,2"])
        .args(["--seconds", "0.3", "--threads", "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("remote.json")).unwrap())
            .unwrap();
    assert!(json["dpu_emulation"].as_str().unwrap().contains("emulated"));
    // The DPU on its own core, the host side on the others (given two CPUs), recorded.
    let place = &json["config"]["placement"];
    if json["machine"]["nproc"].as_u64().unwrap() >= 2 {
        assert!(!place["dpu_cpus"].is_null(), "{place}");
        assert!(
            !place["host_cpus"].as_array().unwrap().is_empty(),
            "{place}"
        );
    }
    // The targets, named as the summary's keys, whether or not mode (c) ran.
    let summary = &json["summary"];
    let targets = summary["targets"].as_array().unwrap();
    let names: Vec<&str> = targets
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "offload_over_baseline_peak",
            "offload_dpu_cpu_over_baseline_host_cpu",
            "offload_p50_over_baseline_p50",
            "offload_over_baseline_peak_memdev",
        ]
    );
    // The reads-only pass with the files on a RAM-backed directory (/dev/shm by default).
    assert!(
        summary["offload_over_baseline_peak_memdev"]
            .as_f64()
            .is_some_and(|r| r > 0.0),
        "{summary}"
    );
    for t in targets {
        for k in ["name", "goal", "op", "measured", "met"] {
            assert!(!t[k].is_null(), "target lacks {k}: {t}");
        }
    }
    for mode in ["a", "b"] {
        let s = &json["summary"][mode];
        assert_eq!(s["available"], true, "mode {mode}: {s}");
        for k in [
            "throughput",
            "p50_us",
            "p99_us",
            "host_cpu_us_per_op",
            "dpu_cpu_us_per_op",
        ] {
            assert!(
                s[k].as_f64().is_some(),
                "mode {mode} summary lacks {k}: {s}"
            );
        }
        assert!(s["throughput"].as_f64().unwrap() > 0.0);
        let points: Vec<&Value> = json["points"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["mode"] == mode)
            .collect();
        assert!(points.len() >= 3, "mode {mode}: {} points", points.len());
        assert!(points.iter().all(|p| p["errors"] == 0));
    }
    assert!(json["summary"]["b"]["dpu_cpu_us_per_op"].as_f64().unwrap() > 0.0);
    // Mode (c): the DPU's director in front of the host server, which announced its own
    // port; reads served on the DPU.
    let c = &json["summary"]["c"];
    assert_eq!(c["available"], true, "{c}");
    assert!(c["throughput"].as_f64().unwrap() > 0.0, "{c}");
    assert!(c["dpu_cpu_us_per_op"].as_f64().is_some(), "{c}");
    assert!(out_dir.path().join("remote-fig20.png").exists());
    assert!(
        json["summary"]["director"]["c"]["offloaded"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{}",
        json["summary"]["director"]
    );
    // The offload-vs-baseline keys.
    for k in [
        "offload_over_baseline_peak",
        "offload_dpu_cpu_over_baseline_host_cpu",
        "offload_p50_over_baseline_p50",
    ] {
        assert!(
            summary[k].as_f64().is_some_and(|v| v > 0.0),
            "{k}: {summary}"
        );
    }
    for png in ["remote-fig13.png", "remote-fig14.png"] {
        let meta = std::fs::metadata(out_dir.path().join(png)).unwrap();
        assert!(meta.len() > 1000, "{png} is empty");
    }
}

#[cfg(feature = "bench")]
#[test]
fn bench_echo_quick_reports_host_and_dpu_sides() {
    let out_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let out = Command::new(DDS)
        .args([
            "bench",
            "echo",
            "--quick",
            "--sizes",
            "64",
            "--seconds",
            "0.3",
        ])
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value =
        serde_json::from_slice(&std::fs::read(out_dir.path().join("echo.json")).unwrap()).unwrap();
    for side in ["host", "dpu"] {
        let s = &json["summary"][side];
        for k in ["throughput", "p50_us", "p99_us", "cpu_us_per_op"] {
            assert!(s[k].as_f64().is_some(), "{side} summary lacks {k}: {s}");
        }
    }
    assert!(json["summary"]["targets"].is_array(), "{}", json["summary"]);
    assert!(!json["config"]["placement"].is_null());
    assert!(out_dir.path().join("echo-fig18.png").exists());
}
