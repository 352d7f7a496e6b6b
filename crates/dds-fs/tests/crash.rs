//! Crash consistency by killing a worker process (SIGKILL) at random moments while it runs
//! metadata operations and flushed writes on a real O_DIRECT device file through io_uring.

mod common;

use common::model::{check_recovered, snapshot, Model, Op};
use dds_fs::{format, FileService, FormatConfig, OpenConfig, UringDevice};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn open_cfg() -> OpenConfig {
    OpenConfig {
        max_inflight: 16,
        max_io_bytes: 1 << 20,
        bounce_bytes: 4 << 20,
    }
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_op() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.dev");
    UringDevice::create_file(&path, 64 << 20).unwrap();
    {
        let mut dev = UringDevice::open(&path, 16).unwrap();
        let cfg = FormatConfig {
            segment_size: 64 << 10,
            log_bytes: 0, // small log: checkpoints happen during the test
            ..FormatConfig::default()
        };
        format(&mut dev, cfg).unwrap();
    }
    let worker = env!("CARGO_BIN_EXE_dds-fs-crash-worker");
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
        let mut child = Command::new(worker)
            .arg(&path)
            .arg((iter + 1).to_string())
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
        std::thread::sleep(Duration::from_millis(30 + rnd(400)));
        // SIGKILL: no chance to clean up.
        child.kill().expect("kill worker");
        let status = child.wait().unwrap();
        let lines = reader.join().unwrap();
        assert!(
            lines.iter().all(|l| !l.starts_with("ERR")),
            "worker failed: {lines:?}"
        );
        assert!(!status.success(), "worker ended on its own: {lines:?}");
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
        let dev = UringDevice::open(&path, 16).unwrap();
        let mut fs = FileService::open(Box::new(dev), open_cfg())
            .unwrap_or_else(|e| panic!("iteration {iter}: recovery failed: {e}"));
        fs.check_consistency().unwrap();
        let got = snapshot(&mut fs);
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
