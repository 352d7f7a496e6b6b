//! The `dds kv` service on the server runtime (`dds-server`, `docs/server-runtime.md`): one
//! event-loop thread owns the store and serves every connection (`docs/kv-service.md` §5).
//!
//! A command that reads a key whose record is on storage only does not wait for it: the
//! record's read is issued through the host library's asynchronous API, the command (still in
//! the connection's input) becomes pending, and the loop serves other connections. When the
//! reads complete the command runs, taking the records read ahead instead of reading
//! storage. A round's replies leave after the DPU's stale cache entries are dropped. In
//! `fsync` mode a reply that depends on a write not yet durable (the command wrote, or read a
//! record above the durable end) is held in its connection's order until the group commit
//! that covers it completes; the loop serves other connections meanwhile.

use std::collections::{HashMap, HashSet, VecDeque};

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dds_resp::{parse_command, reuse, Argv, Limits, Reply};
use dds_server::{Budget, Completions, Config, ConnId, Out, Service, Ticket, Verdict};
use dds_storage::fileio::IoDone;
use dds_storage::inflight::InFlightReads;

use crate::commands::{
    execute, popped_end, read_elements, read_keys, read_list_elements, After, Ctx, ServerInfo,
    Session,
};
use crate::engine::Engine;
use crate::keyspace::{passes, scan_args};
use crate::record;
use crate::store::{Durability, Fetched, SCAN_STORAGE_MAX};

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
    /// Bytes all connection buffers may hold together.
    pub memory_budget: usize,
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
            memory_budget: 4 << 30,
        }
    }
}

/// Device block: a record's first read covers the blocks it starts in (a read of whole
/// blocks costs the device one operation; one that starts inside a block costs it a second
/// block and the file service a bounce copy).
const BLOCK: u64 = 4096;
/// First read of a record whose length is not known yet (the whole record when it is
/// smaller; else a second read of the rest).
const FIRST_READ: usize = 4096;
/// Rounds of reads ahead one command may take before it runs anyway (a key updated again and
/// again meanwhile is then read while the command waits).
const MAX_FETCH_ROUNDS: u8 = 2;
/// Replies of one connection waiting for a commit above which it is not read until half of
/// them are sent.
const ACKS_MAX: u32 = 1024;
/// Keys per step of a KEYS walk (a step also ends before its 17th record on storage).
const KEYS_STEP: usize = 1024;

/// A connection's state.
pub struct KvSession {
    session: Session,
    /// Records read ahead for the connection's pending command.
    fetched: Vec<Fetched>,
    /// Reads of the pending command still in flight.
    outstanding: u32,
    /// The pending pop's place in its list end's `pops_ahead` (key hash, left end, count).
    pop_claim: Option<(u64, bool, u32)>,
    /// The element the pending random pick (SPOP key, SRANDMEMBER key, ...) drew when its
    /// read ahead was issued: (key hash, sub-key hash).
    drawn: Option<((u64, u64), (u64, u64))>,
    /// Rounds of reads ahead the pending command took.
    rounds: u8,
    /// Replies waiting for a commit.
    acks: u32,
    /// Pending until its replies waiting for a commit fall below half of `ACKS_MAX`.
    commit_blocked: bool,
    /// A KEYS walk is in progress: the next step's cursor, the keys found and their reply
    /// bytes, and whether a step read a record that is not durable.
    walking: bool,
    walk_cursor: u64,
    walk_keys: usize,
    walk_body: Vec<u8>,
    walk_undurable: bool,
    /// Parked by a blocking pop (BLPOP and its kin) until a write gives one of its keys
    /// elements or its deadline passes (`Some(None)`: no deadline); the command stays in
    /// the input and runs again then.
    parked: Option<Option<Instant>>,
    /// The connection's place among the parked (first parked, first served), kept while it
    /// parks again after a wake-up that found nothing left.
    park_seq: u64,
    /// Inside MULTI: the commands queued for EXEC, their bytes, and whether one was refused
    /// (EXEC then answers EXECABORT).
    multi: Option<Vec<Vec<Vec<u8>>>>,
    multi_bytes: usize,
    multi_failed: bool,
    /// The keys WATCH named (by hash) until the next EXEC, DISCARD or UNWATCH.
    watching: Vec<(u64, u64)>,
}

/// A connection parked by a blocking pop.
struct Parked {
    conn: ConnId,
    seq: u64,
    wait: crate::lists::Wait,
}

/// How often parked connections are looked at for clients that left.
const PARKED_SWEEP: Duration = Duration::from_millis(100);

/// A reply held until the commit that covers its command is durable.
#[derive(Clone, Copy)]
struct Ack {
    conn: ConnId,
    ticket: Ticket,
    /// The log's tail after the command: durable once the durable end reaches it.
    need: u64,
}

/// What a read in flight is for.
#[derive(Clone, Copy)]
struct Read {
    conn: ConnId,
    addr: u64,
    /// The read covers the whole record (its length was known).
    whole: bool,
    /// Bytes read before the record (the read starts at the record's block).
    skip: usize,
}

