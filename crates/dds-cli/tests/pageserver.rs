//! `dds pageserver` end to end: log appends and GetPage@LSN from several clients checked
//! against a model that replays the same log (with the DPU serving page reads through the
//! traffic director, and without it), kill -9 during replay, and bad input.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::{call_pageserver as call, format_device, offloaded, start_dpu, Guard, DDS};
use dds_pageserver::page;
use dds_pageserver::proto::{self, status, GetPage, Record, Response};
use rand::{Rng, SeedableRng};

const PS: usize = 8192;
const PAGES: u64 = 64;

/// `dds pageserver --listen LISTEN` on the DPU at `socket`: the process and the address of its
/// ready line.
fn start_pageserver(listen: &str, socket: &Path, extra: &[&str]) -> (Guard, SocketAddr) {
    // GetPages wait for the replay as long as it takes (unless a test says otherwise): on a
    // machine running several emulated DPUs at once a storage round trip can take seconds,
    // and a GetPage's LSN_TIMEOUT is not what these tests look at.
    let lsn_wait: &[&str] = if extra.contains(&"--lsn-wait-ms") {
        &[]
    } else {
        &["--lsn-wait-ms", "120000"]
    };
    common::spawn_listening(
        Command::new(DDS)
            .args(["pageserver", "--listen", listen, "--socket"])
            .arg(socket)
            .args(["--pages", "256", "--buffer-pool", "16", "--wal-size", "4M"])
            .args(lsn_wait)
            .args(extra),
    )
}

/// The log as the clients acknowledged it: (lsn, page, offset, bytes).
type Log = Vec<(u64, u64, u16, Vec<u8>)>;

/// A page as of `lsn` by the model: its payload and page LSN.
fn model_page(log: &Log, page: u64, lsn: u64) -> (Vec<u8>, u64) {
    let mut p = vec![0u8; PS - page::HEADER];
    let mut last = 0;
    for (l, pg, off, data) in log.iter().filter(|r| r.1 == page && r.0 <= lsn) {
        let _ = pg;
        p[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        last = *l;
    }
    (p, last)
}

fn append(s: &mut TcpStream, start: u64, end: u64, recs: &[(u64, u64, u16, Vec<u8>)]) -> Response {
    let r: Vec<Record<'_>> = recs
        .iter()
        .map(|(lsn, page, offset, data)| Record {
            lsn: *lsn,
            page: *page,
            offset: *offset,
            data,
        })
        .collect();
    let mut m = Vec::new();
    proto::encode_append(&mut m, start, end, &r);
    call(s, &m, 1).remove(0)
}

/// A writer appending random patches while readers check GetPages against the model.
fn run_workload(writer: SocketAddr, readers: &[SocketAddr], ranges: usize) -> (u64, u64) {
    let log: Mutex<Log> = Mutex::new(Vec::new());
    let acked = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let (checked, retried) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
            let mut s = TcpStream::connect(writer).unwrap();
            let mut lsn = 1u64;
            for _ in 0..ranges {
                let start = lsn;
                let recs: Log = (0..rng.gen_range(1..8))
                    .map(|_| {
                        // Gaps between record LSNs, as a log whose other records are not
                        // page changes.
                        lsn += rng.gen_range(1..4);
                        let len = rng.gen_range(1..200);
                        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                        let off = rng.gen_range(0..(PS - page::HEADER - len)) as u16;
                        (lsn, rng.gen_range(0..PAGES), off, data)
                    })
                    .collect();
                lsn += 1;
                // Into the model first: a reader that sees the server ahead of `acked` can
                // tell a later change from a wrong answer.
                log.lock().unwrap().extend(recs.iter().cloned());
                let r = append(&mut s, start, lsn, &recs);
                assert_eq!(r.status, status::OK, "append [{start}, {lsn})");
                acked.store(lsn - 1, Ordering::Release);
                std::thread::sleep(Duration::from_micros(300));
            }
            done.store(true, Ordering::Release);
        });
        for (c, &addr) in readers.iter().enumerate() {
            let (log, acked, done, checked, retried) = (&log, &acked, &done, &checked, &retried);
            sc.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(c as u64 + 100);
                let mut s = TcpStream::connect(addr).unwrap();
                let mut id = 0u64;
                while !done.load(Ordering::Acquire) {
                    let r = acked.load(Ordering::Acquire);
                    if r == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    let snapshot = log.lock().unwrap().clone();
                    let reqs: Vec<GetPage> = (0..4)
                        .map(|_| {
                            id += 1;
                            let page = rng.gen_range(0..PAGES);
                            let (_, n) = model_page(&snapshot, page, r);
                            GetPage {
                                req_id: id,
                                lsn: r,
                                nms: n,
                                page,
                            }
                        })
                        .collect();
                    let mut m = Vec::new();
                    proto::encode_getpages(&mut m, &reqs);
                    let resps = call(&mut s, &m, reqs.len());
                    for (g, resp) in reqs.iter().zip(resps) {
                        assert_eq!(resp.req_id, g.req_id, "responses in request order");
                        match resp.status {
                            status::OK => {
                                let (want, lsn) = model_page(&snapshot, g.page, g.lsn);
                                assert_eq!(resp.lsn, lsn, "page {} LSN at {}", g.page, g.lsn);
                                assert_eq!(page::check(&resp.body), Some((g.page, lsn)));
                                assert!(
                                    resp.body[page::HEADER..] == want[..],
                                    "page {} as of {} differs from the model",
                                    g.page,
                                    g.lsn
                                );
                                checked.fetch_add(1, Ordering::Relaxed);
                            }
                            status::OLD_VERSION => {
                                // Only when the page changed after the read point.
                                let later = log
                                    .lock()
                                    .unwrap()
                                    .iter()
                                    .any(|x| x.1 == g.page && x.0 > g.lsn);
                                assert!(later, "OLD_VERSION for page {} at {}", g.page, g.lsn);
                            }
                            status::RETRY => {
                                retried.fetch_add(1, Ordering::Relaxed);
                            }
                            other => panic!("status {other} for {g:?}"),
                        }
                    }
                }
            });
        }
    });
    (checked.into_inner(), retried.into_inner())
}

