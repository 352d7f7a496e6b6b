//! PG logs: kept as omap entries of a per-PG metadata object, changed in the same transaction
//! as the data they describe (`docs/osd-protocol.md`, "PG log").

use std::sync::Arc;

use dds_objstore::{ObjectId, ObjectStore, StoreError, Transaction, TxOp};

use crate::map::{PgId, META_POOL};
use crate::wire::{Dec, Enc, OpError};

/// Omap key of the PG's version.
pub const HEAD_KEY: &[u8] = b"head";
/// Prefix of the log entries' omap keys.
pub const LOG_PREFIX: &[u8] = b"log.";
/// Log entries kept per PG by default.
pub const DEFAULT_MAX_LOG: u64 = 512;

/// Kind of change an entry records.
pub const KIND_MODIFY: u8 = 1;
pub const KIND_REMOVE: u8 = 2;

/// One PG log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub version: u64,
    pub kind: u8,
    pub name: Vec<u8>,
    /// The client request that made it (client id, tid); (0, 0) for none.
    pub reqid: (u64, u64),
    /// Map epoch of the primary that assigned the version (0: not recorded).
    pub epoch: u32,
}

impl LogEntry {
    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.version)
            .u8(self.kind)
            .bytes(&self.name)
            .u64(self.reqid.0)
            .u64(self.reqid.1)
            .u32(self.epoch);
    }

    pub fn decode(d: &mut Dec<'_>) -> Result<LogEntry, OpError> {
        Ok(LogEntry {
            version: d.u64()?,
            kind: d.u8()?,
            name: d.bytes()?.to_vec(),
            reqid: (d.u64()?, d.u64()?),
            epoch: d.u32()?,
        })
    }

    /// Decodes a stored entry; entries written before request ids were logged end after the
    /// name and read as (0, 0), those written before epochs were logged read as epoch 0.
    fn decode_stored(v: &[u8]) -> Result<LogEntry, OpError> {
        let mut d = Dec::new(v);
        let (version, kind, name) = (d.u64()?, d.u8()?, d.bytes()?.to_vec());
        let rest = d.rest();
        let (reqid, epoch) = match rest.len() {
            0 => ((0, 0), 0),
            16 | 20 => {
                let mut d = Dec::new(rest);
                let reqid = (d.u64()?, d.u64()?);
                (reqid, if rest.len() == 20 { d.u32()? } else { 0 })
            }
            n => {
                return Err(OpError::new(
                    crate::wire::Status::Io,
                    format!("PG log entry {version} has {n} bytes after its name"),
                ))
            }
        };
        Ok(LogEntry {
            version,
            kind,
            name,
            reqid,
            epoch,
        })
    }
}

/// A PG's log as read from a store: its head and retained entries in version order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgLog {
    pub head: u64,
    pub entries: Vec<LogEntry>,
}

impl PgLog {
    /// The entry of `version`, if retained.
    pub fn entry(&self, version: u64) -> Option<&LogEntry> {
        self.entries
            .binary_search_by_key(&version, |e| e.version)
            .ok()
            .map(|i| &self.entries[i])
    }

    /// The last update: the epoch of the head's entry (0 when not retained) and the head,
    /// compared in this order to find the most up-to-date member.
    pub fn last_update(&self) -> (u32, u64) {
        (self.entry(self.head).map_or(0, |e| e.epoch), self.head)
    }

    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.head).u32(self.entries.len() as u32);
        for en in &self.entries {
            en.encode(e);
        }
    }

    pub fn decode(d: &mut Dec<'_>) -> Result<PgLog, OpError> {
        let head = d.u64()?;
        let n = d.u32()?;
        let mut entries = Vec::new();
        for _ in 0..n {
            entries.push(LogEntry::decode(d)?);
        }
        Ok(PgLog { head, entries })
    }
}

/// The metadata object of a PG.
pub fn meta_oid(pg: PgId) -> ObjectId {
    ObjectId::new(META_POOL, format!("pg.{}.{}", pg.pool, pg.pg))
}

fn log_key(version: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&version.to_be_bytes());
    k
}

