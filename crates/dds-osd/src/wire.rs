//! Frames of the client and peer protocol and their payload fields (`docs/osd-protocol.md`).

use std::io::{self, Read, Write};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use dds_objstore::{KvPairs, ObjectId, StoreError, MAX_NAME_LEN};

/// First bytes of every frame.
pub const MAGIC: [u8; 4] = *b"DOSD";
/// Protocol version.
pub const VERSION: u16 = 2;
/// Header length.
pub const HEADER_LEN: usize = 32;
/// Flag: the frame is a reply.
pub const FLAG_REPLY: u16 = 1;
/// Flag: serve a read from this OSD's own store whatever its role.
pub const FLAG_LOCAL: u16 = 2;
/// Largest payload by default.
pub const DEFAULT_MAX_PAYLOAD: u32 = 64 << 20;
/// Bytes a payload buffer grows by at most per step.
const GROW_STEP: usize = 256 << 10;

/// Operation codes.
pub mod op {
    pub const PING: u16 = 1;
    pub const GET_MAP: u16 = 2;
    pub const STATUS: u16 = 3;
    pub const WRITE_FULL: u16 = 16;
    pub const WRITE: u16 = 17;
    pub const READ: u16 = 18;
    pub const STAT: u16 = 19;
    pub const REMOVE: u16 = 20;
    pub const SETXATTR: u16 = 21;
    pub const GETXATTR: u16 = 22;
    pub const GETXATTRS: u16 = 23;
    pub const OMAP_SET: u16 = 24;
    pub const OMAP_GET: u16 = 25;
    pub const OMAP_LIST: u16 = 26;
    pub const OMAP_RM: u16 = 27;
    pub const LIST: u16 = 28;
    pub const REPL_TX: u16 = 64;
    pub const PG_LOG_QUERY: u16 = 65;
    pub const PG_PULL_OBJECT: u16 = 66;
    pub const PG_LIST: u16 = 67;
    pub const PG_PUSH: u16 = 68;
}

/// Reply status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    NoSpace = 2,
    Invalid = 3,
    Corrupt = 4,
    Io = 5,
    BadFrame = 6,
    UnknownOp = 7,
    TooLarge = 8,
    NotPrimary = 9,
    PgInactive = 10,
    Degraded = 11,
    StaleEpoch = 12,
    NeedRecovery = 13,
    Busy = 14,
    BelowMinSize = 15,
}

impl Status {
    pub fn from_u16(v: u16) -> Option<Status> {
        use Status::*;
        Some(match v {
            0 => Ok,
            1 => NotFound,
            2 => NoSpace,
            3 => Invalid,
            4 => Corrupt,
            5 => Io,
            6 => BadFrame,
            7 => UnknownOp,
            8 => TooLarge,
            9 => NotPrimary,
            10 => PgInactive,
            11 => Degraded,
            12 => StaleEpoch,
            13 => NeedRecovery,
            14 => Busy,
            15 => BelowMinSize,
            _ => return None,
        })
    }

    /// The status of a store error.
    pub fn of_store(e: &StoreError) -> Status {
        match e {
            StoreError::NotFound(_) => Status::NotFound,
            StoreError::NoSpace { .. } => Status::NoSpace,
            StoreError::InvalidArgument(_) | StoreError::AlreadyFormatted(_) => Status::Invalid,
            StoreError::Corrupt { .. } => Status::Corrupt,
            StoreError::Io { .. } => Status::Io,
        }
    }
}

/// An error reply: a status and its text (the text, which names the object or OSD, is what
/// it displays).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text}")]
pub struct OpError {
    pub status: Status,
    pub text: String,
}

impl OpError {
    pub fn new(status: Status, text: impl Into<String>) -> OpError {
        OpError {
            status,
            text: text.into(),
        }
    }
}

impl From<StoreError> for OpError {
    fn from(e: StoreError) -> OpError {
        OpError::new(Status::of_store(&e), e.to_string())
    }
}

/// A frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub op: u16,
    pub flags: u16,
    pub status: u16,
    pub epoch: u32,
    pub req_id: u64,
    pub len: u32,
}

