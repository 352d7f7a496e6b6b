//! Registered-buffer I/O of a group (`REGISTERED` requests): the staging ring the file
//! service reads into and writes from, the DMA transfers between it and the host
//! application's registered buffers, and registered writes handed to the file service once
//! their data is fetched.

use dds_dma::{has_room, DmaEngine, DmaError, DmaOp, LocalBuf};
use dds_fs::{FileId, FileService, FsError};
use dds_proto::Status;
use dds_ring::RingFault;

use super::{dma_user, GroupState, Staging, SEQ_MASK, TAG_REGISTERED};

impl GroupState {
    /// Bytes of the staging area of registered I/O (the larger ring's capacity).
    pub fn staging_bytes(&self) -> u64 {
        self.req_capacity.max(self.resp_capacity)
    }

    pub fn has_staging(&self) -> bool {
        self.staging.is_some()
    }

    /// Allocates the staging area of registered I/O (once), adding it to `memory_bytes`.
    pub fn add_staging(&mut self) {
        if self.staging.is_none() {
            let cap = self.staging_bytes();
            self.staging = Some(Staging {
                buf: LocalBuf::new(cap as usize, 4096),
                cap,
                alloc: 0,
                free: 0,
            });
            self.memory_bytes += cap;
        }
    }

    /// Where `n` bytes of staging would go (not yet allocated): `Err(true)` when they can
    /// never fit, `Err(false)` when the area is full now.
    pub(super) fn stage_place(&self, n: u64) -> Result<u64, bool> {
        let Some(st) = &self.staging else {
            return Err(true);
        };
        if n > st.cap {
            return Err(true);
        }
        let mut at = st.alloc.next_multiple_of(u64::from(self.payload_align));
        if at % st.cap + n > st.cap {
            at = at.next_multiple_of(st.cap);
        }
        if at + n - st.free > st.cap {
            return Err(false);
        }
        Ok(at)
    }

    pub(super) fn stage_ptr(&self, pos: u64) -> *mut u8 {
        let st = self.staging.as_ref().expect("registered I/O has staging");
        // SAFETY: the offset is reduced modulo the buffer's capacity.
        unsafe { st.buf.as_ptr().cast_mut().add((pos % st.cap) as usize) }
    }

    /// The completion of a registered-buffer transfer: a write's data is fetched (hand the
    /// write to the file service), or a read's data is in the buffer (answer).
    pub(super) fn on_registered_dma(
        &mut self,
        user_data: u64,
        result: Result<(), DmaError>,
        fs: &mut FileService,
    ) -> Result<bool, RingFault> {
        self.reg_inflight = self.reg_inflight.checked_sub(1).ok_or(RingFault::Corrupt(
            "registered DMA completion without a transfer",
        ))?;
        let low = user_data & SEQ_MASK;
        // The full sequence number lies within `pending.len()` (< 2^27) of the head.
        let seq = self.pending_head + (low.wrapping_sub(self.pending_head) & SEQ_MASK);
        let p = match (seq < self.pending_tail).then(|| *self.pending_at(seq)) {
            Some(p) if !p.done => p,
            _ => {
                return Err(RingFault::Corrupt(
                    "registered DMA completion for no request",
                ))
            }
        };
        let Some(r) = p.reg else {
            return Err(RingFault::Corrupt(
                "registered DMA completion for no request",
            ));
        };
        if let Err(e) = result {
            // The buffer was unregistered (or its connection closed) meanwhile.
            tracing::debug!(group = self.id, read = r.read, "registered transfer: {e}");
            if !r.read {
                self.reg_writes_unsubmitted -= 1;
                self.io_outstanding -= 1;
            }
            self.complete_seq(seq, Status::UnknownBuffer, 0);
            return Ok(true);
        }
        if r.read {
            self.complete_seq(seq, Status::Ok, r.bytes);
        } else {
            self.reg_ready.push_back(seq);
            self.submit_ready_writes(fs, user_data & !0xFFFF_FFFF);
        }
        Ok(true)
    }

    /// Hands registered writes whose data is fetched to the file service, in order, while it
    /// has room.
    pub(super) fn submit_ready_writes(&mut self, fs: &mut FileService, user_base: u64) {
        while let Some(&seq) = self.reg_ready.front() {
            let r = self.pending_at(seq).reg.expect("a registered write");
            let stage = self.stage_ptr(r.stage_pos);
            let user = user_base | (seq & 0xFFFF_FFFF);
            // SAFETY: the staging space stays allocated until the response is buffered.
            let res =
                unsafe { fs.submit_write(FileId(r.file_id), r.file_offset, stage, r.bytes, user) };
            match res {
                Err(FsError::Busy) => break,
                Ok(()) => {}
                Err(e) => {
                    self.io_outstanding -= 1;
                    self.complete_seq(seq, Status::from(&e), 0);
                }
            }
            self.reg_ready.pop_front();
            self.reg_writes_unsubmitted -= 1;
        }
    }

    /// Posts the queued registered-buffer transfers the engine has room for.
    pub(super) fn post_registered(&mut self, dma: &mut dyn DmaEngine, user_base: u64) {
        while let Some(&seq) = self.reg_queue.front() {
            if !has_room(dma, 1) {
                break;
            }
            let r = self.pending_at(seq).reg.expect("a registered request");
            let stage = self.stage_ptr(r.stage_pos);
            let user = dma_user(user_base, TAG_REGISTERED, seq);
            let op = match r.read {
                // The device read into staging: put it into the buffer.
                true => DmaOp::write(r.region, r.buf_offset, stage, r.bytes, user),
                // Fetch the write's data from the buffer into staging.
                false => DmaOp::read(r.region, r.buf_offset, stage, r.bytes, user),
            };
            self.reg_queue.pop_front();
            // SAFETY: the staging space is this request's until its response is buffered,
            // which waits for the transfer's completion; nothing else touches it meanwhile.
            match unsafe { dma.post(op) } {
                Ok(()) => self.reg_inflight += 1,
                Err(e) => {
                    // For example the buffer's region is gone: the request fails, the group
                    // carries on.
                    tracing::debug!(group = self.id, "registered transfer: {e}");
                    if !r.read {
                        self.reg_writes_unsubmitted -= 1;
                        self.io_outstanding -= 1;
                    }
                    self.complete_seq(seq, Status::UnknownBuffer, 0);
                }
            }
        }
    }
}
