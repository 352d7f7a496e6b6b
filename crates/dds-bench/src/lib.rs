//! Workloads and benchmarks of DDS.
//!
//! Each benchmark (`ring`, `files`, `cache-table`) is a library function returning a
//! [`report::Report`]: the raw points, a `summary` object with the figures its targets name,
//! and the machine and DPU-emulation notes. The `dds bench` command runs them, prints the
//! tables and writes `bench/results/<name>.json` and the plots.

pub mod cache_table;
pub mod child;
pub mod cluster;
pub mod cpu;
pub mod device;
pub mod dpu;
pub mod dpukv;
pub mod files;
pub mod interrupt;
pub mod kv;
pub mod machine;
pub mod nbd;
pub mod objects;
pub mod pageserver;
pub mod placement;
pub mod plot;
pub mod progress;
pub mod remote;
pub mod report;
pub mod ring;
pub mod s3;
pub mod uring;
pub mod workload;

/// Where a benchmark's JSON and plots go: `out` if given, else `bench/results/` for full runs
/// and `bench/results/quick/` for `--quick` runs, so a smoke run never overwrites the
/// committed figures of a full run.
pub fn results_dir(out: Option<&std::path::Path>, quick: bool) -> std::path::PathBuf {
    match out {
        Some(p) => p.to_path_buf(),
        None if quick => std::path::PathBuf::from("bench/results/quick"),
        None => std::path::PathBuf::from("bench/results"),
    }
}
