//! Bytes that the connection buffers of every event loop may hold together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A memory budget shared by event loops: connection buffers are charged for their capacity
/// as they grow with the bytes that arrive, and a connection the budget cannot pay for is
/// closed.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        })
    }

    /// Takes `n` bytes; false (nothing taken) when that would pass the limit.
    pub fn take(&self, n: usize) -> bool {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&x| x <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(x) => cur = x,
            }
        }
    }

    /// Returns `n` bytes taken before.
    pub fn give(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        assert!(before >= n, "budget returned more than it lent");
    }

    /// Bytes in use.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Most bytes ever in use at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}
