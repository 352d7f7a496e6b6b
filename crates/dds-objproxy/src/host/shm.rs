//! Host access to one channel of the shared region: atomic loads and stores of its words and
//! copies in and out of its slots (the host's side of the DMA channels).

use dds_shm::SharedRegion;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Host access to one channel of the shared region: atomics only.
#[derive(Clone)]
pub(super) struct Shm {
    pub(super) region: Arc<SharedRegion>,
    pub(super) base: u64,
}

impl Shm {
    pub(super) fn word(&self, off: u64) -> &AtomicU64 {
        &self.words(off, 1)[0]
    }

    pub(super) fn load(&self, off: u64) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }

    pub(super) fn store(&self, off: u64, v: u64) {
        self.word(off).store(v, Ordering::Release)
    }

    /// Copies `len` bytes at `off` out (`Acquire` loads, ascending), replacing `into`'s.
    pub(super) fn copy_out(&self, off: u64, len: usize, into: &mut Vec<u8>) {
        into.clear();
        self.append_out(off, len, into);
    }

    /// Appends `len` bytes at `off` to `into` (`Acquire` loads, ascending), written straight
    /// into its spare capacity.
    pub(super) fn append_out(&self, off: u64, len: usize, into: &mut Vec<u8>) {
        let words = self.words(off, len.div_ceil(8));
        let start = into.len();
        into.reserve(len);
        let spare = &mut into.spare_capacity_mut()[..len];
        let mut dst = spare.chunks_exact_mut(8);
        for (w, d) in words.iter().zip(&mut dst) {
            for (d, b) in d.iter_mut().zip(w.load(Ordering::Acquire).to_le_bytes()) {
                d.write(b);
            }
        }
        let rest = dst.into_remainder();
        if !rest.is_empty() {
            let last = words[words.len() - 1].load(Ordering::Acquire).to_le_bytes();
            for (d, b) in rest.iter_mut().zip(last) {
                d.write(b);
            }
        }
        // SAFETY: the loops above initialised all `len` bytes after `start`.
        unsafe { into.set_len(start + len) };
    }

    /// `n` words at `off`, as atomics.
    fn words(&self, off: u64, n: usize) -> &[AtomicU64] {
        debug_assert!(off.is_multiple_of(8));
        assert!(self.base + off + 8 * n as u64 <= self.region.len() as u64);
        // SAFETY: 8-aligned (page-aligned base, 8-aligned offsets), inside the mapping, which
        // `self.region` keeps alive; shared memory is only accessed with atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.region
                    .as_ptr()
                    .add((self.base + off) as usize)
                    .cast::<AtomicU64>(),
                n,
            )
        }
    }

    /// Copies `bytes` in at `off` (padded with zeros to a multiple of 8; `Relaxed`: a later
    /// `Release` store publishes them).
    pub(super) fn copy_in(&self, off: u64, bytes: &[u8]) {
        let words = self.words(off, bytes.len().div_ceil(8));
        let mut chunks = bytes.chunks_exact(8);
        for (w, ch) in words.iter().zip(&mut chunks) {
            w.store(
                u64::from_le_bytes(ch.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            words[words.len() - 1].store(u64::from_le_bytes(last), Ordering::Relaxed);
        }
    }
}
