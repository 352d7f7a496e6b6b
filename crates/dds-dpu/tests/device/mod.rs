//! A DPU on a real device file (io_uring, O_DIRECT) for the integration tests that need one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dds_dpu::{Dpu, DpuConfig, DpuHandle};
use dds_fs::{FileService, FormatConfig, OpenConfig, SyncGate, UringDevice};

/// Creates and formats a 64 MiB device file (1 MiB segments) in `dir`.
pub fn device(dir: &Path) -> PathBuf {
    let path = dir.join("dev");
    UringDevice::create_file(&path, 64 << 20).unwrap();
    let mut dev = UringDevice::open(&path, 64).unwrap();
    let cfg = FormatConfig {
        segment_size: 1 << 20,
        ..FormatConfig::default()
    };
    dds_fs::format(&mut dev, cfg).unwrap();
    path
}

/// Starts a DPU on the device file at `path` with `memory_budget_bytes`; the metadata
/// handle's syncs wait at `gate` when one is given.
pub fn start(
    path: &Path,
    name: &str,
    memory_budget_bytes: u64,
    gate: Option<Arc<SyncGate>>,
) -> DpuHandle {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path(name),
        memory_budget_bytes,
        ..DpuConfig::default()
    };
    let path = path.to_path_buf();
    Dpu::start(config, move || {
        let dev = UringDevice::open(&path, 64)?;
        let dev = match gate {
            Some(g) => dev.with_meta_gate(g),
            None => dev,
        };
        FileService::open(Box::new(dev), OpenConfig::default())
    })
    .expect("DPU starts")
}
