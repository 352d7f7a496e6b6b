//! The runtime with a line protocol over real sockets: `ECHO x` answers at once, `SLOW x`
//! becomes a pending operation completed by the service a few rounds later, `LATE x` a
//! reserved reply filled later, `HELD x` a reply written at once and held until the service
//! releases it (adding its line end). Replies keep
//! each connection's request order; slow and half-sent requests, floods and too many
//! connections are bounded; a stop drains pending work. Every case runs on both backends.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dds_server::{
    Backend, Budget, Completions, Config, ConnId, LoopCounters, Out, Server, Service, Ticket,
    Verdict,
};

#[derive(Default)]
struct Lines {
    /// Pending operations: (connection, reply, rounds left).
    slow: VecDeque<(ConnId, Vec<u8>, u32)>,
    /// Deferred replies, completed newest first: (connection, slot, reply).
    late: Vec<(ConnId, Ticket, Vec<u8>)>,
    closed: usize,
    shut: bool,
    /// What the server says first, if anything.
    greeting: &'static [u8],
}

impl Service for Lines {
    type Session = u64;

    fn open(&mut self, _id: ConnId) -> u64 {
        0
    }

    fn greet(&mut self, _id: ConnId, _n: &mut u64, out: &mut Out<'_>) {
        out.extend_from_slice(self.greeting);
    }

