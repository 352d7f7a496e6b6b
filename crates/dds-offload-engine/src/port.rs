//! `FileReadPort`: the bounded queues between the director threads and the DPU service thread
//! that owns the file service.
//!
//! Each director thread owns one *lane* ([`LaneHandle`]): a submission queue of offloaded
//! reads, a completion queue and an invalidation queue, all `crossbeam` `ArrayQueue`s
//! allocated once. The service thread holds the single [`PortService`]: it drains submissions
//! into the file service, posts completions back and applies invalidations to the cache
//! writer. The port also carries the DPU-wide version counter of the cache table.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_queue::ArrayQueue;

use dds_offload_api::ReadOp;
use dds_proto::Status;

/// The queue is full (or the lane has `depth` reads outstanding): try again later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("port queue full")]
pub struct Busy;

/// Result of an offloaded read: bytes read or a status code (`docs/records.md`).
pub type PortResult = Result<u32, u16>;

/// File-service `user_data` bit that marks reads submitted through the port.
pub const PORT_USER_DATA: u64 = 1 << 63;
/// Bits of a lane's own token.
pub const TOKEN_BITS: u32 = 48;

/// Why a [`ReadTarget`] did not start a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No room now: offer the read again later.
    Busy,
    /// The read fails with this status code (`dds_proto::Status`).
    Status(u16),
}

impl Refused {
    /// A refusal with `status`.
    pub fn status(status: Status) -> Self {
        if status == Status::Busy {
            Refused::Busy
        } else {
            Refused::Status(status.code())
        }
    }
}

/// Where offloaded reads are executed: the DPU's file service, seen through the only
/// operation the port needs. Completions are reported back with
/// [`PortService::on_completion`].
pub trait ReadTarget {
    /// Starts reading `op` into `dst`; the completion carries `user_data`.
    ///
    /// # Safety
    /// `dst` is valid for `op.size` bytes and untouched by others until the completion.
    unsafe fn submit_read(
        &mut self,
        op: ReadOp,
        dst: *mut u8,
        user_data: u64,
    ) -> Result<(), Refused>;
}

/// An offloaded read as the service side sees it.
#[derive(Clone, Copy, Debug)]
pub struct PortRead {
    /// The read.
    pub op: ReadOp,
    /// Destination: valid for `op.size` bytes until `complete(token, ..)` is called.
    pub dst: *mut u8,
    /// Identifies the read (lane and the lane's token); pass it to `complete`.
    pub token: u64,
}

// SAFETY: `dst` points into the director's buffer pool, which stays allocated until every
// submitted read has completed; the pointer is only handed to the file service.
unsafe impl Send for PortRead {}

/// Sizes of a port.
#[derive(Clone, Copy, Debug)]
pub struct PortConfig {
    /// Lanes (one per director thread).
    pub lanes: usize,
    /// Outstanding reads per lane (submission and completion queue capacity).
    pub depth: usize,
    /// Invalidation queue capacity per lane.
    pub invalidations: usize,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            lanes: 2,
            depth: 256,
            invalidations: 4096,
        }
    }
}

type Waker = Box<dyn Fn() + Send + Sync>;

struct Lane {
    sub: ArrayQueue<PortRead>,
    done: ArrayQueue<(u64, PortResult)>,
    inval: ArrayQueue<(u64, u64, u64)>,
    inval_seq: AtomicU64,
    inval_applied: AtomicU64,
    inflight: AtomicUsize,
    claimed: AtomicBool,
    sleeping: AtomicBool,
    /// Completions the sleeping thread waits for before it wants waking
    /// ([`LaneHandle::prepare_sleep_until`]).
    wake_at: AtomicUsize,
    waker: OnceLock<Waker>,
}

impl Lane {
    /// Whether the sleeping thread wants waking for its completions: `wake_at` of them
    /// wait, or all of its reads in flight are done.
    fn wake_due(&self) -> bool {
        let done = self.done.len();
        done > 0
            && (done >= self.wake_at.load(Ordering::SeqCst)
                || done >= self.inflight.load(Ordering::SeqCst))
    }

    /// Wakes the lane's thread if it sleeps, once: the first caller clears `sleeping`.
    fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) && self.sleeping.swap(false, Ordering::SeqCst) {
            if let Some(w) = self.waker.get() {
                w();
            }
        }
    }
}

