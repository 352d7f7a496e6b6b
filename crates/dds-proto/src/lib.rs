//! dds-proto
