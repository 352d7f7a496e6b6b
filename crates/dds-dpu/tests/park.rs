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

/// What a hostile host passes at group creation, and whether the DPU takes it.
fn create_group_with(
    sock: &std::os::unix::net::UnixStream,
    shm: std::os::fd::BorrowedFd<'_>,
    notify: std::os::fd::BorrowedFd<'_>,
    doorbell: std::os::fd::BorrowedFd<'_>,
) -> Result<(), String> {
    use dds_proto::control::{self, Reply, Request};
    use dds_ring::POINTER_AREA_BYTES;
    let cap = 64usize << 10;
    let len = 2 * (POINTER_AREA_BYTES + cap);
    let req = Request::CreateGroup {
        region_len: len as u64,
        req_offset: 0,
        req_capacity: cap as u64,
        resp_offset: (POINTER_AREA_BYTES + cap) as u64,
        resp_capacity: cap as u64,
    };
    control::send_frame(sock, &req, &[shm, notify, doorbell]).unwrap();
    let reply = control::decode::<Reply>(&control::recv_frame(sock, &mut Vec::new()).unwrap());
    match reply.unwrap() {
        Reply::Err(e) => Err(e.message),
        Reply::Ok(_) => Ok(()),
    }
}

/// A hostile host cannot crash or stall the DPU with the descriptors it passes: an unsealed
/// memfd (which it could shrink under the DPU's mapping: SIGBUS), a pipe instead of the
/// notification eventfd or of the doorbell (writes that block) are refused at group creation;
/// a blocking eventfd whose counter the host filled up costs only that host its
/// notifications. Another host is served throughout.
#[test]
fn hostile_descriptors_are_refused_or_harmless() {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use dds_ring::POINTER_AREA_BYTES;
    use dds_shm::SharedRegion;
    use rustix::fs::MemfdFlags;

    let config = DpuConfig {
        socket: dds_dpu::temp_socket_path("hostile-fds"),
        ..DpuConfig::default()
    };
    let dpu = Dpu::start_in_memory(config, 64 << 20).unwrap();
    let sock = UnixStream::connect(dpu.socket()).unwrap();
    let len = 2 * (POINTER_AREA_BYTES + (64 << 10));
    let region = SharedRegion::create("hostile", len).unwrap();
    let efd = || rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let (notify, doorbell) = (efd(), efd());
    let (pipe_r, pipe_w) = rustix::pipe::pipe().unwrap();

    let unsealed =
        rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .unwrap();
    rustix::fs::ftruncate(&unsealed, len as u64).unwrap();
    let e =
        create_group_with(&sock, unsealed.as_fd(), notify.as_fd(), doorbell.as_fd()).unwrap_err();
    assert!(e.contains("sealed"), "{e}");
    // Had it been taken, this would be the SIGBUS: the DPU is still alive and serving below.
    rustix::fs::ftruncate(&unsealed, 0).unwrap();

    let e = create_group_with(&sock, region.fd(), pipe_w.as_fd(), doorbell.as_fd()).unwrap_err();
    assert!(e.contains("notification"), "{e}");
    let e = create_group_with(&sock, region.fd(), notify.as_fd(), pipe_r.as_fd()).unwrap_err();
    assert!(e.contains("doorbell"), "{e}");

    // A blocking eventfd, taken; the host then fills its counter so a write would block.
    create_group_with(&sock, region.fd(), notify.as_fd(), doorbell.as_fd()).unwrap();
    rustix::io::write(&notify, &(u64::MAX - 1).to_ne_bytes()).unwrap();

    let dds = Dds::connect(dpu.socket()).unwrap();
    let f = dds.create_file("/still").unwrap();
    for i in 0..50u64 {
        dds.write_sync(f.id, i * 4096, b"serving").unwrap();
    }
    let mut b = [0u8; 7];
    dds.read_sync(f.id, 0, &mut b).unwrap();
    assert_eq!(&b, b"serving");
    drop(sock);
}
