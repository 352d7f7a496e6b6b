//! `dds bench objects` end to end, as small as it runs: one mixed placement (two host OSDs,
//! two DPU OSDs), one object size, 1-second phases, with Flow-Adapt on and off (in the OSDs
//! and on the DMA path alone); and bad options fail with a message.
#![cfg(feature = "bench")]

use std::process::Command;
use std::time::{Duration, Instant};

const DDS: &str = env!("CARGO_BIN_EXE_dds");

#[test]
fn a_tiny_objects_run_writes_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let t = Instant::now();
    let o = Command::new(DDS)
        .args(["bench", "objects", "--quick", "--seconds", "1"])
        .args(["--placements", "H2+D2", "--sizes", "64K", "--clients", "2"])
        .args(["--device-size", "256M", "--pg-num", "8"])
        .arg("--out")
        .arg(&out)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("objects.json")).unwrap()).unwrap();
    for k in [
        "d4_host_cpu_per_mb_over_h4",
        "best_d_over_h4_write_repl3",
        "batching_over_unbatched_64k",
    ] {
        assert!(v["summary"].get(k).is_some(), "no {k}");
    }
    assert_eq!(v["summary"]["targets"].as_array().unwrap().len(), 3);
    // Flow-Adapt: measured in the OSDs (H2+D2 off as well) and on the DMA path alone.
    assert!(
        v["summary"]["batching_over_unbatched_64k_osd"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let dma = v["config"]["dma_path"].as_array().unwrap();
    assert_eq!(dma.len(), 2);
    for (d, on) in dma.iter().zip([true, false]) {
        assert_eq!(d["flow_adapt"], on, "{d}");
        assert!(d["txs"].as_u64().unwrap() > 0, "{d}");
        assert!(d["host_cpu_us_per_tx"].as_f64().unwrap() > 0.0, "{d}");
    }
    let on = dma[0]["txs_per_s"].as_f64().unwrap();
    let off = dma[1]["txs_per_s"].as_f64().unwrap();
    let b = v["summary"]["batching_over_unbatched_64k"]
        .as_f64()
        .unwrap();
    assert!((b - on / off).abs() < 1e-9 * b, "{b} vs {on}/{off}");
    // Batching puts more than one transaction in a transfer; off, each is alone.
    assert!(
        dma[0]["batches"].as_u64() < dma[0]["txs"].as_u64(),
        "{}",
        dma[0]
    );
    assert_eq!(dma[1]["batches"], dma[1]["txs"], "{}", dma[1]);
    let p = &v["points"][0];
    assert_eq!(p["placement"], "H2+D2");
    assert!(p["write"]["ops"].as_u64().unwrap() > 0, "{p}");
    // Every written object was read back once in the seq phase.
    assert_eq!(p["seq"]["ops"], p["write"]["ops"], "{p}");
    assert!(p["rand"]["ops"].as_u64().unwrap() > 0, "{p}");
    assert!(p["write"]["dpu_cores"].as_f64().unwrap() > 0.0, "{p}");
    assert!(v["config"]["budgets"]["H2+D2"]["host"]["cores"].as_f64() == Some(1.0));
    assert!(out.join("objects_write_mbs_repl3.png").exists());
    // No cgroup or device file is left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("bench-objects-")
        })
        .collect();
    assert!(left.is_empty());
}

#[test]
fn bad_options_fail_with_a_message() {
    for args in [
        &["--placements", "H5"][..],
        &["--placements", "X2+D2"],
        &["--replication", "5"],
        &["--sizes", "0"],
        &["--clients", "0"],
        &["--seconds", "-1"],
        &["--dma-cost", "maybe"],
    ] {
        let o = Command::new(DDS)
            .args(["bench", "objects", "--quick", "--out", "/nonexistent/x"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Processes whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(cmd);
            }
        }
    }
    found
}

#[test]
fn an_interrupted_run_tears_everything_down() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(DDS)
        .args(["bench", "objects", "--quick", "--seconds", "30"])
        .args(["--placements", "H2+D2", "--sizes", "64K", "--clients", "2"])
        .args(["--no-flow-adapt", "--device-size", "256M", "--pg-num", "8"])
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--dir")
        .arg(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        let started = l.contains("H2+D2 ...");
        log.push(l);
        if started {
            break;
        }
    }
    // The cluster runs (four OSDs, two stores) when the interrupt comes.
    let t = Instant::now();
    while processes_with(&dir.path().display().to_string()).len() < 6 {
        assert!(t.elapsed() < Duration::from_secs(20), "{log:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let t = Instant::now();
    log.extend(lines.map_while(Result::ok));
    let status = child.wait().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "stopped after {:?}",
        t.elapsed()
    );
    assert!(!status.success());
    assert!(log.iter().any(|l| l.contains("interrupted")), "{log:?}");
    let left = processes_with(&dir.path().display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            let mine = format!("dds-bench-objects-{pid}-");
            let groups: Vec<_> = rd
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
                .collect();
            assert!(groups.is_empty(), "cgroups left: {groups:?}");
        }
    }
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("bench-objects-")
        })
        .collect();
    assert!(files.is_empty(), "left: {files:?}");
}
