//! Explicit cache batches from the host library: ring opcodes 4 = CACHE and 5 = INVALIDATE,
//! whose record data is a packed array of items (`docs/consistency.md`, `docs/records.md`).
//!
//! CACHE item, 32 bytes: `key u64, offset u64, file_id u32, size u32, tag u64`.
//! INVALIDATE item, 8 bytes: `key u64`.
//! The DPU stamps both with a fresh version from the DPU-wide counter when it applies the
//! record, in ring order with the host's writes.

pub use crate::record::{OP_CACHE, OP_INVALIDATE};

/// Bytes of one CACHE item.
pub const CACHE_ITEM_BYTES: usize = 32;
/// Bytes of one INVALIDATE item.
pub const INVALIDATE_ITEM_BYTES: usize = 8;

/// One item of a CACHE batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheRecordItem {
    /// Application key.
    pub key: u64,
    /// Byte offset of the object in the file.
    pub offset: u64,
    /// File id.
    pub file_id: u32,
    /// Object size.
    pub size: u32,
    /// Free word for the application.
    pub tag: u64,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Encodes CACHE items into `out`; returns the bytes written (`None` if `out` is too small).
pub fn encode_cache_items(items: &[CacheRecordItem], out: &mut [u8]) -> Option<usize> {
    let n = items.len().checked_mul(CACHE_ITEM_BYTES)?;
    let out = out.get_mut(..n)?;
    for (it, o) in items.iter().zip(out.chunks_exact_mut(CACHE_ITEM_BYTES)) {
        o[0..8].copy_from_slice(&it.key.to_le_bytes());
        o[8..16].copy_from_slice(&it.offset.to_le_bytes());
        o[16..20].copy_from_slice(&it.file_id.to_le_bytes());
        o[20..24].copy_from_slice(&it.size.to_le_bytes());
        o[24..32].copy_from_slice(&it.tag.to_le_bytes());
    }
    Some(n)
}

/// Decodes the data of a CACHE record. Fails if the length is not a multiple of 32.
pub fn decode_cache_items(
    data: &[u8],
) -> Result<impl Iterator<Item = CacheRecordItem> + '_, &'static str> {
    if !data.len().is_multiple_of(CACHE_ITEM_BYTES) {
        return Err("CACHE record length not a multiple of 32");
    }
    Ok(data
        .chunks_exact(CACHE_ITEM_BYTES)
        .map(|c| CacheRecordItem {
            key: u64_at(c, 0),
            offset: u64_at(c, 8),
            file_id: u32::from_le_bytes([c[16], c[17], c[18], c[19]]),
            size: u32::from_le_bytes([c[20], c[21], c[22], c[23]]),
            tag: u64_at(c, 24),
        }))
}

/// Encodes INVALIDATE keys into `out`; returns the bytes written.
pub fn encode_invalidate_items(keys: &[u64], out: &mut [u8]) -> Option<usize> {
    let n = keys.len().checked_mul(INVALIDATE_ITEM_BYTES)?;
    let out = out.get_mut(..n)?;
    for (k, o) in keys.iter().zip(out.chunks_exact_mut(8)) {
        o.copy_from_slice(&k.to_le_bytes());
    }
    Some(n)
}

/// Decodes the data of an INVALIDATE record.
pub fn decode_invalidate_items(
    data: &[u8],
) -> Result<impl Iterator<Item = u64> + '_, &'static str> {
    if !data.len().is_multiple_of(INVALIDATE_ITEM_BYTES) {
        return Err("INVALIDATE record length not a multiple of 8");
    }
    Ok(data.chunks_exact(8).map(|c| u64_at(c, 0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let items = [
            CacheRecordItem {
                key: 1,
                offset: 2,
                file_id: 3,
                size: 4,
                tag: 5,
            },
            CacheRecordItem {
                key: u64::MAX,
                offset: 7,
                file_id: u32::MAX,
                size: 9,
                tag: 0,
            },
        ];
        let mut buf = [0u8; 64];
        assert_eq!(encode_cache_items(&items, &mut buf), Some(64));
        assert_eq!(buf[16..20], 3u32.to_le_bytes());
        let back: Vec<_> = decode_cache_items(&buf).unwrap().collect();
        assert_eq!(back, items);
        assert!(decode_cache_items(&buf[..33]).is_err());
        assert_eq!(encode_cache_items(&items, &mut buf[..40]), None);
        let mut kb = [0u8; 16];
        assert_eq!(encode_invalidate_items(&[9, 10], &mut kb), Some(16));
        assert_eq!(
            decode_invalidate_items(&kb).unwrap().collect::<Vec<_>>(),
            vec![9, 10]
        );
        assert!(decode_invalidate_items(&kb[..9]).is_err());
    }
}
