//! The collection workloads of `dds bench kv`: redis-benchmark's collection tests against
//! every side, the log bytes one HSET appends to a large hash, and HGETs of random fields of
//! a hash larger than the server's memory (with and without the DPU serving them).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::load::push_cmd;
use super::{measure_redis_benchmark, Mode, Plan, Side};

/// redis-benchmark's collection tests, run in this order (the pops after the pushes).
pub(super) const SERVED: &[&str] = &[
    "hset",
    "sadd",
    "spop",
    "zadd",
    "zpopmin",
    "lpush",
    "rpush",
    "lpop",
    "rpop",
    "lrange_100",
];

/// One redis-benchmark collection test on one side.
#[derive(Clone, Debug, Serialize)]
pub(super) struct CollPoint {
    pub mode: &'static str,
    pub test: &'static str,
    pub requests_per_sec: f64,
    pub host_cpu_us_per_op: f64,
    pub dpu_cpu_us_per_op: f64,
}

/// Runs each served test (50 clients, no pipelining, `-r` over the plan's redis-benchmark
/// keys) on `side`, with the server's CPU per request.
pub(super) fn run(side: &Side, mode: Mode, p: &Plan) -> Result<Vec<CollPoint>> {
    let mut out = Vec::new();
    for &test in SERVED {
        // The test's CSV line: `"LPUSH","…` or `"LRANGE_100 (first 100 elements)","…`.
        let name = format!("\"{}", test.to_ascii_uppercase());
        let r = measure_redis_benchmark(
            side,
            &["-t", test, "-c", "50", "-r", &p.rb_keys.to_string()],
            p.requests,
            |l| {
                l.strip_prefix(&name)
                    .is_some_and(|rest| rest.starts_with('"') || rest.starts_with(" ("))
            },
        )?;
        let pt = CollPoint {
            mode: mode.name(),
            test,
            requests_per_sec: r.requests_per_sec,
            host_cpu_us_per_op: r.host_cpu_us_per_op,
            dpu_cpu_us_per_op: r.dpu_cpu_us_per_op,
        };
        eprintln!(
            "  redis-benchmark {test:<5} {:>9.0} req/s  host {:>6.2} µs/op",
            pt.requests_per_sec, pt.host_cpu_us_per_op
        );
        out.push(pt);
    }
    Ok(out)
}

/// Log bytes per HSET of a new field on a large hash, against the bytes of the field, its
/// value and one record header (32). The log's growth counts the HSETs' own records (and
/// the ends of pages they leave unused); what compaction moved to the tail meanwhile is the
/// log's garbage collection, reported beside.
#[derive(Clone, Debug, Serialize)]
pub(super) struct HsetBytes {
    pub hash_fields: u64,
    pub hsets_measured: u64,
    pub log_bytes_per_hset: f64,
    pub compaction_bytes_per_hset: f64,
    pub element_bytes: u64,
    pub ratio: f64,
}

const VALUE: &[u8] = b"vvvvvvvv";

/// The large hash's key.
pub(super) const BIG_HASH: &str = "bench:bighash";

/// Field `i` of the large hash: redis-benchmark's `__rand_int__` (12 digits) after `field:`.
fn field(i: u64) -> String {
    format!("field:{i:012}")
}

/// Pipelined `HSET key field value` for fields `from..to`, each reply checked.
fn hsets(s: &mut TcpStream, key: &str, from: u64, to: u64) -> Result<()> {
    let mut sink = vec![0u8; 1 << 16];
    let mut i = from;
    while i < to {
        let end = (i + 1000).min(to);
        let mut out = Vec::new();
        for f in i..end {
            push_cmd(
                &mut out,
                &[b"HSET", key.as_bytes(), field(f).as_bytes(), VALUE],
            );
        }
        s.write_all(&out)?;
        // Each reply is `:1\r\n` (a new field).
        let want = (end - i) as usize * 4;
        let mut got = 0;
        while got < want {
            let m = s.read(&mut sink)?;
            if m == 0 {
                bail!("the server closed the connection during HSETs");
            }
            if sink[..m].contains(&b'-') {
                bail!("HSET failed: {}", String::from_utf8_lossy(&sink[..m]));
            }
            got += m;
        }
        i = end;
    }
    Ok(())
}

