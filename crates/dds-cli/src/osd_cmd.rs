//! `dds osd`: an object storage daemon of a cluster map; `dds objects`: its client commands
//! (`docs/osd-protocol.md`).

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use dds_objstore::ObjectId;
use dds_osd::client::Client;
use dds_osd::{open_store, ClusterMap, Osd, OsdConfig, StoreSpec};

use crate::util::parse_size;

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
    /// Cluster map file (TOML).
    #[arg(long)]
    map: PathBuf,
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
}

pub fn run_osd(a: OsdArgs) -> Result<()> {
    let map = ClusterMap::load(&a.map)?;
    let me = map
        .osd(a.id)
        .ok_or_else(|| anyhow!("osd {} is not in {}", a.id, a.map.display()))?;
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
        },
    };
    let store = open_store(&spec)?;
    let mut cfg = OsdConfig::new(a.id, map);
    cfg.max_payload = u32::try_from(a.max_frame).context("--max-frame above 4 GiB")?;
    cfg.frame_memory = a.frame_memory;
    cfg.max_connections = a.max_connections;
    let osd = Osd::start(cfg, store).context("starting the OSD")?;
    println!(
        "osd.{} ready: clients on {}, peers on {}",
        a.id,
        osd.client_addr(),
        osd.peer_addr()
    );
    std::io::stdout().flush()?;
    osd.wait();
    Ok(())
}

#[derive(Args, Debug)]
pub struct ObjectsArgs {
    /// Cluster map file (TOML).
    #[arg(long, global = true, default_value = "cluster.toml")]
    map: PathBuf,
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
}

pub fn run_objects(a: ObjectsArgs) -> Result<()> {
    let client = Client::connect_map(&a.map)?;
    let pool = client
        .map()
        .find_pool(&a.pool)
        .ok_or_else(|| anyhow!("no pool {} in {}", a.pool, a.map.display()))?
        .id;
    let oid = |name: &str| ObjectId::new(pool, name.as_bytes());
    match a.cmd {
        ObjectsCmd::Put { name, file } => {
            let data = match file {
                Some(f) => std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?,
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
                Some(f) => {
                    std::fs::write(&f, data).with_context(|| format!("writing {}", f.display()))?
                }
                None => std::io::stdout().write_all(&data)?,
            }
        }
        ObjectsCmd::Stat { name } => {
            let st = client.stat(&oid(&name))?;
            println!("{name} size {} mtime_ns {}", st.size, st.mtime_ns);
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
    }
    Ok(())
}
