//! The DMA engine of DDS.
//!
//! The DPU never dereferences host memory. Everything it learns about the host (ring pointers,
//! requests) and everything it hands back (responses, ring pointers) moves by explicit,
//! batchable, asynchronous DMA reads and writes against memory regions that the host
//! registered beforehand. [`DmaEngine`] is that interface; a hardware engine (for example the
//! BlueField DOCA DMA library) can implement it as well as [`EmulatedDma`] does here.
//!
//! # Model
//! * The host creates a shared region (`dds_shm::SharedRegion`, a sealed `memfd` mapped
//!   `MAP_SHARED`) and passes its file descriptor to the DPU process over the control socket
//!   (`dds_sys::send_with_fds`, `dds_sys::recv_with_fds`). The DPU hands it to its engine as a
//!   [`RegionExport`] ([`DmaEngine::register_region`]) and from then on names it by the
//!   [`Region`] it gets back: a [`RegionId`] and the region's length, the bounds of every
//!   operation on it. This crate does not re-export the host's shared-memory type and the
//!   DPU-side crates do not depend on `dds-shm`, so DPU code cannot reach host memory other
//!   than by DMA.
//! * DPU-side memory that DMA copies into or out of is a [`LocalBuf`].
//! * An operation is [posted](DmaEngine::post), started by the next
//!   [`submit`](DmaEngine::submit) (the doorbell), and its completion is returned by
//!   [`poll`](DmaEngine::poll), in submission order. Nothing blocks. The DPU's data path
//!   posts the operations of all its rings, rings the doorbell once per service round, and
//!   consumes completions (matched by `user_data`) in a later step of the round or in a later
//!   round; [`run_sync`] is the convenience that spins until a batch is done, for tests,
//!   benchmarks and the control plane.
//!
//! # Emulation semantics
//! [`EmulatedDma`] performs the copy of an operation when it completes (inside `poll`), in
//! submission order. Host threads update ring pointers with atomics while the DPU copies, so
//! the copy itself must not be a data race in Rust terms: it is done with per-`u64` atomic
//! accesses on aligned words (narrower atomics, `u32` down to `u8`, for ragged edges, so a
//! 4-byte field read on its own is accessed as one `u32`). Ordering:
//! * a read (host → local) loads every word with `Acquire`, in ascending address order. A
//!   single PCIe read of a few cache lines returns them as one request; DDS relies on that when
//!   it fetches `Progress` and `Tail` with one read (`Progress` first), and relaxed loads would
//!   let the second word be older than the first in the language model (on x86 the two are the
//!   same instruction);
//! * a write (local → host) is preceded by `fence(Release)` and stores words with `Release`, in
//!   ascending address order: PCIe posted writes are not reordered, so a host thread that
//!   observes a later word of one write observes the earlier ones (DPU-KV's queue pairs signal
//!   a batch with an end marker, the last byte of the same operation);
//! * a `fence(SeqCst)` separates consecutive operations, so a later DMA read observes
//!   everything ordered before an earlier DMA write, as PCIe ordering gives (the response ring
//!   relies on this: write `Tail`, then read `Waiters`).
//!
//! The copies run on the thread that polls, so they are CPU time of the DPU process that a
//! hardware engine would not take; the engine counts it ([`DmaStats::execute_ns`], the DPU's
//! `dds stats` shows it) so that a measurement of the DPU's CPU can show that part.
//!
//! # Cost model
//! Without a cost model, a copy between two mappings of the same shared memory costs a few
//! nanoseconds, far less than a real PCIe DMA (about a microsecond of latency per operation on
//! BlueField-2, and a bandwidth cap). A design that issues one DMA per message (the FaRM-style
//! ring of the paper's Fig. 16) would then look as good as one that batches, which it is not on
//! real hardware. [`CostModel`] restores the difference: each operation has a fixed cost and a
//! bandwidth cost, and the engine processes operations one after another:
//!
//! ```text
//! completion_time(op) = max(now_at_submit, engine_busy_until) + per_op_ns + len / bytes_per_sec
//! engine_busy_until   = completion_time(op)
//! ```
//!
//! `poll` completes the operations whose completion time has passed, so a poller observes a
//! real per-operation latency and the engine a bandwidth cap. [`CostModel::bluefield2`] is
//! 1 000 ns per operation and 12 GB/s. With no cost model, operations complete on the first
//! `poll` after their `submit`.

mod emulated;

use std::os::fd::OwnedFd;

pub use emulated::EmulatedDma;

/// DPU-local memory that DMA operations copy into or out of (`dds-sys`'s aligned buffer).
pub type LocalBuf = dds_sys::AlignedBuf;

/// A host memory region registered with a DMA engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionId(pub u32);

