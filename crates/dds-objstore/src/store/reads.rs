//! Reads: the [`ObjectStore`] implementation of [`ObjStore`] (data read with holes as zeros
//! and every block's crc32c verified, stat, xattrs, omap, listing, statfs; `submit` queues
//! through the staging path and waits), and the onode lookups and checks it uses.

use super::{bad_meta, not_found, Inner, ObjStore, BS, MAX_OBJECT_SIZE_CAP};
use crate::device::IoOp;
use crate::error::StoreError;
use crate::meta::{obj_key, sub_key, sub_prefix_of_key, Blk, Onode, OBJECTS, OMAP, XATTRS};
use crate::tx::{ObjectId, Transaction, TxOp, TxOpRef};
use crate::{KvPairs, ObjStat, ObjectStore, StoreStats, BLOCK_SIZE};
use dds_sys::AlignedBuf;
use redb::ReadableTable;
use std::ops::Bound;
use std::sync::atomic::Ordering;

impl Inner {
    pub(super) fn onode(
        &self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        oid: &ObjectId,
    ) -> Result<Onode, StoreError> {
        match table.get(obj_key(oid).as_slice())? {
            Some(v) => self.decode_onode(oid, v.value()),
            None => Err(not_found(oid)),
        }
    }

    /// Decodes an onode and checks that it stays on the device and within its object.
    pub(super) fn decode_onode(&self, oid: &ObjectId, bytes: &[u8]) -> Result<Onode, StoreError> {
        let on = Onode::decode(bytes).ok_or_else(|| bad_meta(oid))?;
        let max_lblock = self.opts.max_object_size.max(on.size).div_ceil(BS);
        let sane = on.size <= MAX_OBJECT_SIZE_CAP
            && on
                .blocks
                .iter()
                .all(|(&lb, b)| lb < max_lblock && b.pblock >= 1 && b.pblock < self.nblocks);
        if !sane {
            return Err(bad_meta(oid));
        }
        Ok(on)
    }

    /// Reads one mapped block from the device and verifies it.
    pub(super) fn read_verified(
        &self,
        oid: &ObjectId,
        lb: u64,
        blk: Blk,
    ) -> Result<AlignedBuf, StoreError> {
        let buf = self
            .dev
            .read_blocks(blk.pblock, 1)
            .map_err(|e| StoreError::io("device read", e))?;
        verify(oid, lb, blk, buf.as_slice())?;
        Ok(buf)
    }
}

fn verify(oid: &ObjectId, lb: u64, blk: Blk, block: &[u8]) -> Result<(), StoreError> {
    let got = crc32c::crc32c(block);
    if got == blk.crc {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        pool: oid.pool,
        name: String::from_utf8_lossy(&oid.name).into_owned(),
        offset: lb * BS,
        detail: format!(
            "checksum mismatch in device block {} (crc32c {got:#010x}, expected {:#010x})",
            blk.pblock, blk.crc
        ),
    })
}

