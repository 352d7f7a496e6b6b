//! [`ObjStore`]: opening and formatting, validation and staging in the caller's thread, the
//! committer thread (group commit), and reads.

use crate::alloc::Allocator;
use crate::device::{Device, IoOp, Superblock};
use crate::error::StoreError;
use crate::meta::{
    obj_key, sub_key, sub_prefix_of_key, Blk, Onode, BITMAP, OBJECTS, OMAP, STATE, XATTRS,
};
use crate::pool::BufPool;
use crate::tx::{ObjectId, Transaction, TxOp, TxOpRef, MAX_NAME_LEN};
use crate::{KvPairs, ObjStat, ObjectStore, StoreStats, BLOCK_SIZE};
use crossbeam_channel::{Receiver, Sender};
use dds_sys::AlignedBuf;
use redb::{Database, ReadableTable, Table};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

const BS: u64 = BLOCK_SIZE as u64;
/// The smallest device: the superblock and 63 data blocks.
const MIN_DEVICE_BLOCKS: u64 = 64;
/// Largest allowed `max_object_size` (staging buffers are allocated whole).
const MAX_OBJECT_SIZE_CAP: u64 = 1 << 30;

/// Limits and tuning of a store. Every limit is checked before a transaction is queued and
/// fails it with [`StoreError::InvalidArgument`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Largest object size in bytes (writes and truncates beyond it fail).
    pub max_object_size: u64,
    /// Largest encoded transaction ([`Transaction::encoded_len`]).
    pub max_tx_bytes: usize,
    /// Most ops in one transaction.
    pub max_ops: usize,
    /// Longest object name (at most [`MAX_NAME_LEN`]); names may not be empty.
    pub max_name_len: usize,
    /// Longest xattr name (non-empty).
    pub max_xattr_name_len: usize,
    /// Longest xattr value.
    pub max_xattr_value_len: usize,
    /// Longest omap key.
    pub max_omap_key_len: usize,
    /// Longest omap value.
    pub max_omap_value_len: usize,
    /// Transactions that may wait for the committer (submitters block beyond it).
    pub queue_depth: usize,
    /// Bytes of idle staging buffers kept for reuse.
    pub staging_pool_bytes: usize,
    /// Most transactions in one group commit.
    pub max_batch_txs: usize,
    /// A group commit takes no more transactions once it holds this many data bytes.
    pub max_batch_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_object_size: 64 << 20,
            max_tx_bytes: 96 << 20,
            max_ops: 4096,
            max_name_len: MAX_NAME_LEN,
            max_xattr_name_len: 256,
            max_xattr_value_len: 64 << 10,
            max_omap_key_len: 4 << 10,
            max_omap_value_len: 64 << 10,
            queue_depth: 64,
            staging_pool_bytes: 64 << 20,
            max_batch_txs: 64,
            max_batch_bytes: 64 << 20,
        }
    }
}

/// Result of [`ObjStore::fsck`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsckReport {
    pub objects: u64,
    /// Blocks referenced by objects.
    pub mapped_blocks: u64,
    /// Data blocks marked allocated in the persisted bitmap.
    pub allocated_blocks: u64,
    /// Blocks whose checksum was verified (deep check only).
    pub verified_blocks: u64,
}

/// Data of one write, staged by the submitter in an aligned buffer laid out by logical block,
/// with the crc32c of each block (edge blocks are completed and re-summed by the committer).
struct Staged {
    buf: AlignedBuf,
    first: u64,
    head: usize,
    len: usize,
    crcs: Vec<u32>,
}

impl Staged {
    /// One pass over `data`: copy a block into a pooled staging buffer, zero what the data
    /// does not cover, then sum the block while it is hot.
    fn new(pool: &BufPool, offset: u64, data: &[u8]) -> Staged {
        let head = (offset % BS) as usize;
        let n = if data.is_empty() {
            0
        } else {
            (head + data.len()).div_ceil(BLOCK_SIZE)
        };
        let mut buf = pool.get(n * BLOCK_SIZE);
        let mut crcs = Vec::with_capacity(n);
        let dst = buf.as_mut_slice();
        let mut src = data;
        for i in 0..n {
            let block = &mut dst[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            let at = if i == 0 { head } else { 0 };
            let take = (BLOCK_SIZE - at).min(src.len());
            block[..at].fill(0);
            block[at..at + take].copy_from_slice(&src[..take]);
            block[at + take..].fill(0);
            src = &src[take..];
            crcs.push(crc32c::crc32c(block));
        }
        Staged {
            buf,
            first: offset / BS,
            head,
            len: data.len(),
            crcs,
        }
    }

    fn nblocks(&self) -> usize {
        self.crcs.len()
    }

    fn block_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]
    }

    fn resum(&mut self, i: usize) {
        self.crcs[i] = crc32c::crc32c(&self.buf.as_slice()[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
    }
}

/// A validated op, its data staged.
enum POp {
    Touch(ObjectId),
    WriteFull(ObjectId, Staged),
    Write(ObjectId, u64, Staged),
    Truncate(ObjectId, u64),
    Remove(ObjectId),
    SetXattr(ObjectId, Vec<u8>, Vec<u8>),
    RmXattr(ObjectId, Vec<u8>),
    OmapSet(ObjectId, Vec<(Vec<u8>, Vec<u8>)>),
    OmapRm(ObjectId, Vec<Vec<u8>>),
    OmapClear(ObjectId),
}

/// Called with a transaction's result once it is durable (or failed).
pub type OnCommit = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// Calls its callback exactly once: with the result, or, if dropped unanswered (the committer
/// stopped), with an error.
struct Completion(Option<OnCommit>);

impl Completion {
    fn complete(mut self, r: Result<(), StoreError>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Err(stopped()))
        }
    }
}

struct Request {
    ops: Vec<POp>,
    bytes: usize,
    done: Completion,
}

/// Reader registrations by commit epoch: blocks freed by the commit of epoch `e` stay
/// quarantined while a reader registered at an epoch `<= e` is active.
#[derive(Default)]
struct Epochs {
    current: u64,
    active: BTreeMap<u64, usize>,
}

