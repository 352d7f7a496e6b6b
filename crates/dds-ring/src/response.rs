//! The response ring (SPMC): the DPU producer and host consumers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dds_dma::{DmaDir, DmaEngine, DmaError, DmaOp, LocalBuf, Region, RegionId};
use dds_shm::SharedRegion;

use crate::format::{
    fits, place, valid_capacity, Placement, KIND_PAD, POINTER_AREA_BYTES, RESP_HEAD_CLAIM,
    RESP_HEAD_DONE, RESP_POINTER_READ, RESP_TAIL, RESP_WAITERS,
};
use crate::mem::{frame_bytes, RingMem};
use crate::protocol::{trusted_head, ResponsePtrs};
use crate::request::{check_layout, complete_sync, data_ops, post_all, take_completion};
use crate::RingFault;

/// Host side of a response ring: shared by any number of consumer threads (`Send + Sync`).
pub struct ResponseConsumer {
    mem: RingMem,
    _region: Option<Arc<SharedRegion>>,
}

impl ResponseConsumer {
    /// A consumer for the ring whose pointer area starts at `base`, with `capacity` data
    /// bytes.
    ///
    /// # Safety
    /// As for [`RequestProducer::new`](crate::RequestProducer::new).
    ///
    /// # Panics
    /// If the geometry is invalid.
    pub unsafe fn new(base: *mut u8, capacity: u64) -> Self {
        ResponseConsumer {
            // SAFETY: forwarded from the caller.
            mem: unsafe { RingMem::new(base, capacity) },
            _region: None,
        }
    }

    /// A consumer for the ring at byte `offset` of `region` (kept alive by the consumer).
    pub fn with_region(region: Arc<SharedRegion>, offset: usize, capacity: u64) -> Self {
        assert!(valid_capacity(capacity), "invalid ring capacity {capacity}");
        assert_eq!(offset % 64, 0, "ring offset {offset} not 64-byte aligned");
        let end = offset as u64 + POINTER_AREA_BYTES as u64 + capacity;
        assert!(
            end <= region.len() as u64,
            "ring ends at {end}, beyond its region"
        );
        // SAFETY: inside the region, which the consumer keeps alive; page-aligned base.
        let mut c = unsafe { Self::new(region.as_ptr().add(offset), capacity) };
        c._region = Some(region);
        c
    }

    /// Zeroes the pointer area. Only before the DPU attaches.
    pub fn init(&self) {
        self.mem.zero_pointers();
    }

    pub fn capacity(&self) -> u64 {
        self.mem.capacity()
    }

