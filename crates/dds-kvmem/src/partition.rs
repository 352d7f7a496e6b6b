//! One partition: a circular log and a bucketized index (`docs/dpu-kv.md` §1).
//!
//! Log item (8-byte aligned): `klen u16, pad u16 = 0, vlen u32`, then the key and the value,
//! zero-padded to 8. `klen = 0xFFFF` marks the unused end of the log before it wraps.

/// Slots per bucket.
const SLOTS: usize = 7;
/// Item header bytes.
const ITEM_HEADER: usize = 8;
/// Marks the rest of the log before the wrap as unused.
const WRAP: u16 = 0xFFFF;
/// Largest key.
pub const MAX_KEY: usize = 0xFFFE;

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The live items do not fit the partition's memory (nothing was evicted).
    #[error("out of memory: the partition's memory budget is full")]
    Full,
    /// The index has no free slot for the key's bucket.
    #[error("out of memory: the partition's index is full")]
    IndexFull,
    /// The item is larger than the partition's log allows.
    #[error("item too large for the partition ({0} bytes at most)")]
    TooLarge(usize),
    /// The value is not a base-10 64-bit integer (INCR).
    #[error("value is not an integer or out of range")]
    NotInteger,
    /// INCR would overflow.
    #[error("increment or decrement would overflow")]
    Overflow,
    /// A partition needs at least 4 KiB.
    #[error("partition memory too small")]
    TooSmall,
    /// An index of more than half the partition's memory leaves too little log.
    #[error("index larger than half the partition's memory")]
    IndexTooLarge,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionStats {
    /// Items.
    pub items: u64,
    /// Bytes of live items in the log.
    pub live_bytes: u64,
    /// Log bytes.
    pub capacity: u64,
    /// Updates done in place.
    pub in_place: u64,
    /// Items moved by compaction.
    pub moved: u64,
}

#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Bucket {
    slots: [u64; SLOTS],
    /// Index + 1 of the overflow bucket, 0 for none.
    next: u64,
}

/// A partition of the store, owned by one worker.
pub struct Partition {
    log: Box<[u8]>,
    cap: u64,
    /// Logical addresses: items live in `[head, tail)`.
    head: u64,
    tail: u64,
    buckets: Vec<Bucket>,
    nmain: usize,
    spare: Vec<usize>,
    stats: PartitionStats,
}

fn item_len(klen: usize, vlen: usize) -> usize {
    (ITEM_HEADER + klen + vlen).next_multiple_of(8)
}

/// A hint to load the cache line at `p`: it never faults and changes nothing (a no-op where
/// there is no prefetch instruction to give).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it reads nothing architecturally and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint: it reads nothing architecturally and never faults.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

fn tag_of(hash: u64) -> u64 {
    ((hash >> 48) | 1) & 0xFFFF
}

const OFF_MASK: u64 = (1 << 48) - 1;

impl Partition {
    /// A partition of `memory` bytes: seven eighths for the log, the rest for the index.
    pub fn new(memory: usize) -> Result<Partition, KvError> {
        Partition::with_index(memory, Partition::default_index(memory))
    }

    /// The index bytes of [`Partition::new`]: an eighth of the memory.
    pub fn default_index(memory: usize) -> usize {
        memory / 8
    }

