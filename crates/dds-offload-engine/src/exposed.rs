//! The files an application exposes to the offload engine: only their bytes are ever read on
//! the DPU, cached by cache-on-write or by the host's CACHE records. Everything else on the
//! device stays private to the host applications, whatever a network client asks.
//!
//! The table has one entry per file slot (file ids are a 16-bit slot and a 16-bit generation,
//! `docs/on-disk-format.md`), holding the exposed id, so a stale id of a deleted file that a
//! new file reuses the slot of never matches. Director threads read it without locks; the
//! service thread writes it (control requests, file deletion).

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the table.
const SLOTS: usize = 1 << 16;
/// Marks an entry in use (ids are 32-bit).
const PRESENT: u64 = 1 << 32;

/// The set of exposed file ids.
pub struct ExposedFiles {
    slots: Box<[AtomicU64]>,
}

impl std::fmt::Debug for ExposedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self
            .slots
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) & PRESENT != 0)
            .count();
        f.debug_struct("ExposedFiles").field("files", &n).finish()
    }
}

impl Default for ExposedFiles {
    fn default() -> Self {
        ExposedFiles {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ExposedFiles {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, id: u32) -> &AtomicU64 {
        &self.slots[(id & 0xffff) as usize]
    }

    /// Exposes file `id` (replacing a stale id of the same slot).
    pub fn expose(&self, id: u32) {
        self.slot(id)
            .store(PRESENT | u64::from(id), Ordering::Release);
    }

    /// Withdraws file `id` (no effect if another id holds the slot).
    pub fn withdraw(&self, id: u32) {
        let _ = self.slot(id).compare_exchange(
            PRESENT | u64::from(id),
            0,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Whether file `id` is exposed.
    #[inline]
    pub fn contains(&self, id: u32) -> bool {
        self.slot(id).load(Ordering::Acquire) == PRESENT | u64::from(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_a_reused_slot_do_not_match() {
        let e = ExposedFiles::new();
        let (a, b) = (0x0001_0007, 0x0002_0007); // same slot, two generations
        assert!(!e.contains(a));
        e.expose(a);
        assert!(e.contains(a) && !e.contains(b));
        e.withdraw(b);
        assert!(e.contains(a), "withdrawing another generation leaves it");
        e.expose(b);
        assert!(e.contains(b) && !e.contains(a));
        e.withdraw(b);
        assert!(!e.contains(b));
    }
}
