//! `dds dpu --config FILE` takes its options from TOML, and the command line overrides them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DDS: &str = env!("CARGO_BIN_EXE_dds");

#[test]
fn the_dpu_takes_its_options_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("dev.img");
    let out = Command::new(DDS)
        .args(["format", "--size", "64M", "--device"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(out.status.success());
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&from_cli).is_err() {
        assert!(
            Instant::now() < deadline,
            "DPU did not start from its config file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
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
