//! In-memory device for tests, with optional completion reordering and fault injection.

use super::{check_aligned, DevCompletion, DevOp, Device, DeviceBusy, MetaIo};
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};

/// Shared control of a [`MemDevice`]'s injected faults (usable after the device was moved into
/// a file service).
///
/// Async operations (submitted reads/writes/flushes) and synchronous operations (metadata
/// helpers) are counted separately, starting from 0 at the time the fault is armed.
#[derive(Debug, Default)]
pub struct FaultInjector {
    state: Mutex<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    async_ops: u64,
    sync_ops: u64,
    fail_async_at: Option<u64>,
    fail_sync_at: Option<u64>,
    die_at_sync: Option<u64>,
    dead: bool,
}

enum Verdict {
    Ok,
    Fail,
    /// Fail after persisting a torn prefix (only for writes).
    Torn,
}

impl FaultInjector {
    /// The `n`-th async operation from now (0 = the next one) completes with `EIO`.
    pub fn fail_async_op(&self, n: u64) {
        let mut s = self.lock();
        s.fail_async_at = Some(s.async_ops + n);
    }

    /// The `n`-th synchronous operation from now fails with `EIO` (one shot).
    pub fn fail_sync_op(&self, n: u64) {
        let mut s = self.lock();
        s.fail_sync_at = Some(s.sync_ops + n);
    }

    /// Simulated power loss: the `n`-th synchronous operation from now fails (a write persists
    /// only its first half, rounded down to whole 512-byte sectors), and every later operation,
    /// async or sync, fails with `EIO` until [`clear`](Self::clear).
    pub fn die_at_sync_op(&self, n: u64) {
        let mut s = self.lock();
        s.die_at_sync = Some(s.sync_ops + n);
    }

    /// Disarms every fault and revives a dead device.
    pub fn clear(&self) {
        let mut s = self.lock();
        s.fail_async_at = None;
        s.fail_sync_at = None;
        s.die_at_sync = None;
        s.dead = false;
    }

    /// True once a simulated power loss happened.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Number of synchronous operations performed so far.
    pub fn sync_ops(&self) -> u64 {
        self.lock().sync_ops
    }

    /// Number of async operations submitted so far.
    pub fn async_ops(&self) -> u64 {
        self.lock().async_ops
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_async(&self) -> Verdict {
        let mut s = self.lock();
        let i = s.async_ops;
        s.async_ops += 1;
        if s.dead {
            return Verdict::Fail;
        }
        if s.fail_async_at == Some(i) {
            s.fail_async_at = None;
            return Verdict::Fail;
        }
        Verdict::Ok
    }

    fn on_sync(&self) -> Verdict {
        let mut s = self.lock();
        let i = s.sync_ops;
        s.sync_ops += 1;
        if s.dead {
            return Verdict::Fail;
        }
        if s.die_at_sync == Some(i) {
            s.die_at_sync = None;
            s.dead = true;
            return Verdict::Torn;
        }
        if s.fail_sync_at == Some(i) {
            s.fail_sync_at = None;
            return Verdict::Fail;
        }
        Verdict::Ok
    }
}

#[derive(Clone, Copy)]
struct Pending {
    op: DevOp,
    user_data: u64,
}

/// A RAM-backed [`Device`] that enforces O_DIRECT alignment rules.
///
/// By default operations execute at submit time and complete in order. With
/// [`with_reordering`](MemDevice::with_reordering) they execute at poll time, a random subset
/// per poll in random order, which exercises out-of-order completion.
pub struct MemDevice {
    /// The contents, shared with the [`MetaIo`] handles of [`Device::meta_io`].
    data: Arc<Mutex<Vec<u8>>>,
    len: u64,
    block_size: u32,
    mem_align: usize,
    queue_depth: usize,
    rng: Option<u64>,
    pending: Vec<Pending>,
    done: VecDeque<DevCompletion>,
    /// With [`with_latency`](MemDevice::with_latency): the time each of `done` may be
    /// reported, and the device's per-operation latency.
    due: VecDeque<std::time::Instant>,
    latency: Option<std::time::Duration>,
    faults: Arc<FaultInjector>,
}

// SAFETY: the raw pointers in `pending` are caller buffers that the submit contract keeps valid
// until completion; the device has no thread affinity.
unsafe impl Send for MemDevice {}

const EIO: i32 = libc::EIO;

impl MemDevice {
    /// A zero-filled device of `size` bytes (rounded down to the block size) with the given
    /// block size (power of two ≥ 512); memory alignment equals the block size, queue depth 128.
    ///
    /// # Panics
    /// If `block_size` is not a power of two ≥ 512.
    pub fn new(size: u64, block_size: u32) -> MemDevice {
        assert!(
            block_size.is_power_of_two() && block_size >= 512,
            "block size must be a power of two >= 512"
        );
        let size = size - size % u64::from(block_size);
        MemDevice::from_image(vec![0; size as usize], block_size)
    }

