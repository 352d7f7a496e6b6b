//! The committer thread (group commit): takes queued transactions in batches, applies each on
//! top of the batch so far (copy-on-write block placement, xattr and omap changes), writes the
//! staged data and syncs the device, then commits the block maps, allocation bitmap and object
//! count in one redb write transaction and answers every submitter.

use super::staging::{POp, Request, Staged};
use super::{failed, not_found, now_ns, stopped, Inner, BS};
use crate::alloc::Allocator;
use crate::device::IoOp;
use crate::error::StoreError;
use crate::meta::{
    obj_key, sub_key, sub_prefix_of_key, Blk, Onode, BITMAP, OBJECTS, OMAP, STATE, XATTRS,
};
use crate::tx::ObjectId;
use crate::BLOCK_SIZE;
use crossbeam_channel::Receiver;
use dds_sys::AlignedBuf;
use redb::{ReadableTable, Table};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// An object's state while a batch is built: the onode (`None` = absent) and the changes to
/// its xattrs and omap rows (`None` = remove), after clearing the stored rows if `*_cleared`.
#[derive(Clone, Default)]
pub(super) struct ObjState {
    existed: bool,
    onode: Option<Onode>,
    xattrs_cleared: bool,
    xattrs: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    omap_cleared: bool,
    omap: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

/// A device write: blocks of a staging buffer to consecutive device blocks.
pub(super) struct Wr {
    buf: usize,
    off: usize,
    pblock: u64,
    n: u64,
}

/// What a transaction (or, merged, a batch) changes.
#[derive(Default)]
pub(super) struct Changes {
    objs: HashMap<Vec<u8>, ObjState>,
    writes: Vec<Wr>,
    /// Blocks allocated by this batch whose data sits in a staging buffer: (buffer, offset).
    inflight: HashMap<u64, (usize, usize)>,
    allocs: Vec<(u64, u64)>,
    frees: Vec<u64>,
}

impl Changes {
    fn merge(&mut self, t: Changes) {
        self.objs.extend(t.objs);
        self.writes.extend(t.writes);
        self.inflight.extend(t.inflight);
        self.allocs.extend(t.allocs);
        self.frees.extend(t.frees);
    }
}

pub(super) struct Tables<'t> {
    objects: Table<'t, &'static [u8], &'static [u8]>,
    xattrs: Table<'t, &'static [u8], &'static [u8]>,
    omap: Table<'t, &'static [u8], &'static [u8]>,
}

pub(super) struct Committer {
    pub(super) inner: Arc<Inner>,
    pub(super) alloc: Allocator,
    /// Blocks freed by the commit of an epoch, waiting for older readers.
    pub(super) quarantine: VecDeque<(u64, Vec<u64>)>,
    pub(super) objects: u64,
}

/// One transaction being applied on top of a batch.
pub(super) struct TxApply<'a, 't> {
    inner: &'a Inner,
    alloc: &'a mut Allocator,
    tables: &'a Tables<'t>,
    batch: &'a Changes,
    bufs: &'a mut Vec<AlignedBuf>,
    t: Changes,
    now: u64,
}

impl TxApply<'_, '_> {
    /// The object's state, taken out of the transaction's changes (put it back with `put`).
    fn take(&mut self, oid: &ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        let key = obj_key(oid);
        if let Some(s) = self.t.objs.remove(&key) {
            return Ok((key, s));
        }
        if let Some(s) = self.batch.objs.get(&key) {
            return Ok((key, s.clone()));
        }
        let onode = match self.tables.objects.get(key.as_slice())? {
            Some(v) => Some(self.inner.decode_onode(oid, v.value())?),
            None => None,
        };
        let s = ObjState {
            existed: onode.is_some(),
            onode,
            ..ObjState::default()
        };
        Ok((key, s))
    }

    /// The content of a mapped block: from a staging buffer of this batch, or from the device
    /// (verified).
    fn old_block(&self, oid: &ObjectId, lb: u64, blk: Blk) -> Result<AlignedBuf, StoreError> {
        let staged = self
            .t
            .inflight
            .get(&blk.pblock)
            .or_else(|| self.batch.inflight.get(&blk.pblock));
        if let Some(&(bi, off)) = staged {
            let mut b = AlignedBuf::new(BLOCK_SIZE, BLOCK_SIZE);
            b.as_mut_slice()
                .copy_from_slice(&self.bufs[bi].as_slice()[off..off + BLOCK_SIZE]);
            return Ok(b);
        }
        self.inner.read_verified(oid, lb, blk)
    }

