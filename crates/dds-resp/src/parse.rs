//! Client commands: `*<n>\r\n` followed by `n` bulk strings `$<len>\r\n<bytes>\r\n`, or an
//! inline command (a line of space-separated words, as `redis-cli` and telnet users send).

use std::ops::Range;

use crate::inline;

/// Bounds on what a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string (Redis's `proto-max-bulk-len`).
    pub max_bulk: usize,
    /// Most arguments of one command (Redis: `INT_MAX`; the arguments' bytes must arrive
    /// before any room is taken for them).
    pub max_args: usize,
    /// Longest inline command line, and longest `*`/`$` header line (Redis: 64 KiB).
    pub max_inline: usize,
    /// The client has not authenticated yet (a password is set): as Redis, more than 10
    /// arguments or a bulk string over 16 KiB is a protocol error.
    pub unauthenticated: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 512 << 20,
            max_args: i32::MAX as usize,
            max_inline: 64 << 10,
            unauthenticated: false,
        }
    }
}

/// A protocol error: what Redis replies (after `-ERR `) before it closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolError {
    /// Redis's text (for [`ProtocolError::got`]: the text before the byte).
    pub why: &'static str,
    /// The byte found where a `$` was expected (`expected '$', got '%c'`).
    pub got: Option<u8>,
}

/// Every byte value at its own index: a one-byte `'static` slice of any byte.
static BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = i as u8;
        i += 1;
    }
    t
};

const EXPECTED_DOLLAR: &str = "expected '$', got";

impl ProtocolError {
    /// An error with a fixed text.
    pub const fn new(why: &'static str) -> Self {
        ProtocolError { why, got: None }
    }

    fn expected_dollar(got: u8) -> Self {
        ProtocolError {
            why: EXPECTED_DOLLAR,
            got: Some(got),
        }
    }

    /// The error reply's text, without the leading `-` and the CRLF, in pieces (no
    /// allocation): `ERR Protocol error: ...`. Redis prints the unexpected byte as it is, CR
    /// and LF as spaces ([`crate::Reply::error_bytes`] does that).
    pub fn reply_parts(&self) -> [&'static [u8]; 4] {
        match self.got {
            None => [b"ERR Protocol error: ", self.why.as_bytes(), b"", b""],
            Some(b) => [
                b"ERR Protocol error: expected '$', got '",
                &BYTES[b as usize..b as usize + 1],
                b"'",
                b"",
            ],
        }
    }

