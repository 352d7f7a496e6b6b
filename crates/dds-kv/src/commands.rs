//! The Redis commands of `dds kv`: arity, options and error replies as Redis 7 gives them.

use std::time::{SystemTime, UNIX_EPOCH};

use dds_resp::session::{auth, client, hello, int_arg, lower};
use dds_resp::Reply;

pub use dds_resp::session::Session;

use crate::cmdstats::CommandStats;
use crate::collection::CollType;
use crate::config::Config;
use crate::engine::Engine;
use crate::hashes;
use crate::introspect;
use crate::keyspace;
use crate::lists;
use crate::offload::MAX_WRITE_KEYS;
use crate::sets;
use crate::sort;
use crate::store::{Durability, Expiry, SetCond, StoreError};
use crate::strings;
use crate::zsetops;
use crate::zsets;

/// Server-wide state the commands read.
pub struct ServerInfo {
    /// Clients connected now.
    pub clients: usize,
    /// Of those, parked by a blocking pop.
    pub blocked_clients: usize,
    /// Commands processed.
    pub commands: u64,
    /// Connections accepted.
    pub connections: u64,
    /// Connections refused (max clients).
    pub rejected: u64,
    /// Start time.
    pub started: std::time::Instant,
    /// TCP port.
    pub port: u16,
    /// Durability mode name.
    pub durability: &'static str,
    /// Storage description.
    pub storage: String,
    /// `--max-clients`.
    pub max_clients: usize,
    /// The parameters of CONFIG GET / SET.
    pub config: Config,
    /// This run's id (INFO's `run_id`: 40 hex digits).
    pub run_id: String,
    /// The active expiry cycle runs (`DEBUG SET-ACTIVE-EXPIRE 0` stops it, as in Redis).
    pub active_expire: bool,
    /// The keys of a KEYS or SCAN reply, encoded before their count is known (reused).
    pub list_buf: Vec<u8>,
    /// The KEYS command being run was walked ahead, step by step as its records were read
    /// (`list_buf` holds its keys): the number of keys.
    pub keys_walked: Option<usize>,
    /// Per-command and per-error counters (INFO's `Commandstats` and `Errorstats`).
    pub stats: CommandStats,
    /// A blocking pop's wait (BLPOP and its kin), between the command and the server.
    pub block: lists::Block,
}

/// What the connection does after a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Go on.
    Continue,
    /// Send the replies, then close (QUIT).
    Close,
}

/// Everything a command runs against.
pub struct Ctx<'a> {
    /// The store.
    pub store: &'a mut dyn Engine,
    /// This connection.
    pub session: &'a mut Session,
    /// The server.
    pub info: &'a mut ServerInfo,
    /// `requirepass`.
    pub password: Option<&'a str>,
}

/// (name, arity): positive = exactly, negative = at least (as Redis's command table).
const TABLE: &[(&str, i32)] = &[
    ("ping", -1),
    ("echo", 2),
    ("get", 2),
    ("set", -3),
    ("setnx", 3),
    ("setex", 4),
    ("psetex", 4),
    ("del", -2),
    ("expire", -3),
    ("pexpire", -3),
    ("expireat", -3),
    ("pexpireat", -3),
    ("ttl", 2),
    ("pttl", 2),
    ("expiretime", 2),
    ("pexpiretime", 2),
    ("persist", 2),
    ("unlink", -2),
    ("exists", -2),
    ("mget", -2),
    ("mset", -3),
    ("msetnx", -3),
    ("incr", 2),
    ("decr", 2),
    ("incrby", 3),
    ("decrby", 3),
    ("append", 3),
    ("strlen", 2),
    ("getset", 3),
    ("getdel", 2),
    ("getex", -2),
    ("incrbyfloat", 3),
    ("getrange", 4),
    ("substr", 4),
    ("setrange", 4),
    ("getbit", 3),
    ("setbit", 4),
    ("bitcount", -2),
    ("bitpos", -3),
    ("bitop", -4),
    ("lcs", -3),
    ("bitfield", -2),
    ("type", 2),
    ("touch", -2),
    ("rename", 3),
    ("renamenx", 3),
    ("copy", -3),
    ("bitfield_ro", -2),
    ("keys", 2),
    ("scan", -2),
    ("randomkey", 1),
    ("dbsize", 1),
    ("flushdb", -1),
    ("flushall", -1),
    ("info", -1),
    ("select", 2),
    ("client", -2),
    ("config", -2),
    ("command", -1),
    ("quit", -1),
    ("auth", -2),
    ("hello", -1),
    ("debug", -2),
    ("function", -2),
    ("time", 1),
    ("memory", -2),
    ("object", -2),
    ("hset", -4),
    ("hmset", -4),
    ("hsetnx", 4),
    ("hget", 3),
    ("hmget", -3),
    ("hdel", -3),
    ("hlen", 2),
    ("hexists", 3),
    ("hstrlen", 3),
    ("hgetall", 2),
    ("hkeys", 2),
    ("hvals", 2),
    ("hscan", -3),
    ("hincrby", 4),
    ("hincrbyfloat", 4),
    ("hrandfield", -2),
    ("sadd", -3),
    ("srem", -3),
    ("sismember", 3),
    ("smismember", -3),
    ("scard", 2),
    ("smembers", 2),
    ("sscan", -3),
    ("spop", -2),
    ("srandmember", -2),
    ("smove", 4),
    ("sinter", -2),
    ("sunion", -2),
    ("sdiff", -2),
    ("sinterstore", -3),
    ("sunionstore", -3),
    ("sdiffstore", -3),
    ("sintercard", -3),
    ("zadd", -4),
    ("zincrby", 4),
    ("zscore", 3),
    ("zmscore", -3),
    ("zrem", -3),
    ("zcard", 2),
    ("zrank", 3),
    ("zrevrank", 3),
    ("zcount", 4),
    ("zlexcount", 4),
    ("zrange", -4),
    ("zrevrange", -4),
    ("zrangebyscore", -4),
    ("zrevrangebyscore", -4),
    ("zrangebylex", -4),
    ("zrevrangebylex", -4),
    ("zpopmin", -2),
    ("zpopmax", -2),
    ("zremrangebyrank", 4),
    ("zremrangebyscore", 4),
    ("zremrangebylex", 4),
    ("zscan", -3),
    ("zmpop", -4),
    ("zrangestore", -5),
    ("zunion", -3),
    ("zinter", -3),
    ("zdiff", -3),
    ("zunionstore", -4),
    ("zinterstore", -4),
    ("zdiffstore", -4),
    ("zintercard", -3),
    ("zrandmember", -2),
    ("sort", -2),
    ("sort_ro", -2),
    ("bzpopmin", -3),
    ("bzpopmax", -3),
    ("bzmpop", -5),
    ("lpush", -3),
    ("rpush", -3),
    ("lpushx", -3),
    ("rpushx", -3),
    ("lpop", -2),
    ("rpop", -2),
    ("llen", 2),
    ("lrange", 4),
    ("lindex", 3),
    ("lset", 4),
    ("linsert", 5),
    ("lrem", 4),
    ("ltrim", 4),
    ("lmove", 5),
    ("rpoplpush", 3),
    ("lpos", -3),
    ("lmpop", -4),
    ("blpop", -3),
    ("brpop", -3),
    ("blmove", 6),
    ("brpoplpush", 4),
    ("blmpop", -5),
    // Transactions: MULTI starts one in the server (`server.rs`); here EXEC and DISCARD
    // outside one.
    ("multi", 1),
    ("exec", 1),
    ("discard", 1),
    ("watch", -2),
    ("unwatch", 1),
    // The host part of an MGET the DPU split (docs/kv-service.md §4): one reply per key;
    // of an HMGET (§4.1): one reply per field.
    ("dds.mgetpart", -2),
    ("dds.hmgetpart", -3),
];

