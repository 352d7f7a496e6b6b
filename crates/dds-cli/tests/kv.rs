//! `dds kv` end to end with real clients: `redis-cli` (replies held against a real
//! `redis-server`), `redis-benchmark`, the PyPI `redis` client, the DPU serving GETs through
//! the traffic director, kill -9 recovery, and hostile clients.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{format_device, free_port, offloaded, start_dpu, Guard};
use dds_testkit::resp::{bulks, command as cmd};

/// `dds kv ARGS --listen 127.0.0.1:0`; returns the process and its address.
fn start_kv(args: &[&str]) -> (Guard, SocketAddr) {
    start_kv_on("127.0.0.1:0", args)
}

fn start_kv_on(listen: &str, args: &[&str]) -> (Guard, SocketAddr) {
    common::start_kv(listen, args)
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools) is installed by scripts/test.sh");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Reads one reply (as framed by the codec) from a blocking stream.
fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(n) = dds_resp::frame_reply(buf, 1 << 20, 1 << 30).expect("a RESP reply") {
            return buf.drain(..n).collect();
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).unwrap();
        assert!(
            n > 0,
            "connection closed; got {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn start_redis_server(dir: &Path) -> (Guard, u16) {
    let rport = free_port();
    let g = Guard(
        Command::new("redis-server")
            .args([
                "--port",
                &rport.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed by scripts/test.sh"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cli(rport, &["ping"]).trim() != "PONG" {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (g, rport)
}

/// Runs the same redis-cli script against redis-server and `dds kv`; the outputs must match.
fn replies_match_redis_server(rport: u16, port: u16) {
    let script: &[&[&str]] = &[
        &["ping"],
        &["ping", "hello"],
        &["echo", "x y"],
        &["set", "k", "v"],
        &["get", "k"],
        &["get", "missing"],
        &["get"],
        &["get", "a", "b"],
        &["set", "k"],
        &["set", "k", "v", "nx"],
        &["set", "k", "w", "xx"],
        &["set", "k2", "w", "xx"],
        &["set", "k", "v", "ex", "0"],
        &["set", "k", "v", "ex", "x"],
        &["set", "k", "v", "bogus"],
        &["set", "k", "v", "nx", "xx"],
        &["set", "k", "v3", "get"],
        &["setnx", "k", "z"],
        &["incr", "k"],
        &["incr", "n"],
        &["incrby", "n", "10"],
        &["incrby", "n", "x"],
        &["decr", "n"],
        &["decrby", "n", "5"],
        &["set", "big", "9223372036854775807"],
        &["incr", "big"],
        &["append", "k", "tail"],
        &["strlen", "k"],
        &["strlen", "missing"],
        &["getset", "k", "new"],
        &["getdel", "k"],
        &["getdel", "k"],
        &["mset", "a", "1", "b", "2"],
        &["mset", "a", "1", "b"],
        &["mget", "a", "b", "c"],
        &["msetnx", "a", "9", "z", "9"],
        &["exists", "a", "b", "c", "a"],
        &["del", "a", "c"],
        &["dbsize"],
        &["select", "0"],
        &["select", "x"],
        &["client", "setname", "me"],
        &["client", "getname"],
        &["client", "setname", "a b"],
        &["client", "bogus"],
        &["nosuchcommand", "arg1", "arg2"],
        &["nosuchcommand"],
        &["auth", "pw"],
        &["flushdb"],
        &["dbsize"],
        &["get", "b"],
    ];
    for c in script {
        let want = redis_cli(rport, c);
        let got = redis_cli(port, c);
        assert_eq!(got, want, "reply to {c:?}");
    }
    // One database (Redis has 16).
    assert_eq!(
        redis_cli(port, &["select", "1"]).trim(),
        "ERR DB index is out of range"
    );
}

#[test]
fn redis_cli_replies_match_redis_server() {
    let dir = tempfile::tempdir().unwrap();
    let (_redis, rport) = start_redis_server(dir.path());
    let kvdir = dir.path().join("kv");
    let (_kv, addr) = start_kv(&["--storage", "file", "--dir", kvdir.to_str().unwrap()]);
    replies_match_redis_server(rport, addr.port());
}

#[test]
fn the_memory_engine_passes_the_same_suites() {
    let dir = tempfile::tempdir().unwrap();
    let (_redis, rport) = start_redis_server(dir.path());
    let (_kv, addr) = start_kv(&["--engine", "memory", "--memory", "64M"]);
    replies_match_redis_server(rport, addr.port());
    python_suite(addr.port());
    // A full memory budget is a clear error, and nothing stored is lost.
    let (_small, small) = start_kv(&[
        "--engine",
        "memory",
        "--memory",
        "256K",
        "--partitions",
        "1",
    ]);
    let mut s = TcpStream::connect(small).unwrap();
    let mut b = Vec::new();
    let mut stored = 0u32;
    loop {
        let k = format!("k{stored}");
        s.write_all(&cmd(&[b"SET", k.as_bytes(), &[b'v'; 500]]))
            .unwrap();
        let r = read_reply(&mut s, &mut b);
        if r != b"+OK\r\n" {
            assert!(r.starts_with(b"-OOM"), "{}", String::from_utf8_lossy(&r));
            break;
        }
        stored += 1;
        assert!(stored < 10_000, "the memory budget never filled");
    }
    assert!(stored > 100);
    for i in 0..stored {
        s.write_all(&cmd(&[b"STRLEN", format!("k{i}").as_bytes()]))
            .unwrap();
        assert_eq!(read_reply(&mut s, &mut b), b":500\r\n", "k{i}");
    }
}

#[test]
fn redis_benchmark_and_the_python_client_over_dds() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "512M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    // Little memory: most records are on storage and read through the host library.
    let (_kv, addr) = start_kv(&[
        "--socket",
        socket.to_str().unwrap(),
        "--memory",
        "192K",
        "--page-size",
        "64K",
        "--log-size",
        "64M",
    ]);
    let p = addr.port().to_string();
    let n = 10_000u64;
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &p,
            "-t",
            "set,get,incr,mset",
            "-r",
            "1000",
            "-c",
            "20",
            "-q",
        ])
        .args(["-n", &n.to_string()])
        .output()
        .expect("redis-benchmark (package redis-tools) is installed by scripts/test.sh");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for t in ["SET:", "GET:", "INCR:", "MSET (10 keys):"] {
        assert!(text.contains(t), "no {t} result in {text}");
    }
    assert!(!text.contains("ERR"), "{text}");
    // Every INCR landed exactly once, every SET/MSET value reads back.
    let mut s = TcpStream::connect(addr).unwrap();
    let mut buf = Vec::new();
    let mut sum = 0u64;
    let mut values = 0;
    let mut seen: Option<Vec<u8>> = None;
    for i in 0..1000 {
        let key = format!("counter:{i:012}");
        s.write_all(&cmd(&[b"GET", key.as_bytes()])).unwrap();
        let r = read_reply(&mut s, &mut buf);
        if r != b"$-1\r\n" {
            let t = String::from_utf8(r).unwrap();
            sum += t.lines().nth(1).unwrap().parse::<u64>().unwrap();
        }
        let key = format!("key:{i:012}");
        s.write_all(&cmd(&[b"GET", key.as_bytes()])).unwrap();
        let r = read_reply(&mut s, &mut buf);
        if r != b"$-1\r\n" {
            // SET writes one random 200-byte value everywhere, MSET the 3 bytes "VXK".
            if r.starts_with(b"$200\r\n") {
                let first = seen.get_or_insert_with(|| r.clone());
                assert_eq!(&r, first);
            } else {
                assert_eq!(r, b"$3\r\nVXK\r\n");
            }
            values += 1;
        }
    }
    assert_eq!(sum, n, "INCR count");
    assert!(values > 900, "{values} keys of 1000 were set");
    // 1 MB of values through 192 KiB of log memory: most reads come from storage.
    let mut batch = Vec::new();
    for i in 0..2000 {
        let v = format!("{i:0500}");
        batch.extend(cmd(&[b"SET", format!("big{i}").as_bytes(), v.as_bytes()]));
    }
    s.write_all(&batch).unwrap();
    for _ in 0..2000 {
        assert_eq!(read_reply(&mut s, &mut buf), b"+OK\r\n");
    }
    for i in 0..2000 {
        s.write_all(&cmd(&[b"GET", format!("big{i}").as_bytes()]))
            .unwrap();
        let want = format!("$500\r\n{i:0500}\r\n");
        assert_eq!(read_reply(&mut s, &mut buf), want.as_bytes());
    }
    let info = redis_cli(addr.port(), &["info"]);
    let storage_reads: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("storage_reads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        storage_reads > 1000,
        "records were read from storage: {info}"
    );

    python_suite(addr.port());
}

