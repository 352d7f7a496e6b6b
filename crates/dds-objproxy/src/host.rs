//! The host half (CODA's Proxy Interface): owns the shared region of each DPU session, polls
//! its channels with atomics while transfers arrive and parks on each channel's doorbell when
//! they stop, applies transactions through the store with asynchronous commit callbacks,
//! writes ACKs and read data into its own memory, and serves the control RPCs.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dds_objstore::{ObjStore, ObjectId, ObjectStore, StoreError};
use dds_shm::SharedRegion;

use crate::wire::*;

/// Settings of the host side.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Most DPU sessions served at once (more are refused).
    pub max_sessions: usize,
    /// How long a channel worker polls without finding a transfer before it parks on its
    /// doorbell (zero: park at once).
    pub spin: Duration,
    /// Longest park: a worker also wakes this often without a doorbell.
    pub park_timeout: Duration,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            max_sessions: 16,
            spin: Duration::from_micros(10),
            park_timeout: Duration::from_millis(100),
        }
    }
}

/// Counters of the host side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    pub sessions: u64,
    /// Write-lane transfers taken (batches and chunks).
    pub transfers: u64,
    pub batches: u64,
    pub chunks: u64,
    /// Transactions handed to the store.
    pub txs_applied: u64,
    /// Transactions received again and not applied again.
    pub txs_duplicate: u64,
    pub reads: u64,
    pub rpcs: u64,
    /// Channels closed for bad input.
    pub channel_errors: u64,
    /// Chunked transactions dropped incomplete (their DPU went away).
    pub partial_dropped: u64,
    /// Times a channel worker parked on its doorbell.
    pub parks: u64,
    /// Parks ended by the doorbell (the others by the timeout or by work found on the last
    /// look before blocking).
    pub rung: u64,
}

#[derive(Default)]
struct Counters {
    sessions: AtomicU64,
    transfers: AtomicU64,
    batches: AtomicU64,
    chunks: AtomicU64,
    txs_applied: AtomicU64,
    txs_duplicate: AtomicU64,
    reads: AtomicU64,
    rpcs: AtomicU64,
    channel_errors: AtomicU64,
    partial_dropped: AtomicU64,
    parks: AtomicU64,
    rung: AtomicU64,
    live_sessions: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The host side's entry point.
pub struct HostProxy;

/// A running host proxy; [`stop`](Self::stop) (or drop) ends it.
pub struct HostProxyHandle {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    accept: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl HostProxy {
    /// Listens on `socket` (replacing a stale socket file, mode 0600) and serves DPU sessions
    /// on `store` until stopped.
    pub fn serve(
        store: Arc<ObjStore>,
        socket: &Path,
        opts: HostOptions,
    ) -> io::Result<HostProxyHandle> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (s2, c2) = (stop.clone(), counters.clone());
        let accept = std::thread::Builder::new()
            .name("objproxy-accept".into())
            .spawn(move || accept_loop(listener, store, opts, s2, c2))?;
        Ok(HostProxyHandle {
            stop,
            counters,
            accept: Some(accept),
            path: socket.to_path_buf(),
        })
    }
}

impl HostProxyHandle {
    /// Counters so far.
    pub fn stats(&self) -> HostStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HostStats {
            sessions: g(&c.sessions),
            transfers: g(&c.transfers),
            batches: g(&c.batches),
            chunks: g(&c.chunks),
            txs_applied: g(&c.txs_applied),
            txs_duplicate: g(&c.txs_duplicate),
            reads: g(&c.reads),
            rpcs: g(&c.rpcs),
            channel_errors: g(&c.channel_errors),
            partial_dropped: g(&c.partial_dropped),
            parks: g(&c.parks),
            rung: g(&c.rung),
        }
    }

    /// Sessions currently attached.
    pub fn live_sessions(&self) -> u64 {
        self.counters.live_sessions.load(Ordering::Relaxed)
    }

