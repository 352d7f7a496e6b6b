//! Linearizability of `dds kv` with the DPU serving GETs (and HGETs): several clients (most
//! through the DPU's traffic director, one straight to the host) run SET/GET/INCRBY/DEL on a
//! few keys, or HSET/HGET/HINCRBY/HDEL on a few fields of one hash (each field a register);
//! their histories are recorded with send and reply times and checked by a
//! Wing–Gong–Lowe search (`lincheck`). Runs with offload on, and without the DPU in the path.

mod common;
mod lincheck;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use common::{format_device, start_dpu, Guard};
use dds_testkit::resp::command as cmd;
use lincheck::{check, Event, Op, Ret};
use rand::{Rng, SeedableRng};

/// Reads one reply of a simple, error, integer or bulk type.
fn reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Ret {
    loop {
        if let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&buf[1..nl]).to_string();
            match buf[0] {
                b'+' => {
                    buf.drain(..nl + 2);
                    return Ret::Ok;
                }
                b'-' => {
                    buf.drain(..nl + 2);
                    return Ret::Err;
                }
                b':' => {
                    buf.drain(..nl + 2);
                    return Ret::Int(line.parse().unwrap());
                }
                b'$' => {
                    let n: i64 = line.parse().unwrap();
                    if n < 0 {
                        buf.drain(..nl + 2);
                        return Ret::Value(None);
                    }
                    let end = nl + 2 + n as usize;
                    if buf.len() >= end + 2 {
                        let v = buf[nl + 2..end].to_vec();
                        buf.drain(..end + 2);
                        return Ret::Value(Some(v));
                    }
                }
                other => panic!("unexpected reply type {other}"),
            }
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// How a register operation goes on the wire: on a string key, or on a field of the hash `H`
/// (`hash`; HSET's count reply stands for SET's `+OK`).
fn wire(op: &Op, key: &[u8], hash: bool) -> Vec<u8> {
    match (op, hash) {
        (Op::Get, false) => cmd(&[b"GET", key]),
        (Op::Set(v), false) => cmd(&[b"SET", key, v]),
        (Op::Incr(by), false) => cmd(&[b"INCRBY", key, by.to_string().as_bytes()]),
        (Op::Del, false) => cmd(&[b"DEL", key]),
        (Op::Get, true) => cmd(&[b"HGET", b"H", key]),
        (Op::Set(v), true) => cmd(&[b"HSET", b"H", key, v]),
        (Op::Incr(by), true) => cmd(&[b"HINCRBY", b"H", key, by.to_string().as_bytes()]),
        (Op::Del, true) => cmd(&[b"HDEL", b"H", key]),
    }
}

/// The register's view of a reply to `op` (HSET answers how many fields it added).
fn as_register(op: &Op, r: Ret, hash: bool) -> Ret {
    match (op, r) {
        (Op::Set(_), Ret::Int(_)) if hash => Ret::Ok,
        (_, r) => r,
    }
}

fn run_clients(addrs: &[SocketAddr], ops: usize) -> Vec<Event> {
    run_clients_on(addrs, ops, false)
}

/// The clients' history; `hash`: the registers are the fields of one hash (the read-mostly
/// fields are never deleted, so the hash stays and its version with it).
fn run_clients_on(addrs: &[SocketAddr], ops: usize, hash: bool) -> Vec<Event> {
    let t0 = Instant::now();
    // The read-mostly keys exist from the start (their SETs are part of the history).
    let mut setup = Vec::new();
    {
        let mut s = TcpStream::connect(addrs[0]).unwrap();
        let mut buf = Vec::new();
        for k in [b"r0", b"r1", b"r2", b"r3"] {
            let call = t0.elapsed().as_nanos() as u64;
            let op = Op::Set(b"initial".to_vec());
            s.write_all(&wire(&op, k, hash)).unwrap();
            let r = as_register(&op, reply(&mut s, &mut buf), hash);
            setup.push(Event {
                client: addrs.len(),
                key: k.to_vec(),
                op: Op::Set(b"initial".to_vec()),
                call,
                ret: Some((t0.elapsed().as_nanos() as u64, r)),
            });
        }
    }
    let keys: [&[u8]; 8] = [b"k0", b"k1", b"k2", b"k3", b"k4", b"k5", b"n0", b"n1"];
    let cold: [&[u8]; 4] = [b"r0", b"r1", b"r2", b"r3"];
    std::thread::scope(|sc| {
        let hs: Vec<_> = addrs
            .iter()
            .enumerate()
            .map(|(c, &addr)| {
                sc.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(c as u64 + 11);
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.set_nodelay(true).unwrap();
                    let mut buf = Vec::new();
                    let mut out = Vec::new();
                    for i in 0..ops {
                        // Read-mostly keys (the DPU serves most of their GETs) and hot keys
                        // (written as often as read: invalidations race the DPU's reads).
                        let read_mostly = rng.gen_bool(0.4);
                        let key = if read_mostly {
                            cold[rng.gen_range(0..cold.len())]
                        } else {
                            keys[rng.gen_range(0..keys.len())]
                        };
                        let numeric = key[0] == b'n';
                        let op = match rng.gen_range(0..20) {
                            _ if read_mostly => {
                                if rng.gen_ratio(1, 40) {
                                    Op::Set(format!("c{c}-{i}").into_bytes())
                                } else {
                                    Op::Get
                                }
                            }
                            0..=13 => Op::Get,
                            14..=16 if numeric => Op::Incr(rng.gen_range(1..4)),
                            14..=17 => Op::Set(format!("c{c}-{i}").into_bytes()),
                            18 if numeric => {
                                Op::Set(format!("{}", rng.gen_range(0..100)).into_bytes())
                            }
                            _ => Op::Del,
                        };
                        let call = t0.elapsed().as_nanos() as u64;
                        s.write_all(&wire(&op, key, hash)).unwrap();
                        let r = as_register(&op, reply(&mut s, &mut buf), hash);
                        let ret_at = t0.elapsed().as_nanos() as u64;
                        out.push(Event {
                            client: c,
                            key: key.to_vec(),
                            op,
                            call,
                            ret: Some((ret_at, r)),
                        });
                    }
                    out
                })
            })
            .collect();
        setup
            .into_iter()
            .chain(hs.into_iter().flat_map(|h| h.join().unwrap()))
            .collect()
    })
}

