//! `dds nbd`: a Network Block Device server whose exports are DDS files (`docs/nbd.md`).
//!
//! - [`proto`]: the NBD wire format the server speaks (fixed newstyle handshake, simple and
//!   structured replies): constants, parsing and reply encoding, no I/O.
//! - [`offload`]: the offload app `nbd` (`dds dpu --offload nbd`): READs served by the DPU
//!   through the traffic director (`docs/nbd.md` §6).
//! - [`server`]: the service on the server runtime (`dds-server`): handshake, transmission,
//!   requests in flight on `dds_storage::fileio`, exports created and sized on a
//!   `dds_storage::Storage`.

#![warn(missing_docs)]

pub mod offload;
pub mod proto;
pub mod server;

pub use offload::{export_key, NbdApp};
pub use server::{ExportSpec, NbdConfig, NbdServer, NbdStats};
