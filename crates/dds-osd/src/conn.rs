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
        let reused = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let fresh = reused.is_none();
        let stream = match reused {
            Some(s) => s,
            None => self.connect().map_err(|err| self.transport(err))?,
        };
        match self.exchange(stream, op, flags, epoch, payload) {
            Err(CallError::Transport { .. }) if !fresh => {
                let s = self.connect().map_err(|err| self.transport(err))?;
                self.exchange(s, op, flags, epoch, payload)
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

    fn exchange(
        &self,
        mut s: TcpStream,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        let req_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let len = u32::try_from(payload.len())
            .map_err(|_| OpError::new(Status::TooLarge, "request payload above 4 GiB"))?;
        let h = Header {
            op,
            flags,
            status: 0,
            epoch,
            req_id,
            len,
        };
        wire::write_frame(&mut s, &h, payload).map_err(|e| self.transport(e))?;
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
