//! Where maps come from (`docs/osd-protocol.md`, "Cluster map" and "etcd as the monitor"): a
//! file reread every 200 ms, or etcd, where each OSD keeps an `alive` key under its lease, the
//! elected leader turns expired leases into a new map epoch with the OSD down (and returning
//! OSDs back up), and OSDs and clients watch the map key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::etcd::{Etcd, EtcdError};
use crate::map::{ClusterMap, MapError, OsdInfo, Placement};
use crate::server::MapHandle;

/// Period of the file poll and of the monitor's comparison.
pub const PERIOD: Duration = Duration::from_millis(200);

/// The etcd keys of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    pub cluster: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Keys {
        Keys {
            cluster: cluster.to_string(),
        }
    }

    pub fn map(&self) -> String {
        format!("/dds/osd/{}/map", self.cluster)
    }

    pub fn alive_prefix(&self) -> String {
        format!("/dds/osd/{}/alive/", self.cluster)
    }

    pub fn alive(&self, id: u32) -> String {
        format!("{}{id}", self.alive_prefix())
    }

    pub fn election(&self) -> String {
        format!("/dds/osd/{}/monitor", self.cluster)
    }
}

/// The value of an OSD's `alive` key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alive {
    pub addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub placement: Placement,
}

/// A map source that failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error(transparent)]
    Map(#[from] MapError),
    #[error("{0}")]
    Other(String),
}

fn parse_map(bytes: &[u8]) -> Result<ClusterMap, MapError> {
    ClusterMap::parse(&String::from_utf8_lossy(bytes))
}

/// The map in etcd; created from `seed` first when the key does not exist (one seed wins).
pub fn load_or_seed(
    etcd: &Etcd,
    keys: &Keys,
    seed: Option<&ClusterMap>,
) -> Result<ClusterMap, SourceError> {
    if etcd.get(&keys.map())?.is_none() {
        let seed = seed.ok_or_else(|| {
            SourceError::Other(format!(
                "no map at {} in etcd {}: give a seed map (--map FILE)",
                keys.map(),
                etcd.url()
            ))
        })?;
        etcd.put_if(&keys.map(), seed.to_toml().as_bytes(), 0)?;
    }
    load(etcd, keys)
}

/// The map in etcd.
pub fn load(etcd: &Etcd, keys: &Keys) -> Result<ClusterMap, SourceError> {
    let kv = etcd
        .get(&keys.map())?
        .ok_or_else(|| SourceError::Other(format!("no map at {} in etcd", keys.map())))?;
    Ok(parse_map(&kv.value)?)
}

/// Sets OSD `id`'s weight in the map in etcd, as the next epoch (weight 0 takes it out: its
/// PGs move to the others; 1 puts it back). Retried if the map changed meanwhile.
pub fn reweight(etcd: &Etcd, keys: &Keys, id: u32, weight: f64) -> Result<ClusterMap, SourceError> {
    loop {
        let kv = etcd
            .get(&keys.map())?
            .ok_or_else(|| SourceError::Other(format!("no map at {} in etcd", keys.map())))?;
        let mut map = parse_map(&kv.value)?;
        let o = map
            .osd_mut(id)
            .ok_or_else(|| SourceError::Other(format!("no osd {id} in the map")))?;
        o.weight = weight;
        map.epoch += 1;
        let text = map.to_toml();
        // Refuses what the map cannot hold (e.g. fewer OSDs in than a pool's size).
        ClusterMap::parse(&text)?;
        if etcd.put_if(&keys.map(), text.as_bytes(), kv.mod_revision)? {
            return Ok(map);
        }
    }
}

/// Follows the map key from a thread: reads it, watches it from the next revision, calls
/// `apply` with every map; a broken watch is reopened. Ends when `stopped` says so (at the
/// next map or error).
pub fn follow(
    etcd: Etcd,
    keys: Keys,
    name: &str,
    apply: impl Fn(ClusterMap) + Send + 'static,
    stopped: impl Fn() -> bool + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(format!("{name}-map-watch"))
        .spawn(move || {
            while !stopped() {
                let r = etcd.get(&keys.map()).and_then(|kv| {
                    let Some(kv) = kv else { return Ok(()) };
                    if let Ok(m) = parse_map(&kv.value) {
                        apply(m);
                    }
                    etcd.watch(&keys.map(), kv.mod_revision + 1, |kv| {
                        match parse_map(&kv.value) {
                            Ok(m) => apply(m),
                            Err(e) => tracing::warn!("map in etcd: {e}"),
                        }
                        !stopped()
                    })
                });
                if let Err(e) = r {
                    tracing::debug!("map watch: {e}");
                }
                std::thread::sleep(PERIOD);
            }
        })
        .map(|_| ())
}