#[test]
fn getpages_match_the_model_with_the_dpu_serving_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, d) = common::start_offload_dpu(dir.path(), "256M", "pageserver");
    let (_ps, h) = start_pageserver("127.0.0.1:0", &socket, &[]);
    // The window of `dds stats`'s DPU CPU per page read starts here.
    offloaded(&socket);
    let (checked, retried) = run_workload(h, &[d, d, d, h], 400);
    let us = common::dpu_cpu_per_request(&socket, "page read", 100);
    eprintln!("DPU CPU per offloaded page read: {us:.1} µs");
    let served = offloaded(&socket);
    eprintln!("{checked} pages checked, {served} served by the DPU, {retried} retried");
    assert!(checked > 500, "{checked} pages checked");
    assert!(served > 100, "the DPU served {served} GetPages");
}

#[test]
fn getpages_match_the_model_without_offload() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_ps, a) = start_pageserver("127.0.0.1:0", &socket, &[]);
    let (checked, retried) = run_workload(a, &[a, a, a], 300);
    assert!(checked > 300, "{checked} pages checked");
    assert_eq!(retried, 0, "the host never answers RETRY");
}

#[test]
fn acknowledged_log_survives_kill_9_during_replay() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    // The first life binds a port of its choosing; the next ones bind the same.
    let mut listen = "127.0.0.1:0".to_string();
    let mut log: Log = Vec::new();
    let mut lsn = 1u64;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
    for life in 0..3 {
        let (mut ps, addr) = start_pageserver(&listen, &socket, &[]);
        listen = addr.to_string();
        let mut s = TcpStream::connect(addr).unwrap();
        // What earlier lives acknowledged is there.
        let last = lsn - 1;
        for p in 0..PAGES {
            let (want, plsn) = model_page(&log, p, last);
            let mut m = Vec::new();
            proto::encode_getpages(
                &mut m,
                &[GetPage {
                    req_id: p,
                    lsn: last.max(1),
                    nms: plsn,
                    page: p,
                }],
            );
            let r = call(&mut s, &m, 1).remove(0);
            assert_eq!(r.status, status::OK, "life {life} page {p}");
            assert_eq!(r.lsn, plsn, "life {life} page {p}");
            assert!(r.body[page::HEADER..] == want[..], "life {life} page {p}");
        }
        // Many records in a few large ranges, then kill -9 right after the last
        // acknowledgement, while the replay is still going.
        for _ in 0..20 {
            let start = lsn;
            let recs: Log = (0..300)
                .map(|_| {
                    lsn += 1;
                    let data: Vec<u8> = (0..64).map(|_| rng.gen()).collect();
                    let off = rng.gen_range(0..(PS - page::HEADER - 64)) as u16;
                    (lsn, rng.gen_range(0..PAGES), off, data)
                })
                .collect();
            lsn += 1;
            assert_eq!(append(&mut s, start, lsn, &recs).status, status::OK);
            log.extend(recs);
        }
        ps.0.kill().unwrap();
        ps.0.wait().unwrap();
    }
}