/// Commands with subcommands, which INFO's `Commandstats` counts per subcommand
/// (`cmdstat_config|get`), as Redis 7 does.
const SUBCOMMANDS: &[(&str, &[&str])] = &[
    ("client", &["setname", "getname", "id", "setinfo"]),
    ("config", &["get", "set", "resetstat", "rewrite"]),
    ("command", &["count", "docs", "info"]),
    ("function", &["flush", "list"]),
    ("memory", &["usage"]),
    ("object", &["encoding", "refcount"]),
];

/// The name in `names` that `arg` spells in any case ("" when none does), without a copy.
pub(crate) fn option(arg: &[u8], names: &[&'static str]) -> &'static str {
    names
        .iter()
        .find(|n| arg.eq_ignore_ascii_case(n.as_bytes()))
        .copied()
        .unwrap_or("")
}

/// Calls `f` with every key whose current record the command reads (a key on storage is
/// fetched before the command runs, so that it does not wait for storage inside the loop).
/// Commands that only write (SET without options, MSET, SETEX) read nothing.
pub fn read_keys<'a>(argv: &[&'a [u8]], mut f: impl FnMut(&'a [u8])) {
    let Some(name) = argv.first() else {
        return;
    };
    let is = |names: &[&str]| {
        names
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
    };
    if is(&["mget", "exists", "del", "unlink", "touch", "dds.mgetpart"]) {
        argv[1..].iter().for_each(|k| f(k));
    } else if is(&["lcs", "rename", "renamenx", "copy"]) {
        argv[1..].iter().take(2).for_each(|k| f(k));
    } else if is(&["bitop"]) {
        argv.iter().skip(3).for_each(|k| f(k));
    } else if is(&["msetnx"]) {
        argv[1..].iter().step_by(2).for_each(|k| f(k));
    } else if is(&[
        "get",
        "strlen",
        "getset",
        "getdel",
        "getex",
        "incrbyfloat",
        "getrange",
        "substr",
        "setrange",
        "getbit",
        "setbit",
        "bitcount",
        "bitpos",
        "bitfield",
        "bitfield_ro",
        "type",
        "incr",
        "decr",
        "incrby",
        "decrby",
        "append",
        "ttl",
        "pttl",
        "expiretime",
        "pexpiretime",
        "persist",
        "expire",
        "pexpire",
        "expireat",
        "pexpireat",
        "setnx",
    ]) || (name.eq_ignore_ascii_case(b"set") && argv.len() > 3)
    {
        if let Some(k) = argv.get(1) {
            f(k);
        }
    }
}

/// Calls `f` with every (key, element) whose record the command reads (an element on
/// storage is fetched before the command runs, as [`read_keys`] does for keys).
pub fn read_elements<'a>(argv: &[&'a [u8]], mut f: impl FnMut(&'a [u8], &'a [u8])) {
    let (Some(name), Some(key)) = (argv.first(), argv.get(1)) else {
        return;
    };
    let is = |names: &[&str]| {
        names
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
    };
    if is(&[
        "hget",
        "hstrlen",
        "hincrby",
        "hincrbyfloat",
        "zscore",
        "zrank",
        "zrevrank",
    ]) {
        if let Some(field) = argv.get(2) {
            f(key, field);
        }
    } else if is(&["hmget", "zmscore", "dds.hmgetpart", "zrem"]) {
        argv[2..].iter().for_each(|field| f(key, field));
    } else if is(&["zadd"]) {
        // A member's old score (its record): after the options, score-member pairs.
        let opts = crate::zsets::zadd_options(argv[2..].iter().copied());
        argv[2 + opts..]
            .iter()
            .skip(1)
            .step_by(2)
            .for_each(|m| f(key, m));
    } else if is(&["zincrby"]) {
        if let Some(member) = argv.get(3) {
            f(key, member);
        }
    }
}

/// Calls `f` with every (list key, element index) whose record the command reads and leaves
/// in place: LINDEX's element, the first 16 of an LRANGE (an element on storage is fetched
/// before the command runs, as [`read_elements`] does). A pop's elements are read ahead
/// through [`popped_end`].
pub fn read_list_elements<'a>(argv: &[&'a [u8]], mut f: impl FnMut(&'a [u8], i64)) {
    const MAX: i64 = 16;
    let (Some(name), Some(&key)) = (argv.first(), argv.get(1)) else {
        return;
    };
    if name.eq_ignore_ascii_case(b"lindex") {
        if let Some(i) = argv.get(2).and_then(|a| int_arg(a)) {
            f(key, i);
        }
    } else if name.eq_ignore_ascii_case(b"lrange") {
        if let Some(start) = argv.get(2).and_then(|a| int_arg(a)).filter(|&s| s >= 0) {
            (start..start.saturating_add(MAX)).for_each(|i| f(key, i));
        }
    }
}

