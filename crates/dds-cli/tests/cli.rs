//! End-to-end tests of the `dds` command with real processes: a device file, the `dds dpu`
//! daemon, `dds fs` operator commands, and host-library clients in this process.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use dds_host::{Dds, Status};
use serde_json::Value;

/// The registry the binary builds (its source, compiled into this test).
#[path = "../src/offload_apps.rs"]
mod offload_apps;

const DDS: &str = env!("CARGO_BIN_EXE_dds");

struct Dpu {
    child: Child,
}

impl Dpu {
    fn start(device: &Path, socket: &Path) -> Dpu {
        let child = Command::new(DDS)
            .args(["dpu", "--dma-cost", "off", "--device"])
            .arg(device)
            .arg("--socket")
            .arg(socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dds dpu");
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(socket).is_err() {
            assert!(Instant::now() < deadline, "DPU did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Dpu { child }
    }

    fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for Dpu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn format(dir: &Path) -> PathBuf {
    let device = dir.join("dev.img");
    let out = Command::new(DDS)
        .args([
            "format",
            "--size",
            "64M",
            "--segment-size",
            "1M",
            "--device",
        ])
        .arg(&device)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "format: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    device
}

fn fs(socket: &Path, args: &[&str]) -> Output {
    Command::new(DDS)
        .arg("fs")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        vec!["--help"],
        vec!["dpu", "--help"],
        vec!["format", "--help"],
        vec!["fs", "--help"],
        vec!["fs", "ls", "--help"],
        vec!["fs", "put", "--help"],
        vec!["demo", "--help"],
        vec!["bench", "--help"],
        vec!["wait", "--help"],
    ] {
        let out = Command::new(DDS).args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{args:?}"
        );
    }
}

#[test]
fn operator_commands_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let _dpu = Dpu::start(&device, &socket);

    let mkdir = fs(&socket, &["mkdir", "/db"]);
    assert!(mkdir.status.success());
    assert_eq!(
        String::from_utf8_lossy(&mkdir.stdout),
        "created directory /db\n"
    );
    let quiet = fs(&socket, &["-q", "mkdir", "/quiet"]);
    assert!(quiet.status.success() && quiet.stdout.is_empty());
    let local = dir.path().join("in.bin");
    let data: Vec<u8> = (0..3_000_123u32).map(|i| (i * 13 + i / 7) as u8).collect();
    std::fs::write(&local, &data).unwrap();
    let put = fs(
        &socket,
        &["put", local.to_str().unwrap(), "/db/blob", "--json"],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    assert_eq!(json(&put)["bytes"], data.len() as u64);
    let put = fs(&socket, &["put", local.to_str().unwrap(), "/db/again"]);
    let said = String::from_utf8_lossy(&put.stdout);
    assert!(
        said.contains("-> /db/again: 3000123 bytes (2.9 MiB)"),
        "{said}"
    );
    assert!(fs(&socket, &["-q", "rm", "/db/again"]).stdout.is_empty());

    let ls = json(&fs(&socket, &["ls", "/db", "--json"]));
    assert_eq!(ls[0]["name"], "blob");
    assert_eq!(ls[0]["size"], data.len() as u64);
    let stat = json(&fs(&socket, &["stat", "/db/blob", "--json"]));
    assert_eq!(stat["size"], data.len() as u64);

    let back = dir.path().join("out.bin");
    assert!(fs(&socket, &["get", "/db/blob", back.to_str().unwrap()])
        .status
        .success());
    assert_eq!(std::fs::read(&back).unwrap(), data);

    assert!(fs(&socket, &["mv", "/db/blob", "/db/blob2"])
        .status
        .success());
    let df = json(&fs(&socket, &["df", "--json"]));
    assert_eq!(df["files"], 1);
    assert!(df["free_bytes"].as_u64().unwrap() < df["total_bytes"].as_u64().unwrap());

    // A refused operation: exit 1 and a JSON error with the status code.
    let missing = fs(&socket, &["stat", "/db/blob", "--json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(json(&missing)["error"]["code"], Status::NotFound.code());
    let notempty = fs(&socket, &["rmdir", "/db"]);
    assert_eq!(notempty.status.code(), Some(1));
    let err = String::from_utf8_lossy(&notempty.stderr);
    assert!(
        err.starts_with("dds fs rmdir /db: directory not empty\n"),
        "{err}"
    );
    assert_eq!(err.matches("not empty").count(), 1, "{err}");
    // The refusal names the command and its path, and says the status once.
    let nodir = fs(&socket, &["ls", "/nope"]);
    assert_eq!(nodir.status.code(), Some(1));
    let err = String::from_utf8_lossy(&nodir.stderr);
    assert!(
        err.starts_with("dds fs ls /nope: unknown directory\n"),
        "{err}"
    );
    assert_eq!(err.matches("unknown directory").count(), 1, "{err}");

    assert!(fs(&socket, &["rm", "/db/blob2"]).status.success());
    assert!(fs(&socket, &["rmdir", "/db"]).status.success());
    assert!(fs(&socket, &["rmdir", "/quiet", "-q"]).stdout.is_empty());
    assert_eq!(json(&fs(&socket, &["ls", "--json"])), serde_json::json!([]));

    // No DPU there: exit 3, and what to do; none was lost, so none is said to be gone.
    let nowhere = fs(&dir.path().join("none.sock"), &["df"]);
    assert_eq!(nowhere.status.code(), Some(3));
    let err = String::from_utf8_lossy(&nowhere.stderr);
    assert!(
        err.contains("no DPU listens on") && err.contains("dds dpu --device"),
        "{err}"
    );
    assert!(!err.contains("gone") && !err.contains("lost"), "{err}");
}

/// Every command says what it does in `dds --help`, its own words.
#[test]
fn help_describes_every_command_in_its_own_words() {
    let out = Command::new(DDS).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let commands = help
        .split("Commands:\n")
        .nth(1)
        .and_then(|r| r.split("\n\n").next())
        .expect("a Commands section");
    let mut seen = 0;
    for line in commands.lines() {
        let mut words = line.split_whitespace();
        let name = words.next().expect("a command");
        assert!(
            words.next().is_some(),
            "`{name}` has no description: {help}"
        );
        seen += 1;
    }
    assert!(seen > 10, "{help}");
    let line = |name: &str| {
        commands
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name}: {help}"))
            .to_string()
    };
    assert!(line("fsck").contains("Check a device's metadata"));
    assert!(!line("fsck").contains("remote-storage"));
    assert!(line("app").contains("remote-storage applications"));
    assert!(line("wait").contains("ready"));
}

/// `dds dpu --help` lists exactly the offload apps of the registry.
#[test]
fn offload_help_lists_the_registered_apps() {
    let out = Command::new(DDS).args(["dpu", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = offload_apps::registry().names().map(|(n, _)| n).collect();
    assert!(names.len() >= 4, "{names:?}");
    assert!(
        help.contains(&format!(
            "--offload <OFFLOAD>\n          Offload engine and traffic director: {} (built in)",
            names.join(", ")
        )),
        "{help}"
    );
    for (name, about) in offload_apps::registry().names() {
        assert!(
            help.contains(&format!("{name:<12} {about}")),
            "{name}: {help}"
        );
    }
}

/// `dds wait` returns once a readiness line is there, fails at once when the process it waits
/// for has exited, and after its timeout.
#[test]
fn wait_fails_fast_on_a_dead_server_and_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("server.ready");
    std::fs::write(&ready, "server ready\n").unwrap();
    let wait = |args: &[&str]| {
        let t = Instant::now();
        let out = Command::new(DDS).arg("wait").args(args).output().unwrap();
        (out, t.elapsed())
    };
    let (out, _) = wait(&["--file", ready.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");

    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id().to_string();
    gone.wait().unwrap();
    let never = dir.path().join("never.ready");
    let (out, took) = wait(&["--pid", &pid, "--file", never.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(took < Duration::from_secs(2), "{took:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("process {pid} exited before")) && err.contains("never.ready"),
        "{err}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let (out, took) = wait(&["--timeout", "0.5", "--tcp", &port]);
    assert_eq!(out.status.code(), Some(1));
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not ready"));
}

/// `dds objects` with no OSD running: exit 3 like every unreachable server, in words (no
/// status-enum prefix) and with what to start.
#[test]
fn objects_without_osds_say_so_with_status_3() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let map = dir.path().join("cluster.toml");
    std::fs::write(
        &map,
        format!(
            "epoch = 1\n[[osd]]\nid = 0\naddr = \"127.0.0.1:{port}\"\npeer_addr = \"127.0.0.1:{port}\"\n[[pool]]\nid = 1\nname = \"data\"\npg_num = 4\nsize = 1\n"
        ),
    )
    .unwrap();
    let out = Command::new(DDS)
        .args(["objects", "--map"])
        .arg(&map)
        .args(["--pool", "data", "stat", "blob"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("osd 0 at") && err.contains("unreachable"),
        "{err}"
    );
    assert!(err.contains("dds osd --id"), "{err}");
    assert!(!err.contains("Io:"), "{err}");
}

#[test]
fn dead_dpu_fails_pending_calls_and_restart_keeps_acknowledged_data() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let mut dpu = Dpu::start(&device, &socket);

    let dds = Dds::connect(&socket).unwrap();
    let f = dds.create_file("/acked").unwrap();
    let acked: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    dds.write_sync(f.id, 0, &acked).unwrap();
    dds.flush_sync(f.id).unwrap();
    dds.set_file_size(f.id, 1 << 20).unwrap();

    // Keep requests outstanding, then kill the DPU.
    let g = dds.default_group().clone();
    let mut issued = 0u64;
    for i in 0..64u64 {
        if dds.write(f.id, 65536 + i * 512, &[9u8; 512], i).is_ok() {
            issued += 1;
        }
    }
    dpu.kill9();
    let start = Instant::now();
    let mut completions = 0u64;
    let dead = loop {
        match g.poll_wait(Duration::from_millis(100)) {
            Ok(Some(_)) => completions += 1,
            Ok(None) => assert!(
                start.elapsed() < Duration::from_secs(5),
                "no failure within 5 s"
            ),
            Err(e) => break e,
        }
    };
    assert_eq!(dead.status, Status::DpuDead);
    assert!(completions <= issued);
    assert!(start.elapsed() < Duration::from_secs(5));
    let e = dds.write(f.id, 0, b"x", 0).unwrap_err();
    assert_eq!(e.status, Status::DpuDead);
    assert_eq!(dds.stat(f.id).unwrap_err().status, Status::DpuDead);

    // A new DPU on the same device: the library reconnects; acknowledged state is there.
    let _dpu2 = Dpu::start(&device, &socket);
    let dds2 = dds.reconnect().unwrap();
    let info = dds2.lookup("/acked").unwrap();
    assert_eq!(info.size, 1 << 20);
    let mut back = vec![0u8; acked.len()];
    dds2.read_sync(info.id, 0, &mut back).unwrap();
    assert_eq!(back, acked);
}

#[test]
fn kill_during_metadata_stream_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let mut acked = Vec::new();
    for round in 0..3 {
        let mut dpu = Dpu::start(&device, &socket);
        let dds = Dds::connect(&socket).unwrap();
        let killer = std::thread::spawn({
            let pid = dpu.child.id();
            move || {
                std::thread::sleep(Duration::from_millis(150 + 70 * round));
                // SAFETY: kill(2) on the child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        });
        for i in 0.. {
            let path = format!("/r{round}-f{i}");
            match dds.create_file(&path) {
                Ok(info) => {
                    if dds.set_file_size(info.id, 4096 * (i % 5 + 1)).is_err() {
                        break;
                    }
                    acked.push((path, 4096 * (i % 5 + 1)));
                }
                Err(e) => {
                    assert_eq!(e.status, Status::DpuDead, "unexpected error {e}");
                    break;
                }
            }
        }
        killer.join().unwrap();
        dpu.kill9();
    }
    assert!(!acked.is_empty());
    let _dpu = Dpu::start(&device, &socket);
    let dds = Dds::connect(&socket).unwrap();
    for (path, size) in &acked {
        let info = dds
            .lookup(path)
            .unwrap_or_else(|e| panic!("{path} lost: {e}"));
        assert_eq!(info.size, *size, "{path}");
    }
    let df = dds.free_space().unwrap();
    assert!(df.files as usize >= acked.len());
}

#[test]
fn malformed_control_frames_close_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let _dpu = Dpu::start(&device, &socket);
    let good = Dds::connect(&socket).unwrap();

    // Valid framing, not JSON: an error reply, the connection stays.
    let mut raw = UnixStream::connect(&socket).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    raw.write_all(&5u32.to_le_bytes()).unwrap();
    raw.write_all(b"{nope").unwrap();
    let reply = read_frame(&mut raw);
    assert_eq!(reply["err"]["code"], Status::BadRequest.code());
    // Unknown operation.
    let body = br#"{"op":"format_everything"}"#;
    raw.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
    raw.write_all(body).unwrap();
    assert_eq!(
        read_frame(&mut raw)["err"]["code"],
        Status::BadRequest.code()
    );
    // A group without its descriptors.
    let body = br#"{"op":"create_group","region_len":1,"req_offset":0,"req_capacity":65536,"resp_offset":0,"resp_capacity":65536}"#;
    raw.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
    raw.write_all(body).unwrap();
    assert_eq!(
        read_frame(&mut raw)["err"]["code"],
        Status::InvalidArgument.code()
    );
    // A huge length: the DPU answers once and hangs up.
    raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let _ = read_frame(&mut raw);
    let mut rest = Vec::new();
    assert_eq!(raw.read_to_end(&mut rest).unwrap_or(0), 0);

    // Everyone else is still served.
    let f = good.create_file("/still").unwrap();
    good.write_sync(f.id, 0, b"fine").unwrap();
}

fn read_frame(s: &mut UnixStream) -> Value {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn dpu_resource_profile_pins_and_limits_the_process() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: cgroups need root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let child = Command::new(DDS)
        .args([
            "dpu",
            "--cpus",
            "0",
            "--cpu-quota",
            "0.5",
            "--memory",
            "256M",
            "--device",
        ])
        .arg(&device)
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "DPU did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Cpus_allowed_list:") && l.ends_with("\t0")),
        "{status}"
    );
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let name = format!("dds-dpu-{pid}");
    assert!(cgroups.contains(&name), "{cgroups}");
    let quota_file = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        format!("/sys/fs/cgroup/{name}/cpu.max")
    } else {
        format!("/sys/fs/cgroup/cpu/{name}/cpu.cfs_quota_us")
    };
    assert!(std::fs::read_to_string(&quota_file)
        .unwrap()
        .starts_with("50000"));
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cpu_quota"));
    assert!(
        !std::path::Path::new(&quota_file).exists(),
        "cgroup left behind"
    );
}

#[cfg(not(feature = "bench"))]
#[test]
fn demo_and_bench_name_the_feature_they_need() {
    for args in [
        vec!["bench", "kv", "--quick"],
        vec!["bench"],
        vec!["demo", "--storage-only"],
    ] {
        let out = Command::new(DDS).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("`bench` feature") && err.contains("--features bench"),
            "{args:?}: {err}"
        );
    }
}

#[cfg(feature = "bench")]
#[test]
fn demo_storage_path_runs_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(DDS)
        .args([
            "demo",
            "--storage-only",
            "--ops",
            "3000",
            "--device-size",
            "128M",
            "--file-size",
            "16M",
        ])
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("DPU emulated as a separate process"));
    let row = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name}"));
        line.split('│').nth(2).unwrap().trim().parse().unwrap()
    };
    assert_eq!(row("operations"), 3000.0);
    assert_eq!(row("errors"), 0.0);
    assert!(row("throughput (ops/s)") > 0.0);
    assert!(row("DPU CPU per op (µs)") > 0.0);
    // The box's rows are as wide as its rules.
    let widths: Vec<usize> = text
        .lines()
        .filter(|l| l.starts_with(['┌', '│', '└']))
        .map(|l| l.chars().count())
        .collect();
    assert!(widths.iter().all(|&w| w == widths[0]), "{text}");
    // What stays behind, where, and how to remove it.
    let demo_dir = dir.path().join("dds").join("demo");
    assert!(demo_dir.join("device.img").exists());
    assert!(
        text.contains(&format!("`rm -r {}` removes them", demo_dir.display())),
        "{text}"
    );
}

