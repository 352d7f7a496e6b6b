//! Host-side shared memory of DDS.
//!
//! A [`SharedRegion`] is memory the host registers for DMA: a sealed `memfd` mapped
//! `MAP_SHARED`. The host process (`dds-host`) dereferences it; the DPU never does. The DPU
//! receives the object's file descriptor over the control socket and hands it to its DMA
//! engine (`dds_dma::DmaEngine::register_region`), which names it by a region id from then
//! on. The DPU-side crates (`dds-dpu`, the DPU halves of `dds-ring`) do not depend on this
//! crate, so they cannot name host memory: the DMA discipline is enforced by the crate graph.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A shared-memory object that the host "registers for DMA": `memfd_create` + `ftruncate` +
/// `mmap(MAP_SHARED)`. The base is page aligned (so 64-byte aligned) and the contents start
/// zeroed. The file descriptor is what travels to the DPU process.
///
/// The region is shared with other threads and processes, so this type never hands out
/// references to its bytes: users access it through [`as_ptr`](Self::as_ptr) with atomics
/// or under a protocol that orders the accesses (the rings).
pub struct SharedRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is owned by this value and accessed only through raw pointers.
unsafe impl Send for SharedRegion {}
// SAFETY: no safe method reads or writes the mapped bytes.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a zeroed region of `len` bytes (`len` > 0). `name` shows up in
    /// `/proc/PID/fd` only.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty shared region",
            ));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // The size is part of the contract with the DPU, which maps the same length: forbid
        // changing it, so a mapping can never be truncated under the other side.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map(fd, len)
    }

    /// Maps an existing shared-memory object of at least `len` bytes (`MAP_SHARED`), for
    /// example one received over [`recv_with_fds`].
    pub fn from_fd(fd: OwnedFd, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty shared region",
            ));
        }
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_size as u64) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("shared object has {} bytes, {} expected", st.st_size, len),
            ));
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh mapping chosen by the kernel; nothing else is affected.
        let raw = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let ptr =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        debug_assert_eq!(ptr.as_ptr() as usize % 64, 0);
        Ok(SharedRegion { ptr, len, fd })
    }

    /// Base of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shared-memory object, to pass to the DPU.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A duplicate of the shared-memory object's descriptor (close-on-exec), for handing the
    /// region to a DMA engine in the same process (tests, benchmarks).
    pub fn export_fd(&self) -> io::Result<OwnedFd> {
        Ok(rustix::io::fcntl_dupfd_cloexec(&self.fd, 0)?)
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `map` with this length and is unmapped once.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("fd", &self.fd)
            .finish()
    }
}
