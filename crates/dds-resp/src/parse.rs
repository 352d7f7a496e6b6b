//! Client commands: `*<n>\r\n` followed by `n` bulk strings `$<len>\r\n<bytes>\r\n`, or an
//! inline command (a line of space-separated words, as `redis-cli` and telnet users send).

use std::ops::Range;

use crate::inline;

/// Bounds on what a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string (Redis's `proto-max-bulk-len`).
    pub max_bulk: usize,
    /// Most arguments of one command (Redis: 1024 × 1024).
    pub max_args: usize,
    /// Longest inline command line, and longest `*`/`$` header line (Redis: 64 KiB).
    pub max_inline: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 512 << 20,
            max_args: 1 << 20,
            max_inline: 64 << 10,
        }
    }
}

/// A protocol error. The text is what Redis replies (after `-ERR `) before it closes the
/// connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub &'static str);

impl ProtocolError {
    /// The whole error reply line, without the CRLF: `ERR Protocol error: ...`.
    pub fn reply_text(&self) -> String {
        format!("ERR Protocol error: {}", self.0)
    }
}

/// Position of the first CRLF at or after `from`.
fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 1 < buf.len() {
        match buf[i..].iter().position(|&b| b == b'\r') {
            None => return None,
            Some(p) => {
                let at = i + p;
                if at + 1 >= buf.len() {
                    return None;
                }
                if buf[at + 1] == b'\n' {
                    return Some(at);
                }
                i = at + 1;
            }
        }
    }
    None
}

/// Parses a decimal integer as Redis's `string2ll` does (no sign for lengths; no leading `+`,
/// no spaces, no leading zeros except "0").
pub(crate) fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.first() {
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 || (digits.len() > 1 && digits[0] == b'0') {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(i64::from(d - b'0'))?
        } else {
            v.checked_add(i64::from(d - b'0'))?
        };
    }
    if neg && v == 0 {
        return None;
    }
    Some(v)
}

/// Reads a header line `<prefix><int>\r\n` starting at `at` (the prefix byte already checked);
/// `Ok(None)` if the line is incomplete.
fn header(
    buf: &[u8],
    at: usize,
    lim: &Limits,
    too_big: &'static str,
    invalid: &'static str,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    match find_crlf(buf, at + 1) {
        None => {
            if buf.len() - at > lim.max_inline {
                Err(ProtocolError(too_big))
            } else {
                Ok(None)
            }
        }
        Some(end) => {
            let n = parse_int(&buf[at + 1..end]).ok_or(ProtocolError(invalid))?;
            Ok(Some((n, end + 2)))
        }
    }
}

/// The arguments of the last command [`parse_command`] parsed: ranges of the parsed buffer,
/// or, for an inline command, of the argument bytes it decoded (quotes and escapes undone).
/// Reused from command to command, so parsing allocates only while it grows.
#[derive(Debug, Default)]
pub struct Argv {
    ranges: Vec<Range<usize>>,
    inline: Vec<u8>,
    from_inline: bool,
}

impl Argv {
    /// An empty list.
    pub fn new() -> Self {
        Argv::default()
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// No arguments (an empty command, which a server skips).
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The arguments, given the buffer that was parsed (`buf` of [`parse_command`]).
    pub fn iter<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        let src: &'a [u8] = if self.from_inline { &self.inline } else { buf };
        self.ranges.iter().map(move |r| &src[r.clone()])
    }

    fn clear(&mut self) {
        self.ranges.clear();
        self.inline.clear();
        self.from_inline = false;
    }
}

