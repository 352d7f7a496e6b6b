//! Plain C structs passed through the API.

use std::ffi::{c_char, c_void};

use crate::status::dds_status;

/// A file id, as returned by `dds_create_file` and `dds_lookup`.
pub type dds_file_id = u32;

/// Most buffers one `dds_read_scatter` may name.
pub const DDS_IOV_MAX: usize = 16;

/// `timeout_us` of `dds_poll_wait`: sleep until a completion arrives (or the DPU is gone).
pub const DDS_WAIT_FOREVER: u64 = 0xFFFF_FFFF_FFFF_FFFF;

/// `dds_dir_entry.kind` of a file.
pub const DDS_ENTRY_FILE: u32 = 0;
/// `dds_dir_entry.kind` of a directory.
pub const DDS_ENTRY_DIR: u32 = 1;

/// One destination buffer of `dds_read_scatter`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dds_iovec {
    pub base: *mut c_void,
    pub len: u32,
}

/// One source buffer of `dds_write_gather`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dds_const_iovec {
    pub base: *const c_void,
    pub len: u32,
}

/// Settings of a notification group (`dds_group_config_default` fills in the defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_group_config {
    /// Request ring data bytes: a power of two from 64 KiB to 1 GiB.
    pub request_ring_bytes: usize,
    /// Response ring data bytes: a power of two from 64 KiB to 1 GiB.
    pub response_ring_bytes: usize,
    /// Bound on request bytes in flight; 0 = the whole request ring.
    pub max_inflight_bytes: usize,
    /// Outstanding operations at most, 1..=65534; more fail with
    /// `DDS_TOO_MANY_OUTSTANDING`.
    pub max_outstanding: u32,
}

/// Connection settings (`dds_config_default` fills in the defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_config {
    /// Settings of the default notification group, created at connect.
    pub default_group: dds_group_config,
    /// How long a control call (create, stat, ...) waits for the DPU, in microseconds
    /// (not 0). A control call that times out leaves the connection unusable.
    pub rpc_timeout_us: u64,
}

/// What the DPU announced at connect.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_info {
    /// Control protocol version.
    pub protocol_version: u32,
    /// Alignment of I/O payloads in the rings (512 on O_DIRECT devices).
    pub payload_align: u32,
    /// Largest read or write in bytes; larger ones fail with `DDS_TOO_LARGE`.
    pub max_io_bytes: u32,
    /// Device block size in bytes.
    pub block_size: u32,
}

/// A file's id and size.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_file_info {
    pub id: dds_file_id,
    pub size: u64,
}

/// Capacity of the file service (`dds_free_space`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_space_info {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub segment_size: u64,
    pub files: u32,
    pub dirs: u32,
}

/// One directory entry returned by `dds_dir_next`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dds_dir_entry {
    /// NUL-terminated entry name (no path), owned by the iterator: valid until
    /// `dds_dir_close`.
    pub name: *const c_char,
    /// `DDS_ENTRY_FILE` or `DDS_ENTRY_DIR`.
    pub kind: u32,
    /// File id (files) or directory id (directories).
    pub id: u32,
    /// File size in bytes (0 for directories).
    pub size: u64,
}

/// A completed operation, as `dds_poll_wait` returns it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct dds_completion {
    /// The file context given to `dds_poll_add` (0 for files in the default group).
    pub file_ctx: u64,
    /// The io context given when the operation was issued.
    pub io_ctx: u64,
    /// `DDS_OK`, or why the operation failed.
    pub status: dds_status,
    /// Bytes read (short at end of file) or written; 0 for a flush.
    pub bytes: u32,
}
