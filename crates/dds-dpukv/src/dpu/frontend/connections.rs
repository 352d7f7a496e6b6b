//! Client connections: accepting them, reading and parsing their RESP commands, keeping each
//! connection's replies in request order (finished replies move to the output as the ones before
//! them finish), writing them out, and the `SO_REUSEPORT` listener of an endpoint.

use super::{Conn, Entry, Frontend};
use anyhow::{Context, Result};
use dds_resp::session::Session;
use dds_resp::{parse_command, reuse, Argv, Reply};
use mio::{Interest, Token};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;

impl Frontend {
    pub(super) fn accept(&mut self) {
        loop {
            let (mut stream, _) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let live = self.conns.len() - self.free.len();
            if live >= self.cfg.max_clients {
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if self
                .poll
                .registry()
                .register(
                    &mut stream,
                    Token(i),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .is_err()
            {
                self.free.push(i);
                continue;
            }
            let gen = self.next_gen;
            self.next_gen = self.next_gen.wrapping_add(1);
            self.conns[i] = Some(Conn {
                stream,
                gen,
                input: Vec::new(),
                out: Vec::new(),
                out_at: 0,
                pending: VecDeque::new(),
                head: 0,
                session: Session {
                    id: u64::from(gen),
                    authed: true,
                    name: None,
                    resp3: false,
                },
                close_after: false,
                dead: false,
                paused: false,
                backlog: false,
            });
            self.stats.clients.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Reads what connection `i` has and runs its complete commands.
    pub(super) fn serve(&mut self, i: usize, scratch: &mut [u8], argv: &mut Argv) {
        self.touched.push(i);
        loop {
            let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
                return;
            };
            c.paused = false;
            if c.dead || c.close_after {
                return;
            }
            if c.pending.len() >= self.cfg.max_pending {
                c.paused = true;
                return;
            }
            let n = if std::mem::take(&mut c.backlog) {
                0
            } else {
                match c.stream.read(scratch) {
                    Ok(0) => {
                        c.dead = true;
                        return;
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(_) => {
                        c.dead = true;
                        return;
                    }
                }
            };
            let mut input = std::mem::take(&mut c.input);
            let from_input = !input.is_empty();
            if from_input {
                input.extend_from_slice(&scratch[..n]);
            }
            let buf: &[u8] = if from_input { &input } else { &scratch[..n] };
            let mut at = 0;
            let mut spare: Vec<&[u8]> = Vec::new();
            let mut full = false;
            loop {
                let c = self.conns[i].as_mut().expect("live");
                if c.close_after {
                    break;
                }
                if c.pending.len() >= self.cfg.max_pending {
                    full = true;
                    break;
                }
                match parse_command(&buf[at..], &self.limits, argv) {
                    Ok(Some(used)) => {
                        let mut args = reuse(std::mem::take(&mut spare));
                        args.extend(argv.iter(&buf[at..]));
                        at += used;
                        if !args.is_empty() {
                            self.command(i, &args, used);
                        }
                        spare = reuse(args);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let c = self.conns[i].as_mut().expect("live");
                        self.stats.commands.fetch_add(1, Ordering::Relaxed);
                        let mut out = Vec::new();
                        Reply::new(&mut out).error(&e.reply_text());
                        ready(c, out);
                        c.close_after = true;
                        break;
                    }
                }
            }
            let c = self.conns[i].as_mut().expect("live");
            if from_input {
                input.drain(..at);
            } else if at < n {
                input.extend_from_slice(&scratch[at..n]);
            }
            c.backlog = full && !input.is_empty();
            if input.len() > self.cfg.query_buffer_limit {
                let mut out = Vec::new();
                Reply::new(&mut out).error("ERR Protocol error: query buffer limit exceeded");
                ready(c, out);
                input = Vec::new();
                c.close_after = true;
            }
            c.input = if input.is_empty() { Vec::new() } else { input };
        }
    }
}

impl Frontend {
    /// Sends pending replies; closes connections that are done.
    pub(super) fn flush_out(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        while !c.dead && c.out_at < c.out.len() {
            match c.stream.write(&c.out[c.out_at..]) {
                Ok(0) => c.dead = true,
                Ok(n) => c.out_at += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => c.dead = true,
            }
        }
        if c.out_at == c.out.len() {
            c.out.clear();
            c.out_at = 0;
            if c.out.capacity() > 1 << 20 {
                c.out = Vec::new();
            }
        }
        let done = c.dead || (c.close_after && c.out.is_empty() && c.pending.is_empty());
        if done {
            let mut c = self.conns[i].take().expect("live");
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(i);
            self.stats.clients.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Appends a finished reply to a connection, in its order.
pub(super) fn ready(c: &mut Conn, bytes: Vec<u8>) {
    if c.pending.is_empty() {
        c.out.extend_from_slice(&bytes);
        c.head += 1;
    } else {
        c.pending.push_back(Entry::Ready(bytes));
    }
}

/// Moves finished replies at the head of the connection's queue to its output.
pub(super) fn drain(c: &mut Conn) {
    while let Some(Entry::Ready(_)) = c.pending.front() {
        if let Some(Entry::Ready(b)) = c.pending.pop_front() {
            c.out.extend_from_slice(&b);
        }
        c.head += 1;
    }
    if let Some(Entry::Wait(w)) = c.pending.front() {
        if w.left > 0 {
            return;
        }
        // An error collected with nothing left to wait for.
        let Some(Entry::Wait(w)) = c.pending.pop_front() else {
            unreachable!()
        };
        let mut r = Reply::with_protocol(&mut c.out, c.session.resp3);
        r.error(w.err.as_deref().unwrap_or("ERR internal: no reply"));
        c.head += 1;
        drain(c);
    }
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