/// A DPU with the `redis` offload app and `dds kv` behind its director, with a small memory
/// budget (most records on storage, where the DPU serves their GETs) and fsync durability:
/// the processes, the DPU's socket, and a connection through the director and one straight
/// to the host.
fn offloaded_kv(dir: &Path) -> (Guard, Guard, std::path::PathBuf, TcpStream, TcpStream) {
    offloaded_kv_with(dir, &[])
}

/// [`offloaded_kv`] with `extra` flags of `dds dpu`.
fn offloaded_kv_with(
    dir: &Path,
    extra: &[&str],
) -> (Guard, Guard, std::path::PathBuf, TcpStream, TcpStream) {
    offloaded_kv_env(dir, extra, &[])
}

/// [`offloaded_kv_with`] with `envs` in the DPU's environment.
fn offloaded_kv_env(
    dir: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (Guard, Guard, std::path::PathBuf, TcpStream, TcpStream) {
    let (dpu, socket, via_dpu) = common::start_offload_dpu_env(dir, "512M", "redis", extra, envs);
    let (kv, direct) = start_kv_on(
        "127.0.0.1:0",
        &[
            "--socket",
            socket.to_str().unwrap(),
            "--memory",
            "256K",
            "--page-size",
            "64K",
            "--log-size",
            "64M",
            "--durability",
            "fsync",
        ],
    );
    let d = TcpStream::connect(via_dpu).unwrap();
    let h = TcpStream::connect(direct).unwrap();
    (dpu, kv, socket, d, h)
}

#[test]
fn the_dpu_serves_gets_of_records_on_storage_and_never_a_stale_one() {
    dpu_served_gets_are_never_stale(&[], &[]);
}

/// The same with the director on a thread of its own (`--director-threads 1`).
#[test]
fn the_dpu_serves_gets_with_a_director_thread_and_never_a_stale_one() {
    dpu_served_gets_are_never_stale(&["--director-threads", "1"], &[]);
}

/// The same with the director on the file-service thread, its connections on `epoll` (where
/// io_uring is missing).
#[test]
fn the_dpu_serves_gets_with_the_director_on_epoll_and_never_a_stale_one() {
    dpu_served_gets_are_never_stale(&[], &[("DDS_SERVER_BACKEND", "epoll")]);
}

/// GETs read back at once and pipelined through the DPU after writes through the director
/// and straight to the host, split MGETs, and the DPU's CPU per GET, with `extra` flags of
/// `dds dpu` and `envs` in its environment.
fn dpu_served_gets_are_never_stale(extra: &[&str], envs: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _kv, socket, mut d, mut h) = offloaded_kv_env(dir.path(), extra, envs);
    let (mut db, mut hb) = (Vec::new(), Vec::new());
    let keys = 400;
    for round in 0..3u32 {
        // Round 0 writes through the director, round 1 straight to the host (the host must
        // drop what the DPU cached), round 2 through the director again.
        for i in 0..keys {
            let v = format!("value-{round}-{i}-{}", "x".repeat(i % 50));
            let k = format!("key{i}");
            let (s, b) = if round == 1 {
                (&mut h, &mut hb)
            } else {
                (&mut d, &mut db)
            };
            s.write_all(&cmd(&[b"SET", k.as_bytes(), v.as_bytes()]))
                .unwrap();
            assert_eq!(read_reply(s, b), b"+OK\r\n");
            // Read back at once, through the DPU: never the previous value.
            d.write_all(&cmd(&[b"GET", k.as_bytes()])).unwrap();
            let want = format!("${}\r\n{v}\r\n", v.len());
            assert_eq!(read_reply(&mut d, &mut db), want.as_bytes(), "{k}");
        }
        // Everything again, pipelined, through the DPU.
        let mut batch = Vec::new();
        for i in 0..keys {
            batch.extend(cmd(&[b"GET", format!("key{i}").as_bytes()]));
        }
        d.write_all(&batch).unwrap();
        for i in 0..keys {
            let v = format!("value-{round}-{i}-{}", "x".repeat(i % 50));
            let want = format!("${}\r\n{v}\r\n", v.len());
            assert_eq!(
                read_reply(&mut d, &mut db),
                want.as_bytes(),
                "round {round} key{i}"
            );
        }
    }
    // MGETs split between the DPU (cached keys) and the host (the missing key), in order.
    let mut want = format!("*{}\r\n", 12).into_bytes();
    let mut words: Vec<Vec<u8>> = vec![b"MGET".to_vec()];
    for i in 0..12 {
        if i == 5 {
            words.push(b"no-such-key".to_vec());
            want.extend_from_slice(b"$-1\r\n");
            continue;
        }
        let v = format!("value-2-{i}-{}", "x".repeat(i % 50));
        words.push(format!("key{i}").into_bytes());
        want.extend_from_slice(format!("${}\r\n{v}\r\n", v.len()).as_bytes());
    }
    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
    let before = offloaded(&socket);
    for _ in 0..20 {
        d.write_all(&cmd(&refs)).unwrap();
        let got = read_reply(&mut d, &mut db);
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }
    assert!(
        offloaded(&socket) - before > 200,
        "MGET keys were not read on the DPU"
    );
    let st = common::dpu_stats(&socket);
    let dirs = st["offload"]["directors"].as_array().unwrap();
    let offloaded: u64 = dirs.iter().map(|x| x["offloaded"].as_u64().unwrap()).sum();
    assert!(
        offloaded > keys as u64,
        "the DPU served {offloaded} GETs: {st}"
    );
    // DPU CPU per GET served on it, over the window of the pipelined GETs below.
    let mut batch = Vec::new();
    for i in 0..keys {
        batch.extend(cmd(&[b"GET", format!("key{i}").as_bytes()]));
    }
    for _ in 0..5 {
        d.write_all(&batch).unwrap();
        for _ in 0..keys {
            read_reply(&mut d, &mut db);
        }
    }
    let us = common::dpu_cpu_per_request(&socket, "KV GET", keys as u64);
    eprintln!("DPU CPU per offloaded GET: {us:.1} µs");
}

/// An MGET pipelined behind more GETs than the connection's share of DPU contexts (so its
/// keys cannot all be read on the DPU when it is planned) is answered whole and in order.
#[test]
fn an_mget_behind_a_full_share_of_dpu_reads_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _kv, _socket, mut d, _h) =
        offloaded_kv_with(dir.path(), &["--offload-contexts-per-conn", "2"]);
    let mut db = Vec::new();
    for i in 0..64 {
        d.write_all(&cmd(&[b"SET", format!("key{i}").as_bytes(), b"v"]))
            .unwrap();
        assert_eq!(read_reply(&mut d, &mut db), b"+OK\r\n");
    }
    d.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for round in 0..20 {
        let mut batch = Vec::new();
        for i in 0..20 {
            batch.extend(cmd(&[b"GET", format!("key{}", i % 64).as_bytes()]));
        }
        let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("key{i}").into_bytes()).collect();
        let mut words: Vec<&[u8]> = vec![b"MGET"];
        words.extend(keys.iter().map(|k| &k[..]));
        batch.extend(cmd(&words));
        d.write_all(&batch).unwrap();
        for _ in 0..20 {
            assert_eq!(read_reply(&mut d, &mut db), b"$1\r\nv\r\n", "round {round}");
        }
        let want = format!("*8\r\n{}", "$1\r\nv\r\n".repeat(8));
        assert_eq!(
            read_reply(&mut d, &mut db),
            want.as_bytes(),
            "round {round}"
        );
    }
}

