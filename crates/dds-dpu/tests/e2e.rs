//! The host library against a DPU running in this process on an in-memory device: the real
//! control socket, shared memory, emulated DMA engine, rings and file service.

use std::time::Duration;

use dds_dpu::{Dpu, DpuConfig, DpuHandle, ExecMode};
use dds_host::{Dds, GroupConfig, Status};

fn start(mode: ExecMode, cost: bool) -> DpuHandle {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("e2e"),
        exec_mode: mode,
        dma_cost: cost.then(dds_dma::CostModel::bluefield2),
        memory_budget_bytes: 256 << 20,
        ..DpuConfig::default()
    };
    Dpu::start_in_memory(config, 256 << 20).expect("DPU starts")
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize * 31 + i * 7) as u8)
        .collect()
}

#[test]
fn sync_reads_and_writes_round_trip_in_both_modes() {
    for mode in [ExecMode::ZeroCopy, ExecMode::Copy] {
        let dpu = start(mode, true);
        let dds = Dds::connect(dpu.socket()).unwrap();
        dds.create_dir("/db").unwrap();
        let f = dds.create_file("/db/pages").unwrap();
        // Aligned, unaligned, segment-spanning and zero-length writes.
        for (off, len) in [
            (0u64, 4096usize),
            (1000, 1),
            (4095, 3000),
            ((1 << 20) - 100, 5000),
            (77, 0),
        ] {
            let data = pattern(off, len);
            assert_eq!(
                dds.write_sync(f.id, off, &data).unwrap(),
                len,
                "{mode:?} write {off}+{len}"
            );
            let mut back = vec![0u8; len];
            assert_eq!(dds.read_sync(f.id, off, &mut back).unwrap(), len);
            assert_eq!(back, data, "{mode:?} read back {off}+{len}");
        }
        let size = dds.file_size(f.id).unwrap();
        assert_eq!(size, (1 << 20) - 100 + 5000);
        // A read at end of file returns 0 bytes; one crossing it is short.
        let mut buf = vec![0u8; 100];
        assert_eq!(dds.read_sync(f.id, size, &mut buf).unwrap(), 0);
        assert_eq!(dds.read_sync(f.id, size - 10, &mut buf).unwrap(), 10);
        dds.flush_sync(f.id).unwrap();
        dpu.shutdown();
    }
}

