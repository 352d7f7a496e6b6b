//! The service thread: sole owner of the file service, the DMA engine and the groups.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use dds_dma::{DmaCompletion, DmaEngine, EmulatedDma, RegionExport};
use dds_fs::{FileId, FileService, MetaDone, MetaOp};
use dds_proto::control::{
    BufferInfo, DirEntry, DmaCounters, DpuStats, EntryKind, ExposeInfo, FileInfo, GroupInfo,
    GroupStats, HelloInfo, HostAppInfo, Reply, Request, SpaceInfo, PROTOCOL_VERSION,
};
use dds_proto::Status;
use rustix::event::{PollFd, PollFlags, Timespec};

use crate::bell::{self, Bell};
use crate::control::Command;
use crate::group::{group_memory, ConnBuffers, Dispatch, GroupParams, GroupState, RegBuf};
use crate::offload::{port_result, FsReads, OffloadHooks};
use crate::DpuConfig;

mod commands;

use commands::MetaWaiter;

/// Control commands handled per loop iteration at most, so the data path keeps moving.
const COMMANDS_PER_ROUND: usize = 4;
/// Idle rounds (no work at all, nothing in flight on the device) before the thread parks
/// (`crate::bell`).
const SPIN_ROUNDS: u32 = 2_000;
/// Descriptors a park waits on without a heap allocation (the bell, the inline director's,
/// and the doorbells of up to 14 host groups).
const PARK_FDS: usize = 16;
/// Longest park: the thread looks at its stop flag (and at hosts that never ring their
/// doorbell) at least this often.
const PARK_MAX: Duration = Duration::from_millis(100);
/// Longest wait for the device (`Service::wait_device`): hosts do not ring while `Sleeping`
/// is clear, so a request published during the wait is found at the device's next
/// completion, at most this late.
const DEVICE_WAIT_MAX: Duration = Duration::from_micros(500);

/// Group indexes `0..n` starting at `round % n` and wrapping: the order of one data round.
#[derive(Clone, Copy, Debug)]
struct RoundRobin {
    start: usize,
    n: usize,
    k: usize,
}

impl RoundRobin {
    fn new(round: u64, n: usize) -> Self {
        let start = if n == 0 {
            0
        } else {
            (round % n as u64) as usize
        };
        RoundRobin { start, n, k: 0 }
    }
}

impl Iterator for RoundRobin {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.k == self.n {
            return None;
        }
        let i = (self.start + self.k) % self.n;
        self.k += 1;
        Some(i)
    }
}

/// How a park ended.
enum Park {
    /// Work turned up while getting ready: not blocked.
    NotParked,
    /// A bell or a doorbell rang.
    Woken,
    /// Nobody rang within `PARK_MAX`.
    TimedOut,
}

/// The descriptor of the director the service thread drives, if it runs inline (a function
/// of the offload hooks alone, so that it borrows them beside the file service).
fn inline_fd(offload: &Option<OffloadHooks>) -> Option<BorrowedFd<'_>> {
    offload
        .as_ref()
        .and_then(|o| o.inline.as_ref())
        .map(|d| d.wait_fd())
}

pub(crate) struct Service {
    config: DpuConfig,
    fs: FileService,
    /// The DMA engine: the service reaches host memory through it only, by region id.
    dma: Box<dyn DmaEngine>,
    /// Completions polled from the engine per call (allocated once).
    completions: Vec<DmaCompletion>,
    commands: Receiver<Command>,
    /// Rung by the control plane and the directors while the thread is parked.
    bell: Arc<Bell>,
    groups: Vec<Option<GroupState>>,
    next_group_id: u32,
    memory_used: u64,
    fs_inflight_max: usize,
    offload: Option<OffloadHooks>,
    /// Metadata operations handed to the file service, by user data: who waits for the reply.
    meta_waiting: HashMap<u64, MetaWaiter>,
    next_meta: u64,
    /// Data rounds so far: which group goes first (`RoundRobin`).
    round: u64,
    /// Application buffers registered per control connection.
    buffers: HashMap<u64, ConnBuffers>,
    /// Ids are never reused, so a stale id never names another buffer.
    next_buffer_id: u32,
}

