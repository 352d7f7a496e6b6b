//! The object storage daemon's front end (`dds osd`, CODA §III/§V): objects named by (pool,
//! name) with data, xattrs and a per-object key-value map, served over a documented binary
//! protocol (`docs/osd-protocol.md`); placement groups mapped to OSDs by straw2; writes
//! replicated by each PG's primary with per-PG logs stored atomically with the data; recovery
//! from peers' PG logs after a restart; and the client library ([`client::Client`]).
//!
//! The daemon reaches its store only through `Arc<dyn dds_objstore::ObjectStore>`
//! ([`store::open_store`]), so the same front end runs next to the store (placement host) or on
//! a DPU with the store behind a proxy (placement dpu).

pub mod client;
mod conn;
pub mod etcd;
pub mod health;
mod link;
pub mod map;
pub mod monitor;
mod objects;
pub mod pglog;
mod recovery;
pub mod server;
mod service;
pub mod store;
pub mod wire;

pub use conn::CallError;
pub use map::{ClusterMap, OsdInfo, PgId, Placement, PoolInfo};
pub use objects::ObjectState;
pub use server::{parse_ready_line, ready_line, MapHandle, Osd, OsdConfig};
pub use store::{open_store, OpenError, StoreSpec};
pub use wire::{OpError, Status};
