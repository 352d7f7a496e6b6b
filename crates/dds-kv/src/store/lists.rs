//! Lists on the log (`docs/kv-service.md` §7): one element record per element under its
//! position (8 bytes, biased big-endian); the live positions are contiguous, `head..end` in
//! the collection map. A push writes one record at an end, a pop one element tombstone; a
//! change in the middle rewrites the elements between it and the nearer end, in an order
//! that keeps the positions contiguous on every prefix of the log (so a crash in the middle
//! of a rewrite leaves a list without gaps).

use super::*;
use crate::collection::{encode_meta, encode_position, CollType, Meta};
use crate::collmap::position_hash;

const LIST: CollType = CollType::List;

/// A live list: its version and ends.
#[derive(Clone, Copy, Debug)]
struct Ends {
    version: u64,
    head: i64,
    end: i64,
}

impl Ends {
    fn len(&self) -> u64 {
        (self.end - self.head) as u64
    }
}

impl Store {
    /// The live list at `key` (`None`: missing; WRONGTYPE: another type).
    fn list_ends(&mut self, key: &[u8]) -> StoreResult<Option<Ends>> {
        let Some(version) = self.coll_of(key, LIST)? else {
            return Ok(None);
        };
        Ok(self.colls.get(record::key_hash(key)).map(|c| Ends {
            version,
            head: c.head,
            end: c.head + c.list.len() as i64,
        }))
    }

    /// Writes the element at `pos` (or its tombstone); the collection map moves the list's
    /// ends (a value next to an end extends it, a tombstone at an end shrinks it).
    fn list_write(
        &mut self,
        key: &[u8],
        version: u64,
        pos: i64,
        value: Option<&[u8]>,
    ) -> StoreResult<()> {
        self.append_element(key, version, &encode_position(pos), value)?;
        Ok(())
    }

    /// Pushes `values` one by one at the list's head (`left`, LPUSH) or its end (RPUSH),
    /// creating the list when `key` is missing and `create` (LPUSHX and RPUSHX do not):
    /// the list's length after the pushes (0: missing and not created).
    pub fn list_push(
        &mut self,
        key: &[u8],
        values: &[&[u8]],
        left: bool,
        create: bool,
    ) -> StoreResult<u64> {
        self.check_sizes(key, 0)?;
        if values.iter().any(|v| v.len() > self.cfg.max_value) {
            return Err(StoreError::ValueTooLarge(self.cfg.max_value));
        }
        let version = match self.list_ends(key)? {
            Some(e) => e.version,
            None if !create || values.is_empty() => return Ok(0),
            None => {
                let meta = Meta {
                    ty: LIST,
                    version: self.seq + 1,
                };
                self.append(record::key_hash(key), KIND_META, key, &encode_meta(meta), 0)?;
                meta.version
            }
        };
        let kh = record::key_hash(key);
        for v in values {
            let Some(c) = self.colls.get(kh) else {
                break;
            };
            let pos = match (left, c.list.len()) {
                (_, 0) => 0,
                (true, _) => c.head - 1,
                (false, n) => c.head + n as i64,
            };
            self.list_write(key, version, pos, Some(v))?;
        }
        Ok(self.colls.get(kh).map_or(0, |c| c.live))
    }

