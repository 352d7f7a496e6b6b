//! `CONFIG GET`, `CONFIG SET` and `CONFIG RESETSTAT`: the parameters Redis clients, tools and
//! test suites read and set, with Redis 7's names, aliases, defaults, checks and error texts.
//!
//! Two kinds (`docs/kv-service.md` §5): parameters fixed by `dds kv`'s start options
//! (`maxmemory`, `appendonly`, ...), which `CONFIG SET` refuses as Redis refuses an immutable
//! one unless the value is the current one; and parameters of Redis mechanisms `dds kv` does
//! not have (eviction policies, encodings, RDB snapshots, ...), which are checked as Redis
//! checks them, kept and reported back, without effect.

use dds_resp::Reply;

use crate::glob;

/// How a parameter's value is written and checked.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `yes` / `no`.
    Bool,
    /// An integer in `[min, max]`.
    Int(i64, i64),
    /// Bytes, with Redis's units (`1k` = 1000, `1kb` = 1024, up to `gb`).
    Bytes,
    /// One of the names.
    Enum(&'static [&'static str]),
    /// `save`: pairs of seconds and changes.
    Save,
}

/// A parameter kept and reported without effect.
struct Param {
    name: &'static str,
    /// The older name Redis also answers to (`hash-max-ziplist-entries`...), or "".
    alias: &'static str,
    kind: Kind,
    default: &'static str,
}

const INT: Kind = Kind::Int(0, i32::MAX as i64);
const SIZE: Kind = Kind::Int(0, i64::MAX);

const POLICIES: &[&str] = &[
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "noeviction",
];

const LOGLEVELS: &[&str] = &["debug", "verbose", "notice", "warning"];

/// Redis 7.0's defaults (`save`: see there).
const PARAMS: &[Param] = &[
    p("maxmemory-policy", "", Kind::Enum(POLICIES), "noeviction"),
    p("maxmemory-samples", "", Kind::Int(1, i32::MAX as i64), "5"),
    p("maxmemory-eviction-tenacity", "", Kind::Int(0, 100), "10"),
    p("timeout", "", INT, "0"),
    p("tcp-keepalive", "", INT, "300"),
    // No RDB snapshots: no schedule by default.
    p("save", "", Kind::Save, ""),
    p("stop-writes-on-bgsave-error", "", Kind::Bool, "yes"),
    p("rdbcompression", "", Kind::Bool, "yes"),
    p("rdbchecksum", "", Kind::Bool, "yes"),
    p("hz", "", INT, "10"),
    p("dynamic-hz", "", Kind::Bool, "yes"),
    p("activerehashing", "", Kind::Bool, "yes"),
    p("activedefrag", "", Kind::Bool, "no"),
    p("active-expire-effort", "", Kind::Int(1, 10), "1"),
    p("lazyfree-lazy-eviction", "", Kind::Bool, "no"),
    p("lazyfree-lazy-expire", "", Kind::Bool, "no"),
    p("lazyfree-lazy-server-del", "", Kind::Bool, "no"),
    p("lazyfree-lazy-user-del", "", Kind::Bool, "no"),
    p("lazyfree-lazy-user-flush", "", Kind::Bool, "no"),
    p(
        "hash-max-listpack-entries",
        "hash-max-ziplist-entries",
        SIZE,
        "512",
    ),
    p(
        "hash-max-listpack-value",
        "hash-max-ziplist-value",
        Kind::Bytes,
        "64",
    ),
    p(
        "list-max-listpack-size",
        "list-max-ziplist-size",
        Kind::Int(i32::MIN as i64, i32::MAX as i64),
        "-2",
    ),
    p("list-compress-depth", "", INT, "0"),
    p("set-max-intset-entries", "", SIZE, "512"),
    p(
        "zset-max-listpack-entries",
        "zset-max-ziplist-entries",
        SIZE,
        "128",
    ),
    p(
        "zset-max-listpack-value",
        "zset-max-ziplist-value",
        Kind::Bytes,
        "64",
    ),
    p("hll-sparse-max-bytes", "", Kind::Bytes, "3000"),
    p("stream-node-max-bytes", "", Kind::Bytes, "4096"),
    p("stream-node-max-entries", "", SIZE, "100"),
    p(
        "slowlog-log-slower-than",
        "",
        Kind::Int(-1, i64::MAX),
        "10000",
    ),
    p("slowlog-max-len", "", SIZE, "128"),
    p("latency-monitor-threshold", "", Kind::Int(0, i64::MAX), "0"),
    p("latency-tracking", "", Kind::Bool, "yes"),
    p("busy-reply-threshold", "lua-time-limit", SIZE, "5000"),
    p("loglevel", "", Kind::Enum(LOGLEVELS), "notice"),
    p("lfu-log-factor", "", INT, "10"),
    p("lfu-decay-time", "", INT, "1"),
    p("tracking-table-max-keys", "", SIZE, "1000000"),
    // Redis's test suite sets it around its snapshot tests (no snapshots here).
    p(
        "rdb-key-save-delay",
        "",
        Kind::Int(i32::MIN as i64, i32::MAX as i64),
        "0",
    ),
];

