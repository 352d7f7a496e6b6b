//! DPU-KV's front end (`dds dpukv`, design `lat`) against hostile clients: bursts of random
//! command streams over many connections (every command with wrong, missing and extra
//! arguments; empty, huge and binary keys and values; malformed RESP and inline lines; random
//! bytes; pipelines past the pending limit). After each burst both processes are alive and a
//! well-formed client on a fresh connection writes keys and reads them back. Values are
//! limited to 200 bytes, so some SETs are refused. The seed is printed;
//! `DDS_TEST_SEED=<seed>` replays a run.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{assert_alive, hostile_clients, random_blob, start_dpukv, test_seed};
use dds_testkit::resp::command_of as resp;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MAX_VALUE: usize = 200;

const COMMANDS: &[&str] = &[
    "get", "set", "del", "unlink", "exists", "mget", "mset", "incr", "decr", "incrby", "decrby",
    "ping", "echo", "quit", "hello", "client", "select", "config", "command", "cluster", "info",
    "dbsize",
];

const WORDS: &[&str] = &[
    "setname",
    "getname",
    "id",
    "setinfo",
    "slots",
    "shards",
    "nodes",
    "info",
    "myid",
    "keyslot",
    "count",
    "docs",
    "get",
    "help",
    "auth",
    "default",
    "2",
    "3",
    "0",
    "1",
    "-1",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "+1",
    "01",
    "-0",
    "1.5",
    "",
    " ",
    "{tag}key",
];

/// Byte strings a RESP parser must refuse or wait for.
const MALFORMED: &[&[u8]] = &[
    b"*-5\r\n",
    b"*abc\r\n",
    b"*1\r\n$-2\r\n",
    b"*1\r\n$99999999999999999999\r\n",
    b"*1\r\n$1048576\r\n",
    b"*2\r\n$1\r\nab\r\n",
    b"*1\r\n:1\r\n",
    b"*1\r\n*1\r\n",
    b"*1\r\n+x\r\n",
    b"*1048577\r\n",
    b"*3\r\n$3\r\nSET\r\n",
    b"*1\r\n$3\r\nGET",
    b"*\r\n",
    b"$5\r\nhello\r\n",
    b"\"unbalanced\r\n",
    b"set 'a'b c\r\n",
    b"get \"\\x4\"\r\n",
    b"\r\n\r\n\n",
    b"*0\r\n*-1\r\nPING\r\n",
    b"*01\r\n$4\r\nPING\r\n",
    b"*1\r\n$04\r\nPING\r\n",
];

fn random_arg(rng: &mut SmallRng) -> Vec<u8> {
    match rng.gen_range(0..10) {
        0..=3 => random_blob(rng, &[255, 256, MAX_VALUE, MAX_VALUE + 1], 300),
        4..=6 => WORDS[rng.gen_range(0..WORDS.len())].as_bytes().to_vec(),
        7 => format!("k{}", rng.gen_range(0..20)).into_bytes(),
        // Past the largest bulk string the front end takes (a protocol error).
        8 if rng.gen_bool(0.2) => vec![b'v'; rng.gen_range(1300..70_000)],
        _ => rng.gen::<i64>().to_string().into_bytes(),
    }
}

/// One random command: a known or unknown name with random arguments, as RESP (mostly) or
/// an inline line; or malformed RESP; or random bytes.
fn random_command(rng: &mut SmallRng) -> Vec<u8> {
    match rng.gen_range(0..20) {
        0 => MALFORMED[rng.gen_range(0..MALFORMED.len())].to_vec(),
        1 => random_blob(rng, &[2, 4], 512),
        _ => {
            let mut name = if rng.gen_range(0..10) == 0 {
                random_blob(rng, &[], 12)
            } else {
                COMMANDS[rng.gen_range(0..COMMANDS.len())]
                    .as_bytes()
                    .to_vec()
            };
            if rng.gen_bool(0.3) {
                name.make_ascii_uppercase();
            }
            let n = match rng.gen_range(0..10) {
                0 => rng.gen_range(0..300),
                _ => rng.gen_range(0..6),
            };
            let args: Vec<Vec<u8>> = std::iter::once(name)
                .chain((0..n).map(|_| random_arg(rng)))
                .collect();
            if rng.gen_range(0..8) == 0 {
                let mut line = args.join(&b' ');
                line.extend_from_slice(b"\r\n");
                line
            } else {
                resp(&args)
            }
        }
    }
}

