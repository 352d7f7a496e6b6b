//! Files served to worker threads with asynchronous I/O: the backends of the pagestore server.
//!
//! - [`OsAsyncStorage`]: regular files in a directory, read and written with io_uring (one ring
//!   per server worker thread). Requests whose offset, length and buffer are aligned to the
//!   file's direct-I/O alignment go through an `O_DIRECT` descriptor; other requests go through
//!   a second, buffered descriptor of the same file (still through io_uring). This is the
//!   paper's baseline: the host application with kernel TCP and OS files.
//! - [`DdsAsyncStorage`]: DDS files through the host library (`dds-host`), the file service
//!   running in the DPU process. One notification group serves all workers; a completion
//!   thread PollWaits on it and hands each completion to the worker that issued it.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crossbeam_queue::ArrayQueue;
use dds_host::{Dds, GroupConfig, Status};

use crate::pattern;

mod dds;
mod os;

pub use dds::{DdsAsyncStorage, OnDpuLoss, DDS_GROUP_SLOTS};
pub use os::{Fill, OsAsyncStorage};

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
    /// Whether completions are waiting to be reaped, known without a system call (a worker
    /// woken by something else then skips [`WorkerIo::reap`] and its read of the descriptor).
    fn ready(&mut self) -> bool {
        true
    }
    /// Operations submitted and not yet reaped.
    fn inflight(&self) -> usize;
}

/// A storage backend: the files and a factory of per-worker I/O interfaces.
pub trait AsyncStorage: Send + Sync {
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

/// I/O buffers: the workspace's aligned buffer type, aligned to [`BUF_ALIGN`].
pub use dds_sys::AlignedBuf;

/// An I/O buffer of at least `len` bytes, its length a multiple of [`BUF_ALIGN`].
fn io_buffer(len: usize) -> AlignedBuf {
    AlignedBuf::new(len.max(1).next_multiple_of(BUF_ALIGN), BUF_ALIGN)
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
            None => io_buffer(len.max(BUF_ALIGN).next_power_of_two()),
        }
    }

    pub fn put(&mut self, b: AlignedBuf) {
        if !b.len().is_power_of_two() {
            return;
        }
        let c = Self::class(b.len());
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
pub fn open_async_storage(
    spec: &BackendSpec,
    files: usize,
    file_size: u64,
    fill: Fill,
    workers: usize,
) -> Result<Arc<dyn AsyncStorage>> {
    if files == 0 {
        bail!("at least one file");
    }
    Ok(match spec {
        BackendSpec::Os { dir } => Arc::new(OsAsyncStorage::open(dir, files, file_size, fill)?),
        BackendSpec::Dds {
            socket,
            dir,
            on_loss,
        } => Arc::new(DdsAsyncStorage::open_with(
            socket, dir, files, file_size, fill, workers, *on_loss,
        )?),
    })
}
