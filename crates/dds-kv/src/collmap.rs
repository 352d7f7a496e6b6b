//! The in-memory side of collections (`docs/kv-service.md` §7.2, §7.4): the map from a
//! collection key's hash to its type, version and element map, what compaction asks of it
//! (is this element record live?) and how recovery rebuilds it from records met in any order.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::collection::{CollType, Composite, Meta};
use crate::record::key_hash;

/// Element-map bit: the element's newest record is an element tombstone.
pub const ELEMENT_TOMB: u64 = 1 << 63;

/// A 128-bit key hash (`h1`, `h2`).
pub type Hash = (u64, u64);

/// The element-map key of sub-key `sub` in a collection of type `ty`: the sub-key's 128-bit
/// hash, except for a list, whose 8-byte position sub-key is its own key (`(position bytes
/// as a big-endian u64, 0)`), so that the element map walks a list in position order.
pub fn sub_hash(ty: CollType, sub: &[u8]) -> Hash {
    match (ty, <[u8; 8]>::try_from(sub)) {
        (CollType::List, Ok(b)) => (u64::from_be_bytes(b), 0),
        _ => key_hash(sub),
    }
}

/// The element-map key of list position `pos` ([`sub_hash`] of its sub-key).
pub fn position_hash(pos: i64) -> Hash {
    (
        u64::from_be_bytes(crate::collection::encode_position(pos)),
        0,
    )
}

/// The position of a list's element-map key.
pub fn hash_position(h: Hash) -> i64 {
    crate::collection::decode_position(&h.0.to_be_bytes()).expect("8 bytes")
}

/// One live collection.
#[derive(Debug)]
pub struct Coll {
    /// Its type.
    pub ty: CollType,
    /// Its version (the sequence number of the record that created it).
    pub version: u64,
    /// Sub-key hash → address of the element's newest record (| [`ELEMENT_TOMB`]); empty
    /// for a list, whose elements are in `list`.
    pub elems: BTreeMap<Hash, u64>,
    /// Live elements (entries without [`ELEMENT_TOMB`]).
    pub live: u64,
    /// A sorted set's members in order, built when an ordered command first needs it (from
    /// the element records) and kept up to date by the store's writes after that.
    pub zindex: Option<Box<crate::zindex::ZIndex>>,
    /// The live elements' sub-key hashes in an array, for uniform random picks in O(1)
    /// (SPOP, SRANDMEMBER, HRANDFIELD, ZRANDMEMBER), built when a pick first meets the
    /// collection and kept up to date by every element write after that.
    pub picks: Option<Box<Picks>>,
    /// A list's first position: its elements are at positions `head..head + list.len()`
    /// (every list write keeps them contiguous, on every prefix of the log too).
    pub head: i64,
    /// A list's element addresses in position order. A popped element leaves no entry: its
    /// element tombstone is garbage from the start (compaction reaches the element's older
    /// records first, the log being compacted in address order), so a queue's memory is its
    /// length, and pushes and pops at the ends allocate nothing once it has grown.
    pub list: VecDeque<u64>,
}

impl Coll {
    fn new(meta: Meta) -> Coll {
        Coll {
            ty: meta.ty,
            version: meta.version,
            elems: BTreeMap::new(),
            live: 0,
            zindex: None,
            picks: None,
            head: 0,
            list: VecDeque::new(),
        }
    }

    /// The address of the live element with this sub-key hash.
    pub fn element(&self, sub: Hash) -> Option<u64> {
        if self.ty == CollType::List {
            return self.list_index(sub).map(|i| self.list[i]);
        }
        self.elems
            .get(&sub)
            .filter(|&&a| a & ELEMENT_TOMB == 0)
            .copied()
    }

    /// The index in `list` of a list position's element-map key.
    fn list_index(&self, sub: Hash) -> Option<usize> {
        let i = hash_position(sub).checked_sub(self.head)?;
        (i >= 0 && (i as u64) < self.list.len() as u64).then_some(i as usize)
    }

