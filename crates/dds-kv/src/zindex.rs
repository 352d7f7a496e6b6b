//! A sorted set's ordered members in memory (`docs/kv-service.md` §7.2): (score, member)
//! pairs in Redis's order (score as a double, equal scores by member bytes) in a treap whose
//! nodes count their subtrees, so that a rank, the rank of a score or lex bound and the k-th
//! member are found in O(log n) expected, and a range of k members is listed in O(log n + k).

use std::cmp::Ordering;

const NIL: u32 = u32::MAX;

/// A test that holds for a prefix of the order (e.g. "before the member (s, m)").
pub type Before<'a> = &'a dyn Fn((f64, &[u8])) -> bool;

struct Node {
    score: f64,
    member: Box<[u8]>,
    prio: u64,
    left: u32,
    right: u32,
    size: u32,
}

/// Redis's order of sorted-set members: by score, then by member bytes.
pub fn order(a: (f64, &[u8]), b: (f64, &[u8])) -> Ordering {
    a.0.partial_cmp(&b.0)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.1.cmp(b.1))
}

/// The ordered (score, member) pairs of one sorted set.
pub struct ZIndex {
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    rng: u64,
}

impl std::fmt::Debug for ZIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZIndex").field("len", &self.len()).finish()
    }
}

impl Default for ZIndex {
    fn default() -> Self {
        ZIndex {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl ZIndex {
    /// Members.
    pub fn len(&self) -> usize {
        self.size(self.root) as usize
    }

    /// No members.
    pub fn is_empty(&self) -> bool {
        self.root == NIL
    }

    fn size(&self, t: u32) -> u32 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].size
        }
    }

    fn fix(&mut self, t: u32) {
        let (l, r) = (self.nodes[t as usize].left, self.nodes[t as usize].right);
        self.nodes[t as usize].size = 1 + self.size(l) + self.size(r);
    }

    fn key(&self, t: u32) -> (f64, &[u8]) {
        let n = &self.nodes[t as usize];
        (n.score, &n.member)
    }

