//! Behaviour of the object store on real files and io_uring.

mod common;

use common::*;
use dds_objstore::{ObjStore, ObjectStore, StoreError, StoreOptions, TxOp, BLOCK_SIZE};
use std::sync::Arc;

#[test]
fn write_read_stat_xattr_omap_list_remove() {
    let ts = TestStore::new(16 << 20);
    let s = ts.open();
    let a = oid("a");
    let data = pattern(10_000, 1);
    s.submit(&tx(vec![
        TxOp::WriteFull {
            oid: a.clone(),
            data: data.clone(),
        },
        TxOp::SetXattr {
            oid: a.clone(),
            name: b"x".to_vec(),
            value: b"1".to_vec(),
        },
        TxOp::OmapSet {
            oid: a.clone(),
            entries: vec![
                (b"k1".to_vec(), b"v1".to_vec()),
                (b"k2".to_vec(), b"v2".to_vec()),
            ],
        },
        TxOp::Touch { oid: oid("b") },
    ]))
    .unwrap();
    assert_eq!(s.read(&a, 0, 1 << 20).unwrap(), data);
    assert_eq!(s.read(&a, 4000, 200).unwrap(), &data[4000..4200]);
    assert_eq!(s.read(&a, 9_990, 100).unwrap(), &data[9_990..]);
    assert!(s.read(&a, 20_000, 100).unwrap().is_empty());
    assert_eq!(s.stat(&a).unwrap().size, 10_000);
    assert_eq!(s.stat(&oid("b")).unwrap().size, 0);
    assert_eq!(s.getxattr(&a, b"x").unwrap(), b"1");
    assert_eq!(
        s.getxattrs(&a).unwrap(),
        vec![(b"x".to_vec(), b"1".to_vec())]
    );
    assert_eq!(
        s.omap_get(&a, &[b"k2".to_vec(), b"zz".to_vec()]).unwrap(),
        vec![Some(b"v2".to_vec()), None]
    );
    assert_eq!(
        s.omap_list(&a, Some(b"k1"), 10).unwrap(),
        vec![(b"k2".to_vec(), b"v2".to_vec())]
    );
    assert_eq!(
        s.list(1, None, 10).unwrap(),
        vec![b"a".to_vec(), b"b".to_vec()]
    );
    assert_eq!(s.list(1, Some(b"a"), 10).unwrap(), vec![b"b".to_vec()]);
    assert!(s.list(2, None, 10).unwrap().is_empty());
    assert_eq!(s.statfs().unwrap().objects, 2);

    // Unaligned overwrite in the middle and an extension past a hole.
    s.submit(&tx(vec![
        TxOp::Write {
            oid: a.clone(),
            offset: 4090,
            data: vec![7; 20],
        },
        TxOp::Write {
            oid: a.clone(),
            offset: 50_000,
            data: vec![9; 3],
        },
    ]))
    .unwrap();
    let mut want = data.clone();
    want[4090..4110].fill(7);
    want.resize(50_000, 0);
    want.extend_from_slice(&[9; 3]);
    assert_eq!(s.read(&a, 0, u64::MAX).unwrap(), want);

    // Truncate down mid-block, then grow: the cut bytes read as zeros.
    s.submit(&tx(vec![
        TxOp::Truncate {
            oid: a.clone(),
            size: 5000,
        },
        TxOp::Truncate {
            oid: a.clone(),
            size: 9000,
        },
    ]))
    .unwrap();
    want.truncate(5000);
    want.resize(9000, 0);
    assert_eq!(s.read(&a, 0, u64::MAX).unwrap(), want);

    s.submit(&tx(vec![TxOp::Remove { oid: a.clone() }]))
        .unwrap();
    assert!(matches!(s.stat(&a), Err(StoreError::NotFound(_))));
    assert!(matches!(s.getxattr(&a, b"x"), Err(StoreError::NotFound(_))));
    // Recreated: no old xattrs or omap.
    s.submit(&tx(vec![TxOp::Touch { oid: a.clone() }])).unwrap();
    assert!(s.getxattrs(&a).unwrap().is_empty());
    assert!(s.omap_list(&a, None, 10).unwrap().is_empty());
    drop(s);
    let s = ts.open();
    let r = s.fsck(true).unwrap();
    assert_eq!(r.objects, 2);
    assert_eq!(s.statfs().unwrap().allocated_bytes, 0);
}

