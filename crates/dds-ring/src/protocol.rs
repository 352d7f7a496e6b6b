//! The pointer protocols of both rings, on atomics only, so that they can be model checked
//! with `loom` (`--cfg loom`; the DMA is then modelled as atomic loads and stores). The
//! shared-memory types of this crate call these functions with atomics that live in the
//! pointer area of a ring.

use crate::format::{fits, place, Placement, KIND_PAD, RECORD_ALIGN};
use crate::sync::{spin_hint, AtomicU64, Ordering};
use crate::RingError;

/// The request ring's pointers as the host producers see them.
pub(crate) struct RequestPtrs<'a> {
    pub head: &'a AtomicU64,
    pub progress: &'a AtomicU64,
    pub tail: &'a AtomicU64,
}

impl RequestPtrs<'_> {
    /// Fig. 8a, lines 1–4: reserves space for one record (and its pads) by moving `Tail`.
    ///
    /// `Retry` when the ring lacks room or the bytes in flight would exceed `max_inflight`
    /// (unless the ring is empty), `TooLarge` when the record can never be placed.
    pub fn reserve(
        &self,
        capacity: u64,
        max_inflight: u64,
        header_len: u32,
        data_len: u32,
        align: u32,
    ) -> Result<Placement, RingError> {
        if !fits(capacity, header_len, data_len, align) {
            return Err(RingError::TooLarge);
        }
        loop {
            // Head first: everything the DPU had seen when it wrote this Head is then visible,
            // so the Tail read below is at least Head.
            let head = self.head.load(Ordering::Acquire);
            let tail = self.tail.load(Ordering::Relaxed);
            // (Tail may be more than a ring ahead of this Head, which can be old by now; the
            // room check below then says Retry.)
            assert!(head <= tail, "request ring: Head {head} passed Tail {tail}");
            let p = place(tail, capacity, header_len, data_len, align);
            let used = p.end - head;
            if used > capacity || (tail != head && used > max_inflight) {
                return Err(RingError::Retry);
            }
            if self
                .tail
                .compare_exchange_weak(tail, p.end, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(p);
            }
            spin_hint();
        }
    }

    /// Fig. 8a, line 6: the record (and its pads) are written; publish them.
    pub fn commit(&self, p: &Placement) {
        self.progress.fetch_add(p.reserved(), Ordering::Release);
    }
}

/// Fig. 8b, line 4, on a `(Progress, Tail)` pair read in that order: `Ok(Some(tail))` when the
/// consumer may fetch `[fetched, tail)`, `Ok(None)` for retry (a producer is still writing, or
/// nothing is new). `Err` when the pointers break the ring's invariants.
pub(crate) fn fetch_decision(
    progress: u64,
    tail: u64,
    fetched: u64,
    released: u64,
    capacity: u64,
) -> Result<Option<u64>, &'static str> {
    if progress > tail {
        return Err("Progress ahead of Tail");
    }
    if progress != tail {
        return Ok(None);
    }
    if tail < fetched {
        return Err("Tail went backwards");
    }
    if tail - released > capacity {
        return Err("Tail more than a ring ahead of Head");
    }
    if !tail.is_multiple_of(RECORD_ALIGN as u64) {
        return Err("unaligned Tail");
    }
    Ok((tail > fetched).then_some(tail))
}

/// The response ring's pointers as the host consumers see them.
pub(crate) struct ResponsePtrs<'a> {
    pub tail: &'a AtomicU64,
    pub head_done: &'a AtomicU64,
    pub head_claim: &'a AtomicU64,
}

/// One claimed response record: the claim covers `[start, pos + len)`, PADs included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub start: u64,
    pub pos: u64,
    pub len: u32,
}

impl ResponsePtrs<'_> {
    /// Claims the next non-PAD record with a CAS on `HeadClaim` (the PADs in front of it go
    /// with it). `frame(position)` reads a record's `(len, kind)` at a data-area position with
    /// atomic `Acquire` loads: until the claim succeeds the bytes may belong to a record
    /// another consumer took, or be overwritten already, so what it returns is checked before
    /// use and trusted only if `HeadClaim` has not moved.
    ///
    /// # Panics
    /// If the ring's framing is broken (the DPU wrote garbage).
    pub fn claim(&self, capacity: u64, frame: impl Fn(u64) -> (u32, u16)) -> Option<Claim> {
        'outer: loop {
            let start = self.head_claim.load(Ordering::Acquire);
            let tail = self.tail.load(Ordering::Acquire);
            assert!(
                start <= tail,
                "response ring: HeadClaim {start} passed Tail {tail}"
            );
            if start == tail {
                return None;
            }
            let mut pos = start;
            let len = loop {
                if pos == tail {
                    // Only PADs up to Tail (never written so by the DPU, which delivers pads
                    // with the record behind them): consume them and look again.
                    if self
                        .head_claim
                        .compare_exchange(start, tail, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        self.head_done.fetch_add(tail - start, Ordering::Release);
                    }
                    continue 'outer;
                }
                let at = pos & (capacity - 1);
                let (len, kind) = frame(at);
                let sane = len >= RECORD_ALIGN
                    && len % RECORD_ALIGN == 0
                    && at + len as u64 <= capacity
                    && pos + len as u64 <= tail;
                if !sane {
                    if self.head_claim.load(Ordering::Acquire) == start {
                        panic!("response ring corrupt at {pos}: record length {len}, Tail {tail}");
                    }
                    // Overtaken: those bytes were another consumer's and may be reused already.
                    spin_hint();
                    continue 'outer;
                }
                if kind == KIND_PAD {
                    pos += len as u64;
                    continue;
                }
                break len;
            };
            let claim = Claim { start, pos, len };
            if self
                .head_claim
                .compare_exchange(
                    start,
                    pos + claim.len as u64,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return Some(claim);
            }
            spin_hint();
        }
    }

    /// The claimed record has been consumed: its bytes (and the PADs before it) may be reused.
    pub fn finish(&self, c: &Claim) {
        self.head_done
            .fetch_add(c.pos + c.len as u64 - c.start, Ordering::Release);
    }
}

