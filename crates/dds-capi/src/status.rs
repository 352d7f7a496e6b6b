//! Status codes, the error type of the entry points, the per-thread last error message, and
//! the guard that keeps panics from crossing the FFI boundary.

use std::any::Any;
use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};

use dds_host::{DdsError, Status};

/// Result code of every `dds_*` function: `DDS_OK` (0) or one of the `DDS_*` error codes.
/// Codes 0..=22 are the status codes of the DDS protocol (docs/records.md); the library adds
/// `DDS_INTERNAL`.
pub type dds_status = i32;

/// Success.
pub const DDS_OK: dds_status = 0;
/// No such file id (or a stale id of a deleted file).
pub const DDS_UNKNOWN_FILE: dds_status = 1;
/// No such directory.
pub const DDS_UNKNOWN_DIR: dds_status = 2;
/// No such path.
pub const DDS_NOT_FOUND: dds_status = 3;
/// The path exists already.
pub const DDS_EXISTS: dds_status = 4;
/// Directory not empty.
pub const DDS_NOT_EMPTY: dds_status = 5;
/// Read starts beyond end of file, or write beyond the maximum file size.
pub const DDS_OUT_OF_RANGE: dds_status = 6;
/// Device full.
pub const DDS_NO_SPACE: dds_status = 7;
/// Request larger than the maximum I/O size or the ring.
pub const DDS_TOO_LARGE: dds_status = 8;
/// All request slots of the notification group are in use: poll completions and retry.
pub const DDS_TOO_MANY_OUTSTANDING: dds_status = 9;
/// A path component exceeds the configured limit.
pub const DDS_NAME_TOO_LONG: dds_status = 10;
/// File table full.
pub const DDS_TOO_MANY_FILES: dds_status = 11;
/// Directory table full.
pub const DDS_TOO_MANY_DIRS: dds_status = 12;
/// Malformed path (also: a path that is not valid UTF-8).
pub const DDS_INVALID_PATH: dds_status = 13;
/// Device I/O error.
pub const DDS_IO: dds_status = 14;
/// Metadata checksum failure.
pub const DDS_CORRUPT: dds_status = 15;
/// Malformed record or control message.
pub const DDS_BAD_REQUEST: dds_status = 16;
/// The DPU process is gone.
pub const DDS_DPU_DEAD: dds_status = 17;
/// The request ring has no room now: poll completions and retry.
pub const DDS_RING_FULL: dds_status = 18;
/// A blocking call timed out; also returned by `dds_poll_wait` when no completion arrived
/// within its timeout (always so in non-blocking mode when nothing is ready).
pub const DDS_TIMEOUT: dds_status = 19;
/// The file service's queue is full: retry.
pub const DDS_BUSY: dds_status = 20;
/// Bad argument to a library call: a NULL or misaligned pointer, a handle that is not live,
/// a length out of range.
pub const DDS_INVALID_ARGUMENT: dds_status = 21;
/// Protocol version mismatch, or a reply the library does not understand.
pub const DDS_PROTOCOL: dds_status = 22;
/// No registered buffer with this id on this connection (it was unregistered, or the handle
/// belongs to another connection).
pub const DDS_UNKNOWN_BUFFER: dds_status = 23;
/// The offset and length reach outside the registered buffer.
pub const DDS_BUFFER_RANGE: dds_status = 24;
/// Registering would exceed the DPU's cap on registered buffers or bytes per connection.
pub const DDS_BUFFER_LIMIT: dds_status = 25;
/// A defect inside the library was caught at the API boundary (the call did not complete;
/// its effects are unknown). `dds_last_error_message` has the details.
pub const DDS_INTERNAL: dds_status = 255;

/// C names of the protocol codes, indexed by code.
const NAMES: [&std::ffi::CStr; 26] = [
    c"DDS_OK",
    c"DDS_UNKNOWN_FILE",
    c"DDS_UNKNOWN_DIR",
    c"DDS_NOT_FOUND",
    c"DDS_EXISTS",
    c"DDS_NOT_EMPTY",
    c"DDS_OUT_OF_RANGE",
    c"DDS_NO_SPACE",
    c"DDS_TOO_LARGE",
    c"DDS_TOO_MANY_OUTSTANDING",
    c"DDS_NAME_TOO_LONG",
    c"DDS_TOO_MANY_FILES",
    c"DDS_TOO_MANY_DIRS",
    c"DDS_INVALID_PATH",
    c"DDS_IO",
    c"DDS_CORRUPT",
    c"DDS_BAD_REQUEST",
    c"DDS_DPU_DEAD",
    c"DDS_RING_FULL",
    c"DDS_TIMEOUT",
    c"DDS_BUSY",
    c"DDS_INVALID_ARGUMENT",
    c"DDS_PROTOCOL",
    c"DDS_UNKNOWN_BUFFER",
    c"DDS_BUFFER_RANGE",
    c"DDS_BUFFER_LIMIT",
];

