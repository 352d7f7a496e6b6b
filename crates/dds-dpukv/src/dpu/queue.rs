//! The DPU front end's end of a KV queue pair ([`DpuQueue`]): it names the host memory by
//! region id and offset and moves bytes only with DMA operations; batches sent and their
//! responses read back, and the faults that end a queue pair.

use crate::queue::{end_marker, request_write_len, Geometry};
use dds_dma::{DmaEngine, DmaError, DmaOp, LocalBuf, RegionId};
use dds_kvmem::qp::{batch_header, batch_seq, responses, Malformed, BATCH_HEADER};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A complete response batch and the request batch it answers.
pub type Answered<'a, W> = Option<(&'a [u8], Outstanding<W>)>;

/// A request batch the DPU sent and has no response for yet.
pub struct Outstanding<W> {
    /// Batch number.
    pub n: u64,
    /// Requests in it.
    pub count: u16,
    /// Response bytes expected (a prediction).
    pub expect: usize,
    /// What each request's response goes to, in order.
    pub waiters: Vec<W>,
    /// When its write was posted.
    pub sent_at: Instant,
}

/// State of the response read of the oldest outstanding batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadState {
    Idle,
    /// First read posted, of this many bytes.
    Head(usize),
    /// Second read posted: the rest of a batch of this many bytes.
    Rest(usize),
}

/// The DPU front end's end of one queue pair: it names the host memory by region and offset
/// and moves bytes only with DMA operations.
pub struct DpuQueue<W> {
    region: RegionId,
    req_off: u64,
    resp_off: u64,
    slots: u64,
    slot_bytes: usize,
    batch_max: usize,
    /// Local staging of each request slot (the DMA source while its write is in flight).
    out: Vec<LocalBuf>,
    /// Local target of response reads.
    inb: LocalBuf,
    sent: u64,
    /// The batch being filled, and its waiters.
    pub building: Vec<u8>,
    building_count: u16,
    building_expect: usize,
    building_worst: usize,
    building_waiters: Vec<W>,
    /// Emptied waiter lists of answered batches, for the next ones.
    spare_waiters: Vec<Vec<W>>,
    outstanding: VecDeque<Outstanding<W>>,
    read: ReadState,
    writes_in_flight: u32,
    /// Reads that found no new response.
    pub empty_polls: u64,
    /// Misses in a row for the oldest batch (backoff; re-polls read the header line only).
    misses: u32,
    not_before: Instant,
    /// A low estimate of the time from a batch's write to its response being found (it
    /// follows a faster batch at once and a slower one by a sixteenth of the difference, so
    /// a tail of slow batches does not raise it): the first read of a batch waits for most
    /// of it.
    service: Duration,
    /// Running mean of the same time (1/8 weight for the newest): re-polls after a miss back
    /// off up to an eighth of it.
    service_mean: Duration,
    /// Whether the first read of a batch fetches the whole predicted batch (the previous
    /// batch was there at its first read) or its header only.
    read_whole: bool,
}

/// Requests a batch needs before it is sent while another batch of its queue is in flight.
const MIN_OVERLAP: u16 = 32;

/// DMA `user_data`: queue index in the low 32 bits, the kind above.
const UD_WRITE: u64 = 1 << 32;
const UD_READ: u64 = 2 << 32;

impl<W> DpuQueue<W> {
    /// Queue pair (c, w) of a region registered as `region`.
    pub fn new(region: RegionId, g: &Geometry, c: u32, w: u32) -> DpuQueue<W> {
        let off = g.pair_offset(c, w) as u64;
        let ring = u64::from(g.slots) * u64::from(g.slot_bytes);
        DpuQueue {
            region,
            req_off: off,
            resp_off: off + ring,
            slots: u64::from(g.slots),
            slot_bytes: g.slot_bytes as usize,
            batch_max: g.batch_max(),
            out: (0..g.slots)
                .map(|_| LocalBuf::new(g.slot_bytes as usize, 64))
                .collect(),
            inb: LocalBuf::new(g.slot_bytes as usize, 64),
            sent: 0,
            building: Vec::with_capacity(g.slot_bytes as usize),
            building_count: 0,
            building_expect: BATCH_HEADER,
            building_worst: BATCH_HEADER,
            building_waiters: Vec::new(),
            spare_waiters: Vec::new(),
            outstanding: VecDeque::new(),
            read: ReadState::Idle,
            writes_in_flight: 0,
            empty_polls: 0,
            misses: 0,
            not_before: Instant::now(),
            service: Duration::ZERO,
            service_mean: Duration::ZERO,
            read_whole: true,
        }
    }

    /// Most batch bytes.
    pub fn batch_max(&self) -> usize {
        self.batch_max
    }

    /// Whether a request of `n` bytes whose response is at most `worst` bytes fits in the
    /// batch being filled (both directions).
    pub fn fits(&self, n: usize, worst: usize) -> bool {
        let base = if self.building.is_empty() {
            BATCH_HEADER
        } else {
            self.building.len()
        };
        base + n <= self.batch_max
            && self.building_worst + worst <= self.batch_max
            && self.building_count < u16::MAX
    }

