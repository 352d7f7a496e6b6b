//! The bucket array: one allocation made when the table is created, fully initialized (and so
//! page-faulted) before the table is used.

use crate::bucket::Bucket;

/// Allocate and initialize `n` empty buckets.
pub(crate) fn allocate(n: usize) -> Box<[Bucket]> {
    let mut v: Vec<Bucket> = Vec::with_capacity(n);
    // Lookups touch the array at random: huge pages spare them a page walk each.
    #[cfg(all(target_os = "linux", not(loom)))]
    dds_sys::advise_huge_pages(v.spare_capacity_mut());
    v.extend((0..n).map(|_| Bucket::new()));
    assert_eq!(
        v.len(),
        v.capacity(),
        "bucket array must not be reallocated"
    );
    v.into_boxed_slice()
}
