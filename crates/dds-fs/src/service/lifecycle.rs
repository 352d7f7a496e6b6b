//! The service's life: [`format`] a device, open it (metadata recovered, the tails of files
//! whose shrink may not have finished zeroed again), register memory with the device, and
//! close (wait for the device's I/O in flight, hand the device back).

use std::io;

use super::recovery::{load_metadata, Loaded};
use super::{FileIo, FileService, MetaQueue};
use crate::align::{align_up, AlignedBuf};
use crate::commit::{Committer, Executor};
use crate::device::{DevCompletion, DevIo, DevOp, Device, DeviceBusy};
use crate::error::FsError;
use crate::io::DataPath;
use crate::journal::Journal;
use crate::layout::{FormatConfig, Geometry};
use crate::meta::MetaState;
use crate::types::OpenConfig;

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
