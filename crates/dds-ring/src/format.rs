//! Byte layout of the rings (`docs/ring-format.md`) and the placement arithmetic shared by host
//! producers and the DPU's response allocator.

/// Bytes of the pointer area in front of every ring's data area: four 64-byte cache lines.
pub const POINTER_AREA_BYTES: usize = 256;
/// One pointer per cache line.
pub const LINE_BYTES: usize = 64;

/// Request ring: `Head` (DPU → host by DMA write).
pub const REQ_HEAD: usize = 0;
/// Request ring: `Progress` (producers); precedes `Tail` so one DMA read fetches both.
pub const REQ_PROGRESS: usize = 64;
/// Request ring: `Tail` (producers).
pub const REQ_TAIL: usize = 128;
/// Request ring: `Sleeping` (`u32`, DPU → host by DMA write): non-zero while the consumer is
/// parked and waits for the group's doorbell.
pub const REQ_SLEEPING: usize = 192;
/// Request ring: offset and length of the single DMA read of `Progress` and `Tail`.
pub const REQ_POINTER_READ: (usize, usize) = (REQ_PROGRESS, 128);

/// Response ring: `Tail` (DPU → host by DMA write, after the data).
pub const RESP_TAIL: usize = 0;
/// Response ring: `HeadDone` (consumers: bytes fully consumed).
pub const RESP_HEAD_DONE: usize = 64;
/// Response ring: `HeadClaim` (consumers: bytes claimed).
pub const RESP_HEAD_CLAIM: usize = 128;
/// Response ring: `Waiters` (`u32`: host threads asleep).
pub const RESP_WAITERS: usize = 192;
/// Response ring: offset and length of the single DMA read of `HeadDone`, `HeadClaim` and
/// the `u32` `Waiters` (its four bytes only, so it is accessed with its own size).
pub const RESP_POINTER_READ: (usize, usize) = (RESP_HEAD_DONE, RESP_WAITERS + 4 - RESP_HEAD_DONE);

/// Records start at multiples of this and their lengths are multiples of it.
pub const RECORD_ALIGN: u32 = 8;
/// Kind of a filler record that consumers skip.
pub const KIND_PAD: u16 = 0;
/// Largest data alignment a record may ask for.
pub const MAX_DATA_ALIGN: u32 = 4096;
/// Smallest ring capacity of the format.
pub const MIN_CAPACITY: u64 = 4096;
/// Largest ring capacity of the format (record lengths are `u32`).
pub const MAX_CAPACITY: u64 = 1 << 31;

/// Whether `capacity` is a valid data-area size: a power of two, a multiple of 4096, at most
/// 2^31.
pub fn valid_capacity(capacity: u64) -> bool {
    capacity.is_power_of_two() && (MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity)
}

/// Where one record (and the PAD records in front of it) goes.
///
/// All positions are running byte counts (position in the data area = count % capacity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Start of the reservation (the `Tail` it was computed from).
    pub start: u64,
    /// Start of the record itself (its `len` field).
    pub header_at: u64,
    /// End of the reservation (the new `Tail`).
    pub end: u64,
    /// PAD records to write before the record: (start, len), in order.
    pub pads: [Option<(u64, u32)>; 2],
}

impl Placement {
    /// Length of the record (its `len` field).
    pub fn record_len(&self) -> u32 {
        (self.end - self.header_at) as u32
    }

    /// Bytes reserved in all (pads and record).
    pub fn reserved(&self) -> u64 {
        self.end - self.start
    }

    /// Running count where the record's data starts, for a header of `header_len` bytes.
    pub fn data_at(&self, header_len: u32) -> u64 {
        self.header_at + header_len as u64
    }
}

/// Total length of a record with a header of `header_len` bytes (framing included) and
/// `data_len` bytes of data: the data is padded to a multiple of 8.
pub fn record_len(header_len: u32, data_len: u32) -> u64 {
    header_len as u64 + (data_len as u64).next_multiple_of(RECORD_ALIGN as u64)
}

/// Header length (a multiple of 8) for `owner_bytes` bytes after the 6 framing bytes.
pub fn header_len_for(owner_bytes: usize) -> u64 {
    (6 + owner_bytes as u64).next_multiple_of(RECORD_ALIGN as u64)
}

