//! Recovery and rebalancing with etcd as the monitor (`docs/osd-protocol.md`, "Recovery",
//! "Rebalancing"): real etcd, real `dds osd` processes, clients writing and reading
//! throughout. A primary killed with `kill -9` comes back and is brought up to date; then an
//! OSD of a new id joins, straw2 moves to it only the PGs it wins, and they are backfilled
//! while the clients go on. `dds objects status` reaches HEALTH_OK with every PG active+clean,
//! and every acknowledged object is on every member of its PG.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{etcd_osd, osd_wait_clean, start_etcd_osds, wait_map, EtcdOsds, DDS};
use dds_objstore::ObjectId;

const OSDS: u32 = 3;

fn content(i: u64) -> Vec<u8> {
    format!("object {i} ")
        .repeat(1 + (i % 200) as usize)
        .into_bytes()
}

/// `dds objects ARGS` of the cluster `t` in etcd at `url`; its stdout, after success.
fn dds_objects(url: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(DDS)
        .args(["objects", "--etcd", url, "--cluster", "t"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `dds objects status --json`.
fn status(url: &str) -> serde_json::Value {
    serde_json::from_slice(&dds_objects(url, &["status", "--json"])).unwrap()
}

#[test]
fn a_returning_and_a_new_osd_are_recovered_while_clients_go_on_and_status_reaches_clean() {
    let dir = tempfile::tempdir().unwrap();
    let EtcdOsds {
        etcd: _etcd,
        url,
        mut osds,
        client: cl,
    } = start_etcd_osds(dir.path(), OSDS);

    // Two writers (every object written once) and a reader of acknowledged objects.
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let reads = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients: Vec<_> = (0..2u64)
        .map(|w| {
            let (cl, acked, failed, stop) =
                (cl.clone(), acked.clone(), failed.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    let oid = ObjectId::new(1, format!("obj-{i}"));
                    match cl.write_full(&oid, &content(i)) {
                        Ok(_) => acked.lock().unwrap().push(i),
                        Err(e) => failed.lock().unwrap().push(format!("write obj-{i}: {e}")),
                    }
                    i += 2;
                }
            })
        })
        .collect();
    {
        let (cl, acked, failed, reads, stop) = (
            cl.clone(),
            acked.clone(),
            failed.clone(),
            reads.clone(),
            stop.clone(),
        );
        clients.push(std::thread::spawn(move || {
            let mut k = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let i = {
                    let a = acked.lock().unwrap();
                    if a.is_empty() {
                        None
                    } else {
                        k = (k + 7919) % a.len();
                        Some(a[k])
                    }
                };
                let Some(i) = i else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                match cl.read_full(&ObjectId::new(1, format!("obj-{i}"))) {
                    Ok(d) if d == content(i) => {
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => failed
                        .lock()
                        .unwrap()
                        .push(format!("read obj-{i}: wrong data")),
                    Err(e) => failed.lock().unwrap().push(format!("read obj-{i}: {e}")),
                }
            }
        }));
    }
    let count = || acked.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(1500));

    // kill -9 of the OSD that leads the most PGs; it comes back after a while.
    let before = cl.map();
    let victim = (0..OSDS)
        .max_by_key(|&o| {
            before
                .all_pgs()
                .filter(|&pg| before.acting(pg)[0] == o)
                .count()
        })
        .unwrap();
    drop(osds[victim as usize].take());
    wait_map(&cl, "the killed OSD marked down", |m| {
        m.osd(victim).is_some_and(|o| !o.up)
    });
    std::thread::sleep(Duration::from_secs(3));
    let at_return = count();
    osds[victim as usize] = Some(etcd_osd(dir.path(), &url, OSDS, victim, false));
    wait_map(&cl, "the OSD back up", |m| {
        m.osd(victim).is_some_and(|o| o.up && o.addressed())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        count() > at_return,
        "writes went on while osd {victim} caught up"
    );

    // A new OSD (id 3) joins: only the PGs straw2 gives it move, and it is backfilled.
    let before = (*cl.map()).clone();
    osds.push(Some(etcd_osd(dir.path(), &url, OSDS, 3, true)));
    let after = wait_map(&cl, "osd 3 in the map, up and in", |m| {
        m.osd(3)
            .is_some_and(|o| o.up && o.addressed() && o.weight > 0.0)
    });
    let mut moved = 0;
    for pg in after.all_pgs() {
        let (was, now) = (before.acting(pg), after.acting(pg));
        if was != now {
            moved += 1;
            assert!(
                now.contains(&3),
                "pg {pg} moved ({was:?} -> {now:?}) without osd 3"
            );
        }
    }
    assert!(moved > 0, "osd 3 got no PG");
    let at_join = count();
    // The PGs the new OSD leads are inactive while it backfills itself (a write to one of
    // them waits and retries); the others take writes meanwhile.
    let mut seen_unclean = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    while count() < at_join + 20 || Instant::now() < deadline - Duration::from_secs(28) {
        let s = status(&url);
        seen_unclean |= s["active_clean"] != s["pgs"];
        assert!(
            Instant::now() < deadline,
            "writes stopped after osd 3 joined"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    assert!(failed.is_empty(), "client errors: {failed:?}");

    // Clean: the status says so, and every acknowledged object is on every member of its PG.
    osd_wait_clean(&cl, &[0, 1, 2, 3]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = status(&url);
        if s["health"] == "HEALTH_OK" {
            break s;
        }
        assert!(Instant::now() < deadline, "never HEALTH_OK: {s}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(s["pgs"], 16);
    assert_eq!(s["active_clean"], 16);
    assert_eq!(s["osds_up"], 4);
    assert_eq!(s["objects_to_recover"], 0);
    let acked = acked.lock().unwrap().clone();

    // OSD 0 taken out (weight 0): only the PGs it was a member of move, to the others.
    let before = (*cl.map()).clone();
    dds_objects(&url, &["reweight", "0", "0"]);
    let after = wait_map(&cl, "osd 0 out", |m| {
        m.osd(0).is_some_and(|o| o.weight == 0.0)
    });
    for pg in after.all_pgs() {
        let (was, now) = (before.acting(pg), after.acting(pg));
        assert!(!now.contains(&0), "pg {pg} still on osd 0");
        if was != now {
            assert!(
                was.contains(&0),
                "pg {pg} moved ({was:?} -> {now:?}) without osd 0"
            );
        }
    }
    osd_wait_clean(&cl, &[0, 1, 2, 3]);
    eprintln!(
        "rebalance: {} writes acknowledged, {} reads checked, {moved} PGs moved to osd 3, \
         a status before clean seen: {seen_unclean}",
        acked.len(),
        reads.load(Ordering::Relaxed)
    );
    assert!(acked.len() > 100, "only {} writes", acked.len());
    let map = cl.map();
    for &i in &acked {
        let oid = ObjectId::new(1, format!("obj-{i}"));
        for o in map.acting(map.pg_of(1, format!("obj-{i}").as_bytes()).unwrap()) {
            let got = cl
                .on(o)
                .read_full(&oid)
                .unwrap_or_else(|e| panic!("osd {o} obj-{i}: {e}"));
            assert!(got == content(i), "osd {o} obj-{i}: wrong data");
        }
    }
}
