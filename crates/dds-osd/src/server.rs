//! The daemon: client and peer ports (services of the server runtime, `crate::service`), the
//! client ops, replication of writes to the PG's replicas, and the replica side of the peer
//! ops.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dds_objstore::{ObjectId, ObjectStore, StoreError, Transaction, TxOp};

use crate::conn::CallError;
use crate::link::Link;
use crate::map::{ClusterMap, PgId, META_POOL};
use crate::objects;
use crate::pglog::{self, LogEntry, KIND_MODIFY, KIND_REMOVE};
use crate::service::{Port, PortService, Workers};
use crate::wire::{self, op, Dec, Enc, Header, OpError, Status, FLAG_LOCAL, HEADER_LEN};

/// Daemon settings.
#[derive(Debug, Clone)]
pub struct OsdConfig {
    pub id: u32,
    /// The map the OSD starts with (later maps replace it, [`Osd::set_map`]).
    pub map: ClusterMap,
    /// Client and peer addresses to bind instead of the map entry's (port 0: any).
    pub bind: Option<(SocketAddr, SocketAddr)>,
    /// Largest accepted payload.
    pub max_payload: u32,
    /// Memory budget of all payload buffers together.
    pub frame_memory: u64,
    /// Connections per port.
    pub max_connections: usize,
    /// A connection idle (or stalled inside a frame) this long is closed.
    pub idle_timeout: Duration,
    /// Connect and I/O timeout of peer calls.
    pub peer_timeout: Duration,
    /// PG log entries and request ids kept.
    pub retention: pglog::Retention,
    /// Period of the peering thread.
    pub peering_interval: Duration,
    /// Worker threads per port (a PG's requests go to one of them, in arrival order).
    pub workers: usize,
}

impl OsdConfig {
    pub fn new(id: u32, map: ClusterMap) -> OsdConfig {
        OsdConfig {
            id,
            map,
            bind: None,
            max_payload: wire::DEFAULT_MAX_PAYLOAD,
            frame_memory: 256 << 20,
            max_connections: 1024,
            idle_timeout: Duration::from_secs(300),
            peer_timeout: Duration::from_secs(10),
            retention: pglog::Retention::default(),
            peering_interval: Duration::from_millis(200),
            workers: 8,
        }
    }
}

/// Mutable state of a PG, behind its lock.
pub(crate) struct PgState {
    pub head: u64,
    /// Primary: whether peering succeeded (client ops are served).
    pub active: bool,
    /// Primary: replicas known to hold every version.
    pub in_sync: BTreeSet<u32>,
    /// Primary: the client requests of the last `max_dups` versions, to answer a retried
    /// write with its first version instead of applying it again.
    pub reqids: HashMap<(u64, u64), u64>,
    /// The same, in version order, for trimming with the log.
    pub reqid_order: VecDeque<(u64, (u64, u64))>,
}

impl PgState {
    /// Indexes the request ids of `log` (after peering).
    pub fn load_reqids(&mut self, log: &crate::pglog::PgLog) {
        self.reqids.clear();
        self.reqid_order.clear();
        // Entries and `dup.` keys name the same versions twice: once each, in version order.
        let by_version: BTreeMap<u64, (u64, u64)> = log.reqids().collect();
        for (version, reqid) in by_version {
            self.note_reqid(version, reqid, u64::MAX);
        }
    }

    /// Records that `version` was made by request `reqid`, forgetting the requests of versions
    /// older than the last `window`.
    pub fn note_reqid(&mut self, version: u64, reqid: (u64, u64), window: u64) {
        self.reqids.insert(reqid, version);
        self.reqid_order.push_back((version, reqid));
        while self
            .reqid_order
            .front()
            .is_some_and(|&(v, _)| v.saturating_add(window) <= version)
        {
            let (v, old) = self.reqid_order.pop_front().expect("front exists");
            // A request id used again by a later version (long after) keeps that version.
            if self.reqids.get(&old) == Some(&v) {
                self.reqids.remove(&old);
            }
        }
    }
}

