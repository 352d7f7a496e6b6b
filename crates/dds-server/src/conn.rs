//! One connection of the slab: its socket, the incomplete request it keeps, the replies it
//! has not sent, and the memory they are charged.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Instant;

use std::net::TcpStream;

use crate::budget::Budget;
use crate::ConnId;

/// Replies that wait behind a deferred one: a reserved slot (`ticket` ≠ 0) or replies written
/// after it.
pub(crate) struct Part {
    pub(crate) ticket: u32,
    pub(crate) filled: bool,
    pub(crate) bytes: Vec<u8>,
}

/// A reply slot reserved with [`Out::defer`], filled later through
/// [`Completions::fill`](crate::Completions::fill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(pub(crate) u32);

impl Ticket {
    /// The ticket as a number (to keep with the operation it waits for).
    pub fn to_u32(self) -> u32 {
        self.0
    }
    /// The ticket of [`Ticket::to_u32`].
    pub fn from_u32(v: u32) -> Ticket {
        Ticket(v)
    }
}

/// Where a connection's replies go, in request order. It derefs to the byte buffer the next
/// reply is appended to; [`Out::defer`] reserves a slot for a reply that comes later (the
/// replies after it wait until it is filled).
pub struct Out<'a> {
    pub(crate) out: &'a mut Vec<u8>,
    pub(crate) held: &'a mut VecDeque<Part>,
    pub(crate) next_ticket: &'a mut u32,
    pub(crate) spare: &'a mut Vec<Vec<u8>>,
}

impl Out<'_> {
    /// Reserves the next reply's place; the reply is written when its operation completes.
    pub fn defer(&mut self) -> Ticket {
        let a = self.spare.pop().unwrap_or_default();
        self.defer_with(a)
    }

    /// Reserves a place for the reply already written since `from` (an offset into the buffer
    /// this sink derefs to, taken before the reply was written): those bytes move into the
    /// slot and leave when it is released with [`Completions::fill`](crate::Completions::fill)
    /// (which may add to them), in request order like any reserved reply. For a reply that
    /// must wait for something its request did (a commit).
    pub fn defer_written(&mut self, from: usize) -> Ticket {
        let mut a = self.spare.pop().unwrap_or_default();
        a.clear();
        a.extend_from_slice(&self[from..]);
        self.truncate(from);
        self.defer_with(a)
    }

    fn defer_with(&mut self, a: Vec<u8>) -> Ticket {
        *self.next_ticket = self.next_ticket.wrapping_add(1).max(1);
        let t = *self.next_ticket;
        let b = self.spare.pop().unwrap_or_default();
        self.held.push_back(Part {
            ticket: t,
            filled: false,
            bytes: a,
        });
        self.held.push_back(Part {
            ticket: 0,
            filled: true,
            bytes: b,
        });
        Ticket(t)
    }

    /// Reserved slots not filled yet.
    pub fn deferred(&self) -> usize {
        self.held
            .iter()
            .filter(|p| p.ticket != 0 && !p.filled)
            .count()
    }
}

impl Deref for Out<'_> {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        match self.held.back() {
            Some(p) => &p.bytes,
            None => self.out,
        }
    }
}

impl DerefMut for Out<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        match self.held.back_mut() {
            Some(p) => &mut p.bytes,
            None => self.out,
        }
    }
}

pub(crate) struct Conn<S> {
    pub(crate) id: ConnId,
    /// The socket (non-blocking).
    pub(crate) stream: TcpStream,
    pub(crate) session: Option<S>,
    /// Unparsed input: an incomplete request, or input held while a request is pending.
    pub(crate) input: Vec<u8>,
    /// Bytes received for the connection while it took no input (a completion-based backend
    /// receives before it is asked): read before the socket's next ones.
    pub(crate) unread: Vec<u8>,
    /// Replies not yet sent: `out[out_at..]`.
    pub(crate) out: Vec<u8>,
    pub(crate) out_at: usize,
    /// Replies handed to the kernel and not yet reported sent (a completion-based backend
    /// sends from a buffer of its own).
    pub(crate) sending: usize,
    /// Capacity of the buffer those replies are sent from.
    pub(crate) sending_cap: usize,
    /// Replies behind a deferred one, in order.
    pub(crate) held: VecDeque<Part>,
    pub(crate) next_ticket: u32,
    /// Emptied buffers of parts, for the next ones.
    pub(crate) spare: Vec<Vec<u8>>,
    /// Capacity charged to the budget.
    pub(crate) charged: usize,
    /// The socket may have bytes to read (edge-triggered: until a read would block).
    pub(crate) readable: bool,
    /// The socket may take bytes.
    pub(crate) writable: bool,
    /// A request waits for an operation; no more input is offered.
    pub(crate) pending: bool,
    /// `input` holds bytes the service has not been offered since it last took some.
    pub(crate) unoffered: bool,
    /// Send what is there, then close.
    pub(crate) close_after: bool,
    /// Closed by the peer or by an error: drop at once.
    pub(crate) dead: bool,
    pub(crate) eof: bool,
    /// In the round's list of connections to flush.
    pub(crate) touched: bool,
    /// Since when `input` holds an incomplete request.
    pub(crate) partial_since: Option<Instant>,
    pub(crate) last_active: Instant,
}

