//! `dds osd` clusters of real processes: the `dds objects` commands, 3-way replication onto
//! every replica, kill -9 of an OSD during a write load and recovery from its peers, and bad
//! input on the client and peer ports.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{OsdCluster, DDS};
use dds_objstore::ObjectId;
use dds_osd::client::{Client, ClientOptions};
use dds_osd::wire::{op, Enc, Header, FLAG_REPLY, HEADER_LEN};
use dds_osd::{ClusterMap, Status};

fn client(c: &OsdCluster, retry: Duration) -> Client {
    let map = ClusterMap::load(&c.map).unwrap();
    Client::with_map(
        map,
        ClientOptions {
            retry_for: retry,
            io_timeout: Duration::from_secs(10),
            ..ClientOptions::default()
        },
    )
}

/// Waits until every OSD answers STATUS with every PG active and clean and the members of each
/// PG at the same head.
fn wait_clean(c: &Client, n: u32) {
    common::osd_wait_clean(c, &(0..n).collect::<Vec<_>>());
}

fn dds_objects(c: &OsdCluster, args: &[&str]) -> (bool, Vec<u8>, String) {
    let out = Command::new(DDS)
        .arg("objects")
        .arg("--map")
        .arg(&c.map)
        .args(["--pool", "data"])
        .args(args)
        .current_dir(&c.dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn objects_commands_round_trip_onto_every_replica() {
    let dir = tempfile::tempdir().unwrap();
    let c = OsdCluster::start(dir.path(), 3, 16, 3);
    let cl = client(&c, Duration::from_secs(10));
    wait_clean(&cl, 3);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("in.bin"), &data).unwrap();
    let (ok, _, err) = dds_objects(&c, &["put", "photo", "in.bin"]);
    assert!(ok, "{err}");
    assert!(dds_objects(&c, &["put", "note", "in.bin"]).0);
    let (ok, _, err) = dds_objects(&c, &["get", "photo", "out.bin"]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read(dir.path().join("out.bin")).unwrap(), data);
    let (ok, out, _) = dds_objects(&c, &["stat", "photo"]);
    assert!(ok);
    let stat = String::from_utf8_lossy(&out);
    assert!(
        stat.starts_with("photo: size 195.3 KiB (200000 bytes), modified 20")
            && stat.trim_end().ends_with(" UTC"),
        "{stat}"
    );
    let (ok, out, _) = dds_objects(&c, &["ls"]);
    assert!(ok);
    assert_eq!(out, b"note\nphoto\n");
    // Every replica holds the object.
    let oid = ObjectId::new(1, "photo");
    for o in 0..3 {
        assert_eq!(cl.on(o).read_full(&oid).unwrap(), data, "osd {o}");
    }
    let (ok, _, _) = dds_objects(&c, &["rm", "photo"]);
    assert!(ok);
    let (ok, _, err) = dds_objects(&c, &["get", "photo"]);
    assert!(!ok && err.contains("not found"), "{err}");
    assert!(!dds_objects(&c, &["rm", "photo"]).0);
    wait_clean(&cl, 3);
    for o in 0..3 {
        assert_eq!(cl.on(o).stat(&oid).unwrap_err().status, Status::NotFound);
    }
}

fn content(i: u64) -> Vec<u8> {
    let len = 100 + (i * 7919 % 20_000) as usize;
    (0..len).map(|j| (i as usize * 31 + j * 13) as u8).collect()
}

#[derive(Clone, Copy)]
enum Victim {
    /// The OSD's front-end process (the whole OSD in placement host, the DPU's in dpu).
    FrontEnd(u32),
    /// A placement-dpu OSD's host process (`dds osd-store`), and so its front end too.
    Host(u32),
    /// A placement-dpu OSD's host process alone: restarted, its front end (still running)
    /// reattaches to it by itself.
    Store(u32),
}

#[test]
fn kill_9_during_writes_then_every_replica_catches_up() {
    kill_9_run(
        &["host", "host", "host"],
        &[Victim::FrontEnd(2), Victim::FrontEnd(0)],
    );
}

#[test]
fn kill_9_of_a_dpu_or_host_process_of_a_placement_dpu_osd_loses_nothing_acknowledged() {
    kill_9_run(
        &["host", "host", "dpu"],
        &[Victim::FrontEnd(2), Victim::Host(2)],
    );
}

#[test]
fn a_placement_dpu_front_end_reattaches_to_its_restarted_store_and_a_store_takes_a_new_front_end() {
    // The store killed and restarted under its running front end, then the front end killed
    // and restarted on the store that outlived it.
    kill_9_run(
        &["host", "host", "dpu"],
        &[Victim::Store(2), Victim::FrontEnd(2)],
    );
}

fn kill_9_run(placements: &[&str], victims: &[Victim]) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = OsdCluster::start_mixed(dir.path(), placements, 16, 3);
    let cl = Arc::new(client(&c, Duration::from_millis(300)));
    wait_clean(&cl, 3);
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (cl, acked, stop) = (cl.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    let oid = ObjectId::new(1, format!("obj-{i}"));
                    let ok = cl.write_full(&oid, &content(i)).is_ok()
                        && cl
                            .omap_set(&oid, &[(b"i".to_vec(), i.to_le_bytes().to_vec())])
                            .is_ok();
                    if ok {
                        acked.lock().unwrap().push(i);
                    }
                    i += 2;
                }
            })
        })
        .collect();
    let count = || acked.lock().unwrap().len();
    // A replica (and primary of other PGs) first, then another OSD.
    for &v in victims {
        std::thread::sleep(Duration::from_millis(800));
        let before = count();
        let victim = match v {
            Victim::FrontEnd(id) => {
                c.kill(id);
                id
            }
            Victim::Host(id) => {
                c.kill_store(id);
                c.kill(id);
                id
            }
            Victim::Store(id) => {
                c.kill_store(id);
                id
            }
        };
        std::thread::sleep(Duration::from_millis(800));
        match v {
            Victim::Store(id) => c.start_store(id, false),
            _ => c.start_osd(victim, false),
        }
        std::thread::sleep(Duration::from_millis(800));
        if let Victim::Store(id) = v {
            assert!(
                c.running(id),
                "the front end of osd {id} outlived its store"
            );
        }
        assert!(
            count() > before,
            "writes went on around the restart of osd {victim}"
        );
    }
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 50, "only {} writes acknowledged", acked.len());
    let cl = client(&c, Duration::from_secs(10));
    wait_clean(&cl, 3);
    for o in 0..3 {
        let v = cl.on(o);
        for &i in &acked {
            let oid = ObjectId::new(1, format!("obj-{i}"));
            let got = v
                .read_full(&oid)
                .unwrap_or_else(|e| panic!("osd {o} obj-{i}: {e}"));
            assert!(got == content(i), "osd {o} obj-{i}: wrong data");
            assert_eq!(
                v.omap_list(&oid, None, 10).unwrap(),
                vec![(b"i".to_vec(), i.to_le_bytes().to_vec())],
                "osd {o} obj-{i}"
            );
        }
    }
}

