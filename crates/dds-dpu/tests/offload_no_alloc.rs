//! The director's data path allocates nothing per request: a counting allocator records the
//! allocations made on director threads while warmed-up connections carry mixed traffic.

#[path = "offload/common.rs"]
mod common;

use std::io::Write;
use std::sync::Arc;

use common::*;
use dds_apps::offload::pagestore::MessageBuilder;
use dds_apps::offload::PagestoreApp;
use dds_offload_api::OffloadApp;
use dds_testkit::alloc::{
    allocations, allocations_in, count_this_thread, measure_alone, CountingAlloc,
};

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

fn traffic(c: &mut std::net::TcpStream, file: u32, rounds: u64) {
    let mut b = MessageBuilder::new();
    for r in 0..rounds {
        b.clear();
        b.read(file, (r % 8) * 4096, 4096, r)
            .write(file, 40960 + (r % 4) * 4096, &[r as u8; 4096], r)
            .read(file, (r % 7) * 4096 + 100, 1000, r)
            .read(file, 40960 + (r % 4) * 4096, 4096, r);
        c.write_all(b.finish()).unwrap();
        for _ in 0..4 {
            read_response(c).unwrap();
        }
    }
}

#[test]
fn director_data_path_does_not_allocate() {
    let _alone = measure_alone();
    for copy_mode in [false, true] {
        let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
        let dpu = Dpu::start(app.clone(), 1);
        let files = dpu.files();
        let file = files.create("/pages");
        files.write(file, 0, pattern(1, 16 * 4096)).unwrap();
        let host = pagestore_server(loopback(), files);
        let d = director(&dpu, app, host.addr, |c| {
            c.copy_mode = copy_mode;
            c.on_thread_start = Some(Arc::new(|_| count_this_thread(true)));
        });
        let mut c = connect(d.local_addr());
        traffic(&mut c, file, 50);
        assert!(allocations() > 0, "the counter sees the connection set-up");
        let s0 = d.stats();
        let allocs = allocations_in(|| traffic(&mut c, file, 500));
        let s1 = d.stats();
        assert!(s1.offloaded - s0.offloaded > 500, "{s1:?}");
        assert_eq!(
            allocs, 0,
            "director allocations for 2000 requests (copy mode {copy_mode})"
        );
    }
}

/// The same with the director on the file-service thread (`OffloadConfig::director_inline`,
/// what `dds dpu` runs by default): that thread's allocations are counted, its own rounds
/// (host writes through the rings, the cache writer, the port, the device) and the director's
/// together.
#[test]
fn inline_director_data_path_does_not_allocate() {
    let _alone = measure_alone();
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
    let (dpu, host_app) = Dpu::start_inline(app);
    let files = dpu.files();
    let file = files.create("/pages");
    files.write(file, 0, pattern(1, 16 * 4096)).unwrap();
    let host = pagestore_server(loopback(), files);
    assert!(host_app.announce(host.addr));
    let d = dpu.handle.director().expect("the director runs");
    dds_testkit::alloc::count_thread_id(dds_testkit::alloc::thread_named("dds-service"));
    let mut c = None;
    let setup = allocations_in(|| {
        let mut s = connect(d.local_addr());
        traffic(&mut s, file, 50);
        c = Some(s);
    });
    assert!(setup > 0, "the counter sees the connection set-up");
    let mut c = c.unwrap();
    let s0 = d.stats();
    let allocs = allocations_in(|| traffic(&mut c, file, 500));
    dds_testkit::alloc::count_thread_id(0);
    let s1 = d.stats();
    assert!(s1.offloaded - s0.offloaded > 500, "{s1:?}");
    assert_eq!(
        allocs, 0,
        "allocations of the service thread with the director inline, for 2000 requests"
    );
}

