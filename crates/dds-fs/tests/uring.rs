//! Core suite on a real O_DIRECT file driven by io_uring.

mod common;

use common::*;
use dds_fs::{Device, UringDevice};

#[test]
fn core_suite_on_uring_tempfile() {
    let dir = tempfile::tempdir().unwrap();
    let n = std::cell::Cell::new(0);
    core_suite(&|| {
        let p = dir.path().join(format!("dev{}", n.get()));
        n.set(n.get() + 1);
        UringDevice::create_file(&p, 8 << 20).unwrap();
        Box::new(UringDevice::open(&p, 8).unwrap()) as Box<dyn Device>
    });
}

/// `wait_for` ends when the device completes what was submitted, and at once when the wake
/// descriptor is readable or nothing is in flight: long before its timeout.
#[test]
fn wait_for_ends_at_a_completion_or_the_wake_descriptor() {
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dev");
    UringDevice::create_file(&p, 8 << 20).unwrap();
    let mut fs = fresh(
        Box::new(UringDevice::open(&p, 8).unwrap()),
        small_format(),
        small_open(),
    );
    let id = fs.create_file("/w").unwrap();
    fs.resize(id, 64 << 10).unwrap();
    let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let long = Duration::from_secs(20);
    let prompt = Duration::from_secs(5);

    // Nothing in flight: no wait.
    let t = Instant::now();
    fs.wait_for(wake.as_fd(), None, long).unwrap();
    assert!(t.elapsed() < prompt);

    // A write in flight: the wait ends with its completion, which `poll` then reports.
    let mut buf = dds_fs::align::AlignedBuf::new(4096, 4096);
    buf.as_mut_slice().fill(7);
    let t = Instant::now();
    unsafe { fs.submit_write(id, 0, buf.as_ptr(), 4096, 1).unwrap() };
    let mut done = None;
    while done.is_none() {
        fs.wait_for(wake.as_fd(), None, long).unwrap();
        fs.poll(|u, r| done = Some((u, r)));
        assert!(t.elapsed() < prompt, "the wait outlived the write");
    }
    assert_eq!(done, Some((1, Ok(4096))));

    // The wake descriptor readable: the wait ends at once whatever is in flight.
    rustix::io::write(&wake, &1u64.to_ne_bytes()).unwrap();
    let t = Instant::now();
    unsafe { fs.submit_read(id, 0, buf.as_mut_ptr(), 4096, 2).unwrap() };
    fs.wait_for(wake.as_fd(), None, long).unwrap();
    assert!(t.elapsed() < prompt);
    drain(&mut fs);

    // So does the caller's other descriptor (`also`), with `wake` quiet.
    let mut word = [0u8; 8];
    rustix::io::read(&wake, &mut word).unwrap();
    let other = rustix::event::eventfd(1, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let t = Instant::now();
    unsafe { fs.submit_read(id, 0, buf.as_mut_ptr(), 4096, 3).unwrap() };
    fs.wait_for(wake.as_fd(), Some(other.as_fd()), long)
        .unwrap();
    assert!(t.elapsed() < prompt);
    drain(&mut fs);
}