/// The `dds kv` service: the Redis protocol over an engine.
pub struct KvService {
    store: Box<dyn Engine>,
    info: ServerInfo,
    limits: Limits,
    password: Option<String>,
    argv: Argv,
    spare: Vec<&'static [u8]>,
    /// The engine reads records on storage ahead of their commands.
    reads_ahead: bool,
    /// Replies held for durability, in the order of their `need`.
    acks: VecDeque<Ack>,
    fsync: bool,
    /// Reads in flight, each tagged with its place + 1.
    reads: InFlightReads<Read, Vec<u8>>,
    /// Buffers of finished reads, for the next ones.
    bufs: Vec<Vec<u8>>,
    completions: Vec<IoDone>,
    sync_interval: Duration,
    next_sync: Instant,
    /// Time the active expiry cycle may take per tick.
    expire_budget: Duration,
    /// Most bytes of commands one transaction may queue.
    multi_limit: usize,
    /// Watched keys (by hash): the connections watching each.
    watchers: HashMap<(u64, u64), Vec<ConnId>>,
    /// Connections one of whose watched keys was written since their WATCH: their EXEC
    /// answers a null array and runs nothing.
    watch_dirty: HashSet<ConnId>,
    /// Parked connections CLIENT UNBLOCK released: to resume (true: with the error reply,
    /// false: as timed out), then how their command answers when it runs again.
    unblocks: Vec<(ConnId, bool)>,
    unblocked: HashMap<ConnId, bool>,
    /// Connections that stopped after a command that fed a parked one (resumed after it).
    yielded: Vec<ConnId>,
    /// Connections parked by blocking pops, in the order they first parked.
    parked: Vec<Parked>,
    /// Last number handed to a parked connection.
    park_seq: u64,
    /// Parked connections per key they wait for (by hash).
    parked_keys: HashMap<(u64, u64), u32>,
    /// Keys with parked connections that commands wrote since the last wake-up (Redis's
    /// ready keys): only their waiters are looked at.
    ready_keys: Vec<Vec<u8>>,
    next_parked_sweep: Instant,
    /// The server stops: parked connections are closed, not woken.
    stopping: bool,
    /// Elements of a list end (key hash, left end) that pending pops have read ahead and
    /// will take: the next pop of that end reads the elements beyond them.
    pops_ahead: HashMap<(u64, bool), u32>,
}

impl KvService {
    /// A buffer of `len` bytes for a read (a used one keeps its bytes: the read overwrites
    /// them, so only growth is zeroed).
    fn take_buf(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.bufs.pop().unwrap_or_default();
        b.resize(len, 0);
        b
    }

    fn give_buf(&mut self, b: Vec<u8>) {
        self.bufs.push(b);
    }

