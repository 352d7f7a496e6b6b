//! The director's data path allocates nothing per request: a counting allocator records the
//! allocations made on director threads while warmed-up connections carry mixed traffic.

#[path = "offload/common.rs"]
mod common;

use std::io::Write;
use std::sync::Arc;

use common::*;
use dds_apps::offload::pagestore::MessageBuilder;
use dds_apps::offload::PagestoreApp;
use dds_offload_api::OffloadApp;
use dds_testkit::alloc::{allocations, allocations_in, count_this_thread, CountingAlloc};

#[global_allocator]
static A: CountingAlloc = CountingAlloc;

fn traffic(c: &mut std::net::TcpStream, file: u32, rounds: u64) {
    let mut b = MessageBuilder::new();
    for r in 0..rounds {
        b.clear();
        b.read(file, (r % 8) * 4096, 4096, r)
            .write(file, 40960 + (r % 4) * 4096, &[r as u8; 4096], r)
            .read(file, (r % 7) * 4096 + 100, 1000, r)
            .read(file, 40960 + (r % 4) * 4096, 4096, r);
        c.write_all(b.finish()).unwrap();
        for _ in 0..4 {
            read_response(c).unwrap();
        }
    }
}

#[test]
fn director_data_path_does_not_allocate() {
    for copy_mode in [false, true] {
        let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
        let dpu = Dpu::start(app.clone(), 1);
        let files = dpu.files();
        let file = files.create("/pages");
        files.write(file, 0, pattern(1, 16 * 4096)).unwrap();
        let host = pagestore_server(loopback(), files);
        let d = director(&dpu, app, host.addr, |c| {
            c.copy_mode = copy_mode;
            c.on_thread_start = Some(Arc::new(|_| count_this_thread(true)));
        });
        let mut c = connect(d.local_addr());
        traffic(&mut c, file, 50);
        assert!(allocations() > 0, "the counter sees the connection set-up");
        let s0 = d.stats();
        let allocs = allocations_in(|| traffic(&mut c, file, 500));
        let s1 = d.stats();
        assert!(s1.offloaded - s0.offloaded > 500, "{s1:?}");
        assert_eq!(
            allocs, 0,
            "director allocations for 2000 requests (copy mode {copy_mode})"
        );
    }
}
