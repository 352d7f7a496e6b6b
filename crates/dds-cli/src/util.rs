//! Small helpers shared by the subcommands.

use anyhow::{bail, Context, Result};

/// Parses sizes like `4096`, `64K`, `16M`, `1G`, `2GiB` (binary units).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        bail!("size `{s}` does not start with a number");
    }
    let n: u64 = t[..digits].parse().with_context(|| format!("size `{s}`"))?;
    let unit = t[digits..].trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => bail!("unknown size unit in `{s}` (use K, M, G or T)"),
    };
    n.checked_mul(1u64 << shift)
        .with_context(|| format!("size `{s}` overflows"))
}

/// CPU seconds (user + system) this process has used.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds (user + system) of another process, from /proc.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').context("malformed /proc stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11).context("utime")?.parse()?;
    let stime: f64 = f.get(12).context("stime")?.parse()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((utime + stime) / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("3Q").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn cpu_time_of_self_is_readable() {
        let a = process_cpu_seconds(std::process::id()).unwrap();
        assert!(a >= 0.0);
        assert!(self_cpu_seconds() >= 0.0);
    }
}
