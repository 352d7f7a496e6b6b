//! Log records (`docs/kv-service.md` §2): encoding, decoding, key hashing. Shared by the host
//! store and the DPU offload app, so nothing here allocates.

use xxhash_rust::xxh3::xxh3_128;

/// Record magic, "DKVR" little-endian.
pub const MAGIC: u32 = 0x5256_4B44;
/// Header bytes.
pub const HEADER: usize = 32;
/// Kind: a value.
pub const KIND_VALUE: u8 = 1;
/// Kind: a tombstone (the key was deleted).
pub const KIND_TOMBSTONE: u8 = 2;
/// Flag: a newer record of the key existed when this one was written to storage.
pub const FLAG_SUPERSEDED: u8 = 1;

/// The key's 128-bit hash as (h1, h2): the index key, and the cache key and tag.
#[inline]
pub fn key_hash(key: &[u8]) -> (u64, u64) {
    let h = xxh3_128(key);
    (h as u64, (h >> 64) as u64)
}

/// Bytes a record of this key and value takes in the log.
#[inline]
pub fn record_len(klen: usize, vlen: usize) -> usize {
    (HEADER + klen + vlen).next_multiple_of(8)
}

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// [`KIND_VALUE`] or [`KIND_TOMBSTONE`].
    pub kind: u8,
    /// Flag bits.
    pub flags: u8,
    /// Key bytes.
    pub klen: u16,
    /// Value bytes.
    pub vlen: u32,
    /// CRC32C as stored.
    pub crc: u32,
    /// Sequence number (larger is newer).
    pub seq: u64,
    /// Expiry in Unix milliseconds, 0 for none.
    pub expire_ms: u64,
}

impl Header {
    /// Bytes of the whole record, padding included.
    #[inline]
    pub fn len(&self) -> usize {
        record_len(self.klen as usize, self.vlen as usize)
    }

    /// Always false: a record has at least a header.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Key range within the record.
    #[inline]
    pub fn key_range(&self) -> std::ops::Range<usize> {
        HEADER..HEADER + self.klen as usize
    }

    /// Value range within the record.
    #[inline]
    pub fn value_range(&self) -> std::ops::Range<usize> {
        let k = HEADER + self.klen as usize;
        k..k + self.vlen as usize
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decodes the header at the start of `b`; `None` if `b` is shorter than a header, the magic
/// is wrong, the kind unknown or the key empty.
pub fn decode_header(b: &[u8]) -> Option<Header> {
    if b.len() < HEADER || u32_at(b, 0) != MAGIC {
        return None;
    }
    let h = Header {
        kind: b[4],
        flags: b[5],
        klen: u16::from_le_bytes([b[6], b[7]]),
        vlen: u32_at(b, 8),
        crc: u32_at(b, 12),
        seq: u64_at(b, 16),
        expire_ms: u64_at(b, 24),
    };
    let tomb = h.kind == KIND_TOMBSTONE || h.kind == crate::collection::KIND_ELEMENT_TOMBSTONE;
    if !(KIND_VALUE..=crate::collection::KIND_ELEMENT_TOMBSTONE).contains(&h.kind)
        || (tomb && h.vlen != 0)
    {
        return None;
    }
    Some(h)
}

/// CRC32C of a whole record with its flags byte and CRC field taken as zero.
pub fn record_crc(rec: &[u8]) -> u32 {
    let mut c = crc32c::crc32c(&rec[..5]);
    c = crc32c::crc32c_append(c, &[0]);
    c = crc32c::crc32c_append(c, &rec[6..12]);
    c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &rec[16..])
}

/// Writes a record into `out` (exactly `record_len(key.len(), value.len())` bytes).
pub fn encode(out: &mut [u8], kind: u8, key: &[u8], value: &[u8], seq: u64, expire_ms: u64) {
    let len = record_len(key.len(), value.len());
    assert_eq!(out.len(), len, "record buffer of the wrong size");
    assert!(key.len() <= u16::MAX as usize, "key length");
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4] = kind;
    out[5] = 0;
    out[6..8].copy_from_slice(&(key.len() as u16).to_le_bytes());
    out[8..12].copy_from_slice(&(value.len() as u32).to_le_bytes());
    out[12..16].fill(0);
    out[16..24].copy_from_slice(&seq.to_le_bytes());
    out[24..32].copy_from_slice(&expire_ms.to_le_bytes());
    out[HEADER..HEADER + key.len()].copy_from_slice(key);
    out[HEADER + key.len()..HEADER + key.len() + value.len()].copy_from_slice(value);
    out[HEADER + key.len() + value.len()..].fill(0);
    let crc = record_crc(out);
    out[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Checks a whole record: `Some(header)` when the header decodes, the record fits in `b` and
/// the CRC matches.
pub fn check(b: &[u8]) -> Option<Header> {
    let h = decode_header(b)?;
    let rec = b.get(..h.len())?;
    (record_crc(rec) == h.crc).then_some(h)
}

/// Iterates over the records at the start of `b` (a page, or a write of whole records) until
/// the first zero magic or invalid record; yields (offset in `b`, header).
pub fn scan(b: &[u8]) -> impl Iterator<Item = (usize, Header)> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let h = check(b.get(at..)?)?;
        let here = at;
        at += h.len();
        Some((here, h))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let mut page = vec![0u8; 256];
        let a = record_len(3, 5);
        encode(&mut page[..a], KIND_VALUE, b"key", b"value", 7, 0);
        let b = record_len(2, 0);
        encode(&mut page[a..a + b], KIND_TOMBSTONE, b"k2", b"", 8, 0);
        let got: Vec<_> = scan(&page).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].1.seq, 7);
        assert_eq!(&page[got[0].1.value_range()], b"value");
        assert_eq!(got[1].0, a);
        assert_eq!(got[1].1.kind, KIND_TOMBSTONE);
        // The superseded flag is outside the CRC.
        page[5] = FLAG_SUPERSEDED;
        assert_eq!(check(&page).unwrap().flags, FLAG_SUPERSEDED);
        // Any other damaged byte stops the scan at that record.
        for i in (0..a).filter(|&i| i != 5) {
            let mut p = page.clone();
            p[i] ^= 0x40;
            assert!(check(&p).is_none(), "byte {i}");
        }
        assert_eq!(key_hash(b"key"), key_hash(b"key"));
        assert_ne!(key_hash(b"key").0, key_hash(b"kez").0);
    }
}
