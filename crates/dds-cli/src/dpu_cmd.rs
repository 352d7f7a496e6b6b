//! `dds dpu` and `dds format`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use dds_dpu::{Dpu, DpuConfig, ExecMode};

use crate::util::parse_size;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ModeArg {
    /// Zero-copy execution (§4.3): device I/O straight from/to the ring buffers.
    ZeroCopy,
    /// Baseline with the extra request and response copies.
    Copy,
}

#[derive(Args, Clone, Debug)]
pub struct DpuArgs {
    /// Options from a TOML file whose keys are the long option names (`device =
    /// "dds.img"`, `director-memory = "64M"`, `allow-uid = [1000]`, `spin = true`); options
    /// on the command line override them.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Device: a block device or a formatted regular file (`dds format`).
    #[arg(long)]
    pub device: PathBuf,
    /// Control socket to listen on (default: dpu.sock in $XDG_RUNTIME_DIR/dds, /run/dds for
    /// root, otherwise /tmp/dds-$UID; that directory is created with mode 0700).
    #[arg(long, default_value_os_t = dds_host::default_socket_path(), env = "DDS_SOCKET")]
    pub socket: PathBuf,
    /// I/O execution mode.
    #[arg(long, value_enum, default_value = "zero-copy")]
    pub mode: ModeArg,
    /// Also serve this user's processes on the control socket (repeatable); by default only
    /// our own user and root. The socket then becomes mode 0666, so its directory must let
    /// them in (give --socket outside the private default directory).
    #[arg(long = "allow-uid", value_name = "UID")]
    pub allow_uids: Vec<u32>,
    /// Also serve processes whose primary group is this one (repeatable).
    #[arg(long = "allow-gid", value_name = "GID")]
    pub allow_gids: Vec<u32>,
    /// Control connections open at once at most. When all are taken, a new one closes the
    /// longest-waiting connection that holds no group or buffer (or is closed if none does).
    #[arg(long, default_value_t = 64)]
    pub max_control_connections: usize,
    /// Seconds a control request may take to arrive once it began, and a reply to be taken
    /// (a stalled client is disconnected).
    #[arg(long, default_value_t = 10.0)]
    pub control_frame_timeout: f64,
    /// Seconds a control connection that holds no group and no registered buffer may wait
    /// between requests before it is closed (hosts holding groups wait without limit).
    #[arg(long, default_value_t = 30.0)]
    pub control_idle_timeout: f64,
    /// Print the readiness line on stdout as JSON: {"socket", "device", "director", "pid"}.
    #[arg(long)]
    pub json: bool,
    /// Emulate PCIe DMA costs (per-operation latency and a bandwidth cap).
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub dma_cost: bool,
    /// Fixed cost of one DMA operation, nanoseconds.
    #[arg(long, default_value_t = 1000)]
    pub dma_op_ns: u64,
    /// DMA bandwidth cap, GB/s.
    #[arg(long, default_value_t = 12.0)]
    pub dma_gbps: f64,
    /// io_uring queue depth of the device.
    #[arg(long, default_value_t = 128)]
    pub queue_depth: u32,
    /// Largest single read or write.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub max_io: u64,
    /// DPU memory all notification groups' buffers may use together.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub memory_budget: u64,
    /// Bytes of application buffers one host connection may register (zero-copy reads and
    /// writes straight from and into them); registrations past it are refused.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub max_registered_bytes: u64,
    /// Always spin, as on a dedicated DPU core (by default the idle service thread parks
    /// until a host, the control plane or the director has work for it).
    #[arg(long)]
    pub spin: bool,
    /// The DPU's resource profile: its own cores, CPU quota and memory limit.
    #[command(flatten)]
    pub profile: DpuProfileArgs,
    // Its help lists the registered offload apps (`command` in main.rs).
    #[arg(long, requires = "director_listen")]
    pub offload: Option<String>,
    /// Public address the traffic director listens on (the storage server's address).
    #[arg(long)]
    pub director_listen: Option<std::net::SocketAddr>,
    /// Address of the host application that requests not served on the DPU go to. Without
    /// it, the host application announces its address when it starts (`dds kv` and `dds
    /// pageserver` do), and client connections are closed until it has.
    #[arg(long, requires = "offload")]
    pub host_app: Option<std::net::SocketAddr>,
    /// Application signature: "srcIP/prefix:port dstIP/prefix:port proto" (port 0 = any);
    /// connections that do not match are spliced to the host uninspected.
    #[arg(long, default_value = "0.0.0.0/0:0 0.0.0.0/0:0 tcp")]
    pub signature: String,
    /// Director threads; 0 runs the director on the file-service thread (one event loop for
    /// the client sockets, the offloaded reads and the device: no wake-up or context switch
    /// between two threads per batch, for a DPU of one core).
    #[arg(long, default_value_t = 0)]
    pub director_threads: usize,
    /// Steer the signature's flows to the director with flow rules in this network
    /// namespace (nftables TPROXY; the director listens transparently), so that clients
    /// connect to the host's own address; the rules go when the DPU stops
    /// (docs/bump-in-the-wire.md). Needs root (CAP_NET_ADMIN) and nftables.
    #[arg(long, requires = "offload")]
    pub steer: bool,
    /// Offload engine copy mode (the Fig. 20 baseline) instead of zero copy.
    #[arg(long)]
    pub offload_copy: bool,
    /// Pagestore: offload every read of an exposed file, also of pages not written through
    /// this DPU (a DBMS whose pages are located by id); by default only pages with live cache
    /// entries. A benchmark mode: any client that reaches the director may then read every
    /// page of the files the application exposed (docs/security.md).
    #[arg(long)]
    pub offload_uncached: bool,
    /// Cache table capacity (items).
    #[arg(long, default_value_t = 1 << 20)]
    pub cache_items: usize,
    /// Offloaded reads in flight per director thread (the context ring); when all are taken,
    /// reads go to the host.
    #[arg(long, default_value_t = 1024)]
    pub offload_contexts: usize,
    /// Of which one client connection may hold at most.
    #[arg(long, default_value_t = 512)]
    pub offload_contexts_per_conn: usize,
    /// Largest read served on the DPU (size of each pre-allocated read buffer).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub offload_buffer: u64,
    /// Memory all the director's connection buffers may use together. Buffers grow with the
    /// bytes that arrive (never with a length a client announced); a connection the budget
    /// cannot hold is closed.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub director_memory: u64,
    /// Response bytes of offloaded reads the director sends per round before it looks at its
    /// sockets again, so that requests arriving meanwhile reach the device sooner.
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pub director_round_bytes: u64,
    /// Client connections each director thread serves at most; more are closed at accept.
    #[arg(long, default_value_t = 1024)]
    pub director_max_connections: usize,
    /// Largest client message (command) the offload app accepts (`redis`: also the largest
    /// bulk string, like Redis's proto-max-bulk-len; default 64M). A larger one gets an error
    /// reply and the connection is closed.
    #[arg(long, value_parser = parse_size)]
    pub offload_max_message: Option<u64>,
    /// Largest host response the offload app passes on (`redis`: default 64M plus 64K).
    #[arg(long, value_parser = parse_size)]
    pub offload_max_response: Option<u64>,
}

