//! Whole objects (data, xattrs, omap) as recovery copies them, and the listing of a PG's
//! objects.

use std::sync::Arc;

use dds_objstore::{KvPairs, ObjectId, ObjectStore, StoreError, Transaction, TxOp};

use crate::map::{ClusterMap, PgId};
use crate::wire::{Dec, Enc, OpError};

/// The whole state of an object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectState {
    pub data: Vec<u8>,
    pub xattrs: KvPairs,
    pub omap: KvPairs,
}

/// A piece of an object as recovery copies it: `state.data` holds bytes `offset ..` of the
/// object's `size`; xattrs and omap come with the piece at offset 0 only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectPiece {
    pub size: u64,
    pub offset: u64,
    pub state: ObjectState,
}

/// Reads up to `max` bytes of an object's data from `offset` (with its xattrs and omap at
/// offset 0); `None` if it does not exist.
pub fn read_piece(
    store: &Arc<dyn ObjectStore>,
    oid: &ObjectId,
    offset: u64,
    max: u64,
) -> Result<Option<ObjectPiece>, StoreError> {
    let st = match store.stat(oid) {
        Ok(st) => st,
        Err(StoreError::NotFound(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let data = store.read(oid, offset, st.size.saturating_sub(offset).min(max))?;
    let mut state = ObjectState {
        data,
        ..ObjectState::default()
    };
    if offset == 0 {
        state.xattrs = store.getxattrs(oid)?;
        loop {
            let after = state.omap.last().map(|(k, _)| k.clone());
            let page = store.omap_list(oid, after.as_deref(), 1024)?;
            if page.is_empty() {
                break;
            }
            state.omap.extend(page);
        }
    }
    Ok(Some(ObjectPiece {
        size: st.size,
        offset,
        state,
    }))
}

/// Encodes `PG_PULL_OBJECT`'s reply.
pub fn encode_piece(p: Option<&ObjectPiece>) -> Vec<u8> {
    let mut e = Enc::new();
    match p {
        None => e.u8(0),
        Some(p) => e
            .u8(1)
            .u64(p.size)
            .bytes(&p.state.data)
            .kvs(&p.state.xattrs)
            .kvs(&p.state.omap),
    };
    e.done()
}

/// Decodes `PG_PULL_OBJECT`'s reply to a request at `offset`.
pub fn decode_piece(buf: &[u8], offset: u64) -> Result<Option<ObjectPiece>, OpError> {
    let mut d = Dec::new(buf);
    let p = match d.u8()? {
        0 => None,
        _ => Some(ObjectPiece {
            size: d.u64()?,
            offset,
            state: ObjectState {
                data: d.bytes()?.to_vec(),
                xattrs: d.kvs()?,
                omap: d.kvs()?,
            },
        }),
    };
    d.end()?;
    Ok(p)
}

/// A transaction making the object exactly `obj` (or absent).
pub fn replace_object_tx(oid: &ObjectId, obj: Option<&ObjectState>) -> Transaction {
    let mut tx = Transaction::new();
    tx.push(TxOp::Touch { oid: oid.clone() });
    tx.push(TxOp::Remove { oid: oid.clone() });
    if let Some(o) = obj {
        tx.push(TxOp::WriteFull {
            oid: oid.clone(),
            data: o.data.clone(),
        });
        for (name, value) in &o.xattrs {
            tx.push(TxOp::SetXattr {
                oid: oid.clone(),
                name: name.clone(),
                value: value.clone(),
            });
        }
        if !o.omap.is_empty() {
            tx.push(TxOp::OmapSet {
                oid: oid.clone(),
                entries: o.omap.clone(),
            });
        }
    }
    tx
}

/// Up to `max` names of `pg`'s objects after `start_after`, in byte order.
pub fn list_pg(
    store: &Arc<dyn ObjectStore>,
    map: &ClusterMap,
    pg: PgId,
    start_after: Option<&[u8]>,
    max: usize,
) -> Result<Vec<Vec<u8>>, StoreError> {
    let mut out = Vec::new();
    let mut after = start_after.map(<[u8]>::to_vec);
    loop {
        let page = store.list(pg.pool, after.as_deref(), 1024)?;
        let Some(last) = page.last() else { break };
        after = Some(last.clone());
        for name in page {
            if map.pg_of(pg.pool, &name) == Some(pg) {
                out.push(name);
                if out.len() >= max {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}
