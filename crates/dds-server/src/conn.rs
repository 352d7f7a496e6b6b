//! One connection of the slab: its socket, the incomplete request it keeps, the replies it
//! has not sent, and the memory they are charged.

use std::io::{ErrorKind, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;

use crate::budget::Budget;
use crate::ConnId;

pub(crate) struct Conn<S> {
    pub(crate) id: ConnId,
    pub(crate) stream: TcpStream,
    pub(crate) session: Option<S>,
    /// Unparsed input: an incomplete request, or input held while a request is pending.
    pub(crate) input: Vec<u8>,
    /// Replies not yet sent: `out[out_at..]`.
    pub(crate) out: Vec<u8>,
    pub(crate) out_at: usize,
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
            out: Vec::new(),
            out_at: 0,
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
        self.out.len() - self.out_at
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
        if self.out_at == self.out.len() {
            self.out_at = 0;
            if self.out.capacity() > keep {
                // A burst is over: its memory goes back.
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
        let cap = self.input.capacity() + self.out.capacity();
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