    /// A partition of `memory` bytes of which `index_bytes` (rounded down to whole 64-byte
    /// buckets, at least two) are the index and the rest the log (MICA sizes the two apart).
    /// An index sized to the keys rather than to the memory keeps lookups in cache: an index
    /// much larger than its keys spreads them over more cache lines and pages than there are
    /// keys.
    pub fn with_index(memory: usize, index_bytes: usize) -> Result<Partition, KvError> {
        if memory < 4096 {
            return Err(KvError::TooSmall);
        }
        if index_bytes > memory / 2 {
            return Err(KvError::IndexTooLarge);
        }
        let nb = (index_bytes / 64).max(2);
        let nmain = (nb * 7 / 8).max(1);
        let cap = ((memory - nb * 64) as u64) & !7;
        // Lookups read the index and the log at random: huge pages spare them a page walk
        // each. The log is zeroed by the allocator without being touched, so the advice
        // reaches all of it; the index is advised before it is written.
        let mut log = vec![0u8; cap as usize].into_boxed_slice();
        dds_sys::advise_huge_pages(&mut log);
        let mut buckets = Vec::with_capacity(nb);
        dds_sys::advise_huge_pages(buckets.spare_capacity_mut());
        buckets.resize(nb, Bucket::default());
        Ok(Partition {
            log,
            cap,
            head: 0,
            tail: 0,
            buckets,
            nmain,
            spare: (nmain..nb).rev().collect(),
            stats: PartitionStats {
                capacity: cap,
                ..PartitionStats::default()
            },
        })
    }

    /// Items.
    pub fn len(&self) -> u64 {
        self.stats.items
    }

    /// No items.
    pub fn is_empty(&self) -> bool {
        self.stats.items == 0
    }

    /// Counters.
    pub fn stats(&self) -> PartitionStats {
        self.stats
    }

    fn phys(&self, a: u64) -> usize {
        (a % self.cap) as usize
    }

    fn header(&self, a: u64) -> (usize, usize) {
        let p = self.phys(a);
        let h = &self.log[p..p + ITEM_HEADER];
        (
            u16::from_le_bytes([h[0], h[1]]) as usize,
            u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize,
        )
    }

    fn key_at(&self, a: u64) -> &[u8] {
        let (k, _) = self.header(a);
        let p = self.phys(a) + ITEM_HEADER;
        &self.log[p..p + k]
    }

    /// The slot (bucket, index) holding `key`, if any.
    fn find(&self, key: &[u8], hash: u64) -> Option<(usize, usize)> {
        let tag = tag_of(hash);
        let mut b = (hash % self.nmain as u64) as usize;
        loop {
            for (i, &s) in self.buckets[b].slots.iter().enumerate() {
                if s != 0 && s >> 48 == tag {
                    let a = (s & OFF_MASK) - 1;
                    if self.key_at(a) == key {
                        return Some((b, i));
                    }
                }
            }
            match self.buckets[b].next {
                0 => return None,
                n => b = n as usize - 1,
            }
        }
    }

    /// A free slot in the key's bucket chain (linking a spare bucket if needed).
    fn free_slot(&mut self, hash: u64) -> Result<(usize, usize), KvError> {
        let mut b = (hash % self.nmain as u64) as usize;
        loop {
            if let Some(i) = self.buckets[b].slots.iter().position(|&s| s == 0) {
                return Ok((b, i));
            }
            match self.buckets[b].next {
                0 => {
                    let n = self.spare.pop().ok_or(KvError::IndexFull)?;
                    self.buckets[n] = Bucket::default();
                    self.buckets[b].next = n as u64 + 1;
                    return Ok((n, 0));
                }
                n => b = n as usize - 1,
            }
        }
    }

    fn slot_addr(&self, (b, i): (usize, usize)) -> u64 {
        (self.buckets[b].slots[i] & OFF_MASK) - 1
    }

    fn set_slot(&mut self, (b, i): (usize, usize), hash: u64, a: u64) {
        self.buckets[b].slots[i] = (tag_of(hash) << 48) | ((a + 1) & OFF_MASK);
    }

    /// Starts loading the index bucket of `hash` into the cache, without waiting for it: the
    /// first stage of MICA's batch prefetch, so that a batch's lookups wait for memory once
    /// together instead of once each.
    #[inline]
    pub fn prefetch_bucket(&self, hash: u64) {
        let b = (hash % self.nmain as u64) as usize;
        prefetch(std::ptr::from_ref(&self.buckets[b]).cast());
    }

