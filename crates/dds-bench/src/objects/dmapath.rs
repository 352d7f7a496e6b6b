//! The DMA path alone (CODA §V-C, Flow-Adapt): transactions per second from a DPU-side
//! `ProxyObjectStore` into one `dds osd-store`, with batching and chunking on and off.
//!
//! Inside a whole OSD the store's commit or the host CPU budget bounds the rate, and Flow-Adapt
//! only changes how the DPU reaches the store. Here nothing else runs: `threads` submitting
//! threads of this process, pinned to the DPU CPU(s) and using the emulated DMA engine with its
//! PCIe cost model, write `size`-byte objects (`WriteFull`, 8 names per thread, rewritten) over
//! one channel for `seconds`; the store runs in the host budget on the host CPUs.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dds_objproxy::{ProxyObjectStore, ProxyOptions};
use dds_objstore::{ObjectId, ObjectStore, Transaction, TxOp};
use serde::Serialize;

use super::cgroup::CpuBudget;
use super::cluster::spawn_store;
use crate::cpu::process_cpu_seconds;
use crate::placement::Placement;

/// Settings of one measurement.
pub(super) struct DmaPathOpts<'a> {
    pub exe: &'a Path,
    pub dir: &'a Path,
    pub place: &'a Placement,
    pub host_quota: f64,
    pub dma_cost: bool,
    pub flow_adapt: bool,
    pub size: usize,
    pub threads: usize,
    pub seconds: f64,
}

/// One measurement.
#[derive(Clone, Debug, Serialize)]
pub struct DmaPathPoint {
    pub flow_adapt: bool,
    pub object_size: usize,
    pub threads: usize,
    pub channels: usize,
    pub seconds: f64,
    pub txs: u64,
    pub txs_per_s: f64,
    /// `dds osd-store` CPU microseconds per transaction.
    pub host_cpu_us_per_tx: f64,
    /// DMA operations (reads and writes) of the DPU side per transaction.
    pub dma_ops_per_tx: f64,
    pub batches: u64,
    pub chunks: u64,
}

pub(super) fn measure(o: &DmaPathOpts) -> Result<DmaPathPoint> {
    let tag = if o.flow_adapt { "on" } else { "off" };
    let budget = CpuBudget::create(
        &format!("dds-bench-objects-{}-dma-{tag}", std::process::id()),
        o.host_quota,
    );
    let dir = o.dir.join(format!("dma-path-{tag}"));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let sock = dir.join("store.sock");
    let mut store = spawn_store(
        o.exe,
        o.place.host_cpus.as_deref(),
        &dir.join("store.img"),
        &sock,
        1 << 30,
        true,
        std::fs::File::create(dir.join("store.log"))?,
        &budget,
    )?;
    let opts = ProxyOptions {
        batching: o.flow_adapt,
        chunking: o.flow_adapt,
        channels: 1,
        cost_model: if o.dma_cost {
            ProxyOptions::default().cost_model
        } else {
            None
        },
        ..Default::default()
    };
    let proxy = Arc::new(
        ProxyObjectStore::connect(&sock, opts)
            .map_err(|e| anyhow::anyhow!("connect to {}: {e}", sock.display()))?,
    );
    let _pin = o.place.pin_dpu()?;
    let run = |secs: f64| -> Result<u64> {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let workers: Vec<_> = (0..o.threads)
            .map(|t| {
                let p = proxy.clone();
                let data = vec![t as u8; o.size];
                std::thread::spawn(move || -> Result<u64> {
                    let mut n = 0u64;
                    while Instant::now() < end && !crate::interrupt::requested() {
                        let mut tx = Transaction::new();
                        tx.push(TxOp::WriteFull {
                            oid: ObjectId::new(1, format!("t{t}-{}", n % 8)),
                            data: data.clone(),
                        });
                        p.submit(&tx).map_err(|e| anyhow::anyhow!("submit: {e}"))?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        workers.into_iter().try_fold(0u64, |sum, h| {
            Ok(sum
                + h.join()
                    .map_err(|_| anyhow::anyhow!("a DMA-path thread panicked"))??)
        })
    };
    // Warm-up: the objects exist and the store's allocator is warm.
    run(0.5_f64.min(o.seconds))?;
    let (s0, c0) = (
        proxy.stats(),
        process_cpu_seconds(store.pid()).unwrap_or(0.0),
    );
    let t0 = Instant::now();
    let txs = run(o.seconds)?;
    crate::interrupt::check()?;
    let secs = t0.elapsed().as_secs_f64();
    let (s1, c1) = (
        proxy.stats(),
        process_cpu_seconds(store.pid()).unwrap_or(0.0),
    );
    drop(proxy);
    let _ = store.stop(Duration::from_secs(5));
    let per = |x: f64| if txs > 0 { x / txs as f64 } else { f64::NAN };
    Ok(DmaPathPoint {
        flow_adapt: o.flow_adapt,
        object_size: o.size,
        threads: o.threads,
        channels: 1,
        seconds: secs,
        txs,
        txs_per_s: txs as f64 / secs,
        host_cpu_us_per_tx: per((c1 - c0) * 1e6),
        dma_ops_per_tx: per(
            ((s1.dma_reads + s1.dma_writes) - (s0.dma_reads + s0.dma_writes)) as f64,
        ),
        batches: s1.batches - s0.batches,
        chunks: s1.chunks - s0.chunks,
    })
}
