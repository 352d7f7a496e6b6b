//! Steady state allocates nothing on the server threads: after a warm-up, requests over real
//! sockets (pagestore reads and writes, aligned and not, answered from OS files through
//! io_uring, with error responses among them; echoed messages) take no heap memory on the
//! servers' event-loop threads. The client runs on the test thread, which is not counted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use dds_apps::echo::EchoServer;
use dds_apps::pagestore::{parse_response_header, MessageBuilder, OP_READ};
use dds_apps::server::{Server, ServerConfig};
use dds_storage::aio::{AsyncStorage, Fill, OsAsyncStorage};
use dds_storage::pattern;
use dds_testkit::alloc::{allocations_in, count_all_threads, exempt_this_thread, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const FILE_SIZE: u64 = 1 << 20;

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Runs `rounds` of `f`, counting the allocations of every thread but this one.
/// Allocations of every thread but this one during `rounds` calls of `f`.
fn counted(rounds: usize, mut f: impl FnMut(usize)) -> usize {
    count_all_threads(true);
    let n = allocations_in(|| (0..rounds).for_each(&mut f));
    count_all_threads(false);
    n
}

fn pagestore() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let storage: Arc<dyn AsyncStorage> =
        Arc::new(OsAsyncStorage::open(dir.path(), 2, FILE_SIZE, Fill::Pattern).unwrap());
    let files = storage.file_ids().to_vec();
    let server = Server::start(
        ServerConfig {
            threads: 2,
            ..ServerConfig::default()
        },
        storage,
    )
    .unwrap();
    let mut conns: Vec<TcpStream> = (0..4).map(|_| connect(server.local_addr())).collect();
    // One message per connection: reads (aligned, unaligned, short at the end of the file),
    // writes (aligned and not), and requests answered at once (unknown file, empty read).
    let data = vec![0x5au8; 4096];
    let msgs: Vec<(Vec<u8>, usize)> = (0..conns.len())
        .map(|c| {
            let base = 64 * 1024 * (c as u64 + 1);
            let mut b = MessageBuilder::new();
            b.read(files[0], base, 4096, 1)
                .read(files[1], base + 100, 1000, 2)
                .write(files[0], base + 8192, &data, 3)
                .write(files[1], base + 8192 + 17, &data[..300], 4)
                .read(files[0], FILE_SIZE - 64, 512, 5)
                .read(999_999, 0, 8, 6)
                .read(files[1], base, 0, 7)
                .read(files[1], base + 4096, 4096, 8);
            let expect = 24 * 8 + 4096 + 1000 + 64 + 4096;
            (b.finish().to_vec(), expect)
        })
        .collect();
    let mut back = vec![0u8; 64 << 10];
    let mut round = |_: usize| {
        for (s, (m, _)) in conns.iter_mut().zip(&msgs) {
            s.write_all(m).unwrap();
        }
        for (s, (_, n)) in conns.iter_mut().zip(&msgs) {
            s.read_exact(&mut back[..*n]).unwrap();
        }
    };
    exempt_this_thread();
    for i in 0..3000 {
        round(i);
    }
    let allocs = counted(3000, &mut round);
    // The responses are still right.
    let s = &mut conns[0];
    s.write_all(&msgs[0].0).unwrap();
    s.read_exact(&mut back[..msgs[0].1]).unwrap();
    let h = parse_response_header(&back[..24]).unwrap();
    assert_eq!((h.req_id, h.status, h.op, h.len), (1, 0, OP_READ, 4096));
    assert_eq!(
        pattern::check(files[0], 64 * 1024, &back[24..24 + 4096]),
        None
    );
    let stats = server.stats();
    assert_eq!(stats.requests, 8 * (4 * 6000 + 1), "{stats:?}");
    drop(conns);
    drop(server);
    assert_eq!(
        allocs, 0,
        "heap allocations on the pagestore threads in steady state"
    );
}

fn echo() {
    let server = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut conns: Vec<TcpStream> = (0..4).map(|_| connect(server.local_addr())).collect();
    let msg: Vec<u8> = (0..1500u32).map(|i| i as u8).collect();
    let mut back = vec![0u8; msg.len()];
    let mut round = |i: usize| {
        let n = 8 + (i * 37) % (msg.len() - 8);
        for s in conns.iter_mut() {
            s.write_all(&msg[..n]).unwrap();
        }
        for s in conns.iter_mut() {
            s.read_exact(&mut back[..n]).unwrap();
            assert_eq!(back[..n], msg[..n]);
        }
    };
    exempt_this_thread();
    for i in 0..3000 {
        round(i);
    }
    let allocs = counted(3000, &mut round);
    drop(conns);
    drop(server);
    assert_eq!(
        allocs, 0,
        "heap allocations on the echo thread in steady state"
    );
}

/// One test: the count is process-wide, so the two servers take turns.
#[test]
fn no_heap_allocation_per_request_on_the_server_threads() {
    pagestore();
    echo();
}
