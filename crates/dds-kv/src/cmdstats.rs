//! Per-command and per-error counters: INFO's `Commandstats` and `Errorstats` sections and
//! the `total_error_replies` of `Stats`, as Redis 7.0 keeps them (`docs/kv-service.md` §5).
//!
//! A command's counters are found by its place in the command table; an error reply is
//! counted under its code (the reply's first word: `ERR`, `WRONGTYPE`, ...). Counting
//! allocates only for a code not seen before, and at most [`MAX_ERROR_CODES`] codes are
//! kept (Redis's limit; past it, as Redis, new codes are no longer tracked, but every error
//! reply is still counted in `total_error_replies`).

/// Most distinct error codes kept (Redis's `ERROR_STATS_NUMBER`).
pub const MAX_ERROR_CODES: usize = 128;

/// One command's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandStat {
    /// Times it ran.
    pub calls: u64,
    /// Microseconds it ran, in all.
    pub usec: u64,
    /// Times it was refused before running (arity, authentication).
    pub rejected: u64,
    /// Times it ran and answered an error.
    pub failed: u64,
}

/// The counters of every command of a table, and of every error code.
#[derive(Debug, Default)]
pub struct CommandStats {
    per: Vec<CommandStat>,
    /// Subcommands (`config|get`...), counted apart from their command, as Redis 7 does.
    subs: Vec<(String, CommandStat)>,
    errors: Vec<(String, u64)>,
    error_replies: u64,
}

/// The code of an error reply (`-CODE rest\r\n`): its first word, at most 128 bytes.
fn code(reply: &[u8]) -> Option<&[u8]> {
    let body = reply.strip_prefix(b"-")?;
    let end = body
        .iter()
        .position(|&b| b == b' ' || b == b'\r')
        .unwrap_or(body.len());
    Some(&body[..end.min(128)])
}

impl CommandStats {
    /// Counters for a table of `commands` commands.
    pub fn new(commands: usize) -> Self {
        CommandStats {
            per: vec![CommandStat::default(); commands],
            subs: Vec::new(),
            errors: Vec::new(),
            error_replies: 0,
        }
    }

    /// Command `idx` ran for `usec` µs and answered `reply`.
    pub fn call(&mut self, idx: usize, usec: u64, reply: &[u8]) {
        if let Some(s) = self.per.get_mut(idx) {
            s.calls += 1;
            s.usec += usec;
            if reply.first() == Some(&b'-') {
                s.failed += 1;
            }
        }
        self.error(reply);
    }

    /// Subcommand `sub` of command `name` (`config`, `get`: `config|get`) ran for `usec` µs
    /// and answered `reply`.
    pub fn call_sub(&mut self, name: &str, sub: &str, usec: u64, reply: &[u8]) {
        let found = self.subs.iter().position(|(n, _)| {
            n.len() == name.len() + 1 + sub.len() && n.starts_with(name) && n.ends_with(sub)
        });
        let at = found.unwrap_or_else(|| {
            self.subs
                .push((format!("{name}|{sub}"), CommandStat::default()));
            self.subs.len() - 1
        });
        let s = &mut self.subs[at].1;
        s.calls += 1;
        s.usec += usec;
        if reply.first() == Some(&b'-') {
            s.failed += 1;
        }
        self.error(reply);
    }

    /// Command `idx` (`None`: an unknown command) was refused with `reply`.
    pub fn reject(&mut self, idx: Option<usize>, reply: &[u8]) {
        if let Some(s) = idx.and_then(|i| self.per.get_mut(i)) {
            s.rejected += 1;
        }
        self.error(reply);
    }

