//! Storage devices under the file service.
//!
//! A [`Device`] is a flat array of bytes addressed by device offset. Data-path I/O is
//! asynchronous: [`Device::submit`] queues an operation that reads into / writes from a raw
//! buffer and [`Device::poll`] reaps completions. Metadata uses the synchronous helpers.
//! Both follow O_DIRECT rules: offsets and lengths are multiples of [`Device::block_size`],
//! buffer addresses multiples of [`Device::mem_align`].

use std::io;
use std::os::fd::BorrowedFd;

mod gate;
mod mem;
mod uring;

pub use gate::SyncGate;
pub use mem::{FaultInjector, MemDevice};
pub use uring::{DeviceLock, UringDevice, DEFAULT_QUEUE_DEPTH};

/// Synchronous access to a device from another thread (the file service's metadata thread):
/// the same helpers as [`Device`]'s, on their own handle, so a metadata commit and its
/// `fdatasync` never run on the thread that drives the data path.
pub trait MetaIo: Send {
    /// Synchronous aligned read.
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Synchronous aligned write. Not durable until [`sync`](MetaIo::sync).
    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes `[offset, offset+len)` read as zeros (block aligned). Not durable until `sync`.
    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()>;
    /// fdatasync: makes every completed write durable (data-path writes included).
    fn sync(&mut self) -> io::Result<()>;
}

/// A device's own synchronous helpers seen as [`MetaIo`] (metadata committed inline).
pub(crate) struct DevIo<'a>(pub &'a mut dyn Device);

impl MetaIo for DevIo<'_> {
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_sync(offset, buf)
    }
    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.0.write_sync(offset, buf)
    }
    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.0.zero_sync(offset, len)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.0.sync()
    }
}

/// One asynchronous device operation.
#[derive(Debug, Clone, Copy)]
pub enum DevOp {
    /// Read `len` bytes at device `offset` into `buf`.
    Read {
        /// Device byte offset (block aligned).
        offset: u64,
        /// Destination (aligned to `mem_align`), valid for `len` bytes until completion.
        buf: *mut u8,
        /// Length (block multiple).
        len: u32,
    },
    /// Write `len` bytes from `buf` at device `offset`.
    Write {
        /// Device byte offset (block aligned).
        offset: u64,
        /// Source (aligned to `mem_align`), valid for `len` bytes until completion.
        buf: *const u8,
        /// Length (block multiple).
        len: u32,
    },
    /// Make all completed writes durable (fdatasync).
    Flush,
}

/// A reaped completion: `result` is the byte count (≥ 0) or a negated errno.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DevCompletion {
    /// The value passed to [`Device::submit`].
    pub user_data: u64,
    /// Bytes transferred, or `-errno`.
    pub result: i32,
}

/// [`Device::submit`] refused the operation because the queue is full; poll and retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBusy;

/// A block device driven by the file service's single thread.
pub trait Device: Send {
    /// O_DIRECT alignment unit for offsets and lengths (power of two, ≥ 512).
    fn block_size(&self) -> u32;
    /// Required alignment of buffer addresses (power of two, ≤ block size).
    fn mem_align(&self) -> usize;
    /// Usable size in bytes (a multiple of the block size).
    fn capacity(&self) -> u64;
    /// Maximum number of submitted, not yet reaped operations.
    fn queue_depth(&self) -> usize;
    /// Operations submitted and not yet reaped by [`poll`](Device::poll).
    fn inflight(&self) -> usize;

    /// Queues `op`. Never blocks: returns [`DeviceBusy`] when `queue_depth` operations are
    /// outstanding. Alignment or range errors are reported through the completion.
    ///
    /// # Safety
    /// The buffer of a read/write must stay valid (and, for reads, not be accessed) until its
    /// completion has been returned by [`poll`](Device::poll).
    unsafe fn submit(&mut self, op: DevOp, user_data: u64) -> Result<(), DeviceBusy>;

