//! The hybrid log and its index (`docs/kv-service.md` §1–§3), single-threaded: the server's
//! event loop owns the store.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};

use crate::checkpoint::{Checkpoint, CheckpointFile};
use crate::collection::{self, KIND_ELEMENT, KIND_ELEMENT_TOMBSTONE, KIND_META};
use crate::record::{self, Header, FLAG_SUPERSEDED, HEADER, KIND_TOMBSTONE, KIND_VALUE};
use dds_storage::aio::SubmitError;
use dds_storage::fileio::{FileIo, IoDone};
use dds_storage::{Storage, StoreFile};

/// What survives a restart (`docs/kv-service.md` §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Nothing: the log starts empty.
    None,
    /// Writes older than the sync interval.
    Periodic,
    /// Every acknowledged write.
    Fsync,
}

/// Settings of a store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Page bytes (power of two, ≥ 64 KiB).
    pub page_size: usize,
    /// Bytes of memory for log pages (at least 3 pages).
    pub memory: usize,
    /// Log file bytes (a multiple of the page size, at least 8 pages).
    pub log_size: u64,
    /// Largest key.
    pub max_key: usize,
    /// Largest value (at most half a page).
    pub max_value: usize,
    /// What survives a restart.
    pub durability: Durability,
    /// Keep the DPU's cache table coherent with the log (the log file is exposed).
    pub offload: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            page_size: 1 << 20,
            memory: 64 << 20,
            log_size: 1 << 30,
            max_key: 4096,
            max_value: 512 << 10,
            durability: Durability::Periodic,
            offload: true,
        }
    }
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The live data fills the log file.
    #[error("log full: live data fills the log file (raise --log-size)")]
    LogFull,
    /// The value is not an integer (INCR).
    #[error("value is not an integer or out of range")]
    NotInteger,
    /// INCR would overflow.
    #[error("increment or decrement would overflow")]
    Overflow,
    /// A key above the limit.
    #[error("key too large (limit {0} bytes)")]
    KeyTooLarge(usize),
    /// A value above the limit.
    #[error("value too large (limit {0} bytes)")]
    ValueTooLarge(usize),
    /// The key holds a value of another type (a collection read as a string, or the reverse).
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// The in-memory engine's memory budget is full (nothing was evicted).
    #[error("out of memory")]
    OutOfMemory,
    /// The engine does not have what the command needs.
    #[error("{0}")]
    Unsupported(&'static str),
    /// Storage failed: the store can no longer be trusted to have written what it said.
    #[error("storage: {0:#}")]
    Storage(anyhow::Error),
}

impl From<anyhow::Error> for StoreError {
    fn from(e: anyhow::Error) -> Self {
        StoreError::Storage(e)
    }
}

/// Receives a key's previous value (SET ... GET, GETSET).
pub type OldValue<'a> = &'a mut dyn FnMut(Option<&[u8]>);

/// Result of store operations.
pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// SET conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCond {
    /// Always.
    Always,
    /// Only if the key is missing (NX).
    IfMissing,
    /// Only if the key exists (XX).
    IfExists,
}

/// What a read-modify-write decided ([`Store::modify`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Modify {
    /// Leave the key as it is.
    Keep,
    /// Store the new value.
    Write,
}

/// The closure of a read-modify-write: the value (`None`: missing) and the buffer the new
/// value is built in.
pub type Modifier<'a> = &'a mut dyn FnMut(Option<&[u8]>, &mut Vec<u8>) -> Modify;

/// Expiry of a SET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No expiry.
    None,
    /// At this Unix time in milliseconds.
    At(u64),
    /// Keep the key's current expiry (KEEPTTL).
    Keep,
}

/// Counters for INFO and the benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreStats {
    /// Reads of records that were in memory.
    pub memory_reads: u64,
    /// Reads of records from storage.
    pub storage_reads: u64,
    /// Of those, served by a read issued ahead of the command (a pending read).
    pub fetched_reads: u64,
    /// Of those, read while the command waited (the event loop blocked).
    pub blocking_reads: u64,
    /// Updates done in place (mutable region).
    pub in_place_updates: u64,
    /// Records appended.
    pub appends: u64,
    /// Pages written to storage.
    pub page_writes: u64,
    /// Pages compacted.
    pub compactions: u64,
    /// Live records moved by compaction.
    pub compaction_moves: u64,
    /// Their bytes (appended at the tail, as the commands' own records are).
    pub compaction_moved_bytes: u64,
    /// Keys invalidated in the DPU's cache table by the host.
    pub invalidations: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Commits made durable.
    pub commits: u64,
    /// Times a command waited for storage inside the loop: a page leaving memory whose
    /// write had not completed, or a compaction whose page read had not (the device behind
    /// the log's appends).
    pub storage_waits: u64,
    /// Keys removed because their expiry passed (read, compacted or found by the active
    /// expiry cycle; INFO's `expired_keys`).
    pub expired_keys: u64,
}

