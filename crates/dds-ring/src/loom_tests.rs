//! Model checking of the ring protocols with `loom` (run by `crates/dds-ring/loom.sh`).
//!
//! The rings' data areas are arrays of `loom` atomic words; the DPU's DMA is modelled as the
//! emulated engine performs it: a read is a `SeqCst` fence then `Acquire` loads in ascending
//! address order, a write is a `SeqCst` fence, a `Release` fence, then `Relaxed` stores.
//! Producers write records with `Relaxed` stores, so a consumer that read a record before it
//! was published would see stale words and fail its checks.

use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use crate::format::{place, Placement, KIND_PAD};
use crate::protocol::{fetch_decision, trusted_head, RequestPtrs, ResponsePtrs};
use crate::RingError;

/// Pointer area (one word per line) and data area of a ring.
struct Ring {
    ptrs: [AtomicU64; 4],
    waiters: AtomicU32,
    data: Vec<AtomicU64>,
    capacity: u64,
}

impl Ring {
    fn new(capacity: u64) -> Arc<Ring> {
        Arc::new(Ring {
            ptrs: [
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ],
            waiters: AtomicU32::new(0),
            data: (0..capacity / 8).map(|_| AtomicU64::new(0)).collect(),
            capacity,
        })
    }

    fn word(&self, pos: u64) -> &AtomicU64 {
        &self.data[((pos % self.capacity) / 8) as usize]
    }

    fn request_ptrs(&self) -> RequestPtrs<'_> {
        RequestPtrs {
            head: &self.ptrs[0],
            progress: &self.ptrs[1],
            tail: &self.ptrs[2],
        }
    }

    fn response_ptrs(&self) -> ResponsePtrs<'_> {
        ResponsePtrs {
            tail: &self.ptrs[0],
            head_done: &self.ptrs[1],
            head_claim: &self.ptrs[2],
        }
    }

    /// Writes the pads and the record (framing word, then `payload` words) of a placement.
    fn write_record(&self, p: &Placement, kind: u16, payload: u64, ord: Ordering) {
        for (pos, len) in p.pads.iter().flatten() {
            self.word(*pos).store(frame(*len, KIND_PAD), ord);
        }
        self.word(p.header_at)
            .store(frame(p.record_len(), kind), ord);
        let mut at = p.header_at + 8;
        while at < p.end {
            self.word(at).store(payload, ord);
            at += 8;
        }
    }
}

fn frame(len: u32, kind: u16) -> u64 {
    len as u64 | (kind as u64) << 32
}

fn unframe(w: u64) -> (u32, u16) {
    (w as u32, (w >> 32) as u16)
}

/// DMA write of one word.
fn dma_store(w: &AtomicU64, v: u64) {
    fence(Ordering::SeqCst);
    fence(Ordering::Release);
    w.store(v, Ordering::Relaxed);
}