/// `log_tail` and `compaction_moved_bytes` from `INFO engine`.
fn log_tail(s: &mut TcpStream) -> Result<(u64, u64)> {
    let mut cmd = Vec::new();
    push_cmd(&mut cmd, &[b"INFO", b"engine"]);
    s.write_all(&cmd)?;
    let mut text = Vec::new();
    let mut b = [0u8; 4096];
    // A bulk reply: `$<len>\r\n` + text + `\r\n`.
    loop {
        let m = s.read(&mut b)?;
        if m == 0 {
            bail!("the server closed the connection during INFO");
        }
        text.extend_from_slice(&b[..m]);
        if let Some(nl) = text.windows(2).position(|w| w == b"\r\n") {
            let len: usize = std::str::from_utf8(&text[1..nl])?.parse()?;
            if text.len() >= nl + 2 + len + 2 {
                break;
            }
        }
    }
    let t = String::from_utf8_lossy(&text);
    let field = |name: &str| {
        t.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("INFO engine has no {name}"))
    };
    Ok((field("log_tail:")?, field("compaction_moved_bytes:")?))
}

/// Builds the large hash of `fields` fields at `addr` (HSETs pipelined).
pub(super) fn build_hash(addr: SocketAddr, fields: u64) -> Result<()> {
    let mut s = TcpStream::connect(addr)?;
    let bar = crate::progress::bar(fields, false);
    bar.set_message(format!("HSET: a hash of {fields} fields"));
    let mut at = 0;
    while at < fields {
        let end = (at + 100_000).min(fields);
        hsets(&mut s, BIG_HASH, at, end)?;
        at = end;
        bar.set_position(at);
    }
    bar.finish_and_clear();
    Ok(())
}

/// HGETs of random fields of the large hash on one side.
#[derive(Clone, Debug, Serialize)]
pub(super) struct HgetPoint {
    pub mode: &'static str,
    pub hash_fields: u64,
    pub clients: usize,
    pub requests_per_sec: f64,
    pub host_cpu_us_per_op: f64,
    pub dpu_cpu_us_per_op: f64,
    /// HGETs the DPU answered, over all.
    pub dpu_fraction: f64,
}

/// redis-benchmark `HGET bench:bighash field:__rand_int__` (50 clients, no pipelining) over
/// the hash's `fields` fields, with the server's CPU per request.
pub(super) fn hgets(side: &Side, mode: Mode, p: &Plan, fields: u64) -> Result<HgetPoint> {
    let r = measure_redis_benchmark(
        side,
        &[
            "-c",
            "50",
            "-r",
            &fields.to_string(),
            "HGET",
            BIG_HASH,
            "field:__rand_int__",
        ],
        p.requests,
        |l| l.starts_with("\"HGET"),
    )?;
    let pt = HgetPoint {
        mode: mode.name(),
        hash_fields: fields,
        clients: 50,
        requests_per_sec: r.requests_per_sec,
        host_cpu_us_per_op: r.host_cpu_us_per_op,
        dpu_cpu_us_per_op: r.dpu_cpu_us_per_op,
        dpu_fraction: r.dpu_fraction,
    };
    eprintln!(
        "  HGET of {fields} fields {:>9.0} req/s  host {:>6.2} µs/op  dpu {:>6.2} µs/op  DPU HGETs {:.2}",
        pt.requests_per_sec, pt.host_cpu_us_per_op, pt.dpu_cpu_us_per_op, pt.dpu_fraction
    );
    Ok(pt)
}

/// On the large hash of `fields` fields at `addr` (built already), measures the log bytes
/// of 1,000 HSETs of new fields.
pub(super) fn hset_log_bytes(addr: SocketAddr, fields: u64) -> Result<HsetBytes> {
    let mut s = TcpStream::connect(addr)?;
    let n = 1000;
    let (t0, m0) = log_tail(&mut s)?;
    hsets(&mut s, BIG_HASH, fields, fields + n)?;
    let (t1, m1) = log_tail(&mut s)?;
    let moved = m1 - m0;
    let per = (t1 - t0).saturating_sub(moved) as f64 / n as f64;
    let element = (field(0).len() + VALUE.len() + 32) as u64;
    Ok(HsetBytes {
        hash_fields: fields,
        hsets_measured: n,
        log_bytes_per_hset: per,
        compaction_bytes_per_hset: moved as f64 / n as f64,
        element_bytes: element,
        ratio: per / element as f64,
    })
}
