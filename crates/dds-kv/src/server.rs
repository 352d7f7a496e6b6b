//! The event loop of `dds kv`: one thread owns the store and serves every connection
//! (`docs/kv-service.md` §5). A round reads what the sockets have, runs the complete commands,
//! makes the round's writes durable (fsync mode) and drops stale DPU cache entries, and only
//! then sends the round's replies.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dds_resp::{parse_command, reuse, Argv, Limits, Reply};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};

use crate::commands::{execute, After, Ctx, ServerInfo, Session};
use crate::engine::Engine;
use crate::store::Durability;

/// Settings of the server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to listen on (loopback by default).
    pub listen: SocketAddr,
    /// `requirepass`: clients must AUTH first.
    pub password: Option<String>,
    /// Most connected clients.
    pub max_clients: usize,
    /// Most unparsed input of one connection (Redis's client-query-buffer-limit).
    pub query_buffer_limit: usize,
    /// Pending replies above which a connection is not read until its client takes them.
    pub output_pause: usize,
    /// Commit interval in `periodic` mode.
    pub sync_interval: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:6379".parse().expect("address"),
            password: None,
            max_clients: 10_000,
            query_buffer_limit: 64 << 20,
            output_pause: 16 << 20,
            sync_interval: Duration::from_secs(1),
        }
    }
}

const LISTENER: Token = Token(usize::MAX);
const SCRATCH: usize = 64 << 10;

struct Conn {
    stream: TcpStream,
    /// Unparsed input (empty, and without memory, while the connection is idle).
    input: Vec<u8>,
    out: Vec<u8>,
    out_at: usize,
    session: Session,
    close_after: bool,
    dead: bool,
    /// Readable data may be left (reading paused for output back-pressure).
    more: bool,
}

/// The `dds kv` server.
pub struct Server {
    cfg: ServerConfig,
    listener: TcpListener,
    poll: Poll,
    store: Box<dyn Engine>,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    info: ServerInfo,
    limits: Limits,
    next_id: u64,
}

impl Server {
    /// Binds the listening socket.
    pub fn bind(cfg: ServerConfig, store: Box<dyn Engine>, storage: String) -> Result<Server> {
        let listener =
            TcpListener::bind(cfg.listen).with_context(|| format!("listen on {}", cfg.listen))?;
        let poll = Poll::new()?;
        let mut listener = listener;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let port = listener.local_addr()?.port();
        let (max_key, max_value) = store.limits();
        let limits = Limits {
            max_bulk: max_value.max(max_key) + 1024,
            ..Limits::default()
        };
        let durability = match store.durability() {
            Durability::None => "none",
            Durability::Periodic => "periodic",
            Durability::Fsync => "fsync",
        };
        Ok(Server {
            info: ServerInfo {
                clients: 0,
                commands: 0,
                connections: 0,
                rejected: 0,
                started: Instant::now(),
                port,
                durability,
                storage,
            },
            cfg,
            listener,
            poll,
            store,
            conns: Vec::new(),
            free: Vec::new(),
            limits,
            next_id: 1,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `stop` is set; then commits and closes the store.
    pub fn run(mut self, stop: &AtomicBool) -> Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut scratch = vec![0u8; SCRATCH];
        let mut argv = Argv::new();
        let mut touched: Vec<usize> = Vec::new();
        let mut next_sync = Instant::now() + self.cfg.sync_interval;
        while !stop.load(Ordering::Relaxed) {
            let timeout = next_sync
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == ErrorKind::Interrupted {
                    continue;
                }
                return Err(e).context("poll");
            }
            for ev in events.iter() {
                if ev.token() == LISTENER {
                    self.accept();
                    continue;
                }
                let i = ev.token().0;
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    self.serve(i, &mut scratch, &mut argv);
                }
                touched.push(i);
            }
            // Connections that paused reading for back-pressure and can go on.
            for i in 0..self.conns.len() {
                let resume = self.conns[i]
                    .as_ref()
                    .is_some_and(|c| c.more && c.out.len() - c.out_at < self.cfg.output_pause);
                if resume {
                    self.serve(i, &mut scratch, &mut argv);
                    touched.push(i);
                }
            }
            if touched.is_empty() && Instant::now() < next_sync {
                continue;
            }
            let ok = self.end_round();
            if Instant::now() >= next_sync {
                if self.store.durability() == Durability::Periodic {
                    if let Err(e) = self.store.commit() {
                        tracing::error!(error = %e, "periodic commit failed");
                    }
                }
                next_sync = Instant::now() + self.cfg.sync_interval;
            }
            touched.sort_unstable();
            touched.dedup();
            for &i in &touched {
                if !ok {
                    // The round's writes are not known to be durable or coherent: its
                    // replies are not sent, and the clients see their connections drop.
                    if let Some(c) = self.conns[i].as_mut() {
                        c.dead = true;
                    }
                }
                self.flush_out(i);
            }
            touched.clear();
        }
        for i in 0..self.conns.len() {
            self.flush_out(i);
        }
        self.store.close()
    }