/// What the host exports so that a DMA engine can reach one of its memory regions.
///
/// For the emulated engine, a shared-memory object (`memfd`, sealed against resizing) and its
/// length, received from the host over `SCM_RIGHTS`. A hardware engine takes its own export
/// descriptor in the same role (on BlueField, the blob of a host `doca_mmap` export).
#[derive(Debug)]
pub struct RegionExport {
    pub(crate) fd: OwnedFd,
    pub(crate) len: u64,
}

impl RegionExport {
    /// A `memfd` of (at least) `len` bytes.
    pub fn memfd(fd: OwnedFd, len: u64) -> Self {
        RegionExport { fd, len }
    }

    /// Bytes of the exported region.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if the region is empty (the engine refuses to register it).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A region registered with a DMA engine: how DPU-side code names host memory. The length is
/// the bound of every operation on the region, learned at registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub id: RegionId,
    pub len: u64,
}

impl Region {
    /// Whether `[offset, offset + len)` lies inside the region.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }
}

/// Counters of a DMA engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaStats {
    /// Completed read operations.
    pub reads: u64,
    /// Completed write operations.
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// `submit` calls that started at least one operation.
    pub doorbells: u64,
    /// Nanoseconds the polling thread spent executing completed operations: the emulated
    /// engine's copies, CPU time a hardware engine takes off the DPU's cores (0 for one).
    pub execute_ns: u64,
}

/// Direction of a DMA operation, seen from the DPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaDir {
    /// Host region → local buffer.
    Read,
    /// Local buffer → host region.
    Write,
}

/// One DMA operation.
#[derive(Clone, Copy, Debug)]
pub struct DmaOp {
    pub dir: DmaDir,
    pub region: RegionId,
    /// Byte offset in the registered region.
    pub remote_offset: u64,
    /// Local (DPU) memory: target of a read, source of a write.
    pub local: *mut u8,
    pub len: u32,
    /// Returned unchanged in the operation's completion.
    pub user_data: u64,
}

impl DmaOp {
    /// A read of `len` bytes at `remote_offset` of `region` into `local`.
    pub fn read(
        region: RegionId,
        remote_offset: u64,
        local: *mut u8,
        len: u32,
        user_data: u64,
    ) -> Self {
        DmaOp {
            dir: DmaDir::Read,
            region,
            remote_offset,
            local,
            len,
            user_data,
        }
    }

    /// A write of `len` bytes from `local` to `remote_offset` of `region`.
    pub fn write(
        region: RegionId,
        remote_offset: u64,
        local: *const u8,
        len: u32,
        user_data: u64,
    ) -> Self {
        DmaOp {
            dir: DmaDir::Write,
            region,
            remote_offset,
            local: local as *mut u8,
            len,
            user_data,
        }
    }
}

/// Completion of one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmaCompletion {
    pub user_data: u64,
    pub result: Result<(), DmaError>,
}

impl Default for DmaCompletion {
    /// A placeholder for completion arrays (`user_data` 0, success).
    fn default() -> Self {
        DmaCompletion {
            user_data: 0,
            result: Ok(()),
        }
    }
}

/// Errors of the DMA engine.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum DmaError {
    /// `max_inflight` operations are already posted or in flight.
    #[error("DMA queue full")]
    QueueFull,
    /// No region registered under this id (or it was unregistered before the op completed).
    #[error("unknown DMA region {0}")]
    UnknownRegion(u32),
    /// The operation reaches outside its region.
    #[error("DMA out of bounds: region {region}, offset {offset}, len {len}")]
    OutOfBounds { region: u32, offset: u64, len: u32 },
    /// Mapping a region failed (control plane).
    #[error("mapping a DMA region failed: {0}")]
    Map(String),
}

/// Emulated PCIe cost of DMA operations (see the crate documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostModel {
    /// Fixed cost of every operation (latency, descriptor processing).
    pub per_op_ns: u64,
    /// Transfer bandwidth of the engine.
    pub bytes_per_sec: u64,
}

impl CostModel {
    /// BlueField-2 DMA over PCIe: about 1 µs per operation, 12 GB/s.
    pub const fn bluefield2() -> Self {
        CostModel {
            per_op_ns: 1_000,
            bytes_per_sec: 12_000_000_000,
        }
    }

    /// Engine time one operation of `len` bytes occupies.
    pub fn op_ns(&self, len: u32) -> u64 {
        let xfer = if self.bytes_per_sec == 0 {
            0
        } else {
            (len as u128 * 1_000_000_000u128).div_ceil(self.bytes_per_sec as u128) as u64
        };
        self.per_op_ns + xfer
    }
}

/// A DMA engine: asynchronous, batchable copies between local buffers and registered host
/// regions.
pub trait DmaEngine: Send {
    /// Control plane: makes a host region reachable by DMA. Every operation on it is bounded
    /// by the returned [`Region`]'s length. Ids are not reused, so a stale id never reaches
    /// another region.
    ///
    /// Errors: `Map` (the export is unusable: for the emulated engine, not a sealed memfd of
    /// that size).
    fn register_region(&mut self, export: RegionExport) -> Result<Region, DmaError>;

