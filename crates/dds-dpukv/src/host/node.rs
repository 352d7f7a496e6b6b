//! The host process (`dds dpukv host`): owns the store, the queue region in its shared memory
//! and the workers, attaches to the DPU (again after a DPU restart) and runs its own front ends
//! where the design has them.

use crate::cluster::{ClusterMap, Endpoint, SLOTS};
use crate::frontend::{reuseport_listener, Backend, FrontConfig, FrontStats, Frontend};
use crate::node::{recv_frame, send_frame, Attach, AttachReply};
use crate::queue::{Geometry, HostQueue};
use crate::store::SharedStore;
use crate::worker::WorkerStats;
use crate::{worker, Design};
use anyhow::{anyhow, bail, Result};
use dds_shm::SharedRegion;
use serde::Serialize;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Settings of the host process.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Design.
    pub design: Design,
    /// The DPU's control socket (every design but `cpu-only`).
    pub dpu: Option<PathBuf>,
    /// Address of the host's own endpoint (`cpu-only`, `dual`, `shrd`).
    pub listen: SocketAddr,
    /// Front-end threads of the host endpoint.
    pub frontends: u32,
    /// Workers (`lat`: one per partition; `sav`, `dual`: one).
    pub workers: u32,
    /// Partitions of the host store.
    pub partitions: u32,
    /// Store memory.
    pub memory: usize,
    /// Bytes of the store's memory for its index (default an eighth): sized to the keys, it
    /// keeps lookups in cache.
    pub index: Option<usize>,
    /// DPU communication cores (queue pairs are made for each).
    pub comm_cores: u32,
    /// Slots per ring.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_bytes: u32,
    /// Largest value.
    pub max_value: u32,
    /// etcd registration: (URL, cluster name, TTL seconds).
    pub etcd: Option<(String, String, u64)>,
}

impl HostConfig {
    fn geometry(&self) -> Geometry {
        Geometry {
            comm_cores: self.comm_cores,
            workers: self.workers,
            slots: self.slots,
            slot_bytes: self.slot_bytes,
            max_value: self.max_value,
        }
    }
}

/// What the host process serves, for its caller to print.
#[derive(Clone, Debug, Serialize)]
pub struct Serving {
    /// Design.
    pub design: Design,
    /// Every endpoint (the DPU's first when there is one).
    pub endpoints: Vec<Endpoint>,
}

