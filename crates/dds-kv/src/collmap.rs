//! The in-memory side of collections (`docs/kv-service.md` §7.2, §7.4): the map from a
//! collection key's hash to its type, version and element map, what compaction asks of it
//! (is this element record live?) and how recovery rebuilds it from records met in any order.

use std::collections::{BTreeMap, HashMap};

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
    /// Sub-key hash → address of the element's newest record (| [`ELEMENT_TOMB`]).
    pub elems: BTreeMap<Hash, u64>,
    /// Live elements (entries without [`ELEMENT_TOMB`]).
    pub live: u64,
    /// A sorted set's members in order, built when an ordered command first needs it (from
    /// the element records) and kept up to date by the store's writes after that.
    pub zindex: Option<Box<crate::zindex::ZIndex>>,
    /// A list's first position and the one after its last: its live elements are at
    /// positions `head..end`, `end - head == live` (every list write keeps them contiguous,
    /// on every prefix of the log too).
    pub head: i64,
    /// See `head`.
    pub end: i64,
}

impl Coll {
    fn new(meta: Meta) -> Coll {
        Coll {
            ty: meta.ty,
            version: meta.version,
            elems: BTreeMap::new(),
            live: 0,
            zindex: None,
            head: 0,
            end: 0,
        }
    }

    /// The address of the live element with this sub-key hash.
    pub fn element(&self, sub: Hash) -> Option<u64> {
        self.elems
            .get(&sub)
            .filter(|&&a| a & ELEMENT_TOMB == 0)
            .copied()
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
        let entry = if tomb { addr | ELEMENT_TOMB } else { addr };
        let was_live = c
            .elems
            .insert(sub, entry)
            .is_some_and(|old| old & ELEMENT_TOMB == 0);
        let d = i64::from(!tomb) - i64::from(was_live);
        c.live = c.live.wrapping_add_signed(d);
        Some(d)
    }

    /// Compaction's question: is the element record (or tombstone) with composite key `c` at
    /// `addr` the newest record of a live element map? Only such records are moved.
    pub fn element_is_live(&self, c: &Composite<'_>, addr: u64) -> bool {
        let Some(coll) = self.live.get(&key_hash(c.key)) else {
            return false;
        };
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
            if coll.version == c.version {
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
                let elems = match c.ty {
                    CollType::List => r.by_position,
                    _ => r.by_hash,
                };
                c.live = elems.values().filter(|&&a| a & ELEMENT_TOMB == 0).count() as u64;
                c.elems = elems;
                if c.ty == CollType::List {
                    (c.head, c.end) = list_ends(&c.elems, c.live);
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

/// A recovered list's ends: its first live position and the one after its last. Every list
/// write keeps the live positions contiguous on every prefix of the log; a gap (never written
/// so) is logged, and the list's reads then skip the missing positions (no write reuses one).
fn list_ends(elems: &BTreeMap<Hash, u64>, live: u64) -> (i64, i64) {
    let mut live_pos = elems
        .iter()
        .filter(|(_, &a)| a & ELEMENT_TOMB == 0)
        .map(|(&h, _)| hash_position(h));
    let Some(head) = live_pos.next() else {
        return (0, 0);
    };
    let end = live_pos.last().unwrap_or(head) + 1;
    if (end - head) as u64 != live {
        tracing::error!(
            head,
            end,
            live,
            "a recovered list has gaps between its positions"
        );
    }
    (head, end)
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