/// DMA completions consumed per `poll` of the engine.
const COMPLETIONS_PER_POLL: usize = 64;

/// Offloaded reads handed from the port to the file service per round at most.
const PORT_READS_PER_ROUND: usize = 64;

impl Service {
    pub fn new(
        config: DpuConfig,
        fs: FileService,
        commands: Receiver<Command>,
        bell: Arc<Bell>,
        offload: Option<OffloadHooks>,
    ) -> Service {
        let dma = Box::new(EmulatedDma::new(config.dma_queue_depth, config.dma_cost));
        if let Some(o) = &offload {
            // Directors ring the bell when they queue reads for a parked service thread.
            let b = bell.clone();
            o.port.port().set_service_waker(move || b.ring());
        }
        let fs_inflight_max = fs.max_inflight() as usize;
        let mut fs = fs;
        // Metadata commits and their fdatasync run on the file service's metadata thread,
        // which rings our bell when one finished (the data plane never waits for them).
        let b = bell.clone();
        if let Err(e) = fs.start_meta_thread(move || b.ring()) {
            tracing::warn!(error = %e, "metadata commits stay on the service thread");
        }
        Service {
            config,
            fs,
            dma,
            completions: vec![DmaCompletion::default(); COMPLETIONS_PER_POLL],
            commands,
            bell,
            groups: Vec::new(),
            next_group_id: 1,
            memory_used: 0,
            fs_inflight_max,
            offload,
            meta_waiting: HashMap::new(),
            next_meta: 0,
            round: 0,
            buffers: HashMap::new(),
            next_buffer_id: 1,
        }
    }

    pub fn hello(&self) -> HelloInfo {
        HelloInfo {
            version: PROTOCOL_VERSION,
            payload_align: (self.fs.mem_align() as u32).max(8),
            max_io_bytes: self.config.max_io_bytes.min(self.fs.max_io_bytes()),
            block_size: self.fs.block_size(),
        }
    }

    pub fn run(&mut self, stop: &AtomicBool) {
        let mut idle_rounds = 0u32;
        loop {
            let stopping = stop.load(Ordering::Acquire);
            if stopping && self.fs.inflight() == 0 && self.fs.meta_pending() == 0 {
                // What is posted (deliveries among it) lands before the buffers go.
                self.drain_dma();
                break;
            }
            let mut worked = self.handle_commands();
            worked |= self.meta_round();
            worked |= self.data_round();
            worked |= self.poll_inline_director();
            self.reap_closed();
            if worked {
                idle_rounds = 0;
            } else if !self.config.park_when_idle {
                std::hint::spin_loop();
            } else if self.fs.inflight() > 0 {
                // Waiting on the device: block until it completes something, as the host's
                // own io_uring loop would, instead of polling it.
                if self.wait_device() {
                    idle_rounds = 0;
                }
            } else if idle_rounds < SPIN_ROUNDS {
                idle_rounds += 1;
                // Politely: a director thread woken by this round's completions may share
                // the DPU's core, and waits for it otherwise (a spin lasts ~0.25 ms).
                std::thread::yield_now();
            } else if !stopping {
                match self.park() {
                    // Rung: work is likely to follow, spin again for a while.
                    Park::Woken => idle_rounds = 0,
                    // Nobody rang: park again at once (after one more data round).
                    Park::TimedOut | Park::NotParked => {}
                }
            } else {
                // Stopping with metadata operations pending: keep polling, but let other
                // threads of this CPU run (the emulated DPU shares CPUs with the host).
                std::thread::yield_now();
            }
        }
    }

    /// One round of the director this thread drives, if it runs inline; whether it moved
    /// anything (then the next data round serves the reads it queued).
    fn poll_inline_director(&mut self) -> bool {
        let Some(o) = self.offload.as_mut() else {
            return false;
        };
        let Some(d) = o.inline.as_mut() else {
            return false;
        };
        let moved = d.poll();
        if d.finished() {
            o.inline = None;
        }
        moved
    }

    /// The inline director's part of an idle wait: `Err(())` when it has work (no wait), else
    /// the longest wait it allows (`None`: no inline director).
    fn inline_wait(&mut self) -> Result<Option<Duration>, ()> {
        match self.offload.as_mut().and_then(|o| o.inline.as_mut()) {
            None => Ok(None),
            Some(d) => d.prepare_wait().map(Some).ok_or(()),
        }
    }

