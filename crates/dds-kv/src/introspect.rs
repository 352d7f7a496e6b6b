//! Server and key introspection that clients and Redis's test suite use: TIME, MEMORY USAGE
//! and OBJECT ENCODING (`docs/kv-service.md` §5).

use std::time::{SystemTime, UNIX_EPOCH};

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::collection::{composite_len, CollType};
use crate::commands::option;
use crate::config::Config;
use crate::engine::Engine;
use crate::record;
use crate::store::StoreResult;

/// `TIME`: seconds and microseconds since the epoch, as two bulk strings.
pub(crate) fn time(r: &mut Reply<'_>) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    r.array(2);
    r.bulk(d.as_secs().to_string().as_bytes());
    r.bulk(d.subsec_micros().to_string().as_bytes());
}

/// The encoding Redis 7.0 gives a collection with these elements, under the thresholds of
/// CONFIG (`hash-max-listpack-entries`...): the compact form (`listpack`, `intset`) while
/// the collection is small, else `hashtable` or `skiplist`; lists are `quicklist`. Storage
/// does not depend on it: every collection is one record per element.
fn coll_encoding(
    s: &mut dyn Engine,
    ty: CollType,
    key: &[u8],
    config: &Config,
) -> StoreResult<&'static str> {
    let limit = |name: &str| -> u64 {
        config
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    let (entries, value, small, large) = match ty {
        CollType::Hash => (
            limit("hash-max-listpack-entries"),
            limit("hash-max-listpack-value"),
            "listpack",
            "hashtable",
        ),
        CollType::Set => (
            limit("set-max-intset-entries"),
            u64::MAX,
            "intset",
            "hashtable",
        ),
        CollType::ZSet => (
            limit("zset-max-listpack-entries"),
            limit("zset-max-listpack-value"),
            "listpack",
            "skiplist",
        ),
        CollType::List => return Ok("quicklist"),
    };
    if s.coll_len(ty, key)? > entries {
        return Ok(large);
    }
    let mut fits = true;
    s.coll_scan(ty, key, 0, usize::MAX, &mut |sub, v| {
        fits &= match ty {
            // An intset holds integers only.
            CollType::Set => int_arg(sub).is_some(),
            // A sorted set's value is its score, not a string.
            CollType::ZSet => sub.len() as u64 <= value,
            _ => sub.len() as u64 <= value && v.len() as u64 <= value,
        };
    })?;
    Ok(if fits { small } else { large })
}

/// The encoding Redis 7.0 gives a string value that a command wrote whole
/// (`tryObjectEncoding`): `int` for a decimal integer of at most 20 bytes that fits 64 bits
/// (written as Redis writes it back), `embstr` up to 44 bytes, else `raw`.
pub(crate) fn string_encoding(v: &[u8]) -> &'static str {
    if v.len() <= 20 && int_arg(v).is_some() {
        "int"
    } else if v.len() <= 44 {
        "embstr"
    } else {
        "raw"
    }
}

/// `MEMORY USAGE key [SAMPLES n]`: the bytes of the key's records in the log (header, key and
/// value, 8-byte aligned), or null for a missing key; `OBJECT ENCODING key`: the value's
/// encoding in Redis's terms ([`string_encoding`], [`coll_encoding`]), or null; `OBJECT
/// REFCOUNT key`: 1 (Redis's count for a shared small integer), or null. Every other
/// subcommand is refused as Redis refuses an unknown one.
pub(crate) fn memory_or_object(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    config: &Config,
) -> StoreResult<()> {
    let memory = argv[0].eq_ignore_ascii_case(b"memory");
    let (sub, help) = if memory {
        (option(argv[1], &["usage"]), "MEMORY")
    } else {
        (option(argv[1], &["encoding", "refcount"]), "OBJECT")
    };
    if sub.is_empty() {
        r.error_bytes(&[
            b"ERR unknown subcommand '",
            &argv[1][..argv[1].len().min(128)],
            b"'. Try ",
            help.as_bytes(),
            b" HELP.",
        ]);
        return Ok(());
    }
    if argv.len() < 3 || (sub != "usage" && argv.len() > 3) {
        r.error(&format!(
            "ERR wrong number of arguments for '{}|{sub}' command",
            help.to_ascii_lowercase()
        ));
        return Ok(());
    }
    // MEMORY USAGE's options, as Redis 7.0 reads them: SAMPLES n (any number of times).
    let mut j = 3;
    while j < argv.len() {
        if !argv[j].eq_ignore_ascii_case(b"samples") || j + 1 == argv.len() {
            r.error("ERR syntax error");
            return Ok(());
        }
        if int_arg(argv[j + 1]).is_none() {
            r.error("ERR value is not an integer or out of range");
            return Ok(());
        }
        j += 2;
    }
    let key = argv[2];
    if sub == "refcount" {
        // One reference per value (no sharing), but Redis's shared integers 0..9999, whose
        // count is `OBJ_SHARED_REFCOUNT`.
        if s.key_type(key)?.is_some_and(|t| t != "string") {
            r.int(1);
            return Ok(());
        }
        return s.get_with(key, &mut |v| match v {
            None => r.null(),
            Some(v)
                if int_arg(v).is_some_and(|n| (0..10_000).contains(&n))
                    && string_encoding(v) == "int" =>
            {
                r.int(i32::MAX as i64)
            }
            Some(_) => r.int(1),
        });
    }
    if let Some(ty) = s.key_type(key)?.and_then(CollType::from_name) {
        if memory {
            // The metadata record and every element record.
            let mut bytes = record::record_len(key.len(), crate::collection::META_LEN);
            s.coll_scan(ty, key, 0, usize::MAX, &mut |sub, v| {
                bytes += record::record_len(composite_len(key.len(), sub.len()), v.len());
            })?;
            r.int(bytes as i64);
        } else {
            r.bulk(coll_encoding(s, ty, key, config)?.as_bytes());
        }
        return Ok(());
    }
    s.get_with(key, &mut |v| match v {
        None => r.null(),
        Some(v) if memory => r.int(record::record_len(key.len(), v.len()) as i64),
        Some(v) => r.bulk(string_encoding(v).as_bytes()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_redis_names_for_values_written_whole() {
        assert_eq!(string_encoding(b"1234"), "int");
        assert_eq!(string_encoding(b"-9223372036854775808"), "int");
        assert_eq!(string_encoding(b"9223372036854775808"), "embstr");
        assert_eq!(string_encoding(b"01"), "embstr");
        assert_eq!(string_encoding(b"+1"), "embstr");
        assert_eq!(string_encoding(b""), "embstr");
        assert_eq!(string_encoding(&[b'a'; 44]), "embstr");
        assert_eq!(string_encoding(&[b'a'; 45]), "raw");
    }
}
