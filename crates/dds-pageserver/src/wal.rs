//! The log file (`docs/pageserver-protocol.md` §5): records with a CRC and a length, after a
//! 4 KiB header that says where the log starts.

use anyhow::{bail, Result};
use dds_storage::StoreFile;

use crate::proto::{self, Record};

const MAGIC: &[u8; 8] = b"DSWAL001";
/// Bytes of the header block.
pub const START: u64 = 4096;

/// The log file.
pub struct Wal {
    file: Box<dyn StoreFile>,
    capacity: u64,
    /// Where the next record goes.
    end: u64,
    /// LSN the log starts after (records have larger LSNs).
    base_lsn: u64,
    /// The last record's LSN (`base_lsn` when empty).
    last_lsn: u64,
    /// Records added and not yet being written.
    pending: Vec<u8>,
    /// Records being written by an asynchronous commit (`begin_commit` .. `end_commit`), at
    /// `end`.
    committing: Vec<u8>,
}

fn header(base_lsn: u64) -> Vec<u8> {
    let mut h = vec![0u8; START as usize];
    h[0..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&START.to_le_bytes());
    h[16..24].copy_from_slice(&base_lsn.to_le_bytes());
    let c = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&c.to_le_bytes());
    h
}

impl Wal {
    /// Opens the log; `replay` gets every valid record in order (recovery).
    pub fn open(
        file: Box<dyn StoreFile>,
        capacity: u64,
        mut replay: impl FnMut(&Record<'_>) -> Result<()>,
    ) -> Result<Wal> {
        if file.size()? < capacity {
            file.set_size(capacity)?;
        }
        let mut h = vec![0u8; START as usize];
        file.read_at(0, &mut h)?;
        let fresh = h.iter().all(|&b| b == 0);
        let mut wal = Wal {
            file,
            capacity,
            end: START,
            base_lsn: 0,
            last_lsn: 0,
            pending: Vec::new(),
            committing: Vec::new(),
        };
        if fresh {
            wal.file.write_at(0, &header(0))?;
            wal.file.sync()?;
            return Ok(wal);
        }
        if &h[0..8] != MAGIC || proto::u32_at(&h, 24) != crc32c::crc32c(&h[..24]) {
            bail!("the log file's header is damaged");
        }
        wal.base_lsn = proto::u64_at(&h, 16);
        wal.last_lsn = wal.base_lsn;
        // Scan in chunks.
        let mut at = START;
        let mut buf = vec![0u8; 1 << 20];
        'scan: loop {
            let n = wal.file.read_at(at, &mut buf)?;
            let mut o = 0usize;
            loop {
                if o + 8 > n {
                    break;
                }
                let crc = proto::u32_at(&buf, o);
                let len = proto::u32_at(&buf, o + 4) as usize;
                if !(proto::RECORD_HEADER..=1 << 20).contains(&len) {
                    break 'scan;
                }
                if o + 8 + len > n {
                    if o == 0 {
                        break 'scan;
                    }
                    break;
                }
                let body = &buf[o + 8..o + 8 + len];
                if crc32c::crc32c(body) != crc {
                    break 'scan;
                }
                let Ok(r) = proto::record(body) else {
                    break 'scan;
                };
                if r.lsn <= wal.last_lsn {
                    break 'scan;
                }
                replay(&r)?;
                wal.last_lsn = r.lsn;
                o += 8 + len;
                wal.end = at + o as u64;
            }
            if o == 0 {
                break;
            }
            at += o as u64;
        }
        Ok(wal)
    }

    /// The last durable (or pending) record's LSN.
    pub fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// Whether `bytes` more fit before the log must start over.
    pub fn has_room(&self, bytes: usize) -> bool {
        self.end + (self.committing.len() + self.pending.len() + bytes) as u64 <= self.capacity
    }

    /// Whether `bytes` fit in an empty log.
    pub fn fits_at_all(&self, bytes: usize) -> bool {
        START + bytes as u64 <= self.capacity
    }

    /// Records wait to be committed.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Queues a record (made durable by [`commit`](Self::commit)).
    pub fn add(&mut self, r: &Record<'_>) {
        assert!(r.lsn > self.last_lsn, "log LSNs increase");
        let start = self.pending.len();
        self.pending.extend_from_slice(&[0; 8]);
        r.encode(&mut self.pending);
        let body = &self.pending[start + 8..];
        let crc = crc32c::crc32c(body);
        let len = body.len() as u32;
        self.pending[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        self.pending[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
        self.last_lsn = r.lsn;
    }

    /// An asynchronous commit of the queued records: where they go and their bytes, which the
    /// caller writes and flushes before [`end_commit`](Self::end_commit). One at a time.
    pub fn begin_commit(&mut self) -> (u64, &[u8]) {
        assert!(self.committing.is_empty(), "one commit at a time");
        std::mem::swap(&mut self.committing, &mut self.pending);
        (self.end, &self.committing)
    }

    /// The bytes of the commit in flight.
    pub fn committing(&self) -> &[u8] {
        &self.committing
    }

    /// The commit begun by [`begin_commit`](Self::begin_commit) is durable.
    pub fn end_commit(&mut self) {
        self.end += self.committing.len() as u64;
        self.committing.clear();
    }

    /// Writes the queued records and syncs (recovery and shutdown).
    pub fn commit(&mut self) -> Result<()> {
        assert!(self.committing.is_empty(), "a commit is in flight");
        if self.pending.is_empty() {
            return Ok(());
        }
        self.file.write_at(self.end, &self.pending)?;
        self.file.sync()?;
        self.end += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Starts the log over after `last_lsn` (every page holding a record of it must be
    /// durable first).
    pub fn restart(&mut self) -> Result<()> {
        assert!(
            self.pending.is_empty() && self.committing.is_empty(),
            "restart with records pending"
        );
        self.file.write_at(0, &header(self.last_lsn))?;
        self.file.sync()?;
        self.base_lsn = self.last_lsn;
        self.end = START;
        Ok(())
    }
}
