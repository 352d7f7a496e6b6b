//! The host worker's end of a KV queue pair ([`HostQueue`]): plain atomics on the queue region
//! the host owns, mapped in its own memory.

use crate::queue::{align8, Geometry};
use dds_kvmem::qp::{batch_header, Malformed, BATCH_HEADER};
use std::sync::atomic::{AtomicU64, Ordering};

/// The host worker's end of one queue pair.
pub struct HostQueue {
    req: *mut u8,
    resp: *mut u8,
    slots: u64,
    slot_bytes: usize,
    next: u64,
}

// SAFETY: the pointers address shared memory that outlives the queue (the owner keeps the
// mapping) and is accessed only with atomics.
unsafe impl Send for HostQueue {}

impl HostQueue {
    /// # Safety
    /// `base` maps at least `g.region_len()` bytes, 8-aligned, alive while the queue is used,
    /// and only the queue protocol touches queue pair (c, w)'s bytes on the host.
    pub unsafe fn new(base: *mut u8, g: &Geometry, c: u32, w: u32) -> HostQueue {
        assert_eq!(base as usize % 8, 0);
        let off = g.pair_offset(c, w);
        let ring = g.slots as usize * g.slot_bytes as usize;
        // SAFETY: inside the region (caller).
        unsafe {
            HostQueue {
                req: base.add(off),
                resp: base.add(off + ring),
                slots: u64::from(g.slots),
                slot_bytes: g.slot_bytes as usize,
                next: 0,
            }
        }
    }

    fn word(base: *mut u8, at: usize) -> &'static AtomicU64 {
        // SAFETY: callers pass 8-aligned offsets inside a slot of the region (see `new`).
        unsafe { AtomicU64::from_ptr(base.add(at).cast()) }
    }

    /// Takes the next request batch if it is complete: copies it into `into`, zeroes its
    /// slot. `Ok(false)`: nothing yet. `Err`: the DPU wrote a batch that cannot be valid.
    pub fn take(&mut self, into: &mut Vec<u8>) -> Result<bool, Malformed> {
        let slot = (self.next % self.slots) as usize * self.slot_bytes;
        let seq = (self.next as u32).wrapping_add(1);
        let head = Self::word(self.req, slot).load(Ordering::Acquire);
        if (head >> 32) as u32 != seq {
            return Ok(false);
        }
        let bytes = ((head >> 16) & 0xFFFF) as usize;
        let end = align8(bytes);
        if bytes < BATCH_HEADER || end + 8 > self.slot_bytes {
            return Err(Malformed("request batch length out of range"));
        }
        if Self::word(self.req, slot + end).load(Ordering::Acquire) != u64::from(seq) {
            return Ok(false);
        }
        into.clear();
        for at in (0..end).step_by(8) {
            let w = Self::word(self.req, slot + at).load(Ordering::Relaxed);
            into.extend_from_slice(&w.to_le_bytes());
        }
        into.truncate(bytes);
        for at in (0..end + 8).step_by(8) {
            Self::word(self.req, slot + at).store(0, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Publishes the response batch of the request batch just taken.
    pub fn respond(&mut self, batch: &[u8]) {
        let (_, len, seq) = batch_header(batch).expect("a finished batch");
        assert_eq!(len, batch.len());
        assert_eq!(
            seq,
            (self.next as u32).wrapping_add(1),
            "response out of order"
        );
        assert!(
            align8(len) <= self.slot_bytes,
            "response larger than a slot"
        );
        let slot = (self.next % self.slots) as usize * self.slot_bytes;
        for (i, chunk) in batch.chunks(8).enumerate().skip(1) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            Self::word(self.resp, slot + i * 8).store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
        let head = u64::from_le_bytes(batch[..8].try_into().expect("8 bytes"));
        Self::word(self.resp, slot).store(head, Ordering::Release);
        self.next += 1;
    }
}
