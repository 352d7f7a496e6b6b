//! The log's space: allocation at the tail, pages started and evicted, compaction of the
//! oldest page, writes to the log file, commits and checkpoints (`docs/kv-service.md` §1, §3).

use super::*;

impl Store {
    /// Room for `len` bytes at the tail, starting a page (and compacting) if needed.
    pub(super) fn allocate(&mut self, len: u64) -> StoreResult<u64> {
        assert!(len <= self.ps, "record larger than a page");
        let mut rounds = 0u64;
        while self.tail + len > self.tail_page_end {
            let next = self.tail_page_end / self.ps;
            if (next + 2) * self.ps > self.begin + self.cap {
                // Keep one free page slot beyond the next page: compact the oldest page.
                // Its live records go to the tail page or the next one, never to the page
                // that reuses its slot, so they are written (and synced, before the
                // checkpoint that drops the old page) ahead of the overwrite.
                rounds += 1;
                if rounds > self.cap / self.ps {
                    return Err(StoreError::LogFull);
                }
                self.compact_one()?;
                continue;
            }
            self.start_page(next)?;
        }
        let a = self.tail;
        self.tail += len;
        Ok(a)
    }

    /// Starts page `next` at the tail: makes room in memory (flushing and evicting the oldest
    /// page) and moves the read-only boundary. Its file slot must be free.
    fn start_page(&mut self, next: u64) -> StoreResult<()> {
        assert_eq!(next * self.ps, self.tail_page_end, "pages start in order");
        assert!(
            (next + 1) * self.ps <= self.begin + self.cap,
            "page slot still holds live data"
        );
        let frames = self.frames.len() as u64;
        while next + 1 > self.page_of(self.head) + frames {
            let evict_end = (self.page_of(self.head) + 1) * self.ps;
            if self.read_only < evict_end {
                self.read_only = evict_end;
            }
            self.flush_to(evict_end)?;
            self.head = evict_end;
        }
        let fr = self.frame(next);
        self.frames[fr].fill(0);
        self.tail = next * self.ps;
        self.tail_page_end = (next + 1) * self.ps;
        // The mutable region: the newest `mutable_pages` pages.
        let ro = (next + 1).saturating_sub(self.mutable_pages) * self.ps;
        if ro > self.read_only {
            self.read_only = ro.min(self.tail);
        }
        Ok(())
    }

    /// Moves the live records of the oldest page to the tail and frees the page.
    fn compact_one(&mut self) -> StoreResult<()> {
        let bp = self.page_of(self.begin);
        let start = self.begin;
        let end = (bp + 1) * self.ps;
        assert!(end <= self.tail, "compacting the tail page");
        let mut page = vec![0u8; (end - start) as usize];
        if start >= self.head {
            let (f, o) = self.in_frame(start);
            let n = page.len();
            page.copy_from_slice(&self.frames[f][o..o + n]);
        } else {
            let n = self.file.read_at(start % self.cap, &mut page)?;
            page[n..].fill(0);
        }
        // Live records of the page: the index points at them.
        let now = super::now_ms();
        let mut moves: Vec<(usize, Header)> = Vec::new();
        for (o, h) in record::scan(&page) {
            let a = start + o as u64;
            let kh = record::key_hash(&page[o + HEADER..o + HEADER + h.klen as usize]);
            if self.index.get(&kh).is_some_and(|&e| e & ADDR == a) {
                if h.kind == KIND_TOMBSTONE {
                    // Every older record of the key is below it and gone: forget the key.
                    self.index.remove(&kh);
                } else if h.expire_ms != 0 && h.expire_ms < now {
                    // Expired: garbage like a tombstone, and the key is gone.
                    self.index.remove(&kh);
                    self.live -= 1;
                    self.expiring -= 1;
                } else {
                    moves.push((o, h));
                }
            }
        }
        // The page is free; its records go to the tail (at most one page of them, and the
        // slot freed here is what the next page needs).
        self.begin = end;
        self.stats.compactions += 1;
        for (o, h) in moves {
            let rec = &page[o..o + h.len()];
            let key = &rec[h.key_range()];
            let kh = record::key_hash(key);
            let len = h.len() as u64;
            if self.tail + len > self.tail_page_end {
                let next = self.tail_page_end / self.ps;
                if (next + 1) * self.ps > self.begin + self.cap {
                    return Err(StoreError::LogFull);
                }
                self.start_page(next)?;
            }
            let a = self.tail;
            self.tail += len;
            self.seq += 1;
            let (f, fo) = self.in_frame(a);
            record::encode(
                &mut self.frames[f][fo..fo + len as usize],
                KIND_VALUE,
                key,
                &rec[h.value_range()],
                self.seq,
                h.expire_ms,
            );
            self.index.insert(kh, value_entry(a, h.expire_ms));
            if self.cfg.offload {
                // The DPU may hold the old copy; the new one is cached once it is written.
                // Until then an update of the key must not leave the old copy cached.
                self.invalidate.push(kh.0);
            }
            self.stats.compaction_moves += 1;
            self.dirty = true;
        }
        Ok(())
    }

    /// Writes `[flushed, to)` to the log file (`to ≤ read_only`), marking records that are no
    /// longer their key's newest as superseded first.
    fn flush_to(&mut self, to: u64) -> StoreResult<()> {
        assert!(to <= self.read_only, "flush past read-only");
        while self.flushed < to {
            let a = self.flushed;
            let p = self.page_of(a);
            let end = to.min((p + 1) * self.ps);
            // The page's slot is about to be overwritten: the durable checkpoint must not
            // point recovery at what was there.
            if self.ckpt.is_some() && (p + 1) * self.ps > self.durable_begin + self.cap {
                self.file.sync()?;
                self.write_checkpoint()?;
            }
            let (f, o) = self.in_frame(a);
            let n = (end - a) as usize;
            // Mark superseded records.
            let mut at = o;
            while at < o + n {
                let Some(h) = record::decode_header(&self.frames[f][at..]) else {
                    break;
                };
                let key = &self.frames[f][at + HEADER..at + HEADER + h.klen as usize];
                let kh = record::key_hash(key);
                let ra = p * self.ps + at as u64;
                if self.index.get(&kh).is_none_or(|&e| e & ADDR != ra) {
                    self.frames[f][at + 5] |= FLAG_SUPERSEDED;
                }
                at += h.len();
            }
            let frame = &self.frames[f];
            self.file.write_at(a % self.cap, &frame[o..o + n])?;
            self.stats.page_writes += 1;
            self.flushed = end;
        }
        Ok(())
    }

    /// Makes every write so far durable (fold-over: the whole log becomes read-only), and
    /// records a checkpoint. Called per event-loop round in `fsync` mode and periodically in
    /// `periodic` mode; does nothing when nothing changed.
    pub fn commit(&mut self) -> StoreResult<()> {
        if !self.dirty {
            return Ok(());
        }
        self.read_only = self.tail;
        self.flush_to(self.tail)?;
        if self.ckpt.is_some() {
            self.file.sync()?;
            self.write_checkpoint()?;
        }
        self.dirty = false;
        Ok(())
    }

    pub(super) fn write_checkpoint(&mut self) -> StoreResult<()> {
        let c = Checkpoint {
            begin: self.begin,
            flushed: self.flushed,
            page_size: self.ps,
            capacity: self.cap,
            seq: self.seq,
        };
        if let Some(f) = self.ckpt.as_mut() {
            f.write(&c)?;
            self.durable_begin = self.begin;
            self.stats.checkpoints += 1;
        }
        Ok(())
    }
}