/// Descriptions of the protocol codes, indexed by code.
const MESSAGES: [&std::ffi::CStr; 26] = [
    c"ok",
    c"unknown file id",
    c"unknown directory",
    c"not found",
    c"already exists",
    c"directory not empty",
    c"offset out of range",
    c"no space left on device",
    c"request too large",
    c"too many outstanding requests",
    c"name too long",
    c"too many files",
    c"too many directories",
    c"invalid path",
    c"I/O error",
    c"metadata corrupt",
    c"malformed request",
    c"DPU unreachable",
    c"request ring full, retry",
    c"timed out",
    c"file service busy, retry",
    c"invalid argument",
    c"protocol version mismatch",
    c"unknown registered buffer",
    c"range outside the registered buffer",
    c"registered buffer limit reached",
];

pub(crate) fn status_code(s: Status) -> dds_status {
    dds_status::from(s.code())
}

/// The symbolic name of a status code (`"DDS_UNKNOWN_FILE"` for 1), or `"DDS_UNKNOWN_STATUS"`
/// for a code the library does not know. The string is static; never free it.
#[no_mangle]
pub extern "C" fn dds_status_name(code: dds_status) -> *const c_char {
    static_str(
        || match usize::try_from(code).ok().and_then(|i| NAMES.get(i)) {
            Some(n) => n,
            None if code == DDS_INTERNAL => c"DDS_INTERNAL",
            None => c"DDS_UNKNOWN_STATUS",
        },
    )
}

/// A short English description of a status code (`"unknown file id"` for 1). The string is
/// static; never free it.
#[no_mangle]
pub extern "C" fn dds_status_message(code: dds_status) -> *const c_char {
    static_str(
        || match usize::try_from(code).ok().and_then(|i| MESSAGES.get(i)) {
            Some(m) => m,
            None if code == DDS_INTERNAL => c"internal library error",
            None => c"unknown status code",
        },
    )
}

/// The message of the most recent failed `dds_*` call on the calling thread (more detail than
/// `dds_status_message`, e.g. which argument was bad), or `""` when no call failed yet. The
/// pointer stays valid until the next `dds_*` call on the same thread; never free it.
#[no_mangle]
pub extern "C" fn dds_last_error_message() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|b| match b.try_borrow() {
                Ok(b) if !b.is_empty() => b.as_ptr().cast(),
                _ => c"".as_ptr(),
            })
            .unwrap_or(c"".as_ptr())
    })
    .unwrap_or(c"".as_ptr())
}

/// The string entry points: a static string, `""` should anything panic.
fn static_str(f: impl FnOnce() -> &'static std::ffi::CStr) -> *const c_char {
    catch_unwind(AssertUnwindSafe(f)).map_or(c"".as_ptr(), |s| s.as_ptr())
}

