//! `dds nbd` end to end with NBD clients nobody here wrote (fio's `nbd` engine, `nbdcopy`,
//! `nbdinfo`, `qemu-img`) against a real `dds dpu` and `dds nbd`, plus raw-socket bad input,
//! the consistency `NBD_FLAG_CAN_MULTI_CONN` promises across a DPU crash, and the DPU-less
//! mode on regular files (docs/nbd.md). The clients run again through the DPU's traffic
//! director with the offload app `nbd` (docs/nbd.md §6), whose counters show the DPU served
//! the reads.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{assert_alive, format_device, offloaded, spawn_listening, start_dpu, Guard, DDS};
use dds_nbd::proto::{self, Request};
use rand::{Rng, SeedableRng};

/// A DPU on a new device in `dir`.
fn dpu(dir: &Path) -> (Guard, PathBuf, PathBuf) {
    let img = format_device(dir, "256M");
    let socket = dir.join("dpu.sock");
    let g = start_dpu(&img, &socket, &[]);
    (g, img, socket)
}

/// `dds nbd` on port 0 with `args`: the process and the address of its ready line.
fn nbd(args: &[&str]) -> (Guard, SocketAddr) {
    spawn_listening(
        Command::new(DDS)
            .args(["nbd", "--listen", "127.0.0.1:0"])
            .args(args)
            .stderr(Stdio::inherit()),
    )
}

/// `dds nbd` on the DPU at `socket`.
fn nbd_on(socket: &Path, args: &[&str]) -> (Guard, SocketAddr) {
    let mut all = vec!["--socket", socket.to_str().unwrap()];
    all.extend_from_slice(args);
    nbd(&all)
}

/// A DPU running the offload app `nbd` on a new device in `dir`, and `dds nbd` with `args` on
/// it: the two processes, the DPU's control socket and the traffic director's address (where
/// clients connect; `dds nbd` announced itself to it).
fn offload(dir: &Path, args: &[&str]) -> (Guard, Guard, PathBuf, SocketAddr) {
    offload_with(dir, &[], args)
}

/// [`offload`] with `dpu_args` for `dds dpu`.
fn offload_with(
    dir: &Path,
    dpu_args: &[&str],
    args: &[&str],
) -> (Guard, Guard, PathBuf, SocketAddr) {
    let (dpu, socket, director) = common::start_offload_dpu_with(dir, "256M", "nbd", dpu_args);
    let (server, _) = nbd_on(&socket, args);
    (dpu, server, socket, director)
}

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    std::fs::write(path, &b).unwrap();
    b
}

/// fio with the nbd engine: 4 KiB random writes with crc32c verification headers, then, on a
/// second connection, a pass that reads every block back and checks it.
fn fio_write_then_verify(dir: &Path, uri: &str, size: &str) {
    let job = |extra: &[&str], out: &Path| {
        let mut cmd = Command::new("fio");
        // fio writes its verify state in its working directory.
        cmd.current_dir(dir)
            .args([
                "--name=nbd",
                "--ioengine=nbd",
                &format!("--uri={uri}"),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                &format!("--size={size}"),
                "--verify=crc32c",
                // A request stalled for seconds fails the job (ETIMEDOUT).
                "--max_latency=5s",
                "--output-format=json",
            ])
            .arg(format!("--output={}", out.display()))
            .args(extra);
        run(&mut cmd);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
        v["jobs"][0].clone()
    };
    let w = job(&["--do_verify=0"], &dir.join("write.json"));
    assert_eq!(w["error"], 0, "{w}");
    let written = w["write"]["io_bytes"].as_u64().unwrap();
    let r = job(&["--verify_only"], &dir.join("verify.json"));
    assert_eq!(r["error"], 0, "{r}");
    let read = r["read"]["io_bytes"].as_u64().unwrap();
    assert!(
        written > 0 && read == written,
        "wrote {written}, verified {read}"
    );
}

#[test]
fn fio_random_writes_then_a_crc32c_verify_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _img, socket) = dpu(dir.path());
    let (mut server, addr) = nbd_on(&socket, &["--export", "disk=32M"]);
    fio_write_then_verify(dir.path(), &format!("nbd://{addr}/disk"), "32M");
    assert_alive(&mut server, "dds nbd");
}

