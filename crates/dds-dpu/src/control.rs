//! Control plane: the Unix socket listener and one thread per host connection.
//!
//! Slots are bounded (`max_control_connections`), but a connection that holds nothing (no
//! notification group, no registered buffer) and waits for its next frame never keeps a newcomer
//! out: when every slot is taken, the one of those that has waited longest is closed to make
//! room. Such a connection is also closed after `control_idle_timeout` without a request; a
//! frame that has begun must be complete within `control_frame_timeout`, and a reply taken by
//! the client within the same time. A host holding groups keeps its connection, idle or not.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};

use crate::bell::{command_queue, Bell, CommandSender};
use dds_fs::FileService;
use dds_proto::control::{self, FrameError, HelloInfo, Reply, Request, PROTOCOL_VERSION};
use dds_proto::Status;

use crate::offload::{OffloadConfig, OffloadRuntime};
use crate::service::Service;
use crate::DpuConfig;

/// Control requests queued for the service thread at most.
const COMMAND_QUEUE_MAX: usize = 256;

pub(crate) enum Command {
    Op {
        conn: u64,
        req: Request,
        fds: Vec<OwnedFd>,
        reply: Sender<Reply>,
    },
    Disconnect {
        conn: u64,
    },
}

/// What the acceptor knows of one connection: enough to pick one to close when every slot is
/// taken, and to hang up on it.
struct ConnState {
    sock: UnixStream,
    /// Milliseconds since the listener's epoch at which the connection began waiting for its
    /// next frame (plus 1); 0 while a request is being served.
    waiting_since: AtomicU64,
    /// Whether it completed a `hello`.
    hello: AtomicBool,
    /// Whether it holds notification groups or registered buffers: a host's lifeline, never
    /// closed for idleness nor to make room.
    holds: AtomicBool,
}

type Connections = Arc<std::sync::Mutex<Vec<(u64, Arc<ConnState>)>>>;

/// Starts DPU daemons.
pub struct Dpu;

/// A running DPU: its socket accepts connections until `shutdown`.
pub struct DpuHandle {
    stop: Arc<AtomicBool>,
    /// Every live host connection, so shutdown can hang up on them.
    conns: Connections,
    service: Option<JoinHandle<()>>,
    listener: Option<JoinHandle<()>>,
    socket: PathBuf,
    offload: Option<OffloadRuntime>,
}

impl Dpu {
    /// Opens the file service with `open_fs` on the service thread (which then owns it) and
    /// starts listening on `config.socket`. Returns once the socket accepts connections.
    pub fn start<F>(config: DpuConfig, open_fs: F) -> io::Result<DpuHandle>
    where
        F: FnOnce() -> Result<FileService, dds_fs::FsError> + Send + 'static,
    {
        Dpu::start_with(config, open_fs, None)
    }

    /// As [`Dpu::start`], with the offload engine: its cache hooks run on the service thread,
    /// its traffic director (if configured) is started here and owned by the handle.
    pub fn start_with<F>(
        config: DpuConfig,
        open_fs: F,
        offload: Option<OffloadConfig>,
    ) -> io::Result<DpuHandle>
    where
        F: FnOnce() -> Result<FileService, dds_fs::FsError> + Send + 'static,
    {
        let (offload, runtime) = match offload.map(crate::offload::build).transpose()? {
            Some((hooks, runtime)) => (Some(hooks), Some(runtime)),
            None => (None, None),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let bell = Arc::new(Bell::new()?);
        let (cmd_tx, cmd_rx) = command_queue(COMMAND_QUEUE_MAX, bell.clone());
        let (ready_tx, ready_rx) = bounded::<Result<HelloInfo, String>>(1);
        let service_cfg = config.clone();
        let service_stop = stop.clone();
        let service = std::thread::Builder::new()
            .name("dds-service".into())
            .spawn(move || {
                let fs = match open_fs() {
                    Ok(fs) => fs,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("open file service: {e}")));
                        return;
                    }
                };
                let mut svc = Service::new(service_cfg, fs, cmd_rx, bell, offload);
                let _ = ready_tx.send(Ok(svc.hello()));
                svc.run(&service_stop);
            })?;
        let hello = match ready_rx.recv() {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                let _ = service.join();
                return Err(io::Error::other(e));
            }
            Err(_) => {
                let _ = service.join();
                return Err(io::Error::other("service thread died at start"));
            }
        };
        if let Err(e) = remove_stale_socket(&config.socket) {
            stop.store(true, Ordering::Release);
            let _ = service.join();
            return Err(e);
        }
        let listener = UnixListener::bind(&config.socket)?;
        // Only the owner may connect; with users or groups allowed besides, anyone who can
        // reach the socket's directory may try, and the peer check on every accept decides.
        let mode = if config.allow_uids.is_empty() && config.allow_gids.is_empty() {
            0o600
        } else {
            0o666
        };
        std::fs::set_permissions(
            &config.socket,
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )?;
        listener.set_nonblocking(true)?;
        let policy = Arc::new(Policy::new(&config));
        let listen_stop = stop.clone();
        let conns: Connections = Arc::default();
        let listen_conns = conns.clone();
        let listener = std::thread::Builder::new()
            .name("dds-control".into())
            .spawn(move || {
                accept_loop(listener, cmd_tx, hello, listen_stop, listen_conns, policy)
            })?;
        tracing::info!(socket = %config.socket.display(), "DPU listening");
        Ok(DpuHandle {
            stop,
            conns,
            service: Some(service),
            listener: Some(listener),
            socket: config.socket,
            offload: runtime,
        })
    }
}

