//! `dds kv`: a key-value server speaking the Redis protocol, whose data lives in a
//! FASTER-style hybrid log on a DDS file (§2 and §9.2 of the DDS paper), and the DPU offload
//! app that serves GETs of records on storage without the host. Design and formats:
//! `docs/kv-service.md`.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod cmdstats;
pub mod collection;
pub mod collmap;
pub mod commands;
pub mod config;
pub mod engine;
mod float;
pub mod glob;
mod hashes;
mod introspect;
mod keyspace;
pub mod lists;
pub mod offload;
pub mod record;
pub mod server;
mod sets;
mod sort;
pub mod store;
mod strings;
pub mod zindex;
mod zsetops;
mod zsets;

pub use engine::{Engine, MemEngine};
pub use store::{Durability, Expiry, Modify, SetCond, Store, StoreConfig, StoreError, StoreStats};