    /// The sub-key hashes of the live elements: in hash order, a list's in position order.
    pub fn live_subs(&self) -> Box<dyn Iterator<Item = Hash> + '_> {
        if self.ty == CollType::List {
            return Box::new((0..self.list.len() as i64).map(|i| position_hash(self.head + i)));
        }
        Box::new(
            self.elems
                .iter()
                .filter(|(_, &a)| a & ELEMENT_TOMB == 0)
                .map(|(&s, _)| s),
        )
    }

    /// A list's record at `addr` for position `pos` (`tomb`: its tombstone): a value
    /// replaces its position's address or extends an end; a tombstone shrinks an end. The
    /// change of the live count; `None` for a record that would leave a gap (garbage, and
    /// logged: list writes never make one).
    fn list_write(&mut self, pos: i64, addr: u64, tomb: bool) -> Option<i64> {
        let len = self.list.len() as i64;
        let i = pos.checked_sub(self.head)?;
        match (tomb, i) {
            (false, _) if len == 0 => {
                self.head = pos;
                self.list.push_back(addr);
                Some(1)
            }
            (false, -1) => {
                self.head = pos;
                self.list.push_front(addr);
                Some(1)
            }
            (false, i) if i == len => {
                self.list.push_back(addr);
                Some(1)
            }
            (false, i) if (0..len).contains(&i) => {
                self.list[i as usize] = addr;
                Some(0)
            }
            (true, 0) if len > 0 => {
                self.list.pop_front();
                self.head += 1;
                Some(-1)
            }
            (true, i) if len > 0 && i == len - 1 => {
                self.list.pop_back();
                Some(-1)
            }
            _ => {
                tracing::error!(
                    pos,
                    head = self.head,
                    len,
                    tomb,
                    "a list write off its ends: ignored"
                );
                None
            }
        }
    }
}

/// An array of a collection's live elements with each one's place in it: an element joins at
/// the end and leaves by a swap with the last (O(1) both), so a uniform index is a uniform
/// element. About 40 bytes per element, outside `--memory`, as the index.
#[derive(Debug, Default)]
pub struct Picks {
    subs: Vec<Hash>,
    at: HashMap<Hash, u32>,
}

impl Picks {
    /// The array of `coll`'s live elements.
    pub fn of(coll: &Coll) -> Picks {
        let subs: Vec<Hash> = coll.live_subs().collect();
        let at = subs
            .iter()
            .enumerate()
            .map(|(i, &h)| (h, i as u32))
            .collect();
        Picks { subs, at }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// The element at `i` (< `len`).
    pub fn get(&self, i: usize) -> Hash {
        self.subs[i]
    }

    fn insert(&mut self, h: Hash) {
        if let std::collections::hash_map::Entry::Vacant(e) = self.at.entry(h) {
            e.insert(self.subs.len() as u32);
            self.subs.push(h);
        }
    }

    fn remove(&mut self, h: Hash) {
        if let Some(i) = self.at.remove(&h) {
            self.subs.swap_remove(i as usize);
            if let Some(&moved) = self.subs.get(i as usize) {
                self.at.insert(moved, i);
            }
        }
    }
}

/// Every collection, by its key's hash.
#[derive(Debug, Default)]
pub struct Collections {
    live: HashMap<Hash, Coll>,
    /// Recovery only: element maps by (key hash, version), met before their metadata or not.
    recovering: HashMap<(Hash, u64), Recovering>,
}

/// The elements recovery met of one (key, version), keyed as the collection's type wants
/// them ([`sub_hash`]): the type is in the metadata record, which may come later on the log.
#[derive(Debug, Default)]
struct Recovering {
    /// By the sub-key's 128-bit hash (hashes, sets, sorted sets).
    by_hash: BTreeMap<Hash, u64>,
    /// By position, for the elements whose sub-key has 8 bytes (lists).
    by_position: BTreeMap<Hash, u64>,
}

impl Collections {
    /// The collection of a key hash.
    pub fn get(&self, key: Hash) -> Option<&Coll> {
        self.live.get(&key)
    }

    /// The collection of a key hash, to change.
    pub fn get_mut(&mut self, key: Hash) -> Option<&mut Coll> {
        self.live.get_mut(&key)
    }

    /// The type of a key hash's collection (`None`: not a collection).
    pub fn type_of(&self, key: Hash) -> Option<CollType> {
        self.live.get(&key).map(|c| c.ty)
    }

