//! `dds osd`: an object storage daemon of a cluster map; `dds objects`: its client commands
//! (`docs/osd-protocol.md`).

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use dds_objstore::ObjectId;
use dds_osd::client::Client;
use dds_osd::{open_store, ClusterMap, Osd, OsdConfig, StoreSpec};

use crate::dpu_cmd::{parse_cpus, parse_on_off, CpuList, DpuProfileArgs};
use crate::util::{exit, fmt_utc, parse_size, Failure};
use dds_proto::units::fmt_bytes;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum PlacementArg {
    /// Front end and object store in this process.
    Host,
    /// Front end here (the DPU), object store in a host process behind the proxy.
    Dpu,
}

#[derive(Args, Debug)]
pub struct OsdArgs {
    /// This OSD's id in the map.
    #[arg(long)]
    id: u32,
    /// Cluster map file (TOML), reread every 200 ms; with --etcd: the seed of the map when
    /// etcd holds none.
    #[arg(long, required_unless_present = "etcd")]
    map: Option<PathBuf>,
    /// etcd endpoint (http://IP:PORT): the map lives there and etcd is the monitor.
    #[arg(long, requires = "cluster")]
    etcd: Option<String>,
    /// Cluster name (the etcd key prefix /dds/osd/NAME/).
    #[arg(long)]
    cluster: Option<String>,
    /// Seconds of the OSD's etcd lease (how long a dead OSD stays up in the map).
    #[arg(long, default_value_t = 3)]
    etcd_ttl: u64,
    /// Client address to bind (default: the map's, or 127.0.0.1:0 with --etcd; port 0: any).
    #[arg(long)]
    addr: Option<std::net::SocketAddr>,
    /// Peer address to bind (default: the map's, or 127.0.0.1:0 with --etcd; port 0: any).
    #[arg(long)]
    peer_addr: Option<std::net::SocketAddr>,
    /// Device file of the object store (placement host).
    #[arg(long)]
    device: Option<PathBuf>,
    /// Format the device first (created and preallocated at --size).
    #[arg(long)]
    format: bool,
    /// With --format: overwrite a formatted device.
    #[arg(long, requires = "format")]
    force: bool,
    /// Device size for --format.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Where the front end runs relative to the store (default: the map's placement).
    #[arg(long, value_enum)]
    placement: Option<PlacementArg>,
    /// Socket of the host-side store proxy (placement dpu).
    #[arg(long)]
    proxy_socket: Option<PathBuf>,
    /// Largest frame payload accepted.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    max_frame: u64,
    /// Memory for frame payloads of all connections together.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    frame_memory: u64,
    /// Connections per port.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Placement dpu: largest DMA transfer (Flow-Adapt).
    #[arg(long, default_value = "2M", value_parser = parse_size)]
    max_dma: u64,
    /// Placement dpu: batching of small transactions (Flow-Adapt), on or off.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    batching: bool,
    /// Placement dpu: chunk pipelining of large transactions and reads (Flow-Adapt), on or off.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    chunking: bool,
    /// Placement dpu: emulated PCIe cost of DMA operations, on or off.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    dma_cost: bool,
    /// The DPU resource profile of the front end (placement dpu).
    #[command(flatten)]
    profile: DpuProfileArgs,
}

#[derive(Args, Debug)]
pub struct OsdStoreArgs {
    /// Device file of the object store.
    #[arg(long)]
    device: PathBuf,
    /// Socket the DPU's front end attaches to (created mode 0600).
    #[arg(long)]
    socket: PathBuf,
    /// Format the device first (created and preallocated at --size).
    #[arg(long)]
    format: bool,
    /// With --format: overwrite a formatted device.
    #[arg(long, requires = "format")]
    force: bool,
    /// Device size for --format.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// DPU sessions served at once.
    #[arg(long, default_value_t = 16)]
    max_sessions: usize,
    /// Microseconds a channel worker polls without finding a transfer before it parks on
    /// its doorbell (0: park at once)
    #[arg(long, default_value_t = 10)]
    spin_us: u64,
    /// CPUs of this process (the host's share of the machine).
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<CpuList>,
    /// Host CPU budget of this process in cores (cgroup quota).
    #[arg(long)]
    cpu_quota: Option<f64>,
}

/// Runs the host half of a placement-dpu OSD until SIGTERM/SIGINT.
pub fn run_osd_store(a: OsdStoreArgs) -> Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let mut applied = dds_dpu::profile::ResourceProfile {
        cpus: a.cpus.as_ref().map(|c| c.0.clone()),
        cpu_quota: a.cpu_quota,
        memory_bytes: None,
    }
    .apply()
    .context("apply the host CPU budget")?;
    if a.format {
        dds_objstore::ObjStore::format(&a.device, a.size, a.force)
            .with_context(|| format!("format {}", a.device.display()))?;
    }
    let store = std::sync::Arc::new(
        dds_objstore::ObjStore::open(&a.device)
            .with_context(|| format!("open {}", a.device.display()))?,
    );
    let handle = dds_objproxy::HostProxy::serve(
        store,
        &a.socket,
        dds_objproxy::HostOptions {
            max_sessions: a.max_sessions,
            spin: std::time::Duration::from_micros(a.spin_us),
            ..Default::default()
        },
    )
    .with_context(|| format!("serve on {}", a.socket.display()))?;
    println!(
        "osd-store ready: {} on {}",
        a.device.display(),
        a.socket.display()
    );
    std::io::stdout().flush()?;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    handle.stop();
    applied.remove();
    Ok(())
}

