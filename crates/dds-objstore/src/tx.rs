//! Transactions: the ops, and their binary encoding (documented byte by byte in
//! `docs/objstore.md`).

use crate::error::DecodeError;

/// Longest object name, in bytes (a hard limit of the encoding).
pub const MAX_NAME_LEN: usize = 4096;

/// First bytes of an encoded transaction.
pub const TX_MAGIC: [u8; 4] = *b"DDTX";
/// Version of the encoding this crate writes and reads.
pub const TX_VERSION: u16 = 1;
/// Bytes of the header: magic, version, flags, op count.
const HEADER_LEN: usize = 4 + 2 + 2 + 4;
/// The smallest encoded op: code + pool + name length.
const MIN_OP_LEN: usize = 1 + 8 + 4;

/// An object's name: a pool and a binary-safe name of at most [`MAX_NAME_LEN`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    pub pool: u64,
    pub name: Vec<u8>,
}

impl ObjectId {
    /// An object id.
    pub fn new(pool: u64, name: impl Into<Vec<u8>>) -> ObjectId {
        ObjectId {
            pool,
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.pool, String::from_utf8_lossy(&self.name))
    }
}

/// A borrowed [`ObjectId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjRef<'a> {
    pub pool: u64,
    pub name: &'a [u8],
}

impl ObjRef<'_> {
    /// An owned copy.
    pub fn to_owned(&self) -> ObjectId {
        ObjectId::new(self.pool, self.name)
    }
}

impl ObjectId {
    /// A borrowed view.
    pub fn view(&self) -> ObjRef<'_> {
        ObjRef {
            pool: self.pool,
            name: &self.name,
        }
    }
}

/// A borrowed op: an op of a [`Transaction`] ([`TxOp::view`]) or of an encoded transaction
/// ([`Transaction::decode_ops`]), its byte fields borrowed rather than copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxOpRef<'a> {
    Touch {
        oid: ObjRef<'a>,
    },
    WriteFull {
        oid: ObjRef<'a>,
        data: &'a [u8],
    },
    Write {
        oid: ObjRef<'a>,
        offset: u64,
        data: &'a [u8],
    },
    Truncate {
        oid: ObjRef<'a>,
        size: u64,
    },
    Remove {
        oid: ObjRef<'a>,
    },
    SetXattr {
        oid: ObjRef<'a>,
        name: &'a [u8],
        value: &'a [u8],
    },
    RmXattr {
        oid: ObjRef<'a>,
        name: &'a [u8],
    },
    OmapSet {
        oid: ObjRef<'a>,
        entries: Vec<(&'a [u8], &'a [u8])>,
    },
    OmapRm {
        oid: ObjRef<'a>,
        keys: Vec<&'a [u8]>,
    },
    OmapClear {
        oid: ObjRef<'a>,
    },
}