    fn on_input(
        &mut self,
        id: ConnId,
        n: &mut u64,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        while let Some(nl) = input[at..].iter().position(|&b| b == b'\n') {
            let line = &input[at..at + nl];
            at += nl + 1;
            *n += 1;
            if let Some(x) = line.strip_prefix(b"ECHO ") {
                out.extend_from_slice(x);
                out.push(b'\n');
            } else if let Some(x) = line.strip_prefix(b"SLOW ") {
                let mut r = x.to_vec();
                r.push(b'\n');
                self.slow.push_back((id, r, 3));
                return (at, Verdict::Pending);
            } else if let Some(x) = line.strip_prefix(b"LATE ") {
                let mut r = x.to_vec();
                r.push(b'\n');
                let t = out.defer();
                self.late.push((id, t, r));
            } else if let Some(x) = line.strip_prefix(b"HELD ") {
                let mark = out.len();
                out.extend_from_slice(x);
                let t = out.defer_written(mark);
                self.late.push((id, t, b"\n".to_vec()));
            } else if line == b"QUIT" {
                out.extend_from_slice(b"BYE\n");
                return (at, Verdict::Close);
            } else {
                out.extend_from_slice(b"ERR\n");
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

    fn complete(&mut self, done: &mut Completions<'_, u64>) {
        for _ in 0..self.slow.len() {
            let (id, r, left) = self.slow.pop_front().expect("counted");
            if left > 0 {
                self.slow.push_back((id, r, left - 1));
                continue;
            }
            if let Some((_, mut out)) = done.reply(id) {
                out.extend_from_slice(&r);
            }
            done.resume(id);
        }
        // Deferred replies complete out of order (newest first).
        while let Some((id, t, r)) = self.late.pop() {
            if let Some((_, b)) = done.fill(id, t) {
                b.extend_from_slice(&r);
            }
        }
    }

    fn prepare_sleep(&mut self) -> bool {
        self.slow.is_empty() && self.late.is_empty()
    }

    fn closed(&mut self, _id: ConnId, _n: u64) {
        self.closed += 1;
    }

    fn in_flight(&self) -> usize {
        self.slow.len() + self.late.len()
    }

    fn shutdown(&mut self) {
        self.shut = true;
    }
}

struct Running {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<Lines>,
    budget: Arc<Budget>,
    counters: Arc<LoopCounters>,
}

const BACKENDS: [Backend; 2] = [Backend::Epoll, Backend::Uring];

fn start(backend: Backend, cfg: Config) -> Running {
    start_lines(backend, cfg, Lines::default())
}

fn start_lines(backend: Backend, cfg: Config, lines: Lines) -> Running {
    let budget = Budget::new(64 << 20);
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        Config { backend, ..cfg },
        budget.clone(),
        lines,
    )
    .unwrap();
    assert_eq!(server.backend(), backend);
    let counters = server.counters();
    let addr = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = thread::spawn(move || server.run(&s));
    Running {
        addr,
        stop,
        thread,
        budget,
        counters,
    }
}

fn connect(addr: SocketAddr) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn line(r: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    l
}

#[test]
fn a_server_that_speaks_first_greets_before_any_request() {
    for backend in BACKENDS {
        let lines = Lines {
            greeting: b"HELLO\n",
            ..Lines::default()
        };
        let rt = start_lines(backend, Config::default(), lines);
        // Many clients, none of which says anything first.
        let mut clients: Vec<_> = (0..20).map(|_| connect(rt.addr)).collect();
        for (_, r) in &mut clients {
            assert_eq!(line(r), "HELLO\n", "{backend:?}");
        }
        let (s, r) = &mut clients[3];
        s.write_all(b"ECHO after\n").unwrap();
        assert_eq!(line(r), "after\n");
        drop(clients);
        rt.stop.store(true, Ordering::SeqCst);
        rt.thread.join().unwrap();
    }
}

#[test]
fn replies_keep_request_order_across_pending_operations() {
    for backend in BACKENDS {
        let rt = start(backend, Config::default());
        let mut clients: Vec<_> = (0..20).map(|_| connect(rt.addr)).collect();
        for (i, (s, _)) in clients.iter_mut().enumerate() {
            let mut req = Vec::new();
            for j in 0..50 {
                let kind = ["SLOW", "LATE", "ECHO", "HELD"][(i + j) % 4];
                req.extend(format!("{kind} {i}-{j}\n").bytes());
            }
            s.write_all(&req).unwrap();
        }
        for (i, (_, r)) in clients.iter_mut().enumerate() {
            for j in 0..50 {
                assert_eq!(line(r), format!("{i}-{j}\n"));
            }
        }
        rt.stop.store(true, Ordering::Relaxed);
        let svc = rt.thread.join().unwrap();
        assert!(svc.shut);
        assert_eq!(svc.closed, 20);
        assert_eq!(rt.budget.used(), 0, "every charged byte came back");
    }
}

#[test]
fn half_sent_requests_and_floods_are_bounded() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                frame_deadline: Some(Duration::from_millis(300)),
                input_limit: 4096,
                ..Config::default()
            },
        );
        // Connections that send half a request and hold it are closed after the deadline...
        let mut laggards: Vec<TcpStream> = (0..100)
            .map(|_| {
                let mut s = TcpStream::connect(rt.addr).unwrap();
                s.write_all(b"ECHO half").unwrap();
                s
            })
            .collect();
        // ...while others are served at once.
        let (mut s, mut r) = connect(rt.addr);
        let t = Instant::now();
        s.write_all(b"ECHO now\n").unwrap();
        assert_eq!(line(&mut r), "now\n");
        assert!(t.elapsed() < Duration::from_millis(250));
        for l in &mut laggards {
            l.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 16];
            assert!(
                matches!(l.read(&mut b), Ok(0) | Err(_)),
                "a laggard was closed"
            );
        }
        // A line over the limit: an error reply, then the close.
        let (mut s, mut r) = connect(rt.addr);
        s.write_all(&vec![b'x'; 10_000]).unwrap();
        assert_eq!(line(&mut r), "ERR line too long\n");
        assert_eq!(line(&mut r), "");
        rt.stop.store(true, Ordering::Relaxed);
        rt.thread.join().unwrap();
        assert_eq!(rt.budget.used(), 0);
    }
}

