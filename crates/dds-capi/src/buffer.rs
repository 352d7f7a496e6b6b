//! Registered buffers: application memory the DPU reaches by DMA. Reads on a registered
//! buffer land in it and writes are taken from it without a copy by the library; plain
//! `dds_read` / `dds_write` buffers keep the copy path.

use std::ffi::c_void;

use dds_host::RegisteredBuffer;

use crate::handle::{conn, dds_t, handle, out_ptr, Handle, DEAD_MAGIC};
use crate::status::{dds_status, guard, Error, Result};
use crate::types::dds_file_id;

const BUFFER_MAGIC: u64 = u64::from_le_bytes(*b"dds:bufr");

/// A registered buffer (opaque): shared memory of the connection that the DPU reads and
/// writes by DMA. Create with `dds_register_buffer`, get its address with `dds_buffer_data`,
/// free with `dds_unregister_buffer` or `dds_disconnect`.
pub struct dds_buffer_t {
    magic: u64,
    pub(crate) buf: RegisteredBuffer,
}

impl Handle for dds_buffer_t {
    const MAGIC: u64 = BUFFER_MAGIC;
    const NAME: &'static str = "dds_buffer_t";
    unsafe fn magic(p: *const Self) -> u64 {
        std::ptr::addr_of!((*p).magic).read()
    }
}

/// Frees a buffer handle (its registration ends once no operation on it is in flight).
///
/// # Safety
/// `b` is a live handle made by `dds_register_buffer`, used by no other thread.
pub(crate) unsafe fn free_buffer(b: *mut dds_buffer_t) {
    std::ptr::addr_of_mut!((*b).magic).write(DEAD_MAGIC);
    drop(Box::from_raw(b));
}

/// The buffer behind a handle argument, which must belong to connection `h`.
///
/// # Safety
/// `b` is NULL or a buffer handle that was not freed.
unsafe fn buffer<'a>(h: &dds_t, b: *const dds_buffer_t) -> Result<&'a RegisteredBuffer> {
    let r: &dds_buffer_t = handle(b)?;
    if !h.lock_buffers().contains(&(b as usize)) {
        return Err(Error::invalid("the buffer belongs to another connection"));
    }
    Ok(&r.buf)
}

/// Allocates `len` bytes of shared memory, registers them with the DPU (a sealed memfd passed
/// over the control socket) and stores the new buffer handle in `*out`. Reads and writes on
/// ranges of it (`dds_read_registered`, `dds_write_registered` and their `_sync` forms) move
/// their data by DMA straight between the DPU and the buffer. `DDS_BUFFER_LIMIT`: the DPU's
/// cap on registered bytes per connection is reached.
///
/// # Safety
/// `dds` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_register_buffer(
    dds: *mut dds_t,
    len: usize,
    out: *mut *mut dds_buffer_t,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let out = out_ptr(out, "out")?;
        let buf = h.dds.register_buffer(len)?;
        let p = Box::into_raw(Box::new(dds_buffer_t {
            magic: BUFFER_MAGIC,
            buf,
        }));
        h.lock_buffers().insert(p as usize);
        out.write(p);
        Ok(())
    })
}

/// Stores the buffer's address (page aligned) in `*data` and its length in `*len` (either may
/// be NULL). The application fills and reads the buffer there; a range with a read in flight
/// must not be accessed, and one with a write in flight must not change, until the
/// completion.
///
/// # Safety
/// `buf` is NULL or a live buffer handle; `data` and `len` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_buffer_data(
    buf: *const dds_buffer_t,
    data: *mut *mut c_void,
    len: *mut usize,
) -> dds_status {
    guard(|| {
        let b: &dds_buffer_t = handle(buf)?;
        if !data.is_null() {
            out_ptr(data, "data")?.write(b.buf.as_ptr().cast());
        }
        if !len.is_null() {
            out_ptr(len, "len")?.write(b.buf.len());
        }
        Ok(())
    })
}

/// Unregisters a buffer of connection `dds` and frees its handle. Operations still in flight
/// on it keep it registered until they complete; its memory is unmapped after that.
///
/// # Safety
/// `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds` that no other
/// thread uses during or after this call.
#[no_mangle]
pub unsafe extern "C" fn dds_unregister_buffer(
    dds: *mut dds_t,
    buf: *mut dds_buffer_t,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        handle(buf as *const dds_buffer_t)?;
        if !h.lock_buffers().remove(&(buf as usize)) {
            return Err(Error::invalid("the buffer belongs to another connection"));
        }
        free_buffer(buf);
        Ok(())
    })
}

/// Issues a read of `len` bytes of file `file` at `offset` that the DPU puts by DMA into
/// `buf` at `buf_offset` (no copy by the library). Completes like `dds_read` (bytes read,
/// short at end of file). `DDS_BUFFER_RANGE`: the range reaches outside the buffer.
///
/// # Safety
/// `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds`; the range is
/// not accessed until the completion has been returned by `dds_poll_wait`.
#[no_mangle]
pub unsafe extern "C" fn dds_read_registered(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *const dds_buffer_t,
    buf_offset: usize,
    len: u32,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let b = buffer(h, buf)?;
        Ok(h.dds
            .read_registered(file, offset, b, buf_offset, len, io_ctx)?)
    })
}

/// Issues a write of `len` bytes of `buf` at `buf_offset` to file `file` at `offset`; the DPU
/// fetches them by DMA from the buffer (no copy by the library), so the range must not change
/// until the completion. Completes like `dds_write` (bytes written).
///
/// # Safety
/// `dds` is NULL or a live handle; `buf` is NULL or a buffer handle of `dds`.
#[no_mangle]
pub unsafe extern "C" fn dds_write_registered(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *const dds_buffer_t,
    buf_offset: usize,
    len: u32,
    io_ctx: u64,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let b = buffer(h, buf)?;
        Ok(h.dds
            .write_registered(file, offset, b, buf_offset, len, io_ctx)?)
    })
}

/// Blocking form of `dds_read_registered`: stores the bytes read in `*bytes_read` unless it
/// is NULL.
///
/// # Safety
/// As for `dds_read_registered`, the range untouched during the call; `bytes_read` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn dds_read_registered_sync(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *const dds_buffer_t,
    buf_offset: usize,
    len: u32,
    bytes_read: *mut u32,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let b = buffer(h, buf)?;
        let out = match bytes_read.is_null() {
            true => None,
            false => Some(out_ptr(bytes_read, "bytes_read")?),
        };
        let n = h
            .dds
            .read_registered_sync_shared(file, offset, b, buf_offset, len)?;
        if let Some(p) = out {
            p.write(n as u32);
        }
        Ok(())
    })
}

/// Blocking form of `dds_write_registered`: stores the bytes written in `*bytes_written`
/// unless it is NULL.
///
/// # Safety
/// As for `dds_write_registered`; `bytes_written` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dds_write_registered_sync(
    dds: *mut dds_t,
    file: dds_file_id,
    offset: u64,
    buf: *const dds_buffer_t,
    buf_offset: usize,
    len: u32,
    bytes_written: *mut u32,
) -> dds_status {
    guard(|| {
        let h = conn(dds)?;
        let b = buffer(h, buf)?;
        let out = match bytes_written.is_null() {
            true => None,
            false => Some(out_ptr(bytes_written, "bytes_written")?),
        };
        let n = h
            .dds
            .write_registered_sync(file, offset, b, buf_offset, len)?;
        if let Some(p) = out {
            p.write(n as u32);
        }
        Ok(())
    })
}
