//! Adaptive polling: an idle DPU with connected host groups parks its service thread (about
//! zero CPU), and a request wakes it through the group's doorbell within microseconds.

use std::time::{Duration, Instant};

use dds_dpu::{Dpu, DpuConfig};
use dds_host::{Dds, GroupConfig};

/// CPU seconds of this process's thread named `name`.
fn thread_cpu_seconds(name: &str) -> f64 {
    let hz = 100.0; // USER_HZ on Linux
    let mut total = 0.0;
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
        let rest = stat.rsplit_once(')').unwrap().1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (u, s): (f64, f64) = (f[11].parse().unwrap(), f[12].parse().unwrap());
        total += (u + s) / hz;
    }
    total
}

#[test]
fn idle_dpu_parks_and_a_request_wakes_it() {
    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("park"),
        ..DpuConfig::default()
    };
    let dpu = Dpu::start_in_memory(config, 64 << 20).unwrap();
    let dds = Dds::connect(dpu.socket()).unwrap();
    // Four connected host groups (the default one and three more), all idle.
    let groups: Vec<_> = (0..3)
        .map(|_| dds.create_group(&GroupConfig::default()).unwrap())
        .collect();
    let f = dds.create_file("/p").unwrap();
    dds.write_sync(f.id, 0, &[3u8; 4096]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let c0 = thread_cpu_seconds("dds-service");
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let cores = (thread_cpu_seconds("dds-service") - c0) / t0.elapsed().as_secs_f64();
    eprintln!("idle service thread: {cores:.4} cores");
    assert!(cores <= 0.02, "idle DPU uses {cores:.3} cores");

    // Wake-up: a read after an idle pause completes promptly (the doorbell, not the park
    // timeout).
    let mut lat = Vec::new();
    let mut buf = vec![0u8; 4096];
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(60));
        let t = Instant::now();
        dds.read_sync(f.id, 0, &mut buf).unwrap();
        lat.push(t.elapsed());
        assert_eq!(buf, vec![3u8; 4096]);
    }
    lat.sort();
    eprintln!(
        "read after an idle pause: median {:?}, max {:?}",
        lat[5], lat[9]
    );
    assert!(
        lat[5] < Duration::from_millis(20),
        "median wake-up {:?}: the doorbell did not wake the DPU",
        lat[5]
    );
    drop(groups);
}

/// A host must pass an eventfd as its doorbell: anything else (here a pipe) is refused at group
/// creation, and the DPU goes on serving.
#[test]
fn a_doorbell_that_is_not_an_eventfd_is_refused() {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use dds_dma::SharedRegion;
    use dds_proto::control::{self, Reply, Request};
    use dds_ring::POINTER_AREA_BYTES;

    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("doorbell"),
        ..DpuConfig::default()
    };
    let dpu = Dpu::start_in_memory(config, 64 << 20).unwrap();
    let sock = UnixStream::connect(dpu.socket()).unwrap();
    let cap = 64usize << 10;
    let len = 2 * (POINTER_AREA_BYTES + cap);
    let region = SharedRegion::create("doorbell", len).unwrap();
    let eventfd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let (pipe_r, _pipe_w) = rustix::pipe::pipe().unwrap();
    let req = Request::CreateGroup {
        region_len: len as u64,
        req_offset: 0,
        req_capacity: cap as u64,
        resp_offset: (POINTER_AREA_BYTES + cap) as u64,
        resp_capacity: cap as u64,
    };
    control::send_frame(&sock, &req, &[region.fd(), eventfd.as_fd(), pipe_r.as_fd()]).unwrap();
    let reply = control::decode::<Reply>(&control::recv_frame(&sock, &mut Vec::new()).unwrap());
    match reply.unwrap() {
        Reply::Err(e) => assert!(e.message.contains("doorbell"), "{}", e.message),
        Reply::Ok(v) => panic!("a pipe accepted as a doorbell: {v}"),
    }
    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/still").unwrap();
    dds.write_sync(f.id, 0, b"serving").unwrap();
}
