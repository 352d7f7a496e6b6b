//! The read path: a read request posted into the channel's read ring, the response polled
//! and assembled from the chunks the host writes (several readers of a channel share its lane,
//! each taking the lock to post or to poll the next chunk), and the freed-chunk counter written
//! back.

use super::channel::{Channel, Fault, ReadAssembly, ReadLane, SentRead};
use super::{add, check_state, lock, Shared, Waiter};
use crate::wire::*;
use dds_objstore::{ObjectId, StoreError};
use std::time::Instant;

impl Shared {
    pub(super) fn read_data(
        &self,
        ch: &Channel,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, StoreError> {
        self.check_gone()?;
        if oid.name.is_empty() || oid.name.len() > dds_objstore::MAX_NAME_LEN {
            return Err(StoreError::InvalidArgument(format!(
                "object name of {} bytes",
                oid.name.len()
            )));
        }
        add(&self.counters.reads, 1);
        let res = self.read_wait(ch, oid, offset, len);
        if let Err(Fault::Transport(e)) = &res {
            // A transport failure leaves the lane's sequence numbers unknown.
            ch.kill(e.to_string());
            lock(&ch.read).lane.drain();
        }
        res.map_err(Fault::into_error)
    }

    /// Posts a read request (once a request slot is free), then polls the lane, taking turns
    /// with the channel's other readers, until the result with its req_id is in.
    fn read_wait(
        &self,
        ch: &Channel,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, Fault> {
        let mut waiter = Waiter::new();
        let mut mine = None;
        loop {
            if let Some(e) = ch.dead() {
                return Err(Fault::Result(e));
            }
            let mut r = lock(&ch.read);
            if let Some(id) = mine {
                if let Some(res) = r.done.remove(&id) {
                    return res.map_err(Fault::Result);
                }
            } else if r.rseq < r.taken + SLOTS {
                mine = Some(self.post_read(&mut r, oid, offset, len)?);
                waiter.reset();
                continue;
            }
            let progress = self.read_step(&mut r)?;
            drop(r);
            if progress {
                waiter.reset();
            } else {
                waiter.wait(self).map_err(Fault::Transport)?;
            }
        }
    }

    /// Writes read request `rseq + 1` into its slot; returns its req_id.
    fn post_read(
        &self,
        r: &mut ReadLane,
        oid: &ObjectId,
        offset: u64,
        len: u64,
    ) -> Result<u64, Fault> {
        let c = &self.counters;
        if !r.inflight.is_empty() {
            add(&c.reads_overlapped, 1);
        }
        r.rseq += 1;
        r.next_req += 1;
        let (rseq, req_id) = (r.rseq, r.next_req);
        let name_len = oid.name.len();
        let i = ((rseq - 1) % SLOTS) as usize;
        let b = r.reqs[i].as_mut_slice();
        ReadHeader {
            rseq,
            req_id,
            pool: oid.pool,
            offset,
            len,
            name_len: name_len as u32,
            window: if self.opts.chunking { SLOTS as u32 } else { 1 },
        }
        .encode(b);
        b[64..64 + name_len].copy_from_slice(&oid.name);
        let end = 64 + align8(name_len as u64) as usize;
        b[64 + name_len..end].fill(0);
        b[end..end + 8].copy_from_slice(&rseq.to_le_bytes());
        let req_len = end + 8;
        let slot = self.layout.read_req_slot(rseq);
        r.lane
            .post_write(c, slot, &r.reqs[i], req_len, 0)
            .map_err(Fault::Transport)?;
        r.lane.pump(None).map_err(Fault::Transport)?;
        r.sent.push_back(SentRead {
            rseq,
            len: req_len,
            at: Instant::now(),
        });
        r.order.push_back(req_id);
        r.inflight.insert(
            req_id,
            ReadAssembly {
                rseq,
                want: len,
                out: Vec::new(),
                index: 0,
            },
        );
        Ok(req_id)
    }

    /// Looks for the next response chunk and files it under its request; without one, reads
    /// the control line (ringing a parked host) and retransmits what the host has not taken.
    /// Errors are transport failures.
    fn read_step(&self, r: &mut ReadLane) -> Result<bool, Fault> {
        let c = &self.counters;
        let t = Fault::Transport;
        let Some(&front) = r.order.front() else {
            return Ok(false);
        };
        let cap = self.layout.payload_cap();
        // The host answers requests in order: the next chunk most likely belongs to the
        // oldest one, and one DMA read sized for it takes header and data together.
        let expect = {
            let a = &r.inflight[&front];
            a.want.saturating_sub(a.out.len() as u64).min(cap).max(512)
        };
        let want = (64 + expect) as usize;
        let slot = self.layout.resp_slot(r.cseq);
        r.resp.as_mut_slice()[..64].fill(0);
        r.lane.read_into(c, slot, &r.resp, want).map_err(t)?;
        let h = RespHeader::decode(r.resp.as_slice());
        if h.cseq == r.cseq {
            let pl = h.payload_len as usize;
            let malformed =
                || Fault::Transport(proxy_error(format!("malformed read response {h:?}")));
            let Some(a) = r.inflight.get_mut(&h.req_id) else {
                return Err(malformed());
            };
            if pl as u64 > cap
                || h.index != a.index
                || h.offset != a.out.len() as u64
                || h.total == 0
                || h.index >= h.total
            {
                return Err(malformed());
            }
            // An answered request was taken, and so were the ones before it.
            let answered = a.rseq;
            r.taken = r.taken.max(answered);
            r.sent.retain(|s| s.rseq > answered);
            if 64 + pl > want {
                r.lane.read_into(c, slot, &r.resp, 64 + pl).map_err(t)?;
            }
            let a = r.inflight.get_mut(&h.req_id).expect("checked above");
            let data = &r.resp.as_slice()[64..64 + pl];
            let finished = if h.status != 0 {
                let e = get_error(&mut Cursor::new(data))
                    .unwrap_or_else(|| error_from_parts(h.status, 0, 0, b""));
                Some(Err(e))
            } else {
                if a.out.is_empty() {
                    a.out.reserve(h.data_len.min(a.want) as usize);
                }
                a.out.extend_from_slice(data);
                a.index += 1;
                (a.index == h.total).then(|| Ok(std::mem::take(&mut a.out)))
            };
            if let Some(res) = finished {
                r.inflight.remove(&h.req_id);
                r.order.retain(|&id| id != h.req_id);
                r.done.insert(h.req_id, res);
            }
            self.free_chunk(r).map_err(t)?;
            return Ok(true);
        }
        let [_, state, reason, r_taken] = r.lane.control(c).map_err(t)?;
        check_state(state, reason, r.lane.base, &self.layout).map_err(t)?;
        let mut progress = false;
        if r_taken > r.taken {
            r.taken = r_taken.min(r.rseq);
            progress = true;
        }
        let taken = r.taken;
        r.sent.retain(|s| s.rseq > taken);
        let late = self.opts.retransmit_after;
        if r.sent.front().is_some_and(|s| s.at.elapsed() > late) {
            add(&c.retransmits, 1);
            for i in 0..r.sent.len() {
                let (rseq, len) = (r.sent[i].rseq, r.sent[i].len);
                let b = ((rseq - 1) % SLOTS) as usize;
                let slot = self.layout.read_req_slot(rseq);
                r.lane.post_write(c, slot, &r.reqs[b], len, 0).map_err(t)?;
                r.sent[i].at = Instant::now();
            }
            r.lane.pump(None).map_err(t)?;
        }
        if r.freed_at.elapsed() > late {
            // A lost r_freed would stall the host: write it again.
            let last = r.cseq - 1;
            self.write_freed(r, last).map_err(t)?;
        }
        Ok(progress)
    }

    /// Hands response slot `cseq` back to the host.
    fn free_chunk(&self, r: &mut ReadLane) -> Result<(), StoreError> {
        let cseq = r.cseq;
        self.write_freed(r, cseq)?;
        r.cseq += 1;
        Ok(())
    }

    fn write_freed(&self, r: &mut ReadLane, v: u64) -> Result<(), StoreError> {
        r.lane.pump(None)?;
        r.freed.as_mut_slice().copy_from_slice(&v.to_le_bytes());
        r.lane
            .post_write(&self.counters, DPU_LINE, &r.freed, 8, 0)?;
        r.lane.pump(None)?;
        r.freed_at = Instant::now();
        Ok(())
    }
}