fn header(op: u16, len: u32) -> Header {
    Header {
        op,
        flags: 0,
        status: 0,
        epoch: 0,
        req_id: 9,
        len,
    }
}

fn connect(a: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Sends a frame, returns the reply's status and payload.
fn exchange(s: &mut TcpStream, h: Header, payload: &[u8]) -> (u16, Vec<u8>) {
    s.write_all(&h.encode()).unwrap();
    s.write_all(payload).unwrap();
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    let rh = Header::decode(&hb).unwrap();
    assert!(rh.flags & FLAG_REPLY != 0 && rh.req_id == h.req_id);
    let mut p = vec![0u8; rh.len as usize];
    s.read_exact(&mut p).unwrap();
    (rh.status, p)
}

/// The connection is closed by the OSD (EOF, possibly after a reply).
fn closed(s: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).is_ok()
}

fn bad_input_on(addr: SocketAddr, peer: bool) {
    // Garbage instead of a header: closed.
    let mut s = connect(addr);
    s.write_all(&[0xAB; HEADER_LEN]).unwrap();
    assert!(closed(&mut s));
    // A frame cut short: closed when the sender goes away, nothing else happens.
    let mut s = connect(addr);
    s.write_all(&header(op::PING, 100).encode()).unwrap();
    s.write_all(b"short").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));
    // Oversized: TOO_LARGE, then closed, without the OSD reading (or allocating) it.
    let mut s = connect(addr);
    s.write_all(&header(op::PING, u32::MAX).encode()).unwrap();
    let mut hb = [0u8; HEADER_LEN];
    s.read_exact(&mut hb).unwrap();
    assert_eq!(Header::decode(&hb).unwrap().status, Status::TooLarge as u16);
    assert!(closed(&mut s));
    // Unknown op, malformed payloads, missing objects: error replies on a connection that
    // stays usable.
    let mut s = connect(addr);
    assert_eq!(
        exchange(&mut s, header(999, 0), &[]).0,
        Status::UnknownOp as u16
    );
    let other_port_op = if peer { op::READ } else { op::REPL_TX };
    assert_eq!(
        exchange(&mut s, header(other_port_op, 0), &[]).0,
        Status::UnknownOp as u16
    );
    assert_eq!(
        exchange(&mut s, header(op::PING, 3), b"xyz").0,
        Status::BadFrame as u16
    );
    let oid = ObjectId::new(1, "missing");
    if peer {
        let p = Enc::new()
            .u64(1)
            .u32(0)
            .u64(1)
            .raw(b"not a transaction")
            .done();
        let (st, text) = exchange(&mut s, header(op::REPL_TX, p.len() as u32), &p);
        assert_eq!(
            st,
            Status::BadFrame as u16,
            "{}",
            String::from_utf8_lossy(&text)
        );
        let p = Enc::new().u64(1).u32(1 << 30).done();
        let st = exchange(&mut s, header(op::PG_LOG_QUERY, p.len() as u32), &p).0;
        assert_ne!(st, 0);
        let p = Enc::new().oid(&oid).done();
        let (st, out) = exchange(&mut s, header(op::PG_PULL_OBJECT, p.len() as u32), &p);
        // A member answers "absent"; another OSD refuses.
        assert!(st != 0 || out == [0], "{st}");
    } else {
        let mut h = header(op::STAT, 0);
        h.flags = dds_osd::wire::FLAG_LOCAL;
        let p = Enc::new().oid(&oid).done();
        h.len = p.len() as u32;
        assert_eq!(exchange(&mut s, h, &p).0, Status::NotFound as u16);
        let p = Enc::new().u64(1).u32(u32::MAX).done();
        let st = exchange(&mut s, header(op::WRITE_FULL, p.len() as u32), &p).0;
        assert_eq!(st, Status::BadFrame as u16);
    }
    let (st, out) = exchange(&mut s, header(op::PING, 0), &[]);
    assert_eq!((st, out.len()), (0, 8));
}

