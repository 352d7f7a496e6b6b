//! io_uring + O_DIRECT device over a block device or a preallocated regular file.

use super::gate::{GatedMetaIo, SyncGate};
use super::{check_aligned, DevCompletion, DevOp, Device, DeviceBusy, MetaIo};
use crate::align::AlignedBuf;
use crate::error::FsError;
use io_uring::{opcode, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

// Linux block-device ioctls (include/uapi/linux/fs.h).
const BLKSSZGET: libc::c_ulong = 0x1268; // _IO(0x12, 104)
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272; // _IOR(0x12, 114, size_t)
const BLKZEROOUT: libc::c_ulong = 0x127f; // _IO(0x12, 127)

/// Size of the zero buffer used when the kernel cannot zero a range for us.
const ZERO_CHUNK: usize = 1 << 20;

/// Default io_uring queue depth.
pub const DEFAULT_QUEUE_DEPTH: usize = 128;

/// The exclusive advisory lock (`flock`) on a device: held by a running file service for as long
/// as it uses the device, and by `dds format` before it writes anything. It sits on its own
/// read-only open file description, so it is released as soon as its holder closes it, even if
/// the kernel tears an io_uring that references the data descriptor down asynchronously.
#[derive(Debug)]
pub struct DeviceLock {
    file: File,
}

impl DeviceLock {
    /// Locks the existing device `path`; fails if another process holds the lock.
    pub fn acquire(path: impl AsRef<Path>) -> Result<DeviceLock, FsError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| FsError::io(&format!("open {} for locking", path.display()), e))?;
        DeviceLock::lock(path, file)
    }

    /// Creates the new, empty regular file `path` (mode 0600; an existing path is an error)
    /// and locks it.
    pub fn create(path: impl AsRef<Path>) -> Result<DeviceLock, FsError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_CREAT | libc::O_EXCL)
            .mode(0o600)
            .open(path)
            .map_err(|e| FsError::io(&format!("create {}", path.display()), e))?;
        DeviceLock::lock(path, file)
    }

    fn lock(path: &Path, file: File) -> Result<DeviceLock, FsError> {
        rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| {
                FsError::io(
                    &format!("{} is in use by another process (flock)", path.display()),
                    e.into(),
                )
            },
        )?;
        Ok(DeviceLock { file })
    }

    /// Reads up to `buf.len()` bytes from the start of the device; returns how many.
    pub fn read_head(&self, buf: &mut [u8]) -> Result<usize, FsError> {
        use std::os::unix::fs::FileExt as _;
        let mut got = 0;
        while got < buf.len() {
            match self.file.read_at(&mut buf[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::io("read device", e)),
            }
        }
        Ok(got)
    }
}

/// A device driven through io_uring with O_DIRECT.
///
/// Submissions are queued in the submission ring and handed to the kernel by
/// [`poll`](Device::poll) / [`wait`](Device::wait) (one `io_uring_enter` per batch). At most
/// `queue_depth` operations are outstanding; beyond that `submit` returns [`DeviceBusy`].
pub struct UringDevice {
    /// The device file (registered with the ring) and the synchronous helpers on it.
    sync: SyncFile,
    /// Holds the exclusive advisory lock on the device.
    _lock: File,
    path: PathBuf,
    ring: IoUring,
    block_size: u32,
    mem_align: usize,
    capacity: u64,
    queue_depth: usize,
    inflight: usize,
    /// Syncs of the metadata handles given out wait at this gate ([`with_meta_gate`]).
    ///
    /// [`with_meta_gate`]: UringDevice::with_meta_gate
    meta_gate: Option<Arc<SyncGate>>,
    /// The ring's table of fixed buffers (`None`: the kernel refused a table).
    fixed: Option<FixedTable>,
}

/// Slots in the ring's fixed-buffer table.
const FIXED_SLOTS: u16 = 64;
/// io_uring's limit on one fixed buffer.
const FIXED_MAX_BYTES: usize = 1 << 30;