/// The offload engine of `--offload`, if given: the app resolved by name (the applications'
/// registry) or as a C plugin path, and the director's options.
fn offload_config(a: &DpuArgs) -> Result<Option<dds_dpu::OffloadConfig>> {
    let Some(name) = &a.offload else {
        return Ok(None);
    };
    let listen = a.director_listen.context("--director-listen is required")?;
    let signature: dds_director::Signature = a
        .signature
        .parse()
        .map_err(|e| anyhow::anyhow!("--signature: {e}"))?;
    let size = |v: Option<u64>, flag: &str| {
        v.map(|n| usize::try_from(n).with_context(|| flag.to_string()))
            .transpose()
    };
    let opts = dds_offload_api::AppOptions {
        uncached: a.offload_uncached,
        max_message: size(a.offload_max_message, "--offload-max-message")?,
        max_response: size(a.offload_max_response, "--offload-max-response")?,
    };
    let app = crate::offload_apps::registry().resolve(name, &opts)?;
    let contexts = a.offload_contexts.max(1);
    Ok(Some(dds_dpu::OffloadConfig {
        cache_items: a.cache_items,
        director_inline: a.director_threads == 0,
        ..dds_dpu::OffloadConfig::new(
            app,
            Some(dds_director::DirectorConfig {
                signature,
                threads: a.director_threads.max(1),
                copy_mode: a.offload_copy,
                context_ring_len: contexts,
                max_contexts_per_conn: a.offload_contexts_per_conn,
                buffer_bytes: usize::try_from(a.offload_buffer).context("--offload-buffer")?,
                memory_bytes: usize::try_from(a.director_memory).context("--director-memory")?,
                round_bytes: usize::try_from(a.director_round_bytes)
                    .context("--director-round-bytes")?,
                max_connections: a.director_max_connections.max(1),
                transparent: a.steer,
                ..match a.host_app {
                    Some(host) => dds_director::DirectorConfig::new(listen, host),
                    None => dds_director::DirectorConfig::announced(listen),
                }
            }),
        )
    }))
}

