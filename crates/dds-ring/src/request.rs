//! The request ring (MPSC): host producers and the DPU consumer.

use std::ops::Range;
use std::sync::Arc;

use dds_dma::{has_room, wait_all, DmaEngine, DmaError, DmaOp, LocalBuf, Region, RegionId};
use dds_shm::SharedRegion;

use crate::format::{
    fits, header_len_for, valid_capacity, Placement, KIND_PAD, POINTER_AREA_BYTES, RECORD_ALIGN,
    REQ_HEAD, REQ_POINTER_READ, REQ_PROGRESS, REQ_SLEEPING, REQ_TAIL,
};
use crate::mem::{parse_frame, RingMem};
use crate::protocol::{fetch_decision, RequestPtrs};
use crate::{RingError, RingFault};

/// Host side of a request ring: shared by any number of producer threads (`Send + Sync`).
///
/// Inserting never allocates and never blocks: a CAS on `Tail` reserves space, the record is
/// written in place, a `fetch_add` on `Progress` publishes it (Fig. 8a).
pub struct RequestProducer {
    mem: RingMem,
    max_inflight: u64,
    _region: Option<Arc<SharedRegion>>,
}

impl RequestProducer {
    /// A producer for the ring whose pointer area starts at `base`, with `capacity` data bytes
    /// and at most `max_inflight_bytes` (`M`, ≤ capacity) between `Head` and `Tail`.
    ///
    /// # Safety
    /// `base` is 64-byte aligned and valid for `POINTER_AREA_BYTES + capacity` bytes of shared
    /// memory for the producer's lifetime, accessed by others only through the ring protocol.
    ///
    /// # Panics
    /// If the geometry is invalid (`docs/ring-format.md`).
    pub unsafe fn new(base: *mut u8, capacity: u64, max_inflight_bytes: u64) -> Self {
        assert!(
            (RECORD_ALIGN as u64..=capacity).contains(&max_inflight_bytes),
            "max in-flight bytes {max_inflight_bytes} must be in 8..=capacity"
        );
        RequestProducer {
            // SAFETY: forwarded from the caller.
            mem: unsafe { RingMem::new(base, capacity) },
            max_inflight: max_inflight_bytes,
            _region: None,
        }
    }

    /// A producer for the ring at byte `offset` of `region` (kept alive by the producer).
    ///
    /// # Panics
    /// If the ring does not lie inside the region or the geometry is invalid.
    pub fn with_region(
        region: Arc<SharedRegion>,
        offset: usize,
        capacity: u64,
        max_inflight_bytes: u64,
    ) -> Self {
        check_bounds(&region, offset, capacity);
        // SAFETY: inside the region, which the producer keeps alive; the base is page aligned.
        let mut p = unsafe { Self::new(region.as_ptr().add(offset), capacity, max_inflight_bytes) };
        p._region = Some(region);
        p
    }

    /// After publishing records: whether the consumer is parked (its `Sleeping` word is set),
    /// so the producer must ring the group's doorbell. The fence pairs with the consumer's
    /// order (write `Sleeping`, then read `Progress`): either this load sees the word or the
    /// consumer's last poll sees the record.
    pub fn consumer_sleeping(&self) -> bool {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.mem
            .counter32(REQ_SLEEPING)
            .load(std::sync::atomic::Ordering::Relaxed)
            != 0
    }

    /// Zeroes the pointer area. Only before the DPU attaches and before any insertion.
    pub fn init(&self) {
        self.mem.zero_pointers();
    }

    pub fn capacity(&self) -> u64 {
        self.mem.capacity()
    }

    pub fn max_inflight(&self) -> u64 {
        self.max_inflight
    }

