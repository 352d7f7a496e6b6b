//! The two processes of a deployment (`docs/dpu-kv.md` §3–§4): the DPU process (`dds dpukv
//! dpu`), which waits for a host on its control socket and runs the front ends of the host's
//! design, and the host process (`dds dpukv host`), which owns the store, the queue region
//! and the workers, and attaches to the DPU.

use std::io::Read;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use dds_dma::CostModel;
use dds_shm::SharedRegion;
use dds_sys::{recv_with_fds, send_with_fds};
use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterMap, Endpoint, SLOTS};
use crate::frontend::{reuseport_listener, Backend, FrontConfig, FrontStats, Frontend, Queues};
use crate::queue::{Geometry, HostQueue};
use crate::store::SharedStore;
use crate::worker::{self, WorkerStats};
use crate::Design;

/// Most bytes of a control frame.
const MAX_FRAME: usize = 64 << 10;

/// The host's request to the DPU.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attach {
    /// Design.
    pub design: Design,
    /// Queue pairs (designs with host workers).
    pub geometry: Geometry,
    /// Partitions of the host store (requests of partition p go to worker p % workers).
    pub partitions: u32,
    /// The host's own endpoints.
    pub host_endpoints: Vec<Endpoint>,
}

/// The DPU's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AttachReply {
    /// Serving: the DPU's endpoints.
    Attached(Vec<Endpoint>),
    /// Refused.
    Error(String),
}

fn send_frame(
    s: &UnixStream,
    v: &impl Serialize,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<()> {
    let body = serde_json::to_vec(v)?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    send_with_fds(s, &frame, fds)?;
    Ok(())
}

/// Receives one frame; its length is checked before anything is allocated for it.
fn recv_frame<T: for<'de> Deserialize<'de>>(s: &mut UnixStream) -> Result<(T, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut fds = Vec::new();
    let n = recv_with_fds(s, &mut head, &mut fds)?;
    if n == 0 {
        bail!("control connection closed");
    }
    if n < 4 {
        s.read_exact(&mut head[n..])?;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FRAME {
        bail!("control frame of {len} bytes refused (limit {MAX_FRAME})");
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((serde_json::from_slice(&body).context("control frame")?, fds))
}

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
                    let st = SharedStore::new(cfg.partitions, cfg.memory)
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
    let store = SharedStore::new(cfg.partitions as usize, cfg.memory)
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

/// Waits for a path to exist (a starting DPU's socket).
pub fn wait_for(path: &Path, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
