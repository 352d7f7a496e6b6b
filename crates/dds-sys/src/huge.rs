//! Transparent huge pages for large tables that are read at random.

/// Asks Linux to back `region` with transparent huge pages (2 MiB) wherever its pages are not
/// touched yet: a table that lookups read at random (a hash index, a key-value log) otherwise
/// costs nearly every lookup a page walk, and in a virtual machine a two-dimensional one.
/// Advice only: where the kernel refuses (THP disabled, a region under 4 MiB), the region keeps
/// ordinary pages, with the same contents.
///
/// Call it before the region is first written: pages that are already there stay as they are
/// until the kernel collapses them.
pub fn advise_huge_pages<T>(region: &mut [T]) {
    const HUGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(region);
    if bytes < 2 * HUGE {
        return;
    }
    let page = rustix::param::page_size();
    let start = region.as_mut_ptr() as usize;
    let first = start.next_multiple_of(page);
    let end = (start + bytes) & !(page - 1);
    // SAFETY: [first, end) is page aligned and lies inside `region`, which the caller holds
    // exclusively; MADV_HUGEPAGE only changes how the kernel backs these pages, never their
    // contents or validity.
    let _ = unsafe {
        rustix::mm::madvise(
            first as *mut std::ffi::c_void,
            end - first,
            rustix::mm::Advice::LinuxHugepage,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::advise_huge_pages;

    #[test]
    fn advice_keeps_contents_of_any_region() {
        // Written before and after the advice, at an offset that is not page aligned.
        let mut v = vec![0u8; 9 << 20];
        v.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        advise_huge_pages(&mut v[13..]);
        assert!(v.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        // Too small to hold a huge page: nothing to do.
        let mut small = [7u64; 16];
        advise_huge_pages(&mut small);
        assert_eq!(small, [7; 16]);
        // Not yet written: reads as zeros, then as written.
        let mut fresh = vec![0u64; 1 << 20];
        advise_huge_pages(&mut fresh);
        assert!(fresh.iter().all(|&x| x == 0));
        fresh[123_456] = 9;
        assert_eq!(fresh.iter().sum::<u64>(), 9);
    }
}
