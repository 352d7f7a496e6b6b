//! `dds stats` reads a running DPU's counters: the groups of a connected host with their
//! requests and bytes, memory, space, and the offload engine when it runs.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{format_device, start_dpu, DDS};
use dds_host::Dds;
use serde_json::Value;

fn stats(socket: &std::path::Path, json: bool) -> std::process::Output {
    let mut c = Command::new(DDS);
    c.arg("stats").arg("--socket").arg(socket);
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

#[test]
fn stats_report_a_hosts_requests_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let device = format_device(dir.path(), "64M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&device, &socket, &["--dma-cost", "off"]);
    let dds = Dds::connect_retry(&socket, Duration::from_secs(10)).unwrap();
    let f = dds.create_file("/counted").unwrap();
    for i in 0..10u64 {
        dds.write_sync(f.id, i * 4096, &[7u8; 4096]).unwrap();
    }
    let mut buf = vec![0u8; 4096];
    dds.read_sync(f.id, 0, &mut buf).unwrap();
    // An out-of-range read is an error the group counts.
    assert!(dds.read_sync(f.id, 1 << 30, &mut buf).is_err());

    let out = stats(&socket, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = v["groups"].as_array().unwrap();
    let g = groups
        .iter()
        .find(|g| g["requests"].as_u64() >= Some(12))
        .unwrap_or_else(|| panic!("no group with our requests: {v:#}"));
    assert_eq!(g["bytes_written"], 40960, "{g}");
    assert_eq!(g["bytes_read"], 4096, "{g}");
    assert_eq!(g["errors"], 1, "{g}");
    assert_eq!(v["space"]["files"], 1);
    assert!(v["memory_used_bytes"].as_u64().unwrap() > 0);
    assert!(v["offload"].is_null(), "no offload engine configured");

    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let out = stats(&socket, false);
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        if text.contains("written 40.0 KiB") || Instant::now() > deadline {
            break text;
        }
    };
    assert!(text.contains("# groups"), "{text}");
    assert!(text.contains("written 40.0 KiB"), "{text}");
    assert!(text.contains("engine: none"), "{text}");
    drop(dds);

    // The DMA engine's directions are named from the host's point of view too.
    assert!(
        text.contains("host→DPU") && text.contains("DPU→host"),
        "{text}"
    );

    // No DPU: what is missing and how to start one, with the status of every command that
    // cannot reach its server.
    let out = stats(&dir.path().join("nothing.sock"), false);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no DPU listens on") && err.contains("dds dpu --device"),
        "{err}"
    );
}
