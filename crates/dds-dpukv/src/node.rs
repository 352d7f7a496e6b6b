//! The two processes of a deployment (`docs/dpu-kv.md` §3–§4): the DPU process (`dds dpukv
//! dpu`), which waits for a host on its control socket and runs the front ends of the host's
//! design, and the host process (`dds dpukv host`), which owns the store, the queue region
//! and the workers, and attaches to the DPU. Here: the control frames they exchange; the
//! processes themselves are [`crate::dpu::node`] and [`crate::host::node`], re-exported here.

use crate::cluster::Endpoint;
pub use crate::dpu::node::{run_dpu, DpuConfig};
pub use crate::host::node::{run_host, HostConfig, Serving};
use crate::queue::Geometry;
use crate::Design;
use anyhow::Context;
use anyhow::{bail, Result};
use dds_sys::{recv_with_fds, send_with_fds};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Most bytes of a control frame.
const MAX_FRAME: usize = 64 << 10;

/// The host's request to the DPU.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Attach {
    /// Design.
    pub design: Design,
    /// Queue pairs (designs with host workers).
    pub geometry: Geometry,
    /// Partitions of the host store (requests of partition p go to worker p % workers).
    pub partitions: u32,
    /// The host's own endpoints.
    pub host_endpoints: Vec<Endpoint>,
}

/// The DPU's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AttachReply {
    /// Serving: the DPU's endpoints.
    Attached(Vec<Endpoint>),
    /// Refused.
    Error(String),
}

pub(crate) fn send_frame(
    s: &UnixStream,
    v: &impl Serialize,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> Result<()> {
    let body = serde_json::to_vec(v)?;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    send_with_fds(s, &frame, fds)?;
    Ok(())
}

/// Receives one frame; its length is checked before anything is allocated for it.
pub(crate) fn recv_frame<T: for<'de> Deserialize<'de>>(
    s: &mut UnixStream,
) -> Result<(T, Vec<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut fds = Vec::new();
    let n = recv_with_fds(s, &mut head, &mut fds)?;
    if n == 0 {
        bail!("control connection closed");
    }
    if n < 4 {
        s.read_exact(&mut head[n..])?;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FRAME {
        bail!("control frame of {len} bytes refused (limit {MAX_FRAME})");
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok((serde_json::from_slice(&body).context("control frame")?, fds))
}

/// Waits for a path to exist (a starting DPU's socket).
pub fn wait_for(path: &Path, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
