//! The C plugin ABI: a pagestore plugin written in C, compiled here with `cc -shared -fPIC`,
//! loaded, and driven end to end through the director over real sockets.

#[path = "offload/common.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use dds_apps::offload::pagestore::{MessageBuilder, OP_READ};
use dds_offload_api::plugin::{PluginApp, PluginError};
use dds_offload_api::OffloadApp;

fn build(dir: &Path, name: &str, defines: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = dir.join(name);
    let st = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("../../include"))
        .args(defines)
        .arg(root.join("../dds-apps/c/pagestore_plugin.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc runs");
    assert!(st.success(), "plugin compiles");
    out
}

#[test]
fn c_pagestore_plugin_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let so = build(dir.path(), "libpagestore.so", &[]);
    let app = PluginApp::load(&so).expect("plugin loads");
    assert_eq!(app.name(), "pagestore-c");
    let dpu = Dpu::start(app.clone(), 1);
    let files = dpu.files();
    let file = files.create("/pages");
    let host = pagestore_server(loopback(), files);
    let d = director(&dpu, app.clone(), host.addr, |_| {});
    let mut s = connect(d.local_addr());
    let mut model = vec![0u8; 0];
    // Writes through the host, then mixed traffic.
    let mut b = MessageBuilder::new();
    for i in 0..16u64 {
        let data = pattern(i, 4096);
        model.extend_from_slice(&data);
        b.write(file, i * 4096, &data, i);
    }
    s.write_all(b.finish()).unwrap();
    for i in 0..16 {
        let (h, _) = read_response(&mut s).unwrap();
        assert_eq!((h.req_id, h.status), (i, 0));
    }
    for round in 0..20u64 {
        b.clear();
        let p = (round % 15) as usize;
        let new = pattern(100 + round, 4096);
        b.read(file, (p * 4096) as u64, 4096, 1);
        b.write(file, ((p + 1) * 4096) as u64, &new, 2);
        b.read(file, ((p + 1) * 4096) as u64, 4096, 3);
        b.read(file, 100, 5000, 4);
        s.write_all(b.finish()).unwrap();
        let want1 = model[p * 4096..(p + 1) * 4096].to_vec();
        model[(p + 1) * 4096..(p + 2) * 4096].copy_from_slice(&new);
        let want3 = new.clone();
        let want4 = model[100..5100].to_vec();
        for (id, want) in [
            (1u64, Some(want1)),
            (2, None),
            (3, Some(want3)),
            (4, Some(want4)),
        ] {
            let (h, body) = read_response(&mut s).unwrap();
            assert_eq!((h.req_id, h.status), (id, 0));
            if let Some(w) = want {
                assert_eq!(h.op, OP_READ);
                assert!(body[..w.len()] == w[..], "round {round} req {id}");
            }
        }
    }
    // Pipelined across messages: a READ right behind a WRITE of the same page (next message)
    // must see the write, a READ before it must not.
    for round in 0..30u64 {
        let p = (round % 16) as usize;
        let new = pattern(500 + round, 4096);
        b.clear();
        b.read(file, (p * 4096) as u64, 4096, 10);
        s.write_all(b.finish()).unwrap();
        b.clear();
        b.write(file, (p * 4096) as u64, &new, 11);
        s.write_all(b.finish()).unwrap();
        b.clear();
        b.read(file, (p * 4096) as u64, 4096, 12);
        s.write_all(b.finish()).unwrap();
        let old = model[p * 4096..(p + 1) * 4096].to_vec();
        model[p * 4096..(p + 1) * 4096].copy_from_slice(&new);
        for (id, want) in [(10u64, Some(old)), (11, None), (12, Some(new))] {
            let (h, body) = read_response(&mut s).unwrap();
            assert_eq!((h.req_id, h.status), (id, 0));
            if let Some(w) = want {
                assert!(body[..4096] == w[..], "pipelined round {round} req {id}");
            }
        }
    }
    // A read the file service refuses is answered on the DPU with its status code.
    b.clear();
    b.read(999, 0, 64, 77).read(file, 1 << 30, 64, 78);
    s.write_all(b.finish()).unwrap();
    let (h, _) = read_response(&mut s).unwrap();
    assert_eq!(
        (h.req_id, h.status, h.len),
        (77, dds_proto::Status::UnknownFile.code(), 0)
    );
    let (h, _) = read_response(&mut s).unwrap();
    assert_eq!(
        (h.req_id, h.status),
        (78, dds_proto::Status::OutOfRange.code())
    );
    let st = d.stats();
    // Reads overlapping the WRITE of their message stay with the host.
    assert!(st.offloaded >= 35 && st.forwarded >= 36, "{st:?}");
}

