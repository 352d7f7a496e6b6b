//! Reads of log records issued ahead of the commands that need them (FASTER's pending
//! operations): the server issues them without waiting and serves other connections until
//! they complete (`docs/kv-service.md` §5).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use dds_host::Dds;

/// Asynchronous reads of the log file.
pub trait Fetcher: Send {
    /// Starts reading `len` bytes at file offset `off` into `buf`; its completion carries
    /// `tag`.
    ///
    /// # Safety
    /// `buf .. buf + len` must stay valid and untouched until the completion is returned by
    /// [`Fetcher::poll`].
    unsafe fn submit(&mut self, off: u64, buf: *mut u8, len: u32, tag: u64) -> Result<()>;

    /// Appends the completed reads: (tag, bytes read, or `None` when the read failed).
    fn poll(&mut self, out: &mut Vec<(u64, Option<u32>)>);

    /// A descriptor that becomes readable when reads complete, for the event loop's poller.
    fn wake_fd(&self) -> Option<RawFd>;

    /// Before the event loop sleeps: false when completions already wait.
    fn prepare_sleep(&self) -> bool;

    /// After the event loop woke.
    fn end_sleep(&self);

    /// Largest read.
    fn max_read(&self) -> usize;
}

/// Reads through the host library's asynchronous API: requests go to the DPU's file service
/// through the request ring of the connection's default notification group, completions come
/// back on its response ring, and the group's eventfd wakes the event loop.
pub struct DdsFetcher {
    dds: Arc<Dds>,
    file: u32,
    max_read: usize,
}

impl DdsFetcher {
    /// Reads of the DDS file `file`.
    pub fn new(dds: Arc<Dds>, file: u32) -> DdsFetcher {
        let max_read = (dds.hello().max_io_bytes as usize).clamp(4096, 1 << 20);
        DdsFetcher {
            dds,
            file,
            max_read,
        }
    }
}

impl Fetcher for DdsFetcher {
    unsafe fn submit(&mut self, off: u64, buf: *mut u8, len: u32, tag: u64) -> Result<()> {
        // SAFETY: forwarded to the caller's contract.
        unsafe { self.dds.read(self.file, off, buf, len, tag) }?;
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<(u64, Option<u32>)>) {
        loop {
            match self.dds.default_group().poll_wait(Duration::ZERO) {
                Ok(Some(c)) => out.push((c.io_ctx, c.result().ok())),
                Ok(None) => return,
                Err(e) => {
                    // The DPU is gone and every read was returned (failed): nothing more
                    // will complete.
                    tracing::error!(error = %e, "reads of the log cannot complete");
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
