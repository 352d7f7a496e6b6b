//! The emulated DPU as a child process: `dds dpu` started from the `dds` binary, stopped when
//! its guard is dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::child::ChildGuard;

/// A running `dds dpu`; killed when dropped.
pub struct DpuProcess {
    child: ChildGuard,
    socket: PathBuf,
    log: PathBuf,
}

/// The last lines of a log file, for error messages.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(8)..].join("\n");
    if tail.is_empty() {
        String::from("(no output)")
    } else {
        tail
    }
}

impl DpuProcess {
    /// Starts `<exe> dpu --device <device> --socket <socket> <extra...>` with its standard
    /// error in `log`, and waits until the socket accepts connections.
    pub fn start(
        exe: &Path,
        device: &Path,
        socket: &Path,
        extra: &[&str],
        log: &Path,
    ) -> Result<DpuProcess> {
        let _ = std::fs::remove_file(socket);
        let err = std::fs::File::create(log)
            .with_context(|| format!("create the DPU log {}", log.display()))?;
        let child = Command::new(exe)
            .arg("dpu")
            .arg("--device")
            .arg(device)
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .with_context(|| format!("start the DPU process ({} dpu)", exe.display()))?;
        let mut me = DpuProcess {
            child: ChildGuard::new(child, "dds dpu"),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
        };
        for _ in 0..500 {
            if let Some(status) = me.child.try_wait()? {
                bail!(
                    "the DPU process (`dds dpu --device {}`) exited at start ({status}):\n{}",
                    device.display(),
                    log_tail(&me.log)
                );
            }
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Ok(me);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "the DPU process did not open {} within 10 s:\n{}",
            socket.display(),
            log_tail(&me.log)
        )
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Fails with the log's tail when the process has exited.
    pub fn check(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the DPU process exited ({status}):\n{}",
                log_tail(&self.log)
            );
        }
        Ok(())
    }

    /// Asks the DPU to stop (SIGTERM), waits for it, and kills it after 5 s.
    pub fn stop(mut self) -> Result<()> {
        self.child.stop(Duration::from_secs(5))?;
        Ok(())
    }
}

impl Drop for DpuProcess {
    fn drop(&mut self) {
        // The guard kills a process still running; the socket goes either way.
        let _ = std::fs::remove_file(&self.socket);
    }
}
