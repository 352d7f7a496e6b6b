//! Format-time configuration, device geometry and the superblock (docs/on-disk-format.md §1–2).

use crate::align::align_up;
use crate::codec::{le32, le64, Reader, Writer};
use crate::error::FsError;

/// The first bytes of a dds-fs device (its superblock).
pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"DDSFSSB1";
pub(crate) const SB_MAGIC: &[u8; 8] = SUPERBLOCK_MAGIC;
pub(crate) const CKPT_MAGIC: &[u8; 8] = b"DDSFSCK1";
pub(crate) const LOG_MAGIC: &[u8; 4] = b"DDSL";
pub(crate) const FORMAT_VERSION: u32 = 1;
pub(crate) const SB_LEN: usize = 512;
pub(crate) const CKPT_HEADER_LEN: usize = 64;
pub(crate) const LOG_HEADER_LEN: usize = 32;
pub(crate) const DIR_REC_FIXED: u64 = 8;
pub(crate) const FILE_REC_FIXED: u64 = 32;
/// Largest fixed part of a log record payload (`SET_SIZE`).
pub(crate) const SET_SIZE_FIXED: u64 = 28;

/// Default segment size: 16 MiB.
pub const DEFAULT_SEGMENT_SIZE: u64 = 16 << 20;
/// Default maximum number of files.
pub const DEFAULT_MAX_FILES: u32 = 4096;
/// Default maximum number of named directories (root not counted).
pub const DEFAULT_MAX_DIRS: u32 = 256;
/// Default maximum name length in bytes.
pub const DEFAULT_MAX_NAME_LEN: u32 = 255;
/// Default minimum metadata log size.
pub const DEFAULT_LOG_BYTES: u64 = 1 << 20;

/// Upper bound of `max_files` (file slots are 16-bit).
pub const MAX_FILES_LIMIT: u32 = 65535;
/// Upper bound of `max_dirs`.
pub const MAX_DIRS_LIMIT: u32 = 65535;
/// Upper bound of `max_name_len`.
pub const MAX_NAME_LEN_LIMIT: u32 = 1024;

/// Options of [`format`](crate::format). Limits are stored in the superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatConfig {
    /// Segment size in bytes; a multiple of the device block size (default 16 MiB).
    pub segment_size: u64,
    /// Maximum number of files (1 ..= 65535, default 4096).
    pub max_files: u32,
    /// Maximum number of named directories, root excluded (0 ..= 65535, default 256).
    pub max_dirs: u32,
    /// Maximum length of a file or directory name in bytes (1 ..= 1024, default 255).
    pub max_name_len: u32,
    /// Minimum size of the metadata log (default 1 MiB); the log also gets whatever is left of
    /// the reserved metadata segments.
    pub log_bytes: u64,
    /// File-system identifier stamped into all metadata; random when `None`.
    pub fs_uuid: Option<u64>,
}

impl Default for FormatConfig {
    fn default() -> Self {
        FormatConfig {
            segment_size: DEFAULT_SEGMENT_SIZE,
            max_files: DEFAULT_MAX_FILES,
            max_dirs: DEFAULT_MAX_DIRS,
            max_name_len: DEFAULT_MAX_NAME_LEN,
            log_bytes: DEFAULT_LOG_BYTES,
            fs_uuid: None,
        }
    }
}

/// Everything the superblock records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub block_size: u32,
    pub segment_size: u64,
    pub total_segments: u32,
    pub meta_segments: u32,
    pub max_files: u32,
    pub max_dirs: u32,
    pub max_name_len: u32,
    pub fs_uuid: u64,
    pub ckpt_off: [u64; 2],
    pub ckpt_len: u64,
    pub log_off: u64,
    pub log_len: u64,
    pub format_time: u64,
}

fn bad(msg: String) -> FsError {
    FsError::InvalidConfig(msg)
}

