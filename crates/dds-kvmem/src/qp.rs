//! KV queue pair records (`docs/dpu-kv.md` §2): the compact `{op, key, value}` requests
//! the DPU's communication engine sends a host worker (responses come back in request order, so
//! no record needs a tag), and the responses it gets back, packed
//! into batches that cross PCIe with one DMA operation each. Encoding appends to a batch
//! buffer; decoding borrows from it and checks every length against the bytes present.

use crate::partition::{KvError, Partition};

/// Batch header bytes: the batch's length (`u16`) and its sequence number (`u16`).
pub const BATCH_HEADER: usize = 4;
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
    /// EXISTS key.
    Exists,
}

impl Op<'_> {
    fn code(&self) -> u8 {
        match self {
            Op::Get => 1,
            Op::Set(_) => 2,
            Op::Del => 3,
            Op::Incr(_) => 4,
            Op::Exists => 5,
        }
    }
}

/// A request record. Responses come back in request order, so a record carries no tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The key (1..=255 bytes).
    pub key: &'a [u8],
    /// What to do.
    pub op: Op<'a>,
}

/// Response codes with nothing after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done (SET, DEL or EXISTS of a present key).
    Ok = 0,
    /// GET/DEL/EXISTS of a missing key.
    NotFound = 1,
    /// INCRBY of a value that is not an integer.
    NotInteger = 2,
    /// INCRBY overflow.
    Overflow = 3,
    /// The partition's memory is full.
    OutOfMemory = 4,
}

const VALUE: u8 = 5;
const INT: u8 = 6;
/// A GET hit of fewer than 128 bytes: the code's low 7 bits are the value's length.
const SHORT_VALUE: u8 = 0x80;

/// A response record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    /// A status alone (SET, DEL, EXISTS, misses, errors).
    Status(Status),
    /// A GET hit.
    Value(&'a [u8]),
    /// An INCRBY result.
    Int(i64),
}

/// Why bytes are not a valid batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed KV queue pair batch: {0}")]
pub struct Malformed(pub &'static str);

/// Bytes of a request record.
pub fn request_len(r: &Request<'_>) -> usize {
    2 + r.key.len()
        + match r.op {
            Op::Set(v) => 2 + v.len(),
            Op::Incr(_) => 8,
            _ => 0,
        }
}

/// Bytes of a LEB128 length (values are at most 65,535 bytes: 1 to 3).
pub fn varint_len(n: usize) -> usize {
    match n {
        0..=0x7F => 1,
        0x80..=0x3FFF => 2,
        _ => 3,
    }
}

/// Most bytes of a GET hit's response record for values of at most `max_value` bytes.
pub fn max_value_response(max_value: usize) -> usize {
    1 + varint_len(max_value) + max_value
}

/// Bytes of a response record.
pub fn response_len(r: &Response<'_>) -> usize {
    match r {
        Response::Status(_) => 1,
        Response::Value(v) if v.len() < 0x80 => 1 + v.len(),
        Response::Value(v) => 1 + varint_len(v.len()) + v.len(),
        Response::Int(_) => 9,
    }
}

/// A batch being filled.
pub struct BatchWriter<'b> {
    buf: &'b mut Vec<u8>,
    start: usize,
    count: u16,
    max: usize,
}

impl<'b> BatchWriter<'b> {
    /// Starts a batch with sequence number `seq` ([`batch_seq`]) at the end of `buf`, of at
    /// most `max` bytes (header included; at most [`BATCH_MAX`]).
    pub fn new(buf: &'b mut Vec<u8>, seq: u16, max: usize) -> Self {
        assert!((BATCH_HEADER..=BATCH_MAX).contains(&max), "batch limit");
        let start = buf.len();
        buf.extend_from_slice(&[0; 2]);
        buf.extend_from_slice(&seq.to_le_bytes());
        BatchWriter {
            buf,
            start,
            count: 0,
            max,
        }
    }

    /// Whether `n` more bytes fit.
    pub fn room(&self, n: usize) -> bool {
        self.buf.len() - self.start + n <= self.max && self.count < u16::MAX
    }

