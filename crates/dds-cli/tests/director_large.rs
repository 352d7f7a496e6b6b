//! Messages and responses larger than the traffic director's connection buffers (64 KiB),
//! end to end with real processes: `dds dpu` with the director in front of `dds kv`
//! (values of 64 KiB ± 1, 1 MiB and 16 MiB; MGETs and pipelines whose replies exceed the
//! buffer; records larger than the DPU's read buffer), of `dds app pagestore` and of
//! `dds pageserver`. A message over the configured limit gets an error reply and a close; no
//! client input stops the director from serving the others. Every read has a timeout, so a
//! connection left waiting fails the test instead of hanging it.

mod common;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{offloaded, Guard, DDS};
use dds_testkit::resp::command as cmd;
use rand::{Rng, RngCore, SeedableRng};

const TIMEOUT: Duration = Duration::from_secs(60);

/// `dds dpu --offload APP` on a new device of `size`, with `extra` flags, its director on a
/// port of its choosing (the host application started next announces itself to it): the
/// DPU, its control socket and the director's address.
fn dpu(
    dir: &Path,
    size: &str,
    app: &str,
    extra: &[&str],
) -> (Guard, std::path::PathBuf, SocketAddr) {
    common::start_offload_dpu_with(dir, size, app, extra)
}

/// Starts `dds ARGS` (the `dds` binary with `args`, then `socket`, then `extra`) and waits
/// for its ready line on stdout: the process and that line.
fn spawn_ready(args: &[&str], socket: &Path, extra: &[&str]) -> (Guard, String) {
    let mut child = Command::new(DDS)
        .args(args)
        .arg(socket)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Guard(child), line)
}

/// `dds kv` on the DPU's socket (it tells the director where it listens).
fn start_kv(socket: &Path, extra: &[&str]) -> Guard {
    let (g, line) = spawn_ready(
        &["kv", "--listen", "127.0.0.1:0", "--socket"],
        socket,
        extra,
    );
    assert!(line.contains("listening on"), "no ready line: {line:?}");
    g
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.set_write_timeout(Some(TIMEOUT)).unwrap();
    s
}

fn bulk(v: &[u8]) -> Vec<u8> {
    let mut b = format!("${}\r\n", v.len()).into_bytes();
    b.extend_from_slice(v);
    b.extend_from_slice(b"\r\n");
    b
}

/// The length of the RESP reply at the start of `b`, if complete.
fn frame(b: &[u8], at: usize) -> Option<usize> {
    let nl = at + b.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let n = || -> i64 {
        std::str::from_utf8(&b[at + 1..nl])
            .unwrap()
            .parse()
            .unwrap()
    };
    match b[at] {
        b'$' if n() >= 0 => {
            let end = nl + 2 + n() as usize + 2;
            (b.len() >= end).then_some(end)
        }
        b'*' if n() > 0 => {
            let mut e = nl + 2;
            for _ in 0..n() {
                e = frame(b, e)?;
            }
            Some(e)
        }
        _ => Some(nl + 2),
    }
}

/// Reads one whole reply; fails on a timeout (a hang) or a close.
fn reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        if let Some(n) = frame(buf, 0) {
            return buf.drain(..n).collect();
        }
        match s.read(&mut chunk) {
            Ok(0) => panic!(
                "connection closed; holding {} bytes: {:?}",
                buf.len(),
                String::from_utf8_lossy(&buf[..buf.len().min(80)])
            ),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!(
                "no reply within {TIMEOUT:?} ({e}); holding {} bytes",
                buf.len()
            ),
        }
    }
}

/// Reads until the peer closes (within the timeout): what arrived.
fn read_to_close(s: &mut TcpStream, mut buf: Vec<u8>) -> Vec<u8> {
    let mut chunk = [0u8; 65536];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => return buf,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return buf,
            Err(e) => panic!("the connection was not closed within {TIMEOUT:?}: {e}"),
        }
    }
}

/// A value of `n` random bytes (CRLFs and `$` included).
fn value(rng: &mut impl RngCore, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    if n > 8 {
        v[..6].copy_from_slice(b"\r\n$-1\n");
    }
    v
}

/// Writes `bytes` from another thread (so replies can be read while a large pipeline is
/// still going out) and returns the writer's handle.
fn send(s: &TcpStream, bytes: Vec<u8>) -> std::thread::JoinHandle<std::io::Result<()>> {
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || w.write_all(&bytes))
}

