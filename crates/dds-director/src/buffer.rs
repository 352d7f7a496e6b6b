//! Connection buffers: memory charged to the director's budget and grown with the bytes that
//! arrive, never with a length a peer announced.
//!
//! Every buffer is an anonymous mapping (so the memory of a closed connection goes back to the
//! operating system at once, whatever the allocator would keep) whose size is charged to a
//! [`Budget`] shared by all director threads. A buffer that holds a partial message grows only
//! when it is full, to at most twice its size (and never past the message's length), so its
//! size stays within twice the bytes actually received plus the initial size. When the budget
//! cannot pay for a growth, the connection that asked is closed.

use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes all connection buffers of a director may hold together: the server runtime's budget.
pub use dds_server::Budget;

/// The budget could not pay for a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutOfMemory;

fn page_size() -> usize {
    rustix::param::page_size()
}

/// An anonymous mapping of `cap` bytes (page multiple), charged to a budget.
struct Mem {
    ptr: NonNull<u8>,
    cap: usize,
    budget: Arc<Budget>,
}

// SAFETY: the mapping is owned by this value; access goes through `&`/`&mut self`.
unsafe impl Send for Mem {}

impl Mem {
    fn new(n: usize, budget: &Arc<Budget>) -> Result<Mem, OutOfMemory> {
        let cap = n.next_multiple_of(page_size());
        if cap == 0 {
            return Ok(Mem {
                ptr: NonNull::dangling(),
                cap: 0,
                budget: budget.clone(),
            });
        }
        if !budget.take(cap) {
            return Err(OutOfMemory);
        }
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let r = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                cap,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        };
        match r.ok().and_then(|p| NonNull::new(p.cast::<u8>())) {
            Some(ptr) => Ok(Mem {
                ptr,
                cap,
                budget: budget.clone(),
            }),
            None => {
                budget.give(cap);
                Err(OutOfMemory)
            }
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `cap` bytes mapped readable (zero-filled at first).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, writable, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: mapped in `new` with this length; no reference outlives `self`.
            let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.cap) };
            self.budget.give(self.cap);
        }
    }
}

/// A byte buffer with a consumed prefix.
pub(crate) struct Buf {
    mem: Mem,
    s: usize,
    e: usize,
}

impl Buf {
    /// A buffer of `n` bytes (rounded up to pages) from `budget`.
    pub(crate) fn new(n: usize, budget: &Arc<Budget>) -> Result<Buf, OutOfMemory> {
        Ok(Buf {
            mem: Mem::new(n, budget)?,
            s: 0,
            e: 0,
        })
    }
    fn cap(&self) -> usize {
        self.mem.cap
    }
    pub(crate) fn len(&self) -> usize {
        self.e - self.s
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.s == self.e
    }
    pub(crate) fn data(&self) -> &[u8] {
        &self.mem.bytes()[self.s..self.e]
    }
    pub(crate) fn consume(&mut self, n: usize) {
        assert!(n <= self.len(), "consumed more than the buffer holds");
        self.s += n;
        if self.s == self.e {
            self.s = 0;
            self.e = 0;
        }
    }
    pub(crate) fn compact(&mut self) {
        if self.s > 0 {
            let (s, e) = (self.s, self.e);
            self.mem.bytes_mut().copy_within(s..e, 0);
            self.e -= s;
            self.s = 0;
        }
    }
    /// Free bytes at the tail, compacting first if there are none.
    pub(crate) fn tail(&mut self) -> &mut [u8] {
        if self.e == self.cap() {
            self.compact();
        }
        let e = self.e;
        &mut self.mem.bytes_mut()[e..]
    }
    /// Replaces the memory with `cap` bytes holding the same data (at the start).
    fn regrow(&mut self, cap: usize) -> Result<(), OutOfMemory> {
        let mut mem = Mem::new(cap, &self.mem.budget)?;
        let len = self.len();
        // Copy: the buffered bytes move to the larger mapping.
        mem.bytes_mut()[..len].copy_from_slice(self.data());
        self.mem = mem;
        self.s = 0;
        self.e = len;
        Ok(())
    }
    /// Makes `n` contiguous free bytes at the tail. The buffer grows only when it is empty
    /// (so it holds at most one item larger than its initial size); otherwise false. An
    /// empty buffer that the budget cannot grow is an error.
    pub(crate) fn room(&mut self, n: usize) -> Result<bool, OutOfMemory> {
        if self.cap() - self.e >= n {
            return Ok(true);
        }
        self.compact();
        if self.cap() - self.e >= n {
            return Ok(true);
        }
        if self.is_empty() {
            self.regrow(n)?;
            return Ok(true);
        }
        Ok(false)
    }
    /// Called while the buffer holds the first bytes of an item of `n` bytes: when it is
    /// full, it grows to at most twice its size (never past `n`), so memory follows the bytes
    /// that arrived and not the length the peer announced.
    pub(crate) fn grow_toward(&mut self, n: usize) -> Result<(), OutOfMemory> {
        if self.len() >= n {
            return Ok(());
        }
        self.compact();
        if self.e < self.cap() {
            return Ok(());
        }
        let cap = n.min(self.cap().saturating_mul(2).max(page_size()));
        self.regrow(cap)
    }
    pub(crate) fn commit(&mut self, n: usize) {
        assert!(self.e + n <= self.cap(), "committed past the buffer");
        self.e += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_follows_the_bytes_received_and_the_budget() {
        let page = page_size();
        let budget = Budget::new(64 * page);
        let mut b = Buf::new(page, &budget).unwrap();
        assert_eq!(budget.used(), page);
        // An item of 1000 pages announced: nothing grows until the buffer is full.
        b.grow_toward(1000 * page).unwrap();
        assert_eq!(budget.used(), page);
        let n = b.tail().len();
        b.tail()[..n].fill(7);
        b.commit(n);
        b.grow_toward(1000 * page).unwrap();
        assert_eq!(budget.used(), 2 * page, "doubled, not the announced size");
        assert_eq!(b.data(), &vec![7u8; page][..]);
        // Past the budget: refused, the data stays.
        let mut received = page;
        loop {
            let t = b.tail().len();
            b.commit(t);
            received += t;
            if b.grow_toward(1000 * page).is_err() {
                break;
            }
            assert!(budget.used() <= 2 * received + page);
        }
        assert!(budget.used() <= budget.limit());
        assert!(budget.used() <= budget.peak() && budget.peak() <= budget.limit());
        drop(b);
        assert_eq!(budget.used(), 0, "closing returns every byte");
        assert!(Buf::new(65 * page, &budget).is_err());
    }
}