    /// Splits `t` into the nodes for which `before` holds (a prefix of the order) and the rest.
    fn split(&mut self, t: u32, before: Before<'_>) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if before(self.key(t)) {
            let (l, r) = self.split(self.nodes[t as usize].right, before);
            self.nodes[t as usize].right = l;
            self.fix(t);
            (t, r)
        } else {
            let (l, r) = self.split(self.nodes[t as usize].left, before);
            self.nodes[t as usize].left = r;
            self.fix(t);
            (l, t)
        }
    }

    /// Joins `a` and `b`, every node of `a` before every node of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.fix(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.fix(b);
            b
        }
    }

    fn next_prio(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Adds a member with its score; the caller knows it is not there (a member is in the
    /// index once: change a score by [`ZIndex::remove`] then `insert`).
    pub fn insert(&mut self, score: f64, member: &[u8]) {
        let node = Node {
            score,
            member: member.into(),
            prio: self.next_prio(),
            left: NIL,
            right: NIL,
            size: 1,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let root = self.root;
        let (l, r) = self.split(root, &|k| order(k, (score, member)) == Ordering::Less);
        let l = self.merge(l, id);
        self.root = self.merge(l, r);
    }

    /// Removes a member with its score; whether it was there.
    pub fn remove(&mut self, score: f64, member: &[u8]) -> bool {
        let root = self.root;
        let (l, r) = self.split(root, &|k| order(k, (score, member)) == Ordering::Less);
        let (m, r) = self.split(r, &|k| order(k, (score, member)) != Ordering::Greater);
        if m != NIL {
            self.nodes[m as usize].member = Box::default();
            self.free.push(m);
        }
        self.root = self.merge(l, r);
        m != NIL
    }

    /// The number of members for which `before` holds; `before` must hold for a prefix of
    /// the order (e.g. "score < min"). O(log n) expected.
    pub fn count_before(&self, before: impl Fn((f64, &[u8])) -> bool) -> usize {
        let (mut t, mut n) = (self.root, 0usize);
        while t != NIL {
            let node = &self.nodes[t as usize];
            if before((node.score, &node.member)) {
                n += self.size(node.left) as usize + 1;
                t = node.right;
            } else {
                t = node.left;
            }
        }
        n
    }

    /// The rank (0: lowest) of a member with its score, if it is there.
    pub fn rank(&self, score: f64, member: &[u8]) -> Option<usize> {
        let r = self.count_before(|k| order(k, (score, member)) == Ordering::Less);
        let (s, m) = self.iter_from(r).next()?;
        (order((s, m), (score, member)) == Ordering::Equal).then_some(r)
    }

    /// Calls `f` with the members of ranks `from..to`, in order (or in reverse order with
    /// `rev`), walking the tree without a heap allocation: O(log n + k) expected.
    pub fn visit(&self, from: usize, to: usize, rev: bool, f: &mut dyn FnMut(f64, &[u8])) {
        self.visit_node(self.root, 0, from, to, rev, f);
    }

    /// [`ZIndex::visit`] of the subtree `t`, whose lowest rank is `base`.
    fn visit_node(
        &self,
        t: u32,
        base: usize,
        from: usize,
        to: usize,
        rev: bool,
        f: &mut dyn FnMut(f64, &[u8]),
    ) {
        if t == NIL || base >= to {
            return;
        }
        let node = &self.nodes[t as usize];
        let rank = base + self.size(node.left) as usize;
        if base + self.size(t) as usize <= from {
            return;
        }
        let (lo, hi) = (node.left, node.right);
        let here = (from..to).contains(&rank);
        if rev {
            self.visit_node(hi, rank + 1, from, to, rev, f);
            if here {
                f(node.score, &node.member);
            }
            self.visit_node(lo, base, from, to, rev, f);
        } else {
            self.visit_node(lo, base, from, to, rev, f);
            if here {
                f(node.score, &node.member);
            }
            self.visit_node(hi, rank + 1, from, to, rev, f);
        }
    }

    /// The members in order from rank `rank` on: the first in O(log n) expected, each next in
    /// O(1) amortized.
    pub fn iter_from(&self, mut rank: usize) -> Iter<'_> {
        let mut stack = Vec::new();
        let mut t = self.root;
        while t != NIL {
            let node = &self.nodes[t as usize];
            let ls = self.size(node.left) as usize;
            match rank.cmp(&ls) {
                Ordering::Less => {
                    stack.push(t);
                    t = node.left;
                }
                Ordering::Equal => {
                    stack.push(t);
                    break;
                }
                Ordering::Greater => {
                    rank -= ls + 1;
                    t = node.right;
                }
            }
        }
        Iter { z: self, stack }
    }
}

/// Members in order ([`ZIndex::iter_from`]).
pub struct Iter<'a> {
    z: &'a ZIndex,
    stack: Vec<u32>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (f64, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let t = self.stack.pop()?;
        let node = &self.z.nodes[t as usize];
        let mut c = node.right;
        while c != NIL {
            self.stack.push(c);
            c = self.z.nodes[c as usize].left;
        }
        Some((node.score, &node.member))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same operations on a sorted vector, as the model.
    fn check(z: &ZIndex, model: &[(f64, Vec<u8>)]) {
        assert_eq!(z.len(), model.len());
        let all: Vec<(f64, Vec<u8>)> = z.iter_from(0).map(|(s, m)| (s, m.to_vec())).collect();
        assert_eq!(all, model);
        for (i, (s, m)) in model.iter().enumerate() {
            assert_eq!(z.rank(*s, m), Some(i));
        }
    }

    #[test]
    fn ranks_ranges_and_bounds_agree_with_a_sorted_vector() {
        let mut z = ZIndex::default();
        let mut model: Vec<(f64, Vec<u8>)> = Vec::new();
        let mut x = 12345u64;
        for step in 0..4000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let member = format!("m{}", (x >> 33) % 300).into_bytes();
            let score = ((x >> 20) % 50) as f64 - 25.0;
            let at = model.iter().position(|(_, m)| *m == member);
            if let Some(i) = at {
                let (s, m) = model.remove(i);
                assert!(z.remove(s, &m));
                assert!(!z.remove(s, &m));
            }
            if at.is_none() || step % 3 != 0 {
                z.insert(score, &member);
                let i = model.partition_point(|(s, m)| order((*s, m), (score, &member)).is_lt());
                model.insert(i, (score, member));
            }
            if step % 500 == 0 {
                check(&z, &model);
            }
        }
        check(&z, &model);
        // ZCOUNT-style bounds: [min, max] by score, and a range listed from its first rank.
        for (min, max) in [(-3.0, 4.0), (-100.0, 100.0), (10.0, 2.0), (0.0, 0.0)] {
            let lo = z.count_before(|(s, _)| s < min);
            let hi = z.count_before(|(s, _)| s <= max);
            let want: Vec<_> = model
                .iter()
                .filter(|(s, _)| *s >= min && *s <= max)
                .collect();
            assert_eq!(hi.saturating_sub(lo), want.len(), "[{min}, {max}]");
            let got: Vec<_> = z.iter_from(lo).take(hi.saturating_sub(lo)).collect();
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.0 == b.0 && a.1 == &b.1[..]));
        }
        // Past the end: nothing; a missing member has no rank.
        assert_eq!(z.iter_from(model.len()).next(), None);
        assert_eq!(z.rank(0.5, b"none"), None);
        // Removing everything leaves it empty, and freed nodes are reused.
        let cap = z.nodes.len();
        for (s, m) in model.drain(..) {
            assert!(z.remove(s, &m));
        }
        assert!(z.is_empty());
        z.insert(1.0, b"again");
        assert_eq!(z.nodes.len(), cap);
        assert_eq!(z.iter_from(0).next(), Some((1.0, &b"again"[..])));
    }

    #[test]
    fn equal_scores_order_by_member_bytes_and_infinities_sort_at_the_ends() {
        let mut z = ZIndex::default();
        for (s, m) in [
            (1.0, &b"b"[..]),
            (1.0, b"a"),
            (f64::INFINITY, b"z"),
            (f64::NEG_INFINITY, b"y"),
            (1.0, b""),
        ] {
            z.insert(s, m);
        }
        let got: Vec<_> = z.iter_from(0).map(|(_, m)| m.to_vec()).collect();
        assert_eq!(got, [&b"y"[..], b"", b"a", b"b", b"z"]);
        assert_eq!(z.rank(1.0, b"a"), Some(2));
        assert_eq!(z.iter_from(3).next(), Some((1.0, &b"b"[..])));
    }
}
