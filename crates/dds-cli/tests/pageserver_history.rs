//! `dds pageserver` page versions against a model: random AppendWal ranges and GetPage@LSN at
//! random LSNs below, within and at the top of the retention horizon, with the DPU serving
//! pages and without, through clean restarts, `kill -9` of the page server and `kill -9` of
//! the DPU. The model is every page at every LSN (the acknowledged log, replayed); every OK
//! answer must be it exactly, and `BELOW_HORIZON` only comes for an LSN below the horizon the
//! server reports (which never passes the configured retention unless the log ran full).
//! Not-modified-since LSNs are the page's last record at or below the read point or the read
//! point itself (both honest), so the DPU must find from its own cache entries whether a
//! stored image is the version asked for; readers lagging the newest LSN through the director
//! check the DPU's answers at old LSNs, and the DPU's statistics show it served some.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;

use common::{call_pageserver as call, format_device, offloaded, start_dpu, Guard, DDS};
use dds_pageserver::page;
use dds_pageserver::proto::{self, status, GetPage, Record};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PS: usize = 8192;
const PAGES: u64 = 32;

/// The acknowledged log: (lsn, page, offset, bytes), in LSN order.
type Log = Vec<(u64, u64, u16, Vec<u8>)>;

/// Page `page` as of `lsn`: its payload and LSN.
fn model_page(log: &Log, page: u64, lsn: u64) -> (Vec<u8>, u64) {
    let mut p = vec![0u8; PS - page::HEADER];
    let mut last = 0;
    for (l, _, off, data) in log.iter().filter(|r| r.1 == page && r.0 <= lsn) {
        p[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        last = *l;
    }
    (p, last)
}

/// The DPU on `img` (formatted already), with the `pageserver` offload app and its director
/// when `offload`.
fn dpu(img: &Path, socket: &Path, offload: bool) -> (Guard, Option<SocketAddr>) {
    if !offload {
        return (start_dpu(img, socket, &[]), None);
    }
    let (g, director) = common::spawn_offload_dpu(img, socket, "pageserver", &[]);
    (g, Some(director))
}

fn pageserver(listen: &str, socket: &Path, retention: &str, wal: &str) -> (Guard, SocketAddr) {
    common::spawn_listening(
        Command::new(DDS)
            .args(["pageserver", "--listen", listen, "--socket"])
            .arg(socket)
            .args(["--pages", &PAGES.to_string(), "--buffer-pool", "8"])
            .args(["--wal-size", wal, "--retention", retention])
            .args(["--lsn-wait-ms", "120000"]),
    )
}

/// (applied LSN, horizon) by a Watermark.
fn watermark(s: &mut TcpStream) -> (u64, u64) {
    let mut m = Vec::new();
    proto::encode_watermark(&mut m, 1);
    let r = call(s, &m, 1).remove(0);
    assert_eq!(r.status, status::OK);
    (r.lsn, u64::from_le_bytes(r.body[8..16].try_into().unwrap()))
}

struct Checker {
    log: Log,
    /// Last acknowledged LSN.
    acked: u64,
    retention: u64,
    /// The log may run full (the horizon may pass the retention).
    pressure: bool,
    id: u64,
    checked: u64,
    below: u64,
    retried: u64,
}

impl Checker {
    /// GetPages of `pages` at `lsns`, on `s`, checked against the model.
    fn get(&mut self, s: &mut TcpStream, reqs: &[(u64, u64)]) {
        let gets: Vec<GetPage> = reqs
            .iter()
            .map(|&(page, lsn)| {
                self.id += 1;
                // Honest either way: no record of the page in (nms, lsn].
                let nms = match self.id % 2 {
                    0 => model_page(&self.log, page, lsn).1,
                    _ => lsn,
                };
                GetPage {
                    req_id: self.id,
                    lsn,
                    nms,
                    page,
                }
            })
            .collect();
        let mut m = Vec::new();
        proto::encode_getpages(&mut m, &gets);
        for (g, r) in gets.iter().zip(call(s, &m, gets.len())) {
            assert_eq!(r.req_id, g.req_id, "in request order");
            match r.status {
                status::OK => {
                    let (want, lsn) = model_page(&self.log, g.page, g.lsn);
                    assert_eq!(r.lsn, lsn, "page {} LSN as of {}", g.page, g.lsn);
                    assert_eq!(page::check(&r.body), Some((g.page, lsn)));
                    assert!(
                        r.body[page::HEADER..] == want[..],
                        "page {} as of {} differs from the model",
                        g.page,
                        g.lsn
                    );
                    self.checked += 1;
                }
                status::BELOW_HORIZON => {
                    assert!(
                        g.lsn < r.lsn,
                        "{} refused above the horizon {}",
                        g.lsn,
                        r.lsn
                    );
                    if !self.pressure {
                        assert!(
                            r.lsn + self.retention <= self.acked,
                            "horizon {} within the retention of {} LSNs of {}",
                            r.lsn,
                            self.retention,
                            self.acked
                        );
                    }
                    self.below += 1;
                }
                status::RETRY => self.retried += 1,
                other => panic!("status {other} for {g:?}"),
            }
        }
    }

    /// A random read point: below the retention, within it, or the newest.
    fn read_point(&self, rng: &mut SmallRng) -> u64 {
        let low = self.acked.saturating_sub(self.retention).max(1);
        match rng.gen_range(0..6) {
            0 if low > 1 => rng.gen_range(1..low),
            0 | 1 => self.acked,
            _ => rng.gen_range(low..=self.acked),
        }
    }

    /// A read point lagging the newest LSN, within the retention.
    fn lagging_point(&self, rng: &mut SmallRng) -> u64 {
        let low = self.acked.saturating_sub(self.retention).max(1);
        rng.gen_range(low..self.acked.max(low + 1)).min(self.acked)
    }
}

fn run_model(offload: bool, retention: u64, wal: &str, pressure: bool, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let ret = retention.to_string();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut c = Checker {
        log: Vec::new(),
        acked: 0,
        retention,
        pressure,
        id: 0,
        checked: 0,
        below: 0,
        retried: 0,
    };
    let mut lsn = 1u64;
    // GetPages at lagging read points sent through the director, and those the DPU served.
    let (mut lagging, mut lagging_dpu) = (0u64, 0u64);
    let mut listen = "127.0.0.1:0".to_string();
    let (mut dpu_guard, mut director) = dpu(&img, &socket, offload);
    for life in 0..4 {
        let (mut ps, addr) = pageserver(&listen, &socket, &ret, wal);
        listen = addr.to_string();
        let mut s = TcpStream::connect(addr).unwrap();
        let mut reader = director.map(|d| TcpStream::connect(d).unwrap());
        if c.acked > 0 {
            // Everything acknowledged is there: every page at the top, and within the horizon.
            let (applied, horizon) = watermark(&mut s);
            assert!(
                applied >= c.log.last().unwrap().0,
                "life {life}: applied {applied}"
            );
            assert!(horizon <= c.acked, "life {life}: horizon {horizon}");
            for p in 0..PAGES {
                let r = c.read_point(&mut rng).max(horizon);
                c.get(&mut s, &[(p, c.acked), (p, r)]);
            }
        }
        for _ in 0..200 {
            let start = lsn;
            let recs: Log = (0..rng.gen_range(1..8))
                .map(|_| {
                    lsn += rng.gen_range(1..4);
                    let len = rng.gen_range(1..300);
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    let off = rng.gen_range(0..(PS - page::HEADER - len)) as u16;
                    (lsn, rng.gen_range(0..PAGES), off, data)
                })
                .collect();
            let end = lsn + 1;
            let r: Vec<Record<'_>> = recs
                .iter()
                .map(|(l, p, o, d)| Record {
                    lsn: *l,
                    page: *p,
                    offset: *o,
                    data: d,
                })
                .collect();
            let mut m = Vec::new();
            proto::encode_append(&mut m, start, end, &r);
            let a = call(&mut s, &m, 1).remove(0);
            assert_eq!(a.status, status::OK, "append [{start}, {end})");
            lsn = end;
            c.log.extend(recs);
            c.acked = lsn - 1;
            let reqs: Vec<(u64, u64)> = (0..6)
                .map(|_| (rng.gen_range(0..PAGES), c.read_point(&mut rng)))
                .collect();
            // Reads through the director (the DPU serves what it can) and to the host.
            match reader.as_mut() {
                Some(d) if rng.gen_bool(0.7) => c.get(d, &reqs),
                _ => c.get(&mut s, &reqs),
            }
        }
        if let Some(d) = reader.as_mut() {
            // Readers lagging the newest LSN, alone on the director for a while: the DPU's
            // counter of requests it served tells how many of them it answered.
            let (before, retried) = (offloaded(&socket), c.retried);
            for _ in 0..50 {
                let reqs: Vec<(u64, u64)> = (0..8)
                    .map(|_| (rng.gen_range(0..PAGES), c.lagging_point(&mut rng)))
                    .collect();
                c.get(d, &reqs);
                lagging += reqs.len() as u64;
            }
            // A RETRY came from the DPU too, but is not an answer.
            lagging_dpu += offloaded(&socket) - before - (c.retried - retried);
        }
        drop(s);
        drop(reader);
        match life % 3 {
            0 => {
                // A clean stop.
                let pid = ps.0.id().to_string();
                Command::new("kill").args(["-TERM", &pid]).status().unwrap();
                let st = ps.0.wait().unwrap();
                assert!(st.success(), "the page server stopped with {st}");
            }
            1 => {
                ps.0.kill().unwrap();
                ps.0.wait().unwrap();
            }
            _ => {
                // The DPU dies too: the page server with it.
                dpu_guard.0.kill().unwrap();
                dpu_guard.0.wait().unwrap();
                ps.0.kill().unwrap();
                ps.0.wait().unwrap();
                drop(dpu_guard);
                (dpu_guard, director) = dpu(&img, &socket, offload);
            }
        }
    }
    eprintln!(
        "{} versions checked, {} below the horizon, {} retried; {lagging_dpu} of {lagging} \
         lagging reads served by the DPU",
        c.checked, c.below, c.retried
    );
    if offload {
        assert!(
            lagging_dpu > 0,
            "the DPU served none of {lagging} lagging reads"
        );
    }
    assert!(c.checked > 2000, "{} versions checked", c.checked);
    assert!(c.below > 0, "no read point fell below the horizon");
    if !offload {
        assert_eq!(c.retried, 0, "the host never answers RETRY");
    }
}

#[test]
fn versions_match_the_model_through_restarts_without_offload() {
    // A log of 256 KiB wraps several times behind a horizon of 300 LSNs.
    run_model(false, 300, "256K", false, 11);
}

#[test]
fn versions_match_the_model_through_restarts_with_the_dpu_serving_pages() {
    run_model(true, 300, "256K", false, 12);
}

#[test]
fn a_full_log_moves_the_horizon_and_answers_stay_exact() {
    // A retention far beyond what 64 KiB of log holds: the horizon moves up for room.
    run_model(false, 1_000_000, "64K", true, 13);
}

/// Appends one record of `page` at `lsn` (a range of its own); returns when acknowledged.
fn append_one(s: &mut TcpStream, lsn: u64, page: u64, data: &[u8]) {
    let r = [Record {
        lsn,
        page,
        offset: 0,
        data,
    }];
    let mut m = Vec::new();
    proto::encode_append(&mut m, lsn, lsn + 1, &r);
    assert_eq!(call(s, &m, 1).remove(0).status, status::OK, "append {lsn}");
}

/// One GetPage of `page` as of `lsn` (not-modified-since: the read point itself).
fn get_one(s: &mut TcpStream, page: u64, lsn: u64) -> proto::Response {
    let mut m = Vec::new();
    proto::encode_getpages(
        &mut m,
        &[GetPage {
            req_id: lsn,
            lsn,
            nms: lsn,
            page,
        }],
    );
    call(s, &m, 1).remove(0)
}

#[test]
fn a_retention_in_seconds_refuses_read_points_older_than_that_once_time_passed() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_ps, addr) = pageserver("127.0.0.1:0", &socket, "1s", "4M");
    let mut s = TcpStream::connect(addr).unwrap();
    // Page 3 at LSN 1 ("old"), then page 3 at LSN 2 ("new").
    append_one(&mut s, 1, 3, b"old");
    append_one(&mut s, 2, 3, b"new");
    // At once, LSN 1 is within a second of log: answered (unless this machine took a second
    // to get here).
    let t = std::time::Instant::now();
    let r = get_one(&mut s, 3, 1);
    let h = watermark(&mut s).1;
    if t.elapsed() < std::time::Duration::from_secs(1) {
        assert_eq!(r.status, status::OK);
        assert_eq!(&r.body[page::HEADER..page::HEADER + 3], b"old");
        assert_eq!(h, 0, "no horizon before a second passed");
    }
    // The log goes on for a while (a record every 50 ms), remembering when each LSN was
    // acknowledged.
    let start = std::time::Instant::now();
    let mut acked: Vec<(std::time::Instant, u64)> = vec![(start, 2)];
    let mut lsn = 2;
    let horizon = loop {
        std::thread::sleep(std::time::Duration::from_millis(50));
        lsn += 1;
        append_one(&mut s, lsn, 5, &lsn.to_le_bytes());
        acked.push((std::time::Instant::now(), lsn));
        let (_, h) = watermark(&mut s);
        if h > 2 {
            break h;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "the horizon stayed at {h}"
        );
    };
    // The horizon is a time: never above the LSN acknowledged a second before it was read.
    let now = std::time::Instant::now();
    let second_ago = acked
        .iter()
        .filter(|(at, _)| now.duration_since(*at) >= std::time::Duration::from_secs(1))
        .map(|&(_, l)| l)
        .max()
        .unwrap_or(0);
    assert!(
        horizon <= second_ago.max(2),
        "horizon {horizon} above the LSN of a second ago ({second_ago})"
    );
    assert!(
        start.elapsed() >= std::time::Duration::from_secs(1),
        "the horizon moved before a second passed"
    );
    // Below it: BELOW_HORIZON (status 9) with the horizon; at and above it: the page.
    let r = get_one(&mut s, 3, 1);
    assert_eq!(r.status, status::BELOW_HORIZON);
    assert_eq!(r.status, 9);
    assert_eq!(r.lsn, horizon);
    let r = get_one(&mut s, 3, horizon);
    assert_eq!(r.status, status::OK);
    assert_eq!(
        (r.lsn, &r.body[page::HEADER..page::HEADER + 3]),
        (2, &b"new"[..])
    );
    let r = get_one(&mut s, 5, lsn);
    assert_eq!(r.status, status::OK);
    assert_eq!(
        (r.lsn, &r.body[page::HEADER..page::HEADER + 8]),
        (lsn, &lsn.to_le_bytes()[..])
    );
    // `dds stats --pageserver`: the same log positions, and the storage per retained version.
    let out = Command::new(DDS)
        .args(["stats", "--json", "--pageserver", &addr.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "dds stats --pageserver failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["pageserver"];
    assert_eq!(p["applied_lsn"], lsn, "{v}");
    assert_eq!(p["durable_lsn"], lsn, "{v}");
    assert!(p["horizon"].as_u64().unwrap() >= horizon, "{v}");
    let (versions, bytes) = (
        p["retained_versions"].as_u64().unwrap(),
        p["retained_bytes"].as_u64().unwrap(),
    );
    // At least the records above the horizon (the log holds them), each a frame of 8 bytes
    // and a record of at least 32.
    assert!(versions >= lsn - horizon, "{v}");
    assert!(bytes >= 40 * (lsn - horizon), "{v}");
    let per = p["bytes_per_retained_version"].as_f64().unwrap();
    assert!((per - bytes as f64 / versions as f64).abs() < 1e-6, "{v}");
    let text = Command::new(DDS)
        .args(["stats", "--pageserver", &addr.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("bytes per version"), "{text}");
}
