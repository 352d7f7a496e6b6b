//! A client connection and its buffers.

use std::collections::VecDeque;
use std::net::SocketAddr;

use mio::net::TcpStream;

use dds_offload_api::{KeyMap, Malformed, OffloadApp, Phase, Session, ERROR_REPLY_MAX};

use crate::buffer::Buf;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Entry {
    /// The next host response answers it; it may be sent once the lane's invalidations up to
    /// `gate` are applied.
    Host { gate: u64 },
    /// An offloaded read in context `ctx`.
    Dpu { ctx: u32 },
    /// A DPU response already copied into `cout` (copy mode), `len` bytes.
    Copied { len: u32 },
    /// A unit of the host's opening exchange (a session's, `docs/offload.md` §5c), `len`
    /// bytes of `hin`, relayed without a request.
    Relay { len: u32 },
    /// The last entry of a connection whose message was refused: the error reply in
    /// `Conn::err` (none when empty), after which the connection closes.
    Error,
}

pub(crate) struct Conn {
    pub(crate) gen: u32,
    pub(crate) split: bool,
    pub(crate) client: TcpStream,
    pub(crate) host: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) host_connected: bool,
    pub(crate) c_readable: bool,
    pub(crate) c_writable: bool,
    pub(crate) h_readable: bool,
    pub(crate) h_writable: bool,
    pub(crate) cin: Buf,
    pub(crate) hout: Buf,
    pub(crate) hin: Buf,
    pub(crate) cout: Buf,
    pub(crate) order: VecDeque<Entry>,
    /// Entries retired from the front of `order` so far: entry `order[k]` is the connection's
    /// entry number `popped + k`.
    pub(crate) popped: u64,
    /// Entry number of the last entry of each message in `order`, oldest first (entries of
    /// retired messages are dropped lazily).
    pub(crate) msg_ends: VecDeque<u64>,
    pub(crate) host_pending: usize,
    pub(crate) head_sent: usize,
    pub(crate) inval_seq: u64,
    /// Host requests forwarded / answered (retired) on this connection.
    pub(crate) host_issued: u64,
    pub(crate) host_retired: u64,
    /// Keys that forwarded host requests may modify, masked for this connection's lookups
    /// until the request with ordinal `pend_ord[i]` is answered (FIFO from `pend_head`).
    pub(crate) pend_keys: Vec<u64>,
    pub(crate) pend_ord: Vec<u64>,
    pub(crate) pend_head: usize,
    /// `pend_keys` as a map (key → occurrences), for O(1) lookups.
    pub(crate) pend_set: KeyMap,
    pub(crate) dpu_ctxs: usize,
    /// Offloaded reads of this connection in the file service.
    pub(crate) dpu_inflight: usize,
    /// Write-after-read barrier: only this many bytes of `hout` may go to the host until
    /// `dpu_inflight` is 0 (a host request that modifies keys must not overtake earlier
    /// offloaded reads of the connection).
    pub(crate) hold: Option<usize>,
    pub(crate) client_eof: bool,
    pub(crate) host_eof: bool,
    pub(crate) host_wr_shut: bool,
    pub(crate) dirty: bool,
    /// A client send of the ring names this connection's bytes: nothing of it is touched
    /// until the send completes (within the round).
    pub(crate) sending: bool,
    /// Likewise for a send of `hout` to the host: `hout` is not touched (no message is
    /// processed) until it completes.
    pub(crate) host_sending: bool,
    pub(crate) retry: bool,
    pub(crate) gated: bool,
    /// Why a client message was refused: an [`Entry::Error`] ends `order`, no further
    /// message is framed and the client's further bytes are discarded.
    pub(crate) refused: Option<&'static str>,
    /// The app's error reply for the refused message (`err_len` bytes).
    pub(crate) err: [u8; ERROR_REPLY_MAX],
    pub(crate) err_len: usize,
    /// The error reply went out and the client's write side is shut: the connection closes
    /// at the client's end of stream.
    pub(crate) err_sent: bool,
    /// Client bytes discarded since the refusal (bounded by the app's message limit).
    pub(crate) discarded: usize,
    /// The app's state of this connection, when it keeps one.
    pub(crate) session: Option<Box<dyn Session>>,
    /// Bytes at the front of `hin` queued as [`Entry::Relay`] entries: host responses are
    /// framed after them.
    pub(crate) relayed: usize,
}

impl Conn {
    /// Whether the connection is in an opening exchange (or waits for the host's part of it).
    pub(crate) fn opening(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| s.phase() != Phase::Requests)
    }

    /// Framing of the client's stream: the session's in its opening, the app's otherwise.
    pub(crate) fn message_len(
        &self,
        app: &dyn OffloadApp,
        buf: &[u8],
    ) -> Result<Option<usize>, Malformed> {
        match &self.session {
            Some(s) if s.phase() != Phase::Requests => s.opening_message_len(buf),
            _ => app.message_len(buf),
        }
    }

    /// Framing of the host's responses (after the relayed bytes): the session's, or the
    /// app's.
    pub(crate) fn response_len(
        &self,
        app: &dyn OffloadApp,
        buf: &[u8],
    ) -> Result<Option<usize>, Malformed> {
        response_len(app, self.session.as_deref(), buf)
    }
}

/// Framing of a host response by the connection's session, or by the app without one.
pub(crate) fn response_len(
    app: &dyn OffloadApp,
    session: Option<&dyn Session>,
    buf: &[u8],
) -> Result<Option<usize>, Malformed> {
    match session {
        Some(s) => s.response_len(buf),
        None => app.response_len(buf),
    }
}

pub(crate) enum Close {
    /// Orderly: both directions done.
    Done,
    /// Malformed input or protocol error: log and close.
    Malformed(&'static str),
    /// A reset or I/O error on one side: reset the other.
    Abort(&'static str),
    /// The director's memory budget cannot hold what the connection needs.
    OutOfMemory,
}
