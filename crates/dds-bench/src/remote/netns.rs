//! `dds bench remote --topology netns`: the three modes through the DPU in the wire
//! (`docs/bump-in-the-wire.md`). The host server listens on the host's own address in the
//! host's namespace, `dds dpu` runs in the DPU's, and the load client (this process's thread)
//! in the clients'; in mode (c) the DPU steers the server's flows to its director with flow
//! rules (`--steer`), and the clients address the host as in modes (a) and (b). During mode
//! (c), a TCP flow to another port of the host and a UDP flow to the server's port are
//! exchanged, and the director's `accepted` counter before and after says whether any reached
//! it.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};

use dds_netns::wire::{Topology, HOST_ADDR};

use super::*;

/// The namespaces of a netns run.
#[derive(Clone, Debug)]
pub(super) struct NsPlan {
    pub host: String,
    pub dpu: String,
}

/// The host server's address in the host's namespace: a port given explicitly, which is
/// free there (the namespace is the run's own), so that the signature can name it.
pub(super) const SERVER: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 78, 2, 2), 6000));
/// The host's port of the flows outside the signature.
const OTHER_PORT: u16 = 7000;

/// What a netns run measured: its points (modes `netns-a`, `netns-b`, `netns-c`), the
/// director's counters at the DPU's exit, and the flows outside the signature that reached
/// the director.
pub(super) struct NetnsRun {
    pub points: Vec<Value>,
    pub director: Value,
    pub bypass_seen: u64,
}

/// Runs the three modes through a topology of the run's own (removed at the end, whatever
/// happens).
pub(super) fn run(a: &RemoteArgs, plan: &Plan, place: &Placement, work: &Path) -> Result<NetnsRun> {
    dds_netns::wire::steering_available()
        .map_err(|e| anyhow!("--topology netns: network namespaces or flow rules: {e}"))?;
    let topo = Topology::create(&format!("rb{}", std::process::id() % 100_000))
        .context("--topology netns: making the namespaces")?;
    let mut plan = plan.clone();
    plan.ns = Some(NsPlan {
        host: topo.host_ns(),
        dpu: topo.dpu_ns(),
    });
    let client_ns = topo.client_ns();
    let work = work.join("netns");
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    // The load client runs on a thread of the clients' namespace (the threads it starts
    // inherit it); this thread stays where it was.
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            dds_netns::enter(&client_ns).context("enter the clients' namespace")?;
            run_in(a, &plan, place, &work)
        })
        .join()
        .map_err(|_| anyhow!("the netns run panicked"))?
    });
    drop(topo);
    r
}

fn run_in(a: &RemoteArgs, plan: &Plan, place: &Placement, work: &Path) -> Result<NetnsRun> {
    let ns = plan.ns.as_ref().expect("a netns plan");
    eprintln!(
        "dds bench remote --topology netns: {EMULATION_NOTE}; clients, DPU and host in network \
         namespaces, the DPU's the only path between the others."
    );
    let mut points = Vec::new();
    let DdsSetup {
        dpu_args: mut args,
        where_b,
        socket,
    } = run_a_and_b(a, plan, place, work, "netns-", Some(&ns.dpu), &mut points)?;
    offload_dpu_args(&mut args, false).map_err(|NotAvailable(why)| anyhow!(why))?;
    // The director listens transparently on every address (the flow rules bring it the
    // connections to the host's).
    let at = args
        .iter()
        .position(|x| x == "--director-listen")
        .context("offload_dpu_args gives --director-listen")?;
    args[at + 1] = "0.0.0.0:0".into();
    args.extend([
        "--steer".to_string(),
        "--signature".to_string(),
        format!("0.0.0.0/0:0 {HOST_ADDR}/32:{} tcp", SERVER.port()),
    ]);
    let (mut dpu, stats, _) = start_dpu(&args, Some(&ns.dpu))?;
    let bypass = bypass_flows(&ns.host, &socket);
    let r = run_mode(
        "netns-c",
        "dds",
        &where_b,
        plan,
        Some(&dpu),
        Front::Host,
        false,
        &mut points,
    );
    let _ = dpu.stop(STOP_GRACE);
    let line = stats.join().ok().flatten();
    r?;
    Ok(NetnsRun {
        points,
        director: parse_director_stats(line.as_deref()),
        bypass_seen: bypass?,
    })
}

/// The director's `accepted` counter (`dds stats --json`).
fn accepted(socket: &Path) -> Result<u64> {
    let out = dds_command(
        &[
            "stats".into(),
            "--json".into(),
            "--socket".into(),
            socket.display().to_string(),
        ],
        None,
        None,
    )?
    .output()?;
    let v: Value = serde_json::from_slice(&out.stdout).context("dds stats --json")?;
    v["offload"]["directors"]
        .as_array()
        .map(|d| d.iter().filter_map(|x| x["accepted"].as_u64()).sum())
        .context("dds stats: no director counters")
}

/// Flows outside the signature, from the clients' namespace (the calling thread's) to the
/// host: 16 TCP connections to another port and 16 UDP datagrams to the server's port, each
/// echoed by the host. Returns the connections the director accepted meanwhile.
fn bypass_flows(host_ns: &str, socket: &Path) -> Result<u64> {
    const N: usize = 16;
    let before = accepted(socket)?;
    let host_ns = host_ns.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let echo = std::thread::spawn(move || -> Result<()> {
        dds_netns::enter(&host_ns)?;
        let tcp = TcpListener::bind((HOST_ADDR, OTHER_PORT))?;
        let udp = UdpSocket::bind(SERVER)?;
        udp.set_read_timeout(Some(Duration::from_secs(10)))?;
        let _ = tx.send(());
        for _ in 0..N {
            let (s, _) = tcp.accept()?;
            let mut b = [0u8; 16];
            let n = std::io::Read::read(&mut &s, &mut b)?;
            std::io::Write::write_all(&mut &s, &b[..n])?;
            let (n, from) = udp.recv_from(&mut b)?;
            udp.send_to(&b[..n], from)?;
        }
        Ok(())
    });
    rx.recv_timeout(Duration::from_secs(10))
        .context("the host's echo did not start")?;
    for i in 0..N {
        let msg = format!("bypass {i}");
        let mut s = TcpStream::connect((HOST_ADDR, OTHER_PORT))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        std::io::Write::write_all(&mut s, msg.as_bytes())?;
        let mut b = [0u8; 16];
        let n = std::io::Read::read(&mut s, &mut b)?;
        anyhow::ensure!(&b[..n] == msg.as_bytes(), "TCP echo through the DPU");
        let u = UdpSocket::bind("0.0.0.0:0")?;
        u.set_read_timeout(Some(Duration::from_secs(10)))?;
        u.send_to(msg.as_bytes(), SERVER)?;
        let n = u.recv(&mut b)?;
        anyhow::ensure!(&b[..n] == msg.as_bytes(), "UDP echo through the DPU");
    }
    echo.join()
        .map_err(|_| anyhow!("the host's echo panicked"))??;
    Ok(accepted(socket)? - before)
}