    /// Control plane: forgets a region. Operations on it that have not completed yet
    /// complete with `UnknownRegion`; later posts fail with `UnknownRegion`.
    ///
    /// Errors: `UnknownRegion` if it is not registered.
    fn unregister_region(&mut self, id: RegionId) -> Result<(), DmaError>;

    /// Operations posted or in flight at most.
    fn max_inflight(&self) -> usize;

    /// Operations posted or in flight now (their completions not yet returned by `poll`).
    fn outstanding(&self) -> usize;

    /// Counters since the engine was created.
    fn stats(&self) -> DmaStats;

    /// Queues one operation; it is started by the next [`submit`](Self::submit) (doorbell).
    ///
    /// Errors: `QueueFull` when `max_inflight` operations are posted or in flight,
    /// `UnknownRegion`, `OutOfBounds` (checked here, at post).
    ///
    /// # Safety
    /// `local .. local + len` stays valid and is not accessed by the caller until the
    /// operation's completion is returned by [`poll`](Self::poll).
    unsafe fn post(&mut self, op: DmaOp) -> Result<(), DmaError>;

    /// Starts every posted operation.
    fn submit(&mut self);

    /// Writes completed operations (in submission order) into `out`, up to `out.len()`;
    /// returns how many.
    fn poll(&mut self, out: &mut [DmaCompletion]) -> usize;
}

/// Submits what is posted and spins on `poll` until the engine has no operation outstanding,
/// handing every completion to `f` (in completion order). For tests, benchmarks and the
/// control plane (for example before parking): the data path consumes completions as they
/// come instead.
pub fn wait_all(engine: &mut dyn DmaEngine, mut f: impl FnMut(DmaCompletion)) {
    let mut comps: [DmaCompletion; 16] = std::array::from_fn(|_| DmaCompletion::default());
    engine.submit();
    while engine.outstanding() > 0 {
        let n = engine.poll(&mut comps);
        for c in &mut comps[..n] {
            f(std::mem::take(c));
        }
        if n == 0 {
            std::hint::spin_loop();
        }
    }
}

/// Whether `engine` takes `n` more operations now (else posting them would see `QueueFull`).
pub fn has_room(engine: &dyn DmaEngine, n: usize) -> bool {
    engine.outstanding() + n <= engine.max_inflight()
}

/// Posts all `ops`, submits, and spins on `poll` until all are complete; returns the first
/// error. Ops beyond the engine's queue depth are run in several doorbells.
///
/// The engine must have no other operations posted or in flight: their completions would be
/// consumed here. This is checked (completions are matched against `ops` by `user_data`, in
/// order) and a foreign completion panics.
///
/// If posting fails (for example `OutOfBounds`), the operations already posted are still run
/// to completion before the error is returned, so no local buffer is left in use.
///
/// # Safety
/// As for [`DmaEngine::post`], for every op.
pub unsafe fn run_sync(engine: &mut dyn DmaEngine, ops: &[DmaOp]) -> Result<(), DmaError> {
    let mut first_err: Option<DmaError> = None;
    let mut comps: [DmaCompletion; 16] = std::array::from_fn(|_| DmaCompletion::default());
    let mut next_post = 0usize; // index of the next op to post
    let mut next_done = 0usize; // index of the next op expected to complete
    let mut stop_posting = false;
    while next_done < next_post || (!stop_posting && next_post < ops.len()) {
        // Post as many as the queue takes.
        let mut posted_now = 0usize;
        while !stop_posting && next_post < ops.len() {
            // SAFETY: forwarded from the caller.
            match unsafe { engine.post(ops[next_post]) } {
                Ok(()) => {
                    next_post += 1;
                    posted_now += 1;
                }
                Err(DmaError::QueueFull) => break,
                Err(e) => {
                    first_err.get_or_insert(e);
                    stop_posting = true;
                }
            }
        }
        if posted_now > 0 {
            engine.submit();
        }
        assert!(
            next_done < next_post || stop_posting || next_post == ops.len(),
            "run_sync: the engine accepts no operation (queue full of foreign operations?)"
        );
        // Wait for everything posted so far.
        while next_done < next_post {
            let n = engine.poll(&mut comps);
            for c in &mut comps[..n] {
                assert!(
                    next_done < next_post && c.user_data == ops[next_done].user_data,
                    "run_sync: completion of an operation it did not post"
                );
                if let Err(e) = std::mem::replace(&mut c.result, Ok(())) {
                    first_err.get_or_insert(e);
                }
                next_done += 1;
            }
            if n == 0 {
                std::hint::spin_loop();
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
