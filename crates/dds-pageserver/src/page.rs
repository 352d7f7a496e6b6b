//! Pages and page images (`docs/pageserver-protocol.md` §1): header, checksum, slots, patches.

use crate::proto::{u32_at, u64_at};

/// Page magic, "DSGP".
pub const MAGIC: u32 = 0x5047_5344;
/// Header bytes.
pub const HEADER: usize = 32;
/// Image slots per page in the page file.
pub const SLOTS: usize = 4;

/// Byte offset of image slot `slot` of page `id` in the page file.
pub fn slot_offset(id: u64, slot: usize, page_size: usize) -> u64 {
    (id * SLOTS as u64 + slot as u64) * page_size as u64
}

/// CRC32C of a page with its checksum field zeroed.
pub fn checksum(page: &[u8]) -> u32 {
    let c = crc32c::crc32c(&page[..4]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &page[8..])
}

/// Stamps the header of `page` (id, LSN, checksum).
pub fn seal(page: &mut [u8], id: u64, lsn: u64) {
    page[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    page[8..16].copy_from_slice(&lsn.to_le_bytes());
    page[16..24].copy_from_slice(&id.to_le_bytes());
    page[24..32].fill(0);
    let c = checksum(page);
    page[4..8].copy_from_slice(&c.to_le_bytes());
}

/// Stamps a sealed image with the LSN of its page's next record known when it is written (0:
/// none), which a DPU read of its slot checks (`docs/pageserver-protocol.md` §6.3).
pub fn stamp_next(page: &mut [u8], next: u64) {
    page[24..32].copy_from_slice(&next.to_le_bytes());
    let c = checksum(page);
    page[4..8].copy_from_slice(&c.to_le_bytes());
}

/// The next-record stamp of an image (0: none).
pub fn next_lsn(page: &[u8]) -> u64 {
    u64_at(page, 24)
}

/// The (id, LSN) of a sealed page whose checksum holds.
pub fn check(page: &[u8]) -> Option<(u64, u64)> {
    if page.len() < HEADER || u32_at(page, 0) != MAGIC || u32_at(page, 4) != checksum(page) {
        return None;
    }
    Some((u64_at(page, 16), u64_at(page, 8)))
}

/// A page as read from storage: a sealed page, or all zeros (never written: an empty page at
/// LSN 0, sealed here). `None`: damaged.
pub fn from_storage(page: &mut [u8], id: u64) -> Option<u64> {
    if page.iter().all(|&b| b == 0) {
        seal(page, id, 0);
        return Some(0);
    }
    match check(page) {
        Some((pid, lsn)) if pid == id => Some(lsn),
        _ => None,
    }
}

/// The LSN in a page's header.
pub fn lsn(page: &[u8]) -> u64 {
    u64_at(page, 8)
}

/// Applies a patch at payload offset `off` (bounds checked by the caller).
pub fn patch(page: &mut [u8], off: usize, data: &[u8]) {
    page[HEADER + off..HEADER + off + data.len()].copy_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_seal_check_and_detect_damage() {
        let mut p = vec![0u8; 8192];
        assert_eq!(from_storage(&mut p, 7), Some(0));
        patch(&mut p, 10, b"abc");
        seal(&mut p, 7, 42);
        assert_eq!(check(&p), Some((7, 42)));
        assert_eq!(from_storage(&mut p.clone(), 8), None);
        stamp_next(&mut p, 50);
        assert_eq!((check(&p), next_lsn(&p)), (Some((7, 42)), 50));
        p[100] ^= 1;
        assert_eq!(check(&p), None);
    }
}
