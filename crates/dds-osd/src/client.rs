//! The client library: routes each op to its PG's primary by the cluster map.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use dds_objstore::{KvPairs, ObjStat, ObjectId};

use crate::conn::{CallError, ConnPool};
use crate::etcd::Etcd;
use crate::map::{ClusterMap, PgId};
use crate::monitor::{self, Keys};
use crate::wire::{op, Dec, Enc, OpError, Status, FLAG_LOCAL};

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub io_timeout: Duration,
    /// How long an op is retried while its primary is unreachable or its PG is peering.
    pub retry_for: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(30),
            retry_for: Duration::from_secs(10),
        }
    }
}

/// Where a client gets newer maps.
enum Source {
    /// From the OSDs (`GET_MAP`).
    Osds,
    /// From a map file.
    File(PathBuf),
    /// From etcd (also watched from a thread).
    Etcd(Etcd, Keys),
}

/// The map a client holds, shared with its watch thread.
type SharedMap = Arc<RwLock<Arc<ClusterMap>>>;

/// The client's connection pools, by OSD, shared with its watch thread.
type Pools = Arc<Mutex<BTreeMap<u32, Arc<ConnPool>>>>;

/// Replaces the map by `m` if its epoch is higher. The calls in progress to an OSD that `m`
/// has down fail at once and are retried under `m` (as Ceph's clients resend their ops when
/// a map changes their target), rather than wait for a reply that may never come.
fn adopt(shared: &SharedMap, pools: &Pools, m: ClusterMap) -> bool {
    let mut cur = shared.write().unwrap_or_else(|e| e.into_inner());
    if m.epoch <= cur.epoch {
        return false;
    }
    let new = Arc::new(m);
    let old = std::mem::replace(&mut *cur, new.clone());
    drop(cur);
    let pools = pools.lock().unwrap_or_else(|e| e.into_inner());
    for (id, pool) in pools.iter() {
        let was_up = old.osd(*id).is_some_and(|o| o.up);
        if was_up && new.osd(*id).is_none_or(|o| !o.up) {
            pool.abort();
        }
    }
    true
}

/// A connection to a cluster: one connection pool per OSD, following the cluster's maps.
pub struct Client {
    map: SharedMap,
    source: Source,
    conns: Pools,
    /// Set when the client is dropped (ends its watch thread).
    closed: Arc<AtomicBool>,
    opts: ClientOptions,
    /// This client's random id and its next write's tid: a write keeps its (id, tid) through
    /// retries, and the primary applies it once.
    id: u64,
    next_tid: AtomicU64,
}

/// A random non-zero client id (the standard library's per-process random hash keys).
fn random_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish().max(1)
}

/// Where an op goes.
#[derive(Clone, Copy)]
enum Route {
    /// The PG's primary.
    Primary(PgId),
    /// One OSD, served from its own store (flag local).
    Local(u32),
}

fn err(status: Status, text: impl Into<String>) -> OpError {
    OpError::new(status, text)
}

/// The word of an error whose OSD did not answer within the retries.
const UNREACHABLE: &str = "unreachable";

/// Whether `e` says that an OSD did not answer (no connection within the retries), rather
/// than that it refused the operation.
pub fn is_unreachable(e: &OpError) -> bool {
    e.status == Status::Io && e.text.contains(&format!(" {UNREACHABLE} "))
}

impl Client {
    /// A client of the cluster described by a map file (reread when a newer map is needed).
    pub fn connect_map(path: impl AsRef<Path>) -> Result<Client, OpError> {
        let path = path.as_ref();
        let map = ClusterMap::load(path).map_err(|e| err(Status::Invalid, e.to_string()))?;
        let mut c = Client::with_map(map, ClientOptions::default());
        c.source = Source::File(path.to_path_buf());
        Ok(c)
    }