#[test]
fn errors_are_distinct_and_harmless() {
    let dpu = start(ExecMode::ZeroCopy, false);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/f").unwrap();
    dds.write_sync(f.id, 0, b"hello").unwrap();
    let mut buf = [0u8; 8];
    let e = dds.read_sync(0xdead_beef, 0, &mut buf).unwrap_err();
    assert_eq!(e.status, Status::UnknownFile);
    let e = dds.read_sync(f.id, 1 << 20, &mut buf).unwrap_err();
    assert_eq!(e.status, Status::OutOfRange);
    let big = vec![0u8; (dds.hello().max_io_bytes + 1) as usize];
    assert_eq!(
        dds.write_sync(f.id, 0, &big).unwrap_err().status,
        Status::TooLarge
    );
    assert_eq!(dds.create_file("/f").unwrap_err().status, Status::Exists);
    assert_eq!(dds.lookup("/nope").unwrap_err().status, Status::NotFound);
    assert_eq!(
        dds.create_file("/nodir/x").unwrap_err().status,
        Status::UnknownDir
    );
    assert_eq!(dds.stat(12345).unwrap_err().status, Status::UnknownFile);
    // The connection still works and nothing acknowledged was lost.
    assert_eq!(dds.read_sync(f.id, 0, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    dpu.shutdown();
}

#[test]
fn too_many_outstanding_and_poll_wait() {
    let dpu = start(ExecMode::ZeroCopy, true);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/q").unwrap();
    let g = dds
        .create_group(&GroupConfig {
            max_outstanding: 8,
            ..GroupConfig::default()
        })
        .unwrap();
    dds.poll_add(f.id, &g, 77).unwrap();
    for i in 0..8u64 {
        dds.write(f.id, i * 512, &[i as u8; 512], i).unwrap();
    }
    let e = dds.write(f.id, 0, &[0u8; 512], 99).unwrap_err();
    assert_eq!(e.status, Status::TooManyOutstanding);
    let mut seen = Vec::new();
    while seen.len() < 8 {
        let c = g
            .poll_wait(Duration::from_secs(5))
            .unwrap()
            .expect("completion in time");
        assert_eq!(c.status, Status::Ok);
        assert_eq!(c.file_ctx, 77);
        assert_eq!(c.bytes, 512);
        seen.push(c.io_ctx);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
    // Non-blocking mode with nothing pending returns at once.
    assert_eq!(g.poll_wait(Duration::ZERO).unwrap(), None);
    // Reads through the group land in the callers' buffers (scatter too).
    let mut a = vec![0u8; 300];
    let mut b = vec![0u8; 212];
    let iov = [
        dds_host::IoVec {
            ptr: a.as_mut_ptr(),
            len: 300,
        },
        dds_host::IoVec {
            ptr: b.as_mut_ptr(),
            len: 212,
        },
    ];
    unsafe { dds.read_scatter(f.id, 3 * 512, &iov, 5).unwrap() };
    let c = g.poll_wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!((c.io_ctx, c.bytes, c.status), (5, 512, Status::Ok));
    assert!(a.iter().chain(b.iter()).all(|&x| x == 3));
    dpu.shutdown();
}

#[test]
fn many_threads_share_a_group() {
    let dpu = start(ExecMode::ZeroCopy, true);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/mt").unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let dds = &dds;
            s.spawn(move || {
                for i in 0..200u64 {
                    let off = (t * 200 + i) * 1024;
                    let data = pattern(off, 1024);
                    dds.write_sync(f.id, off, &data).unwrap();
                    let mut back = vec![0u8; 1024];
                    dds.read_sync(f.id, off, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    dpu.shutdown();
}

#[test]
fn disconnect_frees_groups_and_dpu_keeps_serving() {
    let dpu = start(ExecMode::ZeroCopy, false);
    {
        let dds = Dds::connect(dpu.socket()).unwrap();
        let f = dds.create_file("/keep").unwrap();
        dds.write_sync(f.id, 0, b"acknowledged").unwrap();
        for _ in 0..4 {
            dds.create_group(&GroupConfig::default()).unwrap();
        }
        // Leave a write in flight and vanish.
        dds.write(f.id, 100, b"late", 1).unwrap();
    }
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.lookup("/keep").unwrap();
    let mut buf = [0u8; 12];
    dds.read_sync(f.id, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"acknowledged");
    dpu.shutdown();
}

#[test]
fn full_response_ring_applies_backpressure_without_loss() {
    let dpu = start(ExecMode::ZeroCopy, true);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/bp").unwrap();
    let g = dds
        .create_group(&GroupConfig {
            request_ring_bytes: 64 << 10,
            response_ring_bytes: 64 << 10,
            max_outstanding: 256,
            max_inflight_bytes: 0,
        })
        .unwrap();
    dds.poll_add(f.id, &g, 1).unwrap();
    let data: Vec<u8> = pattern(5, 4096 * 64);
    for (i, chunk) in data.chunks(16384).enumerate() {
        dds.write_sync(f.id, i as u64 * 16384, chunk).unwrap();
    }
    // A read that can never fit the response ring is refused up front.
    let mut huge = vec![0u8; 40 << 10];
    let e = unsafe { dds.read(f.id, 0, huge.as_mut_ptr(), 40 << 10, 0) }.unwrap_err();
    assert_eq!(e.status, Status::TooLarge);
    // 64 reads of 4 KiB need 4× the response ring: the DPU must hold back, not drop or exit.
    let mut bufs = vec![vec![0u8; 4096]; 64];
    let mut issued = 0;
    for (i, b) in bufs.iter_mut().enumerate() {
        match unsafe { dds.read(f.id, i as u64 * 4096, b.as_mut_ptr(), 4096, i as u64) } {
            Ok(()) => issued += 1,
            Err(e) => {
                assert_eq!(e.status, Status::RingFull);
                break;
            }
        }
    }
    assert!(issued > 16, "only {issued} reads fit the request ring");
    std::thread::sleep(Duration::from_millis(50)); // let the DPU fill the response ring
    let mut done = 0;
    while done < issued {
        let c = g
            .poll_wait(Duration::from_secs(5))
            .unwrap()
            .expect("completion");
        assert_eq!((c.status, c.bytes), (Status::Ok, 4096));
        done += 1;
    }
    for (i, b) in bufs.iter().take(issued).enumerate() {
        assert_eq!(&b[..], &data[i * 4096..(i + 1) * 4096], "read {i}");
    }
    dpu.shutdown();
}

#[test]
fn full_device_is_no_space_and_keeps_existing_data() {
    let dpu = start(ExecMode::ZeroCopy, false);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/big").unwrap();
    dds.write_sync(f.id, 0, b"first").unwrap();
    let total = dds.free_space().unwrap().total_bytes;
    let e = dds.set_file_size(f.id, total * 2).unwrap_err();
    assert!(
        matches!(e.status, Status::NoSpace | Status::OutOfRange),
        "{e}"
    );
    let free = dds.free_space().unwrap().free_bytes;
    // A write past all free space.
    let e = dds.write_sync(f.id, free + (8 << 20), b"x").unwrap_err();
    assert!(
        matches!(e.status, Status::NoSpace | Status::OutOfRange),
        "{e}"
    );
    let mut b = [0u8; 5];
    dds.read_sync(f.id, 0, &mut b).unwrap();
    assert_eq!(&b, b"first");
    dpu.shutdown();
}

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[test]
fn sleeping_poll_wait_uses_no_cpu_and_wakes_on_completion() {
    let dpu = start(ExecMode::ZeroCopy, true);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/sleep").unwrap();
    let g = dds.default_group().clone();
    // Nothing pending: the caller sleeps for the whole timeout without spinning.
    let (wall, cpu) = (std::time::Instant::now(), thread_cpu());
    assert_eq!(g.poll_wait(Duration::from_millis(300)).unwrap(), None);
    assert!(wall.elapsed() >= Duration::from_millis(300));
    assert!(
        thread_cpu() - cpu < Duration::from_millis(30),
        "sleeping mode burned CPU"
    );
    // A completion wakes a sleeper long before its timeout.
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            let t = std::time::Instant::now();
            let c = g
                .poll_wait(Duration::from_secs(10))
                .unwrap()
                .expect("woken");
            (c, t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(100));
        dds.write(f.id, 0, b"wake", 42).unwrap();
        let (c, waited) = h.join().unwrap();
        assert_eq!((c.io_ctx, c.status), (42, Status::Ok));
        assert!(waited < Duration::from_secs(2), "woken late: {waited:?}");
    });
    dpu.shutdown();
}

#[test]
fn dpu_shutdown_fails_pending_calls_of_a_polling_host() {
    let dpu = start(ExecMode::ZeroCopy, false);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let g = dds.default_group().clone();
    // Huge timeouts are accepted (they mean "wait for a very long time").
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        let h = s.spawn(|| g.poll_wait(Duration::MAX));
        std::thread::sleep(Duration::from_millis(100));
        dpu.shutdown();
        let e = h.join().unwrap().unwrap_err();
        assert_eq!(e.status, Status::DpuDead);
    });
    assert!(t.elapsed() < Duration::from_secs(5));
}

fn start_with_offload() -> (DpuHandle, dds_cache::CacheReader) {
    let app: std::sync::Arc<dyn dds_offload_api::OffloadApp> =
        std::sync::Arc::new(dds_apps::offload::PagestoreApp::default());
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("e2e"),
        ..DpuConfig::default()
    };
    let offload = dds_dpu::OffloadConfig {
        cache_items: 1 << 12,
        ..dds_dpu::OffloadConfig::new(app, None)
    };
    let dpu = Dpu::start_with(
        config,
        || dds_dpu::memory_file_service(64 << 20),
        Some(offload),
    )
    .unwrap();
    let reader = dpu.offload_cache().expect("offload configured").clone();
    (dpu, reader)
}

#[test]
fn host_writes_and_explicit_batches_maintain_the_cache_table() {
    let (dpu, cache) = start_with_offload();
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/pages").unwrap();
    // A file the application has not exposed is never cached.
    let key = dds_apps::offload::PagestoreApp::page_key(f.id, 2);
    dds.write_sync(f.id, 2 * 4096, &[1u8; 4096]).unwrap();
    assert!(cache.get(key).is_none(), "private file cached");
    assert!(
        dds.expose_file(f.id, true).unwrap(),
        "the DPU runs an offload engine"
    );
    assert_eq!(
        dds.expose_file(12345, true).unwrap_err().status,
        Status::UnknownFile
    );
    // Cache-on-write: a completed host write of page 2 makes it cached (with a version).
    dds.write_sync(f.id, 2 * 4096, &[1u8; 4096]).unwrap();
    let item = cache.get(key).expect("cached at write completion");
    assert!(item.version > 0);
    // The statistics show the offload engine's cache.
    let st = dds.stats().unwrap();
    let o = st.offload.expect("offload engine in the statistics");
    assert_eq!(o["app"], "pagestore");
    assert!(o["cache"]["live"].as_u64().unwrap() >= 1, "{o}");
    assert_eq!(o["directors"].as_array().map(Vec::len), Some(0));
    // Explicit batches from the host library, ordered with its writes.
    let items = [
        dds_host::CacheRecordItem {
            key: 1 << 60,
            offset: 512,
            file_id: f.id,
            size: 100,
            tag: 9,
        },
        dds_host::CacheRecordItem {
            key: (1 << 60) + 1,
            offset: 1024,
            file_id: f.id,
            size: 8,
            tag: 0,
        },
    ];
    dds.cache_items(&items).unwrap();
    let got = cache.get(1 << 60).expect("host-supplied item");
    assert_eq!((got.offset, got.size, got.file_id), (512, 100, f.id));
    dds.invalidate_keys(&[1 << 60, key]).unwrap();
    assert!(cache.get(1 << 60).is_none());
    assert!(cache.get(key).is_none());
    assert!(cache.get((1 << 60) + 1).is_some());
    dpu.shutdown();
}

#[test]
fn cache_batches_without_an_offload_engine_are_refused() {
    let dpu = start(ExecMode::ZeroCopy, false);
    let dds = Dds::connect(dpu.socket()).unwrap();
    let e = dds.invalidate_keys(&[1]).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    dpu.shutdown();
}
