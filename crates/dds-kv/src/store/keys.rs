//! Listing and expiring keys: SCAN's steps over the index in hash order, RANDOMKEY, and the
//! active expiry cycle (`docs/kv-service.md` §1, Index, and §5).
//!
//! The index holds key hashes; a key's bytes are in its newest record. A record in memory
//! is read in place; one on storage is read ahead by the server before the step runs (at
//! most [`SCAN_STORAGE_MAX`] per step), else read while the command waits.

use std::time::{Duration, Instant};

use super::*;

/// Records on storage one SCAN step reads at most (the server fetches them ahead).
pub const SCAN_STORAGE_MAX: usize = 16;
/// Index entries one SCAN step visits at most, per key of its COUNT (tombstones count).
const SCAN_VISITS_PER_KEY: usize = 8;
/// Keys with an expiry sampled per round of the expiry cycle (Redis's
/// `ACTIVE_EXPIRE_CYCLE_KEYS_PER_LOOP`).
const EXPIRE_SAMPLE: usize = 20;
/// RANDOMKEY's tries before it answers that no key was found.
const RANDOM_TRIES: usize = 100;

/// The position just after `h` in hash order (wrapping to the start).
fn after(h: (u64, u64)) -> (u64, u64) {
    match h.1.checked_add(1) {
        Some(l) => (h.0, l),
        None => (h.0.wrapping_add(1), 0),
    }
}

impl Store {
    fn on_storage(&self, entry: u64) -> bool {
        let a = entry & ADDR;
        entry & TOMB == 0 && a < self.head && a >= self.begin
    }

    /// Walks one SCAN step from `cursor` (a key hash's high word): `take` gets each index
    /// entry of the step; returns the next cursor (0: the walk is complete). A step ends
    /// before `count` keys, `count × 8` entries or the record on storage past
    /// [`SCAN_STORAGE_MAX`], but never between two entries whose hashes share their high
    /// word (so that a cursor names a place between keys).
    fn scan_walk(&self, cursor: u64, count: usize, mut take: impl FnMut((u64, u64), u64)) -> u64 {
        let (mut keys, mut visited, mut stored) = (0usize, 0usize, 0usize);
        let mut last = None;
        let max_visits = count.saturating_mul(SCAN_VISITS_PER_KEY);
        for &h in self.order.range((cursor, 0)..) {
            let e = self.index.get(&h).copied().unwrap_or(TOMB);
            let on_storage = self.on_storage(e);
            if last != Some(h.0)
                && (keys >= count
                    || visited >= max_visits
                    || (on_storage && stored == SCAN_STORAGE_MAX))
            {
                return h.0;
            }
            last = Some(h.0);
            visited += 1;
            if e & TOMB == 0 {
                keys += 1;
                stored += usize::from(on_storage);
            }
            take(h, e);
        }
        0
    }

    /// The log addresses of the records on storage that the SCAN step from `cursor` reads
    /// (the server fetches them before the step runs).
    pub fn scan_storage(&self, cursor: u64, count: usize, f: &mut dyn FnMut(u64)) {
        self.scan_walk(cursor, count, |_, e| {
            if self.on_storage(e) {
                f(e & ADDR);
            }
        });
    }

