//! Asynchronous reads of one file for an event-loop thread (a service on `dds-server`): the
//! thread issues a read without waiting, serves other connections, and takes the completions
//! when the descriptor of [`FileReads::wake_fd`] wakes its poller (or on its next turn).
//!
//! - [`DdsReads`]: a DDS file through the host library's asynchronous API. Reads go to the
//!   DPU's file service through the request ring of the connection's default notification
//!   group; completions come back on its response ring (PollWait with a zero timeout), and the
//!   group's eventfd wakes the loop.
//! - [`SyncReads`]: any [`StoreFile`] (regular files): the read is done when it is issued and
//!   its completion is queued at once, so a service has one code path for both.
//!
//! Neither allocates per read once its completion queue has grown to the reads in flight.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use dds_host::{Dds, Status};

use crate::aio::SubmitError;
use crate::StoreFile;

/// A finished read: the tag it was issued with, and the bytes read (`None`: it failed).
pub type ReadDone = (u64, Option<u32>);

/// Asynchronous reads of one file.
pub trait FileReads: Send {
    /// Starts reading `len` bytes at file offset `off` into `buf`; its completion carries
    /// `tag`. [`SubmitError::Busy`]: no more reads may be in flight now (issue it again after
    /// some completions).
    ///
    /// # Safety
    /// `buf .. buf + len` must stay valid and untouched until the completion is returned by
    /// [`FileReads::poll`].
    unsafe fn submit(
        &mut self,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError>;

    /// Appends the completed reads.
    fn poll(&mut self, out: &mut Vec<ReadDone>);

    /// A descriptor that becomes readable when reads complete (for the loop's poller), if
    /// completions can arrive while the thread sleeps.
    fn wake_fd(&self) -> Option<RawFd>;

    /// Before the loop sleeps: false when completions already wait (do not sleep).
    fn prepare_sleep(&self) -> bool;

    /// After a [`FileReads::prepare_sleep`] that returned true, once the loop woke.
    fn end_sleep(&self);

    /// Largest read.
    fn max_read(&self) -> usize;
}

/// Reads of a DDS file through the host library's asynchronous API (the default notification
/// group of the connection).
pub struct DdsReads {
    dds: Arc<Dds>,
    file: u32,
    max_read: usize,
}

impl DdsReads {
    /// Reads of the DDS file `file`.
    pub fn new(dds: Arc<Dds>, file: u32) -> DdsReads {
        let max_read = (dds.hello().max_io_bytes as usize).clamp(4096, 1 << 20);
        DdsReads {
            dds,
            file,
            max_read,
        }
    }
}

impl FileReads for DdsReads {
    unsafe fn submit(
        &mut self,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: forwarded to the caller's contract.
        match unsafe { self.dds.read(self.file, off, buf, len, tag) } {
            Ok(()) => Ok(()),
            Err(e) if e.status == Status::TooManyOutstanding || e.status == Status::Busy => {
                Err(SubmitError::Busy)
            }
            Err(e) => {
                tracing::warn!(error = %e, "read not issued");
                Err(SubmitError::Failed(e.status.code()))
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<ReadDone>) {
        loop {
            match self.dds.default_group().poll_wait(Duration::ZERO) {
                Ok(Some(c)) => out.push((c.io_ctx, c.result().ok())),
                Ok(None) => return,
                Err(e) => {
                    // The DPU is gone and every read was returned (failed): nothing more
                    // will complete.
                    tracing::error!(error = %e, "reads cannot complete");
                    return;
                }
            }
        }
    }

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.dds.default_group().wake_fd().as_raw_fd())
    }

    fn prepare_sleep(&self) -> bool {
        self.dds.default_group().prepare_sleep()
    }

    fn end_sleep(&self) {
        self.dds.default_group().end_sleep()
    }

    fn max_read(&self) -> usize {
        self.max_read
    }
}

/// Reads done when they are issued (a regular file, or any [`StoreFile`]); their completions
/// are queued at once and returned by the next [`FileReads::poll`].
pub struct SyncReads {
    file: Box<dyn StoreFile>,
    done: VecDeque<ReadDone>,
}

impl SyncReads {
    /// Reads of `file`.
    pub fn new(file: Box<dyn StoreFile>) -> SyncReads {
        SyncReads {
            file,
            done: VecDeque::with_capacity(64),
        }
    }
}

impl FileReads for SyncReads {
    unsafe fn submit(
        &mut self,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller keeps `buf .. buf + len` valid and untouched by others until the
        // completion is polled; it is written only here, before this returns.
        let b = unsafe { std::slice::from_raw_parts_mut(buf, len as usize) };
        let r = match self.file.read_at(off, b) {
            Ok(n) => Some(n as u32),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), off, "read failed");
                None
            }
        };
        self.done.push_back((tag, r));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<ReadDone>) {
        out.extend(self.done.drain(..));
    }

    fn wake_fd(&self) -> Option<RawFd> {
        None
    }

    fn prepare_sleep(&self) -> bool {
        self.done.is_empty()
    }

    fn end_sleep(&self) {}

    fn max_read(&self) -> usize {
        1 << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OsStorage, Storage};

    #[test]
    fn sync_reads_complete_on_the_next_poll() {
        let dir = std::env::temp_dir().join(format!("dds-reads-{}", std::process::id()));
        let st = OsStorage::new(&dir).unwrap();
        let f = st.open("f").unwrap();
        f.write_at(0, b"hello world").unwrap();
        let mut r = SyncReads::new(st.open("f").unwrap());
        let mut a = [0u8; 5];
        let mut b = [0u8; 8];
        unsafe {
            r.submit(6, a.as_mut_ptr(), 5, 1).unwrap();
            r.submit(8, b.as_mut_ptr(), 8, 2).unwrap();
        }
        assert!(!r.prepare_sleep());
        let mut out = Vec::new();
        r.poll(&mut out);
        assert_eq!(out, vec![(1, Some(5)), (2, Some(3))]);
        assert_eq!(&a, b"world");
        assert_eq!(&b[..3], b"rld");
        assert!(r.prepare_sleep());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
