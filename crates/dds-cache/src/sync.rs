//! Atomics used by the table: `std` normally, `loom`'s model-checked ones under `--cfg loom`.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;

/// Back-off of a reader that saw a bucket being modified.
#[inline]
pub(crate) fn spin() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}
