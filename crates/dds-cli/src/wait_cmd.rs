//! `dds wait`: waits until servers started in the background are ready, for scripts:
//!
//! ```sh
//! dds dpu --device dds.img &
//! dds wait --pid $!                 # the DPU answers on its (default) socket
//! dds app pagestore --backend dds > pagestore.ready &
//! dds wait --pid $! --file pagestore.ready
//! ```
//!
//! It fails as soon as one of the `--pid` processes has exited (a server that could not start
//! never becomes ready) or after `--timeout` seconds, so that a script never waits forever.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use crate::util::{exit, Failure};

#[derive(Args, Debug)]
#[command(after_help = "\
Without --socket, --file or --tcp it waits for a DPU on the default socket ($DDS_SOCKET, else \
dpu.sock in the private runtime directory). Exit status 0 once everything is ready, 1 when a \
--pid process exited first or the timeout passed.")]
pub struct WaitArgs {
    /// A DPU answers on this control socket (repeatable).
    #[arg(long, value_name = "PATH")]
    socket: Vec<PathBuf>,
    /// This file holds a complete line: the readiness line a daemon prints on standard output
    /// (`dds kv ... > kv.ready &`) (repeatable).
    #[arg(long, value_name = "FILE")]
    file: Vec<PathBuf>,
    /// Something accepts TCP connections at this address (repeatable).
    #[arg(long, value_name = "ADDR")]
    tcp: Vec<SocketAddr>,
    /// Fail as soon as this process has exited (repeatable; `$!` in a shell).
    #[arg(long, value_name = "PID")]
    pid: Vec<u32>,
    /// Fail after this many seconds.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    timeout: f64,
}

/// Something to wait for.
enum Target {
    Socket(PathBuf),
    File(PathBuf),
    Tcp(SocketAddr),
}

impl Target {
    fn ready(&self) -> bool {
        match self {
            // A DPU that answers the protocol's hello, not only a socket that exists.
            Target::Socket(p) => dds_host::Dds::connect(p).is_ok(),
            Target::File(p) => std::fs::read(p).is_ok_and(|b| b.contains(&b'\n')),
            Target::Tcp(a) => {
                std::net::TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok()
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Target::Socket(p) => format!("a DPU on {}", p.display()),
            Target::File(p) => format!("a readiness line in {}", p.display()),
            Target::Tcp(a) => format!("a listener on {a}"),
        }
    }
}

/// Whether process `pid` has exited (it is gone, or a zombie nobody reaped yet).
fn exited(pid: u32) -> bool {
    let Ok(id) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(id, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return true;
    }
    zombie(Path::new(&format!("/proc/{pid}/stat")))
}

/// Whether a `/proc/PID/stat` says the process is a zombie (its state follows the command
/// name in parentheses).
fn zombie(stat: &Path) -> bool {
    std::fs::read_to_string(stat).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

pub fn run(a: WaitArgs) -> Result<()> {
    let timeout = Duration::try_from_secs_f64(a.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--timeout takes a positive number of seconds")
        .map_err(|e| Failure::new(exit::USAGE, format!("{e:#}")))?;
    let mut pending: Vec<Target> = a
        .socket
        .into_iter()
        .map(Target::Socket)
        .chain(a.file.into_iter().map(Target::File))
        .chain(a.tcp.into_iter().map(Target::Tcp))
        .collect();
    if pending.is_empty() {
        pending.push(Target::Socket(
            std::env::var_os("DDS_SOCKET")
                .map(PathBuf::from)
                .unwrap_or_else(dds_host::default_socket_path),
        ));
    }
    let deadline = Instant::now() + timeout;
    loop {
        pending.retain(|t| !t.ready());
        if pending.is_empty() {
            return Ok(());
        }
        if let Some(pid) = a.pid.iter().copied().find(|&p| exited(p)) {
            return Err(Failure::new(
                exit::FAILED,
                format!(
                    "process {pid} exited before there was {} (its own error is above)",
                    what(&pending)
                ),
            )
            .into());
        }
        if Instant::now() >= deadline {
            return Err(Failure::new(
                exit::FAILED,
                format!("waited {:.0?} for {}: not ready", timeout, what(&pending)),
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn what(pending: &[Target]) -> String {
    pending
        .iter()
        .map(Target::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zombie_is_told_from_a_running_process() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        std::fs::write(&stat, "42 (dds (x) y) Z 1 42").unwrap();
        assert!(zombie(&stat));
        std::fs::write(&stat, "42 (dds) S 1 42").unwrap();
        assert!(!zombie(&stat));
        assert!(!exited(std::process::id()));
    }
}
