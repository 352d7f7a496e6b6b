//! The four OSDs of one placement: the `dds osd` processes (and, for placement dpu, their
//! `dds osd-store` host processes) started under their CPU budgets, waited for, sampled for CPU
//! time and stopped.

use super::cgroup::CpuBudget;
use super::osd_placements;
use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::kv::taskset;
use crate::placement::Placement;
use anyhow::{bail, Context, Result};
use dds_objstore::ObjectId;
use dds_osd::client::Client;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The processes of one cluster of four OSDs.
pub(super) struct Cluster {
    pub(super) name: String,
    /// The map, device files and logs; removed with the cluster.
    dir: PathBuf,
    host: Vec<ChildGuard>,
    dpu: Vec<ChildGuard>,
    _host_budget: CpuBudget,
    _dpu_budget: CpuBudget,
    pub(super) host_budget_info: Value,
    pub(super) dpu_budget_info: Value,
    pub(super) client: Client,
}

/// Waits for the ready line of a `dds osd` whose stdout is piped (`osd.N ready: clients on
/// ADDR, peers on ADDR`) and returns the two addresses it bound.
fn read_ready(child: &mut ChildGuard) -> Result<(SocketAddr, SocketAddr)> {
    let line = child.ready_line(Duration::from_secs(30))?;
    dds_osd::parse_ready_line(&line)
        .with_context(|| format!("{}: not a ready line: {line:?}", child.name()))
}

/// The map of the cluster: every OSD with the addresses known so far (port 0 before its
/// ready line), the pools.
fn map_text(
    epoch: u32,
    dpus: &[bool],
    addrs: &[(SocketAddr, SocketAddr)],
    o: &StartOpts,
) -> String {
    let mut text = format!("epoch = {epoch}\n");
    for (id, (d, (a, p))) in dpus.iter().zip(addrs).enumerate() {
        text += &format!(
            "[[osd]]\nid = {id}\naddr = \"{a}\"\npeer_addr = \"{p}\"\nweight = 1.0\nplacement = \"{}\"\n",
            if *d { "dpu" } else { "host" }
        );
    }
    for &r in o.replication {
        text += &format!(
            "[[pool]]\nid = {r}\nname = \"p{r}\"\npg_num = {}\nsize = {r}\n",
            o.pg_num
        );
    }
    text
}

/// Writes a file whole (readers never see half of it).
fn write_whole(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Starts a `dds osd-store` on its device file (formatted first with `format`: a fresh
/// store), in `budget` and on `host_cpus`, and waits for its ready line.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_store(
    exe: &Path,
    host_cpus: Option<&[usize]>,
    dev: &Path,
    sock: &Path,
    device_size: u64,
    format: bool,
    log: std::fs::File,
    budget: &CpuBudget,
) -> Result<ChildGuard> {
    let _ = std::fs::remove_file(sock);
    let mut cmd = taskset(exe, host_cpus);
    cmd.arg("osd-store")
        .arg("--device")
        .arg(dev)
        .arg("--socket")
        .arg(sock)
        .args(["--size", &device_size.to_string()])
        .stdout(Stdio::piped())
        .stderr(log);
    if format {
        cmd.args(["--format", "--force"]);
    }
    let child = cmd.spawn().context("start dds osd-store")?;
    let mut g = ChildGuard::new(child, "dds osd-store");
    budget
        .add(g.pid())
        .context("move dds osd-store into the host budget")?;
    // Its ready line comes once it listens (the socket file exists from the bind on, before
    // a connection is accepted).
    let line = g.ready_line(Duration::from_secs(30))?;
    if !line.starts_with("osd-store ready") {
        bail!("dds osd-store: unexpected first line {line:?}");
    }
    Ok(g)
}

pub(super) struct StartOpts<'a> {
    pub(super) exe: &'a Path,
    pub(super) dir: &'a Path,
    pub(super) place: &'a Placement,
    pub(super) host_quota: f64,
    pub(super) dpu_quota: f64,
    pub(super) dma_cost: &'a str,
    pub(super) flow_adapt: bool,
    pub(super) pg_num: u32,
    pub(super) device_size: u64,
    pub(super) replication: &'a [u32],
}