/// The resource profile of a DPU-side process (`dds dpu`, `dds dpukv dpu`,
/// `dds osd --placement dpu`): the DPU's own cores, CPU quota and memory.
#[derive(clap::Args, Clone, Debug)]
pub struct DpuProfileArgs {
    /// Resource profile: CPUs the DPU process may use (e.g. `1` or `0-1`), to model a DPU's
    /// own cores.
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<CpuList>,
    /// Resource profile: CPU time quota in cores (cgroup cpu.max or cpu.cfs_quota_us), e.g. 0.5.
    #[arg(long)]
    pub cpu_quota: Option<f64>,
    /// Resource profile: memory limit of the DPU process (cgroup).
    #[arg(long, value_parser = crate::util::parse_size)]
    pub memory: Option<u64>,
}

impl DpuProfileArgs {
    /// Applies the profile to this process; the caller removes it at exit.
    pub fn apply(&self) -> Result<dds_dpu::profile::AppliedProfile> {
        dds_dpu::profile::ResourceProfile {
            cpus: self.cpus.as_ref().map(|c| c.0.clone()),
            cpu_quota: self.cpu_quota,
            memory_bytes: self.memory,
        }
        .apply()
        .context("apply the DPU resource profile")
    }
}

/// A parsed `--cpus` list (a newtype, so clap takes it as one value).
#[derive(Clone, Debug)]
pub struct CpuList(pub Vec<usize>);

pub(crate) fn parse_cpus(s: &str) -> Result<CpuList, String> {
    dds_dpu::profile::parse_cpu_list(s).map(CpuList)
}

pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got `{s}`")),
    }
}

impl DpuArgs {
    pub fn config(&self) -> Result<DpuConfig> {
        let max_io = u32::try_from(self.max_io).context("--max-io must be below 4 GiB")?;
        Ok(DpuConfig {
            socket: self.socket.clone(),
            exec_mode: match self.mode {
                ModeArg::ZeroCopy => ExecMode::ZeroCopy,
                ModeArg::Copy => ExecMode::Copy,
            },
            dma_cost: self.dma_cost.then_some(dds_dma::CostModel {
                per_op_ns: self.dma_op_ns,
                bytes_per_sec: (self.dma_gbps * 1e9) as u64,
            }),
            max_io_bytes: max_io,
            memory_budget_bytes: self.memory_budget,
            max_registered_bytes_per_conn: self.max_registered_bytes,
            park_when_idle: !self.spin,
            allow_uids: self.allow_uids.clone(),
            allow_gids: self.allow_gids.clone(),
            max_control_connections: self.max_control_connections,
            control_frame_timeout: Duration::try_from_secs_f64(self.control_frame_timeout)
                .ok()
                .filter(|d| !d.is_zero())
                .context("--control-frame-timeout must be a positive number of seconds")?,
            control_idle_timeout: Duration::try_from_secs_f64(self.control_idle_timeout)
                .ok()
                .filter(|d| !d.is_zero())
                .context("--control-idle-timeout must be a positive number of seconds")?,
            ..DpuConfig::default()
        })
    }
}

