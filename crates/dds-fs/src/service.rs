//! The file service: format, open/recovery and metadata operations.
//! The data path lives in `io.rs`.

use crate::align::{align_up, AlignedBuf};
use crate::commit::{Committer, Executor};
use crate::device::DevIo;
use crate::device::{DevCompletion, DevOp, Device, DeviceBusy};
use crate::error::FsError;
use crate::io::DataPath;
use crate::journal::Journal;
use crate::layout::{FormatConfig, Geometry, SB_LEN};
use crate::meta::{
    make_file_id, name_ok, parse_log_entry, record_seq, LogEntry, MetaState, NameError,
};
use crate::types::{DirEntry, EntryKind, FileId, FileInfo, OpenConfig, SpaceInfo};
use std::io;

mod metaq;
mod namespace;
mod recovery;

use metaq::MetaQueue;
pub use metaq::{MetaDone, MetaOp};

pub use recovery::{check, CheckReport};
use recovery::{load_metadata, Loaded};

/// Formats `dev`: lays out segments and writes an empty file system (docs/on-disk-format.md).
/// Everything previously on the device is lost.
pub fn format(dev: &mut dyn Device, cfg: FormatConfig) -> Result<(), FsError> {
    if dev.inflight() != 0 {
        return Err(FsError::InvalidConfig(
            "device has I/O in flight".to_string(),
        ));
    }
    let uuid = cfg.fs_uuid.unwrap_or_else(random_u64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let g = Geometry::compute(&cfg, dev.block_size(), dev.capacity(), uuid, now)?;
    let b = u64::from(g.block_size);
    let align = dev.mem_align().max(g.block_size as usize);
    // 1. Zero the whole metadata area: no stale superblock, checkpoint or log record survives.
    dev.zero_sync(0, u64::from(g.meta_segments) * g.segment_size)
        .map_err(|e| FsError::io("format: zero metadata", e))?;
    // 2. Checkpoint generation 1 of the empty state into slot 0.
    let st = MetaState::empty(&g);
    let mut buf = AlignedBuf::new(g.ckpt_len as usize, align);
    let n = st.encode_checkpoint(uuid, 1, 0, buf.as_mut_slice());
    let padded = align_up(n as u64, b) as usize;
    dev.write_sync(g.ckpt_off[0], &buf.as_slice()[..padded])
        .map_err(|e| FsError::io("format: checkpoint", e))?;
    dev.sync().map_err(|e| FsError::io("format: sync", e))?;
    // 3. Superblocks last: until they are durable the device is not a file system.
    let mut sb = AlignedBuf::new(b as usize, align);
    g.encode_superblock(sb.as_mut_slice());
    dev.write_sync(0, sb.as_slice())
        .map_err(|e| FsError::io("format: superblock", e))?;
    dev.write_sync(b, sb.as_slice())
        .map_err(|e| FsError::io("format: backup superblock", e))?;
    dev.sync().map_err(|e| FsError::io("format: sync", e))?;
    tracing::info!(
        segments = g.total_segments,
        meta_segments = g.meta_segments,
        segment_size = g.segment_size,
        "formatted dds-fs device"
    );
    Ok(())
}

fn random_u64() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
}

/// Per-file data-path bookkeeping.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileIo {
    /// Data operations of this file that have not completed.
    pub inflight: u32,
    /// Write operations of this file that have not completed.
    pub writes: u32,
    /// The file's unfinished writes as a list through their slots, in submission order:
    /// first and last slot (`NO_SLOT` when empty). A new write checks only these for
    /// conflicts.
    pub first_write: u32,
    pub last_write: u32,
    /// A pending delete or shrink of this file: new reads and writes are refused (`Busy`).
    pub fenced: bool,
    /// Writes of this file waiting for its size to grow (parked in the data path, counted
    /// in `inflight` and `writes`; `service/metaq.rs`).
    pub parked: u32,
    /// The largest end among those writes: the size the file's next extend commits (0 when
    /// none waits).
    pub want: u64,
    /// The size the extend of this file with the committer grows it to (0: none is).
    pub committing: u64,
    /// An extend of this file waits in the metadata queue.
    pub extend_queued: bool,
}

/// No slot (end of a list).
pub(crate) const NO_SLOT: u32 = u32::MAX;