#[test]
fn the_slab_is_bounded_and_a_stop_drains_pending_work() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                max_connections: 4,
                ..Config::default()
            },
        );
        let mut held: Vec<_> = (0..4).map(|_| connect(rt.addr)).collect();
        for (s, r) in &mut held {
            s.write_all(b"ECHO up\n").unwrap();
            assert_eq!(line(r), "up\n");
        }
        let (_s, mut r) = connect(rt.addr);
        assert_eq!(line(&mut r), "ERR too many connections\n");
        // A pending request when the stop comes is answered before the close.
        held[0].0.write_all(b"SLOW last\n").unwrap();
        thread::sleep(Duration::from_millis(20));
        rt.stop.store(true, Ordering::Relaxed);
        assert_eq!(line(&mut held[0].1), "last\n");
        assert_eq!(line(&mut held[0].1), "");
        let svc = rt.thread.join().unwrap();
        assert_eq!(svc.closed, 4);
        assert_eq!(svc.in_flight(), 0);
    }
}

#[test]
fn a_client_that_does_not_read_pauses_its_connection_and_loses_nothing() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                output_pause: 64 << 10,
                output_keep: 4 << 10,
                ..Config::default()
            },
        );
        let (mut s, mut r) = connect(rt.addr);
        // 40 MB of replies while the client does not read: reading pauses (the writer
        // blocks once the sockets' buffers are full), nothing is lost.
        let payload = "y".repeat(1000);
        let writer = {
            let mut s = s.try_clone().unwrap();
            let payload = payload.clone();
            thread::spawn(move || {
                for i in 0..40_000 {
                    s.write_all(format!("ECHO {i}{payload}\n").as_bytes())
                        .unwrap();
                }
            })
        };
        thread::sleep(Duration::from_millis(500));
        assert!(
            !writer.is_finished(),
            "{backend:?}: the server kept reading ({:?})",
            rt.counters.snapshot()
        );
        for i in 0..40_000 {
            let mut l = String::new();
            if let Err(e) = r.read_line(&mut l) {
                panic!("{backend:?} line {i}: {e}");
            }
            assert_eq!(l, format!("{i}{payload}\n"));
        }
        writer.join().unwrap();
        s.write_all(b"QUIT\n").unwrap();
        assert_eq!(line(&mut r), "BYE\n");
        assert_eq!(line(&mut r), "");
        rt.stop.store(true, Ordering::Relaxed);
        rt.thread.join().unwrap();
        assert_eq!(rt.budget.used(), 0, "{backend:?}");
        // What the connection held: a pause's worth of replies and what it received ahead
        // (with io_uring: a receive's byte limit, 4 × read_bytes; on kernels before 6.16,
        // which have no such limit, at most the socket's receive buffer).
        assert!(
            rt.budget.peak() <= read_ahead_bound(),
            "{backend:?}: {} bytes held",
            rt.budget.peak()
        );
    }
}

fn read_ahead_bound() -> usize {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.split(|c: char| !c.is_ascii_digit());
    let version: (u32, u32) = (
        v.next().unwrap().parse().unwrap(),
        v.next().unwrap().parse().unwrap(),
    );
    if version >= (6, 16) {
        return 2 << 20;
    }
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    2 * rmem_max + (2 << 20)
}

#[test]
fn input_that_arrives_while_a_request_is_pending_waits_for_it() {
    for backend in BACKENDS {
        let rt = start(backend, Config::default());
        let (mut s, mut r) = connect(rt.addr);
        for i in 0..50 {
            // Each SLOW is pending for a few rounds; the lines after it arrive meanwhile.
            s.write_all(format!("SLOW s{i}\n").as_bytes()).unwrap();
            s.write_all(format!("ECHO e{i}\n").as_bytes()).unwrap();
            thread::sleep(Duration::from_millis(1));
            s.write_all(format!("LATE l{i}\n").as_bytes()).unwrap();
        }
        for i in 0..50 {
            assert_eq!(line(&mut r), format!("s{i}\n"));
            assert_eq!(line(&mut r), format!("e{i}\n"));
            assert_eq!(line(&mut r), format!("l{i}\n"));
        }
        // A half line, then the peer closes: replies so far still go out.
        s.write_all(b"ECHO last\nECHO half").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(line(&mut r), "last\n");
        assert_eq!(line(&mut r), "");
        rt.stop.store(true, Ordering::Relaxed);
        let svc = rt.thread.join().unwrap();
        assert_eq!(svc.closed, 1);
        assert_eq!(rt.budget.used(), 0, "{backend:?}");
    }
}

