//! Error type of the file service.

use std::io;

/// Errors returned by the file service.
///
/// The DPU daemon answers each variant with a wire status (`dds_proto::Status`, one status
/// table for the whole project: `From<&FsError> for Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// The file id does not name a live file (never existed, deleted, or stale generation).
    #[error("unknown file id")]
    UnknownFile,
    /// A directory named in the path does not exist.
    #[error("unknown directory")]
    UnknownDir,
    /// The path names no file.
    #[error("file not found")]
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

/// The one mapping of file service errors to the status codes of every DDS interface
/// (`docs/records.md`): ring responses, control replies, responses built on the DPU.
impl From<&FsError> for dds_proto::Status {
    fn from(e: &FsError) -> Self {
        use dds_proto::Status;
        match e {
            FsError::UnknownFile => Status::UnknownFile,
            FsError::UnknownDir => Status::UnknownDir,
            FsError::NotFound => Status::NotFound,
            FsError::Exists => Status::Exists,
            FsError::NotEmpty => Status::NotEmpty,
            FsError::OutOfRange => Status::OutOfRange,
            FsError::NoSpace => Status::NoSpace,
            FsError::TooLarge => Status::TooLarge,
            FsError::Busy => Status::Busy,
            FsError::NameTooLong => Status::NameTooLong,
            FsError::TooManyFiles => Status::TooManyFiles,
            FsError::TooManyDirs => Status::TooManyDirs,
            FsError::InvalidPath => Status::InvalidPath,
            FsError::Io(_) => Status::Io,
            FsError::Corrupt(_) => Status::Corrupt,
            FsError::InvalidConfig(_) | FsError::InvalidArgument(_) => Status::InvalidArgument,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dds_proto::Status;

    #[test]
    fn every_error_has_a_failure_status() {
        let all = [
            (FsError::UnknownFile, Status::UnknownFile),
            (FsError::UnknownDir, Status::UnknownDir),
            (FsError::NotFound, Status::NotFound),
            (FsError::Exists, Status::Exists),
            (FsError::NotEmpty, Status::NotEmpty),
            (FsError::OutOfRange, Status::OutOfRange),
            (FsError::NoSpace, Status::NoSpace),
            (FsError::TooLarge, Status::TooLarge),
            (FsError::Busy, Status::Busy),
            (FsError::NameTooLong, Status::NameTooLong),
            (FsError::TooManyFiles, Status::TooManyFiles),
            (FsError::TooManyDirs, Status::TooManyDirs),
            (FsError::InvalidPath, Status::InvalidPath),
            (FsError::Io(String::new()), Status::Io),
            (FsError::Corrupt(String::new()), Status::Corrupt),
            (
                FsError::InvalidConfig(String::new()),
                Status::InvalidArgument,
            ),
            (FsError::InvalidArgument(""), Status::InvalidArgument),
        ];
        for (e, want) in &all {
            assert_eq!(Status::from(e), *want, "{e:?}");
            assert_ne!(Status::from(e), Status::Ok, "{e:?}");
        }
    }
}