/// From a `(HeadDone, HeadClaim)` pair read in that order: the count below which the host has
/// consumed everything, if the pair proves one (`HeadDone == HeadClaim`). `Err` when the
/// pointers break the ring's invariants.
pub(crate) fn trusted_head(
    head_done: u64,
    head_claim: u64,
    delivered: u64,
) -> Result<Option<u64>, &'static str> {
    if head_done > head_claim {
        return Err("HeadDone ahead of HeadClaim");
    }
    if head_claim > delivered {
        return Err("HeadClaim ahead of the delivered Tail");
    }
    Ok((head_done == head_claim).then_some(head_done))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fetch_decisions() {
        assert_eq!(fetch_decision(0, 0, 0, 0, 4096), Ok(None));
        assert_eq!(fetch_decision(8, 16, 0, 0, 4096), Ok(None));
        assert_eq!(fetch_decision(16, 16, 0, 0, 4096), Ok(Some(16)));
        assert_eq!(fetch_decision(16, 16, 16, 0, 4096), Ok(None));
        assert!(fetch_decision(17, 16, 0, 0, 4096).is_err());
        assert!(fetch_decision(16, 16, 24, 0, 4096).is_err());
        assert!(fetch_decision(5000, 5000, 0, 0, 4096).is_err());
        assert!(fetch_decision(12, 12, 0, 0, 4096).is_err());
    }

    #[test]
    fn trusted_heads() {
        assert_eq!(trusted_head(16, 16, 32), Ok(Some(16)));
        assert_eq!(trusted_head(8, 16, 32), Ok(None));
        assert!(trusted_head(17, 16, 32).is_err());
        assert!(trusted_head(16, 40, 32).is_err());
    }

    fn ptrs(v: &[AtomicU64; 3]) -> RequestPtrs<'_> {
        RequestPtrs {
            head: &v[0],
            progress: &v[1],
            tail: &v[2],
        }
    }

    #[test]
    fn reserve_respects_capacity_and_max_progress() {
        let v: [AtomicU64; 3] = Default::default();
        let p = ptrs(&v);
        // M = 64: four 16-byte records, then Retry.
        for i in 0..4 {
            assert_eq!(p.reserve(4096, 64, 8, 8, 8).unwrap().start, i * 16);
        }
        assert_eq!(p.reserve(4096, 64, 8, 8, 8), Err(RingError::Retry));
        // A record larger than M is still admitted into an empty ring.
        v[0].store(64, Ordering::Relaxed);
        v[1].store(64, Ordering::Relaxed);
        let big = p.reserve(4096, 64, 8, 1000, 8).unwrap();
        assert_eq!(big.reserved(), 1008);
        assert_eq!(p.reserve(4096, 64, 8, 8, 8), Err(RingError::Retry));
        assert_eq!(p.reserve(4096, 64, 8, 4096, 8), Err(RingError::TooLarge));
        // Capacity bound with M = capacity.
        let v: [AtomicU64; 3] = Default::default();
        let p = ptrs(&v);
        for _ in 0..4 {
            p.reserve(4096, 4096, 8, 1016, 8).unwrap();
        }
        assert_eq!(v[2].load(Ordering::Relaxed), 4096);
        assert_eq!(p.reserve(4096, 4096, 8, 0, 8), Err(RingError::Retry));
        // A Head read long before Tail (the producer was preempted between the two loads)
        // can be more than a ring behind it: Retry, not a broken invariant.
        let stale: [AtomicU64; 3] = Default::default();
        stale[2].store(3 * 4096, Ordering::Relaxed);
        assert_eq!(
            ptrs(&stale).reserve(4096, 4096, 8, 8, 8),
            Err(RingError::Retry)
        );
        // Consuming one record frees exactly its room; a wrap needs its pad's room too.
        v[0].store(1024, Ordering::Relaxed);
        let r = p.reserve(4096, 4096, 8, 1016, 8).unwrap();
        assert_eq!((r.header_at, r.end), (4096, 5120));
    }
}
