//! The cluster's health as `dds objects status` shows it (like `ceph -s`): OSDs up and in,
//! and the PGs by state, each PG as its primary reports it (`STATUS`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::client::Client;
use crate::map::PgId;

/// A snapshot of the cluster's state.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ClusterStatus {
    pub epoch: u32,
    pub osds: usize,
    pub osds_up: usize,
    /// OSDs with weight > 0 (holding PGs).
    pub osds_in: usize,
    /// OSDs up in the map whose `STATUS` did not answer.
    pub unreachable: Vec<u32>,
    pub pgs: usize,
    /// Active and every member in sync.
    pub active_clean: usize,
    /// Serving, with members out of sync (being recovered).
    pub degraded: usize,
    /// Not serving: peering, or without `min_size` members, or their primary did not answer.
    pub inactive: usize,
    /// Fewer members up than the pool's size.
    pub undersized: usize,
    /// With a recovery pass copying objects now.
    pub recovering: usize,
    /// Objects the running recovery passes have still to copy.
    pub objects_to_recover: u64,
    /// `HEALTH_OK` (every PG active+clean, every OSD up) or `HEALTH_WARN`.
    pub health: String,
}

impl ClusterStatus {
    /// Every PG active and clean.
    pub fn clean(&self) -> bool {
        self.pgs > 0 && self.active_clean == self.pgs
    }
}

/// Asks every up OSD of the client's map for its `STATUS` and counts each PG as its primary
/// (under that map) reports it.
pub fn cluster_status(client: &Client) -> ClusterStatus {
    let map = client.map();
    let mut st = ClusterStatus {
        epoch: map.epoch,
        osds: map.osds.len(),
        osds_up: map.osds.iter().filter(|o| o.up).count(),
        osds_in: map.osds.iter().filter(|o| o.weight > 0.0).count(),
        ..ClusterStatus::default()
    };
    let mut reported: BTreeMap<PgId, serde_json::Value> = BTreeMap::new();
    for o in map.osds.iter().filter(|o| o.up) {
        let Ok(s) = client.status(o.id) else {
            st.unreachable.push(o.id);
            continue;
        };
        for p in s["pgs"].as_array().into_iter().flatten() {
            if p["primary"] != true {
                continue;
            }
            let (Some(pool), Some(pg)) = (p["pool"].as_u64(), p["pg"].as_u64()) else {
                continue;
            };
            let id = PgId {
                pool,
                pg: pg as u32,
            };
            if map.acting(id).first() == Some(&o.id) {
                reported.insert(id, p.clone());
            }
        }
    }
    for id in map.all_pgs() {
        st.pgs += 1;
        let size = map.pool(id.pool).map_or(0, |p| p.size as usize);
        if map.acting(id).len() < size {
            st.undersized += 1;
        }
        let Some(p) = reported.get(&id) else {
            st.inactive += 1;
            continue;
        };
        let to_recover = p["to_recover"].as_u64().unwrap_or(0);
        st.objects_to_recover += to_recover;
        if to_recover > 0 {
            st.recovering += 1;
        }
        match (p["active"] == true, p["clean"] == true) {
            (true, true) => st.active_clean += 1,
            (true, false) => st.degraded += 1,
            _ => st.inactive += 1,
        }
    }
    let ok = st.clean() && st.osds_up == st.osds && st.unreachable.is_empty();
    st.health = if ok { "HEALTH_OK" } else { "HEALTH_WARN" }.into();
    st
}

/// The text `dds objects status` prints.
pub fn render(st: &ClusterStatus) -> String {
    let mut out = String::new();
    let mut warn = Vec::new();
    if st.osds_up < st.osds {
        warn.push(format!("{} osds down", st.osds - st.osds_up));
    }
    if !st.unreachable.is_empty() {
        warn.push(format!("osds {:?} up but not answering", st.unreachable));
    }
    if st.inactive > 0 {
        warn.push(format!("{} pgs inactive", st.inactive));
    }
    if st.degraded > 0 {
        warn.push(format!("{} pgs degraded", st.degraded));
    }
    if st.undersized > 0 {
        warn.push(format!("{} pgs undersized", st.undersized));
    }
    let _ = writeln!(out, "  health: {}", st.health);
    for w in &warn {
        let _ = writeln!(out, "          {w}");
    }
    let _ = writeln!(
        out,
        "  osd:    epoch {}: {} osds: {} up, {} in",
        st.epoch, st.osds, st.osds_up, st.osds_in
    );
    let mut states = Vec::new();
    for (n, what) in [
        (st.active_clean, "active+clean"),
        (
            st.degraded - st.recovering.min(st.degraded),
            "active+degraded",
        ),
        (st.recovering.min(st.degraded), "active+recovering+degraded"),
        (st.inactive, "inactive"),
    ] {
        if n > 0 {
            states.push(format!("{n} {what}"));
        }
    }
    let _ = writeln!(out, "  pgs:    {} pgs: {}", st.pgs, states.join(", "));
    if st.objects_to_recover > 0 {
        let _ = writeln!(
            out,
            "  recovery: {} objects to recover",
            st.objects_to_recover
        );
    }
    out
}
