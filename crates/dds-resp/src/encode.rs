//! Reply encoding into a caller's buffer.

/// Appends replies to a byte vector: RESP2, or RESP3 after `HELLO 3` (nulls and maps differ).
pub struct Reply<'a> {
    out: &'a mut Vec<u8>,
    resp3: bool,
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        out.push(b'-');
    }
    out.extend_from_slice(&tmp[i..]);
}

impl<'a> Reply<'a> {
    /// RESP2 replies go to the end of `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Reply { out, resp3: false }
    }

    /// Replies in RESP3 (`resp3`) or RESP2 go to the end of `out`.
    pub fn with_protocol(out: &'a mut Vec<u8>, resp3: bool) -> Self {
        Reply { out, resp3 }
    }

    /// The buffer replies go to.
    pub fn out_mut(&mut self) -> &mut Vec<u8> {
        self.out
    }

    /// `%n` in RESP3, `*2n` in RESP2 (the caller appends `n` key-value pairs).
    pub fn map(&mut self, n: usize) {
        if self.resp3 {
            self.out.push(b'%');
            push_int(self.out, n as i64);
            self.out.extend_from_slice(b"\r\n");
        } else {
            self.array(2 * n);
        }
    }

    /// `+text` (no CR or LF in `text`).
    pub fn simple(&mut self, text: &str) {
        debug_assert!(!text.contains(['\r', '\n']));
        self.out.push(b'+');
        self.out.extend_from_slice(text.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.out.extend_from_slice(b"+OK\r\n");
    }

    /// `-text`: `text` starts with the error code (`ERR`, `WRONGTYPE`, `NOAUTH`...). CR and LF
    /// in it are replaced by spaces, as Redis does.
    pub fn error(&mut self, text: &str) {
        self.out.push(b'-');
        self.out.extend(
            text.bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.out.extend_from_slice(b"\r\n");
    }

    /// `-<parts...>`: an error reply assembled from byte strings, each cut at its first NUL,
    /// trailing CR and LF trimmed and the others turned into spaces, as Redis formats `%s`
    /// arguments into errors.
    pub fn error_bytes(&mut self, parts: &[&[u8]]) {
        self.out.push(b'-');
        let start = self.out.len();
        for p in parts {
            let p = p.split(|&b| b == 0).next().unwrap_or_default();
            self.out.extend_from_slice(p);
        }
        while self.out.len() > start && matches!(self.out.last(), Some(b'\r' | b'\n')) {
            self.out.pop();
        }
        for b in &mut self.out[start..] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
        self.out.extend_from_slice(b"\r\n");
    }

    /// `:n`.
    pub fn int(&mut self, n: i64) {
        self.out.push(b':');
        push_int(self.out, n);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$len\r\nbytes\r\n`.
    pub fn bulk(&mut self, bytes: &[u8]) {
        self.bulk_header(bytes.len());
        self.out.extend_from_slice(bytes);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$len\r\n` alone (the caller appends the bytes and the CRLF).
    pub fn bulk_header(&mut self, len: usize) {
        self.out.push(b'$');
        push_int(self.out, len as i64);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `$-1` (a missing value; `_` in RESP3).
    pub fn null(&mut self) {
        if self.resp3 {
            self.out.extend_from_slice(b"_\r\n");
        } else {
            self.out.extend_from_slice(b"$-1\r\n");
        }
    }

    /// `*n` (the caller appends `n` replies).
    pub fn array(&mut self, n: usize) {
        self.out.push(b'*');
        push_int(self.out, n as i64);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `~n` in RESP3, `*n` in RESP2 (the caller appends `n` replies, a set's members).
    pub fn set(&mut self, n: usize) {
        self.out.push(if self.resp3 { b'~' } else { b'*' });
        push_int(self.out, n as i64);
        self.out.extend_from_slice(b"\r\n");
    }

    /// `*-1` (a missing array; `_` in RESP3).
    pub fn null_array(&mut self) {
        if self.resp3 {
            self.out.extend_from_slice(b"_\r\n");
        } else {
            self.out.extend_from_slice(b"*-1\r\n");
        }
    }
}

/// `$len\r\n` into `out`, returning its length (for writing a bulk header into a fixed room).
pub fn bulk_header_into(len: usize, out: &mut [u8; 24]) -> usize {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let mut u = len;
    loop {
        i -= 1;
        tmp[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    let digits = &tmp[i..];
    out[0] = b'$';
    out[1..1 + digits.len()].copy_from_slice(digits);
    out[1 + digits.len()..3 + digits.len()].copy_from_slice(b"\r\n");
    3 + digits.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame_reply;

    #[test]
    fn encodes_what_the_framer_reads_back() {
        let mut out = Vec::new();
        let mut r = Reply::new(&mut out);
        r.ok();
        r.int(-9_223_372_036_854_775_808);
        r.int(0);
        r.bulk(b"a\r\nb");
        r.null();
        r.array(2);
        r.simple("PONG");
        r.error("ERR bad\r\nthing");
        r.null_array();
        let expect: &[u8] = b"+OK\r\n:-9223372036854775808\r\n:0\r\n$4\r\na\r\nb\r\n$-1\r\n*2\r\n+PONG\r\n-ERR bad  thing\r\n*-1\r\n";
        assert_eq!(out, expect);
        let mut at = 0;
        let mut n = 0;
        while at < out.len() {
            at += frame_reply(&out[at..], 1 << 10, 1 << 10).unwrap().unwrap();
            n += 1;
        }
        assert_eq!(n, 7);
        let mut h = [0u8; 24];
        let l = bulk_header_into(12345, &mut h);
        assert_eq!(&h[..l], b"$12345\r\n");
    }
}
