//! `dds fs` for people: sizes in binary units and errors that say what to do.

mod common;

use std::process::{Command, Output};

use common::{format_device, start_dpu, DDS};

#[test]
fn sizes_read_as_sizes_and_refusals_come_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "64M");
    let sock = dir.path().join("dpu.sock");
    let _dpu = start_dpu(&img, &sock, &[]);
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
