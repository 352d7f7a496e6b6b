//! The front end's request path allocates nothing in steady state: after a warm-up, GETs and
//! SETs over a real socket make no heap allocation on the front-end thread, with the store in
//! process (`cpu-only`) and with the requests forwarded over KV queue pairs to a host worker
//! (`lat`, the replies filled into their reserved places as the responses arrive).
//!
//! The counting allocator tells threads apart by their kernel thread id; the front-end thread
//! is found by its name in `/proc/self/task`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use dds_dpukv::Design;
use dds_testkit::alloc::{allocations_in, count_thread_id, thread_named, CountingAlloc};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

mod common;

use common::{deploy, resp};

/// Sends `window` `rounds` times, each time reading back its `reply_bytes` of replies.
fn run(s: &mut TcpStream, window: &[u8], reply_bytes: usize, rounds: usize) {
    let mut buf = vec![0u8; reply_bytes];
    for _ in 0..rounds {
        s.write_all(window).unwrap();
        s.read_exact(&mut buf).unwrap();
    }
}

/// A number of the front end's `INFO`.
fn info(s: &mut TcpStream, field: &str) -> u64 {
    s.write_all(&resp(&[b"INFO"])).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.ends_with(b"cluster_enabled:1\r\n\r\n") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "connection closed");
        got.extend_from_slice(&b[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO"));
    line.trim().parse().unwrap()
}

fn steady_state_allocates_nothing(design: Design, front_thread: &str) {
    // One measurement at a time (the watched thread is global).
    let _one = dds_testkit::alloc::measure_alone();
    let d = deploy(design, 16 << 10, 1024);
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A window of 16 commands: SETs and GETs of 8 keys (values of 100 bytes).
    let value = [b'v'; 100];
    let mut window = Vec::new();
    let mut reply_bytes = 0;
    for k in 0..8 {
        let key = format!("key:{k:04}");
        window.extend(resp(&[b"SET", key.as_bytes(), &value]));
        reply_bytes += b"+OK\r\n".len();
        window.extend(resp(&[b"GET", key.as_bytes()]));
        reply_bytes += b"$100\r\n".len() + 100 + 2;
    }
    let one = resp(&[b"GET", b"key:0003"]);
    let one_reply = b"$100\r\n".len() + 102;
    // Warm-up: buffers, slab entries, reply parts and waiter lists reach their steady sizes.
    run(&mut s, &window, reply_bytes, 2000);
    run(&mut s, &one, one_reply, 500);
    let batches = info(&mut s, "kvqp_batches");
    let tid = thread_named(front_thread);
    count_thread_id(tid);
    let allocs = allocations_in(|| {
        run(&mut s, &window, reply_bytes, 2000);
        // One request at a time too (the replies are never held behind a reserved one).
        run(&mut s, &one, one_reply, 500);
    });
    count_thread_id(0);
    let batches = info(&mut s, "kvqp_batches") - batches;
    assert_eq!(
        allocs, 0,
        "{design:?}: the front-end thread allocated {allocs} times for 32,500 requests \
         in {batches} KV batches"
    );
}

#[test]
fn requests_over_kv_queue_pairs_allocate_nothing() {
    steady_state_allocates_nothing(Design::Lat, "dpukv-comm-0");
}

#[test]
fn requests_on_an_in_process_store_allocate_nothing() {
    steady_state_allocates_nothing(Design::CpuOnly, "dpukv-host-fe-0");
}
