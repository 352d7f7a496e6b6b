//! The DPU half of the page server (`docs/pageserver-protocol.md` §6): the offload app
//! `pageserver`.

use dds_cache::CacheItem;
use dds_offload_api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult, ReqDesc,
    ReqList, ResponseLayout,
};

use crate::page;
use crate::proto::{self, status, GETPAGE_BYTES, KIND_GETPAGE, MSG_HEADER, RESP_HEADER};

/// Page sizes cache-on-write recognizes (by the checksum of a write's first page).
const PAGE_SIZES: [usize; 5] = [8192, 4096, 16384, 32768, 65536];

/// The `pageserver` offload app.
#[derive(Clone, Copy, Debug, Default)]
pub struct PageServerApp;

fn req_at(msg: &[u8], d: ReqDesc) -> Option<proto::GetPage> {
    if proto::u16_at(msg, 6) != KIND_GETPAGE || d.len as usize != GETPAGE_BYTES {
        return None;
    }
    let b = msg.get(d.offset as usize..d.offset as usize + GETPAGE_BYTES)?;
    Some(parse_req(b))
}

fn parse_req(b: &[u8]) -> proto::GetPage {
    proto::GetPage {
        req_id: proto::u64_at(b, 0),
        lsn: proto::u64_at(b, 8),
        nms: proto::u64_at(b, 16),
        page: proto::u64_at(b, 24),
    }
}

/// The page whose image a write at `offset` of `ps`-byte images is (`SLOTS` slots a page).
fn image_page(offset: u64, ps: usize) -> u64 {
    offset / ps as u64 / page::SLOTS as u64
}

/// The cached image of one of `g.page`'s slots that serves `g` (cache key: the slot's number
/// in the file, `page × SLOTS + slot`).
fn serving(cache: &CacheView<'_>, g: &proto::GetPage) -> Option<CacheItem> {
    let first = g.page.checked_mul(page::SLOTS as u64)?;
    (first..first.checked_add(page::SLOTS as u64)?)
        .filter_map(|k| cache.get(k))
        .find(|it| serves(g, it.tag))
}

/// The stored version serves the request when its LSN `l` has `nms ≤ l ≤ lsn`.
fn serves(g: &proto::GetPage, l: u64) -> bool {
    g.nms <= l && l <= g.lsn && l > 0
}

impl OffloadApp for PageServerApp {
    fn name(&self) -> &str {
        "pageserver"
    }

    fn offloaded_request(&self) -> &str {
        "page read"
    }