    /// The whole error reply (`-ERR Protocol error: ...\r\n`) written to the start of `out`;
    /// its length, or 0 when it does not fit.
    pub fn write_reply(&self, out: &mut [u8]) -> usize {
        let mut at = 0;
        for p in std::iter::once(&b"-"[..])
            .chain(self.reply_parts())
            .chain(std::iter::once(&b"\r\n"[..]))
        {
            let Some(dst) = out.get_mut(at..at + p.len()) else {
                return 0;
            };
            dst.copy_from_slice(p);
            at += p.len();
        }
        // As Redis: a CR or LF inside an error reply is sent as a space.
        for b in &mut out[1..at - 2] {
            if *b == b'\r' || *b == b'\n' {
                *b = b' ';
            }
        }
        at
    }
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.got {
            None => write!(f, "Protocol error: {}", self.why),
            Some(b) => write!(
                f,
                "Protocol error: expected '$', got '{}'",
                [b].escape_ascii()
            ),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Where a header line (`*<n>` or `$<len>`) starting at `from` ends, found as Redis finds it
/// with `strchr(.., '\r')`: at the first CR, unless a NUL comes first (Redis's search stops
/// there: the line is not complete yet). The byte after the CR must have arrived; Redis skips
/// it without looking at it.
fn line_cr(buf: &[u8], from: usize) -> Option<usize> {
    let cr = from + buf[from..].iter().position(|&b| b == b'\r' || b == 0)?;
    (buf[cr] == b'\r' && cr + 2 <= buf.len()).then_some(cr)
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

/// The end (its CR) of the header line at `at`, or `Ok(None)` while it is incomplete; a line
/// longer than Redis's inline limit is `too_big`.
fn header_line(
    buf: &[u8],
    at: usize,
    lim: &Limits,
    too_big: &'static str,
) -> Result<Option<usize>, ProtocolError> {
    match line_cr(buf, at) {
        Some(cr) => Ok(Some(cr)),
        None if buf.len() - at > lim.max_inline => Err(ProtocolError::new(too_big)),
        None => Ok(None),
    }
}

/// Walks the multibulk command at the start of `buf` (`buf[0]` is `*`) as Redis's
/// `processMultibulkBuffer` does, calling `arg` with each argument's range; the bytes the
/// command takes, or `Ok(None)` while it is incomplete.
fn multibulk(
    buf: &[u8],
    lim: &Limits,
    mut arg: impl FnMut(Range<usize>),
) -> Result<Option<usize>, ProtocolError> {
    let Some(cr) = header_line(buf, 0, lim, "too big mbulk count string")? else {
        return Ok(None);
    };
    let n = match parse_int(&buf[1..cr]) {
        Some(n) if n <= lim.max_args as i64 => n,
        _ => return Err(ProtocolError::new("invalid multibulk length")),
    };
    if n > 10 && lim.unauthenticated {
        return Err(ProtocolError::new("unauthenticated multibulk length"));
    }
    let mut at = cr + 2;
    // `*0` and `*-1` are empty commands: skipped.
    for _ in 0..n.max(0) {
        let Some(cr) = header_line(buf, at, lim, "too big bulk count string")? else {
            return Ok(None);
        };
        if buf[at] != b'$' {
            return Err(ProtocolError::expected_dollar(buf[at]));
        }
        let len = match parse_int(&buf[at + 1..cr]) {
            Some(len) if len >= 0 && len as u64 <= lim.max_bulk as u64 => len as usize,
            _ => return Err(ProtocolError::new("invalid bulk length")),
        };
        if len > 16384 && lim.unauthenticated {
            return Err(ProtocolError::new("unauthenticated bulk length"));
        }
        let data = cr + 2;
        // The two bytes after the data (a CRLF) are skipped unchecked, as Redis skips them.
        if buf.len() < data + len + 2 {
            return Ok(None);
        }
        arg(data..data + len);
        at = data + len + 2;
    }
    Ok(Some(at))
}

/// The end of an inline command's line (its LF), found as Redis finds it with
/// `strchr(.., '\n')`: a NUL before the LF means the line is not complete yet.
fn inline_lf(buf: &[u8], lim: &Limits) -> Result<Option<usize>, ProtocolError> {
    let too_big = ProtocolError::new("too big inline request");
    match buf.iter().position(|&b| b == b'\n' || b == 0) {
        Some(nl) if buf[nl] == b'\n' => {
            if nl > lim.max_inline {
                Err(too_big)
            } else {
                Ok(Some(nl))
            }
        }
        _ if buf.len() > lim.max_inline => Err(too_big),
        _ => Ok(None),
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
/// `Ok(None)`: more bytes are needed. Errors carry Redis's text for the same bytes, and a
/// command is complete exactly when Redis would run it.
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
    let r = multibulk(buf, lim, |a| args.push(a));
    if !matches!(r, Ok(Some(_))) {
        args.clear();
    }
    r
}

fn parse_inline(buf: &[u8], lim: &Limits, argv: &mut Argv) -> Result<Option<usize>, ProtocolError> {
    let Some(nl) = inline_lf(buf, lim)? else {
        return Ok(None);
    };
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
                return Err(ProtocolError::new("unbalanced quotes in request"));
            }
            Ok(None) => break,
            Ok(Some(w)) => {
                argv.ranges.push(start..argv.inline.len());
                at = w.end;
            }
        }
    }
    Ok(Some(nl + 1))
}

/// The length of the command at the start of `buf` without collecting its arguments
/// (for framing on the DPU); `Ok(None)`: more bytes are needed. Agrees with
/// [`parse_command`] on every input, errors included, except that an inline line's quotes
/// are checked by [`parse_command`] only.
pub fn frame_command(buf: &[u8], lim: &Limits) -> Result<Option<usize>, ProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return Ok(inline_lf(buf, lim)?.map(|nl| nl + 1));
    }
    multibulk(buf, lim, |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reply;

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
            words(b"SET \"a b\n").unwrap_err().why,
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

    /// The reply line of the error a buffer gets.
    fn error_line(b: &[u8]) -> Vec<u8> {
        let e = words(b).unwrap_err();
        if b[0] == b'*' {
            // (Framing leaves an inline line's quotes to the parser.)
            assert_eq!(
                frame_command(b, &Limits::default()),
                Err(e),
                "framing agrees"
            );
        }
        let mut out = [0u8; 300];
        let n = e.write_reply(&mut out);
        let mut v = Vec::new();
        Reply::new(&mut v).error_bytes(&e.reply_parts());
        assert_eq!(v, &out[..n]);
        v
    }

    #[test]
    fn malformed_input_gets_the_redis_error_text() {
        // Each reply was taken from redis-server 7.0.15 given the same bytes.
        for (input, reply) in [
            (
                &b"*x\r\n"[..],
                &b"-ERR Protocol error: invalid multibulk length\r\n"[..],
            ),
            (
                b"*2147483648\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*2\r\n:1\r\n",
                b"-ERR Protocol error: expected '$', got ':'\r\n",
            ),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
                b"-ERR Protocol error: expected '$', got 'f'\r\n",
            ),
            (
                b"*1\r\n\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1\r\n\nabc\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1\r\n\xffabc\r\n",
                b"-ERR Protocol error: expected '$', got '\xff'\r\n",
            ),
            (
                b"*1\r\n$-1\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$01\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$+1\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$536870913\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"SET \"a b\r\n",
                b"-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
        ] {
            assert_eq!(error_line(input), reply, "{}", input.escape_ascii());
        }
        let lim = Limits {
            max_bulk: 10,
            ..Limits::default()
        };
        let mut a = Argv::new();
        // Refused from the header, before the announced bytes arrive.
        assert_eq!(
            parse_command(b"*1\r\n$11\r\n", &lim, &mut a)
                .unwrap_err()
                .why,
            "invalid bulk length"
        );
        let unauth = Limits {
            unauthenticated: true,
            ..Limits::default()
        };
        assert_eq!(
            parse_command(b"*11\r\n", &unauth, &mut a).unwrap_err().why,
            "unauthenticated multibulk length"
        );
        assert_eq!(parse_command(b"*10\r\n", &unauth, &mut a), Ok(None));
        assert_eq!(
            parse_command(b"*1\r\n$16385\r\n", &unauth, &mut a)
                .unwrap_err()
                .why,
            "unauthenticated bulk length"
        );
        assert_eq!(
            parse_command(b"*1\r\n$16384\r\n", &unauth, &mut a),
            Ok(None)
        );
        let long = vec![b'a'; (64 << 10) + 2];
        assert_eq!(words(&long).unwrap_err().why, "too big inline request");
        let mut hdr = b"*".to_vec();
        hdr.extend(std::iter::repeat_n(b'1', 70 << 10));
        assert_eq!(words(&hdr).unwrap_err().why, "too big mbulk count string");
    }

    #[test]
    fn lines_end_where_redis_finds_them() {
        // As redis-server 7.0.15: the byte after a header's CR and the two bytes after a
        // bulk string are skipped unchecked; a NUL before the line's end (CR, or LF for an
        // inline command) leaves the command incomplete; a bad argument header waits for its
        // line's end.
        let (n, w) = words(b"*1\r\n$4\r\nPINGxx*1").unwrap().unwrap();
        assert_eq!((n, w), (14, vec![b"PING".to_vec()]));
        let (n, w) = words(b"*1\rx$4\rxPING\r\n").unwrap().unwrap();
        assert_eq!((n, w), (14, vec![b"PING".to_vec()]));
        for incomplete in [
            &b"*1\r\n\x00abc\r\n"[..],
            b"GET k\x00\r\n",
            b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz",
            b"*1\r",
            b"*1\r\n$4\r\nPING\r",
        ] {
            assert_eq!(
                words(incomplete).unwrap(),
                None,
                "{}",
                incomplete.escape_ascii()
            );
            assert_eq!(frame_command(incomplete, &Limits::default()).unwrap(), None);
        }
        assert_eq!(words(b"*-3\r\nPING\r\n").unwrap(), Some((5, vec![])));
        assert_eq!(words(b"*1048577\r\n").unwrap(), None);
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
        match line_cr(cmd, 0).and_then(|e| Some((parse_int(&cmd[1..e])?, e + 2))) {
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
#[derive(Clone)]
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
        let e = line_cr(b, self.at)?;
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
