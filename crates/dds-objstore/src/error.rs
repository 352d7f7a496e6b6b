//! Errors of the object store and of transaction decoding.

use std::io;
use std::path::PathBuf;

/// Why a [`Transaction`](crate::Transaction) could not be decoded. Offsets are byte positions in
/// the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ends inside a field.
    #[error("transaction encoding truncated at byte {at} (needed {needed} more bytes)")]
    Truncated { at: usize, needed: usize },
    /// The first four bytes are not `DDTX`.
    #[error("not a transaction encoding (bad magic)")]
    BadMagic,
    /// A version this decoder does not know.
    #[error("unsupported transaction encoding version {0}")]
    UnsupportedVersion(u16),
    /// Reserved header flags are set.
    #[error("reserved transaction flags {0:#06x} set")]
    BadFlags(u16),
    /// An unknown operation code.
    #[error("unknown transaction op code {code} at byte {at}")]
    UnknownOp { code: u8, at: usize },
    /// An object name longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN).
    #[error("object name of {len} bytes at byte {at} exceeds the limit")]
    NameTooLong { len: usize, at: usize },
    /// Bytes left after the last announced op.
    #[error("{0} trailing bytes after the last op")]
    TrailingBytes(usize),
}

/// Errors of [`ObjectStore`](crate::ObjectStore) calls.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object, xattr or device does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The device has too few free blocks for the transaction.
    #[error("no space: the transaction needs {needed} more blocks, {free} are free")]
    NoSpace { needed: u64, free: u64 },
    /// A request outside the limits or otherwise malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Stored data or metadata fails verification (a checksum mismatch names the object and the
    /// logical offset of the block).
    #[error("corrupt: object {pool}/{name} at offset {offset}: {detail}")]
    Corrupt {
        pool: u64,
        name: String,
        offset: u64,
        detail: String,
    },
    /// `format` found a formatted device and was not told to overwrite it.
    #[error("{0} holds a formatted object store (format with force to overwrite it)")]
    AlreadyFormatted(PathBuf),
    /// An I/O error of the device or the metadata store.
    #[error("I/O error: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> StoreError {
        StoreError::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> StoreError {
        StoreError::InvalidArgument(msg.into())
    }

    /// A copy for handing one failure to every caller of a batch (`io::Error` is not `Clone`).
    pub(crate) fn duplicate(&self) -> StoreError {
        match self {
            StoreError::NotFound(s) => StoreError::NotFound(s.clone()),
            StoreError::NoSpace { needed, free } => StoreError::NoSpace {
                needed: *needed,
                free: *free,
            },
            StoreError::InvalidArgument(s) => StoreError::InvalidArgument(s.clone()),
            StoreError::Corrupt {
                pool,
                name,
                offset,
                detail,
            } => StoreError::Corrupt {
                pool: *pool,
                name: name.clone(),
                offset: *offset,
                detail: detail.clone(),
            },
            StoreError::AlreadyFormatted(p) => StoreError::AlreadyFormatted(p.clone()),
            StoreError::Io { what, source } => StoreError::Io {
                what: what.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> StoreError {
                StoreError::io("metadata store", io::Error::other(redb::Error::from(e)))
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);
