//! Three OSDs in one process: replication to every member, reads from each replica, recovery
//! (backfill) of an OSD whose store was replaced by an empty one while writes went on.

use std::time::{Duration, Instant};

use dds_objstore::ObjectId;
use dds_osd::client::{Client, ClientOptions};
use dds_osd::{open_store, ClusterMap, Osd, OsdConfig, StoreSpec};

/// A map of `n` OSDs on port 0 (each binds any free port).
fn map_text(n: u32) -> String {
    let mut s = String::from("epoch = 1\n");
    for id in 0..n {
        s += &format!("[[osd]]\nid = {id}\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n");
    }
    s += "[[pool]]\nid = 1\nname = \"data\"\npg_num = 8\nsize = 3\n";
    s
}

fn start(dir: &std::path::Path, map: &ClusterMap, id: u32, format: bool) -> Osd {
    let spec = StoreSpec::Local {
        device: dir.join(format!("osd{id}.img")),
        format: format.then_some((32 << 20, false)),
    };
    // A stopped OSD's store closes once its last connection thread has ended.
    let deadline = Instant::now() + Duration::from_secs(5);
    let store = loop {
        match open_store(&spec) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut cfg = OsdConfig::new(id, map.clone());
    cfg.peering_interval = Duration::from_millis(50);
    // A short log: trimming runs, and an OSD that lost its store needs a backfill.
    cfg.max_log = 4;
    // Small frames: an object bigger than a frame is read and recovered in pieces.
    cfg.max_payload = 1 << 20;
    Osd::start(cfg, store).unwrap()
}

fn wait_clean(c: &Client) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = (0..3).all(|o| {
            c.status(o).is_ok_and(|s| {
                s["pgs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|p| p["active"] == true && p["clean"] == true)
            })
        });
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "cluster never became clean");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn replicates_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = ClusterMap::parse(&map_text(3)).unwrap();
    let mut osds: Vec<Option<Osd>> = (0..3)
        .map(|i| Some(start(dir.path(), &map, i, true)))
        .collect();
    // The OSDs bound port 0; the next map names their ports (and restarts bind them).
    for (o, info) in osds.iter().zip(map.osds.iter_mut()) {
        let o = o.as_ref().unwrap();
        (info.addr, info.peer_addr) = (o.client_addr(), o.peer_addr());
    }
    map.epoch = 2;
    for o in osds.iter().flatten() {
        assert!(o.set_map(map.clone()).unwrap());
        assert!(
            !o.set_map(map.clone()).unwrap(),
            "an equal epoch is ignored"
        );
    }
    let opts = ClientOptions {
        retry_for: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let c = Client::with_map(map.clone(), opts);
    wait_clean(&c);
    for i in 0..40 {
        let oid = ObjectId::new(1, format!("obj-{i}"));
        c.write_full(&oid, format!("data {i}").as_bytes()).unwrap();
        c.setxattr(&oid, b"x", b"y").unwrap();
        c.omap_set(&oid, &[(b"k".to_vec(), format!("{i}").into_bytes())])
            .unwrap();
    }
    let oid = ObjectId::new(1, "obj-0");
    c.write(&oid, 4, b"XY").unwrap();
    assert_eq!(c.read_full(&oid).unwrap(), b"dataXY");
    assert_eq!(c.getxattr(&oid, b"x").unwrap(), b"y");
    assert_eq!(
        c.omap_get(&oid, &[b"k".to_vec(), b"z".to_vec()]).unwrap(),
        vec![Some(b"0".to_vec()), None]
    );
    assert_eq!(c.list(1).unwrap().len(), 40);
    for o in 0..3 {
        assert_eq!(c.on(o).read_full(&oid).unwrap(), b"dataXY");
        assert_eq!(c.on(o).getxattrs(&oid).unwrap().len(), 1);
    }
    // An object of 3 MiB written 768 KiB at a time: bigger than any frame.
    let big = ObjectId::new(1, "big");
    let big_data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    for (i, part) in big_data.chunks(768 << 10).enumerate() {
        c.write(&big, (i * (768 << 10)) as u64, part).unwrap();
    }
    c.setxattr(&big, b"x", b"big").unwrap();
    assert_eq!(c.read_full(&big).unwrap(), big_data);
    c.remove(&ObjectId::new(1, "obj-1")).unwrap();
    assert_eq!(
        c.stat(&ObjectId::new(1, "obj-1")).unwrap_err().status,
        dds_osd::Status::NotFound
    );
    assert_eq!(
        c.remove(&ObjectId::new(1, "obj-1")).unwrap_err().status,
        dds_osd::Status::NotFound
    );

    // OSD 2's store is replaced by an empty one: recovery (backfill) refills it.
    osds[2].take().unwrap().shutdown();
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_file(dir.path().join("osd2.img")).unwrap();
    std::fs::remove_file(dir.path().join("osd2.img.meta")).unwrap();
    osds[2] = Some(start(dir.path(), &map, 2, true));
    for i in 40..60 {
        let oid = ObjectId::new(1, format!("obj-{i}"));
        c.write_full(&oid, format!("data {i}").as_bytes()).unwrap();
    }
    wait_clean(&c);
    for o in 0..3 {
        let v = c.on(o);
        assert_eq!(v.read_full(&big).unwrap(), big_data, "osd {o}");
        assert_eq!(
            v.getxattrs(&big).unwrap(),
            vec![(b"x".to_vec(), b"big".to_vec())]
        );
        for i in 0..60 {
            let oid = ObjectId::new(1, format!("obj-{i}"));
            if i == 1 {
                assert!(v.stat(&oid).is_err());
                continue;
            }
            let want = if i == 0 {
                "dataXY".to_string()
            } else {
                format!("data {i}")
            };
            assert_eq!(
                v.read_full(&oid).unwrap(),
                want.as_bytes(),
                "osd {o} obj {i}"
            );
            if i < 40 {
                assert_eq!(
                    v.omap_list(&oid, None, 10).unwrap().len(),
                    1,
                    "osd {o} obj {i}"
                );
            }
        }
    }

    // A replica misses a removal and more writes than the log keeps: the backfill removes the
    // object it still holds.
    let removed = ObjectId::new(1, "obj-2");
    let pg = map.pg_of(1, &removed.name).unwrap();
    let victim = map.acting(pg)[1];
    osds[victim as usize].take().unwrap().shutdown();
    c.remove(&removed).unwrap();
    let mut more = Vec::new();
    for i in 0.. {
        let oid = ObjectId::new(1, format!("more-{i}"));
        if map.pg_of(1, &oid.name) == Some(pg) {
            c.write_full(&oid, b"more").unwrap();
            more.push(oid);
            if more.len() == 6 {
                break;
            }
        }
    }
    osds[victim as usize] = Some(start(dir.path(), &map, victim, false));
    wait_clean(&c);
    for o in 0..3 {
        assert_eq!(
            c.on(o).stat(&removed).unwrap_err().status,
            dds_osd::Status::NotFound,
            "osd {o}"
        );
        for oid in &more {
            assert_eq!(c.on(o).read_full(oid).unwrap(), b"more");
        }
    }
}
