//! Keyspace commands on named keys, as Redis 7.0's `db.c` answers them: TYPE, TOUCH, RENAME,
//! RENAMENX and COPY (one database: `COPY .. DB 0` only).

use dds_resp::session::int_arg;
use dds_resp::Reply;

use crate::engine::Engine;
use crate::store::{Expiry, SetCond, StoreResult};

/// `TYPE key`: `string` or `none` (strings are the only type).
pub(crate) fn type_of(s: &mut dyn Engine, r: &mut Reply<'_>, key: &[u8]) -> StoreResult<()> {
    r.simple(if s.exists(key)? { "string" } else { "none" });
    Ok(())
}

/// `TOUCH key [key ...]`: how many exist (there is no access time to update).
pub(crate) fn touch(s: &mut dyn Engine, r: &mut Reply<'_>, keys: &[&[u8]]) -> StoreResult<()> {
    let mut n = 0;
    for k in keys {
        n += i64::from(s.exists(k)?);
    }
    r.int(n);
    Ok(())
}

/// The value and expiry of `key` (a copy: the command writes another key with them).
fn take_copy(s: &mut dyn Engine, key: &[u8]) -> StoreResult<Option<(Vec<u8>, Expiry)>> {
    let Some(exp) = s.expiry(key)? else {
        return Ok(None);
    };
    let mut value = Vec::new();
    s.get_with(key, &mut |v| value = v.unwrap_or_default().to_vec())?;
    let expiry = if exp == 0 {
        Expiry::None
    } else {
        Expiry::At(exp)
    };
    Ok(Some((value, expiry)))
}

/// `RENAME key newkey` and `RENAMENX key newkey`: the value moves with its expiry.
pub(crate) fn rename(
    s: &mut dyn Engine,
    r: &mut Reply<'_>,
    argv: &[&[u8]],
    nx: bool,
) -> StoreResult<()> {
    let (src, dst) = (argv[1], argv[2]);
    let Some((value, expiry)) = take_copy(s, src)? else {
        r.error("ERR no such key");
        return Ok(());
    };
    if src == dst {
        if nx {
            r.int(0);
        } else {
            r.ok();
        }
        return Ok(());
    }
    let cond = if nx {
        SetCond::IfMissing
    } else {
        SetCond::Always
    };
    if !s.set(dst, &value, cond, expiry, None)? {
        r.int(0);
        return Ok(());
    }
    s.del(src)?;
    if nx {
        r.int(1);
    } else {
        r.ok();
    }
    Ok(())
}

/// `COPY source destination [DB 0] [REPLACE]`: 1 when copied (with its expiry).
pub(crate) fn copy(s: &mut dyn Engine, r: &mut Reply<'_>, argv: &[&[u8]]) -> StoreResult<()> {
    let mut replace = false;
    let mut j = 3;
    while j < argv.len() {
        match crate::commands::option(argv[j], &["replace", "db"]) {
            "replace" => replace = true,
            "db" if j + 1 < argv.len() => {
                match int_arg(argv[j + 1]) {
                    None => {
                        r.error("ERR value is not an integer or out of range");
                        return Ok(());
                    }
                    Some(0) => {}
                    Some(_) => {
                        r.error("ERR DB index is out of range");
                        return Ok(());
                    }
                }
                j += 1;
            }
            _ => {
                r.error("ERR syntax error");
                return Ok(());
            }
        }
        j += 1;
    }
    let (src, dst) = (argv[1], argv[2]);
    if src == dst {
        r.error("ERR source and destination objects are the same");
        return Ok(());
    }
    let Some((value, expiry)) = take_copy(s, src)? else {
        r.int(0);
        return Ok(());
    };
    let cond = if replace {
        SetCond::Always
    } else {
        SetCond::IfMissing
    };
    let copied = s.set(dst, &value, cond, expiry, None)?;
    r.int(i64::from(copied));
    Ok(())
}
