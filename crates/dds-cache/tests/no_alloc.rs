//! All memory is allocated when the table is created: lookups, inserts (including cuckoo
//! displacement, eviction and failure), invalidations and removals never touch the heap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dds_cache::{CacheItem, CacheWriter, Config, InsertError};

struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts on the side.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn operations_do_not_allocate() {
    let mut w = CacheWriter::new(Config::with_buckets(64)).unwrap();
    let r = w.reader();
    let mut inserted = [false; 400];
    let before = allocations();
    let mut full = 0;
    for k in 0..400u64 {
        let item = CacheItem::new(k, k, 1, k * 512, 512);
        match w.insert(item) {
            Ok(_) => inserted[k as usize] = true,
            Err(InsertError::Full(_)) => full += 1,
        }
        assert_eq!(r.get(k).is_some(), inserted[k as usize]);
    }
    for k in 0..400u64 {
        assert_eq!(r.get(k).is_some(), inserted[k as usize]);
        if inserted[k as usize] {
            w.insert(CacheItem::new(k, k + 1, 1, 0, 1)).unwrap();
        }
    }
    for k in 0..100 {
        w.invalidate(k, k + 1);
        w.remove(k + 100);
        w.insert_evicting(CacheItem::new(1000 + k, 5000, 2, 0, 1));
    }
    let _ = w.stats();
    let after = allocations();
    assert!(full > 0, "the test should also exercise a full table");
    assert!(w.stats().moves > 0);
    assert_eq!(after, before, "table operations allocated");
}
