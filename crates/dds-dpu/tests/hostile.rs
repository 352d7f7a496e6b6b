//! A host that writes bad records straight into its request ring (not through the library):
//! the DPU answers malformed requests with `BadRequest`, stops only a group whose framing is
//! corrupt, and keeps serving everyone else.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use dds_dpu::{Dpu, DpuConfig};
use dds_fs::{format, FileService, FormatConfig, MemDevice, OpenConfig};
use dds_proto::control::{self, GroupInfo, Reply, Request};
use dds_proto::record::{self, Op, RequestHeader, OP_READ};
use dds_proto::Status;
use dds_ring::{RequestProducer, ResponseConsumer, POINTER_AREA_BYTES};
use dds_shm::SharedRegion;

const CAP: usize = 64 << 10;

struct RawGroup {
    _region: SharedRegion,
    _eventfd: std::os::fd::OwnedFd,
    _doorbell: std::os::fd::OwnedFd,
    producer: RequestProducer,
    consumer: ResponseConsumer,
}

fn rpc<T: serde::de::DeserializeOwned>(
    sock: &UnixStream,
    req: &Request,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> T {
    control::send_frame(sock, req, fds).unwrap();
    match control::decode::<Reply>(&control::recv_frame(sock, &mut Vec::new()).unwrap()).unwrap() {
        Reply::Ok(v) => serde_json::from_value(v).unwrap(),
        Reply::Err(e) => panic!("refused: {e:?}"),
    }
}

fn raw_group(sock: &UnixStream) -> RawGroup {
    let resp_offset = POINTER_AREA_BYTES + CAP;
    let len = resp_offset + POINTER_AREA_BYTES + CAP;
    let region = SharedRegion::create("hostile", len).unwrap();
    let eventfd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    // This host never rings its doorbell: a parked DPU still finds its requests when it
    // wakes for its own reasons (at most `PARK_MAX`, 100 ms, later).
    let doorbell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let _: GroupInfo = rpc(
        sock,
        &Request::CreateGroup {
            region_len: len as u64,
            req_offset: 0,
            req_capacity: CAP as u64,
            resp_offset: resp_offset as u64,
            resp_capacity: CAP as u64,
        },
        &[region.fd(), eventfd.as_fd(), doorbell.as_fd()],
    );
    // SAFETY: both rings lie inside `region`, kept alive by RawGroup.
    let (producer, consumer) = unsafe {
        (
            RequestProducer::new(region.as_ptr(), CAP as u64, CAP as u64),
            ResponseConsumer::new(region.as_ptr().add(resp_offset), CAP as u64),
        )
    };
    RawGroup {
        _region: region,
        _eventfd: eventfd,
        _doorbell: doorbell,
        producer,
        consumer,
    }
}

fn next_response(g: &RawGroup, within: Duration) -> Option<record::ResponseHeader> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(h) = g.consumer.try_pop(record::decode_response) {
            return h;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn malformed_records_get_errors_and_corrupt_groups_stop_alone() {
    let socket = std::env::temp_dir().join(format!("dds-hostile-{}.sock", std::process::id()));
    let dpu = Dpu::start(
        DpuConfig {
            socket: socket.clone(),
            ..DpuConfig::default()
        },
        || {
            let mut dev = MemDevice::new(64 << 20, 512);
            format(
                &mut dev,
                FormatConfig {
                    segment_size: 1 << 20,
                    ..FormatConfig::default()
                },
            )?;
            FileService::open(Box::new(dev), OpenConfig::default())
        },
    )
    .unwrap();
    let sock = UnixStream::connect(&socket).unwrap();
    let g = raw_group(&sock);

    // Unknown opcode.
    let tail = record::encode_request_tail(&RequestHeader {
        op: Op::Read,
        request_id: 11,
        file_id: 1,
        offset: 0,
        bytes: 8,
        buffer: None,
    });
    g.producer.try_push(77, &tail, &[], 8).unwrap();
    let r = next_response(&g, Duration::from_secs(5)).expect("answer to a bad opcode");
    assert_eq!((r.request_id, r.status), (11, Status::BadRequest.code()));

    // Non-zero flags.
    let mut res = g.producer.reserve(OP_READ, 32, 0, 8).unwrap();
    let h = res.header_mut(); // record bytes 6..32
    h[0] = 1; // flags
    h[2..6].copy_from_slice(&12u32.to_le_bytes()); // request id
    h[18..22].copy_from_slice(&8u32.to_le_bytes()); // bytes
    res.commit();
    let r = next_response(&g, Duration::from_secs(5)).expect("answer to bad flags");
    assert_eq!((r.request_id, r.status), (12, Status::BadRequest.code()));

    // A read of an unknown file: a distinct error, and the group goes on.
    let tail = record::encode_request_tail(&RequestHeader {
        op: Op::Read,
        request_id: 13,
        file_id: 999,
        offset: 0,
        bytes: 8,
        buffer: None,
    });
    g.producer.try_push(OP_READ, &tail, &[], 8).unwrap();
    let r = next_response(&g, Duration::from_secs(5)).unwrap();
    assert_eq!((r.request_id, r.status), (13, Status::UnknownFile.code()));

    // Corrupt framing (a record length that runs past what was published): the group stops.
    // The ring writes the framing itself, so this host pokes its own shared memory before
    // publishing the record.
    let res = g.producer.reserve(OP_READ, 32, 0, 8).unwrap();
    let p = res.placement();
    // SAFETY: the reservation is this host's until commit.
    unsafe {
        let at = POINTER_AREA_BYTES + (p.header_at as usize % CAP);
        std::ptr::write_volatile(g._region.as_ptr().add(at) as *mut u32, 4096 + 7);
    }
    res.commit();
    assert!(next_response(&g, Duration::from_millis(300)).is_none());

    // Another host is unaffected.
    let other = dds_host::Dds::connect(&socket).unwrap();
    let f = other.create_file("/ok").unwrap();
    other.write_sync(f.id, 0, b"still serving").unwrap();
    let mut b = [0u8; 13];
    other.read_sync(f.id, 0, &mut b).unwrap();
    assert_eq!(&b, b"still serving");
    drop(other);
    drop(sock);
    dpu.shutdown();
}