    /// Counts `reply` when it is an error.
    fn error(&mut self, reply: &[u8]) {
        let Some(code) = code(reply) else {
            return;
        };
        self.error_replies += 1;
        if let Some(e) = self.errors.iter_mut().find(|(c, _)| c.as_bytes() == code) {
            e.1 += 1;
        } else if self.errors.len() < MAX_ERROR_CODES {
            self.errors
                .push((String::from_utf8_lossy(code).into_owned(), 1));
            self.errors.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }

    /// Error replies sent (`total_error_replies`).
    pub fn error_replies(&self) -> u64 {
        self.error_replies
    }

    /// CONFIG RESETSTAT: every counter back to 0.
    pub fn reset(&mut self) {
        self.per.fill(CommandStat::default());
        self.subs.clear();
        self.errors.clear();
        self.error_replies = 0;
    }

    /// The counters of command `idx`.
    pub fn get(&self, idx: usize) -> CommandStat {
        self.per.get(idx).copied().unwrap_or_default()
    }

    /// `Commandstats` lines of the commands that ran or were refused, `names[i]` being
    /// command `i`'s name: `cmdstat_<name>:calls=..,usec=..,usec_per_call=..,rejected_calls=..,failed_calls=..`.
    pub fn commandstats(&self, names: impl Iterator<Item = &'static str>) -> Vec<(String, String)> {
        names
            .map(|n| n as &str)
            .zip(&self.per)
            .chain(self.subs.iter().map(|(n, s)| (n.as_str(), s)))
            .filter(|(_, s)| s.calls + s.rejected + s.failed > 0)
            .map(|(n, s)| {
                let per_call = if s.calls == 0 {
                    0.0
                } else {
                    s.usec as f64 / s.calls as f64
                };
                (
                    format!("cmdstat_{n}"),
                    format!(
                        "calls={},usec={},usec_per_call={per_call:.2},rejected_calls={},failed_calls={}",
                        s.calls, s.usec, s.rejected, s.failed
                    ),
                )
            })
            .collect()
    }

    /// `Errorstats` lines, by code in byte order: `errorstat_<code>:count=..`.
    pub fn errorstats(&self) -> Vec<(String, String)> {
        self.errors
            .iter()
            .map(|(c, n)| (format!("errorstat_{c}"), format!("count={n}")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_refusals_and_errors_are_counted_as_redis_counts_them() {
        let mut s = CommandStats::new(3);
        s.call(0, 10, b"+OK\r\n");
        s.call(0, 20, b"-ERR syntax error\r\n");
        s.call(2, 5, b"-WRONGTYPE Operation against a key\r\n");
        s.reject(
            Some(1),
            b"-ERR wrong number of arguments for 'b' command\r\n",
        );
        s.reject(None, b"-ERR unknown command 'x'\r\n");
        assert_eq!(
            s.get(0),
            CommandStat {
                calls: 2,
                usec: 30,
                rejected: 0,
                failed: 1
            }
        );
        assert_eq!(s.get(1).rejected, 1);
        assert_eq!(s.error_replies(), 4);
        let names = ["a", "b", "c"].into_iter();
        assert_eq!(
            s.commandstats(names),
            vec![
                (
                    "cmdstat_a".to_string(),
                    "calls=2,usec=30,usec_per_call=15.00,rejected_calls=0,failed_calls=1"
                        .to_string()
                ),
                (
                    "cmdstat_b".to_string(),
                    "calls=0,usec=0,usec_per_call=0.00,rejected_calls=1,failed_calls=0".to_string()
                ),
                (
                    "cmdstat_c".to_string(),
                    "calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=1".to_string()
                ),
            ]
        );
        assert_eq!(
            s.errorstats(),
            vec![
                ("errorstat_ERR".to_string(), "count=3".to_string()),
                ("errorstat_WRONGTYPE".to_string(), "count=1".to_string())
            ]
        );
        s.call_sub("config", "get", 7, b"*0\r\n");
        s.call_sub("config", "get", 1, b"*0\r\n");
        assert_eq!(
            s.commandstats(["a", "b", "c"].into_iter()).pop(),
            Some((
                "cmdstat_config|get".to_string(),
                "calls=2,usec=8,usec_per_call=4.00,rejected_calls=0,failed_calls=0".to_string()
            ))
        );
        s.reset();
        assert_eq!(s.error_replies(), 0);
        assert!(s.commandstats(["a", "b", "c"].into_iter()).is_empty());
        assert!(s.errorstats().is_empty());
    }

    #[test]
    fn error_codes_are_bounded() {
        let mut s = CommandStats::new(1);
        for i in 0..MAX_ERROR_CODES + 10 {
            s.call(0, 1, format!("-E{i} x\r\n").as_bytes());
        }
        assert_eq!(s.errorstats().len(), MAX_ERROR_CODES);
        assert_eq!(s.error_replies(), (MAX_ERROR_CODES + 10) as u64);
    }
}
