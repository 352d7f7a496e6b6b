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
fn concurrent_reads_on_one_channel_are_matched_by_req_id() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let p = Arc::new(connect(
        &pair,
        ProxyOptions {
            channels: 1,
            max_dma: 128 << 10,
            ..Default::default()
        },
    ));
    // Objects of 1 byte to 3 chunks and more; every fourth name does not exist.
    let sizes = [1usize, 4000, 130_000, 400_000, 77];
    let objs: Vec<(ObjectId, Option<Vec<u8>>)> = (0..24u8)
        .map(|i| {
            let oid = ObjectId::new(1, format!("r{i}"));
            if i % 4 == 3 {
                return (oid, None);
            }
            let data: Vec<u8> = (0..sizes[i as usize % sizes.len()])
                .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i))
                .collect();
            let mut tx = Transaction::new();
            tx.push(TxOp::WriteFull {
                oid: oid.clone(),
                data: data.clone(),
            });
            p.submit(&tx).unwrap();
            (oid, Some(data))
        })
        .collect();
    let objs = Arc::new(objs);
    let hs: Vec<_> = (0..6usize)
        .map(|t| {
            let (p, objs) = (p.clone(), objs.clone());
            std::thread::spawn(move || {
                for k in 0..60 {
                    let (oid, want) = &objs[(t * 7 + k * 5) % objs.len()];
                    match (p.read(oid, 0, 1 << 20), want) {
                        (Ok(got), Some(w)) => assert_eq!(&got, w, "{oid:?}"),
                        (Err(StoreError::NotFound(_)), None) => {}
                        (r, w) => panic!(
                            "{oid:?}: {:?} for {:?}",
                            r.map(|v| v.len()),
                            w.as_ref().map(Vec::len)
                        ),
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let st = p.stats();
    assert!(st.reads_overlapped > 0, "{st:?}");
    assert_eq!(pair.host.stats().channel_errors, 0);
}

#[test]
fn malformed_transfer_closes_only_that_channel() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let good = connect(&pair, ProxyOptions::default());
    // A raw DPU: the documented handshake, then a batch whose lengths do not add up. It
    // never rings the doorbells; the host still looks at its channels every park timeout.
    let mut dpu = RawDpu::attach(
        &pair,
        Layout {
            channels: 2,
            max_dma: 64 << 10,
        },
    );
    // Channel 0: count 2 announced, one transaction's bytes.
    let mut payload = Vec::new();
    wire::put_u32(&mut payload, 2);
    wire::put_bytes(&mut payload, b"DDTX");
    dpu.send(
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
    dpu.send(
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
    while (dpu.state(0).0, dpu.state(1).0) != (1, 1) {
        assert!(std::time::Instant::now() < deadline, "channels not closed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(dpu.state(0).1, wire::REASON_BATCH);
    assert_eq!(dpu.state(1).1, wire::REASON_CHUNK);
    assert_eq!(pair.host.stats().channel_errors, 2);
    // A bad control frame ends only that session.
    wire::send_frame(&dpu.sock, 99, 1, &[], &[]).unwrap();
    let (status, _, _, _) = wire::recv_frame(&mut dpu.sock, wire::MAX_RESPONSE)
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

/// A batch payload of `txs` (`count | len | tx | …`).
fn batch_payload(txs: &[Transaction]) -> Vec<u8> {
    let mut p = Vec::new();
    wire::put_u32(&mut p, txs.len() as u32);
    for t in txs {
        wire::put_bytes(&mut p, &t.to_bytes());
    }
    p
}

/// Waits for the ACK of transfer `seq` and returns its statuses.
fn await_ack(dpu: &mut RawDpu, seq: u64, count: usize) -> Vec<u32> {
    let off = dpu.layout.ack_slot(seq);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let a = dpu.read(0, off, 64 + 4 * count);
        if wire::le64(&a) == seq {
            assert_eq!(wire::le32(&a[16..]) as usize, count);
            return (0..count).map(|i| wire::le32(&a[64 + 4 * i..])).collect();
        }
        assert!(std::time::Instant::now() < deadline, "no ACK for {seq}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_transaction_sent_again_under_a_new_transfer_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let mut dpu = RawDpu::attach(
        &pair,
        Layout {
            channels: 1,
            max_dma: 64 << 10,
        },
    );
    let (a, b) = (ObjectId::new(1, "a"), ObjectId::new(1, "b"));
    let tx = |op: TxOp| {
        let mut t = Transaction::new();
        t.push(op);
        t
    };
    let write = |o: &ObjectId, d: &[u8]| {
        tx(TxOp::WriteFull {
            oid: o.clone(),
            data: d.to_vec(),
        })
    };
    let remove = tx(TxOp::Remove { oid: a.clone() });
    let header = |seq, req_id, n: usize, p: &[u8]| TransferHeader {
        seq,
        kind: wire::KIND_BATCH,
        payload_len: p.len() as u32,
        req_id,
        a: n as u32,
        ..Default::default()
    };
    // Transfer 1: req 1 writes a, req 2 removes it, req 3 writes b.
    let p1 = batch_payload(&[write(&a, b"one"), remove.clone(), write(&b, b"b")]);
    dpu.send(0, header(1, 1, 3, &p1), &p1);
    assert_eq!(await_ack(&mut dpu, 1, 3), vec![0, 0, 0]);
    // Transfer 2 carries reqs 2 and 3 again, then req 4. Applied again, req 2's remove would
    // fail (a is gone); the host answers 2 and 3 from its results and applies only 4.
    let p2 = batch_payload(&[remove, write(&b, b"b"), write(&a, b"four")]);
    dpu.send(0, header(2, 2, 3, &p2), &p2);
    assert_eq!(await_ack(&mut dpu, 2, 3), vec![0, 0, 0]);
    let st = pair.host.stats();
    assert_eq!((st.txs_applied, st.txs_duplicate), (4, 2), "{st:?}");
    assert_eq!(pair.store.read(&a, 0, 16).unwrap(), b"four");
    assert_eq!(pair.store.read(&b, 0, 16).unwrap(), b"b");
    // A failed transaction sent again reports its first failure, without running again.
    let p3 = batch_payload(&[tx(TxOp::Remove {
        oid: ObjectId::new(1, "never"),
    })]);
    dpu.send(0, header(3, 5, 1, &p3), &p3);
    let first = await_ack(&mut dpu, 3, 1);
    assert_ne!(first, vec![0]);
    pair.store
        .submit(&write(&ObjectId::new(1, "never"), b"now it exists"))
        .unwrap();
    dpu.send(0, header(4, 5, 1, &p3), &p3);
    assert_eq!(await_ack(&mut dpu, 4, 1), first);
    assert!(pair.store.stat(&ObjectId::new(1, "never")).is_ok());
    assert_eq!(pair.host.stats().txs_duplicate, 3);
}
