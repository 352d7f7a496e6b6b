//! The host worker's end of a KV queue pair ([`HostQueue`]): plain atomics on the queue region
//! the host owns, mapped in its own memory.

use crate::queue::{align8, end_marker, request_write_len, Geometry};
use dds_kvmem::qp::{batch_header, batch_seq, Malformed, BATCH_HEADER};
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

    /// Takes the next request batch if it is complete (its header carries the batch's `seq`
    /// and the last word of its write the end marker): copies it into `into`, zeroes its
    /// slot. `Ok(false)`: nothing yet. `Err`: the DPU wrote a batch that cannot be valid.
    pub fn take(&mut self, into: &mut Vec<u8>) -> Result<bool, Malformed> {
        let slot = (self.next % self.slots) as usize * self.slot_bytes;
        let seq = batch_seq(self.next);
        let head = Self::word(self.req, slot).load(Ordering::Acquire);
        if (head >> 16) as u16 != seq {
            return Ok(false);
        }
        let bytes = (head & 0xFFFF) as usize;
        let end = request_write_len(bytes);
        if bytes <= BATCH_HEADER || end > self.slot_bytes {
            return Err(Malformed("request batch length out of range"));
        }
        let last = Self::word(self.req, slot + end - 8).load(Ordering::Acquire);
        if (last >> 56) as u8 != end_marker(seq) {
            return Ok(false);
        }
        into.clear();
        for at in (0..end).step_by(8) {
            let w = Self::word(self.req, slot + at).load(Ordering::Relaxed);
            into.extend_from_slice(&w.to_le_bytes());
        }
        into.truncate(bytes);
        for at in (0..end).step_by(8) {
            Self::word(self.req, slot + at).store(0, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Publishes the response batch of the request batch just taken.
    pub fn respond(&mut self, batch: &[u8]) {
        let (len, seq) = batch_header(batch).expect("a finished batch");
        assert_eq!(len, batch.len());
        assert_eq!(seq, batch_seq(self.next), "response out of order");
        assert!(
            align8(len) <= self.slot_bytes,
            "response larger than a slot"
        );
        let slot = (self.next % self.slots) as usize * self.slot_bytes;
        let word_of = |chunk: &[u8]| {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            u64::from_le_bytes(w)
        };
        let mut chunks = batch.chunks(8);
        // The word that holds the header goes last, with release ordering: a reader that sees
        // the header sees the records.
        let head = word_of(chunks.next().expect("a header"));
        for (i, chunk) in chunks.enumerate() {
            Self::word(self.resp, slot + (i + 1) * 8).store(word_of(chunk), Ordering::Relaxed);
        }
        Self::word(self.resp, slot).store(head, Ordering::Release);
        self.next += 1;
    }
}
