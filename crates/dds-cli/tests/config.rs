//! `dds dpu --config FILE` takes its options from TOML, and the command line overrides them.

mod common;

use std::process::{Command, Stdio};

use common::{format_device, wait_for_socket, DDS};

#[test]
fn the_dpu_takes_its_options_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = format_device(dir.path(), "64M");
    let from_file = dir.path().join("file.sock");
    let from_cli = dir.path().join("cli.sock");
    let cfg = dir.path().join("dpu.toml");
    std::fs::write(
        &cfg,
        format!(
            "device = {:?}\nsocket = {:?}\ndirector-memory = \"64M\"\nspin = false\n",
            img.to_str().unwrap(),
            from_file.to_str().unwrap()
        ),
    )
    .unwrap();
    // The command line's --socket wins over the file's.
    let mut dpu = Command::new(DDS)
        .args(["dpu", "--json", "--config"])
        .arg(&cfg)
        .arg("--socket")
        .arg(&from_cli)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_socket(&from_cli);
    assert!(!from_file.exists());
    let _ = dpu.kill();
    let _ = dpu.wait();
    // A broken file is a clear error.
    std::fs::write(&cfg, "device = [").unwrap();
    let out = Command::new(DDS)
        .args(["dpu", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TOML"));
}
