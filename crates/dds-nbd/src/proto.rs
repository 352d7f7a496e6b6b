//! The NBD wire format served by `dds nbd` (`docs/nbd.md` §2–§3): constants, the parsing of
//! what clients send and the encoding of what the server answers. Every integer is
//! big-endian. Nothing here allocates: replies are appended to the caller's buffer.

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the second 8 bytes the server sends, and the start of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The start of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// The start of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// The start of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// The start of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
/// Handshake flags: the 124 zero bytes after `NBD_OPT_EXPORT_NAME` may be left out.
pub const FLAG_NO_ZEROES: u16 = 2;
/// Client flags: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
/// Client flags: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 2;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
/// Abort the handshake.
pub const OPT_ABORT: u32 = 2;
/// List the exports.
pub const OPT_LIST: u32 = 3;
/// TLS (not served).
pub const OPT_STARTTLS: u32 = 5;
/// Describe an export.
pub const OPT_INFO: u32 = 6;
/// Describe an export and begin transmission.
pub const OPT_GO: u32 = 7;
/// Structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types.
pub const REP_ACK: u32 = 1;
/// An export of `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// An information item of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const REP_INFO: u32 = 3;
/// The option is not known.
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
/// The option's data is invalid.
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
/// The export is not known.
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
/// The option's data is too large.
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

/// Information types.
pub const INFO_EXPORT: u16 = 0;
/// The export's name.
pub const INFO_NAME: u16 = 1;
/// Block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1;
/// The export is read-only.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// FLUSH is served.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// FUA is served.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// TRIM is served.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// WRITE_ZEROES is served.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// The DF command flag is accepted (structured replies only).
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Several connections may serve one client, with FLUSH and FUA covering all of them.
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// Commands.
pub const CMD_READ: u16 = 0;
/// Write the payload.
pub const CMD_WRITE: u16 = 1;
/// Disconnect.
pub const CMD_DISC: u16 = 2;
/// Make completed writes durable.
pub const CMD_FLUSH: u16 = 3;
/// Discard a range.
pub const CMD_TRIM: u16 = 4;
/// Write zeroes over a range.
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Command flags: force unit access.
pub const CMD_FLAG_FUA: u16 = 1;
/// WRITE_ZEROES: do not leave a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// READ: do not fragment the structured reply.
pub const CMD_FLAG_DF: u16 = 1 << 2;

/// Structured reply: this is the last chunk.
pub const REPLY_FLAG_DONE: u16 = 1;
/// Structured reply type: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured reply type: an error.
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

/// Errors.
pub const EPERM: u32 = 1;
/// I/O error.
pub const EIO: u32 = 5;
/// Invalid request.
pub const EINVAL: u32 = 22;
/// Past the end of the export.
pub const ENOSPC: u32 = 28;

/// Bytes of the server's greeting.
pub const GREETING: usize = 18;
/// Bytes of an option's header.
pub const OPT_HEADER: usize = 16;
/// Bytes of an option reply's header.
pub const OPT_REPLY_HEADER: usize = 20;
/// Bytes of a request's header.
pub const REQUEST: usize = 28;
/// Bytes of a simple reply.
pub const SIMPLE_REPLY: usize = 16;
/// Bytes of a structured reply chunk's header.
pub const STRUCTURED_HEADER: usize = 20;
/// Bytes in front of a structured read reply's data (chunk header and offset).
pub const STRUCTURED_READ_HEADER: usize = STRUCTURED_HEADER + 8;

/// Largest option data buffered (more is skipped and answered `NBD_REP_ERR_TOO_BIG`).
pub const OPTION_MAX: usize = 8192;
/// Longest export name.
pub const NAME_MAX: usize = 4096;
/// Largest request payload (the advertised maximum block size).
pub const PAYLOAD_MAX: u32 = 32 << 20;
/// Advertised minimum block size.
pub const BLOCK_MIN: u32 = 1;
/// Advertised preferred block size.
pub const BLOCK_PREFERRED: u32 = 4096;

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The greeting: `NBDMAGIC`, `IHAVEOPT`, the handshake flags.
pub fn greeting(out: &mut Vec<u8>) {
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
}

