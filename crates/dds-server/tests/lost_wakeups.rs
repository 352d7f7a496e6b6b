//! The io_uring backend under the conditions that end its multishot requests, with nothing
//! else to wake the loop (a tick of a minute): a ring of two receive buffers shared by many
//! connections sending at once (receives end with ENOBUFS), a completion queue of eight
//! entries for hundreds of events per round (completions overflow into the kernel; the
//! receives, the accept and the poll of the service's descriptor that cannot post end), a
//! submission queue of one entry (submitted while completions are handled), receives that
//! end at their byte limit, requests that stop a connection's receive (pending) or wait for a
//! reply slot (deferred), completed by another thread through an eventfd, and connections
//! that close and reconnect. Every client gets every reply in order within its read timeout,
//! and the loop's counters show that each condition happened. The same clients against the
//! epoll backend are the control.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dds_server::{
    Backend, Budget, Completions, Config, ConnId, LoopStats, Out, Server, Service, Ticket, Verdict,
};

/// An operation completed by the other thread: the reply of a pending request, or of a
/// deferred one (its slot).
struct Job {
    id: ConnId,
    slot: Option<Ticket>,
    reply: Vec<u8>,
}

#[derive(Default)]
struct Queues {
    todo: Vec<Job>,
    done: Vec<Job>,
}

struct Mixed {
    queues: Arc<(Mutex<Queues>, std::sync::Condvar)>,
    event: Arc<OwnedFd>,
    in_flight: usize,
}

impl Mixed {
    fn hand_over(&mut self, job: Job) {
        let (q, cv) = &*self.queues;
        q.lock().unwrap().todo.push(job);
        cv.notify_one();
        self.in_flight += 1;
    }
}

impl Service for Mixed {
    type Session = ();

    fn open(&mut self, _id: ConnId) {}

    /// `ECHO tag pad` is answered `tag pad` at once; `WAIT tag pad` makes the connection
    /// pending and `LATE tag pad` reserves a slot, each answered `tag` by the other thread.
    fn on_input(
        &mut self,
        id: ConnId,
        _s: &mut (),
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        while let Some(nl) = input[at..].iter().position(|&b| b == b'\n') {
            let line = &input[at..at + nl];
            at += nl + 1;
            let (verb, rest) = line.split_at(5.min(line.len()));
            let tag = rest.split(|&b| b == b' ').next().unwrap_or_default();
            let mut reply = tag.to_vec();
            reply.push(b'\n');
            match verb {
                b"ECHO " => {
                    out.extend_from_slice(rest);
                    out.push(b'\n');
                }
                b"WAIT " => {
                    self.hand_over(Job {
                        id,
                        slot: None,
                        reply,
                    });
                    return (at, Verdict::Pending);
                }
                b"LATE " => {
                    let t = out.defer();
                    self.hand_over(Job {
                        id,
                        slot: Some(t),
                        reply,
                    });
                }
                _ => out.extend_from_slice(b"ERR\n"),
            }
        }
        (at, Verdict::Continue)
    }

    fn input_overflow(&mut self, out: &mut Out<'_>) {
        out.extend_from_slice(b"ERR too long\n");
    }

    fn rejected(&self) -> &'static [u8] {
        b"ERR full\n"
    }

    fn complete(&mut self, done: &mut Completions<'_, ()>) {
        // The descriptor first, then the queue: a job finished after this read writes the
        // descriptor again.
        let mut v = [0u8; 8];
        // SAFETY: an eventfd of ours, read into a buffer of 8 bytes.
        unsafe { libc::read(self.event.as_raw_fd(), v.as_mut_ptr().cast(), 8) };
        let jobs = std::mem::take(&mut self.queues.0.lock().unwrap().done);
        for job in jobs {
            self.in_flight -= 1;
            match job.slot {
                Some(t) => {
                    if let Some((_, b)) = done.fill(job.id, t) {
                        b.extend_from_slice(&job.reply);
                    }
                }
                None => {
                    if let Some((_, mut out)) = done.reply(job.id) {
                        out.extend_from_slice(&job.reply);
                    }
                    done.resume(job.id);
                }
            }
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.event.as_raw_fd())
    }

    // Always sleeps: only the poll of the descriptor wakes the loop for a completion.

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

/// The other thread: finishes the jobs in batches, after a short while, and writes the
/// eventfd once per batch.
fn completer(
    queues: Arc<(Mutex<Queues>, std::sync::Condvar)>,
    event: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
) {
    let (q, cv) = &*queues;
    let mut n = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let jobs = {
            let g = q.lock().unwrap();
            let mut g = cv
                .wait_timeout_while(g, Duration::from_millis(20), |g| g.todo.is_empty())
                .unwrap()
                .0;
            std::mem::take(&mut g.todo)
        };
        if jobs.is_empty() {
            continue;
        }
        n = n.wrapping_add(1);
        thread::sleep(Duration::from_micros(u64::from(n % 7) * 30));
        q.lock().unwrap().done.extend(jobs);
        // SAFETY: an eventfd of ours, written with 8 bytes.
        unsafe { libc::write(event.as_raw_fd(), 1u64.to_ne_bytes().as_ptr().cast(), 8) };
    }
}

