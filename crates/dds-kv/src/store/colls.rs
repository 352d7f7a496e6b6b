//! Collections on the log (`docs/kv-service.md` §7): a metadata record per collection key,
//! an element record per element under its composite key. The primitives of hashes and sets.

use super::*;
use crate::collection::{
    composite_fits, composite_len, decode_composite, element_cache_hash, encode_composite,
    encode_meta, CollType, Meta,
};
use crate::collmap::{sub_hash, Hash, ELEMENT_TOMB};

impl Store {
    /// The type of `key`'s collection; `None` when `key` is missing or a string.
    pub fn coll_type(&mut self, key: &[u8]) -> StoreResult<Option<CollType>> {
        if self.find(key)?.is_none() {
            return Ok(None);
        }
        Ok(self.colls.type_of(record::key_hash(key)))
    }

    /// The type of a live `key`'s collection from memory alone (no record read, no
    /// expiry check); `None` for a string or a missing key.
    pub fn live_coll_type(&self, key: &[u8]) -> Option<CollType> {
        self.colls.type_of(record::key_hash(key))
    }

    /// The live collection of type `ty` at `key`: its version, or `None` when `key` is
    /// missing; WRONGTYPE when it holds something else.
    /// It reads no record: the index entry, the expiry set and the collection map tell.
    pub(super) fn coll_of(&mut self, key: &[u8], ty: CollType) -> StoreResult<Option<u64>> {
        let h = record::key_hash(key);
        let Some(e) = self.live_entry(h) else {
            return Ok(None);
        };
        if e & EXPIRES != 0 && self.expires.get(&h).is_some_and(|&t| t < now_ms()) {
            // Expired (Redis's `now > when`): the key is gone, as [`Store::find`] does.
            self.expire_key(h);
            return Ok(None);
        }
        match self.colls.get(h) {
            Some(c) if c.ty == ty => Ok(Some(c.version)),
            _ => Err(StoreError::WrongType),
        }
    }

    /// Builds the composite key of `sub` in `ckey`, checking its size.
    fn composite(&mut self, key: &[u8], version: u64, sub: &[u8]) -> StoreResult<()> {
        if !composite_fits(key.len(), sub.len()) {
            return Err(StoreError::KeyTooLarge(
                u16::MAX as usize - key.len() - crate::collection::COMPOSITE_OVERHEAD,
            ));
        }
        self.ckey.resize(composite_len(key.len(), sub.len()), 0);
        encode_composite(&mut self.ckey, key, version, sub);
        Ok(())
    }

    /// Appends an element record (or tombstone) of `version` of `key` at the tail; the
    /// change of the collection's live count.
    pub(super) fn append_element(
        &mut self,
        key: &[u8],
        version: u64,
        sub: &[u8],
        value: Option<&[u8]>,
    ) -> StoreResult<i64> {
        self.composite(key, version, sub)?;
        let (kind, v) = match value {
            Some(v) => (KIND_ELEMENT, v),
            None => (KIND_ELEMENT_TOMBSTONE, &[][..]),
        };
        if v.len() > self.cfg.max_value {
            return Err(StoreError::ValueTooLarge(self.cfg.max_value));
        }
        let ckey = std::mem::take(&mut self.ckey);
        let len = record::record_len(ckey.len(), v.len()) as u64;
        let r = self.allocate(len).inspect(|&a| {
            self.seq += 1;
            let (f, o) = self.in_frame(a);
            record::encode(
                &mut self.frames[f][o..o + len as usize],
                kind,
                &ckey,
                v,
                self.seq,
                0,
            );
        });
        self.ckey = ckey;
        let a = r?;
        self.stats.appends += 1;
        self.dirty = true;
        self.undurable = true;
        let kh = record::key_hash(key);
        let Some(ty) = self.colls.type_of(kh) else {
            return Ok(0);
        };
        let sh = sub_hash(ty, sub);
        if self.cfg.offload && ty != CollType::List {
            // The DPU may hold the element's old record in its cache (§4.1): drop it before
            // the reply, as a string's.
            let old = self.colls.get(kh).filter(|c| c.version == version);
            let old = old.and_then(|c| c.elems.get(&sh).copied());
            if old.is_some_and(|o| o & ELEMENT_TOMB == 0 && o < self.marked) {
                if let Some(eh) = element_cache_hash(key, sub) {
                    self.invalidate.push(eh.0);
                }
            }
        }
        Ok(self
            .colls
            .element(kh, version, sh, a, value.is_none())
            .unwrap_or(0))
    }

