//! The DPU's resource profile: a DPU has a few weaker cores and a bounded memory. The `dds dpu`
//! process models that with CPU pinning, a cgroup CPU quota (v2 `cpu.max`, else v1
//! `cpu.cfs_quota_us`) and a cgroup memory limit.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What to apply; every field is optional.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ResourceProfile {
    /// CPUs the process may run on.
    pub cpus: Option<Vec<usize>>,
    /// Fraction of one CPU's time per period (e.g. 1.5 = one and a half cores).
    pub cpu_quota: Option<f64>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
}

/// What was applied, to be printed with benchmark results and removed at exit.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AppliedProfile {
    pub profile: ResourceProfile,
    /// "v2", "v1" or "none".
    pub cgroup: String,
    #[serde(skip)]
    dirs: Vec<PathBuf>,
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const PERIOD_US: u64 = 100_000;

/// Parses a CPU list like `0`, `0-3`, `1,3,5-6`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: usize = a.trim().parse().map_err(|_| format!("bad CPU `{part}`"))?;
        let b: usize = b.trim().parse().map_err(|_| format!("bad CPU `{part}`"))?;
        if a > b || b >= 1024 {
            return Err(format!("bad CPU range `{part}`"));
        }
        cpus.extend(a..=b);
    }
    if cpus.is_empty() {
        return Err("empty CPU list".into());
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

impl ResourceProfile {
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none() && self.cpu_quota.is_none() && self.memory_bytes.is_none()
    }

    /// Applies the profile to this process (and so to every thread it starts afterwards).
    pub fn apply(&self) -> io::Result<AppliedProfile> {
        let mut applied = AppliedProfile {
            profile: self.clone(),
            cgroup: "none".into(),
            dirs: Vec::new(),
        };
        if let Some(cpus) = &self.cpus {
            pin(cpus)?;
        }
        if self.cpu_quota.is_none() && self.memory_bytes.is_none() {
            return Ok(applied);
        }
        if let Some(q) = self.cpu_quota {
            if !(q > 0.0 && q <= 1024.0) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "CPU quota must be in (0, 1024]",
                ));
            }
        }
        let name = format!("dds-dpu-{}", std::process::id());
        let pid = std::process::id().to_string();
        if Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
            let dir = Path::new(CGROUP_ROOT).join(&name);
            fs::create_dir_all(&dir)?;
            applied.dirs.push(dir.clone());
            if let Some(q) = self.cpu_quota {
                fs::write(
                    dir.join("cpu.max"),
                    format!("{} {PERIOD_US}", (q * PERIOD_US as f64) as u64),
                )?;
            }
            if let Some(m) = self.memory_bytes {
                fs::write(dir.join("memory.max"), m.to_string())?;
            }
            fs::write(dir.join("cgroup.procs"), &pid)?;
            applied.cgroup = "v2".into();
        } else {
            if let Some(q) = self.cpu_quota {
                let dir = Path::new(CGROUP_ROOT).join("cpu").join(&name);
                fs::create_dir_all(&dir)?;
                applied.dirs.push(dir.clone());
                fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string())?;
                fs::write(
                    dir.join("cpu.cfs_quota_us"),
                    ((q * PERIOD_US as f64) as u64).to_string(),
                )?;
                fs::write(dir.join("cgroup.procs"), &pid)?;
            }
            if let Some(m) = self.memory_bytes {
                let dir = Path::new(CGROUP_ROOT).join("memory").join(&name);
                fs::create_dir_all(&dir)?;
                applied.dirs.push(dir.clone());
                fs::write(dir.join("memory.limit_in_bytes"), m.to_string())?;
                fs::write(dir.join("cgroup.procs"), &pid)?;
            }
            applied.cgroup = "v1".into();
        }
        Ok(applied)
    }
}

impl AppliedProfile {
    /// Moves the process back to its parent groups and removes the groups it created.
    pub fn remove(&mut self) {
        let pid = std::process::id().to_string();
        for dir in self.dirs.drain(..) {
            if let Some(parent) = dir.parent() {
                let _ = fs::write(parent.join("cgroup.procs"), &pid);
            }
            if let Err(e) = fs::remove_dir(&dir) {
                tracing::warn!(dir = %dir.display(), "cannot remove cgroup: {e}");
            }
        }
    }
}

fn pin(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; the libc macros' functions only touch it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPUs this process may run on now.
pub fn current_cpus() -> Vec<usize> {
    // SAFETY: as in `pin`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..1024).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("1,3,5-6").unwrap(), vec![1, 3, 5, 6]);
        assert_eq!(parse_cpu_list("2-3,3").unwrap(), vec![2, 3]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("").is_err());
    }
}
