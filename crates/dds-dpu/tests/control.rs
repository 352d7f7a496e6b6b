//! The control socket's guards: what may be replaced at its path, who may connect, how many
//! at once, and how long a frame may take to arrive.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use dds_dpu::{temp_socket_path, Dpu, DpuConfig, DpuHandle};
use dds_host::Dds;

const DEVICE_BYTES: u64 = 64 << 20;

fn start(config: DpuConfig) -> DpuHandle {
    Dpu::start_in_memory(config, DEVICE_BYTES).expect("start DPU")
}

fn config(tag: &str) -> DpuConfig {
    DpuConfig {
        socket: temp_socket_path(tag),
        ..DpuConfig::default()
    }
}

/// Creates a file, writes and reads it back through the host library.
fn file_round_trip(dds: &Dds, path: &str) {
    let f = dds.create_file(path).unwrap();
    dds.write_sync(f.id, 0, b"still served").unwrap();
    let mut back = [0u8; 12];
    dds.read_sync(f.id, 0, &mut back).unwrap();
    assert_eq!(&back, b"still served");
}

/// Waits until the DPU hangs up on `s` (end of stream or reset); false after `within`.
fn hung_up(s: &mut UnixStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

#[test]
fn only_a_stale_socket_is_replaced() {
    let cfg = config("stale");
    std::fs::write(&cfg.socket, b"not a socket").unwrap();
    let e = Dpu::start_in_memory(cfg.clone(), DEVICE_BYTES)
        .err()
        .expect("a regular file in the way");
    assert!(e.to_string().contains("not a socket"), "{e}");
    assert_eq!(std::fs::read(&cfg.socket).unwrap(), b"not a socket");
    std::fs::remove_file(&cfg.socket).unwrap();

    // A socket nobody listens on (a dead DPU's) is replaced.
    drop(UnixListener::bind(&cfg.socket).unwrap());
    let dpu = start(cfg.clone());
    let mode = std::fs::metadata(dpu.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");
    // A live one is not.
    let e = Dpu::start_in_memory(cfg.clone(), DEVICE_BYTES)
        .err()
        .expect("a live DPU");
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    file_round_trip(&Dds::connect(dpu.socket()).unwrap(), "/ok");
}

#[test]
fn a_stalled_partial_frame_is_dropped_without_holding_up_others() {
    let dpu = start(DpuConfig {
        control_frame_timeout: Duration::from_secs(1),
        ..config("stall")
    });
    let mut raw = UnixStream::connect(dpu.socket()).unwrap();
    // A header announcing 100 bytes, and only a few of them.
    raw.write_all(&100u32.to_le_bytes()).unwrap();
    raw.write_all(b"{\"op\":").unwrap();
    let start = Instant::now();
    // Meanwhile another host connects and does file operations.
    let dds = Dds::connect(dpu.socket()).unwrap();
    file_round_trip(&dds, "/while-stalled");
    assert!(start.elapsed() < Duration::from_secs(1), "others waited");
    assert!(
        hung_up(&mut raw, Duration::from_secs(5)),
        "not disconnected"
    );
    assert!(start.elapsed() >= Duration::from_millis(900));
    // An idle connection (no partial frame) is not timed out.
    std::thread::sleep(Duration::from_millis(1200));
    file_round_trip(&dds, "/after-idle");
}

#[test]
fn connections_beyond_the_limit_are_closed() {
    let dpu = start(DpuConfig {
        max_control_connections: 3,
        ..config("limit")
    });
    let hosts: Vec<Dds> = (0..3)
        .map(|_| Dds::connect(dpu.socket()).unwrap())
        .collect();
    let mut extra = UnixStream::connect(dpu.socket()).unwrap();
    assert!(hung_up(&mut extra, Duration::from_secs(5)), "4th kept open");
    assert!(Dds::connect(dpu.socket()).is_err());
    for (i, h) in hosts.iter().enumerate() {
        file_round_trip(h, &format!("/h{i}"));
    }
    // A slot that frees up is usable again.
    drop(hosts);
    let deadline = Instant::now() + Duration::from_secs(5);
    let again = loop {
        match Dds::connect(dpu.socket()) {
            Ok(d) => break d,
            Err(e) => {
                assert!(Instant::now() < deadline, "no slot freed: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    file_round_trip(&again, "/again");
}

/// Outcome of a connection attempt made by a child process running as `uid`.
#[derive(Debug, PartialEq)]
enum Attempt {
    Answered,
    HungUp,
    ConnectFailed,
    Other(i32),
}

/// Forks a child that becomes `uid`/`uid`, connects to `socket` and sends `hello`; only raw
/// system calls run in the child.
fn connect_as(uid: u32, socket: &std::path::Path) -> Attempt {
    use std::os::unix::ffi::OsStrExt;
    let body = br#"{"op":"hello","version":1}"#;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    // SAFETY: a zeroed sockaddr_un is valid; the path fits (checked).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = socket.as_os_str().as_bytes();
    assert!(p.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: the child calls only async-signal-safe functions on memory prepared before the
    // fork, and leaves with _exit.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(10);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                libc::_exit(11);
            }
            if libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            ) != 0
            {
                libc::_exit(2);
            }
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
            // A refused peer may see the write fail once the DPU hung up.
            let _ = libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL);
            let mut b = [0u8; 4];
            let n = libc::read(fd, b.as_mut_ptr().cast(), 4);
            libc::_exit(if n > 0 {
                0
            } else if n == 0 || *libc::__errno_location() == libc::ECONNRESET {
                1
            } else {
                12
            });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "child status {status}");
        match libc::WEXITSTATUS(status) {
            0 => Attempt::Answered,
            1 => Attempt::HungUp,
            2 => Attempt::ConnectFailed,
            c => Attempt::Other(c),
        }
    }
}

#[test]
fn only_the_owner_and_allowed_users_are_served() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running a second user needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    // By default the socket is 0600: another user cannot even open it.
    let dpu = start(config("owner"));
    assert_eq!(connect_as(NOBODY, dpu.socket()), Attempt::ConnectFailed);
    // With the file mode opened up, the peer check still refuses the stranger.
    std::fs::set_permissions(dpu.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(connect_as(NOBODY, dpu.socket()), Attempt::HungUp);
    // Root (our own uid here) is served, and the refusal did not disturb anyone.
    assert_eq!(connect_as(0, dpu.socket()), Attempt::Answered);
    file_round_trip(&Dds::connect(dpu.socket()).unwrap(), "/mine");
    drop(dpu);

    let dpu = start(DpuConfig {
        allow_uids: vec![NOBODY],
        ..config("allowed")
    });
    assert_eq!(connect_as(NOBODY, dpu.socket()), Attempt::Answered);
    drop(dpu);
    let dpu = start(DpuConfig {
        allow_gids: vec![NOBODY],
        ..config("allowed-gid")
    });
    assert_eq!(connect_as(NOBODY, dpu.socket()), Attempt::Answered);
}