    /// Appends a request; `false` when the batch is full (nothing appended). Keys must be
    /// 1..=255 bytes and SET values at most 65,535 bytes.
    pub fn request(&mut self, r: &Request<'_>) -> bool {
        assert!(!r.key.is_empty() && r.key.len() <= 255, "key length");
        if !self.room(request_len(r)) {
            return false;
        }
        self.buf.push(r.op.code());
        self.buf.push(r.key.len() as u8);
        match r.op {
            Op::Set(v) => {
                assert!(v.len() <= u16::MAX as usize, "value length");
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
        if !self.room(response_len(r)) {
            return false;
        }
        match *r {
            Response::Status(st) => self.buf.push(st as u8),
            Response::Value(v) if v.len() < 0x80 => {
                self.buf.push(SHORT_VALUE | v.len() as u8);
                self.buf.extend_from_slice(v);
            }
            Response::Value(v) => {
                assert!(v.len() <= u16::MAX as usize, "value length");
                self.buf.push(VALUE);
                let mut n = v.len();
                while n >= 0x80 {
                    self.buf.push(n as u8 | 0x80);
                    n >>= 7;
                }
                self.buf.push(n as u8);
                self.buf.extend_from_slice(v);
            }
            Response::Int(n) => {
                self.buf.push(INT);
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

    /// Bytes so far, header included.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Only the header.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Closes the batch (writes its header); returns its length.
    pub fn finish(self) -> usize {
        let len = self.buf.len() - self.start;
        self.buf[self.start..self.start + 2].copy_from_slice(&(len as u16).to_le_bytes());
        len
    }
}

/// The sequence number of batch `n` (from 0) of a queue: `n mod 65535 + 1`, never 0 (a zeroed
/// slot holds no batch).
pub fn batch_seq(n: u64) -> u16 {
    (n % 65_535) as u16 + 1
}

/// A batch's header: (bytes, seq). The batch carries no record count: its records run to
/// `bytes`.
pub fn batch_header(b: &[u8]) -> Result<(usize, u16), Malformed> {
    if b.len() < BATCH_HEADER {
        return Err(Malformed("truncated batch header"));
    }
    let len = u16::from_le_bytes([b[0], b[1]]) as usize;
    if len < BATCH_HEADER || len > b.len() {
        return Err(Malformed("batch length out of range"));
    }
    Ok((len, u16::from_le_bytes([b[2], b[3]])))
}

fn take<'a>(b: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8], Malformed> {
    let s = b
        .get(*at..*at + n)
        .ok_or(Malformed("record runs past the batch"))?;
    *at += n;
    Ok(s)
}

/// The requests of a batch (framed by [`batch_header`]).
pub fn requests(b: &[u8]) -> Records<'_, Request<'_>> {
    Records::new(b, request)
}

/// The responses of a batch.
pub fn responses(b: &[u8]) -> Records<'_, Response<'_>> {
    Records::new(b, response)
}

/// Decodes the request record at `body[*at..]`.
fn request<'a>(body: &'a [u8], at: &mut usize) -> Result<Request<'a>, Malformed> {
    let h = take(body, at, 2)?;
    let (code, klen) = (h[0], h[1] as usize);
    if klen == 0 {
        return Err(Malformed("empty key"));
    }
    let (op, key) = match code {
        1 => (Op::Get, take(body, at, klen)?),
        2 => {
            let v = take(body, at, 2)?;
            let vlen = u16::from_le_bytes([v[0], v[1]]) as usize;
            let key = take(body, at, klen)?;
            (Op::Set(take(body, at, vlen)?), key)
        }
        3 => (Op::Del, take(body, at, klen)?),
        4 => {
            let key = take(body, at, klen)?;
            let n = take(body, at, 8)?;
            (
                Op::Incr(i64::from_le_bytes(n.try_into().expect("8 bytes"))),
                key,
            )
        }
        5 => (Op::Exists, take(body, at, klen)?),
        _ => return Err(Malformed("unknown op")),
    };
    Ok(Request { key, op })
}

/// Decodes the response record at `body[*at..]`.
fn response<'a>(body: &'a [u8], at: &mut usize) -> Result<Response<'a>, Malformed> {
    let code = take(body, at, 1)?[0];
    Ok(match code {
        0 => Response::Status(Status::Ok),
        1 => Response::Status(Status::NotFound),
        2 => Response::Status(Status::NotInteger),
        3 => Response::Status(Status::Overflow),
        4 => Response::Status(Status::OutOfMemory),
        VALUE => {
            let mut n = 0usize;
            for shift in [0, 7, 14] {
                let b = take(body, at, 1)?[0];
                n |= usize::from(b & 0x7F) << shift;
                if b & 0x80 == 0 {
                    break;
                }
                if shift == 14 {
                    return Err(Malformed("value length longer than 3 bytes"));
                }
            }
            if n > u16::MAX as usize {
                return Err(Malformed("value longer than 65,535 bytes"));
            }
            Response::Value(take(body, at, n)?)
        }
        INT => {
            let n = take(body, at, 8)?;
            Response::Int(i64::from_le_bytes(n.try_into().expect("8 bytes")))
        }
        short if short & SHORT_VALUE != 0 => {
            Response::Value(take(body, at, usize::from(short & 0x7F))?)
        }
        _ => return Err(Malformed("unknown response code")),
    })
}

