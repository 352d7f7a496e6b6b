//! The server runtime of the DDS services (`docs/server-runtime.md`).
//!
//! One event loop per thread serves every connection of a [`Service`]: the service is a codec
//! and an engine (bytes in, replies out, in each connection's request order); the runtime owns
//! the sockets and applies one policy to all of them:
//!
//! - a connection slab bounded by [`Config::max_connections`] (more are answered
//!   [`Service::rejected`] and closed);
//! - input read into one scratch buffer and parsed where it lands, so an idle connection owns
//!   no memory; only an incomplete request is kept (in a buffer lent by the loop's bounded
//!   pool, given back once the request completed), charged to a [`Budget`] shared by every
//!   loop, and bounded per connection ([`Config::input_limit`]);
//! - one output-buffer policy: replies accumulate until the round ends, reading pauses while
//!   more than [`Config::output_pause`] bytes wait for the client, and a buffer larger than
//!   [`Config::output_keep`] is released once it has been sent;
//! - a deadline for incomplete requests and an idle limit, so that slow or half-sent requests
//!   cannot hold a slot forever;
//! - pending operations, two ways: a request that waits for storage makes
//!   [`Service::on_input`] return [`Verdict::Pending`] (the connection is offered no more
//!   input until the service resumes it: for requests that must run in order), or reserves its
//!   reply's place with [`Out::defer`] and lets the connection go on (independent requests:
//!   many in flight per connection; later replies wait behind the reserved one). Either way
//!   the loop serves the other connections meanwhile, and the service completes the operation
//!   through [`Completions`]. The service's completion source (an eventfd of the storage
//!   library) wakes the loop like a socket;
//! - rounds: replies produced in a round leave after [`Service::end_round`] (cache
//!   invalidations, the start of a group commit); when it fails, the round's connections are
//!   closed unanswered. A reply already written that must wait (for a commit in flight) is
//!   held with [`Out::defer_written`];
//! - drain on stop: no new connections or requests, pending operations complete and replies
//!   are sent (at most [`Config::drain`]), then [`Service::shutdown`];
//! - two I/O backends under that one loop ([`Backend`]): io_uring (multishot accept, multishot
//!   receive into a ring of buffers lent to the kernel, every connection's replies handed over
//!   by the one system call that also waits) where the kernel has it, epoll otherwise.

#![warn(missing_docs)]

mod budget;
mod conn;
mod counters;
mod epoll;
mod event_loop;
mod io;
mod uring;

pub use uring::BufRing;

pub use budget::Budget;
pub use conn::{Out, Ticket};
pub use event_loop::{bind_listener, Completions, LoopCounters, LoopStats, Server};
pub use io::BACKEND_ENV;

use std::os::fd::RawFd;
use std::time::Duration;

/// A connection: its slot in the slab and the slot's generation (a closed connection's id
/// never matches the slot's next occupant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    /// Slot in the slab.
    pub slot: u32,
    /// Generation of the slot.
    pub gen: u32,
}

impl ConnId {
    /// The id as one word (e.g. an I/O context of the storage library).
    pub fn to_u64(self) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(self.slot)
    }
    /// The id of [`ConnId::to_u64`].
    pub fn from_u64(v: u64) -> ConnId {
        ConnId {
            slot: v as u32,
            gen: (v >> 32) as u32,
        }
    }
}

/// What a connection does after [`Service::on_input`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Offer more input when it comes.
    Continue,
    /// A request waits for an operation: offer no more input until the service resumes the
    /// connection ([`Completions::resume`]).
    Pending,
    /// Send the replies so far, then close (a protocol error, QUIT).
    Close,
}

/// How an event loop does its I/O (`docs/server-runtime.md`, Shape).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// [`BACKEND_ENV`]: `auto` (also when unset: io_uring when the kernel has what it needs,
    /// epoll when it is missing, too old or refused), `uring`, or `epoll`.
    #[default]
    Auto,
    /// Readiness: epoll; a system call per read and per write.
    Epoll,
    /// Completions: io_uring with multishot accept and receive into provided buffers, and
    /// one submission per round for every connection's replies.
    Uring,
}

