//! Metadata log records (docs/on-disk-format.md §5): their kinds, encoding and decoding, and
//! how replay tells a record from the end of the log.

use super::*;

pub(crate) const KIND_CREATE_DIR: u16 = 1;
pub(crate) const KIND_REMOVE_DIR: u16 = 2;
pub(crate) const KIND_CREATE_FILE: u16 = 3;
pub(crate) const KIND_DELETE_FILE: u16 = 4;
pub(crate) const KIND_RENAME_FILE: u16 = 5;
pub(crate) const KIND_SET_SIZE: u16 = 6;
pub(crate) const KIND_SET_SIZES: u16 = 7;
/// Bytes of a `SET_SIZES` payload before its entries (count, zero).
pub(crate) const SET_SIZES_FIXED: usize = 8;

/// A metadata change, as logged.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Record<'a> {
    CreateDir {
        slot: u32,
        name: &'a str,
    },
    RemoveDir {
        slot: u32,
    },
    CreateFile {
        slot: u32,
        gen: u32,
        dir: u32,
        name: &'a str,
    },
    DeleteFile {
        slot: u32,
        gen: u32,
    },
    RenameFile {
        slot: u32,
        gen: u32,
        dir: u32,
        name: &'a str,
    },
    SetSize {
        slot: u32,
        gen: u32,
        size: u64,
        tail_dirty: bool,
        keep: u32,
        append: Segs<'a>,
    },
    /// Several files' size changes made durable together (a group commit of extends), applied
    /// in order, each as a `SetSize` without `TAIL_DIRTY`.
    SetSizes(Changes<'a>),
}

/// One file's size change inside a `SET_SIZES` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizeChange {
    pub slot: u32,
    pub gen: u32,
    pub size: u64,
    pub keep: u32,
    pub append: Vec<u32>,
}

impl SizeChange {
    /// Encoded length of an entry (a `SET_SIZE` payload) appending `segments` segments.
    pub(crate) fn entry_len(segments: usize) -> usize {
        crate::layout::SET_SIZE_FIXED as usize + 4 * segments
    }
}

/// The entries of a `SET_SIZES` record, either native or still encoded (`count` entries,
/// checked to parse when the record was decoded).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Changes<'a> {
    Slice(&'a [SizeChange]),
    Bytes { count: u32, bytes: &'a [u8] },
}

impl<'a> Changes<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Changes::Slice(s) => s.len(),
            Changes::Bytes { count, .. } => *count as usize,
        }
    }

    /// The entries as `SetSize` records, in order.
    pub(crate) fn records(&self) -> impl Iterator<Item = Record<'a>> + 'a {
        let (slice, mut reader, count) = match *self {
            Changes::Slice(s) => (s, Reader::new(&[]), 0),
            Changes::Bytes { count, bytes } => (&[][..], Reader::new(bytes), count),
        };
        let owned = slice.iter().map(|c| Record::SetSize {
            slot: c.slot,
            gen: c.gen,
            size: c.size,
            tail_dirty: false,
            keep: c.keep,
            append: Segs::Slice(&c.append),
        });
        let decoded = (0..count).map_while(move |_| decode_set_size(&mut reader));
        owned.chain(decoded)
    }
}

/// Reads one `SET_SIZE` payload.
fn decode_set_size<'b>(r: &mut Reader<'b>) -> Option<Record<'b>> {
    let slot = r.u32()?;
    let gen = r.u32()?;
    let size = r.u64()?;
    let flags = r.u32()?;
    if flags & !FLAG_TAIL_DIRTY != 0 {
        return None;
    }
    let keep = r.u32()?;
    let n = r.u32()? as usize;
    let append = Segs::Bytes(r.bytes(n.checked_mul(4)?)?);
    Some(Record::SetSize {
        slot,
        gen,
        size,
        tail_dirty: flags & FLAG_TAIL_DIRTY != 0,
        keep,
        append,
    })
}

/// A list of segment numbers, either native or still encoded.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Segs<'a> {
    Slice(&'a [u32]),
    Bytes(&'a [u8]),
}

impl<'a> Segs<'a> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Segs::Slice(s) => s.len(),
            Segs::Bytes(b) => b.len() / 4,
        }
    }
    pub(crate) fn get(&self, i: usize) -> u32 {
        match self {
            Segs::Slice(s) => s[i],
            Segs::Bytes(b) => le32(b, i * 4),
        }
    }
}

/// A metadata change that owns its name and segments (handed to the metadata thread).
#[derive(Debug, Clone)]
pub(crate) enum OwnedRecord {
    CreateDir {
        slot: u32,
        name: String,
    },
    RemoveDir {
        slot: u32,
    },
    CreateFile {
        slot: u32,
        gen: u32,
        dir: u32,
        name: String,
    },
    DeleteFile {
        slot: u32,
        gen: u32,
    },
    RenameFile {
        slot: u32,
        gen: u32,
        dir: u32,
        name: String,
    },
    SetSize {
        slot: u32,
        gen: u32,
        size: u64,
        tail_dirty: bool,
        keep: u32,
        append: Vec<u32>,
    },
    SetSizes(Vec<SizeChange>),
}

