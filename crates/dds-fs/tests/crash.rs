//! Crash consistency by killing a worker process (SIGKILL) at random moments while it runs
//! metadata operations and flushed writes on a real O_DIRECT device file through io_uring.

mod common;

use common::model::{check_recovered, snapshot, Model, Op};
use common::pattern;
use dds_fs::{format, FileService, FormatConfig, OpenConfig, UringDevice};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn open_cfg() -> OpenConfig {
    OpenConfig {
        max_inflight: 16,
        max_io_bytes: 1 << 20,
        bounce_bytes: 4 << 20,
    }
}

/// A device file of `bytes` bytes in `dir`, formatted with 64 KiB segments and a small log
/// (checkpoints happen during the tests).
fn formatted_device(dir: &Path, bytes: u64) -> PathBuf {
    let path = dir.join("crash.dev");
    UringDevice::create_file(&path, bytes).unwrap();
    let mut dev = UringDevice::open(&path, 16).unwrap();
    let cfg = FormatConfig {
        segment_size: 64 << 10,
        log_bytes: 0,
        ..FormatConfig::default()
    };
    format(&mut dev, cfg).unwrap();
    path
}

/// Opens the device after iteration `iter`'s kill (recovery), checks the allocation and reads
/// everything back.
fn recover(path: &Path, iter: u64) -> (FileService, Model) {
    let dev = UringDevice::open(path, 16).unwrap();
    let mut fs = FileService::open(Box::new(dev), open_cfg())
        .unwrap_or_else(|e| panic!("iteration {iter}: recovery failed: {e}"));
    fs.check_consistency().unwrap();
    let got = snapshot(&mut fs);
    (fs, got)
}

/// Runs the crash worker on `dev` with `args`, kills it (SIGKILL: no chance to clean up)
/// after `ms` milliseconds and returns what it printed (it must not have failed or ended).
fn run_and_kill(dev: &Path, args: &[String], ms: u64) -> Vec<String> {
    let worker = env!("CARGO_BIN_EXE_dds-fs-crash-worker");
    let mut child = Command::new(worker)
        .arg(dev)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn worker");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    std::thread::sleep(Duration::from_millis(ms));
    child.kill().expect("kill worker");
    let status = child.wait().unwrap();
    let lines = reader.join().unwrap();
    assert!(
        lines.iter().all(|l| !l.starts_with("ERR")),
        "worker failed: {lines:?}"
    );
    assert!(!status.success(), "worker ended on its own: {lines:?}");
    lines
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_op() {
    let dir = tempfile::tempdir().unwrap();
    let path = formatted_device(dir.path(), 64 << 20);
    let mut model = Model::default();
    let mut total_acks = 0;
    let mut kills = 0;
    let started = Instant::now();
    let mut x = 0x5eed_u64;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for iter in 0..10u64 {
        if started.elapsed() > Duration::from_secs(15) && iter >= 4 {
            break;
        }
        let lines = run_and_kill(&path, &[(iter + 1).to_string()], 30 + rnd(400));
        kills += 1;
        // Replay the worker's acknowledged ops on the model.
        let mut acked = model.clone();
        let mut pending: Option<Op> = None;
        for l in &lines {
            if let Some(op) = l.strip_prefix("BEGIN ") {
                assert!(pending.is_none(), "BEGIN without ACK");
                pending = Some(Op::parse(op).unwrap_or_else(|| panic!("bad op line {l}")));
            } else if l == "ACK" {
                acked.apply(&pending.take().expect("ACK without BEGIN"));
                total_acks += 1;
            }
        }
        // Recover and compare.
        let (fs, got) = recover(&path, iter);
        if let Err(e) = check_recovered(&got, &acked, pending.as_ref()) {
            panic!("iteration {iter}: {e}\npending: {pending:?}");
        }
        let sp = fs.free_space();
        let used: u64 = got
            .files
            .values()
            .map(|d| (d.len() as u64).div_ceil(sp.segment_size))
            .sum();
        assert_eq!(
            u64::from(sp.free_segments),
            u64::from(sp.total_segments) - used
        );
        model = got;
    }
    assert!(kills >= 4);
    assert!(total_acks >= 20, "too few acknowledged ops: {total_acks}");
    eprintln!(
        "{kills} kills, {total_acks} acknowledged ops, {:?}",
        started.elapsed()
    );
}

/// An append flood over four files on the metadata thread (each append parked until its size
/// is durable, several sharing a commit, extends of several files sharing a `SET_SIZES`
/// record), killed at random moments: after recovery each file is at least as long as every
/// acknowledged append to it reaches, and every acknowledged append reads back.
#[test]
fn sigkill_during_an_append_flood_loses_no_acknowledged_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = formatted_device(dir.path(), 96 << 20);
    // (file, offset, length, pattern seed) of every acknowledged append, over all runs.
    let mut acked: Vec<(u64, u64, u64, u64)> = Vec::new();
    let mut mid_flood = 0;
    let mut x = 0xa11e_u64;
    for iter in 0..6u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let args = [(100 + iter).to_string(), "appends".to_string()];
        let lines = run_and_kill(&path, &args, 20 + x % 150);
        let before = acked.len();
        for l in &lines {
            if let Some(a) = l.strip_prefix("ACK ") {
                let v: Vec<u64> = a.split(' ').map(|n| n.parse().unwrap()).collect();
                acked.push((v[0], v[1], v[2], v[3]));
            }
        }
        if !lines.iter().any(|l| l == "DONE") {
            mid_flood += 1;
        }
        let (_fs, got) = recover(&path, iter);
        let mut sizes = Vec::new();
        for f in 0..4u64 {
            let mine = || acked.iter().filter(|a| a.0 == f);
            let Some(file) = got.files.get(&format!("/appends{f}")) else {
                assert!(
                    mine().next().is_none(),
                    "iteration {iter}: appended file {f} is gone"
                );
                continue;
            };
            let reach = mine().map(|a| a.1 + a.2).max().unwrap_or(0);
            assert!(
                file.len() as u64 >= reach,
                "iteration {iter}: file {f}: size {} below an acknowledged append's end {reach}",
                file.len()
            );
            for &(_, off, len, seed) in mine() {
                let (off, len) = (off as usize, len as usize);
                assert!(
                    file[off..off + len] == pattern(seed, len)[..],
                    "iteration {iter}: file {f}: acknowledged append at {off}+{len} lost"
                );
            }
            sizes.push(file.len());
        }
        eprintln!(
            "iteration {iter}: {} appends acknowledged, sizes {sizes:?}",
            acked.len() - before,
        );
    }
    assert!(
        acked.len() >= 100,
        "too few acknowledged appends: {}",
        acked.len()
    );
    assert!(mid_flood >= 2, "only {mid_flood} kills during a flood");
}
