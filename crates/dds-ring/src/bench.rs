//! The ring benchmark of the paper's Fig. 16: host producer threads send small messages as
//! fast as they can, one DPU consumer thread drains them.
//!
//! The DMA-based designs run through the real [`EmulatedDma`] over a [`SharedRegion`]; with a
//! [`CostModel`] their DMA operations cost what PCIe would charge. crossbeam's `ArrayQueue`
//! is the in-process reference (no DMA at all).
//!
//! Every `sample_every`-th message of a producer carries its enqueue timestamp (taken before
//! the first attempt, so waiting for room counts); the consumer records the time to
//! consumption of those in a histogram. Other messages carry the producer id and sequence.
//!
//! Producers retry on `Retry` after yielding their core. The consumer polls without pause while
//! messages flow and yields after [`IDLE_POLLS_BEFORE_YIELD`] empty polls in a row.
//!
//! Reading the numbers on a small machine: with more producer threads than cores, a producer
//! can be preempted between reserving its record (CAS on `Tail`) and publishing it
//! (`Progress`); the progress ring's consumer then waits until that thread runs again, which
//! on a real host, one thread per core, does not happen. Conversely, a lock only collapses
//! (the paper's 1.4 M msgs/s at 64 producers) when many cores spin on it at once; with two
//! cores at most two threads contend. Run-to-run variation is large when the machine is
//! shared; repeat runs and compare medians.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use dds_dma::{CostModel, DmaEngine, EmulatedDma};
use dds_shm::SharedRegion;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::baseline::{
    FarmConsumer, FarmProducer, LockedProducer, RingConsumer, RingProducer, FARM_SLOT_HEADER,
};
use crate::format::POINTER_AREA_BYTES;
use crate::request::{RequestConsumer, RequestProducer};
use crate::{RingError, RingFault};

/// The designs compared in Fig. 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Design {
    /// DDS's progress ring (lock-free, batched DMA).
    Progress,
    /// One slot and valid flag per message; two DMA operations per message.
    FarmStyle,
    /// Producers serialize on a lock; batched DMA consumer.
    LockBased,
    /// crossbeam `ArrayQueue`, in process, no DMA.
    CrossbeamArrayQueue,
}

impl Design {
    pub const ALL: [Design; 4] = [
        Design::Progress,
        Design::FarmStyle,
        Design::LockBased,
        Design::CrossbeamArrayQueue,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::Progress => "progress",
            Design::FarmStyle => "farm_style",
            Design::LockBased => "lock_based",
            Design::CrossbeamArrayQueue => "crossbeam_array_queue",
        }
    }
}

impl std::str::FromStr for Design {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Design::ALL
            .into_iter()
            .find(|d| d.name() == s.replace('-', "_"))
            .ok_or_else(|| format!("unknown ring design {s:?} (progress, farm_style, lock_based, crossbeam_array_queue)"))
    }
}

/// Settings of one benchmark run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub design: Design,
    pub producers: usize,
    pub msgs_per_producer: usize,
    /// ≥ 8.
    pub msg_bytes: usize,
    pub cost: Option<CostModel>,
    /// Data bytes of the ring (FaRM: slots × slot size; ArrayQueue: this / 16 entries).
    pub ring_bytes: u64,
    /// Every n-th message of a producer carries a timestamp.
    pub sample_every: usize,
    /// Nice value for the consumer thread (default `None`: normal priority). A DPU poller has
    /// cores of its own; here it shares the host's with every producer thread, and a raised
    /// priority can stand in for its own core. Ignored if the process may not raise
    /// priorities; see [`BenchPoint::consumer_nice`].
    pub consumer_nice: Option<i32>,
    /// What a producer does on `Retry`: sleep this long, or (`None`) yield its core.
    pub retry_sleep: Option<Duration>,
}

impl BenchConfig {
    pub fn new(
        design: Design,
        producers: usize,
        msgs_per_producer: usize,
        msg_bytes: usize,
        cost: Option<CostModel>,
    ) -> Self {
        BenchConfig {
            design,
            producers,
            msgs_per_producer,
            msg_bytes,
            cost,
            ring_bytes: 1 << 20,
            sample_every: 16,
            consumer_nice: None,
            retry_sleep: None,
        }
    }
}

