//! A channel and its DMA lanes: the pool of DMA staging buffers, a lane's engine with its
//! synchronous helpers (post, pump, read into a buffer, control words), the write lane and the
//! read lane's state, and the channel itself with its request queue and the CAS-advanced highest
//! completed request id (Flow-Sync).

use super::{add, lock, Counters};
use crate::wire::*;
use dds_dma::{DmaCompletion, DmaEngine, DmaOp, LocalBuf, RegionId};
use dds_objstore::StoreError;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// The process's pool of DMA staging buffers (`max_dma` bytes each).
pub(super) struct BufPool {
    pub(super) size: usize,
    pub(super) keep: usize,
    pub(super) free: Mutex<Vec<LocalBuf>>,
}

impl BufPool {
    pub(super) fn get(&self) -> LocalBuf {
        lock(&self.free)
            .pop()
            .unwrap_or_else(|| LocalBuf::new(self.size, 64))
    }

    pub(super) fn put(&self, b: LocalBuf) {
        let mut f = lock(&self.free);
        if f.len() < self.keep {
            f.push(b);
        }
    }
}

/// One lane's DMA engine and its synchronous helpers.
pub(super) struct Lane {
    pub(super) eng: Box<dyn DmaEngine>,
    pub(super) region: RegionId,
    pub(super) base: u64,
    pub(super) small: LocalBuf,
    pub(super) next_ud: u64,
    /// Write completions seen, by user data (chunk seqs).
    pub(super) done_writes: Vec<u64>,
    /// The channel's doorbell (the host worker parks on it).
    pub(super) bell: Arc<OwnedFd>,
    /// The host's last park epoch this lane rang for.
    pub(super) rung: u64,
}

const UD_READ: u64 = 1 << 63;

impl Lane {
    /// Pumps completions until the read `ud` completed (if given) or nothing is outstanding.
    pub(super) fn pump(&mut self, want: Option<u64>) -> Result<(), StoreError> {
        let mut comps: [DmaCompletion; 8] = Default::default();
        self.eng.submit();
        loop {
            let n = self.eng.poll(&mut comps);
            let mut found = false;
            for c in &mut comps[..n] {
                c.result
                    .clone()
                    .map_err(|e| proxy_error(format!("DMA: {e}")))?;
                if c.user_data & UD_READ == 0 {
                    self.done_writes.push(c.user_data);
                } else if Some(c.user_data) == want {
                    found = true;
                }
            }
            if found || (want.is_none() && self.eng.outstanding() == 0) {
                return Ok(());
            }
            if n == 0 {
                std::hint::spin_loop();
            }
        }
    }

    /// Posts a write of `len` bytes of `buf` to channel offset `off`.
    pub(super) fn post_write(
        &mut self,
        c: &Counters,
        off: u64,
        buf: &LocalBuf,
        len: usize,
        ud: u64,
    ) -> Result<(), StoreError> {
        assert!(len <= buf.len());
        let op = DmaOp::write(self.region, self.base + off, buf.as_ptr(), len as u32, ud);
        loop {
            // SAFETY: callers keep `buf` alive and untouched until `drain` has seen the
            // write complete (every path drains before releasing a buffer).
            match unsafe { self.eng.post(op) } {
                Ok(()) => break,
                Err(dds_dma::DmaError::QueueFull) => self.pump(None)?,
                Err(e) => return Err(proxy_error(format!("DMA: {e}"))),
            }
        }
        self.eng.submit();
        add(&c.dma_writes, 1);
        add(&c.bytes_written, len as u64);
        Ok(())
    }

    /// Reads `len` bytes at channel offset `off` into `buf` (synchronously).
    pub(super) fn read_into(
        &mut self,
        c: &Counters,
        off: u64,
        buf: &LocalBuf,
        len: usize,
    ) -> Result<(), StoreError> {
        assert!(len <= buf.len());
        self.next_ud += 1;
        let ud = UD_READ | self.next_ud;
        let op = DmaOp::read(
            self.region,
            self.base + off,
            buf.as_mut_ptr(),
            len as u32,
            ud,
        );
        loop {
            // SAFETY: `buf` is not accessed until the read completes (pumped below).
            match unsafe { self.eng.post(op) } {
                Ok(()) => break,
                Err(dds_dma::DmaError::QueueFull) => self.pump(None)?,
                Err(e) => return Err(proxy_error(format!("DMA: {e}"))),
            }
        }
        add(&c.dma_reads, 1);
        add(&c.bytes_read, len as u64);
        self.pump(Some(ud))
    }

