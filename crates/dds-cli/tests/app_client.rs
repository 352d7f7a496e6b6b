//! `dds app client` exits non-zero when any request failed, so scripts and CI notice.

mod common;

use std::io::BufRead;
use std::process::{Command, Stdio};

use common::{format_device, start_dpu, Guard, DDS};

#[test]
fn the_client_fails_when_requests_fail() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Command::new(DDS)
        .args([
            "app",
            "pagestore",
            "--backend",
            "os",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--files", "1", "--file-size", "1M", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _server = Guard(server);
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr = ready["listen"].as_str().unwrap().to_string();
    let file = ready["files"][0].as_u64().unwrap().to_string();
    let client = |files: &str| {
        Command::new(DDS)
            .args(["app", "client", "--connect", &addr, "--files", files])
            .args(["--file-size", "1M", "--requests", "200"])
            .output()
            .unwrap()
    };
    let ok = client(&file);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // A file the server does not serve: every request fails with UnknownFile.
    let bad = client("4242");
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("requests failed"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

/// `--on-dpu-loss exit`: the server exits with status 3 and a clear message when its DPU dies.
#[test]
fn the_server_exits_when_its_dpu_dies_if_told_to() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "64M");
    let sock = dir.path().join("dpu.sock");
    let mut dpu = start_dpu(&img, &sock, &[]);
    let mut server = Command::new(DDS)
        .args([
            "app",
            "pagestore",
            "--backend",
            "dds",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--files", "1", "--file-size", "1M", "--fill", "none"])
        .args(["--on-dpu-loss", "exit", "--socket"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("ready"), "{line}");
    dpu.0.kill().unwrap();
    dpu.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = server.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("DPU") && err.contains("gone"), "{err}");
}
