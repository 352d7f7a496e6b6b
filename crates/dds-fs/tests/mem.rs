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
    core_suite(&|| {
        Box::new(
            MemDevice::new(8 << 20, 512)
                .with_reordering(7)
                .with_queue_depth(16),
        )
    });
}

#[test]
fn core_suite_4k_blocks_small_queue() {
    core_suite(&|| {
        Box::new(
            MemDevice::new(8 << 20, 4096)
                .with_queue_depth(3)
                .with_reordering(3),
        )
    });
}

use common::model::{apply_fs, check_recovered, gen_op, rng, snapshot, Model};
use dds_fs::{FileService, FormatConfig, FsError};

fn tiny_format() -> FormatConfig {
    // Small log: checkpoints happen every couple of dozen records.
    FormatConfig {
        segment_size: 4096,
        max_files: 16,
        max_dirs: 4,
        max_name_len: 16,
        log_bytes: 0,
        fs_uuid: Some(42),
    }
}

#[test]
fn data_io_errors_are_reported_through_poll() {
    let dev = MemDevice::new(4 << 20, 512);
    let faults = dev.fault_injector();
    let mut fs = fresh(Box::new(dev), small_format(), small_open());
    let id = fs.create_file("/f").unwrap();
    write(&mut fs, id, 0, &pattern(1, 5000)).unwrap();
    // plain write error
    faults.fail_async_op(0);
    assert!(matches!(
        write_aligned(&mut fs, id, 0, &[1; 512]),
        Err(FsError::Io(_))
    ));
    // read-modify-write: the edge read fails
    faults.fail_async_op(0);
    assert!(matches!(
        write(&mut fs, id, 10, &[1; 10]),
        Err(FsError::Io(_))
    ));
    // second piece of a multi-part read fails
    let big = pattern(2, 3 * SEG as usize);
    write(&mut fs, id, 0, &big).unwrap();
    faults.fail_async_op(1);
    assert!(matches!(
        read(&mut fs, id, 100, 2 * SEG as u32),
        Err(FsError::Io(_))
    ));
    // flush error
    faults.fail_async_op(0);
    fs.submit_flush(5).unwrap();
    assert!(matches!(wait_for(&mut fs, 5), Err(FsError::Io(_))));
    // everything still works afterwards, nothing leaked
    assert_eq!(fs.inflight(), 0);
    assert_eq!(read(&mut fs, id, 0, 3 * SEG as u32).unwrap(), big);
    for _ in 0..200 {
        write(&mut fs, id, 7, &[3; 9000]).unwrap();
    }
    fs.check_consistency().unwrap();
    // a metadata write error stops further changes but keeps serving reads
    faults.fail_sync_op(0);
    assert!(matches!(fs.create_file("/g"), Err(FsError::Io(_))));
    assert!(matches!(fs.create_file("/h"), Err(FsError::Io(_))));
    assert_eq!(
        read(&mut fs, id, 0, 16).unwrap(),
        vec![big[0], big[1], big[2], big[3], big[4], big[5], big[6], 3, 3, 3, 3, 3, 3, 3, 3, 3]
    );
    let fs = reopen(fs, small_open());
    assert!(fs.lookup("/h").is_err());
    fs.check_consistency().unwrap();
}

/// Simulated power loss at every synchronous device operation of a workload: after
/// recovery, every acknowledged operation is present and the allocation map is consistent.
#[test]
fn power_loss_at_every_metadata_step() {
    let ops = {
        let mut m = Model::default();
        let mut r = rng(5);
        let mut v = Vec::new();
        for _ in 0..60 {
            let op = gen_op(&m, &mut r, 3 * 4096 + 100);
            m.apply(&op);
            v.push(op);
        }
        v
    };
    // Count synchronous ops of a clean run.
    let total = {
        let dev = MemDevice::new(1 << 20, 512);
        let f = dev.fault_injector();
        let mut fs = fresh(Box::new(dev), tiny_format(), small_open());
        let start = f.sync_ops();
        for op in &ops {
            apply_fs(&mut fs, op).unwrap();
        }
        f.sync_ops() - start
    };
    assert!(total > 100, "workload too small: {total}");
    for k in 0..total {
        let dev = MemDevice::new(1 << 20, 512);
        let f = dev.fault_injector();
        let mut fs = fresh(Box::new(dev), tiny_format(), small_open());
        f.die_at_sync_op(k);
        let mut acked = Model::default();
        let mut pending = None;
        for op in &ops {
            match apply_fs(&mut fs, op) {
                Ok(()) => acked.apply(op),
                Err(_) => {
                    pending = Some(op.clone());
                    break;
                }
            }
        }
        assert!(f.is_dead() && pending.is_some(), "step {k}: no failure");
        let dev = fs.into_device();
        f.clear();
        let mut fs = FileService::open(dev, small_open())
            .unwrap_or_else(|e| panic!("step {k}: recovery failed: {e}"));
        fs.check_consistency().unwrap();
        let got = snapshot(&mut fs);
        if let Err(e) = check_recovered(&got, &acked, pending.as_ref()) {
            panic!("step {k}, pending {pending:?}: {e}");
        }
        let sp = fs.free_space();
        let used: u64 = got
            .files
            .values()
            .map(|d| (d.len() as u64).div_ceil(4096))
            .sum();
        assert_eq!(
            u64::from(sp.free_segments),
            u64::from(sp.total_segments) - used
        );
    }
}

#[test]
fn corrupt_or_foreign_devices_are_rejected() {
    let mut dev = MemDevice::new(1 << 20, 512);
    assert!(matches!(
        FileService::open(Box::new(MemDevice::new(1 << 20, 512)), small_open()),
        Err(FsError::Corrupt(_))
    ));
    dds_fs::format(&mut dev, tiny_format()).unwrap();
    // primary superblock destroyed: the backup is used
    let mut img = dev.snapshot();
    img[8] ^= 0xff;
    let fs = FileService::open(
        Box::new(MemDevice::from_image(img.clone(), 512)),
        small_open(),
    )
    .unwrap();
    drop(fs);
    // both destroyed
    img[512 + 8] ^= 0xff;
    assert!(matches!(
        FileService::open(Box::new(MemDevice::from_image(img, 512)), small_open()),
        Err(FsError::Corrupt(_))
    ));
    // bad open config
    assert!(matches!(
        FileService::open(
            Box::new(dev),
            dds_fs::OpenConfig {
                max_inflight: 0,
                ..small_open()
            }
        ),
        Err(FsError::InvalidConfig(_))
    ));
    // too small for the format
    let mut small = MemDevice::new(64 << 10, 512);
    assert!(matches!(
        dds_fs::format(&mut small, FormatConfig::default()),
        Err(FsError::InvalidConfig(_))
    ));
}