    /// DPU-cache coherence and durability of the round's writes, before its replies.
    ///
    /// The invalidations go first: they drop the cache entries of records that were on
    /// storage before this round (their cache-on-write is long done), and the commit that
    /// follows writes the round's new records, which the DPU then caches at newer versions.
    /// The other order would drop the new records' entries too.
    fn end_round(&mut self) -> bool {
        if let Err(e) = self.store.invalidate_now() {
            tracing::error!(error = %e, "DPU cache invalidation failed: the round's replies are withheld");
            return false;
        }
        if self.store.durability() == Durability::Fsync {
            if let Err(e) = self.store.commit() {
                tracing::error!(error = %e, "commit failed: the round's replies are withheld");
                return false;
            }
        }
        true
    }

    fn accept(&mut self) {
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    return;
                }
            };
            self.info.connections += 1;
            if self.info.clients >= self.cfg.max_clients {
                self.info.rejected += 1;
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let i = self.free.pop().unwrap_or_else(|| {
                self.conns.push(None);
                self.conns.len() - 1
            });
            if let Err(e) = self.poll.registry().register(
                &mut stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                tracing::warn!(error = %e, %peer, "register failed");
                self.free.push(i);
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.conns[i] = Some(Conn {
                stream,
                input: Vec::new(),
                out: Vec::new(),
                out_at: 0,
                session: Session {
                    id,
                    authed: self.cfg.password.is_none(),
                    name: None,
                    resp3: false,
                },
                close_after: false,
                dead: false,
                more: false,
            });
            self.info.clients += 1;
        }
    }

    /// Reads what the connection has and runs its complete commands.
    fn serve(&mut self, i: usize, scratch: &mut [u8], argv: &mut Argv) {
        let Some(c) = self.conns.get_mut(i).and_then(Option::as_mut) else {
            return;
        };
        c.more = false;
        loop {
            if c.dead || c.close_after {
                return;
            }
            if c.out.len() - c.out_at >= self.cfg.output_pause {
                c.more = true;
                return;
            }
            let n = match c.stream.read(scratch) {
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
            };
            // Commands are parsed where the bytes are: in the scratch buffer when nothing is
            // pending, so an idle connection keeps no buffer.
            let from_input = !c.input.is_empty();
            if from_input {
                c.input.extend_from_slice(&scratch[..n]);
            }
            let buf: &[u8] = if from_input { &c.input } else { &scratch[..n] };
            let mut at = 0;
            let mut spare: Vec<&[u8]> = Vec::new();
            loop {
                if c.close_after {
                    break;
                }
                match parse_command(&buf[at..], &self.limits, argv) {
                    Ok(Some(used)) => {
                        let mut argvs = reuse(std::mem::take(&mut spare));
                        argvs.extend(argv.iter(&buf[at..]));
                        at += used;
                        if !argvs.is_empty() {
                            self.info.commands += 1;
                            let mut ctx = Ctx {
                                store: self.store.as_mut(),
                                session: &mut c.session,
                                info: &self.info,
                                password: self.cfg.password.as_deref(),
                            };
                            if execute(&mut ctx, &argvs, &mut c.out) == After::Close {
                                c.close_after = true;
                            }
                        }
                        spare = reuse(argvs);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        Reply::new(&mut c.out).error(&e.reply_text());
                        c.close_after = true;
                        break;
                    }
                }
            }
            let left = buf.len() - at;
            if from_input {
                c.input.drain(..at);
            } else if left > 0 {
                c.input.extend_from_slice(&scratch[at..n]);
            }
            if c.input.is_empty() {
                c.input = Vec::new();
            }
            if c.input.len() > self.cfg.query_buffer_limit {
                Reply::new(&mut c.out).error("ERR Protocol error: query buffer limit exceeded");
                c.input = Vec::new();
                c.close_after = true;
                tracing::warn!(id = c.session.id, "query buffer limit exceeded: closing");
            }
        }
    }

    /// Sends pending replies; closes connections that are done.
    fn flush_out(&mut self, i: usize) {
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
            c.out = Vec::new();
            c.out_at = 0;
        } else if c.out_at > (1 << 20) {
            c.out.drain(..c.out_at);
            c.out_at = 0;
        }
        let done = c.dead || (c.close_after && c.out.is_empty());
        if done {
            let mut c = self.conns[i].take().expect("live");
            if c.close_after && !c.dead {
                // Take what the client still sends (bounded), so that closing does not reset
                // the connection before it has read the error reply.
                let mut sink = [0u8; 16 << 10];
                for _ in 0..64 {
                    match c.stream.read(&mut sink) {
                        Ok(n) if n > 0 => {}
                        _ => break,
                    }
                }
            }
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.free.push(i);
            self.info.clients -= 1;
        }
    }
}