#[test]
fn fio_through_the_director_with_the_dpu_serving_the_verify_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dpu, mut server, socket, director) = offload(dir.path(), &["--export", "disk=32M"]);
    // The window of `dds stats`'s DPU CPU per NBD read starts here.
    let before = offloaded(&socket);
    fio_write_then_verify(dir.path(), &format!("nbd://{director}/disk"), "32M");
    let us = common::dpu_cpu_per_request(&socket, "NBD read", 4096);
    let served = offloaded(&socket) - before;
    eprintln!("{served} reads served by the DPU, {us:.1} µs of DPU CPU each");
    // The verify pass reads the 8192 blocks written, with no write in flight.
    assert!(served >= 8192, "the DPU served {served} reads");
    assert_alive(&mut server, "dds nbd");
    assert_alive(&mut dpu, "dds dpu");
}

#[test]
fn nbdcopy_in_and_out_and_qemu_img_compare() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _img, socket) = dpu(dir.path());
    let (mut server, addr) = nbd_on(&socket, &["--export", "disk=24M"]);
    copy_and_compare(dir.path(), addr);
    assert_alive(&mut server, "dds nbd");
}

#[test]
fn nbdcopy_and_qemu_img_compare_through_the_director() {
    let dir = tempfile::tempdir().unwrap();
    // Read buffers as large as nbdcopy's requests (256 KiB), so that the DPU serves them
    // (64 of them: 16 MiB).
    let (mut dpu, mut server, socket, director) = offload_with(
        dir.path(),
        &["--offload-buffer", "256K", "--offload-contexts", "64"],
        &["--export", "disk=24M"],
    );
    let before = offloaded(&socket);
    copy_and_compare(dir.path(), director);
    let served = offloaded(&socket) - before;
    // nbdcopy out reads the 24 MiB in 96 requests; qemu-img reads it again, twice.
    assert!(served >= 96, "the DPU served {served} reads");
    assert_alive(&mut server, "dds nbd");
    assert_alive(&mut dpu, "dds dpu");
}

/// A random image copied in with `nbdcopy` and out again, compared byte for byte, and with
/// `qemu-img compare` (which must also find a changed byte).
fn copy_and_compare(dir: &Path, addr: SocketAddr) {
    let src = dir.join("src.img");
    let data = random_file(&src, 24 << 20, common::test_seed("nbdcopy"));
    let uri = format!("nbd://{addr}/disk");
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let out = dir.join("out.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "nbdcopy out differs");
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri));
    // The comparison does look at the data: one byte changed locally is found.
    let mut changed = data;
    changed[(13 << 20) + 5] ^= 0x40;
    std::fs::write(&src, &changed).unwrap();
    let st = Command::new("qemu-img")
        .args(["compare", "-q", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(&uri)
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1), "qemu-img compare found no difference");
}

#[test]
fn nbdinfo_lists_the_exports_of_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _img, socket) = dpu(dir.path());
    let cfg = dir.path().join("nbd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nexport = [\"disk=16M\", \"iso=1M,ro\"]\n",
            socket.display()
        ),
    )
    .unwrap();
    let (_server, addr) = nbd(&["--config", cfg.to_str().unwrap(), "--export", "more=2M"]);
    list_three_exports(addr);
}

#[test]
fn nbdinfo_through_the_director() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _server, _socket, director) = offload(
        dir.path(),
        &[
            "--export",
            "disk=16M",
            "--export",
            "iso=1M,ro",
            "--export",
            "more=2M",
        ],
    );
    list_three_exports(director);
}

/// `nbdinfo` lists the exports disk (16 MiB), iso (1 MiB, read-only) and more (2 MiB), and
/// gives the default export's size.
fn list_three_exports(addr: SocketAddr) {
    let out = run(Command::new("nbdinfo").args(["--list", "--json", &format!("nbd://{addr}")]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<(String, u64, bool, bool)> = v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["export-name"].as_str().unwrap().to_string(),
                e["export-size"].as_u64().unwrap(),
                e["is_read_only"].as_bool().unwrap(),
                e["can_multi_conn"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("disk".into(), 16 << 20, false, true),
            ("iso".into(), 1 << 20, true, true),
            ("more".into(), 2 << 20, false, true),
        ]
    );
    // The default export (empty name) is the first.
    let out = run(Command::new("nbdinfo").args(["--size", &format!("nbd://{addr}")]));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "16777216");
}