    /// Calls `f` with the index and value of the list's elements at indexes `from..to`
    /// (0: the head), from `to - 1` down with `rev`, until `f` answers false. An element on
    /// storage is read while the walk runs.
    pub fn list_visit(
        &mut self,
        key: &[u8],
        from: u64,
        to: u64,
        rev: bool,
        f: &mut dyn FnMut(u64, &[u8]) -> bool,
    ) -> StoreResult<()> {
        let Some(e) = self.list_ends(key)? else {
            return Ok(());
        };
        let kh = record::key_hash(key);
        let to = to.min(e.len());
        let mut i = if rev { to } else { from };
        while (rev && i > from) || (!rev && i < to) {
            let idx = if rev { i - 1 } else { i };
            i = if rev { i - 1 } else { i + 1 };
            let pos = e.head + idx as i64;
            if let Some(hdr) = self.load_element(kh, key, e.version, position_hash(pos))? {
                if !f(idx, &self.scratch[hdr.value_range()]) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Replaces the element at `index` (LSET): false when the index is out of range (or
    /// the key is missing).
    pub fn list_set(&mut self, key: &[u8], index: u64, value: &[u8]) -> StoreResult<bool> {
        if value.len() > self.cfg.max_value {
            return Err(StoreError::ValueTooLarge(self.cfg.max_value));
        }
        match self.list_ends(key)? {
            Some(e) if index < e.len() => {
                self.list_write(key, e.version, e.head + index as i64, Some(value))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Replaces the list's first `k` elements (`left`) or its last `k` with `new` (in list
    /// order): pops, LTRIM, and LINSERT and LREM on the nearer side. Writes go outward first
    /// when the list grows and inward first when it shrinks, so that the live positions stay
    /// contiguous after each record; replacing every element with none deletes the key.
    pub fn list_replace_end(
        &mut self,
        key: &[u8],
        left: bool,
        k: u64,
        new: &[&[u8]],
    ) -> StoreResult<()> {
        if new.iter().any(|v| v.len() > self.cfg.max_value) {
            return Err(StoreError::ValueTooLarge(self.cfg.max_value));
        }
        let Some(e) = self.list_ends(key)? else {
            return Ok(());
        };
        let k = k.min(e.len());
        let (k, m) = (k as i64, new.len() as i64);
        if new.is_empty() && k == e.len() as i64 {
            self.append(record::key_hash(key), KIND_TOMBSTONE, key, &[], 0)?;
            return Ok(());
        }
        let v = e.version;
        if left {
            // Old segment at head..head+k; the new one at head+k-m..head+k.
            let base = e.head + k - m;
            if m >= k {
                for j in (0..m - k).rev() {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
                for j in m - k..m {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
            } else {
                for j in 0..m {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
                for p in e.head..base {
                    self.list_write(key, v, p, None)?;
                }
            }
        } else {
            // Old segment at end-k..end; the new one at end-k..end-k+m.
            let base = e.end - k;
            if m >= k {
                for j in k..m {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
                for j in 0..k {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
            } else {
                for j in 0..m {
                    self.list_write(key, v, base + j, Some(new[j as usize]))?;
                }
                for p in (base + m..e.end).rev() {
                    self.list_write(key, v, p, None)?;
                }
            }
        }
        Ok(())
    }

    /// Pops one element from the head (`left`) or the end of the list (LPOP, RPOP, LMOVE):
    /// `f` gets its value before it is removed; false when `key` is missing.
    pub fn list_pop_with(
        &mut self,
        key: &[u8],
        left: bool,
        f: &mut dyn FnMut(&[u8]),
    ) -> StoreResult<bool> {
        let Some(e) = self.list_ends(key)?.filter(|e| e.len() > 0) else {
            return Ok(false);
        };
        let idx = if left { 0 } else { e.len() - 1 };
        let mut seen = false;
        self.list_visit(key, idx, idx + 1, false, &mut |_, v| {
            f(v);
            seen = true;
            false
        })?;
        self.list_replace_end(key, left, 1, &[])?;
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open, small};
    use super::*;
    use std::collections::VecDeque;

    fn contents(s: &mut Store, key: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        s.list_visit(key, 0, u64::MAX, false, &mut |_, v| {
            out.push(v.to_vec());
            true
        })
        .unwrap();
        out
    }

    fn check_contiguous(s: &Store, key: &[u8]) {
        if let Some(c) = s.colls.get(record::key_hash(key)) {
            assert_eq!(c.list.len() as u64, c.live, "one address per element");
            for p in c.head..c.head + c.list.len() as i64 {
                assert!(c.element(position_hash(p)).is_some(), "position {p} live");
            }
        }
    }

    /// Pushes, pops, sets and middle rewrites against a `VecDeque` model, through eviction,
    /// compaction and restarts; the positions stay contiguous after every operation.
    #[test]
    fn lists_follow_a_model_through_restarts_and_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = || small(Durability::Fsync);
        let mut s = open(dir.path(), cfg());
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        let mut x = 7u64;
        let mut compactions = 0;
        for step in 0..6000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let val = format!("v{step}-{}", "x".repeat(((x >> 50) % 60) as usize)).into_bytes();
            let len = model.len() as u64;
            // The list stays within a few hundred elements (the log is 512 KiB).
            let op = match (x >> 33) % 8 {
                0..=3 if len > 400 => 4,
                op => op,
            };
            match op {
                0 | 1 => {
                    let n = s.list_push(b"l", &[&val], true, true).unwrap();
                    model.push_front(val);
                    assert_eq!(n, model.len() as u64);
                }
                2 | 3 => {
                    let n = s.list_push(b"l", &[&val, b"two"], false, true).unwrap();
                    model.push_back(val);
                    model.push_back(b"two".to_vec());
                    assert_eq!(n, model.len() as u64);
                }
                4 => {
                    let left = (x >> 40) & 1 == 0;
                    let mut got = None;
                    let had = s
                        .list_pop_with(b"l", left, &mut |v| got = Some(v.to_vec()))
                        .unwrap();
                    let want = if left {
                        model.pop_front()
                    } else {
                        model.pop_back()
                    };
                    assert_eq!(had, want.is_some());
                    assert_eq!(got, want);
                }
                5 if len > 0 => {
                    let i = (x >> 20) % len;
                    assert!(s.list_set(b"l", i, &val).unwrap());
                    model[i as usize] = val;
                }
                6 if len > 0 => {
                    // An insertion before index i through the nearer end.
                    let i = ((x >> 20) % (len + 1)) as usize;
                    let all: Vec<Vec<u8>> = model.iter().cloned().collect();
                    if i as u64 <= len / 2 {
                        let mut seg: Vec<&[u8]> = all[..i].iter().map(|v| &v[..]).collect();
                        seg.push(&val);
                        s.list_replace_end(b"l", true, i as u64, &seg).unwrap();
                    } else {
                        let mut seg: Vec<&[u8]> = vec![&val];
                        seg.extend(all[i..].iter().map(|v| &v[..]));
                        s.list_replace_end(b"l", false, len - i as u64, &seg)
                            .unwrap();
                    }
                    model.insert(i, val);
                }
                7 if len > 0 => {
                    // A removal of index i through the nearer end.
                    let i = ((x >> 20) % len) as usize;
                    let all: Vec<Vec<u8>> = model.iter().cloned().collect();
                    if (i as u64) < len / 2 {
                        let seg: Vec<&[u8]> = all[..i].iter().map(|v| &v[..]).collect();
                        s.list_replace_end(b"l", true, i as u64 + 1, &seg).unwrap();
                    } else {
                        let seg: Vec<&[u8]> = all[i + 1..].iter().map(|v| &v[..]).collect();
                        s.list_replace_end(b"l", false, len - i as u64, &seg)
                            .unwrap();
                    }
                    model.remove(i);
                }
                _ => {}
            }
            check_contiguous(&s, b"l");
            assert_eq!(
                s.coll_len(LIST, b"l").unwrap(),
                model.len() as u64,
                "step {step}"
            );
            if step % 1500 == 1499 {
                let want: Vec<Vec<u8>> = model.iter().cloned().collect();
                assert_eq!(contents(&mut s, b"l"), want, "step {step}");
                s.commit().unwrap();
                compactions += s.stats.compactions;
                drop(s);
                s = open(dir.path(), cfg());
                check_contiguous(&s, b"l");
                assert_eq!(contents(&mut s, b"l"), want, "after restart, step {step}");
            }
        }
        assert!(compactions > 0, "the log wrapped: compaction ran");
        // Emptying the list deletes the key.
        let n = s.coll_len(LIST, b"l").unwrap();
        s.list_replace_end(b"l", true, n, &[]).unwrap();
        assert!(!s.exists(b"l").unwrap());
        assert_eq!(s.list_push(b"l", &[b"a"], true, false).unwrap(), 0);
        assert!(!s.exists(b"l").unwrap());
    }

    /// A rename copies a list with its ends; a string key is WRONGTYPE for a list write.
    #[test]
    fn list_copies_keep_order_and_strings_are_wrongtype() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), small(Durability::Fsync));
        for i in 0..50 {
            let v = format!("e{i}").into_bytes();
            s.list_push(b"src", &[&v], i % 2 == 0, true).unwrap();
        }
        let want = contents(&mut s, b"src");
        assert!(s.coll_copy(b"src", b"dst", 0).unwrap());
        check_contiguous(&s, b"dst");
        assert_eq!(contents(&mut s, b"dst"), want);
        s.list_push(b"dst", &[b"more"], true, true).unwrap();
        assert_eq!(contents(&mut s, b"dst")[0], b"more");
        s.set(b"str", b"v", SetCond::Always, Expiry::None, None)
            .unwrap();
        assert!(matches!(
            s.list_push(b"str", &[b"x"], true, true),
            Err(StoreError::WrongType)
        ));
    }
}
