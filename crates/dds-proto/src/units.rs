//! Human sizes: `4096`, `64K`, `16M`, `1G`, `2GiB` (binary units), read from every command line
//! and configuration file and printed for people.

/// Parses a size like `4096`, `64K`, `16MiB`, `1g` (binary units; `b` or nothing for bytes).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(format!("size `{s}` does not start with a number"));
    }
    let n: u64 = t[..digits]
        .parse()
        .map_err(|e| format!("size `{s}`: {e}"))?;
    let unit = t[digits..].trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("unknown size unit in `{s}` (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{s}` overflows"))
}

/// A byte count for people: `512 B`, `4.0 KiB`, `1.5 GiB` (binary units).
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
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
    fn human_bytes() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4096), "4.0 KiB");
        assert_eq!(fmt_bytes(3 << 29), "1.5 GiB");
        assert!(parse_size("1.5 GiB").is_err());
    }
}
