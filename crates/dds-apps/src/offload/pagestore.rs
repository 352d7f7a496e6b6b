//! The built-in offload app for the pagestore protocol (`docs/pagestore-protocol.md`).
//!
//! READs are offloaded: the offload function maps a request straight to a file read (like a
//! DBMS page id). WRITEs go to the host. Per-page cache entries (key = file id and page
//! number) record pages whose current contents are on the device: cache-on-write inserts them
//! when a host write completes, the director invalidates the pages of a WRITE before
//! forwarding it, and (optionally) invalidate-on-read drops pages the host reads. With
//! `require_cached` a READ is offloaded only when every page it touches has a live entry, so a
//! page the host is writing is never served from the device before the write is there.

use dds_cache::CacheItem;
use dds_offload_api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult, ReqDesc,
    ReqList, ResponseLayout,
};
use dds_proto::Status;

pub use dds_pagestore::{
    encode_response_header, parse_response_header, MessageBuilder, ResponseHeader, IO_BYTES_MAX,
    MSG_BYTES_MAX, MSG_HEADER_BYTES, OP_READ, OP_WRITE, REQUESTS_PER_MSG_MAX, REQ_HEADER_BYTES,
    RESP_HEADER_BYTES,
};

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
#[inline]
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
#[inline]
fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// One parsed request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsRequest {
    /// 1 = READ, 2 = WRITE.
    pub op: u8,
    /// File id.
    pub file_id: u32,
    /// File offset.
    pub offset: u64,
    /// READ: bytes to read; WRITE: data bytes.
    pub len: u32,
    /// Client's id.
    pub req_id: u64,
    /// Bytes of the request in the message (header and padded data).
    pub size: usize,
}

/// Parses the request header at `at` of `msg` (checks the request fits).
pub fn parse_request(msg: &[u8], at: usize) -> Result<PsRequest, Malformed> {
    let h = msg
        .get(at..at.saturating_add(REQ_HEADER_BYTES))
        .ok_or(Malformed("request runs past the message"))?;
    let op = h[0];
    if op != OP_READ && op != OP_WRITE {
        return Err(Malformed("unknown op"));
    }
    if h[1..4] != [0, 0, 0] || u32_at(h, 20) != 0 {
        return Err(Malformed("reserved bytes not zero"));
    }
    let len = u32_at(h, 16);
    if len > IO_BYTES_MAX {
        return Err(Malformed("I/O length above 1 MiB"));
    }
    let size = REQ_HEADER_BYTES
        + if op == OP_WRITE {
            pad8(len as usize)
        } else {
            0
        };
    if at + size > msg.len() {
        return Err(Malformed("request runs past the message"));
    }
    Ok(PsRequest {
        op,
        file_id: u32_at(h, 4),
        offset: u64_at(h, 8),
        len,
        req_id: u64_at(h, 24),
        size,
    })
}

/// Framing of the client stream.
pub fn message_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    dds_pagestore::message_len(buf).map_err(|_| Malformed("message length outside 40 ..= 16 MiB"))
}

/// Framing of the response stream.
pub fn response_len(buf: &[u8]) -> Result<Option<usize>, Malformed> {
    dds_pagestore::response_len(buf).map_err(|_| Malformed("response length invalid"))
}

/// Validates a whole message and calls `f(position, byte offset, request)` for each request.
pub fn for_each_request(
    msg: &[u8],
    mut f: impl FnMut(u32, usize, &PsRequest) -> Result<(), Malformed>,
) -> Result<usize, Malformed> {
    if message_len(msg)? != Some(msg.len()) {
        return Err(Malformed("message length does not match"));
    }
    let count = u16_at(msg, 4) as usize;
    if count == 0 || count > REQUESTS_PER_MSG_MAX {
        return Err(Malformed("request count outside 1 ..= 1024"));
    }
    if u16_at(msg, 6) != 0 {
        return Err(Malformed("flags not zero"));
    }
    let mut at = MSG_HEADER_BYTES;
    for pos in 0..count {
        let r = parse_request(msg, at)?;
        f(pos as u32, at, &r)?;
        at += r.size;
    }
    if at != msg.len() {
        return Err(Malformed("message length does not match its requests"));
    }
    Ok(count)
}

