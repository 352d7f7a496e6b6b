//! Micro-benchmark (prints, asserts nothing about timing): transactions/s of `WriteFull`
//! through the proxy with Flow-Adapt on and off, PCIe cost model on.
//! `cargo test --release -p dds-objproxy --test bench -- --ignored --nocapture`

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dds_objproxy::ProxyOptions;
use dds_objstore::{ObjectId, ObjectStore, Transaction, TxOp};

fn run(size: usize, threads: u64, batching: bool, chunking: bool) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = Arc::new(connect(
        &pair,
        ProxyOptions {
            batching,
            chunking,
            channels: 1,
            ..Default::default()
        },
    ));
    let dur = Duration::from_secs(3);
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                let data = vec![t as u8; size];
                while t0.elapsed() < dur {
                    let mut tx = Transaction::new();
                    tx.push(TxOp::WriteFull {
                        oid: ObjectId::new(1, format!("t{t}-{}", n % 8)),
                        data: data.clone(),
                    });
                    p.submit(&tx).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let n: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    eprintln!(
        "{:>7} B x {threads} threads, batching {batching:5}, chunking {chunking:5}: {rate:8.0} tx/s  {:?}",
        size,
        p.stats()
    );
    rate
}

#[test]
#[ignore]
fn flow_adapt() {
    let on = run(64 << 10, 8, true, true);
    let off = run(64 << 10, 8, false, false);
    eprintln!("batching_over_unbatched_64k = {:.2}", on / off);
    let on = run(4 << 20, 2, true, true);
    let off = run(4 << 20, 2, true, false);
    eprintln!("chunking_over_unchunked_4m = {:.2}", on / off);
}