    /// Waits for the device: called when a round found nothing to do while file-service I/O is
    /// in flight. Lets the DMA operations in flight complete (microseconds; what they fetched
    /// is work), then blocks until the device completes an operation, the bell rings (control
    /// plane, metadata thread, directors) or `DEVICE_WAIT_MAX` has passed. `Sleeping` stays
    /// clear: the rounds after the wait fetch what hosts published meanwhile. Returns true when
    /// it found work instead of waiting.
    fn wait_device(&mut self) -> bool {
        if self.drain_dma() {
            return true;
        }
        // Rung from now on: the wait ends at once.
        self.bell.drain();
        let found = !self.commands.is_empty()
            || self.fs.meta_ready()
            || self
                .groups
                .iter()
                .flatten()
                .any(|g| !g.broken && g.has_fetched_work())
            || self
                .offload
                .as_ref()
                .is_some_and(|o| !o.port.prepare_sleep());
        if found {
            return true;
        }
        let Ok(inline) = self.inline_wait() else {
            if let Some(o) = &self.offload {
                o.port.end_sleep();
            }
            return true;
        };
        let timeout = inline.map_or(DEVICE_WAIT_MAX, |t| t.min(DEVICE_WAIT_MAX));
        let r = self
            .fs
            .wait_for(self.bell.as_fd(), inline_fd(&self.offload), timeout);
        if let Some(o) = &self.offload {
            o.port.end_sleep();
        }
        if let Err(e) = r {
            tracing::warn!(error = %e, "waiting for the device failed");
            std::thread::yield_now();
        }
        false
    }