    /// One SCAN step from `cursor`: `f` gets every live key of the step (expired keys met
    /// are skipped, and removed with `reap`: SCAN removes them, KEYS does not, as in
    /// Redis 7.0); returns the next cursor, 0 when the walk is complete. A key present for
    /// the whole walk is returned exactly once: the order is the keys' hashes, which no
    /// insertion, removal or growth of the index changes.
    pub fn scan(
        &mut self,
        cursor: u64,
        count: usize,
        reap: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<u64> {
        let mut step = std::mem::take(&mut self.step);
        step.clear();
        let next = self.scan_walk(cursor, count, |h, e| {
            if e & TOMB == 0 {
                step.push(h);
            }
        });
        let r = self.visit_keys(&step, reap, f);
        self.step = step;
        r.map(|()| next)
    }

    /// Calls `f` with the key of each live, unexpired hash of `hashes` (removing the expired
    /// ones with `reap`).
    fn visit_keys(
        &mut self,
        hashes: &[(u64, u64)],
        reap: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<()> {
        let now = now_ms();
        for &h in hashes {
            let Some(&e) = self.index.get(&h) else {
                continue;
            };
            if e & TOMB != 0 {
                continue;
            }
            if e & EXPIRES != 0 && self.expires.get(&h).is_some_and(|&t| t < now) {
                if reap {
                    self.expire_key(h);
                }
                continue;
            }
            self.with_key(e, f)?;
        }
        Ok(())
    }

    /// Calls `f` with the key of the value record the index entry `e` points at.
    fn with_key(&mut self, e: u64, f: &mut dyn FnMut(&[u8])) -> StoreResult<()> {
        let a = e & ADDR;
        if a >= self.durable_end {
            self.undurable = true;
        }
        if a >= self.head {
            let (fr, o) = self.in_frame(a);
            let h = record::decode_header(&self.frames[fr][o..])
                .ok_or_else(|| StoreError::Storage(anyhow::anyhow!("bad record at {a}")))?;
            f(&self.frames[fr][o + HEADER..o + HEADER + h.klen as usize]);
        } else {
            let h = self.load(a)?;
            f(&self.scratch[h.key_range()]);
        }
        Ok(())
    }

    pub(super) fn random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The first live entry at or after a random place of the hash order (looking at 8
    /// entries; expiry not checked).
    fn random_entry(&mut self) -> Option<((u64, u64), u64)> {
        let at = (self.random(), self.random());
        self.order
            .range(at..)
            .chain(self.order.range(..at))
            .take(SCAN_VISITS_PER_KEY)
            .map(|&h| (h, self.index.get(&h).copied().unwrap_or(TOMB)))
            .find(|&(_, e)| e & TOMB == 0)
    }

    /// Chooses the key the next RANDOMKEY answers, and returns the log address of its record
    /// when that record is on storage (the server reads it ahead).
    pub fn pick_random(&mut self) -> Option<u64> {
        let (h, e) = self.random_entry()?;
        self.picked = Some(h);
        self.on_storage(e).then_some(e & ADDR)
    }

    /// RANDOMKEY: calls `f` with a live key: the one [`Store::pick_random`] chose while it
    /// is live, else one taken at a random place of the hash order (expired keys met are
    /// removed); false when no key was found.
    pub fn random_key(&mut self, f: &mut dyn FnMut(&[u8])) -> StoreResult<bool> {
        let now = now_ms();
        for _ in 0..RANDOM_TRIES {
            if self.live == 0 {
                return Ok(false);
            }
            let picked = self
                .picked
                .take()
                .and_then(|h| Some((h, *self.index.get(&h)?)))
                .filter(|&(_, e)| e & TOMB == 0);
            let Some((h, e)) = picked.or_else(|| self.random_entry()) else {
                continue;
            };
            if e & EXPIRES != 0 && self.expires.get(&h).is_some_and(|&t| t < now) {
                self.expire_key(h);
                continue;
            }
            self.with_key(e, f)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// One run of the active expiry cycle, as Redis's `activeExpireCycle`: samples
    /// [`EXPIRE_SAMPLE`] keys with an expiry (in hash order from where the last run
    /// stopped), removes the expired ones, and samples again while more than a quarter of a
    /// sample had expired and `budget` is not spent. No record is read: the expiry set holds
    /// the times. Returns the keys removed.
    pub fn active_expire(&mut self, budget: Duration) -> u64 {
        let start = Instant::now();
        let mut removed = 0;
        let mut step = std::mem::take(&mut self.step);
        while !self.expires.is_empty() {
            let now = now_ms();
            step.clear();
            let cursor = self.expire_cursor;
            let mut sampled = 0;
            let mut last = cursor;
            for (&h, &t) in self
                .expires
                .range(cursor..)
                .chain(self.expires.range(..cursor))
                .take(EXPIRE_SAMPLE)
            {
                sampled += 1;
                last = h;
                if t < now {
                    step.push(h);
                }
            }
            self.expire_cursor = after(last);
            for &h in &step {
                self.expire_key(h);
            }
            removed += step.len() as u64;
            if step.len() * 4 <= sampled || start.elapsed() >= budget {
                break;
            }
        }
        self.step = step;
        removed
    }
}
