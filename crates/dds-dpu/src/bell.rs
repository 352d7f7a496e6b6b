//! Doorbells of the parked service thread (adaptive polling).
//!
//! The service thread spins while work arrives; an idle round yields the CPU (`sched_yield`), so
//! that the DPU's other threads sharing its core (directors, io_uring workers) run at once
//! instead of waiting out the spin. While device I/O is in flight an idle thread waits
//! for the device instead, its bell included (`Service::wait_device`). After a stretch of idle
//! rounds with nothing on the device it parks: it sets every group's `Sleeping` word
//! (`docs/ring-format.md`), polls every ring once more, and blocks in `poll(2)` on the groups'
//! doorbells (eventfds the hosts write when they publish a request while `Sleeping` is set), its
//! own [`Bell`] (rung by the control plane after it queues a command and by director threads after
//! they queue an offloaded read), with a timeout for housekeeping. Wake-up latency is that of an
//! eventfd write and a `poll` return (a few microseconds; measured in
//! `crates/dds-dpu/tests/park.rs`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crossbeam_channel::{Receiver, SendError, Sender};

use crate::control::Command;

/// A non-blocking eventfd: `ring` makes it readable, `drain` resets it.
#[derive(Debug)]
pub(crate) struct Bell {
    fd: OwnedFd,
}

impl Bell {
    pub fn new() -> std::io::Result<Bell> {
        let fd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        Ok(Bell { fd })
    }

    /// Makes the bell readable (EAGAIN: it is rung already).
    pub fn ring(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }

    /// Resets the bell.
    pub fn drain(&self) {
        let mut v = [0u8; 8];
        // Non-blocking: EAGAIN when not rung.
        let _ = rustix::io::read(&self.fd, &mut v);
    }
}

impl AsFd for Bell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Resets a host's doorbell if it is rung. It reads only when `poll` says the fd is
/// readable, so a doorbell the host made blocking can never block the service thread.
pub(crate) fn drain(fd: BorrowedFd<'_>) {
    let mut p = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if matches!(rustix::event::poll(&mut p, Some(&zero)), Ok(1))
        && p[0].revents().contains(rustix::event::PollFlags::IN)
    {
        let mut v = [0u8; 8];
        let _ = rustix::io::read(fd, &mut v);
    }
}

/// Writes 1 to a host's eventfd without ever blocking: the fd is non-blocking (set at group
/// creation) and written only when `poll` says a write fits, so a host that fills its
/// eventfd's counter (or clears `O_NONBLOCK` again) loses its own notifications and nothing
/// else.
pub(crate) fn notify(fd: BorrowedFd<'_>) {
    let mut p = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::OUT,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if matches!(rustix::event::poll(&mut p, Some(&zero)), Ok(1))
        && p[0].revents().contains(rustix::event::PollFlags::OUT)
    {
        let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
    }
}

/// Makes a host's fd non-blocking (its open file description is shared with the host).
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK)?;
    Ok(())
}

/// Whether `fd` is an eventfd (what a host must pass as a doorbell or notification fd).
pub(crate) fn is_eventfd(fd: BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

/// The control plane's end of the command queue: every command also rings the service
/// thread's bell, so a parked service thread takes it at once.
#[derive(Clone, Debug)]
pub(crate) struct CommandSender {
    tx: Sender<Command>,
    bell: std::sync::Arc<Bell>,
}

impl CommandSender {
    pub fn send(&self, c: Command) -> Result<(), SendError<Command>> {
        self.tx.send(c)?;
        self.bell.ring();
        Ok(())
    }
}

/// A bounded command queue whose sends ring `bell`.
pub(crate) fn command_queue(
    cap: usize,
    bell: std::sync::Arc<Bell>,
) -> (CommandSender, Receiver<Command>) {
    let (tx, rx) = crossbeam_channel::bounded(cap);
    (CommandSender { tx, bell }, rx)
}
