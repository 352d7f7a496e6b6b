//! The submitting side, run in the caller's thread: a transaction is checked against the
//! store's limits, its write data copied into pooled aligned buffers and summed per block
//! ([`Staged`]), and the validated ops ([`POp`]) queued for the committer with a completion that
//! answers exactly once ([`submit_with`](ObjStore::submit_with) and the waiting variants).

use super::{failed, stopped, ObjStore, BS};
use crate::error::StoreError;
use crate::pool::BufPool;
use crate::tx::{ObjectId, Transaction, TxOp, TxOpRef};
use crate::BLOCK_SIZE;
use dds_sys::AlignedBuf;
use std::sync::atomic::Ordering;

/// Data of one write, staged by the submitter in an aligned buffer laid out by logical block,
/// with the crc32c of each block (edge blocks are completed and re-summed by the committer).
pub(super) struct Staged {
    pub(super) buf: AlignedBuf,
    pub(super) first: u64,
    pub(super) head: usize,
    pub(super) len: usize,
    pub(super) crcs: Vec<u32>,
}

impl Staged {
    /// One pass over `data`: copy a block into a pooled staging buffer, zero what the data
    /// does not cover, then sum the block while it is hot.
    fn new(pool: &BufPool, offset: u64, data: &[u8]) -> Staged {
        let head = (offset % BS) as usize;
        let n = if data.is_empty() {
            0
        } else {
            (head + data.len()).div_ceil(BLOCK_SIZE)
        };
        let mut buf = pool.get(n * BLOCK_SIZE);
        let mut crcs = Vec::with_capacity(n);
        let dst = buf.as_mut_slice();
        let mut src = data;
        for i in 0..n {
            let block = &mut dst[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            let at = if i == 0 { head } else { 0 };
            let take = (BLOCK_SIZE - at).min(src.len());
            block[..at].fill(0);
            block[at..at + take].copy_from_slice(&src[..take]);
            block[at + take..].fill(0);
            src = &src[take..];
            crcs.push(crc32c::crc32c(block));
        }
        Staged {
            buf,
            first: offset / BS,
            head,
            len: data.len(),
            crcs,
        }
    }

    pub(super) fn nblocks(&self) -> usize {
        self.crcs.len()
    }

    pub(super) fn block_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]
    }

    pub(super) fn resum(&mut self, i: usize) {
        self.crcs[i] = crc32c::crc32c(&self.buf.as_slice()[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE]);
    }
}

/// A validated op, its data staged.
pub(super) enum POp {
    Touch(ObjectId),
    WriteFull(ObjectId, Staged),
    Write(ObjectId, u64, Staged),
    Truncate(ObjectId, u64),
    Remove(ObjectId),
    SetXattr(ObjectId, Vec<u8>, Vec<u8>),
    RmXattr(ObjectId, Vec<u8>),
    OmapSet(ObjectId, Vec<(Vec<u8>, Vec<u8>)>),
    OmapRm(ObjectId, Vec<Vec<u8>>),
    OmapClear(ObjectId),
}

/// Called with a transaction's result once it is durable (or failed).
pub type OnCommit = Box<dyn FnOnce(Result<(), StoreError>) + Send + 'static>;

/// Calls its callback exactly once: with the result, or, if dropped unanswered (the committer
/// stopped), with an error.
pub(super) struct Completion(Option<OnCommit>);

impl Completion {
    pub(super) fn complete(mut self, r: Result<(), StoreError>) {
        if let Some(f) = self.0.take() {
            f(r)
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Err(stopped()))
        }
    }
}

pub(super) struct Request {
    pub(super) ops: Vec<POp>,
    pub(super) bytes: usize,
    pub(super) done: Completion,
}

impl ObjStore {
    pub(super) fn check_name(&self, name: &[u8]) -> Result<(), StoreError> {
        if name.is_empty() || name.len() > self.inner.opts.max_name_len {
            return Err(StoreError::invalid(format!(
                "object name of {} bytes (1 ..= {} allowed)",
                name.len(),
                self.inner.opts.max_name_len
            )));
        }
        Ok(())
    }

