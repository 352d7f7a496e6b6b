//! Reader epochs: every read registers at the current commit epoch for as long as it runs
//! ([`ReadGuard`]), so blocks freed by a later commit stay quarantined until the readers that may
//! still see them are gone.

use super::Inner;
use std::collections::BTreeMap;

/// Reader registrations by commit epoch: blocks freed by the commit of epoch `e` stay
/// quarantined while a reader registered at an epoch `<= e` is active.
#[derive(Default)]
pub(super) struct Epochs {
    pub(super) current: u64,
    active: BTreeMap<u64, usize>,
}

pub(super) struct ReadGuard<'a> {
    inner: &'a Inner,
    epoch: u64,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        let mut ep = self.inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = ep.active.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                ep.active.remove(&self.epoch);
            }
        }
    }
}

impl Inner {
    pub(super) fn reader(&self) -> ReadGuard<'_> {
        let mut ep = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = ep.current;
        *ep.active.entry(epoch).or_default() += 1;
        ReadGuard { inner: self, epoch }
    }

    /// The epoch of the oldest registered reader (`u64::MAX` if none).
    pub(super) fn oldest_reader(&self) -> u64 {
        let ep = self.epochs.lock().unwrap_or_else(|p| p.into_inner());
        ep.active.keys().next().copied().unwrap_or(u64::MAX)
    }
}
