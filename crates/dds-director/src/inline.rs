//! A director that runs on the file-service thread instead of a thread of its own
//! (`docs/offload.md` §7, "The director on the file-service thread"). With one DPU core, a
//! director thread and the service thread take turns on it: every batch of offloaded reads
//! and every batch of their completions costs a wake-up and a context switch each way.
//! Inline, the service thread drives the director between its own rounds: reads queued on
//! the lane are served in the same pass, their completions reaped in the next, and the thread
//! blocks in one place, on the device, the control plane and the director's ring at once.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mio::Events;

use crate::worker::{Worker, EVENTS};

/// A director driven by its caller's loop: [`InlineDirector::poll`] each round,
/// [`InlineDirector::prepare_wait`] and [`InlineDirector::wait_fd`] when the caller is about
/// to block. Reads it queues on its lane are only served when the caller serves the port, so
/// it must be the thread that does.
pub struct InlineDirector {
    worker: Worker,
    events: Events,
    last_applied: u64,
    retrying: bool,
    /// When the stop was seen: connections closed, outstanding reads awaited until then + 5 s.
    stopping: Option<Instant>,
}

impl std::fmt::Debug for InlineDirector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InlineDirector")
            .field("inflight", &self.worker.lane.inflight())
            .finish()
    }
}

/// Longest an inline director lets its caller block with nothing to retry.
const IDLE_WAIT: Duration = Duration::from_millis(100);

impl InlineDirector {
    pub(crate) fn new(worker: Worker) -> InlineDirector {
        InlineDirector {
            worker,
            events: Events::with_capacity(EVENTS),
            last_applied: 0,
            retrying: false,
            stopping: None,
        }
    }

    /// One round, never blocking: completed reads are merged, connections with input or
    /// room are driven (their offloaded reads queued on the lane), the round's responses
    /// sent in one system call, and new socket events collected. Returns whether anything
    /// moved (then the caller serves the lane and calls again before it blocks).
    pub fn poll(&mut self) -> bool {
        if self.stopping.is_none() && self.worker.stop.load(Ordering::Acquire) {
            self.stopping = Some(Instant::now());
            self.worker.close_all();
        }
        let w = &mut self.worker;
        self.retrying = w.begin_round(&mut self.last_applied);
        let mut moved = !w.dirty.is_empty() || w.lane.completions_waiting();
        w.drive_dirty();
        moved |= w.flush_sends(&mut self.events).unwrap_or_else(|e| {
            tracing::error!(error = %e, "director io_uring submit failed");
            true
        });
        if let Err(e) = w.wait(&mut self.events, Duration::ZERO) {
            tracing::warn!(error = %e, "director poll failed");
        }
        moved |= w.take_events(&mut self.events);
        moved || !w.dirty.is_empty()
    }

    /// How long the caller may block before the next [`InlineDirector::poll`] (`None`: not at
    /// all, there is work). Events on [`InlineDirector::wait_fd`] end the wait earlier.
    pub fn prepare_wait(&mut self) -> Option<Duration> {
        let w = &mut self.worker;
        if !w.dirty.is_empty()
            || w.uring.as_ref().is_some_and(|u| u.sending())
            || w.lane.completions_waiting()
        {
            return None;
        }
        if self.stopping.is_some() {
            return Some(Duration::from_millis(1));
        }
        if self.retrying || !w.retry.is_empty() {
            Some(Duration::from_millis(1))
        } else {
            Some(IDLE_WAIT)
        }
    }

    /// The descriptor that becomes readable when the director has socket events: its
    /// io_uring (completions waiting), or its `epoll` instance without one.
    pub fn wait_fd(&self) -> BorrowedFd<'_> {
        let fd = match self.worker.uring.as_ref() {
            Some(u) => u.raw_fd(),
            None => self.worker.poll.as_raw_fd(),
        };
        // SAFETY: the ring or the poll instance owns `fd` and outlives the borrow of `self`.
        unsafe { BorrowedFd::borrow_raw(fd) }
    }

    /// Whether the director was stopped and may be dropped: its connections are closed and
    /// no read it queued is outstanding (or 5 s passed since the stop; their buffers are then
    /// leaked, never freed under the file service).
    pub fn finished(&mut self) -> bool {
        let Some(since) = self.stopping else {
            return false;
        };
        if self.worker.lane.inflight() == 0 {
            return true;
        }
        if since.elapsed() > Duration::from_secs(5) {
            tracing::error!(
                inflight = self.worker.lane.inflight(),
                "offloaded reads still outstanding at shutdown: leaking their buffers"
            );
            self.worker.leak_pool();
            return true;
        }
        false
    }
}