/// An option's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptHeader {
    /// `IHAVEOPT` when well formed.
    pub magic: u64,
    /// The option.
    pub option: u32,
    /// Bytes of data that follow.
    pub len: u32,
}

/// The header at the start of `b` (at least [`OPT_HEADER`] bytes).
pub fn opt_header(b: &[u8]) -> OptHeader {
    OptHeader {
        magic: u64_at(b, 0),
        option: u32_at(b, 8),
        len: u32_at(b, 12),
    }
}

/// An option reply with `data`.
pub fn opt_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    opt_reply_header(out, option, kind, data.len() as u32);
    out.extend_from_slice(data);
}

/// An option reply's header announcing `len` bytes of data (the caller appends them).
pub fn opt_reply_header(out: &mut Vec<u8>, option: u32, kind: u32, len: u32) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`: the export name and the information asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    /// The export's name.
    pub name: &'a [u8],
    /// The information types asked for (`2 × count` bytes).
    pub asked: &'a [u8],
}

impl InfoRequest<'_> {
    /// Whether information type `t` was asked for.
    pub fn asks(&self, t: u16) -> bool {
        self.asked.chunks_exact(2).any(|c| u16_at(c, 0) == t)
    }
}

/// Parses the data of `NBD_OPT_INFO` / `NBD_OPT_GO`; `None` when its lengths disagree.
pub fn info_request(data: &[u8]) -> Option<InfoRequest<'_>> {
    if data.len() < 6 {
        return None;
    }
    let n = u32_at(data, 0) as usize;
    if n > NAME_MAX || data.len() < 4 + n + 2 {
        return None;
    }
    let count = u16_at(data, 4 + n) as usize;
    if data.len() != 4 + n + 2 + 2 * count {
        return None;
    }
    Some(InfoRequest {
        name: &data[4..4 + n],
        asked: &data[4 + n + 2..],
    })
}

/// The `NBD_REP_INFO` reply of `NBD_INFO_EXPORT`.
pub fn info_export(out: &mut Vec<u8>, option: u32, size: u64, flags: u16) {
    opt_reply_header(out, option, REP_INFO, 12);
    out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
}

/// The `NBD_REP_INFO` reply of `NBD_INFO_BLOCK_SIZE`.
pub fn info_block_size(out: &mut Vec<u8>, option: u32) {
    opt_reply_header(out, option, REP_INFO, 14);
    out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out.extend_from_slice(&BLOCK_MIN.to_be_bytes());
    out.extend_from_slice(&BLOCK_PREFERRED.to_be_bytes());
    out.extend_from_slice(&PAYLOAD_MAX.to_be_bytes());
}

/// The `NBD_REP_INFO` reply of `NBD_INFO_NAME`.
pub fn info_name(out: &mut Vec<u8>, option: u32, name: &[u8]) {
    opt_reply_header(out, option, REP_INFO, 2 + name.len() as u32);
    out.extend_from_slice(&INFO_NAME.to_be_bytes());
    out.extend_from_slice(name);
}

/// The `NBD_REP_SERVER` reply of `NBD_OPT_LIST` for one export.
pub fn list_entry(out: &mut Vec<u8>, name: &[u8]) {
    opt_reply_header(out, OPT_LIST, REP_SERVER, 4 + name.len() as u32);
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name);
}

/// The answer to `NBD_OPT_EXPORT_NAME`: size, transmission flags, and the 124 zero bytes
/// unless the client asked to leave them out.
pub fn export_name_reply(out: &mut Vec<u8>, size: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
}

/// A request's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// [`REQUEST_MAGIC`] when well formed.
    pub magic: u32,
    /// Command flags.
    pub flags: u16,
    /// The command.
    pub command: u16,
    /// The client's handle, echoed.
    pub handle: u64,
    /// Offset in the export.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

/// The request header at the start of `b` (at least [`REQUEST`] bytes).
pub fn request(b: &[u8]) -> Request {
    Request {
        magic: u32_at(b, 0),
        flags: u16_at(b, 4),
        command: u16_at(b, 6),
        handle: u64_at(b, 8),
        offset: u64_at(b, 16),
        len: u32_at(b, 24),
    }
}

/// Encodes a request header (for clients and tests).
pub fn encode_request(out: &mut Vec<u8>, r: &Request) {
    out.extend_from_slice(&r.magic.to_be_bytes());
    out.extend_from_slice(&r.flags.to_be_bytes());
    out.extend_from_slice(&r.command.to_be_bytes());
    out.extend_from_slice(&r.handle.to_be_bytes());
    out.extend_from_slice(&r.offset.to_be_bytes());
    out.extend_from_slice(&r.len.to_be_bytes());
}

/// A simple reply (the data of a successful READ follows it).
pub fn simple_reply(out: &mut Vec<u8>, error: u32, handle: u64) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
}

/// The header of a structured reply chunk with `len` bytes of payload.
pub fn structured_header(out: &mut Vec<u8>, flags: u16, kind: u16, handle: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&handle.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// What goes in front of a READ's data: a simple reply, or the one structured
/// `NBD_REPLY_TYPE_OFFSET_DATA` chunk (flag DONE) of `len` bytes at `offset`.
pub fn read_reply_header(out: &mut Vec<u8>, structured: bool, handle: u64, offset: u64, len: u32) {
    if structured {
        structured_header(
            out,
            REPLY_FLAG_DONE,
            REPLY_TYPE_OFFSET_DATA,
            handle,
            8 + len,
        );
        out.extend_from_slice(&offset.to_be_bytes());
    } else {
        simple_reply(out, 0, handle);
    }
}

/// A failed READ's reply: a simple reply with the error, or one structured
/// `NBD_REPLY_TYPE_ERROR` chunk (flag DONE, no message).
pub fn read_error(out: &mut Vec<u8>, structured: bool, handle: u64, error: u32) {
    if structured {
        structured_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, handle, 6);
        out.extend_from_slice(&error.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
    } else {
        simple_reply(out, error, handle);
    }
}

/// The transmission flags of an export.
pub fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN;
    if read_only {
        f |= TFLAG_READ_ONLY;
    }
    if structured {
        f |= TFLAG_SEND_DF;
    }
    f
}

/// Why a request is refused before any storage operation: the NBD error it gets
/// (`docs/nbd.md` §3), or `None` when it is served.
pub fn check(r: &Request, size: u64, read_only: bool, structured: bool) -> Option<u32> {
    let end = r.offset.checked_add(u64::from(r.len));
    let allowed = match r.command {
        CMD_READ if structured => CMD_FLAG_DF,
        CMD_READ | CMD_FLUSH => 0,
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        CMD_DISC => u16::MAX,
        _ => return Some(EINVAL),
    };
    if r.flags & !allowed != 0 {
        return Some(EINVAL);
    }
    match r.command {
        CMD_DISC | CMD_FLUSH => None,
        _ if r.len == 0 || r.len > PAYLOAD_MAX => Some(EINVAL),
        CMD_READ if end.is_none_or(|e| e > size) => Some(EINVAL),
        CMD_READ => None,
        _ if read_only => Some(EPERM),
        _ if end.is_none_or(|e| e > size) => Some(ENOSPC),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(command: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request {
            magic: REQUEST_MAGIC,
            flags,
            command,
            handle: 7,
            offset,
            len,
        }
    }

    #[test]
    fn greeting_and_option_replies_are_the_documented_bytes() {
        let mut g = Vec::new();
        greeting(&mut g);
        assert_eq!(g.len(), GREETING);
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..], &[0, 3]);
        let mut r = Vec::new();
        info_export(&mut r, OPT_GO, 1 << 20, transmission_flags(false, false));
        assert_eq!(
            r,
            [
                &OPT_REPLY_MAGIC.to_be_bytes()[..],
                &[0, 0, 0, 7, 0, 0, 0, 3, 0, 0, 0, 12, 0, 0],
                &(1u64 << 20).to_be_bytes(),
                &[0x01, 0x6d],
            ]
            .concat()
        );
        assert_eq!(transmission_flags(true, true), 0x01ef);
        r.clear();
        list_entry(&mut r, b"disk");
        assert_eq!(
            &r[12..],
            &[0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 4, b'd', b'i', b's', b'k']
        );
    }

    #[test]
    fn info_requests_must_add_up() {
        let mut d = vec![0, 0, 0, 2, b'a', b'b', 0, 2, 0, 1, 0, 3];
        let i = info_request(&d).unwrap();
        assert_eq!(i.name, b"ab");
        assert!(i.asks(INFO_NAME) && i.asks(INFO_BLOCK_SIZE) && !i.asks(INFO_EXPORT));
        d.push(0);
        assert_eq!(info_request(&d), None, "a byte too many");
        assert_eq!(info_request(&d[..9]), None, "a byte short");
        assert_eq!(info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
    }

    #[test]
    fn requests_get_the_errors_the_protocol_defines() {
        let size = 1 << 20;
        assert_eq!(check(&req(CMD_READ, 0, 0, 4096), size, false, false), None);
        assert_eq!(
            check(&req(CMD_READ, 0, 0, 0), size, false, false),
            Some(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_READ, 0, size - 1, 2), size, false, false),
            Some(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_READ, 0, u64::MAX, 2), size, false, false),
            Some(EINVAL),
            "offset + length overflows"
        );
        assert_eq!(
            check(
                &req(CMD_READ, 0, 0, PAYLOAD_MAX + 1),
                u64::MAX,
                false,
                false
            ),
            Some(EINVAL)
        );
        assert_eq!(
            check(&req(CMD_READ, CMD_FLAG_DF, 0, 1), size, false, false),
            Some(EINVAL),
            "DF without structured replies"
        );
        assert_eq!(
            check(&req(CMD_READ, CMD_FLAG_DF, 0, 1), size, false, true),
            None
        );
        assert_eq!(
            check(
                &req(CMD_WRITE, CMD_FLAG_FUA, size - 4096, 4096),
                size,
                false,
                false
            ),
            None
        );
        assert_eq!(
            check(&req(CMD_WRITE, 0, size, 1), size, false, false),
            Some(ENOSPC)
        );
        assert_eq!(
            check(&req(CMD_WRITE, 0, 0, 1), size, true, false),
            Some(EPERM)
        );
        assert_eq!(
            check(&req(CMD_TRIM, 0, 0, 1), size, true, false),
            Some(EPERM)
        );
        assert_eq!(
            check(&req(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 1), size, false, false),
            Some(EINVAL)
        );
        assert_eq!(
            check(
                &req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE | CMD_FLAG_FUA, 0, 8),
                size,
                false,
                false
            ),
            None
        );
        assert_eq!(check(&req(CMD_FLUSH, 0, 5, 5), size, true, false), None);
        assert_eq!(
            check(&req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0), size, false, false),
            Some(EINVAL)
        );
        assert_eq!(
            check(&req(5, 0, 0, 1), size, false, false),
            Some(EINVAL),
            "CACHE"
        );
        assert_eq!(check(&req(99, 0, 0, 1), size, false, false), Some(EINVAL));
        assert_eq!(check(&req(CMD_DISC, 0, 0, 0), size, false, false), None);
    }

    #[test]
    fn read_replies_simple_and_structured() {
        let mut o = Vec::new();
        read_reply_header(&mut o, false, 9, 4096, 512);
        assert_eq!(o.len(), SIMPLE_REPLY);
        assert_eq!(&o[..8], &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0]);
        o.clear();
        read_reply_header(&mut o, true, 9, 4096, 512);
        assert_eq!(o.len(), STRUCTURED_READ_HEADER);
        assert_eq!(&o[4..8], &[0, 1, 0, 1]);
        assert_eq!(&o[16..20], &(520u32).to_be_bytes());
        assert_eq!(&o[20..], &4096u64.to_be_bytes());
        o.clear();
        read_error(&mut o, true, 9, EIO);
        assert_eq!(&o[4..8], &[0, 1, 0x80, 0x01]);
        assert_eq!(&o[16..], &[0, 0, 0, 6, 0, 0, 0, 5, 0, 0]);
    }
}
