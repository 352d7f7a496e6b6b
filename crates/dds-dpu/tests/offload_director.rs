//! The traffic director over real sockets with the pagestore app: a real host server, a real
//! file service, requests split between host and DPU and merged back in order.

#[path = "offload/common.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use dds_apps::offload::pagestore::{MessageBuilder, OP_READ, OP_WRITE};
use dds_apps::offload::{PagestoreApp, PagestoreConfig};
use dds_director::DirectorHandle;
use dds_offload_api::OffloadApp;
use rand::{Rng, SeedableRng};

const PAGE: usize = 4096;

struct Setup {
    dpu: Dpu,
    host: HostServer,
    file: u32,
    app: Arc<dyn OffloadApp>,
}

fn setup() -> Setup {
    setup_with(PagestoreConfig::default())
}

fn setup_with(cfg: PagestoreConfig) -> Setup {
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::new(cfg));
    let dpu = Dpu::start(app.clone(), 2);
    let files = dpu.files();
    let file = files.create("/pages");
    let host = pagestore_server(loopback(), files);
    Setup {
        dpu,
        host,
        file,
        app,
    }
}

/// A client that checks every response against a model of the file.
struct Client {
    s: TcpStream,
    model: Vec<u8>,
    file: u32,
    next_id: u64,
    expect: std::collections::VecDeque<(u64, u8, u64, u32, Vec<u8>)>,
}

impl Client {
    fn new(addr: std::net::SocketAddr, file: u32, model: Vec<u8>) -> Client {
        Client {
            s: connect(addr),
            model,
            file,
            next_id: 1,
            expect: Default::default(),
        }
    }

    /// Queues a message of (is_write, page, pages) requests; the model is updated now
    /// because responses must reflect request order.
    fn send(&mut self, reqs: &[(bool, usize, usize)], seed: u64) {
        let mut b = MessageBuilder::new();
        for (k, &(w, page, n)) in reqs.iter().enumerate() {
            let id = self.next_id;
            self.next_id += 1;
            let off = page * PAGE;
            let len = n * PAGE;
            if w {
                let data = pattern(seed * 1000 + k as u64, len);
                if self.model.len() < off + len {
                    self.model.resize(off + len, 0);
                }
                self.model[off..off + len].copy_from_slice(&data);
                b.write(self.file, off as u64, &data, id);
                self.expect
                    .push_back((id, OP_WRITE, off as u64, len as u32, Vec::new()));
            } else {
                b.read(self.file, off as u64, len as u32, id);
                let end = (off + len)
                    .min(self.model.len())
                    .max(off.min(self.model.len()));
                let want = self.model[off.min(self.model.len())..end].to_vec();
                self.expect
                    .push_back((id, OP_READ, off as u64, len as u32, want));
            }
        }
        self.s.write_all(b.finish()).unwrap();
    }

    fn check(&mut self, n: usize) {
        for _ in 0..n {
            let (id, op, off, len, want) = self.expect.pop_front().unwrap();
            let (h, body) = read_response(&mut self.s).unwrap();
            assert_eq!(
                (h.req_id, h.op, h.status),
                (id, op, 0),
                "response order/status"
            );
            if op == OP_READ {
                let want = &want[..];
                assert_eq!(h.len as usize, want.len());
                if body[..want.len()] != *want {
                    let first = body.iter().zip(want).position(|(a, b)| a != b).unwrap();
                    panic!(
                        "read {off}+{len} (id {id}) returned wrong bytes from {first}: got {:?} want {:?}",
                        &body[first..first + 8],
                        &want[first..first + 8]
                    );
                }
            } else {
                assert_eq!(h.len, len);
            }
        }
    }
}

