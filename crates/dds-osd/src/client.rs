//! The client library: routes each op to its PG's primary by the cluster map.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dds_objstore::{KvPairs, ObjStat, ObjectId};

use crate::conn::{CallError, ConnPool};
use crate::map::{ClusterMap, PgId};
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

/// A connection to a cluster: one connection pool per OSD.
pub struct Client {
    map: ClusterMap,
    conns: BTreeMap<u32, ConnPool>,
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
    /// A client of the cluster described by a map file.
    pub fn connect_map(path: impl AsRef<Path>) -> Result<Client, OpError> {
        let map = ClusterMap::load(path).map_err(|e| err(Status::Invalid, e.to_string()))?;
        Ok(Client::with_map(map, ClientOptions::default()))
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
        let conns = map
            .osds
            .iter()
            .map(|o| {
                (
                    o.id,
                    ConnPool::new(o.addr, opts.connect_timeout, opts.io_timeout),
                )
            })
            .collect();
        Client {
            map,
            conns,
            opts,
            id: random_id(),
            next_tid: AtomicU64::new(1),
        }
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    fn pg(&self, oid: &ObjectId) -> Result<PgId, OpError> {
        self.map
            .pg_of(oid.pool, &oid.name)
            .ok_or_else(|| err(Status::NotFound, format!("no pool {} in the map", oid.pool)))
    }

    fn call(&self, route: Route, op: u16, payload: &[u8]) -> Result<Vec<u8>, OpError> {
        let (osd, flags) = match route {
            Route::Primary(pg) => {
                let acting = self.map.acting(pg);
                let primary = *acting
                    .first()
                    .ok_or_else(|| err(Status::NotFound, format!("pg {pg} has no OSDs")))?;
                (primary, 0)
            }
            Route::Local(osd) => (osd, FLAG_LOCAL),
        };
        let conns = self
            .conns
            .get(&osd)
            .ok_or_else(|| err(Status::NotFound, format!("no osd {osd} in the map")))?;
        let deadline = Instant::now() + self.opts.retry_for;
        let mut pause = Duration::from_millis(20);
        loop {
            let r = conns.call(op, flags, self.map.epoch, payload);
            let retry = match &r {
                Err(CallError::Transport { .. }) => {
                    conns.reset();
                    true
                }
                Err(CallError::Op(e)) => e.status == Status::PgInactive,
                Ok(_) => false,
            };
            if !retry || Instant::now() + pause > deadline {
                return r.map_err(|e| match e {
                    CallError::Transport { addr, err: io } => err(
                        Status::Io,
                        format!("osd {osd} at {addr} {UNREACHABLE} (no primary failover): {io}"),
                    ),
                    CallError::Op(e) => OpError::new(e.status, format!("osd {osd}: {}", e.text)),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(250));
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
        let p = self
            .map
            .pool(pool)
            .ok_or_else(|| err(Status::NotFound, format!("no pool {pool} in the map")))?;
        let mut all = Vec::new();
        for pg in 0..p.pg_num {
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