pub fn run_dpu(a: DpuArgs) -> Result<()> {
    let config = a.config()?;
    if a.socket == dds_host::default_socket_path() {
        let dir = dds_proto::control::default_socket_dir();
        dds_proto::control::ensure_private_dir(&dir)
            .with_context(|| format!("socket directory {}", dir.display()))?;
    }
    // Before anything listens: a SIGTERM that arrives as soon as the socket exists must take
    // the orderly path.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])?;
    let mut applied = a.profile.apply()?;
    let device = a.device.clone();
    let queue_depth = a.queue_depth as usize;
    let max_io = config.max_io_bytes;
    let offload = match offload_config(&a) {
        Ok(o) => o,
        Err(e) => {
            applied.remove();
            return Err(e);
        }
    };
    let started = Dpu::start_with(
        config,
        move || {
            let dev = dds_fs::UringDevice::open(&device, queue_depth)?;
            dds_fs::FileService::open(
                Box::new(dev),
                dds_fs::OpenConfig {
                    max_io_bytes: max_io,
                    ..dds_fs::OpenConfig::default()
                },
            )
        },
        offload,
    );
    let handle = match started {
        Ok(h) => h,
        Err(e) => {
            applied.remove();
            return Err(e).with_context(|| format!("start DPU on {}", a.device.display()));
        }
    };
    let p = &a.profile;
    let profile = if p.cpus.is_some() || p.cpu_quota.is_some() || p.memory.is_some() {
        format!(
            ", resource profile {}",
            serde_json::to_string(&applied).unwrap_or_default()
        )
    } else {
        String::new()
    };
    eprintln!(
        "dds dpu: serving {} on {} ({} execution, DMA cost model {}{profile})",
        a.device.display(),
        a.socket.display(),
        a.mode
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string()),
        if a.dma_cost { "on" } else { "off" },
    );
    let steered = match (a.steer, handle.director()) {
        (true, Some(d)) => match steer(&a, d.local_addr()) {
            Ok(rules) => Some(rules),
            Err(e) => {
                handle.shutdown();
                applied.remove();
                return Err(e);
            }
        },
        _ => None,
    };
    print_ready(&a, handle.director().map(|d| d.local_addr()));
    if let Some(sig) = signals.forever().next() {
        tracing::info!(sig, "shutting down");
    }
    if steered.is_some() {
        if let Err(e) = dds_netns::wire::FlowRules::remove() {
            eprintln!("dds dpu: removing the flow rules: {e}");
        }
    }
    if let Some(d) = handle.director() {
        eprintln!("dds dpu: director: {}", counters(&d.stats()));
    }
    handle.shutdown();
    applied.remove();
    Ok(())
}

/// Installs the flow rules that steer `--signature`'s flows to the director at `director`
/// (replacing those a previous run left).
fn steer(a: &DpuArgs, director: std::net::SocketAddr) -> Result<dds_netns::wire::FlowRules> {
    use dds_netns::wire::{FlowRules, FlowSide};
    let sig: dds_director::Signature = a
        .signature
        .parse()
        .map_err(|e| anyhow::anyhow!("--signature: {e}"))?;
    if sig.proto == Some(dds_director::Proto::Udp) {
        anyhow::bail!("--steer: the signature names UDP flows; the director splits TCP");
    }
    let side = |e: dds_director::signature::Endpoint| FlowSide {
        net: e.addr.map(|a| (a, e.prefix)),
        port: e.port,
    };
    let rules = FlowRules {
        src: side(sig.src),
        dst: side(sig.dst),
        to_port: director.port(),
    };
    rules
        .install()
        .context("--steer: installing the flow rules")?;
    eprintln!(
        "dds dpu: flow rules installed (signature {sig}):\n{}",
        rules.script().unwrap_or_default()
    );
    Ok(rules)
}

/// Counters as words, sorted by name: `accepted 4, ..., offloaded 80938, ...`.
fn counters(stats: &dds_director::DirectorStats) -> String {
    match serde_json::to_value(stats) {
        Ok(serde_json::Value::Object(m)) => m
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        _ => String::new(),
    }
}

