//! Block allocator: a bitmap of the device's blocks, persisted in redb by 4 KiB chunks.
//!
//! Two bitmaps are kept in memory. `alloc` is the persisted state (as of the last commit plus
//! the allocations of the batch being built). `busy` is what may not be handed out: `alloc`
//! plus blocks freed by a commit that a reader may still be reading (they are quarantined until
//! the readers that could have seen the old metadata are gone). Blocks freed by a batch stay
//! busy until after its metadata commit, so a crash can never find an old extent overwritten.

use std::collections::BTreeSet;

/// Blocks covered by one persisted bitmap chunk (4 KiB of bits).
pub(crate) const CHUNK_BLOCKS: u64 = 4096 * 8;
const CHUNK_WORDS: usize = (CHUNK_BLOCKS / 64) as usize;

pub(crate) struct Allocator {
    nblocks: u64,
    alloc: Vec<u64>,
    busy: Vec<u64>,
    /// Zero bits of `busy` (below `nblocks`).
    free: u64,
    /// Set bits of `alloc`.
    allocated: u64,
    dirty: BTreeSet<u64>,
    cursor: u64,
}

fn get(map: &[u64], b: u64) -> bool {
    map[(b / 64) as usize] & (1 << (b % 64)) != 0
}

fn set(map: &mut [u64], b: u64, on: bool) {
    let w = &mut map[(b / 64) as usize];
    if on {
        *w |= 1 << (b % 64);
    } else {
        *w &= !(1 << (b % 64));
    }
}

impl Allocator {
    /// A fresh allocator for `nblocks` blocks with `reserved` leading blocks allocated.
    pub fn new(nblocks: u64, reserved: u64) -> Allocator {
        let words = nblocks.div_ceil(64) as usize;
        let mut a = Allocator {
            nblocks,
            alloc: vec![0; words],
            busy: vec![0; words],
            free: nblocks,
            allocated: 0,
            dirty: (0..nblocks.div_ceil(CHUNK_BLOCKS)).collect(),
            cursor: reserved,
        };
        a.pad();
        for b in 0..reserved {
            a.mark(b);
        }
        a
    }

    /// The allocator persisted as `chunks` (index → bytes); `None` if chunks are missing or of
    /// the wrong size.
    pub fn load(
        nblocks: u64,
        chunks: impl IntoIterator<Item = (u64, Vec<u8>)>,
    ) -> Option<Allocator> {
        let words = nblocks.div_ceil(64) as usize;
        let mut alloc = vec![0u64; words];
        let mut seen = 0u64;
        for (i, bytes) in chunks {
            let start = (i as usize).checked_mul(CHUNK_WORDS)?;
            let end = (start + CHUNK_WORDS).min(words);
            if start >= words || bytes.len() != (end - start) * 8 {
                return None;
            }
            for (w, b) in alloc[start..end].iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            seen += 1;
        }
        if seen != nblocks.div_ceil(CHUNK_BLOCKS) {
            return None;
        }
        let mut a = Allocator {
            nblocks,
            busy: alloc.clone(),
            alloc,
            free: 0,
            allocated: 0,
            dirty: BTreeSet::new(),
            cursor: 0,
        };
        // Bits past the end are never set in `alloc`, always in `busy`.
        if !nblocks.is_multiple_of(64) {
            let last = words - 1;
            a.alloc[last] &= (1u64 << (nblocks % 64)) - 1;
        }
        a.pad();
        a.allocated = a.alloc.iter().map(|w| u64::from(w.count_ones())).sum();
        a.free = nblocks - a.allocated;
        Some(a)
    }

    fn pad(&mut self) {
        for b in self.nblocks..(self.busy.len() as u64 * 64) {
            set(&mut self.busy, b, true);
        }
    }

    fn mark(&mut self, b: u64) {
        debug_assert!(!get(&self.busy, b));
        set(&mut self.busy, b, true);
        set(&mut self.alloc, b, true);
        self.free -= 1;
        self.allocated += 1;
        self.dirty.insert(b / CHUNK_BLOCKS);
    }

    /// Blocks that can be handed out now.
    #[cfg(test)]
    pub fn free(&self) -> u64 {
        self.free
    }

