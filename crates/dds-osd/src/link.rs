//! A persistent, pipelined connection to a peer OSD's peer port: many requests in flight on
//! one connection, each reply matched to its request by request id. Requests are written under
//! the connection's send lock by the callers; one reader thread per connection hands each reply
//! to the caller waiting for it.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::conn::CallError;
use crate::wire::{self, Budget, FrameError, Header, OpError, Status, FLAG_REPLY};

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The outcome of one request: the reply's op and payload, or why there is none.
type Outcome = Result<(u16, Vec<u8>), CallError>;

/// Where a request's reply is delivered.
#[derive(Default)]
struct Slot {
    outcome: Mutex<Option<Outcome>>,
    ready: Condvar,
}

impl Slot {
    fn deliver(&self, o: Outcome) {
        *locked(&self.outcome) = Some(o);
        self.ready.notify_all();
    }
}

/// One TCP connection and the requests waiting on it.
struct Wire {
    send: Mutex<TcpStream>,
    /// Requests sent and not answered, by request id; `None` once the connection failed.
    waiting: Mutex<Option<HashMap<u64, Arc<Slot>>>>,
}

impl Wire {
    /// Fails every waiting request and closes the socket (the reader thread then ends).
    fn fail(&self, addr: SocketAddr, why: &str) {
        let _ = locked(&self.send).shutdown(Shutdown::Both);
        let Some(waiting) = locked(&self.waiting).take() else {
            return;
        };
        for slot in waiting.into_values() {
            slot.deliver(Err(transport(
                addr,
                io::Error::new(io::ErrorKind::ConnectionAborted, why.to_string()),
            )));
        }
    }
}

fn transport(addr: SocketAddr, err: io::Error) -> CallError {
    CallError::Transport { addr, err }
}

/// A request written and not yet answered ([`Link::send`]).
pub struct Sent {
    wire: Arc<Wire>,
    slot: Arc<Slot>,
    req_id: u64,
    op: u16,
    flags: u16,
    epoch: u32,
    /// Sent on a connection opened for it (a failure is not retried).
    fresh: bool,
}

/// The connection to one peer address, opened when first needed and again after a failure.
pub struct Link {
    addr: SocketAddr,
    current: Mutex<Option<Arc<Wire>>>,
    next_id: AtomicU64,
    connect_timeout: Duration,
    io_timeout: Duration,
}

impl Link {
    pub fn new(addr: SocketAddr, connect_timeout: Duration, io_timeout: Duration) -> Link {
        Link {
            addr,
            current: Mutex::new(None),
            next_id: AtomicU64::new(1),
            connect_timeout,
            io_timeout,
        }
    }

    /// Closes the connection (its waiting requests fail); the next request opens another.
    pub fn reset(&self) {
        if let Some(w) = locked(&self.current).take() {
            w.fail(self.addr, "connection reset");
        }
    }

    /// The open connection, or a new one (and whether it is new).
    fn wire(&self) -> Result<(Arc<Wire>, bool), CallError> {
        let mut cur = locked(&self.current);
        if let Some(w) = cur.as_ref().filter(|w| locked(&w.waiting).is_some()) {
            return Ok((w.clone(), false));
        }
        let s = TcpStream::connect_timeout(&self.addr, self.connect_timeout)
            .and_then(|s| {
                s.set_nodelay(true)?;
                s.set_write_timeout(Some(self.io_timeout))?;
                Ok(s)
            })
            .map_err(|e| transport(self.addr, e))?;
        let reader = s.try_clone().map_err(|e| transport(self.addr, e))?;
        let w = Arc::new(Wire {
            send: Mutex::new(s),
            waiting: Mutex::new(Some(HashMap::new())),
        });
        let (addr, w2) = (self.addr, w.clone());
        std::thread::Builder::new()
            .name("osd-link-reader".into())
            .spawn(move || read_replies(addr, reader, w2))
            .map_err(|e| transport(self.addr, e))?;
        *cur = Some(w.clone());
        Ok((w, true))
    }

    /// Sends one request without waiting for its reply ([`finish`](Self::finish) waits):
    /// requests of many callers, to one peer or several, are then in flight at once.
    pub fn send(&self, op: u16, flags: u16, epoch: u32, payload: &[u8]) -> Result<Sent, CallError> {
        let (wire, fresh) = self.wire()?;
        let (wire, fresh, (req_id, slot)) = match self.write_on(&wire, op, flags, epoch, payload) {
            Ok(w) => (wire, fresh, w),
            Err(_) if !fresh => {
                self.drop_wire(&wire, "send failed");
                let (wire, _) = self.wire()?;
                let w = self.write_on(&wire, op, flags, epoch, payload)?;
                (wire, true, w)
            }
            Err(e) => return Err(e),
        };
        Ok(Sent {
            wire,
            slot,
            req_id,
            op,
            flags,
            epoch,
            fresh,
        })
    }