impl OwnedRecord {
    pub(crate) fn as_record(&self) -> Record<'_> {
        match self {
            OwnedRecord::CreateDir { slot, name } => Record::CreateDir { slot: *slot, name },
            OwnedRecord::RemoveDir { slot } => Record::RemoveDir { slot: *slot },
            OwnedRecord::CreateFile {
                slot,
                gen,
                dir,
                name,
            } => Record::CreateFile {
                slot: *slot,
                gen: *gen,
                dir: *dir,
                name,
            },
            OwnedRecord::DeleteFile { slot, gen } => Record::DeleteFile {
                slot: *slot,
                gen: *gen,
            },
            OwnedRecord::RenameFile {
                slot,
                gen,
                dir,
                name,
            } => Record::RenameFile {
                slot: *slot,
                gen: *gen,
                dir: *dir,
                name,
            },
            OwnedRecord::SetSize {
                slot,
                gen,
                size,
                tail_dirty,
                keep,
                append,
            } => Record::SetSize {
                slot: *slot,
                gen: *gen,
                size: *size,
                tail_dirty: *tail_dirty,
                keep: *keep,
                append: Segs::Slice(append),
            },
            OwnedRecord::SetSizes(changes) => Record::SetSizes(Changes::Slice(changes)),
        }
    }
}

impl Record<'_> {
    pub(crate) fn kind(&self) -> u16 {
        match self {
            Record::CreateDir { .. } => KIND_CREATE_DIR,
            Record::RemoveDir { .. } => KIND_REMOVE_DIR,
            Record::CreateFile { .. } => KIND_CREATE_FILE,
            Record::DeleteFile { .. } => KIND_DELETE_FILE,
            Record::RenameFile { .. } => KIND_RENAME_FILE,
            Record::SetSize { .. } => KIND_SET_SIZE,
            Record::SetSizes(_) => KIND_SET_SIZES,
        }
    }

    /// Encoded length including the 32-byte header (unpadded).
    pub(crate) fn encoded_len(&self) -> usize {
        LOG_HEADER_LEN
            + match self {
                Record::CreateDir { name, .. } => 8 + name.len(),
                Record::RemoveDir { .. } => 4,
                Record::CreateFile { name, .. } | Record::RenameFile { name, .. } => {
                    16 + name.len()
                }
                Record::DeleteFile { .. } => 8,
                Record::SetSize { append, .. } => 28 + 4 * append.len(),
                Record::SetSizes(c) => {
                    SET_SIZES_FIXED
                        + c.records()
                            .map(|r| match r {
                                Record::SetSize { append, .. } => 28 + 4 * append.len(),
                                _ => unreachable!("entries are SetSize records"),
                            })
                            .sum::<usize>()
                }
            }
    }

    /// Encodes into `out` (≥ `encoded_len`), returns the length.
    pub(crate) fn encode(&self, fs_uuid: u64, seq: u64, out: &mut [u8]) -> usize {
        let len = self.encoded_len();
        let mut w = Writer::new(out);
        w.bytes(LOG_MAGIC);
        w.u32(0); // crc, patched below
        w.u32(len as u32);
        w.u16(self.kind());
        w.u16(0);
        w.u64(fs_uuid);
        w.u64(seq);
        match *self {
            Record::CreateDir { slot, name } => {
                w.u32(slot);
                w.u16(name.len() as u16);
                w.u16(0);
                w.bytes(name.as_bytes());
            }
            Record::RemoveDir { slot } => w.u32(slot),
            Record::CreateFile {
                slot,
                gen,
                dir,
                name,
            }
            | Record::RenameFile {
                slot,
                gen,
                dir,
                name,
            } => {
                w.u32(slot);
                w.u32(gen);
                w.u32(dir);
                w.u16(name.len() as u16);
                w.u16(0);
                w.bytes(name.as_bytes());
            }
            Record::DeleteFile { slot, gen } => {
                w.u32(slot);
                w.u32(gen);
            }
            Record::SetSize { .. } => encode_set_size(&mut w, self),
            Record::SetSizes(c) => {
                w.u32(c.len() as u32);
                w.u32(0);
                for r in c.records() {
                    encode_set_size(&mut w, &r);
                }
            }
        }
        assert_eq!(w.pos(), len);
        let crc = crc32c::crc32c(&out[8..len]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        len
    }

    /// Decodes a payload of the given kind.
    fn decode_payload(kind: u16, p: &[u8]) -> Option<Record<'_>> {
        let mut r = Reader::new(p);
        fn name<'b>(r: &mut Reader<'b>) -> Option<&'b str> {
            let n = r.u16()? as usize;
            if r.u16()? != 0 {
                return None;
            }
            std::str::from_utf8(r.bytes(n)?).ok()
        }
        let rec = match kind {
            KIND_CREATE_DIR => {
                let slot = r.u32()?;
                let name = name(&mut r)?;
                Record::CreateDir { slot, name }
            }
            KIND_REMOVE_DIR => Record::RemoveDir { slot: r.u32()? },
            KIND_CREATE_FILE | KIND_RENAME_FILE => {
                let slot = r.u32()?;
                let gen = r.u32()?;
                let dir = r.u32()?;
                let name = name(&mut r)?;
                if kind == KIND_CREATE_FILE {
                    Record::CreateFile {
                        slot,
                        gen,
                        dir,
                        name,
                    }
                } else {
                    Record::RenameFile {
                        slot,
                        gen,
                        dir,
                        name,
                    }
                }
            }
            KIND_DELETE_FILE => Record::DeleteFile {
                slot: r.u32()?,
                gen: r.u32()?,
            },
            KIND_SET_SIZE => decode_set_size(&mut r)?,
            KIND_SET_SIZES => {
                let count = r.u32()?;
                if r.u32()? != 0 || count < 2 {
                    return None;
                }
                let bytes = r.bytes(r.remaining())?;
                // Every entry must parse, without TAIL_DIRTY, and fill the payload exactly.
                let mut e = Reader::new(bytes);
                for _ in 0..count {
                    match decode_set_size(&mut e)? {
                        Record::SetSize {
                            tail_dirty: false, ..
                        } => {}
                        _ => return None,
                    }
                }
                if e.remaining() != 0 {
                    return None;
                }
                Record::SetSizes(Changes::Bytes { count, bytes })
            }
            _ => return None,
        };
        if r.remaining() != 0 {
            return None;
        }
        Some(rec)
    }
}

