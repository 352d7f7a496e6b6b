//! Storage backends of the pagestore server.
//!
//! - [`OsStorage`]: regular files in a directory, read and written with io_uring (one ring per
//!   server worker thread). Requests whose offset, length and buffer are aligned to the file's
//!   direct-I/O alignment go through an `O_DIRECT` descriptor; other requests go through a
//!   second, buffered descriptor of the same file (still through io_uring). This is the paper's
//!   baseline: the host application with kernel TCP and OS files.
//! - [`DdsStorage`]: DDS files through the host library (`dds-host`), the file service running
//!   in the DPU process. One notification group serves all workers; a completion thread
//!   PollWaits on it and hands each completion to the worker that issued it.

use std::alloc::Layout;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crossbeam_queue::ArrayQueue;
use dds_host::{Dds, GroupConfig, Status};

use crate::pattern;

/// A completed I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    /// DDS status code (0 = OK).
    pub status: u16,
    pub bytes: u32,
}

/// Why a submission was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The backend is full: retry after some completions.
    Busy,
    /// The request failed at once with this status.
    Failed(u16),
}

/// The I/O interface of one server worker thread.
pub trait WorkerIo: Send {
    /// Starts a read (`write == false`) into, or a write from, `buf[..len]`.
    ///
    /// # Safety
    /// `buf .. buf+len` stays valid (and, for a read, untouched) until the completion carrying
    /// `token` is returned by [`WorkerIo::reap`].
    unsafe fn submit(
        &mut self,
        write: bool,
        file: u32,
        offset: u64,
        buf: *mut u8,
        len: u32,
        token: u64,
    ) -> Result<(), SubmitError>;
    /// Hands batched submissions to the device.
    fn commit(&mut self);
    /// A descriptor that becomes readable when completions may be waiting.
    fn event_fd(&self) -> BorrowedFd<'_>;
    /// Appends the completions that are ready.
    fn reap(&mut self, out: &mut Vec<Completion>);
    /// Operations submitted and not yet reaped.
    fn inflight(&self) -> usize;
}

/// A storage backend: the files and a factory of per-worker I/O interfaces.
pub trait Storage: Send + Sync {
    fn name(&self) -> &'static str;
    /// File ids clients use, in file order (f0, f1, ...).
    fn file_ids(&self) -> &[u32];
    fn file_size(&self) -> u64;
    /// The I/O interface of worker `index` (`index < workers` given at construction).
    fn worker(&self, index: usize) -> Result<Box<dyn WorkerIo>>;
    /// Stops background threads (after every worker finished).
    fn shutdown(&self) {}
}

/// The set of file ids a server accepts.
#[derive(Clone, Debug)]
pub struct FileSet {
    ids: HashSet<u32>,
    pub file_size: u64,
}

impl FileSet {
    pub fn new(ids: &[u32], file_size: u64) -> FileSet {
        FileSet {
            ids: ids.iter().copied().collect(),
            file_size,
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }
}

// ---------------------------------------------------------------------------------------------
// Aligned buffers

/// Buffer alignment of every I/O buffer (enough for O_DIRECT on any device here).
pub const BUF_ALIGN: usize = 4096;

/// A heap buffer aligned to [`BUF_ALIGN`], its capacity a multiple of it.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    cap: usize,
}

