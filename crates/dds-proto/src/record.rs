//! Request and response records (`docs/records.md`). Headers are encoded into and decoded
//! from byte slices in place; nothing here allocates.

use crate::Status;

pub const OP_READ: u16 = 1;
pub const OP_WRITE: u16 = 2;
pub const OP_FLUSH: u16 = 3;
/// Host → DPU cache-table items for the offload engine (`docs/consistency.md`).
pub const OP_CACHE: u16 = 4;
/// Host → DPU cache-table keys to invalidate.
pub const OP_INVALIDATE: u16 = 5;

pub const REQUEST_HEADER_BYTES: usize = 32;
/// `flags` bit of a READ or WRITE whose data lives in a registered buffer: a 16-byte buffer
/// descriptor follows the header instead of inline data (`docs/records.md`).
pub const FLAG_REGISTERED: u16 = 1;
/// Bytes of the buffer descriptor of a `REGISTERED` record.
pub const BUFFER_DESCRIPTOR_BYTES: usize = 16;
/// Total length of a `REGISTERED` record.
pub const REGISTERED_REQUEST_BYTES: usize = REQUEST_HEADER_BYTES + BUFFER_DESCRIPTOR_BYTES;
pub const RESPONSE_HEADER_BYTES: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Cache,
    Invalidate,
}

impl Op {
    pub fn code(self) -> u16 {
        match self {
            Op::Read => OP_READ,
            Op::Write => OP_WRITE,
            Op::Flush => OP_FLUSH,
            Op::Cache => OP_CACHE,
            Op::Invalidate => OP_INVALIDATE,
        }
    }

    /// Whether the record carries inline data (`bytes` of it after the header).
    pub fn carries_data(self) -> bool {
        matches!(self, Op::Write | Op::Cache | Op::Invalidate)
    }

    pub fn from_code(code: u16) -> Option<Op> {
        match code {
            OP_READ => Some(Op::Read),
            OP_WRITE => Some(Op::Write),
            OP_FLUSH => Some(Op::Flush),
            OP_CACHE => Some(Op::Cache),
            OP_INVALIDATE => Some(Op::Invalidate),
            _ => None,
        }
    }
}

/// Where a `REGISTERED` READ or WRITE moves its data: a registered buffer and an offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRef {
    pub id: u32,
    pub offset: u64,
}

impl BufferRef {
    /// The 16-byte buffer descriptor that follows the header (`docs/records.md`).
    pub fn encode(&self) -> [u8; BUFFER_DESCRIPTOR_BYTES] {
        let mut d = [0u8; BUFFER_DESCRIPTOR_BYTES];
        d[0..4].copy_from_slice(&self.id.to_le_bytes());
        d[8..16].copy_from_slice(&self.offset.to_le_bytes());
        d
    }
}

/// Decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub op: Op,
    pub request_id: u32,
    pub file_id: u32,
    pub offset: u64,
    pub bytes: u32,
    /// `Some` for a `REGISTERED` READ or WRITE: no inline data, the descriptor instead.
    pub buffer: Option<BufferRef>,
}

impl RequestHeader {
    /// Bytes that follow the header in the record: inline data or the buffer descriptor.
    pub fn body_bytes(&self) -> u32 {
        match self.buffer {
            Some(_) => BUFFER_DESCRIPTOR_BYTES as u32,
            None if self.op.carries_data() => self.bytes,
            None => 0,
        }
    }
}

/// Why a request record was rejected. The record's `len` was still sane, so the ring stays
/// usable and the request gets a `BadRequest` (or `TooLarge`) response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// `len` is not a multiple of 8, shorter than a header, or beyond the bytes available:
    /// the ring framing itself is broken and nothing after this record can be trusted.
    Framing,
    /// Unknown opcode, non-zero flags or reserved bytes, or a WRITE whose data does not fit
    /// `len`. Carries the request id so the request can be answered.
    Malformed { request_id: u32 },
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

/// Total record length of a request with `data_bytes` of inline data.
pub fn request_len(data_bytes: u32) -> u32 {
    (REQUEST_HEADER_BYTES as u32 + data_bytes).next_multiple_of(8)
}

/// Total record length of a response with a slot of `data_bytes`.
pub fn response_len(data_bytes: u32) -> u32 {
    (RESPONSE_HEADER_BYTES as u32 + data_bytes).next_multiple_of(8)
}

/// The part of a request header after the ring framing (bytes 6..32), as handed to the ring
/// producer, which writes `len` and `kind` itself.
pub fn encode_request_tail(h: &RequestHeader) -> [u8; REQUEST_HEADER_BYTES - 6] {
    let mut t = [0u8; REQUEST_HEADER_BYTES - 6];
    // offsets below are record offsets minus 6
    if h.buffer.is_some() {
        t[0..2].copy_from_slice(&FLAG_REGISTERED.to_le_bytes());
    }
    t[2..6].copy_from_slice(&h.request_id.to_le_bytes());
    t[6..10].copy_from_slice(&h.file_id.to_le_bytes());
    t[10..18].copy_from_slice(&h.offset.to_le_bytes());
    t[18..22].copy_from_slice(&h.bytes.to_le_bytes());
    t
}

