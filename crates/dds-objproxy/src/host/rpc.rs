//! The control RPCs (stat, xattrs, omap, listing, statfs) decoded, served against the store
//! and encoded.

use crate::wire::*;
use dds_objstore::{ObjectId, ObjectStore, StoreError};

fn oid(c: &mut Cursor<'_>) -> Option<ObjectId> {
    let pool = c.u64()?;
    let name = c.bytes()?;
    Some(ObjectId::new(pool, name))
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(Vec<u8>, Vec<u8>)]) {
    put_u32(out, pairs.len() as u32);
    for (k, v) in pairs {
        put_bytes(out, k);
        put_bytes(out, v);
    }
}

/// Serves one control RPC.
pub(super) fn rpc(store: &dyn ObjectStore, func: u8, body: &[u8]) -> Result<Vec<u8>, StoreError> {
    let bad = || StoreError::InvalidArgument("malformed control request".into());
    let mut c = Cursor::new(body);
    let mut out = Vec::new();
    match func {
        F_STAT => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let st = store.stat(&o)?;
            put_u64(&mut out, st.size);
            put_u64(&mut out, st.mtime_ns);
        }
        F_GETXATTR => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let name = c.bytes().ok_or_else(bad)?;
            put_bytes(&mut out, &store.getxattr(&o, name)?);
        }
        F_GETXATTRS => {
            let o = oid(&mut c).ok_or_else(bad)?;
            put_pairs(&mut out, &store.getxattrs(&o)?);
        }
        F_OMAP_GET => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let n = c.u32().ok_or_else(bad)? as usize;
            let mut keys = Vec::with_capacity(n.min(body.len() / 4));
            for _ in 0..n {
                keys.push(c.bytes().ok_or_else(bad)?.to_vec());
            }
            let vals = store.omap_get(&o, &keys)?;
            put_u32(&mut out, vals.len() as u32);
            for v in vals {
                match v {
                    Some(v) => {
                        out.push(1);
                        put_bytes(&mut out, &v);
                    }
                    None => out.push(0),
                }
            }
        }
        F_OMAP_LIST => {
            let o = oid(&mut c).ok_or_else(bad)?;
            let start = c.opt_bytes().ok_or_else(bad)?;
            let max = c.u64().ok_or_else(bad)?;
            put_pairs(
                &mut out,
                &store.omap_list(&o, start, max.min(1 << 20) as usize)?,
            );
        }
        F_LIST => {
            let pool = c.u64().ok_or_else(bad)?;
            let start = c.opt_bytes().ok_or_else(bad)?;
            let max = c.u64().ok_or_else(bad)?;
            let names = store.list(pool, start, max.min(1 << 20) as usize)?;
            put_u32(&mut out, names.len() as u32);
            for n in names {
                put_bytes(&mut out, &n);
            }
        }
        F_STATFS => {
            let s = store.statfs()?;
            for v in [
                s.device_bytes,
                s.block_size,
                s.data_bytes,
                s.allocated_bytes,
                s.objects,
            ] {
                put_u64(&mut out, v);
            }
        }
        _ => {
            return Err(StoreError::InvalidArgument(format!(
                "unknown function {func}"
            )))
        }
    }
    if !c.done() {
        return Err(bad());
    }
    if out.len() + 64 > MAX_RESPONSE {
        return Err(StoreError::InvalidArgument("response too large".into()));
    }
    Ok(out)
}
