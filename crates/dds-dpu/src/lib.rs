//! dds-dpu