/// A PG this OSD is a member of.
pub(crate) struct Pg {
    pub id: PgId,
    pub acting: Vec<u32>,
    pub primary: bool,
    /// Set when a new map changed the PG's acting set: this copy serves nothing more.
    pub retired: AtomicBool,
    pub state: Mutex<PgState>,
    // Published copies for STATUS (which must not wait for a write or a recovery).
    pub head: AtomicU64,
    pub active: AtomicBool,
    pub clean: AtomicBool,
    /// Objects the running recovery pass of a lagging replica has still to copy.
    pub to_recover: AtomicU64,
    /// Members holding every version (the primary included).
    pub in_sync_count: AtomicU64,
}

impl Pg {
    fn new(id: PgId, acting: Vec<u32>, primary: bool, head: u64) -> Pg {
        let pg = Pg {
            id,
            primary,
            retired: AtomicBool::new(false),
            state: Mutex::new(PgState {
                head,
                active: false,
                in_sync: BTreeSet::new(),
                reqids: HashMap::new(),
                reqid_order: VecDeque::new(),
            }),
            acting,
            head: AtomicU64::new(head),
            active: AtomicBool::new(false),
            clean: AtomicBool::new(false),
            to_recover: AtomicU64::new(0),
            in_sync_count: AtomicU64::new(0),
        };
        pg.publish(&pg.lock());
        pg
    }

    pub fn lock(&self) -> MutexGuard<'_, PgState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_to_recover(&self, n: u64) {
        self.to_recover.store(n, Ordering::Release);
    }

    pub fn recovered_one(&self) {
        let _ = self
            .to_recover
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub fn publish(&self, st: &PgState) {
        self.head.store(st.head, Ordering::Release);
        self.active
            .store(!self.primary || st.active, Ordering::Release);
        let clean = !self.primary || st.in_sync.len() + 1 == self.acting.len();
        self.clean.store(clean, Ordering::Release);
        if clean {
            self.to_recover.store(0, Ordering::Release);
        }
        let in_sync = if self.primary {
            st.in_sync.len() + 1
        } else {
            0
        };
        self.in_sync_count.store(in_sync as u64, Ordering::Release);
    }
}

pub(crate) struct Peer {
    pub addr: SocketAddr,
    pub conns: Link,
    pub last_failure: Mutex<Option<Instant>>,
}

/// A request to a peer awaiting its reply.
struct PeerSent {
    peer: Arc<Peer>,
    sent: crate::link::Sent,
}

/// What one map makes of this OSD: the map, the PGs it is a member of, its peers.
pub(crate) struct View {
    pub map: Arc<ClusterMap>,
    pub pgs: BTreeMap<PgId, Arc<Pg>>,
    pub peers: BTreeMap<u32, Arc<Peer>>,
}

pub(crate) struct Inner {
    pub cfg: OsdConfig,
    pub store: Arc<dyn ObjectStore>,
    view: RwLock<Arc<View>>,
    /// Serializes map changes.
    map_change: Mutex<()>,
    stop: AtomicBool,
}

/// A running OSD.
pub struct Osd {
    inner: Arc<Inner>,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    workers: Vec<Workers>,
}

fn op_err(status: Status, text: impl Into<String>) -> OpError {
    OpError::new(status, text)
}