    /// Stops accepting, ends every session (their workers drop partial chunked transactions)
    /// and returns once all threads are gone.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for HostProxyHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(
    listener: UnixListener,
    store: Arc<ObjStore>,
    opts: HostOptions,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
) {
    let mut sessions: Vec<(UnixStream, JoinHandle<()>)> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        sessions.retain(|(_, h)| !h.is_finished());
        match listener.accept() {
            Ok((s, _)) => {
                if sessions.len() >= opts.max_sessions {
                    tracing::warn!("object proxy: session refused (limit reached)");
                    continue;
                }
                let Ok(s2) = s.try_clone() else { continue };
                let (st, c, o) = (store.clone(), counters.clone(), opts.clone());
                match std::thread::Builder::new()
                    .name("objproxy-session".into())
                    .spawn(move || session(s, st, c, o))
                {
                    Ok(h) => sessions.push((s2, h)),
                    Err(e) => tracing::warn!(error = %e, "object proxy: no session thread"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Blocks until a DPU connects; wakes every 100 ms to look at `stop`.
                wait(listener.as_fd(), Duration::from_millis(100));
            }
            Err(e) => {
                tracing::warn!(error = %e, "object proxy: accept");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    for (s, h) in sessions {
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = h.join();
    }
}

fn session(mut s: UnixStream, store: Arc<ObjStore>, counters: Arc<Counters>, opts: HostOptions) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let attach = match recv_frame(&mut s, MAX_REQUEST) {
        Ok(Some(f)) => f,
        _ => return,
    };
    let (func, id, body, _) = attach;
    let layout = match parse_attach(func, &body) {
        Ok(l) => l,
        Err(msg) => {
            let mut b = Vec::new();
            put_error(&mut b, &StoreError::InvalidArgument(msg));
            let _ = send_frame(&s, 1, id, &b, &[]);
            return;
        }
    };
    let region = match SharedRegion::create("dds-objproxy", layout.region_len() as usize) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            let mut b = Vec::new();
            put_error(&mut b, &proxy_error(format!("shared region: {e}")));
            let _ = send_frame(&s, 1, id, &b, &[]);
            return;
        }
    };
    let mut bells = Vec::new();
    for _ in 0..layout.channels {
        match rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        ) {
            Ok(fd) => bells.push(Arc::new(fd)),
            Err(e) => {
                let mut b = Vec::new();
                put_error(&mut b, &proxy_error(format!("doorbell: {e}")));
                let _ = send_frame(&s, 1, id, &b, &[]);
                return;
            }
        }
    }
    inc(&counters.sessions);
    counters.live_sessions.fetch_add(1, Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for c in 0..layout.channels {
        let mut w = Worker::new(
            region.clone(),
            layout,
            c,
            store.clone(),
            counters.clone(),
            bells[c as usize].clone(),
        );
        let (st, o) = (stop.clone(), opts.clone());
        match std::thread::Builder::new()
            .name(format!("objproxy-ch{c}"))
            .spawn(move || w.run(&st, &o))
        {
            Ok(h) => workers.push(h),
            Err(e) => tracing::warn!(error = %e, "object proxy: no channel thread"),
        }
    }
    let mut reply = Vec::new();
    put_u32(&mut reply, VERSION);
    put_u32(&mut reply, layout.channels);
    put_u32(&mut reply, layout.max_dma);
    put_u32(&mut reply, SLOTS as u32);
    put_u64(&mut reply, layout.channel_bytes());
    put_u64(&mut reply, layout.region_len());
    let region_fd = region.fd();
    let mut fds = vec![region_fd.as_fd()];
    fds.extend(bells.iter().map(|b| b.as_fd()));
    if send_frame(&s, 0, id, &reply, &fds).is_ok() {
        let _ = s.set_read_timeout(None);
        while let Ok(Some((func, id, body, _))) = recv_frame(&mut s, MAX_REQUEST) {
            inc(&counters.rpcs);
            let (status, out) = match rpc(&*store, func, &body) {
                Ok(out) => (0, out),
                Err(e) => {
                    let mut b = Vec::new();
                    put_error(&mut b, &e);
                    (1, b)
                }
            };
            if send_frame(&s, status, id, &out, &[]).is_err() {
                break;
            }
        }
    }
    stop.store(true, Ordering::Release);
    for b in &bells {
        ring(b.as_fd());
    }
    for h in workers {
        if let Ok(dropped) = h.join() {
            counters
                .partial_dropped
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }
    counters.live_sessions.fetch_sub(1, Ordering::Relaxed);
}

/// Rings a doorbell (an eventfd; a full counter means it is rung already).
fn ring(fd: BorrowedFd<'_>) {
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// Blocks until `fd` is readable or `timeout` passes; says whether it is readable.
fn wait(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut p = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: timeout.subsec_nanos() as i64,
    };
    matches!(rustix::event::poll(&mut p, Some(&ts)), Ok(1))
}

/// Blocks until a doorbell (a non-blocking eventfd) is rung or `timeout` passes, and resets
/// it; says whether it was rung.
fn wait_bell(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    wait(fd, timeout);
    let mut v = [0u8; 8];
    rustix::io::read(fd, &mut v).is_ok()
}

fn parse_attach(func: u8, body: &[u8]) -> Result<Layout, String> {
    if func != F_ATTACH {
        return Err("the first request of a session must be ATTACH".into());
    }
    let mut c = Cursor::new(body);
    let (Some(v), Some(channels), Some(max_dma)) = (c.u32(), c.u32(), c.u32()) else {
        return Err("short ATTACH".into());
    };
    if v != VERSION {
        return Err(format!("protocol version {v} (this host speaks {VERSION})"));
    }
    let l = Layout { channels, max_dma };
    l.validate()?;
    Ok(l)
}

fn oid(c: &mut Cursor<'_>) -> Option<ObjectId> {
    let pool = c.u64()?;
    let name = c.bytes()?;
    Some(ObjectId::new(pool, name))
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(Vec<u8>, Vec<u8>)]) {
    put_u32(out, pairs.len() as u32);
    for (k, v) in pairs {
        put_bytes(out, k);
        put_bytes(out, v);
    }
}

/// Serves one control RPC.
fn rpc(store: &dyn ObjectStore, func: u8, body: &[u8]) -> Result<Vec<u8>, StoreError> {
    let bad = || StoreError::InvalidArgument("malformed control request".into());
    let mut c = Cursor::new(body);
    let mut out = Vec::new();
    match func {
        F_STAT => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let st = store.stat(&o)?;
            put_u64(&mut out, st.size);
            put_u64(&mut out, st.mtime_ns);
        }
        F_GETXATTR => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let name = c.bytes().ok_or_else(bad)?;
            put_bytes(&mut out, &store.getxattr(&o, name)?);
        }
        F_GETXATTRS => {
            let o = oid(&mut c).ok_or_else(bad)?;
            put_pairs(&mut out, &store.getxattrs(&o)?);
        }
        F_OMAP_GET => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let n = c.u32().ok_or_else(bad)? as usize;
            let mut keys = Vec::with_capacity(n.min(body.len() / 4));
            for _ in 0..n {
                keys.push(c.bytes().ok_or_else(bad)?.to_vec());
            }
            let vals = store.omap_get(&o, &keys)?;
            put_u32(&mut out, vals.len() as u32);
            for v in vals {
                match v {
                    Some(v) => {
                        out.push(1);
                        put_bytes(&mut out, &v);
                    }
                    None => out.push(0),
                }
            }
        }
        F_OMAP_LIST => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let start = c.opt_bytes().ok_or_else(bad)?;
            let max = c.u64().ok_or_else(bad)?;
            put_pairs(
                &mut out,
                &store.omap_list(&o, start, max.min(1 << 20) as usize)?,
            );
        }
        F_LIST => {
            let pool = c.u64().ok_or_else(bad)?;
            let start = c.opt_bytes().ok_or_else(bad)?;
            let max = c.u64().ok_or_else(bad)?;
            let names = store.list(pool, start, max.min(1 << 20) as usize)?;
            put_u32(&mut out, names.len() as u32);
            for n in names {
                put_bytes(&mut out, &n);
            }
        }
        F_STATFS => {
            let s = store.statfs()?;
            for v in [
                s.device_bytes,
                s.block_size,
                s.data_bytes,
                s.allocated_bytes,
                s.objects,
            ] {
                put_u64(&mut out, v);
            }
        }
        _ => {
            return Err(StoreError::InvalidArgument(format!(
                "unknown function {func}"
            )))
        }
    }
    if !c.done() {
        return Err(bad());
    }
    if out.len() + 64 > MAX_RESPONSE {
        return Err(StoreError::InvalidArgument("response too large".into()));
    }
    Ok(out)
}

