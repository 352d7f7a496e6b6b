//! The S3 part of `dds bench cluster`: `dds s3` on the benchmark's cluster against the native
//! client (`dds_osd::client::Client`) on the same pool, 16 clients, 4 MiB and 64 KiB objects,
//! write then read throughput, and the gateway's CPU per MB moved.
//!
//! Each client overwrites a few names of its own over and over, so the space a run takes
//! stays bounded whatever its length. S3 requests are SigV4-presigned (rusty-s3) and sent
//! with ureq, one connection per client.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dds_objstore::ObjectId;
use dds_osd::client::Client;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::report::{fmt_num, Table, Target};

/// Clients of each run (threads, one request in flight each).
pub const CLIENTS: usize = 16;
/// Names each client overwrites in turn.
const NAMES_PER_CLIENT: u64 = 4;
const ACCESS: &str = "BENCHACCESSKEY";
const SECRET: &str = "bench-secret-key";
const BUCKET: &str = "bench";
/// Lifetime of a presigned URL.
const SIGNED_FOR: Duration = Duration::from_secs(600);

/// Which client a run uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    Native,
    S3,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Write,
    Read,
}

/// One run's result.
struct Run {
    mbs: f64,
    ops: u64,
    errors: u64,
    gateway_cpu_s: f64,
}

/// The S3 part's summary keys, targets and table.
pub struct S3Result {
    pub summary: Value,
    pub targets: Vec<Target>,
    pub table: Table,
}

/// `dds s3` on the cluster in etcd at `url` (cluster `cluster`), pool `pool` (by name).
fn start_gateway(
    exe: &Path,
    dir: &Path,
    url: &str,
    cluster: &str,
) -> Result<(ChildGuard, SocketAddr)> {
    let log = std::fs::File::create(dir.join("s3.log"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["s3", "--etcd", url, "--cluster", cluster, "--pool", "data"])
        .args(["--access-key", ACCESS, "--secret-key", SECRET])
        .stdout(Stdio::piped())
        .stderr(log);
    let mut g = ChildGuard::new(cmd.spawn().context("start dds s3")?, "dds s3");
    let line = g.ready_line(Duration::from_secs(30))?;
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("dds s3: no address on its ready line {line:?}"))?;
    Ok((g, addr))
}

/// The content client `t` writes (a different byte per client and name).
fn content(t: usize, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u32 ^ (t as u32 * 37)) as u8)
        .collect()
}