impl Osd {
    /// Binds the OSD's client and peer addresses from the map and starts serving.
    pub fn start(cfg: OsdConfig, store: Arc<dyn ObjectStore>) -> io::Result<Osd> {
        let me = cfg
            .map
            .osd(cfg.id)
            .ok_or_else(|| io::Error::other(format!("osd {} is not in the map", cfg.id)))?
            .clone();
        let (client_at, peer_at) = cfg.bind.unwrap_or((me.addr, me.peer_addr));
        // An OSD restarted on its map's ports after kill -9 of one on io_uring finds them
        // still held a moment (`bind_listener` tries again for a few seconds).
        let client = dds_server::bind_listener(client_at)?;
        let peer = dds_server::bind_listener(peer_at)?;
        let view =
            build_view(&cfg, &store, Arc::new(cfg.map.clone()), None).map_err(io::Error::other)?;
        let inner = Arc::new(Inner {
            cfg,
            store,
            view: RwLock::new(Arc::new(view)),
            map_change: Mutex::new(()),
            stop: AtomicBool::new(false),
        });
        let client_addr = client.local_addr()?;
        let peer_addr = peer.local_addr()?;
        let mut threads = Vec::new();
        let mut workers = Vec::new();
        let rt = dds_server::Config {
            max_connections: inner.cfg.max_connections.max(1),
            input_limit: inner.cfg.max_payload as usize + HEADER_LEN,
            frame_deadline: Some(inner.cfg.idle_timeout),
            idle_limit: Some(inner.cfg.idle_timeout),
            drain: Duration::from_secs(2),
            ..dds_server::Config::default()
        };
        let budget =
            dds_server::Budget::new(usize::try_from(inner.cfg.frame_memory).unwrap_or(usize::MAX));
        for (l, port) in [(client, Port::Client), (peer, Port::Peer)] {
            let (service, w) = PortService::new(port, inner.clone(), inner.cfg.workers)?;
            workers.push(w);
            let server = dds_server::Server::from_listener(l, rt.clone(), budget.clone(), service)?;
            let inner = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("osd{}-{}", inner.cfg.id, port.name()))
                    .spawn(move || drop(server.run(&inner.stop)))?,
            );
        }
        let i = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name("osd-peering".into())
                .spawn(move || crate::recovery::peering_loop(i))?,
        );
        Ok(Osd {
            inner,
            client_addr,
            peer_addr,
            threads,
            workers,
        })
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.peer_addr
    }

    /// A handle that gives the running OSD new maps.
    pub fn maps(&self) -> MapHandle {
        MapHandle(self.inner.clone())
    }

    /// Takes `map` if its epoch is higher than the current one's (`Ok(false)` otherwise).
    pub fn set_map(&self, map: ClusterMap) -> Result<bool, StoreError> {
        self.inner.apply_map(map)
    }

    /// Stops the ports (requests in flight are answered, at most 2 s) and peering; waits for
    /// their threads.
    pub fn shutdown(mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for w in self.workers.drain(..) {
            w.join();
        }
        for p in self.inner.view().peers.values() {
            p.conns.reset();
        }
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The line `dds osd` prints once it serves: `osd.N ready: clients on ADDR, peers on ADDR`.
pub fn ready_line(id: u32, client: SocketAddr, peer: SocketAddr) -> String {
    format!("osd.{id} ready: clients on {client}, peers on {peer}")
}

/// The client and peer addresses of a [`ready_line`].
pub fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let addr = |key: &str| -> Option<SocketAddr> {
        line.split(key)
            .nth(1)?
            .split([',', ' '])
            .find(|s| !s.is_empty())?
            .parse()
            .ok()
    };
    Some((addr("clients on ")?, addr("peers on ")?))
}

/// Gives a running OSD new maps (from a file or etcd, `crate::monitor`).
#[derive(Clone)]
pub struct MapHandle(Arc<Inner>);

impl MapHandle {
    /// The OSD's current map.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.0.view().map.clone()
    }

    pub fn id(&self) -> u32 {
        self.0.cfg.id
    }

    /// Takes `map` if its epoch is higher than the current one's.
    pub fn set_map(&self, map: ClusterMap) -> Result<bool, StoreError> {
        self.0.apply_map(map)
    }

    /// Whether the OSD is shutting down.
    pub fn stopped(&self) -> bool {
        self.0.stop_requested()
    }
}

