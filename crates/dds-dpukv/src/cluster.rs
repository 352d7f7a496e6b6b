//! Redis Cluster semantics (`docs/dpu-kv.md` §5): key slots, the slot map of a design, the
//! `CLUSTER` subcommands cluster-aware clients call, and `-MOVED` redirects.

use std::net::SocketAddr;

use dds_resp::session::lower;
use dds_resp::Reply;
use serde::{Deserialize, Serialize};

/// Slots of the key space.
pub const SLOTS: u16 = 16384;

const CRC16: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// The slot of a key: CRC16 (XMODEM) of the key, or of its `{hash tag}` when it has a
/// non-empty one, modulo 16384 (as Redis Cluster).
pub fn key_slot(key: &[u8]) -> u16 {
    let mut k = key;
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                k = &key[open + 1..open + 1 + len];
            }
        }
    }
    CRC16.checksum(k) & (SLOTS - 1)
}

/// One endpoint clients connect to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// 40 hex digits (a Redis node id).
    pub id: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `dpu` or `host`.
    pub role: String,
    /// Slot ranges it owns (inclusive); every endpoint that owns no range serves every slot
    /// as a replica of the first endpoint.
    pub slots: Vec<(u16, u16)>,
}

impl Endpoint {
    /// An endpoint whose id is derived from its role and address.
    pub fn new(addr: SocketAddr, role: &str, slots: Vec<(u16, u16)>) -> Endpoint {
        let s = format!("{role}@{addr}");
        let a = xxhash_rust::xxh3::xxh3_128(s.as_bytes());
        let id = format!("{a:032x}{:08x}", (a >> 7) as u32);
        Endpoint {
            id,
            addr,
            role: role.to_string(),
            slots,
        }
    }
}

/// The slot map as one endpoint sees it.
#[derive(Clone, Debug)]
pub struct ClusterMap {
    /// Every endpoint of the deployment.
    pub endpoints: Vec<Endpoint>,
    /// Which one is this.
    pub me: usize,
    /// Whether slots are owned by shards (`shrd`): keys of other shards are redirected.
    pub sharded: bool,
}

/// Where a keyed command goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Served here.
    Here,
    /// `-MOVED`.
    Moved(u16, SocketAddr),
    /// Keys of different slots in one command of a sharded deployment.
    CrossSlot,
}

impl ClusterMap {
    /// A map where every endpoint serves every slot.
    pub fn replicated(endpoints: Vec<Endpoint>, me: usize) -> ClusterMap {
        ClusterMap {
            endpoints,
            me,
            sharded: false,
        }
    }

    /// Where a command on `keys` goes.
    pub fn route<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Route {
        if !self.sharded {
            return Route::Here;
        }
        let mut slot = None;
        for k in keys {
            let s = key_slot(k);
            match slot {
                None => slot = Some(s),
                Some(prev) if prev != s => return Route::CrossSlot,
                _ => {}
            }
        }
        let Some(slot) = slot else {
            return Route::Here;
        };
        let owns = |e: &Endpoint| e.slots.iter().any(|&(a, b)| (a..=b).contains(&slot));
        if owns(&self.endpoints[self.me]) {
            return Route::Here;
        }
        match self.endpoints.iter().find(|e| owns(e)) {
            Some(e) => Route::Moved(slot, e.addr),
            None => Route::Here,
        }
    }

    /// Slot ranges and the endpoints serving each: (start, end, primary, replicas).
    fn ranges(&self) -> Vec<(u16, u16, &Endpoint, Vec<&Endpoint>)> {
        if !self.sharded {
            let (first, rest) = self.endpoints.split_first().expect("an endpoint");
            return vec![(0, SLOTS - 1, first, rest.iter().collect())];
        }
        let mut v: Vec<_> = self
            .endpoints
            .iter()
            .flat_map(|e| e.slots.iter().map(move |&(a, b)| (a, b, e, Vec::new())))
            .collect();
        v.sort_by_key(|r| r.0);
        v
    }