/// The records of a batch, decoded one by one as they are taken ([`requests`],
/// [`responses`]). Allocates nothing. A malformed batch header is the only item; a malformed
/// record is the last.
pub struct Records<'a, T> {
    body: &'a [u8],
    at: usize,
    err: Option<Malformed>,
    decode: fn(&'a [u8], &mut usize) -> Result<T, Malformed>,
}

impl<'a, T> Records<'a, T> {
    fn new(b: &'a [u8], decode: fn(&'a [u8], &mut usize) -> Result<T, Malformed>) -> Self {
        let (body, err) = match batch_header(b) {
            Ok((len, _)) => (&b[..len], None),
            Err(e) => (&b[..0], Some(e)),
        };
        Records {
            body,
            at: BATCH_HEADER,
            err,
            decode,
        }
    }
}

impl<T> Iterator for Records<'_, T> {
    type Item = Result<T, Malformed>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.err.take() {
            return Some(Err(e));
        }
        if self.at >= self.body.len() {
            return None;
        }
        let r = (self.decode)(self.body, &mut self.at);
        if r.is_err() {
            self.at = self.body.len();
        }
        Some(r)
    }
}

/// Runs a request on a partition and passes its response to `f` (the processing engine's
/// step, wherever it runs: a host worker serving a queue pair, or a front end serving its
/// clients directly).
pub fn execute<R>(p: &mut Partition, r: &Request<'_>, f: impl FnOnce(Response<'_>) -> R) -> R {
    execute_hashed(p, r, crate::key_hash(r.key), f)
}

