//! The S3 part of `dds bench cluster`: `dds s3` on the benchmark's cluster against the native
//! client (`dds_osd::client::Client`) on the same pool, 16 clients, 4 MiB and 64 KiB objects,
//! write then read throughput, and the gateway's CPU per MB moved.
//!
//! Each client overwrites a few names of its own over and over, so the space a run takes
//! stays bounded whatever its length. Before the write run of each object size every client
//! writes each of its names once (not timed), so that the write run only overwrites and the
//! read run finds every name, however few writes the timed run made. S3 requests are
//! SigV4-presigned (rusty-s3) and sent with ureq, one connection per client.

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
use crate::cpu::process_cpu_seconds;
use crate::objects::ceph;
use crate::objects::cgroup::CpuBudget;
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
#[derive(Clone, Copy, Debug)]
struct Run {
    mbs: f64,
    ops: u64,
    /// Requests that failed.
    errors: u64,
    /// Reads that returned other bytes than their name's last write.
    wrong: u64,
    /// CPU seconds of the gateway during the run.
    gateway_cpu_s: f64,
    /// CPU seconds of every host server process (gateway, OSDs or their stores, monitor)
    /// during the run.
    server_cpu_s: f64,
    /// CPU seconds of the OSD front ends on the emulated DPU during the run (placement dpu).
    dpu_cpu_s: f64,
}

impl Run {
    /// MB moved by the run's `size`-byte requests.
    fn mb(&self, size: usize) -> f64 {
        (self.ops * size as u64) as f64 / 1e6
    }

    /// `cpu_s` CPU seconds as milliseconds per MB moved.
    fn ms_per_mb(&self, cpu_s: f64, size: usize) -> f64 {
        cpu_s * 1e3 / self.mb(size)
    }

    /// "N ops, N errors, N wrong".
    fn counts(&self) -> String {
        format!(
            "{} ops, {} errors, {} wrong",
            self.ops, self.errors, self.wrong
        )
    }

    /// Host server CPU milliseconds per MB moved.
    fn server_ms_per_mb(&self, size: usize) -> f64 {
        self.ms_per_mb(self.server_cpu_s, size)
    }
}

/// The object sizes and operations of the S3 part, in the order they run.
const CASES: [(usize, &str, Op); 4] = [
    (4 << 20, "4m", Op::Write),
    (4 << 20, "4m", Op::Read),
    (64 << 10, "64k", Op::Write),
    (64 << 10, "64k", Op::Read),
];

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::Read => "read",
    }
}

/// The S3 part's summary keys, targets and tables.
pub struct S3Result {
    pub summary: Value,
    pub targets: Vec<Target>,
    pub tables: Vec<Table>,
    /// `dds s3`'s run of each of [`CASES`].
    dds: Vec<Run>,
}

/// Where a run sends its S3 requests, and whose CPU it counts.
struct Server<'a> {
    bucket: &'a Bucket,
    gateway_cpu: &'a dyn Fn() -> f64,
    server_cpu: &'a dyn Fn() -> f64,
    dpu_cpu: &'a dyn Fn() -> f64,
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

/// What one request came to (its counter's index in a run).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Done = 0,
    Failed = 1,
    /// A read that returned other bytes than were written.
    Wrong = 2,
}

/// One client thread's connection and data.
struct Worker {
    via: Via,
    native: Option<(Arc<Client>, u64)>,
    bucket: Bucket,
    creds: Credentials,
    agent: ureq::Agent,
    data: Vec<u8>,
}

impl Worker {
    fn new(
        t: usize,
        via: Via,
        size: usize,
        native: Option<(&Arc<Client>, u64)>,
        srv: &Server,
    ) -> Worker {
        Worker {
            via,
            native: native.map(|(cl, pool)| (cl.clone(), pool)),
            bucket: srv.bucket.clone(),
            creds: Credentials::new(ACCESS, SECRET),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .build(),
            data: content(t, size),
        }
    }

    /// The `i`-th name of client `t`'s (of objects of `size` bytes).
    fn name(t: usize, size: usize, i: u64) -> String {
        format!("s3bench.{size}.{t}.{}", i % NAMES_PER_CLIENT)
    }

