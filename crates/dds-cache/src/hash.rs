//! The two seeded hash functions of the table.

/// MurmurHash3's 64-bit finalizer: a bijective mixer with full avalanche.
#[inline(always)]
pub const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The two candidate buckets of `key` in a table of `mask + 1` buckets (a power of two, at
/// least 2). The second index is forced to differ from the first, so every key has exactly two
/// distinct candidates.
#[inline(always)]
pub(crate) fn candidates(key: u64, seeds: [u64; 2], mask: usize) -> (usize, usize) {
    let i1 = first_candidate(key, seeds, mask);
    (i1, second_candidate(key, seeds, mask, i1))
}

/// The first candidate bucket of `key`.
#[inline(always)]
pub(crate) fn first_candidate(key: u64, seeds: [u64; 2], mask: usize) -> usize {
    (fmix64(key ^ seeds[0]) as usize) & mask
}

/// The second candidate bucket of `key`, whose first candidate is `i1`.
#[inline(always)]
pub(crate) fn second_candidate(key: u64, seeds: [u64; 2], mask: usize, i1: usize) -> usize {
    let i2 = (fmix64(key ^ seeds[1]) as usize) & mask;
    i2 ^ usize::from(i2 == i1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmix64_known_values() {
        assert_eq!(fmix64(0), 0);
        // The finalizer is a bijection: distinct inputs map to distinct outputs.
        let outs: std::collections::HashSet<u64> = (0..10_000u64).map(fmix64).collect();
        assert_eq!(outs.len(), 10_000);
    }

    #[test]
    fn candidates_are_distinct_and_in_range() {
        for mask in [1usize, 3, 7, 1023] {
            for key in 0..5_000u64 {
                let (a, b) = candidates(key, [1, 2], mask);
                assert!(a <= mask && b <= mask);
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn candidates_spread_evenly() {
        let mask = 255usize;
        let mut hist = [0u32; 256];
        for key in 0..256 * 400u64 {
            let (a, b) = candidates(key, [0x1234, 0x5678], mask);
            hist[a] += 1;
            hist[b] += 1;
        }
        let (min, max) = (hist.iter().min().unwrap(), hist.iter().max().unwrap());
        assert!(*min > 650 && *max < 950, "min {min} max {max}");
    }
}