#[test]
fn more_clients_than_receive_buffers_are_all_served() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                recv_buffers: 2,
                read_bytes: 4096,
                ..Config::default()
            },
        );
        let clients: Vec<_> = (0..16)
            .map(|c| {
                let addr = rt.addr;
                thread::spawn(move || {
                    let (mut s, mut r) = connect(addr);
                    for round in 0..20 {
                        let mut req = Vec::new();
                        for j in 0..100 {
                            req.extend(format!("ECHO {c}-{round}-{j}\n").bytes());
                        }
                        s.write_all(&req).unwrap();
                        for j in 0..100 {
                            assert_eq!(line(&mut r), format!("{c}-{round}-{j}\n"));
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        rt.stop.store(true, Ordering::Relaxed);
        let svc = rt.thread.join().unwrap();
        assert_eq!(svc.closed, 16);
        assert_eq!(rt.counters.snapshot().accepted, 16);
    }
}

#[test]
fn idle_connections_are_closed_after_the_limit() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                idle_limit: Some(Duration::from_millis(200)),
                ..Config::default()
            },
        );
        let (mut s, mut r) = connect(rt.addr);
        s.write_all(b"ECHO hi\n").unwrap();
        assert_eq!(line(&mut r), "hi\n");
        let t = Instant::now();
        assert_eq!(line(&mut r), "", "{backend:?}: closed when idle");
        assert!(t.elapsed() >= Duration::from_millis(150));
        assert_eq!(rt.counters.snapshot().idle_timeouts, 1);
        rt.stop.store(true, Ordering::Relaxed);
        rt.thread.join().unwrap();
    }
}

#[test]
fn clients_that_vanish_mid_request_leave_the_slab_and_budget_consistent() {
    for backend in BACKENDS {
        let rt = start(
            backend,
            Config {
                max_connections: 8,
                ..Config::default()
            },
        );
        // Slots are reused while replies, receives and pending requests of the connections
        // that held them may still be in flight.
        let payload = "z".repeat(4000);
        for i in 0..200 {
            let mut s = TcpStream::connect(rt.addr).unwrap();
            let mut req = Vec::new();
            for j in 0..50 {
                let op = ["ECHO", "SLOW", "LATE"][(i + j) % 3];
                req.extend(format!("{op} {i}-{j}{payload}\n").bytes());
            }
            let _ = s.write_all(&req);
            if i % 2 == 0 {
                // Half of them half-close first, then vanish without reading.
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            drop(s);
        }
        // They are all taken from the backlog and closed (their pending requests done), and
        // everything still works.
        let deadline = Instant::now() + Duration::from_secs(20);
        while {
            let st = rt.counters.snapshot();
            st.accepted + st.rejected < 200 || st.closed < st.accepted
        } {
            assert!(
                Instant::now() < deadline,
                "{backend:?}: connections left open"
            );
            thread::sleep(Duration::from_millis(10));
        }
        let (mut s, mut r) = connect(rt.addr);
        s.write_all(b"SLOW a\nECHO b\nLATE c\n").unwrap();
        assert_eq!(line(&mut r), "a\n");
        assert_eq!(line(&mut r), "b\n");
        assert_eq!(line(&mut r), "c\n");
        drop((s, r));
        rt.stop.store(true, Ordering::Relaxed);
        let svc = rt.thread.join().unwrap();
        let stats = rt.counters.snapshot();
        assert_eq!(
            stats.accepted + stats.rejected,
            201,
            "{backend:?}: {stats:?}"
        );
        assert_eq!(stats.closed, stats.accepted, "{backend:?}: {stats:?}");
        assert_eq!(svc.closed as u64, stats.accepted, "{backend:?}");
        assert_eq!(svc.in_flight(), 0, "{backend:?}");
        assert_eq!(
            rt.budget.used(),
            0,
            "{backend:?}: every charged byte came back"
        );
    }
}
