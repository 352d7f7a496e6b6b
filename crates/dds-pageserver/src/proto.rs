//! The wire protocol (`docs/pageserver-protocol.md` §3–§4): framing, parsing and encoding.
//! Parsing borrows from the input and never trusts a length before its bytes arrived.

/// Message header bytes.
pub const MSG_HEADER: usize = 8;
/// Largest message.
pub const MSG_MAX: usize = 16 << 20;
/// Most requests in a message.
pub const REQUESTS_MAX: usize = 1024;
/// GetPage request bytes.
pub const GETPAGE_BYTES: usize = 32;
/// AppendWal header bytes (after the message header).
pub const APPEND_HEADER: usize = 24;
/// Log record header bytes.
pub const RECORD_HEADER: usize = 24;
/// Response header bytes.
pub const RESP_HEADER: usize = 24;

/// Message kinds.
pub const KIND_GETPAGE: u16 = 1;
/// AppendWal.
pub const KIND_APPEND: u16 = 2;
/// Watermark query.
pub const KIND_WATERMARK: u16 = 3;

/// Response statuses.
pub mod status {
    /// Done.
    pub const OK: u16 = 0;
    /// Page id beyond the database.
    pub const UNKNOWN_PAGE: u16 = 1;
    /// The log up to the not-modified-since LSN was not applied in time.
    pub const LSN_TIMEOUT: u16 = 2;
    /// The page changed after the request LSN (not sent any more: versions are kept down
    /// to the retention horizon).
    pub const OLD_VERSION: u16 = 3;
    /// Inconsistent request.
    pub const BAD_REQUEST: u16 = 4;
    /// AppendWal range below the log's end.
    pub const DUPLICATE: u16 = 5;
    /// AppendWal range above the log's end.
    pub const OUT_OF_ORDER: u16 = 6;
    /// The DPU read a page that changed under it.
    pub const RETRY: u16 = 7;
    /// Storage failed.
    pub const IO_ERROR: u16 = 8;
    /// The request LSN is below the retention horizon (in the response's LSN field).
    pub const BELOW_HORIZON: u16 = 9;
}

/// Why bytes are not a valid message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed message: {0}")]
pub struct Malformed(pub &'static str);

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The length of the message at the start of `buf` (checked against the bounds), or `None`
/// until its header arrived.
pub fn message_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < MSG_HEADER {
        return Ok(None);
    }
    let len = u32_at(buf, 0) as usize;
    let count = u16_at(buf, 4) as usize;
    let kind = u16_at(buf, 6);
    if !(MSG_HEADER + 8..=MSG_MAX).contains(&len) {
        return Err(Malformed("message length out of range"));
    }
    if count == 0 || count > REQUESTS_MAX {
        return Err(Malformed("request count out of range"));
    }
    let want = match kind {
        KIND_GETPAGE => MSG_HEADER + count * GETPAGE_BYTES,
        KIND_WATERMARK if count == 1 => MSG_HEADER + 8,
        KIND_APPEND if count == 1 => len.max(MSG_HEADER + APPEND_HEADER),
        _ => return Err(Malformed("unknown kind or count")),
    };
    if len != want {
        return Err(Malformed("length does not match the requests"));
    }
    Ok(Some(len))
}

/// The length of the response at the start of `buf`.
pub fn response_len(buf: &[u8], max: usize) -> Result<Option<usize>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32_at(buf, 0) as usize;
    if len < RESP_HEADER || len > max {
        return Err(Malformed("response length out of range"));
    }
    Ok(Some(len))
}

/// One GetPage request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GetPage {
    /// Echoed.
    pub req_id: u64,
    /// Read point.
    pub lsn: u64,
    /// Not modified since.
    pub nms: u64,
    /// Page id.
    pub page: u64,
}

/// GetPage `i` of a GetPage message (framed by [`message_len`]).
pub fn getpage(msg: &[u8], i: usize) -> GetPage {
    let b = &msg[MSG_HEADER + i * GETPAGE_BYTES..];
    GetPage {
        req_id: u64_at(b, 0),
        lsn: u64_at(b, 8),
        nms: u64_at(b, 16),
        page: u64_at(b, 24),
    }
}

/// One log record, borrowed from its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Its LSN.
    pub lsn: u64,
    /// The page it patches.
    pub page: u64,
    /// Payload offset.
    pub offset: u16,
    /// The bytes.
    pub data: &'a [u8],
}

