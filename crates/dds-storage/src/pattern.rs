//! The deterministic data pattern clients write and verify: every 8-byte word of a file has a
//! value fixed by (file id, word index), so any aligned range can be generated or checked on its
//! own, whatever order the writes landed in.

fn word(file: u32, index: u64) -> u64 {
    // splitmix64 of the (file, word) pair.
    let mut z = index
        .wrapping_add((file as u64) << 40)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn byte(file: u32, offset: u64) -> u8 {
    (word(file, offset >> 3) >> ((offset & 7) * 8)) as u8
}

/// Fills `buf` with the pattern of `file` at `offset`.
pub fn fill(file: u32, offset: u64, buf: &mut [u8]) {
    let mut i = 0usize;
    let mut off = offset;
    while i < buf.len() && off & 7 != 0 {
        buf[i] = byte(file, off);
        i += 1;
        off += 1;
    }
    let mut chunks = buf[i..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&word(file, off >> 3).to_le_bytes());
        off += 8;
    }
    for b in chunks.into_remainder() {
        *b = byte(file, off);
        off += 1;
    }
}

/// The first offset (file offset) where `buf` differs from the pattern, if any.
pub fn check(file: u32, offset: u64, buf: &[u8]) -> Option<u64> {
    let mut expect = [0u8; 4096];
    for (n, chunk) in buf.chunks(expect.len()).enumerate() {
        let at = offset + (n * expect.len()) as u64;
        let e = &mut expect[..chunk.len()];
        fill(file, at, e);
        if chunk != e {
            let i = chunk.iter().zip(e.iter()).position(|(a, b)| a != b)?;
            return Some(at + i as u64);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unaligned_ranges_agree_with_aligned_ones() {
        let mut whole = vec![0u8; 1000];
        fill(3, 8, &mut whole);
        let mut part = vec![0u8; 333];
        fill(3, 8 + 101, &mut part);
        assert_eq!(&whole[101..434], &part[..]);
        assert_eq!(check(3, 8, &whole), None);
        assert_eq!(check(4, 8, &whole), Some(8));
        whole[500] ^= 1;
        assert_eq!(check(3, 8, &whole), Some(508));
    }
}
