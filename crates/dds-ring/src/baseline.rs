//! One message interface over the progress ring and the two baselines of the paper's Fig. 16:
//! a FaRM-style ring (a slot and a valid flag per message, two DMA operations per message) and
//! a lock-based ring (producers serialize on a host-side lock).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use dds_dma::{run_sync, DmaEngine, DmaOp, LocalBuf, Region, RegionId};
use dds_shm::SharedRegion;

use crate::format::{fits, place, POINTER_AREA_BYTES, REQ_HEAD, REQ_PROGRESS, REQ_TAIL};
use crate::mem::RingMem;
use crate::request::{RequestConsumer, RequestProducer};
use crate::{RingError, RingFault};

/// Record kind of messages sent through [`RingProducer`] on the progress and lock-based rings.
/// Their header is the 8 framing bytes, bytes 6..8 holding the padding after the message.
pub const MESSAGE_KIND: u16 = 1;

/// Host side of a message ring (shared by producer threads).
pub trait RingProducer: Send + Sync {
    /// Enqueues one message (copied into the ring). `Retry` when there is no room now.
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError>;
}

/// DPU side of a message ring.
pub trait RingConsumer: Send {
    /// Fetches what is available, calls `f` on every message in order, releases the space;
    /// returns the number of messages (0 = nothing now).
    fn poll_batch(
        &mut self,
        engine: &mut dyn DmaEngine,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingFault>;
}

/// The message inside a [`MESSAGE_KIND`] record.
fn message(record: &[u8]) -> Result<&[u8], RingFault> {
    let pad = u16::from_le_bytes([record[6], record[7]]) as usize;
    if pad >= 8 || record.len() < 8 + pad {
        return Err(RingFault::Corrupt("bad message padding"));
    }
    Ok(&record[8..record.len() - pad])
}

impl RingProducer for RequestProducer {
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError> {
        let len = u32::try_from(msg.len()).map_err(|_| RingError::TooLarge)?;
        let mut r = self.reserve(MESSAGE_KIND, 8, len, 8)?;
        let pad = (r.placement().record_len() - 8 - len) as u16;
        r.header_mut().copy_from_slice(&pad.to_le_bytes());
        // Copy: the message into its reserved place in the ring.
        r.data_mut().copy_from_slice(msg);
        r.commit();
        Ok(())
    }
}

impl RingConsumer for RequestConsumer {
    /// One DMA read of the pointers, one (or two) of the whole batch, one write of `Head`.
    fn poll_batch(
        &mut self,
        engine: &mut dyn DmaEngine,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingFault> {
        if !self.poll(engine)? {
            return Ok(0);
        }
        let (from, to) = (self.released(), self.fetched());
        let mut n = 0;
        for rec in self.records(from..to) {
            let rec = rec?;
            if rec.kind != MESSAGE_KIND {
                return Err(RingFault::Corrupt("unexpected record kind"));
            }
            // No copy: the consumer reads the message in the mirror.
            f(message(rec.bytes)?);
            n += 1;
        }
        self.release(to, engine)?;
        Ok(n)
    }
}

/// A test-and-test-and-set spin lock. Waiters spin on a read (no cache-line traffic while the
/// lock is held) and yield the CPU after a while, so that a preempted holder can run again.
struct SpinLock {
    locked: CachePadded<AtomicBool>,
}

struct SpinGuard<'a>(&'a SpinLock);

impl SpinLock {
    fn new() -> Self {
        SpinLock {
            locked: CachePadded::new(AtomicBool::new(false)),
        }
    }

    fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        loop {
            if !self.locked.swap(true, Ordering::Acquire) {
                return SpinGuard(self);
            }
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 128 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0.locked.store(false, Ordering::Release);
    }
}

/// Lock-based baseline: producers take a host-side spin lock, write their record at `Tail`,
/// and advance `Tail` and `Progress` together. Same ring format and DPU consumer
/// ([`RequestConsumer`]) as the progress ring.
pub struct LockedProducer {
    mem: RingMem,
    max_inflight: u64,
    lock: SpinLock,
    _region: Option<Arc<SharedRegion>>,
}

impl LockedProducer {
    /// A producer for the request-format ring at byte `offset` of `region`.
    pub fn with_region(
        region: Arc<SharedRegion>,
        offset: usize,
        capacity: u64,
        max_inflight_bytes: u64,
    ) -> Self {
        assert!(
            offset.is_multiple_of(64)
                && offset as u64 + POINTER_AREA_BYTES as u64 + capacity <= region.len() as u64
        );
        assert!((8..=capacity).contains(&max_inflight_bytes));
        LockedProducer {
            // SAFETY: inside the region, which the producer keeps alive.
            mem: unsafe { RingMem::new(region.as_ptr().add(offset), capacity) },
            max_inflight: max_inflight_bytes,
            lock: SpinLock::new(),
            _region: Some(region),
        }
    }