/// The list end a pop takes its elements from, and how many: (key, left end, count) of
/// LPOP and RPOP (with their count), RPOPLPUSH and LMOVE, and of their blocking forms on one
/// key (BLPOP, BRPOP, BRPOPLPUSH, BLMOVE). The server reads them ahead, each pop beyond the
/// elements that the pops pending before it on that end will take (`docs/kv-service.md`
/// §7.5).
pub fn popped_end<'a>(argv: &[&'a [u8]]) -> Option<(&'a [u8], bool, u32)> {
    let (name, key) = (argv.first()?, *argv.get(1)?);
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    if is("lpop") || is("rpop") {
        let count = match argv.get(2) {
            Some(c) => int_arg(c).filter(|&c| c > 0)?.min(16) as u32,
            None => 1,
        };
        Some((key, is("lpop"), count))
    } else if (is("blpop") || is("brpop")) && argv.len() == 3 {
        Some((key, is("blpop"), 1))
    } else if (is("rpoplpush") && argv.len() == 3) || (is("brpoplpush") && argv.len() == 4) {
        Some((key, false, 1))
    } else if (is("lmove") && argv.len() == 5) || (is("blmove") && argv.len() == 6) {
        let from = argv[3];
        if from.eq_ignore_ascii_case(b"left") {
            Some((key, true, 1))
        } else if from.eq_ignore_ascii_case(b"right") {
            Some((key, false, 1))
        } else {
            None
        }
    } else {
        None
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn store_error(r: &mut Reply<'_>, e: &StoreError) {
    match e {
        StoreError::NotInteger => r.error("ERR value is not an integer or out of range"),
        StoreError::WrongType => {
            r.error("WRONGTYPE Operation against a key holding the wrong kind of value")
        }
        StoreError::Overflow => r.error("ERR increment or decrement would overflow"),
        StoreError::KeyTooLarge(n) => r.error(&format!("ERR key too large (limit {n} bytes)")),
        StoreError::ValueTooLarge(n) => r.error(&format!("ERR value too large (limit {n} bytes)")),
        StoreError::LogFull => {
            r.error("ERR log full: live data fills the log file (delete keys or raise --log-size)")
        }
        StoreError::OutOfMemory => {
            r.error("OOM command not allowed when used memory > 'maxmemory'.")
        }
        StoreError::Unsupported(what) => r.error_bytes(&[b"ERR ", what.as_bytes()]),
        StoreError::Storage(err) => {
            tracing::error!(error = %format!("{err:#}"), "storage failed");
            r.error(&format!("ERR storage: {err:#}"))
        }
    }
}

/// The names of the commands, in the order of their counters (INFO's `Commandstats`).
pub fn command_names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(n, _)| *n)
}

/// Number of commands (the counters INFO's `Commandstats` keeps).
pub fn command_count() -> usize {
    TABLE.len()
}

/// Runs one command; its reply goes to `out`. The command's counters (INFO's
/// `Commandstats` and `Errorstats`) count it.
pub fn execute(ctx: &mut Ctx<'_>, argv: &[&[u8]], out: &mut Vec<u8>) -> After {
    let start = std::time::Instant::now();
    let mark = out.len();
    let (after, ran) = dispatch(ctx, argv, out);
    let reply = &out[mark..];
    match ran {
        Ran::Yes(idx) => {
            let usec = start.elapsed().as_micros() as u64;
            let name = TABLE[idx].0;
            match SUBCOMMANDS.iter().find(|(n, _)| *n == name) {
                // A container's subcommand is counted as `name|sub`; an unknown one, whose
                // reply is an error, as a refusal (Redis does not run it).
                Some((_, subs)) => match argv.get(1).map(|a| option(a, subs)) {
                    Some("") => ctx.info.stats.reject(None, reply),
                    Some(sub) => ctx.info.stats.call_sub(name, sub, usec, reply),
                    None => ctx.info.stats.call(idx, usec, reply),
                },
                None => ctx.info.stats.call(idx, usec, reply),
            }
        }
        Ran::Refused(idx) => ctx.info.stats.reject(idx, reply),
        Ran::Nothing => {}
    }
    after
}

/// Redis's reply to an unknown command: "'%.*s' " per argument while the list is under 128
/// bytes, each argument and the name cut at 128 bytes and at their first NUL.
fn unknown_command(r: &mut Reply<'_>, argv: &[&[u8]]) {
    let c_str = |a: &[u8], max: usize| {
        let a = a.split(|&b| b == 0).next().unwrap_or_default();
        a[..a.len().min(max)].to_vec()
    };
    let mut args = Vec::new();
    for a in &argv[1..] {
        if args.len() >= 128 {
            break;
        }
        args.push(b'\'');
        args.extend(c_str(a, 128 - (args.len() - 1)));
        args.extend_from_slice(b"' ");
    }
    r.error_bytes(&[
        b"ERR unknown command '",
        &c_str(argv[0], 128),
        b"', with args beginning with: ",
        &args,
    ]);
}

/// Whether `n` words (the name included) fit a table arity.
fn arity_ok(arity: i32, n: usize) -> bool {
    let n = n as i32;
    (arity > 0 && n == arity) || (arity < 0 && n >= -arity)
}

/// A command queued inside MULTI is checked as Redis checks it before queueing: an unknown
/// name or a wrong number of arguments writes its error reply to `out` and answers false
/// (the transaction is then refused at EXEC).
pub fn queueable(argv: &[&[u8]], out: &mut Vec<u8>, resp3: bool) -> bool {
    let mut r = Reply::with_protocol(out, resp3);
    match TABLE
        .iter()
        .find(|(n, _)| argv[0].eq_ignore_ascii_case(n.as_bytes()))
    {
        None => {
            unknown_command(&mut r, argv);
            false
        }
        Some((name, arity)) if !arity_ok(*arity, argv.len()) => {
            r.error(&format!(
                "ERR wrong number of arguments for '{name}' command"
            ));
            false
        }
        Some(_) => true,
    }
}

/// Whether a command ran: its place in the table, or `None` for an unknown one.
enum Ran {
    Yes(usize),
    Refused(Option<usize>),
    Nothing,
}

