//! Sorted sets on the log (`docs/kv-service.md` §7): a member's score is its element record's
//! value; the order is a [`ZIndex`] in memory, built from the records when an ordered command
//! first needs it and kept up to date by every write after that.

use super::*;
use crate::collection::{decode_score, encode_score, CollType};
use crate::zindex::ZIndex;

const ZSET: CollType = CollType::ZSet;

impl Store {
    /// A member's score (`None`: no such member or key); WRONGTYPE for another type.
    pub fn zscore(&mut self, key: &[u8], member: &[u8]) -> StoreResult<Option<f64>> {
        self.element_get_with(ZSET, key, member, |v| v.and_then(decode_score))
    }

    /// Sets a member's score, creating the sorted set (ZADD, ZINCRBY): whether the member
    /// is new.
    pub fn zadd(&mut self, key: &[u8], member: &[u8], score: f64) -> StoreResult<bool> {
        assert!(!score.is_nan(), "a NaN score");
        let old = self.zscore(key, member)?;
        let new = self.element_put(ZSET, key, member, &encode_score(score))?;
        if let Some(z) = self.zindex_mut(key) {
            if let Some(o) = old {
                z.remove(o, member);
            }
            z.insert(score, member);
        }
        Ok(new)
    }

    /// Removes a member (ZREM): whether it was there.
    pub fn zrem(&mut self, key: &[u8], member: &[u8]) -> StoreResult<bool> {
        let Some(old) = self.zscore(key, member)? else {
            return Ok(false);
        };
        self.element_del(ZSET, key, member)?;
        if let Some(z) = self.zindex_mut(key) {
            z.remove(old, member);
        }
        Ok(true)
    }

    /// Removes a member whose score the caller has from the order (ZPOPMIN, ZPOPMAX): no
    /// record is read. Whether it was there.
    pub fn zrem_scored(&mut self, key: &[u8], member: &[u8], score: f64) -> StoreResult<bool> {
        if !self.element_del(ZSET, key, member)? {
            return Ok(false);
        }
        if let Some(z) = self.zindex_mut(key) {
            z.remove(score, member);
        }
        Ok(true)
    }

    fn zindex_mut(&mut self, key: &[u8]) -> Option<&mut ZIndex> {
        self.colls
            .get_mut(record::key_hash(key))
            .and_then(|c| c.zindex.as_deref_mut())
    }

    /// The order of the live sorted set at `key`, built from its records when it is not yet
    /// (every element record is read once); `None` for a missing key.
    fn zindex(&mut self, key: &[u8]) -> StoreResult<Option<&ZIndex>> {
        if self.coll_len(ZSET, key)? == 0 {
            return Ok(None);
        }
        let kh = record::key_hash(key);
        if self.colls.get(kh).is_some_and(|c| c.zindex.is_none()) {
            let mut z = ZIndex::default();
            self.coll_scan(ZSET, key, 0, usize::MAX, &mut |m, v| {
                if let Some(s) = decode_score(v) {
                    z.insert(s, m);
                }
            })?;
            if let Some(c) = self.colls.get_mut(kh) {
                c.zindex = Some(Box::new(z));
            }
        }
        Ok(self.colls.get(kh).and_then(|c| c.zindex.as_deref()))
    }

    /// The number of members for which `before` holds (a prefix of the order: "score below
    /// the minimum", ...); 0 for a missing key.
    pub fn zcount_before(
        &mut self,
        key: &[u8],
        before: crate::zindex::Before<'_>,
    ) -> StoreResult<usize> {
        Ok(self.zindex(key)?.map_or(0, |z| z.count_before(before)))
    }

    /// Calls `f` with the members of ranks `from..to` (0: the lowest score) in order, or in
    /// reverse order with `rev`; reads no record once the order is built.
    pub fn zrange(
        &mut self,
        key: &[u8],
        from: usize,
        to: usize,
        rev: bool,
        f: &mut dyn FnMut(&[u8], f64),
    ) -> StoreResult<()> {
        let Some(z) = self.zindex(key)? else {
            return Ok(());
        };
        z.visit(from, to.min(z.len()), rev, &mut |s, m| f(m, s));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{open, small};
    use super::*;

    /// Scores, ranks and ranges against a model, through eviction, restarts (the order is
    /// rebuilt from the records) and a DEL.
    #[test]
    fn sorted_sets_keep_redis_order_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = || small(Durability::Fsync);
        let mut s = open(dir.path(), cfg());
        let mut model: std::collections::BTreeMap<Vec<u8>, f64> = Default::default();
        let mut x = 11u64;
        for step in 0..4000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = format!("m{}", (x >> 33) % 300).into_bytes();
            if (x >> 20).is_multiple_of(4) {
                assert_eq!(s.zrem(b"z", &m).unwrap(), model.remove(&m).is_some());
            } else {
                let score = ((x >> 40) % 50) as f64 - 25.0;
                let new = s.zadd(b"z", &m, score).unwrap();
                assert_eq!(new, model.insert(m, score).is_none());
            }
            if step % 1000 == 999 {
                let mut want: Vec<(f64, Vec<u8>)> =
                    model.iter().map(|(m, &sc)| (sc, m.clone())).collect();
                want.sort_by(|a, b| crate::zindex::order((a.0, &a.1), (b.0, &b.1)));
                let mut got = Vec::new();
                s.zrange(b"z", 0, usize::MAX, false, &mut |m, sc| {
                    got.push((sc, m.to_vec()))
                })
                .unwrap();
                assert_eq!(got, want, "step {step}");
                let below = s.zcount_before(b"z", &|k| k.0 < 0.0).unwrap();
                assert_eq!(below, want.iter().filter(|w| w.0 < 0.0).count());
                let mut top = Vec::new();
                s.zrange(b"z", want.len() - 3, want.len(), true, &mut |m, _| {
                    top.push(m.to_vec())
                })
                .unwrap();
                let mut expect: Vec<Vec<u8>> =
                    want[want.len() - 3..].iter().map(|w| w.1.clone()).collect();
                expect.reverse();
                assert_eq!(top, expect);
                s.commit().unwrap();
                drop(s);
                s = open(dir.path(), cfg());
            }
        }
        assert!(s.zscore(b"z", b"nosuch").unwrap().is_none());
        assert!(s.del(b"z").unwrap());
        assert_eq!(s.zcount_before(b"z", &|_| true).unwrap(), 0);
    }
}
