//! `dds dpukv`: DPU-KV, an in-memory key-value store whose communication engine runs on the
//! DPU (`docs/dpu-kv.md`): `dds dpukv dpu` is the DPU process, `dds dpukv host` the host's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use dds_dpukv::node::{run_dpu, run_host, DpuConfig, HostConfig};
use dds_dpukv::Design;

use crate::dpu_cmd::{parse_cpus, parse_on_off, CpuList, DpuProfileArgs};
use crate::util::parse_size;

#[derive(Subcommand, Debug)]
pub enum DpuKvCmd {
    /// The DPU process: front ends (communication engine) of the design the host attaches.
    Dpu(DpuKvDpuArgs),
    /// The host process: the store, the KV queue pairs and workers, and the host endpoints.
    Host(DpuKvHostArgs),
}

#[derive(Args, Debug)]
pub struct DpuKvDpuArgs {
    /// Control socket the host attaches to (created mode 0600).
    #[arg(long)]
    control: PathBuf,
    /// Client endpoint (loopback by default; port 0 picks one, the ready line tells).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Communication cores (front-end threads).
    #[arg(long, default_value_t = 1)]
    cores: u32,
    /// Memory of the DPU-resident store (dpu-only, shrd).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    store_memory: u64,
    /// Of the store memory, the bytes of its index (default an eighth; at most half). Size it
    /// to the keys, about 24 bytes per key: an index far larger than its keys costs lookups
    /// cache and TLB misses.
    #[arg(long, value_parser = parse_size)]
    store_index: Option<u64>,
    /// Partitions of the DPU-resident store.
    #[arg(long, default_value_t = 1)]
    partitions: usize,
    /// Largest value of the DPU-resident store.
    #[arg(long, default_value_t = 1024)]
    max_value: usize,
    /// Emulated PCIe cost of DMA operations (on/off).
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    dma_cost: bool,
    #[command(flatten)]
    profile: DpuProfileArgs,
    #[command(flatten)]
    etcd: EtcdArgs,
}

#[derive(Args, Debug)]
pub struct DpuKvHostArgs {
    /// Placement: cpu-only, dpu-only, lat, sav, dual, shrd.
    #[arg(long, value_parser = parse_design)]
    design: Design,
    /// The DPU process's control socket (every design but cpu-only).
    #[arg(long)]
    dpu: Option<PathBuf>,
    /// The host's own client endpoint (cpu-only, dual, shrd).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Front-end threads of the host endpoint.
    #[arg(long, default_value_t = 1)]
    frontends: u32,
    /// Host workers (lat: one per partition; sav and dual: one).
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Partitions of the host store.
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// Memory of the host store.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    store_memory: u64,
    /// Of the store memory, the bytes of its index (default an eighth; at most half). Size it
    /// to the keys, about 24 bytes per key: an index far larger than its keys costs lookups
    /// cache and TLB misses.
    #[arg(long, value_parser = parse_size)]
    store_index: Option<u64>,
    /// DPU communication cores (must match the DPU's --cores).
    #[arg(long, default_value_t = 1)]
    comm_cores: u32,
    /// Slots per KV queue.
    #[arg(long, default_value_t = 8)]
    slots: u32,
    /// Bytes per slot.
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    slot_bytes: u64,
    /// Largest value (a request batch holds no more GETs than a slot answers at this size).
    #[arg(long, default_value_t = 1024)]
    max_value: u32,
    /// CPUs of the host process.
    #[arg(long, value_parser = parse_cpus)]
    cpus: Option<CpuList>,
    #[command(flatten)]
    etcd: EtcdArgs,
}

#[derive(Args, Debug)]
struct EtcdArgs {
    /// Register the endpoints in etcd (its client URL), under a lease.
    #[arg(long)]
    etcd: Option<String>,
    /// Deployment name in etcd (keys /dds/dpukv/<name>/<endpoint id>).
    #[arg(long, default_value = "default")]
    etcd_cluster: String,
    /// Lease TTL in seconds.
    #[arg(long, default_value_t = 5)]
    etcd_ttl: u64,
}

impl EtcdArgs {
    fn get(&self) -> Option<(String, String, u64)> {
        self.etcd
            .clone()
            .map(|u| (u, self.etcd_cluster.clone(), self.etcd_ttl.max(2)))
    }
}

fn parse_design(s: &str) -> Result<Design, String> {
    Design::parse(s)
        .ok_or_else(|| format!("unknown design `{s}` (cpu-only, dpu-only, lat, sav, dual, shrd)"))
}

fn stop_flag() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

pub fn run(cmd: DpuKvCmd) -> Result<()> {
    match cmd {
        DpuKvCmd::Dpu(a) => {
            let stop = stop_flag()?;
            let mut applied = a.profile.apply()?;
            let cfg = DpuConfig {
                control: a.control.clone(),
                listen: a.listen,
                cores: a.cores.max(1),
                memory: usize::try_from(a.store_memory)?,
                index: a.store_index.map(usize::try_from).transpose()?,
                partitions: a.partitions.max(1),
                cost: a.dma_cost.then(dds_dma::CostModel::bluefield2),
                max_value: a.max_value,
                etcd: a.etcd.get(),
            };
            eprintln!(
                "dds dpukv dpu: control {} (DMA cost model {}, profile {})",
                a.control.display(),
                if a.dma_cost { "on" } else { "off" },
                serde_json::to_string(&applied).unwrap_or_default()
            );
            let r = run_dpu(&cfg, &stop);
            applied.remove();
            r
        }
        DpuKvCmd::Host(a) => {
            let stop = stop_flag()?;
            if let Some(c) = &a.cpus {
                dds_dpu::profile::ResourceProfile {
                    cpus: Some(c.0.clone()),
                    ..Default::default()
                }
                .apply()
                .context("pin the host process")?;
            }
            let cfg = HostConfig {
                design: a.design,
                dpu: a.dpu.clone(),
                listen: a.listen,
                frontends: a.frontends,
                workers: a.workers,
                partitions: a.partitions.max(1),
                memory: usize::try_from(a.store_memory)?,
                index: a.store_index.map(usize::try_from).transpose()?,
                comm_cores: a.comm_cores,
                slots: a.slots,
                slot_bytes: u32::try_from(a.slot_bytes).map_err(|_| anyhow!("--slot-bytes"))?,
                max_value: a.max_value,
                etcd: a.etcd.get(),
            };
            run_host(&cfg, &stop, &mut |s| {
                use std::io::Write;
                let line = serde_json::to_string(s).unwrap_or_default();
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            })
        }
    }
}
