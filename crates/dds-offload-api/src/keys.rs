//! A fixed-capacity map from cache keys to a small number, for the director's masks: the keys
//! of host-bound requests that a connection's later lookups must miss. Lookups are O(1)
//! whatever the number of keys; nothing allocates after construction; clearing is O(1).
//!
//! Open addressing with linear probing and backward-shift deletion. A slot is occupied when
//! its stamp equals the map's generation, so `clear` only bumps the generation.

/// The map is full (its capacity is fixed at construction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key map full")]
pub struct MapFull;

/// Keys → `u32` values, at most `capacity` keys.
#[derive(Clone, Debug)]
pub struct KeyMap {
    keys: Box<[u64]>,
    vals: Box<[u32]>,
    stamps: Box<[u32]>,
    gen: u32,
    len: usize,
    cap: usize,
    mask: usize,
}

#[inline]
fn hash(k: u64) -> u64 {
    // fmix64 of MurmurHash3: every key bit reaches the low bits.
    let mut h = k;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl KeyMap {
    /// A map for up to `capacity` keys (slots: twice that, rounded up to a power of two).
    pub fn with_capacity(capacity: usize) -> KeyMap {
        let cap = capacity.max(1);
        let slots = (cap * 2).next_power_of_two();
        KeyMap {
            keys: vec![0; slots].into_boxed_slice(),
            vals: vec![0; slots].into_boxed_slice(),
            stamps: vec![0; slots].into_boxed_slice(),
            gen: 1,
            len: 0,
            cap,
            mask: slots - 1,
        }
    }

    /// Keys in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No keys.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most keys.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Removes every key (O(1)).
    pub fn clear(&mut self) {
        self.len = 0;
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            self.stamps.fill(0);
            self.gen = 1;
        }
    }

    #[inline]
    fn occupied(&self, i: usize) -> bool {
        self.stamps[i] == self.gen
    }

    /// Slot of `key`, or the empty slot where it would go.
    #[inline]
    fn find(&self, key: u64) -> (usize, bool) {
        let mut i = hash(key) as usize & self.mask;
        loop {
            if !self.occupied(i) {
                return (i, false);
            }
            if self.keys[i] == key {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        if self.len == 0 {
            // The common case on a read path: nothing pending, no probe into the table.
            return None;
        }
        match self.find(key) {
            (i, true) => Some(self.vals[i]),
            _ => None,
        }
    }

    /// Whether `key` is in the map.
    #[inline]
    pub fn contains(&self, key: u64) -> bool {
        self.len != 0 && self.find(key).1
    }

    /// Sets `key`'s value to `f(old)` (`f(None)` for a new key).
    pub fn update(&mut self, key: u64, f: impl FnOnce(Option<u32>) -> u32) -> Result<(), MapFull> {
        match self.find(key) {
            (i, true) => {
                self.vals[i] = f(Some(self.vals[i]));
                Ok(())
            }
            (i, false) => {
                if self.len == self.cap {
                    return Err(MapFull);
                }
                self.keys[i] = key;
                self.vals[i] = f(None);
                self.stamps[i] = self.gen;
                self.len += 1;
                Ok(())
            }
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        let (mut hole, found) = self.find(key);
        if !found {
            return None;
        }
        let val = self.vals[hole];
        self.stamps[hole] = 0;
        self.len -= 1;
        // Backward shift: move later entries of the probe run into the hole when their home
        // slot does not lie between the hole and them.
        let mut j = (hole + 1) & self.mask;
        while self.occupied(j) {
            let home = hash(self.keys[j]) as usize & self.mask;
            let dist_j = j.wrapping_sub(home) & self.mask;
            let dist_hole = j.wrapping_sub(hole) & self.mask;
            if dist_j >= dist_hole {
                self.keys[hole] = self.keys[j];
                self.vals[hole] = self.vals[j];
                self.stamps[hole] = self.gen;
                self.stamps[j] = 0;
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        Some(val)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn matches_a_hash_map_model() {
        let mut m = KeyMap::with_capacity(64);
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..20_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct keys, so collisions, updates and removals are frequent.
            let key = (x >> 20) % 97;
            match x % 5 {
                0 | 1 => {
                    let r = m.update(key, |old| old.map_or(step, |o| o.min(step)));
                    if model.len() < 64 || model.contains_key(&key) {
                        r.unwrap();
                        let e = model.entry(key).or_insert(step);
                        *e = (*e).min(step);
                    } else {
                        assert_eq!(r, Err(MapFull));
                    }
                }
                2 => assert_eq!(m.remove(key), model.remove(&key)),
                3 if step % 1000 == 0 => {
                    m.clear();
                    model.clear();
                }
                _ => assert_eq!(m.get(key), model.get(&key).copied()),
            }
            assert_eq!(m.len(), model.len());
        }
        for (k, v) in &model {
            assert_eq!(m.get(*k), Some(*v));
        }
    }
}
