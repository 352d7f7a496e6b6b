//! Bucket layout (192 bytes: three cache lines) and its per-bucket sequence lock.
//!
//! ```text
//! line 0   0..8    header   bits 0..8 slot states (2 bits per slot), bits 8..64 sequence
//!          8..40   keys[4]
//!          40..48  floor    bucket version floor (writer-only)
//!          48..64  reserved
//! line 1   64..96  slot 0 payload: version, offset, loc (file id | size << 32), tag
//!          96..128 slot 1 payload
//! line 2   128..192 slot 2 and slot 3 payloads
//! ```
//!
//! Every word is an atomic. The writer brackets each modification with
//! [`Bucket::begin_write`] / [`Bucket::end_write`]; readers take a consistent snapshot with
//! [`Bucket::header_acquire`], `Relaxed` loads, [`reader_fence`] and [`Bucket::header_relaxed`].

use crate::sync::{fence, AtomicU64, Ordering};
use crate::CacheItem;

/// Slots per bucket.
pub const SLOTS: usize = 4;
/// Bytes per bucket.
pub const BUCKET_BYTES: usize = 192;

/// Mask of the slot-state bits in the header.
pub(crate) const STATE_MASK: u64 = 0xff;
/// One step of the sequence counter (bits 8..64 of the header).
pub(crate) const SEQ_ONE: u64 = 1 << 8;
/// Low bit of each slot's state pair: set when the slot is live.
pub(crate) const LIVE_BITS: u64 = 0x55;
/// High bit of each slot's state pair: set when the slot is a tombstone.
pub(crate) const TOMB_BITS: u64 = 0xaa;

/// State of one slot, as encoded in two header bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotState {
    Empty,
    Live,
    Tomb,
}

impl SlotState {
    const fn bits(self) -> u64 {
        match self {
            SlotState::Empty => 0,
            SlotState::Live => 1,
            SlotState::Tomb => 2,
        }
    }
}

/// State of `slot` in a header (or in the state byte alone).
#[inline(always)]
pub(crate) fn state(states: u64, slot: usize) -> SlotState {
    match (states >> (2 * slot)) & 3 {
        0 => SlotState::Empty,
        1 => SlotState::Live,
        2 => SlotState::Tomb,
        bits => panic!("corrupt slot state {bits:#b}"),
    }
}

/// `states` with `slot` set to `to`.
#[inline(always)]
pub(crate) fn with_state(states: u64, slot: usize, to: SlotState) -> u64 {
    (states & !(3 << (2 * slot))) | (to.bits() << (2 * slot))
}

/// First slot in `state` `want`, if any.
#[inline]
pub(crate) fn first_in_state(states: u64, want: SlotState) -> Option<usize> {
    (0..SLOTS).find(|&s| state(states, s) == want)
}

/// Whether a header says the writer is inside a write section.
#[inline(always)]
pub(crate) fn is_busy(header: u64) -> bool {
    header & SEQ_ONE != 0
}

/// The reader's fence between its data loads and the re-check of the header.
#[inline(always)]
pub(crate) fn reader_fence() {
    fence(Ordering::Acquire);
}

/// Payload of one slot (32 bytes).
#[repr(C)]
pub(crate) struct Payload {
    /// Item version, or the floor of a tombstone.
    version: AtomicU64,
    offset: AtomicU64,
    /// File id in bits 0..32, size in bits 32..64.
    loc: AtomicU64,
    tag: AtomicU64,
}

/// One bucket: four slots and the sequence word guarding them.
#[repr(C, align(64))]
pub(crate) struct Bucket {
    header: AtomicU64,
    keys: [AtomicU64; SLOTS],
    floor: AtomicU64,
    _reserved: [AtomicU64; 2],
    payload: [Payload; SLOTS],
}

#[cfg(not(loom))]
const _: () = {
    assert!(core::mem::size_of::<Bucket>() == BUCKET_BYTES);
    assert!(core::mem::align_of::<Bucket>() == 64);
    assert!(core::mem::offset_of!(Bucket, header) == 0);
    assert!(core::mem::offset_of!(Bucket, keys) == 8);
    assert!(core::mem::offset_of!(Bucket, floor) == 40);
    assert!(core::mem::offset_of!(Bucket, payload) == 64);
    assert!(core::mem::size_of::<Payload>() == 32);
};

#[inline(always)]
fn zero() -> AtomicU64 {
    AtomicU64::new(0)
}

#[inline(always)]
fn pack_loc(file_id: u32, size: u32) -> u64 {
    u64::from(file_id) | (u64::from(size) << 32)
}

