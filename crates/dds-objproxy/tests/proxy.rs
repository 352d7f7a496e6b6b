//! The proxy against a direct store: random transactions, Flow-Adapt on and off, faults,
//! concurrency, bad input and a vanished host.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dds_dma::{DmaEngine, EmulatedDma};
use dds_objproxy::wire::{self, Layout, TransferHeader};
use dds_objproxy::{Faults, FaultyDma, ProxyOptions};
use dds_objstore::{ObjectId, ObjectStore, StoreError, Transaction, TxOp};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn size(rng: &mut SmallRng) -> usize {
    // Log-uniform in 1 KiB ..= 8 MiB.
    let e = rng.gen_range(10.0..=23.0f64);
    (2f64.powf(e) as usize).clamp(1024, 8 << 20)
}

fn random_tx(rng: &mut SmallRng, i: u64) -> Transaction {
    let mut tx = Transaction::new();
    let oid = ObjectId::new(1, format!("obj{}", rng.gen_range(0..5)));
    let fill = (i % 251) as u8;
    match rng.gen_range(0..8) {
        0..=2 => {
            tx.push(TxOp::WriteFull {
                oid: oid.clone(),
                data: vec![fill; size(rng)],
            });
        }
        3 => {
            tx.push(TxOp::Write {
                oid: oid.clone(),
                offset: rng.gen_range(0..(1 << 20)),
                data: vec![fill; size(rng)],
            });
        }
        4 => {
            tx.push(TxOp::Truncate {
                oid: oid.clone(),
                size: rng.gen_range(0..(1 << 20)),
            });
        }
        5 => {
            tx.push(TxOp::Remove { oid: oid.clone() });
        }
        _ => {
            let n = rng.gen_range(1..4);
            for k in 0..n {
                tx.push(TxOp::OmapSet {
                    oid: oid.clone(),
                    entries: vec![(format!("k{k}").into_bytes(), vec![fill; 100])],
                });
            }
        }
    }
    tx.push(TxOp::SetXattr {
        oid,
        name: b"tx".to_vec(),
        value: i.to_le_bytes().to_vec(),
    });
    tx
}

fn outcome(r: &Result<(), StoreError>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

fn run_model(opts: ProxyOptions, seed: u64, n: u64) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let direct = store(dir.path(), "direct");
    let pair = serve(dir.path(), "proxied");
    let proxy = connect(&pair, opts);
    let mut rng = SmallRng::seed_from_u64(seed);
    for i in 0..n {
        let tx = random_tx(&mut rng, i);
        let a = direct.submit(&tx);
        let b = proxy.submit(&tx);
        assert_eq!(outcome(&a), outcome(&b), "transaction {i}");
        if i % 5 == 4 {
            let oid = ObjectId::new(1, format!("obj{}", rng.gen_range(0..5)));
            let off = rng.gen_range(0..(2 << 20));
            let len = size(&mut rng) as u64;
            let a = direct.read(&oid, off, len).map_err(|e| e.to_string());
            let b = proxy.read(&oid, off, len).map_err(|e| e.to_string());
            assert_eq!(a, b, "read {i}");
        }
    }
    let d = dump(&*direct, 1);
    assert_eq!(d, dump(&proxy, 1));
    assert_eq!(
        direct.statfs().unwrap().objects,
        proxy.statfs().unwrap().objects
    );
    let st = proxy.stats();
    assert!(st.chunks > 0 && st.batches > 0, "{st:?}");
    d
}

#[test]
fn model_flow_adapt_on_and_off_give_identical_results() {
    let mut results = Vec::new();
    for (batching, chunking) in [(true, true), (false, false), (true, false), (false, true)] {
        let opts = ProxyOptions {
            batching,
            chunking,
            channels: 2,
            ..Default::default()
        };
        results.push(run_model(opts, 7, 40));
    }
    for r in &results[1..] {
        assert_eq!(r, &results[0]);
    }
}

#[test]
fn small_max_dma_many_chunks() {
    let opts = ProxyOptions {
        max_dma: 64 << 10,
        channels: 1,
        cost_model: None,
        ..Default::default()
    };
    run_model(opts, 11, 25);
}