    /// A client of the cluster whose map is in etcd at `url` under `cluster`, watched.
    pub fn connect_etcd(url: &str, cluster: &str, opts: ClientOptions) -> Result<Client, OpError> {
        let etcd = Etcd::new(url);
        let keys = Keys::new(cluster);
        let map = monitor::load(&etcd, &keys).map_err(|e| err(Status::Io, e.to_string()))?;
        let mut c = Client::with_map(map, opts);
        let (shared, pools, closed) = (c.map.clone(), c.conns.clone(), c.closed.clone());
        monitor::follow(
            etcd.clone(),
            keys.clone(),
            "client",
            move |m| {
                adopt(&shared, &pools, m);
            },
            move || closed.load(Ordering::Relaxed),
        )
        .map_err(|e| err(Status::Io, format!("map watch thread: {e}")))?;
        c.source = Source::Etcd(etcd, keys);
        Ok(c)
    }

    /// A client of the cluster whose map an OSD at one of `addrs` returns (`GET_MAP`).
    pub fn connect(addrs: &[SocketAddr], opts: ClientOptions) -> Result<Client, OpError> {
        let mut last = err(Status::Io, "no OSD address given");
        for &a in addrs {
            let pool = ConnPool::new(a, opts.connect_timeout, opts.io_timeout);
            match pool.call(op::GET_MAP, 0, 0, &[]) {
                Ok(text) => {
                    let map = ClusterMap::parse(&String::from_utf8_lossy(&text))
                        .map_err(|e| err(Status::Invalid, format!("map from {a}: {e}")))?;
                    return Ok(Client::with_map(map, opts));
                }
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }

    /// A client of the cluster described by `map`.
    pub fn with_map(map: ClusterMap, opts: ClientOptions) -> Client {
        Client {
            map: Arc::new(RwLock::new(Arc::new(map))),
            source: Source::Osds,
            conns: Arc::new(Mutex::new(BTreeMap::new())),
            closed: Arc::new(AtomicBool::new(false)),
            opts,
            id: random_id(),
            next_tid: AtomicU64::new(1),
        }
    }

    /// The map the client holds now.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The connections to `osd` at the address `map` gives it (`None` while unknown).
    fn conns_of(&self, map: &ClusterMap, osd: u32) -> Option<Arc<ConnPool>> {
        let info = map.osd(osd).filter(|o| o.addr.port() != 0)?;
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let c = conns
            .entry(osd)
            .and_modify(|c| {
                if c.addr() != info.addr {
                    *c = Arc::new(ConnPool::new(
                        info.addr,
                        self.opts.connect_timeout,
                        self.opts.io_timeout,
                    ));
                }
            })
            .or_insert_with(|| {
                Arc::new(ConnPool::new(
                    info.addr,
                    self.opts.connect_timeout,
                    self.opts.io_timeout,
                ))
            });
        Some(c.clone())
    }

    /// Looks for a newer map: from `osd` (which answered with a newer epoch), from the
    /// client's source, or from the OSDs it knows.
    fn refresh(&self, osd: Option<u32>) {
        let from_osd = |id: u32| {
            let map = self.map();
            let c = self.conns_of(&map, id)?;
            let text = c.call(op::GET_MAP, 0, 0, &[]).ok()?;
            ClusterMap::parse(&String::from_utf8_lossy(&text)).ok()
        };
        if let Some(m) = osd.and_then(from_osd) {
            adopt(&self.map, &self.conns, m);
        }
        match &self.source {
            Source::File(p) => {
                if let Ok(m) = ClusterMap::load(p) {
                    adopt(&self.map, &self.conns, m);
                }
            }
            Source::Etcd(etcd, keys) => {
                if let Ok(m) = monitor::load(etcd, keys) {
                    adopt(&self.map, &self.conns, m);
                }
            }
            Source::Osds if osd.is_none() => {
                let ids: Vec<u32> = self
                    .map()
                    .osds
                    .iter()
                    .filter(|o| o.up)
                    .map(|o| o.id)
                    .collect();
                for m in ids.into_iter().filter_map(from_osd) {
                    adopt(&self.map, &self.conns, m);
                }
            }
            Source::Osds => {}
        }
    }

    fn pg(&self, oid: &ObjectId) -> Result<PgId, OpError> {
        self.map()
            .pg_of(oid.pool, &oid.name)
            .ok_or_else(|| err(Status::NotFound, format!("no pool {} in the map", oid.pool)))
    }

    /// Sends an op where `route` leads under the current map, retrying (under newer maps)
    /// while its OSD is unreachable, its PG peering, degraded or below `min_size`, or the map
    /// stale.
    fn call(&self, route: Route, op: u16, payload: &[u8]) -> Result<Vec<u8>, OpError> {
        let deadline = Instant::now() + self.opts.retry_for;
        let mut pause = Duration::from_millis(20);
        loop {
            let map = self.map();
            let (osd, flags) = match route {
                Route::Primary(pg) => {
                    let primary = *map.acting(pg).first().ok_or_else(|| {
                        err(
                            Status::BelowMinSize,
                            format!("pg {pg} has no OSD up (map epoch {})", map.epoch),
                        )
                    })?;
                    (primary, 0)
                }
                Route::Local(osd) => (osd, FLAG_LOCAL),
            };
            if map.osd(osd).is_none() {
                return Err(err(Status::NotFound, format!("no osd {osd} in the map")));
            }
            let r = match self.conns_of(&map, osd) {
                Some(c) => c.call(op, flags, map.epoch, payload).inspect_err(|e| {
                    if matches!(e, CallError::Transport { .. }) {
                        c.reset();
                    }
                }),
                None => Err(CallError::Transport {
                    addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                    err: std::io::Error::other("its address is not known yet"),
                }),
            };
            let retry = match &r {
                Err(CallError::Transport { .. }) => Some(None),
                Err(CallError::Op(e)) => match e.status {
                    Status::StaleEpoch | Status::NotPrimary => Some(Some(osd)),
                    // A write that missed min_size is retried with its reqid: answered with
                    // its version once peering brought enough members back in sync.
                    Status::PgInactive | Status::BelowMinSize | Status::Degraded => Some(None),
                    _ => None,
                },
                Ok(_) => None,
            };
            let Some(ask) = retry.filter(|_| Instant::now() + pause <= deadline) else {
                return r.map_err(|e| match e {
                    CallError::Transport { addr, err: io } => err(
                        Status::Io,
                        format!(
                            "osd {osd} at {addr} {UNREACHABLE} (map epoch {}): {io}",
                            map.epoch
                        ),
                    ),
                    CallError::Op(e) => OpError::new(e.status, format!("osd {osd}: {}", e.text)),
                });
            };
            self.refresh(ask);
            if self.map().epoch == map.epoch {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(250));
            }
        }
    }

    fn version(out: &[u8]) -> Result<u64, OpError> {
        let mut d = Dec::new(out);
        let v = d.u64()?;
        d.end()?;
        Ok(v)
    }

    /// A write's payload so far: this client's id and a new tid.
    fn request(&self) -> Enc {
        let mut e = Enc::new();
        e.u64(self.id)
            .u64(self.next_tid.fetch_add(1, Ordering::Relaxed));
        e
    }

    fn write_op(&self, oid: &ObjectId, op: u16, e: &mut Enc) -> Result<u64, OpError> {
        let out = self.call(Route::Primary(self.pg(oid)?), op, &e.done())?;
        Client::version(&out)
    }

    /// Replaces the object's data; returns the PG version of the write.
    pub fn write_full(&self, oid: &ObjectId, data: &[u8]) -> Result<u64, OpError> {
        self.write_op(oid, op::WRITE_FULL, self.request().oid(oid).bytes(data))
    }

    /// Writes `data` at `offset`.
    pub fn write(&self, oid: &ObjectId, offset: u64, data: &[u8]) -> Result<u64, OpError> {
        self.write_op(
            oid,
            op::WRITE,
            self.request().oid(oid).u64(offset).bytes(data),
        )
    }

    /// Removes the object.
    pub fn remove(&self, oid: &ObjectId) -> Result<u64, OpError> {
        self.write_op(oid, op::REMOVE, self.request().oid(oid))
    }

    pub fn setxattr(&self, oid: &ObjectId, name: &[u8], value: &[u8]) -> Result<u64, OpError> {
        self.write_op(
            oid,
            op::SETXATTR,
            self.request().oid(oid).bytes(name).bytes(value),
        )
    }

    pub fn omap_set(&self, oid: &ObjectId, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<u64, OpError> {
        self.write_op(oid, op::OMAP_SET, self.request().oid(oid).kvs(entries))
    }

    pub fn omap_rm(&self, oid: &ObjectId, keys: &[Vec<u8>]) -> Result<u64, OpError> {
        self.write_op(oid, op::OMAP_RM, self.request().oid(oid).keys(keys))
    }

    fn route(&self, oid: &ObjectId, on: Option<u32>) -> Result<Route, OpError> {
        Ok(match on {
            Some(osd) => Route::Local(osd),
            None => Route::Primary(self.pg(oid)?),
        })
    }

    fn read_on(
        &self,
        on: Option<u32>,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, OpError> {
        let p = Enc::new().oid(oid).u64(offset).u64(len).done();
        self.call(self.route(oid, on)?, op::READ, &p)
    }

    fn stat_on(&self, on: Option<u32>, oid: &ObjectId) -> Result<ObjStat, OpError> {
        let out = self.call(self.route(oid, on)?, op::STAT, &Enc::new().oid(oid).done())?;
        let mut d = Dec::new(&out);
        let st = ObjStat {
            size: d.u64()?,
            mtime_ns: d.u64()?,
        };
        d.end()?;
        Ok(st)
    }

    fn getxattrs_on(&self, on: Option<u32>, oid: &ObjectId) -> Result<KvPairs, OpError> {
        let out = self.call(
            self.route(oid, on)?,
            op::GETXATTRS,
            &Enc::new().oid(oid).done(),
        )?;
        let mut d = Dec::new(&out);
        let kvs = d.kvs()?;
        d.end()?;
        Ok(kvs)
    }

    fn omap_list_on(
        &self,
        on: Option<u32>,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: u32,
    ) -> Result<KvPairs, OpError> {
        let p = Enc::new().oid(oid).opt_bytes(start_after).u32(max).done();
        let out = self.call(self.route(oid, on)?, op::OMAP_LIST, &p)?;
        let mut d = Dec::new(&out);
        let kvs = d.kvs()?;
        d.end()?;
        Ok(kvs)
    }

    fn list_pg_on(&self, route: Route, pg: PgId) -> Result<Vec<Vec<u8>>, OpError> {
        let mut all = Vec::new();
        loop {
            let p = Enc::new()
                .u64(pg.pool)
                .u32(pg.pg)
                .opt_bytes(all.last().map(|n: &Vec<u8>| n.as_slice()))
                .u32(4096)
                .done();
            let out = self.call(route, op::LIST, &p)?;
            let mut d = Dec::new(&out);
            let page = d.keys()?;
            d.end()?;
            if page.is_empty() {
                return Ok(all);
            }
            all.extend(page);
        }
    }

    /// Up to `len` bytes at `offset` (short at the end of the object).
    pub fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, OpError> {
        self.read_on(None, oid, offset, len)
    }

    /// The whole object's data.
    pub fn read_full(&self, oid: &ObjectId) -> Result<Vec<u8>, OpError> {
        self.read_full_on(None, oid)
    }

    pub fn stat(&self, oid: &ObjectId) -> Result<ObjStat, OpError> {
        self.stat_on(None, oid)
    }

    /// The object's data as its stat sizes it, in as many reads as the OSD's frame limit
    /// takes (the buffer grows with the bytes that arrive).
    fn read_full_on(&self, on: Option<u32>, oid: &ObjectId) -> Result<Vec<u8>, OpError> {
        let size = self.stat_on(on, oid)?.size;
        let mut out = Vec::new();
        while (out.len() as u64) < size {
            let part = self.read_on(on, oid, out.len() as u64, size - out.len() as u64)?;
            if part.is_empty() {
                break;
            }
            out.extend_from_slice(&part);
        }
        Ok(out)
    }

    pub fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, OpError> {
        let p = Enc::new().oid(oid).bytes(name).done();
        self.call(Route::Primary(self.pg(oid)?), op::GETXATTR, &p)
    }

    pub fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, OpError> {
        self.getxattrs_on(None, oid)
    }

    /// The values of `keys` (`None` for a missing key).
    pub fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, OpError> {
        let p = Enc::new().oid(oid).keys(keys).done();
        let out = self.call(Route::Primary(self.pg(oid)?), op::OMAP_GET, &p)?;
        let mut d = Dec::new(&out);
        let n = d.u32()?;
        let mut vals = Vec::new();
        for _ in 0..n {
            vals.push(match d.u8()? {
                0 => None,
                _ => Some(d.bytes()?.to_vec()),
            });
        }
        d.end()?;
        Ok(vals)
    }

    /// Up to `max` (at most 4096) omap entries after `start_after`.
    pub fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: u32,
    ) -> Result<KvPairs, OpError> {
        self.omap_list_on(None, oid, start_after, max)
    }

    /// Every object name of `pool`, in byte order.
    pub fn list(&self, pool: u64) -> Result<Vec<Vec<u8>>, OpError> {
        let pg_num = self
            .map()
            .pool(pool)
            .ok_or_else(|| err(Status::NotFound, format!("no pool {pool} in the map")))?
            .pg_num;
        let mut all = Vec::new();
        for pg in 0..pg_num {
            let pg = PgId { pool, pg };
            all.extend(self.list_pg_on(Route::Primary(pg), pg)?);
        }
        all.sort();
        Ok(all)
    }

    /// `PING` of one OSD: its id and map epoch.
    pub fn ping(&self, osd: u32) -> Result<(u32, u32), OpError> {
        let out = self.call(Route::Local(osd), op::PING, &[])?;
        let mut d = Dec::new(&out);
        let r = (d.u32()?, d.u32()?);
        d.end()?;
        Ok(r)
    }

    /// `STATUS` of one OSD (JSON, `docs/osd-protocol.md`).
    pub fn status(&self, osd: u32) -> Result<serde_json::Value, OpError> {
        let out = self.call(Route::Local(osd), op::STATUS, &[])?;
        serde_json::from_slice(&out).map_err(|e| err(Status::BadFrame, e.to_string()))
    }

    /// Reads served by one OSD from its own store, bypassing the primary (to check replicas).
    pub fn on(&self, osd: u32) -> OsdView<'_> {
        OsdView { client: self, osd }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

/// Reads from one OSD's own store ([`Client::on`]).
pub struct OsdView<'a> {
    client: &'a Client,
    osd: u32,
}

impl OsdView<'_> {
    pub fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, OpError> {
        self.client.read_on(Some(self.osd), oid, offset, len)
    }

    /// The whole object's data.
    pub fn read_full(&self, oid: &ObjectId) -> Result<Vec<u8>, OpError> {
        self.client.read_full_on(Some(self.osd), oid)
    }

    pub fn stat(&self, oid: &ObjectId) -> Result<ObjStat, OpError> {
        self.client.stat_on(Some(self.osd), oid)
    }

    pub fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, OpError> {
        self.client.getxattrs_on(Some(self.osd), oid)
    }

    pub fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: u32,
    ) -> Result<KvPairs, OpError> {
        self.client
            .omap_list_on(Some(self.osd), oid, start_after, max)
    }

    /// Names of `pg`'s objects in this OSD's store.
    pub fn list_pg(&self, pg: PgId) -> Result<Vec<Vec<u8>>, OpError> {
        self.client.list_pg_on(Route::Local(self.osd), pg)
    }
}