    /// Current `Head` (bytes the DPU is done with).
    pub fn head(&self) -> u64 {
        self.mem
            .counter(REQ_HEAD)
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Current `Progress` (bytes published).
    pub fn progress(&self) -> u64 {
        self.mem
            .counter(REQ_PROGRESS)
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Current `Tail` (bytes reserved).
    pub fn tail(&self) -> u64 {
        self.mem
            .counter(REQ_TAIL)
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether a record of this shape can ever be inserted (else `TooLarge`).
    pub fn fits(&self, header_len: u32, data_len: u32, data_align: u32) -> bool {
        fits(self.capacity(), header_len, data_len, data_align)
    }

    fn ptrs(&self) -> RequestPtrs<'_> {
        RequestPtrs {
            head: self.mem.counter(REQ_HEAD),
            progress: self.mem.counter(REQ_PROGRESS),
            tail: self.mem.counter(REQ_TAIL),
        }
    }

    /// Inserts one record of kind `kind` (≠ PAD): `header` is the owner's header after the 6
    /// framing bytes (bytes `6..`, padded with zeroes to a multiple of 8), `data` is gathered
    /// from the slices in order, and starts at a multiple of `data_align` in the ring.
    ///
    /// Copy: the header and the data are copied into the ring here; this is the only copy on
    /// the host side (the DPU then fetches the record by DMA and uses it in place).
    ///
    /// Returns the running count where the record starts.
    pub fn try_push(
        &self,
        kind: u16,
        header: &[u8],
        data: &[&[u8]],
        data_align: u32,
    ) -> Result<u64, RingError> {
        let header_len =
            u32::try_from(header_len_for(header.len())).map_err(|_| RingError::TooLarge)?;
        let mut data_len = 0u32;
        for d in data {
            let n = u32::try_from(d.len()).map_err(|_| RingError::TooLarge)?;
            data_len = data_len.checked_add(n).ok_or(RingError::TooLarge)?;
        }
        let mut r = self.reserve(kind, header_len, data_len, data_align)?;
        r.header_mut()[..header.len()].copy_from_slice(header);
        let dst = r.data_mut();
        let mut at = 0;
        for d in data {
            dst[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
        let pos = r.placement().header_at;
        r.commit();
        Ok(pos)
    }

    /// Reserves a record of `header_len` bytes (a multiple of 8, framing included) and
    /// `data_len` data bytes aligned to `data_align`, for the caller to fill in place. Its
    /// framing is written, the rest of the header and the padding after the data are zero.
    ///
    /// The record is published by [`Reservation::commit`]; dropping the reservation instead
    /// turns it into a PAD (the space must be published either way, or the consumer would
    /// wait for it forever), so keep the time between the two short.
    pub fn reserve(
        &self,
        kind: u16,
        header_len: u32,
        data_len: u32,
        data_align: u32,
    ) -> Result<Reservation<'_>, RingError> {
        assert_ne!(kind, KIND_PAD, "records of kind 0 are PADs");
        let placement = self.ptrs().reserve(
            self.capacity(),
            self.max_inflight,
            header_len,
            data_len,
            data_align,
        )?;
        let len = placement.record_len();
        // SAFETY: the reservation [start, end) is ours alone until we publish it.
        unsafe {
            for (pos, plen) in placement.pads.iter().flatten() {
                self.mem.write_pad(*pos, *plen);
            }
            // The framing word also zeroes bytes 6..8.
            self.mem.write_frame(placement.header_at, len, kind);
            if header_len > 8 {
                self.mem
                    .slice_mut(placement.header_at + 8, header_len as usize - 8)
                    .fill(0);
            }
            let data_end = placement.data_at(header_len) + data_len as u64;
            for b in self
                .mem
                .slice_mut(data_end, (placement.end - data_end) as usize)
            {
                *b = 0; // at most 7 bytes
            }
        }
        Ok(Reservation {
            producer: self,
            placement,
            header_len,
            data_len,
            committed: false,
        })
    }
}

fn check_bounds(region: &SharedRegion, offset: usize, capacity: u64) {
    assert!(valid_capacity(capacity), "invalid ring capacity {capacity}");
    assert_eq!(offset % 64, 0, "ring offset {offset} not 64-byte aligned");
    let end = offset as u64 + POINTER_AREA_BYTES as u64 + capacity;
    assert!(
        end <= region.len() as u64,
        "ring ends at {end}, beyond its region"
    );
}

impl std::fmt::Debug for RequestProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestProducer")
            .field("capacity", &self.capacity())
            .field("max_inflight", &self.max_inflight)
            .field("head", &self.head())
            .field("progress", &self.progress())
            .field("tail", &self.tail())
            .finish()
    }
}

/// Space reserved in the request ring, filled in place, published by [`commit`](Self::commit).
pub struct Reservation<'a> {
    producer: &'a RequestProducer,
    placement: Placement,
    header_len: u32,
    data_len: u32,
    committed: bool,
}

