//! CPU time and memory of this process and of a child process.

use anyhow::{Context, Result};

/// CPU seconds (user + system) this process has used, all threads.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds (user + system) of another process, from `/proc/<pid>/stat`.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').context("malformed /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((utime + stime) / hz)
}

/// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`, ...), in bytes.
pub fn process_status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    let kb: u64 = line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("parse {line:?}"))?;
    Ok(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_figures_are_readable() {
        assert!(self_cpu_seconds() >= 0.0);
        assert!(process_cpu_seconds(std::process::id()).unwrap() >= 0.0);
        assert!(process_status_bytes(std::process::id(), "VmHWM").unwrap() > 0);
        assert!(process_status_bytes(std::process::id(), "NoSuchField").is_err());
    }
}
