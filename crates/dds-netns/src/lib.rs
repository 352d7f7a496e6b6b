//! Network namespaces for DDS on one machine, made with iproute2's `ip` (and nftables'
//! `nft` for flow rules), which must be on the `PATH`, by a process allowed to (root, or
//! `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`):
//!
//! - [`fabric`]: a cluster's nodes on a bridge, each node cut off and brought back at will
//!   (`dds nodes`);
//! - [`wire`]: the DPU in the wire, between the clients and the host (`dds wire`), and the
//!   flow rules with which the DPU steers an application's flows to its director.
//!
//! Everything is made inside namespaces created here and goes with them.

pub mod fabric;
pub mod wire;

pub use fabric::Fabric;

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};

/// Runs `ip ARGS`; its standard error is the error's text when it fails.
pub(crate) fn ip<I, S>(args: I) -> io::Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new("ip");
    cmd.args(args);
    let out = cmd.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("ip (package iproute2) could not run: {e}"),
        )
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{:?}: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Runs `nft -f -` with `script` in namespace `ns` (`None`: the caller's): one transaction,
/// applied whole or not at all.
pub fn nft(ns: Option<&str>, script: &str) -> io::Result<()> {
    use std::io::Write;
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft", "-f", "-"]);
            c
        }
        None => {
            let mut c = Command::new("nft");
            c.args(["-f", "-"]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("nft (package nftables) could not run: {e}"),
            )
        })?;
    child
        .stdin
        .take()
        .expect("stdin piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 8
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Deletes the namespaces of `names` that exist (with their links, addresses, routes and
/// rules); returns the first failure, after trying them all.
pub(crate) fn delete_namespaces(names: impl IntoIterator<Item = String>) -> io::Result<()> {
    let mut first = Ok(());
    for ns in names {
        if ns_exists(&ns) {
            if let Err(e) = ip(["netns", "delete", &ns]) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    first
}

pub(crate) fn ns_path(ns: &str) -> String {
    format!("/run/netns/{ns}")
}

/// Whether network namespace `ns` exists (`/run/netns/NS`, as `ip netns` names them).
pub fn ns_exists(ns: &str) -> bool {
    std::path::Path::new(&ns_path(ns)).exists()
}

/// `program` to run in namespace `ns` (`ip netns exec NS PROGRAM`, which execs it: the
/// child's pid is the program's).
pub fn in_ns(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(program);
    cmd
}

/// Moves the calling thread into namespace `ns`: the sockets it opens from then on, and the
/// threads it starts, are in `ns`; the process's other threads stay where they are.
pub fn enter(ns: &str) -> io::Result<()> {
    let f = File::open(ns_path(ns))?;
    // SAFETY: setns with a namespace file descriptor this function owns; it changes only the
    // calling thread's network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this process may make network namespaces with the links a fabric or a topology
/// uses, and run programs in them (makes one with a bridge and a veth pair inside, runs
/// `true` in it, removes it): tests that need one skip, saying why, where it cannot.
pub fn available() -> Result<(), String> {
    let probe = format!("ddsprobe-{}", std::process::id());
    ip(["netns", "add", &probe]).map_err(|e| e.to_string())?;
    let r = (|| {
        ip(["-n", &probe, "link", "add", "b0", "type", "bridge"]).map_err(|e| e.to_string())?;
        ip([
            "-n", &probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
        ])
        .map_err(|e| e.to_string())?;
        match in_ns(&probe, "true").output() {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "ip netns exec: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("ip netns exec: {e}")),
        }
    })();
    let _ = ip(["netns", "delete", &probe]);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_name("t1"));
        assert!(valid_name("a-b-c-d1"));
        assert!(!valid_name(""));
        assert!(!valid_name("toolongname"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a b"));
    }
}