/// HGET, SISMEMBER and ZSCORE of elements on storage are served by the DPU, and never an
/// element's previous value, a removed member, or an element of a deleted collection:
/// writes through the director and straight to the host, each read back at once through
/// the DPU, then all again pipelined.
#[test]
fn the_dpu_serves_element_reads_and_never_a_stale_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _kv, socket, mut d, mut h) = offloaded_kv(dir.path());
    let (mut db, mut hb) = (Vec::new(), Vec::new());
    let n = 300;
    let value = |round: u32, i: usize| format!("v{round}-{i}-{}", "x".repeat(i % 40));
    // What each read must answer after `round`.
    let want = |round: u32, i: usize| -> [Vec<u8>; 3] {
        let v = value(round, i);
        let score = (round as usize * 1000 + i).to_string();
        [
            format!("${}\r\n{v}\r\n", v.len()).into_bytes(),
            if round == 1 {
                b":0\r\n".to_vec()
            } else {
                b":1\r\n".to_vec()
            },
            format!("${}\r\n{score}\r\n", score.len()).into_bytes(),
        ]
    };
    let reads = |i: usize| -> [Vec<u8>; 3] {
        let (f, m) = (format!("f{i}"), format!("m{i}"));
        [
            cmd(&[b"HGET", b"h", f.as_bytes()]),
            cmd(&[b"SISMEMBER", b"s", m.as_bytes()]),
            cmd(&[b"ZSCORE", b"z", m.as_bytes()]),
        ]
    };
    let mut served = 0;
    for round in 0..3u32 {
        // Round 0 writes through the director, round 1 straight to the host (which must drop
        // what the DPU cached; it also removes the set's members), round 2 through the
        // director again.
        let before = offloaded(&socket);
        for i in 0..n {
            let (f, m) = (format!("f{i}"), format!("m{i}"));
            let score = (round as usize * 1000 + i).to_string();
            let (s, b) = if round == 1 {
                (&mut h, &mut hb)
            } else {
                (&mut d, &mut db)
            };
            let set = if round == 1 { &b"SREM"[..] } else { b"SADD" };
            let writes = [
                (
                    cmd(&[b"HSET", b"h", f.as_bytes(), value(round, i).as_bytes()]),
                    b":".as_slice(),
                ),
                (cmd(&[set, b"s", m.as_bytes()]), b":"),
                (cmd(&[b"ZADD", b"z", score.as_bytes(), m.as_bytes()]), b":"),
            ];
            for (w, ok) in &writes {
                s.write_all(w).unwrap();
                assert!(read_reply(s, b).starts_with(ok));
            }
            // Read back at once through the DPU: never the previous value.
            for (r, want) in reads(i).iter().zip(want(round, i)) {
                d.write_all(r).unwrap();
                assert_eq!(
                    read_reply(&mut d, &mut db),
                    want,
                    "round {round} element {i}"
                );
            }
        }
        // Everything again, pipelined, through the DPU, twice (the second time the records
        // written in the round are on storage and cached).
        for pass in 0..2 {
            let mut batch = Vec::new();
            for i in 0..n {
                batch.extend(reads(i).concat());
            }
            d.write_all(&batch).unwrap();
            for i in 0..n {
                for want in want(round, i) {
                    let got = read_reply(&mut d, &mut db);
                    assert_eq!(
                        String::from_utf8_lossy(&got),
                        String::from_utf8_lossy(&want),
                        "round {round} pass {pass} element {i}"
                    );
                }
            }
        }
        // HMGETs split between the DPU (cached fields) and the host (a missing one), in order.
        let fields: Vec<Vec<u8>> = (0..12)
            .map(|i| {
                if i == 5 {
                    b"nope".to_vec()
                } else {
                    format!("f{i}").into_bytes()
                }
            })
            .collect();
        let mut words: Vec<&[u8]> = vec![b"HMGET", b"h"];
        words.extend(fields.iter().map(|f| &f[..]));
        let mut want_h = b"*12\r\n".to_vec();
        for i in 0..12 {
            if i == 5 {
                want_h.extend_from_slice(b"$-1\r\n");
            } else {
                want_h.extend_from_slice(&want(round, i)[0]);
            }
        }
        for _ in 0..10 {
            d.write_all(&cmd(&words)).unwrap();
            let got = read_reply(&mut d, &mut db);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want_h),
                "round {round}"
            );
        }
        served += offloaded(&socket) - before;
    }
    eprintln!("the DPU served {served} element reads");
    assert!(served > n as u64, "the DPU served {served} element reads");
    // A write and a read of the same element pipelined on one connection: the read answers
    // the write's value (the director masks the element until the host answers the write).
    let mut batch = Vec::new();
    for i in 0..n {
        let (f, m) = (format!("f{i}"), format!("m{i}"));
        batch.extend(cmd(&[b"HSET", b"h", f.as_bytes(), b"piped"]));
        batch.extend(&reads(i)[0]);
        batch.extend(cmd(&[b"SREM", b"s", m.as_bytes()]));
        batch.extend(&reads(i)[1]);
        batch.extend(cmd(&[b"ZADD", b"z", b"-1", m.as_bytes()]));
        batch.extend(&reads(i)[2]);
    }
    d.write_all(&batch).unwrap();
    for i in 0..n {
        let want: [&[u8]; 6] = [
            b":0\r\n",
            b"$5\r\npiped\r\n",
            b":1\r\n",
            b":0\r\n",
            b":0\r\n",
            b"$2\r\n-1\r\n",
        ];
        for w in want {
            assert_eq!(read_reply(&mut d, &mut db), w, "pipelined element {i}");
        }
    }
    // A deleted hash made again: none of the old version's fields is served.
    h.write_all(&cmd(&[b"DEL", b"h"])).unwrap();
    assert_eq!(read_reply(&mut h, &mut hb), b":1\r\n");
    h.write_all(&cmd(&[b"HSET", b"h", b"f0", b"new"])).unwrap();
    assert_eq!(read_reply(&mut h, &mut hb), b":1\r\n");
    for _ in 0..3 {
        for i in 0..n {
            d.write_all(&reads(i)[0]).unwrap();
            let got = read_reply(&mut d, &mut db);
            let want: &[u8] = if i == 0 { b"$3\r\nnew\r\n" } else { b"$-1\r\n" };
            assert_eq!(got, want, "field {i} after DEL");
        }
    }
}

#[test]
fn acknowledged_writes_survive_kill_9_and_restarts() {
    survive_kill_9("16M");
}

/// The same with a log of 16 pages: it wraps, pages are compacted (their reads, the moved
/// records' writes and the checkpoints that move recovery's start all asynchronous).
#[test]
fn acknowledged_writes_survive_kill_9_while_the_log_wraps() {
    let compactions = survive_kill_9("1M");
    assert!(compactions > 0, "the log did not wrap");
}

