//! `dds fsck` and the DPU on a device whose metadata log was damaged: both name the damaged
//! record; the DPU refuses to start instead of silently dropping the acknowledged operations
//! after it.

mod common;

use std::process::{Command, Output, Stdio};

use common::{start_dpu, DDS};

fn dds(args: &[&str]) -> Output {
    Command::new(DDS).args(args).output().unwrap()
}

#[test]
fn fsck_reports_a_damaged_log_record_and_the_dpu_refuses_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev.img");
    let sock = dir.path().join("dpu.sock");
    let (img_s, sock_s) = (img.to_str().unwrap(), sock.to_str().unwrap());
    assert!(dds(&["format", "--device", img_s, "--size", "64M"])
        .status
        .success());
    let mut dpu = start_dpu(&img, &sock, &[]);
    for i in 0..5 {
        let out = dds(&["fs", "--socket", sock_s, "mkdir", &format!("/d{i}")]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(dpu.0.id() as i32, libc::SIGTERM) };
    dpu.0.wait().unwrap();

    let clean = dds(&["fsck", "--device", img_s]);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(String::from_utf8_lossy(&clean.stdout).contains("clean"));

    // Damage the second of the five directory records.
    let mut bytes = std::fs::read(&img).unwrap();
    let mut recs = Vec::new();
    for at in (0..bytes.len() - 32).step_by(512) {
        if &bytes[at..at + 4] == b"DDSL" {
            let total = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
            let seq = u64::from_le_bytes(bytes[at + 24..at + 32].try_into().unwrap());
            recs.push((seq, at, total));
        }
    }
    recs.sort();
    assert!(recs.len() >= 5, "{recs:?}");
    let (seq, at, total) = recs[recs.len() - 4];
    bytes[at + total - 1] ^= 1;
    std::fs::write(&img, &bytes).unwrap();

    let damaged = dds(&["fsck", "--device", img_s]);
    assert_eq!(damaged.status.code(), Some(1));
    let err = String::from_utf8_lossy(&damaged.stderr);
    assert!(err.contains(&format!("record {seq}")), "{err}");
    let json = dds(&["fsck", "--device", img_s, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(
        v["damage"].as_str().is_some_and(|d| d.contains("damaged")),
        "{v}"
    );

    let refused = Command::new(DDS)
        .args(["dpu", "--device", img_s, "--socket", sock_s])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains(&format!("record {seq}")), "{err}");
    assert_eq!(
        std::fs::read(&img).unwrap(),
        bytes,
        "nothing written to the device"
    );
}