    fn op(&self, op: Op, name: &str) -> Outcome {
        let read = |got: Option<Vec<u8>>| match got {
            None => Outcome::Failed,
            Some(d) if d == self.data => Outcome::Done,
            Some(_) => Outcome::Wrong,
        };
        let done = |ok: bool| if ok { Outcome::Done } else { Outcome::Failed };
        match (self.via, op, &self.native) {
            (Via::Native, _, None) => Outcome::Failed,
            (Via::Native, Op::Write, Some((cl, pool))) => done(
                cl.write_full(&ObjectId::new(*pool, name), &self.data)
                    .is_ok(),
            ),
            (Via::Native, Op::Read, Some((cl, pool))) => {
                read(cl.read_full(&ObjectId::new(*pool, name)).ok())
            }
            (Via::S3, Op::Write, _) => {
                let u = self
                    .bucket
                    .put_object(Some(&self.creds), name)
                    .sign(SIGNED_FOR);
                done(self.agent.put(u.as_str()).send_bytes(&self.data).is_ok())
            }
            (Via::S3, Op::Read, _) => {
                let u = self
                    .bucket
                    .get_object(Some(&self.creds), name)
                    .sign(SIGNED_FOR);
                read(self.agent.get(u.as_str()).call().ok().and_then(|r| {
                    let mut got = Vec::new();
                    std::io::Read::read_to_end(&mut r.into_reader(), &mut got).ok()?;
                    Some(got)
                }))
            }
        }
    }
}

/// Every client writes each of its names of `size`-byte objects once (not timed).
fn prefill(via: Via, size: usize, native: Option<(&Arc<Client>, u64)>, srv: &Server) -> Result<()> {
    let failed = std::thread::scope(|s| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let w = Worker::new(t, via, size, native, srv);
                s.spawn(move || {
                    (0..NAMES_PER_CLIENT)
                        .filter(|&i| w.op(Op::Write, &Worker::name(t, size, i)) != Outcome::Done)
                        .count()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or(NAMES_PER_CLIENT as usize))
            .sum::<usize>()
    });
    if failed > 0 {
        bail!("writing the {via:?} run's names of {size} bytes: {failed} writes failed");
    }
    Ok(())
}

/// `CLIENTS` threads doing `op` on `size`-byte objects for `secs` seconds, through the native
/// client `cl` (pool `pool`) or S3 to `srv` (`cl` is then unused and may be `None`). Before a
/// write run, the names are written once ([`prefill`]).
fn run(
    via: Via,
    op: Op,
    size: usize,
    secs: f64,
    native: Option<(&Arc<Client>, u64)>,
    srv: &Server,
) -> Result<Run> {
    if op == Op::Write {
        prefill(via, size, native, srv)?;
    }
    let stop = AtomicBool::new(false);
    let counts = [(); 3].map(|_| AtomicU64::new(0));
    let (gw0, srv0, dpu0) = ((srv.gateway_cpu)(), (srv.server_cpu)(), (srv.dpu_cpu)());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..CLIENTS {
            let w = Worker::new(t, via, size, native, srv);
            let (stop, counts) = (&stop, &counts);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let outcome = w.op(op, &Worker::name(t, size, i));
                    i += 1;
                    counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let deadline = t0 + Duration::from_secs_f64(secs);
        while Instant::now() < deadline && crate::interrupt::check().is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
    });
    crate::interrupt::check()?;
    let elapsed = t0.elapsed().as_secs_f64();
    let [ops, errors, wrong] = counts.map(|c| c.into_inner());
    Ok(Run {
        mbs: (ops * size as u64) as f64 / 1e6 / elapsed,
        ops,
        errors,
        wrong,
        gateway_cpu_s: (srv.gateway_cpu)() - gw0,
        server_cpu_s: (srv.server_cpu)() - srv0,
        dpu_cpu_s: (srv.dpu_cpu)() - dpu0,
    })
}

/// Makes the benchmark's bucket on the S3 endpoint `addr`.
fn make_bucket(addr: SocketAddr, who: &str) -> Result<Bucket> {
    let endpoint = format!("http://{addr}").parse().context("endpoint")?;
    let bucket = Bucket::new(endpoint, UrlStyle::Path, BUCKET, "us-east-1").context("bucket")?;
    let creds = Credentials::new(ACCESS, SECRET);
    let mk = bucket.create_bucket(&creds).sign(SIGNED_FOR);
    if let Err(e) = ureq::put(mk.as_str()).call() {
        bail!("{who}: create the bucket: {e}");
    }
    Ok(bucket)
}

/// CPU seconds of the processes `pids` so far (a process gone counts 0).
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .map(|&p| process_cpu_seconds(p).unwrap_or(0.0))
        .sum()
}

