//! Registered application buffers: shared memory the DPU reaches by DMA, so that reads land
//! in it and writes are taken from it without a copy by the library (`docs/records.md`,
//! "Registered-buffer READ and WRITE").

use std::sync::Arc;

use dds_proto::control::{BufferInfo, Request};
use dds_proto::Status;
use dds_shm::SharedRegion;

use crate::conn::Shared;
use crate::error::{DdsError, Result};

/// The registration itself: the mapping and the DPU's id for it. Unregistered from the DPU
/// when the last reference goes (the buffer handle and every operation in flight on it).
pub(crate) struct BufInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: u32,
    region: SharedRegion,
}

impl Drop for BufInner {
    fn drop(&mut self) {
        if !self.shared.is_dead() {
            let r = self
                .shared
                .rpc::<Option<()>>(&Request::UnregisterBuffer { buffer: self.id }, &[]);
            if let Err(e) = r {
                tracing::debug!(buffer = self.id, "unregister buffer: {e}");
            }
        }
    }
}

/// An application buffer registered with the DPU ([`crate::Dds::register_buffer`]).
///
/// Its bytes are shared memory that the DPU writes (registered reads) and reads (registered
/// writes) by DMA. While a read issued on a range is in flight, that range must not be
/// accessed; while a write is in flight, its range must not change (the DPU may fetch the data
/// at any time before the completion). The registration lasts until the buffer is dropped
/// and no operation on it is in flight, or the connection closes.
pub struct RegisteredBuffer {
    pub(crate) inner: Arc<BufInner>,
}

impl RegisteredBuffer {
    pub(crate) fn register(shared: &Arc<Shared>, len: usize) -> Result<RegisteredBuffer> {
        if len == 0 {
            return Err(DdsError::new(
                Status::InvalidArgument,
                "a registered buffer needs at least one byte",
            ));
        }
        let region = SharedRegion::create("dds-buffer", len)
            .map_err(|e| DdsError::new(Status::Io, format!("shared memory: {e}")))?;
        let info: BufferInfo =
            shared.rpc(&Request::RegisterBuffer { len: len as u64 }, &[region.fd()])?;
        Ok(RegisteredBuffer {
            inner: Arc::new(BufInner {
                shared: shared.clone(),
                id: info.buffer,
                region,
            }),
        })
    }

    /// The DPU's id of this buffer.
    pub fn id(&self) -> u32 {
        self.inner.id
    }

    pub fn len(&self) -> usize {
        self.inner.region.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Base address of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.region.as_ptr()
    }

    /// The bytes. No read may be in flight on the buffer (see the type's documentation).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `inner`; the DPU writes it only for reads in
        // flight, which the caller rules out.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The bytes, for the application to fill. No operation may be in flight on the ranges it
    /// changes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above; `&mut self` keeps other borrows of this handle out.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }

    /// Checks that `offset .. offset + len` lies in the buffer.
    pub(crate) fn check_range(&self, offset: usize, len: u32) -> Result<()> {
        match offset.checked_add(len as usize) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(DdsError::new(
                Status::BufferRange,
                format!(
                    "range {offset} + {len} outside the registered buffer of {} bytes",
                    self.len()
                ),
            )),
        }
    }
}

impl std::fmt::Debug for RegisteredBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredBuffer")
            .field("id", &self.inner.id)
            .field("len", &self.len())
            .finish()
    }
}