/// Rereads the map file every [`PERIOD`] and gives the OSD each map of a higher epoch.
pub fn follow_file(osd: MapHandle, path: PathBuf) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("osd-map-file".into())
        .spawn(move || {
            let mut last = String::new();
            while !osd.stopped() {
                std::thread::sleep(PERIOD);
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                if text == last {
                    continue;
                }
                match ClusterMap::parse(&text) {
                    Ok(m) => {
                        if let Err(e) = osd.set_map(m) {
                            tracing::warn!("new map from {}: {e}", path.display());
                            continue;
                        }
                    }
                    // Perhaps half written: read again next time.
                    Err(e) => {
                        tracing::debug!("{}: {e}", path.display());
                        continue;
                    }
                }
                last = text;
            }
        })
        .map(|_| ())
}

/// An OSD's membership of an etcd-monitored cluster ([`join`]).
pub struct Membership {
    etcd: Etcd,
    lease: Arc<AtomicI64>,
}

impl Membership {
    /// Leaves the cluster at once (a clean shutdown): revokes the lease, so the `alive` key
    /// and the election key go now rather than when the lease would expire.
    pub fn leave(self) {
        if let Err(e) = self.etcd.revoke(self.lease.load(Ordering::SeqCst)) {
            tracing::warn!("leaving the cluster: {e}");
        }
    }
}

/// An OSD's membership in an etcd-monitored cluster: its lease and `alive` key, its
/// campaign for the monitor role (and the monitor's work when it leads), its map watch.
pub fn join(
    osd: MapHandle,
    etcd: Etcd,
    keys: Keys,
    ttl: u64,
    alive: Alive,
) -> Result<Membership, SourceError> {
    let id = osd.id();
    let value = serde_json::to_vec(&alive).map_err(|e| SourceError::Other(e.to_string()))?;
    let lease = etcd.grant(ttl)?;
    etcd.put(&keys.alive(id), &value, lease)?;
    let lease = Arc::new(AtomicI64::new(lease));
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .map(|_| ())
            .map_err(|e| SourceError::Other(e.to_string()))
    };
    {
        let (osd, etcd, keys, lease) = (osd.clone(), etcd.clone(), keys.clone(), lease.clone());
        spawn(
            "osd-etcd-lease",
            Box::new(move || keep_alive(&osd, &etcd, &keys, ttl, &lease, &value)),
        )?;
    }
    {
        let (osd, etcd, keys, lease) = (osd.clone(), etcd.clone(), keys.clone(), lease.clone());
        spawn(
            "osd-monitor",
            Box::new(move || campaign(&osd, &etcd, &keys, &lease)),
        )?;
    }
    let membership = Membership {
        etcd: etcd.clone(),
        lease,
    };
    let o = osd.clone();
    let apply = move |m: ClusterMap| {
        if let Err(e) = o.set_map(m) {
            tracing::warn!("new map from etcd: {e}");
        }
    };
    follow(etcd, keys, "osd", apply, move || osd.stopped())
        .map_err(|e| SourceError::Other(e.to_string()))?;
    Ok(membership)
}

/// Renews the lease every third of its TTL; a lease that expired anyway is granted again
/// and the `alive` key put under it.
fn keep_alive(
    osd: &MapHandle,
    etcd: &Etcd,
    keys: &Keys,
    ttl: u64,
    lease: &AtomicI64,
    value: &[u8],
) {
    let step = Duration::from_millis((ttl * 1000 / 3).max(100));
    while !osd.stopped() {
        std::thread::sleep(step);
        let r = etcd
            .keep_alive(lease.load(Ordering::SeqCst))
            .and_then(|alive| {
                if !alive {
                    tracing::warn!(osd = osd.id(), "lease expired; registering again");
                    let l = etcd.grant(ttl)?;
                    etcd.put(&keys.alive(osd.id()), value, l)?;
                    lease.store(l, Ordering::SeqCst);
                }
                Ok(())
            });
        if let Err(e) = r {
            tracing::warn!(osd = osd.id(), "keepalive: {e}");
        }
    }
    let _ = etcd.revoke(lease.load(Ordering::SeqCst));
}

/// Campaigns for the monitor role; while leading, keeps the map in line with the `alive`
/// keys.
fn campaign(osd: &MapHandle, etcd: &Etcd, keys: &Keys, lease: &AtomicI64) {
    while !osd.stopped() {
        let held = lease.load(Ordering::SeqCst);
        let leader_key =
            match etcd.campaign(&keys.election(), held, osd.id().to_string().as_bytes()) {
                Ok(k) => k,
                Err(e) => {
                    tracing::debug!(osd = osd.id(), "campaign: {e}");
                    std::thread::sleep(PERIOD);
                    continue;
                }
            };
        tracing::info!(osd = osd.id(), "leading the monitor");
        while !osd.stopped() {
            match etcd.get(&leader_key) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("monitor: {e}");
                    std::thread::sleep(PERIOD);
                    continue;
                }
            }
            if let Err(e) = monitor_step(etcd, keys) {
                tracing::warn!("monitor: {e}");
            }
            std::thread::sleep(PERIOD);
        }
        tracing::info!(osd = osd.id(), "no longer leading the monitor");
    }
}

