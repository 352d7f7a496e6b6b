//! The front end as a service of the server runtime: client sessions, parsing their RESP
//! commands (up to the pending limit), completing the replies whose KV responses arrived, the
//! loop's cadence while requests are in flight, and the `SO_REUSEPORT` listener of an
//! endpoint.

use super::requests::{pump, send_batches, Sink};
use super::{Backend, FrontSession, FrontState, SPIN};
use anyhow::{Context, Result};
use dds_resp::session::Session;
use dds_resp::{parse_command, reuse, Reply};
use dds_server::{Completions, ConnId, Out, Service, Ticket, Verdict};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A front-end thread's service: its state, the endpoint's stop flag and the loop's own (set
/// on a stop or when the backend fails).
pub(crate) struct FrontService<'a> {
    pub(crate) st: FrontState,
    pub(crate) stop: &'a AtomicBool,
    pub(crate) halt: &'a AtomicBool,
}

impl FrontService<'_> {
    fn watch(&mut self) {
        if self.stop.load(Ordering::Relaxed) || self.st.fault.is_some() {
            self.halt.store(true, Ordering::Relaxed);
        }
    }
}

impl FrontState {
    /// The backend failed: the front end stops (its clients lose their connections).
    pub(super) fn failed(&mut self, e: anyhow::Error) {
        if self.fault.is_none() {
            tracing::error!(error = %e, "KV queue pair failed: the front end stops");
            self.fault = Some(e);
        }
    }

    /// Replies pending on a connection (reserved ones and those written behind them).
    fn pending(s: &FrontSession) -> usize {
        (s.waiting + s.behind) as usize
    }
}

impl Service for FrontService<'_> {
    type Session = FrontSession;

    fn open(&mut self, _id: ConnId) -> FrontSession {
        let st = &mut self.st;
        st.stats.connections.fetch_add(1, Ordering::Relaxed);
        st.stats.clients.fetch_add(1, Ordering::Relaxed);
        let id = st.next_id;
        st.next_id += 1;
        FrontSession {
            session: Session {
                id,
                authed: true,
                name: None,
                resp3: false,
            },
            waiting: 0,
            behind: 0,
            paused: false,
        }
    }

    fn on_input(
        &mut self,
        id: ConnId,
        s: &mut FrontSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let st = &mut self.st;
        st.last_work = Instant::now();
        let mut at = 0;
        let mut argv = std::mem::take(&mut st.argv);
        let mut spare = std::mem::take(&mut st.spare);
        let verdict = loop {
            if FrontState::pending(s) >= st.cfg.max_pending {
                // Read no more from this client until its replies drain; what it sent
                // already runs then.
                s.paused = true;
                break Verdict::Pending;
            }
            match parse_command(&input[at..], &st.limits, &mut argv) {
                Ok(Some(used)) => {
                    let mut args = reuse(spare);
                    args.extend(argv.iter(&input[at..]));
                    at += used;
                    let mut close = false;
                    if !args.is_empty() {
                        let waiting = s.waiting;
                        close = st.command(id, s, &args, used, out);
                        if s.waiting == waiting && s.waiting > 0 {
                            s.behind += 1;
                        }
                    }
                    spare = reuse(args);
                    if close {
                        break Verdict::Close;
                    }
                }
                Ok(None) => break Verdict::Continue,
                Err(e) => {
                    st.stats.commands.fetch_add(1, Ordering::Relaxed);
                    Reply::new(out).error_bytes(&e.reply_parts());
                    at = input.len();
                    break Verdict::Close;
                }
            }
        };
        st.argv = argv;
        st.spare = reuse(spare);
        (at, verdict)
    }

    fn input_overflow(&mut self, out: &mut Out<'_>) {
        Reply::new(out).error("ERR Protocol error: query buffer limit exceeded");
    }

    fn rejected(&self) -> &'static [u8] {
        b"-ERR max number of clients reached\r\n"
    }

    fn complete(&mut self, done: &mut Completions<'_, FrontSession>) {
        self.watch();
        let st = &mut self.st;
        let max_pending = st.cfg.max_pending;
        let mut staged = std::mem::take(&mut st.staged);
        for mut x in staged.drain(..) {
            if let Some((s, buf)) = done.fill(x.conn, Ticket::from_u32(x.ticket)) {
                buf.extend_from_slice(&x.bytes);
                if filled(s, max_pending) {
                    done.resume(x.conn);
                }
            }
            x.bytes.clear();
            st.bufs.push(x.bytes);
        }
        st.staged = staged;
        if st.fault.is_some() {
            return;
        }
        let FrontState {
            backend,
            stats,
            waits,
            free_waits,
            ..
        } = st;
        let Backend::Queues(q) = backend else {
            return;
        };
        let mut sink = Sink::Done { done, max_pending };
        let r = send_batches(q, stats)
            .and_then(|()| pump(q, stats, waits, free_waits, &mut sink))
            .map(|got| {
                if got {
                    st.last_work = Instant::now();
                }
            });
        if let Err(e) = r {
            st.failed(e.into());
            self.watch();
        }
    }

    fn end_round(&mut self) -> bool {
        // The round's requests leave now rather than at the next pass.
        if let Backend::Queues(q) = &mut self.st.backend {
            if self.st.fault.is_none() {
                if let Err(e) = send_batches(q, &self.st.stats) {
                    self.st.failed(e.into());
                }
            }
        }
        true
    }

    fn tick(&mut self) {
        self.watch();
    }

    fn closed(&mut self, _id: ConnId, _s: FrontSession) {
        self.st.stats.clients.fetch_sub(1, Ordering::Relaxed);
    }

    fn prepare_sleep(&mut self) -> bool {
        // Responses are found by polling the queue pairs (DMA reads of host memory): no
        // descriptor signals them. Poll without sleeping while requests are in flight, and
        // for a moment after the last work.
        let st = &self.st;
        let busy = matches!(&st.backend, Backend::Queues(q) if q.busy()) && st.fault.is_none();
        !busy && st.staged.is_empty() && st.last_work.elapsed() >= SPIN
    }

    fn in_flight(&self) -> usize {
        match &self.st.backend {
            Backend::Queues(q) if self.st.fault.is_none() => q.in_flight(),
            _ => 0,
        }
    }
}

/// A reserved reply of the connection was filled: true when the connection, paused at the
/// pending limit, may be read again.
pub(super) fn filled(s: &mut FrontSession, max_pending: usize) -> bool {
    s.waiting = s.waiting.saturating_sub(1);
    if s.waiting == 0 {
        s.behind = 0;
    }
    if s.paused && FrontState::pending(s) < max_pending / 2 {
        s.paused = false;
        return true;
    }
    false
}

/// A `SO_REUSEPORT` listener: every front-end thread of an endpoint binds one and the kernel
/// spreads connections over them.
pub fn reuseport_listener(addr: SocketAddr) -> Result<std::net::TcpListener> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket(family, SocketType::STREAM, None).context("socket")?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &addr).with_context(|| format!("bind {addr}"))?;
    rustix::net::listen(&fd, 1024).context("listen")?;
    Ok(std::net::TcpListener::from(fd))
}
