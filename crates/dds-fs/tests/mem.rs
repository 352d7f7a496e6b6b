//! Core suite and fault tests on the in-memory device.

mod common;

use common::*;
use dds_fs::{Device, MemDevice};

fn mem(size: u64) -> Box<dyn Device> {
    Box::new(MemDevice::new(size, 512))
}

#[test]
fn core_suite_in_order() {
    core_suite(&|| mem(8 << 20));
}

#[test]
fn core_suite_reordered() {
    core_suite(&|| Box::new(MemDevice::new(8 << 20, 512).with_reordering(7).with_queue_depth(16)));
}

#[test]
fn core_suite_4k_blocks_small_queue() {
    core_suite(&|| Box::new(MemDevice::new(8 << 20, 4096).with_queue_depth(3).with_reordering(3)));
}