    /// Whether a new batch can be sent now (a free slot).
    pub fn can_send(&self) -> bool {
        (self.outstanding.len() as u64) < self.slots && self.writes_in_flight == 0
    }

    /// Appends an encoded request (`record`, from [`dds_kvmem::qp::BatchWriter`]'s format)
    /// with the response size it predicts and its waiter.
    pub fn push(&mut self, record: &[u8], expect: usize, worst: usize, waiter: W) {
        debug_assert!(self.fits(record.len(), worst));
        if self.building.is_empty() {
            self.building.extend_from_slice(&[0; BATCH_HEADER]);
        }
        self.building.extend_from_slice(record);
        self.building_count += 1;
        self.building_expect += expect;
        self.building_worst += worst;
        self.building_waiters.push(waiter);
    }

    /// Requests waiting in the batch being filled.
    pub fn building_count(&self) -> u16 {
        self.building_count
    }

    /// Batches sent and not answered.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Posts the batch being filled (one DMA write: batch, zeros, end marker). Returns
    /// whether an operation was posted.
    ///
    /// # Safety
    /// The engine completes this queue's operations before the queue is dropped.
    pub unsafe fn post_batch(
        &mut self,
        engine: &mut dyn DmaEngine,
        index: u32,
    ) -> Result<bool, DmaError> {
        if self.building_count == 0 || !self.can_send() {
            return Ok(false);
        }
        // While a batch is in flight, a small one waits to grow (it goes with the next
        // response, or once it holds `MIN_OVERLAP` requests): fewer, fuller batches under load,
        // and no wait at all when the queue is idle.
        if !self.outstanding.is_empty() && self.building_count < MIN_OVERLAP {
            return Ok(false);
        }
        let n = self.sent;
        let seq = batch_seq(n);
        let len = self.building.len();
        self.building[0..2].copy_from_slice(&(len as u16).to_le_bytes());
        self.building[2..4].copy_from_slice(&seq.to_le_bytes());
        let end = request_write_len(len);
        let slot = (n % self.slots) as usize;
        let buf = &mut self.out[slot];
        let dst = buf.as_mut_slice();
        dst[..len].copy_from_slice(&self.building);
        dst[len..end - 1].fill(0);
        dst[end - 1] = end_marker(seq);
        let op = DmaOp::write(
            self.region,
            self.req_off + slot as u64 * self.slot_bytes as u64,
            buf.as_ptr(),
            end as u32,
            UD_WRITE | u64::from(index),
        );
        // SAFETY: the staging buffer stays untouched until the write completes (this slot
        // is reused only after its response, which comes after the write).
        unsafe { engine.post(op)? };
        self.writes_in_flight += 1;
        self.sent += 1;
        self.outstanding.push_back(Outstanding {
            n,
            count: self.building_count,
            expect: self.building_expect,
            waiters: std::mem::replace(
                &mut self.building_waiters,
                self.spare_waiters.pop().unwrap_or_default(),
            ),
            sent_at: Instant::now(),
        });
        self.building.clear();
        self.building_count = 0;
        self.building_expect = BATCH_HEADER;
        self.building_worst = BATCH_HEADER;
        Ok(true)
    }

    /// Posts the read of the oldest outstanding response, if none is in flight.
    ///
    /// # Safety
    /// As for [`post_batch`](Self::post_batch).
    pub unsafe fn post_poll(
        &mut self,
        engine: &mut dyn DmaEngine,
        index: u32,
    ) -> Result<bool, DmaError> {
        let Some(o) = self.outstanding.front() else {
            return Ok(false);
        };
        if self.read != ReadState::Idle || self.writes_in_flight > 0 {
            return Ok(false);
        }
        let now = Instant::now();
        if self.misses > 0 && now < self.not_before {
            return Ok(false);
        }
        // The first read waits for three quarters of the low estimate of the service time: a
        // read that finds nothing costs PCIe bytes and an operation.
        if self.misses == 0 && now < o.sent_at + self.service * 3 / 4 {
            return Ok(false);
        }
        // The first read fetches the whole predicted batch while batches are there when first
        // read; otherwise, and after a miss, only the header until it shows the batch (a
        // second read then fetches the rest).
        let len = if self.misses == 0 && self.read_whole {
            o.expect
        } else {
            BATCH_HEADER
        }
        .min(self.slot_bytes);
        let slot = o.n % self.slots;
        let op = DmaOp::read(
            self.region,
            self.resp_off + slot * self.slot_bytes as u64,
            self.inb.as_mut_ptr(),
            len as u32,
            UD_READ | u64::from(index),
        );
        // SAFETY: `inb` is ours until the read completes.
        unsafe { engine.post(op)? };
        self.read = ReadState::Head(len);
        Ok(true)
    }

