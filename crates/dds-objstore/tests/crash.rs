//! kill -9: a child process commits transactions and prints each acknowledged id; the parent
//! kills it with SIGKILL at random times, reopens the store and checks that every acknowledged
//! transaction is fully visible and none is half-applied.

mod common;

use common::pattern;
use dds_objstore::{ObjStore, ObjectId, ObjectStore, Transaction, TxOp};
use rand::Rng;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "DDS_OBJSTORE_CRASH_DEVICE";
const START_ENV: &str = "DDS_OBJSTORE_CRASH_START";
const OBJECTS: u64 = 4;
const THREADS: u64 = 2;

fn obj(id: u64) -> ObjectId {
    ObjectId::new(7, format!("obj{}", id % OBJECTS))
}

fn journal() -> ObjectId {
    ObjectId::new(7, "journal")
}

/// The data object `obj(id)` holds after transaction `id`.
fn expected(id: u64) -> Vec<u8> {
    let len = if id.is_multiple_of(10) {
        1 << 20
    } else {
        4096 * (1 + id % 20) as usize + (id as usize * 7) % 4096
    };
    let mut d = pattern(len, id as u8);
    let at = (id % 3) as usize * 1000;
    d[at..at + 100].fill(0xA5 ^ id as u8);
    d
}

fn transaction(id: u64) -> Transaction {
    let full = expected(id);
    let at = (id % 3) as usize * 1000;
    let mut first = full.clone();
    first[at..at + 100].copy_from_slice(&pattern(full.len(), id as u8)[at..at + 100]);
    let tag = id.to_le_bytes().to_vec();
    Transaction {
        ops: vec![
            TxOp::WriteFull {
                oid: obj(id),
                data: first,
            },
            // A partial overwrite of the new data in the same transaction.
            TxOp::Write {
                oid: obj(id),
                offset: at as u64,
                data: full[at..at + 100].to_vec(),
            },
            TxOp::SetXattr {
                oid: obj(id),
                name: b"txid".to_vec(),
                value: tag.clone(),
            },
            TxOp::OmapSet {
                oid: obj(id),
                entries: vec![(b"txid".to_vec(), tag.clone())],
            },
            TxOp::OmapSet {
                oid: journal(),
                entries: vec![(id.to_be_bytes().to_vec(), tag)],
            },
        ],
    }
}

/// The child: runs only when re-executed by `kill_9_keeps_acknowledged_transactions`.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let start: u64 = std::env::var(START_ENV).unwrap().parse().unwrap();
    let store = Arc::new(ObjStore::open(&path).unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut id = start + t;
                while Instant::now() < deadline {
                    store.submit(&transaction(id)).unwrap();
                    println!("ACK {id}");
                    id += THREADS;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn u64_of(v: &[u8]) -> u64 {
    u64::from_le_bytes(v.try_into().unwrap())
}

#[test]
fn kill_9_keeps_acknowledged_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev");
    ObjStore::format(&path, 64 << 20, false).unwrap();
    let mut rng = rand::thread_rng();
    let mut next = 0u64;
    let mut total_acked = 0usize;
    for round in 0..6 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .env(START_ENV, next.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let acked = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if let Some(id) = line.strip_prefix("ACK ") {
                        acked
                            .lock()
                            .unwrap()
                            .push(id.trim().parse::<u64>().unwrap());
                    }
                }
            })
        };
        // Let it commit a little, then kill it at a random moment.
        let t0 = Instant::now();
        while acked.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(20..700)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let acked = acked.lock().unwrap().clone();
        assert!(
            !acked.is_empty(),
            "round {round}: the child acknowledged nothing"
        );
        total_acked += acked.len();

        let store = ObjStore::open(&path).unwrap();
        store.fsck(true).unwrap();
        let committed: Vec<u64> = store
            .omap_list(&journal(), None, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                let id = u64::from_be_bytes(k.try_into().unwrap());
                assert_eq!(u64_of(&v), id);
                id
            })
            .collect();
        for id in &acked {
            assert!(
                committed.binary_search(id).is_ok(),
                "round {round}: acknowledged tx {id} is lost"
            );
        }
        for k in 0..OBJECTS {
            let o = obj(k);
            let Ok(x) = store.getxattr(&o, b"txid") else {
                assert!(acked.iter().all(|id| id % OBJECTS != k));
                continue;
            };
            let id = u64_of(&x);
            // The object is exactly the state after one committed transaction...
            assert!(committed.binary_search(&id).is_ok(), "tx {id} half-applied");
            let om = store.omap_get(&o, &[b"txid".to_vec()]).unwrap();
            assert_eq!(
                om,
                vec![Some(id.to_le_bytes().to_vec())],
                "tx {id} half-applied"
            );
            assert_eq!(
                store.read(&o, 0, u64::MAX).unwrap(),
                expected(id),
                "tx {id}"
            );
            // ... and not older than the last acknowledged one.
            let last_acked = acked.iter().filter(|i| *i % OBJECTS == k).max();
            assert!(last_acked.is_none_or(|a| id >= *a), "object {k} went back");
        }
        next = committed.last().map_or(0, |m| m + 1);
        eprintln!(
            "round {round}: {} acknowledged, {} committed in all",
            acked.len(),
            committed.len()
        );
    }
    assert!(total_acked >= 6);
}
