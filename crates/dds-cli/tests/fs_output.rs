//! `dds fs` for people: sizes in binary units and errors that say what to do.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DDS: &str = env!("CARGO_BIN_EXE_dds");

struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn sizes_read_as_sizes_and_refusals_come_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev.img");
    let sock = dir.path().join("dpu.sock");
    let out = Command::new(DDS)
        .args(["format", "--size", "64M", "--device"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
    let _dpu = Guard(
        Command::new(DDS)
            .args(["dpu", "--device"])
            .arg(&img)
            .arg("--socket")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let fs = |args: &[&str]| -> Output {
        Command::new(DDS)
            .arg("fs")
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let local = dir.path().join("one-mib");
    std::fs::write(&local, vec![1u8; 1 << 20]).unwrap();
    assert!(fs(&["put", local.to_str().unwrap(), "/blob"])
        .status
        .success());
    let ls = String::from_utf8(fs(&["ls", "/"]).stdout).unwrap();
    assert!(ls.contains("1.0 MiB") && ls.contains("blob"), "{ls}");
    let df = String::from_utf8(fs(&["df"]).stdout).unwrap();
    assert!(df.contains("MiB") && df.contains("free"), "{df}");

    let nested = fs(&["mkdir", "/a/b"]);
    assert_eq!(nested.status.code(), Some(1));
    let err = String::from_utf8_lossy(&nested.stderr);
    assert!(err.contains("hint") && err.contains("flat"), "{err}");
    let missing = fs(&["put", local.to_str().unwrap(), "/nodir/x"]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("dds fs mkdir"), "{err}");
}
