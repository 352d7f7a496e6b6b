//! The host doing the files benchmark's I/O itself: io_uring with O_DIRECT on a regular file
//! on the same disk, with the same threads, queue depth and random offsets as the library
//! workload ([`crate::workload`]): each thread draws its offsets and read/write choices from
//! the same seeded generator in the same order.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use io_uring::{opcode, types, IoUring};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use dds_sys::AlignedBuf;

use crate::workload::{WorkloadResult, WorkloadSpec};

/// An I/O buffer aligned for O_DIRECT, every byte `fill`.
fn io_buffer(len: usize, fill: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(len.max(4096).next_multiple_of(4096), 4096);
    b.as_mut_slice().fill(fill);
    b
}

/// Creates (or truncates) `path` and writes all `bytes` of it once, so the measured runs
/// touch allocated blocks only; then drops it from the page cache.
pub fn prepare_file(path: &Path, bytes: u64) -> Result<()> {
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    let chunk = vec![0x5au8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])
            .with_context(|| format!("write {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()?;
    // SAFETY: advisory call on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// The `io_bytes`-aligned blocks of a file that random offsets are drawn from, uniformly.
#[derive(Clone, Debug)]
pub struct Blocks {
    /// Per range: its first block and the blocks before it in the list.
    ranges: Vec<(u64, u64)>,
    total: u64,
}

impl Blocks {
    /// Every block of the first `file_bytes` bytes.
    pub fn whole(file_bytes: u64, io_bytes: u32) -> Blocks {
        Blocks {
            ranges: vec![(0, 0)],
            total: file_bytes / u64::from(io_bytes.max(1)),
        }
    }

    /// The blocks of `path` that hold data (`SEEK_DATA` / `SEEK_HOLE`: no holes, no
    /// preallocated extents never written), so that every read reaches the device.
    pub fn written(path: &Path, io_bytes: u32) -> Result<Blocks> {
        let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
        let len = file.metadata()?.len();
        let io = u64::from(io_bytes.max(1));
        let fd = file.as_raw_fd();
        let (mut ranges, mut total, mut at) = (Vec::new(), 0u64, 0u64);
        while at < len {
            // SAFETY: lseek on an open descriptor.
            let data = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
            if data < 0 {
                break; // ENXIO: no data after `at`
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
            let (start, end) = (data as u64, if hole < 0 { len } else { hole as u64 });
            let (first, last) = (start.div_ceil(io), end / io);
            if last > first {
                ranges.push((first, total));
                total += last - first;
            }
            at = end.max(start + 1);
        }
        if total == 0 {
            bail!("{} holds no written block of {io} bytes", path.display());
        }
        Ok(Blocks { ranges, total })
    }

    /// Blocks in all.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The byte offset of block `i` (0 ..`count()`) of the list.
    fn offset(&self, i: u64, io_bytes: u32) -> u64 {
        let r = self.ranges.partition_point(|&(_, before)| before <= i) - 1;
        let (first, before) = self.ranges[r];
        (first + i - before) * u64::from(io_bytes)
    }
}

/// Runs `spec` (its `file` field is ignored) against `path` with io_uring and O_DIRECT.
/// `progress` is called with the operations done so far.
pub fn run(
    path: &Path,
    spec: &WorkloadSpec,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<WorkloadResult> {
    run_on(
        path,
        spec,
        &Blocks::whole(spec.file_bytes, spec.io_bytes),
        progress,
    )
}

/// As [`run`], with offsets drawn from `blocks` (the file is opened read-only when the
/// workload only reads).
pub fn run_on(
    path: &Path,
    spec: &WorkloadSpec,
    blocks: &Blocks,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<WorkloadResult> {
    if spec.io_bytes == 0
        || spec.file_bytes < spec.io_bytes as u64
        || blocks.count() == 0
        || spec.threads == 0
        || spec.depth == 0
    {
        bail!("workload needs io_bytes > 0, a file of at least one I/O, threads and depth > 0");
    }
    let file: File = OpenOptions::new()
        .read(true)
        .write(spec.read_ratio < 1.0)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("open {} with O_DIRECT", path.display()))?;
    let len = file.metadata()?.len();
    if len < spec.file_bytes {
        bail!(
            "{} holds {len} bytes, fewer than {}",
            path.display(),
            spec.file_bytes
        );
    }
    let fd = file.as_raw_fd();
    let issued = AtomicU64::new(0);
    let completed = AtomicU64::new(0);
    let barrier = Barrier::new(spec.threads);
    let epoch = Instant::now();
    type ThreadResult = Result<(Histogram<u64>, u64, u64, u64)>;
    let results: Vec<ThreadResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.threads)
            .map(|t| {
                let (issued, completed, barrier) = (&issued, &completed, &barrier);
                s.spawn(move || -> ThreadResult {
                    let depth = spec.depth;
                    let mut ring = IoUring::new((depth as u32).next_power_of_two())
                        .context("create an io_uring")?;
                    let bufs: Vec<AlignedBuf> = (0..depth)
                        .map(|i| io_buffer(spec.io_bytes as usize, (i % 251) as u8))
                        .collect();
                    let mut started = vec![0u64; depth];
                    let mut free: Vec<usize> = (0..depth).rev().collect();
                    let mut rng = SmallRng::seed_from_u64(
                        spec.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    );
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
                    let (mut reads, mut writes, mut errors) = (0u64, 0u64, 0u64);
                    let mut inflight = 0usize;
                    barrier.wait();
                    loop {
                        while !free.is_empty() {
                            if issued.fetch_add(1, Ordering::Relaxed) >= spec.ops {
                                issued.fetch_sub(1, Ordering::Relaxed);
                                break;
                            }
                            let slot = free.pop().expect("non-empty");
                            let offset =
                                blocks.offset(rng.gen_range(0..blocks.count()), spec.io_bytes);
                            let is_read = rng.gen_bool(spec.read_ratio);
                            let ptr = bufs[slot].as_mut_ptr();
                            let sqe = if is_read {
                                reads += 1;
                                opcode::Read::new(types::Fd(fd), ptr, spec.io_bytes)
                                    .offset(offset)
                                    .build()
                            } else {
                                writes += 1;
                                opcode::Write::new(types::Fd(fd), ptr, spec.io_bytes)
                                    .offset(offset)
                                    .build()
                            }
                            .user_data(slot as u64);
                            started[slot] = epoch.elapsed().as_nanos() as u64;
                            // SAFETY: the buffer outlives the operation (it is reused only
                            // after its completion), and the queue has room for `depth`.
                            unsafe { ring.submission().push(&sqe) }
                                .map_err(|_| anyhow::anyhow!("submission queue full"))?;
                            inflight += 1;
                        }
                        if inflight == 0 {
                            break;
                        }
                        ring.submit_and_wait(1).context("io_uring submit")?;
                        let mut done = 0u64;
                        for cqe in ring.completion() {
                            let slot = cqe.user_data() as usize;
                            let now = epoch.elapsed().as_nanos() as u64;
                            hist.saturating_record(now.saturating_sub(started[slot]).max(1));
                            if cqe.result() != spec.io_bytes as i32 {
                                errors += 1;
                            }
                            free.push(slot);
                            inflight -= 1;
                            done += 1;
                        }
                        let total = completed.fetch_add(done, Ordering::Relaxed) + done;
                        if total / 1024 != (total - done) / 1024 {
                            progress(total);
                        }
                    }
                    Ok((hist, reads, writes, errors))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("io_uring thread panicked"))
            .collect()
    });
    let seconds = epoch.elapsed().as_secs_f64();
    progress(completed.load(Ordering::Relaxed));
    crate::workload::summarize(results, seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_a_small_file() {
        let dir = std::env::temp_dir().join(format!("dds-uring-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.dat");
        prepare_file(&path, 1 << 20).unwrap();
        let spec = WorkloadSpec {
            file: 0,
            file_bytes: 1 << 20,
            io_bytes: 4096,
            read_ratio: 0.5,
            threads: 2,
            depth: 4,
            ops: 500,
            seed: 7,
            registered: false,
        };
        match run(&path, &spec, &|_| {}) {
            Ok(r) => {
                assert_eq!(r.ops, 500);
                assert_eq!(r.reads + r.writes, 500);
                assert_eq!(r.errors, 0);
            }
            // Kernels or sandboxes without io_uring or O_DIRECT on this file system.
            Err(e) => eprintln!("io_uring baseline unavailable here: {e:#}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_blocks_skip_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.dat");
        let f = File::create(&path).unwrap();
        f.set_len(16 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[1u8; 8192], 4 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 12 << 20).unwrap();
        f.sync_all().unwrap();
        let b = Blocks::written(&path, 4096).unwrap();
        // File systems may report data at a coarser grain than written, never less.
        assert!(b.count() >= 3, "{b:?}");
        let offs: Vec<u64> = (0..b.count()).map(|i| b.offset(i, 4096)).collect();
        assert!(offs.contains(&(4 << 20)) && offs.contains(&((4 << 20) + 4096)));
        assert!(offs.contains(&(12 << 20)));
        assert!(offs.windows(2).all(|w| w[0] < w[1]));
        let whole = Blocks::whole(1 << 20, 4096);
        assert_eq!(whole.count(), 256);
        assert_eq!(whole.offset(255, 4096), 255 * 4096);
    }
}
