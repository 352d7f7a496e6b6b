//! The test harness itself: host file I/O through the emulated DPU.
#[path = "offload/common.rs"]
mod common;
use common::*;
use std::sync::Arc;

#[test]
fn host_files_read_back_writes() {
    let app: Arc<dyn dds_offload_api::OffloadApp> =
        Arc::new(dds_apps::offload::PagestoreApp::default());
    let dpu = Dpu::start(app, 1);
    let f = dpu.files();
    let id = f.create("/x");
    let a = pattern(1, 8192);
    let b = pattern(2, 4096);
    assert_eq!(f.write(id, 0, a.clone()), Ok(8192));
    assert_eq!(f.read(id, 0, 8192).unwrap(), a);
    assert_eq!(f.write(id, 4096, b.clone()), Ok(4096));
    assert_eq!(f.read(id, 4096, 4096).unwrap(), b);
    assert_eq!(&f.read(id, 0, 8192).unwrap()[..4096], &a[..4096]);
}
