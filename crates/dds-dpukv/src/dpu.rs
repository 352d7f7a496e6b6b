//! The DPU side: the communication engine ([`frontend`]), the DPU's end of the KV queue pairs
//! ([`queue`]: DMA operations only) and the DPU process ([`node`]). Nothing here names host
//! shared memory: host memory is reached only through the DMA engine, by region id and offset
//! (`crates/dds-cli/tests/architecture.rs` checks it). The front ends also run on host cores
//! in the designs that have host front ends.

pub mod frontend;
pub mod node;
pub mod queue;