/// DBSIZE of `s` once it reaches `n` (within 5 s: the active expiry cycle removes keys
/// whose time passed); panics with the last answer otherwise.
fn wait_dbsize(s: &mut TcpStream, b: &mut Vec<u8>, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        s.write_all(&cmd(&[b"DBSIZE"])).unwrap();
        let got = read_reply(s, b);
        if got == format!(":{n}\r\n").as_bytes() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: DBSIZE {} (want {n})",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three lives of pipelined writes in fsync mode, each ended by kill -9 right after the last
/// acknowledgement and checked by the next; returns the compactions of the last life. Each
/// life also writes keys with a short expiry, one of them over an older value without one,
/// and waits for the active expiry cycle to remove them (no record is written for that):
/// after the restart they are gone again, and the older value does not come back.
fn survive_kill_9(log_size: &str) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "512M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let args = [
        "--socket",
        socket.to_str().unwrap(),
        "--memory",
        "256K",
        "--page-size",
        "64K",
        "--log-size",
        log_size,
        "--durability",
        "fsync",
    ];
    let mut expect: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
    let mut colls = Collections::default();
    let mut compactions = 0;
    for life in 0..3u32 {
        let (mut kv, addr) = start_kv(&args);
        let mut s = TcpStream::connect(addr).unwrap();
        let mut b = Vec::new();
        colls.check(&mut s, &mut b, &format!("life {life}"));
        for (k, v) in &expect {
            s.write_all(&cmd(&[b"GET", format!("{k}").as_bytes()]))
                .unwrap();
            let want = format!("${}\r\n{v}\r\n", v.len());
            assert_eq!(
                read_reply(&mut s, &mut b),
                want.as_bytes(),
                "life {life} key {k}"
            );
        }
        wait_dbsize(
            &mut s,
            &mut b,
            expect.len() + colls.keys(),
            &format!("life {life}, recovered"),
        );
        for l in 0..life {
            s.write_all(&cmd(&[b"GET", format!("shadow{l}").as_bytes()]))
                .unwrap();
            assert_eq!(read_reply(&mut s, &mut b), b"$-1\r\n", "life {life}");
        }
        // Pipelined writes; each acknowledged one is recorded.
        let mut batch = Vec::new();
        for i in 0..3000u32 {
            let k = i % 700;
            let v = format!("{life}:{i}:{}", "y".repeat((i % 300) as usize));
            batch.extend(cmd(&[b"SET", format!("{k}").as_bytes(), v.as_bytes()]));
        }
        s.write_all(&batch).unwrap();
        for i in 0..3000u32 {
            assert_eq!(read_reply(&mut s, &mut b), b"+OK\r\n");
            let v = format!("{life}:{i}:{}", "y".repeat((i % 300) as usize));
            expect.insert(i % 700, v);
        }
        let shadow = format!("shadow{life}");
        let mut timed = cmd(&[b"SET", shadow.as_bytes(), b"older, without an expiry"]);
        timed.extend(cmd(&[b"SET", shadow.as_bytes(), b"newer", b"PX", b"300"]));
        for i in 0..200u32 {
            timed.extend(cmd(&[
                b"SET",
                format!("t{life}:{i}").as_bytes(),
                b"v",
                b"PX",
                b"300",
            ]));
        }
        s.write_all(&timed).unwrap();
        for _ in 0..202 {
            assert_eq!(read_reply(&mut s, &mut b), b"+OK\r\n");
        }
        colls.write(&mut s, &mut b, life);
        wait_dbsize(
            &mut s,
            &mut b,
            expect.len() + colls.keys(),
            &format!("life {life}, expired"),
        );
        s.write_all(&cmd(&[b"INFO", b"engine"])).unwrap();
        let info = String::from_utf8(read_reply(&mut s, &mut b)).unwrap();
        compactions = info
            .lines()
            .find_map(|l| l.strip_prefix("compactions:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("INFO engine tells the compactions");
        // kill -9 right after the last acknowledgement (and that read).
        kv.0.kill().unwrap();
        kv.0.wait().unwrap();
    }
    compactions
}

/// The hashes, sets and sorted sets a kill -9 test writes, as acknowledged: fields and members are
/// written and removed (a collection whose last element goes is deleted), a whole hash is
/// deleted and renamed now and then.
#[derive(Default)]
struct Collections {
    hashes: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    sets: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    zsets: std::collections::BTreeMap<String, std::collections::BTreeMap<String, i64>>,
    lists: std::collections::BTreeMap<String, std::collections::VecDeque<String>>,
}

impl Collections {
    /// Live collection keys.
    fn keys(&self) -> usize {
        self.hashes.values().filter(|h| !h.is_empty()).count()
            + self.sets.values().filter(|m| !m.is_empty()).count()
            + self.zsets.values().filter(|m| !m.is_empty()).count()
            + self.lists.values().filter(|l| !l.is_empty()).count()
    }

    /// Pipelined element writes and removals on 6 hashes, 6 sets, 4 sorted sets and 4 lists
    /// (pushes, pops, LSET, LINSERT and LREM in the middle, LTRIM, LMOVE), each reply checked
    /// against the model before the model takes the change.
    fn write(&mut self, s: &mut TcpStream, b: &mut Vec<u8>, life: u32) {
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(life);
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut batch = Vec::new();
        let mut want: Vec<Vec<u8>> = Vec::new();
        for i in 0..2500u32 {
            let (h, f) = (format!("hash{}", next(6)), format!("f{}", next(150)));
            let (st, m) = (format!("set{}", next(6)), format!("{}", next(150)));
            let (z, zm) = (format!("zset{}", next(4)), format!("m{}", next(100)));
            let l = format!("list{}", next(4));
            match next(17) {
                0..=3 => {
                    let v = format!("{life}:{i}:{}", "h".repeat(next(400) as usize));
                    batch.extend(cmd(&[b"HSET", h.as_bytes(), f.as_bytes(), v.as_bytes()]));
                    let new = self.hashes.entry(h).or_default().insert(f, v).is_none();
                    want.push(format!(":{}\r\n", u8::from(new)).into_bytes());
                }
                4 => {
                    batch.extend(cmd(&[b"HDEL", h.as_bytes(), f.as_bytes()]));
                    let gone = self.hashes.entry(h).or_default().remove(&f).is_some();
                    want.push(format!(":{}\r\n", u8::from(gone)).into_bytes());
                }
                5..=7 => {
                    batch.extend(cmd(&[b"SADD", st.as_bytes(), m.as_bytes()]));
                    let new = self.sets.entry(st).or_default().insert(m);
                    want.push(format!(":{}\r\n", u8::from(new)).into_bytes());
                }
                8 => {
                    batch.extend(cmd(&[b"SREM", st.as_bytes(), m.as_bytes()]));
                    let gone = self.sets.entry(st).or_default().remove(&m);
                    want.push(format!(":{}\r\n", u8::from(gone)).into_bytes());
                }
                9 | 10 => {
                    let score = next(50) as i64 - 25;
                    let sc = score.to_string();
                    batch.extend(cmd(&[b"ZADD", z.as_bytes(), sc.as_bytes(), zm.as_bytes()]));
                    let new = self.zsets.entry(z).or_default().insert(zm, score).is_none();
                    want.push(format!(":{}\r\n", u8::from(new)).into_bytes());
                }
                11 => {
                    batch.extend(cmd(&[b"ZREM", z.as_bytes(), zm.as_bytes()]));
                    let gone = self.zsets.entry(z).or_default().remove(&zm).is_some();
                    want.push(format!(":{}\r\n", u8::from(gone)).into_bytes());
                }
                12 => {
                    let v = format!("{life}:{i}:{}", "l".repeat(next(300) as usize));
                    let left = next(2) == 0;
                    let name: &[u8] = if left { b"LPUSH" } else { b"RPUSH" };
                    batch.extend(cmd(&[name, l.as_bytes(), v.as_bytes()]));
                    let list = self.lists.entry(l).or_default();
                    if left {
                        list.push_front(v);
                    } else {
                        list.push_back(v);
                    }
                    want.push(format!(":{}\r\n", list.len()).into_bytes());
                }
                13 => {
                    let left = next(2) == 0;
                    let name: &[u8] = if left { b"LPOP" } else { b"RPOP" };
                    batch.extend(cmd(&[name, l.as_bytes()]));
                    let list = self.lists.entry(l).or_default();
                    let got = if left {
                        list.pop_front()
                    } else {
                        list.pop_back()
                    };
                    want.push(match got {
                        Some(v) => format!("${}\r\n{v}\r\n", v.len()).into_bytes(),
                        None => b"$-1\r\n".to_vec(),
                    });
                }
                14 => {
                    // A change in the middle: LSET, LINSERT after an element, LREM of one.
                    let list = self.lists.entry(l.clone()).or_default();
                    let v = format!("{life}:{i}:mid");
                    if list.is_empty() {
                        batch.extend(cmd(&[b"LLEN", l.as_bytes()]));
                        want.push(b":0\r\n".to_vec());
                        continue;
                    }
                    let at = next(list.len() as u64) as usize;
                    let pivot = list[at].clone();
                    match next(3) {
                        0 => {
                            let idx = at.to_string();
                            batch.extend(cmd(&[
                                b"LSET",
                                l.as_bytes(),
                                idx.as_bytes(),
                                v.as_bytes(),
                            ]));
                            list[at] = v;
                            want.push(b"+OK\r\n".to_vec());
                        }
                        1 => {
                            batch.extend(cmd(&[
                                b"LINSERT",
                                l.as_bytes(),
                                b"AFTER",
                                pivot.as_bytes(),
                                v.as_bytes(),
                            ]));
                            let first = list.iter().position(|e| *e == pivot).unwrap();
                            list.insert(first + 1, v);
                            want.push(format!(":{}\r\n", list.len()).into_bytes());
                        }
                        _ => {
                            batch.extend(cmd(&[b"LREM", l.as_bytes(), b"1", pivot.as_bytes()]));
                            let first = list.iter().position(|e| *e == pivot).unwrap();
                            list.remove(first);
                            want.push(b":1\r\n".to_vec());
                        }
                    }
                }
                15 => {
                    if next(8) == 0 {
                        // Trimmed to its middle.
                        batch.extend(cmd(&[b"LTRIM", l.as_bytes(), b"2", b"-3"]));
                        let list = self.lists.entry(l).or_default();
                        let n = list.len();
                        if n <= 4 {
                            list.clear();
                        } else {
                            list.truncate(n - 2);
                            list.drain(..2);
                        }
                        want.push(b"+OK\r\n".to_vec());
                    } else {
                        // One element moves to the head of another list.
                        let to = format!("list{}", next(4));
                        batch.extend(cmd(&[
                            b"LMOVE",
                            l.as_bytes(),
                            to.as_bytes(),
                            b"RIGHT",
                            b"LEFT",
                        ]));
                        let got = self.lists.entry(l).or_default().pop_back();
                        match got {
                            Some(v) => {
                                want.push(format!("${}\r\n{v}\r\n", v.len()).into_bytes());
                                self.lists.entry(to).or_default().push_front(v);
                            }
                            None => want.push(b"$-1\r\n".to_vec()),
                        }
                    }
                }
                _ if i % 500 == 9 => {
                    batch.extend(cmd(&[b"DEL", h.as_bytes()]));
                    let had = self.hashes.remove(&h).is_some_and(|m| !m.is_empty());
                    want.push(format!(":{}\r\n", u8::from(had)).into_bytes());
                }
                _ => {
                    // A hash moves whole to another name (replacing what was there).
                    let to = format!("hash{}", next(6));
                    batch.extend(cmd(&[b"RENAME", h.as_bytes(), to.as_bytes()]));
                    match self.hashes.remove(&h).filter(|m| !m.is_empty()) {
                        Some(m) => {
                            self.hashes.insert(to, m);
                            want.push(b"+OK\r\n".to_vec());
                        }
                        None => want.push(b"-ERR no such key\r\n".to_vec()),
                    }
                }
            }
        }
        s.write_all(&batch).unwrap();
        for (i, w) in want.iter().enumerate() {
            let got = read_reply(s, b);
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(w),
                "life {life}, collection command {i}"
            );
        }
    }

    /// Every hash, set and sorted set reads back whole as the model has it (a sorted set in
    /// its order: by score, then member).
    fn check(&self, s: &mut TcpStream, b: &mut Vec<u8>, what: &str) {
        for (k, l) in &self.lists {
            s.write_all(&cmd(&[b"LRANGE", k.as_bytes(), b"0", b"-1"]))
                .unwrap();
            let got: Vec<String> = bulks(&read_reply(s, b))
                .expect("LRANGE's elements")
                .into_iter()
                .map(|e| String::from_utf8(e).unwrap())
                .collect();
            let want: Vec<String> = l.iter().cloned().collect();
            assert_eq!(got, want, "{what}: list {k}");
        }
        for (k, m) in &self.zsets {
            s.write_all(&cmd(&[b"ZRANGE", k.as_bytes(), b"0", b"-1", b"WITHSCORES"]))
                .unwrap();
            let got: Vec<(String, i64)> = bulks(&read_reply(s, b))
                .expect("ZRANGE's members and scores")
                .chunks(2)
                .map(|p| {
                    let score = String::from_utf8(p[1].clone()).unwrap();
                    (
                        String::from_utf8(p[0].clone()).unwrap(),
                        score.parse().unwrap(),
                    )
                })
                .collect();
            let mut want: Vec<(String, i64)> = m.iter().map(|(k, &v)| (k.clone(), v)).collect();
            want.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
            assert_eq!(got, want, "{what}: sorted set {k}");
        }
        for (k, m) in &self.hashes {
            s.write_all(&cmd(&[b"HGETALL", k.as_bytes()])).unwrap();
            let got = bulks(&read_reply(s, b)).expect("HGETALL's pairs");
            let got: std::collections::BTreeMap<String, String> = got
                .chunks(2)
                .map(|p| {
                    (
                        String::from_utf8(p[0].clone()).unwrap(),
                        String::from_utf8(p[1].clone()).unwrap(),
                    )
                })
                .collect();
            assert_eq!(&got, m, "{what}: hash {k}");
        }
        for (k, m) in &self.sets {
            s.write_all(&cmd(&[b"SMEMBERS", k.as_bytes()])).unwrap();
            let got = bulks(&read_reply(s, b)).expect("SMEMBERS' members");
            let got: std::collections::BTreeSet<String> = got
                .into_iter()
                .map(|m| String::from_utf8(m).unwrap())
                .collect();
            assert_eq!(&got, m, "{what}: set {k}");
            s.write_all(&cmd(&[b"SCARD", k.as_bytes()])).unwrap();
            let want = format!(":{}\r\n", m.len());
            assert_eq!(read_reply(s, b), want.as_bytes(), "{what}: SCARD {k}");
        }
    }
}

