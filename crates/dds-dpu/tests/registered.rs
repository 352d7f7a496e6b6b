//! Registered application buffers (`docs/records.md`, "Registered-buffer READ and WRITE"):
//! reads land by DMA in the host's buffer and writes are fetched by DMA from it, against a DPU
//! on the real control socket, shared memory, emulated DMA engine, rings and file service.
//! Bad buffer ids, ranges and regions get clear errors; a killed host's buffers are released.

use std::io::{BufRead, BufReader};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dds_dpu::{Dpu, DpuConfig, DpuHandle, ExecMode};
use dds_host::{Dds, Status};
use dds_proto::control::{self, BufferInfo, GroupInfo, Reply, Request};
use dds_proto::record::{
    self, BufferRef, Op, RequestHeader, FLAG_REGISTERED, OP_FLUSH, REQUEST_HEADER_BYTES,
};
use dds_ring::{RequestProducer, ResponseConsumer, POINTER_AREA_BYTES};
use dds_shm::SharedRegion;

fn start(mode: ExecMode, cost: bool, max_registered: u64) -> DpuHandle {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("registered"),
        exec_mode: mode,
        dma_cost: cost.then(dds_dma::CostModel::bluefield2),
        memory_budget_bytes: 256 << 20,
        max_registered_bytes_per_conn: max_registered,
        ..DpuConfig::default()
    };
    Dpu::start_in_memory(config, 256 << 20).expect("DPU starts")
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 131 + i * 7 + i / 251) as u8)
        .collect()
}

/// Data written from a registered buffer reads back through both paths; reads land in the
/// registered buffer; async calls complete through PollWait; a short read at the end of the
/// file says so. In both execution modes, with and without the DMA cost model.
#[test]
fn registered_writes_and_reads_round_trip() {
    for (mode, cost) in [(ExecMode::ZeroCopy, true), (ExecMode::Copy, false)] {
        let dpu = start(mode, cost, 1 << 30);
        let dds = Dds::connect(dpu.socket()).unwrap();
        let f = dds.create_file("/reg").unwrap();
        let mut buf = dds.register_buffer(1 << 20).unwrap();
        assert_eq!(buf.len(), 1 << 20);

        // Registered write → copy-path read.
        let a = pattern(1, 64 << 10);
        buf.as_mut_slice()[4096..4096 + a.len()].copy_from_slice(&a);
        let n = dds
            .write_registered_sync(f.id, 0, &buf, 4096, a.len() as u32)
            .unwrap();
        assert_eq!(n, a.len());
        let mut back = vec![0u8; a.len()];
        assert_eq!(dds.read_sync(f.id, 0, &mut back).unwrap(), a.len());
        assert!(
            back == a,
            "registered write read back through the copy path"
        );

        // Copy-path write → registered read into another range of the buffer.
        let b = pattern(2, 12_345);
        dds.write_sync(f.id, 70_000, &b).unwrap();
        let n = dds
            .read_registered_sync(f.id, 70_000, &mut buf, 300_001, b.len() as u32)
            .unwrap();
        assert_eq!(n, b.len());
        assert!(buf.as_slice()[300_001..300_001 + b.len()] == b[..]);
        // Registered write → registered read.
        let n = dds
            .read_registered_sync(f.id, 0, &mut buf, 600_000, a.len() as u32)
            .unwrap();
        assert_eq!(n, a.len());
        assert!(buf.as_slice()[600_000..600_000 + a.len()] == a[..]);

        // Short read at the end of the file: the bytes past it are left alone.
        let size = dds.file_size(f.id).unwrap();
        buf.as_mut_slice()[0..8192].fill(0xEE);
        let n = dds
            .read_registered_sync(f.id, size - 100, &mut buf, 0, 8192)
            .unwrap();
        assert_eq!(n, 100);
        assert!(buf.as_slice()[..100] == b[b.len() - 100..]);
        assert!(buf.as_slice()[100..8192].iter().all(|&x| x == 0xEE));

        // Async: many writes from distinct ranges, then many reads into distinct ranges.
        let group = dds.default_group().clone();
        let chunk = 16 << 10;
        for i in 0..32u64 {
            let p = pattern(100 + i, chunk);
            buf.as_mut_slice()[i as usize * chunk..(i as usize + 1) * chunk].copy_from_slice(&p);
        }
        for i in 0..32u64 {
            dds.write_registered(
                f.id,
                (1 << 20) + i * chunk as u64,
                &buf,
                i as usize * chunk,
                chunk as u32,
                i,
            )
            .unwrap();
        }
        let mut seen = 0u64;
        for _ in 0..32 {
            let c = group.poll_wait(Duration::from_secs(10)).unwrap().unwrap();
            assert_eq!((c.status, c.bytes), (Status::Ok, chunk as u32), "{c:?}");
            seen |= 1 << c.io_ctx;
        }
        assert_eq!(seen, u32::MAX as u64);
        buf.as_mut_slice()[..32 * chunk].fill(0);
        for i in 0..32u64 {
            // SAFETY: the ranges are disjoint and untouched until their completions.
            unsafe {
                dds.read_registered(
                    f.id,
                    (1 << 20) + i * chunk as u64,
                    &buf,
                    i as usize * chunk,
                    chunk as u32,
                    100 + i,
                )
                .unwrap()
            };
        }
        for _ in 0..32 {
            let c = group.poll_wait(Duration::from_secs(10)).unwrap().unwrap();
            assert_eq!((c.status, c.bytes), (Status::Ok, chunk as u32), "{c:?}");
        }
        for i in 0..32u64 {
            let got = &buf.as_slice()[i as usize * chunk..(i as usize + 1) * chunk];
            assert!(got == pattern(100 + i, chunk), "chunk {i}");
        }
        // The DPU counted the registration.
        let st = dds.stats().unwrap();
        assert_eq!((st.registered_buffers, st.registered_bytes), (1, 1 << 20));
        drop(buf);
        let st = dds.stats().unwrap();
        assert_eq!((st.registered_buffers, st.registered_bytes), (0, 0));
        dpu.shutdown();
    }
}

