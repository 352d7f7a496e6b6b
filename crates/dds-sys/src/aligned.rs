//! Aligned heap buffers: DPU-local memory usable as a DMA source or target, and the I/O
//! buffers of O_DIRECT files and devices. The one aligned-buffer type of the workspace.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// An aligned, zeroed heap allocation: DPU-local memory usable as a DMA source or target, or a
/// buffer for O_DIRECT I/O.
///
/// DMA operations reach it through raw pointers ([`as_mut_ptr`](Self::as_mut_ptr)); while an
/// operation that targets some bytes is in flight, no slice covering those bytes may be alive
/// (the contract of `dds_dma::DmaEngine::post`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; shared access only hands
// out `&[u8]` (and raw pointers whose use is `unsafe` and governed by the DMA contract).
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` allows no safe mutation.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    ///
    /// # Panics
    /// If `align` is not a power of two or the size overflows, or the allocation fails.
    pub fn new(len: usize, align: usize) -> Self {
        let layout =
            Layout::from_size_align(len.max(1), align).expect("AlignedBuf: bad size or alignment");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, layout }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// Raw pointer to the start.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw pointer for DMA targets and in-place I/O. Taking it needs only `&self` (like
    /// `UnsafeCell::get`); writing through it is subject to the usual aliasing rules.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}
