//! Control plane: the Unix socket listener and one thread per host connection.

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

type Connections = Arc<std::sync::Mutex<Vec<(u64, UnixStream)>>>;

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
        if config.socket.exists() {
            // A stale socket of a dead DPU; a live one would still accept.
            if UnixStream::connect(&config.socket).is_ok() {
                stop.store(true, Ordering::Release);
                let _ = service.join();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("a DPU already listens on {}", config.socket.display()),
                ));
            }
            std::fs::remove_file(&config.socket)?;
        }
        let listener = UnixListener::bind(&config.socket)?;
        listener.set_nonblocking(true)?;
        let listen_stop = stop.clone();
        let conns: Connections = Arc::default();
        let listen_conns = conns.clone();
        let listener = std::thread::Builder::new()
            .name("dds-control".into())
            .spawn(move || accept_loop(listener, cmd_tx, hello, listen_stop, listen_conns))?;
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
            let _ = c.shutdown(std::net::Shutdown::Both);
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
) {
    let next_conn = AtomicU64::new(1);
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, _)) => {
                let conn = next_conn.fetch_add(1, Ordering::Relaxed);
                let tx = cmd_tx.clone();
                let hello = hello.clone();
                if let Ok(c) = sock.try_clone() {
                    conns
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((conn, c));
                }
                let conns = conns.clone();
                let r = std::thread::Builder::new()
                    .name(format!("dds-conn-{conn}"))
                    .spawn(move || {
                        serve_connection(conn, sock, tx, hello);
                        conns
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .retain(|(c, _)| *c != conn);
                    });
                if let Err(e) = r {
                    tracing::error!("cannot start connection thread: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::error!("accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn serve_connection(conn: u64, sock: UnixStream, cmd_tx: CommandSender, hello: HelloInfo) {
    if let Err(e) = sock.set_nonblocking(false) {
        tracing::warn!(conn, "socket mode: {e}");
        return;
    }
    tracing::debug!(conn, "host connected");
    loop {
        let mut fds = Vec::new();
        let payload = match control::recv_frame(&sock, &mut fds) {
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
        let reply = match control::decode::<Request>(&payload) {
            Err(e) => Reply::err(Status::BadRequest, e.to_string()),
            Ok(Request::Hello { version }) if version != PROTOCOL_VERSION => Reply::err(
                Status::Protocol,
                format!("DPU speaks version {PROTOCOL_VERSION}, host {version}"),
            ),
            Ok(Request::Hello { .. }) => Reply::ok(&hello),
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
        if control::send_frame(&sock, &reply, &[]).is_err() {
            break;
        }
    }
    tracing::debug!(conn, "host disconnected");
    let _ = cmd_tx.send(Command::Disconnect { conn });
}
