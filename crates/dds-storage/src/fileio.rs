//! Asynchronous I/O on a fixed set of files for an event-loop thread (a service on
//! `dds-server`): the thread issues reads, writes and flushes without waiting, serves other
//! connections, and takes the completions when the descriptor of [`FileIo::wake_fd`] wakes
//! its poller (or on its next turn). Files are named by their index in the set given at
//! construction.
//!
//! - [`DdsIo`]: DDS files through the host library's asynchronous API. Requests go to the
//!   DPU's file service through the request ring of the connection's default notification
//!   group; completions come back on its response ring (PollWait with a zero timeout), and the
//!   group's eventfd wakes the loop. Every file of the set shares that group, so one poll
//!   returns the completions of all of them.
//! - [`SyncIo`]: any [`StoreFile`] (regular files): the operation is done when it is issued and
//!   its completion is queued at once, so a service has one code path for both.
//!
//! Neither allocates per operation once its completion queue has grown to the operations in
//! flight.
//!
//! Ordering: operations in flight at the same time may complete (and reach the device) in any
//! order. A caller that writes a range must not read or write it again until that write's
//! completion is polled, and a flush covers the writes completed before it was issued.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use dds_host::{Dds, DdsError, Status};

use crate::aio::SubmitError;
use crate::StoreFile;

/// A finished operation: the tag it was issued with, and the bytes it moved (`None`: it
/// failed; a flush moves 0).
pub type IoDone = (u64, Option<u32>);

/// Asynchronous reads, writes and flushes of a set of files.
pub trait FileIo: Send {
    /// Starts reading `len` bytes at offset `off` of file `file` into `buf`; its completion
    /// carries `tag`. [`SubmitError::Busy`]: no more operations may be in flight now (issue it
    /// again after some completions).
    ///
    /// # Safety
    /// `buf .. buf + len` must stay valid and untouched until the completion is returned by
    /// [`FileIo::poll`].
    unsafe fn read(
        &mut self,
        file: usize,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError>;

    /// Starts writing `data` at offset `off` of file `file` (at most [`FileIo::max_io`]
    /// bytes). The data is taken before this returns: the caller may reuse its buffer at once.
    fn write(&mut self, file: usize, off: u64, data: &[u8], tag: u64) -> Result<(), SubmitError>;

    /// Starts a flush: it completes once every write of the set completed before it was
    /// issued is durable.
    fn flush(&mut self, file: usize, tag: u64) -> Result<(), SubmitError>;

    /// Starts sending the DPU's offload engine a cache-table record (`docs/consistency.md`):
    /// CACHE items (`invalidate` false, 32 bytes each) or INVALIDATE keys (true, 8 bytes
    /// each), ordered after the operations issued before it. Its completion means the DPU
    /// applied it. Files with no DPU behind them complete it at once.
    fn cache_record(&mut self, invalidate: bool, data: &[u8], tag: u64) -> Result<(), SubmitError>;

    /// Appends the completed operations.
    fn poll(&mut self, out: &mut Vec<IoDone>);

    /// A descriptor that becomes readable when operations complete (for the loop's poller),
    /// if completions can arrive while the thread sleeps.
    fn wake_fd(&self) -> Option<RawFd>;

    /// Before the loop sleeps: false when completions already wait (do not sleep).
    fn prepare_sleep(&self) -> bool;

    /// After a [`FileIo::prepare_sleep`] that returned true, once the loop woke.
    fn end_sleep(&self);

    /// Largest single read or write.
    fn max_io(&self) -> usize;
}

/// DDS files through the host library's asynchronous API (the default notification group of
/// the connection).
pub struct DdsIo {
    dds: Arc<Dds>,
    files: Vec<u32>,
    max_io: usize,
}

impl DdsIo {
    /// I/O on the DDS files `files` (file `k` of the set is `files[k]`).
    pub fn new(dds: Arc<Dds>, files: &[u32]) -> DdsIo {
        let max_io = (dds.hello().max_io_bytes as usize).clamp(4096, 1 << 20);
        DdsIo {
            dds,
            files: files.to_vec(),
            max_io,
        }
    }

    fn id(&self, file: usize) -> Result<u32, SubmitError> {
        self.files
            .get(file)
            .copied()
            .ok_or(SubmitError::Failed(Status::UnknownFile.code()))
    }
}

fn submitted(r: Result<(), DdsError>, what: &str) -> Result<(), SubmitError> {
    match r {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.status,
                Status::TooManyOutstanding | Status::Busy | Status::RingFull
            ) =>
        {
            Err(SubmitError::Busy)
        }
        Err(e) => {
            tracing::warn!(error = %e, "{what} not issued");
            Err(SubmitError::Failed(e.status.code()))
        }
    }
}

impl FileIo for DdsIo {
    unsafe fn read(
        &mut self,
        file: usize,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let id = self.id(file)?;
        // SAFETY: forwarded to the caller's contract.
        submitted(unsafe { self.dds.read(id, off, buf, len, tag) }, "read")
    }

    fn write(&mut self, file: usize, off: u64, data: &[u8], tag: u64) -> Result<(), SubmitError> {
        let id = self.id(file)?;
        submitted(self.dds.write(id, off, data, tag), "write")
    }