#[test]
fn failing_transaction_applies_nothing() {
    let ts = TestStore::new(8 << 20);
    let s = ts.open();
    let a = oid("a");
    s.submit(&tx(vec![TxOp::WriteFull {
        oid: a.clone(),
        data: vec![1; 5000],
    }]))
    .unwrap();
    let before = s.statfs().unwrap();
    for bad in [
        TxOp::Remove {
            oid: oid("missing"),
        },
        TxOp::Truncate {
            oid: oid("missing"),
            size: 1,
        },
        TxOp::RmXattr {
            oid: a.clone(),
            name: b"nope".to_vec(),
        },
        TxOp::OmapClear {
            oid: oid("missing"),
        },
    ] {
        let r = s.submit(&tx(vec![
            TxOp::WriteFull {
                oid: a.clone(),
                data: vec![2; 9000],
            },
            TxOp::SetXattr {
                oid: oid("new"),
                name: b"x".to_vec(),
                value: vec![],
            },
            bad,
        ]));
        assert!(matches!(r, Err(StoreError::NotFound(_))), "{r:?}");
    }
    assert_eq!(s.read(&a, 0, 1 << 20).unwrap(), vec![1; 5000]);
    assert!(matches!(s.stat(&oid("new")), Err(StoreError::NotFound(_))));
    assert_eq!(s.statfs().unwrap(), before);
    s.fsck(true).unwrap();
}

