//! Opening, formatting and checking a store: the device and its `<device>.meta` database
//! are created by [`ObjStore::format`], validated against each other and handed to a new
//! committer thread by [`ObjStore::open_with`], and [`ObjStore::fsck`] checks block maps against
//! the allocation bitmap (and, when deep, every block's checksum).

use super::commit::Committer;
use super::epochs::Epochs;
use super::{now_ns, Inner, ObjStore, StoreOptions, BS, MAX_OBJECT_SIZE_CAP, MIN_DEVICE_BLOCKS};
use crate::alloc::Allocator;
use crate::device::{Device, Superblock};
use crate::error::StoreError;
use crate::meta::{BITMAP, OBJECTS, OMAP, STATE, XATTRS};
use crate::pool::BufPool;
use crate::tx::{ObjectId, MAX_NAME_LEN};
use crate::BLOCK_SIZE;
use redb::{Database, ReadableTable};
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

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
}

impl ObjStore {
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
