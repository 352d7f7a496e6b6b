//! `dds pageserver`: the page server of a storage-disaggregated DBMS on DDS (§9.1 of the DDS
//! paper). Compute servers append their log and ask for pages as of a log position
//! (GetPage@LSN); the host replays the log into pages on a DDS file, and the DPU's offload app
//! answers GetPages whose page version on storage is the one asked for. Protocol and formats:
//! `docs/pageserver-protocol.md`.

#![warn(missing_docs)]

pub mod offload;
pub mod page;
pub mod proto;
pub mod server;
pub mod wal;

pub use server::{PageServer, PageServerConfig, PageServerStats, Retention};
