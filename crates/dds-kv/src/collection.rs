//! Collection records on the hybrid log (`docs/kv-service.md` §7): the metadata value of a
//! collection key and the composite key of its element records. Nothing here allocates: the
//! encoders write into a caller's buffer, the decoders borrow from the record.

/// Record kind of a collection's metadata record (the key is the collection's key).
pub const KIND_META: u8 = 3;
/// Record kind of an element record (the key is a composite key).
pub const KIND_ELEMENT: u8 = 4;
/// Record kind of an element tombstone (the key is a composite key).
pub const KIND_ELEMENT_TOMBSTONE: u8 = 5;

/// Bytes of a metadata value.
pub const META_LEN: usize = 16;
/// Bytes a composite key adds to the collection key and the sub-key.
pub const COMPOSITE_OVERHEAD: usize = 10;

/// The type of a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollType {
    /// A hash: sub-keys are fields, values the fields' values.
    Hash = 1,
    /// A set: sub-keys are members, values empty.
    Set = 2,
    /// A sorted set: sub-keys are members, values 8-byte scores.
    ZSet = 3,
    /// A list: sub-keys are 8-byte positions, values the elements.
    List = 4,
}

impl CollType {
    /// The type's code in a metadata value.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The type of a code, `None` for an unknown one.
    pub fn from_code(c: u8) -> Option<CollType> {
        match c {
            1 => Some(CollType::Hash),
            2 => Some(CollType::Set),
            3 => Some(CollType::ZSet),
            4 => Some(CollType::List),
            _ => None,
        }
    }

    /// The type TYPE names `name`; `None` for `string`, `none` or an unknown name.
    pub fn from_name(name: &str) -> Option<CollType> {
        [
            CollType::Hash,
            CollType::Set,
            CollType::ZSet,
            CollType::List,
        ]
        .into_iter()
        .find(|t| t.name() == name)
    }

    /// The name TYPE answers.
    pub fn name(self) -> &'static str {
        match self {
            CollType::Hash => "hash",
            CollType::Set => "set",
            CollType::ZSet => "zset",
            CollType::List => "list",
        }
    }
}

/// A decoded metadata value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The collection's type.
    pub ty: CollType,
    /// The collection's version: the sequence number of the record that created it.
    pub version: u64,
}

/// Writes the metadata value of `meta`.
pub fn encode_meta(meta: Meta) -> [u8; META_LEN] {
    let mut out = [0u8; META_LEN];
    out[0] = meta.ty.code();
    out[8..16].copy_from_slice(&meta.version.to_le_bytes());
    out
}

/// Decodes a metadata value; `None` when its length, type or reserved bytes are wrong.
pub fn decode_meta(v: &[u8]) -> Option<Meta> {
    if v.len() != META_LEN || v[1..8].iter().any(|&b| b != 0) {
        return None;
    }
    Some(Meta {
        ty: CollType::from_code(v[0])?,
        version: u64::from_le_bytes(v[8..16].try_into().ok()?),
    })
}

/// Bytes of the composite key of `key`'s element `sub`.
pub fn composite_len(key_len: usize, sub_len: usize) -> usize {
    COMPOSITE_OVERHEAD + key_len + sub_len
}

/// Whether a composite key of these lengths fits a record's 16-bit key length.
pub fn composite_fits(key_len: usize, sub_len: usize) -> bool {
    composite_len(key_len, sub_len) <= u16::MAX as usize
}

/// Writes the composite key of element `sub` of version `version` of `key` into `out`, which
/// must hold exactly [`composite_len`] bytes.
pub fn encode_composite(out: &mut [u8], key: &[u8], version: u64, sub: &[u8]) {
    assert!(key.len() <= u16::MAX as usize, "collection key length");
    assert_eq!(
        out.len(),
        composite_len(key.len(), sub.len()),
        "composite key buffer size"
    );
    let k = key.len();
    out[0..2].copy_from_slice(&(k as u16).to_le_bytes());
    out[2..2 + k].copy_from_slice(key);
    out[2 + k..10 + k].copy_from_slice(&version.to_le_bytes());
    out[10 + k..].copy_from_slice(sub);
}