impl Header {
    /// The header of a request carrying `payload`.
    pub fn request(
        op: u16,
        flags: u16,
        epoch: u32,
        req_id: u64,
        payload: &[u8],
    ) -> Result<Header, OpError> {
        let len = u32::try_from(payload.len())
            .map_err(|_| OpError::new(Status::TooLarge, "request payload above 4 GiB"))?;
        Ok(Header {
            op,
            flags,
            status: 0,
            epoch,
            req_id,
            len,
        })
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.op.to_le_bytes());
        b[8..10].copy_from_slice(&self.flags.to_le_bytes());
        b[10..12].copy_from_slice(&self.status.to_le_bytes());
        b[12..16].copy_from_slice(&self.epoch.to_le_bytes());
        b[16..24].copy_from_slice(&self.req_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header; `Err` names what is wrong (the stream cannot be trusted any more).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
        if b[0..4] != MAGIC {
            return Err("bad magic".into());
        }
        if u16_at(4) != VERSION {
            return Err(format!("unsupported version {}", u16_at(4)));
        }
        let flags = u16_at(8);
        if flags & !(FLAG_REPLY | FLAG_LOCAL) != 0 || u32_at(28) != 0 {
            return Err("reserved bits set".into());
        }
        Ok(Header {
            op: u16_at(6),
            flags,
            status: u16_at(10),
            epoch: u32_at(12),
            req_id: u64::from_le_bytes(b[16..24].try_into().unwrap_or_default()),
            len: u32_at(24),
        })
    }
}

/// A memory budget shared by the connections of a daemon: payload buffers take from it as they
/// grow and give back when dropped.
pub struct Budget {
    left: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        Budget {
            left: Mutex::new(bytes),
            freed: Condvar::new(),
        }
    }

    /// Takes `n` bytes, waiting up to `wait` for them.
    fn take(&self, n: u64, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        while *left < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            left = match self.freed.wait_timeout(left, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        *left -= n;
        true
    }

    fn give(&self, n: u64) {
        *self.left.lock().unwrap_or_else(|e| e.into_inner()) += n;
        self.freed.notify_all();
    }
}

/// A payload buffer charged to a [`Budget`].
pub struct Payload<'a> {
    pub buf: Vec<u8>,
    charged: u64,
    budget: &'a Budget,
}

impl Drop for Payload<'_> {
    fn drop(&mut self) {
        self.budget.give(self.charged);
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The connection ended cleanly between frames.
    Closed,
    /// I/O failure, a frame cut short, or a timeout.
    Io(io::Error),
    /// A header that does not decode.
    BadHeader(String),
    /// Payload length above the limit (header returned for the reply).
    TooLarge(Header),
    /// The memory budget stayed exhausted.
    Busy(Header),
}

/// Reads one frame: the header, then the payload, its buffer growing with the bytes that arrive
/// (at most 256 KiB at a time, each step taken from `budget`).
pub fn read_frame<'a, R: Read>(
    r: &mut R,
    max_payload: u32,
    budget: &'a Budget,
) -> Result<(Header, Payload<'a>), FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut hb[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let h = Header::decode(&hb).map_err(FrameError::BadHeader)?;
    if h.len > max_payload {
        return Err(FrameError::TooLarge(h));
    }
    let mut p = Payload {
        buf: Vec::new(),
        charged: 0,
        budget,
    };
    let total = h.len as usize;
    while p.buf.len() < total {
        let step = (total - p.buf.len()).min(GROW_STEP);
        if !budget.take(step as u64, Duration::from_secs(5)) {
            return Err(FrameError::Busy(h));
        }
        p.charged += step as u64;
        let start = p.buf.len();
        p.buf.resize(start + step, 0);
        r.read_exact(&mut p.buf[start..]).map_err(FrameError::Io)?;
    }
    Ok((h, p))
}

/// Writes one frame (header and payload) in one write.
pub fn write_frame<W: Write>(w: &mut W, h: &Header, payload: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(payload);
    w.write_all(&out)
}

/// Payload encoder.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn new() -> Enc {
        Enc(Vec::new())
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn oid(&mut self, oid: &ObjectId) -> &mut Self {
        self.u64(oid.pool).bytes(&oid.name)
    }
    pub fn opt_bytes(&mut self, b: Option<&[u8]>) -> &mut Self {
        match b {
            None => self.u8(0),
            Some(b) => self.u8(1).bytes(b),
        }
    }
    pub fn kvs(&mut self, kvs: &[(Vec<u8>, Vec<u8>)]) -> &mut Self {
        self.u32(kvs.len() as u32);
        for (k, v) in kvs {
            self.bytes(k).bytes(v);
        }
        self
    }
    pub fn keys(&mut self, keys: &[Vec<u8>]) -> &mut Self {
        self.u32(keys.len() as u32);
        for k in keys {
            self.bytes(k);
        }
        self
    }
    pub fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