    /// Collections.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// No collections.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// A metadata record of `key` was written (or replayed): a new version starts an empty
    /// collection (replacing any other), the same version (an expiry change, a move by
    /// compaction) keeps the elements.
    pub fn meta(&mut self, key: Hash, meta: Meta) {
        match self.live.get(&key) {
            Some(c) if c.version == meta.version && c.ty == meta.ty => {}
            _ => {
                self.live.insert(key, Coll::new(meta));
            }
        }
    }

    /// `key` stopped being a collection (DEL, expiry, a string written over it, its last
    /// element removed): its elements become garbage; the collection it was, if any.
    pub fn remove(&mut self, key: Hash) -> Option<Coll> {
        self.live.remove(&key)
    }

    /// An element record (or tombstone, `tomb`) of `version` of `key` was written at `addr`.
    /// `Some(change of the live count)` (-1, 0 or 1), `None` when the version is not live
    /// (the record is garbage).
    pub fn element(
        &mut self,
        key: Hash,
        version: u64,
        sub: Hash,
        addr: u64,
        tomb: bool,
    ) -> Option<i64> {
        let c = self.live.get_mut(&key).filter(|c| c.version == version)?;
        if c.ty == CollType::List {
            let d = c.list_write(hash_position(sub), addr, tomb)?;
            c.live = c.list.len() as u64;
            return Some(d);
        }
        let entry = if tomb { addr | ELEMENT_TOMB } else { addr };
        let was_live = c
            .elems
            .insert(sub, entry)
            .is_some_and(|old| old & ELEMENT_TOMB == 0);
        let d = i64::from(!tomb) - i64::from(was_live);
        if let Some(p) = c.picks.as_deref_mut() {
            match d {
                1 => p.insert(sub),
                -1 => p.remove(sub),
                _ => {}
            }
        }
        c.live = c.live.wrapping_add_signed(d);
        Some(d)
    }

    /// Compaction's question: is the element record (or tombstone) with composite key `c` at
    /// `addr` the newest record of a live element map? Only such records are moved.
    pub fn element_is_live(&self, c: &Composite<'_>, addr: u64) -> bool {
        let Some(coll) = self.live.get(&key_hash(c.key)) else {
            return false;
        };
        if coll.ty == CollType::List {
            // A list's tombstone is never live (see `Coll::list`).
            return coll.version == c.version
                && coll.element(sub_hash(coll.ty, c.sub)) == Some(addr);
        }
        coll.version == c.version
            && coll
                .elems
                .get(&sub_hash(coll.ty, c.sub))
                .is_some_and(|&a| a & !ELEMENT_TOMB == addr)
    }

    /// Compaction dropped a live element tombstone at `addr`: its entry goes too (every older
    /// record of the element is below it and already gone).
    pub fn drop_tombstone(&mut self, c: &Composite<'_>, addr: u64) {
        if let Some(coll) = self.live.get_mut(&key_hash(c.key)) {
            if coll.version == c.version {
                let sub = sub_hash(coll.ty, c.sub);
                if coll.elems.get(&sub) == Some(&(addr | ELEMENT_TOMB)) {
                    coll.elems.remove(&sub);
                }
            }
        }
    }

    /// Compaction moved a live element record from `from` to `to`.
    pub fn moved(&mut self, c: &Composite<'_>, from: u64, to: u64) {
        if let Some(coll) = self.live.get_mut(&key_hash(c.key)) {
            if coll.version == c.version && coll.ty == CollType::List {
                if let Some(i) = coll.list_index(sub_hash(coll.ty, c.sub)) {
                    if coll.list[i] == from {
                        coll.list[i] = to;
                    }
                }
            } else if coll.version == c.version {
                if let Some(a) = coll.elems.get_mut(&sub_hash(coll.ty, c.sub)) {
                    if *a & !ELEMENT_TOMB == from {
                        *a = to | (*a & ELEMENT_TOMB);
                    }
                }
            }
        }
    }

