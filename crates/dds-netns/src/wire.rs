//! The DPU in the wire (`docs/bump-in-the-wire.md`): three namespaces, the clients', the
//! DPU's and the host's, where the DPU's is the only path between the other two and routes
//! like a NIC would; and the flow rules ([`FlowRules`]) with which the DPU diverts the flows
//! of an application signature to its traffic director, keeping the clients' destination
//! address (TPROXY), while every other flow is forwarded to the host untouched.
//!
//! For a topology named `W` (1 to 8 letters, digits or `-`):
//!
//! ```text
//!   W-cl (clients)          W-dpu (DPU: routes, steers)             W-host (host)
//!   eth0 10.78.1.2/24 ----- cl0 10.78.1.1/24   host0 10.78.2.1/24 ----- eth0 10.78.2.2/24
//!   default via 10.78.1.1                                               default via 10.78.2.1
//! ```
//!
//! In `W-dpu`: forwarding on, reverse-path filtering off, and the policy route with which a
//! packet that the flow rules marked (mark 1) is delivered to a local socket:
//! `ip rule add fwmark 1 lookup 100`, `ip route add local 0.0.0.0/0 dev lo table 100`.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use crate::{in_ns, ip, ns_exists, valid_name};

/// The host's address, which the clients address.
pub const HOST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 78, 2, 2);
/// The clients' address.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 78, 1, 2);
/// The DPU's address on the clients' side.
pub const DPU_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 78, 1, 1);
/// The DPU's address on the host's side.
pub const DPU_HOST_SIDE: Ipv4Addr = Ipv4Addr::new(10, 78, 2, 1);
/// The mark of packets diverted to a local socket, and the routing table that delivers them.
pub const MARK: u32 = 1;
const TABLE: u32 = 100;
/// The nftables table of the flow rules.
pub const NFT_TABLE: &str = "dds_steer";

/// A client–DPU–host topology (see the module documentation).
#[derive(Debug)]
pub struct Topology {
    name: String,
    /// Removed on drop (false for a handle on a topology made elsewhere, or kept).
    owned: bool,
    /// Steps of `up` taken so far, and the one made to fail (tests of the clean-up).
    steps: std::cell::Cell<usize>,
    fail_at: Option<usize>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = crate::delete_namespaces(self.namespaces()) {
                tracing::warn!(topology = %self.name, "removing the topology: {e}");
            }
        }
    }
}

impl Topology {
    /// Makes topology `name`. Fails (after removing what it made) when one of its namespaces
    /// exists or the caller may not make them.
    pub fn create(name: &str) -> io::Result<Topology> {
        Topology::create_failing_at(name, None)
    }

