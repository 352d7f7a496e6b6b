//! Reads, writes and flushes (data plane). The `dds_read*`, `dds_write*` and `dds_flush`
//! calls are non-blocking: they return once the request is in the request ring, and the
//! operation completes through the notification group of the file (`dds_poll_wait`), tagged
//! with the `io_ctx` given here. The `*_sync` calls wait for their own result.

use std::ffi::c_void;
use std::ptr::NonNull;

use dds_host::IoVec;

use crate::handle::{conn, dds_t, out_ptr};
use crate::status::{dds_status, guard, Error, Result};
use crate::types::{dds_const_iovec, dds_file_id, dds_iovec, DDS_IOV_MAX};

/// A buffer argument as a byte slice (a NULL pointer is allowed for length 0).
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay valid for `'a`.
unsafe fn bytes<'a>(p: *const c_void, len: u32, what: &'static str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    Ok(std::slice::from_raw_parts(p.cast::<u8>(), len as usize))
}

/// A destination buffer pointer (a NULL pointer is allowed for length 0).
fn dest(p: *mut c_void, len: u32, what: &'static str) -> Result<*mut u8> {
    if p.is_null() {
        if len == 0 {
            return Ok(NonNull::<u8>::dangling().as_ptr());
        }
        return Err(Error::invalid(format!("{what} is NULL")));
    }
    Ok(p.cast())
}

/// ReadFile: issues a read of `len` bytes of file `file` at `offset` into `buf`. Returns at
/// once; the completion (bytes read: short at end of file) is delivered by `dds_poll_wait`
/// on the file's group. `DDS_TOO_MANY_OUTSTANDING` / `DDS_RING_FULL`: poll completions and
/// retry.
///
/// # Safety
/// `dds` is NULL or a live handle; `buf` is NULL or `len` writable bytes that stay valid
/// and are not otherwise accessed until the completion has been returned by `dds_poll_wait`
/// (or the connection is closed).
#[no_mangle]
pub unsafe extern "C" fn dds_read(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *mut c_void,
    len: u32,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let buf = dest(buf, len, "buf")?;
        Ok(h.dds.read(file, offset, buf, len, io_ctx)?)
    })
}

/// ReadFileScatter: issues a read of the contiguous file range starting at `offset` into the
/// `iovcnt` buffers of `iov` (1 ..= `DDS_IOV_MAX`), filled in order. Completes like
/// `dds_read`. The `iov` array itself may be reused once this returns.
///
/// # Safety
/// `dds` is NULL or a live handle; `iov` is NULL or `iovcnt` readable entries, each buffer
/// valid as for `dds_read`.
#[no_mangle]
pub unsafe extern "C" fn dds_read_scatter(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    iov: *const dds_iovec,
    iovcnt: usize,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        if iov.is_null() {
            return Err(Error::invalid("iov is NULL"));
        }
        if !iov.is_aligned() {
            return Err(Error::invalid("iov is misaligned"));
        }
        if iovcnt == 0 || iovcnt > DDS_IOV_MAX {
            return Err(Error::invalid(format!(
                "iovcnt {iovcnt} is not in 1..={DDS_IOV_MAX}"
            )));
        }
        let src = std::slice::from_raw_parts(iov, iovcnt);
        let mut bufs = [IoVec {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; DDS_IOV_MAX];
        for (b, v) in bufs.iter_mut().zip(src) {
            *b = IoVec {
                ptr: dest(v.base, v.len, "iov[].base")?,
                len: v.len,
            };
        }
        Ok(h.dds.read_scatter(file, offset, &bufs[..iovcnt], io_ctx)?)
    })
}

/// WriteFile: issues a write of `len` bytes from `data` to file `file` at `offset`. The data
/// is copied into the request ring before this returns, so `data` may be reused at once.
/// Completes (bytes written) through `dds_poll_wait` like `dds_read`.
///
/// # Safety
/// `dds` is NULL or a live handle; `data` is NULL or `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn dds_write(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    data: *const c_void,
    len: u32,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let data = bytes(data, len, "data")?;
        Ok(h.dds.write(file, offset, data, io_ctx)?)
    })
}

