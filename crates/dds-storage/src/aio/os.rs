//! OS files + io_uring (the baseline backend).

use super::*;

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
pub struct OsAsyncStorage {
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

impl OsAsyncStorage {
    /// Opens (creating and sizing when needed) `dir/f0 .. dir/f{files-1}`.
    pub fn open(dir: &Path, files: usize, file_size: u64, fill: Fill) -> Result<OsAsyncStorage> {
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
        Ok(OsAsyncStorage {
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

impl AsyncStorage for OsAsyncStorage {
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

    fn ready(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    fn inflight(&self) -> usize {
        self.inflight
    }
}
