//! The I/O part of an event loop, the only part that differs between the backends: how
//! connections are accepted, how their bytes arrive and leave, and how the loop waits.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::conn::Conn;
use crate::epoll::Epoll;
use crate::event_loop::{Core, Input};
use crate::uring::Uring;
use crate::{Backend, Config, ConnId, Service};

/// The environment variable that chooses the backend of loops configured with
/// [`Backend::Auto`]: `auto` (the default: io_uring where the kernel has it, epoll where not),
/// `uring`, or `epoll`.
pub const BACKEND_ENV: &str = "DDS_SERVER_BACKEND";

pub(crate) enum Io {
    Epoll(Epoll),
    Uring(Box<Uring>),
}

impl Io {
    /// The backend `cfg` asks for; for [`Backend::Auto`] the environment's: when it is unset
    /// or `auto`, io_uring when the kernel has what it needs (it may be missing, too old, or
    /// refused: `ENOSYS`, `EPERM`), epoll otherwise.
    pub(crate) fn new(listener: TcpListener, wake: Option<RawFd>, cfg: &Config) -> io::Result<Io> {
        let choice = match cfg.backend {
            Backend::Auto => match std::env::var(BACKEND_ENV).as_deref() {
                Ok("") | Ok("auto") | Err(std::env::VarError::NotPresent) => Backend::Auto,
                Ok("epoll") => Backend::Epoll,
                Ok("uring") => Backend::Uring,
                Ok(other) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{BACKEND_ENV}={other}: expected auto, uring or epoll"),
                    ))
                }
                Err(e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{BACKEND_ENV}: {e}"),
                    ))
                }
            },
            b => b,
        };
        match choice {
            Backend::Epoll => Ok(Io::Epoll(Epoll::new(listener, wake)?)),
            Backend::Uring => Ok(Io::Uring(Box::new(Uring::new(listener, wake, cfg)?))),
            Backend::Auto => match Uring::new(listener.try_clone()?, wake, cfg) {
                Ok(u) => Ok(Io::Uring(Box::new(u))),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring unavailable: the event loop runs on epoll");
                    Ok(Io::Epoll(Epoll::new(listener, wake)?))
                }
            },
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        match self {
            Io::Epoll(_) => Backend::Epoll,
            Io::Uring(_) => Backend::Uring,
        }
    }

    /// Waits at most `timeout` for events (zero: only collects what is there).
    pub(crate) fn wait<S: Service>(&mut self, core: &Core<S>, timeout: Duration) -> io::Result<()> {
        match self {
            Io::Epoll(e) => e.wait(timeout),
            Io::Uring(u) => u.wait(core, timeout),
        }
    }

    /// Hands what the wait found to the loop: new connections, connections to read, sends
    /// done.
    pub(crate) fn dispatch<S: Service>(&mut self, core: &mut Core<S>) {
        match self {
            Io::Epoll(e) => e.dispatch(core),
            Io::Uring(u) => u.dispatch(core),
        }
    }

    /// The next bytes of `c`.
    pub(crate) fn read<'a, T>(&'a mut self, c: &mut Conn<T>, scratch: &'a mut [u8]) -> Input<'a> {
        match self {
            Io::Epoll(e) => e.read(c, scratch),
            Io::Uring(u) => u.read(c),
        }
    }

    /// The bytes of the last [`Io::read`] were used.
    pub(crate) fn consumed(&mut self) {
        if let Io::Uring(u) = self {
            u.consumed();
        }
    }

    /// `c` was served: a completion-based backend keeps (or drops, when it closes) the bytes
    /// that arrived while it takes no input, and arms or stops its receive. True when `c`'s
    /// buffers grew.
    pub(crate) fn after_serve<T>(&mut self, c: &mut Conn<T>, draining: bool, pause: usize) -> bool {
        match self {
            Io::Epoll(_) => false,
            Io::Uring(u) => u.after_serve(c, draining, pause),
        }
    }

    /// `c` gets no input until it is served again (a completion-based backend's receive
    /// was stopped).
    pub(crate) fn stopped<T>(&self, c: &Conn<T>) -> bool {
        match self {
            Io::Epoll(_) => false,
            Io::Uring(u) => u.stopped(c),
        }
    }

    /// Sends `c`'s output (as much as the socket takes, or one send handed to the kernel).
    pub(crate) fn flush<T>(&mut self, c: &mut Conn<T>, keep: usize) {
        match self {
            Io::Epoll(e) => e.flush(c, keep),
            Io::Uring(u) => u.flush(c, keep),
        }
    }

    /// Closes a connection's socket.
    pub(crate) fn close(&mut self, stream: TcpStream, id: ConnId) {
        match self {
            Io::Epoll(e) => e.close(stream, id),
            Io::Uring(u) => u.close(stream, id),
        }
    }

    /// No more connections (a stop).
    pub(crate) fn stop_accepting(&mut self) {
        match self {
            Io::Epoll(e) => e.stop_accepting(),
            Io::Uring(u) => u.stop_accepting(),
        }
    }

    /// The loop ends: last requests (closes) go to the kernel.
    pub(crate) fn finish(&mut self) {
        if let Io::Uring(u) = self {
            u.finish();
        }
    }
}
