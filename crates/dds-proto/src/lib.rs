//! Wire formats shared by the host library and the DPU: the request and response records of
//! the rings (`docs/records.md`), the status codes, and the control protocol
//! (`docs/control-protocol.md`).

pub mod cache_records;
pub mod control;
pub mod record;
mod status;
pub mod units;

pub use status::Status;