/// Payload decoder: every length is checked against the bytes that remain; counts reserve at
/// most what the remaining bytes could hold.
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn bad(what: &str) -> OpError {
    OpError::new(Status::BadFrame, format!("malformed payload: {what}"))
}

impl<'a> Dec<'a> {
    pub fn new(buf: &'a [u8]) -> Dec<'a> {
        Dec { buf, pos: 0 }
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], OpError> {
        if self.buf.len() - self.pos < n {
            return Err(bad(&format!("truncated {what} at byte {}", self.pos)));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8, OpError> {
        Ok(self.take(1, "u8")?[0])
    }
    pub fn u32(&mut self) -> Result<u32, OpError> {
        let b = self.take(4, "u32")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, OpError> {
        let b = self.take(8, "u64")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], OpError> {
        let n = self.u32()? as usize;
        self.take(n, "bytes")
    }
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    pub fn oid(&mut self) -> Result<ObjectId, OpError> {
        let pool = self.u64()?;
        let name = self.bytes()?;
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return Err(bad("object name of 0 or more than 4096 bytes"));
        }
        Ok(ObjectId::new(pool, name))
    }
    pub fn opt_bytes(&mut self) -> Result<Option<&'a [u8]>, OpError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?)),
            _ => Err(bad("option tag")),
        }
    }
    fn count(&mut self, min_item: usize) -> Result<usize, OpError> {
        let n = self.u32()? as usize;
        if n > (self.buf.len() - self.pos) / min_item {
            return Err(bad("count larger than the payload"));
        }
        Ok(n)
    }
    pub fn kvs(&mut self) -> Result<KvPairs, OpError> {
        let n = self.count(8)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.bytes()?.to_vec(), self.bytes()?.to_vec()));
        }
        Ok(out)
    }
    pub fn keys(&mut self) -> Result<Vec<Vec<u8>>, OpError> {
        let n = self.count(4)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.bytes()?.to_vec());
        }
        Ok(out)
    }
    /// Checks that nothing is left.
    pub fn end(&self) -> Result<(), OpError> {
        if self.pos != self.buf.len() {
            return Err(bad(&format!(
                "{} trailing bytes",
                self.buf.len() - self.pos
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let h = Header {
            op: op::READ,
            flags: FLAG_LOCAL,
            status: 0,
            epoch: 3,
            req_id: 77,
            len: 12,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[0] = b'X';
        assert!(Header::decode(&b).is_err());
        let mut b = h.encode();
        b[29] = 1;
        assert!(Header::decode(&b).is_err());
    }

    #[test]
    fn frames_respect_limit_and_budget() {
        let budget = Budget::new(1 << 20);
        let h = Header {
            op: op::PING,
            flags: 0,
            status: 0,
            epoch: 0,
            req_id: 1,
            len: 5,
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &h, b"hello").unwrap();
        let (got, p) = read_frame(&mut &buf[..], 100, &budget).unwrap();
        assert_eq!((got, &p.buf[..]), (h, &b"hello"[..]));
        drop(p);
        assert!(matches!(
            read_frame(&mut &buf[..], 4, &budget),
            Err(FrameError::TooLarge(_))
        ));
        // Announced 1 GiB, 5 bytes sent: a short read, no large allocation.
        let mut big = h;
        big.len = 1 << 30;
        let mut buf = Vec::new();
        write_frame(&mut buf, &big, b"hello").unwrap();
        assert!(matches!(
            read_frame(&mut &buf[..], u32::MAX, &budget),
            Err(FrameError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &buf[..10], u32::MAX, &budget),
            Err(FrameError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut &[][..], u32::MAX, &budget),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn decoder_never_trusts_counts() {
        let mut e = Enc::new();
        e.u32(u32::MAX);
        assert!(Dec::new(&e.0).kvs().is_err());
        assert!(Dec::new(&[1, 0, 0, 0]).bytes().is_err());
        let payload = Enc::new()
            .oid(&ObjectId::new(1, "a"))
            .kvs(&[(b"k".to_vec(), b"v".to_vec())])
            .done();
        let mut d = Dec::new(&payload);
        assert_eq!(d.oid().unwrap(), ObjectId::new(1, "a"));
        assert_eq!(d.kvs().unwrap().len(), 1);
        d.end().unwrap();
    }
}
