//! Pooled request/reply connections to one address (client to OSD, OSD to peer).

use std::collections::BTreeMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

/// The open connections of a pool, by id: a second handle on each socket, with which
/// [`ConnPool::abort`] shuts down a connection a call is blocked on.
type Open = Arc<Mutex<BTreeMap<u64, TcpStream>>>;

/// A connection of a pool, listed in its pool's open connections until dropped.
struct Conn {
    s: TcpStream,
    id: u64,
    open: Open,
}

impl Deref for Conn {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.s
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut TcpStream {
        &mut self.s
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// A request sent and not yet answered ([`ConnPool::send`]).
pub struct Sent {
    stream: Conn,
    /// The pool's aborts before it was sent.
    aborts: u64,
    fresh: bool,
    op: u16,
    flags: u16,
    epoch: u32,
    req_id: u64,
}

/// Connections to one address, reused across calls; each call takes one connection exclusively.
pub struct ConnPool {
    addr: SocketAddr,
    idle: Mutex<Vec<Conn>>,
    open: Open,
    next_conn: AtomicU64,
    aborts: AtomicU64,
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
            open: Arc::new(Mutex::new(BTreeMap::new())),
            next_conn: AtomicU64::new(0),
            aborts: AtomicU64::new(0),
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

    /// Fails the calls in progress now (their connections are shut down; they are not sent
    /// again) and drops the idle connections: for an address that a new map says is down,
    /// where a reply may never come.
    pub fn abort(&self) {
        self.aborts.fetch_add(1, Ordering::SeqCst);
        for s in self.open.lock().unwrap_or_else(|e| e.into_inner()).values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.reset();
    }

    fn connect(&self) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&self.addr, self.connect_timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.io_timeout))?;
        s.set_write_timeout(Some(self.io_timeout))?;
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let handle = s.try_clone()?;
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
        Ok(Conn {
            s,
            id,
            open: self.open.clone(),
        })
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
        let aborts = self.aborts.load(Ordering::SeqCst);
        let reused = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(mut s) = reused {
            if let Ok(req_id) = self.write_request(&mut s, op, flags, epoch, payload) {
                return Ok(Sent {
                    stream: s,
                    aborts,
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
        let aborts = self.aborts.load(Ordering::SeqCst);
        let mut s = self.connect().map_err(|err| self.transport(err))?;
        let req_id = self.write_request(&mut s, op, flags, epoch, payload)?;
        Ok(Sent {
            stream: s,
            aborts,
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
            aborts,
            fresh,
            op,
            flags,
            epoch,
            req_id,
        } = sent;
        match self.read_reply(stream, op, req_id) {
            Err(CallError::Transport { .. })
                if !fresh && self.aborts.load(Ordering::SeqCst) == aborts =>
            {
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
        s: &mut Conn,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<u64, CallError> {
        let req_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let h = Header::request(op, flags, epoch, req_id, payload)?;
        wire::write_frame(&mut **s, &h, payload).map_err(|e| self.transport(e))?;
        Ok(req_id)
    }

    fn read_reply(&self, mut s: Conn, op: u16, req_id: u64) -> Result<Vec<u8>, CallError> {
        let (rh, p) = wire::read_frame(&mut *s, u32::MAX, &self.budget).map_err(|e| {
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

    fn put_back(&self, s: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(s);
        }
    }
}
