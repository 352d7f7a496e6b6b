//! The pagestore server over real sockets, on both backends: OS files in a temporary directory,
//! and DDS files on a DPU running in this process (in-memory device, real control socket,
//! shared memory and emulated DMA engine).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_apps::client::{self, ClientConfig};
use dds_apps::pagestore::{
    parse_response_header, response_len, MessageBuilder, ResponseHeader, OP_READ, OP_WRITE,
};
use dds_apps::server::{Server, ServerConfig};
use dds_dpu::{Dpu, DpuConfig, DpuHandle, ExecMode};
use dds_host::Status;
use dds_storage::aio::{AsyncStorage, DdsAsyncStorage, Fill, OsAsyncStorage};
use dds_storage::pattern;

const FILE_SIZE: u64 = 2 << 20;

fn start_dpu() -> DpuHandle {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("apps"),
        exec_mode: ExecMode::ZeroCopy,
        dma_cost: Some(dds_dma::CostModel::bluefield2()),
        memory_budget_bytes: 256 << 20,
        ..DpuConfig::default()
    };
    Dpu::start_in_memory(config, 64 << 20).expect("DPU starts")
}

fn small_config() -> ServerConfig {
    ServerConfig {
        threads: 2,
        conn_max_bytes: 1 << 20,
        conn_max_ops: 256,
        ..ServerConfig::default()
    }
}

struct Fixture {
    server: Server,
    // Kept alive for the server's lifetime (dropped after it).
    _dir: Option<tempfile::TempDir>,
    dpu: Option<DpuHandle>,
}

impl Fixture {
    fn os(config: ServerConfig) -> Fixture {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let storage: Arc<dyn AsyncStorage> =
            Arc::new(OsAsyncStorage::open(dir.path(), 2, FILE_SIZE, Fill::Pattern).unwrap());
        Fixture {
            server: Server::start(config, storage).unwrap(),
            _dir: Some(dir),
            dpu: None,
        }
    }

