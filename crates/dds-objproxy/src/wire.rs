//! The formats of `docs/objproxy.md`: the region layout, transfer/ACK/read headers, control
//! frames and wire errors. Shared by both halves (and by tests that play a raw DPU).

use std::io::{self, Read};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use dds_objstore::StoreError;
use dds_sys::{recv_with_fds, send_with_fds};

/// Protocol version of ATTACH.
pub const VERSION: u32 = 2;
/// Slots per ring (request, ACK, response).
pub const SLOTS: u64 = 3;
/// Bytes of an ACK slot.
pub const ACK_SLOT: u64 = 24576;
/// Offset of the statuses' error area in an ACK slot.
pub const ACK_ERR_AREA: u64 = 64 + 4 * MAX_BATCH as u64;
/// Most transactions in one batch.
pub const MAX_BATCH: usize = 1024;
/// Bytes of a header line.
pub const HDR: u64 = 64;
/// Offset of the DPU line in a channel.
pub const DPU_LINE: u64 = 64;
/// Offset of the read request slots in a channel.
pub const READ_REQ: u64 = 128;
/// Bytes of a read request slot.
pub const READ_REQ_BYTES: u64 = 4224;
/// Offset of the ACK slots in a channel.
pub const ACK_BASE: u64 = READ_REQ + SLOTS * READ_REQ_BYTES;
/// Longest error message carried in an ACK record.
pub const MAX_ERR_MSG: usize = 256;
/// Largest control request frame.
pub const MAX_REQUEST: usize = 1 << 20;
/// Largest control response frame.
pub const MAX_RESPONSE: usize = 64 << 20;
/// Results a host channel remembers for duplicate transactions.
pub const RESULT_WINDOW: u64 = 1024;

/// Transfer kinds.
pub const KIND_BATCH: u32 = 1;
pub const KIND_CHUNK: u32 = 2;

/// Control-line word offsets.
pub const CTL_CONSUMED: u64 = 0;
pub const CTL_STATE: u64 = 8;
pub const CTL_REASON: u64 = 16;
pub const CTL_R_TAKEN: u64 = 24;
/// Non-zero (the park's epoch) while the channel's host worker is parked or about to park.
pub const CTL_SLEEP: u64 = 32;
/// Bytes of the control line the DPU reads: consumed, state, reason, r_taken, sleep.
pub const CTL_READ: usize = 40;
/// Most channels of a session: the ATTACH reply carries the region and one doorbell per
/// channel in one `SCM_RIGHTS` message.
pub const MAX_CHANNELS: u32 = dds_sys::MAX_FDS as u32 - 1;

/// Reasons a host closes a channel.
pub const REASON_HEADER: u64 = 1;
pub const REASON_BATCH: u64 = 2;
pub const REASON_CHUNK: u64 = 3;
pub const REASON_READ: u64 = 4;

/// Control functions.
pub const F_ATTACH: u8 = 1;
pub const F_STAT: u8 = 2;
pub const F_GETXATTR: u8 = 3;
pub const F_GETXATTRS: u8 = 4;
pub const F_OMAP_GET: u8 = 5;
pub const F_OMAP_LIST: u8 = 6;
pub const F_LIST: u8 = 7;
pub const F_STATFS: u8 = 8;

/// Wire-error code of a duplicate whose result fell out of the window.
pub const CODE_DUP_UNKNOWN: u32 = 7;

/// Why a closed channel was closed, for messages.
pub fn reason_text(r: u64) -> &'static str {
    match r {
        REASON_HEADER => "bad transfer header",
        REASON_BATCH => "bad batch",
        REASON_CHUNK => "bad chunk",
        REASON_READ => "bad read request",
        _ => "unknown reason",
    }
}

/// Rounds up to a multiple of 8.
pub fn align8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// The geometry of a session's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub channels: u32,
    pub max_dma: u32,
}