/// An empty list with `v`'s allocation and any lifetime: one list holds the argument slices
/// of command after command (each borrowed from its own [`Argv`]) without allocating again.
pub fn reuse<'b>(mut v: Vec<&[u8]>) -> Vec<&'b [u8]> {
    v.clear();
    // Collecting an emptied vector into one of the same layout reuses its allocation.
    v.into_iter()
        .map(|_| -> &'b [u8] { unreachable!() })
        .collect()
}

/// Parses one command at the start of `buf`. On success returns the bytes it takes and fills
/// `args` with its arguments (none for an empty inline line, which the caller skips).
/// `Ok(None)`: more bytes are needed.
pub fn parse_command(
    buf: &[u8],
    lim: &Limits,
    argv: &mut Argv,
) -> Result<Option<usize>, ProtocolError> {
    argv.clear();
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return parse_inline(buf, lim, argv);
    }
    let args = &mut argv.ranges;
    let Some((n, mut at)) = header(
        buf,
        0,
        lim,
        "too big mbulk count string",
        "invalid multibulk length",
    )?
    else {
        return Ok(None);
    };
    if n > lim.max_args as i64 {
        return Err(ProtocolError("invalid multibulk length"));
    }
    if n <= 0 {
        // `*0` and `*-1` are empty commands: skipped.
        return Ok(Some(at));
    }
    for _ in 0..n {
        let Some(&b) = buf.get(at) else {
            return Ok(None);
        };
        if b != b'$' {
            return Err(ProtocolError(match b {
                b'*' => "expected '$', got '*'",
                b':' => "expected '$', got ':'",
                b'+' => "expected '$', got '+'",
                b'-' => "expected '$', got '-'",
                _ => "expected '$', got something else",
            }));
        }
        let Some((len, data)) = header(
            buf,
            at,
            lim,
            "too big bulk count string",
            "invalid bulk length",
        )?
        else {
            return Ok(None);
        };
        if len < 0 || len as u64 > lim.max_bulk as u64 {
            return Err(ProtocolError("invalid bulk length"));
        }
        let end = data + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError("expected CRLF after a bulk string"));
        }
        args.push(data..end);
        at = end + 2;
    }
    Ok(Some(at))
}

fn parse_inline(buf: &[u8], lim: &Limits, argv: &mut Argv) -> Result<Option<usize>, ProtocolError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > lim.max_inline {
            return Err(ProtocolError("too big inline request"));
        }
        return Ok(None);
    };
    if nl > lim.max_inline {
        return Err(ProtocolError("too big inline request"));
    }
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    // The values are decoded into the argument list's own buffer (a copy: quotes and
    // escapes make them differ from the line's bytes).
    argv.from_inline = true;
    let line = inline::c_line(&buf[..line_end]);
    let mut at = 0;
    loop {
        let start = argv.inline.len();
        let out = &mut argv.inline;
        match inline::next_word(line, at, |b| out.push(b)) {
            Err(inline::Unbalanced) => {
                return Err(ProtocolError("unbalanced quotes in request"));
            }
            Ok(None) => break,
            Ok(Some(w)) => {
                if argv.ranges.len() == lim.max_args {
                    return Err(ProtocolError("invalid multibulk length"));
                }
                argv.ranges.push(start..argv.inline.len());
                at = w.end;
            }
        }
    }
    Ok(Some(nl + 1))
}

