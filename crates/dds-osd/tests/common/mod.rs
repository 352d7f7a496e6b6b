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
