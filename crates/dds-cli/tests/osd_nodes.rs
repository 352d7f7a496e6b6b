//! The object cluster on nodes of its own (`docs/osd-protocol.md`, "Nodes in network
//! namespaces"): three OSD nodes and an etcd node, each a network namespace on a bridge of the
//! fabric's, and the client in the clients' namespace. Node 0 runs a `dds osd` on its own
//! device (placement host); nodes 1 and 2 are D placements, each running its `dds osd-store`
//! and the OSD's front end (`dds osd --placement dpu`) on the node. The D node that leads the
//! most PGs is cut off (its switch port down) while two writers go on: it is marked down when
//! its lease expires, its PGs fail over, the writes go on; the link comes back, the node (which
//! never stopped) registers again, catches up, and every acknowledged object is on every
//! replica, each write applied once. At the end every namespace the test made is gone.
//!
//! Needs root (or the capabilities to make network namespaces) and iproute2; where those are
//! missing the test says so and passes without running.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    busiest_primary_among, check_writes_on_every_replica, etcd_osd_with, osd_store_with,
    osd_wait_clean, wait_map, Guard, ObjectWrite, OsdStore, Writers, DDS,
};
use dds_netns::{self as nodes, Fabric};
use dds_osd::client::{Client, ClientOptions};

const OSDS: usize = 3;
/// The etcd node (after the OSDs').
const MON: usize = OSDS;
/// The nodes of D placements.
const DPU_NODES: [u32; 2] = [1, 2];

/// The processes of node `id`: its OSD, and for a D placement the OSD's store after it (the
/// front end is dropped first).
fn start_osd(f: &Fabric, dir: &Path, url: &str, id: usize) -> Vec<Guard> {
    let on_node = || f.command_on(id, DDS);
    let (n, me, ip) = (OSDS as u32, id as u32, Some(f.node_addr(id)));
    if !DPU_NODES.contains(&me) {
        let store = OsdStore::Device { format: true };
        return vec![etcd_osd_with(on_node(), dir, url, n, me, store, ip)];
    }
    let (store, sock) = osd_store_with(on_node(), dir, me);
    let front_end = etcd_osd_with(on_node(), dir, url, n, me, OsdStore::Proxy(&sock), ip);
    vec![front_end, store]
}

#[test]
fn a_node_cut_off_fails_over_and_catches_up_when_its_link_returns() {
    if let Err(e) = nodes::available() {
        eprintln!("network namespaces unavailable here ({e}): skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = format!("t{}", std::process::id() % 1_000_000);
    let fabric = Fabric::create(&name, OSDS + 1).unwrap();
    let namespaces: Vec<String> = (0..=OSDS)
        .map(|i| fabric.node_ns(i))
        .chain([fabric.client_ns()])
        .collect();

    // etcd on its node: a namespace of its own, so its usual ports are free there.
    let mon = fabric.node_addr(MON);
    let url = format!("http://{mon}:2379");
    let mut etcd_cmd = dds_osd::etcd::member(
        fabric.command_on(MON, "etcd"),
        dir.path(),
        &url,
        &format!("http://{mon}:2380"),
    );
    let etcd = Guard(etcd_cmd.spawn().expect("etcd (package etcd-server)"));

    // This thread, and the writers it starts, are clients: in the clients' namespace.
    fabric.enter_clients().unwrap();
    assert!(
        dds_osd::etcd::wait_answers(&url, Duration::from_secs(20)),
        "etcd on its node does not answer the clients"
    );
    let mut osds: Vec<Vec<Guard>> = (0..OSDS)
        .map(|i| start_osd(&fabric, dir.path(), &url, i))
        .collect();
    let opts = ClientOptions {
        retry_for: Duration::from_secs(60),
        io_timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let cl = Arc::new(Client::connect_etcd(&url, "t", opts).unwrap());
    wait_map(&cl, "every OSD up on its node", |m| {
        m.osds.iter().all(|o| o.up && o.addressed())
    });
    let map = cl.map();
    for (i, o) in map.osds.iter().enumerate() {
        assert_eq!(o.addr.ip(), fabric.node_addr(i), "osd {i} on its node");
    }
    osd_wait_clean(&cl, &[0, 1, 2]);

    let writers = Writers::start(&cl, 2);
    std::thread::sleep(Duration::from_secs(2));

    // Cut off the D node that leads the most PGs.
    let before = cl.map();
    let (victim, led) = busiest_primary_among(&before, DPU_NODES);
    let cut_at = Instant::now();
    fabric.cut(victim as usize).unwrap();
    let down = wait_map(&cl, "the cut-off OSD marked down", |m| {
        m.osd(victim).is_some_and(|o| !o.up)
    });
    eprintln!(
        "osd {victim} cut off: marked down after {:.2} s",
        cut_at.elapsed().as_secs_f64()
    );
    for &pg in &led {
        assert_ne!(down.acting(pg)[0], victim, "{pg} has a new primary");
    }
    // The writes on its PGs resume under the new primaries while it is still cut off: the
    // gap, from the cut to the first write started after it and acknowledged on one of them.
    let on_led = |w: &ObjectWrite| {
        let pg = before.pg_of(1, format!("obj-{}", w.i).as_bytes()).unwrap();
        led.contains(&pg)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let gap = loop {
        let first = writers
            .writes
            .lock()
            .unwrap()
            .iter()
            .filter(|w| on_led(w) && w.started > cut_at)
            .filter_map(|w| w.acked)
            .min();
        if let Some(t) = first {
            break t - cut_at;
        }
        assert!(
            Instant::now() < deadline,
            "no write on the cut-off node's PGs acknowledged while it was cut off"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "write gap on the PGs osd {victim} led: {:.2} s",
        gap.as_secs_f64()
    );
    assert!(gap < Duration::from_secs(10), "write gap {gap:?}");
    std::thread::sleep(Duration::from_secs(1));

    // The link comes back: the OSD, still running, registers again and catches up.
    let healed_at = Instant::now();
    fabric.heal(victim as usize).unwrap();
    wait_map(&cl, "the node's OSD back up", |m| {
        m.osd(victim).is_some_and(|o| o.up && o.addressed())
    });
    eprintln!(
        "osd {victim} healed: up again after {:.2} s",
        healed_at.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(2));
    let writes = writers.finish();
    assert!(writes.len() > 50, "only {} writes", writes.len());

    let applied = osd_wait_clean(&cl, &[0, 1, 2]);
    assert_eq!(applied, writes.len() as u64, "versions applied vs writes");
    check_writes_on_every_replica(&cl, OSDS as u32, &writes);
    eprintln!("{} writes, all on every replica", writes.len());

    // Everything the test made goes: the processes, then the namespaces.
    drop(cl);
    osds.clear();
    drop(etcd);
    fabric.remove().unwrap();
    for ns in namespaces {
        assert!(
            !Path::new(&format!("/run/netns/{ns}")).exists(),
            "namespace {ns} left behind"
        );
    }
}