/// Runs the host process until `stop`. `ready` gets the endpoints once serving (and again
/// after every re-attachment to a restarted DPU).
pub fn run_host(
    cfg: &HostConfig,
    stop: &AtomicBool,
    ready: &mut dyn FnMut(&Serving),
) -> Result<()> {
    let design = cfg.design;
    let store = SharedStore::new(cfg.partitions as usize, cfg.memory, cfg.index)
        .map_err(|e| anyhow!("host store: {e}"))?;
    if design.uses_queues() {
        cfg.geometry().validate().map_err(|e| anyhow!(e))?;
        if design == Design::Lat && cfg.workers != cfg.partitions {
            bail!("lat pairs one worker with each partition: --workers must equal --partitions");
        }
        if matches!(design, Design::Sav | Design::Dual) && cfg.workers != 1 {
            bail!("{} has exactly one host worker", design.name());
        }
    }
    // The host's own endpoint.
    let host_fronts = match design {
        Design::CpuOnly | Design::Dual | Design::Shrd => cfg.frontends.max(1),
        _ => 0,
    };
    let mut host_endpoints = Vec::new();
    let mut listeners = Vec::new();
    if host_fronts > 0 {
        let first = reuseport_listener(cfg.listen)?;
        let addr = first.local_addr()?;
        listeners.push(first);
        for _ in 1..host_fronts {
            listeners.push(reuseport_listener(addr)?);
        }
        let slots = if design == Design::Shrd {
            vec![(SLOTS / 2, SLOTS - 1)]
        } else {
            Vec::new()
        };
        host_endpoints.push(Endpoint::new(addr, "host", slots));
    }
    let fstats = Arc::new(FrontStats::default());
    let budget = dds_server::Budget::new(crate::frontend::MEMORY_BUDGET);
    let halt = Arc::new(AtomicBool::new(false));
    let cluster_for = |dpu: &[Endpoint]| {
        let mut endpoints = dpu.to_vec();
        let me = endpoints.len();
        endpoints.extend(host_endpoints.iter().cloned());
        Arc::new(ClusterMap {
            endpoints,
            me,
            sharded: design == Design::Shrd,
        })
    };
    let _reg = match &cfg.etcd {
        Some((url, name, ttl)) if !host_endpoints.is_empty() => Some(
            crate::etcd::Registration::start(url, name, design.name(), &host_endpoints, *ttl)?,
        ),
        _ => None,
    };
    let mut fronts = Vec::new();
    let start_fronts = |listeners: Vec<std::net::TcpListener>,
                        cluster: Arc<ClusterMap>,
                        fronts: &mut Vec<std::thread::JoinHandle<()>>|
     -> Result<()> {
        for (i, l) in listeners.into_iter().enumerate() {
            let fe = Frontend::new(
                l,
                Backend::Local(store.clone()),
                FrontConfig {
                    cluster: cluster.clone(),
                    max_clients: 10_000,
                    query_buffer_limit: 64 << 20,
                    max_pending: 4096,
                    max_value: cfg.max_value as usize,
                    budget: budget.clone(),
                },
                fstats.clone(),
            )?;
            let h = halt.clone();
            fronts.push(
                std::thread::Builder::new()
                    .name(format!("dpukv-host-fe-{i}"))
                    .spawn(move || {
                        if let Err(e) = fe.run(&h) {
                            tracing::error!(error = %e, "host front end stopped");
                        }
                    })?,
            );
        }
        Ok(())
    };
    if design == Design::CpuOnly {
        let cluster = cluster_for(&[]);
        start_fronts(listeners, cluster, &mut fronts)?;
        ready(&Serving {
            design,
            endpoints: host_endpoints.clone(),
        });
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        halt.store(true, Ordering::Relaxed);
        for t in fronts {
            let _ = t.join();
        }
        return Ok(());
    }
    let dpu_path = cfg
        .dpu
        .clone()
        .ok_or_else(|| anyhow!("{} needs the DPU's control socket (--dpu)", design.name()))?;
    let wstats = Arc::new(WorkerStats::default());
    let mut listeners = Some(listeners);
    // Attach, serve until the DPU goes away, and attach again when it is back.
    while !stop.load(Ordering::Relaxed) {
        let mut s = match UnixStream::connect(&dpu_path) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "DPU not reachable yet");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let region = if design.uses_queues() {
            Some(SharedRegion::create(
                "dds-dpukv-queues",
                cfg.geometry().region_len(),
            )?)
        } else {
            None
        };
        let attach = Attach {
            design,
            geometry: cfg.geometry(),
            partitions: cfg.partitions,
            host_endpoints: host_endpoints.clone(),
        };
        let fds: Vec<_> = region.iter().map(|r| r.fd()).collect();
        send_frame(&s, &attach, &fds)?;
        let dpu_endpoints = match recv_frame::<AttachReply>(&mut s)?.0 {
            AttachReply::Attached(e) => e,
            AttachReply::Error(e) => bail!("the DPU refused the attachment: {e}"),
        };
        // Host front ends start once, with the DPU's endpoint in their slot map.
        if let Some(l) = listeners.take() {
            start_fronts(l, cluster_for(&dpu_endpoints), &mut fronts)?;
        }
        let wstop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        if let Some(region) = &region {
            let g = cfg.geometry();
            for w in 0..g.workers {
                let queues = (0..g.comm_cores)
                    // SAFETY: the region maps region_len bytes and outlives the workers
                    // (they are joined below, before it is dropped).
                    .map(|c| unsafe { HostQueue::new(region.as_ptr(), &g, c, w) })
                    .collect();
                workers.push(worker::spawn(
                    format!("dpukv-worker-{w}"),
                    queues,
                    store.clone(),
                    g.batch_max(),
                    if design == Design::Lat {
                        worker::Idle::Poll
                    } else {
                        worker::Idle::Save
                    },
                    wstop.clone(),
                    wstats.clone(),
                )?);
            }
        }
        let mut endpoints = dpu_endpoints.clone();
        endpoints.extend(host_endpoints.iter().cloned());
        ready(&Serving { design, endpoints });
        s.set_nonblocking(true)?;
        let mut b = [0u8; 64];
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            match s.read(&mut b) {
                Ok(0) => {
                    tracing::warn!("the DPU went away; its clients lost their connections");
                    break;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(_) => break,
            }
        }
        wstop.store(true, Ordering::Relaxed);
        for t in workers {
            let _ = t.join();
        }
        drop(region);
    }
    halt.store(true, Ordering::Relaxed);
    for t in fronts {
        let _ = t.join();
    }
    Ok(())
}