    /// Handles a completion of this queue (`user_data`'s kind bits). Returns the response
    /// batch and its waiters when one is complete.
    ///
    /// # Safety
    /// As for [`post_batch`](Self::post_batch).
    pub unsafe fn complete(
        &mut self,
        engine: &mut dyn DmaEngine,
        index: u32,
        user_data: u64,
    ) -> Result<Answered<'_, W>, QueueFault> {
        if user_data & !0xFFFF_FFFF == UD_WRITE {
            self.writes_in_flight = self.writes_in_flight.saturating_sub(1);
            return Ok(None);
        }
        let o = self.outstanding.front().ok_or(QueueFault::Protocol(
            "a response read completed with no batch outstanding",
        ))?;
        let want = batch_seq(o.n);
        match self.read {
            ReadState::Idle => Err(QueueFault::Protocol("unexpected read completion")),
            ReadState::Head(got) => {
                let b = &self.inb.as_slice()[..got];
                let seq = u16::from_le_bytes([b[2], b[3]]);
                if seq != want {
                    self.read = ReadState::Idle;
                    self.empty_polls += 1;
                    self.misses += 1;
                    self.read_whole = false;
                    // 1, 2, 4, 8 µs: the host serves a batch in a few microseconds; a host
                    // that takes longer (a busy core) is polled up to 8 times a batch's mean
                    // time rather than every 8 µs.
                    let wait = Duration::from_micros(1 << (self.misses - 1).min(6))
                        .min(Duration::from_micros(8).max(self.service_mean / 8));
                    self.not_before = Instant::now() + wait;
                    return Ok(None);
                }
                if self.misses == 0 {
                    self.read_whole = true;
                }
                self.misses = 0;
                let len = u16::from_le_bytes([b[0], b[1]]) as usize;
                if len <= BATCH_HEADER || len > self.batch_max {
                    return Err(QueueFault::Malformed(Malformed(
                        "response batch length out of range",
                    )));
                }
                if len > got {
                    let slot = o.n % self.slots;
                    let op = DmaOp::read(
                        self.region,
                        self.resp_off + slot * self.slot_bytes as u64 + got as u64,
                        // SAFETY: inside `inb` (len ≤ slot bytes).
                        unsafe { self.inb.as_mut_ptr().add(got) },
                        (len - got) as u32,
                        UD_READ | u64::from(index),
                    );
                    // SAFETY: `inb` is ours until the read completes.
                    unsafe { engine.post(op).map_err(QueueFault::Dma)? };
                    self.read = ReadState::Rest(len);
                    return Ok(None);
                }
                self.finish(len)
            }
            ReadState::Rest(len) => self.finish(len),
        }
    }

    fn finish(&mut self, len: usize) -> Result<Answered<'_, W>, QueueFault> {
        self.read = ReadState::Idle;
        let o = self.outstanding.pop_front().expect("outstanding batch");
        let took = o.sent_at.elapsed();
        self.service_mean = (self.service_mean * 7 + took.min(Duration::from_millis(100))) / 8;
        self.service = if took < self.service {
            took
        } else {
            self.service + (took - self.service) / 16
        };
        let b = &self.inb.as_slice()[..len];
        let (blen, _) = batch_header(b).map_err(QueueFault::Malformed)?;
        // The batch carries no count: its records are counted (and checked) before any is
        // delivered.
        let mut count = 0usize;
        for r in responses(b) {
            r.map_err(QueueFault::Malformed)?;
            count += 1;
        }
        if count != usize::from(o.count) || blen != len {
            return Err(QueueFault::Protocol(
                "response count differs from the request's",
            ));
        }
        Ok(Some((b, o)))
    }

    /// Takes back the waiter list of an answered batch (its memory serves a later batch).
    pub fn recycle(&mut self, mut waiters: Vec<W>) {
        waiters.clear();
        if self.spare_waiters.len() <= self.slots as usize {
            self.spare_waiters.push(waiters);
        }
    }

    /// Drops every outstanding batch (the host is gone); returns their waiters.
    pub fn abandon(&mut self) -> Vec<W> {
        let mut w: Vec<W> = self.outstanding.drain(..).flat_map(|o| o.waiters).collect();
        w.append(&mut self.building_waiters);
        self.building.clear();
        self.building_count = 0;
        self.building_expect = BATCH_HEADER;
        self.building_worst = BATCH_HEADER;
        w
    }
}

/// A queue pair that can no longer be used.
#[derive(Debug, thiserror::Error)]
pub enum QueueFault {
    /// The host wrote bytes that are not a valid batch.
    #[error(transparent)]
    Malformed(Malformed),
    /// The host broke the queue protocol.
    #[error("KV queue pair protocol violation: {0}")]
    Protocol(&'static str),
    /// The DMA engine failed.
    #[error("DMA: {0}")]
    Dma(DmaError),
}

/// Splits a DMA completion's `user_data` into the queue index.
pub fn queue_of(user_data: u64) -> u32 {
    user_data as u32
}
