//! Helpers shared by the integration tests.
#![allow(dead_code)]

use dds_objstore::{ObjStore, ObjectId, Transaction, TxOp};
use std::path::PathBuf;

/// A formatted store in a temporary directory.
pub struct TestStore {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestStore {
    pub fn new(size: u64) -> TestStore {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        ObjStore::format(&path, size, false).unwrap();
        TestStore { dir, path }
    }

    pub fn open(&self) -> ObjStore {
        ObjStore::open(&self.path).unwrap()
    }
}

pub fn oid(name: &str) -> ObjectId {
    ObjectId::new(1, name.as_bytes())
}

pub fn tx(ops: Vec<TxOp>) -> Transaction {
    Transaction { ops }
}

/// Deterministic test data.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}
