//! The service thread: sole owner of the file service, the DMA engine and the groups.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use dds_dma::{DmaCompletion, DmaEngine, EmulatedDma, RegionExport};
use dds_fs::{FileId, FileService, MetaDone, MetaOp};
use dds_proto::control::{
    BufferInfo, DirEntry, DmaCounters, DpuStats, EntryKind, ExposeInfo, FileInfo, GroupInfo,
    GroupStats, HelloInfo, Reply, Request, SpaceInfo, PROTOCOL_VERSION,
};
use dds_proto::Status;
use rustix::event::{PollFd, PollFlags, Timespec};

use crate::bell::{self, Bell};
use crate::control::Command;
use crate::group::{group_memory, ConnBuffers, Dispatch, GroupParams, GroupState, RegBuf};
use crate::offload::{port_result, FsReads, OffloadHooks};
use crate::DpuConfig;

/// Control commands handled per loop iteration at most, so the data path keeps moving.
const COMMANDS_PER_ROUND: usize = 4;
/// Idle rounds (no work at all, nothing in flight on the device) before the thread parks
/// (`crate::bell`).
const SPIN_ROUNDS: u32 = 2_000;
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

/// A control request waiting for its metadata operation (`FileService::submit_meta`).
struct MetaWaiter {
    reply: Sender<Reply>,
    /// What the reply carries.
    kind: MetaKind,
}