/// Host access to one channel of the shared region: atomics only.
#[derive(Clone)]
struct Shm {
    region: Arc<SharedRegion>,
    base: u64,
}

impl Shm {
    fn word(&self, off: u64) -> &AtomicU64 {
        &self.words(off, 1)[0]
    }

    fn load(&self, off: u64) -> u64 {
        self.word(off).load(Ordering::Acquire)
    }

    fn store(&self, off: u64, v: u64) {
        self.word(off).store(v, Ordering::Release)
    }

    /// Copies `len` bytes at `off` out (`Acquire` loads, ascending), replacing `into`'s.
    fn copy_out(&self, off: u64, len: usize, into: &mut Vec<u8>) {
        into.clear();
        self.append_out(off, len, into);
    }

    /// Appends `len` bytes at `off` to `into` (`Acquire` loads, ascending), written straight
    /// into its spare capacity.
    fn append_out(&self, off: u64, len: usize, into: &mut Vec<u8>) {
        let words = self.words(off, len.div_ceil(8));
        let start = into.len();
        into.reserve(len);
        let spare = &mut into.spare_capacity_mut()[..len];
        let mut dst = spare.chunks_exact_mut(8);
        for (w, d) in words.iter().zip(&mut dst) {
            for (d, b) in d.iter_mut().zip(w.load(Ordering::Acquire).to_le_bytes()) {
                d.write(b);
            }
        }
        let rest = dst.into_remainder();
        if !rest.is_empty() {
            let last = words[words.len() - 1].load(Ordering::Acquire).to_le_bytes();
            for (d, b) in rest.iter_mut().zip(last) {
                d.write(b);
            }
        }
        // SAFETY: the loops above initialised all `len` bytes after `start`.
        unsafe { into.set_len(start + len) };
    }

