//! The data path allocates nothing per request: submits and completions of reads, writes
//! (aligned and unaligned, within the file) and flushes do not touch the heap, nor do the
//! waits for the device (`wait`, and `wait_for` as the DPU's service thread waits).

mod common;

use std::os::fd::AsFd;

use common::*;
use dds_fs::align::AlignedBuf;
use dds_fs::{Device, FileService, MemDevice, UringDevice};
use dds_testkit::alloc::{allocations, count_this_thread, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs 300 rounds of mixed requests; returns the completions and the allocations counted
/// on this thread meanwhile.
fn exercise(fs: &mut FileService) -> (usize, usize) {
    let id = fs.create_file("/f").unwrap();
    fs.resize(id, 3 * SEG).unwrap();
    let bs = fs.block_size() as usize;
    let abuf = AlignedBuf::new(4 * bs, 4096);
    let mut plain = vec![7u8; 5000];
    let mut rbuf = vec![0u8; 5000];
    let mut done = 0usize;
    let bell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    count_this_thread(true);
    let before = allocations();
    for i in 0..300u64 {
        let off = (i * 7919) % (2 * SEG);
        unsafe {
            fs.submit_write(id, off, plain.as_ptr(), 3333, 1).unwrap();
            fs.submit_write(id, SEG - bs as u64, abuf.as_ptr(), 4 * bs as u32, 2)
                .unwrap();
            fs.submit_read(id, off + 1, rbuf.as_mut_ptr(), 4000, 3)
                .unwrap();
            fs.submit_read(id, 0, abuf.as_mut_ptr(), 2 * bs as u32, 4)
                .unwrap();
        }
        fs.submit_flush(5).unwrap();
        while fs.inflight() > 0 {
            // Odd rounds wait as the DPU's service thread does (the device or a bell).
            if i % 2 == 1 {
                fs.wait_for(bell.as_fd(), None, std::time::Duration::from_millis(50))
                    .unwrap();
            } else {
                fs.wait().unwrap();
            }
            fs.poll(|_, r| {
                assert!(r.is_ok());
                done += 1;
            });
        }
    }
    let allocs = allocations() - before;
    count_this_thread(false);
    plain[0] = rbuf[0];
    (done, allocs)
}

#[test]
fn no_heap_allocation_per_request() {
    let mem: Box<dyn Device> = Box::new(MemDevice::new(4 << 20, 512).with_reordering(9));
    let mut fs = fresh(mem, small_format(), small_open());
    let (done, allocs) = exercise(&mut fs);
    assert_eq!(done, 1500);
    assert_eq!(allocs, 0, "allocations on the MemDevice data path");

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dev");
    UringDevice::create_file(&p, 4 << 20).unwrap();
    let dev: Box<dyn Device> = Box::new(UringDevice::open(&p, 8).unwrap());
    let mut fs = fresh(dev, small_format(), small_open());
    let (done, allocs) = exercise(&mut fs);
    assert_eq!(done, 1500);
    assert_eq!(allocs, 0, "allocations on the io_uring data path");
}