fn dispatch(ctx: &mut Ctx<'_>, argv: &[&[u8]], out: &mut Vec<u8>) -> (After, Ran) {
    let mut r = Reply::with_protocol(out, ctx.session.resp3);
    let Some(first) = argv.first() else {
        return (After::Continue, Ran::Nothing);
    };
    // The table's own name: looked up without a lower-cased copy of the argument.
    let Some(idx) = TABLE
        .iter()
        .position(|(n, _)| first.eq_ignore_ascii_case(n.as_bytes()))
    else {
        if ctx.password.is_some() && !ctx.session.authed {
            r.error("NOAUTH Authentication required.");
            return (After::Continue, Ran::Refused(None));
        }
        unknown_command(&mut r, argv);
        return (After::Continue, Ran::Refused(None));
    };
    let (name, arity) = TABLE[idx];
    if !arity_ok(arity, argv.len()) {
        r.error(&format!(
            "ERR wrong number of arguments for '{name}' command"
        ));
        return (After::Continue, Ran::Refused(Some(idx)));
    }
    if ctx.password.is_some() && !ctx.session.authed && !matches!(name, "auth" | "hello" | "quit") {
        r.error("NOAUTH Authentication required.");
        return (After::Continue, Ran::Refused(Some(idx)));
    }
    let store = &mut *ctx.store;
    // Redis's `proto-max-bulk-len`: the largest value.
    let store_max_value = store.limits().1;
    let res: Result<(), StoreError> = (|| {
        match name {
            "ping" => match argv.len() {
                1 => r.simple("PONG"),
                2 => r.bulk(argv[1]),
                _ => r.error("ERR wrong number of arguments for 'ping' command"),
            },
            "echo" => r.bulk(argv[1]),
            "quit" => {
                r.ok();
                return Ok(());
            }
            "get" => store.get_with(argv[1], &mut |v| match v {
                Some(v) => r.bulk(v),
                None => r.null(),
            })?,
            "set" => set(store, &mut r, argv)?,
            "setnx" => {
                let ok = store.set(argv[1], argv[2], SetCond::IfMissing, Expiry::None, None)?;
                r.int(i64::from(ok));
            }
            "setex" | "psetex" => {
                let unit = if name == "setex" { 1000 } else { 1 };
                let at = match set_expire_ms(argv[2], unit, true, name) {
                    Ok(at) => at,
                    Err(e) => {
                        r.error(&e);
                        return Ok(());
                    }
                };
                store.set(argv[1], argv[3], SetCond::Always, Expiry::At(at), None)?;
                r.ok();
            }
            "expire" | "pexpire" | "expireat" | "pexpireat" => expire(store, &mut r, name, argv)?,
            "ttl" | "pttl" | "expiretime" | "pexpiretime" => {
                let ms = name.starts_with('p');
                let abs = name.ends_with("time");
                match store.expiry(argv[1])? {
                    None => r.int(-2),
                    Some(0) => r.int(-1),
                    Some(at) => {
                        let t = if abs {
                            at as i64
                        } else {
                            (at as i64).saturating_sub(now_ms() as i64).max(0)
                        };
                        // Rounded as Redis rounds it (in unsigned arithmetic: no overflow).
                        r.int(if ms {
                            t
                        } else {
                            ((t as u64 + 500) / 1000) as i64
                        });
                    }
                }
            }
            "persist" => {
                let had = matches!(store.expiry(argv[1])?, Some(t) if t != 0);
                if had {
                    store.set_expiry(argv[1], 0)?;
                }
                r.int(i64::from(had));
            }
            "del" | "unlink" => {
                if too_many_keys(argv[1..].iter().copied()) {
                    r.error(&format!(
                        "ERR too many keys in one command (limit {MAX_WRITE_KEYS})"
                    ));
                    return Ok(());
                }
                let mut n = 0;
                for k in &argv[1..] {
                    n += i64::from(store.del(k)?);
                }
                r.int(n);
            }
            "exists" => {
                let mut n = 0;
                for k in &argv[1..] {
                    n += i64::from(store.exists(k)?);
                }
                r.int(n);
            }
            "mget" | "dds.mgetpart" => {
                if name == "mget" {
                    r.array(argv.len() - 1);
                }
                for k in &argv[1..] {
                    // A key of another type is a null, as in Redis (MGET never says WRONGTYPE).
                    let got = store.get_with(k, &mut |v| match v {
                        Some(v) => r.bulk(v),
                        None => r.null(),
                    });
                    match got {
                        Err(StoreError::WrongType) => r.null(),
                        other => other?,
                    }
                }
            }
            "mset" | "msetnx" => {
                if argv.len().is_multiple_of(2) {
                    r.error(&format!(
                        "ERR wrong number of arguments for '{name}' command"
                    ));
                    return Ok(());
                }
                if too_many_keys(argv[1..].iter().step_by(2).copied()) {
                    r.error(&format!(
                        "ERR too many keys in one command (limit {MAX_WRITE_KEYS})"
                    ));
                    return Ok(());
                }
                if name == "msetnx" {
                    for p in argv[1..].chunks(2) {
                        if store.exists(p[0])? {
                            r.int(0);
                            return Ok(());
                        }
                    }
                }
                for p in argv[1..].chunks(2) {
                    store.set(p[0], p[1], SetCond::Always, Expiry::None, None)?;
                }
                if name == "msetnx" {
                    r.int(1);
                } else {
                    r.ok();
                }
            }
            "incr" | "decr" | "incrby" | "decrby" => {
                let by = match name {
                    "incr" => 1,
                    "decr" => -1,
                    _ => match int_arg(argv[2]) {
                        None => {
                            r.error("ERR value is not an integer or out of range");
                            return Ok(());
                        }
                        Some(v) if name == "decrby" => match v.checked_neg() {
                            Some(v) => v,
                            None => {
                                r.error("ERR decrement would overflow");
                                return Ok(());
                            }
                        },
                        Some(v) => v,
                    },
                };
                let v = store.incr_by(argv[1], by)?;
                r.int(v);
            }
            "append" => {
                let n = store.append_value(argv[1], argv[2])?;
                r.int(n as i64);
            }
            "strlen" => {
                let n = store.strlen(argv[1])?;
                r.int(n as i64);
            }
            "getset" => {
                let mut old = |v: Option<&[u8]>| match v {
                    Some(v) => r.bulk(v),
                    None => r.null(),
                };
                store.set(
                    argv[1],
                    argv[2],
                    SetCond::Always,
                    Expiry::None,
                    Some(&mut old),
                )?;
            }
            "getdel" => {
                let mut old = |v: Option<&[u8]>| match v {
                    Some(v) => r.bulk(v),
                    None => r.null(),
                };
                store.take_with(argv[1], &mut old)?;
            }
            "getrange" | "substr" => strings::getrange(store, &mut r, argv)?,
            "setrange" => strings::setrange(store, &mut r, argv, store_max_value)?,
            "getex" => strings::getex(store, &mut r, argv, now_ms())?,
            "incrbyfloat" => strings::incrbyfloat(store, &mut r, argv)?,
            "getbit" => strings::getbit(store, &mut r, argv, store_max_value)?,
            "setbit" => strings::setbit(store, &mut r, argv, store_max_value)?,
            "bitcount" => strings::bitcount(store, &mut r, argv)?,
            "bitpos" => strings::bitpos(store, &mut r, argv)?,
            "bitop" => strings::bitop(store, &mut r, argv)?,
            "lcs" => strings::lcs(store, &mut r, argv, store_max_value)?,
            "bitfield" | "bitfield_ro" => {
                strings::bitfield(store, &mut r, argv, store_max_value, name == "bitfield_ro")?
            }
            "type" => keyspace::type_of(store, &mut r, argv[1])?,
            "touch" => keyspace::touch(store, &mut r, &argv[1..])?,
            "rename" | "renamenx" => keyspace::rename(store, &mut r, argv, name == "renamenx")?,
            "copy" => keyspace::copy(store, &mut r, argv)?,
            "keys" => match ctx.info.keys_walked {
                Some(n) => {
                    r.array(n);
                    r.out_mut().extend_from_slice(&ctx.info.list_buf);
                }
                None => keyspace::keys(store, &mut r, argv[1], &mut ctx.info.list_buf)?,
            },
            "scan" => keyspace::scan(store, &mut r, argv, &mut ctx.info.list_buf)?,
            "randomkey" => keyspace::random_key(store, &mut r)?,
            "dbsize" => r.int(store.len() as i64),
            "flushdb" | "flushall" => {
                if argv.len() > 2
                    || argv.get(1).is_some_and(|a| {
                        !a.eq_ignore_ascii_case(b"sync") && !a.eq_ignore_ascii_case(b"async")
                    })
                {
                    r.error("ERR syntax error");
                    return Ok(());
                }
                store.flush_all()?;
                r.ok();
            }
            "info" => {
                let text = info(store, ctx.info, &argv[1..]);
                r.bulk(text.as_bytes());
            }
            "select" => match int_arg(argv[1]) {
                Some(0) => r.ok(),
                Some(_) => r.error("ERR DB index is out of range"),
                None => r.error("ERR value is not an integer or out of range"),
            },
            "client" => client(ctx.session, &mut r, argv),
            "config" => config(ctx.info, &mut r, argv),
            "command" => command(&mut r, argv),
            "auth" => auth(ctx.session, ctx.password, &mut r, argv),
            "hello" => hello(ctx.session, ctx.password, &mut r, argv),
            "debug" => debug(ctx.info, &mut r, argv),
            "function" => function(&mut r, argv),
            "hset" | "hmset" => hashes::hset(store, &mut r, argv, name)?,
            "hsetnx" => hashes::hsetnx(store, &mut r, argv)?,
            "hget" => hashes::hget(store, &mut r, argv)?,
            "hmget" => hashes::hmget(store, &mut r, argv)?,
            "dds.hmgetpart" => hashes::hmget_part(store, &mut r, argv)?,
            "hdel" => hashes::hdel(store, &mut r, argv)?,
            "hlen" => hashes::hlen(store, &mut r, argv[1])?,
            "hexists" => hashes::hexists(store, &mut r, argv)?,
            "hstrlen" => hashes::hstrlen(store, &mut r, argv)?,
            "hgetall" | "hkeys" | "hvals" => {
                let parts = match name {
                    "hgetall" => hashes::Parts::Both,
                    "hkeys" => hashes::Parts::Fields,
                    _ => hashes::Parts::Values,
                };
                hashes::hgetall(store, &mut r, argv[1], parts, &mut ctx.info.list_buf)?
            }
            "hscan" | "sscan" | "zscan" => {
                let ty = match name {
                    "hscan" => CollType::Hash,
                    "sscan" => CollType::Set,
                    _ => CollType::ZSet,
                };
                hashes::coll_scan(store, &mut r, argv, ty, &mut ctx.info.list_buf)?
            }
            "hincrby" => hashes::hincrby(store, &mut r, argv)?,
            "hincrbyfloat" => hashes::hincrbyfloat(store, &mut r, argv)?,
            "hrandfield" => hashes::hrandfield(
                store,
                &mut r,
                argv,
                ctx.session.resp3,
                &mut ctx.info.list_buf,
            )?,
            "sadd" => sets::sadd(store, &mut r, argv)?,
            "srem" => sets::srem(store, &mut r, argv)?,
            "sismember" => sets::sismember(store, &mut r, argv)?,
            "smismember" => sets::smismember(store, &mut r, argv)?,
            "scard" => sets::scard(store, &mut r, argv[1])?,
            "smembers" => sets::smembers(store, &mut r, argv[1], &mut ctx.info.list_buf)?,
            "spop" => sets::spop(store, &mut r, argv)?,
            "srandmember" => sets::srandmember(store, &mut r, argv, &mut ctx.info.list_buf)?,
            "smove" => sets::smove(store, &mut r, argv)?,
            "sinter" | "sunion" | "sdiff" => sets::set_op(store, &mut r, &argv[1..], set_op(name))?,
            "sinterstore" | "sunionstore" | "sdiffstore" => {
                sets::set_op_store(store, &mut r, argv, set_op(name))?
            }
            "sintercard" => sets::sintercard(store, &mut r, argv)?,
            "zadd" | "zincrby" => {
                zsets::zadd(store, &mut r, argv, ctx.session.resp3, name == "zincrby")?
            }
            "zscore" | "zmscore" => {
                zsets::zscore(store, &mut r, argv, ctx.session.resp3, name == "zmscore")?
            }
            "zrem" => zsets::zrem(store, &mut r, argv)?,
            "zcard" => zsets::zcard(store, &mut r, argv[1])?,
            "zrank" | "zrevrank" => zsets::zrank(store, &mut r, argv, name == "zrevrank")?,
            "zcount" | "zlexcount" => zsets::zcount(store, &mut r, argv, name == "zlexcount")?,
            "zrange" | "zrevrange" | "zrangebyscore" | "zrevrangebyscore" | "zrangebylex"
            | "zrevrangebylex" => {
                let cmd = match name {
                    "zrange" => zsets::RangeCmd::Zrange,
                    "zrevrange" => zsets::RangeCmd::ZrevRange,
                    "zrangebyscore" => zsets::RangeCmd::ByScore,
                    "zrevrangebyscore" => zsets::RangeCmd::RevByScore,
                    "zrangebylex" => zsets::RangeCmd::ByLex,
                    _ => zsets::RangeCmd::RevByLex,
                };
                zsets::zrange(store, &mut r, argv, cmd, ctx.session.resp3, false)?
            }
            "zrangestore" => zsets::zrange(
                store,
                &mut r,
                argv,
                zsets::RangeCmd::Zrange,
                ctx.session.resp3,
                true,
            )?,
            "zunion" | "zinter" | "zdiff" | "zunionstore" | "zinterstore" | "zdiffstore"
            | "zintercard" => {
                let op = match &name[..5] {
                    "zunio" => zsetops::Op::Union,
                    "zinte" => zsetops::Op::Inter,
                    _ => zsetops::Op::Diff,
                };
                let store_form = name.ends_with("store");
                let card = name == "zintercard";
                zsetops::zsetop(store, &mut r, argv, op, store_form, card, ctx.session.resp3)?
            }
            "sort" | "sort_ro" => sort::sort(store, &mut r, argv, name == "sort_ro")?,
            "zrandmember" => zsetops::zrandmember(
                store,
                &mut r,
                argv,
                ctx.session.resp3,
                &mut ctx.info.list_buf,
            )?,
            "zpopmin" | "zpopmax" => {
                zsets::zpop(store, &mut r, argv, name == "zpopmax", ctx.session.resp3)?
            }
            "zremrangebyrank" | "zremrangebyscore" | "zremrangebylex" => {
                zsets::zremrange(store, &mut r, argv, &name["zremrangeby".len()..])?
            }
            "zmpop" | "bzmpop" | "lmpop" | "blmpop" => {
                let kind = if name.ends_with("zmpop") {
                    lists::PopKind::ZSet {
                        resp3: ctx.session.resp3,
                    }
                } else {
                    lists::PopKind::List
                };
                let block = name.starts_with('b').then_some(&mut ctx.info.block);
                lists::mpop(store, &mut r, argv, kind, block, &mut ctx.info.list_buf)?
            }
            "bzpopmin" | "bzpopmax" => lists::bzpop(
                store,
                &mut r,
                argv,
                name == "bzpopmax",
                ctx.session.resp3,
                &mut ctx.info.block,
            )?,
            "lpush" | "rpush" | "lpushx" | "rpushx" => lists::push(
                store,
                &mut r,
                argv,
                name.starts_with('l'),
                !name.ends_with('x'),
            )?,
            "lpop" | "rpop" => {
                lists::pop(store, &mut r, argv, name == "lpop", &mut ctx.info.list_buf)?
            }
            "llen" => lists::llen(store, &mut r, argv[1])?,
            "lrange" => lists::lrange(store, &mut r, argv, &mut ctx.info.list_buf)?,
            "lindex" => lists::lindex(store, &mut r, argv)?,
            "lset" => lists::lset(store, &mut r, argv)?,
            "linsert" => lists::linsert(store, &mut r, argv)?,
            "lrem" => lists::lrem(store, &mut r, argv)?,
            "ltrim" => lists::ltrim(store, &mut r, argv)?,
            "lmove" | "rpoplpush" => lists::lmove(store, &mut r, argv)?,
            "lpos" => lists::lpos(store, &mut r, argv, &mut ctx.info.list_buf)?,
            "blpop" | "brpop" => {
                lists::bpop(store, &mut r, argv, name == "blpop", &mut ctx.info.block)?
            }
            "blmove" | "brpoplpush" => lists::blmove(store, &mut r, argv, &mut ctx.info.block)?,
            "exec" => r.error("ERR EXEC without MULTI"),
            "discard" => r.error("ERR DISCARD without MULTI"),
            "multi" => r.error("ERR MULTI calls can not be nested"),
            // WATCH and UNWATCH run in the server; an UNWATCH queued in MULTI runs here, at
            // EXEC, whose end forgets the watched keys anyway.
            "watch" | "unwatch" => r.ok(),
            "time" => introspect::time(&mut r),
            "memory" | "object" => {
                introspect::memory_or_object(store, &mut r, argv, &ctx.info.config)?
            }
            _ => unreachable!("every command of the table is handled"),
        }
        Ok(())
    })();
    if let Err(e) = res {
        store_error(&mut r, &e);
    }
    let after = if name == "quit" {
        After::Close
    } else {
        After::Continue
    };
    (after, Ran::Yes(idx))
}

