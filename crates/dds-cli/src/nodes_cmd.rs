//! `dds nodes`: a cluster's nodes as network namespaces on one machine
//! (`dds_netns::fabric`, `docs/osd-protocol.md`, "Nodes in network namespaces").

use std::os::unix::process::CommandExt;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use dds_netns::fabric::{Fabric, CLIENT_ADDR};

#[derive(Args, Debug)]
pub struct NodesArgs {
    /// The fabric's name (1 to 8 letters, digits or '-'): its namespaces are NAME-n0…,
    /// NAME-c (clients) and NAME-sw (the switch).
    #[arg(long, global = true, default_value = "dds")]
    name: String,
    #[command(subcommand)]
    cmd: NodesCmd,
}

#[derive(Subcommand, Debug)]
enum NodesCmd {
    /// Make N node namespaces and a client namespace on a bridge of their own.
    Up {
        /// Number of nodes.
        #[arg(long)]
        nodes: usize,
    },
    /// Remove the fabric: every namespace it made, with their links.
    Down,
    /// Cut node I off (its switch port down).
    Cut {
        #[arg(long)]
        node: usize,
    },
    /// Bring node I back (its switch port up).
    Heal {
        #[arg(long)]
        node: usize,
    },
    /// Run a command in node I's namespace (or the clients' with --clients).
    Exec {
        #[arg(long, required_unless_present = "clients")]
        node: Option<usize>,
        #[arg(long)]
        clients: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn existing(name: &str) -> Result<Fabric> {
    let n = Fabric::count_nodes(name);
    Fabric::existing(name, n).with_context(|| format!("fabric {name}"))
}

pub fn run(a: NodesArgs) -> Result<()> {
    match a.cmd {
        NodesCmd::Up { nodes } => {
            let f = Fabric::create(&a.name, nodes).context("making the fabric")?;
            println!(
                "fabric {} ready: nodes {}..{} in namespaces {}..{}, clients {} in {}",
                f.name(),
                f.node_addr(0),
                f.node_addr(nodes - 1),
                f.node_ns(0),
                f.node_ns(nodes - 1),
                CLIENT_ADDR,
                f.client_ns()
            );
            f.keep();
        }
        NodesCmd::Down => existing(&a.name)?.remove()?,
        NodesCmd::Cut { node } => {
            let f = existing(&a.name)?;
            check_node(&f, node)?;
            f.cut(node)?;
            f.keep();
        }
        NodesCmd::Heal { node } => {
            let f = existing(&a.name)?;
            check_node(&f, node)?;
            f.heal(node)?;
            f.keep();
        }
        NodesCmd::Exec {
            node,
            clients,
            command,
        } => {
            let f = existing(&a.name)?;
            let mut cmd = match (clients, node) {
                (true, _) => f.client_command(&command[0]),
                (false, Some(i)) => {
                    check_node(&f, i)?;
                    f.command_on(i, &command[0])
                }
                (false, None) => bail!("--node or --clients"),
            };
            f.keep();
            // Replaced by the command (through `ip netns exec`, which execs it too): `$!`
            // of a shell is then the command's own process, which signals reach.
            let e = cmd.args(&command[1..]).exec();
            return Err(e).context("ip netns exec");
        }
    }
    Ok(())
}

fn check_node(f: &Fabric, i: usize) -> Result<()> {
    if i >= f.nodes() {
        bail!("fabric {} has nodes 0..{}", f.name(), f.nodes());
    }
    Ok(())
}