/// WRITEs of one message the predicate remembers for the READs after them.
const WRITE_WINDOW: usize = 64;

/// Options of [`PagestoreApp`].
#[derive(Clone, Copy, Debug)]
pub struct PagestoreConfig {
    /// Page size of the per-page cache entries (a power of two).
    pub page_size: u32,
    /// Offload a READ only when all its pages have live cache entries.
    pub require_cached: bool,
    /// Drop the entries of pages the host reads (for hosts that modify pages they read).
    pub invalidate_on_read: bool,
    /// Largest READ offloaded (bigger ones go to the host).
    pub max_offload_bytes: u32,
}

impl Default for PagestoreConfig {
    fn default() -> Self {
        PagestoreConfig {
            page_size: 4096,
            require_cached: true,
            invalidate_on_read: false,
            max_offload_bytes: IO_BYTES_MAX,
        }
    }
}

/// The pagestore offload app.
#[derive(Clone, Debug)]
pub struct PagestoreApp {
    cfg: PagestoreConfig,
    shift: u32,
}

impl PagestoreApp {
    /// An app with these options (`page_size` is rounded up to a power of two, at least 512).
    pub fn new(mut cfg: PagestoreConfig) -> Self {
        cfg.page_size = cfg.page_size.max(512).next_power_of_two();
        PagestoreApp {
            shift: cfg.page_size.trailing_zeros(),
            cfg,
        }
    }

    /// The options.
    pub fn config(&self) -> &PagestoreConfig {
        &self.cfg
    }

    /// Cache key of page `page` of `file_id`.
    pub fn page_key(file_id: u32, page: u64) -> u64 {
        (u64::from(file_id) << 40) | (page & ((1 << 40) - 1))
    }

    fn pages(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let first = offset >> self.shift;
        let end = if len == 0 {
            first
        } else {
            (offset.saturating_add(len - 1) >> self.shift) + 1
        };
        first..end
    }

    /// Whether a READ may be served on the DPU: all pages cached (`require_cached`) or, with
    /// direct mapping, no page masked by an unanswered earlier WRITE of the connection.
    fn servable(&self, cache: &CacheView<'_>, file_id: u32, offset: u64, len: u32) -> bool {
        if self.cfg.require_cached {
            return self.all_cached(cache, file_id, offset, len);
        }
        let pages = self.pages(offset, u64::from(len.max(1)));
        pages
            .into_iter()
            .all(|p| !cache.is_masked(Self::page_key(file_id, p)))
    }

    fn all_cached(&self, cache: &CacheView<'_>, file_id: u32, offset: u64, len: u32) -> bool {
        let pages = self.pages(offset, u64::from(len.max(1)));
        if pages.end - pages.start > u64::from(IO_BYTES_MAX >> 9) + 1 {
            return false;
        }
        pages.into_iter().all(|p| {
            cache
                .get(Self::page_key(file_id, p))
                .is_some_and(|it| it.file_id == file_id)
        })
    }
}

impl Default for PagestoreApp {
    fn default() -> Self {
        PagestoreApp::new(PagestoreConfig::default())
    }
}

impl OffloadApp for PagestoreApp {
    fn name(&self) -> &str {
        "pagestore"
    }

    fn offloaded_request(&self) -> &str {
        "pagestore read"
    }

