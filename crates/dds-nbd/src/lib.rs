//! `dds nbd`: a Network Block Device server whose exports are DDS files (`docs/nbd.md`).
//!
//! - [`proto`]: the NBD wire format the server speaks (fixed newstyle handshake, simple and
//!   structured replies): constants, parsing and reply encoding, no I/O.
//! - [`server`]: the service on the server runtime (`dds-server`): handshake, transmission,
//!   requests in flight on `dds_storage::fileio`, exports created and sized on a
//!   `dds_storage::Storage`.

#![warn(missing_docs)]

pub mod proto;
pub mod server;

pub use server::{ExportSpec, NbdConfig, NbdServer, NbdStats};
