//! The DPU half (CODA's ProxyObjectStore): an [`ObjectStore`] whose transactions and reads
//! travel through DMA channels into host memory (named only by region id and offset) and
//! whose metadata calls are RPCs on the control socket. This module does not use `dds-shm`.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dds_dma::{
    CostModel, DmaCompletion, DmaEngine, DmaOp, EmulatedDma, LocalBuf, RegionExport, RegionId,
};
use dds_objstore::{KvPairs, ObjStat, ObjectId, ObjectStore, StoreError, StoreStats, Transaction};

use crate::wire::*;

/// Makes the DMA engine of one lane (two per channel).
pub type DmaFactory = Arc<dyn Fn() -> Box<dyn DmaEngine> + Send + Sync>;

/// Settings of the DPU side.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Largest DMA transfer (a multiple of 4096, 64 KiB ..= 16 MiB).
    pub max_dma: usize,
    /// Flow-Adapt batching of small transactions.
    pub batching: bool,
    /// Flow-Adapt pipelining of the chunks of large transactions and reads.
    pub chunking: bool,
    /// Channels (submitting threads are spread over them round robin).
    pub channels: usize,
    /// PCIe cost model of the default (emulated) DMA engines.
    pub cost_model: Option<CostModel>,
    /// DMA engine factory (default: [`EmulatedDma`] with `cost_model`).
    pub dma: Option<DmaFactory>,
    /// A transfer not consumed this long after it was sent is sent again.
    pub retransmit_after: Duration,
    /// Transactions waiting per channel (submitters block beyond it).
    pub max_pending: usize,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions {
            max_dma: 2 << 20,
            batching: true,
            chunking: true,
            channels: 4,
            cost_model: Some(CostModel::bluefield2()),
            dma: None,
            retransmit_after: Duration::from_millis(5),
            max_pending: 256,
        }
    }
}

impl std::fmt::Debug for ProxyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyOptions")
            .field("max_dma", &self.max_dma)
            .field("batching", &self.batching)
            .field("chunking", &self.chunking)
            .field("channels", &self.channels)
            .field("cost_model", &self.cost_model)
            .field("dma", &self.dma.is_some())
            .finish()
    }
}

/// Counters of the DPU side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub dma_writes: u64,
    pub dma_reads: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    pub batches: u64,
    pub chunks: u64,
    pub txs: u64,
    pub reads: u64,
    pub retransmits: u64,
    pub rpcs: u64,
    /// Doorbells rung for a parked host worker.
    pub doorbells: u64,
    /// Read requests posted while another read of their channel was outstanding.
    pub reads_overlapped: u64,
}

#[derive(Default)]
struct Counters {
    dma_writes: AtomicU64,
    dma_reads: AtomicU64,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    batches: AtomicU64,
    chunks: AtomicU64,
    txs: AtomicU64,
    reads: AtomicU64,
    retransmits: AtomicU64,
    rpcs: AtomicU64,
    doorbells: AtomicU64,
    reads_overlapped: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's pool of DMA staging buffers (`max_dma` bytes each).
struct BufPool {
    size: usize,
    keep: usize,
    free: Mutex<Vec<LocalBuf>>,
}

impl BufPool {
    fn get(&self) -> LocalBuf {
        lock(&self.free)
            .pop()
            .unwrap_or_else(|| LocalBuf::new(self.size, 64))
    }

    fn put(&self, b: LocalBuf) {
        let mut f = lock(&self.free);
        if f.len() < self.keep {
            f.push(b);
        }
    }
}

/// One lane's DMA engine and its synchronous helpers.
struct Lane {
    eng: Box<dyn DmaEngine>,
    region: RegionId,
    base: u64,
    small: LocalBuf,
    next_ud: u64,
    /// Write completions seen, by user data (chunk seqs).
    done_writes: Vec<u64>,
    /// The channel's doorbell (the host worker parks on it).
    bell: Arc<OwnedFd>,
    /// The host's last park epoch this lane rang for.
    rung: u64,
}

const UD_READ: u64 = 1 << 63;

impl Lane {
    /// Pumps completions until the read `ud` completed (if given) or nothing is outstanding.
    fn pump(&mut self, want: Option<u64>) -> Result<(), StoreError> {
        let mut comps: [DmaCompletion; 8] = Default::default();
        self.eng.submit();
        loop {
            let n = self.eng.poll(&mut comps);
            let mut found = false;
            for c in &mut comps[..n] {
                c.result
                    .clone()
                    .map_err(|e| proxy_error(format!("DMA: {e}")))?;
                if c.user_data & UD_READ == 0 {
                    self.done_writes.push(c.user_data);
                } else if Some(c.user_data) == want {
                    found = true;
                }
            }
            if found || (want.is_none() && self.eng.outstanding() == 0) {
                return Ok(());
            }
            if n == 0 {
                std::hint::spin_loop();
            }
        }
    }

