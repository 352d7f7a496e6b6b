//! A damaged metadata log record is detected, not taken as the end of the log: the file
//! service refuses to open a device whose log has valid records after a damaged one (they
//! hold acknowledged operations), names the damaged record, and `dds_fs::check` explains it.
//! A torn last record (a crash while it was written) is still the end of the log.

mod common;

use std::path::Path;

use common::{fresh, small_format, small_open};
use dds_fs::{check, FileService, FsError, UringDevice};

const BLOCK: usize = 512;

/// Offsets and lengths of the metadata log records in a device image, in sequence order.
fn log_records(img: &[u8]) -> Vec<(usize, usize, u64)> {
    let mut v = Vec::new();
    let mut at = 0;
    while at + 32 <= img.len() {
        if &img[at..at + 4] == b"DDSL" {
            let total = u32::from_le_bytes(img[at + 8..at + 12].try_into().unwrap()) as usize;
            let seq = u64::from_le_bytes(img[at + 24..at + 32].try_into().unwrap());
            if (32..=img.len() - at).contains(&total) {
                v.push((at, total, seq));
            }
        }
        at += BLOCK;
    }
    v.sort_by_key(|r| r.2);
    v
}

/// A device file with five files created one by one (five log records, all acknowledged).
fn five_files(path: &Path) {
    UringDevice::create_file(path, 8 << 20).unwrap();
    let dev = UringDevice::open(path, 32).unwrap();
    let mut fs = fresh(Box::new(dev), small_format(), small_open());
    for i in 0..5 {
        fs.create_file(&format!("/f{i}")).unwrap();
    }
}

fn open(path: &Path) -> Result<FileService, FsError> {
    FileService::open(Box::new(UringDevice::open(path, 32)?), small_open())
}

fn check_image(path: &Path) -> dds_fs::CheckReport {
    let mut dev = UringDevice::open(path, 32).unwrap();
    check(&mut dev)
}

#[test]
fn a_damaged_record_before_valid_ones_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev.img");
    five_files(&path);
    assert_eq!(check_image(&path).files, 5);
    let mut img = std::fs::read(&path).unwrap();
    let recs = log_records(&img);
    assert!(recs.len() >= 5, "log records: {recs:?}");
    // The record of the second file's creation: flip its last byte.
    let (at, total, seq) = recs[recs.len() - 4];
    img[at + total - 1] ^= 0x5a;
    std::fs::write(&path, &img).unwrap();

    let err = open(&path).err().expect("a damaged log must not open");
    let msg = err.to_string();
    assert!(matches!(err, FsError::Corrupt(_)), "{msg}");
    assert!(msg.contains(&format!("record {seq}")), "{msg}");
    let report = check_image(&path);
    assert!(
        report
            .damage
            .as_deref()
            .is_some_and(|d| d.contains(&format!("record {seq}"))),
        "{report:?}"
    );
    // Nothing was appended after the damage: the image is unchanged by the failed open.
    assert_eq!(std::fs::read(&path).unwrap(), img);
}

#[test]
fn a_torn_last_record_is_the_end_of_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev.img");
    five_files(&path);
    let mut img = std::fs::read(&path).unwrap();
    let recs = log_records(&img);
    let (at, total, _) = *recs.last().unwrap();
    // A crash while the last record was written: its second half never reached the device.
    img[at + total / 2..at + total].fill(0);
    std::fs::write(&path, &img).unwrap();
    let report = check_image(&path);
    assert_eq!((report.files, report.damage.as_deref()), (4, None));
    let fs = open(&path).unwrap();
    assert_eq!(fs.free_space().files, 4);
    assert!(fs.lookup("/f3").is_ok() && fs.lookup("/f4").is_err());
}