/// Memory registered with the ring ([`Device::register_memory`]): reads and writes inside one
/// of these ranges are submitted as `READ_FIXED`/`WRITE_FIXED`, which skip pinning the pages.
struct FixedTable {
    /// `(start, end, slot)`, sorted by start.
    ranges: Vec<(usize, usize, u16)>,
    free: Vec<u16>,
    /// Operations submitted on fixed buffers (a figure for tests and stats).
    ops: u64,
    /// A registration was refused (logged once).
    refused: bool,
}

impl FixedTable {
    /// The slot of the registered range holding `[ptr, ptr + len)`, if any.
    fn lookup(&self, ptr: usize, len: usize) -> Option<u16> {
        let k = self.ranges.partition_point(|r| r.0 <= ptr);
        let &(_, end, slot) = self.ranges.get(k.checked_sub(1)?)?;
        (ptr.checked_add(len)? <= end).then_some(slot)
    }
}

/// Synchronous O_DIRECT access to the device file (the metadata path): the device's own
/// helpers, and the [`MetaIo`] handle given to the metadata thread (a duplicate descriptor of
/// the same open file, so both see the same O_DIRECT file description).
struct SyncFile {
    file: File,
    block_size: u32,
    mem_align: usize,
    capacity: u64,
    is_block_device: bool,
    zero_buf: Option<AlignedBuf>,
}

impl UringDevice {
    /// Opens `path` (block device or regular file) with O_DIRECT and an io_uring of
    /// `queue_depth` entries (1 ..= 4096).
    pub fn open(path: impl AsRef<Path>, queue_depth: usize) -> Result<UringDevice, FsError> {
        let path = path.as_ref();
        if queue_depth == 0 || queue_depth > 4096 {
            return Err(FsError::InvalidConfig(format!(
                "queue depth {queue_depth} not in 1..=4096"
            )));
        }
        let lock = DeviceLock::acquire(path)?;
        UringDevice::open_locked(path, queue_depth, lock)
    }