/// A file service on a fresh in-memory device of `device_bytes` bytes (512-byte blocks, 1 MiB
/// segments), for [`Dpu::start_in_memory`] and tests that start a DPU with options.
pub fn memory_file_service(device_bytes: u64) -> Result<FileService, dds_fs::FsError> {
    let mut dev = dds_fs::MemDevice::new(device_bytes, 512);
    dds_fs::format(
        &mut dev,
        dds_fs::FormatConfig {
            segment_size: 1 << 20,
            ..dds_fs::FormatConfig::default()
        },
    )?;
    FileService::open(Box::new(dev), dds_fs::OpenConfig::default())
}

/// Removes what a dead DPU left at `path`: only a socket nothing listens on. Anything else
/// there is an error, never deleted.
fn remove_stale_socket(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
        ));
    }
    // A live DPU would still accept.
    if UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("a DPU already listens on {}", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// Who may use the control socket, and how many at once.
struct Policy {
    own_uid: u32,
    allow_uids: Vec<u32>,
    allow_gids: Vec<u32>,
    max_connections: usize,
    frame_timeout: Duration,
    idle_timeout: Duration,
    /// Time origin of [`ConnState::waiting_since`].
    epoch: std::time::Instant,
}

impl Policy {
    fn new(c: &DpuConfig) -> Policy {
        Policy {
            // SAFETY: geteuid has no preconditions.
            own_uid: unsafe { libc::geteuid() },
            allow_uids: c.allow_uids.clone(),
            allow_gids: c.allow_gids.clone(),
            max_connections: c.max_control_connections.max(1),
            frame_timeout: c.control_frame_timeout,
            idle_timeout: c.control_idle_timeout,
            epoch: std::time::Instant::now(),
        }
    }

    /// A [`ConnState::waiting_since`] stamp for now (never 0).
    fn stamp(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Whether the peer (uid, gid) may connect.
    fn admits(&self, uid: u32, gid: u32) -> bool {
        uid == self.own_uid
            || uid == 0
            || self.allow_uids.contains(&uid)
            || self.allow_gids.contains(&gid)
    }
}

/// The credentials (pid, uid, gid) of the process at the other end of `sock`.
fn peer_credentials(sock: &UnixStream) -> io::Result<(i32, u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket and an out-buffer of the size passed.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

/// A socket path in the temporary directory, unique to this process and call.
pub fn temp_socket_path(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "dds-{tag}-{}-{}.sock",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

impl Dpu {
    /// Starts a DPU on a fresh in-memory device of `device_bytes` bytes (512-byte blocks,
    /// 1 MiB segments): the real control socket, rings, DMA engine and file service, without a
    /// device file. For application tests and examples.
    pub fn start_in_memory(config: DpuConfig, device_bytes: u64) -> io::Result<DpuHandle> {
        Dpu::start(config, move || memory_file_service(device_bytes))
    }
}

impl DpuHandle {
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Blocks until the service thread ends (it runs until `shutdown` or a fatal error).
    pub fn wait(mut self) {
        if let Some(s) = self.service.take() {
            let _ = s.join();
        }
        self.shutdown_inner();
    }

    /// Stops accepting, stops the service thread (in-flight I/O is drained first) and removes
    /// the socket.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    /// The offload engine's cache table (read side), if offload is configured.
    pub fn offload_cache(&self) -> Option<&dds_cache::CacheReader> {
        self.offload.as_ref().map(|o| &o.cache)
    }

    /// Starts another traffic director on free lanes of the offload engine's port (for an
    /// application that comes up after the DPU). The caller owns it.
    pub fn start_director(
        &self,
        config: dds_director::DirectorConfig,
    ) -> io::Result<dds_director::DirectorHandle> {
        match &self.offload {
            Some(o) => o.start_director(config),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this DPU runs no offload engine",
            )),
        }
    }

    /// The traffic director started with the DPU, if any.
    pub fn director(&self) -> Option<&dds_director::DirectorHandle> {
        self.offload.as_ref().and_then(|o| o.director.as_ref())
    }

    fn shutdown_inner(&mut self) {
        // The director first: no new offloaded reads reach a stopping service thread.
        if let Some(d) = self.offload.as_mut().and_then(|o| o.director.take()) {
            tracing::info!(stats = ?d.stats(), "director stopped");
            d.shutdown();
        }
        self.stop.store(true, Ordering::Release);
        if let Some(s) = self.service.take() {
            let _ = s.join();
        }
        if let Some(l) = self.listener.take() {
            let _ = l.join();
        }
        // Hosts see the hang-up on their lifeline at once, as when the DPU process dies.
        for (_, c) in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = c.sock.shutdown(std::net::Shutdown::Both);
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for DpuHandle {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

fn accept_loop(
    listener: UnixListener,
    cmd_tx: CommandSender,
    hello: HelloInfo,
    stop: Arc<AtomicBool>,
    conns: Connections,
    policy: Arc<Policy>,
) {
    let next_conn = AtomicU64::new(1);
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, _)) => {
                let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                admit(conn, sock, &cmd_tx, &hello, &conns, &policy);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(&listener, 50);
            }
            Err(e) => {
                tracing::error!("accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Waits until `fd` is readable (or hung up), at most `timeout_ms` (negative: no limit).
/// False when the time ran out.
fn wait_readable(fd: &impl std::os::fd::AsRawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        // An error other than EINTR: let the caller's read report it.
        return r != 0;
    }
}

/// Checks the peer of a new connection and gives it a slot and a thread, closing a waiting
/// connection that holds nothing when every slot is taken.
fn admit(
    conn: u64,
    sock: UnixStream,
    cmd_tx: &CommandSender,
    hello: &HelloInfo,
    conns: &Connections,
    policy: &Arc<Policy>,
) {
    match peer_credentials(&sock) {
        Ok((_, uid, gid)) if policy.admits(uid, gid) => {}
        Ok((pid, uid, gid)) => {
            tracing::warn!(
                conn,
                pid,
                uid,
                gid,
                "refused control connection: user not allowed (see --allow-uid, --allow-gid)"
            );
            return;
        }
        Err(e) => {
            tracing::warn!(conn, "refused control connection: peer credentials: {e}");
            return;
        }
    }
    let clone = match sock.try_clone() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(conn, "refused control connection: {e}");
            return;
        }
    };
    let state = Arc::new(ConnState {
        sock: clone,
        waiting_since: AtomicU64::new(policy.stamp()),
        hello: AtomicBool::new(false),
        holds: AtomicBool::new(false),
    });
    {
        let mut list = conns.lock().unwrap_or_else(|p| p.into_inner());
        if list.len() >= policy.max_connections {
            // The longest-waiting of the connections that hold nothing, those that never
            // completed a hello first.
            let victim = list
                .iter()
                .enumerate()
                .filter(|(_, (_, s))| !s.holds.load(Ordering::Acquire))
                .filter_map(|(i, (_, s))| {
                    let since = s.waiting_since.load(Ordering::Acquire);
                    (since != 0).then(|| ((s.hello.load(Ordering::Acquire), since), i))
                })
                .min()
                .map(|(_, i)| i);
            let Some(i) = victim else {
                tracing::warn!(
                    conn,
                    max = policy.max_connections,
                    "refused control connection: too many open, all of them busy or holding groups (see --max-control-connections)"
                );
                return;
            };
            let (old, s) = list.swap_remove(i);
            tracing::warn!(
                conn = old,
                max = policy.max_connections,
                "closing a waiting control connection that holds nothing to make room for a new one"
            );
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
        list.push((conn, state.clone()));
    }
    let tx = cmd_tx.clone();
    let hello = hello.clone();
    let thread_conns = conns.clone();
    let thread_policy = policy.clone();
    let r = std::thread::Builder::new()
        .name(format!("dds-conn-{conn}"))
        .spawn(move || {
            serve_connection(conn, sock, &state, tx, hello, &thread_policy);
            thread_conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(c, _)| *c != conn);
        });
    if let Err(e) = r {
        conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(c, _)| *c != conn);
        tracing::error!("cannot start connection thread: {e}");
    }
}

fn serve_connection(
    conn: u64,
    sock: UnixStream,
    state: &ConnState,
    cmd_tx: CommandSender,
    hello: HelloInfo,
    policy: &Policy,
) {
    let frame_timeout = policy.frame_timeout;
    // A reply the client does not take within the frame deadline hangs up on it.
    if let Err(e) = sock
        .set_nonblocking(false)
        .and_then(|()| sock.set_write_timeout(Some(frame_timeout)))
    {
        tracing::warn!(conn, "socket mode: {e}");
        return;
    }
    tracing::debug!(conn, "host connected");
    // Groups and buffers this connection holds, as its replies said.
    let (mut groups, mut buffers) = (0u64, 0u64);
    let idle_ms = i32::try_from(policy.idle_timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        state.waiting_since.store(policy.stamp(), Ordering::Release);
        if !state.holds.load(Ordering::Acquire) && !wait_readable(&sock, idle_ms) {
            tracing::info!(
                conn,
                idle = ?policy.idle_timeout,
                "closing control connection: idle and holding nothing (see --control-idle-timeout)"
            );
            break;
        }
        let mut fds = Vec::new();
        let payload = match control::recv_frame_within(&sock, &mut fds, Some(frame_timeout)) {
            Ok(p) => p,
            Err(FrameError::Closed) => break,
            Err(e @ (FrameError::BadLength(_) | FrameError::TooManyFds)) => {
                // The stream is out of step: answer once, then hang up.
                tracing::warn!(conn, "closing connection: {e}");
                let _ =
                    control::send_frame(&sock, &Reply::err(Status::BadRequest, e.to_string()), &[]);
                break;
            }
            Err(e) => {
                tracing::warn!(conn, "closing connection: {e}");
                break;
            }
        };
        state.waiting_since.store(0, Ordering::Release);
        let request = control::decode::<Request>(&payload);
        // How a successful reply changes what the connection holds.
        let (dg, db): (i64, i64) = match &request {
            Ok(Request::CreateGroup { .. }) => (1, 0),
            Ok(Request::DeleteGroup { .. }) => (-1, 0),
            Ok(Request::RegisterBuffer { .. }) => (0, 1),
            Ok(Request::UnregisterBuffer { .. }) => (0, -1),
            _ => (0, 0),
        };
        let reply = match request {
            Err(e) => Reply::err(Status::BadRequest, e.to_string()),
            Ok(Request::Hello { version }) if version != PROTOCOL_VERSION => Reply::err(
                Status::Protocol,
                format!("DPU speaks version {PROTOCOL_VERSION}, host {version}"),
            ),
            Ok(Request::Hello { .. }) => {
                state.hello.store(true, Ordering::Release);
                Reply::ok(&hello)
            }
            Ok(req) => {
                let (tx, rx) = bounded(1);
                if cmd_tx
                    .send(Command::Op {
                        conn,
                        req,
                        fds,
                        reply: tx,
                    })
                    .is_err()
                {
                    break;
                }
                match rx.recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            }
        };
        if matches!(reply, Reply::Ok(_)) {
            groups = groups.saturating_add_signed(dg);
            buffers = buffers.saturating_add_signed(db);
            state.holds.store(groups + buffers > 0, Ordering::Release);
        }
        if control::send_frame(&sock, &reply, &[]).is_err() {
            break;
        }
    }
    tracing::debug!(conn, "host disconnected");
    let _ = cmd_tx.send(Command::Disconnect { conn });
}