impl Default for FileIo {
    fn default() -> Self {
        FileIo {
            inflight: 0,
            writes: 0,
            first_write: NO_SLOT,
            last_write: NO_SLOT,
            fenced: false,
            parked: 0,
            want: 0,
            committing: 0,
            extend_queued: false,
        }
    }
}

/// The DPU file service. Single-threaded: owned and driven by the DPU service thread.
pub struct FileService {
    pub(crate) dev: Box<dyn Device>,
    pub(crate) geom: Geometry,
    /// The metadata as of the last change made durable and applied.
    pub(crate) meta: MetaState,
    /// Makes metadata changes durable: inline or on the metadata thread (`commit.rs`).
    exec: Executor,
    /// Metadata operations queued, active and finished (`service/metaq.rs`).
    mq: MetaQueue,
    /// Set after a metadata write/sync failure: no further changes until reopened.
    failed: Option<String>,
    pub(crate) bs: u64,
    pub(crate) align: usize,
    /// Next file slot to try (round robin, so slots and ids are not reused quickly).
    next_file_slot: u32,
    pub(crate) files_io: Vec<FileIo>,
    pub(crate) dp: DataPath,
}

// SAFETY: raw pointers held by the data path refer to caller buffers whose validity the
// submit contract guarantees; nothing is tied to the creating thread. Not Sync.
unsafe impl Send for FileService {}

enum SbProbe {
    Found(Geometry),
    Invalid(String),
}

impl FileService {
    /// Opens a formatted device and recovers its metadata (docs/on-disk-format.md §6).
    pub fn open(mut dev: Box<dyn Device>, cfg: OpenConfig) -> Result<FileService, FsError> {
        if dev.inflight() != 0 {
            return Err(FsError::InvalidConfig("device has I/O in flight".into()));
        }
        let Loaded {
            g,
            align,
            mut meta,
            active,
            generation,
            seq,
            log_end: pos,
            replayed,
        } = load_metadata(&mut *dev)?;
        let dp = DataPath::new(&cfg, &g, dev.queue_depth(), align)?;
        tracing::info!(
            generation,
            replayed,
            files = meta.nfiles,
            dirs = meta.ndirs(),
            "opened dds-fs"
        );

        let journal = Journal::new(&g, align, active, generation, seq, pos as u64);
        let max_files = g.max_files as usize;
        let next_file_slot = meta.next_gen % g.max_files;
        let mut committer = Committer::new(g.clone(), journal, meta.clone(), align);
        // Re-zero tails of files whose shrink may not have finished zeroing.
        let mut dirty = false;
        for slot in 0..max_files {
            let Some(f) = meta.files[slot].as_ref() else {
                continue;
            };
            if !f.tail_dirty {
                continue;
            }
            let (size, end) = (f.size, f.segs.len() as u64 * g.segment_size);
            if size < end {
                committer.zero_file_range(&mut DevIo(&mut *dev), slot as u32, size, end)?;
            }
            dirty = true;
        }
        if dirty {
            dev.sync()
                .map_err(|e| FsError::io("sync after tail zeroing", e))?;
            for f in meta.files.iter_mut().flatten() {
                f.tail_dirty = false;
            }
            committer.clear_tail_flags();
        }
        let mut dp = dp;
        let (slab, slab_len) = dp.bounce_memory();
        // SAFETY: the bounce slab lives in `dp`, which the service drops after `dev`.
        unsafe { dev.register_memory(slab, slab_len) };
        Ok(FileService {
            dev,
            bs: u64::from(g.block_size),
            align,
            next_file_slot,
            files_io: vec![FileIo::default(); max_files],
            dp,
            geom: g,
            meta,
            exec: Executor::Inline(Box::new(committer)),
            mq: MetaQueue::default(),
            failed: None,
        })
    }

