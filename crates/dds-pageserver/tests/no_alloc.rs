//! The GetPage path allocates nothing in steady state: after a warm-up, batches of GetPages
//! over a real socket (most of them page reads from storage, deferred and answered when the
//! read completes) allocate nothing on the server's thread. The server runs in this process on
//! a thread of its own, and only that thread's allocations are counted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_pageserver::proto::{self, status, GetPage, Record, Response};
use dds_pageserver::{page, PageServer, PageServerConfig};
use dds_storage::OsStorage;
use dds_testkit::alloc::{allocations_in, count_this_thread, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const PS: usize = 8192;
const PAGES: u64 = 256;

fn responses(s: &mut TcpStream, n: usize) -> Vec<Response> {
    (0..n)
        .map(|_| {
            let mut h = [0u8; 4];
            s.read_exact(&mut h).unwrap();
            let len = u32::from_le_bytes(h) as usize;
            let mut b = vec![0u8; len];
            b[..4].copy_from_slice(&h);
            s.read_exact(&mut b[4..]).unwrap();
            proto::decode_response(&b)
        })
        .collect()
}

/// `rounds` batches of GetPages, checking every reply: the page of the batch before (in the
/// buffer pool: answered at once), then pages the scan has not read for a while (read from
/// storage), one of them twice (two GetPages waiting for one read). The scan's pattern repeats
/// every 64 batches.
fn getpages(s: &mut TcpStream, rounds: usize, last: u64, at: &mut u64, id: &mut u64) {
    let mut m = Vec::new();
    let mut reqs = Vec::new();
    for _ in 0..rounds {
        let p = *at;
        let pages = [
            (p + PAGES - 1) % PAGES,
            p,
            (p + 1) % PAGES,
            p,
            (p + 2) % PAGES,
            (p + 3) % PAGES,
        ];
        *at = (p + 4) % PAGES;
        reqs.clear();
        for page in pages {
            *id += 1;
            reqs.push(GetPage {
                req_id: *id,
                lsn: last,
                nms: 0,
                page,
            });
        }
        m.clear();
        proto::encode_getpages(&mut m, &reqs);
        s.write_all(&m).unwrap();
        for (g, r) in reqs.iter().zip(responses(s, reqs.len())) {
            assert_eq!(
                (r.status, r.req_id),
                (status::OK, g.req_id),
                "in request order"
            );
            assert_eq!(page::check(&r.body), Some((g.page, g.page + 1)));
        }
    }
}

#[test]
fn getpages_allocate_nothing_in_steady_state() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = PageServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        page_size: PS,
        pages: PAGES,
        buffer_pool: 8,
        wal_size: 4 << 20,
        offload: false,
        ..PageServerConfig::default()
    };
    let server = PageServer::open(cfg, Box::new(OsStorage::new(dir.path()).unwrap())).unwrap();
    let addr = server.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            count_this_thread(true);
            server.run(&stop)
        })
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // Every page gets a record, so that reads return written pages.
    let data = [0x5au8; 64];
    let recs: Vec<Record<'_>> = (0..PAGES)
        .map(|p| Record {
            lsn: p + 1,
            page: p,
            offset: (p * 8) as u16,
            data: &data,
        })
        .collect();
    let mut m = Vec::new();
    proto::encode_append(&mut m, 1, PAGES + 1, &recs);
    s.write_all(&m).unwrap();
    assert_eq!(responses(&mut s, 1)[0].status, status::OK);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut m = Vec::new();
        proto::encode_watermark(&mut m, 1);
        s.write_all(&m).unwrap();
        if responses(&mut s, 1)[0].lsn >= PAGES {
            break;
        }
        assert!(Instant::now() < deadline, "the replay never finished");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (mut at, mut id) = (0, 0);
    getpages(&mut s, 256, PAGES, &mut at, &mut id);
    let n = allocations_in(|| getpages(&mut s, 1000, PAGES, &mut at, &mut id));
    drop(s);
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap().unwrap();
    assert_eq!(n, 0, "allocations on the server thread for 6000 GetPages");
}
