//! `dds bench cluster`: an object cluster that survives its nodes. etcd as the monitor, three
//! `dds osd` processes (pool of 16 PGs, size 3, min_size 2), clients writing new objects and
//! reading acknowledged ones throughout. Then: `kill -9` of the OSD that leads the most PGs
//! (the write gap: from the kill to the first acknowledged write on a PG it led), the cluster
//! serving degraded, the OSD back (time to clean, per GiB it had to receive), a fourth OSD
//! joining (time to clean, per GiB of the PGs straw2 moved to it), and at the end every
//! acknowledged object read from every member of its PG. Last, the S3 part ([`crate::s3`]):
//! `dds s3` on the same cluster against the native client, 16 clients, 4 MiB and 64 KiB
//! objects.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use dds_objstore::ObjectId;
use dds_osd::client::{Client, ClientOptions};
use dds_osd::health::cluster_status;
use dds_osd::{ClusterMap, PgId};
use serde_json::{json, Value};

use crate::child::ChildGuard;
use crate::machine::Machine;
use crate::report::{fmt_num, Report, Table, Target};

const POOL: u64 = 1;
const PGS: u32 = 16;
const FIRST_OSDS: u32 = 3;

#[derive(Args, Debug, Clone, serde::Serialize)]
pub struct ClusterArgs {
    /// Short run (about a minute).
    #[arg(long)]
    pub quick: bool,
    /// Directory of the JSON results (default bench/results, or bench/results/quick).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Object size in bytes.
    #[arg(long)]
    pub object_size: Option<usize>,
    /// Writer threads (one write in flight each).
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Seconds the killed OSD stays down.
    #[arg(long)]
    pub down_s: Option<f64>,
    /// Where the cluster's devices, map and logs go (a temporary directory by default).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Device file size of each OSD (preallocated), in bytes.
    #[arg(long)]
    pub device_size: Option<u64>,
    /// After `dds s3`'s runs, the same S3 workload against Ceph's RGW on a Ceph cluster of
    /// the same shape (as many BlueStore OSDs on files as `dds osd` processes, pools of size
    /// 3), brought up and torn down by the benchmark. Needs the packages ceph-mon, ceph-osd, ceph-common and radosgw;
    /// the benchmark installs nothing.
    #[arg(long)]
    pub with_rgw: bool,
    /// Port of the Ceph monitor (with `--with-rgw`).
    #[arg(long, default_value_t = 6789)]
    pub ceph_port: u16,
    /// Port of RGW's S3 frontend (with `--with-rgw`).
    #[arg(long, default_value_t = 7480)]
    pub rgw_port: u16,
    /// Where each OSD's front end runs: `host` (front end and object store in one host
    /// process) or `dpu` (the front end on the emulated DPU's core, its `dds osd-store` on the
    /// host's; the kill -9 hits the front end).
    #[arg(long, default_value = "host", value_parser = ["host", "dpu"])]
    pub placement: String,
}

fn start_etcd(dir: &Path) -> Result<(ChildGuard, String)> {
    let (mut cmd, url) = dds_osd::etcd::local_member(dir)?;
    let child = cmd.spawn().context("start etcd (package etcd-server)")?;
    let g = ChildGuard::new(child, "etcd");
    if !dds_osd::etcd::wait_answers(&url, Duration::from_secs(20)) {
        bail!("etcd did not answer at {url}");
    }
    Ok((g, url))
}

struct Osds {
    exe: PathBuf,
    device_size: u64,
    dir: PathBuf,
    url: String,
    seed: PathBuf,
    /// The OSDs' processes: the front ends (DPU processes in placement dpu).
    procs: Vec<Option<ChildGuard>>,
    /// Placement dpu: the CPUs of the front ends, and each OSD's `dds osd-store`.
    dpu: Option<Vec<usize>>,
    stores: Vec<Option<ChildGuard>>,
}

impl Osds {
    /// `dds osd-store` of OSD `id` (placement dpu), once it is ready.
    fn start_store(&mut self, id: u32, format: bool) -> Result<PathBuf> {
        let sock = self.dir.join(format!("osd{id}.store.sock"));
        let g = crate::objects::spawn_store(
            &self.exe,
            None,
            &self.dir.join(format!("osd{id}.img")),
            &sock,
            self.device_size,
            format,
            std::fs::File::create(self.dir.join(format!("osd{id}.store.log")))?,
            &crate::objects::cgroup::CpuBudget::none(),
        )?;
        let i = id as usize;
        if self.stores.len() <= i {
            self.stores.resize_with(i + 1, || None);
        }
        self.stores[i] = Some(g);
        Ok(sock)
    }

