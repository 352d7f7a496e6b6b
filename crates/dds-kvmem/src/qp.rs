//! KV queue pair records (`docs/dpu-kv.md` §2): the compact `{op, key, value, tag}` requests
//! the DPU's communication engine sends a host worker, and the responses it gets back, packed
//! into batches that cross PCIe with one DMA operation each. Encoding appends to a batch
//! buffer; decoding borrows from it and checks every length against the bytes present.

use crate::partition::{KvError, Partition};

/// Batch header bytes.
pub const BATCH_HEADER: usize = 8;
/// Most bytes in a batch (the length field is 16 bits).
pub const BATCH_MAX: usize = u16::MAX as usize;

/// Request ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// GET key.
    Get,
    /// SET key value.
    Set(&'a [u8]),
    /// DEL key.
    Del,
    /// INCRBY key n.
    Incr(i64),
}

/// A request record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The DPU's slot of the client request.
    pub tag: u16,
    /// The key (1..=255 bytes).
    pub key: &'a [u8],
    /// What to do.
    pub op: Op<'a>,
}

/// Response statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// GET/DEL of a missing key.
    NotFound = 1,
    /// INCRBY of a value that is not an integer.
    NotInteger = 2,
    /// INCRBY overflow.
    Overflow = 3,
    /// The partition's memory is full.
    OutOfMemory = 4,
}

/// A response record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// A status alone (SET, DEL, misses, errors).
    Status(u16, Status),
    /// A GET hit.
    Value(u16, &'a [u8]),
    /// An INCRBY result.
    Int(u16, i64),
}

/// Why bytes are not a valid batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed KV queue pair batch: {0}")]
pub struct Malformed(pub &'static str);

/// A batch being filled.
pub struct BatchWriter<'b> {
    buf: &'b mut Vec<u8>,
    start: usize,
    count: u16,
}

impl<'b> BatchWriter<'b> {
    /// Starts a batch with sequence number `seq` at the end of `buf`.
    pub fn new(buf: &'b mut Vec<u8>, seq: u32) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&seq.to_le_bytes());
        BatchWriter {
            buf,
            start,
            count: 0,
        }
    }

    fn room(&self, n: usize) -> bool {
        self.buf.len() - self.start + n <= BATCH_MAX && self.count < u16::MAX
    }

    /// Appends a request; `false` when the batch is full (nothing appended). Keys must be
    /// 1..=255 bytes and SET values at most 65,535 bytes.
    pub fn request(&mut self, r: &Request<'_>) -> bool {
        assert!(!r.key.is_empty() && r.key.len() <= 255, "key length");
        let (code, extra) = match r.op {
            Op::Get => (1u8, 0),
            Op::Set(v) => {
                assert!(v.len() <= u16::MAX as usize, "value length");
                (2, 2 + v.len())
            }
            Op::Del => (3, 0),
            Op::Incr(_) => (4, 8),
        };
        let n = 4 + r.key.len() + extra;
        if !self.room(n) {
            return false;
        }
        self.buf.push(code);
        self.buf.push(r.key.len() as u8);
        self.buf.extend_from_slice(&r.tag.to_le_bytes());
        match r.op {
            Op::Set(v) => {
                self.buf.extend_from_slice(&(v.len() as u16).to_le_bytes());
                self.buf.extend_from_slice(r.key);
                self.buf.extend_from_slice(v);
            }
            Op::Incr(by) => {
                self.buf.extend_from_slice(r.key);
                self.buf.extend_from_slice(&by.to_le_bytes());
            }
            _ => self.buf.extend_from_slice(r.key),
        }
        self.count += 1;
        true
    }

    /// Appends a response; `false` when the batch is full.
    pub fn response(&mut self, r: &Response<'_>) -> bool {
        let n = match r {
            Response::Status(..) => 4,
            Response::Value(_, v) => 6 + v.len(),
            Response::Int(..) => 12,
        };
        if !self.room(n) {
            return false;
        }
        match *r {
            Response::Status(tag, st) => {
                self.buf.extend_from_slice(&[st as u8, 0]);
                self.buf.extend_from_slice(&tag.to_le_bytes());
            }
            Response::Value(tag, v) => {
                self.buf.extend_from_slice(&[Status::Ok as u8, 1]);
                self.buf.extend_from_slice(&tag.to_le_bytes());
                self.buf.extend_from_slice(&(v.len() as u16).to_le_bytes());
                self.buf.extend_from_slice(v);
            }
            Response::Int(tag, n) => {
                self.buf.extend_from_slice(&[Status::Ok as u8, 2]);
                self.buf.extend_from_slice(&tag.to_le_bytes());
                self.buf.extend_from_slice(&n.to_le_bytes());
            }
        }
        self.count += 1;
        true
    }