/// The port between director threads and the file service thread.
pub struct FileReadPort {
    lanes: Box<[Lane]>,
    depth: usize,
    versions: AtomicU64,
    service_claimed: AtomicBool,
    service_sleeping: AtomicBool,
    service_waker: OnceLock<Waker>,
}

impl std::fmt::Debug for FileReadPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileReadPort")
            .field("lanes", &self.lanes.len())
            .field("depth", &self.depth)
            .field("version", &self.current_version())
            .finish()
    }
}

impl FileReadPort {
    /// A port with all queues allocated.
    pub fn new(cfg: PortConfig) -> Arc<FileReadPort> {
        let depth = cfg.depth.max(1);
        let lanes = (0..cfg.lanes.clamp(1, 1 << 14))
            .map(|_| Lane {
                sub: ArrayQueue::new(depth),
                done: ArrayQueue::new(depth),
                inval: ArrayQueue::new(cfg.invalidations.max(1)),
                inval_seq: AtomicU64::new(0),
                inval_applied: AtomicU64::new(0),
                inflight: AtomicUsize::new(0),
                claimed: AtomicBool::new(false),
                sleeping: AtomicBool::new(false),
                wake_at: AtomicUsize::new(1),
                waker: OnceLock::new(),
            })
            .collect();
        Arc::new(FileReadPort {
            lanes,
            depth,
            versions: AtomicU64::new(0),
            service_claimed: AtomicBool::new(false),
            service_sleeping: AtomicBool::new(false),
            service_waker: OnceLock::new(),
        })
    }

    /// Number of lanes.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Outstanding reads allowed per lane.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The newest version handed out by the DPU-wide counter.
    pub fn current_version(&self) -> u64 {
        self.versions.load(Ordering::SeqCst)
    }

    /// Takes a new version (larger than every version handed out before).
    pub fn next_version(&self) -> u64 {
        self.versions.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Claims lane `i` for one director thread (`None` if out of range or taken).
    pub fn lane(self: &Arc<Self>, i: usize) -> Option<LaneHandle> {
        let lane = self.lanes.get(i)?;
        if lane.claimed.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(LaneHandle {
            port: self.clone(),
            i,
        })
    }

    /// Claims the service side (once).
    pub fn service(self: &Arc<Self>) -> Option<PortService> {
        if self.service_claimed.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(PortService {
            port: self.clone(),
            deferred: None,
            cursor: 0,
        })
    }

    /// Installs the function that wakes the service thread when it sleeps (see
    /// [`PortService::prepare_sleep`]). Only the first call has an effect.
    pub fn set_service_waker(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.service_waker.set(Box::new(wake));
    }

    fn wake_service(&self) {
        // Once per sleep: the first caller clears the flag, later ones find the thread awake.
        if self.service_sleeping.load(Ordering::SeqCst)
            && self.service_sleeping.swap(false, Ordering::SeqCst)
        {
            if let Some(w) = self.service_waker.get() {
                w();
            }
        }
    }
}

/// The director side of one lane.
pub struct LaneHandle {
    port: Arc<FileReadPort>,
    i: usize,
}

impl std::fmt::Debug for LaneHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LaneHandle({})", self.i)
    }
}

impl LaneHandle {
    fn lane(&self) -> &Lane {
        &self.port.lanes[self.i]
    }

    /// The port.
    pub fn port(&self) -> &Arc<FileReadPort> {
        &self.port
    }

    /// Lane index.
    pub fn index(&self) -> usize {
        self.i
    }

    /// Submits an offloaded read. `token` (below 2^48) comes back with the completion.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `op.size` bytes and must not be accessed until the
    /// completion of `token` has been returned by [`poll_completions`](Self::poll_completions).
    pub unsafe fn submit(&self, op: ReadOp, dst: *mut u8, token: u64) -> Result<(), Busy> {
        // SAFETY: forwarded from the caller.
        unsafe { self.submit_deferred(op, dst, token) }?;
        self.port.wake_service();
        Ok(())
    }

