//! Rough throughput of the director (run in release, ignored by default):
//! `cargo test --release -p dds-dpu --test offload_throughput -- --ignored --nocapture`.
//! Compares offloaded reads in zero-copy and copy mode (Fig. 20) and the same reads served
//! by the host through a spliced connection.

#[path = "offload/common.rs"]
mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use common::*;
use dds_apps::offload::pagestore::MessageBuilder;
use dds_apps::offload::PagestoreApp;
use dds_offload_api::OffloadApp;

fn run(copy_mode: bool, splice: bool, io: u32, batch: usize) -> (f64, f64) {
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
    let dpu = Dpu::start(app.clone(), 1);
    let files = dpu.files();
    let file = files.create("/pages");
    for i in 0..16u64 {
        files.write(file, i << 20, pattern(i, 1 << 20)).unwrap();
    }
    let host = pagestore_server(loopback(), files);
    let d = director(&dpu, app, host.addr, |c| {
        c.copy_mode = copy_mode;
        c.buffer_bytes = 64 << 10;
        c.context_ring_len = 128;
        if splice {
            c.signature = "10.0.0.0/8:* *:* tcp".parse().unwrap();
        }
    });
    let conns = 2;
    let msgs = if io > 8192 { 400 } else { 3000 };
    let t = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|k| {
            let addr = d.local_addr();
            std::thread::spawn(move || {
                let mut s = connect(addr);
                let mut r = s.try_clone().unwrap();
                let reader = std::thread::spawn(move || {
                    for _ in 0..msgs * batch {
                        read_response(&mut r).unwrap();
                    }
                });
                let mut b = MessageBuilder::new();
                let mut x = k as u64 * 7919 + 1;
                for m in 0..msgs {
                    b.clear();
                    for j in 0..batch {
                        x = x
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let off = (x >> 20) % ((16 << 20) - u64::from(io));
                        b.read(file, off & !511, io, (m * batch + j) as u64);
                    }
                    s.write_all(b.finish()).unwrap();
                }
                reader.join().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let secs = t.elapsed().as_secs_f64();
    let reqs = (conns * msgs * batch) as f64;
    (reqs / secs, reqs * f64::from(io) / secs / 1e6)
}

#[test]
#[ignore]
fn throughput() {
    for (io, batch) in [(1024u32, 8usize), (65536, 2)] {
        for (name, copy, splice) in [
            ("offload zero-copy", false, false),
            ("offload copy", true, false),
            ("host (spliced)", false, true),
        ] {
            let (rps, mbs) = run(copy, splice, io, batch);
            println!("{io:>6} B x{batch} {name:<18} {rps:>10.0} req/s {mbs:>8.1} MB/s");
        }
    }
}
