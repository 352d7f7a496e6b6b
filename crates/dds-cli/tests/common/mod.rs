//! Helpers of the `dds` command's end-to-end tests: the binary, a guard that kills a child,
//! a formatted device file and a DPU process that accepts connections.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const DDS: &str = env!("CARGO_BIN_EXE_dds");

/// A child process, killed when dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The stdout of `cmd`, run to its end; panics with its stderr unless it succeeded.
pub fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `dds format --size SIZE` of a new device file `dev.img` in `dir`.
pub fn format_device(dir: &Path, size: &str) -> PathBuf {
    let img = dir.join("dev.img");
    let out = Command::new(DDS)
        .args(["format", "--size", size, "--device"])
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// Waits until something accepts on `socket`.
pub fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `dds dpu --device IMG --socket SOCKET EXTRA...`, once it accepts connections.
pub fn start_dpu(img: &Path, socket: &Path, extra: &[&str]) -> Guard {
    let child = Command::new(DDS)
        .args(["dpu", "--device"])
        .arg(img)
        .arg("--socket")
        .arg(socket)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("DDS_TEST_DPU_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let g = Guard(child);
    wait_for_socket(socket);
    g
}

/// `dds kv --listen LISTEN ARGS...`; returns the process and the address of its ready line.
pub fn start_kv(listen: &str, args: &[&str]) -> (Guard, SocketAddr) {
    spawn_listening(
        Command::new(DDS)
            .args(["kv", "--listen", listen])
            .args(args)
            .stderr(Stdio::inherit()),
    )
}

/// The address on a server's ready line (`... listening on ADDR ...`).
pub fn listening_on(line: &str) -> SocketAddr {
    line.split("listening on ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address on the ready line {line:?}"))
}

/// A TCP port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A DPU on a new `size` device in `dir` running the offload app `app` with its traffic
/// director on a port of its choosing: returns it, its control socket and the director's
/// address (clients). The host application started next binds port 0 too and announces its
/// address to the director itself (`dds kv` and `dds pageserver` do): no port is picked for
/// either.
pub fn start_offload_dpu(dir: &Path, size: &str, app: &str) -> (Guard, PathBuf, SocketAddr) {
    start_offload_dpu_with(dir, size, app, &[])
}

/// [`start_offload_dpu`] with `extra` flags of `dds dpu`.
pub fn start_offload_dpu_with(
    dir: &Path,
    size: &str,
    app: &str,
    extra: &[&str],
) -> (Guard, PathBuf, SocketAddr) {
    start_offload_dpu_env(dir, size, app, extra, &[])
}

/// [`start_offload_dpu_with`] with `envs` in the DPU's environment.
pub fn start_offload_dpu_env(
    dir: &Path,
    size: &str,
    app: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (Guard, PathBuf, SocketAddr) {
    let img = format_device(dir, size);
    let socket = dir.join("dpu.sock");
    let (g, director) = spawn_offload_dpu_env(&img, &socket, app, extra, envs);
    (g, socket, director)
}

/// `dds dpu` on the device `img` (formatted already, e.g. a restart) with the offload app
/// `app` and its traffic director on port 0: the process and the director's address.
pub fn spawn_offload_dpu(
    img: &Path,
    socket: &Path,
    app: &str,
    extra: &[&str],
) -> (Guard, SocketAddr) {
    spawn_offload_dpu_env(img, socket, app, extra, &[])
}

/// [`spawn_offload_dpu`] with `envs` in the DPU's environment.
pub fn spawn_offload_dpu_env(
    img: &Path,
    socket: &Path,
    app: &str,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (Guard, SocketAddr) {
    let (g, line) = ready_line(
        Command::new(DDS)
            .envs(envs.iter().copied())
            .args(["dpu", "--json", "--device"])
            .arg(img)
            .arg("--socket")
            .arg(socket)
            .args(["--offload", app, "--director-listen", "127.0.0.1:0"])
            .args(extra)
            .stderr(if std::env::var_os("DDS_TEST_DPU_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            }),
    );
    (g, director_of(&line))
}

/// Sends a page-server message and reads `n` responses.
pub fn call_pageserver(
    s: &mut std::net::TcpStream,
    msg: &[u8],
    n: usize,
) -> Vec<dds_pageserver::proto::Response> {
    use std::io::{Read, Write};
    s.write_all(msg).unwrap();
    (0..n)
        .map(|_| {
            let mut h = [0u8; 4];
            s.read_exact(&mut h).unwrap();
            let len = u32::from_le_bytes(h) as usize;
            let mut b = vec![0u8; len];
            b[..4].copy_from_slice(&h);
            s.read_exact(&mut b[4..]).unwrap();
            dds_pageserver::proto::decode_response(&b)
        })
        .collect()
}

/// The traffic director's address on `dds dpu --json`'s ready line.
pub fn director_of(line: &str) -> SocketAddr {
    let ready: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("ready line {line:?}: {e}"));
    ready["director"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no director in the ready line {line:?}"))
}

/// `dds stats --json` of the DPU on `socket`.
pub fn dpu_stats(socket: &Path) -> serde_json::Value {
    let out = Command::new(DDS)
        .args(["stats", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "dds stats failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Requests the DPU's traffic directors served on the DPU so far (`dds stats --json`).
pub fn offloaded(socket: &Path) -> u64 {
    dpu_stats(socket)["offload"]["directors"]
        .as_array()
        .map(|d| d.iter().map(|x| x["offloaded"].as_u64().unwrap()).sum())
        .unwrap_or(0)
}

/// The DPU's CPU per request served on it, in µs, over the window since the previous `dds
/// stats` (the offload section's `cpu`), after checking that the window holds at least
/// `requests` of the app's kind `request` and that the figures are plausible: some CPU per
/// request, the directors' threads' part of it, no more CPU than the window's wall time on
/// every core.
pub fn dpu_cpu_per_request(socket: &Path, request: &str, requests: u64) -> f64 {
    let st = dpu_stats(socket);
    let c = &st["offload"]["cpu"];
    assert_eq!(c["request"], request, "{c}");
    assert!(c["offloaded"].as_u64().unwrap() >= requests, "{c}");
    let us = c["dpu_cpu_us_per_request"].as_f64().unwrap();
    let director = c["director_cpu_us_per_request"].as_f64().unwrap();
    assert!((0.5..20_000.0).contains(&us), "{c}");
    if c["director_inline"] == true {
        // On the file-service thread: no director thread to measure.
        assert_eq!(director, 0.0, "{c}");
    } else {
        assert!(director > 0.0 && director <= us, "{c}");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (cpu, wall) = (
        c["process_cpu_seconds"].as_f64().unwrap(),
        c["window_seconds"].as_f64().unwrap(),
    );
    assert!(cpu > 0.0 && cpu <= wall * cores + 0.05, "{c}");
    let threads = c["threads"].as_array().unwrap();
    let director_thread = if c["director_inline"] == true {
        "dds-service"
    } else {
        "dds-director"
    };
    assert!(
        threads.iter().any(|t| t[0] == director_thread),
        "the director's thread is listed: {c}"
    );
    // The text form says the same.
    let out = Command::new(DDS)
        .args(["stats", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("per {request} served on the DPU")),
        "{text}"
    );
    us
}

/// A DPU-KV deployment: its processes (DPU first, when there is one), the host's ready lines
/// and the client endpoints of the first one (the DPU's first).
pub struct DpuKv {
    pub dpu: Option<Guard>,
    pub host: Guard,
    pub control: PathBuf,
    pub lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    pub endpoints: Vec<std::net::SocketAddr>,
}

/// `dds dpukv dpu` on a control socket in `dir`, once it listens.
pub fn start_dpukv_dpu(control: &Path, extra: &[&str]) -> Guard {
    let _ = std::fs::remove_file(control);
    let child = Command::new(DDS)
        .args(["dpukv", "dpu", "--control"])
        .arg(control)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let g = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !control.exists() {
        assert!(Instant::now() < deadline, "dds dpukv dpu did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    g
}

/// Reads the host's next ready line: the endpoints it announces.
pub fn next_endpoints(
    lines: &mut std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
) -> Vec<std::net::SocketAddr> {
    let line = lines
        .next()
        .expect("the host process printed its endpoints")
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["addr"].as_str().unwrap().parse().unwrap())
        .collect()
}

/// A deployment of `design` (DPU process with `dpu_args`, host with `host_args`).
pub fn start_dpukv(dir: &Path, design: &str, dpu_args: &[&str], host_args: &[&str]) -> DpuKv {
    let control = dir.join("dpukv.sock");
    let dpu = (design != "cpu-only").then(|| start_dpukv_dpu(&control, dpu_args));
    let mut cmd = Command::new(DDS);
    cmd.args(["dpukv", "host", "--design", design]);
    if dpu.is_some() {
        cmd.arg("--dpu").arg(&control);
    }
    let mut child = cmd
        .args(host_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let host = Guard(child);
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out));
    let endpoints = next_endpoints(&mut lines);
    DpuKv {
        dpu,
        host,
        control,
        lines,
        endpoints,
    }
}

/// A cluster of `dds osd` processes on one machine, each with its own device file in `dir`,
/// sharing the map file `dir/cluster.toml`.
pub struct OsdCluster {
    pub dir: PathBuf,
    pub map: PathBuf,
    pub addrs: Vec<std::net::SocketAddr>,
    pub peer_addrs: Vec<std::net::SocketAddr>,
    pub osds: Vec<Option<Guard>>,
    /// Per OSD: "host", or "dpu" (front end process + `dds osd-store` host process).
    pub placements: Vec<String>,
    /// The `dds osd-store` processes of placement-dpu OSDs.
    pub stores: Vec<Option<Guard>>,
    /// Size of each OSD's device file (`--size`).
    pub device_size: String,
}

impl OsdCluster {
    /// Writes a map of `n` OSDs (one pool 1 "data" of `pg_num` PGs, `size` replicas) and
    /// starts every OSD on a freshly formatted device.
    pub fn start(dir: &Path, n: u32, pg_num: u32, size: u32) -> OsdCluster {
        let placements = vec!["host"; n as usize];
        OsdCluster::start_mixed(dir, &placements, pg_num, size)
    }

    /// As [`start`](Self::start), with a placement (`host` or `dpu`) per OSD: a first map
    /// with port 0 everywhere, the OSDs' ready lines, then the map with their ports (epoch 2),
    /// which the OSDs reread.
    pub fn start_mixed(dir: &Path, placements: &[&str], pg_num: u32, size: u32) -> OsdCluster {
        OsdCluster::start_sized(dir, placements, pg_num, size, "64M")
    }

    /// As [`start_mixed`](Self::start_mixed), with devices of `device_size` (`--size`).
    pub fn start_sized(
        dir: &Path,
        placements: &[&str],
        pg_num: u32,
        size: u32,
        device_size: &str,
    ) -> OsdCluster {
        let n = placements.len() as u32;
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut c = OsdCluster {
            dir: dir.to_path_buf(),
            map: dir.join("cluster.toml"),
            addrs: vec![any; n as usize],
            peer_addrs: vec![any; n as usize],
            osds: (0..n).map(|_| None).collect(),
            placements: placements.iter().map(|p| p.to_string()).collect(),
            stores: (0..n).map(|_| None).collect(),
            device_size: device_size.to_string(),
        };
        c.write_map(1, pg_num, size);
        for id in 0..n {
            c.start_osd(id, true);
        }
        c.write_map(2, pg_num, size);
        c
    }

    /// Writes the map file with the addresses known so far.
    fn write_map(&self, epoch: u32, pg_num: u32, size: u32) {
        let mut text = format!("epoch = {epoch}\n");
        for (id, p) in self.placements.iter().enumerate() {
            let (a, pa) = (self.addrs[id], self.peer_addrs[id]);
            text += &format!(
                "[[osd]]\nid = {id}\naddr = \"{a}\"\npeer_addr = \"{pa}\"\nweight = 1.0\nplacement = \"{p}\"\n",
            );
        }
        text += &format!("[[pool]]\nid = 1\nname = \"data\"\npg_num = {pg_num}\nsize = {size}\n");
        let tmp = self.dir.join("cluster.toml.new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.map).unwrap();
    }

    /// `dds osd --id ID` (and, for placement dpu, its `dds osd-store` when not running),
    /// once it accepts connections.
    pub fn start_osd(&mut self, id: u32, format: bool) {
        let dev = self.dir.join(format!("osd{id}.img"));
        let mut cmd = Command::new(DDS);
        cmd.args(["osd", "--id", &id.to_string(), "--map"])
            .arg(&self.map)
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("DDS_TEST_OSD_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        if self.placements[id as usize] == "dpu" {
            if self.stores[id as usize].is_none() {
                self.start_store(id, format);
            }
            cmd.args(["--placement", "dpu", "--proxy-socket"])
                .arg(self.store_socket(id));
        } else {
            cmd.arg("--device")
                .arg(&dev)
                .args(["--size", &self.device_size]);
            if format {
                cmd.arg("--format");
            }
        }
        let (g, a, p) = spawn_osd(&mut cmd, &format!("osd {id}"));
        self.osds[id as usize] = Some(g);
        (self.addrs[id as usize], self.peer_addrs[id as usize]) = (a, p);
    }

    fn store_socket(&self, id: u32) -> PathBuf {
        self.dir.join(format!("osd{id}.store.sock"))
    }

    /// `dds osd-store` of a placement-dpu OSD, once its socket exists.
    pub fn start_store(&mut self, id: u32, format: bool) {
        let sock = self.store_socket(id);
        let _ = std::fs::remove_file(&sock);
        let mut st = Command::new(DDS);
        st.arg("osd-store")
            .arg("--device")
            .arg(self.dir.join(format!("osd{id}.img")))
            .arg("--socket")
            .arg(&sock)
            .args(["--size", &self.device_size])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if format {
            st.arg("--format");
        }
        self.stores[id as usize] = Some(Guard(st.spawn().unwrap()));
        wait_for_socket(&sock);
    }

    /// Whether the process of OSD `id` (its front end) still runs.
    pub fn running(&mut self, id: u32) -> bool {
        self.osds[id as usize]
            .as_mut()
            .is_some_and(|g| g.0.try_wait().ok().flatten().is_none())
    }

    /// SIGKILL of one OSD's process (the front end: the DPU process in placement dpu).
    pub fn kill(&mut self, id: u32) {
        drop(self.osds[id as usize].take());
    }

    /// SIGKILL of a placement-dpu OSD's host process (`dds osd-store`).
    pub fn kill_store(&mut self, id: u32) {
        drop(self.stores[id as usize].take());
    }
}

/// Spawns a `dds osd` command and waits for its ready line
/// (`osd.N ready: clients on ADDR, peers on ADDR`); returns it and the two addresses. A
/// loaded machine may take a while to start it; an OSD that exits first fails at once.
pub fn spawn_osd(
    cmd: &mut Command,
    what: &str,
) -> (Guard, std::net::SocketAddr, std::net::SocketAddr) {
    let (mut g, line) = ready_line(cmd);
    match dds_osd::parse_ready_line(&line) {
        Some((a, p)) => (g, a, p),
        None => {
            let status = g.0.try_wait().ok().flatten();
            panic!("{what}: no ready line ({line:?}), exit status {status:?}");
        }
    }
}

/// A single-member etcd (package etcd-server) with its data in `dir`; returns it and its
/// client URL once it answers. etcd cannot report a port it picked, so its two ports are
/// free ones chosen here.
pub fn start_etcd(dir: &Path) -> (Guard, String) {
    let (mut cmd, url) = dds_osd::etcd::local_member(dir).unwrap();
    let etcd = Guard(cmd.spawn().expect("etcd (package etcd-server)"));
    assert!(
        dds_osd::etcd::wait_answers(&url, Duration::from_secs(20)),
        "etcd did not start"
    );
    (etcd, url)
}

/// Waits until the OSDs `osds` answer STATUS with every PG active and clean and the members
/// of each PG at the same head; returns the sum of the primaries' heads (the versions
/// applied).
pub fn osd_wait_clean(c: &dds_osd::client::Client, osds: &[u32]) -> u64 {
    use std::collections::BTreeMap;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut heads: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
        let mut ok = true;
        let mut applied = 0;
        for &o in osds {
            match c.status(o) {
                Ok(s) => {
                    for p in s["pgs"].as_array().unwrap() {
                        ok &= p["active"] == true && p["clean"] == true;
                        let key = (p["pool"].as_u64().unwrap(), p["pg"].as_u64().unwrap());
                        let head = p["head"].as_u64().unwrap();
                        heads.entry(key).or_default().push(head);
                        if p["primary"] == true {
                            applied += head;
                        }
                    }
                }
                Err(_) => ok = false,
            }
        }
        ok &= heads.values().all(|h| h.iter().all(|&x| x == h[0]));
        if ok {
            return applied;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never became clean: {heads:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The seed of a randomized test: `DDS_TEST_SEED` when set (to replay a failure), else one
/// from the clock. Printed either way.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("DDS_TEST_SEED") {
        Ok(s) => s.parse().expect("DDS_TEST_SEED: a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("{test}: seed {seed} (replay with DDS_TEST_SEED={seed})");
    seed
}

/// Asserts that a server process is still running.
pub fn assert_alive(g: &mut Guard, what: &str) {
    if let Some(st) = g.0.try_wait().unwrap() {
        panic!("{what} exited: {st}");
    }
}

/// Random bytes of a length drawn from the boundaries a parser meets (0, 1, around
/// `edges`) or uniformly below `max`.
pub fn random_blob(rng: &mut impl rand::Rng, edges: &[usize], max: usize) -> Vec<u8> {
    let len = match rng.gen_range(0..4) {
        0 => rng.gen_range(0..2),
        1 if !edges.is_empty() => {
            let e = edges[rng.gen_range(0..edges.len())];
            (e + rng.gen_range(0..3)).saturating_sub(1)
        }
        _ => rng.gen_range(0..max.max(1)),
    };
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

/// Hostile clients: each stream of bytes goes to the server at `addr` on a connection of its
/// own (`parallel` at a time), written whole while whatever comes back is read and dropped,
/// until the server closes or says nothing for `quiet`. The server may close at any point:
/// nothing here fails on a reset or a refused write. Returns the bytes the server sent.
pub fn hostile_clients(
    addr: std::net::SocketAddr,
    streams: Vec<Vec<u8>>,
    parallel: usize,
    quiet: Duration,
) -> u64 {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let received = AtomicU64::new(0);
    std::thread::scope(|sc| {
        for _ in 0..parallel.max(1) {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(bytes) = streams.get(k) else {
                    return;
                };
                let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                    continue;
                };
                let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                let _ = s.set_read_timeout(Some(quiet));
                let Ok(mut r) = s.try_clone() else {
                    continue;
                };
                std::thread::scope(|inner| {
                    inner.spawn(move || {
                        let _ = s.write_all(bytes);
                    });
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let mut buf = vec![0u8; 1 << 16];
                    while Instant::now() < deadline {
                        match r.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                received.fetch_add(n as u64, Ordering::Relaxed);
                            }
                        }
                    }
                    let _ = r.shutdown(std::net::Shutdown::Both);
                });
            });
        }
    });
    received.into_inner()
}

/// Spawns a server that binds port 0 (`cmd`, stdout piped) and waits for its ready line:
/// the process and the address it got.
pub fn spawn_listening(cmd: &mut Command) -> (Guard, SocketAddr) {
    let (g, line) = ready_line(cmd);
    assert!(line.contains("ready"), "{line}");
    (g, listening_on(&line))
}

/// Spawns `cmd` with its stdout piped and waits for its first line, which must say `ready`.
pub fn spawn_ready(cmd: &mut Command) -> Guard {
    let (g, line) = ready_line(cmd);
    assert!(line.contains("ready"), "{line}");
    g
}

/// Spawns `cmd` with its stdout piped; returns it and its first line (empty when none came
/// within 30 s). The rest of its stdout is drained, so that it never blocks writing.
pub fn ready_line(cmd: &mut Command) -> (Guard, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let out = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(out).lines();
        let _ = tx.send(lines.next().and_then(|l| l.ok()).unwrap_or_default());
        for _ in lines {}
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    (Guard(child), line)
}

/// The seed map of an etcd cluster of OSDs `0..n` on port 0 (pool 1 "data", 16 PGs, size 3,
/// min_size 2), written in `dir`.
pub fn etcd_seed(dir: &Path, n: u32) -> PathBuf {
    let mut text = String::from("epoch = 1\n");
    for id in 0..n {
        text +=
            &format!("[[osd]]\nid = {id}\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n");
    }
    text += "[[pool]]\nid = 1\nname = \"data\"\npg_num = 16\nsize = 3\nmin_size = 2\n";
    let p = dir.join("seed.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// `dds osd --id ID --etcd URL --cluster t` on port 0 (a new device when `format`), the map
/// seeded with OSDs `0..n` (an id outside joins as a new OSD).
pub fn etcd_osd(dir: &Path, url: &str, n: u32, id: u32, format: bool) -> Guard {
    etcd_osd_with(
        Command::new(DDS),
        dir,
        url,
        n,
        id,
        OsdStore::Device { format },
        None,
    )
}

/// Where a test OSD keeps its objects.
pub enum OsdStore<'a> {
    /// Its own device file, `osd<id>.img` in the test's directory (placement host); formatted
    /// first or not.
    Device { format: bool },
    /// The `dds osd-store` serving this socket (placement dpu: the OSD is its front end).
    Proxy(&'a Path),
}

/// `dds osd-store` of OSD `id` run by `cmd` (`dds`, or `ip netns exec NS dds`) on the formatted
/// device `osd<id>.img` of `dir`, once its socket takes connections; returns it and the socket.
pub fn osd_store_with(mut cmd: Command, dir: &Path, id: u32) -> (Guard, PathBuf) {
    let sock = dir.join(format!("osd{id}.store.sock"));
    cmd.arg("osd-store")
        .arg("--device")
        .arg(dir.join(format!("osd{id}.img")))
        .arg("--socket")
        .arg(&sock)
        .args(["--size", "64M", "--format"])
        .stderr(Stdio::null());
    let (mut g, line) = ready_line(&mut cmd);
    if !line.starts_with("osd-store ready") {
        let status = g.0.try_wait().ok().flatten();
        panic!("osd-store {id}: no ready line ({line:?}), exit status {status:?}");
    }
    (g, sock)
}

/// [`etcd_osd`] run by `cmd` (`dds`, or `ip netns exec NS dds`), its ports bound on `ip`
/// (default 127.0.0.1).
pub fn etcd_osd_with(
    mut cmd: Command,
    dir: &Path,
    url: &str,
    n: u32,
    id: u32,
    store: OsdStore<'_>,
    ip: Option<std::net::Ipv4Addr>,
) -> Guard {
    cmd.args([
        "osd",
        "--id",
        &id.to_string(),
        "--etcd",
        url,
        "--cluster",
        "t",
    ])
    .args(["--etcd-ttl", "2", "--map"])
    .arg(etcd_seed(dir, n))
    .stderr(if std::env::var_os("DDS_TEST_OSD_LOG").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    });
    match store {
        OsdStore::Device { format } => {
            cmd.arg("--device")
                .arg(dir.join(format!("osd{id}.img")))
                .args(["--size", "64M"]);
            if format {
                cmd.arg("--format");
            }
        }
        OsdStore::Proxy(sock) => {
            cmd.args(["--placement", "dpu", "--proxy-socket"]).arg(sock);
        }
    }
    if let Some(ip) = ip {
        cmd.arg("--addr")
            .arg(format!("{ip}:0"))
            .arg("--peer-addr")
            .arg(format!("{ip}:0"));
    }
    spawn_osd(&mut cmd, &format!("osd {id}")).0
}

/// Waits until the client's map (watched in etcd) says `want(map)`.
pub fn wait_map(
    c: &dds_osd::client::Client,
    what: &str,
    want: impl Fn(&dds_osd::ClusterMap) -> bool,
) -> dds_osd::ClusterMap {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = c.map();
        if want(&m) {
            return (*m).clone();
        }
        assert!(Instant::now() < deadline, "{what}: map {m:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// etcd and OSDs `0..n` in etcd mode (fresh devices in `dir`), with a client of the cluster
/// once every OSD is up with its ports and every PG clean.
pub struct EtcdOsds {
    pub etcd: Guard,
    pub url: String,
    pub osds: Vec<Option<Guard>>,
    pub client: std::sync::Arc<dds_osd::client::Client>,
}

pub fn start_etcd_osds(dir: &Path, n: u32) -> EtcdOsds {
    let (etcd, url) = start_etcd(dir);
    let osds = (0..n)
        .map(|id| Some(etcd_osd(dir, &url, n, id, true)))
        .collect();
    let opts = dds_osd::client::ClientOptions {
        retry_for: Duration::from_secs(30),
        io_timeout: Duration::from_secs(10),
        ..dds_osd::client::ClientOptions::default()
    };
    let client =
        std::sync::Arc::new(dds_osd::client::Client::connect_etcd(&url, "t", opts).unwrap());
    wait_map(&client, "every OSD up with its ports", |m| {
        m.osds.iter().all(|o| o.up && o.addressed())
    });
    osd_wait_clean(&client, &(0..n).collect::<Vec<_>>());
    EtcdOsds {
        etcd,
        url,
        osds,
        client,
    }
}

/// The content of object `obj-{i}` in the cluster tests' workloads.
pub fn object_content(i: u64) -> Vec<u8> {
    format!("object {i} ")
        .repeat(1 + (i % 50) as usize)
        .into_bytes()
}

/// One write of [`Writers`]: its object, when it started and when it was acknowledged
/// (`None`: failed).
pub struct ObjectWrite {
    pub i: u64,
    pub started: Instant,
    pub acked: Option<Instant>,
}

/// Writers of a cluster test: each writes objects `obj-{i}` (writer `w` of `n` the `i` with
/// `i % n == w`), one op in flight, each object once, until finished.
pub struct Writers {
    pub writes: std::sync::Arc<std::sync::Mutex<Vec<ObjectWrite>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Writers {
    pub fn start(cl: &std::sync::Arc<dds_osd::client::Client>, n: u64) -> Writers {
        use std::sync::atomic::Ordering;
        let writes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|w| {
                let (cl, writes, stop) = (cl.clone(), writes.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut i = w;
                    while !stop.load(Ordering::SeqCst) {
                        let oid = dds_objstore::ObjectId::new(1, format!("obj-{i}"));
                        let started = Instant::now();
                        let r = cl.write_full(&oid, &object_content(i));
                        if let Err(e) = &r {
                            eprintln!("obj-{i}: {e}");
                        }
                        let acked = r.is_ok().then(Instant::now);
                        writes
                            .lock()
                            .unwrap()
                            .push(ObjectWrite { i, started, acked });
                        i += n;
                    }
                })
            })
            .collect();
        Writers {
            writes,
            stop,
            threads,
        }
    }

    /// Stops the writers; returns every write made.
    pub fn finish(self) -> Vec<ObjectWrite> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        std::mem::take(&mut *self.writes.lock().unwrap())
    }
}

/// The OSD (of `0..n`) that leads the most PGs of `map`, and those PGs.
pub fn busiest_primary(map: &dds_osd::ClusterMap, n: u32) -> (u32, Vec<dds_osd::PgId>) {
    busiest_primary_among(map, 0..n)
}

/// [`busiest_primary`] among the OSDs `among`.
pub fn busiest_primary_among(
    map: &dds_osd::ClusterMap,
    among: impl IntoIterator<Item = u32>,
) -> (u32, Vec<dds_osd::PgId>) {
    let pgs: Vec<_> = map.all_pgs().collect();
    let victim = among
        .into_iter()
        .max_by_key(|&o| pgs.iter().filter(|&&pg| map.acting(pg)[0] == o).count())
        .unwrap();
    let led = pgs
        .into_iter()
        .filter(|&pg| map.acting(pg)[0] == victim)
        .collect();
    (victim, led)
}

/// Every write acknowledged, each object's content on each of OSDs `0..n` (read locally).
pub fn check_writes_on_every_replica(cl: &dds_osd::client::Client, n: u32, writes: &[ObjectWrite]) {
    let failed: Vec<u64> = writes
        .iter()
        .filter(|w| w.acked.is_none())
        .map(|w| w.i)
        .collect();
    assert!(failed.is_empty(), "writes failed: {failed:?}");
    for o in 0..n {
        let v = cl.on(o);
        for w in writes {
            let oid = dds_objstore::ObjectId::new(1, format!("obj-{}", w.i));
            let got = v
                .read_full(&oid)
                .unwrap_or_else(|e| panic!("osd {o} obj-{}: {e}", w.i));
            assert!(
                got == object_content(w.i),
                "osd {o} obj-{}: wrong data",
                w.i
            );
        }
    }
}
