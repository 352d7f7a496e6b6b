use serde::{Deserialize, Serialize};

/// Status codes carried in response records and control replies (`docs/records.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    UnknownFile = 1,
    UnknownDir = 2,
    NotFound = 3,
    Exists = 4,
    NotEmpty = 5,
    OutOfRange = 6,
    NoSpace = 7,
    TooLarge = 8,
    TooManyOutstanding = 9,
    NameTooLong = 10,
    TooManyFiles = 11,
    TooManyDirs = 12,
    InvalidPath = 13,
    Io = 14,
    Corrupt = 15,
    BadRequest = 16,
    DpuDead = 17,
    RingFull = 18,
    Timeout = 19,
    Busy = 20,
    InvalidArgument = 21,
    Protocol = 22,
    UnknownBuffer = 23,
    BufferRange = 24,
    BufferLimit = 25,
}

impl Status {
    /// Response status of a slot whose I/O has not completed yet. Never delivered to the host.
    pub const PENDING: u16 = 0xFFFF;

    pub const ALL: [Status; 26] = [
        Status::Ok,
        Status::UnknownFile,
        Status::UnknownDir,
        Status::NotFound,
        Status::Exists,
        Status::NotEmpty,
        Status::OutOfRange,
        Status::NoSpace,
        Status::TooLarge,
        Status::TooManyOutstanding,
        Status::NameTooLong,
        Status::TooManyFiles,
        Status::TooManyDirs,
        Status::InvalidPath,
        Status::Io,
        Status::Corrupt,
        Status::BadRequest,
        Status::DpuDead,
        Status::RingFull,
        Status::Timeout,
        Status::Busy,
        Status::InvalidArgument,
        Status::Protocol,
        Status::UnknownBuffer,
        Status::BufferRange,
        Status::BufferLimit,
    ];

    pub fn code(self) -> u16 {
        self as u16
    }

    /// Decodes a wire code; unknown codes (a newer DPU, or garbage) map to `BadRequest`.
    pub fn from_code(code: u16) -> Status {
        Status::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(Status::BadRequest)
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UnknownFile => "unknown file id",
            Status::UnknownDir => "unknown directory",
            Status::NotFound => "not found",
            Status::Exists => "already exists",
            Status::NotEmpty => "directory not empty",
            Status::OutOfRange => "offset out of range",
            Status::NoSpace => "no space left on device",
            Status::TooLarge => "request too large",
            Status::TooManyOutstanding => "too many outstanding requests",
            Status::NameTooLong => "name too long",
            Status::TooManyFiles => "too many files",
            Status::TooManyDirs => "too many directories",
            Status::InvalidPath => "invalid path",
            Status::Io => "I/O error",
            Status::Corrupt => "metadata corrupt",
            Status::BadRequest => "malformed request",
            Status::DpuDead => "DPU unreachable",
            Status::RingFull => "request ring full, retry",
            Status::Timeout => "timed out",
            Status::Busy => "file service busy, retry",
            Status::InvalidArgument => "invalid argument",
            Status::Protocol => "protocol version mismatch",
            Status::UnknownBuffer => "unknown registered buffer",
            Status::BufferRange => "range outside the registered buffer",
            Status::BufferLimit => "registered buffer limit reached",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(s.code() as usize, i);
            assert_eq!(Status::from_code(s.code()), *s);
        }
        assert_eq!(Status::from_code(999), Status::BadRequest);
        assert_eq!(Status::from_code(Status::PENDING), Status::BadRequest);
    }
}