impl Reservation<'_> {
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The header after the framing: record bytes `6..header_len`.
    pub fn header_mut(&mut self) -> &mut [u8] {
        // SAFETY: inside our reservation; `&mut self` prevents a second borrow.
        unsafe {
            self.producer
                .mem
                .slice_mut(self.placement.header_at + 6, self.header_len as usize - 6)
        }
    }

    /// The data bytes (at the requested alignment).
    pub fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe {
            self.producer.mem.slice_mut(
                self.placement.data_at(self.header_len),
                self.data_len as usize,
            )
        }
    }

    /// Publishes the record (Fig. 8a, line 6).
    pub fn commit(mut self) {
        self.committed = true;
        self.producer.ptrs().commit(&self.placement);
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            // Abandoned: publish the space as a PAD so the consumer skips it.
            // SAFETY: still our reservation.
            unsafe {
                self.producer
                    .mem
                    .write_pad(self.placement.header_at, self.placement.record_len())
            };
            self.producer.ptrs().commit(&self.placement);
        }
    }
}

/// One record fetched into the DPU's mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Running count where the record starts.
    pub pos: u64,
    pub kind: u16,
    /// The whole record (framing included), in the mirror.
    pub bytes: &'a [u8],
}

/// Iterator over the non-PAD records of a range of the mirror; see
/// [`RequestConsumer::records`]. Yields one `Err` and stops if the framing is broken.
pub struct Records<'a> {
    mirror: &'a [u8],
    pos: u64,
    end: u64,
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, RingFault>;

    fn next(&mut self) -> Option<Self::Item> {
        let capacity = self.mirror.len() as u64;
        while !self.failed && self.pos < self.end {
            let at = (self.pos % capacity) as usize;
            let (len, kind) = parse_frame(&self.mirror[at..at + 8]);
            let sane = len >= RECORD_ALIGN
                && len % RECORD_ALIGN == 0
                && at as u64 + len as u64 <= capacity
                && self.pos + len as u64 <= self.end;
            if !sane {
                self.failed = true;
                return Some(Err(RingFault::Corrupt(
                    "bad record length in the request ring",
                )));
            }
            let rec = Record {
                pos: self.pos,
                kind,
                bytes: &self.mirror[at..at + len as usize],
            };
            self.pos += len as u64;
            if kind != KIND_PAD {
                return Some(Ok(rec));
            }
        }
        None
    }
}

/// DPU side of a request ring: fetches new records by DMA into a local mirror of the data
/// area (same positions, exactly the ring's size) and releases them by writing `Head`.
///
/// Every DMA is split into a *post* step, which queues the operations in the engine (stamped
/// with the caller's `user_data`) and returns how many it queued, and a *complete* step, which
/// the caller invokes with the result of each of those operations' completions, in order. The
/// caller rings the engine's doorbell and routes completions, so one doorbell can carry the
/// operations of many rings. [`poll`](Self::poll), [`release`](Self::release) and
/// [`set_sleeping`](Self::set_sleeping) are synchronous conveniences over the same steps (the
/// engine must have no other operations outstanding), for tests and benchmarks.
pub struct RequestConsumer {
    region: RegionId,
    offset: u64,
    capacity: u64,
    mirror: LocalBuf,
    /// DMA staging: `[0, 128)` receives `Progress`..`Tail`, `[128, 136)` holds the `Head` to
    /// write, `[136, 140)` the `Sleeping` word to write.
    ptrs: LocalBuf,
    fetched: u64,
    released: u64,
    fetch: FetchState,
    /// `Head` the owner wants written ([`release_to`](Self::release_to)), ≥ `released`.
    release_target: u64,
    /// A `Head` write is in flight.
    head_writing: bool,
    /// `Sleeping` as the owner wants it, and as last posted.
    sleeping_target: bool,
    sleeping_posted: bool,
    /// A `Sleeping` write is in flight.
    sleeping_writing: bool,
    /// Operations posted and not completed.
    inflight: usize,
}