/// A client speaking the protocol over a raw socket.
struct Client {
    s: TcpStream,
    structured: bool,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut g = [0u8; proto::GREETING];
        s.read_exact(&mut g).unwrap();
        assert_eq!(&g[..16], b"NBDMAGICIHAVEOPT");
        Client {
            s,
            structured: false,
        }
    }

    fn flags(&mut self, f: u32) {
        self.s.write_all(&f.to_be_bytes()).unwrap();
    }

    fn option(&mut self, option: u32, data: &[u8]) {
        let mut m = Vec::new();
        m.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m).unwrap();
    }

    /// The next option reply: (option, type, data).
    fn reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; proto::OPT_REPLY_HEADER];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(&h[..8], &proto::OPT_REPLY_MAGIC.to_be_bytes());
        let be = |a: usize| u32::from_be_bytes(h[a..a + 4].try_into().unwrap());
        let mut d = vec![0u8; be(16) as usize];
        self.s.read_exact(&mut d).unwrap();
        (be(8), be(12), d)
    }

    /// `NBD_OPT_GO` on `name`: the final reply's type.
    fn go(&mut self, name: &str) -> u32 {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.option(proto::OPT_GO, &d);
        loop {
            let (_, kind, _) = self.reply();
            if kind != proto::REP_INFO {
                return kind;
            }
        }
    }

    /// Handshake to transmission on `name`.
    fn open(addr: SocketAddr, name: &str, structured: bool) -> Client {
        let mut c = Client::connect(addr);
        c.flags(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
        if structured {
            c.option(proto::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(c.reply().1, proto::REP_ACK);
            c.structured = true;
        }
        assert_eq!(c.go(name), proto::REP_ACK);
        c
    }

    fn send(&mut self, command: u16, flags: u16, handle: u64, offset: u64, len: u32, data: &[u8]) {
        let mut m = Vec::new();
        proto::encode_request(
            &mut m,
            &Request {
                magic: proto::REQUEST_MAGIC,
                flags,
                command,
                handle,
                offset,
                len,
            },
        );
        m.extend_from_slice(data);
        self.s.write_all(&m).unwrap();
    }

    /// A reply to a request other than READ: (handle, error).
    fn simple(&mut self) -> (u64, u32) {
        let mut h = [0u8; proto::SIMPLE_REPLY];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(&h[..4], &proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
        (
            u64::from_be_bytes(h[8..16].try_into().unwrap()),
            u32::from_be_bytes(h[4..8].try_into().unwrap()),
        )
    }

    /// The reply to a READ of `len` bytes: (handle, error, data).
    fn read_reply(&mut self, len: usize) -> (u64, u32, Vec<u8>) {
        if !self.structured {
            let (handle, err) = self.simple();
            let mut d = vec![0u8; if err == 0 { len } else { 0 }];
            self.s.read_exact(&mut d).unwrap();
            return (handle, err, d);
        }
        let mut h = [0u8; proto::STRUCTURED_HEADER];
        self.s.read_exact(&mut h).unwrap();
        assert_eq!(&h[..4], &proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&h[4..6], &proto::REPLY_FLAG_DONE.to_be_bytes());
        let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        self.s.read_exact(&mut d).unwrap();
        match u16::from_be_bytes([h[6], h[7]]) {
            proto::REPLY_TYPE_OFFSET_DATA => (handle, 0, d[8..].to_vec()),
            proto::REPLY_TYPE_ERROR => (
                handle,
                u32::from_be_bytes(d[..4].try_into().unwrap()),
                vec![],
            ),
            t => panic!("reply type {t:#x}"),
        }
    }

    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.send(proto::CMD_READ, 0, 77, offset, len, &[]);
        let (h, err, d) = self.read_reply(len as usize);
        assert_eq!((h, err), (77, 0));
        d
    }

    fn write(&mut self, offset: u64, data: &[u8], flags: u16) {
        self.send(proto::CMD_WRITE, flags, 78, offset, data.len() as u32, data);
        assert_eq!(self.simple(), (78, 0));
    }

    /// True once the server closed the connection (within the read timeout).
    fn closed(&mut self) -> bool {
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }
}

const BAD_INPUT_EXPORTS: [&str; 4] = ["--export", "disk=40M", "--export", "iso=1M,ro"];

#[test]
fn bad_input_gets_the_nbd_errors_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let (_dpu, _img, socket) = dpu(dir.path());
    let (mut server, addr) = nbd_on(&socket, &BAD_INPUT_EXPORTS);
    bad_input(addr);
    assert_alive(&mut server, "dds nbd");
}

/// Through the director, the host answers what it answers without it (the refused requests are
/// forwarded), the connections it closes are closed, and neither process falls over.
#[test]
fn bad_input_through_the_director_is_answered_by_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dpu, mut server, socket, director) = offload(dir.path(), &BAD_INPUT_EXPORTS);
    let before = offloaded(&socket);
    bad_input(director);
    assert!(
        offloaded(&socket) > before,
        "the DPU served none of the valid reads"
    );
    assert_alive(&mut server, "dds nbd");
    assert_alive(&mut dpu, "dds dpu");
}

