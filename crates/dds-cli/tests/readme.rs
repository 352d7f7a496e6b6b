//! Every example of the README's "Using it" section runs as written: each `sh` block, in
//! order, in one scratch directory, with the `dds` binary under test standing in for
//! `target/release/dds` (the blocks' `cargo build` lines are what produced it). Background
//! processes are stopped at the end of each block, as the README's own `kill` lines do; a
//! block that fails or hangs leaves none behind either.

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

fn run_block(dir: &Path, block: &str) -> (bool, String) {
    let script: String = block
        .lines()
        .filter(|l| !l.trim_start().starts_with("cargo build"))
        .map(|l| l.replace("target/release/dds", DDS))
        .collect::<Vec<_>>()
        .join("\n");
    let script =
        format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n{script}\n");
    let mut child = Command::new("setsid")
        .args(["bash", "-c", &script])
        .current_dir(dir)
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
    (status.is_some_and(|s| s.success()), log)
}

#[test]
fn readme_examples_run_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let blocks = blocks(&readme, "## Using it\n");
    assert!(blocks.len() >= 3, "the README's examples: {blocks:?}");
    let dir = tempfile::tempdir().unwrap();
    for (i, block) in blocks.iter().enumerate() {
        let (ok, log) = run_block(dir.path(), block);
        assert!(ok, "README example {} failed:\n{block}\n{log}", i + 1);
    }
    // The first example's file went in and came back listed.
    assert!(dir.path().join("dds.img").exists());
}