impl ObjectStore for ObjStore {
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError> {
        let ops: Vec<TxOpRef<'_>> = tx.ops.iter().map(TxOp::view).collect();
        self.submit_ops(&ops, tx.encoded_len())
    }

    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        self.check_name(&oid.name)?;
        let inner = &*self.inner;
        let _g = inner.reader();
        let r = inner.db.begin_read()?;
        let on = inner.onode(&r.open_table(OBJECTS)?, oid)?;
        drop(r);
        if offset >= on.size || len == 0 {
            return Ok(Vec::new());
        }
        let end = on.size.min(offset.saturating_add(len));
        let first = offset / BS;
        let last = (end - 1) / BS;
        let n = (last - first + 1) as usize;
        let mut buf = inner.pool.get(n * BLOCK_SIZE);
        // Holes read as zeros.
        let mut next = first;
        for lb in on
            .blocks
            .range(first..=last)
            .map(|(&l, _)| l)
            .chain([last + 1])
        {
            buf.as_mut_slice()
                [((next - first) as usize) * BLOCK_SIZE..((lb - first) as usize) * BLOCK_SIZE]
                .fill(0);
            next = lb + 1;
        }
        let mut ops: Vec<IoOp> = Vec::new();
        let mut prev: Option<(u64, u64)> = None;
        for (&lb, blk) in on.blocks.range(first..=last) {
            let i = (lb - first) as usize;
            match (prev, ops.last_mut()) {
                (Some((pl, pp)), Some(op)) if pl + 1 == lb && pp + 1 == blk.pblock => {
                    op.len += BLOCK_SIZE
                }
                _ => ops.push(IoOp {
                    write: false,
                    // SAFETY: `i < n`, inside `buf`.
                    ptr: unsafe { buf.as_mut_ptr().add(i * BLOCK_SIZE) },
                    len: BLOCK_SIZE,
                    offset: blk.pblock * BS,
                }),
            }
            prev = Some((lb, blk.pblock));
        }
        // SAFETY: the ops cover disjoint block ranges of `buf`, which outlives the call and is
        // not otherwise accessed during it.
        unsafe { inner.dev.run(&ops) }.map_err(|e| StoreError::io("device read", e))?;
        let data = buf.as_slice();
        for (&lb, &blk) in on.blocks.range(first..=last) {
            let i = (lb - first) as usize;
            verify(oid, lb, blk, &data[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE])?;
        }
        let start = (offset - first * BS) as usize;
        let out = data[start..start + (end - offset) as usize].to_vec();
        inner.pool.put(buf);
        Ok(out)
    }

    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        let on = self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        Ok(ObjStat {
            size: on.size,
            mtime_ns: on.mtime_ns,
        })
    }

    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        match r
            .open_table(XATTRS)?
            .get(sub_key(&prefix, name).as_slice())?
        {
            Some(v) => Ok(v.value().to_vec()),
            None => Err(StoreError::NotFound(format!(
                "xattr {} of {oid}",
                String::from_utf8_lossy(name)
            ))),
        }
    }

    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError> {
        self.omap_like(XATTRS, oid, None, usize::MAX)
    }

    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        let omap = r.open_table(OMAP)?;
        keys.iter()
            .map(|k| {
                Ok(omap
                    .get(sub_key(&prefix, k).as_slice())?
                    .map(|v| v.value().to_vec()))
            })
            .collect()
    }

    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        self.omap_like(OMAP, oid, start_after, max)
    }

    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let r = self.inner.db.begin_read()?;
        let objects = r.open_table(OBJECTS)?;
        let from = sub_key(&pool.to_be_bytes(), start_after.unwrap_or_default());
        let lower = match start_after {
            Some(_) => Bound::Excluded(from.as_slice()),
            None => Bound::Included(from.as_slice()),
        };
        let mut out = Vec::new();
        for e in objects.range::<&[u8]>((lower, Bound::Unbounded))? {
            if out.len() >= max {
                break;
            }
            let (k, _) = e?;
            let k = k.value();
            if k[..8] != pool.to_be_bytes() {
                break;
            }
            out.push(k[8..].to_vec());
        }
        Ok(out)
    }

    fn statfs(&self) -> Result<StoreStats, StoreError> {
        let inner = &*self.inner;
        Ok(StoreStats {
            device_bytes: inner.nblocks * BS,
            block_size: BS,
            data_bytes: (inner.nblocks - 1) * BS,
            allocated_bytes: (inner.allocated.load(Ordering::Acquire) - 1) * BS,
            objects: inner.objects.load(Ordering::Acquire),
        })
    }
}

impl ObjStore {
    /// Rows of `table` under the object's prefix after `start_after` (the object must exist).
    fn omap_like(
        &self,
        table: redb::TableDefinition<&'static [u8], &'static [u8]>,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        self.check_name(&oid.name)?;
        let r = self.inner.db.begin_read()?;
        self.inner.onode(&r.open_table(OBJECTS)?, oid)?;
        let prefix = sub_prefix_of_key(&obj_key(oid));
        let from = sub_key(&prefix, start_after.unwrap_or_default());
        let lower = match start_after {
            Some(_) => Bound::Excluded(from.as_slice()),
            None => Bound::Included(from.as_slice()),
        };
        let t = r.open_table(table)?;
        let mut out = Vec::new();
        for e in t.range::<&[u8]>((lower, Bound::Unbounded))? {
            if out.len() >= max {
                break;
            }
            let (k, v) = e?;
            let Some(sub) = k.value().strip_prefix(prefix.as_slice()) else {
                break;
            };
            out.push((sub.to_vec(), v.value().to_vec()));
        }
        Ok(out)
    }
}
