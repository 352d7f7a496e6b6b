//! The runtime allocates nothing per request once warm, requests split across reads
//! included: a line protocol (`ECHO x`) served on both backends to four connections, each
//! request sent in two parts with a pause between them so that the loop reads the first part
//! alone and must keep it. After a warm-up, the loop thread's allocations are counted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dds_server::{Backend, Budget, Completions, Config, ConnId, Out, Server, Service, Verdict};
use dds_testkit::alloc::{allocations_in, count_thread_id, thread_named, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

struct Echo;

impl Service for Echo {
    type Session = ();

    fn open(&mut self, _id: ConnId) {}

    fn on_input(
        &mut self,
        _id: ConnId,
        _s: &mut (),
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        while let Some(nl) = input[at..].iter().position(|&b| b == b'\n') {
            let line = &input[at..at + nl];
            at += nl + 1;
            match line.strip_prefix(b"ECHO ") {
                Some(x) => {
                    out.extend_from_slice(x);
                    out.push(b'\n');
                }
                None => out.extend_from_slice(b"ERR\n"),
            }
        }
        (at, Verdict::Continue)
    }

    fn input_overflow(&mut self, out: &mut Out<'_>) {
        out.extend_from_slice(b"ERR line too long\n");
    }

    fn rejected(&self) -> &'static [u8] {
        b"ERR too many connections\n"
    }

    fn complete(&mut self, _done: &mut Completions<'_, ()>) {}
}

/// One request per connection, each in two parts: all first parts, a pause, all second
/// parts; then every reply read and checked.
fn round(conns: &mut [TcpStream], n: &mut u64, reply: &mut [u8]) {
    *n += 1;
    let body = [b'a' + (*n % 26) as u8; 300];
    for s in conns.iter_mut() {
        s.write_all(b"ECHO ").unwrap();
        s.write_all(&body[..100]).unwrap();
    }
    thread::sleep(Duration::from_millis(2));
    for s in conns.iter_mut() {
        s.write_all(&body[100..]).unwrap();
        s.write_all(b"\n").unwrap();
    }
    for s in conns.iter_mut() {
        s.read_exact(reply).unwrap();
        assert_eq!(&reply[..300], &body[..], "the request echoed whole");
        assert_eq!(reply[300], b'\n');
    }
}

fn case(backend: Backend) {
    let cfg = Config {
        backend,
        ..Config::default()
    };
    let server = Server::bind(
        "127.0.0.1:0".parse::<SocketAddr>().unwrap(),
        cfg,
        Budget::new(64 << 20),
        Echo,
    )
    .unwrap();
    if server.backend() != backend {
        eprintln!("{backend:?} unavailable here: skipped");
        return;
    }
    let addr = server.local_addr();
    let name = format!("echo-{backend:?}");
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let t = thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            server.run(&stop2);
        })
        .unwrap();
    let mut conns: Vec<TcpStream> = (0..4)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s
        })
        .collect();
    let (mut n, mut reply) = (0u64, vec![0u8; 301]);
    for _ in 0..50 {
        round(&mut conns, &mut n, &mut reply);
    }
    count_thread_id(thread_named(&name));
    let allocs = allocations_in(|| {
        for _ in 0..200 {
            round(&mut conns, &mut n, &mut reply);
        }
    });
    count_thread_id(0);
    stop.store(true, Ordering::SeqCst);
    drop(conns);
    t.join().unwrap();
    assert_eq!(allocs, 0, "allocations on the {backend:?} loop");
}

#[test]
fn split_requests_allocate_nothing_once_warm() {
    case(Backend::Epoll);
    case(Backend::Uring);
}
