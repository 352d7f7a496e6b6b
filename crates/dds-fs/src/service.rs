//! The file service: format, open/recovery and metadata operations.
//! The data path lives in `io.rs`.

use crate::align::{align_down, align_up, AlignedBuf};
use crate::device::{DevCompletion, DevOp, Device, DeviceBusy};
use crate::error::FsError;
use crate::io::DataPath;
use crate::journal::Journal;
use crate::layout::{FormatConfig, Geometry, SB_LEN};
use crate::meta::{
    make_file_id, name_ok, parse_log_entry, record_seq, LogEntry, MetaState, NameError, Record,
    Segs,
};
use crate::types::{DirEntry, EntryKind, FileId, FileInfo, OpenConfig, SpaceInfo};
use std::io;

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
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FileIo {
    /// Data operations of this file that have not completed.
    pub inflight: u32,
    /// Write operations of this file that have not completed.
    pub writes: u32,
}

/// The DPU file service. Single-threaded: owned and driven by the DPU service thread.
pub struct FileService {
    pub(crate) dev: Box<dyn Device>,
    pub(crate) geom: Geometry,
    pub(crate) meta: MetaState,
    journal: Journal,
    /// Set after a metadata write/sync failure: no further changes until reopened.
    failed: Option<String>,
    pub(crate) bs: u64,
    pub(crate) align: usize,
    /// One block of aligned scratch for read-modify-write of metadata-path zeroing.
    block_scratch: AlignedBuf,
    /// Reusable list of segments picked for an allocation (capacity: all segments).
    seg_scratch: Vec<u32>,
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

/// Metadata recovered from a device: the superblock's geometry, the newest checkpoint and
/// the log replayed on top of it.
struct Loaded {
    g: Geometry,
    align: usize,
    meta: MetaState,
    active: usize,
    generation: u64,
    /// Sequence number of the last record replayed.
    seq: u64,
    /// Log offset just past it.
    log_end: usize,
    replayed: u64,
}

/// Reads and checks the superblock, the newest valid checkpoint and the metadata log
/// (docs/on-disk-format.md §6). A damaged log record followed by valid ones is corruption, not
/// the end of the log.
fn load_metadata(dev: &mut dyn Device) -> Result<Loaded, FsError> {
    let dev_bs = dev.block_size();
    let g = match read_superblock(dev)? {
        SbProbe::Found(g) => g,
        SbProbe::Invalid(e) => return Err(FsError::Corrupt(e)),
    };
    if g.block_size % dev_bs != 0 || dev.mem_align() > g.block_size as usize {
        return Err(FsError::Corrupt(format!(
            "formatted block size {} incompatible with device block size {dev_bs}",
            g.block_size
        )));
    }
    if dev.capacity() < u64::from(g.total_segments) * g.segment_size {
        return Err(FsError::Corrupt(format!(
            "device capacity {} smaller than the formatted {} segments",
            dev.capacity(),
            g.total_segments
        )));
    }
    let align = dev.mem_align().max(g.block_size as usize);

    // Newest valid checkpoint.
    let mut slot_buf = AlignedBuf::new(g.ckpt_len as usize, align);
    let mut best: Option<(usize, u64, u64)> = None;
    for slot in 0..2 {
        dev.read_sync(g.ckpt_off[slot], slot_buf.as_mut_slice())
            .map_err(|e| FsError::io("read checkpoint", e))?;
        if let Some((gen, last_seq, _)) = MetaState::checkpoint_header(slot_buf.as_slice(), &g) {
            if best.is_none_or(|(_, bg, _)| gen > bg) {
                best = Some((slot, gen, last_seq));
            }
        }
    }
    let (active, generation, last_seq) =
        best.ok_or_else(|| FsError::Corrupt("no valid checkpoint".into()))?;
    dev.read_sync(g.ckpt_off[active], slot_buf.as_mut_slice())
        .map_err(|e| FsError::io("read checkpoint", e))?;
    let mut meta =
        MetaState::decode_checkpoint(slot_buf.as_slice(), &g).map_err(FsError::Corrupt)?;
    drop(slot_buf);

    // Replay the log.
    let mut log = AlignedBuf::new(g.log_len as usize, align);
    dev.read_sync(g.log_off, log.as_mut_slice())
        .map_err(|e| FsError::io("read metadata log", e))?;
    let mut pos = 0usize;
    let mut seq = last_seq;
    let mut replayed = 0u64;
    loop {
        match parse_log_entry(
            &log.as_slice()[pos..],
            g.fs_uuid,
            seq + 1,
            g.block_size as usize,
        ) {
            LogEntry::Valid(rec, padded) => {
                meta.apply(&rec)
                    .map_err(|e| FsError::Corrupt(format!("log record {}: {e}", seq + 1)))?;
                pos += padded;
                seq += 1;
                replayed += 1;
            }
            LogEntry::Undecodable(e) => return Err(FsError::Corrupt(e)),
            LogEntry::End => {
                // The end of the log, or a damaged record with valid ones after it?
                if let Some((later, at)) =
                    later_record(&log.as_slice()[pos..], g.fs_uuid, seq + 1, g.block_size)
                {
                    return Err(FsError::Corrupt(format!(
                        "metadata log record {} at log offset {pos} is damaged (bad checksum \
                             or header) and record {later} follows it at log offset {}: refusing \
                             to open rather than lose the acknowledged operations after it \
                             (`dds fsck` explains the damage)",
                        seq + 1,
                        pos + at
                    )));
                }
                break;
            }
        }
    }
    drop(log);
    meta.verify().map_err(FsError::Corrupt)?;

    Ok(Loaded {
        g,
        align,
        meta,
        active,
        generation,
        seq,
        log_end: pos,
        replayed,
    })
}

/// The first record for this file system with a sequence number of at least `from` in
/// `log` (block-aligned positions after the start): its sequence number and offset.
fn later_record(log: &[u8], fs_uuid: u64, from: u64, block: u32) -> Option<(u64, usize)> {
    let block = block as usize;
    let mut at = block;
    while at + block <= log.len() {
        if let Some(seq) = record_seq(&log[at..], fs_uuid) {
            if seq >= from {
                return Some((seq, at));
            }
        }
        at += block;
    }
    None
}

/// What `dds fsck` finds on a device.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CheckReport {
    /// Checkpoint generation in use.
    pub generation: u64,
    /// Log records replayed on top of it.
    pub replayed: u64,
    pub files: u32,
    pub dirs: u32,
    /// What is wrong, if anything (the file service refuses to open the device then).
    pub damage: Option<String>,
}

