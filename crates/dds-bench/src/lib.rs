//! Workloads and benchmarks of DDS.

pub mod workload;