    /// Parks the thread until a host, the control plane or a director has work for it
    /// (adaptive polling, `crate::bell`), for `PARK_MAX` at most. Returns
    /// how it ended.
    fn park(&mut self) -> Park {
        let live = |g: &GroupState| !g.broken && !g.closing;
        if self
            .groups
            .iter()
            .flatten()
            .any(|g| g.outstanding() > 0 && !g.broken)
        {
            // Responses still to deliver (a full response ring): keep polling, politely.
            std::thread::yield_now();
            return Park::NotParked;
        }
        // The idle path may wait for the DMA engine: what is in flight (pointer reads of idle
        // groups, the last deliveries) completes now.
        let mut found = self.drain_dma();
        found |= self
            .groups
            .iter()
            .flatten()
            .any(|g| live(g) && g.has_fetched_work());
        if found {
            return Park::NotParked;
        }
        if let Some(o) = &self.offload {
            if !o.port.prepare_sleep() {
                return Park::NotParked;
            }
        }
        self.bell.drain();
        for g in self.groups.iter().flatten() {
            bell::drain(g.doorbell.as_fd());
        }
        // Announce, then look once more: a request published before a host could see the
        // announcement is found here; one published after it rings the doorbell. Every
        // group's `Sleeping` write and pointer read go in one doorbell.
        let mut found = !self.commands.is_empty() || self.fs.meta_ready();
        for (index, slot) in self.groups.iter_mut().enumerate() {
            let Some(g) = slot.as_mut().filter(|g| live(g)) else {
                continue;
            };
            let base = (index as u64) << 32;
            let r = g
                .set_sleeping(true, &mut *self.dma, base)
                .and_then(|()| g.post_fetch(&mut *self.dma, base));
            if let Err(e) = r {
                g.fail(&e);
            }
        }
        found |= self.drain_dma();
        found |= self
            .groups
            .iter()
            .flatten()
            .any(|g| live(g) && g.has_fetched_work());
        let mut how = Park::NotParked;
        let inline = self.inline_wait();
        if !found && inline.is_ok() {
            let max = inline.ok().flatten().map_or(PARK_MAX, |t| t.min(PARK_MAX));
            let also = inline_fd(&self.offload);
            let bell = &*self.bell;
            let doorbells = self.groups.iter().flatten().filter(|g| live(g));
            let n = 1 + usize::from(also.is_some()) + doorbells.clone().count();
            // On the stack (a park may follow every request at a low rate), unless there are
            // more groups than it has room for.
            let mut stack: [PollFd<'_>; PARK_FDS] =
                std::array::from_fn(|_| PollFd::new(bell, PollFlags::IN));
            let mut heap = Vec::new();
            let fds: &mut [PollFd<'_>] = if n <= PARK_FDS {
                &mut stack[..n]
            } else {
                heap.resize_with(n, || PollFd::new(bell, PollFlags::IN));
                &mut heap
            };
            let mut k = 1;
            if let Some(fd) = also.as_ref() {
                fds[k] = PollFd::new(fd, PollFlags::IN);
                k += 1;
            }
            for g in doorbells {
                fds[k] = PollFd::new(&g.doorbell, PollFlags::IN);
                k += 1;
            }
            debug_assert_eq!(k, n);
            let timeout = Timespec::try_from(max).expect("a small duration");
            how = match rustix::event::poll(fds, Some(&timeout)) {
                Ok(0) => Park::TimedOut,
                _ => Park::Woken,
            };
        }
        // Clearing the words is not waited for: the writes complete in the next rounds.
        for (index, slot) in self.groups.iter_mut().enumerate() {
            let Some(g) = slot.as_mut().filter(|g| live(g)) else {
                continue;
            };
            if let Err(e) = g.set_sleeping(false, &mut *self.dma, (index as u64) << 32) {
                g.fail(&e);
            }
        }
        self.dma.submit();
        if let Some(o) = &self.offload {
            o.port.end_sleep();
        }
        how
    }

    /// Consumes the DMA completions available now and hands each to its group. Returns true
    /// when one moved anything.
    fn reap_dma(&mut self) -> bool {
        let mut worked = false;
        loop {
            let n = self.dma.poll(&mut self.completions);
            for c in &mut self.completions[..n] {
                let index = (c.user_data >> 32) as usize;
                let result = std::mem::replace(&mut c.result, Ok(()));
                match self.groups.get_mut(index).and_then(Option::as_mut) {
                    Some(g) => match g.on_dma(c.user_data, result, &mut self.fs) {
                        Ok(w) => worked |= w,
                        Err(e) => g.fail(&e),
                    },
                    // A group is freed only once none of its operations is in flight.
                    None => tracing::error!(c.user_data, "DMA completion for a vanished group"),
                }
            }
            if n < self.completions.len() {
                return worked;
            }
        }
    }

    /// Rings the doorbell and consumes completions until no DMA operation is outstanding (the
    /// idle path and shutdown only). Returns true when a completion moved anything.
    fn drain_dma(&mut self) -> bool {
        self.dma.submit();
        let mut worked = false;
        while self.dma.outstanding() > 0 {
            worked |= self.reap_dma();
            std::hint::spin_loop();
        }
        worked
    }

    /// One pass of the data plane over every group. Returns true when anything moved.
    fn data_round(&mut self) -> bool {
        let mut worked = false;
        if let Some(o) = self.offload.as_mut() {
            // The director's invalidations first, so a forwarded write's keys are dropped
            // before anything else this round.
            worked |= o.maintainer.apply_port_invalidations(&mut o.port) > 0;
            worked |= o
                .port
                .submit_to(&mut FsReads(&mut self.fs), PORT_READS_PER_ROUND)
                > 0;
        }
        // Completions of the operations posted in earlier rounds: pointers and request
        // bytes fetched, deliveries done, registered transfers done.
        worked |= self.reap_dma();
        // The next fetch step of every group (a pointer read, or the reads of the bytes a
        // pointer read announced), in one doorbell. An idle group costs one pointer read in
        // flight at a time, never a wait.
        // Groups take turns at going first (DMA queue entries, file-service slots), so that
        // no group is always served after the others.
        self.round = self.round.wrapping_add(1);
        let order = RoundRobin::new(self.round, self.groups.len());
        for index in order {
            let Some(g) = self.groups[index].as_mut().filter(|g| !g.broken) else {
                continue;
            };
            if let Err(e) = g.post_fetch(&mut *self.dma, (index as u64) << 32) {
                g.fail(&e);
            }
        }
        self.dma.submit();
        // File-service slots promised to registered writes whose data is still on its way.
        let mut promised: usize = self
            .groups
            .iter()
            .flatten()
            .map(GroupState::reg_writes_unsubmitted)
            .sum();
        for index in order {
            let Some(g) = self.groups[index].as_mut().filter(|g| !g.broken) else {
                continue;
            };
            let user_base = (index as u64) << 32;
            let hooks = self.offload.as_mut().map(|o| &mut o.maintainer);
            let buffers = self.buffers.get(&g.conn);
            let before = g.reg_writes_unsubmitted();
            let r = g.dispatch(
                &mut self.fs,
                &mut *self.dma,
                user_base,
                self.fs_inflight_max.saturating_sub(promised - before),
                buffers,
                hooks,
            );
            promised = promised - before + g.reg_writes_unsubmitted();
            match r {
                Ok(d) => worked |= d == Dispatch::Blocked,
                Err(e) => g.fail(&e),
            }
        }
        let groups = &mut self.groups;
        let offload = &mut self.offload;
        let completed = self.fs.poll(|user, result| {
            if let Some(o) = offload.as_mut() {
                if o.port.on_completion_deferred(user, port_result(&result)) {
                    return;
                }
            }
            let index = (user >> 32) as usize;
            let hooks = offload.as_mut().map(|o| &mut o.maintainer);
            match groups.get_mut(index).and_then(|g| g.as_mut()) {
                Some(g) => g.on_complete(user, result, hooks),
                None => tracing::error!(user, "completion for a vanished group"),
            }
        });
        if let Some(o) = offload.as_ref() {
            // The directors' completions of this round: one wake-up each.
            o.port.wake_lanes();
        }
        worked |= completed > 0;
        let batch = self.config.delivery_batch_bytes;
        for index in order {
            let Some(g) = self.groups[index].as_mut().filter(|g| !g.broken) else {
                continue;
            };
            // Deliver full batches at once; deliver partial ones when this round found no new
            // completions (the service went idle), so latency stays low at low load.
            let flush = completed == 0 || g.outstanding() == 0;
            match g.advance(&mut *self.dma, (index as u64) << 32, batch, flush) {
                Ok(w) => worked |= w,
                Err(e) => g.fail(&e),
            }
        }
        // Deliveries, releases and registered transfers of every group: one doorbell.
        self.dma.submit();
        worked
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::sync::Arc;

    use dds_dma::CostModel;
    use dds_proto::control::{Reply, Request};
    use dds_shm::SharedRegion;

    use super::{RoundRobin, Service};
    use crate::bell::Bell;
    use crate::DpuConfig;

    const RING: u64 = 64 << 10;

    #[test]
    fn every_group_once_per_round_each_first_in_turn() {
        assert_eq!(RoundRobin::new(7, 0).count(), 0);
        for round in 0..9u64 {
            let order: Vec<usize> = RoundRobin::new(round, 3).collect();
            assert_eq!(order[0], (round % 3) as usize);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2]);
        }
    }