/// Whether a write names more than [`MAX_WRITE_KEYS`] distinct keys (the director's
/// invalidation list of one command holds that many; a key named again counts once).
fn too_many_keys<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]>) -> bool {
    if keys.len() <= MAX_WRITE_KEYS {
        return false;
    }
    let distinct: std::collections::HashSet<(u64, u64)> =
        keys.map(crate::record::key_hash).collect();
    distinct.len() > MAX_WRITE_KEYS
}

/// The set operation a command's name starts with.
fn set_op(name: &str) -> sets::Op {
    if name.starts_with("sinter") {
        sets::Op::Inter
    } else if name.starts_with("sunion") {
        sets::Op::Union
    } else {
        sets::Op::Diff
    }
}

/// The expiry time of SET, SETEX and PSETEX as Redis computes and checks it
/// (`getExpireMillisecondsOrReply`): `t` in `unit` ms, relative to now or absolute. The error
/// is the whole reply text.
pub(crate) fn set_expire_ms(
    arg: &[u8],
    unit: i64,
    relative: bool,
    cmd: &str,
) -> Result<u64, String> {
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    let t =
        int_arg(arg).ok_or_else(|| "ERR value is not an integer or out of range".to_string())?;
    if t <= 0 || t > i64::MAX / unit {
        return Err(invalid());
    }
    let mut ms = t * unit;
    if relative {
        ms = ms.checked_add(now_ms() as i64).ok_or_else(invalid)?;
    }
    Ok(ms as u64)
}

