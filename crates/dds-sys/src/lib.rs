//! Small systems pieces that crates on both sides of the DPU–host boundary use, below the DMA
//! engine, the protocols and the stores:
//!
//! - [`send_with_fds`] / [`recv_with_fds`]: file-descriptor passing over Unix stream sockets
//!   (`SCM_RIGHTS`), how host memory and eventfds travel to the DPU process (the control
//!   protocol of `dds-proto`, DPU-KV's and the object proxy's channels);
//! - [`AlignedBuf`]: the one aligned-buffer type of the workspace, for O_DIRECT I/O and as
//!   DPU-local memory that DMA operations copy into or out of (`dds_dma::LocalBuf`);
//! - [`advise_huge_pages`]: transparent huge pages for tables read at random (the cache table's
//!   buckets, the in-memory KV store's index and log).

mod aligned;
mod fdpass;
mod huge;

pub use aligned::AlignedBuf;
pub use fdpass::{recv_with_fds, send_with_fds, MAX_FDS};
pub use huge::advise_huge_pages;