/// The length of the simple, error, integer or bulk reply at the start of `b`, once whole
/// (the checks' replies are of these kinds).
fn reply_len(b: &[u8]) -> Option<usize> {
    let eol = b.windows(2).position(|w| w == b"\r\n")?;
    if b[0] != b'$' {
        return Some(eol + 2);
    }
    let n: i64 = std::str::from_utf8(&b[1..eol]).ok()?.parse().ok()?;
    let len = if n < 0 {
        eol + 2
    } else {
        eol + 2 + n as usize + 2
    };
    (b.len() >= len).then_some(len)
}

/// Reads one reply (the connection's read timeout bounds each read).
fn reply(s: &mut TcpStream, got: &mut Vec<u8>) -> Vec<u8> {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(n) = reply_len(got) {
            return got.drain(..n).collect();
        }
        let n = s.read(&mut buf).expect("a reply within 10 s");
        assert!(n > 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A fresh client writes binary keys and values and reads them back.
fn check_serving(addr: SocketAddr, rng: &mut SmallRng, round: usize) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = Vec::new();
    let mut call = |s: &mut TcpStream, args: Vec<Vec<u8>>| {
        s.write_all(&resp(&args)).unwrap();
        reply(s, &mut got)
    };
    assert_eq!(call(&mut s, vec![b"PING".to_vec()]), b"+PONG\r\n");
    for _ in 0..5 {
        let mut key = format!("check{round}:").into_bytes();
        key.extend((0..rng.gen_range(0..30)).map(|_| rng.gen::<u8>()));
        let value: Vec<u8> = (0..rng.gen_range(0..150)).map(|_| rng.gen()).collect();
        assert_eq!(
            call(&mut s, vec![b"SET".to_vec(), key.clone(), value.clone()]),
            b"+OK\r\n",
            "SET {key:?}"
        );
        let mut want = format!("${}\r\n", value.len()).into_bytes();
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
        assert_eq!(call(&mut s, vec![b"GET".to_vec(), key.clone()]), want);
        assert_eq!(call(&mut s, vec![b"DEL".to_vec(), key.clone()]), b":1\r\n");
        assert_eq!(call(&mut s, vec![b"GET".to_vec(), key]), b"$-1\r\n");
    }
    let counter = format!("count{round}").into_bytes();
    assert_eq!(
        call(
            &mut s,
            vec![b"INCRBY".to_vec(), counter.clone(), b"41".to_vec()]
        ),
        b":41\r\n"
    );
    assert_eq!(call(&mut s, vec![b"INCR".to_vec(), counter]), b":42\r\n");
}

#[test]
fn random_commands_never_stop_the_dpukv_front_end() {
    let seed = test_seed("random_commands_never_stop_the_dpukv_front_end");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let max_value = MAX_VALUE.to_string();
    let mut d = start_dpukv(
        dir.path(),
        "lat",
        &["--dma-cost", "off"],
        &["--slot-bytes", "4K", "--max-value", &max_value],
    );
    let addr = d.endpoints[0];
    let t0 = Instant::now();
    check_serving(addr, &mut rng, 0);
    let (mut commands, mut received) = (0usize, 0u64);
    for burst in 0..12 {
        let mut streams: Vec<Vec<u8>> = (0..40)
            .map(|_| {
                let n = rng.gen_range(1..12);
                commands += n;
                let mut b: Vec<u8> = (0..n).flat_map(|_| random_command(&mut rng)).collect();
                if rng.gen_range(0..10) == 0 {
                    // The connection ends inside a command.
                    b.truncate(rng.gen_range(0..=b.len()));
                }
                b
            })
            .collect();
        // A pipeline past the front end's 4096 pending replies, in one write.
        let get = resp(&[b"GET".to_vec(), b"k1".to_vec()]);
        streams.push(get.repeat(5000));
        commands += 5000;
        received += hostile_clients(addr, streams, 8, Duration::from_millis(250));
        assert_alive(d.dpu.as_mut().unwrap(), "dds dpukv dpu");
        assert_alive(&mut d.host, "dds dpukv host");
        check_serving(addr, &mut rng, burst + 1);
        eprintln!(
            "burst {burst}: {commands} commands so far, {:?}",
            t0.elapsed()
        );
    }
    eprintln!(
        "{commands} commands, {received} bytes of replies, {:?}",
        t0.elapsed()
    );
    assert!(received > 0, "the server answered nothing");
}
