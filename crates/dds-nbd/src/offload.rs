//! The DPU half of `dds nbd` (`docs/nbd.md` §6): the offload app `nbd`. READs of ranges no
//! write is changing are read by the DPU's file service and answered by the traffic director
//! with the NBD reply header in front of the data; everything else goes to `dds nbd`.
//!
//! Each connection has a session (`docs/offload.md` §5c): it follows the handshake as it
//! passes through (which export, so which file; structured replies or not), frames the host's
//! replies by what was asked (a READ reply's length is its request's), and marks the regions
//! of writes in flight in a table all sessions share, so a READ overlapping a write of any
//! connection goes to the host.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dds_offload_api::{
    CacheView, ItemList, KeyList, KeyMap, Malformed, Offload, OffloadApp, Phase, ReadOp,
    ReadResult, ReqDesc, ReqList, ResponseLayout, Session, REQUEST_HEAD_BYTES,
};

use crate::proto::{self, u16_at, u32_at, u64_at, Request};

/// The cache key under which `dds nbd` publishes the export `name` (its file, with the
/// export's size as the tag): FNV-1a 64 over `nbd export` and the name.
pub fn export_key(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in b"nbd export".iter().chain(name) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Bytes of a region of the table of writes in flight.
const REGION_SHIFT: u32 = 16;
/// Counters of the table of writes in flight.
const MARK_SLOTS: usize = 1 << 16;
/// Requests the host has not answered, per connection.
const HANDLES_MAX: usize = 1024;
/// Options awaiting their final reply, per connection.
const OPTIONS_MAX: usize = 8;
/// The largest client message: a request with a payload up to twice the maximum (a larger
/// payload than the maximum is forwarded and refused by the host).
const MESSAGE_MAX: usize = proto::REQUEST + 2 * proto::PAYLOAD_MAX as usize;
/// The largest host response: a READ reply of the maximum payload, with room for chunks.
const RESPONSE_MAX: usize = proto::PAYLOAD_MAX as usize + 4096;
/// Header room in front of the read data: a structured read header (28 bytes).
const HEADER_ROOM: usize = 32;

/// What a session remembers of a forwarded request (the value of its handle).
const KIND_SHIFT: u32 = 30;
const KIND_OTHER: u32 = 0;
const KIND_READ: u32 = 1;
const KIND_MARK: u32 = 2;
const VALUE_MASK: u32 = (1 << KIND_SHIFT) - 1;

/// Counters of the regions that writes in flight cover, shared by every session of the app.
/// Two regions may share a counter: that only sends more READs to the host.
struct Marks {
    slots: Box<[AtomicU32]>,
}

impl Marks {
    fn new() -> Marks {
        Marks {
            slots: (0..MARK_SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn slot(&self, file: u32, region: u64) -> &AtomicU32 {
        // fmix64: every bit of file and region reaches the low bits.
        let mut h = (u64::from(file) << 40) ^ region;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        &self.slots[h as usize & (MARK_SLOTS - 1)]
    }

    /// Marks (`up`) or unmarks `count` regions from `first`.
    fn mark(&self, file: u32, first: u64, count: u32, up: bool) {
        for r in first..first + u64::from(count) {
            let s = self.slot(file, r);
            if up {
                s.fetch_add(1, Ordering::AcqRel);
            } else {
                s.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// No write in flight covers a region of `len` bytes at `offset` (`len` > 0).
    fn clear(&self, file: u32, offset: u64, len: u64) -> bool {
        let first = offset >> REGION_SHIFT;
        let last = (offset + len - 1) >> REGION_SHIFT;
        (first..=last).all(|r| self.slot(file, r).load(Ordering::Acquire) == 0)
    }
}

/// The `nbd` offload app.
pub struct NbdApp {
    marks: Arc<Marks>,
}

impl Default for NbdApp {
    fn default() -> Self {
        NbdApp::new()
    }
}

impl std::fmt::Debug for NbdApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdApp").finish_non_exhaustive()
    }
}

impl NbdApp {
    /// The app, with its (empty) table of writes in flight.
    pub fn new() -> NbdApp {
        NbdApp {
            marks: Arc::new(Marks::new()),
        }
    }
}

/// The request at the start of `msg`, when it is one (28 bytes or more).
fn request_of(msg: &[u8]) -> Option<Request> {
    (msg.len() >= proto::REQUEST).then(|| proto::request(msg))
}

/// A host reply at the start of `buf`: its length and the handle of the request it completes;
/// `read_len` gives the data length of a successful simple reply to `handle`.
fn frame_reply(
    buf: &[u8],
    read_len: impl Fn(u64) -> usize,
) -> Result<Option<(usize, u64)>, Malformed> {
    if buf.len() < 4 {
        return Ok(None);
    }
    match u32_at(buf, 0) {
        proto::SIMPLE_REPLY_MAGIC => {
            if buf.len() < proto::SIMPLE_REPLY {
                return Ok(None);
            }
            let handle = u64_at(buf, 8);
            let data = if u32_at(buf, 4) == 0 {
                read_len(handle)
            } else {
                0
            };
            Ok(Some((proto::SIMPLE_REPLY + data, handle)))
        }
        proto::STRUCTURED_REPLY_MAGIC => {
            // The chunks up to and including the one that completes a request.
            let mut at = 0usize;
            loop {
                if buf.len() < at + proto::STRUCTURED_HEADER {
                    return Ok(None);
                }
                if u32_at(buf, at) != proto::STRUCTURED_REPLY_MAGIC {
                    return Err(Malformed("host reply chunk magic"));
                }
                let len = u32_at(buf, at + 16) as usize;
                if len > RESPONSE_MAX {
                    return Err(Malformed("host reply chunk too long"));
                }
                let end = at + proto::STRUCTURED_HEADER + len;
                if u16_at(buf, at + 4) & proto::REPLY_FLAG_DONE != 0 {
                    return Ok(Some((end, u64_at(buf, at + 8))));
                }
                if end > RESPONSE_MAX {
                    return Err(Malformed("host reply chunks too long"));
                }
                at = end;
            }
        }
        _ => Err(Malformed("host reply magic")),
    }
}

impl OffloadApp for NbdApp {
    fn name(&self) -> &str {
        "nbd"
    }

    fn offloaded_request(&self) -> &str {
        "NBD read"
    }

    fn max_message_len(&self) -> usize {
        MESSAGE_MAX
    }
    fn max_response_len(&self) -> usize {
        RESPONSE_MAX
    }
    fn max_requests(&self) -> usize {
        1
    }
    fn max_forward_keys(&self) -> usize {
        0
    }
    fn max_write_items(&self) -> usize {
        1
    }
    fn max_read_keys(&self) -> usize {
        1
    }
    fn header_room(&self) -> usize {
        HEADER_ROOM
    }

    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        let Some(r) = request_of(buf) else {
            return Ok(None);
        };
        if r.magic != proto::REQUEST_MAGIC {
            return Err(Malformed("bad request magic"));
        }
        Ok(Some(if r.command == proto::CMD_WRITE {
            proto::REQUEST.saturating_add(r.len as usize)
        } else {
            proto::REQUEST
        }))
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        // Without a session nothing is known of the requests: no READ was forwarded.
        Ok(frame_reply(buf, |_| 0)?.map(|(n, _)| n))
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        _cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        let r = request_of(msg).ok_or(Malformed("short request"))?;
        let d = ReqDesc {
            offset: 0,
            len: msg.len() as u32,
            pos: 0,
        };
        let list = if r.command == proto::CMD_READ {
            dpu
        } else {
            host
        };
        list.push(d).map_err(|_| Malformed("too many requests"))
    }

    fn offload_function(&self, _msg: &[u8], _req: ReqDesc, _cache: &CacheView<'_>) -> Offload {
        // Which file a READ reads is the connection's: only its session can tell.
        Offload::Host
    }

    fn build_response(
        &self,
        req_head: &[u8],
        op: &ReadOp,
        result: ReadResult,
        room: &mut [u8],
        _data: &mut [u8],
    ) -> Result<ResponseLayout, Malformed> {
        let r = request_of(req_head).ok_or(Malformed("short request head"))?;
        let structured = req_head.get(proto::REQUEST) == Some(&1);
        let mut h = [0u8; HEADER_ROOM];
        let (header, data) = match result {
            Ok(n) if n == op.size => {
                let hl = if structured {
                    h[..4].copy_from_slice(&proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
                    h[4..6].copy_from_slice(&proto::REPLY_FLAG_DONE.to_be_bytes());
                    h[6..8].copy_from_slice(&proto::REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                    h[8..16].copy_from_slice(&r.handle.to_be_bytes());
                    h[16..20].copy_from_slice(&(8 + n).to_be_bytes());
                    h[20..28].copy_from_slice(&r.offset.to_be_bytes());
                    proto::STRUCTURED_READ_HEADER
                } else {
                    h[..4].copy_from_slice(&proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
                    h[8..16].copy_from_slice(&r.handle.to_be_bytes());
                    proto::SIMPLE_REPLY
                };
                (hl, n)
            }
            // A short read or a failed one: NBD_EIO, no data.
            _ => {
                let hl = if structured {
                    h[..4].copy_from_slice(&proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
                    h[4..6].copy_from_slice(&proto::REPLY_FLAG_DONE.to_be_bytes());
                    h[6..8].copy_from_slice(&proto::REPLY_TYPE_ERROR.to_be_bytes());
                    h[8..16].copy_from_slice(&r.handle.to_be_bytes());
                    h[16..20].copy_from_slice(&6u32.to_be_bytes());
                    h[20..24].copy_from_slice(&proto::EIO.to_be_bytes());
                    proto::STRUCTURED_HEADER + 6
                } else {
                    h[..4].copy_from_slice(&proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
                    h[4..8].copy_from_slice(&proto::EIO.to_be_bytes());
                    h[8..16].copy_from_slice(&r.handle.to_be_bytes());
                    proto::SIMPLE_REPLY
                };
                (hl, 0)
            }
        };
        if room.len() < header {
            return Err(Malformed("header room too small"));
        }
        let at = room.len() - header;
        room[at..].copy_from_slice(&h[..header]);
        Ok(ResponseLayout {
            header_len: header as u32,
            total_len: (header as u32) + data,
        })
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        let mut n = 0;
        for d in host {
            let b = msg
                .get(d.offset as usize..(d.offset + d.len) as usize)
                .ok_or(Malformed("request outside the message"))?;
            out.get_mut(n..n + b.len())
                .ok_or(Malformed("host message too long"))?
                .copy_from_slice(b);
            n += b.len();
        }
        Ok(n)
    }

    fn invalidate_on_forward(&self, _msg: &[u8], _req: ReqDesc, _keys: &mut KeyList) {
        // Nothing of an export is cached: writes in flight are marked by the sessions.
    }

    fn cache_on_write(&self, _file_id: u32, _offset: u64, _data: &[u8], _items: &mut ItemList) {}

    fn invalidate_on_read(&self, _file_id: u32, _offset: u64, _len: u32, _keys: &mut KeyList) {}

    fn session(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(NbdConn::new(self.marks.clone())))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The client's flags are next.
    Flags,
    /// Options.
    Options,
    /// Requests.
    Transmission,
}

/// The session of one connection.
struct NbdConn {
    marks: Arc<Marks>,
    stage: Stage,
    greeted: bool,
    server_no_zeroes: bool,
    client_no_zeroes: bool,
    structured: bool,
    /// Options awaiting their final reply, oldest first: (option, export key).
    options: [(u32, u64); OPTIONS_MAX],
    opt_head: usize,
    opt_len: usize,
    /// The size of the export the `NBD_OPT_GO` in progress names, from its `NBD_INFO_EXPORT`.
    go_size: Option<u64>,
    /// The export's file, and its size.
    file: Option<u32>,
    size: u64,
    /// Handles of forwarded requests the host has not answered → what they are.
    handles: KeyMap,
    /// Regions marked by forwarded writes: (file, first region, count); `None`: free.
    writes: Vec<Option<(u32, u64, u32)>>,
    free: Vec<u32>,
}

impl NbdConn {
    fn new(marks: Arc<Marks>) -> NbdConn {
        NbdConn {
            marks,
            stage: Stage::Flags,
            greeted: false,
            server_no_zeroes: false,
            client_no_zeroes: false,
            structured: false,
            options: [(0, 0); OPTIONS_MAX],
            opt_head: 0,
            opt_len: 0,
            go_size: None,
            file: None,
            size: 0,
            handles: KeyMap::with_capacity(HANDLES_MAX),
            writes: vec![None; HANDLES_MAX],
            free: (0..HANDLES_MAX as u32).rev().collect(),
        }
    }

    fn oldest_option(&self) -> Option<(u32, u64)> {
        (self.opt_len > 0).then(|| self.options[self.opt_head])
    }

    fn newest_option(&self) -> Option<u32> {
        (self.opt_len > 0).then(|| self.options[(self.opt_head + self.opt_len - 1) % OPTIONS_MAX].0)
    }

    fn start_transmission(&mut self, key: u64, size: u64, cache: &CacheView<'_>) {
        self.stage = Stage::Transmission;
        self.size = size;
        self.file = cache
            .get(key)
            .filter(|it| it.tag == size)
            .map(|it| it.file_id);
    }

    fn read_len(&self, handle: u64) -> usize {
        match self.handles.get(handle) {
            Some(v) if v >> KIND_SHIFT == KIND_READ => (v & VALUE_MASK) as usize,
            _ => 0,
        }
    }
}

impl Drop for NbdConn {
    fn drop(&mut self) {
        // Writes whose replies never came: the connection is gone, so nothing orders later
        // reads after them.
        for (file, first, count) in self.writes.iter().flatten() {
            self.marks.mark(*file, *first, *count, false);
        }
    }
}

impl Session for NbdConn {
    fn phase(&self) -> Phase {
        match self.stage {
            Stage::Transmission => Phase::Requests,
            _ if self.opt_len == OPTIONS_MAX
                || matches!(
                    self.newest_option(),
                    Some(proto::OPT_GO | proto::OPT_EXPORT_NAME)
                ) =>
            {
                Phase::AwaitHost
            }
            _ => Phase::Opening,
        }
    }

    fn opening_message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        match self.stage {
            Stage::Flags => Ok(Some(4)),
            _ if buf.len() < proto::OPT_HEADER => Ok(None),
            _ => {
                let h = proto::opt_header(buf);
                if h.magic != proto::IHAVEOPT {
                    return Err(Malformed("bad option magic"));
                }
                Ok(Some(proto::OPT_HEADER.saturating_add(h.len as usize)))
            }
        }
    }

    fn opening_message(&mut self, msg: &[u8]) -> Result<(), Malformed> {
        if self.stage == Stage::Flags {
            self.client_no_zeroes = u32_at(msg, 0) & proto::FLAG_C_NO_ZEROES != 0;
            self.stage = Stage::Options;
            return Ok(());
        }
        let h = proto::opt_header(msg);
        let data = &msg[proto::OPT_HEADER..];
        let key = match h.option {
            proto::OPT_EXPORT_NAME => export_key(data),
            proto::OPT_GO => proto::info_request(data).map_or(0, |r| export_key(r.name)),
            _ => 0,
        };
        if self.opt_len == OPTIONS_MAX {
            return Err(Malformed("too many options awaiting replies"));
        }
        self.options[(self.opt_head + self.opt_len) % OPTIONS_MAX] = (h.option, key);
        self.opt_len += 1;
        Ok(())
    }

    fn opening_response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        if !self.greeted {
            return Ok(Some(proto::GREETING));
        }
        match self.oldest_option() {
            None => Err(Malformed("host sent an option reply nobody asked for")),
            Some((proto::OPT_EXPORT_NAME, _)) => {
                let zeroes = !(self.server_no_zeroes && self.client_no_zeroes);
                Ok(Some(10 + if zeroes { 124 } else { 0 }))
            }
            Some(_) if buf.len() < proto::OPT_REPLY_HEADER => Ok(None),
            Some(_) => {
                if u64_at(buf, 0) != proto::OPT_REPLY_MAGIC {
                    return Err(Malformed("bad option reply magic"));
                }
                Ok(Some(
                    proto::OPT_REPLY_HEADER.saturating_add(u32_at(buf, 16) as usize),
                ))
            }
        }
    }

    fn opening_response(&mut self, resp: &[u8], cache: &CacheView<'_>) -> Result<(), Malformed> {
        if !self.greeted {
            if u64_at(resp, 0) != proto::NBDMAGIC || u64_at(resp, 8) != proto::IHAVEOPT {
                return Err(Malformed("not an NBD fixed newstyle greeting"));
            }
            self.server_no_zeroes = u16_at(resp, 16) & proto::FLAG_NO_ZEROES != 0;
            self.greeted = true;
            return Ok(());
        }
        let (option, key) = self.oldest_option().expect("framed with an option");
        if option == proto::OPT_EXPORT_NAME {
            self.opt_len = 0;
            self.start_transmission(key, u64_at(resp, 0), cache);
            return Ok(());
        }
        if u32_at(resp, 8) != option {
            return Err(Malformed("option reply to another option"));
        }
        let kind = u32_at(resp, 12);
        let data = &resp[proto::OPT_REPLY_HEADER..];
        if kind == proto::REP_INFO
            && option == proto::OPT_GO
            && data.len() >= 12
            && u16_at(data, 0) == proto::INFO_EXPORT
        {
            self.go_size = Some(u64_at(data, 2));
        }
        if kind != proto::REP_ACK && kind & 0x8000_0000 == 0 {
            return Ok(());
        }
        // The option's final reply.
        self.opt_head = (self.opt_head + 1) % OPTIONS_MAX;
        self.opt_len -= 1;
        let go_size = self.go_size.take();
        if kind == proto::REP_ACK {
            match option {
                proto::OPT_STRUCTURED_REPLY => self.structured = true,
                proto::OPT_GO => {
                    self.opt_len = 0;
                    self.start_transmission(key, go_size.unwrap_or(0), cache);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        Ok(frame_reply(buf, |h| self.read_len(h))?.map(|(n, _)| n))
    }

    fn has_room(&self) -> bool {
        self.handles.len() < HANDLES_MAX
    }

    fn offload_function(
        &self,
        _app: &dyn OffloadApp,
        msg: &[u8],
        req: ReqDesc,
        _cache: &CacheView<'_>,
    ) -> Offload {
        let (Some(file), Some(r)) = (
            self.file,
            msg.get(req.offset as usize..).and_then(request_of),
        ) else {
            return Offload::Host;
        };
        let flags_ok = r.flags == 0 || (self.structured && r.flags == proto::CMD_FLAG_DF);
        let in_range = r.len > 0
            && r.len <= proto::PAYLOAD_MAX
            && r.offset
                .checked_add(u64::from(r.len))
                .is_some_and(|e| e <= self.size);
        if r.command != proto::CMD_READ
            || !flags_ok
            || !in_range
            || !self.marks.clear(file, r.offset, u64::from(r.len))
        {
            return Offload::Host;
        }
        Offload::Read(ReadOp {
            file_id: file,
            size: r.len,
            offset: r.offset,
        })
    }

    fn request_head(&self, msg: &[u8], req: ReqDesc, head: &mut [u8; REQUEST_HEAD_BYTES]) -> usize {
        let req = &msg[req.offset as usize..(req.offset + req.len) as usize];
        let n = req.len().min(proto::REQUEST);
        head[..n].copy_from_slice(&req[..n]);
        head[n] = u8::from(self.structured);
        n + 1
    }

    fn forward(&mut self, msg: &[u8], req: ReqDesc) -> Result<bool, Malformed> {
        let r = msg
            .get(req.offset as usize..)
            .and_then(request_of)
            .ok_or(Malformed("short request"))?;
        if r.command == proto::CMD_DISC {
            return Ok(false);
        }
        if self.handles.contains(r.handle) {
            return Err(Malformed("a handle used again before the host answered it"));
        }
        let value = match r.command {
            proto::CMD_READ if r.len <= proto::PAYLOAD_MAX => (KIND_READ << KIND_SHIFT) | r.len,
            proto::CMD_WRITE | proto::CMD_WRITE_ZEROES | proto::CMD_TRIM
                if r.len > 0 && r.offset < self.size && self.file.is_some() =>
            {
                let file = self.file.expect("checked");
                let end = r.offset.saturating_add(u64::from(r.len)).min(self.size);
                let first = r.offset >> REGION_SHIFT;
                let count = ((end - 1) >> REGION_SHIFT) - first + 1;
                let idx = self
                    .free
                    .pop()
                    .ok_or(Malformed("too many writes in flight"))?;
                self.marks.mark(file, first, count as u32, true);
                self.writes[idx as usize] = Some((file, first, count as u32));
                (KIND_MARK << KIND_SHIFT) | idx
            }
            _ => KIND_OTHER << KIND_SHIFT,
        };
        self.handles
            .update(r.handle, |_| value)
            .map_err(|_| Malformed("too many requests in flight"))?;
        Ok(true)
    }

    fn delivered(&mut self, resp: &[u8]) {
        let Ok(Some((_, handle))) = frame_reply(resp, |h| self.read_len(h)) else {
            return;
        };
        let Some(v) = self.handles.remove(handle) else {
            return;
        };
        if v >> KIND_SHIFT == KIND_MARK {
            let idx = v & VALUE_MASK;
            if let Some((file, first, count)) = self.writes[idx as usize].take() {
                self.marks.mark(file, first, count, false);
                self.free.push(idx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dds_cache::{CacheItem, CacheWriter, Config};

    fn option(option: u32, data: &[u8]) -> Vec<u8> {
        let mut m = proto::IHAVEOPT.to_be_bytes().to_vec();
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        m
    }

    fn go_data(name: &[u8]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name);
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    }

    fn request(command: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut m = Vec::new();
        proto::encode_request(
            &mut m,
            &Request {
                magic: proto::REQUEST_MAGIC,
                flags,
                command,
                handle,
                offset,
                len,
            },
        );
        m
    }

    /// Feeds `bytes` of the client (`client`) or of the host through the session's opening
    /// framing, unit by unit, as the director does.
    fn feed(s: &mut NbdConn, client: bool, bytes: &[u8], cache: &CacheView<'_>) {
        let mut at = 0;
        while at < bytes.len() {
            let rest = &bytes[at..];
            let n = if client {
                s.opening_message_len(rest)
            } else {
                s.opening_response_len(rest)
            }
            .unwrap()
            .expect("whole units");
            if client {
                s.opening_message(&rest[..n]).unwrap();
            } else {
                s.opening_response(&rest[..n], cache).unwrap();
            }
            at += n;
        }
    }

    const FILE: u32 = 9;
    const SIZE: u64 = 8 << 20;

    /// A session through the handshake of export `disk` (structured replies on).
    fn transmitting(app: &NbdApp, cache: &CacheView<'_>) -> NbdConn {
        let mut s = NbdConn::new(app.marks.clone());
        let mut g = Vec::new();
        proto::greeting(&mut g);
        assert_eq!(s.phase(), Phase::Opening);
        feed(&mut s, false, &g, cache);
        feed(&mut s, true, &3u32.to_be_bytes(), cache);
        feed(
            &mut s,
            true,
            &option(proto::OPT_STRUCTURED_REPLY, &[]),
            cache,
        );
        assert_eq!(s.phase(), Phase::Opening);
        let mut r = Vec::new();
        proto::opt_reply(&mut r, proto::OPT_STRUCTURED_REPLY, proto::REP_ACK, &[]);
        feed(&mut s, false, &r, cache);
        // An unknown export: the handshake goes on.
        feed(
            &mut s,
            true,
            &option(proto::OPT_GO, &go_data(b"nope")),
            cache,
        );
        assert_eq!(s.phase(), Phase::AwaitHost);
        r.clear();
        proto::opt_reply(&mut r, proto::OPT_GO, proto::REP_ERR_UNKNOWN, &[]);
        feed(&mut s, false, &r, cache);
        assert_eq!(s.phase(), Phase::Opening);
        feed(
            &mut s,
            true,
            &option(proto::OPT_GO, &go_data(b"disk")),
            cache,
        );
        assert_eq!(s.phase(), Phase::AwaitHost);
        r.clear();
        proto::info_export(&mut r, proto::OPT_GO, SIZE, 0x1ed);
        proto::info_block_size(&mut r, proto::OPT_GO);
        proto::opt_reply(&mut r, proto::OPT_GO, proto::REP_ACK, &[]);
        feed(&mut s, false, &r, cache);
        assert_eq!(s.phase(), Phase::Requests);
        assert!(s.structured);
        s
    }

    #[test]
    fn export_keys_are_fnv1a_of_the_prefixed_name() {
        // FNV-1a 64 of "nbd export" alone, and the key depends on every byte of the name.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in b"nbd export" {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        assert_eq!(export_key(b""), h);
        assert_ne!(export_key(b"disk"), export_key(b"disl"));
    }

    #[test]
    fn a_session_follows_the_handshake_and_serves_reads_no_write_covers() {
        let app = NbdApp::new();
        let mut w = CacheWriter::new(Config::for_items(16)).unwrap();
        w.insert(CacheItem {
            tag: SIZE,
            ..CacheItem::new(export_key(b"disk"), 1, FILE, 0, 0)
        })
        .unwrap();
        let reader = w.reader();
        let cache = CacheView::new(&reader);
        let mut s = transmitting(&app, &cache);
        assert_eq!(s.file, Some(FILE));
        let d = |m: &[u8]| ReqDesc {
            offset: 0,
            len: m.len() as u32,
            pos: 0,
        };
        let read = request(proto::CMD_READ, 0, 1, 4096, 4096);
        let dpu = Offload::Read(ReadOp {
            file_id: FILE,
            size: 4096,
            offset: 4096,
        });
        assert_eq!(s.offload_function(&app, &read, d(&read), &cache), dpu);
        // Out of range, a flag READ does not take, DF with structured replies.
        for (flags, off, len) in [(0, SIZE - 1, 2), (proto::CMD_FLAG_FUA, 0, 1), (0, 0, 0)] {
            let r = request(proto::CMD_READ, flags, 2, off, len);
            assert_eq!(s.offload_function(&app, &r, d(&r), &cache), Offload::Host);
        }
        let df = request(proto::CMD_READ, proto::CMD_FLAG_DF, 2, 0, 512);
        assert!(matches!(
            s.offload_function(&app, &df, d(&df), &cache),
            Offload::Read(_)
        ));
        // A write in flight on another connection keeps overlapping reads on the host.
        let mut other = transmitting(&app, &cache);
        let write = request(proto::CMD_WRITE, 0, 5, 8000, 100);
        assert_eq!(other.forward(&write, d(&write)), Ok(true));
        assert_eq!(
            s.offload_function(&app, &read, d(&read), &cache),
            Offload::Host
        );
        let far = request(proto::CMD_READ, 0, 3, 1 << 20, 4096);
        assert!(matches!(
            s.offload_function(&app, &far, d(&far), &cache),
            Offload::Read(_)
        ));
        // A handle the host has not answered cannot be used again.
        assert!(other.forward(&write, d(&write)).is_err());
        // Its reply delivered: the reads are the DPU's again.
        let mut reply = Vec::new();
        proto::simple_reply(&mut reply, 0, 5);
        assert_eq!(other.response_len(&reply), Ok(Some(16)));
        other.delivered(&reply);
        assert_eq!(s.offload_function(&app, &read, d(&read), &cache), dpu);
        // So after a connection closes with a write in flight.
        let zeroes = request(proto::CMD_WRITE_ZEROES, 0, 6, 0, 1 << 20);
        assert_eq!(other.forward(&zeroes, d(&zeroes)), Ok(true));
        assert_eq!(
            s.offload_function(&app, &read, d(&read), &cache),
            Offload::Host
        );
        drop(other);
        assert_eq!(s.offload_function(&app, &read, d(&read), &cache), dpu);
        // DISC gets no reply.
        let disc = request(proto::CMD_DISC, 0, 7, 0, 0);
        assert_eq!(s.forward(&disc, d(&disc)), Ok(false));
    }

    #[test]
    fn host_replies_are_framed_by_what_was_asked() {
        let app = NbdApp::new();
        let w = CacheWriter::new(Config::for_items(16)).unwrap();
        let reader = w.reader();
        let cache = CacheView::new(&reader);
        let mut s = transmitting(&app, &cache);
        assert_eq!(s.file, None, "nothing published: every request to the host");
        let read = request(proto::CMD_READ, 0, 11, 0, 512);
        let d = ReqDesc {
            offset: 0,
            len: 28,
            pos: 0,
        };
        assert_eq!(s.offload_function(&app, &read, d, &cache), Offload::Host);
        assert_eq!(s.forward(&read, d), Ok(true));
        let mut r = Vec::new();
        proto::simple_reply(&mut r, 0, 11);
        assert_eq!(s.response_len(&r), Ok(Some(16 + 512)));
        r[7] = 5;
        assert_eq!(s.response_len(&r), Ok(Some(16)), "an error has no data");
        // Structured: the chunks up to the one with DONE.
        r.clear();
        proto::structured_header(&mut r, 0, proto::REPLY_TYPE_OFFSET_DATA, 11, 8 + 100);
        r.extend_from_slice(&[0u8; 108]);
        assert_eq!(s.response_len(&r), Ok(None));
        proto::read_reply_header(&mut r, true, 11, 100, 412);
        assert_eq!(s.response_len(&r), Ok(Some(128 + 28 + 412)));
        r.extend_from_slice(&[0u8; 412]);
        s.delivered(&r);
        assert!(s.handles.is_empty());
        assert!(s.response_len(&[0x12, 0x34, 0x56, 0x78]).is_err());
    }

    #[test]
    fn dpu_replies_are_the_documented_bytes() {
        let app = NbdApp::new();
        let op = ReadOp {
            file_id: FILE,
            size: 512,
            offset: 4096,
        };
        let mut head = request(proto::CMD_READ, 0, 0x0102, 4096, 512);
        let mut room = [0u8; HEADER_ROOM];
        let mut data = [0u8; 512];
        for structured in [false, true] {
            head.truncate(proto::REQUEST);
            head.push(u8::from(structured));
            let l = app
                .build_response(&head, &op, Ok(512), &mut room, &mut data)
                .unwrap();
            let mut want = Vec::new();
            proto::read_reply_header(&mut want, structured, 0x0102, 4096, 512);
            assert_eq!(&room[HEADER_ROOM - want.len()..], &want[..]);
            assert_eq!(
                (l.header_len, l.total_len),
                (want.len() as u32, want.len() as u32 + 512)
            );
            for result in [Ok(100), Err(3)] {
                let l = app
                    .build_response(&head, &op, result, &mut room, &mut data)
                    .unwrap();
                want.clear();
                proto::read_error(&mut want, structured, 0x0102, proto::EIO);
                assert_eq!(&room[HEADER_ROOM - want.len()..], &want[..]);
                assert_eq!(
                    (l.header_len, l.total_len),
                    (want.len() as u32, want.len() as u32)
                );
            }
        }
    }
}