    fn max_message_len(&self) -> usize {
        proto::MSG_MAX
    }
    fn max_response_len(&self) -> usize {
        RESP_HEADER + 65536
    }
    fn max_requests(&self) -> usize {
        proto::REQUESTS_MAX
    }
    fn max_forward_keys(&self) -> usize {
        1
    }
    fn max_write_items(&self) -> usize {
        // A write of at most 1 MiB of pages of at least 4 KiB.
        256
    }
    fn max_read_keys(&self) -> usize {
        256
    }
    fn header_room(&self) -> usize {
        RESP_HEADER
    }

    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        proto::message_len(buf).map_err(|e| Malformed(e.0))
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        proto::response_len(buf, RESP_HEADER + 65536).map_err(|e| Malformed(e.0))
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        let count = proto::u16_at(msg, 4) as usize;
        let full = Malformed("request list full");
        if proto::u16_at(msg, 6) != KIND_GETPAGE {
            return host
                .push(ReqDesc {
                    offset: 0,
                    len: msg.len() as u32,
                    pos: 0,
                })
                .map_err(|_| full);
        }
        for i in 0..count {
            let d = ReqDesc {
                offset: (MSG_HEADER + i * GETPAGE_BYTES) as u32,
                len: GETPAGE_BYTES as u32,
                pos: i as u32,
            };
            let g = proto::getpage(msg, i);
            let hit = serving(cache, &g).is_some();
            let list = if hit { &mut *dpu } else { &mut *host };
            list.push(d).map_err(|_| full)?;
        }
        Ok(())
    }

    fn offload_function(&self, msg: &[u8], req: ReqDesc, cache: &CacheView<'_>) -> Offload {
        let Some(g) = req_at(msg, req) else {
            return Offload::Host;
        };
        match serving(cache, &g) {
            Some(it) => Offload::Read(ReadOp {
                file_id: it.file_id,
                size: it.size,
                offset: it.offset,
            }),
            _ => Offload::Host,
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
        if req_head.len() < GETPAGE_BYTES || room.len() < RESP_HEADER {
            return Err(Malformed("request head or room too short"));
        }
        let g = parse_req(req_head);
        let at = room.len() - RESP_HEADER;
        let page = &data[..(op.size as usize).min(data.len())];
        let ok = matches!(result, Ok(n) if n == op.size)
            && page::check(page).is_some_and(|(id, l)| id == g.page && serves(&g, l));
        if !ok {
            // The page changed under the read (or the read failed): the client asks again.
            let st = if result.is_err() {
                status::IO_ERROR
            } else {
                status::RETRY
            };
            proto::response_header(
                &mut room[at..],
                RESP_HEADER as u32,
                st,
                KIND_GETPAGE,
                g.req_id,
                0,
            );
            return Ok(ResponseLayout {
                header_len: RESP_HEADER as u32,
                total_len: RESP_HEADER as u32,
            });
        }
        let lsn = page::lsn(page);
        let total = (RESP_HEADER + op.size as usize) as u32;
        proto::response_header(
            &mut room[at..],
            total,
            status::OK,
            KIND_GETPAGE,
            g.req_id,
            lsn,
        );
        Ok(ResponseLayout {
            header_len: RESP_HEADER as u32,
            total_len: total,
        })
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        if host.is_empty() {
            return Err(Malformed("empty host message"));
        }
        let mut at = MSG_HEADER;
        for d in host {
            let src = msg
                .get(d.offset as usize..(d.offset + d.len) as usize)
                .ok_or(Malformed("descriptor outside the message"))?;
            out.get_mut(at..at + src.len())
                .ok_or(Malformed("host message too large"))?
                .copy_from_slice(src);
            at += src.len();
        }
        out[0..4].copy_from_slice(&(at as u32).to_le_bytes());
        out[4..6].copy_from_slice(&(host.len() as u16).to_le_bytes());
        out[6..8].copy_from_slice(&KIND_GETPAGE.to_le_bytes());
        Ok(at)
    }

    fn invalidate_on_forward(&self, _msg: &[u8], _req: ReqDesc, _keys: &mut KeyList) {
        // Reads carry their LSNs: nothing a forwarded request does makes a stored version
        // wrong for them.
    }

    fn cache_on_write(&self, file_id: u32, offset: u64, data: &[u8], items: &mut ItemList) {
        let Some(&ps) = PAGE_SIZES.iter().find(|&&ps| {
            offset.is_multiple_of(ps as u64)
                && data.len().is_multiple_of(ps)
                && data.len() >= ps
                && page::check(&data[..ps]).is_some_and(|(id, _)| id == image_page(offset, ps))
        }) else {
            return;
        };
        for (i, p) in data.chunks_exact(ps).enumerate() {
            let off = offset + (i * ps) as u64;
            if let Some((id, lsn)) = page::check(p) {
                if id == image_page(off, ps) && lsn > 0 {
                    let key = off / ps as u64;
                    let mut it = CacheItem::new(key, 0, file_id, off, ps as u32);
                    it.tag = lsn;
                    if items.push(it).is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn invalidate_on_read(&self, _file_id: u32, _offset: u64, _len: u32, _keys: &mut KeyList) {
        // The host reads images to answer GetPages and to roll pages forward; an image is
        // changed only by a write of its slot, which replaces the cache entry as it passes.
    }
}