/// Sends `sig` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

/// Stops a process and waits until every thread of it is stopped (`kill` returns before
/// they are).
fn stop(pid: u32) {
    signal(pid, "STOP");
    let t0 = Instant::now();
    loop {
        let all = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("stat")).ok())
            .all(|st| st.rsplit(") ").next().is_some_and(|r| r.starts_with('T')));
        if all {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{pid} does not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Continues a stopped process when dropped (also when the test fails).
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

/// In fsync mode a commit does not stop the server: while the DPU (the storage) is stopped
/// with a commit in flight, the write's reply waits, a read of a durable key on another
/// connection is answered, and a read of the written key waits for the commit too (it must
/// not see a write that may not survive a crash). When the DPU goes on, both are answered.
#[test]
fn a_commit_in_flight_holds_its_replies_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let dpu = start_dpu(&img, &socket, &[]);
    let (_kv, addr) = start_kv(&[
        "--socket",
        socket.to_str().unwrap(),
        "--memory",
        "256K",
        "--page-size",
        "64K",
        "--log-size",
        "16M",
        "--durability",
        "fsync",
    ]);
    let mut a = TcpStream::connect(addr).unwrap();
    let mut b = TcpStream::connect(addr).unwrap();
    let (mut ab, mut bb) = (Vec::new(), Vec::new());
    b.write_all(&cmd(&[b"SET", b"durable", b"before"])).unwrap();
    assert_eq!(read_reply(&mut b, &mut bb), b"+OK\r\n");
    let stopped = Resume(dpu.0.id());
    stop(dpu.0.id());
    a.write_all(&cmd(&[b"SET", b"written", b"during"])).unwrap();
    // The commit cannot complete: no reply.
    a.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    let mut chunk = [0u8; 64];
    match a.read(&mut chunk) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        r => panic!(
            "a write was acknowledged before its commit completed: {r:?} (DPU {})",
            std::fs::read_to_string(format!("/proc/{}/status", dpu.0.id()))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("State"))
                .unwrap_or("")
        ),
    }
    // Another connection is served meanwhile: its durable key is read at once.
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    b.write_all(&cmd(&[b"GET", b"durable"])).unwrap();
    assert_eq!(read_reply(&mut b, &mut bb), b"$6\r\nbefore\r\n");
    b.write_all(&cmd(&[b"PING"])).unwrap();
    assert_eq!(read_reply(&mut b, &mut bb), b"+PONG\r\n");
    // The written key is not durable yet: its read waits with the write.
    b.write_all(&cmd(&[b"GET", b"written"])).unwrap();
    b.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    match b.read(&mut chunk) {
        Err(e)
            if e.kind() == std::io::ErrorKind::WouldBlock
                || e.kind() == std::io::ErrorKind::TimedOut => {}
        r => panic!("a read saw a write that is not durable: {r:?}"),
    }
    drop(stopped);
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(read_reply(&mut a, &mut ab), b"+OK\r\n");
    assert_eq!(read_reply(&mut b, &mut bb), b"$6\r\nduring\r\n");
}

