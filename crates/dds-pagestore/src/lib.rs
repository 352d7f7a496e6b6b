//! The pagestore wire protocol (`docs/pagestore-protocol.md`), the remote storage application
//! of the DDS evaluation (§8.1): framing, parsing and encoding, shared by the host server, the
//! load client and the DPU's offload app. Parsing borrows from the input and allocates nothing.

use std::ops::Range;

pub const MSG_HEADER_BYTES: usize = 8;
pub const REQ_HEADER_BYTES: usize = 32;
pub const RESP_HEADER_BYTES: usize = 24;
pub const MSG_BYTES_MAX: usize = 16 << 20;
pub const REQUESTS_PER_MSG_MAX: usize = 1024;
pub const IO_BYTES_MAX: u32 = 1 << 20;

pub const OP_READ: u8 = 1;
pub const OP_WRITE: u8 = 2;

/// Why bytes are not a valid pagestore message or response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("length {0} outside the allowed range")]
    Length(usize),
    #[error("request count {0} outside 1..={REQUESTS_PER_MSG_MAX}")]
    Count(usize),
    #[error("unknown op {0}")]
    Op(u8),
    #[error("reserved bytes or flags not zero")]
    Reserved,
    #[error("I/O length {0} above {IO_BYTES_MAX}")]
    IoLength(u32),
    #[error("message length does not match its requests")]
    Mismatch,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// Framing of the client→server stream: the length of the next message, `Ok(None)` when
/// fewer than 4 bytes are buffered.
pub fn message_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32_at(buf, 0) as usize;
    if !(MSG_HEADER_BYTES + REQ_HEADER_BYTES..=MSG_BYTES_MAX).contains(&len) {
        return Err(Malformed::Length(len));
    }
    Ok(Some(len))
}

/// Framing of the server→client stream: the length of the next response.
pub fn response_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32_at(buf, 0) as usize;
    if len < RESP_HEADER_BYTES
        || len > RESP_HEADER_BYTES + IO_BYTES_MAX as usize
        || !len.is_multiple_of(8)
    {
        return Err(Malformed::Length(len));
    }
    Ok(Some(len))
}

/// One request of a message, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub op: u8,
    pub file_id: u32,
    pub offset: u64,
    pub len: u32,
    pub req_id: u64,
    /// The whole request (header and padded data) as it appears in the message.
    pub bytes: &'a [u8],
    /// Its position in the message.
    pub at: usize,
}

impl Request<'_> {
    /// WRITE data (empty for a READ).
    pub fn data(&self) -> &[u8] {
        if self.op == OP_WRITE {
            &self.bytes[REQ_HEADER_BYTES..REQ_HEADER_BYTES + self.len as usize]
        } else {
            &[]
        }
    }

    pub fn range(&self) -> Range<usize> {
        self.at..self.at + self.bytes.len()
    }
}

/// A validated message.
#[derive(Clone, Copy, Debug)]
pub struct Message<'a> {
    bytes: &'a [u8],
    count: usize,
}

impl<'a> Message<'a> {
    /// Validates a whole message (`msg` is exactly `message_len` bytes).
    pub fn parse(msg: &'a [u8]) -> Result<Message<'a>, Malformed> {
        let len = message_len(msg)?.ok_or(Malformed::Length(msg.len()))?;
        if len != msg.len() {
            return Err(Malformed::Mismatch);
        }
        let count = u16_at(msg, 4) as usize;
        if count == 0 || count > REQUESTS_PER_MSG_MAX {
            return Err(Malformed::Count(count));
        }
        if u16_at(msg, 6) != 0 {
            return Err(Malformed::Reserved);
        }
        let m = Message { bytes: msg, count };
        let mut end = MSG_HEADER_BYTES;
        for r in m.raw_requests() {
            end = r?.range().end;
        }
        if end != msg.len() {
            return Err(Malformed::Mismatch);
        }
        Ok(m)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The requests (the message was validated, so every item parses).
    pub fn requests(&self) -> impl Iterator<Item = Request<'a>> + 'a {
        self.raw_requests().map(|r| r.expect("validated message"))
    }

    fn raw_requests(&self) -> impl Iterator<Item = Result<Request<'a>, Malformed>> + 'a {
        let bytes = self.bytes;
        let mut at = MSG_HEADER_BYTES;
        let mut left = self.count;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let r = parse_request(bytes, at);
            if let Ok(req) = &r {
                at = req.range().end;
            } else {
                left = 0;
            }
            Some(r)
        })
    }
}