    /// Posts a write of `len` bytes of `buf` to channel offset `off`.
    fn post_write(
        &mut self,
        c: &Counters,
        off: u64,
        buf: &LocalBuf,
        len: usize,
        ud: u64,
    ) -> Result<(), StoreError> {
        assert!(len <= buf.len());
        let op = DmaOp::write(self.region, self.base + off, buf.as_ptr(), len as u32, ud);
        loop {
            // SAFETY: callers keep `buf` alive and untouched until `drain` has seen the
            // write complete (every path drains before releasing a buffer).
            match unsafe { self.eng.post(op) } {
                Ok(()) => break,
                Err(dds_dma::DmaError::QueueFull) => self.pump(None)?,
                Err(e) => return Err(proxy_error(format!("DMA: {e}"))),
            }
        }
        self.eng.submit();
        add(&c.dma_writes, 1);
        add(&c.bytes_written, len as u64);
        Ok(())
    }

    /// Reads `len` bytes at channel offset `off` into `buf` (synchronously).
    fn read_into(
        &mut self,
        c: &Counters,
        off: u64,
        buf: &LocalBuf,
        len: usize,
    ) -> Result<(), StoreError> {
        assert!(len <= buf.len());
        self.next_ud += 1;
        let ud = UD_READ | self.next_ud;
        let op = DmaOp::read(
            self.region,
            self.base + off,
            buf.as_mut_ptr(),
            len as u32,
            ud,
        );
        loop {
            // SAFETY: `buf` is not accessed until the read completes (pumped below).
            match unsafe { self.eng.post(op) } {
                Ok(()) => break,
                Err(dds_dma::DmaError::QueueFull) => self.pump(None)?,
                Err(e) => return Err(proxy_error(format!("DMA: {e}"))),
            }
        }
        add(&c.dma_reads, 1);
        add(&c.bytes_read, len as u64);
        self.pump(Some(ud))
    }

    /// Reads the control line: (consumed, state, reason, r_taken). Rings the channel's
    /// doorbell if the host worker parked (a new epoch in the sleep word): every wait for the
    /// host reads the control line after the write the host has to see, so a parked worker
    /// is woken within one poll.
    fn control(&mut self, c: &Counters) -> Result<[u64; 4], StoreError> {
        let buf = std::mem::replace(&mut self.small, LocalBuf::new(0, 8));
        // Zeroed first: a lost read leaves zeros, which only means "no progress yet".
        let mut buf = buf;
        buf.as_mut_slice()[..CTL_READ].fill(0);
        let r = self.read_into(c, 0, &buf, CTL_READ);
        let s = buf.as_slice();
        let v = [le64(s), le64(&s[8..]), le64(&s[16..]), le64(&s[24..])];
        let sleep = le64(&s[CTL_SLEEP as usize..]);
        self.small = buf;
        if r.is_ok() && sleep != 0 && sleep != self.rung {
            self.rung = sleep;
            add(&c.doorbells, 1);
            // A full counter (EAGAIN) means it is rung already.
            let _ = rustix::io::write(&*self.bell, &1u64.to_ne_bytes());
        }
        r.map(|()| v)
    }

    /// Waits for every outstanding operation (before staging buffers are reused).
    fn drain(&mut self) {
        if self.pump(None).is_err() {
            while self.eng.outstanding() > 0 {
                let mut comps: [DmaCompletion; 8] = Default::default();
                self.eng.poll(&mut comps);
            }
        }
    }
}

/// Write lane state (the driver's).
struct WriteLane {
    lane: Lane,
    seq: u64,
    ack: LocalBuf,
}

/// Read lane state, shared by the channel's readers (each takes the lock to post its
/// request or to poll for the next response chunk).
struct ReadLane {
    lane: Lane,
    /// Last read request seq written.
    rseq: u64,
    /// Highest read request seq the host has taken (`r_taken`).
    taken: u64,
    /// Next response chunk seq.
    cseq: u64,
    next_req: u64,
    /// Staging buffers of the K request slots.
    reqs: Vec<LocalBuf>,
    /// Requests written and not yet taken (retransmitted when late).
    sent: VecDeque<SentRead>,
    /// Requests being answered, by req_id, and their order (the host answers in order).
    inflight: HashMap<u64, ReadAssembly>,
    order: VecDeque<u64>,
    /// Finished requests waiting for their reader, by req_id.
    done: HashMap<u64, Result<Vec<u8>, StoreError>>,
    resp: LocalBuf,
    freed: LocalBuf,
    /// When `r_freed` was last written.
    freed_at: Instant,
}

struct SentRead {
    rseq: u64,
    len: usize,
    at: Instant,
}

struct ReadAssembly {
    /// Its read request seq.
    rseq: u64,
    /// Bytes asked for.
    want: u64,
    out: Vec<u8>,
    /// Next chunk index.
    index: u32,
}

/// How a read failed: the request's own result (an object error, a dead channel), or a
/// failure of the lane itself, which kills the channel.
enum Fault {
    Result(StoreError),
    Transport(StoreError),
}

impl Fault {
    fn into_error(self) -> StoreError {
        match self {
            Fault::Result(e) | Fault::Transport(e) => e,
        }
    }
}

struct Pending {
    next_rid: u64,
    q: VecDeque<(u64, Vec<u8>)>,
}

struct Channel {
    idx: u32,
    pending: Mutex<Pending>,
    cv: Condvar,
    g_done: AtomicU64,
    failures: Mutex<HashMap<u64, StoreError>>,
    dead: Mutex<Option<String>>,
    write: Mutex<WriteLane>,
    read: Mutex<ReadLane>,
}

impl Channel {
    /// Algorithm 1: raises `g_done` to `rid` unless it is already there.
    fn complete_upto(&self, rid: u64) {
        let mut prev = self.g_done.load(Ordering::Acquire);
        while rid > prev {
            match self
                .g_done
                .compare_exchange(prev, rid, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(p) => prev = p,
            }
        }
        let _g = lock(&self.pending);
        self.cv.notify_all();
    }