    /// `n` words at `off`, as atomics.
    fn words(&self, off: u64, n: usize) -> &[AtomicU64] {
        debug_assert!(off.is_multiple_of(8));
        assert!(self.base + off + 8 * n as u64 <= self.region.len() as u64);
        // SAFETY: 8-aligned (page-aligned base, 8-aligned offsets), inside the mapping, which
        // `self.region` keeps alive; shared memory is only accessed with atomics.
        unsafe {
            std::slice::from_raw_parts(
                self.region
                    .as_ptr()
                    .add((self.base + off) as usize)
                    .cast::<AtomicU64>(),
                n,
            )
        }
    }

    /// Copies `bytes` in at `off` (padded with zeros to a multiple of 8; `Relaxed`: a later
    /// `Release` store publishes them).
    fn copy_in(&self, off: u64, bytes: &[u8]) {
        let words = self.words(off, bytes.len().div_ceil(8));
        let mut chunks = bytes.chunks_exact(8);
        for (w, ch) in words.iter().zip(&mut chunks) {
            w.store(
                u64::from_le_bytes(ch.try_into().expect("8 bytes")),
                Ordering::Relaxed,
            );
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            words[words.len() - 1].store(u64::from_le_bytes(last), Ordering::Relaxed);
        }
    }
}

/// Results of a channel's recent transactions, for duplicates.
#[derive(Default)]
struct Window {
    results: VecDeque<(u64, u32, Vec<u8>)>,
}

impl Window {
    fn record(&mut self, rid: u64, r: &Result<(), StoreError>) {
        let (code, rec) = status_of(r);
        if self.results.len() as u64 >= RESULT_WINDOW {
            self.results.pop_front();
        }
        self.results.push_back((rid, code, rec));
    }

    fn lookup(&self, rid: u64) -> (u32, Vec<u8>) {
        self.results
            .iter()
            .find(|(r, _, _)| *r == rid)
            .map(|(_, c, rec)| (*c, rec.clone()))
            .unwrap_or((CODE_DUP_UNKNOWN, Vec::new()))
    }
}

