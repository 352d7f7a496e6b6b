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
}
