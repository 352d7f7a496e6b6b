//! A DPU running in the test process on an in-memory device: the real control socket, shared
//! memory, emulated DMA engine, rings and file service.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use dds_dpu::{Dpu, DpuConfig, DpuHandle};

/// Starts a DPU on a fresh 64 MiB in-memory device (1 MiB segments).
pub fn start_dpu() -> DpuHandle {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("capi"),
        memory_budget_bytes: 128 << 20,
        ..DpuConfig::default()
    };
    Dpu::start_in_memory(config, 64 << 20).expect("DPU starts")
}

/// The directory of the built libraries (`target/<profile>`): test executables live in its
/// `deps` subdirectory.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Builds `libdds.a` and `libdds.so` into [`lib_dir`] (once per test process) and returns
/// that directory. `cargo test` builds only the rlib of this crate, so the C libraries come
/// from a `cargo build` of the same profile and target directory (a no-op when current).
pub fn c_libs() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = lib_dir();
            let mut target_dir = dir.parent().expect("target directory");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
            let mut cmd = Command::new(cargo);
            cmd.args([
                "build",
                "--quiet",
                "--lib",
                "-p",
                "dds-capi",
                "--manifest-path",
            ])
            .arg(crate_dir().join("Cargo.toml"));
            // With an explicit --target the layout is target/<triple>/<profile>.
            let triple = env!("DDS_BUILD_TARGET");
            if !triple.is_empty() && target_dir.file_name() == Some(triple.as_ref()) {
                cmd.args(["--target", triple]);
                target_dir = target_dir.parent().expect("target directory");
            }
            cmd.arg("--target-dir").arg(target_dir);
            match dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => {}
                Some("release") => {
                    cmd.arg("--release");
                }
                Some(other) => {
                    cmd.args(["--profile", other]);
                }
                None => return Err(format!("unexpected library directory {}", dir.display())),
            }
            let out = cmd.output().map_err(|e| format!("cannot run cargo: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "cargo build -p dds-capi failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(dir)
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `crates/dds-capi`.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The repository's `include/` directory.
pub fn include_dir() -> PathBuf {
    crate_dir().join("../../include")
}

/// The C compiler: `$CC` or `cc`.
pub fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}