    /// Maps `crcs.len()` logical blocks from `first` to new device blocks holding `buf`.
    fn place(
        &mut self,
        on: &mut Onode,
        first: u64,
        buf: AlignedBuf,
        crcs: &[u32],
    ) -> Result<(), StoreError> {
        let n = crcs.len() as u64;
        let extents = self
            .alloc
            .allocate(n)
            .map_err(|free| StoreError::NoSpace { needed: n, free })?;
        self.t.allocs.extend_from_slice(&extents);
        let bi = self.bufs.len();
        let mut i = 0usize;
        for (start, cnt) in extents {
            self.t.writes.push(Wr {
                buf: bi,
                off: i * BLOCK_SIZE,
                pblock: start,
                n: cnt,
            });
            for pb in start..start + cnt {
                self.t.inflight.insert(pb, (bi, i * BLOCK_SIZE));
                let new = Blk {
                    pblock: pb,
                    crc: crcs[i],
                };
                if let Some(old) = on.blocks.insert(first + i as u64, new) {
                    self.t.frees.push(old.pblock);
                }
                i += 1;
            }
        }
        self.bufs.push(buf);
        Ok(())
    }

    fn write(
        &mut self,
        oid: &ObjectId,
        on: &mut Onode,
        offset: u64,
        mut st: Staged,
    ) -> Result<(), StoreError> {
        let n = st.nblocks();
        if n == 0 {
            return Ok(());
        }
        let end = offset + st.len as u64;
        let (first, last) = (st.first, st.first + n as u64 - 1);
        // Edge blocks keep the old bytes the write does not cover (bytes past the old size
        // are zero in both).
        if st.head != 0 {
            if let Some(&blk) = on.blocks.get(&first) {
                let old = self.old_block(oid, first, blk)?;
                let head = st.head;
                st.block_mut(0)[..head].copy_from_slice(&old.as_slice()[..head]);
                st.resum(0);
            }
        }
        let tail = (end - last * BS) as usize;
        if tail < BLOCK_SIZE && on.size > end {
            if let Some(&blk) = on.blocks.get(&last) {
                let old = self.old_block(oid, last, blk)?;
                st.block_mut(n - 1)[tail..].copy_from_slice(&old.as_slice()[tail..]);
                st.resum(n - 1);
            }
        }
        let Staged { buf, crcs, .. } = st;
        self.place(on, first, buf, &crcs)?;
        on.size = on.size.max(end);
        Ok(())
    }

    fn truncate(&mut self, oid: &ObjectId, on: &mut Onode, size: u64) -> Result<(), StoreError> {
        if size < on.size {
            let keep = size.div_ceil(BS);
            let dropped: Vec<u64> = on.blocks.range(keep..).map(|(&l, _)| l).collect();
            for lb in dropped {
                let blk = on.blocks.remove(&lb).expect("listed above");
                self.t.frees.push(blk.pblock);
            }
            let within = (size % BS) as usize;
            let lb = size / BS;
            if within != 0 {
                if let Some(&blk) = on.blocks.get(&lb) {
                    let mut b = self.old_block(oid, lb, blk)?;
                    b.as_mut_slice()[within..].fill(0);
                    let crc = crc32c::crc32c(b.as_slice());
                    self.place(on, lb, b, &[crc])?;
                }
            }
        }
        on.size = size;
        Ok(())
    }

    fn xattr_exists(&self, key: &[u8], s: &ObjState, name: &[u8]) -> Result<bool, StoreError> {
        if let Some(v) = s.xattrs.get(name) {
            return Ok(v.is_some());
        }
        if s.xattrs_cleared {
            return Ok(false);
        }
        let k = sub_key(&sub_prefix_of_key(key), name);
        Ok(self.tables.xattrs.get(k.as_slice())?.is_some())
    }