/// Parses the request starting at byte `at` of a message (for walking a validated message one
/// request at a time without holding a borrow of it across calls).
pub fn request_at(msg: &[u8], at: usize) -> Result<Request<'_>, Malformed> {
    parse_request(msg, at)
}

fn parse_request(msg: &[u8], at: usize) -> Result<Request<'_>, Malformed> {
    let h = msg
        .get(at..at + REQ_HEADER_BYTES)
        .ok_or(Malformed::Mismatch)?;
    let op = h[0];
    if op != OP_READ && op != OP_WRITE {
        return Err(Malformed::Op(op));
    }
    if h[1..4] != [0, 0, 0] || u32_at(h, 20) != 0 {
        return Err(Malformed::Reserved);
    }
    let len = u32_at(h, 16);
    if len > IO_BYTES_MAX {
        return Err(Malformed::IoLength(len));
    }
    let total = REQ_HEADER_BYTES
        + if op == OP_WRITE {
            pad8(len as usize)
        } else {
            0
        };
    let bytes = msg.get(at..at + total).ok_or(Malformed::Mismatch)?;
    Ok(Request {
        op,
        file_id: u32_at(h, 4),
        offset: u64_at(h, 8),
        len,
        req_id: u64_at(h, 24),
        bytes,
        at,
    })
}

/// Builds messages. Reuse one builder to avoid allocation.
#[derive(Default)]
pub struct MessageBuilder {
    buf: Vec<u8>,
    count: u16,
}

impl MessageBuilder {
    pub fn new() -> MessageBuilder {
        let mut b = MessageBuilder::default();
        b.clear();
        b
    }

    pub fn clear(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; MSG_HEADER_BYTES]);
        self.count = 0;
    }

    pub fn count(&self) -> usize {
        self.count as usize
    }

    fn header(&mut self, op: u8, file_id: u32, offset: u64, len: u32, req_id: u64) {
        assert!((self.count as usize) < REQUESTS_PER_MSG_MAX, "message full");
        assert!(len <= IO_BYTES_MAX, "I/O too large");
        let mut h = [0u8; REQ_HEADER_BYTES];
        h[0] = op;
        h[4..8].copy_from_slice(&file_id.to_le_bytes());
        h[8..16].copy_from_slice(&offset.to_le_bytes());
        h[16..20].copy_from_slice(&len.to_le_bytes());
        h[24..32].copy_from_slice(&req_id.to_le_bytes());
        self.buf.extend_from_slice(&h);
        self.count += 1;
    }

    pub fn read(&mut self, file_id: u32, offset: u64, len: u32, req_id: u64) -> &mut Self {
        self.header(OP_READ, file_id, offset, len, req_id);
        self
    }

    pub fn write(&mut self, file_id: u32, offset: u64, data: &[u8], req_id: u64) -> &mut Self {
        self.header(OP_WRITE, file_id, offset, data.len() as u32, req_id);
        self.buf.extend_from_slice(data);
        self.buf.resize(pad8(self.buf.len()), 0);
        self
    }

    /// Appends an already-encoded request (e.g. one copied out of another message).
    pub fn push_raw(&mut self, request: &[u8]) -> &mut Self {
        assert!((self.count as usize) < REQUESTS_PER_MSG_MAX, "message full");
        self.buf.extend_from_slice(request);
        self.count += 1;
        self
    }

    /// Finishes the message: fills in the header and returns its bytes.
    pub fn finish(&mut self) -> &[u8] {
        assert!(self.count > 0, "empty message");
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_le_bytes());
        self.buf[4..6].copy_from_slice(&self.count.to_le_bytes());
        &self.buf
    }
}

/// A decoded response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    pub resp_len: u32,
    pub status: u16,
    pub op: u8,
    pub req_id: u64,
    pub len: u32,
}

/// Total bytes of a response carrying `data_len` bytes.
pub fn response_bytes(data_len: u32) -> usize {
    RESP_HEADER_BYTES + pad8(data_len as usize)
}

