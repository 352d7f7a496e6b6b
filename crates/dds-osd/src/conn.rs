//! Pooled request/reply connections to one address (client to OSD, OSD to peer).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::wire::{self, Budget, FrameError, Header, OpError, Status, FLAG_REPLY};

/// Idle connections kept per address.
const MAX_IDLE: usize = 8;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The connection failed (refused, reset, timed out, or a reply that does not parse).
    #[error("{addr}: {err}")]
    Transport { addr: SocketAddr, err: io::Error },
    /// The other side answered with an error status.
    #[error(transparent)]
    Op(#[from] OpError),
}

impl CallError {
    /// The reply's status (transport failures are `Io`).
    pub fn status(&self) -> Status {
        match self {
            CallError::Transport { .. } => Status::Io,
            CallError::Op(e) => e.status,
        }
    }
}

/// A request sent and not yet answered ([`ConnPool::send`]).
pub struct Sent {
    stream: TcpStream,
    fresh: bool,
    op: u16,
    flags: u16,
    epoch: u32,
    req_id: u64,
}

/// Connections to one address, reused across calls; each call takes one connection exclusively.
pub struct ConnPool {
    addr: SocketAddr,
    idle: Mutex<Vec<TcpStream>>,
    next_id: AtomicU64,
    connect_timeout: Duration,
    io_timeout: Duration,
    budget: Budget,
}

impl ConnPool {
    pub fn new(addr: SocketAddr, connect_timeout: Duration, io_timeout: Duration) -> ConnPool {
        ConnPool {
            addr,
            idle: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            connect_timeout,
            io_timeout,
            budget: Budget::new(u64::MAX / 2),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops the idle connections.
    pub fn reset(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn connect(&self) -> io::Result<TcpStream> {
        let s = TcpStream::connect_timeout(&self.addr, self.connect_timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.io_timeout))?;
        s.set_write_timeout(Some(self.io_timeout))?;
        Ok(s)
    }

    /// Sends one request and returns the reply's payload. A reused connection that fails is
    /// replaced by a fresh one once (the request is sent again).
    pub fn call(
        &self,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        let sent = self.send(op, flags, epoch, payload)?;
        self.finish(sent, payload)
    }

    /// Sends one request on a connection of its own and returns without waiting for the
    /// reply ([`finish`](Self::finish) reads it): requests to several peers are then in
    /// flight at once without a thread each.
    pub fn send(&self, op: u16, flags: u16, epoch: u32, payload: &[u8]) -> Result<Sent, CallError> {
        let reused = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(mut s) = reused {
            if let Ok(req_id) = self.write_request(&mut s, op, flags, epoch, payload) {
                return Ok(Sent {
                    stream: s,
                    fresh: false,
                    op,
                    flags,
                    epoch,
                    req_id,
                });
            }
        }
        self.send_fresh(op, flags, epoch, payload)
    }

    fn send_fresh(
        &self,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<Sent, CallError> {
        let mut s = self.connect().map_err(|err| self.transport(err))?;
        let req_id = self.write_request(&mut s, op, flags, epoch, payload)?;
        Ok(Sent {
            stream: s,
            fresh: true,
            op,
            flags,
            epoch,
            req_id,
        })
    }

    /// Reads the reply of a request [`send`](Self::send) sent; a reused connection that
    /// fails is replaced by a fresh one once (`payload`, the same request, is sent again).
    pub fn finish(&self, sent: Sent, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let Sent {
            stream,
            fresh,
            op,
            flags,
            epoch,
            req_id,
        } = sent;
        match self.read_reply(stream, op, req_id) {
            Err(CallError::Transport { .. }) if !fresh => {
                let again = self.send_fresh(op, flags, epoch, payload)?;
                self.read_reply(again.stream, op, again.req_id)
            }
            r => r,
        }
    }

    fn transport(&self, err: io::Error) -> CallError {
        CallError::Transport {
            addr: self.addr,
            err,
        }
    }

    fn write_request(
        &self,
        s: &mut TcpStream,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<u64, CallError> {
        let req_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let h = Header::request(op, flags, epoch, req_id, payload)?;
        wire::write_frame(s, &h, payload).map_err(|e| self.transport(e))?;
        Ok(req_id)
    }

    fn read_reply(&self, mut s: TcpStream, op: u16, req_id: u64) -> Result<Vec<u8>, CallError> {
        let (rh, p) = wire::read_frame(&mut s, u32::MAX, &self.budget).map_err(|e| {
            self.transport(match e {
                FrameError::Io(e) => e,
                FrameError::Closed => io::ErrorKind::UnexpectedEof.into(),
                other => io::Error::new(io::ErrorKind::InvalidData, format!("{other:?}")),
            })
        })?;
        if rh.req_id != req_id || rh.op != op || rh.flags & FLAG_REPLY == 0 {
            return Err(self.transport(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply does not match the request",
            )));
        }
        let buf = std::mem::take(&mut { p }.buf);
        if rh.status != 0 {
            let status = Status::from_u16(rh.status).unwrap_or(Status::Io);
            // The OSD closes the connection after these.
            if !matches!(status, Status::TooLarge | Status::Busy) {
                self.put_back(s);
            }
            return Err(OpError::new(status, String::from_utf8_lossy(&buf)).into());
        }
        self.put_back(s);
        Ok(buf)
    }

    fn put_back(&self, s: TcpStream) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(s);
        }
    }
}