/// Status code and error record (without the index) of a result.
fn status_of(r: &Result<(), StoreError>) -> (u32, Vec<u8>) {
    match r {
        Ok(()) => (0, Vec::new()),
        Err(e) => {
            let (code, a, b, mut msg) = error_parts(e);
            msg.truncate(MAX_ERR_MSG);
            let mut rec = Vec::new();
            put_u32(&mut rec, code);
            put_u64(&mut rec, a);
            put_u64(&mut rec, b);
            put_bytes(&mut rec, &msg);
            (code, rec)
        }
    }
}

/// The ACK of one transfer, written by whoever completes its last transaction.
struct AckJob {
    shm: Shm,
    off: u64,
    seq: u64,
    first: u64,
    remaining: AtomicU32,
    results: Mutex<Vec<(u32, Vec<u8>)>>,
    window: Arc<Mutex<Window>>,
}

impl AckJob {
    fn complete(
        &self,
        index: usize,
        rid: u64,
        r: (u32, Vec<u8>),
        own: Option<&Result<(), StoreError>>,
    ) {
        if let Some(res) = own {
            self.window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(rid, res);
        }
        let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        results[index] = r;
        drop(results);
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.write();
        }
    }

    fn write(&self) {
        let results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        let mut statuses = Vec::with_capacity(results.len() * 4);
        let mut errs = Vec::new();
        for (i, (code, rec)) in results.iter().enumerate() {
            statuses.extend_from_slice(&code.to_le_bytes());
            if *code != 0
                && !rec.is_empty()
                && errs.len() + 4 + rec.len() <= (ACK_SLOT - ACK_ERR_AREA) as usize
            {
                put_u32(&mut errs, i as u32);
                errs.extend_from_slice(rec);
            }
        }
        self.shm.copy_in(self.off + 64, &statuses);
        self.shm.copy_in(self.off + ACK_ERR_AREA, &errs);
        let mut head = [0u8; 56];
        head[0..8].copy_from_slice(&self.first.to_le_bytes());
        head[8..12].copy_from_slice(&(results.len() as u32).to_le_bytes());
        head[12..16].copy_from_slice(&(errs.len() as u32).to_le_bytes());
        self.shm.copy_in(self.off + 8, &head);
        self.shm.store(self.off, self.seq);
    }
}

struct Assembly {
    req_id: u64,
    total: u32,
    next: u32,
    tx_len: u64,
    buf: Vec<u8>,
}

struct ReadJob {
    req_id: u64,
    window: u64,
    /// Data, or the encoded wire error.
    body: Vec<u8>,
    status: u32,
    total: u32,
    next: u32,
}

/// One channel's host worker.
struct Worker {
    shm: Shm,
    layout: Layout,
    chan: u32,
    store: Arc<ObjStore>,
    counters: Arc<Counters>,
    expect: u64,
    applied_hi: u64,
    window: Arc<Mutex<Window>>,
    assembly: Option<Assembly>,
    r_expect: u64,
    cseq: u64,
    reading: Option<ReadJob>,
    scratch: Vec<u8>,
    /// A chunked transaction's buffer, kept for the next one (at most `SPARE_MAX` bytes).
    spare: Vec<u8>,
    /// The channel's doorbell (an eventfd the DPU rings while `CTL_SLEEP` is set).
    bell: Arc<OwnedFd>,
    /// Epoch of the last park.
    epoch: u64,
}

/// Largest assembly buffer a channel keeps between chunked transactions.
const SPARE_MAX: usize = 16 << 20;

/// Bad input: the reason code and a message.
type Bad = (u64, String);

impl Worker {
    fn new(
        region: Arc<SharedRegion>,
        layout: Layout,
        chan: u32,
        store: Arc<ObjStore>,
        counters: Arc<Counters>,
        bell: Arc<OwnedFd>,
    ) -> Worker {
        Worker {
            shm: Shm {
                region,
                base: layout.channel(chan),
            },
            layout,
            chan,
            store,
            counters,
            expect: 1,
            applied_hi: 0,
            window: Arc::default(),
            assembly: None,
            r_expect: 1,
            cseq: 1,
            reading: None,
            scratch: Vec::new(),
            spare: Vec::new(),
            bell,
            epoch: 0,
        }
    }

