//! A small log-structured key-value app: the host keeps the index and appends values to a log
//! file through DDS; the DPU serves GETs whose key's current location is in the cache table.
//! Used to test the consistency contract (`docs/consistency.md`).
//!
//! Wire format (little-endian). A message: `msg_len u32, count u16, flags u16 = 0`, then
//! `count` requests of a 24-byte header `op u8 (1 GET, 2 PUT), reserved [u8; 3], vlen u32,
//! key u64, req_id u64`, followed for a PUT by `vlen` value bytes padded to 8. A response:
//! `resp_len u32, status u16, op u16, req_id u64, vlen u32, reserved u32`, then the value
//! padded to 8 (GET). Status 3 = not found.
//!
//! Log record (what the host writes to the log file, whole records only): `key u64,
//! vlen u32, magic u32 = KV_MAGIC`, then the value padded to 8. Cache-on-write parses the
//! records of a log write and maps each key to its value's location.

use dds_cache::CacheItem;
use dds_offload_api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult, ReqDesc,
    ReqList, ResponseLayout,
};
use dds_proto::Status;

/// GET opcode.
pub const KV_GET: u8 = 1;
/// PUT opcode.
pub const KV_PUT: u8 = 2;
/// Message header bytes.
pub const KV_MSG_HEADER: usize = 8;
/// Request header bytes.
pub const KV_REQ_HEADER: usize = 24;
/// Response header bytes.
pub const KV_RESP_HEADER: usize = 24;
/// Largest value.
pub const KV_VALUE_MAX: u32 = 64 << 10;
/// Most requests per message.
pub const KV_REQUESTS_MAX: usize = 256;
/// Largest message.
pub const KV_MSG_MAX: usize = 4 << 20;
/// Log record header bytes.
pub const KV_RECORD_HEADER: usize = 16;
/// Log record magic.
pub const KV_MAGIC: u32 = 0x4b56_4c47;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// One KV request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvRequest {
    /// GET or PUT.
    pub op: u8,
    /// Key.
    pub key: u64,
    /// Value bytes (PUT).
    pub vlen: u32,
    /// Client's id.
    pub req_id: u64,
    /// Bytes in the message.
    pub size: usize,
}

/// Parses the request at `at`.
pub fn kv_parse_request(msg: &[u8], at: usize) -> Result<KvRequest, Malformed> {
    let h = msg
        .get(at..at.saturating_add(KV_REQ_HEADER))
        .ok_or(Malformed("request runs past the message"))?;
    let op = h[0];
    if op != KV_GET && op != KV_PUT {
        return Err(Malformed("unknown op"));
    }
    if h[1..4] != [0, 0, 0] {
        return Err(Malformed("reserved bytes not zero"));
    }
    let vlen = u32_at(h, 4);
    if vlen > KV_VALUE_MAX || (op == KV_GET && vlen != 0) {
        return Err(Malformed("bad value length"));
    }
    let size = KV_REQ_HEADER + pad8(vlen as usize);
    if at + size > msg.len() {
        return Err(Malformed("request runs past the message"));
    }
    Ok(KvRequest {
        op,
        key: u64_at(h, 8),
        vlen,
        req_id: u64_at(h, 16),
        size,
    })
}

/// Framing of the client stream.
pub fn kv_message_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let n = u32_at(buf, 0) as usize;
    if !(KV_MSG_HEADER + KV_REQ_HEADER..=KV_MSG_MAX).contains(&n) {
        return Err(Malformed("message length out of range"));
    }
    Ok(Some(n))
}

/// Framing of the response stream.
pub fn kv_response_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let n = u32_at(buf, 0) as usize;
    if n < KV_RESP_HEADER || n > KV_RESP_HEADER + KV_VALUE_MAX as usize || !n.is_multiple_of(8) {
        return Err(Malformed("response length out of range"));
    }
    Ok(Some(n))
}