#[test]
fn hostile_clients_get_clear_errors_and_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let kvdir = dir.path().join("kv");
    let (kv, addr) = start_kv(&[
        "--storage",
        "file",
        "--dir",
        kvdir.to_str().unwrap(),
        "--requirepass",
        "s3cret",
        "--client-query-buffer-limit",
        "1M",
        "--max-value-bytes",
        "64K",
        "--page-size",
        "256K",
        "--max-clients",
        "10010",
    ]);
    let mut s = TcpStream::connect(addr).unwrap();
    let mut b = Vec::new();
    s.write_all(&cmd(&[b"GET", b"k"])).unwrap();
    assert_eq!(
        read_reply(&mut s, &mut b),
        b"-NOAUTH Authentication required.\r\n"
    );
    s.write_all(&cmd(&[b"AUTH", b"wrong"])).unwrap();
    assert!(read_reply(&mut s, &mut b).starts_with(b"-WRONGPASS"));
    s.write_all(&cmd(&[b"AUTH", b"s3cret"])).unwrap();
    assert_eq!(read_reply(&mut s, &mut b), b"+OK\r\n");
    s.write_all(&cmd(&[b"SET", b"k", &[b'v'; 66_000]])).unwrap();
    assert!(read_reply(&mut s, &mut b).starts_with(b"-ERR value too large"));
    // A million draws of a 60 KB value would be 60 GB: refused once the reply passes its
    // bound, and the server goes on.
    s.write_all(&cmd(&[b"HSET", b"h", b"f", &[b'v'; 60_000]]))
        .unwrap();
    assert_eq!(read_reply(&mut s, &mut b), b":1\r\n");
    s.write_all(&cmd(&[b"HRANDFIELD", b"h", b"-1000000", b"WITHVALUES"]))
        .unwrap();
    assert!(read_reply(&mut s, &mut b).starts_with(b"-ERR reply too large"));
    s.write_all(&cmd(&[b"HRANDFIELD", b"h", b"-2000000"]))
        .unwrap();
    assert_eq!(
        read_reply(&mut s, &mut b),
        b"-ERR value is out of range\r\n"
    );
    s.write_all(&cmd(&[b"HRANDFIELD", b"h", b"-3"])).unwrap();
    assert_eq!(
        read_reply(&mut s, &mut b),
        b"*3\r\n$1\r\nf\r\n$1\r\nf\r\n$1\r\nf\r\n"
    );
    // A bulk longer than any value: refused from its header, connection closed.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999\r\n")
        .unwrap();
    let mut reply = String::new();
    t.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "-ERR Protocol error: invalid bulk length\r\n");
    // An inline request without end.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(&[b'a'; 70_000]).unwrap();
    let mut reply = Vec::new();
    let _ = t.read_to_end(&mut reply);
    assert_eq!(reply, b"-ERR Protocol error: too big inline request\r\n");
    // Before AUTH, more than 10 arguments is an error at once, as Redis.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(b"*11\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = t.read_to_end(&mut reply);
    assert_eq!(
        reply,
        b"-ERR Protocol error: unauthenticated multibulk length\r\n"
    );
    // A command of many small arguments past the query buffer limit (1M), once
    // authenticated.
    let mut t = TcpStream::connect(addr).unwrap();
    let mut big = cmd(&[b"AUTH", b"s3cret"]);
    big.extend_from_slice(b"*200000\r\n");
    for _ in 0..150_000 {
        big.extend_from_slice(b"$1\r\na\r\n");
    }
    t.write_all(&big).unwrap();
    let mut reply = Vec::new();
    let _ = t.read_to_end(&mut reply);
    assert_eq!(
        reply,
        b"+OK\r\n-ERR Protocol error: query buffer limit exceeded\r\n"
    );
    // 10,000 idle connections cost little memory.
    let rss = || -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{}/status", kv.0.id())).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let before = rss();
    let mut idle = Vec::new();
    for _ in 0..10_000 {
        idle.push(TcpStream::connect(addr).unwrap());
    }
    // Each sends a partial command, so the server has seen every one of them.
    for c in &mut idle {
        c.write_all(b"*1\r\n$4\r\nPI").unwrap();
    }
    let mut last = idle.last_mut().unwrap();
    last.write_all(b"NG\r\n").unwrap();
    let mut r = [0u8; 64];
    let n = last.read(&mut r).unwrap();
    assert_eq!(&r[..n], b"-NOAUTH Authentication required.\r\n");
    let after = rss();
    assert!(
        after.saturating_sub(before) < 64 << 20,
        "10,000 idle connections took {} MiB",
        (after - before) >> 20
    );
    // The server still answers.
    s.write_all(&cmd(&[b"PING"])).unwrap();
    assert_eq!(read_reply(&mut s, &mut b), b"+PONG\r\n");
    let _ = &mut last;
}