/// Result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct BenchPoint {
    pub design: Design,
    pub producers: usize,
    pub msgs_per_producer: usize,
    pub msg_bytes: usize,
    pub cost_model: bool,
    pub ring_bytes: u64,
    pub messages: u64,
    pub elapsed_ns: u64,
    pub msgs_per_sec: f64,
    pub median_latency_ns: u64,
    pub p99_latency_ns: u64,
    pub latency_samples: u64,
    /// Consumer polls that returned messages.
    pub batches: u64,
    pub mean_batch: f64,
    /// DMA operations the consumer issued (0 for the in-process queue), polls that found
    /// nothing included.
    pub dma_ops: u64,
    pub dma_reads: u64,
    /// DMA writes: one `Head` write per batch for the progress and lock-based rings, one flag
    /// write per message for the FaRM-style ring.
    pub dma_writes: u64,
    pub dma_ops_per_msg: f64,
    /// `Retry` answers the producers got.
    pub producer_retries: u64,
    /// The consumer thread's nice value if it was raised, else `None` (normal priority).
    pub consumer_nice: Option<i32>,
}

/// Runs one point with the default ring size (1 MiB) and sampling (1 in 16).
pub fn run(
    design: Design,
    producers: usize,
    msgs_per_producer: usize,
    msg_bytes: usize,
    cost: Option<CostModel>,
) -> BenchPoint {
    run_config(&BenchConfig::new(
        design,
        producers,
        msgs_per_producer,
        msg_bytes,
        cost,
    ))
}

const SAMPLED: u64 = 1 << 63;
/// Empty consumer polls in a row before the consumer thread yields its core.
pub const IDLE_POLLS_BEFORE_YIELD: u32 = 64;

/// Runs one point.
///
/// # Panics
/// If `msg_bytes < 8`, `producers == 0`, or a ring reports corruption.
pub fn run_config(cfg: &BenchConfig) -> BenchPoint {
    assert!(cfg.msg_bytes >= 8, "messages carry an 8-byte stamp");
    assert!(cfg.producers > 0 && cfg.sample_every > 0);
    let mut engine = EmulatedDma::new(64, cfg.cost);
    let (producer, consumer): (Arc<dyn RingProducer>, Box<dyn RingConsumer>) = match cfg.design {
        Design::Progress | Design::LockBased => {
            let capacity = cfg.ring_bytes;
            let region = Arc::new(
                SharedRegion::create("dds-ring-bench", POINTER_AREA_BYTES + capacity as usize)
                    .expect("shared memory for the ring"),
            );
            let id = crate::register_local(&mut engine, &region).expect("register the ring");
            let consumer =
                Box::new(RequestConsumer::new(id, 0, capacity).expect("ring inside its region"));
            let producer: Arc<dyn RingProducer> = if cfg.design == Design::Progress {
                Arc::new(RequestProducer::with_region(region, 0, capacity, capacity))
            } else {
                Arc::new(LockedProducer::with_region(region, 0, capacity, capacity))
            };
            (producer, consumer)
        }
        Design::FarmStyle => {
            let slot_bytes = FARM_SLOT_HEADER + cfg.msg_bytes.next_multiple_of(8);
            let slots = (cfg.ring_bytes / slot_bytes as u64).max(1);
            let region = Arc::new(
                SharedRegion::create("dds-farm-bench", (slots as usize * slot_bytes).max(64))
                    .expect("shared memory for the ring"),
            );
            let id = crate::register_local(&mut engine, &region).expect("register the ring");
            let producer = FarmProducer::with_region(region, 0, slots, slot_bytes);
            producer.init();
            (
                Arc::new(producer),
                Box::new(FarmConsumer::new(id, 0, slots, slot_bytes)),
            )
        }
        Design::CrossbeamArrayQueue => {
            let entries = (cfg.ring_bytes / 16).max(1) as usize;
            if cfg.msg_bytes == 8 {
                let q = Arc::new(ArrayQueue::new(entries));
                (Arc::new(WordQueue(q.clone())), Box::new(WordQueue(q)))
            } else {
                let q = Arc::new(ArrayQueue::new(entries));
                (Arc::new(BoxQueue(q.clone())), Box::new(BoxQueue(q)))
            }
        }
    };
    drive(cfg, producer, consumer, engine)
}

