//! One channel's host worker: its state, the polling loop that alternates between the write
//! lane and the read lane, parking on the channel's doorbell when both are idle, and closing the
//! channel on bad input.

use super::reads::ReadJob;
use super::session::wait_bell;
use super::shm::Shm;
use super::transactions::{Assembly, Window};
use super::{inc, Counters, HostOptions};
use crate::wire::*;
use dds_objstore::ObjStore;
use dds_shm::SharedRegion;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One channel's host worker.
pub(super) struct Worker {
    pub(super) shm: Shm,
    pub(super) layout: Layout,
    chan: u32,
    pub(super) store: Arc<ObjStore>,
    pub(super) counters: Arc<Counters>,
    pub(super) expect: u64,
    pub(super) applied_hi: u64,
    pub(super) window: Arc<Mutex<Window>>,
    pub(super) assembly: Option<Assembly>,
    pub(super) r_expect: u64,
    pub(super) cseq: u64,
    pub(super) reading: Option<ReadJob>,
    pub(super) scratch: Vec<u8>,
    /// A chunked transaction's buffer, kept for the next one (at most `SPARE_MAX` bytes).
    pub(super) spare: Vec<u8>,
    /// The channel's doorbell (an eventfd the DPU rings while `CTL_SLEEP` is set).
    bell: Arc<OwnedFd>,
    /// Epoch of the last park.
    epoch: u64,
}

/// Largest assembly buffer a channel keeps between chunked transactions.
pub(super) const SPARE_MAX: usize = 16 << 20;

/// Bad input: the reason code and a message.
pub(super) type Bad = (u64, String);

impl Worker {
    pub(super) fn new(
        region: Arc<SharedRegion>,
        layout: Layout,
        chan: u32,
        store: Arc<ObjStore>,
        counters: Arc<Counters>,
        bell: Arc<OwnedFd>,
    ) -> Worker {
        Worker {
            shm: Shm {
                region,
                base: layout.channel(chan),
            },
            layout,
            chan,
            store,
            counters,
            expect: 1,
            applied_hi: 0,
            window: Arc::default(),
            assembly: None,
            r_expect: 1,
            cseq: 1,
            reading: None,
            scratch: Vec::new(),
            spare: Vec::new(),
            bell,
            epoch: 0,
        }
    }

    /// Serves until `stop`; returns the partial chunked transactions it dropped.
    ///
    /// Polls while transfers arrive; after `opts.spin` without one it parks (`docs/objproxy.md`,
    /// "Doorbells"): publishes a new epoch in the control line's sleep word, looks once more,
    /// and blocks on the channel's doorbell, which the DPU rings when it finds the word set.
    pub(super) fn run(&mut self, stop: &AtomicBool, opts: &HostOptions) -> u64 {
        let mut idle_since: Option<Instant> = None;
        let mut looks = 0u32;
        while !stop.load(Ordering::Acquire) {
            match self.step() {
                Ok(true) => idle_since = None,
                Ok(false) => {
                    // The clock is read every 32 empty looks.
                    looks = looks.wrapping_add(1);
                    if looks % 32 != 1 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() < opts.spin {
                        continue;
                    }
                    idle_since = None;
                    if let Err(bad) = self.park(opts.park_timeout) {
                        self.close(bad);
                        break;
                    }
                }
                Err(bad) => {
                    self.close(bad);
                    break;
                }
            }
        }
        u64::from(self.assembly.take().is_some())
    }

    /// One look at both lanes.
    fn step(&mut self) -> Result<bool, Bad> {
        let w = self.step_write()?;
        Ok(self.step_read()? || w)
    }

    /// Parks until the doorbell rings or `timeout` passes, unless the last look before
    /// blocking finds work (which it then has done).
    fn park(&mut self, timeout: Duration) -> Result<(), Bad> {
        inc(&self.counters.parks);
        self.epoch += 1;
        self.shm.word(CTL_SLEEP).store(self.epoch, Ordering::SeqCst);
        // Pairs with the DPU's write-then-read (its DMA operations are SeqCst-fenced): either
        // the look below sees the DPU's transfer, or the DPU's read sees the sleep word.
        fence(Ordering::SeqCst);
        let found = self.step();
        if !matches!(found, Ok(false)) {
            self.shm.store(CTL_SLEEP, 0);
            return found.map(|_| ());
        }
        if wait_bell(self.bell.as_fd(), timeout) {
            inc(&self.counters.rung);
        }
        self.shm.store(CTL_SLEEP, 0);
        Ok(())
    }

    /// Closes the channel for bad input.
    fn close(&mut self, (reason, msg): Bad) {
        tracing::warn!(channel = self.chan, %msg, "object proxy: channel closed");
        self.shm.store(CTL_REASON, reason);
        self.shm.store(CTL_STATE, 1);
        inc(&self.counters.channel_errors);
    }
}