#[test]
fn bad_input_gets_errors_or_a_closed_connection_and_the_osd_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let c = OsdCluster::start(dir.path(), 3, 8, 3);
    let cl = client(&c, Duration::from_secs(10));
    wait_clean(&cl, 3);
    // A client stalled inside a frame on every port holds only its own connection.
    let mut stalled = Vec::new();
    for a in c.addrs.iter().chain(&c.peer_addrs) {
        let mut s = connect(*a);
        s.write_all(&header(op::PING, 1 << 20).encode()).unwrap();
        s.write_all(&[0u8; 1000]).unwrap();
        stalled.push(s);
    }
    for o in 0..3 {
        bad_input_on(c.addrs[o], false);
        bad_input_on(c.peer_addrs[o], true);
    }
    // Still serving, every OSD process alive.
    let oid = ObjectId::new(1, "after");
    cl.write_full(&oid, b"still here").unwrap();
    assert_eq!(cl.read_full(&oid).unwrap(), b"still here");
    assert_eq!(
        cl.stat(&ObjectId::new(1, "nope")).unwrap_err().status,
        Status::NotFound
    );
    wait_clean(&cl, 3);
    for o in 0..3 {
        assert_eq!(cl.on(o).read_full(&oid).unwrap(), b"still here");
    }
    drop(stalled);
}

#[test]
fn a_mixed_cluster_replicates_onto_host_and_dpu_placed_osds() {
    let dir = tempfile::tempdir().unwrap();
    let c = OsdCluster::start_mixed(dir.path(), &["dpu", "host", "dpu"], 8, 3);
    let cl = client(&c, Duration::from_secs(5));
    wait_clean(&cl, 3);
    // Small objects (batched), and ones larger than a DMA transfer (chunked).
    let sizes = [10usize, 4096, 100_000, 3 << 20];
    for (i, &n) in sizes.iter().enumerate() {
        let oid = ObjectId::new(1, format!("m{i}"));
        let data: Vec<u8> = (0..n).map(|j| (j * 7 + i) as u8).collect();
        cl.write_full(&oid, &data).unwrap();
        cl.setxattr(&oid, b"k", b"v").unwrap();
    }
    for o in 0..3 {
        for (i, &n) in sizes.iter().enumerate() {
            let oid = ObjectId::new(1, format!("m{i}"));
            let got = cl.on(o).read_full(&oid).unwrap();
            assert_eq!(got.len(), n, "osd {o} m{i}");
            assert!(got.iter().enumerate().all(|(j, &b)| b == (j * 7 + i) as u8));
            assert_eq!(
                cl.on(o).getxattrs(&oid).unwrap(),
                vec![(b"k".to_vec(), b"v".to_vec())]
            );
        }
    }
}

