//! The one guard of a benchmark's child processes (the DPU, servers, peers): stopped with
//! SIGTERM by [`ChildGuard::stop`], killed when dropped, so no benchmark leaves a process
//! behind when it fails halfway.

use std::process::{Child, ExitStatus};
use std::time::Duration;

/// A child process that is killed when the guard is dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    name: &'static str,
}

impl ChildGuard {
    /// Guards `child`; `name` is for messages.
    pub fn new(child: Child, name: &'static str) -> ChildGuard {
        ChildGuard { child, name }
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The name given at creation.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// CPU seconds the child has used so far (0 when it cannot be read).
    pub fn cpu_seconds(&self) -> f64 {
        crate::cpu::process_cpu_seconds(self.pid()).unwrap_or(0.0)
    }

    /// The first line of the child's stdout (which must be piped), waiting at most `timeout`;
    /// the rest of its stdout is drained from a thread, so the child never blocks on a full
    /// pipe.
    pub fn ready_line(&mut self, timeout: Duration) -> anyhow::Result<String> {
        use std::io::BufRead;
        let name = self.name;
        let out = self
            .child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("{name}: stdout is not piped"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(out).lines();
            let _ = tx.send(lines.next());
            for _ in lines {}
        });
        match rx.recv_timeout(timeout) {
            Ok(Some(Ok(l))) => Ok(l),
            Ok(_) => match self.try_wait()? {
                Some(st) => anyhow::bail!("{name} exited ({st}) before it was ready"),
                None => anyhow::bail!("{name} closed its stdout before it was ready"),
            },
            Err(_) => anyhow::bail!("{name} was not ready within {timeout:?}"),
        }
    }

    /// The exit status, if the child has exited.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Asks the child to stop (SIGTERM), waits up to `grace`, then kills it.
    pub fn stop(&mut self, grace: Duration) -> std::io::Result<()> {
        // SAFETY: kill(2) on our own child, which has not been reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let step = Duration::from_millis(10);
        let mut waited = Duration::ZERO;
        while waited < grace {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(step);
            waited += step;
        }
        tracing::warn!(name = self.name, "did not stop on SIGTERM; killing");
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