/// A decoded composite key, borrowing from the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Composite<'a> {
    /// The collection's key.
    pub key: &'a [u8],
    /// The version the element belongs to.
    pub version: u64,
    /// The element's sub-key (field, member or position).
    pub sub: &'a [u8],
}

/// Decodes a composite key; `None` when it is shorter than its collection key says.
pub fn decode_composite(c: &[u8]) -> Option<Composite<'_>> {
    let k = u16::from_le_bytes([*c.first()?, *c.get(1)?]) as usize;
    let key = c.get(2..2 + k)?;
    let version = u64::from_le_bytes(c.get(2 + k..10 + k)?.try_into().ok()?);
    Some(Composite {
        key,
        version,
        sub: &c[10 + k..],
    })
}

/// Longest element cache key (collection key and sub-key, with their 2-byte length): an
/// element whose key is longer is never cached on the DPU (the director's request head
/// could not hold a command naming it anyway).
pub const MAX_CACHED_ELEMENT_KEY: usize = 128;

/// Seed of the element cache hash: element entries and string keys hash apart.
const ELEMENT_SEED: u64 = 0x4444_534B_5645_4C54;

/// The DPU cache key of element `sub` of collection `key` (`docs/kv-service.md` §4.1): the
/// 128-bit seeded XXH3 of `k` (2 bytes, little-endian) ‖ key ‖ sub, without the version, so
/// that the director can name it from a command alone. `None` when longer than
/// [`MAX_CACHED_ELEMENT_KEY`] (never cached, so never invalidated).
pub fn element_cache_hash(key: &[u8], sub: &[u8]) -> Option<(u64, u64)> {
    let n = 2 + key.len() + sub.len();
    if n > MAX_CACHED_ELEMENT_KEY {
        return None;
    }
    let mut b = [0u8; MAX_CACHED_ELEMENT_KEY];
    b[..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
    b[2..2 + key.len()].copy_from_slice(key);
    b[2 + key.len()..n].copy_from_slice(sub);
    let h = xxhash_rust::xxh3::xxh3_128_with_seed(&b[..n], ELEMENT_SEED);
    Some((h as u64, (h >> 64) as u64))
}

/// Versions below this fit a DPU cache tag beside the type (8 bits above 56 of version).
pub const TAG_VERSION_LIMIT: u64 = 1 << 56;

/// The cache tag of a collection's metadata entry: its type in the top byte, its version
/// below; `None` for a version too large to fit (never met: 2^56 records).
pub fn meta_tag(meta: Meta) -> Option<u64> {
    (meta.version < TAG_VERSION_LIMIT).then(|| (meta.ty.code() as u64) << 56 | meta.version)
}

/// The version a metadata entry's tag holds for a collection of type `ty`.
pub fn tag_version(tag: u64, ty: CollType) -> Option<u64> {
    (tag >> 56 == ty.code() as u64).then_some(tag & (TAG_VERSION_LIMIT - 1))
}

/// A list position as its 8-byte sub-key: big-endian, biased by 2^63, so that byte order
/// is position order.
pub fn encode_position(pos: i64) -> [u8; 8] {
    ((pos as u64) ^ (1 << 63)).to_be_bytes()
}

/// The position of a list element's sub-key; `None` unless it has 8 bytes.
pub fn decode_position(sub: &[u8]) -> Option<i64> {
    let b: [u8; 8] = sub.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// A sorted set element's score as its 8-byte value (IEEE 754 double, little-endian).
pub fn encode_score(score: f64) -> [u8; 8] {
    score.to_le_bytes()
}

/// The score of a sorted set element's value; `None` unless it has 8 bytes and is a number.
pub fn decode_score(v: &[u8]) -> Option<f64> {
    let s = f64::from_le_bytes(v.try_into().ok()?);
    (!s.is_nan()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{self, KIND_VALUE};

    #[test]
    fn metadata_values_round_trip_byte_by_byte() {
        let m = Meta {
            ty: CollType::ZSet,
            version: 0x0102_0304_0506_0708,
        };
        let v = encode_meta(m);
        assert_eq!(v, [3, 0, 0, 0, 0, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(decode_meta(&v), Some(m));
        for ty in [
            CollType::Hash,
            CollType::Set,
            CollType::ZSet,
            CollType::List,
        ] {
            let m = Meta { ty, version: 42 };
            assert_eq!(decode_meta(&encode_meta(m)), Some(m));
            assert_eq!(CollType::from_code(ty.code()), Some(ty));
        }
        let mut bad = v;
        bad[0] = 9;
        assert_eq!(decode_meta(&bad), None);
        let mut bad = v;
        bad[3] = 1;
        assert_eq!(decode_meta(&bad), None);
        assert_eq!(decode_meta(&v[..15]), None);
        assert_eq!(CollType::Hash.name(), "hash");
        assert_eq!(CollType::List.name(), "list");
    }

    #[test]
    fn composite_keys_round_trip_byte_by_byte() {
        let mut out = vec![0u8; composite_len(3, 5)];
        encode_composite(&mut out, b"key", 0x1122, b"field");
        assert_eq!(
            out,
            [3, 0, b'k', b'e', b'y', 0x22, 0x11, 0, 0, 0, 0, 0, 0, b'f', b'i', b'e', b'l', b'd']
        );
        let c = decode_composite(&out).unwrap();
        assert_eq!(
            (c.key, c.version, c.sub),
            (&b"key"[..], 0x1122, &b"field"[..])
        );
        // The empty key and the empty sub-key (Redis allows both).
        let mut out = vec![0u8; composite_len(0, 0)];
        encode_composite(&mut out, b"", 7, b"");
        let c = decode_composite(&out).unwrap();
        assert_eq!((c.key, c.version, c.sub), (&b""[..], 7, &b""[..]));
        // Truncated composite keys do not decode.
        assert_eq!(decode_composite(&out[..9]), None);
        assert_eq!(decode_composite(&[5, 0, 1, 2]), None);
        assert_eq!(decode_composite(&[]), None);
        // Different versions of one element have different composite keys, so different hashes.
        let mut a = vec![0u8; composite_len(1, 1)];
        let mut b = a.clone();
        encode_composite(&mut a, b"h", 1, b"f");
        encode_composite(&mut b, b"h", 2, b"f");
        assert_ne!(record::key_hash(&a), record::key_hash(&b));
        assert!(composite_fits(4096, 65_535 - 4096 - 10));
        assert!(!composite_fits(4096, 65_535 - 4096 - 9));
    }

    #[test]
    fn element_records_carry_composite_keys_through_the_log_format() {
        let mut ck = vec![0u8; composite_len(4, 2)];
        encode_composite(&mut ck, b"hash", 9, b"f1");
        let len = record::record_len(ck.len(), 3);
        let mut rec = vec![0u8; len];
        record::encode(&mut rec, KIND_VALUE, &ck, b"val", 10, 0);
        // 32-byte header + 10 + key + field + value, rounded up to 8: what an HSET appends.
        assert_eq!(len, (32 + 10 + 4 + 2 + 3usize).next_multiple_of(8));
        let c = decode_composite(&rec[record::HEADER..record::HEADER + ck.len()]).unwrap();
        assert_eq!((c.key, c.version, c.sub), (&b"hash"[..], 9, &b"f1"[..]));
    }

    #[test]
    fn positions_sort_as_their_bytes_and_scores_round_trip() {
        let ps = [i64::MIN, -1_000_000, -1, 0, 1, 7, i64::MAX];
        for w in ps.windows(2) {
            assert!(encode_position(w[0]) < encode_position(w[1]), "{w:?}");
        }
        for p in ps {
            assert_eq!(decode_position(&encode_position(p)), Some(p));
        }
        assert_eq!(encode_position(0), [0x80, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode_position(&[1, 2, 3]), None);
        for s in [0.0, -1.5, 3.25e300, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(decode_score(&encode_score(s)), Some(s));
        }
        assert_eq!(encode_score(1.0), [0, 0, 0, 0, 0, 0, 0xF0, 0x3F]);
        assert_eq!(decode_score(&encode_score(f64::NAN)), None);
        assert_eq!(decode_score(&[0; 7]), None);
    }
}
