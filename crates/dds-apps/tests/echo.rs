//! The TCP echo server over real sockets: bytes come back in order on every connection, a
//! client that never reads is paused (and cannot stop the others), connections over the limit
//! are closed, and stopping the server closes its connections.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use dds_apps::echo::{run_client, EchoConfig, EchoServer, MAX_CONNECTIONS};

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn echoes(s: &mut TcpStream, bytes: &[u8]) {
    s.write_all(bytes).unwrap();
    let mut back = vec![0u8; bytes.len()];
    s.read_exact(&mut back).unwrap();
    assert!(back == bytes, "echoed bytes differ");
}

#[test]
fn bytes_come_back_in_order_on_every_connection() {
    let server = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut conns: Vec<TcpStream> = (0..3).map(|_| connect(server.local_addr())).collect();
    for (i, s) in conns.iter_mut().enumerate() {
        for size in [1usize, 7, 4096, 100_000, 300_000] {
            let bytes: Vec<u8> = (0..size).map(|j| (j * 31 + i) as u8).collect();
            echoes(s, &bytes);
        }
    }
    let rep = run_client(&EchoConfig {
        connect: server.local_addr(),
        message_size: 64,
        outstanding: 4,
        connections: 2,
        duration: Duration::from_millis(300),
    })
    .unwrap();
    assert!(rep.messages > 0 && rep.corrupt == 0, "{rep:?}");
    assert_eq!(server.connections.load(Ordering::Relaxed), 5);
}

#[test]
fn a_client_that_never_reads_is_paused_and_others_are_served() {
    let server = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut hog = TcpStream::connect(server.local_addr()).unwrap();
    // A write that takes nothing for half a second: the server stopped reading.
    hog.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let chunk = vec![0x42u8; 64 << 10];
    let mut sent = 0usize;
    let blocked = loop {
        match hog.write(&chunk) {
            Ok(n) if sent < 64 << 20 => sent += n,
            Ok(_) => break false,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                break true
            }
            Err(e) => panic!("hog write: {e}"),
        }
    };
    assert!(blocked, "the server kept reading ({sent} bytes)");
    let mut s = connect(server.local_addr());
    echoes(&mut s, b"still served");
    drop(hog);
    echoes(&mut s, b"and after the hog left");
}

#[test]
fn connections_over_the_limit_are_closed() {
    let server = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut conns: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| connect(server.local_addr()))
        .collect();
    // Each of them is served (and so accepted) before the next one comes.
    for s in conns.iter_mut() {
        echoes(s, b"x");
    }
    let mut extra = connect(server.local_addr());
    let mut b = [0u8; 16];
    let closed = match extra.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == ErrorKind::ConnectionReset,
        Ok(_) => false,
    };
    assert!(closed, "a connection over the limit is closed");
    drop(conns.pop());
    // Once one closed, a new one is served.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect(server.local_addr());
        let _ = s.write_all(b"y");
        if s.read(&mut b).is_ok_and(|n| n == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "no connection accepted again");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stopping_the_server_closes_its_connections() {
    let server = EchoServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut s = connect(server.local_addr());
    echoes(&mut s, b"hello");
    let t = Instant::now();
    drop(server);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "stop took {:?}",
        t.elapsed()
    );
    let mut b = [0u8; 8];
    assert!(
        matches!(s.read(&mut b), Ok(0) | Err(_)),
        "the connection is closed"
    );
}
