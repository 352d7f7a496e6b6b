//! dds-host
