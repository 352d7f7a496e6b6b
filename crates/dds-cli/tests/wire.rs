//! The DPU in the wire (`docs/bump-in-the-wire.md`): client, DPU and host namespaces; `dds
//! dpu --steer` in the DPU's installs the flow rules of its signature (the host's address,
//! port 6379) and `dds kv` listens on the host's own address. An unchanged `redis-cli -h
//! <host address>` in the clients' namespace is served through the director; a TCP flow to
//! another port, a UDP flow to port 6379 and a ping reach the host and never the director.
//! `kill -9`
//! of the DPU: steered connections are refused, the other flows go on; a restarted DPU
//! with a changed signature replaces the old rules with its own, and with the host application
//! restarted on it the acknowledged value reads back. A DPU stopped cleanly removes its rules,
//! and removing the topology leaves no namespace behind.
//!
//! Needs root, iproute2 and nftables; where they are missing the test says so and passes
//! without running.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{director_of, dpu_stats, format_device, ready_line, spawn_listening, Guard, DDS};
use dds_netns::wire::{Topology, HOST_ADDR};

const SIGNATURE: &str = "0.0.0.0/0:0 10.78.2.2/32:6379 tcp";
/// The restarted DPU's: only the clients' subnet.
const CLIENTS_ONLY: &str = "10.78.1.0/24:0 10.78.2.2/32:6379 tcp";

fn start_dpu(t: &Topology, img: &Path, socket: &Path, signature: &str) -> (Guard, SocketAddr) {
    let mut cmd = t.on_dpu(DDS);
    cmd.args(["dpu", "--json", "--device"])
        .arg(img)
        .arg("--socket")
        .arg(socket)
        .args(["--offload", "redis", "--director-listen", "0.0.0.0:0"])
        .args(["--steer", "--signature", signature])
        .stderr(if std::env::var_os("DDS_TEST_DPU_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    let (g, line) = ready_line(&mut cmd);
    (g, director_of(&line))
}

fn start_kv(t: &Topology, socket: &Path) -> Guard {
    let mut cmd = t.on_host(DDS);
    cmd.args(["kv", "--listen", &format!("{HOST_ADDR}:6379"), "--socket"])
        .arg(socket)
        .args(["--log-size", "64M", "--page-size", "4M", "--memory", "16M"])
        .args(["--durability", "fsync"])
        .stderr(Stdio::null());
    let (g, addr) = spawn_listening(&mut cmd);
    assert_eq!(addr, SocketAddr::from((HOST_ADDR, 6379)));
    g
}

/// `redis-cli -h <host> ARGS` in the clients' namespace: its stdout, or its stderr on failure.
fn redis_cli(t: &Topology, args: &[&str]) -> Result<String, String> {
    let out = t
        .on_client("redis-cli")
        .args(["-h", &HOST_ADDR.to_string(), "-p", "6379"])
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools)");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    );
    // redis-cli reports a failed connection on stdout or stderr, and exits 0 or 1.
    if out.status.success() && !o.contains("Could not connect") && !o.starts_with("Error") {
        Ok(o)
    } else {
        Err(format!("{o} {e}"))
    }
}

fn director_counter(socket: &Path, name: &str) -> u64 {
    dpu_stats(socket)["offload"]["directors"][0][name]
        .as_u64()
        .unwrap_or_else(|| panic!("director counter {name}: {}", dpu_stats(socket)))
}

/// A TCP line echo on the host's port 7000 and a UDP echo on its port 6379, in the host's
/// namespace, serving `n` exchanges of each.
fn host_echoes(t: &Topology, n: usize) -> std::thread::JoinHandle<()> {
    let ns = t.host_ns();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        dds_netns::enter(&ns).unwrap();
        let tcp = TcpListener::bind((HOST_ADDR, 7000)).unwrap();
        let udp = UdpSocket::bind((HOST_ADDR, 6379)).unwrap();
        tx.send(()).unwrap();
        for _ in 0..n {
            let (s, _) = tcp.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            (&s).write_all(line.as_bytes()).unwrap();
            let mut b = [0u8; 64];
            let (len, from) = udp.recv_from(&mut b).unwrap();
            udp.send_to(&b[..len], from).unwrap();
        }
    });
    rx.recv().unwrap();
    h
}