    fn apply(&mut self, op: POp) -> Result<(), StoreError> {
        let oid = match &op {
            POp::Touch(o)
            | POp::WriteFull(o, _)
            | POp::Write(o, _, _)
            | POp::Truncate(o, _)
            | POp::Remove(o)
            | POp::SetXattr(o, _, _)
            | POp::RmXattr(o, _)
            | POp::OmapSet(o, _)
            | POp::OmapRm(o, _)
            | POp::OmapClear(o) => o.clone(),
        };
        let (key, mut s) = self.take(&oid)?;
        let creates = matches!(
            op,
            POp::Touch(_)
                | POp::WriteFull(..)
                | POp::Write(..)
                | POp::SetXattr(..)
                | POp::OmapSet(..)
        );
        let mut on = match s.onode.take() {
            Some(on) => on,
            None if creates => Onode::default(),
            None => return Err(not_found(&oid)),
        };
        on.mtime_ns = self.now;
        let mut keep = true;
        match op {
            POp::Touch(_) => {}
            POp::WriteFull(_, st) => {
                self.t.frees.extend(on.blocks.values().map(|b| b.pblock));
                on.blocks.clear();
                on.size = 0;
                let len = st.len as u64;
                self.write(&oid, &mut on, 0, st)?;
                on.size = len;
            }
            POp::Write(_, offset, st) => self.write(&oid, &mut on, offset, st)?,
            POp::Truncate(_, size) => self.truncate(&oid, &mut on, size)?,
            POp::Remove(_) => {
                self.t.frees.extend(on.blocks.values().map(|b| b.pblock));
                keep = false;
                s.xattrs_cleared = true;
                s.xattrs.clear();
                s.omap_cleared = true;
                s.omap.clear();
            }
            POp::SetXattr(_, name, value) => {
                s.xattrs.insert(name, Some(value));
            }
            POp::RmXattr(_, name) => {
                if !self.xattr_exists(&key, &s, &name)? {
                    return Err(StoreError::NotFound(format!(
                        "xattr {} of {oid}",
                        String::from_utf8_lossy(&name)
                    )));
                }
                s.xattrs.insert(name, None);
            }
            POp::OmapSet(_, entries) => {
                for (k, v) in entries {
                    s.omap.insert(k, Some(v));
                }
            }
            POp::OmapRm(_, keys) => {
                for k in keys {
                    s.omap.insert(k, None);
                }
            }
            POp::OmapClear(_) => {
                s.omap_cleared = true;
                s.omap.clear();
            }
        }
        s.onode = keep.then_some(on);
        self.t.objs.insert(key, s);
        Ok(())
    }
}