    fn ptrs(&self) -> ResponsePtrs<'_> {
        ResponsePtrs {
            tail: self.mem.counter(RESP_TAIL),
            head_done: self.mem.counter(RESP_HEAD_DONE),
            head_claim: self.mem.counter(RESP_HEAD_CLAIM),
        }
    }

    /// Claims the next record (skipping PADs) with a CAS on `HeadClaim`, calls `f` on its bytes
    /// (framing included) in the ring, then adds them to `HeadDone`. `None` when the ring is
    /// empty.
    ///
    /// Copy: whatever the caller needs out of the record is copied inside `f`; the bytes are
    /// the DPU's to reuse once `f` returns.
    pub fn try_pop<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let ptrs = self.ptrs();
        let claim = ptrs.claim(self.capacity(), |at| self.mem.frame_atomic(at))?;
        /// Advances `HeadDone` even if `f` panics, so the ring does not stall.
        struct Done<'a>(&'a ResponsePtrs<'a>, crate::protocol::Claim);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.finish(&self.1);
            }
        }
        let done = Done(&ptrs, claim);
        // SAFETY: the claimed record is ours until HeadDone covers it; the DPU never writes a
        // byte the host has not consumed.
        let bytes = unsafe { self.mem.slice(claim.pos, claim.len as usize) };
        let r = f(bytes);
        drop(done);
        Some(r)
    }

    /// Whether no unclaimed record is delivered (`HeadClaim == Tail`).
    ///
    /// The loads are `SeqCst` so that, after a `SeqCst` increment of
    /// [`waiters`](Self::waiters), this check and the DPU's read of `Waiters` after its `Tail`
    /// write cannot both miss each other.
    pub fn is_empty(&self) -> bool {
        let claim = self.mem.counter(RESP_HEAD_CLAIM).load(Ordering::SeqCst);
        claim >= self.mem.counter(RESP_TAIL).load(Ordering::SeqCst)
    }

    /// Before sleeping on the group's eventfd: counts this thread in `Waiters`, then re-checks
    /// the ring. Returns `true` if it is still empty (sleep; the DPU will signal after its next
    /// delivery); `false` if a record arrived meanwhile (do not sleep). Either way, call
    /// [`end_sleep`](Self::end_sleep) afterwards.
    pub fn announce_sleep(&self) -> bool {
        self.waiters().fetch_add(1, Ordering::SeqCst);
        // Pairs with the DPU's ordering between its Tail write and its Waiters read (DMA
        // operations are separated by SeqCst fences): one of the two sides sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.is_empty()
    }

    /// After [`announce_sleep`](Self::announce_sleep) (slept or not).
    pub fn end_sleep(&self) {
        let prev = self.waiters().fetch_sub(1, Ordering::SeqCst);
        assert!(prev > 0, "end_sleep without announce_sleep");
    }

    /// Current `Tail` (bytes delivered).
    pub fn tail(&self) -> u64 {
        self.mem.counter(RESP_TAIL).load(Ordering::Acquire)
    }

    /// Current `HeadDone` (bytes consumed).
    pub fn head_done(&self) -> u64 {
        self.mem.counter(RESP_HEAD_DONE).load(Ordering::Acquire)
    }

    /// The `Waiters` word: a thread about to sleep on the group's eventfd increments it
    /// (`SeqCst`), re-checks [`is_empty`](Self::is_empty), sleeps only if still empty, and
    /// decrements it when it wakes (`docs/ring-format.md`, "Sleeping");
    /// [`announce_sleep`](Self::announce_sleep) and [`end_sleep`](Self::end_sleep) do exactly
    /// that.
    pub fn waiters(&self) -> &AtomicU32 {
        self.mem.counter32(RESP_WAITERS)
    }
}

impl std::fmt::Debug for ResponseConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseConsumer")
            .field("capacity", &self.capacity())
            .field("tail", &self.tail())
            .field("head_done", &self.head_done())
            .finish()
    }
}

/// DPU side of a response ring. Records are allocated in a local mirror of the data area (same
/// positions) with [`place`] (`TailA`), filled there (read I/O lands in them directly), and
/// delivered by DMA (`TailC` = [`delivered`](Self::delivered)).
///
/// Its DMA is split into post and complete steps like the request consumer's
/// ([`RequestConsumer`](crate::RequestConsumer)); [`alloc`](Self::alloc),
/// [`refresh`](Self::refresh) and [`deliver`](Self::deliver) are the synchronous conveniences.
pub struct ResponseProducer {
    region: RegionId,
    offset: u64,
    capacity: u64,
    mirror: LocalBuf,
    /// DMA staging: `[0, 132)` receives `HeadDone`..`Waiters`, `[192, 200)` holds the `Tail`
    /// to write, `[200, 204)` receives `Waiters` after a delivery.
    ptrs: LocalBuf,
    allocated: u64,
    delivered: u64,
    /// Last `HeadDone` proven (by `HeadDone == HeadClaim`): everything below is consumed.
    freed: u64,
    /// A refresh read is in flight.
    refreshing: bool,
    /// A delivery up to `upto` is in flight, `left` of its operations not completed; `ok`
    /// while none failed.
    delivering: Option<Delivery>,
    /// Operations posted and not completed.
    inflight: usize,
}