fn run_mixed(copy_mode: bool, require_cached: bool) {
    let st = setup_with(PagestoreConfig {
        require_cached,
        ..PagestoreConfig::default()
    });
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |c| {
        c.copy_mode = copy_mode;
        c.threads = 2;
    });
    let mut c = Client::new(d.local_addr(), st.file, Vec::new());
    // Fill 64 pages through the host (cache-on-write makes them offloadable).
    for chunk in 0..8 {
        let reqs: Vec<_> = (0..8).map(|i| (true, chunk * 8 + i, 1)).collect();
        c.send(&reqs, chunk as u64);
        c.check(8);
    }
    let before = d.stats();
    // Interleaved pipelined traffic: reads (offloaded) and writes (host), some reads of
    // pages written in the same or an earlier pipelined message.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(copy_mode as u64 + 2 * require_cached as u64);
    for round in 0..40u64 {
        let n = rng.gen_range(1..12);
        let reqs: Vec<_> = (0..n)
            .map(|_| {
                let w = rng.gen_bool(0.25);
                let pages = rng.gen_range(1..4);
                (w, rng.gen_range(0..64 - pages), pages)
            })
            .collect();
        c.send(&reqs, 100 + round);
        if round % 4 == 3 {
            let pending = c.expect.len();
            c.check(pending);
        }
    }
    let pending = c.expect.len();
    c.check(pending);
    let s = d.stats();
    assert!(s.offloaded - before.offloaded > 50, "{s:?}");
    assert!(s.forwarded - before.forwarded > 20, "{s:?}");
    assert_eq!(s.malformed, 0);
    d.shutdown();
}

#[test]
fn interleaved_offloaded_and_forwarded_in_order_zero_copy() {
    run_mixed(false, true);
}

#[test]
fn interleaved_in_order_with_direct_mapping() {
    run_mixed(false, false);
}

#[test]
fn interleaved_offloaded_and_forwarded_in_order_copy_mode() {
    run_mixed(true, true);
}

#[test]
fn fragmented_pipelined_and_huge_messages() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |c| {
        c.buffer_bytes = 1 << 20;
        c.context_ring_len = 8;
    });
    let mut c = Client::new(d.local_addr(), st.file, Vec::new());
    // A huge message at the protocol limit: 15 writes of 1 MiB (15 MiB + headers, under
    // 16 MiB), then reads of 1 MiB (offloaded).
    let reqs: Vec<_> = (0..15).map(|i| (true, i * 256, 256)).collect();
    c.send(&reqs, 7);
    c.check(15);
    let reqs: Vec<_> = (0..12).map(|i| (i % 3 == 0, i * 256, 256)).collect();
    c.send(&reqs, 8);
    c.check(12);
    // Messages sent a few bytes at a time, many in flight.
    let mut b = MessageBuilder::new();
    let mut all = Vec::new();
    let mut ids = Vec::new();
    for m in 0..30u64 {
        b.clear();
        b.read(st.file, m * 4096, 4096, 1000 + m);
        b.read(st.file, (m + 1) * 4096 + 10, 100, 2000 + m);
        all.extend_from_slice(b.finish());
        ids.push(1000 + m);
        ids.push(2000 + m);
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let mut at = 0;
    while at < all.len() {
        let n = rng.gen_range(1..50).min(all.len() - at);
        c.s.write_all(&all[at..at + n]).unwrap();
        at += n;
        if rng.gen_bool(0.1) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    for (k, id) in ids.iter().enumerate() {
        let (h, body) = read_response(&mut c.s).unwrap();
        assert_eq!(h.req_id, *id);
        let m = k / 2;
        let (off, len) = if k % 2 == 0 {
            (m * 4096, 4096)
        } else {
            ((m + 1) * 4096 + 10, 100)
        };
        assert!(body[..len] == c.model[off..off + len]);
    }
    let s = d.stats();
    // 68 reads were offloadable; with 8 contexts some fall back to the host.
    assert!(s.offloaded >= 8 && s.offloaded + s.fallback >= 68, "{s:?}");
}

#[test]
fn slow_reader_gets_everything_and_others_are_not_blocked() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |c| {
        c.context_ring_len = 16;
        c.max_contexts_per_conn = 8;
    });
    let mut fill = Client::new(d.local_addr(), st.file, Vec::new());
    let reqs: Vec<_> = (0..16).map(|i| (true, i * 16, 16)).collect();
    fill.send(&reqs, 1);
    fill.check(16);
    let model = fill.model.clone();
    // The slow client pipelines ~40 MiB of 64 KiB reads and does not read for a while.
    let mut slow = Client::new(d.local_addr(), st.file, model.clone());
    let writer = {
        let mut s = slow.s.try_clone().unwrap();
        let file = st.file;
        std::thread::spawn(move || {
            let mut b = MessageBuilder::new();
            for m in 0..640u64 {
                b.clear();
                b.read(file, (m % 16) * 65536, 65536, m);
                if s.write_all(b.finish()).is_err() {
                    return;
                }
            }
        })
    };
    for m in 0..640u64 {
        let off = (m % 16) as usize * 65536;
        let want = slow.model[off..off + 65536].to_vec();
        slow.expect.push_back((m, OP_READ, off as u64, 65536, want));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Another client is served meanwhile.
    let mut other = Client::new(d.local_addr(), st.file, model);
    let t = Instant::now();
    other.send(&[(false, 3, 2), (true, 300, 1), (false, 300, 1)], 9);
    other.check(3);
    assert!(t.elapsed() < Duration::from_secs(5));
    slow.check(640);
    writer.join().unwrap();
}

