//! The emulated DMA engine: copies between a second mapping of the host's shared memory and
//! local buffers, with an optional PCIe cost model (crate documentation).

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Instant;

use rustix::fs::SealFlags;

use dds_shm::SharedRegion;

use crate::{
    CostModel, DmaCompletion, DmaDir, DmaEngine, DmaError, DmaOp, DmaStats, Region, RegionExport,
    RegionId,
};

struct Pending {
    op: DmaOp,
    /// Completion time in ns since the engine's epoch (0 without a cost model).
    due_ns: u64,
}

/// DMA engine over shared memory (see the crate documentation for its semantics).
///
/// The queue of posted and in-flight operations is allocated once, with `max_inflight`
/// entries; posting, submitting and polling never allocate.
pub struct EmulatedDma {
    /// Indexed by `RegionId`; ids are not reused, so a stale id never reaches another region.
    regions: Vec<Option<SharedRegion>>,
    /// Posted and in-flight operations in submission order: the first `submitted` entries have
    /// been started by a doorbell, the rest wait for the next `submit`.
    queue: VecDeque<Pending>,
    submitted: usize,
    max_inflight: usize,
    cost: Option<CostModel>,
    epoch: Instant,
    busy_until_ns: u64,
    stats: DmaStats,
}

// SAFETY: the raw pointers held are the engine's own mappings and the local buffers of posted
// operations, which the `post` contract keeps valid and untouched by others until completion,
// whatever thread polls.
unsafe impl Send for EmulatedDma {}

impl EmulatedDma {
    /// An engine with a queue of `max_inflight` (> 0) operations and an optional cost model.
    pub fn new(max_inflight: usize, cost: Option<CostModel>) -> Self {
        assert!(
            max_inflight > 0,
            "EmulatedDma needs a queue of at least one operation"
        );
        EmulatedDma {
            regions: Vec::new(),
            queue: VecDeque::with_capacity(max_inflight),
            submitted: 0,
            max_inflight,
            cost,
            epoch: Instant::now(),
            busy_until_ns: 0,
            stats: DmaStats::default(),
        }
    }

    /// Length of a registered region.
    pub fn region_len(&self, id: RegionId) -> Option<usize> {
        self.region(id).map(SharedRegion::len)
    }

    pub fn cost(&self) -> Option<CostModel> {
        self.cost
    }

    fn region(&self, id: RegionId) -> Option<&SharedRegion> {
        self.regions.get(id.0 as usize).and_then(Option::as_ref)
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Performs the copy of a completing operation.
    fn execute(&mut self, op: &DmaOp) -> Result<(), DmaError> {
        let Some(region) = self.region(op.region) else {
            return Err(DmaError::UnknownRegion(op.region.0));
        };
        // Bounds were checked at post and regions never change size.
        debug_assert!(op.remote_offset + op.len as u64 <= region.len() as u64);
        // SAFETY: in bounds of the mapping; `op.local` is valid by the `post` contract.
        let remote = unsafe { region.as_ptr().add(op.remote_offset as usize) };
        let len = op.len as usize;
        // Consecutive operations are ordered like PCIe orders them: a later read observes what
        // an earlier write made visible.
        fence(Ordering::SeqCst);
        match op.dir {
            DmaDir::Read => {
                // Copy: host region -> local buffer. This is the DMA transfer itself.
                // SAFETY: see above.
                unsafe { copy_from_host(remote, op.local, len) };
                self.stats.reads += 1;
                self.stats.bytes_read += len as u64;
            }
            DmaDir::Write => {
                fence(Ordering::Release);
                // Copy: local buffer -> host region. This is the DMA transfer itself.
                // SAFETY: see above.
                unsafe { copy_to_host(op.local, remote, len) };
                self.stats.writes += 1;
                self.stats.bytes_written += len as u64;
            }
        }
        Ok(())
    }
}

impl DmaEngine for EmulatedDma {
    /// Maps the shared-memory object `MAP_SHARED` (a second mapping of the host's memory, as
    /// the DPU process has it).
    ///
    /// The object must be sealed against shrinking, growing and further sealing
    /// (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`): otherwise the host could truncate it
    /// under the mapping and every later access would kill the DPU with `SIGBUS`.
    fn register_region(&mut self, export: RegionExport) -> Result<Region, DmaError> {
        let RegionExport { fd, len } = export;
        let need = SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL;
        match rustix::fs::fcntl_get_seals(&fd) {
            Ok(seals) if seals.contains(need) => {}
            Ok(seals) => {
                return Err(DmaError::Map(format!(
                    "shared memory not sealed against resizing (seals {seals:?}; \
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL required)"
                )))
            }
            Err(e) => {
                return Err(DmaError::Map(format!(
                    "shared memory must be a sealed memfd: {e}"
                )))
            }
        }
        let id = u32::try_from(self.regions.len())
            .map_err(|_| DmaError::Map("too many regions".into()))?;
        let len_usize =
            usize::try_from(len).map_err(|_| DmaError::Map(format!("region of {len} bytes")))?;
        let region =
            SharedRegion::from_fd(fd, len_usize).map_err(|e| DmaError::Map(e.to_string()))?;
        self.regions.push(Some(region));
        Ok(Region {
            id: RegionId(id),
            len,
        })
    }

