//! `dds nbd`: a Network Block Device server whose exports are DDS files (`docs/nbd.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use dds_nbd::{ExportSpec, NbdConfig, NbdServer};

use crate::util::{open_storage, parse_size, StorageArg};

#[derive(Args, Debug)]
pub struct NbdArgs {
    /// Options from a TOML file whose keys are the long option names (`listen =
    /// "127.0.0.1:10809"`, `export = ["disk=1G", "iso=64M,ro"]`); options on the command line
    /// come after them.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (loopback by default; port 0 picks one, the ready line tells).
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: SocketAddr,
    /// An export: NAME=SIZE[,ro] (repeatable; the first is also the default export, the
    /// empty name). Its file is created if missing and grown to SIZE if smaller.
    #[arg(long = "export", value_name = "NAME=SIZE[,ro]")]
    exports: Vec<String>,
    #[arg(long, value_enum, default_value = "dds")]
    storage: StorageArg,
    /// Control socket of the DPU (storage dds).
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// DDS directory of the exports' files (storage dds).
    #[arg(long, default_value = "/nbd")]
    dds_dir: String,
    /// Directory of the exports' files (storage file).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Most connections.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
}

pub fn run(a: NbdArgs) -> Result<()> {
    // Expanded before parsing (crate::config_file).
    let _ = &a.config;
    let exports = a
        .exports
        .iter()
        .map(|e| ExportSpec::parse(e, parse_size))
        .collect::<Result<Vec<_>>>()?;
    let (storage, dds_conn) = open_storage(a.storage, &a.socket, &a.dds_dir, a.dir.as_deref())?;
    let describe = storage.describe();
    let list = exports
        .iter()
        .map(|e| {
            let mode = if e.read_only { "ro" } else { "rw" };
            format!("{} {} {mode}", e.name, e.size)
        })
        .collect::<Vec<_>>()
        .join(", ");
    let server = NbdServer::open(
        NbdConfig {
            listen: a.listen,
            exports,
            max_connections: a.max_connections,
        },
        storage.as_ref(),
        dds_conn.clone(),
    )
    .context("open the NBD server")?;
    if let Some(dds) = &dds_conn {
        // A traffic director with the `nbd` offload app forwards to this server.
        crate::util::announce_host_app(dds, server.local_addr());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    println!(
        "dds nbd ready: listening on {} ({describe}; exports {list}; pid {})",
        server.local_addr(),
        std::process::id()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let stats = server.run(&stop);
    tracing::info!(?stats, "stopped");
    Ok(())
}
