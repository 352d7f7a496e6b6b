//! The Ceph side of `dds bench objects --with-ceph`: one monitor and as many BlueStore OSDs on
//! files as the DDS side runs, auth none, loopback only, pools `p1`/`p3` of the same sizes,
//! every daemon in the same host CPU budget; the load is `rados bench` (write with
//! `--no-cleanup`, then `seq` and `rand`), parsed from its output. The recipe is the one of
//! BENCHMARKS.md ("Objects"); nothing is installed here.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cgroup::CpuBudget;
use super::{size_label, Phase, Plan, Point};
use crate::child::ChildGuard;
use crate::cpu::process_cpu_seconds;
use crate::report::ratio;

const TOOLS: [&str; 5] = ["ceph-mon", "ceph-osd", "ceph", "rados", "monmaptool"];
/// What RGW adds to [`TOOLS`].
const RGW_TOOLS: [&str; 2] = ["radosgw", "radosgw-admin"];

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
                && std::fs::metadata(&f).is_ok_and(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o111 != 0
                })
        })
    })
}

/// Fails, saying how to install them, unless the Ceph daemons and tools are on PATH (with
/// `rgw`, radosgw's too). `option` names the option that asked for them.
pub fn check_installed(option: &str, rgw: bool) -> Result<()> {
    let want: Vec<&str> = TOOLS
        .iter()
        .chain(if rgw { &RGW_TOOLS[..] } else { &[] })
        .copied()
        .collect();
    let missing: Vec<&str> = want.iter().copied().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        bail!(
            "{option} needs {} on PATH (missing: {}). Install Ceph's packages first, e.g. on \
             Debian/Ubuntu: `apt-get install --no-install-recommends ceph-mon ceph-osd \
             ceph-common{}`; dds bench installs nothing itself",
            want.join(", "),
            missing.join(", "),
            if rgw { " radosgw" } else { "" }
        );
    }
    Ok(())
}

/// What the Ceph side needs from the run.
pub struct CephOpts<'a> {
    pub dir: &'a Path,
    pub port: u16,
    pub osds: usize,
    pub plan: &'a Plan,
    pub host_quota: f64,
    pub host_cpus: Option<&'a [usize]>,
    pub pg_num: u32,
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "5f1c3a4e-0000-4000-8000-000000000001".into())
}

fn tool(cpus: Option<&[usize]>, name: &str) -> Command {
    crate::kv::taskset(Path::new(name), cpus)
}

