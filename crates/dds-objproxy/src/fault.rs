//! Fault injection around a DMA engine: dropped writes (reported successful, nothing lands),
//! duplicated writes (the write lands twice) and dropped reads (reported successful, nothing
//! copied): lost and duplicated transfers and ACKs.

use std::collections::VecDeque;

use dds_dma::{
    DmaCompletion, DmaDir, DmaEngine, DmaError, DmaOp, DmaStats, Region, RegionExport, RegionId,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Rates (0.0 ..= 1.0) of the faults [`FaultyDma`] injects.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub drop_write: f64,
    pub dup_write: f64,
    pub drop_read: f64,
    pub seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Forward the inner completion of this op to the caller.
    Forward,
    /// An inner op whose completion the caller does not see (the first of a duplicate).
    Swallow,
    /// Not posted to the inner engine: completes successfully at its turn.
    Fake,
}

struct Entry {
    user_data: u64,
    fate: Fate,
    /// Inner sequence number (for posted ops).
    tag: u64,
}

/// A DMA engine that loses and duplicates operations of the engine it wraps.
pub struct FaultyDma {
    inner: Box<dyn DmaEngine>,
    faults: Faults,
    rng: SmallRng,
    entries: VecDeque<Entry>,
    next_tag: u64,
    buf: Vec<DmaCompletion>,
    /// Injected faults so far.
    pub injected: u64,
}

impl FaultyDma {
    pub fn new(inner: Box<dyn DmaEngine>, faults: Faults) -> Self {
        FaultyDma {
            inner,
            rng: SmallRng::seed_from_u64(faults.seed),
            faults,
            entries: VecDeque::new(),
            next_tag: 1,
            buf: vec![DmaCompletion::default(); 16],
            injected: 0,
        }
    }

    /// An operation that is not performed but reported successful at its turn.
    fn fake(&mut self, user_data: u64) {
        self.injected += 1;
        self.entries.push_back(Entry {
            user_data,
            fate: Fate::Fake,
            tag: 0,
        });
    }

    fn post_inner(&mut self, mut op: DmaOp, fate: Fate, user_data: u64) -> Result<(), DmaError> {
        let tag = self.next_tag;
        op.user_data = tag;
        // SAFETY: forwarded from the caller's `post` contract.
        unsafe { self.inner.post(op)? };
        self.next_tag += 1;
        self.entries.push_back(Entry {
            user_data,
            fate,
            tag,
        });
        Ok(())
    }
}

impl DmaEngine for FaultyDma {
    fn register_region(&mut self, export: RegionExport) -> Result<Region, DmaError> {
        self.inner.register_region(export)
    }

    fn unregister_region(&mut self, id: RegionId) -> Result<(), DmaError> {
        self.inner.unregister_region(id)
    }

    fn max_inflight(&self) -> usize {
        self.inner.max_inflight() / 2
    }

    fn outstanding(&self) -> usize {
        self.entries.len()
    }

    fn stats(&self) -> DmaStats {
        self.inner.stats()
    }

    unsafe fn post(&mut self, op: DmaOp) -> Result<(), DmaError> {
        if self.entries.len() >= self.max_inflight() {
            return Err(DmaError::QueueFull);
        }
        let roll: f64 = self.rng.gen();
        let user = op.user_data;
        match op.dir {
            DmaDir::Write if roll < self.faults.drop_write => {
                self.fake(user);
                Ok(())
            }
            DmaDir::Write if roll < self.faults.drop_write + self.faults.dup_write => {
                self.injected += 1;
                self.post_inner(op, Fate::Swallow, user)?;
                self.post_inner(op, Fate::Forward, user)
            }
            DmaDir::Read if roll < self.faults.drop_read => {
                self.fake(user);
                Ok(())
            }
            _ => self.post_inner(op, Fate::Forward, user),
        }
    }

    fn submit(&mut self) {
        self.inner.submit();
    }

    fn poll(&mut self, out: &mut [DmaCompletion]) -> usize {
        let mut n = 0;
        loop {
            // Fakes at the front complete at their turn.
            while n < out.len() {
                match self.entries.front() {
                    Some(e) if e.fate == Fate::Fake => {
                        out[n] = DmaCompletion {
                            user_data: e.user_data,
                            result: Ok(()),
                        };
                        n += 1;
                        self.entries.pop_front();
                    }
                    _ => break,
                }
            }
            if n == out.len() || self.entries.is_empty() {
                return n;
            }
            // The front is an inner op; its completion is the inner engine's next one.
            let got = self.inner.poll(&mut self.buf[..1]);
            if got == 0 {
                return n;
            }
            let c = std::mem::take(&mut self.buf[0]);
            let e = self
                .entries
                .pop_front()
                .expect("an inner op is outstanding");
            assert_eq!(e.tag, c.user_data, "inner completions come in order");
            if e.fate == Fate::Forward {
                out[n] = DmaCompletion {
                    user_data: e.user_data,
                    result: c.result,
                };
                n += 1;
            }
        }
    }
}