#[test]
fn metadata_over_rpc_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = connect(&pair, ProxyOptions::default());
    let oid = ObjectId::new(3, "x");
    let mut tx = Transaction::new();
    tx.push(TxOp::WriteFull {
        oid: oid.clone(),
        data: b"hello".to_vec(),
    })
    .push(TxOp::SetXattr {
        oid: oid.clone(),
        name: b"a".to_vec(),
        value: b"1".to_vec(),
    })
    .push(TxOp::OmapSet {
        oid: oid.clone(),
        entries: vec![(b"k".to_vec(), b"v".to_vec())],
    });
    p.submit(&tx).unwrap();
    assert_eq!(p.stat(&oid).unwrap().size, 5);
    assert_eq!(p.getxattr(&oid, b"a").unwrap(), b"1");
    assert_eq!(
        p.omap_get(&oid, &[b"k".to_vec(), b"z".to_vec()]).unwrap(),
        vec![Some(b"v".to_vec()), None]
    );
    assert_eq!(p.list(3, None, 10).unwrap(), vec![b"x".to_vec()]);
    assert_eq!(p.read(&oid, 1, 100).unwrap(), b"ello");
    let missing = ObjectId::new(3, "nope");
    assert!(matches!(p.stat(&missing), Err(StoreError::NotFound(_))));
    assert!(matches!(
        p.read(&missing, 0, 1),
        Err(StoreError::NotFound(_))
    ));
    let mut bad = Transaction::new();
    bad.push(TxOp::Remove { oid: missing });
    assert!(matches!(p.submit(&bad), Err(StoreError::NotFound(_))));
    let mut big = Transaction::new();
    big.push(TxOp::SetXattr {
        oid: oid.clone(),
        name: b"a".to_vec(),
        value: vec![0; 1 << 20],
    });
    assert!(matches!(
        p.submit(&big),
        Err(StoreError::InvalidArgument(_))
    ));
    // The store behind it agrees; the proxy goes on working.
    assert_eq!(pair.store.stat(&oid).unwrap().size, 5);
    p.submit(&tx).unwrap();
}