impl<'a> TxOpRef<'a> {
    /// The object the op works on.
    pub fn oid(&self) -> ObjRef<'a> {
        match self {
            TxOpRef::Touch { oid }
            | TxOpRef::WriteFull { oid, .. }
            | TxOpRef::Write { oid, .. }
            | TxOpRef::Truncate { oid, .. }
            | TxOpRef::Remove { oid }
            | TxOpRef::SetXattr { oid, .. }
            | TxOpRef::RmXattr { oid, .. }
            | TxOpRef::OmapSet { oid, .. }
            | TxOpRef::OmapRm { oid, .. }
            | TxOpRef::OmapClear { oid } => *oid,
        }
    }

    /// An owned copy.
    pub fn to_owned(&self) -> TxOp {
        let oid = self.oid().to_owned();
        match self {
            TxOpRef::Touch { .. } => TxOp::Touch { oid },
            TxOpRef::WriteFull { data, .. } => TxOp::WriteFull {
                oid,
                data: data.to_vec(),
            },
            TxOpRef::Write { offset, data, .. } => TxOp::Write {
                oid,
                offset: *offset,
                data: data.to_vec(),
            },
            TxOpRef::Truncate { size, .. } => TxOp::Truncate { oid, size: *size },
            TxOpRef::Remove { .. } => TxOp::Remove { oid },
            TxOpRef::SetXattr { name, value, .. } => TxOp::SetXattr {
                oid,
                name: name.to_vec(),
                value: value.to_vec(),
            },
            TxOpRef::RmXattr { name, .. } => TxOp::RmXattr {
                oid,
                name: name.to_vec(),
            },
            TxOpRef::OmapSet { entries, .. } => TxOp::OmapSet {
                oid,
                entries: entries
                    .iter()
                    .map(|(k, v)| (k.to_vec(), v.to_vec()))
                    .collect(),
            },
            TxOpRef::OmapRm { keys, .. } => TxOp::OmapRm {
                oid,
                keys: keys.iter().map(|k| k.to_vec()).collect(),
            },
            TxOpRef::OmapClear { .. } => TxOp::OmapClear { oid },
        }
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxOp {
    /// Creates the object if it is missing (empty), else updates its mtime.
    Touch { oid: ObjectId },
    /// Replaces the object's data (creating the object).
    WriteFull { oid: ObjectId, data: Vec<u8> },
    /// Writes `data` at `offset` (creating the object; extending it; a gap reads as zeros).
    Write {
        oid: ObjectId,
        offset: u64,
        data: Vec<u8>,
    },
    /// Sets the object's size (shrinking drops data; growing adds zeros). The object must exist.
    Truncate { oid: ObjectId, size: u64 },
    /// Removes the object with its data, xattrs and omap. The object must exist.
    Remove { oid: ObjectId },
    /// Sets an xattr (creating the object).
    SetXattr {
        oid: ObjectId,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// Removes an xattr. The object and the xattr must exist.
    RmXattr { oid: ObjectId, name: Vec<u8> },
    /// Sets omap entries (creating the object).
    OmapSet {
        oid: ObjectId,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Removes omap keys (missing keys are ignored). The object must exist.
    OmapRm { oid: ObjectId, keys: Vec<Vec<u8>> },
    /// Removes every omap entry. The object must exist.
    OmapClear { oid: ObjectId },
}

impl TxOp {
    /// The object the op works on.
    pub fn oid(&self) -> &ObjectId {
        match self {
            TxOp::Touch { oid }
            | TxOp::WriteFull { oid, .. }
            | TxOp::Write { oid, .. }
            | TxOp::Truncate { oid, .. }
            | TxOp::Remove { oid }
            | TxOp::SetXattr { oid, .. }
            | TxOp::RmXattr { oid, .. }
            | TxOp::OmapSet { oid, .. }
            | TxOp::OmapRm { oid, .. }
            | TxOp::OmapClear { oid } => oid,
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> TxOpRef<'_> {
        let oid = self.oid().view();
        match self {
            TxOp::Touch { .. } => TxOpRef::Touch { oid },
            TxOp::WriteFull { data, .. } => TxOpRef::WriteFull { oid, data },
            TxOp::Write { offset, data, .. } => TxOpRef::Write {
                oid,
                offset: *offset,
                data,
            },
            TxOp::Truncate { size, .. } => TxOpRef::Truncate { oid, size: *size },
            TxOp::Remove { .. } => TxOpRef::Remove { oid },
            TxOp::SetXattr { name, value, .. } => TxOpRef::SetXattr { oid, name, value },
            TxOp::RmXattr { name, .. } => TxOpRef::RmXattr { oid, name },
            TxOp::OmapSet { entries, .. } => TxOpRef::OmapSet {
                oid,
                entries: entries.iter().map(|(k, v)| (&k[..], &v[..])).collect(),
            },
            TxOp::OmapRm { keys, .. } => TxOpRef::OmapRm {
                oid,
                keys: keys.iter().map(|k| &k[..]).collect(),
            },
            TxOp::OmapClear { .. } => TxOpRef::OmapClear { oid },
        }
    }

    fn code(&self) -> u8 {
        match self {
            TxOp::Touch { .. } => 1,
            TxOp::WriteFull { .. } => 2,
            TxOp::Write { .. } => 3,
            TxOp::Truncate { .. } => 4,
            TxOp::Remove { .. } => 5,
            TxOp::SetXattr { .. } => 6,
            TxOp::RmXattr { .. } => 7,
            TxOp::OmapSet { .. } => 8,
            TxOp::OmapRm { .. } => 9,
            TxOp::OmapClear { .. } => 10,
        }
    }

    fn encoded_len(&self) -> usize {
        let b = |v: &[u8]| 4 + v.len();
        MIN_OP_LEN
            + self.oid().name.len()
            + match self {
                TxOp::Touch { .. } | TxOp::Remove { .. } | TxOp::OmapClear { .. } => 0,
                TxOp::WriteFull { data, .. } => b(data),
                TxOp::Write { data, .. } => 8 + b(data),
                TxOp::Truncate { .. } => 8,
                TxOp::SetXattr { name, value, .. } => b(name) + b(value),
                TxOp::RmXattr { name, .. } => b(name),
                TxOp::OmapSet { entries, .. } => {
                    4 + entries.iter().map(|(k, v)| b(k) + b(v)).sum::<usize>()
                }
                TxOp::OmapRm { keys, .. } => 4 + keys.iter().map(|k| b(k)).sum::<usize>(),
            }
    }
}

/// A transaction: ops applied in order, all or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transaction {
    pub ops: Vec<TxOp>,
}

fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    let len = u32::try_from(v.len()).expect("a transaction field of 4 GiB or more");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(v);
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Transaction {
        Transaction::default()
    }

    /// Appends an op (builder style).
    pub fn push(&mut self, op: TxOp) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// Size of [`encode`](Self::encode)'s output.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.ops.iter().map(TxOp::encoded_len).sum::<usize>()
    }

    /// Appends the encoding to `out`.
    ///
    /// # Panics
    /// If a field is 4 GiB or longer, or there are 2³² or more ops (the store's limits are far
    /// below both).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.extend_from_slice(&TX_MAGIC);
        out.extend_from_slice(&TX_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        let count = u32::try_from(self.ops.len()).expect("2^32 ops in one transaction");
        out.extend_from_slice(&count.to_le_bytes());
        for op in &self.ops {
            out.push(op.code());
            let oid = op.oid();
            out.extend_from_slice(&oid.pool.to_le_bytes());
            put_bytes(out, &oid.name);
            match op {
                TxOp::Touch { .. } | TxOp::Remove { .. } | TxOp::OmapClear { .. } => {}
                TxOp::WriteFull { data, .. } => put_bytes(out, data),
                TxOp::Write { offset, data, .. } => {
                    out.extend_from_slice(&offset.to_le_bytes());
                    put_bytes(out, data);
                }
                TxOp::Truncate { size, .. } => out.extend_from_slice(&size.to_le_bytes()),
                TxOp::SetXattr { name, value, .. } => {
                    put_bytes(out, name);
                    put_bytes(out, value);
                }
                TxOp::RmXattr { name, .. } => put_bytes(out, name),
                TxOp::OmapSet { entries, .. } => {
                    let n = u32::try_from(entries.len()).expect("2^32 omap entries");
                    out.extend_from_slice(&n.to_le_bytes());
                    for (k, v) in entries {
                        put_bytes(out, k);
                        put_bytes(out, v);
                    }
                }
                TxOp::OmapRm { keys, .. } => {
                    let n = u32::try_from(keys.len()).expect("2^32 omap keys");
                    out.extend_from_slice(&n.to_le_bytes());
                    for k in keys {
                        put_bytes(out, k);
                    }
                }
            }
        }
    }

    /// The encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Decodes a transaction. Never panics; allocates only in proportion to `buf.len()`.
    pub fn decode(buf: &[u8]) -> Result<Transaction, DecodeError> {
        let ops = Transaction::decode_ops(buf)?;
        Ok(Transaction {
            ops: ops.iter().map(TxOpRef::to_owned).collect(),
        })
    }

    /// Decodes a transaction's ops without copying their byte fields (they borrow `buf`).
    /// Never panics; allocates only in proportion to `buf.len()`.
    pub fn decode_ops(buf: &[u8]) -> Result<Vec<TxOpRef<'_>>, DecodeError> {
        let mut r = Reader { buf, pos: 0 };
        if r.take(4)? != TX_MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u16()?;
        if version != TX_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let flags = r.u16()?;
        if flags != 0 {
            return Err(DecodeError::BadFlags(flags));
        }
        let count = r.u32()? as usize;
        let mut ops = Vec::with_capacity(count.min(r.remaining() / MIN_OP_LEN));
        for _ in 0..count {
            ops.push(r.op()?);
        }
        if r.remaining() != 0 {
            return Err(DecodeError::TrailingBytes(r.remaining()));
        }
        Ok(ops)
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated {
                at: self.pos,
                needed: n - self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A length-prefixed field; the length is checked against the remaining input before
    /// anything is allocated.
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// A count of items each at least `min_item` bytes long; the capacity to reserve for them.
    fn count(&mut self, min_item: usize) -> Result<(usize, usize), DecodeError> {
        let n = self.u32()? as usize;
        Ok((n, n.min(self.remaining() / min_item)))
    }

    fn op(&mut self) -> Result<TxOpRef<'a>, DecodeError> {
        let at = self.pos;
        let code = self.u8()?;
        if !(1..=10).contains(&code) {
            return Err(DecodeError::UnknownOp { code, at });
        }
        let pool = self.u64()?;
        let name_at = self.pos;
        let name = self.bytes()?;
        if name.len() > MAX_NAME_LEN {
            return Err(DecodeError::NameTooLong {
                len: name.len(),
                at: name_at,
            });
        }
        let oid = ObjRef { pool, name };
        Ok(match code {
            1 => TxOpRef::Touch { oid },
            2 => TxOpRef::WriteFull {
                oid,
                data: self.bytes()?,
            },
            3 => {
                let offset = self.u64()?;
                TxOpRef::Write {
                    oid,
                    offset,
                    data: self.bytes()?,
                }
            }
            4 => TxOpRef::Truncate {
                oid,
                size: self.u64()?,
            },
            5 => TxOpRef::Remove { oid },
            6 => {
                let name = self.bytes()?;
                TxOpRef::SetXattr {
                    oid,
                    name,
                    value: self.bytes()?,
                }
            }
            7 => TxOpRef::RmXattr {
                oid,
                name: self.bytes()?,
            },
            8 => {
                let (n, cap) = self.count(8)?;
                let mut entries = Vec::with_capacity(cap);
                for _ in 0..n {
                    let k = self.bytes()?;
                    entries.push((k, self.bytes()?));
                }
                TxOpRef::OmapSet { oid, entries }
            }
            9 => {
                let (n, cap) = self.count(4)?;
                let mut keys = Vec::with_capacity(cap);
                for _ in 0..n {
                    keys.push(self.bytes()?);
                }
                TxOpRef::OmapRm { oid, keys }
            }
            _ => TxOpRef::OmapClear { oid },
        })
    }
}
