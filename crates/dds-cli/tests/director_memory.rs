//! A hostile network client cannot exhaust the DPU's memory through the traffic director:
//! buffers grow with the bytes that arrive, from `--director-memory`, never from the length a
//! message header announces, and a closed connection gives its memory back.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{format_device, start_dpu};

const MIB: u64 = 1 << 20;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// A pagestore message header announcing `len` bytes with one request (the rest never comes).
fn header(len: u32) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&len.to_le_bytes());
    h[4..6].copy_from_slice(&1u16.to_le_bytes());
    h
}

#[test]
fn announced_lengths_do_not_allocate_and_the_budget_bounds_partial_messages() {
    let dir = tempfile::tempdir().unwrap();
    // The host application: never gets a whole message; closes when the director does.
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in host.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s, &mut std::io::sink());
            });
        }
    });
    let director = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let budget = 64 * MIB;
    let img = format_device(dir.path(), "64M");
    let director_addr = format!("127.0.0.1:{director}");
    let host_addr = format!("127.0.0.1:{host_port}");
    let dpu = start_dpu(
        &img,
        &dir.path().join("dpu.sock"),
        &[
            "--offload",
            "pagestore",
            "--director-listen",
            &director_addr,
            "--host-app",
            &host_addr,
            "--director-memory",
            "64M",
            "--offload-contexts",
            "64",
        ],
    );
    let pid = dpu.0.id();
    let base = rss_bytes(pid);
    let addr = format!("127.0.0.1:{director}");

    // 300 connections, each announcing a 16 MiB message and sending only its header.
    let mut conns = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&header(16 << 20)).unwrap();
        conns.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let rss = rss_bytes(pid);
    assert!(
        rss < base + budget,
        "300 announced 16 MiB messages: RSS {} MiB over a base of {} MiB",
        rss / MIB,
        base / MIB
    );
    drop(conns);

    // 200 connections, each sending half of a 15 MiB message: the budget caps what the
    // director holds (connections past it are closed), whatever the clients announced.
    let chunk = vec![0u8; 1 << 20];
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_write_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if s.write_all(&header(15 << 20)).is_err() {
            continue;
        }
        for _ in 0..7 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        conns.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let peak = rss_bytes(pid);
    eprintln!(
        "DPU RSS: base {} MiB, 300 headers {} MiB, 200 half messages {} MiB",
        base / MIB,
        rss / MIB,
        peak / MIB
    );
    assert!(
        peak < base + budget + 32 * MIB,
        "200 half-sent 15 MiB messages: RSS {} MiB over a base of {} MiB (budget {} MiB)",
        peak / MIB,
        base / MIB,
        budget / MIB
    );
    // Closing gives the memory back.
    drop(conns);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = rss_bytes(pid);
        if now < base + 16 * MIB {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "RSS {} MiB after every connection closed (base {} MiB)",
            now / MIB,
            base / MIB
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