/// The map `map` becomes given the `alive` keys (`None`: no change).
pub fn next_map(map: &ClusterMap, alive: &BTreeMap<u32, Alive>) -> Option<ClusterMap> {
    let mut next = map.clone();
    let mut changed = false;
    for o in &mut next.osds {
        let seen = alive.get(&o.id);
        let now = match seen {
            Some(a) => (true, a.addr, a.peer_addr, a.placement),
            None => (false, o.addr, o.peer_addr, o.placement),
        };
        if (o.up, o.addr, o.peer_addr, o.placement) != now {
            (o.up, o.addr, o.peer_addr, o.placement) = now;
            changed = true;
        }
    }
    // An OSD of a new id joins the map (weight 1, up): straw2 moves to it only the PGs it wins.
    for (&id, a) in alive {
        if map.osd(id).is_none() {
            next.osds.push(OsdInfo {
                id,
                addr: a.addr,
                peer_addr: a.peer_addr,
                weight: 1.0,
                placement: a.placement,
                up: true,
            });
            changed = true;
        }
    }
    changed.then(|| {
        next.osds.sort_by_key(|o| o.id);
        next.epoch += 1;
        next
    })
}

/// One comparison of the map with the `alive` keys; a change is written as the next epoch
/// if nobody changed the map meanwhile.
fn monitor_step(etcd: &Etcd, keys: &Keys) -> Result<(), SourceError> {
    let Some(kv) = etcd.get(&keys.map())? else {
        return Ok(());
    };
    let map = parse_map(&kv.value)?;
    let (kvs, _) = etcd.range_prefix(&keys.alive_prefix())?;
    let mut alive = BTreeMap::new();
    for kv in kvs {
        let id = kv.key[keys.alive_prefix().len()..].parse::<u32>();
        match (id, serde_json::from_slice::<Alive>(&kv.value)) {
            (Ok(id), Ok(a)) => {
                alive.insert(id, a);
            }
            _ => tracing::warn!(key = %kv.key, "an alive key that does not parse"),
        }
    }
    if let Some(next) = next_map(&map, &alive) {
        let down: Vec<u32> = next.osds.iter().filter(|o| !o.up).map(|o| o.id).collect();
        if etcd.put_if(&keys.map(), next.to_toml().as_bytes(), kv.mod_revision)? {
            tracing::info!(epoch = next.epoch, ?down, "new map");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_leases_go_down_and_returning_osds_come_up_with_their_addresses() {
        let map = ClusterMap::parse(
            "epoch = 4\n[[osd]]\nid = 0\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n\
             [[osd]]\nid = 1\naddr = \"127.0.0.1:7001\"\npeer_addr = \"127.0.0.1:7002\"\n",
        )
        .unwrap();
        let alive = |id: u32, port: u16| {
            (
                id,
                Alive {
                    addr: ([127, 0, 0, 1], port).into(),
                    peer_addr: ([127, 0, 0, 1], port + 1).into(),
                    placement: Placement::Host,
                },
            )
        };
        // OSD 0 registered: it gets its ports; OSD 1's lease is gone: down.
        let next = next_map(&map, &BTreeMap::from([alive(0, 6000)])).unwrap();
        assert_eq!(next.epoch, 5);
        assert!(next.osds[0].up && next.osds[0].addr.port() == 6000);
        assert_eq!(next.osds[0].peer_addr.port(), 6001);
        assert!(!next.osds[1].up);
        assert_eq!(next.osds[1].addr, map.osds[1].addr);
        // Nothing changed: no new epoch.
        assert!(next_map(&next, &BTreeMap::from([alive(0, 6000)])).is_none());
        // OSD 1 back on other ports.
        let back = next_map(&next, &BTreeMap::from([alive(0, 6000), alive(1, 6100)])).unwrap();
        assert_eq!(back.epoch, 6);
        assert!(back.osds[1].up && back.osds[1].addr.port() == 6100);
        // A new id joins, up, with its ports.
        let alive3 = BTreeMap::from([alive(0, 6000), alive(1, 6100), alive(3, 6300)]);
        let joined = next_map(&back, &alive3).unwrap();
        assert_eq!(joined.epoch, 7);
        let o3 = joined.osd(3).unwrap();
        assert!(o3.up && o3.addr.port() == 6300 && o3.weight == 1.0);
        assert!(next_map(&joined, &alive3).is_none());
    }
}
