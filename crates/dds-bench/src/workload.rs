//! A host workload of random reads and writes through the DDS library: many threads share
//! one notification group, each keeps `depth` operations outstanding and polls completions
//! (any thread may reap any completion, as with a shared PollWait).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use crossbeam_queue::ArrayQueue;
use dds_host::{Dds, Status};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadSpec {
    pub file: u32,
    pub file_bytes: u64,
    pub io_bytes: u32,
    /// Fraction of reads (the rest are writes).
    pub read_ratio: f64,
    pub threads: usize,
    /// Outstanding operations per thread.
    pub depth: usize,
    pub ops: u64,
    pub seed: u64,
    /// Each slot's buffer is a range of one buffer registered with the DPU
    /// (`Dds::register_buffer`): reads land in it and writes are fetched from it by DMA, with
    /// no copy by the library.
    pub registered: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub ops: u64,
    pub reads: u64,
    pub writes: u64,
    pub errors: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

/// One thread's latency histogram and its read, write and error counts.
pub(crate) type ThreadTotals = (Histogram<u64>, u64, u64, u64);

/// Per-operation buffers and start times, shared by all threads.
struct Slots {
    buffers: Vec<AtomicBufPtr>,
    started_ns: Vec<AtomicU64>,
    free: ArrayQueue<u32>,
}

/// A buffer owned by one slot; accessed only by the thread holding the slot index.
struct AtomicBufPtr(std::cell::UnsafeCell<Box<[u8]>>);
// SAFETY: a slot's buffer is touched only by the holder of its index (issuer until issue,
// the DPU's completion path until completion, then the reaper).
unsafe impl Sync for AtomicBufPtr {}

/// Runs the workload and returns its figures. `progress` is called with the ops done so far.
pub fn run(
    dds: &Dds,
    spec: &WorkloadSpec,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<WorkloadResult> {
    if spec.io_bytes == 0
        || spec.file_bytes < spec.io_bytes as u64
        || spec.threads == 0
        || spec.depth == 0
    {
        bail!("workload needs io_bytes > 0, a file of at least one I/O, threads and depth > 0");
    }
    let nslots = spec.threads * spec.depth;
    let slots = Slots {
        buffers: (0..nslots)
            .map(|i| {
                AtomicBufPtr(std::cell::UnsafeCell::new(
                    vec![(i % 251) as u8; spec.io_bytes as usize].into_boxed_slice(),
                ))
            })
            .collect(),
        started_ns: (0..nslots).map(|_| AtomicU64::new(0)).collect(),
        free: ArrayQueue::new(nslots),
    };
    for i in 0..nslots {
        slots.free.push(i as u32).expect("sized");
    }
    let registered = match spec.registered {
        false => None,
        true => {
            let mut b = dds.register_buffer(nslots * spec.io_bytes as usize)?;
            for (i, chunk) in b
                .as_mut_slice()
                .chunks_mut(spec.io_bytes as usize)
                .enumerate()
            {
                chunk.fill((i % 251) as u8);
            }
            Some(b)
        }
    };
    let registered = registered.as_ref();
    let issued = AtomicU64::new(0);
    let completed = AtomicU64::new(0);
    let epoch = Instant::now();
    let barrier = Barrier::new(spec.threads);
    let blocks = spec.file_bytes / spec.io_bytes as u64;
    let group = dds.default_group().clone();
    let results: Vec<Result<ThreadTotals>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..spec.threads)
            .map(|t| {
                let (slots, issued, completed, barrier, group) =
                    (&slots, &issued, &completed, &barrier, &group);
                let reg_at = move |slot: u32| slot as usize * spec.io_bytes as usize;
                s.spawn(move || -> Result<ThreadTotals> {
                    let mut rng = SmallRng::seed_from_u64(
                        spec.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    );
                    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
                    let (mut reads, mut writes, mut errors) = (0u64, 0u64, 0u64);
                    barrier.wait();
                    loop {
                        // Issue up to `depth` operations while slots are free (all threads
                        // together keep at most threads × depth outstanding).
                        for _ in 0..spec.depth {
                            if issued.fetch_add(1, Ordering::Relaxed) >= spec.ops {
                                issued.fetch_sub(1, Ordering::Relaxed);
                                break;
                            }
                            let Some(slot) = slots.free.pop() else {
                                issued.fetch_sub(1, Ordering::Relaxed);
                                break;
                            };
                            let offset = rng.gen_range(0..blocks) * spec.io_bytes as u64;
                            let now = epoch.elapsed().as_nanos() as u64;
                            slots.started_ns[slot as usize].store(now, Ordering::Relaxed);
                            // SAFETY: this thread holds the slot index.
                            let buf = unsafe { &mut *slots.buffers[slot as usize].0.get() };
                            let is_read = rng.gen_bool(spec.read_ratio);
                            let r = if let Some(b) = registered {
                                if is_read {
                                    // SAFETY: the slot's range of the registered buffer is
                                    // not touched until the completion returns the slot.
                                    unsafe {
                                        dds.read_registered(
                                            spec.file,
                                            offset,
                                            b,
                                            reg_at(slot),
                                            spec.io_bytes,
                                            slot as u64,
                                        )
                                    }
                                } else {
                                    dds.write_registered(
                                        spec.file,
                                        offset,
                                        b,
                                        reg_at(slot),
                                        spec.io_bytes,
                                        slot as u64,
                                    )
                                }
                            } else if is_read {
                                // SAFETY: the buffer lives in `slots` for the whole run and
                                // is not touched until the completion returns the slot.
                                unsafe {
                                    dds.read(
                                        spec.file,
                                        offset,
                                        buf.as_mut_ptr(),
                                        spec.io_bytes,
                                        slot as u64,
                                    )
                                }
                            } else {
                                dds.write(spec.file, offset, buf, slot as u64)
                            };
                            match r {
                                Ok(()) if is_read => reads += 1,
                                Ok(()) => writes += 1,
                                Err(e)
                                    if matches!(
                                        e.status,
                                        Status::RingFull | Status::TooManyOutstanding
                                    ) =>
                                {
                                    issued.fetch_sub(1, Ordering::Relaxed);
                                    slots.free.push(slot).expect("slot returned");
                                    break;
                                }
                                Err(e) => return Err(e.into()),
                            }
                        }
                        if completed.load(Ordering::Relaxed) >= spec.ops {
                            break;
                        }
                        if let Some(c) = group.poll_wait(Duration::from_millis(2))? {
                            let now = epoch.elapsed().as_nanos() as u64;
                            let start = slots.started_ns[c.io_ctx as usize].load(Ordering::Relaxed);
                            hist.saturating_record(now.saturating_sub(start).max(1));
                            if c.status != Status::Ok {
                                errors += 1;
                            }
                            slots.free.push(c.io_ctx as u32).expect("slot returned");
                            let done = completed.fetch_add(1, Ordering::Relaxed) + 1;
                            if done % 1024 == 0 {
                                progress(done);
                            }
                        }
                    }
                    Ok((hist, reads, writes, errors))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("workload thread panicked"))
            .collect()
    });
    let seconds = epoch.elapsed().as_secs_f64();
    progress(completed.load(Ordering::Relaxed));
    summarize(results, seconds)
}

/// Merges the threads' histograms and counts into the run's figures.
pub(crate) fn summarize(
    results: Vec<Result<ThreadTotals>>,
    seconds: f64,
) -> Result<WorkloadResult> {
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let (mut reads, mut writes, mut errors) = (0, 0, 0);
    for r in results {
        let (h, rd, wr, er) = r?;
        hist.add(h)?;
        reads += rd;
        writes += wr;
        errors += er;
    }
    let ops = hist.len();
    Ok(WorkloadResult {
        ops,
        reads,
        writes,
        errors,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        p999_us: hist.value_at_quantile(0.999) as f64 / 1e3,
    })
}
