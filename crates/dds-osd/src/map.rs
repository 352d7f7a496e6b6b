//! The cluster map (a TOML file) and placement: objects to placement groups by FNV-1a, placement
//! groups to acting sets of OSDs by straw2 (`docs/osd-protocol.md`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Pool id reserved for the PG metadata objects (PG logs).
pub const META_POOL: u64 = u64::MAX;

/// Where an OSD's front end runs relative to its object store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Front end and store in one host process.
    #[default]
    Host,
    /// Front end in a DPU process, store on the host behind a proxy.
    Dpu,
}

/// One OSD of the map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsdInfo {
    pub id: u32,
    /// Client port.
    pub addr: SocketAddr,
    /// Peer (replication and recovery) port.
    pub peer_addr: SocketAddr,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub placement: Placement,
    /// Whether the OSD is up (a down OSD leaves its PGs' acting sets).
    #[serde(default = "default_up")]
    pub up: bool,
}

fn default_weight() -> f64 {
    1.0
}

fn default_up() -> bool {
    true
}

impl OsdInfo {
    /// Whether both its ports are known (not port 0).
    pub fn addressed(&self) -> bool {
        self.addr.port() != 0 && self.peer_addr.port() != 0
    }
}

/// One pool of the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInfo {
    pub id: u64,
    pub name: String,
    pub pg_num: u32,
    pub size: u32,
    /// Members that must commit a write (default `size / 2 + 1`).
    #[serde(default)]
    pub min_size: Option<u32>,
}

impl PoolInfo {
    /// `min_size`, or its default.
    pub fn min_size(&self) -> u32 {
        self.min_size.unwrap_or(self.size / 2 + 1)
    }
}

/// The cluster map: OSDs, their addresses, placements and weights, pools, and an epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterMap {
    pub epoch: u32,
    #[serde(default, rename = "osd")]
    pub osds: Vec<OsdInfo>,
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolInfo>,
}

/// A map that does not parse or does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("cluster map {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("cluster map: {0}")]
    Parse(String),
    #[error("cluster map: {0}")]
    Invalid(String),
}

/// A placement group: a pool and a PG number within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PgId {
    pub pool: u64,
    pub pg: u32,
}

impl std::fmt::Display for PgId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:x}", self.pool, self.pg)
    }
}

/// FNV-1a, 64 bits.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// splitmix64's step and finalizer.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The straw2 draw of `osd` for a PG: `ln(u) / weight` with `u` in (0, 1] from the hash.
fn straw2_draw(pg: PgId, osd: u32, weight: f64) -> f64 {
    let h = mix(mix(mix(pg.pool) ^ u64::from(pg.pg)) ^ u64::from(osd));
    let u = ((h >> 11) + 1) as f64 / (1u64 << 53) as f64;
    u.ln() / weight
}

impl ClusterMap {
    /// Parses TOML text and validates it.
    pub fn parse(text: &str) -> Result<ClusterMap, MapError> {
        let map: ClusterMap = toml::from_str(text).map_err(|e| MapError::Parse(e.to_string()))?;
        map.validate()?;
        Ok(map)
    }

    /// Reads and validates a map file.
    pub fn load(path: impl AsRef<Path>) -> Result<ClusterMap, MapError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| MapError::Read {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        ClusterMap::parse(&text)
    }