/// Host producer: inserts `count` records of `data_len` bytes carrying `(id, seq)`.
fn produce(ring: &Ring, m: u64, id: u64, count: u64, data_len: u32) {
    let ptrs = ring.request_ptrs();
    for seq in 0..count {
        let p = loop {
            match ptrs.reserve(ring.capacity, m, 8, data_len, 8) {
                Ok(p) => break p,
                Err(RingError::Retry) => thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        };
        ring.write_record(&p, 1, id << 32 | (seq + 1), Ordering::Relaxed);
        ptrs.commit(&p);
    }
}

/// DPU consumer (Fig. 8b) until `total` records arrived; returns `(id, seq)` in arrival order.
fn consume(ring: &Ring, total: usize, data_len: u32) -> Vec<(u64, u64)> {
    let cap = ring.capacity;
    let mut mirror = vec![0u64; (cap / 8) as usize];
    let (mut fetched, mut released) = (0u64, 0u64);
    let mut got = Vec::new();
    while got.len() < total {
        // One DMA read of Progress then Tail.
        fence(Ordering::SeqCst);
        let progress = ring.ptrs[1].load(Ordering::Acquire);
        let tail = ring.ptrs[2].load(Ordering::Acquire);
        let Some(tail) =
            fetch_decision(progress, tail, fetched, released, cap).expect("invariants")
        else {
            thread::yield_now();
            continue;
        };
        // DMA read of the new bytes into the mirror.
        fence(Ordering::SeqCst);
        let mut at = fetched;
        while at < tail {
            mirror[((at % cap) / 8) as usize] = ring.word(at).load(Ordering::Acquire);
            at += 8;
        }
        // Parse the batch.
        let mut pos = fetched;
        while pos < tail {
            let (len, kind) = unframe(mirror[((pos % cap) / 8) as usize]);
            assert!(
                len >= 8 && len % 8 == 0 && pos + len as u64 <= tail,
                "torn record at {pos}"
            );
            assert!(pos % cap + len as u64 <= cap, "record crosses the end");
            if kind != KIND_PAD {
                assert_eq!(kind, 1);
                assert_eq!(len, 8 + data_len);
                let payload = mirror[(((pos + 8) % cap) / 8) as usize];
                for w in 1..len as u64 / 8 {
                    assert_eq!(
                        mirror[(((pos + 8 * w) % cap) / 8) as usize],
                        payload,
                        "stale data"
                    );
                }
                assert_ne!(
                    payload & 0xffff_ffff,
                    0,
                    "record read before it was written"
                );
                got.push((payload >> 32, (payload & 0xffff_ffff) - 1));
            }
            pos += len as u64;
        }
        fetched = tail;
        // Done with the batch: DMA write of Head.
        dma_store(&ring.ptrs[0], fetched);
        released = fetched;
    }
    got
}

fn check_arrivals(got: &[(u64, u64)], producers: u64, per: u64) {
    for id in 0..producers {
        let seqs: Vec<u64> = got.iter().filter(|g| g.0 == id).map(|g| g.1).collect();
        assert_eq!(seqs, (0..per).collect::<Vec<_>>(), "producer {id}");
    }
    assert_eq!(got.len() as u64, producers * per);
}

fn request_model(producers: u64, per: u64, capacity: u64, m: u64, data_len: u32) {
    let ring = Ring::new(capacity);
    let handles: Vec<_> = (0..producers)
        .map(|id| {
            let ring = ring.clone();
            thread::spawn(move || produce(&ring, m, id, per, data_len))
        })
        .collect();
    let consumer = {
        let ring = ring.clone();
        thread::spawn(move || consume(&ring, (producers * per) as usize, data_len))
    };
    for h in handles {
        h.join().unwrap();
    }
    let got = consumer.join().unwrap();
    check_arrivals(&got, producers, per);
}

/// A model checker bounded to `preemptions` preemptions per execution (unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise), with room for the spin loops' branches.
fn bounded(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.max_branches = b.max_branches.max(20_000);
    b
}

#[test]
fn loom_request_two_producers() {
    bounded(3).check(|| request_model(2, 1, 64, 64, 8));
}

#[test]
fn loom_request_three_producers() {
    bounded(1).check(|| request_model(3, 1, 64, 64, 8));
}

#[test]
fn loom_request_wrap_retry_and_max_progress() {
    // 24-byte records in a 64-byte ring with M = 48: Retry on M and on space, a PAD at the
    // end of the ring, a second lap.
    bounded(1).check(|| request_model(2, 2, 64, 48, 16));
}

#[test]
fn loom_request_wrap_single_producer_deeper() {
    // The same wrap and retries with one producer, explored with more preemptions.
    bounded(3).check(|| request_model(1, 4, 64, 48, 16));
}

/// DPU response producer: allocates 24-byte records with the place arithmetic and delivers
/// each one (data, then Tail, then a read of Waiters).
struct Dpu {
    allocated: u64,
    freed: u64,
    next_value: u64,
}

impl Dpu {
    /// Delivers the next record if there is room after at most `refreshes` reads of
    /// `HeadDone`/`HeadClaim`. Returns `Some(saw_waiter)` when delivered.
    fn respond(&mut self, ring: &Ring, refreshes: usize) -> Option<bool> {
        let cap = ring.capacity;
        let p = place(self.allocated, cap, 8, 16, 8);
        let mut left = refreshes;
        while p.end - self.freed > cap {
            if left == 0 {
                return None;
            }
            left -= 1;
            // Refresh: one DMA read of HeadDone then HeadClaim.
            fence(Ordering::SeqCst);
            let done = ring.ptrs[1].load(Ordering::Acquire);
            let claim = ring.ptrs[2].load(Ordering::Acquire);
            if let Some(h) = trusted_head(done, claim, self.allocated).expect("invariants") {
                assert!(h >= self.freed, "HeadDone went backwards");
                self.freed = h;
            }
        }
        self.allocated = p.end;
        // DMA write of the record, then of Tail, then DMA read of Waiters.
        fence(Ordering::SeqCst);
        fence(Ordering::Release);
        ring.write_record(&p, 2, self.next_value + 1, Ordering::Relaxed);
        self.next_value += 1;
        dma_store(&ring.ptrs[0], p.end);
        fence(Ordering::SeqCst);
        Some(ring.waiters.load(Ordering::Acquire) > 0)
    }
}

/// Host response consumer: one `try_pop`; the record's value, or `None` when empty.
fn pop_once(ring: &Ring) -> Option<u64> {
    let ptrs = ring.response_ptrs();
    let c = ptrs.claim(ring.capacity, |at| {
        unframe(ring.word(at).load(Ordering::Acquire))
    })?;
    let (len, kind) = unframe(ring.word(c.pos).load(Ordering::Relaxed));
    assert_eq!((len, kind), (24, 2));
    let v = ring.word(c.pos + 8).load(Ordering::Relaxed);
    assert_eq!(
        ring.word(c.pos + 16).load(Ordering::Relaxed),
        v,
        "torn record"
    );
    assert_ne!(v, 0, "record claimed before it was delivered");
    ptrs.finish(&c);
    Some(v - 1)
}

#[test]
fn loom_response_two_consumers_wrap() {
    bounded(2).check(|| {
        // Three 24-byte records in a 64-byte ring: the third wraps after a PAD and needs the
        // first consumed (HeadDone == HeadClaim). Every loop is bounded: two consumers make two
        // attempts each, the DPU refreshes twice; whatever is left the main thread finishes
        // after joining them.
        let ring = Ring::new(64);
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let ring = ring.clone();
                thread::spawn(move || {
                    let mut mine = Vec::new();
                    for _ in 0..2 {
                        match pop_once(&ring) {
                            Some(v) => mine.push(v),
                            None => thread::yield_now(),
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut dpu = Dpu {
            allocated: 0,
            freed: 0,
            next_value: 0,
        };
        dpu.respond(&ring, 0).expect("room for the first record");
        dpu.respond(&ring, 0).expect("room for the second record");
        let third = dpu.respond(&ring, 2).is_some();
        let mut all: Vec<u64> = consumers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        while let Some(v) = pop_once(&ring) {
            all.push(v);
        }
        if !third {
            dpu.respond(&ring, 1)
                .expect("room once everything is consumed");
            all.push(pop_once(&ring).expect("the third record"));
        }
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2]);
        assert_eq!(
            dpu.allocated, 88,
            "a PAD at 48..64, the third record at 64..88"
        );
    });
}

#[test]
fn loom_response_sleeper_is_never_missed() {
    bounded(3).check(|| {
        // A consumer that finds the ring empty announces itself in Waiters and re-checks
        // (`ResponseConsumer::announce_sleep`). Either it sees the delivery, or the DPU, which
        // reads Waiters after writing Tail, sees it: it never sleeps through a delivery.
        let ring = Ring::new(64);
        let consumer = {
            let ring = ring.clone();
            thread::spawn(move || {
                if let Some(v) = pop_once(&ring) {
                    return (Some(v), false);
                }
                ring.waiters.fetch_add(1, Ordering::SeqCst);
                // Loom treats SeqCst accesses as AcqRel but models SeqCst fences.
                fence(Ordering::SeqCst);
                let claim = ring.ptrs[2].load(Ordering::SeqCst);
                let tail = ring.ptrs[0].load(Ordering::SeqCst);
                if claim < tail {
                    ring.waiters.fetch_sub(1, Ordering::SeqCst);
                    return (pop_once(&ring), false);
                }
                (None, true)
            })
        };
        let mut dpu = Dpu {
            allocated: 0,
            freed: 0,
            next_value: 0,
        };
        let signalled = dpu.respond(&ring, 0).expect("room");
        let (got, slept) = consumer.join().unwrap();
        assert!(!slept || signalled, "lost wake-up");
        assert!(slept || got == Some(0));
    });
}