    /// Starts loading the log item that the bucket of `hash` names first with the hash's tag
    /// (the second stage, after [`Partition::prefetch_bucket`] of the batch).
    #[inline]
    pub fn prefetch_item(&self, hash: u64) {
        let tag = tag_of(hash);
        let b = (hash % self.nmain as u64) as usize;
        if let Some(&s) = self.buckets[b]
            .slots
            .iter()
            .find(|&&s| s != 0 && s >> 48 == tag)
        {
            let p = self.phys((s & OFF_MASK) - 1);
            prefetch(self.log[p..].as_ptr());
        }
    }

    /// GET: the value of `key` (`hash` = [`key_hash`](crate::key_hash)`(key)`).
    pub fn get(&self, key: &[u8], hash: u64) -> Option<&[u8]> {
        let s = self.find(key, hash)?;
        let a = self.slot_addr(s);
        let (k, v) = self.header(a);
        let p = self.phys(a) + ITEM_HEADER + k;
        Some(&self.log[p..p + v])
    }

    /// SET.
    pub fn set(&mut self, key: &[u8], hash: u64, value: &[u8]) -> Result<(), KvError> {
        let len = item_len(key.len(), value.len());
        if key.len() > MAX_KEY || len as u64 > self.cap / 4 {
            return Err(KvError::TooLarge((self.cap / 4) as usize));
        }
        if let Some(s) = self.find(key, hash) {
            let a = self.slot_addr(s);
            let (k, v) = self.header(a);
            if item_len(k, v) == len {
                // In place: same footprint.
                let p = self.phys(a);
                self.log[p + 4..p + 8].copy_from_slice(&(value.len() as u32).to_le_bytes());
                self.log[p + ITEM_HEADER + k..p + ITEM_HEADER + k + value.len()]
                    .copy_from_slice(value);
                self.log[p + ITEM_HEADER + k + value.len()..p + len].fill(0);
                self.stats.in_place += 1;
                return Ok(());
            }
            let old = item_len(k, v) as u64;
            let na = self.append(key, value)?;
            self.set_slot(s, hash, na);
            self.stats.live_bytes -= old;
            return Ok(());
        }
        let slot = self.free_slot(hash)?;
        let a = self.append(key, value)?;
        self.set_slot(slot, hash, a);
        self.stats.items += 1;
        Ok(())
    }

    /// DEL: whether the key existed.
    pub fn del(&mut self, key: &[u8], hash: u64) -> bool {
        let Some((b, i)) = self.find(key, hash) else {
            return false;
        };
        let a = self.slot_addr((b, i));
        let (k, v) = self.header(a);
        self.stats.live_bytes -= item_len(k, v) as u64;
        self.buckets[b].slots[i] = 0;
        self.stats.items -= 1;
        true
    }