fn remove_prefix(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<(), StoreError> {
    let mut keys = Vec::new();
    for e in table.range::<&[u8]>(prefix..)? {
        let (k, _) = e?;
        if !k.value().starts_with(prefix) {
            break;
        }
        keys.push(k.value().to_vec());
    }
    for k in keys {
        table.remove(k.as_slice())?;
    }
    Ok(())
}

fn write_rows(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    prefix: &[u8],
    cleared: bool,
    rows: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> Result<(), StoreError> {
    if cleared {
        remove_prefix(table, prefix)?;
    }
    for (k, v) in rows {
        let k = sub_key(prefix, k);
        match v {
            Some(v) => {
                table.insert(k.as_slice(), v.as_slice())?;
            }
            None => {
                table.remove(k.as_slice())?;
            }
        }
    }
    Ok(())
}

impl Committer {
    pub(super) fn run(&mut self, rx: Receiver<Request>) {
        let o = self.inner.opts.clone();
        while let Ok(first) = rx.recv() {
            let mut bytes = first.bytes;
            let mut batch = vec![first];
            while batch.len() < o.max_batch_txs && bytes < o.max_batch_bytes {
                match rx.try_recv() {
                    Ok(r) => {
                        bytes += r.bytes;
                        batch.push(r);
                    }
                    Err(_) => break,
                }
            }
            self.commit_batch(batch);
        }
    }

    fn release_quarantine(&mut self) {
        let oldest_reader = self.inner.oldest_reader();
        while let Some((e, _)) = self.quarantine.front() {
            if *e >= oldest_reader {
                break;
            }
            let (_, blocks) = self.quarantine.pop_front().expect("front exists");
            self.alloc.unquarantine(&blocks);
        }
    }

    fn commit_batch(&mut self, batch: Vec<Request>) {
        self.release_quarantine();
        let mut dones = Vec::with_capacity(batch.len());
        let mut txs = Vec::with_capacity(batch.len());
        for r in batch {
            dones.push(r.done);
            txs.push(r.ops);
        }
        let mut results = Vec::with_capacity(txs.len());
        let outcome = if self.inner.failed.load(Ordering::Acquire) {
            Err(failed())
        } else {
            self.try_batch(txs, &mut results)
        };
        for (i, done) in dones.into_iter().enumerate() {
            let r = match (&outcome, results.get_mut(i)) {
                (_, Some(r @ Err(_))) => std::mem::replace(r, Ok(())),
                (Err(e), _) => Err(e.duplicate()),
                (Ok(()), Some(_)) => Ok(()),
                (Ok(()), None) => Err(stopped()),
            };
            done.complete(r);
        }
    }

    fn try_batch(
        &mut self,
        txs: Vec<Vec<POp>>,
        results: &mut Vec<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        let inner = self.inner.clone();
        let w = inner.db.begin_write()?;
        let mut tables = Tables {
            objects: w.open_table(OBJECTS)?,
            xattrs: w.open_table(XATTRS)?,
            omap: w.open_table(OMAP)?,
        };
        let mut batch = Changes::default();
        let mut bufs = Vec::new();
        for ops in txs {
            let mut a = TxApply {
                inner: &inner,
                alloc: &mut self.alloc,
                tables: &tables,
                batch: &batch,
                bufs: &mut bufs,
                t: Changes::default(),
                now: now_ns(),
            };
            let r = ops.into_iter().try_for_each(|op| a.apply(op));
            let t = std::mem::take(&mut a.t);
            match r {
                Ok(()) => batch.merge(t),
                Err(_) => self.alloc.release_now(&t.allocs),
            }
            results.push(r);
        }
        if batch.objs.is_empty() {
            drop(tables);
            w.abort()?;
            return Ok(());
        }
        if let Err(e) = self.write_data(&batch, &bufs) {
            self.alloc.release_now(&batch.allocs);
            return Err(e);
        }
        for b in bufs {
            inner.pool.put(b);
        }
        // From here on a failure leaves memory and disk apart: the store stops accepting
        // transactions until it is reopened.
        let r = self.write_meta(&w, &mut tables, &batch);
        drop(tables);
        let r = r.and_then(|()| w.commit().map_err(StoreError::from));
        if let Err(e) = r {
            inner.failed.store(true, Ordering::Release);
            return Err(e);
        }
        let epoch = {
            let mut ep = inner.epochs.lock().unwrap_or_else(|p| p.into_inner());
            ep.current += 1;
            ep.current - 1
        };
        self.quarantine.push_back((epoch, batch.frees));
        inner
            .allocated
            .store(self.alloc.allocated(), Ordering::Release);
        inner.objects.store(self.objects, Ordering::Release);
        Ok(())
    }

    /// Writes the batch's data to its new blocks and syncs the device.
    fn write_data(&self, batch: &Changes, bufs: &[AlignedBuf]) -> Result<(), StoreError> {
        if batch.writes.is_empty() {
            return Ok(());
        }
        let ops: Vec<IoOp> = batch
            .writes
            .iter()
            .map(|w| IoOp {
                write: true,
                // SAFETY: `off + n blocks` lies inside the buffer (placed by `place`).
                ptr: unsafe { bufs[w.buf].as_mut_ptr().add(w.off) },
                len: w.n as usize * BLOCK_SIZE,
                offset: w.pblock * BS,
            })
            .collect();
        // SAFETY: the buffers outlive the call; the kernel only reads them.
        unsafe { self.inner.dev.run(&ops) }.map_err(|e| StoreError::io("device write", e))?;
        self.inner
            .dev
            .sync()
            .map_err(|e| StoreError::io("device fdatasync", e))
    }

    fn write_meta(
        &mut self,
        w: &redb::WriteTransaction,
        tables: &mut Tables<'_>,
        batch: &Changes,
    ) -> Result<(), StoreError> {
        let mut objects = self.objects;
        for (key, s) in &batch.objs {
            let prefix = sub_prefix_of_key(key);
            write_rows(&mut tables.xattrs, &prefix, s.xattrs_cleared, &s.xattrs)?;
            write_rows(&mut tables.omap, &prefix, s.omap_cleared, &s.omap)?;
            match &s.onode {
                Some(on) => {
                    tables
                        .objects
                        .insert(key.as_slice(), on.encode().as_slice())?;
                }
                None => {
                    tables.objects.remove(key.as_slice())?;
                }
            }
            match (s.existed, s.onode.is_some()) {
                (false, true) => objects += 1,
                (true, false) => objects -= 1,
                _ => {}
            }
        }
        self.alloc
            .free_committed(&batch.frees)
            .map_err(|b| StoreError::Corrupt {
                pool: 0,
                name: "allocation bitmap".into(),
                offset: b * BS,
                detail: format!("block {b} freed but not allocated (mapped twice?)"),
            })?;
        let mut bitmap = w.open_table(BITMAP)?;
        for (i, chunk) in self.alloc.take_dirty() {
            bitmap.insert(i, chunk.as_slice())?;
        }
        let mut state = w.open_table(STATE)?;
        state.insert("objects", objects.to_le_bytes().as_slice())?;
        self.objects = objects;
        Ok(())
    }
}