impl Layout {
    /// Checks the numbers (they cross the socket).
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return Err(format!("{} channels (1..={MAX_CHANNELS})", self.channels));
        }
        let m = self.max_dma;
        if !(64 << 10..=16 << 20).contains(&m) || !m.is_multiple_of(4096) {
            return Err(format!(
                "max DMA size {m} (a multiple of 4096 in 64 KiB..=16 MiB)"
            ));
        }
        Ok(())
    }

    /// Payload capacity of a transfer or response chunk.
    pub fn payload_cap(&self) -> u64 {
        self.max_dma as u64 - HDR - 8
    }

    /// Offset of the request slots in a channel.
    pub fn req_base(&self) -> u64 {
        (ACK_BASE + SLOTS * ACK_SLOT).div_ceil(4096) * 4096
    }

    /// Offset of the response slots in a channel.
    pub fn resp_base(&self) -> u64 {
        self.req_base() + SLOTS * self.max_dma as u64
    }

    /// Bytes of a channel.
    pub fn channel_bytes(&self) -> u64 {
        self.req_base() + 2 * SLOTS * self.max_dma as u64
    }

    /// Bytes of the region.
    pub fn region_len(&self) -> u64 {
        self.channels as u64 * self.channel_bytes()
    }

    /// Offset of channel `c`.
    pub fn channel(&self, c: u32) -> u64 {
        c as u64 * self.channel_bytes()
    }

    /// Offset (in a channel) of the request slot of transfer `seq`.
    pub fn req_slot(&self, seq: u64) -> u64 {
        self.req_base() + ((seq - 1) % SLOTS) * self.max_dma as u64
    }

    /// Offset (in a channel) of the read request slot of read request `rseq`.
    pub fn read_req_slot(&self, rseq: u64) -> u64 {
        READ_REQ + ((rseq - 1) % SLOTS) * READ_REQ_BYTES
    }

    /// Offset (in a channel) of the ACK slot of transfer `seq`.
    pub fn ack_slot(&self, seq: u64) -> u64 {
        ACK_BASE + ((seq - 1) % SLOTS) * ACK_SLOT
    }

    /// Offset (in a channel) of the response slot of chunk `cseq`.
    pub fn resp_slot(&self, cseq: u64) -> u64 {
        self.resp_base() + ((cseq - 1) % SLOTS) * self.max_dma as u64
    }
}

/// A write-lane transfer header (64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferHeader {
    pub seq: u64,
    pub kind: u32,
    pub payload_len: u32,
    pub req_id: u64,
    /// BATCH: count; CHUNK: index.
    pub a: u32,
    /// CHUNK: total.
    pub b: u32,
    /// CHUNK: offset.
    pub offset: u64,
    /// CHUNK: transaction length.
    pub tx_len: u64,
}

impl TransferHeader {
    pub fn encode(&self, out: &mut [u8]) {
        out[..64].fill(0);
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..12].copy_from_slice(&self.kind.to_le_bytes());
        out[12..16].copy_from_slice(&self.payload_len.to_le_bytes());
        out[16..24].copy_from_slice(&self.req_id.to_le_bytes());
        out[24..28].copy_from_slice(&self.a.to_le_bytes());
        out[28..32].copy_from_slice(&self.b.to_le_bytes());
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..48].copy_from_slice(&self.tx_len.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> TransferHeader {
        TransferHeader {
            seq: le64(&b[0..]),
            kind: le32(&b[8..]),
            payload_len: le32(&b[12..]),
            req_id: le64(&b[16..]),
            a: le32(&b[24..]),
            b: le32(&b[28..]),
            offset: le64(&b[32..]),
            tx_len: le64(&b[40..]),
        }
    }
}

/// A read request (header fields; the name follows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadHeader {
    pub rseq: u64,
    pub req_id: u64,
    pub pool: u64,
    pub offset: u64,
    pub len: u64,
    pub name_len: u32,
    pub window: u32,
}