    /// [`submit`](Self::submit) without waking a sleeping service thread: the reads of a
    /// round are queued, then [`wake_service`](Self::wake_service) wakes it once for all of
    /// them (and does not preempt the round on a shared core at its first read).
    ///
    /// # Safety
    /// As for [`submit`](Self::submit).
    pub unsafe fn submit_deferred(&self, op: ReadOp, dst: *mut u8, token: u64) -> Result<(), Busy> {
        let lane = self.lane();
        if token >> TOKEN_BITS != 0 || lane.inflight.load(Ordering::Relaxed) >= self.port.depth {
            return Err(Busy);
        }
        let read = PortRead {
            op,
            dst,
            token: ((self.i as u64) << TOKEN_BITS) | token,
        };
        lane.sub.push(read).map_err(|_| Busy)?;
        lane.inflight.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Wakes the service thread if it sleeps (after [`submit_deferred`](Self::submit_deferred)).
    pub fn wake_service(&self) {
        self.port.wake_service();
    }

    /// Reads submitted and not yet returned by `poll_completions`.
    pub fn inflight(&self) -> usize {
        self.lane().inflight.load(Ordering::Relaxed)
    }

    /// Calls `f(token, result)` for every completed read; returns how many.
    pub fn poll_completions(&self, mut f: impl FnMut(u64, PortResult)) -> usize {
        self.poll_completions_while(|token, res| {
            f(token, res);
            true
        })
    }

    /// As [`poll_completions`](Self::poll_completions), until `f` returns false: the
    /// completions after that one stay queued ([`completions_waiting`](Self::completions_waiting)).
    pub fn poll_completions_while(&self, mut f: impl FnMut(u64, PortResult) -> bool) -> usize {
        let lane = self.lane();
        let mut n = 0;
        while let Some((token, res)) = lane.done.pop() {
            lane.inflight.fetch_sub(1, Ordering::Relaxed);
            n += 1;
            if !f(token & ((1 << TOKEN_BITS) - 1), res) {
                break;
            }
        }
        n
    }

    /// Whether completed reads wait for [`poll_completions`](Self::poll_completions).
    pub fn completions_waiting(&self) -> bool {
        !self.lane().done.is_empty()
    }

    /// Free room in the invalidation queue (exact lower bound: this thread is its only
    /// producer).
    pub fn invalidation_room(&self) -> usize {
        let q = &self.lane().inval;
        q.capacity() - q.len()
    }

    /// Queues an invalidation of `key` at `version` for the cache writer; returns its
    /// sequence number (see [`invalidations_applied`](Self::invalidations_applied)).
    pub fn invalidate(&self, key: u64, version: u64) -> Result<u64, Busy> {
        let lane = self.lane();
        let seq = lane.inval_seq.load(Ordering::Relaxed) + 1;
        lane.inval.push((key, version, seq)).map_err(|_| Busy)?;
        lane.inval_seq.store(seq, Ordering::Relaxed);
        self.port.wake_service();
        Ok(seq)
    }

    /// Sequence number of the newest invalidation of this lane the cache writer has applied.
    pub fn invalidations_applied(&self) -> u64 {
        self.lane().inval_applied.load(Ordering::Acquire)
    }

    /// Installs the function that wakes this lane's thread (called by the service side when
    /// the thread is sleeping and a completion or an applied invalidation arrives).
    pub fn set_waker(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.lane().waker.set(Box::new(wake));
    }

    /// Marks the thread as going to sleep; returns false (and stays awake) if completions
    /// are already waiting. The thread is woken by the next completion.
    pub fn prepare_sleep(&self) -> bool {
        self.prepare_sleep_until(1)
    }

    /// As [`prepare_sleep`](Self::prepare_sleep), for a thread that cannot make progress
    /// before `n` (≥ 1) reads have completed: the service side wakes it once `n` completions
    /// wait, or every read in flight has completed, whichever comes first. Returns false (and
    /// stays awake) if that is so already.
    pub fn prepare_sleep_until(&self, n: usize) -> bool {
        let lane = self.lane();
        lane.wake_at.store(n.max(1), Ordering::SeqCst);
        lane.sleeping.store(true, Ordering::SeqCst);
        if lane.wake_due() {
            lane.sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The thread is awake again.
    pub fn end_sleep(&self) {
        self.lane().sleeping.store(false, Ordering::SeqCst);
    }

    /// The DPU-wide version counter's current value.
    pub fn current_version(&self) -> u64 {
        self.port.current_version()
    }
}

impl Drop for LaneHandle {
    fn drop(&mut self) {
        // A lane with reads still outstanding stays claimed: their completions must never
        // reach a later owner.
        if self.inflight() == 0 {
            self.lane().claimed.store(false, Ordering::Release);
        } else {
            tracing::error!(
                lane = self.i,
                inflight = self.inflight(),
                "lane dropped with reads outstanding: retired"
            );
        }
    }
}

/// The service side of the port, owned by the thread that owns the file service.
pub struct PortService {
    port: Arc<FileReadPort>,
    deferred: Option<PortRead>,
    cursor: usize,
}

impl std::fmt::Debug for PortService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortService")
            .field("deferred", &self.deferred.is_some())
            .finish()
    }
}

impl PortService {
    /// The port.
    pub fn port(&self) -> &Arc<FileReadPort> {
        &self.port
    }