/// WriteFileGather: issues one write of the `iovcnt` buffers of `iov` (at least one), in
/// order, to the contiguous file range starting at `offset`. The data is copied before this
/// returns. Completes like `dds_write`.
///
/// # Safety
/// `dds` is NULL or a live handle; `iov` is NULL or `iovcnt` readable entries, each naming
/// readable bytes.
#[no_mangle]
pub unsafe extern "C" fn dds_write_gather(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    iov: *const dds_const_iovec,
    iovcnt: usize,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        if iov.is_null() {
            return Err(Error::invalid("iov is NULL"));
        }
        if !iov.is_aligned() {
            return Err(Error::invalid("iov is misaligned"));
        }
        if iovcnt == 0 {
            return Err(Error::invalid("iovcnt is 0"));
        }
        let src = std::slice::from_raw_parts(iov, iovcnt);
        if iovcnt <= DDS_IOV_MAX {
            // The common case needs no allocation.
            let mut bufs: [&[u8]; DDS_IOV_MAX] = [&[]; DDS_IOV_MAX];
            for (b, v) in bufs.iter_mut().zip(src) {
                *b = bytes(v.base, v.len, "iov[].base")?;
            }
            Ok(h.dds.write_gather(file, offset, &bufs[..iovcnt], io_ctx)?)
        } else {
            let bufs = src
                .iter()
                .map(|v| bytes(v.base, v.len, "iov[].base"))
                .collect::<Result<Vec<_>>>()?;
            Ok(h.dds.write_gather(file, offset, &bufs, io_ctx)?)
        }
    })
}

/// FlushFileBuffers: issues a flush that completes (through `dds_poll_wait`, 0 bytes) once
/// every write of the file's group acknowledged before it is durable on the device.
///
/// # Safety
/// `dds` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn dds_flush(dds: *mut dds_t, file: dds_file_id, io_ctx: u64) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.flush(file, io_ctx)?)
    })
}

/// Blocking read: reads up to `len` bytes of file `file` at `offset` into `buf` and waits;
/// stores the bytes read (short at end of file) in `*bytes_read` unless it is NULL. The
/// completion is not delivered to `dds_poll_wait`.
///
/// # Safety
/// `dds` is NULL or a live handle; `buf` is NULL or `len` writable bytes; `bytes_read` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_read_sync(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *mut c_void,
    len: u32,
    bytes_read: *mut u32,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let buf = dest(buf, len, "buf")?;
        let bytes_read = match bytes_read.is_null() {
            true => None,
            false => Some(out_ptr(bytes_read, "bytes_read")?),
        };
        let buf = std::slice::from_raw_parts_mut(buf, len as usize);
        let n = h.dds.read_sync(file, offset, buf)?;
        if let Some(p) = bytes_read {
            p.write(n as u32);
        }
        Ok(())
    })
}

/// Blocking write: writes `len` bytes from `data` to file `file` at `offset` and waits;
/// stores the bytes written in `*bytes_written` unless it is NULL.
///
/// # Safety
/// `dds` is NULL or a live handle; `data` is NULL or `len` readable bytes; `bytes_written`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_write_sync(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    data: *const c_void,
    len: u32,
    bytes_written: *mut u32,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let data = bytes(data, len, "data")?;
        let bytes_written = match bytes_written.is_null() {
            true => None,
            false => Some(out_ptr(bytes_written, "bytes_written")?),
        };
        let n = h.dds.write_sync(file, offset, data)?;
        if let Some(p) = bytes_written {
            p.write(n as u32);
        }
        Ok(())
    })
}

/// Blocking flush: flushes the group of file `file` and waits until the writes acknowledged
/// before are durable.
///
/// # Safety
/// `dds` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn dds_flush_sync(dds: *mut dds_t, file: dds_file_id) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        Ok(h.dds.flush_sync(file)?)
    })
}