/// The S3 part on the running cluster (etcd `url`, cluster `cluster`, pool `pool` named
/// "data"), `secs` seconds per run. `host` are the cluster's host processes (OSDs or their
/// stores, etcd): with the gateway, the server CPU of a run; `dpu` the OSD front ends on the
/// emulated DPU (placement dpu), whose CPU is reported apart.
#[allow(clippy::too_many_arguments)]
pub fn throughput(
    exe: &Path,
    dir: &Path,
    url: &str,
    cluster: &str,
    cl: &Arc<Client>,
    pool: u64,
    secs: f64,
    host: &[u32],
    dpu: &[u32],
) -> Result<S3Result> {
    let (mut gw, addr) = start_gateway(exe, dir, url, cluster)?;
    let bucket = make_bucket(addr, "dds s3")?;
    let gw_pid = gw.pid();
    let gateway_cpu = move || process_cpu_seconds(gw_pid).unwrap_or(0.0);
    let mut all = host.to_vec();
    all.push(gw_pid);
    let server_cpu = move || cpu_of(&all);
    let dpu_cpu = || cpu_of(dpu);
    let srv = Server {
        bucket: &bucket,
        gateway_cpu: &gateway_cpu,
        server_cpu: &server_cpu,
        dpu_cpu: &dpu_cpu,
    };
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
            "host CPU ms per MB",
            "DPU CPU ms per MB",
        ],
    );
    let mut targets = Vec::new();
    let mut dds = Vec::new();
    for (size, label, op) in CASES {
        let native = run(Via::Native, op, size, secs, Some((cl, pool)), &srv)?;
        let s3 = run(Via::S3, op, size, secs, None, &srv)?;
        let dpu_ms_per_mb = s3.ms_per_mb(s3.dpu_cpu_s, size);
        let what = op_name(op);
        eprintln!(
            "cluster: s3 {label} {what}: native {:.1} MB/s ({}), s3 {:.1} MB/s ({})",
            native.mbs,
            native.counts(),
            s3.mbs,
            s3.counts()
        );
        if native.ops == 0 || s3.ops == 0 {
            bail!(
                "s3 {label} {what}: no request completed (native {} s3 {})",
                native.ops,
                s3.ops
            );
        }
        let ratio = s3.mbs / native.mbs;
        let cpu_per_gb = s3.gateway_cpu_s / (s3.mb(size) / 1e3);
        summary.insert(format!("s3_{label}_{what}_mbs"), json!(s3.mbs));
        summary.insert(format!("native_{label}_{what}_mbs"), json!(native.mbs));
        summary.insert(format!("s3_over_native_{label}_{what}_mbs"), json!(ratio));
        for (side, r) in [("s3", &s3), ("native", &native)] {
            summary.insert(format!("{side}_{label}_{what}_errors"), json!(r.errors));
            summary.insert(format!("{side}_{label}_{what}_wrong"), json!(r.wrong));
        }
        summary.insert(
            format!("s3_gateway_cpu_s_per_gb_{label}_{what}"),
            json!(cpu_per_gb),
        );
        summary.insert(
            format!("s3_server_cpu_ms_per_mb_{label}_{what}"),
            json!(s3.server_ms_per_mb(size)),
        );
        summary.insert(
            format!("s3_dpu_cpu_ms_per_mb_{label}_{what}"),
            json!(dpu_ms_per_mb),
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
            fmt_num(s3.server_ms_per_mb(size)),
            fmt_num(dpu_ms_per_mb),
        ]);
        dds.push(s3);
    }
    summary.insert("s3_clients".into(), json!(CLIENTS));
    summary.insert("s3_seconds_per_run".into(), json!(secs));
    let _ = gw.stop(Duration::from_secs(5));
    Ok(S3Result {
        summary: Value::Object(summary),
        targets,
        tables: vec![table],
        dds,
    })
}

/// The keys of the RGW comparison: S3 write throughput of `dds s3` over RGW's (4 MiB objects),
/// and the servers' CPU per MB written, `dds s3` over RGW.
const RGW_KEYS: [&str; 2] = ["s3_over_rgw_write_mbs", "s3_host_cpu_per_mb_over_rgw"];

fn rgw_targets(write_ratio: f64, cpu_ratio: f64) -> [Target; 2] {
    [
        Target::at_least(RGW_KEYS[0], write_ratio, 1.0),
        Target::at_most(RGW_KEYS[1], cpu_ratio, 0.5),
    ]
}

/// Records that RGW did not run (`why`): its target keys are there, not measured.
pub fn rgw_not_run(r: &mut S3Result, why: &str) {
    if let Value::Object(m) = &mut r.summary {
        for k in RGW_KEYS {
            m.insert(k.into(), Value::Null);
        }
        m.insert("rgw".into(), json!(format!("not run: {why}")));
    }
    r.targets.extend(rgw_targets(f64::NAN, f64::NAN));
}

/// How RGW runs beside `dds s3`.
pub struct RgwOpts<'a> {
    pub dir: &'a Path,
    /// The Ceph monitor's port (a monitor's address is part of its map: it cannot take port 0).
    pub ceph_port: u16,
    /// RGW's S3 port.
    pub rgw_port: u16,
    /// OSDs and pool size, as the `dds osd` cluster's.
    pub osds: usize,
    pub size: u32,
    pub device_size: u64,
    pub secs: f64,
}

