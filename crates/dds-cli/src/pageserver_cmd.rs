//! `dds pageserver`: GetPage@LSN over TCP, log replayed into pages on DDS files
//! (`docs/pageserver-protocol.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use dds_pageserver::{PageServer, PageServerConfig};

use crate::util::{open_storage, parse_size, StorageArg};

#[derive(Args, Debug)]
pub struct PageServerArgs {
    /// Address to listen on (loopback by default; port 0 picks one, the ready line tells).
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: SocketAddr,
    #[arg(long, value_enum, default_value = "dds")]
    storage: StorageArg,
    /// Control socket of the DPU (storage dds).
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// DDS directory of the page and log files (storage dds).
    #[arg(long, default_value = "/pageserver")]
    dds_dir: String,
    /// Directory of the page and log files (storage file).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Page size.
    #[arg(long, default_value = "8K", value_parser = parse_size)]
    page_size: u64,
    /// Pages of the database.
    #[arg(long, default_value_t = 16384)]
    pages: u64,
    /// Pages kept in memory.
    #[arg(long, default_value_t = 1024)]
    buffer_pool: usize,
    /// Log file size.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    wal_size: u64,
    /// How long a GetPage waits for the log to be applied, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    lsn_wait_ms: u64,
    /// Unparsed input all connections may hold together (a connection past it waits).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    input_memory: u64,
    /// Do not tell the DPU's offload engine about the pages.
    #[arg(long)]
    no_offload: bool,
    /// How far back GetPage@LSN reaches: LSNs behind the last applied one (`100000`), or a
    /// time of log (`10s`, `500ms`, `2m`).
    #[arg(long, default_value = "10s")]
    retention: dds_pageserver::Retention,
}

pub fn run(a: PageServerArgs) -> Result<()> {
    // On DDS files, page reads go through the host library's asynchronous API.
    let (storage, dds_conn) = open_storage(a.storage, &a.socket, &a.dds_dir, a.dir.as_deref())?;
    let announce = dds_conn.clone().filter(|_| !a.no_offload);
    let describe = storage.describe();
    let server = PageServer::open_with_dds(
        PageServerConfig {
            listen: a.listen,
            page_size: usize::try_from(a.page_size).context("--page-size")?,
            pages: a.pages,
            buffer_pool: a.buffer_pool,
            wal_size: a.wal_size,
            lsn_wait: Duration::from_millis(a.lsn_wait_ms),
            max_connections: 1024,
            offload: !a.no_offload && a.storage == StorageArg::Dds,
            input_memory: usize::try_from(a.input_memory).context("--input-memory")?,
            retention: a.retention,
        },
        storage,
        dds_conn,
    )
    .context("open the page server")?;
    if let Some(dds) = &announce {
        crate::util::announce_host_app(dds, server.local_addr()?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    println!(
        "dds pageserver ready: listening on {} ({describe}, {} pages of {} bytes, applied LSN {}, pid {})",
        server.local_addr()?,
        a.pages,
        a.page_size,
        server.applied_lsn(),
        std::process::id()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    server.run(&stop)
}
