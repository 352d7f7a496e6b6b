//! What the service reports about itself: the formatted limits, the data path's limits, the
//! space in use, and a consistency check of the allocation map.

use super::FileService;
use crate::error::FsError;
use crate::types::SpaceInfo;

impl FileService {
    /// I/O alignment unit (formatted block size) in bytes.
    pub fn block_size(&self) -> u32 {
        self.geom.block_size
    }

    /// Buffer address alignment that enables the zero-copy path.
    pub fn mem_align(&self) -> usize {
        self.align
    }

    /// Segment size in bytes.
    pub fn segment_size(&self) -> u64 {
        self.geom.segment_size
    }

    /// Largest possible file size.
    pub fn max_file_size(&self) -> u64 {
        self.geom.max_file_size()
    }

    /// Largest read/write length accepted.
    pub fn max_io_bytes(&self) -> u32 {
        self.dp.max_io
    }

    /// Maximum number of data operations in flight.
    pub fn max_inflight(&self) -> u32 {
        self.dp.max_inflight()
    }

    /// The formatted limits and current usage.
    pub fn free_space(&self) -> SpaceInfo {
        let g = &self.geom;
        let free = self.meta.segmap.free_count();
        SpaceInfo {
            total_bytes: g.max_file_size(),
            free_bytes: u64::from(free) * g.segment_size,
            segment_size: g.segment_size,
            block_size: g.block_size,
            total_segments: g.data_segments(),
            free_segments: free,
            files: self.meta.nfiles,
            dirs: self.meta.ndirs(),
            max_files: g.max_files,
            max_dirs: g.max_dirs,
            max_name_len: g.max_name_len,
            max_file_size: g.max_file_size(),
        }
    }

    /// Re-derives the allocation map from every file's segment vector and checks it against
    /// the live map (no segment owned twice, free count = total − used).
    pub fn check_consistency(&self) -> Result<(), FsError> {
        self.meta.verify().map_err(FsError::Corrupt)
    }
}
