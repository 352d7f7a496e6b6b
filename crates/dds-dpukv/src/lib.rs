//! DPU-KV (`docs/dpu-kv.md`, after the DPU-KV paper, HPDC'25): an in-memory key-value store
//! whose *communication engine* (TCP, RESP parsing, reply building) runs on DPU cores and
//! whose *processing engine* (`dds-kvmem`) runs on host cores, connected by KV queue pairs in
//! host shared memory that the DPU reaches only through its DMA engine. Six placements of the
//! same code ([`Design`]); Redis Cluster slot maps and etcd registration publish the endpoints.

#![warn(missing_docs)]

pub mod cluster;
pub mod dpu;
pub mod etcd;
pub mod host;
pub mod node;
pub mod queue;
pub mod store;

pub use dpu::frontend;
pub use host::worker;

use serde::{Deserialize, Serialize};

/// Where the engines run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Design {
    /// The host does everything (the baseline).
    CpuOnly,
    /// The DPU does everything, the store in DPU memory.
    DpuOnly,
    /// Front ends on DPU cores, one polling host worker per partition, 1:1 queue pairs.
    Lat,
    /// Front ends on DPU cores, ONE host worker serving every queue pair.
    Sav,
    /// `sav` plus front ends on spare host cores on the same store.
    Dual,
    /// The key space split between a DPU shard and a host shard.
    Shrd,
}

impl Design {
    /// Every design, in the paper's order.
    pub const ALL: [Design; 6] = [
        Design::CpuOnly,
        Design::DpuOnly,
        Design::Lat,
        Design::Sav,
        Design::Dual,
        Design::Shrd,
    ];

    /// The option value.
    pub fn name(self) -> &'static str {
        match self {
            Design::CpuOnly => "cpu-only",
            Design::DpuOnly => "dpu-only",
            Design::Lat => "lat",
            Design::Sav => "sav",
            Design::Dual => "dual",
            Design::Shrd => "shrd",
        }
    }

    /// Parses an option value.
    pub fn parse(s: &str) -> Option<Design> {
        Design::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Whether requests cross KV queue pairs.
    pub fn uses_queues(self) -> bool {
        matches!(self, Design::Lat | Design::Sav | Design::Dual)
    }
}