    /// Hands up to `max` queued reads to `f`. When `f` returns false (the file service is
    /// busy) the read is kept and offered first on the next call. Lanes are served round
    /// robin. Returns the reads accepted.
    pub fn drain_submissions(&mut self, max: usize, mut f: impl FnMut(&PortRead) -> bool) -> usize {
        let mut n = 0;
        if let Some(r) = self.deferred.take() {
            if !f(&r) {
                self.deferred = Some(r);
                return 0;
            }
            n += 1;
        }
        let lanes = self.port.lanes.len();
        let mut idle = 0;
        while n < max && idle < lanes {
            let lane = &self.port.lanes[self.cursor];
            self.cursor = (self.cursor + 1) % lanes;
            match lane.sub.pop() {
                Some(r) => {
                    idle = 0;
                    if !f(&r) {
                        self.deferred = Some(r);
                        return n;
                    }
                    n += 1;
                }
                None => idle += 1,
            }
        }
        n
    }

    /// Reports the completion of the read `token` (from [`PortRead::token`]).
    pub fn complete(&self, token: u64, result: PortResult) {
        if let Some(lane) = self.push_completion(token, result) {
            // Pairs with the thread's `sleeping` store before its last look at `done`:
            // either it sees this completion or this sees it asleep.
            std::sync::atomic::fence(Ordering::SeqCst);
            if lane.wake_due() {
                lane.wake();
            }
        }
    }

    /// Queues the completion of the read `token` without waking its thread: a batch of
    /// completions is followed by one [`PortService::wake_lanes`], so a director thread
    /// is woken once per batch, not at its first completion while the rest is still coming.
    pub fn complete_deferred(&self, token: u64, result: PortResult) {
        self.push_completion(token, result);
    }

    /// Wakes every sleeping lane thread whose completions are due (after
    /// [`PortService::complete_deferred`] or
    /// [`PortService::on_completion_deferred`]).
    pub fn wake_lanes(&self) {
        // Pairs with each thread's `sleeping` store before its last look at `done`.
        std::sync::atomic::fence(Ordering::SeqCst);
        for lane in self.port.lanes.iter() {
            if lane.wake_due() {
                lane.wake();
            }
        }
    }

    fn push_completion(&self, token: u64, result: PortResult) -> Option<&Lane> {
        let Some(lane) = self.port.lanes.get((token >> TOKEN_BITS) as usize) else {
            tracing::error!(token, "completion for an unknown lane dropped");
            return None;
        };
        // Cannot fail: a lane never has more than `depth` reads outstanding.
        let mut item = (token, result);
        while let Err(back) = lane.done.push(item) {
            item = back;
            std::thread::yield_now();
        }
        Some(lane)
    }

    /// Calls `f(key, version)` for every queued invalidation, then publishes per lane that
    /// they are applied. Returns how many.
    pub fn drain_invalidations(&mut self, mut f: impl FnMut(u64, u64)) -> usize {
        let mut n = 0;
        for lane in self.port.lanes.iter() {
            let mut last = None;
            while let Some((key, version, seq)) = lane.inval.pop() {
                f(key, version);
                last = Some(seq);
                n += 1;
            }
            if let Some(seq) = last {
                lane.inval_applied.store(seq, Ordering::Release);
                lane.wake();
            }
        }
        n
    }

    /// Submits up to `max` queued reads to `target` (its `user_data` =
    /// [`PORT_USER_DATA`] | token). A read the target refuses with a status is completed at
    /// once with that status; a busy target keeps the read for the next call. Returns the
    /// reads taken.
    pub fn submit_to(&mut self, target: &mut impl ReadTarget, max: usize) -> usize {
        let mut total = 0;
        // In steps of 16 (the refusals of a step are completed after it), up to `max`: the
        // reads of a round reach the target together, and it submits them as one batch.
        while total < max {
            let step = (max - total).min(16);
            let mut failed: [(u64, u16); 16] = [(0, 0); 16];
            let mut nfailed = 0;
            let mut busy = false;
            let n = self.drain_submissions(step, |r| {
                // SAFETY: the director keeps `dst` valid for `size` bytes until the completion.
                match unsafe { target.submit_read(r.op, r.dst, PORT_USER_DATA | r.token) } {
                    Ok(()) => true,
                    Err(Refused::Busy) => {
                        busy = true;
                        false
                    }
                    Err(Refused::Status(code)) => {
                        failed[nfailed] = (r.token, code);
                        nfailed += 1;
                        true
                    }
                }
            });
            for &(token, code) in &failed[..nfailed] {
                self.complete(token, Err(code));
            }
            total += n;
            if busy || n < step {
                break;
            }
        }
        total
    }