impl Geometry {
    /// Computes the layout for a device of `capacity` bytes and block size `block`.
    pub(crate) fn compute(
        cfg: &FormatConfig,
        block: u32,
        capacity: u64,
        fs_uuid: u64,
        format_time: u64,
    ) -> Result<Geometry, FsError> {
        let b = u64::from(block);
        if !block.is_power_of_two() || block < 512 {
            return Err(bad(format!("device block size {block} unusable")));
        }
        if cfg.segment_size == 0 || !cfg.segment_size.is_multiple_of(b) {
            return Err(bad(format!(
                "segment size {} is not a positive multiple of the block size {block}",
                cfg.segment_size
            )));
        }
        if cfg.segment_size > u64::from(u32::MAX) + 1 {
            return Err(bad("segment size above 4 GiB".into()));
        }
        if cfg.max_files == 0 || cfg.max_files > MAX_FILES_LIMIT {
            return Err(bad(format!("max_files {} not in 1..=65535", cfg.max_files)));
        }
        if cfg.max_dirs > MAX_DIRS_LIMIT {
            return Err(bad(format!("max_dirs {} above 65535", cfg.max_dirs)));
        }
        if cfg.max_name_len == 0 || cfg.max_name_len > MAX_NAME_LEN_LIMIT {
            return Err(bad(format!(
                "max_name_len {} not in 1..=1024",
                cfg.max_name_len
            )));
        }
        let total = capacity / cfg.segment_size;
        if total > u64::from(u32::MAX) - 1 {
            return Err(bad("too many segments (use a larger segment size)".into()));
        }
        let name = u64::from(cfg.max_name_len);
        let ckpt_body = u64::from(cfg.max_dirs) * (DIR_REC_FIXED + name)
            + u64::from(cfg.max_files) * (FILE_REC_FIXED + name)
            + 4 * total;
        let ckpt_len = align_up(CKPT_HEADER_LEN as u64 + ckpt_body, b);
        let max_record = LOG_HEADER_LEN as u64 + (SET_SIZE_FIXED + 4 * total).max(16 + name);
        let log_min = align_up(cfg.log_bytes.max(16 * b).max(max_record), b);
        let meta_bytes = 2 * b + 2 * ckpt_len + log_min;
        let meta_segments = meta_bytes.div_ceil(cfg.segment_size);
        if meta_segments >= total {
            return Err(bad(format!(
                "device of {capacity} bytes too small: metadata needs {meta_segments} segments of \
                 {} bytes and at least one data segment is required",
                cfg.segment_size
            )));
        }
        let log_off = 2 * b + 2 * ckpt_len;
        Ok(Geometry {
            block_size: block,
            segment_size: cfg.segment_size,
            total_segments: total as u32,
            meta_segments: meta_segments as u32,
            max_files: cfg.max_files,
            max_dirs: cfg.max_dirs,
            max_name_len: cfg.max_name_len,
            fs_uuid,
            ckpt_off: [2 * b, 2 * b + ckpt_len],
            ckpt_len,
            log_off,
            log_len: meta_segments * cfg.segment_size - log_off,
            format_time,
        })
    }

    /// Number of data segments.
    pub(crate) fn data_segments(&self) -> u32 {
        self.total_segments - self.meta_segments
    }

    /// Largest file size: the whole data area.
    pub(crate) fn max_file_size(&self) -> u64 {
        u64::from(self.data_segments()) * self.segment_size
    }

    /// Largest encoded log record.
    pub(crate) fn max_record_len(&self) -> u64 {
        LOG_HEADER_LEN as u64
            + (SET_SIZE_FIXED + 4 * u64::from(self.total_segments))
                .max(16 + u64::from(self.max_name_len))
    }