impl Record<'_> {
    /// Bytes on the wire (and in the log file).
    pub fn wire_len(&self) -> usize {
        RECORD_HEADER + self.data.len().next_multiple_of(8)
    }

    /// Appends the wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.lsn.to_le_bytes());
        out.extend_from_slice(&self.page.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&(self.data.len() as u16).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(self.data);
        out.resize(
            out.len() + (self.data.len().next_multiple_of(8) - self.data.len()),
            0,
        );
    }
}

/// Parses the record at the start of `b`.
pub fn record(b: &[u8]) -> Result<Record<'_>, Malformed> {
    if b.len() < RECORD_HEADER {
        return Err(Malformed("truncated record"));
    }
    let len = u16_at(b, 18) as usize;
    if u32_at(b, 20) != 0 {
        return Err(Malformed("reserved bytes not zero"));
    }
    let data = b
        .get(RECORD_HEADER..RECORD_HEADER + len)
        .ok_or(Malformed("truncated record"))?;
    if b.len() < RECORD_HEADER + len.next_multiple_of(8) {
        return Err(Malformed("truncated record"));
    }
    Ok(Record {
        lsn: u64_at(b, 0),
        page: u64_at(b, 8),
        offset: u16_at(b, 16),
        data,
    })
}

/// An AppendWal message's range and records.
pub struct Append<'a> {
    /// First LSN of the range.
    pub start: u64,
    /// End of the range (exclusive).
    pub end: u64,
    /// The records' bytes.
    pub records: &'a [u8],
    /// How many.
    pub count: u32,
}

/// Parses an AppendWal message.
pub fn append(msg: &[u8]) -> Result<Append<'_>, Malformed> {
    let b = &msg[MSG_HEADER..];
    if b.len() < APPEND_HEADER {
        return Err(Malformed("truncated AppendWal"));
    }
    let a = Append {
        start: u64_at(b, 0),
        end: u64_at(b, 8),
        count: u32_at(b, 16),
        records: &b[APPEND_HEADER..],
    };
    if u32_at(b, 20) != 0 {
        return Err(Malformed("reserved bytes not zero"));
    }
    Ok(a)
}

/// Iterates over `count` records; fails on a truncated one, and on bytes after the last.
/// Every `count` (a peer's number, up to `u32::MAX`) is taken as announced.
pub fn records(b: &[u8], count: u32) -> impl Iterator<Item = Result<Record<'_>, Malformed>> {
    let mut at = 0usize;
    let mut left = count;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        if left == 0 {
            if at == b.len() {
                return None;
            }
            failed = true;
            return Some(Err(Malformed("bytes after the last record")));
        }
        left -= 1;
        match record(&b[at..]) {
            Ok(r) => {
                at += r.wire_len();
                Some(Ok(r))
            }
            Err(e) => {
                failed = true;
                Some(Err(e))
            }
        }
    })
}

/// Appends a message header for `count` requests of `kind`, with the length filled in by
/// [`finish_message`].
pub fn begin_message(out: &mut Vec<u8>, count: u16, kind: u16) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    at
}

