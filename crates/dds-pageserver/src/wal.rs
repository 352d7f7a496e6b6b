//! The log file (`docs/pageserver-protocol.md` §5.1): a ring of records with a CRC and a
//! length, after two header blocks that say where the retained log starts (its tail) and the
//! retention horizon.

use anyhow::{bail, Result};
use dds_storage::StoreFile;

use crate::proto::{self, Record};

const MAGIC: &[u8; 8] = b"DSWAL002";
/// Bytes of a header block.
pub const BLOCK: u64 = 4096;
/// Where the ring starts (after the two header blocks).
pub const START: u64 = 2 * BLOCK;
/// The `crc` field of a wrap mark (its `len` is 0).
const WRAP: u32 = u32::MAX;

/// What a header block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Sequence number; block `seq % 2`.
    pub seq: u64,
    /// Where the oldest retained record starts (or the wrap point before it).
    pub tail: u64,
    /// Every record with a larger LSN is in the log.
    pub tail_lsn: u64,
    /// The retention horizon.
    pub horizon: u64,
}

impl Header {
    /// The block's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = vec![0u8; BLOCK as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.seq.to_le_bytes());
        h[16..24].copy_from_slice(&self.tail.to_le_bytes());
        h[24..32].copy_from_slice(&self.tail_lsn.to_le_bytes());
        h[32..40].copy_from_slice(&self.horizon.to_le_bytes());
        let c = crc32c::crc32c(&h[..40]);
        h[40..44].copy_from_slice(&c.to_le_bytes());
        h
    }

    /// The header in a block, if it is valid.
    fn decode(h: &[u8]) -> Option<Header> {
        if &h[0..8] != MAGIC || proto::u32_at(h, 40) != crc32c::crc32c(&h[..40]) {
            return None;
        }
        Some(Header {
            seq: proto::u64_at(h, 8),
            tail: proto::u64_at(h, 16),
            tail_lsn: proto::u64_at(h, 24),
            horizon: proto::u64_at(h, 32),
        })
    }

    /// The block this header goes to.
    pub fn offset(&self) -> u64 {
        (self.seq % 2) * BLOCK
    }
}

/// The log file.
pub struct Wal {
    file: Box<dyn StoreFile>,
    capacity: u64,
    /// Where the next record goes once the pending ones are written (the head).
    next: u64,
    /// Where the pending records go.
    end: u64,
    /// The durable header.
    header: Header,
    /// The last record's LSN (the tail LSN when empty).
    last_lsn: u64,
    /// Records added and not yet being written; bytes from `split` on go to `START`.
    pending: Vec<u8>,
    pending_split: Option<usize>,
    /// Records being written by an asynchronous commit, at `committing_off`.
    committing: Vec<u8>,
    committing_split: Option<usize>,
    committing_off: u64,
}

