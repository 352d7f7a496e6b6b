//! Explicit cache batches from the host library: ring opcodes 4 = CACHE and 5 = INVALIDATE.
//! The wire format lives in `dds_proto::cache_records` (shared with the host library); this
//! module adapts its errors to the offload API's.

use dds_offload_api::Malformed;

pub use dds_proto::cache_records::{
    encode_cache_items, encode_invalidate_items, CacheRecordItem, CACHE_ITEM_BYTES,
    INVALIDATE_ITEM_BYTES, OP_CACHE, OP_INVALIDATE,
};

/// Decodes the data of a CACHE record. Fails if the length is not a multiple of 32.
pub fn decode_cache_items(
    data: &[u8],
) -> Result<impl Iterator<Item = CacheRecordItem> + '_, Malformed> {
    dds_proto::cache_records::decode_cache_items(data).map_err(Malformed)
}

/// Decodes the data of an INVALIDATE record.
pub fn decode_invalidate_items(data: &[u8]) -> Result<impl Iterator<Item = u64> + '_, Malformed> {
    dds_proto::cache_records::decode_invalidate_items(data).map_err(Malformed)
}
