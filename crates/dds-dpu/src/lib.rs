//! The DPU daemon (`dds dpu`).
//!
//! Two planes, kept apart:
//! - the control thread(s) accept host connections on a Unix socket, answer `hello`, and pass
//!   every other request to the service thread through a bounded channel;
//! - the service thread owns the file service, the DMA engine and every notification group.
//!   It polls the request rings by DMA, executes requests with zero copy (§4.3, Fig. 10) and
//!   delivers responses in order in batches.

mod bell;
mod control;
mod cpu;
mod group;
mod offload;
pub mod profile;
mod service;

use std::time::Duration;

pub use control::{memory_file_service, temp_socket_path, Dpu, DpuHandle};
pub use offload::OffloadConfig;

/// How the service thread executes I/O (Fig. 17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMode {
    /// Write data goes to the device straight from the request mirror, read data lands straight
    /// in the pre-allocated response slot.
    ZeroCopy,
    /// The baseline: write data is copied out of the request buffer before submission and read
    /// data is copied into the response buffer after completion.
    Copy,
}

/// DPU daemon settings.
#[derive(Clone, Debug)]
pub struct DpuConfig {
    pub socket: std::path::PathBuf,
    pub exec_mode: ExecMode,
    /// Emulated PCIe cost model of the DMA engine; `None` = free copies.
    pub dma_cost: Option<dds_dma::CostModel>,
    /// DMA operations in flight at most.
    pub dma_queue_depth: usize,
    /// Largest read or write (bytes).
    pub max_io_bytes: u32,
    /// Notification groups at most (all hosts).
    pub max_groups: usize,
    /// Bytes of DPU memory all groups' buffers may use together.
    pub memory_budget_bytes: u64,
    /// Outstanding requests per group at most.
    pub max_pending_per_group: usize,
    /// Deliver responses once this many bytes are buffered (or when the thread goes idle).
    pub delivery_batch_bytes: u64,
    /// Idle service thread: park (block until a host, the control plane or a director rings)
    /// once idle for a while; false: always spin, as on a dedicated DPU core.
    pub park_when_idle: bool,
    /// Besides our own user and root, users whose processes may use the control socket.
    pub allow_uids: Vec<u32>,
    /// Groups (a peer's primary group) whose processes may use the control socket.
    pub allow_gids: Vec<u32>,
    /// Control connections open at once at most. When all are taken, a newcomer closes the
    /// longest-waiting connection that holds no group or buffer, or is closed itself if there
    /// is none.
    pub max_control_connections: usize,
    /// A control frame whose first byte arrived must be complete within this time, and a
    /// reply taken by the client within this time, or the connection is closed.
    pub control_frame_timeout: Duration,
    /// A control connection that holds no notification group and no registered buffer is
    /// closed after this long without a request. Hosts holding groups wait without limit.
    pub control_idle_timeout: Duration,
    /// Bytes of application buffers one control connection may register at most
    /// (`register_buffer`); more get `BufferLimit`.
    pub max_registered_bytes_per_conn: u64,
}

/// Application buffers one control connection may register at most.
pub const MAX_BUFFERS_PER_CONN: usize = 1024;

impl Default for DpuConfig {
    fn default() -> Self {
        DpuConfig {
            socket: dds_proto::control::default_socket_path(),
            exec_mode: ExecMode::ZeroCopy,
            dma_cost: None,
            dma_queue_depth: 256,
            max_io_bytes: 1 << 20,
            max_groups: 64,
            memory_budget_bytes: 512 << 20,
            max_pending_per_group: 4096,
            delivery_batch_bytes: 64 << 10,
            park_when_idle: true,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            max_control_connections: 64,
            control_frame_timeout: Duration::from_secs(10),
            control_idle_timeout: Duration::from_secs(30),
            max_registered_bytes_per_conn: 1 << 30,
        }
    }
}
