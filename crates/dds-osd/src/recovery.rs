//! Peering and recovery, driven by each PG's primary (`docs/osd-protocol.md`, "Recovery").

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dds_objstore::{ObjectId, Transaction, TxOp};

use crate::map::PgId;
use crate::objects::{self, ObjectPiece};
use crate::pglog::{self, PgLog};
use crate::server::{Inner, Pg, PgState};
use crate::wire::{op, Dec, Enc, OpError};

/// An unreachable peer is tried again after this long.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A member of a PG as recovery sees it: this OSD's store, or a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Local,
    Remote(u32),
}

/// Every `peering_interval`: first peers the PGs this OSD is primary for that are inactive (or
/// lack `min_size` members in sync), which activates them once this OSD and enough members are
/// up to date; then brings the lagging replicas of active PGs up to date without holding the
/// PG lock across the copying ([`Inner::recover_replica`]), so writes go on meanwhile.
pub(crate) fn peering_loop(inner: Arc<Inner>) {
    loop {
        if inner.stop_requested() {
            return;
        }
        let view = inner.view();
        for pg in view.pgs.values().filter(|p| p.primary) {
            if pg.active.load(Ordering::Acquire) {
                continue;
            }
            // Waits for a write in progress; no write of the PG starts until peering is done.
            let mut st = pg.lock();
            if pg.retired.load(Ordering::Acquire) {
                continue;
            }
            if let Err(e) = inner.peer_pg(pg, &mut st) {
                tracing::warn!(pg = %pg.id, "peering: {e}");
            }
            pg.publish(&st);
        }
        for pg in view.pgs.values().filter(|p| p.primary) {
            if inner.stop_requested() {
                return;
            }
            if !pg.active.load(Ordering::Acquire) || pg.clean.load(Ordering::Acquire) {
                continue;
            }
            for &r in &pg.acting[1..] {
                if pg.lock().in_sync.contains(&r) || inner.recently_failed(r) {
                    continue;
                }
                if let Err(e) = inner.recover_replica(pg, r) {
                    tracing::info!(pg = %pg.id, osd = r, "recovery of a replica: {e}");
                }
            }
            pg.publish(&pg.lock());
        }
        std::thread::sleep(inner.cfg.peering_interval);
    }
}

/// Versions a replica may still lack when its recovery takes the PG lock for the last step
/// (more: another pass without the lock).
const LOCKED_DELTA: usize = 64;
/// Passes without the lock before the last step takes the lock whatever is left.
const PASSES: usize = 4;