/// The most ring space a record can need for its alignment gap and itself.
pub fn footprint(header_len: u32, data_len: u32, align: u32) -> u64 {
    let gap = if align > RECORD_ALIGN {
        align as u64 - RECORD_ALIGN as u64
    } else {
        0
    };
    record_len(header_len, data_len) + gap
}

/// Whether such a record can be placed in a ring of `capacity` bytes at any position: its
/// footprint is at most half the ring. Larger records are refused (`TooLarge`), since at some
/// positions neither the rest of the ring nor the space before the current position after
/// padding to the end would hold them, and an empty ring would never accept them.
pub fn fits(capacity: u64, header_len: u32, data_len: u32, align: u32) -> bool {
    footprint(header_len, data_len, align) <= capacity / 2
}

/// Largest `data_len` that [`fits`] for this header and alignment (0 if none fits).
pub fn max_data_len(capacity: u64, header_len: u32, align: u32) -> u32 {
    let gap = if align > RECORD_ALIGN {
        align as u64 - RECORD_ALIGN as u64
    } else {
        0
    };
    let room = (capacity / 2).saturating_sub(header_len as u64 + gap);
    (room / RECORD_ALIGN as u64 * RECORD_ALIGN as u64).min(u32::MAX as u64 / 8 * 8) as u32
}

