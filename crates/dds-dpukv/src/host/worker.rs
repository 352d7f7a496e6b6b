//! The host's processing-engine threads (`docs/dpu-kv.md` §3): each polls its queue pairs,
//! prefetches what the requests of a batch will read (MICA), runs them on the store and
//! publishes the response batch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_kvmem::qp::{self, BatchWriter};

use crate::queue::HostQueue;
use crate::store::SharedStore;

/// Counters of the host workers.
#[derive(Default, Debug)]
pub struct WorkerStats {
    /// Requests served.
    pub requests: AtomicU64,
    /// Batches served.
    pub batches: AtomicU64,
    /// Queue pairs closed because their DPU end broke the protocol.
    pub broken: AtomicU64,
}

/// Sleep of an idle [`Idle::Save`] worker, µs.
pub const SAVE_SLEEP_US: u64 = 100;

/// How a worker waits for batches (the DPU cannot ring a host doorbell, only write host
/// memory, so a worker polls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Poll: spin 2 µs, then yield the core at every look, then sleep in short steps after
    /// 2 ms without work (lowest latency; `lat`).
    Poll,
    /// Sleep [`SAVE_SLEEP_US`] (timer slack 1 µs) whenever a look at every queue pair finds
    /// nothing: the DPU batches what arrives meanwhile (up to a ring of batches per queue
    /// pair), and the host spends its CPU on requests rather than on polling or wake-ups
    /// (`sav`, `dual`: host resource savings, at up to that much more latency).
    Save,
}

/// Serves `queues` round-robin until `stop`.
pub fn run(
    mut queues: Vec<HostQueue>,
    store: SharedStore,
    batch_max: usize,
    idle_mode: Idle,
    stop: &AtomicBool,
    stats: &WorkerStats,
) {
    if idle_mode == Idle::Save {
        // SAFETY: prctl(PR_SET_TIMERSLACK) takes an integer and changes only this thread.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000u64, 0u64, 0u64, 0u64) };
    }
    let mut req = Vec::with_capacity(batch_max);
    // The key hashes of a batch (a request is at least a few bytes: fewer than batch_max).
    let mut hashes = Vec::with_capacity(batch_max);
    let mut resp = Vec::with_capacity(batch_max);
    let mut live = vec![true; queues.len()];
    let mut last_work = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let mut work = false;
        for (qi, q) in queues.iter_mut().enumerate() {
            if !live[qi] {
                continue;
            }
            match q.take(&mut req) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::error!(error = %e, queue = qi, "KV queue pair closed");
                    live[qi] = false;
                    stats.broken.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            work = true;
            let (_, seq) = qp::batch_header(&req).expect("checked by take");
            hashes.clear();
            hashes.extend(
                qp::requests(&req)
                    .map_while(Result::ok)
                    .map(|r| dds_kvmem::key_hash(r.key)),
            );
            store.prefetch(&hashes);
            resp.clear();
            let mut w = BatchWriter::new(&mut resp, seq, batch_max);
            let mut n = 0u64;
            let mut ok = true;
            let mut held = store.holder();
            for (i, r) in qp::requests(&req).enumerate() {
                let Ok(r) = r else {
                    ok = false;
                    break;
                };
                // Hashed above, as every request before the first malformed one.
                let h = hashes[i];
                if !qp::serve(held.hashed(h), &r, h, &mut w) {
                    ok = false;
                    break;
                }
                n += 1;
            }
            // The partition is not held while the response is published.
            drop(held);
            if !ok {
                // A malformed batch, or one whose responses do not fit a slot: the DPU broke
                // the protocol; its requests that ran stay applied, the queue pair closes.
                tracing::error!(queue = qi, "malformed KV request batch: queue pair closed");
                live[qi] = false;
                stats.broken.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            w.finish();
            q.respond(&resp);
            stats.requests.fetch_add(n, Ordering::Relaxed);
            stats.batches.fetch_add(1, Ordering::Relaxed);
        }
        if idle_mode == Idle::Save {
            // No spin and no clock: a look that finds nothing sleeps at once. Batches come
            // tens of µs apart at full load, so a spin would rarely catch one and would cost
            // its length in host CPU at every batch.
            if !work {
                std::thread::sleep(Duration::from_micros(SAVE_SLEEP_US));
            }
            continue;
        }
        if work {
            last_work = Instant::now();
            continue;
        }
        let idle = last_work.elapsed();
        if idle < Duration::from_micros(2) {
            std::hint::spin_loop();
        } else if idle < Duration::from_millis(2) {
            // Whatever else runs on this core (a client, a front end) gets it at once.
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// Spawns a worker thread.
pub fn spawn(
    name: String,
    queues: Vec<HostQueue>,
    store: SharedStore,
    batch_max: usize,
    idle: Idle,
    stop: Arc<AtomicBool>,
    stats: Arc<WorkerStats>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(move || run(queues, store, batch_max, idle, &stop, &stats))
}