/// Writes a response header. For a READ, `len` data bytes (padded to 8) must follow.
pub fn encode_response_header(out: &mut [u8], status: u16, op: u8, req_id: u64, len: u32) {
    let data = if op == OP_READ { len } else { 0 };
    let total = response_bytes(data) as u32;
    out[..RESP_HEADER_BYTES].fill(0);
    out[0..4].copy_from_slice(&total.to_le_bytes());
    out[4..6].copy_from_slice(&status.to_le_bytes());
    out[6..8].copy_from_slice(&(op as u16).to_le_bytes());
    out[8..16].copy_from_slice(&req_id.to_le_bytes());
    out[16..20].copy_from_slice(&len.to_le_bytes());
}

/// Decodes a response header (`buf` holds at least the header).
pub fn parse_response_header(buf: &[u8]) -> Result<ResponseHeader, Malformed> {
    let resp_len = response_len(buf)?.ok_or(Malformed::Length(buf.len()))? as u32;
    if buf.len() < RESP_HEADER_BYTES {
        return Err(Malformed::Length(buf.len()));
    }
    let op = u16_at(buf, 6);
    if op != OP_READ as u16 && op != OP_WRITE as u16 {
        return Err(Malformed::Op(op as u8));
    }
    let len = u32_at(buf, 16);
    let expect = if op == OP_READ as u16 {
        response_bytes(len)
    } else {
        RESP_HEADER_BYTES
    };
    if expect != resp_len as usize {
        return Err(Malformed::Mismatch);
    }
    Ok(ResponseHeader {
        resp_len,
        status: u16_at(buf, 4),
        op: op as u8,
        req_id: u64_at(buf, 8),
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn build_parse_round_trip() {
        let mut b = MessageBuilder::new();
        b.read(3, 4096, 1024, 1)
            .write(3, 8192, b"hello", 2)
            .read(4, 0, 8, 3);
        let msg = b.finish().to_vec();
        assert_eq!(message_len(&msg).unwrap(), Some(msg.len()));
        let m = Message::parse(&msg).unwrap();
        let reqs: Vec<_> = m.requests().collect();
        assert_eq!(reqs.len(), 3);
        assert_eq!(
            (
                reqs[0].op,
                reqs[0].file_id,
                reqs[0].offset,
                reqs[0].len,
                reqs[0].req_id
            ),
            (OP_READ, 3, 4096, 1024, 1)
        );
        assert_eq!(reqs[1].data(), b"hello");
        assert_eq!(reqs[2].range().end, msg.len());
        // Re-assemble a host-bound message from a subset.
        let mut h = MessageBuilder::new();
        h.push_raw(reqs[1].bytes);
        let hm = h.finish().to_vec();
        let hm = Message::parse(&hm).unwrap();
        assert_eq!(hm.requests().next().unwrap().data(), b"hello");
    }

    #[test]
    fn malformed_messages() {
        let mut b = MessageBuilder::new();
        b.read(1, 0, 8, 9);
        let good = b.finish().to_vec();
        let mut bad = good.clone();
        bad[8] = 9;
        assert_eq!(Message::parse(&bad).unwrap_err(), Malformed::Op(9));
        let mut bad = good.clone();
        bad[4] = 0;
        assert_eq!(Message::parse(&bad).unwrap_err(), Malformed::Count(0));
        let mut bad = good.clone();
        bad[4] = 2;
        assert_eq!(Message::parse(&bad).unwrap_err(), Malformed::Mismatch);
        let mut bad = good.clone();
        bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(message_len(&bad), Err(Malformed::Length(_))));
        let mut bad = good;
        bad[24..28].copy_from_slice(&(IO_BYTES_MAX + 1).to_le_bytes());
        assert_eq!(
            Message::parse(&bad).unwrap_err(),
            Malformed::IoLength(IO_BYTES_MAX + 1)
        );
    }

    #[test]
    fn responses() {
        let mut r = vec![0u8; response_bytes(5)];
        encode_response_header(&mut r, 0, OP_READ, 77, 5);
        let h = parse_response_header(&r).unwrap();
        assert_eq!(
            (h.resp_len as usize, h.req_id, h.len, h.op),
            (r.len(), 77, 5, OP_READ)
        );
        let mut w = [0u8; RESP_HEADER_BYTES];
        encode_response_header(&mut w, 7, OP_WRITE, 78, 4096);
        assert_eq!(
            parse_response_header(&w).unwrap().resp_len as usize,
            RESP_HEADER_BYTES
        );
    }

    proptest! {
        #[test]
        fn parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = message_len(&bytes);
            let _ = Message::parse(&bytes);
            let _ = response_len(&bytes);
            let _ = parse_response_header(&bytes);
        }
    }
}