/// The length of the command at the start of `buf` without collecting its arguments
/// (for framing on the DPU); `Ok(None)`: more bytes are needed.
pub fn frame_command(buf: &[u8], lim: &Limits) -> Result<Option<usize>, ProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return match buf.iter().position(|&b| b == b'\n') {
            Some(nl) if nl <= lim.max_inline => Ok(Some(nl + 1)),
            Some(_) => Err(ProtocolError("too big inline request")),
            None if buf.len() > lim.max_inline => Err(ProtocolError("too big inline request")),
            None => Ok(None),
        };
    }
    let Some((n, mut at)) = header(
        buf,
        0,
        lim,
        "too big mbulk count string",
        "invalid multibulk length",
    )?
    else {
        return Ok(None);
    };
    if n > lim.max_args as i64 {
        return Err(ProtocolError("invalid multibulk length"));
    }
    for _ in 0..n.max(0) {
        let Some(&b) = buf.get(at) else {
            return Ok(None);
        };
        if b != b'$' {
            return Err(ProtocolError("expected '$'"));
        }
        let Some((len, data)) = header(
            buf,
            at,
            lim,
            "too big bulk count string",
            "invalid bulk length",
        )?
        else {
            return Ok(None);
        };
        if len < 0 || len as u64 > lim.max_bulk as u64 {
            return Err(ProtocolError("invalid bulk length"));
        }
        at = data + len as usize + 2;
        if buf.len() < at {
            return Ok(None);
        }
    }
    Ok(Some(at))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Parsed = Option<(usize, Vec<Vec<u8>>)>;

    fn words(buf: &[u8]) -> Result<Parsed, ProtocolError> {
        let mut a = Argv::new();
        Ok(parse_command(buf, &Limits::default(), &mut a)?
            .map(|n| (n, a.iter(buf).map(<[u8]>::to_vec).collect())))
    }

    #[test]
    fn multibulk_commands_parse_only_when_complete() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        for cut in 0..cmd.len() {
            assert_eq!(words(&cmd[..cut]).unwrap(), None, "cut at {cut}");
            assert_eq!(
                frame_command(&cmd[..cut], &Limits::default()).unwrap(),
                None
            );
        }
        let (n, w) = words(cmd).unwrap().unwrap();
        assert_eq!(n, cmd.len());
        assert_eq!(w, vec![b"SET".to_vec(), b"k".to_vec(), b"hello".to_vec()]);
        assert_eq!(
            frame_command(cmd, &Limits::default()).unwrap(),
            Some(cmd.len())
        );
    }

    #[test]
    fn inline_commands_split_on_spaces() {
        let (n, w) = words(b"  get  key\r\nPING\r\n").unwrap().unwrap();
        assert_eq!(n, 12);
        assert_eq!(w, vec![b"get".to_vec(), b"key".to_vec()]);
        assert_eq!(words(b"\r\n").unwrap(), Some((2, vec![])));
    }

    #[test]
    fn inline_commands_take_quotes_and_escapes_as_redis_does() {
        let (n, w) = words(b"SET \"a b\" 'c\\'d'\r\nGET x\r\n").unwrap().unwrap();
        assert_eq!(n, 18);
        assert_eq!(w, vec![b"SET".to_vec(), b"a b".to_vec(), b"c'd".to_vec()]);
        let (_, w) = words(b"set k \"\\x00\\xff\\n\"\n").unwrap().unwrap();
        assert_eq!(w[2], b"\x00\xff\n".to_vec());
        let (_, w) = words(b"SET \"\" v\n").unwrap().unwrap();
        assert_eq!(w[1], b"".to_vec());
        assert_eq!(
            words(b"SET \"a b\n").unwrap_err().0,
            "unbalanced quotes in request"
        );
        // The iterator of the DPU side finds the same words, as written.
        let line = b"SET \"a b\" c\r\n";
        let a = args(line);
        assert!(a.quoted());
        let raw: Vec<&[u8]> = args(line).collect();
        assert_eq!(raw, vec![&b"SET"[..], b"\"a b\"", b"c"]);
        let mut v = Vec::new();
        unquote_word(raw[1], &mut v);
        assert_eq!(v, b"a b");
        assert!(!args(b"GET k\r\n").quoted());
    }

    #[test]
    fn malformed_input_gets_the_redis_error_text() {
        let e = |b: &[u8]| words(b).unwrap_err().0;
        assert_eq!(e(b"*x\r\n"), "invalid multibulk length");
        assert_eq!(e(b"*2\r\n:1\r\n"), "expected '$', got ':'");
        assert_eq!(e(b"*1\r\n$-5\r\n"), "invalid bulk length");
        assert_eq!(e(b"*1\r\n$01\r\n"), "invalid bulk length");
        assert_eq!(e(b"*1\r\n$2\r\nabXY"), "expected CRLF after a bulk string");
        let lim = Limits {
            max_bulk: 10,
            ..Limits::default()
        };
        let mut a = Argv::new();
        // Refused from the header, before the announced bytes arrive.
        assert_eq!(
            parse_command(b"*1\r\n$11\r\n", &lim, &mut a).unwrap_err().0,
            "invalid bulk length"
        );
        let long = vec![b'a'; (64 << 10) + 2];
        assert_eq!(e(&long), "too big inline request");
        let mut hdr = b"*".to_vec();
        hdr.extend(std::iter::repeat_n(b'1', 70 << 10));
        assert_eq!(e(&hdr), "too big mbulk count string");
    }

    #[test]
    fn integers_parse_like_redis() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b"01",
            b" 1",
            b"1a",
            b"-0",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn framing_agrees_with_parsing(args in proptest::collection::vec(
            proptest::collection::vec(proptest::num::u8::ANY, 0..40), 1..8), junk in 0usize..4) {
            let mut b = format!("*{}\r\n", args.len()).into_bytes();
            for a in &args {
                b.extend(format!("${}\r\n", a.len()).bytes());
                b.extend(a);
                b.extend(b"\r\n");
            }
            let whole = b.len();
            b.extend(std::iter::repeat_n(b'*', junk));
            let (n, w) = words(&b).unwrap().unwrap();
            proptest::prop_assert_eq!(n, whole);
            proptest::prop_assert_eq!(w, args);
            proptest::prop_assert_eq!(frame_command(&b, &Limits::default()).unwrap(), Some(whole));
        }
    }
}

