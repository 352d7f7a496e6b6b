//! The benchmark's processes: `dds` children (servers pinned with taskset, the DPU with its
//! own `--cpus`), ready lines, the DPU and its director counters.

use super::*;

pub(super) type Proc = ChildGuard;

/// How long a child may take to stop on SIGTERM before it is killed.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(5);

pub(super) fn have_taskset() -> bool {
    Command::new("taskset")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `dds <args>`, pinned to `cpus` (a taskset list) when given, in network namespace `ns`
/// when given (`ip netns exec`). taskset and `ip netns exec` exec the command, so the
/// child's pid is the dds process's.
pub(super) fn dds_command(
    args: &[String],
    cpus: Option<&str>,
    ns: Option<&str>,
) -> Result<Command> {
    let exe = std::env::current_exe().context("locate the dds binary")?;
    let mut argv: Vec<std::ffi::OsString> = Vec::new();
    if let Some(ns) = ns {
        argv.extend(["ip", "netns", "exec", ns].map(Into::into));
    }
    match cpus {
        Some(list) if have_taskset() => argv.extend(["taskset", "-c", list].map(Into::into)),
        Some(list) => bail!("taskset is not installed; cannot pin to CPUs {list}"),
        None => {}
    }
    argv.push(exe.into());
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]).args(args);
    Ok(c)
}

/// Spawns a process that prints one JSON ready line on stdout; returns it with the line.
pub(super) fn spawn_ready(
    name: &'static str,
    cmd: &mut Command,
    timeout: Duration,
) -> Result<(Proc, Value)> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("start {name}"))?;
    let mut proc = ChildGuard::new(child, name);
    let line = proc.ready_line(timeout)?;
    let v: Value =
        serde_json::from_str(&line).with_context(|| format!("{name} ready line: {line}"))?;
    Ok((proc, v))
}

pub(super) fn dpu_args(device: &Path, socket: &Path, dma_cost: &str) -> Vec<String> {
    vec![
        "dpu".into(),
        "--device".into(),
        device.display().to_string(),
        "--socket".into(),
        socket.display().to_string(),
        "--dma-cost".into(),
        dma_cost.into(),
    ]
}

/// The DPU's stderr is passed through, but for its traffic-director statistics line (printed
/// at exit), which the join handle returns (the report holds its counters).
pub(super) type DirectorStatsLine = std::thread::JoinHandle<Option<String>>;

/// Starts `dds <args>` (`dds dpu ...`, its CPUs in `args`, `--json` added); returns it once
/// it printed its ready line, with the address its traffic director got (when it has one).
pub(super) fn start_dpu(
    args: &[String],
    ns: Option<&str>,
) -> Result<(Proc, DirectorStatsLine, Option<SocketAddr>)> {
    let mut args = args.to_vec();
    args.push("--json".into());
    let mut cmd = dds_command(&args, None, ns)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start dds dpu")?;
    let stderr = child.stderr.take().context("stderr")?;
    let stats = std::thread::spawn(move || {
        let mut last = None;
        for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
            if line.starts_with(DIRECTOR_LINE) {
                last = Some(line);
            } else {
                eprintln!("{line}");
            }
        }
        last
    });
    let mut p = ChildGuard::new(child, "dds dpu");
    let line = p.ready_line(Duration::from_secs(20))?;
    let ready: Value =
        serde_json::from_str(&line).with_context(|| format!("dds dpu's ready line {line:?}"))?;
    let director = ready["director"].as_str().map(str::parse).transpose()?;
    Ok((p, stats, director))
}

/// How `dds dpu` begins the line of its director's counters at exit.
const DIRECTOR_LINE: &str = "dds dpu: director: ";

/// The counters of a `dds dpu: director: name n, name n, ...` line.
pub(super) fn parse_director_stats(line: Option<&str>) -> Value {
    let Some(body) = line.and_then(|l| l.strip_prefix(DIRECTOR_LINE)) else {
        return Value::Null;
    };
    let mut m = serde_json::Map::new();
    for kv in body.split(", ") {
        if let Some((k, v)) = kv.split_once(' ') {
            if let Ok(n) = v.trim().parse::<u64>() {
                m.insert(k.trim().to_string(), json!(n));
            }
        }
    }
    Value::Object(m)
}

/// Why mode (c) could not run.
#[derive(Debug)]
pub struct NotAvailable(pub String);

/// EXTENSION POINT for mode (c), DDS offload: given the `dds dpu` command line, adds the
/// traffic-director and offload-engine flags so the DPU serves the pagestore's clients itself
/// (reads offloaded to the DPU's file service, the rest forwarded to the host server, which
/// announces its address to the DPU when it starts). The director binds a port of its own and
/// reports it on the DPU's ready line. `copy` selects the offload engine's copy mode (the
/// Fig. 20 baseline). Reports [`NotAvailable`] when `dds dpu` lacks the flags.
pub fn offload_dpu_args(dpu_args: &mut Vec<String>, copy: bool) -> Result<(), NotAvailable> {
    let help = std::env::current_exe()
        .ok()
        .and_then(|exe| Command::new(exe).args(["dpu", "--help"]).output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for flag in ["--offload ", "--director-listen", "--offload-uncached"] {
        if !help.contains(flag) {
            return Err(NotAvailable(format!(
                "`dds dpu` has no {} flag: the traffic director and offload engine are not available",
                flag.trim()
            )));
        }
    }
    if copy && !help.contains("--offload-copy") {
        return Err(NotAvailable("`dds dpu` has no --offload-copy flag".into()));
    }
    dpu_args.extend([
        "--offload".to_string(),
        "pagestore".to_string(),
        "--director-listen".to_string(),
        "127.0.0.1:0".to_string(),
        // The files were written by the host server, not through this DPU: serve every read.
        "--offload-uncached".to_string(),
    ]);
    if copy {
        dpu_args.push("--offload-copy".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn director_stats_line_is_parsed() {
        let v = parse_director_stats(Some(
            "dds dpu: director: accepted 8, split 8, offloaded 80938, forwarded 59254, fallback 59254",
        ));
        assert_eq!(v["offloaded"], 80938);
        assert_eq!(v["fallback"], 59254);
        assert_eq!(parse_director_stats(None), Value::Null);
    }
}