/// The NBD app's sessions (handshake relayed, replies framed by handle, writes in flight
/// marked) allocate nothing per request either: `dds nbd` on the DPU's files behind the
/// director, one client writing and reading through it.
#[test]
fn nbd_sessions_do_not_allocate_per_request() {
    use dds_nbd::proto::{self, Request};
    use std::io::Read;
    use std::sync::atomic::AtomicBool;
    let _alone = measure_alone();

    let app: Arc<dyn OffloadApp> = Arc::new(dds_nbd::NbdApp::new());
    let dpu = Dpu::start(app.clone(), 1);
    let storage = dds_storage::DdsStorage::new(dpu.dds(), "/nbd").unwrap();
    let server = dds_nbd::NbdServer::open(
        dds_nbd::NbdConfig {
            listen: loopback(),
            exports: vec![dds_nbd::ExportSpec {
                name: "disk".into(),
                size: 4 << 20,
                read_only: false,
            }],
            max_connections: 16,
        },
        &storage,
        Some(dpu.dds()),
    )
    .unwrap();
    let host = server.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let runner = {
        let stop = stop.clone();
        std::thread::spawn(move || server.run(&stop))
    };
    let d = director(&dpu, app, host, |c| {
        c.on_thread_start = Some(Arc::new(|_| count_this_thread(true)));
    });
    let mut c = connect(d.local_addr());
    // The handshake: greeting, flags, NBD_OPT_GO on `disk` answered up to its ACK.
    let mut g = [0u8; proto::GREETING];
    c.read_exact(&mut g).unwrap();
    let mut opt = Vec::new();
    opt.extend_from_slice(&3u32.to_be_bytes());
    opt.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    opt.extend_from_slice(&proto::OPT_GO.to_be_bytes());
    opt.extend_from_slice(&10u32.to_be_bytes());
    opt.extend_from_slice(&4u32.to_be_bytes());
    opt.extend_from_slice(b"disk");
    opt.extend_from_slice(&0u16.to_be_bytes());
    c.write_all(&opt).unwrap();
    loop {
        let mut h = [0u8; proto::OPT_REPLY_HEADER];
        c.read_exact(&mut h).unwrap();
        let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        c.read_exact(&mut data).unwrap();
        if u32::from_be_bytes(h[12..16].try_into().unwrap()) == proto::REP_ACK {
            break;
        }
    }
    // Rounds of a WRITE and four READs, pipelined; replies read whole.
    let mut msg = Vec::with_capacity(64 << 10);
    let mut reply = vec![0u8; proto::SIMPLE_REPLY + 4096];
    let mut traffic = |c: &mut std::net::TcpStream, rounds: u64| {
        for r in 0..rounds {
            msg.clear();
            let req = |msg: &mut Vec<u8>, command: u16, handle: u64, offset: u64| {
                proto::encode_request(
                    msg,
                    &Request {
                        magic: proto::REQUEST_MAGIC,
                        flags: 0,
                        command,
                        handle,
                        offset,
                        len: 4096,
                    },
                );
            };
            req(&mut msg, proto::CMD_WRITE, 100, (r % 16) * 4096);
            msg.extend_from_slice(&[r as u8; 4096]);
            for k in 0..4 {
                req(&mut msg, proto::CMD_READ, k, (64 + (r + k) % 64) * 4096);
            }
            c.write_all(&msg).unwrap();
            for _ in 0..5 {
                c.read_exact(&mut reply[..proto::SIMPLE_REPLY]).unwrap();
                assert_eq!(&reply[4..8], &[0, 0, 0, 0], "an NBD error");
                if reply[8..16] != 100u64.to_be_bytes() {
                    c.read_exact(&mut reply[proto::SIMPLE_REPLY..]).unwrap();
                }
            }
        }
    };
    traffic(&mut c, 50);
    assert!(allocations() > 0, "the counter sees the connection set-up");
    let s0 = d.stats();
    let allocs = allocations_in(|| traffic(&mut c, 400));
    let s1 = d.stats();
    assert!(s1.offloaded - s0.offloaded >= 1500, "{s1:?}");
    assert_eq!(allocs, 0, "director allocations for 2000 NBD requests");
    drop(c);
    stop.store(true, std::sync::atomic::Ordering::Release);
    runner.join().unwrap();
}
