//! Appends through the DPU on a real device file (io_uring, the metadata thread's fdatasync):
//! while an append's size change is being committed, the service thread keeps serving reads
//! of another file; the append then completes through the ring like any write, and its size
//! and data survive a restart. The metadata handle's syncs wait at a gate ([`SyncGate`]) so
//! the test decides when the commit finishes.

mod device;

use std::time::{Duration, Instant};

use dds_fs::SyncGate;
use dds_host::{Dds, GroupConfig, Status};
use device::{device, start};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((seed as usize * 131 + i * 7) ^ (i >> 9)) as u8)
        .collect()
}

#[test]
fn reads_are_served_while_an_append_waits_for_its_size_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = device(dir.path());
    let gate = SyncGate::new();
    let dpu = start(&path, "extend", 256 << 20, Some(gate.clone()));
    let dds = Dds::connect(dpu.socket()).unwrap();
    let a = dds.create_file("/a").unwrap().id;
    let b = dds.create_file("/b").unwrap().id;
    let content = pattern(1, 256 << 10);
    assert_eq!(dds.write_sync(b, 0, &content).unwrap(), content.len());
    let appends = dds.create_group(&GroupConfig::default()).unwrap();
    dds.poll_add(a, &appends, 7).unwrap();

    // The first append's size commit waits at the gate; the other appends wait behind it.
    gate.close();
    let datas: Vec<Vec<u8>> = (0..8)
        .map(|k| pattern(10 + k, 1000 + 3000 * k as usize))
        .collect();
    let mut end = 0u64;
    for (k, d) in datas.iter().enumerate() {
        dds.write(a, end, d, k as u64).unwrap();
        end += d.len() as u64;
    }
    assert!(
        gate.wait_held(1, Duration::from_secs(10)),
        "the appends' commit never reached its sync"
    );
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    for k in 0..200u64 {
        let off = (k * 7919 * 512) % (content.len() as u64 - 4096);
        assert_eq!(dds.read_sync(b, off, &mut buf).unwrap(), 4096);
        assert_eq!(buf, content[off as usize..off as usize + 4096], "read {k}");
    }
    let reads = t.elapsed();
    assert_eq!(gate.held(), 1, "the commit was held during the reads");
    assert!(
        appends.poll_wait(Duration::ZERO).unwrap().is_none(),
        "an append completed before its size was durable"
    );
    assert_eq!(dds.file_size(a).unwrap(), 0, "the size is not visible yet");
    eprintln!("200 reads of another file while an append's commit was held: {reads:?}");

    gate.open();
    let mut seen = Vec::new();
    while seen.len() < datas.len() {
        let c = appends
            .poll_wait(Duration::from_secs(10))
            .unwrap()
            .expect("the appends complete once the commit is done");
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.file_ctx, 7);
        assert_eq!(c.bytes as usize, datas[c.io_ctx as usize].len());
        seen.push(c.io_ctx);
    }
    assert_eq!(dds.file_size(a).unwrap(), end);
    let all = datas.concat();
    let mut back = vec![0u8; all.len()];
    assert_eq!(dds.read_sync(a, 0, &mut back).unwrap(), all.len());
    assert!(back == all);
    drop(appends);
    drop(dds);
    dpu.shutdown();

    // A restart finds the appended size and data.
    let dpu = start(&path, "extend", 256 << 20, Some(SyncGate::new()));
    let dds = Dds::connect(dpu.socket()).unwrap();
    let info = dds.lookup("/a").unwrap();
    assert_eq!(info.size, end);
    let mut back = vec![0u8; all.len()];
    assert_eq!(dds.read_sync(info.id, 0, &mut back).unwrap(), all.len());
    assert!(back == all);
    dpu.shutdown();
}
