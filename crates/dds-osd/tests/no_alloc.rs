//! The OSD's event loops allocate nothing per request once warm: two OSDs in this process (a
//! pool of size 2), pipelined WRITE_FULL and READ frames over a raw socket to the primary, each
//! write replicated as REPL_TX to the other OSD over its persistent peer connection. After a
//! warm-up, the primary's client-port loop and then the replica's peer-port loop are counted
//! (one thread at a time; `DDS_ALLOC_BACKTRACE=1` prints where each allocation counted came
//! from); the requests themselves run on the ports' workers (the store's API
//! returns owned buffers), which are not counted.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::wait_clean_on;

use dds_osd::wire::{op, Header, HEADER_LEN, VERSION};
use dds_osd::{open_store, ClusterMap, Osd, OsdConfig, StoreSpec};
use dds_testkit::alloc::{allocations_in, count_thread_id, thread_named, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const POOL: u64 = 1;
const DEPTH: usize = 16;
// A round fits the loop's 64 KiB read: a frame split across reads is kept in a buffer of the
// connection's, which it gives back once empty (an idle connection owns no memory).
const DATA: usize = 1024;
/// Buffer growths allowed in a measurement (see the assertion).
const GROWTHS: usize = 2;

fn frame(m: &mut Vec<u8>, opcode: u16, req_id: u64, payload: &[u8]) {
    let h = Header {
        op: opcode,
        flags: 0,
        status: 0,
        epoch: 0,
        req_id,
        len: payload.len() as u32,
    };
    m.extend_from_slice(&h.encode());
    m.extend_from_slice(payload);
}

fn oid(p: &mut Vec<u8>, name: &[u8]) {
    p.extend_from_slice(&POOL.to_le_bytes());
    p.extend_from_slice(&(name.len() as u32).to_le_bytes());
    p.extend_from_slice(name);
}

/// One round: DEPTH writes and DEPTH reads of the objects `names`, pipelined in one send;
/// every reply checked (in request order, status OK, the data read is the data written).
fn round(s: &mut TcpStream, names: &[Vec<u8>], tid: &mut u64, m: &mut Vec<u8>, p: &mut Vec<u8>) {
    m.clear();
    let first = *tid + 1;
    for name in names {
        *tid += 1;
        p.clear();
        p.extend_from_slice(&7u64.to_le_bytes());
        p.extend_from_slice(&tid.to_le_bytes());
        oid(p, name);
        p.extend_from_slice(&(DATA as u32).to_le_bytes());
        p.extend(std::iter::repeat_n(*tid as u8, DATA));
        frame(m, op::WRITE_FULL, *tid, p);
    }
    for (i, name) in names.iter().enumerate() {
        p.clear();
        oid(p, name);
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&(DATA as u64).to_le_bytes());
        frame(m, op::READ, 1_000_000 + first + i as u64, p);
    }
    s.write_all(m).unwrap();
    for i in 0..2 * names.len() {
        let mut hb = [0u8; HEADER_LEN];
        s.read_exact(&mut hb).unwrap();
        let h = Header::decode(&hb).unwrap();
        p.clear();
        p.resize(h.len as usize, 0);
        s.read_exact(p).unwrap();
        assert_eq!(h.status, 0, "{}", String::from_utf8_lossy(p));
        if i < names.len() {
            assert_eq!((h.op, h.req_id), (op::WRITE_FULL, first + i as u64));
            assert_eq!(p.len(), 8, "a version");
        } else {
            let j = (i - names.len()) as u64;
            assert_eq!((h.op, h.req_id), (op::READ, 1_000_000 + first + j));
            assert_eq!(p.len(), DATA);
            assert!(p.iter().all(|&b| b == (first + j) as u8), "data written");
        }
    }
}

#[test]
fn request_path_allocates_nothing_in_steady_state() {
    assert_eq!(VERSION, 2);
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("epoch = 1\n");
    for id in 0..2 {
        text +=
            &format!("[[osd]]\nid = {id}\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n");
    }
    text += "[[pool]]\nid = 1\nname = \"data\"\npg_num = 8\nsize = 2\n";
    let mut map = ClusterMap::parse(&text).unwrap();
    let mut osds: Vec<Osd> = Vec::new();
    for id in 0..2u32 {
        let store = open_store(&StoreSpec::Local {
            device: dir.path().join(format!("osd{id}.img")),
            format: Some((64 << 20, false)),
        })
        .unwrap();
        let mut cfg = OsdConfig::new(id, map.clone());
        cfg.peering_interval = Duration::from_millis(50);
        osds.push(Osd::start(cfg, Arc::clone(&store)).unwrap());
    }
    // The OSDs' real addresses, in a map of the next epoch.
    map.epoch = 2;
    for (o, osd) in map.osds.iter_mut().zip(&osds) {
        o.addr = osd.client_addr();
        o.peer_addr = osd.peer_addr();
    }
    for osd in &osds {
        osd.set_map(map.clone()).unwrap();
    }
    // Objects whose primary is OSD 0.
    let names: Vec<Vec<u8>> = (0..)
        .map(|i| format!("obj-{i}").into_bytes())
        .filter(|n| map.acting(map.pg_of(POOL, n).unwrap())[0] == 0)
        .take(DEPTH)
        .collect();
    let mut s = TcpStream::connect(osds[0].client_addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (mut tid, mut m, mut p) = (0u64, Vec::new(), Vec::new());
    // Until the PGs peered (writes answer PG_INACTIVE before), then a warm-up.
    let status = dds_osd::client::Client::connect(
        &[osds[0].client_addr()],
        dds_osd::client::ClientOptions::default(),
    )
    .unwrap();
    wait_clean_on(&status, &[0, 1]);
    for _ in 0..500 {
        round(&mut s, &names, &mut tid, &mut m, &mut p);
    }
    for (osd, thread) in [(0, "osd0-client"), (1, "osd1-peer")] {
        count_thread_id(thread_named(thread));
        let n = allocations_in(|| {
            for _ in 0..100 {
                round(&mut s, &names, &mut tid, &mut m, &mut p);
            }
        });
        count_thread_id(0);
        // 3,200 requests: one allocation per request would be thousands. A connection's
        // output buffers grow (by doubling) only when more replies than ever before are
        // ready in one round, which the timing of the workers decides: a rare, amortized
        // growth, at most a few times in a connection's life, is allowed.
        assert!(
            n <= GROWTHS,
            "{n} allocations on osd {osd}'s {thread} loop for {} requests",
            100 * 2 * DEPTH
        );
    }
    for osd in osds {
        osd.shutdown();
    }
}
