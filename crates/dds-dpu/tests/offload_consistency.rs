//! The consistency contract (`docs/consistency.md`) with the log-structured KV app: a PUT
//! acknowledged to one client is never followed by a GET (on any connection) that returns an
//! older value, while GETs are served on the DPU from cache-on-write entries.

#[path = "offload/common.rs"]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use dds_apps::offload::kv::*;
use dds_offload_api::OffloadApp;
use dds_proto::Status;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 24;

fn value(key: u64, seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend(pattern(key * 7919 + seq, len - 16));
    v
}

fn read_kv(s: &mut TcpStream) -> (u16, u64, Vec<u8>) {
    let (h, body) = read_response(s).unwrap();
    (h.status, h.req_id, body[..h.len as usize].to_vec())
}

/// Returns the seq a GET saw (0 = not found), checking the value's integrity.
fn seq_of(key: u64, st: u16, v: &[u8]) -> u64 {
    if st == Status::NotFound.code() {
        return 0;
    }
    assert_eq!(st, 0, "GET status");
    assert!(v.len() >= 16);
    assert_eq!(u64::from_le_bytes(v[0..8].try_into().unwrap()), key);
    let seq = u64::from_le_bytes(v[8..16].try_into().unwrap());
    assert_eq!(v, &value(key, seq, v.len())[..], "value bytes");
    seq
}

#[test]
fn acknowledged_puts_are_never_followed_by_older_gets() {
    let app: Arc<dyn OffloadApp> = Arc::new(KvApp);
    let dpu = Dpu::start(app.clone(), 2);
    let files = dpu.files();
    let log = files.create("/kvlog");
    let state = Arc::new(KvState {
        files: files.clone(),
        log,
        inner: Mutex::new((0, Default::default())),
    });
    let host = kv_server(loopback(), state);
    let d = director(&dpu, app, host.addr, |c| c.threads = 2);
    let addr = d.local_addr();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let writers = 2u64;
    let mut threads = Vec::new();
    for w in 0..writers {
        let acked = acked.clone();
        threads.push(std::thread::spawn(move || {
            let mut s = connect(addr);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(w);
            let mut seqs = vec![0u64; KEYS as usize];
            let mut b = KvMessageBuilder::new();
            for i in 0..250u64 {
                let key = w + writers * rng.gen_range(0..KEYS / writers);
                seqs[key as usize] += 1;
                let seq = seqs[key as usize];
                let v = value(key, seq, rng.gen_range(16..300));
                b.clear();
                b.put(key, &v, i * 2);
                // Same connection: a GET pipelined right behind the PUT must see it.
                let same_msg = rng.gen_bool(0.5);
                if same_msg {
                    b.get(key, i * 2 + 1);
                }
                s.write_all(b.finish()).unwrap();
                if !same_msg {
                    b.clear();
                    b.get(key, i * 2 + 1);
                    s.write_all(b.finish()).unwrap();
                }
                let (st, id, _) = read_kv(&mut s);
                assert_eq!((st, id), (0, i * 2), "PUT acknowledged");
                acked[key as usize].store(seq, Ordering::SeqCst);
                let (st, id, v) = read_kv(&mut s);
                assert_eq!(id, i * 2 + 1);
                assert_eq!(
                    seq_of(key, st, &v),
                    seq,
                    "GET behind a PUT on one connection"
                );
            }
        }));
    }
    let mut readers = Vec::new();
    for r in 0..2u64 {
        let (acked, done) = (acked.clone(), done.clone());
        readers.push(std::thread::spawn(move || {
            let mut s = connect(addr);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + r);
            let mut b = KvMessageBuilder::new();
            let mut n = 0u64;
            while !done.load(Ordering::SeqCst) {
                // A batch of GETs; each must be at least as new as the PUT acknowledged
                // before the batch was sent.
                b.clear();
                let mut want = Vec::new();
                for j in 0..rng.gen_range(1..6u64) {
                    let key = rng.gen_range(0..KEYS);
                    want.push((key, acked[key as usize].load(Ordering::SeqCst)));
                    b.get(key, n * 8 + j);
                }
                s.write_all(b.finish()).unwrap();
                for (j, (key, floor)) in want.into_iter().enumerate() {
                    let (st, id, v) = read_kv(&mut s);
                    assert_eq!(id, n * 8 + j as u64);
                    let seen = seq_of(key, st, &v);
                    assert!(
                        seen >= floor,
                        "key {key}: GET returned seq {seen} after seq {floor} was acknowledged"
                    );
                }
                n += 1;
            }
            n
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let batches: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let s = d.stats();
    assert!(batches > 50, "readers made progress ({batches})");
    assert!(s.offloaded > 100, "GETs were offloaded: {s:?}");
    assert!(s.invalidations >= 500, "{s:?}");
    assert_eq!(s.malformed, 0);
}
