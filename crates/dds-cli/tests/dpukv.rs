//! DPU-KV end to end (`docs/dpu-kv.md`): every design serves the same functional suite to
//! real clients (redis-py, its cluster client for `shrd`, redis-cli, redis-benchmark); the
//! KV queue pairs survive pipelined load; a killed DPU closes its clients' connections while
//! the host store stays consistent; bad input gets errors; endpoints appear in etcd under a
//! lease and disappear with their process.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{next_endpoints, start_dpukv, start_dpukv_dpu, Guard};

/// The functional suite, in redis-py: `cluster` uses `RedisCluster` (routing by slot).
const SUITE: &str = r#"
import sys, redis
from redis.cluster import RedisCluster
host, port, cluster = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
base = RedisCluster(host=host, port=port) if cluster else redis.Redis(host=host, port=port, protocol=2)
pre = sys.argv[4]
class P:
    """Every key of the suite carries the run's prefix (endpoints of a design share a store)."""
    def __getattr__(self, name):
        f = getattr(base, name)
        def call(*a, **k):
            if name in ("mset",):
                a = ({(pre + kk if isinstance(kk, str) else pre.encode() + kk): v for kk, v in a[0].items()},)
            elif name in ("mget",):
                a = ([pre + kk for kk in a[0]],)
            elif name in ("delete", "exists"):
                a = tuple(pre + kk for kk in a)
            elif a and name not in ("ping", "pipeline", "cluster_slots"):
                kk = a[0]
                a = ((pre + kk) if isinstance(kk, str) else pre.encode() + kk,) + a[1:]
            return f(*a, **k)
        return call
r = P()
assert r.ping()
assert r.set("k1", "v1") is True
assert r.get("k1") == b"v1"
assert r.get("missing") is None
assert r.set(b"bin\x00key", b"\x00\xff\r\n") and r.get(b"bin\x00key") == b"\x00\xff\r\n"
assert r.incr("n") == 1 and r.incrby("n", 41) == 42 and r.decr("n") == 41 and r.decrby("n", 1) == 40
try:
    r.incr("k1"); raise SystemExit("INCR of a string must fail")
except redis.ResponseError as e:
    assert "not an integer" in str(e), e
assert r.exists("k1") == 1 and r.exists("nope") == 0
assert r.delete("k1") == 1 and r.delete("k1") == 0 and r.get("k1") is None
if cluster:
    pre = "{t}" + pre
    assert r.mset({"a": "1", "b": "2"})
    assert r.mget(["a", "b", "c"]) == [b"1", b"2", None]
    pre = sys.argv[4]
    # Keys of both shards, each routed to its own endpoint.
    for i in range(200):
        r.set(f"key{i}", f"val{i}")
    for i in range(200):
        assert r.get(f"key{i}") == f"val{i}".encode(), i
    assert len(base.cluster_slots(target_nodes=RedisCluster.RANDOM)) == 2
else:
    assert r.mset({"a": "1", "b": "2"})
    assert r.mget(["a", "b", "c"]) == [b"1", b"2", None]
    assert r.delete("a", "b", "c") == 2
    p = base.pipeline(transaction=False)
    for i in range(500):
        p.set(f"p{i}", i)
    for i in range(500):
        p.get(f"p{i}")
    out = p.execute()
    assert out[:500] == [True] * 500 and out[500:] == [str(i).encode() for i in range(500)]
    try:
        r.set("x" * 300, "v"); raise SystemExit("a 300-byte key must be refused")
    except redis.ResponseError as e:
        assert "255" in str(e), e
print("ok")
"#;