pub fn run_osd(a: OsdArgs) -> Result<()> {
    let seed = a.map.as_ref().map(ClusterMap::load).transpose()?;
    let etcd = a.etcd.as_deref().map(|url| {
        let keys = dds_osd::monitor::Keys::new(a.cluster.as_deref().unwrap_or_default());
        (dds_osd::etcd::Etcd::new(url), keys)
    });
    let (map, source) = match &etcd {
        Some((etcd, keys)) => (
            dds_osd::monitor::load_or_seed(etcd, keys, seed.as_ref())?,
            format!("etcd {} cluster {}", etcd.url(), keys.cluster),
        ),
        None => (
            seed.expect("--map is required without --etcd"),
            a.map.as_ref().expect("checked").display().to_string(),
        ),
    };
    let mut map = map;
    if etcd.is_some() && map.osd(a.id).is_none() {
        // A new OSD joining: it holds no PG until the monitor's next map adds it (weight 1).
        map.osds.push(dds_osd::OsdInfo {
            id: a.id,
            addr: ([127, 0, 0, 1], 0).into(),
            peer_addr: ([127, 0, 0, 1], 0).into(),
            weight: 0.0,
            placement: match a.placement {
                Some(PlacementArg::Dpu) => dds_osd::Placement::Dpu,
                _ => dds_osd::Placement::Host,
            },
            up: true,
        });
    }
    let me = map
        .osd(a.id)
        .ok_or_else(|| anyhow!("osd {} is not in the map of {source}", a.id))?;
    let placement = a.placement.unwrap_or(match me.placement {
        dds_osd::Placement::Host => PlacementArg::Host,
        dds_osd::Placement::Dpu => PlacementArg::Dpu,
    });
    let spec = match placement {
        PlacementArg::Host => StoreSpec::Local {
            device: a
                .device
                .clone()
                .context("--device is required with placement host")?,
            format: a.format.then_some((a.size, a.force)),
        },
        PlacementArg::Dpu => StoreSpec::Proxy {
            socket: a
                .proxy_socket
                .clone()
                .context("--proxy-socket is required with placement dpu")?,
            options: dds_objproxy::ProxyOptions {
                max_dma: usize::try_from(a.max_dma).context("--max-dma")?,
                batching: a.batching,
                chunking: a.chunking,
                cost_model: a.dma_cost.then(dds_dma::CostModel::bluefield2),
                ..dds_objproxy::ProxyOptions::default()
            },
        },
    };
    // The front end of placement dpu runs under the DPU's resource profile.
    let mut applied = if placement == PlacementArg::Dpu {
        Some(a.profile.apply()?)
    } else {
        None
    };
    let store = open_store(&spec)?;
    let any: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
    let bind = match (&etcd, a.addr, a.peer_addr) {
        (None, None, None) => None,
        (None, c, p) => Some((c.unwrap_or(me.addr), p.unwrap_or(me.peer_addr))),
        (Some(_), c, p) => Some((c.unwrap_or(any), p.unwrap_or(any))),
    };
    let placement_of_map = match placement {
        PlacementArg::Host => dds_osd::Placement::Host,
        PlacementArg::Dpu => dds_osd::Placement::Dpu,
    };
    let mut cfg = OsdConfig::new(a.id, map);
    cfg.bind = bind;
    cfg.max_payload = u32::try_from(a.max_frame).context("--max-frame above 4 GiB")?;
    cfg.frame_memory = a.frame_memory;
    cfg.max_connections = a.max_connections;
    // Registered before it serves: SIGTERM or Ctrl-C closes the ports and the connections,
    // then the OSD exits 0.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let osd = Osd::start(cfg, store).context("starting the OSD")?;
    let membership = match etcd {
        Some((etcd, keys)) => {
            let alive = dds_osd::monitor::Alive {
                addr: osd.client_addr(),
                peer_addr: osd.peer_addr(),
                placement: placement_of_map,
            };
            Some(
                dds_osd::monitor::join(osd.maps(), etcd, keys, a.etcd_ttl.max(1), alive)
                    .context("joining the cluster in etcd")?,
            )
        }
        None => {
            dds_osd::monitor::follow_file(osd.maps(), a.map.clone().expect("checked"))?;
            None
        }
    };
    println!(
        "{}",
        dds_osd::ready_line(a.id, osd.client_addr(), osd.peer_addr())
    );
    std::io::stdout().flush()?;
    if let Some(sig) = signals.forever().next() {
        tracing::info!(sig, "shutting down");
    }
    // Marked down at once rather than when the lease expires.
    if let Some(m) = membership {
        m.leave();
    }
    osd.shutdown();
    if let Some(p) = applied.as_mut() {
        p.remove();
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct ObjectsArgs {
    /// Cluster map file (TOML).
    #[arg(long, global = true, default_value = "cluster.toml")]
    map: PathBuf,
    /// etcd endpoint holding the map (instead of --map).
    #[arg(long, global = true, requires = "cluster")]
    etcd: Option<String>,
    /// Cluster name in etcd.
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// Pool id or name.
    #[arg(long, global = true, default_value = "1")]
    pool: String,
    #[command(subcommand)]
    cmd: ObjectsCmd,
}

#[derive(Subcommand, Debug)]
enum ObjectsCmd {
    /// Store FILE (or stdin) as object NAME.
    Put { name: String, file: Option<PathBuf> },
    /// Write object NAME to FILE (or stdout).
    Get { name: String, file: Option<PathBuf> },
    /// Print size and mtime of object NAME.
    Stat { name: String },
    /// List the pool's objects.
    Ls,
    /// Remove object NAME.
    Rm { name: String },
    /// Set an OSD's weight (etcd mode): 0 takes it out (its PGs move to the others), 1 puts
    /// it back.
    Reweight { id: u32, weight: f64 },
    /// The cluster's health (like `ceph -s`): OSDs up and in, PGs active+clean, degraded,
    /// recovering, inactive, objects to recover.
    Status {
        /// Print the counts as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run_objects(a: ObjectsArgs) -> Result<()> {
    let r = objects(a);
    if let Err(e) = &r {
        if crate::util::exit_code(e) == exit::UNREACHABLE {
            return r.context(
                "no OSD answered for this object: start the map's OSDs (`dds osd --id N --map \
                 FILE`) or check the addresses in the map",
            );
        }
    }
    r
}

/// A local file that could not be read or written (exit status 4).
fn local(what: &str, f: &std::path::Path, e: std::io::Error) -> anyhow::Error {
    Failure::new(exit::LOCAL, format!("{what} {}: {e}", f.display())).into()
}

/// A client of the cluster whose map is in etcd at `etcd` (under `cluster`), else in the file
/// `map`.
pub fn cluster_client(
    map: &std::path::Path,
    etcd: Option<&str>,
    cluster: Option<&str>,
) -> Result<Client> {
    Ok(match etcd {
        Some(url) => Client::connect_etcd(url, cluster.unwrap_or_default(), Default::default())?,
        None => Client::connect_map(map)?,
    })
}

fn objects(a: ObjectsArgs) -> Result<()> {
    let client = cluster_client(&a.map, a.etcd.as_deref(), a.cluster.as_deref())?;
    let pool = client
        .map()
        .find_pool(&a.pool)
        .ok_or_else(|| anyhow!("no pool {} in the map", a.pool))?
        .id;
    let oid = |name: &str| ObjectId::new(pool, name.as_bytes());
    match a.cmd {
        ObjectsCmd::Put { name, file } => {
            let data = match file {
                Some(f) => std::fs::read(&f).map_err(|e| local("read", &f, e))?,
                None => {
                    let mut v = Vec::new();
                    std::io::stdin().read_to_end(&mut v)?;
                    v
                }
            };
            client.write_full(&oid(&name), &data)?;
        }
        ObjectsCmd::Get { name, file } => {
            let data = client.read_full(&oid(&name))?;
            match file {
                Some(f) => std::fs::write(&f, data).map_err(|e| local("write", &f, e))?,
                None => std::io::stdout().write_all(&data)?,
            }
        }
        ObjectsCmd::Stat { name } => {
            let st = client.stat(&oid(&name))?;
            println!(
                "{name}: size {} ({} bytes), modified {}",
                fmt_bytes(st.size),
                st.size,
                fmt_utc(st.mtime_ns)
            );
        }
        ObjectsCmd::Ls => {
            let mut out = std::io::stdout().lock();
            for n in client.list(pool)? {
                out.write_all(&n)?;
                out.write_all(b"\n")?;
            }
        }
        ObjectsCmd::Rm { name } => {
            client.remove(&oid(&name))?;
        }
        ObjectsCmd::Reweight { id, weight } => {
            let url = a
                .etcd
                .as_deref()
                .context("reweight changes the map in etcd: give --etcd and --cluster")?;
            let keys = dds_osd::monitor::Keys::new(a.cluster.as_deref().unwrap_or_default());
            let map =
                dds_osd::monitor::reweight(&dds_osd::etcd::Etcd::new(url), &keys, id, weight)?;
            println!("osd {id}: weight {weight} in map epoch {}", map.epoch);
        }
        ObjectsCmd::Status { json } => {
            let st = dds_osd::health::cluster_status(&client);
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print!("{}", dds_osd::health::render(&st));
            }
        }
    }
    Ok(())
}