fn entry_value(entry: &LogEntry) -> Vec<u8> {
    let mut e = Enc::new();
    entry.encode(&mut e);
    e.done()
}

/// Appends to `tx` the log entry, the new head and the trim of the entry `max_log` versions
/// older.
pub fn append_ops(tx: &mut Transaction, pg: PgId, entry: &LogEntry, max_log: u64) {
    let oid = meta_oid(pg);
    tx.push(TxOp::OmapSet {
        oid: oid.clone(),
        entries: vec![
            (HEAD_KEY.to_vec(), entry.version.to_le_bytes().to_vec()),
            (log_key(entry.version), entry_value(entry)),
        ],
    });
    if entry.version > max_log {
        tx.push(TxOp::OmapRm {
            oid,
            keys: vec![log_key(entry.version - max_log)],
        });
    }
}

/// Ops replacing a PG's metadata object by `log` (recovery).
pub fn replace_ops(tx: &mut Transaction, pg: PgId, log: &PgLog) {
    let oid = meta_oid(pg);
    tx.push(TxOp::Touch { oid: oid.clone() });
    tx.push(TxOp::OmapClear { oid: oid.clone() });
    let mut entries = vec![(HEAD_KEY.to_vec(), log.head.to_le_bytes().to_vec())];
    entries.extend(
        log.entries
            .iter()
            .map(|e| (log_key(e.version), entry_value(e))),
    );
    tx.push(TxOp::OmapSet { oid, entries });
}

/// The PG's head version in `store` (0 if the PG was never written).
pub fn read_head(store: &Arc<dyn ObjectStore>, pg: PgId) -> Result<u64, StoreError> {
    match store.omap_get(&meta_oid(pg), &[HEAD_KEY.to_vec()]) {
        Ok(v) => Ok(v
            .into_iter()
            .next()
            .flatten()
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0)),
        Err(StoreError::NotFound(_)) => Ok(0),
        Err(e) => Err(e),
    }
}

/// The PG's whole log in `store`.
pub fn read_log(store: &Arc<dyn ObjectStore>, pg: PgId) -> Result<PgLog, OpError> {
    let oid = meta_oid(pg);
    let head = read_head(store, pg)?;
    let mut log = PgLog {
        head,
        entries: Vec::new(),
    };
    let mut after: Option<Vec<u8>> = Some(LOG_PREFIX.to_vec());
    loop {
        let page = match store.omap_list(&oid, after.as_deref(), 1024) {
            Ok(p) => p,
            Err(StoreError::NotFound(_)) => break,
            Err(e) => return Err(e.into()),
        };
        let Some(last) = page.last() else { break };
        after = Some(last.0.clone());
        for (k, v) in &page {
            if k.starts_with(LOG_PREFIX) {
                log.entries.push(LogEntry::decode_stored(v)?);
            }
        }
        if !page.last().is_some_and(|(k, _)| k.starts_with(LOG_PREFIX)) {
            break;
        }
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_entries_with_and_without_a_request_id() {
        let e = LogEntry {
            version: 9,
            kind: KIND_REMOVE,
            name: b"obj".to_vec(),
            reqid: (77, 3),
            epoch: 5,
        };
        let v = entry_value(&e);
        assert_eq!(LogEntry::decode_stored(&v).unwrap(), e);
        // Written before epochs were logged: epoch 0.
        let no_epoch = LogEntry::decode_stored(&v[..v.len() - 4]).unwrap();
        assert_eq!((no_epoch.reqid, no_epoch.epoch), ((77, 3), 0));
        // Written before request ids were logged: the entry ends after the name.
        let old = &v[..v.len() - 20];
        let got = LogEntry::decode_stored(old).unwrap();
        assert_eq!(got.reqid, (0, 0));
        assert_eq!(
            (got.version, got.kind, got.name),
            (9, KIND_REMOVE, b"obj".to_vec())
        );
        // Anything else after the name is refused.
        assert!(LogEntry::decode_stored(&v[..v.len() - 3]).is_err());
        assert!(LogEntry::decode_stored(&v[..v.len() - 7]).is_err());
    }
}
