//! The offload engine's decision for one client message, as a pure step: no sockets, no
//! file service, no allocation.
//!
//! [`Planner::plan`] runs the application's offload predicate over a whole message, checks
//! what it returned, collects the keys that host-bound requests may modify (the director
//! invalidates them before forwarding, `docs/consistency.md`), runs the offload function for
//! each DPU-bound request and falls back to the host when the read does not fit a buffer or
//! the connection has no context left. The director then commits the plan: invalidations,
//! the host sub-message, the file reads.

use dds_cache::CacheReader;

use crate::ExposedFiles;

use dds_offload_api::{
    CacheView, FixedList, KeyList, KeyMap, Malformed, Offload, OffloadApp, ReadOp, ReqDesc,
    ReqList, Session,
};

/// One request of a planned message, in message order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// Where the request is in the message.
    pub req: ReqDesc,
    /// The file read serving it on the DPU; `None`: the host serves it.
    pub read: Option<ReadOp>,
}

/// Counts of a planned message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Requests in the message.
    pub requests: usize,
    /// Of which served on the DPU.
    pub offloaded: usize,
    /// DPU-bound requests sent to the host for want of a context or buffer room.
    pub fallback: usize,
    /// DPU-bound requests sent to the host because their file is not exposed.
    pub unexposed: usize,
}

/// What a plan reads besides the message: the application, the cache table and the set of
/// exposed files.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    /// The application's offload functions.
    pub app: &'a dyn OffloadApp,
    /// The cache table.
    pub cache: &'a CacheReader,
    /// The files the application exposed.
    pub exposed: &'a ExposedFiles,
    /// The connection's session, when the app keeps one (its offload function is used).
    pub session: Option<&'a dyn Session>,
}

/// Scratch space of the plan step, allocated once per director thread from the app's limits.
pub struct Planner {
    host: ReqList,
    dpu: ReqList,
    keys: KeyList,
    masked: FixedList<(u64, u32)>,
    /// `masked` as a map (key → first position), for the lookups of the offload function.
    masked_map: KeyMap,
    steps: Vec<Planned>,
    /// Position stamps of the current message (a position seen twice is an error).
    stamp: Vec<u32>,
    stamp_now: u32,
    requests: usize,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner")
            .field("max_requests", &self.steps.len())
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

impl Planner {
    /// Scratch sized from `app`'s limits.
    pub fn new(app: &dyn OffloadApp) -> Planner {
        let max_req = app.max_requests().max(1);
        Planner {
            host: ReqList::with_capacity(max_req),
            dpu: ReqList::with_capacity(max_req),
            keys: KeyList::with_capacity(app.max_forward_keys() + 1),
            masked: FixedList::with_capacity(app.max_forward_keys().max(1)),
            masked_map: KeyMap::with_capacity(app.max_forward_keys().max(1)),
            steps: vec![Planned::default(); max_req],
            stamp: vec![0; max_req],
            stamp_now: 0,
            requests: 0,
        }
    }

