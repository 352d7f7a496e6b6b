//! Redis protocol helpers of the clients in tests.

/// A command as a RESP array of bulk strings (what a client such as `redis-cli` sends).
pub fn command(words: &[&[u8]]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        b.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
        b.extend_from_slice(w);
        b.extend_from_slice(b"\r\n");
    }
    b
}

/// [`command`] of owned words.
pub fn command_of(words: &[Vec<u8>]) -> Vec<u8> {
    let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
    command(&refs)
}

/// The bulk strings of an array (or RESP3 set) reply, in order; `None` when it is not an
/// array of bulk strings.
pub fn bulks(r: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = |at: usize| -> Option<(i64, usize)> {
        let e = at + r.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
        let n = std::str::from_utf8(&r[at + 1..e]).ok()?.parse().ok()?;
        Some((n, e + 2))
    };
    if !matches!(r.first(), Some(b'*' | b'~')) {
        return None;
    }
    let (n, mut at) = line(0)?;
    let mut v = Vec::new();
    for _ in 0..n {
        if r.get(at) != Some(&b'$') {
            return None;
        }
        let (len, start) = line(at)?;
        let end = start + usize::try_from(len).ok()?;
        v.push(r.get(start..end)?.to_vec());
        at = end + 2;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            command(&[b"SET", b"k", b""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
        assert_eq!(
            command_of(&[b"GET".to_vec(), b"key".to_vec()]),
            command(&[b"GET", b"key"])
        );
    }

    #[test]
    fn array_replies_read_as_bulks() {
        assert_eq!(
            bulks(b"*2\r\n$1\r\na\r\n$0\r\n\r\n"),
            Some(vec![b"a".to_vec(), Vec::new()])
        );
        assert_eq!(bulks(b"~1\r\n$2\r\nab\r\n"), Some(vec![b"ab".to_vec()]));
        assert_eq!(bulks(b"*0\r\n"), Some(Vec::new()));
        assert_eq!(bulks(b"*1\r\n:1\r\n"), None);
        assert_eq!(bulks(b"*2\r\n$1\r\na\r\n"), None);
        assert_eq!(bulks(b"$1\r\na\r\n"), None);
    }
}