const CLIENTS: usize = 48;
const ROUNDS: usize = 24;
const LINES: usize = 40;

/// One client: rounds of pipelined lines (some long, past the loop's receive buffers and a
/// receive's byte limit), every reply checked in order; a new connection every few rounds.
fn client(addr: SocketAddr, c: usize) {
    let connect = || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = BufReader::new(s.try_clone().unwrap());
        (s, r)
    };
    let (mut s, mut r) = connect();
    for round in 0..ROUNDS {
        if round % 6 == 5 {
            (s, r) = connect();
        }
        let mut req = Vec::new();
        let mut want = Vec::new();
        for j in 0..LINES {
            let tag = format!("{c}-{round}-{j}");
            let pad = "p".repeat((c * 131 + round * 71 + j * 997) % 3000);
            match (c + round + j) % 5 {
                0 => {
                    req.extend(format!("WAIT {tag} {pad}\n").bytes());
                    want.push(format!("{tag}\n"));
                }
                1 | 2 => {
                    req.extend(format!("LATE {tag} {pad}\n").bytes());
                    want.push(format!("{tag}\n"));
                }
                _ => {
                    req.extend(format!("ECHO {tag} {pad}\n").bytes());
                    want.push(format!("{tag} {pad}\n"));
                }
            }
        }
        s.write_all(&req).unwrap();
        for w in want {
            let mut l = String::new();
            r.read_line(&mut l)
                .unwrap_or_else(|e| panic!("client {c} round {round}: no reply ({e})"));
            assert_eq!(l, w, "client {c} round {round}");
        }
    }
}

fn run(backend: Backend, cfg: Config) -> LoopStats {
    // SAFETY: a new eventfd, owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: as above.
    let event = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
    let queues = Arc::new((Mutex::new(Queues::default()), std::sync::Condvar::new()));
    let service = Mixed {
        queues: queues.clone(),
        event: event.clone(),
        in_flight: 0,
    };
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        Config { backend, ..cfg },
        Budget::new(256 << 20),
        service,
    )
    .unwrap();
    assert_eq!(server.backend(), backend);
    let addr = server.local_addr();
    let counters = server.counters();
    let stop = Arc::new(AtomicBool::new(false));
    let done_stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (q, e, st) = (queues.clone(), event.clone(), done_stop.clone());
        thread::spawn(move || completer(q, e, st))
    };
    let looper = {
        let stop = stop.clone();
        thread::spawn(move || server.run(&stop))
    };
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| thread::spawn(move || client(addr, c)))
        .collect();
    let failed: Vec<_> = clients
        .into_iter()
        .map(|h| h.join())
        .filter(Result::is_err)
        .collect();
    stop.store(true, Ordering::Relaxed);
    // The loop sees the stop when it wakes.
    // SAFETY: an eventfd of ours, written with 8 bytes.
    unsafe { libc::write(event.as_raw_fd(), 1u64.to_ne_bytes().as_ptr().cast(), 8) };
    let svc = looper.join().unwrap();
    done_stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    assert!(
        failed.is_empty(),
        "{} clients failed on {backend:?}",
        failed.len()
    );
    assert_eq!(svc.in_flight, 0);
    let stats = counters.snapshot();
    assert_eq!(
        stats.accepted,
        (CLIENTS * (1 + (0..ROUNDS).filter(|r| r % 6 == 5).count())) as u64,
        "{stats:?}"
    );
    stats
}

fn starved() -> Config {
    Config {
        // Nothing but events wakes the loop.
        tick: Duration::from_secs(60),
        recv_buffers: 2,
        read_bytes: 4096,
        ring_entries: 8,
        max_connections: 512,
        ..Config::default()
    }
}

#[test]
fn io_uring_keeps_serving_when_its_multishot_requests_end() {
    let stats = run(Backend::Uring, starved());
    eprintln!("io_uring: {stats:?}");
    assert!(
        stats.uring_no_buffers > 0,
        "no receive ran out of buffers: {stats:?}"
    );
    assert!(
        stats.uring_cq_overflows > 0,
        "the completion queue never overflowed: {stats:?}"
    );
    assert!(stats.uring_rearms > stats.uring_no_buffers, "{stats:?}");
}

#[test]
fn epoll_serves_the_same_clients() {
    let stats = run(Backend::Epoll, starved());
    assert_eq!(
        (
            stats.uring_no_buffers,
            stats.uring_cq_overflows,
            stats.uring_rearms
        ),
        (0, 0, 0)
    );
}