fn suite(addr: SocketAddr, cluster: bool, prefix: &str) {
    let out = Command::new("python3")
        .args(["-c", SUITE])
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(if cluster { "1" } else { "0" })
        .arg(prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "suite against {addr}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run_design(design: &str, host_args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let d = start_dpukv(dir.path(), design, &["--store-memory", "64M"], host_args);
    // Every endpoint of the design serves the suite (a replica of all slots, or a shard).
    let cluster = design == "shrd";
    for (i, &e) in d.endpoints.iter().enumerate() {
        suite(e, cluster, &format!("e{i}:"));
    }
}

#[test]
fn cpu_only_passes_the_suite() {
    run_design("cpu-only", &["--frontends", "2", "--partitions", "2"]);
}

#[test]
fn dpu_only_passes_the_suite() {
    run_design("dpu-only", &[]);
}

#[test]
fn lat_passes_the_suite() {
    run_design("lat", &["--workers", "2", "--partitions", "2"]);
}

#[test]
fn sav_passes_the_suite() {
    // With an index sized to the keys (two partitions of 32 KiB), not to the memory.
    run_design("sav", &["--partitions", "2", "--store-index", "64K"]);
}

#[test]
fn dual_passes_the_suite_on_both_endpoints() {
    run_design("dual", &["--frontends", "1"]);
}

#[test]
fn shrd_routes_cluster_clients_by_slot() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_dpukv(dir.path(), "shrd", &["--store-memory", "64M"], &[]);
    assert_eq!(d.endpoints.len(), 2);
    suite(d.endpoints[0], true, "c:");
    // A plain client on the wrong shard gets a redirect to the right one.
    let moved = Command::new("redis-cli")
        .args(["-p", &d.endpoints[0].port().to_string(), "GET", "foo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&moved.stdout);
    assert!(
        text.contains(&format!("MOVED 12182 {}", d.endpoints[1])),
        "{text}"
    );
}

fn redis_cli(addr: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &addr.port().to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn pipelined_redis_benchmark_load_through_kv_queue_pairs_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_dpukv(
        dir.path(),
        "lat",
        &["--cores", "2"],
        &["--workers", "2", "--partitions", "2", "--comm-cores", "2"],
    );
    let a = d.endpoints[0];
    let out = Command::new("redis-benchmark")
        .args(["-p", &a.port().to_string(), "-t", "incr,set,get"])
        .args(["-n", "30000", "-c", "12", "-P", "16", "-r", "500", "-q"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("rror"), "{text}");
    // Every INCR of the random counters (key:__rand_int__ is shared with SET, so count
    // through a key of its own first).
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &a.port().to_string(),
            "-n",
            "20000",
            "-c",
            "10",
            "-P",
            "8",
        ])
        .args(["INCR", "counter"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(redis_cli(a, &["GET", "counter"]), "20000");
    let info = redis_cli(a, &["INFO"]);
    let field = |k: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .unwrap_or_else(|| panic!("{k} in INFO"))
            .trim()
            .parse()
            .unwrap()
    };
    assert!(field("kvqp_requests") >= 110_000);
    assert!(field("kvqp_batches") > 0);
    // Batching: far fewer request batches (one DMA write each) than requests.
    assert!(
        field("kvqp_batches") * 2 < field("kvqp_requests"),
        "{} batches for {} requests",
        field("kvqp_batches"),
        field("kvqp_requests")
    );
}

#[test]
fn a_killed_dpu_closes_its_clients_and_the_host_store_survives_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = start_dpukv(
        dir.path(),
        "lat",
        &[],
        &["--workers", "2", "--partitions", "2"],
    );
    let a = d.endpoints[0];
    for i in 0..100 {
        assert_eq!(
            redis_cli(a, &["SET", &format!("k{i}"), &format!("v{i}")]),
            "OK"
        );
    }
    let mut client = TcpStream::connect(a).unwrap();
    client.write_all(b"PING\r\n").unwrap();
    let mut b = [0u8; 64];
    assert!(client.read(&mut b).unwrap() > 0);
    // kill -9 of the DPU process.
    let mut dpu = d.dpu.take().unwrap();
    dpu.0.kill().unwrap();
    dpu.0.wait().unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = client.write_all(b"GET k1\r\n");
    let n = client.read(&mut b).unwrap_or(0);
    assert_eq!(n, 0, "the client's connection closes with the DPU");
    // A new DPU process: the host attaches again, and everything acknowledged is there.
    let _dpu2: Guard = start_dpukv_dpu(&d.control, &[]);
    let e2 = next_endpoints(&mut d.lines);
    for i in 0..100 {
        assert_eq!(
            redis_cli(e2[0], &["GET", &format!("k{i}")]),
            format!("v{i}")
        );
    }
}

#[test]
fn bad_input_gets_errors_and_the_front_end_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_dpukv(dir.path(), "sav", &[], &["--max-value", "100"]);
    let a = d.endpoints[0];
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut expect = |s: &mut TcpStream, send: &[u8], want: &str| {
        s.write_all(send).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        buf.clear();
        while !buf.ends_with(b"\r\n") && Instant::now() < deadline {
            let mut b = [0u8; 512];
            let n = s.read(&mut b).unwrap_or(0);
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&b[..n]);
        }
        let text = String::from_utf8_lossy(&buf).to_string();
        assert!(text.contains(want), "{send:?}: {text}");
    };
    expect(&mut s, b"NOSUCH a\r\n", "-ERR unknown command");
    expect(&mut s, b"GET\r\n", "wrong number of arguments");
    expect(&mut s, b"INCRBY n x\r\n", "not an integer");
    let big = format!("SET k {}\r\n", "v".repeat(101));
    expect(&mut s, big.as_bytes(), "value too large");
    expect(&mut s, b"DBSIZE\r\n", "host");
    expect(&mut s, b"SET k v\r\n", "+OK");
    // A bulk length beyond the limit, announced before its bytes: refused from the header.
    expect(&mut s, b"*2\r\n$3\r\nGET\r\n$999999999\r\n", "-ERR");
    // Other clients are unaffected.
    assert_eq!(redis_cli(a, &["GET", "k"]), "v");
}

#[test]
fn endpoints_are_registered_in_etcd_and_vanish_with_their_process() {
    let dir = tempfile::tempdir().unwrap();
    let (etcd, url) = common::start_etcd(dir.path());
    let reg = [
        "--etcd",
        url.as_str(),
        "--etcd-cluster",
        "t",
        "--etcd-ttl",
        "2",
    ];
    let mut d = start_dpukv(dir.path(), "dual", &reg, &reg);
    let found = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let v = dds_dpukv::etcd::lookup(&url, "t").unwrap();
            if v.len() == n {
                return v;
            }
            assert!(Instant::now() < deadline, "{n} endpoints expected: {v:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let v = found(2);
    let mut addrs: Vec<String> = v
        .iter()
        .map(|e| e["addr"].as_str().unwrap().to_string())
        .collect();
    addrs.sort();
    let mut want: Vec<String> = d.endpoints.iter().map(|e| e.to_string()).collect();
    want.sort();
    assert_eq!(addrs, want);
    assert!(v.iter().all(|e| e["design"] == "dual"));
    // kill -9 of the DPU: its lease runs out, its endpoint goes; the host's stays.
    let mut dpu = d.dpu.take().unwrap();
    dpu.0.kill().unwrap();
    dpu.0.wait().unwrap();
    let v = found(1);
    assert_eq!(v[0]["role"], "host");
    drop(etcd);
}
