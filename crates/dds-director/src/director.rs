//! Starting and stopping the director's threads.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dds_cache::CacheReader;
use dds_offload_api::{OffloadApp, MAX_HEADER_ROOM};
use dds_offload_engine::{ExposedFiles, FileReadPort};
use dds_server::BACKEND_ENV;
use mio::net::TcpListener;
use mio::{Interest, Poll, Waker};

use crate::buffer::Budget;
use crate::config::DirectorConfig;
use crate::inline::InlineDirector;
use crate::stats::{DirectorStats, Stats};
use crate::uring::SplitRing;
use crate::worker::{Worker, LISTENER, WAKER};

/// The traffic director.
#[derive(Debug)]
pub struct Director;

/// A running director: its address, counters and shutdown.
pub struct DirectorHandle {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<Waker>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    stats: Arc<Stats>,
    budget: Arc<Budget>,
}

impl std::fmt::Debug for DirectorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectorHandle")
            .field("local", &self.local)
            .finish()
    }
}

/// The counters of a director, readable from any thread (for statistics), whether or not the
/// director still runs.
#[derive(Clone, Debug)]
pub struct StatsSource {
    stats: Arc<Stats>,
    budget: Arc<Budget>,
    stop: Arc<AtomicBool>,
}

impl StatsSource {
    /// Current counters.
    pub fn stats(&self) -> DirectorStats {
        self.stats.snapshot_with(&self.budget)
    }

    /// Whether the director still runs.
    pub fn running(&self) -> bool {
        !self.stop.load(Ordering::Acquire)
    }
}

impl DirectorHandle {
    /// A source of this director's counters for other threads.
    pub fn stats_source(&self) -> StatsSource {
        StatsSource {
            stats: self.stats.clone(),
            budget: self.budget.clone(),
            stop: self.stop.clone(),
        }
    }

    /// The address the director listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Current counters.
    pub fn stats(&self) -> DirectorStats {
        self.stats.snapshot_with(&self.budget)
    }

