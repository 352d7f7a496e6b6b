//! The write lane of a worker: transfers taken from their slots (batches of small
//! transactions, chunked large ones reassembled), each transaction applied through the store with
//! an asynchronous commit callback, duplicates answered from the window of recent results, and
//! one ACK per transfer written once all of its transactions have committed.

use super::inc;
use super::shm::Shm;
use super::worker::{Bad, Worker, SPARE_MAX};
use crate::wire::*;
use dds_objstore::StoreError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Results of a channel's recent transactions, for duplicates.
#[derive(Default)]
pub(super) struct Window {
    results: VecDeque<(u64, u32, Vec<u8>)>,
}

impl Window {
    fn record(&mut self, rid: u64, r: &Result<(), StoreError>) {
        let (code, rec) = status_of(r);
        if self.results.len() as u64 >= RESULT_WINDOW {
            self.results.pop_front();
        }
        self.results.push_back((rid, code, rec));
    }

    fn lookup(&self, rid: u64) -> (u32, Vec<u8>) {
        self.results
            .iter()
            .find(|(r, _, _)| *r == rid)
            .map(|(_, c, rec)| (*c, rec.clone()))
            .unwrap_or((CODE_DUP_UNKNOWN, Vec::new()))
    }
}

/// Status code and error record (without the index) of a result.
fn status_of(r: &Result<(), StoreError>) -> (u32, Vec<u8>) {
    match r {
        Ok(()) => (0, Vec::new()),
        Err(e) => {
            let (code, a, b, mut msg) = error_parts(e);
            msg.truncate(MAX_ERR_MSG);
            let mut rec = Vec::new();
            put_u32(&mut rec, code);
            put_u64(&mut rec, a);
            put_u64(&mut rec, b);
            put_bytes(&mut rec, &msg);
            (code, rec)
        }
    }
}

/// The ACK of one transfer, written by whoever completes its last transaction.
pub(super) struct AckJob {
    shm: Shm,
    off: u64,
    seq: u64,
    first: u64,
    remaining: AtomicU32,
    results: Mutex<Vec<(u32, Vec<u8>)>>,
    window: Arc<Mutex<Window>>,
}

impl AckJob {
    fn complete(
        &self,
        index: usize,
        rid: u64,
        r: (u32, Vec<u8>),
        own: Option<&Result<(), StoreError>>,
    ) {
        if let Some(res) = own {
            self.window
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(rid, res);
        }
        let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        results[index] = r;
        drop(results);
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.write();
        }
    }

    fn write(&self) {
        let results = self.results.lock().unwrap_or_else(|p| p.into_inner());
        let mut statuses = Vec::with_capacity(results.len() * 4);
        let mut errs = Vec::new();
        for (i, (code, rec)) in results.iter().enumerate() {
            statuses.extend_from_slice(&code.to_le_bytes());
            if *code != 0
                && !rec.is_empty()
                && errs.len() + 4 + rec.len() <= (ACK_SLOT - ACK_ERR_AREA) as usize
            {
                put_u32(&mut errs, i as u32);
                errs.extend_from_slice(rec);
            }
        }
        self.shm.copy_in(self.off + 64, &statuses);
        self.shm.copy_in(self.off + ACK_ERR_AREA, &errs);
        let mut head = [0u8; 56];
        head[0..8].copy_from_slice(&self.first.to_le_bytes());
        head[8..12].copy_from_slice(&(results.len() as u32).to_le_bytes());
        head[12..16].copy_from_slice(&(errs.len() as u32).to_le_bytes());
        self.shm.copy_in(self.off + 8, &head);
        self.shm.store(self.off, self.seq);
    }
}

pub(super) struct Assembly {
    req_id: u64,
    total: u32,
    next: u32,
    tx_len: u64,
    buf: Vec<u8>,
}

impl Worker {
    /// Takes the next write-lane transfer if it has landed.
    pub(super) fn step_write(&mut self) -> Result<bool, Bad> {
        let slot = self.layout.req_slot(self.expect);
        if self.shm.load(slot) != self.expect {
            return Ok(false);
        }
        let mut hb = Vec::new();
        self.shm.copy_out(slot, 64, &mut hb);
        let h = TransferHeader::decode(&hb);
        if h.seq != self.expect {
            return Ok(false);
        }
        let cap = self.layout.payload_cap();
        if h.payload_len as u64 > cap || !matches!(h.kind, KIND_BATCH | KIND_CHUNK) {
            return Err((REASON_HEADER, format!("transfer header {h:?}")));
        }
        let trailer = slot + 64 + align8(h.payload_len as u64);
        if self.shm.load(trailer) != self.expect {
            return Ok(false);
        }
        let landed = |shm: &Shm, e: u64| shm.load(slot) == e && shm.load(trailer) == e;
        let len = h.payload_len as usize;
        let r = if h.kind == KIND_BATCH {
            let mut payload = std::mem::take(&mut self.scratch);
            self.shm.copy_out(slot + 64, len, &mut payload);
            if !landed(&self.shm, self.expect) {
                self.scratch = payload;
                return Ok(false);
            }
            self.take_slot(slot, trailer);
            let r = self.batch(&h, &payload);
            self.scratch = payload;
            r
        } else {
            // Chunks go straight from the slot into the transaction being assembled.
            self.chunk_begin(&h)?;
            let a = self
                .assembly
                .as_mut()
                .expect("chunk_begin keeps an assembly");
            let before = a.buf.len();
            self.shm.append_out(slot + 64, len, &mut a.buf);
            if !landed(&self.shm, self.expect) {
                a.buf.truncate(before);
                if h.a == 0 {
                    self.assembly = None;
                }
                return Ok(false);
            }
            self.take_slot(slot, trailer);
            self.chunk_end(&h)
        };
        self.shm.store(CTL_CONSUMED, self.expect);
        self.expect += 1;
        r.map(|()| true)
    }

