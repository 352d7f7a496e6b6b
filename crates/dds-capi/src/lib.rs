//! C ABI of the DDS host file library (`libdds`, declared in `include/dds.h`).
//!
//! Conventions, the same for every function:
//! - every function returns a `dds_status`: `DDS_OK` (0) or an error code (the status codes
//!   of `docs/records.md`, plus `DDS_INTERNAL`); results are written through out-pointers,
//!   and only on success;
//! - NULL or misaligned pointers, handles that are not live (best effort) and out-of-range
//!   arguments fail with `DDS_INVALID_ARGUMENT`; `dds_last_error_message` tells the detail;
//! - no panic crosses the boundary: a defect caught inside fails with `DDS_INTERNAL`;
//! - handles are opaque: `dds_t` (a connection), `dds_group_t` (a notification group),
//!   `dds_dir_iter_t` (a directory listing), `dds_buffer_t` (a registered buffer).
//!
//! Threads: a `dds_t` may be used from many threads at once (all calls except
//! `dds_disconnect`, which must be the last one); so may a `dds_group_t` (many threads may
//! issue and `dds_poll_wait` concurrently) until `dds_delete_group`. A `dds_dir_iter_t`
//! belongs to one thread at a time.
//!
//! The functions are the C face of [`dds_host`]; they are usable from Rust too, which is how
//! this crate's tests drive them.

#![allow(non_camel_case_types)]

mod buffer;
mod conn;
mod dir;
mod group;
mod handle;
mod io;
mod status;
mod types;

pub use buffer::*;
pub use conn::*;
pub use dir::*;
pub use group::*;
pub use handle::{dds_group_t, dds_t};
pub use io::*;
pub use status::*;
pub use types::*;