/// Writes the length of the message that starts at `at`.
pub fn finish_message(out: &mut [u8], at: usize) {
    let len = (out.len() - at) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

/// A GetPage message.
pub fn encode_getpages(out: &mut Vec<u8>, reqs: &[GetPage]) {
    let at = begin_message(out, reqs.len() as u16, KIND_GETPAGE);
    for r in reqs {
        out.extend_from_slice(&r.req_id.to_le_bytes());
        out.extend_from_slice(&r.lsn.to_le_bytes());
        out.extend_from_slice(&r.nms.to_le_bytes());
        out.extend_from_slice(&r.page.to_le_bytes());
    }
    finish_message(out, at);
}

/// An AppendWal message.
pub fn encode_append(out: &mut Vec<u8>, start: u64, end: u64, recs: &[Record<'_>]) {
    let at = begin_message(out, 1, KIND_APPEND);
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&end.to_le_bytes());
    out.extend_from_slice(&(recs.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for r in recs {
        r.encode(out);
    }
    finish_message(out, at);
}

/// A Watermark message.
pub fn encode_watermark(out: &mut Vec<u8>, req_id: u64) {
    let at = begin_message(out, 1, KIND_WATERMARK);
    out.extend_from_slice(&req_id.to_le_bytes());
    finish_message(out, at);
}

/// A Watermark answer (§3): the log's positions and the storage the retained versions use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watermark {
    /// Every record up to it is in the pages' record chains.
    pub applied: u64,
    /// The last durable log record.
    pub durable: u64,
    /// The retention horizon: the oldest request LSN the host answers.
    pub horizon: u64,
    /// Retained versions: images in the slots of the pages read since the start, and
    /// records in the log.
    pub versions: u64,
    /// The bytes they use.
    pub bytes: u64,
}

impl Watermark {
    /// Storage per retained version, in bytes (0 with none).
    pub fn bytes_per_version(&self) -> f64 {
        if self.versions == 0 {
            return 0.0;
        }
        self.bytes as f64 / self.versions as f64
    }

    /// Asks the page server at `addr` (blocking, one connection).
    pub fn query(addr: std::net::SocketAddr) -> std::io::Result<Watermark> {
        use std::io::{Error, Read, Write};
        let mut s = std::net::TcpStream::connect(addr)?;
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
        let mut m = Vec::new();
        encode_watermark(&mut m, 1);
        s.write_all(&m)?;
        let mut b = [0u8; RESP_HEADER + 32];
        s.read_exact(&mut b[..4])?;
        if u32_at(&b, 0) as usize != b.len() {
            return Err(Error::other("a Watermark reply of another length"));
        }
        s.read_exact(&mut b[4..])?;
        if u16_at(&b, 4) != status::OK {
            return Err(Error::other(format!(
                "Watermark answered status {}",
                u16_at(&b, 4)
            )));
        }
        let at = RESP_HEADER;
        Ok(Watermark {
            applied: u64_at(&b, 16),
            durable: u64_at(&b, at),
            horizon: u64_at(&b, at + 8),
            versions: u64_at(&b, at + 16),
            bytes: u64_at(&b, at + 24),
        })
    }
}

/// A response header into `out` (24 bytes).
pub fn response_header(out: &mut [u8], len: u32, status: u16, kind: u16, req_id: u64, lsn: u64) {
    out[0..4].copy_from_slice(&len.to_le_bytes());
    out[4..6].copy_from_slice(&status.to_le_bytes());
    out[6..8].copy_from_slice(&kind.to_le_bytes());
    out[8..16].copy_from_slice(&req_id.to_le_bytes());
    out[16..24].copy_from_slice(&lsn.to_le_bytes());
}

/// A decoded response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Status.
    pub status: u16,
    /// Kind of the request.
    pub kind: u16,
    /// Echoed.
    pub req_id: u64,
    /// Page LSN (GetPage) or applied LSN (Watermark).
    pub lsn: u64,
    /// Payload.
    pub body: Vec<u8>,
}

/// Decodes a framed response.
pub fn decode_response(b: &[u8]) -> Response {
    Response {
        status: u16_at(b, 4),
        kind: u16_at(b, 6),
        req_id: u64_at(b, 8),
        lsn: u64_at(b, 16),
        body: b[RESP_HEADER..].to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_framing_is_refused() {
        let mut m = Vec::new();
        encode_getpages(
            &mut m,
            &[GetPage {
                req_id: 1,
                lsn: 9,
                nms: 5,
                page: 3,
            }],
        );
        assert_eq!(message_len(&m).unwrap(), Some(m.len()));
        assert_eq!(getpage(&m, 0).page, 3);
        let mut a = Vec::new();
        let recs = [
            Record {
                lsn: 10,
                page: 2,
                offset: 4,
                data: b"hello",
            },
            Record {
                lsn: 11,
                page: 3,
                offset: 0,
                data: b"12345678",
            },
        ];
        encode_append(&mut a, 10, 12, &recs);
        assert_eq!(message_len(&a).unwrap(), Some(a.len()));
        let p = append(&a).unwrap();
        let got: Vec<_> = records(p.records, p.count)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got, recs);
        // One record too few announced: bytes after the last record.
        assert!(records(p.records, 1).any(|r| r.is_err()));
        // One too many: truncated.
        assert!(records(p.records, 3).any(|r| r.is_err()));
        // A count that is every record and then some, as a peer may announce.
        assert!(records(p.records, u32::MAX).any(|r| r.is_err()));
        assert!(records(&[], u32::MAX).any(|r| r.is_err()));
        let mut bad = m.clone();
        bad[6] = 9;
        assert!(message_len(&bad).is_err());
        let mut bad = m.clone();
        bad[0] = 200;
        assert!(message_len(&bad).is_err());
        assert_eq!(message_len(&m[..5]).unwrap(), None);
    }
}