    /// Runs a `CLUSTER` subcommand.
    pub fn command(&self, r: &mut Reply<'_>, argv: &[&[u8]]) {
        let sub = argv.get(1).map(|a| lower(a)).unwrap_or_default();
        match sub.as_str() {
            "slots" => {
                let ranges = self.ranges();
                r.array(ranges.len());
                for (a, b, primary, replicas) in ranges {
                    r.array(3 + replicas.len());
                    r.int(i64::from(a));
                    r.int(i64::from(b));
                    for e in std::iter::once(primary).chain(replicas) {
                        r.array(3);
                        r.bulk(e.addr.ip().to_string().as_bytes());
                        r.int(i64::from(e.addr.port()));
                        r.bulk(e.id.as_bytes());
                    }
                }
            }
            "shards" => {
                let ranges = self.ranges();
                r.array(ranges.len());
                for (a, b, primary, replicas) in ranges {
                    r.map(2);
                    r.bulk(b"slots");
                    r.array(2);
                    r.int(i64::from(a));
                    r.int(i64::from(b));
                    r.bulk(b"nodes");
                    r.array(1 + replicas.len());
                    for (i, e) in std::iter::once(primary).chain(replicas).enumerate() {
                        r.map(6);
                        r.bulk(b"id");
                        r.bulk(e.id.as_bytes());
                        r.bulk(b"port");
                        r.int(i64::from(e.addr.port()));
                        r.bulk(b"ip");
                        r.bulk(e.addr.ip().to_string().as_bytes());
                        r.bulk(b"endpoint");
                        r.bulk(e.addr.ip().to_string().as_bytes());
                        r.bulk(b"role");
                        r.bulk(if i == 0 { b"master" } else { b"replica" });
                        r.bulk(b"health");
                        r.bulk(b"online");
                    }
                }
            }
            "nodes" => {
                let mut s = String::new();
                for (a, b, primary, replicas) in self.ranges() {
                    let me = |e: &Endpoint| {
                        if e.id == self.endpoints[self.me].id {
                            "myself,"
                        } else {
                            ""
                        }
                    };
                    s.push_str(&format!(
                        "{} {}@{} {}master - 0 0 1 connected {a}-{b}\n",
                        primary.id,
                        primary.addr,
                        primary.addr.port() as u32 + 10000,
                        me(primary)
                    ));
                    for e in replicas {
                        s.push_str(&format!(
                            "{} {}@{} {}slave {} 0 0 1 connected\n",
                            e.id,
                            e.addr,
                            e.addr.port() as u32 + 10000,
                            me(e),
                            primary.id
                        ));
                    }
                }
                r.bulk(s.as_bytes());
            }
            "info" => {
                let shards = self.ranges().len();
                let s = format!(
                    "cluster_enabled:1\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\n\
                     cluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
                     cluster_known_nodes:{}\r\ncluster_size:{shards}\r\ncluster_current_epoch:1\r\n\
                     cluster_my_epoch:1\r\n",
                    self.endpoints.len()
                );
                r.bulk(s.as_bytes());
            }
            "myid" => r.bulk(self.endpoints[self.me].id.as_bytes()),
            "keyslot" if argv.len() == 3 => r.int(i64::from(key_slot(argv[2]))),
            "keyslot" => r.error("ERR wrong number of arguments for 'cluster|keyslot' command"),
            _ => r.error(&format!(
                "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
                String::from_utf8_lossy(argv.get(1).copied().unwrap_or(b""))
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster() {
        // Values from Redis's cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 0x31C3 & (SLOTS - 1));
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(key_slot(b"{}foo"), CRC16.checksum(b"{}foo") & (SLOTS - 1));
    }

    #[test]
    fn sharded_maps_redirect_and_refuse_cross_slot() {
        let a = Endpoint::new("127.0.0.1:7000".parse().unwrap(), "dpu", vec![(0, 8191)]);
        let b = Endpoint::new(
            "127.0.0.1:7001".parse().unwrap(),
            "host",
            vec![(8192, 16383)],
        );
        let m = ClusterMap {
            endpoints: vec![a, b.clone()],
            me: 0,
            sharded: true,
        };
        assert_eq!(m.route([&b"bar"[..]].into_iter()), Route::Here);
        assert_eq!(
            m.route([&b"foo"[..]].into_iter()),
            Route::Moved(12182, b.addr)
        );
        assert_eq!(
            m.route([&b"foo"[..], &b"bar"[..]].into_iter()),
            Route::CrossSlot
        );
        let mut out = Vec::new();
        m.command(&mut Reply::new(&mut out), &[b"cluster", b"slots"]);
        assert!(out.starts_with(b"*2\r\n*3\r\n:0\r\n:8191\r\n"));
    }
}