#[test]
fn faulty_plugin_closes_only_the_connection_and_bad_abi_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad_abi = build(dir.path(), "libbadabi.so", &["-DDDS_TEST_ABI=99"]);
    match PluginApp::load_app(&bad_abi) {
        Err(PluginError::Invalid(msg)) => assert!(msg.contains("ABI version 99"), "{msg}"),
        other => panic!("bad ABI accepted: {other:?}"),
    }
    assert!(matches!(
        PluginApp::load(dir.path().join("missing.so")),
        Err(PluginError::Load(_))
    ));
    let so = build(dir.path(), "libfaulty.so", &["-DDDS_TEST_FAULTS"]);
    let app: Arc<dyn OffloadApp> = PluginApp::load(&so).unwrap();
    let dpu = Dpu::start(app.clone(), 1);
    let files = dpu.files();
    let file = files.create("/pages");
    files.write(file, 0, pattern(1, 8192)).unwrap();
    let host = pagestore_server(loopback(), files);
    let d = director(&dpu, app, host.addr, |_| {});
    let mut good = connect(d.local_addr());
    let mut evil = connect(d.local_addr());
    let mut b = MessageBuilder::new();
    b.read(file, 0, 16, 0xBADBAD);
    evil.write_all(b.finish()).unwrap();
    assert!(
        closed(&mut evil),
        "out-of-range descriptor closes the connection"
    );
    b.clear();
    b.read(file, 0, 8192, 5);
    good.write_all(b.finish()).unwrap();
    let (h, body) = read_response(&mut good).unwrap();
    assert_eq!((h.req_id, h.status, h.len), (5, 0, 8192));
    assert_eq!(body, pattern(1, 8192));
    assert_eq!(d.stats().malformed, 1);
}

#[test]
fn header_layout_matches_the_documented_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("layout.c");
    std::fs::write(
        &src,
        r#"
#include <stddef.h>
#include "dds_offload.h"
#define AT(t, f, o) _Static_assert(offsetof(t, f) == o, #t "." #f)
_Static_assert(sizeof(dds_req_desc) == 12, "req_desc");
_Static_assert(sizeof(dds_read_op) == 16, "read_op");
_Static_assert(sizeof(dds_cache_item) == 40, "cache_item");
_Static_assert(sizeof(dds_req_list) == 16, "list");
_Static_assert(sizeof(dds_cache_view) == 24, "view");
_Static_assert(sizeof(dds_offload_plugin_v1_t) == 120, "plugin");
AT(dds_read_op, offset, 8);
AT(dds_cache_item, offset, 16); AT(dds_cache_item, tag, 24); AT(dds_cache_item, file_id, 32);
AT(dds_offload_plugin_v1_t, name, 8); AT(dds_offload_plugin_v1_t, max_message_len, 16);
AT(dds_offload_plugin_v1_t, max_read_keys, 36); AT(dds_offload_plugin_v1_t, user, 40);
AT(dds_offload_plugin_v1_t, message_len, 48); AT(dds_offload_plugin_v1_t, build_host_message, 88);
AT(dds_offload_plugin_v1_t, invalidate_on_read, 112);
"#,
    )
    .unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let st = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-c", "-I"])
        .arg(root.join("../../include"))
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join("layout.o"))
        .status()
        .unwrap();
    assert!(st.success(), "documented offsets hold");
}
