//! `dds wire`: the DPU in the wire between clients and host, as three network namespaces
//! (`dds_netns::wire`, `docs/bump-in-the-wire.md`).

use std::os::unix::process::CommandExt;

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use dds_netns::wire::{Topology, CLIENT_ADDR, DPU_CLIENT_SIDE, DPU_HOST_SIDE, HOST_ADDR};

#[derive(Args, Debug)]
pub struct WireArgs {
    /// The topology's name (1 to 8 letters, digits or '-'): its namespaces are NAME-cl,
    /// NAME-dpu and NAME-host.
    #[arg(long, global = true, default_value = "dds")]
    name: String,
    #[command(subcommand)]
    cmd: WireCmd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Side {
    Client,
    Dpu,
    Host,
}

#[derive(Subcommand, Debug)]
enum WireCmd {
    /// Make the client, DPU and host namespaces; the DPU's is the only path between the
    /// other two.
    Up,
    /// Remove them, with their links, routes and flow rules.
    Down,
    /// Run a command in one of the namespaces.
    Exec {
        #[arg(long, value_enum)]
        on: Side,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print the flow rules installed in the DPU's namespace.
    Rules,
}

pub fn run(a: WireArgs) -> Result<()> {
    match a.cmd {
        WireCmd::Up => {
            let t = Topology::create(&a.name).context("making the topology")?;
            println!(
                "wire {} ready: clients {CLIENT_ADDR} in {}, DPU {DPU_CLIENT_SIDE} and \
                 {DPU_HOST_SIDE} in {}, host {HOST_ADDR} in {}",
                t.name(),
                t.client_ns(),
                t.dpu_ns(),
                t.host_ns()
            );
            t.keep();
        }
        WireCmd::Down => Topology::existing(&a.name)?.remove()?,
        WireCmd::Exec { on, command } => {
            let t = Topology::existing(&a.name)?;
            let mut cmd = match on {
                Side::Client => t.on_client(&command[0]),
                Side::Dpu => t.on_dpu(&command[0]),
                Side::Host => t.on_host(&command[0]),
            };
            t.keep();
            // Replaced by the command (through `ip netns exec`, which execs it too): `$!`
            // of a shell is then the command's own process, which signals reach.
            let e = cmd.args(&command[1..]).exec();
            return Err(e).context("ip netns exec");
        }
        WireCmd::Rules => {
            let t = Topology::existing(&a.name)?;
            match t.rules() {
                Some(r) => print!("{r}"),
                None => println!("no flow rules installed in {}", t.dpu_ns()),
            }
            t.keep();
        }
    }
    Ok(())
}
