//! DPU-local memory usable as a DMA source or target.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// DPU-local memory usable as a DMA source or target: an aligned, zeroed heap allocation.
///
/// DMA operations reach it through raw pointers ([`as_mut_ptr`](Self::as_mut_ptr)); while an
/// operation that targets some bytes is in flight, no slice covering those bytes may be alive
/// (the contract of [`DmaEngine::post`](crate::DmaEngine::post)).
pub struct LocalBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is a plain heap allocation owned by this value; shared access only hands
// out `&[u8]` (and raw pointers whose use is `unsafe` and governed by the DMA contract).
unsafe impl Send for LocalBuf {}
// SAFETY: as above; `&LocalBuf` allows no safe mutation.
unsafe impl Sync for LocalBuf {}

impl LocalBuf {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two).
    ///
    /// # Panics
    /// If `align` is not a power of two or the size overflows, or the allocation fails.
    pub fn new(len: usize, align: usize) -> Self {
        let layout =
            Layout::from_size_align(len.max(1), align).expect("LocalBuf: bad size or alignment");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        LocalBuf { ptr, len, layout }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Alignment the buffer was allocated with.
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw pointer for DMA targets and in-place I/O. Taking it needs only `&self` (like
    /// `UnsafeCell::get`); writing through it is subject to the usual aliasing rules.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialized (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for LocalBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for LocalBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("align", &self.layout.align())
            .finish()
    }
}