struct Inner {
    dev: Device,
    db: Database,
    opts: StoreOptions,
    nblocks: u64,
    epochs: Mutex<Epochs>,
    allocated: AtomicU64,
    objects: AtomicU64,
    failed: AtomicBool,
    pool: BufPool,
}

struct ReadGuard<'a> {
    inner: &'a Inner,
    epoch: u64,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let mut ep = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = ep.active.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                ep.active.remove(&self.epoch);
            }
        }
    }
}

impl Inner {
    fn reader(&self) -> ReadGuard<'_> {
        let mut ep = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = ep.current;
        *ep.active.entry(epoch).or_default() += 1;
        ReadGuard { inner: self, epoch }
    }

    fn onode(
        &self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        oid: &ObjectId,
    ) -> Result<Onode, StoreError> {
        match table.get(obj_key(oid).as_slice())? {
            Some(v) => self.decode_onode(oid, v.value()),
            None => Err(not_found(oid)),
        }
    }

    /// Decodes an onode and checks that it stays on the device and within its object.
    fn decode_onode(&self, oid: &ObjectId, bytes: &[u8]) -> Result<Onode, StoreError> {
        let on = Onode::decode(bytes).ok_or_else(|| bad_meta(oid))?;
        let max_lblock = self.opts.max_object_size.max(on.size).div_ceil(BS);
        let sane = on.size <= MAX_OBJECT_SIZE_CAP
            && on
                .blocks
                .iter()
                .all(|(&lb, b)| lb < max_lblock && b.pblock >= 1 && b.pblock < self.nblocks);
        if !sane {
            return Err(bad_meta(oid));
        }
        Ok(on)
    }

    /// Reads one mapped block from the device and verifies it.
    fn read_verified(&self, oid: &ObjectId, lb: u64, blk: Blk) -> Result<AlignedBuf, StoreError> {
        let buf = self
            .dev
            .read_blocks(blk.pblock, 1)
            .map_err(|e| StoreError::io("device read", e))?;
        verify(oid, lb, blk, buf.as_slice())?;
        Ok(buf)
    }
}

fn not_found(oid: &ObjectId) -> StoreError {
    StoreError::NotFound(format!("object {oid}"))
}

fn bad_meta(oid: &ObjectId) -> StoreError {
    StoreError::Corrupt {
        pool: oid.pool,
        name: String::from_utf8_lossy(&oid.name).into_owned(),
        offset: 0,
        detail: "undecodable metadata".into(),
    }
}

fn verify(oid: &ObjectId, lb: u64, blk: Blk, block: &[u8]) -> Result<(), StoreError> {
    let got = crc32c::crc32c(block);
    if got == blk.crc {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        pool: oid.pool,
        name: String::from_utf8_lossy(&oid.name).into_owned(),
        offset: lb * BS,
        detail: format!(
            "checksum mismatch in device block {} (crc32c {got:#010x}, expected {:#010x})",
            blk.pblock, blk.crc
        ),
    })
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn meta_path(device: &Path) -> PathBuf {
    let mut p = device.as_os_str().to_owned();
    p.push(".meta");
    PathBuf::from(p)
}

fn fsync_dir(path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("fsync {}", dir.display()), e))
}

/// The host object store. Dropping it stops the committer after the queued transactions.
pub struct ObjStore {
    inner: Arc<Inner>,
    queue: Option<Sender<Request>>,
    committer: Option<JoinHandle<()>>,
}

impl ObjStore {
    /// The metadata file of device `path`: `<path>.meta`.
    pub fn meta_path(path: impl AsRef<Path>) -> PathBuf {
        meta_path(path.as_ref())
    }