/// The same S3 workload against Ceph's RGW on a Ceph cluster of the same shape (`o.osds`
/// BlueStore OSDs on files in `o.dir`, pools of `o.size` replicas), brought up and torn down
/// here, after `dds s3`'s runs in `r` and with the `dds osd` cluster stopped.
pub fn against_rgw(r: &mut S3Result, o: &RgwOpts) -> Result<()> {
    crate::objects::ceph::check_installed("--with-rgw", true)?;
    eprintln!(
        "cluster: RGW on Ceph (mon + {} BlueStore OSDs on files, size {}) ...",
        o.osds, o.size
    );
    let t = Instant::now();
    let (global, sections) = ceph::rgw_conf(o.dir, o.rgw_port, o.size);
    let budget = CpuBudget::none();
    let mut c = ceph::start(
        &ceph::Setup {
            dir: o.dir,
            port: o.ceph_port,
            osds: o.osds,
            device_size: o.device_size,
            pools: &[],
            pg_num: 16,
            host_cpus: None,
            global: &global,
            sections: &sections,
        },
        &budget,
    )?;
    let res = (|| -> Result<Vec<Run>> {
        ceph::start_rgw(&mut c, o.rgw_port, ACCESS, SECRET, &budget)?;
        eprintln!("cluster: RGW up in {:.1} s", t.elapsed().as_secs_f64());
        let addr = SocketAddr::from(([127, 0, 0, 1], o.rgw_port));
        let bucket = make_bucket(addr, "radosgw")?;
        let rgw_cpu = || c.rgw_cpu();
        let all_cpu = || c.cpu();
        let srv = Server {
            bucket: &bucket,
            gateway_cpu: &rgw_cpu,
            server_cpu: &all_cpu,
            dpu_cpu: &|| 0.0,
        };
        let mut runs = Vec::new();
        for (size, label, op) in CASES {
            let x = run(Via::S3, op, size, o.secs, None, &srv)?;
            eprintln!(
                "cluster: rgw {label} {}: {:.1} MB/s ({})",
                op_name(op),
                x.mbs,
                x.counts()
            );
            if x.ops == 0 {
                bail!("rgw {label} {}: no request completed", op_name(op));
            }
            runs.push(x);
        }
        Ok(runs)
    })();
    c.stop();
    let rgw = res?;
    let mut table = Table::new(
        "dds bench cluster: S3, dds s3 against Ceph's RGW (same OSD count and pool size), 16 \
         clients",
        &[
            "object",
            "op",
            "dds s3 MB/s",
            "RGW MB/s",
            "dds s3 / RGW",
            "dds s3 host CPU ms/MB",
            "RGW server CPU ms/MB",
            "dds s3 / RGW CPU",
        ],
    );
    let Value::Object(m) = &mut r.summary else {
        bail!("summary is not an object");
    };
    let mut headline = (f64::NAN, f64::NAN);
    for (((size, label, op), d), g) in CASES.iter().zip(&r.dds).zip(&rgw) {
        let what = op_name(*op);
        let ratio = d.mbs / g.mbs;
        let (dc, gc) = (d.server_ms_per_mb(*size), g.server_ms_per_mb(*size));
        m.insert(format!("rgw_{label}_{what}_mbs"), json!(g.mbs));
        m.insert(format!("rgw_{label}_{what}_errors"), json!(g.errors));
        m.insert(format!("rgw_{label}_{what}_wrong"), json!(g.wrong));
        m.insert(format!("s3_over_rgw_{label}_{what}_mbs"), json!(ratio));
        m.insert(
            format!("rgw_server_cpu_ms_per_mb_{label}_{what}"),
            json!(gc),
        );
        m.insert(
            format!("rgw_gateway_cpu_ms_per_mb_{label}_{what}"),
            json!(g.ms_per_mb(g.gateway_cpu_s, *size)),
        );
        if *size == 4 << 20 && *op == Op::Write {
            headline = (ratio, dc / gc);
        }
        table.row(vec![
            (*label).into(),
            what.into(),
            fmt_num(d.mbs),
            fmt_num(g.mbs),
            fmt_num(ratio),
            fmt_num(dc),
            fmt_num(gc),
            fmt_num(dc / gc),
        ]);
    }
    m.insert(RGW_KEYS[0].into(), json!(headline.0));
    m.insert(RGW_KEYS[1].into(), json!(headline.1));
    m.insert(
        "rgw".into(),
        json!(format!(
            "radosgw (beast) on 1 mon + {} BlueStore OSDs on files, pools of size {}, auth none",
            o.osds, o.size
        )),
    );
    r.targets.extend(rgw_targets(headline.0, headline.1));
    r.tables.push(table);
    Ok(())
}