    /// Zeroes the pointer area.
    pub fn init(&self) {
        self.mem.zero_pointers();
    }
}

impl RingProducer for LockedProducer {
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError> {
        let len = u32::try_from(msg.len()).map_err(|_| RingError::TooLarge)?;
        let capacity = self.mem.capacity();
        if !fits(capacity, 8, len, 8) {
            return Err(RingError::TooLarge);
        }
        let _guard = self.lock.lock();
        let head = self.mem.counter(REQ_HEAD).load(Ordering::Acquire);
        // Only the lock holder moves Tail.
        let tail = self.mem.counter(REQ_TAIL).load(Ordering::Relaxed);
        assert!(
            head <= tail && tail - head <= capacity,
            "lock ring: Head {head}, Tail {tail}"
        );
        let p = place(tail, capacity, 8, len, 8);
        let used = p.end - head;
        if used > capacity || (tail != head && used > self.max_inflight) {
            return Err(RingError::Retry);
        }
        let pad = (p.record_len() - 8 - len) as u16;
        // SAFETY: under the lock, [tail, p.end) is ours (the DPU is done with it: Head).
        unsafe {
            for (pos, plen) in p.pads.iter().flatten() {
                self.mem.write_pad(*pos, *plen);
            }
            self.mem
                .write_frame(p.header_at, p.record_len(), crate::baseline::MESSAGE_KIND);
            self.mem
                .slice_mut(p.header_at + 6, 2)
                .copy_from_slice(&pad.to_le_bytes());
            // Copy: the message into the ring.
            self.mem
                .slice_mut(p.header_at + 8, msg.len())
                .copy_from_slice(msg);
            self.mem
                .slice_mut(p.header_at + 8 + len as u64, pad as usize)
                .fill(0);
        }
        self.mem.counter(REQ_TAIL).store(p.end, Ordering::Relaxed);
        self.mem
            .counter(REQ_PROGRESS)
            .store(p.end, Ordering::Release);
        Ok(())
    }
}

/// Bytes of a FaRM-style slot before the message: `seq: u64`, `len: u32`, 4 zero bytes.
pub const FARM_SLOT_HEADER: usize = 16;

/// FaRM-style baseline, host side: fixed-size slots with a sequence word as the valid flag
/// (`docs/ring-format.md`, "Baselines"). Producers claim message numbers with a CAS on a
/// host-side counter, write the message, then set the flag.
pub struct FarmProducer {
    base: NonNull<u8>,
    slots: u64,
    slot_bytes: usize,
    next: CachePadded<AtomicU64>,
    _region: Option<Arc<SharedRegion>>,
}

// SAFETY: the slots are shared memory accessed with atomics only.
unsafe impl Send for FarmProducer {}
// SAFETY: as above.
unsafe impl Sync for FarmProducer {}

impl FarmProducer {
    /// Slots at byte `offset` of `region`: `slots` of `slot_bytes` (a multiple of 8, ≥ 24).
    pub fn with_region(
        region: Arc<SharedRegion>,
        offset: usize,
        slots: u64,
        slot_bytes: usize,
    ) -> Self {
        assert!(slots > 0 && slot_bytes >= FARM_SLOT_HEADER + 8 && slot_bytes.is_multiple_of(8));
        assert!(
            offset.is_multiple_of(64)
                && offset as u64 + slots * slot_bytes as u64 <= region.len() as u64
        );
        FarmProducer {
            // SAFETY: inside the region, which the producer keeps alive.
            base: NonNull::new(unsafe { region.as_ptr().add(offset) }).expect("mapped"),
            slots,
            slot_bytes,
            next: CachePadded::new(AtomicU64::new(0)),
            _region: Some(region),
        }
    }

