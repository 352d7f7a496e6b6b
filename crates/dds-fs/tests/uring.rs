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