    fn flush(&mut self, file: usize, tag: u64) -> Result<(), SubmitError> {
        let id = self.id(file)?;
        submitted(self.dds.flush(id, tag), "flush")
    }

    fn cache_record(&mut self, invalidate: bool, data: &[u8], tag: u64) -> Result<(), SubmitError> {
        submitted(self.dds.cache_record(invalidate, data, tag), "cache record")
    }

    fn poll(&mut self, out: &mut Vec<IoDone>) {
        loop {
            match self.dds.default_group().poll_wait(Duration::ZERO) {
                Ok(Some(c)) => out.push((c.io_ctx, c.result().ok())),
                Ok(None) => return,
                Err(e) => {
                    // The DPU is gone and every operation was returned (failed): nothing more
                    // will complete.
                    tracing::error!(error = %e, "operations cannot complete");
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

    fn max_io(&self) -> usize {
        self.max_io
    }
}

/// Operations done when they are issued (regular files, or any [`StoreFile`]); their
/// completions are queued at once and returned by the next [`FileIo::poll`].
pub struct SyncIo {
    files: Vec<Box<dyn StoreFile>>,
    done: VecDeque<IoDone>,
}

impl SyncIo {
    /// I/O on `files` (file `k` of the set is `files[k]`).
    pub fn new(files: Vec<Box<dyn StoreFile>>) -> SyncIo {
        SyncIo {
            files,
            done: VecDeque::with_capacity(64),
        }
    }

    fn file(&self, file: usize) -> Result<&dyn StoreFile, SubmitError> {
        self.files
            .get(file)
            .map(|f| f.as_ref())
            .ok_or(SubmitError::Failed(Status::UnknownFile.code()))
    }

    fn finish(&mut self, tag: u64, r: anyhow::Result<u32>, what: &str) {
        let r = match r {
            Ok(n) => Some(n),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "{what} failed");
                None
            }
        };
        self.done.push_back((tag, r));
    }
}

impl FileIo for SyncIo {
    unsafe fn read(
        &mut self,
        file: usize,
        off: u64,
        buf: *mut u8,
        len: u32,
        tag: u64,
    ) -> Result<(), SubmitError> {
        let f = self.file(file)?;
        // SAFETY: the caller keeps `buf .. buf + len` valid and untouched by others until the
        // completion is polled; it is written only here, before this returns.
        let b = unsafe { std::slice::from_raw_parts_mut(buf, len as usize) };
        let r = f.read_at(off, b).map(|n| n as u32);
        self.finish(tag, r, "read");
        Ok(())
    }

    fn write(&mut self, file: usize, off: u64, data: &[u8], tag: u64) -> Result<(), SubmitError> {
        let r = self
            .file(file)?
            .write_at(off, data)
            .map(|()| data.len() as u32);
        self.finish(tag, r, "write");
        Ok(())
    }

    fn flush(&mut self, file: usize, tag: u64) -> Result<(), SubmitError> {
        let r = self.file(file)?.sync().map(|()| 0);
        self.finish(tag, r, "flush");
        Ok(())
    }

    fn cache_record(&mut self, _: bool, _: &[u8], tag: u64) -> Result<(), SubmitError> {
        // No DPU keeps a cache of these files.
        self.done.push_back((tag, Some(0)));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<IoDone>) {
        out.extend(self.done.drain(..));
    }

    fn wake_fd(&self) -> Option<RawFd> {
        None
    }

    fn prepare_sleep(&self) -> bool {
        self.done.is_empty()
    }

    fn end_sleep(&self) {}

    fn max_io(&self) -> usize {
        1 << 20
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OsStorage, Storage};

    #[test]
    fn sync_operations_complete_on_the_next_poll() {
        let dir = std::env::temp_dir().join(format!("dds-fileio-{}", std::process::id()));
        let st = OsStorage::new(&dir).unwrap();
        let mut io = SyncIo::new(vec![st.open("f").unwrap(), st.open("g").unwrap()]);
        io.write(0, 0, b"hello world", 7).unwrap();
        io.write(1, 2, b"xy", 8).unwrap();
        io.flush(0, 9).unwrap();
        let mut a = [0u8; 5];
        let mut b = [0u8; 8];
        let mut c = [0u8; 4];
        unsafe {
            io.read(0, 6, a.as_mut_ptr(), 5, 1).unwrap();
            io.read(0, 8, b.as_mut_ptr(), 8, 2).unwrap();
            io.read(1, 0, c.as_mut_ptr(), 4, 3).unwrap();
        }
        assert_eq!(
            io.write(2, 0, b"z", 10),
            Err(SubmitError::Failed(Status::UnknownFile.code()))
        );
        assert!(!io.prepare_sleep());
        let mut out = Vec::new();
        io.poll(&mut out);
        assert_eq!(
            out,
            vec![
                (7, Some(11)),
                (8, Some(2)),
                (9, Some(0)),
                (1, Some(5)),
                (2, Some(3)),
                (3, Some(4))
            ]
        );
        assert_eq!(&a, b"world");
        assert_eq!(&b[..3], b"rld");
        assert_eq!(&c, b"\0\0xy");
        assert!(io.prepare_sleep());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