    /// Serves until `stop`; returns the partial chunked transactions it dropped.
    ///
    /// Polls while transfers arrive; after `opts.spin` without one it parks (`docs/objproxy.md`,
    /// "Doorbells"): publishes a new epoch in the control line's sleep word, looks once more,
    /// and blocks on the channel's doorbell, which the DPU rings when it finds the word set.
    fn run(&mut self, stop: &AtomicBool, opts: &HostOptions) -> u64 {
        let mut idle_since: Option<Instant> = None;
        let mut looks = 0u32;
        while !stop.load(Ordering::Acquire) {
            match self.step() {
                Ok(true) => idle_since = None,
                Ok(false) => {
                    // The clock is read every 32 empty looks.
                    looks = looks.wrapping_add(1);
                    if looks % 32 != 1 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < opts.spin {
                        continue;
                    }
                    idle_since = None;
                    if let Err(bad) = self.park(opts.park_timeout) {
                        self.close(bad);
                        break;
                    }
                }
                Err(bad) => {
                    self.close(bad);
                    break;
                }
            }
        }
        u64::from(self.assembly.take().is_some())
    }

    /// One look at both lanes.
    fn step(&mut self) -> Result<bool, Bad> {
        let w = self.step_write()?;
        Ok(self.step_read()? || w)
    }

    /// Parks until the doorbell rings or `timeout` passes, unless the last look before
    /// blocking finds work (which it then has done).
    fn park(&mut self, timeout: Duration) -> Result<(), Bad> {
        inc(&self.counters.parks);
        self.epoch += 1;
        self.shm.word(CTL_SLEEP).store(self.epoch, Ordering::SeqCst);
        // Pairs with the DPU's write-then-read (its DMA operations are SeqCst-fenced): either
        // the look below sees the DPU's transfer, or the DPU's read sees the sleep word.
        fence(Ordering::SeqCst);
        let found = self.step();
        if !matches!(found, Ok(false)) {
            self.shm.store(CTL_SLEEP, 0);
            return found.map(|_| ());
        }
        if wait_bell(self.bell.as_fd(), timeout) {
            inc(&self.counters.rung);
        }
        self.shm.store(CTL_SLEEP, 0);
        Ok(())
    }

    /// Closes the channel for bad input.
    fn close(&mut self, (reason, msg): Bad) {
        tracing::warn!(channel = self.chan, %msg, "object proxy: channel closed");
        self.shm.store(CTL_REASON, reason);
        self.shm.store(CTL_STATE, 1);
        inc(&self.counters.channel_errors);
    }

    /// Takes the next write-lane transfer if it has landed.
    fn step_write(&mut self) -> Result<bool, Bad> {
        let slot = self.layout.req_slot(self.expect);
        if self.shm.load(slot) != self.expect {
            return Ok(false);
        }
        let mut hb = Vec::new();
        self.shm.copy_out(slot, 64, &mut hb);
        let h = TransferHeader::decode(&hb);
        if h.seq != self.expect {
            return Ok(false);
        }
        let cap = self.layout.payload_cap();
        if h.payload_len as u64 > cap || !matches!(h.kind, KIND_BATCH | KIND_CHUNK) {
            return Err((REASON_HEADER, format!("transfer header {h:?}")));
        }
        let trailer = slot + 64 + align8(h.payload_len as u64);
        if self.shm.load(trailer) != self.expect {
            return Ok(false);
        }
        let landed = |shm: &Shm, e: u64| shm.load(slot) == e && shm.load(trailer) == e;
        let len = h.payload_len as usize;
        let r = if h.kind == KIND_BATCH {
            let mut payload = std::mem::take(&mut self.scratch);
            self.shm.copy_out(slot + 64, len, &mut payload);
            if !landed(&self.shm, self.expect) {
                self.scratch = payload;
                return Ok(false);
            }
            self.take_slot(slot, trailer);
            let r = self.batch(&h, &payload);
            self.scratch = payload;
            r
        } else {
            // Chunks go straight from the slot into the transaction being assembled.
            self.chunk_begin(&h)?;
            let a = self
                .assembly
                .as_mut()
                .expect("chunk_begin keeps an assembly");
            let before = a.buf.len();
            self.shm.append_out(slot + 64, len, &mut a.buf);
            if !landed(&self.shm, self.expect) {
                a.buf.truncate(before);
                if h.a == 0 {
                    self.assembly = None;
                }
                return Ok(false);
            }
            self.take_slot(slot, trailer);
            self.chunk_end(&h)
        };
        self.shm.store(CTL_CONSUMED, self.expect);
        self.expect += 1;
        r.map(|()| true)
    }