fn drive(
    cfg: &BenchConfig,
    producer: Arc<dyn RingProducer>,
    mut consumer: Box<dyn RingConsumer>,
    mut engine: EmulatedDma,
) -> BenchPoint {
    let total = (cfg.producers * cfg.msgs_per_producer) as u64;
    let start_gate = Arc::new(Barrier::new(cfg.producers + 1));
    let epoch = Instant::now();
    let retries = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::with_capacity(cfg.producers);
    for id in 0..cfg.producers {
        let producer = producer.clone();
        let gate = start_gate.clone();
        let retries = retries.clone();
        let failed = failed.clone();
        let (n, every, bytes) = (cfg.msgs_per_producer, cfg.sample_every, cfg.msg_bytes);
        let retry_sleep = cfg.retry_sleep;
        handles.push(std::thread::spawn(move || {
            // A producer that panics stops the consumer instead of leaving it waiting.
            let _flag = PanicFlag(failed.clone());
            // The message buffer is allocated once, before the timed part.
            let mut msg = vec![0u8; bytes];
            let mut my_retries = 0u64;
            gate.wait();
            for i in 0..n {
                let word = if i % every == 0 {
                    SAMPLED | epoch.elapsed().as_nanos() as u64
                } else {
                    (id as u64) << 32 | i as u64
                };
                msg[..8].copy_from_slice(&word.to_le_bytes());
                loop {
                    match producer.try_send(&msg) {
                        Ok(()) => break,
                        Err(RingError::Retry) => {
                            my_retries += 1;
                            if failed.load(Ordering::Relaxed) {
                                return;
                            }
                            match retry_sleep {
                                Some(d) => std::thread::sleep(d),
                                None => std::thread::yield_now(),
                            }
                        }
                        Err(RingError::TooLarge) => {
                            panic!("benchmark message too large for the ring")
                        }
                    }
                }
            }
            retries.fetch_add(my_retries, Ordering::Relaxed);
        }));
    }
    // The consumer runs on a thread of its own, so that a raised priority ends with it.
    let nice = cfg.consumer_nice;
    let gate = start_gate.clone();
    let failed_c = failed.clone();
    let consumer_thread = std::thread::spawn(move || {
        let mut hist =
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram bounds");
        let mut received = 0u64;
        let mut batches = 0u64;
        let dma_before = engine.stats();
        let consumer_nice = nice.filter(|&n| raise_priority(n));
        gate.wait();
        let start = Instant::now();
        let mut result: Result<(), RingFault> = Ok(());
        let mut idle_polls = 0u32;
        while received < total {
            if failed_c.load(Ordering::Relaxed) {
                break;
            }
            let mut on_msg = |m: &[u8]| {
                let word = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
                if word & SAMPLED != 0 {
                    let now = epoch.elapsed().as_nanos() as u64;
                    hist.saturating_record(now.saturating_sub(word & !SAMPLED).max(1));
                }
                received += 1;
            };
            match consumer.poll_batch(&mut engine, &mut on_msg) {
                Ok(0) => {
                    // A DPU poller owns its core and just polls again. Here it shares the
                    // host's cores, so after a while without messages it lets others run.
                    idle_polls += 1;
                    if idle_polls >= IDLE_POLLS_BEFORE_YIELD {
                        idle_polls = 0;
                        std::thread::yield_now();
                    }
                }
                Ok(_) => {
                    batches += 1;
                    idle_polls = 0;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let elapsed = start.elapsed().max(Duration::from_nanos(1));
        if result.is_err() {
            failed_c.store(true, Ordering::Relaxed);
        }
        let stats = engine.stats();
        let dma = (
            stats.reads - dma_before.reads,
            stats.writes - dma_before.writes,
        );
        (result, hist, received, batches, elapsed, dma, consumer_nice)
    });
    for h in handles {
        if h.join().is_err() {
            panic!("ring benchmark: a producer thread panicked");
        }
    }
    let (result, hist, received, batches, elapsed, (dma_reads, dma_writes), consumer_nice) =
        consumer_thread.join().expect("consumer thread");
    if let Err(e) = result {
        panic!("ring benchmark: {e}");
    }
    BenchPoint {
        design: cfg.design,
        producers: cfg.producers,
        msgs_per_producer: cfg.msgs_per_producer,
        msg_bytes: cfg.msg_bytes,
        cost_model: cfg.cost.is_some(),
        ring_bytes: cfg.ring_bytes,
        messages: received,
        elapsed_ns: elapsed.as_nanos() as u64,
        msgs_per_sec: received as f64 / elapsed.as_secs_f64(),
        median_latency_ns: hist.value_at_quantile(0.5),
        p99_latency_ns: hist.value_at_quantile(0.99),
        latency_samples: hist.len(),
        batches,
        mean_batch: received as f64 / batches.max(1) as f64,
        dma_ops: dma_reads + dma_writes,
        dma_reads,
        dma_writes,
        dma_ops_per_msg: (dma_reads + dma_writes) as f64 / received.max(1) as f64,
        producer_retries: retries.load(Ordering::Relaxed),
        consumer_nice,
    }
}

/// Sets the calling thread's nice value; whether it worked.
fn raise_priority(nice: i32) -> bool {
    // SAFETY: plain system calls on the calling thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) == 0 }
}

/// Raises the flag if the thread that owns it panics.
struct PanicFlag(Arc<AtomicBool>);

impl Drop for PanicFlag {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

/// The in-process reference for 8-byte messages: the message is the queue element.
struct WordQueue(Arc<ArrayQueue<u64>>);

impl RingProducer for WordQueue {
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError> {
        let w = u64::from_le_bytes(msg.try_into().map_err(|_| RingError::TooLarge)?);
        self.0.push(w).map_err(|_| RingError::Retry)
    }
}

impl RingConsumer for WordQueue {
    fn poll_batch(
        &mut self,
        _engine: &mut dyn DmaEngine,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingFault> {
        let mut n = 0;
        while let Some(w) = self.0.pop() {
            f(&w.to_le_bytes());
            n += 1;
        }
        Ok(n)
    }
}

/// The in-process reference for larger messages: each message is an owned buffer (the
/// allocation and copy are what handing a variable-size message over in process costs).
struct BoxQueue(Arc<ArrayQueue<Box<[u8]>>>);

impl RingProducer for BoxQueue {
    fn try_send(&self, msg: &[u8]) -> Result<(), RingError> {
        self.0.push(msg.into()).map_err(|_| RingError::Retry)
    }
}

impl RingConsumer for BoxQueue {
    fn poll_batch(
        &mut self,
        _engine: &mut dyn DmaEngine,
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingFault> {
        let mut n = 0;
        while let Some(m) = self.0.pop() {
            f(&m);
            n += 1;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench;

    #[test]
    fn bench_smoke_all_designs() {
        for design in Design::ALL {
            for bytes in [8, 24] {
                let mut cfg = BenchConfig::new(design, 4, 2000, bytes, None);
                cfg.ring_bytes = 1 << 14;
                let p = bench::run_config(&cfg);
                assert_eq!(p.messages, 8000, "{design:?}");
                assert!(p.msgs_per_sec > 0.0);
                assert_eq!(p.latency_samples, 4 * 2000 / 16);
                assert!(p.median_latency_ns <= p.p99_latency_ns);
                match design {
                    // A read and a write per message (plus reads that found nothing).
                    Design::FarmStyle => {
                        assert_eq!(p.dma_writes, p.messages);
                        assert!(p.dma_reads > p.messages);
                    }
                    Design::CrossbeamArrayQueue => assert_eq!(p.dma_ops, 0),
                    // One Head write per batch, batches of several messages.
                    _ => {
                        assert_eq!(p.dma_writes, p.batches);
                        assert!(p.batches < p.messages);
                    }
                }
            }
        }
        assert_eq!("lock-based".parse::<Design>(), Ok(Design::LockBased));
        assert!("nope".parse::<Design>().is_err());
    }

    #[test]
    fn bench_with_cost_model_counts_dma() {
        let mut cfg = BenchConfig::new(
            Design::Progress,
            2,
            500,
            8,
            Some(dds_dma::CostModel::bluefield2()),
        );
        cfg.ring_bytes = 1 << 14;
        let p = bench::run_config(&cfg);
        assert_eq!(p.messages, 1000);
        assert!(p.cost_model && p.batches > 0);
        // At least 1 µs per DMA operation, three operations per batch at least.
        assert!(p.elapsed_ns >= p.batches * 3 * 1000);
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["design"], "progress");
        assert_eq!(json["messages"], 1000);
    }

    /// Fig. 16's robust claim with the cost model on: batching moves far more messages than one
    /// DMA read and one DMA write per message can. Release mode:
    /// `cargo test -p dds-ring --release -- --ignored fig16`.
    #[test]
    #[ignore = "benchmark (seconds of load): cargo test -p dds-ring --release -- --ignored fig16"]
    fn fig16_progress_ring_beats_farm_style_tenfold() {
        let cost = Some(dds_dma::CostModel::bluefield2());
        let progress = bench::run(Design::Progress, 64, 20_000, 8, cost);
        let farm = bench::run(Design::FarmStyle, 64, 1_000, 8, cost);
        println!(
            "progress {:.2} M msgs/s, FaRM-style {:.3} M msgs/s",
            progress.msgs_per_sec / 1e6,
            farm.msgs_per_sec / 1e6
        );
        // Two DMA operations of at least 1 µs each per message.
        assert!(farm.msgs_per_sec <= 500_000.0 * 1.05);
        assert!(progress.msgs_per_sec >= 10.0 * farm.msgs_per_sec);
        assert!(progress.dma_ops_per_msg < 0.5);
    }
}
