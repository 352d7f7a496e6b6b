//! The bucket array: one allocation made when the table is created, fully initialized (and so
//! page-faulted) before the table is used.

use crate::bucket::Bucket;

/// Allocate and initialize `n` empty buckets.
pub(crate) fn allocate(n: usize) -> Box<[Bucket]> {
    let mut v: Vec<Bucket> = Vec::with_capacity(n);
    #[cfg(all(target_os = "linux", not(loom)))]
    advise_huge_pages(v.as_ptr().cast(), n * core::mem::size_of::<Bucket>());
    v.extend((0..n).map(|_| Bucket::new()));
    assert_eq!(
        v.len(),
        v.capacity(),
        "bucket array must not be reallocated"
    );
    v.into_boxed_slice()
}

/// Ask Linux to back the (not yet touched) bucket array with transparent huge pages. Lookups
/// touch the array at random, so with 4 KiB pages nearly every lookup needs a page walk.
/// Advice only: failure (or THP being disabled) leaves ordinary pages.
#[cfg(all(target_os = "linux", not(loom)))]
fn advise_huge_pages(start: *const u8, bytes: usize) {
    const HUGE: usize = 2 << 20;
    const PAGE: usize = 4096;
    if bytes < 2 * HUGE {
        return;
    }
    let first = (start as usize).next_multiple_of(PAGE);
    let end = (start as usize + bytes) & !(PAGE - 1);
    // SAFETY: [first, end) is page aligned and lies inside the allocation that `start` points
    // to; MADV_HUGEPAGE only changes how the kernel backs these pages, never their contents or
    // validity.
    let _ = unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
}