/// Validates a message, calling `f(pos, offset, request)` per request.
pub fn kv_for_each(
    msg: &[u8],
    mut f: impl FnMut(u32, usize, &KvRequest) -> Result<(), Malformed>,
) -> Result<usize, Malformed> {
    if kv_message_len(msg)? != Some(msg.len()) {
        return Err(Malformed("message length does not match"));
    }
    let count = u16::from_le_bytes([msg[4], msg[5]]) as usize;
    if count == 0 || count > KV_REQUESTS_MAX || msg[6] != 0 || msg[7] != 0 {
        return Err(Malformed("bad count or flags"));
    }
    let mut at = KV_MSG_HEADER;
    for pos in 0..count {
        let r = kv_parse_request(msg, at)?;
        f(pos as u32, at, &r)?;
        at += r.size;
    }
    if at != msg.len() {
        return Err(Malformed("message length does not match its requests"));
    }
    Ok(count)
}

/// Writes a response header into `out[..24]`.
pub fn kv_encode_response(out: &mut [u8], status: u16, op: u8, req_id: u64, vlen: u32) {
    let data = if op == KV_GET && status == 0 { vlen } else { 0 };
    out[..KV_RESP_HEADER].fill(0);
    out[0..4].copy_from_slice(&((KV_RESP_HEADER + pad8(data as usize)) as u32).to_le_bytes());
    out[4..6].copy_from_slice(&status.to_le_bytes());
    out[6..8].copy_from_slice(&u16::from(op).to_le_bytes());
    out[8..16].copy_from_slice(&req_id.to_le_bytes());
    out[16..20].copy_from_slice(&vlen.to_le_bytes());
}

/// Encodes a log record for `key` and `value` (appends to `out`).
pub fn kv_encode_record(out: &mut Vec<u8>, key: u64, value: &[u8]) {
    out.extend_from_slice(&key.to_le_bytes());
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(&KV_MAGIC.to_le_bytes());
    out.extend_from_slice(value);
    out.resize(pad8(out.len()), 0);
}

/// Builds KV messages (clients and tests).
#[derive(Default, Debug)]
pub struct KvMessageBuilder {
    buf: Vec<u8>,
    count: u16,
}

impl KvMessageBuilder {
    /// An empty message.
    pub fn new() -> Self {
        let mut b = KvMessageBuilder::default();
        b.clear();
        b
    }
    /// Starts over.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.buf.extend_from_slice(&[0u8; KV_MSG_HEADER]);
        self.count = 0;
    }
    fn header(&mut self, op: u8, key: u64, vlen: u32, req_id: u64) {
        let mut h = [0u8; KV_REQ_HEADER];
        h[0] = op;
        h[4..8].copy_from_slice(&vlen.to_le_bytes());
        h[8..16].copy_from_slice(&key.to_le_bytes());
        h[16..24].copy_from_slice(&req_id.to_le_bytes());
        self.buf.extend_from_slice(&h);
        self.count += 1;
    }
    /// Adds a GET.
    pub fn get(&mut self, key: u64, req_id: u64) -> &mut Self {
        self.header(KV_GET, key, 0, req_id);
        self
    }
    /// Adds a PUT.
    pub fn put(&mut self, key: u64, value: &[u8], req_id: u64) -> &mut Self {
        self.header(KV_PUT, key, value.len() as u32, req_id);
        self.buf.extend_from_slice(value);
        self.buf.resize(pad8(self.buf.len()), 0);
        self
    }
    /// The finished message.
    pub fn finish(&mut self) -> &[u8] {
        let n = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&n.to_le_bytes());
        self.buf[4..6].copy_from_slice(&self.count.to_le_bytes());
        &self.buf
    }
}

/// The KV offload app.
#[derive(Clone, Copy, Debug, Default)]
pub struct KvApp;

impl OffloadApp for KvApp {
    fn name(&self) -> &str {
        "kv"
    }

    fn offloaded_request(&self) -> &str {
        "KV GET"
    }