/// Bad input of every kind at `addr`; then a new client reads what the first wrote.
fn bad_input(addr: SocketAddr) {
    const SIZE: u64 = 40 << 20;

    // Handshake: unknown client flags close.
    let mut c = Client::connect(addr);
    c.flags(0x8000_0001);
    assert!(c.closed(), "unknown client flags");
    // A wrong option magic closes.
    let mut c = Client::connect(addr);
    c.flags(1);
    c.s.write_all(&[0x55; 16]).unwrap();
    assert!(c.closed(), "bad option magic");
    // Unknown options, malformed ones, unknown exports and too large ones are answered, and
    // the handshake goes on.
    let mut c = Client::connect(addr);
    c.flags(proto::FLAG_C_FIXED_NEWSTYLE);
    c.option(0x4242, b"whatever");
    assert_eq!(c.reply(), (0x4242, proto::REP_ERR_UNSUP, vec![]));
    c.option(proto::OPT_STARTTLS, &[]);
    assert_eq!(c.reply().1, proto::REP_ERR_UNSUP);
    c.option(proto::OPT_LIST, b"x");
    assert_eq!(c.reply().1, proto::REP_ERR_INVALID);
    c.option(proto::OPT_GO, &[0, 0, 0, 9, b'a']);
    assert_eq!(c.reply().1, proto::REP_ERR_INVALID);
    assert_eq!(c.go("nope"), proto::REP_ERR_UNKNOWN);
    c.option(proto::OPT_INFO, &vec![0u8; 100_000]);
    assert_eq!(c.reply().1, proto::REP_ERR_TOO_BIG);
    c.option(proto::OPT_LIST, &[]);
    let names: Vec<Vec<u8>> = std::iter::from_fn(|| {
        let (_, kind, d) = c.reply();
        (kind == proto::REP_SERVER).then(|| d[4..].to_vec())
    })
    .collect();
    assert_eq!(names, vec![b"disk".to_vec(), b"iso".to_vec()]);
    assert_eq!(c.go("disk"), proto::REP_ACK);
    c.write(0, &[7u8; 4096], 0);
    // An unknown export named by NBD_OPT_EXPORT_NAME (no error possible) closes.
    let mut x = Client::connect(addr);
    x.flags(1);
    x.option(proto::OPT_EXPORT_NAME, b"nope");
    assert!(x.closed(), "unknown export by NBD_OPT_EXPORT_NAME");
    // NBD_OPT_ABORT is acknowledged, then the connection closes.
    let mut x = Client::connect(addr);
    x.flags(1);
    x.option(proto::OPT_ABORT, &[]);
    assert_eq!(x.reply().1, proto::REP_ACK);
    assert!(x.closed());

    // Transmission, simple replies: each refused request gets its error, in order.
    c.send(99, 0, 1, 0, 512, &[]);
    c.send(proto::CMD_READ, 0, 2, SIZE - 512, 1024, &[]);
    c.send(proto::CMD_READ, 0, 3, u64::MAX - 10, 512, &[]);
    c.send(proto::CMD_READ, 0, 4, 0, 0, &[]);
    c.send(proto::CMD_READ, proto::CMD_FLAG_FUA, 5, 0, 512, &[]);
    c.send(proto::CMD_WRITE, 0, 6, SIZE - 1, 2, &[1, 2]);
    c.send(proto::CMD_WRITE_ZEROES, 0, 7, SIZE, 512, &[]);
    c.send(proto::CMD_TRIM, 0, 8, 0, 0, &[]);
    for (h, err) in [
        (1, proto::EINVAL),
        (2, proto::EINVAL),
        (3, proto::EINVAL),
        (4, proto::EINVAL),
        (5, proto::EINVAL),
        (6, proto::ENOSPC),
        (7, proto::ENOSPC),
        (8, proto::EINVAL),
    ] {
        assert_eq!(c.simple(), (h, err), "request {h}");
    }
    // A WRITE over the largest payload: refused, its payload skipped as it arrives.
    let big = vec![9u8; proto::PAYLOAD_MAX as usize + 4096];
    c.send(proto::CMD_WRITE, 0, 10, 0, big.len() as u32, &big);
    assert_eq!(c.simple(), (10, proto::EINVAL));
    assert_eq!(
        c.read(0, 4096),
        vec![7u8; 4096],
        "the skipped payload wrote nothing"
    );
    // A READ of the largest size is served.
    assert_eq!(
        c.read(0, proto::PAYLOAD_MAX).len(),
        proto::PAYLOAD_MAX as usize
    );
    // A wrong request magic closes.
    c.s.write_all(&[0u8; proto::REQUEST]).unwrap();
    assert!(c.closed(), "bad request magic");

    // A read-only export refuses writes (payload skipped) with EPERM; structured replies carry
    // a refused READ's error in an error chunk.
    let mut ro = Client::open(addr, "iso", true);
    ro.send(proto::CMD_WRITE, 0, 11, 0, 4096, &[1u8; 4096]);
    ro.send(proto::CMD_WRITE_ZEROES, 0, 12, 0, 4096, &[]);
    ro.send(proto::CMD_TRIM, 0, 13, 0, 4096, &[]);
    for h in 11..=13 {
        assert_eq!(ro.simple(), (h, proto::EPERM));
    }
    ro.send(proto::CMD_READ, 0, 14, 1 << 20, 1, &[]);
    assert_eq!(ro.read_reply(1), (14, proto::EINVAL, vec![]));
    assert_eq!(ro.read(0, 4096), vec![0u8; 4096]);

    // Clients that vanish: mid-payload, and with reads in flight whose replies nobody reads.
    for _ in 0..20 {
        let mut v = Client::open(addr, "disk", false);
        v.send(proto::CMD_WRITE, 0, 1, 4096, 65536, &[3u8; 1000]);
        let mut w = Client::open(addr, "disk", true);
        for k in 0..64 {
            w.send(proto::CMD_READ, 0, k, k * 65536, 65536, &[]);
        }
    }
    // Random bytes after a valid handshake, and instead of one.
    let seed = common::test_seed("nbd hostile");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let streams: Vec<Vec<u8>> = (0..40)
        .map(|k| {
            let mut b = Vec::new();
            if k % 2 == 0 {
                b.extend_from_slice(&3u32.to_be_bytes());
                b.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
                b.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
                b.extend_from_slice(&4u32.to_be_bytes());
                b.extend_from_slice(b"disk");
            }
            b.extend(common::random_blob(&mut rng, &[4, 16, 28], 4096));
            b
        })
        .collect();
    common::hostile_clients(addr, streams, 8, Duration::from_millis(300));

    // The server goes on: a new client reads what was written.
    let mut c = Client::open(addr, "disk", true);
    assert_eq!(c.read(0, 4096), vec![7u8; 4096]);
    c.send(proto::CMD_DISC, 0, 0, 0, 0, &[]);
    assert!(c.closed(), "after NBD_CMD_DISC");
}

