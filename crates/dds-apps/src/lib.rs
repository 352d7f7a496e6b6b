//! Applications that run on DDS. `pagestore` is the remote storage protocol of the paper's
//! evaluation (§8.1): clients send batches of file reads and writes over TCP. `server` serves
//! it from OS files or DDS files, `client` generates load and measures it, `echo` is the TCP
//! echo of the network-path comparison (Fig. 18).
//! `offload` holds the applications' offload apps (the DPU side of their protocols). Their
//! files are served through `dds-storage`'s asynchronous backends (`dds_storage::aio`).

pub mod client;
pub mod echo;
pub mod offload;
pub use dds_pagestore as pagestore;
pub mod server;
