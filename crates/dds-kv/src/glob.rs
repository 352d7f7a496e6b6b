//! Glob-style matching as Redis's `stringmatchlen` does it (KEYS, SCAN MATCH, CONFIG GET):
//! `*` any run of bytes, `?` one byte, `[abc]`, `[^abc]`, `[a-z]` (bounds in either order),
//! `\x` the byte `x`. Bytes compare as C `char`s (signed) in ranges, ASCII letters fold in
//! the case-insensitive mode. A `[` that does not close takes the rest of the pattern as its
//! set, as in Redis.

/// Deepest nesting of `*` tried (each `*` recurses once): a pattern with more gives no match
/// rather than exhausting the stack (Redis 7.2 added the same bound).
const MAX_NESTING: usize = 1000;

/// Whether `string` matches `pattern`; `nocase` folds ASCII letters.
pub fn matches(pattern: &[u8], string: &[u8], nocase: bool) -> bool {
    let mut skip_longer = false;
    match_at(pattern, string, nocase, &mut skip_longer, 0)
}

fn fold(b: u8, nocase: bool) -> u8 {
    if nocase {
        b.to_ascii_lowercase()
    } else {
        b
    }
}

/// The byte as a C `char` (signed), for range comparisons.
fn signed(b: u8) -> i32 {
    i32::from(b as i8)
}

fn match_at(
    mut p: &[u8],
    mut s: &[u8],
    nocase: bool,
    skip_longer: &mut bool,
    nesting: usize,
) -> bool {
    if nesting > MAX_NESTING {
        return false;
    }
    while !p.is_empty() && !s.is_empty() {
        // Each case consumes its part of the pattern (`rest`) and one byte of the string.
        let rest = match p[0] {
            b'*' => {
                while p.len() > 1 && p[1] == b'*' {
                    p = &p[1..];
                }
                if p.len() == 1 {
                    return true;
                }
                while !s.is_empty() {
                    if match_at(&p[1..], s, nocase, skip_longer, nesting + 1) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s = &s[1..];
                }
                // Nothing after this `*` matches anywhere in the rest of the string: an
                // earlier `*` taking more cannot help either.
                *skip_longer = true;
                return false;
            }
            b'?' => &p[1..],
            b'[' => {
                let mut set = &p[1..];
                let not = set.first() == Some(&b'^');
                if not {
                    set = &set[1..];
                }
                let (hit, rest) = in_set(set, s[0], nocase);
                if hit == not {
                    return false;
                }
                rest
            }
            b => {
                let (lit, rest) = if b == b'\\' && p.len() >= 2 {
                    (p[1], &p[2..])
                } else {
                    (b, &p[1..])
                };
                if fold(lit, nocase) != fold(s[0], nocase) {
                    return false;
                }
                rest
            }
        };
        p = rest;
        s = &s[1..];
        if s.is_empty() {
            while p.first() == Some(&b'*') {
                p = &p[1..];
            }
            break;
        }
    }
    p.is_empty() && s.is_empty()
}

/// Whether byte `c` is in the set that starts at `set` (after `[` and `^`), and the pattern
/// after the set's `]` (empty when the set does not close: it takes the rest).
fn in_set(set: &[u8], c: u8, nocase: bool) -> (bool, &[u8]) {
    let mut hit = false;
    let mut i = 0;
    while i < set.len() {
        let left = set.len() - i;
        if set[i] == b'\\' && left >= 2 {
            i += 1;
            if set[i] == c {
                hit = true;
            }
        } else if set[i] == b']' {
            return (hit, &set[i + 1..]);
        } else if left >= 3 && set[i + 1] == b'-' {
            let (mut lo, mut hi) = (signed(set[i]), signed(set[i + 2]));
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            let mut x = signed(c);
            if nocase {
                lo = lower_signed(lo);
                hi = lower_signed(hi);
                x = lower_signed(x);
            }
            i += 2;
            if x >= lo && x <= hi {
                hit = true;
            }
        } else if fold(set[i], nocase) == fold(c, nocase) {
            hit = true;
        }
        i += 1;
    }
    (hit, &[])
}

fn lower_signed(x: i32) -> i32 {
    if (i32::from(b'A')..=i32::from(b'Z')).contains(&x) {
        x + 32
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns_match_as_in_redis() {
        let yes = |p: &str, s: &str| assert!(matches(p.as_bytes(), s.as_bytes(), false), "{p} {s}");
        let no = |p: &str, s: &str| assert!(!matches(p.as_bytes(), s.as_bytes(), false), "{p} {s}");
        // As Redis's `stringmatchlen`: an empty string matches no pattern but the empty
        // one (KEYS and SCAN take `*` alone as "every key" before matching).
        no("*", "");
        yes("*", "anything");
        yes("h?llo", "hello");
        no("h?llo", "hllo");
        yes("h*llo", "heeeello");
        yes("h[ae]llo", "hallo");
        no("h[ae]llo", "hillo");
        yes("h[^e]llo", "hallo");
        no("h[^e]llo", "hello");
        yes("h[a-b]llo", "hbllo");
        yes("h[b-a]llo", "hbllo");
        yes("h\\*llo", "h*llo");
        no("h\\*llo", "hello");
        yes("a[\\]]b", "a]b");
        yes("k*", "k1");
        no("k*", "x");
        yes("*a*b*c*", "xxaxxbxxc");
        no("*a*b*c*", "xxaxxcxxb");
        // A set that does not close takes the rest of the pattern.
        yes("a[bc", "ab");
        no("a[bc", "abc");
        yes("", "");
        no("", "a");
        no("a", "");
        no("a[", "ab");
        yes("a[^", "ab");
        no("a[", "a");
        yes("a**", "a");
        assert!(matches(b"HASH-*", b"hash-max", true));
        assert!(!matches(b"HASH-*", b"hash-max", false));
        assert!(matches(b"[A-C]x", b"bx", true));
        // Bytes above 0x7f are negative chars in ranges.
        assert!(matches(b"[\x80-a]", b"\xff", false));
        assert!(matches(b"[a-\x80]", b"\xff", false));
        assert!(!matches(b"[\x01-\x7f]", b"\xff", false));
    }

    #[test]
    fn many_stars_end_quickly() {
        let p = "*a".repeat(30) + "b";
        let s = "a".repeat(60);
        assert!(!matches(p.as_bytes(), s.as_bytes(), false));
        let deep = "a*".repeat(5000);
        assert!(!matches(deep.as_bytes(), &[b'a'; 6000], false));
    }
}
