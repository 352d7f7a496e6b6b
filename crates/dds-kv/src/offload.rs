//! The DPU half of `dds kv` (`docs/kv-service.md` §4): the offload app `redis`.
//!
//! One RESP command is one message. A `GET` whose whole request fits in the director's
//! request head and whose key the cache table holds (tag = the key's second hash word) is read
//! on the DPU: the whole log record, checked against the requested key by the response
//! builder, which moves the value to the front and writes `$<len>\r\n` in front of it.
//! `HGET`, `SISMEMBER` and `ZSCORE` of an element are served the same way when the cache
//! table knows the collection's live version (its metadata entry) and the element (an entry
//! tagged with that version: `docs/kv-service.md` §4.1). Every write command invalidates its
//! keys, or the elements it names, before the host sees it; cache-on-write learns the value,
//! metadata and element records of every log write.

use dds_cache::CacheItem;
use dds_offload_api::{
    CacheView, ItemList, KeyList, Malformed, Offload, OffloadApp, Phase, ReadOp, ReadResult,
    ReqDesc, ReqList, ResponseLayout, Session, HOST_MESSAGE_SLACK, REQUEST_HEAD_BYTES, TOO_BIG,
};
use dds_resp::{args, frame_command, frame_reply, unquote_word, Limits};

use crate::collection::{self, CollType};
use crate::record::{self, FLAG_SUPERSEDED, KIND_VALUE};

/// Most keys one forwarded write may name (the server refuses larger multi-key writes when
/// offload is on, so the invalidation list never overflows).
pub const MAX_WRITE_KEYS: usize = 1000;

/// Bytes reserved in front of DPU-read data for the reply header.
const ROOM: usize = 64;

/// Default largest client command (and bulk string) and, plus [`REPLY_SLACK`], host reply
/// the `redis` app passes through the director.
pub const DEFAULT_MAX_MESSAGE: usize = 64 << 20;

/// Bytes a reply may add to the largest command: array and bulk headers around values.
pub const REPLY_SLACK: usize = 64 << 10;

/// The `redis` offload app.
#[derive(Clone, Debug)]
pub struct RedisApp {
    limits: Limits,
    max_message: usize,
    max_response: usize,
}

impl Default for RedisApp {
    fn default() -> Self {
        RedisApp::new(DEFAULT_MAX_MESSAGE)
    }
}

impl RedisApp {
    /// Client messages (commands, and so every bulk string, like Redis's
    /// `proto-max-bulk-len`) up to `max_message` bytes; host replies up to `max_message` +
    /// [`REPLY_SLACK`].
    pub fn new(max_message: usize) -> Self {
        RedisApp {
            limits: Limits {
                max_bulk: max_message,
                max_args: i32::MAX as usize,
                max_inline: 64 << 10,
                unauthenticated: false,
            },
            max_message,
            max_response: max_message.saturating_add(REPLY_SLACK),
        }
    }

    /// The same with host replies up to `max_response` bytes.
    pub fn with_max_response(mut self, max_response: usize) -> Self {
        self.max_response = max_response;
        self
    }
}

/// The key of a `GET key` command, if `msg` is exactly that (and not an inline command with
/// quotes, which goes to the host).
fn get_key(msg: &[u8]) -> Option<&[u8]> {
    let mut a = args(msg);
    if a.quoted() {
        return None;
    }
    let cmd = a.next()?;
    if !cmd.eq_ignore_ascii_case(b"GET") {
        return None;
    }
    let key = a.next()?;
    if a.next().is_some() {
        return None;
    }
    Some(key)
}

/// A read of one element of a collection that the DPU serves (§4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ElementRead {
    /// `HGET key field`: the field's value.
    HGet,
    /// `SISMEMBER key member`: `:1` (a miss goes to the host, which answers `:0`).
    SIsMember,
    /// `ZSCORE key member`: the member's score as a bulk string (RESP2).
    ZScore,
}

impl ElementRead {
    fn coll_type(self) -> CollType {
        match self {
            ElementRead::HGet => CollType::Hash,
            ElementRead::SIsMember => CollType::Set,
            ElementRead::ZScore => CollType::ZSet,
        }
    }
}

/// The element read of `msg`, if it is exactly `HGET key field`, `SISMEMBER key member` or
/// `ZSCORE key member` (not an inline command with quotes, which goes to the host).
fn element_read(msg: &[u8]) -> Option<(ElementRead, &[u8], &[u8])> {
    let mut a = args(msg);
    if a.quoted() {
        return None;
    }
    let cmd = a.next()?;
    let what = if cmd.eq_ignore_ascii_case(b"HGET") {
        ElementRead::HGet
    } else if cmd.eq_ignore_ascii_case(b"SISMEMBER") {
        ElementRead::SIsMember
    } else if cmd.eq_ignore_ascii_case(b"ZSCORE") {
        ElementRead::ZScore
    } else {
        return None;
    };
    let (key, sub) = (a.next()?, a.next()?);
    if a.next().is_some() {
        return None;
    }
    Some((what, key, sub))
}

/// Where the cache table has element `sub` of `key`'s collection of type `ty` (§4.1): the
/// key's metadata entry gives the live version (and the type), the element's entry must
/// carry that version in its tag. A set member's read is 0 bytes: its entry is the answer.
fn cached_element(
    cache: &CacheView<'_>,
    what: ElementRead,
    key: &[u8],
    sub: &[u8],
) -> Option<ReadOp> {
    let meta = cache.get(record::key_hash(key).0)?;
    let version = collection::tag_version(meta.tag, what.coll_type())?;
    let (e1, e2) = collection::element_cache_hash(key, sub)?;
    let it = cache.get(e1).filter(|it| it.tag == e2 ^ version)?;
    Some(ReadOp {
        file_id: it.file_id,
        size: if what == ElementRead::SIsMember {
            0
        } else {
            it.size
        },
        offset: it.offset,
    })
}

/// Most keys of an MGET split between the DPU and the host (larger MGETs go to the host).
pub const MAX_MGET_SPLIT: usize = 64;

/// The host-side command that answers the host part of a split MGET: one reply frame per
/// key, no array header (`docs/kv-service.md` §4).
pub const MGET_PART: &[u8] = b"DDS.MGETPART";

/// The host-side command that answers the host part of a split HMGET: the key, then the
/// fields, answered one reply frame per field, no array header (`docs/kv-service.md` §4.1).
pub const HMGET_PART: &[u8] = b"DDS.HMGETPART";

/// Most arguments of a split command: an HMGET's key and [`MAX_MGET_SPLIT`] fields.
const MAX_SPLIT_ARGS: usize = MAX_MGET_SPLIT + 1;

/// The arguments of a RESP array command `name`: (offset of the `$` of each argument's bulk
/// string, that bulk string's length with CRLFs); `None` if `msg` is not such a command of
/// 1..=`max` arguments (an inline command has no bulk strings to split along).
fn bulk_args(msg: &[u8], name: &[u8], max: usize) -> Option<(usize, [(u32, u32); MAX_SPLIT_ARGS])> {
    if msg.first() != Some(&b'*') {
        return None;
    }
    let mut a = args(msg);
    if !a.next()?.eq_ignore_ascii_case(name) {
        return None;
    }
    let mut out = [(0u32, 0u32); MAX_SPLIT_ARGS];
    let mut n = 0;
    for k in a {
        if n == max.min(MAX_SPLIT_ARGS) {
            return None;
        }
        let at = k.as_ptr() as usize - msg.as_ptr() as usize;
        let digits = decimal_digits(k.len());
        let start = at - digits - 3;
        out[n] = (start as u32, (digits + 3 + k.len() + 2) as u32);
        n += 1;
    }
    (n > 0).then_some((n, out))
}