/// Through the director, a block written on one connection is read back on another as soon
/// as the write was acknowledged, whichever side serves the read, with structured and simple
/// replies; writes in flight keep their range's reads on the host, and the rest are the DPU's.
#[test]
fn writes_acknowledged_on_one_connection_are_read_on_another_through_the_director() {
    let dir = tempfile::tempdir().unwrap();
    let (mut dpu, mut server, socket, director) = offload(dir.path(), &["--export", "disk=8M"]);
    let mut a = Client::open(director, "disk", false);
    let mut b = Client::open(director, "disk", true);
    let mut rng = rand::rngs::StdRng::seed_from_u64(common::test_seed("offload multi-conn"));
    let before = offloaded(&socket);
    let blocks = 256u64;
    let mut model = vec![vec![0u8; 4096]; blocks as usize];
    for round in 0..1500u64 {
        let k = rng.gen_range(0..blocks);
        let mut d = vec![0u8; 4096];
        rng.fill(&mut d[..]);
        let (w, r) = if round % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        w.write(k * 4096, &d, 0);
        model[k as usize] = d;
        // Read at once on the other connection: the block just written, and another.
        assert_eq!(r.read(k * 4096, 4096), model[k as usize], "block {k}");
        let j = rng.gen_range(0..blocks);
        assert_eq!(r.read(j * 4096, 4096), model[j as usize], "block {j}");
    }
    // Pipelined: a write and, behind it on the same connection and on the other, reads of
    // every block; the replies (by handle) carry the old or the new bytes of the block being
    // written, and every other block's bytes.
    let mut d = vec![0u8; 4096];
    rng.fill(&mut d[..]);
    a.send(proto::CMD_WRITE, 0, 1_000_000, 0, 4096, &d);
    for k in 0..blocks {
        a.send(proto::CMD_READ, 0, k, k * 4096, 4096, &[]);
        b.send(proto::CMD_READ, 0, k, k * 4096, 4096, &[]);
    }
    for (c, name) in [(&mut a, "a"), (&mut b, "b")] {
        let mut seen = vec![false; blocks as usize];
        let mut write_acked = name == "b";
        for _ in 0..blocks + u64::from(name == "a") {
            let (handle, err, data) = if c.structured {
                c.read_reply(4096)
            } else {
                // Simple replies: a READ reply carries 4096 bytes, the WRITE's none.
                let (handle, err) = c.simple();
                let mut data = vec![0u8; if handle < blocks { 4096 } else { 0 }];
                c.s.read_exact(&mut data).unwrap();
                (handle, err, data)
            };
            assert_eq!(err, 0, "{name}: request {handle}");
            if handle == 1_000_000 {
                write_acked = true;
                continue;
            }
            let k = handle as usize;
            assert!(!seen[k], "{name}: block {k} answered twice");
            seen[k] = true;
            if k == 0 {
                assert!(data == model[0] || data == d, "{name}: block 0 torn");
            } else {
                assert_eq!(data, model[k], "{name}: block {k}");
            }
        }
        assert!(write_acked, "{name}: the write was answered");
    }
    model[0] = d;
    for k in 0..blocks {
        assert_eq!(
            b.read(k * 4096, 4096),
            model[k as usize],
            "block {k} at the end"
        );
    }
    let served = offloaded(&socket) - before;
    eprintln!("{served} of the reads served by the DPU");
    assert!(served > 1000, "the DPU served {served} reads");
    assert_alive(&mut server, "dds nbd");
    assert_alive(&mut dpu, "dds dpu");
}

