//! Small helpers shared by the subcommands: sizes, exit statuses, reaching the DPU.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use dds_host::{Dds, DdsError, Status};
pub use dds_proto::units::parse_size;
use dds_storage::{DdsStorage, OsStorage, Storage};

/// Where a service's files live (`--storage`).
#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub enum StorageArg {
    /// DDS files through the host library; the file service runs in `dds dpu`.
    Dds,
    /// Regular files in --dir (the host doing the same work, no DPU).
    File,
}

/// A service's storage and, on DDS files, the connection to the DPU.
pub type OpenedStorage = (Box<dyn Storage>, Option<Arc<Dds>>);

/// A service's storage: DDS files under `dds_dir` through the DPU at `socket` (with the
/// connection, for the host library's asynchronous API), or regular files in `dir`.
pub fn open_storage(
    kind: StorageArg,
    socket: &Path,
    dds_dir: &str,
    dir: Option<&Path>,
) -> anyhow::Result<OpenedStorage> {
    Ok(match kind {
        StorageArg::Dds => {
            let dds = Arc::new(connect_dpu(socket)?);
            let st = DdsStorage::new(dds.clone(), dds_dir)
                .with_context(|| format!("DDS directory {dds_dir}"))?;
            (Box::new(st), Some(dds))
        }
        StorageArg::File => {
            let Some(dir) = dir else {
                bail!("--storage file needs --dir");
            };
            (Box::new(OsStorage::new(dir)?), None)
        }
    })
}

/// The exit statuses of every `dds` command (the README's table).
pub mod exit {
    /// The command failed or the server refused the operation (the message says why).
    pub const FAILED: u8 = 1;
    /// Usage: an unknown option, a bad value, an invalid log filter or `--config` file.
    pub const USAGE: u8 = 2;
    /// The server is unreachable: no DPU at the socket, no OSD of the map answering.
    pub const UNREACHABLE: u8 = 3;
    /// A local file could not be read or written.
    pub const LOCAL: u8 = 4;
}

/// A failure that carries its exit status; it displays as its message.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// The exit status of a failed command: the [`Failure`] in its chain, else 3 for a DPU or
/// an OSD that cannot be reached, else 1.
pub fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if let Some(f) = cause.downcast_ref::<Failure>() {
            return f.code;
        }
        if let Some(d) = cause.downcast_ref::<DdsError>() {
            if d.status == Status::DpuDead {
                return exit::UNREACHABLE;
            }
        }
        if let Some(o) = cause.downcast_ref::<dds_osd::OpError>() {
            if dds_osd::client::is_unreachable(o) {
                return exit::UNREACHABLE;
            }
        }
    }
    exit::FAILED
}

/// What to do about a failure, when there is something to say: a DPU that cannot be reached
/// is started first.
pub fn hint(e: &anyhow::Error) -> Option<&'static str> {
    e.chain()
        .filter_map(|c| c.downcast_ref::<DdsError>())
        .any(|d| d.status == Status::DpuDead)
        .then_some(
            "a DPU must be running: `dds dpu --device DEVICE` starts one (`dds format` makes a \
             device); --socket or DDS_SOCKET name another one's socket",
        )
}

/// Why nothing answered at `socket`, for an operator: nothing listens there (and how to start
/// a DPU), not allowed in, or the error as it came.
pub fn dpu_unreachable(socket: &Path, e: &DdsError) -> String {
    use std::io::ErrorKind;
    match std::os::unix::net::UnixStream::connect(socket) {
        Err(io)
            if matches!(
                io.kind(),
                ErrorKind::NotFound | ErrorKind::ConnectionRefused
            ) =>
        {
            let why = match io.kind() {
                ErrorKind::NotFound => "no socket there",
                _ => "connection refused",
            };
            format!(
                "no DPU listens on {} ({why}): start one with `dds dpu --device DEVICE` (`dds \
                 format` makes a device), or name a running one's socket with --socket or \
                 DDS_SOCKET",
                socket.display()
            )
        }
        Err(io) if io.kind() == ErrorKind::PermissionDenied => format!(
            "the DPU at {} does not let this user in ({io}): a DPU serves its own user and \
             root unless started with --allow-uid or --allow-gid",
            socket.display()
        ),
        _ => format!("the DPU at {} did not answer: {e}", socket.display()),
    }
}

/// Connects to the DPU at `socket`; when nothing answers, the error says why and how to start
/// one (exit status 3).
pub fn connect_dpu(socket: &Path) -> Result<Dds, Failure> {
    Dds::connect(socket).map_err(|e| match e.status {
        Status::DpuDead => Failure::new(exit::UNREACHABLE, dpu_unreachable(socket, &e)),
        _ => Failure::new(exit::FAILED, format!("DPU at {}: {e}", socket.display())),
    })
}

/// A time in nanoseconds since the Unix epoch as UTC, `2024-05-01 12:34:56.789 UTC`.
pub fn fmt_utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date of a day count (Howard Hinnant's days_from_civil, inverted).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ns % 1_000_000_000 / 1_000_000
    )
}

/// Tells the DPU's traffic director where this host application listens (an unspecified
/// address as loopback), so that `dds dpu --offload` needs no `--host-app` and no port is
/// picked for the application before it binds. Failing to tell it is not fatal: the director
/// may have its address already, or run elsewhere.
pub fn announce_host_app(dds: &dds_host::Dds, mut addr: std::net::SocketAddr) {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    match dds.set_host_app(addr) {
        Ok(i) if i.used => {
            tracing::info!(%addr, "the DPU's traffic director forwards to this server")
        }
        Ok(i) if i.director => {
            tracing::debug!(%addr, "the DPU's traffic director has a fixed host address")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "telling the DPU where this server listens failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_read_as_dates() {
        assert_eq!(fmt_utc(0), "1970-01-01 00:00:00.000 UTC");
        // 2000-02-29 (a leap day of a century year) 23:59:59.5
        assert_eq!(
            fmt_utc(951_868_799_500_000_000),
            "2000-02-29 23:59:59.500 UTC"
        );
        assert_eq!(
            fmt_utc(1_735_689_600_000_000_000),
            "2025-01-01 00:00:00.000 UTC"
        );
    }
}