    /// Creates (or, with `force`, overwrites) a store: the device file `path` of `size` bytes
    /// (rounded down to whole blocks) and its metadata `<path>.meta`. A path holding a
    /// formatted device is refused without `force`.
    pub fn format(path: impl AsRef<Path>, size: u64, force: bool) -> Result<(), StoreError> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let path = path.as_ref();
        let size = size - size % BS;
        let nblocks = size / BS;
        if nblocks < MIN_DEVICE_BLOCKS {
            return Err(StoreError::invalid(format!(
                "a device of {size} bytes is smaller than {} blocks",
                MIN_DEVICE_BLOCKS
            )));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| StoreError::io(format!("open {}", path.display()), e))?;
        let _lock = crate::device::lock(path)?;
        let mut head = vec![0u8; BLOCK_SIZE];
        let got = file
            .read_at(&mut head, 0)
            .map_err(|e| StoreError::io("read superblock", e))?;
        let formatted = got >= 44 && !matches!(Superblock::decode(&head), Ok(None));
        if formatted && !force {
            return Err(StoreError::AlreadyFormatted(path.to_path_buf()));
        }
        let io = |what: &str| {
            let what = format!("{what} {}", path.display());
            move |e| StoreError::io(what, e)
        };
        // Unformat first, so that a crash during format leaves no half-made store.
        file.write_all_at(&[0u8; BLOCK_SIZE], 0)
            .map_err(io("write"))?;
        file.sync_data().map_err(io("fdatasync"))?;
        file.set_len(size).map_err(io("resize"))?;
        // Reserve the space so that writes into the data area cannot hit ENOSPC of the host
        // file system (unsupported on some file systems: then the file stays sparse).
        // SAFETY: plain syscall on a valid descriptor.
        let _ = unsafe {
            libc::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
                0,
                size as libc::off_t,
            )
        };
        let mut uuid = [0u8; 16];
        // SAFETY: writes at most 16 bytes into `uuid`.
        let n = unsafe { libc::getrandom(uuid.as_mut_ptr().cast(), uuid.len(), 0) };
        if n != 16 {
            uuid[..8].copy_from_slice(&now_ns().to_le_bytes());
            uuid[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        }
        let meta = meta_path(path);
        match std::fs::remove_file(&meta) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(format!("remove {}", meta.display()), e)),
        }
        let db = Database::create(&meta)?;
        let w = db.begin_write()?;
        {
            let mut state = w.open_table(STATE)?;
            state.insert("uuid", uuid.as_slice())?;
            state.insert("objects", 0u64.to_le_bytes().as_slice())?;
            let mut bitmap = w.open_table(BITMAP)?;
            for (i, chunk) in Allocator::new(nblocks, 1).take_dirty() {
                bitmap.insert(i, chunk.as_slice())?;
            }
            w.open_table(OBJECTS)?;
            w.open_table(XATTRS)?;
            w.open_table(OMAP)?;
        }
        w.commit()?;
        drop(db);
        Superblock { size, uuid }.encode(&mut head);
        file.write_all_at(&head, 0)
            .map_err(io("write superblock"))?;
        file.sync_all().map_err(io("fsync"))?;
        fsync_dir(path)
    }

    /// Opens a formatted store with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<ObjStore, StoreError> {
        ObjStore::open_with(path, StoreOptions::default())
    }

    /// Opens a formatted store.
    pub fn open_with(path: impl AsRef<Path>, opts: StoreOptions) -> Result<ObjStore, StoreError> {
        let path = path.as_ref();
        if opts.max_object_size == 0 || opts.max_object_size > MAX_OBJECT_SIZE_CAP {
            return Err(StoreError::invalid("max_object_size not in 1 B ..= 1 GiB"));
        }
        if opts.max_name_len > MAX_NAME_LEN
            || opts.queue_depth == 0
            || opts.max_batch_txs == 0
            || opts.max_ops == 0
        {
            return Err(StoreError::invalid("bad store options"));
        }
        let dev = Device::open(path)?;
        let head = dev
            .read_blocks(0, 1)
            .map_err(|e| StoreError::io("read superblock", e))?;
        let corrupt = |detail: String| StoreError::Corrupt {
            pool: 0,
            name: path.display().to_string(),
            offset: 0,
            detail,
        };
        let sb = match Superblock::decode(head.as_slice()) {
            Ok(Some(sb)) => sb,
            Ok(None) => {
                return Err(StoreError::invalid(format!(
                    "{} is not a formatted object store",
                    path.display()
                )))
            }
            Err(e) => return Err(corrupt(e)),
        };
        if sb.size != dev.size() {
            return Err(corrupt(format!(
                "superblock says {} bytes, the file has {}",
                sb.size,
                dev.size()
            )));
        }
        let meta = meta_path(path);
        if !meta.exists() {
            return Err(StoreError::NotFound(format!("metadata {}", meta.display())));
        }
        let db = Database::open(&meta)?;
        let nblocks = sb.size / BS;
        let (alloc, objects) = {
            let r = db.begin_read()?;
            let state = r.open_table(STATE)?;
            let uuid = state.get("uuid")?.map(|v| v.value().to_vec());
            if uuid.as_deref() != Some(sb.uuid.as_slice()) {
                return Err(corrupt(format!(
                    "{} belongs to another device",
                    meta.display()
                )));
            }
            let objects = state
                .get("objects")?
                .and_then(|v| v.value().try_into().ok().map(u64::from_le_bytes))
                .ok_or_else(|| corrupt("no object count".into()))?;
            let bitmap = r.open_table(BITMAP)?;
            let mut chunks = Vec::new();
            for e in bitmap.iter()? {
                let (k, v) = e?;
                chunks.push((k.value(), v.value().to_vec()));
            }
            let alloc = Allocator::load(nblocks, chunks)
                .ok_or_else(|| corrupt("bad allocation bitmap".into()))?;
            (alloc, objects)
        };
        let inner = Arc::new(Inner {
            dev,
            db,
            nblocks,
            epochs: Mutex::new(Epochs::default()),
            allocated: AtomicU64::new(alloc.allocated()),
            objects: AtomicU64::new(objects),
            failed: AtomicBool::new(false),
            pool: BufPool::new(opts.staging_pool_bytes),
            opts,
        });
        let (tx, rx) = crossbeam_channel::bounded(inner.opts.queue_depth);
        let mut committer = Committer {
            inner: inner.clone(),
            alloc,
            quarantine: VecDeque::new(),
            objects,
        };
        let handle = std::thread::Builder::new()
            .name("objstore-commit".into())
            .spawn(move || committer.run(rx))
            .map_err(|e| StoreError::io("spawn committer", e))?;
        Ok(ObjStore {
            inner,
            queue: Some(tx),
            committer: Some(handle),
        })
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.inner.opts
    }

    fn check_name(&self, name: &[u8]) -> Result<(), StoreError> {
        if name.is_empty() || name.len() > self.inner.opts.max_name_len {
            return Err(StoreError::invalid(format!(
                "object name of {} bytes (1 ..= {} allowed)",
                name.len(),
                self.inner.opts.max_name_len
            )));
        }
        Ok(())
    }

    fn validate(&self, ops: &[TxOpRef<'_>], len: usize) -> Result<(), StoreError> {
        let o = &self.inner.opts;
        if ops.len() > o.max_ops {
            return Err(StoreError::invalid(format!(
                "{} ops in a transaction (limit {})",
                ops.len(),
                o.max_ops
            )));
        }
        if len > o.max_tx_bytes {
            return Err(StoreError::invalid(format!(
                "transaction of {len} bytes (limit {})",
                o.max_tx_bytes
            )));
        }
        let limit = |what: &str, v: &[u8], min: usize, max: usize| {
            if v.len() < min || v.len() > max {
                Err(StoreError::invalid(format!(
                    "{what} of {} bytes ({min} ..= {max} allowed)",
                    v.len()
                )))
            } else {
                Ok(())
            }
        };
        let extent = |offset: u64, len: usize| match offset.checked_add(len as u64) {
            Some(end) if end <= o.max_object_size => Ok(()),
            _ => Err(StoreError::invalid(format!(
                "{len} bytes at offset {offset} exceed the object size limit {}",
                o.max_object_size
            ))),
        };
        for op in ops {
            self.check_name(op.oid().name)?;
            match op {
                TxOpRef::Touch { .. } | TxOpRef::Remove { .. } | TxOpRef::OmapClear { .. } => {}
                TxOpRef::WriteFull { data, .. } => extent(0, data.len())?,
                TxOpRef::Write { offset, data, .. } => extent(*offset, data.len())?,
                TxOpRef::Truncate { size, .. } => extent(*size, 0)?,
                TxOpRef::SetXattr { name, value, .. } => {
                    limit("xattr name", name, 1, o.max_xattr_name_len)?;
                    limit("xattr value", value, 0, o.max_xattr_value_len)?;
                }
                TxOpRef::RmXattr { name, .. } => {
                    limit("xattr name", name, 1, o.max_xattr_name_len)?
                }
                TxOpRef::OmapSet { entries, .. } => {
                    for (k, v) in entries {
                        limit("omap key", k, 0, o.max_omap_key_len)?;
                        limit("omap value", v, 0, o.max_omap_value_len)?;
                    }
                }
                TxOpRef::OmapRm { keys, .. } => {
                    for k in keys {
                        limit("omap key", k, 0, o.max_omap_key_len)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks the metadata: every mapped block is allocated and mapped once, and the
    /// persisted bitmap holds no other block. With `deep`, also reads and verifies every
    /// mapped block.
    pub fn fsck(&self, deep: bool) -> Result<FsckReport, StoreError> {
        let inner = &*self.inner;
        let _g = inner.reader();
        let r = inner.db.begin_read()?;
        let objects = r.open_table(OBJECTS)?;
        let bitmap = r.open_table(BITMAP)?;
        let mut chunks = Vec::new();
        for e in bitmap.iter()? {
            let (k, v) = e?;
            chunks.push((k.value(), v.value().to_vec()));
        }
        let fail = |detail: String| StoreError::Corrupt {
            pool: 0,
            name: "fsck".into(),
            offset: 0,
            detail,
        };
        let alloc =
            Allocator::load(inner.nblocks, chunks).ok_or_else(|| fail("bad bitmap".into()))?;
        let mut seen = HashSet::new();
        let mut report = FsckReport {
            objects: 0,
            mapped_blocks: 0,
            allocated_blocks: alloc.allocated() - 1,
            verified_blocks: 0,
        };
        for e in objects.iter()? {
            let (k, v) = e?;
            let key = k.value();
            let oid = ObjectId::new(
                u64::from_be_bytes(key[..8].try_into().expect("8-byte pool")),
                &key[8..],
            );
            let on = inner.decode_onode(&oid, v.value())?;
            report.objects += 1;
            for (&lb, &blk) in &on.blocks {
                if blk.pblock == 0 || !alloc.is_allocated(blk.pblock) {
                    return Err(fail(format!("{oid} maps unallocated block {}", blk.pblock)));
                }
                if !seen.insert(blk.pblock) {
                    return Err(fail(format!("block {} mapped twice ({oid})", blk.pblock)));
                }
                if lb * BS >= on.size {
                    return Err(fail(format!("{oid} maps block {lb} beyond its size")));
                }
                if deep {
                    inner.read_verified(&oid, lb, blk)?;
                    report.verified_blocks += 1;
                }
            }
        }
        report.mapped_blocks = seen.len() as u64;
        if report.mapped_blocks != report.allocated_blocks {
            return Err(fail(format!(
                "{} blocks allocated, {} mapped",
                report.allocated_blocks, report.mapped_blocks
            )));
        }
        Ok(report)
    }
}

impl Drop for ObjStore {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(h) = self.committer.take() {
            let _ = h.join();
        }
    }
}

fn prepare(pool: &BufPool, op: &TxOpRef<'_>) -> POp {
    let oid = op.oid().to_owned();
    match op {
        TxOpRef::Touch { .. } => POp::Touch(oid),
        TxOpRef::WriteFull { data, .. } => POp::WriteFull(oid, Staged::new(pool, 0, data)),
        TxOpRef::Write { offset, data, .. } => {
            POp::Write(oid, *offset, Staged::new(pool, *offset, data))
        }
        TxOpRef::Truncate { size, .. } => POp::Truncate(oid, *size),
        TxOpRef::Remove { .. } => POp::Remove(oid),
        TxOpRef::SetXattr { name, value, .. } => POp::SetXattr(oid, name.to_vec(), value.to_vec()),
        TxOpRef::RmXattr { name, .. } => POp::RmXattr(oid, name.to_vec()),
        TxOpRef::OmapSet { entries, .. } => POp::OmapSet(
            oid,
            entries
                .iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        ),
        TxOpRef::OmapRm { keys, .. } => POp::OmapRm(oid, keys.iter().map(|k| k.to_vec()).collect()),
        TxOpRef::OmapClear { .. } => POp::OmapClear(oid),
    }
}

impl ObjStore {
    /// Applies an encoded transaction (the format of [`Transaction::encode`]) as
    /// [`submit`](ObjectStore::submit) does, taking its data straight from `buf` into the
    /// staging buffers (no decoded copy). A malformed encoding is `InvalidArgument`.
    pub fn submit_encoded(&self, buf: &[u8]) -> Result<(), StoreError> {
        let ops = self.decode_checked(buf)?;
        self.submit_ops(&ops, buf.len())
    }

    /// Queues a transaction and returns without waiting for it: `on_commit` gets its result
    /// once it is durable (or has failed), exactly once, on the committer thread, in submission
    /// order — so it must be quick (send a message, wake a thread). A transaction that breaks a
    /// limit is refused here with `InvalidArgument` and `on_commit` is not called. Blocks only
    /// while the queue (`queue_depth`) is full.
    pub fn submit_with(
        &self,
        tx: &Transaction,
        on_commit: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let ops: Vec<TxOpRef<'_>> = tx.ops.iter().map(TxOp::view).collect();
        self.enqueue(&ops, tx.encoded_len(), Box::new(on_commit))
    }

    /// [`submit_encoded`](Self::submit_encoded) without waiting, as
    /// [`submit_with`](Self::submit_with).
    pub fn submit_encoded_with(
        &self,
        buf: &[u8],
        on_commit: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let ops = self.decode_checked(buf)?;
        self.enqueue(&ops, buf.len(), Box::new(on_commit))
    }

    fn decode_checked<'a>(&self, buf: &'a [u8]) -> Result<Vec<TxOpRef<'a>>, StoreError> {
        if buf.len() > self.inner.opts.max_tx_bytes {
            return Err(StoreError::invalid(format!(
                "transaction of {} bytes (limit {})",
                buf.len(),
                self.inner.opts.max_tx_bytes
            )));
        }
        Transaction::decode_ops(buf)
            .map_err(|e| StoreError::invalid(format!("transaction encoding: {e}")))
    }

    /// Validates, stages and queues; the result goes to `done` unless this returns `Err`.
    fn enqueue(
        &self,
        ops: &[TxOpRef<'_>],
        encoded_len: usize,
        done: OnCommit,
    ) -> Result<(), StoreError> {
        if self.inner.failed.load(Ordering::Acquire) {
            return Err(failed());
        }
        self.validate(ops, encoded_len)?;
        let ops: Vec<POp> = ops.iter().map(|op| prepare(&self.inner.pool, op)).collect();
        let bytes = ops
            .iter()
            .map(|op| match op {
                POp::WriteFull(_, s) | POp::Write(_, _, s) => s.buf.len(),
                _ => 0,
            })
            .sum();
        let queue = self
            .queue
            .as_ref()
            .expect("the queue lives as long as the store");
        // If the committer is gone, the returned request drops and its completion reports it.
        let _ = queue.send(Request {
            ops,
            bytes,
            done: Completion(Some(done)),
        });
        Ok(())
    }

    /// Queues and waits.
    fn submit_ops(&self, ops: &[TxOpRef<'_>], encoded_len: usize) -> Result<(), StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.enqueue(
            ops,
            encoded_len,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.recv().unwrap_or_else(|_| Err(stopped()))
    }
}

impl ObjectStore for ObjStore {
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError> {
        let ops: Vec<TxOpRef<'_>> = tx.ops.iter().map(TxOp::view).collect();
        self.submit_ops(&ops, tx.encoded_len())
    }

    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.check_name(&oid.name)?;
        let inner = &*self.inner;
        let _g = inner.reader();
        let r = inner.db.begin_read()?;
        let on = inner.onode(&r.open_table(OBJECTS)?, oid)?;
        drop(r);
        if offset >= on.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = on.size.min(offset.saturating_add(len));
        let first = offset / BS;
        let last = (end - 1) / BS;
        let n = (last - first + 1) as usize;
        let mut buf = inner.pool.get(n * BLOCK_SIZE);
        // Holes read as zeros.
        let mut next = first;
        for lb in on
            .blocks
            .range(first..=last)
            .map(|(&l, _)| l)
            .chain([last + 1])
        {
            buf.as_mut_slice()
                [((next - first) as usize) * BLOCK_SIZE..((lb - first) as usize) * BLOCK_SIZE]
                .fill(0);
            next = lb + 1;
        }
        let mut ops: Vec<IoOp> = Vec::new();
        let mut prev: Option<(u64, u64)> = None;
        for (&lb, blk) in on.blocks.range(first..=last) {
            let i = (lb - first) as usize;
            match (prev, ops.last_mut()) {
                (Some((pl, pp)), Some(op)) if pl + 1 == lb && pp + 1 == blk.pblock => {
                    op.len += BLOCK_SIZE
                }
                _ => ops.push(IoOp {
                    write: false,
                    // SAFETY: `i < n`, inside `buf`.
                    ptr: unsafe { buf.as_mut_ptr().add(i * BLOCK_SIZE) },
                    len: BLOCK_SIZE,
                    offset: blk.pblock * BS,
                }),
            }
            prev = Some((lb, blk.pblock));
        }
        // SAFETY: the ops cover disjoint block ranges of `buf`, which outlives the call and is
        // not otherwise accessed during it.
        unsafe { inner.dev.run(&ops) }.map_err(|e| StoreError::io("device read", e))?;
        let data = buf.as_slice();
        for (&lb, &blk) in on.blocks.range(first..=last) {
            let i = (lb - first) as usize;
            verify(oid, lb, blk, &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE])?;
        }
        let start = (offset - first * BS) as usize;
        let out = data[start..start + (end - offset) as usize].to_vec();
        inner.pool.put(buf);
        Ok(out)
    }

    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        let on = self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        Ok(ObjStat {
            size: on.size,
            mtime_ns: on.mtime_ns,
        })
    }

    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        match r
            .open_table(XATTRS)?
            .get(sub_key(&prefix, name).as_slice())?
        {
            Some(v) => Ok(v.value().to_vec()),
            None => Err(StoreError::NotFound(format!(
                "xattr {} of {oid}",
                String::from_utf8_lossy(name)
            ))),
        }
    }

    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError> {
        self.omap_like(XATTRS, oid, None, usize::MAX)
    }

    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        let omap = r.open_table(OMAP)?;
        keys.iter()
            .map(|k| {
                Ok(omap
                    .get(sub_key(&prefix, k).as_slice())?
                    .map(|v| v.value().to_vec()))
            })
            .collect()
    }

    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        self.omap_like(OMAP, oid, start_after, max)
    }

    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let r = self.inner.db.begin_read()?;
        let objects = r.open_table(OBJECTS)?;
        let from = sub_key(&pool.to_be_bytes(), start_after.unwrap_or_default());
        let lower = match start_after {
            Some(_) => Bound::Excluded(from.as_slice()),
            None => Bound::Included(from.as_slice()),
        };
        let mut out = Vec::new();
        for e in objects.range::<&[u8]>((lower, Bound::Unbounded))? {
            if out.len() >= max {
                break;
            }
            let (k, _) = e?;
            let k = k.value();
            if k[..8] != pool.to_be_bytes() {
                break;
            }
            out.push(k[8..].to_vec());
        }
        Ok(out)
    }

    fn statfs(&self) -> Result<StoreStats, StoreError> {
        let inner = &*self.inner;
        Ok(StoreStats {
            device_bytes: inner.nblocks * BS,
            block_size: BS,
            data_bytes: (inner.nblocks - 1) * BS,
            allocated_bytes: (inner.allocated.load(Ordering::Acquire) - 1) * BS,
            objects: inner.objects.load(Ordering::Acquire),
        })
    }
}

