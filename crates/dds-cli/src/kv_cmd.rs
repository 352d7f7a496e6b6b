//! `dds kv`: the key-value service (Redis protocol) on a hybrid log in DDS files
//! (`docs/kv-service.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use dds_kv::server::{Server, ServerConfig};
use dds_kv::{Durability, Store, StoreConfig};

use crate::util::{open_storage, parse_size, StorageArg};

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum EngineArg {
    /// FASTER-style hybrid log on DDS (or regular) files: most data on storage.
    HybridLog,
    /// DPU-KV's in-memory MICA-style store (docs/dpu-kv.md): everything in --memory, nothing
    /// durable, a clear OOM error when full.
    Memory,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum DurabilityArg {
    /// Nothing survives a restart.
    None,
    /// Writes are made durable every --sync-interval (Redis's appendfsync everysec).
    Periodic,
    /// Every write is durable before its reply (group commit per event-loop round).
    Fsync,
}

#[derive(Args, Debug)]
pub struct KvArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port, the ready line
    /// tells which).
    #[arg(long, default_value = "127.0.0.1:6379")]
    listen: SocketAddr,
    #[arg(long, value_enum, default_value = "hybrid-log")]
    engine: EngineArg,
    /// Partitions of the memory engine.
    #[arg(long, default_value_t = 4)]
    partitions: usize,
    #[arg(long, value_enum, default_value = "dds")]
    storage: StorageArg,
    /// Control socket of the DPU (storage dds).
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// DDS directory of the log and checkpoint files (storage dds).
    #[arg(long, default_value = "/kv")]
    dds_dir: String,
    /// Directory of the log and checkpoint files (storage file).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Memory for log pages (most records live on storage when the data is larger); with
    /// `--engine memory`, the whole store.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    memory: u64,
    /// Log file size (live data must fit; compaction reclaims the rest).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    log_size: u64,
    /// Log page size (a power of two, at least 64K).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    page_size: u64,
    #[arg(long, value_enum, default_value = "periodic")]
    durability: DurabilityArg,
    /// Commit interval of --durability periodic, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    sync_interval_ms: u64,
    /// Largest key.
    #[arg(long, default_value = "4096", value_parser = parse_size)]
    max_key_bytes: u64,
    /// Largest value (at most half a page; default half a page).
    #[arg(long, value_parser = parse_size)]
    max_value_bytes: Option<u64>,
    /// Require AUTH with this password (or $DDS_KV_PASSWORD).
    #[arg(long, env = "DDS_KV_PASSWORD", hide_env_values = true)]
    requirepass: Option<String>,
    /// Most connected clients.
    #[arg(long, default_value_t = 10_000)]
    max_clients: usize,
    /// Most unparsed input of one client (Redis's client-query-buffer-limit).
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    client_query_buffer_limit: u64,
    /// Do not expose the log to the DPU's offload engine (no DPU-served GETs, no
    /// invalidations).
    #[arg(long)]
    no_offload: bool,
}

pub fn run(a: KvArgs) -> Result<()> {
    let mut announce = None;
    let (store, describe): (Box<dyn dds_kv::Engine>, String) = match a.engine {
        EngineArg::Memory => {
            let memory = usize::try_from(a.memory).context("--memory")?;
            let e = dds_kv::MemEngine::new(a.partitions, memory)?;
            (
                Box::new(e),
                format!("in memory, {} partitions", a.partitions.max(1)),
            )
        }
        EngineArg::HybridLog => {
            let (store, describe, dds) = open_hybrid_log(&a)?;
            if !a.no_offload {
                announce = dds.clone();
            }
            (Box::new(store), describe)
        }
    };
    let keys = store.len();
    let durability = format!("{:?}", store.durability()).to_lowercase();
    let server = Server::bind(
        ServerConfig {
            listen: a.listen,
            password: a.requirepass.filter(|p| !p.is_empty()),
            max_clients: a.max_clients.max(1),
            query_buffer_limit: usize::try_from(a.client_query_buffer_limit)
                .context("--client-query-buffer-limit")?,
            sync_interval: Duration::from_millis(a.sync_interval_ms.max(1)),
            ..ServerConfig::default()
        },
        store,
        describe.clone(),
    )?;
    if let Some(dds) = &announce {
        crate::util::announce_host_app(dds, server.local_addr()?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    println!(
        "dds kv ready: listening on {} ({describe}, durability {}, {keys} keys recovered, pid {})",
        server.local_addr()?,
        durability,
        std::process::id()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    server.run(&stop)?;
    if stop.load(Ordering::Relaxed) {
        eprintln!("dds kv: stopped; the log is committed");
    }
    Ok(())
}

/// The hybrid log on its storage, its description, and the DPU connection when the storage
/// is DDS.
fn open_hybrid_log(a: &KvArgs) -> Result<(Store, String, Option<Arc<dds_host::Dds>>)> {
    let page_size = usize::try_from(a.page_size).context("--page-size")?;
    let max_value = match a.max_value_bytes {
        Some(v) => usize::try_from(v).context("--max-value-bytes")?,
        None => page_size / 2 - a.max_key_bytes as usize - 64,
    };
    let (storage, conn) = open_storage(a.storage, &a.socket, &a.dds_dir, a.dir.as_deref())?;
    let describe = storage.describe();
    let durability = match a.durability {
        DurabilityArg::None => Durability::None,
        DurabilityArg::Periodic => Durability::Periodic,
        DurabilityArg::Fsync => Durability::Fsync,
    };
    let store = Store::open(
        storage,
        StoreConfig {
            page_size,
            memory: usize::try_from(a.memory).context("--memory")?,
            log_size: a.log_size,
            max_key: usize::try_from(a.max_key_bytes).context("--max-key-bytes")?,
            max_value,
            durability,
            offload: !a.no_offload && a.storage == StorageArg::Dds,
        },
    )
    .context("open the store")?;
    Ok((store, describe, conn))
}