/// The index hashes keys with XXH3 already: its hasher passes the low word through.
#[derive(Default)]
struct PassHasher(u64);
impl Hasher for PassHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // (h1, h2) is hashed as two words; h1 alone is a uniform hash.
        if self.0 == 0 {
            self.0 = v;
        }
    }
}

const TOMB: u64 = 1 << 63;
/// Index entry flag: the key's record has an expiry (INFO's keyspace `expires` counts them).
const EXPIRES: u64 = 1 << 62;
/// The log address in an index entry.
const ADDR: u64 = EXPIRES - 1;

/// An index entry for a value record at `addr`.
fn value_entry(addr: u64, expire_ms: u64) -> u64 {
    if expire_ms != 0 {
        addr | EXPIRES
    } else {
        addr
    }
}

/// The store: hybrid log, index, checkpoint.
pub struct Store {
    cfg: StoreConfig,
    storage: Box<dyn Storage>,
    file: Box<dyn StoreFile>,
    ckpt: Option<CheckpointFile>,
    ps: u64,
    cap: u64,
    frames: Vec<Box<[u8]>>,
    mutable_pages: u64,
    begin: u64,
    head: u64,
    read_only: u64,
    /// Log writes are issued up to here.
    flushed: u64,
    /// Records below are marked superseded or not, as they go to storage (`flushed ≤
    /// marked`): an update of one of them is invalidated in the DPU's cache.
    marked: u64,
    /// Log writes are asked up to here (`flushed ≤ flush_want ≤ read_only`); issued as they
    /// may be.
    flush_want: u64,
    /// Every log write below it completed (`written ≤ flushed`): pages below may leave
    /// memory, and records below be read from storage.
    written: u64,
    /// Log writes in flight: (start, end, completed), in address order (bounded).
    writes: VecDeque<(u64, u64, bool)>,
    /// Everything below it is durable (the end of the last completed commit).
    durable_end: u64,
    /// A command read or wrote a record at or above `durable_end` ([`Store::take_undurable`]).
    undurable: bool,
    /// The commit in flight.
    commit: space::Commit,
    /// The page read for compaction, and what it holds.
    compact_buf: Box<[u8]>,
    compact_read: space::CompactRead,
    /// Asynchronous I/O on the log (file 0) and the checkpoint (file 1).
    io: Box<dyn FileIo>,
    /// Completions of operations that are not the store's (reads ahead), for the server.
    foreign: Vec<IoDone>,
    /// Completions being handled (scratch).
    polled: Vec<IoDone>,
    /// A storage operation failed: nothing more is made durable or acknowledged.
    broken: bool,
    tail: u64,
    /// End of the page the tail is in (equal to `tail` when no page is started).
    tail_page_end: u64,
    /// `begin` as the newest durable checkpoint has it.
    durable_begin: u64,
    /// Compactions not yet in a durable checkpoint: `begin` after each, and the tail after
    /// its moves (a checkpoint takes that `begin` once the tail is durable).
    compacted: VecDeque<(u64, u64)>,
    seq: u64,
    /// (h1, h2) → address | TOMB | EXPIRES.
    index: HashMap<(u64, u64), u64, BuildHasherDefault<PassHasher>>,
    /// The index's keys in hash order: SCAN's and RANDOMKEY's order (`docs/kv-service.md`
    /// §1, Index).
    order: BTreeSet<(u64, u64)>,
    /// The keys with an expiry and its time (Unix ms): the active expiry cycle's sample.
    expires: BTreeMap<(u64, u64), u64>,
    /// The sum of the expiry set's times (INFO's `avg_ttl`).
    expire_sum: u128,
    /// Where the active expiry cycle samples next.
    expire_cursor: (u64, u64),
    /// Hashes of one step of SCAN or the expiry cycle (reused).
    step: Vec<(u64, u64)>,
    /// RANDOMKEY's generator state (xorshift).
    rng: u64,
    /// The key the next RANDOMKEY answers, chosen when its record was read ahead.
    picked: Option<(u64, u64)>,
    /// The element the next single random pick (SPOP, SRANDMEMBER, HRANDFIELD, ZRANDMEMBER
    /// without a count) takes while it is live: (collection key hash, sub-key hash), drawn
    /// when its command's read ahead was issued ([`Store::draw_element`]).
    drawn: Option<((u64, u64), (u64, u64))>,
    live: u64,
    /// Live keys with an expiry.
    expiring: u64,
    dirty: bool,
    invalidate: Vec<u64>,
    stats: StoreStats,
    scratch: Vec<u8>,
    /// The new value of a read-modify-write ([`Store::modify`]).
    wbuf: Vec<u8>,
    /// Records read ahead for the command being run (`docs/kv-service.md` §5, pending reads).
    fetched: Vec<Fetched>,
    /// The collections (`docs/kv-service.md` §7.2).
    colls: crate::collmap::Collections,
    /// A composite key being built (reused).
    ckey: Vec<u8>,
}