    const REGION: u64 = 2 * (dds_ring::POINTER_AREA_BYTES as u64 + RING);

    fn eventfd() -> OwnedFd {
        rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap()
    }

    /// A service whose DMA operations take `per_op_ns` each (long: nothing completes while a
    /// test looks), with `n` groups whose rings are zeroed and idle.
    fn service(n: usize, per_op_ns: u64) -> (Service, Vec<SharedRegion>) {
        let config = DpuConfig {
            dma_cost: Some(CostModel {
                per_op_ns,
                bytes_per_sec: 0,
            }),
            park_when_idle: false,
            ..DpuConfig::default()
        };
        let fs = crate::control::memory_file_service(64 << 20).unwrap();
        let (_tx, rx) = crossbeam_channel::unbounded();
        let mut svc = Service::new(config, fs, rx, Arc::new(Bell::new().unwrap()), None);
        let mut regions = Vec::new();
        for _ in 0..n {
            let shm = SharedRegion::create("svc-test", REGION as usize).unwrap();
            let fds = vec![shm.export_fd().unwrap(), eventfd(), eventfd()];
            let reply = svc.execute(
                7,
                Request::CreateGroup {
                    region_len: REGION,
                    req_offset: 0,
                    req_capacity: RING,
                    resp_offset: dds_ring::POINTER_AREA_BYTES as u64 + RING,
                    resp_capacity: RING,
                },
                fds,
            );
            assert!(matches!(reply, Reply::Ok(_)), "{reply:?}");
            regions.push(shm);
        }
        (svc, regions)
    }