#[test]
fn half_close_delivers_all_responses() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |_| {});
    let mut c = Client::new(d.local_addr(), st.file, Vec::new());
    c.send(&[(true, 0, 4)], 1);
    c.check(1);
    for i in 0..20u64 {
        c.send(
            &[(false, 0, 1), (true, 5 + i as usize, 1), (false, 1, 2)],
            10 + i,
        );
    }
    c.s.shutdown(Shutdown::Write).unwrap();
    c.check(60);
    // After the last response the director closes the stream.
    let mut b = [0u8; 1];
    assert_eq!(c.s.read(&mut b).unwrap(), 0);
}

#[test]
fn malformed_frames_and_truncated_streams_close_only_that_connection() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |_| {});
    let mut good = Client::new(d.local_addr(), st.file, Vec::new());
    good.send(&[(true, 0, 2)], 1);
    good.check(1);
    let bad_inputs: Vec<Vec<u8>> = vec![
        // length below the minimum
        vec![4, 0, 0, 0, 1, 0, 0, 0],
        // length above 16 MiB
        (u32::MAX)
            .to_le_bytes()
            .iter()
            .copied()
            .chain([0u8; 60])
            .collect(),
        // unknown op
        {
            let mut b = MessageBuilder::new();
            b.read(st.file, 0, 8, 1);
            let mut m = b.finish().to_vec();
            m[8] = 9;
            m
        },
        // count does not match
        {
            let mut b = MessageBuilder::new();
            b.read(st.file, 0, 8, 1);
            let mut m = b.finish().to_vec();
            m[4] = 3;
            m
        },
    ];
    for bad in bad_inputs {
        let mut s = connect(d.local_addr());
        // A valid message first: its response still arrives.
        let mut b = MessageBuilder::new();
        b.read(st.file, 0, 16, 42);
        s.write_all(b.finish()).unwrap();
        let (h, _) = read_response(&mut s).unwrap();
        assert_eq!(h.req_id, 42);
        s.write_all(&bad).unwrap();
        assert!(closed(&mut s), "connection closed after malformed input");
    }
    // A truncated stream: a whole message, half a message, then EOF. The first message is
    // answered, then the connection is closed.
    let mut s = connect(d.local_addr());
    let mut b = MessageBuilder::new();
    b.read(st.file, 0, 16, 6);
    s.write_all(b.finish()).unwrap();
    b.clear();
    b.read(st.file, 0, 16, 7);
    b.write(st.file, 0, &[1u8; 100], 8);
    let m = b.finish().to_vec();
    s.write_all(&m[..m.len() / 2]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let (h, _) = read_response(&mut s).unwrap();
    assert_eq!(h.req_id, 6);
    assert!(closed(&mut s));
    let mut s = connect(d.local_addr());
    s.write_all(&m[..m.len() / 2]).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert!(closed(&mut s));
    // A reset in the middle of pipelined traffic.
    let s = connect(d.local_addr());
    let mut b = MessageBuilder::new();
    for i in 0..50 {
        b.clear();
        b.read(st.file, 0, 8192, i);
        (&s).write_all(b.finish()).unwrap();
    }
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
    drop(s);
    // Everyone else is still served.
    good.send(&[(false, 0, 2), (true, 2, 1), (false, 2, 1)], 5);
    good.check(3);
    let stats = d.stats();
    assert!(stats.malformed >= 6, "{stats:?}");
}

