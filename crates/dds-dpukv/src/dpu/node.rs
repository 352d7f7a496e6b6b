//! The DPU process (`dds dpukv dpu`): waits for a host on its control socket, maps the
//! host's queue region through the DMA engine and runs the front ends of the host's design
//! (and, for `dpu-only` and `shrd`, a DPU-resident store), one host at a time.

use crate::cluster::{ClusterMap, Endpoint, SLOTS};
use crate::frontend::{reuseport_listener, Backend, FrontConfig, FrontStats, Frontend, Queues};
use crate::node::{recv_frame, send_frame, Attach, AttachReply};
use crate::store::SharedStore;
use crate::Design;
use anyhow::Context;
use anyhow::{anyhow, bail, Result};
use dds_dma::CostModel;
use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Settings of the DPU process.
#[derive(Clone, Debug)]
pub struct DpuConfig {
    /// The control socket (created mode 0600).
    pub control: PathBuf,
    /// Client endpoint address (port 0: any).
    pub listen: SocketAddr,
    /// Communication cores (front-end threads).
    pub cores: u32,
    /// Memory of a DPU-resident store (`dpu-only`, `shrd`).
    pub memory: usize,
    /// Bytes of the store's memory for its index (default an eighth): sized to the keys, it
    /// keeps lookups in cache.
    pub index: Option<usize>,
    /// Partitions of a DPU-resident store.
    pub partitions: usize,
    /// PCIe cost model of the emulated DMA engine.
    pub cost: Option<CostModel>,
    /// Largest value of a DPU-resident store.
    pub max_value: usize,
    /// etcd registration: (URL, cluster name, TTL seconds).
    pub etcd: Option<(String, String, u64)>,
}

/// Runs the DPU process until `stop`: serves one host at a time.
pub fn run_dpu(cfg: &DpuConfig, stop: &AtomicBool) -> Result<()> {
    let _ = std::fs::remove_file(&cfg.control);
    let listener = UnixListener::bind(&cfg.control)
        .with_context(|| format!("bind {}", cfg.control.display()))?;
    std::fs::set_permissions(&cfg.control, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    tracing::info!(control = %cfg.control.display(), "DPU-KV DPU process ready");
    // A DPU-resident store outlives a host's attachment (`dpu-only` and `shrd` keep it).
    let mut dpu_store: Option<SharedStore> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e).context("accept"),
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let (attach, mut fds) = match recv_frame::<Attach>(&mut s) {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "bad attach");
                let _ = send_frame(&s, &AttachReply::Error(format!("{e:#}")), &[]);
                continue;
            }
        };
        match serve_host(cfg, &mut s, attach, fds.pop(), &mut dpu_store, stop) {
            Ok(()) => tracing::info!("host detached"),
            Err(e) => {
                tracing::warn!(error = %e, "host attachment ended");
                let _ = send_frame(&s, &AttachReply::Error(format!("{e:#}")), &[]);
            }
        }
    }
    let _ = std::fs::remove_file(&cfg.control);
    Ok(())
}

fn serve_host(
    cfg: &DpuConfig,
    s: &mut UnixStream,
    attach: Attach,
    fd: Option<OwnedFd>,
    dpu_store: &mut Option<SharedStore>,
    stop: &AtomicBool,
) -> Result<()> {
    let design = attach.design;
    if design == Design::CpuOnly {
        bail!("cpu-only runs without a DPU");
    }
    let queued = design.uses_queues();
    if queued {
        attach.geometry.validate().map_err(|e| anyhow!(e))?;
        if attach.geometry.comm_cores != cfg.cores {
            bail!(
                "the host made queue pairs for {} communication cores; this DPU runs {}",
                attach.geometry.comm_cores,
                cfg.cores
            );
        }
        if fd.is_none() {
            bail!("no queue region passed");
        }
    }
    let first = reuseport_listener(cfg.listen)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..cfg.cores {
        listeners.push(reuseport_listener(addr)?);
    }
    let slots = match design {
        Design::Shrd => vec![(0, SLOTS / 2 - 1)],
        _ => Vec::new(),
    };
    let me = Endpoint::new(addr, "dpu", slots);
    let mut endpoints = vec![me.clone()];
    endpoints.extend(attach.host_endpoints.iter().cloned());
    let cluster = Arc::new(ClusterMap {
        endpoints,
        me: 0,
        sharded: design == Design::Shrd,
    });
    let max_value = if queued {
        attach.geometry.max_value as usize
    } else {
        cfg.max_value
    };
    let fcfg = FrontConfig {
        cluster,
        max_clients: 10_000,
        query_buffer_limit: 64 << 20,
        max_pending: 4096,
        max_value,
        budget: dds_server::Budget::new(crate::frontend::MEMORY_BUDGET),
    };
    let halt = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(FrontStats::default());
    let mut threads = Vec::new();
    for (c, l) in listeners.into_iter().enumerate() {
        let backend = if queued {
            let fd = fd.as_ref().expect("checked").try_clone()?;
            Backend::Queues(Box::new(Queues::new(
                fd,
                &attach.geometry,
                c as u32,
                attach.partitions as usize,
                cfg.cost,
            )?))
        } else {
            let store = match dpu_store {
                Some(st) => st.clone(),
                None => {
                    let st = SharedStore::new(cfg.partitions, cfg.memory, cfg.index)
                        .map_err(|e| anyhow!("DPU store: {e}"))?;
                    *dpu_store = Some(st.clone());
                    st
                }
            };
            Backend::Local(store)
        };
        let fe = Frontend::new(l, backend, fcfg.clone(), stats.clone())?;
        let h = halt.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("dpukv-comm-{c}"))
                .spawn(move || {
                    if let Err(e) = fe.run(&h) {
                        tracing::error!(error = %e, "front end stopped");
                    }
                    h.store(true, Ordering::Relaxed);
                })?,
        );
    }
    let _reg = match &cfg.etcd {
        Some((url, name, ttl)) => Some(crate::etcd::Registration::start(
            url,
            name,
            design.name(),
            std::slice::from_ref(&me),
            *ttl,
        )?),
        None => None,
    };
    send_frame(s, &AttachReply::Attached(vec![me]), &[])?;
    // Attached until the host closes the control connection (or dies), a front end fails,
    // or the process stops.
    s.set_nonblocking(true)?;
    let mut b = [0u8; 64];
    loop {
        if stop.load(Ordering::Relaxed) || halt.load(Ordering::Relaxed) {
            break;
        }
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => break,
        }
    }
    halt.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    if design == Design::DpuOnly || design == Design::Shrd {
        // Kept for the next attachment of the same host.
    } else {
        *dpu_store = None;
    }
    Ok(())
}
