//! `dds bench objects` end to end, as small as it runs: one mixed placement (two host OSDs,
//! two DPU OSDs), one object size, 1-second phases, with Flow-Adapt on and off (in the OSDs
//! and on the DMA path alone); and bad options fail with a message.

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
