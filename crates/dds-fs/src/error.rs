//! Error type of the file service.

use std::io;

/// Errors returned by the file service.
///
/// Every variant has a stable numeric [`code`](FsError::code) that the DPU daemon puts on the
/// wire; codes are never reused or renumbered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// The file id does not name a live file (never existed, deleted, or stale generation).
    #[error("unknown file id")]
    UnknownFile,
    /// A directory named in the path does not exist.
    #[error("unknown directory")]
    UnknownDir,
    /// The path names no file.
    #[error("no such file")]
    NotFound,
    /// The name is already taken in that directory.
    #[error("name already exists")]
    Exists,
    /// The directory still contains files.
    #[error("directory not empty")]
    NotEmpty,
    /// Offset or size beyond what the file (or the maximum file size) allows.
    #[error("offset out of range")]
    OutOfRange,
    /// Not enough free segments.
    #[error("no space left on device")]
    NoSpace,
    /// I/O length above the configured maximum I/O size.
    #[error("I/O too large")]
    TooLarge,
    /// All op slots (or bounce buffers) are in use; poll and retry.
    #[error("busy: too many operations in flight")]
    Busy,
    /// A path component is longer than the formatted maximum name length.
    #[error("name too long")]
    NameTooLong,
    /// The formatted maximum number of files is reached.
    #[error("too many files")]
    TooManyFiles,
    /// The formatted maximum number of directories is reached.
    #[error("too many directories")]
    TooManyDirs,
    /// The path is malformed (empty component, `.`/`..`, a control character, too many
    /// levels, ...).
    #[error("invalid path (empty name, `.` or `..`, a control character, or more than one directory level)")]
    InvalidPath,
    /// Device I/O failed.
    #[error("I/O error: {0}")]
    Io(String),
    /// On-disk metadata is inconsistent or not a dds-fs device.
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    /// A format or open configuration value is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A data-path argument is unusable (e.g. a null buffer).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl FsError {
    /// Stable numeric code of the variant (0 is reserved for success).
    pub fn code(&self) -> u16 {
        match self {
            FsError::UnknownFile => 1,
            FsError::UnknownDir => 2,
            FsError::NotFound => 3,
            FsError::Exists => 4,
            FsError::NotEmpty => 5,
            FsError::OutOfRange => 6,
            FsError::NoSpace => 7,
            FsError::TooLarge => 8,
            FsError::Busy => 9,
            FsError::NameTooLong => 10,
            FsError::TooManyFiles => 11,
            FsError::TooManyDirs => 12,
            FsError::InvalidPath => 13,
            FsError::Io(_) => 14,
            FsError::Corrupt(_) => 15,
            FsError::InvalidConfig(_) => 16,
            FsError::InvalidArgument(_) => 17,
        }
    }

    pub(crate) fn io(context: &str, e: io::Error) -> FsError {
        FsError::Io(format!("{context}: {e}"))
    }

    pub(crate) fn errno(context: &str, errno: i32) -> FsError {
        FsError::Io(format!(
            "{context}: {}",
            io::Error::from_raw_os_error(errno)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_and_nonzero() {
        let all = [
            FsError::UnknownFile,
            FsError::UnknownDir,
            FsError::NotFound,
            FsError::Exists,
            FsError::NotEmpty,
            FsError::OutOfRange,
            FsError::NoSpace,
            FsError::TooLarge,
            FsError::Busy,
            FsError::NameTooLong,
            FsError::TooManyFiles,
            FsError::TooManyDirs,
            FsError::InvalidPath,
            FsError::Io(String::new()),
            FsError::Corrupt(String::new()),
            FsError::InvalidConfig(String::new()),
            FsError::InvalidArgument(""),
        ];
        let mut codes: Vec<u16> = all.iter().map(FsError::code).collect();
        assert!(codes.iter().all(|&c| c != 0));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }
}