    /// Routes a completion of the read target: returns true (and reports it) if `user_data`
    /// is a port read.
    pub fn on_completion(&self, user_data: u64, result: PortResult) -> bool {
        if user_data & PORT_USER_DATA == 0 {
            return false;
        }
        self.complete(user_data & !PORT_USER_DATA, result);
        true
    }

    /// [`PortService::on_completion`] without the wake-up: call
    /// [`PortService::wake_lanes`] after the batch.
    pub fn on_completion_deferred(&self, user_data: u64, result: PortResult) -> bool {
        if user_data & PORT_USER_DATA == 0 {
            return false;
        }
        self.complete_deferred(user_data & !PORT_USER_DATA, result);
        true
    }

    /// Whether submissions or invalidations are waiting.
    pub fn has_work(&self) -> bool {
        self.deferred.is_some()
            || self
                .port
                .lanes
                .iter()
                .any(|l| !l.sub.is_empty() || !l.inval.is_empty())
    }

    /// Marks the service thread as going to sleep; returns false (and stays awake) when work
    /// is already queued. Directors call the service waker while it sleeps.
    pub fn prepare_sleep(&self) -> bool {
        self.port.service_sleeping.store(true, Ordering::SeqCst);
        if self.has_work() {
            self.port.service_sleeping.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The service thread is awake again.
    pub fn end_sleep(&self) {
        self.port.service_sleeping.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_queues_and_sequence_numbers() {
        let port = FileReadPort::new(PortConfig {
            lanes: 2,
            depth: 2,
            invalidations: 2,
        });
        let a = port.lane(0).unwrap();
        assert!(port.lane(0).is_none());
        let b = port.lane(1).unwrap();
        let mut svc = port.service().unwrap();
        assert!(port.service().is_none());
        let mut buf = [0u8; 8];
        let op = ReadOp {
            file_id: 1,
            offset: 0,
            size: 8,
        };
        unsafe {
            a.submit(op, buf.as_mut_ptr(), 7).unwrap();
            a.submit(op, buf.as_mut_ptr(), 8).unwrap();
            assert_eq!(a.submit(op, buf.as_mut_ptr(), 9), Err(Busy));
            b.submit(op, buf.as_mut_ptr(), 1).unwrap();
        }
        let mut seen = vec![];
        // Refuse the second read: it is offered again first.
        let mut calls = 0;
        svc.drain_submissions(10, |r| {
            calls += 1;
            if calls == 2 {
                return false;
            }
            seen.push(r.token);
            true
        });
        svc.drain_submissions(10, |r| {
            seen.push(r.token);
            true
        });
        assert_eq!(seen.len(), 3);
        for t in seen {
            svc.complete(t, Ok(8));
        }
        let mut got = vec![];
        a.poll_completions(|t, r| got.push((t, r)));
        got.sort();
        assert_eq!(got, vec![(7, Ok(8)), (8, Ok(8))]);
        assert_eq!(b.poll_completions(|t, _| assert_eq!(t, 1)), 1);

        assert_eq!(a.invalidate(5, 1), Ok(1));
        assert_eq!(a.invalidate(6, 1), Ok(2));
        assert_eq!(a.invalidate(7, 1), Err(Busy));
        assert_eq!(a.invalidations_applied(), 0);
        let mut inv = vec![];
        svc.drain_invalidations(|k, v| inv.push((k, v)));
        assert_eq!(inv, vec![(5, 1), (6, 1)]);
        assert_eq!(a.invalidations_applied(), 2);
        assert_eq!(port.next_version(), 1);
        assert_eq!(a.current_version(), 1);
    }

    /// A target that takes `room` reads, refuses those of file 9 with a status, then is busy.
    struct Target {
        room: usize,
        taken: Vec<u64>,
    }

    impl ReadTarget for Target {
        unsafe fn submit_read(
            &mut self,
            op: ReadOp,
            _dst: *mut u8,
            user_data: u64,
        ) -> Result<(), Refused> {
            if self.taken.len() == self.room {
                return Err(Refused::Busy);
            }
            if op.file_id == 9 {
                return Err(Refused::status(Status::NotFound));
            }
            self.taken.push(user_data & !PORT_USER_DATA);
            Ok(())
        }
    }

    #[test]
    fn a_rounds_reads_reach_the_target_in_one_call_up_to_its_room() {
        let port = FileReadPort::new(PortConfig {
            lanes: 1,
            depth: 64,
            invalidations: 1,
        });
        let a = port.lane(0).unwrap();
        let mut svc = port.service().unwrap();
        let mut buf = [0u8; 8];
        // Reads `tokens`, those ending in 3 of file 9 (refused with a status).
        let mut queue = |tokens: std::ops::Range<u64>| {
            for t in tokens {
                let file_id = if t % 10 == 3 { 9 } else { 1 };
                let op = ReadOp {
                    file_id,
                    offset: 0,
                    size: 8,
                };
                unsafe { a.submit_deferred(op, buf.as_mut_ptr(), t).unwrap() };
            }
        };
        queue(0..40);
        // More than one step of 16: all 40 in one call (4 refused with a status).
        let mut target = Target {
            room: 64,
            taken: vec![],
        };
        assert_eq!(svc.submit_to(&mut target, 64), 40);
        assert_eq!(target.taken.len(), 36);
        let mut failed = vec![];
        a.poll_completions(|t, r| failed.push((t, r)));
        assert_eq!(
            failed,
            [3, 13, 23, 33].map(|t| (t, Err(Status::NotFound.code())))
        );
        // A busy target keeps the rest for the next call, in order.
        queue(44..64);
        let mut target = Target {
            room: 18,
            taken: vec![],
        };
        // 44..=62: 18 taken and 53 refused; 63 waits, and is refused at the next call.
        assert_eq!(svc.submit_to(&mut target, 64), 19);
        target.room = 64;
        assert_eq!(svc.submit_to(&mut target, 64), 1);
        let want: Vec<u64> = (44..64).filter(|t| t % 10 != 3).collect();
        assert_eq!(target.taken, want);
    }

    #[test]
    fn a_sleeping_lane_is_woken_once_when_its_threshold_or_its_last_read_completes() {
        let port = FileReadPort::new(PortConfig {
            lanes: 1,
            depth: 8,
            invalidations: 2,
        });
        let lane = port.lane(0).unwrap();
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = wakes.clone();
        lane.set_waker(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        let svc = port.service().unwrap();
        let mut buf = [0u8; 8];
        let op = ReadOp {
            file_id: 1,
            offset: 0,
            size: 8,
        };
        let token = |t: u64| t; // lane 0: the port's token is the lane's own
        for t in 0..5 {
            // SAFETY: `buf` outlives the reads; nothing reads it.
            unsafe { lane.submit(op, buf.as_mut_ptr(), t) }.unwrap();
        }
        // Three of the five must complete before the thread can go on.
        assert!(lane.prepare_sleep_until(3));
        svc.complete(token(0), Ok(8));
        svc.complete(token(1), Ok(8));
        assert_eq!(
            wakes.load(Ordering::SeqCst),
            0,
            "woken before its threshold"
        );
        svc.complete(token(2), Ok(8));
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        // One wake per sleep: the next completion finds it awake.
        svc.complete(token(3), Ok(8));
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        lane.end_sleep();
        assert_eq!(lane.poll_completions(|_, r| assert_eq!(r, Ok(8))), 4);
        // A threshold above what is in flight: the last read wakes it.
        assert!(lane.prepare_sleep_until(8));
        svc.complete(token(4), Ok(8));
        assert_eq!(wakes.load(Ordering::SeqCst), 2);
        lane.end_sleep();
        // Completions already waiting: it does not sleep at all.
        unsafe { lane.submit(op, buf.as_mut_ptr(), 5) }.unwrap();
        assert!(!lane.prepare_sleep_until(1));
        assert_eq!(lane.poll_completions(|_, _| {}), 1);
        svc.complete(token(5), Ok(8));
        assert!(!lane.prepare_sleep_until(3));
        assert_eq!(wakes.load(Ordering::SeqCst), 2);
    }
}
