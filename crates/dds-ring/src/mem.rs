//! A ring's memory as the host process sees it: the pointer area at `base`, the data area
//! after it.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::format::{valid_capacity, KIND_PAD, POINTER_AREA_BYTES};

#[derive(Clone, Copy, Debug)]
pub(crate) struct RingMem {
    base: NonNull<u8>,
    capacity: u64,
}

// SAFETY: plain address arithmetic; every access goes through atomics or through the ring
// protocol, which gives each writer exclusive bytes.
unsafe impl Send for RingMem {}
// SAFETY: as above.
unsafe impl Sync for RingMem {}

impl RingMem {
    /// # Safety
    /// `base` is 64-byte aligned and valid for reads and writes of
    /// `POINTER_AREA_BYTES + capacity` bytes for as long as the value (or a copy) is used, and
    /// that memory is accessed only through the ring protocol.
    ///
    /// # Panics
    /// If `base` is misaligned or `capacity` is not a valid ring capacity.
    pub unsafe fn new(base: *mut u8, capacity: u64) -> Self {
        assert!(valid_capacity(capacity), "invalid ring capacity {capacity}");
        let base = NonNull::new(base).expect("null ring base");
        assert_eq!(
            base.as_ptr() as usize % 64,
            0,
            "ring base not 64-byte aligned"
        );
        RingMem { base, capacity }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The `u64` counter at `offset` of the pointer area.
    pub fn counter(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(64) && offset < POINTER_AREA_BYTES);
        // SAFETY: inside the pointer area, 8-aligned; the memory outlives `self` (`new`).
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// The `u32` at `offset` of the pointer area.
    pub fn counter32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(64) && offset < POINTER_AREA_BYTES);
        // SAFETY: as above, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(offset).cast()) }
    }

    /// Zeroes the pointer area (all four lines).
    pub fn zero_pointers(&self) {
        for w in 0..POINTER_AREA_BYTES / 8 {
            // SAFETY: inside the pointer area, 8-aligned.
            unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(w * 8).cast()) }
                .store(0, Ordering::SeqCst);
        }
    }

    /// Address of data-area position `pos % capacity`.
    pub fn data_ptr(&self, pos: u64) -> *mut u8 {
        // SAFETY: `pos % capacity` is inside the data area.
        unsafe {
            self.base
                .as_ptr()
                .add(POINTER_AREA_BYTES + (pos & (self.capacity - 1)) as usize)
        }
    }

    /// The bytes `[pos, pos + len)` of the data area (not crossing its end) as a slice.
    ///
    /// # Safety
    /// No one writes those bytes while the slice lives (the protocol gives them to the caller).
    pub unsafe fn slice(&self, pos: u64, len: usize) -> &[u8] {
        debug_assert!(pos % self.capacity + len as u64 <= self.capacity);
        // SAFETY: in bounds (checked by the callers' placement) and unshared per the contract.
        unsafe { std::slice::from_raw_parts(self.data_ptr(pos), len) }
    }

    /// Mutable version of [`slice`](Self::slice).
    ///
    /// # Safety
    /// The caller has exclusive use of those bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, pos: u64, len: usize) -> &mut [u8] {
        debug_assert!(pos % self.capacity + len as u64 <= self.capacity);
        // SAFETY: as above, exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.data_ptr(pos), len) }
    }

    /// Writes a record's framing (`len`, `kind`, two zero bytes) at `pos`.
    ///
    /// # Safety
    /// The caller has exclusive use of those 8 bytes (a reservation).
    pub unsafe fn write_frame(&self, pos: u64, len: u32, kind: u16) {
        // SAFETY: per the contract.
        unsafe {
            self.slice_mut(pos, 8)
                .copy_from_slice(&frame_bytes(len, kind))
        };
    }

    /// Writes a PAD record's framing.
    ///
    /// # Safety
    /// As for [`write_frame`](Self::write_frame).
    pub unsafe fn write_pad(&self, pos: u64, len: u32) {
        // SAFETY: forwarded.
        unsafe { self.write_frame(pos, len, KIND_PAD) };
    }

    /// Reads the framing at data-area position `at` with one `Acquire` load of its word, for
    /// bytes that may be written concurrently by DMA (a record not claimed yet).
    pub fn frame_atomic(&self, at: u64) -> (u32, u16) {
        debug_assert!(at.is_multiple_of(8) && at < self.capacity);
        // SAFETY: inside the data area, 8-aligned (the base is 64-aligned).
        let w = unsafe { AtomicU64::from_ptr(self.data_ptr(at).cast()) }.load(Ordering::Acquire);
        parse_frame(&w.to_ne_bytes())
    }
}

/// The 8 framing bytes of a record.
pub(crate) fn frame_bytes(len: u32, kind: u16) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&len.to_le_bytes());
    b[4..6].copy_from_slice(&kind.to_le_bytes());
    b
}

/// `(len, kind)` from the first bytes of a record.
pub(crate) fn parse_frame(b: &[u8]) -> (u32, u16) {
    (
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_le_bytes([b[4], b[5]]),
    )
}
