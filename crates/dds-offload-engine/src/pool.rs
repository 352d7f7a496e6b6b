//! The offload engine's memory: a pre-allocated pool of read buffers with header room in
//! front (Fig. 12) and the contexts of outstanding offloaded reads.
//!
//! Buffer `i` is `[ room | data ]`: `data` starts at an address aligned to `align` (so the
//! file service can read into it with O_DIRECT), and the last `room` bytes before it are
//! where the response builder writes the protocol header. A response is then the contiguous
//! bytes `header + data + padding`, sent straight from the buffer.

use std::alloc::{alloc_zeroed, dealloc, Layout};

use dds_offload_api::{ReadOp, ResponseLayout, REQUEST_HEAD_BYTES};

/// State of a context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtxState {
    /// Not in use.
    Free,
    /// Submitted; the file service may be writing the buffer.
    InFlight,
    /// Completed; the response is built in the buffer.
    Ready,
    /// Submitted, and its connection is gone: free it when the read completes.
    Orphan,
}

/// Bookkeeping of one outstanding offloaded read.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// Where the context is in its life.
    pub state: CtxState,
    /// Slot of the connection that owns it.
    pub conn: u32,
    /// Generation of that connection slot (a reused slot has another).
    pub gen: u32,
    /// The file read.
    pub op: ReadOp,
    /// The request's first bytes, for the response builder.
    pub head: [u8; REQUEST_HEAD_BYTES],
    /// Valid bytes of `head`.
    pub head_len: u8,
    /// Where the built response is in the buffer.
    pub layout: ResponseLayout,
}

const EMPTY: Ctx = Ctx {
    state: CtxState::Free,
    conn: 0,
    gen: 0,
    op: ReadOp {
        file_id: 0,
        size: 0,
        offset: 0,
    },
    head: [0; REQUEST_HEAD_BYTES],
    head_len: 0,
    layout: ResponseLayout {
        header_len: 0,
        total_len: 0,
    },
};

/// Buffers and contexts of one director thread.
pub struct Pool {
    base: *mut u8,
    layout: Layout,
    stride: usize,
    data_off: usize,
    room: usize,
    cap: usize,
    /// The contexts, indexed like the buffers.
    pub ctxs: Box<[Ctx]>,
    free: Vec<u32>,
}

// SAFETY: the pool is owned by one director thread; the raw memory is only shared with the
// file service through the port, per the submit contract.
unsafe impl Send for Pool {}

impl Pool {
    /// `n` buffers of `cap` data bytes (rounded up to `align`) with `room` header bytes.
    pub fn new(n: usize, room: usize, cap: usize, align: usize) -> Pool {
        let align = align.max(64).next_power_of_two();
        let data_off = room.next_multiple_of(align);
        let cap = cap.max(8).next_multiple_of(align);
        let stride = data_off + cap;
        let layout = Layout::from_size_align((stride * n).max(align), align).expect("pool layout");
        // SAFETY: non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let mut free = Vec::with_capacity(n);
        free.extend((0..n as u32).rev());
        Pool {
            base,
            layout,
            stride,
            data_off,
            room,
            cap,
            ctxs: vec![EMPTY; n].into_boxed_slice(),
            free,
        }
    }

    /// Data bytes a buffer holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Contexts not in use.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Takes a free context (reset to empty), `None` when all are in use.
    pub fn alloc(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        self.ctxs[i as usize] = EMPTY;
        Some(i)
    }

    /// Returns context `i` (its read must not be in flight).
    pub fn release(&mut self, i: u32) {
        debug_assert_ne!(self.ctxs[i as usize].state, CtxState::InFlight);
        self.ctxs[i as usize].state = CtxState::Free;
        self.free.push(i);
    }

    /// Start of buffer `i`'s data area.
    pub fn data_ptr(&self, i: u32) -> *mut u8 {
        // SAFETY: inside the allocation.
        unsafe { self.base.add(i as usize * self.stride + self.data_off) }
    }

    /// Header room and data of a buffer whose read is not in flight.
    pub fn room_and_data(&mut self, i: u32) -> (&mut [u8], &mut [u8]) {
        assert!(matches!(
            self.ctxs[i as usize].state,
            CtxState::Ready | CtxState::Free
        ));
        let data = self.data_ptr(i);
        // SAFETY: the read completed (or never started), so nothing else touches the buffer;
        // room and data are disjoint parts of buffer `i`.
        unsafe {
            (
                std::slice::from_raw_parts_mut(data.sub(self.room), self.room),
                std::slice::from_raw_parts_mut(data, self.cap),
            )
        }
    }

    /// The built response of a ready context.
    pub fn response(&self, i: u32) -> &[u8] {
        let c = &self.ctxs[i as usize];
        assert_eq!(c.state, CtxState::Ready);
        let data = self.data_ptr(i);
        // SAFETY: validated layout (header_len <= room, body <= cap); read completed.
        unsafe {
            std::slice::from_raw_parts(
                data.sub(c.layout.header_len as usize),
                c.layout.total_len as usize,
            )
        }
    }

    /// Keeps the memory alive forever (used when reads may still be in flight at shutdown).
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Never free memory the file service may still write (e.g. a director thread
        // unwinding with reads in flight): leak it instead.
        let busy = self
            .ctxs
            .iter()
            .filter(|c| matches!(c.state, CtxState::InFlight | CtxState::Orphan))
            .count();
        if busy > 0 {
            tracing::error!(busy, "buffer pool dropped with reads in flight: leaking it");
            return;
        }
        // SAFETY: allocated in `new` with this layout; no read in flight.
        unsafe { dealloc(self.base, self.layout) }
    }
}