/// Places a record of `header_len` (a multiple of 8, ≥ 8, framing included) and `data_len`
/// bytes whose data must start at a multiple of `align` (a power of two ≤ 4096), reserving from
/// `tail` (a multiple of 8) in a ring of `capacity` bytes (a power of two ≥ 64; the format
/// requires [`valid_capacity`], smaller rings serve model checking).
///
/// The record never crosses the end of the data area; gaps are filled with PAD records (see
/// `docs/ring-format.md`).
///
/// # Panics
/// If the arguments break the rules above or the record does not [`fit`](fits).
pub fn place(tail: u64, capacity: u64, header_len: u32, data_len: u32, align: u32) -> Placement {
    assert!(
        capacity.is_power_of_two() && capacity >= 64,
        "bad ring capacity {capacity}"
    );
    assert!(
        header_len >= RECORD_ALIGN && header_len.is_multiple_of(RECORD_ALIGN),
        "bad header length {header_len}"
    );
    assert!(
        align.is_power_of_two() && align <= MAX_DATA_ALIGN,
        "bad data alignment {align}"
    );
    assert!(
        tail.is_multiple_of(RECORD_ALIGN as u64),
        "unaligned tail {tail}"
    );
    assert!(
        fits(capacity, header_len, data_len, align),
        "record does not fit the ring"
    );
    let a = align.max(RECORD_ALIGN) as u64;
    let h = header_len as u64;
    let len = record_len(header_len, data_len);
    // Powers of two: masks instead of divisions (this runs on every insertion).
    let pos = tail & (capacity - 1);
    let gap = (a - ((pos + h) & (a - 1))) & (a - 1);
    if pos + gap + len <= capacity {
        let pads = [(gap > 0).then_some((tail, gap as u32)), None];
        return Placement {
            start: tail,
            header_at: tail + gap,
            end: tail + gap + len,
            pads,
        };
    }
    // Pad the rest of the ring and start over at position 0 of the next lap.
    let end_pad = capacity - pos;
    let lap = tail + end_pad;
    let gap0 = (a - (h & (a - 1))) & (a - 1);
    let pads = [
        Some((tail, end_pad as u32)),
        (gap0 > 0).then_some((lap, gap0 as u32)),
    ];
    Placement {
        start: tail,
        header_at: lap + gap0,
        end: lap + gap0 + len,
        pads,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn simple_placements() {
        // Fits at once.
        let p = place(0, 4096, 8, 8, 8);
        assert_eq!(
            p,
            Placement {
                start: 0,
                header_at: 0,
                end: 16,
                pads: [None, None]
            }
        );
        // Data length rounded up to 8.
        assert_eq!(place(16, 4096, 32, 5, 8).end, 16 + 40);
        // Alignment gap: header 32 at 8 → data must start at 512.
        let p = place(8, 4096, 32, 512, 512);
        assert_eq!(p.header_at, 480);
        assert_eq!(p.pads, [Some((8, 472)), None]);
        assert_eq!(p.data_at(32) % 512, 0);
        // Exactly up to the end of the ring: no wrap.
        let p = place(4096 - 16, 4096, 8, 8, 8);
        assert_eq!((p.header_at, p.end, p.pads), (4080, 4096, [None, None]));
        // Wrap: pad the last 8 bytes, place at the next lap's 0.
        let p = place(2 * 4096 - 8, 4096, 8, 8, 8);
        assert_eq!(p.pads, [Some((2 * 4096 - 8, 8)), None]);
        assert_eq!((p.header_at, p.end), (2 * 4096, 2 * 4096 + 16));
        // Wrap with an alignment gap at the start of the lap.
        let p = place(4000, 4096, 32, 1024, 512);
        assert_eq!(p.pads, [Some((4000, 96)), Some((4096, 480))]);
        assert_eq!((p.header_at, p.end), (4096 + 480, 4096 + 512 + 1024));
    }

    #[test]
    fn fit_limits() {
        assert!(fits(4096, 8, 2040, 8));
        assert!(!fits(4096, 8, 2041, 8));
        assert!(!fits(4096, 32, 2048, 512));
        assert_eq!(max_data_len(4096, 8, 8), 2040);
        assert_eq!(max_data_len(4096, 32, 512), 2048 - 32 - 504);
        assert!(fits(4096, 32, max_data_len(4096, 32, 512), 512));
        assert!(!fits(4096, 32, max_data_len(4096, 32, 512) + 1, 512));
        assert_eq!(header_len_for(2), 8);
        assert_eq!(header_len_for(26), 32);
        assert_eq!(header_len_for(3), 16);
        assert!(valid_capacity(4096) && valid_capacity(1 << 31));
        assert!(!valid_capacity(2048) && !valid_capacity(12288) && !valid_capacity(1 << 32));
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn too_large_panics() {
        place(0, 4096, 8, 4096, 8);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn placement_rules(
            lap in 0u64..4,
            pos8 in 0u64..(1 << 16) / 8,
            cap_shift in 12u32..17,
            header8 in 1u32..8,
            data_frac in 0.0f64..=1.0,
            align_shift in 0u32..12,
        ) {
            let capacity = 1u64 << cap_shift;
            let header_len = header8 * 8;
            let align = 1u32 << align_shift;
            let data_len = (max_data_len(capacity, header_len, align) as f64 * data_frac) as u32;
            prop_assume!(fits(capacity, header_len, data_len, align));
            let tail = lap * capacity + (pos8 * 8) % capacity;
            let p = place(tail, capacity, header_len, data_len, align);
            let len = record_len(header_len, data_len);
            // The reservation is contiguous: pads, then the record, nothing left over.
            prop_assert_eq!(p.start, tail);
            prop_assert_eq!(p.end - p.header_at, len);
            let mut at = p.start;
            for (start, plen) in p.pads.iter().flatten() {
                prop_assert_eq!(*start, at);
                prop_assert!(*plen >= 8 && plen % 8 == 0);
                // A pad never crosses the end either.
                prop_assert!(start % capacity + *plen as u64 <= capacity);
                at += *plen as u64;
            }
            prop_assert_eq!(at, p.header_at);
            // Second pad only after a wrap, at position 0.
            if let Some((s, _)) = p.pads[1] {
                prop_assert_eq!(s % capacity, 0);
                prop_assert!(p.pads[0].is_some());
            }
            // The record does not cross the end of the data area.
            prop_assert!(p.header_at % capacity + len <= capacity);
            // Records are 8-aligned and the data starts at the requested alignment.
            prop_assert_eq!(p.header_at % 8, 0);
            prop_assert_eq!(p.data_at(header_len) % align.max(8) as u64, 0);
            // Fits in an empty ring: the reservation never exceeds the capacity.
            prop_assert!(p.reserved() <= capacity);
            // No waste beyond what the rules require: without a wrap the gap is < align.
            if p.pads[1].is_none() && p.header_at % capacity >= tail % capacity {
                prop_assert!(p.header_at - p.start < align.max(8) as u64);
            }
        }
    }
}
