//! Inline commands: one line of words, split as Redis's `sdssplitargs` splits them.
//!
//! - Words are separated by spaces, tabs, CR and LF; leading `\v` and `\f` are skipped too.
//! - `"..."` holds spaces and the escapes `\n \r \t \b \a`, `\xHH` (two hex digits) and `\c`
//!   for any other `c`.
//! - `'...'` holds spaces and the escape `\'`.
//! - A quote inside a word opens a quoted part of that word (`a"b c"` is `ab c`).
//! - A closing quote must be followed by whitespace or the end of the line, and every quote
//!   must close: otherwise the line is an error ("unbalanced quotes").
//! - A NUL byte ends the line (Redis parses it as a C string).

/// How one word of an inline line was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Word {
    /// Raw bytes of the word in the line (quotes and escapes included).
    pub start: usize,
    /// End of the raw bytes.
    pub end: usize,
    /// The word has quotes or escapes: its value differs from its raw bytes.
    pub quoted: bool,
}

/// The line held quotes that do not close, or a closing quote followed by a non-space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unbalanced;

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Past the closing quote at `at`, which must end the word.
fn close_quote(line: &[u8], at: usize) -> Result<usize, Unbalanced> {
    match line.get(at + 1) {
        Some(&b) if !is_space(b) => Err(Unbalanced),
        _ => Ok(at + 1),
    }
}

/// The line as Redis sees it: up to its first NUL.
pub(crate) fn c_line(line: &[u8]) -> &[u8] {
    match line.iter().position(|&b| b == 0) {
        Some(n) => &line[..n],
        None => line,
    }
}

/// The next word of `line` at or after `at`, calling `out` with each byte of its value.
/// `Ok(None)`: no more words. `line` must already be cut at its first NUL ([`c_line`]).
pub(crate) fn next_word(
    line: &[u8],
    mut at: usize,
    mut out: impl FnMut(u8),
) -> Result<Option<Word>, Unbalanced> {
    while at < line.len() && is_space(line[at]) {
        at += 1;
    }
    if at == line.len() {
        return Ok(None);
    }
    let start = at;
    let mut quoted = false;
    #[derive(PartialEq)]
    enum Mode {
        Plain,
        Double,
        Single,
    }
    let mut mode = Mode::Plain;
    let at_end = |i: usize| i >= line.len();
    loop {
        match mode {
            Mode::Plain => {
                if at_end(at) {
                    break;
                }
                match line[at] {
                    b' ' | b'\n' | b'\r' | b'\t' => break,
                    b'"' => {
                        quoted = true;
                        mode = Mode::Double;
                    }
                    b'\'' => {
                        quoted = true;
                        mode = Mode::Single;
                    }
                    b => out(b),
                }
                at += 1;
            }
            Mode::Double => {
                if at_end(at) {
                    return Err(Unbalanced);
                }
                let b = line[at];
                if b == b'\\' && at + 1 < line.len() {
                    let e = line[at + 1];
                    if e == b'x' {
                        if let (Some(h), Some(l)) = (
                            line.get(at + 2).copied().and_then(hex),
                            line.get(at + 3).copied().and_then(hex),
                        ) {
                            out(h * 16 + l);
                            at += 4;
                            continue;
                        }
                    }
                    out(match e {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                    at += 2;
                } else if b == b'"' {
                    at = close_quote(line, at)?;
                    break;
                } else {
                    out(b);
                    at += 1;
                }
            }
            Mode::Single => {
                if at_end(at) {
                    return Err(Unbalanced);
                }
                let b = line[at];
                if b == b'\\' && line.get(at + 1) == Some(&b'\'') {
                    out(b'\'');
                    at += 2;
                } else if b == b'\'' {
                    at = close_quote(line, at)?;
                    break;
                } else {
                    out(b);
                    at += 1;
                }
            }
        }
    }
    Ok(Some(Word {
        start,
        end: at,
        quoted,
    }))
}

/// The value of one raw word (as [`next_word`] found it) appended to `out`.
pub(crate) fn unquote_word(raw: &[u8], out: &mut Vec<u8>) {
    let _ = next_word(c_line(raw), 0, |b| out.push(b));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &[u8]) -> Result<Vec<Vec<u8>>, Unbalanced> {
        let line = c_line(line);
        let mut words = Vec::new();
        let mut at = 0;
        loop {
            let mut v = Vec::new();
            match next_word(line, at, |b| v.push(b))? {
                None => return Ok(words),
                Some(w) => {
                    at = w.end;
                    let mut again = Vec::new();
                    unquote_word(&line[w.start..w.end], &mut again);
                    assert_eq!(again, v, "a raw word decodes to the same value");
                    assert_eq!(w.quoted, line[w.start..w.end] != v[..]);
                    words.push(v);
                }
            }
        }
    }

    fn ok(line: &[u8], want: &[&[u8]]) {
        let got = split(line).unwrap();
        let want: Vec<Vec<u8>> = want.iter().map(|w| w.to_vec()).collect();
        assert_eq!(got, want, "{:?}", String::from_utf8_lossy(line));
    }

    #[test]
    fn words_split_as_redis_splits_them() {
        ok(b"SET \"a b\" c", &[b"SET", b"a b", b"c"]);
        ok(b"  get\tkey  ", &[b"get", b"key"]);
        ok(b"\x0b\x0cget k", &[b"get", b"k"]);
        ok(
            b"SET k \"\\x41\\x4a\\n\\r\\t\\b\\a\\\\\\\"\\q\"",
            &[b"SET", b"k", b"AJ\n\r\t\x08\x07\\\"q"],
        );
        ok(b"SET k \"\\x4\"", &[b"SET", b"k", b"x4"]);
        ok(b"SET k 'a\\'b\\n'", &[b"SET", b"k", b"a'b\\n"]);
        ok(b"a\"b c\"", &[b"ab c"]);
        ok(b"SET \"\" v", &[b"SET", b"", b"v"]);
        ok(b"get k\0 ignored \"", &[b"get", b"k"]);
        ok(b"", &[]);
    }

    #[test]
    fn quotes_that_do_not_close_are_unbalanced() {
        for bad in [
            &b"SET \"a b c"[..],
            b"SET 'a",
            b"SET \"a\"b c",
            b"SET 'a'b",
            b"set 'it''s'",
            b"SET \"a\\\"",
        ] {
            assert_eq!(
                split(bad),
                Err(Unbalanced),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