impl ObjStore {
    /// Rows of `table` under the object's prefix after `start_after` (the object must exist).
    fn omap_like(
        &self,
        table: redb::TableDefinition<&'static [u8], &'static [u8]>,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        let from = sub_key(&prefix, start_after.unwrap_or_default());
        let lower = match start_after {
            Some(_) => Bound::Excluded(from.as_slice()),
            None => Bound::Included(from.as_slice()),
        };
        let t = r.open_table(table)?;
        let mut out = Vec::new();
        for e in t.range::<&[u8]>((lower, Bound::Unbounded))? {
            if out.len() >= max {
                break;
            }
            let (k, v) = e?;
            let Some(sub) = k.value().strip_prefix(prefix.as_slice()) else {
                break;
            };
            out.push((sub.to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }
}

fn failed() -> StoreError {
    StoreError::io(
        "the store failed a metadata commit; reopen it",
        std::io::Error::other("store failed"),
    )
}

fn stopped() -> StoreError {
    StoreError::io(
        "the committer has stopped",
        std::io::Error::other("committer stopped"),
    )
}

// ---------------------------------------------------------------------------------------------
// The committer.

/// An object's state while a batch is built: the onode (`None` = absent) and the changes to
/// its xattrs and omap rows (`None` = remove), after clearing the stored rows if `*_cleared`.
#[derive(Clone, Default)]
struct ObjState {
    existed: bool,
    onode: Option<Onode>,
    xattrs_cleared: bool,
    xattrs: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    omap_cleared: bool,
    omap: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// A device write: blocks of a staging buffer to consecutive device blocks.
struct Wr {
    buf: usize,
    off: usize,
    pblock: u64,
    n: u64,
}

/// What a transaction (or, merged, a batch) changes.
#[derive(Default)]
struct Changes {
    objs: HashMap<Vec<u8>, ObjState>,
    writes: Vec<Wr>,
    /// Blocks allocated by this batch whose data sits in a staging buffer: (buffer, offset).
    inflight: HashMap<u64, (usize, usize)>,
    allocs: Vec<(u64, u64)>,
    frees: Vec<u64>,
}

impl Changes {
    fn merge(&mut self, t: Changes) {
        self.objs.extend(t.objs);
        self.writes.extend(t.writes);
        self.inflight.extend(t.inflight);
        self.allocs.extend(t.allocs);
        self.frees.extend(t.frees);
    }
}

struct Tables<'t> {
    objects: Table<'t, &'static [u8], &'static [u8]>,
    xattrs: Table<'t, &'static [u8], &'static [u8]>,
    omap: Table<'t, &'static [u8], &'static [u8]>,
}

struct Committer {
    inner: Arc<Inner>,
    alloc: Allocator,
    /// Blocks freed by the commit of an epoch, waiting for older readers.
    quarantine: VecDeque<(u64, Vec<u64>)>,
    objects: u64,
}

/// One transaction being applied on top of a batch.
struct TxApply<'a, 't> {
    inner: &'a Inner,
    alloc: &'a mut Allocator,
    tables: &'a Tables<'t>,
    batch: &'a Changes,
    bufs: &'a mut Vec<AlignedBuf>,
    t: Changes,
    now: u64,
}

impl TxApply<'_, '_> {
    /// The object's state, taken out of the transaction's changes (put it back with `put`).
    fn take(&mut self, oid: &ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        let key = obj_key(oid);
        if let Some(s) = self.t.objs.remove(&key) {
            return Ok((key, s));
        }
        if let Some(s) = self.batch.objs.get(&key) {
            return Ok((key, s.clone()));
        }
        let onode = match self.tables.objects.get(key.as_slice())? {
            Some(v) => Some(self.inner.decode_onode(oid, v.value())?),
            None => None,
        };
        let s = ObjState {
            existed: onode.is_some(),
            onode,
            ..ObjState::default()
        };
        Ok((key, s))
    }

    /// The content of a mapped block: from a staging buffer of this batch, or from the device
    /// (verified).
    fn old_block(&self, oid: &ObjectId, lb: u64, blk: Blk) -> Result<AlignedBuf, StoreError> {
        let staged = self
            .t
            .inflight
            .get(&blk.pblock)
            .or_else(|| self.batch.inflight.get(&blk.pblock));
        if let Some(&(bi, off)) = staged {
            let mut b = AlignedBuf::new(BLOCK_SIZE, BLOCK_SIZE);
            b.as_mut_slice()
                .copy_from_slice(&self.bufs[bi].as_slice()[off..off + BLOCK_SIZE]);
            return Ok(b);
        }
        self.inner.read_verified(oid, lb, blk)
    }

    /// Maps `crcs.len()` logical blocks from `first` to new device blocks holding `buf`.
    fn place(
        &mut self,
        on: &mut Onode,
        first: u64,
        buf: AlignedBuf,
        crcs: &[u32],
    ) -> Result<(), StoreError> {
        let n = crcs.len() as u64;
        let extents = self
            .alloc
            .allocate(n)
            .map_err(|free| StoreError::NoSpace { needed: n, free })?;
        self.t.allocs.extend_from_slice(&extents);
        let bi = self.bufs.len();
        let mut i = 0usize;
        for (start, cnt) in extents {
            self.t.writes.push(Wr {
                buf: bi,
                off: i * BLOCK_SIZE,
                pblock: start,
                n: cnt,
            });
            for pb in start..start + cnt {
                self.t.inflight.insert(pb, (bi, i * BLOCK_SIZE));
                let new = Blk {
                    pblock: pb,
                    crc: crcs[i],
                };
                if let Some(old) = on.blocks.insert(first + i as u64, new) {
                    self.t.frees.push(old.pblock);
                }
                i += 1;
            }
        }
        self.bufs.push(buf);
        Ok(())
    }

    fn write(
        &mut self,
        oid: &ObjectId,
        on: &mut Onode,
        offset: u64,
        mut st: Staged,
    ) -> Result<(), StoreError> {
        let n = st.nblocks();
        if n == 0 {
            return Ok(());
        }
        let end = offset + st.len as u64;
        let (first, last) = (st.first, st.first + n as u64 - 1);
        // Edge blocks keep the old bytes the write does not cover (bytes past the old size
        // are zero in both).
        if st.head != 0 {
            if let Some(&blk) = on.blocks.get(&first) {
                let old = self.old_block(oid, first, blk)?;
                let head = st.head;
                st.block_mut(0)[..head].copy_from_slice(&old.as_slice()[..head]);
                st.resum(0);
            }
        }
        let tail = (end - last * BS) as usize;
        if tail < BLOCK_SIZE && on.size > end {
            if let Some(&blk) = on.blocks.get(&last) {
                let old = self.old_block(oid, last, blk)?;
                st.block_mut(n - 1)[tail..].copy_from_slice(&old.as_slice()[tail..]);
                st.resum(n - 1);
            }
        }
        let Staged { buf, crcs, .. } = st;
        self.place(on, first, buf, &crcs)?;
        on.size = on.size.max(end);
        Ok(())
    }

    fn truncate(&mut self, oid: &ObjectId, on: &mut Onode, size: u64) -> Result<(), StoreError> {
        if size < on.size {
            let keep = size.div_ceil(BS);
            let dropped: Vec<u64> = on.blocks.range(keep..).map(|(&l, _)| l).collect();
            for lb in dropped {
                let blk = on.blocks.remove(&lb).expect("listed above");
                self.t.frees.push(blk.pblock);
            }
            let within = (size % BS) as usize;
            let lb = size / BS;
            if within != 0 {
                if let Some(&blk) = on.blocks.get(&lb) {
                    let mut b = self.old_block(oid, lb, blk)?;
                    b.as_mut_slice()[within..].fill(0);
                    let crc = crc32c::crc32c(b.as_slice());
                    self.place(on, lb, b, &[crc])?;
                }
            }
        }
        on.size = size;
        Ok(())
    }

    fn xattr_exists(&self, key: &[u8], s: &ObjState, name: &[u8]) -> Result<bool, StoreError> {
        if let Some(v) = s.xattrs.get(name) {
            return Ok(v.is_some());
        }
        if s.xattrs_cleared {
            return Ok(false);
        }
        let k = sub_key(&sub_prefix_of_key(key), name);
        Ok(self.tables.xattrs.get(k.as_slice())?.is_some())
    }

    fn apply(&mut self, op: POp) -> Result<(), StoreError> {
        let oid = match &op {
            POp::Touch(o)
            | POp::WriteFull(o, _)
            | POp::Write(o, _, _)
            | POp::Truncate(o, _)
            | POp::Remove(o)
            | POp::SetXattr(o, _, _)
            | POp::RmXattr(o, _)
            | POp::OmapSet(o, _)
            | POp::OmapRm(o, _)
            | POp::OmapClear(o) => o.clone(),
        };
        let (key, mut s) = self.take(&oid)?;
        let creates = matches!(
            op,
            POp::Touch(_)
                | POp::WriteFull(..)
                | POp::Write(..)
                | POp::SetXattr(..)
                | POp::OmapSet(..)
        );
        let mut on = match s.onode.take() {
            Some(on) => on,
            None if creates => Onode::default(),
            None => return Err(not_found(&oid)),
        };
        on.mtime_ns = self.now;
        let mut keep = true;
        match op {
            POp::Touch(_) => {}
            POp::WriteFull(_, st) => {
                self.t.frees.extend(on.blocks.values().map(|b| b.pblock));
                on.blocks.clear();
                on.size = 0;
                let len = st.len as u64;
                self.write(&oid, &mut on, 0, st)?;
                on.size = len;
            }
            POp::Write(_, offset, st) => self.write(&oid, &mut on, offset, st)?,
            POp::Truncate(_, size) => self.truncate(&oid, &mut on, size)?,
            POp::Remove(_) => {
                self.t.frees.extend(on.blocks.values().map(|b| b.pblock));
                keep = false;
                s.xattrs_cleared = true;
                s.xattrs.clear();
                s.omap_cleared = true;
                s.omap.clear();
            }
            POp::SetXattr(_, name, value) => {
                s.xattrs.insert(name, Some(value));
            }
            POp::RmXattr(_, name) => {
                if !self.xattr_exists(&key, &s, &name)? {
                    return Err(StoreError::NotFound(format!(
                        "xattr {} of {oid}",
                        String::from_utf8_lossy(&name)
                    )));
                }
                s.xattrs.insert(name, None);
            }
            POp::OmapSet(_, entries) => {
                for (k, v) in entries {
                    s.omap.insert(k, Some(v));
                }
            }
            POp::OmapRm(_, keys) => {
                for k in keys {
                    s.omap.insert(k, None);
                }
            }
            POp::OmapClear(_) => {
                s.omap_cleared = true;
                s.omap.clear();
            }
        }
        s.onode = keep.then_some(on);
        self.t.objs.insert(key, s);
        Ok(())
    }
}

fn remove_prefix(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<(), StoreError> {
    let mut keys = Vec::new();
    for e in table.range::<&[u8]>(prefix..)? {
        let (k, _) = e?;
        if !k.value().starts_with(prefix) {
            break;
        }
        keys.push(k.value().to_vec());
    }
    for k in keys {
        table.remove(k.as_slice())?;
    }
    Ok(())
}

fn write_rows(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    prefix: &[u8],
    cleared: bool,
    rows: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> Result<(), StoreError> {
    if cleared {
        remove_prefix(table, prefix)?;
    }
    for (k, v) in rows {
        let k = sub_key(prefix, k);
        match v {
            Some(v) => {
                table.insert(k.as_slice(), v.as_slice())?;
            }
            None => {
                table.remove(k.as_slice())?;
            }
        }
    }
    Ok(())
}

impl Committer {
    fn run(&mut self, rx: Receiver<Request>) {
        let o = self.inner.opts.clone();
        while let Ok(first) = rx.recv() {
            let mut bytes = first.bytes;
            let mut batch = vec![first];
            while batch.len() < o.max_batch_txs && bytes < o.max_batch_bytes {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += r.bytes;
                        batch.push(r);
                    }
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
    }

    fn release_quarantine(&mut self) {
        let oldest_reader = {
            let ep = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
            ep.active.keys().next().copied().unwrap_or(u64::MAX)
        };
        while let Some((e, _)) = self.quarantine.front() {
            if *e >= oldest_reader {
                break;
            }
            let (_, blocks) = self.quarantine.pop_front().expect("front exists");
            self.alloc.unquarantine(&blocks);
        }
    }

    fn commit_batch(&mut self, batch: Vec<Request>) {
        self.release_quarantine();
        let mut dones = Vec::with_capacity(batch.len());
        let mut txs = Vec::with_capacity(batch.len());
        for r in batch {
            dones.push(r.done);
            txs.push(r.ops);
        }
        let mut results = Vec::with_capacity(txs.len());
        let outcome = if self.inner.failed.load(Ordering::Acquire) {
            Err(failed())
        } else {
            self.try_batch(txs, &mut results)
        };
        for (i, done) in dones.into_iter().enumerate() {
            let r = match (&outcome, results.get_mut(i)) {
                (_, Some(r @ Err(_))) => std::mem::replace(r, Ok(())),
                (Err(e), _) => Err(e.duplicate()),
                (Ok(()), Some(_)) => Ok(()),
                (Ok(()), None) => Err(stopped()),
            };
            done.complete(r);
        }
    }

    fn try_batch(
        &mut self,
        txs: Vec<Vec<POp>>,
        results: &mut Vec<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let w = inner.db.begin_write()?;
        let mut tables = Tables {
            objects: w.open_table(OBJECTS)?,
            xattrs: w.open_table(XATTRS)?,
            omap: w.open_table(OMAP)?,
        };
        let mut batch = Changes::default();
        let mut bufs = Vec::new();
        for ops in txs {
            let mut a = TxApply {
                inner: &inner,
                alloc: &mut self.alloc,
                tables: &tables,
                batch: &batch,
                bufs: &mut bufs,
                t: Changes::default(),
                now: now_ns(),
            };
            let r = ops.into_iter().try_for_each(|op| a.apply(op));
            let t = std::mem::take(&mut a.t);
            match r {
                Ok(()) => batch.merge(t),
                Err(_) => self.alloc.release_now(&t.allocs),
            }
            results.push(r);
        }
        if batch.objs.is_empty() {
            drop(tables);
            w.abort()?;
            return Ok(());
        }
        if let Err(e) = self.write_data(&batch, &bufs) {
            self.alloc.release_now(&batch.allocs);
            return Err(e);
        }
        for b in bufs {
            inner.pool.put(b);
        }
        // From here on a failure leaves memory and disk apart: the store stops accepting
        // transactions until it is reopened.
        let r = self.write_meta(&w, &mut tables, &batch);
        drop(tables);
        let r = r.and_then(|()| w.commit().map_err(StoreError::from));
        if let Err(e) = r {
            inner.failed.store(true, Ordering::Release);
            return Err(e);
        }
        let epoch = {
            let mut ep = inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
            ep.current += 1;
            ep.current - 1
        };
        self.quarantine.push_back((epoch, batch.frees));
        inner
            .allocated
            .store(self.alloc.allocated(), Ordering::Release);
        inner.objects.store(self.objects, Ordering::Release);
        Ok(())
    }

    /// Writes the batch's data to its new blocks and syncs the device.
    fn write_data(&self, batch: &Changes, bufs: &[AlignedBuf]) -> Result<(), StoreError> {
        if batch.writes.is_empty() {
            return Ok(());
        }
        let ops: Vec<IoOp> = batch
            .writes
            .iter()
            .map(|w| IoOp {
                write: true,
                // SAFETY: `off + n blocks` lies inside the buffer (placed by `place`).
                ptr: unsafe { bufs[w.buf].as_mut_ptr().add(w.off) },
                len: w.n as usize * BLOCK_SIZE,
                offset: w.pblock * BS,
            })
            .collect();
        // SAFETY: the buffers outlive the call; the kernel only reads them.
        unsafe { self.inner.dev.run(&ops) }.map_err(|e| StoreError::io("device write", e))?;
        self.inner
            .dev
            .sync()
            .map_err(|e| StoreError::io("device fdatasync", e))
    }

    fn write_meta(
        &mut self,
        w: &redb::WriteTransaction,
        tables: &mut Tables<'_>,
        batch: &Changes,
    ) -> Result<(), StoreError> {
        let mut objects = self.objects;
        for (key, s) in &batch.objs {
            let prefix = sub_prefix_of_key(key);
            write_rows(&mut tables.xattrs, &prefix, s.xattrs_cleared, &s.xattrs)?;
            write_rows(&mut tables.omap, &prefix, s.omap_cleared, &s.omap)?;
            match &s.onode {
                Some(on) => {
                    tables
                        .objects
                        .insert(key.as_slice(), on.encode().as_slice())?;
                }
                None => {
                    tables.objects.remove(key.as_slice())?;
                }
            }
            match (s.existed, s.onode.is_some()) {
                (false, true) => objects += 1,
                (true, false) => objects -= 1,
                _ => {}
            }
        }
        self.alloc
            .free_committed(&batch.frees)
            .map_err(|b| StoreError::Corrupt {
                pool: 0,
                name: "allocation bitmap".into(),
                offset: b * BS,
                detail: format!("block {b} freed but not allocated (mapped twice?)"),
            })?;
        let mut bitmap = w.open_table(BITMAP)?;
        for (i, chunk) in self.alloc.take_dirty() {
            bitmap.insert(i, chunk.as_slice())?;
        }
        let mut state = w.open_table(STATE)?;
        state.insert("objects", objects.to_le_bytes().as_slice())?;
        self.objects = objects;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks freed while a reader is registered stay unallocated until it is gone, however
    /// many commits come in between.
    #[test]
    fn freed_blocks_wait_for_older_readers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        ObjStore::format(&path, 2 << 20, false).unwrap(); // 511 data blocks
        let s = ObjStore::open(&path).unwrap();
        let o = ObjectId::new(1, "o");
        let write = |v: u8| {
            s.submit(&Transaction {
                ops: vec![TxOp::WriteFull {
                    oid: o.clone(),
                    data: vec![v; 64 * BLOCK_SIZE],
                }],
            })
        };
        write(0).unwrap();
        let guard = s.inner.reader();
        let old = {
            let r = s.inner.db.begin_read().unwrap();
            s.inner.onode(&r.open_table(OBJECTS).unwrap(), &o).unwrap()
        };
        // Without the quarantine, the 8th write would wrap around onto the old blocks.
        let mut ok = 0;
        for v in 1..=10 {
            match write(v) {
                Ok(()) => ok += 1,
                Err(StoreError::NoSpace { .. }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(ok, 6, "the pinned blocks are not handed out");
        for (&lb, &blk) in &old.blocks {
            s.inner.read_verified(&o, lb, blk).unwrap();
        }
        drop(guard);
        write(99).unwrap();
        assert_eq!(s.read(&o, 0, 1).unwrap(), vec![99]);
    }
}