#[test]
fn placement_dpu_without_its_host_process_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let map = dir.path().join("cluster.toml");
    std::fs::write(
        &map,
        "epoch = 1\n[[osd]]\nid = 0\naddr = \"127.0.0.1:1\"\npeer_addr = \"127.0.0.1:2\"\nplacement = \"dpu\"\n",
    )
    .unwrap();
    let out = Command::new(DDS)
        .args(["osd", "--id", "0", "--map"])
        .arg(&map)
        .args(["--proxy-socket", "proxy.sock"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("proxy.sock"), "{err}");
}

/// A write request's payload with its request id (client, tid).
fn write_request(client: u64, tid: u64) -> Enc {
    let mut e = Enc::new();
    e.u64(client).u64(tid);
    e
}

/// Sends a write op to the object's primary; its status and version (0 on error).
fn raw_write(c: &OsdCluster, map: &ClusterMap, oid: &ObjectId, op: u16, p: &[u8]) -> (u16, u64) {
    let pg = map.pg_of(oid.pool, &oid.name).unwrap();
    let primary = map.acting(pg)[0];
    let mut s = connect(c.addrs[primary as usize]);
    let (st, out) = exchange(&mut s, header(op, p.len() as u32), p);
    let v = if st == 0 {
        u64::from_le_bytes(out[..8].try_into().unwrap())
    } else {
        0
    };
    (st, v)
}

#[test]
fn a_retried_write_is_applied_once_even_after_the_primary_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = OsdCluster::start(dir.path(), 3, 8, 3);
    let cl = client(&c, Duration::from_secs(20));
    wait_clean(&cl, 3);
    let map = ClusterMap::load(&c.map).unwrap();
    let oid = ObjectId::new(1, "retried");
    let full = |client, tid, data: &[u8]| write_request(client, tid).oid(&oid).bytes(data).done();
    // The same request twice: one version, applied once.
    let first = raw_write(&c, &map, &oid, op::WRITE_FULL, &full(7, 1, b"from 7"));
    assert_eq!(first.0, 0);
    assert_eq!(
        raw_write(&c, &map, &oid, op::WRITE_FULL, &full(7, 1, b"from 7")),
        first
    );
    // Another client writes after it; the first client's late retry changes nothing.
    let later = raw_write(
        &c,
        &map,
        &oid,
        op::WRITE_FULL,
        &full(8, 1, b"from 8, later"),
    );
    assert_eq!(later, (0, first.1 + 1));
    assert_eq!(
        raw_write(&c, &map, &oid, op::WRITE_FULL, &full(7, 1, b"from 7")),
        first
    );
    assert_eq!(cl.read(&oid, 0, 100).unwrap(), b"from 8, later");
    // A retried remove reports its first success instead of NOT_FOUND.
    let other = ObjectId::new(1, "removed");
    cl.write_full(&other, b"x").unwrap();
    let rm = write_request(7, 2).oid(&other).done();
    let removed = raw_write(&c, &map, &other, op::REMOVE, &rm);
    assert_eq!(removed.0, 0);
    assert_eq!(raw_write(&c, &map, &other, op::REMOVE, &rm), removed);
    // A fresh request id for the same remove is a new request: the object is gone.
    let rm2 = write_request(7, 3).oid(&other).done();
    assert_eq!(
        raw_write(&c, &map, &other, op::REMOVE, &rm2).0,
        Status::NotFound as u16
    );
    // The request ids live in the PG log: a primary killed and restarted still knows them.
    let pg = map.pg_of(1, b"retried").unwrap();
    let primary = map.acting(pg)[0];
    c.kill(primary);
    c.start_osd(primary, false);
    wait_clean(&cl, 3);
    assert_eq!(
        raw_write(&c, &map, &oid, op::WRITE_FULL, &full(7, 1, b"from 7")),
        first
    );
    assert_eq!(cl.read(&oid, 0, 100).unwrap(), b"from 8, later");
    for osd in 0..3 {
        assert_eq!(cl.on(osd).read(&oid, 0, 100).unwrap(), b"from 8, later");
    }
}