/// Encodes a whole request header (framing included) into `out[..32]`, and a `REGISTERED`
/// record's buffer descriptor into `out[32..48]`.
pub fn encode_request(h: &RequestHeader, out: &mut [u8]) {
    let len = request_len(h.body_bytes());
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..6].copy_from_slice(&h.op.code().to_le_bytes());
    out[6..REQUEST_HEADER_BYTES].copy_from_slice(&encode_request_tail(h));
    if let Some(b) = h.buffer {
        out[REQUEST_HEADER_BYTES..REGISTERED_REQUEST_BYTES].copy_from_slice(&b.encode());
    }
}

/// Decodes the request record at the start of `rec` (which holds at least the whole record
/// as announced by its `len`, or fewer bytes if the framing is broken).
pub fn decode_request(rec: &[u8]) -> Result<RequestHeader, RecordError> {
    if rec.len() < REQUEST_HEADER_BYTES {
        return Err(RecordError::Framing);
    }
    let len = u32_at(rec, 0) as usize;
    if len < REQUEST_HEADER_BYTES || !len.is_multiple_of(8) || len > rec.len() {
        return Err(RecordError::Framing);
    }
    let request_id = u32_at(rec, 8);
    let malformed = RecordError::Malformed { request_id };
    let op = Op::from_code(u16_at(rec, 4)).ok_or(malformed)?;
    let flags = u16_at(rec, 6);
    if (flags != 0 && flags != FLAG_REGISTERED) || u32_at(rec, 28) != 0 {
        return Err(malformed);
    }
    let mut h = RequestHeader {
        op,
        request_id,
        file_id: u32_at(rec, 12),
        offset: u64_at(rec, 16),
        bytes: u32_at(rec, 24),
        buffer: None,
    };
    if flags == FLAG_REGISTERED {
        if !matches!(op, Op::Read | Op::Write)
            || len != REGISTERED_REQUEST_BYTES
            || u32_at(rec, 36) != 0
        {
            return Err(malformed);
        }
        h.buffer = Some(BufferRef {
            id: u32_at(rec, 32),
            offset: u64_at(rec, 40),
        });
        return Ok(h);
    }
    match op {
        _ if op.carries_data() && request_len(h.bytes) as usize != len => Err(malformed),
        Op::Read | Op::Flush if len != REQUEST_HEADER_BYTES => Err(malformed),
        Op::Flush if h.bytes != 0 => Err(malformed),
        _ => Ok(h),
    }
}

/// Decoded response header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHeader {
    pub kind: u16,
    /// Raw status; `Status::PENDING` while the I/O is in flight.
    pub status: u16,
    pub request_id: u32,
    pub bytes: u32,
}

/// Writes a response header (framing included) into `out[..16]`.
pub fn encode_response(len: u32, h: &ResponseHeader, out: &mut [u8]) {
    debug_assert!(len as usize >= RESPONSE_HEADER_BYTES && len.is_multiple_of(8));
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..6].copy_from_slice(&h.kind.to_le_bytes());
    out[6..8].copy_from_slice(&h.status.to_le_bytes());
    out[8..12].copy_from_slice(&h.request_id.to_le_bytes());
    out[12..16].copy_from_slice(&h.bytes.to_le_bytes());
}

/// Updates status and byte count of an encoded response header in place.
pub fn complete_response(out: &mut [u8], status: Status, bytes: u32) {
    out[6..8].copy_from_slice(&status.code().to_le_bytes());
    out[12..16].copy_from_slice(&bytes.to_le_bytes());
}

