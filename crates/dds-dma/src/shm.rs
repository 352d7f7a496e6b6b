//! Host shared-memory regions and file-descriptor passing.

use std::io;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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

/// Most file descriptors one message of [`send_with_fds`] / [`recv_with_fds`] carries.
pub const MAX_FDS: usize = 16;

/// Sends `bytes` (non-empty) on a Unix stream socket, with up to [`MAX_FDS`] file descriptors
/// attached to the first byte (`SCM_RIGHTS`). The whole of `bytes` is sent.
pub fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if bytes.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "file descriptors need at least one byte to travel with",
        ));
    }
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many file descriptors",
        ));
    }
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut sent = 0usize;
    while sent < bytes.len() {
        let mut control = SendAncillaryBuffer::new(&mut space);
        if sent == 0 && !fds.is_empty() {
            let pushed = control.push(SendAncillaryMessage::ScmRights(fds));
            assert!(pushed, "control buffer sized for MAX_FDS");
        }
        let iov = [IoSlice::new(&bytes[sent..])];
        match rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from a Unix stream socket; file descriptors that arrive
/// with them (close-on-exec) are appended to `fds`. Returns the number of bytes received
/// (0 = end of stream). Fails if the descriptors did not fit (more than [`MAX_FDS`]).
pub fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = loop {
        match rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "file descriptors truncated (more than MAX_FDS sent)",
        ));
    }
    Ok(msg.bytes)
}
