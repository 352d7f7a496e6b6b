//! The request path allocates nothing in steady state: after a warm-up, pipelined READs,
//! WRITEs (some with FUA), WRITE_ZEROES, FLUSHes, TRIMs and refused requests over a real
//! socket allocate nothing on the server's thread. The server runs in this process on a
//! thread of its own, over regular files, and only that thread's allocations are counted.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dds_nbd::proto::{self, Request};
use dds_nbd::{ExportSpec, NbdConfig, NbdServer};
use dds_storage::OsStorage;
use dds_testkit::alloc::{allocations_in, count_this_thread, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const SIZE: u64 = 4 << 20;

fn opt(s: &mut TcpStream, option: u32, data: &[u8]) {
    let mut m = Vec::new();
    m.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m).unwrap();
}

/// Reads option replies up to the final one; returns its type.
fn opt_replies(s: &mut TcpStream) -> u32 {
    loop {
        let mut h = [0u8; 20];
        s.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut d = vec![0u8; len];
        s.read_exact(&mut d).unwrap();
        if kind != proto::REP_INFO {
            return kind;
        }
    }
}

/// One round: 16 requests pipelined, every reply checked (in request order).
fn round(s: &mut TcpStream, k: u64, m: &mut Vec<u8>, reply: &mut Vec<u8>) {
    m.clear();
    let block = |i: u64| (k * 7 + i * 13) % (SIZE / 4096 - 1) * 4096;
    let data = [(k % 251) as u8; 4096];
    let mut expect = Vec::new();
    for i in 0..16u64 {
        let (command, flags, len) = match i % 8 {
            0 | 4 => (
                proto::CMD_WRITE,
                if i == 4 { proto::CMD_FLAG_FUA } else { 0 },
                4096,
            ),
            1 | 2 | 5 => (proto::CMD_READ, 0, 4096),
            3 => (proto::CMD_WRITE_ZEROES, 0, 8192),
            6 => (proto::CMD_FLUSH, 0, 0),
            _ => (proto::CMD_TRIM, 0, 4096),
        };
        let r = Request {
            magic: proto::REQUEST_MAGIC,
            flags,
            command,
            handle: k * 100 + i,
            offset: block(i),
            len,
        };
        proto::encode_request(m, &r);
        if command == proto::CMD_WRITE {
            m.extend_from_slice(&data);
        }
        expect.push((r.handle, command == proto::CMD_READ, 0u32));
    }
    // A READ past the end: refused (structured error chunk).
    proto::encode_request(
        m,
        &Request {
            magic: proto::REQUEST_MAGIC,
            flags: 0,
            command: proto::CMD_READ,
            handle: 1,
            offset: SIZE,
            len: 512,
        },
    );
    expect.push((1, true, proto::EINVAL));
    s.write_all(m).unwrap();
    for (handle, read, err) in expect {
        if read {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), handle);
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
            reply.resize(len, 0);
            s.read_exact(reply).unwrap();
            if err == 0 {
                assert_eq!(&h[6..8], &proto::REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                assert_eq!(len, 8 + 4096);
            } else {
                assert_eq!(&h[6..8], &proto::REPLY_TYPE_ERROR.to_be_bytes());
                assert_eq!(&reply[..4], &err.to_be_bytes());
            }
        } else {
            let mut h = [0u8; 16];
            s.read_exact(&mut h).unwrap();
            assert_eq!(&h[..8], &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0]);
            assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), handle);
        }
    }
}

#[test]
fn requests_allocate_nothing_in_steady_state() {
    let dir = tempfile::tempdir().unwrap();
    let storage = OsStorage::new(dir.path()).unwrap();
    let cfg = NbdConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        exports: vec![ExportSpec {
            name: "disk".into(),
            size: SIZE,
            read_only: false,
        }],
        max_connections: 16,
    };
    let server = NbdServer::open(cfg, &storage, None).unwrap();
    let addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let t = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            count_this_thread(true);
            server.run(&stop)
        })
    };
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut g = [0u8; proto::GREETING];
    s.read_exact(&mut g).unwrap();
    s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    opt(&mut s, proto::OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(opt_replies(&mut s), proto::REP_ACK);
    opt(
        &mut s,
        proto::OPT_GO,
        &[0, 0, 0, 4, b'd', b'i', b's', b'k', 0, 0],
    );
    assert_eq!(opt_replies(&mut s), proto::REP_ACK);
    let (mut m, mut reply) = (Vec::new(), Vec::new());
    for k in 0..100 {
        round(&mut s, k, &mut m, &mut reply);
    }
    let n = allocations_in(|| {
        for k in 100..400 {
            round(&mut s, k, &mut m, &mut reply);
        }
    });
    drop(s);
    stop.store(true, Ordering::SeqCst);
    let stats = t.join().unwrap();
    assert_eq!(stats.refused, 400);
    assert!(
        stats.reads >= 400 * 6 && stats.writes >= 400 * 4,
        "{stats:?}"
    );
    assert_eq!(n, 0, "allocations on the server thread for 5100 requests");
}