fn start_kv(listen: &str, socket: &std::path::Path) -> (Guard, SocketAddr) {
    let s = socket.to_str().unwrap();
    common::start_kv(
        listen,
        &[
            "--socket",
            s,
            "--memory",
            "192K",
            "--page-size",
            "64K",
            "--log-size",
            "16M",
            "--durability",
            "fsync",
        ],
    )
}

#[test]
fn the_checker_accepts_linearizable_histories_and_rejects_the_others() {
    lincheck::check_the_checker();
}

#[test]
fn histories_with_dpu_served_gets_are_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, via_dpu) = common::start_offload_dpu(dir.path(), "256M", "redis");
    let (_kv, direct) = start_kv("127.0.0.1:0", &socket);
    let history = run_clients(&[via_dpu, via_dpu, via_dpu, direct], 400);
    assert_eq!(history.len(), 1604);
    if let Err(v) = check(&history) {
        panic!("not linearizable: {v}");
    }
    // The DPU served some of the GETs (otherwise the test says nothing about offload).
    let served = common::offloaded(&socket);
    eprintln!("the DPU served {served} GETs");
    assert!(served > 300, "the DPU served {served} GETs");
}

#[test]
fn histories_with_dpu_served_hgets_are_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, via_dpu) = common::start_offload_dpu(dir.path(), "256M", "redis");
    let (_kv, direct) = start_kv("127.0.0.1:0", &socket);
    let history = run_clients_on(&[via_dpu, via_dpu, via_dpu, direct], 400, true);
    assert_eq!(history.len(), 1604);
    if let Err(v) = check(&history) {
        panic!("not linearizable: {v}");
    }
    let served = common::offloaded(&socket);
    eprintln!("the DPU served {served} HGETs");
    assert!(served > 300, "the DPU served {served} HGETs");
}

#[test]
fn histories_without_the_dpu_in_the_path_are_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_kv, a) = start_kv("127.0.0.1:0", &socket);
    let history = run_clients(&[a, a, a, a], 300);
    if let Err(v) = check(&history) {
        panic!("not linearizable: {v}");
    }
}

#[test]
fn histories_of_the_memory_engine_are_linearizable() {
    let (_kv, a) = common::start_kv("127.0.0.1:0", &["--engine", "memory", "--memory", "16M"]);
    let history = run_clients(&[a, a, a, a], 300);
    if let Err(v) = check(&history) {
        panic!("not linearizable: {v}");
    }
}

/// DPU-KV designs: `lat` through KV queue pairs to two host workers, `sav` through one worker,
/// `dual` with clients on both the DPU's endpoint and the host's (one store behind both), and
/// the store on either side alone (`cpu-only` with two front-end threads, `dpu-only`). `shrd`
/// serves each key from one shard, as `dpu-only` and `cpu-only` do.
#[test]
fn histories_of_dpu_kv_designs_are_linearizable() {
    for (design, host_args) in [
        ("lat", &["--workers", "2", "--partitions", "2"][..]),
        ("sav", &["--partitions", "2"][..]),
        ("dual", &["--partitions", "2"][..]),
        ("cpu-only", &["--frontends", "2", "--partitions", "2"][..]),
        ("dpu-only", &[][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = common::start_dpukv(dir.path(), design, &[], host_args);
        let e = &d.endpoints;
        let last = *e.last().unwrap();
        let history = run_clients(&[e[0], e[0], e[0], last], 300);
        if let Err(v) = check(&history) {
            panic!("{design}: not linearizable: {v}");
        }
    }
}