impl Inner {
    fn recently_failed(&self, osd: u32) -> bool {
        self.view().peers.get(&osd).is_some_and(|p| {
            p.last_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|t| t.elapsed() < RETRY_AFTER)
        })
    }

    /// Peers one PG (its lock held): collects the members' logs, brings this OSD up to the most
    /// recent one, takes the members at its head in sync, and (only if fewer than `min_size`
    /// members would be) brings lagging replicas up to date under the lock; the others are
    /// recovered after activation ([`Inner::recover_replica`]).
    pub(crate) fn peer_pg(&self, pg: &Pg, st: &mut PgState) -> Result<(), OpError> {
        if !st.active {
            st.in_sync.clear();
        }
        let mut logs = vec![(Member::Local, pglog::read_log(&self.store, pg.id)?)];
        for &r in &pg.acting[1..] {
            if st.in_sync.contains(&r) {
                continue;
            }
            if self.recently_failed(r) {
                continue;
            }
            match self.log_of(Member::Remote(r), pg.id) {
                Ok(log) => logs.push((Member::Remote(r), log)),
                Err(e) => {
                    tracing::info!(pg = %pg.id, osd = r, "peer unreachable: {e}");
                    st.in_sync.remove(&r);
                }
            }
        }
        let map = self.view().map.clone();
        let min = map.pool(pg.id.pool).map_or(1, |p| p.min_size()) as usize;
        if logs.len() + st.in_sync.len() < min {
            // Stay inactive: not enough members to accept writes safely.
            return Ok(());
        }
        // The authority: the latest last update, this OSD on ties (it is first).
        let mut auth = 0;
        for (i, (_, log)) in logs.iter().enumerate() {
            if log.last_update() > logs[auth].1.last_update() {
                auth = i;
            }
        }
        if auth != 0 {
            let (src, src_log) = logs[auth].clone();
            tracing::info!(pg = %pg.id, from = ?src, head = src_log.head, "recovering this OSD");
            self.sync(pg.id, src, &src_log, Member::Local, &logs[0].1)?;
            logs[0].1 = src_log;
        }
        st.head = logs[0].1.head;
        let own = logs[0].1.clone();
        let mut lagging = Vec::new();
        for (m, log) in &logs[1..] {
            let Member::Remote(r) = *m else { continue };
            if same_head(&own, log) {
                st.in_sync.insert(r);
            } else {
                lagging.push((r, log));
            }
        }
        for (r, log) in lagging {
            if st.in_sync.len() + 1 >= min {
                break;
            }
            match self.sync(pg.id, Member::Local, &own, Member::Remote(r), log) {
                Ok(()) => {
                    st.in_sync.insert(r);
                }
                Err(e) => {
                    tracing::warn!(pg = %pg.id, osd = r, "recovery of a replica failed: {e}");
                    st.in_sync.remove(&r);
                }
            }
        }
        st.load_reqids(&own);
        st.active = st.in_sync.len() + 1 >= min;
        Ok(())
    }

    /// Brings replica `r` of an active PG up to date while writes go on: passes that copy what
    /// it lacks without the PG lock (objects written meanwhile are copied again by the next
    /// pass), then, once at most [`LOCKED_DELTA`] versions are left (or after [`PASSES`]
    /// passes), the lock for the rest and the log, after which the replica is in sync and
    /// takes the PG's writes.
    pub(crate) fn recover_replica(&self, pg: &Pg, r: u32) -> Result<(), OpError> {
        let dst = Member::Remote(r);
        let mut dst_log = self.log_of(dst, pg.id)?;
        for pass in 0.. {
            let own = {
                let st = pg.lock();
                if !st.active || pg.retired.load(Ordering::Acquire) || st.in_sync.contains(&r) {
                    return Ok(());
                }
                pglog::read_log(&self.store, pg.id)?
            };
            let names = self.to_copy(pg.id, Member::Local, &own, dst, &dst_log)?;
            let last = pass + 1 >= PASSES || names.len() <= LOCKED_DELTA;
            if last {
                let mut st = pg.lock();
                if !st.active || pg.retired.load(Ordering::Acquire) {
                    return Ok(());
                }
                let own = pglog::read_log(&self.store, pg.id)?;
                // The log goes to the replica even when no object is left to copy.
                let names = self.to_copy(pg.id, Member::Local, &own, dst, &dst_log)?;
                self.copy_and_log(pg.id, Member::Local, &own, dst, names)?;
                st.in_sync.insert(r);
                pg.publish(&st);
                tracing::info!(pg = %pg.id, osd = r, passes = pass + 1, "replica in sync");
                return Ok(());
            }
            pg.set_to_recover(names.len() as u64);
            for name in names {
                // An object that changed while it was copied is copied again by a later pass
                // (its write is logged after `own`'s head).
                let oid = ObjectId::new(pg.id.pool, name);
                let copied = self.copy_object(Member::Local, dst, pg.id, &oid);
                pg.recovered_one();
                copied?;
            }
            // The replica now holds every object as of `own` (or later): the next pass copies
            // the objects of the versions after it.
            dst_log = own;
        }
        Ok(())
    }

    /// Makes `dst` hold what `src` holds for the PG.
    fn sync(
        &self,
        pg: PgId,
        src: Member,
        src_log: &PgLog,
        dst: Member,
        dst_log: &PgLog,
    ) -> Result<(), OpError> {
        if same_head(src_log, dst_log) {
            return Ok(());
        }
        let names = self.to_copy(pg, src, src_log, dst, dst_log)?;
        tracing::info!(%pg, ?src, ?dst, objects = names.len(), from = dst_log.head, to = src_log.head, "sync");
        self.copy_and_log(pg, src, src_log, dst, names)
    }

    /// Copies the objects `names` from `src` to `dst`, then gives `dst` the log `src_log`.
    fn copy_and_log(
        &self,
        pg: PgId,
        src: Member,
        src_log: &PgLog,
        dst: Member,
        names: BTreeSet<Vec<u8>>,
    ) -> Result<(), OpError> {
        for name in names {
            if !self.copy_object(src, dst, pg, &ObjectId::new(pg.pool, name))? {
                return Err(OpError::new(
                    crate::wire::Status::Io,
                    "an object changed while it was copied",
                ));
            }
        }
        let mut tx = Transaction::new();
        pglog::replace_ops(&mut tx, pg, src_log);
        self.apply(dst, pg, &tx)
    }

    /// The objects `dst` must copy from the source of `src_log`: those of the versions after
    /// its head when the source still logs them all and agrees with it (incremental), else
    /// every object either holds (backfill).
    fn to_copy(
        &self,
        pg: PgId,
        src: Member,
        src_log: &PgLog,
        dst: Member,
        dst_log: &PgLog,
    ) -> Result<BTreeSet<Vec<u8>>, OpError> {
        if same_head(src_log, dst_log) {
            return Ok(BTreeSet::new());
        }
        let covered = |h: u64| {
            h < src_log.head
                && src_log.entries.first().is_some_and(|e| e.version <= h + 1)
                && (h == 0 || src_log.entry(h).is_some() && src_log.entry(h) == dst_log.entry(h))
        };
        if covered(dst_log.head) {
            return Ok(src_log
                .entries
                .iter()
                .filter(|e| e.version > dst_log.head)
                .map(|e| e.name.clone())
                .collect());
        }
        tracing::info!(%pg, ?dst, "backfill");
        let mut all = self.list_all(src, pg)?;
        all.extend(self.list_all(dst, pg)?);
        Ok(all)
    }

    fn log_of(&self, m: Member, pg: PgId) -> Result<PgLog, OpError> {
        match m {
            Member::Local => pglog::read_log(&self.store, pg),
            Member::Remote(r) => {
                let p = Enc::new().u64(pg.pool).u32(pg.pg).done();
                let out = self.peer_call(r, op::PG_LOG_QUERY, &p)?;
                let mut d = Dec::new(&out);
                let log = PgLog::decode(&mut d)?;
                d.end()?;
                Ok(log)
            }
        }
    }

    /// Makes `dst`'s copy of an object `src`'s, in pieces that fit a frame: the first
    /// replaces the object (data from 0, xattrs, omap), the others write the rest of the data
    /// at their offsets. `Ok(false)`: its size changed between pieces (copied without the PG
    /// lock while it was written). A crash in between is repaired by the next peering, which
    /// copies it again.
    fn copy_object(
        &self,
        src: Member,
        dst: Member,
        pg: PgId,
        oid: &ObjectId,
    ) -> Result<bool, OpError> {
        let piece = u64::from(self.cfg.max_payload / 2).max(64 << 10);
        let Some(first) = self.pull(src, oid, 0, piece)? else {
            self.apply(dst, pg, &objects::replace_object_tx(oid, None))?;
            return Ok(true);
        };
        self.apply(
            dst,
            pg,
            &objects::replace_object_tx(oid, Some(&first.state)),
        )?;
        let mut at = first.state.data.len() as u64;
        while at < first.size {
            let p = self.pull(src, oid, at, piece)?;
            let Some(p) = p.filter(|p| p.size == first.size && !p.state.data.is_empty()) else {
                return Ok(false);
            };
            let len = p.state.data.len() as u64;
            let mut tx = Transaction::new();
            tx.push(TxOp::Write {
                oid: oid.clone(),
                offset: at,
                data: p.state.data,
            });
            self.apply(dst, pg, &tx)?;
            at += len;
        }
        Ok(true)
    }

    fn pull(
        &self,
        m: Member,
        oid: &ObjectId,
        offset: u64,
        max: u64,
    ) -> Result<Option<ObjectPiece>, OpError> {
        match m {
            Member::Local => Ok(objects::read_piece(&self.store, oid, offset, max)?),
            Member::Remote(r) => {
                let p = Enc::new().oid(oid).u64(offset).u64(max).done();
                let out = self.peer_call(r, op::PG_PULL_OBJECT, &p)?;
                objects::decode_piece(&out, offset)
            }
        }
    }

    fn apply(&self, m: Member, pg: PgId, tx: &Transaction) -> Result<(), OpError> {
        match m {
            Member::Local => Ok(self.store.submit(tx)?),
            Member::Remote(r) => {
                let mut p = Enc::new();
                p.u64(pg.pool).u32(pg.pg);
                tx.encode(&mut p.0);
                self.peer_call(r, op::PG_PUSH, &p.done())?;
                Ok(())
            }
        }
    }

    fn list_all(&self, m: Member, pg: PgId) -> Result<BTreeSet<Vec<u8>>, OpError> {
        let mut all = BTreeSet::new();
        let mut after: Option<Vec<u8>> = None;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let page = match m {
                Member::Local => {
                    objects::list_pg(&self.store, &self.view().map, pg, after.as_deref(), 4096)?
                }
                Member::Remote(r) => {
                    let p = Enc::new()
                        .u64(pg.pool)
                        .u32(pg.pg)
                        .opt_bytes(after.as_deref())
                        .u32(4096)
                        .done();
                    let out = self.peer_call(r, op::PG_LIST, &p)?;
                    let mut d = Dec::new(&out);
                    let k = d.keys()?;
                    d.end()?;
                    k
                }
            };
            let Some(last) = page.last() else { break };
            after = Some(last.clone());
            all.extend(page);
            if Instant::now() > deadline {
                return Err(OpError::new(
                    crate::wire::Status::Io,
                    format!("listing pg {pg} of {m:?} does not end"),
                ));
            }
        }
        Ok(all)
    }
}

/// Whether two logs end at the same version with the same entry.
fn same_head(a: &PgLog, b: &PgLog) -> bool {
    a.head == b.head && a.entry(a.head) == b.entry(b.head)
}
