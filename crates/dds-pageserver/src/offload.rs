//! The DPU half of the page server (`docs/pageserver-protocol.md` §6): the offload app
//! `pageserver`.

use dds_cache::CacheItem;
use dds_offload_api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, ReadOp, ReadResult, ReqDesc,
    ReqList, ResponseLayout,
};

use crate::page;
use crate::proto::{self, status, GETPAGE_BYTES, KIND_GETPAGE, MSG_HEADER, RESP_HEADER};

/// The range end of an entry whose image has no later record known: the image is the
/// page's newest version.
pub const OPEN: u64 = u64::MAX;

/// The key of the entry whose tag is the acknowledged LSN `W`: every record at or below it has
/// closed the ranges of its page's entries.
pub const WATERMARK: u64 = u64::MAX;

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

/// The cached image of one of `g.page`'s slots that serves `g` (cache key: the slot's number
/// in the file, `page × SLOTS + slot`).
fn serving(cache: &CacheView<'_>, g: &proto::GetPage) -> Option<CacheItem> {
    let first = g.page.checked_mul(page::SLOTS as u64)?;
    // Read before the slots' entries: the closures a newer `W` covers are visible then.
    let w = cache.get(WATERMARK).map_or(0, |it| it.tag);
    (first..first.checked_add(page::SLOTS as u64)?)
        .filter_map(|k| cache.get(k))
        .find(|it| serves(g, it.tag, it.offset, w))
}

/// The image at `l` whose versions end at `end` is the page as of `g.lsn` when `l ≤ lsn <
/// end`. An open range has no later record up to the acknowledged LSN `w`, and the client
/// guarantees none in `(nms, lsn]`: it serves when `nms ≤ w` (or `nms ≤ l`).
fn serves(g: &proto::GetPage, l: u64, end: u64, w: u64) -> bool {
    l > 0
        && l <= g.lsn
        && if end == OPEN {
            g.nms <= w.max(l)
        } else {
            g.lsn < end
        }
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
                offset: it.key.saturating_mul(u64::from(it.size)),
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
            && page::check(page).is_some_and(|(id, l)| {
                let next = page::next_lsn(page);
                id == g.page && l > 0 && l <= g.lsn && (next == 0 || g.lsn < next)
            });
        if !ok {
            // The slot was rewritten under the read (or the read failed): the client asks
            // again. An image other than the one the entry named is either newer (above every
            // LSN a closed range serves) or older with a next-record stamp at or below the
            // named image's LSN; either is refused here (§6.3).
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

    fn cache_on_write(&self, _file_id: u32, _offset: u64, _data: &[u8], _items: &mut ItemList) {
        // An image's range is known to the host only (its records): the host sends each
        // slot's entry in a CACHE record once the slot's write completed.
    }

    fn invalidate_on_read(&self, _file_id: u32, _offset: u64, _len: u32, _keys: &mut KeyList) {
        // The host reads images to answer GetPages and to roll pages forward; an image is
        // changed only by a write of its slot, which replaces the cache entry as it passes.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(lsn: u64, nms: u64) -> proto::GetPage {
        proto::GetPage {
            req_id: 1,
            lsn,
            nms,
            page: 3,
        }
    }

    #[test]
    fn a_range_serves_the_read_points_it_covers_and_nothing_else() {
        // Closed [10, 20): every read point in it, whatever the not-modified-since LSN.
        for r in 10..20 {
            assert!(serves(&get(r, 0), 10, 20, 0), "{r}");
            assert!(serves(&get(r, r), 10, 20, 0), "{r}");
        }
        assert!(!serves(&get(9, 0), 10, 20, 0));
        assert!(!serves(&get(20, 20), 10, 20, u64::MAX));
        // Open: the not-modified-since LSN must be covered by the watermark or the image.
        assert!(serves(&get(50, 10), 10, OPEN, 0));
        assert!(!serves(&get(50, 30), 10, OPEN, 29));
        assert!(serves(&get(50, 30), 10, OPEN, 30));
        assert!(!serves(&get(9, 9), 10, OPEN, 100));
        // LSN 0 is the implicit empty image, never cached.
        assert!(!serves(&get(5, 0), 0, 20, 0));
    }
}