pub(crate) enum ReadOutcome {
    /// `n` bytes were read.
    Data(usize),
    /// Nothing now.
    WouldBlock,
    /// The peer closed or the socket failed.
    Closed,
}

impl<S> Conn<S> {
    pub(crate) fn new(id: ConnId, stream: TcpStream, session: S, now: Instant) -> Conn<S> {
        Conn {
            id,
            stream,
            session: Some(session),
            input: Vec::new(),
            unread: Vec::new(),
            out: Vec::new(),
            out_at: 0,
            sending: 0,
            sending_cap: 0,
            held: VecDeque::new(),
            next_ticket: 0,
            spare: Vec::new(),
            charged: 0,
            readable: true,
            writable: true,
            pending: false,
            unoffered: false,
            close_after: false,
            dead: false,
            eof: false,
            touched: false,
            partial_since: None,
            last_active: now,
        }
    }

    pub(crate) fn unsent(&self) -> usize {
        self.out.len() - self.out_at + self.sending
    }

    /// The connection's reply sink.
    pub(crate) fn sink(&mut self) -> Out<'_> {
        Out {
            out: &mut self.out,
            held: &mut self.held,
            next_ticket: &mut self.next_ticket,
            spare: &mut self.spare,
        }
    }

    /// Deferred replies not filled yet.
    pub(crate) fn waiting(&self) -> bool {
        self.held.iter().any(|p| p.ticket != 0 && !p.filled)
    }

    /// Moves the replies that no longer wait behind a deferred one to the output (a copy).
    pub(crate) fn promote(&mut self) {
        while self.held.front().is_some_and(|p| p.filled) {
            let mut p = self.held.pop_front().expect("front");
            self.out.extend_from_slice(&p.bytes);
            p.bytes.clear();
            self.spare.push(p.bytes);
        }
    }

    pub(crate) fn read(&mut self, buf: &mut [u8]) -> ReadOutcome {
        loop {
            return match self.stream.read(buf) {
                Ok(0) => {
                    self.eof = true;
                    ReadOutcome::Closed
                }
                Ok(n) => ReadOutcome::Data(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    self.readable = false;
                    ReadOutcome::WouldBlock
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => ReadOutcome::Closed,
            };
        }
    }

    /// Sends what it can; applies the output policy once everything is sent.
    pub(crate) fn flush(&mut self, keep: usize) {
        while !self.dead && self.writable && self.out_at < self.out.len() {
            match self.stream.write(&self.out[self.out_at..]) {
                Ok(0) => self.dead = true,
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => self.writable = false,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        self.settle(keep);
    }

    /// The output policy: spare part buffers and a sent output larger than `keep` are
    /// released (a burst's memory goes back); a partly sent output drops its sent prefix
    /// past 1 MiB.
    pub(crate) fn settle(&mut self, keep: usize) {
        if self.held.is_empty() {
            self.spare.retain(|b| b.capacity() <= keep);
        }
        if self.out_at == self.out.len() {
            self.out_at = 0;
            if self.out.capacity() > keep {
                self.out = Vec::new();
            } else {
                self.out.clear();
            }
        } else if self.out_at > (1 << 20) {
            self.out.drain(..self.out_at);
            self.out_at = 0;
        }
    }

    /// Charges the buffers' capacity to `budget`; false when the budget cannot pay.
    pub(crate) fn charge(&mut self, budget: &Arc<Budget>) -> bool {
        let held: usize = self.held.iter().map(|p| p.bytes.capacity()).sum();
        let spare: usize = self.spare.iter().map(Vec::capacity).sum();
        let cap = self.input.capacity()
            + self.unread.capacity()
            + self.out.capacity()
            + self.sending_cap
            + held
            + spare;
        if cap > self.charged {
            if !budget.take(cap - self.charged) {
                return false;
            }
        } else if cap < self.charged {
            budget.give(self.charged - cap);
        }
        self.charged = cap;
        true
    }

    /// Returns every charged byte (the connection is closing).
    pub(crate) fn uncharge(&mut self, budget: &Arc<Budget>) {
        budget.give(self.charged);
        self.charged = 0;
    }
}