#[test]
fn bad_input_gets_clear_statuses_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_ps, addr) = start_pageserver("127.0.0.1:0", &socket, &["--lsn-wait-ms", "300"]);
    let mut s = TcpStream::connect(addr).unwrap();
    let rec = |lsn, page, data: &[u8]| (lsn, page, 0u16, data.to_vec());
    assert_eq!(
        append(&mut s, 10, 20, &[rec(12, 3, b"three")]).status,
        status::OK
    );
    // A retransmission, a gap, LSNs outside the range, a record outside its page.
    assert_eq!(
        append(&mut s, 10, 20, &[rec(12, 3, b"X")]).status,
        status::DUPLICATE
    );
    assert_eq!(
        append(&mut s, 25, 30, &[rec(26, 3, b"X")]).status,
        status::OUT_OF_ORDER
    );
    assert_eq!(
        append(&mut s, 20, 30, &[rec(35, 3, b"X")]).status,
        status::BAD_REQUEST
    );
    assert_eq!(
        append(&mut s, 20, 30, &[rec(22, 999, b"X")]).status,
        status::BAD_REQUEST
    );
    let big = vec![1u8; PS];
    assert_eq!(
        append(&mut s, 20, 30, &[rec(22, 3, &big)]).status,
        status::BAD_REQUEST
    );
    let get = |s: &mut TcpStream, lsn, nms, page| {
        let mut m = Vec::new();
        proto::encode_getpages(
            &mut m,
            &[GetPage {
                req_id: 1,
                lsn,
                nms,
                page,
            }],
        );
        call(s, &m, 1).remove(0)
    };
    assert_eq!(get(&mut s, 19, 12, 9999).status, status::UNKNOWN_PAGE);
    assert_eq!(get(&mut s, 12, 19, 3).status, status::BAD_REQUEST);
    // An LSN from the future: a clear timeout.
    assert_eq!(get(&mut s, 500, 400, 3).status, status::LSN_TIMEOUT);
    // Page 3 as of 19 is intact.
    let r = get(&mut s, 19, 12, 3);
    assert_eq!((r.status, r.lsn), (status::OK, 12));
    assert_eq!(&r.body[page::HEADER..page::HEADER + 5], b"three");
    // Malformed frames close the connection (a bad kind, a truncated record list).
    for bad in [
        {
            let mut m = Vec::new();
            proto::encode_watermark(&mut m, 1);
            m[6] = 77;
            m
        },
        {
            let mut m = Vec::new();
            proto::encode_append(
                &mut m,
                20,
                30,
                &[Record {
                    lsn: 21,
                    page: 1,
                    offset: 0,
                    data: b"abc",
                }],
            );
            m[8 + 16] = 2; // two records announced, one present
            m
        },
    ] {
        let mut t = TcpStream::connect(addr).unwrap();
        t.write_all(&bad).unwrap();
        let mut rest = Vec::new();
        t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = t.read_to_end(&mut rest).unwrap();
        assert_eq!(
            n, 0,
            "a malformed message gets no reply: the connection closes"
        );
    }
    // The log goes on where it was, and the watermark tells.
    assert_eq!(
        append(&mut s, 20, 30, &[rec(21, 4, b"four")]).status,
        status::OK
    );
    let mut m = Vec::new();
    proto::encode_watermark(&mut m, 5);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let w = call(&mut s, &m, 1).remove(0);
        if w.lsn >= 29 {
            assert_eq!(u64::from_le_bytes(w.body[..8].try_into().unwrap()), 21);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replay never reached 29"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = get(&mut s, 29, 21, 4);
    assert_eq!((r.status, r.lsn), (status::OK, 21));
}

#[test]
fn partial_messages_stay_within_the_input_budget() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (ps, addr) = start_pageserver("127.0.0.1:0", &socket, &["--input-memory", "1M"]);
    let rss = || -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{}/status", ps.0.id())).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let before = rss();
    // 40 connections each announce a 12 MiB AppendWal and send 1 MiB of it.
    let mut conns = Vec::new();
    for _ in 0..40 {
        let mut t = TcpStream::connect(addr).unwrap();
        let mut m = Vec::new();
        m.extend_from_slice(&(12u32 << 20).to_le_bytes());
        m.extend_from_slice(&1u16.to_le_bytes());
        m.extend_from_slice(&proto::KIND_APPEND.to_le_bytes());
        m.resize(1 << 20, 0);
        t.set_write_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let _ = t.write_all(&m);
        conns.push(t);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 16 << 20,
        "40 partial messages took {} MiB",
        grown >> 20
    );
    // Others are still served.
    let mut s = TcpStream::connect(addr).unwrap();
    let mut m = Vec::new();
    proto::encode_watermark(&mut m, 1);
    assert_eq!(call(&mut s, &m, 1)[0].status, status::OK);
}