    /// Plans `msg` (one whole message as framed by the app). `pending` holds the keys that
    /// earlier host-bound requests of the connection may still modify (they miss in every
    /// lookup); `budget` is how many reads may go to the DPU (free contexts the connection may
    /// take); `max_read` is the largest read a buffer holds. Reads of files the application
    /// has not exposed go to the host.
    ///
    /// An error means the app or the message broke the contract: the director closes the
    /// connection.
    pub fn plan(
        &mut self,
        src: &Sources<'_>,
        pending: &KeyMap,
        msg: &[u8],
        mut budget: usize,
        max_read: usize,
    ) -> Result<PlanSummary, Malformed> {
        self.host.clear();
        self.dpu.clear();
        self.masked.clear();
        self.masked_map.clear();
        self.requests = 0;
        let Sources {
            app,
            cache,
            exposed,
            session,
        } = *src;
        if session.is_some_and(|s| s.whole_to_host(msg)) {
            // The session sends this message to the host as it is, one request.
            return self.plan_whole(app, msg, PlanSummary::default());
        }
        let view = CacheView::restricted(cache, false, pending, &self.masked_map, 0);
        app.offload_predicate(msg, &view, &mut self.host, &mut self.dpu)?;
        // The descriptors: inside the message, positions a permutation.
        let total = self.host.len() + self.dpu.len();
        if total == 0 || total > self.steps.len() {
            return Err(Malformed(
                "offload predicate returned no or too many requests",
            ));
        }
        self.stamp_now = self.stamp_now.wrapping_add(1);
        if self.stamp_now == 0 {
            self.stamp.fill(0);
            self.stamp_now = 1;
        }
        for d in self.host.as_slice().iter().chain(self.dpu.as_slice()) {
            let end = d.offset as u64 + d.len as u64;
            if end > msg.len() as u64
                || d.pos as usize >= total
                || self.stamp[d.pos as usize] == self.stamp_now
            {
                return Err(Malformed(
                    "offload predicate returned an invalid descriptor",
                ));
            }
            self.stamp[d.pos as usize] = self.stamp_now;
        }
        // Keys the host-bound requests may modify, with their positions.
        for i in 0..self.host.len() {
            let d = self.host.as_slice()[i];
            self.mask_forwarded(app, msg, d)?;
            self.steps[d.pos as usize] = Planned { req: d, read: None };
        }
        // The offload function for each DPU-bound request, seeing the keys of earlier
        // host-bound requests of this message as misses.
        let mut summary = PlanSummary {
            requests: total,
            ..PlanSummary::default()
        };
        for i in 0..self.dpu.len() {
            let d = self.dpu.as_slice()[i];
            let view = CacheView::restricted(cache, false, pending, &self.masked_map, d.pos);
            let decided = match session {
                Some(s) => s.offload_function(app, msg, d, &view),
                None => app.offload_function(msg, d, &view),
            };
            let read = match decided {
                // A read of 0 bytes touches no file: a response the builder makes alone.
                Offload::Read(op) if op.size > 0 && !exposed.contains(op.file_id) => {
                    summary.unexposed += 1;
                    None
                }
                Offload::Read(op) if (op.size as usize) <= max_read && budget > 0 => {
                    budget -= 1;
                    summary.offloaded += 1;
                    Some(op)
                }
                Offload::Read(_) => {
                    summary.fallback += 1;
                    None
                }
                Offload::Host => None,
            };
            if read.is_none() && total > 1 && app.host_answers_whole_messages() {
                // The split cannot be kept: the message goes to the host as it came.
                return self.plan_whole(app, msg, summary);
            }
            if read.is_none() {
                self.mask_forwarded(app, msg, d)?;
                self.host
                    .push(d)
                    .map_err(|_| Malformed("too many requests"))?;
            }
            self.steps[d.pos as usize] = Planned { req: d, read };
        }
        self.host.as_mut_slice().sort_unstable_by_key(|d| d.pos);
        self.requests = total;
        Ok(summary)
    }

    /// The plan of `msg` sent to the host whole, as one request (`summary`: the fallback
    /// counts so far).
    fn plan_whole(
        &mut self,
        app: &dyn OffloadApp,
        msg: &[u8],
        summary: PlanSummary,
    ) -> Result<PlanSummary, Malformed> {
        self.host.clear();
        self.dpu.clear();
        self.masked.clear();
        self.masked_map.clear();
        let whole = ReqDesc {
            offset: 0,
            len: msg.len() as u32,
            pos: 0,
        };
        self.host
            .push(whole)
            .map_err(|_| Malformed("too many requests"))?;
        self.mask_forwarded(app, msg, whole)?;
        self.steps[0] = Planned {
            req: whole,
            read: None,
        };
        self.requests = 1;
        Ok(PlanSummary {
            requests: 1,
            offloaded: 0,
            ..summary
        })
    }

    fn mask_forwarded(
        &mut self,
        app: &dyn OffloadApp,
        msg: &[u8],
        d: ReqDesc,
    ) -> Result<(), Malformed> {
        self.keys.clear();
        app.invalidate_on_forward(msg, d, &mut self.keys);
        if self.keys.len() == self.keys.capacity() {
            return Err(Malformed("too many invalidation keys for one request"));
        }
        for &k in self.keys.as_slice() {
            self.masked
                .push((k, d.pos))
                .map_err(|_| Malformed("too many invalidation keys in one message"))?;
            self.masked_map
                .update(k, |first| first.map_or(d.pos, |p| p.min(d.pos)))
                .map_err(|_| Malformed("too many invalidation keys in one message"))?;
        }
        Ok(())
    }

    /// Host-bound requests of the last plan, in message order.
    pub fn host(&self) -> &[ReqDesc] {
        self.host.as_slice()
    }

    /// Keys to invalidate before forwarding, with the position of the request that may
    /// modify each.
    pub fn masked(&self) -> &[(u64, u32)] {
        self.masked.as_slice()
    }

    /// Every request of the last plan, in message order.
    pub fn steps(&self) -> &[Planned] {
        &self.steps[..self.requests]
    }
}