#[test]
fn concurrency_8_threads() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = Arc::new(connect(
        &pair,
        ProxyOptions {
            channels: 3,
            ..Default::default()
        },
    ));
    let mut hs = Vec::new();
    for t in 0..8u64 {
        let p = p.clone();
        hs.push(std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(t);
            for i in 0..40u64 {
                let oid = ObjectId::new(2, format!("t{t}-{}", i % 4));
                let len = if i % 13 == 0 {
                    3 << 20
                } else {
                    rng.gen_range(1..70_000)
                };
                let data = vec![(t * 40 + i) as u8; len];
                let mut tx = Transaction::new();
                tx.push(TxOp::WriteFull {
                    oid: oid.clone(),
                    data: data.clone(),
                })
                .push(TxOp::OmapSet {
                    oid: ObjectId::new(2, format!("journal{t}")),
                    entries: vec![(i.to_be_bytes().to_vec(), vec![])],
                });
                p.submit(&tx).unwrap();
                assert_eq!(p.read(&oid, 0, len as u64).unwrap(), data);
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    for t in 0..8 {
        let j = ObjectId::new(2, format!("journal{t}"));
        assert_eq!(pair.store.omap_list(&j, None, 1000).unwrap().len(), 40);
    }
    let hs = pair.host.stats();
    assert_eq!(hs.txs_applied, 320);
    assert_eq!(hs.txs_duplicate, 0);
    let st = p.stats();
    assert!(
        st.batches < st.txs,
        "batching groups concurrent submitters: {st:?}"
    );
}

#[test]
fn faults_exactly_once_nothing_lost() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let seed = std::sync::atomic::AtomicU64::new(1);
    let factory: dds_objproxy::DmaFactory = Arc::new(move || {
        let s = seed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Box::new(FaultyDma::new(
            Box::new(EmulatedDma::new(64, None)),
            Faults {
                drop_write: 0.08,
                dup_write: 0.08,
                drop_read: 0.15,
                seed: s,
            },
        )) as Box<dyn DmaEngine>
    });
    let p = Arc::new(connect(
        &pair,
        ProxyOptions {
            channels: 2,
            max_dma: 256 << 10,
            dma: Some(factory),
            retransmit_after: Duration::from_millis(2),
            ..Default::default()
        },
    ));
    let mut hs = Vec::new();
    for t in 0..4u64 {
        let p = p.clone();
        hs.push(std::thread::spawn(move || {
            for i in 0..50u64 {
                let len = if i % 10 == 0 { 700_000 } else { 3000 };
                let oid = ObjectId::new(1, format!("o{t}-{i}"));
                let mut tx = Transaction::new();
                // The host counts applications: each must be applied exactly once.
                tx.push(TxOp::WriteFull {
                    oid: oid.clone(),
                    data: vec![i as u8; len],
                })
                .push(TxOp::OmapSet {
                    oid: ObjectId::new(1, "journal"),
                    entries: vec![(format!("{t}-{i}").into_bytes(), vec![])],
                });
                p.submit(&tx).unwrap();
                assert_eq!(p.read(&oid, 0, len as u64).unwrap(), vec![i as u8; len]);
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    let st = pair.host.stats();
    assert_eq!(st.txs_applied, 200, "{st:?}");
    let j = ObjectId::new(1, "journal");
    assert_eq!(pair.store.omap_list(&j, None, 1000).unwrap().len(), 200);
    assert!(p.stats().retransmits > 0, "{:?}", p.stats());
}

#[test]
fn malformed_transfer_closes_only_that_channel() {
    use std::os::unix::net::UnixStream;
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let good = connect(&pair, ProxyOptions::default());
    // A raw DPU: the documented handshake, then a batch whose lengths do not add up.
    let layout = Layout {
        channels: 2,
        max_dma: 64 << 10,
    };
    let mut s = UnixStream::connect(&pair.sock).unwrap();
    let mut args = Vec::new();
    wire::put_u32(&mut args, wire::VERSION);
    wire::put_u32(&mut args, layout.channels);
    wire::put_u32(&mut args, layout.max_dma);
    wire::send_frame(&s, wire::F_ATTACH, 9, &args, &[]).unwrap();
    let (status, id, _, mut fds) = wire::recv_frame(&mut s, wire::MAX_RESPONSE)
        .unwrap()
        .unwrap();
    assert_eq!((status, id), (0, 9));
    // The region and one doorbell per channel; this DPU never rings them (the host still
    // looks at its channels every park timeout).
    assert_eq!(fds.len(), 1 + layout.channels as usize);
    let mut eng = EmulatedDma::new(16, None);
    let region = eng
        .register_region(dds_dma::RegionExport::memfd(
            fds.remove(0),
            layout.region_len(),
        ))
        .unwrap();
    let buf = dds_dma::LocalBuf::new(256, 64);
    let send = |eng: &mut EmulatedDma, chan: u32, h: TransferHeader, payload: &[u8]| {
        let b = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), 256) };
        h.encode(b);
        b[64..64 + payload.len()].copy_from_slice(payload);
        let end = 64 + wire::align8(payload.len() as u64) as usize;
        b[end..end + 8].copy_from_slice(&h.seq.to_le_bytes());
        let op = dds_dma::DmaOp::write(
            region.id,
            layout.channel(chan) + layout.req_slot(h.seq),
            buf.as_ptr(),
            (end + 8) as u32,
            1,
        );
        unsafe { dds_dma::run_sync(eng, &[op]).unwrap() };
    };
    let state = |eng: &mut EmulatedDma, chan: u32| -> (u64, u64) {
        let r = dds_dma::LocalBuf::new(64, 64);
        let op = dds_dma::DmaOp::read(region.id, layout.channel(chan), r.as_mut_ptr(), 64, 2);
        unsafe { dds_dma::run_sync(eng, &[op]).unwrap() };
        (
            wire::le64(&r.as_slice()[8..]),
            wire::le64(&r.as_slice()[16..]),
        )
    };
    // Channel 0: count 2 announced, one transaction's bytes.
    let mut payload = Vec::new();
    wire::put_u32(&mut payload, 2);
    wire::put_bytes(&mut payload, b"DDTX");
    send(
        &mut eng,
        0,
        TransferHeader {
            seq: 1,
            kind: wire::KIND_BATCH,
            payload_len: payload.len() as u32,
            req_id: 1,
            a: 2,
            ..Default::default()
        },
        &payload,
    );
    // Channel 1: a chunk that is not a first chunk.
    send(
        &mut eng,
        1,
        TransferHeader {
            seq: 1,
            kind: wire::KIND_CHUNK,
            payload_len: 8,
            req_id: 1,
            a: 1,
            b: 2,
            offset: 8,
            tx_len: 16,
        },
        &[0; 8],
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while (state(&mut eng, 0).0, state(&mut eng, 1).0) != (1, 1) {
        assert!(std::time::Instant::now() < deadline, "channels not closed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(state(&mut eng, 0).1, wire::REASON_BATCH);
    assert_eq!(state(&mut eng, 1).1, wire::REASON_CHUNK);
    assert_eq!(pair.host.stats().channel_errors, 2);
    // A bad control frame ends only that session.
    wire::send_frame(&s, 99, 1, &[], &[]).unwrap();
    let (status, _, _, _) = wire::recv_frame(&mut s, wire::MAX_RESPONSE)
        .unwrap()
        .unwrap();
    assert_eq!(status, 1);
    // The other session is unaffected.
    let oid = ObjectId::new(1, "still");
    let mut tx = Transaction::new();
    tx.push(TxOp::WriteFull {
        oid: oid.clone(),
        data: vec![5; 10_000],
    });
    good.submit(&tx).unwrap();
    assert_eq!(good.read(&oid, 0, 10).unwrap(), vec![5; 10]);
}

#[test]
fn host_gone_fails_calls_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = connect(&pair, ProxyOptions::default());
    let oid = ObjectId::new(1, "a");
    let mut tx = Transaction::new();
    tx.push(TxOp::Touch { oid: oid.clone() });
    p.submit(&tx).unwrap();
    pair.host.stop();
    let e = p.submit(&tx).unwrap_err().to_string();
    assert!(e.contains("host gone"), "{e}");
    assert!(p
        .read(&oid, 0, 1)
        .unwrap_err()
        .to_string()
        .contains("host gone"));
    assert!(p.stat(&oid).unwrap_err().to_string().contains("host gone"));
}

/// CPU seconds of this process's threads whose name starts with `prefix`.
fn threads_cpu(prefix: &str) -> f64 {
    let tick = 100.0; // USER_HZ
    let mut total = 0.0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        total += (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / tick;
    }
    total
}

#[test]
fn idle_host_workers_park_and_the_dpu_wakes_them() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = connect(&pair, ProxyOptions::default());
    let oid = ObjectId::new(1, "bell");
    let write = |i: u8| {
        let mut tx = Transaction::new();
        tx.push(TxOp::WriteFull {
            oid: oid.clone(),
            data: vec![i; 4096],
        });
        let t = std::time::Instant::now();
        p.submit(&tx).unwrap();
        t.elapsed()
    };
    write(0);
    // Idle: the four channel workers of the session park and cost (next to) nothing.
    std::thread::sleep(Duration::from_millis(200));
    let parks = pair.host.stats().parks;
    let cpu0 = threads_cpu("objproxy-ch");
    std::thread::sleep(Duration::from_secs(2));
    let idle_cpu = threads_cpu("objproxy-ch") - cpu0;
    assert!(
        idle_cpu < 0.1,
        "parked workers used {idle_cpu:.3} s of CPU in 2 s"
    );
    // Timeouts only: about 4 workers × 2 s / 100 ms.
    let timeouts = pair.host.stats().parks - parks;
    assert!(
        (40..=200).contains(&timeouts),
        "{timeouts} parks while idle"
    );
    // Each write after a pause finds its worker parked; the DPU's doorbell wakes it long
    // before the park timeout (100 ms).
    let rung = pair.host.stats().rung;
    let mut lat = Vec::new();
    for i in 1..=20u8 {
        std::thread::sleep(Duration::from_millis(3));
        lat.push(write(i));
    }
    lat.sort();
    let rung = pair.host.stats().rung - rung;
    assert!(rung >= 10, "only {rung} of 20 writes rang a doorbell");
    assert!(
        lat[10] < Duration::from_millis(50),
        "median write after a pause {:?}",
        lat[10]
    );
    assert!(p.stats().doorbells >= rung);
    assert_eq!(p.read(&oid, 0, 4).unwrap(), vec![20; 4]);
}