/// The key arguments of an `MGET` command (see [`bulk_args`]), at most `max` of them.
fn mget_keys(msg: &[u8], max: usize) -> Option<(usize, [(u32, u32); MAX_SPLIT_ARGS])> {
    bulk_args(msg, b"MGET", max.min(MAX_MGET_SPLIT))
}

/// Splits a command whose arguments are the bulk strings `args` (offsets and lengths in
/// `msg`): request 0 is the array header with the first `kept` arguments (answered on the
/// DPU without a read), each later argument a request of its own, to the DPU when `hit`
/// (given its bulk string, each once: the cache changes under the planner) says it is
/// cached, else to the host's `part` command. `false`, with nothing pushed, when no argument
/// is cached or the host part with every argument would not fit the host message's room
/// (all of them go there if none can be read on the DPU after all).
fn split_args(
    msg: &[u8],
    args: &[(u32, u32)],
    kept: usize,
    part: &[u8],
    mut hit: impl FnMut(&[u8]) -> bool,
    host: &mut ReqList,
    dpu: &mut ReqList,
) -> Result<bool, Malformed> {
    let full = |_| Malformed("request list full");
    let mut hits = [false; MAX_SPLIT_ARGS];
    let mut any = false;
    for (i, &(off, len)) in args.iter().enumerate().skip(kept) {
        hits[i] = hit(&msg[off as usize..(off + len) as usize]);
        any |= hits[i];
    }
    let host_len = 1 + decimal_digits(args.len() + 1) + 2 + 1 + 2 + 2 + part.len() + 2;
    let all: usize = args.iter().map(|a| a.1 as usize).sum();
    if !any || host_len + all > msg.len() + HOST_MESSAGE_SLACK {
        return Ok(false);
    }
    dpu.push(ReqDesc {
        offset: 0,
        len: args[kept].0,
        pos: 0,
    })
    .map_err(full)?;
    for (i, &(offset, len)) in args.iter().enumerate().skip(kept) {
        let d = ReqDesc {
            offset,
            len,
            pos: (i - kept + 1) as u32,
        };
        let list = if hits[i] { &mut *dpu } else { &mut *host };
        list.push(d).map_err(full)?;
    }
    Ok(true)
}

/// The key of an `HMGET` in RESP array form.
fn hmget_key(msg: &[u8]) -> Option<&[u8]> {
    if msg.first() != Some(&b'*') {
        return None;
    }
    let mut a = args(msg);
    a.next()?
        .eq_ignore_ascii_case(b"HMGET")
        .then(|| a.next())
        .flatten()
}

/// The request head of one field of a split HMGET: the command `HGET key field`, which the
/// response builder answers as an HGET; `None` when it does not fit.
fn hget_head(key: &[u8], field: &[u8], head: &mut [u8; REQUEST_HEAD_BYTES]) -> Option<usize> {
    let mut w = &mut head[..];
    std::io::Write::write_fmt(
        &mut w,
        format_args!("*3\r\n$4\r\nHGET\r\n${}\r\n", key.len()),
    )
    .ok()?;
    std::io::Write::write_all(&mut w, key).ok()?;
    std::io::Write::write_fmt(&mut w, format_args!("\r\n${}\r\n", field.len())).ok()?;
    std::io::Write::write_all(&mut w, field).ok()?;
    std::io::Write::write_all(&mut w, b"\r\n").ok()?;
    Some(REQUEST_HEAD_BYTES - w.len())
}

fn decimal_digits(mut n: usize) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// The key of a request head: a whole `GET key` command, or one `$len\r\nkey\r\n` bulk string
/// (a key of a split MGET).
fn head_key(head: &[u8]) -> Option<&[u8]> {
    if head.first() == Some(&b'$') {
        let nl = head.iter().position(|&b| b == b'\n')?;
        let n: usize = std::str::from_utf8(head.get(1..nl - 1)?)
            .ok()?
            .parse()
            .ok()?;
        return head.get(nl + 1..nl + 1 + n);
    }
    get_key(head)
}

fn cached(cache: &CacheView<'_>, key: &[u8]) -> Option<ReadOp> {
    let (h1, h2) = record::key_hash(key);
    cache.get(h1).filter(|it| it.tag == h2).map(|it| ReadOp {
        file_id: it.file_id,
        size: it.size,
        offset: it.offset,
    })
}

/// Pushes the hashes of the keys a command's words (`words`: name first) may modify, each
/// once when the list would fill (a command may name one key many times: the host counts
/// distinct keys against [`MAX_WRITE_KEYS`], and refuses a write of more).
fn push_write_keys<'a>(words: impl Iterator<Item = &'a [u8]> + Clone, keys: &mut KeyList) {
    if push_element_writes(words.clone(), keys) {
        return;
    }
    for_write_keys(words, |k| {
        if keys.len() + 1 >= keys.capacity() {
            // Sorted and deduplicated in place: no allocation.
            let s = keys.as_mut_slice();
            s.sort_unstable();
            let mut n = 0;
            for i in 0..s.len() {
                if i == 0 || s[i] != s[n - 1] {
                    s[n] = s[i];
                    n += 1;
                }
            }
            keys.truncate(n);
        }
        if keys.len() + 1 < keys.capacity() {
            let _ = keys.push(record::key_hash(k).0);
        }
    });
}

/// A command that writes elements it names of one collection (HSET, SADD, ZADD, ...: §4.1):
/// pushes their element cache keys, and not the collection's key, whose metadata entry stays
/// (every other element stays served on the DPU). `false` when `words` are no such command,
/// or name more elements than the list has room for (the caller then names the collection
/// key, which stops the DPU serving any element of it until its metadata is cached again).
fn push_element_writes<'a>(
    mut words: impl Iterator<Item = &'a [u8]> + Clone,
    keys: &mut KeyList,
) -> bool {
    let Some(cmd) = words.next() else {
        return false;
    };
    let is = |l: &[&str]| l.iter().any(|c| cmd.eq_ignore_ascii_case(c.as_bytes()));
    // The arguments after the name: the sub-keys from `first` on, every `step`-th (0: one).
    let (first, step) = if is(&["HSET", "HMSET"]) {
        (1, 2)
    } else if is(&["HSETNX", "HINCRBY", "HINCRBYFLOAT"]) {
        (1, 0)
    } else if is(&["HDEL", "SADD", "SREM", "ZREM"]) {
        (1, 1)
    } else if is(&["ZINCRBY"]) {
        (2, 0)
    } else if is(&["ZADD"]) {
        // Options first (as Redis reads them), then score-member pairs.
        let opts = crate::zsets::zadd_options(words.clone().skip(1));
        (2 + opts, 2)
    } else if is(&["SMOVE"]) {
        // The member leaves the source and joins the destination.
        let mut a = words;
        let (Some(src), Some(dst), Some(m)) = (a.next(), a.next(), a.next()) else {
            return false;
        };
        if keys.len() + 3 >= keys.capacity() {
            return false;
        }
        for k in [src, dst] {
            if let Some(h) = collection::element_cache_hash(k, m) {
                let _ = keys.push(h.0);
            }
        }
        return true;
    } else {
        return false;
    };
    let Some(key) = words.next() else {
        return false;
    };
    let subs = words
        .enumerate()
        .map(|(i, w)| (i + 1, w))
        .filter(move |&(i, _)| {
            if step == 0 {
                i == first
            } else {
                i >= first && (i - first) % step == 0
            }
        })
        .map(|(_, w)| w);
    if keys.len() + subs.clone().count() + 1 >= keys.capacity() {
        return false;
    }
    for sub in subs {
        if let Some(h) = collection::element_cache_hash(key, sub) {
            let _ = keys.push(h.0);
        }
    }
    true
}

