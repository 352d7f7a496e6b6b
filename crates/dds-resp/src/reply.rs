//! Framing of server replies: `+simple`, `-error`, `:integer`, `$bulk` (or `$-1`), and
//! `*array` of replies (or `*-1`), nested at most [`MAX_REPLY_DEPTH`](crate::MAX_REPLY_DEPTH)
//! levels.

use crate::parse::{parse_int, ProtocolError};
use crate::MAX_REPLY_DEPTH;

fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let p = buf.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
    Some(from + p)
}

/// The length of the reply at the start of `buf`; `Ok(None)`: more bytes are needed.
/// `max_line` bounds header and simple-string lines, `max_bulk` bulk strings.
pub fn frame_reply(
    buf: &[u8],
    max_line: usize,
    max_bulk: usize,
) -> Result<Option<usize>, ProtocolError> {
    // Elements still expected at each open array level.
    let mut left = [0i64; MAX_REPLY_DEPTH];
    let mut depth = 0usize;
    let mut at = 0usize;
    loop {
        let Some(&kind) = buf.get(at) else {
            return Ok(None);
        };
        let Some(end) = line_end(buf, at + 1) else {
            if buf.len() - at > max_line {
                return Err(ProtocolError::new("reply line too long"));
            }
            return Ok(None);
        };
        if end - at > max_line {
            return Err(ProtocolError::new("reply line too long"));
        }
        let line = &buf[at + 1..end];
        at = end + 2;
        match kind {
            // RESP3 line types: null, boolean, double, big number.
            b'+' | b'-' | b'_' | b'#' | b',' | b'(' => {}
            b':' => {
                parse_int(line).ok_or(ProtocolError::new("invalid integer reply"))?;
            }
            // RESP3 verbatim strings and blob errors are framed as bulk strings.
            b'$' | b'=' | b'!' => {
                let n = parse_int(line).ok_or(ProtocolError::new("invalid bulk length"))?;
                if n >= 0 {
                    if n as u64 > max_bulk as u64 {
                        return Err(ProtocolError::new("invalid bulk length"));
                    }
                    let e = at + n as usize;
                    if buf.len() < e + 2 {
                        return Ok(None);
                    }
                    if &buf[e..e + 2] != b"\r\n" {
                        return Err(ProtocolError::new("expected CRLF after a bulk string"));
                    }
                    at = e + 2;
                } else if n != -1 {
                    return Err(ProtocolError::new("invalid bulk length"));
                }
            }
            // RESP3 maps (2n elements), sets, pushes and attributes.
            b'*' | b'%' | b'~' | b'>' | b'|' => {
                let mut n =
                    parse_int(line).ok_or(ProtocolError::new("invalid multibulk length"))?;
                if (kind == b'%' || kind == b'|') && n > 0 {
                    n = n
                        .checked_mul(2)
                        .ok_or(ProtocolError::new("invalid multibulk length"))?;
                }
                if n > 0 {
                    if depth == MAX_REPLY_DEPTH {
                        return Err(ProtocolError::new("reply nested too deep"));
                    }
                    left[depth] = n;
                    depth += 1;
                    continue;
                } else if n < -1 {
                    return Err(ProtocolError::new("invalid multibulk length"));
                }
            }
            _ => return Err(ProtocolError::new("unknown reply type")),
        }
        // One element done: close the arrays it completes.
        loop {
            if depth == 0 {
                return Ok(Some(at));
            }
            left[depth - 1] -= 1;
            if left[depth - 1] > 0 {
                break;
            }
            depth -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(b: &[u8]) -> Result<Option<usize>, ProtocolError> {
        frame_reply(b, 1 << 16, 1 << 20)
    }

    #[test]
    fn frames_every_reply_type_only_when_complete() {
        let replies: [&[u8]; 10] = [
            b"_\r\n",
            b"%1\r\n+k\r\n*2\r\n:1\r\n_\r\n",
            b"=8\r\ntxt:ab\r\n\r\n",
            b"+OK\r\n",
            b"-ERR no\r\n",
            b":-42\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*3\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n*0\r\n",
        ];
        for r in replies {
            for cut in 0..r.len() {
                assert_eq!(f(&r[..cut]).unwrap(), None, "{r:?} cut at {cut}");
            }
            let mut two = r.to_vec();
            two.extend_from_slice(b"+OK\r\n");
            assert_eq!(f(&two).unwrap(), Some(r.len()), "{r:?}");
        }
    }

    #[test]
    fn malformed_replies_are_errors() {
        assert!(f(b"?x\r\n").is_err());
        assert!(f(b"$-2\r\n").is_err());
        assert!(f(b":1x\r\n").is_err());
        assert!(f(b"$1\r\nabc").is_err());
        let deep = "*1\r\n".repeat(MAX_REPLY_DEPTH + 1);
        assert!(f(deep.as_bytes()).is_err());
    }
}
