//! A DPU process (this test binary re-executed) killed with SIGKILL in the middle of chunked
//! transactions: the host store holds every acknowledged transaction and nothing half-applied.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use dds_objproxy::ProxyOptions;
use dds_objstore::{ObjectId, ObjectStore, Transaction, TxOp};

const BIG: usize = 6 << 20;

#[test]
fn dpu_child() {
    let Ok(sock) = std::env::var("OBJPROXY_KILL_SOCK") else {
        return;
    };
    let round: u64 = std::env::var("OBJPROXY_KILL_ROUND")
        .unwrap()
        .parse()
        .unwrap();
    let p = dds_objproxy::ProxyObjectStore::connect(
        std::path::Path::new(&sock),
        ProxyOptions {
            channels: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = std::io::stdout();
    for i in 0u64.. {
        let k = round * 1_000_000 + i;
        let oid = ObjectId::new(1, format!("big{}", i % 3));
        let mut tx = Transaction::new();
        tx.push(TxOp::WriteFull {
            oid: oid.clone(),
            data: vec![(k % 251) as u8; BIG],
        })
        .push(TxOp::SetXattr {
            oid,
            name: b"k".to_vec(),
            value: k.to_le_bytes().to_vec(),
        })
        .push(TxOp::OmapSet {
            oid: ObjectId::new(1, "journal"),
            entries: vec![(k.to_be_bytes().to_vec(), vec![])],
        });
        p.submit(&tx).unwrap();
        writeln!(out, "ACK {k}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn sigkill_dpu_mid_chunked_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let pair = serve(dir.path(), "s");
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<u64> = Vec::new();
    for round in 0..4u64 {
        let mut child = Command::new(&exe)
            .args(["--exact", "dpu_child", "--nocapture", "--test-threads=1"])
            .env("OBJPROXY_KILL_SOCK", &pair.sock)
            .env("OBJPROXY_KILL_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let l2 = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(k) = line.strip_prefix("ACK ") {
                    l2.lock().unwrap().push(k.parse::<u64>().unwrap());
                }
            }
        });
        // Let a few transactions through, then kill at a moment that varies by round.
        let t0 = Instant::now();
        while lines.lock().unwrap().len() < 2 && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(7 + 13 * round));
        let _ = Command::new("kill")
            .args(["-9", &child.id().to_string()])
            .status();
        let _ = child.wait();
        reader.join().unwrap();
        acked.extend(lines.lock().unwrap().iter());
        let t0 = Instant::now();
        while pair.host.live_sessions() > 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "session not ended");
            std::thread::sleep(Duration::from_millis(5));
        }
        check(&*pair.store, &acked);
    }
    let st = pair.host.stats();
    eprintln!("host after 4 kills: {st:?}, {} acknowledged", acked.len());
    assert!(acked.len() >= 8);
    assert!(
        st.chunks > st.txs_applied,
        "transactions went in chunks: {st:?}"
    );
}

fn check(s: &dyn ObjectStore, acked: &[u64]) {
    // Objects first, the journal after: a transaction that arrived whole may still be
    // committing, and what an object shows must be in a journal read later.
    let mut seen = Vec::new();
    for i in 0..3 {
        let oid = ObjectId::new(1, format!("big{i}"));
        let Ok(st) = s.stat(&oid) else { continue };
        let data = s.read(&oid, 0, st.size).unwrap();
        let k = u64::from_le_bytes(s.getxattr(&oid, b"k").unwrap().try_into().unwrap());
        let st2 = s.stat(&oid).unwrap();
        if st2 != st {
            continue; // overwritten meanwhile by a committing transaction
        }
        assert_eq!(st.size, BIG as u64);
        assert!(
            data.iter().all(|&b| b == (k % 251) as u8),
            "torn object big{i}"
        );
        seen.push(k);
    }
    let journal = ObjectId::new(1, "journal");
    let keys: Vec<u64> = s
        .omap_list(&journal, None, 1 << 20)
        .unwrap()
        .into_iter()
        .map(|(k, _)| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    for k in acked {
        assert!(keys.contains(k), "acknowledged transaction {k} missing");
    }
    for k in seen {
        assert!(
            keys.contains(&k),
            "object of an unjournaled transaction {k}"
        );
    }
}