/// Calls `f` with every key a command's words (`words`: name first) may modify, as the
/// director's invalidations and the server's WATCH see them (a superset: a few words that
/// are not keys, as SMOVE's member, may be among them).
pub fn for_write_keys<'a>(mut words: impl Iterator<Item = &'a [u8]>, mut f: impl FnMut(&'a [u8])) {
    let Some(cmd) = words.next() else {
        return;
    };
    let Some((first, step)) = write_keys(cmd) else {
        return;
    };
    for (i, arg) in words.enumerate() {
        let i = i + 1;
        let is_key = if step == 0 {
            i == first
        } else {
            i >= first && (i - first) % step == 0
        };
        if is_key {
            f(arg);
        }
        if step == 0 && i >= first {
            break;
        }
    }
}

/// Whether a command may modify keys, and where its keys are: (first key argument, step).
fn write_keys(cmd: &[u8]) -> Option<(usize, usize)> {
    const ONE: &[&str] = &[
        "SET",
        "SETNX",
        "SETEX",
        "PSETEX",
        "GETSET",
        "GETDEL",
        "GETEX",
        "INCR",
        "INCRBY",
        "DECR",
        "DECRBY",
        "INCRBYFLOAT",
        "APPEND",
        "SETRANGE",
        "SETBIT",
        "BITFIELD",
        "EXPIRE",
        "PEXPIRE",
        "EXPIREAT",
        "PEXPIREAT",
        "PERSIST",
        // Collections: no string is cached under their keys, but a command that creates or
        // removes one is a write of the key all the same.
        "HSET",
        "HMSET",
        "HSETNX",
        "HDEL",
        "HINCRBY",
        "HINCRBYFLOAT",
        "SADD",
        "SREM",
        "SPOP",
        "ZADD",
        "ZINCRBY",
        "ZREM",
        "ZPOPMIN",
        "ZPOPMAX",
        "ZREMRANGEBYRANK",
        "ZREMRANGEBYSCORE",
        "ZREMRANGEBYLEX",
        "LPUSH",
        "RPUSH",
        "LPUSHX",
        "RPUSHX",
        "LPOP",
        "RPOP",
        "LSET",
        "LINSERT",
        "LREM",
        "LTRIM",
    ];
    // SMOVE's member and the sources of a STORE are listed too (harmless: a member is not
    // a key, and the sources are read only).
    const ALL: &[&str] = &[
        "DEL",
        "UNLINK",
        "RENAME",
        "RENAMENX",
        "SMOVE",
        "SINTERSTORE",
        "SUNIONSTORE",
        "SDIFFSTORE",
        "LMOVE",
        "RPOPLPUSH",
        "BLMOVE",
        "BRPOPLPUSH",
        "BLPOP",
        "BRPOP",
        "BZPOPMIN",
        "BZPOPMAX",
        "LMPOP",
        "BLMPOP",
        "ZRANGESTORE",
        // SORT's STORE destination is somewhere among its arguments.
        "SORT",
        "ZUNIONSTORE",
        "ZINTERSTORE",
        "ZDIFFSTORE",
        "ZMPOP",
        "BZMPOP",
    ];
    const PAIRS: &[&str] = &["MSET", "MSETNX"];
    // The key written is the second argument.
    const SECOND: &[&str] = &["BITOP", "COPY"];
    let is = |l: &[&str]| l.iter().any(|c| cmd.eq_ignore_ascii_case(c.as_bytes()));
    if is(ONE) {
        Some((1, 0))
    } else if is(SECOND) {
        Some((2, 0))
    } else if is(ALL) {
        Some((1, 1))
    } else if is(PAIRS) {
        Some((1, 2))
    } else {
        None
    }
}

/// Writes `text` at the end of the header room as the whole response.
fn header_only(room: &mut [u8], text: &[u8]) -> ResponseLayout {
    let at = room.len() - text.len();
    room[at..].copy_from_slice(text);
    ResponseLayout {
        header_len: text.len() as u32,
        total_len: text.len() as u32,
    }
}

/// The reply to a DPU read that failed.
const READ_FAILED: &[u8] = b"-ERR DPU read of the record failed, retry\r\n";
/// The reply to a DPU read that found another record (its space was reused while the read
/// was in flight).
const MOVED: &[u8] = b"-TRYAGAIN record moved, retry\r\n";

/// The header of the record a DPU read brought (`data`), if the whole record was read, it is
/// of `kind`, not superseded, and `key_is` accepts its key; else the error reply.
fn record_read(
    op: &ReadOp,
    result: ReadResult,
    data: &[u8],
    kind: u8,
    key_is: impl FnOnce(&[u8]) -> bool,
) -> Result<record::Header, &'static [u8]> {
    let n = match result {
        Ok(n) if n == op.size => n as usize,
        _ => return Err(READ_FAILED),
    };
    record::decode_header(&data[..n])
        .filter(|h| {
            h.kind == kind
                && h.len() == n
                && h.flags & FLAG_SUPERSEDED == 0
                && key_is(&data[h.key_range()])
        })
        .ok_or(MOVED)
}

/// The DPU's reply to an element read (§4.1): the element record read is checked (an element
/// record, not superseded, of this key and sub-key) and its value answered.
fn element_response(
    what: ElementRead,
    key: &[u8],
    sub: &[u8],
    op: &ReadOp,
    result: ReadResult,
    room: &mut [u8],
    data: &mut [u8],
) -> Result<ResponseLayout, Malformed> {
    if what == ElementRead::SIsMember {
        // The member's cache entry is the answer; nothing was read.
        return Ok(header_only(room, b":1\r\n"));
    }
    let h = match record_read(op, result, data, collection::KIND_ELEMENT, |ck| {
        collection::decode_composite(ck).is_some_and(|c| c.key == key && c.sub == sub)
    }) {
        Ok(h) => h,
        Err(text) => return Ok(header_only(room, text)),
    };
    let v = h.value_range();
    if what == ElementRead::ZScore {
        let Some(score) = collection::decode_score(&data[v]) else {
            return Ok(header_only(room, MOVED));
        };
        let t = crate::zsets::ScoreText::new(score);
        let t = t.as_bytes();
        let mut hdr = [0u8; 24];
        let hl = dds_resp::bulk_header_into(t.len(), &mut hdr);
        let mut text = [0u8; 64];
        text[..hl].copy_from_slice(&hdr[..hl]);
        text[hl..hl + t.len()].copy_from_slice(t);
        text[hl + t.len()..hl + t.len() + 2].copy_from_slice(b"\r\n");
        return Ok(header_only(room, &text[..hl + t.len() + 2]));
    }
    Ok(bulk_in_place(v, room, data))
}

/// Moves the value at `v` of the data buffer to its front as a bulk string reply, its
/// header at the end of the room.
fn bulk_in_place(v: std::ops::Range<usize>, room: &mut [u8], data: &mut [u8]) -> ResponseLayout {
    let vlen = v.len();
    data.copy_within(v, 0);
    data[vlen..vlen + 2].copy_from_slice(b"\r\n");
    let mut hdr = [0u8; 24];
    let hl = dds_resp::bulk_header_into(vlen, &mut hdr);
    let at = room.len() - hl;
    room[at..].copy_from_slice(&hdr[..hl]);
    ResponseLayout {
        header_len: hl as u32,
        total_len: (hl + vlen + 2) as u32,
    }
}

impl OffloadApp for RedisApp {
    fn name(&self) -> &str {
        "redis"
    }

    fn offloaded_request(&self) -> &str {
        "KV GET"
    }

