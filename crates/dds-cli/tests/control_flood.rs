//! The `dds dpu` control socket under clients that stall: connections that send half a frame
//! and hold it, or connect and say nothing, never lock out the `dds fs` commands nor cut off a
//! host that holds groups; they are closed after `--control-frame-timeout` and
//! `--control-idle-timeout`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{format_device, start_dpu, DDS};

/// Connections that stall, more than the DPU's default `--max-control-connections` (64).
const FLOOD: usize = 120;

/// A connection that sent a frame header and half of the payload it announces, or `None`
/// when the DPU hung up before the bytes went out.
fn half_frame(socket: &Path) -> Option<UnixStream> {
    let body = br#"{"op":"list_dir","path":"/"}"#;
    let mut s = UnixStream::connect(socket).ok()?;
    s.write_all(&(body.len() as u32).to_le_bytes()).ok()?;
    s.write_all(&body[..body.len() / 2]).ok()?;
    Some(s)
}

/// Whether the DPU has hung up on `s` (end of stream or an error), waiting up to `within`.
fn hung_up(s: &mut UnixStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// Runs `dds fs --socket SOCKET ARGS...`; panics unless it succeeds within `bound`.
fn fs_within(socket: &Path, args: &[&str], bound: Duration) -> String {
    let start = Instant::now();
    let out = Command::new(DDS)
        .arg("fs")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "dds fs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < bound, "dds fs {args:?} took {took:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn file_round_trip(dds: &dds_host::Dds, path: &str) {
    let f = dds.create_file(path).unwrap();
    dds.write_sync(f.id, 0, b"still served").unwrap();
    let mut back = [0u8; 12];
    dds.read_sync(f.id, 0, &mut back).unwrap();
    assert_eq!(&back, b"still served");
}

#[test]
fn stalled_and_idle_connections_lock_nobody_out() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");
    let _dpu = start_dpu(
        &img,
        &socket,
        &[
            "--control-frame-timeout",
            "4",
            "--control-idle-timeout",
            "1",
        ],
    );
    // A host that holds its notification group: its connection is its lifeline.
    let host = dds_host::Dds::connect(&socket).unwrap();

    let started = Instant::now();
    let mut stalled: Vec<UnixStream> = (0..FLOOD).filter_map(|_| half_frame(&socket)).collect();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the flood itself took {:?}",
        started.elapsed()
    );
    // While they hold their half frames, the command line keeps being served.
    let bound = Duration::from_secs(3);
    for i in 0..4 {
        fs_within(&socket, &["mkdir", &format!("/during-{i}")], bound);
        let ls = fs_within(&socket, &["ls", "/"], bound);
        assert!(ls.contains(&format!("during-{i}")), "{ls}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the commands ran past the frame deadline: the test proves nothing"
    );
    file_round_trip(&host, "/host-during");

    // Every half frame is closed by the frame deadline (4 s), not before it for the ones
    // still open.
    let deadline = started + Duration::from_secs(10);
    for s in &mut stalled {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(hung_up(s, left), "a half-sent frame was kept open");
    }

    // Connections that say nothing, or only hello, and hold no group: closed after the idle
    // limit (1 s). The host holding its group is idle as long but kept.
    let mut silent: Vec<UnixStream> = (0..5)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let mut greeted = UnixStream::connect(&socket).unwrap();
    let hello = br#"{"op":"hello","version":1}"#;
    greeted
        .write_all(&(hello.len() as u32).to_le_bytes())
        .unwrap();
    greeted.write_all(hello).unwrap();
    let mut len = [0u8; 4];
    greeted.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u32::from_le_bytes(len) as usize];
    greeted.read_exact(&mut reply).unwrap();
    assert!(String::from_utf8_lossy(&reply).contains("\"ok\""));
    let idle_from = Instant::now();
    assert!(
        !hung_up(&mut silent[0], Duration::from_millis(600)),
        "closed before the idle limit"
    );
    silent.push(greeted);
    for s in &mut silent {
        assert!(
            hung_up(s, Duration::from_secs(5)),
            "an idle connection was kept"
        );
    }
    assert!(idle_from.elapsed() >= Duration::from_millis(900));
    std::thread::sleep(Duration::from_millis(1500));
    file_round_trip(&host, "/host-after-idle");
    fs_within(&socket, &["ls", "/"], bound);
}