#[test]
fn limits_are_invalid_arguments() {
    let ts = TestStore::new(8 << 20);
    let s = ObjStore::open_with(
        &ts.path,
        StoreOptions {
            max_object_size: 1 << 20,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let bad = [
        TxOp::Write {
            oid: oid("a"),
            offset: u64::MAX - 1,
            data: vec![1; 10],
        },
        TxOp::Write {
            oid: oid("a"),
            offset: 1 << 20,
            data: vec![1],
        },
        TxOp::WriteFull {
            oid: oid("a"),
            data: vec![0; (1 << 20) + 1],
        },
        TxOp::Truncate {
            oid: oid("a"),
            size: (1 << 20) + 1,
        },
        TxOp::Touch {
            oid: dds_objstore::ObjectId::new(1, vec![b'n'; 4097]),
        },
        TxOp::Touch { oid: oid("") },
        TxOp::SetXattr {
            oid: oid("a"),
            name: vec![b'x'; 300],
            value: vec![],
        },
    ];
    for op in bad {
        let r = s.submit(&tx(vec![op]));
        assert!(matches!(r, Err(StoreError::InvalidArgument(_))), "{r:?}");
    }
    assert_eq!(s.statfs().unwrap().objects, 0);
}

#[test]
fn corrupted_block_reads_as_corrupt() {
    use std::os::unix::fs::FileExt;
    let ts = TestStore::new(8 << 20);
    let s = ts.open();
    let a = oid("victim");
    let data = pattern(3 * BLOCK_SIZE, 5);
    s.submit(&tx(vec![TxOp::WriteFull {
        oid: a.clone(),
        data: data.clone(),
    }]))
    .unwrap();
    drop(s);
    // Find the device block holding the second logical block: its bytes are unique.
    let dev = std::fs::read(&ts.path).unwrap();
    let needle = &data[BLOCK_SIZE..2 * BLOCK_SIZE];
    let at = dev
        .windows(BLOCK_SIZE)
        .step_by(1)
        .position(|w| w == needle)
        .expect("the block is on the device");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&ts.path)
        .unwrap();
    f.write_at(&[dev[at + 100] ^ 0x40], (at + 100) as u64)
        .unwrap();
    drop(f);
    let s = ts.open();
    assert_eq!(s.read(&a, 0, 100).unwrap(), &data[..100]);
    match s.read(&a, 0, u64::MAX) {
        Err(StoreError::Corrupt { name, offset, .. }) => {
            assert_eq!(name, "victim");
            assert_eq!(offset, BLOCK_SIZE as u64);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // A partial overwrite of the damaged block needs its old bytes: the tx fails as Corrupt.
    let r = s.submit(&tx(vec![TxOp::Write {
        oid: a.clone(),
        offset: BLOCK_SIZE as u64 + 10,
        data: vec![1; 10],
    }]));
    assert!(matches!(r, Err(StoreError::Corrupt { .. })), "{r:?}");
    assert!(matches!(s.fsck(true), Err(StoreError::Corrupt { .. })));
    // A full overwrite replaces it.
    s.submit(&tx(vec![TxOp::WriteFull {
        oid: a.clone(),
        data: data.clone(),
    }]))
    .unwrap();
    assert_eq!(s.read(&a, 0, u64::MAX).unwrap(), data);
}

#[test]
fn encoded_transactions_and_the_device_lock() {
    let ts = TestStore::new(4 << 20);
    let s = ts.open();
    let a = oid("enc");
    let t = tx(vec![
        TxOp::Write {
            oid: a.clone(),
            offset: 100,
            data: pattern(9000, 3),
        },
        TxOp::OmapSet {
            oid: a.clone(),
            entries: vec![(b"k".to_vec(), b"v".to_vec())],
        },
    ]);
    s.submit_encoded(&t.to_bytes()).unwrap();
    let mut want = vec![0; 100];
    want.extend(pattern(9000, 3));
    assert_eq!(s.read(&a, 0, u64::MAX).unwrap(), want);
    assert_eq!(
        s.omap_get(&a, &[b"k".to_vec()]).unwrap(),
        vec![Some(b"v".to_vec())]
    );
    let bytes = t.to_bytes();
    for bad in [&bytes[..bytes.len() - 1], b"DDTX".as_slice(), b""] {
        let r = s.submit_encoded(bad);
        assert!(matches!(r, Err(StoreError::InvalidArgument(_))), "{r:?}");
    }
    // A second opener and a format of the open device are refused.
    assert!(matches!(
        ObjStore::open(&ts.path),
        Err(StoreError::Io { .. })
    ));
    assert!(ObjStore::format(&ts.path, 4 << 20, true).is_err());
    drop(s);
    ts.open().fsck(true).unwrap();
}

#[test]
fn format_refuses_a_formatted_device() {
    let ts = TestStore::new(4 << 20);
    let s = ts.open();
    s.submit(&tx(vec![TxOp::Touch { oid: oid("a") }])).unwrap();
    drop(s);
    assert!(matches!(
        ObjStore::format(&ts.path, 4 << 20, false),
        Err(StoreError::AlreadyFormatted(_))
    ));
    assert_eq!(ts.open().statfs().unwrap().objects, 1);
    ObjStore::format(&ts.path, 4 << 20, true).unwrap();
    assert_eq!(ts.open().statfs().unwrap().objects, 0);
    assert!(matches!(
        ObjStore::format(ts.dir.path().join("tiny"), 4096, false),
        Err(StoreError::InvalidArgument(_))
    ));
}

#[test]
fn enospc_fails_cleanly_and_the_store_stays_usable() {
    let ts = TestStore::new(1 << 20); // 255 data blocks
    let s = ts.open();
    let mut written = Vec::new();
    let mut i = 0;
    let err = loop {
        let o = oid(&format!("o{i}"));
        let data = pattern(40 * BLOCK_SIZE, i as u8);
        match s.submit(&tx(vec![
            TxOp::WriteFull {
                oid: o.clone(),
                data: data.clone(),
            },
            TxOp::SetXattr {
                oid: o.clone(),
                name: b"i".to_vec(),
                value: vec![i as u8],
            },
        ])) {
            Ok(()) => written.push((o, data)),
            Err(e) => break e,
        }
        i += 1;
    };
    assert!(matches!(err, StoreError::NoSpace { .. }), "{err:?}");
    assert_eq!(written.len(), 6);
    // The failed object does not exist at all.
    assert!(matches!(
        s.stat(&oid(&format!("o{i}"))),
        Err(StoreError::NotFound(_))
    ));
    for (o, d) in &written {
        assert_eq!(&s.read(o, 0, u64::MAX).unwrap(), d);
    }
    // Freeing space makes room again.
    s.submit(&tx(vec![TxOp::Remove {
        oid: written[0].0.clone(),
    }]))
    .unwrap();
    s.submit(&tx(vec![TxOp::WriteFull {
        oid: oid("after"),
        data: vec![3; 30 * BLOCK_SIZE],
    }]))
    .unwrap();
    drop(s);
    let s = ts.open();
    s.fsck(true).unwrap();
    assert_eq!(s.read(&oid("after"), 0, 10).unwrap(), vec![3; 10]);
}

#[test]
fn concurrent_submitters_each_get_their_result() {
    let ts = TestStore::new(64 << 20);
    let s = Arc::new(ts.open());
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..40u32 {
                    let o = oid(&format!("t{t}-{}", i % 5));
                    let data = pattern(1000 + (i as usize * 997) % 20_000, t ^ i as u8);
                    s.submit(&tx(vec![
                        TxOp::WriteFull {
                            oid: o.clone(),
                            data: data.clone(),
                        },
                        TxOp::OmapSet {
                            oid: o.clone(),
                            entries: vec![(b"i".to_vec(), i.to_le_bytes().to_vec())],
                        },
                    ]))
                    .unwrap();
                    // Every third transaction of every thread fails, alone.
                    if i % 3 == 0 {
                        let r = s.submit(&tx(vec![
                            TxOp::Write {
                                oid: o.clone(),
                                offset: 0,
                                data: vec![0xEE; 100],
                            },
                            TxOp::Remove {
                                oid: oid(&format!("absent-{t}")),
                            },
                        ]));
                        assert!(matches!(r, Err(StoreError::NotFound(_))));
                    }
                    assert_eq!(s.read(&o, 0, u64::MAX).unwrap(), data);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.statfs().unwrap().objects, 40);
    let s = Arc::try_unwrap(s).ok().unwrap();
    drop(s);
    ts.open().fsck(true).unwrap();
}

#[test]
fn readers_never_see_reused_blocks() {
    // Overwrites free blocks that concurrent readers may still be reading under the old
    // metadata; those blocks must not be reused until the readers are done.
    let ts = TestStore::new(2 << 20); // 511 data blocks: reuse comes quickly
    let s = Arc::new(ts.open());
    let o = oid("hot");
    let size = 64 * BLOCK_SIZE;
    s.submit(&tx(vec![TxOp::WriteFull {
        oid: o.clone(),
        data: vec![0; size],
    }]))
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (s, o, stop) = (s.clone(), o.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let d = s.read(&o, 0, u64::MAX).unwrap();
                    assert_eq!(d.len(), size);
                    assert!(d.iter().all(|&b| b == d[0]), "a torn read");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for i in 1..=150u32 {
        s.submit(&tx(vec![TxOp::WriteFull {
            oid: o.clone(),
            data: vec![i as u8; size],
        }]))
        .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 0);
    assert_eq!(s.read(&o, 0, 1).unwrap(), vec![150]);
    assert_eq!(s.statfs().unwrap().allocated_bytes, size as u64);
}

#[test]
fn submit_with_reports_each_result_once_in_order() {
    let ts = TestStore::new(8 << 20);
    let s = ts.open();
    let (tx_done, rx_done) = std::sync::mpsc::channel();
    for i in 0..50u32 {
        let t = if i % 7 == 3 {
            tx(vec![TxOp::Remove { oid: oid("never") }])
        } else {
            tx(vec![TxOp::Write {
                oid: oid("seq"),
                offset: u64::from(i) * 100,
                data: pattern(100, i as u8),
            }])
        };
        let done = tx_done.clone();
        if i % 2 == 0 {
            s.submit_with(&t, move |r| done.send((i, r.is_ok())).unwrap())
                .unwrap();
        } else {
            s.submit_encoded_with(&t.to_bytes(), move |r| done.send((i, r.is_ok())).unwrap())
                .unwrap();
        }
    }
    // A transaction over the limits is refused at once; its callback is never called.
    let bad = tx(vec![TxOp::Touch { oid: oid("") }]);
    let r = s.submit_with(&bad, |_| panic!("called"));
    assert!(matches!(r, Err(StoreError::InvalidArgument(_))));
    drop(tx_done);
    let got: Vec<(u32, bool)> = rx_done.iter().take(50).collect();
    let want: Vec<(u32, bool)> = (0..50).map(|i| (i, i % 7 != 3)).collect();
    assert_eq!(got, want);
    let data = s.read(&oid("seq"), 0, u64::MAX).unwrap();
    assert_eq!(data.len(), 5000);
    for i in (0..50u32).filter(|i| i % 7 != 3) {
        let at = i as usize * 100;
        assert_eq!(&data[at..at + 100], pattern(100, i as u8));
    }
}
