//! The data device: a regular file of fixed size opened with O_DIRECT and driven through
//! io_uring, and its superblock.

use crate::error::StoreError;
use crate::BLOCK_SIZE;
use dds_sys::AlignedBuf;
use io_uring::{opcode, types, IoUring};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;

/// Entries of each io_uring.
const RING_ENTRIES: u32 = 64;
/// Rings kept for reuse.
const POOL_MAX: usize = 8;

/// First bytes of the superblock.
pub(crate) const SB_MAGIC: [u8; 8] = *b"DDSOBJS1";
pub(crate) const SB_VERSION: u32 = 1;

/// The device's block 0: identifies a formatted device and ties it to its metadata store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub size: u64,
    pub uuid: [u8; 16],
}

impl Superblock {
    /// Layout (LE): magic 8, version u32, block size u32, device size u64, uuid 16, crc32c u32
    /// of the preceding 40 bytes; the rest of the block is zero.
    pub fn encode(&self, block: &mut [u8]) {
        block.fill(0);
        block[0..8].copy_from_slice(&SB_MAGIC);
        block[8..12].copy_from_slice(&SB_VERSION.to_le_bytes());
        block[12..16].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        block[16..24].copy_from_slice(&self.size.to_le_bytes());
        block[24..40].copy_from_slice(&self.uuid);
        let crc = crc32c::crc32c(&block[0..40]);
        block[40..44].copy_from_slice(&crc.to_le_bytes());
    }

    /// `Ok(None)` if the block holds no superblock at all, `Err` if it holds a damaged or
    /// foreign-version one.
    pub fn decode(block: &[u8]) -> Result<Option<Superblock>, String> {
        if block.len() < 44 || block[0..8] != SB_MAGIC {
            return Ok(None);
        }
        let crc = u32::from_le_bytes(block[40..44].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&block[0..40]) {
            return Err("superblock checksum mismatch".into());
        }
        let version = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
        let bs = u32::from_le_bytes(block[12..16].try_into().expect("4 bytes"));
        if version != SB_VERSION || bs as usize != BLOCK_SIZE {
            return Err(format!(
                "superblock version {version} block size {bs} not supported"
            ));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&block[24..40]);
        Ok(Some(Superblock {
            size: u64::from_le_bytes(block[16..24].try_into().expect("8 bytes")),
            uuid,
        }))
    }
}

/// One transfer between memory and the device.
pub(crate) struct IoOp {
    pub write: bool,
    pub ptr: *mut u8,
    pub len: usize,
    pub offset: u64,
}

fn open_error(path: &Path, e: io::Error) -> StoreError {
    if e.kind() == io::ErrorKind::NotFound {
        StoreError::NotFound(format!("device {}", path.display()))
    } else {
        StoreError::io(format!("open {}", path.display()), e)
    }
}

/// Takes the exclusive advisory lock (`flock`) on the device `path`, held for as long as the
/// returned file is open: by an open store, and by `format` while it writes. It sits on its own
/// open file description, apart from the one io_uring uses.
pub(crate) fn lock(path: &Path) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    // SAFETY: plain syscall on a valid descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(StoreError::io(
            format!("{} is in use by another process", path.display()),
            io::Error::last_os_error(),
        ));
    }
    Ok(file)
}

pub(crate) struct Device {
    file: File,
    _lock: File,
    size: u64,
    rings: Mutex<Vec<IoUring>>,
}

impl Device {
    /// Opens the device file with O_DIRECT.
    pub fn open(path: &Path) -> Result<Device, StoreError> {
        let lock = lock(path)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| open_error(path, e))?;
        let size = file
            .metadata()
            .map_err(|e| StoreError::io("fstat device", e))?
            .len();
        Ok(Device {
            file,
            _lock: lock,
            size,
            rings: Mutex::new(Vec::new()),
        })
    }

    /// Size of the file in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn take_ring(&self) -> io::Result<IoUring> {
        let pooled = self.rings.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match pooled {
            Some(r) => Ok(r),
            None => IoUring::new(RING_ENTRIES),
        }
    }

    fn put_ring(&self, ring: IoUring) {
        let mut pool = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(ring);
        }
    }

    /// Runs `ops` and waits for all of them.
    ///
    /// # Safety
    /// Each op's `ptr` is valid for `len` bytes (readable for writes, writable for reads),
    /// aligned to [`BLOCK_SIZE`], and nothing else touches those bytes during the call.
    pub unsafe fn run(&self, ops: &[IoOp]) -> io::Result<()> {
        let mut ring = self.take_ring()?;
        let fd = types::Fd(self.file.as_raw_fd());
        let mut first_err: Option<io::Error> = None;
        for chunk in ops.chunks(RING_ENTRIES as usize) {
            for (i, op) in chunk.iter().enumerate() {
                assert!(
                    (op.ptr as usize).is_multiple_of(BLOCK_SIZE)
                        && op.len.is_multiple_of(BLOCK_SIZE)
                        && op.offset.is_multiple_of(BLOCK_SIZE as u64)
                        && op.offset + op.len as u64 <= self.size,
                    "unaligned or out-of-range device I/O"
                );
                let len = u32::try_from(op.len).expect("device I/O under 4 GiB");
                let sqe = if op.write {
                    opcode::Write::new(fd, op.ptr, len)
                        .offset(op.offset)
                        .build()
                } else {
                    opcode::Read::new(fd, op.ptr, len).offset(op.offset).build()
                };
                // SAFETY: the caller keeps the buffers alive and unaliased until we return,
                // and we return only after every submitted entry has completed.
                unsafe {
                    ring.submission()
                        .push(&sqe.user_data(i as u64))
                        .expect("the ring has room for one chunk");
                }
            }
            let mut done = 0usize;
            while done < chunk.len() {
                match ring.submit_and_wait(chunk.len() - done) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                        ) => {}
                    // The ring is dropped, not pooled: it may hold unsubmitted entries.
                    Err(e) => return Err(e),
                }
                for cqe in ring.completion() {
                    done += 1;
                    let op = &chunk[cqe.user_data() as usize];
                    let res = cqe.result();
                    if res < 0 {
                        first_err.get_or_insert(io::Error::from_raw_os_error(-res));
                    } else if res as usize != op.len {
                        first_err.get_or_insert(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short device I/O: {res} of {} bytes", op.len),
                        ));
                    }
                }
            }
        }
        self.put_ring(ring);
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// fdatasync through io_uring.
    pub fn sync(&self) -> io::Result<()> {
        let mut ring = self.take_ring()?;
        let sqe = opcode::Fsync::new(types::Fd(self.file.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        // SAFETY: fsync references no memory.
        unsafe {
            ring.submission()
                .push(&sqe)
                .expect("an empty ring has room");
        }
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let res = ring.completion().next().map(|cqe| cqe.result());
            if let Some(res) = res {
                self.put_ring(ring);
                return if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    Ok(())
                };
            }
        }
    }

    /// Reads `n` blocks starting at `pblock` into a new aligned buffer.
    pub fn read_blocks(&self, pblock: u64, n: usize) -> io::Result<AlignedBuf> {
        let buf = AlignedBuf::new(n * BLOCK_SIZE, BLOCK_SIZE);
        let op = IoOp {
            write: false,
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            offset: pblock * BLOCK_SIZE as u64,
        };
        // SAFETY: `buf` is ours, aligned, and lives across the call.
        unsafe { self.run(&[op])? };
        Ok(buf)
    }
}
