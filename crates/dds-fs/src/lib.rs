//! dds-fs: the DPU file service of DDS (paper §4.3).
pub mod align;
pub mod device;
mod error;

pub use error::FsError;