fn set(store: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> Result<(), StoreError> {
    // Options as Redis's `parseExtendedStringArgumentsOrReply` takes them: NX/XX exclude each
    // other, one kind of expiry (repeating the same one is allowed, the last one counts).
    let (mut nx, mut xx, mut get, mut keepttl) = (false, false, false, false);
    let mut exp: Option<(&str, &[u8])> = None;
    let mut i = 3;
    while i < argv.len() {
        let o = option(
            argv[i],
            &["nx", "xx", "get", "keepttl", "ex", "px", "exat", "pxat"],
        );
        let next = argv.get(i + 1).copied();
        match o {
            "nx" if !xx => nx = true,
            "xx" if !nx => xx = true,
            "get" => get = true,
            "keepttl" if exp.is_none() => keepttl = true,
            "ex" | "px" | "exat" | "pxat"
                if !keepttl && next.is_some() && exp.is_none_or(|(k, _)| k == o) =>
            {
                exp = Some((o, next.expect("checked")));
                i += 1;
            }
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
        i += 1;
    }
    let expiry = match exp {
        None if keepttl => Expiry::Keep,
        None => Expiry::None,
        Some((kind, t)) => {
            let unit = if kind == "ex" || kind == "exat" {
                1000
            } else {
                1
            };
            match set_expire_ms(t, unit, kind == "ex" || kind == "px", "set") {
                Ok(at) => Expiry::At(at),
                Err(e) => {
                    r.error(&e);
                    return Ok(());
                }
            }
        }
    };
    let cond = if nx {
        SetCond::IfMissing
    } else if xx {
        SetCond::IfExists
    } else {
        SetCond::Always
    };
    if get {
        let mut old = |v: Option<&[u8]>| match v {
            Some(v) => r.bulk(v),
            None => r.null(),
        };
        store.set(argv[1], argv[2], cond, expiry, Some(&mut old))?;
    } else if store.set(argv[1], argv[2], cond, expiry, None)? {
        r.ok();
    } else {
        r.null();
    }
    Ok(())
}

/// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with NX/XX/GT/LT, as Redis's `expireGenericCommand`:
/// options first, then the time, then the key. A time already past deletes the key.
fn expire(
    store: &mut dyn Engine,
    r: &mut Reply<'_>,
    name: &str,
    argv: &[&[u8]],
) -> Result<(), StoreError> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for a in &argv[3..] {
        match option(a, &["nx", "xx", "gt", "lt"]) {
            "nx" => nx = true,
            "xx" => xx = true,
            "gt" => gt = true,
            "lt" => lt = true,
            _ => {
                r.error_bytes(&[b"ERR Unsupported option ", a]);
                return Ok(());
            }
        }
    }
    if nx && (xx || gt || lt) {
        r.error("ERR NX and XX, GT or LT options at the same time are not compatible");
        return Ok(());
    }
    if gt && lt {
        r.error("ERR GT and LT options at the same time are not compatible");
        return Ok(());
    }
    let Some(mut when) = int_arg(argv[2]) else {
        r.error("ERR value is not an integer or out of range");
        return Ok(());
    };
    let invalid = || format!("ERR invalid expire time in '{name}' command");
    if name == "expire" || name == "expireat" {
        if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
            r.error(&invalid());
            return Ok(());
        }
        when *= 1000;
    }
    let base = if name == "expire" || name == "pexpire" {
        now_ms() as i64
    } else {
        0
    };
    if when > i64::MAX - base {
        r.error(&invalid());
        return Ok(());
    }
    when += base;
    let Some(cur) = store.expiry(argv[1])? else {
        r.int(0);
        return Ok(());
    };
    // No expiry counts as an infinite one.
    let refused = (nx && cur != 0)
        || (xx && cur == 0)
        || (gt && (cur == 0 || when <= cur as i64))
        || (lt && cur != 0 && when >= cur as i64);
    if refused {
        r.int(0);
        return Ok(());
    }
    if when <= now_ms() as i64 {
        store.del(argv[1])?;
    } else {
        store.set_expiry(argv[1], when as u64)?;
    }
    r.int(1);
    Ok(())
}