    /// Encodes the superblock into `out` (at least 512 bytes; the rest is zeroed).
    pub(crate) fn encode_superblock(&self, out: &mut [u8]) {
        out.fill(0);
        let mut w = Writer::new(out);
        w.bytes(SB_MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(self.block_size);
        w.u64(self.segment_size);
        w.u32(self.total_segments);
        w.u32(self.meta_segments);
        w.u32(self.max_files);
        w.u32(self.max_dirs);
        w.u32(self.max_name_len);
        w.u32(0);
        w.u64(self.fs_uuid);
        w.u64(self.ckpt_off[0]);
        w.u64(self.ckpt_off[1]);
        w.u64(self.ckpt_len);
        w.u64(self.log_off);
        w.u64(self.log_len);
        w.u64(self.format_time);
        debug_assert_eq!(w.pos(), 104);
        let crc = crc32c::crc32c(&out[..SB_LEN - 4]);
        out[SB_LEN - 4..SB_LEN].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes and validates a superblock.
    pub(crate) fn decode_superblock(b: &[u8]) -> Result<Geometry, String> {
        if b.len() < SB_LEN {
            return Err("short superblock".into());
        }
        if &b[..8] != SB_MAGIC {
            return Err("bad superblock magic (not a dds-fs device)".into());
        }
        if crc32c::crc32c(&b[..SB_LEN - 4]) != le32(b, SB_LEN - 4) {
            return Err("superblock checksum mismatch".into());
        }
        let mut r = Reader::new(&b[8..SB_LEN - 4]);
        let rd = |r: &mut Reader<'_>| r.u32().ok_or_else(|| "short superblock".to_string());
        let version = rd(&mut r)?;
        if version != FORMAT_VERSION {
            return Err(format!("unsupported format version {version}"));
        }
        let block_size = rd(&mut r)?;
        let segment_size = le64(b, 16);
        let g = Geometry {
            block_size,
            segment_size,
            total_segments: le32(b, 24),
            meta_segments: le32(b, 28),
            max_files: le32(b, 32),
            max_dirs: le32(b, 36),
            max_name_len: le32(b, 40),
            fs_uuid: le64(b, 48),
            ckpt_off: [le64(b, 56), le64(b, 64)],
            ckpt_len: le64(b, 72),
            log_off: le64(b, 80),
            log_len: le64(b, 88),
            format_time: le64(b, 96),
        };
        if le32(b, 44) != 0 {
            return Err("unknown superblock flags".into());
        }
        g.validate()?;
        Ok(g)
    }

    /// Cross-checks a decoded geometry so later arithmetic cannot overflow or misbehave.
    fn validate(&self) -> Result<(), String> {
        let b = u64::from(self.block_size);
        let ok = self.block_size.is_power_of_two()
            && self.block_size >= 512
            && self.segment_size > 0
            && self.segment_size.is_multiple_of(b)
            && self.segment_size <= u64::from(u32::MAX) + 1
            && self.max_files >= 1
            && self.max_files <= MAX_FILES_LIMIT
            && self.max_dirs <= MAX_DIRS_LIMIT
            && self.max_name_len >= 1
            && self.max_name_len <= MAX_NAME_LEN_LIMIT
            && self.meta_segments >= 1
            && self.meta_segments < self.total_segments
            && self.ckpt_off[0] == 2 * b
            && self.ckpt_len.is_multiple_of(b)
            && self.ckpt_off[1] == 2 * b + self.ckpt_len
            && self.log_off == 2 * b + 2 * self.ckpt_len
            && self.log_len.is_multiple_of(b)
            && self.log_off + self.log_len == u64::from(self.meta_segments) * self.segment_size
            && self.log_len >= align_up(self.max_record_len(), b);
        if !ok {
            return Err("superblock geometry is inconsistent".into());
        }
        let name = u64::from(self.max_name_len);
        let body = u64::from(self.max_dirs) * (DIR_REC_FIXED + name)
            + u64::from(self.max_files) * (FILE_REC_FIXED + name)
            + 4 * u64::from(self.total_segments);
        if self.ckpt_len < CKPT_HEADER_LEN as u64 + body {
            return Err("checkpoint slot too small for the limits".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_fits_one_segment() {
        let g = Geometry::compute(&FormatConfig::default(), 512, 64 << 30, 1, 0).unwrap();
        assert_eq!(g.meta_segments, 1);
        assert!(g.log_len > 8 << 20);
        let mut sb = vec![0u8; 512];
        g.encode_superblock(&mut sb);
        assert_eq!(Geometry::decode_superblock(&sb).unwrap(), g);
        sb[100] ^= 1;
        assert!(Geometry::decode_superblock(&sb).is_err());
    }

    #[test]
    fn rejects_bad_configs() {
        let c = FormatConfig {
            segment_size: 1000,
            ..FormatConfig::default()
        };
        assert!(matches!(
            Geometry::compute(&c, 512, 1 << 30, 1, 0),
            Err(FsError::InvalidConfig(_))
        ));
        let c = FormatConfig {
            max_files: 0,
            ..FormatConfig::default()
        };
        assert!(Geometry::compute(&c, 512, 1 << 30, 1, 0).is_err());
        // too small a device
        assert!(Geometry::compute(&FormatConfig::default(), 512, 16 << 20, 1, 0).is_err());
    }
}
