//! The data path's bounce memory: one aligned slab handed out in contiguous runs of units
//! (unaligned and segment-spanning I/O go through it).

use crate::align::AlignedBuf;

/// Fixed pool of aligned bounce memory, allocated in contiguous runs of units.
pub(super) struct BouncePool {
    slab: AlignedBuf,
    unit: usize,
    used: Vec<bool>,
    free_units: usize,
    hint: usize,
}

impl BouncePool {
    pub(super) fn new(bytes: usize, unit: usize, align: usize) -> BouncePool {
        let units = bytes / unit;
        BouncePool {
            slab: AlignedBuf::new(units * unit, align.max(unit.min(4096))),
            unit,
            used: vec![false; units],
            free_units: units,
            hint: 0,
        }
    }

    /// The slab: its base and length.
    pub(super) fn memory(&mut self) -> (*mut u8, usize) {
        (self.slab.as_mut_ptr(), self.slab.len())
    }

    /// Returns (byte offset, units) of a free run covering `bytes`.
    pub(super) fn alloc(&mut self, bytes: usize) -> Option<(usize, u32)> {
        let n = bytes.div_ceil(self.unit);
        let total = self.used.len();
        if n == 0 || n > self.free_units {
            return None;
        }
        // Next fit from the hint, wrapping once.
        let mut start = if self.hint + n <= total { self.hint } else { 0 };
        let mut wrapped = false;
        loop {
            if start + n > total {
                if wrapped {
                    return None;
                }
                wrapped = true;
                start = 0;
            }
            match self.used[start..start + n].iter().rposition(|&u| u) {
                None => break,
                Some(k) => start += k + 1,
            }
            if wrapped && start >= self.hint {
                return None;
            }
        }
        self.used[start..start + n].fill(true);
        self.free_units -= n;
        self.hint = (start + n) % total.max(1);
        Some((start * self.unit, n as u32))
    }

    pub(super) fn free(&mut self, off: usize, units: u32) {
        let start = off / self.unit;
        let n = units as usize;
        debug_assert!(self.used[start..start + n].iter().all(|&u| u));
        self.used[start..start + n].fill(false);
        self.free_units += n;
    }

    pub(super) fn ptr(&mut self, off: usize) -> *mut u8 {
        debug_assert!(off < self.slab.len());
        // SAFETY: in bounds of the slab.
        unsafe { self.slab.as_mut_ptr().add(off) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounce_pool_matches_shadow() {
        let mut pool = BouncePool::new(64 * 4096, 4096, 4096);
        let mut live: Vec<(usize, u32)> = Vec::new();
        let mut owner = [false; 64];
        let mut x = 99u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || live.is_empty() {
                let bytes = 1 + (x >> 8) as usize % (20 * 4096);
                let free_run = {
                    let n = bytes.div_ceil(4096);
                    (0..=64 - n.min(64)).any(|s| n <= 64 && owner[s..s + n].iter().all(|&o| !o))
                };
                match pool.alloc(bytes) {
                    Some((off, units)) => {
                        let s = off / 4096;
                        assert_eq!(units as usize, bytes.div_ceil(4096));
                        assert!(owner[s..s + units as usize].iter().all(|&o| !o), "overlap");
                        owner[s..s + units as usize].fill(true);
                        live.push((off, units));
                    }
                    None => assert!(!free_run, "a free run existed"),
                }
            } else {
                let (off, units) = live.swap_remove((x >> 5) as usize % live.len());
                owner[off / 4096..off / 4096 + units as usize].fill(false);
                pool.free(off, units);
            }
        }
    }
}