    /// OSD `id`; in placement dpu its front end on the DPU's CPUs, attached to its store
    /// (started first when not running: a store outlives its front end).
    fn start(&mut self, id: u32, format: bool) -> Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("osd{id}.log")))?;
        let cpus = self.dpu.as_deref().filter(|c| !c.is_empty());
        let mut cmd = crate::kv::taskset(&self.exe, cpus);
        cmd.args(["osd", "--id", &id.to_string(), "--etcd", &self.url])
            .args(["--cluster", "bench", "--etcd-ttl", "2", "--map"])
            .arg(&self.seed)
            .stdout(Stdio::piped())
            .stderr(log);
        if self.dpu.is_some() {
            let running = self.stores.get(id as usize).is_some_and(Option::is_some);
            let sock = if running {
                self.dir.join(format!("osd{id}.store.sock"))
            } else {
                self.start_store(id, format)?
            };
            cmd.args(["--placement", "dpu", "--proxy-socket"]).arg(sock);
        } else {
            cmd.arg("--device")
                .arg(self.dir.join(format!("osd{id}.img")))
                .args(["--size", &self.device_size.to_string()]);
            if format {
                cmd.args(["--format", "--force"]);
            }
        }
        let mut g = ChildGuard::new(cmd.spawn().context("start dds osd")?, "dds osd");
        let line = g.ready_line(Duration::from_secs(30))?;
        dds_osd::parse_ready_line(&line).with_context(|| format!("osd {id}: {line:?}"))?;
        let i = id as usize;
        if self.procs.len() <= i {
            self.procs.resize_with(i + 1, || None);
        }
        self.procs[i] = Some(g);
        Ok(())
    }

    /// `kill -9` (the guard kills when dropped).
    fn kill(&mut self, id: u32) {
        drop(self.procs[id as usize].take());
    }
}

fn wait_map(c: &Client, what: &str, want: impl Fn(&ClusterMap) -> bool) -> Result<ClusterMap> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = c.map();
        if want(&m) {
            return Ok((*m).clone());
        }
        if Instant::now() > deadline {
            bail!("{what}: not within 60 s (map epoch {})", m.epoch);
        }
        crate::interrupt::check()?;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until every PG is active+clean; returns the time it took.