    /// Registers `[ptr, ptr + len)`, memory that reads and writes will target, with the
    /// device ([`Device::register_memory`]): on io_uring its operations skip pinning pages.
    /// Returns whether the device took it; unregistered memory works all the same.
    ///
    /// # Safety
    /// The memory stays allocated until [`unregister_memory`](Self::unregister_memory) is
    /// called with the same `ptr` or the service is dropped.
    pub unsafe fn register_memory(&mut self, ptr: *mut u8, len: usize) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.dev.register_memory(ptr, len) }
    }

    /// Forgets memory registered at `ptr`.
    pub fn unregister_memory(&mut self, ptr: *mut u8) {
        self.dev.unregister_memory(ptr)
    }

    // ----------------------------------------------------------------------------------
    // Accessors

    /// I/O alignment unit (formatted block size) in bytes.
    pub fn block_size(&self) -> u32 {
        self.geom.block_size
    }

    /// Buffer address alignment that enables the zero-copy path.
    pub fn mem_align(&self) -> usize {
        self.align
    }

    /// Segment size in bytes.
    pub fn segment_size(&self) -> u64 {
        self.geom.segment_size
    }

    /// Largest possible file size.
    pub fn max_file_size(&self) -> u64 {
        self.geom.max_file_size()
    }

    /// Largest read/write length accepted.
    pub fn max_io_bytes(&self) -> u32 {
        self.dp.max_io
    }

    /// Maximum number of data operations in flight.
    pub fn max_inflight(&self) -> u32 {
        self.dp.max_inflight()
    }

    /// The formatted limits and current usage.
    pub fn free_space(&self) -> SpaceInfo {
        let g = &self.geom;
        let free = self.meta.segmap.free_count();
        SpaceInfo {
            total_bytes: g.max_file_size(),
            free_bytes: u64::from(free) * g.segment_size,
            segment_size: g.segment_size,
            block_size: g.block_size,
            total_segments: g.data_segments(),
            free_segments: free,
            files: self.meta.nfiles,
            dirs: self.meta.ndirs(),
            max_files: g.max_files,
            max_dirs: g.max_dirs,
            max_name_len: g.max_name_len,
            max_file_size: g.max_file_size(),
        }
    }

    /// Re-derives the allocation map from every file's segment vector and checks it against
    /// the live map (no segment owned twice, free count = total − used).
    pub fn check_consistency(&self) -> Result<(), FsError> {
        self.meta.verify().map_err(FsError::Corrupt)
    }

    /// Closes the service after waiting for in-flight device I/O (unreported completions are
    /// dropped) and returns the device.
    pub fn into_device(mut self) -> Box<dyn Device> {
        // The metadata thread finishes the job it may be running and ends.
        self.exec = Executor::Moved;
        self.quiesce_device();
        // The bounce slab goes with this service: the device must not keep it registered.
        let (slab, _) = self.dp.bounce_memory();
        self.dev.unregister_memory(slab);
        std::mem::replace(&mut self.dev, Box::new(NullDevice))
    }

    // ----------------------------------------------------------------------------------
    // Paths

    fn dir_slot(&self, name: Option<&str>) -> Result<u32, FsError> {
        match name {
            None => Ok(0),
            Some(n) => self
                .meta
                .dir_by_name
                .get(n)
                .copied()
                .ok_or(FsError::UnknownDir),
        }
    }

    fn check_name(&self, name: &str) -> Result<(), FsError> {
        // Control characters (C0 and DEL) make names that terminals and logs mangle.
        if name.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(FsError::InvalidPath);
        }
        match name_ok(name, self.geom.max_name_len) {
            Ok(()) => Ok(()),
            Err(NameError::Invalid) => Err(FsError::InvalidPath),
            Err(NameError::TooLong) => Err(FsError::NameTooLong),
        }
    }

    /// Splits a file path into (directory slot, name).
    fn parse_file_path<'p>(&self, path: &'p str) -> Result<(u32, &'p str), FsError> {
        let p = path.strip_prefix('/').unwrap_or(path);
        let (dir, name) = match p.split_once('/') {
            None => (None, p),
            Some((d, f)) => (Some(d), f),
        };
        if let Some(d) = dir {
            self.check_name(d)?;
        }
        self.check_name(name)?;
        Ok((self.dir_slot(dir)?, name))
    }

    /// Parses a directory path: `None` for the root.
    fn parse_dir_path<'p>(&self, path: &'p str) -> Result<Option<&'p str>, FsError> {
        if path == "/" {
            return Ok(None);
        }
        let p = path.strip_prefix('/').unwrap_or(path);
        let p = p.strip_suffix('/').unwrap_or(p);
        self.check_name(p)?;
        Ok(Some(p))
    }

    fn file_by_path(&self, path: &str) -> Result<u32, FsError> {
        let (dir, name) = self.parse_file_path(path)?;
        let d = self.meta.dirs[dir as usize].as_ref().expect("live dir");
        d.files
            .get(name)
            .map(|&s| u32::from(s))
            .ok_or(FsError::NotFound)
    }

    pub(crate) fn file_slot(&self, id: FileId) -> Result<u32, FsError> {
        self.meta.resolve_id(id.0).ok_or(FsError::UnknownFile)
    }

    fn info(&self, slot: u32) -> FileInfo {
        let f = self.meta.files[slot as usize].as_ref().expect("live file");
        let dir = if f.dir == 0 {
            "/".to_string()
        } else {
            let d = self.meta.dirs[f.dir as usize].as_ref().expect("live dir");
            format!("/{}", d.name)
        };
        let path = if f.dir == 0 {
            format!("/{}", f.name)
        } else {
            format!("{dir}/{}", f.name)
        };
        FileInfo {
            id: FileId(make_file_id(slot, f.gen)),
            path,
            dir,
            name: f.name.clone(),
            size: f.size,
            allocated_bytes: f.segs.len() as u64 * self.geom.segment_size,
        }
    }

    // ----------------------------------------------------------------------------------
    // Commit

    pub(crate) fn check_writable(&self) -> Result<(), FsError> {
        match &self.failed {
            Some(e) => Err(FsError::Io(format!(
                "file service stopped after a metadata I/O error ({e}); reopen the device"
            ))),
            None => Ok(()),
        }
    }

    fn fail(&mut self, e: FsError) -> FsError {
        tracing::error!(error = %e, "metadata I/O failed; refusing further changes");
        self.failed = Some(e.to_string());
        e
    }

    /// Waits for every device operation, discarding completions (used when closing).
    fn quiesce_device(&mut self) {
        let mut out = [DevCompletion::default(); 64];
        while self.dev.inflight() > 0 {
            if let Err(e) = self.dev.wait() {
                tracing::error!(error = %e, "device wait failed while closing");
                std::thread::yield_now();
            }
            self.dev.poll(&mut out);
        }
    }
}

