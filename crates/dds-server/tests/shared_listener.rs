//! `Server::from_listener`: loops on several threads serve one listening socket (a clone of
//! it each), every connection is served by one of them, and they share one budget. On both backends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use dds_server::{Backend, Budget, Completions, Config, ConnId, Out, Server, Service, Verdict};

/// Answers every byte with itself, upper-cased.
struct Upper;

impl Service for Upper {
    type Session = ();
    fn open(&mut self, _id: ConnId) {}
    fn on_input(
        &mut self,
        _id: ConnId,
        _s: &mut (),
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        out.extend(input.iter().map(u8::to_ascii_uppercase));
        (input.len(), Verdict::Continue)
    }
    fn input_overflow(&mut self, _out: &mut Out<'_>) {}
    fn rejected(&self) -> &'static [u8] {
        b"busy\n"
    }
    fn complete(&mut self, _done: &mut Completions<'_, ()>) {}
}

fn several_loops_share_one_listener(backend: Backend) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let budget = Budget::new(64 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let mut counters = Vec::new();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let server = Server::from_listener(
                listener.try_clone().unwrap(),
                Config {
                    backend,
                    ..Config::default()
                },
                budget.clone(),
                Upper,
            )
            .unwrap();
            assert_eq!(server.local_addr(), addr);
            assert_eq!(server.backend(), backend);
            counters.push(server.counters());
            let stop = stop.clone();
            std::thread::spawn(move || {
                server.run(&stop);
            })
        })
        .collect();
    drop(listener);
    let mut conns: Vec<TcpStream> = (0..24)
        .map(|_| {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        })
        .collect();
    for (i, s) in conns.iter_mut().enumerate() {
        let msg = format!("hello {i}");
        s.write_all(msg.as_bytes()).unwrap();
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back).unwrap();
        assert_eq!(back, msg.to_uppercase().as_bytes());
    }
    let accepted: u64 = counters.iter().map(|c| c.snapshot().accepted).sum();
    assert_eq!(
        accepted, 24,
        "every connection is accepted by exactly one loop"
    );
    drop(conns);
    stop.store(true, std::sync::atomic::Ordering::Release);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(budget.used(), 0);
}

#[test]
fn loops_on_several_threads_share_one_listener_epoll() {
    several_loops_share_one_listener(Backend::Epoll);
}

#[test]
fn loops_on_several_threads_share_one_listener_uring() {
    several_loops_share_one_listener(Backend::Uring);
}