/// Where the fetch cycle (Fig. 8b) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FetchState {
    /// Nothing in flight: the next step reads `Progress`+`Tail`.
    Idle,
    /// The read of `Progress`+`Tail` is in flight.
    Pointers,
    /// New bytes up to this `Tail` are published: the next step reads them.
    Ready(u64),
    /// The data reads up to `tail` are in flight, `left` of them not completed; `ok` while
    /// none failed.
    Data { tail: u64, left: u8, ok: bool },
}

const HEAD_STAGING: usize = 128;
const SLEEPING_STAGING: usize = 136;

/// Checks that a ring of `capacity` data bytes at `offset` lies inside `region`.
pub(crate) fn check_layout(region: &Region, offset: u64, capacity: u64) -> Result<(), RingFault> {
    if !valid_capacity(capacity) {
        return Err(RingFault::Layout("invalid ring capacity"));
    }
    if !offset.is_multiple_of(64) {
        return Err(RingFault::Layout("ring offset not 64-byte aligned"));
    }
    if !region.contains(offset, POINTER_AREA_BYTES as u64 + capacity) {
        return Err(RingFault::Layout("ring outside its region"));
    }
    Ok(())
}

/// Posts `ops` if the engine has room for all of them (else none, returns 0).
///
/// # Safety
/// As for [`DmaEngine::post`], for every op.
pub(crate) unsafe fn post_all(
    engine: &mut dyn DmaEngine,
    ops: &[DmaOp],
    inflight: &mut usize,
) -> Result<usize, RingFault> {
    if !has_room(engine, ops.len()) {
        return Ok(0);
    }
    for op in ops {
        // SAFETY: forwarded from the caller.
        unsafe { engine.post(*op)? };
        *inflight += 1;
    }
    Ok(ops.len())
}

/// Accounts one completion of a ring operation; `Err` for a completion nobody posted.
pub(crate) fn take_completion(
    inflight: &mut usize,
    result: Result<(), DmaError>,
) -> Result<(), RingFault> {
    *inflight = inflight
        .checked_sub(1)
        .ok_or(RingFault::Corrupt("DMA completion without an operation"))?;
    Ok(result?)
}

/// Submits and consumes every completion of `engine` with `f` (the engine must have no other
/// operations outstanding); the first error wins.
pub(crate) fn complete_sync(
    engine: &mut dyn DmaEngine,
    mut f: impl FnMut(Result<(), DmaError>) -> Result<(), RingFault>,
) -> Result<(), RingFault> {
    let mut first = Ok(());
    wait_all(engine, |c| {
        if let Err(e) = f(c.result) {
            if first.is_ok() {
                first = Err(e);
            }
        }
    });
    first
}

impl RequestConsumer {
    /// A consumer of the (freshly initialized) ring at byte `ring_offset` of `region`.
    ///
    /// Errors: `Layout` if the ring does not lie inside the region or its capacity is not
    /// valid.
    pub fn new(region: Region, ring_offset: u64, capacity: u64) -> Result<Self, RingFault> {
        check_layout(&region, ring_offset, capacity)?;
        Ok(RequestConsumer {
            region: region.id,
            offset: ring_offset,
            capacity,
            // 4096-aligned so that data placed at an aligned ring position is at an aligned
            // address (O_DIRECT straight from the mirror).
            mirror: LocalBuf::new(capacity as usize, 4096),
            ptrs: LocalBuf::new(256, 64),
            fetched: 0,
            released: 0,
            fetch: FetchState::Idle,
            release_target: 0,
            head_writing: false,
            sleeping_target: false,
            sleeping_posted: false,
            sleeping_writing: false,
            inflight: 0,
        })
    }