/// The arguments of a framed command (as [`frame_command`] measured it), without allocating.
/// Inline commands split as [`parse_command`] splits them, but each word is yielded as
/// written: a word in quotes or with escapes keeps them ([`Args::quoted`] tells whether any
/// word has them; [`unquote_word`] decodes one). Yields nothing more at the first malformed
/// byte or unbalanced quote.
pub fn args(cmd: &[u8]) -> Args<'_> {
    if cmd.first() == Some(&b'*') {
        match find_crlf(cmd, 1).and_then(|e| Some((parse_int(&cmd[1..e])?, e + 2))) {
            Some((n, at)) if n > 0 => Args {
                cmd,
                at,
                left: n as usize,
                inline: false,
            },
            _ => Args {
                cmd,
                at: cmd.len(),
                left: 0,
                inline: false,
            },
        }
    } else {
        let end = cmd.iter().position(|&b| b == b'\n').unwrap_or(cmd.len());
        let end = if end > 0 && cmd.get(end - 1) == Some(&b'\r') {
            end - 1
        } else {
            end
        };
        Args {
            cmd: inline::c_line(&cmd[..end]),
            at: 0,
            left: usize::MAX,
            inline: true,
        }
    }
}

/// Iterator over a command's arguments; see [`args`].
pub struct Args<'a> {
    cmd: &'a [u8],
    at: usize,
    left: usize,
    inline: bool,
}

impl Args<'_> {
    /// An inline command with quotes: some words yielded differ from their values.
    pub fn quoted(&self) -> bool {
        self.inline && self.cmd.iter().any(|&b| b == b'"' || b == b'\'')
    }
}

/// The value of an inline command's word as [`args`] yielded it, appended to `out`.
pub fn unquote_word(raw: &[u8], out: &mut Vec<u8>) {
    inline::unquote_word(raw, out)
}

impl<'a> Iterator for Args<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        if self.inline {
            return match inline::next_word(self.cmd, self.at, |_| {}) {
                Ok(Some(w)) => {
                    self.at = w.end;
                    Some(&self.cmd[w.start..w.end])
                }
                Ok(None) | Err(_) => {
                    self.left = 0;
                    None
                }
            };
        }
        let b = self.cmd;
        if b.get(self.at) != Some(&b'$') {
            self.left = 0;
            return None;
        }
        let e = find_crlf(b, self.at + 1)?;
        let n = parse_int(&b[self.at + 1..e]).filter(|&n| n >= 0)? as usize;
        let s = e + 2;
        let arg = b.get(s..s.checked_add(n)?)?;
        self.at = s + n + 2;
        self.left -= 1;
        Some(arg)
    }
}

#[cfg(test)]
mod args_tests {
    use super::*;

    #[test]
    fn args_iterate_framed_commands() {
        let c = b"*3\r\n$3\r\nDEL\r\n$1\r\na\r\n$2\r\nbc\r\n";
        assert_eq!(
            args(c).collect::<Vec<_>>(),
            vec![&b"DEL"[..], &b"a"[..], &b"bc"[..]]
        );
        assert_eq!(
            args(b"get  k\r\n").collect::<Vec<_>>(),
            vec![&b"get"[..], &b"k"[..]]
        );
        assert_eq!(args(b"*2\r\n$3\r\nGET\r\n$9\r\nk").count(), 1);
    }
}
