//! CPU placement of a benchmark: the emulated DPU gets a core of its own (the last one by
//! default) and the host side (workload threads, baselines) the others, in every mode, so
//! that modes are compared on the same host CPUs and the DPU's core is added hardware, as on
//! a real DPU. Recorded in each report.

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// Where the DPU process and the host side run.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Placement {
    /// `dds dpu --cpus` list, `None` when shared.
    pub dpu_cpus: Option<String>,
    /// CPUs of this process's threads, `None` when shared.
    pub host_cpus: Option<Vec<usize>>,
}

impl Placement {
    /// The DPU on `dpu_cpus` (default: the last CPU), the host side on the other CPUs; or
    /// everything shared (`shared`, or a single CPU).
    pub fn plan(nproc: usize, dpu_cpus: Option<&str>, shared: bool) -> Result<Placement> {
        if shared || nproc < 2 {
            return Ok(Placement {
                dpu_cpus: None,
                host_cpus: None,
            });
        }
        let dpu = match dpu_cpus {
            Some(l) => parse_cpu_list(l)?,
            None => vec![nproc - 1],
        };
        if dpu.iter().any(|&c| c >= nproc) {
            bail!("--dpu-cpus {dpu:?} names a CPU this machine lacks ({nproc} CPUs)");
        }
        let host: Vec<usize> = (0..nproc).filter(|c| !dpu.contains(c)).collect();
        if host.is_empty() {
            bail!("--dpu-cpus leaves no CPU for the host side");
        }
        Ok(Placement {
            dpu_cpus: Some(
                dpu.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            host_cpus: Some(host),
        })
    }

    /// `dds dpu` arguments that pin the DPU process.
    pub fn dpu_args(&self) -> Vec<String> {
        match &self.dpu_cpus {
            Some(l) => vec!["--cpus".into(), l.clone()],
            None => Vec::new(),
        }
    }

    /// Pins the calling thread (and so every thread it starts later) to the host CPUs; the
    /// guard restores the previous mask.
    pub fn pin_host(&self) -> Result<AffinityGuard> {
        pin(self.host_cpus.as_deref())
    }

    /// Pins the calling thread (and the threads it starts) to the DPU CPUs, for DPU-side
    /// code that runs inside a benchmark process; the guard restores the previous mask.
    pub fn pin_dpu(&self) -> Result<AffinityGuard> {
        let cpus = self.dpu_cpus.as_deref().map(parse_cpu_list).transpose()?;
        pin(cpus.as_deref())
    }
}

/// Pins the calling thread to `cpus` (`None`: leaves the mask); the guard restores it.
fn pin(cpus: Option<&[usize]>) -> Result<AffinityGuard> {
    // SAFETY: sched_getaffinity writes the set we pass.
    let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    if unsafe { libc::sched_getaffinity(0, size, &mut old) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sched_getaffinity");
    }
    if let Some(cpus) = cpus {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET stays inside it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        if unsafe { libc::sched_setaffinity(0, size, &set) } != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(AffinityGuard { old })
}

/// Restores a thread's CPU mask when dropped.
pub struct AffinityGuard {
    old: libc::cpu_set_t,
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        // SAFETY: the mask read at pinning time.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.old) };
    }
}

/// Parses `0,2-3` into `[0, 2, 3]`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse()?, b.parse()?);
                if a > b {
                    bail!("CPU range {part} runs backwards");
                }
                v.extend(a..=b);
            }
            None => v.push(part.parse().with_context(|| format!("CPU {part:?}"))?),
        }
    }
    if v.is_empty() {
        bail!("empty CPU list");
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpu_on_the_last_core_host_on_the_rest() {
        let p = Placement::plan(4, None, false).unwrap();
        assert_eq!(p.dpu_cpus.as_deref(), Some("3"));
        assert_eq!(p.host_cpus, Some(vec![0, 1, 2]));
        assert_eq!(p.dpu_args(), ["--cpus", "3"]);
        let p = Placement::plan(4, Some("0-1"), false).unwrap();
        assert_eq!(p.host_cpus, Some(vec![2, 3]));
        assert!(Placement::plan(2, Some("0-1"), false).is_err());
        assert!(Placement::plan(2, Some("5"), false).is_err());
        assert_eq!(Placement::plan(1, None, false).unwrap().dpu_cpus, None);
        assert_eq!(Placement::plan(8, None, true).unwrap().host_cpus, None);
        assert_eq!(parse_cpu_list("0,2-3").unwrap(), [0, 2, 3]);
    }
}