    /// As [`open`](Self::open), with the device lock already taken by the caller.
    pub fn open_locked(
        path: impl AsRef<Path>,
        queue_depth: usize,
        lock: DeviceLock,
    ) -> Result<UringDevice, FsError> {
        let path = path.as_ref();
        if queue_depth == 0 || queue_depth > 4096 {
            return Err(FsError::InvalidConfig(format!(
                "queue depth {queue_depth} not in 1..=4096"
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| FsError::io(&format!("open {} with O_DIRECT", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| FsError::io("fstat device", e))?;
        let is_block_device = meta.file_type().is_block_device();
        let (block_size, mem_align, capacity) = if is_block_device {
            let mut ssz: libc::c_int = 0;
            let mut size: u64 = 0;
            // SAFETY: valid fd and out-pointers of the sizes these ioctls expect.
            let r1 = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET as _, &mut ssz) };
            let r2 = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size) };
            if r1 < 0 || r2 < 0 {
                return Err(FsError::io(
                    "block device size ioctl",
                    io::Error::last_os_error(),
                ));
            }
            let bs = (ssz.max(512) as u32).next_power_of_two();
            (bs, bs as usize, size)
        } else if meta.file_type().is_file() {
            let (off_align, mem_align) = dio_alignment(&file);
            (off_align, mem_align, meta.len())
        } else {
            return Err(FsError::InvalidConfig(format!(
                "{} is neither a block device nor a regular file",
                path.display()
            )));
        };
        let capacity = capacity - capacity % u64::from(block_size);
        let entries = (queue_depth as u32).next_power_of_two();
        let ring = IoUring::new(entries).map_err(|e| FsError::io("io_uring_setup", e))?;
        ring.submitter()
            .register_files(&[file.as_raw_fd()])
            .map_err(|e| FsError::io("io_uring register_files", e))?;
        // A sparse table filled as memory is registered (Linux 5.13); without one, every
        // operation pins its pages.
        let fixed = match ring.submitter().register_buffers_sparse(FIXED_SLOTS.into()) {
            Ok(()) => Some(FixedTable {
                ranges: Vec::with_capacity(FIXED_SLOTS.into()),
                free: (0..FIXED_SLOTS).rev().collect(),
                ops: 0,
                refused: false,
            }),
            Err(e) => {
                tracing::debug!(error = %e, "io_uring fixed buffers unavailable");
                None
            }
        };
        tracing::debug!(
            path = %path.display(),
            block_size,
            mem_align,
            capacity,
            queue_depth,
            "opened io_uring device"
        );
        Ok(UringDevice {
            sync: SyncFile {
                file,
                block_size,
                mem_align,
                capacity,
                is_block_device,
                zero_buf: None,
            },
            _lock: lock.file,
            path: path.to_path_buf(),
            ring,
            block_size,
            mem_align,
            capacity,
            queue_depth,
            inflight: 0,
            meta_gate: None,
            fixed,
        })
    }

    /// Reads and writes submitted on registered memory so far
    /// ([`Device::register_memory`]).
    pub fn fixed_ops(&self) -> u64 {
        self.fixed.as_ref().map_or(0, |t| t.ops)
    }

    /// Makes every `sync` of the metadata handles this device gives out
    /// ([`Device::meta_io`], the file service's metadata thread) wait at `gate` first: a
    /// deliberately slow committer for tests. The device's own syncs are not gated.
    pub fn with_meta_gate(mut self, gate: Arc<SyncGate>) -> UringDevice {
        self.meta_gate = Some(gate);
        self
    }

    /// Creates a new regular file of `size` bytes (mode 0600), preallocated with `fallocate`
    /// where the file system supports it, for use as a device. An existing file is an error.
    pub fn create_file(path: impl AsRef<Path>, size: u64) -> Result<(), FsError> {
        let path = path.as_ref();
        let lock = DeviceLock::create(path)?;
        let r = UringDevice::size_file(&lock, path, size, false);
        if r.is_err() {
            let _ = std::fs::remove_file(path);
        }
        r
    }

    /// Sets the length of the regular file `path`, whose device lock the caller holds, to
    /// `size`: grows it (preallocated where supported); shrinking is refused unless `shrink`.
    /// Never truncates on open.
    pub fn size_file(
        _lock: &DeviceLock,
        path: impl AsRef<Path>,
        size: u64,
        shrink: bool,
    ) -> Result<(), FsError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| FsError::io(&format!("open {} for writing", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| FsError::io("fstat device file", e))?
            .len();
        if len > size {
            if !shrink {
                return Err(FsError::InvalidConfig(format!(
                    "{} holds {len} bytes, more than the size asked for ({size})",
                    path.display()
                )));
            }
            file.set_len(size)
                .map_err(|e| FsError::io("set device file length", e))?;
        } else if len < size {
            match rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, size) {
                Ok(()) => Ok(()),
                Err(_) => file
                    .set_len(size)
                    .map_err(|e| FsError::io("set device file length", e)),
            }?;
        }
        file.sync_all()
            .map_err(|e| FsError::io("sync device file", e))
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn push_submissions(&mut self) {
        if self.ring.submission().is_empty() {
            return;
        }
        loop {
            match self.ring.submit() {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    // The kernel is short of resources; the entries stay queued.
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "io_uring_enter failed; will retry");
                    return;
                }
            }
        }
    }
}

/// O_DIRECT offset and memory alignment of a regular file (statx DIOALIGN), at least 512.
fn dio_alignment(file: &File) -> (u32, usize) {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let mut off_align = 512u32;
    let mut mem_align = 512usize;
    if let Ok(st) = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) {
        if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 {
            if st.stx_dio_offset_align > 0 {
                off_align = st.stx_dio_offset_align.max(512).next_power_of_two();
            }
            if st.stx_dio_mem_align > 0 {
                mem_align = (st.stx_dio_mem_align as usize).max(512).next_power_of_two();
            }
        }
    }
    (off_align, mem_align.min(off_align as usize))
}

