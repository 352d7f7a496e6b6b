//! The [`ObjectStore`] interface of [`ProxyObjectStore`]: transactions and reads go to the
//! [`write`](super::write) and [`read`](super::read) paths of the caller's channel, metadata
//! calls (stat, xattrs, omap, listing, statfs) are RPCs on the control socket.

use super::{add, gone_error, lock, ProxyObjectStore};
use crate::wire::*;
use dds_objstore::{KvPairs, ObjStat, ObjectId, ObjectStore, StoreError, StoreStats, Transaction};
use std::sync::atomic::Ordering;

impl ProxyObjectStore {
    fn rpc(&self, func: u8, args: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.sh.check_gone()?;
        add(&self.sh.counters.rpcs, 1);
        let id = self.sh.rpc_id.fetch_add(1, Ordering::Relaxed) + 1;
        let mut s = lock(&self.sh.sock);
        let r = send_frame(&s, func, id, args, &[]).and_then(|()| recv_frame(&mut s, MAX_RESPONSE));
        let (status, rid, body, _) = match r {
            Ok(Some(f)) => f,
            Ok(None) | Err(_) => {
                self.sh.gone.store(true, Ordering::Release);
                return Err(gone_error());
            }
        };
        if rid != id {
            return Err(proxy_error(format!("RPC answer {rid} to request {id}")));
        }
        if status != 0 {
            return Err(get_error(&mut Cursor::new(&body))
                .unwrap_or_else(|| proxy_error("malformed RPC error")));
        }
        Ok(body)
    }
}

fn put_oid(out: &mut Vec<u8>, oid: &ObjectId) {
    put_u64(out, oid.pool);
    put_bytes(out, &oid.name);
}

fn malformed() -> StoreError {
    proxy_error("malformed RPC response")
}

fn get_pairs(c: &mut Cursor<'_>) -> Option<KvPairs> {
    let n = c.u32()? as usize;
    let mut v = Vec::with_capacity(n.min(c.buf.len() / 8));
    for _ in 0..n {
        v.push((c.bytes()?.to_vec(), c.bytes()?.to_vec()));
    }
    Some(v)
}

impl ObjectStore for ProxyObjectStore {
    fn submit(&self, tx: &Transaction) -> Result<(), StoreError> {
        let ch = self.channel();
        self.sh.submit_bytes(ch, tx.to_bytes())
    }

    fn read(&self, oid: &ObjectId, offset: u64, len: u64) -> Result<Vec<u8>, StoreError> {
        let ch = self.channel();
        self.sh.read_data(ch, oid, offset, len)
    }

    fn stat(&self, oid: &ObjectId) -> Result<ObjStat, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        let b = self.rpc(F_STAT, &a)?;
        let mut c = Cursor::new(&b);
        match (c.u64(), c.u64()) {
            (Some(size), Some(mtime_ns)) => Ok(ObjStat { size, mtime_ns }),
            _ => Err(malformed()),
        }
    }

    fn getxattr(&self, oid: &ObjectId, name: &[u8]) -> Result<Vec<u8>, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_bytes(&mut a, name);
        let b = self.rpc(F_GETXATTR, &a)?;
        Cursor::new(&b)
            .bytes()
            .map(<[u8]>::to_vec)
            .ok_or_else(malformed)
    }

    fn getxattrs(&self, oid: &ObjectId) -> Result<KvPairs, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        let b = self.rpc(F_GETXATTRS, &a)?;
        get_pairs(&mut Cursor::new(&b)).ok_or_else(malformed)
    }

    fn omap_get(
        &self,
        oid: &ObjectId,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_u32(&mut a, keys.len() as u32);
        for k in keys {
            put_bytes(&mut a, k);
        }
        let b = self.rpc(F_OMAP_GET, &a)?;
        let mut c = Cursor::new(&b);
        let n = c.u32().ok_or_else(malformed)? as usize;
        let mut out = Vec::with_capacity(n.min(keys.len()));
        for _ in 0..n {
            out.push(match c.u8() {
                Some(0) => None,
                Some(1) => Some(c.bytes().ok_or_else(malformed)?.to_vec()),
                _ => return Err(malformed()),
            });
        }
        Ok(out)
    }

    fn omap_list(
        &self,
        oid: &ObjectId,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<KvPairs, StoreError> {
        let mut a = Vec::new();
        put_oid(&mut a, oid);
        put_opt_bytes(&mut a, start_after);
        put_u64(&mut a, max as u64);
        let b = self.rpc(F_OMAP_LIST, &a)?;
        get_pairs(&mut Cursor::new(&b)).ok_or_else(malformed)
    }

    fn list(
        &self,
        pool: u64,
        start_after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut a = Vec::new();
        put_u64(&mut a, pool);
        put_opt_bytes(&mut a, start_after);
        put_u64(&mut a, max as u64);
        let b = self.rpc(F_LIST, &a)?;
        let mut c = Cursor::new(&b);
        let n = c.u32().ok_or_else(malformed)? as usize;
        let mut out = Vec::with_capacity(n.min(b.len() / 4));
        for _ in 0..n {
            out.push(c.bytes().ok_or_else(malformed)?.to_vec());
        }
        Ok(out)
    }

    fn statfs(&self) -> Result<StoreStats, StoreError> {
        let b = self.rpc(F_STATFS, &[])?;
        let mut c = Cursor::new(&b);
        let mut v = [0u64; 5];
        for x in &mut v {
            *x = c.u64().ok_or_else(malformed)?;
        }
        Ok(StoreStats {
            device_bytes: v[0],
            block_size: v[1],
            data_bytes: v[2],
            allocated_bytes: v[3],
            objects: v[4],
        })
    }
}