pub(super) fn start_cluster(name: &str, o: &StartOpts) -> Result<Cluster> {
    let dpus = osd_placements(name)?;
    let me = std::process::id();
    let tag = name.replace('+', "-");
    let host_budget =
        CpuBudget::create(&format!("dds-bench-objects-{me}-{tag}-host"), o.host_quota);
    let dpu_budget = CpuBudget::create(&format!("dds-bench-objects-{me}-{tag}-dpu"), o.dpu_quota);
    let dir = o.dir.join(&tag);
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    // The OSDs bind port 0 and report their ports; the map then names them (epoch 2), and
    // the OSDs reread it.
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut addrs = vec![(any, any); dpus.len()];
    let map = dir.join("cluster.toml");
    write_whole(&map, &map_text(1, &dpus, &addrs, o))?;
    let host_cpus = o.place.host_cpus.as_deref();
    let size = o.device_size.to_string();
    let (mut host, mut dpu) = (Vec::new(), Vec::new());
    for (id, &d) in dpus.iter().enumerate() {
        let dev = dir.join(format!("osd{id}.img"));
        let log = |what: &str| std::fs::File::create(dir.join(format!("osd{id}.{what}.log")));
        if d {
            let sock = dir.join(format!("osd{id}.store.sock"));
            host.push(spawn_store(
                o.exe,
                host_cpus,
                &dev,
                &sock,
                o.device_size,
                true,
                log("store")?,
                &host_budget,
            )?);
            let mut cmd = Command::new(o.exe);
            cmd.args(["osd", "--id", &id.to_string(), "--map"])
                .arg(&map)
                .args(["--placement", "dpu", "--proxy-socket"])
                .arg(&sock)
                .args(["--dma-cost", o.dma_cost, "--frame-memory", "512M"]);
            cmd.args(o.place.dpu_args());
            if !o.flow_adapt {
                cmd.args(["--batching", "off", "--chunking", "off"]);
            }
            let child = cmd
                .stdout(Stdio::piped())
                .stderr(log("front")?)
                .spawn()
                .context("start dds osd --placement dpu")?;
            let mut g = ChildGuard::new(child, "dds osd (dpu)");
            dpu_budget
                .add(g.pid())
                .context("move dds osd into the DPU budget")?;
            addrs[id] = read_ready(&mut g)?;
            dpu.push(g);
        } else {
            let child = taskset(o.exe, host_cpus)
                .args(["osd", "--id", &id.to_string(), "--map"])
                .arg(&map)
                .args(["--placement", "host", "--device"])
                .arg(&dev)
                .args([
                    "--format",
                    "--force",
                    "--size",
                    &size,
                    "--frame-memory",
                    "512M",
                ])
                .stdout(Stdio::piped())
                .stderr(log("osd")?)
                .spawn()
                .context("start dds osd")?;
            let mut g = ChildGuard::new(child, "dds osd (host)");
            host_budget
                .add(g.pid())
                .context("move dds osd into the host budget")?;
            addrs[id] = read_ready(&mut g)?;
            host.push(g);
        }
    }
    write_whole(&map, &map_text(2, &dpus, &addrs, o))?;
    let client = Client::connect_map(&map).map_err(|e| anyhow::anyhow!("connect: {e}"))?;
    // Every pool takes a write before the clock starts (PGs peered).
    for &r in o.replication {
        client
            .write_full(&ObjectId::new(u64::from(r), b"warm".to_vec()), b"warm")
            .map_err(|e| anyhow::anyhow!("{name}: pool p{r} takes no write: {e}"))?;
    }
    Ok(Cluster {
        name: name.into(),
        dir,
        host,
        dpu,
        host_budget_info: json!(host_budget),
        dpu_budget_info: json!(dpu_budget),
        _host_budget: host_budget,
        _dpu_budget: dpu_budget,
        client,
    })
}

impl Cluster {
    pub(super) fn cpu(&self) -> (f64, f64) {
        let sum = |v: &[ChildGuard]| {
            v.iter()
                .map(|g| process_cpu_seconds(g.pid()).unwrap_or(0.0))
                .sum()
        };
        (sum(&self.host), sum(&self.dpu))
    }

    pub(super) fn stop(mut self) {
        for g in self.dpu.iter_mut().chain(self.host.iter_mut()) {
            let _ = g.stop(Duration::from_secs(5));
        }
        // The devices are preallocated: a sweep over placements must not keep them all.
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove: {e}");
        }
    }
}
