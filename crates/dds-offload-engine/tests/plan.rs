//! The plan step of a message, without sockets: the pagestore app's predicate and offload
//! function over a real cache table.

use dds_apps::offload::pagestore::MessageBuilder;
use dds_apps::offload::{PagestoreApp, PagestoreConfig};
use dds_cache::{CacheItem, CacheWriter, Config};
use dds_offload_api::{KeyMap, OffloadApp};
use dds_offload_engine::{ExposedFiles, Planner, Sources};

const PAGE: u64 = 4096;

fn cached(w: &mut CacheWriter, file: u32, page: u64) {
    w.insert(CacheItem {
        key: PagestoreApp::page_key(file, page),
        version: 1,
        file_id: file,
        offset: page * PAGE,
        size: PAGE as u32,
        ..CacheItem::default()
    })
    .unwrap();
}

#[test]
fn reads_of_cached_pages_go_to_the_dpu_and_writes_mask_their_pages() {
    let app = PagestoreApp::new(PagestoreConfig {
        page_size: PAGE as u32,
        ..PagestoreConfig::default()
    });
    let mut w = CacheWriter::new(Config::for_items(64)).unwrap();
    cached(&mut w, 7, 0);
    cached(&mut w, 7, 1);
    let cache = w.reader();
    let exposed = ExposedFiles::new();
    exposed.expose(7);
    let src = Sources {
        app: &app,
        cache: &cache,
        exposed: &exposed,
        session: None,
    };
    let none = KeyMap::with_capacity(1);
    let mut p = Planner::new(&app);
    let mut b = MessageBuilder::new();
    b.read(7, 0, 4096, 1) // cached: DPU
        .write(7, PAGE, &[1u8; 4096], 2) // host; masks page 1 for later requests
        .read(7, PAGE, 4096, 3) // cached, but after the write: host
        .read(7, 2 * PAGE, 4096, 4); // not cached: host
    let msg = b.finish().to_vec();
    let s = p.plan(&src, &none, &msg, 8, 64 << 10).unwrap();
    assert_eq!((s.requests, s.offloaded, s.fallback), (4, 1, 0));
    let reads: Vec<_> = p.steps().iter().map(|s| s.read.is_some()).collect();
    assert_eq!(reads, [true, false, false, false]);
    assert_eq!(p.steps()[0].read.unwrap().offset, 0);
    let host_pos: Vec<u32> = p.host().iter().map(|d| d.pos).collect();
    assert_eq!(host_pos, [1, 2, 3], "host requests in message order");
    assert!(
        p.masked().contains(&(PagestoreApp::page_key(7, 1), 1)),
        "the write's page is invalidated before forwarding: {:?}",
        p.masked()
    );

    // Keys pending from earlier host requests of the connection miss: page 0 goes to the host.
    let mut pending = KeyMap::with_capacity(4);
    pending.update(PagestoreApp::page_key(7, 0), |_| 1).unwrap();
    let s = p.plan(&src, &pending, &msg, 8, 64 << 10).unwrap();
    assert_eq!(s.offloaded, 0);

    // No context left, or a read larger than a buffer: the host serves it (fallback).
    let s = p.plan(&src, &none, &msg, 0, 64 << 10).unwrap();
    assert_eq!((s.offloaded, s.fallback), (0, 1));
    let s = p.plan(&src, &none, &msg, 8, 1024).unwrap();
    assert_eq!((s.offloaded, s.fallback), (0, 1));
    assert_eq!(p.host().len(), 4);

    // A file the application has not exposed is never read on the DPU.
    exposed.withdraw(7);
    let s = p.plan(&src, &none, &msg, 8, 64 << 10).unwrap();
    assert_eq!((s.offloaded, s.unexposed), (0, 1));
}

#[test]
fn a_message_the_app_cannot_parse_is_an_error() {
    let app = PagestoreApp::default();
    let cache = CacheWriter::new(Config::for_items(64)).unwrap().reader();
    let exposed = ExposedFiles::new();
    let src = Sources {
        app: &app,
        cache: &cache,
        exposed: &exposed,
        session: None,
    };
    let none = KeyMap::with_capacity(1);
    let mut p = Planner::new(&app);
    let mut b = MessageBuilder::new();
    b.read(1, 0, 4096, 1);
    let mut msg = b.finish().to_vec();
    // A request count larger than the message holds.
    msg[4] = 0xff;
    assert!(p.plan(&src, &none, &msg, 8, 64 << 10).is_err());
    assert!(app.max_requests() > 0);
}
