//! Client input the front end must survive and answer: commands pipelined past the pending
//! limit, requests no KV queue slot can carry, INCR results longer than the largest SET, and
//! Redis's errors for arity and unknown commands. Each test runs a deployment in this process
//! (the DPU process's and the host process's code on threads, talking over their control
//! socket and KV queue pairs).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use dds_dpukv::Design;

mod common;

use common::{deploy, resp};

/// Sends `bytes` and reads until `want` replies (counted as top-level RESP2 replies) arrived;
/// fails after 10 s.
fn exchange(s: &mut TcpStream, bytes: &[u8], want: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.write_all(bytes).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        if count_replies(&got) >= want {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {want} replies after 10 s",
            count_replies(&got)
        );
        match s.read(&mut buf) {
            Ok(0) => panic!("the server closed the connection"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => panic!("{e}"),
        }
    }
}

fn count_replies(mut b: &[u8]) -> usize {
    let mut n = 0;
    while let Ok(Some(len)) = dds_resp::frame_reply(b, 1 << 20, 1 << 20) {
        b = &b[len..];
        n += 1;
    }
    n
}

#[test]
fn commands_pipelined_past_the_pending_limit_all_run() {
    // The front end stops parsing at 4096 pending replies; the rest of the bytes it read
    // must run once replies drain, without the client sending more. (Values of at most 8
    // bytes: a 64 KiB slot carries thousands of GETs, so thousands are pending at once.)
    let d = deploy(Design::Lat, 64 << 10, 8);
    let mut s = TcpStream::connect(d.addr).unwrap();
    assert_eq!(
        exchange(&mut s, &resp(&[b"SET", b"k", b"v"]), 1),
        b"+OK\r\n"
    );
    for n in [5000, 20_000, 50_000] {
        let many = resp(&[b"GET", b"k"]).repeat(n);
        let mut s = TcpStream::connect(d.addr).unwrap();
        let got = exchange(&mut s, &many, n);
        assert_eq!(got, b"$1\r\nv\r\n".repeat(n));
    }
}

#[test]
fn requests_no_queue_slot_can_carry_are_refused_at_once() {
    // 256-byte slots carry 255 batch bytes: a GET of a 250-byte key (252 record bytes plus
    // the batch header) never fits, nor a SET of a 255-byte key with a 200-byte value.
    let d = deploy(Design::Lat, 256, 200);
    let mut s = TcpStream::connect(d.addr).unwrap();
    let long = [b'k'; 250];
    let t = Instant::now();
    let got = exchange(&mut s, &resp(&[b"GET", &long]), 1);
    assert!(
        got.starts_with(b"-ERR key and value too large for a KV queue slot"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    let got = exchange(&mut s, &resp(&[b"SET", &[b'k'; 255], &[b'v'; 200]]), 1);
    assert!(got.starts_with(b"-ERR key and value too large"));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Requests that fit are served, on the same connection.
    let got = exchange(
        &mut s,
        &[
            resp(&[b"SET", &long[..200], b"v"]),
            resp(&[b"GET", &long[..200]]),
        ]
        .concat(),
        2,
    );
    assert_eq!(got, b"+OK\r\n$1\r\nv\r\n");
}

#[test]
fn incr_results_longer_than_the_largest_value_fit_the_response_slots() {
    // Values of at most 8 bytes, but INCRBY writes 20-byte numbers: GETs of them batched as
    // if they held 8 bytes would overflow a 256-byte response slot and close the queue pair.
    let d = deploy(Design::Lat, 256, 8);
    let mut s = TcpStream::connect(d.addr).unwrap();
    let keys: Vec<Vec<u8>> = (0..60).map(|i| format!("n{i}").into_bytes()).collect();
    let incrs: Vec<u8> = keys
        .iter()
        .flat_map(|k| resp(&[b"INCRBY", k, b"-9223372036854775807"]))
        .collect();
    exchange(&mut s, &incrs, keys.len());
    let gets: Vec<u8> = keys.iter().flat_map(|k| resp(&[b"GET", k])).collect();
    let got = exchange(&mut s, &gets, keys.len());
    assert_eq!(got, b"$20\r\n-9223372036854775807\r\n".repeat(keys.len()));
}

#[test]
fn arity_and_unknown_commands_get_redis_errors() {
    let d = deploy(Design::CpuOnly, 64 << 10, 1024);
    let mut s = TcpStream::connect(d.addr).unwrap();
    let got = exchange(&mut s, &resp(&[b"DBSIZE", b"x"]), 1);
    assert_eq!(
        got,
        b"-ERR wrong number of arguments for 'dbsize' command\r\n"
    );
    let got = exchange(&mut s, &resp(&[b"DBSIZE"]), 1);
    assert_eq!(got, b":0\r\n");
    let got = exchange(&mut s, &resp(&[b"FOO", b"a", b"b\r\nc"]), 1);
    assert_eq!(
        got,
        b"-ERR unknown command 'FOO', with args beginning with: 'a' 'b  c' \r\n"
    );
    // Arguments are quoted up to 128 bytes in all.
    let long = [b'x'; 300];
    let got = exchange(&mut s, &resp(&[b"FOO", &long, b"y"]), 1);
    let want = format!(
        "-ERR unknown command 'FOO', with args beginning with: '{}' \r\n",
        "x".repeat(128)
    );
    assert_eq!(String::from_utf8_lossy(&got), want);
}