    pub fn region(&self) -> RegionId {
        self.region
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes fetched into the mirror so far (running count).
    pub fn fetched(&self) -> u64 {
        self.fetched
    }

    /// Bytes released to the producers (the last `Head` posted).
    pub fn released(&self) -> u64 {
        self.released
    }

    /// DMA operations of this ring posted and not completed. Its buffers must outlive them.
    pub fn dma_inflight(&self) -> usize {
        self.inflight
    }

    /// Whether a fetch cycle is under way (a read in flight or new bytes waiting to be read).
    pub fn fetching(&self) -> bool {
        self.fetch != FetchState::Idle
    }

    /// Base of the mirror: position `x` of the data area is at `mirror_ptr() + x % capacity`.
    /// For in-place execution of write data (zero copy).
    pub fn mirror_ptr(&self) -> *mut u8 {
        self.mirror.as_mut_ptr()
    }

    /// Posts the next step of the fetch cycle (Fig. 8b), stamped `user_data`: when idle, one
    /// DMA read of `Progress`+`Tail`; when those showed new published bytes, the DMA read(s) of
    /// the bytes into the mirror (two at the wrap). Returns the operations posted: 0 when a
    /// step is in flight or the engine is full (post again later).
    pub fn post_fetch(
        &mut self,
        engine: &mut dyn DmaEngine,
        user_data: u64,
    ) -> Result<usize, RingFault> {
        match self.fetch {
            FetchState::Idle => {
                let (off, len) = REQ_POINTER_READ;
                let read = DmaOp::read(
                    self.region,
                    self.offset + off as u64,
                    self.ptrs.as_mut_ptr(),
                    len as u32,
                    user_data,
                );
                // SAFETY: the pointer staging is not touched until the read completes
                // (`complete_fetch` reads it then).
                let n = unsafe { post_all(engine, &[read], &mut self.inflight)? };
                if n > 0 {
                    self.fetch = FetchState::Pointers;
                }
                Ok(n)
            }
            FetchState::Ready(tail) => {
                // Copy (DMA): the new bytes land in the mirror at the same positions; producers
                // never reserve past Head + capacity, so they do not overlap [released,
                // fetched).
                let mut ops = [DmaOp::read(self.region, 0, std::ptr::null_mut(), 0, 0); 2];
                let k = self.data_ops(self.fetched, tail, dds_dma::DmaDir::Read, &mut ops);
                for op in &mut ops[..k] {
                    op.user_data = user_data;
                }
                // SAFETY: the mirror range is not in use: it lies outside [released, fetched)
                // and is not read before the reads complete.
                let n = unsafe { post_all(engine, &ops[..k], &mut self.inflight)? };
                if n > 0 {
                    self.fetch = FetchState::Data {
                        tail,
                        left: n as u8,
                        ok: true,
                    };
                }
                Ok(n)
            }
            FetchState::Pointers | FetchState::Data { .. } => Ok(0),
        }
    }

    /// Completes one operation posted by [`post_fetch`](Self::post_fetch). Returns true when
    /// this completion brought new bytes into the mirror ([`fetched`](Self::fetched) moved).
    /// A failed read ends the cycle with the error.
    pub fn complete_fetch(&mut self, result: Result<(), DmaError>) -> Result<bool, RingFault> {
        let r = take_completion(&mut self.inflight, result);
        match self.fetch {
            FetchState::Pointers => {
                self.fetch = FetchState::Idle;
                r?;
                let s = self.ptrs.as_slice();
                let progress = u64::from_le_bytes(s[0..8].try_into().expect("8 bytes"));
                let tail = u64::from_le_bytes(s[64..72].try_into().expect("8 bytes"));
                if let Some(tail) =
                    fetch_decision(progress, tail, self.fetched, self.released, self.capacity)
                        .map_err(RingFault::Corrupt)?
                {
                    self.fetch = FetchState::Ready(tail);
                }
                Ok(false)
            }
            FetchState::Data { tail, left, ok } => {
                // `left` ≥ 1 while reads are in flight.
                let left = left.saturating_sub(1);
                let ok = ok && r.is_ok();
                self.fetch = if left == 0 {
                    FetchState::Idle
                } else {
                    FetchState::Data { tail, left, ok }
                };
                r?;
                // A cycle with a failed read does not advance: the caller stops the ring.
                if left == 0 && ok {
                    self.fetched = tail;
                    return Ok(true);
                }
                Ok(false)
            }
            FetchState::Idle | FetchState::Ready(_) => {
                r?;
                Err(RingFault::Corrupt("fetch completion without a fetch"))
            }
        }
    }

    /// Fig. 8b, synchronously: one DMA read of `Progress`+`Tail`; if they are equal and
    /// something is new, DMA-reads the new bytes into the mirror (two reads at the wrap).
    /// Returns whether new bytes arrived; `false` also when producers are still writing (retry
    /// later). The engine must have no other operations outstanding.
    pub fn poll(&mut self, engine: &mut dyn DmaEngine) -> Result<bool, RingFault> {
        let mut new = false;
        // Pointers, then (if something is new) the data.
        for _ in 0..2 {
            if self.post_fetch(engine, 0)? == 0 {
                break;
            }
            complete_sync(engine, |r| {
                new |= self.complete_fetch(r)?;
                Ok(())
            })?;
            if !matches!(self.fetch, FetchState::Ready(_)) {
                break;
            }
        }
        Ok(new)
    }

    /// DMA ops moving data-area range `[from, to)` between the ring and the mirror.
    fn data_ops(&self, from: u64, to: u64, dir: dds_dma::DmaDir, ops: &mut [DmaOp; 2]) -> usize {
        data_ops(
            self.region,
            self.offset,
            self.capacity,
            &self.mirror,
            from,
            to,
            dir,
            ops,
        )
    }

    /// The non-PAD records in `range` (running counts within `[released, fetched]`, on record
    /// boundaries), from the mirror.
    pub fn records(&self, range: Range<u64>) -> Records<'_> {
        assert!(
            self.released <= range.start && range.start <= range.end && range.end <= self.fetched,
            "records {range:?} outside the fetched bytes [{}, {})",
            self.released,
            self.fetched
        );
        Records {
            mirror: self.mirror.as_slice(),
            pos: range.start,
            end: range.end,
            failed: false,
        }
    }

