//! Control protocol: length-prefixed JSON frames over a Unix stream socket, with file
//! descriptors passed as `SCM_RIGHTS` (`docs/control-protocol.md`).

use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::Status;

pub const PROTOCOL_VERSION: u32 = 1;
/// Largest accepted frame payload.
pub const FRAME_BYTES_MAX: usize = 1 << 20;
/// Most descriptors one frame may carry.
pub const FRAME_FDS_MAX: usize = 4;

/// File name of the default control socket inside its runtime directory.
pub const SOCKET_FILE_NAME: &str = "dpu.sock";

/// The private runtime directory of the default control socket: `$XDG_RUNTIME_DIR/dds`,
/// `/run/dds` for root, otherwise `/tmp/dds-$UID`.
pub fn default_socket_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("dds"),
        _ if uid == 0 => PathBuf::from("/run/dds"),
        _ => PathBuf::from(format!("/tmp/dds-{uid}")),
    }
}

/// The default control socket of `dds dpu` (`default_socket_dir()/dpu.sock`).
pub fn default_socket_path() -> PathBuf {
    default_socket_dir().join(SOCKET_FILE_NAME)
}

/// Creates `dir` with mode 0700 if absent; an existing `dir` must be a directory (not a
/// symbolic link) owned by this user that no one else may enter or write.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let bad = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}", dir.display()),
        ))
    };
    if !m.file_type().is_dir() {
        return bad("not a directory (a symbolic link or another file is in the way)");
    }
    if m.uid() != uid {
        return bad(&format!("owned by uid {}, not by us ({uid})", m.uid()));
    }
    if m.mode() & 0o077 != 0 {
        return bad(&format!(
            "mode {:o} lets other users in (expected 0700)",
            m.mode() & 0o777
        ));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Hello {
        version: u32,
    },
    CreateDir {
        path: String,
    },
    RemoveDir {
        path: String,
    },
    ListDir {
        path: String,
    },
    CreateFile {
        path: String,
    },
    Lookup {
        path: String,
    },
    Stat {
        id: u32,
    },
    DeleteFile {
        id: u32,
    },
    Rename {
        from: String,
        to: String,
    },
    Resize {
        id: u32,
        size: u64,
    },
    FreeSpace,
    /// Carries two fds: the shared-memory object and the eventfd.
    CreateGroup {
        region_len: u64,
        req_offset: u64,
        req_capacity: u64,
        resp_offset: u64,
        resp_capacity: u64,
    },
    DeleteGroup {
        group: u32,
    },
    /// Exposes file `id` to the DPU's offload engine (or withdraws it): only exposed files
    /// are read on the DPU or cached. Replies `{"engine": bool}` (false: this DPU runs no
    /// offload engine, and the request had no effect).
    ExposeFile {
        id: u32,
        exposed: bool,
    },
    /// The host application announces the address it serves its clients on (`"ip:port"`),
    /// for the DPU's traffic director to connect client connections' host legs to. Replies
    /// `HostAppInfo`.
    SetHostApp {
        addr: String,
    },
    /// Runtime statistics of the DPU (`DpuStats`).
    Stats,
    /// Registers an application buffer (one fd: a sealed memfd of at least `len` bytes) that
    /// READ and WRITE records flagged `REGISTERED` name by the returned id (`BufferInfo`).
    RegisterBuffer {
        len: u64,
    },
    /// Unregisters a buffer of this connection.
    UnregisterBuffer {
        buffer: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(serde_json::Value),
    Err(ErrorBody),
}

impl Reply {
    pub fn ok<T: Serialize>(value: &T) -> Reply {
        Reply::Ok(serde_json::to_value(value).expect("reply values serialize"))
    }

    pub fn err(status: Status, message: impl Into<String>) -> Reply {
        Reply::Err(ErrorBody {
            code: status.code(),
            message: message.into(),
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloInfo {
    pub version: u32,
    pub payload_align: u32,
    pub max_io_bytes: u32,
    pub block_size: u32,
}

/// Counters of one notification group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStats {
    pub group: u32,
    /// Control connection of the host that owns it.
    pub conn: u64,
    /// Requests answered.
    pub requests: u64,
    /// Of which answered with an error status.
    pub errors: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests taken from the ring and not answered yet.
    pub outstanding: u64,
    /// Ring framing was corrupt: the group is stopped.
    pub broken: bool,
    pub closing: bool,
}

/// Counters of the DMA engine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmaCounters {
    /// DMA reads: the DPU reads host memory (data moves host → DPU: requests, written data).
    pub reads: u64,
    /// DMA writes: the DPU writes host memory (data moves DPU → host: responses, read data).
    pub writes: u64,
    /// Bytes moved host → DPU.
    pub bytes_read: u64,
    /// Bytes moved DPU → host.
    pub bytes_written: u64,
    /// Submissions to the DMA engine that started at least one operation.
    pub doorbells: u64,
    /// Nanoseconds the service thread spent executing DMA operations: the emulated engine's
    /// copies (its share of the DPU's CPU that a hardware engine would not take; 0 for one).
    #[serde(default)]
    pub execute_ns: u64,
}

/// Reply of `Stats`: what a running DPU is doing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DpuStats {
    pub groups: Vec<GroupStats>,
    /// DPU memory the groups' buffers use, and the budget.
    pub memory_used_bytes: u64,
    pub memory_budget_bytes: u64,
    pub dma: DmaCounters,
    pub space: SpaceInfo,
    /// The offload engine (cache table, cache writer, directors), when it runs.
    pub offload: Option<serde_json::Value>,
    /// Application buffers registered by all connections, and their bytes.
    #[serde(default)]
    pub registered_buffers: u64,
    #[serde(default)]
    pub registered_bytes: u64,
}

/// Reply of `SetHostApp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAppInfo {
    /// Whether the DPU runs a traffic director.
    pub director: bool,
    /// Whether the director takes the address (false: none runs, or `dds dpu --host-app`
    /// fixed its address).
    pub used: bool,
}

/// Reply of `ExposeFile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposeInfo {
    /// Whether the DPU runs an offload engine (without one the request has no effect).
    pub engine: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    pub id: u32,
    pub path: String,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub kind: EntryKind,
    pub id: u32,
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceInfo {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub segment_size: u64,
    pub files: u32,
    pub dirs: u32,
}

/// Reply of `RegisterBuffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferInfo {
    pub buffer: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub group: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame length {0} outside 1..={FRAME_BYTES_MAX}")]
    BadLength(usize),
    #[error("too many descriptors in one frame")]
    TooManyFds,
    #[error("frame not completed within {0:?}")]
    Timeout(Duration),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Sends one frame; `fds` ride on the first byte.
pub fn send_frame<T: Serialize>(
    sock: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
) -> Result<(), FrameError> {
    let payload = serde_json::to_vec(msg).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if payload.is_empty() || payload.len() > FRAME_BYTES_MAX {
        return Err(FrameError::BadLength(payload.len()));
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    if fds.is_empty() {
        (&*sock).write_all(&frame)?;
        return Ok(());
    }
    // The descriptors go with the first byte only, so one byte carries them and the rest
    // follows as plain stream data.
    dds_sys::send_with_fds(sock, &frame[..1], fds)?;
    (&*sock).write_all(&frame[1..])?;
    Ok(())
}

/// Receives one frame's payload; descriptors that came with it are appended to `fds`.
pub fn recv_frame(sock: &UnixStream, fds: &mut Vec<OwnedFd>) -> Result<Vec<u8>, FrameError> {
    recv_frame_within(sock, fds, None)
}

/// Bytes of a frame payload read at a time: the buffer grows with what arrives.
const RECV_CHUNK: usize = 64 << 10;

/// As [`recv_frame`], waiting as long as it takes for a frame to begin but, with
/// `frame_timeout`, at most that long for the rest of it once its first byte arrived
/// ([`FrameError::Timeout`]). With `frame_timeout`, the socket's read timeout is used and left
/// unset; without, it is left alone.
pub fn recv_frame_within(
    sock: &UnixStream,
    fds: &mut Vec<OwnedFd>,
    frame_timeout: Option<Duration>,
) -> Result<Vec<u8>, FrameError> {
    if frame_timeout.is_some() {
        sock.set_read_timeout(None)?;
    }
    let mut deadline: Option<Instant> = None;
    // Arms the frame deadline after the first byte and applies what is left of it.
    let rearm = |deadline: &mut Option<Instant>| -> Result<(), FrameError> {
        let Some(t) = frame_timeout else {
            return Ok(());
        };
        let d = *deadline.get_or_insert_with(|| Instant::now() + t);
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(FrameError::Timeout(t));
        }
        sock.set_read_timeout(Some(left))?;
        Ok(())
    };
    let timed_out = |e: &io::Error| {
        matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
    };
    let mut len_bytes = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = match dds_sys::recv_with_fds(sock, &mut len_bytes[got..], fds) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) && frame_timeout.is_some() => {
                return Err(FrameError::Timeout(frame_timeout.unwrap_or_default()))
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(if got == 0 {
                FrameError::Closed
            } else {
                FrameError::Malformed("truncated frame header".into())
            });
        }
        got += n;
        if fds.len() > FRAME_FDS_MAX {
            return Err(FrameError::TooManyFds);
        }
        rearm(&mut deadline)?;
    }
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len == 0 || len > FRAME_BYTES_MAX {
        return Err(FrameError::BadLength(len));
    }
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        let want = (len - start).min(RECV_CHUNK);
        payload.resize(start + want, 0);
        let r = (&*sock).read(&mut payload[start..]);
        match r {
            Ok(0) => return Err(FrameError::Malformed("truncated frame payload".into())),
            Ok(n) => payload.truncate(start + n),
            Err(e) => {
                payload.truncate(start);
                match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    _ if timed_out(&e) && frame_timeout.is_some() => {
                        return Err(FrameError::Timeout(frame_timeout.unwrap_or_default()))
                    }
                    _ => return Err(e.into()),
                }
            }
        }
        rearm(&mut deadline)?;
    }
    if frame_timeout.is_some() {
        sock.set_read_timeout(None)?;
    }
    Ok(payload)
}