/// The PGs and peers `map` gives this OSD; the PGs of `old` whose acting set did not change
/// are kept as they are.
fn build_view(
    cfg: &OsdConfig,
    store: &Arc<dyn ObjectStore>,
    map: Arc<ClusterMap>,
    old: Option<&View>,
) -> Result<View, StoreError> {
    let mut pgs = BTreeMap::new();
    for pgid in map.all_pgs() {
        let acting = map.acting(pgid);
        let Some(pos) = acting.iter().position(|&o| o == cfg.id) else {
            continue;
        };
        let kept = old
            .and_then(|v| v.pgs.get(&pgid))
            .filter(|p| p.acting == acting && !p.retired.load(Ordering::Acquire));
        let pg = match kept {
            Some(p) => p.clone(),
            None => Arc::new(Pg::new(
                pgid,
                acting,
                pos == 0,
                pglog::read_head(store, pgid)?,
            )),
        };
        pgs.insert(pgid, pg);
    }
    let peers = map
        .osds
        .iter()
        .filter(|o| o.id != cfg.id)
        .map(|o| {
            let kept = old
                .and_then(|v| v.peers.get(&o.id))
                .filter(|p| p.addr == o.peer_addr);
            let peer = kept.cloned().unwrap_or_else(|| {
                Arc::new(Peer {
                    addr: o.peer_addr,
                    conns: Link::new(
                        o.peer_addr,
                        cfg.peer_timeout.min(Duration::from_secs(1)),
                        cfg.peer_timeout,
                    ),
                    last_failure: Mutex::new(None),
                })
            });
            (o.id, peer)
        })
        .collect();
    Ok(View { map, pgs, peers })
}