    /// Writes one element of the collection of type `ty` at `key` (HSET of a field, SADD of
    /// a member with an empty value): whether it is new. Creates the collection when `key`
    /// is missing; WRONGTYPE when it holds something else.
    pub fn element_put(
        &mut self,
        ty: CollType,
        key: &[u8],
        field: &[u8],
        value: &[u8],
    ) -> StoreResult<bool> {
        self.check_sizes(key, 0)?;
        let version = match self.coll_of(key, ty)? {
            Some(v) => v,
            None => {
                let meta = Meta {
                    ty,
                    version: self.seq + 1,
                };
                self.append(record::key_hash(key), KIND_META, key, &encode_meta(meta), 0)?;
                meta.version
            }
        };
        Ok(self.append_element(key, version, field, Some(value))? > 0)
    }

    /// Reads one element (HGET): calls `f` with its value (or `None`). An element on storage
    /// is read through the records read ahead ([`Store::element_storage_addr`]) when it was.
    pub fn element_get_with<R>(
        &mut self,
        ty: CollType,
        key: &[u8],
        field: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> R,
    ) -> StoreResult<R> {
        let Some(version) = self.coll_of(key, ty)? else {
            return Ok(f(None));
        };
        let kh = record::key_hash(key);
        let Some(a) = self
            .colls
            .get(kh)
            .and_then(|c| c.element(sub_hash(ty, field)))
        else {
            return Ok(f(None));
        };
        if a >= self.durable_end {
            self.undurable = true;
        }
        let hdr = self.load(a)?;
        self.composite(key, version, field)?;
        if self.scratch[hdr.key_range()] != self.ckey[..] {
            tracing::error!("128-bit field hash collision; treating the field as missing");
            return Ok(f(None));
        }
        Ok(f(Some(&self.scratch[hdr.value_range()])))
    }

    /// Removes one element (HDEL, SREM): whether it existed. Removing the last element
    /// deletes the collection.
    pub fn element_del(&mut self, ty: CollType, key: &[u8], field: &[u8]) -> StoreResult<bool> {
        let Some(version) = self.coll_of(key, ty)? else {
            return Ok(false);
        };
        let kh = record::key_hash(key);
        let Some(c) = self.colls.get(kh) else {
            return Ok(false);
        };
        if c.element(sub_hash(ty, field)).is_none() {
            return Ok(false);
        }
        if c.live == 1 {
            self.append(kh, KIND_TOMBSTONE, key, &[], 0)?;
        } else {
            self.append_element(key, version, field, None)?;
        }
        Ok(true)
    }

    /// The live elements of the collection of type `ty` at `key` (HLEN, SCARD; 0 for a
    /// missing key).
    pub fn coll_len(&mut self, ty: CollType, key: &[u8]) -> StoreResult<u64> {
        Ok(match self.coll_of(key, ty)? {
            Some(_) => self.colls.get(record::key_hash(key)).map_or(0, |c| c.live),
            None => 0,
        })
    }

    /// Whether an element exists (HEXISTS, SISMEMBER), from the collection map alone: no
    /// record is read (the element map is keyed by the sub-key's 128-bit hash).
    pub fn element_exists(&mut self, ty: CollType, key: &[u8], sub: &[u8]) -> StoreResult<bool> {
        Ok(self.coll_of(key, ty)?.is_some()
            && self
                .colls
                .get(record::key_hash(key))
                .is_some_and(|c| c.element(sub_hash(ty, sub)).is_some()))
    }

    /// Loads the live element `sub` (by its hash) of the collection `kh` (`key`, `version`)
    /// into `scratch`: its header, `None` when the element is gone or its record names
    /// another element (a 128-bit hash collision, logged).
    pub(super) fn load_element(
        &mut self,
        kh: Hash,
        key: &[u8],
        version: u64,
        sub: Hash,
    ) -> StoreResult<Option<Header>> {
        let Some((ty, a)) = self
            .colls
            .get(kh)
            .and_then(|c| Some((c.ty, c.element(sub)?)))
        else {
            return Ok(None);
        };
        if a >= self.durable_end {
            self.undurable = true;
        }
        let hdr = self.load(a)?;
        let ok = decode_composite(&self.scratch[hdr.key_range()])
            .is_some_and(|c| c.key == key && c.version == version && sub_hash(ty, c.sub) == sub);
        if !ok {
            tracing::error!("element record does not match its collection; skipped");
            return Ok(None);
        }
        Ok(Some(hdr))
    }