    /// INCRBY: a missing key counts as 0.
    pub fn incr(&mut self, key: &[u8], hash: u64, by: i64) -> Result<i64, KvError> {
        let cur = match self.get(key, hash) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .filter(|s| !s.is_empty() && !s.starts_with('+'))
                .and_then(|s| s.parse::<i64>().ok().filter(|n| n.to_string() == s))
                .ok_or(KvError::NotInteger)?,
        };
        let n = cur.checked_add(by).ok_or(KvError::Overflow)?;
        self.set(key, hash, n.to_string().as_bytes())?;
        Ok(n)
    }

    /// Appends an item at the tail, compacting the head when the log is full (a key's old
    /// item, if any, stays live and may be moved until its slot points at the new one).
    fn append(&mut self, key: &[u8], value: &[u8]) -> Result<u64, KvError> {
        let len = item_len(key.len(), value.len()) as u64;
        let mut moves = 0u64;
        loop {
            // Room before the physical end, or a wrap marker and room at the start.
            let p = self.phys(self.tail) as u64;
            let need = if p + len > self.cap {
                self.cap - p + len
            } else {
                len
            };
            if self.tail + need <= self.head + self.cap {
                if need != len {
                    let pp = p as usize;
                    self.log[pp..pp + 2].copy_from_slice(&WRAP.to_le_bytes());
                    self.tail += self.cap - p;
                }
                break;
            }
            // Compact the head item: live items move to the tail.
            // At most 3/4 of the log is live, so a lap of compaction always frees room.
            if self.stats.live_bytes + len > self.cap * 3 / 4 || moves > self.cap {
                return Err(KvError::Full);
            }
            moves += self.compact_head()?;
        }
        let a = self.tail;
        let p = self.phys(a);
        let l = len as usize;
        let it = &mut self.log[p..p + l];
        it[0..2].copy_from_slice(&(key.len() as u16).to_le_bytes());
        it[2..4].fill(0);
        it[4..8].copy_from_slice(&(value.len() as u32).to_le_bytes());
        it[ITEM_HEADER..ITEM_HEADER + key.len()].copy_from_slice(key);
        it[ITEM_HEADER + key.len()..ITEM_HEADER + key.len() + value.len()].copy_from_slice(value);
        it[ITEM_HEADER + key.len() + value.len()..].fill(0);
        self.tail += len;
        self.stats.live_bytes += len;
        Ok(a)
    }

    /// Moves the head item to the tail if it is live, then frees it; returns bytes moved.
    fn compact_head(&mut self) -> Result<u64, KvError> {
        let p = self.phys(self.head);
        let klen = u16::from_le_bytes([self.log[p], self.log[p + 1]]);
        if klen == WRAP {
            self.head += self.cap - p as u64;
            return Ok(0);
        }
        let a = self.head;
        let (k, v) = self.header(a);
        let len = item_len(k, v) as u64;
        let key = self.key_at(a).to_vec();
        let hash = crate::key_hash(&key);
        let Some(s) = self.find(&key, hash).filter(|&s| self.slot_addr(s) == a) else {
            self.head += len;
            return Ok(0);
        };
        // The copy needs `len` bytes (plus the rest of the lap if it wraps); freeing the head
        // gives `len`.
        let p2 = self.phys(self.tail) as u64;
        let pad = if p2 + len > self.cap {
            self.cap - p2
        } else {
            0
        };
        if self.tail + pad + len > self.head + len + self.cap {
            return Err(KvError::Full);
        }
        if pad > 0 {
            let pp = p2 as usize;
            self.log[pp..pp + 2].copy_from_slice(&WRAP.to_le_bytes());
            self.tail += pad;
        }
        let na = self.tail;
        let np = self.phys(na);
        self.log.copy_within(p..p + len as usize, np);
        self.head += len;
        self.tail += len;
        self.set_slot(s, hash, na);
        self.stats.moved += 1;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key_hash;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn set(p: &mut Partition, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        p.set(k, key_hash(k), v)
    }

    #[test]
    fn binary_keys_values_and_counters() {
        let mut p = Partition::new(64 << 10).unwrap();
        set(&mut p, b"\x00k", b"\xffv\x00").unwrap();
        assert_eq!(p.get(b"\x00k", key_hash(b"\x00k")), Some(&b"\xffv\x00"[..]));
        assert_eq!(p.incr(b"n", key_hash(b"n"), 5), Ok(5));
        assert_eq!(p.incr(b"n", key_hash(b"n"), -7), Ok(-2));
        assert_eq!(
            p.incr(b"\x00k", key_hash(b"\x00k"), 1),
            Err(KvError::NotInteger)
        );
        set(&mut p, b"m", i64::MAX.to_string().as_bytes()).unwrap();
        assert_eq!(p.incr(b"m", key_hash(b"m"), 1), Err(KvError::Overflow));
        assert!(p.del(b"n", key_hash(b"n")));
        assert!(!p.del(b"n", key_hash(b"n")));
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn an_index_sized_apart_from_the_log_fills_on_its_own() {
        // Four buckets (three main, one spare) of SLOTS slots in 1 MiB of memory: the index
        // fills long before the log, refuses with IndexFull, and keeps every key it took.
        let mut p = Partition::with_index(1 << 20, 4 * 64).unwrap();
        let mut n = 0u32;
        let err = loop {
            match set(&mut p, &n.to_le_bytes(), b"v") {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(err, KvError::IndexFull);
        assert!(n as usize >= SLOTS && n as usize <= 4 * SLOTS, "{n}");
        for i in 0..n {
            assert_eq!(
                p.get(&i.to_le_bytes(), key_hash(&i.to_le_bytes())),
                Some(&b"v"[..])
            );
        }
        // An index of more than half the memory leaves too little log.
        assert_eq!(
            Partition::with_index(1 << 20, (1 << 19) + 64).err(),
            Some(KvError::IndexTooLarge)
        );
        assert_eq!(
            Partition::new(1 << 20).unwrap().nmain,
            (1 << 17) / 64 * 7 / 8
        );
    }

    #[test]
    fn a_full_partition_refuses_and_keeps_everything() {
        let mut p = Partition::new(16 << 10).unwrap();
        let mut n = 0u32;
        let err = loop {
            match set(&mut p, &n.to_le_bytes(), &[n as u8; 100]) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, KvError::Full | KvError::IndexFull), "{err}");
        for i in 0..n {
            assert_eq!(
                p.get(&i.to_le_bytes(), key_hash(&i.to_le_bytes())),
                Some(&[i as u8; 100][..]),
                "item {i}"
            );
        }
        // Deleting makes room again.
        for i in 0..n / 2 {
            assert!(p.del(&i.to_le_bytes(), key_hash(&i.to_le_bytes())));
        }
        set(&mut p, b"again", &[1; 100]).unwrap();
    }

    #[test]
    fn the_log_wraps_and_compaction_moves_live_items() {
        let mut p = Partition::new(32 << 10).unwrap();
        for k in 0..10u8 {
            set(&mut p, &[b's', k], &[k; 500]).unwrap();
        }
        for round in 0..200u32 {
            for k in 0..8u8 {
                // Sizes alternate, so no update fits in place.
                let v = vec![k ^ round as u8; 100 + (round as usize % 2) * 16];
                set(&mut p, &[b'h', k], &v).unwrap();
            }
        }
        let st = p.stats();
        assert!(st.moved >= 10, "{st:?}");
        for k in 0..10u8 {
            assert_eq!(p.get(&[b's', k], key_hash(&[b's', k])), Some(&[k; 500][..]));
        }
        for k in 0..8u8 {
            let v = [k ^ 199u8; 116];
            assert_eq!(p.get(&[b'h', k], key_hash(&[b'h', k])), Some(&v[..]));
        }
        // Prefetching, of present and absent keys, in a wrapped log, changes nothing.
        for k in 0..12u8 {
            for key in [[b's', k], [b'h', k], [b'x', k]] {
                let h = key_hash(&key);
                let before = p.get(&key, h).map(<[u8]>::to_vec);
                p.prefetch_bucket(h);
                p.prefetch_item(h);
                assert_eq!(p.get(&key, h).map(<[u8]>::to_vec), before);
            }
        }
    }

    proptest! {
        #[test]
        fn matches_a_model_through_compaction_and_wraps(
            ops in proptest::collection::vec((0u8..60, 0usize..300, any::<u8>(), 0u8..10), 1..3000)
        ) {
            let mut p = Partition::new(32 << 10).unwrap();
            let mut m: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
            for (k, n, b, op) in ops {
                let key = vec![k; (k % 7 + 1) as usize];
                let h = key_hash(&key);
                match op {
                    0..=5 => {
                        let v = vec![b; n];
                        match p.set(&key, h, &v) {
                            Ok(()) => { m.insert(key.clone(), v); }
                            Err(KvError::Full | KvError::IndexFull) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    6..=7 => { prop_assert_eq!(p.del(&key, h), m.remove(&key).is_some()); }
                    _ => { prop_assert_eq!(p.get(&key, h), m.get(&key).map(|v| &v[..])); }
                }
            }
            for (k, v) in &m {
                prop_assert_eq!(p.get(k, key_hash(k)), Some(&v[..]));
            }
            prop_assert_eq!(p.len(), m.len() as u64);
        }
    }
}
