//! The offload configuration end to end with real processes: `dds dpu` with the traffic
//! director and the pagestore offload app, the host application (`dds app pagestore` on DDS
//! files) and the load client, over real TCP.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{director_of, ready_line, Guard, DDS};

/// `dds dpu` with the pagestore offload app, its director on `director` (port 0 the first
/// time, then the address it got); the host application announces itself to the director.
/// Returns the DPU and the director's address.
fn start_dpu(dir: &Path, director: &str) -> (Guard, SocketAddr) {
    let device = dir.join("dev.img");
    if !device.exists() {
        let out = Command::new(DDS)
            .args([
                "format",
                "--size",
                "256M",
                "--segment-size",
                "4M",
                "--device",
            ])
            .arg(&device)
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let socket = dir.join("dpu.sock");
    let (g, line) = ready_line(
        Command::new(DDS)
            .args([
                "dpu",
                "--json",
                "--dma-cost",
                "on",
                "--offload",
                "pagestore",
                "--device",
            ])
            .arg(&device)
            .arg("--socket")
            .arg(&socket)
            .args(["--director-listen", director])
            .stderr(Stdio::piped()),
    );
    (g, director_of(&line))
}

/// Starts the host application; returns it and its file ids.
fn start_app(dir: &Path) -> (Guard, Vec<u64>) {
    let mut child = Command::new(DDS)
        .args([
            "app",
            "pagestore",
            "--backend",
            "dds",
            "--files",
            "2",
            "--file-size",
            "8M",
        ])
        .arg("--socket")
        .arg(dir.join("dpu.sock"))
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap();
    let files = ready["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_u64().unwrap())
        .collect();
    (Guard(child), files)
}

fn client(director: SocketAddr, files: &[u64], extra: &[&str]) -> Value {
    let ids: Vec<String> = files.iter().map(|f| f.to_string()).collect();
    let out = Command::new(DDS)
        .args(["app", "client", "--json", "--file-size", "8M"])
        .args(["--connect", &director.to_string()])
        .args(["--files", &ids.join(",")])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("{}");
    serde_json::from_str(json).unwrap()
}

/// Stops the DPU (SIGTERM) and returns its director's `offloaded` and `forwarded` counts.
fn stop_dpu(mut dpu: Guard) -> (u64, u64) {
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(dpu.0.id() as i32, libc::SIGTERM) };
    let mut err = String::new();
    use std::io::Read;
    dpu.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // The director's counters line: `name value, name value, ...`.
    let stat = |name: &str| -> u64 {
        err.split([',', '\n'])
            .filter_map(|pair| pair.trim().rsplit_once(' '))
            .find(|(k, _)| k.rsplit(' ').next() == Some(name))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {err}"))
    };
    (stat("offloaded"), stat("forwarded"))
}

#[test]
fn reads_are_served_on_the_dpu_with_verified_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (dpu, director) = start_dpu(dir.path(), "127.0.0.1:0");
    let (_app, files) = start_app(dir.path());
    // --verify writes the pattern through the director (forwarded to the host, which writes
    // DDS files: cache-on-write fills the cache table), then checks every read.
    let r = client(
        director,
        &files,
        &["--verify", "--requests", "3000", "--batch", "4"],
    );
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["verify_failures"], 0, "{r}");
    assert_eq!(r["order_violations"], 0, "{r}");
    assert_eq!(r["requests"], 3000);
    let us = common::dpu_cpu_per_request(&dir.path().join("dpu.sock"), "pagestore read", 3000);
    eprintln!("DPU CPU per offloaded pagestore read: {us:.1} µs");
    let (offloaded, forwarded) = stop_dpu(dpu);
    assert!(offloaded >= 3000, "offloaded {offloaded}");
    assert!(forwarded > 0, "the verify pass's writes go to the host");
}

#[test]
fn host_death_fails_clients_and_the_director_survives() {
    let dir = tempfile::tempdir().unwrap();
    let (dpu, director) = start_dpu(dir.path(), "127.0.0.1:0");
    let (app, files) = start_app(dir.path());
    let r = client(
        director,
        &files,
        &["--read-ratio", "0.5", "--requests", "500"],
    );
    assert_eq!(r["errors"], 0, "{r}");
    drop(app); // SIGKILL the host application
               // Writes need the host: the client's connection fails instead of hanging.
    let t = Instant::now();
    let r = client(
        director,
        &files,
        &["--read-ratio", "0", "--requests", "200"],
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(
        r["failed_connections"].as_u64().unwrap_or(0) > 0 || r["errors"].as_u64().unwrap_or(0) > 0,
        "{r}"
    );
    // The host comes back: the director serves new connections.
    let (_app2, files2) = start_app(dir.path());
    assert_eq!(files, files2);
    let r = client(
        director,
        &files2,
        &["--read-ratio", "0.5", "--requests", "500"],
    );
    assert_eq!(r["errors"], 0, "{r}");
    let (_, forwarded) = stop_dpu(dpu);
    assert!(forwarded > 0);
}

#[test]
fn dpu_restart_under_the_director_keeps_acknowledged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dpu, director) = start_dpu(dir.path(), "127.0.0.1:0");
    let (app, files) = start_app(dir.path());
    // Writes acknowledged through the director (forwarded to the host, stored in DDS files).
    let r = client(director, &files, &["--verify", "--requests", "200"]);
    assert_eq!(
        (r["errors"].as_u64(), r["verify_failures"].as_u64()),
        (Some(0), Some(0)),
        "{r}"
    );
    // The DPU dies: the host application loses its file service, clients lose the director.
    dpu.0.kill().unwrap();
    dpu.0.wait().unwrap();
    drop(app);
    let r = client(director, &files, &["--requests", "50"]);
    let refused = r.as_object().is_none_or(|o| o.is_empty()); // the client gave up: no report
    assert!(
        refused || r["failed_connections"].as_u64().unwrap_or(0) > 0,
        "{r}"
    );
    // Restart both: the files and their ids survive, and the director serves again.
    let (_dpu, _) = start_dpu(dir.path(), &director.to_string());
    let (_app, files2) = start_app(dir.path());
    assert_eq!(files, files2, "the files survive the restart");
    // The bytes acknowledged before the crash are on the device.
    let dds = dds_host::Dds::connect(dir.path().join("dpu.sock")).unwrap();
    for &f in &files {
        let mut buf = vec![0u8; 1 << 20];
        dds.read_sync(f as u32, 0, &mut buf).unwrap();
        assert_eq!(
            dds_storage::pattern::check(f as u32, 0, &buf),
            None,
            "file {f} lost data"
        );
    }
    let r = client(director, &files2, &["--requests", "500"]);
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["order_violations"], 0, "{r}");
}
