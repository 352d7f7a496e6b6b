//! Every example of the README's "Using it" section runs as the README says: each `sh` block
//! in a new empty directory, with `bash -euo pipefail`, and the `dds` under test on `PATH`
//! (as after `cargo install` or `export PATH=$PWD/target/release:$PATH`); no line is
//! rewritten. A block passes when it exits 0 and logs no error (stopping its servers is a
//! normal shutdown). Whatever a block left running is killed at its end, and a block whose
//! server dies before it is ready fails within seconds.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DDS: &str = env!("CARGO_BIN_EXE_dds");

/// The `sh` blocks of the section that starts with `heading`.
fn blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme.find(heading).expect("README section");
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in section.lines() {
        match (&mut cur, line.trim_end()) {
            (None, "```sh") => cur = Some(String::new()),
            (Some(b), "```") => {
                out.push(std::mem::take(b));
                cur = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    out
}

/// Runs `block` in `dir`; returns whether it succeeded, its output, and how long it took.
fn run_block(dir: &Path, block: &str) -> (bool, String, Duration) {
    let bin = Path::new(DDS).parent().expect("the binary's directory");
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    // What a block leaves running is killed when it ends, however it ends.
    let script =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{block}\n");
    let started = Instant::now();
    let mut child = Command::new("setsid")
        .args(["bash", "-c", &script])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("DDS_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let pid = child.id() as i32;
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The whole session: whatever the block left running.
    // SAFETY: kill(2) on the process group setsid made for this block.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = child.wait();
    let log = format!(
        "stdout:\n{}\nstderr:\n{}",
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default()
    );
    (status.is_some_and(|s| s.success()), log, started.elapsed())
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap()
}

#[test]
fn readme_examples_run_as_written() {
    let blocks = blocks(&readme(), "## Using it\n");
    assert!(blocks.len() >= 3, "the README's examples: {blocks:?}");
    for (i, block) in blocks.iter().enumerate() {
        assert!(
            !block.contains("target/release") && !block.contains("sleep "),
            "README example {} depends on the repository or on timing:\n{block}",
            i + 1
        );
        let dir = tempfile::tempdir().unwrap();
        let (ok, log, _) = run_block(dir.path(), block);
        assert!(ok, "README example {} failed:\n{block}\n{log}", i + 1);
        // Stopping the servers, applications first, is a normal shutdown.
        assert!(
            !log.contains("ERROR"),
            "README example {} logged an error:\n{block}\n{log}",
            i + 1
        );
    }
}

/// The second example (a DPU with its offload app and the host application) with the DPU's
/// device missing: the DPU exits at start, and `dds wait` says so at once.
#[test]
fn an_example_whose_server_dies_fails_in_seconds() {
    let blocks = blocks(&readme(), "## Using it\n");
    let block = &blocks[1];
    let broken: String = block
        .lines()
        .filter(|l| !l.starts_with("dds format"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(&broken, block, "the example formats its device");
    let dir = tempfile::tempdir().unwrap();
    let (ok, log, took) = run_block(dir.path(), &broken);
    assert!(!ok, "{log}");
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{log}");
    assert!(log.contains("exited before"), "{log}");
}
