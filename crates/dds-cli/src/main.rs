//! `dds`: the DPU daemon, device formatting, file operations, the demo and the benchmarks.

mod app_cmd;
#[cfg(feature = "bench")]
mod bench_cmd;
#[cfg(feature = "bench")]
mod demo;
mod dpu_cmd;
mod fs_cmd;
mod stats_cmd;
mod util;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dds",
    version,
    about = "DDS: DPU-optimized disaggregated storage (the DPU runs emulated as the `dds dpu` process)"
)]
struct Cli {
    /// Log filter (error, warn, info, debug, trace, or a tracing filter).
    #[arg(long, global = true, default_value = "warn", env = "DDS_LOG")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

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
    /// Run the remote-storage applications: pagestore server, load client, TCP echo.
    /// Runtime statistics of a running DPU (groups, memory, DMA, space, offload engine).
    Stats(stats_cmd::StatsArgs),
    App(app_cmd::AppArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
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
        Cmd::Stats(a) => stats_cmd::run(a),
        Cmd::App(a) => app_cmd::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dds: {e:#}");
            ExitCode::FAILURE
        }
    }
}
