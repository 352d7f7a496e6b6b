//! A group's requests through the file service: dispatched in ring order (their response
//! slots allocated, TailA), submitted (zero-copy, copy mode or registered), and completed
//! into their response records (TailB moves over the completed prefix).

use dds_dma::DmaEngine;
use dds_fs::{FileId, FileService, FsError};
use dds_offload_engine::CacheMaintainer;
use dds_proto::record::{
    self, Op, RecordError, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use dds_proto::Status;
use dds_ring::RingFault;

use super::{dma_user, ConnBuffers, Dispatch, GroupState, Pending, RegIo, WriteInfo, TAG_REFRESH};

impl GroupState {
    /// Parses fetched records and starts their execution, in order, until blocked.
    /// `user_base` is or-ed into the file service's user data (the group's index).
    pub fn dispatch(
        &mut self,
        fs: &mut FileService,
        dma: &mut dyn DmaEngine,
        user_base: u64,
        fs_inflight_max: usize,
        buffers: Option<&ConnBuffers>,
        mut hooks: Option<&mut CacheMaintainer>,
    ) -> Result<Dispatch, RingFault> {
        // Registered writes fetched earlier go first: they hold their place in the file
        // service's queue (`fs_inflight_max` accounts for them).
        self.submit_ready_writes(fs, user_base);
        self.waits_for_device = false;
        while self.dispatched < self.req.fetched() && !self.broken {
            let pos = self.dispatched;
            let in_ring = (pos % self.req_capacity) as usize;
            let avail = (self.req.fetched() - pos).min(self.req_capacity - in_ring as u64) as usize;
            // SAFETY: [pos, fetched) was DMA-read into the mirror and is not released; the
            // record never crosses the end of the ring (ring framing).
            let rec = unsafe { std::slice::from_raw_parts(self.req_ptr(pos), avail) };
            if avail < 8 {
                self.break_group("record header beyond fetched bytes");
                break;
            }
            let len = u32::from_le_bytes(rec[0..4].try_into().expect("4 bytes")) as u64;
            let kind = u16::from_le_bytes([rec[4], rec[5]]);
            if len < 8 || !len.is_multiple_of(8) || len > avail as u64 {
                self.break_group("record length out of bounds");
                break;
            }
            if kind == 0 {
                // PAD: nothing to execute; it is released with the next record.
                self.dispatched += len;
                if self.pending_head == self.pending_tail {
                    // Nothing outstanding before it: release right away.
                    self.req.release_to(pos + len);
                }
                continue;
            }
            if self.pending_full() {
                return Ok(Dispatch::Blocked);
            }
            let header = match record::decode_request(&rec[..len as usize]) {
                Ok(h) => Ok(h),
                Err(RecordError::Framing) => {
                    self.break_group("request record framing");
                    break;
                }
                Err(RecordError::Malformed { request_id }) => Err(request_id),
            };
            // Response slot size: reads get the requested size, everything else a header.
            let (op_code, request_id, read_len, early) = match header {
                Err(request_id) => (kind, request_id, 0, Some(Status::BadRequest)),
                Ok(h) if h.op == Op::Read && h.bytes > self.max_io_bytes => {
                    (kind, h.request_id, 0, Some(Status::TooLarge))
                }
                Ok(h) if h.op == Op::Write && h.bytes > self.max_io_bytes => {
                    (kind, h.request_id, 0, Some(Status::TooLarge))
                }
                // Cache-table records are applied here, by the cache's single writer.
                Ok(h) if matches!(h.op, Op::Cache | Op::Invalidate) => {
                    let status = match hooks.as_deref_mut() {
                        None => Status::InvalidArgument,
                        Some(m) => {
                            let data =
                                &rec[REQUEST_HEADER_BYTES..REQUEST_HEADER_BYTES + h.bytes as usize];
                            match m.apply_record(h.op.code(), data) {
                                Ok(_) => Status::Ok,
                                Err(_) => Status::BadRequest,
                            }
                        }
                    };
                    (kind, h.request_id, 0, Some(status))
                }
                Ok(h) => (
                    h.op.code(),
                    h.request_id,
                    if h.op == Op::Read && h.buffer.is_none() {
                        h.bytes
                    } else {
                        0
                    },
                    None,
                ),
            };
            if early.is_none() {
                if let Ok(h) = header {
                    if h.op == Op::Flush && self.io_outstanding > 0 {
                        // A flush covers every earlier write: wait for them to complete.
                        return Ok(self.wait_for_device());
                    }
                    if matches!(h.op, Op::Read | Op::Write) && fs.is_fenced(FileId(h.file_id)) {
                        // A delete or shrink of this file waits for its I/O: hold this request
                        // (and the ring behind it) until that change is done.
                        return Ok(Dispatch::Blocked);
                    }
                }
                if fs.inflight() >= fs_inflight_max {
                    return Ok(self.wait_for_device());
                }
            }
            // A registered READ or WRITE: its buffer, range and staging space.
            let mut reg = None;
            let early = match (early, header) {
                (None, Ok(h)) => match h.buffer {
                    None => None,
                    Some(b) => match buffers.and_then(|m| m.map.get(&b.id)) {
                        None => Some(Status::UnknownBuffer),
                        Some(rb)
                            if b.offset
                                .checked_add(u64::from(h.bytes))
                                .is_none_or(|end| end > rb.len) =>
                        {
                            Some(Status::BufferRange)
                        }
                        Some(rb) => match self.stage_place(u64::from(h.bytes)) {
                            Err(true) => Some(Status::TooLarge),
                            Err(false) => return Ok(Dispatch::Blocked),
                            Ok(at) => {
                                reg = Some(RegIo {
                                    read: h.op == Op::Read,
                                    region: rb.region,
                                    buf_offset: b.offset,
                                    stage_pos: at,
                                    file_id: h.file_id,
                                    file_offset: h.offset,
                                    bytes: h.bytes,
                                });
                                None
                            }
                        },
                    },
                },
                (e, _) => e,
            };
            let align = if read_len > 0 { self.payload_align } else { 8 };
            // A read slot that can never fit the response ring gets TooLarge, not a slot.
            let (read_len, early) = if early.is_none()
                && !dds_ring::fits(
                    self.resp_capacity,
                    RESPONSE_HEADER_BYTES as u32,
                    read_len,
                    align,
                ) {
                (0, Some(Status::TooLarge))
            } else {
                (read_len, early)
            };
            let Some(place) =
                self.resp
                    .try_alloc(op_code, RESPONSE_HEADER_BYTES as u32, read_len, align)?
            else {
                // Response ring full as far as we know: learn how far the host consumed (the
                // read completes in a later round) and wait.
                self.resp
                    .post_refresh(dma, dma_user(user_base, TAG_REFRESH, 0))?;
                return Ok(Dispatch::Blocked);
            };
            let resp_at = place.header_at;
            let resp_end = place.end;
            let resp_len = (resp_end - resp_at) as u32;
            debug_assert_eq!(resp_len, record::response_len(read_len));
            // SAFETY: the slot [resp_at, resp_end) was just allocated in the mirror.
            let slot = unsafe {
                std::slice::from_raw_parts_mut(self.resp_ptr(resp_at), resp_len as usize)
            };
            record::encode_response(
                resp_len,
                &ResponseHeader {
                    kind: op_code,
                    status: Status::PENDING,
                    request_id,
                    bytes: 0,
                },
                slot,
            );
            if let (Some(r), Ok(h), Some(st)) = (reg, header, self.staging.as_mut()) {
                st.alloc = r.stage_pos + u64::from(h.bytes);
            }
            let stage_end = self.staging.as_ref().map_or(0, |st| st.alloc);
            let seq = self.pending_tail;
            self.pending_tail += 1;
            *self.pending_at(seq) = Pending {
                req_end: pos + len,
                resp_at,
                resp_end,
                read_len,
                done: false,
                write: None,
                reg,
                stage_end,
            };
            self.dispatched = pos + len;
            if let (None, Ok(h), Some(m)) = (early, header, hooks.as_deref_mut()) {
                match h.op {
                    // Invalidate-on-read: the host is reading these objects.
                    Op::Read => m.host_read(h.file_id, h.offset, h.bytes),
                    // The write's cache version is taken at submission (docs/consistency.md).
                    Op::Write => {
                        self.pending_at(seq).write = Some(WriteInfo {
                            file_id: h.file_id,
                            offset: h.offset,
                            data_pos: match reg {
                                Some(r) => r.stage_pos,
                                None => pos + REQUEST_HEADER_BYTES as u64,
                            },
                            staged: reg.is_some(),
                            len: h.bytes,
                            version: m.next_version(),
                        })
                    }
                    _ => {}
                }
            }
            let user = user_base | (seq & 0xFFFF_FFFF);
            let submitted = match (early, header) {
                (Some(status), _) => Err(status),
                (None, Ok(h)) => self.submit(fs, &h, reg, seq, pos, resp_at, user),
                (None, Err(_)) => unreachable!("malformed requests have an early status"),
            };
            match submitted {
                Ok(()) => self.io_outstanding += 1,
                Err(status) => self.complete_seq(seq, status, 0),
            }
        }
        Ok(Dispatch::Drained)
    }

    fn wait_for_device(&mut self) -> Dispatch {
        self.waits_for_device = true;
        Dispatch::WaitingForDevice
    }

    /// Submits one request's I/O to the file service.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit(
        &mut self,
        fs: &mut FileService,
        h: &record::RequestHeader,
        reg: Option<RegIo>,
        seq: u64,
        req_pos: u64,
        resp_at: u64,
        user: u64,
    ) -> Result<(), Status> {
        if let Some(r) = reg {
            let stage = self.stage_ptr(r.stage_pos);
            let res = if r.read {
                // The device reads into staging; `on_complete` DMAs it into the buffer.
                // SAFETY: the staging space stays allocated until the response is buffered.
                unsafe { fs.submit_read(FileId(h.file_id), h.offset, stage, h.bytes, user) }
            } else if h.bytes > 0 {
                // Fetch the data from the registered buffer by DMA (posted with the group's
                // next operations); the write goes to the file service when it completes.
                self.reg_queue.push_back(seq);
                self.reg_writes_unsubmitted += 1;
                Ok(())
            } else {
                // SAFETY: as above (nothing to read).
                unsafe { fs.submit_write(FileId(h.file_id), h.offset, stage, h.bytes, user) }
            };
            return res.map_err(|e| Status::from(&e));
        }
        let r = match h.op {
            Op::Read => {
                let slot_data = resp_at + RESPONSE_HEADER_BYTES as u64;
                let dst = match &self.copy {
                    // Zero copy: the device writes straight into the response slot.
                    None => self.resp_ptr(slot_data),
                    // Copy mode: into the staging buffer; copied to the slot on completion.
                    Some(c) => unsafe {
                        c.read_stage
                            .as_ptr()
                            .cast_mut()
                            .add((slot_data % self.resp_capacity) as usize)
                    },
                };
                // SAFETY: the slot stays allocated (undelivered) until this request completes.
                unsafe { fs.submit_read(FileId(h.file_id), h.offset, dst, h.bytes, user) }
            }
            Op::Write => {
                let data_pos = req_pos + REQUEST_HEADER_BYTES as u64;
                let src = self.req_ptr(data_pos);
                let src = match &mut self.copy {
                    // Zero copy: the device reads the data in place in the request mirror.
                    None => src as *const u8,
                    // Copy mode: the extra request copy of the baseline design.
                    Some(c) => unsafe {
                        let dst = c
                            .write_stage
                            .as_mut_ptr()
                            .add((data_pos % self.req_capacity) as usize);
                        std::ptr::copy_nonoverlapping(src, dst, h.bytes as usize);
                        dst as *const u8
                    },
                };
                // SAFETY: the record is not released until this request completes.
                unsafe { fs.submit_write(FileId(h.file_id), h.offset, src, h.bytes, user) }
            }
            Op::Flush => fs.submit_flush(user),
            Op::Cache | Op::Invalidate => unreachable!("answered at dispatch"),
        };
        r.map_err(|e| Status::from(&e))
    }

    /// A file-service completion for this group.
    pub fn on_complete(
        &mut self,
        user: u64,
        result: Result<u32, FsError>,
        hooks: Option<&mut CacheMaintainer>,
    ) {
        assert!(
            self.io_outstanding > 0,
            "completion without outstanding I/O"
        );
        self.io_outstanding -= 1;
        let low = user & 0xFFFF_FFFF;
        // Recover the full sequence number: it lies within `pending.len()` of the head.
        let seq =
            self.pending_head + (low.wrapping_sub(self.pending_head & 0xFFFF_FFFF) & 0xFFFF_FFFF);
        assert!(seq < self.pending_tail, "completion for an unknown request");
        if let (Some(w), Some(m)) = (self.pending_at(seq).write, hooks) {
            let at = match w.staged {
                true => self.stage_ptr(w.data_pos),
                false => self.req_ptr(w.data_pos),
            };
            // SAFETY: the write's record (or staging space) is not released before its
            // response is buffered.
            let data = unsafe { std::slice::from_raw_parts(at, w.len as usize) };
            // Cache-on-write runs before the response can be delivered (advance runs later).
            match result {
                Ok(_) => m.write_completed(w.file_id, w.offset, data, w.version),
                Err(_) => m.write_failed(w.file_id, w.offset, data, w.version),
            }
        }
        match (result, self.pending_at(seq).reg) {
            (Ok(bytes), Some(r)) if r.read && bytes > 0 => {
                // Put the data read into the registered buffer (posted with the group's next
                // operations), then answer when that completes (`on_dma`).
                let bytes = bytes.min(r.bytes);
                self.pending_at(seq).reg = Some(RegIo { bytes, ..r });
                self.reg_queue.push_back(seq);
            }
            (Ok(bytes), _) => self.complete_seq(seq, Status::Ok, bytes),
            (Err(e), _) => self.complete_seq(seq, Status::from(&e), 0),
        }
    }

    pub(super) fn complete_seq(&mut self, seq: u64, status: Status, bytes: u32) {
        let p = *self.pending_at(seq);
        assert!(!p.done, "request completed twice");
        let bytes = if status == Status::Ok { bytes } else { 0 };
        if let (Some(c), true) = (&self.copy, p.read_len > 0 && bytes > 0) {
            // Copy mode: the extra response copy of the baseline design.
            let data = p.resp_at + RESPONSE_HEADER_BYTES as u64;
            let off = (data % self.resp_capacity) as usize;
            // SAFETY: both ranges are inside their buffers (the slot never wraps).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    c.read_stage.as_ptr().add(off),
                    self.resp_ptr(data),
                    bytes as usize,
                )
            };
        }
        let len = (p.resp_end - p.resp_at) as usize;
        // SAFETY: the slot is allocated and not yet delivered.
        let slot = unsafe { std::slice::from_raw_parts_mut(self.resp_ptr(p.resp_at), len) };
        record::complete_response(slot, status, bytes);
        self.pending_at(seq).done = true;
        let c = &mut self.counters;
        c.requests += 1;
        if status != Status::Ok {
            c.errors += 1;
        } else if p.read_len > 0 || p.reg.is_some_and(|r| r.read) {
            c.bytes_read += u64::from(bytes);
        } else {
            c.bytes_written += u64::from(bytes);
        }
    }
}