/// `DEBUG SET-ACTIVE-EXPIRE 0|1` (the value read as C's `atoi`: 0 stops the active expiry
/// cycle); every other DEBUG subcommand is Redis's syntax error.
fn debug(info: &mut ServerInfo, r: &mut Reply<'_>, argv: &[&[u8]]) {
    if argv.len() == 3 && argv[1].eq_ignore_ascii_case(b"set-active-expire") {
        let v = argv[2].trim_ascii_start();
        let digits = v
            .strip_prefix(b"-")
            .or_else(|| v.strip_prefix(b"+"))
            .unwrap_or(v);
        info.active_expire = digits
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .any(|&b| b != b'0');
        r.ok();
        return;
    }
    r.error_bytes(&[
        b"ERR unknown subcommand or wrong number of arguments for '",
        &argv[1][..argv[1].len().min(128)],
        b"'. Try ",
        &argv[0].to_ascii_uppercase(),
        b" HELP.",
    ]);
}

/// `FUNCTION FLUSH [ASYNC|SYNC]` and `FUNCTION LIST`: there are no functions (no Lua engine),
/// so FLUSH has nothing to remove and LIST nothing to list; every other subcommand is
/// refused.
fn function(r: &mut Reply<'_>, argv: &[&[u8]]) {
    let sub = option(
        argv[1],
        &[
            "flush", "list", "load", "delete", "dump", "restore", "stats", "kill",
        ],
    );
    match sub {
        "flush" => match argv.get(2) {
            None => r.ok(),
            Some(m) if argv.len() == 3 && !option(m, &["async", "sync"]).is_empty() => r.ok(),
            Some(_) if argv.len() == 3 => {
                r.error("ERR FUNCTION FLUSH only supports SYNC|ASYNC option")
            }
            Some(_) => r.error("ERR wrong number of arguments for 'function|flush' command"),
        },
        "list" => r.array(0),
        "" => r.error_bytes(&[
            b"ERR unknown subcommand '",
            &argv[1][..argv[1].len().min(128)],
            b"'. Try FUNCTION HELP.",
        ]),
        _ => r.error("ERR functions are not supported by dds kv (no Lua engine)"),
    }
}