/// Decodes a frame payload into a message.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    serde_json::from_slice(payload).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let r = Request::Resize { id: 3, size: 4096 };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"op":"resize","id":3,"size":4096}"#);
        assert_eq!(decode::<Request>(s.as_bytes()).unwrap(), r);
        let rb = serde_json::to_string(&Request::RegisterBuffer { len: 4096 }).unwrap();
        assert_eq!(rb, r#"{"op":"register_buffer","len":4096}"#);
        let ub = serde_json::to_string(&Request::UnregisterBuffer { buffer: 2 }).unwrap();
        assert_eq!(ub, r#"{"op":"unregister_buffer","buffer":2}"#);
        let fs = serde_json::to_string(&Request::FreeSpace).unwrap();
        assert_eq!(fs, r#"{"op":"free_space"}"#);
        assert!(decode::<Request>(br#"{"op":"format_disk"}"#).is_err());
        assert!(decode::<Request>(br#"{"op":"stat","id":"x"}"#).is_err());
    }

    #[test]
    fn reply_json_shape() {
        let ok = Reply::ok(&GroupInfo { group: 2 });
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#"{"ok":{"group":2}}"#);
        let err = Reply::err(Status::NotFound, "no /x");
        assert_eq!(
            serde_json::to_string(&err).unwrap(),
            r#"{"err":{"code":3,"message":"no /x"}}"#
        );
    }

    #[test]
    fn frames_cross_a_socket_with_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let (p, _q) = UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        send_frame(&a, &Request::Hello { version: 1 }, &[p.as_fd()]).unwrap();
        send_frame(&a, &Request::FreeSpace, &[]).unwrap();
        let mut fds = Vec::new();
        let m: Request = decode(&recv_frame(&b, &mut fds).unwrap()).unwrap();
        assert_eq!(m, Request::Hello { version: 1 });
        assert_eq!(fds.len(), 1);
        let m: Request = decode(&recv_frame(&b, &mut fds).unwrap()).unwrap();
        assert_eq!(m, Request::FreeSpace);
        drop(a);
        assert!(matches!(recv_frame(&b, &mut fds), Err(FrameError::Closed)));
    }

    #[test]
    fn bad_lengths_are_rejected() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&0u32.to_le_bytes()).unwrap();
        let mut fds = Vec::new();
        assert!(matches!(
            recv_frame(&b, &mut fds),
            Err(FrameError::BadLength(0))
        ));
        (&a).write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            recv_frame(&b, &mut fds),
            Err(FrameError::BadLength(_))
        ));
        (&a).write_all(&10u32.to_le_bytes()).unwrap();
        (&a).write_all(b"{}").unwrap();
        drop(a);
        assert!(matches!(
            recv_frame(&b, &mut fds),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn a_stalled_frame_times_out_but_an_idle_stream_waits() {
        let (a, b) = UnixStream::pair().unwrap();
        let t = Duration::from_millis(200);
        // Idle: nothing sent for longer than the frame timeout, then a whole frame.
        let sender = std::thread::spawn({
            let a = a.try_clone().unwrap();
            move || {
                std::thread::sleep(Duration::from_millis(400));
                send_frame(&a, &Request::FreeSpace, &[]).unwrap();
            }
        });
        let p = recv_frame_within(&b, &mut Vec::new(), Some(t)).unwrap();
        assert_eq!(decode::<Request>(&p).unwrap(), Request::FreeSpace);
        sender.join().unwrap();
        // Half a frame, then silence.
        (&a).write_all(&100u32.to_le_bytes()).unwrap();
        (&a).write_all(b"{\"op\"").unwrap();
        let start = Instant::now();
        let e = recv_frame_within(&b, &mut Vec::new(), Some(t)).unwrap_err();
        assert!(matches!(e, FrameError::Timeout(_)), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn default_socket_dir_is_private() {
        let dir = std::env::temp_dir().join(format!("dds-proto-test-{}", std::process::id()));
        let sub = dir.join("rt");
        ensure_private_dir(&sub).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(&sub).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        ensure_private_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(ensure_private_dir(&sub).is_err());
        let link = dir.join("link");
        std::os::unix::fs::symlink(&sub, &link).unwrap();
        assert!(ensure_private_dir(&link).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(default_socket_path().ends_with(SOCKET_FILE_NAME));
    }
}