    fn kill(&self, msg: String) {
        lock(&self.dead).get_or_insert(format!("channel {}: {msg}", self.idx));
        let _g = lock(&self.pending);
        self.cv.notify_all();
    }

    fn dead(&self) -> Option<StoreError> {
        lock(&self.dead).as_ref().map(|m| proxy_error(m.clone()))
    }
}

struct Shared {
    layout: Layout,
    opts: ProxyOptions,
    sock: Mutex<UnixStream>,
    watch: UnixStream,
    rpc_id: AtomicU64,
    channels: Vec<Channel>,
    pool: BufPool,
    counters: Counters,
    gone: AtomicBool,
}

/// The DPU-side object store: the OSD front end's `Arc<dyn ObjectStore>` in placement D.
pub struct ProxyObjectStore {
    sh: Arc<Shared>,
}

static THREAD_ORD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static ORD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn thread_ordinal() -> usize {
    ORD.with(|o| {
        if o.get() == usize::MAX {
            o.set(THREAD_ORD.fetch_add(1, Ordering::Relaxed));
        }
        o.get()
    })
}

impl ProxyObjectStore {
    /// Attaches to the host proxy listening on `socket`: the ATTACH handshake, the region's
    /// memfd registered with one DMA engine per lane.
    pub fn connect(socket: &Path, opts: ProxyOptions) -> Result<ProxyObjectStore, StoreError> {
        let io = |what: &str, e: std::io::Error| StoreError::Io {
            what: format!("object proxy: {what}"),
            source: e,
        };
        let layout = Layout {
            channels: u32::try_from(opts.channels).unwrap_or(u32::MAX),
            max_dma: u32::try_from(opts.max_dma).unwrap_or(u32::MAX),
        };
        layout.validate().map_err(StoreError::InvalidArgument)?;
        let mut s = UnixStream::connect(socket).map_err(|e| io("connect", e))?;
        let mut args = Vec::new();
        put_u32(&mut args, VERSION);
        put_u32(&mut args, layout.channels);
        put_u32(&mut args, layout.max_dma);
        send_frame(&s, F_ATTACH, 1, &args, &[]).map_err(|e| io("attach", e))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| io("attach", e))?;
        let (status, _, body, mut fds) = recv_frame(&mut s, MAX_RESPONSE)
            .map_err(|e| io("attach", e))?
            .ok_or_else(|| proxy_error("attach: the host closed the connection"))?;
        s.set_read_timeout(None).map_err(|e| io("attach", e))?;
        let mut c = Cursor::new(&body);
        if status != 0 {
            return Err(get_error(&mut c).unwrap_or_else(|| proxy_error("attach refused")));
        }
        let bad = || proxy_error("malformed ATTACH reply");
        let (v, ch, md, slots) = (c.u32(), c.u32(), c.u32(), c.u32());
        let (cb, rl) = (c.u64(), c.u64());
        if v != Some(VERSION)
            || ch != Some(layout.channels)
            || md != Some(layout.max_dma)
            || slots != Some(SLOTS as u32)
            || cb != Some(layout.channel_bytes())
            || rl != Some(layout.region_len())
        {
            return Err(bad());
        }
        if fds.len() != 1 + layout.channels as usize {
            return Err(bad());
        }
        let bells: Vec<Arc<OwnedFd>> = fds.drain(1..).map(Arc::new).collect();
        let fd: OwnedFd = fds.pop().ok_or_else(bad)?;
        let factory: DmaFactory = opts.dma.clone().unwrap_or_else(|| {
            let cost = opts.cost_model;
            Arc::new(move || Box::new(EmulatedDma::new(64, cost)) as Box<dyn DmaEngine>)
        });
        let mk_lane = |chan: u32| -> Result<Lane, StoreError> {
            let mut eng = factory();
            let dup = rustix::io::fcntl_dupfd_cloexec(&fd, 0).map_err(|e| io("dup", e.into()))?;
            let region = eng
                .register_region(RegionExport::memfd(dup, layout.region_len()))
                .map_err(|e| proxy_error(format!("register region: {e}")))?;
            Ok(Lane {
                eng,
                region: region.id,
                base: layout.channel(chan),
                small: LocalBuf::new(64, 64),
                next_ud: 0,
                done_writes: Vec::new(),
                bell: bells[chan as usize].clone(),
                rung: 0,
            })
        };
        let mut channels = Vec::new();
        for i in 0..layout.channels {
            channels.push(Channel {
                idx: i,
                pending: Mutex::new(Pending {
                    next_rid: 1,
                    q: VecDeque::new(),
                }),
                cv: Condvar::new(),
                g_done: AtomicU64::new(0),
                failures: Mutex::default(),
                dead: Mutex::default(),
                write: Mutex::new(WriteLane {
                    lane: mk_lane(i)?,
                    seq: 0,
                    ack: LocalBuf::new(ACK_SLOT as usize, 64),
                }),
                read: Mutex::new(ReadLane {
                    lane: mk_lane(i)?,
                    rseq: 0,
                    taken: 0,
                    cseq: 1,
                    next_req: 0,
                    reqs: (0..SLOTS)
                        .map(|_| LocalBuf::new(READ_REQ_BYTES as usize, 64))
                        .collect(),
                    sent: VecDeque::new(),
                    inflight: HashMap::new(),
                    order: VecDeque::new(),
                    done: HashMap::new(),
                    resp: LocalBuf::new(layout.max_dma as usize, 64),
                    freed: LocalBuf::new(8, 8),
                    freed_at: Instant::now(),
                }),
            });
        }
        let watch = s.try_clone().map_err(|e| io("socket", e))?;
        Ok(ProxyObjectStore {
            sh: Arc::new(Shared {
                layout,
                pool: BufPool {
                    size: layout.max_dma as usize,
                    keep: 2 * SLOTS as usize * layout.channels as usize,
                    free: Mutex::default(),
                },
                opts,
                sock: Mutex::new(s),
                watch,
                rpc_id: AtomicU64::new(1),
                channels,
                counters: Counters::default(),
                gone: AtomicBool::new(false),
            }),
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.sh.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            dma_writes: g(&c.dma_writes),
            dma_reads: g(&c.dma_reads),
            bytes_written: g(&c.bytes_written),
            bytes_read: g(&c.bytes_read),
            batches: g(&c.batches),
            chunks: g(&c.chunks),
            txs: g(&c.txs),
            reads: g(&c.reads),
            retransmits: g(&c.retransmits),
            doorbells: g(&c.doorbells),
            reads_overlapped: g(&c.reads_overlapped),
            rpcs: g(&c.rpcs),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &ProxyOptions {
        &self.sh.opts
    }

    fn channel(&self) -> &Channel {
        let n = self.sh.channels.len();
        &self.sh.channels[thread_ordinal() % n]
    }

    fn rpc(&self, func: u8, args: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.sh.check_gone()?;
        add(&self.sh.counters.rpcs, 1);
        let id = self.sh.rpc_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut s = lock(&self.sh.sock);
        let r = send_frame(&s, func, id, args, &[]).and_then(|()| recv_frame(&mut s, MAX_RESPONSE));
        let (status, rid, body, _) = match r {
            Ok(Some(f)) => f,
            Ok(None) | Err(_) => {
                self.sh.gone.store(true, Ordering::Release);
                return Err(gone_error());
            }
        };
        if rid != id {
            return Err(proxy_error(format!("RPC answer {rid} to request {id}")));
        }
        if status != 0 {
            return Err(get_error(&mut Cursor::new(&body))
                .unwrap_or_else(|| proxy_error("malformed RPC error")));
        }
        Ok(body)
    }
}

impl Drop for ProxyObjectStore {
    fn drop(&mut self) {
        let _ = self.sh.watch.shutdown(std::net::Shutdown::Both);
    }
}

fn gone_error() -> StoreError {
    proxy_error("host gone: the control connection to the host proxy is closed")
}

impl Shared {
    fn check_gone(&self) -> Result<(), StoreError> {
        if self.gone.load(Ordering::Acquire) {
            return Err(gone_error());
        }
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = [PollFd::new(&self.watch, PollFlags::RDHUP)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if poll(&mut fds, Some(&zero)).is_ok()
            && fds[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
        {
            self.gone.store(true, Ordering::Release);
            return Err(gone_error());
        }
        Ok(())
    }

    fn is_small(&self, len: usize) -> bool {
        8 + len as u64 <= self.layout.payload_cap()
    }
}

/// Spins, then yields, then sleeps briefly; checks the host every 20 ms.
struct Waiter {
    n: u32,
    last_check: Instant,
}

impl Waiter {
    fn new() -> Self {
        Waiter {
            n: 0,
            last_check: Instant::now(),
        }
    }

    fn wait(&mut self, sh: &Shared) -> Result<(), StoreError> {
        self.n += 1;
        if self.n < 16 {
            std::hint::spin_loop();
        } else if self.n < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
        if self.last_check.elapsed() > Duration::from_millis(20) {
            self.last_check = Instant::now();
            sh.check_gone()?;
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.n = 0;
    }
}

/// What the driver sends next.
enum Unit {
    Batch(Vec<(u64, Vec<u8>)>),
    Large(u64, Vec<u8>),
}

impl Shared {
    fn submit_bytes(&self, ch: &Channel, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.check_gone()?;
        if let Some(e) = ch.dead() {
            return Err(e);
        }
        add(&self.counters.txs, 1);
        let rid = {
            let mut p = lock(&ch.pending);
            while p.q.len() >= self.opts.max_pending {
                p = ch
                    .cv
                    .wait_timeout(p, Duration::from_millis(2))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                if let Some(e) = ch.dead() {
                    return Err(e);
                }
            }
            let rid = p.next_rid;
            p.next_rid += 1;
            p.q.push_back((rid, bytes));
            rid
        };
        loop {
            if ch.g_done.load(Ordering::Acquire) >= rid {
                return match lock(&ch.failures).remove(&rid) {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            if let Some(e) = ch.dead() {
                return Err(e);
            }
            match ch.write.try_lock() {
                Ok(mut w) => {
                    if let Err(e) = self.drive(ch, &mut w, rid) {
                        ch.kill(e.to_string());
                    }
                    drop(w);
                    let _g = lock(&ch.pending);
                    ch.cv.notify_all();
                }
                Err(_) => {
                    let p = lock(&ch.pending);
                    if ch.g_done.load(Ordering::Acquire) < rid {
                        let _ = ch.cv.wait_timeout(p, Duration::from_millis(1));
                    }
                }
            }
        }
    }

    /// Sends pending transactions until `rid` is acknowledged.
    fn drive(&self, ch: &Channel, w: &mut WriteLane, rid: u64) -> Result<(), StoreError> {
        while ch.g_done.load(Ordering::Acquire) < rid {
            let unit = {
                let mut p = lock(&ch.pending);
                let Some((_, front)) = p.q.front() else {
                    return Err(proxy_error(
                        "a transaction vanished from its channel's queue",
                    ));
                };
                if !self.is_small(front.len()) {
                    let (r, b) = p.q.pop_front().expect("front exists");
                    Unit::Large(r, b)
                } else {
                    let mut batch = Vec::new();
                    let mut used = 4u64;
                    while let Some((_, b)) = p.q.front() {
                        let need = 4 + b.len() as u64;
                        if !self.is_small(b.len())
                            || used + need > self.layout.payload_cap()
                            || batch.len() >= MAX_BATCH
                            || (!self.opts.batching && !batch.is_empty())
                        {
                            break;
                        }
                        used += need;
                        batch.push(p.q.pop_front().expect("front exists"));
                    }
                    Unit::Batch(batch)
                }
            };
            ch.cv.notify_all();
            let (first, results) = match unit {
                Unit::Batch(b) => (b[0].0, self.send_batch(w, &b)?),
                Unit::Large(r, b) => (r, self.send_large(w, r, &b)?),
            };
            let last = first + results.len() as u64 - 1;
            {
                let mut f = lock(&ch.failures);
                for (i, r) in results.into_iter().enumerate() {
                    if let Err(e) = r {
                        f.insert(first + i as u64, e);
                    }
                }
            }
            ch.complete_upto(last);
        }
        Ok(())
    }

    fn send_batch(
        &self,
        w: &mut WriteLane,
        txs: &[(u64, Vec<u8>)],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        add(&self.counters.batches, 1);
        let mut buf = self.pool.get();
        let seq = w.seq + 1;
        let b = buf.as_mut_slice();
        let mut at = 64;
        b[at..at + 4].copy_from_slice(&(txs.len() as u32).to_le_bytes());
        at += 4;
        for (_, t) in txs {
            b[at..at + 4].copy_from_slice(&(t.len() as u32).to_le_bytes());
            b[at + 4..at + 4 + t.len()].copy_from_slice(t);
            at += 4 + t.len();
        }
        let payload_len = at - 64;
        TransferHeader {
            seq,
            kind: KIND_BATCH,
            payload_len: payload_len as u32,
            req_id: txs[0].0,
            a: txs.len() as u32,
            ..Default::default()
        }
        .encode(b);
        let total = self.finish_transfer(b, seq, payload_len);
        w.seq = seq;
        let r = self.send_and_ack(w, &buf, total, seq, txs.len());
        w.lane.drain();
        self.pool.put(buf);
        r
    }

    /// Writes padding and trailer; returns the transfer's length.
    fn finish_transfer(&self, b: &mut [u8], seq: u64, payload_len: usize) -> usize {
        let end = 64 + align8(payload_len as u64) as usize;
        b[64 + payload_len..end].fill(0);
        b[end..end + 8].copy_from_slice(&seq.to_le_bytes());
        end + 8
    }

    /// Sends one transfer (retransmitting it until consumed) and waits for its ACK.
    fn send_and_ack(
        &self,
        w: &mut WriteLane,
        buf: &LocalBuf,
        len: usize,
        seq: u64,
        count: usize,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let c = &self.counters;
        let slot = self.layout.req_slot(seq);
        w.lane.post_write(c, slot, buf, len, seq)?;
        w.lane.pump(None)?;
        let mut sent = Instant::now();
        let mut waiter = Waiter::new();
        loop {
            if let Some(r) = self.poll_ack(w, seq, count)? {
                return Ok(r);
            }
            let [consumed, state, reason, _] = w.lane.control(c)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            if consumed < seq && sent.elapsed() > self.opts.retransmit_after {
                add(&c.retransmits, 1);
                w.lane.post_write(c, slot, buf, len, seq)?;
                w.lane.pump(None)?;
                sent = Instant::now();
            }
            waiter.wait(self)?;
        }
    }

    /// Reads the ACK slot of `seq`; the results once it is there.
    fn poll_ack(
        &self,
        w: &mut WriteLane,
        seq: u64,
        count: usize,
    ) -> Result<Option<Vec<Result<(), StoreError>>>, StoreError> {
        let c = &self.counters;
        let off = self.layout.ack_slot(seq);
        let len = 64 + 4 * count;
        w.ack.as_mut_slice()[..8].fill(0);
        w.lane.read_into(c, off, &w.ack, len)?;
        let a = w.ack.as_slice();
        if le64(a) != seq {
            return Ok(None);
        }
        if le32(&a[16..]) as usize != count {
            return Err(proxy_error("ACK count differs from the batch's"));
        }
        let err_bytes = (le32(&a[20..]) as u64).min(ACK_SLOT - ACK_ERR_AREA) as usize;
        let codes: Vec<u32> = (0..count).map(|i| le32(&a[64 + 4 * i..])).collect();
        let mut msgs: HashMap<usize, StoreError> = HashMap::new();
        if err_bytes > 0 {
            w.lane.read_into(c, off + ACK_ERR_AREA, &w.ack, err_bytes)?;
            let mut cur = Cursor::new(&w.ack.as_slice()[..err_bytes]);
            while let Some(i) = cur.u32() {
                match get_error(&mut cur) {
                    Some(e) => msgs.insert(i as usize, e),
                    None => break,
                };
            }
        }
        Ok(Some(
            codes
                .into_iter()
                .enumerate()
                .map(|(i, code)| match code {
                    0 => Ok(()),
                    _ => Err(msgs.remove(&i).unwrap_or_else(|| {
                        error_from_parts(code, 0, 0, b"(detail not transmitted)")
                    })),
                })
                .collect(),
        ))
    }

    /// Sends a large transaction as pipelined chunks and waits for its ACK.
    fn send_large(
        &self,
        w: &mut WriteLane,
        rid: u64,
        tx: &[u8],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut inflight: VecDeque<(u64, LocalBuf, usize, Instant)> = VecDeque::new();
        let r = self.pipeline(w, rid, tx, &mut inflight);
        w.lane.drain();
        for (_, b, _, _) in inflight {
            self.pool.put(b);
        }
        let last = r?;
        let mut waiter = Waiter::new();
        loop {
            if let Some(r) = self.poll_ack(w, last, 1)? {
                return Ok(r);
            }
            let [_, state, reason, _] = w.lane.control(&self.counters)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            waiter.wait(self)?;
        }
    }

    /// The chunk pipeline: returns the seq of the last chunk once every chunk is consumed.
    fn pipeline(
        &self,
        w: &mut WriteLane,
        rid: u64,
        tx: &[u8],
        inflight: &mut VecDeque<(u64, LocalBuf, usize, Instant)>,
    ) -> Result<u64, StoreError> {
        let c = &self.counters;
        let cap = self.layout.payload_cap() as usize;
        let total = tx.len().div_ceil(cap);
        let window = if self.opts.chunking {
            SLOTS as usize
        } else {
            1
        };
        let first_seq = w.seq + 1;
        let mut next = 0usize;
        let mut consumed = w.seq;
        let mut waiter = Waiter::new();
        loop {
            // Release the staging buffers of consumed chunks.
            while inflight.front().is_some_and(|f| f.0 <= consumed) {
                w.lane.drain();
                let (_, b, _, _) = inflight.pop_front().expect("front exists");
                self.pool.put(b);
            }
            if next == total && inflight.is_empty() {
                return Ok(first_seq + total as u64 - 1);
            }
            // Stage and send while the window allows.
            let mut progress = false;
            while next < total && inflight.len() < window {
                let seq = first_seq + next as u64;
                if seq > consumed + SLOTS {
                    break;
                }
                add(&c.chunks, 1);
                let mut buf = self.pool.get();
                let off = next * cap;
                let part = &tx[off..(off + cap).min(tx.len())];
                let b = buf.as_mut_slice();
                TransferHeader {
                    seq,
                    kind: KIND_CHUNK,
                    payload_len: part.len() as u32,
                    req_id: rid,
                    a: next as u32,
                    b: total as u32,
                    offset: off as u64,
                    tx_len: tx.len() as u64,
                }
                .encode(b);
                b[64..64 + part.len()].copy_from_slice(part);
                let len = self.finish_transfer(b, seq, part.len());
                w.lane
                    .post_write(c, self.layout.req_slot(seq), &buf, len, seq)?;
                w.seq = seq;
                inflight.push_back((seq, buf, len, Instant::now()));
                next += 1;
                progress = true;
            }
            let [cons, state, reason, _] = w.lane.control(c)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            if cons > consumed {
                consumed = cons.min(w.seq);
                progress = true;
            }
            for (seq, buf, len, sent) in inflight.iter_mut() {
                if *seq > consumed && sent.elapsed() > self.opts.retransmit_after {
                    add(&c.retransmits, 1);
                    w.lane
                        .post_write(c, self.layout.req_slot(*seq), buf, *len, *seq)?;
                    *sent = Instant::now();
                }
            }
            w.lane.done_writes.clear();
            if progress {
                waiter.reset();
            } else {
                waiter.wait(self)?;
            }
        }
    }

    fn read_data(
        &self,
        ch: &Channel,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, StoreError> {
        self.check_gone()?;
        if oid.name.is_empty() || oid.name.len() > dds_objstore::MAX_NAME_LEN {
            return Err(StoreError::InvalidArgument(format!(
                "object name of {} bytes",
                oid.name.len()
            )));
        }
        add(&self.counters.reads, 1);
        let res = self.read_wait(ch, oid, offset, len);
        if let Err(Fault::Transport(e)) = &res {
            // A transport failure leaves the lane's sequence numbers unknown.
            ch.kill(e.to_string());
            lock(&ch.read).lane.drain();
        }
        res.map_err(Fault::into_error)
    }

    /// Posts a read request (once a request slot is free), then polls the lane, taking turns
    /// with the channel's other readers, until the result with its req_id is in.
    fn read_wait(
        &self,
        ch: &Channel,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, Fault> {
        let mut waiter = Waiter::new();
        let mut mine = None;
        loop {
            if let Some(e) = ch.dead() {
                return Err(Fault::Result(e));
            }
            let mut r = lock(&ch.read);
            if let Some(id) = mine {
                if let Some(res) = r.done.remove(&id) {
                    return res.map_err(Fault::Result);
                }
            } else if r.rseq < r.taken + SLOTS {
                mine = Some(self.post_read(&mut r, oid, offset, len)?);
                waiter.reset();
                continue;
            }
            let progress = self.read_step(&mut r)?;
            drop(r);
            if progress {
                waiter.reset();
            } else {
                waiter.wait(self).map_err(Fault::Transport)?;
            }
        }
    }

    /// Writes read request `rseq + 1` into its slot; returns its req_id.
    fn post_read(
        &self,
        r: &mut ReadLane,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<u64, Fault> {
        let c = &self.counters;
        if !r.inflight.is_empty() {
            add(&c.reads_overlapped, 1);
        }
        r.rseq += 1;
        r.next_req += 1;
        let (rseq, req_id) = (r.rseq, r.next_req);
        let name_len = oid.name.len();
        let i = ((rseq - 1) % SLOTS) as usize;
        let b = r.reqs[i].as_mut_slice();
        ReadHeader {
            rseq,
            req_id,
            pool: oid.pool,
            offset,
            len,
            name_len: name_len as u32,
            window: if self.opts.chunking { SLOTS as u32 } else { 1 },
        }
        .encode(b);
        b[64..64 + name_len].copy_from_slice(&oid.name);
        let end = 64 + align8(name_len as u64) as usize;
        b[64 + name_len..end].fill(0);
        b[end..end + 8].copy_from_slice(&rseq.to_le_bytes());
        let req_len = end + 8;
        let slot = self.layout.read_req_slot(rseq);
        r.lane
            .post_write(c, slot, &r.reqs[i], req_len, 0)
            .map_err(Fault::Transport)?;
        r.lane.pump(None).map_err(Fault::Transport)?;
        r.sent.push_back(SentRead {
            rseq,
            len: req_len,
            at: Instant::now(),
        });
        r.order.push_back(req_id);
        r.inflight.insert(
            req_id,
            ReadAssembly {
                rseq,
                want: len,
                out: Vec::new(),
                index: 0,
            },
        );
        Ok(req_id)
    }

    /// Looks for the next response chunk and files it under its request; without one, reads
    /// the control line (ringing a parked host) and retransmits what the host has not taken.
    /// Errors are transport failures.
    fn read_step(&self, r: &mut ReadLane) -> Result<bool, Fault> {
        let c = &self.counters;
        let t = Fault::Transport;
        let Some(&front) = r.order.front() else {
            return Ok(false);
        };
        let cap = self.layout.payload_cap();
        // The host answers requests in order: the next chunk most likely belongs to the
        // oldest one, and one DMA read sized for it takes header and data together.
        let expect = {
            let a = &r.inflight[&front];
            a.want.saturating_sub(a.out.len() as u64).min(cap).max(512)
        };
        let want = (64 + expect) as usize;
        let slot = self.layout.resp_slot(r.cseq);
        r.resp.as_mut_slice()[..64].fill(0);
        r.lane.read_into(c, slot, &r.resp, want).map_err(t)?;
        let h = RespHeader::decode(r.resp.as_slice());
        if h.cseq == r.cseq {
            let pl = h.payload_len as usize;
            let malformed =
                || Fault::Transport(proxy_error(format!("malformed read response {h:?}")));
            let Some(a) = r.inflight.get_mut(&h.req_id) else {
                return Err(malformed());
            };
            if pl as u64 > cap
                || h.index != a.index
                || h.offset != a.out.len() as u64
                || h.total == 0
                || h.index >= h.total
            {
                return Err(malformed());
            }
            // An answered request was taken, and so were the ones before it.
            let answered = a.rseq;
            r.taken = r.taken.max(answered);
            r.sent.retain(|s| s.rseq > answered);
            if 64 + pl > want {
                r.lane.read_into(c, slot, &r.resp, 64 + pl).map_err(t)?;
            }
            let a = r.inflight.get_mut(&h.req_id).expect("checked above");
            let data = &r.resp.as_slice()[64..64 + pl];
            let finished = if h.status != 0 {
                let e = get_error(&mut Cursor::new(data))
                    .unwrap_or_else(|| error_from_parts(h.status, 0, 0, b""));
                Some(Err(e))
            } else {
                if a.out.is_empty() {
                    a.out.reserve(h.data_len.min(a.want) as usize);
                }
                a.out.extend_from_slice(data);
                a.index += 1;
                (a.index == h.total).then(|| Ok(std::mem::take(&mut a.out)))
            };
            if let Some(res) = finished {
                r.inflight.remove(&h.req_id);
                r.order.retain(|&id| id != h.req_id);
                r.done.insert(h.req_id, res);
            }
            self.free_chunk(r).map_err(t)?;
            return Ok(true);
        }
        let [_, state, reason, r_taken] = r.lane.control(c).map_err(t)?;
        check_state(state, reason, r.lane.base, &self.layout).map_err(t)?;
        let mut progress = false;
        if r_taken > r.taken {
            r.taken = r_taken.min(r.rseq);
            progress = true;
        }
        let taken = r.taken;
        r.sent.retain(|s| s.rseq > taken);
        let late = self.opts.retransmit_after;
        if r.sent.front().is_some_and(|s| s.at.elapsed() > late) {
            add(&c.retransmits, 1);
            for i in 0..r.sent.len() {
                let (rseq, len) = (r.sent[i].rseq, r.sent[i].len);
                let b = ((rseq - 1) % SLOTS) as usize;
                let slot = self.layout.read_req_slot(rseq);
                r.lane.post_write(c, slot, &r.reqs[b], len, 0).map_err(t)?;
                r.sent[i].at = Instant::now();
            }
            r.lane.pump(None).map_err(t)?;
        }
        if r.freed_at.elapsed() > late {
            // A lost r_freed would stall the host: write it again.
            let last = r.cseq - 1;
            self.write_freed(r, last).map_err(t)?;
        }
        Ok(progress)
    }

    /// Hands response slot `cseq` back to the host.
    fn free_chunk(&self, r: &mut ReadLane) -> Result<(), StoreError> {
        let cseq = r.cseq;
        self.write_freed(r, cseq)?;
        r.cseq += 1;
        Ok(())
    }

    fn write_freed(&self, r: &mut ReadLane, v: u64) -> Result<(), StoreError> {
        r.lane.pump(None)?;
        r.freed.as_mut_slice().copy_from_slice(&v.to_le_bytes());
        r.lane
            .post_write(&self.counters, DPU_LINE, &r.freed, 8, 0)?;
        r.lane.pump(None)?;
        r.freed_at = Instant::now();
        Ok(())
    }
}

fn check_state(state: u64, reason: u64, base: u64, layout: &Layout) -> Result<(), StoreError> {
    if state == 1 {
        let c = base / layout.channel_bytes();
        return Err(proxy_error(format!(
            "object proxy channel {c} closed by the host: {}",
            reason_text(reason)
        )));
    }
    Ok(())
}

fn put_oid(out: &mut Vec<u8>, oid: &ObjectId) {
    put_u64(out, oid.pool);
    put_bytes(out, &oid.name);
}

fn malformed() -> StoreError {
    proxy_error("malformed RPC response")
}

fn get_pairs(c: &mut Cursor<'_>) -> Option<KvPairs> {
    let n = c.u32()? as usize;
    let mut v = Vec::with_capacity(n.min(c.buf.len() / 8));
    for _ in 0..n {
        v.push((c.bytes()?.to_vec(), c.bytes()?.to_vec()));
    }
    Some(v)
}

impl ObjectStore for ProxyObjectStore {
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError> {
        let ch = self.channel();
        self.sh.submit_bytes(ch, tx.to_bytes())
    }

    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let ch = self.channel();
        self.sh.read_data(ch, oid, offset, len)
    }

    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        let b = self.rpc(F_STAT, &a)?;
        let mut c = Cursor::new(&b);
        match (c.u64(), c.u64()) {
            (Some(size), Some(mtime_ns)) => Ok(ObjStat { size, mtime_ns }),
            _ => Err(malformed()),
        }
    }

    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_bytes(&mut a, name);
        let b = self.rpc(F_GETXATTR, &a)?;
        Cursor::new(&b)
            .bytes()
            .map(<[u8]>::to_vec)
            .ok_or_else(malformed)
    }

    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        let b = self.rpc(F_GETXATTRS, &a)?;
        get_pairs(&mut Cursor::new(&b)).ok_or_else(malformed)
    }

    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_u32(&mut a, keys.len() as u32);
        for k in keys {
            put_bytes(&mut a, k);
        }
        let b = self.rpc(F_OMAP_GET, &a)?;
        let mut c = Cursor::new(&b);
        let n = c.u32().ok_or_else(malformed)? as usize;
        let mut out = Vec::with_capacity(n.min(keys.len()));
        for _ in 0..n {
            out.push(match c.u8() {
                Some(0) => None,
                Some(1) => Some(c.bytes().ok_or_else(malformed)?.to_vec()),
                _ => return Err(malformed()),
            });
        }
        Ok(out)
    }

    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_opt_bytes(&mut a, start_after);
        put_u64(&mut a, max as u64);
        let b = self.rpc(F_OMAP_LIST, &a)?;
        get_pairs(&mut Cursor::new(&b)).ok_or_else(malformed)
    }

    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut a = Vec::new();
        put_u64(&mut a, pool);
        put_opt_bytes(&mut a, start_after);
        put_u64(&mut a, max as u64);
        let b = self.rpc(F_LIST, &a)?;
        let mut c = Cursor::new(&b);
        let n = c.u32().ok_or_else(malformed)? as usize;
        let mut out = Vec::with_capacity(n.min(b.len() / 4));
        for _ in 0..n {
            out.push(c.bytes().ok_or_else(malformed)?.to_vec());
        }
        Ok(out)
    }

    fn statfs(&self) -> Result<StoreStats, StoreError> {
        let b = self.rpc(F_STATFS, &[])?;
        let mut c = Cursor::new(&b);
        let mut v = [0u64; 5];
        for x in &mut v {
            *x = c.u64().ok_or_else(malformed)?;
        }
        Ok(StoreStats {
            device_bytes: v[0],
            block_size: v[1],
            data_bytes: v[2],
            allocated_bytes: v[3],
            objects: v[4],
        })
    }
}
