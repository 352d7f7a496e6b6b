//! File-descriptor passing over Unix stream sockets (`SCM_RIGHTS`): how host memory and
//! eventfds travel to the DPU process.

use std::io;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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
