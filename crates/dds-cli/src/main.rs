//! `dds`: the DPU daemon, device formatting, file operations, the demo and the benchmarks.

mod app_cmd;
#[cfg(feature = "bench")]
mod bench_cmd;
mod config_file;
#[cfg(feature = "bench")]
mod demo;
mod dpu_cmd;
mod dpukv_cmd;
mod fs_cmd;
mod fsck_cmd;
mod kv_cmd;
mod nbd_cmd;
mod nodes_cmd;
mod offload_apps;
mod osd_cmd;
mod pageserver_cmd;
mod s3_cmd;
mod stats_cmd;
mod util;
mod wait_cmd;
mod wire_cmd;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dds",
    version,
    args_override_self = true,
    about = "DDS: DPU-optimized disaggregated storage (the DPU runs emulated as the `dds dpu` process)"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing filter such as
    /// `warn,dds_dpu=debug`); without it, $DDS_LOG, then $RUST_LOG, then `warn`.
    #[arg(long, global = true)]
    log: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run the DPU daemon: the file service on a device, serving host libraries over a socket.
    Dpu(dpu_cmd::DpuArgs),
    /// Format a device (a block device or a regular file, created and preallocated if needed).
    Format(dpu_cmd::FormatArgs),
    /// Inspect and change files on a running DPU through the host library.
    Fs(fs_cmd::FsArgs),
    /// Run the end-to-end demo: format, start the DPU, run a host workload, print results.
    #[cfg(feature = "bench")]
    Demo(demo::DemoArgs),
    /// Run a benchmark; writes JSON and plots under bench/results/.
    #[cfg(feature = "bench")]
    Bench(bench_cmd::BenchArgs),
    /// Run the end-to-end demo (needs a `dds` built with the `bench` feature).
    #[cfg(not(feature = "bench"))]
    Demo(WithoutBench),
    /// Run a benchmark (needs a `dds` built with the `bench` feature).
    #[cfg(not(feature = "bench"))]
    Bench(WithoutBench),
    /// Check a device's metadata without changing it (what the DPU would recover, or what
    /// is damaged).
    Fsck(fsck_cmd::FsckArgs),
    /// Runtime statistics of a running DPU (groups, memory, DMA, space, offload engine).
    Stats(stats_cmd::StatsArgs),
    /// Wait until a server started in the background is ready; fail as soon as it exited, or
    /// after a timeout.
    Wait(wait_cmd::WaitArgs),
    /// Run the remote-storage applications: pagestore server, load client, TCP echo.
    App(app_cmd::AppArgs),
    /// Serve the Redis protocol from a hybrid log in DDS files (GETs of records on storage
    /// served by the DPU with `dds dpu --offload redis`).
    Kv(kv_cmd::KvArgs),
    /// DPU-KV: an in-memory key-value store whose communication engine runs on the DPU, in
    /// six placements (docs/dpu-kv.md).
    #[command(subcommand)]
    Dpukv(dpukv_cmd::DpuKvCmd),
    /// Serve GetPage@LSN and log appends for a storage-disaggregated DBMS from pages in DDS
    /// files (page versions on storage served by the DPU with `dds dpu --offload pageserver`).
    Pageserver(pageserver_cmd::PageServerArgs),
    /// Serve DDS files as Network Block Device exports to NBD clients (fio, nbdcopy,
    /// qemu-img, the Linux nbd driver); docs/nbd.md.
    Nbd(nbd_cmd::NbdArgs),
    /// Run an object storage daemon of a cluster map: objects with data, xattrs and omap,
    /// placement groups replicated to their OSDs, recovery from peers (docs/osd-protocol.md).
    Osd(osd_cmd::OsdArgs),
    /// Store, fetch, inspect, list and remove objects in a cluster of `dds osd` daemons.
    Objects(osd_cmd::ObjectsArgs),
    /// A cluster's nodes as network namespaces on one machine: make them, cut a node off,
    /// bring it back, run a command on a node, remove them (needs root).
    Nodes(nodes_cmd::NodesArgs),
    /// The DPU in the wire: client, DPU and host network namespaces, where the DPU (`dds dpu
    /// --steer`) diverts the signature's flows to its director (needs root).
    Wire(wire_cmd::WireArgs),
    /// The host half of an OSD of placement dpu: the object store on a device file, served to
    /// the DPU's front end through the object store proxy (docs/objproxy.md).
    OsdStore(osd_cmd::OsdStoreArgs),
    /// Serve the S3 REST API (buckets, objects, ranged reads, listings, multipart uploads,
    /// SigV4) on a cluster of `dds osd` daemons, as Ceph's RGW does (docs/s3.md).
    S3(s3_cmd::S3Args),
}