/// The PyPI client's functional suite against the server on `port`.
fn python_suite(port: u16) {
    let script = r#"
import sys, time, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
r.flushdb()
assert r.ping()
assert r.set("a", b"\x00\xffbin") and r.get("a") == b"\x00\xffbin"
assert r.set("a", "x", nx=True) is None
assert r.set("a", "y", xx=True) and r.get("a") == b"y"
assert r.incr("n") == 1 and r.incrby("n", 41) == 42 and r.decr("n") == 41
try:
    r.incr("a"); raise SystemExit("INCR of a string did not fail")
except redis.ResponseError as e:
    assert "not an integer" in str(e)
assert r.append("a", "zz") == 3 and r.strlen("a") == 3
assert r.mset({"k1": "v1", "k2": "v2"}) and r.mget("k1", "k2", "k3") == [b"v1", b"v2", None]
assert r.exists("k1", "k2", "k3") == 2 and r.delete("k1", "k3") == 1
assert r.getset("k2", "w") == b"v2" and r.getdel("k2") == b"w" and r.get("k2") is None
p = r.pipeline(transaction=False)
for i in range(500):
    p.set(f"p{i}", i)
for i in range(500):
    p.get(f"p{i}")
res = p.execute()
assert res[500:] == [str(i).encode() for i in range(500)]
r.set("t", "v", px=100)
assert r.get("t") == b"v"
time.sleep(0.3)
assert r.get("t") is None
# The expired key is gone once read, as in Redis: a, n and the 500 pipelined keys.
assert r.dbsize() == 502, r.dbsize()
assert r.client_setname("suite") and r.client_getname() == "suite"
print("ok")
"#;
    let out = Command::new("python3")
        .args(["-c", script, &port.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "ok",
        "python suite: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn an_expired_key_is_never_served_by_the_dpu() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _kv, socket, mut d, mut h) = offloaded_kv(dir.path());
    let (mut db, mut hb) = (Vec::new(), Vec::new());
    // 200 keys without expiry, then enough others that they are on storage and cached.
    for i in 0..1200 {
        d.write_all(&cmd(&[b"SET", format!("key{i}").as_bytes(), &[b'v'; 300]]))
            .unwrap();
        assert_eq!(read_reply(&mut d, &mut db), b"+OK\r\n");
    }
    let before = offloaded(&socket);
    for i in 0..200 {
        d.write_all(&cmd(&[b"GET", format!("key{i}").as_bytes()]))
            .unwrap();
        assert_eq!(read_reply(&mut d, &mut db).len(), 300 + 8);
    }
    assert!(offloaded(&socket) - before > 100, "the DPU served the GETs");
    // Expiries set through the director (even keys) and straight to the host (odd keys).
    for i in 0..200 {
        let (s, b) = if i % 2 == 0 {
            (&mut d, &mut db)
        } else {
            (&mut h, &mut hb)
        };
        s.write_all(&cmd(&[b"PEXPIRE", format!("key{i}").as_bytes(), b"300"]))
            .unwrap();
        assert_eq!(read_reply(s, b), b":1\r\n");
    }
    std::thread::sleep(Duration::from_millis(600));
    for i in 0..200 {
        d.write_all(&cmd(&[b"GET", format!("key{i}").as_bytes()]))
            .unwrap();
        assert_eq!(
            read_reply(&mut d, &mut db),
            b"$-1\r\n",
            "key{i} after it expired"
        );
    }
    // Keys that never expired are still served.
    d.write_all(&cmd(&[b"GET", b"key500"])).unwrap();
    assert_eq!(read_reply(&mut d, &mut db).len(), 300 + 8);
}

/// The blocking pops: parked clients are woken first parked, first served, by pushes from
/// another client (BLPOP, BLMOVE, BZPOPMIN), and chains of moves run before the pusher's next
/// command; CLIENT UNBLOCK releases one; a timeout answers a null after its time and not long
/// after; a client that left while parked takes no element and its connection goes; other
/// clients are served meanwhile.
#[test]
fn blocking_pops_wake_in_order_time_out_and_skip_clients_that_left() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (mut kv, addr) = start_kv(&["--storage", "file", "--dir", d]);
    let connect = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        (s, Vec::new())
    };
    let ask = |c: &mut (TcpStream, Vec<u8>), words: &[&[u8]]| -> Vec<u8> {
        c.0.write_all(&cmd(words)).unwrap();
        read_reply(&mut c.0, &mut c.1)
    };
    let mut a = connect();
    let mut b = connect();
    let mut writer = connect();
    a.0.write_all(&cmd(&[b"BLPOP", b"q", b"q2", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    b.0.write_all(&cmd(&[b"BLPOP", b"q", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Served meanwhile.
    assert_eq!(ask(&mut writer, &[b"PING"]), b"+PONG\r\n");
    assert_eq!(ask(&mut writer, &[b"RPUSH", b"q", b"x", b"y"]), b":2\r\n");
    assert_eq!(
        read_reply(&mut a.0, &mut a.1),
        b"*2\r\n$1\r\nq\r\n$1\r\nx\r\n",
        "the first parked is served first"
    );
    assert_eq!(
        read_reply(&mut b.0, &mut b.1),
        b"*2\r\n$1\r\nq\r\n$1\r\ny\r\n"
    );
    assert_eq!(ask(&mut writer, &[b"EXISTS", b"q"]), b":0\r\n");
    // A parked connection's later commands wait behind it, then run.
    a.0.write_all(&cmd(&[b"BLMOVE", b"src", b"dst", b"LEFT", b"RIGHT", b"0"]))
        .unwrap();
    a.0.write_all(&cmd(&[b"LLEN", b"dst"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ask(&mut writer, &[b"LPUSH", b"src", b"m"]), b":1\r\n");
    assert_eq!(read_reply(&mut a.0, &mut a.1), b"$1\r\nm\r\n");
    assert_eq!(read_reply(&mut a.0, &mut a.1), b":1\r\n");
    // Sorted sets too.
    b.0.write_all(&cmd(&[b"BZPOPMIN", b"z", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        ask(&mut writer, &[b"ZADD", b"z", b"2", b"two", b"1", b"one"]),
        b":2\r\n"
    );
    assert_eq!(
        read_reply(&mut b.0, &mut b.1),
        b"*3\r\n$1\r\nz\r\n$3\r\none\r\n$1\r\n1\r\n"
    );
    // Linked moves run to their end before the pushing connection's next command, as Redis
    // serves its blocked clients right after the command that fed them.
    a.0.write_all(&cmd(&[b"BLMOVE", b"l1", b"l2", b"RIGHT", b"LEFT", b"0"]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    b.0.write_all(&cmd(&[b"BLMOVE", b"l2", b"l3", b"LEFT", b"RIGHT", b"0"]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut pipeline = cmd(&[b"RPUSH", b"l1", b"foo"]);
    pipeline.extend(cmd(&[b"LRANGE", b"l1", b"0", b"-1"]));
    pipeline.extend(cmd(&[b"LRANGE", b"l2", b"0", b"-1"]));
    pipeline.extend(cmd(&[b"LRANGE", b"l3", b"0", b"-1"]));
    writer.0.write_all(&pipeline).unwrap();
    assert_eq!(read_reply(&mut writer.0, &mut writer.1), b":1\r\n");
    assert_eq!(read_reply(&mut writer.0, &mut writer.1), b"*0\r\n");
    assert_eq!(read_reply(&mut writer.0, &mut writer.1), b"*0\r\n");
    assert_eq!(
        read_reply(&mut writer.0, &mut writer.1),
        b"*1\r\n$3\r\nfoo\r\n"
    );
    assert_eq!(read_reply(&mut a.0, &mut a.1), b"$3\r\nfoo\r\n");
    assert_eq!(read_reply(&mut b.0, &mut b.1), b"$3\r\nfoo\r\n");
    // CLIENT UNBLOCK: as timed out, or with an error.
    let id_of = |c: &mut (TcpStream, Vec<u8>)| -> Vec<u8> {
        c.0.write_all(&cmd(&[b"CLIENT", b"ID"])).unwrap();
        let r = read_reply(&mut c.0, &mut c.1);
        r[1..r.len() - 2].to_vec()
    };
    let (ida, idb) = (id_of(&mut a), id_of(&mut b));
    a.0.write_all(&cmd(&[b"BLPOP", b"never", b"0"])).unwrap();
    b.0.write_all(&cmd(&[b"BRPOP", b"never", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ask(&mut writer, &[b"CLIENT", b"UNBLOCK", &ida]), b":1\r\n");
    assert_eq!(
        ask(&mut writer, &[b"CLIENT", b"UNBLOCK", &idb, b"ERROR"]),
        b":1\r\n"
    );
    assert_eq!(ask(&mut writer, &[b"CLIENT", b"UNBLOCK", &idb]), b":0\r\n");
    assert_eq!(read_reply(&mut a.0, &mut a.1), b"*-1\r\n");
    assert_eq!(
        read_reply(&mut b.0, &mut b.1),
        b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"
    );
    // A timeout: a null array after its time, not long after.
    let t = Instant::now();
    assert_eq!(ask(&mut a, &[b"BLPOP", b"none", b"0.3"]), b"*-1\r\n");
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // A client that leaves while parked takes nothing.
    let mut gone = connect();
    gone.0.write_all(&cmd(&[b"BLPOP", b"w", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(gone);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(ask(&mut writer, &[b"RPUSH", b"w", b"kept"]), b":1\r\n");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ask(&mut writer, &[b"LRANGE", b"w", b"0", b"-1"]),
        b"*1\r\n$4\r\nkept\r\n"
    );
    let info = String::from_utf8(ask(&mut writer, &[b"INFO", b"clients"])).unwrap();
    assert!(
        info.lines().any(|l| l.trim() == "connected_clients:3"),
        "the parked client that left is closed: {info}"
    );
    // A stop does not wait for a parked client: it is disconnected, as Redis does.
    a.0.write_all(&cmd(&[b"BLPOP", b"never", b"0"])).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    signal(kv.0.id(), "TERM");
    let status = kv.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "the stop waited {:?} for a parked client",
        t.elapsed()
    );
    let mut rest = Vec::new();
    let _ = a.0.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no reply to the parked BLPOP: {rest:?}");
}

/// The element LINDEX reads, and the first of an LRANGE, are fetched before the command runs
/// when they are on storage (a pending read: the loop does not wait for it); pops of those
/// elements answer them right.
/// `conns` connections each send `cmd` 50 times to `addr` (pipelined, 10 at a time): the
/// bulk strings answered.
fn pop_concurrently(addr: SocketAddr, cmd_words: &[&[u8]], conns: usize) -> Vec<Vec<u8>> {
    let c = cmd(cmd_words);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..conns)
            .map(|_| {
                let c = &c;
                sc.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut b = Vec::new();
                    let mut out = Vec::new();
                    for _ in 0..5 {
                        s.write_all(&c.repeat(10)).unwrap();
                        for _ in 0..10 {
                            // `$<len>\r\n<element>\r\n`
                            let r = read_reply(&mut s, &mut b);
                            let nl = r.iter().position(|&x| x == b'\n').unwrap();
                            out.push(r[nl + 1..r.len() - 2].to_vec());
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// `dds kv` on OS files in `dir` with 256 KiB of memory in 64 KiB pages (records leave
/// memory soon), and a connection to it.
fn small_memory_kv(dir: &Path) -> (Guard, SocketAddr, TcpStream) {
    let d = dir.to_str().unwrap();
    let (kv, addr) = start_kv(&[
        "--storage",
        "file",
        "--dir",
        d,
        "--memory",
        "256K",
        "--page-size",
        "64K",
    ]);
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (kv, addr, s)
}

/// A field of `INFO engine` on `s`.
fn engine_info(s: &mut TcpStream, b: &mut Vec<u8>, field: &str) -> u64 {
    s.write_all(&cmd(&[b"INFO", b"engine"])).unwrap();
    let text = String::from_utf8(read_reply(s, b)).unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("INFO has {field}: {text}"))
}

/// SPOP, ZADD and ZREM of members on storage read their records ahead: SPOP's pick is drawn
/// when its read is issued. Four connections popping one set, pipelined, get distinct
/// members of it, with few reads inside the loop.
#[test]
fn random_picks_and_sorted_set_writes_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (_kv, addr, mut s) = small_memory_kv(dir.path());
    let mut b = Vec::new();
    let member = |i: u32| format!("{i:06}{}", "m".repeat(94));
    let mut batch = Vec::new();
    for i in 0..20_000u32 {
        batch.extend(cmd(&[b"SADD", b"s", member(i).as_bytes()]));
        batch.extend(cmd(&[
            b"ZADD",
            b"z",
            i.to_string().as_bytes(),
            member(i).as_bytes(),
        ]));
    }
    s.write_all(&batch).unwrap();
    for _ in 0..40_000 {
        assert_eq!(read_reply(&mut s, &mut b), b":1\r\n");
    }
    let blocking = engine_info(&mut s, &mut b, "storage_reads_blocking");
    let ahead = engine_info(&mut s, &mut b, "storage_reads_fetched_ahead");
    let mut popped = pop_concurrently(addr, &[b"SPOP", b"s"], 4);
    popped.sort();
    popped.dedup();
    assert_eq!(popped.len(), 200, "200 distinct members popped");
    assert!(popped
        .iter()
        .all(|m| m.len() == 100 && m.ends_with(&[b'm'; 94])));
    s.write_all(&cmd(&[b"SCARD", b"s"])).unwrap();
    assert_eq!(read_reply(&mut s, &mut b), b":19800\r\n");
    // ZADD of existing members (their old scores are read) and ZREM.
    let mut batch = Vec::new();
    for i in 0..100u32 {
        batch.extend(cmd(&[b"ZADD", b"z", b"-1", member(i * 97).as_bytes()]));
        batch.extend(cmd(&[b"ZREM", b"z", member(i * 97 + 1).as_bytes()]));
    }
    s.write_all(&batch).unwrap();
    for _ in 0..100 {
        assert_eq!(read_reply(&mut s, &mut b), b":0\r\n", "ZADD of a member");
        assert_eq!(read_reply(&mut s, &mut b), b":1\r\n", "ZREM");
    }
    let ahead = engine_info(&mut s, &mut b, "storage_reads_fetched_ahead") - ahead;
    let waited = engine_info(&mut s, &mut b, "storage_reads_blocking") - blocking;
    assert!(
        ahead >= 300 && waited <= 60,
        "reads ahead: {ahead} fetched ahead, {waited} waited"
    );
    // (The order, built now from every record, has the new scores.)
    s.write_all(&cmd(&[b"ZCOUNT", b"z", b"-1", b"-1"])).unwrap();
    assert_eq!(read_reply(&mut s, &mut b), b":100\r\n");
}

#[test]
fn list_elements_on_storage_are_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (_kv, addr, mut s) = small_memory_kv(dir.path());
    let mut b = Vec::new();
    // 20,000 elements of 100 bytes: the head's records leave memory.
    let value = |i: u32| format!("{i:06}{}", "e".repeat(94));
    let mut batch = Vec::new();
    for i in 0..20_000u32 {
        batch.extend(cmd(&[b"RPUSH", b"q", value(i).as_bytes()]));
    }
    s.write_all(&batch).unwrap();
    for i in 0..20_000u32 {
        let want = format!(":{}\r\n", i + 1);
        assert_eq!(read_reply(&mut s, &mut b), want.as_bytes());
    }
    let info = engine_info;
    let blocking = info(&mut s, &mut b, "storage_reads_blocking");
    let ahead = info(&mut s, &mut b, "storage_reads_fetched_ahead");
    for i in 0..50u32 {
        let at = (i * 7).to_string();
        s.write_all(&cmd(&[b"LINDEX", b"q", at.as_bytes()]))
            .unwrap();
        let v = value(i * 7);
        let want = format!("${}\r\n{v}\r\n", v.len());
        assert_eq!(read_reply(&mut s, &mut b), want.as_bytes(), "LINDEX {at}");
    }
    s.write_all(&cmd(&[b"LRANGE", b"q", b"400", b"402"]))
        .unwrap();
    let want: Vec<u8> = (400..403u32).fold(b"*3\r\n".to_vec(), |mut w, i| {
        let v = value(i);
        w.extend(format!("${}\r\n{v}\r\n", v.len()).bytes());
        w
    });
    assert_eq!(read_reply(&mut s, &mut b), want, "LRANGE 400 402");
    let ahead_now = info(&mut s, &mut b, "storage_reads_fetched_ahead");
    assert!(
        ahead_now >= ahead + 53,
        "the elements' records were read ahead: {ahead} -> {ahead_now}"
    );
    assert_eq!(
        info(&mut s, &mut b, "storage_reads_blocking"),
        blocking,
        "no list read waited for storage inside the loop"
    );
    // Pops read their elements ahead too, each beyond those that the pops pending before it
    // on that end will take: four connections popping one list, pipelined, get every
    // element once, with few reads inside the loop.
    for i in 0..3u32 {
        s.write_all(&cmd(&[b"LPOP", b"q"])).unwrap();
        let v = value(i);
        let want = format!("${}\r\n{v}\r\n", v.len());
        assert_eq!(read_reply(&mut s, &mut b), want.as_bytes(), "LPOP {i}");
    }
    let blocking = info(&mut s, &mut b, "storage_reads_blocking");
    let ahead = info(&mut s, &mut b, "storage_reads_fetched_ahead");
    let mut popped = pop_concurrently(addr, &[b"LPOP", b"q"], 4);
    popped.sort();
    let want: Vec<Vec<u8>> = (3..203u32).map(|i| value(i).into_bytes()).collect();
    assert!(popped == want, "every element popped once");
    s.write_all(&cmd(&[b"RPOP", b"q", b"3"])).unwrap();
    let tail: Vec<Vec<u8>> = (19_997..20_000u32)
        .rev()
        .map(|i| value(i).into_bytes())
        .collect();
    assert_eq!(bulks(&read_reply(&mut s, &mut b)), Some(tail), "RPOP 3");
    let ahead_now = info(&mut s, &mut b, "storage_reads_fetched_ahead");
    let blocking_now = info(&mut s, &mut b, "storage_reads_blocking");
    assert!(
        ahead_now - ahead >= 150 && blocking_now - blocking <= 40,
        "pops read ahead: {} fetched ahead, {} waited",
        ahead_now - ahead,
        blocking_now - blocking
    );
}