thread_local! {
    /// NUL-terminated message of the thread's last failure (reused, so a failing poll loop
    /// does not allocate).
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn set_last_error(code: dds_status, message: &str) {
    let _ = LAST_ERROR.try_with(|b| {
        if let Ok(mut b) = b.try_borrow_mut() {
            b.clear();
            let name = dds_status_name(code);
            // SAFETY: `dds_status_name` returns a static NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            b.extend_from_slice(name.to_bytes());
            if !message.is_empty() {
                b.extend_from_slice(b": ");
                b.extend(message.bytes().filter(|&c| c != 0));
            }
            b.push(0);
        }
    });
}

/// A failed entry point: the code returned to C and a message for `dds_last_error_message`.
#[derive(Debug)]
pub(crate) struct Error {
    pub code: dds_status,
    pub message: Cow<'static, str>,
}

impl Error {
    pub(crate) fn new(code: dds_status, message: impl Into<Cow<'static, str>>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<Cow<'static, str>>) -> Error {
        Error::new(DDS_INVALID_ARGUMENT, message)
    }
}

impl From<DdsError> for Error {
    fn from(e: DdsError) -> Error {
        Error::new(status_code(e.status), e.message)
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

fn panic_message(p: &(dyn Any + Send)) -> &str {
    if let Some(s) = p.downcast_ref::<&str>() {
        s
    } else if let Some(s) = p.downcast_ref::<String>() {
        s
    } else {
        "panic"
    }
}

/// Runs the body of an entry point: converts its result to a status code, records the
/// message of a failure, and turns a panic into `DDS_INTERNAL` instead of unwinding into C.
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> dds_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => DDS_OK,
        Ok(Err(e)) => {
            set_last_error(e.code, &e.message);
            e.code
        }
        Err(p) => {
            // Formatting the message could itself panic only on allocation failure, which
            // aborts; dropping the payload could panic, so it is leaked instead.
            let msg = format!("internal error: {}", panic_message(&*p));
            std::mem::forget(p);
            set_last_error(DDS_INTERNAL, &msg);
            DDS_INTERNAL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: the functions under test return static NUL-terminated strings.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn codes_match_the_protocol() {
        let c = [
            DDS_OK,
            DDS_UNKNOWN_FILE,
            DDS_UNKNOWN_DIR,
            DDS_NOT_FOUND,
            DDS_EXISTS,
            DDS_NOT_EMPTY,
            DDS_OUT_OF_RANGE,
            DDS_NO_SPACE,
            DDS_TOO_LARGE,
            DDS_TOO_MANY_OUTSTANDING,
            DDS_NAME_TOO_LONG,
            DDS_TOO_MANY_FILES,
            DDS_TOO_MANY_DIRS,
            DDS_INVALID_PATH,
            DDS_IO,
            DDS_CORRUPT,
            DDS_BAD_REQUEST,
            DDS_DPU_DEAD,
            DDS_RING_FULL,
            DDS_TIMEOUT,
            DDS_BUSY,
            DDS_INVALID_ARGUMENT,
            DDS_PROTOCOL,
            DDS_UNKNOWN_BUFFER,
            DDS_BUFFER_RANGE,
            DDS_BUFFER_LIMIT,
        ];
        assert_eq!(c.len(), Status::ALL.len());
        for (i, st) in Status::ALL.iter().enumerate() {
            assert_eq!(c[i], status_code(*st), "{st:?}");
            assert_eq!(c[i], i as dds_status);
            assert_eq!(s(dds_status_message(c[i])), st.name(), "{st:?}");
        }
        assert!(!Status::ALL
            .iter()
            .any(|st| status_code(*st) == DDS_INTERNAL));
    }

    #[test]
    fn names() {
        assert_eq!(s(dds_status_name(DDS_OK)), "DDS_OK");
        assert_eq!(s(dds_status_name(DDS_UNKNOWN_FILE)), "DDS_UNKNOWN_FILE");
        assert_eq!(s(dds_status_name(DDS_PROTOCOL)), "DDS_PROTOCOL");
        assert_eq!(s(dds_status_name(DDS_INTERNAL)), "DDS_INTERNAL");
        assert_eq!(s(dds_status_name(-1)), "DDS_UNKNOWN_STATUS");
        assert_eq!(s(dds_status_name(DDS_BUFFER_LIMIT)), "DDS_BUFFER_LIMIT");
        assert_eq!(s(dds_status_name(26)), "DDS_UNKNOWN_STATUS");
        assert_eq!(s(dds_status_name(i32::MIN)), "DDS_UNKNOWN_STATUS");
        assert_eq!(s(dds_status_message(1000)), "unknown status code");
    }

    #[test]
    fn guard_catches_panics_and_records_messages() {
        assert_eq!(guard(|| Ok(())), DDS_OK);
        assert_eq!(
            guard(|| Err(Error::new(DDS_EXISTS, "the path /x exists"))),
            DDS_EXISTS
        );
        assert_eq!(
            s(dds_last_error_message()),
            "DDS_EXISTS: the path /x exists"
        );
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let rc = guard(|| panic!("boom {}", 7));
        std::panic::set_hook(hook);
        assert_eq!(rc, DDS_INTERNAL);
        assert_eq!(
            s(dds_last_error_message()),
            "DDS_INTERNAL: internal error: boom 7"
        );
        // An OK call leaves the last message alone.
        assert_eq!(guard(|| Ok(())), DDS_OK);
        assert!(s(dds_last_error_message()).starts_with("DDS_INTERNAL"));
    }
}