    /// The map as TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    fn validate(&self) -> Result<(), MapError> {
        let bad = |m: String| Err(MapError::Invalid(m));
        if self.epoch == 0 {
            return bad("epoch must be > 0".into());
        }
        let mut ids = BTreeSet::new();
        for o in &self.osds {
            if !ids.insert(o.id) {
                return bad(format!("osd id {} appears twice", o.id));
            }
            if !o.weight.is_finite() || o.weight < 0.0 {
                return bad(format!("osd {}: weight must be finite and >= 0", o.id));
            }
        }
        let holders = self.osds.iter().filter(|o| o.weight > 0.0).count() as u32;
        let mut pids = BTreeSet::new();
        for p in &self.pools {
            if !pids.insert(p.id) {
                return bad(format!("pool id {} appears twice", p.id));
            }
            if p.id == META_POOL {
                return bad(format!("pool id {META_POOL} is reserved"));
            }
            if p.pg_num == 0 || p.pg_num > 65536 {
                return bad(format!("pool {}: pg_num must be 1..=65536", p.id));
            }
            if p.size == 0 || p.size > holders {
                return bad(format!(
                    "pool {}: size {} needs as many OSDs with weight > 0 ({holders})",
                    p.id, p.size
                ));
            }
            if p.min_size() == 0 || p.min_size() > p.size {
                return bad(format!("pool {}: min_size must be 1..=size", p.id));
            }
        }
        Ok(())
    }

    pub fn osd(&self, id: u32) -> Option<&OsdInfo> {
        self.osds.iter().find(|o| o.id == id)
    }

    pub fn osd_mut(&mut self, id: u32) -> Option<&mut OsdInfo> {
        self.osds.iter_mut().find(|o| o.id == id)
    }

    pub fn pool(&self, id: u64) -> Option<&PoolInfo> {
        self.pools.iter().find(|p| p.id == id)
    }

    /// A pool by id (digits) or name.
    pub fn find_pool(&self, key: &str) -> Option<&PoolInfo> {
        match key.parse::<u64>() {
            Ok(id) => self.pool(id),
            Err(_) => self.pools.iter().find(|p| p.name == key),
        }
    }

    /// The PG of an object of `pool` (`None` for an unknown pool).
    pub fn pg_of(&self, pool: u64, name: &[u8]) -> Option<PgId> {
        let p = self.pool(pool)?;
        let pg = (fnv1a64(name) % u64::from(p.pg_num)) as u32;
        Some(PgId { pool, pg })
    }

    /// The acting set of a PG: the members of its raw set that are up, the primary first.
    pub fn acting(&self, pg: PgId) -> Vec<u32> {
        let mut set = self.raw_set(pg);
        set.retain(|&id| self.osd(id).is_some_and(|o| o.up));
        set
    }

    /// The raw set of a PG: `size` distinct OSDs by straw2, up or down.
    pub fn raw_set(&self, pg: PgId) -> Vec<u32> {
        let Some(p) = self.pool(pg.pool) else {
            return Vec::new();
        };
        let mut draws: Vec<(f64, u32)> = self
            .osds
            .iter()
            .filter(|o| o.weight > 0.0)
            .map(|o| (straw2_draw(pg, o.id, o.weight), o.id))
            .collect();
        draws.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        draws.truncate(p.size as usize);
        draws.into_iter().map(|(_, id)| id).collect()
    }

    /// Every PG of every pool.
    pub fn all_pgs(&self) -> impl Iterator<Item = PgId> + '_ {
        self.pools
            .iter()
            .flat_map(|p| (0..p.pg_num).map(move |pg| PgId { pool: p.id, pg }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(n: u32, pg_num: u32) -> ClusterMap {
        let osds = (0..n)
            .map(|id| OsdInfo {
                id,
                addr: format!("127.0.0.1:{}", 7000 + 2 * id).parse().unwrap(),
                peer_addr: format!("127.0.0.1:{}", 7001 + 2 * id).parse().unwrap(),
                weight: 1.0,
                placement: Placement::Host,
                up: true,
            })
            .collect();
        ClusterMap {
            epoch: 1,
            osds,
            pools: vec![PoolInfo {
                id: 1,
                name: "data".into(),
                pg_num,
                size: 3,
                min_size: None,
            }],
        }
    }

    #[test]
    fn parses_the_documented_example() {
        let text = r#"
epoch = 1
[[osd]]
id = 0
addr = "127.0.0.1:6800"
peer_addr = "127.0.0.1:6801"
weight = 1.0
placement = "host"
[[osd]]
id = 1
addr = "127.0.0.1:6802"
peer_addr = "127.0.0.1:6803"
placement = "dpu"
[[pool]]
id = 1
name = "data"
pg_num = 32
size = 2
"#;
        let m = ClusterMap::parse(text).unwrap();
        assert_eq!(m.osds.len(), 2);
        assert_eq!(m.osds[1].placement, Placement::Dpu);
        assert_eq!(m.pools[0].min_size(), 2);
        assert_eq!(ClusterMap::parse(&m.to_toml()).unwrap(), m);
        assert!(ClusterMap::parse(&text.replace("size = 2", "size = 3")).is_err());
        assert!(ClusterMap::parse("epoch = 0").is_err());
        assert!(ClusterMap::parse("nonsense").is_err());
    }

    #[test]
    fn acting_sets_are_deterministic_and_distinct() {
        let m = map(5, 128);
        for pg in m.all_pgs() {
            let a = m.acting(pg);
            assert_eq!(a, m.acting(pg));
            assert_eq!(a.len(), 3);
            let set: BTreeSet<_> = a.iter().collect();
            assert_eq!(set.len(), 3, "{pg}: {a:?}");
        }
    }

    #[test]
    fn placement_spreads_evenly_and_follows_weights() {
        let mut m = map(5, 4096);
        let mut count = [0usize; 5];
        let mut primaries = [0usize; 5];
        for pg in m.all_pgs() {
            let a = m.acting(pg);
            primaries[a[0] as usize] += 1;
            for o in a {
                count[o as usize] += 1;
            }
        }
        let mean = 4096.0 * 3.0 / 5.0;
        for c in count {
            assert!((c as f64 - mean).abs() < mean * 0.1, "{count:?}");
        }
        for c in primaries {
            assert!((c as f64 - 4096.0 / 5.0).abs() < 4096.0 / 5.0 * 0.15);
        }
        // Doubling one OSD's weight gives it clearly more primaries.
        m.osds[0].weight = 2.0;
        let heavy = m.all_pgs().filter(|&pg| m.acting(pg)[0] == 0).count();
        assert!(heavy as f64 > 4096.0 / 5.0 * 1.4, "{heavy}");
        // Objects spread over PGs.
        let mut per_pg = vec![0usize; 64];
        let m = map(3, 64);
        for i in 0..64_000 {
            per_pg[m.pg_of(1, format!("obj-{i}").as_bytes()).unwrap().pg as usize] += 1;
        }
        assert!(
            per_pg.iter().all(|&c| (800..1200).contains(&c)),
            "{per_pg:?}"
        );
    }

    #[test]
    fn adding_an_osd_moves_only_pgs_it_enters() {
        let before = map(5, 4096);
        let after = map(6, 4096);
        let mut moved = 0;
        for pg in before.all_pgs() {
            let (a, b) = (before.acting(pg), after.acting(pg));
            let (sa, sb): (BTreeSet<_>, BTreeSet<_>) = (a.iter().collect(), b.iter().collect());
            if sa != sb {
                moved += 1;
                assert!(b.contains(&5), "{pg}: {a:?} -> {b:?}");
                assert_eq!(sa.difference(&sb).count(), 1);
            }
        }
        // Expected share: size / (n + 1) = 3/6 of the PGs gain the new OSD.
        let share = moved as f64 / 4096.0;
        assert!((share - 0.5).abs() < 0.05, "{share}");
    }

    #[test]
    fn a_down_osd_leaves_acting_sets_and_the_next_member_leads() {
        let mut m = map(5, 256);
        let before: Vec<_> = m.all_pgs().map(|pg| m.acting(pg)).collect();
        m.osds[2].up = false;
        let text = m.to_toml();
        assert_eq!(ClusterMap::parse(&text).unwrap(), m);
        for (pg, was) in m.all_pgs().zip(&before) {
            let now = m.acting(pg);
            let expect: Vec<u32> = was.iter().copied().filter(|&o| o != 2).collect();
            assert_eq!(now, expect, "{pg}");
            assert_eq!(m.raw_set(pg), *was);
        }
        // A map without `up` keys has every OSD up.
        let plain = text.replace("up = false", "").replace("up = true", "");
        assert!(ClusterMap::parse(&plain).unwrap().osds.iter().all(|o| o.up));
    }
}
