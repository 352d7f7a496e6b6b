//! The checkpoint file (`docs/kv-service.md` §3): two 512-byte slots written alternately.

use anyhow::Result;

use dds_storage::StoreFile;

const MAGIC: &[u8; 8] = b"DKVCKPT1";
/// Bytes of a slot.
pub const SLOT: usize = 512;

/// What recovery starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// First live log address.
    pub begin: u64,
    /// Durable end of the log when it was written.
    pub flushed: u64,
    /// Page bytes.
    pub page_size: u64,
    /// Log file bytes.
    pub capacity: u64,
    /// Last record sequence number.
    pub seq: u64,
}

/// The checkpoint file.
pub struct CheckpointFile {
    file: Box<dyn StoreFile>,
    /// Sequence of the newest valid slot, and its slot.
    newest: Option<(u64, usize, Checkpoint)>,
}

fn encode(c: &Checkpoint, ckseq: u64) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&ckseq.to_le_bytes());
    b[16..24].copy_from_slice(&c.begin.to_le_bytes());
    b[24..32].copy_from_slice(&c.flushed.to_le_bytes());
    b[32..40].copy_from_slice(&c.page_size.to_le_bytes());
    b[40..48].copy_from_slice(&c.capacity.to_le_bytes());
    b[48..56].copy_from_slice(&c.seq.to_le_bytes());
    let crc = crc32c::crc32c(&b[..56]);
    b[56..60].copy_from_slice(&crc.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(u64, Checkpoint)> {
    let u = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
    if b.len() < 60 || &b[0..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[56..60].try_into().expect("4"));
    if crc32c::crc32c(&b[..56]) != crc {
        return None;
    }
    Some((
        u(8),
        Checkpoint {
            begin: u(16),
            flushed: u(24),
            page_size: u(32),
            capacity: u(40),
            seq: u(48),
        },
    ))
}

impl CheckpointFile {
    /// Reads both slots.
    pub fn open(file: Box<dyn StoreFile>) -> Result<CheckpointFile> {
        let mut b = vec![0u8; 2 * SLOT];
        let n = file.read_at(0, &mut b)?;
        b[n..].fill(0);
        let newest = (0..2)
            .filter_map(|i| decode(&b[i * SLOT..(i + 1) * SLOT]).map(|(s, c)| (s, i, c)))
            .max_by_key(|x| x.0);
        Ok(CheckpointFile { file, newest })
    }

    /// The newest valid checkpoint.
    pub fn latest(&self) -> Option<Checkpoint> {
        self.newest.map(|x| x.2)
    }

    /// Writes `c` over the older slot and makes it durable.
    pub fn write(&mut self, c: &Checkpoint) -> Result<()> {
        let (at, bytes, next) = self.next(c);
        self.file.write_at(at, &bytes)?;
        self.file.sync()?;
        self.written(next);
        Ok(())
    }

    /// The write of `c` for an asynchronous writer: the file offset, the slot's bytes, and
    /// what to pass to [`CheckpointFile::written`] once they are durable.
    pub fn next(&self, c: &Checkpoint) -> (u64, [u8; SLOT], Pending) {
        let (seq, slot) = match self.newest {
            None => (1, 0),
            Some((s, i, _)) => (s + 1, 1 - i),
        };
        ((slot * SLOT) as u64, encode(c, seq), Pending(seq, slot, *c))
    }

    /// A checkpoint of [`CheckpointFile::next`] is durable: it is the newest.
    pub fn written(&mut self, p: Pending) {
        self.newest = Some((p.0, p.1, p.2));
    }
}

/// A checkpoint written and not yet known durable ([`CheckpointFile::next`]).
#[derive(Clone, Copy, Debug)]
pub struct Pending(u64, usize, Checkpoint);

impl Pending {
    /// The checkpoint.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.2
    }
}