    /// A device over an existing image (e.g. a [`snapshot`](Self::snapshot)).
    ///
    /// # Panics
    /// If the image length is not a multiple of `block_size` or the block size is invalid.
    pub fn from_image(image: Vec<u8>, block_size: u32) -> MemDevice {
        assert!(block_size.is_power_of_two() && block_size >= 512);
        assert_eq!(image.len() % block_size as usize, 0);
        MemDevice {
            len: image.len() as u64,
            data: Arc::new(Mutex::new(image)),
            block_size,
            mem_align: block_size as usize,
            queue_depth: 128,
            rng: None,
            pending: Vec::with_capacity(128),
            done: VecDeque::with_capacity(128),
            due: VecDeque::new(),
            latency: None,
            faults: Arc::new(FaultInjector::default()),
        }
    }

    /// Sets the queue depth (≥ 1).
    pub fn with_queue_depth(mut self, depth: usize) -> MemDevice {
        let depth = depth.max(1);
        self.queue_depth = depth;
        self.pending = Vec::with_capacity(depth);
        self.done = VecDeque::with_capacity(depth);
        self
    }

    /// Sets the required buffer address alignment (power of two ≤ block size).
    pub fn with_mem_align(mut self, align: usize) -> MemDevice {
        assert!(align.is_power_of_two() && align <= self.block_size as usize);
        self.mem_align = align;
        self
    }

    /// Executes operations at poll time in a pseudo-random order derived from `seed`.
    pub fn with_reordering(mut self, seed: u64) -> MemDevice {
        assert!(self.latency.is_none(), "reordering or latency, not both");
        self.rng = Some(seed | 1);
        self
    }

    /// A slow serial device: operations execute at submit time, in order, but each is
    /// reported `latency` after the one before it (or after its submit), so completions
    /// arrive one by one as from a disk.
    pub fn with_latency(mut self, latency: std::time::Duration) -> MemDevice {
        assert!(self.rng.is_none(), "reordering or latency, not both");
        self.latency = Some(latency);
        self.due = VecDeque::with_capacity(self.queue_depth);
        self
    }

    /// Handle for injecting faults.
    pub fn fault_injector(&self) -> Arc<FaultInjector> {
        Arc::clone(&self.faults)
    }

    /// Copy of the current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes().clone()
    }

    /// The current contents (locked while the guard lives).
    pub fn image(&self) -> impl std::ops::Deref<Target = Vec<u8>> + '_ {
        self.bytes()
    }

    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        lock_bytes(&self.data)
    }

    fn next_rand(&mut self) -> u64 {
        let x = self.rng.as_mut().expect("reordering enabled");
        // xorshift64
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn range_ok(&self, offset: u64, len: u64) -> bool {
        range_ok(self.len, offset, len)
    }

    /// Executes one async operation and returns its completion result.
    fn execute(&mut self, op: DevOp) -> i32 {
        if let Verdict::Fail | Verdict::Torn = self.faults.on_async() {
            return -EIO;
        }
        let bs = u64::from(self.block_size);
        match op {
            DevOp::Read { offset, buf, len } => {
                if check_aligned(offset, buf as usize, u64::from(len), bs, self.mem_align).is_err()
                    || !self.range_ok(offset, u64::from(len))
                {
                    return -libc::EINVAL;
                }
                let o = offset as usize;
                // SAFETY: submit contract: buf valid for len bytes; ranges checked above.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.bytes().as_ptr().add(o), buf, len as usize)
                };
                len as i32
            }
            DevOp::Write { offset, buf, len } => {
                if check_aligned(offset, buf as usize, u64::from(len), bs, self.mem_align).is_err()
                    || !self.range_ok(offset, u64::from(len))
                {
                    return -libc::EINVAL;
                }
                let o = offset as usize;
                // SAFETY: as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        buf,
                        self.bytes().as_mut_ptr().add(o),
                        len as usize,
                    )
                };
                len as i32
            }
            DevOp::Flush => 0,
        }
    }

    fn shared(&self) -> MemShared {
        MemShared {
            data: Arc::clone(&self.data),
            len: self.len,
            block_size: self.block_size,
            mem_align: self.mem_align,
            faults: Arc::clone(&self.faults),
        }
    }
}