/// A record read from storage ahead of a command (a pending read that completed): its log
/// address and the bytes read there (the whole record, unless the read failed or fell short).
#[derive(Debug, Default)]
pub struct Fetched {
    /// Log address of the record.
    pub addr: u64,
    /// Bytes read before the record (the read started at the block the record starts in).
    pub skip: usize,
    /// The bytes read.
    pub bytes: Vec<u8>,
}

/// `n` in decimal, written at the end of `buf` (no allocation); the digits written.
fn decimal(n: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len() - unsigned_decimal(n.unsigned_abs(), buf).len();
    if n < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// `m` in decimal, written at the end of `buf` (no allocation); the digits written.
pub(crate) fn unsigned_decimal(mut m: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    &buf[at..]
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A record found for a key.
struct Found {
    hdr: Header,
}

impl Store {
    /// Opens the store in `storage`: recovers the log (unless durability is `None`) and
    /// exposes it to the DPU when `offload` is on.
    pub fn open(storage: Box<dyn Storage>, cfg: StoreConfig) -> Result<Store> {
        let ps = cfg.page_size as u64;
        ensure!(
            cfg.page_size.is_power_of_two() && cfg.page_size >= 64 << 10,
            "page size must be a power of two of at least 64 KiB"
        );
        let mem_pages = (cfg.memory / cfg.page_size) as u64;
        ensure!(mem_pages >= 3, "memory must hold at least 3 pages");
        ensure!(
            cfg.log_size.is_multiple_of(ps) && cfg.log_size / ps >= 8,
            "log size must be a multiple of the page size and at least 8 pages"
        );
        ensure!(
            cfg.log_size >= mem_pages * ps,
            "log size must be at least the memory budget"
        );
        ensure!(
            record::record_len(cfg.max_key, cfg.max_value) <= cfg.page_size,
            "a record of the largest key and value must fit in a page"
        );
        ensure!(
            cfg.max_key >= 1 && cfg.max_key <= u16::MAX as usize,
            "key limit"
        );
        let file = storage.open("log")?;
        if file.size()? < cfg.log_size {
            file.set_size(cfg.log_size).with_context(|| {
                format!(
                    "size the log file to {} bytes (does the device have room? choose a smaller --log-size)",
                    cfg.log_size
                )
            })?;
        }
        let ckpt = match cfg.durability {
            Durability::None => None,
            _ => Some(CheckpointFile::open(storage.open("checkpoint")?)?),
        };
        let io = match cfg.durability {
            Durability::None => storage.file_io(&["log"])?,
            _ => storage.file_io(&["log", "checkpoint"])?,
        };
        let frames = (0..mem_pages)
            .map(|_| vec![0u8; cfg.page_size].into_boxed_slice())
            .collect();
        let mut s = Store {
            ps,
            cap: cfg.log_size,
            mutable_pages: ((mem_pages * 9) / 10).clamp(1, mem_pages - 2),
            frames,
            begin: 0,
            head: 0,
            read_only: 0,
            flushed: 0,
            marked: 0,
            flush_want: 0,
            written: 0,
            writes: VecDeque::with_capacity(space::WRITES_MAX),
            durable_end: 0,
            undurable: false,
            commit: space::Commit::default(),
            compact_buf: vec![0u8; cfg.page_size].into_boxed_slice(),
            compact_read: space::CompactRead::None,
            io,
            foreign: Vec::with_capacity(64),
            polled: Vec::with_capacity(64),
            broken: false,
            tail: 0,
            tail_page_end: 0,
            durable_begin: 0,
            compacted: VecDeque::new(),
            seq: 0,
            index: HashMap::default(),
            order: BTreeSet::new(),
            expires: BTreeMap::new(),
            expire_sum: 0,
            expire_cursor: (0, 0),
            step: Vec::new(),
            rng: now_ms() | 1,
            picked: None,
            drawn: None,
            live: 0,
            expiring: 0,
            dirty: false,
            invalidate: Vec::new(),
            stats: StoreStats::default(),
            scratch: Vec::new(),
            wbuf: Vec::new(),
            fetched: Vec::new(),
            colls: Default::default(),
            ckey: Vec::new(),
            file,
            ckpt,
            storage,
            cfg,
        };
        if let Some(c) = s.ckpt.as_ref().and_then(|c| c.latest()) {
            ensure!(
                c.page_size == ps && c.capacity == s.cap,
                "the log was written with page size {} and log size {}; start with those",
                c.page_size,
                c.capacity
            );
            s.recover(c)?;
        } else if s.ckpt.is_some() {
            // A new store: an empty checkpoint, so recovery never reads old bytes of the file.
            s.write_checkpoint()?;
        }
        if s.cfg.offload {
            // Without an offload engine on the DPU there is no cache to keep coherent.
            s.cfg.offload = s.storage.expose(s.file.as_ref())?;
        }
        Ok(s)
    }

    fn page_of(&self, a: u64) -> u64 {
        a / self.ps
    }
    fn frame(&self, page: u64) -> usize {
        (page % self.frames.len() as u64) as usize
    }
    fn in_frame(&self, a: u64) -> (usize, usize) {
        (self.frame(self.page_of(a)), (a % self.ps) as usize)
    }

    /// Replays the log from the checkpoint's `begin` into the index.
    fn recover(&mut self, c: Checkpoint) -> Result<()> {
        self.begin = c.begin;
        let mut page = vec![0u8; self.ps as usize];
        let mut last_seq = 0u64;
        let mut a = c.begin;
        self.tail = c.begin;
        'scan: while a < c.begin + self.cap {
            let p = self.page_of(a);
            let n = self.file.read_at((p * self.ps) % self.cap, &mut page)?;
            page[n..].fill(0);
            let o = (a % self.ps) as usize;
            let mut any = false;
            for (off, h) in record::scan(&page[o..]) {
                if h.seq <= last_seq {
                    // Older bytes of the circular file: the log ends here.
                    break 'scan;
                }
                last_seq = h.seq;
                let at = o + off;
                let key = &page[at + HEADER..at + HEADER + h.klen as usize];
                let addr = p * self.ps + at as u64;
                if h.kind == KIND_ELEMENT || h.kind == KIND_ELEMENT_TOMBSTONE {
                    if let Some(c) = collection::decode_composite(key) {
                        self.colls
                            .replay_element(&c, addr, h.kind == KIND_ELEMENT_TOMBSTONE);
                    }
                } else {
                    let kh = record::key_hash(key);
                    let value = &page[at + HEADER + h.klen as usize..at + h.len()];
                    match collection::decode_meta(&value[..h.vlen as usize])
                        .filter(|_| h.kind == KIND_META)
                    {
                        Some(meta) => self.colls.meta(kh, meta),
                        None => {
                            self.colls.remove(kh);
                        }
                    }
                    self.replay(kh, addr, &h);
                }
                self.tail = p * self.ps + (at + h.len()) as u64;
                any = true;
            }
            if !any {
                break;
            }
            // The page's records end here (zeros follow): go on with the next page.
            a = (p + 1) * self.ps;
        }
        self.seq = c.seq.max(last_seq);
        // Collections whose metadata record survived without any element are deleted, as
        // Redis keeps no empty collection (their records are garbage from now on).
        for kh in self.colls.finish_recovery() {
            if let Some(e) = self.index.get(&kh).copied().filter(|e| e & TOMB == 0) {
                self.live -= 1;
                if e & EXPIRES != 0 {
                    self.expiring -= 1;
                }
                self.index_remove(kh);
            }
        }
        // The tail page goes back into memory; everything recovered is on storage.
        if !self.tail.is_multiple_of(self.ps) {
            let tp = self.page_of(self.tail);
            let fr = self.frame(tp);
            let n = self
                .file
                .read_at((tp * self.ps) % self.cap, &mut self.frames[fr])?;
            let used = (self.tail % self.ps) as usize;
            ensure!(n >= used, "short read of the log's tail page");
            self.frames[fr][used..].fill(0);
            self.head = tp * self.ps;
            self.tail_page_end = (tp + 1) * self.ps;
        } else {
            self.head = self.tail;
            self.tail_page_end = self.tail;
        }
        self.read_only = self.tail;
        self.flushed = self.tail;
        self.marked = self.tail;
        self.flush_want = self.tail;
        self.written = self.tail;
        self.durable_end = self.tail;
        self.durable_begin = self.begin;
        tracing::info!(
            begin = self.begin,
            tail = self.tail,
            keys = self.live,
            "recovered the log"
        );
        Ok(())
    }

    /// Points the index at `entry` for the key hash `h`, keeping the scan order and the
    /// expiry set in step (`expire_ms`: the record's expiry, 0 for none).
    fn index_put(&mut self, h: (u64, u64), entry: u64, expire_ms: u64) {
        let old = self.index.insert(h, entry);
        if old.is_none() {
            self.order.insert(h);
        }
        if expire_ms != 0 {
            let was = self.expires.insert(h, expire_ms);
            self.expire_sum =
                self.expire_sum + u128::from(expire_ms) - u128::from(was.unwrap_or(0));
        } else if old.is_some_and(|e| e & EXPIRES != 0) {
            self.forget_expiry(h);
        }
    }

    fn forget_expiry(&mut self, h: (u64, u64)) {
        if let Some(t) = self.expires.remove(&h) {
            self.expire_sum -= u128::from(t);
        }
    }

    /// The mean time to live of the keys with an expiry, in ms (INFO's `avg_ttl`; 0 when
    /// there are none).
    pub fn avg_ttl(&self) -> u64 {
        match self.expires.len() as u128 {
            0 => 0,
            n => u64::try_from(self.expire_sum / n)
                .unwrap_or(u64::MAX)
                .saturating_sub(now_ms()),
        }
    }

    /// Drops the key hash `h` from the index (and the scan order and expiry set).
    fn index_remove(&mut self, h: (u64, u64)) {
        self.colls.remove(h);
        if let Some(old) = self.index.remove(&h) {
            self.order.remove(&h);
            if old & EXPIRES != 0 {
                self.forget_expiry(h);
            }
        }
    }

    /// The live key `h` expired: it leaves the index. Its records are garbage for
    /// compaction, which moves only what the index points at.
    fn expire_key(&mut self, h: (u64, u64)) {
        self.index_remove(h);
        self.live -= 1;
        self.expiring -= 1;
        self.stats.expired_keys += 1;
    }

    fn replay(&mut self, h: (u64, u64), addr: u64, hdr: &Header) {
        let old = self.index.get(&h).copied();
        let old_live = matches!(old, Some(e) if e & TOMB == 0);
        if matches!(old, Some(e) if e & EXPIRES != 0) {
            self.expiring -= 1;
        }
        if hdr.kind == KIND_TOMBSTONE {
            self.index_put(h, addr | TOMB, 0);
            if old_live {
                self.live -= 1;
            }
        } else {
            self.index_put(h, value_entry(addr, hdr.expire_ms), hdr.expire_ms);
            if hdr.expire_ms != 0 {
                self.expiring += 1;
            }
            if !old_live {
                self.live += 1;
            }
        }
    }

    /// Reads the record at `a` into `scratch` (from memory or storage); returns its header.
    fn load(&mut self, a: u64) -> StoreResult<Header> {
        if a >= self.head {
            let (f, o) = self.in_frame(a);
            let h = record::decode_header(&self.frames[f][o..])
                .ok_or_else(|| StoreError::Storage(anyhow::anyhow!("bad record at {a}")))?;
            self.scratch.clear();
            self.scratch
                .extend_from_slice(&self.frames[f][o..o + h.len()]);
            self.stats.memory_reads += 1;
            return Ok(h);
        }
        self.stats.storage_reads += 1;
        if let Some(i) = self.fetched.iter().position(|f| f.addr == a) {
            // Read ahead: used when it holds a whole, valid record (else read again below).
            let f = &self.fetched[i];
            let b = &f.bytes[f.skip.min(f.bytes.len())..];
            if let Some(h) = record::check(b) {
                self.scratch.clear();
                self.scratch.extend_from_slice(&b[..h.len()]);
                self.stats.fetched_reads += 1;
                return Ok(h);
            }
        }
        self.stats.blocking_reads += 1;
        let page_left = (self.ps - a % self.ps) as usize;
        let first = page_left.min(256);
        self.scratch.resize(first, 0);
        let off = a % self.cap;
        let n = self.file.read_at(off, &mut self.scratch)?;
        let h = record::decode_header(&self.scratch[..n]).ok_or_else(|| {
            StoreError::Storage(anyhow::anyhow!("no valid record at log address {a}"))
        })?;
        if h.len() > first {
            self.scratch.resize(h.len(), 0);
            let n2 = self
                .file
                .read_at(off + first as u64, &mut self.scratch[first..])?;
            if n2 < h.len() - first {
                return Err(StoreError::Storage(anyhow::anyhow!(
                    "short read of the record at log address {a}"
                )));
            }
        }
        self.scratch.truncate(h.len());
        if record::check(&self.scratch).is_none() {
            return Err(StoreError::Storage(anyhow::anyhow!(
                "damaged record at log address {a} (checksum)"
            )));
        }
        Ok(h)
    }

    /// The index entry of the key hash `h` unless it is missing or a tombstone; notes a read
    /// of a record that is not durable yet.
    fn live_entry(&mut self, h: (u64, u64)) -> Option<u64> {
        let e = *self.index.get(&h)?;
        if e & ADDR >= self.durable_end {
            self.undurable = true;
        }
        (e & TOMB == 0).then_some(e)
    }

    /// The newest live, unexpired record of `key` (loaded into `scratch`).
    fn find(&mut self, key: &[u8]) -> StoreResult<Option<Found>> {
        let h = record::key_hash(key);
        let Some(e) = self.live_entry(h) else {
            return Ok(None);
        };
        let hdr = self.load(e & ADDR)?;
        if &self.scratch[hdr.key_range()] != key {
            tracing::error!("128-bit key hash collision; treating the key as missing");
            return Ok(None);
        }
        if hdr.expire_ms != 0 && hdr.expire_ms < now_ms() {
            // Expired once the clock has passed the expiry, as in Redis (`now > when`).
            // Expired: the key is gone (as Redis deletes it when read). Its records are
            // garbage for compaction, which moves only what the index points at; a restart
            // finds the expired record again and reads it as expired.
            self.expire_key(h);
            return Ok(None);
        }
        Ok(Some(Found { hdr }))
    }

    /// [`Store::find`] for a command that reads a string's value: a collection is WRONGTYPE.
    fn find_value(&mut self, key: &[u8]) -> StoreResult<Option<Found>> {
        match self.find(key)? {
            Some(f) if f.hdr.kind != KIND_VALUE => Err(StoreError::WrongType),
            found => Ok(found),
        }
    }

    /// The log address of the key's newest record when that record is on storage only (a
    /// command that reads the key must fetch it first); `None` when it is in memory or the key
    /// is missing.
    pub fn storage_addr(&self, key: &[u8]) -> Option<u64> {
        let e = *self.index.get(&record::key_hash(key))?;
        let a = e & ADDR;
        (e & TOMB == 0 && a < self.head && a >= self.begin).then_some(a)
    }

    /// The log file's offset of address `a`, and the bytes from there to its page's end (a
    /// record never crosses a page).
    pub fn file_span(&self, a: u64) -> (u64, usize) {
        (a % self.cap, (self.ps - a % self.ps) as usize)
    }

    /// The records read ahead for the next command; reads of their addresses take them
    /// instead of waiting for storage.
    pub fn fetched(&mut self) -> &mut Vec<Fetched> {
        &mut self.fetched
    }

    /// The expiry of `key` (Unix ms; `Some(0)`: none), or `None` when the key is missing.
    pub fn expiry(&mut self, key: &[u8]) -> StoreResult<Option<u64>> {
        Ok(self.find(key)?.map(|f| f.hdr.expire_ms))
    }

    /// Sets the expiry of `key` (Unix ms; 0 removes it), keeping its value; false when the key
    /// is missing. A new expiry is a new version of the key's record.
    pub fn set_expiry(&mut self, key: &[u8], expire_ms: u64) -> StoreResult<bool> {
        let Some(f) = self.find(key)? else {
            return Ok(false);
        };
        if f.hdr.expire_ms == expire_ms {
            return Ok(true);
        }
        // The value is in `scratch`; it is taken out while the record is rewritten (the
        // rewrite may compact, which does not use `scratch`) and put back after.
        let scratch = std::mem::take(&mut self.scratch);
        let r = self.upsert_kind(f.hdr.kind, key, &scratch[f.hdr.value_range()], expire_ms);
        self.scratch = scratch;
        r.map(|()| true)
    }

    /// GET: calls `f` with the value (or `None`).
    pub fn get_with<R>(
        &mut self,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> R,
    ) -> StoreResult<R> {
        match self.find_value(key)? {
            None => Ok(f(None)),
            Some(found) => Ok(f(Some(&self.scratch[found.hdr.value_range()]))),
        }
    }

    /// Whether `key` exists.
    pub fn exists(&mut self, key: &[u8]) -> StoreResult<bool> {
        Ok(self.find(key)?.is_some())
    }

    /// Live keys (expired keys not yet removed included, as Redis's DBSIZE).
    pub fn len(&self) -> u64 {
        self.live
    }

    /// Live keys with an expiry.
    pub fn expiring(&self) -> u64 {
        self.expiring
    }

    /// No live keys.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// Log addresses (begin, head, read_only, flushed, tail).
    pub fn addresses(&self) -> [u64; 5] {
        [
            self.begin,
            self.head,
            self.read_only,
            self.flushed,
            self.tail,
        ]
    }

    /// The settings.
    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    fn check_sizes(&self, key: &[u8], vlen: usize) -> StoreResult<()> {
        if key.len() > self.cfg.max_key {
            return Err(StoreError::KeyTooLarge(self.cfg.max_key));
        }
        if vlen > self.cfg.max_value {
            return Err(StoreError::ValueTooLarge(self.cfg.max_value));
        }
        Ok(())
    }

    /// SET: stores `value` under `key` when `cond` holds; returns whether it stored. With
    /// `old`, the previous value is passed to it first (SET ... GET, GETSET).
    pub fn set(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: SetCond,
        expiry: Expiry,
        old: Option<OldValue<'_>>,
    ) -> StoreResult<bool> {
        self.check_sizes(key, value.len())?;
        // Only GET reads the old value (a collection there is WRONGTYPE); NX, XX and KEEPTTL
        // look at any key, a collection too, as Redis does.
        let found = if old.is_some() {
            self.find_value(key)?
        } else if cond != SetCond::Always || expiry == Expiry::Keep {
            self.find(key)?
        } else {
            None
        };
        if let Some(f) = old {
            f(found.as_ref().map(|x| &self.scratch[x.hdr.value_range()]));
        }
        match (cond, &found) {
            (SetCond::IfMissing, Some(_)) | (SetCond::IfExists, None) => return Ok(false),
            _ => {}
        }
        let expire = match expiry {
            Expiry::None => 0,
            Expiry::At(t) => t,
            Expiry::Keep => found.as_ref().map_or(0, |f| f.hdr.expire_ms),
        };
        self.upsert(key, value, expire)?;
        Ok(true)
    }

    /// Writes `value` as the key's newest version: in place when its record is in the
    /// mutable region and the size fits, else a new record at the tail.
    fn upsert(&mut self, key: &[u8], value: &[u8], expire_ms: u64) -> StoreResult<()> {
        self.upsert_kind(KIND_VALUE, key, value, expire_ms)
    }

    /// [`Store::upsert`] of a record of `kind` (a string's value or a collection's metadata);
    /// in place only over a record of the same kind.
    fn upsert_kind(
        &mut self,
        kind: u8,
        key: &[u8],
        value: &[u8],
        expire_ms: u64,
    ) -> StoreResult<()> {
        let h = record::key_hash(key);
        if let Some(&e) = self.index.get(&h) {
            let a = e & ADDR;
            if e & TOMB == 0 && a >= self.read_only && a >= self.head {
                let (f, o) = self.in_frame(a);
                let old = record::decode_header(&self.frames[f][o..]).expect("record in memory");
                if old.len() == record::record_len(key.len(), value.len())
                    && old.kind == kind
                    && &self.frames[f][o + HEADER..o + HEADER + key.len()] == key
                {
                    // The record keeps its sequence number: sequence numbers grow along the
                    // log, which is how recovery finds its end.
                    let seq = old.seq;
                    let len = old.len();
                    record::encode(
                        &mut self.frames[f][o..o + len],
                        kind,
                        key,
                        value,
                        seq,
                        expire_ms,
                    );
                    let ne = value_entry(a, expire_ms);
                    if ne != e || expire_ms != 0 {
                        self.index_put(h, ne, expire_ms);
                    }
                    if ne != e {
                        if expire_ms != 0 {
                            self.expiring += 1;
                        } else {
                            self.expiring -= 1;
                        }
                    }
                    self.stats.in_place_updates += 1;
                    self.dirty = true;
                    self.undurable = true;
                    return Ok(());
                }
            }
        }
        self.append(h, kind, key, value, expire_ms)
    }

    /// Appends a record and points the index at it.
    fn append(
        &mut self,
        h: (u64, u64),
        kind: u8,
        key: &[u8],
        value: &[u8],
        expire_ms: u64,
    ) -> StoreResult<()> {
        let len = record::record_len(key.len(), value.len()) as u64;
        let a = self.allocate(len)?;
        self.seq += 1;
        let (f, o) = self.in_frame(a);
        record::encode(
            &mut self.frames[f][o..o + len as usize],
            kind,
            key,
            value,
            self.seq,
            expire_ms,
        );
        self.stats.appends += 1;
        self.dirty = true;
        self.undurable = true;
        match crate::collection::decode_meta(value).filter(|_| kind == KIND_META) {
            Some(meta) => self.colls.meta(h, meta),
            None => {
                self.colls.remove(h);
            }
        }
        let old = self.index.get(&h).copied();
        if let Some(e) = old {
            if (e & ADDR) < self.marked && self.cfg.offload {
                // The DPU may hold the old record in its cache: drop it before the reply.
                self.invalidate.push(h.0);
            }
        }
        self.replay(
            h,
            a,
            &Header {
                kind,
                flags: 0,
                klen: key.len() as u16,
                vlen: value.len() as u32,
                crc: 0,
                seq: self.seq,
                expire_ms,
            },
        );
        Ok(())
    }

    /// Keys whose cached locations the DPU must drop before this round's replies go out.
    pub fn take_invalidations(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.invalidate)
    }

    /// Applies [`take_invalidations`](Self::take_invalidations) through the storage (the DPU).
    pub fn invalidate_now(&mut self) -> StoreResult<()> {
        if self.invalidate.is_empty() {
            return Ok(());
        }
        let mut keys = std::mem::take(&mut self.invalidate);
        let r = self.storage.invalidate(&keys);
        self.stats.invalidations += keys.len() as u64;
        // The list's memory stays for the next round's invalidations.
        keys.clear();
        self.invalidate = keys;
        r.map_err(Into::into)
    }

    /// Whether a commit has something to write.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// DEL: removes the key; returns whether it existed.
    pub fn del(&mut self, key: &[u8]) -> StoreResult<bool> {
        if key.len() > self.cfg.max_key {
            return Ok(false);
        }
        if self.find(key)?.is_none() {
            return Ok(false);
        }
        let h = record::key_hash(key);
        self.append(h, KIND_TOMBSTONE, key, &[], 0)?;
        Ok(true)
    }

    /// GETDEL-style read then delete: `f` gets the old value.
    pub fn take_with(&mut self, key: &[u8], f: &mut dyn FnMut(Option<&[u8]>)) -> StoreResult<bool> {
        match self.find_value(key)? {
            None => {
                f(None);
                Ok(false)
            }
            Some(found) => {
                f(Some(&self.scratch[found.hdr.value_range()]));
                let h = record::key_hash(key);
                self.append(h, KIND_TOMBSTONE, key, &[], 0)?;
                Ok(true)
            }
        }
    }

    /// INCRBY: read-modify-write of a base-10 i64 (a missing key is 0); keeps the expiry.
    pub fn incr_by(&mut self, key: &[u8], by: i64) -> StoreResult<i64> {
        self.check_sizes(key, 20)?;
        let (cur, expire) = match self.find_value(key)? {
            None => (0i64, 0u64),
            Some(f) => {
                let v = &self.scratch[f.hdr.value_range()];
                let mut canon = [0u8; 20];
                let n = std::str::from_utf8(v)
                    .ok()
                    .filter(|s| !s.is_empty() && s.len() <= 20 && !s.starts_with('+'))
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|&n| decimal(n, &mut canon) == v)
                    .ok_or(StoreError::NotInteger)?;
                (n, f.hdr.expire_ms)
            }
        };
        let new = cur.checked_add(by).ok_or(StoreError::Overflow)?;
        let mut digits = [0u8; 20];
        let text = decimal(new, &mut digits);
        let text_len = text.len();
        self.upsert(key, &digits[20 - text_len..], expire)?;
        Ok(new)
    }

    /// Read-modify-write of the key's value: `f` gets the value (`None`: missing) and an
    /// empty buffer; when it answers [`Modify::Write`], the buffer becomes the key's value,
    /// keeping its expiry. The buffer is the store's own (reused: no allocation once grown).
    pub fn modify(&mut self, key: &[u8], f: Modifier<'_>) -> StoreResult<()> {
        let found = self.find_value(key)?;
        let mut buf = std::mem::take(&mut self.wbuf);
        buf.clear();
        let cur = found.as_ref().map(|x| &self.scratch[x.hdr.value_range()]);
        let expire = found.as_ref().map_or(0, |x| x.hdr.expire_ms);
        let r = match f(cur, &mut buf) {
            Modify::Keep => Ok(()),
            Modify::Write => self
                .check_sizes(key, buf.len())
                .and_then(|()| self.upsert(key, &buf, expire)),
        };
        self.wbuf = buf;
        r
    }

    /// APPEND: returns the new length; keeps the expiry.
    pub fn append_value(&mut self, key: &[u8], data: &[u8]) -> StoreResult<usize> {
        let (mut v, expire) = match self.find_value(key)? {
            None => (Vec::new(), 0),
            Some(f) => (self.scratch[f.hdr.value_range()].to_vec(), f.hdr.expire_ms),
        };
        self.check_sizes(key, v.len() + data.len())?;
        v.extend_from_slice(data);
        self.upsert(key, &v, expire)?;
        Ok(v.len())
    }

    /// Value length (0 when missing).
    pub fn strlen(&mut self, key: &[u8]) -> StoreResult<usize> {
        Ok(self.find_value(key)?.map_or(0, |f| f.hdr.vlen as usize))
    }

    /// FLUSHDB: drops every key. The DPU's cache forgets every key it may hold; a checkpoint
    /// makes the empty store durable.
    pub fn flush_all(&mut self) -> StoreResult<()> {
        if self.cfg.offload {
            let keys: Vec<u64> = self
                .index
                .iter()
                .filter(|(_, &e)| e & ADDR < self.marked)
                .map(|(k, _)| k.0)
                .collect();
            self.invalidate.extend(keys);
            self.invalidate_now()?;
        }
        // What is in flight lands first (the log's addresses start over past it).
        self.drain_io()?;
        self.index.clear();
        self.colls = Default::default();
        self.order.clear();
        self.expires.clear();
        self.expire_sum = 0;
        self.live = 0;
        self.expiring = 0;
        self.begin = self.tail_page_end;
        self.head = self.begin;
        self.read_only = self.begin;
        self.flushed = self.begin;
        self.marked = self.begin;
        self.flush_want = self.begin;
        self.written = self.begin;
        self.durable_end = self.begin;
        self.compacted.clear();
        self.tail = self.begin;
        if self.ckpt.is_some() {
            self.write_checkpoint()?;
        }
        self.dirty = false;
        Ok(())
    }

    /// Closes the store cleanly: commits (unless durability is `None`) and waits for every
    /// storage operation in flight.
    pub fn close(mut self) -> Result<()> {
        if self.cfg.durability != Durability::None {
            self.commit().map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        self.drain_io().map_err(|e| anyhow::anyhow!("{e}"))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if self.compact_read.in_flight() {
            // The storage library may still write into it.
            std::mem::forget(std::mem::take(&mut self.compact_buf));
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("addresses", &self.addresses())
            .field("keys", &self.live)
            .finish()
    }
}

mod colls;
mod keys;
mod lists;
mod zsets;
pub use keys::SCAN_STORAGE_MAX;
mod space;
#[cfg(test)]
mod tests;