    fn max_message_len(&self) -> usize {
        MSG_BYTES_MAX
    }
    fn max_response_len(&self) -> usize {
        RESP_HEADER_BYTES + IO_BYTES_MAX as usize
    }
    fn max_requests(&self) -> usize {
        REQUESTS_PER_MSG_MAX
    }
    fn max_forward_keys(&self) -> usize {
        // A message carries at most 16 MiB of write data: one key per page, plus one partial
        // page at each end of every write.
        MSG_BYTES_MAX / self.cfg.page_size as usize + 2 * REQUESTS_PER_MSG_MAX
    }
    fn max_write_items(&self) -> usize {
        (64 << 20) / self.cfg.page_size as usize + 2
    }
    fn max_read_keys(&self) -> usize {
        (64 << 20) / self.cfg.page_size as usize + 2
    }
    fn header_room(&self) -> usize {
        RESP_HEADER_BYTES
    }

    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        message_len(buf)
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        response_len(buf)
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        // The WRITEs met so far in this message, for READs that follow them: a READ that
        // overlaps an earlier WRITE of the message stays with the host (which keeps their
        // order). A fixed window keeps the pass linear in the message: after more WRITEs than
        // it holds, later READs go to the host.
        let mut writes = [(0u32, 0u64, 0u64); WRITE_WINDOW];
        let mut nwrites = 0usize;
        for_each_request(msg, |pos, at, r| {
            let d = ReqDesc {
                offset: at as u32,
                len: r.size as u32,
                pos,
            };
            let end = r.offset.saturating_add(u64::from(r.len));
            let mut offload = r.op == OP_READ
                && r.len <= self.cfg.max_offload_bytes
                && self.servable(cache, r.file_id, r.offset, r.len);
            if offload && nwrites > 0 {
                offload = nwrites <= WRITE_WINDOW
                    && !writes[..nwrites]
                        .iter()
                        .any(|&(f, ws, we)| f == r.file_id && ws < end && r.offset < we);
            }
            if r.op == OP_WRITE {
                if let Some(w) = writes.get_mut(nwrites) {
                    *w = (r.file_id, r.offset, end);
                }
                nwrites += 1;
            }
            let list = if offload { &mut *dpu } else { &mut *host };
            list.push(d).map_err(|_| Malformed("too many requests"))
        })?;
        Ok(())
    }

    fn offload_function(&self, msg: &[u8], req: ReqDesc, cache: &CacheView<'_>) -> Offload {
        let Ok(r) = parse_request(msg, req.offset as usize) else {
            return Offload::Host;
        };
        if r.op != OP_READ || !self.servable(cache, r.file_id, r.offset, r.len) {
            return Offload::Host;
        }
        Offload::Read(ReadOp {
            file_id: r.file_id,
            offset: r.offset,
            size: r.len,
        })
    }

    fn build_response(
        &self,
        req_head: &[u8],
        _op: &ReadOp,
        result: ReadResult,
        room: &mut [u8],
        data: &mut [u8],
    ) -> Result<ResponseLayout, Malformed> {
        if req_head.len() < REQ_HEADER_BYTES || room.len() < RESP_HEADER_BYTES {
            return Err(Malformed("request head or header room too short"));
        }
        let req_id = u64_at(req_head, 24);
        let hdr_at = room.len() - RESP_HEADER_BYTES;
        let (status, n) = match result {
            Ok(n) => (Status::Ok.code(), n as usize),
            Err(code) => (code, 0),
        };
        let padded = pad8(n);
        if padded > data.len() {
            return Err(Malformed("read larger than its buffer"));
        }
        data[n..padded].fill(0);
        encode_response_header(&mut room[hdr_at..], status, OP_READ, req_id, n as u32);
        Ok(ResponseLayout {
            header_len: RESP_HEADER_BYTES as u32,
            total_len: (RESP_HEADER_BYTES + padded) as u32,
        })
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        let mut at = MSG_HEADER_BYTES;
        for d in host {
            let (s, e) = (d.offset as usize, d.offset as usize + d.len as usize);
            let src = msg
                .get(s..e)
                .ok_or(Malformed("descriptor outside message"))?;
            out.get_mut(at..at + src.len())
                .ok_or(Malformed("host message too large"))?
                .copy_from_slice(src);
            at += src.len();
        }
        if host.is_empty() || out.len() < MSG_HEADER_BYTES {
            return Err(Malformed("empty host message"));
        }
        out[0..4].copy_from_slice(&(at as u32).to_le_bytes());
        out[4..6].copy_from_slice(&(host.len() as u16).to_le_bytes());
        out[6..8].fill(0);
        Ok(at)
    }

    fn invalidate_on_forward(&self, msg: &[u8], req: ReqDesc, keys: &mut KeyList) {
        let Ok(r) = parse_request(msg, req.offset as usize) else {
            return;
        };
        if r.op != OP_WRITE {
            return;
        }
        for p in self.pages(r.offset, u64::from(r.len.max(1))) {
            if keys.push(Self::page_key(r.file_id, p)).is_err() {
                return;
            }
        }
    }

    fn cache_on_write(&self, file_id: u32, offset: u64, data: &[u8], items: &mut ItemList) {
        let ps = u64::from(self.cfg.page_size);
        for p in self.pages(offset, data.len() as u64) {
            let item = CacheItem::new(Self::page_key(file_id, p), 0, file_id, p * ps, ps as u32);
            if items.push(item).is_err() {
                return;
            }
        }
    }

    fn invalidate_on_read(&self, file_id: u32, offset: u64, len: u32, keys: &mut KeyList) {
        if !self.cfg.invalidate_on_read {
            return;
        }
        for p in self.pages(offset, u64::from(len.max(1))) {
            if keys.push(Self::page_key(file_id, p)).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dds_cache::{CacheWriter, Config};

    /// The predicate's split of `msg` into (host, DPU) positions, direct mapping.
    fn split(msg: &[u8]) -> (Vec<u32>, Vec<u32>) {
        let app = PagestoreApp::new(PagestoreConfig {
            require_cached: false,
            ..PagestoreConfig::default()
        });
        let w = CacheWriter::new(Config::for_items(16)).unwrap();
        let reader = w.reader();
        let view = CacheView::new(&reader);
        let n = REQUESTS_PER_MSG_MAX;
        let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
        app.offload_predicate(msg, &view, &mut host, &mut dpu)
            .unwrap();
        let pos = |l: &ReqList| l.as_slice().iter().map(|d| d.pos).collect();
        (pos(&host), pos(&dpu))
    }

    #[test]
    fn reads_after_writes_checked_in_one_pass() {
        // Below the window: only the READ overlapping a WRITE of the message stays with the
        // host.
        let mut b = MessageBuilder::new();
        for i in 0..(WRITE_WINDOW as u64) {
            b.write(1, i * 8192, b"x", i);
        }
        b.read(1, 8192, 4, 100).read(1, 4096, 4, 101);
        let (host, dpu) = split(b.finish());
        assert_eq!(dpu, vec![WRITE_WINDOW as u32 + 1]);
        assert_eq!(host.len(), WRITE_WINDOW + 1);
        // Past the window, READs after the WRITEs go to the host whatever they touch.
        let mut b = MessageBuilder::new();
        b.read(1, 4096, 4, 1);
        for i in 0..(WRITE_WINDOW as u64 + 1) {
            b.write(1, i * 8192, b"x", 10 + i);
        }
        b.read(2, 0, 4, 200);
        let (host, dpu) = split(b.finish());
        assert_eq!(dpu, vec![0], "the READ before the WRITEs is offloaded");
        assert_eq!(host.len(), WRITE_WINDOW + 2);
    }

    #[test]
    fn predicate_splits_and_builder_rebuilds() {
        let app = PagestoreApp::new(PagestoreConfig {
            require_cached: false,
            ..PagestoreConfig::default()
        });
        let w = CacheWriter::new(Config::for_items(16)).unwrap();
        let reader = w.reader();
        let view = CacheView::new(&reader);
        let mut b = MessageBuilder::new();
        b.read(1, 0, 100, 1)
            .write(1, 8192, b"abc", 2)
            .read(1, 8192, 4, 3)
            .read(2, 0, 8, 4);
        let msg = b.finish().to_vec();
        let (mut host, mut dpu) = (ReqList::with_capacity(8), ReqList::with_capacity(8));
        app.offload_predicate(&msg, &view, &mut host, &mut dpu)
            .unwrap();
        let hp: Vec<u32> = host.as_slice().iter().map(|d| d.pos).collect();
        let dp: Vec<u32> = dpu.as_slice().iter().map(|d| d.pos).collect();
        // The READ of the page written earlier in the message stays with the host.
        assert_eq!(hp, vec![1, 2]);
        assert_eq!(dp, vec![0, 3]);
        let mut out = vec![0u8; msg.len()];
        let n = app
            .build_host_message(&msg, host.as_slice(), &mut out)
            .unwrap();
        let mut seen = vec![];
        for_each_request(&out[..n], |p, _, r| {
            seen.push((p, r.req_id));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(0, 2), (1, 3)]);
        let mut keys = KeyList::with_capacity(8);
        app.invalidate_on_forward(&msg, host.as_slice()[0], &mut keys);
        assert_eq!(keys.as_slice(), &[PagestoreApp::page_key(1, 2)]);
    }

    #[test]
    fn require_cached_needs_every_page() {
        let app = PagestoreApp::default();
        let mut w = CacheWriter::new(Config::for_items(16)).unwrap();
        let mut items = ItemList::with_capacity(8);
        app.cache_on_write(3, 4000, &[0u8; 200], &mut items);
        assert_eq!(items.len(), 2);
        for it in items.as_slice() {
            w.insert(CacheItem { version: 1, ..*it }).unwrap();
        }
        let r = w.reader();
        let view = CacheView::new(&r);
        let mut b = MessageBuilder::new();
        b.read(3, 0, 8192, 1).read(3, 0, 8193, 2);
        let msg = b.finish().to_vec();
        let (mut host, mut dpu) = (ReqList::with_capacity(8), ReqList::with_capacity(8));
        app.offload_predicate(&msg, &view, &mut host, &mut dpu)
            .unwrap();
        assert_eq!(dpu.as_slice().len(), 1);
        assert_eq!(host.as_slice()[0].pos, 1);
    }

    #[test]
    fn response_in_front_of_data() {
        let app = PagestoreApp::default();
        let mut b = MessageBuilder::new();
        b.read(3, 0, 5, 77);
        let msg = b.finish().to_vec();
        let mut room = [0u8; 24];
        let mut data = [9u8; 16];
        let l = app
            .build_response(&msg[8..40], &ReadOp::default(), Ok(5), &mut room, &mut data)
            .unwrap();
        assert_eq!((l.header_len, l.total_len), (24, 32));
        let h = parse_response_header(&room).unwrap();
        assert_eq!((h.resp_len, h.req_id, h.len, h.status), (32, 77, 5, 0));
        assert_eq!(&data[5..8], &[0, 0, 0]);
    }

    #[test]
    fn malformed_never_panics() {
        use rand::{Rng, SeedableRng};
        let app = PagestoreApp::default();
        let w = CacheWriter::new(Config::for_items(16)).unwrap();
        let r = w.reader();
        let view = CacheView::new(&r);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let (mut host, mut dpu) = (ReqList::with_capacity(1024), ReqList::with_capacity(1024));
        for _ in 0..20_000 {
            let n = rng.gen_range(0..120);
            let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if n >= 8 && rng.gen_bool(0.5) {
                v[0..4].copy_from_slice(&(n as u32).to_le_bytes());
                v[4..8].copy_from_slice(&[1, 0, 0, 0]);
            }
            host.clear();
            dpu.clear();
            let _ = app.message_len(&v);
            let _ = app.offload_predicate(&v, &view, &mut host, &mut dpu);
            let _ = app.response_len(&v);
        }
    }
}