#[test]
fn host_death_and_restart() {
    let st = setup();
    let host_addr = st.host.addr;
    let d = director(&st.dpu, st.app.clone(), host_addr, |_| {});
    let mut c = Client::new(d.local_addr(), st.file, Vec::new());
    c.send(&[(true, 0, 2)], 1);
    c.check(1);
    // The host dies: the client connection is closed.
    let Setup {
        dpu,
        host,
        file,
        app,
    } = st;
    host.kill();
    assert!(closed(&mut c.s));
    // New connections while the host is down are closed.
    let mut s = connect(d.local_addr());
    let mut b = MessageBuilder::new();
    b.write(file, 0, &[1u8; 8], 1);
    let _ = s.write_all(b.finish());
    assert!(closed(&mut s));
    // The host comes back on the same address: new connections work.
    let host = pagestore_server(host_addr, dpu.files());
    let mut c = Client::new(d.local_addr(), file, c.model.clone());
    c.send(&[(false, 0, 2), (true, 3, 1), (false, 3, 1)], 2);
    c.check(3);
    drop(host);
    drop(app);
}

#[test]
fn unmatched_connections_are_spliced() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |c| {
        c.signature = "10.0.0.0/8:* *:* tcp".parse().unwrap();
    });
    let mut c = Client::new(d.local_addr(), st.file, Vec::new());
    c.send(&[(true, 0, 2), (false, 0, 2)], 1);
    c.check(2);
    for i in 0..10 {
        c.send(&[(false, 0, 1), (true, 1, 1), (false, 1, 1)], 2 + i);
    }
    c.check(30);
    c.s.shutdown(Shutdown::Write).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(c.s.read(&mut b).unwrap(), 0);
    let s = d.stats();
    assert_eq!(
        (s.spliced, s.split, s.offloaded, s.messages),
        (1, 0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn random_garbage_never_hurts_other_connections() {
    let st = setup();
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |c| c.threads = 2);
    let mut good = Client::new(d.local_addr(), st.file, Vec::new());
    good.send(&[(true, 0, 4)], 1);
    good.check(1);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
    let mut b = MessageBuilder::new();
    for round in 0..40u64 {
        let mut s = connect(d.local_addr());
        // A valid prefix, sometimes, then random bytes with a plausible length field.
        let mut bytes = Vec::new();
        if rng.gen_bool(0.5) {
            b.clear();
            b.read(st.file, 0, 64, round)
                .write(st.file, 1 << 20, &[3u8; 40], round);
            bytes.extend_from_slice(b.finish());
        }
        let n = rng.gen_range(1..300);
        let start = bytes.len();
        bytes.extend((0..n).map(|_| rng.gen::<u8>()));
        if n >= 8 && rng.gen_bool(0.5) {
            let len = rng.gen_range(40..400u32);
            bytes[start..start + 4].copy_from_slice(&len.to_le_bytes());
            bytes[start + 4..start + 8].copy_from_slice(&[1, 0, 0, 0]);
        }
        let _ = s.write_all(&bytes);
        if rng.gen_bool(0.5) {
            let _ = s.shutdown(Shutdown::Write);
        }
        if rng.gen_bool(0.3) {
            rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
        }
        drop(s);
        if round % 10 == 9 {
            good.send(&[(false, 0, 2), (true, 1, 1), (false, 1, 1)], round);
            good.check(3);
        }
    }
    good.send(&[(false, 0, 4)], 1000);
    good.check(1);
}

/// Only files the application exposed are read on the DPU: with direct mapping (every READ
/// offloadable, the benchmark mode), a READ of a file the host keeps private goes to the host
/// application, which decides; a READ of an exposed file is served on the DPU.
#[test]
fn private_files_are_never_read_on_the_dpu() {
    let st = setup_with(PagestoreConfig {
        require_cached: false,
        ..PagestoreConfig::default()
    });
    let files = st.dpu.files();
    let secret = files.create_private("/secret");
    assert_eq!(files.write(secret, 0, vec![0x5a; PAGE]), Ok(PAGE as u32));
    assert_eq!(files.write(st.file, 0, vec![0x11; PAGE]), Ok(PAGE as u32));
    let d = director(&st.dpu, st.app.clone(), st.host.addr, |_| {});
    let mut s = connect(d.local_addr());
    let mut b = MessageBuilder::new();
    b.read(secret, 0, PAGE as u32, 1)
        .read(st.file, 0, PAGE as u32, 2);
    s.write_all(b.finish()).unwrap();
    let (h1, _) = read_response(&mut s).unwrap();
    let (h2, body) = read_response(&mut s).unwrap();
    assert_eq!((h1.req_id, h2.req_id), (1, 2));
    assert_eq!(&body[..PAGE], &[0x11; PAGE][..]);
    let stats = d.stats();
    assert_eq!(
        (stats.offloaded, stats.unexposed, stats.forwarded),
        (1, 1, 1),
        "{stats:?}"
    );
}

/// A DPU whose device reports reads one by one, `latency` apart, a pagestore host server, a
/// one-thread director, and a client that wrote 64 pages through the host (cache-on-write
/// makes them offloadable).
fn slow_director_with_pages(latency: Duration) -> (Dpu, HostServer, DirectorHandle, Client) {
    slow_director_with_pages_and(latency, |_| {})
}

/// As [`slow_director_with_pages`], with the director's configuration changed by `tweak`.
fn slow_director_with_pages_and(
    latency: Duration,
    tweak: impl FnOnce(&mut dds_director::DirectorConfig),
) -> (Dpu, HostServer, DirectorHandle, Client) {
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::new(PagestoreConfig::default()));
    let dpu = Dpu::start_slow(app.clone(), 1, latency);
    let files = dpu.files();
    let file = files.create("/pages");
    let host = pagestore_server(loopback(), files);
    let d = director(&dpu, app, host.addr, |c| {
        c.threads = 1;
        tweak(c);
    });
    let mut c = Client::new(d.local_addr(), file, Vec::new());
    for chunk in 0..8 {
        let reqs: Vec<_> = (0..8).map(|i| (true, chunk * 8 + i, 1)).collect();
        c.send(&reqs, chunk as u64);
        c.check(8);
    }
    (dpu, host, d, c)
}