    /// Frees a transfer's slot after its payload was copied out.
    fn take_slot(&mut self, slot: u64, trailer: u64) {
        self.shm.store(slot, 0);
        self.shm.store(trailer, 0);
        inc(&self.counters.transfers);
    }

    fn batch(&mut self, h: &TransferHeader, payload: &[u8]) -> Result<(), Bad> {
        inc(&self.counters.batches);
        let bad = |m: &str| (REASON_BATCH, format!("{m} (batch {h:?})"));
        let count = h.a as usize;
        if count == 0
            || count > MAX_BATCH
            || h.req_id == 0
            || h.b != 0
            || h.offset != 0
            || h.tx_len != 0
        {
            return Err(bad("header fields"));
        }
        let mut c = Cursor::new(payload);
        if c.u32() != Some(h.a) {
            return Err(bad("count differs from the header's"));
        }
        let mut txs = Vec::with_capacity(count);
        for _ in 0..count {
            txs.push(
                c.bytes()
                    .ok_or_else(|| bad("transaction lengths overrun the payload"))?,
            );
        }
        if !c.done() {
            return Err(bad("bytes after the last transaction"));
        }
        self.apply(h.seq, h.req_id, &txs);
        Ok(())
    }

    /// Checks a chunk's header against the transaction being assembled (starting one for a
    /// first chunk).
    fn chunk_begin(&mut self, h: &TransferHeader) -> Result<(), Bad> {
        inc(&self.counters.chunks);
        let bad = |m: &str| (REASON_CHUNK, format!("{m} (chunk {h:?})"));
        let max_tx = self.store.options().max_tx_bytes as u64;
        let len = h.payload_len as u64;
        if h.req_id == 0
            || h.b == 0
            || h.a >= h.b
            || len == 0
            || h.tx_len > max_tx
            || h.offset.checked_add(len).is_none_or(|e| e > h.tx_len)
        {
            return Err(bad("header fields"));
        }
        if h.a == 0 {
            if self.assembly.is_some() || h.offset != 0 {
                return Err(bad("a first chunk inside another transaction"));
            }
            // The last transaction's buffer, if kept, saves the allocation (and its page
            // faults); the store copied its bytes out when it was submitted.
            let mut buf = std::mem::take(&mut self.spare);
            buf.clear();
            buf.reserve_exact(h.tx_len as usize);
            self.assembly = Some(Assembly {
                req_id: h.req_id,
                total: h.b,
                next: 0,
                tx_len: h.tx_len,
                buf,
            });
        }
        let Some(a) = self.assembly.as_ref() else {
            return Err(bad("a chunk without its first chunk"));
        };
        if a.req_id != h.req_id
            || a.total != h.b
            || a.next != h.a
            || a.tx_len != h.tx_len
            || a.buf.len() as u64 != h.offset
        {
            return Err(bad("chunk out of order"));
        }
        Ok(())
    }

    /// Counts a chunk whose payload was appended; applies the transaction after its last.
    fn chunk_end(&mut self, h: &TransferHeader) -> Result<(), Bad> {
        let a = self
            .assembly
            .as_mut()
            .expect("chunk_begin keeps an assembly");
        a.next += 1;
        if a.next == a.total {
            if a.buf.len() as u64 != a.tx_len {
                return Err((
                    REASON_CHUNK,
                    format!("chunks do not add up to the transaction (chunk {h:?})"),
                ));
            }
            let a = self.assembly.take().expect("checked above");
            self.apply(h.seq, a.req_id, &[&a.buf]);
            if a.buf.capacity() <= SPARE_MAX {
                self.spare = a.buf;
            }
        }
        Ok(())
    }

