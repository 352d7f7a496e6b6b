//! A CPU budget shared by several processes: one cgroup (v2 `cpu.max`, else v1
//! `cpu.cfs_quota_us`) that the benchmark creates, moves processes into and removes.

use std::path::{Path, PathBuf};

use serde::Serialize;

const ROOT: &str = "/sys/fs/cgroup";
const PERIOD_US: u64 = 100_000;

/// One CPU budget (a cgroup with a quota), or nothing where cgroups cannot be made.
#[derive(Debug, Serialize)]
pub struct CpuBudget {
    /// Cores of CPU time per period.
    pub cores: f64,
    /// "v2", "v1", or "none" (the budget is not enforced; why is in `error`).
    pub cgroup: String,
    pub path: Option<PathBuf>,
    pub error: Option<String>,
}

impl CpuBudget {
    /// No budget: the processes added keep running where they are.
    pub fn none() -> CpuBudget {
        CpuBudget {
            cores: 0.0,
            cgroup: "none".into(),
            path: None,
            error: None,
        }
    }

    /// Creates the group `name` with a quota of `cores`.
    pub fn create(name: &str, cores: f64) -> CpuBudget {
        let mut b = CpuBudget {
            cores,
            cgroup: "none".into(),
            path: None,
            error: None,
        };
        if !(cores > 0.0 && cores <= 1024.0) {
            b.error = Some(format!("quota {cores} is outside (0, 1024]"));
            return b;
        }
        let quota = ((cores * PERIOD_US as f64) as u64).max(1000);
        let r = if Path::new(ROOT).join("cgroup.controllers").exists() {
            let dir = Path::new(ROOT).join(name);
            std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(dir.join("cpu.max"), format!("{quota} {PERIOD_US}")))
                .map(|_| ("v2", dir))
        } else {
            let dir = Path::new(ROOT).join("cpu").join(name);
            std::fs::create_dir_all(&dir)
                .and_then(|_| std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD_US.to_string()))
                .and_then(|_| std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()))
                .map(|_| ("v1", dir))
        };
        match r {
            Ok((kind, dir)) => {
                b.cgroup = kind.into();
                b.path = Some(dir);
            }
            Err(e) => {
                tracing::warn!(
                    "cannot create the cgroup {name}: {e}; the CPU budget is not enforced"
                );
                b.error = Some(e.to_string());
            }
        }
        b
    }

    /// Moves a process (all its threads) into the group.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        match &self.path {
            Some(dir) => std::fs::write(dir.join("cgroup.procs"), pid.to_string()),
            None => Ok(()),
        }
    }

    /// How often the group was throttled so far (`nr_throttled` of `cpu.stat`).
    pub fn throttled(&self) -> u64 {
        self.path
            .as_ref()
            .and_then(|d| std::fs::read_to_string(d.join("cpu.stat")).ok())
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("nr_throttled "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for CpuBudget {
    fn drop(&mut self) {
        let Some(dir) = self.path.take() else {
            return;
        };
        // Whatever is still inside goes back to the parent, so that the group can be removed.
        if let (Ok(procs), Some(parent)) = (
            std::fs::read_to_string(dir.join("cgroup.procs")),
            dir.parent(),
        ) {
            for p in procs.lines() {
                let _ = std::fs::write(parent.join("cgroup.procs"), p);
            }
        }
        if let Err(e) = std::fs::remove_dir(&dir) {
            tracing::warn!(dir = %dir.display(), "cannot remove cgroup: {e}");
        }
    }
}