/// Runs a Ceph command to completion (bounded by `timeout`); its stdout.
fn run_cmd(conf: &str, args: &[&str], secs: u32) -> Result<String> {
    let out = Command::new("timeout")
        .arg(secs.to_string())
        .args(args.iter().take(1))
        .args(["-c", conf])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Cluster {
    /// CPU seconds of every daemon so far.
    pub fn cpu(&self) -> f64 {
        self.daemons
            .iter()
            .map(|g| process_cpu_seconds(g.pid()).unwrap_or(0.0))
            .sum()
    }

    /// CPU seconds of `radosgw` so far (0 without it).
    pub fn rgw_cpu(&self) -> f64 {
        self.daemons
            .iter()
            .filter(|g| g.name() == "radosgw")
            .map(|g| process_cpu_seconds(g.pid()).unwrap_or(0.0))
            .sum()
    }

    /// Stops every daemon: the OSDs and the others first, the monitor last; removes the
    /// cluster's directory.
    pub fn stop(mut self) {
        // OSDs first, the monitor (the first daemon) last; OSDs take seconds to exit.
        for g in self.daemons.iter_mut().skip(1) {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(g.pid() as i32, libc::SIGTERM) };
        }
        for g in self.daemons.iter_mut().skip(1) {
            let _ = g.stop(Duration::from_secs(20));
        }
        if let Some(m) = self.daemons.first_mut() {
            let _ = m.stop(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The shape of a Ceph cluster [`start`] brings up.
pub struct Setup<'a> {
    pub dir: &'a Path,
    pub port: u16,
    pub osds: usize,
    /// Size of each OSD's block file (at least 4 GiB).
    pub device_size: u64,
    /// A pool `p{r}` of `pg_num` PGs for each replication factor `r`.
    pub pools: &'a [u32],
    pub pg_num: u32,
    pub host_cpus: Option<&'a [usize]>,
    /// Lines added to `[global]`.
    pub global: &'a str,
    /// Sections appended to the configuration.
    pub sections: &'a str,
}

/// A running Ceph cluster: the monitor first, then the OSDs, then any other daemon.
pub struct Cluster {
    conf: String,
    dir: std::path::PathBuf,
    daemons: Vec<ChildGuard>,
    host_cpus: Option<Vec<usize>>,
}

/// Brings up a monitor and `s.osds` BlueStore OSDs on files, every daemon in `budget`, and
/// waits until every pool of `s.pools` takes a write.
pub fn start(s: &Setup, budget: &CpuBudget) -> Result<Cluster> {
    let dir = s.dir.join("ceph");
    std::fs::create_dir_all(dir.join("run"))?;
    std::fs::create_dir_all(dir.join("log"))?;
    std::fs::create_dir_all(dir.join("mon-a"))?;
    let d = dir.display().to_string();
    let fsid = uuid();
    let port = s.port;
    let conf_text = format!(
        "[global]\nfsid = {fsid}\nmon_host = v2:127.0.0.1:{port}\npublic_addr = 127.0.0.1\n\
         cluster_addr = 127.0.0.1\nauth_cluster_required = none\nauth_service_required = none\n\
         auth_client_required = none\nrun_dir = {d}/run\nadmin_socket = {d}/run/$name.asok\n\
         log_file = {d}/log/$name.log\nmon_allow_pool_size_one = true\n\
         mon_allow_pool_delete = true\nmon_data_avail_warn = 1\n\
         osd_pool_default_pg_autoscale_mode = off\n{}[mon.a]\nmon_data = {d}/mon-a\n[osd]\n\
         osd_data = {d}/osd-$id\ncrush_location = root=default host=h$id\n\
         bluestore_block_path = {d}/osd-$id/block.img\nbluestore_block_create = true\n\
         bluestore_block_size = {}\nosd_memory_target = 1073741824\n\
         bluestore_cache_autotune = false\nbluestore_cache_size = 268435456\n{}",
        s.global,
        s.device_size.max(4 << 30),
        s.sections,
    );
    let conf = dir.join("ceph.conf").display().to_string();
    std::fs::write(&conf, conf_text)?;
    let monmap = dir.join("monmap").display().to_string();
    let st = Command::new("monmaptool")
        .args(["--create", "--addv", "a", &format!("[v2:127.0.0.1:{port}]")])
        .args(["--fsid", &fsid, &monmap])
        .stdout(Stdio::null())
        .status()
        .context("monmaptool")?;
    if !st.success() {
        bail!("monmaptool failed ({st})");
    }
    run_cmd(
        &conf,
        &["ceph-mon", "--mkfs", "-i", "a", "--monmap", &monmap],
        60,
    )?;
    let log = |n: &str| std::fs::File::create(dir.join("log").join(n));
    let mut c = Cluster {
        conf: conf.clone(),
        dir: dir.clone(),
        daemons: Vec::new(),
        host_cpus: s.host_cpus.map(<[usize]>::to_vec),
    };
    let mon = tool(s.host_cpus, "ceph-mon")
        .args(["-c", &conf, "-i", "a", "-f"])
        .stdout(Stdio::null())
        .stderr(log("mon.out")?)
        .spawn()
        .context("start ceph-mon")?;
    let g = ChildGuard::new(mon, "ceph-mon");
    budget
        .add(g.pid())
        .context("move ceph-mon into the host budget")?;
    c.daemons.push(g);
    for id in 0..s.osds {
        let u = uuid();
        let got = run_cmd(&conf, &["ceph", "osd", "new", &u], 60)?;
        if got.trim() != id.to_string() {
            bail!("ceph osd new gave id {:?}, expected {id}", got.trim());
        }
        std::fs::create_dir_all(dir.join(format!("osd-{id}")))?;
        let ids = id.to_string();
        run_cmd(
            &conf,
            &["ceph-osd", "-i", &ids, "--mkfs", "--osd-uuid", &u],
            120,
        )
        .with_context(|| format!("mkfs of osd.{id}"))?;
        let osd = tool(s.host_cpus, "ceph-osd")
            .args(["-c", &conf, "-i", &ids, "-f"])
            .stdout(Stdio::null())
            .stderr(log(&format!("osd.{id}.out"))?)
            .spawn()
            .context("start ceph-osd")?;
        let g = ChildGuard::new(osd, "ceph-osd");
        budget
            .add(g.pid())
            .context("move ceph-osd into the host budget")?;
        c.daemons.push(g);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    let up = format!("{} up", s.osds);
    loop {
        if run_cmd(&conf, &["ceph", "osd", "stat"], 30).is_ok_and(|s| s.contains(&up)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("Ceph: the OSDs did not come up (logs in {d}/log)");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let pg = s.pg_num.to_string();
    for &r in s.pools {
        let pool = format!("p{r}");
        run_cmd(
            &conf,
            &["ceph", "osd", "pool", "create", &pool, &pg, &pg],
            60,
        )?;
        let rs = r.to_string();
        let mut args = vec!["ceph", "osd", "pool", "set", &pool, "size", &rs];
        if r == 1 {
            args.push("--yes-i-really-mean-it");
        }
        run_cmd(&conf, &args, 60)?;
        run_cmd(&conf, &["rados", "-p", &pool, "put", "warm", &conf], 120)
            .with_context(|| format!("pool {pool} takes no write"))?;
    }
    Ok(c)
}

/// What [`start_rgw`] adds to a [`Setup`]: `[global]` lines (radosgw, unlike the other
/// daemons, needs the monitor's `crc` mode to talk without auth; the pools RGW creates get
/// `size` replicas and 16 PGs each) and its `[client]` section (its frontend on
/// 127.0.0.1:`port`).
pub fn rgw_conf(dir: &Path, port: u16, size: u32) -> (String, String) {
    let min = size.div_ceil(2).max(1);
    (
        format!(
            "ms_mon_client_mode = crc secure\nosd_pool_default_size = {size}\n\
             osd_pool_default_min_size = {min}\nosd_pool_default_pg_num = 16\n\
             osd_pool_default_pgp_num = 16\n"
        ),
        format!(
            "[client]\nrgw_data = {}\nrgw_frontends = beast endpoint=127.0.0.1:{port}\n\
             rgw_dns_name = localhost\nrgw_thread_pool_size = 64\n",
            dir.join("ceph").join("rgw").display()
        ),
    )
}

/// Starts `radosgw` on a cluster started with [`rgw_conf`]'s lines, with one S3 user of the
/// given keys, and waits until it answers HTTP on 127.0.0.1:`port`. The daemon joins the
/// cluster's (its CPU counts in [`Cluster::cpu`]; [`Cluster::stop`] stops it).
pub fn start_rgw(
    c: &mut Cluster,
    port: u16,
    access: &str,
    secret: &str,
    budget: &CpuBudget,
) -> Result<()> {
    std::fs::create_dir_all(c.dir.join("rgw"))?;
    run_cmd(
        &c.conf,
        &[
            "radosgw-admin",
            "user",
            "create",
            "--uid",
            "bench",
            "--display-name",
            "bench",
            "--access-key",
            access,
            "--secret",
            secret,
        ],
        180,
    )
    .context("radosgw-admin user create")?;
    let log = std::fs::File::create(c.dir.join("log").join("rgw.out"))?;
    let rgw = tool(c.host_cpus.as_deref(), "radosgw")
        .args(["-c", &c.conf, "-n", "client.rgw.a", "-f"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("start radosgw")?;
    let mut g = ChildGuard::new(rgw, "radosgw");
    budget
        .add(g.pid())
        .context("move radosgw into the host budget")?;
    let url = format!("http://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let answered = match ureq::get(&url).timeout(Duration::from_secs(2)).call() {
            Ok(_) | Err(ureq::Error::Status(..)) => true,
            Err(ureq::Error::Transport(_)) => false,
        };
        if answered {
            break;
        }
        if let Some(st) = g.try_wait()? {
            bail!(
                "radosgw exited ({st}) before it served {url} (logs in {})",
                c.dir.join("log").display()
            );
        }
        if Instant::now() > deadline {
            bail!("radosgw did not answer at {url} within 120 s");
        }
        crate::interrupt::check()?;
        std::thread::sleep(Duration::from_millis(250));
    }
    c.daemons.push(g);
    Ok(())
}

/// The figures `rados bench` prints at its end.
#[derive(Debug, Default, PartialEq)]
pub struct RadosOut {
    pub ops: u64,
    pub object_size: u64,
    pub seconds: f64,
    pub lat_avg_s: f64,
    pub lat_max_s: f64,
}

/// Parses `rados bench` output (`Total writes made:`, `Total reads made:`, `Object size:`,
/// `Total time run:`, `Average Latency(s):`, `Max latency(s):`).
pub fn parse_rados(text: &str) -> Result<RadosOut> {
    let field = |key: &str| {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(key))
            .and_then(|(_, v)| v.split_whitespace().next()?.parse::<f64>().ok())
    };
    let ops = field("Total writes made")
        .or_else(|| field("Total reads made"))
        .context("no `Total writes/reads made` in the rados bench output")?;
    Ok(RadosOut {
        ops: ops as u64,
        object_size: field("Object size").unwrap_or(0.0) as u64,
        seconds: field("Total time run").context("no `Total time run`")?,
        lat_avg_s: field("Average Latency(s)").unwrap_or(f64::NAN),
        lat_max_s: field("Max latency(s)").unwrap_or(f64::NAN),
    })
}

/// One `rados bench` run with CPU samples of the daemons every second.
fn bench(c: &Cluster, pool: &str, size: u64, args: &[String]) -> Result<Phase> {
    let h0 = c.cpu();
    let t0 = Instant::now();
    let mut child = tool(c.host_cpus.as_deref(), "rados")
        .args(["-c", &c.conf, "-p", pool, "bench"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start rados bench")?;
    let out = child.stdout.take().context("rados stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::BufReader::new(out), &mut s);
        s
    });
    let mut samples = Vec::new();
    let (mut last_t, mut last) = (t0, h0);
    let limit = Duration::from_secs(600);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            bail!("rados bench {} did not finish", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
        if last_t.elapsed() >= Duration::from_secs(1) {
            let now = c.cpu();
            let dt = last_t.elapsed().as_secs_f64();
            samples.push((t0.elapsed().as_secs_f64(), (now - last) / dt, 0.0));
            last_t = Instant::now();
            last = now;
        }
    };
    let text = reader.join().unwrap_or_default();
    let h1 = c.cpu();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!(
            "rados bench {} failed ({status}): {}",
            args.join(" "),
            err.trim()
        );
    }
    let r = parse_rados(&text).with_context(|| format!("rados bench said:\n{text}"))?;
    let bytes = r.ops * size;
    let mb = bytes as f64 / 1e6;
    let secs = r.seconds.max(1e-9);
    Ok(Phase {
        ops: r.ops,
        bytes,
        seconds: secs,
        mb_per_s: mb / secs,
        ops_per_s: r.ops as f64 / secs,
        lat_avg_ms: r.lat_avg_s * 1e3,
        lat_p50_ms: f64::NAN,
        lat_p99_ms: f64::NAN,
        lat_max_ms: r.lat_max_s * 1e3,
        host_cores: (h1 - h0) / t0.elapsed().as_secs_f64(),
        dpu_cores: 0.0,
        host_cpu_ms_per_mb: ratio((h1 - h0) * 1e3, mb),
        dpu_cpu_ms_per_mb: 0.0,
        samples,
        capped: false,
    })
}

fn point(c: &Cluster, p: &Plan, repl: u32, size: u64, clients: usize) -> Result<Point> {
    crate::interrupt::check()?;
    let pool = format!("p{repl}");
    let secs = format!("{}", p.seconds.ceil().max(1.0) as u64);
    let t = clients.to_string();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let w = bench(
        c,
        &pool,
        size,
        &s(&[
            &secs,
            "write",
            "-b",
            &size.to_string(),
            "-t",
            &t,
            "--no-cleanup",
        ]),
    )?;
    let sq = bench(c, &pool, size, &s(&[&secs, "seq", "-t", &t]))?;
    let r = bench(c, &pool, size, &s(&[&secs, "rand", "-t", &t]))?;
    run_cmd(&c.conf, &["rados", "-p", &pool, "cleanup"], 600)?;
    eprintln!(
        "  Ceph   r{} {:>5} c{:<3} write {:>7.1} MB/s {:>7.2} ms host {:.2} cores ({:>5.2} ms/MB) | seq {:>7.1} MB/s | rand {:>7.1} MB/s",
        repl,
        size_label(size),
        clients,
        w.mb_per_s,
        w.lat_avg_ms,
        w.host_cores,
        w.host_cpu_ms_per_mb,
        sq.mb_per_s,
        r.mb_per_s
    );
    Ok(Point {
        system: "ceph".into(),
        placement: "Ceph".into(),
        replication: repl,
        object_size: size,
        clients,
        flow_adapt: true,
        write: w,
        seq: sq,
        rand: r,
    })
}

/// Brings Ceph up, runs the points the DDS side ran (size sweep at the most clients, client
/// sweep at the largest size), tears it down.
pub fn run(o: &CephOpts) -> Result<Vec<Point>> {
    eprintln!(
        "dds bench objects: Ceph (mon + {} BlueStore OSDs on files) ...",
        o.osds
    );
    let budget = CpuBudget::create(
        &format!("dds-bench-objects-{}-ceph", std::process::id()),
        o.host_quota,
    );
    let t = Instant::now();
    let c = start(
        &Setup {
            dir: o.dir,
            port: o.port,
            osds: o.osds,
            device_size: o.plan.device_size,
            pools: &o.plan.replication,
            pg_num: o.pg_num,
            host_cpus: o.host_cpus,
            global: "",
            sections: "",
        },
        &budget,
    )?;
    eprintln!("  Ceph up in {:.1} s", t.elapsed().as_secs_f64());
    let p = o.plan;
    let cmax = *p.clients.iter().max().context("clients")?;
    let smax = *p.sizes.iter().max().context("sizes")?;
    let rmax = *p.replication.iter().max().context("replication")?;
    let mut pts = Vec::new();
    let r = (|| -> Result<()> {
        for &repl in &p.replication {
            for &size in &p.sizes {
                pts.push(point(&c, p, repl, size, cmax)?);
            }
        }
        for &cl in p.clients.iter().filter(|&&x| x != cmax) {
            pts.push(point(&c, p, rmax, smax, cl)?);
        }
        Ok(())
    })();
    c.stop();
    drop(budget);
    r.map(|_| pts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rados_bench_output_is_parsed() {
        let text = "hints = 1\nMaintaining 16 concurrent writes of 4194304 bytes to objects of size 4194304 for up to 3 seconds or 0 objects\n\
  sec Cur ops   started  finished  avg MB/s  cur MB/s last lat(s)  avg lat(s)\n\
    0       0         0         0         0         0           -           0\n\
Total time run:         3.21\nTotal writes made:      120\nWrite size:             4194304\n\
Object size:            4194304\nBandwidth (MB/sec):     149.5\nStddev Bandwidth:       10\n\
Average IOPS:           37\nAverage Latency(s):     0.41\nStddev Latency(s):      0.1\n\
Max latency(s):         0.9\nMin latency(s):         0.1\n";
        let r = parse_rados(text).unwrap();
        assert_eq!(r.ops, 120);
        assert_eq!(r.object_size, 4194304);
        assert!((r.seconds - 3.21).abs() < 1e-9);
        assert!((r.lat_avg_s - 0.41).abs() < 1e-9);
        let seq = "Total time run:       1.5\nTotal reads made:     100\nRead size:            65536\n\
Object size:          65536\nBandwidth (MB/sec):   4.1\nAverage Latency(s):   0.01\nMax latency(s):       0.02\n";
        assert_eq!(parse_rados(seq).unwrap().ops, 100);
        assert!(parse_rados("garbage").is_err());
    }
}
