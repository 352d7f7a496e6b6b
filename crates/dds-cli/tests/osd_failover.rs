//! `dds osd` with etcd as the monitor (`docs/osd-protocol.md`, "Failover", "etcd as the
//! monitor"): real etcd, real `dds osd` processes on ports they picked, a client writing
//! while a primary gets `kill -9`. The dead OSD is marked down in a new map epoch, its PGs get
//! a new primary, the writes go on with the same request ids, and once it is back every
//! acknowledged object is on every replica and every write was applied exactly once.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    busiest_primary, check_writes_on_every_replica, etcd_osd, osd_wait_clean, start_etcd_osds,
    wait_map, EtcdOsds, Guard, ObjectWrite, Writers,
};
use dds_objstore::ObjectId;
use dds_osd::client::{Client, ClientOptions};
use dds_osd::Status;

const OSDS: u32 = 3;

fn start_osd(dir: &Path, url: &str, id: u32, format: bool) -> Guard {
    etcd_osd(dir, url, OSDS, id, format)
}

#[test]
fn kill_9_of_a_primary_fails_over_with_nothing_lost_or_applied_twice() {
    let dir = tempfile::tempdir().unwrap();
    let EtcdOsds {
        etcd: _etcd,
        url,
        mut osds,
        client: cl,
    } = start_etcd_osds(dir.path(), OSDS);

    // Two writers, one op in flight each, every object written once.
    let writers = Writers::start(&cl, 2);
    std::thread::sleep(Duration::from_secs(2));

    // kill -9 of the OSD that leads the most PGs.
    let before = cl.map();
    let (victim, led) = busiest_primary(&before, OSDS);
    let killed_at = Instant::now();
    drop(osds[victim as usize].take());
    let down = wait_map(&cl, "the killed OSD marked down", |m| {
        m.osd(victim).is_some_and(|o| !o.up)
    });
    assert!(down.epoch > before.epoch);
    for &pg in &led {
        assert_ne!(down.acting(pg)[0], victim);
        assert_eq!(down.acting(pg).len(), 2, "{pg}");
    }
    std::thread::sleep(Duration::from_secs(4));

    // The OSD comes back on new ports: marked up, it leads its PGs again after peering.
    osds[victim as usize] = Some(start_osd(dir.path(), &url, victim, false));
    wait_map(&cl, "the OSD back up", |m| {
        m.osd(victim).is_some_and(|o| o.up && o.addressed())
    });
    std::thread::sleep(Duration::from_secs(2));
    let writes = writers.finish();
    // The write gap: from the kill to the first write acknowledged on a PG the victim led.
    let on_led = |w: &&ObjectWrite| {
        let pg = before.pg_of(1, format!("obj-{}", w.i).as_bytes()).unwrap();
        led.contains(&pg)
    };
    let first = writes
        .iter()
        .filter(on_led)
        .filter_map(|w| w.acked)
        .filter(|&t| t > killed_at)
        .min()
        .expect("a write on the dead primary's PGs was acknowledged");
    let gap = first - killed_at;
    let longest = writes
        .iter()
        .filter_map(|w| Some(w.acked? - w.started))
        .max()
        .unwrap();
    eprintln!(
        "failover: {} writes, write gap {:.2} s on the PGs osd {victim} led, longest write {:.2} s",
        writes.len(),
        gap.as_secs_f64(),
        longest.as_secs_f64()
    );
    assert!(writes.len() > 50, "only {} writes", writes.len());
    assert!(gap < Duration::from_secs(10), "write gap {gap:?}");

    // Every acknowledged object on every replica; each write applied once (the PG versions
    // add up to the writes made, the warm-up included).
    let applied = osd_wait_clean(&cl, &[0, 1, 2]);
    assert_eq!(applied, writes.len() as u64, "versions applied vs writes");
    check_writes_on_every_replica(&cl, OSDS, &writes);

    // An OSD stopped cleanly (SIGTERM) revokes its lease: down at once, not after the TTL.
    let others: Vec<u32> = (0..OSDS).filter(|&o| o != victim).collect();
    let mut stopped = osds[others[0] as usize].take().unwrap();
    let term_at = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &stopped.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    wait_map(&cl, "the stopped OSD marked down", |m| {
        m.osd(others[0]).is_some_and(|o| !o.up)
    });
    let marked = term_at.elapsed();
    assert!(stopped.0.wait().unwrap().success());
    eprintln!(
        "clean stop: marked down after {:.2} s",
        marked.as_secs_f64()
    );
    assert!(marked < Duration::from_millis(1300), "{marked:?}");

    // Two OSDs down: every PG below min_size refuses writes with a clear status.
    drop(osds[victim as usize].take());
    wait_map(&cl, "two OSDs down", |m| {
        m.osds.iter().filter(|o| o.up).count() == 1
    });
    let quick = Client::connect_etcd(
        &url,
        "t",
        ClientOptions {
            retry_for: Duration::from_millis(500),
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let e = quick
        .write_full(&ObjectId::new(1, "refused"), b"x")
        .unwrap_err();
    assert_eq!(e.status, Status::BelowMinSize, "{e}");
    assert!(e.text.contains("min_size"), "{e}");
    assert!(osds[others[1] as usize].is_some());
}
