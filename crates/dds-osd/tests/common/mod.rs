//! Helpers of the OSD tests in this crate.

use std::time::{Duration, Instant};

use dds_osd::client::Client;

/// Waits until the OSDs `osds` have every PG active and clean.
pub fn wait_clean_on(c: &Client, osds: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = osds.iter().all(|&o| {
            c.status(o).is_ok_and(|s| {
                s["pgs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|p| p["active"] == true && p["clean"] == true)
            })
        });
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "cluster never became clean");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the OSDs `osds` have every PG active and clean with its members at one head;
/// returns the sum of the primaries' heads (the versions applied).
#[allow(dead_code)] // not every test binary uses it
pub fn wait_heads_agree(c: &Client, osds: &[u32]) -> u64 {
    use std::collections::BTreeMap;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Per PG: each OSD's head, the primary's first.
        let mut heads: BTreeMap<(u64, u64), Vec<(u32, u64)>> = BTreeMap::new();
        let mut ok = true;
        let mut applied = 0;
        for &o in osds {
            let Ok(s) = c.status(o) else {
                ok = false;
                continue;
            };
            for p in s["pgs"].as_array().unwrap() {
                ok &= p["active"] == true && p["clean"] == true;
                let key = (p["pool"].as_u64().unwrap(), p["pg"].as_u64().unwrap());
                let head = p["head"].as_u64().unwrap();
                let members = heads.entry(key).or_default();
                if p["primary"] == true {
                    applied += head;
                    members.insert(0, (o, head));
                } else {
                    members.push((o, head));
                }
            }
        }
        ok &= heads.values().all(|h| h.iter().all(|x| x.1 == h[0].1));
        if ok {
            return applied;
        }
        assert!(
            Instant::now() < deadline,
            "the members never agreed (per PG: (osd, head), the primary first): {heads:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
