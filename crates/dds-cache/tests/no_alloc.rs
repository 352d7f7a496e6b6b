//! All memory is allocated when the table is created: lookups, inserts (including cuckoo
//! displacement, eviction and failure), invalidations and removals never touch the heap.

use dds_cache::{CacheItem, CacheWriter, Config, InsertError};
use dds_testkit::alloc::{allocations, count_this_thread, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn operations_do_not_allocate() {
    let mut w = CacheWriter::new(Config::with_buckets(64)).unwrap();
    let r = w.reader();
    count_this_thread(true);
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
