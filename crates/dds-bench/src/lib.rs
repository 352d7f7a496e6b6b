//! dds-bench
