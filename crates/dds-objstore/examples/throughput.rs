//! Throughput of `WriteFull` transactions of 64 KiB and 4 MiB (and of reading them back), with
//! one submitter and with several concurrent ones (group commit). Prints; asserts nothing.
//!
//! `cargo run --release -p dds-objstore --example throughput [-- DIR]` (default: a temporary
//! directory; give a directory on the file system to measure).

use dds_objstore::{ObjStore, ObjectId, ObjectStore, Transaction, TxOp};
use std::sync::Arc;
use std::time::Instant;

fn run(store: &Arc<ObjStore>, size: usize, total: usize, threads: usize) {
    let per_thread = total / threads;
    // The transactions are built before the clock starts: only the store is measured.
    let txs: Vec<Vec<Transaction>> = (0..threads)
        .map(|t| {
            (0..per_thread)
                .map(|i| Transaction {
                    ops: vec![TxOp::WriteFull {
                        oid: ObjectId::new(1, format!("s{size}-t{t}-{}", i % 16)),
                        data: vec![(t + i) as u8; size],
                    }],
                })
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    let handles: Vec<_> = txs
        .into_iter()
        .map(|txs| {
            let store = store.clone();
            std::thread::spawn(move || {
                for tx in &txs {
                    store.submit(tx).expect("write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("submitter");
    }
    let secs = t0.elapsed().as_secs_f64();
    let n = per_thread * threads;
    let mib = (n * size) as f64 / (1 << 20) as f64;
    println!(
        "write_full {:>5} KiB x {n:>4}, {threads} submitter(s): {:>8.1} tx/s {:>8.1} MiB/s",
        size >> 10,
        n as f64 / secs,
        mib / secs
    );
    let t0 = Instant::now();
    let mut bytes = 0usize;
    for i in 0..16.min(per_thread) {
        let oid = ObjectId::new(1, format!("s{size}-t0-{i}"));
        bytes += store.read(&oid, 0, u64::MAX).expect("read").len();
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "read       {:>5} KiB x {:>4}:                 {:>8.1} MiB/s",
        size >> 10,
        16.min(per_thread),
        bytes as f64 / (1 << 20) as f64 / secs
    );
}

fn main() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let path = dir.join("objstore-throughput.dev");
    ObjStore::format(&path, 1 << 30, true).expect("format");
    let store = Arc::new(ObjStore::open(&path).expect("open"));
    run(&store, 64 << 10, 512, 1);
    run(&store, 64 << 10, 512, 4);
    run(&store, 4 << 20, 64, 1);
    run(&store, 4 << 20, 64, 4);
    drop(store);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(ObjStore::meta_path(&path));
}