    /// Calls `f` with the sub-key and value of the element record in `scratch`.
    fn with_element(&self, hdr: &Header, f: &mut dyn FnMut(&[u8], &[u8])) {
        let c = decode_composite(&self.scratch[hdr.key_range()]).expect("checked on load");
        f(c.sub, &self.scratch[hdr.value_range()]);
    }

    /// One step of a walk over the live elements of the collection of type `ty` at `key`
    /// (HSCAN, SSCAN, and whole with `count` = `usize::MAX`: HGETALL, SMEMBERS): `f` gets
    /// the sub-key and value of about `count` elements from `cursor` on; returns the next
    /// cursor, 0 when the walk is complete. The order is the sub-keys' hashes (the cursor is
    /// the first 64 bits of the next one), which no insertion or removal changes: an
    /// element present for the whole walk is returned at least once. An element on storage
    /// is read while the step runs.
    pub fn coll_scan(
        &mut self,
        ty: CollType,
        key: &[u8],
        cursor: u64,
        count: usize,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<u64> {
        let Some(version) = self.coll_of(key, ty)? else {
            return Ok(0);
        };
        let kh = record::key_hash(key);
        let mut subs = std::mem::take(&mut self.step);
        subs.clear();
        let mut next = 0;
        if let Some(c) = self.colls.get(kh) {
            for (&sub, &a) in c.elems.range((cursor, 0)..) {
                if a & ELEMENT_TOMB != 0 {
                    continue;
                }
                if subs.len() >= count.max(1) && sub.0 != subs.last().map_or(cursor, |l| l.0) {
                    // The next step starts at this hash (never inside a run of equal first
                    // halves, so that the walk always moves on).
                    next = sub.0;
                    break;
                }
                subs.push(sub);
            }
        }
        let r = (|| {
            for &sub in &subs {
                if let Some(hdr) = self.load_element(kh, key, version, sub)? {
                    self.with_element(&hdr, f);
                }
            }
            Ok(())
        })();
        self.step = subs;
        r.map(|()| next)
    }

    /// Random elements of the collection of type `ty` at `key` (HRANDFIELD, SRANDMEMBER,
    /// SPOP): `count` distinct ones (all, in hash order, when `count` ≥ the length), or with
    /// `repeat`, `count` independent draws. `f` gets each element's sub-key and value.
    pub fn coll_random(
        &mut self,
        ty: CollType,
        key: &[u8],
        count: usize,
        repeat: bool,
        f: &mut dyn FnMut(&[u8], &[u8]),
    ) -> StoreResult<()> {
        let Some(version) = self.coll_of(key, ty)? else {
            return Ok(());
        };
        let kh = record::key_hash(key);
        if repeat || count == 1 {
            // Independent draws (or one): uniform indexes into the array of elements, built
            // once and kept by the writes (no walk of the collection per draw).
            if let Some(c) = self.colls.get_mut(kh) {
                if c.picks.is_none() {
                    c.picks = Some(Box::new(crate::collmap::Picks::of(c)));
                }
            }
            let draws = if repeat { count } else { 1 };
            // A single pick drawn ahead, while it is still an element.
            let mut drawn = self
                .drawn
                .take()
                .filter(|&(k, sub)| {
                    !repeat
                        && k == kh
                        && self.colls.get(kh).is_some_and(|c| c.element(sub).is_some())
                })
                .map(|(_, sub)| sub);
            for _ in 0..draws {
                let r = self.random();
                let Some(sub) = drawn.take().or_else(|| {
                    self.colls
                        .get(kh)
                        .and_then(|c| c.picks.as_deref())
                        .filter(|p| !p.is_empty())
                        .map(|p| p.get((r % p.len() as u64) as usize))
                }) else {
                    break;
                };
                if let Some(hdr) = self.load_element(kh, key, version, sub)? {
                    self.with_element(&hdr, f);
                }
            }
            return Ok(());
        }
        let mut subs = std::mem::take(&mut self.step);
        subs.clear();
        if let Some(c) = self.colls.get(kh) {
            subs.extend(c.live_subs());
        }
        let n = subs.len();
        let picks = if n == 0 {
            0
        } else if repeat {
            count
        } else if count >= n {
            n
        } else {
            // A partial Fisher-Yates shuffle: the first `count` are a uniform sample.
            for i in 0..count {
                let j = i + (self.random() % (n - i) as u64) as usize;
                subs.swap(i, j);
            }
            count
        };
        let r = (|| {
            for i in 0..picks {
                let sub = if repeat {
                    subs[(self.random() % n as u64) as usize]
                } else {
                    subs[i]
                };
                if let Some(hdr) = self.load_element(kh, key, version, sub)? {
                    self.with_element(&hdr, f);
                }
            }
            Ok(())
        })();
        self.step = subs;
        r
    }

    /// Writes a copy of the collection at `src` as a new collection at `dst` with expiry
    /// `expire_ms` (RENAME, COPY of a collection): a metadata record of a new version, then
    /// one element record per live element of `src`. `dst` must not be live (the caller
    /// deletes it first); false when `src` is not a collection.
    pub fn coll_copy(&mut self, src: &[u8], dst: &[u8], expire_ms: u64) -> StoreResult<bool> {
        let Some(ty) = self.coll_type(src)? else {
            return Ok(false);
        };
        // Gone in between (its expiry passed): nothing to copy.
        let Some(version) = self.coll_of(src, ty)? else {
            return Ok(false);
        };
        self.check_sizes(dst, 0)?;
        let sh = record::key_hash(src);
        // In order: a list's copy takes the source's positions from the head on.
        let subs: Vec<Hash> = self
            .colls
            .get(sh)
            .map_or(Vec::new(), |c| c.live_subs().collect());
        let meta = Meta {
            ty,
            version: self.seq + 1,
        };
        self.append(
            record::key_hash(dst),
            KIND_META,
            dst,
            &encode_meta(meta),
            expire_ms,
        )?;
        let (mut sub, mut value) = (Vec::new(), Vec::new());
        for s in subs {
            // The source's element is looked up again: writing may have compacted (moved) it.
            let Some(hdr) = self.load_element(sh, src, version, s)? else {
                continue;
            };
            self.with_element(&hdr, &mut |k, v| {
                sub.clear();
                sub.extend_from_slice(k);
                value.clear();
                value.extend_from_slice(v);
            });
            self.append_element(dst, meta.version, &sub, Some(&value))?;
        }
        Ok(true)
    }

    /// The log address of a hash field's record when it is on storage only (a command that
    /// reads it fetches it first); `None` when it is in memory or missing.
    pub fn element_storage_addr(&self, key: &[u8], field: &[u8]) -> Option<u64> {
        let c = self.colls.get(record::key_hash(key))?;
        let a = c.element(sub_hash(c.ty, field))?;
        (a < self.head && a >= self.begin).then_some(a)
    }

    /// Draws now the element that the next single random pick of `key`'s collection takes
    /// (uniformly, as the pick would; [`Store::set_drawn`] hands it back when that command
    /// runs): (key hash, sub-key hash), and its record's address when it is on storage (to
    /// read ahead).
    pub fn draw_element(&mut self, key: &[u8]) -> Option<(Hash, Hash, Option<u64>)> {
        let kh = record::key_hash(key);
        let c = self.colls.get_mut(kh).filter(|c| c.ty != CollType::List)?;
        if c.picks.is_none() {
            c.picks = Some(Box::new(crate::collmap::Picks::of(c)));
        }
        let r = self.random();
        let c = self.colls.get(kh)?;
        let p = c.picks.as_deref().filter(|p| !p.is_empty())?;
        let sub = p.get((r % p.len() as u64) as usize);
        let a = c.element(sub)?;
        Some((kh, sub, (a < self.head && a >= self.begin).then_some(a)))
    }

    /// The element drawn ahead for the command about to run (or none).
    pub fn set_drawn(&mut self, d: Option<(Hash, Hash)>) {
        self.drawn = d;
    }

    /// The log address of a list element's record (`index`: from the head, negative from
    /// the end) when it is on storage only; `None` when it is in memory or missing.
    pub fn list_storage_addr(&self, key: &[u8], index: i64) -> Option<u64> {
        let c = self
            .colls
            .get(record::key_hash(key))
            .filter(|c| c.ty == CollType::List)?;
        let len = c.list.len() as i64;
        let i = if index < 0 { len + index } else { index };
        let a = *c.list.get(usize::try_from(i).ok()?)?;
        (a < self.head && a >= self.begin).then_some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open, small};
    use super::*;
    use std::collections::HashMap;

    type Model = HashMap<Vec<u8>, HashMap<Vec<u8>, Vec<u8>>>;

    fn check(s: &mut Store, model: &Model, keys: &[Vec<u8>]) {
        for k in keys {
            let m = model.get(k);
            assert_eq!(
                s.coll_len(CollType::Hash, k).unwrap(),
                m.map_or(0, |m| m.len() as u64),
                "HLEN {k:?}"
            );
            assert_eq!(
                s.coll_type(k).unwrap(),
                m.map(|_| CollType::Hash),
                "TYPE {k:?}"
            );
            for f in 0..60u32 {
                let field = format!("field:{f}").into_bytes();
                let got = s
                    .element_get_with(CollType::Hash, k, &field, |v| v.map(<[u8]>::to_vec))
                    .unwrap();
                assert_eq!(got.as_ref(), m.and_then(|m| m.get(&field)), "{k:?} {f}");
            }
        }
    }

    /// Hashes written, overwritten, deleted and replaced by strings through eviction,
    /// compaction (the log wraps many times) and restarts, against a model, in each durable
    /// mode.
    #[test]
    fn hashes_survive_eviction_compaction_and_restarts() {
        for durability in [Durability::Periodic, Durability::Fsync] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = || small(durability);
            let mut s = open(dir.path(), cfg());
            let keys: Vec<Vec<u8>> = (0..4).map(|k| format!("hash:{k}").into_bytes()).collect();
            let mut model: Model = HashMap::new();
            let mut x = 7u64;
            let mut compactions = 0;
            for step in 0..6000u32 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let k = &keys[(x >> 40) as usize % keys.len()];
                let field = format!("field:{}", (x >> 20) % 60).into_bytes();
                match (x >> 50) % 16 {
                    0..=10 => {
                        let v = vec![(step % 251) as u8; 50 + (x >> 8) as usize % 300];
                        let new = s.element_put(CollType::Hash, k, &field, &v).unwrap();
                        let m = model.entry(k.clone()).or_default();
                        assert_eq!(new, m.insert(field, v).is_none());
                    }
                    11..=13 => {
                        let had = s.element_del(CollType::Hash, k, &field).unwrap();
                        let m = model.get_mut(k);
                        assert_eq!(had, m.is_some_and(|m| m.remove(&field).is_some()));
                        if model.get(k).is_some_and(|m| m.is_empty()) {
                            model.remove(k);
                        }
                    }
                    14 => {
                        assert_eq!(s.del(k).unwrap(), model.remove(k).is_some());
                    }
                    _ => {
                        // A string over a hash, then read as a hash: WRONGTYPE; deleted again.
                        s.set(k, b"str", SetCond::Always, Expiry::None, None)
                            .unwrap();
                        model.remove(k);
                        assert!(matches!(
                            s.element_get_with(CollType::Hash, k, b"f", |_| ()),
                            Err(StoreError::WrongType)
                        ));
                        assert!(matches!(
                            s.element_put(CollType::Hash, k, b"f", b"v"),
                            Err(StoreError::WrongType)
                        ));
                        assert!(s.del(k).unwrap());
                    }
                }
                if step % 1500 == 1499 {
                    // A crash right after a commit: nothing acknowledged is lost.
                    s.commit().unwrap();
                    compactions += s.stats().compactions;
                    drop(s);
                    s = open(dir.path(), cfg());
                    check(&mut s, &model, &keys);
                }
            }
            compactions += s.stats().compactions;
            assert!(compactions > 10, "{compactions} compactions");
            assert!(
                s.addresses()[4] > 2 * s.config().log_size,
                "the log wrapped"
            );
            check(&mut s, &model, &keys);
            assert_eq!(s.len(), model.len() as u64);
            // A string read of a hash is WRONGTYPE; an expiry keeps the hash.
            if let Some(k) = model.keys().next().cloned() {
                assert!(matches!(s.get_with(&k, |_| ()), Err(StoreError::WrongType)));
                assert!(s.set_expiry(&k, super::now_ms() + 1_000_000).unwrap());
                assert!(s.set_expiry(&k, 0).unwrap());
                check(&mut s, &model, &keys);
            }
            s.close().unwrap();
            let mut s = open(dir.path(), cfg());
            check(&mut s, &model, &keys);
            assert_eq!(s.len(), model.len() as u64);
        }
    }

    /// A walk of HSCAN steps returns every field present for the whole walk at least once,
    /// while fields come and go and the elements are on storage; random picks are distinct
    /// (or repeat when asked); a copy is whole and survives a restart, the source untouched.
    #[test]
    fn walks_random_picks_and_copies_of_a_hash_on_storage() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = || StoreConfig {
            log_size: 64 * (64 << 10),
            ..small(Durability::Fsync)
        };
        let mut s = open(dir.path(), cfg());
        let h = CollType::Hash;
        let field = |i: u32| format!("field:{i}").into_bytes();
        for i in 0..3000 {
            s.element_put(h, b"big", &field(i), &[i as u8; 100])
                .unwrap();
        }
        assert!(
            s.element_storage_addr(b"big", &field(0)).is_some(),
            "on storage"
        );
        // The walk: fields 0..3000 stay; 3000.. come during the walk; the odd ones below
        // 3000 of the last third go.
        let mut seen = std::collections::HashSet::new();
        let (mut cursor, mut steps) = (0, 0);
        loop {
            cursor = s
                .coll_scan(h, b"big", cursor, 100, &mut |f, v| {
                    assert!(v.len() == 100 || v == b"new", "{v:?}");
                    seen.insert(f.to_vec());
                })
                .unwrap();
            steps += 1;
            s.element_put(h, b"big", &field(3000 + steps), b"new")
                .unwrap();
            s.element_del(h, b"big", &field(2000 + 2 * steps + 1))
                .unwrap();
            if cursor == 0 {
                break;
            }
        }
        assert!(steps > 20, "{steps} steps");
        for i in (0..2000).chain((2000..3000).step_by(2)) {
            assert!(seen.contains(&field(i)), "field {i} was never returned");
        }
        let len = s.coll_len(h, b"big").unwrap() as usize;
        let mut picks = Vec::new();
        s.coll_random(h, b"big", 50, false, &mut |f, _| picks.push(f.to_vec()))
            .unwrap();
        let distinct: std::collections::HashSet<_> = picks.iter().collect();
        assert_eq!((picks.len(), distinct.len()), (50, 50));
        picks.clear();
        s.coll_random(h, b"big", len + 10, false, &mut |f, _| {
            picks.push(f.to_vec())
        })
        .unwrap();
        assert_eq!(
            picks.len(),
            len,
            "a count over the length answers every field"
        );
        picks.clear();
        s.coll_random(h, b"big", 5000, true, &mut |f, _| picks.push(f.to_vec()))
            .unwrap();
        let distinct: std::collections::HashSet<_> = picks.iter().collect();
        assert_eq!(picks.len(), 5000);
        assert!(distinct.len() < 5000, "draws with repeats repeat");
        // The copy, then the copy and the source after a restart.
        let all = |s: &mut Store, k: &[u8]| {
            let mut m = std::collections::BTreeMap::new();
            s.coll_scan(h, k, 0, usize::MAX, &mut |f, v| {
                m.insert(f.to_vec(), v.to_vec());
            })
            .unwrap();
            m
        };
        let want = all(&mut s, b"big");
        assert_eq!(want.len(), len);
        s.set(
            b"copy",
            b"a string there",
            SetCond::Always,
            Expiry::None,
            None,
        )
        .unwrap();
        s.del(b"copy").unwrap();
        assert!(s.coll_copy(b"big", b"copy", 0).unwrap());
        assert!(!s.coll_copy(b"nosuch", b"copy2", 0).unwrap());
        assert_eq!(all(&mut s, b"copy"), want);
        s.element_put(h, b"copy", b"only in the copy", b"x")
            .unwrap();
        s.commit().unwrap();
        drop(s);
        let mut s = open(dir.path(), cfg());
        assert_eq!(all(&mut s, b"big"), want);
        let mut copy = want.clone();
        copy.insert(b"only in the copy".to_vec(), b"x".to_vec());
        assert_eq!(all(&mut s, b"copy"), copy);
        assert_eq!(s.coll_type(b"copy").unwrap(), Some(CollType::Hash));
    }

    /// One HSET on a hash of 100,000 fields appends one element record: bytes in proportion
    /// to the field, not to the hash.
    #[test]
    fn one_hset_on_a_large_hash_appends_one_element_record() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            page_size: 1 << 20,
            memory: 8 << 20,
            log_size: 64 << 20,
            max_key: 64,
            max_value: 4096,
            durability: Durability::Periodic,
            offload: false,
        };
        let mut s = open(dir.path(), cfg);
        for f in 0..100_000u32 {
            assert!(s
                .element_put(CollType::Hash, b"big", format!("f{f}").as_bytes(), b"value")
                .unwrap());
        }
        assert_eq!(s.coll_len(CollType::Hash, b"big").unwrap(), 100_000);
        for (field, value) in [(&b"f5"[..], &b"new value"[..]), (b"brand-new-field", b"v")] {
            let before = s.addresses()[4];
            s.element_put(CollType::Hash, b"big", field, value).unwrap();
            let appended = s.addresses()[4] - before;
            let element = (record::HEADER + field.len() + value.len()) as u64;
            assert_eq!(
                appended,
                record::record_len(10 + 3 + field.len(), value.len()) as u64
            );
            assert!(appended <= 2 * element, "{appended} bytes for {element}");
        }
        assert_eq!(s.coll_len(CollType::Hash, b"big").unwrap(), 100_001);
    }

    /// A field whose record left memory is read back from storage, with a small memory.
    #[test]
    fn a_field_evicted_to_storage_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), small(Durability::Periodic));
        s.element_put(CollType::Hash, b"h", b"first", b"the first value")
            .unwrap();
        let mut n = 0u32;
        while s.element_storage_addr(b"h", b"first").is_none() {
            s.set(
                format!("fill{n}").as_bytes(),
                &[1; 2000],
                SetCond::Always,
                Expiry::None,
                None,
            )
            .unwrap();
            n += 1;
            assert!(n < 1000, "the field never left memory");
        }
        let reads = s.stats().storage_reads;
        let got = s
            .element_get_with(CollType::Hash, b"h", b"first", |v| v.map(<[u8]>::to_vec))
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"the first value"[..]));
        assert_eq!(s.stats().storage_reads, reads + 1);
    }

    /// Sets on the same records: members with empty values; a set and a hash at one key
    /// exclude each other (WRONGTYPE); membership needs no record read.
    #[test]
    fn sets_are_members_without_values_and_types_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path(), small(Durability::Fsync));
        let set = CollType::Set;
        assert!(s.element_put(set, b"s", b"a", b"").unwrap());
        assert!(s.element_put(set, b"s", b"b", b"").unwrap());
        assert!(!s.element_put(set, b"s", b"a", b"").unwrap());
        assert_eq!(s.coll_len(set, b"s").unwrap(), 2);
        let reads = s.stats().memory_reads + s.stats().storage_reads;
        assert!(s.element_exists(set, b"s", b"a").unwrap());
        assert!(!s.element_exists(set, b"s", b"c").unwrap());
        assert_eq!(s.stats().memory_reads + s.stats().storage_reads, reads);
        assert_eq!(s.coll_type(b"s").unwrap(), Some(CollType::Set));
        assert!(matches!(
            s.element_put(CollType::Hash, b"s", b"f", b"v"),
            Err(StoreError::WrongType)
        ));
        assert!(matches!(
            s.coll_len(CollType::Hash, b"s"),
            Err(StoreError::WrongType)
        ));
        assert!(s.element_del(set, b"s", b"a").unwrap());
        assert!(!s.element_del(set, b"s", b"a").unwrap());
        s.commit().unwrap();
        drop(s);
        let mut s = open(dir.path(), small(Durability::Fsync));
        assert_eq!(s.coll_len(set, b"s").unwrap(), 1);
        assert!(s.element_exists(set, b"s", b"b").unwrap());
        // Removing the last member deletes the key; it can then hold a hash.
        assert!(s.element_del(set, b"s", b"b").unwrap());
        assert!(!s.exists(b"s").unwrap());
        assert_eq!(s.len(), 0);
        assert!(s.element_put(CollType::Hash, b"s", b"f", b"v").unwrap());
        assert_eq!(s.coll_type(b"s").unwrap(), Some(CollType::Hash));
    }
}