    /// Parking (adaptive polling): the ring's `Sleeping` word should be `sleeping`; written by
    /// [`post_sleeping`](Self::post_sleeping). While it is set, a producer that publishes a
    /// record rings the group's doorbell ([`RequestProducer::consumer_sleeping`]). After
    /// setting it, the consumer must poll once more before it blocks: a record published
    /// before the producer could see the word is found by that poll (the DMA engine orders a
    /// write before a later read).
    pub fn want_sleeping(&mut self, sleeping: bool) {
        self.sleeping_target = sleeping;
    }

    /// Posts the write of the `Sleeping` word if it differs from the last one posted and no
    /// write of it is in flight. Returns the operations posted (0 or 1).
    pub fn post_sleeping(
        &mut self,
        engine: &mut dyn DmaEngine,
        user_data: u64,
    ) -> Result<usize, RingFault> {
        if self.sleeping_writing || self.sleeping_target == self.sleeping_posted {
            return Ok(0);
        }
        let word = u32::from(self.sleeping_target).to_le_bytes();
        let n =
            self.post_pointer_write(engine, SLEEPING_STAGING, REQ_SLEEPING, &word, user_data)?;
        if n > 0 {
            self.sleeping_writing = true;
            self.sleeping_posted = self.sleeping_target;
        }
        Ok(n)
    }

    /// Completes the write posted by [`post_sleeping`](Self::post_sleeping).
    pub fn complete_sleeping(&mut self, result: Result<(), DmaError>) -> Result<(), RingFault> {
        if !self.sleeping_writing {
            return Err(RingFault::Corrupt("Sleeping completion without a write"));
        }
        self.sleeping_writing = false;
        take_completion(&mut self.inflight, result)
    }

    /// [`want_sleeping`](Self::want_sleeping) and the write, synchronously (the engine must
    /// have no other operations outstanding).
    pub fn set_sleeping(
        &mut self,
        sleeping: bool,
        engine: &mut dyn DmaEngine,
    ) -> Result<(), RingFault> {
        self.want_sleeping(sleeping);
        // Written even if unchanged: the synchronous call states the word.
        self.sleeping_posted = !sleeping;
        if self.post_sleeping(engine, 0)? == 0 {
            return Err(RingFault::Dma(DmaError::QueueFull));
        }
        complete_sync(engine, |r| self.complete_sleeping(r))
    }

    /// Gives the bytes below `upto` (a record boundary, ≤ `fetched`) back to the producers,
    /// by the next [`post_release`](Self::post_release). Only once the records there are done
    /// with (write data is executed in place from the mirror). Below the last target, it
    /// changes nothing.
    pub fn release_to(&mut self, upto: u64) {
        assert!(
            upto <= self.fetched,
            "release to {upto} beyond the fetched bytes ({})",
            self.fetched
        );
        self.release_target = self.release_target.max(upto);
    }

