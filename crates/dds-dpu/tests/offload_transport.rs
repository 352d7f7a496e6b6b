//! Transport behaviour of the director against a raw host socket: resets propagate both
//! ways (split and spliced connections), and a host that stops reading stops the director
//! from reading the client (bounded buffering).

#[path = "offload/common.rs"]
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dds_apps::offload::pagestore::MessageBuilder;
use dds_apps::offload::PagestoreApp;
use dds_offload_api::OffloadApp;

fn reset_seen(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 65536];
    loop {
        match s.read(&mut b) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) => return e.kind() == ErrorKind::ConnectionReset,
        }
    }
}

fn rst_close(s: TcpStream) {
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
    drop(s);
}

#[test]
fn resets_propagate_both_ways() {
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
    let dpu = Dpu::start(app.clone(), 2);
    let host = TcpListener::bind(loopback()).unwrap();
    let haddr = host.local_addr().unwrap();
    for splice in [false, true] {
        let d = director(&dpu, app.clone(), haddr, |c| {
            if splice {
                c.signature = "10.0.0.0/8:* *:* tcp".parse().unwrap();
            }
        });
        let mut b = MessageBuilder::new();
        b.write(1, 0, &[7u8; 64], 1);
        let msg = b.finish().to_vec();
        // Client resets: the host side sees a reset.
        let mut c = connect(d.local_addr());
        c.write_all(&msg).unwrap();
        let (mut h, _) = host.accept().unwrap();
        let mut got = vec![0u8; msg.len()];
        h.read_exact(&mut got).unwrap();
        assert_eq!(got, msg, "forwarded as is");
        rst_close(c);
        assert!(
            reset_seen(&mut h),
            "host sees the client's reset (splice {splice})"
        );
        // Host resets: the client sees a reset.
        let mut c = connect(d.local_addr());
        c.write_all(&msg).unwrap();
        let (mut h, _) = host.accept().unwrap();
        h.read_exact(&mut got).unwrap();
        rst_close(h);
        assert!(
            reset_seen(&mut c),
            "client sees the host's reset (splice {splice})"
        );
        d.shutdown();
    }
}

#[test]
fn a_host_that_stops_reading_stops_the_client() {
    let app: Arc<dyn OffloadApp> = Arc::new(PagestoreApp::default());
    let dpu = Dpu::start(app.clone(), 1);
    let host = TcpListener::bind(loopback()).unwrap();
    let d = director(&dpu, app, host.local_addr().unwrap(), |_| {});
    let c = connect(d.local_addr());
    let sent = Arc::new(AtomicU64::new(0));
    let writer = {
        let (mut c, sent) = (c.try_clone().unwrap(), sent.clone());
        std::thread::spawn(move || {
            let data = vec![1u8; 1 << 20];
            let mut b = MessageBuilder::new();
            for i in 0..256u64 {
                b.clear();
                b.write(1, i << 20, &data, i);
                if c.write_all(b.finish()).is_err() {
                    return;
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let (h, _) = host.accept().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let s = d.stats();
    // 256 MiB offered; the director holds at most a few messages plus socket buffers.
    assert!(s.client_bytes_in < 48 << 20, "director kept reading: {s:?}");
    assert!(
        sent.load(Ordering::SeqCst) < 64,
        "client was not slowed down"
    );
    // The host goes away: the client connection is reset, the writer stops.
    rst_close(h);
    writer.join().unwrap();
    drop(c);
}
