//! Application signatures: `"srcIP/prefix:port dstIP/prefix:port proto"` (§5.1).
//!
//! Addresses are IPv4 (`10.0.0.0/8:*`) or bracketed IPv6 (`[fd00::]/64:9000`); the prefix
//! defaults to the full length; port `0` or `*` matches any port; proto is `tcp` or `udp`
//! (`*` = any). `*` alone for an address matches every address of either family.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// Transport protocol of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

/// One side of a signature: an address prefix and a port (0 = any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Network address (`None`: any address).
    pub addr: Option<IpAddr>,
    /// Prefix length in bits.
    pub prefix: u8,
    /// Port, 0 = any.
    pub port: u16,
}

/// A parsed application signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Client side.
    pub src: Endpoint,
    /// Server side.
    pub dst: Endpoint,
    /// Protocol (`None`: any).
    pub proto: Option<Proto>,
}

/// Why a signature does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad application signature: {0}")]
pub struct SignatureError(pub String);

fn err<T>(s: impl Into<String>) -> Result<T, SignatureError> {
    Err(SignatureError(s.into()))
}

fn parse_endpoint(s: &str) -> Result<Endpoint, SignatureError> {
    let (addr_part, port_part) = match s.rfind(':') {
        Some(i) if !s.ends_with(']') => (&s[..i], &s[i + 1..]),
        _ => return err(format!("`{s}`: missing :port")),
    };
    let port = match port_part {
        "*" => 0,
        p => p
            .parse::<u16>()
            .or_else(|_| err(format!("`{s}`: bad port")))?,
    };
    if addr_part == "*" {
        return Ok(Endpoint {
            addr: None,
            prefix: 0,
            port,
        });
    }
    let (ip, prefix) = match addr_part.split_once('/') {
        Some((ip, p)) => (ip, Some(p)),
        None => (addr_part, None),
    };
    let ip = ip
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(ip);
    let ip = IpAddr::from_str(ip).or_else(|_| err(format!("`{s}`: bad address")))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p
            .parse::<u8>()
            .or_else(|_| err(format!("`{s}`: bad prefix")))?,
    };
    if prefix > max {
        return err(format!("`{s}`: prefix above {max}"));
    }
    Ok(Endpoint {
        addr: Some(ip),
        prefix,
        port,
    })
}

fn prefix_match(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    let ip = match (net, ip) {
        (IpAddr::V4(_), IpAddr::V6(v6)) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        _ => ip,
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

impl Endpoint {
    /// Whether `a` is inside this endpoint.
    pub fn matches(&self, a: SocketAddr) -> bool {
        (self.port == 0 || self.port == a.port())
            && self
                .addr
                .is_none_or(|n| prefix_match(n, self.prefix, a.ip()))
    }
}

impl Signature {
    /// A signature matching every TCP flow.
    pub fn any_tcp() -> Self {
        let any = Endpoint {
            addr: None,
            prefix: 0,
            port: 0,
        };
        Signature {
            src: any,
            dst: any,
            proto: Some(Proto::Tcp),
        }
    }

    /// Whether the flow `src → dst` over `proto` matches.
    pub fn matches(&self, src: SocketAddr, dst: SocketAddr, proto: Proto) -> bool {
        self.proto.is_none_or(|p| p == proto) && self.src.matches(src) && self.dst.matches(dst)
    }
}

impl FromStr for Signature {
    type Err = SignatureError;
    fn from_str(s: &str) -> Result<Self, SignatureError> {
        let parts: Vec<&str> = s.split_whitespace().collect();
        let [src, dst, proto] = parts[..] else {
            return err("expected \"src/prefix:port dst/prefix:port proto\"");
        };
        let proto = match proto.to_ascii_lowercase().as_str() {
            "tcp" | "6" => Some(Proto::Tcp),
            "udp" | "17" => Some(Proto::Udp),
            "*" => None,
            p => return err(format!("unknown protocol `{p}`")),
        };
        Ok(Signature {
            src: parse_endpoint(src)?,
            dst: parse_endpoint(dst)?,
            proto,
        })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.addr {
            None => write!(f, "*")?,
            Some(IpAddr::V4(a)) => write!(f, "{a}/{}", self.prefix)?,
            Some(IpAddr::V6(a)) => write!(f, "[{a}]/{}", self.prefix)?,
        }
        if self.port == 0 {
            write!(f, ":*")
        } else {
            write!(f, ":{}", self.port)
        }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = match self.proto {
            Some(Proto::Tcp) => "tcp",
            Some(Proto::Udp) => "udp",
            None => "*",
        };
        write!(f, "{} {} {p}", self.src, self.dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn parse_and_match() {
        let s: Signature = "10.0.0.0/8:* 192.168.1.5/32:9000 tcp".parse().unwrap();
        assert!(s.matches(sa("10.1.2.3:5555"), sa("192.168.1.5:9000"), Proto::Tcp));
        assert!(!s.matches(sa("11.1.2.3:5555"), sa("192.168.1.5:9000"), Proto::Tcp));
        assert!(!s.matches(sa("10.1.2.3:5555"), sa("192.168.1.5:9001"), Proto::Tcp));
        assert!(!s.matches(sa("10.1.2.3:5555"), sa("192.168.1.5:9000"), Proto::Udp));
        assert_eq!(s.to_string(), "10.0.0.0/8:* 192.168.1.5/32:9000 tcp");
        let r: Signature = s.to_string().parse().unwrap();
        assert_eq!(r, s);

        let s: Signature = "0.0.0.0/0:0 127.0.0.1:0 TCP".parse().unwrap();
        assert!(s.matches(sa("8.8.8.8:1"), sa("127.0.0.1:80"), Proto::Tcp));
        let s: Signature = "[fd00::]/16:* [::1]/128:7000 *".parse().unwrap();
        assert!(s.matches(sa("[fd00:1::2]:4000"), sa("[::1]:7000"), Proto::Udp));
        assert!(!s.matches(sa("[fe00::2]:4000"), sa("[::1]:7000"), Proto::Tcp));
        let s: Signature = "127.0.0.0/8:* *:* tcp".parse().unwrap();
        assert!(s.matches(sa("[::ffff:127.0.0.9]:4000"), sa("[::1]:1"), Proto::Tcp));
        assert!(s.matches(sa("127.0.0.9:4000"), sa("10.0.0.1:1"), Proto::Tcp));
        // A source port selects one client.
        let s: Signature = "127.0.0.1/32:4242 *:* tcp".parse().unwrap();
        assert!(!s.matches(sa("127.0.0.1:4000"), sa("127.0.0.1:1"), Proto::Tcp));
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "1.2.3.4:1 5.6.7.8:2",
            "1.2.3.4 5.6.7.8:2 tcp",
            "1.2.3.4/33:1 5.6.7.8:2 tcp",
            "1.2.3.4:70000 5.6.7.8:2 tcp",
            "1.2.3.x:1 5.6.7.8:2 tcp",
            "1.2.3.4:1 5.6.7.8:2 sctp",
            "[::1]/129:1 *:* tcp",
            "1.2.3.4:1 5.6.7.8:2 tcp extra",
        ] {
            assert!(bad.parse::<Signature>().is_err(), "{bad:?}");
        }
    }
}