/// Checks a device's metadata without changing anything: what `FileService::open` would
/// recover, or why it refuses.
pub fn check(dev: &mut dyn Device) -> CheckReport {
    match load_metadata(dev) {
        Ok(l) => CheckReport {
            generation: l.generation,
            replayed: l.replayed,
            files: l.meta.nfiles,
            dirs: l.meta.ndirs(),
            damage: None,
        },
        Err(e) => CheckReport {
            generation: 0,
            replayed: 0,
            files: 0,
            dirs: 0,
            damage: Some(e.to_string()),
        },
    }
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
            meta,
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
        let total_segments = g.total_segments as usize;
        let next_file_slot = meta.next_gen % g.max_files;
        let mut fs = FileService {
            dev,
            bs: u64::from(g.block_size),
            align,
            block_scratch: AlignedBuf::new(g.block_size as usize, align),
            seg_scratch: Vec::with_capacity(total_segments),
            next_file_slot,
            files_io: vec![FileIo::default(); max_files],
            dp,
            geom: g,
            meta,
            journal,
            failed: None,
        };
        // Re-zero tails of files whose shrink may not have finished zeroing.
        let mut dirty = false;
        for slot in 0..max_files {
            let Some(f) = fs.meta.files[slot].as_ref() else {
                continue;
            };
            if !f.tail_dirty {
                continue;
            }
            let (size, end) = (f.size, f.segs.len() as u64 * fs.geom.segment_size);
            if size < end {
                fs.zero_file_range(slot as u32, size, end)?;
            }
            dirty = true;
        }
        if dirty {
            fs.dev
                .sync()
                .map_err(|e| FsError::io("sync after tail zeroing", e))?;
            for f in fs.meta.files.iter_mut().flatten() {
                f.tail_dirty = false;
            }
        }
        Ok(fs)
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
        self.quiesce_device();
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

    /// Makes `rec` durable, then applies it to the in-memory state.
    fn commit(&mut self, rec: &Record<'_>) -> Result<(), FsError> {
        self.check_writable()?;
        if let Err(e) = self
            .journal
            .append(&mut *self.dev, &self.geom, &self.meta, rec)
        {
            return Err(self.fail(e));
        }
        if let Err(e) = self.meta.apply(rec) {
            // Validated before logging; reaching this is a bug. Stop changing anything.
            debug_assert!(false, "durable record failed to apply: {e}");
            return Err(self.fail(FsError::Corrupt(e)));
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------------
    // Directory operations

    /// Creates a named directory (`/name` or `name`).
    pub fn create_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let name = self.parse_dir_path(path)?.ok_or(FsError::Exists)?;
        if self.meta.name_taken(0, name) {
            return Err(FsError::Exists);
        }
        let slot = (1..=self.geom.max_dirs)
            .find(|&s| self.meta.dirs[s as usize].is_none())
            .ok_or(FsError::TooManyDirs)?;
        self.commit(&Record::CreateDir { slot, name })
    }

    /// Removes an empty named directory.
    pub fn remove_dir(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let name = self.parse_dir_path(path)?.ok_or(FsError::InvalidPath)?;
        let slot = self.dir_slot(Some(name))?;
        if !self.meta.dirs[slot as usize]
            .as_ref()
            .expect("live")
            .files
            .is_empty()
        {
            return Err(FsError::NotEmpty);
        }
        self.commit(&Record::RemoveDir { slot })
    }

    /// Lists a directory (`/` lists root files and all directories), sorted by name.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, FsError> {
        let dir = self.parse_dir_path(path)?;
        let slot = self.dir_slot(dir)?;
        let d = self.meta.dirs[slot as usize].as_ref().expect("live");
        let mut out: Vec<DirEntry> = d
            .files
            .iter()
            .map(|(name, &fs)| {
                let f = self.meta.files[fs as usize].as_ref().expect("live");
                DirEntry {
                    name: name.clone(),
                    kind: EntryKind::File,
                    id: Some(FileId(make_file_id(u32::from(fs), f.gen))),
                    size: f.size,
                }
            })
            .collect();
        if slot == 0 {
            out.extend(self.meta.dir_by_name.keys().map(|n| DirEntry {
                name: n.clone(),
                kind: EntryKind::Dir,
                id: None,
                size: 0,
            }));
            out.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Ok(out)
    }

    /// Names of all named directories, sorted.
    pub fn list_dirs(&self) -> Vec<String> {
        self.meta.dir_by_name.keys().cloned().collect()
    }

    // ----------------------------------------------------------------------------------
    // File operations

    /// Creates an empty file at `path` (`/dir/name`, `/name` or `name`).
    pub fn create_file(&mut self, path: &str) -> Result<FileId, FsError> {
        self.check_writable()?;
        let (dir, name) = self.parse_file_path(path)?;
        if self.meta.name_taken(dir, name) {
            return Err(FsError::Exists);
        }
        let max = self.geom.max_files;
        if self.meta.nfiles >= max {
            return Err(FsError::TooManyFiles);
        }
        let start = self.next_file_slot % max;
        let slot = (0..max)
            .map(|i| (start + i) % max)
            .find(|&s| self.meta.files[s as usize].is_none())
            .ok_or(FsError::TooManyFiles)?;
        let gen = self.meta.next_gen;
        self.commit(&Record::CreateFile {
            slot,
            gen,
            dir,
            name,
        })?;
        self.next_file_slot = (slot + 1) % max;
        Ok(FileId(make_file_id(slot, gen)))
    }

    /// Deletes the file at `path`, after its in-flight I/O completed.
    pub fn delete_file(&mut self, path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_by_path(path)?;
        self.delete_slot(slot)
    }

    /// Deletes a file by id, after its in-flight I/O completed.
    pub fn delete_file_by_id(&mut self, id: FileId) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_slot(id)?;
        self.delete_slot(slot)
    }

    fn delete_slot(&mut self, slot: u32) -> Result<(), FsError> {
        self.drain_file(slot)?;
        let gen = self.meta.files[slot as usize].as_ref().expect("live").gen;
        self.commit(&Record::DeleteFile { slot, gen })
    }

    /// Renames / moves a file (also between directories). Fails with `Exists` if the target
    /// name is taken; renaming onto itself succeeds without change.
    pub fn rename_file(&mut self, old_path: &str, new_path: &str) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_by_path(old_path)?;
        let (dir, name) = self.parse_file_path(new_path)?;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        if f.dir == dir && f.name == name {
            return Ok(());
        }
        if self.meta.name_taken(dir, name) {
            return Err(FsError::Exists);
        }
        let gen = f.gen;
        self.commit(&Record::RenameFile {
            slot,
            gen,
            dir,
            name,
        })
    }

    /// Description of a file by id.
    pub fn stat(&self, id: FileId) -> Result<FileInfo, FsError> {
        Ok(self.info(self.file_slot(id)?))
    }

    /// Description of a file by path.
    pub fn lookup(&self, path: &str) -> Result<FileInfo, FsError> {
        Ok(self.info(self.file_by_path(path)?))
    }

    /// Current size of a file.
    pub fn file_size(&self, id: FileId) -> Result<u64, FsError> {
        let slot = self.file_slot(id)?;
        Ok(self.meta.files[slot as usize].as_ref().expect("live").size)
    }

    /// Sets a file's size, allocating or freeing segments. Growth reads as zeros. Shrinking
    /// first waits for the file's in-flight I/O.
    pub fn resize(&mut self, id: FileId, new_size: u64) -> Result<(), FsError> {
        self.check_writable()?;
        let slot = self.file_slot(id)?;
        if new_size > self.geom.max_file_size() {
            return Err(FsError::OutOfRange);
        }
        let size = self.meta.files[slot as usize].as_ref().expect("live").size;
        if new_size < size {
            self.drain_file(slot)?;
        }
        self.set_size(slot, new_size)
    }

    /// Durably changes the size of file `slot` (growth allocates zeroed segments; shrink
    /// zeroes the cut tail). Callers have drained the file before a shrink.
    pub(crate) fn set_size(&mut self, slot: u32, new_size: u64) -> Result<(), FsError> {
        self.check_writable()?;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let (gen, size, nseg) = (f.gen, f.size, f.segs.len() as u32);
        let hint = f.segs.last().map_or(0, |&s| s + 1);
        debug_assert!(new_size <= self.geom.max_file_size());
        let new_nseg = new_size.div_ceil(seg) as u32;
        if new_size == size {
            return Ok(());
        }
        if new_nseg > nseg {
            let mut picked = std::mem::take(&mut self.seg_scratch);
            picked.clear();
            if !self
                .meta
                .segmap
                .pick_free(new_nseg - nseg, hint, &mut picked)
            {
                self.seg_scratch = picked;
                return Err(FsError::NoSpace);
            }
            let r = self.zero_segments(&picked).and_then(|()| {
                self.commit(&Record::SetSize {
                    slot,
                    gen,
                    size: new_size,
                    tail_dirty: false,
                    keep: nseg,
                    append: Segs::Slice(&picked),
                })
            });
            self.seg_scratch = picked;
            r
        } else if new_size < size {
            debug_assert_eq!(self.files_io[slot as usize].inflight, 0);
            self.commit(&Record::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: true,
                keep: new_nseg,
                append: Segs::Slice(&[]),
            })?;
            let end = size.min(u64::from(new_nseg) * seg);
            if new_size < end {
                if let Err(e) = self.zero_file_range(slot, new_size, end) {
                    return Err(self.fail(e));
                }
                if let Err(e) = self.dev.sync() {
                    return Err(self.fail(FsError::io("sync after tail zeroing", e)));
                }
            }
            self.meta.files[slot as usize]
                .as_mut()
                .expect("live")
                .tail_dirty = false;
            Ok(())
        } else {
            self.commit(&Record::SetSize {
                slot,
                gen,
                size: new_size,
                tail_dirty: false,
                keep: nseg,
                append: Segs::Slice(&[]),
            })
        }
    }

    /// Zeroes freshly picked segments and makes that durable (before they are attached).
    fn zero_segments(&mut self, segs: &[u32]) -> Result<(), FsError> {
        let seg = self.geom.segment_size;
        let mut i = 0;
        while i < segs.len() {
            // Merge runs of consecutive segments into one zeroing call.
            let mut j = i + 1;
            while j < segs.len() && segs[j] == segs[j - 1] + 1 {
                j += 1;
            }
            let r = self
                .dev
                .zero_sync(u64::from(segs[i]) * seg, (j - i) as u64 * seg);
            if let Err(e) = r {
                return Err(self.fail(FsError::io("zero new segments", e)));
            }
            i = j;
        }
        if let Err(e) = self.dev.sync() {
            return Err(self.fail(FsError::io("sync zeroed segments", e)));
        }
        Ok(())
    }

    /// Zeroes file bytes `[from, to)` (inside allocated segments) synchronously. The file has
    /// no I/O in flight.
    fn zero_file_range(&mut self, slot: u32, from: u64, to: u64) -> Result<(), FsError> {
        let bs = self.bs;
        let seg = self.geom.segment_size;
        let f = self.meta.files[slot as usize].as_ref().expect("live");
        let alloc_end = f.segs.len() as u64 * seg;
        assert!(
            from <= to && to <= alloc_end,
            "zero range outside the allocation"
        );
        let dev_off = |f: &crate::meta::FileRec, off: u64| {
            u64::from(f.segs[(off / seg) as usize]) * seg + off % seg
        };
        let mut from = from;
        if !from.is_multiple_of(bs) {
            let blk = align_down(from, bs);
            let d = dev_off(f, blk);
            let scratch = self.block_scratch.as_mut_slice();
            self.dev
                .read_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing read", e))?;
            let stop = to.min(blk + bs);
            scratch[(from - blk) as usize..(stop - blk) as usize].fill(0);
            self.dev
                .write_sync(d, scratch)
                .map_err(|e| FsError::io("tail zeroing write", e))?;
            from = blk + bs;
        }
        let to = align_up(to, bs).min(alloc_end);
        while from < to {
            let chunk = (to - from).min(seg - from % seg);
            self.dev
                .zero_sync(dev_off(f, from), chunk)
                .map_err(|e| FsError::io("tail zeroing", e))?;
            from += chunk;
        }
        Ok(())
    }

    /// Waits until file `slot` has no data operation in flight (their completions stay queued
    /// for the next `poll`).
    pub(crate) fn drain_file(&mut self, slot: u32) -> Result<(), FsError> {
        while self.files_io[slot as usize].inflight > 0 {
            self.progress(true)?;
        }
        Ok(())
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