fn config(info: &mut ServerInfo, r: &mut Reply<'_>, argv: &[&[u8]]) {
    let sub = option(argv[1], &["get", "set", "resetstat", "rewrite"]);
    match (sub, argv.len()) {
        ("get", 3..) => info.config.config_get(r, &argv[2..]),
        ("set", 4..) => info.config.config_set(r, &argv[2..]),
        ("resetstat", 2) => {
            info.commands = 0;
            info.connections = 0;
            info.rejected = 0;
            info.stats.reset();
            r.ok();
        }
        ("rewrite", 2) => r.error("ERR The server is running without a config file"),
        ("get" | "set" | "resetstat" | "rewrite", _) => r.error(&format!(
            "ERR wrong number of arguments for 'config|{sub}' command"
        )),
        _ => r.error(&format!(
            "ERR unknown subcommand '{}'. Try CONFIG HELP.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

fn command(r: &mut Reply<'_>, argv: &[&[u8]]) {
    let sub = argv.get(1).map(|a| lower(a));
    match sub.as_deref() {
        None => {
            r.array(TABLE.len());
            for (name, arity) in TABLE {
                let keyed = !matches!(
                    *name,
                    "ping"
                        | "echo"
                        | "keys"
                        | "scan"
                        | "randomkey"
                        | "dbsize"
                        | "flushdb"
                        | "flushall"
                        | "info"
                        | "select"
                        | "client"
                        | "config"
                        | "command"
                        | "quit"
                        | "auth"
                        | "hello"
                        | "debug"
                        | "function"
                        | "time"
                );
                r.array(6);
                r.bulk(name.as_bytes());
                r.int(i64::from(*arity));
                r.array(0);
                let (first, last) = match *name {
                    "del" | "unlink" | "exists" | "touch" | "mget" | "mset" | "msetnx" => (1, -1),
                    "rename" | "renamenx" | "copy" => (1, 2),
                    "bitop" => (2, -1),
                    "lcs" => (1, 2),
                    "memory" | "object" => (2, 2),
                    _ => (1, 1),
                };
                let step = if matches!(*name, "mset" | "msetnx") {
                    2
                } else {
                    1
                };
                r.int(if keyed { first } else { 0 });
                r.int(if keyed { last } else { 0 });
                r.int(if keyed { step } else { 0 });
            }
        }
        Some("count") => r.int(TABLE.len() as i64),
        Some("docs") | Some("info") => r.array(0),
        Some(_) => r.error(&format!(
            "ERR unknown subcommand '{}'. Try COMMAND HELP.",
            String::from_utf8_lossy(argv[1])
        )),
    }
}

/// INFO's sections in Redis's order (`engine`: the hybrid log's or memory engine's own), and
/// whether each is one of the default ones (`INFO`, `INFO default`); `all` and `everything`
/// take every one.
const SECTIONS: &[(&str, bool)] = &[
    ("server", true),
    ("clients", true),
    ("memory", true),
    ("persistence", true),
    ("stats", true),
    ("replication", true),
    ("cpu", true),
    ("modules", true),
    ("commandstats", false),
    ("errorstats", true),
    ("latencystats", false),
    ("cluster", true),
    ("keyspace", true),
    ("engine", true),
];

/// `INFO [section ...]`: Redis's sections and field names (`docs/kv-service.md` §5 lists
/// which fields `dds kv` has), as Redis 7.0's `genInfoSectionDict` picks them: none or
/// `default`: the default sections; `all` and `everything`: every section; a name: that
/// section (in any case; `module_list` is `modules`). Sections come in Redis's order,
/// separated by an empty line; an unknown name adds nothing.
fn info(store: &dyn Engine, i: &ServerInfo, args: &[&[u8]]) -> String {
    let is = |a: &[u8], w: &str| a.eq_ignore_ascii_case(w.as_bytes());
    let all = args.iter().any(|a| is(a, "all") || is(a, "everything"));
    let defaults = args.is_empty() || args.iter().any(|a| is(a, "default"));
    let wanted = |name: &str, default: bool| {
        all || (defaults && default)
            || args
                .iter()
                .any(|a| is(a, name) || (name == "modules" && is(a, "module_list")))
    };
    let mut out = String::new();
    for &(name, _) in SECTIONS.iter().filter(|&&(n, d)| wanted(n, d)) {
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        let title = match name {
            "cpu" => "CPU".to_string(),
            _ => {
                let mut t = name.to_string();
                t[..1].make_ascii_uppercase();
                t
            }
        };
        out.push_str(&format!("# {title}\r\n"));
        let counters = match name {
            "commandstats" => i.stats.commandstats(command_names()),
            "errorstats" => i.stats.errorstats(),
            _ => Vec::new(),
        };
        for (k, v) in counters {
            out.push_str(&format!("{k}:{v}\r\n"));
        }
        for (k, v) in info_section(store, i, name) {
            out.push_str(&format!("{k}:{v}\r\n"));
        }
    }
    out
}

fn info_section(store: &dyn Engine, i: &ServerInfo, name: &str) -> Vec<(&'static str, String)> {
    let up = i.started.elapsed().as_secs();
    let hz = i.config.get("hz").unwrap_or("10").to_string();
    match name {
        "server" => vec![
            ("redis_version", "7.0.0".into()),
            ("dds_kv", "1".into()),
            ("redis_mode", "standalone".into()),
            ("os", os_name()),
            ("arch_bits", (usize::BITS).to_string()),
            ("multiplexing_api", "epoll".into()),
            ("process_id", std::process::id().to_string()),
            ("run_id", i.run_id.clone()),
            ("tcp_port", i.port.to_string()),
            (
                "server_time_usec",
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros())
                    .to_string(),
            ),
            ("uptime_in_seconds", up.to_string()),
            ("uptime_in_days", (up / 86400).to_string()),
            ("hz", hz.clone()),
            ("configured_hz", hz),
            (
                "executable",
                std::env::current_exe()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            ("config_file", String::new()),
        ],
        "clients" => vec![
            ("connected_clients", i.clients.to_string()),
            ("maxclients", i.max_clients.to_string()),
            ("blocked_clients", i.blocked_clients.to_string()),
        ],
        "memory" => {
            let rss = rss_bytes();
            let max = i.config.get("maxmemory").unwrap_or("0");
            let maxn: u64 = max.parse().unwrap_or(0);
            vec![
                ("used_memory", rss.to_string()),
                ("used_memory_human", human_bytes(rss)),
                ("used_memory_rss", rss.to_string()),
                ("used_memory_rss_human", human_bytes(rss)),
                ("maxmemory", max.to_string()),
                ("maxmemory_human", human_bytes(maxn)),
                (
                    "maxmemory_policy",
                    i.config.get("maxmemory-policy").unwrap_or("").into(),
                ),
                ("mem_allocator", "libc".into()),
            ]
        }
        "persistence" => {
            let aof = store.durability() != Durability::None;
            vec![
                ("loading", "0".into()),
                ("async_loading", "0".into()),
                ("rdb_bgsave_in_progress", "0".into()),
                ("aof_enabled", u8::from(aof).to_string()),
                ("aof_rewrite_in_progress", "0".into()),
                ("durability", i.durability.into()),
                ("storage", i.storage.clone()),
            ]
        }
        "stats" => vec![
            ("total_connections_received", i.connections.to_string()),
            ("total_commands_processed", i.commands.to_string()),
            ("rejected_connections", i.rejected.to_string()),
            ("expired_keys", store.expired_keys().to_string()),
            ("total_error_replies", i.stats.error_replies().to_string()),
        ],
        // A primary without replicas or a replication backlog.
        "replication" => vec![
            ("role", "master".into()),
            ("connected_slaves", "0".into()),
            ("master_failover_state", "no-failover".into()),
            ("master_replid", i.run_id.clone()),
            ("master_replid2", "0".repeat(40)),
            ("master_repl_offset", "0".into()),
            ("second_repl_offset", "-1".into()),
            ("repl_backlog_active", "0".into()),
            ("repl_backlog_size", "1048576".into()),
            ("repl_backlog_first_byte_offset", "0".into()),
            ("repl_backlog_histlen", "0".into()),
        ],
        "cpu" => {
            let (sys, user) = cpu_times(libc::RUSAGE_SELF);
            let (csys, cuser) = cpu_times(libc::RUSAGE_CHILDREN);
            vec![
                ("used_cpu_sys", sys),
                ("used_cpu_user", user),
                ("used_cpu_sys_children", csys),
                ("used_cpu_user_children", cuser),
            ]
        }
        "cluster" => vec![("cluster_enabled", "0".into())],
        "keyspace" if !store.is_empty() => vec![(
            "db0",
            format!(
                "keys={},expires={},avg_ttl={}",
                store.len(),
                store.expiring(),
                store.avg_ttl()
            ),
        )],
        "engine" => store.info(),
        _ => Vec::new(),
    }
}

/// `Linux <release> <machine>`, as Redis prints `os`.
fn os_name() -> String {
    // SAFETY: `uname` fills the zeroed struct it is given; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "Linux".into();
        }
        let field = |f: &[libc::c_char]| {
            std::ffi::CStr::from_ptr(f.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        format!(
            "{} {} {}",
            field(&u.sysname),
            field(&u.release),
            field(&u.machine)
        )
    }
}

/// System and user CPU seconds (`%ld.%06ld`, as Redis prints them) of `who`.
fn cpu_times(who: libc::c_int) -> (String, String) {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| format!("{}.{:06}", tv.tv_sec, tv.tv_usec);
    (t(ru.ru_stime), t(ru.ru_utime))
}

/// The process's resident bytes (`/proc/self/statm`), 0 when unknown.
fn rss_bytes() -> u64 {
    let pages: u64 = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// Bytes as Redis's `bytesToHuman` writes them (`1.50K`, `2.00M`, ...).
fn human_bytes(n: u64) -> String {
    let d = n as f64;
    const UNITS: [(f64, &str); 5] = [
        (1024.0, "K"),
        (1024.0 * 1024.0, "M"),
        (1024.0 * 1024.0 * 1024.0, "G"),
        (1024.0 * 1024.0 * 1024.0 * 1024.0, "T"),
        (1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0, "P"),
    ];
    if n < 1024 {
        return format!("{n}B");
    }
    for w in UNITS.windows(2) {
        if d < w[1].0 {
            return format!("{:.2}{}", d / w[0].0, w[0].1);
        }
    }
    format!("{:.2}P", d / UNITS[4].0)
}