/// Asserts that a command succeeded, showing its stderr otherwise.
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn format_args(device: &Path, extra: &[&str]) -> Output {
    Command::new(DDS)
        .args(["format", "--segment-size", "1M", "--device"])
        .arg(device)
        .args(extra)
        .output()
        .unwrap()
}

fn put_blob(socket: &Path, dir: &Path, remote: &str, data: &[u8]) {
    let local = dir.join("blob.in");
    std::fs::write(&local, data).unwrap();
    let out = fs(socket, &["put", local.to_str().unwrap(), remote]);
    assert_ok(&out);
}

fn get_blob(socket: &Path, remote: &str) -> Vec<u8> {
    let out = fs(socket, &["get", remote, "-"]);
    assert_ok(&out);
    out.stdout
}

#[test]
fn format_never_destroys_a_device_by_accident() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let mode = std::fs::metadata(&device).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "device image mode {mode:o}");
    let socket = dir.path().join("dpu.sock");
    let mut dpu = Dpu::start(&device, &socket);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
    put_blob(&socket, dir.path(), "/keep", &data);

    // A running DPU holds the device: no format, not even forced, touches it.
    for extra in [
        &["--size", "64M"][..],
        &["--force"][..],
        &["--size", "32M", "--force"][..],
    ] {
        let out = format_args(&device, extra);
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("in use"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(std::fs::metadata(&device).unwrap().len(), 64 << 20);
    assert_eq!(get_blob(&socket, "/keep"), data);
    dpu.kill9();

    // A device full of files is formatted again only with --force.
    let out = format_args(&device, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let dpu = Dpu::start(&device, &socket);
    assert_eq!(get_blob(&socket, "/keep"), data);
    drop(dpu);
    let out = format_args(&device, &["--force"]);
    assert_ok(&out);
    let _dpu = Dpu::start(&device, &socket);
    assert_eq!(json(&fs(&socket, &["ls", "--json"])), serde_json::json!([]));

    // Other data is not overwritten either.
    let other = dir.path().join("other.bin");
    std::fs::write(&other, b"someone's data").unwrap();
    let out = format_args(&other, &["--size", "64M"]);
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&other).unwrap(), b"someone's data");

    // A format that fails leaves no file it created.
    let fresh = dir.path().join("fresh.img");
    let out = Command::new(DDS)
        .args([
            "format",
            "--size",
            "64M",
            "--segment-size",
            "1000",
            "--device",
        ])
        .arg(&fresh)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!fresh.exists(), "failed format left {}", fresh.display());
}