fn wait_clean(c: &Client, what: &str) -> Result<Duration> {
    let t0 = Instant::now();
    loop {
        let st = cluster_status(c);
        if st.clean() && st.unreachable.is_empty() {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > Duration::from_secs(300) {
            bail!("{what}: not clean within 300 s: {st:?}");
        }
        crate::interrupt::check()?;
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn content(i: u64, size: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(size);
    v
}

fn name(i: u64) -> String {
    format!("obj-{i}")
}

/// One write of the load.
struct Write {
    i: u64,
    acked: Option<Instant>,
}

struct Load {
    writes: Arc<Mutex<Vec<Write>>>,
    acked: Arc<Mutex<Vec<u64>>>,
    reads: Arc<AtomicU64>,
    read_errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(cl: &Arc<Client>, writers: usize, size: usize) -> Load {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let reads = Arc::new(AtomicU64::new(0));
        let read_errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for w in 0..writers as u64 {
            let (cl, writes, acked, stop) =
                (cl.clone(), writes.clone(), acked.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::SeqCst) {
                    let ok = cl
                        .write_full(&ObjectId::new(POOL, name(i)), &content(i, size))
                        .is_ok();
                    let at = ok.then(Instant::now);
                    writes.lock().unwrap().push(Write { i, acked: at });
                    if ok {
                        acked.lock().unwrap().push(i);
                    }
                    i += writers as u64;
                }
            }));
        }
        let (c, a, r, e, s) = (
            cl.clone(),
            acked.clone(),
            reads.clone(),
            read_errors.clone(),
            stop.clone(),
        );
        threads.push(std::thread::spawn(move || {
            let mut k = 0usize;
            while !s.load(Ordering::SeqCst) {
                let pick = {
                    let a = a.lock().unwrap();
                    (!a.is_empty()).then(|| {
                        k = (k + 7919) % a.len();
                        a[k]
                    })
                };
                let Some(i) = pick else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                match c.read_full(&ObjectId::new(POOL, name(i))) {
                    Ok(d) if d == content(i, size) => r.fetch_add(1, Ordering::Relaxed),
                    _ => e.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
        Load {
            writes,
            acked,
            reads,
            read_errors,
            stop,
            threads,
        }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn finish(self) -> (Vec<Write>, u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
        let w = std::mem::take(&mut *self.writes.lock().unwrap());
        (
            w,
            self.reads.load(Ordering::Relaxed),
            self.read_errors.load(Ordering::Relaxed),
        )
    }
}

fn sleep(s: f64) -> Result<()> {
    let until = Instant::now() + Duration::from_secs_f64(s);
    while Instant::now() < until {
        crate::interrupt::check()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

pub fn run(a: ClusterArgs, command: String) -> Result<Report> {
    crate::interrupt::install()?;
    let machine = Machine::detect();
    let size = a
        .object_size
        .unwrap_or(if a.quick { 16 << 10 } else { 64 << 10 });
    let down_s = a.down_s.unwrap_or(if a.quick { 3.0 } else { 6.0 });
    let phase_s = if a.quick { 2.0 } else { 4.0 };
    let tmp;
    let dir = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let dpu_placement = a.placement == "dpu";
    let place = crate::placement::Placement::plan(machine.nproc, None, !dpu_placement)?;
    // Placement dpu: this process, etcd, the stores, the gateway and the load on the host's
    // CPUs; the front ends on the DPU's.
    let _pin = place.pin_host()?;
    let dpu_cpus = match &place.dpu_cpus {
        Some(l) => Some(crate::placement::parse_cpu_list(l)?),
        None if dpu_placement => Some(Vec::new()),
        None => None,
    };
    let (etcd, url) = start_etcd(&dir)?;
    let mut seed = String::from("epoch = 1\n");
    for id in 0..FIRST_OSDS {
        seed +=
            &format!("[[osd]]\nid = {id}\naddr = \"127.0.0.1:0\"\npeer_addr = \"127.0.0.1:0\"\n");
    }
    seed += &format!(
        "[[pool]]\nid = {POOL}\nname = \"data\"\npg_num = {PGS}\nsize = 3\nmin_size = 2\n"
    );
    let seed_path = dir.join("seed.toml");
    std::fs::write(&seed_path, seed)?;
    let mut osds = Osds {
        exe: std::env::current_exe()?,
        device_size: a
            .device_size
            .unwrap_or(if a.quick { 1 << 30 } else { 3 << 30 }),
        dir: dir.clone(),
        url: url.clone(),
        seed: seed_path,
        procs: Vec::new(),
        dpu: dpu_cpus,
        stores: Vec::new(),
    };
    for id in 0..FIRST_OSDS {
        osds.start(id, true)?;
    }
    let opts = ClientOptions {
        retry_for: Duration::from_secs(60),
        io_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let cl = Arc::new(Client::connect_etcd(&url, "bench", opts)?);
    wait_map(&cl, "every OSD up", |m| {
        m.osds.iter().all(|o| o.up && o.addressed())
    })?;
    wait_clean(&cl, "the new cluster")?;
    eprintln!("cluster: 3 OSDs clean; clients start");

    let load = Load::start(&cl, a.writers, size);
    sleep(phase_s)?;

    // kill -9 of the OSD leading the most PGs.
    let before = (*cl.map()).clone();
    let pgs: Vec<PgId> = before.all_pgs().collect();
    let leads = |o: u32| pgs.iter().filter(|&&pg| before.acting(pg)[0] == o).count();
    let victim = (0..FIRST_OSDS).max_by_key(|&o| leads(o)).unwrap_or(0);
    let led: Vec<PgId> = pgs
        .iter()
        .copied()
        .filter(|&pg| before.acting(pg)[0] == victim)
        .collect();
    let with_victim: Vec<PgId> = pgs
        .iter()
        .copied()
        .filter(|&pg| before.acting(pg).contains(&victim))
        .collect();
    let acked_at_kill = load.acked_count();
    let killed_at = Instant::now();
    osds.kill(victim);
    eprintln!(
        "cluster: kill -9 of osd {victim} (primary of {} PGs)",
        led.len()
    );
    wait_map(&cl, "the killed OSD marked down", |m| {
        m.osd(victim).is_some_and(|o| !o.up)
    })?;
    let marked_down_s = killed_at.elapsed().as_secs_f64();
    sleep(down_s)?;
    let acked_while_down = load.acked.lock().unwrap()[acked_at_kill..].to_vec();

    // The OSD back: recovered from the PG logs while the clients go on.
    let returned_at = Instant::now();
    osds.start(victim, false)?;
    wait_map(&cl, "the OSD back up", |m| {
        m.osd(victim).is_some_and(|o| o.up && o.addressed())
    })?;
    wait_clean(&cl, "recovery of the returning OSD")?;
    let return_clean_s = returned_at.elapsed().as_secs_f64();
    let on_victim = |i: &u64| {
        before
            .pg_of(POOL, name(*i).as_bytes())
            .is_some_and(|pg| with_victim.contains(&pg))
    };
    let return_bytes =
        acked_while_down.iter().filter(|i| on_victim(i)).count() as u64 * size as u64;
    eprintln!("cluster: osd {victim} back, clean after {return_clean_s:.2} s");
    sleep(phase_s)?;

    // A fourth OSD joins: straw2 moves to it only the PGs it wins.
    let before_add = (*cl.map()).clone();
    let added_at = Instant::now();
    osds.start(FIRST_OSDS, true)?;
    let after_add = wait_map(&cl, "the new OSD in the map", |m| {
        m.osd(FIRST_OSDS)
            .is_some_and(|o| o.up && o.addressed() && o.weight > 0.0)
    })?;
    let moved: Vec<PgId> = after_add
        .all_pgs()
        .filter(|&pg| before_add.acting(pg) != after_add.acting(pg))
        .collect();
    let moved_without_new = moved
        .iter()
        .filter(|&&pg| !after_add.acting(pg).contains(&FIRST_OSDS))
        .count();
    wait_clean(&cl, "backfill of the new OSD")?;
    let add_clean_s = added_at.elapsed().as_secs_f64();
    let acked_now = load.acked.lock().unwrap().clone();
    let add_bytes = acked_now
        .iter()
        .filter(|i| {
            before_add
                .pg_of(POOL, name(**i).as_bytes())
                .is_some_and(|pg| moved.contains(&pg))
        })
        .count() as u64
        * size as u64;
    eprintln!(
        "cluster: osd {FIRST_OSDS} joined, {} PGs moved, clean after {add_clean_s:.2} s",
        moved.len()
    );
    sleep(phase_s / 2.0)?;
    let (writes, reads, read_errors) = load.finish();
    wait_clean(&cl, "the end")?;

    // The write gap on the PGs the victim led.
    let on_led = |w: &&Write| {
        before
            .pg_of(POOL, name(w.i).as_bytes())
            .is_some_and(|pg| led.contains(&pg))
    };
    let first_after = writes
        .iter()
        .filter(on_led)
        .filter_map(|w| w.acked)
        .filter(|&t| t > killed_at)
        .min();
    let gap_s = first_after.map_or(f64::INFINITY, |t| (t - killed_at).as_secs_f64());
    let write_errors = writes.iter().filter(|w| w.acked.is_none()).count();

    // Every acknowledged object on every member of its PG.
    let map = cl.map();
    let mut checked = 0u64;
    let mut lost = 0u64;
    let mut copies = 0u64;
    for w in writes.iter().filter(|w| w.acked.is_some()) {
        let oid = ObjectId::new(POOL, name(w.i));
        let want = content(w.i, size);
        let mut ok = true;
        for o in map.acting(map.pg_of(POOL, name(w.i).as_bytes()).context("pool")?) {
            copies += 1;
            ok &= cl.on(o).read_full(&oid).is_ok_and(|d| d == want);
        }
        checked += 1;
        lost += u64::from(!ok);
    }
    eprintln!("cluster: {checked} acknowledged objects checked on {copies} copies, {lost} lost");
    let s3_secs = if a.quick { 3.0 } else { 8.0 };
    let front_ends: Vec<u32> = osds.procs.iter().flatten().map(ChildGuard::pid).collect();
    let stores: Vec<u32> = osds.stores.iter().flatten().map(ChildGuard::pid).collect();
    let (mut host, dpu) = if dpu_placement {
        (stores, front_ends)
    } else {
        (front_ends, Vec::new())
    };
    host.push(etcd.pid());
    let mut s3 = crate::s3::throughput(
        &osds.exe, &dir, &url, "bench", &cl, POOL, s3_secs, &host, &dpu,
    )?;
    for g in osds.procs.iter_mut().chain(osds.stores.iter_mut()) {
        if let Some(mut g) = g.take() {
            let _ = g.stop(Duration::from_secs(5));
        }
    }
    if a.with_rgw {
        crate::s3::against_rgw(
            &mut s3,
            &crate::s3::RgwOpts {
                dir: &dir,
                ceph_port: a.ceph_port,
                rgw_port: a.rgw_port,
                osds: osds.procs.len(),
                size: 3,
                device_size: osds.device_size,
                secs: s3_secs,
            },
        )
        .context("the RGW side")?;
    } else {
        crate::s3::rgw_not_run(&mut s3, "--with-rgw not given");
    }

    let per_gib = |s: f64, b: u64| if b == 0 { 0.0 } else { s / gib(b) };
    let mut targets = vec![
        Target::at_most("failover_write_gap_s", gap_s, 5.0),
        Target::at_most("acked_objects_lost", lost as f64, 0.0),
        Target::at_least("acked_objects_checked", checked as f64, 1000.0),
    ];
    targets.extend(s3.targets);
    let mut summary = json!({
        "failover_write_gap_s": gap_s,
        "acked_objects_lost": lost,
        "acked_objects_checked": checked,
        "replica_copies_checked": copies,
        "marked_down_after_s": marked_down_s,
        "down_s": down_s,
        "return_time_to_clean_s": return_clean_s,
        "return_recovered_gib": gib(return_bytes),
        "return_clean_s_per_gib": per_gib(return_clean_s, return_bytes),
        "add_time_to_clean_s": add_clean_s,
        "add_backfilled_gib": gib(add_bytes),
        "add_clean_s_per_gib": per_gib(add_clean_s, add_bytes),
        "pgs_moved_to_new_osd": moved.len(),
        "pgs_moved_without_new_osd": moved_without_new,
        "writes": writes.len(),
        "write_errors": write_errors,
        "reads_checked": reads,
        "read_errors": read_errors,
        "targets": targets,
    });
    if let (Some(m), Value::Object(s3)) = (summary.as_object_mut(), s3.summary) {
        m.extend(s3);
    }
    let mut t = Table::new("dds bench cluster", &["figure", "value"]);
    for (k, v) in [
        ("write gap after kill -9 of a primary (s)", fmt_num(gap_s)),
        ("marked down after (s)", fmt_num(marked_down_s)),
        ("returning OSD: time to clean (s)", fmt_num(return_clean_s)),
        (
            "returning OSD: time to clean per GiB (s)",
            fmt_num(per_gib(return_clean_s, return_bytes)),
        ),
        ("new OSD: PGs moved", moved.len().to_string()),
        ("new OSD: time to clean (s)", fmt_num(add_clean_s)),
        (
            "new OSD: time to clean per GiB (s)",
            fmt_num(per_gib(add_clean_s, add_bytes)),
        ),
        (
            "writes (failed)",
            format!("{} ({write_errors})", writes.len()),
        ),
        ("reads checked (errors)", format!("{reads} ({read_errors})")),
        (
            "acknowledged objects checked / lost",
            format!("{checked} / {lost}"),
        ),
    ] {
        t.row(vec![k.to_string(), v]);
    }
    Ok(Report {
        benchmark: "cluster".into(),
        command,
        dpu_emulation: if dpu_placement {
            "emulated DPU: every OSD's front end is a separate process on the DPU's own CPU \
             (placement dpu), reaching its host-side dds osd-store through the emulated DMA \
             engine"
                .into()
        } else {
            "none in this run: every OSD is placement host (front end and object store in one \
             host process); the failover, recovery and rebalancing paths are the same for \
             placement-dpu OSDs (--placement dpu)"
                .into()
        },
        machine,
        config: json!({
            "args": a,
            "object_size": size,
            "pool": {"pg_num": PGS, "size": 3, "min_size": 2},
            "osds": "3, then a fourth joining",
            "placement": if dpu_placement {
                "dpu: each OSD's front end (dds osd --placement dpu) on the emulated DPU's CPU, its dds osd-store on the host's; etcd, the gateway and the load on the host's CPUs"
            } else {
                "host: each OSD one host process (front end and object store)"
            },
            "monitor": "etcd (one member), leases of 2 s",
            "load": "writer threads (one write_full in flight each, every object written once) and one reader of acknowledged objects checking their content",
            "s3": "dds s3 (etcd client of the same cluster, pool data, 4 MiB stripes) against dds_osd::client::Client on the same pool: 16 client threads, one request in flight each, each overwriting 4 names of its own; SigV4-presigned requests (rusty-s3) over ureq, one keep-alive connection per client; writes then reads of 4 MiB and 64 KiB objects. Server CPU: the gateway, the OSDs and the monitor (etcd; Ceph's mon). With --with-rgw, the same workload against radosgw on Ceph (1 mon, 4 BlueStore OSDs on files, pools of size 3) after the dds osd cluster stopped; dds s3's OSDs run in placement host (the D4 placement's host CPU is not measured here)",
            "gib": "2^30 bytes of acknowledged objects: written while the OSD was down on PGs it is a member of (return), or held by the PGs moved to the new OSD (add)",
        }),
        summary,
        points: Value::Array(Vec::new()),
        tables: std::iter::once(t).chain(s3.tables).collect(),
        charts: Vec::new(),
        panels: Vec::new(),
    })
}