    fn unregister_region(&mut self, id: RegionId) -> Result<(), DmaError> {
        match self.regions.get_mut(id.0 as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                Ok(())
            }
            _ => Err(DmaError::UnknownRegion(id.0)),
        }
    }

    fn max_inflight(&self) -> usize {
        self.max_inflight
    }

    fn outstanding(&self) -> usize {
        self.queue.len()
    }

    fn stats(&self) -> DmaStats {
        self.stats
    }

    unsafe fn post(&mut self, op: DmaOp) -> Result<(), DmaError> {
        if self.queue.len() >= self.max_inflight {
            return Err(DmaError::QueueFull);
        }
        let region = self
            .region(op.region)
            .ok_or(DmaError::UnknownRegion(op.region.0))?;
        let in_bounds = op
            .remote_offset
            .checked_add(op.len as u64)
            .is_some_and(|end| end <= region.len() as u64);
        if !in_bounds {
            return Err(DmaError::OutOfBounds {
                region: op.region.0,
                offset: op.remote_offset,
                len: op.len,
            });
        }
        // Never grows: the capacity is `max_inflight`.
        self.queue.push_back(Pending { op, due_ns: 0 });
        Ok(())
    }

    fn submit(&mut self) {
        if self.submitted == self.queue.len() {
            return;
        }
        if let Some(cost) = self.cost {
            let now = self.now_ns();
            for p in self.queue.iter_mut().skip(self.submitted) {
                let start = now.max(self.busy_until_ns);
                p.due_ns = start + cost.op_ns(p.op.len);
                self.busy_until_ns = p.due_ns;
            }
        }
        self.submitted = self.queue.len();
        self.stats.doorbells += 1;
    }

    fn poll(&mut self, out: &mut [DmaCompletion]) -> usize {
        if out.is_empty() || self.submitted == 0 {
            return 0;
        }
        let now = if self.cost.is_some() {
            self.now_ns()
        } else {
            0
        };
        // The time spent executing (copying) is counted when something completes: one clock
        // read more per poll that completes anything.
        let mut started: Option<u64> = None;
        let mut n = 0;
        while n < out.len() && self.submitted > 0 {
            let front = self.queue.front().expect("submitted ops are queued");
            if front.due_ns > now {
                break;
            }
            let p = self.queue.pop_front().expect("checked above");
            self.submitted -= 1;
            if started.is_none() {
                started = Some(if self.cost.is_some() {
                    now
                } else {
                    self.now_ns()
                });
            }
            let result = self.execute(&p.op);
            out[n] = DmaCompletion {
                user_data: p.op.user_data,
                result,
            };
            n += 1;
        }
        if let Some(t0) = started {
            self.stats.execute_ns += self.now_ns().saturating_sub(t0);
        }
        n
    }
}

impl std::fmt::Debug for EmulatedDma {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmulatedDma")
            .field(
                "regions",
                &self.regions.iter().filter(|r| r.is_some()).count(),
            )
            .field("outstanding", &self.queue.len())
            .field("max_inflight", &self.max_inflight)
            .field("cost", &self.cost)
            .finish()
    }
}