    /// Frees a transfer's slot after its payload was copied out.
    fn take_slot(&mut self, slot: u64, trailer: u64) {
        self.shm.store(slot, 0);
        self.shm.store(trailer, 0);
        inc(&self.counters.transfers);
    }

    fn batch(&mut self, h: &TransferHeader, payload: &[u8]) -> Result<(), Bad> {
        inc(&self.counters.batches);
        let bad = |m: &str| (REASON_BATCH, format!("{m} (batch {h:?})"));
        let count = h.a as usize;
        if count == 0
            || count > MAX_BATCH
            || h.req_id == 0
            || h.b != 0
            || h.offset != 0
            || h.tx_len != 0
        {
            return Err(bad("header fields"));
        }
        let mut c = Cursor::new(payload);
        if c.u32() != Some(h.a) {
            return Err(bad("count differs from the header's"));
        }
        let mut txs = Vec::with_capacity(count);
        for _ in 0..count {
            txs.push(
                c.bytes()
                    .ok_or_else(|| bad("transaction lengths overrun the payload"))?,
            );
        }
        if !c.done() {
            return Err(bad("bytes after the last transaction"));
        }
        self.apply(h.seq, h.req_id, &txs);
        Ok(())
    }

    /// Checks a chunk's header against the transaction being assembled (starting one for a
    /// first chunk).
    fn chunk_begin(&mut self, h: &TransferHeader) -> Result<(), Bad> {
        inc(&self.counters.chunks);
        let bad = |m: &str| (REASON_CHUNK, format!("{m} (chunk {h:?})"));
        let max_tx = self.store.options().max_tx_bytes as u64;
        let len = h.payload_len as u64;
        if h.req_id == 0
            || h.b == 0
            || h.a >= h.b
            || len == 0
            || h.tx_len > max_tx
            || h.offset.checked_add(len).is_none_or(|e| e > h.tx_len)
        {
            return Err(bad("header fields"));
        }
        if h.a == 0 {
            if self.assembly.is_some() || h.offset != 0 {
                return Err(bad("a first chunk inside another transaction"));
            }
            // The last transaction's buffer, if kept, saves the allocation (and its page
            // faults); the store copied its bytes out when it was submitted.
            let mut buf = std::mem::take(&mut self.spare);
            buf.clear();
            buf.reserve_exact(h.tx_len as usize);
            self.assembly = Some(Assembly {
                req_id: h.req_id,
                total: h.b,
                next: 0,
                tx_len: h.tx_len,
                buf,
            });
        }
        let Some(a) = self.assembly.as_ref() else {
            return Err(bad("a chunk without its first chunk"));
        };
        if a.req_id != h.req_id
            || a.total != h.b
            || a.next != h.a
            || a.tx_len != h.tx_len
            || a.buf.len() as u64 != h.offset
        {
            return Err(bad("chunk out of order"));
        }
        Ok(())
    }

    /// Counts a chunk whose payload was appended; applies the transaction after its last.
    fn chunk_end(&mut self, h: &TransferHeader) -> Result<(), Bad> {
        let a = self
            .assembly
            .as_mut()
            .expect("chunk_begin keeps an assembly");
        a.next += 1;
        if a.next == a.total {
            if a.buf.len() as u64 != a.tx_len {
                return Err((
                    REASON_CHUNK,
                    format!("chunks do not add up to the transaction (chunk {h:?})"),
                ));
            }
            let a = self.assembly.take().expect("checked above");
            self.apply(h.seq, a.req_id, &[&a.buf]);
            if a.buf.capacity() <= SPARE_MAX {
                self.spare = a.buf;
            }
        }
        Ok(())
    }

    /// Submits transactions `first, first+1, …` (those not applied before) and arranges
    /// their ACK in the ACK slot of transfer `seq`.
    fn apply(&mut self, seq: u64, first: u64, txs: &[&[u8]]) {
        let job = Arc::new(AckJob {
            shm: self.shm.clone(),
            off: self.layout.ack_slot(seq),
            seq,
            first,
            remaining: AtomicU32::new(txs.len() as u32),
            results: Mutex::new(vec![(0, Vec::new()); txs.len()]),
            window: self.window.clone(),
        });
        for (i, tx) in txs.iter().enumerate() {
            let rid = first + i as u64;
            if rid <= self.applied_hi {
                inc(&self.counters.txs_duplicate);
                let r = self
                    .window
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .lookup(rid);
                job.complete(i, rid, r, None);
                continue;
            }
            self.applied_hi = rid;
            inc(&self.counters.txs_applied);
            let j = job.clone();
            let submitted = self.store.submit_encoded_with(tx, move |r| {
                j.complete(i, rid, status_of(&r), Some(&r));
            });
            if let Err(e) = submitted {
                let r = Err(e);
                job.complete(i, rid, status_of(&r), Some(&r));
            }
        }
    }
}