    /// Records in the batch.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// Closes the batch (writes its header); returns its length.
    pub fn finish(self) -> usize {
        let len = self.buf.len() - self.start;
        self.buf[self.start..self.start + 2].copy_from_slice(&self.count.to_le_bytes());
        self.buf[self.start + 2..self.start + 4].copy_from_slice(&(len as u16).to_le_bytes());
        len
    }
}

/// A batch's header: (count, bytes, seq).
pub fn batch_header(b: &[u8]) -> Result<(u16, usize, u32), Malformed> {
    if b.len() < BATCH_HEADER {
        return Err(Malformed("truncated batch header"));
    }
    let count = u16::from_le_bytes([b[0], b[1]]);
    let len = u16::from_le_bytes([b[2], b[3]]) as usize;
    if len < BATCH_HEADER || len > b.len() {
        return Err(Malformed("batch length out of range"));
    }
    Ok((count, len, u32::from_le_bytes([b[4], b[5], b[6], b[7]])))
}

fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Malformed> {
    let s = b
        .get(*at..*at + n)
        .ok_or(Malformed("record runs past the batch"))?;
    *at += n;
    Ok(s)
}

/// The requests of a batch (framed by [`batch_header`]).
pub fn requests(b: &[u8]) -> impl Iterator<Item = Result<Request<'_>, Malformed>> + '_ {
    let (count, len) = match batch_header(b) {
        Ok((c, l, _)) => (c, l),
        Err(e) => return RecIter::err(e),
    };
    let body = &b[..len];
    let mut at = BATCH_HEADER;
    RecIter::new(count, move || {
        let h = take(body, &mut at, 4)?;
        let (code, klen) = (h[0], h[1] as usize);
        let tag = u16::from_le_bytes([h[2], h[3]]);
        if klen == 0 {
            return Err(Malformed("empty key"));
        }
        let op_and_key = match code {
            1 => (Op::Get, take(body, &mut at, klen)?),
            2 => {
                let v = take(body, &mut at, 2)?;
                let vlen = u16::from_le_bytes([v[0], v[1]]) as usize;
                let key = take(body, &mut at, klen)?;
                (Op::Set(take(body, &mut at, vlen)?), key)
            }
            3 => (Op::Del, take(body, &mut at, klen)?),
            4 => {
                let key = take(body, &mut at, klen)?;
                let n = take(body, &mut at, 8)?;
                (
                    Op::Incr(i64::from_le_bytes(n.try_into().expect("8 bytes"))),
                    key,
                )
            }
            _ => return Err(Malformed("unknown op")),
        };
        Ok(Request {
            tag,
            key: op_and_key.1,
            op: op_and_key.0,
        })
    })
}

/// The responses of a batch.
pub fn responses(b: &[u8]) -> impl Iterator<Item = Result<Response<'_>, Malformed>> + '_ {
    let (count, len) = match batch_header(b) {
        Ok((c, l, _)) => (c, l),
        Err(e) => return RecIter::err(e),
    };
    let body = &b[..len];
    let mut at = BATCH_HEADER;
    RecIter::new(count, move || {
        let h = take(body, &mut at, 4)?;
        let tag = u16::from_le_bytes([h[2], h[3]]);
        let st = match h[0] {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::NotInteger,
            3 => Status::Overflow,
            4 => Status::OutOfMemory,
            _ => return Err(Malformed("unknown status")),
        };
        Ok(match (st, h[1]) {
            (Status::Ok, 1) => {
                let l = take(body, &mut at, 2)?;
                let n = u16::from_le_bytes([l[0], l[1]]) as usize;
                Response::Value(tag, take(body, &mut at, n)?)
            }
            (Status::Ok, 2) => {
                let n = take(body, &mut at, 8)?;
                Response::Int(tag, i64::from_le_bytes(n.try_into().expect("8 bytes")))
            }
            (st, 0) => Response::Status(tag, st),
            _ => return Err(Malformed("unknown response kind")),
        })
    })
}

