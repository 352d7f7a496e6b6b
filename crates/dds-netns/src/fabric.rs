//! A cluster's nodes as network namespaces (`docs/osd-protocol.md`, "Nodes in network
//! namespaces"): a
//! fabric of N node namespaces and one client namespace, each linked by a veth pair to a
//! bridge that lives in a switch namespace of its own, so that a cluster's daemons run on
//! separate network stacks of one machine and a node can be cut off (its switch port down)
//! and brought back.
//!
//! Nothing is added to the caller's namespace: the bridge, the switch ports and every address
//! are inside namespaces the fabric created, and [`Fabric::remove`] (also on drop) deletes
//! those namespaces, which deletes their links. The namespaces and links are made with
//! iproute2's `ip`, which must be on the `PATH`, by a process allowed to (root, or
//! `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`).
//!
//! Names, for a fabric named `F` (at most 8 characters, letters, digits and `-`):
//! `F-sw` (the switch: bridge `br0`, ports `p0`… for the nodes and `pc` for the clients),
//! `F-n0`… (the nodes) and `F-c` (the clients), each with interface `eth0` and loopback up.
//! Node `i` has address `10.77.0.(i + 1)/24`, the clients `10.77.0.250/24`.

use std::ffi::OsStr;
use std::io;
use std::net::Ipv4Addr;
use std::process::Command;

use crate::{enter, in_ns, ip, ns_exists, valid_name};

/// Most nodes in a fabric.
pub const MAX_NODES: usize = 200;

/// The clients' address in every fabric.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 250);

/// A fabric of node namespaces (see the module documentation).
#[derive(Debug)]
pub struct Fabric {
    name: String,
    nodes: usize,
    /// Removed on drop (false for a handle on a fabric made elsewhere).
    owned: bool,
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = crate::delete_namespaces(self.namespaces()) {
                tracing::warn!(fabric = %self.name, "removing the fabric: {e}");
            }
        }
    }
}

impl Fabric {
    /// Creates fabric `name` with `nodes` nodes and a client namespace. Fails (after removing
    /// what it made) when a namespace of that name exists or the caller may not make them.
    pub fn create(name: &str, nodes: usize) -> io::Result<Fabric> {
        if !valid_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fabric name {name:?}: 1 to 8 letters, digits or '-'"),
            ));
        }
        if nodes == 0 || nodes > MAX_NODES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{nodes} nodes: 1 to {MAX_NODES}"),
            ));
        }
        let f = Fabric {
            name: name.to_string(),
            nodes,
            owned: true,
        };
        if f.namespaces().any(|ns| ns_exists(&ns)) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("fabric {name} exists (remove it with `dds nodes down --name {name}`)"),
            ));
        }
        // From here on, a failure removes what was made (on drop).
        f.build()?;
        Ok(f)
    }

    /// A handle on fabric `name` made by another process (`dds nodes up`): for cutting,
    /// healing and removing it.
    pub fn existing(name: &str, nodes: usize) -> io::Result<Fabric> {
        let f = Fabric {
            name: name.to_string(),
            nodes,
            owned: false,
        };
        if !ns_exists(&f.switch()) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no fabric {name}"),
            ));
        }
        Ok(f)
    }

    /// The number of nodes of a fabric made by another process (its switch's node ports).
    pub fn count_nodes(name: &str) -> usize {
        (0..MAX_NODES)
            .take_while(|i| ns_exists(&format!("{name}-n{i}")))
            .count()
    }

    fn build(&self) -> io::Result<()> {
        let sw = self.switch();
        ip(["netns", "add", &sw])?;
        ip(["-n", &sw, "link", "set", "lo", "up"])?;
        ip(["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..self.nodes {
            self.attach(&self.node_ns(i), &format!("p{i}"), self.node_addr(i))?;
        }
        self.attach(&self.client_ns(), "pc", CLIENT_ADDR)
    }

    /// Makes namespace `ns` with `eth0` at `addr`, linked to switch port `port`.
    fn attach(&self, ns: &str, port: &str, addr: Ipv4Addr) -> io::Result<()> {
        let sw = self.switch();
        ip(["netns", "add", ns])?;
        ip(["-n", ns, "link", "set", "lo", "up"])?;
        // Both ends are made in the switch; one moves to the node and is renamed there.
        ip([
            "-n", &sw, "link", "add", port, "type", "veth", "peer", "name", "x0",
        ])?;
        ip(["-n", &sw, "link", "set", "x0", "netns", ns])?;
        ip(["-n", ns, "link", "set", "x0", "name", "eth0"])?;
        ip([
            "-n",
            ns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(["-n", ns, "link", "set", "eth0", "up"])?;
        ip(["-n", &sw, "link", "set", port, "master", "br0"])?;
        ip(["-n", &sw, "link", "set", port, "up"])
    }

    /// Leaves the fabric in place when this handle goes (for `dds nodes up`, whose fabric
    /// outlives the command).
    pub fn keep(mut self) {
        self.owned = false;
    }

    /// The fabric's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    fn switch(&self) -> String {
        format!("{}-sw", self.name)
    }

    /// The namespace of node `i`.
    pub fn node_ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.name)
    }

    /// The clients' namespace.
    pub fn client_ns(&self) -> String {
        format!("{}-c", self.name)
    }

    /// Node `i`'s address.
    pub fn node_addr(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.nodes, "node {i} of {}", self.nodes);
        Ipv4Addr::new(10, 77, 0, (i + 1) as u8)
    }

    fn namespaces(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.nodes)
            .map(|i| self.node_ns(i))
            .chain([self.client_ns(), self.switch()])
    }

    /// `program` to run in node `i`'s namespace (`ip netns exec`).
    pub fn command_on(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        assert!(i < self.nodes, "node {i} of {}", self.nodes);
        in_ns(&self.node_ns(i), program)
    }

    /// `program` to run in the clients' namespace.
    pub fn client_command(&self, program: impl AsRef<OsStr>) -> Command {
        in_ns(&self.client_ns(), program)
    }

    /// Moves the calling thread into the clients' namespace: the sockets it opens from now
    /// on, and the threads it starts, are the clients'.
    pub fn enter_clients(&self) -> io::Result<()> {
        enter(&self.client_ns())
    }

    /// Cuts node `i` off: its switch port goes down, so nothing reaches it or leaves it.
    pub fn cut(&self, i: usize) -> io::Result<()> {
        assert!(i < self.nodes, "node {i} of {}", self.nodes);
        ip([
            "-n",
            &self.switch(),
            "link",
            "set",
            &format!("p{i}"),
            "down",
        ])
    }

    /// Brings node `i` back (its switch port up).
    pub fn heal(&self, i: usize) -> io::Result<()> {
        assert!(i < self.nodes, "node {i} of {}", self.nodes);
        ip(["-n", &self.switch(), "link", "set", &format!("p{i}"), "up"])
    }

    /// Deletes every namespace of the fabric (and with them their links); processes still
    /// running in a node keep a namespace without a link until they exit.
    pub fn remove(mut self) -> io::Result<()> {
        self.owned = false;
        crate::delete_namespaces(self.namespaces())
    }
}