    /// Stops the threads: connections are closed, outstanding reads are awaited (up to 5 s;
    /// buffers of reads still outstanding after that are leaked, never freed under the file
    /// service).
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in &self.wakers {
            let _ = w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for DirectorHandle {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Receive buffers of a director thread's ring, and their size.
const RING_BUFFERS: u16 = 256;
const RING_BUFFER_BYTES: usize = 16 << 10;

/// The io_uring of one director thread's split connections, chosen as the server runtime chooses its
/// backend (`DDS_SERVER_BACKEND`: `auto` or unset, io_uring where the kernel has it; `epoll`;
/// `uring`, an error where it is missing).
fn split_ring(cfg: &DirectorConfig, poll: &Poll) -> io::Result<Option<SplitRing>> {
    let want = std::env::var(BACKEND_ENV).unwrap_or_default();
    if want == "epoll" {
        return Ok(None);
    }
    match SplitRing::new(
        cfg.max_connections,
        RING_BUFFERS,
        RING_BUFFER_BYTES,
        poll.as_raw_fd(),
    ) {
        Ok(r) => Ok(Some(r)),
        Err(e) if want == "uring" => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "director: io_uring unavailable, split connections on epoll");
            Ok(None)
        }
    }
}

pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// What [`Director::start`] and [`Director::start_inline`] build before any thread runs.
struct Built {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    budget: Arc<Budget>,
    /// Each worker with its `mio` waker.
    workers: Vec<(Worker, Arc<Waker>)>,
}

impl Director {
    /// Starts the director threads. `cache` is a reader of the table whose writer the file
    /// service thread owns; `port` has at least `threads` free lanes.
    pub fn start(
        cfg: DirectorConfig,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        exposed: Arc<ExposedFiles>,
        port: Arc<FileReadPort>,
    ) -> io::Result<DirectorHandle> {
        let threads = cfg.threads.max(1);
        let b = Director::build(&cfg, threads, app.clone(), cache, exposed, &port, true)?;
        let mut wakers = Vec::new();
        let mut handles = Vec::new();
        for (i, (worker, waker)) in b.workers.into_iter().enumerate() {
            wakers.push(waker);
            let hook = cfg.on_thread_start.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("dds-director-{i}"))
                    .spawn(move || {
                        if let Some(h) = hook {
                            h(i);
                        }
                        let r =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()));
                        if r.is_err() {
                            tracing::error!(thread = i, "director thread panicked");
                        }
                    })?,
            );
        }
        tracing::info!(local = %b.local, host = ?cfg.host.get(), signature = %cfg.signature, threads, app = app.name(), "traffic director started");
        Ok(DirectorHandle {
            local: b.local,
            stop: b.stop,
            wakers,
            threads: handles,
            stats: b.stats,
            budget: b.budget,
        })
    }

    /// A director of one event loop that the caller's thread drives ([`InlineDirector`]):
    /// the thread that serves `port` (the file service's), so that offloaded reads and their
    /// completions need no wake-up of another thread. `cfg.threads` is ignored. The handle
    /// stops it (the caller's next [`InlineDirector::poll`] closes its connections) and reads
    /// its counters.
    pub fn start_inline(
        cfg: DirectorConfig,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        exposed: Arc<ExposedFiles>,
        port: Arc<FileReadPort>,
    ) -> io::Result<(DirectorHandle, InlineDirector)> {
        let b = Director::build(&cfg, 1, app.clone(), cache, exposed, &port, false)?;
        let (worker, waker) = b.workers.into_iter().next().expect("one worker");
        tracing::info!(local = %b.local, host = ?cfg.host.get(), signature = %cfg.signature, app = app.name(), "traffic director started on the service thread");
        Ok((
            DirectorHandle {
                local: b.local,
                stop: b.stop,
                wakers: vec![waker],
                threads: Vec::new(),
                stats: b.stats,
                budget: b.budget,
            },
            InlineDirector::new(worker),
        ))
    }

    /// The listener, counters and `threads` workers (each on its own lane of `port`; with
    /// `wake`, the service thread wakes a worker sleeping for its lane's completions).
    fn build(
        cfg: &DirectorConfig,
        threads: usize,
        app: Arc<dyn OffloadApp>,
        cache: CacheReader,
        exposed: Arc<ExposedFiles>,
        port: &Arc<FileReadPort>,
        wake: bool,
    ) -> io::Result<Built> {
        if app.header_room() > MAX_HEADER_ROOM {
            return Err(invalid(format!(
                "app header room {} above {MAX_HEADER_ROOM}",
                app.header_room()
            )));
        }
        if cfg.context_ring_len > port.depth() {
            return Err(invalid(format!(
                "context_ring_len {} above the port depth {}",
                cfg.context_ring_len,
                port.depth()
            )));
        }
        let mut lanes = Vec::with_capacity(threads);
        for i in 0..threads {
            let lane = port
                .lane(i)
                .ok_or_else(|| invalid(format!("port lane {i} missing or taken")))?;
            if lane.invalidation_room() < app.max_forward_keys() {
                return Err(invalid(format!(
                    "port invalidation queue ({}) smaller than the app's max_forward_keys ({})",
                    lane.invalidation_room(),
                    app.max_forward_keys()
                )));
            }
            lanes.push(lane);
        }
        let std_listener = if cfg.transparent {
            transparent_listener(cfg.listen)?
        } else {
            dds_server::bind_listener(cfg.listen)?
        };
        std_listener.set_nonblocking(true)?;
        let local = std_listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        let budget = Budget::new(cfg.memory_bytes);
        let mut workers = Vec::with_capacity(threads);
        for (i, lane) in lanes.into_iter().enumerate() {
            let poll = Poll::new()?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
            let uring = split_ring(cfg, &poll)?;
            if wake {
                match &uring {
                    Some(u) => lane.set_waker(u.waker()),
                    None => {
                        let w2 = waker.clone();
                        lane.set_waker(move || {
                            let _ = w2.wake();
                        });
                    }
                }
            }
            if i == 0 {
                tracing::info!(
                    backend = if uring.is_some() { "io_uring" } else { "epoll" },
                    "director split connections"
                );
            }
            let mut listener = TcpListener::from_std(std_listener.try_clone()?);
            poll.registry()
                .register(&mut listener, LISTENER, Interest::READABLE)?;
            let worker = Worker::new(
                cfg,
                poll,
                listener,
                app.clone(),
                cache.clone(),
                exposed.clone(),
                lane,
                stop.clone(),
                stats.clone(),
                budget.clone(),
                uring,
            );
            workers.push((worker, waker));
        }
        Ok(Built {
            local,
            stop,
            stats,
            budget,
            workers,
        })
    }
}

/// A listening socket with `IP_TRANSPARENT` set before it binds `addr` (IPv4): it accepts
/// the connections that TPROXY rules divert to it, whatever address their clients connected
/// to.
fn transparent_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a transparent director listens on an IPv4 address",
        ));
    };
    // SAFETY: a new socket; on success its descriptor is owned by the listener below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket this function just made and owns.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    for (level, opt) in [
        (libc::SOL_IP, libc::IP_TRANSPARENT),
        (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    ] {
        // SAFETY: an int option of the socket, read from a live local.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("transparent listener (needs CAP_NET_ADMIN): {e}"),
            ));
        }
    }
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a sockaddr_in of the right size for an AF_INET socket.
    let r = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on the bound socket.
    if unsafe { libc::listen(fd, 1024) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(listener)
}