fn pwrite_all(file: &File, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pwrite(file, buf, offset) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Ok(n) => {
                buf = &buf[n..];
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn pread_all(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::pread(file, &mut *buf, offset) {
            Ok(0) => return Err(io::Error::from_raw_os_error(libc::EIO)),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl Device for UringDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn mem_align(&self) -> usize {
        self.mem_align
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
    fn inflight(&self) -> usize {
        self.inflight
    }

    unsafe fn submit(&mut self, op: DevOp, user_data: u64) -> Result<(), DeviceBusy> {
        if self.inflight >= self.queue_depth {
            return Err(DeviceBusy);
        }
        let fd = types::Fixed(0);
        let fixed = |buf: *const u8, len: u32| {
            let t = self.fixed.as_ref()?;
            t.lookup(buf as usize, len as usize)
        };
        let sqe = match op {
            DevOp::Read { offset, buf, len } => match fixed(buf, len) {
                Some(i) => opcode::ReadFixed::new(fd, buf, len, i)
                    .offset(offset)
                    .build(),
                None => opcode::Read::new(fd, buf, len).offset(offset).build(),
            },
            DevOp::Write { offset, buf, len } => match fixed(buf, len) {
                Some(i) => opcode::WriteFixed::new(fd, buf, len, i)
                    .offset(offset)
                    .build(),
                None => opcode::Write::new(fd, buf, len).offset(offset).build(),
            },
            DevOp::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
        }
        .user_data(user_data);
        if self.ring.submission().is_full() {
            self.push_submissions();
        }
        // SAFETY: the buffer contract is forwarded to our caller; the fd is registered.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            return Err(DeviceBusy);
        }
        self.inflight += 1;
        let code = sqe.get_opcode();
        if code == u32::from(opcode::ReadFixed::CODE) || code == u32::from(opcode::WriteFixed::CODE)
        {
            if let Some(t) = self.fixed.as_mut() {
                t.ops += 1;
            }
        }
        Ok(())
    }

    unsafe fn register_memory(&mut self, ptr: *mut u8, len: usize) -> bool {
        let Some(t) = self.fixed.as_mut() else {
            return false;
        };
        if len == 0 || len > FIXED_MAX_BYTES || t.lookup(ptr as usize, len).is_some() {
            return false;
        }
        let Some(slot) = t.free.pop() else {
            return false;
        };
        let iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        // SAFETY: the caller keeps the memory allocated until it unregisters it or drops the
        // device (which tears down the ring and its table).
        let r = unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot.into(), &[iov], None)
        };
        match r {
            Ok(()) => {
                let start = ptr as usize;
                let k = t.ranges.partition_point(|r| r.0 <= start);
                t.ranges.insert(k, (start, start + len, slot));
                true
            }
            Err(e) => {
                t.free.push(slot);
                if !t.refused {
                    t.refused = true;
                    tracing::info!(
                        error = %e,
                        bytes = len,
                        "io_uring refused a fixed buffer (memory-lock limit?): its I/O pins pages per operation"
                    );
                }
                false
            }
        }
    }

    fn unregister_memory(&mut self, ptr: *mut u8) {
        let Some(t) = self.fixed.as_mut() else {
            return;
        };
        let Some(k) = t.ranges.iter().position(|r| r.0 == ptr as usize) else {
            return;
        };
        let (_, _, slot) = t.ranges.remove(k);
        // An empty entry clears the slot; operations in flight keep their own reference.
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty entry refers to no memory.
        let r = unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot.into(), &[empty], None)
        };
        match r {
            Ok(()) => t.free.push(slot),
            // The slot stays taken (and unused): the table has others.
            Err(e) => tracing::warn!(error = %e, slot, "clearing an io_uring fixed buffer failed"),
        }
    }

    fn poll(&mut self, out: &mut [DevCompletion]) -> usize {
        self.push_submissions();
        let mut k = 0;
        let mut cq = self.ring.completion();
        while k < out.len() {
            match cq.next() {
                Some(cqe) => {
                    out[k] = DevCompletion {
                        user_data: cqe.user_data(),
                        result: cqe.result(),
                    };
                    k += 1;
                }
                None => break,
            }
        }
        drop(cq);
        debug_assert!(k <= self.inflight);
        self.inflight -= k;
        k
    }

    fn wait(&mut self) -> io::Result<()> {
        if self.inflight == 0 || !self.ring.completion().is_empty() {
            return Ok(());
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    if !self.ring.completion().is_empty() {
                        return Ok(());
                    }
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => {
                    std::thread::yield_now();
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the ring's descriptor is open as long as `self.ring` lives, and the borrow
        // cannot outlive `self`.
        Some(unsafe { BorrowedFd::borrow_raw(self.ring.as_raw_fd()) })
    }

    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.sync.read_sync(offset, buf)
    }

    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.sync.write_sync(offset, buf)
    }

    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.sync.zero_sync(offset, len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.sync.sync()
    }

    fn meta_io(&self) -> Option<io::Result<Box<dyn MetaIo>>> {
        Some(self.sync.try_clone().map(|s| {
            let inner = Box::new(s) as Box<dyn MetaIo>;
            match &self.meta_gate {
                None => inner,
                Some(g) => Box::new(GatedMetaIo {
                    inner,
                    gate: Arc::clone(g),
                }) as Box<dyn MetaIo>,
            }
        }))
    }
}