fn set_get(s: &mut TcpStream, buf: &mut Vec<u8>, key: &[u8], v: &[u8]) {
    let w = send(s, cmd(&[b"SET", key, v]));
    assert_eq!(reply(s, buf), b"+OK\r\n", "SET of {} bytes", v.len());
    w.join().unwrap().unwrap();
    s.write_all(&cmd(&[b"GET", key])).unwrap();
    let got = reply(s, buf);
    assert!(
        got == bulk(v),
        "GET of {} bytes: got {} bytes",
        v.len(),
        got.len()
    );
}

#[test]
fn values_mgets_and_pipelines_larger_than_the_buffer_pass_through_the_director() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, dport) = dpu(dir.path(), "1G", "redis", &["--offload-max-message", "20M"]);
    let _kv = start_kv(
        &socket,
        &[
            "--page-size",
            "64M",
            "--memory",
            "256M",
            "--log-size",
            "512M",
        ],
    );
    let mut rng = rand::rngs::SmallRng::seed_from_u64(18);
    let mut s = connect(dport);
    let mut buf = Vec::new();
    for n in [65535, 65536, 65537, 70000, 1 << 20, 16 << 20] {
        let v = value(&mut rng, n);
        set_get(&mut s, &mut buf, format!("v{n}").as_bytes(), &v);
    }

    // An MGET of 20 values of 4,000 bytes (an 80 KB reply).
    let vals: Vec<Vec<u8>> = (0..20).map(|_| value(&mut rng, 4000)).collect();
    for (i, v) in vals.iter().enumerate() {
        set_get(&mut s, &mut buf, format!("m{i}").as_bytes(), v);
    }
    let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("m{i}").into_bytes()).collect();
    let mut words: Vec<&[u8]> = vec![b"MGET"];
    words.extend(keys.iter().map(|k| k.as_slice()));
    let mut want = b"*20\r\n".to_vec();
    for v in &vals {
        want.extend(bulk(v));
    }
    for _ in 0..3 {
        s.write_all(&cmd(&words)).unwrap();
        assert!(reply(&mut s, &mut buf) == want, "MGET of 20 × 4000 bytes");
    }

    // A pipeline of 60 SETs and 60 GETs of 4,000-byte values (240 KB each way), in one
    // write.
    let vals: Vec<Vec<u8>> = (0..60).map(|_| value(&mut rng, 4000)).collect();
    let mut batch = Vec::new();
    for (i, v) in vals.iter().enumerate() {
        batch.extend(cmd(&[b"SET", format!("p{i}").as_bytes(), v]));
    }
    for i in 0..vals.len() {
        batch.extend(cmd(&[b"GET", format!("p{i}").as_bytes()]));
    }
    let w = send(&s, batch);
    for _ in 0..vals.len() {
        assert_eq!(reply(&mut s, &mut buf), b"+OK\r\n");
    }
    for (i, v) in vals.iter().enumerate() {
        assert!(reply(&mut s, &mut buf) == bulk(v), "pipelined GET p{i}");
    }
    w.join().unwrap().unwrap();
    // Pipelined GETs of the large values: 18 MB of replies.
    let sizes = [65535, 65536, 65537, 70000, 1 << 20, 16 << 20];
    let mut batch = Vec::new();
    for n in sizes {
        batch.extend(cmd(&[b"GET", format!("v{n}").as_bytes()]));
    }
    s.write_all(&batch).unwrap();
    for n in sizes {
        let got = reply(&mut s, &mut buf);
        assert_eq!(got.len(), n + format!("${n}\r\n\r\n").len(), "GET v{n}");
    }

    // Over the limit (20M): a bulk string announcing more is refused at once, after the
    // replies to the requests before it; the connection is closed.
    let mut bad = cmd(&[b"SET", b"a", b"1"]);
    bad.extend(cmd(&[b"GET", b"a"]));
    bad.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$20971521\r\nxxxx");
    let mut c = connect(dport);
    c.write_all(&bad).unwrap();
    let got = read_to_close(&mut c, Vec::new());
    assert_eq!(
        String::from_utf8_lossy(&got),
        "+OK\r\n$1\r\n1\r\n-ERR Protocol error: invalid bulk length\r\n"
    );
    // A command over the limit without any bulk string over it: refused once the director
    // holds 20M of it.
    let mut c = connect(dport);
    let big = value(&mut rng, 8 << 20);
    let w = send(&c, cmd(&[b"MSET", b"x", &big, b"y", &big, b"z", &big]));
    let got = read_to_close(&mut c, Vec::new());
    assert_eq!(
        String::from_utf8_lossy(&got),
        "-ERR Protocol error: query buffer limit exceeded\r\n"
    );
    let _ = w.join().unwrap();

    // The first connection and new ones are still served.
    set_get(&mut s, &mut buf, b"after", &value(&mut rng, 100_000));
    let mut t = connect(dport);
    let mut tb = Vec::new();
    set_get(&mut t, &mut tb, b"after2", &value(&mut rng, 1 << 20));
}