#[test]
fn dpu_does_not_replace_a_regular_file_at_its_socket_path() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, b"keep me").unwrap();
    let out = Command::new(DDS)
        .args(["dpu", "--dma-cost", "off", "--device"])
        .arg(&device)
        .arg("--socket")
        .arg(&notes)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a socket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&notes).unwrap(), b"keep me");
}

#[test]
fn failed_puts_keep_the_old_file_and_leave_no_partial_one() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let _dpu = Dpu::start(&device, &socket);
    let data = b"the old contents".to_vec();
    put_blob(&socket, dir.path(), "/keep", &data);

    // A local read error (a directory opens but does not read).
    let out = fs(&socket, &["put", dir.path().to_str().unwrap(), "/keep"]);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(get_blob(&socket, "/keep"), data);

    // No space: more than the device holds.
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(80 << 20)
        .unwrap();
    let out = fs(&socket, &["put", big.to_str().unwrap(), "/keep"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(get_blob(&socket, "/keep"), data);
    let ls = json(&fs(&socket, &["ls", "--json"]));
    assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");

    // A put that succeeds replaces the file.
    put_blob(&socket, dir.path(), "/keep", b"new");
    assert_eq!(get_blob(&socket, "/keep"), b"new");
    let ls = json(&fs(&socket, &["ls", "--json"]));
    assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
}

#[test]
fn get_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let _dpu = Dpu::start(&device, &socket);
    put_blob(&socket, dir.path(), "/big", &vec![7u8; 4 << 20]);
    let mut child = Command::new(DDS)
        .args(["fs", "--socket"])
        .arg(&socket)
        .args(["get", "/big", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // The reader is gone (as `| head -c 10` exits).
    let out = child.wait_with_output().unwrap();
    assert_eq!(head, [7u8; 10]);
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn names_with_control_characters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let socket = dir.path().join("dpu.sock");
    let _dpu = Dpu::start(&device, &socket);
    for name in ["/a\x1b[2J", "/tab\there", "/del\x7f"] {
        let out = fs(&socket, &["mkdir", name]);
        assert_eq!(out.status.code(), Some(1), "{name:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("control character"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(json(&fs(&socket, &["ls", "--json"])), serde_json::json!([]));
}

#[test]
fn log_filters_come_from_the_flag_dds_log_then_rust_log() {
    let nowhere = tempfile::tempdir().unwrap();
    let sock = nowhere.path().join("none.sock");
    let run = |envs: &[(&str, &str)], flag: Option<&str>| {
        let mut c = Command::new(DDS);
        c.env_remove("DDS_LOG").env_remove("RUST_LOG");
        for (k, v) in envs {
            c.env(k, v);
        }
        if let Some(f) = flag {
            c.args(["--log", f]);
        }
        c.args(["fs", "--socket"])
            .arg(&sock)
            .arg("df")
            .output()
            .unwrap()
    };
    // No DPU there: exit 3 once logging is set up.
    assert_eq!(run(&[], None).status.code(), Some(3));
    for (envs, flag) in [
        (&[("RUST_LOG", "dds=bogus")][..], None),
        (&[("DDS_LOG", "dds=bogus"), ("RUST_LOG", "info")][..], None),
        (&[][..], Some("dds=bogus")),
    ] {
        let out = run(envs, flag);
        assert_eq!(out.status.code(), Some(2), "{envs:?} {flag:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("invalid log filter"));
    }
    // DDS_LOG wins over RUST_LOG.
    let out = run(&[("DDS_LOG", "warn"), ("RUST_LOG", "dds=bogus")], None);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn dpu_default_socket_is_private_and_readiness_is_one_line() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    let runtime = dir.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let mut child = Command::new(DDS)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("DDS_SOCKET")
        .env("DDS_LOG", "info")
        .args(["dpu", "--json", "--dma-cost", "off", "--device"])
        .arg(&device)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let socket = runtime.join("dds").join("dpu.sock");
    assert_eq!(ready["socket"], socket.to_str().unwrap());
    assert_eq!(ready["device"], device.to_str().unwrap());
    assert_eq!(ready["director"], Value::Null);
    assert_eq!(ready["pid"], child.id());
    let dmode = std::fs::metadata(runtime.join("dds"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(dmode & 0o777, 0o700, "directory mode {dmode:o}");
    let smode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(smode & 0o777, 0o600, "socket mode {smode:o}");

    // Clients find the same default.
    let out = Command::new(DDS)
        .env("XDG_RUNTIME_DIR", &runtime)
        .env_remove("DDS_SOCKET")
        .args(["fs", "df", "--json"])
        .output()
        .unwrap();
    assert_ok(&out);

    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(rest, "", "more than one line on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DPU listening"), "{err}");
    assert!(!err.contains('\x1b'), "colours on a pipe: {err}");
    assert!(!socket.exists());
}

#[test]
fn dpu_serves_another_user_only_when_allowed() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running a second user needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    let device = format(dir.path());
    // A socket in a directory every user can reach.
    let socket = std::env::temp_dir().join(format!("dds-cli-allow-{}.sock", std::process::id()));
    let df_as_nobody = || {
        Command::new(DDS)
            .uid(NOBODY)
            .gid(NOBODY)
            .args(["fs", "--socket"])
            .arg(&socket)
            .arg("df")
            .output()
            .unwrap()
    };
    let start = |extra: &[&str]| {
        let child = Command::new(DDS)
            .args(["dpu", "--dma-cost", "off", "--device"])
            .arg(&device)
            .arg("--socket")
            .arg(&socket)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Dpu { child };
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert!(line.starts_with("dds dpu ready: socket"), "{line}");
        child
    };

    let dpu = start(&[]);
    // Even with the file mode opened up, the DPU refuses the other user.
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = df_as_nobody();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ok(&fs(&socket, &["df"]));
    drop(dpu);

    let dpu = start(&["--allow-uid", "65534"]);
    assert_ok(&df_as_nobody());
    drop(dpu);
    let _ = std::fs::remove_file(&socket);
}

/// An application whose DPU is not there exits 3 like `dds fs`, says so once and how to start
/// one.
#[test]
fn app_without_a_dpu_exits_3_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(DDS)
        .args([
            "app",
            "pagestore",
            "--backend",
            "dds",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--socket")
        .arg(dir.path().join("none.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("DPU unreachable").count(), 1, "{err}");
    assert!(err.contains("hint: a DPU must be running"), "{err}");
}
