//! The read lane of a worker: a read request taken, the data read from the store and written
//! back in response chunks as the DPU's window allows.

use super::inc;
use super::worker::{Bad, Worker};
use crate::wire::*;
use dds_objstore::{ObjectId, ObjectStore};

pub(super) struct ReadJob {
    req_id: u64,
    window: u64,
    /// Data, or the encoded wire error.
    body: Vec<u8>,
    status: u32,
    total: u32,
    next: u32,
}

impl Worker {
    /// Takes a read request and writes response chunks as the window allows.
    pub(super) fn step_read(&mut self) -> Result<bool, Bad> {
        let mut progress = false;
        let slot = self.layout.read_req_slot(self.r_expect);
        if self.reading.is_none() && self.shm.load(slot) == self.r_expect {
            let mut hb = Vec::new();
            self.shm.copy_out(slot, 64, &mut hb);
            let h = ReadHeader::decode(&hb);
            if h.rseq == self.r_expect {
                if h.name_len == 0
                    || h.name_len as usize > dds_objstore::MAX_NAME_LEN
                    || h.req_id == 0
                    || !(1..=SLOTS as u32).contains(&h.window)
                {
                    return Err((REASON_READ, format!("read request {h:?}")));
                }
                let trailer = slot + 64 + align8(h.name_len as u64);
                if self.shm.load(trailer) == self.r_expect {
                    let mut name = Vec::new();
                    self.shm.copy_out(slot + 64, h.name_len as usize, &mut name);
                    if self.shm.load(slot) == self.r_expect {
                        self.shm.store(slot, 0);
                        self.shm.store(trailer, 0);
                        self.shm.store(CTL_R_TAKEN, self.r_expect);
                        self.r_expect += 1;
                        inc(&self.counters.reads);
                        let oid = ObjectId::new(h.pool, name);
                        let (status, body) = match self.store.read(&oid, h.offset, h.len) {
                            Ok(d) => (0, d),
                            Err(e) => {
                                let mut b = Vec::new();
                                put_error(&mut b, &e);
                                (error_parts(&e).0, b)
                            }
                        };
                        let cap = self.layout.payload_cap();
                        let total = if status != 0 {
                            1
                        } else {
                            (body.len() as u64).div_ceil(cap).max(1) as u32
                        };
                        self.reading = Some(ReadJob {
                            req_id: h.req_id,
                            window: h.window as u64,
                            body,
                            status,
                            total,
                            next: 0,
                        });
                        progress = true;
                    }
                }
            }
        }
        let Some(job) = self.reading.as_mut() else {
            return Ok(progress);
        };
        let cap = self.layout.payload_cap() as usize;
        while job.next < job.total {
            let freed = self.shm.load(DPU_LINE);
            if freed + job.window < self.cseq {
                break;
            }
            let off = job.next as usize * cap;
            let part = if job.status != 0 {
                &job.body[..]
            } else {
                &job.body[off..(off + cap).min(job.body.len())]
            };
            let slot = self.layout.resp_slot(self.cseq);
            self.shm.copy_in(slot + 64, part);
            let mut hb = [0u8; 64];
            RespHeader {
                cseq: self.cseq,
                req_id: job.req_id,
                status: job.status,
                payload_len: part.len() as u32,
                index: job.next,
                total: job.total,
                offset: off as u64,
                data_len: job.body.len() as u64,
            }
            .encode(&mut hb);
            self.shm.copy_in(slot + 8, &hb[8..]);
            self.shm.store(slot, self.cseq);
            self.cseq += 1;
            job.next += 1;
            progress = true;
        }
        if job.next == job.total {
            self.reading = None;
        }
        Ok(progress)
    }
}
