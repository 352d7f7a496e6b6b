//! `dds pageserver` against hostile clients: bursts of random frames over many connections
//! (every request kind with random and out-of-range fields, counts and lengths; truncated,
//! oversized and corrupted frames; random bytes). After each burst the process is alive and a
//! well-formed client on a fresh connection appends a record and reads it back in its page.
//! The seed is printed; `DDS_TEST_SEED=<seed>` replays a run.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{assert_alive, hostile_clients, random_blob, spawn_listening, test_seed, DDS};
use dds_pageserver::page;
use dds_pageserver::proto::{self, status, GetPage, Record, Response};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PS: usize = 8192;
const PAGES: u64 = 64;

/// Sends a message and reads `n` responses (within 10 s).
fn call(s: &mut TcpStream, msg: &[u8], n: usize) -> Vec<Response> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(msg).unwrap();
    (0..n)
        .map(|_| {
            let mut h = [0u8; 4];
            s.read_exact(&mut h).unwrap();
            let len = u32::from_le_bytes(h) as usize;
            assert!(
                (proto::RESP_HEADER..=proto::RESP_HEADER + PS).contains(&len),
                "{len}"
            );
            let mut b = vec![0u8; len];
            b[..4].copy_from_slice(&h);
            s.read_exact(&mut b[4..]).unwrap();
            proto::decode_response(&b)
        })
        .collect()
}

/// A u64 a parser meets at its edges, or a random one.
fn edgy_u64(rng: &mut SmallRng, near: &[u64]) -> u64 {
    match rng.gen_range(0..6) {
        0 => 0,
        1 => u64::MAX - rng.gen_range(0..2),
        2 | 3 if !near.is_empty() => {
            let n = near[rng.gen_range(0..near.len())];
            n.wrapping_add(rng.gen_range(0..3)).wrapping_sub(1)
        }
        _ => rng.gen(),
    }
}