    /// Marks every slot free for the first lap (`seq = index`).
    pub fn init(&self) {
        for i in 0..self.slots {
            self.word(i, 0).store(i, Ordering::Relaxed);
        }
        self.next.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Word `w` of the slot for message number `t`. Every access to a slot is atomic: the DPU
    /// reads whole slots by DMA whether or not they are valid.
    fn word(&self, t: u64, w: usize) -> &AtomicU64 {
        let at = (t % self.slots) as usize * self.slot_bytes + w * 8;
        // SAFETY: inside the slots, 8-aligned; the region outlives `self`.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(at).cast()) }
    }
}

impl RingProducer for FarmProducer {
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError> {
        if msg.len() > self.slot_bytes - FARM_SLOT_HEADER {
            return Err(RingError::TooLarge);
        }
        loop {
            let t = self.next.load(Ordering::Relaxed);
            let seq = self.word(t, 0).load(Ordering::Acquire);
            let diff = seq.wrapping_sub(t) as i64;
            if diff < 0 {
                // The slot still holds message t - slots: not freed by the DPU yet.
                return Err(RingError::Retry);
            }
            if diff == 0
                && self
                    .next
                    .compare_exchange_weak(t, t + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.word(t, 1).store(msg.len() as u64, Ordering::Relaxed);
                // Copy: the message into the slot, word by word.
                for (i, chunk) in msg.chunks(8).enumerate() {
                    let mut w = [0u8; 8];
                    w[..chunk.len()].copy_from_slice(chunk);
                    self.word(t, 2 + i)
                        .store(u64::from_le_bytes(w), Ordering::Relaxed);
                }
                // The valid flag, after the message.
                self.word(t, 0).store(t + 1, Ordering::Release);
                return Ok(());
            }
            std::hint::spin_loop();
        }
    }
}

/// FaRM-style baseline, DPU side: DMA-reads the next slot (flag and message in one read) and,
/// when it is valid, consumes it and DMA-writes its flag free: two DMA operations per message.
pub struct FarmConsumer {
    region: RegionId,
    offset: u64,
    slots: u64,
    slot_bytes: usize,
    next: u64,
    /// `[0, slot_bytes)`: the slot read; `[slot_bytes, slot_bytes + 8)`: the flag to write.
    buf: LocalBuf,
}

impl FarmConsumer {
    pub fn new(region: Region, offset: u64, slots: u64, slot_bytes: usize) -> Self {
        assert!(slots > 0 && slot_bytes >= FARM_SLOT_HEADER + 8 && slot_bytes.is_multiple_of(8));
        assert!(
            region.contains(offset, slots * slot_bytes as u64),
            "FaRM slots outside their region"
        );
        FarmConsumer {
            region: region.id,
            offset,
            slots,
            slot_bytes,
            next: 0,
            buf: LocalBuf::new(slot_bytes + 8, 64),
        }
    }

    fn slot_offset(&self, t: u64) -> u64 {
        self.offset + (t % self.slots) * self.slot_bytes as u64
    }
}

impl RingConsumer for FarmConsumer {
    fn poll_batch(
        &mut self,
        engine: &mut dyn DmaEngine,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingFault> {
        let sb = self.slot_bytes;
        let read = |c: &Self, t: u64| {
            DmaOp::read(c.region, c.slot_offset(t), c.buf.as_mut_ptr(), sb as u32, t)
        };
        // SAFETY: the local buffer is ours until run_sync returns.
        unsafe { run_sync(engine, &[read(self, self.next)])? };
        let mut n = 0;
        while n < self.slots as usize {
            let s = self.buf.as_slice();
            let seq = u64::from_le_bytes(s[0..8].try_into().expect("8 bytes"));
            if seq != self.next + 1 {
                break;
            }
            let len = u64::from_le_bytes(s[8..16].try_into().expect("8 bytes")) as usize;
            if len > sb - FARM_SLOT_HEADER {
                return Err(RingFault::Corrupt("bad FaRM message length"));
            }
            // No copy: the consumer reads the message in the DMA buffer.
            f(&s[FARM_SLOT_HEADER..FARM_SLOT_HEADER + len]);
            n += 1;
            // Free the slot for the next lap, and poll the next one, in one doorbell.
            let free = self.next + self.slots;
            self.buf.as_mut_slice()[sb..sb + 8].copy_from_slice(&free.to_le_bytes());
            let clear = DmaOp::write(
                self.region,
                self.slot_offset(self.next),
                self.buf.as_ptr().wrapping_add(sb),
                8,
                u64::MAX,
            );
            self.next += 1;
            // SAFETY: as above.
            unsafe { run_sync(engine, &[clear, read(self, self.next)])? };
        }
        Ok(n)
    }
}
