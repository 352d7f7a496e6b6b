//! Metadata in redb: table layout, keys and the onode (an object's size, mtime and block map).

use crate::tx::ObjectId;
use redb::TableDefinition;
use std::collections::BTreeMap;

/// Objects: `pool (u64 BE) ‖ name` → encoded [`Onode`]. Big-endian pools keep a pool's names
/// together and in byte order.
pub(crate) const OBJECTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("objects");
/// Xattrs: [`sub_prefix`] ‖ xattr name → value.
pub(crate) const XATTRS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("xattrs");
/// Omap: [`sub_prefix`] ‖ key → value.
pub(crate) const OMAP: TableDefinition<&[u8], &[u8]> = TableDefinition::new("omap");
/// Allocation bitmap: chunk index → 4 KiB of bitmap (bit set = block allocated).
pub(crate) const BITMAP: TableDefinition<u64, &[u8]> = TableDefinition::new("bitmap");
/// Store state: `uuid` (16 bytes, matches the device superblock), `objects` (u64 LE count).
pub(crate) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state");

/// Key of an object in [`OBJECTS`].
pub(crate) fn obj_key(oid: &ObjectId) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + oid.name.len());
    k.extend_from_slice(&oid.pool.to_be_bytes());
    k.extend_from_slice(&oid.name);
    k
}

/// Prefix of an object's rows in [`XATTRS`] and [`OMAP`]: `pool (u64 BE) ‖ name length (u16 BE)
/// ‖ name`, so that no object's prefix is a prefix of another's.
pub(crate) fn sub_prefix_of_key(obj_key: &[u8]) -> Vec<u8> {
    let name = &obj_key[8..];
    let len = u16::try_from(name.len()).expect("names are at most MAX_NAME_LEN bytes");
    let mut k = Vec::with_capacity(10 + name.len());
    k.extend_from_slice(&obj_key[..8]);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(name);
    k
}

/// `prefix ‖ sub`.
pub(crate) fn sub_key(prefix: &[u8], sub: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + sub.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(sub);
    k
}

/// One mapped logical block: where it lies on the device and its crc32c.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blk {
    pub pblock: u64,
    pub crc: u32,
}

/// An object's metadata. Logical blocks missing from `blocks` are holes (read as zeros); bytes
/// of a block beyond `size` are zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Onode {
    pub size: u64,
    pub mtime_ns: u64,
    pub blocks: BTreeMap<u64, Blk>,
}

const ONODE_VERSION: u8 = 1;

impl Onode {
    /// Encoding: version u8, size u64, mtime u64, run count u32, then runs of logically and
    /// physically contiguous blocks: lblock u64, pblock u64, count u32, count × crc u32 (LE).
    pub fn encode(&self) -> Vec<u8> {
        let mut runs: Vec<(u64, u64, Vec<u32>)> = Vec::new();
        for (&lb, b) in &self.blocks {
            match runs.last_mut() {
                Some((l, p, crcs))
                    if *l + crcs.len() as u64 == lb && *p + crcs.len() as u64 == b.pblock =>
                {
                    crcs.push(b.crc)
                }
                _ => runs.push((lb, b.pblock, vec![b.crc])),
            }
        }
        let mut out = Vec::with_capacity(21 + runs.len() * 20 + self.blocks.len() * 4);
        out.push(ONODE_VERSION);
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.mtime_ns.to_le_bytes());
        out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        for (l, p, crcs) in runs {
            out.extend_from_slice(&l.to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&(crcs.len() as u32).to_le_bytes());
            for c in crcs {
                out.extend_from_slice(&c.to_le_bytes());
            }
        }
        out
    }

    /// Decodes an onode; `None` if the bytes are not a valid encoding.
    pub fn decode(buf: &[u8]) -> Option<Onode> {
        let mut pos = 0usize;
        let mut take = |n: usize| -> Option<&[u8]> {
            let s = buf.get(pos..pos.checked_add(n)?)?;
            pos += n;
            Some(s)
        };
        if take(1)? != [ONODE_VERSION] {
            return None;
        }
        let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
        let size = u64_of(take(8)?);
        let mtime_ns = u64_of(take(8)?);
        let nruns = u32_of(take(4)?);
        let mut blocks = BTreeMap::new();
        for _ in 0..nruns {
            let l = u64_of(take(8)?);
            let p = u64_of(take(8)?);
            let n = u32_of(take(4)?) as u64;
            for i in 0..n {
                let crc = u32_of(take(4)?);
                blocks.insert(
                    l.checked_add(i)?,
                    Blk {
                        pblock: p.checked_add(i)?,
                        crc,
                    },
                );
            }
        }
        if pos != buf.len() {
            return None;
        }
        Some(Onode {
            size,
            mtime_ns,
            blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onode_round_trip() {
        let mut o = Onode {
            size: 5 * 4096 + 3,
            mtime_ns: 42,
            blocks: BTreeMap::new(),
        };
        for (l, p) in [(0, 10), (1, 11), (2, 12), (4, 7), (5, 100)] {
            o.blocks.insert(
                l,
                Blk {
                    pblock: p,
                    crc: (l * 31) as u32,
                },
            );
        }
        let e = o.encode();
        assert_eq!(Onode::decode(&e), Some(o));
        for cut in 0..e.len() {
            assert_eq!(Onode::decode(&e[..cut]), None);
        }
    }
}