    fn drop_wire(&self, wire: &Arc<Wire>, why: &str) {
        let mut cur = locked(&self.current);
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, wire)) {
            *cur = None;
        }
        drop(cur);
        wire.fail(self.addr, why);
    }

    fn write_on(
        &self,
        wire: &Wire,
        op: u16,
        flags: u16,
        epoch: u32,
        payload: &[u8],
    ) -> Result<(u64, Arc<Slot>), CallError> {
        let req_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let h = Header::request(op, flags, epoch, req_id, payload)?;
        let slot = Arc::new(Slot::default());
        match locked(&wire.waiting).as_mut() {
            Some(w) => w.insert(req_id, slot.clone()),
            None => {
                return Err(transport(
                    self.addr,
                    io::ErrorKind::ConnectionAborted.into(),
                ))
            }
        };
        let r = wire::write_frame(&mut *locked(&wire.send), &h, payload);
        if let Err(e) = r {
            if let Some(w) = locked(&wire.waiting).as_mut() {
                w.remove(&req_id);
            }
            return Err(transport(self.addr, e));
        }
        Ok((req_id, slot))
    }

    /// Waits for the reply of a request [`send`](Self::send) sent (at most the I/O timeout,
    /// after which the connection is closed). A request on a reused connection that failed is
    /// sent once more on a new connection (`payload`, the same request).
    pub fn finish(&self, sent: Sent, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let Sent {
            wire,
            slot,
            req_id,
            op,
            flags,
            epoch,
            fresh,
        } = sent;
        match self.wait(&wire, &slot, req_id, op) {
            Err(CallError::Transport { .. }) if !fresh => {
                self.drop_wire(&wire, "connection failed");
                let again = self.send(op, flags, epoch, payload)?;
                self.wait(&again.wire, &again.slot, again.req_id, op)
            }
            r => r,
        }
    }

    fn wait(
        &self,
        wire: &Arc<Wire>,
        slot: &Slot,
        req_id: u64,
        op: u16,
    ) -> Result<Vec<u8>, CallError> {
        let deadline = Instant::now() + self.io_timeout;
        let mut o = locked(&slot.outcome);
        loop {
            if let Some(r) = o.take() {
                return match r {
                    Ok((rop, buf)) if rop == op => Ok(buf),
                    Ok(_) => {
                        drop(o);
                        self.drop_wire(wire, "reply does not match the request");
                        Err(transport(
                            self.addr,
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                "reply does not match the request",
                            ),
                        ))
                    }
                    Err(e) => Err(e),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                drop(o);
                if let Some(w) = locked(&wire.waiting).as_mut() {
                    w.remove(&req_id);
                }
                self.drop_wire(wire, "reply timed out");
                return Err(transport(self.addr, io::ErrorKind::TimedOut.into()));
            }
            o = match slot.ready.wait_timeout(o, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// The reader of one connection: delivers each reply to its request until the connection
/// fails or closes, then fails the requests still waiting.
fn read_replies(addr: SocketAddr, mut s: TcpStream, wire: Arc<Wire>) {
    let budget = Budget::new(u64::MAX / 2);
    let why = loop {
        let (h, p) = match wire::read_frame(&mut s, u32::MAX, &budget) {
            Ok(f) => f,
            Err(FrameError::Closed) => break "closed by the peer".to_string(),
            Err(e) => break format!("{e:?}"),
        };
        if h.flags & FLAG_REPLY == 0 {
            break "a request where a reply was due".into();
        }
        let Some(slot) = locked(&wire.waiting)
            .as_mut()
            .and_then(|w| w.remove(&h.req_id))
        else {
            // A reply whose caller gave up (timed out): nothing waits for it.
            continue;
        };
        let buf = std::mem::take(&mut { p }.buf);
        let outcome = if h.status == 0 {
            Ok((h.op, buf))
        } else {
            let status = Status::from_u16(h.status).unwrap_or(Status::Io);
            Err(OpError::new(status, String::from_utf8_lossy(&buf)).into())
        };
        slot.deliver(outcome);
    };
    wire.fail(addr, &why);
}
