//! The traffic director (§5): a TCP-splitting proxy on the DPU's public address.
//!
//! Each director thread runs a `mio` event loop with its own listener clone, its own lane of
//! the `FileReadPort` and its own buffer pool. An accepted connection whose 5-tuple matches
//! the application signature is *split*: it is paired with a new connection to the host
//! application, every complete client message goes through the offload predicate, host-bound
//! requests are forwarded as one host sub-message, DPU-bound requests become file reads, and
//! the responses of both sides are merged back into request order. Other connections are
//! *spliced*: bytes are relayed both ways without inspection. See `docs/offload.md`.
//!
//! Modules by responsibility: [`config`] (options), [`signature`] (which flows are split),
//! `director` (threads), `worker` (a thread's event loop, accepting, closing, splicing),
//! `split` (client → host: framing, the engine's plan, invalidations, host sub-messages, file
//! reads), `merge` (completions and responses back in request order), [`stats`].

#![warn(missing_docs)]

pub mod buffer;
pub mod config;
mod conn;
mod director;
mod inline;
mod merge;
pub mod signature;
mod split;
pub mod stats;
mod uring;
mod worker;

pub use config::{DirectorConfig, HostApp};
pub use director::{Director, DirectorHandle, StatsSource};
pub use inline::InlineDirector;
pub use signature::{Proto, Signature};
pub use stats::DirectorStats;