/// [`execute`] of a request whose key hashes to `h` ([`key_hash`](crate::key_hash)).
pub fn execute_hashed<R>(
    p: &mut Partition,
    r: &Request<'_>,
    h: u64,
    f: impl FnOnce(Response<'_>) -> R,
) -> R {
    let resp = match r.op {
        Op::Get => match p.get(r.key, h) {
            Some(v) => return f(Response::Value(v)),
            None => Response::Status(Status::NotFound),
        },
        Op::Exists => Response::Status(if p.get(r.key, h).is_some() {
            Status::Ok
        } else {
            Status::NotFound
        }),
        Op::Set(v) => match p.set(r.key, h, v) {
            Ok(()) => Response::Status(Status::Ok),
            Err(_) => Response::Status(Status::OutOfMemory),
        },
        Op::Del => Response::Status(if p.del(r.key, h) {
            Status::Ok
        } else {
            Status::NotFound
        }),
        Op::Incr(by) => match p.incr(r.key, h, by) {
            Ok(n) => Response::Int(n),
            Err(KvError::NotInteger) => Response::Status(Status::NotInteger),
            Err(KvError::Overflow) => Response::Status(Status::Overflow),
            Err(_) => Response::Status(Status::OutOfMemory),
        },
    };
    f(resp)
}

/// Runs a request whose key hashes to `h` on a partition and appends its response (the host
/// worker's loop body); `false` when the batch is full (nothing appended, but the request ran).
pub fn serve(p: &mut Partition, r: &Request<'_>, h: u64, out: &mut BatchWriter<'_>) -> bool {
    execute_hashed(p, r, h, |resp| out.response(&resp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_responses_round_trip_and_are_compact() {
        let mut b = Vec::new();
        let mut w = BatchWriter::new(&mut b, 7, BATCH_MAX);
        let reqs = [
            Request {
                key: b"key00001",
                op: Op::Get,
            },
            Request {
                key: b"key00002",
                op: Op::Set(b"value002"),
            },
            Request {
                key: b"n",
                op: Op::Incr(-5),
            },
            Request {
                key: b"key00002",
                op: Op::Del,
            },
        ];
        for r in &reqs {
            assert!(w.request(r));
        }
        let len = w.finish();
        // A GET of an 8-byte key is 10 bytes, a SET of 8/8 bytes 20 (RESP: 27 and 41).
        assert_eq!(len, BATCH_HEADER + 10 + 20 + 11 + 10);
        assert_eq!(batch_header(&b).unwrap(), (len, 7));
        let got: Vec<_> = requests(&b).collect::<Result<_, _>>().unwrap();
        assert_eq!(got, reqs);
        // The host serves them.
        let mut p = Partition::new(64 << 10).unwrap();
        let mut out = Vec::new();
        let mut w = BatchWriter::new(&mut out, 7, BATCH_MAX);
        for r in &got {
            assert!(serve(&mut p, r, crate::key_hash(r.key), &mut w));
        }
        w.finish();
        let resp: Vec<_> = responses(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            resp,
            vec![
                Response::Status(Status::NotFound),
                Response::Status(Status::Ok),
                Response::Int(-5),
                Response::Status(Status::Ok),
            ]
        );
    }

    #[test]
    fn value_lengths_are_in_the_code_or_varints_of_one_to_three_bytes() {
        for n in [0usize, 1, 8, 127, 128, 300, 16_383, 16_384, 60_000] {
            let v = vec![7u8; n];
            let mut b = Vec::new();
            let mut w = BatchWriter::new(&mut b, 1, BATCH_MAX);
            assert!(w.response(&Response::Value(&v)));
            let len = w.finish();
            assert_eq!(len, BATCH_HEADER + response_len(&Response::Value(&v)));
            assert!(response_len(&Response::Value(&v)) <= max_value_response(n));
            let got: Vec<_> = responses(&b).collect::<Result<_, _>>().unwrap();
            assert_eq!(got, vec![Response::Value(&v)]);
            // Under 128 bytes the length is in the code: one byte before the value.
            if n < 128 {
                assert_eq!(b[BATCH_HEADER], 0x80 | n as u8);
                assert_eq!(len, BATCH_HEADER + 1 + n);
            }
        }
        // A fourth length byte, or a length past the batch, is an error.
        let bad = [8u8, 0, 1, 0, VALUE, 0x80, 0x80, 0x80];
        assert!(responses(&bad).any(|r| r.is_err()));
    }

    #[test]
    fn truncated_and_garbled_batches_are_errors() {
        let mut b = Vec::new();
        let mut w = BatchWriter::new(&mut b, 1, BATCH_MAX);
        w.request(&Request {
            key: b"abc",
            op: Op::Set(b"xyz"),
        });
        w.finish();
        for cut in 0..b.len() {
            let mut t = b[..cut].to_vec();
            if t.len() >= 2 {
                t[0..2].copy_from_slice(&(cut as u16).to_le_bytes());
            }
            if cut == BATCH_HEADER {
                // The header alone: a batch of no records.
                assert_eq!(requests(&t).count(), 0);
            } else {
                assert!(requests(&t).any(|r| r.is_err()), "cut at {cut}");
            }
        }
        // A length past the bytes present, or inside the header, is an error.
        let mut long = b.clone();
        long[0..2].copy_from_slice(&(b.len() as u16 + 1).to_le_bytes());
        assert!(requests(&long).any(|r| r.is_err()));
        let mut short = b.clone();
        short[0..2].copy_from_slice(&3u16.to_le_bytes());
        assert!(requests(&short).any(|r| r.is_err()));
        let mut g = b.clone();
        g[BATCH_HEADER] = 99;
        assert!(requests(&g).any(|r| r.is_err()));
    }

    #[test]
    fn sequence_numbers_are_never_zero_and_differ_between_neighbours() {
        assert_eq!(batch_seq(0), 1);
        assert_eq!(batch_seq(65_534), 65_535);
        assert_eq!(batch_seq(65_535), 1);
        for n in [0u64, 1, 1000, 65_534, 65_535, 1 << 40, u64::MAX - 1024] {
            assert_ne!(batch_seq(n), 0);
            // A slot's previous batch (n - slots, slots <= 1024) had another number.
            for slots in [1u64, 8, 1024] {
                assert_ne!(batch_seq(n + slots), batch_seq(n), "n {n} slots {slots}");
            }
        }
        let mut b = Vec::new();
        let w = BatchWriter::new(&mut b, batch_seq(70_000), BATCH_MAX);
        let len = w.finish();
        assert_eq!(b, [4, 0, 0x72, 0x11]);
        assert_eq!(batch_header(&b).unwrap(), (len, 4466));
    }
}