const CAP: usize = 64 << 10;

struct RawHost {
    sock: UnixStream,
    _region: SharedRegion,
    _eventfd: std::os::fd::OwnedFd,
    _doorbell: std::os::fd::OwnedFd,
    producer: RequestProducer,
    consumer: ResponseConsumer,
}

fn try_rpc<T: serde::de::DeserializeOwned>(
    sock: &UnixStream,
    req: &Request,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<T, (u16, String)> {
    control::send_frame(sock, req, fds).unwrap();
    match control::decode::<Reply>(&control::recv_frame(sock, &mut Vec::new()).unwrap()).unwrap() {
        Reply::Ok(v) => Ok(serde_json::from_value(v).unwrap()),
        Reply::Err(e) => Err((e.code, e.message)),
    }
}

/// A host that speaks the protocol itself: one group, records written straight into its ring.
fn raw_host(socket: &std::path::Path) -> RawHost {
    let sock = UnixStream::connect(socket).unwrap();
    let resp_offset = POINTER_AREA_BYTES + CAP;
    let len = resp_offset + POINTER_AREA_BYTES + CAP;
    let region = SharedRegion::create("raw", len).unwrap();
    let eventfd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let doorbell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    // SAFETY: both rings lie inside `region`, kept alive by RawHost.
    let (producer, consumer) = unsafe {
        (
            RequestProducer::new(region.as_ptr(), CAP as u64, CAP as u64),
            ResponseConsumer::new(region.as_ptr().add(resp_offset), CAP as u64),
        )
    };
    producer.init();
    consumer.init();
    let _: GroupInfo = try_rpc(
        &sock,
        &Request::CreateGroup {
            region_len: len as u64,
            req_offset: 0,
            req_capacity: CAP as u64,
            resp_offset: resp_offset as u64,
            resp_capacity: CAP as u64,
        },
        &[region.fd(), eventfd.as_fd(), doorbell.as_fd()],
    )
    .unwrap();
    RawHost {
        sock,
        _region: region,
        _eventfd: eventfd,
        _doorbell: doorbell,
        producer,
        consumer,
    }
}

impl RawHost {
    /// Pushes a registered READ or WRITE and returns the response's (status, bytes).
    fn registered(&self, op: Op, id: u32, file: u32, buf: BufferRef, bytes: u32) -> (Status, u32) {
        let h = RequestHeader {
            op,
            request_id: id,
            file_id: file,
            offset: 0,
            bytes,
            buffer: Some(buf),
        };
        let tail = record::encode_request_tail(&h);
        self.producer
            .try_push(op.code(), &tail, &[&buf.encode()], 8)
            .unwrap();
        self.response(id)
    }

    fn response(&self, id: u32) -> (Status, u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(Some(r)) = self.consumer.try_pop(record::decode_response) {
                assert_eq!(r.request_id, id);
                return (Status::from_code(r.status), r.bytes);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("no response to request {id}");
    }
}

/// Unknown buffer ids, ranges outside the buffer (and overflowing ones), oversized requests
/// and a REGISTERED flag on a FLUSH get distinct errors from the DPU; the group goes on.
/// Buffers are per connection; the library checks ranges and connections before sending.
#[test]
fn bad_buffer_ids_and_ranges_get_clear_errors() {
    let dpu = start(ExecMode::ZeroCopy, false, 1 << 30);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/e").unwrap();
    dds.write_sync(f.id, 0, &pattern(9, 8192)).unwrap();
    let host = raw_host(dpu.socket());
    let region = SharedRegion::create("raw-buf", 64 << 10).unwrap();
    let info: BufferInfo = try_rpc(
        &host.sock,
        &Request::RegisterBuffer { len: 64 << 10 },
        &[region.fd()],
    )
    .unwrap();
    let at = |offset| BufferRef {
        id: info.buffer,
        offset,
    };

    let r = host.registered(Op::Read, 1, f.id, at(0), 8192);
    assert_eq!(r, (Status::Ok, 8192));
    // SAFETY: the DPU wrote it before the response; nothing writes it now.
    let got = unsafe { std::slice::from_raw_parts(region.as_ptr(), 8192) };
    assert!(got == pattern(9, 8192), "read landed in the raw buffer");

    let unknown = BufferRef {
        id: info.buffer + 1000,
        offset: 0,
    };
    assert_eq!(
        host.registered(Op::Read, 2, f.id, unknown, 512),
        (Status::UnknownBuffer, 0)
    );
    assert_eq!(
        host.registered(Op::Write, 3, f.id, unknown, 512),
        (Status::UnknownBuffer, 0)
    );
    assert_eq!(
        host.registered(Op::Read, 4, f.id, at((64 << 10) - 100), 512),
        (Status::BufferRange, 0)
    );
    assert_eq!(
        host.registered(Op::Write, 5, f.id, at(64 << 10), 1),
        (Status::BufferRange, 0)
    );
    assert_eq!(
        host.registered(Op::Write, 6, f.id, at(u64::MAX - 10), 512),
        (Status::BufferRange, 0)
    );
    assert_eq!(
        host.registered(Op::Read, 7, f.id, at(0), 64 << 20),
        (Status::TooLarge, 0)
    );
    // A REGISTERED FLUSH is malformed.
    let mut res = host
        .producer
        .reserve(OP_FLUSH, REQUEST_HEADER_BYTES as u32, 16, 8)
        .unwrap();
    let h = res.header_mut();
    h[0..2].copy_from_slice(&FLAG_REGISTERED.to_le_bytes());
    h[2..6].copy_from_slice(&8u32.to_le_bytes());
    res.commit();
    assert_eq!(host.response(8).0, Status::BadRequest);
    // The file is untouched by the refused writes and the group still serves.
    let r = host.registered(Op::Read, 9, f.id, at(4096), 8192);
    assert_eq!(r, (Status::Ok, 8192));
    // Another connection cannot use (or unregister) this connection's buffer.
    let other = raw_host(dpu.socket());
    assert_eq!(
        other.registered(Op::Read, 1, f.id, at(0), 512),
        (Status::UnknownBuffer, 0)
    );
    let e = try_rpc::<Option<()>>(
        &other.sock,
        &Request::UnregisterBuffer {
            buffer: info.buffer,
        },
        &[],
    )
    .unwrap_err();
    assert_eq!(e.0, Status::UnknownBuffer.code(), "{e:?}");
    // Unregistered: later requests naming it fail cleanly.
    let _: Option<()> = try_rpc(
        &host.sock,
        &Request::UnregisterBuffer {
            buffer: info.buffer,
        },
        &[],
    )
    .unwrap();
    assert_eq!(
        host.registered(Op::Write, 10, f.id, at(0), 512),
        (Status::UnknownBuffer, 0)
    );
    let e = try_rpc::<Option<()>>(
        &host.sock,
        &Request::UnregisterBuffer {
            buffer: info.buffer,
        },
        &[],
    )
    .unwrap_err();
    assert_eq!(e.0, Status::UnknownBuffer.code());
    let mut back = vec![0u8; 8192];
    dds.read_sync(f.id, 0, &mut back).unwrap();
    assert!(back == pattern(9, 8192));

    // The library's own checks.
    let mut buf = dds.register_buffer(4096).unwrap();
    let e = dds
        .read_registered_sync(f.id, 0, &mut buf, 4000, 512)
        .unwrap_err();
    assert_eq!(e.status, Status::BufferRange);
    let dds2 = Dds::connect(dpu.socket()).unwrap();
    let e = dds2
        .write_registered_sync(f.id, 0, &buf, 0, 512)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert_eq!(
        dds.register_buffer(0).unwrap_err().status,
        Status::InvalidArgument
    );
    dpu.shutdown();
}

/// A buffer region that is not a sealed memfd (an unsealed memfd, a pipe, one smaller than
/// announced, no descriptor at all) is refused and the DPU goes on; the per-connection cap on
/// registered bytes gives `BufferLimit` past it and frees up as buffers are dropped.
#[test]
fn unsealed_regions_and_registrations_past_the_cap_are_refused() {
    use rustix::fs::MemfdFlags;
    let dpu = start(ExecMode::ZeroCopy, false, 1 << 20);
    let sock = UnixStream::connect(dpu.socket()).unwrap();
    let len = 64u64 << 10;
    let register = |fds: &[std::os::fd::BorrowedFd<'_>], len: u64| {
        try_rpc::<BufferInfo>(&sock, &Request::RegisterBuffer { len }, fds)
    };
    let unsealed =
        rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .unwrap();
    rustix::fs::ftruncate(&unsealed, len).unwrap();
    let e = register(&[unsealed.as_fd()], len).unwrap_err();
    assert_eq!(e.0, Status::InvalidArgument.code());
    assert!(e.1.contains("sealed"), "{e:?}");
    // Had it been mapped, this would be the SIGBUS of the next DMA.
    rustix::fs::ftruncate(&unsealed, 0).unwrap();

    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let e = register(&[pipe_r.as_fd()], len).unwrap_err();
    assert!(e.1.contains("sealed memfd"), "{e:?}");
    let small = SharedRegion::create("small", 4096).unwrap();
    let e = register(&[small.fd()], len).unwrap_err();
    assert!(e.1.contains("bytes"), "{e:?}");
    let e = register(&[], len).unwrap_err();
    assert!(e.1.contains("1 descriptor"), "{e:?}");
    let ok = SharedRegion::create("ok", len as usize).unwrap();
    let e = register(&[ok.fd()], 0).unwrap_err();
    assert_eq!(e.0, Status::InvalidArgument.code());

    // The cap: 1 MiB per connection.
    let dds = Dds::connect(dpu.socket()).unwrap();
    let a = dds.register_buffer(768 << 10).unwrap();
    let e = dds.register_buffer(512 << 10).unwrap_err();
    assert_eq!(e.status, Status::BufferLimit, "{e}");
    assert!(e.message.contains("max-registered-bytes"), "{e}");
    // Another connection has its own cap.
    let dds2 = Dds::connect(dpu.socket()).unwrap();
    let b = dds2.register_buffer(1 << 20).unwrap();
    drop(a);
    let c = dds.register_buffer(512 << 10).unwrap();
    // Everything still works.
    let f = dds.create_file("/cap").unwrap();
    let n = dds.write_registered_sync(f.id, 0, &c, 0, 4096).unwrap();
    assert_eq!(n, 4096);
    let n = dds2.write_registered_sync(f.id, 4096, &b, 0, 4096).unwrap();
    assert_eq!(n, 4096);
    dpu.shutdown();
}

const CHILD_ENV: &str = "DDS_REGISTERED_CHILD_SOCKET";

/// The host process of `killed_host_releases_its_buffers` (runs only when started by it):
/// registers buffers, does registered I/O, says `ready`, and waits to be killed.
#[test]
fn child_host() {
    let Ok(socket) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dds = Dds::connect(&socket).unwrap();
    let f = dds.create_file("/child").unwrap();
    let mut bufs: Vec<_> = (0..4)
        .map(|_| dds.register_buffer(1 << 20).unwrap())
        .collect();
    bufs[0].as_mut_slice()[..4096].fill(7);
    dds.write_registered_sync(f.id, 0, &bufs[0], 0, 4096)
        .unwrap();
    dds.read_registered_sync(f.id, 0, &mut bufs[1], 0, 4096)
        .unwrap();
    assert!(bufs[1].as_slice()[..4096].iter().all(|&b| b == 7));
    // Reads left in flight when the process dies.
    for i in 0..8 {
        // SAFETY: the buffer is never touched again.
        unsafe {
            dds.read_registered(f.id, 0, &bufs[2], i * 4096, 4096, i as u64)
                .unwrap()
        };
    }
    println!("child-ready");
    std::thread::sleep(Duration::from_secs(120));
}

/// `kill -9` of a host process releases the buffers it registered (and its groups); the DPU
/// keeps serving another host's registered I/O.
#[test]
fn killed_host_releases_its_buffers() {
    let dpu = start(ExecMode::ZeroCopy, true, 1 << 30);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_host", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, dpu.socket())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut child = Reap(child);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        // libtest may have printed "test child_host ... " on the same line.
        if line.contains("child-ready") {
            break;
        }
    }
    let dds = Dds::connect(dpu.socket()).unwrap();
    let st = dds.stats().unwrap();
    assert_eq!((st.registered_buffers, st.registered_bytes), (4, 4 << 20));
    let groups_before = st.groups.len();
    assert!(groups_before >= 2);
    let mine = dds.register_buffer(64 << 10).unwrap();

    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = dds.stats().unwrap();
        if st.registered_buffers == 1 && st.groups.len() == 1 {
            break st;
        }
        assert!(Instant::now() < deadline, "not released: {st:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st.registered_bytes, 64 << 10);

    let f = dds.lookup("/child").unwrap();
    let mut buf = mine;
    let n = dds
        .read_registered_sync(f.id, 0, &mut buf, 0, 4096)
        .unwrap();
    assert_eq!(n, 4096);
    assert!(buf.as_slice()[..4096].iter().all(|&b| b == 7));
    buf.as_mut_slice()[..512].fill(9);
    dds.write_registered_sync(f.id, 8192, &buf, 0, 512).unwrap();
    let mut back = [0u8; 512];
    dds.read_sync(f.id, 8192, &mut back).unwrap();
    assert_eq!(back, [9u8; 512]);
    dpu.shutdown();
}
