//! `dds bench objects` end to end, as small as it runs: one mixed placement (two host OSDs,
//! two DPU OSDs), one object size, 1-second phases; and bad options fail with a message.

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
        .args(["--no-flow-adapt", "--device-size", "256M", "--pg-num", "8"])
        .arg("--out")
        .arg(&out)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
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