/// Settings of an event loop.
#[derive(Clone, Debug)]
pub struct Config {
    /// Most connections (more are answered [`Service::rejected`] and closed).
    pub max_connections: usize,
    /// Most unparsed input of one connection (an incomplete request).
    pub input_limit: usize,
    /// Waiting output above which a connection is not read until its client takes it.
    pub output_pause: usize,
    /// Output capacity kept by a connection after its replies were sent; more is released.
    pub output_keep: usize,
    /// An incomplete request older than this closes its connection.
    pub frame_deadline: Option<Duration>,
    /// A connection that sent nothing for this long (and waits for nothing) is closed.
    pub idle_limit: Option<Duration>,
    /// Most time between two [`Service::tick`] calls.
    pub tick: Duration,
    /// How long a stop waits for pending operations and unsent replies.
    pub drain: Duration,
    /// Bytes read from a socket at once (the shared scratch buffer; with io_uring, the size
    /// of each receive buffer).
    pub read_bytes: usize,
    /// The I/O backend.
    pub backend: Backend,
    /// With io_uring: receive buffers lent to the kernel (a power of two; bytes that arrived
    /// and are not parsed yet hold one until the end of their round).
    pub recv_buffers: usize,
    /// With io_uring: completion queue entries of the loop's ring (its submission queue has
    /// an eighth, at most 1024). Completions past a full queue wait in the kernel, and the
    /// multishot requests that could not post end and are started again.
    pub ring_entries: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_connections: 10_000,
            input_limit: 64 << 20,
            output_pause: 16 << 20,
            output_keep: 64 << 10,
            frame_deadline: None,
            idle_limit: None,
            tick: Duration::from_millis(100),
            drain: Duration::from_secs(5),
            read_bytes: 64 << 10,
            backend: Backend::Auto,
            recv_buffers: 256,
            ring_entries: 8192,
        }
    }
}

/// A protocol and its engine, served by a [`Server`].
pub trait Service {
    /// Per-connection state.
    type Session;

    /// A new connection.
    fn open(&mut self, id: ConnId) -> Self::Session;

    /// What the server says first, for a protocol whose server speaks before the client (the
    /// NBD handshake): written to `out` once the connection is accepted, sent with the round's
    /// replies.
    fn greet(&mut self, _id: ConnId, _session: &mut Self::Session, _out: &mut Out<'_>) {}

    /// Runs the complete requests at the start of `input`, appending their replies to `out`
    /// (or reserving their places with [`Out::defer`], to fill when their operations
    /// complete); returns the bytes they took and what the connection does next. With
    /// [`Verdict::Pending`], the bytes not taken are offered again after the connection is
    /// resumed.
    fn on_input(
        &mut self,
        id: ConnId,
        session: &mut Self::Session,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict);

    /// The reply to a connection whose incomplete request outgrew [`Config::input_limit`]
    /// (it is closed after it).
    fn input_overflow(&mut self, out: &mut Out<'_>);

    /// What a connection over [`Config::max_connections`] is told before it is closed.
    fn rejected(&self) -> &'static [u8];

    /// Completes the operations that finished: writes their replies and resumes their
    /// connections through `done`.
    fn complete(&mut self, done: &mut Completions<'_, Self::Session>);

    /// Called before a round's replies are sent; false withholds them (their connections
    /// are closed unanswered).
    fn end_round(&mut self) -> bool {
        true
    }

    /// Called at least every [`Config::tick`].
    fn tick(&mut self) {}

    /// The earliest time the service wants [`Service::complete`] called even if nothing
    /// happens (a pending request's deadline); the loop sleeps no longer than that.
    fn wake_at(&self) -> Option<std::time::Instant> {
        None
    }

    /// A connection closed (its pending operations, if any, complete into nothing).
    fn closed(&mut self, _id: ConnId, _session: Self::Session) {}

    /// A descriptor that becomes readable when operations complete (registered with the
    /// loop's poller), if the service has one.
    fn wake_fd(&self) -> Option<RawFd> {
        None
    }

    /// Called before the loop sleeps: false when completions are already waiting (the loop
    /// then does not sleep). A service with a [`Service::wake_fd`] announces here that it
    /// wants to be woken.
    fn prepare_sleep(&mut self) -> bool {
        true
    }

    /// Called after the loop woke (see [`Service::prepare_sleep`]).
    fn end_sleep(&mut self) {}

    /// Operations in flight (a stop waits for them).
    fn in_flight(&self) -> usize {
        0
    }

    /// The loop begins its drain (a stop): requests that wait for an event of their own
    /// rather than an operation in flight (a blocking pop) may give up here; they are closed
    /// through [`Completions`] at the next [`Service::complete`].
    fn draining(&mut self) {}

    /// The loop stopped: last work (a final commit).
    fn shutdown(&mut self) {}
}