    fn dds(config: ServerConfig) -> Fixture {
        let dpu = start_dpu();
        let storage: Arc<dyn AsyncStorage> = Arc::new(
            DdsAsyncStorage::open(
                dpu.socket(),
                "/pagestore",
                2,
                FILE_SIZE,
                Fill::Pattern,
                config.threads,
            )
            .unwrap(),
        );
        Fixture {
            server: Server::start(config, storage).unwrap(),
            _dir: None,
            dpu: Some(dpu),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn files(&self) -> Vec<u32> {
        self.server.storage().file_ids().to_vec()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads one response; `None` at end of stream.
fn read_response(s: &mut TcpStream) -> Option<(ResponseHeader, Vec<u8>)> {
    let mut h = [0u8; 24];
    match s.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return None,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => return None,
        Err(e) => panic!("read: {e}"),
    }
    let len = response_len(&h).unwrap().unwrap();
    let mut body = vec![0u8; len - 24];
    s.read_exact(&mut body).unwrap();
    let hdr = parse_response_header(&h).unwrap();
    body.truncate(hdr.len as usize * (hdr.op == OP_READ) as usize);
    Some((hdr, body))
}

/// True when the server closed the connection (EOF or reset) within 10 s.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return false
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    false
}

fn wait_for(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn verified_run(fx: &Fixture) {
    let rep = client::run(&ClientConfig {
        connect: fx.addr(),
        files: fx.files(),
        file_size: FILE_SIZE,
        io_size: 4096,
        read_ratio: 0.6,
        batch: 8,
        outstanding: 4,
        connections: 3,
        duration: None,
        requests: Some(6000),
        verify: true,
        seed: 7,
    })
    .unwrap();
    assert_eq!(rep.requests, 6000, "{rep:?}");
    assert!(rep.reads > 0 && rep.writes > 0, "{rep:?}");
    assert_eq!(
        (
            rep.errors,
            rep.order_violations,
            rep.verify_failures,
            rep.failed_connections
        ),
        (0, 0, 0, 0),
        "{rep:?}"
    );
    // Unaligned I/O (the OS backend takes its buffered path) and 1 KiB I/O.
    for io_size in [1000, 1024] {
        let rep = client::run(&ClientConfig {
            connect: fx.addr(),
            files: fx.files(),
            file_size: FILE_SIZE,
            io_size,
            read_ratio: 0.5,
            batch: 16,
            outstanding: 2,
            connections: 1,
            duration: None,
            requests: Some(2000),
            verify: true,
            seed: io_size as u64,
        })
        .unwrap();
        assert_eq!(
            (
                rep.requests,
                rep.errors,
                rep.order_violations,
                rep.verify_failures
            ),
            (2000, 0, 0, 0),
            "io {io_size}: {rep:?}"
        );
    }
}

#[test]
fn os_backend_serves_verified_reads_and_writes() {
    verified_run(&Fixture::os(small_config()));
}

#[test]
fn dds_backend_serves_verified_reads_and_writes() {
    verified_run(&Fixture::dds(small_config()));
}

fn edge_cases(fx: &Fixture) {
    let files = fx.files();
    let f = files[0];
    let mut s = connect(fx.addr());
    let mut b = MessageBuilder::new();
    let data: Vec<u8> = (0..100u32).map(|i| i as u8).collect();
    // The read-back goes in a later message here; within one message it would wait for the
    // write (see `pipelined_write_then_read`).
    b.write(f, 8, &data, 1); // unaligned write
    s.write_all(b.finish()).unwrap();
    let mut got = vec![read_response(&mut s).unwrap()];
    b.clear();
    b.read(f, 8, 100, 2) // read it back
        .read(999_999, 0, 8, 3) // unknown file
        .write(f, FILE_SIZE - 4, &data[..8], 4) // write past the file size
        .read(f, FILE_SIZE - 16, 64, 5) // short read at the end of the file
        .read(f, 0, 0, 6); // zero-length read
    s.write_all(b.finish()).unwrap();
    for _ in 0..5 {
        got.push(read_response(&mut s).unwrap());
    }
    let ids: Vec<u64> = got.iter().map(|(h, _)| h.req_id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "responses in request order");
    assert_eq!(
        (got[0].0.status, got[0].0.op, got[0].0.len),
        (0, OP_WRITE, 100)
    );
    assert_eq!(got[1].1, data);
    assert_eq!(got[2].0.status, Status::UnknownFile.code());
    assert_eq!(got[3].0.status, Status::OutOfRange.code());
    assert_eq!((got[4].0.status, got[4].0.len), (0, 16));
    assert_eq!(pattern::check(f, FILE_SIZE - 16, &got[4].1), None);
    assert_eq!((got[5].0.status, got[5].0.len), (0, 0));
    // The connection is still usable after error responses.
    b.clear();
    b.read(f, 4096, 512, 7);
    s.write_all(b.finish()).unwrap();
    let (h, d) = read_response(&mut s).unwrap();
    assert_eq!((h.req_id, h.status), (7, 0));
    assert_eq!(pattern::check(f, 4096, &d), None);
}

#[test]
fn os_backend_answers_bad_requests_with_status_codes() {
    edge_cases(&Fixture::os(small_config()));
}

#[test]
fn dds_backend_answers_bad_requests_with_status_codes() {
    edge_cases(&Fixture::dds(small_config()));
}

/// Byte strings that break the protocol, each on its own connection.
fn malformed_messages(file: u32) -> Vec<(&'static str, Vec<u8>)> {
    let mut b = MessageBuilder::new();
    b.read(file, 0, 8, 1);
    let good = b.finish().to_vec();
    let mut out = Vec::new();
    let mut m = good.clone();
    m[8] = 9;
    out.push(("unknown op", m));
    let mut m = good.clone();
    m[4] = 0;
    out.push(("zero count", m));
    let mut m = good.clone();
    m[4] = 2;
    out.push(("count beyond the message", m));
    let mut m = good.clone();
    m[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    out.push(("huge length", m));
    let mut m = good.clone();
    m[0..4].copy_from_slice(&3u32.to_le_bytes());
    out.push(("tiny length", m));
    let mut m = good.clone();
    m[6] = 1;
    out.push(("flags", m));
    let mut m = good.clone();
    m[9] = 1;
    out.push(("reserved request bytes", m));
    let mut m = good.clone();
    m[24..28].copy_from_slice(&((1u32 << 20) + 1).to_le_bytes());
    out.push(("read above 1 MiB", m));
    // A valid message followed by garbage: the first is answered, then the close.
    let mut m = good;
    m.extend_from_slice(&[0xFF; 40]);
    out.push(("garbage after a valid message", m));
    out
}

fn malformed_closes_only_that_connection(fx: &Fixture) {
    let files = fx.files();
    let mut healthy = connect(fx.addr());
    let mut b = MessageBuilder::new();
    for (i, (what, bytes)) in malformed_messages(files[0]).into_iter().enumerate() {
        let before = fx.server.stats().closed_malformed;
        let mut bad = connect(fx.addr());
        bad.write_all(&bytes).unwrap();
        assert!(closed_by_server(&mut bad), "{what}: connection not closed");
        assert!(
            wait_for(|| fx.server.stats().closed_malformed > before),
            "{what}: not counted as a protocol violation"
        );
        // The other connection is unaffected.
        b.clear();
        b.read(files[1], 512 * i as u64, 512, i as u64);
        healthy.write_all(b.finish()).unwrap();
        let (h, d) = read_response(&mut healthy).unwrap();
        assert_eq!((h.req_id, h.status), (i as u64, 0), "{what}");
        assert_eq!(pattern::check(files[1], 512 * i as u64, &d), None);
    }
}

#[test]
fn os_backend_malformed_messages_close_only_their_connection() {
    malformed_closes_only_that_connection(&Fixture::os(small_config()));
}

#[test]
fn dds_backend_malformed_messages_close_only_their_connection() {
    malformed_closes_only_that_connection(&Fixture::dds(small_config()));
}

#[test]
fn truncated_streams_get_their_complete_messages_answered_then_closed() {
    let fx = Fixture::os(small_config());
    let f = fx.files()[0];
    let mut b = MessageBuilder::new();
    b.read(f, 0, 64, 11);
    let one = b.finish().to_vec();
    b.clear();
    b.read(f, 64, 64, 12).read(f, 128, 64, 13);
    let two = b.finish().to_vec();
    for cut in [1usize, 4, 9, two.len() - 1] {
        let before = fx.server.stats().closed_malformed;
        let mut s = connect(fx.addr());
        s.write_all(&one).unwrap();
        s.write_all(&two[..cut]).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let (h, d) = read_response(&mut s).expect("the complete message is answered");
        assert_eq!(h.req_id, 11);
        assert_eq!(pattern::check(f, 0, &d), None);
        assert!(read_response(&mut s).is_none(), "cut {cut}: then closed");
        assert!(
            wait_for(|| fx.server.stats().closed_malformed > before),
            "cut {cut}: logged as a truncated message"
        );
    }
    // A clean end of stream after whole messages is not a violation.
    let before = fx.server.stats().closed_malformed;
    let mut s = connect(fx.addr());
    s.write_all(&two).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_response(&mut s).unwrap().0.req_id, 12);
    assert_eq!(read_response(&mut s).unwrap().0.req_id, 13);
    assert!(read_response(&mut s).is_none());
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(fx.server.stats().closed_malformed, before);
}

fn reader_that_never_reads(fx: &Fixture) {
    let files = fx.files();
    // One connection floods 64 KiB reads and never reads a response.
    let mut hog = TcpStream::connect(fx.addr()).unwrap();
    hog.set_nonblocking(true).unwrap();
    let mut b = MessageBuilder::new();
    for i in 0..1024u64 {
        b.read(files[0], (i * 65536) % (FILE_SIZE - 65536), 65536, i);
    }
    let msg = b.finish().to_vec();
    let mut sent = 0usize;
    let mut at = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut blocked_since: Option<Instant> = None;
    while Instant::now() < deadline {
        match hog.write(&msg[at..]) {
            Ok(n) => {
                sent += n;
                at = (at + n) % msg.len();
                blocked_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Blocked for a while: the server stopped reading this connection.
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(500) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("hog write: {e}"),
        }
    }
    assert!(
        blocked_since.is_some(),
        "the server kept accepting requests ({sent} bytes) from a client that never reads"
    );
    // The requests the server accepted are bounded by its buffers and the sockets' buffers:
    // far less than what the responses would take (64 KiB per 32-byte request).
    assert!(sent < 64 << 20, "sent {sent} bytes before blocking");
    // Others are served meanwhile.
    let rep = client::run(&ClientConfig {
        connect: fx.addr(),
        files: files.clone(),
        file_size: FILE_SIZE,
        io_size: 4096,
        read_ratio: 0.5,
        batch: 4,
        outstanding: 2,
        connections: 2,
        duration: None,
        requests: Some(400),
        verify: false,
        seed: 3,
    })
    .unwrap();
    assert_eq!(
        (rep.requests, rep.errors, rep.order_violations),
        (400, 0, 0),
        "{rep:?}"
    );
    let closed = fx.server.stats().closed;
    drop(hog);
    assert!(wait_for(|| fx.server.stats().closed > closed));
    // And the server still works afterwards.
    let mut s = connect(fx.addr());
    b.clear();
    b.read(files[1], 0, 4096, 99);
    s.write_all(b.finish()).unwrap();
    assert_eq!(read_response(&mut s).unwrap().0.req_id, 99);
}

#[test]
fn os_backend_stays_bounded_with_a_client_that_never_reads() {
    reader_that_never_reads(&Fixture::os(small_config()));
}

#[test]
fn dds_backend_stays_bounded_with_a_client_that_never_reads() {
    reader_that_never_reads(&Fixture::dds(small_config()));
}

#[test]
fn dds_files_are_created_once_and_reopened() {
    let dpu = start_dpu();
    let a = DdsAsyncStorage::open(dpu.socket(), "/ps", 3, 1 << 20, Fill::Pattern, 1).unwrap();
    let ids = a.file_ids().to_vec();
    drop(a);
    let b = DdsAsyncStorage::open(dpu.socket(), "/ps", 3, 1 << 20, Fill::None, 1).unwrap();
    assert_eq!(b.file_ids(), &ids[..]);
    assert_eq!(b.file_size(), 1 << 20);
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_rest_served() {
    let fx = Fixture::os(ServerConfig {
        max_connections: 2,
        ..small_config()
    });
    let f = fx.files()[0];
    let mut a = connect(fx.addr());
    let mut b = connect(fx.addr());
    let mut extra = connect(fx.addr());
    assert!(
        closed_by_server(&mut extra),
        "the third connection is closed"
    );
    let mut m = MessageBuilder::new();
    m.read(f, 0, 64, 1);
    for s in [&mut a, &mut b] {
        s.write_all(m.finish()).unwrap();
        assert_eq!(read_response(s).unwrap().0.req_id, 1);
    }
    // Once one closes, a new connection is accepted.
    drop(a);
    assert!(wait_for(|| fx.server.stats().closed >= 2));
    let mut c = connect(fx.addr());
    c.write_all(m.finish()).unwrap();
    assert_eq!(read_response(&mut c).unwrap().0.req_id, 1);
}

#[test]
fn dds_backend_answers_dpu_dead_once_the_dpu_is_gone() {
    let mut fx = Fixture::dds(small_config());
    let f = fx.files()[0];
    let mut s = connect(fx.addr());
    let mut m = MessageBuilder::new();
    m.read(f, 0, 512, 1);
    s.write_all(m.finish()).unwrap();
    assert_eq!(read_response(&mut s).unwrap().0.status, 0);
    fx.dpu.take().unwrap().shutdown();
    // Every request is still answered, with DpuDead, and the connection stays open.
    for id in 2..5u64 {
        m.clear();
        m.read(f, 512, 512, id).write(f, 0, &[1u8; 64], id + 100);
        s.write_all(m.finish()).unwrap();
        let (h1, _) = read_response(&mut s).unwrap();
        let (h2, _) = read_response(&mut s).unwrap();
        assert_eq!((h1.req_id, h2.req_id), (id, id + 100));
        assert_eq!(h1.status, Status::DpuDead.code(), "read {id}");
        assert_eq!(h2.status, Status::DpuDead.code(), "write {id}");
    }
}

#[test]
fn random_bytes_and_mutated_messages_never_take_the_server_down() {
    use rand::{Rng, SeedableRng};
    let fx = Fixture::os(ServerConfig {
        threads: 1,
        ..small_config()
    });
    let files = fx.files();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(42);
    let mut b = MessageBuilder::new();
    b.read(files[0], 0, 64, 1)
        .write(files[1], 8, &[7u8; 24], 2)
        .read(files[1], 4096, 1024, 3);
    let valid = b.finish().to_vec();
    for i in 0..60u64 {
        let bytes: Vec<u8> = if i % 2 == 0 {
            let n = rng.gen_range(1..300);
            (0..n).map(|_| rng.gen()).collect()
        } else {
            let mut m = valid.clone();
            for _ in 0..rng.gen_range(1..4) {
                let at = rng.gen_range(0..m.len());
                m[at] = rng.gen();
            }
            if rng.gen_bool(0.3) {
                m.truncate(rng.gen_range(0..m.len()));
            }
            m
        };
        let mut s = connect(fx.addr());
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(Shutdown::Write);
        // Whatever comes back must be well-formed responses, then the end of the stream.
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        let mut at = 0;
        while let Ok(Some(len)) = response_len(&all[at..]) {
            if all.len() - at < len {
                break;
            }
            parse_response_header(&all[at..at + len]).expect("well-formed response");
            at += len;
        }
        // The (single) worker still serves a fresh connection.
        let mut h = connect(fx.addr());
        b.clear();
        b.read(files[0], 512, 512, 1000 + i);
        h.write_all(b.finish()).unwrap();
        let (hdr, d) = read_response(&mut h).unwrap();
        assert_eq!((hdr.req_id, hdr.status), (1000 + i, 0), "case {i}");
        assert_eq!(pattern::check(files[0], 512, &d), None);
    }
}

/// More requests in flight than the backend takes (io_uring depth 256, 512 waiting): connections
/// stall on the worker's waiting queue and resume when it drains.
fn deep_queues(fx: &Fixture) {
    let rep = client::run(&ClientConfig {
        connect: fx.addr(),
        files: fx.files(),
        file_size: FILE_SIZE,
        io_size: 4096,
        read_ratio: 0.8,
        batch: 1024,
        outstanding: 2,
        connections: 4,
        duration: None,
        requests: Some(24 * 1024),
        verify: true,
        seed: 11,
    })
    .unwrap();
    assert_eq!(
        (
            rep.requests,
            rep.errors,
            rep.order_violations,
            rep.verify_failures
        ),
        (24 * 1024, 0, 0, 0),
        "{rep:?}"
    );
}

fn deep_config() -> ServerConfig {
    ServerConfig {
        threads: 1,
        conn_max_ops: 4096,
        conn_max_bytes: 64 << 20,
        ..ServerConfig::default()
    }
}

#[test]
fn os_backend_with_more_requests_in_flight_than_the_device_queue() {
    deep_queues(&Fixture::os(deep_config()));
}

#[test]
fn dds_backend_with_more_requests_in_flight_than_the_group_slots() {
    deep_queues(&Fixture::dds(deep_config()));
}

#[test]
fn megabyte_requests_in_multi_megabyte_messages() {
    for fx in [Fixture::os(small_config()), Fixture::dds(small_config())] {
        let rep = client::run(&ClientConfig {
            connect: fx.addr(),
            files: fx.files(),
            file_size: FILE_SIZE,
            io_size: 1 << 20,
            read_ratio: 0.5,
            batch: 4,
            outstanding: 2,
            connections: 2,
            duration: None,
            requests: Some(48),
            verify: true,
            seed: 5,
        })
        .unwrap();
        assert_eq!(
            (
                rep.requests,
                rep.errors,
                rep.order_violations,
                rep.verify_failures
            ),
            (48, 0, 0, 0),
            "{rep:?}"
        );
    }
}

/// Per-connection order: pipelined WRITE p / READ p pairs in one stream (and in one message)
/// always read the bytes just written, while unrelated requests still run concurrently.
fn pipelined_write_then_read(fx: &Fixture) {
    let f = fx.files()[0];
    let mut s = connect(fx.addr());
    let mut b = MessageBuilder::new();
    let mut expect = Vec::new();
    for round in 0..200u64 {
        b.clear();
        let page = round % 4;
        let data: Vec<u8> = (0..512u64).map(|i| (round * 7 + i) as u8).collect();
        b.write(f, page * 4096, &data, round * 10)
            .read(f, page * 4096, 512, round * 10 + 1)
            .read(f, (page + 8) * 4096, 512, round * 10 + 2); // unrelated
        s.write_all(b.finish()).unwrap();
        expect.push((round * 10 + 1, data));
    }
    let mut stale = 0;
    for (id, data) in expect {
        let (w, _) = read_response(&mut s).unwrap();
        assert_eq!((w.req_id, w.status), (id - 1, 0));
        let (r, got) = read_response(&mut s).unwrap();
        assert_eq!((r.req_id, r.status), (id, 0));
        stale += usize::from(got != data);
        let (u, _) = read_response(&mut s).unwrap();
        assert_eq!(u.req_id, id + 1);
    }
    assert_eq!(
        stale, 0,
        "reads that missed the write before them on the connection"
    );
}

#[test]
fn os_backend_keeps_per_connection_order_for_conflicting_requests() {
    pipelined_write_then_read(&Fixture::os(small_config()));
}

#[test]
fn dds_backend_keeps_per_connection_order_for_conflicting_requests() {
    pipelined_write_then_read(&Fixture::dds(small_config()));
}

/// The DDS backend survives the DPU's restart: while the DPU is gone requests get `DpuDead`
/// (no hang), then the server reconnects, exposes its files again and serves the bytes
/// acknowledged before the restart.
#[test]
fn dds_backend_reconnects_after_the_dpu_restarts() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let img = dir.path().join("dev.img");
    dds_fs::UringDevice::create_file(&img, 64 << 20).unwrap();
    {
        let mut dev = dds_fs::UringDevice::open(&img, 8).unwrap();
        dds_fs::format(
            &mut dev,
            dds_fs::FormatConfig {
                segment_size: 1 << 20,
                ..dds_fs::FormatConfig::default()
            },
        )
        .unwrap();
    }
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("reconnect"),
        ..DpuConfig::default()
    };
    let start = || {
        let img = img.clone();
        Dpu::start(config.clone(), move || {
            let dev = dds_fs::UringDevice::open(&img, 32)?;
            dds_fs::FileService::open(Box::new(dev), dds_fs::OpenConfig::default())
        })
        .expect("DPU starts")
    };
    let dpu = start();
    let storage: Arc<dyn AsyncStorage> = Arc::new(
        DdsAsyncStorage::open(dpu.socket(), "/pagestore", 1, FILE_SIZE, Fill::None, 2).unwrap(),
    );
    let server = Server::start(small_config(), storage).unwrap();
    let f = server.storage().file_ids()[0];
    let mut s = connect(server.local_addr());
    let mut b = MessageBuilder::new();
    let data = [0x7eu8; 512];
    b.write(f, 4096, &data, 1);
    s.write_all(b.finish()).unwrap();
    assert_eq!(
        read_response(&mut s).unwrap().0.status,
        0,
        "acknowledged write"
    );

    dpu.shutdown();
    // Meanwhile: an error status, not a hang.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        b.clear();
        b.read(f, 4096, 512, 2);
        s.write_all(b.finish()).unwrap();
        let (h, _) = read_response(&mut s).expect("an answer while the DPU is gone");
        if h.status == Status::DpuDead.code() {
            break;
        }
        assert!(Instant::now() < deadline, "no DpuDead answer");
    }
    let _dpu = start();
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        b.clear();
        b.read(f, 4096, 512, 3);
        s.write_all(b.finish()).unwrap();
        let (h, body) = read_response(&mut s).unwrap();
        if h.status == 0 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "not served again after the restart"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        &got[..512],
        &data[..],
        "the acknowledged bytes after the restart"
    );
}

/// Input buffers grow with the bytes that arrive, from the server's input memory budget:
/// connections announcing 16 MiB messages cost only what they sent, and half-sent 15 MiB
/// messages cannot hold more than the budget (connections past it are closed).
#[test]
fn input_buffers_stay_within_the_memory_budget() {
    let budget = 32usize << 20;
    let fx = Fixture::os(ServerConfig {
        input_memory_bytes: budget,
        ..small_config()
    });
    let header = |len: u32| {
        let mut h = [0u8; 8];
        h[..4].copy_from_slice(&len.to_le_bytes());
        h[4..6].copy_from_slice(&1u16.to_le_bytes());
        h
    };
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut s = connect(fx.addr());
        s.write_all(&header(16 << 20)).unwrap();
        conns.push(s);
    }
    assert!(wait_for(|| fx.server.stats().connections >= 200));
    let held = fx.server.stats().input_bytes as usize;
    assert!(held <= 200 * (128 << 10), "200 headers hold {held} bytes");
    drop(conns);
    let chunk = vec![0u8; 1 << 20];
    let mut conns = Vec::new();
    for _ in 0..40 {
        let mut s = connect(fx.addr());
        s.set_write_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let _ = s.write_all(&header(15 << 20));
        for _ in 0..7 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        conns.push(s);
        let st = fx.server.stats();
        assert!(
            st.input_bytes as usize <= budget,
            "input buffers hold {} bytes, budget {budget}",
            st.input_bytes
        );
    }
    assert!(
        wait_for(|| fx.server.stats().closed_memory > 0),
        "no connection was refused memory: {:?}",
        fx.server.stats()
    );
    drop(conns);
    assert!(wait_for(|| fx.server.stats().input_bytes == 0));
}
