//! Public value types of the file service.

use serde::{Deserialize, Serialize};

/// Identifier of a file: 16-bit slot plus a 16-bit generation, so ids of deleted files are
/// not reused for the next 65534 file creations (a stale id gets `UnknownFile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FileId(pub u32);

impl FileId {
    /// The raw 32-bit value.
    pub fn raw(self) -> u32 {
        self.0
    }
}

impl From<u32> for FileId {
    fn from(v: u32) -> FileId {
        FileId(v)
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Description of a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Its id.
    pub id: FileId,
    /// Full path: `/name` (root) or `/dir/name`.
    pub path: String,
    /// Directory path: `/` or `/dir`.
    pub dir: String,
    /// File name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Bytes of allocated segments (segments × segment size).
    pub allocated_bytes: u64,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A file.
    File,
    /// A directory (only listed in the root).
    Dir,
}

/// One entry of [`list_dir`](crate::FileService::list_dir).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Entry name.
    pub name: String,
    /// File or directory.
    pub kind: EntryKind,
    /// File id (files only).
    pub id: Option<FileId>,
    /// File size (0 for directories).
    pub size: u64,
}

/// Space and limits of a formatted device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceInfo {
    /// Bytes of all data segments.
    pub total_bytes: u64,
    /// Bytes of free data segments.
    pub free_bytes: u64,
    /// Segment size in bytes.
    pub segment_size: u64,
    /// Block size (I/O alignment unit) in bytes.
    pub block_size: u32,
    /// Number of data segments.
    pub total_segments: u32,
    /// Number of free data segments.
    pub free_segments: u32,
    /// Number of files.
    pub files: u32,
    /// Number of named directories (root not counted).
    pub dirs: u32,
    /// Formatted file limit.
    pub max_files: u32,
    /// Formatted directory limit.
    pub max_dirs: u32,
    /// Formatted name length limit.
    pub max_name_len: u32,
    /// Largest possible file.
    pub max_file_size: u64,
}

/// Options of [`FileService::open`](crate::FileService::open). All data-path resources are
/// allocated at open from these bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenConfig {
    /// Op-slot table size: data operations accepted but not yet reported by `poll`
    /// (1 ..= 65536, default 256). `Busy` beyond it.
    pub max_inflight: u32,
    /// Largest read/write length (default 1 MiB, at most 256 MiB). `TooLarge` beyond it.
    pub max_io_bytes: u32,
    /// Total size of the aligned bounce-buffer pool used by unaligned I/O (default 8 MiB);
    /// raised to at least one maximum-size I/O plus two blocks. `Busy` when exhausted.
    pub bounce_bytes: usize,
}

impl Default for OpenConfig {
    fn default() -> Self {
        OpenConfig {
            max_inflight: 256,
            max_io_bytes: 1 << 20,
            bounce_bytes: 8 << 20,
        }
    }
}
