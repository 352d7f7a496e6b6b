//! The cache maintainer (the cache table's single writer on the file service thread): version
//! floors, director invalidations, and the host library's explicit CACHE / INVALIDATE batches.

use std::sync::Arc;
use std::time::Duration;

use dds_apps::offload::kv::{kv_encode_record, KvApp};
use dds_cache::{CacheWriter, Config};
use dds_offload_api::OffloadApp;
use dds_offload_engine::{records, CacheMaintainer, ExposedFiles, FileReadPort, PortConfig};

#[test]
fn maintainer_floors_versions_and_records() {
    let app: Arc<dyn OffloadApp> = Arc::new(KvApp);
    let port = FileReadPort::new(PortConfig::default());
    let exposed = Arc::new(ExposedFiles::new());
    exposed.expose(1);
    exposed.expose(2);
    let mut m = CacheMaintainer::new(
        CacheWriter::new(Config::for_items(64)).unwrap(),
        app,
        port.clone(),
        exposed.clone(),
    );
    let r = m.reader();
    let mut rec = Vec::new();
    kv_encode_record(&mut rec, 5, b"hello");
    kv_encode_record(&mut rec, 6, b"world!!!!");
    let v1 = m.next_version();
    let v2 = m.next_version();
    // The newer write completes first; the older one's late completion is a no-op.
    m.write_completed(1, 4096, &rec, v2);
    assert_eq!(r.get(5).unwrap().offset, 4096 + 16);
    assert_eq!(r.get(6).unwrap().size, 9);
    m.write_completed(1, 0, &rec, v1);
    assert_eq!(r.get(5).unwrap().version, v2);
    // A director invalidation at the current version drops the key and floors it: a write
    // submitted before it (older version) cannot bring it back.
    let v3 = m.next_version();
    let lane = port.lane(0).unwrap();
    lane.invalidate(5, port.current_version()).unwrap();
    let mut svc = port.service().unwrap();
    assert_eq!(m.apply_port_invalidations(&mut svc), 1);
    assert_eq!(lane.invalidations_applied(), 1);
    assert!(r.get(5).is_none());
    m.write_completed(1, 8192, &rec, v3);
    assert!(
        r.get(5).is_none(),
        "older version after an invalidation is a no-op"
    );
    // A write submitted after the invalidation is cached.
    let v4 = m.next_version();
    m.write_completed(1, 12288, &rec, v4);
    assert_eq!(r.get(5).unwrap().offset, 12288 + 16);
    // Explicit batches from the host (ring opcodes 4 and 5).
    let mut buf = [0u8; 64];
    let n = records::encode_invalidate_items(&[5, 6], &mut buf).unwrap();
    assert_eq!(m.apply_record(records::OP_INVALIDATE, &buf[..n]), Ok(2));
    assert!(r.get(5).is_none() && r.get(6).is_none());
    let items = [records::CacheRecordItem {
        key: 9,
        offset: 100,
        file_id: 2,
        size: 10,
        tag: 0,
    }];
    let n = records::encode_cache_items(&items, &mut buf).unwrap();
    assert_eq!(m.apply_record(records::OP_CACHE, &buf[..n]), Ok(1));
    assert_eq!(r.get(9).unwrap().offset, 100);
    assert!(m.apply_record(3, &buf[..n]).is_err());
    assert!(m.apply_record(records::OP_CACHE, &buf[..n - 1]).is_err());
    std::thread::sleep(Duration::from_millis(1));
    // A file the application did not expose is never cached, by a write or a CACHE record.
    let v5 = m.next_version();
    m.write_completed(3, 0, &rec, v5);
    let items = [records::CacheRecordItem {
        key: 11,
        offset: 0,
        file_id: 3,
        size: 10,
        tag: 0,
    }];
    let n = records::encode_cache_items(&items, &mut buf).unwrap();
    m.apply_record(records::OP_CACHE, &buf[..n]).unwrap();
    assert!(r.get(11).is_none());
    assert_eq!(
        m.stats().unexposed,
        3,
        "two records of the write and one CACHE item"
    );
    // Withdrawn: later writes of the file are not cached either.
    exposed.withdraw(1);
    let v6 = m.next_version();
    m.write_completed(1, 16384, &rec, v6);
    assert_ne!(r.get(5).map(|i| i.offset), Some(16384 + 16));
}