impl Wal {
    /// Opens the log; `replay` gets every retained record in order, with the offset just past
    /// it (recovery).
    pub fn open(
        file: Box<dyn StoreFile>,
        capacity: u64,
        mut replay: impl FnMut(&Record<'_>, u64) -> Result<()>,
    ) -> Result<Wal> {
        if capacity < START + BLOCK {
            bail!("the log file must hold at least {} bytes", START + BLOCK);
        }
        if file.size()? < capacity {
            file.set_size(capacity)?;
        }
        let mut h = vec![0u8; START as usize];
        file.read_at(0, &mut h)?;
        let fresh = h.iter().all(|&b| b == 0);
        let header = if fresh {
            let hd = Header {
                seq: 1,
                tail: START,
                tail_lsn: 0,
                horizon: 0,
            };
            file.write_at(hd.offset(), &hd.encode())?;
            file.sync()?;
            hd
        } else {
            let a = Header::decode(&h[..BLOCK as usize]);
            let b = Header::decode(&h[BLOCK as usize..]);
            match (a, b) {
                (Some(a), Some(b)) => {
                    if a.seq > b.seq {
                        a
                    } else {
                        b
                    }
                }
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => bail!("the log file's headers are damaged"),
            }
        };
        if !(START..=capacity).contains(&header.tail) {
            bail!("the log file's header names a tail outside the ring");
        }
        let mut wal = Wal {
            file,
            capacity,
            next: header.tail,
            end: header.tail,
            header,
            last_lsn: header.tail_lsn,
            pending: Vec::new(),
            pending_split: None,
            committing: Vec::new(),
            committing_split: None,
            committing_off: 0,
        };
        wal.scan(&mut replay)?;
        wal.end = wal.next;
        Ok(wal)
    }

    /// Scans the ring from the tail (following wrap marks) while records are valid and their
    /// LSNs increase; `next` ends where the scan stopped.
    fn scan(&mut self, replay: &mut impl FnMut(&Record<'_>, u64) -> Result<()>) -> Result<()> {
        let mut at = self.next;
        let mut wrapped = false;
        let mut buf = vec![0u8; 1 << 20];
        'scan: loop {
            let want = ((self.capacity - at) as usize).min(buf.len());
            let n = if want >= 8 {
                self.file.read_at(at, &mut buf[..want])?
            } else {
                0
            };
            let mut o = 0usize;
            loop {
                if o + 8 > n {
                    if at + o as u64 + 8 > self.capacity {
                        // Fewer than 8 bytes left: the lap ends here.
                        if wrapped {
                            break 'scan;
                        }
                        wrapped = true;
                        at = START;
                        continue 'scan;
                    }
                    break;
                }
                let crc = proto::u32_at(&buf, o);
                let len = proto::u32_at(&buf, o + 4) as usize;
                if crc == WRAP && len == 0 {
                    if wrapped {
                        break 'scan;
                    }
                    wrapped = true;
                    at = START;
                    continue 'scan;
                }
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
                if r.lsn <= self.last_lsn {
                    break 'scan;
                }
                o += 8 + len;
                let end = at + o as u64;
                replay(&r, end)?;
                self.last_lsn = r.lsn;
                self.next = end;
            }
            if o == 0 {
                break;
            }
            at += o as u64;
        }
        Ok(())
    }

    /// The last durable (or pending) record's LSN.
    pub fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// The durable header.
    pub fn header(&self) -> Header {
        self.header
    }

    /// Where a record of `bytes` (with its 8-byte frame) would start after `next`, if it
    /// fits before the durable tail: `(start, wraps)`. A record never runs into the tail (so
    /// the scan from the tail never meets a record written over the place it starts from).
    fn place_at(&self, next: u64, empty: bool, bytes: u64) -> Option<(u64, bool)> {
        let tail = self.header.tail;
        if next >= tail || empty {
            // Free: [next, capacity) and [START, tail).
            if next + bytes <= self.capacity {
                return Some((next, false));
            }
            (START + bytes < tail).then_some((START, true))
        } else {
            // Free: [next, tail).
            (next + bytes < tail).then_some((next, false))
        }
    }

    fn is_empty(&self) -> bool {
        self.next == self.header.tail && self.last_lsn == self.header.tail_lsn
    }

    /// Whether records of `sizes` (record bytes each) fit now (and in the pending commit,
    /// which wraps at most once).
    pub fn has_room(&self, sizes: impl Iterator<Item = usize>) -> bool {
        let mut next = self.next;
        let mut empty = self.is_empty();
        let mut wrapped = self.pending_split.is_some();
        for n in sizes {
            let bytes = n as u64 + 8;
            match self.place_at(next, empty, bytes) {
                Some((_, true)) if wrapped => return false,
                Some((at, wraps)) => {
                    wrapped |= wraps;
                    next = at + bytes;
                }
                None => return false,
            }
            empty = false;
        }
        true
    }

    /// Whether `bytes` of records fit in an empty log.
    pub fn fits_at_all(&self, bytes: usize) -> bool {
        START + bytes as u64 + 8 < self.capacity
    }

    /// Bytes of the ring.
    pub fn ring_bytes(&self) -> u64 {
        self.capacity - START
    }

    /// Bytes between the durable tail and the head.
    pub fn used_bytes(&self) -> u64 {
        let (head, tail) = (self.next, self.header.tail);
        if head >= tail {
            head - tail
        } else {
            (self.capacity - tail) + (head - START)
        }
    }

    /// Records wait to be committed.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Queues a record (made durable by [`begin_commit`](Self::begin_commit) or
    /// [`commit`](Self::commit)); the caller checked [`has_room`](Self::has_room). Returns
    /// the offset just past it.
    pub fn add(&mut self, r: &Record<'_>) -> u64 {
        assert!(r.lsn > self.last_lsn, "log LSNs increase");
        let bytes = (r.wire_len() + 8) as u64;
        let (at, wraps) = self
            .place_at(self.next, self.is_empty(), bytes)
            .expect("the caller checked the room");
        if wraps {
            if self.next + 8 <= self.capacity {
                self.pending.extend_from_slice(&WRAP.to_le_bytes());
                self.pending.extend_from_slice(&0u32.to_le_bytes());
            }
            assert!(self.pending_split.is_none(), "one wrap per commit");
            self.pending_split = Some(self.pending.len());
        }
        let start = self.pending.len();
        self.pending.extend_from_slice(&[0; 8]);
        r.encode(&mut self.pending);
        let body = &self.pending[start + 8..];
        let crc = crc32c::crc32c(body);
        let len = body.len() as u32;
        self.pending[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        self.pending[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
        self.last_lsn = r.lsn;
        self.next = at + bytes;
        self.next
    }

    /// An asynchronous commit of the queued records, which the caller writes (see
    /// [`segment`](Self::segment)) and flushes before [`end_commit`](Self::end_commit). One at
    /// a time. Returns the bytes to write.
    pub fn begin_commit(&mut self) -> usize {
        assert!(self.committing.is_empty(), "one commit at a time");
        std::mem::swap(&mut self.committing, &mut self.pending);
        self.committing_split = std::mem::take(&mut self.pending_split);
        self.committing_off = self.end;
        self.end = self.next;
        self.committing.len()
    }

    /// The file offset of byte `i` of the commit in flight, and the bytes from there to the
    /// end of its contiguous piece.
    pub fn segment(&self, i: usize) -> (u64, &[u8]) {
        match self.committing_split {
            Some(split) if i >= split => (START + (i - split) as u64, &self.committing[i..]),
            Some(split) => (self.committing_off + i as u64, &self.committing[i..split]),
            None => (self.committing_off + i as u64, &self.committing[i..]),
        }
    }

    /// The commit begun by [`begin_commit`](Self::begin_commit) is durable.
    pub fn end_commit(&mut self) {
        self.committing.clear();
        self.committing_split = None;
    }

    /// Writes the queued records and syncs (shutdown).
    pub fn commit(&mut self) -> Result<()> {
        assert!(self.committing.is_empty(), "a commit is in flight");
        if self.pending.is_empty() {
            return Ok(());
        }
        let n = self.begin_commit();
        let mut i = 0;
        while i < n {
            let (off, b) = self.segment(i);
            self.file.write_at(off, b)?;
            i += b.len();
        }
        self.file.sync()?;
        self.end_commit();
        Ok(())
    }

    /// The header a checkpoint writes next.
    pub fn next_header(&self, tail: u64, tail_lsn: u64, horizon: u64) -> Header {
        Header {
            seq: self.header.seq + 1,
            tail,
            tail_lsn,
            horizon,
        }
    }

    /// A header written by a checkpoint is durable: the space behind its tail is free.
    pub fn header_durable(&mut self, h: Header) {
        self.header = h;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dds_storage::{OsStorage, Storage};

    fn rec(lsn: u64, data: &[u8]) -> Record<'_> {
        Record {
            lsn,
            page: lsn % 7,
            offset: 0,
            data,
        }
    }

    #[test]
    fn the_ring_wraps_behind_a_durable_tail_and_recovers_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let st = OsStorage::new(dir.path()).unwrap();
        let cap = START + 4096;
        let data = [7u8; 200];
        let mut ends = Vec::new();
        {
            let mut w = Wal::open(st.open("wal").unwrap(), cap, |_, _| Ok(())).unwrap();
            let mut lsn = 0;
            while w.has_room(std::iter::once(rec(1, &data).wire_len())) {
                lsn += 1;
                ends.push((lsn, w.add(&rec(lsn, &data))));
            }
            w.commit().unwrap();
            assert!(lsn > 10);
            // Reclaim the first half, durably.
            let (tl, toff) = ends[ends.len() / 2];
            let h = w.next_header(toff, tl, tl);
            let f = st.open("wal").unwrap();
            f.write_at(h.offset(), &h.encode()).unwrap();
            f.sync().unwrap();
            w.header_durable(h);
            let mut more = 0;
            while w.has_room(std::iter::once(rec(1, &data).wire_len())) {
                lsn += 1;
                w.add(&rec(lsn, &data));
                more += 1;
            }
            assert!(more >= ends.len() / 2 - 1, "{more} records after the wrap");
            w.commit().unwrap();
            let mut seen = Vec::new();
            let w2 = Wal::open(st.open("wal").unwrap(), cap, |r, _| {
                seen.push(r.lsn);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen.first(), Some(&(tl + 1)));
            assert_eq!(seen.last(), Some(&lsn));
            assert!(seen.windows(2).all(|x| x[1] == x[0] + 1));
            assert_eq!(w2.last_lsn(), lsn);
            assert_eq!(w2.header().horizon, tl);
        }
    }
}
