//! DDS files through the host library.

use super::*;

/// Completions routed to one worker.
struct Route {
    queue: ArrayQueue<Completion>,
    eventfd: OwnedFd,
}

/// What the server does when the DPU goes away (its process died or stopped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDpuLoss {
    /// Answer requests with `DpuDead` meanwhile and reconnect with bounded exponential
    /// backoff (50 ms doubling to 2 s), for `give_up_after` at most (`None`: forever); then
    /// the files are checked (same ids), exposed again, and served again.
    Reconnect { give_up_after: Option<Duration> },
    /// Exit the process with a clear error (status 3).
    Exit,
}

struct DdsShared {
    /// The current connection: replaced when the DPU comes back.
    dds: RwLock<Arc<Dds>>,
    socket: PathBuf,
    config: dds_host::Config,
    /// The served files' paths, in id order.
    paths: Vec<String>,
    ids: Vec<u32>,
    on_loss: OnDpuLoss,
    routes: Vec<Route>,
    stop: AtomicBool,
}

impl DdsShared {
    fn dds(&self) -> Arc<Dds> {
        self.dds.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// DDS files `/pagestore/f0 .. f{N-1}` on a running DPU.
pub struct DdsAsyncStorage {
    shared: Arc<DdsShared>,
    ids: Vec<u32>,
    file_size: u64,
    poller: Mutex<Option<JoinHandle<()>>>,
}

/// Bits of a PollWait I/O context that carry the worker's token.
const TOKEN_BITS: u32 = 48;

/// Outstanding operations of the server's notification group.
pub const DDS_GROUP_SLOTS: u16 = 4096;

impl DdsAsyncStorage {
    /// Connects to the DPU at `socket`, creates or opens and sizes the files, and starts the
    /// completion thread for `workers` worker threads. A lost DPU is reconnected to.
    pub fn open(
        socket: &Path,
        dir: &str,
        files: usize,
        file_size: u64,
        fill: Fill,
        workers: usize,
    ) -> Result<DdsAsyncStorage> {
        let on_loss = OnDpuLoss::Reconnect {
            give_up_after: None,
        };
        Self::open_with(socket, dir, files, file_size, fill, workers, on_loss)
    }

    /// As [`open`](Self::open), choosing what happens when the DPU goes away.
    pub fn open_with(
        socket: &Path,
        dir: &str,
        files: usize,
        file_size: u64,
        fill: Fill,
        workers: usize,
        on_loss: OnDpuLoss,
    ) -> Result<DdsAsyncStorage> {
        let config = dds_host::Config {
            default_group: GroupConfig {
                request_ring_bytes: 16 << 20,
                response_ring_bytes: 16 << 20,
                max_outstanding: DDS_GROUP_SLOTS,
                max_inflight_bytes: 0,
            },
            ..dds_host::Config::default()
        };
        let dds = Dds::connect_with(socket, config.clone())
            .with_context(|| format!("connect to the DPU at {}", socket.display()))?;
        match dds.create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.status == Status::Exists => {}
            Err(e) => bail!("create {dir}: {e}"),
        }
        let chunk = dds.hello().max_io_bytes.clamp(4096, 1 << 20) as usize;
        let mut ids = Vec::with_capacity(files);
        let mut paths = Vec::with_capacity(files);
        let mut buf = vec![0u8; chunk];
        for i in 0..files {
            let path = format!("{}/f{i}", dir.trim_end_matches('/'));
            let info = dds
                .open_or_create(&path)
                .with_context(|| format!("open or create DDS file {path}"))?;
            // The application serves these files to its network clients: the DPU's offload
            // engine may read them (and cache-on-write learns their pages) from now on.
            dds.expose_file(info.id, true)
                .with_context(|| format!("expose DDS file {path} to the offload engine"))?;
            if info.size < file_size {
                dds.set_file_size(info.id, file_size)
                    .with_context(|| format!("size DDS file {path}"))?;
                if fill == Fill::Pattern {
                    let mut off = info.size & !7;
                    while off < file_size {
                        let n = ((file_size - off) as usize).min(chunk);
                        pattern::fill(info.id, off, &mut buf[..n]);
                        dds.write_sync(info.id, off, &buf[..n])
                            .with_context(|| format!("fill DDS file {path}"))?;
                        off += n as u64;
                    }
                }
            }
            ids.push(info.id);
            paths.push(path);
        }
        let routes = (0..workers.max(1))
            .map(|_| {
                Ok(Route {
                    queue: ArrayQueue::new(DDS_GROUP_SLOTS as usize),
                    eventfd: new_eventfd()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = Arc::new(DdsShared {
            dds: RwLock::new(Arc::new(dds)),
            socket: socket.to_path_buf(),
            config,
            paths,
            ids: ids.clone(),
            on_loss,
            routes,
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let poller = std::thread::Builder::new()
            .name("dds-completions".into())
            .spawn(move || poll_completions(&s))?;
        Ok(DdsAsyncStorage {
            shared,
            ids,
            file_size,
            poller: Mutex::new(Some(poller)),
        })
    }
}

/// A new connection to a DPU that came back: the same files (same ids), exposed again.
fn reconnect(s: &DdsShared) -> Result<Dds> {
    let dds = Dds::connect_with(&s.socket, s.config.clone())?;
    for (path, &id) in s.paths.iter().zip(&s.ids) {
        let info = dds
            .lookup(path)
            .with_context(|| format!("look up {path}"))?;
        if info.id != id {
            bail!("{path} has id {} on the DPU now, {id} before", info.id);
        }
        dds.expose_file(id, true)?;
    }
    Ok(dds)
}

/// After the DPU went away: exits, or reconnects with backoff. Returns false when the
/// storage stops (or gives up) instead.
fn recover(s: &DdsShared) -> bool {
    let give_up_after = match s.on_loss {
        OnDpuLoss::Exit => {
            eprintln!(
                "dds app: the DPU at {} is gone; exiting (--on-dpu-loss exit)",
                s.socket.display()
            );
            std::process::exit(3);
        }
        OnDpuLoss::Reconnect { give_up_after } => give_up_after,
    };
    let start = std::time::Instant::now();
    let mut backoff = Duration::from_millis(50);
    while !s.stop.load(Ordering::Acquire) {
        match reconnect(s) {
            Ok(dds) => {
                tracing::warn!(socket = %s.socket.display(), "reconnected to the DPU");
                *s.dds.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(dds);
                return true;
            }
            Err(e) => {
                if give_up_after.is_some_and(|g| start.elapsed() >= g) {
                    tracing::error!(error = %e, "the DPU did not come back: giving up");
                    return false;
                }
                tracing::debug!(error = %e, ?backoff, "DPU not back yet");
            }
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
    false
}

/// Completions the completion thread routes before it signals the workers.
const COMPLETION_BATCH: usize = 64;

/// Hands completion `c` to its worker's queue; returns the worker's index.
fn route_completion(s: &DdsShared, c: &dds_host::Completion) -> Option<usize> {
    let worker = (c.io_ctx >> TOKEN_BITS) as usize;
    let Some(route) = s.routes.get(worker) else {
        tracing::error!(io_ctx = c.io_ctx, "completion for an unknown worker");
        return None;
    };
    let mut done = Completion {
        token: c.io_ctx & ((1 << TOKEN_BITS) - 1),
        status: c.status.code(),
        bytes: c.bytes,
    };
    // The queue holds as many entries as the group has slots: it never stays full.
    while let Err(back) = route.queue.push(done) {
        done = back;
        std::thread::yield_now();
    }
    Some(worker)
}

/// The completion thread: PollWait (sleeping) on the group, routing by the I/O context.
/// After each wake-up it takes every completion already there, then signals each worker that
/// got some once: a burst of completions costs one wake-up per worker, not one per read.
fn poll_completions(s: &DdsShared) {
    let mut dds = s.dds();
    let mut group = dds.default_group().clone();
    let mut dead = false;
    let mut touched = vec![false; s.routes.len()];
    while !s.stop.load(Ordering::Acquire) {
        match group.poll_wait(Duration::from_millis(50)) {
            Ok(Some(c)) => {
                // At most a ring's worth per batch, so that workers hear of the first ones
                // while completions keep coming.
                let mut next = Some(c);
                let mut n = 0;
                while let Some(c) = next {
                    if let Some(w) = route_completion(s, &c) {
                        touched[w] = true;
                    }
                    n += 1;
                    next = if n < COMPLETION_BATCH {
                        group.poll_wait(Duration::ZERO).ok().flatten()
                    } else {
                        None
                    };
                }
                for (w, t) in touched.iter_mut().enumerate() {
                    if std::mem::take(t) {
                        signal_eventfd(&s.routes[w].eventfd);
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                // The DPU is gone: every pending request was completed with `DpuDead` above,
                // and new ones fail when issued. Keep sweeping for requests issued in between.
                if !dead {
                    // A warning, not an error: stopping the DPU before its applications is an
                    // ordinary shutdown order, and the application goes on (reconnecting).
                    tracing::warn!(
                        error = %e,
                        "the DPU stopped: requests fail with DpuDead until it is back"
                    );
                    dead = true;
                    if recover(s) {
                        dds = s.dds();
                        group = dds.default_group().clone();
                        dead = false;
                        continue;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for DdsAsyncStorage {
    fn drop(&mut self) {
        AsyncStorage::shutdown(self);
    }
}

struct DdsIo {
    shared: Arc<DdsShared>,
    index: usize,
    inflight: usize,
}

impl AsyncStorage for DdsAsyncStorage {
    fn name(&self) -> &'static str {
        "dds"
    }

    fn file_ids(&self) -> &[u32] {
        &self.ids
    }

    fn file_size(&self) -> u64 {
        self.file_size
    }

    fn worker(&self, index: usize) -> Result<Box<dyn WorkerIo>> {
        if index >= self.shared.routes.len() {
            bail!(
                "worker {index} beyond the {} routes",
                self.shared.routes.len()
            );
        }
        Ok(Box::new(DdsIo {
            shared: self.shared.clone(),
            index,
            inflight: 0,
        }))
    }

    fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Release);
        let handle = self.poller.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl WorkerIo for DdsIo {
    unsafe fn submit(
        &mut self,
        write: bool,
        file: u32,
        offset: u64,
        buf: *mut u8,
        len: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        debug_assert!(token < (1 << TOKEN_BITS));
        let ctx = ((self.index as u64) << TOKEN_BITS) | token;
        let r = if write {
            // SAFETY: the caller keeps `buf[..len]` valid; the library copies it into the
            // request ring before returning.
            let data = unsafe { std::slice::from_raw_parts(buf, len as usize) };
            self.shared.dds().write(file, offset, data, ctx)
        } else {
            // SAFETY: forwarded from our caller.
            unsafe { self.shared.dds().read(file, offset, buf, len, ctx) }
        };
        match r {
            Ok(()) => {
                self.inflight += 1;
                Ok(())
            }
            Err(e) if matches!(e.status, Status::RingFull | Status::TooManyOutstanding) => {
                Err(SubmitError::Busy)
            }
            Err(e) => Err(SubmitError::Failed(e.status.code())),
        }
    }

    fn commit(&mut self) {}

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.shared.routes[self.index].eventfd.as_fd()
    }

    fn reap(&mut self, out: &mut Vec<Completion>) {
        let route = &self.shared.routes[self.index];
        drain_eventfd(&route.eventfd);
        while let Some(c) = route.queue.pop() {
            self.inflight = self.inflight.saturating_sub(1);
            out.push(c);
        }
    }

    fn ready(&mut self) -> bool {
        !self.shared.routes[self.index].queue.is_empty()
    }

    fn inflight(&self) -> usize {
        self.inflight
    }
}