// SAFETY: the buffer is plain owned memory.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let cap = len.max(1).next_multiple_of(BUF_ALIGN);
        let layout = Layout::from_size_align(cap, BUF_ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, cap }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `cap` initialised bytes (zeroed at allocation).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and we hold `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.cap, BUF_ALIGN).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A free list of aligned buffers per power-of-two size class (bounded).
pub struct BufPool {
    classes: Vec<Vec<AlignedBuf>>,
    keep: usize,
}

impl BufPool {
    pub fn new(keep_per_class: usize) -> BufPool {
        BufPool {
            classes: (0..=20).map(|_| Vec::new()).collect(),
            keep: keep_per_class,
        }
    }

    fn class(len: usize) -> usize {
        let cap = len.max(BUF_ALIGN).next_power_of_two();
        (cap.trailing_zeros() - BUF_ALIGN.trailing_zeros()) as usize
    }

    pub fn get(&mut self, len: usize) -> AlignedBuf {
        let c = Self::class(len);
        match self.classes.get_mut(c).and_then(|v| v.pop()) {
            Some(b) => b,
            None => AlignedBuf::new(len.max(BUF_ALIGN).next_power_of_two()),
        }
    }

    pub fn put(&mut self, b: AlignedBuf) {
        if !b.cap.is_power_of_two() {
            return;
        }
        let c = Self::class(b.cap);
        if let Some(v) = self.classes.get_mut(c) {
            if v.len() < self.keep {
                v.push(b);
            }
        }
    }
}

fn new_eventfd() -> Result<OwnedFd> {
    rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )
    .context("eventfd")
}

fn drain_eventfd(fd: &OwnedFd) {
    let mut v = [0u8; 8];
    let _ = rustix::io::read(fd, &mut v);
}

fn signal_eventfd(fd: &OwnedFd) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

fn errno_status(errno: i32) -> u16 {
    match errno {
        libc::EINVAL => Status::InvalidArgument,
        libc::EFBIG => Status::OutOfRange,
        libc::ENOSPC => Status::NoSpace,
        libc::EAGAIN | libc::EBUSY => Status::Busy,
        _ => Status::Io,
    }
    .code()
}

// ---------------------------------------------------------------------------------------------
// OS files + io_uring

/// How a new or grown file is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// The deterministic pattern of [`crate::pattern`] (real data on the device).
    Pattern,
    /// Leave as created (unwritten extents).
    None,
}

struct OsFile {
    direct: File,
    buffered: File,
}

/// Regular files `f0..fN-1` in a directory.
pub struct OsStorage {
    files: Vec<OsFile>,
    ids: Vec<u32>,
    file_size: u64,
    align: u64,
    queue_depth: u32,
}

/// Direct-I/O offset alignment of a file (statx DIOALIGN), at least 512.
fn dio_alignment(file: &File) -> u64 {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    if let Ok(st) = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && st.stx_dio_offset_align > 0 {
            return (st.stx_dio_offset_align as u64)
                .max(st.stx_dio_mem_align as u64)
                .max(512)
                .next_power_of_two();
        }
    }
    4096
}

impl OsStorage {
    /// Opens (creating and sizing when needed) `dir/f0 .. dir/f{files-1}`.
    pub fn open(dir: &Path, files: usize, file_size: u64, fill: Fill) -> Result<OsStorage> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let mut out = Vec::with_capacity(files);
        let mut align = 512u64;
        for i in 0..files {
            let path = dir.join(format!("f{i}"));
            let buffered = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .with_context(|| format!("open {}", path.display()))?;
            let len = buffered.metadata()?.len();
            if len < file_size {
                buffered.set_len(file_size)?;
                if fill == Fill::Pattern {
                    fill_file(&buffered, i as u32, len, file_size)?;
                }
            }
            let direct = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
                .open(&path)
                .with_context(|| format!("open {} with O_DIRECT", path.display()))?;
            align = align.max(dio_alignment(&direct));
            out.push(OsFile { direct, buffered });
        }
        Ok(OsStorage {
            ids: (0..files as u32).collect(),
            files: out,
            file_size,
            align,
            queue_depth: 256,
        })
    }

    /// The direct-I/O alignment requests must meet to bypass the page cache.
    pub fn direct_alignment(&self) -> u64 {
        self.align
    }
}

fn fill_file(f: &File, id: u32, from: u64, to: u64) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = from & !7;
    while off < to {
        let n = ((to - off) as usize).min(buf.len());
        pattern::fill(id, off, &mut buf[..n]);
        let mut done = 0;
        while done < n {
            done += rustix::io::pwrite(f, &buf[done..n], off + done as u64).context("fill file")?;
        }
        off += n as u64;
    }
    f.sync_all()?;
    Ok(())
}

struct UringIo {
    ring: io_uring::IoUring,
    eventfd: OwnedFd,
    fds: Vec<(i32, i32)>,
    align: u64,
    inflight: usize,
    max_inflight: usize,
    /// Submissions queued since the last `commit`.
    queued: usize,
}

impl Storage for OsStorage {
    fn name(&self) -> &'static str {
        "os"
    }

    fn file_ids(&self) -> &[u32] {
        &self.ids
    }

    fn file_size(&self) -> u64 {
        self.file_size
    }

    fn worker(&self, _index: usize) -> Result<Box<dyn WorkerIo>> {
        let ring = io_uring::IoUring::new(self.queue_depth).context("io_uring_setup")?;
        let eventfd = new_eventfd()?;
        ring.submitter()
            .register_eventfd(eventfd.as_raw_fd())
            .context("io_uring register_eventfd")?;
        Ok(Box::new(UringIo {
            ring,
            eventfd,
            fds: self
                .files
                .iter()
                .map(|f| (f.direct.as_raw_fd(), f.buffered.as_raw_fd()))
                .collect(),
            align: self.align,
            inflight: 0,
            max_inflight: self.queue_depth as usize,
            queued: 0,
        }))
    }
}

impl WorkerIo for UringIo {
    unsafe fn submit(
        &mut self,
        write: bool,
        file: u32,
        offset: u64,
        buf: *mut u8,
        len: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        let Some(&(direct, buffered)) = self.fds.get(file as usize) else {
            return Err(SubmitError::Failed(Status::UnknownFile.code()));
        };
        if self.inflight >= self.max_inflight {
            return Err(SubmitError::Busy);
        }
        let aligned = offset.is_multiple_of(self.align)
            && (len as u64).is_multiple_of(self.align)
            && (buf as usize as u64).is_multiple_of(self.align);
        let fd = io_uring::types::Fd(if aligned { direct } else { buffered });
        let sqe = if write {
            io_uring::opcode::Write::new(fd, buf, len)
                .offset(offset)
                .build()
        } else {
            io_uring::opcode::Read::new(fd, buf, len)
                .offset(offset)
                .build()
        }
        .user_data(token);
        // SAFETY: the buffer contract is our caller's; the fds live as long as the storage,
        // which outlives every worker.
        while unsafe { self.ring.submission().push(&sqe) }.is_err() {
            if self.ring.submit().is_err() {
                return Err(SubmitError::Busy);
            }
            self.queued = 0;
        }
        self.queued += 1;
        self.inflight += 1;
        Ok(())
    }

    fn commit(&mut self) {
        if self.queued > 0 {
            match self.ring.submit() {
                Ok(_) => self.queued = 0,
                Err(e) => tracing::warn!(error = %e, "io_uring_enter failed; will retry"),
            }
        }
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.eventfd.as_fd()
    }

    fn reap(&mut self, out: &mut Vec<Completion>) {
        drain_eventfd(&self.eventfd);
        for cqe in self.ring.completion() {
            self.inflight -= 1;
            let r = cqe.result();
            out.push(if r < 0 {
                Completion {
                    token: cqe.user_data(),
                    status: errno_status(-r),
                    bytes: 0,
                }
            } else {
                Completion {
                    token: cqe.user_data(),
                    status: 0,
                    bytes: r as u32,
                }
            });
        }
    }

    fn inflight(&self) -> usize {
        self.inflight
    }
}

// ---------------------------------------------------------------------------------------------
// DDS files through the host library

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
pub struct DdsStorage {
    shared: Arc<DdsShared>,
    ids: Vec<u32>,
    file_size: u64,
    poller: Mutex<Option<JoinHandle<()>>>,
}

/// Bits of a PollWait I/O context that carry the worker's token.
const TOKEN_BITS: u32 = 48;

/// Outstanding operations of the server's notification group.
pub const DDS_GROUP_SLOTS: u16 = 4096;

impl DdsStorage {
    /// Connects to the DPU at `socket`, creates or opens and sizes the files, and starts the
    /// completion thread for `workers` worker threads. A lost DPU is reconnected to.
    pub fn open(
        socket: &Path,
        dir: &str,
        files: usize,
        file_size: u64,
        fill: Fill,
        workers: usize,
    ) -> Result<DdsStorage> {
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
    ) -> Result<DdsStorage> {
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
        Ok(DdsStorage {
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

/// The completion thread: PollWait (sleeping) on the group, routing by the I/O context.
fn poll_completions(s: &DdsShared) {
    let mut dds = s.dds();
    let mut group = dds.default_group().clone();
    let mut dead = false;
    while !s.stop.load(Ordering::Acquire) {
        match group.poll_wait(Duration::from_millis(50)) {
            Ok(Some(c)) => {
                let worker = (c.io_ctx >> TOKEN_BITS) as usize;
                let Some(route) = s.routes.get(worker) else {
                    tracing::error!(io_ctx = c.io_ctx, "completion for an unknown worker");
                    continue;
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
                signal_eventfd(&route.eventfd);
            }
            Ok(None) => {}
            Err(e) => {
                // The DPU is gone: every pending request was completed with `DpuDead` above,
                // and new ones fail when issued. Keep sweeping for requests issued in between.
                if !dead {
                    tracing::error!(error = %e, "the DPU is gone; requests fail with DpuDead");
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

impl Drop for DdsStorage {
    fn drop(&mut self) {
        Storage::shutdown(self);
    }
}

struct DdsIo {
    shared: Arc<DdsShared>,
    index: usize,
    inflight: usize,
}

impl Storage for DdsStorage {
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

    fn inflight(&self) -> usize {
        self.inflight
    }
}

/// Which backend a server uses.
#[derive(Clone, Debug)]
pub enum BackendSpec {
    Os {
        dir: PathBuf,
    },
    Dds {
        socket: PathBuf,
        dir: String,
        on_loss: OnDpuLoss,
    },
}

/// Opens the backend for `workers` worker threads.
pub fn open_storage(
    spec: &BackendSpec,
    files: usize,
    file_size: u64,
    fill: Fill,
    workers: usize,
) -> Result<Arc<dyn Storage>> {
    if files == 0 {
        bail!("at least one file");
    }
    Ok(match spec {
        BackendSpec::Os { dir } => Arc::new(OsStorage::open(dir, files, file_size, fill)?),
        BackendSpec::Dds {
            socket,
            dir,
            on_loss,
        } => Arc::new(DdsStorage::open_with(
            socket, dir, files, file_size, fill, workers, *on_loss,
        )?),
    })
}