    /// [`Topology::create`], its step `fail_at` failing (a test of the clean-up after a
    /// failure half-way).
    fn create_failing_at(name: &str, fail_at: Option<usize>) -> io::Result<Topology> {
        if !valid_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("topology name {name:?}: 1 to 8 letters, digits or '-'"),
            ));
        }
        let t = Topology {
            name: name.to_string(),
            owned: true,
            steps: std::cell::Cell::new(0),
            fail_at,
        };
        if t.namespaces().iter().any(|ns| ns_exists(ns)) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("topology {name} exists (remove it with `dds wire down --name {name}`)"),
            ));
        }
        // A failure half-way removes what was made (on drop).
        t.build()?;
        Ok(t)
    }

    /// A handle on topology `name` made by another process.
    pub fn existing(name: &str) -> io::Result<Topology> {
        let t = Topology {
            name: name.to_string(),
            owned: false,
            steps: std::cell::Cell::new(0),
            fail_at: None,
        };
        if !t.namespaces().iter().any(|ns| ns_exists(ns)) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no topology {name}"),
            ));
        }
        Ok(t)
    }

    /// One step of `up` (failing when it is the one `fail_at` names).
    fn step(&self) -> io::Result<()> {
        let n = self.steps.get();
        self.steps.set(n + 1);
        if self.fail_at == Some(n) {
            return Err(io::Error::other(format!("step {n} made to fail")));
        }
        Ok(())
    }

    fn ip<const N: usize>(&self, args: [&str; N]) -> io::Result<()> {
        self.step()?;
        ip(args)
    }

    fn build(&self) -> io::Result<()> {
        let (cl, dpu, host) = (self.client_ns(), self.dpu_ns(), self.host_ns());
        for ns in [&cl, &dpu, &host] {
            self.ip(["netns", "add", ns])?;
            self.ip(["-n", ns, "link", "set", "lo", "up"])?;
        }
        self.link(&cl, &dpu, "cl0", CLIENT_ADDR, DPU_CLIENT_SIDE)?;
        self.link(&host, &dpu, "host0", HOST_ADDR, DPU_HOST_SIDE)?;
        self.ip([
            "-n",
            &cl,
            "route",
            "add",
            "default",
            "via",
            &DPU_CLIENT_SIDE.to_string(),
        ])?;
        self.ip([
            "-n",
            &host,
            "route",
            "add",
            "default",
            "via",
            &DPU_HOST_SIDE.to_string(),
        ])?;
        for (key, value) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/default/rp_filter", "0"),
        ] {
            self.step()?;
            sysctl(&dpu, key, value)?;
        }
        self.ip([
            "-n",
            &dpu,
            "rule",
            "add",
            "fwmark",
            &MARK.to_string(),
            "lookup",
            &TABLE.to_string(),
        ])?;
        self.ip([
            "-n",
            &dpu,
            "route",
            "add",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            &TABLE.to_string(),
        ])
    }

    /// A veth pair: `eth0` at `addr` in `ns`, `port` at `dpu_addr` in the DPU's namespace.
    fn link(
        &self,
        ns: &str,
        dpu: &str,
        port: &str,
        addr: Ipv4Addr,
        dpu_addr: Ipv4Addr,
    ) -> io::Result<()> {
        self.ip([
            "-n", dpu, "link", "add", port, "type", "veth", "peer", "name", "x0",
        ])?;
        self.ip(["-n", dpu, "link", "set", "x0", "netns", ns])?;
        self.ip(["-n", ns, "link", "set", "x0", "name", "eth0"])?;
        self.ip([
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        self.ip(["-n", ns, "link", "set", "eth0", "up"])?;
        self.ip([
            "-n",
            dpu,
            "addr",
            "add",
            &format!("{dpu_addr}/24"),
            "dev",
            port,
        ])?;
        self.ip(["-n", dpu, "link", "set", port, "up"])
    }

    /// The topology's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The clients' namespace.
    pub fn client_ns(&self) -> String {
        format!("{}-cl", self.name)
    }

    /// The DPU's namespace.
    pub fn dpu_ns(&self) -> String {
        format!("{}-dpu", self.name)
    }

    /// The host's namespace.
    pub fn host_ns(&self) -> String {
        format!("{}-host", self.name)
    }

    fn namespaces(&self) -> [String; 3] {
        [self.client_ns(), self.dpu_ns(), self.host_ns()]
    }

    /// `program` to run in the clients' namespace.
    pub fn on_client(&self, program: &str) -> Command {
        in_ns(&self.client_ns(), program)
    }

    /// `program` to run in the DPU's namespace.
    pub fn on_dpu(&self, program: &str) -> Command {
        in_ns(&self.dpu_ns(), program)
    }

    /// `program` to run in the host's namespace.
    pub fn on_host(&self, program: &str) -> Command {
        in_ns(&self.host_ns(), program)
    }

    /// The flow rules installed in the DPU's namespace now (`nft list table`), or `None`.
    pub fn rules(&self) -> Option<String> {
        let out = self
            .on_dpu("nft")
            .args(["list", "table", "ip", NFT_TABLE])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Leaves the topology in place when this handle goes.
    pub fn keep(mut self) {
        self.owned = false;
    }

    /// Removes the topology: its namespaces, with their links, addresses, routes and rules.
    pub fn remove(mut self) -> io::Result<()> {
        self.owned = false;
        crate::delete_namespaces(self.namespaces())
    }
}

fn sysctl(ns: &str, key: &str, value: &str) -> io::Result<()> {
    let st = in_ns(ns, "sh")
        .args(["-c", &format!("echo {value} > /proc/sys/{key}")])
        .status()?;
    if st.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("{ns}: {key} = {value}: {st}")))
    }
}

/// One side of a steered flow: an address prefix (`None`: any) and a port (0: any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSide {
    /// The prefix's address and length.
    pub net: Option<(IpAddr, u8)>,
    /// The port, 0 for any.
    pub port: u16,
}

/// The flows an application signature names, steered to a local port by TPROXY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRules {
    /// The clients' side.
    pub src: FlowSide,
    /// The server's side (the host application's address and port).
    pub dst: FlowSide,
    /// The port of the transparent listener the flows go to (the director's).
    pub to_port: u16,
}