    fn max_message_len(&self) -> usize {
        KV_MSG_MAX
    }
    fn max_response_len(&self) -> usize {
        KV_RESP_HEADER + KV_VALUE_MAX as usize
    }
    fn max_requests(&self) -> usize {
        KV_REQUESTS_MAX
    }
    fn max_forward_keys(&self) -> usize {
        KV_REQUESTS_MAX
    }
    fn max_write_items(&self) -> usize {
        // Each record is at least 16 bytes; log writes are at most 1 MiB.
        (1 << 20) / KV_RECORD_HEADER
    }
    fn max_read_keys(&self) -> usize {
        1
    }
    fn header_room(&self) -> usize {
        KV_RESP_HEADER
    }
    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        kv_message_len(buf)
    }
    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        kv_response_len(buf)
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        kv_for_each(msg, |pos, at, r| {
            let d = ReqDesc {
                offset: at as u32,
                len: r.size as u32,
                pos,
            };
            let list = if r.op == KV_GET && cache.get(r.key).is_some() {
                &mut *dpu
            } else {
                &mut *host
            };
            list.push(d).map_err(|_| Malformed("too many requests"))
        })?;
        Ok(())
    }

    fn offload_function(&self, msg: &[u8], req: ReqDesc, cache: &CacheView<'_>) -> Offload {
        let Ok(r) = kv_parse_request(msg, req.offset as usize) else {
            return Offload::Host;
        };
        if r.op != KV_GET {
            return Offload::Host;
        }
        match cache.get(r.key) {
            Some(it) => Offload::Read(ReadOp {
                file_id: it.file_id,
                offset: it.offset,
                size: it.size,
            }),
            None => Offload::Host,
        }
    }

    fn build_response(
        &self,
        req_head: &[u8],
        op: &ReadOp,
        result: ReadResult,
        room: &mut [u8],
        data: &mut [u8],
    ) -> Result<ResponseLayout, Malformed> {
        if req_head.len() < KV_REQ_HEADER || room.len() < KV_RESP_HEADER {
            return Err(Malformed("request head or header room too short"));
        }
        let req_id = u64_at(req_head, 16);
        let (st, n) = match result {
            Ok(n) if n == op.size => (Status::Ok.code(), n as usize),
            // A short read means the log does not hold the whole value: report an I/O error.
            Ok(_) => (Status::Io.code(), 0),
            Err(code) => (code, 0),
        };
        let padded = pad8(n);
        if padded > data.len() {
            return Err(Malformed("value larger than its buffer"));
        }
        data[n..padded].fill(0);
        let at = room.len() - KV_RESP_HEADER;
        kv_encode_response(&mut room[at..], st, KV_GET, req_id, n as u32);
        Ok(ResponseLayout {
            header_len: KV_RESP_HEADER as u32,
            total_len: (KV_RESP_HEADER + padded) as u32,
        })
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        let mut at = KV_MSG_HEADER;
        for d in host {
            let src = msg
                .get(d.offset as usize..d.offset as usize + d.len as usize)
                .ok_or(Malformed("descriptor outside message"))?;
            out.get_mut(at..at + src.len())
                .ok_or(Malformed("host message too large"))?
                .copy_from_slice(src);
            at += src.len();
        }
        if host.is_empty() {
            return Err(Malformed("empty host message"));
        }
        out[0..4].copy_from_slice(&(at as u32).to_le_bytes());
        out[4..6].copy_from_slice(&(host.len() as u16).to_le_bytes());
        out[6..8].fill(0);
        Ok(at)
    }

    fn invalidate_on_forward(&self, msg: &[u8], req: ReqDesc, keys: &mut KeyList) {
        if let Ok(r) = kv_parse_request(msg, req.offset as usize) {
            if r.op == KV_PUT {
                let _ = keys.push(r.key);
            }
        }
    }

    fn cache_on_write(&self, file_id: u32, offset: u64, data: &[u8], items: &mut ItemList) {
        let mut at = 0usize;
        while at + KV_RECORD_HEADER <= data.len() {
            if u32_at(data, at + 12) != KV_MAGIC {
                return;
            }
            let key = u64_at(data, at);
            let vlen = u32_at(data, at + 8);
            let end = at + KV_RECORD_HEADER + pad8(vlen as usize);
            if vlen > KV_VALUE_MAX || end > data.len() {
                return;
            }
            let item = CacheItem::new(
                key,
                0,
                file_id,
                offset + (at + KV_RECORD_HEADER) as u64,
                vlen,
            );
            if items.push(item).is_err() {
                return;
            }
            at = end;
        }
    }

    fn invalidate_on_read(&self, _file_id: u32, _offset: u64, _len: u32, _keys: &mut KeyList) {
        // The host never modifies a value it read: log records are immutable.
    }
}