/// The one line on stdout that says the DPU accepts connections.
fn print_ready(a: &DpuArgs, director: Option<std::net::SocketAddr>) {
    use std::io::Write;
    let line = if a.json {
        serde_json::json!({
            "socket": a.socket,
            "device": a.device,
            "director": director.map(|d| d.to_string()),
            "pid": std::process::id(),
        })
        .to_string()
    } else {
        format!(
            "dds dpu ready: socket {} device {} director {} pid {}",
            a.socket.display(),
            a.device.display(),
            director.map_or_else(|| "none".to_string(), |d| d.to_string()),
            std::process::id()
        )
    };
    let mut out = std::io::stdout().lock();
    // A closed stdout does not stop the daemon.
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

#[derive(Args, Clone, Debug)]
pub struct FormatArgs {
    /// Device: a block device, or a regular file (created and preallocated to --size).
    #[arg(long)]
    pub device: PathBuf,
    /// Size of a new device file (a block device uses its whole size).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Segment size (a multiple of the block size).
    #[arg(long, value_parser = parse_size)]
    pub segment_size: Option<u64>,
    /// Most files.
    #[arg(long)]
    pub max_files: Option<u32>,
    /// Most directories.
    #[arg(long)]
    pub max_dirs: Option<u32>,
    /// Format even a device that holds a dds-fs file system or other data (which is lost),
    /// and let --size shrink an existing device file.
    #[arg(long)]
    pub force: bool,
}

pub fn run_format(a: FormatArgs) -> Result<()> {
    format_device(&a)?;
    println!("formatted {}", a.device.display());
    Ok(())
}

/// Bytes at the start of a device that must be zero (or not hold a dds-fs superblock) unless
/// `--force` is given.
const IN_USE_PROBE_BYTES: usize = 1 << 20;

pub fn format_device(a: &FormatArgs) -> Result<()> {
    let path = &a.device;
    let existing = std::fs::metadata(path).ok();
    let is_block = existing
        .as_ref()
        .is_some_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
    // The lock comes first: nothing is opened for writing while a DPU uses the device.
    let (lock, created) = match &existing {
        Some(_) => (dds_fs::DeviceLock::acquire(path)?, false),
        None => {
            if a.size.is_none() {
                bail!(
                    "{} does not exist (give --size to create a device file)",
                    path.display()
                );
            }
            (dds_fs::DeviceLock::create(path)?, true)
        }
    };
    let r = format_locked(a, lock, created, is_block);
    if r.is_err() && created {
        let _ = std::fs::remove_file(path);
    }
    r
}

fn format_locked(
    a: &FormatArgs,
    lock: dds_fs::DeviceLock,
    created: bool,
    is_block: bool,
) -> Result<()> {
    let path = &a.device;
    if !created && !a.force {
        let mut head = vec![0u8; IN_USE_PROBE_BYTES];
        let n = lock.read_head(&mut head)?;
        let head = &head[..n];
        if head.starts_with(dds_fs::SUPERBLOCK_MAGIC) {
            bail!(
                "{} holds a dds-fs file system; give --force to format it anyway (its files are lost)",
                path.display()
            );
        }
        if head.iter().any(|&b| b != 0) {
            bail!(
                "{} is not empty (non-zero data in its first MiB); give --force to format it anyway",
                path.display()
            );
        }
    }
    if let (false, Some(size)) = (is_block, a.size) {
        dds_fs::UringDevice::size_file(&lock, path, size, a.force)
            .with_context(|| format!("size {}", path.display()))?;
    }
    let mut dev = dds_fs::UringDevice::open_locked(path, 32, lock)
        .with_context(|| format!("open {}", path.display()))?;
    let mut cfg = dds_fs::FormatConfig::default();
    if let Some(s) = a.segment_size {
        cfg.segment_size = s;
    }
    if let Some(n) = a.max_files {
        cfg.max_files = n;
    }
    if let Some(n) = a.max_dirs {
        cfg.max_dirs = n;
    }
    dds_fs::format(&mut dev, cfg).with_context(|| format!("format {}", path.display()))?;
    Ok(())
}