/// `CLIENTS` threads doing `op` on `size`-byte objects for `secs` seconds.
#[allow(clippy::too_many_arguments)]
fn run(
    via: Via,
    op: Op,
    size: usize,
    secs: f64,
    cl: &Arc<Client>,
    pool: u64,
    bucket: &Bucket,
    gateway: &ChildGuard,
) -> Result<Run> {
    let creds = Credentials::new(ACCESS, SECRET);
    let stop = Arc::new(AtomicBool::new(false));
    let (ops, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let cpu0 = gateway.cpu_seconds();
    let t0 = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (stop, ops, errors) = (stop.clone(), ops.clone(), errors.clone());
            let (cl, bucket, creds) = (cl.clone(), bucket.clone(), creds.clone());
            std::thread::spawn(move || {
                let data = content(t, size);
                let agent = ureq::AgentBuilder::new()
                    .timeout(Duration::from_secs(60))
                    .build();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("s3bench.{size}.{t}.{}", i % NAMES_PER_CLIENT);
                    i += 1;
                    let ok = match (via, op) {
                        (Via::Native, Op::Write) => {
                            cl.write_full(&ObjectId::new(pool, name), &data).is_ok()
                        }
                        (Via::Native, Op::Read) => cl
                            .read_full(&ObjectId::new(pool, name))
                            .is_ok_and(|d| d == data),
                        (Via::S3, Op::Write) => {
                            let u = bucket.put_object(Some(&creds), &name).sign(SIGNED_FOR);
                            agent.put(u.as_str()).send_bytes(&data).is_ok()
                        }
                        (Via::S3, Op::Read) => {
                            let u = bucket.get_object(Some(&creds), &name).sign(SIGNED_FOR);
                            agent.get(u.as_str()).call().is_ok_and(|r| {
                                let mut got = Vec::new();
                                std::io::Read::read_to_end(&mut r.into_reader(), &mut got).is_ok()
                                    && got == data
                            })
                        }
                    };
                    if ok {
                        ops.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let deadline = t0 + Duration::from_secs_f64(secs);
    while Instant::now() < deadline {
        if crate::interrupt::check().is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    crate::interrupt::check()?;
    let elapsed = t0.elapsed().as_secs_f64();
    let ops = ops.load(Ordering::Relaxed);
    Ok(Run {
        mbs: (ops * size as u64) as f64 / 1e6 / elapsed,
        ops,
        errors: errors.load(Ordering::Relaxed),
        gateway_cpu_s: gateway.cpu_seconds() - cpu0,
    })
}

/// The S3 part on the running cluster (etcd `url`, cluster `cluster`, pool `pool` named
/// "data"), `secs` seconds per run.
pub fn throughput(
    exe: &Path,
    dir: &Path,
    url: &str,
    cluster: &str,
    cl: &Arc<Client>,
    pool: u64,
    secs: f64,
) -> Result<S3Result> {
    let (mut gw, addr) = start_gateway(exe, dir, url, cluster)?;
    let endpoint = format!("http://{addr}").parse().context("endpoint")?;
    let bucket = Bucket::new(endpoint, UrlStyle::Path, BUCKET, "us-east-1").context("bucket")?;
    let creds = Credentials::new(ACCESS, SECRET);
    let mk = bucket.create_bucket(&creds).sign(SIGNED_FOR);
    if let Err(e) = ureq::put(mk.as_str()).call() {
        bail!("dds s3: create the bucket: {e}");
    }
    let mut summary = serde_json::Map::new();
    let mut table = Table::new(
        "dds bench cluster: S3 (dds s3) against the native client, 16 clients",
        &[
            "object",
            "op",
            "native MB/s",
            "S3 MB/s",
            "S3 / native",
            "gateway CPU s per GB",
        ],
    );
    let mut targets = Vec::new();
    for (size, label) in [(4usize << 20, "4m"), (64 << 10, "64k")] {
        for op in [Op::Write, Op::Read] {
            let native = run(Via::Native, op, size, secs, cl, pool, &bucket, &gw)?;
            let s3 = run(Via::S3, op, size, secs, cl, pool, &bucket, &gw)?;
            let what = if op == Op::Write { "write" } else { "read" };
            eprintln!(
                "cluster: s3 {label} {what}: native {:.1} MB/s ({} ops, {} errors), \
                 s3 {:.1} MB/s ({} ops, {} errors)",
                native.mbs, native.ops, native.errors, s3.mbs, s3.ops, s3.errors
            );
            if native.ops == 0 || s3.ops == 0 {
                bail!(
                    "s3 {label} {what}: no request completed (native {} s3 {})",
                    native.ops,
                    s3.ops
                );
            }
            let ratio = s3.mbs / native.mbs;
            let gb = (s3.ops * size as u64) as f64 / 1e9;
            let cpu_per_gb = s3.gateway_cpu_s / gb;
            summary.insert(format!("s3_{label}_{what}_mbs"), json!(s3.mbs));
            summary.insert(format!("native_{label}_{what}_mbs"), json!(native.mbs));
            summary.insert(format!("s3_over_native_{label}_{what}_mbs"), json!(ratio));
            summary.insert(format!("s3_{label}_{what}_errors"), json!(s3.errors));
            summary.insert(
                format!("native_{label}_{what}_errors"),
                json!(native.errors),
            );
            summary.insert(
                format!("s3_gateway_cpu_s_per_gb_{label}_{what}"),
                json!(cpu_per_gb),
            );
            if size == 4 << 20 && op == Op::Write {
                summary.insert("s3_over_native_write_mbs".into(), json!(ratio));
                targets.push(Target::at_least("s3_over_native_write_mbs", ratio, 0.8));
            }
            table.row(vec![
                label.into(),
                what.into(),
                fmt_num(native.mbs),
                fmt_num(s3.mbs),
                fmt_num(ratio),
                fmt_num(cpu_per_gb),
            ]);
        }
    }
    summary.insert("s3_clients".into(), json!(CLIENTS));
    summary.insert("s3_seconds_per_run".into(), json!(secs));
    let _ = gw.stop(Duration::from_secs(5));
    Ok(S3Result {
        summary: Value::Object(summary),
        targets,
        table,
    })
}