/// A header `len, count, kind` and the body, with the length usually right.
fn message(rng: &mut SmallRng, count: u16, kind: u16, body: &[u8]) -> Vec<u8> {
    let right = (proto::MSG_HEADER + body.len()) as u32;
    let len = match rng.gen_range(0..12) {
        0 => rng.gen(),
        1 => [0, 8, 15, 16, 32, (16 << 20) + 1, u32::MAX][rng.gen_range(0..7)],
        2 => right.wrapping_add(rng.gen_range(1..9)),
        3 => right.saturating_sub(rng.gen_range(1..9)),
        _ => right,
    };
    let mut m = Vec::with_capacity(body.len() + 8);
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(&count.to_le_bytes());
    m.extend_from_slice(&kind.to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// One random frame. `log_end` is where the log ends now (a range starting there is taken).
fn random_frame(rng: &mut SmallRng, log_end: u64) -> Vec<u8> {
    let lsns = [1, log_end, PAGES];
    match rng.gen_range(0..10) {
        // GetPage batches: counts 0..=1025, random and edge fields (a not-modified-since LSN
        // past the log waits the short --lsn-wait and times out).
        0..=2 => {
            let count: u16 = match rng.gen_range(0..5) {
                0 => [0, 1023, 1024, 1025, u16::MAX][rng.gen_range(0..5)],
                _ => rng.gen_range(1..16),
            };
            let real = if rng.gen_bool(0.8) {
                count as usize
            } else {
                rng.gen_range(0..40)
            };
            let mut body = Vec::new();
            for _ in 0..real.min(1100) {
                let lsn = edgy_u64(rng, &lsns);
                let nms = if rng.gen_bool(0.7) {
                    rng.gen_range(0..=lsn.min(log_end))
                } else {
                    edgy_u64(rng, &lsns)
                };
                let page = if rng.gen_bool(0.7) {
                    rng.gen_range(0..PAGES + 2)
                } else {
                    edgy_u64(rng, &[PAGES, 1 << 32])
                };
                for v in [rng.gen(), lsn, nms, page] {
                    body.extend_from_slice(&u64::to_le_bytes(v));
                }
            }
            message(rng, count, proto::KIND_GETPAGE, &body)
        }
        // AppendWal: ranges at, below and above the log's end or anywhere; record counts and
        // lengths right, off by a few, or huge; records outside their page or range.
        3..=5 => {
            let start = match rng.gen_range(0..4) {
                0 | 1 => log_end,
                2 => edgy_u64(rng, &lsns),
                _ => log_end.saturating_sub(rng.gen_range(0..3)),
            };
            // (A range taken at the log's end ends near it: one ending at u64::MAX would
            // leave no LSNs for the checks, a state a client may cause but not one to test.)
            let end = match rng.gen_range(0..5) {
                0 if start != log_end => edgy_u64(rng, &[start]),
                0 => start.saturating_sub(rng.gen_range(0..2)),
                _ => start.saturating_add(rng.gen_range(1..64)),
            };
            let n: u32 = rng.gen_range(0..6);
            let mut recs = Vec::new();
            let mut lsn = start;
            for _ in 0..n {
                let mut r = Vec::new();
                lsn = if rng.gen_bool(0.8) {
                    lsn.saturating_add(rng.gen_range(0..3))
                } else {
                    edgy_u64(rng, &[start, end])
                };
                let data = random_blob(rng, &[PS - page::HEADER, 65535], 300);
                let page = if rng.gen_bool(0.8) {
                    rng.gen_range(0..PAGES + 1)
                } else {
                    edgy_u64(rng, &[PAGES])
                };
                let offset: u16 = if rng.gen_bool(0.8) {
                    rng.gen_range(0..(PS - page::HEADER) as u16)
                } else {
                    rng.gen()
                };
                r.extend_from_slice(&lsn.to_le_bytes());
                r.extend_from_slice(&page.to_le_bytes());
                r.extend_from_slice(&offset.to_le_bytes());
                let len = match rng.gen_range(0..8) {
                    0 => rng.gen(),
                    1 => (data.len() as u16).wrapping_add(1),
                    _ => data.len() as u16,
                };
                r.extend_from_slice(&len.to_le_bytes());
                let reserved: u32 = if rng.gen_bool(0.9) { 0 } else { rng.gen() };
                r.extend_from_slice(&reserved.to_le_bytes());
                r.extend_from_slice(&data);
                if rng.gen_bool(0.9) {
                    r.resize(r.len().next_multiple_of(8), 0);
                }
                recs.extend_from_slice(&r);
            }
            let count: u32 = match rng.gen_range(0..8) {
                0 => u32::MAX,
                1 => n.wrapping_add(1),
                2 => n.wrapping_sub(1),
                _ => n,
            };
            let mut body = Vec::new();
            body.extend_from_slice(&start.to_le_bytes());
            body.extend_from_slice(&end.to_le_bytes());
            body.extend_from_slice(&count.to_le_bytes());
            let reserved: u32 = if rng.gen_bool(0.95) { 0 } else { rng.gen() };
            body.extend_from_slice(&reserved.to_le_bytes());
            body.extend_from_slice(&recs);
            let count = if rng.gen_bool(0.9) { 1 } else { rng.gen() };
            message(rng, count, proto::KIND_APPEND, &body)
        }
        // Watermark, with the wrong count or body now and then.
        6 => {
            let body = random_blob(rng, &[8], 16);
            let count = if rng.gen_bool(0.8) { 1 } else { rng.gen() };
            message(rng, count, proto::KIND_WATERMARK, &body)
        }
        // Unknown kinds.
        7 => {
            let body = random_blob(rng, &[8, 32], 64);
            let (count, kind) = (rng.gen_range(0..3), rng.gen());
            message(rng, count, kind, &body)
        }
        // A header announcing a large message, and part of it (the connection then ends).
        8 => {
            let len: u32 = rng.gen_range(1 << 20..=16 << 20);
            let mut m = Vec::new();
            m.extend_from_slice(&len.to_le_bytes());
            m.extend_from_slice(&1u16.to_le_bytes());
            m.extend_from_slice(&proto::KIND_APPEND.to_le_bytes());
            m.resize(rng.gen_range(8..256 << 10), 0);
            m
        }
        // Random bytes.
        _ => random_blob(rng, &[4, 8, 32], 4096),
    }
}

/// Waits until the replay stops moving; returns the log's end (where the next range starts).
fn quiesce(s: &mut TcpStream) -> u64 {
    let mut m = Vec::new();
    proto::encode_watermark(&mut m, 7);
    let mut last = u64::MAX;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let w = call(s, &m, 1).remove(0);
        assert_eq!(
            (w.status, w.kind, w.req_id),
            (status::OK, proto::KIND_WATERMARK, 7)
        );
        if w.lsn == last {
            return last + 1;
        }
        assert!(Instant::now() < deadline, "the replay never settles");
        last = w.lsn;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh client appends one record at the log's end and reads it back in its page.
fn check_serving(addr: SocketAddr, rng: &mut SmallRng) -> u64 {
    let mut s = TcpStream::connect(addr).unwrap();
    let start = quiesce(&mut s);
    let page_id = rng.gen_range(0..PAGES);
    let data: Vec<u8> = (0..rng.gen_range(1..100)).map(|_| rng.gen()).collect();
    let offset = rng.gen_range(0..(PS - page::HEADER - data.len())) as u16;
    let mut m = Vec::new();
    proto::encode_append(
        &mut m,
        start,
        start + 2,
        &[Record {
            lsn: start,
            page: page_id,
            offset,
            data: &data,
        }],
    );
    let r = call(&mut s, &m, 1).remove(0);
    assert_eq!(
        (r.status, r.kind),
        (status::OK, proto::KIND_APPEND),
        "append at {start}"
    );
    let mut m = Vec::new();
    proto::encode_getpages(
        &mut m,
        &[GetPage {
            req_id: 42,
            lsn: start + 1,
            nms: start,
            page: page_id,
        }],
    );
    let r = call(&mut s, &m, 1).remove(0);
    assert_eq!(
        (r.status, r.req_id, r.lsn),
        (status::OK, 42, start),
        "page {page_id}"
    );
    assert_eq!(page::check(&r.body), Some((page_id, start)));
    let at = page::HEADER + offset as usize;
    assert_eq!(&r.body[at..at + data.len()], &data[..], "page {page_id}");
    start + 2
}

#[test]
fn random_frames_never_stop_the_page_server() {
    let seed = test_seed("random_frames_never_stop_the_page_server");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut ps, addr) = spawn_listening(
        Command::new(DDS)
            .args(["pageserver", "--storage", "file", "--dir"])
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--pages", &PAGES.to_string()])
            .args([
                "--buffer-pool",
                "16",
                "--wal-size",
                "4M",
                "--lsn-wait-ms",
                "50",
            ])
            .stderr(Stdio::null()),
    );
    let t0 = Instant::now();
    let mut log_end = check_serving(addr, &mut rng);
    let (mut frames, mut received) = (0usize, 0u64);
    for burst in 0..20 {
        let streams: Vec<Vec<u8>> = (0..50)
            .map(|_| {
                let n = rng.gen_range(1..8);
                frames += n;
                let mut b = Vec::new();
                for _ in 0..n {
                    let mut f = random_frame(&mut rng, log_end);
                    if rng.gen_range(0..20) == 0 {
                        // Truncated: the connection ends inside the frame.
                        f.truncate(rng.gen_range(0..=f.len()));
                        b.extend_from_slice(&f);
                        break;
                    }
                    b.extend_from_slice(&f);
                }
                b
            })
            .collect();
        received += hostile_clients(addr, streams, 8, Duration::from_millis(250));
        assert_alive(&mut ps, "dds pageserver");
        log_end = check_serving(addr, &mut rng);
        eprintln!(
            "burst {burst}: {frames} frames so far, log end {log_end}, {:?}",
            t0.elapsed()
        );
    }
    eprintln!(
        "{frames} frames, {received} bytes of replies, {:?}",
        t0.elapsed()
    );
    assert!(frames > 3000, "{frames}");
    assert!(received > 0, "the server answered nothing");
}