impl ReadHeader {
    pub fn encode(&self, out: &mut [u8]) {
        out[..64].fill(0);
        out[0..8].copy_from_slice(&self.rseq.to_le_bytes());
        out[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.pool.to_le_bytes());
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
        out[32..40].copy_from_slice(&self.len.to_le_bytes());
        out[40..44].copy_from_slice(&self.name_len.to_le_bytes());
        out[44..48].copy_from_slice(&self.window.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> ReadHeader {
        ReadHeader {
            rseq: le64(&b[0..]),
            req_id: le64(&b[8..]),
            pool: le64(&b[16..]),
            offset: le64(&b[24..]),
            len: le64(&b[32..]),
            name_len: le32(&b[40..]),
            window: le32(&b[44..]),
        }
    }
}

/// A response chunk header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespHeader {
    pub cseq: u64,
    pub req_id: u64,
    pub status: u32,
    pub payload_len: u32,
    pub index: u32,
    pub total: u32,
    pub offset: u64,
    pub data_len: u64,
}

impl RespHeader {
    pub fn encode(&self, out: &mut [u8]) {
        out[..64].fill(0);
        out[0..8].copy_from_slice(&self.cseq.to_le_bytes());
        out[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.status.to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_len.to_le_bytes());
        out[24..28].copy_from_slice(&self.index.to_le_bytes());
        out[28..32].copy_from_slice(&self.total.to_le_bytes());
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..48].copy_from_slice(&self.data_len.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> RespHeader {
        RespHeader {
            cseq: le64(&b[0..]),
            req_id: le64(&b[8..]),
            status: le32(&b[16..]),
            payload_len: le32(&b[20..]),
            index: le32(&b[24..]),
            total: le32(&b[28..]),
            offset: le64(&b[32..]),
            data_len: le64(&b[40..]),
        }
    }
}

pub fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

pub fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

/// A bounds-checked reader of wire bytes (never panics; `None` when the input is short).
pub struct Cursor<'a> {
    pub buf: &'a [u8],
    pub at: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, at: 0 }
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.buf.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(le32)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.take(8).map(le64)
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    pub fn opt_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        match self.u8()? {
            0 => Some(None),
            1 => self.bytes().map(Some),
            _ => None,
        }
    }

    pub fn done(&self) -> bool {
        self.at == self.buf.len()
    }
}

pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    put_u32(out, v.len() as u32);
    out.extend_from_slice(v);
}

