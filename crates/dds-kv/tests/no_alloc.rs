//! The request path of `dds kv` allocates nothing in steady state: after a warm-up, GET, SET
//! (with an expiry too), PEXPIRE, MGET, INCR, EXISTS, GETRANGE, SETRANGE, SETBIT, GETBIT,
//! BITCOUNT, BITPOS, SCAN, KEYS, RANDOMKEY, HSET, HGET, HMGET, SADD, SISMEMBER, ZADD, ZSCORE,
//! ZRANK, ZCOUNT, ZRANGE, ZRANGEBYSCORE, the list commands of a queue (LPUSH, RPUSH, LPOP,
//! RPOP with and without a count, LRANGE, LINDEX, LLEN, LSET, LPOS) and a BLPOP that finds
//! an element, and pipelines of them over a real socket do not
//! touch the heap on the server's thread (a counting global allocator counts that thread's allocations only).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dds_kv::server::{Server, ServerConfig};
use dds_kv::{Durability, Store, StoreConfig};
use dds_storage::OsStorage;
use dds_testkit::alloc::{allocations_in, count_this_thread, CountingAlloc};
use dds_testkit::resp::command as cmd;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Sends `batch` and reads until `replies` whole replies arrived.
fn round_trip(s: &mut TcpStream, batch: &[u8], replies: usize) {
    s.write_all(batch).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    // Read until `replies` whole replies have arrived.
    let mut frames = 0;
    while frames < replies {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "server closed");
        got.extend_from_slice(&buf[..n]);
        frames = count_frames(&got);
    }
}

/// Whole top-level replies at the start of `b`.
fn count_frames(b: &[u8]) -> usize {
    let (mut at, mut n) = (0, 0);
    while let Ok(Some(len)) = dds_resp::frame_reply(&b[at..], 1 << 20, 1 << 30) {
        at += len;
        n += 1;
    }
    n
}

#[test]
fn steady_state_requests_allocate_nothing_on_the_server_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        Box::new(OsStorage::new(dir.path()).unwrap()),
        StoreConfig {
            page_size: 1 << 20,
            memory: 8 << 20,
            log_size: 64 << 20,
            max_key: 64,
            max_value: 4096,
            durability: Durability::None,
            offload: false,
        },
    )
    .unwrap();
    let server = Server::bind(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ServerConfig::default()
        },
        Box::new(store),
        "files".into(),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let t = std::thread::spawn(move || {
        count_this_thread(true);
        server.run(&s2).unwrap();
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let keys: Vec<Vec<u8>> = (0..64).map(|i| format!("key{i}").into_bytes()).collect();
    let mut batch = Vec::new();
    let mut n = 0;
    for k in &keys {
        batch.extend(cmd(&[b"SET", k, &[b'v'; 100]]));
        batch.extend(cmd(&[b"GET", k]));
        batch.extend(cmd(&[b"EXISTS", k, b"nope"]));
        n += 3;
    }
    batch.extend(cmd(&[b"SET", b"counter", b"1"]));
    // A key with an expiry: its place in the expiry set is updated, not made anew.
    batch.extend(cmd(&[b"SET", b"timed", b"v", b"EX", b"1000"]));
    batch.extend(cmd(&[b"PEXPIRE", b"timed", b"2000000"]));
    // Listing keys: a SCAN step, a whole KEYS, RANDOMKEY.
    batch.extend(cmd(&[b"SCAN", b"0", b"MATCH", b"key1*", b"COUNT", b"20"]));
    batch.extend(cmd(&[b"KEYS", b"key?"]));
    batch.extend(cmd(&[b"RANDOMKEY"]));
    batch.extend(cmd(&[b"INCR", b"counter"]));
    batch.extend(cmd(&[b"INCRBY", b"counter", b"-7"]));
    batch.extend(cmd(&[b"GETRANGE", b"key1", b"10", b"-20"]));
    batch.extend(cmd(&[b"SETRANGE", b"key2", b"50", b"patch"]));
    batch.extend(cmd(&[b"SETBIT", b"key3", b"9", b"1"]));
    batch.extend(cmd(&[b"GETBIT", b"key3", b"9"]));
    batch.extend(cmd(&[b"BITCOUNT", b"key4", b"1", b"-2"]));
    batch.extend(cmd(&[b"BITPOS", b"key4", b"0", b"2"]));
    n += 5;
    let refs: Vec<&[u8]> = std::iter::once(&b"MGET"[..])
        .chain(keys.iter().take(10).map(|k| &k[..]))
        .collect();
    batch.extend(cmd(&refs));
    n += 10;
    // Collections: fields, members and scores written over themselves, and read.
    for c in [
        &[&b"HSET"[..], b"h", b"f", b"value"][..],
        &[b"HGET", b"h", b"f"],
        &[b"HMGET", b"h", b"f", b"nope"],
        &[b"HEXISTS", b"h", b"f"],
        &[b"HLEN", b"h"],
        &[b"SADD", b"s", b"m"],
        &[b"SISMEMBER", b"s", b"m"],
        &[b"SCARD", b"s"],
        &[b"ZADD", b"z", b"1.5", b"m"],
        &[b"ZADD", b"z", b"2", b"n"],
        &[b"ZSCORE", b"z", b"m"],
        &[b"ZRANK", b"z", b"n"],
        &[b"ZCOUNT", b"z", b"(1", b"+inf"],
        &[b"ZRANGE", b"z", b"0", b"-1", b"WITHSCORES"],
        &[b"ZRANGEBYSCORE", b"z", b"-inf", b"2", b"LIMIT", b"0", b"1"],
        // A queue whose elements move along its positions (it keeps one element between
        // rounds): each round pushes four and pops four, at new positions every time.
        &[b"LPUSH", b"q", b"a", b"b"],
        &[b"RPUSH", b"q", b"c"],
        &[b"LRANGE", b"q", b"0", b"-1"],
        &[b"LINDEX", b"q", b"-1"],
        &[b"LLEN", b"q"],
        &[b"LSET", b"q", b"0", b"z"],
        &[b"LPOS", b"q", b"c"],
        &[b"RPOP", b"q"],
        &[b"LPOP", b"q", b"1"],
        &[b"BLPOP", b"q", b"1"],
        &[b"RPUSH", b"q", b"d"],
        &[b"RPOP", b"q", b"1"],
    ] {
        batch.extend(cmd(c));
        n += 1;
    }
    round_trip(&mut s, &cmd(&[b"RPUSH", b"q", b"floor"]), 1);
    // Warm-up: buffers, the index and the reply buffer reach their sizes. The first round
    // allocates (new keys): the counter does see the server's thread.
    assert!(
        allocations_in(|| round_trip(&mut s, &batch, n)) > 0,
        "the first round allocated nothing?"
    );
    for _ in 0..5 {
        round_trip(&mut s, &batch, n);
    }
    let allocs = allocations_in(|| {
        for _ in 0..50 {
            round_trip(&mut s, &batch, n);
        }
    });
    stop.store(true, Ordering::Relaxed);
    drop(s);
    t.join().unwrap();
    assert_eq!(
        allocs, 0,
        "allocations on the server thread in steady state"
    );
}
