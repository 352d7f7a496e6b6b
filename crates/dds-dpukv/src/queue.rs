//! KV queue pairs in host shared memory (`docs/dpu-kv.md` §2.2): the geometry of the region,
//! which both sides agree on. The host worker's side (plain atomics on its own memory) is
//! [`crate::host::queue`], the DPU front end's side (DMA operations only, named by region id and
//! offset) [`crate::dpu::queue`]; both are re-exported here.

pub use crate::dpu::queue::{queue_of, Answered, DpuQueue, Outstanding, QueueFault};
pub use crate::host::queue::HostQueue;
use dds_kvmem::qp::{BATCH_HEADER, BATCH_MAX};
use serde::{Deserialize, Serialize};

/// The queue pairs of a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// DPU communication cores (front-end threads).
    pub comm_cores: u32,
    /// Host workers (queue pairs per communication core).
    pub workers: u32,
    /// Slots per ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
    /// Largest value the deployment stores: front ends refuse larger SETs, and a request batch
    /// holds no more GETs than the response slot can answer at this size.
    pub max_value: u32,
}

impl Geometry {
    /// Checks the numbers (they come from the host: the DPU does not trust them).
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=64).contains(&self.comm_cores) || !(1..=64).contains(&self.workers) {
            return Err("1..=64 communication cores and workers".into());
        }
        if !(1..=1024).contains(&self.slots) {
            return Err("1..=1024 slots per ring".into());
        }
        if self.slot_bytes < 256
            || self.slot_bytes as usize > BATCH_MAX + 1 + 8
            || !self.slot_bytes.is_multiple_of(64)
        {
            return Err("slot bytes: a multiple of 64 in 256..=65536".into());
        }
        if self.max_value == 0
            || dds_kvmem::qp::max_value_response(self.max_value as usize) + BATCH_HEADER
                > self.batch_max()
        {
            return Err(
                "max value: 1 byte up to what a slot's batch holds of one value's response".into(),
            );
        }
        if self.region_len() > 1 << 32 {
            return Err("queue region larger than 4 GiB".into());
        }
        Ok(())
    }

    /// Bytes of the region.
    pub fn region_len(&self) -> usize {
        self.comm_cores as usize * self.workers as usize * self.pair_bytes()
    }

    fn pair_bytes(&self) -> usize {
        2 * self.slots as usize * self.slot_bytes as usize
    }

    /// Offset of queue pair (c, w)'s request ring; its response ring follows.
    pub fn pair_offset(&self, c: u32, w: u32) -> usize {
        assert!(c < self.comm_cores && w < self.workers);
        (c as usize * self.workers as usize + w as usize) * self.pair_bytes()
    }

    /// Most batch bytes a slot carries (room for a request's end marker).
    pub fn batch_max(&self) -> usize {
        (self.slot_bytes as usize - 1).min(BATCH_MAX)
    }
}

pub(crate) fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes of the DMA write of a request batch of `bytes` bytes: the batch, zeros, and the end
/// marker as the last byte of the first multiple of 8 past the batch (`docs/dpu-kv.md` §2.2).
pub(crate) fn request_write_len(bytes: usize) -> usize {
    align8(bytes + 1)
}

/// The end marker of the request batch numbered `seq`: never 0.
pub(crate) fn end_marker(seq: u16) -> u8 {
    0x80 | (seq & 0x7F) as u8
}