pub fn decode_response(rec: &[u8]) -> Option<ResponseHeader> {
    if rec.len() < RESPONSE_HEADER_BYTES {
        return None;
    }
    let len = u32_at(rec, 0) as usize;
    if len < RESPONSE_HEADER_BYTES || !len.is_multiple_of(8) || len > rec.len() {
        return None;
    }
    Some(ResponseHeader {
        kind: u16_at(rec, 4),
        status: u16_at(rec, 6),
        request_id: u32_at(rec, 8),
        bytes: u32_at(rec, 12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Read),
            Just(Op::Write),
            Just(Op::Flush),
            Just(Op::Cache),
            Just(Op::Invalidate)
        ]
    }

    proptest! {
        #[test]
        fn request_round_trip(op in op_strategy(), id: u32, file: u32, offset: u64, bytes in 0u32..100_000) {
            let bytes = if op == Op::Flush { 0 } else { bytes };
            let h = RequestHeader { op, request_id: id, file_id: file, offset, bytes, buffer: None };
            let len = request_len(if op.carries_data() { bytes } else { 0 }) as usize;
            let mut rec = vec![0u8; len];
            encode_request(&h, &mut rec);
            prop_assert_eq!(decode_request(&rec), Ok(h));
        }

        #[test]
        fn registered_round_trip(read: bool, id: u32, file: u32, offset: u64, bytes: u32, buf_id: u32, buf_off: u64) {
            let op = if read { Op::Read } else { Op::Write };
            let buffer = Some(BufferRef { id: buf_id, offset: buf_off });
            let h = RequestHeader { op, request_id: id, file_id: file, offset, bytes, buffer };
            let mut rec = [0u8; REGISTERED_REQUEST_BYTES];
            encode_request(&h, &mut rec);
            prop_assert_eq!(u32_at(&rec, 0) as usize, REGISTERED_REQUEST_BYTES);
            prop_assert_eq!(decode_request(&rec), Ok(h));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode_request(&bytes);
            let _ = decode_response(&bytes);
        }
    }

    #[test]
    fn zero_byte_write_is_a_write() {
        let h = RequestHeader {
            op: Op::Write,
            request_id: 7,
            file_id: 1,
            offset: 0,
            bytes: 0,
            buffer: None,
        };
        let mut rec = [0u8; 32];
        encode_request(&h, &mut rec);
        assert_eq!(decode_request(&rec).unwrap().op, Op::Write);
    }

    #[test]
    fn malformed_records_are_classified() {
        let h = RequestHeader {
            op: Op::Read,
            request_id: 9,
            file_id: 1,
            offset: 0,
            bytes: 4,
            buffer: None,
        };
        let mut rec = [0u8; 32];
        encode_request(&h, &mut rec);
        let mut bad_op = rec;
        bad_op[4] = 77;
        assert_eq!(
            decode_request(&bad_op),
            Err(RecordError::Malformed { request_id: 9 })
        );
        let mut bad_len = rec;
        bad_len[0] = 12;
        assert_eq!(decode_request(&bad_len), Err(RecordError::Framing));
        let mut bad_flags = rec;
        bad_flags[6] = 1;
        assert_eq!(
            decode_request(&bad_flags),
            Err(RecordError::Malformed { request_id: 9 })
        );
        // A WRITE announcing more data than the record holds.
        let w = RequestHeader {
            op: Op::Write,
            request_id: 3,
            file_id: 1,
            offset: 0,
            bytes: 64,
            buffer: None,
        };
        let mut wrec = [0u8; 40];
        encode_request(&w, &mut wrec);
        wrec[0..4].copy_from_slice(&40u32.to_le_bytes());
        assert_eq!(
            decode_request(&wrec),
            Err(RecordError::Malformed { request_id: 3 })
        );
    }

    #[test]
    fn malformed_registered_records_are_rejected() {
        let h = RequestHeader {
            op: Op::Write,
            request_id: 4,
            file_id: 1,
            offset: 0,
            bytes: 4096,
            buffer: Some(BufferRef { id: 2, offset: 0 }),
        };
        let mut rec = [0u8; REGISTERED_REQUEST_BYTES];
        encode_request(&h, &mut rec);
        assert_eq!(decode_request(&rec), Ok(h));
        let bad = RecordError::Malformed { request_id: 4 };
        // Registered FLUSH / CACHE.
        for op in [OP_FLUSH, OP_CACHE] {
            let mut r = rec;
            r[4..6].copy_from_slice(&op.to_le_bytes());
            assert_eq!(decode_request(&r), Err(bad));
        }
        // Reserved word of the descriptor.
        let mut r = rec;
        r[36] = 1;
        assert_eq!(decode_request(&r), Err(bad));
        // Unknown flag bits.
        let mut r = rec;
        r[6] = 3;
        assert_eq!(decode_request(&r), Err(bad));
        // A registered record of the wrong length (descriptor missing).
        let mut r = [0u8; 40];
        r.copy_from_slice(&rec[..40]);
        r[0..4].copy_from_slice(&40u32.to_le_bytes());
        assert_eq!(decode_request(&r), Err(bad));
    }

    #[test]
    fn response_round_trip_and_completion() {
        let h = ResponseHeader {
            kind: OP_READ,
            status: Status::PENDING,
            request_id: 5,
            bytes: 0,
        };
        let mut rec = [0u8; 24];
        encode_response(24, &h, &mut rec);
        assert_eq!(decode_response(&rec), Some(h));
        complete_response(&mut rec, Status::Ok, 8);
        let d = decode_response(&rec).unwrap();
        assert_eq!((d.status, d.bytes), (0, 8));
    }
}