impl Payload {
    fn new() -> Self {
        Payload {
            version: zero(),
            offset: zero(),
            loc: zero(),
            tag: zero(),
        }
    }
}

impl Bucket {
    /// An empty bucket (all words zero).
    pub(crate) fn new() -> Self {
        Bucket {
            header: zero(),
            keys: [zero(), zero(), zero(), zero()],
            floor: zero(),
            _reserved: [zero(), zero()],
            payload: [
                Payload::new(),
                Payload::new(),
                Payload::new(),
                Payload::new(),
            ],
        }
    }

    // ----- reader side -------------------------------------------------------------------

    /// Ask the memory system for the bucket's lines: line 0 always, the payload lines when
    /// `payload` is set. Never faults and has no effect on the program's semantics.
    #[inline(always)]
    pub(crate) fn prefetch(&self, payload: bool) {
        #[cfg(all(target_arch = "x86_64", not(loom)))]
        {
            use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let p = (self as *const Bucket).cast::<i8>();
            // SAFETY: `sse` is part of the x86_64 baseline, and a prefetch of any address is
            // a hint that neither faults nor changes memory.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p);
                if payload {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(128));
                }
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom))))]
        let _ = payload;
    }

    /// Header load that opens a reader's snapshot.
    #[inline(always)]
    pub(crate) fn header_acquire(&self) -> u64 {
        self.header.load(Ordering::Acquire)
    }

    /// Header load that closes a reader's snapshot (after [`reader_fence`]).
    #[inline(always)]
    pub(crate) fn header_relaxed(&self) -> u64 {
        self.header.load(Ordering::Relaxed)
    }

    /// Slot holding `key` as a live item according to `header`. Part of a snapshot: the
    /// answer is meaningful only if the header is unchanged afterwards.
    #[inline(always)]
    pub(crate) fn find_live(&self, key: u64, header: u64) -> Option<usize> {
        let k0 = self.keys[0].load(Ordering::Relaxed);
        let k1 = self.keys[1].load(Ordering::Relaxed);
        let k2 = self.keys[2].load(Ordering::Relaxed);
        let k3 = self.keys[3].load(Ordering::Relaxed);
        let eq = u64::from(k0 == key)
            | (u64::from(k1 == key) << 2)
            | (u64::from(k2 == key) << 4)
            | (u64::from(k3 == key) << 6);
        let hit = eq & header & LIVE_BITS;
        if hit == 0 {
            None
        } else {
            Some((hit.trailing_zeros() / 2) as usize)
        }
    }

    /// The item in `slot` (whose key is `key`). Part of a snapshot, or a writer-side read.
    #[inline(always)]
    pub(crate) fn read_item(&self, slot: usize, key: u64) -> CacheItem {
        let p = &self.payload[slot];
        let version = p.version.load(Ordering::Relaxed);
        let offset = p.offset.load(Ordering::Relaxed);
        let loc = p.loc.load(Ordering::Relaxed);
        let tag = p.tag.load(Ordering::Relaxed);
        CacheItem {
            key,
            version,
            file_id: loc as u32,
            offset,
            size: (loc >> 32) as u32,
            tag,
        }
    }

    // ----- writer side (only the single writer calls these) ------------------------------

    /// Slot states (writer-side read).
    #[inline(always)]
    pub(crate) fn states(&self) -> u64 {
        let h = self.header.load(Ordering::Relaxed);
        debug_assert!(
            !is_busy(h),
            "writer reads a bucket inside its own write section"
        );
        h & STATE_MASK
    }

    /// Key stored in `slot` (writer-side read).
    #[inline(always)]
    pub(crate) fn key(&self, slot: usize) -> u64 {
        self.keys[slot].load(Ordering::Relaxed)
    }

    /// Version (or tombstone floor) stored in `slot` (writer-side read).
    #[inline(always)]
    pub(crate) fn version(&self, slot: usize) -> u64 {
        self.payload[slot].version.load(Ordering::Relaxed)
    }

    /// Bucket version floor (writer-only word).
    #[inline(always)]
    pub(crate) fn floor(&self) -> u64 {
        self.floor.load(Ordering::Relaxed)
    }

    /// Raise the bucket floor to at least `to`; returns whether it changed.
    pub(crate) fn raise_floor(&self, to: u64) -> bool {
        let cur = self.floor.load(Ordering::Relaxed);
        if to > cur {
            self.floor.store(to, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Open a write section: the header becomes odd. Returns the header before it.
    #[inline(always)]
    pub(crate) fn begin_write(&self) -> u64 {
        let h = self.header.load(Ordering::Relaxed);
        assert!(!is_busy(h), "nested write section");
        self.header
            .store(h.wrapping_add(SEQ_ONE), Ordering::Relaxed);
        fence(Ordering::Release);
        h
    }

    /// Close the write section opened with header `before`, publishing slot `states`.
    #[inline(always)]
    pub(crate) fn end_write(&self, before: u64, states: u64) {
        debug_assert_eq!(states & !STATE_MASK, 0);
        debug_assert!(
            states & LIVE_BITS & ((states & TOMB_BITS) >> 1) == 0,
            "slot in state 0b11"
        );
        let next = (before.wrapping_add(2 * SEQ_ONE) & !STATE_MASK) | states;
        self.header.store(next, Ordering::Release);
    }

    /// Store a full item into `slot` (inside a write section).
    #[inline(always)]
    pub(crate) fn store_item(&self, slot: usize, item: &CacheItem) {
        let p = &self.payload[slot];
        self.keys[slot].store(item.key, Ordering::Relaxed);
        p.version.store(item.version, Ordering::Relaxed);
        p.offset.store(item.offset, Ordering::Relaxed);
        p.loc
            .store(pack_loc(item.file_id, item.size), Ordering::Relaxed);
        p.tag.store(item.tag, Ordering::Relaxed);
    }

    /// Store a tombstone for `key` with `floor` into `slot` (inside a write section).
    #[inline(always)]
    pub(crate) fn store_tomb(&self, slot: usize, key: u64, floor: u64) {
        let p = &self.payload[slot];
        self.keys[slot].store(key, Ordering::Relaxed);
        p.version.store(floor, Ordering::Relaxed);
        p.offset.store(0, Ordering::Relaxed);
        p.loc.store(0, Ordering::Relaxed);
        p.tag.store(0, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn state_encoding_round_trips() {
        let mut s = 0u64;
        s = with_state(s, 0, SlotState::Live);
        s = with_state(s, 2, SlotState::Tomb);
        s = with_state(s, 3, SlotState::Live);
        assert_eq!(state(s, 0), SlotState::Live);
        assert_eq!(state(s, 1), SlotState::Empty);
        assert_eq!(state(s, 2), SlotState::Tomb);
        assert_eq!(state(s, 3), SlotState::Live);
        assert_eq!(s & LIVE_BITS, 0b0100_0001);
        assert_eq!(s & TOMB_BITS, 0b0010_0000);
        assert_eq!(first_in_state(s, SlotState::Empty), Some(1));
        assert_eq!(first_in_state(s, SlotState::Tomb), Some(2));
        s = with_state(s, 2, SlotState::Empty);
        assert_eq!(state(s, 2), SlotState::Empty);
    }

    #[test]
    fn write_section_bumps_sequence_by_two() {
        let b = Bucket::new();
        let h0 = b.header_acquire();
        let before = b.begin_write();
        assert!(is_busy(b.header_acquire()));
        b.store_item(1, &CacheItem::new(7, 3, 9, 4096, 512));
        b.end_write(before, with_state(before & STATE_MASK, 1, SlotState::Live));
        let h1 = b.header_acquire();
        assert!(!is_busy(h1));
        assert_eq!((h1 >> 8) - (h0 >> 8), 2);
        assert_eq!(b.find_live(7, h1), Some(1));
        assert_eq!(b.find_live(8, h1), None);
        assert_eq!(b.read_item(1, 7), CacheItem::new(7, 3, 9, 4096, 512));
    }

    #[test]
    fn find_live_ignores_empty_and_tombstone_slots() {
        let b = Bucket::new();
        // Key 0 sits in every zeroed slot, but no slot is live.
        assert_eq!(b.find_live(0, b.header_acquire()), None);
        let before = b.begin_write();
        b.store_tomb(0, 5, 10);
        b.store_item(3, &CacheItem::new(5, 11, 1, 2, 3));
        let st = with_state(with_state(0, 0, SlotState::Tomb), 3, SlotState::Live);
        b.end_write(before, st);
        assert_eq!(b.find_live(5, b.header_acquire()), Some(3));
    }

    #[test]
    fn loc_packs_full_width_fields() {
        let b = Bucket::new();
        let item = CacheItem {
            key: u64::MAX,
            version: u64::MAX,
            file_id: u32::MAX,
            offset: u64::MAX - 1,
            size: u32::MAX - 2,
            tag: 0xdead_beef_0bad_f00d,
        };
        let before = b.begin_write();
        b.store_item(2, &item);
        b.end_write(before, with_state(0, 2, SlotState::Live));
        assert_eq!(b.read_item(2, u64::MAX), item);
    }
}
