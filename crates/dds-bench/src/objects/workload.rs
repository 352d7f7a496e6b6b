//! One measurement point as `rados bench` runs it: the write, seq and rand phases of C client
//! threads with one op in flight each, their latency histograms and throughput, and the removal
//! of the written objects.

use super::cluster::Cluster;
use super::{size_label, Plan, OSDS};
use crate::report::ratio;
use anyhow::{bail, Result};
use dds_objstore::ObjectId;
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What one phase measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    pub ops: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub ops_per_s: f64,
    pub lat_avg_ms: f64,
    pub lat_p50_ms: f64,
    pub lat_p99_ms: f64,
    pub lat_max_ms: f64,
    /// Host-side CPU time / wall time (cores).
    pub host_cores: f64,
    pub dpu_cores: f64,
    /// CPU milliseconds per MB moved by the clients.
    pub host_cpu_ms_per_mb: f64,
    pub dpu_cpu_ms_per_mb: f64,
    /// Every second: (seconds since the phase began, host cores, DPU cores).
    pub samples: Vec<(f64, f64, f64)>,
    /// Writes stopped at the device budget before the time was up.
    pub capped: bool,
}

/// One measured point: a placement, pool size, object size and client count.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub system: String,
    pub placement: String,
    pub replication: u32,
    pub object_size: u64,
    pub clients: usize,
    /// Flow-Adapt (batching and chunking) of the DPU front ends.
    pub flow_adapt: bool,
    pub write: Phase,
    pub seq: Phase,
    pub rand: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Write,
    Seq,
    Rand,
}

fn obj(pool: u64, n: u64) -> ObjectId {
    ObjectId::new(pool, format!("benchmark_data_{n}").into_bytes())
}

/// Runs one phase; returns it and (for writes) how many objects exist.
#[allow(clippy::too_many_arguments)]
pub(super) fn phase(
    c: &Cluster,
    pool: u64,
    size: u64,
    clients: usize,
    kind: Kind,
    seconds: f64,
    objects: u64,
    cap: u64,
) -> Result<(Phase, u64)> {
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let capped = AtomicBool::new(false);
    let (h0, d0) = c.cpu();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(seconds);
    let mut samples = Vec::new();
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..clients)
            .map(|t| {
                let (next, done, stop, capped) = (&next, &done, &stop, &capped);
                sc.spawn(move || -> Result<(u64, Histogram<u64>)> {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
                    let mut rng = SmallRng::seed_from_u64(t as u64 * 7919 + 11);
                    let mut buf = vec![0u8; size as usize];
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = (i as u8).wrapping_mul(31).wrapping_add(t as u8);
                    }
                    let mut ops = 0;
                    loop {
                        if stop.load(Ordering::Relaxed)
                            || crate::interrupt::requested()
                            || (kind != Kind::Seq && Instant::now() >= deadline)
                        {
                            break;
                        }
                        let n = match kind {
                            Kind::Write | Kind::Seq => next.fetch_add(1, Ordering::Relaxed),
                            Kind::Rand => rng.gen_range(0..objects.max(1)),
                        };
                        let limit = if kind == Kind::Write { cap } else { objects };
                        if n >= limit {
                            if kind == Kind::Write {
                                capped.store(true, Ordering::Relaxed);
                            }
                            break;
                        }
                        let at = Instant::now();
                        if kind == Kind::Write {
                            let k = buf.len().min(8);
                            buf[..k].copy_from_slice(&n.to_le_bytes()[..k]);
                            c.client
                                .write_full(&obj(pool, n), &buf)
                                .map_err(|e| anyhow::anyhow!("write benchmark_data_{n}: {e}"))?;
                        } else {
                            let got = c
                                .client
                                .read_full(&obj(pool, n))
                                .map_err(|e| anyhow::anyhow!("read benchmark_data_{n}: {e}"))?;
                            let k = got.len().min(8);
                            if got.len() as u64 != size || got[..k] != n.to_le_bytes()[..k] {
                                bail!("benchmark_data_{n} read back wrong ({} bytes)", got.len());
                            }
                        }
                        h.record((at.elapsed().as_micros() as u64).max(1)).ok();
                        ops += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok((ops, h))
                })
            })
            .collect();
        // CPU samples every second while the clients run.
        let (mut last_t, mut last) = (t0, (h0, d0));
        while !hs.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
            if last_t.elapsed() >= Duration::from_secs(1) {
                let now = c.cpu();
                let dt = last_t.elapsed().as_secs_f64();
                samples.push((
                    t0.elapsed().as_secs_f64(),
                    (now.0 - last.0) / dt,
                    (now.1 - last.1) / dt,
                ));
                last_t = Instant::now();
                last = now;
            }
            if kind == Kind::Seq
                && Instant::now() >= deadline + Duration::from_secs_f64(seconds * 3.0)
            {
                // A seq phase reads every object once, but not forever.
                stop.store(true, Ordering::Relaxed);
            }
        }
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    crate::interrupt::check()?;
    let secs = t0.elapsed().as_secs_f64();
    let (h1, d1) = c.cpu();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut ops = 0;
    let mut first_err = None;
    for r in results {
        match r {
            Ok((o, h)) => {
                ops += o;
                hist.add(&h)?;
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let written = if kind == Kind::Write {
        // Every name below `min(next, cap)` was written unless a client failed.
        next.load(Ordering::Relaxed).min(cap)
    } else {
        objects
    };
    if let Some(e) = first_err {
        return Err(e.context(format!(
            "{}: {size}-byte objects, {clients} clients",
            c.name
        )));
    }
    let bytes = ops * size;
    let mb = bytes as f64 / 1e6;
    let p = Phase {
        ops,
        bytes,
        seconds: secs,
        mb_per_s: mb / secs,
        ops_per_s: ops as f64 / secs,
        lat_avg_ms: hist.mean() / 1e3,
        lat_p50_ms: hist.value_at_quantile(0.5) as f64 / 1e3,
        lat_p99_ms: hist.value_at_quantile(0.99) as f64 / 1e3,
        lat_max_ms: hist.max() as f64 / 1e3,
        host_cores: (h1 - h0) / secs,
        dpu_cores: (d1 - d0) / secs,
        host_cpu_ms_per_mb: ratio((h1 - h0) * 1e3, mb),
        dpu_cpu_ms_per_mb: ratio((d1 - d0) * 1e3, mb),
        samples,
        capped: capped.load(Ordering::Relaxed),
    };
    Ok((p, written))
}

/// Removes `benchmark_data_0..n` with `clients` threads.
pub(super) fn cleanup(c: &Cluster, pool: u64, n: u64, clients: usize) -> Result<()> {
    let next = AtomicU64::new(0);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..clients.max(4))
            .map(|_| {
                sc.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(());
                        }
                        c.client
                            .remove(&obj(pool, i))
                            .map_err(|e| anyhow::anyhow!("remove benchmark_data_{i}: {e}"))?;
                    }
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")))
        })
    })
}