    fn max_message_len(&self) -> usize {
        self.max_message
    }
    fn max_response_len(&self) -> usize {
        self.max_response
    }
    fn max_requests(&self) -> usize {
        MAX_MGET_SPLIT + 1
    }
    fn max_forward_keys(&self) -> usize {
        MAX_WRITE_KEYS + 1
    }
    fn max_write_items(&self) -> usize {
        // A write of at most 1 MiB of records of at least 40 bytes.
        (1 << 20) / 40 + 1
    }
    fn max_read_keys(&self) -> usize {
        1
    }
    fn host_answers_whole_messages(&self) -> bool {
        // One RESP command, one reply.
        true
    }
    fn header_room(&self) -> usize {
        ROOM
    }

    fn message_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        frame_command(buf, &self.limits).map_err(|e| Malformed(e.why))
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        frame_reply(buf, 64 << 10, self.max_response).map_err(|e| Malformed(e.why))
    }

    /// `-ERR Protocol error: <why>`, as Redis (and `dds kv`) answers before it closes the
    /// connection, with the byte it names when it names one (framing the input again finds
    /// it); a command over the limit is `query buffer limit exceeded`.
    fn error_reply(&self, why: Malformed, input: &[u8], out: &mut [u8]) -> usize {
        if why != TOO_BIG {
            if let Err(e) = frame_command(input, &self.limits) {
                return e.write_reply(out);
            }
        }
        let text = if why == TOO_BIG {
            "query buffer limit exceeded"
        } else {
            why.0
        };
        let parts: [&[u8]; 3] = [b"-ERR Protocol error: ", text.as_bytes(), b"\r\n"];
        let n: usize = parts.iter().map(|p| p.len()).sum();
        if n > out.len() {
            return 0;
        }
        let mut at = 0;
        for p in parts {
            out[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        n
    }

    fn offload_predicate(
        &self,
        msg: &[u8],
        cache: &CacheView<'_>,
        host: &mut ReqList,
        dpu: &mut ReqList,
    ) -> Result<(), Malformed> {
        let whole = ReqDesc {
            offset: 0,
            len: msg.len() as u32,
            pos: 0,
        };
        let full = Malformed("request list full");
        if msg.len() <= REQUEST_HEAD_BYTES {
            if let Some(k) = get_key(msg) {
                let list = if cached(cache, k).is_some() {
                    dpu
                } else {
                    host
                };
                return list.push(whole).map_err(|_| full);
            }
            if let Some((what, k, sub)) = element_read(msg) {
                let list = if cached_element(cache, what, k, sub).is_some() {
                    dpu
                } else {
                    host
                };
                return list.push(whole).map_err(|_| full);
            }
        }
        // An MGET is split when some of its keys are cached: request 0 is the array header
        // (built on the DPU), requests 1.. the keys, each to the DPU or the host.
        if let Some((n, keys)) = mget_keys(msg, dpu.capacity() - 1) {
            let hit = |b: &[u8]| {
                b.len() <= REQUEST_HEAD_BYTES
                    && head_key(b).is_some_and(|k| cached(cache, k).is_some())
            };
            if split_args(msg, &keys[..n], 0, MGET_PART, hit, host, dpu)? {
                return Ok(());
            }
        }
        // An HMGET of a cached hash is split the same way: request 0 is the header with the
        // key, requests 1.. the fields, each read on the DPU as an HGET when cached.
        if let Some((n, a)) = bulk_args(msg, b"HMGET", dpu.capacity()) {
            let key =
                head_key(&msg[a[0].0 as usize..(a[0].0 + a[0].1) as usize]).unwrap_or_default();
            let mut head = [0u8; REQUEST_HEAD_BYTES];
            let hit = |b: &[u8]| {
                let f = head_key(b).unwrap_or_default();
                hget_head(key, f, &mut head).is_some()
                    && cached_element(cache, ElementRead::HGet, key, f).is_some()
            };
            if split_args(msg, &a[..n], 1, HMGET_PART, hit, host, dpu)? {
                return Ok(());
            }
        }
        host.push(whole).map_err(|_| full)
    }

    fn offload_function(&self, msg: &[u8], req: ReqDesc, cache: &CacheView<'_>) -> Offload {
        let part = &msg[req.offset as usize..(req.offset + req.len) as usize];
        if req.pos == 0 && part.first() == Some(&b'*') && req.len < msg.len() as u32 {
            // The array header of a split MGET or HMGET: no read.
            return Offload::Read(ReadOp::default());
        }
        if let Some(key) = hmget_key(msg) {
            // A field of a split HMGET.
            let mut head = [0u8; REQUEST_HEAD_BYTES];
            let field = head_key(part).filter(|f| hget_head(key, f, &mut head).is_some());
            return match field.and_then(|f| cached_element(cache, ElementRead::HGet, key, f)) {
                Some(op) => Offload::Read(op),
                None => Offload::Host,
            };
        }
        if let Some((what, k, sub)) = element_read(part) {
            return match cached_element(cache, what, k, sub) {
                Some(op) => Offload::Read(op),
                None => Offload::Host,
            };
        }
        match head_key(part).and_then(|k| cached(cache, k)) {
            Some(op) => Offload::Read(op),
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
        if let Some((what, key, sub)) = element_read(req_head) {
            return element_response(what, key, sub, op, result, room, data);
        }
        if op.size == 0 {
            // The array header of a split MGET: `*<keys>`.
            let nl = req_head
                .iter()
                .position(|&b| b == b'\r')
                .ok_or(Malformed("MGET header without CRLF"))?;
            let argc: usize = std::str::from_utf8(&req_head[1..nl])
                .ok()
                .and_then(|t| t.parse().ok())
                .filter(|&a| a >= 2)
                .ok_or(Malformed("MGET header without a count"))?;
            // MGET's reply has an element per argument, HMGET's one per argument but the key.
            let name = req_head.get(nl + 2..nl + 13).unwrap_or_default();
            let skip = if name.eq_ignore_ascii_case(b"$5\r\nHMGET\r\n") {
                2
            } else {
                1
            };
            let mut text = [0u8; 24];
            let mut w = &mut text[..];
            std::io::Write::write_fmt(&mut w, format_args!("*{}\r\n", argc.saturating_sub(skip)))
                .map_err(|_| Malformed("MGET count too long"))?;
            let len = 24 - w.len();
            return Ok(header_only(room, &text[..len]));
        }
        let key = head_key(req_head).ok_or(Malformed("offloaded request is not a GET"))?;
        match record_read(op, result, data, KIND_VALUE, |k| k == key) {
            Ok(h) => Ok(bulk_in_place(h.value_range(), room, data)),
            Err(text) => Ok(header_only(room, text)),
        }
    }

    fn build_host_message(
        &self,
        msg: &[u8],
        host: &[ReqDesc],
        out: &mut [u8],
    ) -> Result<usize, Malformed> {
        if host.len() == 1 && host[0].len as usize == msg.len() {
            out[..msg.len()].copy_from_slice(msg);
            return Ok(msg.len());
        }
        // The host part of a split MGET: `DDS.MGETPART key...`, answered one frame per key;
        // of a split HMGET: `DDS.HMGETPART key field...`, one frame per field.
        let hmget = hmget_key(msg);
        let (part, extra) = match hmget {
            Some(_) => (HMGET_PART, 1),
            None => (MGET_PART, 0),
        };
        let mut at = 0;
        let mut put = |b: &[u8]| -> Result<(), Malformed> {
            out.get_mut(at..at + b.len())
                .ok_or(Malformed("host message too large"))?
                .copy_from_slice(b);
            at += b.len();
            Ok(())
        };
        let mut head = [0u8; 48];
        let mut w = &mut head[..];
        std::io::Write::write_fmt(
            &mut w,
            format_args!("*{}\r\n${}\r\n", host.len() + 1 + extra, part.len()),
        )
        .map_err(|_| Malformed("host message header"))?;
        let hl = 48 - w.len();
        put(&head[..hl])?;
        put(part)?;
        put(b"\r\n")?;
        if let Some(key) = hmget {
            let mut kh = [0u8; 24];
            let kl = dds_resp::bulk_header_into(key.len(), &mut kh);
            put(&kh[..kl])?;
            put(key)?;
            put(b"\r\n")?;
        }
        for d in host {
            if d.pos == 0 {
                return Err(Malformed("an MGET header sent to the host"));
            }
            put(&msg[d.offset as usize..(d.offset + d.len) as usize])?;
        }
        Ok(at)
    }

    fn session(&self) -> Option<Box<dyn Session>> {
        Some(Box::new(RedisSession {
            max_response: self.max_response,
            in_multi: false,
            hello: false,
        }))
    }

    fn invalidate_on_forward(&self, msg: &[u8], _req: ReqDesc, keys: &mut KeyList) {
        let a = args(msg);
        if !a.quoted() {
            push_write_keys(a, keys);
            return;
        }
        // An inline command with quotes or escapes: its words are decoded first, into a
        // buffer each director thread keeps (decoded words are never longer than the line).
        thread_local! {
            static WORDS: std::cell::RefCell<(Vec<u8>, Vec<std::ops::Range<usize>>)> =
                const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
        }
        WORDS.with_borrow_mut(|(bytes, ranges)| {
            bytes.clear();
            ranges.clear();
            for w in a {
                let start = bytes.len();
                unquote_word(w, bytes);
                ranges.push(start..bytes.len());
            }
            push_write_keys(ranges.iter().map(|r| &bytes[r.clone()]), keys);
        });
    }

    fn cache_on_write(&self, file_id: u32, offset: u64, data: &[u8], items: &mut ItemList) {
        for (at, h) in record::scan(data) {
            if h.flags & FLAG_SUPERSEDED != 0 || h.expire_ms != 0 {
                continue;
            }
            let key = &data[at + h.key_range().start..at + h.key_range().end];
            // What the entry is keyed by, and its tag (§4, §4.1).
            let (k, tag) = match h.kind {
                KIND_VALUE => record::key_hash(key),
                collection::KIND_META => {
                    let v = &data[at + h.value_range().start..at + h.value_range().end];
                    match collection::decode_meta(v).and_then(collection::meta_tag) {
                        Some(tag) => (record::key_hash(key).0, tag),
                        None => continue,
                    }
                }
                collection::KIND_ELEMENT => {
                    let Some(c) = collection::decode_composite(key) else {
                        continue;
                    };
                    match collection::element_cache_hash(c.key, c.sub) {
                        Some((e1, e2)) => (e1, e2 ^ c.version),
                        None => continue,
                    }
                }
                _ => continue,
            };
            let mut it = CacheItem::new(k, 0, file_id, offset + at as u64, h.len() as u32);
            it.tag = tag;
            if items.push(it).is_err() {
                return;
            }
        }
    }

    fn invalidate_on_read(&self, _file_id: u32, _offset: u64, _len: u32, _keys: &mut KeyList) {
        // The host never changes what it reads back from the log.
    }
}

/// A client connection's state that the DPU must know: whether it is inside a transaction.
/// Between a MULTI and its EXEC or DISCARD the host queues commands (`+QUEUED`) and runs them
/// at EXEC, so no GET of that stretch may be answered by the DPU: every message goes to the
/// host whole (`Session::whole_to_host`). A MULTI the host refuses (nested, before AUTH)
/// keeps the session in the transaction until the next EXEC or DISCARD: the safe side, as
/// the host then answers everything.
struct RedisSession {
    max_response: usize,
    in_multi: bool,
    /// The client sent HELLO (it may speak RESP3, where a score is a double, not the bulk
    /// string the DPU answers): its ZSCOREs go to the host.
    hello: bool,
}

/// The command name of a message (its first word, quotes of an inline command taken off).
fn command_name(msg: &[u8]) -> &[u8] {
    let w = args(msg).next().unwrap_or_default();
    match (w.first(), w.last()) {
        (Some(b'"'), Some(b'"')) | (Some(b'\''), Some(b'\'')) if w.len() >= 2 => &w[1..w.len() - 1],
        _ => w,
    }
}

impl Session for RedisSession {
    fn phase(&self) -> Phase {
        Phase::Requests
    }

    // No opening exchange: a Redis client speaks first, in requests.
    fn opening_message_len(&self, _buf: &[u8]) -> Result<Option<usize>, Malformed> {
        Err(Malformed("no opening exchange"))
    }

    fn opening_message(&mut self, _msg: &[u8]) -> Result<(), Malformed> {
        Err(Malformed("no opening exchange"))
    }

    fn opening_response_len(&self, _buf: &[u8]) -> Result<Option<usize>, Malformed> {
        Err(Malformed("no opening exchange"))
    }

    fn opening_response(&mut self, _resp: &[u8], _cache: &CacheView<'_>) -> Result<(), Malformed> {
        Err(Malformed("no opening exchange"))
    }

    fn response_len(&self, buf: &[u8]) -> Result<Option<usize>, Malformed> {
        frame_reply(buf, 64 << 10, self.max_response).map_err(|e| Malformed(e.why))
    }

    fn whole_to_host(&self, _msg: &[u8]) -> bool {
        self.in_multi
    }

    fn offload_function(
        &self,
        app: &dyn OffloadApp,
        msg: &[u8],
        req: ReqDesc,
        cache: &CacheView<'_>,
    ) -> Offload {
        if self.in_multi {
            return Offload::Host;
        }
        if self.hello && command_name(msg).eq_ignore_ascii_case(b"ZSCORE") {
            return Offload::Host;
        }
        app.offload_function(msg, req, cache)
    }

    /// A field of a split HMGET gets the head `HGET key field` (the builder answers it as an
    /// HGET); every other request its first bytes.
    fn request_head(&self, msg: &[u8], req: ReqDesc, head: &mut [u8; REQUEST_HEAD_BYTES]) -> usize {
        let part = &msg[req.offset as usize..(req.offset + req.len) as usize];
        if req.pos > 0 {
            if let Some(key) = hmget_key(msg) {
                if let Some(n) = head_key(part).and_then(|f| hget_head(key, f, head)) {
                    return n;
                }
            }
        }
        dds_offload_api::request_prefix(msg, req, head)
    }

    fn forward(&mut self, msg: &[u8], req: ReqDesc) -> Result<bool, Malformed> {
        // A message's first request carries its command (a split MGET's header is request 0).
        if req.offset == 0 {
            let name = command_name(msg);
            if name.eq_ignore_ascii_case(b"MULTI") {
                self.in_multi = true;
            } else if name.eq_ignore_ascii_case(b"EXEC") || name.eq_ignore_ascii_case(b"DISCARD") {
                self.in_multi = false;
            } else if name.eq_ignore_ascii_case(b"HELLO") {
                self.hello = true;
            }
        }
        Ok(true)
    }

    fn delivered(&mut self, _resp: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use dds_cache::{CacheWriter, Config};
    use dds_testkit::resp::command as cmd;

    #[test]
    fn gets_of_cached_records_are_read_and_answered_on_the_dpu() {
        let app = RedisApp::default();
        // A log write of two records; the second supersedes nothing.
        let mut page = vec![0u8; 256];
        let l1 = record::record_len(3, 5);
        record::encode(&mut page[..l1], KIND_VALUE, b"foo", b"hello", 1, 0);
        let l2 = record::record_len(3, 2);
        record::encode(&mut page[l1..l1 + l2], KIND_VALUE, b"bar", b"hi", 2, 0);
        let mut items = ItemList::with_capacity(app.max_write_items());
        app.cache_on_write(7, 4096, &page, &mut items);
        assert_eq!(items.len(), 2);
        let mut w = CacheWriter::new(Config::for_items(100)).unwrap();
        for it in items.as_slice() {
            w.insert(*it).unwrap();
        }
        let reader = w.reader();
        let view = CacheView::new(&reader);
        let get = cmd(&[b"get", b"foo"]);
        let (mut host, mut dpu) = (ReqList::with_capacity(1), ReqList::with_capacity(1));
        app.offload_predicate(&get, &view, &mut host, &mut dpu)
            .unwrap();
        assert_eq!((host.len(), dpu.len()), (0, 1));
        let Offload::Read(op) = app.offload_function(&get, dpu.as_slice()[0], &view) else {
            panic!("not offloaded");
        };
        assert_eq!((op.file_id, op.offset, op.size), (7, 4096, l1 as u32));
        let mut room = [0u8; ROOM];
        let mut data = vec![0u8; 128];
        data[..l1].copy_from_slice(&page[..l1]);
        let l = app
            .build_response(&get, &op, Ok(op.size), &mut room, &mut data)
            .unwrap();
        let mut out = room[ROOM - l.header_len as usize..].to_vec();
        out.extend_from_slice(&data[..(l.total_len - l.header_len) as usize]);
        assert_eq!(out, b"$5\r\nhello\r\n");
        // A record that is not the key's (space reused) is answered TRYAGAIN.
        data[..l1].copy_from_slice(&page[l1..l1 + l1]);
        let l = app
            .build_response(&get, &op, Ok(op.size), &mut room, &mut data)
            .unwrap();
        assert_eq!(
            &room[ROOM - l.header_len as usize..],
            b"-TRYAGAIN record moved, retry\r\n"
        );
        // Misses, other commands and long requests go to the host.
        for m in [
            cmd(&[b"GET", b"nope"]),
            cmd(&[b"SET", b"foo", b"x"]),
            cmd(&[b"GET", &[b'k'; 60]]),
        ] {
            let (mut host, mut dpu) = (ReqList::with_capacity(1), ReqList::with_capacity(1));
            app.offload_predicate(&m, &view, &mut host, &mut dpu)
                .unwrap();
            assert_eq!((host.len(), dpu.len()), (1, 0));
        }
    }

    /// A log write of a collection's metadata record (version `version`) and its elements.
    fn collection_page(
        ty: CollType,
        key: &[u8],
        version: u64,
        elems: &[(&[u8], &[u8])],
    ) -> Vec<u8> {
        use crate::collection::{composite_len, encode_composite, encode_meta, Meta};
        let mut page = vec![0u8; 1024];
        let meta = encode_meta(Meta { ty, version });
        let mut at = record::record_len(key.len(), meta.len());
        record::encode(
            &mut page[..at],
            collection::KIND_META,
            key,
            &meta,
            version,
            0,
        );
        for (i, (sub, v)) in elems.iter().enumerate() {
            let mut ck = vec![0u8; composite_len(key.len(), sub.len())];
            encode_composite(&mut ck, key, version, sub);
            let l = record::record_len(ck.len(), v.len());
            record::encode(
                &mut page[at..at + l],
                collection::KIND_ELEMENT,
                &ck,
                v,
                version + 1 + i as u64,
                0,
            );
            at += l;
        }
        page
    }

    /// The DPU's whole answer to `m`, with the element records of `page` at `base`.
    fn dpu_answer(app: &RedisApp, view: &CacheView<'_>, m: &[u8], page: &[u8]) -> Option<Vec<u8>> {
        let (mut host, mut dpu) = (ReqList::with_capacity(1), ReqList::with_capacity(1));
        app.offload_predicate(m, view, &mut host, &mut dpu).unwrap();
        if dpu.is_empty() {
            return None;
        }
        let Offload::Read(op) = app.offload_function(m, dpu.as_slice()[0], view) else {
            return None;
        };
        let mut room = [0u8; ROOM];
        let mut data = vec![0u8; 256];
        let n = op.size as usize;
        data[..n].copy_from_slice(&page[op.offset as usize..op.offset as usize + n]);
        let l = app
            .build_response(m, &op, Ok(op.size), &mut room, &mut data)
            .unwrap();
        let mut out = room[ROOM - l.header_len as usize..].to_vec();
        out.extend_from_slice(&data[..(l.total_len - l.header_len) as usize]);
        Some(out)
    }

    #[test]
    fn element_reads_of_cached_collections_are_answered_on_the_dpu() {
        let app = RedisApp::default();
        let h = collection_page(
            CollType::Hash,
            b"h",
            10,
            &[(b"f1", b"v1"), (b"f2", b"value2")],
        );
        let s = collection_page(CollType::Set, b"s", 20, &[(b"m", b"")]);
        let z = collection_page(
            CollType::ZSet,
            b"z",
            30,
            &[
                (b"a", &1.5f64.to_le_bytes()),
                (b"b", &f64::INFINITY.to_le_bytes()),
            ],
        );
        let mut w = CacheWriter::new(Config::for_items(100)).unwrap();
        let mut page = vec![0u8; 3072];
        for (i, p) in [&h, &s, &z].into_iter().enumerate() {
            page[i * 1024..(i + 1) * 1024].copy_from_slice(p);
            let mut items = ItemList::with_capacity(app.max_write_items());
            app.cache_on_write(7, (i * 1024) as u64, p, &mut items);
            for it in items.as_slice() {
                w.insert(*it).unwrap();
            }
        }
        let reader = w.reader();
        let view = CacheView::new(&reader);
        let ask = |m: &[&[u8]]| dpu_answer(&app, &view, &cmd(m), &page);
        assert_eq!(ask(&[b"HGET", b"h", b"f2"]).unwrap(), b"$6\r\nvalue2\r\n");
        assert_eq!(ask(&[b"hget", b"h", b"f1"]).unwrap(), b"$2\r\nv1\r\n");
        assert_eq!(ask(&[b"SISMEMBER", b"s", b"m"]).unwrap(), b":1\r\n");
        assert_eq!(ask(&[b"ZSCORE", b"z", b"a"]).unwrap(), b"$3\r\n1.5\r\n");
        assert_eq!(ask(&[b"ZSCORE", b"z", b"b"]).unwrap(), b"$3\r\ninf\r\n");
        // Misses, another type's command, another collection's elements: the host's.
        for m in [
            &[&b"HGET"[..], b"h", b"f3"][..],
            &[b"SISMEMBER", b"s", b"x"],
            &[b"SISMEMBER", b"h", b"f1"],
            &[b"ZSCORE", b"h", b"f1"],
            &[b"HGET", b"s", b"m"],
            &[b"HGET", b"h"],
            &[b"HGET", b"h", b"f1", b"f2"],
        ] {
            assert_eq!(ask(m), None, "{m:?}");
        }
        // An HMGET is split: the header (`*<fields>`, no read) and the cached fields on the
        // DPU, each answered as an HGET (the session gives it that head), the rest in a
        // `DDS.HMGETPART key field..` for the host.
        let m = cmd(&[b"HMGET", b"h", b"f1", b"nope", b"f2"]);
        let n = app.max_requests();
        let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
        app.offload_predicate(&m, &view, &mut host, &mut dpu)
            .unwrap();
        let pos = |l: &ReqList| l.as_slice().iter().map(|d| d.pos).collect::<Vec<_>>();
        assert_eq!((pos(&dpu), pos(&host)), (vec![0, 1, 3], vec![2]));
        let session = app.session().unwrap();
        let mut answers = Vec::new();
        for &d in dpu.as_slice() {
            let Offload::Read(op) = session.offload_function(&app, &m, d, &view) else {
                panic!("not on the DPU: {d:?}");
            };
            let mut head = [0u8; REQUEST_HEAD_BYTES];
            let hl = session.request_head(&m, d, &mut head);
            let (mut room, mut data) = ([0u8; ROOM], vec![0u8; 256]);
            let at = op.offset as usize;
            data[..op.size as usize].copy_from_slice(&page[at..at + op.size as usize]);
            let l = app
                .build_response(&head[..hl], &op, Ok(op.size), &mut room, &mut data)
                .unwrap();
            let mut out = room[ROOM - l.header_len as usize..].to_vec();
            out.extend_from_slice(&data[..(l.total_len - l.header_len) as usize]);
            answers.push(String::from_utf8(out).unwrap());
        }
        assert_eq!(answers, ["*3\r\n", "$2\r\nv1\r\n", "$6\r\nvalue2\r\n"]);
        let mut out = vec![0u8; m.len() + HOST_MESSAGE_SLACK];
        let len = app
            .build_host_message(&m, host.as_slice(), &mut out)
            .unwrap();
        assert_eq!(&out[..len], cmd(&[b"DDS.HMGETPART", b"h", b"nope"]));
        // No field cached: the HMGET goes to the host whole.
        let m = cmd(&[b"HMGET", b"h", b"x", b"y"]);
        let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
        app.offload_predicate(&m, &view, &mut host, &mut dpu)
            .unwrap();
        assert_eq!(
            (pos(&dpu), host.as_slice()[0].len as usize),
            (vec![], m.len())
        );
        // A new version of the hash (DEL and HSET again, its metadata cached): the old
        // version's elements are not served.
        let h2 = collection_page(CollType::Hash, b"h", 50, &[]);
        let mut items = ItemList::with_capacity(app.max_write_items());
        app.cache_on_write(7, 2048 + 1024, &h2[..64], &mut items);
        let mut it = items.as_slice()[0];
        it.version = 1;
        w.insert(it).unwrap();
        assert_eq!(ask(&[b"HGET", b"h", b"f1"]), None);
        // A superseded element record is not cached; an element record read back that is
        // not the element's (space reused) is answered TRYAGAIN.
        let mut sup = collection_page(CollType::Set, b"t", 60, &[(b"m", b"")]);
        let ml = record::record_len(1, 16);
        sup[ml + 5] |= FLAG_SUPERSEDED;
        let mut items = ItemList::with_capacity(app.max_write_items());
        app.cache_on_write(7, 0, &sup, &mut items);
        assert_eq!(items.len(), 1, "the metadata record only");
        let m = cmd(&[b"HGET", b"x", b"f1"]);
        let op = ReadOp {
            file_id: 7,
            size: 48,
            offset: 0,
        };
        let (mut room, mut data) = ([0u8; ROOM], h.clone());
        let f1_at = record::record_len(1, 16);
        data.copy_within(f1_at..f1_at + 48, 0);
        let l = app
            .build_response(&m, &op, Ok(48), &mut room, &mut data)
            .unwrap();
        assert_eq!(
            &room[ROOM - l.header_len as usize..],
            b"-TRYAGAIN record moved, retry\r\n"
        );
    }

    #[test]
    fn element_writes_invalidate_their_elements_and_other_writes_the_key() {
        let app = RedisApp::default();
        let e = |k: &[u8], f: &[u8]| collection::element_cache_hash(k, f).unwrap().0;
        let k = |k: &[u8]| record::key_hash(k).0;
        let keys_of = |m: &[&[u8]]| {
            let mut keys = KeyList::with_capacity(app.max_forward_keys());
            let msg = cmd(m);
            app.invalidate_on_forward(&msg, ReqDesc::default(), &mut keys);
            let mut v = keys.as_slice().to_vec();
            v.sort();
            v
        };
        let sorted = |mut v: Vec<u64>| {
            v.sort();
            v
        };
        let named: [(&[&[u8]], Vec<u64>); 6] = [
            (
                &[b"HSET", b"h", b"f1", b"1", b"f2", b"2"],
                vec![e(b"h", b"f1"), e(b"h", b"f2")],
            ),
            (&[b"HINCRBY", b"h", b"f", b"1"], vec![e(b"h", b"f")]),
            (
                &[b"SREM", b"s", b"a", b"b"],
                vec![e(b"s", b"a"), e(b"s", b"b")],
            ),
            (
                &[b"ZADD", b"z", b"XX", b"ch", b"1", b"a", b"2", b"b"],
                vec![e(b"z", b"a"), e(b"z", b"b")],
            ),
            (&[b"ZINCRBY", b"z", b"2", b"m"], vec![e(b"z", b"m")]),
            (
                &[b"SMOVE", b"s", b"t", b"m"],
                vec![e(b"s", b"m"), e(b"t", b"m")],
            ),
        ];
        for (m, want) in named {
            assert_eq!(keys_of(m), sorted(want), "{m:?}");
        }
        // Writes of elements the command does not name: the collection's key.
        assert_eq!(keys_of(&[b"SPOP", b"s"]), vec![k(b"s")]);
        assert_eq!(
            keys_of(&[b"ZREMRANGEBYSCORE", b"z", b"0", b"1"]),
            vec![k(b"z")]
        );
        assert_eq!(keys_of(&[b"DEL", b"h"]), vec![k(b"h")]);
        // More fields than the list holds: the collection's key.
        let mut big: Vec<Vec<u8>> = vec![b"HDEL".to_vec(), b"h".to_vec()];
        big.extend((0..app.max_forward_keys() + 5).map(|i| format!("f{i}").into_bytes()));
        let big: Vec<&[u8]> = big.iter().map(|w| &w[..]).collect();
        assert_eq!(keys_of(&big), vec![k(b"h")]);
    }

    #[test]
    fn mgets_are_split_between_the_dpu_and_the_host() {
        let app = RedisApp::default();
        let mut page = vec![0u8; 256];
        let l1 = record::record_len(3, 5);
        record::encode(&mut page[..l1], KIND_VALUE, b"foo", b"hello", 1, 0);
        let l2 = record::record_len(3, 2);
        record::encode(&mut page[l1..l1 + l2], KIND_VALUE, b"bar", b"hi", 2, 0);
        let mut items = ItemList::with_capacity(app.max_write_items());
        app.cache_on_write(7, 0, &page, &mut items);
        let mut w = CacheWriter::new(Config::for_items(100)).unwrap();
        for it in items.as_slice() {
            w.insert(*it).unwrap();
        }
        let reader = w.reader();
        let view = CacheView::new(&reader);
        let m = cmd(&[b"MGET", b"foo", b"nope", b"bar"]);
        let n = app.max_requests();
        let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
        app.offload_predicate(&m, &view, &mut host, &mut dpu)
            .unwrap();
        let pos = |l: &ReqList| l.as_slice().iter().map(|d| d.pos).collect::<Vec<_>>();
        assert_eq!(pos(&dpu), vec![0, 1, 3]);
        assert_eq!(pos(&host), vec![2]);
        // The header: no read, `*3`.
        let d0 = dpu.as_slice()[0];
        let Offload::Read(op) = app.offload_function(&m, d0, &view) else {
            panic!("header not on the DPU");
        };
        assert_eq!(op.size, 0);
        let head = &m[..d0.len as usize];
        let (mut room, mut data) = ([0u8; ROOM], vec![0u8; 64]);
        let l = app
            .build_response(head, &op, Ok(0), &mut room, &mut data)
            .unwrap();
        assert_eq!(&room[ROOM - l.header_len as usize..], b"*3\r\n");
        assert_eq!(l.total_len, l.header_len);
        // A key: read and answered as a bulk string.
        let d3 = dpu.as_slice()[2];
        let Offload::Read(op) = app.offload_function(&m, d3, &view) else {
            panic!("bar not on the DPU");
        };
        let head = &m[d3.offset as usize..(d3.offset + d3.len) as usize];
        assert_eq!(head, b"$3\r\nbar\r\n");
        data[..l2].copy_from_slice(&page[l1..l1 + l2]);
        let l = app
            .build_response(head, &op, Ok(op.size), &mut room, &mut data)
            .unwrap();
        let mut out = room[ROOM - l.header_len as usize..].to_vec();
        out.extend_from_slice(&data[..(l.total_len - l.header_len) as usize]);
        assert_eq!(out, b"$2\r\nhi\r\n");
        // The host part.
        let mut hm = vec![0u8; m.len()];
        let len = app
            .build_host_message(&m, host.as_slice(), &mut hm)
            .unwrap();
        assert_eq!(&hm[..len], &cmd(&[b"DDS.MGETPART", b"nope"])[..]);
        // No key cached: the whole MGET goes to the host as it came.
        let m = cmd(&[b"MGET", b"x", b"y"]);
        let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
        app.offload_predicate(&m, &view, &mut host, &mut dpu)
            .unwrap();
        assert_eq!((host.len(), dpu.len()), (1, 0));
        assert_eq!(host.as_slice()[0].len as usize, m.len());
        // Every split's host part, with all its keys, fits the host message's room (the
        // message and HOST_MESSAGE_SLACK).
        let mut w = CacheWriter::new(Config::for_items(100)).unwrap();
        let mut page = vec![0u8; 256];
        let l0 = record::record_len(1, 1);
        record::encode(&mut page[..l0], KIND_VALUE, b"a", b"1", 1, 0);
        let mut items = ItemList::with_capacity(app.max_write_items());
        app.cache_on_write(7, 0, &page, &mut items);
        for it in items.as_slice() {
            w.insert(*it).unwrap();
        }
        let reader = w.reader();
        let view = CacheView::new(&reader);
        for m in [
            cmd(&[b"MGET", b"a", b""]),
            cmd(&[b"MGET", b"", b"a"]),
            cmd(&[b"MGET", b"a", b"b", b"a", b"c"]),
            cmd(&[b"MGET", b"a", b"a", b"a", b"zz"]),
        ] {
            let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
            app.offload_predicate(&m, &view, &mut host, &mut dpu)
                .unwrap();
            assert!(!dpu.is_empty());
            let mut all: Vec<ReqDesc> = host.as_slice().to_vec();
            all.extend(dpu.as_slice().iter().filter(|d| d.pos > 0));
            all.sort_by_key(|d| d.pos);
            let mut hm = vec![0u8; m.len() + HOST_MESSAGE_SLACK];
            app.build_host_message(&m, &all, &mut hm).unwrap();
        }
        // Inline MGETs and quoted GETs go to the host whole.
        for m in [&b"MGET a b\r\n"[..], b"GET \"a\"\r\n"] {
            let (mut host, mut dpu) = (ReqList::with_capacity(n), ReqList::with_capacity(n));
            app.offload_predicate(m, &view, &mut host, &mut dpu)
                .unwrap();
            assert_eq!((host.len(), dpu.len()), (1, 0));
        }
    }

    #[test]
    fn quoted_inline_writes_invalidate_the_decoded_keys() {
        let app = RedisApp::default();
        let mut keys = KeyList::with_capacity(app.max_forward_keys());
        let d = ReqDesc::default();
        app.invalidate_on_forward(b"SET \"a b\" v\r\n", d, &mut keys);
        assert_eq!(keys.as_slice(), &[record::key_hash(b"a b").0]);
        keys.clear();
        app.invalidate_on_forward(b"del '' \"\\x00k\" plain\r\n", d, &mut keys);
        let want = [b"".as_slice(), b"\x00k", b"plain"].map(|k| record::key_hash(k).0);
        assert_eq!(keys.as_slice(), &want);
    }

    #[test]
    fn limits_frame_16_mib_values_and_refusals_get_the_redis_error_text() {
        let app = RedisApp::default();
        let v = vec![b'x'; 16 << 20];
        let m = cmd(&[b"SET", b"k", &v]);
        assert_eq!(app.message_len(&m).unwrap(), Some(m.len()));
        assert_eq!(app.message_len(&m[..m.len() - 1]).unwrap(), None);
        assert!(app.max_message_len() >= m.len());
        let mut r = b"$16777216\r\n".to_vec();
        r.extend_from_slice(&v);
        r.extend_from_slice(b"\r\n");
        assert_eq!(app.response_len(&r).unwrap(), Some(r.len()));
        let small = RedisApp::new(1 << 20);
        let big = b"*2\r\n$3\r\nGET\r\n$2000000\r\n";
        let why = small.message_len(big).unwrap_err();
        let mut out = [0u8; dds_offload_api::ERROR_REPLY_MAX];
        let n = small.error_reply(why, big, &mut out);
        assert_eq!(&out[..n], b"-ERR Protocol error: invalid bulk length\r\n");
        let bad = b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n";
        let why = small.message_len(bad).unwrap_err();
        let n = small.error_reply(why, bad, &mut out);
        assert_eq!(&out[..n], b"-ERR Protocol error: expected '$', got 'f'\r\n");
        let n = small.error_reply(TOO_BIG, &[], &mut out);
        assert_eq!(
            &out[..n],
            b"-ERR Protocol error: query buffer limit exceeded\r\n"
        );
        assert_eq!(
            small.error_reply(TOO_BIG, &[], &mut out[..10]),
            0,
            "too small: no reply"
        );
    }

    #[test]
    fn writes_name_every_key_they_modify() {
        let app = RedisApp::default();
        let mut keys = KeyList::with_capacity(app.max_forward_keys());
        let d = ReqDesc::default();
        let h = |k: &[u8]| record::key_hash(k).0;
        app.invalidate_on_forward(&cmd(&[b"MSET", b"a", b"1", b"b", b"2"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"a"), h(b"b")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"del", b"a", b"b", b"c"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"a"), h(b"b"), h(b"c")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"SET", b"k", b"v", b"EX", b"10"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"k")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"GET", b"k"]), d, &mut keys);
        assert!(keys.is_empty());
        app.invalidate_on_forward(&cmd(&[b"BITOP", b"OR", b"dst", b"a", b"b"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"dst")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"setbit", b"k", b"7", b"1"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"k")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"RENAME", b"a", b"b"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"a"), h(b"b")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"COPY", b"a", b"b", b"REPLACE"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"b")]);
        keys.clear();
        // A STORE replaces its destination, whatever it held (a cached string too).
        app.invalidate_on_forward(&cmd(&[b"SUNIONSTORE", b"dst", b"s1"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[h(b"dst"), h(b"s1")]);
        keys.clear();
        // Element writes name their elements (§4.1).
        let e = |k: &[u8], f: &[u8]| collection::element_cache_hash(k, f).unwrap().0;
        app.invalidate_on_forward(&cmd(&[b"hset", b"h", b"f", b"v"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[e(b"h", b"f")]);
        keys.clear();
        app.invalidate_on_forward(&cmd(&[b"SMOVE", b"a", b"b", b"m"]), d, &mut keys);
        assert_eq!(keys.as_slice(), &[e(b"a", b"m"), e(b"b", b"m")]);
    }
}