    /// One service round over N idle groups posts one pointer read per group and rings the
    /// doorbell once; the next rounds wait for nothing and post nothing new while those reads
    /// are in flight.
    #[test]
    fn a_round_over_many_groups_rings_one_doorbell_and_never_waits() {
        const N: usize = 8;
        let (mut svc, _regions) = service(N, 50_000_000);
        let before = svc.dma.stats();
        let t = std::time::Instant::now();
        svc.data_round();
        assert_eq!(svc.dma.stats().doorbells - before.doorbells, 1);
        assert_eq!(svc.dma.outstanding(), N);
        for _ in 0..10 {
            svc.data_round();
        }
        // 50 ms per operation: a round that waited for one would show.
        assert!(t.elapsed() < std::time::Duration::from_millis(50));
        assert_eq!(svc.dma.stats().doorbells - before.doorbells, 1);
        assert_eq!(svc.dma.outstanding(), N);
        // Nothing completed yet: no DMA was executed.
        assert_eq!(svc.dma.stats().reads, 0);
    }

    /// With cheap operations, idle groups keep one pointer read in flight each, and every
    /// round's doorbell carries the reads of all groups.
    #[test]
    fn idle_groups_are_polled_in_batches() {
        const N: usize = 4;
        let (mut svc, _regions) = service(N, 1_000);
        for _ in 0..2_000 {
            svc.data_round();
        }
        let s = svc.dma.stats();
        assert!(s.reads > 0);
        // Each doorbell started the reads of several groups (the first round's N at once).
        assert!(s.reads >= s.doorbells, "{s:?}");
        assert!(svc.dma.outstanding() <= N);
        assert!(svc.groups.iter().flatten().all(|g| !g.broken));
    }

    /// A group's region unregistered under its in-flight operations: their completions
    /// fail with `UnknownRegion`, the group stops, the others carry on, nothing panics.
    #[test]
    fn completions_for_an_unregistered_region_stop_only_that_group() {
        let (mut svc, _regions) = service(3, 1_000);
        svc.data_round();
        let victim = svc.groups[1].as_ref().unwrap().region;
        svc.dma.unregister_region(victim).unwrap();
        svc.drain_dma();
        for _ in 0..100 {
            svc.data_round();
        }
        svc.drain_dma();
        let broken: Vec<bool> = svc.groups.iter().flatten().map(|g| g.broken).collect();
        assert_eq!(broken, [false, true, false]);
        assert!(svc.groups.iter().flatten().all(|g| g.dma_inflight() == 0));
    }

    /// Completions nobody expects (a foreign user data, a vanished group, a repeated one) are
    /// reported, never a panic.
    #[test]
    fn unexpected_completions_are_handled() {
        let (mut svc, _regions) = service(2, 1_000);
        let g = svc.groups[0].as_mut().unwrap();
        // A fetch completion while no fetch is in flight, and an unknown kind.
        assert!(g.on_dma(1 << 28, Ok(()), &mut svc.fs).is_err());
        assert!(g.on_dma(15 << 28, Ok(()), &mut svc.fs).is_err());
        // A registered transfer for no request.
        assert!(g.on_dma(6 << 28, Ok(()), &mut svc.fs).is_err());
        assert!(g
            .on_dma(2 << 28, Err(dds_dma::DmaError::QueueFull), &mut svc.fs)
            .is_err());
        // A completion the service routes to a slot with no group.
        let region = svc.groups[0].as_ref().unwrap().region;
        let local = dds_dma::LocalBuf::new(8, 8);
        // SAFETY: `local` outlives the operation, which completes in `drain_dma`.
        unsafe {
            svc.dma
                .post(dds_dma::DmaOp::read(
                    region,
                    0,
                    local.as_mut_ptr(),
                    8,
                    99 << 32,
                ))
                .unwrap()
        };
        svc.drain_dma();
        svc.data_round();
    }
}