fn version_reply(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

impl Inner {
    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The current view (map, PGs, peers).
    pub(crate) fn view(&self) -> Arc<View> {
        self.view.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn map(&self) -> Arc<ClusterMap> {
        self.view().map.clone()
    }

    /// The current map's epoch.
    pub(crate) fn epoch(&self) -> u32 {
        self.view
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .epoch
    }

    /// Takes `map` if its epoch is higher than the current one's: the PGs whose acting set
    /// changes are retired (after the write or peering in progress) and replaced by inactive
    /// ones, which their primaries peer.
    pub(crate) fn apply_map(&self, map: ClusterMap) -> Result<bool, StoreError> {
        let _one = self.map_change.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.view();
        if map.epoch <= old.map.epoch {
            return Ok(false);
        }
        // Requests waiting on an OSD the new map has down (cut off: its replies may never
        // come) fail now rather than at their timeout, so that the writes holding PG locks
        // behind them end and the PGs can change hands at once.
        for (id, peer) in &old.peers {
            if map.osd(*id).is_none_or(|o| !o.up) && old.map.osd(*id).is_some_and(|o| o.up) {
                peer.conns.reset();
            }
        }
        for (id, pg) in &old.pgs {
            if map.acting(*id) != pg.acting {
                pg.retired.store(true, Ordering::Release);
                let mut st = pg.lock();
                st.active = false;
                pg.publish(&st);
            }
        }
        tracing::info!(
            osd = self.cfg.id,
            from = old.map.epoch,
            to = map.epoch,
            "new map"
        );
        let view = build_view(&self.cfg, &self.store, Arc::new(map), Some(&old))?;
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        Ok(true)
    }

    fn pg_of(&self, oid: &ObjectId) -> Result<PgId, OpError> {
        if oid.pool == META_POOL {
            return Err(op_err(Status::Invalid, "pool reserved for PG metadata"));
        }
        self.map()
            .pg_of(oid.pool, &oid.name)
            .ok_or_else(|| op_err(Status::NotFound, format!("no pool {}", oid.pool)))
    }

    /// The PG if this OSD may serve its reads: its active primary, or any OSD with `local`.
    fn check_read(&self, pg: PgId, local: bool) -> Result<(), OpError> {
        if local {
            return Ok(());
        }
        self.check_primary(pg).map(|_| ())
    }

    fn check_primary(&self, pg: PgId) -> Result<Arc<Pg>, OpError> {
        let not_primary = || {
            let primary = self.map().acting(pg).first().copied();
            op_err(
                Status::NotPrimary,
                format!(
                    "osd {} is not the primary of pg {pg} (osd {primary:?} is)",
                    self.cfg.id
                ),
            )
        };
        let view = self.view();
        let p = view.pgs.get(&pg).ok_or_else(not_primary)?;
        if !p.primary {
            return Err(not_primary());
        }
        let acting = p.acting.len();
        let min = view.map.pool(pg.pool).map_or(1, |p| p.min_size()) as usize;
        if acting < min {
            return Err(op_err(
                Status::BelowMinSize,
                format!("pg {pg} has {acting} members up, below min_size {min}: I/O refused"),
            ));
        }
        if !p.active.load(Ordering::Acquire) {
            return Err(op_err(
                Status::PgInactive,
                format!("pg {pg} is peering; retry"),
            ));
        }
        Ok(p.clone())
    }

    fn status_json(&self) -> Vec<u8> {
        let view = self.view();
        let pgs: Vec<serde_json::Value> = view
            .pgs
            .values()
            .map(|p| {
                serde_json::json!({
                    "pool": p.id.pool,
                    "pg": p.id.pg,
                    "acting": p.acting,
                    "primary": p.primary,
                    "head": p.head.load(Ordering::Acquire),
                    "active": p.active.load(Ordering::Acquire),
                    "clean": p.clean.load(Ordering::Acquire),
                    "size": view.map.pool(p.id.pool).map_or(0, |pool| pool.size),
                    "in_sync": p.in_sync_count.load(Ordering::Acquire),
                    "to_recover": p.to_recover.load(Ordering::Acquire),
                })
            })
            .collect();
        serde_json::json!({"osd": self.cfg.id, "epoch": view.map.epoch, "pgs": pgs})
            .to_string()
            .into_bytes()
    }

    pub(crate) fn client_op(&self, h: &Header, buf: &[u8]) -> Result<Vec<u8>, OpError> {
        let mut d = Dec::new(buf);
        let local = h.flags & FLAG_LOCAL != 0;
        let store = &self.store;
        let write_op = matches!(
            h.op,
            op::WRITE_FULL | op::WRITE | op::REMOVE | op::SETXATTR | op::OMAP_SET | op::OMAP_RM
        );
        if write_op && local {
            return Err(op_err(Status::Invalid, "writes cannot be served locally"));
        }
        let out = match h.op {
            op::PING => {
                d.end()?;
                Enc::new().u32(self.cfg.id).u32(self.map().epoch).done()
            }
            op::GET_MAP => {
                d.end()?;
                self.map().to_toml().into_bytes()
            }
            op::STATUS => {
                d.end()?;
                self.status_json()
            }
            op::WRITE_FULL | op::WRITE | op::REMOVE | op::SETXATTR | op::OMAP_SET | op::OMAP_RM => {
                let reqid = (d.u64()?, d.u64()?);
                let oid = d.oid()?;
                let (txop, kind, must_exist) = match h.op {
                    op::WRITE_FULL => {
                        let data = d.bytes()?.to_vec();
                        (
                            TxOp::WriteFull {
                                oid: oid.clone(),
                                data,
                            },
                            KIND_MODIFY,
                            false,
                        )
                    }
                    op::WRITE => {
                        let offset = d.u64()?;
                        let data = d.bytes()?.to_vec();
                        (
                            TxOp::Write {
                                oid: oid.clone(),
                                offset,
                                data,
                            },
                            KIND_MODIFY,
                            false,
                        )
                    }
                    op::REMOVE => (TxOp::Remove { oid: oid.clone() }, KIND_REMOVE, true),
                    op::SETXATTR => {
                        let name = d.bytes()?.to_vec();
                        let value = d.bytes()?.to_vec();
                        (
                            TxOp::SetXattr {
                                oid: oid.clone(),
                                name,
                                value,
                            },
                            KIND_MODIFY,
                            false,
                        )
                    }
                    op::OMAP_SET => {
                        let entries = d.kvs()?;
                        (
                            TxOp::OmapSet {
                                oid: oid.clone(),
                                entries,
                            },
                            KIND_MODIFY,
                            false,
                        )
                    }
                    _ => {
                        let keys = d.keys()?;
                        (
                            TxOp::OmapRm {
                                oid: oid.clone(),
                                keys,
                            },
                            KIND_MODIFY,
                            true,
                        )
                    }
                };
                d.end()?;
                version_reply(self.write(&oid, txop, kind, must_exist, reqid)?)
            }
            op::READ => {
                let oid = d.oid()?;
                let (offset, len) = (d.u64()?, d.u64()?);
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                store.read(&oid, offset, len.min(u64::from(self.cfg.max_payload)))?
            }
            op::STAT => {
                let oid = d.oid()?;
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                let st = store.stat(&oid)?;
                Enc::new().u64(st.size).u64(st.mtime_ns).done()
            }
            op::GETXATTR => {
                let oid = d.oid()?;
                let name = d.bytes()?;
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                store.getxattr(&oid, name)?
            }
            op::GETXATTRS => {
                let oid = d.oid()?;
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                Enc::new().kvs(&store.getxattrs(&oid)?).done()
            }
            op::OMAP_GET => {
                let oid = d.oid()?;
                let keys = d.keys()?;
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                let vals = store.omap_get(&oid, &keys)?;
                let mut e = Enc::new();
                e.u32(vals.len() as u32);
                for v in vals {
                    match v {
                        None => e.u8(0),
                        Some(v) => e.u8(1).bytes(&v),
                    };
                }
                e.done()
            }
            op::OMAP_LIST => {
                let oid = d.oid()?;
                let after = d.opt_bytes()?;
                let max = d.u32()?.min(4096) as usize;
                d.end()?;
                self.check_read(self.pg_of(&oid)?, local)?;
                Enc::new().kvs(&store.omap_list(&oid, after, max)?).done()
            }
            op::LIST => {
                let (pg, after, max) = self.decode_list(&mut d)?;
                self.check_read(pg, local)?;
                let names = objects::list_pg(store, &self.map(), pg, after, max)?;
                Enc::new().keys(&names).done()
            }
            other => {
                return Err(op_err(
                    Status::UnknownOp,
                    format!("unknown op {other} on the client port"),
                ))
            }
        };
        Ok(out)
    }

    fn decode_list<'a>(&self, d: &mut Dec<'a>) -> Result<(PgId, Option<&'a [u8]>, usize), OpError> {
        let pool = d.u64()?;
        let pg = d.u32()?;
        let after = d.opt_bytes()?;
        let max = d.u32()?.min(4096) as usize;
        d.end()?;
        match self.map().pool(pool) {
            Some(p) if pg < p.pg_num => Ok((PgId { pool, pg }, after, max)),
            _ => Err(op_err(Status::NotFound, format!("no pg {pool}.{pg:x}"))),
        }
    }

    /// A client write: versioned, logged, replicated, acknowledged once every in-sync member
    /// (at least `min_size`) committed. A request id (client, tid) of one of the PG's last
    /// `max_dups` versions is a retry: answered with its version, not applied again.
    fn write(
        &self,
        oid: &ObjectId,
        txop: TxOp,
        kind: u8,
        must_exist: bool,
        reqid: (u64, u64),
    ) -> Result<u64, OpError> {
        let pgid = self.pg_of(oid)?;
        let pg = self.check_primary(pgid)?;
        let mut st = pg.lock();
        if !st.active {
            return Err(op_err(
                Status::PgInactive,
                format!("pg {pgid} is peering; retry"),
            ));
        }
        let map = self.map();
        let min = map.pool(pgid.pool).map_or(1, |p| p.min_size()) as usize;
        if let Some(&version) = st.reqids.get(&reqid).filter(|_| reqid.0 != 0) {
            // Every in-sync replica holds every version up to the head.
            let committed = st.in_sync.len() + 1;
            if committed < min {
                return Err(op_err(
                    Status::Degraded,
                    format!("pg {pgid}: only {committed} of min_size {min} members hold version {version}"),
                ));
            }
            return Ok(version);
        }
        if must_exist {
            self.store.stat(oid)?;
        }
        let version = st.head + 1;
        let mut tx = Transaction::new();
        tx.push(txop);
        let entry = LogEntry {
            version,
            kind,
            name: oid.name.clone(),
            reqid,
            epoch: map.epoch,
        };
        pglog::append_ops(&mut tx, pgid, &entry, self.cfg.retention);
        let replicas: Vec<u32> = st.in_sync.iter().copied().collect();
        let mut payload = Enc::new();
        payload.u64(pgid.pool).u32(pgid.pg).u64(version);
        tx.encode(&mut payload.0);
        let payload = payload.done();
        // The transaction goes to every in-sync replica first, then to this OSD's store;
        // the replicas apply it meanwhile, and their acknowledgements are read last.
        let sent: Vec<_> = replicas
            .iter()
            .map(|&r| (r, self.peer_send(r, op::REPL_TX, &payload)))
            .collect();
        let local = self.store.submit(&tx);
        let remote: Vec<(u32, Result<Vec<u8>, CallError>)> = sent
            .into_iter()
            .map(|(r, sent)| (r, sent.and_then(|s| self.peer_finish(s, &payload))))
            .collect();
        let mut committed = 1;
        for (r, res) in remote {
            match res {
                Ok(_) => committed += 1,
                Err(e) => {
                    tracing::warn!(pg = %pgid, replica = r, "replica out of sync: {e}");
                    st.in_sync.remove(&r);
                }
            }
        }
        if let Err(e) = local {
            // Replicas may hold the version: re-peer before accepting writes again.
            tracing::warn!(pg = %pgid, "local commit failed, re-peering: {e}");
            st.active = false;
            pg.publish(&st);
            return Err(e.into());
        }
        st.head = version;
        if reqid.0 != 0 {
            let keep = self.cfg.retention;
            st.note_reqid(version, reqid, keep.max_log.max(keep.max_dups));
        }
        pg.publish(&st);
        if committed < min {
            return Err(op_err(
                Status::Degraded,
                format!("pg {pgid}: only {committed} of min_size {min} members committed version {version}"),
            ));
        }
        Ok(version)
    }

    /// A call to a peer OSD's peer port; failures are remembered for the peering backoff.
    pub(crate) fn peer_call(
        &self,
        osd: u32,
        op: u16,
        payload: &[u8],
    ) -> Result<Vec<u8>, CallError> {
        self.peer_send(osd, op, payload)
            .and_then(|s| self.peer_finish(s, payload))
    }

    /// Sends a request to a peer without waiting for its reply ([`Inner::peer_finish`]).
    fn peer_send(&self, osd: u32, op: u16, payload: &[u8]) -> Result<PeerSent, CallError> {
        let view = self.view();
        let peer = view
            .peers
            .get(&osd)
            .ok_or_else(|| CallError::Op(op_err(Status::Invalid, format!("no osd {osd}"))))?;
        let r = peer.conns.send(op, 0, view.map.epoch, payload);
        let sent = Self::noted(peer, r)?;
        Ok(PeerSent {
            peer: peer.clone(),
            sent,
        })
    }

    /// The reply of a request [`Inner::peer_send`] sent.
    fn peer_finish(&self, s: PeerSent, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let r = s.peer.conns.finish(s.sent, payload);
        Self::noted(&s.peer, r)
    }

    /// `r`, a transport failure remembered for the peering backoff.
    fn noted<T>(peer: &Peer, r: Result<T, CallError>) -> Result<T, CallError> {
        if let Err(CallError::Transport { .. }) = &r {
            *peer.last_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            peer.conns.reset();
        }
        r
    }

    fn member_pg(&self, pg: PgId) -> Result<Arc<Pg>, OpError> {
        self.view().pgs.get(&pg).cloned().ok_or_else(|| {
            op_err(
                Status::Invalid,
                format!("osd {} is not a member of pg {pg}", self.cfg.id),
            )
        })
    }

    fn decode_pg(&self, d: &mut Dec<'_>) -> Result<PgId, OpError> {
        Ok(PgId {
            pool: d.u64()?,
            pg: d.u32()?,
        })
    }

    /// Decodes `REPL_TX` (with a version) or `PG_PUSH`: the PG, which this OSD must be a replica
    /// of, and the transaction.
    fn replica_tx(
        &self,
        d: &mut Dec<'_>,
        versioned: bool,
    ) -> Result<(Arc<Pg>, u64, Transaction), OpError> {
        let pgid = self.decode_pg(d)?;
        let version = if versioned { d.u64()? } else { 0 };
        let tx = Transaction::decode(d.rest())
            .map_err(|e| op_err(Status::BadFrame, format!("transaction: {e}")))?;
        let pg = self.member_pg(pgid)?;
        if pg.primary {
            return Err(op_err(
                Status::Invalid,
                format!("osd {} is the primary of pg {pgid}", self.cfg.id),
            ));
        }
        Ok((pg, version, tx))
    }

    /// Refuses a replica write to a PG that a new map took away (its lock held): the PG that
    /// replaces it read its head from the store when it was made, so a version applied here
    /// afterwards would leave that head behind the store. The primary recovers the replica.
    fn check_not_retired(pg: &Pg) -> Result<(), OpError> {
        if pg.retired.load(Ordering::Acquire) {
            return Err(op_err(
                Status::NeedRecovery,
                format!("pg {}: the map changed; recover", pg.id),
            ));
        }
        Ok(())
    }

    pub(crate) fn peer_op(&self, h: &Header, buf: &[u8]) -> Result<Vec<u8>, OpError> {
        let mut d = Dec::new(buf);
        match h.op {
            op::PING => {
                d.end()?;
                Ok(Enc::new().u32(self.cfg.id).u32(self.map().epoch).done())
            }
            op::REPL_TX => {
                let (pg, version, tx) = self.replica_tx(&mut d, true)?;
                let mut st = pg.lock();
                Self::check_not_retired(&pg)?;
                if version <= st.head {
                    return Ok(Vec::new());
                }
                if version != st.head + 1 {
                    return Err(op_err(
                        Status::NeedRecovery,
                        format!("pg {}: at version {}, sent {version}", pg.id, st.head),
                    ));
                }
                self.store.submit(&tx)?;
                st.head = version;
                pg.publish(&st);
                Ok(Vec::new())
            }
            op::PG_PUSH => {
                let (pg, _, tx) = self.replica_tx(&mut d, false)?;
                let mut st = pg.lock();
                Self::check_not_retired(&pg)?;
                self.store.submit(&tx)?;
                st.head = pglog::read_head(&self.store, pg.id)?;
                pg.publish(&st);
                Ok(Vec::new())
            }
            op::PG_LOG_QUERY => {
                let pgid = self.decode_pg(&mut d)?;
                d.end()?;
                self.member_pg(pgid)?;
                let log = pglog::read_log(&self.store, pgid)?;
                let mut e = Enc::new();
                log.encode(&mut e);
                Ok(e.done())
            }
            op::PG_PULL_OBJECT => {
                let oid = d.oid()?;
                let (offset, max) = (d.u64()?, d.u64()?);
                d.end()?;
                self.member_pg(self.pg_of(&oid)?)?;
                // The reply fits a frame whatever the caller asked for.
                let max = max.min(u64::from(self.cfg.max_payload / 2));
                Ok(objects::encode_piece(
                    objects::read_piece(&self.store, &oid, offset, max)?.as_ref(),
                ))
            }
            op::PG_LIST => {
                let (pg, after, max) = self.decode_list(&mut d)?;
                self.member_pg(pg)?;
                let names = objects::list_pg(&self.store, &self.map(), pg, after, max)?;
                Ok(Enc::new().keys(&names).done())
            }
            other => Err(op_err(
                Status::UnknownOp,
                format!("unknown op {other} on the peer port"),
            )),
        }
    }
}

impl From<CallError> for OpError {
    fn from(e: CallError) -> OpError {
        match e {
            CallError::Op(e) => e,
            t => op_err(Status::Io, t.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_lines_round_trip() {
        let (c, p): (SocketAddr, SocketAddr) = (
            "127.0.0.1:41000".parse().unwrap(),
            "[::1]:41001".parse().unwrap(),
        );
        assert_eq!(parse_ready_line(&ready_line(7, c, p)), Some((c, p)));
        assert_eq!(parse_ready_line("osd.7 ready: clients on nowhere"), None);
    }
}