/// On a device that reports reads one by one, 300 µs apart, a message's eight reads complete
/// over 2.4 ms. A director thread sleeps until a message's reads are all done
/// (`prepare_sleep_until`), so messages of eight offloaded reads, sent one at a time, cost
/// about one wake-up each, not one per read.
#[test]
fn a_message_of_offloaded_reads_wakes_the_director_about_once() {
    let (_dpu, _host, d, mut c) = slow_director_with_pages(Duration::from_micros(300));
    let before = d.stats();
    let messages = 40u64;
    for m in 0..messages {
        let reqs: Vec<_> = (0..8)
            .map(|i| (false, ((m * 13 + i * 7) % 64) as usize, 1))
            .collect();
        c.send(&reqs, 1000 + m);
        c.check(8);
    }
    let s = d.stats();
    assert_eq!(s.offloaded - before.offloaded, messages * 8, "{s:?}");
    let wakeups = s.lane_wakeups - before.lane_wakeups;
    eprintln!("{wakeups} director wake-ups for {messages} messages of 8 offloaded reads");
    assert!(
        wakeups <= 2 * messages,
        "{wakeups} wake-ups for {messages} messages: the director woke per read"
    );
    d.shutdown();
}

/// `rounds` times, every client sends a message of eight reads of the 64 pages, all in flight
/// at once (their responses complete together), then checks its responses.
fn eight_reads_each(clients: &mut [Client], rounds: u64) {
    for r in 0..rounds {
        for (k, c) in clients.iter_mut().enumerate() {
            let reqs: Vec<_> = (0..8)
                .map(|i| (false, ((r * 5 + k as u64 * 3 + i * 7) % 64) as usize, 1))
                .collect();
            c.send(&reqs, 1000 + r * 100 + k as u64);
        }
        for c in clients.iter_mut() {
            c.check(8);
        }
    }
}