    /// Reads the control line: (consumed, state, reason, r_taken). Rings the channel's
    /// doorbell if the host worker parked (a new epoch in the sleep word): every wait for the
    /// host reads the control line after the write the host has to see, so a parked worker
    /// is woken within one poll.
    pub(super) fn control(&mut self, c: &Counters) -> Result<[u64; 4], StoreError> {
        let buf = std::mem::replace(&mut self.small, LocalBuf::new(0, 8));
        // Zeroed first: a lost read leaves zeros, which only means "no progress yet".
        let mut buf = buf;
        buf.as_mut_slice()[..CTL_READ].fill(0);
        let r = self.read_into(c, 0, &buf, CTL_READ);
        let s = buf.as_slice();
        let v = [le64(s), le64(&s[8..]), le64(&s[16..]), le64(&s[24..])];
        let sleep = le64(&s[CTL_SLEEP as usize..]);
        self.small = buf;
        if r.is_ok() && sleep != 0 && sleep != self.rung {
            self.rung = sleep;
            add(&c.doorbells, 1);
            // A full counter (EAGAIN) means it is rung already.
            let _ = rustix::io::write(&*self.bell, &1u64.to_ne_bytes());
        }
        r.map(|()| v)
    }

    /// Waits for every outstanding operation (before staging buffers are reused).
    pub(super) fn drain(&mut self) {
        if self.pump(None).is_err() {
            while self.eng.outstanding() > 0 {
                let mut comps: [DmaCompletion; 8] = Default::default();
                self.eng.poll(&mut comps);
            }
        }
    }
}

/// Write lane state (the driver's).
pub(super) struct WriteLane {
    pub(super) lane: Lane,
    pub(super) seq: u64,
    pub(super) ack: LocalBuf,
}

/// Read lane state, shared by the channel's readers (each takes the lock to post its
/// request or to poll for the next response chunk).
pub(super) struct ReadLane {
    pub(super) lane: Lane,
    /// Last read request seq written.
    pub(super) rseq: u64,
    /// Highest read request seq the host has taken (`r_taken`).
    pub(super) taken: u64,
    /// Next response chunk seq.
    pub(super) cseq: u64,
    pub(super) next_req: u64,
    /// Staging buffers of the K request slots.
    pub(super) reqs: Vec<LocalBuf>,
    /// Requests written and not yet taken (retransmitted when late).
    pub(super) sent: VecDeque<SentRead>,
    /// Requests being answered, by req_id, and their order (the host answers in order).
    pub(super) inflight: HashMap<u64, ReadAssembly>,
    pub(super) order: VecDeque<u64>,
    /// Finished requests waiting for their reader, by req_id.
    pub(super) done: HashMap<u64, Result<Vec<u8>, StoreError>>,
    pub(super) resp: LocalBuf,
    pub(super) freed: LocalBuf,
    /// When `r_freed` was last written.
    pub(super) freed_at: Instant,
}

pub(super) struct SentRead {
    pub(super) rseq: u64,
    pub(super) len: usize,
    pub(super) at: Instant,
}

pub(super) struct ReadAssembly {
    /// Its read request seq.
    pub(super) rseq: u64,
    /// Bytes asked for.
    pub(super) want: u64,
    pub(super) out: Vec<u8>,
    /// Next chunk index.
    pub(super) index: u32,
}

/// How a read failed: the request's own result (an object error, a dead channel), or a
/// failure of the lane itself, which kills the channel.
pub(super) enum Fault {
    Result(StoreError),
    Transport(StoreError),
}

impl Fault {
    pub(super) fn into_error(self) -> StoreError {
        match self {
            Fault::Result(e) | Fault::Transport(e) => e,
        }
    }
}

pub(super) struct Pending {
    pub(super) next_rid: u64,
    pub(super) q: VecDeque<(u64, Vec<u8>)>,
}

pub(super) struct Channel {
    pub(super) idx: u32,
    pub(super) pending: Mutex<Pending>,
    pub(super) cv: Condvar,
    pub(super) g_done: AtomicU64,
    pub(super) failures: Mutex<HashMap<u64, StoreError>>,
    pub(super) dead: Mutex<Option<String>>,
    pub(super) write: Mutex<WriteLane>,
    pub(super) read: Mutex<ReadLane>,
}

impl Channel {
    /// Algorithm 1: raises `g_done` to `rid` unless it is already there.
    pub(super) fn complete_upto(&self, rid: u64) {
        let mut prev = self.g_done.load(Ordering::Acquire);
        while rid > prev {
            match self
                .g_done
                .compare_exchange(prev, rid, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(p) => prev = p,
            }
        }
        let _g = lock(&self.pending);
        self.cv.notify_all();
    }

    pub(super) fn kill(&self, msg: String) {
        lock(&self.dead).get_or_insert(format!("channel {}: {msg}", self.idx));
        let _g = lock(&self.pending);
        self.cv.notify_all();
    }

    pub(super) fn dead(&self) -> Option<StoreError> {
        lock(&self.dead).as_ref().map(|m| proxy_error(m.clone()))
    }
}