    fn validate(&self, ops: &[TxOpRef<'_>], len: usize) -> Result<(), StoreError> {
        let o = &self.inner.opts;
        if ops.len() > o.max_ops {
            return Err(StoreError::invalid(format!(
                "{} ops in a transaction (limit {})",
                ops.len(),
                o.max_ops
            )));
        }
        if len > o.max_tx_bytes {
            return Err(StoreError::invalid(format!(
                "transaction of {len} bytes (limit {})",
                o.max_tx_bytes
            )));
        }
        let limit = |what: &str, v: &[u8], min: usize, max: usize| {
            if v.len() < min || v.len() > max {
                Err(StoreError::invalid(format!(
                    "{what} of {} bytes ({min} ..= {max} allowed)",
                    v.len()
                )))
            } else {
                Ok(())
            }
        };
        let extent = |offset: u64, len: usize| match offset.checked_add(len as u64) {
            Some(end) if end <= o.max_object_size => Ok(()),
            _ => Err(StoreError::invalid(format!(
                "{len} bytes at offset {offset} exceed the object size limit {}",
                o.max_object_size
            ))),
        };
        for op in ops {
            self.check_name(op.oid().name)?;
            match op {
                TxOpRef::Touch { .. } | TxOpRef::Remove { .. } | TxOpRef::OmapClear { .. } => {}
                TxOpRef::WriteFull { data, .. } => extent(0, data.len())?,
                TxOpRef::Write { offset, data, .. } => extent(*offset, data.len())?,
                TxOpRef::Truncate { size, .. } => extent(*size, 0)?,
                TxOpRef::SetXattr { name, value, .. } => {
                    limit("xattr name", name, 1, o.max_xattr_name_len)?;
                    limit("xattr value", value, 0, o.max_xattr_value_len)?;
                }
                TxOpRef::RmXattr { name, .. } => {
                    limit("xattr name", name, 1, o.max_xattr_name_len)?
                }
                TxOpRef::OmapSet { entries, .. } => {
                    for (k, v) in entries {
                        limit("omap key", k, 0, o.max_omap_key_len)?;
                        limit("omap value", v, 0, o.max_omap_value_len)?;
                    }
                }
                TxOpRef::OmapRm { keys, .. } => {
                    for k in keys {
                        limit("omap key", k, 0, o.max_omap_key_len)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn prepare(pool: &BufPool, op: &TxOpRef<'_>) -> POp {
    let oid = op.oid().to_owned();
    match op {
        TxOpRef::Touch { .. } => POp::Touch(oid),
        TxOpRef::WriteFull { data, .. } => POp::WriteFull(oid, Staged::new(pool, 0, data)),
        TxOpRef::Write { offset, data, .. } => {
            POp::Write(oid, *offset, Staged::new(pool, *offset, data))
        }
        TxOpRef::Truncate { size, .. } => POp::Truncate(oid, *size),
        TxOpRef::Remove { .. } => POp::Remove(oid),
        TxOpRef::SetXattr { name, value, .. } => POp::SetXattr(oid, name.to_vec(), value.to_vec()),
        TxOpRef::RmXattr { name, .. } => POp::RmXattr(oid, name.to_vec()),
        TxOpRef::OmapSet { entries, .. } => POp::OmapSet(
            oid,
            entries
                .iter()
                .map(|(k, v)| (k.to_vec(), v.to_vec()))
                .collect(),
        ),
        TxOpRef::OmapRm { keys, .. } => POp::OmapRm(oid, keys.iter().map(|k| k.to_vec()).collect()),
        TxOpRef::OmapClear { .. } => POp::OmapClear(oid),
    }
}

impl ObjStore {
    /// Applies an encoded transaction (the format of [`Transaction::encode`]) as
    /// [`submit`](ObjectStore::submit) does, taking its data straight from `buf` into the
    /// staging buffers (no decoded copy). A malformed encoding is `InvalidArgument`.
    pub fn submit_encoded(&self, buf: &[u8]) -> Result<(), StoreError> {
        let ops = self.decode_checked(buf)?;
        self.submit_ops(&ops, buf.len())
    }

    /// Queues a transaction and returns without waiting for it: `on_commit` gets its result
    /// once it is durable (or has failed), exactly once, on the committer thread, in submission
    /// order — so it must be quick (send a message, wake a thread). A transaction that breaks a
    /// limit is refused here with `InvalidArgument` and `on_commit` is not called. Blocks only
    /// while the queue (`queue_depth`) is full.
    pub fn submit_with(
        &self,
        tx: &Transaction,
        on_commit: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let ops: Vec<TxOpRef<'_>> = tx.ops.iter().map(TxOp::view).collect();
        self.enqueue(&ops, tx.encoded_len(), Box::new(on_commit))
    }

    /// [`submit_encoded`](Self::submit_encoded) without waiting, as
    /// [`submit_with`](Self::submit_with).
    pub fn submit_encoded_with(
        &self,
        buf: &[u8],
        on_commit: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Result<(), StoreError> {
        let ops = self.decode_checked(buf)?;
        self.enqueue(&ops, buf.len(), Box::new(on_commit))
    }

    fn decode_checked<'a>(&self, buf: &'a [u8]) -> Result<Vec<TxOpRef<'a>>, StoreError> {
        if buf.len() > self.inner.opts.max_tx_bytes {
            return Err(StoreError::invalid(format!(
                "transaction of {} bytes (limit {})",
                buf.len(),
                self.inner.opts.max_tx_bytes
            )));
        }
        Transaction::decode_ops(buf)
            .map_err(|e| StoreError::invalid(format!("transaction encoding: {e}")))
    }

    /// Validates, stages and queues; the result goes to `done` unless this returns `Err`.
    fn enqueue(
        &self,
        ops: &[TxOpRef<'_>],
        encoded_len: usize,
        done: OnCommit,
    ) -> Result<(), StoreError> {
        if self.inner.failed.load(Ordering::Acquire) {
            return Err(failed());
        }
        self.validate(ops, encoded_len)?;
        let ops: Vec<POp> = ops.iter().map(|op| prepare(&self.inner.pool, op)).collect();
        let bytes = ops
            .iter()
            .map(|op| match op {
                POp::WriteFull(_, s) | POp::Write(_, _, s) => s.buf.len(),
                _ => 0,
            })
            .sum();
        let queue = self
            .queue
            .as_ref()
            .expect("the queue lives as long as the store");
        // If the committer is gone, the returned request drops and its completion reports it.
        let _ = queue.send(Request {
            ops,
            bytes,
            done: Completion(Some(done)),
        });
        Ok(())
    }

    /// Queues and waits.
    pub(super) fn submit_ops(
        &self,
        ops: &[TxOpRef<'_>],
        encoded_len: usize,
    ) -> Result<(), StoreError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.enqueue(
            ops,
            encoded_len,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )?;
        rx.recv().unwrap_or_else(|_| Err(stopped()))
    }
}
