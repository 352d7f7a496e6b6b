//! The device's own random-read IOPS, measured in the same run and on the same device file as a
//! service benchmark (`dds bench kv`, `dds bench pageserver`), so that the service's throughput
//! can be given as a fraction of what the device alone delivers: the io_uring baseline of
//! `dds bench files` (O_DIRECT, the same threads and queue depth), reads only, at the service's
//! I/O size, over the blocks of the device file that hold data, once the DPU has stopped.

use std::path::Path;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::report::{fmt_num, Table};
use crate::uring::{run_on, Blocks};
use crate::workload::WorkloadSpec;

/// Threads of the baseline, as in `dds bench files`.
pub const THREADS: usize = 2;
/// Reads in flight per thread, as in `dds bench files`.
pub const DEPTH: usize = 32;

/// Reads of the calibration run.
const PILOT_OPS: u64 = 2_000;

/// What the device file delivered.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReads {
    pub io_bytes: u32,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub threads: usize,
    /// Reads in flight per thread.
    pub depth: usize,
    /// Bytes of the device file holding data, which the offsets cover.
    pub data_bytes: u64,
    pub reads: u64,
}

/// Random reads of `io_bytes` over the written blocks of `device` for about `seconds`.
pub fn measure(device: &Path, io_bytes: u32, seconds: f64) -> Result<DeviceReads> {
    let blocks = Blocks::written(device, io_bytes)?;
    let mut spec = WorkloadSpec {
        file: 0,
        file_bytes: std::fs::metadata(device)?.len(),
        io_bytes,
        read_ratio: 1.0,
        threads: THREADS,
        depth: DEPTH,
        ops: PILOT_OPS,
        seed: 0xde71ce,
        registered: false,
    };
    let pilot = run_on(device, &spec, &blocks, &|_| {})?;
    spec.ops = ((pilot.ops_per_sec * seconds) as u64).clamp(PILOT_OPS, 5_000_000);
    spec.seed += 1;
    let r = run_on(device, &spec, &blocks, &|_| {})?;
    if r.errors > 0 {
        bail!("{} of {} device reads failed", r.errors, r.ops);
    }
    Ok(DeviceReads {
        io_bytes,
        iops: r.ops_per_sec,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        threads: THREADS,
        depth: DEPTH,
        data_bytes: blocks.count() * u64::from(io_bytes),
        reads: r.ops,
    })
}

/// [`measure`], or `None` after saying why the device could not be measured (no io_uring, or
/// no O_DIRECT where the device file lives).
pub fn measure_or_warn(device: &Path, io_bytes: u32, seconds: f64) -> Option<DeviceReads> {
    match measure(device, io_bytes, seconds) {
        Ok(d) => {
            eprintln!(
                "  device random reads of {io_bytes} B ({} threads x {} deep): {:.0} IOPS",
                d.threads, d.depth, d.iops
            );
            Some(d)
        }
        Err(e) => {
            eprintln!("  device random reads of {io_bytes} B not measured: {e:#}");
            None
        }
    }
}

/// Per mode, `(<mode>_<suffix>, throughput / device IOPS)` (NaN, written as null, when either
/// is missing); mode names with `-` become `_`.
pub fn fractions(
    device: Option<&DeviceReads>,
    throughput: &[(&str, Option<f64>)],
    suffix: &str,
) -> Vec<(String, f64)> {
    throughput
        .iter()
        .map(|&(mode, ops)| {
            let r = match (ops, device) {
                (Some(o), Some(d)) if d.iops > 0.0 => o / d.iops,
                _ => f64::NAN,
            };
            (format!("{}_{suffix}", mode.replace('-', "_")), r)
        })
        .collect()
}

/// A table of every mode's throughput against the device's random-read IOPS.
pub fn fraction_table(
    device: Option<&DeviceReads>,
    throughput: &[(&str, Option<f64>)],
    what: &str,
) -> Table {
    let title = match device {
        Some(d) => format!(
            "{what} over the device's own random reads of {} B (io_uring, O_DIRECT, {} threads x \
             {} deep, same device file): {} IOPS",
            d.io_bytes,
            d.threads,
            d.depth,
            fmt_num(d.iops)
        ),
        None => format!("{what} over the device's own random reads: not measured"),
    };
    let mut t = Table::new(title, &["mode", "ops/s", "of device IOPS"]);
    for &(mode, ops) in throughput {
        let frac = match (ops, device) {
            (Some(o), Some(d)) if d.iops > 0.0 => format!("{:.2}", o / d.iops),
            _ => "-".into(),
        };
        t.row(vec![mode.into(), ops.map_or("-".into(), fmt_num), frac]);
    }
    t
}
