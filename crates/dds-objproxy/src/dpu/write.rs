//! The transaction path (Flow-Adapt): a submitter queues its encoded transaction on its
//! channel, and whichever thread holds the write lane drives it: small transactions are packed
//! into one batch, large ones cut into chunks sent through a pipeline of slots, each answered by
//! an ACK the driver polls for.

use super::channel::{Channel, WriteLane};
use super::{add, check_state, lock, Shared, Waiter};
use crate::wire::*;
use dds_dma::LocalBuf;
use dds_objstore::StoreError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the driver sends next.
pub(super) enum Unit {
    Batch(Vec<(u64, Vec<u8>)>),
    Large(u64, Vec<u8>),
}

impl Shared {
    pub(super) fn submit_bytes(&self, ch: &Channel, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.check_gone()?;
        if let Some(e) = ch.dead() {
            return Err(e);
        }
        add(&self.counters.txs, 1);
        let rid = {
            let mut p = lock(&ch.pending);
            while p.q.len() >= self.opts.max_pending {
                p = ch
                    .cv
                    .wait_timeout(p, Duration::from_millis(2))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                if let Some(e) = ch.dead() {
                    return Err(e);
                }
            }
            let rid = p.next_rid;
            p.next_rid += 1;
            p.q.push_back((rid, bytes));
            rid
        };
        loop {
            if ch.g_done.load(Ordering::Acquire) >= rid {
                return match lock(&ch.failures).remove(&rid) {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            if let Some(e) = ch.dead() {
                return Err(e);
            }
            match ch.write.try_lock() {
                Ok(mut w) => {
                    if let Err(e) = self.drive(ch, &mut w, rid) {
                        ch.kill(e.to_string());
                    }
                    drop(w);
                    let _g = lock(&ch.pending);
                    ch.cv.notify_all();
                }
                Err(_) => {
                    let p = lock(&ch.pending);
                    if ch.g_done.load(Ordering::Acquire) < rid {
                        let _ = ch.cv.wait_timeout(p, Duration::from_millis(1));
                    }
                }
            }
        }
    }

    /// Sends pending transactions until `rid` is acknowledged.
    fn drive(&self, ch: &Channel, w: &mut WriteLane, rid: u64) -> Result<(), StoreError> {
        while ch.g_done.load(Ordering::Acquire) < rid {
            let unit = {
                let mut p = lock(&ch.pending);
                let Some((_, front)) = p.q.front() else {
                    return Err(proxy_error(
                        "a transaction vanished from its channel's queue",
                    ));
                };
                if !self.is_small(front.len()) {
                    let (r, b) = p.q.pop_front().expect("front exists");
                    Unit::Large(r, b)
                } else {
                    let mut batch = Vec::new();
                    let mut used = 4u64;
                    while let Some((_, b)) = p.q.front() {
                        let need = 4 + b.len() as u64;
                        if !self.is_small(b.len())
                            || used + need > self.layout.payload_cap()
                            || batch.len() >= MAX_BATCH
                            || (!self.opts.batching && !batch.is_empty())
                        {
                            break;
                        }
                        used += need;
                        batch.push(p.q.pop_front().expect("front exists"));
                    }
                    Unit::Batch(batch)
                }
            };
            ch.cv.notify_all();
            let (first, results) = match unit {
                Unit::Batch(b) => (b[0].0, self.send_batch(w, &b)?),
                Unit::Large(r, b) => (r, self.send_large(w, r, &b)?),
            };
            let last = first + results.len() as u64 - 1;
            {
                let mut f = lock(&ch.failures);
                for (i, r) in results.into_iter().enumerate() {
                    if let Err(e) = r {
                        f.insert(first + i as u64, e);
                    }
                }
            }
            ch.complete_upto(last);
        }
        Ok(())
    }

    fn send_batch(
        &self,
        w: &mut WriteLane,
        txs: &[(u64, Vec<u8>)],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        add(&self.counters.batches, 1);
        let mut buf = self.pool.get();
        let seq = w.seq + 1;
        let b = buf.as_mut_slice();
        let mut at = 64;
        b[at..at + 4].copy_from_slice(&(txs.len() as u32).to_le_bytes());
        at += 4;
        for (_, t) in txs {
            b[at..at + 4].copy_from_slice(&(t.len() as u32).to_le_bytes());
            b[at + 4..at + 4 + t.len()].copy_from_slice(t);
            at += 4 + t.len();
        }
        let payload_len = at - 64;
        TransferHeader {
            seq,
            kind: KIND_BATCH,
            payload_len: payload_len as u32,
            req_id: txs[0].0,
            a: txs.len() as u32,
            ..Default::default()
        }
        .encode(b);
        let total = self.finish_transfer(b, seq, payload_len);
        w.seq = seq;
        let r = self.send_and_ack(w, &buf, total, seq, txs.len());
        w.lane.drain();
        self.pool.put(buf);
        r
    }

    /// Writes padding and trailer; returns the transfer's length.
    fn finish_transfer(&self, b: &mut [u8], seq: u64, payload_len: usize) -> usize {
        let end = 64 + align8(payload_len as u64) as usize;
        b[64 + payload_len..end].fill(0);
        b[end..end + 8].copy_from_slice(&seq.to_le_bytes());
        end + 8
    }

    /// Sends one transfer (retransmitting it until consumed) and waits for its ACK.
    fn send_and_ack(
        &self,
        w: &mut WriteLane,
        buf: &LocalBuf,
        len: usize,
        seq: u64,
        count: usize,
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let c = &self.counters;
        let slot = self.layout.req_slot(seq);
        w.lane.post_write(c, slot, buf, len, seq)?;
        w.lane.pump(None)?;
        let mut sent = Instant::now();
        let mut waiter = Waiter::new();
        loop {
            if let Some(r) = self.poll_ack(w, seq, count)? {
                return Ok(r);
            }
            let [consumed, state, reason, _] = w.lane.control(c)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            if consumed < seq && sent.elapsed() > self.opts.retransmit_after {
                add(&c.retransmits, 1);
                w.lane.post_write(c, slot, buf, len, seq)?;
                w.lane.pump(None)?;
                sent = Instant::now();
            }
            waiter.wait(self)?;
        }
    }

    /// Reads the ACK slot of `seq`; the results once it is there.
    fn poll_ack(
        &self,
        w: &mut WriteLane,
        seq: u64,
        count: usize,
    ) -> Result<Option<Vec<Result<(), StoreError>>>, StoreError> {
        let c = &self.counters;
        let off = self.layout.ack_slot(seq);
        let len = 64 + 4 * count;
        w.ack.as_mut_slice()[..8].fill(0);
        w.lane.read_into(c, off, &w.ack, len)?;
        let a = w.ack.as_slice();
        if le64(a) != seq {
            return Ok(None);
        }
        if le32(&a[16..]) as usize != count {
            return Err(proxy_error("ACK count differs from the batch's"));
        }
        let err_bytes = (le32(&a[20..]) as u64).min(ACK_SLOT - ACK_ERR_AREA) as usize;
        let codes: Vec<u32> = (0..count).map(|i| le32(&a[64 + 4 * i..])).collect();
        let mut msgs: HashMap<usize, StoreError> = HashMap::new();
        if err_bytes > 0 {
            w.lane.read_into(c, off + ACK_ERR_AREA, &w.ack, err_bytes)?;
            let mut cur = Cursor::new(&w.ack.as_slice()[..err_bytes]);
            while let Some(i) = cur.u32() {
                match get_error(&mut cur) {
                    Some(e) => msgs.insert(i as usize, e),
                    None => break,
                };
            }
        }
        Ok(Some(
            codes
                .into_iter()
                .enumerate()
                .map(|(i, code)| match code {
                    0 => Ok(()),
                    _ => Err(msgs.remove(&i).unwrap_or_else(|| {
                        error_from_parts(code, 0, 0, b"(detail not transmitted)")
                    })),
                })
                .collect(),
        ))
    }

    /// Sends a large transaction as pipelined chunks and waits for its ACK.
    fn send_large(
        &self,
        w: &mut WriteLane,
        rid: u64,
        tx: &[u8],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        let mut inflight: VecDeque<(u64, LocalBuf, usize, Instant)> = VecDeque::new();
        let r = self.pipeline(w, rid, tx, &mut inflight);
        w.lane.drain();
        for (_, b, _, _) in inflight {
            self.pool.put(b);
        }
        let last = r?;
        let mut waiter = Waiter::new();
        loop {
            if let Some(r) = self.poll_ack(w, last, 1)? {
                return Ok(r);
            }
            let [_, state, reason, _] = w.lane.control(&self.counters)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            waiter.wait(self)?;
        }
    }

    /// The chunk pipeline: returns the seq of the last chunk once every chunk is consumed.
    fn pipeline(
        &self,
        w: &mut WriteLane,
        rid: u64,
        tx: &[u8],
        inflight: &mut VecDeque<(u64, LocalBuf, usize, Instant)>,
    ) -> Result<u64, StoreError> {
        let c = &self.counters;
        let cap = self.layout.payload_cap() as usize;
        let total = tx.len().div_ceil(cap);
        let window = if self.opts.chunking {
            SLOTS as usize
        } else {
            1
        };
        let first_seq = w.seq + 1;
        let mut next = 0usize;
        let mut consumed = w.seq;
        let mut waiter = Waiter::new();
        loop {
            // Release the staging buffers of consumed chunks.
            while inflight.front().is_some_and(|f| f.0 <= consumed) {
                w.lane.drain();
                let (_, b, _, _) = inflight.pop_front().expect("front exists");
                self.pool.put(b);
            }
            if next == total && inflight.is_empty() {
                return Ok(first_seq + total as u64 - 1);
            }
            // Stage and send while the window allows.
            let mut progress = false;
            while next < total && inflight.len() < window {
                let seq = first_seq + next as u64;
                if seq > consumed + SLOTS {
                    break;
                }
                add(&c.chunks, 1);
                let mut buf = self.pool.get();
                let off = next * cap;
                let part = &tx[off..(off + cap).min(tx.len())];
                let b = buf.as_mut_slice();
                TransferHeader {
                    seq,
                    kind: KIND_CHUNK,
                    payload_len: part.len() as u32,
                    req_id: rid,
                    a: next as u32,
                    b: total as u32,
                    offset: off as u64,
                    tx_len: tx.len() as u64,
                }
                .encode(b);
                b[64..64 + part.len()].copy_from_slice(part);
                let len = self.finish_transfer(b, seq, part.len());
                w.lane
                    .post_write(c, self.layout.req_slot(seq), &buf, len, seq)?;
                w.seq = seq;
                inflight.push_back((seq, buf, len, Instant::now()));
                next += 1;
                progress = true;
            }
            let [cons, state, reason, _] = w.lane.control(c)?;
            check_state(state, reason, w.lane.base, &self.layout)?;
            if cons > consumed {
                consumed = cons.min(w.seq);
                progress = true;
            }
            for (seq, buf, len, sent) in inflight.iter_mut() {
                if *seq > consumed && sent.elapsed() > self.opts.retransmit_after {
                    add(&c.retransmits, 1);
                    w.lane
                        .post_write(c, self.layout.req_slot(*seq), buf, *len, *seq)?;
                    *sent = Instant::now();
                }
            }
            w.lane.done_writes.clear();
            if progress {
                waiter.reset();
            } else {
                waiter.wait(self)?;
            }
        }
    }
}