#[test]
fn a_flush_on_one_connection_makes_the_others_writes_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (dpu_proc, img, socket) = dpu(dir.path());
    let (server, addr) = nbd_on(&socket, &["--export", "disk=8M"]);
    let mut a = Client::open(addr, "disk", false);
    let mut b = Client::open(addr, "disk", true);
    let mut rng = rand::rngs::StdRng::seed_from_u64(common::test_seed("multi-conn"));
    let mut blocks = Vec::new();
    for k in 0..64u64 {
        let mut d = vec![0u8; 4096];
        rng.fill(&mut d[..]);
        // Written on either connection, every reply waited for.
        let c = if k % 2 == 0 { &mut a } else { &mut b };
        c.write(k * 8192, &d, 0);
        blocks.push(d);
    }
    // Visible on the other connection at once.
    for (k, d) in blocks.iter().enumerate() {
        let c = if k % 2 == 0 { &mut b } else { &mut a };
        assert_eq!(&c.read(k as u64 * 8192, 4096), d);
    }
    // One FLUSH, on a third connection, covers them all; then the DPU dies.
    let mut f = Client::open(addr, "disk", false);
    f.send(proto::CMD_FLUSH, 0, 5, 0, 0, &[]);
    assert_eq!(f.simple(), (5, 0));
    // A FUA write is durable by itself.
    let fua = vec![0xa5u8; 4096];
    a.write(64 * 8192, &fua, proto::CMD_FLAG_FUA);
    drop((a, b, f, dpu_proc, server));
    let _dpu = start_dpu(&img, &socket, &[]);
    let (_server, addr) = nbd_on(&socket, &["--export", "disk=8M"]);
    let mut c = Client::open(addr, "disk", true);
    for (k, d) in blocks.iter().enumerate() {
        assert_eq!(
            &c.read(k as u64 * 8192, 4096),
            d,
            "block {k} after the crash"
        );
    }
    assert_eq!(c.read(64 * 8192, 4096), fua);
}

#[test]
fn without_a_dpu_on_regular_files() {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("exports");
    let (mut server, addr) = nbd(&[
        "--storage",
        "file",
        "--dir",
        files.to_str().unwrap(),
        "--export",
        "disk=16M",
    ]);
    let src = dir.path().join("src.img");
    let data = random_file(&src, 16 << 20, common::test_seed("nbd file"));
    let uri = format!("nbd://{addr}/disk");
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    let out = dir.path().join("out.img");
    run(Command::new("nbdcopy").arg(&uri).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "nbdcopy out differs");
    assert!(
        std::fs::read(files.join("disk")).unwrap() == data,
        "the export's file"
    );
    fio_write_then_verify(dir.path(), &uri, "16M");
    assert_alive(&mut server, "dds nbd");
}