impl FlowRules {
    /// The nftables script that installs the rules, replacing any installed before, as one
    /// transaction: packets of connections already diverted (their socket is transparent)
    /// are marked and delivered; a new connection of the signature goes to `to_port`; and
    /// when nothing listens there (the director is gone) it is refused with a reset. IPv4 TCP
    /// only.
    pub fn script(&self) -> io::Result<String> {
        let mut m = String::new();
        for (side, dir) in [(self.src, "s"), (self.dst, "d")] {
            match side.net {
                Some((IpAddr::V4(a), len)) => m += &format!("ip {dir}addr {a}/{len} "),
                Some((IpAddr::V6(_), _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "flow rules steer IPv4 flows only",
                    ))
                }
                None => {}
            }
        }
        for (side, dir) in [(self.src, "s"), (self.dst, "d")] {
            if side.port != 0 {
                m += &format!("tcp {dir}port {} ", side.port);
            }
        }
        if !m.contains("tcp ") {
            m += "meta l4proto tcp ";
        }
        Ok(format!(
            "table ip {NFT_TABLE} {{}}\n\
             delete table ip {NFT_TABLE}\n\
             table ip {NFT_TABLE} {{\n\
             \tchain prerouting {{\n\
             \t\ttype filter hook prerouting priority mangle; policy accept;\n\
             \t\tmeta l4proto tcp socket transparent 1 meta mark set {MARK} accept\n\
             \t\t{m}tproxy to :{port} meta mark set {MARK} accept\n\
             \t\t{m}reject with tcp reset\n\
             \t}}\n\
             }}\n",
            port = self.to_port
        ))
    }

    /// Installs the rules in the caller's namespace (atomically; again after a restart: the
    /// rules installed before are replaced).
    pub fn install(&self) -> io::Result<()> {
        crate::nft(None, &self.script()?)
    }

    /// Removes the rules from the caller's namespace (nothing when none are installed).
    pub fn remove() -> io::Result<()> {
        crate::nft(
            None,
            &format!("table ip {NFT_TABLE} {{}}\ndelete table ip {NFT_TABLE}\n"),
        )
    }
}

/// Whether flow rules can be installed here: a probe namespace gets a TPROXY rule (nftables
/// with its `tproxy` and `socket` expressions), then goes. Tests that steer skip, saying why,
/// where they cannot.
pub fn steering_available() -> Result<(), String> {
    crate::available()?;
    let probe = format!("ddssteer-{}", std::process::id());
    ip(["netns", "add", &probe]).map_err(|e| e.to_string())?;
    let rules = FlowRules {
        src: FlowSide { net: None, port: 0 },
        dst: FlowSide {
            net: Some((IpAddr::V4(HOST_ADDR), 32)),
            port: 1,
        },
        to_port: 1,
    };
    let r = rules
        .script()
        .and_then(|s| crate::nft(Some(&probe), &s))
        .map_err(|e| e.to_string());
    let _ = ip(["netns", "delete", &probe]);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_failing_half_way_leaves_nothing() {
        if let Err(e) = crate::available() {
            eprintln!("network namespaces unavailable here ({e}): skipped");
            return;
        }
        let name = format!("f{}", std::process::id() % 1_000_000);
        let mut failed = 0;
        for k in 0.. {
            match Topology::create_failing_at(&name, Some(k)) {
                Err(e) => {
                    assert!(e.to_string().contains("made to fail"), "{e}");
                    failed += 1;
                    for ns in ["cl", "dpu", "host"] {
                        assert!(
                            !ns_exists(&format!("{name}-{ns}")),
                            "step {k} failed and left {name}-{ns}"
                        );
                    }
                }
                Ok(t) => {
                    t.remove().unwrap();
                    break;
                }
            }
        }
        assert!(failed > 20, "only {failed} steps");
    }

    #[test]
    fn the_script_matches_the_signature() {
        let r = FlowRules {
            src: FlowSide { net: None, port: 0 },
            dst: FlowSide {
                net: Some((IpAddr::V4(HOST_ADDR), 32)),
                port: 6379,
            },
            to_port: 7000,
        };
        let s = r.script().unwrap();
        assert!(
            s.contains("ip daddr 10.78.2.2/32 tcp dport 6379 tproxy to :7000 meta mark set 1"),
            "{s}"
        );
        assert!(s.contains("ip daddr 10.78.2.2/32 tcp dport 6379 reject with tcp reset"));
        assert!(s.starts_with("table ip dds_steer {}\ndelete table ip dds_steer\n"));
        let any = FlowRules {
            src: FlowSide { net: None, port: 0 },
            dst: FlowSide { net: None, port: 0 },
            to_port: 1,
        };
        assert!(any
            .script()
            .unwrap()
            .contains("meta l4proto tcp tproxy to :1"));
        let v6 = FlowRules {
            dst: FlowSide {
                net: Some(("fd00::1".parse().unwrap(), 128)),
                port: 1,
            },
            ..any
        };
        assert!(v6.script().is_err());
    }
}
