//! Aligned heap buffers for O_DIRECT I/O.

pub use dds_sys::AlignedBuf;

/// Rounds `v` down to a multiple of `a` (a > 0).
#[inline]
pub(crate) fn align_down(v: u64, a: u64) -> u64 {
    v - v % a
}

/// Rounds `v` up to a multiple of `a` (a > 0). Callers keep `v` far from `u64::MAX`.
#[inline]
pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::new(8192, 4096);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(align_down(1000, 512), 512);
        assert_eq!(align_up(1000, 512), 1024);
        assert_eq!(align_up(1024, 512), 1024);
    }
}