/// Iterator over `count` records, stopping at the first error.
struct RecIter<'a, T> {
    left: u16,
    next: Option<Box<dyn FnMut() -> Result<T, Malformed> + 'a>>,
    err: Option<Malformed>,
}

impl<'a, T> RecIter<'a, T> {
    fn new(count: u16, f: impl FnMut() -> Result<T, Malformed> + 'a) -> Self {
        RecIter {
            left: count,
            next: Some(Box::new(f)),
            err: None,
        }
    }
    fn err(e: Malformed) -> Self {
        RecIter {
            left: 0,
            next: None,
            err: Some(e),
        }
    }
}

impl<T> Iterator for RecIter<'_, T> {
    type Item = Result<T, Malformed>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.err.take() {
            return Some(Err(e));
        }
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let r = (self.next.as_mut()?)();
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

/// Runs a request on a partition and appends its response (the host worker's loop body).
pub fn serve(p: &mut Partition, r: &Request<'_>, out: &mut BatchWriter<'_>) -> bool {
    let h = crate::key_hash(r.key);
    let resp = match r.op {
        Op::Get => match p.get(r.key, h) {
            Some(v) => return out.response(&Response::Value(r.tag, v)),
            None => Response::Status(r.tag, Status::NotFound),
        },
        Op::Set(v) => match p.set(r.key, h, v) {
            Ok(()) => Response::Status(r.tag, Status::Ok),
            Err(_) => Response::Status(r.tag, Status::OutOfMemory),
        },
        Op::Del => Response::Status(
            r.tag,
            if p.del(r.key, h) {
                Status::Ok
            } else {
                Status::NotFound
            },
        ),
        Op::Incr(by) => match p.incr(r.key, h, by) {
            Ok(n) => Response::Int(r.tag, n),
            Err(KvError::NotInteger) => Response::Status(r.tag, Status::NotInteger),
            Err(KvError::Overflow) => Response::Status(r.tag, Status::Overflow),
            Err(_) => Response::Status(r.tag, Status::OutOfMemory),
        },
    };
    out.response(&resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_are_compact() {
        let mut b = Vec::new();
        let mut w = BatchWriter::new(&mut b, 7);
        let reqs = [
            Request {
                tag: 1,
                key: b"key00001",
                op: Op::Get,
            },
            Request {
                tag: 2,
                key: b"key00002",
                op: Op::Set(b"value002"),
            },
            Request {
                tag: 3,
                key: b"n",
                op: Op::Incr(-5),
            },
            Request {
                tag: 4,
                key: b"key00002",
                op: Op::Del,
            },
        ];
        for r in &reqs {
            assert!(w.request(r));
        }
        let len = w.finish();
        // A GET of an 8-byte key is 12 bytes, a SET of 8/8 bytes 22 (RESP: 27 and 41).
        assert_eq!(len, BATCH_HEADER + 12 + 22 + 13 + 12);
        assert_eq!(batch_header(&b).unwrap(), (4, len, 7));
        let got: Vec<_> = requests(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, reqs);
        // The host serves them.
        let mut p = Partition::new(64 << 10).unwrap();
        let mut out = Vec::new();
        let mut w = BatchWriter::new(&mut out, 7);
        for r in &got {
            assert!(serve(&mut p, r, &mut w));
        }
        w.finish();
        let resp: Vec<_> = responses(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            resp,
            vec![
                Response::Status(1, Status::NotFound),
                Response::Status(2, Status::Ok),
                Response::Int(3, -5),
                Response::Status(4, Status::Ok),
            ]
        );
    }

    #[test]
    fn truncated_and_garbled_batches_are_errors() {
        let mut b = Vec::new();
        let mut w = BatchWriter::new(&mut b, 1);
        w.request(&Request {
            tag: 9,
            key: b"abc",
            op: Op::Set(b"xyz"),
        });
        w.finish();
        for cut in 0..b.len() {
            let mut t = b[..cut].to_vec();
            if t.len() >= 4 {
                t[2..4].copy_from_slice(&(cut as u16).to_le_bytes());
            }
            assert!(requests(&t).any(|r| r.is_err()), "cut at {cut}");
        }
        let mut g = b.clone();
        g[BATCH_HEADER] = 99;
        assert!(requests(&g).any(|r| r.is_err()));
    }
}