const fn p(name: &'static str, alias: &'static str, kind: Kind, default: &'static str) -> Param {
    Param {
        name,
        alias,
        kind,
        default,
    }
}

/// The parameters' values (one per [`PARAMS`] entry), and the fixed ones.
pub struct Config {
    values: Vec<String>,
    fixed: Vec<(&'static str, String)>,
}

impl Config {
    /// Redis's defaults, and `fixed`: the parameters `dds kv`'s start options set
    /// (name, value as `CONFIG GET` reports it).
    pub fn new(fixed: Vec<(&'static str, String)>) -> Config {
        Config {
            values: PARAMS.iter().map(|p| p.default.to_string()).collect(),
            fixed,
        }
    }

    /// Sets a fixed parameter (a start option known only once the server runs).
    pub fn fix(&mut self, name: &'static str, value: String) {
        match self.fixed.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => self.fixed.push((name, value)),
        }
    }

    /// A parameter's value by name (or alias).
    pub fn get(&self, name: &str) -> Option<&str> {
        if let Some(i) = PARAMS
            .iter()
            .position(|p| p.name == name || (!p.alias.is_empty() && p.alias == name))
        {
            return Some(&self.values[i]);
        }
        self.fixed
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `CONFIG GET pattern..`: every name or alias a pattern matches (case-insensitively),
    /// each once.
    pub fn config_get(&self, r: &mut Reply<'_>, patterns: &[&[u8]]) {
        let names = PARAMS
            .iter()
            .zip(&self.values)
            .flat_map(|(p, v)| [(p.name, v.as_str()), (p.alias, v.as_str())])
            .chain(self.fixed.iter().map(|(n, v)| (*n, v.as_str())));
        let mut hits: Vec<(&str, &str)> = Vec::new();
        for (name, value) in names {
            if !name.is_empty()
                && patterns
                    .iter()
                    .any(|pat| glob::matches(pat, name.as_bytes(), true))
                && !hits.iter().any(|(n, _)| *n == name)
            {
                hits.push((name, value));
            }
        }
        r.map(hits.len());
        for (k, v) in hits {
            r.bulk(k.as_bytes());
            r.bulk(v.as_bytes());
        }
    }

    /// `CONFIG SET name value [name value ...]`: all or nothing, as Redis 7's
    /// `configSetCommand`: the names are checked first (the first unknown, fixed or repeated
    /// one is the error, named as given; an alias is a parameter of its own), then the values
    /// in order (the error names the parameter).
    pub fn config_set(&mut self, r: &mut Reply<'_>, args: &[&[u8]]) {
        if args.len() < 2 {
            r.error("ERR wrong number of arguments for 'config|set' command");
            return;
        }
        if !args.len().is_multiple_of(2) {
            r.error("ERR syntax error");
            return;
        }
        let failed = |r: &mut Reply<'_>, name: &[u8], why: &str| {
            r.error_bytes(&[
                b"ERR CONFIG SET failed (possibly related to argument '",
                name,
                b"') - ",
                why.as_bytes(),
            ])
        };
        // (parameter index or fixed parameter, the name it was set by)
        let mut named: Vec<(Option<usize>, &'static str)> = Vec::new();
        for pair in args.chunks(2) {
            let lookup = |n: &str| pair[0].eq_ignore_ascii_case(n.as_bytes());
            let found = PARAMS.iter().enumerate().find_map(|(i, p)| {
                if lookup(p.name) {
                    Some((Some(i), p.name))
                } else if !p.alias.is_empty() && lookup(p.alias) {
                    Some((Some(i), p.alias))
                } else {
                    None
                }
            });
            let found = found.or_else(|| {
                self.fixed
                    .iter()
                    .find(|(n, _)| lookup(n))
                    .map(|(n, _)| (None, *n))
            });
            let Some(found) = found else {
                r.error_bytes(&[
                    b"ERR Unknown option or number of arguments for CONFIG SET - '",
                    pair[0],
                    b"'",
                ]);
                return;
            };
            if found.0.is_none() {
                // Fixed by a start option: only the value it has (as `CONFIG GET` reports
                // it, or the same amount of bytes).
                let cur = self.get(found.1).unwrap_or_default().as_bytes();
                let same = pair[1].eq_ignore_ascii_case(cur)
                    || (bytes(pair[1]).is_some() && bytes(pair[1]) == bytes(cur));
                if !same {
                    failed(r, pair[0], "can't set immutable config");
                    return;
                }
            }
            if named.iter().any(|(_, n)| *n == found.1) {
                failed(r, pair[0], "duplicate parameter");
                return;
            }
            named.push(found);
        }
        let mut updates: Vec<(usize, String)> = Vec::new();
        for (pair, (param, name)) in args.chunks(2).zip(named) {
            let Some(i) = param else {
                continue;
            };
            match check(PARAMS[i].kind, pair[1]) {
                Ok(v) => updates.push((i, v)),
                Err(why) => {
                    failed(r, name.as_bytes(), &why);
                    return;
                }
            }
        }
        for (i, v) in updates {
            self.values[i] = v;
        }
        r.ok();
    }
}

/// Checks a value as Redis does for its kind; the value as `CONFIG GET` will report it, or
/// the error's text.
fn check(kind: Kind, v: &[u8]) -> Result<String, String> {
    let text = String::from_utf8_lossy(v);
    match kind {
        Kind::Bool => {
            if v.eq_ignore_ascii_case(b"yes") {
                Ok("yes".into())
            } else if v.eq_ignore_ascii_case(b"no") {
                Ok("no".into())
            } else {
                Err("argument must be 'yes' or 'no'".into())
            }
        }
        Kind::Int(min, max) => {
            let n = dds_resp::session::int_arg(v)
                .ok_or_else(|| "argument couldn't be parsed into an integer".to_string())?;
            if n < min || n > max {
                return Err(format!(
                    "argument must be between {min} and {max} inclusive"
                ));
            }
            Ok(n.to_string())
        }
        Kind::Bytes => {
            let n = bytes(v).ok_or_else(|| "argument must be a memory value".to_string())?;
            if n > i64::MAX as u128 {
                return Err(format!(
                    "argument must be between 0 and {} inclusive",
                    i64::MAX
                ));
            }
            Ok(n.to_string())
        }
        Kind::Enum(names) => names
            .iter()
            .find(|n| v.eq_ignore_ascii_case(n.as_bytes()))
            .map(|n| n.to_string())
            .ok_or_else(|| {
                format!(
                    "argument(s) must be one of the following: {}",
                    names.join(", ")
                )
            }),
        Kind::Save => {
            let words: Vec<&str> = text.split_ascii_whitespace().collect();
            let invalid = || "Invalid save parameters".to_string();
            if !words.len().is_multiple_of(2) {
                return Err(invalid());
            }
            let mut out = Vec::new();
            for w in &words {
                let n: i64 = w.parse().map_err(|_| invalid())?;
                if n < 0 {
                    return Err(invalid());
                }
                out.push(n.to_string());
            }
            Ok(out.join(" "))
        }
    }
}

/// Bytes as Redis's `memtoull` reads them: digits, then optionally `b`, `k`, `kb`, `m`, `mb`,
/// `g`, `gb` in any case (`k` = 1000, `kb` = 1024). Too many digits saturate (Redis's
/// `strtoull`), so that the range check refuses them.
fn bytes(v: &[u8]) -> Option<u128> {
    let s = std::str::from_utf8(v).ok()?.to_ascii_lowercase();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u128 = match &s[digits.len()..] {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1 << 20,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1 << 30,
        _ => return None,
    };
    // No digits read as 0, as Redis's `strtoull` of an empty string.
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0u128, |n, d| {
        n.saturating_mul(10)
            .saturating_add(u128::from(d - b'0'))
            .min(u128::from(u64::MAX))
    });
    Some(n.saturating_mul(unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(c: &mut Config, args: &[&str]) -> String {
        let mut out = Vec::new();
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        c.config_set(&mut Reply::new(&mut out), &a);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn set_checks_and_keeps_values_as_redis() {
        let mut c = Config::new(vec![("maxmemory", "1048576".into())]);
        assert_eq!(set(&mut c, &["timeout", "5", "hz", "20"]), "+OK\r\n");
        assert_eq!(c.get("timeout"), Some("5"));
        assert_eq!(
            set(&mut c, &["timeout", "abc"]),
            "-ERR CONFIG SET failed (possibly related to argument 'timeout') - argument couldn't be parsed into an integer\r\n"
        );
        assert_eq!(
            set(&mut c, &["timeout", "-1"]),
            "-ERR CONFIG SET failed (possibly related to argument 'timeout') - argument must be between 0 and 2147483647 inclusive\r\n"
        );
        assert_eq!(
            set(&mut c, &["timeout", "5", "TIMEOUT", "6"]),
            "-ERR CONFIG SET failed (possibly related to argument 'TIMEOUT') - duplicate parameter\r\n"
        );
        // An alias is a parameter of its own: the last one set wins.
        assert_eq!(
            set(
                &mut c,
                &[
                    "hash-max-ziplist-entries",
                    "3",
                    "hash-max-listpack-entries",
                    "4"
                ]
            ),
            "+OK\r\n"
        );
        assert_eq!(c.get("hash-max-ziplist-entries"), Some("4"));
        assert_eq!(
            set(&mut c, &["foo", "bar"]),
            "-ERR Unknown option or number of arguments for CONFIG SET - 'foo'\r\n"
        );
        assert_eq!(set(&mut c, &["hash-max-ziplist-entries", "100"]), "+OK\r\n");
        assert_eq!(c.get("hash-max-listpack-entries"), Some("100"));
        assert_eq!(set(&mut c, &["maxmemory-policy", "ALLKEYS-LRU"]), "+OK\r\n");
        assert_eq!(c.get("maxmemory-policy"), Some("allkeys-lru"));
        assert_eq!(set(&mut c, &["save", " 3600  1 "]), "+OK\r\n");
        assert_eq!(c.get("save"), Some("3600 1"));
        assert!(set(&mut c, &["save", "bad"]).contains("Invalid save parameters"));
        // A fixed parameter takes only its value.
        assert_eq!(set(&mut c, &["maxmemory", "1mb"]), "+OK\r\n");
        assert!(set(&mut c, &["maxmemory", "2mb"]).contains("can't set immutable config"));
        // All or nothing.
        assert!(set(&mut c, &["timeout", "9", "hz", "x"]).starts_with("-ERR"));
        assert_eq!(c.get("timeout"), Some("5"));
    }

    #[test]
    fn memory_values_read_as_redis_reads_them() {
        assert_eq!(bytes(b"1k"), Some(1000));
        assert_eq!(bytes(b"1KB"), Some(1024));
        assert_eq!(bytes(b"2gb"), Some(2 << 30));
        assert!(bytes(b"99999999999999999999").unwrap() > i64::MAX as u128);
        assert_eq!(bytes(b"12"), Some(12));
        assert_eq!(bytes(b"1x"), None);
        assert_eq!(bytes(b"-1"), None);
        assert_eq!(bytes(b"kb"), Some(0));
        assert_eq!(bytes(b""), Some(0));
        assert_eq!(bytes(b"+5"), None);
    }
}