    /// Blocks allocated in the persisted sense.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// True if `b` is allocated (persisted sense).
    pub fn is_allocated(&self, b: u64) -> bool {
        b < self.nblocks && get(&self.alloc, b)
    }

    /// Allocates `n` blocks as extents `(start, len)`, preferring contiguous runs after the
    /// last allocation; `Err(free)` if fewer than `n` are free (nothing is allocated then).
    pub fn allocate(&mut self, n: u64) -> Result<Vec<(u64, u64)>, u64> {
        if n > self.free {
            return Err(self.free);
        }
        let mut out = Vec::new();
        let mut need = n;
        let mut pos = self.cursor;
        while need > 0 {
            if pos >= self.nblocks {
                pos = 0;
            }
            if pos.is_multiple_of(64) && self.busy[(pos / 64) as usize] == u64::MAX {
                pos += 64;
                continue;
            }
            if get(&self.busy, pos) {
                pos += 1;
                continue;
            }
            let start = pos;
            while pos < self.nblocks && need > 0 && !get(&self.busy, pos) {
                self.mark(pos);
                pos += 1;
                need -= 1;
            }
            out.push((start, pos - start));
        }
        self.cursor = pos;
        Ok(out)
    }

    /// Undoes allocations that no committed metadata references.
    pub fn release_now(&mut self, extents: &[(u64, u64)]) {
        for &(s, n) in extents {
            for b in s..s + n {
                assert!(
                    get(&self.alloc, b) && get(&self.busy, b),
                    "double free of {b}"
                );
                set(&mut self.alloc, b, false);
                set(&mut self.busy, b, false);
                self.free += 1;
                self.allocated -= 1;
                self.dirty.insert(b / CHUNK_BLOCKS);
            }
        }
    }

    /// Frees blocks in the persisted state; they stay busy until [`unquarantine`](Self::unquarantine).
    /// A block that is not allocated (metadata referencing a block twice) is `Err(block)`, after
    /// the blocks before it were freed.
    pub fn free_committed(&mut self, blocks: &[u64]) -> Result<(), u64> {
        for &b in blocks {
            if b >= self.nblocks || !get(&self.alloc, b) {
                return Err(b);
            }
            set(&mut self.alloc, b, false);
            self.allocated -= 1;
            self.dirty.insert(b / CHUNK_BLOCKS);
        }
        Ok(())
    }

    /// Makes blocks freed by [`free_committed`](Self::free_committed) allocatable again.
    pub fn unquarantine(&mut self, blocks: &[u64]) {
        for &b in blocks {
            assert!(
                get(&self.busy, b) && !get(&self.alloc, b),
                "bad quarantine {b}"
            );
            set(&mut self.busy, b, false);
            self.free += 1;
        }
    }

    /// The chunks changed since the last call: (index, bytes).
    pub fn take_dirty(&mut self) -> Vec<(u64, Vec<u8>)> {
        let words = self.alloc.len();
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|i| {
                let start = i as usize * CHUNK_WORDS;
                let end = (start + CHUNK_WORDS).min(words);
                let bytes = self.alloc[start..end]
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect();
                (i, bytes)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_free_persist() {
        let mut a = Allocator::new(100_000, 1);
        assert_eq!(a.free(), 99_999);
        let e = a.allocate(10).unwrap();
        assert_eq!(e, vec![(1, 10)]);
        let e2 = a.allocate(5).unwrap();
        assert_eq!(e2, vec![(11, 5)]);
        a.free_committed(&[3, 4]).unwrap();
        assert_eq!(a.free_committed(&[3]), Err(3));
        assert_eq!(a.allocated(), 14);
        assert_eq!(a.free(), 99_984);
        a.release_now(&e2);
        let chunks = a.take_dirty();
        let b = Allocator::load(100_000, chunks).unwrap();
        assert_eq!(b.allocated(), 9);
        assert!(b.is_allocated(0) && !b.is_allocated(3) && b.is_allocated(5));
        a.unquarantine(&[3, 4]);
        assert_eq!(a.free(), 99_991);
        assert_eq!(a.allocate(99_992), Err(99_991));
        let all = a.allocate(99_991).unwrap();
        assert_eq!(all.iter().map(|e| e.1).sum::<u64>(), 99_991);
        assert_eq!(a.free(), 0);
    }
}