pub fn put_opt_bytes(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

/// The wire code and fields of a store error.
pub fn error_parts(e: &StoreError) -> (u32, u64, u64, Vec<u8>) {
    match e {
        StoreError::NotFound(m) => (1, 0, 0, m.as_bytes().to_vec()),
        StoreError::NoSpace { needed, free } => (2, *needed, *free, Vec::new()),
        StoreError::InvalidArgument(m) => (3, 0, 0, m.as_bytes().to_vec()),
        StoreError::Corrupt {
            pool,
            name,
            offset,
            detail,
        } => {
            let mut m = name.as_bytes().to_vec();
            m.push(0);
            m.extend_from_slice(detail.as_bytes());
            (4, *pool, *offset, m)
        }
        StoreError::AlreadyFormatted(p) => (5, 0, 0, p.to_string_lossy().as_bytes().to_vec()),
        StoreError::Io { what, source } => (6, 0, 0, format!("{what}: {source}").into_bytes()),
    }
}

/// A store error from its wire code and fields.
pub fn error_from_parts(code: u32, a: u64, b: u64, msg: &[u8]) -> StoreError {
    let s = String::from_utf8_lossy(msg).into_owned();
    match code {
        1 => StoreError::NotFound(s),
        2 => StoreError::NoSpace { needed: a, free: b },
        3 => StoreError::InvalidArgument(s),
        4 => {
            let (name, detail) = s.split_once('\0').unwrap_or((&s, ""));
            StoreError::Corrupt {
                pool: a,
                name: name.to_string(),
                offset: b,
                detail: detail.to_string(),
            }
        }
        5 => StoreError::AlreadyFormatted(s.into()),
        CODE_DUP_UNKNOWN => proxy_error(format!(
            "a retransmitted transaction's result is no longer known {s}"
        )),
        _ => StoreError::Io {
            what: "host object store".into(),
            source: io::Error::other(s),
        },
    }
}

/// Appends a wire error.
pub fn put_error(out: &mut Vec<u8>, e: &StoreError) {
    let (code, a, b, msg) = error_parts(e);
    put_u32(out, code);
    put_u64(out, a);
    put_u64(out, b);
    put_bytes(out, &msg);
}

/// Reads a wire error.
pub fn get_error(c: &mut Cursor<'_>) -> Option<StoreError> {
    let code = c.u32()?;
    let a = c.u64()?;
    let b = c.u64()?;
    let msg = c.bytes()?;
    Some(error_from_parts(code, a, b, msg))
}

/// An error of the proxy itself (transport, protocol), as the store's `Io`.
pub fn proxy_error(msg: impl Into<String>) -> StoreError {
    StoreError::Io {
        what: "object proxy".into(),
        source: io::Error::other(msg.into()),
    }
}

/// A received frame: head byte (function or status), id, body, descriptors.
pub type Frame = (u8, u64, Vec<u8>, Vec<OwnedFd>);

/// Sends one frame (`head` byte, id, body) with optional descriptors.
pub fn send_frame(
    s: &UnixStream,
    head: u8,
    id: u64,
    body: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    let mut f = Vec::with_capacity(13 + body.len());
    put_u32(&mut f, (9 + body.len()) as u32);
    f.push(head);
    put_u64(&mut f, id);
    f.extend_from_slice(body);
    send_with_fds(s, &f, fds)
}

/// Receives one frame: `(head byte, id, body, descriptors)`; `Ok(None)` at end of stream
/// before a frame. The announced length is checked against `max` before anything is allocated.
pub fn recv_frame(s: &mut UnixStream, max: usize) -> io::Result<Option<Frame>> {
    let mut len = [0u8; 4];
    let mut fds = Vec::new();
    let n = recv_with_fds(s, &mut len, &mut fds)?;
    if n == 0 {
        return Ok(None);
    }
    if n < 4 {
        s.read_exact(&mut len[n..])?;
    }
    let len = u32::from_le_bytes(len) as usize;
    if !(9..=max).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("control frame of {len} bytes refused"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    let head = body[0];
    let id = le64(&body[1..9]);
    body.drain(..9);
    Ok(Some((head, id, body, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_numbers() {
        let l = Layout {
            channels: 2,
            max_dma: 2 << 20,
        };
        l.validate().unwrap();
        assert_eq!(ACK_BASE, 12800);
        assert_eq!(l.req_base(), 90112);
        assert_eq!(l.payload_cap(), (2 << 20) - 72);
        assert_eq!(l.channel_bytes(), 90112 + 6 * (2 << 20));
        assert_eq!(l.req_slot(4), l.req_slot(1));
        assert_eq!(l.read_req_slot(1), READ_REQ);
        assert_eq!(l.read_req_slot(6), READ_REQ + 2 * READ_REQ_BYTES);
        const { assert!(ACK_ERR_AREA < ACK_SLOT) };
    }

    #[test]
    fn errors_round_trip() {
        let e = StoreError::Corrupt {
            pool: 3,
            name: "x".into(),
            offset: 4096,
            detail: "crc".into(),
        };
        let mut b = Vec::new();
        put_error(&mut b, &e);
        let back = get_error(&mut Cursor::new(&b)).unwrap();
        assert_eq!(back.to_string(), e.to_string());
        assert!(get_error(&mut Cursor::new(&b[..b.len() - 1])).is_none());
    }
}