impl SyncFile {
    fn try_clone(&self) -> io::Result<SyncFile> {
        Ok(SyncFile {
            file: self.file.try_clone()?,
            block_size: self.block_size,
            mem_align: self.mem_align,
            capacity: self.capacity,
            is_block_device: self.is_block_device,
            zero_buf: None,
        })
    }

    fn write_zeros(&mut self, mut offset: u64, len: u64) -> io::Result<()> {
        let align = self.mem_align.max(self.block_size as usize);
        let zero = self
            .zero_buf
            .get_or_insert_with(|| AlignedBuf::new(ZERO_CHUNK, align));
        let end = offset + len;
        while offset < end {
            let n = (end - offset).min(ZERO_CHUNK as u64) as usize;
            pwrite_all(&self.file, &zero.as_slice()[..n], offset)?;
            offset += n as u64;
        }
        Ok(())
    }
}

impl MetaIo for SyncFile {
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_aligned(
            offset,
            buf.as_ptr() as usize,
            buf.len() as u64,
            u64::from(self.block_size),
            self.mem_align,
        )?;
        pread_all(&self.file, buf, offset)
    }

    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        check_aligned(
            offset,
            buf.as_ptr() as usize,
            buf.len() as u64,
            u64::from(self.block_size),
            self.mem_align,
        )?;
        pwrite_all(&self.file, buf, offset)
    }

    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        check_aligned(offset, 0, len, u64::from(self.block_size), 1)?;
        if len == 0 {
            return Ok(());
        }
        if offset + len > self.capacity {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if self.is_block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: valid fd, BLKZEROOUT takes a pointer to two u64s.
            let r = unsafe { libc::ioctl(self.file.as_raw_fd(), BLKZEROOUT as _, range.as_ptr()) };
            if r == 0 {
                return Ok(());
            }
        } else {
            use rustix::fs::FallocateFlags;
            let flags = FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE;
            if rustix::fs::fallocate(&self.file, flags, offset, len).is_ok() {
                return Ok(());
            }
        }
        self.write_zeros(offset, len)
    }

    fn sync(&mut self) -> io::Result<()> {
        loop {
            match rustix::fs::fdatasync(&self.file) {
                Ok(()) => return Ok(()),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        // Buffers of in-flight operations belong to our callers; never leave the kernel
        // writing into memory after we are gone.
        let mut out = [DevCompletion::default(); 32];
        while self.inflight > 0 {
            if self.wait().is_err() {
                break;
            }
            self.poll(&mut out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Submits `op` and waits for its completion's result.
    fn run(d: &mut UringDevice, op: DevOp) -> i32 {
        // SAFETY: the callers' buffers outlive the wait below.
        unsafe { d.submit(op, 1).unwrap() };
        let mut out = [DevCompletion::default(); 1];
        loop {
            d.wait().unwrap();
            if d.poll(&mut out) == 1 {
                return out[0].result;
            }
        }
    }

    #[test]
    fn registered_memory_takes_the_fixed_path_and_its_data_is_right() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        UringDevice::create_file(&p, 4 << 20).unwrap();
        let mut d = UringDevice::open(&p, 8).unwrap();
        let bs = d.block_size() as usize;
        let mut mem = AlignedBuf::new(bs * 8, d.mem_align());
        let base = mem.as_mut_ptr();
        // SAFETY: `mem` outlives the device's use of it (unregistered below, dropped last).
        if !unsafe { d.register_memory(base, bs * 4) } {
            // Kernels without sparse tables, or a memory-lock limit below 4 blocks: the
            // plain path serves the same memory.
            mem.as_mut_slice()[..bs].fill(0x5a);
            let w = DevOp::Write {
                offset: 0,
                buf: mem.as_ptr(),
                len: bs as u32,
            };
            assert_eq!(run(&mut d, w), bs as i32);
            let r = DevOp::Read {
                offset: 0,
                buf: base.wrapping_add(bs),
                len: bs as u32,
            };
            assert_eq!(run(&mut d, r), bs as i32);
            assert!(mem.as_slice()[bs..bs * 2].iter().all(|&b| b == 0x5a));
            assert_eq!(d.fixed_ops(), 0);
            return;
        }
        // A second registration of the same range is refused; the table stays consistent.
        assert!(!unsafe { d.register_memory(base, bs) });
        mem.as_mut_slice()[..bs * 2].fill(0x5a);
        let write = |at: usize| DevOp::Write {
            offset: 0,
            buf: mem.as_ptr().wrapping_add(at),
            len: (bs * 2) as u32,
        };
        assert_eq!(run(&mut d, write(0)), (bs * 2) as i32);
        assert_eq!(d.fixed_ops(), 1);
        // Reads into the registered range land where they should.
        let read = |at: usize| DevOp::Read {
            offset: 0,
            buf: base.wrapping_add(at),
            len: (bs * 2) as u32,
        };
        assert_eq!(run(&mut d, read(bs * 2)), (bs * 2) as i32);
        assert_eq!(d.fixed_ops(), 2);
        assert!(mem.as_slice()[bs * 2..bs * 4].iter().all(|&b| b == 0x5a));
        // Straddling the end of the range, or outside it: the plain path, same result.
        mem.as_mut_slice()[bs * 3..bs * 5].fill(0);
        assert_eq!(run(&mut d, read(bs * 3)), (bs * 2) as i32);
        assert!(mem.as_slice()[bs * 3..bs * 5].iter().all(|&b| b == 0x5a));
        assert_eq!(d.fixed_ops(), 2);
        // Unregistered: the plain path again, and the slot can be taken anew.
        d.unregister_memory(base);
        assert_eq!(run(&mut d, read(0)), (bs * 2) as i32);
        assert_eq!(d.fixed_ops(), 2);
        assert!(unsafe { d.register_memory(base.wrapping_add(bs * 4), bs * 4) });
        assert_eq!(run(&mut d, read(bs * 4)), (bs * 2) as i32);
        assert_eq!(d.fixed_ops(), 3);
        assert!(mem.as_slice()[bs * 4..bs * 6].iter().all(|&b| b == 0x5a));
        d.unregister_memory(base.wrapping_add(bs * 4));
        drop(d);
    }

    #[test]
    fn roundtrip_on_tempfile() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        UringDevice::create_file(&p, 4 << 20).unwrap();
        let mut d = UringDevice::open(&p, 8).unwrap();
        assert_eq!(d.capacity(), 4 << 20);
        assert!(d.block_size() >= 512);
        let bs = d.block_size() as usize;
        let mut w = AlignedBuf::new(bs * 2, d.mem_align());
        w.as_mut_slice().fill(0xab);
        let mut r = AlignedBuf::new(bs * 2, d.mem_align());
        unsafe {
            d.submit(
                DevOp::Write {
                    offset: bs as u64,
                    buf: w.as_ptr(),
                    len: (bs * 2) as u32,
                },
                5,
            )
            .unwrap();
        }
        let mut out = [DevCompletion::default(); 4];
        let mut got = Vec::new();
        while got.is_empty() {
            d.wait().unwrap();
            let n = d.poll(&mut out);
            got.extend_from_slice(&out[..n]);
        }
        assert_eq!(
            got[0],
            DevCompletion {
                user_data: 5,
                result: (bs * 2) as i32
            }
        );
        unsafe {
            d.submit(DevOp::Flush, 6).unwrap();
            d.submit(
                DevOp::Read {
                    offset: bs as u64,
                    buf: r.as_mut_ptr(),
                    len: (bs * 2) as u32,
                },
                7,
            )
            .unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 2 {
            d.wait().unwrap();
            let n = d.poll(&mut out);
            got.extend_from_slice(&out[..n]);
        }
        assert!(got.iter().all(|c| c.result >= 0), "{got:?}");
        assert_eq!(r.as_slice(), w.as_slice());
        d.zero_sync(bs as u64, bs as u64).unwrap();
        d.read_sync(0, r.as_mut_slice()).unwrap();
        assert!(r.as_slice().iter().all(|&b| b == 0));
        // misaligned sync I/O is rejected, not attempted
        assert!(d.write_sync(1, &w.as_slice()[..bs]).is_err());
    }

    #[test]
    fn create_file_never_truncates_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        std::fs::write(&p, b"precious").unwrap();
        assert!(UringDevice::create_file(&p, 1 << 20).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"precious");
        let q = dir.path().join("new");
        UringDevice::create_file(&q, 1 << 20).unwrap();
        let m = std::fs::metadata(&q).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert_eq!(m.len(), 1 << 20);
        // Growing keeps the contents; shrinking needs consent.
        let lock = DeviceLock::acquire(&p).unwrap();
        UringDevice::size_file(&lock, &p, 4096, false).unwrap();
        assert_eq!(&std::fs::read(&p).unwrap()[..8], b"precious");
        assert!(UringDevice::size_file(&lock, &p, 4, false).is_err());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096);
        // The lock excludes a file service.
        assert!(UringDevice::open(&p, 4).is_err());
        drop(lock);
        UringDevice::open(&p, 4).unwrap();
    }

    #[test]
    fn second_open_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        UringDevice::create_file(&p, 1 << 20).unwrap();
        let d = UringDevice::open(&p, 4).unwrap();
        assert!(matches!(UringDevice::open(&p, 4), Err(FsError::Io(_))));
        drop(d);
        UringDevice::open(&p, 4).unwrap();
    }

    #[test]
    fn submit_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        UringDevice::create_file(&p, 1 << 20).unwrap();
        let mut d = UringDevice::open(&p, 2).unwrap();
        unsafe {
            d.submit(DevOp::Flush, 1).unwrap();
            d.submit(DevOp::Flush, 2).unwrap();
            assert_eq!(d.submit(DevOp::Flush, 3), Err(DeviceBusy));
        }
        let mut out = [DevCompletion::default(); 4];
        let mut n = 0;
        while n < 2 {
            d.wait().unwrap();
            n += d.poll(&mut out[n..]);
        }
        assert_eq!(d.inflight(), 0);
    }
}