#[test]
fn records_larger_than_the_dpu_read_buffer_are_read_on_the_dpu_or_by_the_host() {
    for copy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut extra = vec!["--offload-buffer", "256K"];
        if copy {
            extra.push("--offload-copy");
        }
        let (_dpu, socket, dport) = dpu(dir.path(), "512M", "redis", &extra);
        let _kv = start_kv(
            &socket,
            &["--page-size", "1M", "--memory", "4M", "--log-size", "128M"],
        );
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut s = connect(dport);
        let mut buf = Vec::new();
        // 60 values of 64 KiB ± 1, 200,000 and 300,000 bytes (over the 256K read buffer):
        // 8 MB, twice the host's memory, so the first ones are on storage.
        let sizes = [65535, 65536, 65537, 200_000, 300_000];
        let vals: Vec<Vec<u8>> = (0..60)
            .map(|i| value(&mut rng, sizes[i % sizes.len()]))
            .collect();
        for (i, v) in vals.iter().enumerate() {
            set_get(&mut s, &mut buf, format!("r{i}").as_bytes(), v);
        }
        let before = offloaded(&socket);
        // All of them again, pipelined in one write (8 MB of replies).
        let mut batch = Vec::new();
        for i in 0..vals.len() {
            batch.extend(cmd(&[b"GET", format!("r{i}").as_bytes()]));
        }
        s.write_all(&batch).unwrap();
        for (i, v) in vals.iter().enumerate() {
            assert!(reply(&mut s, &mut buf) == bulk(v), "copy {copy}: GET r{i}");
        }
        // MGETs of 20 of them, split between the DPU and the host.
        let keys: Vec<Vec<u8>> = (0..20).map(|i| format!("r{i}").into_bytes()).collect();
        let mut words: Vec<&[u8]> = vec![b"MGET"];
        words.extend(keys.iter().map(|k| k.as_slice()));
        let mut want = b"*20\r\n".to_vec();
        for v in &vals[..20] {
            want.extend(bulk(v));
        }
        for _ in 0..3 {
            s.write_all(&cmd(&words)).unwrap();
            assert!(reply(&mut s, &mut buf) == want, "copy {copy}: MGET");
        }
        let served = offloaded(&socket) - before;
        assert!(served > 10, "copy {copy}: the DPU served {served} reads");
    }
}

#[test]
fn pagestore_messages_and_responses_larger_than_the_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, dport) = dpu(
        dir.path(),
        "256M",
        "pagestore",
        &["--offload-buffer", "1M", "--offload-uncached"],
    );
    let (_app, line) = spawn_ready(
        &[
            "app",
            "pagestore",
            "--backend",
            "dds",
            "--files",
            "2",
            "--socket",
        ],
        &socket,
        &["--file-size", "8M", "--listen", "127.0.0.1:0"],
    );
    assert!(line.contains("files"), "{line}");
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let files: Vec<String> = ready["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.to_string())
        .collect();
    // Writes of 256 KiB, 4 per message (1 MiB messages), then verified reads of 256 KiB
    // (1 MiB of responses per message), served by the DPU and by the host.
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["120", DDS, "app", "client", "--json", "--file-size", "8M"])
        .args(["--connect", &dport.to_string()])
        .args(["--files", &files.join(",")])
        .args(["--verify", "--io-size", "256K", "--batch", "4"])
        .args(["--requests", "400"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("{}");
    let r: serde_json::Value = serde_json::from_str(json).unwrap();
    assert!(
        out.status.success(),
        "client failed after {:?}: {r}",
        start.elapsed()
    );
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["verify_failures"], 0, "{r}");
    assert_eq!(r["order_violations"], 0, "{r}");
    assert_eq!(r["requests"], 400, "{r}");
    assert!(offloaded(&socket) > 0, "no read was served on the DPU");
}