/// The log filter: `--log`, else `$DDS_LOG`, else `$RUST_LOG`, else `warn` (and nothing of
/// `s3s`).
fn log_filter(flag: Option<String>) -> (String, &'static str) {
    if let Some(f) = flag {
        return (f, "--log");
    }
    for var in ["DDS_LOG", "RUST_LOG"] {
        if let Some(v) = std::env::var_os(var) {
            return (v.to_string_lossy().into_owned(), var);
        }
    }
    // s3s logs every refused S3 request (a 404, a bad signature) as an error; the gateway
    // logs the failures that are its own (the cluster's) itself.
    ("warn,s3s=off".into(), "default")
}

fn main() -> ExitCode {
    let args = match config_file::expand(std::env::args().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dds: --config: {e:#}");
            return ExitCode::from(util::exit::USAGE);
        }
    };
    let cli = match Cli::from_arg_matches(&command().get_matches_from(args)) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let (filter, from) = log_filter(cli.log);
    let filter = match tracing_subscriber::EnvFilter::builder().parse(&filter) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("dds: invalid log filter `{filter}` (from {from}): {e}");
            return ExitCode::from(util::exit::USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.cmd {
        Cmd::Dpu(a) => dpu_cmd::run_dpu(a),
        Cmd::Format(a) => dpu_cmd::run_format(a),
        Cmd::Fs(a) => return fs_cmd::run(a),
        #[cfg(feature = "bench")]
        Cmd::Demo(a) => demo::run(a),
        #[cfg(feature = "bench")]
        Cmd::Bench(a) => bench_cmd::run(a),
        #[cfg(not(feature = "bench"))]
        Cmd::Demo(_) => Err(without_bench("demo")),
        #[cfg(not(feature = "bench"))]
        Cmd::Bench(_) => Err(without_bench("bench")),
        Cmd::Stats(a) => stats_cmd::run(a),
        Cmd::Wait(a) => wait_cmd::run(a),
        Cmd::Fsck(a) => fsck_cmd::run(a),
        Cmd::App(a) => app_cmd::run(a),
        Cmd::Kv(a) => kv_cmd::run(a),
        Cmd::Dpukv(c) => dpukv_cmd::run(c),
        Cmd::Pageserver(a) => pageserver_cmd::run(a),
        Cmd::Nbd(a) => nbd_cmd::run(a),
        Cmd::Osd(a) => osd_cmd::run_osd(a),
        Cmd::Objects(a) => osd_cmd::run_objects(a),
        Cmd::Nodes(a) => nodes_cmd::run(a),
        Cmd::Wire(a) => wire_cmd::run(a),
        Cmd::OsdStore(a) => osd_cmd::run_osd_store(a),
        Cmd::S3(a) => s3_cmd::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dds: {e:#}");
            if let Some(h) = util::hint(&e) {
                eprintln!("  hint: {h}");
            }
            ExitCode::from(util::exit_code(&e))
        }
    }
}

/// The arguments of `dds demo` and `dds bench` in a `dds` built without them: taken as they
/// come, so that the error names the missing feature whatever was asked.
#[cfg(not(feature = "bench"))]
#[derive(clap::Args)]
struct WithoutBench {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

/// Why `dds <command>` cannot run: the `bench` feature is not in this build.
#[cfg(not(feature = "bench"))]
fn without_bench(command: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "`dds {command}` needs the `bench` feature of dds-cli, which this dds was built without: \
         build it with `cargo build --release -p dds-cli --features bench` (or install it with \
         `cargo install --path crates/dds-cli --features bench`)"
    )
}

/// The command line, with the lists that come from registries filled in (the offload apps of
/// `dds dpu --offload`).
fn command() -> clap::Command {
    let apps = offload_apps::registry();
    let names: Vec<&str> = apps.names().map(|(n, _)| n).collect();
    let short = format!(
        "Offload engine and traffic director: {} (built in), or the path of an offload plugin \
         (`.so`, include/dds_offload.h). Needs --director-listen and --host-app",
        names.join(", ")
    );
    let mut long = format!("{short}.\n\nBuilt-in offload apps:");
    for (name, about) in apps.names() {
        long.push_str(&format!("\n  {name:<12} {about}"));
    }
    Cli::command().mut_subcommand("dpu", |c| {
        c.mut_arg("offload", |a| a.help(short).long_help(long))
    })
}