#[derive(Clone, Copy)]
enum MetaKind {
    /// `()`.
    Unit,
    /// The new file's `FileInfo`.
    Created,
    /// `()`; the file (this id) is withdrawn from the offload engine.
    Deleted(u32),
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
        let r = self.fs.wait_for(self.bell.as_fd(), DEVICE_WAIT_MAX);
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
        if !found {
            let mut fds = Vec::with_capacity(1 + self.groups.len());
            fds.push(PollFd::new(&*self.bell, PollFlags::IN));
            for g in self.groups.iter().flatten().filter(|g| live(g)) {
                fds.push(PollFd::new(&g.doorbell, PollFlags::IN));
            }
            let timeout = Timespec::try_from(PARK_MAX).expect("a small duration");
            how = match rustix::event::poll(&mut fds, Some(&timeout)) {
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
                if o.port.on_completion(user, port_result(&result)) {
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

    /// Advances the file service's metadata operations and replies to those that finished.
    fn meta_round(&mut self) -> bool {
        if self.fs.meta_pending() == 0 {
            return false;
        }
        let waiting = &mut self.meta_waiting;
        let mut finished = Vec::new();
        self.fs.poll_meta(|user, r| match waiting.remove(&user) {
            Some(w) => finished.push((w, r)),
            None => tracing::error!(user, "metadata result nobody waits for"),
        });
        let n = finished.len();
        for (w, r) in finished {
            let reply = match r {
                Err(e) => Reply::err(Status::from(&e), e.to_string()),
                Ok(done) => match (w.kind, done) {
                    (MetaKind::Created, MetaDone::Created(id)) => match self.fs.stat(id) {
                        Ok(i) => Reply::ok(&file_info(i)),
                        Err(e) => Reply::err(Status::from(&e), e.to_string()),
                    },
                    (MetaKind::Deleted(id), _) => {
                        if let Some(o) = &self.offload {
                            o.exposed.withdraw(id);
                        }
                        Reply::ok(&())
                    }
                    _ => Reply::ok(&()),
                },
            };
            let _ = w.reply.send(reply);
        }
        n > 0
    }

    /// Hands a metadata operation to the file service; the reply is sent when it is durable.
    fn submit_meta(&mut self, op: MetaOp, kind: MetaKind, reply: Sender<Reply>) {
        let user = self.next_meta;
        self.next_meta += 1;
        self.meta_waiting.insert(user, MetaWaiter { reply, kind });
        self.fs.submit_meta(op, user);
    }

    /// Frees groups that are closing and have no I/O left in the file service.
    fn reap_closed(&mut self) {
        for slot in self.groups.iter_mut() {
            let done = matches!(slot, Some(g) if g.closing && g.quiescent());
            if done {
                let g = slot.take().expect("checked");
                for &base in &g.registered {
                    self.fs.unregister_memory(base);
                }
                let _ = self.dma.unregister_region(g.region);
                self.memory_used -= g.memory_bytes;
                tracing::debug!(group = g.id, "group freed");
            }
        }
    }

    fn handle_commands(&mut self) -> bool {
        let mut n = 0;
        while n < COMMANDS_PER_ROUND {
            let Ok(cmd) = self.commands.try_recv() else {
                break;
            };
            n += 1;
            match cmd {
                Command::Op {
                    conn,
                    req,
                    fds,
                    reply,
                } => {
                    let meta = match req {
                        Request::CreateDir { path } => {
                            Ok((MetaOp::CreateDir { path }, MetaKind::Unit))
                        }
                        Request::RemoveDir { path } => {
                            Ok((MetaOp::RemoveDir { path }, MetaKind::Unit))
                        }
                        Request::CreateFile { path } => {
                            Ok((MetaOp::CreateFile { path }, MetaKind::Created))
                        }
                        Request::DeleteFile { id } => {
                            Ok((MetaOp::DeleteFile { id: FileId(id) }, MetaKind::Deleted(id)))
                        }
                        Request::Rename { from, to } => {
                            Ok((MetaOp::Rename { from, to }, MetaKind::Unit))
                        }
                        Request::Resize { id, size } => Ok((
                            MetaOp::Resize {
                                id: FileId(id),
                                size,
                            },
                            MetaKind::Unit,
                        )),
                        other => Err(other),
                    };
                    match meta {
                        // Changes: replied to by `meta_round` once durable.
                        Ok((op, kind)) => self.submit_meta(op, kind, reply),
                        Err(req) => {
                            let r = self.execute(conn, req, fds);
                            let _ = reply.send(r);
                        }
                    }
                }
                Command::Disconnect { conn } => {
                    for g in self.groups.iter_mut().flatten() {
                        if g.conn == conn {
                            g.closing = true;
                        }
                    }
                    // The host's buffers go with its connection; a request still in flight
                    // on one fails its DMA (`UnknownBuffer`) instead of touching it.
                    if let Some(b) = self.buffers.remove(&conn) {
                        for rb in b.map.values() {
                            let _ = self.dma.unregister_region(rb.region);
                        }
                        tracing::debug!(conn, buffers = b.map.len(), "buffers released");
                    }
                }
            }
        }
        n > 0
    }

    fn execute(&mut self, conn: u64, req: Request, fds: Vec<OwnedFd>) -> Reply {
        let fs = &mut self.fs;
        let r: Result<Reply, dds_fs::FsError> = match req {
            Request::Hello { .. } => Ok(Reply::ok(&self.hello())),
            Request::ListDir { path } => fs.list_dir(&path).map(|entries| {
                let list: Vec<DirEntry> = entries
                    .into_iter()
                    .map(|e| DirEntry {
                        name: e.name,
                        kind: match e.kind {
                            dds_fs::EntryKind::Dir => EntryKind::Dir,
                            dds_fs::EntryKind::File => EntryKind::File,
                        },
                        id: e.id.map_or(0, |i| i.raw()),
                        size: e.size,
                    })
                    .collect();
                Reply::ok(&list)
            }),
            Request::Lookup { path } => fs.lookup(&path).map(|i| Reply::ok(&file_info(i))),
            Request::Stat { id } => fs.stat(FileId(id)).map(|i| Reply::ok(&file_info(i))),
            Request::ExposeFile { id, exposed } => fs.stat(FileId(id)).map(|_| {
                let engine = match &self.offload {
                    Some(o) if exposed => {
                        o.exposed.expose(id);
                        true
                    }
                    Some(o) => {
                        o.exposed.withdraw(id);
                        true
                    }
                    None => false,
                };
                tracing::debug!(id, exposed, engine, "file exposure");
                Reply::ok(&ExposeInfo { engine })
            }),
            Request::Stats => return Reply::ok(&self.stats()),
            Request::RegisterBuffer { len } => return self.register_buffer(conn, fds, len),
            Request::UnregisterBuffer { buffer } => {
                return match self
                    .buffers
                    .get_mut(&conn)
                    .and_then(|b| b.map.remove(&buffer).map(|rb| (b, rb)))
                {
                    Some((b, rb)) => {
                        b.bytes -= rb.len;
                        let _ = self.dma.unregister_region(rb.region);
                        Reply::ok(&())
                    }
                    None => Reply::err(
                        Status::UnknownBuffer,
                        format!("no buffer {buffer} on this connection"),
                    ),
                };
            }
            Request::CreateDir { .. }
            | Request::RemoveDir { .. }
            | Request::CreateFile { .. }
            | Request::DeleteFile { .. }
            | Request::Rename { .. }
            | Request::Resize { .. } => unreachable!("metadata changes go through submit_meta"),
            Request::FreeSpace => {
                let s = fs.free_space();
                Ok(Reply::ok(&SpaceInfo {
                    total_bytes: s.total_bytes,
                    free_bytes: s.free_bytes,
                    segment_size: s.segment_size,
                    files: s.files,
                    dirs: s.dirs,
                }))
            }
            Request::CreateGroup {
                region_len,
                req_offset,
                req_capacity,
                resp_offset,
                resp_capacity,
            } => {
                return self.create_group(
                    conn,
                    fds,
                    region_len,
                    req_offset,
                    req_capacity,
                    resp_offset,
                    resp_capacity,
                )
            }
            Request::DeleteGroup { group } => {
                return match self
                    .groups
                    .iter_mut()
                    .flatten()
                    .find(|g| g.id == group && g.conn == conn && !g.closing)
                {
                    Some(g) => {
                        g.closing = true;
                        Reply::ok(&())
                    }
                    None => Reply::err(
                        Status::InvalidArgument,
                        format!("no group {group} on this connection"),
                    ),
                };
            }
        };
        match r {
            Ok(reply) => reply,
            Err(e) => Reply::err(Status::from(&e), e.to_string()),
        }
    }

    /// Runtime statistics (`dds stats`): per-group counters, memory, DMA, space, offload.
    fn stats(&mut self) -> DpuStats {
        let groups = self
            .groups
            .iter()
            .flatten()
            .map(|g| GroupStats {
                group: g.id,
                conn: g.conn,
                requests: g.counters.requests,
                errors: g.counters.errors,
                bytes_read: g.counters.bytes_read,
                bytes_written: g.counters.bytes_written,
                outstanding: g.outstanding(),
                broken: g.broken,
                closing: g.closing,
            })
            .collect();
        let d = self.dma.stats();
        let s = self.fs.free_space();
        DpuStats {
            groups,
            memory_used_bytes: self.memory_used,
            memory_budget_bytes: self.config.memory_budget_bytes,
            dma: DmaCounters {
                reads: d.reads,
                writes: d.writes,
                bytes_read: d.bytes_read,
                bytes_written: d.bytes_written,
                doorbells: d.doorbells,
            },
            space: SpaceInfo {
                total_bytes: s.total_bytes,
                free_bytes: s.free_bytes,
                segment_size: s.segment_size,
                files: s.files,
                dirs: s.dirs,
            },
            offload: self.offload.as_mut().map(|o| o.stats()),
            registered_buffers: self.buffers.values().map(|b| b.map.len() as u64).sum(),
            registered_bytes: self.buffers.values().map(|b| b.bytes).sum(),
        }
    }

    /// `register_buffer`: maps a host application buffer for registered READ and WRITE
    /// records of this connection's groups.
    fn register_buffer(&mut self, conn: u64, fds: Vec<OwnedFd>, len: u64) -> Reply {
        let bad = |m: String| Reply::err(Status::InvalidArgument, m);
        let [shm]: [OwnedFd; 1] = match fds.try_into() {
            Ok(a) => a,
            Err(v) => {
                return bad(format!(
                    "register_buffer needs 1 descriptor (shared memory), got {}",
                    v.len()
                ))
            }
        };
        let Ok(_) = usize::try_from(len) else {
            return bad(format!("buffer length {len} too large"));
        };
        if len == 0 {
            return bad("buffer length 0".into());
        }
        let cap = self.config.max_registered_bytes_per_conn;
        let (count, bytes) = self
            .buffers
            .get(&conn)
            .map_or((0, 0), |b| (b.map.len(), b.bytes));
        if count >= crate::MAX_BUFFERS_PER_CONN {
            return Reply::err(
                Status::BufferLimit,
                format!(
                    "this connection holds {count} registered buffers already (at most {})",
                    crate::MAX_BUFFERS_PER_CONN
                ),
            );
        }
        if bytes.saturating_add(len) > cap {
            return Reply::err(
                Status::BufferLimit,
                format!(
                    "registering {len} bytes would make {} bytes of registered buffers on this \
                     connection; the cap is {cap} (dds dpu --max-registered-bytes)",
                    bytes.saturating_add(len)
                ),
            );
        }
        // Staging for registered I/O in every group of the connection that lacks it.
        let need: u64 = self
            .groups
            .iter()
            .flatten()
            .filter(|g| g.conn == conn && !g.closing && !g.has_staging())
            .map(|g| g.staging_bytes())
            .sum();
        if self.memory_used + need > self.config.memory_budget_bytes {
            return Reply::err(
                Status::NoSpace,
                format!(
                    "staging registered I/O needs {need} bytes of DPU memory, {} of {} left",
                    self.config.memory_budget_bytes - self.memory_used,
                    self.config.memory_budget_bytes
                ),
            );
        }
        let region = match self.dma.register_region(RegionExport::memfd(shm, len)) {
            Ok(r) => r.id,
            Err(e) => return bad(format!("cannot register buffer: {e}")),
        };
        for g in self.groups.iter_mut().flatten() {
            if g.conn == conn && !g.closing && !g.has_staging() {
                let before = g.memory_bytes;
                g.add_staging();
                register_io_memory(&mut self.fs, g);
                self.memory_used += g.memory_bytes - before;
            }
        }
        let id = self.next_buffer_id;
        self.next_buffer_id = self.next_buffer_id.wrapping_add(1).max(1);
        let b = self.buffers.entry(conn).or_default();
        b.map.insert(id, RegBuf { region, len });
        b.bytes += len;
        tracing::debug!(conn, buffer = id, len, "buffer registered");
        Reply::ok(&BufferInfo { buffer: id })
    }

    #[allow(clippy::too_many_arguments)]
    fn create_group(
        &mut self,
        conn: u64,
        fds: Vec<OwnedFd>,
        region_len: u64,
        req_offset: u64,
        req_capacity: u64,
        resp_offset: u64,
        resp_capacity: u64,
    ) -> Reply {
        let bad = |m: String| Reply::err(Status::InvalidArgument, m);
        let [shm, eventfd, doorbell]: [OwnedFd; 3] = match fds.try_into() {
            Ok(a) => a,
            Err(v) => {
                return bad(format!(
                    "create_group needs 3 descriptors (shared memory, eventfd, doorbell), got {}",
                    v.len()
                ))
            }
        };
        if !bell::is_eventfd(doorbell.as_fd()) {
            return bad("the doorbell descriptor is not an eventfd".into());
        }
        if !bell::is_eventfd(eventfd.as_fd()) {
            return bad("the notification descriptor is not an eventfd".into());
        }
        if let Err(e) = bell::set_nonblocking(eventfd.as_fd()) {
            return bad(format!(
                "cannot make the notification eventfd non-blocking: {e}"
            ));
        }
        let ring_ok = |off: u64, cap: u64| {
            dds_ring::valid_capacity(cap)
                && (64 << 10..=1 << 30).contains(&cap)
                && off.is_multiple_of(64)
                && off
                    .checked_add(dds_ring::POINTER_AREA_BYTES as u64 + cap)
                    .is_some_and(|end| end <= region_len)
        };
        if !ring_ok(req_offset, req_capacity) || !ring_ok(resp_offset, resp_capacity) {
            return bad(
                "ring layout outside the region or sizes not powers of two in 64 KiB..1 GiB".into(),
            );
        }
        let overlap = req_offset
            < resp_offset + dds_ring::POINTER_AREA_BYTES as u64 + resp_capacity
            && resp_offset < req_offset + dds_ring::POINTER_AREA_BYTES as u64 + req_capacity;
        if overlap {
            return bad("request and response rings overlap".into());
        }
        let live = self.groups.iter().flatten().count();
        if live >= self.config.max_groups {
            return Reply::err(
                Status::TooManyOutstanding,
                format!("DPU serves {live} groups already"),
            );
        }
        let staged = self.buffers.get(&conn).is_some_and(|b| !b.map.is_empty());
        let need = group_memory(req_capacity, resp_capacity, self.config.exec_mode)
            + if staged {
                req_capacity.max(resp_capacity)
            } else {
                0
            };
        if self.memory_used + need > self.config.memory_budget_bytes {
            return Reply::err(
                Status::NoSpace,
                format!(
                    "group needs {need} bytes of DPU memory, {} of {} left",
                    self.config.memory_budget_bytes - self.memory_used,
                    self.config.memory_budget_bytes
                ),
            );
        }
        let region = match self
            .dma
            .register_region(RegionExport::memfd(shm, region_len))
        {
            Ok(r) => r,
            Err(e) => return bad(format!("cannot register region: {e}")),
        };
        let id = self.next_group_id;
        self.next_group_id += 1;
        let params = GroupParams {
            id,
            conn,
            region,
            eventfd,
            doorbell,
            req_offset,
            req_capacity,
            resp_offset,
            resp_capacity,
            max_pending: self
                .config
                .max_pending_per_group
                .clamp(1, crate::group::MAX_PENDING),
            payload_align: (self.fs.mem_align() as u32).max(8),
            max_io_bytes: self.config.max_io_bytes.min(self.fs.max_io_bytes()),
            mode: self.config.exec_mode,
        };
        let mut g = match GroupState::new(params) {
            Ok(g) => g,
            Err(e) => {
                let _ = self.dma.unregister_region(region.id);
                return bad(format!("cannot serve the rings: {e}"));
            }
        };
        if staged {
            g.add_staging();
        }
        register_io_memory(&mut self.fs, &mut g);
        self.memory_used += g.memory_bytes;
        match self.groups.iter().position(|s| s.is_none()) {
            Some(i) => self.groups[i] = Some(g),
            None => self.groups.push(Some(g)),
        }
        tracing::debug!(group = id, conn, "group created");
        Reply::ok(&GroupInfo { group: id })
    }
}

/// Registers with the device the group's I/O memory not registered yet, so that its reads
/// and writes skip pinning pages (io_uring fixed buffers; refused registrations cost nothing
/// but that saving).
fn register_io_memory(fs: &mut FileService, g: &mut GroupState) {
    for (base, len) in g.io_memory() {
        if !g.registered.contains(&base) {
            // SAFETY: the memory belongs to the group, which unregisters it before it is
            // freed (`reap_closed`); the service, and so the device, outlives every group.
            if unsafe { fs.register_memory(base, len) } {
                g.registered.push(base);
            }
        }
    }
}

fn file_info(i: dds_fs::FileInfo) -> FileInfo {
    FileInfo {
        id: i.id.raw(),
        path: i.path,
        size: i.size,
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