/// Reads `n` page-server responses.
fn pageserver_responses(s: &mut TcpStream, n: usize) -> Vec<dds_pageserver::proto::Response> {
    (0..n)
        .map(|_| {
            let mut h = [0u8; 4];
            s.read_exact(&mut h).expect("a response within the timeout");
            let len = u32::from_le_bytes(h) as usize;
            let mut b = vec![0u8; len];
            b[..4].copy_from_slice(&h);
            s.read_exact(&mut b[4..])
                .expect("a response within the timeout");
            dds_pageserver::proto::decode_response(&b)
        })
        .collect()
}

#[test]
fn pageserver_messages_and_responses_larger_than_the_buffer() {
    use dds_pageserver::page;
    use dds_pageserver::proto::{self, status, GetPage, Record};
    const PS: usize = 8192;
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, socket, dport) = dpu(dir.path(), "256M", "pageserver", &[]);
    let (_ps, line) = spawn_ready(
        &["pageserver", "--listen", "127.0.0.1:0", "--socket"],
        &socket,
        &["--pages", "256", "--buffer-pool", "16", "--wal-size", "8M"],
    );
    assert!(line.contains("ready"), "{line}");
    let mut s = connect(dport);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    // One AppendWal of 32 records of 4,000 bytes (a 128 KB message): pages 0..32 patched
    // at offset 100, LSNs 1..=32.
    let datas: Vec<Vec<u8>> = (0..32).map(|_| value(&mut rng, 4000)).collect();
    let recs: Vec<Record<'_>> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| Record {
            lsn: i as u64 + 1,
            page: i as u64,
            offset: 100,
            data: d,
        })
        .collect();
    let mut m = Vec::new();
    proto::encode_append(&mut m, 1, 33, &recs);
    assert!(m.len() > 64 << 10);
    s.write_all(&m).unwrap();
    let r = pageserver_responses(&mut s, 1);
    assert_eq!(r[0].status, status::OK, "append");
    // GetPages of all 32 pages in one message (32 × 8 KiB = 256 KiB of responses), twice
    // (the second time some are served by the DPU), checked byte for byte.
    for round in 0..3 {
        let reqs: Vec<GetPage> = (0..32)
            .map(|i| GetPage {
                req_id: round * 100 + i,
                lsn: 32,
                // The page's last change (the client knows it; with a lower one it would
                // accept an older version: the replay may not have got there yet).
                nms: i + 1,
                page: i,
            })
            .collect();
        let mut m = Vec::new();
        proto::encode_getpages(&mut m, &reqs);
        s.write_all(&m).unwrap();
        for (g, resp) in reqs.iter().zip(pageserver_responses(&mut s, reqs.len())) {
            assert_eq!(resp.req_id, g.req_id, "in request order");
            if resp.status == status::RETRY {
                continue;
            }
            assert_eq!(resp.status, status::OK, "page {}", g.page);
            assert_eq!(page::check(&resp.body), Some((g.page, g.page + 1)));
            let mut want = vec![0u8; PS - page::HEADER];
            want[100..4100].copy_from_slice(&datas[g.page as usize]);
            assert!(resp.body[page::HEADER..] == want[..], "page {}", g.page);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A random command stream: empty, huge or binary keys and values, wrong, missing or extra
/// arguments, broken framing, random bytes.
fn hostile(rng: &mut impl RngCore) -> Vec<u8> {
    let word = |rng: &mut dyn RngCore| -> Vec<u8> {
        let n = match rng.gen_range(0..10) {
            0 => 0,
            1 => rng.gen_range(60_000..140_000),
            2 => rng.gen_range(1..2_000_000),
            _ => rng.gen_range(1..40),
        };
        let mut w = vec![0u8; n];
        rng.fill_bytes(&mut w);
        w
    };
    let names: [&[u8]; 24] = [
        b"HGET",
        b"HMGET",
        b"HSET",
        b"SISMEMBER",
        b"SADD",
        b"ZSCORE",
        b"ZADD",
        b"DDS.HMGETPART",
        b"GET",
        b"SET",
        b"MGET",
        b"MSET",
        b"DEL",
        b"INCR",
        b"APPEND",
        b"GETSET",
        b"EXPIRE",
        b"DDS.MGETPART",
        b"PING",
        b"HELLO",
        b"CLIENT",
        b"SELECT",
        b"get",
        b"NOSUCH",
    ];
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(1..12) {
        match rng.gen_range(0..8) {
            0 => {
                // Random bytes.
                let mut b = vec![0u8; rng.gen_range(0..5000)];
                rng.fill_bytes(&mut b);
                out.extend(b);
            }
            1 => {
                // Broken framing: wrong lengths, negative or huge counts, missing CRLFs.
                let forms: [&[u8]; 8] = [
                    b"*2\r\n$3\r\nGET\r\n$5\r\nab\r\n",
                    b"*-5\r\n",
                    b"*99999999999\r\n",
                    b"*1\r\n$-3\r\n",
                    b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999\r\nxx",
                    b"*1\r\n:12\r\n",
                    b"$5\r\nhello\r\n",
                    b"\r\n\r\n*0\r\n",
                ];
                out.extend_from_slice(forms[rng.gen_range(0..forms.len())]);
            }
            3 => {
                // A collection command on a few keys and fields (so that some are cached
                // and served on the DPU), with random extra arguments.
                let small = |rng: &mut dyn RngCore, what: &str| {
                    format!("{what}{}", rng.gen_range(0..4)).into_bytes()
                };
                let mut words = vec![names[rng.gen_range(0..8)].to_vec(), small(rng, "c")];
                for _ in 0..rng.gen_range(0..5) {
                    words.push(if rng.gen_bool(0.7) {
                        small(rng, "f")
                    } else {
                        word(rng)
                    });
                }
                let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                out.extend(cmd(&refs));
            }
            2 => {
                // An inline command.
                out.extend_from_slice(b"GET ");
                out.extend(word(rng).iter().map(|&b| if b == b'\n' { b' ' } else { b }));
                out.extend_from_slice(b"\r\n");
            }
            _ => {
                // A well-framed command with random arguments.
                let mut words = vec![names[rng.gen_range(0..names.len())].to_vec()];
                for _ in 0..rng.gen_range(0..6) {
                    words.push(word(rng));
                }
                let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                out.extend(cmd(&refs));
            }
        }
    }
    out
}

#[test]
fn no_client_input_stops_the_director_from_serving_others() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dpu, socket, dport) = dpu(dir.path(), "512M", "redis", &[]);
    let _kv = start_kv(
        &socket,
        &["--page-size", "1M", "--memory", "4M", "--log-size", "256M"],
    );
    let good = dport;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        // A well-behaved client, writing and reading its keys the whole time.
        let checker = sc.spawn(|| {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
            let mut s = connect(good);
            let mut buf = Vec::new();
            let mut rounds = 0;
            while !stop.load(std::sync::atomic::Ordering::Acquire) || rounds < 20 {
                let n = [10, 5000, 70000][rounds % 3];
                set_get(
                    &mut s,
                    &mut buf,
                    format!("good{}", rounds % 50).as_bytes(),
                    &value(&mut rng, n),
                );
                rounds += 1;
            }
            rounds
        });
        // Hostile clients: 4 threads × 30 connections of random streams, each read until
        // the director or the host answers everything or closes.
        let hostile_threads: Vec<_> = (0..4u64)
            .map(|t| {
                sc.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + t);
                    for _ in 0..30 {
                        let Ok(s) = TcpStream::connect(good) else {
                            panic!("the director stopped accepting");
                        };
                        s.set_read_timeout(Some(Duration::from_millis(300)))
                            .unwrap();
                        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
                        let bytes = hostile(&mut rng);
                        let mut w = s.try_clone().unwrap();
                        let half = rng.gen_bool(0.5);
                        let writer = std::thread::spawn(move || {
                            let _ = w.write_all(&bytes);
                            if half {
                                let _ = w.shutdown(std::net::Shutdown::Write);
                            }
                        });
                        let mut r = &s;
                        let mut sink = [0u8; 65536];
                        let deadline = Instant::now() + Duration::from_secs(2);
                        while Instant::now() < deadline {
                            match r.read(&mut sink) {
                                Ok(0) | Err(_) => break,
                                Ok(_) => {}
                            }
                        }
                        drop(s);
                        let _ = writer.join();
                    }
                })
            })
            .collect();
        for h in hostile_threads {
            h.join().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Release);
        let rounds = checker.join().unwrap();
        assert!(rounds >= 20, "{rounds} rounds of the good client");
    });
    assert!(
        dpu.0.try_wait().unwrap().is_none(),
        "the DPU process exited"
    );
    // And new connections are served.
    let mut s = connect(dport);
    let mut buf = Vec::new();
    set_get(&mut s, &mut buf, b"last", b"value");
    let _ = offloaded(&socket);
}