    /// Recovery met an element record (or tombstone) at `addr`: kept by (key, version) until
    /// [`Collections::finish_recovery`], as its metadata record may come later on the log.
    /// Records are met in sequence order, so a later one of the same element replaces it.
    pub fn replay_element(&mut self, c: &Composite<'_>, addr: u64, tomb: bool) {
        let entry = if tomb { addr | ELEMENT_TOMB } else { addr };
        let r = self
            .recovering
            .entry((key_hash(c.key), c.version))
            .or_default();
        r.by_hash.insert(key_hash(c.sub), entry);
        if c.sub.len() == 8 {
            r.by_position.insert(sub_hash(CollType::List, c.sub), entry);
        }
    }

    /// The end of recovery: each live collection takes the elements of its version, the
    /// other element maps are dropped. Returns the collections left with no live element
    /// (a crash came between a collection's metadata record and its first element): the
    /// store deletes those keys, as Redis never keeps an empty collection.
    pub fn finish_recovery(&mut self) -> Vec<Hash> {
        let mut empty = Vec::new();
        for (key, c) in self.live.iter_mut() {
            if let Some(r) = self.recovering.remove(&(*key, c.version)) {
                if c.ty == CollType::List {
                    (c.head, c.list) = recovered_list(&r.by_position);
                    c.live = c.list.len() as u64;
                } else {
                    c.live = r
                        .by_hash
                        .values()
                        .filter(|&&a| a & ELEMENT_TOMB == 0)
                        .count() as u64;
                    c.elems = r.by_hash;
                }
            }
            if c.live == 0 {
                empty.push(*key);
            }
        }
        self.recovering = HashMap::new();
        for k in &empty {
            self.live.remove(k);
        }
        empty
    }
}

/// A recovered list from its newest records by position: its head and its addresses. Every
/// list write keeps the live positions contiguous on every prefix of the log, so the live
/// positions are one run; were there a gap (never written so), the run from the first live
/// position is the list and the rest is logged and left as garbage.
fn recovered_list(by_position: &BTreeMap<Hash, u64>) -> (i64, VecDeque<u64>) {
    let mut live = by_position
        .iter()
        .filter(|(_, &a)| a & ELEMENT_TOMB == 0)
        .map(|(&h, &a)| (hash_position(h), a));
    let Some((head, first)) = live.next() else {
        return (0, VecDeque::new());
    };
    let mut list = VecDeque::from([first]);
    for (pos, a) in live {
        if pos != head + list.len() as i64 {
            tracing::error!(
                head,
                pos,
                "a recovered list has a gap: the elements after it are left out"
            );
            break;
        }
        list.push_back(a);
    }
    (head, list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collection::{decode_composite, encode_composite};

    fn comp(key: &[u8], version: u64, sub: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; crate::collection::composite_len(key.len(), sub.len())];
        encode_composite(&mut out, key, version, sub);
        out
    }

    fn meta(ty: CollType, version: u64) -> Meta {
        Meta { ty, version }
    }

    #[test]
    fn elements_of_a_dead_version_are_garbage_and_counts_follow_writes() {
        let mut cs = Collections::default();
        let h = key_hash(b"h");
        cs.meta(h, meta(CollType::Hash, 10));
        assert_eq!(cs.element(h, 10, key_hash(b"f1"), 100, false), Some(1));
        assert_eq!(cs.element(h, 10, key_hash(b"f2"), 200, false), Some(1));
        // Overwriting a field changes no count; removing one does.
        assert_eq!(cs.element(h, 10, key_hash(b"f1"), 300, false), Some(0));
        assert_eq!(cs.element(h, 10, key_hash(b"f2"), 400, true), Some(-1));
        assert_eq!(cs.get(h).unwrap().live, 1);
        assert_eq!(cs.get(h).unwrap().element(key_hash(b"f1")), Some(300));
        assert_eq!(cs.get(h).unwrap().element(key_hash(b"f2")), None);
        // Compaction: only the newest record of a live element (or tombstone) is live.
        let f1 = comp(b"h", 10, b"f1");
        let f2 = comp(b"h", 10, b"f2");
        let c1 = decode_composite(&f1).unwrap();
        let c2 = decode_composite(&f2).unwrap();
        assert!(!cs.element_is_live(&c1, 100));
        assert!(cs.element_is_live(&c1, 300));
        assert!(cs.element_is_live(&c2, 400));
        cs.moved(&c1, 300, 900);
        assert_eq!(cs.get(h).unwrap().element(key_hash(b"f1")), Some(900));
        cs.drop_tombstone(&c2, 400);
        assert!(!cs.element_is_live(&c2, 400));
        assert_eq!(cs.get(h).unwrap().elems.len(), 1);
        // An expiry change keeps the version and the elements; a new version starts empty.
        cs.meta(h, meta(CollType::Hash, 10));
        assert_eq!(cs.get(h).unwrap().live, 1);
        assert_eq!(cs.type_of(h), Some(CollType::Hash));
        cs.meta(h, meta(CollType::Set, 20));
        assert_eq!(cs.get(h).unwrap().live, 0);
        assert!(!cs.element_is_live(&c1, 900));
        // Writes to the old version are refused: garbage.
        assert_eq!(cs.element(h, 10, key_hash(b"f3"), 1000, false), None);
        assert!(cs.remove(h).is_some());
        assert!(cs.is_empty());
        assert_eq!(cs.type_of(h), None);
    }

    /// The pick array holds exactly the live elements through adds, overwrites and removals.
    #[test]
    fn picks_follow_the_live_elements() {
        let mut cs = Collections::default();
        let h = key_hash(b"s");
        cs.meta(h, meta(CollType::Set, 1));
        for i in 0..50u64 {
            cs.element(h, 1, key_hash(&i.to_le_bytes()), 8 * i, false);
        }
        let c = cs.get_mut(h).unwrap();
        c.picks = Some(Box::new(Picks::of(c)));
        let mut x = 5u64;
        for step in 0..2000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            let sub = key_hash(&((x >> 40) % 80).to_le_bytes());
            cs.element(h, 1, sub, 1000 + step, (x >> 20).is_multiple_of(3));
            let c = cs.get(h).unwrap();
            let p = c.picks.as_deref().unwrap();
            let mut got: Vec<Hash> = (0..p.len()).map(|i| p.get(i)).collect();
            let mut want: Vec<Hash> = c.live_subs().collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "step {step}");
            assert_eq!(p.len() as u64, c.live);
        }
    }

    #[test]
    fn recovery_attaches_elements_met_before_or_after_their_metadata() {
        let mut cs = Collections::default();
        let (a, b, c) = (key_hash(b"a"), key_hash(b"b"), key_hash(b"c"));
        // `a`: elements first (its metadata record was moved to the tail by compaction).
        let a1 = comp(b"a", 5, b"x");
        let a2 = comp(b"a", 5, b"y");
        cs.replay_element(&decode_composite(&a1).unwrap(), 8, false);
        cs.replay_element(&decode_composite(&a2).unwrap(), 16, false);
        cs.replay_element(&decode_composite(&a2).unwrap(), 24, true);
        // `b`: an old version's element, then the new version's metadata and one element.
        let b_old = comp(b"b", 1, b"m");
        let b_new = comp(b"b", 30, b"n");
        cs.replay_element(&decode_composite(&b_old).unwrap(), 32, false);
        cs.meta(b, meta(CollType::Set, 30));
        cs.replay_element(&decode_composite(&b_new).unwrap(), 40, false);
        // `c`: a metadata record whose first element was lost in a crash.
        cs.meta(c, meta(CollType::ZSet, 50));
        cs.meta(a, meta(CollType::Hash, 5));
        let empty = cs.finish_recovery();
        assert_eq!(empty, vec![c]);
        assert_eq!(cs.len(), 2);
        let ca = cs.get(a).unwrap();
        assert_eq!((ca.live, ca.element(key_hash(b"x"))), (1, Some(8)));
        assert_eq!(ca.element(key_hash(b"y")), None);
        let cb = cs.get(b).unwrap();
        assert_eq!((cb.ty, cb.live), (CollType::Set, 1));
        assert_eq!(cb.element(key_hash(b"n")), Some(40));
        assert_eq!(cb.element(key_hash(b"m")), None);
        assert!(cs.recovering.is_empty());
    }
}