    /// Posts one DMA write of `Head` up to the last [`release_to`](Self::release_to), unless
    /// one is in flight or nothing is new. Returns the operations posted (0 or 1).
    pub fn post_release(
        &mut self,
        engine: &mut dyn DmaEngine,
        user_data: u64,
    ) -> Result<usize, RingFault> {
        if self.head_writing || self.release_target == self.released {
            return Ok(0);
        }
        let upto = self.release_target;
        let n = self.post_pointer_write(
            engine,
            HEAD_STAGING,
            REQ_HEAD,
            &upto.to_le_bytes(),
            user_data,
        )?;
        if n > 0 {
            self.head_writing = true;
            // The DPU is done with these bytes from now on; the host may reuse them as soon as
            // the write lands.
            self.released = upto;
        }
        Ok(n)
    }

    /// Posts one DMA write of `bytes`, staged at `staging` of the pointer buffer, to the
    /// pointer-area field at `field`. Returns the operations posted (0 if the engine is full).
    fn post_pointer_write(
        &mut self,
        engine: &mut dyn DmaEngine,
        staging: usize,
        field: usize,
        bytes: &[u8],
        user_data: u64,
    ) -> Result<usize, RingFault> {
        self.ptrs.as_mut_slice()[staging..staging + bytes.len()].copy_from_slice(bytes);
        let write = DmaOp::write(
            self.region,
            self.offset + field as u64,
            self.ptrs.as_ptr().wrapping_add(staging),
            bytes.len() as u32,
            user_data,
        );
        // SAFETY: the callers write a staging field again only once its write completed.
        unsafe { post_all(engine, &[write], &mut self.inflight) }
    }

    /// Completes the write posted by [`post_release`](Self::post_release).
    pub fn complete_release(&mut self, result: Result<(), DmaError>) -> Result<(), RingFault> {
        if !self.head_writing {
            return Err(RingFault::Corrupt("Head completion without a write"));
        }
        self.head_writing = false;
        take_completion(&mut self.inflight, result)
    }

    /// [`release_to`](Self::release_to) and the write of `Head`, synchronously (the engine
    /// must have no other operations outstanding).
    pub fn release(&mut self, upto: u64, engine: &mut dyn DmaEngine) -> Result<(), RingFault> {
        self.release_to(upto);
        if self.post_release(engine, 0)? == 0 {
            if self.release_target == self.released {
                return Ok(());
            }
            return Err(RingFault::Dma(DmaError::QueueFull));
        }
        complete_sync(engine, |r| self.complete_release(r))
    }
}

impl std::fmt::Debug for RequestConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestConsumer")
            .field("region", &self.region)
            .field("offset", &self.offset)
            .field("capacity", &self.capacity)
            .field("fetched", &self.fetched)
            .field("released", &self.released)
            .finish()
    }
}

/// DMA ops moving data-area range `[from, to)` (at most one ring) between the ring at
/// `offset` of `region` and `mirror` at the same positions: one op, or two at the wrap.
#[allow(clippy::too_many_arguments)]
pub(crate) fn data_ops(
    region: RegionId,
    offset: u64,
    capacity: u64,
    mirror: &LocalBuf,
    from: u64,
    to: u64,
    dir: dds_dma::DmaDir,
    ops: &mut [DmaOp; 2],
) -> usize {
    assert!(
        from <= to && to - from <= capacity,
        "bad data range {from}..{to}"
    );
    let data = offset + POINTER_AREA_BYTES as u64;
    let at = from % capacity;
    let n = to - from;
    let first = n.min(capacity - at);
    let mut k = 0;
    for (pos, len) in [(at, first), (0, n - first)] {
        if len == 0 {
            continue;
        }
        ops[k] = DmaOp {
            dir,
            region,
            remote_offset: data + pos,
            // In bounds: pos + len ≤ capacity = mirror length.
            local: mirror.as_mut_ptr().wrapping_add(pos as usize),
            len: len as u32,
            user_data: k as u64,
        };
        k += 1;
    }
    k
}