pub(super) fn point(
    c: &Cluster,
    p: &Plan,
    repl: u32,
    size: u64,
    clients: usize,
    flow_adapt: bool,
) -> Result<Point> {
    let pool = u64::from(repl);
    // Stop writing at 40% of the devices (each object lands on `repl` of the four).
    let cap = ((p.device_size as f64 * 0.4 * OSDS as f64) / (size as f64 * f64::from(repl)))
        .max(1.0) as u64;
    let (w, n) = phase(c, pool, size, clients, Kind::Write, p.seconds, 0, cap)?;
    let (s, _) = phase(c, pool, size, clients, Kind::Seq, p.seconds, n, 0)?;
    let (r, _) = phase(c, pool, size, clients, Kind::Rand, p.seconds, n, 0)?;
    cleanup(c, pool, n, clients)?;
    let pt = Point {
        system: "dds".into(),
        placement: c.name.clone(),
        replication: repl,
        object_size: size,
        clients,
        flow_adapt,
        write: w,
        seq: s,
        rand: r,
    };
    eprintln!(
        "  {:<6} r{} {:>5} c{:<3}{} write {:>7.1} MB/s {:>7.2} ms host {:.2} cores ({:>5.2} ms/MB) dpu {:.2} | seq {:>7.1} MB/s | rand {:>7.1} MB/s",
        pt.placement,
        repl,
        size_label(size),
        clients,
        if flow_adapt { "" } else { " (Flow-Adapt off)" },
        pt.write.mb_per_s,
        pt.write.lat_avg_ms,
        pt.write.host_cores,
        pt.write.host_cpu_ms_per_mb,
        pt.write.dpu_cores,
        pt.seq.mb_per_s,
        pt.rand.mb_per_s
    );
    Ok(pt)
}
