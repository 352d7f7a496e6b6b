//! Three OSDs in one process: replication to every member, reads from each replica, recovery
//! (backfill) of an OSD whose store was replaced by an empty one while writes went on.

mod common;

use std::time::{Duration, Instant};

use std::sync::Arc;

use common::wait_clean_on;
use dds_objstore::{ObjectId, ObjectStore, Transaction, TxOp};
use dds_osd::client::{Client, ClientOptions};
use dds_osd::pglog::{self, LogEntry, Retention, KIND_MODIFY};
use dds_osd::wire::{self, op, Enc, Header};
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
    start_with_store(dir, map, id, format).0
}

/// [`start`] with a log of `max_log` entries: a retried write is recognised as long as its
/// version is still in the log.
fn start_logging(
    dir: &std::path::Path,
    map: &ClusterMap,
    id: u32,
    format: bool,
    max_log: u64,
) -> Osd {
    let keep = Retention {
        max_log,
        ..Retention::default()
    };
    start_full(dir, map, id, format, keep).0
}

/// [`start`], also returning the OSD's store.
fn start_with_store(
    dir: &std::path::Path,
    map: &ClusterMap,
    id: u32,
    format: bool,
) -> (Osd, Arc<dyn ObjectStore>) {
    // A short log: trimming runs, and an OSD that lost its store needs a backfill.
    start_full(dir, map, id, format, SHORT)
}

/// A log of 4 entries and the request ids of 64 versions.
const SHORT: Retention = Retention {
    max_log: 4,
    max_dups: 64,
};

fn start_full(
    dir: &std::path::Path,
    map: &ClusterMap,
    id: u32,
    format: bool,
    keep: Retention,
) -> (Osd, Arc<dyn ObjectStore>) {
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
    cfg.retention = keep;
    // Small frames: an object bigger than a frame is read and recovered in pieces.
    cfg.max_payload = 1 << 20;
    (Osd::start(cfg, store.clone()).unwrap(), store)
}

fn wait_clean(c: &Client) {
    wait_clean_on(c, &[0, 1, 2]);
}