#[derive(Clone, Copy, Debug)]
struct Delivery {
    upto: u64,
    left: u8,
    ok: bool,
}

const TAIL_STAGING: usize = 192;
const WAITERS_STAGING: usize = 200;

impl ResponseProducer {
    /// A producer for the (freshly initialized) ring at byte `ring_offset` of `region`.
    ///
    /// Errors: `Layout` if the ring does not lie inside the region or its capacity is not
    /// valid.
    pub fn new(region: Region, ring_offset: u64, capacity: u64) -> Result<Self, RingFault> {
        check_layout(&region, ring_offset, capacity)?;
        Ok(ResponseProducer {
            region: region.id,
            offset: ring_offset,
            capacity,
            // 4096-aligned: data at an aligned ring position is at an aligned address.
            mirror: LocalBuf::new(capacity as usize, 4096),
            ptrs: LocalBuf::new(256, 64),
            allocated: 0,
            delivered: 0,
            freed: 0,
            refreshing: false,
            delivering: None,
            inflight: 0,
        })
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// `TailA`: bytes allocated so far.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// `TailC`: bytes delivered to the host so far (the last `Tail` written and completed).
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Where the delivery in flight ends (else [`delivered`](Self::delivered)): records below
    /// are no longer the DPU's to change.
    pub fn delivering(&self) -> u64 {
        self.delivering.map_or(self.delivered, |d| d.upto)
    }

    /// The last proven `HeadDone`: bytes the host has consumed.
    pub fn freed(&self) -> u64 {
        self.freed
    }

    /// DMA operations of this ring posted and not completed. Its buffers must outlive them.
    pub fn dma_inflight(&self) -> usize {
        self.inflight
    }

    /// Base of the mirror: position `x` of the data area is at `mirror_ptr() + x % capacity`.
    pub fn mirror_ptr(&self) -> *mut u8 {
        self.mirror.as_mut_ptr()
    }

    /// The bytes of an allocated, undelivered record in the mirror (framing included).
    pub fn record_mut(&mut self, p: &Placement) -> &mut [u8] {
        assert!(
            self.delivering() <= p.header_at && p.end <= self.allocated,
            "record {}..{} not allocated or already delivered",
            p.header_at,
            p.end
        );
        let at = (p.header_at % self.capacity) as usize;
        &mut self.mirror.as_mut_slice()[at..at + p.record_len() as usize]
    }

    /// Allocates a record of kind `kind` (≠ PAD) with `header_len` bytes (a multiple of 8,
    /// framing included) and `data_len` data bytes aligned to `align`, at `TailA`, within the
    /// last proven `HeadDone`. Its PADs and framing are written into the mirror; the caller
    /// fills bytes `6..` and the data (through [`record_mut`](Self::record_mut) or
    /// [`mirror_ptr`](Self::mirror_ptr)). `Ok(None)` when the space is not known to be free:
    /// [`post_refresh`](Self::post_refresh) learns the host's progress.
    pub fn try_alloc(
        &mut self,
        kind: u16,
        header_len: u32,
        data_len: u32,
        align: u32,
    ) -> Result<Option<Placement>, RingFault> {
        assert_ne!(kind, KIND_PAD, "records of kind 0 are PADs");
        if !fits(self.capacity, header_len, data_len, align) {
            return Err(RingFault::TooLarge);
        }
        let p = place(self.allocated, self.capacity, header_len, data_len, align);
        if p.end - self.freed > self.capacity {
            return Ok(None);
        }
        let m = self.mirror.as_mut_slice();
        for (pos, len) in p.pads.iter().flatten() {
            let at = (pos % self.capacity) as usize;
            m[at..at + 8].copy_from_slice(&frame_bytes(*len, KIND_PAD));
        }
        let at = (p.header_at % self.capacity) as usize;
        m[at..at + 8].copy_from_slice(&frame_bytes(p.record_len(), kind));
        self.allocated = p.end;
        Ok(Some(p))
    }

    /// [`try_alloc`](Self::try_alloc), refreshing `HeadDone` synchronously (one DMA read) when
    /// the last proven one leaves too little room. The engine must have no other operations
    /// outstanding.
    pub fn alloc(
        &mut self,
        engine: &mut dyn DmaEngine,
        kind: u16,
        header_len: u32,
        data_len: u32,
        align: u32,
    ) -> Result<Option<Placement>, RingFault> {
        match self.try_alloc(kind, header_len, data_len, align)? {
            Some(p) => Ok(Some(p)),
            None => {
                self.refresh(engine)?;
                self.try_alloc(kind, header_len, data_len, align)
            }
        }
    }

    /// Posts one DMA read of `HeadDone`, `HeadClaim` and `Waiters`, unless one is in flight.
    /// Returns the operations posted (0 or 1).
    pub fn post_refresh(
        &mut self,
        engine: &mut dyn DmaEngine,
        user_data: u64,
    ) -> Result<usize, RingFault> {
        if self.refreshing {
            return Ok(0);
        }
        let read = DmaOp::read(
            self.region,
            self.offset + RESP_POINTER_READ.0 as u64,
            self.ptrs.as_mut_ptr(),
            RESP_POINTER_READ.1 as u32,
            user_data,
        );
        // SAFETY: the staging bytes are not read before the read completes.
        let n = unsafe { post_all(engine, &[read], &mut self.inflight)? };
        self.refreshing = n > 0;
        Ok(n)
    }

    /// Completes the read posted by [`post_refresh`](Self::post_refresh): if `HeadDone ==
    /// HeadClaim`, takes `HeadDone` as the new [`freed`](Self::freed). Returns `Waiters`.
    pub fn complete_refresh(&mut self, result: Result<(), DmaError>) -> Result<u32, RingFault> {
        if !self.refreshing {
            return Err(RingFault::Corrupt("refresh completion without a read"));
        }
        self.refreshing = false;
        take_completion(&mut self.inflight, result)?;
        let s = self.ptrs.as_slice();
        let done = u64::from_le_bytes(s[0..8].try_into().expect("8 bytes"));
        let claim = u64::from_le_bytes(s[64..72].try_into().expect("8 bytes"));
        let waiters = u32::from_le_bytes(s[128..132].try_into().expect("4 bytes"));
        // Completions come in submission order, so a delivery posted before this read has
        // completed (and moved `delivered`) by now.
        if let Some(h) = trusted_head(done, claim, self.delivered).map_err(RingFault::Corrupt)? {
            if h < self.freed {
                return Err(RingFault::Corrupt("HeadDone went backwards"));
            }
            self.freed = h;
        }
        Ok(waiters)
    }

    /// The refresh, synchronously (the engine must have no other operations outstanding).
    /// Returns `Waiters`.
    pub fn refresh(&mut self, engine: &mut dyn DmaEngine) -> Result<u32, RingFault> {
        if self.post_refresh(engine, 0)? == 0 {
            return Err(RingFault::Dma(DmaError::QueueFull));
        }
        let mut waiters = 0;
        complete_sync(engine, |r| {
            waiters = self.complete_refresh(r)?;
            Ok(())
        })?;
        Ok(waiters)
    }

    /// Posts the delivery of every record below `upto` (a record boundary, ≤ `TailA`, and all
    /// of them filled): DMA writes of mirror bytes `[delivered, upto)` (two at the wrap), then
    /// of `Tail`, then a read of `Waiters`. Returns the operations posted: 0 when nothing is
    /// new, a delivery is in flight or the engine is full (post again later).
    ///
    /// Copy (DMA): the responses move from the mirror to the host ring here, once.
    pub fn post_deliver(
        &mut self,
        upto: u64,
        engine: &mut dyn DmaEngine,
        user_data: u64,
    ) -> Result<usize, RingFault> {
        assert!(
            self.delivered <= upto && upto <= self.allocated,
            "deliver to {upto} outside [{}, {}]",
            self.delivered,
            self.allocated
        );
        if upto == self.delivered || self.delivering.is_some() {
            return Ok(0);
        }
        let mut data = [DmaOp::read(self.region, 0, std::ptr::null_mut(), 0, 0); 2];
        let n = data_ops(
            self.region,
            self.offset,
            self.capacity,
            &self.mirror,
            self.delivered,
            upto,
            DmaDir::Write,
            &mut data,
        );
        self.ptrs.as_mut_slice()[TAIL_STAGING..TAIL_STAGING + 8]
            .copy_from_slice(&upto.to_le_bytes());
        let staging = self.ptrs.as_mut_ptr();
        let mut ops = [data[0]; 4];
        ops[..n].copy_from_slice(&data[..n]);
        // Tail after the data: DMA operations complete in order.
        ops[n] = DmaOp::write(
            self.region,
            self.offset + RESP_TAIL as u64,
            staging.wrapping_add(TAIL_STAGING),
            8,
            0,
        );
        // Waiters after Tail: a thread that announced itself before our Tail write is seen.
        ops[n + 1] = DmaOp::read(
            self.region,
            self.offset + RESP_WAITERS as u64,
            staging.wrapping_add(WAITERS_STAGING),
            4,
            0,
        );
        for op in &mut ops[..n + 2] {
            op.user_data = user_data;
        }
        // SAFETY: the mirror range is delivered-only (nothing writes it until `freed` passes
        // it, which needs this delivery to complete) and the staging bytes are not touched
        // until the last operation completes.
        let posted = unsafe { post_all(engine, &ops[..n + 2], &mut self.inflight)? };
        if posted > 0 {
            self.delivering = Some(Delivery {
                upto,
                left: posted as u8,
                ok: true,
            });
        }
        Ok(posted)
    }

    /// Completes one operation posted by [`post_deliver`](Self::post_deliver). When the last
    /// one completes, [`delivered`](Self::delivered) moves and the result says whether a host
    /// thread sleeps (the caller then signals the group's eventfd): `Some(sleepers)`.
    pub fn complete_deliver(
        &mut self,
        result: Result<(), DmaError>,
    ) -> Result<Option<bool>, RingFault> {
        let Some(d) = self.delivering else {
            return Err(RingFault::Corrupt("delivery completion without a delivery"));
        };
        let r = take_completion(&mut self.inflight, result);
        // `left` ≥ 1 while operations are in flight.
        let left = d.left.saturating_sub(1);
        let ok = d.ok && r.is_ok();
        self.delivering = (left > 0).then_some(Delivery { left, ok, ..d });
        r?;
        if left > 0 || !ok {
            return Ok(None);
        }
        self.delivered = d.upto;
        let s = self.ptrs.as_slice();
        let waiters = u32::from_le_bytes(
            s[WAITERS_STAGING..WAITERS_STAGING + 4]
                .try_into()
                .expect("4 bytes"),
        );
        Ok(Some(waiters > 0))
    }

    /// The delivery, synchronously (the engine must have no other operations outstanding).
    /// Returns whether a host thread sleeps.
    pub fn deliver(&mut self, upto: u64, engine: &mut dyn DmaEngine) -> Result<bool, RingFault> {
        if upto == self.delivered {
            return Ok(false);
        }
        if self.post_deliver(upto, engine, 0)? == 0 {
            return Err(RingFault::Dma(DmaError::QueueFull));
        }
        let mut sleepers = false;
        complete_sync(engine, |r| {
            sleepers |= self.complete_deliver(r)?.unwrap_or(false);
            Ok(())
        })?;
        Ok(sleepers)
    }
}

impl std::fmt::Debug for ResponseProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseProducer")
            .field("region", &self.region)
            .field("offset", &self.offset)
            .field("capacity", &self.capacity)
            .field("allocated", &self.allocated)
            .field("delivered", &self.delivered)
            .field("freed", &self.freed)
            .finish()
    }
}