    /// Reaps up to `out.len()` completions without blocking; returns how many were written.
    /// Also pushes queued submissions to the device.
    fn poll(&mut self, out: &mut [DevCompletion]) -> usize;

    /// Blocks until at least one completion can be reaped (returns at once if nothing is in
    /// flight).
    fn wait(&mut self) -> io::Result<()>;

    /// Registers `[ptr, ptr + len)` as memory that reads and writes will target, so that the
    /// device need not pin its pages on every operation (io_uring fixed buffers). Returns
    /// false when the device cannot (no support, no table slot left, the memory-lock limit):
    /// operations on the memory still work, unregistered. Operations on other memory are
    /// unaffected.
    ///
    /// # Safety
    /// The memory stays allocated until [`unregister_memory`](Device::unregister_memory) is
    /// called with the same `ptr` or the device is dropped.
    unsafe fn register_memory(&mut self, ptr: *mut u8, len: usize) -> bool {
        let _ = (ptr, len);
        false
    }

    /// Forgets memory registered at `ptr` (nothing if none was). Operations in flight on it
    /// complete normally.
    fn unregister_memory(&mut self, ptr: *mut u8) {
        let _ = ptr;
    }

    /// Synchronous aligned read (metadata path).
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Synchronous aligned write (metadata path). Not durable until [`sync`](Device::sync).
    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes `[offset, offset+len)` read as zeros (block aligned). Not durable until `sync`.
    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()>;
    /// fdatasync: makes every completed write durable.
    fn sync(&mut self) -> io::Result<()>;

    /// A second handle on the same storage for synchronous metadata I/O from another thread,
    /// or `None` if this device cannot provide one (metadata is then committed inline).
    fn meta_io(&self) -> Option<io::Result<Box<dyn MetaIo>>> {
        None
    }

    /// A descriptor that `poll(2)` reports readable once a submitted operation has completed
    /// (what [`poll`](Device::poll) pushed to the device), so that a caller can wait for the
    /// device and other events at once; `None` if the device completes operations within
    /// `poll` itself.
    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

impl Device for Box<dyn Device> {
    fn block_size(&self) -> u32 {
        (**self).block_size()
    }
    fn mem_align(&self) -> usize {
        (**self).mem_align()
    }
    fn capacity(&self) -> u64 {
        (**self).capacity()
    }
    fn queue_depth(&self) -> usize {
        (**self).queue_depth()
    }
    fn inflight(&self) -> usize {
        (**self).inflight()
    }
    unsafe fn submit(&mut self, op: DevOp, user_data: u64) -> Result<(), DeviceBusy> {
        // SAFETY: same contract as the caller's.
        unsafe { (**self).submit(op, user_data) }
    }
    fn poll(&mut self, out: &mut [DevCompletion]) -> usize {
        (**self).poll(out)
    }
    fn wait(&mut self) -> io::Result<()> {
        (**self).wait()
    }
    unsafe fn register_memory(&mut self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: same contract as the caller's.
        unsafe { (**self).register_memory(ptr, len) }
    }
    fn unregister_memory(&mut self, ptr: *mut u8) {
        (**self).unregister_memory(ptr)
    }
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_sync(offset, buf)
    }
    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        (**self).write_sync(offset, buf)
    }
    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        (**self).zero_sync(offset, len)
    }
    fn sync(&mut self) -> io::Result<()> {
        (**self).sync()
    }
    fn meta_io(&self) -> Option<io::Result<Box<dyn MetaIo>>> {
        (**self).meta_io()
    }
    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        (**self).completion_fd()
    }
}

/// Checks O_DIRECT rules for a buffer/offset/length triple.
pub(crate) fn check_aligned(
    offset: u64,
    addr: usize,
    len: u64,
    block: u64,
    mem_align: usize,
) -> io::Result<()> {
    if !offset.is_multiple_of(block)
        || !len.is_multiple_of(block)
        || !addr.is_multiple_of(mem_align)
    {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(())
}
