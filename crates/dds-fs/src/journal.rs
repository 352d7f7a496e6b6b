//! Durable metadata commits: log appends and checkpoints (docs/on-disk-format.md §5).

use crate::align::{align_up, AlignedBuf};
use crate::device::MetaIo;
use crate::error::FsError;
use crate::layout::Geometry;
use crate::meta::{MetaState, Record};

/// Where the next record goes and which checkpoint slot is current.
pub(crate) struct Journal {
    /// Checkpoint slot (0/1) holding the newest checkpoint.
    pub active: usize,
    /// Generation of that checkpoint.
    pub generation: u64,
    /// Sequence number of the last durable record (or the checkpoint's `last_seq`).
    pub seq: u64,
    /// Next record position, relative to the log start.
    pub pos: u64,
    /// Encoding buffer (aligned), large enough for a checkpoint or the largest record.
    buf: AlignedBuf,
}

impl Journal {
    pub(crate) fn new(
        g: &Geometry,
        align: usize,
        active: usize,
        generation: u64,
        seq: u64,
        pos: u64,
    ) -> Journal {
        let b = u64::from(g.block_size);
        let len = g.ckpt_len.max(align_up(g.max_record_len(), b));
        Journal {
            active,
            generation,
            seq,
            pos,
            buf: AlignedBuf::new(len as usize, align),
        }
    }

    /// Makes `rec` durable (checkpointing first if the log is full). The in-memory state is
    /// not modified.
    pub(crate) fn append(
        &mut self,
        dev: &mut dyn MetaIo,
        g: &Geometry,
        st: &MetaState,
        rec: &Record<'_>,
    ) -> Result<(), FsError> {
        let b = u64::from(g.block_size);
        let len = rec.encoded_len();
        let padded = align_up(len as u64, b);
        assert!(padded <= g.log_len, "record larger than the log");
        if self.pos + padded > g.log_len {
            self.checkpoint(dev, g, st)?;
        }
        let buf = self.buf.as_mut_slice();
        let n = rec.encode(g.fs_uuid, self.seq + 1, buf);
        buf[n..padded as usize].fill(0);
        dev.write_sync(g.log_off + self.pos, &buf[..padded as usize])
            .map_err(|e| FsError::io("metadata log write", e))?;
        dev.sync()
            .map_err(|e| FsError::io("metadata log sync", e))?;
        self.pos += padded;
        self.seq += 1;
        Ok(())
    }

    /// Writes a checkpoint of `st` into the other slot and restarts the log.
    pub(crate) fn checkpoint(
        &mut self,
        dev: &mut dyn MetaIo,
        g: &Geometry,
        st: &MetaState,
    ) -> Result<(), FsError> {
        let b = u64::from(g.block_size);
        let slot = 1 - self.active;
        let buf = self.buf.as_mut_slice();
        let n = st.encode_checkpoint(g.fs_uuid, self.generation + 1, self.seq, buf);
        let padded = align_up(n as u64, b) as usize;
        debug_assert!(padded as u64 <= g.ckpt_len);
        buf[n..padded].fill(0);
        dev.write_sync(g.ckpt_off[slot], &buf[..padded])
            .map_err(|e| FsError::io("checkpoint write", e))?;
        dev.sync().map_err(|e| FsError::io("checkpoint sync", e))?;
        self.active = slot;
        self.generation += 1;
        self.pos = 0;
        tracing::debug!(
            generation = self.generation,
            seq = self.seq,
            "metadata checkpoint"
        );
        Ok(())
    }
}