/// Writes a `SET_SIZE` payload (`rec` is a `Record::SetSize`).
fn encode_set_size(w: &mut Writer<'_>, rec: &Record<'_>) {
    let Record::SetSize {
        slot,
        gen,
        size,
        tail_dirty,
        keep,
        append,
    } = *rec
    else {
        unreachable!("a SetSize record");
    };
    w.u32(slot);
    w.u32(gen);
    w.u64(size);
    w.u32(if tail_dirty { FLAG_TAIL_DIRTY } else { 0 });
    w.u32(keep);
    w.u32(append.len() as u32);
    for i in 0..append.len() {
        w.u32(append.get(i));
    }
}

/// Result of looking at a log position during replay.
pub(crate) enum LogEntry<'a> {
    /// A record for this file system with the expected sequence number, and its padded length.
    Valid(Record<'a>, usize),
    /// A well-formed record whose payload does not decode: corruption.
    Undecodable(String),
    /// Not a current record: the log ends here.
    End,
}

/// Parses the log entry at the start of `b` (which extends to the end of the log).
pub(crate) fn parse_log_entry(b: &[u8], fs_uuid: u64, seq: u64, block: usize) -> LogEntry<'_> {
    if b.len() < LOG_HEADER_LEN || &b[..4] != LOG_MAGIC {
        return LogEntry::End;
    }
    let total = le32(b, 8) as usize;
    if total < LOG_HEADER_LEN || total > b.len() {
        return LogEntry::End;
    }
    if crc32c::crc32c(&b[8..total]) != le32(b, 4) {
        return LogEntry::End;
    }
    if le64(b, 16) != fs_uuid || le64(b, 24) != seq {
        return LogEntry::End;
    }
    let kind = u16::from_le_bytes([b[12], b[13]]);
    if b[14] != 0 || b[15] != 0 {
        return LogEntry::Undecodable(format!("record {seq}: reserved bits set"));
    }
    match Record::decode_payload(kind, &b[LOG_HEADER_LEN..total]) {
        Some(r) => LogEntry::Valid(r, total.div_ceil(block) * block),
        None => LogEntry::Undecodable(format!("record {seq}: bad payload of kind {kind}")),
    }
}

/// The sequence number of a well-formed record of this file system at the start of `b`
/// (magic, length, checksum and file system id all check out), whatever its position.
pub(crate) fn record_seq(b: &[u8], fs_uuid: u64) -> Option<u64> {
    if b.len() < LOG_HEADER_LEN || &b[..4] != LOG_MAGIC {
        return None;
    }
    let total = le32(b, 8) as usize;
    if total < LOG_HEADER_LEN || total > b.len() {
        return None;
    }
    if crc32c::crc32c(&b[8..total]) != le32(b, 4) || le64(b, 16) != fs_uuid {
        return None;
    }
    Some(le64(b, 24))
}
