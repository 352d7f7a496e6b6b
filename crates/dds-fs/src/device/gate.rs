//! A gate on the metadata handle's syncs: a deliberately slow committer, so that tests can
//! check what the data path does while a metadata commit (its `fdatasync`) is outstanding.

use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::MetaIo;

/// Holds every `sync` of a metadata handle while closed ([`UringDevice::with_meta_gate`]).
/// Open when created.
///
/// [`UringDevice::with_meta_gate`]: super::UringDevice::with_meta_gate
#[derive(Debug, Default)]
pub struct SyncGate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Syncs waiting at the gate now.
    held: usize,
    /// Syncs that went through.
    passed: u64,
}

impl SyncGate {
    /// A new, open gate.
    pub fn new() -> Arc<SyncGate> {
        Arc::new(SyncGate::default())
    }

    /// Holds the syncs that come from now on.
    pub fn close(&self) {
        self.lock().closed = true;
    }

    /// Lets held and later syncs through.
    pub fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Syncs waiting at the gate now.
    pub fn held(&self) -> usize {
        self.lock().held
    }

    /// Syncs that went through the gate so far.
    pub fn passed(&self) -> u64 {
        self.lock().passed
    }

    /// Waits until at least `n` syncs wait at the gate, for `timeout` at most; true if they do.
    pub fn wait_held(&self, n: usize, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut s = self.lock();
        while s.held < n {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Waits while the gate is closed.
    fn pass(&self) {
        let mut s = self.lock();
        s.held += 1;
        self.changed.notify_all();
        while s.closed {
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.held -= 1;
        s.passed += 1;
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A metadata handle whose syncs pass `gate` first.
pub(crate) struct GatedMetaIo {
    pub(crate) inner: Box<dyn MetaIo>,
    pub(crate) gate: Arc<SyncGate>,
}

impl MetaIo for GatedMetaIo {
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_sync(offset, buf)
    }
    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_sync(offset, buf)
    }
    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.zero_sync(offset, len)
    }
    fn sync(&mut self) -> io::Result<()> {
        self.gate.pass();
        self.inner.sync()
    }
}
