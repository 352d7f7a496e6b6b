//! `dds app`: the remote-storage applications of the evaluation (§8.1).
//!
//! - `dds app pagestore`: the pagestore server over kernel TCP, on OS files (`--backend os`)
//!   or DDS files through the host library (`--backend dds`, with `dds dpu` running).
//! - `dds app client`: the load client; prints a JSON report.
//! - `dds app echo` / `dds app echo-client`: the TCP echo of the network-path comparison.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use dds_apps::client::{self, ClientConfig};
use dds_apps::echo::{self, EchoConfig, EchoServer};
use dds_apps::server::{Server, ServerConfig};
use dds_storage::aio::{open_async_storage, BackendSpec, Fill, OnDpuLoss};

use crate::util::parse_size;

#[derive(Args, Debug)]
pub struct AppArgs {
    #[command(subcommand)]
    which: App,
}

#[derive(Subcommand, Debug)]
enum App {
    /// Serve the pagestore protocol (docs/pagestore-protocol.md) over kernel TCP.
    Pagestore(PagestoreArgs),
    /// Generate pagestore load and report throughput and latency as JSON.
    Client(ClientArgs),
    /// Serve a TCP echo (one thread per connection).
    Echo(EchoArgs),
    /// Measure a TCP echo server: messages/s and round-trip latency as JSON.
    EchoClient(EchoClientArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum DpuLossArg {
    /// Reconnect with bounded exponential backoff and serve again.
    Reconnect,
    /// Exit with a clear error (status 3).
    Exit,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum BackendArg {
    /// Regular files in --dir, io_uring with O_DIRECT (buffered for unaligned requests).
    Os,
    /// DDS files through the host library; the file service runs in `dds dpu`.
    Dds,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum FillArg {
    /// Write the deterministic data pattern into new or grown files.
    Pattern,
    /// Leave new files unwritten.
    None,
}

#[derive(Args, Debug)]
pub struct PagestoreArgs {
    /// Address to listen on (port 0 picks a free port; the ready line tells which).
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    #[arg(long, value_enum)]
    backend: BackendArg,
    /// Directory of the OS files (backend os).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Control socket of the DPU (backend dds).
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    socket: PathBuf,
    /// DDS directory holding the files (backend dds).
    #[arg(long, default_value = "/pagestore")]
    dds_dir: String,
    /// When the DPU goes away (backend dds): reconnect with backoff (answering requests with
    /// DpuDead meanwhile), or exit with status 3.
    #[arg(long, value_enum, default_value = "reconnect")]
    on_dpu_loss: DpuLossArg,
    /// Give up reconnecting after this many seconds (default: never).
    #[arg(long)]
    reconnect_for: Option<f64>,
    /// Files f0..fN-1.
    #[arg(long, default_value_t = 4)]
    files: usize,
    /// Size of each file.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    file_size: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Content of new or grown files.
    #[arg(long, value_enum, default_value = "pattern")]
    fill: FillArg,
    /// Response bytes in flight, and response bytes waiting for the client, per connection.
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    conn_max_bytes: u64,
    /// Requests in flight per connection.
    #[arg(long, default_value_t = 2048)]
    conn_max_ops: usize,
    /// Open connections at most.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Memory all connections' buffers (input, and responses waiting for their clients) may
    /// hold together; they grow with the bytes that arrive, and a connection that needs more
    /// than is left is closed.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    input_memory: u64,
}

#[derive(Args, Debug)]
pub struct ClientArgs {
    #[arg(long)]
    connect: SocketAddr,
    /// File ids, comma-separated (from the server's ready line).
    #[arg(long, value_delimiter = ',', required = true)]
    files: Vec<u32>,
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    file_size: u64,
    #[arg(long, default_value = "1K", value_parser = parse_size)]
    io_size: u64,
    /// Fraction of reads.
    #[arg(long, default_value_t = 1.0)]
    read_ratio: f64,
    /// Requests per message.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Messages in flight per connection.
    #[arg(long, default_value_t = 4)]
    outstanding: usize,
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Run time in seconds.
    #[arg(long, conflicts_with = "requests")]
    seconds: Option<f64>,
    /// Requests in all (instead of --seconds).
    #[arg(long)]
    requests: Option<u64>,
    /// Write the data pattern over the files first, and check every read against it.
    #[arg(long)]
    verify: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON (the default prints a short summary too).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct EchoArgs {
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: SocketAddr,
    /// Which side of the comparison this process plays (reported in the ready line).
    #[arg(long, default_value = "host")]
    role: String,
}

#[derive(Args, Debug)]
pub struct EchoClientArgs {
    #[arg(long)]
    connect: SocketAddr,
    #[arg(long, default_value = "64", value_parser = parse_size)]
    size: u64,
    #[arg(long, default_value_t = 1)]
    outstanding: usize,
    #[arg(long, default_value_t = 1)]
    connections: usize,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

pub fn run(a: AppArgs) -> Result<()> {
    match a.which {
        App::Pagestore(p) => run_pagestore(p),
        App::Client(c) => run_client(c),
        App::Echo(e) => run_echo(e),
        App::EchoClient(e) => run_echo_client(e),
    }
}

fn wait_for_signal() -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    if let Some(sig) = signals.forever().next() {
        tracing::info!(sig, "shutting down");
    }
    Ok(())
}

fn run_pagestore(a: PagestoreArgs) -> Result<()> {
    let spec = match a.backend {
        BackendArg::Os => BackendSpec::Os {
            dir: a.dir.clone().context("--backend os needs --dir")?,
        },
        BackendArg::Dds => BackendSpec::Dds {
            socket: a.socket.clone(),
            dir: a.dds_dir.clone(),
            on_loss: match a.on_dpu_loss {
                DpuLossArg::Exit => OnDpuLoss::Exit,
                DpuLossArg::Reconnect => OnDpuLoss::Reconnect {
                    give_up_after: a
                        .reconnect_for
                        .map(Duration::try_from_secs_f64)
                        .transpose()
                        .context("--reconnect-for takes seconds")?,
                },
            },
        },
    };
    let fill = match a.fill {
        FillArg::Pattern => Fill::Pattern,
        FillArg::None => Fill::None,
    };
    let threads = a.threads.max(1);
    let storage = open_async_storage(&spec, a.files, a.file_size, fill, threads)?;
    let server = Server::start(
        ServerConfig {
            listen: a.listen,
            threads,
            conn_max_bytes: usize::try_from(a.conn_max_bytes).context("--conn-max-bytes")?,
            conn_max_ops: a.conn_max_ops.max(1),
            max_connections: a.max_connections.max(1),
            input_memory_bytes: usize::try_from(a.input_memory).context("--input-memory")?,
        },
        storage.clone(),
    )?;
    if let BackendArg::Dds = a.backend {
        // The DPU's traffic director (if any) forwards to where this server listens.
        match dds_host::Dds::connect(&a.socket) {
            Ok(dds) => crate::util::announce_host_app(&dds, server.local_addr()),
            Err(e) => {
                tracing::warn!(error = %e, "telling the DPU where this server listens failed")
            }
        }
    }
    let ready = serde_json::json!({
        "ready": true,
        "listen": server.local_addr().to_string(),
        "backend": storage.name(),
        "files": storage.file_ids(),
        "file_size": storage.file_size(),
        "threads": threads,
        "pid": std::process::id(),
        "note": "DPU emulated: the DDS file service runs in the separate `dds dpu` process with an emulated DMA engine",
    });
    println!("{ready}");
    use std::io::Write;
    std::io::stdout().flush()?;
    wait_for_signal()?;
    let stats = server.stats();
    server.shutdown();
    eprintln!(
        "dds app pagestore: {} requests ({} errors), {} connections, {} closed for protocol violations",
        stats.requests, stats.errors, stats.connections, stats.closed_malformed
    );
    Ok(())
}

fn run_client(a: ClientArgs) -> Result<()> {
    let io_size = u32::try_from(a.io_size).context("--io-size")?;
    if a.seconds.is_none() && a.requests.is_none() {
        bail!("give --seconds or --requests");
    }
    let cfg = ClientConfig {
        connect: a.connect,
        files: a.files,
        file_size: a.file_size,
        io_size,
        read_ratio: a.read_ratio,
        batch: a.batch,
        outstanding: a.outstanding,
        connections: a.connections,
        duration: a.seconds.map(Duration::from_secs_f64),
        requests: a.requests,
        verify: a.verify,
        seed: a.seed,
    };
    let rep = client::run(&cfg)?;
    if a.json {
        println!("{}", serde_json::to_string(&rep)?);
    } else {
        println!(
            "{} requests in {:.2} s: {:.0} req/s, {:.1} MB/s, p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, {} errors",
            rep.requests,
            rep.seconds,
            rep.requests_per_sec,
            rep.mb_per_sec,
            rep.p50_us,
            rep.p99_us,
            rep.p999_us,
            rep.errors
        );
    }
    if rep.errors > 0 || rep.order_violations > 0 || rep.verify_failures > 0 {
        bail!(
            "{} requests failed, {} responses out of order, {} reads with wrong data",
            rep.errors,
            rep.order_violations,
            rep.verify_failures
        );
    }
    Ok(())
}

fn run_echo(a: EchoArgs) -> Result<()> {
    let server = EchoServer::start(a.listen)?;
    let ready = serde_json::json!({
        "ready": true,
        "listen": server.local_addr().to_string(),
        "role": a.role,
        "pid": std::process::id(),
    });
    println!("{ready}");
    use std::io::Write;
    std::io::stdout().flush()?;
    wait_for_signal()?;
    drop(server);
    Ok(())
}

fn run_echo_client(a: EchoClientArgs) -> Result<()> {
    let rep = echo::run_client(&EchoConfig {
        connect: a.connect,
        message_size: usize::try_from(a.size).context("--size")?,
        outstanding: a.outstanding,
        connections: a.connections,
        duration: Duration::from_secs_f64(a.seconds),
    })?;
    println!("{}", serde_json::to_string(&rep)?);
    Ok(())
}