fn lock_bytes(data: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    data.lock().unwrap_or_else(|p| p.into_inner())
}

fn range_ok(size: u64, offset: u64, len: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

/// The synchronous side of a [`MemDevice`]: its own helpers, and the [`MetaIo`] handle a
/// metadata thread uses (same contents, same fault injector).
struct MemShared {
    data: Arc<Mutex<Vec<u8>>>,
    len: u64,
    block_size: u32,
    mem_align: usize,
    faults: Arc<FaultInjector>,
}

impl MemShared {
    fn sync_check(&self, offset: u64, addr: usize, len: u64) -> io::Result<()> {
        check_aligned(
            offset,
            addr,
            len,
            u64::from(self.block_size),
            self.mem_align,
        )?;
        if !range_ok(self.len, offset, len) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

impl MetaIo for MemShared {
    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.sync_check(offset, buf.as_ptr() as usize, buf.len() as u64)?;
        match self.faults.on_sync() {
            Verdict::Ok => {
                let o = offset as usize;
                buf.copy_from_slice(&lock_bytes(&self.data)[o..o + buf.len()]);
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(EIO)),
        }
    }

    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.sync_check(offset, buf.as_ptr() as usize, buf.len() as u64)?;
        let o = offset as usize;
        match self.faults.on_sync() {
            Verdict::Ok => {
                lock_bytes(&self.data)[o..o + buf.len()].copy_from_slice(buf);
                Ok(())
            }
            Verdict::Torn => {
                let half = (buf.len() / 2) / 512 * 512;
                lock_bytes(&self.data)[o..o + half].copy_from_slice(&buf[..half]);
                Err(io::Error::from_raw_os_error(EIO))
            }
            Verdict::Fail => Err(io::Error::from_raw_os_error(EIO)),
        }
    }

    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.sync_check(offset, 0, len)?;
        match self.faults.on_sync() {
            Verdict::Ok => {
                let o = offset as usize;
                lock_bytes(&self.data)[o..o + len as usize].fill(0);
                Ok(())
            }
            _ => Err(io::Error::from_raw_os_error(EIO)),
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        match self.faults.on_sync() {
            Verdict::Ok => Ok(()),
            _ => Err(io::Error::from_raw_os_error(EIO)),
        }
    }
}

impl Device for MemDevice {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn mem_align(&self) -> usize {
        self.mem_align
    }
    fn capacity(&self) -> u64 {
        self.len
    }
    fn queue_depth(&self) -> usize {
        self.queue_depth
    }
    fn inflight(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    unsafe fn submit(&mut self, op: DevOp, user_data: u64) -> Result<(), DeviceBusy> {
        if self.inflight() >= self.queue_depth {
            return Err(DeviceBusy);
        }
        if self.rng.is_some() {
            self.pending.push(Pending { op, user_data });
        } else {
            let result = self.execute(op);
            self.done.push_back(DevCompletion { user_data, result });
            if let Some(l) = self.latency {
                let now = std::time::Instant::now();
                let after = self.due.back().map_or(now, |&d| d.max(now));
                self.due.push_back(after + l);
            }
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut [DevCompletion]) -> usize {
        if self.rng.is_some() && !self.pending.is_empty() {
            // Execute a random non-empty subset in random order.
            let mut n = 1 + (self.next_rand() % self.pending.len() as u64) as usize;
            while n > 0 && !self.pending.is_empty() {
                let i = (self.next_rand() % self.pending.len() as u64) as usize;
                let p = self.pending.swap_remove(i);
                let result = self.execute(p.op);
                self.done.push_back(DevCompletion {
                    user_data: p.user_data,
                    result,
                });
                n -= 1;
            }
        }
        let now = self.latency.map(|_| std::time::Instant::now());
        let mut k = 0;
        while k < out.len() {
            if let (Some(now), Some(&due)) = (now, self.due.front()) {
                if due > now {
                    break;
                }
                self.due.pop_front();
            }
            match self.done.pop_front() {
                Some(c) => {
                    out[k] = c;
                    k += 1;
                }
                None => break,
            }
        }
        k
    }

    fn wait(&mut self) -> io::Result<()> {
        if let Some(&due) = self.due.front() {
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        }
        Ok(())
    }

    fn read_sync(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.shared().read_sync(offset, buf)
    }

    fn write_sync(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.shared().write_sync(offset, buf)
    }

    fn zero_sync(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.shared().zero_sync(offset, len)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.shared().sync()
    }

    fn meta_io(&self) -> Option<io::Result<Box<dyn MetaIo>>> {
        Some(Ok(Box::new(self.shared())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::align::AlignedBuf;

    #[test]
    fn with_latency_completions_come_one_by_one_in_order() {
        let lat = std::time::Duration::from_millis(20);
        let mut d = MemDevice::new(1 << 20, 512).with_latency(lat);
        let mut buf = AlignedBuf::new(512, 512);
        buf.as_mut_slice().fill(3);
        let t0 = std::time::Instant::now();
        for u in 1..=3 {
            let w = DevOp::Write {
                offset: 512 * u,
                buf: buf.as_ptr(),
                len: 512,
            };
            // SAFETY: `buf` outlives the device's use of it.
            unsafe { d.submit(w, u).unwrap() };
        }
        // Executed at submit (in order), reported later.
        assert_eq!(d.image()[512 * 3], 3);
        let mut out = [DevCompletion::default(); 4];
        assert_eq!(d.poll(&mut out), 0, "reported before its latency");
        let mut got = Vec::new();
        while got.len() < 3 {
            d.wait().unwrap();
            let n = d.poll(&mut out);
            assert!(
                n <= 1 || t0.elapsed() >= lat * 2,
                "several at once too early"
            );
            got.extend(out[..n].iter().map(|c| c.user_data));
        }
        assert_eq!(got, vec![1, 2, 3]);
        assert!(
            t0.elapsed() >= lat * 3,
            "three serial latencies: {:?}",
            t0.elapsed()
        );
        assert_eq!(d.inflight(), 0);
    }

    #[test]
    fn alignment_enforced_and_faults() {
        let mut d = MemDevice::new(1 << 20, 512).with_queue_depth(2);
        let mut buf = AlignedBuf::new(1024, 512);
        buf.as_mut_slice().fill(7);
        let mut out = [DevCompletion::default(); 4];
        unsafe {
            d.submit(
                DevOp::Write {
                    offset: 512,
                    buf: buf.as_ptr(),
                    len: 1024,
                },
                1,
            )
            .unwrap();
            d.submit(
                DevOp::Write {
                    offset: 100,
                    buf: buf.as_ptr(),
                    len: 512,
                },
                2,
            )
            .unwrap();
            assert_eq!(d.submit(DevOp::Flush, 3), Err(DeviceBusy));
        }
        assert_eq!(d.poll(&mut out), 2);
        assert_eq!(
            out[0],
            DevCompletion {
                user_data: 1,
                result: 1024
            }
        );
        assert_eq!(out[1].result, -libc::EINVAL);
        assert_eq!(d.image()[512], 7);
        let f = d.fault_injector();
        f.fail_async_op(0);
        unsafe { d.submit(DevOp::Flush, 9).unwrap() };
        assert_eq!(d.poll(&mut out), 1);
        assert_eq!(out[0].result, -libc::EIO);
        f.die_at_sync_op(0);
        assert!(d.write_sync(0, buf.as_slice()).is_err());
        assert_eq!(d.image()[0], 7, "torn prefix persisted");
        assert_eq!(d.image()[511], 7);
        assert!(f.is_dead());
        assert!(d.sync().is_err());
        f.clear();
        assert!(d.sync().is_ok());
    }

    #[test]
    fn reordering_completes_everything() {
        let mut d = MemDevice::new(1 << 20, 512).with_reordering(42);
        let buf = AlignedBuf::new(512, 512);
        for i in 0..16u64 {
            unsafe {
                d.submit(
                    DevOp::Write {
                        offset: i * 512,
                        buf: buf.as_ptr(),
                        len: 512,
                    },
                    i,
                )
                .unwrap()
            };
        }
        let mut seen = Vec::new();
        let mut out = [DevCompletion::default(); 4];
        while d.inflight() > 0 {
            let n = d.poll(&mut out);
            seen.extend(out[..n].iter().map(|c| c.user_data));
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..16).collect::<Vec<_>>());
    }
}