#[test]
fn replicates_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = ClusterMap::parse(&map_text(3)).unwrap();
    let mut osds: Vec<Option<Osd>> = (0..3)
        .map(|i| Some(start(dir.path(), &map, i, true)))
        .collect();
    // The OSDs bound port 0; the next map names their ports (and restarts bind them).
    addressed(&mut map, &osds);
    for o in osds.iter().flatten() {
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
    replace_store(dir.path(), &map, &mut osds, 2);
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

/// Stops OSD `id`, deletes its store and starts it again on an empty one (formatted, with
/// [`SHORT`] retention): the OSD's store returned, for reading what recovery wrote.
fn replace_store(
    dir: &std::path::Path,
    map: &ClusterMap,
    osds: &mut [Option<Osd>],
    id: u32,
) -> Arc<dyn ObjectStore> {
    osds[id as usize].take().unwrap().shutdown();
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_file(dir.join(format!("osd{id}.img"))).unwrap();
    std::fs::remove_file(dir.join(format!("osd{id}.img.meta"))).unwrap();
    let (o, store) = start_full(dir, map, id, true, SHORT);
    osds[id as usize] = Some(o);
    store
}

/// Gives `map` the ports the OSDs bound and epoch 2, and gives it to them.
fn addressed(map: &mut ClusterMap, osds: &[Option<Osd>]) {
    for (o, info) in osds.iter().zip(map.osds.iter_mut()) {
        let o = o.as_ref().unwrap();
        (info.addr, info.peer_addr) = (o.client_addr(), o.peer_addr());
    }
    map.epoch = 2;
    for o in osds.iter().flatten() {
        o.set_map(map.clone()).unwrap();
    }
}

/// Three OSDs with short logs ([`SHORT`]) on their own stores, addressed (epoch 2) and clean,
/// and a client.
struct Three {
    map: ClusterMap,
    osds: Vec<Option<Osd>>,
    stores: Vec<Arc<dyn ObjectStore>>,
    c: Client,
}

fn three_clean(dir: &std::path::Path) -> Three {
    let mut map = ClusterMap::parse(&map_text(3)).unwrap();
    let mut stores = Vec::new();
    let osds: Vec<Option<Osd>> = (0..3)
        .map(|i| {
            let (o, s) = start_with_store(dir, &map, i, true);
            stores.push(s);
            Some(o)
        })
        .collect();
    addressed(&mut map, &osds);
    let opts = ClientOptions {
        retry_for: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let c = Client::with_map(map.clone(), opts);
    wait_clean(&c);
    Three {
        map,
        osds,
        stores,
        c,
    }
}

/// The monitor's next map after `map`, with OSD `p` down, given to the running OSDs.
fn next_map_without(map: &ClusterMap, p: u32, osds: &[Option<Osd>]) -> ClusterMap {
    let mut down = map.clone();
    down.epoch = map.epoch + 1;
    down.osd_mut(p).unwrap().up = false;
    for o in osds.iter().flatten() {
        assert!(o.set_map(down.clone()).unwrap(), "a new epoch is taken");
    }
    down
}

#[test]
fn a_down_primary_fails_over_and_its_unreplicated_version_loses_to_the_new_map() {
    let dir = tempfile::tempdir().unwrap();
    let Three {
        map,
        mut osds,
        mut stores,
        c,
    } = three_clean(dir.path());
    let div = ObjectId::new(1, "div");
    c.write_full(&div, b"first").unwrap();
    let pg = map.pg_of(1, &div.name).unwrap();
    let p = map.acting(pg)[0];

    // The primary applies a version it never replicates (it dies before sending it).
    let store = stores.swap_remove(p as usize);
    drop(stores);
    let head = pglog::read_head(&store, pg).unwrap();
    let mut tx = Transaction::new();
    tx.push(TxOp::WriteFull {
        oid: div.clone(),
        data: b"never acknowledged".to_vec(),
    });
    let entry = LogEntry {
        version: head + 1,
        kind: KIND_MODIFY,
        name: div.name.clone(),
        reqid: (99, 1),
        epoch: map.epoch,
    };
    pglog::append_ops(&mut tx, pg, &entry, SHORT);
    store.submit(&tx).unwrap();
    drop(store);
    osds[p as usize].take().unwrap().shutdown();

    // The monitor's next map: the primary is down; the next member leads the PG.
    let down = next_map_without(&map, p, &osds);
    let survivors: Vec<u32> = (0..3).filter(|&o| o != p).collect();
    assert_eq!(down.acting(pg), map.acting(pg)[1..].to_vec());
    // The client, still at epoch 2, finds the new primary (STALE_EPOCH, then GET_MAP).
    let acked = c.write_full(&div, b"acknowledged").unwrap();
    assert_eq!(acked, head + 1);
    assert_eq!(c.map().epoch, 3);
    wait_clean_on(&c, &survivors);

    // Back up: it leads the PG again; its version head + 1 (epoch 2) loses to the survivors'
    // (epoch 3), and the backfill undoes it.
    let mut up = down.clone();
    up.epoch = 4;
    up.osd_mut(p).unwrap().up = true;
    osds[p as usize] = Some(start(dir.path(), &up, p, false));
    for o in osds.iter().flatten() {
        o.set_map(up.clone()).unwrap();
    }
    wait_clean(&c);
    for o in 0..3 {
        assert_eq!(c.on(o).read_full(&div).unwrap(), b"acknowledged", "osd {o}");
    }
    assert_eq!(c.read_full(&div).unwrap(), b"acknowledged");
}

/// Maps that move PGs between members while writes go on: a replica that applies a version
/// of a PG while it changes hands must not leave its new PG state behind its store. Once the
/// maps stop, every member of every PG is at the same head, and that head counts the writes.
#[test]
fn map_changes_during_writes_leave_every_member_at_the_primarys_head() {
    let dir = tempfile::tempdir().unwrap();
    let mut map = ClusterMap::parse(&map_text(3)).unwrap();
    let osds: Vec<Option<Osd>> = (0..3)
        .map(|i| Some(start_logging(dir.path(), &map, i, true, 4096)))
        .collect();
    addressed(&mut map, &osds);
    let opts = ClientOptions {
        retry_for: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    let c = Arc::new(Client::with_map(map.clone(), opts));
    wait_clean(&c);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let oid = ObjectId::new(1, format!("w{w}-{n}"));
                    c.write_full(&oid, b"x").unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    // OSD 2 goes down and up again, each map given to the OSDs in a different order, so
    // that replication crosses members that have and have not taken it yet.
    for round in 0..16u32 {
        std::thread::sleep(Duration::from_millis(150));
        map.epoch += 1;
        map.osd_mut(2).unwrap().up = round % 2 == 1;
        for k in 0..3 {
            let o = (k + round as usize) % 3;
            osds[o].as_ref().unwrap().set_map(map.clone()).unwrap();
        }
    }
    assert!(map.osd(2).unwrap().up);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(written > 100, "only {written} writes");
    let applied = common::wait_heads_agree(&c, &[0, 1, 2]);
    assert_eq!(applied, written, "versions applied vs writes acknowledged");
}

/// Sends a `WRITE_FULL` with request id `reqid` to `osd`'s client port: its status and version.
fn write_as(
    map: &ClusterMap,
    osd: u32,
    reqid: (u64, u64),
    oid: &ObjectId,
    data: &[u8],
) -> (u16, u64) {
    use std::io::Read;
    let addr = map.osd(osd).unwrap().addr;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let p = Enc::new()
        .u64(reqid.0)
        .u64(reqid.1)
        .oid(oid)
        .bytes(data)
        .done();
    let h = Header::request(op::WRITE_FULL, 0, 0, 1, &p).unwrap();
    wire::write_frame(&mut s, &h, &p).unwrap();
    let mut hb = [0u8; wire::HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    let rh = Header::decode(&hb).unwrap();
    let mut out = vec![0u8; rh.len as usize];
    s.read_exact(&mut out).unwrap();
    let version = match rh.status {
        0 => u64::from_le_bytes(out[..8].try_into().unwrap()),
        _ => 0,
    };
    (rh.status, version)
}

/// A retry whose version has left the PG log (4 entries here) is still recognised by its
/// request id among the last `max_dups` versions (64 here): by the primary, by a primary whose
/// store was refilled by a backfill, and by the next primary after a failover.
#[test]
fn a_retry_older_than_the_log_is_answered_from_the_kept_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let Three {
        map,
        mut osds,
        stores,
        c,
    } = three_clean(dir.path());
    let oid = ObjectId::new(1, "retried");
    let pg = map.pg_of(1, &oid.name).unwrap();
    let acting = map.acting(pg);
    let p = acting[0];
    let first = write_as(&map, p, (5, 1), &oid, b"first");
    assert_eq!(first.0, 0);
    for i in 0..20 {
        c.write_full(&oid, format!("later {i}").as_bytes()).unwrap();
    }
    let head = first.1 + 20;
    // Every member keeps the request ids, not only the last 4 entries.
    for store in &stores {
        let log = pglog::read_log(store, pg).unwrap();
        assert_eq!(log.head, head);
        assert_eq!(log.entries.len(), 4);
        assert!(log.dups.contains(&(first.1, (5, 1))), "{:?}", log.dups);
    }
    assert_eq!(write_as(&map, p, (5, 1), &oid, b"first"), first);
    assert_eq!(c.read_full(&oid).unwrap(), b"later 19");

    // The primary's store is replaced by an empty one: the backfill gives it the request ids.
    drop(stores);
    let store = replace_store(dir.path(), &map, &mut osds, p);
    wait_clean(&c);
    assert!(pglog::read_log(&store, pg)
        .unwrap()
        .dups
        .contains(&(first.1, (5, 1))));
    drop(store);
    assert_eq!(write_as(&map, p, (5, 1), &oid, b"first"), first);

    // The primary is down: the next member leads and knows the request too.
    osds[p as usize].take().unwrap().shutdown();
    let down = next_map_without(&map, p, &osds);
    let survivors: Vec<u32> = (0..3).filter(|&o| o != p).collect();
    wait_clean_on(&c, &survivors);
    let next = down.acting(pg)[0];
    assert_eq!(next, acting[1]);
    assert_eq!(write_as(&down, next, (5, 1), &oid, b"first"), first);
    assert_eq!(c.read_full(&oid).unwrap(), b"later 19");

    // The bound: once 64 newer versions exist, the request id is forgotten, and the same
    // request id is a new write.
    for i in 20..84 {
        c.write_full(&oid, format!("later {i}").as_bytes()).unwrap();
    }
    assert_eq!(
        write_as(&down, next, (5, 1), &oid, b"first"),
        (0, head + 65)
    );
    assert_eq!(c.read_full(&oid).unwrap(), b"first");
}