/// Sixteen clients with a message of eight offloaded reads each in flight at once: every
/// response is right and in order, and (on io_uring, the default) leaves through the ring's
/// sends, several connections' per system call when their reads complete together.
#[test]
fn concurrent_clients_are_answered_through_the_ring() {
    let (_dpu, _host, d, writer) = slow_director_with_pages(Duration::from_micros(100));
    let mut clients: Vec<Client> = (0..16)
        .map(|_| Client::new(d.local_addr(), writer.file, writer.model.clone()))
        .collect();
    let before = d.stats();
    let rounds = 20u64;
    eight_reads_each(&mut clients, rounds);
    let s = d.stats();
    let messages = rounds * clients.len() as u64;
    assert_eq!(s.offloaded - before.offloaded, messages * 8, "{s:?}");
    let sends = s.ring_sends - before.ring_sends;
    let calls = s.ring_send_calls - before.ring_send_calls;
    eprintln!("{messages} messages: {sends} sends on the ring in {calls} calls");
    if std::env::var(dds_server::BACKEND_ENV).as_deref() == Ok("epoll") {
        assert_eq!(sends, 0, "the director was asked to stay on epoll");
    } else {
        // Each message's responses leave through the ring, at least one send per message.
        assert!(
            sends >= messages,
            "{sends} ring sends for {messages} messages"
        );
        assert!(
            calls >= 1 && calls <= sends,
            "{calls} calls for {sends} sends"
        );
    }
    d.shutdown();
}

/// With `round_bytes` at its least, a round merges one completed read: sixteen clients with
/// eight offloaded reads each in flight still get every response, right and in order, the
/// completions left for later rounds never stall the director, and no send call carries more
/// than one round's response.
#[test]
fn a_round_bounded_to_one_response_still_answers_everything_in_order() {
    let (_dpu, _host, d, writer) =
        slow_director_with_pages_and(Duration::from_micros(20), |c| c.round_bytes = 1);
    let mut clients: Vec<Client> = (0..16)
        .map(|_| Client::new(d.local_addr(), writer.file, writer.model.clone()))
        .collect();
    let before = d.stats();
    let rounds = 10u64;
    eight_reads_each(&mut clients, rounds);
    let s = d.stats();
    let reads = rounds * clients.len() as u64 * 8;
    assert_eq!(s.offloaded - before.offloaded, reads, "{s:?}");
    let sends = s.ring_sends - before.ring_sends;
    let calls = s.ring_send_calls - before.ring_send_calls;
    eprintln!("{reads} offloaded reads: {sends} sends on the ring in {calls} calls");
    if std::env::var(dds_server::BACKEND_ENV).as_deref() != Ok("epoll") {
        assert!(sends >= reads, "{sends} ring sends for {reads} responses");
        assert!(
            sends <= calls,
            "{sends} sends in {calls} calls: a round sent more than one"
        );
    }
    d.shutdown();
}