/// Copies host memory (shared, concurrently updated by host threads with atomics) into local
/// memory: `Acquire` loads of aligned `u64` words in ascending address order; at the ragged
/// edges the widest naturally aligned atomic that fits (`u32`, `u16`, `u8`), so that a DMA of
/// a narrow field (the response ring's `u32` `Waiters`) accesses it with its own size.
///
/// # Safety
/// `src..src+len` is mapped, `dst..dst+len` is valid for writes and not shared.
unsafe fn copy_from_host(src: *const u8, dst: *mut u8, len: usize) {
    let mut i = 0;
    // SAFETY (whole function): within the ranges above; atomics on the shared side, each at
    // an address aligned to its size.
    unsafe {
        while i < len && !(src as usize + i).is_multiple_of(8) {
            i += read_narrow(src.add(i), dst.add(i), len - i);
        }
        while i + 8 <= len {
            let w = AtomicU64::from_ptr(src.add(i) as *mut u64).load(Ordering::Acquire);
            (dst.add(i) as *mut u64).write_unaligned(w);
            i += 8;
        }
        while i < len {
            i += read_narrow(src.add(i), dst.add(i), len - i);
        }
    }
}

/// One narrow atomic load (`u32`, `u16` or `u8`, the widest aligned one that fits in `left`);
/// returns the bytes copied.
///
/// # Safety
/// As for [`copy_from_host`], for `left` bytes.
unsafe fn read_narrow(src: *const u8, dst: *mut u8, left: usize) -> usize {
    let a = src as usize;
    // SAFETY: see the caller.
    unsafe {
        if a.is_multiple_of(4) && left >= 4 {
            let v = AtomicU32::from_ptr(src as *mut u32).load(Ordering::Acquire);
            (dst as *mut u32).write_unaligned(v);
            4
        } else if a.is_multiple_of(2) && left >= 2 {
            let v = AtomicU16::from_ptr(src as *mut u16).load(Ordering::Acquire);
            (dst as *mut u16).write_unaligned(v);
            2
        } else {
            *dst = AtomicU8::from_ptr(src as *mut u8).load(Ordering::Acquire);
            1
        }
    }
}

/// Copies local memory into host memory in ascending address order with `Release` stores
/// (PCIe posted writes are not reordered, so a host thread that sees a later word of the
/// operation sees the earlier ones): aligned `u64` words, narrower atomics at the ragged edges
/// as in [`copy_from_host`].
///
/// # Safety
/// `dst..dst+len` is mapped, `src..src+len` is valid for reads.
unsafe fn copy_to_host(src: *const u8, dst: *mut u8, len: usize) {
    let mut i = 0;
    // SAFETY (whole function): within the ranges above; atomics on the shared side, each at
    // an address aligned to its size.
    unsafe {
        while i < len && !(dst as usize + i).is_multiple_of(8) {
            i += write_narrow(src.add(i), dst.add(i), len - i);
        }
        while i + 8 <= len {
            let w = (src.add(i) as *const u64).read_unaligned();
            AtomicU64::from_ptr(dst.add(i) as *mut u64).store(w, Ordering::Release);
            i += 8;
        }
        while i < len {
            i += write_narrow(src.add(i), dst.add(i), len - i);
        }
    }
}

/// One narrow atomic store; returns the bytes copied.
///
/// # Safety
/// As for [`copy_to_host`], for `left` bytes.
unsafe fn write_narrow(src: *const u8, dst: *mut u8, left: usize) -> usize {
    let a = dst as usize;
    // SAFETY: see the caller.
    unsafe {
        if a.is_multiple_of(4) && left >= 4 {
            let v = (src as *const u32).read_unaligned();
            AtomicU32::from_ptr(dst as *mut u32).store(v, Ordering::Release);
            4
        } else if a.is_multiple_of(2) && left >= 2 {
            let v = (src as *const u16).read_unaligned();
            AtomicU16::from_ptr(dst as *mut u16).store(v, Ordering::Release);
            2
        } else {
            AtomicU8::from_ptr(dst).store(*src, Ordering::Release);
            1
        }
    }
}
