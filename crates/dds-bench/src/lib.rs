//! Workloads and benchmarks of DDS.
//!
//! Each benchmark (`ring`, `files`, `cache-table`) is a library function returning a
//! [`report::Report`]: the raw points, a `summary` object with the figures its targets name,
//! and the machine and DPU-emulation notes. The `dds bench` command runs them, prints the
//! tables and writes `bench/results/<name>.json` and the plots.

pub mod cache_table;
pub mod charts;
pub mod child;
pub mod cpu;
pub mod dpu;
pub mod files;
pub mod machine;
pub mod plot;
pub mod progress;
pub mod remote;
pub mod report;
pub mod ring;
pub mod uring;
pub mod workload;
