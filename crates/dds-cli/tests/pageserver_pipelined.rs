//! `dds pageserver` on DDS files with many page reads in flight: a client sends several full
//! GetPage batches (1024 requests each: random pages, the same page more than once, unknown
//! pages) before it reads any reply, over a buffer pool far smaller than the database, and
//! checks every reply against the log it appended: request order, status, page id, page LSN
//! and contents.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{format_device, spawn_listening, start_dpu, DDS};
use dds_pageserver::page;
use dds_pageserver::proto::{self, status, GetPage, Record, Response};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PS: usize = 8192;
const PAGES: u64 = 2048;

fn responses(s: &mut TcpStream, n: usize) -> Vec<Response> {
    (0..n)
        .map(|_| {
            let mut h = [0u8; 4];
            s.read_exact(&mut h).unwrap();
            let len = u32::from_le_bytes(h) as usize;
            assert!((proto::RESP_HEADER..=proto::RESP_HEADER + PS).contains(&len));
            let mut b = vec![0u8; len];
            b[..4].copy_from_slice(&h);
            s.read_exact(&mut b[4..]).unwrap();
            proto::decode_response(&b)
        })
        .collect()
}

/// The bytes record of page `p` writes at payload offset `p % 4096`.
fn patch(p: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&p.to_le_bytes());
    d[8..].copy_from_slice(&(!p).to_le_bytes());
    d
}

#[test]
fn pipelined_getpage_batches_come_back_in_order_from_storage() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_ps, addr) = spawn_listening(
        Command::new(DDS)
            .args(["pageserver", "--listen", "127.0.0.1:0", "--socket"])
            .arg(&socket)
            .args(["--pages", &PAGES.to_string(), "--buffer-pool", "32"])
            .args(["--wal-size", "16M"])
            .stderr(Stdio::null()),
    );
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // One record per page, page p at LSN p + 1.
    let data: Vec<[u8; 16]> = (0..PAGES).map(patch).collect();
    let recs: Vec<Record<'_>> = (0..PAGES)
        .map(|p| Record {
            lsn: p + 1,
            page: p,
            offset: (p % 4096) as u16,
            data: &data[p as usize],
        })
        .collect();
    let mut m = Vec::new();
    proto::encode_append(&mut m, 1, PAGES + 1, &recs);
    s.write_all(&m).unwrap();
    assert_eq!(responses(&mut s, 1)[0].status, status::OK);
    // Every page is on storage (the replay wrote it back) once the watermark reaches the end.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut m = Vec::new();
        proto::encode_watermark(&mut m, 1);
        s.write_all(&m).unwrap();
        if responses(&mut s, 1)[0].lsn >= PAGES {
            break;
        }
        assert!(Instant::now() < deadline, "the replay never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut rng = SmallRng::seed_from_u64(11);
    for round in 0..3 {
        let mut reqs: Vec<GetPage> = Vec::new();
        let mut m = Vec::new();
        for b in 0..6u64 {
            let batch: Vec<GetPage> = (0..proto::REQUESTS_MAX as u64)
                .map(|k| {
                    let page = match rng.gen_range(0..40) {
                        0 => PAGES + rng.gen_range(0..4),
                        1..=4 if k > 0 => reqs.last().map_or(0, |g: &GetPage| g.page),
                        _ => rng.gen_range(0..PAGES),
                    };
                    let g = GetPage {
                        req_id: (round << 32) | (b << 16) | k,
                        lsn: PAGES,
                        nms: page.min(PAGES) + 1,
                        page,
                    };
                    reqs.push(g);
                    g
                })
                .collect();
            proto::encode_getpages(&mut m, &batch);
        }
        // Every batch goes out before any reply is read.
        s.write_all(&m).unwrap();
        let got = responses(&mut s, reqs.len());
        for (g, r) in reqs.iter().zip(got) {
            assert_eq!(
                (r.req_id, r.kind),
                (g.req_id, proto::KIND_GETPAGE),
                "request order"
            );
            if g.page >= PAGES {
                assert_eq!(r.status, status::UNKNOWN_PAGE);
                continue;
            }
            assert_eq!(
                (r.status, r.lsn),
                (status::OK, g.page + 1),
                "page {}",
                g.page
            );
            assert_eq!(page::check(&r.body), Some((g.page, g.page + 1)));
            let at = page::HEADER + (g.page % 4096) as usize;
            assert_eq!(&r.body[at..at + 16], &patch(g.page), "page {}", g.page);
        }
    }
}