/// One TCP and one UDP exchange with the host's echoes, from the clients' namespace (the
/// calling thread is in it).
fn bypass_flows(round: u32) {
    let mut s = TcpStream::connect((HOST_ADDR, 7000)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let msg = format!("tcp {round}\n");
    s.write_all(msg.as_bytes()).unwrap();
    let mut back = String::new();
    BufReader::new(&s).read_line(&mut back).unwrap();
    assert_eq!(back, msg, "TCP to another port reaches the host");
    let u = UdpSocket::bind("0.0.0.0:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let msg = format!("udp {round}");
    u.send_to(msg.as_bytes(), (HOST_ADDR, 6379)).unwrap();
    let mut b = [0u8; 64];
    let len = u.recv(&mut b).unwrap();
    assert_eq!(
        &b[..len],
        msg.as_bytes(),
        "UDP to the signature's port reaches the host"
    );
}

#[test]
fn steered_flows_reach_the_director_and_the_others_the_host() {
    if let Err(e) = dds_netns::wire::steering_available() {
        eprintln!("network namespaces or flow rules unavailable here ({e}): skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = format!("w{}", std::process::id() % 1_000_000);
    let t = Topology::create(&name).unwrap();
    let namespaces = [t.client_ns(), t.dpu_ns(), t.host_ns()];
    let img = format_device(dir.path(), "256M");
    let socket = dir.path().join("dpu.sock");

    let (mut dpu, director) = start_dpu(&t, &img, &socket, SIGNATURE);
    let rules = t.rules().expect("flow rules installed");
    assert!(
        rules.contains(&format!("tproxy to :{}", director.port())),
        "{rules}"
    );
    let mut kv = start_kv(&t, &socket);

    // Unchanged clients, addressing the host.
    assert_eq!(redis_cli(&t, &["set", "k", "v1"]).unwrap(), "OK");
    assert_eq!(redis_cli(&t, &["get", "k"]).unwrap(), "v1");
    let split = director_counter(&socket, "split");
    assert_eq!(split, 2, "both redis-cli connections split by the director");

    // Flows outside the signature: the director never sees them.
    let echoes = host_echoes(&t, 2);
    dds_netns::enter(&t.client_ns()).unwrap();
    let accepted = director_counter(&socket, "accepted");
    bypass_flows(1);
    let ping = t
        .on_client("ping")
        .args(["-c", "2", "-W", "5", &HOST_ADDR.to_string()])
        .output()
        .expect("ping (package iputils-ping)");
    assert!(
        ping.status.success(),
        "ICMP to the host: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    assert_eq!(
        director_counter(&socket, "accepted"),
        accepted,
        "a flow outside the signature reached the director"
    );

    // The DPU dies: steered connections are refused, the other flows go on.
    drop(dpu);
    let e = redis_cli(&t, &["get", "k"]).unwrap_err();
    assert!(e.contains("refused"), "{e}");
    bypass_flows(2);
    echoes.join().unwrap();

    // Back: the rules are replaced, and the host application restarted on the new DPU
    // serves the acknowledged value.
    drop(kv);
    let (d2, director2) = start_dpu(&t, &img, &socket, CLIENTS_ONLY);
    dpu = d2;
    let rules = t.rules().expect("flow rules installed again");
    assert_eq!(rules.matches("tproxy").count(), 1, "{rules}");
    assert!(rules.contains("ip saddr 10.78.1.0/24"), "{rules}");
    assert!(
        !rules.contains("0.0.0.0/0"),
        "the old signature's rules are gone: {rules}"
    );
    assert!(
        rules.contains(&format!("tproxy to :{}", director2.port())),
        "{rules}"
    );
    kv = start_kv(&t, &socket);
    assert_eq!(redis_cli(&t, &["get", "k"]).unwrap(), "v1");

    // A clean stop removes the rules.
    let st = Command::new("kill")
        .args(["-TERM", &dpu.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(dpu.0.wait().unwrap().success());
    assert_eq!(t.rules(), None, "rules left after the DPU stopped");
    drop(kv);
    t.remove().unwrap();
    for ns in namespaces {
        assert!(!dds_netns::ns_exists(&ns), "namespace {ns} left behind");
    }
}