    /// Issues a read of `len` bytes starting `skip` bytes before the record at `addr` for
    /// `conn`; false when it could not be issued (the command then reads while it runs).
    fn fetch(
        &mut self,
        conn: ConnId,
        addr: u64,
        (skip, len): (usize, usize),
        whole: bool,
        buf: Vec<u8>,
    ) -> bool {
        let (off, _) = self.store.file_span(addr);
        let Some(f) = self.store.io() else {
            return false;
        };
        let read = Read {
            conn,
            addr,
            whole,
            skip,
        };
        let slot = self.reads.take_place(|| (read, Vec::new()));
        *self.reads.state_mut(slot) = read;
        let b = self.reads.buf_mut(slot);
        *b = buf;
        b.resize(len, 0);
        let at = off - skip as u64;
        match self.reads.issue(f, 0, slot, at, u64::from(slot) + 1) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(?e, "read ahead not issued: the command will wait");
                let b = std::mem::take(self.reads.buf_mut(slot));
                self.reads.release(slot);
                self.give_buf(b);
                false
            }
        }
    }

    /// Issues the reads a command needs before it runs; returns how many.
    fn fetch_for(&mut self, id: ConnId, s: &mut KvSession, argv: &[&[u8]]) -> u32 {
        if !self.reads_ahead || s.rounds >= MAX_FETCH_ROUNDS {
            return 0;
        }
        let mut want = [0u64; SCAN_STORAGE_MAX];
        let mut n = 0;
        let mut more = false;
        if argv.len() == 1 && argv[0].eq_ignore_ascii_case(b"randomkey") && s.rounds == 0 {
            // The key is chosen now, and its record read ahead when it is on storage.
            if let Some(a) = self.store.pick_random() {
                want[0] = a;
                n = 1;
            }
        }
        // A single random pick: drawn now, its record read ahead; the command takes it when
        // it runs, while it is still an element.
        let mut drawn = None;
        let mut drawn_addr = None;
        if argv.len() == 2 && s.drawn.is_none() {
            let is = |n: &str| argv[0].eq_ignore_ascii_case(n.as_bytes());
            if is("spop") || is("srandmember") || is("hrandfield") || is("zrandmember") {
                if let Some((kh, sub, addr)) = self.store.draw_element(argv[1]) {
                    drawn = Some((kh, sub));
                    drawn_addr = addr;
                }
            }
        }
        let store = &self.store;
        if argv[0].eq_ignore_ascii_case(b"scan") && argv.len() >= 2 {
            // The records on storage of the step, whose keys the reply names.
            if let Ok(a) = scan_args(argv) {
                store.scan_storage(a.cursor, a.count, &mut |addr| {
                    if n < want.len() && !s.fetched.iter().any(|f| f.addr == addr) {
                        want[n] = addr;
                        n += 1;
                    }
                });
            }
        }
        let mut push = |a: u64| {
            if s.fetched.iter().any(|f| f.addr == a) || want[..n].contains(&a) {
                return;
            }
            if n == want.len() {
                more = true;
                return;
            }
            want[n] = a;
            n += 1;
        };
        read_keys(argv, |k| {
            store.storage_addr(k).into_iter().for_each(&mut push)
        });
        read_elements(argv, |k, sub| {
            store
                .element_storage_addr(k, sub)
                .into_iter()
                .for_each(&mut push)
        });
        read_list_elements(argv, |k, i| {
            store
                .list_storage_addr(k, i)
                .into_iter()
                .for_each(&mut push)
        });
        // A pop: the elements it will take if the pops pending before it on that end take
        // theirs first (they run in the order their reads complete: about the order issued).
        // Read again at the end when that guess was wrong (another round).
        let mut claim = None;
        if let Some((key, left, count)) = popped_end(argv) {
            let kh = crate::record::key_hash(key).0;
            let ahead = match s.pop_claim {
                Some(_) => 0,
                None => self.pops_ahead.get(&(kh, left)).copied().unwrap_or(0),
            };
            for j in ahead..ahead + count {
                let i = if left { j as i64 } else { -1 - j as i64 };
                store
                    .list_storage_addr(key, i)
                    .into_iter()
                    .for_each(&mut push);
            }
            if s.pop_claim.is_none() {
                claim = Some((kh, left, count));
            }
        }
        drawn_addr.into_iter().for_each(&mut push);
        let _ = more; // Records past the first 16 are read while the command runs.
        let issued = self.fetch_records(id, &want[..n]);
        if issued > 0 {
            s.drawn = drawn;
            s.rounds += 1;
            if let Some(c @ (kh, left, count)) = claim {
                *self.pops_ahead.entry((kh, left)).or_insert(0) += count;
                s.pop_claim = Some(c);
            }
        }
        issued
    }

    /// The pending pop of `s` runs (or its connection closed): its elements leave the
    /// count of those read ahead.
    fn release_pop(&mut self, s: &mut KvSession) {
        if let Some((kh, left, count)) = s.pop_claim.take() {
            if let Some(n) = self.pops_ahead.get_mut(&(kh, left)) {
                *n = n.saturating_sub(count);
                if *n == 0 {
                    self.pops_ahead.remove(&(kh, left));
                }
            }
        }
    }

    /// Issues the reads of the records at `addrs` for `id`; returns how many were issued.
    fn fetch_records(&mut self, id: ConnId, addrs: &[u64]) -> u32 {
        let mut issued = 0;
        for &a in addrs {
            let (off, span) = self.store.file_span(a);
            let max = self.store.io_ref().map_or(0, |f| f.max_io());
            // From the record's block up to FIRST_READ bytes of the record, in whole blocks
            // where its page allows.
            let skip = (off % BLOCK) as usize;
            let end = (skip + span.min(FIRST_READ)).next_multiple_of(BLOCK as usize);
            let len = end.min(skip + span).min(max);
            if len <= skip {
                continue;
            }
            let buf = self.take_buf(len);
            if self.fetch(id, a, (skip, len), len - skip >= span, buf) {
                issued += 1;
            }
        }
        issued
    }

    /// Moves the KEYS walk of `s` along (`docs/kv-service.md` §5): runs its steps whose
    /// records on storage were read ahead, and issues the reads of the next step's; returns
    /// the reads issued (the command waits for them), or `None` once the walk is complete
    /// (the command then answers from it) or cannot go on (the command then walks itself).
    fn walk_keys(&mut self, id: ConnId, s: &mut KvSession, pattern: &[u8]) -> Option<u32> {
        if !s.walking {
            s.walking = true;
            s.walk_cursor = 0;
            s.walk_keys = 0;
            s.walk_body.clear();
            s.walk_undurable = false;
        }
        loop {
            let mut want = [0u64; SCAN_STORAGE_MAX];
            let mut n = 0;
            self.store.scan_storage(s.walk_cursor, KEYS_STEP, &mut |a| {
                if n < want.len() && !s.fetched.iter().any(|f| f.addr == a) {
                    want[n] = a;
                    n += 1;
                }
            });
            if n > 0 && s.rounds < MAX_FETCH_ROUNDS {
                let issued = self.fetch_records(id, &want[..n]);
                if issued > 0 {
                    s.rounds += 1;
                    return Some(issued);
                }
            }
            if let Some(f) = self.store.fetched() {
                std::mem::swap(f, &mut s.fetched);
            }
            let (body, keys) = (&mut s.walk_body, &mut s.walk_keys);
            let step = self.store.scan(s.walk_cursor, KEYS_STEP, false, &mut |k| {
                if passes(Some(pattern), k) {
                    Reply::new(body).bulk(k);
                    *keys += 1;
                }
            });
            s.walk_undurable |= self.store.take_undurable();
            if let Some(f) = self.store.fetched() {
                std::mem::swap(f, &mut s.fetched);
            }
            for f in s.fetched.drain(..) {
                self.bufs.push(f.bytes);
            }
            s.rounds = 0;
            match step {
                Ok(0) => return None,
                Ok(next) => s.walk_cursor = next,
                Err(e) => {
                    // The command walks again and answers the error.
                    tracing::debug!(error = %e, "a KEYS step failed");
                    s.walking = false;
                    return None;
                }
            }
        }
    }

    /// Releases the replies whose commit is durable (and resumes connections that waited for
    /// room among them); after a storage failure, closes the connections whose replies can
    /// no longer be made durable.
    fn complete_acks(&mut self, done: &mut Completions<'_, KvSession>) {
        let durable = self.store.durable_end();
        while let Some(a) = self.acks.front().copied() {
            if a.need > durable {
                break;
            }
            self.acks.pop_front();
            if let Some((s, _)) = done.fill(a.conn, a.ticket) {
                s.acks -= 1;
                if s.commit_blocked && s.acks < ACKS_MAX / 2 {
                    s.commit_blocked = false;
                    done.resume(a.conn);
                }
            }
        }
        if self.store.is_broken() && !self.acks.is_empty() {
            tracing::error!(
                replies = self.acks.len(),
                "storage failed: replies waiting for a commit are withheld"
            );
            for a in self.acks.drain(..) {
                done.close(a.conn);
            }
        }
    }

    /// Wakes the parked connections whose keys have elements now (first parked first) or
    /// whose deadlines passed; every `PARKED_SWEEP`, closes those whose clients left (so that
    /// no element is popped for a client that is gone).
    fn wake_parked(&mut self, done: &mut Completions<'_, KvSession>) {
        if self.stopping && !self.parked.is_empty() {
            // As Redis at shutdown: a client still blocked is disconnected unanswered.
            for p in self.parked.drain(..) {
                done.close(p.conn);
            }
            self.parked_keys.clear();
        }
        for (conn, error) in self.unblocks.drain(..) {
            self.unblocked.insert(conn, error);
            done.resume(conn);
        }
        // The connections that stepped aside for parked ones go on once no parked one is
        // ready any more (a woken pop may feed another: BLMOVE chains run to their end).
        if self.wake_ready_parked(done) == 0 {
            for conn in self.yielded.drain(..) {
                done.resume(conn);
            }
        }
    }

    /// Resumes the parked connections that are ready or due: how many.
    fn wake_ready_parked(&mut self, done: &mut Completions<'_, KvSession>) -> usize {
        if self.parked.is_empty() {
            self.ready_keys.clear();
            return 0;
        }
        let now = Instant::now();
        let sweep = now >= self.next_parked_sweep;
        let due = |p: &Parked| p.wait.deadline.is_some_and(|d| now >= d);
        // The written keys that have elements now.
        let mut ready = std::mem::take(&mut self.ready_keys);
        ready.retain(|k| has_elements(self.store.as_mut(), k));
        if ready.is_empty() && !sweep && !self.parked.iter().any(due) {
            self.ready_keys = ready;
            return 0;
        }
        if sweep {
            self.next_parked_sweep = now + PARKED_SWEEP;
        }
        let store = &mut self.store;
        let parked_keys = &mut self.parked_keys;
        let mut woken = 0;
        self.parked.retain(|p| {
            let fed = p.wait.keys.iter().any(|k| {
                ready.contains(k) && matches!(store.coll_len(p.wait.ty, k), Ok(n) if n > 0)
            });
            let wake = fed || due(p);
            // A client that left is never woken: its pop would take an element nobody gets.
            if (sweep || wake) && done.peer_closed(p.conn) {
                done.close(p.conn);
                unpark_keys(parked_keys, &p.wait);
                return false;
            }
            if wake {
                done.resume(p.conn);
                unpark_keys(parked_keys, &p.wait);
                woken += 1;
            }
            !wake
        });
        ready.clear();
        self.ready_keys = ready;
        woken
    }

    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]` (Redis 7.0's): releases a connection parked by a
    /// blocking pop, which then answers as timed out or with `-UNBLOCKED ...`; 1 when it was
    /// parked, else 0.
    fn client_unblock(&mut self, argv: &[&[u8]], out: &mut Vec<u8>, resp3: bool) {
        let mut r = Reply::with_protocol(out, resp3);
        let error = match argv.get(3) {
            None => false,
            Some(a) if a.eq_ignore_ascii_case(b"timeout") => false,
            Some(a) if a.eq_ignore_ascii_case(b"error") => true,
            Some(_) => {
                r.error("ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR");
                return;
            }
        };
        let Some(id) = dds_resp::session::int_arg(argv[2]) else {
            r.error("ERR value is not an integer or out of range");
            return;
        };
        match self
            .parked
            .iter()
            .position(|p| p.conn.to_u64() == id as u64)
        {
            Some(i) => {
                let p = self.parked.remove(i);
                unpark_keys(&mut self.parked_keys, &p.wait);
                self.unblocks.push((p.conn, error));
                r.int(1);
            }
            None => r.int(0),
        }
    }

    /// Whether the last command gave a parked connection's key elements (it wrote a key that
    /// has waiters, and the key has elements).
    fn parked_ready(&mut self) -> bool {
        if self.parked.is_empty() {
            return false;
        }
        let store = self.store.as_mut();
        self.ready_keys.iter().any(|k| has_elements(store, k))
    }

    /// Parks connection `id` for the wait its command asked for.
    fn park(&mut self, id: ConnId, s: &mut KvSession, wait: crate::lists::Wait) {
        if s.parked.is_none() {
            self.park_seq += 1;
            s.park_seq = self.park_seq;
        }
        s.parked = Some(wait.deadline);
        for k in &wait.keys {
            *self.parked_keys.entry(record::key_hash(k)).or_insert(0) += 1;
        }
        let at = self.parked.partition_point(|p| p.seq < s.park_seq);
        self.parked.insert(
            at,
            Parked {
                conn: id,
                seq: s.park_seq,
                wait,
            },
        );
    }

    /// A command of a transaction (`docs/kv-service.md` §5, Transactions): MULTI starts one;
    /// inside it, EXEC runs the queued commands one after the other (nothing else runs in
    /// between: the loop is one thread), DISCARD drops them, QUIT runs, and every other
    /// command is checked and queued (`+QUEUED`).
    fn transaction(
        &mut self,
        id: ConnId,
        s: &mut KvSession,
        argv: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> After {
        let resp3 = s.session.resp3;
        let is = |n: &str| argv[0].eq_ignore_ascii_case(n.as_bytes());
        if s.multi.is_none() {
            let arity_ok = if is("watch") {
                argv.len() >= 2
            } else {
                argv.len() == 1
            };
            if !arity_ok {
                // The arity error, from the command table.
                return self.run(s, argv, out);
            }
            if is("watch") {
                for k in &argv[1..] {
                    let h = record::key_hash(k);
                    if !s.watching.contains(&h) {
                        s.watching.push(h);
                        self.watchers.entry(h).or_default().push(id);
                    }
                }
            } else if is("unwatch") {
                self.unwatch(id, s);
            } else {
                s.multi = Some(Vec::new());
                (s.multi_bytes, s.multi_failed) = (0, false);
            }
            Reply::new(out).ok();
            return After::Continue;
        }
        if is("quit") {
            return self.run(s, argv, out);
        }
        let mut r = Reply::with_protocol(out, resp3);
        if is("multi") && argv.len() == 1 {
            r.error("ERR MULTI calls can not be nested");
        } else if is("watch") {
            r.error("ERR WATCH inside MULTI is not allowed");
        } else if (is("exec") || is("discard")) && argv.len() == 1 {
            let queued = s.multi.take().unwrap_or_default();
            let dirty = self.watch_dirty.contains(&id);
            self.unwatch(id, s);
            if is("discard") {
                r.ok();
            } else if s.multi_failed {
                r.error("EXECABORT Transaction discarded because of previous errors.");
            } else if dirty {
                // A watched key was written since WATCH: nothing runs.
                r.null_array();
            } else {
                r.array(queued.len());
                self.info.block.deny = true;
                let mut after = After::Continue;
                for c in &queued {
                    let args: Vec<&[u8]> = c.iter().map(|a| &a[..]).collect();
                    if self.run(s, &args, out) == After::Close {
                        after = After::Close;
                    }
                }
                self.info.block.deny = false;
                return after;
            }
        } else if !crate::commands::queueable(argv, out, resp3) {
            s.multi_failed = true;
        } else if s.multi_bytes + argv.iter().map(|a| a.len()).sum::<usize>() > self.multi_limit {
            Reply::new(out).error("ERR transaction too large (limit: client-query-buffer-limit)");
            s.multi_failed = true;
        } else {
            s.multi_bytes += argv.iter().map(|a| a.len()).sum::<usize>();
            if let Some(q) = s.multi.as_mut() {
                q.push(argv.iter().map(|a| a.to_vec()).collect());
            }
            Reply::with_protocol(out, resp3).simple("QUEUED");
        }
        After::Continue
    }

    /// Forgets the keys connection `id` watches.
    fn unwatch(&mut self, id: ConnId, s: &mut KvSession) {
        for h in s.watching.drain(..) {
            if let Some(v) = self.watchers.get_mut(&h) {
                v.retain(|&c| c != id);
                if v.is_empty() {
                    self.watchers.remove(&h);
                }
            }
        }
        self.watch_dirty.remove(&id);
    }

    /// A command ran to its end; in one walk of the keys it may have written (the director's
    /// list of written keys: a superset of the keys it changed):
    /// - the connections watching one are marked (FLUSHDB and FLUSHALL mark every watcher);
    /// - one that parked connections wait for becomes a ready key (looked at before the
    ///   loop's next turn).
    fn note_writes(&mut self, argv: &[&[u8]]) {
        if self.watchers.is_empty() && self.parked_keys.is_empty() {
            return;
        }
        let (watchers, dirty) = (&self.watchers, &mut self.watch_dirty);
        let (parked_keys, ready) = (&self.parked_keys, &mut self.ready_keys);
        if argv[0].eq_ignore_ascii_case(b"flushall") || argv[0].eq_ignore_ascii_case(b"flushdb") {
            dirty.extend(watchers.values().flatten().copied());
        }
        crate::offload::for_write_keys(argv.iter().copied(), |k| {
            let h = record::key_hash(k);
            if let Some(v) = watchers.get(&h) {
                dirty.extend(v.iter().copied());
            }
            if parked_keys.contains_key(&h) && !ready.iter().any(|r| r == k) {
                ready.push(k.to_vec());
            }
        });
    }

    /// Runs one command with the connection's records read ahead.
    fn run(&mut self, s: &mut KvSession, argv: &[&[u8]], out: &mut Vec<u8>) -> After {
        if let Some(f) = self.store.fetched() {
            std::mem::swap(f, &mut s.fetched);
        }
        self.info.commands += 1;
        if s.walking {
            // A KEYS whose walk is complete answers from it.
            s.walking = false;
            std::mem::swap(&mut self.info.list_buf, &mut s.walk_body);
            self.info.keys_walked = Some(s.walk_keys);
        }
        self.info.block.resumed = s.parked;
        self.info.blocked_clients = self.parked.len();
        let mut ctx = Ctx {
            store: self.store.as_mut(),
            session: &mut s.session,
            info: &mut self.info,
            password: self.password.as_deref(),
        };
        let after = execute(&mut ctx, argv, out);
        self.info.block.resumed = None;
        if self.info.block.wait.is_none() {
            self.note_writes(argv);
        }
        if self.info.keys_walked.take().is_some() {
            std::mem::swap(&mut self.info.list_buf, &mut s.walk_body);
        }
        if let Some(f) = self.store.fetched() {
            std::mem::swap(f, &mut s.fetched);
        }
        for f in s.fetched.drain(..) {
            self.bufs.push(f.bytes);
        }
        s.rounds = 0;
        after
    }
}

impl Service for KvService {
    type Session = KvSession;

    fn open(&mut self, id: ConnId) -> KvSession {
        self.info.connections += 1;
        self.info.clients += 1;
        KvSession {
            session: Session {
                id: id.to_u64(),
                authed: self.password.is_none(),
                name: None,
                resp3: false,
            },
            fetched: Vec::new(),
            outstanding: 0,
            pop_claim: None,
            drawn: None,
            rounds: 0,
            acks: 0,
            commit_blocked: false,
            walking: false,
            walk_cursor: 0,
            walk_keys: 0,
            walk_body: Vec::new(),
            walk_undurable: false,
            parked: None,
            park_seq: 0,
            multi: None,
            multi_bytes: 0,
            multi_failed: false,
            watching: Vec::new(),
        }
    }

    fn on_input(
        &mut self,
        id: ConnId,
        s: &mut KvSession,
        input: &[u8],
        out: &mut Out<'_>,
    ) -> (usize, Verdict) {
        let mut at = 0;
        let mut argv = std::mem::take(&mut self.argv);
        let mut spare = std::mem::take(&mut self.spare);
        let verdict = loop {
            // Before AUTH (a password is set), Redis's tighter bounds.
            let limits = Limits {
                unauthenticated: !s.session.authed,
                ..self.limits
            };
            match parse_command(&input[at..], &limits, &mut argv) {
                Ok(Some(used)) => {
                    let mut args = reuse(spare);
                    args.extend(argv.iter(&input[at..]));
                    if args.is_empty() {
                        spare = reuse(args);
                        at += used;
                        continue;
                    }
                    // Inside MULTI (or at it), commands are queued or run by `transaction`,
                    // with no reads ahead.
                    let tx = s.session.authed
                        && (s.multi.is_some()
                            || [&b"multi"[..], b"watch", b"unwatch"]
                                .iter()
                                .any(|n| args[0].eq_ignore_ascii_case(n)));
                    if self.reads_ahead
                        && !tx
                        && s.session.authed
                        && args.len() == 2
                        && args[0].eq_ignore_ascii_case(b"keys")
                    {
                        if let Some(issued) = self.walk_keys(id, s, args[1]) {
                            // The walk waits for its next step's records.
                            s.outstanding = issued;
                            spare = reuse(args);
                            break Verdict::Pending;
                        }
                    }
                    if s.parked.is_some() {
                        if let Some(error) = self.unblocked.remove(&id) {
                            if error {
                                // CLIENT UNBLOCK ... ERROR: the command answers this instead.
                                Reply::new(out)
                                    .error("UNBLOCKED client unblocked via CLIENT UNBLOCK");
                                s.parked = None;
                                spare = reuse(args);
                                at += used;
                                continue;
                            }
                            // ... TIMEOUT: it runs as if its deadline had passed.
                            s.parked = Some(Some(Instant::now()));
                        }
                    }
                    if !tx
                        && s.session.authed
                        && (args.len() == 3 || args.len() == 4)
                        && args[0].eq_ignore_ascii_case(b"client")
                        && args[1].eq_ignore_ascii_case(b"unblock")
                    {
                        let resp3 = s.session.resp3;
                        self.client_unblock(&args, out, resp3);
                        spare = reuse(args);
                        at += used;
                        continue;
                    }
                    let issued = if tx { 0 } else { self.fetch_for(id, s, &args) };
                    if issued > 0 {
                        // The command stays in the input; it runs once its reads are done.
                        s.outstanding = issued;
                        spare = reuse(args);
                        break Verdict::Pending;
                    }
                    self.release_pop(s);
                    let mark = out.len();
                    self.store.take_undurable();
                    self.store.set_drawn(s.drawn.take());
                    let after = if tx {
                        self.transaction(id, s, &args, out)
                    } else {
                        self.run(s, &args, out)
                    };
                    self.store.set_drawn(None);
                    spare = reuse(args);
                    if let Some(wait) = self.info.block.wait.take() {
                        // A blocking pop found nothing: it stays in the input and runs again
                        // when woken (it wrote no reply and changed nothing).
                        debug_assert_eq!(out.len(), mark);
                        self.park(id, s, wait);
                        break Verdict::Pending;
                    }
                    s.parked = None;
                    at += used;
                    let walked = std::mem::take(&mut s.walk_undurable);
                    if self.fsync && (self.store.take_undurable() || walked) {
                        // The reply waits, in the connection's order, for the commit that
                        // covers what the command wrote or read.
                        let ticket = out.defer_written(mark);
                        self.acks.push_back(Ack {
                            conn: id,
                            ticket,
                            need: self.store.tail(),
                        });
                        s.acks += 1;
                        if s.acks >= ACKS_MAX && after != After::Close {
                            s.commit_blocked = true;
                            break Verdict::Pending;
                        }
                    }
                    if after == After::Close {
                        break Verdict::Close;
                    }
                    if self.parked_ready() {
                        // The command gave a parked connection's key elements: that
                        // connection runs before this one's next command, as Redis serves
                        // its blocked clients right after the command that fed them.
                        self.yielded.push(id);
                        break Verdict::Pending;
                    }
                }
                Ok(None) => break Verdict::Continue,
                Err(e) => {
                    Reply::new(out).error_bytes(&e.reply_parts());
                    at = input.len();
                    break Verdict::Close;
                }
            }
        };
        self.argv = argv;
        self.spare = reuse(spare);
        (at, verdict)
    }

    fn input_overflow(&mut self, out: &mut Out<'_>) {
        Reply::new(out).error("ERR Protocol error: query buffer limit exceeded");
    }

    fn rejected(&self) -> &'static [u8] {
        b"-ERR max number of clients reached\r\n"
    }

    fn complete(&mut self, done: &mut Completions<'_, KvSession>) {
        let mut completions = std::mem::take(&mut self.completions);
        self.store.poll_io(&mut completions);
        for &(tag, res) in &completions {
            // Tags are this service's own (slot + 1); anything else on the group is not ours.
            let slot = tag.wrapping_sub(1) as u32;
            if !self.reads.finish(slot) {
                tracing::warn!(tag, "a completion for no read in flight: ignored");
                continue;
            }
            let Read {
                conn,
                addr,
                whole,
                skip,
            } = *self.reads.state(slot);
            let mut buf = std::mem::take(self.reads.buf_mut(slot));
            self.reads.release(slot);
            let n = res.map_or(0, |n| n as usize);
            buf.truncate(n);
            // The record starts `skip` bytes in.
            let mut skip = skip.min(n);
            if !whole {
                // The first bytes tell the record's length: read the rest when it is longer.
                if let Some(h) = record::decode_header(&buf[skip..]) {
                    let (_, span) = self.store.file_span(addr);
                    let max = self.store.io_ref().map_or(0, |f| f.max_io());
                    if h.len() > n - skip && h.len() <= span.min(max) {
                        let len = h.len();
                        if self.fetch(conn, addr, (0, len), true, buf) {
                            continue;
                        }
                        buf = self.take_buf(0);
                        skip = 0;
                    }
                }
            }
            match done.reply(conn) {
                Some((s, _)) => {
                    s.fetched.push(Fetched {
                        addr,
                        skip,
                        bytes: buf,
                    });
                    s.outstanding -= 1;
                    if s.outstanding == 0 {
                        done.resume(conn);
                    }
                }
                None => self.give_buf(buf),
            }
        }
        completions.clear();
        self.completions = completions;
        self.complete_acks(done);
        self.wake_parked(done);
    }

    fn end_round(&mut self) -> bool {
        // The invalidations go first: they drop the cache entries of records that were on
        // storage before this round (their cache-on-write is long done), and the commit that
        // follows writes the round's new records, which the DPU then caches at newer
        // versions. The other order would drop the new records' entries too.
        if let Err(e) = self.store.invalidate_now() {
            tracing::error!(error = %e, "DPU cache invalidation failed: the round's replies are withheld");
            return false;
        }
        if self.fsync {
            // Group commit: the round's writes go into the commit in flight's successor
            // (its replies are held until it is durable, see `on_input`).
            if let Err(e) = self.store.start_commit() {
                tracing::error!(error = %e, "commit failed: the round's replies are withheld");
                return false;
            }
        }
        true
    }

    fn tick(&mut self) {
        // Redis's active expiry cycle, at most a quarter of a tick.
        if self.info.active_expire {
            self.store.active_expire(self.expire_budget);
        }
        if Instant::now() < self.next_sync {
            return;
        }
        if self.store.durability() == Durability::Periodic {
            if let Err(e) = self.store.start_commit() {
                tracing::error!(error = %e, "periodic commit failed");
            }
        }
        self.next_sync = Instant::now() + self.sync_interval;
    }

    fn closed(&mut self, id: ConnId, mut s: KvSession) {
        self.release_pop(&mut s);
        self.unblocked.remove(&id);
        self.yielded.retain(|&c| c != id);
        if !s.watching.is_empty() {
            self.unwatch(id, &mut s);
        }
        if s.parked.is_some() {
            let parked_keys = &mut self.parked_keys;
            self.parked.retain(|p| {
                if p.conn == id {
                    unpark_keys(parked_keys, &p.wait);
                }
                p.conn != id
            });
        }
        if s.acks > 0 {
            self.acks.retain(|a| a.conn != id);
        }
        self.info.clients -= 1;
        for f in s.fetched.drain(..) {
            self.give_buf(f.bytes);
        }
    }

    fn draining(&mut self) {
        self.stopping = true;
    }

    fn wake_at(&self) -> Option<Instant> {
        if !self.unblocks.is_empty() || !self.yielded.is_empty() {
            return Some(Instant::now());
        }
        // The earliest deadline of a parked blocking pop.
        self.parked.iter().filter_map(|p| p.wait.deadline).min()
    }

    fn wake_fd(&self) -> Option<RawFd> {
        self.store.io_ref().and_then(|f| f.wake_fd())
    }

    fn prepare_sleep(&mut self) -> bool {
        !self.store.io_ready() && self.store.io_ref().is_none_or(|f| f.prepare_sleep())
    }

    fn end_sleep(&mut self) {
        if let Some(f) = self.store.io_ref() {
            f.end_sleep();
        }
    }

    fn in_flight(&self) -> usize {
        self.reads.in_use() + self.store.io_in_flight() + self.acks.len()
    }

    fn shutdown(&mut self) {
        if self.store.durability() != Durability::None {
            if let Err(e) = self.store.commit() {
                tracing::error!(error = %e, "final commit failed");
            }
        }
    }
}

/// The `dds kv` server: the service on an event loop.
pub struct Server {
    inner: dds_server::Server<KvService>,
}

impl Server {
    /// Binds the listening socket. Reads of records on storage are issued ahead of their
    /// commands through the engine's asynchronous I/O instead of blocking the loop.
    pub fn bind(cfg: ServerConfig, store: Box<dyn Engine>, storage: String) -> Result<Server> {
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
        // The parameters the start options fix (CONFIG SET takes only their values).
        let mut fixed = store.config_params();
        fixed.extend([
            (
                "appendonly",
                if durability == "none" { "no" } else { "yes" }.to_string(),
            ),
            (
                "appendfsync",
                if durability == "fsync" {
                    "always"
                } else {
                    "everysec"
                }
                .to_string(),
            ),
            ("databases", "1".to_string()),
            ("maxclients", cfg.max_clients.to_string()),
            (
                "client-query-buffer-limit",
                cfg.query_buffer_limit.to_string(),
            ),
        ]);
        let reads_ahead = store.io_ref().is_some();
        let fsync = store.durability() == Durability::Fsync;
        let service = KvService {
            info: ServerInfo {
                clients: 0,
                blocked_clients: 0,
                commands: 0,
                connections: 0,
                rejected: 0,
                started: Instant::now(),
                port: cfg.listen.port(),
                durability,
                storage,
                max_clients: cfg.max_clients,
                config: crate::config::Config::new(fixed),
                run_id: run_id(),
                active_expire: true,
                list_buf: Vec::new(),
                keys_walked: None,
                stats: crate::cmdstats::CommandStats::new(crate::commands::command_count()),
                block: Default::default(),
            },
            store,
            limits,
            password: cfg.password.clone(),
            argv: Argv::new(),
            spare: Vec::new(),
            reads_ahead,
            acks: VecDeque::with_capacity(1024),
            fsync,
            reads: InFlightReads::new(),
            bufs: Vec::new(),
            completions: Vec::new(),
            sync_interval: cfg.sync_interval,
            next_sync: Instant::now() + cfg.sync_interval,
            expire_budget: cfg.sync_interval.min(Duration::from_millis(100)) / 4,
            multi_limit: cfg.query_buffer_limit,
            watchers: HashMap::new(),
            watch_dirty: HashSet::new(),
            unblocks: Vec::new(),
            unblocked: HashMap::new(),
            yielded: Vec::new(),
            parked: Vec::new(),
            park_seq: 0,
            parked_keys: HashMap::new(),
            ready_keys: Vec::new(),
            next_parked_sweep: Instant::now(),
            stopping: false,
            pops_ahead: HashMap::new(),
        };
        let tick = cfg.sync_interval.min(Duration::from_millis(100));
        let rt = Config {
            max_connections: cfg.max_clients,
            input_limit: cfg.query_buffer_limit,
            output_pause: cfg.output_pause,
            tick,
            ..Config::default()
        };
        let mut inner =
            dds_server::Server::bind(cfg.listen, rt, Budget::new(cfg.memory_budget), service)
                .with_context(|| format!("listen on {}", cfg.listen))?;
        let port = inner.local_addr().port();
        let info = &mut inner.service_mut().info;
        info.port = port;
        info.config.fix("port", port.to_string());
        Ok(Server { inner })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.inner.local_addr())
    }

    /// Serves until `stop` is set; then drains, commits and closes the store.
    pub fn run(self, stop: &AtomicBool) -> Result<()> {
        let service = self.inner.run(stop);
        service.store.close()
    }
}

/// Whether the list or sorted set at `key` has elements (no record read).
fn has_elements(store: &mut dyn Engine, key: &[u8]) -> bool {
    use crate::collection::CollType;
    [CollType::List, CollType::ZSet]
        .into_iter()
        .any(|ty| matches!(store.coll_len(ty, key), Ok(n) if n > 0))
}

/// A parked connection's keys no longer wait.
fn unpark_keys(parked_keys: &mut HashMap<(u64, u64), u32>, wait: &crate::lists::Wait) {
    for k in &wait.keys {
        let h = record::key_hash(k);
        if let Some(n) = parked_keys.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                parked_keys.remove(&h);
            }
        }
    }
}

/// 40 hex digits that differ from run to run (INFO's `run_id`): the start time and process id
/// through XXH3.
fn run_id() -> String {
    let seed = format!("{:?} {}", std::time::SystemTime::now(), std::process::id());
    let h = xxhash_rust::xxh3::xxh3_128(seed.as_bytes());
    let h2 = xxhash_rust::xxh3::xxh3_64(&h.to_le_bytes());
    format!("{h:032x}{:08x}", h2 as u32)
}
