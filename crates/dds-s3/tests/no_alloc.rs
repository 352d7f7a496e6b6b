//! What the gateway's request path allocates once warm: `dds s3` (one worker thread) on an
//! OSD in this process, driven by boto3 over one kept-alive connection: PutObject and
//! GetObject of 256 KiB objects, HeadObject and a ListObjectsV2 of a few keys, each signed
//! with SigV4. The worker thread (HTTP, S3 routing, SigV4, the gateway's handlers) is counted;
//! the cluster calls run on the blocking pool (the cluster client's API returns owned
//! buffers) and are not. `DDS_ALLOC_BACKTRACE=1` prints where each counted allocation came
//! from.
//!
//! The path is not allocation-free: the HTTP and S3 layers (`hyper`, `s3s`) build owned
//! request and response structures (header maps, the SigV4 canonical request, the operation's
//! input and output as `String`s, the XML of a listing), the `S3` trait's handlers are boxed
//! futures, and each cluster call is a task on the blocking pool. What the test holds the path
//! to is a bound per operation on the allocations and bytes of a request (`BOUNDS`), measured
//! with the gateway's own strings moved rather than copied into the answers and its stripe
//! buffers reused.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dds_osd::client::{Client, ClientOptions};
use dds_osd::{open_store, ClusterMap, Osd, OsdConfig, StoreSpec};
use dds_testkit::alloc::{
    allocated_bytes, allocations, count_thread_id, thread_named, CountingAlloc,
};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const ACCESS: &str = "DDSTESTACCESSKEY";
const SECRET: &str = "dds-test-secret-key-0123456789";
/// Object size: below one stripe, far above any small block.
const SIZE: usize = 256 << 10;
/// Requests of each operation measured.
const REQUESTS: usize = 50;

/// The client: warms up, says "warm", then for each line it reads runs the requests of one
/// operation (`put`, `get`, `head`, `list`) and answers with the operation's name.
const CLIENT: &str = r#"
import sys
import boto3
from botocore.config import Config
endpoint, access, secret, size, n = sys.argv[1:6]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                  aws_secret_access_key=secret, region_name="us-east-1",
                  config=Config(signature_version="s3v4", max_pool_connections=1,
                                retries={"max_attempts": 1}))
bodies = [bytes([i]) * int(size) for i in range(4)]
def put(i):
    s3.put_object(Bucket="alloc", Key="obj-%d" % (i % 4), Body=bodies[i % 4])
def get(i):
    got = s3.get_object(Bucket="alloc", Key="obj-%d" % (i % 4))["Body"].read()
    assert got == bodies[i % 4], "the data written"
def head(i):
    assert s3.head_object(Bucket="alloc", Key="obj-%d" % (i % 4))["ContentLength"] == int(size)
def list(i):
    assert s3.list_objects_v2(Bucket="alloc", MaxKeys=10)["KeyCount"] == 4
ops = {"put": put, "get": get, "head": head, "list": list}
s3.create_bucket(Bucket="alloc")
for i in range(4):
    put(i)
for i in range(4 * int(n)):
    for op in ops.values():
        op(i)
print("warm", flush=True)
for line in sys.stdin:
    for i in range(int(n)):
        ops[line.strip()](i)
    print(line.strip(), flush=True)
"#;

/// Per operation: allocations and bytes a request may make on the worker thread (what the
/// HTTP and S3 layers and the handler allocate; see the module documentation). A PutObject's
/// body passes through the HTTP layer's read buffer (at most 64 KiB), which hands each chunk
/// on as a shared `Bytes` and so takes a new block for a read while the gateway still copies
/// the last chunk into its stripe buffer: measured, about half the body in 64 KiB blocks. The
/// others allocate no block that grows with the object.
const BOUNDS: [(&str, usize, usize); 4] = [
    ("put", 60, SIZE),
    ("get", 50, 32 << 10),
    ("head", 42, 32 << 10),
    ("list", 80, 32 << 10),
];

#[test]
fn request_path_allocates_a_bounded_few_small_blocks() {
    let _alone = dds_testkit::alloc::measure_alone();
    let dir = tempfile::tempdir().unwrap();
    let text = "epoch = 1\n[[osd]]\nid = 0\naddr = \"127.0.0.1:0\"\npeer_addr = \
                \"127.0.0.1:0\"\n[[pool]]\nid = 1\nname = \"data\"\npg_num = 8\nsize = 1\n";
    let mut map = ClusterMap::parse(text).unwrap();
    let store = open_store(&StoreSpec::Local {
        device: dir.path().join("osd0.img"),
        format: Some((256 << 20, false)),
    })
    .unwrap();
    let mut cfg = OsdConfig::new(0, map.clone());
    cfg.peering_interval = Duration::from_millis(50);
    let osd = Osd::start(cfg, Arc::clone(&store)).unwrap();
    map.epoch = 2;
    map.osds[0].addr = osd.client_addr();
    map.osds[0].peer_addr = osd.peer_addr();
    osd.set_map(map.clone()).unwrap();
    let client = Client::with_map(map, ClientOptions::default());

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let cfg = dds_s3::Config {
            pool: 1,
            access_key: ACCESS.into(),
            secret_key: SECRET.into(),
            threads: 1,
            stripe_buffers: 4,
            max_connections: 16,
            orphan_grace: Duration::from_secs(3600),
            sweep_interval: Duration::ZERO,
        };
        dds_s3::serve(client, listener, cfg, |_| {}).unwrap();
    });

    let script = dir.path().join("client.py");
    std::fs::write(&script, CLIENT).unwrap();
    let mut py = Command::new("python3")
        .arg(&script)
        .arg(format!("http://{addr}"))
        .args([ACCESS, SECRET, &SIZE.to_string(), &REQUESTS.to_string()])
        .env("AWS_CONFIG_FILE", dir.path().join("no-aws-config"))
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            dir.path().join("no-aws-creds"),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with boto3 (pip install boto3)");
    let mut lines = BufReader::new(py.stdout.take().unwrap()).lines();
    let line = |l: Option<std::io::Result<String>>| l.map(|l| l.unwrap()).unwrap_or_default();
    assert_eq!(line(lines.next()), "warm", "the client's warm-up failed");

    let worker = thread_named("s3-worker");
    let mut input = py.stdin.take().unwrap();
    let mut over = Vec::new();
    for (op, max_allocs, max_bytes) in BOUNDS {
        count_thread_id(worker);
        let (n0, b0) = (allocations(), allocated_bytes());
        writeln!(input, "{op}").unwrap();
        let answer = line(lines.next());
        let (n, bytes) = (allocations() - n0, allocated_bytes() - b0);
        count_thread_id(0);
        assert_eq!(answer, op, "the client's {op} requests failed");
        let (per, bytes_per) = (n / REQUESTS, bytes / REQUESTS);
        println!("{op}: {per} allocations, {bytes_per} bytes per request on the s3 worker");
        if per > max_allocs || bytes_per > max_bytes {
            over.push(format!(
                "{op}: {per} allocations ({max_allocs} allowed), {bytes_per} bytes \
                 ({max_bytes} allowed) per request"
            ));
        }
    }
    drop(input);
    assert!(py.wait().unwrap().success());
    assert!(over.is_empty(), "{over:#?}");
    osd.shutdown();
}