impl Drop for FileService {
    fn drop(&mut self) {
        // The kernel may still be writing into bounce buffers we are about to free.
        self.quiesce_device();
    }
}

fn read_superblock(dev: &mut dyn Device) -> Result<SbProbe, FsError> {
    let dev_bs = dev.block_size() as usize;
    let align = dev.mem_align().max(dev_bs);
    let mut buf = AlignedBuf::new(dev_bs.max(SB_LEN), align);
    dev.read_sync(0, buf.as_mut_slice())
        .map_err(|e| FsError::io("read superblock", e))?;
    let primary = match Geometry::decode_superblock(buf.as_slice()) {
        Ok(g) => return Ok(SbProbe::Found(g)),
        Err(e) => e,
    };
    // The backup sits one formatted block further; try every plausible block size.
    let mut b = dev_bs.max(512);
    while b <= 64 * 1024 && (2 * b) as u64 <= dev.capacity() {
        dev.read_sync(b as u64, buf.as_mut_slice())
            .map_err(|e| FsError::io("read backup superblock", e))?;
        if let Ok(g) = Geometry::decode_superblock(buf.as_slice()) {
            if g.block_size as usize == b {
                tracing::warn!(error = %primary, "primary superblock invalid, using backup");
                return Ok(SbProbe::Found(g));
            }
        }
        b *= 2;
    }
    Ok(SbProbe::Invalid(primary))
}

/// Placeholder left behind by [`FileService::into_device`].
struct NullDevice;

impl Device for NullDevice {
    fn block_size(&self) -> u32 {
        512
    }
    fn mem_align(&self) -> usize {
        512
    }
    fn capacity(&self) -> u64 {
        0
    }
    fn queue_depth(&self) -> usize {
        1
    }
    fn inflight(&self) -> usize {
        0
    }
    unsafe fn submit(&mut self, _op: DevOp, _user_data: u64) -> Result<(), DeviceBusy> {
        Err(DeviceBusy)
    }
    fn poll(&mut self, _out: &mut [DevCompletion]) -> usize {
        0
    }
    fn wait(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn read_sync(&mut self, _o: u64, _b: &mut [u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }
    fn write_sync(&mut self, _o: u64, _b: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }
    fn zero_sync(&mut self, _o: u64, _l: u64) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }
    fn sync(&mut self) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(libc::ENODEV))
    }
}