    /// Submits transactions `first, first+1, …` (those not applied before) and arranges
    /// their ACK in the ACK slot of transfer `seq`.
    fn apply(&mut self, seq: u64, first: u64, txs: &[&[u8]]) {
        let job = Arc::new(AckJob {
            shm: self.shm.clone(),
            off: self.layout.ack_slot(seq),
            seq,
            first,
            remaining: AtomicU32::new(txs.len() as u32),
            results: Mutex::new(vec![(0, Vec::new()); txs.len()]),
            window: self.window.clone(),
        });
        for (i, tx) in txs.iter().enumerate() {
            let rid = first + i as u64;
            if rid <= self.applied_hi {
                inc(&self.counters.txs_duplicate);
                let r = self
                    .window
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .lookup(rid);
                job.complete(i, rid, r, None);
                continue;
            }
            self.applied_hi = rid;
            inc(&self.counters.txs_applied);
            let j = job.clone();
            let submitted = self.store.submit_encoded_with(tx, move |r| {
                j.complete(i, rid, status_of(&r), Some(&r));
            });
            if let Err(e) = submitted {
                let r = Err(e);
                job.complete(i, rid, status_of(&r), Some(&r));
            }
        }
    }

    /// Takes a read request and writes response chunks as the window allows.
    fn step_read(&mut self) -> Result<bool, Bad> {
        let mut progress = false;
        let slot = self.layout.read_req_slot(self.r_expect);
        if self.reading.is_none() && self.shm.load(slot) == self.r_expect {
            let mut hb = Vec::new();
            self.shm.copy_out(slot, 64, &mut hb);
            let h = ReadHeader::decode(&hb);
            if h.rseq == self.r_expect {
                if h.name_len == 0
                    || h.name_len as usize > dds_objstore::MAX_NAME_LEN
                    || h.req_id == 0
                    || !(1..=SLOTS as u32).contains(&h.window)
                {
                    return Err((REASON_READ, format!("read request {h:?}")));
                }
                let trailer = slot + 64 + align8(h.name_len as u64);
                if self.shm.load(trailer) == self.r_expect {
                    let mut name = Vec::new();
                    self.shm.copy_out(slot + 64, h.name_len as usize, &mut name);
                    if self.shm.load(slot) == self.r_expect {
                        self.shm.store(slot, 0);
                        self.shm.store(trailer, 0);
                        self.shm.store(CTL_R_TAKEN, self.r_expect);
                        self.r_expect += 1;
                        inc(&self.counters.reads);
                        let oid = ObjectId::new(h.pool, name);
                        let (status, body) = match self.store.read(&oid, h.offset, h.len) {
                            Ok(d) => (0, d),
                            Err(e) => {
                                let mut b = Vec::new();
                                put_error(&mut b, &e);
                                (error_parts(&e).0, b)
                            }
                        };
                        let cap = self.layout.payload_cap();
                        let total = if status != 0 {
                            1
                        } else {
                            (body.len() as u64).div_ceil(cap).max(1) as u32
                        };
                        self.reading = Some(ReadJob {
                            req_id: h.req_id,
                            window: h.window as u64,
                            body,
                            status,
                            total,
                            next: 0,
                        });
                        progress = true;
                    }
                }
            }
        }
        let Some(job) = self.reading.as_mut() else {
            return Ok(progress);
        };
        let cap = self.layout.payload_cap() as usize;
        while job.next < job.total {
            let freed = self.shm.load(DPU_LINE);
            if freed + job.window < self.cseq {
                break;
            }
            let off = job.next as usize * cap;
            let part = if job.status != 0 {
                &job.body[..]
            } else {
                &job.body[off..(off + cap).min(job.body.len())]
            };
            let slot = self.layout.resp_slot(self.cseq);
            self.shm.copy_in(slot + 64, part);
            let mut hb = [0u8; 64];
            RespHeader {
                cseq: self.cseq,
                req_id: job.req_id,
                status: job.status,
                payload_len: part.len() as u32,
                index: job.next,
                total: job.total,
                offset: off as u64,
                data_len: job.body.len() as u64,
            }
            .encode(&mut hb);
            self.shm.copy_in(slot + 8, &hb[8..]);
            self.shm.store(slot, self.cseq);
            self.cseq += 1;
            job.next += 1;
            progress = true;
        }
        if job.next == job.total {
            self.reading = None;
        }
        Ok(progress)
    }
}
