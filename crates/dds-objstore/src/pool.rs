//! A pool of aligned staging buffers. Allocating a fresh zeroed buffer of a few MiB costs a
//! pass of zeroing plus page faults, as much as the copy it is made for; buffers kept here are
//! reused as they are (callers zero what they do not overwrite).

use crate::BLOCK_SIZE;
use dds_sys::AlignedBuf;
use std::sync::Mutex;

/// Size classes: powers of two from one block up.
const CLASSES: usize = 32;

pub(crate) struct BufPool {
    inner: Mutex<Pooled>,
    cap: usize,
}

struct Pooled {
    classes: Vec<Vec<AlignedBuf>>,
    bytes: usize,
}

fn class_of(len: usize) -> Option<usize> {
    let c = len.max(BLOCK_SIZE).next_power_of_two().trailing_zeros() as usize;
    (c < CLASSES).then_some(c)
}

impl BufPool {
    /// A pool keeping at most `cap` bytes of idle buffers.
    pub fn new(cap: usize) -> BufPool {
        BufPool {
            inner: Mutex::new(Pooled {
                classes: (0..CLASSES).map(|_| Vec::new()).collect(),
                bytes: 0,
            }),
            cap,
        }
    }

    /// A block-aligned buffer of at least `len` bytes, with arbitrary contents.
    pub fn get(&self, len: usize) -> AlignedBuf {
        let Some(c) = class_of(len) else {
            return AlignedBuf::new(len, BLOCK_SIZE);
        };
        let mut p = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match p.classes[c].pop() {
            Some(b) => {
                p.bytes -= b.len();
                b
            }
            None => {
                drop(p);
                AlignedBuf::new(1 << c, BLOCK_SIZE)
            }
        }
    }

    /// Gives a buffer back (dropped if the pool is full or the size is not a class).
    pub fn put(&self, buf: AlignedBuf) {
        let len = buf.len();
        if !len.is_power_of_two() || buf.align() != BLOCK_SIZE {
            return;
        }
        let Some(c) = class_of(len) else { return };
        let mut p = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if p.bytes + len <= self.cap {
            p.bytes += len;
            p.classes[c].push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_by_class_within_the_cap() {
        let pool = BufPool::new(3 * 8192);
        let a = pool.get(5000);
        assert_eq!(a.len(), 8192);
        let p = a.as_ptr();
        pool.put(a);
        let b = pool.get(8000);
        assert_eq!(b.as_ptr(), p);
        pool.put(b);
        pool.put(pool.get(16384 + 1)); // 32 KiB: over the cap, dropped
        assert_eq!(pool.inner.lock().unwrap().bytes, 8192);
    }
}
